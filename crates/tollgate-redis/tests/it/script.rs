//! The script itself, called with crafted arguments, and script failures as store errors.

use redis::AsyncCommands;
use tollgate::{Algorithm, Store, StoreErrorKind};
use tollgate_testkit::RedisServer;

use crate::support::{limiter, plan, raw, rule, store};

const SOURCE: &str = include_str!("../../scripts/check.lua");

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
        .arg(cost)
        .arg(1)
        .arg(now)
        .arg(nonce)
        .arg(1) // limiters
        .arg(1) // rules
        .arg(&[0, 0, 1, 0]) // bans nobody
        .arg(1) // sliding log
        .arg(limit)
        .arg(3_600_000_000u64)
        .arg(0) // ban keys
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
        .arg(1)
        .arg(1)
        .arg("")
        .arg("nonce123")
        .arg(1)
        .arg(1)
        .arg(&[0, 0, 1, 0])
        .arg(1)
        .arg(5)
        .arg(1_000_000)
        .arg(0)
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
    let err = store.check(&p).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Protocol, "{err}");
}
