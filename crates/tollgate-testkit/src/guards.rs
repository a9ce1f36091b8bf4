//! Conformance scenarios for the duplicate guard, the blocklist and the bypass.
//!
//! Like [`conformance`](crate::conformance), each scenario takes a fresh
//! [`Subject`] and moves its manual clock; stores keep lock and
//! ban deadlines against the clock they read, so the same numbers hold on every store.
//! [`guard_suite!`](crate::guard_suite) expands to one `#[tokio::test]` per scenario.

use std::{sync::Arc, time::Duration};

use crate::FullStore;
use tokio::sync::Barrier;
use tollgate::{
    Acquire, BanRule, BanScope, BanTarget, Bypass, CheckError, Dimension, DuplicateBy,
    DuplicateGuard, DuplicateState, Fingerprint, Identity, Limiter, PageCursor, Policy, Reason,
    Rule,
};

use crate::conformance::{START, Subject};

/// Expands to one `#[tokio::test]` per guard scenario; `$make` as for
/// [`conformance_suite!`](crate::conformance_suite).
#[macro_export]
macro_rules! guard_suite {
    ($make:expr) => {
        $crate::guard_suite!(@each $make;
            duplicate_different_fingerprints_are_independent,
            duplicate_ttl_expiry_frees_the_key,
            duplicate_stale_lease_cannot_release,
            duplicate_completed_is_replayed,
            duplicate_reused_key_with_other_payload_is_a_mismatch,
            duplicate_global_guard_spans_actions,
            duplicate_guard_errors,
            blocklist_violation_bans_ip_and_user_everywhere,
            blocklist_policy_scope_keeps_bans_to_the_policy,
            blocklist_unban_and_expiry_lift_the_ban,
            blocklist_escalation_doubles_and_caps,
            blocklist_manual_ban_and_listing,
            blocklist_counts_and_pages_in_the_order_bans_end,
            bypass_lets_through_without_counting,
        );

        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn duplicate_concurrent_submissions_acquire_once() {
            let subject = ($make)().await;
            $crate::guards::duplicate_concurrent_submissions_acquire_once(subject).await;
        }
    };
    (@each $make:expr; $($scenario:ident),+ $(,)?) => {
        $(
            #[::tokio::test]
            async fn $scenario() {
                let subject = ($make)().await;
                $crate::guards::$scenario(subject).await;
            }
        )+
    };
}

fn rule(text: &str) -> Rule {
    text.parse().expect("scenario rules are valid")
}

fn at<S: FullStore>(s: &Subject<S>, offset: Duration) {
    s.clock().set(START + offset);
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn user(id: &str) -> Identity {
    Identity::new()
        .with_ip("192.0.2.10".parse().expect("valid ip"))
        .with_user_id(id)
}

async fn acquire<S: FullStore>(
    s: &Subject<S>,
    guard: &DuplicateGuard,
    who: &Identity,
    fp: &Fingerprint,
) -> Acquire {
    s.gate()
        .acquire(guard, who, fp)
        .await
        .expect("the store answers and the identity has the dimension")
}

fn expect_lease(a: Acquire) -> tollgate::Lease {
    match a {
        Acquire::Acquired(lease) => lease,
        Acquire::Duplicate(d) => panic!("expected to acquire, got a duplicate: {d:?}"),
    }
}

fn expect_duplicate(a: Acquire) -> tollgate::Duplicate {
    match a {
        Acquire::Duplicate(d) => d,
        Acquire::Acquired(lease) => panic!("expected a duplicate, acquired {lease:?}"),
    }
}

/// 50 identical submissions at once: exactly one acquires.
pub async fn duplicate_concurrent_submissions_acquire_once<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let s = Arc::new(s);
    let guard = Arc::new(DuplicateGuard::new("submit", DuplicateBy::Args).with_ttl(secs(5)));
    let barrier = Arc::new(Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (s, guard, barrier) = (s.clone(), guard.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let fp = Fingerprint::of(br#"{"order":1}"#);
                matches!(
                    acquire(&s, &guard, &user("u"), &fp).await,
                    Acquire::Acquired(_)
                )
            })
        })
        .collect();
    let mut acquired = 0;
    for t in tasks {
        acquired += usize::from(t.await.expect("task ran"));
    }
    assert_eq!(acquired, 1);
}

