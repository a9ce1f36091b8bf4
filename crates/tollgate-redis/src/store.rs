//! [`RedisStore`]: the [`Store`] contract over a [`Backend`]: checks (one call, batched, or
//! spread over a Cluster's slots), the local over-limit cache, resets, locks and bans.

use std::{fmt, sync::Arc, time::Duration};

use redis::Value;
use tollgate::{
    BanEntry, BanPage, BanStore, BanTarget, CheckRequest, LimiterRequest, LockReply, LockStore,
    Override, OverridePage, OverrideStore, PageCursor, Receipt, RefundStore, Store, StoreError,
    StoreErrorKind, Verdict,
};

use crate::{
    backend::Backend,
    batch::{self, Lane},
    blocklist,
    builder::RedisStoreBuilder,
    cache::LocalCache,
    cluster::{self, Layout},
    conn::Conn,
    overrides,
    repair::Journal,
    script::{self, Report, SlotReply, micros},
    shared::Inner,
};

/// A [`Store`] on Redis: a standalone server, a Sentinel-managed primary, or a Cluster.
///
/// On a standalone server or a Sentinel primary every check is one `EVALSHA` of
/// `scripts/check.lua`, atomic over all the keys of the plan, timed by the server's `TIME`.
/// On a Cluster, a plan whose keys share one hash slot is that same single call; a plan whose
/// limiters live in several slots runs one call per slot, concurrently, and undoes the
/// admitting slots' reservations when another slot denies (see the crate docs, "Cluster").
///
/// Cloning is cheap and clones share one multiplexed connection (one per node on a Cluster),
/// which pipelines concurrent checks and reconnects on its own after a server goes away.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate_redis::RedisStore;
///
/// # async fn run() -> Result<(), tollgate::StoreError> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379/0")
///     .timeout(Duration::from_millis(50))
///     .build()
///     .await?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

