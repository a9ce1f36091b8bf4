//! `MemoryStore` against a tiny reference model, on random policies and random request
//! sequences.
//!
//! The model is written to be obviously right rather than fast: a sliding log keeps every
//! admitted instant forever and counts the live ones on each request, and finds `retry_after` by
//! trying each instant an entry leaves; a fixed window keeps a counter per window start; GCRA
//! keeps one theoretical arrival time. It applies all-or-nothing across every rule of every
//! limiter. At every step the engine's decision (allowed, reason, `retry_after`, and per rule
//! allowed, remaining and `reset_after`) must equal the model's.

use std::{collections::HashMap, time::Duration};

use proptest::prelude::*;
use tollgate::{
    Algorithm, Decision, Dimension, Identity, Limiter, ManualClock, MemoryStore, Policy, Reason,
    Rule, Tollgate,
};

/// 2100-01-01T00:00:00Z: far from zero, so no window reaches back before the epoch.
const START_US: u64 = 4_102_444_800_000_000;
const MS: u64 = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RuleSpec {
    limit: u64,
    window_us: u64,
    algorithm: Algorithm,
}

#[derive(Clone, Debug)]
struct LimiterSpec {
    /// Counts per user id; otherwise one counter for everybody (`global`).
    per_user: bool,
    rules: Vec<RuleSpec>,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Check,
    Peek,
    Reset,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    advance_ms: u64,
    cost: u64,
    kind: Kind,
    who: usize,
}

/// What the engine should answer: allowed, reason, retry_after (µs), and per rule
/// (allowed, remaining, reset_after µs).
type Expected = (bool, Reason, Option<u64>, Vec<(bool, u64, u64)>);

/// One rule's answer: (allowed, remaining, reset_after µs, retry_after µs).
type Outcome = (bool, u64, u64, Option<u64>);

#[derive(Default)]
struct Model {
    /// Every admitted instant per (limiter, dimension value), shared by its sliding-log rules.
    logs: HashMap<(usize, String), Vec<u64>>,
    /// Units per (limiter, value, rule, window start).
    windows: HashMap<(usize, String, usize, u64), u64>,
    /// Theoretical arrival time per (limiter, value, rule).
    tats: HashMap<(usize, String, usize), u64>,
}