/// Args mode: another payload is another submission; the same payload is a duplicate that
/// says "operation in progress".
pub async fn duplicate_different_fingerprints_are_independent<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let guard = DuplicateGuard::new("submit", DuplicateBy::Args).with_ttl(secs(5));
    let who = user("u");
    let a = Fingerprint::of("a");
    let b = Fingerprint::of("b");
    expect_lease(acquire(&s, &guard, &who, &a).await);
    expect_lease(acquire(&s, &guard, &who, &b).await);
    at(&s, secs(2));
    let dup = expect_duplicate(acquire(&s, &guard, &who, &a).await);
    assert_eq!(dup.state, DuplicateState::InProgress);
    assert_eq!(dup.retry_after, secs(3));
    assert!(dup.fingerprint_matches);
    assert_eq!(dup.message(guard.by()), "operation in progress");
}

/// A lock nobody releases frees itself at its TTL, not a millisecond before.
pub async fn duplicate_ttl_expiry_frees_the_key<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let guard = DuplicateGuard::new("profile", "user_id".parse().expect("valid"))
        .with_ttl(Duration::from_millis(2000));
    let who = user("u");
    let fp = Fingerprint::empty();
    expect_lease(acquire(&s, &guard, &who, &fp).await);
    at(&s, Duration::from_millis(1999));
    let dup = expect_duplicate(acquire(&s, &guard, &who, &fp).await);
    assert_eq!(dup.retry_after, Duration::from_millis(1));
    assert_eq!(dup.message(guard.by()), "repeated request");
    at(&s, Duration::from_millis(2000));
    expect_lease(acquire(&s, &guard, &who, &fp).await);
    // Another user was never blocked.
    at(&s, Duration::from_millis(2001));
    expect_lease(acquire(&s, &guard, &user("v"), &fp).await);
}

/// Release frees the lock for a retry; a lease that lost its lock cannot free the next
/// holder's.
pub async fn duplicate_stale_lease_cannot_release<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let guard = DuplicateGuard::new("submit", DuplicateBy::Args).with_ttl(secs(1));
    let who = user("u");
    let fp = Fingerprint::of("x");
    let first = expect_lease(acquire(&s, &guard, &who, &fp).await);
    assert!(s.gate().release(&first).await.expect("store answers"));
    let second = expect_lease(acquire(&s, &guard, &who, &fp).await);
    at(&s, secs(1)); // `second` expires
    let third = expect_lease(acquire(&s, &guard, &who, &fp).await);
    assert!(!s.gate().release(&second).await.expect("store answers"));
    assert!(!s.gate().release(&first).await.expect("store answers"));
    expect_duplicate(acquire(&s, &guard, &who, &fp).await);
    // A stale lease cannot complete either.
    assert!(
        !s.gate()
            .complete(&second, b"late", secs(10))
            .await
            .expect("store answers")
    );
    assert!(s.gate().release(&third).await.expect("store answers"));
}

/// A completed submission is answered with its stored response, byte for byte, until
/// `keep_for` ends.
pub async fn duplicate_completed_is_replayed<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let guard = DuplicateGuard::new(
        "orders",
        DuplicateBy::Dimension(Dimension::Header("idempotency-key".into())),
    )
    .with_ttl(secs(5));
    let who = Identity::new().with_header("Idempotency-Key", "k-1");
    let fp = Fingerprint::of(r#"{"item":7}"#);
    let lease = expect_lease(acquire(&s, &guard, &who, &fp).await);
    let response: Vec<u8> = (0..=255u8).chain(*b"\r\n{\"id\":42}").collect();
    assert!(
        s.gate()
            .complete(&lease, &response, secs(60))
            .await
            .expect("store answers")
    );
    // Completing twice is refused: the first outcome stands. Told the same outcome again (a
    // call sent twice), the store says it stands.
    assert!(
        !s.gate()
            .complete(&lease, b"other", secs(60))
            .await
            .expect("store answers")
    );
    assert!(
        s.gate()
            .complete(&lease, &response, secs(60))
            .await
            .expect("store answers")
    );
    at(&s, secs(10));
    let dup = expect_duplicate(acquire(&s, &guard, &who, &fp).await);
    assert_eq!(dup.state, DuplicateState::Completed);
    assert_eq!(dup.response.as_deref(), Some(&response[..]));
    assert_eq!(dup.retry_after, secs(50));
    assert!(dup.fingerprint_matches);
    at(&s, secs(60));
    expect_lease(acquire(&s, &guard, &who, &fp).await);
}

