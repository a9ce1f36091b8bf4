//! The engine, the public front: [`Tollgate`] and what it does besides checks (refunds and
//! settlements, bans, duplicate guards, overrides). A check's own path is in `crate::check`.

use std::{
    future::Future,
    sync::{Arc, OnceLock},
    time::Duration,
};

use smallvec::SmallVec;

use crate::{
    blocklist::{BanEntry, BanScope, BanTarget},
    check::{BanKeys, Check, CheckKeys, INLINE_LIMITERS, LimiterRequests, Now, push_limiter_key},
    decision::{Decision, NamedDecision, Reason},
    duplicate::{Acquire, Duplicate, DuplicateGuard, DuplicateState, Fingerprint, Lease},
    error::{CheckError, StoreError},
    identity::{Dimension, Identity},
    key::{self, KeyBuf, KeyHead, KeyOut, ban_index_key},
    overrides::{Override, OverrideError, OverridePage},
    page::PageCursor,
    policy::{Limiter, OnError, Policy},
    rule::{Algorithm, Rule},
    store::{
        AnyStore, BanStore, CheckRequest, FullStore, LimiterRequest, LockReply, LockStore,
        OverrideStore, Receipt, RefundStore, Store, Verdict,
    },
};

/// Checks policies against a [`Store`].
///
/// ```
/// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Reason, Tollgate};
///
/// # tokio_test();
/// # fn tokio_test() { tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let gate = Tollgate::new(MemoryStore::new());
/// let sms = Policy::builder("sms_code")
///     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?, "10/1h".parse()?]))
///     .build()?;
/// let who = Identity::new().with_ip("203.0.113.7".parse()?);
///
/// let first = gate.check(&sms, &who, 1).await?;
/// assert!(first.allowed());
/// let second = gate.check(&sms, &who, 1).await?;
/// assert_eq!(second.reason(), Reason::RateLimited);
/// assert!(second.retry_after().unwrap() <= std::time::Duration::from_secs(60));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap() }
/// ```
#[derive(Debug)]
pub struct Tollgate<S> {
    /// Shared with every engine [`erase`](Self::erase)d from this one.
    pub(crate) store: Arc<S>,
    pub(crate) prefix: Arc<str>,
    /// `prefix:{`, where every limiter key starts.
    pub(crate) key_start: KeyHead,
    pub(crate) on_error: OnError,
    pub(crate) blocklist: bool,
    pub(crate) ban_index: Arc<str>,
    pub(crate) max_stored_response: usize,
    pub(crate) max_keep_for: Duration,
    /// The fallback of `OnError::Local` (made by `make_local` on first use unless given),
    /// shared with every engine [`erase`](Self::erase)d from this one.
    pub(crate) local: Arc<OnceLock<Box<dyn LocalFallback>>>,
    pub(crate) make_local: fn() -> Box<dyn LocalFallback>,
}

/// What [`Tollgate::settle`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// The work cost what its check charged: nothing to do.
    Exact,
    /// It cost less: this many units were given back.
    Refunded(u64),
    /// It cost more: this many units were charged, past the limits if need be.
    Charged(u64),
}

/// Where a check goes when the store fails and `on_error` is [`OnError::Local`]: a store in
/// this process that answers at once. [`MemoryStore`](crate::MemoryStore) is one, and the
/// engine's default ([`Tollgate::with_local_fallback`] hands in another).
pub trait LocalFallback: Send + Sync + std::fmt::Debug {
    /// Checks `request` into `verdict`, as [`Store::check_sync`] would.
    fn check_local(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Result<(), StoreError>;
}

/// How a check run through the engine ([`Tollgate::run`]) was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answered {
    /// The store answered: the verdict is its.
    Store,
    /// The store failed and `on_error` is `local`: the verdict is the local fallback's (which
    /// a refund does not reach).
    Local,
    /// The store failed: `on_error` decided, `allowed` or not, without rules (the verdict
    /// says nothing).
    Failed {
        /// Whether `on_error` admits.
        allowed: bool,
    },
}

impl<S: Store> Tollgate<S> {
    /// An engine over `store`, with key prefix `tg` and `on_error = allow`.
    pub fn new(store: S) -> Tollgate<S> {
        Tollgate {
            store: Arc::new(store),
            prefix: "tg".into(),
            key_start: key::limiter_key_start("tg"),
            on_error: OnError::Allow,
            blocklist: true,
            ban_index: ban_index_key("tg").into(),
            max_stored_response: 64 << 10,
            max_keep_for: Duration::from_secs(86_400),
            local: Arc::default(),
            make_local: crate::memory::local_fallback,
        }
    }

    /// The store checks fall back to when `on_error` is `local` (default: a
    /// [`MemoryStore`](crate::MemoryStore) made on first use).
    #[must_use]
    pub fn with_local_fallback(mut self, local: impl LocalFallback + 'static) -> Tollgate<S> {
        let cell = OnceLock::new();
        let _ = cell.set(Box::new(local) as Box<dyn LocalFallback>);
        self.local = Arc::new(cell);
        self
    }

    /// Whether checks consult the blocklist (default: yes). Turning it off saves the ban
    /// look-up where no limiter bans and nobody bans by hand.
    #[must_use]
    pub fn with_blocklist(mut self, enabled: bool) -> Tollgate<S> {
        self.blocklist = enabled;
        self
    }