impl Model {
    fn sliding(&self, key: &(usize, String), now: u64, r: &RuleSpec, cost: u64) -> Outcome {
        let live: Vec<u64> = self
            .logs
            .get(key)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&t| t + r.window_us > now)
            .collect();
        let count = live.len() as u64;
        let leaves = |t: u64| t + r.window_us - now;
        let last_leaves = live.iter().map(|&t| leaves(t)).max().unwrap_or(0);
        if count + cost <= r.limit {
            let reset = if cost > 0 { r.window_us } else { last_leaves };
            return (true, r.limit - count - cost, reset, None);
        }
        // Try every instant an entry leaves; the first where the request fits is the answer.
        let retry = live.iter().map(|&t| leaves(t)).filter(|&wait| {
            let still = live
                .iter()
                .filter(|&&u| u + r.window_us > now + wait)
                .count() as u64;
            still + cost <= r.limit
        });
        (
            false,
            r.limit.saturating_sub(count),
            last_leaves,
            retry.min(),
        )
    }

    fn fixed(&self, key: (usize, String, usize), now: u64, r: &RuleSpec, cost: u64) -> Outcome {
        let start = now - now % r.window_us;
        let count = self
            .windows
            .get(&(key.0, key.1, key.2, start))
            .copied()
            .unwrap_or(0);
        let ends = start + r.window_us - now;
        if count + cost <= r.limit {
            let reset = if count + cost == 0 { 0 } else { ends };
            (true, r.limit - count - cost, reset, None)
        } else {
            (false, r.limit - count, ends, Some(ends))
        }
    }

    fn gcra(&self, key: &(usize, String, usize), now: u64, r: &RuleSpec, cost: u64) -> Outcome {
        let interval = (r.window_us / r.limit).max(1);
        let burst = interval * r.limit;
        let base = self.tats.get(key).map_or(now, |&t| t.max(now));
        let after = base + cost * interval;
        if after <= now + burst {
            (true, (now + burst - after) / interval, after - now, None)
        } else {
            let remaining = (now + burst).saturating_sub(base) / interval;
            (false, remaining, base - now, Some(after - burst - now))
        }
    }

    fn outcome(
        &self,
        l: usize,
        value: &str,
        i: usize,
        r: &RuleSpec,
        now: u64,
        cost: u64,
    ) -> Outcome {
        match r.algorithm {
            Algorithm::SlidingLog => self.sliding(&(l, value.to_owned()), now, r, cost),
            Algorithm::FixedWindow => self.fixed((l, value.to_owned(), i), now, r, cost),
            _ => self.gcra(&(l, value.to_owned(), i), now, r, cost),
        }
    }

    fn decide(
        &mut self,
        limiters: &[LimiterSpec],
        values: &[String],
        now: u64,
        cost: u64,
        consume: bool,
    ) -> Expected {
        let all = || limiters.iter().flat_map(|l| &l.rules);
        if all().any(|r| cost > r.limit) {
            let rules = all()
                .filter(|r| cost > r.limit)
                .map(|_| (false, 0, 0))
                .collect();
            return (false, Reason::CostExceedsLimit, None, rules);
        }
        let mut outcomes = Vec::new();
        for (l, limiter) in limiters.iter().enumerate() {
            for (i, r) in limiter.rules.iter().enumerate() {
                outcomes.push((l, i, *r, self.outcome(l, &values[l], i, r, now, cost)));
            }
        }
        let allowed = outcomes.iter().all(|o| o.3.0);
        if !allowed {
            // Nothing is recorded, so the rules that would admit report things as they stay.
            let retry = outcomes.iter().filter_map(|o| o.3.3).max();
            let rules = outcomes
                .iter()
                .map(|&(l, i, r, o)| {
                    let o = if o.0 {
                        self.outcome(l, &values[l], i, &r, now, 0)
                    } else {
                        o
                    };
                    (o.0, o.1, o.2)
                })
                .collect();
            return (false, Reason::RateLimited, retry, rules);
        }
        if consume {
            for (l, limiter) in limiters.iter().enumerate() {
                let value = values[l].clone();
                if limiter
                    .rules
                    .iter()
                    .any(|r| r.algorithm == Algorithm::SlidingLog)
                {
                    let log = self.logs.entry((l, value.clone())).or_default();
                    log.extend(std::iter::repeat_n(now, cost as usize));
                }
                for (i, r) in limiter.rules.iter().enumerate() {
                    match r.algorithm {
                        Algorithm::SlidingLog => {}
                        Algorithm::FixedWindow => {
                            let start = now - now % r.window_us;
                            *self
                                .windows
                                .entry((l, value.clone(), i, start))
                                .or_default() += cost;
                        }
                        _ => {
                            let interval = (r.window_us / r.limit).max(1);
                            let tat = self.tats.entry((l, value.clone(), i)).or_insert(now);
                            *tat = (*tat).max(now) + cost * interval;
                        }
                    }
                }
            }
        }
        let rules = outcomes.iter().map(|o| (o.3.0, o.3.1, o.3.2)).collect();
        (true, Reason::Ok, None, rules)
    }

    fn reset(&mut self, values: &[String]) {
        self.logs.retain(|(l, v), _| values[*l] != *v);
        self.windows.retain(|(l, v, _, _), _| values[*l] != *v);
        self.tats.retain(|(l, v, _), _| values[*l] != *v);
    }
}

fn observed(d: &Decision, policy: &Policy) -> Expected {
    (
        d.allowed(),
        d.reason(),
        d.retry_after().map(|r| r.as_micros() as u64),
        d.rules(policy)
            .iter()
            .map(|r| (r.allowed, r.remaining, r.reset_after.as_micros() as u64))
            .collect(),
    )
}

fn rule_spec() -> impl Strategy<Value = RuleSpec> {
    let window_ms = prop_oneof![(1..=5u64).prop_map(|s| s * 1000), 1000..=5000u64];
    let algorithm = prop_oneof![
        Just(Algorithm::SlidingLog),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::Gcra),
    ];
    (1..=6u64, window_ms, algorithm).prop_map(|(limit, window_ms, algorithm)| RuleSpec {
        limit,
        window_us: window_ms * MS,
        algorithm,
    })
}

