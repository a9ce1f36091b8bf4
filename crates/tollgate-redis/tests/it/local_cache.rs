//! The local over-limit cache: a hot identity over its limit costs Redis almost nothing, the
//! cache never admits, answers only until the denial ends, and forgets what a reset or an
//! unban through the store lifts.

use std::{sync::Arc, time::Duration};

use tokio::sync::Barrier;
use tollgate::{
    Algorithm, BanTarget, Dimension, Identity, Limiter, ManualClock, Policy, Reason, Store,
    Tollgate,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::{
    batching::{reset_stats, script_calls},
    support::{PlanExt, limiter, plan, raw, rule},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_denial_storm_costs_redis_almost_nothing() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let mut conn = raw(&server).await;
    let p = plan(
        1,
        &[
            limiter("hot:{ip}", &[rule("10/1h", Algorithm::SlidingLog)]),
            limiter("hot:{user}", &[rule("1000/1h", Algorithm::FixedWindow)]),
        ],
    );
    reset_stats(&mut conn).await;
    // 50 tasks, 100 checks each: one identity far over its limit.
    let barrier = Arc::new(Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (store, p, barrier) = (store.clone(), p.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut admitted = 0;
                for _ in 0..100 {
                    let v = store.check_plan(&p).await.unwrap();
                    assert_eq!(v.rules.len(), 2, "a denial has every rule: {v:?}");
                    if v.allowed {
                        admitted += 1;
                    } else {
                        let retry = v.rules[0].retry_after_us.expect("the log says when");
                        assert!(retry > 0 && retry <= 3_600_000_000, "{v:?}");
                        assert!(v.rules[1].allowed, "{v:?}");
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let calls = script_calls(&mut conn).await;
    let denied = 5000 - admitted;
    println!(
        "denial storm: {admitted} admitted, {denied} denied, {calls} script calls, {} local",
        store.local_denials()
    );
    // Nothing admitted locally: exactly the limit, and Redis holds exactly that.
    assert_eq!(admitted, 10);
    let logged: u64 = redis::cmd("ZCARD")
        .arg("hot:{ip}:l")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(logged, 10);
    let counter: String = redis::cmd("GET")
        .arg("hot:{user}:f1000/3600000")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(counter.ends_with(":10"), "{counter}");
    assert!(
        calls * 100 <= denied as u64,
        "{calls} calls for {denied} denied checks"
    );
    // Local answers are denials only, and nearly all of them.
    let local = store.local_denials();
    assert!(
        local <= denied as u64 && local * 100 >= denied as u64 * 95,
        "{local}"
    );

    // Switched off: every check is a call.
    let off = RedisStore::connect(&format!("{}?local_cache=off", server.url()))
        .await
        .unwrap();
    reset_stats(&mut conn).await;
    for _ in 0..20 {
        assert!(!off.check_plan(&p).await.unwrap().allowed);
    }
    assert_eq!(script_calls(&mut conn).await, 20);
    assert_eq!(off.local_denials(), 0);
}

/// A store on `server` with a manual clock: the cache reads it too.
async fn clocked(server: &RedisServer, clock: &ManualClock) -> RedisStore {
    RedisStore::builder(&server.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_denial_is_answered_locally_until_it_ends_then_redis_admits() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(4_102_444_800));
    let store = clocked(&server, &clock).await;
    let mut conn = raw(&server).await;
    let p = plan(
        1,
        &[limiter("end:{k}", &[rule("2/10s", Algorithm::SlidingLog)])],
    );
    assert!(store.check_plan(&p).await.unwrap().allowed);
    clock.advance(Duration::from_secs(1));
    assert!(store.check_plan(&p).await.unwrap().allowed);
    let denied = store.check_plan(&p).await.unwrap();
    assert_eq!(denied.rules[0].retry_after_us, Some(9_000_000));

    // 8.9 s later: answered here, with Redis's numbers moved on by the time since.
    reset_stats(&mut conn).await;
    clock.advance(Duration::from_millis(8_900));
    let local = store.check_plan(&p).await.unwrap();
    assert_eq!(script_calls(&mut conn).await, 0);
    assert_eq!(store.local_denials(), 1);
    assert!(!local.allowed);
    assert_eq!(local.rules[0].retry_after_us, Some(100_000));
    assert_eq!(local.rules[0].remaining, 0);
    // A peek of the same cost is the same denial; another cost is Redis's to answer.
    let mut peek = p.clone();
    peek.consume = false;
    assert!(!store.check_plan(&peek).await.unwrap().allowed);
    assert_eq!(script_calls(&mut conn).await, 0);
    let mut free = p.clone();
    free.cost = 0;
    assert!(store.check_plan(&free).await.unwrap().allowed);
    assert_eq!(script_calls(&mut conn).await, 1);

    // Within the margin before the end: Redis again, which still denies, then admits at 9 s.
    clock.advance(Duration::from_micros(99_500));
    let late = store.check_plan(&p).await.unwrap();
    assert!(!late.allowed);
    assert_eq!(late.rules[0].retry_after_us, Some(500));
    assert_eq!(script_calls(&mut conn).await, 2);
    clock.advance(Duration::from_micros(500));
    assert!(store.check_plan(&p).await.unwrap().allowed);
    assert_eq!(script_calls(&mut conn).await, 3);
}

#[tokio::test]
async fn a_reset_or_an_unban_through_the_store_clears_its_entries() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(4_102_444_800));
    let store = clocked(&server, &clock).await;
    let mut conn = raw(&server).await;
    let gate = Tollgate::new(store.clone()).with_prefix("lc");
    let login = Policy::builder("login")
        .limiter(Limiter::new(Dimension::UserId, ["1/1h".parse().unwrap()]))
        .build()
        .unwrap();
    let who = Identity::new().with_user_id("mallory");

    // Over the limit: the second denial is local; a reset lifts it at once.
    assert!(gate.check(&login, &who, 1).await.unwrap().allowed());
    assert!(!gate.check(&login, &who, 1).await.unwrap().allowed());
    let local = gate.check(&login, &who, 1).await.unwrap();
    assert_eq!(local.reason(), Reason::RateLimited);
    assert_eq!(store.local_denials(), 1);
    assert_eq!(local.retry_after(), Some(Duration::from_secs(3600)));
    gate.reset(&login, &who).await.unwrap();
    assert!(gate.check(&login, &who, 1).await.unwrap().allowed());

    // A live ban, seen once, is answered here until it ends or is lifted through the store.
    let mallory = BanTarget::UserId("mallory".into());
    gate.ban(&mallory, Duration::from_secs(600)).await.unwrap();
    let blocked = gate.check(&login, &who, 1).await.unwrap();
    assert_eq!(blocked.reason(), Reason::Blocked);
    reset_stats(&mut conn).await;
    clock.advance(Duration::from_secs(100));
    let local = gate.check(&login, &who, 1).await.unwrap();
    assert_eq!(local.reason(), Reason::Blocked);
    assert_eq!(local.retry_after(), Some(Duration::from_secs(500)));
    assert_eq!(script_calls(&mut conn).await, 0);
    assert_eq!(store.local_denials(), 2);
    assert!(gate.unban(&mallory).await.unwrap());
    clock.advance(Duration::from_secs(3600));
    assert!(gate.check(&login, &who, 1).await.unwrap().allowed());
    assert!(store.bans_possible());
}
