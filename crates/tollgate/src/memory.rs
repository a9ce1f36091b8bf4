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
    blocklist::{BanCursor, BanEntry, BanPage, BanRule, BanTarget},
    clock::{Clock, SystemClock},
    error::{StoreError, StoreErrorKind},
    rule::{Algorithm, Rule},
    store::{CheckPlan, HeldLock, LockReply, PlanBan, Store, Verdict},
};

type Hasher = foldhash::fast::RandomState;

/// An in-process store: exact and atomic within one process, nothing shared across processes.
///
/// Keys live in shards, each behind its own mutex; a limiter's key (one per identity) holds the
/// states of all its rules. A check locks the shards of all its keys in ascending order (so
/// concurrent checks cannot deadlock) and holds them while it evaluates and records, which
/// makes a multi-limiter check atomic.
///
/// Memory is bounded: an expired key is emptied when touched, and dropped by a background
/// sweep or when its shard is full. The key cap ([`MemoryStoreBuilder::max_keys`]) is split evenly over the
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
    Rules(RuleStates),
    Ban(BanState),
    Lock(LockState),
}

/// Every rule state under one limiter key: one entry, one look-up, whatever the rules.
#[derive(Default)]
struct RuleStates {
    /// The instants of admitted units, oldest first, shared by the sliding-log rules.
    log: VecDeque<u64>,
    /// One per fixed-window or GCRA rule.
    counters: Vec<Counter>,
}

/// The state of one fixed-window or GCRA rule.
struct Counter {
    rule: Rule,
    state: CounterState,
    /// The instant (µs) after which the counter holds nothing that counts.
    expires_at: u64,
}

#[derive(Clone, Copy)]
enum CounterState {
    Window(FixedWindowState),
    Tat(u64),
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