impl RedisStore {
    /// Connects to `url` with the default settings; the same as `builder(url).build()`.
    ///
    /// `url` is one of:
    /// - `redis://[user:password@]host:port/db`: a standalone server;
    /// - `redis+sentinel://[user:password@]host:port[,host:port...]/master_name[/db]`: the
    ///   primary that these sentinels name, followed across failovers; the credentials are the
    ///   data nodes'; add `?sentinel_user=...&sentinel_password=...` for sentinels that
    ///   require their own;
    /// - `redis+cluster://[user:password@]host:port[,host:port...]`: a Redis Cluster, found
    ///   from these seed nodes;
    ///
    /// and `rediss://`, `rediss+sentinel://`, `rediss+cluster://` for the same over TLS.
    /// Special characters in user names and passwords are percent-encoded.
    ///
    /// TLS verifies the servers against the system's root certificates, or against the PEM
    /// file of `?tls_ca_file=<path>`, which replaces them; `&tls_cert_file=<path>&tls_key_file=<path>`
    /// present a client certificate to servers that require one (`tls-auth-clients yes`).
    /// The same files apply to every node and, on Sentinel, to the sentinels too. They can be
    /// given to the builder instead ([`RedisStoreBuilder::tls_ca_file`],
    /// [`RedisStoreBuilder::tls_client_cert`]); paths in a URL are percent-encoded.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).build().await
    }

    /// Configures a store on `url` (see [`connect`](Self::connect) for the URL forms).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder::new(url)
    }

    /// How many checks the local over-limit cache has denied without a call to Redis, since
    /// the store was built (shared by its clones); always 0 with the cache off.
    pub fn local_denials(&self) -> u64 {
        self.inner.cache.as_ref().map_or(0, LocalCache::answered)
    }

    /// The figures of this store's quota leases (see [`tollgate::QuotaLease`]), since it was
    /// built (shared by its clones).
    pub fn leases(&self) -> crate::LeaseStats {
        self.inner.leases.stats()
    }

    /// The identities with a lease in hand now, most units first, at most `at_most`.
    pub fn leased_keys(&self, at_most: usize) -> Vec<crate::LeasedKey> {
        self.inner
            .leases
            .leased_keys(self.inner.local_now_us(), at_most)
    }

    /// How many repairs after a failover this store ran, and how many keys they wrote again
    /// (always zero without [`RedisStoreBuilder::repair`]).
    pub fn repairs(&self) -> crate::Repairs {
        self.inner
            .journal
            .as_ref()
            .map_or_else(crate::Repairs::default, crate::repair::Journal::repairs)
    }

    /// How the server keeps its counters across a restart (AOF, RDB), as it says. A server
    /// that keeps neither starts empty after a restart: long windows (days, calendar months)
    /// are given again in full.
    pub async fn persistence(&self) -> Result<crate::Persistence, StoreError> {
        crate::persistence::read(self.backend()).await
    }

    /// What the clones share.
    #[cfg(test)]
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    /// The plan's limiters, one group per call of a per-slot script: by hash slot on a
    /// Cluster, all together on one server.
    fn slot_groups(&self, plan: &CheckRequest<'_>) -> Result<Vec<Vec<usize>>, StoreError> {
        match &self.backend().conn {
            Conn::Cluster(_) => cluster::slot_members(plan),
            Conn::Standalone(_) | Conn::Sentinel(_) => Ok(vec![(0..plan.limiters.len()).collect()]),
        }
    }

    /// A check asked of Redis (the local over-limit cache first), without a lease.
    pub(crate) async fn check_store(&self, plan: &CheckRequest<'_>) -> Result<Verdict, StoreError> {
        let cache = self.inner.cache.as_ref();
        let sent_us = cache.map(|_| self.inner.local_now_us());
        // A request that may wait is not told a denial remembered for one that may not.
        if let (Some(cache), Some(now)) = (cache, sent_us)
            && plan.delay_us == 0
            && let Some(denied) = cache.answer(plan, now)
        {
            return Ok(denied);
        }
        let journal = self.inner.journal.as_ref();
        if let Some(journal) = journal {
            // Redis lost writes: they are written again (in the background) before this
            // store checks those keys again; until then their checks fail (`on_error`).
            Journal::kick(&self.inner);
            journal.ready(plan, &self.backend().target)?;
        }
        let checked = match &self.backend().conn {
            Conn::Cluster(_) => match cluster::layout(plan)? {
                Layout::OneSlot(lane) => self.check_one_call(plan, lane).await,
                Layout::Slots { limiters, bans } => {
                    cluster::check(self.backend(), plan, limiters, bans, journal).await
                }
            },
            Conn::Standalone(_) | Conn::Sentinel(_) => self.check_one_call(plan, None).await,
        };
        if let Some(journal) = journal {
            match &checked {
                // Replicas that are slow to acknowledge lost nothing.
                Err(e) if e.kind() == StoreErrorKind::NotReplicated => {}
                // The primary may be gone (refused, timed out, CLUSTERDOWN, READONLY...): its
                // successor may lack what this store wrote.
                Err(_) => journal.suspect(&Journal::lanes_of(plan, self.backend().is_cluster())),
                // This check found a key behind this store's writes: repaired at once.
                _ => Journal::kick(&self.inner),
            }
        }
        let verdict = checked?;
        // A waiting request's denial says when it could wait, not when a plain one fits.
        if let (Some(cache), Some(sent)) = (cache, sent_us)
            && plan.delay_us == 0
        {
            cache.learn(plan, &verdict, sent);
        }
        Ok(verdict)
    }

    /// The whole plan as one check of check.lua: every key must live on `lane` (one slot,
    /// or the one server). Sent with the other checks of its lane when batching is on.
    async fn check_one_call(
        &self,
        plan: &CheckRequest<'_>,
        lane: Lane,
    ) -> Result<Verdict, StoreError> {
        let backend = self.backend();
        let mut call = backend.scripts.check.call();
        let nonce: [u8; 8] = rand::random();
        // With repair on, an admission says what it wrote, for the journal.
        let journal = self
            .inner
            .journal
            .as_ref()
            .filter(|_| plan.consume && plan.cost > 0);
        let report = journal.map(|_| Report::Record);
        script::prepare(&mut call, plan, backend.test_now(), nonce, report)?;
        let reply = if self.inner.batching {
            let (keys, args) = call.into_parts();
            let batched = batch::submit(&self.inner, lane, plan.durability, keys, args);
            backend.bounded_store("check", batched).await?
        } else {
            let replies = backend
                .bounded_store("check", backend.check_call(&call, plan.durability))
                .await?;
            script::only_reply(replies)?
        };
        let id = u64::from_be_bytes(nonce);
        match journal {
            // Not blocked by a ban (a blocked check's reply is the plain one): the reply ends
            // with what the check wrote, for the journal.
            Some(journal) if reply.get(1) == Some(&-1) => {
                let SlotReply {
                    mut verdict,
                    record,
                    ..
                } = script::slot_reply(plan, &reply, Report::Record)?;
                if let Some(record) = record {
                    let said = (&verdict.rules[..], &verdict.limits[..]);
                    journal.learn(lane, plan, said, &record, nonce);
                    let at = u64::try_from(record.now)
                        .map_err(|_| script::protocol("check", "a negative record time"))?;
                    verdict.receipt = Some(script::receipt(plan, &verdict.rules, at, id));
                }
                Ok(verdict)
            }
            _ => script::verdict(plan, &reply, id),
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = self.backend();
        f.debug_struct("RedisStore")
            .field("target", &backend.target)
            .field("timeout", &backend.timeout)
            .field("batching", &self.inner.batching)
            .field("local_cache", &self.inner.cache.is_some())
            .field("test_clock", &backend.clock)
            .finish_non_exhaustive()
    }
}

