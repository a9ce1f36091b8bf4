use super::*;
use crate::{
    ManualClock, key,
    rule::{Algorithm, Rule},
    store::LimiterRequest,
};

/// Checks one limiter on `key`.
fn check(store: &MemoryStore, key: &str, rules: &[&str], cost: u64) -> Result<Verdict, StoreError> {
    let rules: Vec<Rule> = rules.iter().map(|r| r.parse().unwrap()).collect();
    let limiters = [LimiterRequest {
        key,
        compact: &[],
        rules: &rules,
        ban: None,
        shadow: false,
        overrides: None,
    }];
    store.check_now(&CheckRequest::new(cost, true, &limiters))
}

/// A store of one shard on a manual clock, without a background sweep, with the budgets
/// `budgets` sets.
fn one_shard(
    budgets: impl FnOnce(MemoryStoreBuilder) -> MemoryStoreBuilder,
) -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let builder = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .purge_interval(None);
    (budgets(builder).build(), clock)
}

#[test]
fn a_full_shard_evicts_the_least_recently_used_key() {
    let (store, clock) = one_shard(|b| b.max_keys(2));
    assert!(check(&store, "a", &["5/1m"], 1).unwrap().allowed);
    clock.advance(Duration::from_millis(1));
    assert!(check(&store, "b", &["5/1m"], 1).unwrap().allowed);
    clock.advance(Duration::from_millis(1));
    // `a` is used again: `b` is now the least recently used.
    assert!(check(&store, "a", &["5/1m"], 1).unwrap().allowed);
    clock.advance(Duration::from_millis(1));
    assert!(check(&store, "c", &["5/1m"], 1).unwrap().allowed);
    assert_eq!((store.len(), store.evictions()), (2, 1));
    // `a` kept its count (two of five used), `b` forgot its one.
    assert_eq!(
        check(&store, "a", &["5/1m"], 0).unwrap().rules[0].remaining,
        3
    );
    assert_eq!(
        check(&store, "b", &["5/1m"], 0).unwrap().rules[0].remaining,
        5
    );
}

/// Quiet keys go before a key at its limit; when the key at its limit goes too, it stays
/// denied until its state would have ended (eviction gives no quota back early).
#[test]
fn eviction_spares_keys_at_their_limits_and_never_gives_their_quota_back() {
    let (store, clock) = one_shard(|b| b.max_keys(2));
    assert!(check(&store, "hot", &["1/1h"], 1).unwrap().allowed);
    assert!(!check(&store, "hot", &["1/1h"], 1).unwrap().allowed);
    for round in 0..20 {
        clock.advance(Duration::from_millis(1));
        let quiet = format!("quiet{round}");
        assert!(check(&store, &quiet, &["5/1h"], 1).unwrap().allowed);
    }
    assert_eq!(
        store.evictions(),
        19,
        "each quiet key made room by evicting the last"
    );
    assert!(!check(&store, "hot", &["1/1h"], 1).unwrap().allowed);

    // Keys at their limits only: `hot`, the least recently used of them, is evicted.
    for round in 0..2 {
        clock.advance(Duration::from_millis(1));
        let full = format!("full{round}");
        assert!(check(&store, &full, &["1/1h"], 1).unwrap().allowed);
    }
    assert_eq!(store.usage().limiter_keys, 2);
    clock.advance(Duration::from_secs(60));
    let verdict = check(&store, "hot", &["1/1h"], 1).unwrap();
    assert!(
        !verdict.allowed,
        "an evicted key at its limit got its quota back"
    );
    let waited = Duration::from_millis(22) + Duration::from_secs(60);
    assert_eq!(
        verdict.rules[0].retry_after_us,
        Some((Duration::from_secs(3600) - waited).as_micros() as u64)
    );
    // A peek is told nothing is left, and admits nothing.
    let peek = check(&store, "hot", &["1/1h"], 0).unwrap();
    assert_eq!(peek.rules[0].remaining, 0);
    // Once the hour has passed, `hot` starts afresh.
    clock.advance(Duration::from_secs(3600) - waited);
    assert!(check(&store, "hot", &["1/1h"], 1).unwrap().allowed);
}

