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
        rules: &rules,
        ban: None,
        shadow: false,
    }];
    store.check_now(&CheckRequest::new(cost, true, &limiters))
}

#[test]
fn a_full_shard_evicts_the_least_recently_used_key() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .max_keys(2)
        .purge_interval(None)
        .build();
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

#[test]
fn eviction_spares_keys_over_their_limits_bans_and_locks() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .max_keys(3)
        .purge_interval(None)
        .build();
    // The oldest key is over its limit; a lock and a ban fill the rest.
    assert!(check(&store, "hot", &["1/1h"], 1).unwrap().allowed);
    assert!(!check(&store, "hot", &["1/1h"], 1).unwrap().allowed);
    clock.advance(Duration::from_millis(1));
    store
        .inner
        .lock_acquire("lock", "t", "f", Duration::from_secs(60))
        .unwrap();
    store.inner.ban(
        "tg",
        &BanTarget::UserId("u".into()),
        Duration::from_secs(60),
    );
    clock.advance(Duration::from_millis(1));
    // Only `hot` can go; it goes, since nothing else can.
    assert!(check(&store, "new", &["1/1h"], 1).unwrap().allowed);
    assert_eq!(store.evictions(), 1);
    // With a quiet key beside it, the quiet one goes first.
    for round in 0..20 {
        clock.advance(Duration::from_millis(1));
        let quiet = format!("quiet{round}");
        assert!(check(&store, &quiet, &["1/1h"], 1).unwrap().allowed);
        clock.advance(Duration::from_millis(1));
        assert!(!check(&store, &quiet, &["1/1h"], 1).unwrap().allowed || round > 0);
    }
    assert_eq!(store.inner.bans("tg").len(), 1);
    assert!(matches!(
        store
            .inner
            .lock_acquire("lock", "t2", "f", Duration::from_secs(60)),
        Ok(LockReply::Held(_))
    ));
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
        rules: &rules,
        ban: None,
        shadow: false,
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
    let shards: std::collections::HashSet<_> = (0..200)
        .map(|i| {
            let key = key::limiter_key("tg", "s", "ip", &i.to_string());
            store.inner.shards.shard_of(store.inner.shards.hash(&key))
        })
        .collect();
    assert!(shards.len() > 32, "{}", shards.len());
}

/// A store holds up to millions of entries: a one-rule key's entry stays within 72 bytes
/// (beside its key's text and the table's index), for about 145 bytes per key in all.
#[test]
#[cfg(target_pointer_width = "64")]
fn entries_stay_small() {
    assert!(std::mem::size_of::<Option<super::map::Entry>>() <= 72);
    assert!(std::mem::size_of::<super::rules::RuleStates>() <= 48);
}