    /// The largest response [`complete`](Self::complete) stores for replay (default 64 KiB);
    /// a larger one is refused with [`CheckError::ResponseTooLarge`].
    #[must_use]
    pub fn with_max_stored_response(mut self, bytes: usize) -> Tollgate<S> {
        self.max_stored_response = bytes;
        self
    }

    /// The longest [`complete`](Self::complete) keeps a response for replay (default 24 h); a
    /// longer `keep_for` is cut to it, so that no caller can hold store memory for years.
    #[must_use]
    pub fn with_max_keep_for(mut self, keep_for: Duration) -> Tollgate<S> {
        self.max_keep_for = keep_for;
        self
    }

    /// The longest [`complete`](Self::complete) keeps a response for (see
    /// [`with_max_keep_for`](Self::with_max_keep_for)).
    pub fn max_keep_for(&self) -> Duration {
        self.max_keep_for
    }

    /// The prefix of every key (default `tg`); lets several applications share one Redis.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl AsRef<str>) -> Tollgate<S> {
        let mut escaped = String::new();
        key::push_part(&mut escaped, prefix.as_ref());
        self.ban_index = ban_index_key(&escaped).into();
        self.key_start = key::limiter_key_start(&escaped);
        self.prefix = escaped.into();
        self
    }

    /// What to do when the store fails, for policies that do not say (default: allow).
    #[must_use]
    pub fn with_on_error(mut self, on_error: OnError) -> Tollgate<S> {
        self.on_error = on_error;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The largest response [`complete`](Self::complete) stores.
    pub fn max_stored_response(&self) -> usize {
        self.max_stored_response
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of the ban index under [`prefix`](Self::prefix), for [`CheckRequest::with_bans`]
    /// in checks a front end builds itself.
    pub fn ban_index(&self) -> &str {
        &self.ban_index
    }

    /// Whether checks consult the blocklist (see [`with_blocklist`](Self::with_blocklist)).
    pub fn blocklist_enabled(&self) -> bool {
        self.blocklist
    }

    /// Checks `policy` for `identity` and records `cost` units in every rule if all admit.
    ///
    /// Errors only when the identity lacks a dimension a limiter needs; a store failure is
    /// answered by `on_error` with reason [`Reason::StoreUnavailable`]. On a store that answers
    /// at once (the memory store), the first poll decides, and the future holds nothing but
    /// its arguments.
    pub fn check<'a>(
        &'a self,
        policy: &'a Policy,
        identity: &'a Identity,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, CheckError>> + Send + 'a {
        Check::new(self, policy, identity, cost, (true, 0))
    }

    /// [`check`](Self::check), admitting a request whose units conform within `max_delay`
    /// on its GCRA rules, instead of refusing it: the units are reserved at their place in
    /// the schedule (each waiter its own, so no crowd when they are due), and the decision
    /// says how long to wait before going on ([`Decision::due`]). Waiting is bounded per
    /// identity by the rule itself: at most `max_delay` over its emission interval waiters.
    /// A caller that stops waiting gives its units back with the receipt
    /// ([`refund`](Self::refund)); the tower layer's
    /// `max_delay` does it all. Rules of the other algorithms admit only what fits now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, Dimension, Identity, Limiter, MemoryStore, Policy, Rule, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// // 10 a second, no burst beyond that: one every 100 ms.
    /// let rule: Rule = "10/1s".parse()?;
    /// let checkout = Policy::builder("checkout")
    ///     .limiter(Limiter::new(Dimension::Ip, [rule.with_algorithm(Algorithm::Gcra)]))
    ///     .build()?;
    /// let who = Identity::new().with_ip("192.0.2.1".parse()?);
    /// for _ in 0..10 {
    ///     gate.check(&checkout, &who, 1).await?;
    /// }
    /// // The 11th would be refused; within 200 ms it is admitted, due in about 100 ms.
    /// let d = gate.check_within(&checkout, &who, 1, Duration::from_millis(200)).await?;
    /// assert!(d.allowed());
    /// let due = d.due(&checkout).unwrap();
    /// assert!(due > Duration::from_millis(90) && due <= Duration::from_millis(100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn check_within<'a>(
        &'a self,
        policy: &'a Policy,
        identity: &'a Identity,
        cost: u64,
        max_delay: Duration,
    ) -> impl Future<Output = Result<Decision, CheckError>> + Send + 'a {
        let delay_us = u64::try_from(max_delay.as_micros()).unwrap_or(u64::MAX);
        Check::new(self, policy, identity, cost, (true, delay_us))
    }

    /// [`check`](Self::check) without a future, when the store answers at once (the memory
    /// store); `None` when it cannot (then `check` asks it). For callers that would otherwise
    /// box the check's future: a middleware's response future, say.
    pub fn check_sync(
        &self,
        policy: &Policy,
        identity: &Identity,
        cost: u64,
    ) -> Option<Result<Decision, CheckError>> {
        let mut out = Decision::without_rules(true, Reason::Ok);
        match self.check_now(policy, identity, cost, (true, 0), &mut out) {
            Now::Done(Ok(())) => Some(Ok(out)),
            Now::Done(Err(e)) => Some(Err(e)),
            Now::Later(_) => None,
        }
    }

    /// The decision [`check`](Self::check) would return now, recording nothing.
    pub fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        identity: &'a Identity,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, CheckError>> + Send + 'a {
        Check::new(self, policy, identity, cost, (false, 0))
    }

    /// Forgets every counter of `policy` for `identity`.
    pub async fn reset(&self, policy: &Policy, identity: &Identity) -> Result<(), CheckError> {
        let mut keys = CheckKeys::new();
        self.limiter_keys(policy, identity, &mut keys)?;
        let mut limiters = LimiterRequests::new();
        keys.requests(&policy.limiters, &mut limiters, &mut BanKeys::new());
        self.store
            .reset(&CheckRequest::new(0, false, &limiters))
            .await?;
        Ok(())
    }
}

