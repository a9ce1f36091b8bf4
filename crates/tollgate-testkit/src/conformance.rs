//! The store conformance suite: the same scenarios, with the same numbers, on every store.
//!
//! A store passes when every scenario passes against it. Each scenario is an `async fn` taking
//! a fresh [`Subject`]: an engine over the store under test and the [`ManualClock`] that store
//! reads (the memory store takes it as its clock; the Redis store, built for tests, passes its
//! time to the script instead of Redis `TIME`). Scenarios move that clock and assert exact
//! decisions, so a store that rounds, drifts by a millisecond or records a denied request
//! fails by name.
//!
//! [`conformance_suite!`](crate::conformance_suite) expands to one `#[tokio::test]` per
//! scenario:
//!
//! ```ignore
//! tollgate_testkit::conformance_suite!(|| async { tollgate_testkit::conformance::memory_subject() });
//! ```

use std::{any::Any, fmt, net::IpAddr, sync::Arc, time::Duration};

use crate::FullStore;
use tokio::sync::Barrier;
use tollgate::{
    Algorithm, BanRule, CheckError, Clock, Decision, Dimension, Identity, Limiter, ManualClock,
    MemoryStore, NamedDecision, Policy, Reason, Rule, Settlement, Tollgate,
};

/// The instant every scenario starts at: 2100-01-01T00:00:00Z.
///
/// It is a whole number of days (so of every window the scenarios use) since the epoch, which
/// pins fixed-window boundaries to known offsets. It lies in the future so that a store which
/// turns the test clock into absolute expiry times (`PEXPIREAT`) keeps its keys for the whole
/// scenario.
pub const START: Duration = Duration::from_secs(4_102_444_800);

/// What a scenario runs against: a fresh engine and the clock its store reads.
///
/// The engine must be fresh: no state visible under its key prefix, so a shared Redis needs a
/// distinct prefix per subject ([`Tollgate::with_prefix`]).
pub struct Subject<S> {
    gate: Tollgate<S>,
    clock: ManualClock,
    keep: Option<Box<dyn Any + Send + Sync>>,
}

impl<S: fmt::Debug> fmt::Debug for Subject<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subject")
            .field("gate", &self.gate)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<S: FullStore> Subject<S> {
    /// A subject over `gate`, whose store reads `clock`.
    pub fn new(gate: Tollgate<S>, clock: ManualClock) -> Subject<S> {
        Subject {
            gate,
            clock,
            keep: None,
        }
    }

    /// Keeps `guard` alive as long as the subject, e.g. the server its store talks to.
    #[must_use]
    pub fn keep_alive(mut self, guard: impl Any + Send + Sync) -> Subject<S> {
        self.keep = Some(Box::new(guard));
        self
    }

    /// The engine under test.
    pub fn gate(&self) -> &Tollgate<S> {
        &self.gate
    }

    /// The clock the store reads.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// Sets the clock to [`START`] + `offset`.
    fn at(&self, offset: Duration) {
        self.clock.set(START + offset);
    }

    async fn check(&self, policy: &Policy, who: &Identity, cost: u64) -> NamedDecision {
        let d = self
            .gate
            .check(policy, who, cost)
            .await
            .expect("the identity carries every dimension");
        assert_ne!(d.reason(), Reason::StoreUnavailable, "the store failed");
        d.named(policy)
    }

    async fn peek(&self, policy: &Policy, who: &Identity, cost: u64) -> NamedDecision {
        let d = self
            .gate
            .peek(policy, who, cost)
            .await
            .expect("the identity carries every dimension")
            .named(policy);
        assert_ne!(d.reason(), Reason::StoreUnavailable, "the store failed");
        d
    }
}

/// A subject over a [`MemoryStore`] with a manual clock and no background sweep.
pub fn memory_subject() -> Subject<MemoryStore> {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .purge_interval(None)
        .build();
    Subject::new(Tollgate::new(store), clock)
}

/// Expands to one `#[tokio::test]` per conformance scenario, each named after it.
///
/// `$make` is an expression callable with no arguments that returns a future of a fresh
/// [`Subject`](crate::conformance::Subject); it is called once per test. The calling crate
/// needs `tokio` (with `macros` and `rt-multi-thread`) among its dev-dependencies.
///
/// ```ignore
/// tollgate_testkit::conformance_suite!(|| async { tollgate_testkit::conformance::memory_subject() });
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@each $make;
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

        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_checks_never_over_admit() {
            let subject = ($make)().await;
            $crate::conformance::concurrent_checks_never_over_admit(subject).await;
        }
    };
    (@each $make:expr; $($scenario:ident),+ $(,)?) => {
        $(
            #[::tokio::test]
            async fn $scenario() {
                let subject = ($make)().await;
                $crate::conformance::$scenario(subject).await;
            }
        )+
    };
}

fn rule(text: &str) -> Rule {
    text.parse().expect("scenario rules are valid")
}

fn fixed(text: &str) -> Rule {
    rule(text).with_algorithm(Algorithm::FixedWindow)
}

fn gcra(text: &str) -> Rule {
    rule(text).with_algorithm(Algorithm::Gcra)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn policy(scope: &str, limiters: impl IntoIterator<Item = Limiter>) -> Policy {
    limiters
        .into_iter()
        .fold(Policy::builder(scope), |b, l| b.limiter(l))
        .build()
        .expect("scenario policies are valid")
}

fn ip(n: u8) -> Identity {
    Identity::new().with_ip(IpAddr::from([192, 0, 2, n]))
}

fn user(id: &str) -> Identity {
    Identity::new().with_user_id(id)
}

/// Asserts a decision: allowed (`retry_after_ms == None`) or rate limited with that
/// `retry_after`, and per rule, in policy order, `(allowed, remaining, reset_after in ms)`.
#[track_caller]
fn expect(d: &NamedDecision, retry_after_ms: Option<u64>, rules: &[(bool, u64, u64)]) {
    let got: Vec<(bool, u64, Duration)> = d
        .rules()
        .iter()
        .map(|r| (r.allowed, r.remaining, r.reset_after))
        .collect();
    let want: Vec<(bool, u64, Duration)> = rules
        .iter()
        .map(|&(allowed, remaining, reset)| (allowed, remaining, ms(reset)))
        .collect();
    assert_eq!(
        got, want,
        "per-rule (allowed, remaining, reset_after) of {d:#?}"
    );
    match retry_after_ms {
        None => {
            assert!(d.allowed(), "expected admission: {d:#?}");
            assert_eq!(d.reason(), Reason::Ok);
            assert_eq!(d.retry_after(), None);
        }
        Some(retry) => {
            assert!(!d.allowed(), "expected denial: {d:#?}");
            assert_eq!(d.reason(), Reason::RateLimited);
            assert_eq!(d.retry_after(), Some(ms(retry)), "retry_after of {d:#?}");
        }
    }
    assert_eq!(
        d.allowed(),
        d.rules().iter().all(|r| r.allowed),
        "a decision is allowed exactly when every rule is"
    );
}

fn denied_rules(d: &NamedDecision) -> Vec<String> {
    d.denied_rules()
        .map(|r| format!("{}:{}/{}", r.limiter, r.rule, r.rule.algorithm()))
        .collect()
}

/// Scenario 1: two sliding-log rules on one limiter (3/2s and 5/10s); each denies in turn, with
/// exact `retry_after`, `remaining` and `reset_after` per rule.
pub async fn multi_rule_limits<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "multi",
        [Limiter::new(Dimension::Ip, [rule("3/2s"), rule("5/10s")])],
    );
    let who = ip(1);
    s.at(ms(0));
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 2, 2000), (true, 4, 10_000)],
    );
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 1, 2000), (true, 3, 10_000)],
    );
    let third = s.check(&p, &who, 1).await;
    expect(&third, None, &[(true, 0, 2000), (true, 2, 10_000)]);
    assert_eq!(third.remaining(), Some(0));

    // The 2 s rule is full until its entries leave at 2 s; the 10 s rule would admit and
    // reports its state as it stays.
    let fourth = s.check(&p, &who, 1).await;
    expect(&fourth, Some(2000), &[(false, 0, 2000), (true, 2, 10_000)]);
    assert_eq!(denied_rules(&fourth), ["ip:3/2s/sliding_log"]);

    s.at(ms(2000));
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 2, 2000), (true, 1, 10_000)],
    );
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 1, 2000), (true, 0, 10_000)],
    );
    // Now the 10 s rule is full; its oldest entry (t = 0) leaves at 10 s.
    let sixth = s.check(&p, &who, 1).await;
    expect(&sixth, Some(8000), &[(true, 1, 2000), (false, 0, 10_000)]);
    assert_eq!(denied_rules(&sixth), ["ip:5/10s/sliding_log"]);

    s.at(ms(9999));
    expect(
        &s.peek(&p, &who, 1).await,
        Some(1),
        &[(true, 3, 0), (false, 0, 2001)],
    );
    // The three entries of t = 0 leave together.
    s.at(ms(10_000));
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 2, 2000), (true, 2, 10_000)],
    );
}

/// Scenario 2: a sliding log forgets each entry exactly `window` after it was recorded, one by
/// one, not in batches.
pub async fn sliding_log_entries_leave_one_by_one<S: FullStore>(s: Subject<S>) {
    let p = policy("slide", [Limiter::new(Dimension::UserId, [rule("3/10s")])]);
    let who = user("u");
    for (i, at) in [0, 1000, 2000].into_iter().enumerate() {
        s.at(ms(at));
        expect(
            &s.check(&p, &who, 1).await,
            None,
            &[(true, 2 - i as u64, 10_000)],
        );
    }
    s.at(ms(3000));
    expect(&s.check(&p, &who, 1).await, Some(7000), &[(false, 0, 9000)]);

    // (offset ms, remaining, reset_after ms) seen by a free look: entries at 0, 1 s and 2 s
    // leave at 10 s, 11 s and 12 s, not a millisecond earlier.
    let walk = [
        (9_999, 0, 2_001),
        (10_000, 1, 2_000),
        (10_999, 1, 1_001),
        (11_000, 2, 1_000),
        (11_999, 2, 1),
        (12_000, 3, 0),
    ];
    for (at, remaining, reset) in walk {
        s.at(ms(at));
        let d = s.peek(&p, &who, 0).await;
        expect(&d, None, &[(true, remaining, reset)]);
    }

    // The same walk, consuming: each freed slot admits exactly one request at its boundary.
    let other = user("v");
    for at in [20_000, 21_000, 22_000] {
        s.at(ms(at));
        assert!(s.check(&p, &other, 1).await.allowed());
    }
    // (boundary ms, reset_after 1 ms before it, wait for the next slot after it)
    for (boundary, reset_before, next_gap) in [
        (30_000, 2001, 1000),
        (31_000, 9001, 1000),
        (32_000, 9001, 8000),
    ] {
        s.at(ms(boundary - 1));
        expect(
            &s.check(&p, &other, 1).await,
            Some(1),
            &[(false, 0, reset_before)],
        );
        s.at(ms(boundary));
        expect(&s.check(&p, &other, 1).await, None, &[(true, 0, 10_000)]);
        expect(
            &s.check(&p, &other, 1).await,
            Some(next_gap),
            &[(false, 0, 10_000)],
        );
    }
}

/// Scenario 3: a fixed window admits `limit` per epoch-aligned window and starts over at the
/// boundary, which lets a burst straddle it (the known cost of fixed windows).
pub async fn fixed_window_resets_at_the_aligned_boundary<S: FullStore>(s: Subject<S>) {
    let p = policy("fixed", [Limiter::new(Dimension::Ip, [fixed("3/10s")])]);
    let who = ip(1);
    s.at(ms(7000));
    expect(&s.peek(&p, &who, 0).await, None, &[(true, 3, 0)]);
    for remaining in [2, 1, 0] {
        expect(
            &s.check(&p, &who, 1).await,
            None,
            &[(true, remaining, 3000)],
        );
    }
    expect(&s.check(&p, &who, 1).await, Some(3000), &[(false, 0, 3000)]);
    s.at(ms(9999));
    expect(&s.check(&p, &who, 1).await, Some(1), &[(false, 0, 1)]);
    // Three more at the boundary: six admitted within 3 s under a 3/10s rule.
    s.at(ms(10_000));
    for remaining in [2, 1, 0] {
        expect(
            &s.check(&p, &who, 1).await,
            None,
            &[(true, remaining, 10_000)],
        );
    }
    expect(
        &s.check(&p, &who, 1).await,
        Some(10_000),
        &[(false, 0, 10_000)],
    );
}

