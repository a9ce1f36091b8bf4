//! Runs N checks of one case, for instruction counts that do not depend on load:
//!
//! ```sh
//! cargo build --release -p tollgate-bench --example probe
//! valgrind --tool=callgrind --toggle-collect='probe::checks*' \
//!     target/release/examples/probe gcra_admit 20000
//! ```
//!
//! Only the measured loop (`checks`, after a round that creates every key) is counted: the
//! total divided by the number of checks is the cost of one. Cases: `gcra_admit`, `gcra_deny`, `log_admit`,
//! `log_deny`, `log_steady` (the memory bench's steady sliding log: a full day in every
//! client's log), `window_steady` (the same rules as sliding windows), `two_by_three_admit`, `governor_admit`, `governor_deny`; and, for what overrides
//! cost their users, `gcra_overridable_admit` (the limiter takes overrides, one is set for
//! another identity) and `gcra_overridden_admit` (every identity has one); for what a
//! blocklist costs, `log_ban_admit` (`log_admit`'s limiter writes bans, as the seed's does).
//! Any tollgate case with `_sync` appended (`gcra_admit_sync`) checks through
//! `Tollgate::check_sync` instead of polling `Tollgate::check`'s future: what a caller without
//! a future pays.
//!
//! `probe threads2 5000000` runs that many GCRA admissions on each of 2 threads (its own
//! thousand keys each) and prints checks a second, beside governor's, for profiles of how
//! threads share the store (`perf stat`, `perf record`).
//!
//! `engine_only` (and `engine_only_sync`) checks a one-rule GCRA policy against a store that
//! answers every check in place at once and keeps nothing: what the engine costs (key, lane,
//! decision) without a store's hashing, lock, clock and state.
//!
//! The checks cycle through a thousand clients; build with `PROBE_KEYS=16` in the environment
//! for sixteen, whose state stays in the L1 cache: a case that costs the same both ways is not
//! waiting on memory.
//!
//! `probe rss 1000000` instead fills a memory store with that many one-rule (GCRA) keys of
//! distinct IPv4 clients and prints the resident memory per key.

use std::{
    future::Future,
    hint::black_box,
    net::IpAddr,
    num::NonZeroU32,
    pin::pin,
    task::{Context, Poll, Waker},
};

use governor::{Quota, RateLimiter};
use tollgate::{
    Algorithm, BanRule, CheckRequest, Decision, Dimension, Identity, Limiter, LimiterAnswer,
    LimiterCheck, ManualClock, MemoryStore, Policy, Rule, Store, StoreError, StoreErrorKind,
    Tollgate, Verdict, algorithm::RuleOutcome,
};
use tollgate_bench::client_ip;

/// The clients the checks cycle through: a thousand, or `PROBE_KEYS` at build time.
const KEYS: u32 = match option_env!("PROBE_KEYS") {
    Some(keys) => parse_keys(keys),
    None => 1000,
};

const fn parse_keys(text: &str) -> u32 {
    let (digits, mut i, mut keys) = (text.as_bytes(), 0, 0);
    assert!(!digits.is_empty(), "PROBE_KEYS must be a number");
    while i < digits.len() {
        assert!(digits[i].is_ascii_digit(), "PROBE_KEYS must be a number");
        keys = keys * 10 + (digits[i] - b'0') as u32;
        i += 1;
    }
    assert!(keys > 0, "PROBE_KEYS must be above 0");
    keys
}

fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("a memory-store check is ready at once"),
    }
}