    /// Runs a check without a plan: `outcomes` gets one outcome per rule, limiters in order.
    /// The engine's path for policies that need no ban keys; allocates only for new keys.
    pub(crate) fn check_limiters(
        &self,
        limiters: &[LimiterRef<'_>],
        cost: u64,
        consume: bool,
        outcomes: &mut [RuleOutcome],
    ) -> Result<bool, StoreError> {
        let status = self
            .inner
            .check_limiters(limiters, (&[], &[]), cost, consume, outcomes)?;
        Ok(status.allowed)
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

/// The state of `rule` among a limiter's counters.
fn counter(counters: &[Counter], rule: &Rule) -> Option<CounterState> {
    counters.iter().find(|c| c.rule == *rule).map(|c| c.state)
}

/// The fixed window of `rule` among a limiter's counters.
fn window(counters: &[Counter], rule: &Rule) -> Option<FixedWindowState> {
    match counter(counters, rule) {
        Some(CounterState::Window(w)) => Some(w),
        _ => None,
    }
}

/// The theoretical arrival time of GCRA `rule` among a limiter's counters.
fn tat(counters: &[Counter], rule: &Rule) -> Option<u64> {
    match counter(counters, rule) {
        Some(CounterState::Tat(t)) => Some(t),
        _ => None,
    }
}

/// What `rule` says about `cost` more units at `now`, over a limiter's log and counters.
fn outcome(log: &[u64], counters: &[Counter], rule: &Rule, now: u64, cost: u64) -> RuleOutcome {
    match rule.algorithm() {
        Algorithm::SlidingLog => algorithm::sliding_log(log, now, rule, cost),
        Algorithm::FixedWindow => {
            algorithm::fixed_window(window(counters, rule), now, rule, cost).0
        }
        Algorithm::Gcra => algorithm::gcra(tat(counters, rule), now, rule, cost).0,
    }
}

impl RuleStates {
    /// The log as one slice (sorted, oldest first), and the counters.
    fn view(&mut self) -> (&[u64], &[Counter]) {
        let log = if self.log.is_empty() {
            &[]
        } else {
            &*self.log.make_contiguous()
        };
        (log, &self.counters)
    }

    /// Every rule's outcome into `out`; true if all admit.
    fn evaluate(&mut self, rules: &[Rule], now: u64, cost: u64, out: &mut [RuleOutcome]) -> bool {
        let (log, counters) = self.view();
        let mut allowed = true;
        for (o, rule) in out.iter_mut().zip(rules) {
            *o = outcome(log, counters, rule, now, cost);
            allowed &= o.allowed;
        }
        allowed
    }

    /// After a denial: the rules that would have admitted report the state as it stays, which
    /// is what they say for a cost of zero.
    fn settle(&mut self, rules: &[Rule], now: u64, out: &mut [RuleOutcome]) {
        let (log, counters) = self.view();
        for (o, rule) in out.iter_mut().zip(rules) {
            if o.allowed {
                *o = outcome(log, counters, rule, now, 0);
            }
        }
    }

    /// Records `cost` units that every rule admitted at `now`; returns until when the states
    /// count.
    fn record(&mut self, rules: &[Rule], now: u64, cost: u64) -> u64 {
        self.counters.retain(|c| c.expires_at > now);
        let mut expires_at = now;
        let log_window = rules
            .iter()
            .filter(|r| r.algorithm() == Algorithm::SlidingLog)
            .map(Rule::window_us)
            .max();
        if let Some(window) = log_window {
            if let Some(edge) = now.checked_sub(window) {
                while self.log.front().is_some_and(|&t| t <= edge) {
                    self.log.pop_front();
                }
            }
            if self.log.back().is_none_or(|&t| t <= now) {
                for _ in 0..cost {
                    self.log.push_back(now);
                }
            } else {
                // Keep the log sorted even if the clock stepped back.
                let at = self.log.partition_point(|&t| t <= now);
                for _ in 0..cost {
                    self.log.insert(at, now);
                }
            }
            expires_at = now + window;
        }
        for rule in rules {
            let (state, until) = match rule.algorithm() {
                Algorithm::SlidingLog => continue,
                Algorithm::FixedWindow => {
                    let state = window(&self.counters, rule);
                    let (_, next) = algorithm::fixed_window(state, now, rule, cost);
                    let Some(next) = next else { continue };
                    (CounterState::Window(next), next.start + rule.window_us())
                }
                Algorithm::Gcra => {
                    let (_, next) = algorithm::gcra(tat(&self.counters, rule), now, rule, cost);
                    let Some(next) = next else { continue };
                    (CounterState::Tat(next), next)
                }
            };
            match self.counters.iter_mut().find(|c| c.rule == *rule) {
                Some(c) => {
                    c.state = state;
                    c.expires_at = until;
                }
                None => self.counters.push(Counter {
                    rule: *rule,
                    state,
                    expires_at: until,
                }),
            }
            expires_at = expires_at.max(until);
        }
        expires_at
    }
}

/// One limiter of a check as the store sees it: its base key and rules.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LimiterRef<'a> {
    pub(crate) key: &'a str,
    pub(crate) rules: &'a [Rule],
}

/// What a check decided, beside the rule outcomes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Status {
    pub(crate) allowed: bool,
    pub(crate) blocked_us: Option<u64>,
    pub(crate) banned_us: Option<u64>,
}

/// The shards one check holds, locked in ascending order so that no two checks wait on each
/// other.
enum Locked<'a> {
    One(MutexGuard<'a, Shard>),
    Many {
        inner: &'a Inner,
        order: Vec<usize>,
        guards: Vec<MutexGuard<'a, Shard>>,
    },
}

impl Locked<'_> {
    /// Index of the guard holding `key`.
    fn index(&self, key: &str) -> usize {
        match self {
            Locked::One(_) => 0,
            Locked::Many { inner, order, .. } => {
                order.binary_search(&inner.shard_of(key)).unwrap_or(0)
            }
        }
    }

    fn guard(&mut self, index: usize) -> &mut Shard {
        match self {
            Locked::One(guard) => guard,
            Locked::Many { guards, .. } => &mut guards[index],
        }
    }

    fn shard(&mut self, key: &str) -> &mut Shard {
        let index = self.index(key);
        self.guard(index)
    }