/// Scenario 3b: a sliding-window counter admits `limit` per window, then counts the previous
/// window's units by how much of them the sliding window still covers; exact `retry_after`
/// for that model, in this window and in the next; mixed with a sliding log, all or nothing.
pub async fn sliding_window_weighs_the_previous_window<S: FullStore>(s: Subject<S>) {
    let sliding = |text: &str| rule(text).with_algorithm(Algorithm::SlidingWindow);
    let p = policy(
        "sliding",
        [Limiter::new(
            Dimension::Ip,
            [sliding("10/10s"), rule("100/1m")],
        )],
    );
    let who = ip(1);
    s.at(ms(2000));
    for n in 1..=10u64 {
        expect(
            &s.check(&p, &who, 1).await,
            None,
            &[(true, 10 - n, 18_000), (true, 100 - n, 60_000)],
        );
    }
    // Full: the next fits in the next window once 1/10 of this one has faded, at 11 s.
    expect(
        &s.check(&p, &who, 1).await,
        Some(9000),
        &[(false, 0, 18_000), (true, 90, 60_000)],
    );
    // At 15 s the previous window weighs half: 5 more fit, then one waits until 16 s.
    s.at(ms(15_000));
    expect(
        &s.check(&p, &who, 5).await,
        None,
        &[(true, 0, 15_000), (true, 85, 60_000)],
    );
    expect(
        &s.check(&p, &who, 1).await,
        Some(1000),
        &[(false, 0, 15_000), (true, 85, 60_000)],
    );
    s.at(ms(16_000));
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 0, 14_000), (true, 84, 60_000)],
    );
    // Another identity is untouched; peek records nothing.
    expect(
        &s.peek(&p, &ip(2), 1).await,
        None,
        &[(true, 9, 14_000), (true, 99, 60_000)],
    );

    // All or nothing with another limiter (on a Cluster, in another hash slot): a denial by
    // the user's rule leaves the address's count as it was.
    let p = policy(
        "sliding2",
        [
            Limiter::new(Dimension::Ip, [sliding("3/10s")]),
            Limiter::new(Dimension::UserId, [sliding("1/10s")]),
        ],
    );
    let alice = || ip(3).with_user_id("alice");
    s.at(ms(31_000));
    expect(
        &s.check(&p, &alice(), 1).await,
        None,
        &[(true, 2, 19_000), (true, 0, 19_000)],
    );
    expect(
        &s.check(&p, &alice(), 1).await,
        // A limit of 1: the unit must fade wholly, at the end of the next window.
        Some(19_000),
        &[(true, 2, 19_000), (false, 0, 19_000)],
    );
    let bob = ip(3).with_user_id("bob");
    expect(
        &s.check(&p, &bob, 1).await,
        None,
        &[(true, 1, 19_000), (true, 0, 19_000)],
    );
}

/// Scenario 4: GCRA admits a burst of `limit`, then one request per `window / limit`, and says
/// exactly when the next one fits.
pub async fn gcra_spaces_requests_after_the_burst<S: FullStore>(s: Subject<S>) {
    // One unit every 500 ms, bursts of up to 4.
    let p = policy("gcra", [Limiter::new(Dimension::Ip, [gcra("4/2s")])]);
    let who = ip(1);
    s.at(ms(0));
    for (remaining, reset) in [(3, 500), (2, 1000), (1, 1500), (0, 2000)] {
        expect(
            &s.check(&p, &who, 1).await,
            None,
            &[(true, remaining, reset)],
        );
    }
    expect(&s.check(&p, &who, 1).await, Some(500), &[(false, 0, 2000)]);
    s.at(ms(499));
    expect(&s.check(&p, &who, 1).await, Some(1), &[(false, 0, 1501)]);
    for at in [500, 1000, 1500] {
        s.at(ms(at));
        expect(&s.check(&p, &who, 1).await, None, &[(true, 0, 2000)]);
        expect(&s.check(&p, &who, 1).await, Some(500), &[(false, 0, 2000)]);
    }
    s.at(ms(1750));
    expect(&s.check(&p, &who, 1).await, Some(250), &[(false, 0, 1750)]);
    // Quiet time earns units back, one per interval, up to the burst.
    s.at(ms(2500));
    expect(&s.peek(&p, &who, 0).await, None, &[(true, 2, 1000)]);
    s.at(ms(3500));
    expect(&s.peek(&p, &who, 0).await, None, &[(true, 4, 0)]);
    for (remaining, reset) in [(3, 500), (2, 1000), (1, 1500), (0, 2000)] {
        expect(
            &s.check(&p, &who, 1).await,
            None,
            &[(true, remaining, reset)],
        );
    }
    expect(&s.check(&p, &who, 1).await, Some(500), &[(false, 0, 2000)]);
}

/// Scenario 5: sliding log, fixed window and GCRA in one limiter; whichever is strictest at the
/// moment denies, `retry_after` is the longest wait among the denying rules, and a denial
/// records nothing in the rules that would have admitted.
pub async fn mixed_algorithms_strictest_decides<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "mixed",
        [Limiter::new(
            Dimension::Ip,
            [rule("5/10s"), fixed("2/1s"), gcra("3/6s")],
        )],
    );
    let who = ip(1);
    s.at(ms(0));
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 4, 10_000), (true, 1, 1000), (true, 2, 2000)],
    );
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 3, 10_000), (true, 0, 1000), (true, 1, 4000)],
    );
    let d = s.check(&p, &who, 1).await;
    expect(
        &d,
        Some(1000),
        &[(true, 3, 10_000), (false, 0, 1000), (true, 1, 4000)],
    );
    assert_eq!(denied_rules(&d), ["ip:2/1s/fixed_window"]);

    s.at(ms(1000));
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 2, 10_000), (true, 1, 1000), (true, 0, 5000)],
    );
    s.at(ms(1500));
    let d = s.check(&p, &who, 1).await;
    expect(
        &d,
        Some(500),
        &[(true, 2, 9500), (true, 1, 500), (false, 0, 4500)],
    );
    assert_eq!(denied_rules(&d), ["ip:3/6s/gcra"]);

    s.at(ms(2000));
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 1, 10_000), (true, 1, 1000), (true, 0, 6000)],
    );
    expect(
        &s.check(&p, &who, 1).await,
        Some(2000),
        &[(true, 1, 10_000), (true, 1, 1000), (false, 0, 6000)],
    );

    // The sliding log holds 0, 0, 1 s, 2 s: had any denial above been recorded, this would fail.
    s.at(ms(4000));
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 0, 10_000), (true, 1, 1000), (true, 0, 6000)],
    );
    // Two rules deny: the log until its oldest entry leaves (6 s), GCRA for 2 s.
    let d = s.check(&p, &who, 1).await;
    expect(
        &d,
        Some(6000),
        &[(false, 0, 10_000), (true, 1, 1000), (false, 0, 6000)],
    );
    assert_eq!(denied_rules(&d), ["ip:5/10s/sliding_log", "ip:3/6s/gcra"]);
}

/// Scenario 6: a request of cost `n` counts `n` units in every algorithm; a cost above a limit
/// is refused without touching the store; a cost of zero is a free look.
pub async fn cost_is_counted_in_units<S: FullStore>(s: Subject<S>) {
    let p = policy("cost", [Limiter::new(Dimension::Ip, [rule("5/10s")])]);
    let who = ip(1);
    s.at(ms(0));
    expect(&s.check(&p, &who, 0).await, None, &[(true, 5, 0)]);
    expect(&s.check(&p, &who, 3).await, None, &[(true, 2, 10_000)]);
    expect(
        &s.check(&p, &who, 3).await,
        Some(10_000),
        &[(false, 2, 10_000)],
    );

    let d = s.check(&p, &who, 6).await;
    assert!(!d.allowed());
    assert_eq!(d.reason(), Reason::CostExceedsLimit);
    assert_eq!(d.retry_after(), None, "waiting cannot help");
    assert_eq!(denied_rules(&d), ["ip:5/10s/sliding_log"]);
    let d = s.peek(&p, &who, 6).await;
    assert_eq!(d.reason(), Reason::CostExceedsLimit);
    // Neither the refused cost 3 nor the cost 6 was recorded.
    expect(&s.peek(&p, &who, 0).await, None, &[(true, 2, 10_000)]);

    s.at(ms(1000));
    expect(&s.check(&p, &who, 2).await, None, &[(true, 0, 10_000)]);
    // A cost of zero is admitted even when the rule is full, and records nothing.
    expect(&s.check(&p, &who, 0).await, None, &[(true, 0, 10_000)]);
    // The log holds 0, 0, 0, 1 s, 1 s; four must leave for 4 more units: the fourth leaves at 11 s.
    s.at(ms(2000));
    expect(&s.check(&p, &who, 4).await, Some(9000), &[(false, 0, 9000)]);
    s.at(ms(10_999));
    expect(&s.peek(&p, &who, 4).await, Some(1), &[(false, 3, 1)]);
    s.at(ms(11_000));
    expect(&s.check(&p, &who, 4).await, None, &[(true, 1, 10_000)]);

    // Counters count units too (GCRA: one unit every 2 s, so 3 units push the tat 6 s out).
    let q = policy(
        "cost_counters",
        [Limiter::new(Dimension::Ip, [fixed("5/10s"), gcra("5/10s")])],
    );
    let who = ip(2);
    s.at(ms(20_000));
    expect(
        &s.check(&q, &who, 3).await,
        None,
        &[(true, 2, 10_000), (true, 2, 6000)],
    );
    expect(
        &s.check(&q, &who, 3).await,
        Some(10_000),
        &[(false, 2, 10_000), (false, 2, 6000)],
    );
    expect(
        &s.check(&q, &who, 0).await,
        None,
        &[(true, 2, 10_000), (true, 2, 6000)],
    );
    expect(
        &s.check(&q, &who, 2).await,
        None,
        &[(true, 0, 10_000), (true, 0, 10_000)],
    );

    // Many units in one request.
    let bulk = policy("cost_bulk", [Limiter::new(Dimension::Ip, [rule("50/10s")])]);
    let who = ip(3);
    s.at(ms(40_000));
    expect(&s.check(&bulk, &who, 50).await, None, &[(true, 0, 10_000)]);
    expect(
        &s.check(&bulk, &who, 1).await,
        Some(10_000),
        &[(false, 0, 10_000)],
    );
    s.at(ms(49_999));
    expect(&s.check(&bulk, &who, 1).await, Some(1), &[(false, 0, 1)]);
    s.at(ms(50_000));
    expect(&s.check(&bulk, &who, 50).await, None, &[(true, 0, 10_000)]);
}

/// Scenario 7: `peek` returns what `check` would and records nothing; `reset` forgets one
/// identity's counters of one policy, and nothing else.
pub async fn peek_consumes_nothing_and_reset_forgets_one_identity<S: FullStore>(s: Subject<S>) {
    let limiter = || {
        Limiter::new(
            Dimension::Ip,
            [rule("2/10s"), fixed("2/10s"), gcra("2/10s")],
        )
    };
    let p = policy("peek", [limiter()]);
    let other_policy = policy("peek_other", [limiter()]);
    let (a, b) = (ip(1), ip(2));
    s.at(ms(0));

    let first = [(true, 1, 10_000), (true, 1, 10_000), (true, 1, 5000)];
    for _ in 0..5 {
        expect(&s.peek(&p, &a, 1).await, None, &first);
    }
    let peeked = s.peek(&p, &a, 1).await;
    assert_same_as_peek(&s.check(&p, &a, 1).await, &peeked);

    let second = [(true, 0, 10_000), (true, 0, 10_000), (true, 0, 10_000)];
    expect(&s.peek(&p, &a, 1).await, None, &second);
    let peeked = s.peek(&p, &a, 1).await;
    assert_same_as_peek(&s.check(&p, &a, 1).await, &peeked);

    let denied = [(false, 0, 10_000), (false, 0, 10_000), (false, 0, 10_000)];
    let peeked = s.peek(&p, &a, 1).await;
    expect(&peeked, Some(10_000), &denied);
    assert_same_as_peek(&s.check(&p, &a, 1).await, &peeked);

    expect(&s.check(&p, &b, 1).await, None, &first);
    expect(&s.check(&other_policy, &a, 1).await, None, &first);

    s.at(ms(1000));
    s.gate.reset(&p, &a).await.expect("reset");
    expect(
        &s.peek(&p, &a, 0).await,
        None,
        &[(true, 2, 0), (true, 2, 0), (true, 2, 0)],
    );
    expect(
        &s.check(&p, &a, 1).await,
        None,
        &[(true, 1, 10_000), (true, 1, 9000), (true, 1, 5000)],
    );
    // Untouched: the same policy for another identity, another policy for the same identity.
    let kept = [(true, 1, 9000), (true, 1, 9000), (true, 1, 4000)];
    expect(&s.peek(&p, &b, 0).await, None, &kept);
    expect(&s.peek(&other_policy, &a, 0).await, None, &kept);
    // Forgetting an identity that was never seen is fine.
    s.gate.reset(&p, &ip(9)).await.expect("reset");
}

