//! The memory store against governor's keyed rate limiter, side by side in one criterion group
//! per case, each over the same 1000 client IPs taken in turn.
//!
//! tollgate is called as a user calls it: `Tollgate::check(&policy, &identity, 1)`. The memory
//! store's future is ready at once, so it is polled once with a no-op waker (what
//! `futures::FutureExt::now_or_never` does) instead of going through a runtime. governor is
//! called as its users call it: `check_key(&ip)` on a `DefaultKeyedRateLimiter<IpAddr>`.
//!
//! Every benchmark counts the decisions that went the unintended way (an admission in a deny
//! benchmark or the reverse) and fails if there is one, so each figure measures the path its
//! name says.

use std::{
    future::Future,
    hint::black_box,
    net::IpAddr,
    num::NonZeroU32,
    path::PathBuf,
    pin::pin,
    process::Command,
    task::{Context, Poll, Waker},
    time::{Duration, SystemTime},
};

use criterion::{BenchmarkGroup, Criterion, criterion_group, measurement::WallTime};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate::{
    Algorithm, Dimension, Identity, Limiter, ManualClock, MemoryStore, Policy, Rule, Tollgate,
};
use tollgate_bench::{RULES, client_ip};

/// Distinct keys, taken in turn.
const KEYS: usize = 1000;

/// Polls a future that must be ready at once (the memory store's are).
fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("a memory-store check is ready at once"),
    }
}

fn ips() -> Vec<IpAddr> {
    (0..KEYS as u32).map(client_ip).collect()
}

fn identities() -> Vec<Identity> {
    ips()
        .into_iter()
        .map(|ip| Identity::new().with_ip(ip))
        .collect()
}

fn policy(rules: impl IntoIterator<Item = Rule>) -> Policy {
    Policy::builder("bench")
        .limiter(Limiter::new(Dimension::Ip, rules))
        .build()
        .expect("a valid policy")
}

fn gcra(text: &str) -> Rule {
    text.parse::<Rule>()
        .expect("a valid rule")
        .with_algorithm(Algorithm::Gcra)
}

fn sliding_log_rules() -> Vec<Rule> {
    RULES
        .iter()
        .map(|r| r.parse().expect("a valid rule"))
        .collect()
}

fn quota(per_hour: u32, per_second: bool) -> Quota {
    let n = NonZeroU32::new(per_hour).expect("non-zero");
    if per_second {
        Quota::per_second(n)
    } else {
        Quota::per_hour(n)
    }
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g
}

/// governor's keyed check over the 1000 IPs; `admit` says which answer every check must give.
fn bench_governor(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, quota: Quota, admit: bool) {
    let ips = ips();
    let limiter: DefaultKeyedRateLimiter<IpAddr> = RateLimiter::keyed(quota);
    let (mut i, mut wrong, mut filled) = (0, 0u64, admit);
    g.bench_function(name, |b| {
        // Filled here rather than before, so that a filtered run skips it.
        if !filled {
            filled = true;
            for ip in &ips {
                assert!(limiter.check_key(ip).is_ok());
            }
        }
        b.iter(|| {
            i = (i + 1) % KEYS;
            let ok = limiter.check_key(black_box(&ips[i])).is_ok();
            wrong += u64::from(ok != admit);
        })
    });
    assert_eq!(wrong, 0, "{name}: {wrong} checks took the other path");
}

/// tollgate's check over the 1000 identities. `prepare` runs once before the first
/// measurement (to fill keys); `each_round` runs whenever the 1000 identities start over.
fn bench_tollgate(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    gate: &Tollgate<MemoryStore>,
    policy: &Policy,
    admit: bool,
    prepare: impl FnOnce(&[Identity]),
    each_round: impl Fn(),
) {
    let who = identities();
    let mut prepare = Some(prepare);
    let (mut i, mut wrong) = (0, 0u64);
    g.bench_function(name, |b| {
        // Prepared here rather than before, so that a filtered run skips it.
        if let Some(prepare) = prepare.take() {
            prepare(&who);
        }
        b.iter(|| {
            i += 1;
            if i == KEYS {
                i = 0;
                each_round();
            }
            let d = ready(gate.check(black_box(policy), black_box(&who[i]), 1));
            let ok = d.expect("the identity has an IP").allowed();
            wrong += u64::from(ok != admit);
        })
    });
    assert_eq!(wrong, 0, "{name}: {wrong} checks took the other path");
}

/// Checks every identity `times` times, each admitted.
fn fill<'a>(
    gate: &'a Tollgate<MemoryStore>,
    policy: &'a Policy,
    times: usize,
) -> impl FnOnce(&[Identity]) + 'a {
    move |who| {
        for identity in who {
            for _ in 0..times {
                let d = ready(gate.check(policy, identity, 1)).expect("the identity has an IP");
                assert!(d.allowed(), "filling admits");
            }
        }
    }
}