impl<S: FullStore> Tollgate<S> {
    /// This engine behind a store type chosen at run time: same store, settings and `local`
    /// fallback, for code that cannot be generic over the store (middleware, a server). The
    /// store is shared, not wrapped: a memory store still answers without a future (see
    /// [`Store::check_sync`]).
    pub fn erase(&self) -> Tollgate<AnyStore> {
        Tollgate {
            store: Arc::new(AnyStore::shared(self.store.clone())),
            prefix: self.prefix.clone(),
            key_start: self.key_start.clone(),
            on_error: self.on_error,
            blocklist: self.blocklist,
            ban_index: self.ban_index.clone(),
            max_stored_response: self.max_stored_response,
            max_keep_for: self.max_keep_for,
            local: self.local.clone(),
            make_local: self.make_local,
        }
    }
}

impl<S: OverrideStore> Tollgate<S> {
    /// Gives `identity` limits of its own in limiter `limiter` of `policy` (a limiter built
    /// [`with_overrides`](Limiter::with_overrides)), until `ttl` has passed (`None`: until
    /// removed): each of `rules` sets the limit of the limiter's rule over its window, and the
    /// limiter's other rules keep theirs. The override is kept in the store, beside the
    /// identity's counters, so every instance counts by it from its next check; it replaces
    /// any earlier override of the identity. Returns it as kept.
    ///
    /// An override changes limits, not windows: the counts so far stand, so a limit raised
    /// mid-window admits exactly up to the new limit, and one lowered below what was used
    /// denies until the window has room.
    pub async fn set_override(
        &self,
        policy: &Policy,
        limiter: &str,
        identity: &Identity,
        rules: &[Rule],
        ttl: Option<Duration>,
    ) -> Result<Override, OverrideError> {
        let at = overridable(policy, limiter)?;
        let chosen = &policy.limiters[at];
        let value = chosen
            .dimension
            .value(identity)
            .ok_or_else(|| missing_override_dimension(chosen))?;
        let entry = Override::new((&policy.scope, limiter, &value), &chosen.rules, rules)?;
        let keys = self.one_limiter_key(policy, at, identity)?;
        Ok(self
            .set_override_at(&keys.limiter(chosen), &entry, ttl)
            .await?)
    }

    /// Sets `entry` as the override of the limiter state `limiter` names (its key and rules,
    /// as a check would send them): for front ends that build their own limiter requests,
    /// like the server's Envoy descriptors. `entry` must have been made for the limiter's
    /// rules ([`Override::new`]); see [`set_override`](Self::set_override).
    pub async fn set_override_at(
        &self,
        limiter: &LimiterRequest<'_>,
        entry: &Override,
        ttl: Option<Duration>,
    ) -> Result<Override, StoreError> {
        let index = key::override_index_key(&self.prefix);
        self.store.set_override(limiter, &index, entry, ttl).await
    }

    /// Removes the override of the limiter state `limiter` names; true if there was one.
    pub async fn remove_override_at(
        &self,
        limiter: &LimiterRequest<'_>,
    ) -> Result<bool, StoreError> {
        let index = key::override_index_key(&self.prefix);
        self.store.remove_override(limiter, &index).await
    }

    /// Removes `identity`'s override in limiter `limiter` of `policy`: the configured limits
    /// count for it again from its next check. True if there was one.
    pub async fn remove_override(
        &self,
        policy: &Policy,
        limiter: &str,
        identity: &Identity,
    ) -> Result<bool, OverrideError> {
        let at = overridable(policy, limiter)?;
        let keys = self.one_limiter_key(policy, at, identity)?;
        let request = keys.limiter(&policy.limiters[at]);
        Ok(self.remove_override_at(&request).await?)
    }

    /// Every override of this engine's store (all policies) that has not ended, by policy,
    /// limiter and value. For a store that may hold many, [`overrides_page`](Self::overrides_page)
    /// lists them a page at a time.
    pub async fn overrides(&self) -> Result<Vec<Override>, StoreError> {
        let index = key::override_index_key(&self.prefix);
        self.store.overrides(&index).await
    }

    /// At most `limit` (at least 1) of this engine's overrides that have not ended, in the
    /// order they end (those that never end last), after `after` (`None`: from the start);
    /// the page's `next` continues (see [`OverrideStore::overrides_page`]).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
    ///
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let api = Policy::builder("api")
    ///     .limiter(Limiter::new(Dimension::UserId, ["100/1h".parse()?]).with_overrides(true))
    ///     .build()?;
    /// for user in ["ann", "bob", "cyd"] {
    ///     let who = Identity::new().with_user_id(user);
    ///     gate.set_override(&api, "user_id", &who, &["5000/1h".parse()?], None).await?;
    /// }
    /// let first = gate.overrides_page(None, 2).await?;
    /// assert_eq!(first.overrides.len(), 2);
    /// let rest = gate.overrides_page(first.next.as_ref(), 2).await?;
    /// assert_eq!(rest.overrides[0].value, "cyd");
    /// assert_eq!(rest.next, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn overrides_page(
        &self,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> Result<OverridePage, StoreError> {
        let index = key::override_index_key(&self.prefix);
        self.store.overrides_page(&index, after, limit).await
    }

