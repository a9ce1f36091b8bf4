//! The store conformance suite, the guard suite and the IP-prefix suite against `RedisStore` on a real Redis
//! Cluster (three primaries, three replicas).
//!
//! As on standalone Redis, the store is built with the scenario's manual clock, so the same
//! numbers must come out. The scenarios' limiters (one per dimension value) land in different
//! hash slots and the bans in the `{ban}` slot, so most checks here take the Cluster's
//! multi-slot path: one script per slot, reservations undone on a denial. Tests share one
//! cluster while any of them runs (each under its own key prefix); the last to finish stops it.
//!
//! Every scenario runs verbatim but one: `concurrent_checks_never_over_admit` also asks that
//! 500 simultaneous checks of one identity against limiters in *different* slots admit exactly
//! 100 when the second limiter allows only 120. On a Cluster a reservation made in one slot is
//! visible to other checks until the denial in another slot undoes it (the residual window of
//! docs/deployment.md): it can deny a check that would have fitted, never admit one too many.
//! So here that scenario's numbers are what a Cluster guarantees: exactly the limit when every
//! limiter lives in one slot or the others have room for every concurrent check, never more
//! than the limit otherwise, and, once the storm is over, no charge left by any denied check.

// clippy.toml allows unwrap in test functions only; the helpers here are test code too.
#![allow(clippy::unwrap_used)]

