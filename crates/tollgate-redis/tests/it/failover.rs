//! Failovers (invariant 8 on Cluster and Sentinel): while the primary of a limiter's slot is
//! dead and not yet replaced, every check is answered by the policy's `on_error` within the
//! timeout; once a replica is promoted the checks are answered by Redis again. The gap is
//! measured and printed, not asserted: it depends on the machine, and is set by
//! `cluster-node-timeout` / `down-after-milliseconds` (1 s here), not by tollgate.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tollgate::{Dimension, Identity, Limiter, OnError, Policy, Reason, Tollgate, key};
use tollgate_redis::RedisStore;
use tollgate_testkit::{RedisCluster, RedisSentinelSet};

/// Far above the store's timeout (500 ms): only a hang fails it.
const HANG: Duration = Duration::from_secs(3);
/// How long a failover may take before the test gives up (a hang detector too).
const FAILOVER: Duration = Duration::from_secs(30);
/// How many checks in a row answered by Redis show that the deployment is back to normal.
const STEADY: usize = 20;

fn policy(scope: &str, on_error: OnError) -> Policy {
    Policy::builder(scope)
        .limiter(Limiter::new(Dimension::Ip, ["1000000/1h".parse().unwrap()]))
        .limiter(Limiter::new(
            Dimension::UserId,
            ["1000000/1h".parse().unwrap()],
        ))
        .on_error(on_error)
        .build()
        .unwrap()
}

/// What one background check saw, and when (since the kill).
#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Duration,
    reason: Reason,
    allowed: bool,
    deny_policy: bool,
}

/// What the load has seen so far, shared with the test.
type Log = Arc<Mutex<Vec<Seen>>>;

