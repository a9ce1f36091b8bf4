//! The script mirrors `tollgate::algorithm` and the memory store's bans: random sequences of
//! checks, peeks, resets and clock moves give the same verdicts, step by step, on Redis and on
//! the memory store.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use proptest::{prelude::*, test_runner::TestRunner};
use tollgate::{Algorithm, BanRule, BanTarget, ManualClock, MemoryStore, Rule, ban_index_key};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::support::{CheckPlan, PlanBan, PlanExt, limiter};

#[derive(Clone, Debug)]
enum Step {
    /// Move the clock forward by this many µs, then check (`consume`) or peek `cost` units.
    Check {
        advance_us: u64,
        cost: u64,
        consume: bool,
    },
    /// Forget everything.
    Reset,
}

#[derive(Clone, Debug)]
struct Scenario {
    /// Offset of the first step from a whole day, so fixed windows start anywhere.
    start_us: u64,
    limiters: [Vec<Rule>; 2],
    /// What each limiter does to offenders.
    bans: [Option<BanRule>; 2],
    steps: Vec<Step>,
}

fn ban_strategy() -> impl Strategy<Value = Option<BanRule>> {
    let ms = || prop::sample::select(vec![0u64, 1, 250, 1_000, 2_500]);
    prop_oneof![
        2 => Just(None),
        1 => (ms(), 1..=3u32, ms()).prop_map(|(duration, factor, cap)| Some(
            BanRule::new(Duration::from_millis(duration))
                .escalate(factor, Duration::from_millis(cap))
        )),
    ]
}

fn rule_strategy() -> impl Strategy<Value = Rule> {
    let algorithm = prop_oneof![
        Just(Algorithm::SlidingLog),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::Gcra),
    ];
    let window_ms = prop_oneof![Just(1), Just(7), Just(500), Just(1_000), Just(3_000)];
    (algorithm, 1..=5u64, window_ms).prop_map(|(algorithm, limit, window_ms)| {
        Rule::new(limit, Duration::from_millis(window_ms))
            .unwrap()
            .with_algorithm(algorithm)
    })
}

fn rules_strategy() -> impl Strategy<Value = Vec<Rule>> {
    // A policy never holds one rule twice (the policy builder refuses it).
    prop::collection::vec(rule_strategy(), 1..=3).prop_map(|mut rules| {
        let mut seen = Vec::new();
        rules.retain(|r| {
            let fresh = !seen.contains(r);
            seen.push(*r);
            fresh
        });
        rules
    })
}

fn step_strategy() -> impl Strategy<Value = Step> {
    // Small moves, exact window edges and long jumps: boundaries are where mirrors crack.
    let advance = prop_oneof![
        4 => Just(0u64),
        2 => 0..2_000u64,
        2 => prop::sample::select(vec![1u64, 999, 1_000, 7_000, 500_000, 1_000_000, 3_000_000]),
        2 => 0..4_000_000u64,
    ];
    prop_oneof![
        30 => (advance, 0..=4u64, prop::bool::weighted(0.8)).prop_map(
            |(advance_us, cost, consume)| Step::Check { advance_us, cost, consume }
        ),
        1 => Just(Step::Reset),
    ]
}

fn scenario_strategy() -> impl Strategy<Value = Scenario> {
    (
        0..86_400_000_000u64,
        rules_strategy(),
        rules_strategy(),
        (ban_strategy(), ban_strategy()),
        prop::collection::vec(step_strategy(), 1..60),
    )
        .prop_map(|(start_us, a, b, bans, steps)| Scenario {
            start_us,
            limiters: [a, b],
            bans: [bans.0, bans.1],
            steps,
        })
}

/// 2024-01-01T00:00:00Z in µs: a whole number of days since the epoch.
const DAY_ZERO_US: u64 = 1_704_067_200_000_000;

static CASE: AtomicU64 = AtomicU64::new(0);

/// Runs `s` on `redis` and on a memory store. With `exact`, every verdict must be the same;
/// otherwise (a store with the local over-limit cache, whose denials carry approximate
/// numbers) every decision must be, and every admission entirely.
async fn run(
    redis: &RedisStore,
    clock: &ManualClock,
    s: &Scenario,
    exact: bool,
) -> Result<(), TestCaseError> {
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    clock.set(Duration::from_micros(DAY_ZERO_US + s.start_us));
    let memory = MemoryStore::builder()
        .clock(clock.clone())
        .purge_interval(None)
        .build();
    let mut limiters = [
        limiter(&format!("p:{{{case}:a}}"), &s.limiters[0]),
        limiter(&format!("p:{{{case}:b}}"), &s.limiters[1]),
    ];
    limiters[0].ban = s.bans[0];
    limiters[1].ban = s.bans[1];
    let prefix = format!("p{case}");
    let bans: Vec<PlanBan> = [
        BanTarget::Ip("192.0.2.1".parse().unwrap()),
        BanTarget::UserId("u:1".into()),
    ]
    .into_iter()
    .map(|target| PlanBan {
        key: target.key(&prefix),
        target,
    })
    .collect();
    let plan = |cost, consume| {
        CheckPlan::new(cost, consume, limiters.to_vec())
            .with_bans(bans.clone(), ban_index_key(&prefix))
    };
    for (i, step) in s.steps.iter().enumerate() {
        match *step {
            Step::Check {
                advance_us,
                cost,
                consume,
            } => {
                clock.advance(Duration::from_micros(advance_us));
                let plan = plan(cost, consume);
                let mut want = memory.check_plan(&plan).await.unwrap();
                let mut got = redis.check_plan(&plan).await.unwrap();
                // Receipts name the same instants and units; their ids are each store's own
                // (the memory store names only leases, Redis every check by its nonce).
                let instants =
                    |v: &tollgate::Verdict| v.receipt.as_ref().map(|r| (r.at_us(0), r.units()));
                prop_assert_eq!(
                    instants(&got),
                    instants(&want),
                    "step {} of {:?}",
                    i,
                    s.steps
                );
                (got.receipt, want.receipt) = (None, None);
                if exact || want.allowed {
                    prop_assert_eq!(got, want, "step {} of {:?}", i, s.steps);
                } else {
                    prop_assert!(!got.allowed, "step {} of {:?}: {:?}", i, s.steps, got);
                }
            }
            Step::Reset => {
                let plan = plan(0, false);
                redis.reset_plan(&plan).await.unwrap();
                memory.reset_plan(&plan).await.unwrap();
            }
        }
    }
    Ok(())
}

#[test]
fn redis_and_memory_agree_step_by_step() {
    agree_step_by_step(false);
}

/// The same sequences with the local over-limit cache on: it answers some denials itself,
/// and must never turn an admission into a denial or a denial into an admission.
#[test]
fn the_local_cache_changes_no_decision() {
    agree_step_by_step(true);
}

fn agree_step_by_step(local_cache: bool) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new(Duration::from_micros(DAY_ZERO_US));
    let redis = rt
        .block_on(
            RedisStore::builder(&server.url())
                .clock(clock.clone())
                .timeout(Duration::from_secs(5))
                .local_cache(local_cache)
                .build(),
        )
        .unwrap();
    // PROPTEST_CASES=5000 for a longer hunt; 200 keeps the suite at a few seconds.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let result = runner.run(&scenario_strategy(), |s| {
        rt.block_on(run(&redis, &clock, &s, !local_cache))
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    if local_cache {
        // The cache did answer: the comparison above covered its denials.
        assert!(redis.local_denials() > 0, "no check was answered locally");
    }
}
