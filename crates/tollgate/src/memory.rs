//! The embedded store: sharded maps in this process.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    future::Future,
    hash::BuildHasher,
    sync::{
        Arc, Weak,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use parking_lot::{Mutex, MutexGuard};

use crate::{
    algorithm::{self, FixedWindowState, RuleOutcome},
    blocklist::{BanEntry, BanTarget},
    clock::{Clock, SystemClock},
    error::{StoreError, StoreErrorKind},
    rule::Algorithm,
    store::{CheckPlan, HeldLock, LockReply, Store, Verdict},
};

type Hasher = foldhash::fast::RandomState;

/// An in-process store: exact and atomic within one process, nothing shared across processes.
///
/// Keys live in shards, each behind its own mutex; a check locks the shards of all its keys in
/// ascending order (so concurrent checks cannot deadlock) and holds them while it evaluates and
/// records, which makes a multi-limiter check atomic.
///
/// Memory is bounded: expired keys are dropped when touched, by a background sweep, and when a
/// shard is full. The key cap ([`MemoryStoreBuilder::max_keys`]) is split evenly over the
/// shards; a check that needs a new key in a shard that is still full after dropping expired
/// keys fails with a [`StoreError`] whose [`is_capacity`](StoreError::is_capacity) is true,
/// and the engine answers it with the policy's `on_error`. Live keys are never evicted: that
/// would forget admissions and over-admit.
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
    shards: Box<[Mutex<Shard>]>,
    hasher: Hasher,
    clock: Arc<dyn Clock>,
    max_keys_per_shard: usize,
    /// The latest end of any ban ever written: before it, checks must look at ban keys.
    ban_horizon: AtomicU64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Box<str>, Entry, Hasher>,
}

struct Entry {
    state: State,
    /// The instant (µs) after which the entry holds nothing that counts.
    expires_at: u64,
}

enum State {
    Log(VecDeque<u64>),
    Window(FixedWindowState),
    Tat(u64),
    Ban(BanState),
    Lock(LockState),
}

struct BanState {
    target: BanTarget,
    until: u64,
    strikes: u32,
}

struct LockState {
    token: String,
    fingerprint: String,
    completed: bool,
    response: Option<Vec<u8>>,
}

impl MemoryStore {
    /// A store with the system clock and default limits (64 shards, one million keys,
    /// a sweep every 5 seconds).
    pub fn new() -> MemoryStore {
        MemoryStore::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            clock: Arc::new(SystemClock),
            shards: 64,
            max_keys: 1_000_000,
            purge_interval: Some(Duration::from_secs(5)),
        }
    }

    /// The number of keys held, expired ones included until they are swept.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// The store holds no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired key now (the background sweep does this periodically).
    pub fn purge_expired(&self) {
        let now = self.inner.clock.now_us();
        for shard in self.inner.shards.iter() {
            shard.lock().purge(now);
        }
    }

    /// Runs a check synchronously; [`Store::check`] is this, wrapped in a ready future.
    pub fn check_now(&self, plan: &CheckPlan) -> Result<Verdict, StoreError> {
        self.inner.check(plan)
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
            .field("shards", &self.inner.shards.len())
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

/// Configures a [`MemoryStore`].
#[must_use]
pub struct MemoryStoreBuilder {
    clock: Arc<dyn Clock>,
    shards: usize,
    max_keys: usize,
    purge_interval: Option<Duration>,
}

impl MemoryStoreBuilder {
    /// The clock (default: the system clock). Tests pass a [`ManualClock`](crate::ManualClock).
    pub fn clock(mut self, clock: impl Clock) -> MemoryStoreBuilder {
        self.clock = Arc::new(clock);
        self
    }

    /// Number of shards (default 64; at least 1).
    pub fn shards(mut self, shards: usize) -> MemoryStoreBuilder {
        self.shards = shards.max(1);
        self
    }

    /// The most keys the store holds (default one million), split evenly over the shards.
    pub fn max_keys(mut self, max_keys: usize) -> MemoryStoreBuilder {
        self.max_keys = max_keys;
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
            shards: (0..self.shards).map(|_| Mutex::default()).collect(),
            hasher: Hasher::default(),
            clock: self.clock,
            max_keys_per_shard: (self.max_keys / self.shards).max(1),
            ban_horizon: AtomicU64::new(0),
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
                    shard.lock().purge(now);
                }
            }
        });
}

