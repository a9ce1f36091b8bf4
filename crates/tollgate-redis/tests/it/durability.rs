//! Durability `replicated`: a check is final once the replicas hold its writes (`WAIT` on a
//! connection of its own), and a store failure that `on_error` decides when they do not.
//! The failovers themselves are in `chaos.rs`.

use std::time::{Duration, Instant};

use tollgate::{
    CheckRequest, Dimension, Durability, Identity, Limiter, LimiterRequest, OnError, Policy,
    Reason, Store, Tollgate,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::support::raw;

fn policy(scope: &str, limit: u64, durability: Durability) -> Policy {
    Policy::builder(scope)
        .limiter(Limiter::new(
            Dimension::Ip,
            [format!("{limit}/1h").parse().unwrap()],
        ))
        .durability(durability)
        .on_error(OnError::Deny)
        .build()
        .unwrap()
}

fn who() -> Identity {
    Identity::new().with_ip("192.0.2.44".parse().unwrap())
}

async fn gate(server: &RedisServer, timeout: Duration) -> Tollgate<RedisStore> {
    let store = RedisStore::builder(&server.url())
        .timeout(timeout)
        .local_cache(false)
        .build()
        .await
        .unwrap();
    Tollgate::new(store)
}

/// How many times the server ran `command` since its statistics were last reset.
async fn calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
    let head = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&head))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// One field of `INFO <section>`.
async fn info(server: &RedisServer, section: &str, field: &str) -> String {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap()
        .trim()
        .to_owned()
}

const REPLICATED: Durability = Durability::replicated(1, Duration::from_millis(2_000));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_check_waits_for_the_replica_and_admits_exactly_the_limit() {
    let primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    let gate = gate(&primary, Duration::from_secs(5)).await;
    let quota = policy("replicated_quota", 3, REPLICATED);
    let mut admitted = 0;
    for _ in 0..5 {
        let d = gate.check(&quota, &who(), 1).await.unwrap();
        assert!(matches!(d.reason(), Reason::Ok | Reason::RateLimited));
        admitted += usize::from(d.allowed());
        // Final means on the replica: what it holds counts every admission so far.
        let keys: u64 = redis::cmd("DBSIZE")
            .query_async(&mut raw(&replica).await)
            .await
            .unwrap();
        assert_eq!(keys, 1, "the replica holds the limiter's state at once");
    }
    assert_eq!(admitted, 3);
    assert_eq!(calls(&primary, "wait").await, 5, "one WAIT per check");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_makes_a_replicated_check_a_store_failure_that_on_error_decides() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::replica_of(&primary);
    let gate = gate(&primary, Duration::from_secs(5)).await;
    let quota = policy(
        "stalled",
        100,
        Durability::replicated(1, Duration::from_millis(200)),
    );
    assert!(gate.check(&quota, &who(), 1).await.unwrap().allowed());

    replica.pause();
    let d = gate.check(&quota, &who(), 1).await.unwrap();
    assert!(
        !d.allowed(),
        "the write never reached the replica: not final"
    );
    assert_eq!(d.reason(), Reason::StoreUnavailable);
    let allow = Policy::builder("stalled")
        .limiter(quota.limiters()[0].clone())
        .durability(Durability::replicated(1, Duration::from_millis(200)))
        .on_error(OnError::Allow)
        .build()
        .unwrap();
    let d = gate.check(&allow, &who(), 1).await.unwrap();
    assert!(d.allowed(), "on_error = allow admits it");
    assert_eq!(d.reason(), Reason::StoreUnavailable);

    replica.resume();
    let d = gate.check(&quota, &who(), 1).await.unwrap();
    assert_eq!(d.reason(), Reason::Ok, "answered by Redis again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_replica_replicated_checks_fail_and_async_ones_go_on() {
    let server = RedisServer::start();
    let gate = gate(&server, Duration::from_secs(5)).await;
    let replicated = policy(
        "lonely",
        10,
        Durability::replicated(1, Duration::from_millis(20)),
    );
    let rules = ["10/1h".parse().unwrap()];
    let limiters = [LimiterRequest {
        key: "lonely:{x}",
        compact: &[],
        rules: &rules,
        ban: None,
        shadow: false,
    }];
    let request = CheckRequest::new(1, true, &limiters).with_durability(replicated.durability());
    // The store's own error says how many replicas answered.
    let message = gate.store().check(&request).await.unwrap_err().to_string();
    assert!(
        message.contains("0 of 1 replicas acknowledged"),
        "{message}"
    );
    let d = gate.check(&replicated, &who(), 1).await.unwrap();
    assert_eq!((d.allowed(), d.reason()), (false, Reason::StoreUnavailable));
    let d = gate
        .check(&policy("lonely", 10, Durability::Async), &who(), 1)
        .await
        .unwrap();
    assert_eq!((d.allowed(), d.reason()), (true, Reason::Ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_checks_are_not_held_up_by_a_replicated_check_waiting_on_a_stalled_replica() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::replica_of(&primary);
    // The store's bound (500 ms) is far below the replicated check's wait (10 s): an async
    // check queued behind that WAIT would time out.
    let gate = std::sync::Arc::new(gate(&primary, Duration::from_millis(500)).await);
    let slow = policy(
        "slow",
        100,
        Durability::replicated(1, Duration::from_secs(10)),
    );
    replica.pause();
    let waiting = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.check(&slow, &who(), 1).await.unwrap() })
    };
    // Until Redis holds the WAIT: the replicated connection is blocked from here on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while info(&primary, "clients", "blocked_clients").await != "1" {
        assert!(Instant::now() < deadline, "the WAIT never blocked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..3 {
        let d = gate
            .check(&policy("fast", 100, Durability::Async), &who(), 1)
            .await
            .unwrap();
        assert_eq!((d.allowed(), d.reason()), (true, Reason::Ok));
    }
    let d = waiting.await.unwrap();
    assert_eq!(
        d.reason(),
        Reason::StoreUnavailable,
        "bounded by the store's timeout"
    );
    replica.resume();
}