fn rule(text: &str, algorithm: Algorithm) -> Rule {
    text.parse::<Rule>()
        .expect("a valid rule")
        .with_algorithm(algorithm)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_else(|| "gcra_admit".into());
    let n: u32 = args.next().and_then(|n| n.parse().ok()).unwrap_or(25_000);
    if case == "rss" {
        return rss(n);
    }
    if let Some(threads) = case.strip_prefix("threads") {
        return throughput(threads.parse().unwrap_or(2), n);
    }
    let ips: Vec<IpAddr> = (0..KEYS).map(client_ip).collect();
    let who: Vec<Identity> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| Identity::new().with_ip(*ip).with_user_id(format!("u{i}")))
        .collect();
    if let Some(admit) = case.strip_prefix("governor_").map(|c| c == "admit") {
        let per_hour = NonZeroU32::new(if admit { u32::MAX } else { 1 }).expect("non-zero");
        let limiter: governor::DefaultKeyedRateLimiter<IpAddr> =
            RateLimiter::keyed(Quota::per_hour(per_hour));
        for ip in &ips {
            let _ = limiter.check_key(ip);
        }
        let wrong = governor_checks(&limiter, &ips, n, admit);
        assert_eq!(wrong, 0, "{wrong} checks went the wrong way");
        return;
    }
    if let Some(sync) = case.strip_prefix("engine_only").map(|rest| rest == "_sync") {
        let gate = Tollgate::new(InPlace);
        let policy = gcra_per_ip("1000000000/1h");
        let wrong = if sync {
            checks(&who, n, true, |who| {
                let now = gate.check_sync(&policy, who, 1);
                now.expect("answered at once").expect("a check")
            })
        } else {
            checks(&who, n, true, |who| {
                ready(gate.check(&policy, who, 1)).expect("a check")
            })
        };
        assert_eq!(wrong, 0, "checks went the wrong way");
        return;
    }
    if case == "log_steady" {
        return log_steady(&who, n, Algorithm::SlidingLog);
    }
    if case == "window_steady" {
        return log_steady(&who, n, Algorithm::SlidingWindow);
    }
    // 0: no overrides; 1: the limiter takes them, one set elsewhere; 2: every identity has one.
    let overrides = match case.as_str() {
        "gcra_overridable_admit" => 1,
        "gcra_overridden_admit" => 2,
        _ => 0,
    };
    // `<case>_sync`: the same checks through `Tollgate::check_sync`, without a future.
    let (case, sync) = match case.strip_suffix("_sync") {
        Some(case) => (case.to_owned(), true),
        None => (case, false),
    };
    let bans = case == "log_ban_admit";
    let case = if overrides > 0 {
        "gcra_admit"
    } else if bans {
        "log_admit"
    } else {
        case.as_str()
    };
    let (rules, admit, limiters): (Vec<Rule>, bool, usize) = match case {
        "gcra_admit" => (vec![rule("1000000000/1h", Algorithm::Gcra)], true, 1),
        "gcra_deny" => (vec![rule("1/1h", Algorithm::Gcra)], false, 1),
        "log_admit" => (
            ["1000000/1m", "999999/1h", "999998/1d"]
                .iter()
                .map(|t| rule(t, Algorithm::SlidingLog))
                .collect(),
            true,
            1,
        ),
        "log_deny" => (
            ["10/1m", "20/1h", "60/1d"]
                .iter()
                .map(|t| rule(t, Algorithm::SlidingLog))
                .collect(),
            false,
            1,
        ),
        "two_by_three_admit" => (
            ["1000000/1m", "999999/1h", "999998/1d"]
                .iter()
                .map(|t| rule(t, Algorithm::SlidingLog))
                .collect(),
            true,
            2,
        ),
        other => panic!("unknown case {other}"),
    };
    let mut limiter = Limiter::new(Dimension::Ip, rules.clone()).with_overrides(overrides > 0);
    if bans {
        limiter = limiter.with_blocklist(BanRule::new(std::time::Duration::from_secs(600)));
    }
    let mut policy = Policy::builder("probe").limiter(limiter);
    if limiters == 2 {
        policy = policy.limiter(Limiter::new(Dimension::UserId, rules));
    }
    let policy = policy.build().expect("a valid policy");
    let gate = Tollgate::new(MemoryStore::new());
    let raised = [rule("2000000000/1h", Algorithm::Gcra)];
    let elsewhere = Identity::new().with_ip(client_ip(KEYS + 1));
    let overridden: &[Identity] = match overrides {
        0 => &[],
        1 => std::slice::from_ref(&elsewhere),
        _ => &who,
    };
    for who in overridden {
        ready(gate.set_override(&policy, "ip", who, &raised, None)).expect("an override");
    }
    // Deny cases: use up every key first.
    if !admit {
        for who in &who {
            while ready(gate.check(&policy, who, 1))
                .expect("a check")
                .allowed()
            {}
        }
    }
    // Every key exists before the measured loop.
    if admit {
        for who in &who {
            ready(gate.check(&policy, who, 1)).expect("a check");
        }
    }
    let wrong = if sync {
        checks(&who, n, admit, |who| {
            let now = gate.check_sync(&policy, who, 1);
            now.expect("a memory store answers at once")
                .expect("a check")
        })
    } else {
        checks(&who, n, admit, |who| {
            ready(gate.check(&policy, who, 1)).expect("a check")
        })
    };
    assert_eq!(wrong, 0, "checks went the wrong way");
}

