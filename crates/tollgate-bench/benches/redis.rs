//! tollgate's Redis store against the seed's "Approach A" script, on one `redis-server` this
//! bench starts itself (never the one on port 6379), printing a table of figures and ratios.
//!
//! 1. Throughput, one policy of 3 sliding-log rules, random keys, 50 tasks on one `RedisStore`,
//!    against `redis-benchmark -c 50 -P 16` running the seed script by EVALSHA.
//! 2. Two limiters (IP + user) x 3 rules, against the seed's way (one script call per limiter,
//!    in sequence, on one redis-rs multiplexed connection): latency with 1 decision in flight
//!    (the two sides interleaved decision by decision, so that both meet the same load on a
//!    shared machine), throughput with 50.
//! 3. Redis memory per admitted sliding-log entry, 10 entries per key, both layouts.
//! 4. A hot-key denial storm: one identity far over its limit, 50 in flight, with the local
//!    over-limit cache (the store as shipped) and without it (batching still on): decisions/s,
//!    and Redis script calls per denied check (`INFO commandstats`).
//!
//! Each measurement runs `ROUNDS` times, the two sides alternating which goes first; every run
//! starts on an empty data set (FLUSHALL on the bench's own server). The table reports the
//! median of each side and the ratio of the medians.

use std::{
    fmt::Write as _,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use redis::{AsyncCommands, Script, aio::MultiplexedConnection};
use tollgate::{Decision, Dimension, Identity, Limiter, Policy, Reason, Rule, Tollgate};
use tollgate_bench::{RULES, SEED_RULE_ARGS, SEED_SCRIPT, client_ip, now_ms, seed_uuid};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

/// Repetitions of every measurement; the table shows medians.
const ROUNDS: usize = 3;
/// Checks per throughput run (one limiter).
const CHECKS: usize = 100_000;
/// Decisions per throughput run (two limiters).
const DECISIONS: usize = 50_000;
/// Decisions per latency run (two limiters, one in flight).
const LATENCY_DECISIONS: usize = 3_000;
/// Distinct client IPs / user ids the random keys are drawn from.
const KEYSPACE: u32 = 100_000;
/// Concurrent tasks (and redis-benchmark clients).
const IN_FLIGHT: usize = 50;
/// Keys of the memory measurement, each filled with 10 entries.
const MEMORY_KEYS: u32 = 1_000;
/// The time the seed's client sends in the redis-benchmark run: a fixed instant in ms, as
/// `System.currentTimeMillis()` would give.
const SEED_FIXED_NOW_MS: &str = "1767225600000";

type Gate = Tollgate<RedisStore>;

/// Checks to run: `count` scaled by `TOLLGATE_BENCH_SCALE`, at least one per task.
fn scaled(count: usize) -> usize {
    tollgate_bench::scaled(count, IN_FLIGHT)
}

fn rounds() -> usize {
    tollgate_bench::rounds(ROUNDS)
}

fn main() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut table = Table::default();
    rt.block_on(async {
        let bench = Bench::connect(&server).await;
        println!(
            "tollgate Redis benchmarks: redis-server {} on {} (started by this bench), \
             {} rounds, medians",
            bench.redis_version().await,
            server.url(),
            rounds()
        );
        bench.one_limiter_throughput(&mut table).await;
        bench.two_limiters(&mut table).await;
        bench.memory_per_entry(&mut table).await;
        // Last: the cache remembers the storm's denials (under names no other run uses).
        bench.denial_storm(&mut table).await;
    });
    println!("\n{}", table.render());
}

/// The connections both sides use, on one server.
struct Bench {
    port: u16,
    /// For the seed's calls and for FLUSHALL / MEMORY USAGE.
    conn: MultiplexedConnection,
    seed: Script,
    /// The store as shipped: batching and the local cache on.
    gate: Arc<Gate>,
    /// Batching and the local cache off: one script call per check.
    unbatched: Arc<Gate>,
    /// Batching on, the local cache off.
    uncached: Arc<Gate>,
}

