//! Per-identity overrides (`tollgate::OverrideStore`): one string per overridden limiter key, in
//! the key's hash slot (`base:o`), which check.lua reads beside the counters, and an index
//! (`prefix:{ovr}:index`, a sorted set of override keys scored by their end) that lists them.
//! On a standalone server `override.lua` writes both at once; on a Cluster the index lives in
//! its own slot and is updated by commands of its own: before the override is set (so an
//! override is never set unlisted; a set that stops between the two leaves an index entry
//! without an override, which listings step over), and after it is set or removed, to what the
//! override then says (see [`follow`]).

use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;
use tollgate::{LimiterRequest, Override, OverridePage, PageCursor, StoreError, key};

use crate::{
    backend::Backend,
    script::{LIST_PAGE, cursor_end, micros, page_reply},
};

/// Sets the override of `limiter`'s key; returns it as kept, its end included.
pub(crate) async fn set(
    store: &Backend,
    limiter: &LimiterRequest<'_>,
    index: &str,
    entry: &Override,
    ttl: Option<Duration>,
) -> Result<Override, StoreError> {
    let key = key::override_key(limiter.key);
    if store.is_cluster() {
        // Listed before it counts: a set that stops between its writes leaves an index entry
        // without an override (stepped over by the listing), never an override nobody sees.
        list_in(store, index, &key, "+inf").await?;
    }
    let limits: Vec<String> = entry.limits.iter().map(u64::to_string).collect();
    let listing = format!("{}\n{}\n{}", entry.policy, entry.limiter, entry.value);
    let mut call = store.scripts.overrides.call();
    call.key(&key);
    if !store.is_cluster() {
        call.key(index);
    }
    call.arg(store.now_arg())
        .arg("set")
        .arg(entry.fingerprint)
        .arg(ttl.map_or(0, |ttl| micros(ttl).max(1)))
        .arg(limits.join(":"))
        .arg(listing);
    let mut conn = store.conn();
    let ends: u64 = store
        .bounded("set override", call.invoke(&mut conn))
        .await?;
    if store.is_cluster() {
        // Its end, so that the index forgets it once it has ended.
        follow(store, index, &key, Some(ends)).await?;
    }
    let mut kept = entry.clone();
    kept.expires_at_us = (ends > 0).then_some(ends);
    Ok(kept)
}

/// Lists the override `key` in `index` (a Cluster's, in a slot of its own) until `ends` (µs,
/// or `+inf`).
async fn list_in(store: &Backend, index: &str, key: &str, ends: &str) -> Result<(), StoreError> {
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(index).arg(ends).arg(key);
    let mut conn = store.conn();
    let _: i64 = store
        .bounded("index override", zadd.query_async(&mut conn))
        .await?;
    Ok(())
}

/// Removes the override of `limiter`'s key; whether a live one was there.
pub(crate) async fn remove(
    store: &Backend,
    limiter: &LimiterRequest<'_>,
    index: &str,
) -> Result<bool, StoreError> {
    let key = key::override_key(limiter.key);
    let mut call = store.scripts.overrides.call();
    call.key(&key);
    if !store.is_cluster() {
        call.key(index);
    }
    call.arg(store.now_arg()).arg("remove");
    let mut conn = store.conn();
    let removed: bool = store
        .bounded("remove override", call.invoke(&mut conn))
        .await?;
    if store.is_cluster() {
        follow(store, index, &key, None).await?;
    }
    Ok(removed)
}

/// How many times [`follow`] writes an index entry while the override keeps changing.
const FOLLOW_ROUNDS: usize = 4;

/// On a Cluster, makes the index entry of override `key` say what the override does, starting
/// from what this writer left (`ends`: when it ends, 0 for never; `None`: removed): written,
/// then the override read again, until a read finds what was written. Of writers racing on
/// one key (a set and a remove, two sets with other ends), the last to read leaves the entry
/// as the override stands: the index never lists a live override as ended (which would drop
/// it from the listing once that time passed) nor leaves it out. One that keeps changing
/// after a few rounds is another writer's, which follows it in turn.
async fn follow(
    store: &Backend,
    index: &str,
    key: &str,
    mut ends: Option<u64>,
) -> Result<(), StoreError> {
    for _ in 0..FOLLOW_ROUNDS {
        match ends {
            Some(0) => list_in(store, index, key, "+inf").await?,
            Some(ends) => list_in(store, index, key, &ends.to_string()).await?,
            None => unlist(store, index, key).await?,
        }
        let now = ends_of(store, key).await?;
        if now == ends {
            break;
        }
        ends = now;
    }
    Ok(())
}

/// When the override `key` ends (0: never), or `None` if it is not live.
async fn ends_of(store: &Backend, key: &str) -> Result<Option<u64>, StoreError> {
    let mut call = store.scripts.overrides.call();
    call.key(key).arg(store.now_arg()).arg("ends");
    let mut conn = store.conn();
    let ends: i64 = store
        .bounded("read override", call.invoke(&mut conn))
        .await?;
    Ok(u64::try_from(ends).ok())
}

