//! The blocklist written by hand, counted and listed, through the ban index
//! (`prefix:{ban}:index`, a sorted set of ban keys scored by the end of the ban), without
//! reading every ban in one call.
//!
//! Every ban write keeps the index exact: `ban.lua`, `offend.lua` and a banning `check.lua` add
//! the key with its end, `unban.lua` removes it, and each write trims the bans that ended. On a
//! standalone server the index is updated in the same script as the ban. On a Cluster a ban
//! key has no hash tag (the bans spread over the slots by target, so no slot is read by every
//! check), the index lives in the `{ban}` slot, and `ban_index.lua` updates it in a call of its
//! own right after the ban's: a ban whose index update failed is enforced but not listed.
//! The live bans are the index entries scored after now: `ban_count.lua` counts them with one
//! `ZCOUNT` (O(log n)), and `bans.lua` reads one page of keys from a rank (O(log n + page));
//! each listed ban's hash is then read with its own `HMGET`, in its own slot (no script touches
//! a key it was not given).

use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;
use tollgate::{BanEntry, BanPage, BanTarget, PageCursor, StoreError, ban_index_key};

use crate::{
    backend::Backend,
    cluster,
    script::{LIST_PAGE, cursor_end, micros, page_reply, protocol},
};

/// Bans `target` under `prefix` for `duration` from now, keeping its strikes.
pub(crate) async fn ban(
    store: &Backend,
    prefix: &str,
    target: &BanTarget,
    duration: Duration,
) -> Result<(), StoreError> {
    let key = target.key(prefix);
    let index = ban_index_key(prefix);
    let mut call = store.scripts.ban.call();
    call.key(&key);
    if !store.is_cluster() {
        call.key(&index);
    }
    call.arg(store.now_arg())
        .arg(micros(duration))
        .arg(target.kind())
        .arg(target.value());
    let mut conn = store.conn();
    let end: i64 = store.bounded("ban", call.invoke(&mut conn)).await?;
    if store.is_cluster() {
        store
            .bounded_store(
                "ban",
                cluster::index_bans(store, &index, store.test_now(), &[(end, &key)], &[]),
            )
            .await?;
    }
    Ok(())
}

/// Lifts `target`'s ban under `prefix`; whether it was banned.
pub(crate) async fn unban(
    store: &Backend,
    prefix: &str,
    target: &BanTarget,
) -> Result<bool, StoreError> {
    let key = target.key(prefix);
    let index = ban_index_key(prefix);
    let mut call = store.scripts.unban.call();
    call.key(&key);
    if !store.is_cluster() {
        call.key(&index);
    }
    call.arg(store.now_arg());
    let mut conn = store.conn();
    let lifted = store.bounded("unban", call.invoke(&mut conn)).await?;
    if store.is_cluster() {
        store
            .bounded_store(
                "unban",
                cluster::index_bans(store, &index, store.test_now(), &[], &[&key]),
            )
            .await?;
    }
    Ok(lifted)
}

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
    after: Option<&PageCursor>,
    limit: usize,
) -> Result<BanPage, StoreError> {
    let limit = limit.max(1);
    let mut bans = Vec::new();
    let mut after = after.cloned();
    // Another round only when bans were lifted between the index and their hashes.
    loop {
        let (next, now, keys) =
            index_page(store, prefix, after.as_ref(), limit - bans.len()).await?;
        let reads = join_all(keys.iter().map(|key| {
            let mut conn = store.conn();
            let mut hmget = redis::cmd("HMGET");
            hmget.arg(key).arg(&["u", "s", "k", "v"]);
            async move {
                store
                    .bounded("list bans", hmget.query_async(&mut conn))
                    .await
            }
        }))
        .await;
        for read in reads {
            let fields: Vec<Option<String>> = read?;
            if let Some(entry) = entry(&fields, now)? {
                bans.push(entry);
            }
        }
        match next {
            Some(next) if bans.len() < limit => after = Some(next),
            next => return Ok(BanPage { bans, next }),
        }
    }
}

/// The keys of one page of the index (bans.lua): the next cursor, the script's now, the keys.
async fn index_page(
    store: &Backend,
    prefix: &str,
    after: Option<&PageCursor>,
    limit: usize,
) -> Result<(Option<PageCursor>, u64, Vec<String>), StoreError> {
    let mut call = store.scripts.bans.call();
    call.key(ban_index_key(prefix))
        .arg(store.now_arg())
        .arg(limit.max(1));
    match after {
        Some(cursor) => call.arg(cursor_end(cursor)).arg(cursor.key()),
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
    page_reply("bans", &reply)
}

/// A listed ban from its hash's `u`, `s`, `k`, `v` at `now`; `None` if lifted or ended since.
fn entry(fields: &[Option<String>], now: u64) -> Result<Option<BanEntry>, StoreError> {
    let [Some(until), strikes, Some(kind), Some(value)] = fields else {
        return Ok(None);
    };
    let Ok(until) = until.parse::<u64>() else {
        return Err(protocol("bans", format!("a ban ends at {until:?}")));
    };
    if until <= now {
        return Ok(None);
    }
    let target = BanTarget::parse(kind, value).map_err(|why| protocol("bans", why))?;
    Ok(Some(BanEntry {
        target,
        expires_in: Duration::from_micros(until - now),
        strikes: strikes.as_deref().and_then(|s| s.parse().ok()).unwrap_or(1),
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ban_is_listed_from_its_hash_while_it_lasts() {
        let fields = |u: &str, s: Option<&str>, k: &str| {
            vec![
                Some(u.to_owned()),
                s.map(str::to_owned),
                Some(k.to_owned()),
                Some("192.0.2.1".to_owned()),
            ]
        };
        let live = entry(&fields("5000000", Some("2"), "ip"), 1_000_000)
            .unwrap()
            .unwrap();
        assert_eq!(live.expires_in, Duration::from_secs(4));
        assert_eq!(live.strikes, 2);
        assert!(
            entry(&fields("1000000", None, "ip"), 1_000_000)
                .unwrap()
                .is_none()
        );
        assert!(entry(&[None, None, None, None], 0).unwrap().is_none());
        assert!(entry(&fields("soon", None, "ip"), 0).is_err());
        assert!(entry(&fields("5", None, "cookie"), 0).is_err());
    }
}