    /// The key of limiter `at` of `policy` for `identity`, as this store finds it.
    fn one_limiter_key(
        &self,
        policy: &Policy,
        at: usize,
        identity: &Identity,
    ) -> Result<OneKey, OverrideError> {
        let limiter = &policy.limiters[at];
        let mut text = KeyBuf::default();
        let compact = !self.store.text_keys();
        if push_limiter_key(
            &mut text,
            (&self.key_start, &policy.key_heads[at]),
            limiter,
            identity,
            compact,
        ) {
            Ok(OneKey { text, compact })
        } else {
            Err(missing_override_dimension(limiter))
        }
    }
}

/// The place of limiter `name` in `policy`, if it takes overrides.
fn overridable(policy: &Policy, name: &str) -> Result<usize, OverrideError> {
    let Some(at) = policy.limiters.iter().position(|l| l.name.as_str() == name) else {
        return Err(OverrideError::UnknownLimiter {
            policy: policy.scope.to_string(),
            limiter: name.to_owned(),
            limiters: policy.limiters.iter().map(|l| l.name.to_string()).collect(),
        });
    };
    match policy.limiters[at].overrides {
        Some(_) => Ok(at),
        None => Err(OverrideError::NotOverridable(name.to_owned())),
    }
}

fn missing_override_dimension(limiter: &Limiter) -> OverrideError {
    OverrideError::MissingDimension {
        limiter: limiter.name.to_string(),
        dimension: limiter.dimension.to_string(),
    }
}

/// One limiter's key, as [`Tollgate::limiter_keys`] writes it.
struct OneKey {
    text: KeyBuf,
    compact: bool,
}

impl OneKey {
    /// The store's view of `limiter` at this key.
    fn limiter<'a>(&'a self, limiter: &'a Limiter) -> LimiterRequest<'a> {
        let (key, compact) = if self.compact {
            ("", self.text.bytes())
        } else {
            (self.text.text_at(0..self.text.len()), &[][..])
        };
        limiter.request(key, compact)
    }
}

