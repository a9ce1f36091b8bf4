//! tollgate's fixed-window rules against limitador's in-memory limits (fixed windows too): one
//! limit, and three limits on one namespace, all per client IP, admitted every time.
//!
//! limitador is called as its own benchmarks call it: `check_rate_limited_and_update` with a
//! namespace and a `Context` built once per key (its variables are the request's values).

use std::{collections::HashMap, hint::black_box, time::Duration};

use criterion::Criterion;
use limitador::{
    RateLimiter,
    limit::{Context, Expression, Limit, Namespace, Predicate},
};
use tollgate::{Algorithm, MemoryStore, Tollgate};

use crate::support::{Checks, KEYS, bench_tollgate, group, identities, ips, policy, rule};

/// (limit, window) of each case, far above what a key sees while measured: 1 minute; and
/// 1 minute, 1 hour, 1 day.
const CASES: [(&str, &[(u64, u64)]); 2] = [
    ("fixed_window_1rule/admit", &[(1_000_000, 60)]),
    (
        "fixed_window_3rules/admit",
        &[(1_000_000, 60), (10_000_000, 3_600), (100_000_000, 86_400)],
    ),
];

pub(crate) fn fixed_windows(c: &mut Criterion) {
    let who = identities();
    for (name, limits) in CASES {
        let mut g = group(c, name);
        bench_limitador(&mut g, limits);
        let rules: Vec<_> = limits
            .iter()
            .map(|&(limit, secs)| rule(limit, Duration::from_secs(secs), Algorithm::FixedWindow))
            .collect();
        let p = policy(&rules);
        let gate = Tollgate::new(MemoryStore::new());
        let checks = Checks {
            gate: &gate,
            policy: &p,
            who: &who,
        };
        bench_tollgate(&mut g, "tollgate", checks, true, |_| {}, || {});
        g.finish();
    }
}

fn bench_limitador(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    limits: &[(u64, u64)],
) {
    // Room for every counter of every key.
    let limiter = RateLimiter::new(4 * (KEYS * limits.len()) as u64);
    for &(max, seconds) in limits {
        let ip: Expression = "ip".try_into().expect("a valid variable");
        limiter.add_limit(Limit::new(
            "bench",
            max,
            seconds,
            Vec::<Predicate>::new(),
            [ip],
        ));
    }
    let namespace = Namespace::from("bench");
    let contexts: Vec<Context<'static>> = ips()
        .into_iter()
        .map(|ip| HashMap::from([("ip".to_owned(), ip.to_string())]).into())
        .collect();
    let (mut i, mut wrong) = (0, 0u64);
    g.bench_function("limitador", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let result = limiter
                .check_rate_limited_and_update(&namespace, black_box(&contexts[i]), 1)
                .expect("the in-memory storage does not fail");
            wrong += u64::from(result.limited);
        })
    });
    assert_eq!(wrong, 0, "limitador: {wrong} checks were limited");
}
