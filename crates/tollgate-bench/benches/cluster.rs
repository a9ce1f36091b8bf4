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
//! one more call per ban key's slot (a ban key has no hash tag: each target's own slot).
//!
//! Each measurement runs `ROUNDS` times (the order rotating), every run on an empty data set;
//! the tables report medians: throughput, and CPU per check (all Redis processes of the
//! deployment, replicas included, from `INFO cpu`; and this process, the client). The
//! cluster's six processes share the machine with the bench: on a small machine the cluster
//! does not add capacity, it spends some; the CPU per check says what it costs on any machine.

use std::{
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tollgate::{BanTarget, Rule, ban_index_key};
use tollgate_bench::{RULES, client_ip};
use tollgate_redis::RedisStore;
use tollgate_testkit::plan::{CheckPlan, PlanBan, PlanExt, PlanLimiter};
use tollgate_testkit::{RedisCluster, RedisServer};

/// Repetitions of every measurement; the table shows medians.
const ROUNDS: usize = 3;
/// Checks per run.
const CHECKS: usize = 40_000;
/// Distinct identities the random keys are drawn from.
const KEYSPACE: u32 = 100_000;
/// Concurrent checks.
const IN_FLIGHT: usize = 50;

/// Checks to run: `count` scaled by `TOLLGATE_BENCH_SCALE`, at least one per task.
fn scaled(count: usize) -> usize {
    tollgate_bench::scaled(count, IN_FLIGHT)
}

fn rounds() -> usize {
    tollgate_bench::rounds(ROUNDS)
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
        .map(|key| PlanLimiter::new(key, rules))
        .collect();
    let plan = CheckPlan::new(1, true, limiters);
    if !bans {
        return plan;
    }
    let bans = [BanTarget::Ip(ip), BanTarget::UserId(n.to_string())]
        .into_iter()
        .map(|target| PlanBan::new("tg", target))
        .collect();
    plan.with_bans(bans, ban_index_key("tg"))
}

/// One run: checks per second, and CPU µs per check of the servers and of this process.
#[derive(Clone, Copy)]
struct Run {
    per_second: f64,
    server_us: f64,
    client_us: f64,
}

/// CPU seconds (user + sys) the Redis servers behind `urls` have used so far.
async fn server_cpu(urls: &[String]) -> f64 {
    let mut total = 0.0;
    for url in urls {
        let mut conn = redis::Client::open(url.as_str())
            .expect("a node URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to a node");
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut conn)
            .await
            .expect("INFO cpu");
        total += info
            .lines()
            .filter_map(|l| {
                let (name, value) = l.split_once(':')?;
                let cpu = matches!(name, "used_cpu_user" | "used_cpu_sys");
                cpu.then(|| value.trim().parse::<f64>().ok())?
            })
            .sum::<f64>();
    }
    total
}

/// CPU seconds (user + sys) this process has used so far.
fn client_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command name (which may hold spaces): utime and stime are the 12th and 13th
    // fields, in clock ticks (100 per second on Linux).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

/// [`throughput`] with the CPU the servers behind `urls` and this process spent on it.
async fn run(store: &RedisStore, urls: &[String], layout: Layout, bans: bool) -> Run {
    let checks = scaled(CHECKS);
    let (server, client) = (server_cpu(urls).await, client_cpu());
    let per_second = throughput(store, layout, bans, checks).await;
    let per_check = |seconds: f64| seconds * 1e6 / checks as f64;
    Run {
        per_second,
        server_us: per_check(server_cpu(urls).await - server),
        client_us: per_check(client_cpu() - client),
    }
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
                    let verdict = store.check_plan(&plan(n, layout, bans, &rules)).await;
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

/// The median of each figure over `runs`.
fn medians(runs: &[Run]) -> Run {
    let of = |f: fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    Run {
        per_second: of(|r| r.per_second),
        server_us: of(|r| r.server_us),
        client_us: of(|r| r.client_us),
    }
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
        let alone_urls = [server.url()];
        let cluster_urls = cluster.urls();
        let mut table = String::from(
            "| plan | standalone (checks/s) | cluster, one slot | ratio | cluster, two slots \
             | ratio |\n|---|---|---|---|---|---|\n",
        );
        let mut cpu = String::from(
            "| plan | CPU µs per check: standalone (server + client) | cluster, one slot \
             | cluster, two slots |\n|---|---|---|---|\n",
        );
        for bans in [false, true] {
            let (mut alone, mut one, mut two) = (vec![], vec![], vec![]);
            for round in 0..rounds() {
                for turn in 0..3 {
                    flush(&alone_urls).await;
                    flush(&cluster_urls).await;
                    match (round + turn) % 3 {
                        0 => alone.push(run(&standalone, &alone_urls, Layout::OneSlot, bans).await),
                        1 => one.push(run(&clustered, &cluster_urls, Layout::OneSlot, bans).await),
                        _ => two.push(run(&clustered, &cluster_urls, Layout::TwoSlots, bans).await),
                    }
                }
                println!(
                    "  bans {bans}, round {round}: standalone {:.0}/s, cluster one slot \
                     {:.0}/s, two slots {:.0}/s",
                    alone[round].per_second, one[round].per_second, two[round].per_second
                );
            }
            let (alone, one, two) = (medians(&alone), medians(&one), medians(&two));
            let plan = if bans {
                "2 limiters x 3 rules, with the identity's 2 ban keys"
            } else {
                "2 limiters x 3 rules"
            };
            let _ = writeln!(
                table,
                "| {plan} | {:.0} | {:.0} | {:.2}x | {:.0} | {:.2}x |",
                alone.per_second,
                one.per_second,
                one.per_second / alone.per_second,
                two.per_second,
                two.per_second / alone.per_second,
            );
            let both = |r: Run| format!("{:.0} + {:.0}", r.server_us, r.client_us);
            let _ = writeln!(
                cpu,
                "| {plan} | {} | {} | {} |",
                both(alone),
                both(one),
                both(two)
            );
        }
        println!("\n{table}\n{cpu}");
    });
}