impl Store for RedisStore {
    async fn check(&self, plan: &CheckRequest<'_>) -> Result<Verdict, StoreError> {
        match plan.lease {
            Some(lease) if plan.consume && plan.cost > 0 => self.check_leased(plan, lease).await,
            _ => self.check_store(plan).await,
        }
    }

    fn check_sync(
        &self,
        plan: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Option<Result<(), StoreError>> {
        // Only a lease in hand answers without Redis.
        if plan.lease.is_none() || !plan.consume || plan.cost == 0 {
            return None;
        }
        let now = self.inner.local_now_us();
        self.inner
            .leases
            .admit(plan, now, verdict)
            .then_some(Ok(()))
    }

    async fn reset(&self, plan: &CheckRequest<'_>) -> Result<(), StoreError> {
        let keys: Vec<String> = plan.limiters.iter().flat_map(|l| l.state_keys()).collect();
        if keys.is_empty() {
            return Ok(());
        }
        // Forgotten before and after: a denial learnt while the keys are deleted is dropped.
        if let Some(cache) = &self.inner.cache {
            cache.forget_limiters(plan);
        }
        if let Some(journal) = &self.inner.journal {
            journal.forget(plan);
        }
        self.inner.leases.forget(plan);
        let mut conn = self.backend().conn();
        let _deleted: u64 = self
            .backend()
            .bounded("reset", redis::cmd("DEL").arg(keys).query_async(&mut conn))
            .await?;
        if let Some(cache) = &self.inner.cache {
            cache.forget_limiters(plan);
        }
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.backend().conn();
        let pong: String = self
            .backend()
            .bounded("ping", redis::cmd("PING").query_async(&mut conn))
            .await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!("ping on {}: answered {pong:?}", self.backend().target),
            ))
        }
    }
}

impl RedisStore {
    /// A refund or a charge (refund.lua), once per hash slot of the plan's limiters.
    async fn adjust(
        &self,
        plan: &CheckRequest<'_>,
        receipt: Option<&Receipt>,
        mode: script::Adjust,
    ) -> Result<(), StoreError> {
        for members in self.slot_groups(plan)? {
            let marker = self.marker();
            let _changed: Option<i64> = self
                .adjust_slot(plan, &members, receipt, mode, marker)
                .await?;
        }
        Ok(())
    }

    /// A fresh call id and how long its marker lasts, where the client may send a call twice
    /// (see [`Backend::marker_ttl_ms`]).
    fn marker(&self) -> Option<(u64, u64)> {
        let ttl_ms = self.backend().marker_ttl_ms()?;
        Some((rand::random(), ttl_ms))
    }

