//! Quota leases: instances take units of a busy identity's limits from Redis in advance and
//! admit from them without a call. A fleet of them, each with its own store (its own leases),
//! still admits exactly the limit, counted by the fleet itself; in one process and in several;
//! on a standalone server, a Sentinel primary and a Cluster (with limiters in several slots).

use std::{sync::Arc, time::Duration};

use tokio::sync::Barrier;
use tollgate::{
    Algorithm, Dimension, Identity, Limiter, ManualClock, MemoryStore, Policy, QuotaLease, Reason,
    Rule, Store, Tollgate,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::{RedisCluster, RedisSentinelSet, RedisServer};

use crate::support::{Workers, run_worker};

/// How many instances share the limit.
const INSTANCES: usize = 3;
/// Concurrent checks per instance.
const TASKS: usize = 4;

/// `limit` per `window` in fixed windows, by IP (and by user, with `by_user`: a second
/// limiter, in another hash slot on a Cluster), leased for `ttl`.
fn leased(limit: u64, window: &str, ttl: Duration, by_user: bool) -> Policy {
    let rule = |limit: u64| {
        format!("{limit}/{window}")
            .parse::<Rule>()
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow)
    };
    let mut builder = Policy::builder("leased")
        .limiter(Limiter::new(Dimension::Ip, [rule(limit)]))
        .lease(QuotaLease::new(ttl));
    if by_user {
        builder = builder.limiter(Limiter::new(Dimension::UserId, [rule(limit * 2)]));
    }
    builder.build().unwrap()
}

fn who() -> Identity {
    Identity::new()
        .with_ip("198.51.100.9".parse().unwrap())
        .with_user_id("tenant-9")
}

async fn instance(url: &str, clock: Option<&ManualClock>) -> Arc<Tollgate<RedisStore>> {
    let mut builder = RedisStore::builder(url).timeout(Duration::from_secs(10));
    if let Some(clock) = clock {
        builder = builder.clock(clock.clone());
    }
    Arc::new(Tollgate::new(builder.build().await.unwrap()))
}

/// Every instance checks `policy` for one identity with [`TASKS`] tasks at once, each until
/// its first denial (which must be the limit's, not a failure); what each instance admitted.
/// A task stops only when its instance's lease is spent and Redis refuses: once every task
/// has stopped, nothing is left in hand anywhere.
async fn run_fleet<S: Store + 'static>(gates: &[Arc<Tollgate<S>>], policy: &Policy) -> Vec<u64> {
    let barrier = Arc::new(Barrier::new(gates.len() * TASKS));
    let mut instances = Vec::new();
    for gate in gates {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (gate, policy, barrier) = (gate.clone(), policy.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut admitted = 0u64;
                    loop {
                        let d = gate.check(&policy, &who(), 1).await.unwrap();
                        if !d.allowed() {
                            assert_eq!(d.reason(), Reason::RateLimited, "{d:?}");
                            return admitted;
                        }
                        admitted += 1;
                    }
                })
            })
            .collect();
        instances.push(tasks);
    }
    let mut admitted = Vec::new();
    for tasks in instances {
        let mut sum = 0;
        for task in tasks {
            sum += task.await.unwrap();
        }
        admitted.push(sum);
    }
    admitted
}