impl<S: RefundStore> Tollgate<S> {
    /// Gives back `cost` units to every rule of `policy` for `identity` (a refund), never below
    /// empty: for requests that should not count after all (a login that succeeded, where only
    /// failures count; a job that did not run). With the [`receipt`](Decision::receipt) of the
    /// check that charged them, the refund is exact on every algorithm (a sliding log removes
    /// that check's own entries; a window that has ended since is left alone); without one, it
    /// returns the newest units of the current window and leaves concurrency limits alone (a
    /// slot is freed by its lease: [`release_concurrent`](Self::release_concurrent)). Refund at
    /// most what the check charged: with a receipt, `cost` is cut to the units it names; without
    /// one, a larger cost gives back units other requests spent. See [`RefundStore::refund`].
    ///
    /// ```
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// // Count failed logins only: charge first (never over-admits), refund a success.
    /// let login = Policy::builder("login")
    ///     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?]))
    ///     .build()?;
    /// let who = Identity::new().with_ip("192.0.2.1".parse()?);
    ///
    /// let attempt = gate.check(&login, &who, 1).await?;
    /// assert!(attempt.allowed());
    /// let password_was_right = true;
    /// if password_was_right {
    ///     gate.refund(&login, &who, 1, attempt.receipt().as_ref()).await?;
    /// }
    /// assert!(gate.check(&login, &who, 1).await?.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn refund(
        &self,
        policy: &Policy,
        identity: &Identity,
        cost: u64,
        receipt: Option<&Receipt>,
    ) -> Result<(), CheckError> {
        // Nothing to give back: no keys to build.
        if cost == 0 || receipt.is_some_and(|r| r.units() == 0) {
            return Ok(());
        }
        let mut keys = CheckKeys::new();
        self.limiter_keys(policy, identity, &mut keys)?;
        let mut limiters = LimiterRequests::new();
        keys.requests(&policy.limiters, &mut limiters, &mut BanKeys::new());
        if receipt.is_none() {
            // Without a lease, a slot is nobody's to free.
            limiters.retain(|l| !l.is_concurrent());
        }
        let request = CheckRequest::new(cost, true, &limiters);
        self.refund_run(&request, receipt).await?;
        Ok(())
    }

    /// Gives back `request.cost` units of a check the caller prepared (a front end that builds
    /// its own requests, as [`run`](Self::run) takes them); by a `receipt`, no more than it
    /// charged. What [`refund`](Self::refund) does once it has the policy's keys.
    pub async fn refund_run(
        &self,
        request: &CheckRequest<'_>,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        let mut request = *request;
        request.cost = receipt.map_or(request.cost, |r| request.cost.min(r.units()));
        if request.cost == 0 {
            return Ok(());
        }
        self.store.refund(&request, receipt).await
    }

    /// Settles the check of `receipt` at the cost the work turned out to have, for costs known
    /// only afterwards (an LLM's tokens, the bytes of a response, rows exported): check an
    /// estimate, do the work, then settle. A smaller cost gives the difference back (the
    /// receipt's exact [`refund`](Self::refund)); a larger one charges the difference even
    /// past the limits ([`RefundStore::charge`]): the identity then owes it, and its next
    /// checks are denied until time has paid it (exactly on GCRA; within the window on the
    /// window algorithms, which hold at most twice their limit). Concurrency limits are left
    /// alone. Settle a receipt once: a second settlement charges or refunds again.
    ///
    /// A check that is never settled keeps its estimate, which counts like any admission and
    /// leaves with its window: a caller that crashed holds nothing forever.
    ///
    /// ```
    /// use tollgate::{Algorithm, Dimension, Identity, Limiter, MemoryStore, Policy, Settlement, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// // 1,000 tokens a minute per user.
    /// let tokens = Policy::builder("llm")
    ///     .limiter(Limiter::new(Dimension::UserId, ["1000/1m".parse::<tollgate::Rule>()?.with_algorithm(Algorithm::Gcra)]))
    ///     .build()?;
    /// let who = Identity::new().with_user_id("u1");
    ///
    /// let estimate = gate.check(&tokens, &who, 100).await?;
    /// let receipt = estimate.receipt().expect("an admission is recorded");
    /// // The answer took 1,500 tokens: 1,400 more are owed.
    /// let settled = gate.settle(&tokens, &who, &receipt, 1_500).await?;
    /// assert_eq!(settled, Settlement::Charged(1_400));
    /// let next = gate.check(&tokens, &who, 1).await?;
    /// assert!(!next.allowed());
    /// // The debt is paid at the rule's rate: 500 tokens over the burst, 30 s at 1,000 a minute.
    /// assert!(next.retry_after().unwrap().as_secs() >= 29);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn settle(
        &self,
        policy: &Policy,
        identity: &Identity,
        receipt: &Receipt,
        cost: u64,
    ) -> Result<Settlement, CheckError> {
        let estimate = receipt.units();
        if cost == estimate {
            return Ok(Settlement::Exact);
        }
        let mut keys = CheckKeys::new();
        self.limiter_keys(policy, identity, &mut keys)?;
        let mut limiters = LimiterRequests::new();
        keys.requests(&policy.limiters, &mut limiters, &mut BanKeys::new());
        // Concurrency slots are not the settlement's: their limiters are left out, and the
        // receipt names the others' instants, and the limits overrides set for their rules,
        // in their new places.
        let mut at_us = SmallVec::<[u64; 4]>::new();
        let mut limits = Vec::new();
        let (mut place, mut kept) = (0, 0);
        for (i, limiter) in limiters.iter().enumerate() {
            let rules = place..place + limiter.rules.len();
            if !limiter.is_concurrent() {
                at_us.push(receipt.at_us(i).unwrap_or(Receipt::NOT_RECORDED));
                let named = receipt.limits().iter().filter(|(p, _)| rules.contains(p));
                limits.extend(named.map(|&(p, limit)| (p - place + kept, limit)));
                kept += rules.len();
            }
            place = rules.end;
        }
        limiters.retain(|l| !l.is_concurrent());
        if cost < estimate {
            let back = estimate - cost;
            let receipt = Receipt::per_limiter(at_us, receipt.id(), back).with_limits(limits);
            self.store
                .refund(&CheckRequest::new(back, true, &limiters), Some(&receipt))
                .await?;
            return Ok(Settlement::Refunded(back));
        }
        let owed = cost - estimate;
        self.store
            .charge(&CheckRequest::new(owed, true, &limiters))
            .await?;
        Ok(Settlement::Charged(owed))
    }

    /// Ends the leases the check of `receipt` took in `policy`'s concurrency limiters (see
    /// [`Limiter::concurrent`]): their slots are free at once. Its rate quota stays spent.
    /// Releasing twice, or after the lease ran out, changes nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Reason, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let exports = Policy::builder("export")
    ///     .limiter(Limiter::concurrent(Dimension::UserId, 1, Duration::from_secs(300))?)
    ///     .build()?;
    /// let who = Identity::new().with_user_id("u1");
    ///
    /// let running = gate.check(&exports, &who, 1).await?;
    /// let busy = gate.check(&exports, &who, 1).await?;
    /// assert_eq!(busy.reason(), Reason::ConcurrencyLimited);
    /// // The first lease ends in 5 minutes at the latest.
    /// assert!(busy.retry_after() <= Some(Duration::from_secs(300)));
    ///
    /// gate.release_concurrent(&exports, &who, &running.receipt().unwrap()).await?;
    /// assert!(gate.check(&exports, &who, 1).await?.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn release_concurrent(
        &self,
        policy: &Policy,
        identity: &Identity,
        receipt: &Receipt,
    ) -> Result<(), CheckError> {
        let mut keys = CheckKeys::new();
        self.limiter_keys(policy, identity, &mut keys)?;
        let mut all = LimiterRequests::new();
        keys.requests(&policy.limiters, &mut all, &mut BanKeys::new());
        let Some((requests, leases)) = concurrent_part(policy, &all, receipt) else {
            return Ok(());
        };
        let request = CheckRequest::new(receipt.units(), true, &requests);
        self.store.refund(&request, Some(&leases)).await?;
        Ok(())
    }

    /// Renews the leases the check of `receipt` took in `policy`'s concurrency limiters: their
    /// `lease_ttl` counts again from now, for a job that runs longer. Returns the receipt that
    /// names them now (use it for the next renewal and the release), or `None` if a lease had
    /// already run out or been released: the slot may be someone else's now. Any receipt of the
    /// check names its leases, whichever renewal it came from: a renewal that failed (a timeout
    /// while the store renewed it, say) can be asked again with the receipt in hand.
    pub async fn extend_concurrent(
        &self,
        policy: &Policy,
        identity: &Identity,
        receipt: &Receipt,
    ) -> Result<Option<Receipt>, CheckError> {
        let mut keys = CheckKeys::new();
        self.limiter_keys(policy, identity, &mut keys)?;
        let mut all = LimiterRequests::new();
        keys.requests(&policy.limiters, &mut all, &mut BanKeys::new());
        let Some((requests, leases)) = concurrent_part(policy, &all, receipt) else {
            return Ok(Some(receipt.clone()));
        };
        let request = CheckRequest::new(receipt.units(), true, &requests);
        let Some(renewed) = self.store.extend(&request, &leases).await? else {
            return Ok(None);
        };
        // The renewed instants in the concurrency limiters' places, the others as they were.
        let mut next = 0;
        let at_us = policy.limiters.iter().enumerate().map(|(i, limiter)| {
            let at = if limiter.is_concurrent() {
                next += 1;
                renewed.at_us(next - 1)
            } else {
                receipt.at_us(i)
            };
            at.unwrap_or(Receipt::NOT_RECORDED)
        });
        let renewed = Receipt::per_limiter(at_us, receipt.id(), receipt.units());
        Ok(Some(renewed.with_limits(receipt.limits().iter().copied())))
    }
}