    /// One call of refund.lua, for the limiters `members` of `plan` (all in one hash slot).
    /// With a `marker` (see [`marker`](Self::marker)), a call Redis runs twice (a Cluster
    /// client re-sends one whose reply it lost) gives back, charges or renews once. Its reply;
    /// `None` if none of them is concerned.
    async fn adjust_slot<T: redis::FromRedisValue>(
        &self,
        plan: &CheckRequest<'_>,
        members: &[usize],
        receipt: Option<&Receipt>,
        mode: script::Adjust,
        marker: Option<(u64, u64)>,
    ) -> Result<Option<T>, StoreError> {
        let backend = self.backend();
        let mut call = backend.scripts.refund.call();
        let members = (members.iter().copied(), marker);
        if !script::prepare_refund(&mut call, plan, members, receipt, backend.test_now(), mode)? {
            return Ok(None);
        }
        let op = match mode {
            script::Adjust::Refund => "refund",
            script::Adjust::Extend => "extend",
            script::Adjust::Charge => "charge",
        };
        let mut conn = backend.conn();
        backend.bounded(op, call.invoke(&mut conn)).await.map(Some)
    }
}

impl RefundStore for RedisStore {
    async fn refund(
        &self,
        plan: &CheckRequest<'_>,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        // A denial remembered here may not hold anymore; a count lowered on purpose is no
        // loss to repair.
        if let Some(cache) = &self.inner.cache {
            cache.forget_limiters(plan);
        }
        if let Some(journal) = &self.inner.journal {
            journal.forget(plan);
        }
        self.adjust(plan, receipt, script::Adjust::Refund).await
    }

    async fn charge(&self, plan: &CheckRequest<'_>) -> Result<(), StoreError> {
        self.adjust(plan, None, script::Adjust::Charge).await
    }

    async fn extend(
        &self,
        plan: &CheckRequest<'_>,
        receipt: &Receipt,
    ) -> Result<Option<Receipt>, StoreError> {
        // The receipt's units, in each of the request's limiters.
        let leases = CheckRequest::new(receipt.units(), true, plan.limiters);
        let mut at_us = vec![Receipt::NOT_RECORDED; plan.limiters.len()];
        let mut lost = false;
        for members in self.slot_groups(plan)? {
            let extend = script::Adjust::Extend;
            let marker = self.marker();
            let Some(reply) = self
                .adjust_slot::<Vec<i64>>(&leases, &members, Some(receipt), extend, marker)
                .await?
            else {
                continue;
            };
            let &[renewed, now] = reply.as_slice() else {
                return Err(script::protocol("extend", "expected {renewed, now}"));
            };
            if renewed != 1 {
                lost = true;
                break;
            }
            for i in members {
                if receipt.at_us(i).is_some() {
                    at_us[i] = u64::try_from(now)
                        .map_err(|_| script::protocol("extend", "a negative time"))?;
                }
            }
        }
        if lost {
            // A lease is gone: the caller lost its slot; give back whatever other slots still
            // hold (a Cluster renews slot by slot) rather than keep them until they run out.
            let renewed = Receipt::per_limiter(
                (0..plan.limiters.len()).map(|i| match at_us[i] {
                    Receipt::NOT_RECORDED => receipt.at_us(i).unwrap_or(Receipt::NOT_RECORDED),
                    now => now,
                }),
                receipt.id(),
                receipt.units(),
            );
            let _ = RefundStore::refund(self, &leases, Some(&renewed)).await;
            return Ok(None);
        }
        Ok(Some(Receipt::per_limiter(
            at_us,
            receipt.id(),
            receipt.units(),
        )))
    }
}

impl LockStore for RedisStore {
    async fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<LockReply, StoreError> {
        let mut invocation = self.backend().scripts.lock_acquire.call();
        invocation
            .key(key)
            .arg(self.backend().now_arg())
            .arg(token)
            .arg(fingerprint)
            .arg(micros(ttl));
        let mut conn = self.backend().conn();
        let reply: Vec<Value> = self
            .backend()
            .bounded("lock", invocation.invoke(&mut conn))
            .await?;
        script::lock_reply(&reply)
    }