/// The same idempotency key with another payload is reported as a mismatch.
pub async fn duplicate_reused_key_with_other_payload_is_a_mismatch<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let guard = DuplicateGuard::new("orders", "key".parse().expect("valid")).with_ttl(secs(5));
    let who = Identity::new().with_header("idempotency-key", "k-2");
    expect_lease(acquire(&s, &guard, &who, &Fingerprint::of("a")).await);
    let dup = expect_duplicate(acquire(&s, &guard, &who, &Fingerprint::of("b")).await);
    assert!(!dup.fingerprint_matches);
    let same = expect_duplicate(acquire(&s, &guard, &who, &Fingerprint::of("a")).await);
    assert!(same.fingerprint_matches);
}

/// A global guard is one lock across actions; scoped guards are one per action.
pub async fn duplicate_global_guard_spans_actions<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let by: DuplicateBy = "user_id".parse().expect("valid");
    let a = DuplicateGuard::new("a", by.clone()).with_ttl(secs(5));
    let b = DuplicateGuard::new("b", by.clone()).with_ttl(secs(5));
    let who = user("u");
    let fp = Fingerprint::empty();
    expect_lease(acquire(&s, &a, &who, &fp).await);
    expect_lease(acquire(&s, &b, &who, &fp).await);
    let ga = DuplicateGuard::new("a", by.clone()).global(true);
    let gb = DuplicateGuard::new("b", by).global(true);
    expect_lease(acquire(&s, &ga, &who, &fp).await);
    expect_duplicate(acquire(&s, &gb, &who, &fp).await);
}

/// A guard on a dimension the request lacks is an error; so is a response over the cap.
pub async fn duplicate_guard_errors<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let guard = DuplicateGuard::new("a", "user_id".parse().expect("valid"));
    let err = s
        .gate()
        .acquire(&guard, &Identity::new(), &Fingerprint::empty())
        .await
        .expect_err("no user id");
    assert!(err.is_missing_dimension(), "{err}");
    let lease = expect_lease(acquire(&s, &guard, &user("u"), &Fingerprint::empty()).await);
    let huge = vec![b'x'; (1 << 20) + 1];
    let err = s
        .gate()
        .complete(&lease, &huge, secs(1))
        .await
        .expect_err("too large");
    assert!(
        matches!(err, CheckError::ResponseTooLarge { size, .. } if size == huge.len()),
        "{err}"
    );
    // The refused completion left the lock in progress.
    let dup = expect_duplicate(acquire(&s, &guard, &user("u"), &Fingerprint::empty()).await);
    assert_eq!(dup.state, DuplicateState::InProgress);
}

fn sms_policy(ban: BanRule) -> Policy {
    Policy::builder("sms")
        .limiter(Limiter::new(Dimension::Ip, [rule("1/1m")]).with_blocklist(ban))
        .limiter(Limiter::new(Dimension::UserId, [rule("100/1d")]))
        .build()
        .expect("valid policy")
}

fn login_policy() -> Policy {
    Policy::builder("login")
        .limiter(Limiter::new(Dimension::UserId, [rule("100/1m")]))
        .build()
        .expect("valid policy")
}

async fn check<S: FullStore>(
    s: &Subject<S>,
    p: &Policy,
    who: &Identity,
) -> tollgate::NamedDecision {
    s.gate()
        .check(p, who, 1)
        .await
        .expect("identity complete")
        .named(p)
}

