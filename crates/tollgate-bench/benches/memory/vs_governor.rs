//! tollgate's memory store against governor's keyed limiter with one quota, single-threaded:
//! 1-rule GCRA (admit, deny), 3 sliding-log rules (admit, deny) and 2 limiters x 3 rules.

use std::time::Duration;

use criterion::Criterion;
use tollgate::{Algorithm, Dimension, Identity, ManualClock, MemoryStore, Rule, Tollgate};
use tollgate_bench::client_ip;

use crate::support::{
    Checks, KEYS, bench_governor, bench_tollgate, bench_tollgate_by_ip, fill, gcra, group,
    identities, per_hour, per_second, policy, policy_by, sliding_log_rules,
};

/// One GCRA rule. Admit: 1000000/1s, far above the rate any key sees. Deny: 1/1h, each key
/// used once before measuring.
pub(crate) fn gcra_one_rule(c: &mut Criterion) {
    let who = identities();
    for admit in [true, false] {
        let (path, rule, quota) = if admit {
            ("admit", "1000000/1s", per_second(1_000_000))
        } else {
            ("deny", "1/1h", per_hour(1))
        };
        let mut g = group(c, &format!("gcra_1rule/{path}"));
        bench_governor(&mut g, "governor", quota, admit);
        let p = policy(&[gcra(rule)]);
        for (name, blocklist) in [("tollgate", true), ("tollgate_no_blocklist", false)] {
            let gate = Tollgate::new(MemoryStore::new()).with_blocklist(blocklist);
            let times = usize::from(!admit);
            let prepare = fill(&gate, &p, times);
            let checks = Checks {
                gate: &gate,
                policy: &p,
                who: &who,
            };
            bench_tollgate(&mut g, name, checks, admit, prepare, || {});
        }
        let gate = Tollgate::new(MemoryStore::new());
        bench_tollgate_by_ip(&mut g, "tollgate_identity_per_check", &gate, &p, admit);
        g.finish();
    }
}

/// Sliding log, 10/1m + 20/1h + 60/1d on each limiter, against governor's one quota.
///
/// Admit (steady state): a manual clock moves 25 minutes each time the 1000 keys start over, so
/// each key is admitted every time and its log holds a full day of entries (57 or 58).
/// Admit (short log): the clock moves a day and a minute per round, so each log holds one live
/// entry. Deny: the system clock; every key is first filled to 10, so the 10/1m rule denies
/// (the measurement ends well within the minute).
pub(crate) fn sliding_log(c: &mut Criterion) {
    let rules = sliding_log_rules();
    let ip = identities();
    let ip_and_user: Vec<Identity> = (0..KEYS as u32)
        .map(|n| {
            Identity::new()
                .with_ip(client_ip(n))
                .with_user_id(format!("user-{n}"))
        })
        .collect();
    let cases = [
        ("sliding_log_3rules", vec![Dimension::Ip], &ip),
        (
            "limiters_2x3",
            vec![Dimension::Ip, Dimension::UserId],
            &ip_and_user,
        ),
    ];
    for (name, dimensions, who) in cases {
        let p = policy_by(&dimensions, &rules);

        let mut g = group(c, &format!("{name}/admit"));
        bench_governor(&mut g, "governor_1quota", per_second(1_000_000), true);
        for (bench, step) in [
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
            let each_round = || clock.advance(step);
            let checks = Checks {
                gate: &gate,
                policy: &p,
                who,
            };
            bench_tollgate(&mut g, bench, checks, true, prepare, each_round);
        }
        // The same rules counted by sliding windows: two integers per rule, not a log.
        let windows: Vec<Rule> = rules
            .iter()
            .map(|r| r.with_algorithm(Algorithm::SlidingWindow))
            .collect();
        let pw = policy_by(&dimensions, &windows);
        let step = Duration::from_secs(25 * 60);
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let gate = Tollgate::new(MemoryStore::builder().clock(clock.clone()).build());
        let prepare = |who: &[Identity]| {
            for _ in 0..(2 * 86_400 / step.as_secs() + 1) {
                clock.advance(step);
                fill(&gate, &pw, 1)(who);
            }
        };
        let checks = Checks {
            gate: &gate,
            policy: &pw,
            who,
        };
        bench_tollgate(
            &mut g,
            "tollgate_sliding_window",
            checks,
            true,
            prepare,
            || {
                clock.advance(step);
            },
        );
        g.finish();

        let mut g = group(c, &format!("{name}/deny"));
        bench_governor(&mut g, "governor_1quota", per_hour(1), false);
        let gate = Tollgate::new(MemoryStore::new());
        let prepare = fill(&gate, &p, 10);
        let checks = Checks {
            gate: &gate,
            policy: &p,
            who,
        };
        bench_tollgate(&mut g, "tollgate", checks, false, prepare, || {});
        g.finish();
    }
}