/// A charge (a settlement past the estimate) of a key evicted at its limit keeps it denied,
/// for longer: it never makes an entry of the debt alone, which would hide what the key owes
/// and hand it a fresh quota.
#[test]
fn a_charge_of_an_evicted_key_keeps_it_denied_for_the_debt_too() {
    let (store, clock) = one_shard(|b| b.max_keys(1));
    assert!(check(&store, "hot", &["2/1h"], 2).unwrap().allowed);
    clock.advance(Duration::from_millis(1));
    assert!(check(&store, "other", &["1/1h"], 1).unwrap().allowed);
    assert_eq!(store.evictions(), 1);
    let rules: Vec<Rule> = vec!["2/1h".parse().unwrap()];
    let limiters = [LimiterRequest {
        key: "hot",
        compact: &[],
        rules: &rules,
        ban: None,
        shadow: false,
        overrides: None,
    }];
    store.inner.charge(&CheckRequest::new(1, true, &limiters));
    for _ in 0..3 {
        assert!(!check(&store, "hot", &["2/1h"], 1).unwrap().allowed);
    }
    // Past the hour its evicted state would have lasted, the debt's hour still holds it.
    clock.advance(Duration::from_secs(3601));
    assert!(!check(&store, "hot", &["2/1h"], 1).unwrap().allowed);
    clock.advance(Duration::from_secs(3600));
    assert!(check(&store, "hot", &["2/1h"], 1).unwrap().allowed);
}

/// A reset forgives what an evicted key owed: it starts afresh at once.
#[test]
fn a_reset_forgives_an_evicted_key() {
    let (store, clock) = one_shard(|b| b.max_keys(1));
    assert!(check(&store, "hot", &["1/1h"], 1).unwrap().allowed);
    clock.advance(Duration::from_millis(1));
    assert!(check(&store, "other", &["1/1h"], 1).unwrap().allowed);
    assert_eq!(
        check(&store, "hot", &["1/1h"], 0).unwrap().rules[0].remaining,
        0
    );
    let rules: Vec<Rule> = vec!["1/1h".parse().unwrap()];
    let limiters = [LimiterRequest {
        key: "hot",
        compact: &[],
        rules: &rules,
        ban: None,
        shadow: false,
        overrides: None,
    }];
    store.inner.reset(&CheckRequest::new(1, true, &limiters));
    assert_eq!(
        check(&store, "hot", &["1/1h"], 0).unwrap().rules[0].remaining,
        1
    );
}

/// A ban that has ended is kept a while to remember its strikes, but that memory never keeps
/// a new ban out: a full ban budget makes room by forgetting an ended ban.
#[test]
fn remembered_strikes_make_room_for_a_new_ban() {
    let (store, clock) = one_shard(|b| b.max_bans(2));
    let day = Duration::from_secs(86_400);
    for user in ["a", "b"] {
        let target = BanTarget::UserId(user.into());
        // Banned for a day, then for ten minutes: the entry remembers it for the day.
        store.inner.ban("tg", &target, day);
        store.inner.ban("tg", &target, Duration::from_secs(600));
    }
    clock.advance(Duration::from_secs(660));
    assert!(store.inner.bans("tg").is_empty(), "both bans have ended");
    store.inner.ban(
        "tg",
        &BanTarget::UserId("c".into()),
        Duration::from_secs(3600),
    );
    let banned: Vec<_> = store
        .inner
        .bans("tg")
        .into_iter()
        .map(|b| b.target)
        .collect();
    assert_eq!(banned, [BanTarget::UserId("c".into())]);
    assert_eq!(store.usage().dropped_bans, 0);
}