/// Scenario 8: a request denied by one limiter costs nothing in the others, whatever their
/// order and algorithms.
pub async fn all_or_nothing_across_limiters<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "aon",
        [
            Limiter::new(Dimension::Ip, [rule("5/1m")]),
            Limiter::new(Dimension::UserId, [rule("1/1m")]),
        ],
    );
    s.at(ms(0));
    let who = ip(1).with_user_id("u1");
    expect(
        &s.check(&p, &who, 1).await,
        None,
        &[(true, 4, 60_000), (true, 0, 60_000)],
    );
    for _ in 0..3 {
        let d = s.check(&p, &who, 1).await;
        expect(&d, Some(60_000), &[(true, 4, 60_000), (false, 0, 60_000)]);
        assert_eq!(denied_rules(&d), ["user_id:1/1m/sliding_log"]);
    }
    expect(
        &s.check(&p, &ip(1).with_user_id("u2"), 1).await,
        None,
        &[(true, 3, 60_000), (true, 0, 60_000)],
    );
    expect(
        &s.peek(&p, &ip(1).with_user_id("u3"), 1).await,
        None,
        &[(true, 2, 60_000), (true, 0, 60_000)],
    );

    // The denying limiter first.
    let q = policy(
        "aon_reversed",
        [
            Limiter::new(Dimension::UserId, [rule("5/1m")]),
            Limiter::new(Dimension::Ip, [rule("1/1m")]),
        ],
    );
    expect(
        &s.check(&q, &who, 1).await,
        None,
        &[(true, 4, 60_000), (true, 0, 60_000)],
    );
    for _ in 0..3 {
        expect(
            &s.check(&q, &who, 1).await,
            Some(60_000),
            &[(true, 4, 60_000), (false, 0, 60_000)],
        );
    }
    expect(
        &s.check(&q, &ip(2).with_user_id("u1"), 1).await,
        None,
        &[(true, 3, 60_000), (true, 0, 60_000)],
    );

    // Counters in the admitting limiter are not charged either.
    let r = policy(
        "aon_counters",
        [
            Limiter::new(Dimension::Ip, [fixed("5/1m"), gcra("5/1m")]),
            Limiter::new(Dimension::UserId, [fixed("1/1m")]),
        ],
    );
    let who = ip(3).with_user_id("u1");
    expect(
        &s.check(&r, &who, 1).await,
        None,
        &[(true, 4, 60_000), (true, 4, 12_000), (true, 0, 60_000)],
    );
    for _ in 0..2 {
        expect(
            &s.check(&r, &who, 1).await,
            Some(60_000),
            &[(true, 4, 60_000), (true, 4, 12_000), (false, 0, 60_000)],
        );
    }
    expect(
        &s.check(&r, &ip(3).with_user_id("u2"), 1).await,
        None,
        &[(true, 3, 60_000), (true, 3, 24_000), (true, 0, 60_000)],
    );
}

/// Asserts a decision with shadow limiters: admitted or denied (with `retry_after`) by the
/// enforced rules alone, per rule `(allowed, remaining, reset_after in ms)` in policy order,
/// and the shadow limiters that would have denied.
#[track_caller]
fn expect_shadow(
    d: &NamedDecision,
    retry_after_ms: Option<u64>,
    rules: &[(bool, u64, u64)],
    shadow_denied: &[&str],
) {
    let got: Vec<(bool, u64, Duration)> = d
        .rules()
        .iter()
        .map(|r| (r.allowed, r.remaining, r.reset_after))
        .collect();
    let want: Vec<(bool, u64, Duration)> = rules
        .iter()
        .map(|&(allowed, remaining, reset)| (allowed, remaining, ms(reset)))
        .collect();
    assert_eq!(
        got, want,
        "per-rule (allowed, remaining, reset_after) of {d:#?}"
    );
    assert_eq!(d.allowed(), retry_after_ms.is_none(), "{d:#?}");
    assert_eq!(d.retry_after(), retry_after_ms.map(ms), "{d:#?}");
    let mut names: Vec<String> = d
        .shadow_denied_rules()
        .map(|r| r.limiter.to_string())
        .collect();
    names.dedup();
    assert_eq!(names, shadow_denied, "shadow denials of {d:#?}");
    assert_eq!(d.shadow_denied(), !shadow_denied.is_empty());
    assert!(
        d.denied_rules().all(|r| !r.shadow),
        "a shadow rule never denies"
    );
}

/// Scenario: shadow limiters (dry runs) in the same atomic check. A shadow limiter is counted
/// when it would admit, records nothing when it would deny, never denies nor bans, and is not
/// charged when an enforced limiter denies.
pub async fn shadow_limiters_count_but_never_deny<S: FullStore>(s: Subject<S>) {
    let trial = Limiter::new(Dimension::UserId, [rule("1/1m"), gcra("1/1m")])
        .with_name("trial")
        .with_shadow(true);
    let trial_fixed = Limiter::new(Dimension::Ip, [fixed("2/1m")])
        .with_name("trial_fixed")
        .with_shadow(true);
    let p = policy(
        "shadow",
        [
            Limiter::new(Dimension::Ip, [rule("3/1m"), fixed("3/1m")]),
            trial,
            trial_fixed,
        ],
    );
    let who = ip(1).with_user_id("u1");
    s.at(ms(0));
    expect_shadow(
        &s.check(&p, &who, 1).await,
        None,
        &[
            (true, 2, 60_000),
            (true, 2, 60_000),
            (true, 0, 60_000),
            (true, 0, 60_000),
            (true, 1, 60_000),
        ],
        &[],
    );
    // `trial` would deny: admitted, and nothing is recorded in it; the others count.
    s.at(ms(1_000));
    expect_shadow(
        &s.check(&p, &who, 1).await,
        None,
        &[
            (true, 1, 60_000),
            (true, 1, 59_000),
            (false, 0, 59_000),
            (false, 0, 59_000),
            (true, 0, 59_000),
        ],
        &["trial"],
    );
    s.at(ms(2_000));
    let d = s.check(&p, &who, 1).await;
    expect_shadow(
        &d,
        None,
        &[
            (true, 0, 60_000),
            (true, 0, 58_000),
            (false, 0, 58_000),
            (false, 0, 58_000),
            (false, 0, 58_000),
        ],
        &["trial", "trial_fixed"],
    );
    assert_eq!(
        d.remaining(),
        Some(0),
        "remaining counts enforced rules only"
    );
    // The enforced limiter denies: its retry_after alone, its rules alone in denied_rules.
    s.at(ms(3_000));
    let d = s.check(&p, &who, 1).await;
    expect_shadow(
        &d,
        Some(57_000),
        &[
            (false, 0, 59_000),
            (false, 0, 57_000),
            (false, 0, 57_000),
            (false, 0, 57_000),
            (false, 0, 57_000),
        ],
        &["trial", "trial_fixed"],
    );
    assert_eq!(d.reason(), Reason::RateLimited);
    assert_eq!(denied_rules(&d).len(), 2);
    // A minute on, `trial` holds only its first admission (t = 0), which has left: it admits.
    s.at(ms(60_000));
    expect_shadow(
        &s.check(&p, &who, 1).await,
        None,
        &[
            (true, 0, 60_000),
            (true, 2, 60_000),
            (true, 0, 60_000),
            (true, 0, 60_000),
            (true, 1, 60_000),
        ],
        &[],
    );

    // A shadow limiter that would admit is not charged when an enforced one denies.
    let q = policy(
        "shadow_aon",
        [
            Limiter::new(Dimension::UserId, [rule("1/1m")]),
            Limiter::new(Dimension::Ip, [fixed("5/1m")])
                .with_name("trial")
                .with_shadow(true),
        ],
    );
    let who = ip(2).with_user_id("u2");
    expect_shadow(
        &s.check(&q, &who, 1).await,
        None,
        &[(true, 0, 60_000), (true, 4, 60_000)],
        &[],
    );
    for _ in 0..2 {
        expect_shadow(
            &s.check(&q, &who, 1).await,
            Some(60_000),
            &[(false, 0, 60_000), (true, 4, 60_000)],
            &[],
        );
    }
    expect_shadow(
        &s.check(&q, &ip(2).with_user_id("u3"), 1).await,
        None,
        &[(true, 0, 60_000), (true, 3, 60_000)],
        &[],
    );

    // A whole policy in shadow mode admits everything, whatever the cost a log can take, and
    // bans nobody.
    let r = Policy::builder("shadow_all")
        .limiter(
            Limiter::new(Dimension::Ip, [rule("1/1m")])
                .with_blocklist(BanRule::new(Duration::from_secs(600))),
        )
        .shadow(true)
        .build()
        .expect("a valid policy");
    assert!(r.is_shadow() && r.limiters()[0].is_shadow());
    assert_eq!(r.max_cost(), tollgate::MAX_LOG_COST);
    let who = ip(3);
    expect_shadow(&s.check(&r, &who, 1).await, None, &[(true, 0, 60_000)], &[]);
    expect_shadow(
        &s.check(&r, &who, 1).await,
        None,
        &[(false, 0, 60_000)],
        &["ip"],
    );
    expect_shadow(
        &s.check(&r, &who, 5).await,
        None,
        &[(false, 0, 60_000)],
        &["ip"],
    );
    let enforced = policy(
        "shadow_all_enforced",
        [Limiter::new(Dimension::Ip, [rule("9/1m")])],
    );
    let d = s.check(&enforced, &who, 1).await;
    assert_eq!(d.reason(), Reason::Ok, "a shadow limiter banned: {d:#?}");
}

/// Asserts whether a decision admitted, and each rule's `remaining`, in policy order.
#[track_caller]
fn expect_remaining(d: &NamedDecision, allowed: bool, remaining: &[u64]) {
    let got: Vec<u64> = d.rules().iter().map(|r| r.remaining).collect();
    assert_eq!(
        (d.allowed(), got.as_slice()),
        (allowed, remaining),
        "(allowed, remaining per rule) of {d:#?}"
    );
}

/// Scenario: refunds. With the check's receipt, each algorithm gives back exactly that check's
/// units; without one, the newest units of the current window; never below empty; never to a
/// window that has ended (which would admit more than the limit in the new one); never to a
/// shadow limiter that recorded nothing.
pub async fn refunds_give_back_what_a_check_charged<S: FullStore>(s: Subject<S>) {
    let gate = &s.gate;
    let sliding_window = rule("2/1m").with_algorithm(Algorithm::SlidingWindow);
    let p = policy(
        "refund",
        [Limiter::new(
            Dimension::Ip,
            [rule("2/1m"), fixed("2/1m"), gcra("2/1m"), sliding_window],
        )],
    );
    let who = ip(1);
    s.at(ms(0));
    let first = s.check(&p, &who, 1).await;
    expect_remaining(&first, true, &[1, 1, 1, 1]);
    assert!(first.receipt().is_some(), "an admission has a receipt");
    s.at(ms(1_000));
    let second = s.check(&p, &who, 1).await;
    expect_remaining(&second, true, &[0, 0, 0, 0]);
    s.at(ms(2_000));
    let denied = s.check(&p, &who, 1).await;
    expect_remaining(&denied, false, &[0, 0, 0, 0]);
    assert_eq!(denied.receipt(), None, "a denial records nothing");
    assert_eq!(
        s.peek(&p, &who, 0).await.receipt(),
        None,
        "a peek records nothing"
    );

    // The second check's units come back, exactly: the next check fits, then no more.
    gate.refund(&p, &who, 1, second.receipt().as_ref())
        .await
        .expect("refund");
    let third = s.check(&p, &who, 1).await;
    expect_remaining(&third, true, &[0, 0, 0, 0]);
    let gcra_reset = third.rules()[2].reset_after;
    assert_eq!(
        gcra_reset,
        ms(58_000),
        "GCRA's arrival time moved back by one interval"
    );
    expect_remaining(&s.check(&p, &who, 1).await, false, &[0, 0, 0, 0]);

    // Without a receipt: the newest unit of the current window.
    s.at(ms(3_000));
    gate.refund(&p, &who, 1, None).await.expect("refund");
    expect_remaining(&s.check(&p, &who, 1).await, true, &[0, 0, 0, 0]);
    expect_remaining(&s.check(&p, &who, 1).await, false, &[0, 0, 0, 0]);

    // Never below empty: a refund of what was never charged gives nothing extra.
    let fresh = ip(2);
    gate.refund(&p, &fresh, 5, None).await.expect("refund");
    expect_remaining(&s.check(&p, &fresh, 1).await, true, &[1, 1, 1, 1]);

    // A window that has ended is left alone: the refund does not take from the new window.
    let q = policy(
        "refund_late",
        [Limiter::new(Dimension::Ip, [fixed("2/1m")])],
    );
    let late = ip(3);
    s.at(ms(59_000));
    let old = s.check(&q, &late, 1).await;
    s.at(ms(61_000));
    expect_remaining(&s.check(&q, &late, 1).await, true, &[1]);
    gate.refund(&q, &late, 1, old.receipt().as_ref())
        .await
        .expect("refund");
    expect_remaining(&s.check(&q, &late, 1).await, true, &[0]);
    expect_remaining(&s.check(&q, &late, 1).await, false, &[0]);

    // A sliding log gives back the receipt's own entries, not the newest.
    let log = policy("refund_log", [Limiter::new(Dimension::Ip, [rule("2/1m")])]);
    let who = ip(5);
    s.at(ms(0));
    let a = s.check(&log, &who, 1).await;
    s.at(ms(10_000));
    expect_remaining(&s.check(&log, &who, 1).await, true, &[0]);
    gate.refund(&log, &who, 1, a.receipt().as_ref())
        .await
        .expect("refund");
    // At 65 s the entry of 10 s still counts (the refunded one of 0 s would have left anyway).
    s.at(ms(65_000));
    expect_remaining(&s.check(&log, &who, 1).await, true, &[0]);
    expect_remaining(&s.check(&log, &who, 1).await, false, &[0]);

    // A shadow limiter that would have denied recorded nothing, and gets nothing back.
    let r = policy(
        "refund_shadow",
        [
            Limiter::new(Dimension::Ip, [fixed("5/1m")]),
            Limiter::new(Dimension::Ip, [fixed("1/1m")])
                .with_name("trial")
                .with_shadow(true),
        ],
    );
    let who = ip(4);
    s.at(ms(120_000));
    assert!(!s.check(&r, &who, 1).await.shadow_denied());
    let over = s.check(&r, &who, 1).await;
    assert!(over.allowed() && over.shadow_denied());
    gate.refund(&r, &who, 1, over.receipt().as_ref())
        .await
        .expect("refund");
    let after = s.check(&r, &who, 1).await;
    assert!(
        after.shadow_denied(),
        "the trial limiter still holds its one unit: {after:#?}"
    );
    expect_remaining(&after, true, &[3, 0]);
}

