//! Repair after a failover (`RedisStoreBuilder::repair`), on one server whose keys are made to
//! lose this store's writes as a promoted replica would (deleted, or set back): the store
//! writes them again, exactly for logs and to its own last value for counters, and never
//! twice. The failovers themselves are in `chaos.rs`.

use std::time::Duration;

use tollgate::{Algorithm, Dimension, Identity, Limiter, OnError, Policy, Reason, Tollgate, key};
use tollgate_redis::{RedisStore, Repairs};
use tollgate_testkit::RedisServer;

use crate::support::raw;

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::FixedWindow,
    Algorithm::Gcra,
    Algorithm::SlidingWindow,
];

async fn gate(url: &str, repair: bool) -> Tollgate<RedisStore> {
    // A repaired key settles for the timeout plus half a second: short, but long enough for a
    // loaded machine (a check that timed out would make another repair due).
    let mut builder = RedisStore::builder(url)
        .timeout(Duration::from_secs(1))
        .local_cache(false);
    if repair {
        builder = builder.repair(Duration::from_secs(30));
    }
    Tollgate::new(builder.build().await.unwrap())
}

fn policy(scope: &str, algorithm: Algorithm) -> Policy {
    let rule = "7/1h"
        .parse::<tollgate::Rule>()
        .unwrap()
        .with_algorithm(algorithm);
    Policy::builder(scope)
        .limiter(Limiter::new(Dimension::UserId, [rule]))
        .on_error(OnError::Deny)
        .build()
        .unwrap()
}

fn who() -> Identity {
    Identity::new().with_user_id("u1")
}

/// The one state key of `policy`'s limiter for [`who`].
fn state_key(gate: &Tollgate<RedisStore>, policy: &Policy) -> String {
    let base = key::limiter_key(gate.prefix(), policy.scope(), "user_id", "u1");
    key::rule_key(&base, &policy.limiters()[0].rules()[0])
}

async fn admitted(gate: &Tollgate<RedisStore>, policy: &Policy, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let d = answered(gate, policy, &who()).await;
        admitted += usize::from(d.allowed());
    }
    admitted
}