/// Locks and bans have budgets of their own: a flood of either, kept for years, never makes a
/// rate-limit check fail, and a full budget refuses the new lock or ban (never lifting one in
/// force).
#[test]
fn a_lock_or_ban_flood_never_reaches_a_check() {
    let (store, clock) = one_shard(|b| b.max_keys(4).max_locks(8).max_bans(8));
    let decade = Duration::from_secs(3650 * 86_400);
    for i in 0..8 {
        let reply = store
            .inner
            .lock_acquire(&format!("lock{i}"), "t", "f", decade);
        assert!(matches!(reply, Ok(LockReply::Acquired)));
    }
    let refused = store
        .inner
        .lock_acquire("lock8", "t", "f", decade)
        .unwrap_err();
    assert!(refused.is_capacity(), "{refused}");
    for i in 0..20u64 {
        let target = BanTarget::UserId(format!("u{i}"));
        store
            .inner
            .ban("tg", &target, decade + Duration::from_secs(i));
    }
    let usage = store.usage();
    assert_eq!((usage.locks, usage.bans, usage.dropped_bans), (8, 8, 12));
    // The bans in force stay: the first eight written.
    let kept: Vec<_> = store
        .inner
        .bans("tg")
        .into_iter()
        .map(|b| b.target)
        .collect();
    let first: Vec<_> = (0..8).map(|i| BanTarget::UserId(format!("u{i}"))).collect();
    assert_eq!(kept.len(), 8);
    assert!(first.iter().all(|t| kept.contains(t)), "{kept:?}");

    for i in 0..50 {
        let client = format!("client{i}");
        assert!(check(&store, &client, &["1/1m"], 1).unwrap().allowed);
        assert!(!check(&store, &client, &["1/1m"], 1).unwrap().allowed);
    }
    assert_eq!(store.usage().limiter_keys, 4);
    // Once the bans end, new ones find room again.
    clock.advance(decade + Duration::from_secs(60));
    let late = BanTarget::UserId("late".into());
    store.inner.ban("tg", &late, Duration::from_secs(60));
    assert!(store.inner.bans("tg").iter().any(|b| b.target == late));
}

/// Stored responses have a budget in bytes; a response past it is refused, and the room comes
/// back when the lock ends.
#[test]
fn stored_responses_have_a_byte_budget() {
    let (store, clock) = one_shard(|b| b.max_response_bytes(1_000));
    let ttl = Duration::from_secs(60);
    for key in ["a", "b"] {
        store.inner.lock_acquire(key, "t", "f", ttl).unwrap();
    }
    assert!(store.inner.lock_complete("a", "t", &[7; 600], ttl).unwrap());
    let refused = store
        .inner
        .lock_complete("b", "t", &[7; 600], ttl)
        .unwrap_err();
    assert!(refused.is_capacity(), "{refused}");
    assert_eq!(store.usage().response_bytes, 600);
    // A lock that holds nothing completes as before.
    assert!(!store.inner.lock_complete("c", "t", &[7; 600], ttl).unwrap());

    // Without a background sweep, the expired response still counts, until a full budget
    // sweeps the shard.
    clock.advance(ttl);
    assert_eq!(store.usage().response_bytes, 600);
    store.inner.lock_acquire("b", "t", "f", ttl).unwrap();
    assert!(store.inner.lock_complete("b", "t", &[7; 600], ttl).unwrap());
    assert_eq!(store.usage().response_bytes, 600);
}

/// A lock asked for again by its holder (a call sent twice) is still its holder's, and its
/// completion told again with the same response stands; anyone else finds it held.
#[test]
fn a_lock_call_sent_twice_answers_as_the_first() {
    let store = MemoryStore::new();
    let ttl = Duration::from_secs(60);
    for _ in 0..2 {
        let reply = store.inner.lock_acquire("k", "t", "f", ttl).unwrap();
        assert!(matches!(reply, crate::LockReply::Acquired));
    }
    let other = store.inner.lock_acquire("k", "u", "f", ttl).unwrap();
    assert!(matches!(other, crate::LockReply::Held(_)));
    for _ in 0..2 {
        assert!(store.inner.lock_complete("k", "t", b"r", ttl).unwrap());
    }
    assert!(!store.inner.lock_complete("k", "t", b"s", ttl).unwrap());
    let again = store.inner.lock_acquire("k", "t", "f", ttl).unwrap();
    assert!(matches!(again, crate::LockReply::Held(held) if held.completed));
    assert_eq!(store.usage().response_bytes, 1, "the response counted once");
}

