//! Concurrency leases across processes: three processes of hundreds of tasks each hold leases
//! of one concurrency limit for random times; an independent count of the holders, kept in a
//! Redis set apart from tollgate's keys and sampled throughout, never passes the limit.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use redis::AsyncCommands;
use tollgate::{Dimension, Identity, Limiter, Policy, Tollgate};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::support::{Workers, raw, run_worker};

/// Set in a child process: the Redis URL it works against.
const WORKER_ENV: &str = "TOLLGATE_LEASE_TEST_WORKER_URL";
const WORKER_TEST: &str = "leases::lease_worker";
const MAX_IN_FLIGHT: u64 = 5;
const TASKS_PER_PROCESS: usize = 200;
const LEASES_PER_TASK: usize = 3;
/// The independent count: who holds a lease now, one member per holder.
const LIVE: &str = "leases-test:live";

fn policy() -> Policy {
    Policy::builder("lease_test")
        .limiter(
            Limiter::concurrent(Dimension::Global, MAX_IN_FLIGHT, Duration::from_secs(60)).unwrap(),
        )
        .build()
        .unwrap()
}

#[test]
fn three_processes_never_hold_more_leases_than_the_limit() {
    let server = RedisServer::start();
    let mut workers = Workers::start(3, WORKER_TEST, WORKER_ENV, &server.url());
    workers.wait_for("lease-worker ready");

    // The sampler: SCARD of the holders, as often as Redis answers, until the workers end.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        let server_url = server.url();
        rt.spawn(async move {
            let client = redis::Client::open(server_url).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let (mut samples, mut most) = (0u64, 0u64);
            while !done.load(Ordering::Acquire) {
                let live: u64 = conn.scard(LIVE).await.unwrap();
                samples += 1;
                most = most.max(live);
            }
            (samples, most)
        })
    };
    workers.go();
    let held: Vec<usize> = workers
        .wait_for("lease-worker held=")
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
    workers.finish();
    done.store(true, Ordering::Release);
    let (samples, most) = rt.block_on(sampler).unwrap();
    println!("leases held per process: {held:?}; {samples} samples, at most {most} at once");
    assert_eq!(
        held.iter().sum::<usize>(),
        3 * TASKS_PER_PROCESS * LEASES_PER_TASK,
        "every task got its leases in the end (released slots come back)"
    );
    assert!(
        samples > 100,
        "the count was sampled throughout ({samples} samples)"
    );
    assert!(
        most <= MAX_IN_FLIGHT,
        "{most} holders at once, the limit is {MAX_IN_FLIGHT}"
    );
    assert!(most >= 1, "nobody was ever seen holding a lease");
    // Every lease was released: the limit admits its whole width again.
    rt.block_on(async {
        let gate = Tollgate::new(RedisStore::builder(&server.url()).build().await.unwrap());
        let live: u64 = raw(&server).await.scard(LIVE).await.unwrap();
        assert_eq!(live, 0);
        for _ in 0..MAX_IN_FLIGHT {
            assert!(
                gate.check(&policy(), &Identity::new(), 1)
                    .await
                    .unwrap()
                    .allowed()
            );
        }
        assert!(
            !gate
                .check(&policy(), &Identity::new(), 1)
                .await
                .unwrap()
                .allowed()
        );
    });
}