impl Shard {
    fn purge(&mut self, now: u64) {
        self.map.retain(|_, e| e.expires_at > now);
    }

    fn live(&mut self, key: &str, now: u64) -> Option<&mut Entry> {
        self.map.get_mut(key).filter(|e| e.expires_at > now)
    }
}

/// A state key of the plan and where it lives.
struct Slot {
    key: String,
    shard: usize,
}

/// The slots of one check and the shards it holds locked.
struct Locked<'a> {
    slots: &'a [Slot],
    order: &'a [usize],
}

/// A state to write on admission: slot index, new state, expiry.
type Update = (usize, State, u64);

impl Locked<'_> {
    /// Index into the guards of the shard `shard`.
    fn guard(&self, shard: usize) -> usize {
        self.order.binary_search(&shard).unwrap_or(0)
    }

    /// Every rule of the plan against one instant, and the states an admission would write.
    fn evaluate(
        &self,
        guards: &mut [MutexGuard<'_, Shard>],
        plan: &CheckPlan,
        now: u64,
        cost: u64,
    ) -> (Vec<RuleOutcome>, Vec<Update>) {
        let mut outcomes = Vec::with_capacity(plan.rule_count());
        let mut updates = Vec::new();
        let mut next_slot = 0;
        for limiter in &plan.limiters {
            let log_slot = limiter.log_window_us().map(|_| {
                next_slot += 1;
                next_slot - 1
            });
            for rule in limiter.rules.iter() {
                let outcome = match rule.algorithm() {
                    Algorithm::SlidingLog => {
                        let s = &self.slots[log_slot.unwrap_or(next_slot)];
                        match guards[self.guard(s.shard)].live(&s.key, now) {
                            Some(Entry {
                                state: State::Log(log),
                                ..
                            }) => algorithm::sliding_log(log.make_contiguous(), now, rule, cost),
                            _ => algorithm::sliding_log(&[], now, rule, cost),
                        }
                    }
                    Algorithm::FixedWindow => {
                        let i = next_slot;
                        next_slot += 1;
                        let s = &self.slots[i];
                        let state = match guards[self.guard(s.shard)].live(&s.key, now) {
                            Some(Entry {
                                state: State::Window(w),
                                ..
                            }) => Some(*w),
                            _ => None,
                        };
                        let (outcome, next) = algorithm::fixed_window(state, now, rule, cost);
                        if let Some(next) = next {
                            updates.push((i, State::Window(next), next.start + rule.window_us()));
                        }
                        outcome
                    }
                    Algorithm::Gcra => {
                        let i = next_slot;
                        next_slot += 1;
                        let s = &self.slots[i];
                        let tat = match guards[self.guard(s.shard)].live(&s.key, now) {
                            Some(Entry {
                                state: State::Tat(t),
                                ..
                            }) => Some(*t),
                            _ => None,
                        };
                        let (outcome, next) = algorithm::gcra(tat, now, rule, cost);
                        if let Some(next) = next {
                            updates.push((i, State::Tat(next), next));
                        }
                        outcome
                    }
                };
                outcomes.push(outcome);
            }
        }
        (outcomes, updates)
    }
}