    fn len(&self) -> usize {
        match self {
            Locked::One(_) => 1,
            Locked::Many { guards, .. } => guards.len(),
        }
    }

    /// The rule states under `key` and their expiry; an expired entry is emptied, keeping its
    /// allocations.
    fn rules(&mut self, key: &str, now: u64) -> Option<(&mut RuleStates, &mut u64)> {
        let entry = self.shard(key).map.get_mut(key)?;
        let State::Rules(states) = &mut entry.state else {
            return None;
        };
        if entry.expires_at <= now {
            states.log.clear();
            states.counters.clear();
        }
        Some((states, &mut entry.expires_at))
    }
}

impl Inner {
    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % self.shards.len()
    }

    /// Whether a ban may be live now (false until a ban was ever written, without a clock read).
    fn bans_possible(&self) -> bool {
        let horizon = self.ban_horizon.load(Ordering::Acquire);
        horizon != 0 && self.clock.now_us() < horizon
    }

    fn lock<'k>(&self, keys: impl Iterator<Item = &'k str> + Clone) -> Locked<'_> {
        let mut shards = keys.clone().map(|k| self.shard_of(k));
        if let Some(first) = shards.next() {
            if shards.all(|s| s == first) {
                return Locked::One(self.shards[first].lock());
            }
        }
        let mut order: Vec<usize> = keys.map(|k| self.shard_of(k)).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| self.shards[i].lock()).collect();
        Locked::Many {
            inner: self,
            order,
            guards,
        }
    }

    fn check(&self, plan: &CheckPlan) -> Result<Verdict, StoreError> {
        let limiters: Vec<LimiterRef<'_>> = plan
            .limiters
            .iter()
            .map(|l| LimiterRef {
                key: &l.key,
                rules: &l.rules,
            })
            .collect();
        let ban_rules: Vec<Option<BanRule>> = if plan.bans.is_empty() {
            Vec::new()
        } else {
            plan.limiters.iter().map(|l| l.ban).collect()
        };
        let mut outcomes = vec![RuleOutcome::default(); plan.rule_count()];
        let status = self.check_limiters(
            &limiters,
            (&plan.bans, &ban_rules),
            plan.cost,
            plan.consume,
            &mut outcomes,
        )?;
        Ok(match status.blocked_us {
            Some(left) => Verdict::blocked(left),
            None => {
                let mut verdict = Verdict::new(status.allowed, outcomes);
                verdict.banned_us = status.banned_us;
                verdict
            }
        })
    }

    /// One atomic check (see [`CheckPlan`]): `out` gets one outcome per rule, limiters in
    /// order, unless the identity is blocked. `bans` holds the identity's ban keys and each
    /// limiter's ban rule.
    fn check_limiters(
        &self,
        limiters: &[LimiterRef<'_>],
        (bans, ban_rules): (&[PlanBan], &[Option<BanRule>]),
        cost: u64,
        consume: bool,
        out: &mut [RuleOutcome],
    ) -> Result<Status, StoreError> {
        let may_ban = consume && !bans.is_empty() && ban_rules.iter().any(Option::is_some);
        // Ban keys are locked with the rest only when a ban may be live or may be written:
        // without bans a check touches nothing but its own limiters' keys.
        let bans = if !bans.is_empty() && (may_ban || self.bans_possible()) {
            bans
        } else {
            &[]
        };
        let keys = limiters
            .iter()
            .map(|l| l.key)
            .chain(bans.iter().map(|b| b.key.as_str()));
        let mut locked = self.lock(keys);
        let now = self.clock.now_us();

        let blocked = bans
            .iter()
            .filter_map(|b| match locked.shard(&b.key).live(&b.key, now) {
                Some(Entry {
                    state: State::Ban(ban),
                    ..
                }) if ban.until > now => Some(ban.until - now),
                _ => None,
            })
            .max();
        if let Some(left) = blocked {
            return Ok(Status {
                blocked_us: Some(left),
                ..Status::default()
            });
        }

        let record = consume && cost > 0;
        let mut allowed = true;
        // Keys this check would create, and whether the last limiter was settled (denied) or
        // recorded (admitted) in place, while its state was at hand.
        let mut missing = 0;
        let mut done_last = false;
        let mut first = 0;
        for (i, l) in limiters.iter().enumerate() {
            let out = &mut out[first..first + l.rules.len()];
            first += l.rules.len();
            let Some((states, expires_at)) = locked.rules(l.key, now) else {
                missing += 1;
                allowed &= RuleStates::default().evaluate(l.rules, now, cost, out);
                continue;
            };
            allowed &= states.evaluate(l.rules, now, cost, out);
            if i + 1 == limiters.len() {
                if !allowed {
                    states.settle(l.rules, now, out);
                    done_last = true;
                } else if record && missing == 0 {
                    let until = states.record(l.rules, now, cost);
                    *expires_at = (*expires_at).max(until);
                    done_last = true;
                }
            }
        }
        let pending = &limiters[..limiters.len() - usize::from(done_last)];

        if !allowed {
            // Nothing is recorded.
            let mut first = 0;
            for l in pending {
                let out = &mut out[first..first + l.rules.len()];
                first += l.rules.len();
                match locked.rules(l.key, now) {
                    Some((states, _)) => states.settle(l.rules, now, out),
                    None => RuleStates::default().settle(l.rules, now, out),
                }
            }
            let banned_us = if may_ban {
                self.ban_offender(limiters, (bans, ban_rules), out, &mut locked, now)
            } else {
                None
            };
            return Ok(Status {
                allowed,
                blocked_us: None,
                banned_us,
            });
        }
        if record && !pending.is_empty() {
            if missing > 0 {
                self.make_room(&mut locked, pending, now)?;
            }
            for l in pending {
                if let Some((states, expires_at)) = locked.rules(l.key, now) {
                    let until = states.record(l.rules, now, cost);
                    *expires_at = (*expires_at).max(until);
                    continue;
                }
                let mut states = RuleStates::default();
                let expires_at = states.record(l.rules, now, cost);
                let entry = Entry {
                    state: State::Rules(states),
                    expires_at,
                };
                locked.shard(l.key).map.insert(l.key.into(), entry);
            }
        }
        Ok(Status {
            allowed,
            ..Status::default()
        })
    }

    /// Checks, before anything is written, that every shard has room for the keys this
    /// admission creates.
    fn make_room(
        &self,
        locked: &mut Locked<'_>,
        limiters: &[LimiterRef<'_>],
        now: u64,
    ) -> Result<(), StoreError> {
        let mut wanted = vec![0usize; locked.len()];
        for l in limiters {
            let i = locked.index(l.key);
            if locked.guard(i).live(l.key, now).is_none() {
                wanted[i] += 1;
            }
        }
        for (i, wanted) in wanted.into_iter().enumerate() {
            let shard = locked.guard(i);
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
        Ok(())
    }

    /// Bans every target of the check after a denial by a limiter with a ban rule; returns the
    /// longest ban written.
    fn ban_offender(
        &self,
        limiters: &[LimiterRef<'_>],
        (bans, ban_rules): (&[PlanBan], &[Option<BanRule>]),
        outcomes: &[RuleOutcome],
        locked: &mut Locked<'_>,
        now: u64,
    ) -> Option<u64> {
        let mut first = 0;
        let mut rules = Vec::new();
        for (limiter, ban) in limiters.iter().zip(ban_rules) {
            let mine = &outcomes[first..first + limiter.rules.len()];
            first += limiter.rules.len();
            if let Some(rule) = *ban {
                if mine.iter().any(|o| !o.allowed) {
                    rules.push(rule);
                }
            }
        }
        if rules.is_empty() {
            return None;
        }
        let mut longest = None;
        for ban in bans {
            let shard = locked.shard(&ban.key);
            let strikes = match shard.live(&ban.key, now) {
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
            shard.map.insert(ban.key.as_str().into(), entry);
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
            self.shards[self.shard_of(&limiter.key)]
                .lock()
                .map
                .remove(limiter.key.as_str());
        }
    }
}

/// Counting and paging the blocklist.
impl Inner {
    /// Calls `f` with the key and state of every ban under `prefix` that has not ended.
    fn each_live_ban(&self, prefix: &str, now: u64, mut f: impl FnMut(&str, &BanState)) {
        let ban_keys = format!("{prefix}:{{ban}}:");
        for shard in self.shards.iter() {
            for (key, entry) in &shard.lock().map {
                if let State::Ban(ban) = &entry.state {
                    if ban.until > now && key.starts_with(&ban_keys) {
                        f(key, ban);
                    }
                }
            }
        }
    }

    /// No ban ever written is still live: nothing to walk.
    fn no_live_ban(&self, now: u64) -> bool {
        self.ban_horizon.load(Ordering::Acquire) <= now
    }

    fn ban_count(&self, prefix: &str) -> u64 {
        let now = self.clock.now_us();
        let mut count = 0;
        if !self.no_live_ban(now) {
            self.each_live_ban(prefix, now, |_, _| count += 1);
        }
        count
    }

    /// The page after `after`, in the order bans end, then by key (as the Redis index).
    fn bans_page(&self, prefix: &str, after: Option<&BanCursor>, limit: usize) -> BanPage {
        let limit = limit.max(1);
        let now = self.clock.now_us();
        let mut found: Vec<(BanCursor, BanEntry)> = Vec::new();
        if !self.no_live_ban(now) {
            self.each_live_ban(prefix, now, |key, ban| {
                let at = BanCursor::new(ban.until, key);
                if after.is_none_or(|a| at > *a) {
                    found.push((
                        at,
                        BanEntry {
                            target: ban.target.clone(),
                            expires_in: Duration::from_micros(ban.until - now),
                            strikes: ban.strikes,
                        },
                    ));
                }
            });
        }
        let more = found.len() > limit;
        if more {
            found.select_nth_unstable_by(limit - 1, |a, b| a.0.cmp(&b.0));
        }
        found.truncate(limit);
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let next = more
            .then(|| found.last().map(|(at, _)| at.clone()))
            .flatten();
        BanPage {
            bans: found.into_iter().map(|(_, ban)| ban).collect(),
            next,
        }
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
        self.inner.bans_possible()
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

    fn ban_count(&self, prefix: &str) -> impl Future<Output = Result<u64, StoreError>> + Send {
        std::future::ready(Ok(self.inner.ban_count(prefix)))
    }

    fn bans_page(
        &self,
        prefix: &str,
        after: Option<&BanCursor>,
        limit: usize,
    ) -> impl Future<Output = Result<BanPage, StoreError>> + Send {
        std::future::ready(Ok(self.inner.bans_page(prefix, after, limit)))
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
    fn one_key_holds_every_rule_of_a_limiter() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .purge_interval(None)
            .build();
        let rules: Arc<[Rule]> = [
            "2/1s".parse::<Rule>().unwrap(),
            "3/1s".parse::<Rule>().unwrap(),
            "2/1s"
                .parse::<Rule>()
                .unwrap()
                .with_algorithm(Algorithm::Gcra),
            "2/1s"
                .parse::<Rule>()
                .unwrap()
                .with_algorithm(Algorithm::FixedWindow),
        ]
        .into();
        let limiter = PlanLimiter {
            key: "k".into(),
            rules,
            ban: None,
        };
        let plan = CheckPlan::new(1, true, vec![limiter]);
        assert!(store.check_now(&plan).unwrap().allowed);
        assert!(store.check_now(&plan).unwrap().allowed);
        assert_eq!(store.len(), 1);
        let denied = store.check_now(&plan).unwrap();
        assert!(!denied.allowed);
        assert_eq!(
            denied.rules.iter().map(|o| o.remaining).collect::<Vec<_>>(),
            [0, 1, 0, 0]
        );
        // Once everything expired, the entry starts over (and is reused, not added).
        clock.advance(Duration::from_secs(2));
        let again = store.check_now(&plan).unwrap();
        assert!(again.allowed);
        assert_eq!(
            again.rules.iter().map(|o| o.remaining).collect::<Vec<_>>(),
            [1, 2, 1, 1]
        );
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