/// Scenario: calendar windows. A day of Europe/Berlin runs from local midnight to local
/// midnight: from 23:00 UTC in winter, and on the day the clocks go forward (2100-03-28) for 23
/// hours only; `reset_after` and `retry_after` name the real boundary. A month of UTC is the
/// calendar month.
pub async fn calendar_windows_follow_the_zones_days<S: FullStore>(s: Subject<S>) {
    const HOUR: u64 = 3_600_000;
    const DAY: u64 = 24 * HOUR;
    let p = policy(
        "calendar",
        [Limiter::new(Dimension::Ip, [rule("2/1d@Europe/Berlin")])],
    );
    let who = ip(1);
    // START is 2100-01-01T00:00Z, 01:00 in Berlin: the day ends at 23:00 UTC.
    s.at(ms(0));
    expect(&s.check(&p, &who, 1).await, None, &[(true, 1, 23 * HOUR)]);
    expect(&s.check(&p, &who, 1).await, None, &[(true, 0, 23 * HOUR)]);
    expect(
        &s.check(&p, &who, 1).await,
        Some(23 * HOUR),
        &[(false, 0, 23 * HOUR)],
    );
    s.at(ms(23 * HOUR - 1));
    expect(&s.check(&p, &who, 1).await, Some(1), &[(false, 0, 1)]);
    s.at(ms(23 * HOUR));
    expect(&s.check(&p, &who, 1).await, None, &[(true, 1, DAY)]);

    // 2100-03-28, 01:00 in Berlin (00:00 UTC): the day began at 23:00 UTC and lasts 23 hours.
    s.at(ms(86 * DAY));
    expect(&s.check(&p, &who, 1).await, None, &[(true, 1, 22 * HOUR)]);
    s.at(ms(86 * DAY + 22 * HOUR - 1));
    expect(&s.check(&p, &who, 1).await, None, &[(true, 0, 1)]);
    expect(&s.check(&p, &who, 1).await, Some(1), &[(false, 0, 1)]);
    // The next day starts at 22:00 UTC (midnight in summer time) and lasts 24 hours.
    s.at(ms(86 * DAY + 22 * HOUR));
    let d = s.check(&p, &who, 1).await;
    expect(&d, None, &[(true, 1, DAY)]);
    // A refund returns the unit to the day it was counted in.
    s.gate
        .refund(&p, &who, 1, d.receipt().as_ref())
        .await
        .expect("refund");
    expect(&s.check(&p, &who, 1).await, None, &[(true, 1, DAY)]);

    // A calendar month of UTC: January has 31 days.
    let q = policy(
        "calendar_month",
        [Limiter::new(Dimension::Ip, [rule("1/1mo@UTC")])],
    );
    s.at(ms(0));
    expect(&s.check(&q, &who, 1).await, None, &[(true, 0, 31 * DAY)]);
    s.at(ms(31 * DAY - 1));
    expect(&s.check(&q, &who, 1).await, Some(1), &[(false, 0, 1)]);
    s.at(ms(31 * DAY));
    // February 2100 has 28 days (2100 is not a leap year).
    expect(&s.check(&q, &who, 1).await, None, &[(true, 0, 28 * DAY)]);
}

/// Scenario: concurrency leases. At most 2 in flight per user, leases of 60 s, beside a rate
/// limit: a refusal for lack of a slot spends no rate quota and a rate refusal takes no slot;
/// a release frees the slot at once (once); an extension renews it; a lease whose holder
/// vanished ends by itself; a lost lease cannot be extended.
pub async fn concurrency_leases_bound_what_is_in_flight<S: FullStore>(s: Subject<S>) {
    let gate = &s.gate;
    let p = policy(
        "leases",
        [
            Limiter::concurrent(Dimension::UserId, 2, ms(60_000)).expect("a valid limit"),
            Limiter::new(Dimension::UserId, [rule("5/1h")]).with_name("rate"),
        ],
    );
    let who = user("u1");
    s.at(ms(0));
    let a = s.check(&p, &who, 1).await;
    expect_remaining(&a, true, &[1, 4]);
    let b = s.check(&p, &who, 1).await;
    expect_remaining(&b, true, &[0, 3]);
    let busy = s.check(&p, &who, 1).await;
    expect_remaining(&busy, false, &[0, 3]);
    assert_eq!(busy.reason(), Reason::ConcurrencyLimited);
    assert_eq!(
        busy.retry_after(),
        Some(ms(60_000)),
        "the first lease ends then"
    );

    // A release frees the slot at once; the rate quota stays spent.
    gate.release_concurrent(&p, &who, &a.receipt().expect("a lease"))
        .await
        .expect("release");
    s.at(ms(1_000));
    let d = s.check(&p, &who, 1).await;
    expect_remaining(&d, true, &[0, 2]);
    // Releasing again frees nothing.
    gate.release_concurrent(&p, &who, &a.receipt().expect("a lease"))
        .await
        .expect("release");
    let busy = s.check(&p, &who, 1).await;
    expect_remaining(&busy, false, &[0, 2]);
    assert_eq!(
        busy.retry_after(),
        Some(ms(59_000)),
        "b's lease, from 0 s, ends first"
    );

    // An extension renews b's lease from 30 s; d's (from 1 s) runs out at 61 s.
    s.at(ms(30_000));
    let b2 = gate
        .extend_concurrent(&p, &who, &b.receipt().expect("a lease"))
        .await
        .expect("extend")
        .expect("b's lease is live");
    s.at(ms(61_000));
    expect_remaining(&s.check(&p, &who, 1).await, true, &[0, 1]);
    // d's lease ran out: its receipt names no lease.
    let renewed = gate
        .extend_concurrent(&p, &who, &d.receipt().expect("a receipt"))
        .await
        .expect("extend");
    assert_eq!(renewed, None, "a lost lease is not renewed");
    // Any receipt of a check names its lease, whichever renewal it came from: a renewal asked
    // again with the receipt from before the last one (its answer lost, say) renews it, and a
    // release by an older receipt than the latest releases it.
    gate.extend_concurrent(&p, &who, &b.receipt().expect("a lease"))
        .await
        .expect("extend")
        .expect("b's lease, renewed at 30 s, is live");
    expect_remaining(&s.check(&p, &who, 1).await, false, &[0, 1]);
    gate.release_concurrent(&p, &who, &b2)
        .await
        .expect("release");
    expect_remaining(&s.check(&p, &who, 1).await, true, &[0, 0]);
    // A refund without a receipt gives rate units back, never a slot (a slot is its lease's).
    gate.refund(&p, &who, 1, None).await.expect("refund");
    let busy = s.check(&p, &who, 1).await;
    expect_remaining(&busy, false, &[0, 1]);
    assert_eq!(busy.reason(), Reason::ConcurrencyLimited);

    // A rate refusal takes no slot.
    let q = policy(
        "leases_rate",
        [
            Limiter::concurrent(Dimension::UserId, 3, ms(60_000)).expect("a valid limit"),
            Limiter::new(Dimension::UserId, [rule("1/1h")]).with_name("rate"),
        ],
    );
    let who = user("u2");
    expect_remaining(&s.check(&q, &who, 1).await, true, &[2, 0]);
    let refused = s.check(&q, &who, 1).await;
    expect_remaining(&refused, false, &[2, 0]);
    assert_eq!(refused.reason(), Reason::RateLimited);
}

/// Scenario: a refund of part of a lease's units frees those slots and leaves the lease with
/// the rest: it is still renewed and released by the check's receipt, and neither moves nor
/// frees another check's units recorded at the same instant.
pub async fn a_partial_refund_keeps_the_rest_of_a_lease<S: FullStore>(s: Subject<S>) {
    let gate = &s.gate;
    let p = policy(
        "partial_leases",
        [Limiter::concurrent(Dimension::UserId, 3, ms(60_000)).expect("a valid limit")],
    );
    let who = user("u1");
    s.at(ms(0));
    let a = s.check(&p, &who, 2).await;
    expect_remaining(&a, true, &[1]);
    let a_receipt = a.receipt().expect("a lease");
    // b's unit is recorded at a's instant.
    expect_remaining(&s.check(&p, &who, 1).await, true, &[0]);
    gate.refund(&p, &who, 1, Some(&a_receipt))
        .await
        .expect("refund");
    expect_remaining(&s.check(&p, &who, 1).await, true, &[0]);
    expect_remaining(&s.check(&p, &who, 1).await, false, &[0]);

    // a's one unit left is renewed from 10 s; b's and c's, from 0 s, end at 60 s.
    s.at(ms(10_000));
    let renewed = gate
        .extend_concurrent(&p, &who, &a_receipt)
        .await
        .expect("extend")
        .expect("a's lease keeps its other unit");
    s.at(ms(61_000));
    let d = s.check(&p, &who, 2).await;
    expect_remaining(&d, true, &[0]);
    let busy = s.check(&p, &who, 1).await;
    expect_remaining(&busy, false, &[0]);
    assert_eq!(
        busy.retry_after(),
        Some(ms(9_000)),
        "a's unit, renewed at 10 s, ends first"
    );

    // The release frees a's last unit, once; a refund by the same receipt frees no more.
    gate.release_concurrent(&p, &who, &renewed)
        .await
        .expect("release");
    expect_remaining(&s.check(&p, &who, 1).await, true, &[0]);
    gate.release_concurrent(&p, &who, &a_receipt)
        .await
        .expect("release");
    gate.refund(&p, &who, 2, Some(&a_receipt))
        .await
        .expect("refund");
    expect_remaining(&s.check(&p, &who, 1).await, false, &[0]);

    // A check of no units is admitted when every slot is taken, and holds no lease.
    let none = s.check(&p, &who, 0).await;
    expect_remaining(&none, true, &[0]);
    assert_eq!(none.receipt(), None, "no units, no lease");

    // A renewal moves all a lease has left, whatever units its receipt names: a receipt of
    // the same check naming fewer (or none) renews the lease whole, and its release frees it
    // whole, not another check's unit.
    let who = user("u2");
    s.at(ms(100_000));
    let e = s.check(&p, &who, 2).await;
    let e_receipt = e.receipt().expect("a lease");
    s.at(ms(101_000));
    expect_remaining(&s.check(&p, &who, 1).await, true, &[0]);
    s.at(ms(102_000));
    for units in [1, 0] {
        let named = receipt_naming(&e_receipt, units);
        gate.extend_concurrent(&p, &who, &named)
            .await
            .expect("extend")
            .expect("e's lease is live");
    }
    gate.release_concurrent(&p, &who, &e_receipt)
        .await
        .expect("release");
    expect_remaining(&s.check(&p, &who, 1).await, true, &[1]);
    expect_remaining(&s.check(&p, &who, 1).await, true, &[0]);
}