impl<S: Store> Tollgate<S> {
    /// The seed's group check: all `rules` counted on one key `name`.
    ///
    /// Sliding-log rules share one log, so `10/1m` and `100/1h` on one key cost one entry per
    /// request. Store failures follow the engine's `on_error`.
    pub async fn check_group(&self, name: &str, rules: &[Rule], cost: u64) -> NamedDecision {
        let mut unique: Vec<Rule> = Vec::with_capacity(rules.len());
        for rule in rules {
            if !unique.contains(rule) {
                unique.push(*rule);
            }
        }
        let limiter = Limiter::new(Dimension::Global, unique).with_name(name);
        let key = key::group_key(&self.prefix, name);
        let mut decision = Decision::without_rules(true, Reason::Ok);
        let limiters = vec![limiter];
        self.check_named(&limiters, &[key], cost, &mut decision)
            .await;
        NamedDecision::new(decision, limiters)
    }

    /// The seed's single check: every rule counted on a key of its own (`name` + the rule).
    ///
    /// Each rule is its own limiter in the decision, named like the rule (`10/1m`, or
    /// `10/1m fixed_window` for a non-default algorithm).
    pub async fn check_single(&self, name: &str, rules: &[Rule], cost: u64) -> NamedDecision {
        let mut limiters = Vec::with_capacity(rules.len());
        let mut keys = Vec::with_capacity(rules.len());
        let base = key::group_key(&self.prefix, name);
        for rule in rules {
            // Compare rules, not their text: `2/10s` counted by two algorithms is two rules.
            if limiters
                .iter()
                .any(|l: &Limiter| l.rules.first() == Some(rule))
            {
                continue;
            }
            // Named like the rule, with its algorithm unless it is the default.
            let text = match rule.algorithm() {
                Algorithm::SlidingLog => rule.to_string(),
                other => format!("{rule} {other}"),
            };
            keys.push(key::single_key(&base, rule));
            limiters.push(Limiter::new(Dimension::Global, [*rule]).with_name(text));
        }
        let mut decision = Decision::without_rules(true, Reason::Ok);
        self.check_named(&limiters, &keys, cost, &mut decision)
            .await;
        NamedDecision::new(decision, limiters)
    }
}

