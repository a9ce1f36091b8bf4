//! The embedded store: sharded maps in this process.
//!
//! - `map`: the shards, keys found by hash, eviction;
//! - `rules`: the rule states under one limiter key;
//! - `bans`: the blocklist;
//! - `locks`: duplicate-guard locks;
//! - `overrides`: per-identity overrides.

mod bans;
mod locks;
mod log;
mod map;
mod overrides;
mod rules;

use std::{
    fmt,
    future::Future,
    sync::{
        Arc, Weak,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use smallvec::SmallVec;

use self::{
    map::{Entry, Kind, Locked, Shard, Shards, SlotId, State},
    overrides::{Overrides, Rules},
    rules::RuleStates,
};
use crate::{
    algorithm::{self, RuleOutcome},
    blocklist::{BanEntry, BanPage, BanTarget},
    clock::{Clock, SystemClock},
    error::StoreError,
    overrides::{Override, OverridePage},
    page::PageCursor,
    rule::{Algorithm, Rule},
    store::{
        BanStore, CheckRequest, LimiterAnswer, LimiterCheck, LimiterRequest, LockReply, LockStore,
        OverrideStore, Receipt, RefundStore, Store, Verdict,
    },
};

/// An in-process store: exact and atomic within one process, nothing shared across processes.
///
/// Keys live in shards, each behind its own mutex; a limiter's key (one per identity) holds the
/// states of all its rules. A key is hashed once per check and found by its hash, then compared
/// whole. A check locks the shards of all its keys in ascending order (so concurrent checks
/// cannot deadlock) and holds them while it evaluates and records, which makes a
/// multi-limiter check atomic.
///
/// Memory is bounded by budgets, one per kind of entry, each split evenly over the shards:
/// limiter keys ([`MemoryStoreBuilder::max_keys`]), bans ([`max_bans`]), duplicate-guard locks
/// ([`max_locks`]) and the bytes of their stored responses ([`max_response_bytes`]). No kind
/// can take another's room, so a flood of locks or bans never makes a rate-limit check fail.
///
/// A check that needs a new key in a full shard **evicts** one: sampling a few limiter keys at
/// random, it drops an expired one if it finds one, else the least recently used key that is
/// within its limits, and a key at its limit only when the sample holds nothing else. A check
/// always finds room. An evicted key at its limit is remembered in a compact record (its hash
/// and the instant its state would have ended, 16 bytes; at most [`max_keys`] of them, the one
/// nearest its end forgotten first past that): until then it is denied as if it had not been
/// evicted, so eviction never gives an at-limit client its quota back early (it may wait up to
/// its longest window instead of its exact retry moment). A flood of new keys can only make
/// the store forget its quietest clients; it never leaves a new client unlimited
/// ([`MemoryStore::evictions`] counts them). A ban budget full of live bans writes no new one
/// (counted in [`MemoryUsage::dropped_bans`]: the offender is still limited by its rules, and
/// no flood of bans can lift those in force); a full lock or response budget refuses the new
/// lock or response with a
/// [`Capacity`](crate::StoreErrorKind::Capacity) error. Expired keys are also emptied when
/// touched and dropped by a background sweep.
///
/// [`max_keys`]: MemoryStoreBuilder::max_keys
/// [`max_bans`]: MemoryStoreBuilder::max_bans
/// [`max_locks`]: MemoryStoreBuilder::max_locks
/// [`max_response_bytes`]: MemoryStoreBuilder::max_response_bytes
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, MemoryStore};
///
/// let clock = ManualClock::new(Duration::from_secs(1_000_000));
/// let store = MemoryStore::builder().clock(clock.clone()).max_keys(10_000).build();
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Shards,
    clock: Arc<dyn Clock>,
    /// Each kind's budget per shard.
    budget: Budget,
    /// The latest end of any ban ever written: before it, checks must look at ban keys.
    ban_horizon: AtomicU64,
    /// The id of the next check that takes a lease (see `RuleStates::record`).
    next_id: AtomicU64,
    /// Keys evicted to make room.
    evictions: AtomicU64,
    /// Bans not written because the ban budget was full and none could be evicted.
    dropped_bans: AtomicU64,
    /// Per-identity overrides (at most `max_keys`).
    overrides: Overrides,
}

/// What one shard may hold of each kind.
struct Budget {
    counters: usize,
    bans: usize,
    locks: usize,
    response_bytes: usize,
}

impl Budget {
    fn of(&self, kind: Kind) -> usize {
        match kind {
            Kind::Counter => self.counters,
            Kind::Ban => self.bans,
            Kind::Lock => self.locks,
        }
    }
}