/// `receipt`, naming `units` units instead of its own (as a caller may write one by hand).
fn receipt_naming(receipt: &tollgate::Receipt, units: u64) -> tollgate::Receipt {
    let text = receipt.to_string();
    let (id, rest) = text.split_once('.').expect("id.units.at");
    let (_, at) = rest.split_once('.').expect("id.units.at");
    format!("{id}.{units}.{at}").parse().expect("a receipt")
}

#[track_caller]
fn assert_missing(result: Result<Decision, CheckError>, limiter: &str, dimension: &str) {
    match result {
        Err(CheckError::MissingDimension {
            limiter: l,
            dimension: d,
        }) => {
            assert_eq!((l.as_str(), d.as_str()), (limiter, dimension));
        }
        other => panic!("expected MissingDimension({limiter}, {dimension}), got {other:?}"),
    }
}

/// A check's decision is its peek's, but for the receipt of what it recorded.
#[track_caller]
fn assert_same_as_peek(checked: &NamedDecision, peeked: &NamedDecision) {
    assert!(
        checked.receipt().is_some() == checked.allowed(),
        "{checked:#?}"
    );
    assert_eq!(
        peeked.receipt(),
        None,
        "a peek records nothing: {peeked:#?}"
    );
    assert_eq!(
        (
            checked.allowed(),
            checked.reason(),
            checked.retry_after(),
            checked.rules()
        ),
        (
            peeked.allowed(),
            peeked.reason(),
            peeked.retry_after(),
            peeked.rules()
        ),
        "check differs from peek"
    );
}

/// Scenario 9: an identity lacking a dimension is an error, and the check records nothing in
/// the limiters it could have counted.
pub async fn missing_dimension_records_nothing<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "needs_user",
        [
            Limiter::new(Dimension::Ip, [rule("5/1m")]),
            Limiter::new(Dimension::UserId, [rule("5/1m")]),
        ],
    );
    s.at(ms(0));
    for _ in 0..3 {
        assert_missing(s.gate.check(&p, &ip(1), 1).await, "user_id", "user_id");
    }
    assert_missing(s.gate.peek(&p, &ip(1), 1).await, "user_id", "user_id");
    assert!(
        s.gate
            .reset(&p, &ip(1))
            .await
            .expect_err("reset needs every dimension too")
            .is_missing_dimension()
    );
    assert_missing(s.gate.check(&p, &user("u"), 1).await, "ip", "ip");
    expect(
        &s.check(&p, &ip(1).with_user_id("u"), 1).await,
        None,
        &[(true, 4, 60_000), (true, 4, 60_000)],
    );

    let h = policy(
        "needs_header",
        [
            Limiter::new(Dimension::Ip, [fixed("5/1m"), gcra("5/1m")]),
            Limiter::new(Dimension::Header("x-api-key".into()), [rule("5/1m")]),
        ],
    );
    assert_missing(
        s.gate.check(&h, &ip(1), 1).await,
        "header:x-api-key",
        "header:x-api-key",
    );
    expect(
        &s.check(&h, &ip(1).with_header("X-Api-Key", "k"), 1).await,
        None,
        &[(true, 4, 60_000), (true, 4, 12_000), (true, 4, 60_000)],
    );
}

/// From a state where `cost` is denied now, with `retry_after == want`: the request is still
/// denied 1 ms before that instant (with 1 ms left to wait) and admitted exactly at it.
async fn admitted_exactly_at_retry_after<S: FullStore>(
    s: &Subject<S>,
    p: &Policy,
    who: &Identity,
    cost: u64,
    want: Duration,
) {
    let now = Duration::from_micros(s.clock.now_us());
    let d = s.check(p, who, cost).await;
    assert_eq!(d.retry_after(), Some(want), "{d:#?}");
    s.clock.set(now + want - ms(1));
    let d = s.check(p, who, cost).await;
    assert_eq!(d.retry_after(), Some(ms(1)), "1 ms early: {d:#?}");
    s.clock.set(now + want);
    let d = s.check(p, who, cost).await;
    assert!(d.allowed(), "at now + retry_after: {d:#?}");
}

/// Scenario 10: `retry_after` is exact for every algorithm, with costs and across limiters:
/// the request is admitted at `now + retry_after` and not a millisecond earlier.
pub async fn retry_after_is_exact<S: FullStore>(s: Subject<S>) {
    let log = policy("retry_log", [Limiter::new(Dimension::Ip, [rule("2/3s")])]);
    let who = ip(1);
    for at in [0, 1234] {
        s.at(ms(at));
        assert!(s.check(&log, &who, 1).await.allowed());
    }
    s.at(ms(1500));
    admitted_exactly_at_retry_after(&s, &log, &who, 1, ms(1500)).await;
    // Admitted at 3 s; the entry of 1.234 s leaves next.
    admitted_exactly_at_retry_after(&s, &log, &who, 1, ms(1234)).await;

    let costly = policy("retry_cost", [Limiter::new(Dimension::Ip, [rule("3/2s")])]);
    for at in [0, 500, 1000] {
        s.at(ms(at));
        assert!(s.check(&costly, &who, 1).await.allowed());
    }
    // Two units need the entries of 0 and 0.5 s gone.
    s.at(ms(1200));
    admitted_exactly_at_retry_after(&s, &costly, &who, 2, ms(1300)).await;

    // START is 6 s into an epoch-aligned 7 s window, so windows start at 1 s, 8 s, 15 s, ...
    let window = policy(
        "retry_fixed",
        [Limiter::new(Dimension::Ip, [fixed("3/7s")])],
    );
    s.at(ms(1234));
    for _ in 0..3 {
        assert!(s.check(&window, &who, 1).await.allowed());
    }
    admitted_exactly_at_retry_after(&s, &window, &who, 1, ms(6766)).await;
    for _ in 0..2 {
        assert!(s.check(&window, &who, 1).await.allowed());
    }
    admitted_exactly_at_retry_after(&s, &window, &who, 1, ms(7000)).await;

    // One unit every 500 ms.
    let spaced = policy(
        "retry_gcra",
        [Limiter::new(Dimension::Ip, [gcra("3/1500ms")])],
    );
    s.at(ms(0));
    for _ in 0..3 {
        assert!(s.check(&spaced, &who, 1).await.allowed());
    }
    s.at(ms(777));
    assert!(s.check(&spaced, &who, 1).await.allowed());
    admitted_exactly_at_retry_after(&s, &spaced, &who, 1, ms(223)).await;
    admitted_exactly_at_retry_after(&s, &spaced, &who, 1, ms(500)).await;

    // Two limiters deny; the later of their instants counts.
    let both = policy(
        "retry_both",
        [
            Limiter::new(Dimension::Ip, [rule("1/3s")]),
            Limiter::new(Dimension::UserId, [gcra("1/5s")]),
        ],
    );
    let who = ip(2).with_user_id("u");
    s.at(ms(0));
    assert!(s.check(&both, &who, 1).await.allowed());
    s.at(ms(1000));
    admitted_exactly_at_retry_after(&s, &both, &who, 1, ms(4000)).await;
}

/// Scenario 11: identities and policies that differ never share counters, however their text
/// is built (separators, braces, escapes, empty, non-ASCII, 10 KB values).
pub async fn keys_never_collide<S: FullStore>(s: Subject<S>) {
    s.at(ms(0));
    let login = policy("login", [Limiter::new(Dimension::UserName, [rule("1/1m")])]);
    let long = "x".repeat(10_000);
    let names = [
        "a".to_owned(),
        "a:b".into(),
        "b".into(),
        "a%3Ab".into(),
        "a%3ab".into(),
        "a%".into(),
        "%".into(),
        "{a}".into(),
        "a}".into(),
        "{a".into(),
        "}{".into(),
        String::new(),
        " ".into(),
        "a|b".into(),
        "a b".into(),
        "a\u{0}b".into(),
        "\u{e9}".into(),
        "e\u{301}".into(),
        "#abc".into(),
        "x".repeat(128),
        "x".repeat(129),
        long.clone(),
        format!("{long}y"),
        format!("y{long}"),
        format!("{long}:{long}"),
    ];
    for name in &names {
        let who = Identity::new().with_user_name(name.as_str());
        let d = s.check(&login, &who, 1).await;
        assert!(
            d.allowed(),
            "{name:?} shares a counter with an earlier name"
        );
        assert!(
            !s.check(&login, &who, 1).await.allowed(),
            "{name:?} is not counted"
        );
    }

    // Scope and limiter-name tricks aimed at `login` / user_name / "a:b".
    let shifted_scope = policy(
        "login:user_name:a",
        [Limiter::new(Dimension::UserName, [rule("1/1m")])],
    );
    let shifted_name = policy(
        "login",
        [Limiter::new(Dimension::UserName, [rule("1/1m")]).with_name("user_name:a")],
    );
    let braces = policy(
        "login}:{user_name",
        [Limiter::new(Dimension::UserName, [rule("1/1m")])],
    );
    for (p, name) in [
        (&shifted_scope, "b"),
        (&shifted_name, "b"),
        (&braces, "a:b"),
        (&shifted_scope, ""),
    ] {
        let who = Identity::new().with_user_name(name);
        let scope = p.scope();
        assert!(
            s.check(p, &who, 1).await.allowed(),
            "{scope:?}/{name:?} shares a counter"
        );
        assert!(!s.check(p, &who, 1).await.allowed(), "{scope:?}/{name:?}");
    }

    // The same limiter and identity under two scopes, and two limiter names under one scope.
    let who = ip(1);
    for scope in ["send_sms", "send_email", "send_sms:ip"] {
        let p = policy(scope, [Limiter::new(Dimension::Ip, [rule("1/1m")])]);
        assert!(s.check(&p, &who, 1).await.allowed(), "scope {scope:?}");
        assert!(!s.check(&p, &who, 1).await.allowed(), "scope {scope:?}");
    }
    for name in ["first", "second"] {
        let p = policy(
            "send_push",
            [Limiter::new(Dimension::Ip, [rule("1/1m")]).with_name(name)],
        );
        assert!(s.check(&p, &who, 1).await.allowed(), "limiter {name:?}");
    }
    // Header dimensions whose name and value could be re-split.
    for (header, value) in [("x-a", "b:c"), ("x-a:b", "c"), ("x-a", "b%3Ac")] {
        let p = policy(
            "headers",
            [Limiter::new(
                Dimension::Header(header.into()),
                [fixed("1/1m")],
            )],
        );
        let who = Identity::new().with_header(header, value);
        assert!(s.check(&p, &who, 1).await.allowed(), "{header}: {value}");
        assert!(!s.check(&p, &who, 1).await.allowed(), "{header}: {value}");
    }
    // Group names (see `check_group`) with the same tricks.
    for name in ["g", "g:l", "g}", "{g}", "k:g"] {
        let d = s.gate.check_group(name, &[gcra("1/1m")], 1).await;
        assert!(d.allowed(), "group {name:?} shares a counter");
        let d = s.gate.check_group(name, &[gcra("1/1m")], 1).await;
        assert!(!d.allowed(), "group {name:?}");
    }
}

fn limiter_names(d: &NamedDecision) -> Vec<String> {
    d.rules().iter().map(|r| r.limiter.to_string()).collect()
}