impl<S: BanStore> Tollgate<S> {
    /// Every active ban, with the time left.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{BanTarget, Identity, MemoryStore, Reason, Tollgate};
    /// # use tollgate::{Dimension, Limiter, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// # let login = Policy::builder("login").limiter(Limiter::new(Dimension::UserId, ["5/1m".parse()?])).build()?;
    /// let mallory = BanTarget::UserId("mallory".into());
    /// gate.ban(&mallory, Duration::from_secs(3600)).await?;
    ///
    /// let who = Identity::new().with_user_id("mallory");
    /// assert_eq!(gate.check(&login, &who, 1).await?.reason(), Reason::Blocked);
    /// assert_eq!(gate.blocklist().await?[0].target, mallory);
    ///
    /// assert!(gate.unban(&mallory).await?);
    /// assert!(gate.check(&login, &who, 1).await?.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn blocklist(&self) -> Result<Vec<BanEntry>, StoreError> {
        self.store.bans(&self.prefix).await
    }

    /// Bans `target` for `duration` from now, on every policy of this engine's prefix.
    pub async fn ban(&self, target: &BanTarget, duration: Duration) -> Result<(), StoreError> {
        self.store.ban(&self.prefix, target, duration).await
    }

    /// Lifts the ban on `target` and forgets its strikes; true if it was banned.
    pub async fn unban(&self, target: &BanTarget) -> Result<bool, StoreError> {
        self.store.unban(&self.prefix, target).await
    }

    /// The bans `policy` wrote for itself ([`BanScope::Policy`]), with the time left; none for a
    /// policy whose bans every policy sees (those are in [`blocklist`](Self::blocklist)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{BanRule, BanScope, Dimension, Identity, Limiter, MemoryStore, Policy, Reason, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let login = Policy::builder("login")
    ///     .limiter(
    ///         Limiter::new(Dimension::UserId, ["1/1m".parse()?])
    ///             .with_blocklist(BanRule::new(Duration::from_secs(600))),
    ///     )
    ///     .ban_scope(BanScope::Policy)
    ///     .build()?;
    /// let search = Policy::builder("search")
    ///     .limiter(Limiter::new(Dimension::UserId, ["100/1m".parse()?]))
    ///     .build()?;
    /// let who = Identity::new().with_user_id("mallory");
    /// gate.check(&login, &who, 1).await?;
    /// gate.check(&login, &who, 1).await?; // over: banned from login
    /// assert_eq!(gate.check(&login, &who, 1).await?.reason(), Reason::Blocked);
    /// assert!(gate.check(&search, &who, 1).await?.allowed(), "not from search");
    /// assert_eq!(gate.bans_in(&login).await?.len(), 1);
    /// assert!(gate.blocklist().await?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn bans_in(&self, policy: &Policy) -> Result<Vec<BanEntry>, StoreError> {
        match self.own_bans(policy) {
            Some(prefix) => self.store.bans(&prefix).await,
            None => Ok(Vec::new()),
        }
    }

    /// Bans `target` from `policy` alone for `duration`. A policy whose bans every policy
    /// sees has no list of its own: nothing is written, and the answer is `false` (use
    /// [`ban`](Self::ban)).
    pub async fn ban_in(
        &self,
        policy: &Policy,
        target: &BanTarget,
        duration: Duration,
    ) -> Result<bool, StoreError> {
        match self.own_bans(policy) {
            Some(prefix) => self
                .store
                .ban(&prefix, target, duration)
                .await
                .map(|()| true),
            None => Ok(false),
        }
    }

    /// Lifts `policy`'s own ban on `target`; true if it was banned. A policy whose bans every
    /// policy sees has none of its own: `false` (lift those with [`unban`](Self::unban)).
    pub async fn unban_in(&self, policy: &Policy, target: &BanTarget) -> Result<bool, StoreError> {
        match self.own_bans(policy) {
            Some(prefix) => self.store.unban(&prefix, target).await,
            None => Ok(false),
        }
    }
}

impl<S: Store> Tollgate<S> {
    /// The prefix `policy`'s own bans live under ([`BanScope::Policy`]), for the store's
    /// listing calls ([`BanStore::bans_page`]); `None` for a policy whose bans every policy sees.
    pub fn ban_prefix(&self, policy: &Policy) -> Option<String> {
        self.own_bans(policy)
    }

    /// The ban prefix of `policy`'s own bans, if its bans are its own.
    fn own_bans(&self, policy: &Policy) -> Option<String> {
        (policy.ban_scope == BanScope::Policy).then(|| {
            let mut prefix = String::new();
            key::push_policy_ban_prefix(&mut prefix, &self.prefix, &policy.scope);
            prefix
        })
    }
}

impl<S: LockStore> Tollgate<S> {
    /// Tries to take the duplicate-guard lock for this submission.
    ///
    /// Errors when the identity lacks the guard's dimension, or when the store fails: a
    /// duplicate guard has no safe default answer, so the caller decides.
    pub async fn acquire(
        &self,
        guard: &DuplicateGuard,
        identity: &Identity,
        fingerprint: &Fingerprint,
    ) -> Result<Acquire, CheckError> {
        let key = guard
            .key(&self.prefix, identity, fingerprint)
            .ok_or_else(|| CheckError::MissingDimension {
                limiter: format!("duplicate guard of {}", guard.scope),
                dimension: guard.by.to_string(),
            })?;
        let token = new_token();
        let fingerprint = fingerprint.to_string();
        match self
            .store
            .lock_acquire(&key, &token, &fingerprint, guard.ttl)
            .await?
        {
            LockReply::Acquired => Ok(Acquire::Acquired(Lease { key, token })),
            LockReply::Held(held) => Ok(Acquire::Duplicate(Duplicate {
                state: if held.completed {
                    DuplicateState::Completed
                } else {
                    DuplicateState::InProgress
                },
                retry_after: Duration::from_micros(held.ttl_left_us),
                response: held.response,
                fingerprint_matches: held.fingerprint == fingerprint,
            })),
        }
    }

    /// Frees the lock early so the client can retry at once (e.g. the submission failed).
    /// Only the holder's lease frees it: false if it expired or was taken by someone else, or
    /// if it names no lock of this engine's.
    pub async fn release(&self, lease: &Lease) -> Result<bool, StoreError> {
        if !self.guards(lease) {
            return Ok(false);
        }
        self.store.lock_release(&lease.key, &lease.token).await
    }

