//! Never over-admit (invariant 1): many tasks on one client, and several processes on one
//! Redis, admit exactly the limit.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::{Arc, mpsc},
    thread,
    time::Duration,
};

use tokio::sync::Barrier;
use tollgate::Algorithm;
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::support::{CheckPlan, PlanExt, limiter, plan, raw, rule, store};

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
    let exe = std::env::current_exe().unwrap();
    let (tx, lines) = mpsc::channel::<(usize, String)>();
    let mut children = Vec::new();
    for i in 0..3 {
        let mut child = Command::new(&exe)
            .args([WORKER_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(WORKER_ENV, server.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send((i, line)).is_err() {
                    return;
                }
            }
        });
        children.push(child);
    }
    // Every worker's last line matching `what`, within a generous bound (hang detector).
    let workers = children.len();
    let wait_for = |what: &str| -> Vec<String> {
        let mut found = vec![None; workers];
        while found.iter().any(Option::is_none) {
            let (i, line) = lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("a worker never said {what:?}"));
            if let Some(at) = line.find(what) {
                found[i] = Some(line[at + what.len()..].trim().to_owned());
            }
        }
        found.into_iter().flatten().collect()
    };

    wait_for("tollgate-worker ready");
    // All connected: release them together, so their checks overlap on the server.
    for child in &mut children {
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    let admitted: Vec<usize> = wait_for("tollgate-worker admitted=")
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    println!("admitted per process: {admitted:?}");
    assert_eq!(admitted.iter().sum::<usize>(), 100, "{admitted:?}");
}

/// Not a test of its own: the body of one worker process of the test above, which runs this
/// binary again with [`WORKER_ENV`] set. Without it, there is nothing to do.
#[test]
fn process_worker() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::builder(&url)
            .timeout(Duration::from_secs(10))
            .build()
            .await
            .unwrap();
        println!("tollgate-worker ready");
        std::io::stdout().flush().unwrap();
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).unwrap();
        let admitted = fire(&store, &shared_plan(), CHECKS_PER_PROCESS).await;
        println!("tollgate-worker admitted={admitted}");
        std::io::stdout().flush().unwrap();
    });
}