/// Scenario 12: the seed's utility API. `check_group` counts all rules on one key (sliding-log
/// rules share one log, whatever rule set a call names); `check_single` counts every rule on a
/// key of its own (name and rule), so a rule is shared only with calls naming the same rule.
/// Both are all-or-nothing.
pub async fn check_group_and_check_single<S: FullStore>(s: Subject<S>) {
    s.at(ms(0));
    let rules = [rule("2/10s"), rule("3/1m")];
    let gate = &s.gate;

    let d = gate.check_group("g", &rules, 1).await;
    expect(&d, None, &[(true, 1, 10_000), (true, 2, 60_000)]);
    assert_eq!(limiter_names(&d), ["g", "g"]);
    let d = gate.check_group("g", &rules, 1).await;
    expect(&d, None, &[(true, 0, 10_000), (true, 1, 60_000)]);
    let d = gate.check_group("g", &rules, 1).await;
    expect(&d, Some(10_000), &[(false, 0, 10_000), (true, 1, 60_000)]);
    // Other rule sets on the same name count the same log.
    let d = gate.check_group("g", &[rule("3/1m")], 1).await;
    expect(&d, None, &[(true, 0, 60_000)]);
    let d = gate.check_group("g", &[rule("5/1m")], 1).await;
    expect(&d, None, &[(true, 1, 60_000)]);
    let d = gate.check_group("g2", &[rule("3/1m")], 1).await;
    expect(&d, None, &[(true, 2, 60_000)]);
    // A rule listed twice counts once.
    let d = gate
        .check_group("dup", &[rule("1/1m"), rule("1/1m")], 1)
        .await;
    expect(&d, None, &[(true, 0, 60_000)]);
    let d = gate
        .check_group("dup", &[rule("1/1m"), rule("1/1m")], 1)
        .await;
    expect(&d, Some(60_000), &[(false, 0, 60_000)]);
    // Costs, and a cost no rule can ever admit.
    let d = gate
        .check_group("g3", &[fixed("2/1m"), gcra("4/1m")], 3)
        .await;
    assert_eq!(d.reason(), Reason::CostExceedsLimit);
    assert_eq!(d.retry_after(), None);
    assert_eq!(denied_rules(&d), ["g3:2/1m/fixed_window"]);
    let d = gate
        .check_group("g3", &[fixed("2/1m"), gcra("4/1m")], 2)
        .await;
    expect(&d, None, &[(true, 0, 60_000), (true, 2, 30_000)]);

    let d = gate.check_single("s", &rules, 1).await;
    expect(&d, None, &[(true, 1, 10_000), (true, 2, 60_000)]);
    assert_eq!(limiter_names(&d), ["2/10s", "3/1m"]);
    let d = gate.check_single("s", &rules, 1).await;
    expect(&d, None, &[(true, 0, 10_000), (true, 1, 60_000)]);
    let d = gate.check_single("s", &rules, 1).await;
    expect(&d, Some(10_000), &[(false, 0, 10_000), (true, 1, 60_000)]);
    // The 3/1m rule's own key holds the two admissions; a 5/1m rule starts empty.
    let d = gate.check_single("s", &[rule("3/1m")], 1).await;
    expect(&d, None, &[(true, 0, 60_000)]);
    let d = gate.check_single("s", &[rule("5/1m")], 1).await;
    expect(&d, None, &[(true, 4, 60_000)]);
    let d = gate
        .check_single("s2", &[fixed("2/1m"), gcra("4/1m")], 3)
        .await;
    assert_eq!(d.reason(), Reason::CostExceedsLimit);
    assert_eq!(denied_rules(&d), ["2/1m fixed_window:2/1m/fixed_window"]);
}

/// Scenario 12b: `check_single` treats the same limit and window counted by two algorithms as
/// two rules, each enforced on its own key.
pub async fn check_single_keeps_rules_that_differ_only_in_algorithm<S: FullStore>(s: Subject<S>) {
    s.at(ms(0));
    let gate = &s.gate;
    let two_ways = [rule("2/10s"), fixed("2/10s")];
    let d = gate.check_single("t", &two_ways, 1).await;
    expect(&d, None, &[(true, 1, 10_000), (true, 1, 10_000)]);
    assert_eq!(limiter_names(&d), ["2/10s", "2/10s fixed_window"]);
    let d = gate.check_single("t", &[fixed("2/10s")], 1).await;
    expect(&d, None, &[(true, 0, 10_000)]);
    let d = gate.check_single("t", &two_ways, 1).await;
    expect(&d, Some(10_000), &[(true, 1, 10_000), (false, 0, 10_000)]);
}

/// Scenario 14: after a quiet window every algorithm offers its full quota again, exactly at
/// the boundary, even though stale state may still sit in the store.
pub async fn quota_refills_after_a_quiet_window<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "quiet",
        [Limiter::new(
            Dimension::Ip,
            [rule("2/1h"), fixed("2/1h"), gcra("2/1h")],
        )],
    );
    let who = ip(1);
    let hour = 3_600_000;
    s.at(ms(0));
    for _ in 0..2 {
        assert!(s.check(&p, &who, 1).await.allowed());
    }
    expect(
        &s.check(&p, &who, 1).await,
        Some(hour),
        &[(false, 0, hour), (false, 0, hour), (false, 0, hour)],
    );
    s.at(ms(hour - 1));
    expect(
        &s.peek(&p, &who, 0).await,
        None,
        &[(true, 0, 1), (true, 0, 1), (true, 1, 1)],
    );
    s.at(ms(hour));
    expect(
        &s.peek(&p, &who, 0).await,
        None,
        &[(true, 2, 0), (true, 2, 0), (true, 2, 0)],
    );
    let fresh = [(true, 1, hour), (true, 1, hour), (true, 1, hour / 2)];
    expect(&s.check(&p, &who, 1).await, None, &fresh);
    s.at(ms(30 * 24 * hour));
    expect(&s.check(&p, &who, 1).await, None, &fresh);
}

/// Scenario 15: a denial carries the message of the first limiter that denied it; an
/// admission carries none.
pub async fn denial_names_the_first_denying_limiter<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "messages",
        [
            Limiter::new(Dimension::Ip, [rule("1/1m")]).with_message("slow down, address"),
            Limiter::new(Dimension::UserId, [gcra("1/1m")]).with_message("slow down, user"),
            Limiter::new(Dimension::Global, [rule("100/1m")]).with_message("everyone, slow down"),
        ],
    );
    s.at(ms(0));
    let d = s.check(&p, &ip(1).with_user_id("u"), 1).await;
    assert!(d.allowed());
    assert_eq!(d.message(), None);
    let d = s.check(&p, &ip(1).with_user_id("u"), 1).await;
    assert_eq!(d.message(), Some("slow down, address"));
    assert_eq!(
        denied_rules(&d),
        ["ip:1/1m/sliding_log", "user_id:1/1m/gcra"]
    );
    let d = s.check(&p, &ip(2).with_user_id("u"), 1).await;
    assert_eq!(d.message(), Some("slow down, user"));
    let d = s.check(&p, &ip(3).with_user_id("v"), 1).await;
    assert!(d.allowed());
    assert_eq!(d.message(), None);
}

fn warnings(d: &NamedDecision) -> Vec<String> {
    d.warnings()
        .map(|r| {
            format!(
                "{}:{}/{}:{}",
                r.limiter,
                r.rule,
                r.rule.algorithm(),
                r.remaining
            )
        })
        .collect()
}

/// Warnings: an admission that brings a rule of a warning limiter to its fraction names the
/// rule, on every algorithm; a shadow limiter and a limiter without a warning never warn; a
/// denial warns of nothing.
pub async fn warnings_name_the_rules_past_their_fraction<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "warn",
        [
            Limiter::new(Dimension::Ip, [rule("10/1m"), gcra("10/1m")]).with_warning(0.8),
            Limiter::new(Dimension::UserId, [rule("9/1m")]),
            Limiter::new(Dimension::Ip, [rule("100/1m")])
                .with_name("trial")
                .with_shadow(true)
                .with_warning(0.01),
        ],
    );
    let who = ip(1).with_user_id("u1");
    s.at(ms(0));
    let d = s.check(&p, &who, 7).await;
    assert!(d.allowed() && warnings(&d).is_empty(), "{d:#?}");
    // 8 of 10: both rules warn; the user's 8 of 9 has no warning to give.
    let d = s.check(&p, &who, 1).await;
    assert_eq!(
        warnings(&d),
        ["ip:10/1m/sliding_log:2", "ip:10/1m/gcra:2"],
        "{d:#?}"
    );
    // Denied (the user's 9): nothing in warning, and nothing counted.
    let d = s.check(&p, &who, 2).await;
    assert!(!d.allowed() && warnings(&d).is_empty(), "{d:#?}");

    let p = policy(
        "warn_fixed",
        [Limiter::new(Dimension::Ip, [fixed("5/1m")]).with_warning(0.8)],
    );
    let d = s.check(&p, &who, 3).await;
    assert!(warnings(&d).is_empty(), "{d:#?}");
    let d = s.check(&p, &who, 1).await;
    assert_eq!(warnings(&d), ["ip:5/1m/fixed_window:1"], "{d:#?}");
    // A new window: below the warning again.
    s.at(ms(60_000));
    let d = s.check(&p, &who, 1).await;
    assert!(d.allowed() && warnings(&d).is_empty(), "{d:#?}");
}

/// Settlements: a check of an estimate, settled at a larger cost, leaves a debt that denies
/// the next checks for exactly the time that pays it, on every algorithm (GCRA: the debt's
/// emission intervals; a fixed window: to its end; a sliding log: until the debt's entries
/// leave; a sliding window: until the charged window's weight has faded enough); settled at a
/// smaller cost, the difference comes back.
pub async fn settlements_charge_debts_and_give_back<S: FullStore>(s: Subject<S>) {
    let settle = |p: Policy, who: Identity, estimate: u64, cost: u64| {
        let s = &s;
        async move {
            let d = s.check(&p, &who, estimate).await;
            assert!(d.allowed(), "{d:#?}");
            let receipt = d.receipt().expect("an admission is recorded");
            s.gate()
                .settle(&p, &who, &receipt, cost)
                .await
                .expect("the store settles")
        }
    };
    // GCRA, 10/1m: 6 s a unit, 60 s of burst. 2 checked, 15 spent: the arrival time is 90 s
    // ahead, and a unit fits once it is 54 s ahead.
    let gcra_p = policy(
        "settle_gcra",
        [Limiter::new(Dimension::Ip, [gcra("10/1m")])],
    );
    s.at(ms(0));
    assert_eq!(
        settle(gcra_p.clone(), ip(1), 2, 15).await,
        Settlement::Charged(13)
    );
    let d = s.check(&gcra_p, &ip(1), 1).await;
    assert_eq!(d.retry_after(), Some(ms(36_000)), "{d:#?}");
    s.at(ms(36_000));
    assert!(s.check(&gcra_p, &ip(1), 1).await.allowed());

    // A fixed window, 10/1m: 15 counted, denied to the window's end.
    let fixed_p = policy(
        "settle_fixed",
        [Limiter::new(Dimension::Ip, [fixed("10/1m")])],
    );
    s.at(ms(60_000));
    assert_eq!(
        settle(fixed_p.clone(), ip(2), 2, 15).await,
        Settlement::Charged(13)
    );
    s.at(ms(70_000));
    let d = s.check(&fixed_p, &ip(2), 1).await;
    assert_eq!(d.retry_after(), Some(ms(50_000)), "{d:#?}");
    s.at(ms(120_000));
    expect(
        &s.check(&fixed_p, &ip(2), 1).await,
        None,
        &[(true, 9, 60_000)],
    );

    // A sliding log, 10/1m: 15 entries at 120 s, all leaving at 180 s.
    let log_p = policy("settle_log", [Limiter::new(Dimension::Ip, [rule("10/1m")])]);
    assert_eq!(
        settle(log_p.clone(), ip(3), 2, 15).await,
        Settlement::Charged(13)
    );
    s.at(ms(150_000));
    let d = s.check(&log_p, &ip(3), 1).await;
    assert_eq!(d.retry_after(), Some(ms(30_000)), "{d:#?}");
    s.at(ms(180_000));
    expect(
        &s.check(&log_p, &ip(3), 1).await,
        None,
        &[(true, 9, 60_000)],
    );

    // A sliding window, 10/1m: 15 in the window from 180 s; in the next, a unit fits once
    // 15 * (60 - e) / 60 + 1 <= 10, 24 s into it.
    let sw_p = policy(
        "settle_sliding",
        [Limiter::new(
            Dimension::Ip,
            [rule("10/1m").with_algorithm(Algorithm::SlidingWindow)],
        )],
    );
    assert_eq!(
        settle(sw_p.clone(), ip(4), 2, 15).await,
        Settlement::Charged(13)
    );
    let d = s.check(&sw_p, &ip(4), 1).await;
    assert_eq!(d.retry_after(), Some(ms(84_000)), "{d:#?}");
    s.at(ms(264_000));
    assert!(s.check(&sw_p, &ip(4), 1).await.allowed());

    // Smaller than the estimate: the difference comes back; equal: nothing happens.
    let back_p = policy(
        "settle_back",
        [Limiter::new(Dimension::Ip, [rule("10/1m")])],
    );
    assert_eq!(
        settle(back_p.clone(), ip(5), 8, 3).await,
        Settlement::Refunded(5)
    );
    assert_eq!(settle(back_p.clone(), ip(5), 2, 2).await, Settlement::Exact);
    expect(
        &s.peek(&back_p, &ip(5), 0).await,
        None,
        &[(true, 5, 60_000)],
    );

    // A concurrency slot is not the settlement's: the rate rule gets its units back, the slot
    // stays held.
    let slot_p = policy(
        "settle_slot",
        [
            Limiter::concurrent(Dimension::Ip, 1, ms(300_000))
                .expect("a valid concurrency limit")
                .with_name("slot"),
            Limiter::new(Dimension::Ip, [rule("10/1m")]),
        ],
    );
    assert_eq!(
        settle(slot_p.clone(), ip(6), 1, 0).await,
        Settlement::Refunded(1)
    );
    let d = s.check(&slot_p, &ip(6), 1).await;
    assert_eq!(d.reason(), Reason::ConcurrencyLimited, "{d:#?}");
    let rate: Vec<u64> = d.rules().iter().map(|r| r.remaining).collect();
    assert_eq!(rate, [0, 10], "the rate rule holds nothing: {d:#?}");
}

