//! Nothing an attacker can grow is walked whole: with 100k live bans, counting them (every
//! metrics scrape) and reading a page of them each cost Redis well under a millisecond,
//! measured by the server itself (`SLOWLOG` at 1 ms, and `INFO commandstats`).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tollgate::{BanStore, BanTarget, ban_index_key};
use tollgate_testkit::RedisServer;

use crate::support::{raw, store};

const BANS: u64 = 100_000;

/// Writes `n` live bans under `prefix`, 10k per script call, as ban.lua lays them out (a hash
/// per ban, the index scored by the ban's end): far faster than `n` admin calls. The bans end
/// between one and two hours from now, many at the same µs (ties in the index).
async fn write_bans(conn: &mut MultiplexedConnection, prefix: &str, n: u64) {
    let script = redis::Script::new(
        r"
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
        for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
          local key = ARGV[1] .. ':ban:user_id:u' .. i
          local until_us = now + 3600000000 + (i % 5000) * 1000000
          local u = string.format('%d', until_us)
          redis.call('HSET', key, 'u', u, 's', '1', 'x', u, 'k', 'user_id', 'v', 'u' .. i)
          redis.call('PEXPIRE', key, 7200000)
          redis.call('ZADD', KEYS[1], u, key)
        end
        redis.call('PEXPIRE', KEYS[1], 7200000)
        return redis.call('ZCARD', KEYS[1])
        ",
    );
    let mut written = 0;
    for from in (1..=n).step_by(10_000) {
        written = script
            .key(ban_index_key(prefix))
            .arg(prefix)
            .arg(from)
            .arg((from + 9_999).min(n))
            .invoke_async(conn)
            .await
            .unwrap();
    }
    assert_eq!(written, n);
}

/// Commands that took 1 ms or more since the last reset, as `SLOWLOG GET` shows them.
async fn slow_entries(conn: &mut MultiplexedConnection) -> Vec<redis::Value> {
    redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(128)
        .query_async(conn)
        .await
        .unwrap()
}

/// `(calls, usec)` of one command in `INFO commandstats`.
async fn command_stats(conn: &mut MultiplexedConnection, command: &str) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
        .unwrap_or_else(|| panic!("no {command} in\n{info}"));
    let field = |name: &str| -> u64 {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    (field("calls"), field("usec"))
}

#[tokio::test]
async fn counting_and_paging_100k_bans_costs_redis_under_a_millisecond() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;
    write_bans(&mut conn, "many", BANS).await;
    // And one real ban through the store, which trims and keeps the index as ban.lua does.
    let mallory = BanTarget::UserId("mallory".into());
    store
        .ban("many", &mallory, Duration::from_secs(60))
        .await
        .unwrap();

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(1000)
        .query_async(&mut conn)
        .await
        .unwrap();
    // The measurement works: walking the index, as listing every ban in one call did, is slow.
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut conn)
        .await
        .unwrap();
    let walked: u64 =
        redis::Script::new("return #redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '+inf')")
            .key(ban_index_key("many"))
            .invoke_async(&mut conn)
            .await
            .unwrap();
    assert_eq!(walked, BANS + 1);
    assert!(
        !slow_entries(&mut conn).await.is_empty(),
        "a walk over 100k bans should take over 1 ms (is the slowlog on?)"
    );

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let counts = 50;
    for _ in 0..counts {
        assert_eq!(store.ban_count("many").await.unwrap(), BANS + 1);
    }
    // One ZCOUNT per count, nothing read ban by ban, and well under 1 ms of Redis time each
    // (averaged by the server: one call preempted on a busy machine does not decide).
    let (calls, usec) = command_stats(&mut conn, "evalsha").await;
    assert_eq!(calls, counts);
    assert_eq!(command_stats(&mut conn, "zcount").await.0, counts);
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    for walk in ["cmdstat_hmget", "cmdstat_hget", "cmdstat_zrange"] {
        assert!(
            !info.contains(walk),
            "a count read bans one by one:\n{info}"
        );
    }
    println!(
        "ban_count over {} bans: {:.1} µs of Redis time per call",
        BANS + 1,
        usec as f64 / calls as f64
    );
    assert!(usec < calls * 1000, "{usec} µs for {calls} counts");

    // A page reads its own bans only: from the start, and from a cursor deep in the index.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let first = store.bans_page("many", None, 100).await.unwrap();
    assert_eq!(first.bans.len(), 100);
    assert_eq!(first.bans[0].target, mallory, "the ban that ends first");
    let mut after = first.next;
    let pages = 300;
    for _ in 1..pages {
        let page = store.bans_page("many", after.as_ref(), 100).await.unwrap();
        assert_eq!(page.bans.len(), 100);
        after = page.next;
    }
    let (calls, usec) = command_stats(&mut conn, "evalsha").await;
    assert_eq!(calls, pages);
    let (hmgets, _) = command_stats(&mut conn, "hmget").await;
    assert_eq!(hmgets, pages * 100, "one HMGET per listed ban, no more");
    let (ranges, _) = command_stats(&mut conn, "zrange").await;
    assert!(
        ranges <= pages * 2,
        "{ranges} ZRANGE calls for {pages} pages"
    );
    println!(
        "bans_page of 100 over {} bans: {:.1} µs of Redis time per page",
        BANS + 1,
        usec as f64 / calls as f64
    );
}
