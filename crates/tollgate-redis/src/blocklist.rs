//! Counting and listing bans from the ban index (`prefix:{ban}:index`, a sorted set of ban
//! keys scored by the end of the ban), without reading every ban in one call.
//!
//! Every ban script keeps the index exact: `ban.lua`, `offend.lua` and a banning `check.lua`
//! add the key with its end, `unban.lua` removes it, and each write trims the bans that ended.
//! So the live bans are the index entries scored after now: `ban_count.lua` counts them with
//! one `ZCOUNT` (O(log n)), and `bans.lua` reads one page from a rank (O(log n + page)).

use std::time::Duration;

use redis::Value;
use tollgate::{BanCursor, BanEntry, BanPage, BanTarget, StoreError, ban_index_key};

use crate::{backend::Backend, script::protocol};

/// The page size [`all`] reads with: each call stays short, however many bans there are.
const LIST_PAGE: usize = 1000;

/// How many bans under `prefix` have not ended.
pub(crate) async fn count(store: &Backend, prefix: &str) -> Result<u64, StoreError> {
    let mut call = store.scripts.ban_count.call();
    call.key(ban_index_key(prefix)).arg(store.now_arg());
    let mut conn = store.conn();
    store
        .bounded_store("count bans", async {
            call.invoke(&mut conn)
                .await
                .map_err(|e| store.redis_error("count bans", e))
        })
        .await
}

/// One page of at most `limit` bans after `after`, in the order they end.
pub(crate) async fn page(
    store: &Backend,
    prefix: &str,
    after: Option<&BanCursor>,
    limit: usize,
) -> Result<BanPage, StoreError> {
    let mut call = store.scripts.bans.call();
    call.key(ban_index_key(prefix))
        .arg(store.now_arg())
        .arg(limit.max(1));
    match after {
        Some(cursor) => call.arg(cursor.until_us()).arg(cursor.key()),
        None => call.arg("").arg(""),
    };
    let mut conn = store.conn();
    let reply: Vec<Value> = store
        .bounded_store("list bans", async {
            call.invoke(&mut conn)
                .await
                .map_err(|e| store.redis_error("list bans", e))
        })
        .await?;
    page_reply(&reply)
}

/// Every ban under `prefix`, sorted by target: page after page, so that no call holds the
/// server for long. Bans that start or end meanwhile may or may not be listed.
pub(crate) async fn all(store: &Backend, prefix: &str) -> Result<Vec<BanEntry>, StoreError> {
    let mut bans = Vec::new();
    let mut after = None;
    loop {
        let page = page(store, prefix, after.as_ref(), LIST_PAGE).await?;
        bans.extend(page.bans);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    bans.sort_by(|a, b| a.target.cmp(&b.target));
    Ok(bans)
}

/// Reads the reply of `bans.lua`: the next cursor, then kind, value, µs left, strikes per ban.
fn page_reply(reply: &[Value]) -> Result<BanPage, StoreError> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let [
        Value::BulkString(next_us),
        Value::BulkString(next_key),
        bans @ ..,
    ] = reply
    else {
        return Err(protocol("bans", format!("no cursor in {reply:?}")));
    };
    let next = if next_us.is_empty() {
        None
    } else {
        let until_us = text(next_us)
            .parse()
            .map_err(|_| protocol("bans", format!("bad cursor {reply:?}")))?;
        Some(BanCursor::new(until_us, text(next_key)))
    };
    let bans = bans
        .chunks(4)
        .map(|ban| match ban {
            [
                Value::BulkString(kind),
                Value::BulkString(value),
                Value::Int(left),
                Value::Int(strikes),
            ] => {
                let target = BanTarget::parse(&text(kind), &text(value))
                    .map_err(|why| protocol("bans", why))?;
                Ok(BanEntry {
                    target,
                    expires_in: Duration::from_micros(u64::try_from(*left).unwrap_or(0)),
                    strikes: u32::try_from(*strikes).unwrap_or(u32::MAX),
                })
            }
            other => Err(protocol("bans", format!("unexpected entry {other:?}"))),
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(BanPage { bans, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_page_reply_is_read_with_its_cursor() {
        let reply = [
            bulk("1700000000000000"),
            bulk("tg:{ban}:ip:192.0.2.1"),
            bulk("ip"),
            bulk("192.0.2.1"),
            Value::Int(5_000_000),
            Value::Int(2),
        ];
        let page = page_reply(&reply).unwrap();
        assert_eq!(
            page.next,
            Some(BanCursor::new(
                1_700_000_000_000_000,
                "tg:{ban}:ip:192.0.2.1"
            ))
        );
        assert_eq!(page.bans.len(), 1);
        assert_eq!(page.bans[0].expires_in, Duration::from_secs(5));
        assert_eq!(page.bans[0].strikes, 2);

        let last = page_reply(&[bulk(""), bulk("")]).unwrap();
        assert_eq!(
            last,
            BanPage {
                bans: vec![],
                next: None
            }
        );
    }

    #[test]
    fn a_malformed_page_reply_is_a_protocol_error() {
        for reply in [
            vec![],
            vec![bulk("x"), bulk("k")],
            vec![bulk(""), bulk(""), bulk("ip")],
            vec![
                bulk(""),
                bulk(""),
                bulk("cookie"),
                bulk("v"),
                Value::Int(1),
                Value::Int(1),
            ],
        ] {
            assert!(page_reply(&reply).is_err(), "{reply:?}");
        }
    }
}