/// Not a test of its own: the body of one worker process of the test above, which runs this
/// binary again with [`WORKER_ENV`] set. Without it, there is nothing to do.
#[test]
fn lease_worker() {
    run_worker(WORKER_ENV, "lease-worker", |url, store| async move {
        let gate = Arc::new(Tollgate::new(store));
        let client = redis::Client::open(url.as_str()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
            .map(|task| {
                let (gate, mut conn) = (gate.clone(), conn.clone());
                tokio::spawn(async move {
                    let (policy, who) = (policy(), Identity::new());
                    let mut held = 0;
                    while held < LEASES_PER_TASK {
                        let decision = gate.check(&policy, &who, 1).await.unwrap();
                        if !decision.allowed() {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        }
                        // Counted only while surely held: after the admission, before the
                        // release.
                        let me = format!("{}:{task}:{held}", std::process::id());
                        let _: u64 = conn.sadd(LIVE, &me).await.unwrap();
                        let hold = rand::random::<u64>() % 3;
                        tokio::time::sleep(Duration::from_millis(hold)).await;
                        let _: u64 = conn.srem(LIVE, &me).await.unwrap();
                        gate.release_concurrent(&policy, &who, &decision.receipt().unwrap())
                            .await
                            .unwrap();
                        held += 1;
                    }
                    held
                })
            })
            .collect();
        let mut held = 0;
        for task in tasks {
            held += task.await.unwrap();
        }
        format!("held={held}")
    });
}

/// A refund, release or renewal naming more units than any check could have charged costs
/// Redis no more than the log it reads: answered well within the store's timeout (a loop over
/// the units named would not end for days).
#[tokio::test]
async fn a_huge_cost_named_by_a_caller_costs_redis_no_scan() {
    let server = RedisServer::start();
    let gate = Tollgate::new(
        RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap(),
    );
    let p = Policy::builder("huge")
        .limiter(Limiter::new(Dimension::Global, ["3/1m".parse().unwrap()]))
        .build()
        .unwrap();
    let who = Identity::new();
    let d = gate.check(&p, &who, 1).await.unwrap();
    let receipt = d.receipt().unwrap().to_string();
    // The same receipt, claiming 10^15 units.
    let (id, rest) = receipt.split_once('.').unwrap();
    let (_, at) = rest.split_once('.').unwrap();
    let forged: tollgate::Receipt = format!("{id}.1000000000000000.{at}").parse().unwrap();
    gate.refund(&p, &who, 1_000_000_000_000_000, Some(&forged))
        .await
        .expect("answered, not timed out");
    let leases = policy();
    let held = gate.check(&leases, &who, 1).await.unwrap();
    let (id, rest) = held
        .receipt()
        .unwrap()
        .to_string()
        .split_once('.')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .unwrap();
    let (_, at) = rest.split_once('.').unwrap();
    let forged: tollgate::Receipt = format!("{id}.1000000000000000.{at}").parse().unwrap();
    // Any receipt of the check names its lease, whatever units it claims: the one unit the
    // lease holds is renewed, then released, each found by halving the units named.
    assert!(
        gate.extend_concurrent(&leases, &who, &forged)
            .await
            .expect("answered")
            .is_some(),
        "the lease's one unit is renewed"
    );
    gate.release_concurrent(&leases, &who, &forged)
        .await
        .expect("answered, not timed out");
    assert_eq!(
        gate.check(&leases, &who, 1).await.unwrap().remaining(),
        Some(MAX_IN_FLIGHT - 1),
        "the slot was freed"
    );
}

/// A check that a Cluster client sent twice (its reply lost) and Redis ran twice recorded its
/// units twice, the second time under the same nonce as `<nonce>r1`: its release frees both
/// (one check held two slots until the lease's TTL).
#[tokio::test]
async fn a_release_frees_what_a_resent_check_recorded_twice() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .local_cache(false)
        .build()
        .await
        .unwrap();
    let gate = Tollgate::new(store);
    let p = Policy::builder("resent")
        .limiter(Limiter::concurrent(Dimension::UserId, 2, Duration::from_secs(60)).unwrap())
        .build()
        .unwrap();
    let who = Identity::new().with_user_id("u");
    let d = gate.check(&p, &who, 1).await.unwrap();
    assert!(d.allowed());
    let receipt = d.receipt().unwrap();
    let base = tollgate::key::limiter_key(gate.prefix(), "resent", "user_id", "u");
    let log = tollgate::key::rule_key(&base, &p.limiters()[0].rules()[0]);
    let member = |tail: &[u8]| [&receipt.id().to_be_bytes()[..], tail].concat();
    let mut conn = raw(&server).await;
    // The second run of the same call: the same units, under `r1`.
    let score: Option<f64> = conn.zscore(&log, member(b"1")).await.unwrap();
    let score = score.expect("the check's member, named by its nonce");
    let _: i64 = conn.zadd(&log, member(b"r1"), score).await.unwrap();
    let busy = gate.check(&p, &who, 1).await.unwrap();
    assert!(!busy.allowed(), "one check holds both slots");

    gate.release_concurrent(&p, &who, &receipt).await.unwrap();
    let left: u64 = conn.zcard(&log).await.unwrap();
    assert_eq!(left, 0, "the release frees what both runs recorded");
    assert!(gate.check(&p, &who, 1).await.unwrap().allowed());
}