/// Takes the override `key` out of `index` (a Cluster's).
async fn unlist(store: &Backend, index: &str, key: &str) -> Result<(), StoreError> {
    let mut zrem = redis::cmd("ZREM");
    zrem.arg(index).arg(key);
    let mut conn = store.conn();
    let _: i64 = store
        .bounded("index override", zrem.query_async(&mut conn))
        .await?;
    Ok(())
}

/// One page of the overrides in `index` that have not ended, in the order they end, then by
/// key (see `tollgate::OverrideStore::overrides_page`).
pub(crate) async fn page(
    store: &Backend,
    index: &str,
    after: Option<&PageCursor>,
    limit: usize,
) -> Result<OverridePage, StoreError> {
    let limit = limit.max(1);
    let mut overrides = Vec::new();
    let mut after = after.cloned();
    // Another round only when overrides were removed between the index and their values.
    loop {
        let (next, now, keys) =
            index_page(store, index, after.as_ref(), limit - overrides.len()).await?;
        // Each override in its own slot, read apart (no script touches a key it was not
        // given): a page's worth at a time.
        let reads = join_all(keys.iter().map(|key| {
            let mut conn = store.conn();
            async move {
                store
                    .bounded(
                        "list overrides",
                        redis::cmd("GET").arg(key).query_async(&mut conn),
                    )
                    .await
            }
        }))
        .await;
        for read in reads {
            let value: Option<String> = read?;
            if let Some(entry) = value.as_deref().and_then(|v| parse(v, now)) {
                overrides.push(entry);
            }
        }
        match next {
            Some(next) if overrides.len() < limit => after = Some(next),
            next => return Ok(OverridePage { overrides, next }),
        }
    }
}

/// The keys of one page of the index (`override.lua`'s `page`): the next cursor, the
/// script's now, the keys.
async fn index_page(
    store: &Backend,
    index: &str,
    after: Option<&PageCursor>,
    limit: usize,
) -> Result<(Option<PageCursor>, u64, Vec<String>), StoreError> {
    let mut call = store.scripts.overrides.call();
    call.key(index)
        .arg(store.now_arg())
        .arg("page")
        .arg(limit.max(1));
    match after {
        Some(cursor) => call.arg(cursor_end(cursor)).arg(cursor.key()),
        None => call.arg("").arg(""),
    };
    let mut conn = store.conn();
    let reply: Vec<Value> = store
        .bounded("list overrides", call.invoke(&mut conn))
        .await?;
    page_reply("overrides", &reply)
}

/// Every override in `index` that has not ended, by policy, limiter and value: page after
/// page, so that no call holds the server for long, nor reads more than a page at once.
/// Overrides set or removed meanwhile may or may not be listed.
pub(crate) async fn list(store: &Backend, index: &str) -> Result<Vec<Override>, StoreError> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = page(store, index, after.as_ref(), LIST_PAGE).await?;
        all.extend(page.overrides);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    all.sort_by(|a, b| (&a.policy, &a.limiter, &a.value).cmp(&(&b.policy, &b.limiter, &b.value)));
    Ok(all)
}

/// An override from its stored text (see check.lua) if it holds at `now`; `None` if it ended
/// or is not one.
fn parse(text: &str, now: u64) -> Option<Override> {
    let (head, listing) = text.split_once('\n')?;
    let mut numbers = head.split(':').map(|n| n.parse::<u64>());
    let fingerprint = numbers.next()?.ok()?;
    let ends = numbers.next()?.ok()?;
    let limits = numbers.collect::<Result<Vec<u64>, _>>().ok()?;
    let mut lines = listing.splitn(3, '\n');
    let (policy, limiter, value) = (lines.next()?, lines.next()?, lines.next()?);
    let entry = Override {
        policy: policy.to_owned(),
        limiter: limiter.to_owned(),
        value: value.to_owned(),
        limits,
        fingerprint,
        expires_at_us: (ends > 0).then_some(ends),
    };
    entry.live_at(now).then_some(entry)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_stored_override_reads_back_until_it_ends() {
        let text = "77:500:0:30\napi\nuser_id\nacme\ncorp";
        let o = parse(text, 499).unwrap();
        assert_eq!((o.fingerprint, o.expires_at_us), (77, Some(500)));
        assert_eq!(o.limits, [0, 30]);
        assert_eq!((o.policy.as_str(), o.limiter.as_str()), ("api", "user_id"));
        assert_eq!(o.value, "acme\ncorp", "a value may hold a newline");
        assert_eq!(parse(text, 500), None);
        assert!(parse("77:0:5\napi\nip\n1.2.3.4", u64::MAX).is_some());
        assert_eq!(parse("77:x:5\napi\nip\nv", 0), None);
    }
}
