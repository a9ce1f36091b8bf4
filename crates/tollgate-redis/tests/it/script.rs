//! The script itself, called with crafted arguments, and script failures as store errors.

use redis::AsyncCommands;
use tollgate::{Algorithm, StoreErrorKind};
use tollgate_testkit::RedisServer;

use crate::support::{PlanExt, limiter, plan, raw, rule, store};

const SOURCE: &str = include_str!("../../scripts/check.lua");

/// check.lua's packed plan (see its header): one limiter of one sliding-log rule
/// `limit/window_us` that bans nobody, no ban keys.
fn one_rule_plan(nonce: &[u8], now: Option<u64>, cost: u64, limit: u64, window_us: u64) -> Vec<u8> {
    let int = |v: u64| i64::try_from(v).unwrap();
    let mut plan = nonce.to_vec();
    let now = now.map_or(-1, int);
    let (cost, limit, window) = (int(cost), int(limit), int(window_us));
    // now, cost, consume, limiters; rules, longest log window, bans; the rule; ban keys, writes bans
    for v in [now, cost, 1, 1, 1, window, 0, 1, limit, window, 0, 0] {
        plan.extend_from_slice(&v.to_le_bytes());
    }
    plan
}

/// Runs the script on one sliding-log rule `limit/1h` with a chosen nonce, at `now`.
async fn check_with_nonce(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    cost: u64,
    limit: u64,
    nonce: &[u8],
    now: u64,
) -> Vec<i64> {
    redis::Script::new(SOURCE)
        .key(key)
        .arg(one_rule_plan(nonce, Some(now), cost, limit, 3_600_000_000))
        .invoke_async(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_nonce_collision_never_undercounts() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let now = 1_800_000_000_000_000;
    let first = check_with_nonce(&mut conn, "s:{n}:l", 3, 10, b"samebyte", now).await;
    assert_eq!(first, [1, -1, -1, 1, 7, 3_600_000_000, -1]);
    // Same nonce, same instant: the members collide, and the script must add others.
    let second = check_with_nonce(&mut conn, "s:{n}:l", 3, 10, b"samebyte", now).await;
    assert_eq!(second, [1, -1, -1, 1, 4, 3_600_000_000, -1]);
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
    let err = redis::Script::new(SOURCE)
        .key("a")
        .key("b")
        .arg(one_rule_plan(b"nonce123", None, 1, 5, 1_000_000))
        .invoke_async::<Vec<i64>>(&mut conn)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("2 keys given, the plan needs 1"),
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