/// How many times the server ran `command` (`INFO commandstats`).
async fn calls(url: &str, command: &str) -> u64 {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let head = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&head))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// The fleet's count against the limit: `Err` with the excess when it admitted more.
fn within(limit: u64, admitted: &[u64]) -> Result<u64, String> {
    let total: u64 = admitted.iter().sum();
    if total > limit {
        Err(format!(
            "{admitted:?}: {total} admitted, {} over {limit}",
            total - limit
        ))
    } else {
        Ok(total)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_fleet_admits_exactly_the_limit_with_a_call_per_hundred_admissions() {
    const LIMIT: u64 = 20_000;
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let mut gates = Vec::new();
    for _ in 0..INSTANCES {
        gates.push(instance(&server.url(), Some(&clock)).await);
    }
    let policy = leased(LIMIT, "1h", Duration::from_secs(10), false);
    let admitted = run_fleet(&gates, &policy).await;
    println!("admitted per instance: {admitted:?}");
    assert_eq!(within(LIMIT, &admitted), Ok(LIMIT));

    let calls = calls(&server.url(), "evalsha").await;
    let stats: Vec<_> = gates.iter().map(|g| g.store().leases()).collect();
    println!("{calls} script calls for {LIMIT} admissions; {stats:?}");
    assert!(
        calls * 100 <= LIMIT,
        "{calls} script calls for {LIMIT} admissions"
    );
    let local: u64 = stats.iter().map(|s| s.local_admissions).sum();
    assert!(
        local >= LIMIT * 99 / 100,
        "{local} of {LIMIT} admitted locally"
    );
    // Nothing in hand: every lease was spent.
    assert!(stats.iter().all(|s| s.units_outstanding == 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_in_hand_answers_without_a_future_and_names_its_share() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let gate = instance(&server.url(), Some(&clock)).await;
    let policy = leased(1_000, "1h", Duration::from_secs(10), false);
    // The first check asks Redis (nothing is known of the identity): no lease yet.
    assert!(gate.check(&policy, &who(), 1).await.unwrap().allowed());
    assert!(gate.check_sync(&policy, &who(), 1).is_none());
    // The second takes a lease: a quarter of what was left (999), 249 units, 248 in hand.
    let d = gate.check(&policy, &who(), 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), Some(1_000 - 2));
    assert_eq!(gate.store().leases().units_outstanding, 248);
    // Then the lease answers at once.
    let d = gate.check_sync(&policy, &who(), 1).unwrap().unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), Some(1_000 - 3));
    assert_eq!(d.receipt().unwrap().units(), 1);
    assert_eq!(gate.store().leases().local_admissions, 1);
    // Its receipt refunds its own unit, not the lease: Redis counted 250 (1 + the lease's
    // 249), and counts 249 after (a peek of 1 unit says what would remain after it).
    let counted = async || {
        1_000
            - 1
            - gate
                .peek(&policy, &who(), 1)
                .await
                .unwrap()
                .remaining()
                .unwrap()
    };
    assert_eq!(counted().await, 250);
    gate.refund(&policy, &who(), 1, d.receipt().as_ref())
        .await
        .unwrap();
    assert_eq!(counted().await, 249);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_ended_lease_left_goes_back_and_another_instance_spends_it() {
    const LIMIT: u64 = 1_000;
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let a = instance(&server.url(), Some(&clock)).await;
    let b = instance(&server.url(), Some(&clock)).await;
    let policy = leased(LIMIT, "1h", Duration::from_secs(1), false);
    for _ in 0..2 {
        assert!(a.check(&policy, &who(), 1).await.unwrap().allowed());
    }
    let held = a.store().leases().units_outstanding;
    assert_eq!(held, 248, "a quarter of 999 less the check's unit");
    // The lease's second ends; the reaper gives back what it held.
    clock.advance(Duration::from_millis(1_001));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.store().leases().units_returned < held {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            a.store().leases()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(a.store().leases().units_outstanding, 0);
    // B, another instance, finds every unit A did not spend.
    let admitted = run_fleet(std::slice::from_ref(&b), &policy).await;
    assert_eq!(admitted, [LIMIT - 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ends_with_the_window_that_counted_it() {
    let server = RedisServer::start();
    // 5 s before an hour's end.
    let clock = ManualClock::new(Duration::from_secs(1_700_002_800 - 5));
    let gate = instance(&server.url(), Some(&clock)).await;
    let policy = leased(1_000, "1h", Duration::from_secs(60), false);
    for _ in 0..3 {
        assert!(gate.check(&policy, &who(), 1).await.unwrap().allowed());
    }
    let before = gate.store().leases();
    assert_eq!(before.local_admissions, 1);
    // In the next window the lease is over, though its 60 s are not: the next check asks
    // Redis, and the new window counts it.
    clock.advance(Duration::from_secs(5));
    assert!(gate.check_sync(&policy, &who(), 1).is_none());
    let d = gate.check(&policy, &who(), 1).await.unwrap();
    assert!(d.allowed());
    let after = gate.store().leases();
    assert_eq!(after.calls, before.calls + 1);
    assert_eq!(after.local_admissions, before.local_admissions);
    // The new window's lease: a quarter of the 999 it had left after this check's unit.
    assert_eq!(d.remaining(), Some(999));
}

/// A fleet on `url` (production clock), by IP and user (two limiters): exactly the limit.
async fn fleet_on(url: &str) {
    const LIMIT: u64 = 3_000;
    let mut gates = Vec::new();
    for _ in 0..INSTANCES {
        gates.push(instance(url, None).await);
    }
    // A window of 30 days: the run does not cross into the next one.
    let policy = leased(LIMIT, "30d", Duration::from_secs(10), true);
    let admitted = run_fleet(&gates, &policy).await;
    println!("admitted per instance: {admitted:?}");
    assert_eq!(within(LIMIT, &admitted), Ok(LIMIT));
    let local: u64 = gates
        .iter()
        .map(|g| g.store().leases().local_admissions)
        .sum();
    assert!(
        local >= LIMIT * 9 / 10,
        "{local} of {LIMIT} admitted locally"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_fleet_on_sentinel_admits_exactly_the_limit() {
    let set = RedisSentinelSet::start();
    fleet_on(&set.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_fleet_on_a_cluster_admits_exactly_the_limit_across_slots() {
    let cluster = RedisCluster::start();
    fleet_on(&cluster.url()).await;
}

/// Set in a child process: the Redis URL it works against.
const WORKER_ENV: &str = "TOLLGATE_REDIS_TEST_LEASE_WORKER_URL";
const WORKER_TEST: &str = "quota_leases::lease_worker";
/// The same, for the fleet whose instances each count alone (the over-admitting mutant).
const ALONE_ENV: &str = "TOLLGATE_REDIS_TEST_ALONE_WORKER_URL";
const ALONE_TEST: &str = "quota_leases::alone_worker";
const PROCESS_LIMIT: u64 = 5_000;

fn process_policy() -> Policy {
    leased(PROCESS_LIMIT, "30d", Duration::from_secs(10), false)
}

/// Three processes, each an instance with its own leases, admit exactly the limit in total by
/// their own count; the same harness over instances that each count alone (a memory store
/// each: leases that were never taken from a shared count) finds them over it.
#[test]
fn three_leasing_processes_admit_exactly_the_limit_and_a_fleet_counting_alone_is_caught() {
    let server = RedisServer::start();
    let fleet = |test: &str, env: &str| {
        let mut workers = Workers::start(3, test, env, &server.url());
        workers.wait_for("tollgate-worker ready");
        workers.go();
        let admitted: Vec<u64> = workers
            .wait_for("tollgate-worker admitted=")
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        workers.finish();
        admitted
    };
    let admitted = fleet(WORKER_TEST, WORKER_ENV);
    println!("admitted per process: {admitted:?}");
    assert_eq!(within(PROCESS_LIMIT, &admitted), Ok(PROCESS_LIMIT));

    let alone = fleet(ALONE_TEST, ALONE_ENV);
    println!("counting alone, admitted per process: {alone:?}");
    assert!(within(PROCESS_LIMIT, &alone).is_err(), "{alone:?}");
}

/// Not a test of its own: one leasing process of the test above.
#[test]
fn lease_worker() {
    run_worker(WORKER_ENV, "tollgate-worker", |_, store| async move {
        let admitted = run_fleet(&[Arc::new(Tollgate::new(store))], &process_policy()).await;
        format!("admitted={}", admitted[0])
    });
}

/// Not a test of its own: one process of the fleet that counts alone.
#[test]
fn alone_worker() {
    run_worker(ALONE_ENV, "tollgate-worker", |_, _store| async move {
        let admitted = run_fleet(
            &[Arc::new(Tollgate::new(MemoryStore::new()))],
            &process_policy(),
        )
        .await;
        format!("admitted={}", admitted[0])
    });
}
