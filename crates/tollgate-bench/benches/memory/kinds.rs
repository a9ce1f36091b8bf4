//! The limit kinds beside the rate rules, each beside the plain check it extends
//! (`limit_kinds/*`, all admitting, 1000 client IPs in turn): a calendar window beside an
//! epoch-aligned fixed window, a shadow limiter (admitting, and denying) beside one enforced
//! GCRA rule, a concurrency lease taken and released, and a check refunded by its receipt.

use std::{hint::black_box, time::Duration};

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Rule, Tollgate};

use crate::support::{Checks, bench_tollgate, fill, gcra, group, identities, policy, ready};

fn fixed(text: &str) -> Rule {
    text.parse::<Rule>()
        .expect("a valid rule")
        .with_algorithm(tollgate::Algorithm::FixedWindow)
}

/// Times `each` (a check and what follows it) over the identities in turn; fails if a check
/// is refused.
fn bench_each(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    who: &[Identity],
    each: impl Fn(&Identity) -> bool,
) {
    let (mut i, mut wrong) = (0, 0u64);
    g.bench_function(name, |b| {
        b.iter(|| {
            i = (i + 1) % who.len();
            wrong += u64::from(!each(black_box(&who[i])));
        })
    });
    assert_eq!(wrong, 0, "{name}: {wrong} checks were refused");
}

pub(crate) fn limit_kinds(c: &mut Criterion) {
    let who = identities();
    let mut g = group(c, "limit_kinds/admit");
    let plain = |g: &mut BenchmarkGroup<'_, WallTime>, name: &str, p: &Policy| {
        let gate = Tollgate::new(MemoryStore::new());
        let checks = Checks {
            gate: &gate,
            policy: p,
            who: &who,
        };
        bench_tollgate(g, name, checks, true, |_| {}, || {});
    };
    plain(
        &mut g,
        "fixed_window_1rule",
        &policy(&[fixed("100000000/1d")]),
    );
    plain(
        &mut g,
        "calendar_day_1rule",
        &policy(&["100000000/1d@Europe/Berlin".parse().expect("a valid rule")]),
    );
    plain(&mut g, "gcra_1rule", &policy(&[gcra("1000000/1s")]));

    let shadowed = |trial: Rule| {
        Policy::builder("kinds_shadow")
            .limiter(Limiter::new(Dimension::Ip, [gcra("1000000/1s")]))
            .limiter(
                Limiter::new(Dimension::Ip, [trial])
                    .with_name("trial")
                    .with_shadow(true),
            )
            .build()
            .expect("a valid policy")
    };
    plain(
        &mut g,
        "gcra_1rule_plus_shadow",
        &shadowed(gcra("1000000/1s")),
    );
    // The shadow limiter denies every check (each key used once first): it is settled, not
    // recorded.
    let denying = shadowed(gcra("1/1h"));
    let gate = Tollgate::new(MemoryStore::new());
    fill(&gate, &denying, 1)(&who);
    let checks = Checks {
        gate: &gate,
        policy: &denying,
        who: &who,
    };
    bench_tollgate(
        &mut g,
        "gcra_1rule_plus_shadow_denying",
        checks,
        true,
        |_| {},
        || {},
    );

    // A lease taken and given back: the check, then its release.
    let leases = Policy::builder("kinds_leases")
        .limiter(
            Limiter::concurrent(Dimension::Ip, 1, Duration::from_secs(60)).expect("a valid limit"),
        )
        .build()
        .expect("a valid policy");
    let gate = Tollgate::new(MemoryStore::new());
    bench_each(&mut g, "concurrent_acquire_release", &who, |identity| {
        let d = ready(gate.check(&leases, identity, 1)).expect("a check");
        let Some(receipt) = d.receipt() else {
            return false;
        };
        ready(gate.release_concurrent(&leases, identity, &receipt)).expect("a release");
        true
    });

    // A check and its refund: one GCRA rule, given back by the receipt.
    let p = policy(&[gcra("1000/1h")]);
    let gate = Tollgate::new(MemoryStore::new());
    bench_each(&mut g, "gcra_1rule_check_refund", &who, |identity| {
        let d = ready(gate.check(&p, identity, 1)).expect("a check");
        ready(gate.refund(&p, identity, 1, d.receipt().as_ref())).expect("a refund");
        d.allowed()
    });
    g.finish();
}