/// Shards enough that threads seldom meet in one (eight per core), and no more: every check
/// touches its shard's lock, counters and table, so each shard more is cache lines more that a
/// check over many keys misses (on a 2-core machine, a check over 1,000 keys missed the
/// first-level cache 3.6 times with 64 shards, 2.4 times with 16). Between 16 and 64.
fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(8, usize::from);
    (8 * cores).next_power_of_two().clamp(16, 64)
}

impl MemoryStore {
    /// A store with the system clock and default limits (eight shards a core, between 16 and
    /// 64; one million keys; a sweep every 5 seconds).
    pub fn new() -> MemoryStore {
        MemoryStore::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            clock: Arc::new(SystemClock),
            shards: default_shards(),
            max_keys: 1_000_000,
            max_bans: 100_000,
            max_locks: 100_000,
            max_response_bytes: 64 << 20,
            purge_interval: Some(Duration::from_secs(5)),
        }
    }

    /// The number of keys held, expired ones included until they are swept.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// The store holds no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many keys were evicted to make room for new ones since the store was built.
    pub fn evictions(&self) -> u64 {
        self.inner.evictions.load(Ordering::Relaxed)
    }

    /// What the store holds of each kind now, expired entries included until they are swept.
    pub fn usage(&self) -> MemoryUsage {
        let mut usage = MemoryUsage::default();
        for shard in self.inner.shards.iter() {
            let u = shard.lock().usage();
            usage.limiter_keys += u.counters;
            usage.bans += u.bans;
            usage.locks += u.locks;
            usage.response_bytes += u.response_bytes;
        }
        usage.dropped_bans = self.inner.dropped_bans.load(Ordering::Relaxed);
        usage
    }

    /// Drops every expired key now (the background sweep does this periodically).
    pub fn purge_expired(&self) {
        let now = self.inner.clock.now_us();
        for shard in self.inner.shards.iter() {
            shard.lock().purge(now, &[]);
        }
    }

    /// Runs a check synchronously: what [`Store::check`] and [`Store::check_sync`] answer.
    pub fn check_now(&self, request: &CheckRequest<'_>) -> Result<Verdict, StoreError> {
        let mut verdict = Verdict::empty();
        self.inner.check(request, &mut verdict)?;
        Ok(verdict)
    }
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.count())
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

/// What a [`MemoryStore`] holds, by kind (see [`MemoryStore::usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryUsage {
    /// Limiter keys (one per identity of a limiter).
    pub limiter_keys: usize,
    /// Bans.
    pub bans: usize,
    /// Duplicate-guard locks.
    pub locks: usize,
    /// Bytes of the responses stored with completed locks.
    pub response_bytes: usize,
    /// Bans not written since the store was built: the ban budget was full of live bans.
    pub dropped_bans: u64,
}

/// Configures a [`MemoryStore`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, MemoryStore};
///
/// let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
/// let store = MemoryStore::builder()
///     .clock(clock.clone()) // tests move time by hand
///     .max_keys(100_000) // past it, the keys nearest to expiring are evicted first
///     .build();
/// # let _ = store;
/// ```
#[must_use]
pub struct MemoryStoreBuilder {
    clock: Arc<dyn Clock>,
    shards: usize,
    max_keys: usize,
    max_bans: usize,
    max_locks: usize,
    max_response_bytes: usize,
    purge_interval: Option<Duration>,
}

impl MemoryStoreBuilder {
    /// The clock (default: the system clock). Tests pass a [`ManualClock`](crate::ManualClock).
    pub fn clock(mut self, clock: impl Clock) -> MemoryStoreBuilder {
        self.clock = Arc::new(clock);
        self
    }

    /// Number of shards (default eight a core, between 16 and 64; at least 1).
    pub fn shards(mut self, shards: usize) -> MemoryStoreBuilder {
        self.shards = shards.max(1);
        self
    }

    /// The most limiter keys the store holds (default one million), split evenly over the
    /// shards; past it, new keys evict old ones (see [`MemoryStore`]).
    pub fn max_keys(mut self, max_keys: usize) -> MemoryStoreBuilder {
        self.max_keys = max_keys;
        self
    }

    /// The most bans the store holds (default 100,000), split evenly over the shards; past it,
    /// new bans are not written until some end (see [`MemoryUsage::dropped_bans`]).
    pub fn max_bans(mut self, max_bans: usize) -> MemoryStoreBuilder {
        self.max_bans = max_bans;
        self
    }

    /// The most duplicate-guard locks the store holds (default 100,000), split evenly over the
    /// shards; past it, a new lock is refused with a
    /// [`Capacity`](crate::StoreErrorKind::Capacity) error until one ends.
    pub fn max_locks(mut self, max_locks: usize) -> MemoryStoreBuilder {
        self.max_locks = max_locks;
        self
    }

    /// The most bytes of stored responses the store holds (default 64 MiB), split evenly over
    /// the shards; past it, completing a lock with a response is refused with a
    /// [`Capacity`](crate::StoreErrorKind::Capacity) error.
    pub fn max_response_bytes(mut self, bytes: usize) -> MemoryStoreBuilder {
        self.max_response_bytes = bytes;
        self
    }

