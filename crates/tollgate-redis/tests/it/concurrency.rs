//! Never over-admit (invariant 1): many tasks on one client, and several processes on one
//! Redis, admit exactly the limit.

use std::sync::Arc;

use tokio::sync::Barrier;
use tollgate::Algorithm;
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::support::{CheckPlan, PlanExt, Workers, limiter, plan, raw, rule, run_worker, store};

/// Set in a child process: the Redis URL it works against.
const WORKER_ENV: &str = "TOLLGATE_REDIS_TEST_WORKER_URL";
const WORKER_TEST: &str = "concurrency::process_worker";
const CHECKS_PER_PROCESS: usize = 170;

/// Limit 100 per minute on the IP, 300 per minute on the user: the IP decides, and the user's
/// log shows that the denied checks cost nothing.
fn shared_plan() -> CheckPlan {
    plan(
        1,
        &[
            limiter("cc:{ip}", &[rule("100/1m", Algorithm::SlidingLog)]),
            limiter("cc:{user}", &[rule("300/1m", Algorithm::SlidingLog)]),
        ],
    )
}

/// Fires `n` checks of `plan` at once on `store`; returns how many were admitted.
async fn fire(store: &RedisStore, plan: &CheckPlan, n: usize) -> usize {
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (store, plan, barrier) = (store.clone(), plan.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.check_plan(&plan).await.unwrap().allowed
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_concurrent_checks_admit_exactly_one_hundred() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;

    assert_eq!(fire(&store, &shared_plan(), 500).await, 100);
    let user: u64 = redis::cmd("ZCARD")
        .arg("cc:{user}:l")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(user, 100, "denied checks were charged to the user limiter");

    let gcra = plan(
        1,
        &[limiter("cc:{gcra}", &[rule("100/1h", Algorithm::Gcra)])],
    );
    assert_eq!(fire(&store, &gcra, 500).await, 100);
}

#[test]
fn three_processes_sharing_one_redis_admit_exactly_one_hundred() {
    let server = RedisServer::start();
    let mut workers = Workers::start(3, WORKER_TEST, WORKER_ENV, &server.url());
    workers.wait_for("tollgate-worker ready");
    // All connected: release them together, so their checks overlap on the server.
    workers.go();
    let admitted: Vec<usize> = workers
        .wait_for("tollgate-worker admitted=")
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
    workers.finish();
    println!("admitted per process: {admitted:?}");
    assert_eq!(admitted.iter().sum::<usize>(), 100, "{admitted:?}");
}

/// Not a test of its own: the body of one worker process of the test above, which runs this
/// binary again with [`WORKER_ENV`] set. Without it, there is nothing to do.
#[test]
fn process_worker() {
    run_worker(WORKER_ENV, "tollgate-worker", |_, store| async move {
        let admitted = fire(&store, &shared_plan(), CHECKS_PER_PROCESS).await;
        format!("admitted={admitted}")
    });
}
