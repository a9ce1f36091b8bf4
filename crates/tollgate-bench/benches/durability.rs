//! What `durability = "replicated"` costs beside `async`, on a primary and a replica this
//! bench starts itself (never the server on port 6379), side by side in one run:
//!
//! 1. Latency with one decision in flight: the two sides interleaved decision by decision
//!    (so that both meet the same load on a shared machine), p50 and p99.
//! 2. Throughput with 50 in flight (natural batching: one `WAIT` per batch), and the
//!    primary's and the replica's CPU per decision (`INFO cpu`).
//!
//! And what repair (`RedisStoreBuilder::repair`) costs an async check when nothing fails:
//! the same two measurements with it on.
//!
//! One policy: a user's `1000/1m` and `100000/1d` (sliding window), distinct users drawn
//! from 100,000. Each measurement runs `ROUNDS` times (sides alternating which goes first) on
//! an empty data set; the table shows medians and the ratios of the medians.

// A bench: a failed step ends the run, with its message.
#![allow(clippy::unwrap_used)]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tollgate::{Algorithm, Dimension, Durability, Identity, Limiter, Policy, Rule, Tollgate};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

const ROUNDS: usize = 3;
const LATENCY_DECISIONS: usize = 3_000;
const DECISIONS: usize = 50_000;
const IN_FLIGHT: usize = 50;
const KEYSPACE: u32 = 100_000;

/// The sides measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Async,
    Replicated,
    Repaired,
}

impl Side {
    const ALL: [Side; 3] = [Side::Async, Side::Replicated, Side::Repaired];

    fn name(self) -> &'static str {
        match self {
            Side::Async => "async",
            Side::Replicated => "replicated (1 replica, 100 ms)",
            Side::Repaired => "async + repair",
        }
    }
}

fn policy(side: Side, round: usize) -> Policy {
    let rules: [Rule; 2] = [
        "1000/1m"
            .parse::<Rule>()
            .unwrap()
            .with_algorithm(Algorithm::SlidingWindow),
        "100000/1d"
            .parse::<Rule>()
            .unwrap()
            .with_algorithm(Algorithm::SlidingWindow),
    ];
    let durability = match side {
        Side::Replicated => Durability::replicated(1, Duration::from_millis(100)),
        Side::Async | Side::Repaired => Durability::Async,
    };
    Policy::builder(format!("durability_{side:?}_{round}"))
        .limiter(Limiter::new(Dimension::UserId, rules))
        .durability(durability)
        .build()
        .unwrap()
}

fn who(n: u32) -> Identity {
    Identity::new().with_user_id((n % KEYSPACE).to_string())
}

/// CPU seconds `server` has used so far.
async fn cpu(server: &RedisServer) -> f64 {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys")
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds = tollgate_bench::rounds(ROUNDS);
    let primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let plain = RedisStore::builder(&primary.url()).local_cache(false);
        let gate = Arc::new(Tollgate::new(plain.build().await.unwrap()));
        let repaired = RedisStore::builder(&primary.url())
            .local_cache(false)
            .repair(Duration::from_secs(5));
        let repaired = Arc::new(Tollgate::new(repaired.build().await.unwrap()));
        let gate_of = |side: Side| match side {
            Side::Repaired => repaired.clone(),
            Side::Async | Side::Replicated => gate.clone(),
        };
        println!(
            "durability: a primary ({}) and its replica ({}), started by this bench; \
             {rounds} rounds, medians",
            primary.url(),
            replica.url()
        );
        let mut p50 = [Vec::new(), Vec::new(), Vec::new()];
        let mut p99 = [Vec::new(), Vec::new(), Vec::new()];
        let mut rate = [Vec::new(), Vec::new(), Vec::new()];
        let mut primary_cpu = [Vec::new(), Vec::new(), Vec::new()];
        let mut replica_cpu = [Vec::new(), Vec::new(), Vec::new()];
        for round in 0..rounds {
            // 1. One in flight, interleaved.
            let policies = Side::ALL.map(|s| policy(s, round));
            let mut times = [Vec::new(), Vec::new(), Vec::new()];
            let n = tollgate_bench::scaled(LATENCY_DECISIONS, 1);
            for i in 0..n {
                let order = (i + round) % 3;
                for k in 0..3 {
                    let s = (order + k) % 3;
                    let started = Instant::now();
                    let d = gate_of(Side::ALL[s])
                        .check(&policies[s], &who(i as u32), 1)
                        .await
                        .unwrap();
                    assert_eq!(d.reason(), tollgate::Reason::Ok, "{d:?}");
                    times[s].push(started.elapsed());
                }
            }
            for (s, t) in times.iter_mut().enumerate() {
                t.sort();
                p50[s].push(percentile(t, 0.5).as_secs_f64() * 1e6);
                p99[s].push(percentile(t, 0.99).as_secs_f64() * 1e6);
            }
            // 2. 50 in flight, batched.
            for k in 0..3 {
                let s = (round + k) % 3;
                let side = Side::ALL[s];
                let policy = Arc::new(policy(side, round + 1000));
                let total = tollgate_bench::scaled(DECISIONS, IN_FLIGHT);
                let (p0, r0) = (cpu(&primary).await, cpu(&replica).await);
                let started = Instant::now();
                let tasks: Vec<_> = (0..IN_FLIGHT)
                    .map(|t| {
                        let (gate, policy) = (gate_of(side), policy.clone());
                        tokio::spawn(async move {
                            let mut i = t;
                            while i < total {
                                let d = gate.check(&policy, &who(i as u32), 1).await.unwrap();
                                assert_eq!(d.reason(), tollgate::Reason::Ok, "{d:?}");
                                i += IN_FLIGHT;
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
                let elapsed = started.elapsed().as_secs_f64();
                let (p1, r1) = (cpu(&primary).await, cpu(&replica).await);
                rate[s].push(total as f64 / elapsed);
                primary_cpu[s].push((p1 - p0) * 1e6 / total as f64);
                replica_cpu[s].push((r1 - r0) * 1e6 / total as f64);
                println!(
                    "  round {round}: {}: {:.0} decisions/s, primary {:.2} µs and replica \
                     {:.2} µs CPU per decision",
                    side.name(),
                    total as f64 / elapsed,
                    (p1 - p0) * 1e6 / total as f64,
                    (r1 - r0) * 1e6 / total as f64
                );
            }
        }
        let m = |v: &mut Vec<f64>| median(v);
        let base = [m(&mut p50[0]), m(&mut p99[0]), m(&mut rate[0]), m(&mut primary_cpu[0])];
        println!();
        println!(
            "| side | p50, 1 in flight | p99 | decisions/s, 50 in flight | primary CPU/decision | replica CPU/decision |"
        );
        println!("|---|---|---|---|---|---|");
        for (s, side) in Side::ALL.iter().enumerate() {
            let (a, b, c, d, e) = (
                m(&mut p50[s]),
                m(&mut p99[s]),
                m(&mut rate[s]),
                m(&mut primary_cpu[s]),
                m(&mut replica_cpu[s]),
            );
            println!(
                "| {} | {a:.0} µs ({:.2}x) | {b:.0} µs ({:.2}x) | {c:.0} ({:.2}x) | {d:.2} µs ({:.2}x) | {e:.2} µs |",
                side.name(),
                a / base[0],
                b / base[1],
                c / base[2],
                d / base[3],
            );
        }
    });
}