    /// How often a background thread sweeps expired keys (default 5 s); `None` sweeps only on
    /// access and when a shard is full.
    pub fn purge_interval(mut self, interval: Option<Duration>) -> MemoryStoreBuilder {
        self.purge_interval = interval;
        self
    }

    /// Builds the store (and starts its sweeper thread, which ends with the store).
    pub fn build(self) -> MemoryStore {
        let inner = Arc::new(Inner {
            shards: Shards::new(self.shards),
            clock: self.clock,
            budget: Budget {
                counters: (self.max_keys / self.shards).max(1),
                bans: (self.max_bans / self.shards).max(1),
                locks: (self.max_locks / self.shards).max(1),
                response_bytes: self.max_response_bytes / self.shards,
            },
            ban_horizon: AtomicU64::new(0),
            // Random, not 1: a lease is found by its check's id alone, so a receipt kept from
            // before a restart must not name a lease of this run.
            next_id: AtomicU64::new(
                std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8) | 1,
            ),
            evictions: AtomicU64::new(0),
            dropped_bans: AtomicU64::new(0),
            overrides: Overrides::new(self.max_keys),
        });
        if let Some(interval) = self.purge_interval {
            spawn_sweeper(Arc::downgrade(&inner), interval);
        }
        MemoryStore { inner }
    }
}

fn spawn_sweeper(inner: Weak<Inner>, interval: Duration) {
    // A failed spawn only loses the background sweep; access and full shards still purge.
    let _ = thread::Builder::new()
        .name("tollgate-sweep".into())
        .spawn(move || {
            loop {
                thread::sleep(interval);
                let Some(inner) = inner.upgrade() else { return };
                let now = inner.clock.now_us();
                for shard in inner.shards.iter() {
                    shard.lock().purge(now, &[]);
                }
            }
        });
}

/// `d` in microseconds, saturating: a duration past the end of time never wraps to the past.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Per limiter of a check: where its entry is (if it has one), and whether it admits.
type Found = SmallVec<[(Option<SlotId>, bool); 4]>;

/// The outcomes of a limiter key evicted at its limit that owes `wait_us` more: every rule
/// denies (a peek of cost 0 is told nothing is left). Returns whether it admits.
fn owed(wait_us: u64, cost: u64, out: &mut [RuleOutcome]) -> bool {
    let admits = cost == 0;
    for o in out.iter_mut() {
        *o = RuleOutcome {
            allowed: admits,
            remaining: 0,
            reset_after_us: wait_us,
            retry_after_us: (!admits).then_some(wait_us),
        };
    }
    admits
}

/// Evaluates `rules`, a limiter's, under its key (and the key's hash) in its shard into `out`:
/// where its entry is (`None` for a new key), and whether it admits.
#[inline(always)]
fn evaluate(
    shard: &mut Shard,
    (hash, key): (u64, &[u8]),
    rules: &[Rule],
    now: u64,
    (cost, delay_us): (u64, u64),
    out: &mut [RuleOutcome],
) -> (Option<SlotId>, bool) {
    let Some(id) = shard.find(hash, key) else {
        let admits = match shard.owed(hash, now) {
            Some(until) => owed(until - now, cost, out),
            None => RuleStates::default().evaluate(rules, now, cost, delay_us, out),
        };
        return (None, admits);
    };
    match evaluate_at(shard, id, rules, now, (cost, delay_us), out) {
        Some(admits) => (Some(id), admits),
        // A key of another kind (never in practice): replaced, as a new key.
        None => (
            None,
            RuleStates::default().evaluate(rules, now, cost, delay_us, out),
        ),
    }
}

/// [`evaluate`] of the entry in slot `id`: whether it admits; `None` for a key of another kind
/// (never in practice), which is replaced, as a new key.
#[inline(always)]
fn evaluate_at(
    shard: &mut Shard,
    id: SlotId,
    rules: &[Rule],
    now: u64,
    (cost, delay_us): (u64, u64),
    out: &mut [RuleOutcome],
) -> Option<bool> {
    match shard.touch(id) {
        Entry {
            state: State::Rules(states),
            expires_at,
            ..
        } => {
            if *expires_at <= now {
                states.clear();
            }
            Some(states.evaluate(rules, now, cost, delay_us, out))
        }
        _ => None,
    }
}