/// One GCRA rule. Admit: 1000000/1s, far above the rate any key sees. Deny: 1/1h, each key
/// used once before measuring.
fn gcra_one_rule(c: &mut Criterion) {
    for (admit, rule, per_hour, per_second) in [
        (true, "1000000/1s", 1_000_000, true),
        (false, "1/1h", 1, false),
    ] {
        let path = if admit { "admit" } else { "deny" };
        let times = usize::from(!admit);
        let mut g = group(c, &format!("gcra_1_rule_{path}"));
        bench_governor(&mut g, "governor", quota(per_hour, per_second), admit);
        let p = policy([gcra(rule)]);
        for (name, blocklist) in [("tollgate", true), ("tollgate_no_blocklist", false)] {
            let gate = Tollgate::new(MemoryStore::new()).with_blocklist(blocklist);
            bench_tollgate(
                &mut g,
                name,
                &gate,
                &p,
                admit,
                fill(&gate, &p, times),
                || {},
            );
        }
        g.finish();
    }
}

/// Sliding log, 10/1m + 20/1h + 60/1d on one IP limiter, against governor's one rule.
///
/// Admit (steady state): a manual clock moves 25 minutes each time the 1000 keys start over, so
/// each key is admitted every time and its log holds a full day of entries (57 or 58).
/// Admit (short log): the clock moves a day and a minute per round, so each log holds one live
/// entry. Deny: the system clock; every key is first filled to 10, so the 10/1m rule denies
/// (the measurement ends well within the minute).
fn sliding_log_three_rules(c: &mut Criterion) {
    let p = policy(sliding_log_rules());

    let mut g = group(c, "sliding_log_3_rules_admit");
    bench_governor(&mut g, "governor_1_rule", quota(1_000_000, true), true);
    for (name, step) in [
        ("tollgate", Duration::from_secs(25 * 60)),
        ("tollgate_short_log", Duration::from_secs(86_400 + 60)),
    ] {
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let gate = Tollgate::new(store);
        // Two days of rounds first, so the steady state has its full day of entries.
        let prepare = |who: &[Identity]| {
            for _ in 0..(2 * 86_400 / step.as_secs() + 1) {
                clock.advance(step);
                fill(&gate, &p, 1)(who);
            }
        };
        bench_tollgate(&mut g, name, &gate, &p, true, prepare, || {
            clock.advance(step)
        });
    }
    g.finish();

    let mut g = group(c, "sliding_log_3_rules_deny");
    bench_governor(&mut g, "governor_1_rule", quota(1, false), false);
    let gate = Tollgate::new(MemoryStore::new());
    bench_tollgate(
        &mut g,
        "tollgate",
        &gate,
        &p,
        false,
        fill(&gate, &p, 10),
        || {},
    );
    g.finish();
}

fn config() -> Criterion {
    // The HTML plots take longer than the measurements on a small machine.
    Criterion::default().without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = gcra_one_rule, sliding_log_three_rules
}
/// What `criterion_main!` does, then the ratios the targets are stated in.
fn main() {
    let started = SystemTime::now();
    benches();
    Criterion::default().configure_from_args().final_summary();
    print_ratios(started);
}

/// The target each tollgate benchmark is held to: its time over governor's in the same group.
const TARGETS: [(&str, &str, &str, Option<f64>); 7] = [
    ("gcra_1_rule_admit", "tollgate", "governor", Some(1.5)),
    (
        "gcra_1_rule_admit",
        "tollgate_no_blocklist",
        "governor",
        None,
    ),
    ("gcra_1_rule_deny", "tollgate", "governor", Some(1.5)),
    (
        "gcra_1_rule_deny",
        "tollgate_no_blocklist",
        "governor",
        None,
    ),
    (
        "sliding_log_3_rules_admit",
        "tollgate",
        "governor_1_rule",
        Some(4.0),
    ),
    (
        "sliding_log_3_rules_admit",
        "tollgate_short_log",
        "governor_1_rule",
        None,
    ),
    (
        "sliding_log_3_rules_deny",
        "tollgate",
        "governor_1_rule",
        Some(4.0),
    ),
];

/// Prints a table of tollgate's time over governor's, from the estimates criterion wrote in
/// this run (benchmarks a filter skipped are left out).
fn print_ratios(started: SystemTime) {
    let dir = criterion_dir();
    let estimate = |group: &str, bench: &str| -> Option<f64> {
        let path = dir
            .join(group)
            .join(bench)
            .join("new")
            .join("estimates.json");
        let fresh = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= started);
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        // The figure criterion prints: the slope of time over iterations, else the mean.
        let ns = json["slope"]["point_estimate"]
            .as_f64()
            .or_else(|| json["mean"]["point_estimate"].as_f64())?;
        fresh.then_some(ns)
    };
    println!("\n| group | tollgate | governor | ratio | target | |\n|---|---|---|---|---|---|");
    for (group, ours, theirs, target) in TARGETS {
        let (Some(a), Some(b)) = (estimate(group, ours), estimate(group, theirs)) else {
            continue;
        };
        let ratio = a / b;
        let (target, verdict) = match target {
            Some(t) => (format!("<= {t}x"), if ratio <= t { "pass" } else { "MISS" }),
            None => ("(for comparison)".to_owned(), ""),
        };
        println!(
            "| {group} | {ours} {a:.0} ns | {theirs} {b:.0} ns | {ratio:.1}x | {target} | {verdict} |"
        );
    }
}

/// Where criterion writes its estimates: the same rule criterion follows.
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    let metadata = std::env::var_os("CARGO").and_then(|cargo| {
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .output()
            .ok()?;
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(PathBuf::from(json["target_directory"].as_str()?))
    });
    metadata.map_or_else(
        || PathBuf::from("target/criterion"),
        |t| t.join("criterion"),
    )
}