    /// Whether `lease` names a lock of this engine's guards (see `key::guard_key`). A lease
    /// is text a client hands back: one naming any other key of the store (a counter, a ban,
    /// another prefix's lock) holds nothing here, and is not sent to the store.
    fn guards(&self, lease: &Lease) -> bool {
        lease
            .key
            .strip_prefix(&*self.prefix)
            .and_then(|rest| rest.strip_prefix(":{d:"))
            .is_some_and(|rest| rest.ends_with('}'))
    }

    /// Records the submission's outcome: for `keep_for` (at most the engine's
    /// [`with_max_keep_for`](Self::with_max_keep_for)), duplicates are answered with `response`
    /// (replay). False if the lease no longer holds the lock.
    pub async fn complete(
        &self,
        lease: &Lease,
        response: &[u8],
        keep_for: Duration,
    ) -> Result<bool, CheckError> {
        if response.len() > self.max_stored_response {
            return Err(CheckError::ResponseTooLarge {
                size: response.len(),
                cap: self.max_stored_response,
            });
        }
        if !self.guards(lease) {
            return Ok(false);
        }
        Ok(self
            .store
            .lock_complete(
                &lease.key,
                &lease.token,
                response,
                keep_for.min(self.max_keep_for),
            )
            .await?)
    }
}

/// The concurrency limiters of `policy` among its limiter requests `all`, and the part of
/// `receipt` that names their leases; `None` if the policy has none.
fn concurrent_part<'a>(
    policy: &Policy,
    all: &LimiterRequests<'a>,
    receipt: &Receipt,
) -> Option<(LimiterRequests<'a>, Receipt)> {
    let picked: SmallVec<[usize; INLINE_LIMITERS]> = policy
        .limiters
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_concurrent())
        .map(|(i, _)| i)
        .collect();
    if picked.is_empty() {
        return None;
    }
    let requests = picked.iter().map(|&i| all[i]).collect();
    let at_us = picked
        .iter()
        .map(|&i| receipt.at_us(i).unwrap_or(Receipt::NOT_RECORDED));
    Some((
        requests,
        Receipt::per_limiter(at_us, receipt.id(), receipt.units()),
    ))
}

/// 128 random bits, hex: a lease token nobody can guess.
fn new_token() -> String {
    let bits: u128 = rand::random();
    format!("{bits:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AnyStore, ManualClock, MemoryStore};

    async fn shared_state<S: BanStore>(gate: Tollgate<S>) {
        let policy = Policy::builder("login")
            .limiter(Limiter::new(Dimension::Ip, ["2/1m".parse().unwrap()]))
            .build()
            .unwrap();
        let who = Identity::new().with_ip("192.0.2.1".parse().unwrap());
        let check = || gate.check(&policy, &who, 1);
        assert!(check().await.unwrap().allowed());
        assert!(check().await.unwrap().allowed());
        assert!(!check().await.unwrap().allowed());
        gate.reset(&policy, &who).await.unwrap();
        assert!(check().await.unwrap().allowed());
        // Once a ban may be live, checks carry ban keys: same counts.
        let other = BanTarget::Ip("198.51.100.9".parse().unwrap());
        gate.ban(&other, Duration::from_secs(3600)).await.unwrap();
        assert!(gate.store().bans_possible());
        assert!(check().await.unwrap().allowed());
        let denied = check().await.unwrap();
        assert!(!denied.allowed());
        assert_eq!(denied.rules(&policy)[0].remaining, 0);
    }

    #[tokio::test]
    async fn checks_resets_and_bans_share_state_through_every_wrapper() {
        let memory = || {
            MemoryStore::builder()
                .clock(ManualClock::new(Duration::from_secs(1_000)))
                .purge_interval(None)
                .build()
        };
        shared_state(Tollgate::new(memory())).await;
        shared_state(Tollgate::new(AnyStore::new(memory()))).await;
        shared_state(Tollgate::new(Arc::new(memory()))).await;
    }

    /// A log's entries are written one per unit: one check writes at most `MAX_LOG_COST`,
    /// whatever the rule's limit, so its work and memory stay bounded.
    #[tokio::test]
    async fn a_log_takes_bounded_cost_per_check() {
        let gate = Tollgate::new(MemoryStore::new());
        let policy = Policy::builder("export")
            .limiter(Limiter::new(
                Dimension::Global,
                ["1000000/1h".parse().unwrap()],
            ))
            .build()
            .unwrap();
        let who = Identity::new();
        let refused = gate
            .check(&policy, &who, crate::MAX_LOG_COST + 1)
            .await
            .unwrap();
        assert_eq!(refused.reason(), Reason::CostExceedsLimit);
        assert_eq!(refused.rules(&policy).len(), 1, "the rule is named");
        let peek = gate.peek(&policy, &who, 1).await.unwrap();
        assert_eq!(
            peek.rules(&policy)[0].remaining,
            999_999,
            "nothing was recorded"
        );
        let admitted = gate
            .check(&policy, &who, crate::MAX_LOG_COST)
            .await
            .unwrap();
        assert!(admitted.allowed());
        // A rule that keeps one number takes any cost up to its limit.
        let gcra = Policy::builder("export_gcra")
            .limiter(Limiter::new(
                Dimension::Global,
                ["1000000/1h"
                    .parse::<crate::Rule>()
                    .unwrap()
                    .with_algorithm(crate::Algorithm::Gcra)],
            ))
            .build()
            .unwrap();
        assert!(gate.check(&gcra, &who, 500_000).await.unwrap().allowed());
    }
}