/// A check answered by Redis: a repaired key's checks fail while it settles (bounded).
async fn answered(
    gate: &Tollgate<RedisStore>,
    policy: &Policy,
    who: &Identity,
) -> tollgate::Decision {
    for _ in 0..100 {
        let d = gate.check(policy, who, 1).await.unwrap();
        if d.reason() != Reason::StoreUnavailable {
            assert!(
                matches!(d.reason(), Reason::Ok | Reason::RateLimited),
                "{d:?}"
            );
            return d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never answered by Redis again")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_lost_this_stores_writes_is_written_again_on_every_algorithm() {
    let server = RedisServer::start();
    for repair in [true, false] {
        for algorithm in ALGORITHMS {
            let gate = gate(&server.url(), repair).await;
            let policy = policy(&format!("lost_{repair}_{algorithm}"), algorithm);
            assert_eq!(admitted(&gate, &policy, 5).await, 5);
            // The primary died before its replica had any of them.
            let _: () = redis::cmd("DEL")
                .arg(state_key(&gate, &policy))
                .query_async(&mut raw(&server).await)
                .await
                .unwrap();
            // This check runs against the empty key, finds it behind, and repairs it: the
            // limit of 7 has room for one more, not for seven.
            let finding = gate.check(&policy, &who(), 1).await.unwrap();
            assert!(finding.allowed(), "{algorithm}");
            if repair {
                let next = gate.check(&policy, &who(), 1).await.unwrap();
                assert_eq!(
                    next.reason(),
                    Reason::StoreUnavailable,
                    "{algorithm}: a repaired key settles before it is checked again"
                );
            }
            let after = 1 + admitted(&gate, &policy, 10).await;
            if repair {
                assert_eq!(after, 2, "{algorithm}: 5 + the finding check + 1");
                assert_eq!(gate.store().repairs().runs, 1, "{algorithm}");
                assert_eq!(gate.store().repairs().keys_rewritten, 1, "{algorithm}");
            } else {
                assert_eq!(
                    after, 7,
                    "{algorithm}: without repair the loss is admitted again"
                );
                assert_eq!(gate.store().repairs(), Repairs::default());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_repaired_before_the_next_check() {
    let mut server = RedisServer::start();
    let gate = gate(&server.url(), true).await;
    let policy = policy("restart", Algorithm::SlidingLog);
    assert_eq!(admitted(&gate, &policy, 5).await, 5);
    server.kill();
    let d = gate.check(&policy, &who(), 1).await.unwrap();
    assert_eq!(d.reason(), Reason::StoreUnavailable);
    server.restart(); // empty
    // The failed call made a repair due: it runs before this check reads the log.
    let mut after = 0;
    for _ in 0..50 {
        let d = gate.check(&policy, &who(), 1).await.unwrap();
        if d.reason() == Reason::StoreUnavailable {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        after += usize::from(d.allowed());
    }
    assert_eq!(after, 2, "5 repaired, 2 more fit");
    assert_eq!(gate.store().repairs().keys_rewritten, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_changes_nothing_where_nothing_was_lost_and_keeps_refunds() {
    let mut server = RedisServer::start();
    let gate = gate(&server.url(), true).await;
    let log = policy("intact_log", Algorithm::SlidingLog);
    let window = policy("intact_window", Algorithm::FixedWindow);
    assert_eq!(admitted(&gate, &log, 3).await, 3);
    assert_eq!(admitted(&gate, &window, 3).await, 3);
    // A refund lowers the window's count on purpose: no repair raises it again.
    let d = gate.check(&window, &who(), 1).await.unwrap();
    gate.refund(&window, &who(), 1, d.receipt().as_ref())
        .await
        .unwrap();
    // A call that times out makes a repair due; nothing was lost.
    server.pause();
    let d = gate
        .check(&policy("probe", Algorithm::SlidingLog), &who(), 1)
        .await
        .unwrap();
    server.resume();
    assert_eq!(d.reason(), Reason::StoreUnavailable);
    assert_eq!(admitted(&gate, &log, 10).await, 4);
    assert_eq!(
        admitted(&gate, &window, 10).await,
        4,
        "the refunded unit fits again"
    );
    assert_eq!(
        gate.store().repairs(),
        Repairs {
            runs: 1,
            keys_rewritten: 0
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_across_cluster_slots_is_repaired_in_every_slot() {
    let cluster = tollgate_testkit::RedisCluster::start();
    let gate = gate(&cluster.url(), true).await;
    let rule = || {
        ["7/1h"
            .parse::<tollgate::Rule>()
            .unwrap()
            .with_algorithm(Algorithm::Gcra)]
    };
    let policy = Policy::builder("slots")
        .limiter(Limiter::new(Dimension::Ip, rule()))
        .limiter(Limiter::new(Dimension::UserId, rule()))
        .on_error(OnError::Deny)
        .build()
        .unwrap();
    let who = Identity::new()
        .with_ip("192.0.2.45".parse().unwrap())
        .with_user_id("u1");
    let keys = [
        key::limiter_key(gate.prefix(), "slots", "ip", "192.0.2.45"),
        key::limiter_key(gate.prefix(), "slots", "user_id", "u1"),
    ];
    assert_ne!(cluster.slot_of(&keys[0]), cluster.slot_of(&keys[1]));
    for _ in 0..5 {
        assert!(gate.check(&policy, &who, 1).await.unwrap().allowed());
    }
    // Both slots' primaries lost everything.
    for base in &keys {
        let port = cluster.primary_for_slot(cluster.slot_of(base)).unwrap();
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let deleted: u64 = redis::cmd("DEL")
            .arg(key::rule_key(base, &rule()[0]))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(deleted, 1);
    }
    assert!(
        gate.check(&policy, &who, 1).await.unwrap().allowed(),
        "the finding check"
    );
    let mut admitted = 0;
    for _ in 0..10 {
        let d = answered(&gate, &policy, &who).await;
        admitted += usize::from(d.allowed());
    }
    assert_eq!(
        admitted, 1,
        "5 repaired in both slots, the finding check, 1 more"
    );
    assert_eq!(gate.store().repairs().keys_rewritten, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_away_no_check_waits_for_a_repair() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_millis(200))
        .local_cache(false)
        .repair(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let gate = std::sync::Arc::new(Tollgate::new(store));
    let log = policy("away", Algorithm::SlidingLog);
    assert_eq!(admitted(&gate, &log, 3).await, 3);
    server.pause();
    // Each check fails within the store's timeout (a hang detector: 3 s), even though every
    // one of them finds a repair due that cannot be made: none queues behind another's.
    let checks: Vec<_> = (0..20)
        .map(|_| {
            let (gate, log) = (gate.clone(), log.clone());
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let d = gate.check(&log, &who(), 1).await.unwrap();
                (d.reason(), started.elapsed())
            })
        })
        .collect();
    for check in checks {
        let (reason, took) = check.await.unwrap();
        assert_eq!(reason, Reason::StoreUnavailable);
        assert!(took < Duration::from_secs(3), "a check hung for {took:?}");
    }
    server.resume();
    // Answered by Redis again once repaired (how many fit depends on how many of the
    // timed-out checks Redis ran when it resumed: a timed-out check may have been recorded).
    admitted(&gate, &log, 3).await;
    assert!(gate.store().repairs().runs >= 1);
}