/// Waiting: past its burst, a GCRA rule admits a request whose unit conforms within the
/// delay it may wait, each waiter at its own place in the schedule (due one emission interval
/// after the one before), never more than the rule allows by the time they are due; past the
/// delay it refuses, saying when one more would fit; a waiter that gives up gives its place
/// back.
pub async fn waiters_are_admitted_in_order_never_over_the_limit<S: FullStore>(s: Subject<S>) {
    let p = policy("wait", [Limiter::new(Dimension::Ip, [gcra("10/1m")])]);
    let who = ip(1);
    s.at(ms(0));
    for _ in 0..10 {
        assert!(s.check(&p, &who, 1).await.allowed());
    }
    let within = |delay_ms: u64| {
        let s = &s;
        let (p, who) = (&p, &who);
        async move {
            s.gate()
                .check_within(p, who, 1, ms(delay_ms))
                .await
                .expect("the identity carries every dimension")
        }
    };
    // 6 s a unit: due at 6, 12 and 18 s; a fourth would be due at 24 s, past 20.
    let mut waiters = Vec::new();
    for due_s in [6, 12, 18] {
        let d = within(20_000).await;
        assert!(d.allowed(), "{d:#?}");
        assert_eq!(d.due(&p), Some(ms(due_s * 1000)), "{d:#?}");
        assert_eq!(d.remaining(), Some(0), "nothing more fits now");
        waiters.push(d);
    }
    let d = within(20_000).await;
    assert!(!d.allowed(), "{d:#?}");
    assert_eq!(
        d.retry_after(),
        Some(ms(4_000)),
        "then it is within 20 s: {d:#?}"
    );
    // A plain check waits behind them all.
    let d = s.check(&p, &who, 1).await;
    assert_eq!(d.retry_after(), Some(ms(24_000)), "{d:#?}");
    // The last waiter gives up: its place is the next one's.
    let last = waiters.pop().expect("three waiters");
    s.gate()
        .refund(&p, &who, 1, last.receipt().as_ref())
        .await
        .expect("the store refunds");
    let d = s.check(&p, &who, 1).await;
    assert_eq!(d.retry_after(), Some(ms(18_000)), "{d:#?}");
    // Due: the first waiter's time; a plain check at 18 s is the next admitted.
    s.at(ms(18_000));
    assert!(s.check(&p, &who, 1).await.allowed());
    assert!(!s.check(&p, &who, 1).await.allowed());
}

/// The limit each rule of `d` was counted by.
fn limits(d: &NamedDecision) -> Vec<u64> {
    d.rules().iter().map(|r| r.rule.limit()).collect()
}

/// Scenario: per-identity overrides. A limit raised mid-window admits exactly up to the new
/// limit on the counts so far (fixed window, sliding log, GCRA's schedule); one lowered denies
/// past it; other identities keep the configured limits; a refund gives back by the override's
/// interval; removal and expiry bring the configured limits back; an override made for other
/// rules (the deployment changed them) is ignored; the listing shows the live ones.
pub async fn overrides_set_limits_per_identity<S: FullStore>(s: Subject<S>) {
    let takes = |name: &str, r: Rule| {
        policy(
            name,
            [Limiter::new(Dimension::UserId, [r]).with_overrides(true)],
        )
    };
    let raise = |p: Policy, who: Identity, to: &'static str, ttl: Option<Duration>| {
        let s = &s;
        async move {
            s.gate()
                .set_override(&p, "user_id", &who, &[rule(to)], ttl)
                .await
                .expect("the store keeps overrides")
        }
    };
    s.at(ms(0));
    for (p, name) in [
        (takes("ovr_fixed", fixed("5/1m")), "fixed"),
        (takes("ovr_log", rule("5/1m")), "log"),
    ] {
        let (a, b) = (user(&format!("{name}-a")), user(&format!("{name}-b")));
        s.at(ms(0));
        assert!(s.check(&p, &a, 5).await.allowed());
        assert!(s.check(&p, &b, 5).await.allowed());
        assert!(!s.check(&p, &a, 1).await.allowed());
        s.at(ms(10_000));
        raise(p.clone(), a.clone(), "8/1m", None).await;
        // The 5 used count: 3 more, no more.
        let d = s.check(&p, &a, 3).await;
        assert!(d.allowed(), "{name}: {d:#?}");
        assert_eq!((d.remaining(), limits(&d)), (Some(0), vec![8]), "{name}");
        let d = s.check(&p, &a, 1).await;
        assert!(!d.allowed(), "{name}: {d:#?}");
        assert_eq!(
            limits(&d),
            [8],
            "{name}: the denial names the override's limit"
        );
        // Another identity keeps the configured limit.
        let d = s.check(&p, &b, 1).await;
        assert!(!d.allowed(), "{name}: {d:#?}");
        assert_eq!(limits(&d), [5], "{name}");
        // Removed: the configured limit again, on the same counts.
        assert!(
            s.gate()
                .remove_override(&p, "user_id", &a)
                .await
                .expect("the store removes overrides")
        );
        let d = s.check(&p, &a, 1).await;
        assert_eq!((d.allowed(), limits(&d)), (false, vec![5]), "{name}");
        // Once the 8 have left (the log's last at 10 s): 5 again.
        s.at(ms(70_000));
        assert!(s.check(&p, &a, 5).await.allowed(), "{name}");
        assert!(!s.check(&p, &a, 1).await.allowed(), "{name}");
    }

    // GCRA, 6/1m (10 s a unit) raised to 12/1m (5 s a unit) 10 s after 6 were used: the
    // arrival time is 50 s ahead, so 2 more fit in the 60 s of burst, then one every 5 s.
    let p = takes("ovr_gcra", gcra("6/1m"));
    let who = user("gcra");
    s.at(ms(100_000));
    assert!(s.check(&p, &who, 6).await.allowed());
    s.at(ms(110_000));
    raise(p.clone(), who.clone(), "12/1m", None).await;
    let d = s.check(&p, &who, 2).await;
    assert!(d.allowed(), "{d:#?}");
    let receipt = d.receipt().expect("recorded");
    let d = s.check(&p, &who, 1).await;
    assert_eq!(d.retry_after(), Some(ms(5_000)), "{d:#?}");
    // A refund of one unit gives back the override's 5 s, not the configured 10 s.
    s.gate()
        .refund(&p, &who, 1, Some(&receipt))
        .await
        .expect("the store refunds");
    assert!(s.check(&p, &who, 1).await.allowed());
    let d = s.check(&p, &who, 1).await;
    assert_eq!(d.retry_after(), Some(ms(5_000)), "{d:#?}");

    // Lowered: 1 used of 5, lowered to 2: one more.
    let p = takes("ovr_lower", fixed("5/1m"));
    let who = user("lower");
    s.at(ms(120_000));
    assert!(s.check(&p, &who, 1).await.allowed());
    raise(p.clone(), who.clone(), "2/1m", None).await;
    assert!(s.check(&p, &who, 1).await.allowed());
    let d = s.check(&p, &who, 1).await;
    assert_eq!((d.allowed(), limits(&d)), (false, vec![2]), "{d:#?}");

    // An override that ends: 10 for 30 s.
    let p = takes("ovr_ends", fixed("5/1m"));
    let who = user("ends");
    let kept = raise(p.clone(), who.clone(), "10/1m", Some(ms(30_000))).await;
    let ends = START + ms(150_000);
    assert_eq!(
        kept.expires_at_us,
        Some(u64::try_from(ends.as_micros()).expect("2100 is µs enough"))
    );
    assert!(s.check(&p, &who, 10).await.allowed());
    let listed = s
        .gate()
        .overrides()
        .await
        .expect("the store lists overrides");
    let names: Vec<(&str, &str)> = listed
        .iter()
        .map(|o| (o.policy.as_str(), o.value.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("ovr_ends", "ends"),
            ("ovr_gcra", "gcra"),
            ("ovr_lower", "lower")
        ]
    );
    assert_eq!(listed[0].limits, [10]);
    s.at(ms(150_000));
    let d = s.check(&p, &who, 1).await;
    assert_eq!((d.allowed(), limits(&d)), (false, vec![5]), "ended: {d:#?}");
    let listed = s
        .gate()
        .overrides()
        .await
        .expect("the store lists overrides");
    assert_eq!(listed.len(), 2, "{listed:#?}");
    s.at(ms(180_000));
    assert!(s.check(&p, &who, 5).await.allowed());
    assert!(!s.check(&p, &who, 1).await.allowed());

    // The deployment changed the limiter's window: the override made for the old rules is
    // not applied to the new ones.
    let who = user("moved");
    raise(takes("ovr_moved", fixed("5/1m")), who.clone(), "9/1m", None).await;
    let moved = takes("ovr_moved", fixed("5/2m"));
    assert!(s.check(&moved, &who, 5).await.allowed());
    let d = s.check(&moved, &who, 1).await;
    assert_eq!((d.allowed(), limits(&d)), (false, vec![5]), "{d:#?}");

    // Two limiters (two hash slots on a Cluster), the second overridden: its raised limit is
    // counted and named in its own place, the first keeps its own.
    let two = policy(
        "ovr_two",
        [
            Limiter::new(Dimension::Ip, [fixed("10/1m"), fixed("100/1h")]),
            Limiter::new(Dimension::UserId, [fixed("2/1m"), fixed("20/1h")]).with_overrides(true),
        ],
    );
    let both = Identity::new()
        .with_ip(IpAddr::from([192, 0, 2, 77]))
        .with_user_id("two");
    s.at(ms(240_000));
    assert!(s.check(&two, &both, 2).await.allowed());
    s.gate()
        .set_override(&two, "user_id", &both, &[rule("30/1h"), rule("4/1m")], None)
        .await
        .expect("the store keeps overrides");
    let d = s.check(&two, &both, 2).await;
    assert!(d.allowed(), "{d:#?}");
    assert_eq!(limits(&d), [10, 100, 4, 30]);
    expect_remaining(&d, true, &[6, 96, 0, 26]);
    let d = s.check(&two, &both, 1).await;
    assert_eq!(
        (d.allowed(), limits(&d)),
        (false, vec![10, 100, 4, 30]),
        "{d:#?}"
    );
    // All or nothing: the first limiter's counts stayed.
    expect_remaining(&d, false, &[6, 96, 0, 26]);

    // A cost above the limit in force never fits, however long it may wait: refused as a
    // cost too large (no wait, no ban), with or without an override; within a raised limit, it
    // fits.
    let p = takes("ovr_cost", gcra("10/1s"));
    let who = user("cost");
    s.at(ms(300_000));
    for within in [Duration::ZERO, ms(1_000)] {
        let d = s
            .gate()
            .check_within(&p, &who, 15, within)
            .await
            .expect("the identity carries every dimension");
        assert_eq!(
            (d.allowed(), d.reason(), d.retry_after()),
            (false, Reason::CostExceedsLimit, None),
            "{d:#?}"
        );
    }
    raise(p.clone(), who.clone(), "20/1s", None).await;
    assert!(s.check(&p, &who, 15).await.allowed());
    // Nor is it a violation: a limiter that bans does not ban for it.
    let banning = policy(
        "ovr_ban",
        [Limiter::new(Dimension::UserId, [gcra("10/1s")])
            .with_overrides(true)
            .with_blocklist(BanRule::new(ms(60_000)))],
    );
    let d = s.check(&banning, &who, 15).await;
    assert_eq!(d.reason(), Reason::CostExceedsLimit, "{d:#?}");
    let d = s.check(&banning, &who, 1).await;
    assert!(d.allowed(), "not banned: {d:#?}");

    // A settlement past an override's limit: the debt is counted against it (a sliding log
    // holds twice the limit in force).
    let p = takes("ovr_debt", rule("10/1m"));
    let who = user("debt");
    raise(p.clone(), who.clone(), "100/1m", None).await;
    let d = s.check(&p, &who, 50).await;
    assert!(d.allowed(), "{d:#?}");
    let receipt = d.receipt().expect("recorded");
    let settled = s
        .gate()
        .settle(&p, &who, &receipt, 150)
        .await
        .expect("the store settles");
    assert_eq!(settled, Settlement::Charged(100));
    let d = s.check(&p, &who, 1).await;
    assert!(!d.allowed(), "150 of 100 used: {d:#?}");

    // A limiter that takes none says so.
    let plain = policy(
        "ovr_plain",
        [Limiter::new(Dimension::UserId, [rule("5/1m")])],
    );
    let e = s
        .gate()
        .set_override(&plain, "user_id", &who, &[rule("9/1m")], None)
        .await
        .expect_err("a limiter without overrides refuses one");
    assert!(e.to_string().contains("takes no overrides"), "{e}");
}

