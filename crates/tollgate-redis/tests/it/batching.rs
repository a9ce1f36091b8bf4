//! Natural batching: checks that arrive while a call is in flight go together as one call,
//! a lone check goes alone at once, and batches admit exactly the limit.

use std::{sync::Arc, time::Duration};

use tokio::sync::Barrier;
use tollgate::Algorithm;
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::support::{CheckPlan, PlanExt, limiter, plan, raw, rule};

/// Script calls (`EVALSHA`, and `EVAL` after a flushed cache) the server has run since its
/// statistics were last reset, from `INFO commandstats`.
pub(crate) async fn script_calls(conn: &mut impl redis::aio::ConnectionLike) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            let calls = l.split_once("calls=").unwrap().1;
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

pub(crate) async fn reset_stats(conn: &mut impl redis::aio::ConnectionLike) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// A store on `url` with a timeout for a busy machine, the local cache off (these tests count
/// the calls that checks make).
async fn store_on(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .timeout(Duration::from_secs(10))
        .local_cache(false)
        .build()
        .await
        .unwrap()
}

/// `rounds` times, `n` checks of `plan` at once; how many were admitted.
async fn rounds(store: &RedisStore, plan: &CheckPlan, n: usize, rounds: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..rounds {
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
        for task in tasks {
            admitted += usize::from(task.await.unwrap());
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_share_calls_and_a_lone_check_goes_alone() {
    let server = RedisServer::start();
    let store = store_on(&server.url()).await;
    let mut conn = raw(&server).await;
    let roomy = plan(
        1,
        &[
            limiter("bt:{ip}", &[rule("100000/1h", Algorithm::SlidingLog)]),
            limiter("bt:{user}", &[rule("100000/1h", Algorithm::FixedWindow)]),
        ],
    );

    // One at a time: one call per check, each sent at once (nothing waits for company).
    reset_stats(&mut conn).await;
    for _ in 0..20 {
        assert!(store.check_plan(&roomy).await.unwrap().allowed);
    }
    assert_eq!(script_calls(&mut conn).await, 20);

    // 50 at once, 10 times: the checks that arrive during a call share the next one.
    reset_stats(&mut conn).await;
    assert_eq!(rounds(&store, &roomy, 50, 10).await, 500);
    let calls = script_calls(&mut conn).await;
    println!("500 checks, 50 in flight: {calls} script calls");
    assert!(calls < 500 / 2, "{calls} calls for 500 checks");
    let logged: u64 = redis::cmd("ZCARD")
        .arg("bt:{ip}:l")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(logged, 520, "every admitted check recorded once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_admit_exactly_the_limit_of_one_key() {
    let server = RedisServer::start();
    let store = store_on(&server.url()).await;
    let mut conn = raw(&server).await;
    // 400 checks of one key, 50 at a time: batches hold checks of the same key on both sides
    // of the limit.
    for (algorithm, limit) in [
        (Algorithm::SlidingLog, 137),
        (Algorithm::FixedWindow, 61),
        (Algorithm::Gcra, 90),
    ] {
        let key = format!("bx:{{{algorithm}}}");
        let p = plan(
            1,
            &[limiter(&key, &[rule(&format!("{limit}/1h"), algorithm)])],
        );
        reset_stats(&mut conn).await;
        assert_eq!(rounds(&store, &p, 50, 8).await, limit, "{algorithm}");
        assert!(
            script_calls(&mut conn).await < 400,
            "{algorithm}: no batch formed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_can_be_turned_off_in_the_url() {
    let server = RedisServer::start();
    let store = store_on(&format!("{}?batching=off", server.url())).await;
    let mut conn = raw(&server).await;
    let p = plan(
        1,
        &[limiter(
            "off:{k}",
            &[rule("1000/1h", Algorithm::SlidingLog)],
        )],
    );
    reset_stats(&mut conn).await;
    assert_eq!(rounds(&store, &p, 50, 4).await, 200);
    assert_eq!(script_calls(&mut conn).await, 200);
    let err = RedisStore::builder(&format!("{}?batching=off", server.url()))
        .batching(true)
        .build()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("both in the URL and to the builder"),
        "{err}"
    );
}
