//! Production stores time checks by the Redis server's `TIME`, and their retry-after is exact.

use std::time::Duration;

use redis::AsyncCommands;
use tollgate::{Algorithm, Clock, ManualClock};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::support::{PlanExt, limiter, plan, raw, rule, store};

async fn redis_time_us(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1_000_000 + us
}

#[tokio::test]
async fn waiting_exactly_retry_after_is_enough() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let p = plan(
        1,
        &[limiter(
            "t:{retry}",
            &[rule("2/400ms", Algorithm::SlidingLog)],
        )],
    );
    assert!(store.check_plan(&p).await.unwrap().allowed);
    assert!(store.check_plan(&p).await.unwrap().allowed);
    let denied = store.check_plan(&p).await.unwrap();
    assert!(!denied.allowed);
    let retry = denied.rules[0].retry_after_us.unwrap();
    assert!(retry > 0 && retry <= 400_000, "retry_after {retry} µs");
    // Redis time moves at least as far as our sleep: after exactly `retry`, the oldest entry
    // has left the window.
    tokio::time::sleep(Duration::from_micros(retry)).await;
    let again = store.check_plan(&p).await.unwrap();
    assert!(again.allowed, "still denied {retry} µs later: {again:?}");

    // Two units need the two oldest live entries gone: the second of them decides.
    let two = plan(
        2,
        &[limiter(
            "t:{retry}",
            &[rule("2/400ms", Algorithm::SlidingLog)],
        )],
    );
    let denied = store.check_plan(&two).await.unwrap();
    assert!(!denied.allowed);
    let retry = denied.rules[0].retry_after_us.unwrap();
    assert!(retry > 0 && retry <= 400_000, "retry_after {retry} µs");
    tokio::time::sleep(Duration::from_micros(retry)).await;
    assert!(store.check_plan(&two).await.unwrap().allowed);
}

#[tokio::test]
async fn checks_are_timed_by_redis_time_unless_a_test_clock_is_given() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let production = store(&server).await;
    // A client whose clock reads 2100: were its clock used, its entries would sit there.
    let skewed_clock = ManualClock::new(Duration::from_secs(4_102_444_800));
    let skewed = RedisStore::builder(&server.url())
        .clock(skewed_clock.clone())
        .build()
        .await
        .unwrap();
    let log = |name: &str| {
        plan(
            1,
            &[limiter(
                &format!("t:{{{name}}}"),
                &[rule("5/1h", Algorithm::SlidingLog)],
            )],
        )
    };

    let before = redis_time_us(&mut conn).await;
    assert!(production.check_plan(&log("prod")).await.unwrap().allowed);
    let after = redis_time_us(&mut conn).await;
    let entries: Vec<(Vec<u8>, u64)> = conn.zrange_withscores("t:{prod}:l", 0, -1).await.unwrap();
    assert_eq!(entries.len(), 1);
    let at = entries[0].1;
    assert!(
        before <= at && at <= after,
        "entry at {at} µs, Redis TIME went from {before} to {after}"
    );

    assert!(skewed.check_plan(&log("skewed")).await.unwrap().allowed);
    let entries: Vec<(Vec<u8>, u64)> = conn.zrange_withscores("t:{skewed}:l", 0, -1).await.unwrap();
    assert_eq!(entries[0].1, skewed_clock.now_us());

    // A fixed window aligned by Redis TIME: its start is the server's, not a client's.
    let fixed = plan(
        1,
        &[limiter(
            "t:{fixed}",
            &[rule("5/1s", Algorithm::FixedWindow)],
        )],
    );
    let before = redis_time_us(&mut conn).await;
    let verdict = production.check_plan(&fixed).await.unwrap();
    let after = redis_time_us(&mut conn).await;
    let value: String = conn.get("t:{fixed}:f5/1000").await.unwrap();
    let (start, count) = value.split_once(':').unwrap();
    let start: u64 = start.parse().unwrap();
    assert_eq!(count, "1");
    assert_eq!(start % 1_000_000, 0);
    assert!(start <= after && before < start + 1_000_000, "{value}");
    // reset_after counts from the script's instant, which lies between the two TIME reads.
    let end = start + 1_000_000;
    let reset = verdict.rules[0].reset_after_us;
    assert!(end.saturating_sub(after) <= reset && reset <= end - before);
}