/// A violation bans the IP and the user at once; every policy sees the ban; a banned request
/// costs nothing.
pub async fn blocklist_violation_bans_ip_and_user_everywhere<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let sms = sms_policy(BanRule::new(secs(600)));
    let who = user("alice");
    assert!(check(&s, &sms, &who).await.allowed());
    let denied = check(&s, &sms, &who).await;
    assert_eq!(denied.reason(), Reason::RateLimited);
    assert_eq!(
        denied.retry_after(),
        Some(secs(600)),
        "the ban outlasts the rule"
    );

    at(&s, secs(100));
    let login = login_policy();
    let blocked = check(&s, &login, &user("alice")).await;
    assert_eq!(blocked.reason(), Reason::Blocked);
    assert_eq!(blocked.retry_after(), Some(secs(500)));
    // The user is banned from another address too, and the address for another user.
    let elsewhere = Identity::new()
        .with_ip("198.51.100.1".parse().expect("valid ip"))
        .with_user_id("alice");
    assert_eq!(
        check(&s, &login, &elsewhere).await.reason(),
        Reason::Blocked
    );
    assert_eq!(
        check(&s, &login, &user("bob")).await.reason(),
        Reason::Blocked
    );
    // A peek sees the ban and does not extend it.
    let peek = s
        .gate()
        .peek(&sms, &who, 1)
        .await
        .expect("identity complete");
    assert_eq!(peek.reason(), Reason::Blocked);

    at(&s, secs(600));
    let after = check(
        &s,
        &login,
        &user("carol").with_ip("203.0.113.5".parse().expect("ip")),
    )
    .await;
    assert!(after.allowed());
    // Nothing was counted while blocked: alice's daily sms rule has seen one request.
    let ok = check(&s, &sms, &who).await;
    assert!(ok.allowed(), "{ok:?}");
    let daily = ok
        .rules()
        .into_iter()
        .find(|r| &*r.limiter == "user_id")
        .expect("user rule");
    assert_eq!(daily.remaining, 98);
}

/// A policy whose bans are its own: a violation bans from it alone, its bans are listed and
/// lifted apart, and the blocklist every policy sees still refuses it.
pub async fn blocklist_policy_scope_keeps_bans_to_the_policy<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let own = Policy::builder("sms_own")
        .limiter(
            Limiter::new(Dimension::Ip, [rule("1/1m")]).with_blocklist(BanRule::new(secs(600))),
        )
        .limiter(Limiter::new(Dimension::UserId, [rule("100/1d")]))
        .ban_scope(BanScope::Policy)
        .build()
        .expect("valid policy");
    let login = login_policy();
    let who = user("alice");
    assert!(check(&s, &own, &who).await.allowed());
    assert_eq!(check(&s, &own, &who).await.reason(), Reason::RateLimited);

    at(&s, secs(100));
    assert_eq!(check(&s, &own, &who).await.reason(), Reason::Blocked);
    assert!(
        check(&s, &login, &who).await.allowed(),
        "another policy is not refused"
    );
    let gate = s.gate();
    let mut own_bans: Vec<BanTarget> = gate
        .bans_in(&own)
        .await
        .expect("store answers")
        .into_iter()
        .map(|b| b.target)
        .collect();
    own_bans.sort();
    assert_eq!(
        own_bans,
        [
            BanTarget::Ip("192.0.2.10".parse().expect("ip")),
            BanTarget::UserId("alice".into())
        ]
    );
    assert!(gate.blocklist().await.expect("store answers").is_empty());

    // The blocklist every policy sees refuses it too.
    let carol = Identity::new()
        .with_ip("198.51.100.9".parse().expect("ip"))
        .with_user_id("carol");
    gate.ban(&BanTarget::UserId("carol".into()), secs(60))
        .await
        .expect("store answers");
    assert_eq!(check(&s, &own, &carol).await.reason(), Reason::Blocked);
    // A policy whose bans every policy sees has none of its own to lift: carol stays banned.
    let carol_ban = BanTarget::UserId("carol".into());
    assert!(
        !gate
            .unban_in(&login, &carol_ban)
            .await
            .expect("store answers")
    );
    assert_eq!(check(&s, &login, &carol).await.reason(), Reason::Blocked);

    // Lifted apart: alice is admitted again.
    for target in own_bans {
        assert!(gate.unban_in(&own, &target).await.expect("store answers"));
    }
    assert!(check(&s, &own, &who).await.allowed());
}

