//! tollgate's Redis store on a Redis Cluster against the same store on one standalone
//! `redis-server`, both started by this bench (never the Redis on port 6379), in the same run,
//! printing a table of throughputs and ratios (docs/benchmarks.md, "Redis Cluster").
//!
//! The plan: 2 limiters x 3 sliding-log rules (`10/1m`, `20/1h`, `60/1d`), random identities
//! (so nearly every check is admitted), 50 checks in flight on one `RedisStore`:
//! - standalone: one EVALSHA per check;
//! - cluster, both limiters under one hash tag: one EVALSHA per check, on one primary;
//! - cluster, each limiter under its own tag (two slots, usually two primaries): one EVALSHA
//!   per slot, concurrently.
//!
//! Each runs again with the identity's two ban keys (what the engine adds when its blocklist is
//! on): standalone reads them inside its one script; a cluster reads them beside the limiters,
//! one more call, on the `{ban}` slot's primary.
//!
//! Each measurement runs `ROUNDS` times (the order rotating), every run on an empty data set;
//! the table reports medians. The cluster's six processes (three primaries, each with a replica
//! that receives every write) share the machine with the bench: on a small machine the cluster
//! does not add capacity, it spends some.

use std::{
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tollgate::{BanTarget, CheckPlan, PlanBan, PlanLimiter, Rule, Store, ban_index_key};
use tollgate_bench::{RULES, client_ip};
use tollgate_redis::RedisStore;
use tollgate_testkit::{RedisCluster, RedisServer};

/// Repetitions of every measurement; the table shows medians.
const ROUNDS: usize = 3;
/// Checks per run.
const CHECKS: usize = 40_000;
/// Distinct identities the random keys are drawn from.
const KEYSPACE: u32 = 100_000;
/// Concurrent checks.
const IN_FLIGHT: usize = 50;

/// `count` scaled by `TOLLGATE_BENCH_SCALE` (default 1; e.g. 0.1 for a quick look).
fn scaled(count: usize) -> usize {
    let scale = std::env::var("TOLLGATE_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    ((count as f64 * scale) as usize).max(IN_FLIGHT)
}

fn rounds() -> usize {
    std::env::var("TOLLGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ROUNDS)
}

/// Where the two limiters' keys live.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    /// One hash tag for both limiters.
    OneSlot,
    /// A hash tag per limiter.
    TwoSlots,
}

/// The plan of identity `n`.
fn plan(n: u32, layout: Layout, bans: bool, rules: &Arc<[Rule]>) -> CheckPlan {
    let ip = client_ip(n);
    let keys = match layout {
        Layout::OneSlot => [
            format!("tg:{{bench:{n}}}:ip"),
            format!("tg:{{bench:{n}}}:user"),
        ],
        Layout::TwoSlots => [
            format!("tg:{{bench:ip:{ip}}}"),
            format!("tg:{{bench:user:{n}}}"),
        ],
    };
    let limiters = keys
        .into_iter()
        .map(|key| PlanLimiter {
            key,
            rules: rules.clone(),
            ban: None,
        })
        .collect();
    let plan = CheckPlan::new(1, true, limiters);
    if !bans {
        return plan;
    }
    let bans = [BanTarget::Ip(ip), BanTarget::UserId(n.to_string())]
        .into_iter()
        .map(|target| PlanBan {
            key: target.key("tg"),
            target,
        })
        .collect();
    plan.with_bans(bans, ban_index_key("tg"))
}

/// Checks per second over `checks` random plans, `IN_FLIGHT` at a time.
async fn throughput(store: &RedisStore, layout: Layout, bans: bool, checks: usize) -> f64 {
    let rules: Arc<[Rule]> = RULES
        .iter()
        .map(|r| r.parse().expect("the bench rules are valid"))
        .collect();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (store, next, rules) = (store.clone(), next.clone(), rules.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < checks {
                    let n = rand::random_range(0..KEYSPACE);
                    let verdict = store.check(&plan(n, layout, bans, &rules)).await;
                    verdict.expect("the bench's store failed");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a bench task panicked");
    }
    checks as f64 / start.elapsed().as_secs_f64()
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// FLUSHALL on every node given (primaries; replicas follow).
async fn flush(urls: &[String]) {
    for url in urls {
        let mut conn = redis::Client::open(url.as_str())
            .expect("a node URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to a node");
        // A replica refuses writes; its primary's FLUSHALL reaches it anyway.
        let _: Result<(), _> = redis::cmd("FLUSHALL").query_async(&mut conn).await;
    }
}

fn main() {
    let server = RedisServer::start();
    let cluster = RedisCluster::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let timeout = Duration::from_secs(5);
        let standalone = RedisStore::builder(&server.url())
            .timeout(timeout)
            .build()
            .await
            .expect("connect to the bench's redis-server");
        let clustered = RedisStore::builder(&cluster.url())
            .timeout(timeout)
            .build()
            .await
            .expect("connect to the bench's cluster");
        let checks = scaled(CHECKS);
        println!(
            "tollgate on Redis Cluster (3 primaries + 3 replicas) vs standalone, both started \
             by this bench; 2 limiters x 3 rules, {checks} checks per run, {IN_FLIGHT} in \
             flight, {} rounds, medians",
            rounds()
        );
        let mut table = String::from(
            "| plan | standalone (checks/s) | cluster, one slot | ratio | cluster, two slots \
             | ratio |\n|---|---|---|---|---|---|\n",
        );
        for bans in [false, true] {
            let (mut alone, mut one, mut two) = (vec![], vec![], vec![]);
            for round in 0..rounds() {
                for turn in 0..3 {
                    flush(&[server.url()]).await;
                    flush(&cluster.urls()).await;
                    match (round + turn) % 3 {
                        0 => {
                            alone.push(throughput(&standalone, Layout::OneSlot, bans, checks).await)
                        }
                        1 => one.push(throughput(&clustered, Layout::OneSlot, bans, checks).await),
                        _ => two.push(throughput(&clustered, Layout::TwoSlots, bans, checks).await),
                    }
                }
                println!(
                    "  bans {bans}, round {round}: standalone {:.0}/s, cluster one slot \
                     {:.0}/s, two slots {:.0}/s",
                    alone[round], one[round], two[round]
                );
            }
            let (alone, one, two) = (median(&alone), median(&one), median(&two));
            let _ = writeln!(
                table,
                "| 2 limiters x 3 rules{} | {alone:.0} | {one:.0} | {:.2}x | {two:.0} | {:.2}x |",
                if bans {
                    ", with the identity's 2 ban keys"
                } else {
                    ""
                },
                one / alone,
                two / alone,
            );
        }
        println!("\n{table}");
    });
}