    async fn lock_release(&self, key: &str, token: &str) -> Result<bool, StoreError> {
        let mut invocation = self.backend().scripts.lock_release.call();
        invocation.key(key).arg(self.backend().now_arg()).arg(token);
        let mut conn = self.backend().conn();
        self.backend()
            .bounded("unlock", invocation.invoke(&mut conn))
            .await
    }

    async fn lock_complete(
        &self,
        key: &str,
        token: &str,
        response: &[u8],
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        let mut invocation = self.backend().scripts.lock_complete.call();
        invocation
            .key(key)
            .arg(self.backend().now_arg())
            .arg(token)
            .arg(response)
            .arg(micros(keep_for));
        let mut conn = self.backend().conn();
        self.backend()
            .bounded("complete", invocation.invoke(&mut conn))
            .await
    }
}

impl OverrideStore for RedisStore {
    async fn set_override(
        &self,
        limiter: &LimiterRequest<'_>,
        index: &str,
        entry: &Override,
        ttl: Option<Duration>,
    ) -> Result<Override, StoreError> {
        overrides::set(self.backend(), limiter, index, entry, ttl).await
    }

    async fn remove_override(
        &self,
        limiter: &LimiterRequest<'_>,
        index: &str,
    ) -> Result<bool, StoreError> {
        overrides::remove(self.backend(), limiter, index).await
    }

    async fn overrides(&self, index: &str) -> Result<Vec<Override>, StoreError> {
        overrides::list(self.backend(), index).await
    }

    async fn overrides_page(
        &self,
        index: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> Result<OverridePage, StoreError> {
        overrides::page(self.backend(), index, after, limit).await
    }
}

impl BanStore for RedisStore {
    async fn bans(&self, prefix: &str) -> Result<Vec<BanEntry>, StoreError> {
        blocklist::all(self.backend(), prefix).await
    }

    async fn ban(
        &self,
        prefix: &str,
        target: &BanTarget,
        duration: Duration,
    ) -> Result<(), StoreError> {
        blocklist::ban(self.backend(), prefix, target, duration).await
    }

    async fn unban(&self, prefix: &str, target: &BanTarget) -> Result<bool, StoreError> {
        let key = target.key(prefix);
        if let Some(cache) = &self.inner.cache {
            cache.forget_ban(&key);
        }
        let lifted = blocklist::unban(self.backend(), prefix, target).await?;
        if let Some(cache) = &self.inner.cache {
            cache.forget_ban(&key);
        }
        Ok(lifted)
    }

    async fn ban_count(&self, prefix: &str) -> Result<u64, StoreError> {
        blocklist::count(self.backend(), prefix).await
    }