/// A check of a limiter's only rule, a GCRA rule, on the entry in slot `id`, when the entry
/// holds that rule's state alone (as `record` leaves it): its arrival time read and moved in
/// place, the entry marked as `evaluate`, `settle` and `record` would mark it. `None` when the
/// entry holds anything else.
#[inline(always)]
fn gcra_in_place(
    shard: &mut Shard,
    id: SlotId,
    rule: &Rule,
    now: u64,
    c: &LimiterCheck<'_>,
    o: &mut RuleOutcome,
) -> Option<LimiterAnswer> {
    let entry = shard.touch(id);
    let State::Rules(states) = &mut entry.state else {
        return None;
    };
    // An arrival time that ran out is in the past: read as `now`, as a cleared state is.
    let tat = states.lone_gcra(rule)?;
    *o = algorithm::gcra_within(Some(*tat), now, rule, c.cost, c.delay_us).0;
    let recorded = o.allowed && c.consume && c.cost > 0;
    if !o.allowed {
        entry.limited = true;
    } else if recorded {
        *tat = now.saturating_add(o.reset_after_us);
        entry.expires_at = entry.expires_at.max(*tat);
        entry.limited = o.remaining == 0;
    }
    Some(LimiterAnswer {
        allowed: o.allowed,
        recorded_at: recorded.then_some(now),
    })
}

/// After a limiter of `rules` was not recorded: its admitting rules report the state as it
/// stays (`out` holds what they said for the check's `cost` at `now`), and its entry is marked
/// limited if a rule denied.
#[inline]
fn settle(
    shard: &mut Shard,
    id: Option<SlotId>,
    rules: &[Rule],
    (now, cost): (u64, u64),
    out: &mut [RuleOutcome],
) {
    let denied = out.iter().any(|o| !o.allowed);
    match id.map(|id| shard.entry(id)) {
        Some(entry) => {
            entry.limited |= denied;
            if let State::Rules(states) = &mut entry.state {
                states.settle(rules, now, cost, out);
            }
        }
        None => RuleStates::default().settle(rules, now, cost, out),
    }
}

/// Records an admission of `cost` in the entry of a limiter of `rules` (a new one when `id` is
/// `None`; room was made for it), with `outcomes` its admitting outcomes.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn record(
    shard: &mut Shard,
    id: Option<SlotId>,
    (hash, key): (u64, &[u8]),
    rules: &[Rule],
    outcomes: &[RuleOutcome],
    now: u64,
    cost: u64,
    check_id: u64,
) {
    let used_up = outcomes.iter().any(|o| o.remaining == 0);
    match id.map(|id| shard.entry(id)) {
        Some(Entry {
            state: State::Rules(states),
            expires_at,
            limited,
            ..
        }) => {
            let until = states.record(rules, outcomes, now, cost, check_id);
            *expires_at = (*expires_at).max(until);
            *limited = used_up;
        }
        _ => {
            let mut states = RuleStates::default();
            let expires_at = states.record(rules, outcomes, now, cost, check_id);
            let mut entry = Entry::new(State::Rules(states), expires_at);
            entry.limited = used_up;
            shard.insert(hash, key, entry);
        }
    }
}

impl Inner {
    /// Whether a ban may be live now (false until a ban was ever written, without a clock read).
    #[inline]
    fn bans_possible(&self) -> bool {
        let horizon = self.ban_horizon.load(Ordering::Acquire);
        horizon != 0 && self.clock.now_us() < horizon
    }

    /// One atomic check (see [`CheckRequest`]), answered into `verdict`.
    fn check(&self, request: &CheckRequest<'_>, verdict: &mut Verdict) -> Result<(), StoreError> {
        verdict.limits.clear();
        if self.overrides.may_apply(request) {
            return self.check_overridden(request, verdict);
        }
        self.check_rules(request, verdict)
    }

    /// A check of one limiter on a key the store holds (see [`Store::check_limiter`]),
    /// under its shard's lock, by the functions `check_one` uses (a lone GCRA rule's arrival
    /// time read and moved in place). `None` for a new key (room to make, maybe a debt to
    /// read) or a key of another kind, which [`check`](Self::check) answers.
    #[inline]
    fn check_limiter(
        &self,
        c: &LimiterCheck<'_>,
        out: &mut [RuleOutcome],
    ) -> Option<LimiterAnswer> {
        let hash = self.shards.hash(c.key);
        let mut shard = self.shards.lock_one(hash);
        let id = shard.find(hash, c.key)?;
        let now = self.clock.now_us();
        if let ([rule], [o]) = (c.rules, &mut *out)
            && rule.algorithm() == Algorithm::Gcra
            && let Some(answer) = gcra_in_place(&mut shard, id, rule, now, c, o)
        {
            return Some(answer);
        }
        let admits = evaluate_at(&mut shard, id, c.rules, now, (c.cost, c.delay_us), out)?;
        if !admits {
            settle(&mut shard, Some(id), c.rules, (now, c.cost), out);
            return Some(LimiterAnswer {
                allowed: false,
                recorded_at: None,
            });
        }
        let recorded = c.consume && c.cost > 0;
        if recorded {
            // No concurrency limit: no lease to name, so no check id.
            let at = (hash, c.key);
            record(&mut shard, Some(id), at, c.rules, out, now, c.cost, 0);
        }
        Some(LimiterAnswer {
            allowed: true,
            recorded_at: recorded.then_some(now),
        })
    }