/// The memory bench's steady sliding log: 10/1m, 20/1h and 60/1d by IP, the clock 25 minutes
/// on each time the clients start over, so every check is admitted and each client's log holds
/// a full day of entries (57 or 58), the oldest leaving as the newest comes; or the same rules
/// counted by `algorithm`.
fn log_steady(who: &[Identity], n: u32, algorithm: Algorithm) {
    let rules: Vec<Rule> = ["10/1m", "20/1h", "60/1d"]
        .iter()
        .map(|t| rule(t, algorithm))
        .collect();
    let policy = Policy::builder("probe")
        .limiter(Limiter::new(Dimension::Ip, rules))
        .build()
        .expect("a valid policy");
    let step = std::time::Duration::from_secs(25 * 60);
    let clock = ManualClock::new(std::time::Duration::from_secs(1_700_000_000));
    let gate = Tollgate::new(MemoryStore::builder().clock(clock.clone()).build());
    // Two days of rounds first: the logs are full.
    for _ in 0..(2 * 86_400 / step.as_secs() + 1) {
        clock.advance(step);
        for who in who {
            assert!(
                ready(gate.check(&policy, who, 1))
                    .expect("a check")
                    .allowed()
            );
        }
    }
    let wrong = checks_steady(
        who,
        n,
        || clock.advance(step),
        |who| ready(gate.check(&policy, who, 1)).expect("a check"),
    );
    assert_eq!(wrong, 0, "checks went the wrong way");
}

/// [`checks`] of admissions, calling `each_round` whenever the identities start over.
#[inline(never)]
fn checks_steady(
    who: &[Identity],
    n: u32,
    each_round: impl Fn(),
    check: impl Fn(&Identity) -> Decision,
) -> u32 {
    let mut wrong = 0;
    for i in 0..n {
        if i % KEYS == 0 {
            each_round();
        }
        let decision = check(black_box(&who[(i % KEYS) as usize]));
        wrong += u32::from(!black_box(decision).allowed());
    }
    wrong
}

/// The measured loop: `n` checks over the identities in turn, each by `check`; how many went
/// the wrong way.
#[inline(never)]
fn checks(who: &[Identity], n: u32, admit: bool, check: impl Fn(&Identity) -> Decision) -> u32 {
    let mut wrong = 0;
    for i in 0..n {
        let who = &who[(i % KEYS) as usize];
        let decision = check(black_box(who));
        wrong += u32::from(black_box(decision).allowed() != admit);
    }
    wrong
}

/// governor's measured loop, as [`checks`].
#[inline(never)]
fn governor_checks(
    limiter: &governor::DefaultKeyedRateLimiter<IpAddr>,
    ips: &[IpAddr],
    n: u32,
    admit: bool,
) -> u32 {
    let mut wrong = 0;
    for i in 0..n {
        let ip = &ips[(i % KEYS) as usize];
        wrong += u32::from(black_box(limiter.check_key(ip)).is_ok() != admit);
    }
    wrong
}

