//! The script itself, called with crafted arguments, and script failures as store errors.

use redis::AsyncCommands;
use tollgate::{Algorithm, StoreErrorKind};
use tollgate_testkit::RedisServer;

use crate::support::{PlanExt, limiter, plan, raw, rule, store};

/// check.lua as the store sends it: its `--@include` parts spliced in.
static SOURCE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    include_str!("../../scripts/check.lua")
        .replace(
            "--@include common.lua",
            include_str!("../../scripts/common.lua"),
        )
        .replace(
            "--@include ban_writer.lua",
            include_str!("../../scripts/ban_writer.lua"),
        )
});

/// check.lua's packed plan (see its header): one limiter of one sliding-log rule
/// `limit/window_us` that bans nobody, no ban keys.
fn one_rule_plan(nonce: &[u8], now: Option<u64>, cost: u64, limit: u64, window_us: u64) -> Vec<u8> {
    let int = |v: u64| i64::try_from(v).unwrap();
    let mut plan = nonce.to_vec();
    let now = now.map_or(-1, int);
    let (cost, limit, window) = (int(cost), int(limit), int(window_us));
    // now, cost, consume, limiters; rules, longest log window, bans; the rule; ban keys,
    // writes bans, report
    for v in [now, cost, 1, 1, 1, window, 0, 1, limit, window, 0, 0, 0] {
        plan.extend_from_slice(&v.to_le_bytes());
    }
    plan
}

/// Runs the script on one sliding-log rule `limit/1h` with a chosen nonce, at `now`: a call
/// of one check, whose reply is the only one.
async fn check_with_nonce(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    cost: u64,
    limit: u64,
    nonce: &[u8],
    now: u64,
) -> Vec<i64> {
    let mut replies: Vec<Vec<i64>> = redis::Script::new(&SOURCE)
        .key(key)
        .arg(one_rule_plan(nonce, Some(now), cost, limit, 3_600_000_000))
        .invoke_async(conn)
        .await
        .unwrap();
    assert_eq!(replies.len(), 1);
    replies.remove(0)
}

#[tokio::test]
async fn one_call_runs_several_checks_in_order_each_on_its_own() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let now = 1_800_000_000_000_000;
    // Four checks of cost 2 on a limit of 5, then one of cost 1, in one call: the first two
    // fit, the third and fourth do not (and record nothing), the fifth takes the last unit.
    let source = redis::Script::new(&SOURCE);
    let mut script = source.prepare_invoke();
    for (i, cost) in [2, 2, 2, 2, 1].into_iter().enumerate() {
        let nonce = format!("nonce00{i}");
        script.key("b:{k}:l").arg(one_rule_plan(
            nonce.as_bytes(),
            Some(now),
            cost,
            5,
            60_000_000,
        ));
    }
    let replies: Vec<Vec<i64>> = script.invoke_async(&mut conn).await.unwrap();
    let verdicts: Vec<(i64, i64)> = replies.iter().map(|r| (r[0], r[4])).collect();
    assert_eq!(verdicts, [(1, 3), (1, 1), (0, 1), (0, 1), (1, 0)]);
    let count: u64 = conn.zcard("b:{k}:l").await.unwrap();
    assert_eq!(count, 5);
}

#[tokio::test]
async fn a_nonce_collision_never_undercounts() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let now = 1_800_000_000_000_000;
    let first = check_with_nonce(&mut conn, "s:{n}:l", 3, 10, b"samebyte", now).await;
    // Admitted and recorded: the reply ends with the instant it was recorded at.
    assert_eq!(first, [1, -1, -1, 1, 7, 3_600_000_000, -1, now as i64]);
    // Same nonce, same instant: the members collide, and the script must add others.
    let second = check_with_nonce(&mut conn, "s:{n}:l", 3, 10, b"samebyte", now).await;
    assert_eq!(second, [1, -1, -1, 1, 4, 3_600_000_000, -1, now as i64]);
    let count: u64 = conn.zcard("s:{n}:l").await.unwrap();
    assert_eq!(count, 6);
    let third = check_with_nonce(&mut conn, "s:{n}:l", 5, 10, b"samebyte", now).await;
    assert_eq!(third[0], 0, "{third:?}");
    assert_eq!(third[4], 4);
}

#[tokio::test]
async fn a_key_count_that_does_not_match_the_plan_is_refused() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let err = redis::Script::new(&SOURCE)
        .key("a")
        .key("b")
        .arg(one_rule_plan(b"nonce123", None, 1, 5, 1_000_000))
        .invoke_async::<Vec<Vec<i64>>>(&mut conn)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("2 keys given, the checks need 1"),
        "{err}"
    );
}

#[tokio::test]
async fn a_script_error_is_a_protocol_error() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;
    // Someone else's string where the sliding log should be.
    let _: () = conn.set("x:{k}:l", "not a sorted set").await.unwrap();
    let p = plan(
        1,
        &[limiter("x:{k}", &[rule("5/1m", Algorithm::SlidingLog)])],
    );
    let err = store.check_plan(&p).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Protocol, "{err}");
}

/// A guard script as the store sends it: prelude.lua, with common.lua spliced in, before it.
fn guard_source(body: &str) -> String {
    let prelude = include_str!("../../scripts/prelude.lua").replace(
        "--@include common.lua",
        include_str!("../../scripts/common.lua"),
    );
    format!("{prelude}\n{body}")
}

/// undo.lua run twice with one marker, as Redis runs a call a Cluster client re-sent after
/// losing its reply: the reservation is given back once.
#[tokio::test]
async fn an_undo_run_twice_gives_back_once() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let now: u64 = 1_800_000_000_000_000;
    let start = now - now % 3_600_000_000;
    let key = "u:{x}:f10/3600000";
    let _: () = conn.set(key, format!("{start}:5")).await.unwrap();
    let undo = redis::Script::new(&guard_source(include_str!("../../scripts/undo.lua")));
    for _ in 0..2 {
        // now, cost, nonce, the marker's TTL ms; then the key's op (2: fixed window), window
        // start, unused.
        let changed: i64 = undo
            .key(key)
            .key("u:{x}:a0000000000000001")
            .arg(now)
            .arg(2)
            .arg("nonce123")
            .arg(60_000)
            .arg(2)
            .arg(start)
            .arg(0)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(changed, 1, "the first run's answer, both times");
    }
    let value: String = conn.get(key).await.unwrap();
    assert_eq!(value, format!("{start}:3"));
}
