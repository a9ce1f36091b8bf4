//! Listing overrides never walks them whole: with 100k live overrides, a page costs Redis a
//! page's worth of work (one script call that reads the index from a rank, and one `GET` per
//! override listed), measured by the server itself (`INFO commandstats`). An index entry
//! whose override is gone (what a Cluster's set leaves if it stops between its two writes)
//! is stepped over.

use redis::aio::MultiplexedConnection;
use tollgate::{OverrideStore, PageCursor, key};
use tollgate_testkit::RedisServer;

use crate::support::{raw, store};

const OVERRIDES: u64 = 100_000;

/// Writes `n` live overrides as override.lua lays them out (a string per override, the index
/// scored by its end), 10k per script call: every tenth never ends, the others end between one
/// and two hours from now, many at the same µs (ties in the index).
async fn write_overrides(conn: &mut MultiplexedConnection, index: &str, n: u64) {
    let script = redis::Script::new(
        r"
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
        for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
          local key = 'many:{u' .. i .. '}:o'
          local ends, score = 0, '+inf'
          if i % 10 ~= 0 then
            ends = now + 3600000000 + (i % 5000) * 1000000
            score = string.format('%d', ends)
          end
          local value = '7:' .. string.format('%d', ends) .. ':9\napi\nuser_id\nu' .. i
          redis.call('SET', key, value, 'PX', 7200000)
          redis.call('ZADD', KEYS[1], score, key)
        end
        redis.call('PEXPIRE', KEYS[1], 7200000)
        return redis.call('ZCARD', KEYS[1])
        ",
    );
    let mut written = 0;
    for from in (1..=n).step_by(10_000) {
        written = script
            .key(index)
            .arg(from)
            .arg((from + 9_999).min(n))
            .invoke_async(conn)
            .await
            .unwrap();
    }
    assert_eq!(written, n);
}

/// `calls` of one command in `INFO commandstats` (0 if it was not called).
async fn calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn paging_100k_overrides_reads_a_page_at_a_time() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;
    let index = key::override_index_key("many");
    write_overrides(&mut conn, &index, OVERRIDES).await;
    // An entry that has ended, and one without its override among those that end first (at
    // the end of `u1`'s, which it ties with).
    let _: () = redis::Script::new(
        r"
        redis.call('ZADD', KEYS[1], 1, 'many:{ended}:o')
        local ends = redis.call('ZSCORE', KEYS[1], 'many:{u1}:o')
        redis.call('ZADD', KEYS[1], ends, 'many:{gone}:o')
        ",
    )
    .key(&index)
    .invoke_async(&mut conn)
    .await
    .unwrap();

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    // 300 pages of 100 from the start (the ended entry trimmed, the one without its override
    // stepped over), then the last pages, of overrides that never end.
    let pages = 300;
    let mut after: Option<PageCursor> = None;
    let mut listed = Vec::new();
    for _ in 0..pages {
        let page = store
            .overrides_page(&index, after.as_ref(), 100)
            .await
            .unwrap();
        assert_eq!(page.overrides.len(), 100);
        listed.extend(page.overrides);
        after = page.next;
    }
    let evals = calls(&mut conn, "evalsha").await;
    let gets = calls(&mut conn, "get").await;
    let ranges = calls(&mut conn, "zrange").await;
    assert!(evals <= pages + 1, "{evals} script calls for {pages} pages");
    // One range read a page: a page starts at its rank, found without reading the keys
    // before it, those that end with the cursor's key included.
    assert!(ranges <= pages + 1, "{ranges} ZRANGEs for {pages} pages");
    assert!(
        gets <= pages * 100 + 1,
        "{gets} GETs for {} overrides listed",
        pages * 100
    );
    let ends: Vec<u64> = listed
        .iter()
        .map(|o| o.expires_at_us.unwrap_or(u64::MAX))
        .collect();
    assert!(ends.windows(2).all(|w| w[0] <= w[1]));
    assert!(listed.iter().all(|o| o.limits == [9] && o.policy == "api"));

    // From a cursor among the overrides that never end (10k of them tie), whose key is not
    // in the index: the rest of them, once each, and no page reads those before it.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let deep = PageCursor::new(u64::MAX, "many:{u5}:o");
    let mut after = Some(deep);
    let (mut never, mut pages) = (Vec::new(), 0);
    while let Some(cursor) = after {
        pages += 1;
        let page = store
            .overrides_page(&index, Some(&cursor), 1000)
            .await
            .unwrap();
        assert!(page.overrides.iter().all(|o| o.expires_at_us.is_none()));
        never.extend(page.overrides.into_iter().map(|o| o.value));
        after = page.next;
    }
    // The never-ending overrides are keyed `many:{u<i>}:o` for i a multiple of 10, sorted as
    // text: those after `many:{u5}:o` are those whose key sorts after it.
    let expected = (1..=OVERRIDES / 10)
        .map(|i| format!("many:{{u{}}}:o", i * 10))
        .filter(|k| k.as_str() > "many:{u5}:o")
        .count();
    let mut unique = never.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((never.len(), unique.len()), (expected, expected));
    // A range read a page, and the first page's start found by halving the 10k that tie
    // (14 single reads), not by stepping over the 5k before the cursor.
    let ranges = calls(&mut conn, "zrange").await;
    assert!(ranges <= pages + 14, "{ranges} ZRANGEs for {pages} pages");
}