fn limiter_spec() -> impl Strategy<Value = LimiterSpec> {
    (any::<bool>(), prop::collection::vec(rule_spec(), 1..=3)).prop_map(|(per_user, rules)| {
        // A policy may not list one rule twice.
        let mut unique: Vec<RuleSpec> = Vec::new();
        for r in rules {
            if !unique.contains(&r) {
                unique.push(r);
            }
        }
        LimiterSpec {
            per_user,
            rules: unique,
        }
    })
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![6 => Just(Kind::Check), 3 => Just(Kind::Peek), 1 => Just(Kind::Reset)];
    (0..=3000u64, 0..=3u64, kind, 0..2usize).prop_map(|(advance_ms, cost, kind, who)| Op {
        advance_ms,
        cost,
        kind,
        who,
    })
}

fn build_policy(limiters: &[LimiterSpec]) -> Policy {
    let mut builder = Policy::builder("model");
    for (i, l) in limiters.iter().enumerate() {
        let dimension = if l.per_user {
            Dimension::UserId
        } else {
            Dimension::Global
        };
        let rules = l.rules.iter().map(|r| {
            Rule::new(r.limit, Duration::from_micros(r.window_us))
                .expect("generated rules are valid")
                .with_algorithm(r.algorithm)
        });
        builder = builder.limiter(Limiter::new(dimension, rules).with_name(format!("l{i}")));
    }
    builder.build().expect("generated policies are valid")
}

fn run(limiters: &[LimiterSpec], ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(Duration::from_micros(START_US));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .purge_interval(None)
        .build();
    let gate = Tollgate::new(store);
    let policy = build_policy(limiters);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let mut model = Model::default();
    let mut now = START_US;
    for (step, op) in ops.iter().enumerate() {
        now += op.advance_ms * MS;
        clock.set(Duration::from_micros(now));
        let user = format!("u{}", op.who);
        let who = Identity::new().with_user_id(user.clone());
        let values: Vec<String> = limiters
            .iter()
            .map(|l| {
                if l.per_user {
                    user.clone()
                } else {
                    String::new()
                }
            })
            .collect();
        match op.kind {
            Kind::Reset => {
                runtime
                    .block_on(gate.reset(&policy, &who))
                    .expect("the identity carries every dimension");
                model.reset(&values);
            }
            Kind::Check | Kind::Peek => {
                let consume = matches!(op.kind, Kind::Check);
                let decision = runtime
                    .block_on(async {
                        if consume {
                            gate.check(&policy, &who, op.cost).await
                        } else {
                            gate.peek(&policy, &who, op.cost).await
                        }
                    })
                    .expect("the identity carries every dimension");
                let want = model.decide(limiters, &values, now, op.cost, consume);
                prop_assert_eq!(
                    observed(&decision, &policy),
                    want,
                    "step {} ({:?}) at +{} ms",
                    step,
                    op,
                    (now - START_US) / MS
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn memory_store_matches_the_model(
        limiters in prop::collection::vec(limiter_spec(), 1..=2),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run(&limiters, &ops)?;
    }
}

/// The model itself must be able to tell a wrong store: a few hand-checked answers.
#[test]
fn the_model_knows_its_numbers() {
    let log = RuleSpec {
        limit: 2,
        window_us: 10_000 * MS,
        algorithm: Algorithm::SlidingLog,
    };
    let mut model = Model::default();
    let limiters = [LimiterSpec {
        per_user: false,
        rules: vec![log],
    }];
    let values = [String::new()];
    let at = |ms: u64| START_US + ms * MS;
    assert!(model.decide(&limiters, &values, at(0), 1, true).0);
    assert!(model.decide(&limiters, &values, at(3000), 1, true).0);
    let denied = model.decide(&limiters, &values, at(4000), 2, true);
    assert_eq!(
        denied,
        (
            false,
            Reason::RateLimited,
            Some(9000 * MS),
            vec![(false, 0, 9000 * MS)]
        )
    );
    let gcra = RuleSpec {
        limit: 3,
        window_us: 3000 * MS,
        algorithm: Algorithm::Gcra,
    };
    let limiters = [LimiterSpec {
        per_user: false,
        rules: vec![gcra],
    }];
    let mut model = Model::default();
    for remaining in [2, 1, 0] {
        let d = model.decide(&limiters, &values, at(0), 1, true);
        assert_eq!(d.3[0].1, remaining);
    }
    let denied = model.decide(&limiters, &values, at(250), 1, true);
    assert_eq!(denied.2, Some(750 * MS));
}