impl Bench {
    async fn connect(server: &RedisServer) -> Bench {
        let client = redis::Client::open(server.url()).expect("the testkit's URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to the bench's redis-server");
        let seed = Script::new(SEED_SCRIPT);
        seed.load_async(&mut conn).await.expect("SCRIPT LOAD");
        // A generous timeout: a check that times out would be admitted by `on_error = allow`
        // without a round trip, which would flatter tollgate's throughput.
        let store = RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("a RedisStore on the bench's redis-server");
        let unbatched = RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(5))
            .batching(false)
            .local_cache(false)
            .build()
            .await
            .expect("a RedisStore on the bench's redis-server");
        let uncached = RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(5))
            .local_cache(false)
            .build()
            .await
            .expect("a RedisStore on the bench's redis-server");
        Bench {
            port: server.port(),
            conn,
            seed,
            gate: Arc::new(Tollgate::new(store)),
            unbatched: Arc::new(Tollgate::new(unbatched)),
            uncached: Arc::new(Tollgate::new(uncached)),
        }
    }

    async fn redis_version(&self) -> String {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut self.conn.clone())
            .await
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned()
    }

    /// Empties the data set.
    async fn flush(&self) {
        let () = redis::cmd("FLUSHALL")
            .query_async(&mut self.conn.clone())
            .await
            .expect("FLUSHALL");
    }

    /// CPU used so far by the server and by this process (where the tollgate side and the
    /// seed's redis-rs client run; redis-benchmark is another process).
    async fn probe(&self) -> Probe {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut self.conn.clone())
            .await
            .expect("INFO cpu");
        let server_s = info
            .lines()
            .filter_map(|l| {
                let (name, value) = l.split_once(':')?;
                let cpu = matches!(name, "used_cpu_user" | "used_cpu_sys");
                cpu.then(|| value.trim().parse::<f64>().ok())?
            })
            .sum::<f64>();
        Probe {
            server_s,
            client_s: process_cpu_seconds(),
        }
    }

    /// Script calls (`EVALSHA` and `EVAL`) the server has run so far.
    async fn script_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn.clone())
            .await
            .expect("INFO commandstats");
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Issue 11's denial storm: one identity over its limit (`10/1m` and the rest), 50 in
    /// flight, with the local cache and without it (batching on in both); each round under a
    /// policy name of its own, so that no round starts with what another learnt.
    async fn denial_storm(&self, table: &mut Table) {
        let total = scaled(CHECKS);
        let (mut cached, mut uncached, mut calls) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds() {
            for (side, gate) in [(true, &self.gate), (false, &self.uncached)] {
                let policy = Arc::new(storm_policy(round, side));
                let before = self.script_calls().await;
                let run = self
                    .tollgate_throughput_on(gate, &policy, total, |_| {
                        Identity::new().with_ip(client_ip(KEYSPACE + 1))
                    })
                    .await;
                let per_denial = (self.script_calls().await - before) as f64 / run.denied as f64;
                let cache = if side {
                    "local cache"
                } else {
                    "no local cache"
                };
                println!(
                    "  denial storm, round {round}, {cache}: {run}; {per_denial:.4} script calls \
                     per denied check"
                );
                if side {
                    cached.push(run.per_second);
                    calls.push(per_denial);
                } else {
                    uncached.push(run.per_second);
                }
            }
        }
        table.row(
            "Redis, hot-key denial storm (one identity over its limit, 50 in flight): script \
             calls per denied check with the local cache (against 1 per check)",
            median(&calls),
            1.0,
            Target::AtMost(0.01),
            "",
        );
        table.row(
            "  the same: decisions/s with the local cache vs without (batching on in both)",
            median(&cached),
            median(&uncached),
            Target::AtLeast(5.0),
            "/s",
        );
    }

    /// Target 1: 3 sliding-log rules, random keys, 50 in flight, vs redis-benchmark -P 16.
    async fn one_limiter_throughput(&self, table: &mut Table) {
        let policy = Arc::new(policy(&[Dimension::Ip]));
        let mut seed = Vec::new();
        let mut ours = Vec::new();
        let mut unbatched = Vec::new();
        for round in 0..rounds() {
            self.flush().await;
            let before = self.probe().await;
            let run = self
                .tollgate_throughput_on(&self.unbatched, &policy, scaled(CHECKS), |i| {
                    Identity::new().with_ip(client_ip(i))
                })
                .await;
            let cpu = self.probe().await.since(&before, scaled(CHECKS));
            println!(
                "  1 limiter, round {round}: tollgate without batching: {run}; {cpu} per check"
            );
            unbatched.push(run.per_second);
            for side in order(round) {
                self.flush().await;
                if side == Side::Seed {
                    let before = self.probe().await;
                    let rps = self.redis_benchmark().await;
                    let cpu = self.probe().await.since(&before, scaled(CHECKS));
                    println!(
                        "  1 limiter, round {round}: redis-benchmark, seed script: {rps:.0}/s; \
                         server CPU {:.1} µs per check",
                        cpu.server_us
                    );
                    seed.push(rps);
                } else {
                    let before = self.probe().await;
                    let run = self
                        .tollgate_throughput(&policy, scaled(CHECKS), |i| {
                            Identity::new().with_ip(client_ip(i))
                        })
                        .await;
                    let cpu = self.probe().await.since(&before, scaled(CHECKS));
                    println!("  1 limiter, round {round}: tollgate: {run}; {cpu} per check");
                    ours.push(run.per_second);
                }
            }
        }
        table.row(
            "Redis, 1 limiter x 3 sliding-log rules, random keys, 50 in flight: throughput \
             (checks/s) vs redis-benchmark -c 50 -P 16, seed script",
            median(&ours),
            median(&seed),
            Target::AtLeast(1.5),
            "/s",
        );
        table.row(
            "  the same, batching off",
            median(&unbatched),
            median(&seed),
            Target::AtLeast(0.8),
            "/s",
        );
    }

    /// `redis-benchmark` running the seed's script by EVALSHA: random key, random 36-character
    /// member, the three rules as ARGV pairs, a fixed "client time".
    async fn redis_benchmark(&self) -> f64 {
        let sha = self.seed.get_hash().to_owned();
        let port = self.port.to_string();
        let (n, r) = (scaled(CHECKS).to_string(), KEYSPACE.to_string());
        let mut args: Vec<String> = [
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-c",
            "50",
            "-P",
            "16",
            "-n",
            &n,
            "-r",
            &r,
            "--csv",
            "EVALSHA",
            &sha,
            "3",
            // The seed's key, `prefix:ip-scope`, with a random client.
            "rate_limit:__rand_int__-sms_code",
            // A 36-character member: 24 fixed characters and 12 random digits.
            "1b4e28ba-2fa1-41d2-883f-__rand_int__",
            SEED_FIXED_NOW_MS,
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(SEED_RULE_ARGS.iter().map(u64::to_string));
        let output = tokio::task::spawn_blocking(move || {
            Command::new("redis-benchmark").args(&args).output()
        })
        .await
        .expect("the redis-benchmark task")
        .expect("redis-benchmark on PATH (Debian: apt-get install -y redis-tools)");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "redis-benchmark failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // --csv: a header line, then `"<command>","<rps>",...`.
        stdout
            .lines()
            .filter(|l| l.starts_with("\"EVALSHA"))
            .find_map(|l| l.split("\",\"").nth(1)?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no rps in redis-benchmark's output: {stdout}"))
    }

    /// `total` checks of `policy` from `IN_FLIGHT` tasks, identity from a random number.
    async fn tollgate_throughput(
        &self,
        policy: &Arc<Policy>,
        total: usize,
        identity: fn(u32) -> Identity,
    ) -> Run {
        self.tollgate_throughput_on(&self.gate, policy, total, identity)
            .await
    }

    /// The same on `gate`.
    async fn tollgate_throughput_on(
        &self,
        gate: &Arc<Gate>,
        policy: &Arc<Policy>,
        total: usize,
        identity: fn(u32) -> Identity,
    ) -> Run {
        let started = AtomicUsize::new(0);
        let tally = Tally::default();
        let shared = Arc::new((started, tally));
        let begin = Instant::now();
        let tasks: Vec<_> = (0..IN_FLIGHT)
            .map(|_| {
                let (gate, policy, shared) = (gate.clone(), policy.clone(), shared.clone());
                tokio::spawn(async move {
                    while shared.0.fetch_add(1, Ordering::Relaxed) < total {
                        let who = identity(rand::random::<u32>() % KEYSPACE);
                        let d = gate
                            .check(&policy, &who, 1)
                            .await
                            .expect("a complete identity");
                        shared.1.add(&d);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a check task");
        }
        Run::new(total, begin.elapsed(), &shared.1)
    }

    /// Target 2: two limiters, one EVALSHA vs the seed's two, latency and throughput.
    async fn two_limiters(&self, table: &mut Table) {
        let policy = Arc::new(policy(&[Dimension::Ip, Dimension::UserId]));
        let (mut p50_seed, mut p50_ours, mut mean_seed, mut mean_ours) =
            (vec![], vec![], vec![], vec![]);
        let (mut tp_seed, mut tp_ours) = (vec![], vec![]);
        for round in 0..rounds() {
            self.flush().await;
            let (seed_lat, our_lat) = self.latency_interleaved(&policy).await;
            println!(
                "  2 limiters, round {round}, interleaved: seed way: {seed_lat}; tollgate: \
                 {our_lat}"
            );
            p50_seed.push(seed_lat.p50_us);
            mean_seed.push(seed_lat.mean_us);
            p50_ours.push(our_lat.p50_us);
            mean_ours.push(our_lat.mean_us);
            for side in order(round) {
                self.flush().await;
                let before = self.probe().await;
                if side == Side::Seed {
                    let run = self.seed_throughput().await;
                    let cpu = self.probe().await.since(&before, scaled(DECISIONS));
                    println!(
                        "  2 limiters, round {round}, 50 in flight: seed way: {run}; {cpu} per \
                         decision"
                    );
                    tp_seed.push(run.per_second);
                } else {
                    let run = self
                        .tollgate_throughput(&policy, scaled(DECISIONS), two_limiter_identity)
                        .await;
                    let cpu = self.probe().await.since(&before, scaled(DECISIONS));
                    println!(
                        "  2 limiters, round {round}, 50 in flight: tollgate: {run}; {cpu} per \
                         decision"
                    );
                    tp_ours.push(run.per_second);
                }
            }
        }
        // The median is the steadier figure on a shared machine: a few descheduled requests
        // move the mean by tens of percent.
        table.row(
            "Redis, 2 limiters (IP + user) x 3 rules, 1 in flight: median (p50) latency per \
             decision vs the seed's way (one script call per limiter, in sequence)",
            median(&p50_ours),
            median(&p50_seed),
            Target::AtMost(0.65),
            " µs",
        );
        table.row(
            "same, mean latency per decision",
            median(&mean_ours),
            median(&mean_seed),
            Target::AtMost(0.65),
            " µs",
        );
        table.row(
            "Redis, 2 limiters (IP + user) x 3 rules, 50 in flight: throughput (decisions/s) \
             vs the seed's way",
            median(&tp_ours),
            median(&tp_seed),
            Target::AtLeast(1.0),
            "/s",
        );
    }

    /// One decision in flight, `LATENCY_DECISIONS` per side: a seed-way decision and a tollgate
    /// decision one after the other (which goes first alternates), each timed alone, so that a
    /// burst of load from elsewhere on the machine falls on both sides alike.
    async fn latency_interleaved(&self, policy: &Policy) -> (Latency, Latency) {
        let (seed_tally, our_tally) = (Tally::default(), Tally::default());
        let mut conn = self.conn.clone();
        let n = scaled(LATENCY_DECISIONS);
        let (mut seed_times, mut our_times) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            for side in order(i) {
                let n = rand::random::<u32>() % KEYSPACE;
                if side == Side::Seed {
                    let begin = Instant::now();
                    let allowed = seed_decision(&self.seed, &mut conn, n).await;
                    seed_times.push(begin.elapsed());
                    seed_tally.add_seed(allowed);
                } else {
                    let who = two_limiter_identity(n);
                    let begin = Instant::now();
                    let d = self
                        .gate
                        .check(policy, &who, 1)
                        .await
                        .expect("a complete identity");
                    our_times.push(begin.elapsed());
                    our_tally.add(&d);
                }
            }
        }
        (
            Latency::new(seed_times, &seed_tally),
            Latency::new(our_times, &our_tally),
        )
    }

    async fn seed_throughput(&self) -> Run {
        let total = scaled(DECISIONS);
        let shared = Arc::new((AtomicUsize::new(0), Tally::default()));
        let begin = Instant::now();
        let tasks: Vec<_> = (0..IN_FLIGHT)
            .map(|_| {
                let (mut conn, seed, shared) =
                    (self.conn.clone(), self.seed.clone(), shared.clone());
                tokio::spawn(async move {
                    while shared.0.fetch_add(1, Ordering::Relaxed) < total {
                        let n = rand::random::<u32>() % KEYSPACE;
                        let allowed = seed_decision(&seed, &mut conn, n).await;
                        shared.1.add_seed(allowed);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a seed task");
        }
        Run::new(total, begin.elapsed(), &shared.1)
    }

    /// Target 3: bytes per admitted sliding-log entry, 10 per key, both layouts.
    async fn memory_per_entry(&self, table: &mut Table) {
        let policy = policy(&[Dimension::Ip]);
        self.flush().await;
        for n in 0..MEMORY_KEYS {
            let who = Identity::new().with_ip(client_ip(n));
            for _ in 0..10 {
                let d = self.gate.check(&policy, &who, 1).await.expect("an IP");
                assert!(d.allowed() && d.reason() == Reason::Ok, "filling admits");
            }
        }
        let ours = self.memory_usage("tg:*").await;
        println!("  memory: tollgate {ours}");

        self.flush().await;
        let mut conn = self.conn.clone();
        let start = now_ms();
        for n in 0..MEMORY_KEYS {
            let key = format!("rate_limit:{}-sms_code", client_ip(n));
            for i in 0..10 {
                // The seed's client sends its own clock: a request a second, as it would.
                let now = start + i * 1000;
                let limited: Option<i64> = self
                    .seed
                    .key(&key)
                    .key(seed_uuid())
                    .key(now)
                    .arg(&SEED_RULE_ARGS[..])
                    .invoke_async(&mut conn)
                    .await
                    .expect("the seed script");
                assert_eq!(limited, None, "filling admits");
            }
        }
        let seed = self.memory_usage("rate_limit:*").await;
        println!("  memory: seed {seed}");
        table.row(
            "Redis memory per admitted sliding-log entry (MEMORY USAGE summed over 1000 keys \
             of 10 entries) vs the seed's ZSET with UUID members",
            ours.per_entry(),
            seed.per_entry(),
            Target::AtMost(0.7),
            " B",
        );
    }

    async fn memory_usage(&self, pattern: &str) -> Memory {
        let mut conn = self.conn.clone();
        let keys: Vec<String> = {
            let mut iter = conn.scan_match::<_, String>(pattern).await.expect("SCAN");
            let mut keys = Vec::new();
            while let Some(key) = iter.next_item().await {
                keys.push(key.expect("a key name"));
            }
            keys
        };
        let mut memory = Memory {
            keys: keys.len(),
            key_example: keys.first().cloned().unwrap_or_default(),
            ..Memory::default()
        };
        for key in &keys {
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await
                .expect("MEMORY USAGE");
            let entries: u64 = conn.zcard(key).await.expect("ZCARD");
            memory.bytes += bytes;
            memory.entries += entries;
        }
        memory
    }
}

/// One decision the seed's way: the IP limiter's script call, then (if it admitted) the user
/// limiter's, each with a fresh UUID member and the client's clock.
async fn seed_decision(seed: &Script, conn: &mut MultiplexedConnection, n: u32) -> bool {
    for key in [
        format!("rate_limit:{}-sms_code", client_ip(n)),
        format!("rate_limit:u{n}-sms_code"),
    ] {
        let limited: Option<i64> = seed
            .key(key)
            .key(seed_uuid())
            .key(now_ms())
            .arg(&SEED_RULE_ARGS[..])
            .invoke_async(conn)
            .await
            .expect("the seed script");
        if limited.is_some() {
            return false;
        }
    }
    true
}

fn two_limiter_identity(n: u32) -> Identity {
    Identity::new()
        .with_ip(client_ip(n))
        .with_user_id(format!("u{n}"))
}

/// The `sms_code` policy: one limiter per dimension, each with the three rules.
fn policy(dimensions: &[Dimension]) -> Policy {
    let rules: Vec<Rule> = RULES
        .iter()
        .map(|r| r.parse().expect("a valid rule"))
        .collect();
    dimensions
        .iter()
        .fold(Policy::builder("sms_code"), |p, d| {
            p.limiter(Limiter::new(d.clone(), rules.iter().copied()))
        })
        .build()
        .expect("a valid policy")
}

/// The denial storm's policy: `sms_code`'s rules under a name of its own per round and side.
fn storm_policy(round: usize, cached: bool) -> Policy {
    let rules: Vec<Rule> = RULES
        .iter()
        .map(|r| r.parse().expect("a valid rule"))
        .collect();
    Policy::builder(format!("storm_{round}_{cached}"))
        .limiter(Limiter::new(Dimension::Ip, rules))
        .build()
        .expect("a valid policy")
}

/// CPU seconds used by this process so far (all threads), from /proc/self/stat.
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start with the state, field 3;
    // utime and stime are fields 14 and 15, in clock ticks (100 per second on Linux).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

/// CPU used so far: the server's and this process's.
struct Probe {
    server_s: f64,
    client_s: f64,
}

impl Probe {
    /// CPU per operation since `before`, over `ops` operations.
    fn since(&self, before: &Probe, ops: usize) -> Cpu {
        let per_op = |s: f64| s * 1e6 / ops as f64;
        Cpu {
            server_us: per_op(self.server_s - before.server_s),
            client_us: per_op(self.client_s - before.client_s),
        }
    }
}

struct Cpu {
    server_us: f64,
    client_us: f64,
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU: server {:.1} µs, client {:.1} µs",
            self.server_us, self.client_us
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Seed,
    Tollgate,
}

/// Which side goes first alternates from round to round.
fn order(round: usize) -> [Side; 2] {
    if round % 2 == 0 {
        [Side::Seed, Side::Tollgate]
    } else {
        [Side::Tollgate, Side::Seed]
    }
}

/// Decisions by outcome; a store failure would be decided by `on_error` without Redis, so any
/// makes the figures worthless and stops the bench.
#[derive(Default)]
struct Tally {
    allowed: AtomicU64,
    denied: AtomicU64,
}

impl Tally {
    fn add(&self, d: &Decision) {
        assert_ne!(
            d.reason(),
            Reason::StoreUnavailable,
            "a check failed; the figures would be meaningless"
        );
        self.add_seed(d.allowed());
    }

    fn add_seed(&self, allowed: bool) {
        let counter = if allowed { &self.allowed } else { &self.denied };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn denied(&self) -> u64 {
        self.denied.load(Ordering::Relaxed)
    }
}

struct Run {
    per_second: f64,
    denied: u64,
    elapsed: Duration,
}

impl Run {
    fn new(total: usize, elapsed: Duration, tally: &Tally) -> Run {
        Run {
            per_second: total as f64 / elapsed.as_secs_f64(),
            denied: tally.denied(),
            elapsed,
        }
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0}/s ({:.1} s, {} denied)",
            self.per_second,
            self.elapsed.as_secs_f64(),
            self.denied
        )
    }
}

struct Latency {
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    denied: u64,
}

impl Latency {
    fn new(mut times: Vec<Duration>, tally: &Tally) -> Latency {
        times.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let at = |q: f64| us(times[((times.len() - 1) as f64 * q) as usize]);
        Latency {
            mean_us: times.iter().map(|&d| us(d)).sum::<f64>() / times.len() as f64,
            p50_us: at(0.5),
            p99_us: at(0.99),
            denied: tally.denied(),
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "1 in flight: mean {:.0} µs, p50 {:.0} µs, p99 {:.0} µs ({} denied)",
            self.mean_us, self.p50_us, self.p99_us, self.denied
        )
    }
}

#[derive(Default)]
struct Memory {
    keys: usize,
    entries: u64,
    bytes: u64,
    key_example: String,
}

impl Memory {
    fn per_entry(&self) -> f64 {
        self.bytes as f64 / self.entries.max(1) as f64
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} keys (e.g. {:?}), {} entries, {} bytes: {:.1} B per entry",
            self.keys,
            self.key_example,
            self.entries,
            self.bytes,
            self.per_entry()
        )
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

enum Target {
    AtLeast(f64),
    AtMost(f64),
}

#[derive(Default)]
struct Table {
    rows: Vec<String>,
}

impl Table {
    fn row(&mut self, what: &str, ours: f64, seed: f64, target: Target, unit: &str) {
        let ratio = ours / seed;
        let (target, pass) = match target {
            Target::AtLeast(t) => (format!(">= {t}x"), ratio >= t),
            Target::AtMost(t) => (format!("<= {t}x"), ratio <= t),
        };
        // Small figures (calls per check) keep their digits.
        let (p, r) = if ours.abs() < 1.0 { (4, 4) } else { (1, 2) };
        self.rows.push(format!(
            "| {what} | {ours:.p$}{unit} | {seed:.1}{unit} | {ratio:.r$}x | {target} | {} |",
            if pass { "pass" } else { "MISS" }
        ));
    }

    fn render(&self) -> String {
        let mut out = String::from(
            "| measurement | tollgate | seed | ratio | target | |\n|---|---|---|---|---|---|\n",
        );
        for row in &self.rows {
            let _ = writeln!(out, "{row}");
        }
        out
    }
}
