//! What every group of the memory bench shares: the keys, the policies, and the two ways a
//! single-threaded check is timed (governor's `check_key`, tollgate's `Tollgate::check`).

use std::{
    future::Future,
    hint::black_box,
    net::IpAddr,
    pin::pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate::{Algorithm, Dimension, Identity, Limiter, MemoryStore, Policy, Rule, Tollgate};
use tollgate_bench::{RULES, client_ip};

/// Distinct keys, taken in turn.
pub(crate) const KEYS: usize = 1000;

/// Polls a future that must be ready at once (the memory store's are).
pub(crate) fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("a memory-store check is ready at once"),
    }
}

/// `count` client IPs from the `first`th on.
pub(crate) fn ips_from(first: usize, count: usize) -> Vec<IpAddr> {
    (first..first + count)
        .map(|n| client_ip(n as u32))
        .collect()
}

pub(crate) fn ips() -> Vec<IpAddr> {
    ips_from(0, KEYS)
}

pub(crate) fn identities() -> Vec<Identity> {
    ips()
        .into_iter()
        .map(|ip| Identity::new().with_ip(ip))
        .collect()
}

/// One limiter per dimension, each with `rules`.
pub(crate) fn policy_by(dimensions: &[Dimension], rules: &[Rule]) -> Policy {
    dimensions
        .iter()
        .fold(Policy::builder("bench"), |b, d| {
            b.limiter(Limiter::new(d.clone(), rules.iter().cloned()))
        })
        .build()
        .expect("a valid policy")
}

/// One IP limiter with `rules`.
pub(crate) fn policy(rules: &[Rule]) -> Policy {
    policy_by(&[Dimension::Ip], rules)
}

pub(crate) fn rule(limit: u64, window: Duration, algorithm: Algorithm) -> Rule {
    Rule::new(limit, window)
        .expect("a valid rule")
        .with_algorithm(algorithm)
}

pub(crate) fn gcra(text: &str) -> Rule {
    text.parse::<Rule>()
        .expect("a valid rule")
        .with_algorithm(Algorithm::Gcra)
}

/// The sliding-log rules of issue 2's figures: 10/1m, 20/1h, 60/1d.
pub(crate) fn sliding_log_rules() -> Vec<Rule> {
    RULES
        .iter()
        .map(|r| r.parse().expect("a valid rule"))
        .collect()
}

/// governor's quota of `per_second` a second, with a burst of as many.
pub(crate) fn per_second(per_second: u32) -> Quota {
    Quota::per_second(per_second.try_into().expect("non-zero"))
}

/// governor's quota of `per_hour` an hour, with a burst of as many.
pub(crate) fn per_hour(per_hour: u32) -> Quota {
    Quota::per_hour(per_hour.try_into().expect("non-zero"))
}

pub(crate) fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    g
}

/// governor's keyed check over the 1000 IPs; `admit` says which answer every check must give.
pub(crate) fn bench_governor(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    quota: Quota,
    admit: bool,
) {
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

/// What a tollgate benchmark checks: `policy` on `gate` for each of `who` in turn.
pub(crate) struct Checks<'a> {
    pub(crate) gate: &'a Tollgate<MemoryStore>,
    pub(crate) policy: &'a Policy,
    pub(crate) who: &'a [Identity],
}

/// tollgate's check over `checks.who`, taken in turn; `admit` says which answer every check
/// must give. `prepare` runs once before the first measurement (to fill keys); `each_round`
/// runs whenever `who` starts over.
pub(crate) fn bench_tollgate(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    checks: Checks<'_>,
    admit: bool,
    prepare: impl FnOnce(&[Identity]),
    each_round: impl Fn(),
) {
    let Checks { gate, policy, who } = checks;
    let mut prepare = Some(prepare);
    let (mut i, mut wrong) = (0, 0u64);
    g.bench_function(name, |b| {
        // Prepared here rather than before, so that a filtered run skips it.
        if let Some(prepare) = prepare.take() {
            prepare(who);
        }
        b.iter(|| {
            i += 1;
            if i == who.len() {
                i = 0;
                each_round();
            }
            let d = ready(gate.check(black_box(policy), black_box(&who[i]), 1));
            let ok = d.expect("the identity has every dimension").allowed();
            wrong += u64::from(ok != admit);
        })
    });
    assert_eq!(wrong, 0, "{name}: {wrong} checks took the other path");
}

/// Checks every identity `times` times, each admitted.
pub(crate) fn fill<'a>(
    gate: &'a Tollgate<MemoryStore>,
    policy: &'a Policy,
    times: usize,
) -> impl FnOnce(&[Identity]) + 'a {
    move |who| {
        for identity in who {
            for _ in 0..times {
                let d = ready(gate.check(policy, identity, 1))
                    .expect("the identity has every dimension");
                assert!(d.allowed(), "filling admits");
            }
        }
    }
}

/// tollgate's check over the 1000 IPs governor is given, each identity built for its check
/// (what a user holding a client IP writes); `admit` says which answer every check must give.
pub(crate) fn bench_tollgate_by_ip(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    gate: &Tollgate<MemoryStore>,
    policy: &Policy,
    admit: bool,
) {
    let ips = ips();
    let (mut i, mut wrong, mut filled) = (0, 0u64, admit);
    g.bench_function(name, |b| {
        if !filled {
            filled = true;
            for ip in &ips {
                let who = Identity::new().with_ip(*ip);
                let d = ready(gate.check(policy, &who, 1)).expect("the identity has an IP");
                assert!(d.allowed(), "filling admits");
            }
        }
        b.iter(|| {
            i = (i + 1) % KEYS;
            let who = Identity::new().with_ip(*black_box(&ips[i]));
            let d = ready(gate.check(black_box(policy), &who, 1));
            let ok = d.expect("the identity has an IP").allowed();
            wrong += u64::from(ok != admit);
        })
    });
    assert_eq!(wrong, 0, "{name}: {wrong} checks took the other path");
}
