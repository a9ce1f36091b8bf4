//! What the store leaves in Redis: compact members, keys that expire with their state, hash
//! tags (invariants 6 and 7).

use redis::AsyncCommands;
use tollgate::{Algorithm, BanStore, LockStore, key};
use tollgate_testkit::RedisServer;

use crate::support::{PlanExt, limiter, plan, raw, rule, store};

#[tokio::test]
async fn keys_are_tagged_expiring_and_compact() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;
    let base = key::limiter_key("tg", "sms_code", "ip", "203.0.113.7");
    let rules = [
        rule("10/1m", Algorithm::SlidingLog),
        rule("20/1h", Algorithm::SlidingLog),
        rule("8/10s", Algorithm::FixedWindow),
        rule("9/1m", Algorithm::Gcra),
    ];
    let l = limiter(&base, &rules);
    for cost in [1, 1, 4] {
        assert!(
            store
                .check_plan(&plan(cost, std::slice::from_ref(&l)))
                .await
                .unwrap()
                .allowed
        );
    }

    let mut keys: Vec<String> = conn.keys("*").await.unwrap();
    keys.sort();
    let mut expected = l.state_keys();
    expected.sort();
    assert_eq!(keys, expected);
    let longest_ms = |k: &str| -> i64 {
        match k.rsplit(':').next().unwrap() {
            "l" => 3_600_000,
            "f8/10000" => 10_000,
            "g9/60000" => 60_000,
            other => panic!("unexpected key suffix {other}"),
        }
    };
    for k in &keys {
        let pttl: i64 = conn.pttl(k).await.unwrap();
        assert!(
            pttl > 0 && pttl <= longest_ms(k),
            "{k}: PTTL {pttl} ms, longest window {} ms",
            longest_ms(k)
        );
        let tag = k.split_once('{').and_then(|(_, r)| r.split_once('}'));
        assert_eq!(
            tag.map(|(t, _)| t),
            Some("sms_code:ip:203.0.113.7"),
            "{k} lacks the limiter's hash tag"
        );
    }

    let members: Vec<Vec<u8>> = conn.zrange(format!("{base}:l"), 0, -1).await.unwrap();
    assert_eq!(members.len(), 6);
    for m in &members {
        assert!(m.len() <= 12, "member of {} bytes: {m:?}", m.len());
    }
}

#[tokio::test]
async fn memory_per_admitted_entry_is_reported() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;
    let l = limiter("mem:{one}", &[rule("100000/1h", Algorithm::SlidingLog)]);
    let usage = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg("mem:{one}:l")
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await
                .unwrap();
            bytes
        }
    };
    assert!(
        store
            .check_plan(&plan(1, std::slice::from_ref(&l)))
            .await
            .unwrap()
            .allowed
    );
    let one = usage(&mut conn).await;
    // Up to 128 members Redis keeps a sorted set as a listpack.
    for _ in 0..99 {
        store
            .check_plan(&plan(1, std::slice::from_ref(&l)))
            .await
            .unwrap();
    }
    let hundred = usage(&mut conn).await;
    // Beyond that, a skiplist and a hash table.
    for _ in 0..9 {
        store
            .check_plan(&plan(100, std::slice::from_ref(&l)))
            .await
            .unwrap();
    }
    let thousand = usage(&mut conn).await;
    let count: u64 = conn.zcard("mem:{one}:l").await.unwrap();
    assert_eq!(count, 1_000);
    println!(
        "sliding-log memory: 1 entry {one} B; 100 entries {hundred} B ({:.1} B/entry, listpack); \
         1000 entries {thousand} B ({:.1} B/entry, skiplist)",
        (hundred - one) as f64 / 99.0,
        thousand as f64 / 1000.0,
    );
    assert!(one < hundred && hundred < thousand);
}

#[tokio::test]
async fn lock_and_ban_keys_expire_on_redis_time() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;
    // Long enough that the steps below all happen within it on a loaded machine.
    let ttl = std::time::Duration::from_secs(30);

    let acquired = store.lock_acquire("tg:{dup}:k", "tok", "fp", ttl).await;
    assert_eq!(acquired.unwrap(), tollgate::LockReply::Acquired);
    let held = store.lock_acquire("tg:{dup}:k", "other", "fp", ttl).await;
    let tollgate::LockReply::Held(held) = held.unwrap() else {
        panic!("a live lock was acquired twice");
    };
    // Milliseconds as given (a TTL off by a unit would be 1,000 times off).
    assert!(held.ttl_left_us > 20_000_000 && held.ttl_left_us <= 30_000_000 && !held.completed);
    let pttl: i64 = conn.pttl("tg:{dup}:k").await.unwrap();
    assert!(pttl > 20_000 && pttl <= 30_000, "lock PTTL {pttl} ms");

    let target = tollgate::BanTarget::Ip("192.0.2.7".parse().unwrap());
    store.ban("tg", &target, ttl).await.unwrap();
    for k in [target.key("tg"), tollgate::ban_index_key("tg")] {
        let pttl: i64 = conn.pttl(&k).await.unwrap();
        assert!(pttl > 20_000 && pttl <= 30_000, "{k}: PTTL {pttl} ms");
    }
    let bans = store.bans("tg").await.unwrap();
    assert_eq!(bans.len(), 1);
    assert_eq!(bans[0].target, target);
    assert!(store.unban("tg", &target).await.unwrap());
    assert!(store.bans("tg").await.unwrap().is_empty());
}
