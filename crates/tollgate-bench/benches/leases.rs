//! Quota leases on a hot key: three instances (each its own store, its own thread) check one
//! identity far above its limit on one Redis this bench starts (never the server on port 6379),
//! side by side in one run with the memory store and with the same instances unleased:
//!
//! 1. Leased: every instance checks until Redis refuses it; the fleet's own count of its
//!    admissions (exactly the limit), the script calls per admitted decision (`INFO
//!    commandstats`), each instance's decisions a second, Redis's CPU per admitted decision.
//! 2. The memory store, the same three threads on one store: decisions a second per thread;
//!    and one thread alone on its own store (uncontended), beside one leased instance alone.
//! 3. Unleased, the same instances with 16 checks in flight each: Redis's CPU per admitted
//!    decision.
//!
//! The policy: one fixed window by user, `LIMIT` an hour (unleased: `UNLEASED_LIMIT`), leases
//! of a second. Each measurement runs `ROUNDS` times on a fresh key; the table shows medians.

// A bench: a failed step ends the run, with its message.
#![allow(clippy::unwrap_used)]

use std::{
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use tollgate::{
    Algorithm, Dimension, Identity, Limiter, MemoryStore, Policy, QuotaLease, Rule, Store, Tollgate,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

const ROUNDS: usize = 3;
const INSTANCES: usize = 3;
const LIMIT: u64 = 3_000_000;
const UNLEASED_LIMIT: u64 = 60_000;
const IN_FLIGHT: usize = 16;

fn policy(limit: u64, leased: bool) -> Policy {
    let rule = format!("{limit}/1h")
        .parse::<Rule>()
        .unwrap()
        .with_algorithm(Algorithm::FixedWindow);
    let builder = Policy::builder("hot").limiter(Limiter::new(Dimension::UserId, [rule]));
    let builder = if leased {
        builder.lease(QuotaLease::new(Duration::from_secs(1)))
    } else {
        builder
    };
    builder.build().unwrap()
}

/// What one instance saw.
#[derive(Clone, Copy, Default)]
struct Seen {
    admitted: u64,
    decisions: u64,
    elapsed: Duration,
}

impl Seen {
    fn per_second(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64()
    }
}

/// Each gate on its own thread checks `who` one at a time until it is refused.
fn until_refused<S: Store + 'static>(
    gates: Vec<Tollgate<S>>,
    policy: &Policy,
    who: &Identity,
) -> Vec<Seen> {
    let start = Arc::new(Barrier::new(gates.len()));
    let threads: Vec<_> = gates
        .into_iter()
        .map(|gate| {
            let (policy, who, start) = (policy.clone(), who.clone(), start.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                start.wait();
                let began = Instant::now();
                let mut seen = Seen::default();
                loop {
                    let d = match gate.check_sync(&policy, &who, 1) {
                        Some(d) => d,
                        None => rt.block_on(gate.check(&policy, &who, 1)),
                    }
                    .unwrap();
                    seen.decisions += 1;
                    if !d.allowed() {
                        break;
                    }
                    seen.admitted += 1;
                }
                seen.elapsed = began.elapsed();
                seen
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Each gate on its own thread runs `IN_FLIGHT` checks at a time until refused.
fn in_flight(gates: Vec<Tollgate<RedisStore>>, policy: &Policy, who: &Identity) -> u64 {
    let threads: Vec<_> = gates
        .into_iter()
        .map(|gate| {
            let (policy, who) = (policy.clone(), who.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let gate = Arc::new(gate);
                rt.block_on(async {
                    let tasks: Vec<_> = (0..IN_FLIGHT)
                        .map(|_| {
                            let (gate, policy, who) = (gate.clone(), policy.clone(), who.clone());
                            tokio::spawn(async move {
                                let mut admitted = 0;
                                while gate.check(&policy, &who, 1).await.unwrap().allowed() {
                                    admitted += 1;
                                }
                                admitted
                            })
                        })
                        .collect();
                    let mut admitted = 0;
                    for t in tasks {
                        admitted += t.await.unwrap();
                    }
                    admitted
                })
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

async fn info_field(server: &RedisServer, section: &str, wanted: &[&str]) -> f64 {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(':')?;
            if !wanted.contains(&name) {
                return None;
            }
            // `cmdstat_evalsha:calls=12,usec=...`: the calls.
            let value = value
                .strip_prefix("calls=")
                .map_or(value, |v| v.split(',').next().unwrap());
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

async fn cpu(server: &RedisServer) -> f64 {
    info_field(server, "cpu", &["used_cpu_user", "used_cpu_sys"]).await
}

async fn script_calls(server: &RedisServer) -> f64 {
    info_field(server, "commandstats", &["cmdstat_evalsha", "cmdstat_eval"]).await
}

async fn instances(server: &RedisServer) -> Vec<Tollgate<RedisStore>> {
    let mut gates = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(10))
            .build()
            .await
            .unwrap();
        gates.push(Tollgate::new(store));
    }
    gates
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds = tollgate_bench::rounds(ROUNDS);
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (mut leased_rate, mut memory_rate) = (Vec::new(), Vec::new());
    let (mut alone_rate, mut leased_alone_rate) = (Vec::new(), Vec::new());
    let (mut calls_per, mut leased_cpu, mut unleased_cpu) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let who = Identity::new().with_user_id(format!("tenant-{round}"));

        // 1. Leased.
        let gates = rt.block_on(instances(&server));
        let (calls0, cpu0) =
            rt.block_on(async { (script_calls(&server).await, cpu(&server).await) });
        let seen = until_refused(gates, &policy(LIMIT, true), &who);
        let (calls1, cpu1) =
            rt.block_on(async { (script_calls(&server).await, cpu(&server).await) });
        let admitted: u64 = seen.iter().map(|s| s.admitted).sum();
        assert_eq!(admitted, LIMIT, "the fleet admitted {admitted} of {LIMIT}");
        let rates: Vec<f64> = seen.iter().map(Seen::per_second).collect();
        println!(
            "round {round}: leased, {admitted} admitted, {} script calls, decisions/s per instance {:?}",
            calls1 - calls0,
            rates.iter().map(|r| r.round()).collect::<Vec<_>>()
        );
        calls_per.push((calls1 - calls0) / admitted as f64);
        leased_cpu.push((cpu1 - cpu0) * 1e6 / admitted as f64);
        leased_rate.extend(rates);

        // 2. The memory store, three threads on one store.
        let memory = Tollgate::new(MemoryStore::new());
        let shared: Vec<_> = (0..INSTANCES).map(|_| memory.erase()).collect();
        let seen = until_refused(shared, &policy(LIMIT, false), &who);
        let rates: Vec<f64> = seen.iter().map(Seen::per_second).collect();
        println!(
            "round {round}: memory, decisions/s per thread {:?}",
            rates.iter().map(|r| r.round()).collect::<Vec<_>>()
        );
        memory_rate.extend(rates);
        // And one thread alone on its store, uncontended.
        let alone = until_refused(
            vec![Tollgate::new(MemoryStore::new())],
            &policy(LIMIT / 3, false),
            &who,
        );
        alone_rate.push(alone[0].per_second());
        let one = rt
            .block_on(instances(&server))
            .into_iter()
            .take(1)
            .collect();
        let who_alone = Identity::new().with_user_id(format!("alone-{round}"));
        let leased_one = until_refused(one, &policy(LIMIT / 3, true), &who_alone);
        leased_alone_rate.push(leased_one[0].per_second());

        // 3. Unleased, for Redis's CPU per admitted decision.
        let gates = rt.block_on(instances(&server));
        let cpu0 = rt.block_on(cpu(&server));
        let admitted = in_flight(gates, &policy(UNLEASED_LIMIT, false), &who);
        let cpu1 = rt.block_on(cpu(&server));
        assert_eq!(admitted, UNLEASED_LIMIT);
        unleased_cpu.push((cpu1 - cpu0) * 1e6 / admitted as f64);
    }
    let (leased, memory) = (median(&mut leased_rate), median(&mut memory_rate));
    let (lcpu, ucpu) = (median(&mut leased_cpu), median(&mut unleased_cpu));
    println!();
    println!("| measurement | leased | baseline | ratio | target |");
    println!("|---|---|---|---|---|");
    println!(
        "| script calls per admitted decision | {:.5} | | | <= 0.01 |",
        median(&mut calls_per)
    );
    println!(
        "| decisions/s per instance (3 at once) vs the memory store's per thread | {leased:.0} | {memory:.0} | {:.2}x | >= 0.5x |",
        leased / memory
    );
    let (alone, leased_alone) = (median(&mut alone_rate), median(&mut leased_alone_rate));
    println!(
        "| one instance alone vs the memory store on one thread alone (both uncontended) | {leased_alone:.0} | {alone:.0} | {:.2}x | |",
        leased_alone / alone
    );
    println!(
        "| Redis CPU per admitted decision, leased vs unleased | {lcpu:.3} µs | {ucpu:.2} µs | {:.4}x | <= 0.05x |",
        lcpu / ucpu
    );
}