use std::{
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::Barrier;
use tollgate::{
    Algorithm, Dimension, Identity, Limiter, ManualClock, Policy, Reason, Rule, Tollgate,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::{
    RedisCluster,
    conformance::{START, Subject},
};

static CLUSTER: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
static NEXT_PREFIX: AtomicUsize = AtomicUsize::new(0);

fn shared_cluster() -> Arc<RedisCluster> {
    let mut slot = CLUSTER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(cluster) = slot.upgrade() {
        return cluster;
    }
    let cluster = Arc::new(RedisCluster::start());
    *slot = Arc::downgrade(&cluster);
    cluster
}

async fn cluster_subject() -> Subject<RedisStore> {
    let cluster = shared_cluster();
    let clock = ManualClock::new(START);
    // Generous: a slow shared machine must not turn into a store failure mid-scenario.
    let store = RedisStore::builder(&cluster.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("connect to the test cluster");
    let prefix = format!("cl{}", NEXT_PREFIX.fetch_add(1, Ordering::Relaxed));
    Subject::new(Tollgate::new(store).with_prefix(prefix), clock).keep_alive(cluster)
}

mod conformance {
    use super::cluster_subject;

    // `conformance_suite!` minus `concurrent_checks_never_over_admit` (see the module docs and
    // `concurrent_checks_never_over_admit_across_slots` below).
    tollgate_testkit::conformance_suite!(@each cluster_subject;
        multi_rule_limits,
        sliding_log_entries_leave_one_by_one,
        fixed_window_resets_at_the_aligned_boundary,
        sliding_window_weighs_the_previous_window,
        gcra_spaces_requests_after_the_burst,
        mixed_algorithms_strictest_decides,
        cost_is_counted_in_units,
        peek_consumes_nothing_and_reset_forgets_one_identity,
        all_or_nothing_across_limiters,
        missing_dimension_records_nothing,
        retry_after_is_exact,
        keys_never_collide,
        check_group_and_check_single,
        check_single_keeps_rules_that_differ_only_in_algorithm,
        quota_refills_after_a_quiet_window,
        denial_names_the_first_denying_limiter,
        shadow_limiters_count_but_never_deny,
        refunds_give_back_what_a_check_charged,
        calendar_windows_follow_the_zones_days,
        concurrency_leases_bound_what_is_in_flight,
        a_partial_refund_keeps_the_rest_of_a_lease,
        warnings_name_the_rules_past_their_fraction,
        settlements_charge_debts_and_give_back,
        waiters_are_admitted_in_order_never_over_the_limit,
        overrides_set_limits_per_identity,
        overrides_page_in_the_order_they_end,
        refunds_count_by_the_limits_their_check_counted_by,
        store_answers_ping,
    );
}

mod guards {
    use super::cluster_subject;

    tollgate_testkit::guard_suite!(cluster_subject);
}

mod prefixes {
    use super::cluster_subject;

    tollgate_testkit::prefix_suite!(cluster_subject);
}

fn rule(text: &str, algorithm: Algorithm) -> Rule {
    text.parse::<Rule>().unwrap().with_algorithm(algorithm)
}

fn policy(scope: &str, limiters: impl IntoIterator<Item = Limiter>) -> Policy {
    limiters
        .into_iter()
        .fold(Policy::builder(scope), |b, l| b.limiter(l))
        .build()
        .unwrap()
}

/// Fires `n` checks of `policy` for `who` at once; returns how many were admitted.
async fn race(gate: &Arc<Tollgate<RedisStore>>, policy: &Policy, who: &Identity, n: usize) -> u64 {
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (gate, policy, who, barrier) =
                (gate.clone(), policy.clone(), who.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                gate.check(&policy, &who, 1).await.unwrap()
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let d = task.await.unwrap();
        assert_ne!(d.reason(), Reason::StoreUnavailable, "the store failed");
        admitted += u64::from(d.allowed());
    }
    admitted
}

/// The remaining count of every rule, in policy order, as a peek sees it.
async fn remaining(gate: &Tollgate<RedisStore>, policy: &Policy, who: &Identity) -> Vec<u64> {
    let d = gate.peek(policy, who, 0).await.unwrap();
    d.rules(policy).iter().map(|r| r.remaining).collect()
}

/// The conformance scenario's concurrency, with the Cluster's guarantees (module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_never_over_admit_across_slots() {
    use Algorithm::{FixedWindow, Gcra, SlidingLog};
    let cluster = shared_cluster();
    let clock = ManualClock::new(START);
    let store = RedisStore::builder(&cluster.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let prefix = format!("cl{}", NEXT_PREFIX.fetch_add(1, Ordering::Relaxed));
    let gate = Arc::new(Tollgate::new(store).with_prefix(prefix));
    let n = 500;
    let hang = Duration::from_secs(120);
    let who = Identity::new()
        .with_ip("192.0.2.1".parse().unwrap())
        .with_user_id("racer");

    // One limiter, one slot (the bans are read beside it): exact.
    let one_slot = policy(
        "race_one_slot",
        [Limiter::new(
            Dimension::Global,
            [
                rule("100/1m", SlidingLog),
                rule("150/1m", FixedWindow),
                rule("200/1m", Gcra),
            ],
        )],
    );
    let admitted = tokio::time::timeout(hang, race(&gate, &one_slot, &who, n))
        .await
        .unwrap();
    assert_eq!(admitted, 100, "one slot");
    assert_eq!(remaining(&gate, &one_slot, &who).await, [0, 50, 100]);

    // Three slots, the others with room for every check: exact, and the denied checks left
    // nothing in the counters they reserved.
    let roomy = policy(
        "race_roomy",
        [
            Limiter::new(Dimension::Global, [rule("100/1m", SlidingLog)]),
            Limiter::new(Dimension::UserId, [rule("1000/1m", FixedWindow)]),
            Limiter::new(Dimension::Ip, [rule("1000/1m", SlidingLog)]),
        ],
    );
    let admitted = tokio::time::timeout(hang, race(&gate, &roomy, &who, n))
        .await
        .unwrap();
    assert_eq!(admitted, 100, "three slots with room");
    assert_eq!(remaining(&gate, &roomy, &who).await, [0, 900, 900]);

    // Two slots, the second tight (the suite's race_all): never more than the limit, and once
    // every undo is done, every rule counts exactly the admitted checks.
    let tight = policy(
        "race_tight",
        [
            Limiter::new(
                Dimension::Global,
                [rule("100/1m", SlidingLog), rule("150/1m", FixedWindow)],
            ),
            Limiter::new(Dimension::UserId, [rule("120/1m", SlidingLog)]),
        ],
    );
    let admitted = tokio::time::timeout(hang, race(&gate, &tight, &who, n))
        .await
        .unwrap();
    println!("two tight slots: {admitted} of {n} admitted under a limit of 100");
    assert!(admitted <= 100 && admitted > 0, "admitted {admitted}");
    assert_eq!(
        remaining(&gate, &tight, &who).await,
        [100 - admitted, 150 - admitted, 120 - admitted]
    );
}