/// A flood of new keys, three times the cap, while one client is over its limit: that
/// client stays denied, memory stays bounded, and every newcomer is limited.
#[test]
fn a_key_flood_never_turns_limiting_off() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let cap = 4_096;
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(8)
        .max_keys(cap)
        .purge_interval(None)
        .build();
    assert!(check(&store, "hot", &["1/1d"], 1).unwrap().allowed);
    let mut over_admitted = 0;
    for i in 0..3 * cap {
        let key = format!("flood{i}");
        assert!(check(&store, &key, &["1/1d"], 1).unwrap().allowed);
        // A newcomer is limited: its second request in the window is denied.
        assert!(!check(&store, &key, &["1/1d"], 1).unwrap().allowed, "{key}");
        if i % 16 == 0 && check(&store, "hot", &["1/1d"], 1).unwrap().allowed {
            over_admitted += 1;
        }
        assert!(store.len() <= cap);
    }
    assert_eq!(over_admitted, 0);
    assert!(store.evictions() >= 2 * cap as u64);
}

#[test]
fn one_key_holds_every_rule_of_a_limiter() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .purge_interval(None)
        .build();
    let rules: Vec<Rule> = vec![
        "2/1s".parse::<Rule>().unwrap(),
        "3/1s".parse::<Rule>().unwrap(),
        "2/1s"
            .parse::<Rule>()
            .unwrap()
            .with_algorithm(Algorithm::Gcra),
        "2/1s"
            .parse::<Rule>()
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow),
    ];
    let limiter = [LimiterRequest {
        key: "k",
        compact: &[],
        rules: &rules,
        ban: None,
        shadow: false,
        overrides: None,
    }];
    let plan = CheckRequest::new(1, true, &limiter);
    assert!(store.check_now(&plan).unwrap().allowed);
    assert!(store.check_now(&plan).unwrap().allowed);
    assert_eq!(store.len(), 1);
    let denied = store.check_now(&plan).unwrap();
    assert!(!denied.allowed);
    assert_eq!(
        denied.rules.iter().map(|o| o.remaining).collect::<Vec<_>>(),
        [0, 1, 0, 0]
    );
    // Once everything expired, the entry starts over (and is reused, not added).
    clock.advance(Duration::from_secs(2));
    let again = store.check_now(&plan).unwrap();
    assert!(again.allowed);
    assert_eq!(
        again.rules.iter().map(|o| o.remaining).collect::<Vec<_>>(),
        [1, 2, 1, 1]
    );
    assert_eq!(store.len(), 1);
}

#[test]
fn sweep_drops_expired_keys() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .purge_interval(None)
        .build();
    for i in 0..100 {
        check(&store, &format!("k{i}"), &["5/1s", "2/1s"], 1).unwrap();
    }
    assert_eq!(store.len(), 100);
    clock.advance(Duration::from_millis(999));
    store.purge_expired();
    assert_eq!(store.len(), 100);
    clock.advance(Duration::from_millis(1));
    store.purge_expired();
    assert!(store.is_empty());
}

#[test]
fn background_sweeper_runs_and_stops_with_the_store() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .purge_interval(Some(Duration::from_millis(5)))
        .build();
    check(&store, "k", &["5/1s"], 1).unwrap();
    clock.advance(Duration::from_secs(5));
    // Wait (bounded) for the sweeper thread to observe the advanced clock.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !store.is_empty() {
        assert!(std::time::Instant::now() < deadline, "sweeper never ran");
        thread::sleep(Duration::from_millis(5));
    }
    let weak = Arc::downgrade(&store.inner);
    drop(store);
    // The sweeper holds the store only while sweeping; it must let go within a sweep.
    while weak.strong_count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper keeps the store alive"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn keys_spread_over_shards() {
    let store = MemoryStore::builder().purge_interval(None).build();
    let shards: std::collections::HashSet<_> = (0..2000)
        .map(|i| {
            let key = key::limiter_key("tg", "s", "ip", &i.to_string());
            store.inner.shards.shard_of(store.inner.shards.hash(&key))
        })
        .collect();
    assert_eq!(shards.len(), store.inner.shards.count());
}

