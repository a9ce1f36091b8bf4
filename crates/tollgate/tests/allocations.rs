//! A check on the memory store allocates nothing once its keys exist: counted by
//! `allocation-counter`'s global allocator, per thread.

#![allow(clippy::unwrap_used)]

use std::{
    future::Future,
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use tollgate::{
    AnyStore, BanRule, BanTarget, CheckRequest, Decision, Dimension, Identity, Limiter,
    MemoryStore, Policy, Store, StoreError, Tollgate, Verdict,
};

/// Heap allocations made by this thread while `f` runs.
fn allocations<T>(f: impl FnOnce() -> T) -> (u64, T) {
    let mut out = None;
    let info = allocation_counter::measure(|| out = Some(f()));
    (info.count_total, out.expect("the closure ran"))
}

/// Runs a future that must finish without waiting (every memory-store check does).
fn now<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a memory-store check waited"),
    }
}

fn rule(text: &str) -> tollgate::Rule {
    text.parse().unwrap()
}

fn one_rule() -> Policy {
    Policy::builder("api")
        .limiter(Limiter::new(
            Dimension::Ip,
            [rule("1000/1h").with_algorithm(tollgate::Algorithm::Gcra)],
        ))
        .build()
        .unwrap()
}

/// Two limiters of three sliding-log rules each, the second banning offenders.
fn two_by_three() -> Policy {
    Policy::builder("sms")
        .limiter(Limiter::new(
            Dimension::Ip,
            [rule("100/1m"), rule("200/1h"), rule("300/1d")],
        ))
        .limiter(
            Limiter::new(
                Dimension::UserId,
                [rule("1000/1m"), rule("2000/1h"), rule("3000/1d")],
            )
            .with_blocklist(BanRule::new(Duration::from_secs(60))),
        )
        .build()
        .unwrap()
}

/// Checks `policy` for `who` until its keys exist and its logs have grown their room (70
/// checks, the last 20 of them held at once: a decision of several rules keeps what does not
/// fit inline in storage its thread reuses, and a thread holding 20 at once has made 20), then
/// counts the allocations of 20 more admitted checks and of a denied one (of a cost over what
/// the first limiter has left, which writes no ban).
fn count<S: Store>(gate: &Tollgate<S>, policy: &Policy, who: &Identity) -> (u64, u64) {
    for _ in 0..50 {
        assert!(now(gate.check(policy, who, 1)).unwrap().allowed());
    }
    let held: Vec<Decision> = (0..20)
        .map(|_| now(gate.check(policy, who, 1)).unwrap())
        .collect();
    assert!(held.iter().all(Decision::allowed));
    drop(held);
    let (admitted, decisions) = allocations(|| {
        (0..20)
            .map(|_| now(gate.check(policy, who, 1)).unwrap())
            .collect::<Vec<Decision>>()
    });
    // The Vec of the decisions is the only allocation allowed here; it grows a few times.
    let vec_growth = allocations(|| {
        let mut v = Vec::new();
        v.extend((0..20).map(|i| i as u64));
        v
    })
    .0;
    assert!(decisions.iter().all(Decision::allowed));
    drop(decisions);
    // 90 used: 60 more is over the first limiter's 100 (or the single rule's 1,000 less 910).
    let cost = if policy.limiters().len() == 1 {
        960
    } else {
        60
    };
    let (denied, decision) = allocations(|| now(gate.check(policy, who, cost)).unwrap());
    assert!(!decision.allowed());
    (admitted - vec_growth, denied)
}

fn who() -> Identity {
    Identity::new()
        .with_ip("2001:db8::7".parse().unwrap())
        .with_user_id("user-42")
}

#[test]
fn checks_on_existing_keys_allocate_nothing() {
    for policy in [one_rule(), two_by_three()] {
        // Blocklist off, and on with no ban live.
        for blocklist in [false, true] {
            let gate = Tollgate::new(MemoryStore::new()).with_blocklist(blocklist);
            let scope = policy.scope().to_owned();
            assert_eq!(
                count(&gate, &policy, &who()),
                (0, 0),
                "{scope}, {blocklist}"
            );
        }
        // A ban on somebody else is live: every check carries the identity's ban keys.
        let gate = Tollgate::new(MemoryStore::new());
        now(gate.ban(&BanTarget::UserId("other".into()), Duration::from_secs(600))).unwrap();
        assert!(gate.store().bans_possible());
        assert_eq!(
            count(&gate, &policy, &who()),
            (0, 0),
            "{} with bans",
            policy.scope()
        );
    }
}

/// A store of the user's own around a memory store: it forwards, says it can answer at once,
/// and has no ability beyond checks (no refunds, locks or bans).
struct Wrapper(MemoryStore);

impl Store for Wrapper {
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
}

#[test]
fn wrapped_memory_stores_take_the_same_path() {
    let policy = two_by_three();
    let zero = (0, 0);
    assert_eq!(
        count(
            &Tollgate::new(Arc::new(MemoryStore::new())),
            &policy,
            &who()
        ),
        zero
    );
    assert_eq!(
        count(
            &Tollgate::new(AnyStore::new(MemoryStore::new())),
            &policy,
            &who()
        ),
        zero
    );
    assert_eq!(
        count(&Tollgate::new(Wrapper(MemoryStore::new())), &policy, &who()),
        zero
    );
}

/// The counter counts: a new key costs its allocations, so the tests above can fail.
#[test]
fn a_new_key_allocates() {
    let gate = Tollgate::new(MemoryStore::new());
    let (n, decision) = allocations(|| now(gate.check(&one_rule(), &who(), 1)).unwrap());
    assert!(decision.allowed());
    assert!(n > 0);
}

/// A decision of several rules keeps what does not fit inline in storage its thread reuses:
/// a thread's first such decision allocates it, the next ones reuse it.
#[test]
fn a_thread_reuses_its_decisions_storage() {
    let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    let policy = Arc::new(two_by_three());
    // The keys exist and the logs have room: only the decision can allocate below.
    for _ in 0..10 {
        assert!(now(gate.check(&policy, &who(), 1)).unwrap().allowed());
    }
    let on_a_new_thread = std::thread::spawn(move || {
        let who = who();
        let first = allocations(|| now(gate.check(&policy, &who, 1)).unwrap()).0;
        let second = allocations(|| now(gate.check(&policy, &who, 1)).unwrap()).0;
        (first, second)
    });
    let (first, second) = on_a_new_thread.join().unwrap();
    assert!(first > 0, "the first decision allocated nothing");
    assert_eq!(second, 0);
}

/// What most limiters count by, a client IP and a user id, costs an identity no allocation
/// beyond the user id's text; the other facts share one box.
#[test]
fn an_identity_allocates_its_texts_and_one_box_for_the_rarer_facts() {
    let ip = "192.0.2.7".parse().unwrap();
    let id = String::from("42");
    let (n, bare) = allocations(|| Identity::new().with_ip(ip).with_user_id(id));
    assert_eq!((n, bare.user_id()), (0, Some("42")));
    let (name, arg, value) = (String::from("ann"), String::from("form"), String::from("f"));
    let (n, who) = allocations(|| bare.with_user_name(name).with_arg(arg, value));
    // The box, its argument vector, and nothing else: the texts came in made.
    assert_eq!(n, 2);
    assert_eq!((who.user_name(), who.arg("form")), (Some("ann"), Some("f")));
}
