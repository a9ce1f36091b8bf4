//! A policy of one limiter is answered in place by the memory store (`Store::check_limiter`):
//! every answer must be the general check's, on random rules and request sequences, and the
//! engine must take the in-place way exactly when nothing else (a ban, a bypass, a new key, a
//! second limiter) needs the general one.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use proptest::prelude::*;
use tollgate::{
    Algorithm, BanRule, BanStore, BanTarget, Bypass, CheckError, CheckRequest, Decision, Dimension,
    Identity, Limiter, LimiterAnswer, LimiterCheck, ManualClock, MemoryStore, Policy, Rule, Store,
    StoreError, Tollgate, Verdict, algorithm::RuleOutcome,
};

/// 2100-01-01T00:00:00Z.
const START: Duration = Duration::from_secs(4_102_444_800);

/// A memory store behind the trait's defaults for `check_gcra`: the engine asks it every check
/// as a whole request, through the general path.
struct General(MemoryStore);

/// A memory store that counts the checks it answered in place.
struct InPlace(MemoryStore, AtomicUsize);

macro_rules! forward_checks {
    () => {
        async fn check(&self, request: &CheckRequest<'_>) -> Result<Verdict, StoreError> {
            self.0.check(request).await
        }

        fn check_sync(
            &self,
            request: &CheckRequest<'_>,
            verdict: &mut Verdict,
        ) -> Option<Result<(), StoreError>> {
            self.0.check_sync(request, verdict)
        }

        async fn reset(&self, request: &CheckRequest<'_>) -> Result<(), StoreError> {
            self.0.reset(request).await
        }

        async fn ping(&self) -> Result<(), StoreError> {
            Ok(())
        }

        fn bans_possible(&self) -> bool {
            self.0.bans_possible()
        }

        fn text_keys(&self) -> bool {
            self.0.text_keys()
        }
    };
}

impl Store for General {
    forward_checks!();
}

impl Store for InPlace {
    forward_checks!();

    fn check_limiter(
        &self,
        check: &LimiterCheck<'_>,
        outcomes: &mut [RuleOutcome],
    ) -> Option<LimiterAnswer> {
        let answer = self.0.check_limiter(check, outcomes);
        self.1
            .fetch_add(usize::from(answer.is_some()), Ordering::Relaxed);
        answer
    }
}

fn store(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder()
        .clock(clock.clone())
        .purge_interval(None)
        .build()
}

fn gcra(limit: u64, window: Duration) -> Rule {
    Rule::new(limit, window)
        .expect("a valid rule")
        .with_algorithm(Algorithm::Gcra)
}

fn client(n: u8) -> Identity {
    Identity::new().with_ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)))
}

/// Runs `f` to completion: a memory-store check is ready at its first poll.
fn now<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
        .block_on(f)
}

#[derive(Clone, Copy, Debug)]
enum Ask {
    Check,
    Peek,
    Within(u64),
}