    async fn bans_page(
        &self,
        prefix: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> Result<BanPage, StoreError> {
        blocklist::page(self.backend(), prefix, after, limit).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate::{Algorithm, LimiterRequest, ManualClock, Rule};
    use tollgate_testkit::RedisServer;

    use super::*;

    /// Units left in each rule of `limiters`, read without recording.
    async fn left(store: &RedisStore, limiters: &[LimiterRequest<'_>]) -> Vec<u64> {
        let peek = store.check(&CheckRequest::new(0, false, limiters)).await;
        peek.unwrap().rules.iter().map(|r| r.remaining).collect()
    }

    /// refund.lua run twice under one call id, as Redis runs a call that a Cluster client
    /// re-sent after losing its reply (both copies reach the node): the second run changes
    /// nothing and answers what the first did.
    #[tokio::test]
    async fn an_adjustment_run_twice_changes_the_state_once() {
        let server = RedisServer::start();
        let clock = ManualClock::new(Duration::from_secs(1_800_000_000));
        let store = RedisStore::builder(&server.url())
            .local_cache(false)
            .clock(clock.clone())
            .build()
            .await
            .unwrap();
        let rules: Vec<Rule> = [
            Algorithm::Gcra,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ]
        .into_iter()
        .map(|a| "10/1h".parse::<Rule>().unwrap().with_algorithm(a))
        .collect();
        let limiters = [LimiterRequest {
            key: "t:{twice}",
            compact: &[],
            rules: &rules,
            ban: None,
            shadow: false,
            overrides: None,
        }];
        let checked = store.check(&CheckRequest::new(3, true, &limiters)).await;
        let receipt = checked.unwrap().receipt.expect("an admission's receipt");
        assert_eq!(left(&store, &limiters).await, [7; 4]);

        let two = CheckRequest::new(2, true, &limiters);
        for _ in 0..2 {
            let changed: Option<i64> = store
                .adjust_slot(
                    &two,
                    &[0],
                    Some(&receipt),
                    script::Adjust::Refund,
                    Some((1, 60_000)),
                )
                .await
                .unwrap();
            assert_eq!(changed, Some(4), "the first run's answer, both times");
        }
        assert_eq!(left(&store, &limiters).await, [9; 4], "given back once");

        for _ in 0..2 {
            let _: Option<i64> = store
                .adjust_slot(&two, &[0], None, script::Adjust::Charge, Some((2, 60_000)))
                .await
                .unwrap();
        }
        assert_eq!(left(&store, &limiters).await, [7; 4], "charged once");

        // Renewing leases moves the check's log entries to now: run again, it must still say
        // renewed (a lease said lost is given back).
        let one = CheckRequest::new(1, true, &limiters);
        let leased = store.check(&one).await.unwrap().receipt.unwrap();
        clock.advance(Duration::from_secs(1));
        let lease = CheckRequest::new(leased.units(), true, &limiters);
        for _ in 0..2 {
            let renewed: Option<Vec<i64>> = store
                .adjust_slot(
                    &lease,
                    &[0],
                    Some(&leased),
                    script::Adjust::Extend,
                    Some((3, 60_000)),
                )
                .await
                .unwrap();
            assert_eq!(renewed.unwrap()[0], 1, "renewed, both times");
        }
        // A new call id is a new call.
        let _: Option<i64> = store
            .adjust_slot(&two, &[0], None, script::Adjust::Charge, Some((4, 60_000)))
            .await
            .unwrap();
        assert_eq!(left(&store, &limiters).await, [4; 4]);

        // A client that never sends a call twice (one server, Sentinel) writes no marker.
        assert_eq!(store.marker(), None);
        let mut conn = redis::Client::open(server.url()).unwrap();
        let markers = |conn: &mut redis::Client| -> usize {
            let keys: Vec<String> = redis::cmd("KEYS").arg("t:{twice}:a*").query(conn).unwrap();
            keys.len()
        };
        assert_eq!(markers(&mut conn), 4, "the four calls above");
        RefundStore::refund(&store, &two, Some(&receipt))
            .await
            .unwrap();
        RefundStore::charge(&store, &two).await.unwrap();
        assert_eq!(markers(&mut conn), 4);
    }

    /// A lock acquisition run twice (a re-sent call): its caller holds the lock both times,
    /// and anyone else is told it is held.
    #[tokio::test]
    async fn a_lock_acquisition_run_twice_is_still_its_callers() {
        let server = RedisServer::start();
        let store = RedisStore::builder(&server.url()).build().await.unwrap();
        let ttl = Duration::from_secs(60);
        for _ in 0..2 {
            let reply = store.lock_acquire("t:{d:x}", "token-a", "f", ttl).await;
            assert!(matches!(reply.unwrap(), LockReply::Acquired));
        }
        let other = store.lock_acquire("t:{d:x}", "token-b", "f", ttl).await;
        assert!(matches!(other.unwrap(), LockReply::Held(_)));
        assert!(
            store
                .lock_complete("t:{d:x}", "token-a", b"r", ttl)
                .await
                .unwrap()
        );
        let again = store.lock_acquire("t:{d:x}", "token-a", "f", ttl).await;
        assert!(
            matches!(again.unwrap(), LockReply::Held(held) if held.completed),
            "a completed lock is held, whoever asks"
        );
    }
}