/// Resident memory of this process in bytes.
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("a VmRSS line");
    kib * 1024
}

/// A policy of one GCRA rule per client IP.
fn gcra_per_ip(rule_text: &str) -> Policy {
    Policy::builder("probe")
        .limiter(Limiter::new(
            Dimension::Ip,
            [rule(rule_text, Algorithm::Gcra)],
        ))
        .build()
        .expect("a valid policy")
}

fn rss(keys: u32) {
    let policy = gcra_per_ip("10/1m");
    // Room to spare: shards fill unevenly, and this measures keys, not eviction.
    let gate = Tollgate::new(MemoryStore::builder().max_keys(2 * keys as usize).build());
    let before = resident();
    for i in 0..keys {
        let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        let who = Identity::new().with_ip(ip);
        assert!(
            ready(gate.check(&policy, &who, 1))
                .expect("a check")
                .allowed()
        );
    }
    let after = resident();
    assert_eq!(gate.store().len(), keys as usize);
    println!(
        "{keys} keys: {} MiB resident, {} bytes per key",
        (after - before) >> 20,
        (after - before) / u64::from(keys)
    );
}

/// `n` GCRA admissions on each of `threads` threads, each over its own [`KEYS`] clients, for
/// tollgate's memory store and governor in turn: checks a second across the threads.
fn throughput(threads: u32, n: u32) {
    let policy = gcra_per_ip("1000000000/1000s");
    let gate = Tollgate::new(MemoryStore::new());
    let who: Vec<Vec<Identity>> = (0..threads)
        .map(|t| {
            (0..KEYS)
                .map(|i| Identity::new().with_ip(client_ip(t * KEYS + i)))
                .collect()
        })
        .collect();
    let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000).expect("non-zero"))
        .allow_burst(NonZeroU32::new(1_000_000_000).expect("non-zero"));
    let limiter: governor::DefaultKeyedRateLimiter<IpAddr> = RateLimiter::keyed(quota);
    let side = |name: &str, check: &(dyn Fn(usize, usize) -> bool + Sync)| {
        let start = std::time::Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads as usize {
                s.spawn(move || {
                    for i in 0..n as usize {
                        assert!(check(t, i % KEYS as usize), "a check was denied");
                    }
                });
            }
        });
        let rate = f64::from(n) * f64::from(threads) / start.elapsed().as_secs_f64();
        println!("{name:9} {threads} threads: {:.2} M checks/s", rate / 1e6);
    };
    side("tollgate", &|t, i| {
        ready(gate.check(&policy, black_box(&who[t][i]), 1))
            .expect("a check")
            .allowed()
    });
    let ips: Vec<Vec<IpAddr>> = who
        .iter()
        .map(|w| w.iter().map(|w| w.ip().expect("an IP")).collect())
        .collect();
    side("governor", &|t, i| {
        limiter.check_key(black_box(&ips[t][i])).is_ok()
    });
}

/// A store that admits every check in place, at once, and keeps nothing (`engine_only`).
struct InPlace;

impl Store for InPlace {
    fn check(
        &self,
        _: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send {
        std::future::ready(Err(StoreError::new(
            StoreErrorKind::Protocol,
            "this store answers only in place",
        )))
    }

    fn check_limiter(
        &self,
        check: &LimiterCheck<'_>,
        outcomes: &mut [RuleOutcome],
    ) -> Option<LimiterAnswer> {
        for o in outcomes.iter_mut() {
            // Read from the check, so that nothing is decided at compile time.
            *o = RuleOutcome {
                allowed: true,
                remaining: check.key.len() as u64,
                reset_after_us: check.cost,
                retry_after_us: None,
            };
        }
        Some(LimiterAnswer::new(true, None))
    }

    fn reset(&self, _: &CheckRequest<'_>) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    fn bans_possible(&self) -> bool {
        false
    }

    fn text_keys(&self) -> bool {
        false
    }
}