    /// A check that may meet an override: with the limits of those that apply.
    #[cold]
    #[inline(never)]
    fn check_overridden(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Result<(), StoreError> {
        // The limits go into the verdict once the check has written the rest of it.
        let mut limits = std::mem::take(&mut verdict.limits);
        let result = self.overridden(request, &mut limits, |r| self.check_rules(r, verdict));
        verdict.limits = limits;
        result
    }

    /// The check, with the limits it counts by in its rules.
    #[inline(always)]
    fn check_rules(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Result<(), StoreError> {
        verdict.banned_us = None;
        verdict.receipt = None;
        verdict.rules.clear();
        match request.limiters {
            [one] if request.bans.is_empty() && !one.shadow => {
                self.check_one(request, one, verdict)
            }
            _ => self.check_many(request, verdict),
        }
        Ok(())
    }

    /// A check of one enforced limiter without ban keys, the common case: one key, one shard.
    #[inline(always)]
    fn check_one(&self, request: &CheckRequest<'_>, l: &LimiterRequest<'_>, verdict: &mut Verdict) {
        let key = l.key_bytes();
        let hash = self.shards.hash(key);
        let mut shard = self.shards.lock_one(hash);
        let now = self.clock.now_us();
        verdict.blocked_us = None;
        // Pushed, not resized: resizing goes through the general `extend`.
        for _ in l.rules.iter() {
            verdict.rules.push(RuleOutcome::default());
        }
        let out = &mut verdict.rules[..];
        let cost = request.cost;
        let at = (hash, key);
        let (id, admits) = evaluate(&mut shard, at, l.rules, now, (cost, request.delay_us), out);
        verdict.allowed = admits;
        if !admits {
            settle(&mut shard, id, l.rules, (now, cost), out);
            return;
        }
        if request.consume && cost > 0 {
            if id.is_none() {
                self.make_room(&mut shard, Kind::Counter, 1, now, &[]);
            }
            let check_id = self.check_id(request);
            record(&mut shard, id, at, l.rules, out, now, cost, check_id);
            verdict.receipt = Some(Receipt::new(now, check_id, cost));
        }
    }

    /// A check of any limiters and ban keys: every shard they live in locked at once.
    fn check_many(&self, request: &CheckRequest<'_>, verdict: &mut Verdict) {
        let mut hashes = SmallVec::<[u64; 8]>::new();
        for key in request.limiters.iter().map(LimiterRequest::key_bytes) {
            hashes.push(self.shards.hash(key));
        }
        for key in request.bans.iter().map(|b| b.key) {
            hashes.push(self.shards.hash(key));
        }
        let (limiter_hashes, ban_hashes) = hashes.split_at(request.limiters.len());
        let mut locked = self.shards.lock(&hashes);
        let now = self.clock.now_us();

        verdict.blocked_us = self.blocked_for(request, ban_hashes, &mut locked, now);
        if verdict.blocked_us.is_some() {
            verdict.allowed = false;
            return;
        }

        let cost = request.cost;
        // Pushed, not resized: resizing goes through the general `extend`.
        for _ in 0..request.rule_count() {
            verdict.rules.push(RuleOutcome::default());
        }
        let out = &mut verdict.rules;
        let mut found = Found::new();
        let mut allowed = true;
        // Some shadow limiter would deny (it records nothing).
        let mut shadow_denied = false;
        let mut first = 0;
        for (l, &hash) in request.limiters.iter().zip(limiter_hashes) {
            let out = &mut out[first..first + l.rules.len()];
            first += l.rules.len();
            let (id, admits) = evaluate(
                locked.shard(hash),
                (hash, l.key_bytes()),
                l.rules,
                now,
                (cost, request.delay_us),
                out,
            );
            found.push((id, admits));
            shadow_denied |= l.shadow && !admits;
            allowed &= admits || l.shadow;
        }

        if !allowed || shadow_denied {
            // Nothing is recorded where a limiter would deny; nothing at all if an enforced one
            // does.
            let mut first = 0;
            for ((l, &hash), &(id, admits)) in
                request.limiters.iter().zip(limiter_hashes).zip(&found)
            {
                let out = &mut out[first..first + l.rules.len()];
                first += l.rules.len();
                if allowed && admits {
                    continue;
                }
                settle(locked.shard(hash), id, l.rules, (now, request.cost), out);
            }
        }
        if !allowed {
            verdict.allowed = false;
            if request.may_ban() {
                verdict.banned_us =
                    self.ban_offender(request, ban_hashes, &verdict.rules, &mut locked, now);
            }
            return;
        }

        if request.consume && cost > 0 {
            if found.iter().any(|(id, _)| id.is_none()) {
                self.make_room_for(limiter_hashes, &found, &mut locked, now);
            }
            let check_id = self.check_id(request);
            let mut first = 0;
            for ((l, &hash), &(id, admits)) in
                request.limiters.iter().zip(limiter_hashes).zip(&found)
            {
                let outcomes = &out[first..first + l.rules.len()];
                first += l.rules.len();
                // A shadow limiter that would deny records nothing.
                if admits {
                    record(
                        locked.shard(hash),
                        id,
                        (hash, l.key_bytes()),
                        l.rules,
                        outcomes,
                        now,
                        cost,
                        check_id,
                    );
                }
            }
            verdict.receipt = Some(if shadow_denied {
                let at = found.iter().map(
                    |&(_, admits)| {
                        if admits { now } else { Receipt::NOT_RECORDED }
                    },
                );
                Receipt::per_limiter(at, check_id, cost)
            } else {
                Receipt::new(now, check_id, cost)
            });
        }
        verdict.allowed = true;
    }

    /// The id of an admission: leases of concurrency limits are named by it (one atomic add,
    /// only for checks that take one); 0 otherwise.
    fn check_id(&self, request: &CheckRequest<'_>) -> u64 {
        if request.limiters.iter().any(LimiterRequest::is_concurrent) {
            self.next_id.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        }
    }

    /// Before anything is written: room in every shard for the limiter keys this admission
    /// creates, evicting where a shard is full. A shard whose every limiter key belongs to this
    /// check goes over its budget by those: a check always finds room.
    fn make_room_for(&self, hashes: &[u64], found: &Found, locked: &mut Locked<'_>, now: u64) {
        let new = || {
            hashes
                .iter()
                .zip(found)
                .filter(|(_, (id, _))| id.is_none())
                .map(|(&hash, _)| hash)
        };
        for (i, hash) in new().enumerate() {
            let shard_of = |h: u64| self.shards.shard_of(h);
            // Each shard once, for every new key it gets.
            if new().take(i).any(|h| shard_of(h) == shard_of(hash)) {
                continue;
            }
            let wanted = new().filter(|&h| shard_of(h) == shard_of(hash)).count();
            let keep: SmallVec<[SlotId; 4]> = hashes
                .iter()
                .zip(found)
                .filter(|(h, _)| shard_of(**h) == shard_of(hash))
                .filter_map(|(_, &(id, _))| id)
                .collect();
            self.make_room(locked.shard(hash), Kind::Counter, wanted, now, &keep);
        }
    }

    /// Makes room in `shard` for `wanted` new entries of `kind`, sparing the slots in `keep`;
    /// false if its budget stays full. An evicted limiter key at its limit is remembered as
    /// owing until its state would have ended.
    fn make_room(
        &self,
        shard: &mut Shard,
        kind: Kind,
        wanted: usize,
        now: u64,
        keep: &[SlotId],
    ) -> bool {
        let cap = self.budget.of(kind);
        while shard.usage().of(kind) + wanted > cap {
            let Some(evicted) = shard.evict_one(kind, now, keep) else {
                // The sample found nothing to drop: what has expired goes (a sweep of the
                // shard, at most once a second), then the budget is looked at again.
                if shard.sweep_due(now) {
                    shard.purge(now, keep);
                    continue;
                }
                return false;
            };
            let entry = evicted.entry;
            if kind == Kind::Counter {
                self.evictions.fetch_add(1, Ordering::Relaxed);
                if entry.limited && entry.expires_at > now {
                    shard.owe(evicted.hash, entry.expires_at, self.budget.counters);
                }
            }
        }
        true
    }

    fn reset(&self, request: &CheckRequest<'_>) {
        for limiter in request.limiters {
            let hash = self.shards.hash(limiter.key_bytes());
            let mut shard = self.shards.lock_one(hash);
            shard.remove(hash, limiter.key_bytes());
            // A key evicted at its limit is reset too.
            shard.forgive(hash);
        }
    }

    /// Renews a check's leases (see `RefundStore::extend`): all or none.
    fn extend(&self, request: &CheckRequest<'_>, receipt: &Receipt) -> Option<Receipt> {
        let hashes: SmallVec<[u64; 8]> = request
            .limiters
            .iter()
            .map(|l| self.shards.hash(l.key_bytes()))
            .collect();
        let mut locked = self.shards.lock(&hashes);
        let now = self.clock.now_us();
        let units = receipt.units();
        // First every limiter must still hold them; then they move.
        for (i, (limiter, &hash)) in request.limiters.iter().zip(&hashes).enumerate() {
            let Some(at) = receipt.at_us(i) else { continue };
            match locked.shard(hash).live(hash, limiter.key_bytes(), now) {
                Some(Entry {
                    state: State::Rules(states),
                    ..
                }) if states.holds(limiter.rules, now, at, units, receipt.id()) => {}
                _ => return None,
            }
        }
        let mut at_us: SmallVec<[u64; 4]> = SmallVec::new();
        for (i, (limiter, &hash)) in request.limiters.iter().zip(&hashes).enumerate() {
            let Some(at) = receipt.at_us(i) else {
                at_us.push(Receipt::NOT_RECORDED);
                continue;
            };
            if let Some(Entry {
                state: State::Rules(states),
                expires_at,
                ..
            }) = locked.shard(hash).live(hash, limiter.key_bytes(), now)
            {
                let until = states.renew(limiter.rules, now, at, units, receipt.id());
                *expires_at = (*expires_at).max(until);
            }
            at_us.push(now);
        }
        Some(Receipt::per_limiter(at_us, receipt.id(), units))
    }

    /// `f` over `request` with the limits of the overrides that apply to it (a check counts by
    /// them; a refund and a charge move GCRA's arrival time by their interval), each limit an
    /// override set into `limits` (rule place, limit).
    fn with_overrides<R>(
        &self,
        request: &CheckRequest<'_>,
        limits: &mut Vec<(usize, u64)>,
        f: impl FnOnce(&CheckRequest<'_>) -> R,
    ) -> R {
        if !self.overrides.may_apply(request) {
            return f(request);
        }
        self.overridden(request, limits, f)
    }

    /// [`with_overrides`](Self::with_overrides) once an override may apply.
    fn overridden<R>(
        &self,
        request: &CheckRequest<'_>,
        limits: &mut Vec<(usize, u64)>,
        f: impl FnOnce(&CheckRequest<'_>) -> R,
    ) -> R {
        let mut rules = Rules::new();
        let now = self.clock.now_us();
        if !self.overrides.apply(request, now, &mut rules, limits) {
            return f(request);
        }
        let limiters = overrides::over(request, &rules);
        f(&CheckRequest {
            limiters: &limiters,
            ..*request
        })
    }

    /// A charge (see `RefundStore::charge`), one limiter at a time.
    fn charge(&self, request: &CheckRequest<'_>) {
        for limiter in request.limiters.iter().filter(|l| !l.is_concurrent()) {
            let hash = self.shards.hash(limiter.key_bytes());
            let mut shard = self.shards.lock_one(hash);
            // Read under the lock, as a check's is: a charge that read the time before a
            // check of the next window took the lock would move the window back, its count
            // lost.
            let now = self.clock.now_us();
            match shard.live(hash, limiter.key_bytes(), now) {
                Some(Entry {
                    state: State::Rules(states),
                    expires_at,
                    limited,
                    ..
                }) => {
                    let until = states.charge(limiter.rules, now, request.cost);
                    *expires_at = (*expires_at).max(until);
                    *limited = true;
                }
                _ => {
                    let mut states = RuleStates::default();
                    let until = states.charge(limiter.rules, now, request.cost);
                    if let Some(owed) = shard.owed(hash, now) {
                        // Evicted at its limit: it stays denied, now for the debt's time too.
                        // An entry of the debt alone would hide the record and admit again.
                        let until = owed.saturating_add(until.saturating_sub(now));
                        shard.owe(hash, until, self.budget.counters);
                        continue;
                    }
                    self.make_room(&mut shard, Kind::Counter, 1, now, &[]);
                    let mut entry = Entry::new(State::Rules(states), until);
                    entry.limited = true;
                    shard.insert(hash, limiter.key_bytes(), entry);
                }
            }
        }
    }

    fn refund(&self, request: &CheckRequest<'_>, receipt: Option<&Receipt>) {
        let now = self.clock.now_us();
        for (i, limiter) in request.limiters.iter().enumerate() {
            let at = match receipt {
                Some(receipt) => match receipt.at_us(i) {
                    Some(at) => Some(at),
                    None => continue,
                },
                None => None,
            };
            let hash = self.shards.hash(limiter.key_bytes());
            let mut shard = self.shards.lock_one(hash);
            if let Some(Entry {
                state: State::Rules(states),
                expires_at,
                ..
            }) = shard.live(hash, limiter.key_bytes(), now)
            {
                if *expires_at > now {
                    states.refund(
                        limiter.rules,
                        now,
                        at,
                        request.cost,
                        receipt.map_or(0, Receipt::id),
                    );
                }
            }
        }
    }
}

/// The engine's default local fallback (see [`crate::LocalFallback`]): a memory store with the
/// default settings.
pub(crate) fn local_fallback() -> Box<dyn crate::LocalFallback> {
    Box::new(MemoryStore::new())
}

impl crate::LocalFallback for MemoryStore {
    fn check_local(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Result<(), StoreError> {
        self.inner.check(request, verdict)
    }
}

impl Store for MemoryStore {
    fn check(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send {
        std::future::ready(self.check_now(request))
    }

    #[inline]
    fn check_sync(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Option<Result<(), StoreError>> {
        Some(self.inner.check(request, verdict))
    }

    #[inline]
    fn check_limiter(
        &self,
        check: &LimiterCheck<'_>,
        outcomes: &mut [RuleOutcome],
    ) -> Option<LimiterAnswer> {
        self.inner.check_limiter(check, outcomes)
    }

    fn reset(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(request);
        std::future::ready(Ok(()))
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    #[inline]
    fn bans_possible(&self) -> bool {
        self.inner.bans_possible()
    }

    fn text_keys(&self) -> bool {
        false
    }
}

impl RefundStore for MemoryStore {
    fn refund(
        &self,
        request: &CheckRequest<'_>,
        receipt: Option<&Receipt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.with_overrides(request, &mut Vec::new(), |now| {
            let Some(receipt) = receipt else {
                return self.inner.refund(now, None);
            };
            // The limit the check counted by, unless the one in force now is higher (see
            // `RefundStore::refund`).
            let floored: Rules = (now.limiters.iter().zip(request.limiters))
                .flat_map(|(now, configured)| now.rules.iter().zip(configured.rules))
                .enumerate()
                .map(|(place, (now, configured))| {
                    let counted = receipt.counted_limit(place, configured.limit());
                    now.with_limit(now.limit().max(counted))
                })
                .collect();
            let limiters = overrides::over(now, &floored);
            let now = CheckRequest {
                limiters: &limiters,
                ..*now
            };
            self.inner.refund(&now, Some(receipt));
        });
        std::future::ready(Ok(()))
    }

    fn extend(
        &self,
        request: &CheckRequest<'_>,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<Option<Receipt>, StoreError>> + Send {
        std::future::ready(Ok(self.inner.extend(request, receipt)))
    }

    fn charge(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner
            .with_overrides(request, &mut Vec::new(), |r| self.inner.charge(r));
        std::future::ready(Ok(()))
    }
}

impl OverrideStore for MemoryStore {
    fn set_override(
        &self,
        limiter: &LimiterRequest<'_>,
        index: &str,
        entry: &Override,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<Override, StoreError>> + Send {
        let now = self.inner.clock.now_us();
        let mut entry = entry.clone();
        entry.expires_at_us = ttl.map(|ttl| now.saturating_add(micros(ttl)));
        let kept = entry.clone();
        std::future::ready(
            self.inner
                .overrides
                .set(limiter, (entry, index), now)
                .map(|()| kept),
        )
    }

    fn remove_override(
        &self,
        limiter: &LimiterRequest<'_>,
        _index: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let now = self.inner.clock.now_us();
        std::future::ready(Ok(self.inner.overrides.remove(limiter, now)))
    }

    fn overrides(
        &self,
        index: &str,
    ) -> impl Future<Output = Result<Vec<Override>, StoreError>> + Send {
        let now = self.inner.clock.now_us();
        std::future::ready(Ok(self.inner.overrides.list(index, now)))
    }

    fn overrides_page(
        &self,
        index: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> impl Future<Output = Result<OverridePage, StoreError>> + Send {
        let now = self.inner.clock.now_us();
        let page = self.inner.overrides.page(index, now, after, limit);
        std::future::ready(Ok(page))
    }
}

impl LockStore for MemoryStore {
    fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<LockReply, StoreError>> + Send {
        std::future::ready(self.inner.lock_acquire(key, token, fingerprint, ttl))
    }

    fn lock_release(
        &self,
        key: &str,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        std::future::ready(Ok(self.inner.lock_release(key, token)))
    }

    fn lock_complete(
        &self,
        key: &str,
        token: &str,
        response: &[u8],
        keep_for: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        std::future::ready(self.inner.lock_complete(key, token, response, keep_for))
    }
}

impl BanStore for MemoryStore {
    fn bans(&self, prefix: &str) -> impl Future<Output = Result<Vec<BanEntry>, StoreError>> + Send {
        std::future::ready(Ok(self.inner.bans(prefix)))
    }

    fn ban(
        &self,
        prefix: &str,
        target: &BanTarget,
        duration: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.ban(prefix, target, duration);
        std::future::ready(Ok(()))
    }

    fn unban(
        &self,
        prefix: &str,
        target: &BanTarget,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        std::future::ready(Ok(self.inner.unban(prefix, target)))
    }

    fn ban_count(&self, prefix: &str) -> impl Future<Output = Result<u64, StoreError>> + Send {
        std::future::ready(Ok(self.inner.ban_count(prefix)))
    }

    fn bans_page(
        &self,
        prefix: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> impl Future<Output = Result<BanPage, StoreError>> + Send {
        std::future::ready(Ok(self.inner.bans_page(prefix, after, limit)))
    }
}

#[cfg(test)]
mod tests;