/// The answer of `gate` to `ask`.
fn ask_of<S: Store>(
    gate: &Tollgate<S>,
    policy: &Policy,
    who: &Identity,
    cost: u64,
    ask: Ask,
) -> Result<Decision, CheckError> {
    match ask {
        Ask::Check => now(gate.check(policy, who, cost)),
        Ask::Peek => now(gate.peek(policy, who, cost)),
        Ask::Within(ms) => now(gate.check_within(policy, who, cost, Duration::from_millis(ms))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn in_place_answers_are_the_general_checks(
        rules in prop::collection::vec(
            (
                1u64..6,
                1u64..4000,
                prop_oneof![
                    Just(Algorithm::SlidingLog),
                    Just(Algorithm::FixedWindow),
                    Just(Algorithm::Gcra),
                    Just(Algorithm::SlidingWindow),
                ],
            ),
            1..4,
        ),
        message in any::<bool>(),
        ops in prop::collection::vec(
            (
                0u64..3000,
                0u8..4,
                0u64..8,
                prop_oneof![
                    3 => Just(Ask::Check),
                    1 => Just(Ask::Peek),
                    1 => (0u64..8000).prop_map(Ask::Within),
                ],
            ),
            1..80,
        ),
    ) {
        let clock = ManualClock::new(START);
        let in_place = Tollgate::new(InPlace(store(&clock), AtomicUsize::new(0)));
        let general = Tollgate::new(General(store(&clock)));
        let rules = rules.iter().map(|&(limit, window_ms, algorithm)| {
            Rule::new(limit, Duration::from_millis(window_ms))
                .expect("a valid rule")
                .with_algorithm(algorithm)
        });
        let mut limiter = Limiter::new(Dimension::Ip, rules);
        if message {
            limiter = limiter.with_message("slow down");
        }
        // Two equal rules make no policy.
        let Ok(policy) = Policy::builder("in-place").limiter(limiter).build() else {
            return Ok(());
        };
        for (step, &(advance_ms, who, cost, ask)) in ops.iter().enumerate() {
            clock.advance(Duration::from_millis(advance_ms));
            // The fourth client has no IP: both refuse it alike.
            let who = if who == 3 { Identity::new() } else { client(who) };
            let (a, b) = (ask_of(&in_place, &policy, &who, cost, ask), ask_of(&general, &policy, &who, cost, ask));
            prop_assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {} {:?}", step, ask);
            if let (Ok(a), Ok(b)) = (&a, &b) {
                prop_assert!(a == b, "step {}", step);
            }
        }
    }
}

/// How many of `n` checks of `who` the store answered in place.
fn answered_in_place(gate: &Tollgate<InPlace>, policy: &Policy, who: &Identity, n: usize) -> usize {
    let before = gate.store().1.load(Ordering::Relaxed);
    for _ in 0..n {
        now(gate.check(policy, who, 1)).expect("a check");
    }
    gate.store().1.load(Ordering::Relaxed) - before
}

/// Bans somebody else for a minute, in the store behind `gate`.
fn ban_someone(gate: &Tollgate<InPlace>) {
    let target = BanTarget::UserId("someone".into());
    now(gate
        .store()
        .0
        .ban(gate.prefix(), &target, Duration::from_secs(60)))
    .expect("a ban");
}

#[test]
fn the_engine_answers_in_place_only_what_needs_nothing_else() {
    let clock = ManualClock::new(START);
    let gate = Tollgate::new(InPlace(store(&clock), AtomicUsize::new(0)));
    let rule = gcra(1000, Duration::from_secs(1));
    let plain = Policy::builder("plain")
        .limiter(Limiter::new(Dimension::Ip, [rule]))
        .build()
        .unwrap();
    // A new key is made by the general check; every check after it is answered in place.
    assert_eq!(answered_in_place(&gate, &plain, &client(1), 5), 4);

    // A limiter that bans needs its ban keys at a denial: never in place.
    let banning = Policy::builder("banning")
        .limiter(
            Limiter::new(Dimension::Ip, [rule])
                .with_blocklist(BanRule::new(Duration::from_secs(60))),
        )
        .build()
        .unwrap();
    assert_eq!(answered_in_place(&gate, &banning, &client(1), 5), 0);

    // So does a bypass, and a policy of two limiters.
    let bypassed = Policy::builder("bypassed")
        .limiter(Limiter::new(Dimension::Ip, [rule]))
        .bypass(Bypass::new().user_id("operator"))
        .build()
        .unwrap();
    assert_eq!(answered_in_place(&gate, &bypassed, &client(1), 5), 0);
    let two = Policy::builder("two")
        .limiter(Limiter::new(Dimension::Ip, [rule]))
        .limiter(Limiter::new(Dimension::Global, [rule]))
        .build()
        .unwrap();
    assert_eq!(answered_in_place(&gate, &two, &client(1), 5), 0);
    // A sliding log of three rules is answered in place too.
    let log = Policy::builder("log")
        .limiter(Limiter::new(
            Dimension::Ip,
            ["1000/1s", "10000/1m", "100000/1h"].map(|r| r.parse::<Rule>().unwrap()),
        ))
        .build()
        .unwrap();
    assert_eq!(answered_in_place(&gate, &log, &client(1), 5), 4);

    // Once a ban may be live, every check reads the identity's ban keys.
    ban_someone(&gate);
    assert_eq!(answered_in_place(&gate, &plain, &client(1), 5), 0);
    // And no longer once it ended.
    clock.advance(Duration::from_secs(61));
    assert_eq!(answered_in_place(&gate, &plain, &client(1), 5), 5);
    // Without the blocklist, bans are not read at all.
    let unlisted = Tollgate::new(InPlace(store(&clock), AtomicUsize::new(0))).with_blocklist(false);
    ban_someone(&unlisted);
    assert_eq!(answered_in_place(&unlisted, &banning, &client(1), 5), 4);
}

/// A key whose state another rule wrote (the policy was rebuilt with other rules under the
/// same limiter) is answered as the general check answers it: the in-place way reads only the
/// state it recognises.
#[test]
fn a_key_of_other_rules_is_answered_as_the_general_check_answers_it() {
    let clock = ManualClock::new(START);
    let in_place = Tollgate::new(InPlace(store(&clock), AtomicUsize::new(0)));
    let general = Tollgate::new(General(store(&clock)));
    let of = |rules: &[&str], algorithm| {
        let rules = rules
            .iter()
            .map(|r| r.parse::<Rule>().unwrap().with_algorithm(algorithm));
        Policy::builder("rebuilt")
            .limiter(Limiter::new(Dimension::Ip, rules).with_name("api"))
            .build()
            .unwrap()
    };
    // A GCRA rule's state is its window's (an override may change the limit): another window
    // is another rule.
    let policies = [
        of(&["3/1s"], Algorithm::Gcra),
        of(&["6/2s"], Algorithm::Gcra),
        of(&["2/1s"], Algorithm::Gcra),
        of(&["3/1s"], Algorithm::FixedWindow),
        of(&["3/1s"], Algorithm::Gcra),
        of(&["3/1s", "5/1m"], Algorithm::SlidingLog),
        of(&["3/1s"], Algorithm::Gcra),
    ];
    let who = client(7);
    for (i, policy) in policies.iter().cycle().take(35).enumerate() {
        clock.advance(Duration::from_millis(150));
        let a = now(in_place.check(policy, &who, 1)).unwrap();
        let b = now(general.check(policy, &who, 1)).unwrap();
        assert_eq!(a, b, "check {i}");
    }
    assert!(in_place.store().1.load(Ordering::Relaxed) > 0);
}