/// Unban lifts a ban at once; expiry lifts it at its end.
pub async fn blocklist_unban_and_expiry_lift_the_ban<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let sms = sms_policy(BanRule::new(secs(600)));
    let who = user("alice");
    check(&s, &sms, &who).await;
    check(&s, &sms, &who).await;
    let login = login_policy();
    assert_eq!(check(&s, &login, &who).await.reason(), Reason::Blocked);
    let ip = BanTarget::Ip("192.0.2.10".parse().expect("ip"));
    assert!(s.gate().unban(&ip).await.expect("store answers"));
    assert!(!s.gate().unban(&ip).await.expect("store answers"));
    // The user is still banned; a user without the banned id passes.
    assert_eq!(check(&s, &login, &who).await.reason(), Reason::Blocked);
    assert!(check(&s, &login, &user("bob")).await.allowed());
    at(&s, secs(599));
    assert_eq!(check(&s, &login, &who).await.reason(), Reason::Blocked);
    at(&s, secs(600));
    assert!(check(&s, &login, &who).await.allowed());
    assert!(
        s.gate()
            .blocklist()
            .await
            .expect("store answers")
            .is_empty()
    );
}

/// Repeat offenders are banned for 10 min, then 20, then 40, capped at 30.
pub async fn blocklist_escalation_doubles_and_caps<S: FullStore>(s: Subject<S>) {
    let sms = sms_policy(BanRule::new(secs(600)).escalate(2, secs(1800)));
    let who = user("alice");
    let mut t = Duration::ZERO;
    for expected in [600, 1200, 1800, 1800] {
        at(&s, t);
        assert!(check(&s, &sms, &who).await.allowed(), "at {t:?}");
        let denied = check(&s, &sms, &who).await;
        assert_eq!(denied.retry_after(), Some(secs(expected)), "at {t:?}");
        let bans = s.gate().blocklist().await.expect("store answers");
        assert_eq!(bans.len(), 2, "{bans:?}");
        assert!(
            bans.iter().all(|b| b.expires_in == secs(expected)),
            "{bans:?}"
        );
        t += secs(expected);
    }
}

/// Bans by hand are listed with their time left and end by themselves.
pub async fn blocklist_manual_ban_and_listing<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let mallory = BanTarget::UserId("mallory:{x}".into());
    let net = BanTarget::Ip("2001:db8::1".parse().expect("ip"));
    s.gate()
        .ban(&mallory, secs(60))
        .await
        .expect("store answers");
    s.gate().ban(&net, secs(30)).await.expect("store answers");
    at(&s, secs(10));
    let mut bans = s.gate().blocklist().await.expect("store answers");
    bans.sort_by(|a, b| a.target.cmp(&b.target));
    let listed: Vec<(BanTarget, Duration)> =
        bans.into_iter().map(|b| (b.target, b.expires_in)).collect();
    assert_eq!(
        listed,
        [(net.clone(), secs(20)), (mallory.clone(), secs(50))]
    );
    let who = Identity::new().with_user_id("mallory:{x}");
    assert_eq!(
        check(&s, &login_policy(), &who).await.reason(),
        Reason::Blocked
    );
    at(&s, secs(30));
    let left = s.gate().blocklist().await.expect("store answers");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].target, mallory);
}