/// Checks in a loop on `gate` until `running` is cleared, logging each in `log`; every check
/// must return within [`HANG`]. Times are measured from `start`.
fn load(
    gate: Arc<Tollgate<RedisStore>>,
    running: Arc<AtomicBool>,
    start: Instant,
    log: Log,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let who = Identity::new()
            .with_ip("198.51.100.20".parse().unwrap())
            .with_user_id("failover");
        let allow = policy("failover", OnError::Allow);
        let deny = policy("failover", OnError::Deny);
        let mut i = 0u64;
        while running.load(Ordering::Relaxed) {
            i += 1;
            let deny_policy = i % 2 == 0;
            let p = if deny_policy { &deny } else { &allow };
            let d = tokio::time::timeout(HANG, gate.check(p, &who, 1))
                .await
                .expect("a check hung during the failover")
                .unwrap();
            log.lock().unwrap().push(Seen {
                at: start.elapsed(),
                reason: d.reason(),
                allowed: d.allowed(),
                deny_policy,
            });
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// Waits (within [`FAILOVER`]) until a check is answered by Redis again.
async fn answered_by_redis_again(gate: &Tollgate<RedisStore>) {
    let deadline = Instant::now() + FAILOVER;
    let who = Identity::new()
        .with_ip("198.51.100.20".parse().unwrap())
        .with_user_id("failover");
    let p = policy("failover", OnError::Deny);
    loop {
        let d = tokio::time::timeout(HANG, gate.check(&p, &who, 1))
            .await
            .expect("a check hung after the failover")
            .unwrap();
        if d.reason() == Reason::Ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the store never found the new primary"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stops the load once its last [`STEADY`] checks were all answered by Redis (or after
/// [`FAILOVER`], for `judge` to report), and returns everything seen.
async fn settle(running: &AtomicBool, load: tokio::task::JoinHandle<()>, log: &Log) -> Vec<Seen> {
    let deadline = Instant::now() + FAILOVER;
    // How much of the log the steady run ends: checks still in flight when the load stops are
    // not judged (on a loaded machine one may time out after the store came back).
    let mut steady_at = None;
    loop {
        {
            let seen = log.lock().unwrap();
            if seen.len() >= STEADY
                && seen[seen.len() - STEADY..]
                    .iter()
                    .all(|s| s.reason == Reason::Ok)
            {
                steady_at = Some(seen.len());
            }
        }
        if steady_at.is_some() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.store(false, Ordering::Relaxed);
    load.await.expect("the load task panicked");
    let mut seen = std::mem::take(&mut *log.lock().unwrap());
    if let Some(n) = steady_at {
        seen.truncate(n);
    }
    seen
}

/// Asserts the story of one failover and prints its gap: `killed` is when the primary died.
fn judge(what: &str, seen: &[Seen], killed: Duration) {
    for s in seen {
        match s.reason {
            Reason::Ok => assert!(s.allowed, "{what}: {s:?}"),
            // on_error: allow admits, deny refuses.
            Reason::StoreUnavailable => assert_eq!(s.allowed, !s.deny_policy, "{what}: {s:?}"),
            other => panic!("{what}: unexpected reason {other:?} in {s:?}"),
        }
    }
    // (A check that timed out before the kill on a busy machine is answered the same way.)
    let failed: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.reason == Reason::StoreUnavailable && s.at >= killed)
        .collect();
    let (Some(first), Some(last)) = (failed.first(), failed.last()) else {
        panic!("{what}: no check failed while the primary was dead: {seen:?}");
    };
    let after: Vec<&Seen> = seen.iter().filter(|s| s.at > last.at).collect();
    assert!(
        after.len() >= STEADY && after.iter().all(|s| s.reason == Reason::Ok),
        "{what}: the checks did not return to normal: {after:?}"
    );
    let recovered = after[0].at;
    println!(
        "{what}: primary killed at {killed:?}; {} of {} checks answered by on_error; \
         first failure {:?} after the kill, first Ok again {:?} after the kill \
         (gap {:?})",
        failed.len(),
        seen.len(),
        first.at - killed,
        recovered - killed,
        recovered - first.at,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_primary_is_answered_by_on_error_until_its_replica_takes_over() {
    let mut cluster = RedisCluster::start();
    let store = RedisStore::builder(&cluster.url())
        .timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let gate = Arc::new(Tollgate::new(store));
    let ip_key = key::limiter_key(gate.prefix(), "failover", "ip", "198.51.100.20");

    let start = Instant::now();
    let running = Arc::new(AtomicBool::new(true));
    let log = Log::default();
    let load = load(gate.clone(), running.clone(), start, log.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let killed = start.elapsed();
    let port = cluster.kill_primary_of(&ip_key);
    let cluster = Arc::new(cluster);
    let promoted = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.wait_for_failover(FAILOVER))
            .await
            .unwrap()
    };
    println!(
        "cluster: killed the primary on port {port}; the cluster promoted its replica in {promoted:?}"
    );
    // The client finds the new primary by itself.
    answered_by_redis_again(&gate).await;
    let seen = settle(&running, load, &log).await;
    judge("cluster", &seen, killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sentinel_primary_is_answered_by_on_error_until_the_replica_is_promoted() {
    let mut set = RedisSentinelSet::start();
    let store = RedisStore::builder(&set.url())
        .timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let gate = Arc::new(Tollgate::new(store));

    let start = Instant::now();
    let running = Arc::new(AtomicBool::new(true));
    let log = Log::default();
    let load = load(gate.clone(), running.clone(), start, log.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let killed = start.elapsed();
    let port = set.kill_primary();
    let set = Arc::new(set);
    let promoted = {
        let set = set.clone();
        tokio::task::spawn_blocking(move || set.wait_for_failover(FAILOVER))
            .await
            .unwrap()
    };
    println!(
        "sentinel: killed the primary on port {port}; the sentinels promoted {} in {promoted:?}",
        set.primary_port()
    );
    answered_by_redis_again(&gate).await;
    let seen = settle(&running, load, &log).await;
    judge("sentinel", &seen, killed);
}