/// A default store has eight shards a core (threads seldom meet in one), at least 16 and at
/// most 64 (each shard more is cache lines more for a check over many keys).
#[test]
fn default_shards_follow_the_cores() {
    let cores = thread::available_parallelism().map_or(8, usize::from);
    let count = MemoryStore::new().inner.shards.count();
    assert!((16..=64).contains(&count), "{count}");
    assert!(
        count >= (8 * cores).min(64),
        "{count} shards for {cores} cores"
    );
    assert!(
        count < 16 * cores || count == 16,
        "{count} shards for {cores} cores"
    );
}

/// A store holds up to millions of entries: a one-rule key's entry stays within 72 bytes
/// (beside its key's text and the table's index), for about 145 bytes per key in all.
#[test]
#[cfg(target_pointer_width = "64")]
fn entries_stay_small() {
    assert!(std::mem::size_of::<Option<super::map::Entry>>() <= 72);
    assert!(std::mem::size_of::<super::rules::RuleStates>() <= 48);
}

/// A GCRA receipt older than the rule's period gives nothing back: its units came back by
/// time already (a stale receipt refunded again and again would otherwise lift the limit).
#[test]
fn a_stale_gcra_receipt_refunds_nothing() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .purge_interval(None)
        .build();
    let rules: Vec<Rule> = vec![
        "1/1m"
            .parse::<Rule>()
            .unwrap()
            .with_algorithm(Algorithm::Gcra),
    ];
    let limiters = [LimiterRequest {
        key: "k",
        compact: &[],
        rules: &rules,
        ban: None,
        shadow: false,
        overrides: None,
    }];
    let request = CheckRequest::new(1, true, &limiters);
    let old = store.check_now(&request).unwrap().receipt.unwrap();
    clock.advance(Duration::from_secs(120));
    assert!(store.check_now(&request).unwrap().allowed);
    store.inner.refund(&request, Some(&old));
    assert!(
        !store.check_now(&request).unwrap().allowed,
        "a stale receipt gave a unit back"
    );
}

#[test]
fn a_leased_policy_counts_here_as_any_other() {
    // The memory store is in this process: a lease would save nothing, and it takes none.
    let gate = crate::Tollgate::new(MemoryStore::new());
    let rule = "3/1m"
        .parse::<Rule>()
        .unwrap()
        .with_algorithm(Algorithm::FixedWindow);
    let policy = crate::Policy::builder("leased")
        .limiter(crate::Limiter::new(crate::Dimension::Ip, [rule]))
        .lease(crate::QuotaLease::new(Duration::from_secs(1)))
        .build()
        .unwrap();
    let who = crate::Identity::new().with_ip("192.0.2.5".parse().unwrap());
    let remaining: Vec<Option<u64>> = (0..4)
        .map(|_| {
            let d = gate.check_sync(&policy, &who, 1).unwrap().unwrap();
            d.allowed().then(|| d.remaining().unwrap())
        })
        .collect();
    assert_eq!(remaining, [Some(2), Some(1), Some(0), None]);
}