/// Allowlisted networks, users and predicates pass without being counted, even when banned.
pub async fn bypass_lets_through_without_counting<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let policy = Policy::builder("stats")
        .limiter(Limiter::new(Dimension::Global, [rule("1/1m")]))
        .bypass(
            Bypass::new()
                .ip_net("10.0.0.0/8".parse().expect("net"))
                .user_id("admin")
                .when(|who| who.header("x-role") == Some("ops")),
        )
        .build()
        .expect("valid policy");
    let office = Identity::new().with_ip("10.1.2.3".parse().expect("ip"));
    let admin = user("admin");
    let ops = Identity::new().with_header("X-Role", "ops");
    for who in [&office, &admin, &ops, &office] {
        let d = check(&s, &policy, who).await;
        assert_eq!(d.reason(), Reason::Bypassed);
        assert!(d.allowed());
    }
    // Nothing was counted: the one global unit is still there for everybody else.
    assert!(check(&s, &policy, &user("bob")).await.allowed());
    assert_eq!(
        check(&s, &policy, &user("carol")).await.reason(),
        Reason::RateLimited
    );
    // A banned administrator still passes (documented).
    s.gate()
        .ban(&BanTarget::UserId("admin".into()), secs(60))
        .await
        .expect("store answers");
    assert_eq!(check(&s, &policy, &admin).await.reason(), Reason::Bypassed);
}

/// The ban count and the pages agree with the full listing: every live ban once, in the order
/// bans end (ties by key), a page at most its size, ended and lifted bans left out, and a
/// cursor still good after the ban it names was lifted.
pub async fn blocklist_counts_and_pages_in_the_order_bans_end<S: FullStore>(s: Subject<S>) {
    at(&s, Duration::ZERO);
    let store = s.gate().store();
    let prefix = s.gate().prefix();
    let count = || async { store.ban_count(prefix).await.expect("store answers") };
    assert_eq!(count().await, 0);
    assert_eq!(
        store
            .bans_page(prefix, None, 10)
            .await
            .expect("store answers"),
        tollgate::BanPage {
            bans: vec![],
            next: None
        }
    );
    // 23 bans: three end together at each of 60 s .. 480 s (ties), and one ends at 5 s.
    let mut targets = Vec::new();
    for i in 0..22u64 {
        let target = BanTarget::UserId(format!("user-{i:02}"));
        s.gate()
            .ban(&target, secs(60 * (1 + i / 3)))
            .await
            .expect("store answers");
        targets.push(target);
    }
    let brief = BanTarget::Ip("2001:db8::7".parse().expect("ip"));
    s.gate().ban(&brief, secs(5)).await.expect("store answers");
    assert_eq!(count().await, 23);

    at(&s, secs(10));
    assert_eq!(count().await, 22, "the 5 s ban has ended");
    let lifted = targets.remove(4);
    assert!(s.gate().unban(&lifted).await.expect("store answers"));
    assert_eq!(count().await, 21);

    // Listed once each, the one lifted mid-way included (its page came before).
    let mut expected_listed = targets.clone();
    expected_listed.sort();
    let mut listed = Vec::new();
    let mut after: Option<PageCursor> = None;
    let mut pages = 0;
    loop {
        let page = store
            .bans_page(prefix, after.as_ref(), 4)
            .await
            .expect("store answers");
        pages += 1;
        assert!(page.bans.len() <= 4, "{page:?}");
        listed.extend(page.bans);
        match page.next {
            // The cursor travels as text through an API.
            Some(next) => after = Some(next.to_string().parse().expect("a cursor")),
            None => break,
        }
        if pages == 2 {
            // Lifting a ban that a cursor names does not lose the page after it.
            let named = listed.last().expect("two pages").target.clone();
            assert!(s.gate().unban(&named).await.expect("store answers"));
            targets.retain(|t| *t != named);
        }
        assert!(pages < 20, "the pages never end");
    }
    assert!(pages >= 6, "21 bans in pages of 4: {pages}");
    let ends: Vec<Duration> = listed.iter().map(|b| b.expires_in).collect();
    assert!(ends.windows(2).all(|w| w[0] <= w[1]), "{ends:?}");
    let mut seen: Vec<BanTarget> = listed.iter().map(|b| b.target.clone()).collect();
    seen.sort();
    assert_eq!(seen, expected_listed, "every live ban exactly once");
    assert!(listed.iter().all(|b| b.strikes == 1));
    assert_eq!(count().await, 20);

    let mut all = s.gate().blocklist().await.expect("store answers");
    all.sort_by(|a, b| a.target.cmp(&b.target));
    let all: Vec<BanTarget> = all.into_iter().map(|b| b.target).collect();
    targets.sort();
    assert_eq!(all, targets);
}