/// Scenario: a refund by a receipt gives back by the limits its check counted by. GCRA gives
/// back time (the cost times the rule's interval): after an override that raised the limit is
/// removed, or one that lowers it is set, a refund by the limit of now would give back more
/// time than the check took. And a receipt whose text names a lower limit than the configured
/// one (a client may forge it) gives back no more than the configured limit does.
pub async fn refunds_count_by_the_limits_their_check_counted_by<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "ovr_refund",
        [Limiter::new(Dimension::UserId, [gcra("6/1m")]).with_overrides(true)],
    );
    let (gate, p) = (s.gate(), &p);
    let set = |who: Identity, to: &'static str| async move {
        gate.set_override(p, "user_id", &who, &[gcra(to)], None)
            .await
            .expect("the store keeps overrides");
    };
    let refund = |who: Identity, receipt: tollgate::Receipt| async move {
        gate.refund(p, &who, 1, Some(&receipt))
            .await
            .expect("the store refunds");
    };
    s.at(ms(0));
    // Raised to 12/1m (5 s a unit) for the check, removed before its refund.
    let who = user("raised");
    set(who.clone(), "12/1m").await;
    let d = s.check(p, &who, 12).await;
    assert!(d.allowed(), "{d:#?}");
    let receipt = d.receipt().expect("recorded");
    assert_eq!(receipt.limits(), [(0, 12)]);
    let text = receipt.to_string();
    assert_eq!(
        text.parse::<tollgate::Receipt>(),
        Ok(receipt.clone()),
        "{text}"
    );
    assert!(
        gate.remove_override(p, "user_id", &who)
            .await
            .expect("the store removes overrides")
    );
    refund(who.clone(), receipt).await;
    // 5 s back, not the configured 10 s: 55 s owed, and a unit of 10 s does not fit in 60.
    let d = s.check(p, &who, 1).await;
    assert_eq!(
        (d.allowed(), d.retry_after()),
        (false, Some(ms(5_000))),
        "{d:#?}"
    );

    // Checked by the configured 6/1m (10 s a unit), lowered to 3/1m (20 s) before its refund.
    let who = user("lowered");
    let d = s.check(p, &who, 6).await;
    let receipt = d.receipt().expect("recorded");
    assert!(receipt.limits().is_empty(), "{receipt:?}");
    set(who.clone(), "3/1m").await;
    refund(who.clone(), receipt).await;
    // 10 s back, not 20: 50 s owed, and a unit of 20 s does not fit in the 60 s of 3/1m.
    let d = s.check(p, &who, 1).await;
    assert_eq!(
        (d.allowed(), d.retry_after()),
        (false, Some(ms(10_000))),
        "{d:#?}"
    );

    // Lowered to 3/1m (20 s a unit) before the check and still: 20 s back, what it took.
    let who = user("punished");
    set(who.clone(), "3/1m").await;
    let d = s.check(p, &who, 3).await;
    let receipt = d.receipt().expect("recorded");
    assert_eq!(receipt.limits(), [(0, 3)]);
    refund(who.clone(), receipt).await;
    // 40 s owed: one unit of 20 s fits in the 60 s of 3/1m, a second does not.
    let d = s.check(p, &who, 1).await;
    assert!(d.allowed(), "{d:#?}");
    let d = s.check(p, &who, 1).await;
    assert_eq!(
        (d.allowed(), d.retry_after()),
        (false, Some(ms(20_000))),
        "{d:#?}"
    );

    // Settled below its estimate after the override was removed, with a concurrency limiter
    // before it (left out of the settlement, so the rule's place moves): 6 units back by
    // 12/1m (30 s), not by 6/1m (60 s).
    let settled = policy(
        "ovr_settle",
        [
            Limiter::concurrent(Dimension::UserId, 20, ms(300_000))
                .expect("a valid concurrency limit")
                .with_name("slot"),
            Limiter::new(Dimension::UserId, [gcra("6/1m")]).with_overrides(true),
        ],
    );
    let who = user("settled");
    gate.set_override(&settled, "user_id", &who, &[gcra("12/1m")], None)
        .await
        .expect("the store keeps overrides");
    let d = s.check(&settled, &who, 12).await;
    assert!(d.allowed(), "{d:#?}");
    let receipt = d.receipt().expect("recorded");
    assert_eq!(receipt.limits(), [(1, 12)]);
    // The lease renewed: the receipt that names it now names the limits too.
    let renewed = gate.extend_concurrent(&settled, &who, &receipt).await;
    let receipt = renewed
        .expect("the store renews")
        .expect("the lease is live");
    assert_eq!(receipt.limits(), [(1, 12)]);
    assert!(
        gate.remove_override(&settled, "user_id", &who)
            .await
            .expect("the store removes overrides")
    );
    let back = gate.settle(&settled, &who, &receipt, 6).await;
    assert_eq!(back.expect("the store settles"), Settlement::Refunded(6));
    // 30 s owed: 3 units of 10 s fit in 60 s, 4 do not (10 s too many).
    let d = s.check(&settled, &who, 4).await;
    assert_eq!(
        (d.allowed(), d.retry_after()),
        (false, Some(ms(10_000))),
        "{d:#?}"
    );
    assert!(s.check(&settled, &who, 3).await.allowed());

    // A receipt's text naming 1/1m (60 s a unit): no more than the configured 10 s back.
    let who = user("forged");
    let d = s.check(p, &who, 6).await;
    let forged = format!("{}.0:1", d.receipt().expect("recorded"));
    refund(who.clone(), forged.parse().expect("a receipt")).await;
    assert!(s.check(p, &who, 1).await.allowed());
    let d = s.check(p, &who, 1).await;
    assert_eq!(
        (d.allowed(), d.retry_after()),
        (false, Some(ms(10_000))),
        "{d:#?}"
    );
}

/// Scenario: the overrides listed page by page. Every live override once, in the order they
/// end (ties by key, those that never end last), a page at most its size, an ended override
/// left out, and a cursor still good, as text, after the override it names was removed.
pub async fn overrides_page_in_the_order_they_end<S: FullStore>(s: Subject<S>) {
    let p = policy(
        "ovr_pages",
        [Limiter::new(Dimension::UserId, [fixed("5/1m")]).with_overrides(true)],
    );
    let gate = s.gate();
    let page = |after: Option<tollgate::PageCursor>, limit: usize| async move {
        gate.overrides_page(after.as_ref(), limit)
            .await
            .expect("the store lists overrides")
    };
    s.at(ms(0));
    let empty = page(None, 10).await;
    assert_eq!((empty.overrides.len(), empty.next), (0, None));
    // 11 overrides: three end together at each of 60 s, 120 s and 180 s (ties), two never
    // end, and one ends at 5 s.
    let ttl = |i: u64| match i {
        0..=8 => Some(ms(60_000 * (1 + i / 3))),
        9 | 10 => None,
        _ => Some(ms(5_000)),
    };
    let mut live = Vec::new();
    for i in 0..12u64 {
        let who = user(&format!("user-{i:02}"));
        gate.set_override(&p, "user_id", &who, &[fixed("9/1m")], ttl(i))
            .await
            .expect("the store keeps overrides");
        if i != 11 {
            live.push(format!("user-{i:02}"));
        }
    }
    s.at(ms(10_000));
    // Page after page of 3, the cursor through its text form.
    let (mut listed, mut after, mut pages) = (Vec::new(), None, 0);
    loop {
        let page = page(after.take(), 3).await;
        pages += 1;
        assert!(page.overrides.len() <= 3, "{page:?}");
        listed.extend(page.overrides);
        let Some(next) = page.next else { break };
        after = Some(next.to_string().parse().expect("a cursor"));
        if pages == 2 {
            // Removing the override a cursor names does not lose the page after it.
            let named = listed.last().expect("two pages").value.clone();
            assert!(
                gate.remove_override(&p, "user_id", &user(&named))
                    .await
                    .expect("the store removes overrides")
            );
            live.retain(|v| *v != named);
        }
        assert!(pages < 20, "the pages never end");
    }
    assert!(pages >= 4, "11 overrides in pages of 3: {pages}");
    let ends: Vec<u64> = listed
        .iter()
        .map(|o| o.expires_at_us.unwrap_or(u64::MAX))
        .collect();
    assert!(ends.windows(2).all(|w| w[0] <= w[1]), "{ends:?}");
    assert_eq!(
        ends.iter().filter(|&&e| e == u64::MAX).count(),
        2,
        "{ends:?}"
    );
    let mut seen: Vec<String> = listed.iter().map(|o| o.value.clone()).collect();
    seen.sort();
    let mut every: Vec<String> = (0..11).map(|i| format!("user-{i:02}")).collect();
    every.sort();
    assert_eq!(
        seen, every,
        "every live override exactly once, the 5 s one left out"
    );
    assert!(
        listed
            .iter()
            .all(|o| o.limits == [9] && o.policy == "ovr_pages")
    );
    // One page holds them all; the whole listing agrees.
    let all = page(None, 1000).await;
    assert_eq!((all.overrides.len(), all.next), (live.len(), None));
    // A cursor past any instant an entry ends at (a client's, through its text): those that
    // never end.
    let late = tollgate::PageCursor::new(u64::MAX - 1, "");
    let never = page(Some(late), 1000).await;
    let never: Vec<Option<u64>> = never.overrides.iter().map(|o| o.expires_at_us).collect();
    assert_eq!(never, [None, None]);
    let whole: Vec<String> = gate
        .overrides()
        .await
        .expect("the store lists overrides")
        .into_iter()
        .map(|o| o.value)
        .collect();
    assert_eq!(whole, live, "by policy, limiter and value");
}

/// Scenario 16: the store answers a ping.
pub async fn store_answers_ping<S: FullStore>(s: Subject<S>) {
    s.gate.store().ping().await.expect("ping");
}

/// Starts `n` checks of `policy` for `who` at once (a barrier releases them together) and
/// returns how many were admitted.
async fn race<S: FullStore>(
    gate: &Arc<Tollgate<S>>,
    policy: Policy,
    who: Identity,
    n: usize,
) -> usize {
    let barrier = Arc::new(Barrier::new(n));
    let policy = Arc::new(policy);
    let who = Arc::new(who);
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (gate, policy, who, barrier) =
                (gate.clone(), policy.clone(), who.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                gate.check(&policy, &who, 1).await
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let d = task
            .await
            .expect("the check task panicked")
            .expect("the identity carries every dimension");
        assert_ne!(d.reason(), Reason::StoreUnavailable, "the store failed");
        admitted += usize::from(d.allowed());
    }
    admitted
}

/// Scenario 13: 500 checks released together against a limit of 100 admit exactly 100, for
/// every algorithm and across limiters, and the denials leave the looser rules uncharged.
pub async fn concurrent_checks_never_over_admit<S: FullStore>(s: Subject<S>) {
    // `_keep` holds the store's server until the end.
    let Subject {
        gate,
        clock,
        keep: _keep,
    } = s;
    clock.set(START);
    let gate = Arc::new(gate);
    let n = 500;
    let hang = Duration::from_secs(120);
    let runs = [
        (
            policy(
                "race_all",
                [
                    Limiter::new(
                        Dimension::Global,
                        [rule("100/1m"), fixed("150/1m"), gcra("200/1m")],
                    ),
                    Limiter::new(Dimension::UserId, [rule("120/1m")]),
                ],
            ),
            user("racer"),
            vec![
                (true, 0, 60_000),
                (true, 50, 60_000),
                (true, 100, 30_000),
                (true, 20, 60_000),
            ],
        ),
        (
            policy(
                "race_fixed",
                [Limiter::new(
                    Dimension::Global,
                    [fixed("100/1m"), rule("150/1m")],
                )],
            ),
            user("racer"),
            vec![(true, 0, 60_000), (true, 50, 60_000)],
        ),
        (
            policy(
                "race_gcra",
                [Limiter::new(
                    Dimension::Global,
                    [gcra("100/1m"), rule("150/1m")],
                )],
            ),
            user("racer"),
            vec![(true, 0, 60_000), (true, 50, 60_000)],
        ),
        (
            policy(
                "race_limiters",
                [
                    Limiter::new(Dimension::Ip, [rule("150/1m")]),
                    Limiter::new(Dimension::UserId, [fixed("100/1m")]),
                ],
            ),
            ip(1).with_user_id("racer"),
            vec![(true, 50, 60_000), (true, 0, 60_000)],
        ),
    ];
    for (p, who, after) in runs {
        let scope = p.scope().to_owned();
        let admitted = tokio::time::timeout(hang, race(&gate, p.clone(), who.clone(), n))
            .await
            .expect("the checks hung");
        assert_eq!(
            admitted, 100,
            "{scope}: admitted {admitted} of {n} under a limit of 100"
        );
        let d = gate.peek(&p, &who, 0).await.expect("peek").named(&p);
        expect(&d, None, &after);
    }
}