#[test]
fn overrides_are_bounded_and_the_ended_ones_make_room() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(2)
        .purge_interval(None)
        .build();
    let rules: Vec<Rule> = vec!["5/1m".parse().unwrap()];
    let fingerprint = crate::fingerprint(&rules);
    let limiter = |key: &'static str| LimiterRequest {
        key,
        compact: &[],
        rules: Box::leak(rules.clone().into_boxed_slice()),
        ban: None,
        shadow: false,
        overrides: Some(fingerprint),
    };
    let entry = |value: &str| {
        crate::Override::new(("p", "l", value), &rules, &["9/1m".parse().unwrap()]).unwrap()
    };
    let set = |key: &'static str, ttl: Option<Duration>| {
        crate::ready_now(store.set_override(&limiter(key), "", &entry(key), ttl))
    };
    set("a", Some(Duration::from_secs(10))).unwrap();
    set("b", None).unwrap();
    // Replacing one is no new one.
    set("b", None).unwrap();
    let full = set("c", None).unwrap_err();
    assert_eq!(full.kind(), crate::StoreErrorKind::Capacity, "{full}");
    // `a` ends: its room goes to `c`.
    clock.advance(Duration::from_secs(10));
    set("c", None).unwrap();
    let listed: Vec<String> = crate::ready_now(store.overrides(""))
        .unwrap()
        .into_iter()
        .map(|o| o.value)
        .collect();
    assert_eq!(listed, ["b", "c"]);
    // Removed, one is room again.
    assert!(crate::ready_now(store.remove_override(&limiter("b"), "")).unwrap());
    set("d", None).unwrap();
}

#[test]
fn engines_sharing_a_store_each_list_their_own_overrides() {
    let store = Arc::new(MemoryStore::new());
    let a = crate::Tollgate::new(store.clone()).with_prefix("a");
    let b = crate::Tollgate::new(store).with_prefix("b");
    let rules: [Rule; 1] = ["5/1m".parse().unwrap()];
    let policy = crate::Policy::builder("p")
        .limiter(crate::Limiter::new(crate::Dimension::Ip, rules).with_overrides(true))
        .build()
        .unwrap();
    let who = |ip: &str| crate::Identity::new().with_ip(ip.parse().unwrap());
    let raised: [Rule; 1] = ["9/1m".parse().unwrap()];
    for (gate, ip) in [(&a, "192.0.2.1"), (&b, "192.0.2.2")] {
        crate::ready_now(gate.set_override(&policy, "ip", &who(ip), &raised, None)).unwrap();
    }
    let listed = |gate: &crate::Tollgate<Arc<MemoryStore>>| -> Vec<String> {
        let all = crate::ready_now(gate.overrides()).unwrap();
        all.into_iter().map(|o| o.value).collect()
    };
    assert_eq!(listed(&a), ["192.0.2.1"]);
    assert_eq!(listed(&b), ["192.0.2.2"]);
}

/// Compact keys name the engine's prefix and the limiter by number: engines of different
/// prefixes sharing a store count apart, and a policy built again (a configuration reloaded)
/// counts on the keys of the one it replaces.
#[test]
fn compact_keys_tell_prefixes_apart_and_survive_a_rebuilt_policy() {
    let store = Arc::new(MemoryStore::new());
    let a = crate::Tollgate::new(store.clone()).with_prefix("a");
    let b = crate::Tollgate::new(store.clone()).with_prefix("b");
    let also_a = crate::Tollgate::new(store).with_prefix("a");
    let policy = |scope: &str| {
        let rules: [Rule; 1] = ["1/1m".parse().unwrap()];
        crate::Policy::builder(scope)
            .limiter(crate::Limiter::new(crate::Dimension::Ip, rules))
            .build()
            .unwrap()
    };
    let who = crate::Identity::new().with_ip("192.0.2.1".parse().unwrap());
    let allowed = |gate: &crate::Tollgate<Arc<MemoryStore>>, policy: &crate::Policy| {
        crate::ready_now(gate.check(policy, &who, 1))
            .unwrap()
            .allowed()
    };
    let (p, q) = (policy("p"), policy("q"));
    assert!(allowed(&a, &p));
    assert!(allowed(&b, &p), "another prefix counts apart");
    assert!(allowed(&a, &q), "another policy counts apart");
    assert!(
        !allowed(&a, &policy("p")),
        "the same policy built again shares the count"
    );
    assert!(
        !allowed(&also_a, &p),
        "an engine of the same prefix shares the count"
    );
}