impl Inner {
    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % self.shards.len()
    }

    fn check(&self, plan: &CheckPlan) -> Result<Verdict, StoreError> {
        // Every state key of the plan, limiter by limiter, in `PlanLimiter::state_keys` order.
        let slots: Vec<Slot> = plan
            .limiters
            .iter()
            .flat_map(|l| l.state_keys())
            .map(|key| Slot {
                shard: self.shard_of(&key),
                key,
            })
            .collect();
        // Ban keys are locked with the rest only when a ban may be live or may be written:
        // without bans a check touches nothing but its own counters.
        let check_bans = !plan.bans.is_empty()
            && (plan.may_ban() || self.clock.now_us() < self.ban_horizon.load(Ordering::Acquire));
        let ban_slots: Vec<Slot> = if check_bans {
            plan.bans
                .iter()
                .map(|b| Slot {
                    shard: self.shard_of(&b.key),
                    key: b.key.clone(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut order: Vec<usize> = slots.iter().chain(&ban_slots).map(|s| s.shard).collect();
        order.sort_unstable();
        order.dedup();
        // Locked in ascending order, so no two checks can wait on each other.
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| self.shards[i].lock()).collect();
        let locked = Locked {
            slots: &slots,
            order: &order,
        };
        let now = self.clock.now_us();

        let blocked = ban_slots
            .iter()
            .filter_map(|s| match guards[locked.guard(s.shard)].live(&s.key, now) {
                Some(Entry {
                    state: State::Ban(ban),
                    ..
                }) if ban.until > now => Some(ban.until - now),
                _ => None,
            })
            .max();
        if let Some(left) = blocked {
            return Ok(Verdict::blocked(left));
        }

        let (mut outcomes, updates) = locked.evaluate(&mut guards, plan, now, plan.cost);
        let allowed = outcomes.iter().all(|o| o.allowed);
        if !allowed {
            // Nothing is recorded: the rules that would have admitted report the state as it
            // stays, which is what they say for a cost of zero.
            let (unchanged, _) = locked.evaluate(&mut guards, plan, now, 0);
            for (outcome, now_state) in outcomes.iter_mut().zip(unchanged) {
                if outcome.allowed {
                    *outcome = now_state;
                }
            }
        }
        if !allowed && plan.may_ban() {
            let mut verdict = Verdict::new(false, outcomes);
            verdict.banned_us =
                self.ban_offender(plan, &verdict.rules, &ban_slots, &locked, &mut guards, now);
            return Ok(verdict);
        }
        if !(allowed && plan.consume && plan.cost > 0) {
            return Ok(Verdict::new(allowed, outcomes));
        }

        // Room for the keys this admission creates, before anything is written.
        let mut wanted = vec![0usize; order.len()];
        for s in &slots {
            let g = locked.guard(s.shard);
            if guards[g].live(&s.key, now).is_none() {
                wanted[g] += 1;
            }
        }
        for (shard, wanted) in guards.iter_mut().zip(wanted) {
            if wanted > 0 && shard.map.len() + wanted > self.max_keys_per_shard {
                shard.purge(now);
                if shard.map.len() + wanted > self.max_keys_per_shard {
                    return Err(StoreError::new(
                        StoreErrorKind::Capacity,
                        format!(
                            "memory store shard holds {} keys, its cap is {}",
                            shard.map.len(),
                            self.max_keys_per_shard
                        ),
                    ));
                }
            }
        }

        // Record the admission everywhere.
        let mut first = 0;
        for limiter in &plan.limiters {
            if let Some(window) = limiter.log_window_us() {
                let s = &slots[first];
                record_log(
                    &mut guards[locked.guard(s.shard)],
                    &s.key,
                    now,
                    window,
                    plan.cost,
                );
            }
            first += limiter.state_keys_len();
        }
        for (i, state, expires_at) in updates {
            let s = &slots[i];
            let shard = &mut guards[locked.guard(s.shard)];
            match shard.map.get_mut(s.key.as_str()) {
                Some(entry) => *entry = Entry { state, expires_at },
                None => {
                    shard
                        .map
                        .insert(s.key.as_str().into(), Entry { state, expires_at });
                }
            }
        }
        Ok(Verdict::new(allowed, outcomes))
    }

    /// Bans every target of the plan after a denial by a limiter with a ban rule; returns the
    /// longest ban written.
    fn ban_offender(
        &self,
        plan: &CheckPlan,
        outcomes: &[RuleOutcome],
        ban_slots: &[Slot],
        locked: &Locked<'_>,
        guards: &mut [MutexGuard<'_, Shard>],
        now: u64,
    ) -> Option<u64> {
        let mut first = 0;
        let mut rules = Vec::new();
        for limiter in &plan.limiters {
            let mine = &outcomes[first..first + limiter.rules.len()];
            first += limiter.rules.len();
            if let Some(rule) = limiter.ban {
                if mine.iter().any(|o| !o.allowed) {
                    rules.push(rule);
                }
            }
        }
        if rules.is_empty() {
            return None;
        }
        let mut longest = None;
        for (slot, ban) in ban_slots.iter().zip(&plan.bans) {
            let shard = &mut guards[locked.guard(slot.shard)];
            let strikes = match shard.live(&slot.key, now) {
                Some(Entry {
                    state: State::Ban(b),
                    ..
                }) => b.strikes + 1,
                _ => 1,
            };
            let duration = rules
                .iter()
                .map(|r| r.duration_for(strikes))
                .max()
                .unwrap_or_default();
            let memory = rules.iter().map(|r| r.memory()).max().unwrap_or_default();
            let until = now + duration.as_micros() as u64;
            let entry = Entry {
                state: State::Ban(BanState {
                    target: ban.target.clone(),
                    until,
                    strikes,
                }),
                expires_at: until + memory.as_micros() as u64,
            };
            // Bans are written even past the key cap: forgetting an offender is worse.
            shard.map.insert(slot.key.as_str().into(), entry);
            self.ban_horizon.fetch_max(until, Ordering::AcqRel);
            longest = longest.max(Some(until - now));
        }
        longest
    }

    fn with_shard<T>(&self, key: &str, f: impl FnOnce(&mut Shard, u64) -> T) -> T {
        let mut shard = self.shards[self.shard_of(key)].lock();
        let now = self.clock.now_us();
        f(&mut shard, now)
    }

    fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<LockReply, StoreError> {
        self.with_shard(key, |shard, now| {
            if let Some(Entry {
                state: State::Lock(lock),
                expires_at,
            }) = shard.live(key, now)
            {
                return Ok(LockReply::Held(HeldLock {
                    completed: lock.completed,
                    ttl_left_us: *expires_at - now,
                    fingerprint: lock.fingerprint.clone(),
                    response: lock.response.clone(),
                }));
            }
            if !shard.map.contains_key(key) && shard.map.len() >= self.max_keys_per_shard {
                shard.purge(now);
                if shard.map.len() >= self.max_keys_per_shard {
                    return Err(StoreError::new(
                        StoreErrorKind::Capacity,
                        "memory store shard is full",
                    ));
                }
            }
            let entry = Entry {
                state: State::Lock(LockState {
                    token: token.to_owned(),
                    fingerprint: fingerprint.to_owned(),
                    completed: false,
                    response: None,
                }),
                expires_at: now + ttl.as_micros() as u64,
            };
            shard.map.insert(key.into(), entry);
            Ok(LockReply::Acquired)
        })
    }

    fn lock_release(&self, key: &str, token: &str) -> bool {
        self.with_shard(key, |shard, now| {
            let holds = matches!(
                shard.live(key, now),
                Some(Entry { state: State::Lock(lock), .. }) if lock.token == token
            );
            if holds {
                shard.map.remove(key);
            }
            holds
        })
    }

    fn lock_complete(&self, key: &str, token: &str, response: &[u8], keep_for: Duration) -> bool {
        self.with_shard(key, |shard, now| match shard.live(key, now) {
            Some(Entry {
                state: State::Lock(lock),
                expires_at,
            }) if lock.token == token && !lock.completed => {
                lock.completed = true;
                lock.response = Some(response.to_vec());
                *expires_at = now + keep_for.as_micros() as u64;
                true
            }
            _ => false,
        })
    }

    fn bans(&self, prefix: &str) -> Vec<BanEntry> {
        let now = self.clock.now_us();
        let mut bans = Vec::new();
        let ban_keys = format!("{prefix}:{{ban}}:");
        for shard in self.shards.iter() {
            for (key, entry) in &shard.lock().map {
                if let State::Ban(ban) = &entry.state {
                    if ban.until > now && key.starts_with(&ban_keys) {
                        bans.push(BanEntry {
                            target: ban.target.clone(),
                            expires_in: Duration::from_micros(ban.until - now),
                            strikes: ban.strikes,
                        });
                    }
                }
            }
        }
        bans.sort_by(|a, b| a.target.cmp(&b.target));
        bans
    }

    fn ban(&self, prefix: &str, target: &BanTarget, duration: Duration) {
        let key = target.key(prefix);
        self.with_shard(&key, |shard, now| {
            let until = now + duration.as_micros() as u64;
            let (strikes, expires_at) = match shard.live(&key, now) {
                Some(Entry {
                    state: State::Ban(b),
                    expires_at,
                }) => (b.strikes, (*expires_at).max(until)),
                _ => (1, until),
            };
            let state = State::Ban(BanState {
                target: target.clone(),
                until,
                strikes,
            });
            shard
                .map
                .insert(key.as_str().into(), Entry { state, expires_at });
            self.ban_horizon.fetch_max(until, Ordering::AcqRel);
        });
    }

    fn unban(&self, prefix: &str, target: &BanTarget) -> bool {
        let key = target.key(prefix);
        self.with_shard(&key, |shard, now| match shard.map.get(key.as_str()) {
            Some(Entry {
                state: State::Ban(b),
                ..
            }) => {
                let active = b.until > now;
                shard.map.remove(key.as_str());
                active
            }
            _ => false,
        })
    }

    fn reset(&self, plan: &CheckPlan) {
        for limiter in &plan.limiters {
            for key in limiter.state_keys() {
                self.shards[self.shard_of(&key)]
                    .lock()
                    .map
                    .remove(key.as_str());
            }
        }
    }
}

fn record_log(shard: &mut Shard, key: &str, now: u64, window: u64, cost: u64) {
    let expires_at = now + window;
    let entry = match shard.map.get_mut(key) {
        Some(entry) => entry,
        None => shard.map.entry(key.into()).or_insert(Entry {
            state: State::Log(VecDeque::new()),
            expires_at,
        }),
    };
    if !matches!(entry.state, State::Log(_)) {
        entry.state = State::Log(VecDeque::new());
    }
    entry.expires_at = entry.expires_at.max(expires_at);
    let State::Log(log) = &mut entry.state else {
        return;
    };
    if let Some(edge) = now.checked_sub(window) {
        let old = log.partition_point(|&t| t <= edge);
        log.drain(..old);
    }
    // Keep the log sorted even if the clock stepped back.
    let at = log.partition_point(|&t| t <= now);
    for _ in 0..cost {
        log.insert(at, now);
    }
}

impl Store for MemoryStore {
    fn check(&self, plan: &CheckPlan) -> impl Future<Output = Result<Verdict, StoreError>> + Send {
        std::future::ready(self.inner.check(plan))
    }

    fn reset(&self, plan: &CheckPlan) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(plan);
        std::future::ready(Ok(()))
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    fn bans_possible(&self) -> bool {
        self.inner.clock.now_us() < self.inner.ban_horizon.load(Ordering::Acquire)
    }

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
        std::future::ready(Ok(self.inner.lock_complete(key, token, response, keep_for)))
    }

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, key, rule::Rule, store::PlanLimiter};

    fn plan(base: &str, rules: &[&str], cost: u64) -> CheckPlan {
        let rules: Arc<[Rule]> = rules.iter().map(|r| r.parse().unwrap()).collect();
        CheckPlan::new(
            cost,
            true,
            vec![PlanLimiter {
                key: base.into(),
                rules,
                ban: None,
            }],
        )
    }

    #[test]
    fn full_shard_refuses_new_keys_but_serves_old_ones() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(1)
            .max_keys(2)
            .purge_interval(None)
            .build();
        assert!(store.check_now(&plan("a", &["5/1s"], 1)).unwrap().allowed);
        assert!(store.check_now(&plan("b", &["5/1s"], 1)).unwrap().allowed);
        let err = store.check_now(&plan("c", &["5/1s"], 1)).unwrap_err();
        assert!(err.is_capacity(), "{err}");
        assert!(store.check_now(&plan("a", &["5/1s"], 1)).unwrap().allowed);
        // Once the old keys expire, the shard makes room.
        clock.advance(Duration::from_secs(2));
        assert!(store.check_now(&plan("c", &["5/1s"], 1)).unwrap().allowed);
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
            store
                .check_now(&plan(&format!("k{i}"), &["5/1s", "2/1s"], 1))
                .unwrap();
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
        store.check_now(&plan("k", &["5/1s"], 1)).unwrap();
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
                store
                    .inner
                    .shard_of(&key::limiter_key("tg", "s", "ip", &i.to_string()))
            })
            .collect();
        assert!(shards.len() > 32, "{}", shards.len());
    }
}
