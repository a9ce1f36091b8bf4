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
    // Long enough for a replica on a loaded machine (a second was not, once); each refused
    // check waits for it.
    let quota = policy(
        "stalled",
        100,
        Durability::replicated(1, Duration::from_secs(3)),
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
        .durability(Durability::replicated(1, Duration::from_secs(3)))
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
        overrides: None,
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
    // The store's bound (2 s) is far below the replicated check's wait (60 s): an async
    // check queued behind that WAIT would time out.
    let gate = std::sync::Arc::new(gate(&primary, Duration::from_secs(2)).await);
    let slow = policy(
        "slow",
        100,
        Durability::replicated(1, Duration::from_secs(60)),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_check_across_cluster_slots_waits_for_each_slots_replicas() {
    let mut cluster = tollgate_testkit::RedisCluster::start();
    let store = RedisStore::builder(&cluster.url())
        .timeout(Duration::from_secs(5))
        .local_cache(false)
        .build()
        .await
        .unwrap();
    let gate = Tollgate::new(store);
    let rule = || ["5/1h".parse::<tollgate::Rule>().unwrap()];
    let quota = Policy::builder("across")
        .limiter(Limiter::new(Dimension::Ip, rule()))
        .limiter(Limiter::new(Dimension::UserId, rule()))
        // Long enough for a replica on a loaded machine: every check but the stalled one is
        // final.
        .durability(Durability::replicated(1, Duration::from_secs(3)))
        .on_error(OnError::Deny)
        .build()
        .unwrap();
    let who = Identity::new()
        .with_ip("192.0.2.44".parse().unwrap())
        .with_user_id("across");
    let ip_key = tollgate::key::limiter_key(gate.prefix(), "across", "ip", "192.0.2.44");
    let user_key = tollgate::key::limiter_key(gate.prefix(), "across", "user_id", "across");
    assert_ne!(
        cluster.slot_of(&ip_key),
        cluster.slot_of(&user_key),
        "the test needs the two limiters in two slots"
    );
    let d = gate.check(&quota, &who, 1).await.unwrap();
    assert_eq!((d.allowed(), d.reason()), (true, Reason::Ok));

    // The user limiter's replica stalls: that slot's writes are not final, so neither is
    // the check, and the IP limiter's slot gives its reservation back.
    let primary = cluster
        .primary_for_slot(cluster.slot_of(&user_key))
        .unwrap();
    let replica = cluster.wait_for_replica_of(primary, Duration::from_secs(30));
    cluster.pause_node(replica);
    let d = gate.check(&quota, &who, 1).await.unwrap();
    cluster.resume_node(replica);
    assert_eq!((d.allowed(), d.reason()), (false, Reason::StoreUnavailable));

    let mut admitted = 0;
    for _ in 0..10 {
        let d = gate.check(&quota, &who, 1).await.unwrap();
        assert!(
            matches!(d.reason(), Reason::Ok | Reason::RateLimited),
            "{d:?}"
        );
        admitted += usize::from(d.allowed());
    }
    // The user limiter's stalled slot ran its script: the refused attempt counts there, as
    // on one server (conservative: never an admission too many): 1 + 1 + 3. The IP
    // limiter's slot gave its reservation back: 1 + 3.
    assert_eq!(admitted, 3);
    let rule = rule()[0];
    let mut logged = Vec::new();
    for key in [&ip_key, &user_key] {
        let port = cluster.primary_for_slot(cluster.slot_of(key)).unwrap();
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let n: u64 = redis::cmd("ZCARD")
            .arg(tollgate::key::rule_key(key, &rule))
            .query_async(&mut conn)
            .await
            .unwrap();
        logged.push(n);
    }
    assert_eq!(logged, [4, 5], "IP undone, the stalled slot's attempt kept");
}
