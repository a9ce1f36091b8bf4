//! Quota leases (see [`tollgate::QuotaLease`]): units of a busy identity's limits taken from
//! Redis in advance, with one ordinary check of their number, and spent here without a call.
//!
//! Why a fleet still never admits more than the limit: every unit admitted here was admitted by
//! Redis first (in the lease's check, atomic over every rule of every limiter, on Redis's
//! clock), and is spent before the end of the window that counted it (a leased policy counts
//! in fixed or sliding windows; a lease ends at its ttl or, measured from when its call was
//! sent and less a margin for clock rates, at the end of the first of its windows, whichever
//! comes first). What a lease leaves unspent goes back by its receipt's exact refund when a
//! newer lease replaces it or, for a key nobody checks any more, when the reaper finds it
//! ended.
//!
//! One lease per identity (the request's limiter keys and rules) is in hand at a time; while
//! a lease is being taken, the other checks of that identity ask Redis one by one with their
//! own cost (never waiting on it). A lease's size follows this instance's rate over the last
//! lease (enough for a ttl), is never more than its share of what Redis said was left nor its
//! `max_units`, and is never less than the check's cost; when Redis refuses a lease, the next
//! try asks for the share of what the refusal said was left, and at last for the check's own
//! cost, so a denial is exactly the one a plain check gets.

use std::{
    pin::pin,
    sync::{
        Arc, Mutex, MutexGuard, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use tokio::sync::Notify;
use tollgate::{
    CheckRequest, LimiterRequest, QuotaLease, Receipt, RefundStore, Rule, StoreError, Verdict,
    algorithm::RuleOutcome,
};

use crate::{RedisStore, cache::margin_us, shared::Inner};

/// Identities with a lease (or its figures) kept at most; beyond them, checks ask Redis.
pub(crate) const MAX_KEYS: usize = 65_536;

/// How long the figures of an identity whose lease ended are kept (its rate, what was left):
/// an identity checked again within it takes a lease of the right size at once.
const KEEP_FIGURES_US: u64 = 60_000_000;

/// The figures of a store's leases, since it was built (shared by its clones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Checks that asked Redis for a lease (each one call, or one per slot on a Cluster).
    pub calls: u64,
    /// Checks admitted from a lease in hand, without a call.
    pub local_admissions: u64,
    /// Units in hand now, taken and not yet spent or given back.
    pub units_outstanding: u64,
    /// Units given back unspent (by refund) when their lease ended.
    pub units_returned: u64,
    /// Identities with a lease in hand now.
    pub leased_keys: u64,
}

/// A leased identity as the store's figures show it (see [`RedisStore::leased_keys`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeasedKey {
    /// The limiters' keys, in policy order.
    pub keys: Vec<String>,
    /// Units in hand.
    pub units: u64,
    /// Until when the lease lasts, from now.
    pub ends_in: Duration,
}

/// Every lease of a store.
pub(crate) struct Leases {
    table: Mutex<HashTable<Grant>>,
    hasher: RandomState,
    calls: AtomicU64,
    local: AtomicU64,
    outstanding: AtomicU64,
    returned: AtomicU64,
    /// The reaper runs (started with the first lease).
    reaping: AtomicBool,
}

/// One identity's lease, and what sizes its next one.
struct Grant {
    hash: u64,
    keys: Box<[Box<str>]>,
    rules: Box<[Box<[Rule]>]>,
    shadow: Box<[bool]>,
    /// Units in hand.
    left: u64,
    /// Units the lease took.
    taken: u64,
    /// When its call was sent (the store's local clock).
    granted_us: u64,
    /// When it ends (local clock): no unit is spent from then on.
    until_us: u64,
    /// Redis's outcomes for the lease's call: what stays after all its units.
    outcomes: Box<[RuleOutcome]>,
    /// The lease's receipt (its units are `taken`), for the refund of what it leaves.
    receipt: Option<Receipt>,
    /// The smallest `remaining` of an enforced rule Redis last reported.
    room: u64,
    /// Units per second this instance spent from its last lease.
    rate: f64,
    /// A check is taking the next lease.
    renewing: bool,
    /// Wakes the checks waiting for that lease.
    renewed: Arc<Notify>,
}

impl Grant {
    fn matches(&self, plan: &CheckRequest<'_>) -> bool {
        self.keys.len() == plan.limiters.len()
            && self
                .keys
                .iter()
                .zip(&self.rules)
                .zip(&self.shadow)
                .zip(plan.limiters)
                .all(|(((key, rules), &shadow), l)| {
                    **key == *l.key && **rules == *l.rules && shadow == l.shadow
                })
    }

    /// The units it leaves unspent, to give back (taken out of it).
    fn leftover(&mut self) -> Option<Leftover> {
        let units = std::mem::take(&mut self.left);
        let receipt = self.receipt.take()?;
        (units > 0).then(|| Leftover {
            keys: self.keys.clone(),
            rules: self.rules.clone(),
            shadow: self.shadow.clone(),
            receipt,
            units,
        })
    }
}

/// Units a lease left unspent, to refund.
pub(crate) struct Leftover {
    keys: Box<[Box<str>]>,
    rules: Box<[Box<[Rule]>]>,
    shadow: Box<[bool]>,
    receipt: Receipt,
    units: u64,
}

/// What a check that found no lease in hand does.
enum Claim {
    /// Takes a lease of this many units, after giving back what the last one left.
    Renew {
        units: u64,
        leftover: Option<Leftover>,
    },
    /// Another check is taking the lease: waits for it (on this), then tries again.
    Wait(Arc<Notify>),
    /// No room is left for a lease: asks Redis alone.
    Alone,
}

/// Clears a claim's `renewing` if the check taking the lease is dropped before it ends.
struct Renewing<'a> {
    leases: &'a Leases,
    plan: &'a CheckRequest<'a>,
    armed: bool,
}

impl Drop for Renewing<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.leases.settle(self.plan, None);
        }
    }
}

impl Leases {
    pub(crate) fn new() -> Leases {
        Leases {
            table: Mutex::new(HashTable::new()),
            hasher: RandomState::default(),
            calls: AtomicU64::new(0),
            local: AtomicU64::new(0),
            outstanding: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            reaping: AtomicBool::new(false),
        }
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        let now_held = self
            .lock()
            .iter()
            .filter(|g| g.left > 0 && g.receipt.is_some())
            .count();
        LeaseStats {
            calls: self.calls.load(Ordering::Relaxed),
            local_admissions: self.local.load(Ordering::Relaxed),
            units_outstanding: self.outstanding.load(Ordering::Relaxed),
            units_returned: self.returned.load(Ordering::Relaxed),
            leased_keys: now_held as u64,
        }
    }

    pub(crate) fn leased_keys(&self, now_us: u64, at_most: usize) -> Vec<LeasedKey> {
        let table = self.lock();
        let mut keys: Vec<LeasedKey> = table
            .iter()
            .filter(|g| g.left > 0 && now_us < g.until_us)
            .map(|g| LeasedKey {
                keys: g.keys.iter().map(|k| k.to_string()).collect(),
                units: g.left,
                ends_in: Duration::from_micros(g.until_us - now_us),
            })
            .collect();
        keys.sort_by(|a, b| b.units.cmp(&a.units).then_with(|| a.keys.cmp(&b.keys)));
        keys.truncate(at_most);
        keys
    }

    fn lock(&self) -> MutexGuard<'_, HashTable<Grant>> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn hash(&self, plan: &CheckRequest<'_>) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = self.hasher.build_hasher();
        for l in plan.limiters {
            l.key.hash(&mut h);
        }
        h.finish()
    }

    /// Admits `plan` from the lease in hand, into `verdict`, if it holds the cost and has not
    /// ended.
    pub(crate) fn admit(
        &self,
        plan: &CheckRequest<'_>,
        now_us: u64,
        verdict: &mut Verdict,
    ) -> bool {
        let hash = self.hash(plan);
        let mut table = self.lock();
        let Some(grant) = table.find_mut(hash, |g| g.matches(plan)) else {
            return false;
        };
        if grant.left < plan.cost || now_us >= grant.until_us {
            return false;
        }
        let Some(receipt) = &grant.receipt else {
            return false;
        };
        grant.left -= plan.cost;
        self.outstanding.fetch_sub(plan.cost, Ordering::Relaxed);
        self.local.fetch_add(1, Ordering::Relaxed);
        let since = now_us.saturating_sub(grant.granted_us);
        verdict.allowed = true;
        verdict.blocked_us = None;
        verdict.banned_us = None;
        verdict.rules.clear();
        verdict
            .rules
            .extend(grant.outcomes.iter().map(|o| RuleOutcome {
                remaining: in_hand(o, grant.left),
                reset_after_us: o.reset_after_us.saturating_sub(since),
                ..*o
            }));
        verdict.receipt = Some(receipt.with_units(plan.cost));
        true
    }

    /// What a check that found no lease in hand does: take one (of how many units), or ask
    /// alone.
    fn claim(&self, plan: &CheckRequest<'_>, lease: QuotaLease, now_us: u64) -> Claim {
        let hash = self.hash(plan);
        let mut table = self.lock();
        if let Some(grant) = table.find_mut(hash, |g| g.matches(plan)) {
            if grant.renewing {
                return Claim::Wait(grant.renewed.clone());
            }
            let spent = grant.taken - grant.left;
            let lasted = now_us.saturating_sub(grant.granted_us).max(1_000);
            let observed = spent as f64 * 1e6 / lasted as f64;
            grant.rate = observed.max(grant.rate / 2.0);
            let leftover = grant.leftover();
            let back = leftover.as_ref().map_or(0, |l| l.units);
            self.outstanding.fetch_sub(back, Ordering::Relaxed);
            grant.renewing = true;
            let units = size(
                plan.cost,
                lease,
                grant.rate,
                grant.room.saturating_add(back),
            );
            return Claim::Renew { units, leftover };
        }
        if table.len() >= MAX_KEYS {
            return Claim::Alone;
        }
        let keys = plan.limiters.iter().map(|l| Box::from(l.key)).collect();
        let rules = plan.limiters.iter().map(|l| Box::from(l.rules)).collect();
        let shadow = plan.limiters.iter().map(|l| l.shadow).collect();
        table.insert_unique(
            hash,
            Grant {
                hash,
                keys,
                rules,
                shadow,
                left: 0,
                taken: 0,
                granted_us: now_us,
                until_us: now_us,
                outcomes: Box::new([]),
                receipt: None,
                room: u64::MAX,
                rate: 0.0,
                renewing: true,
                renewed: Arc::new(Notify::new()),
            },
            |g| g.hash,
        );
        // Nothing known of this identity yet: the first lease is the check's own cost, and its
        // answer says what is left.
        Claim::Renew {
            units: plan.cost,
            leftover: None,
        }
    }

    /// Ends a claim: with the lease Redis granted (its call's verdict, sent at `sent_us`), or
    /// without one (`None`: refused, failed or dropped), remembering what was left.
    fn settle(&self, plan: &CheckRequest<'_>, granted: Option<Granted<'_>>) {
        let hash = self.hash(plan);
        let mut table = self.lock();
        let Some(grant) = table.find_mut(hash, |g| g.matches(plan)) else {
            return;
        };
        grant.renewing = false;
        grant.renewed.notify_waiters();
        let Some(Granted {
            verdict,
            units,
            sent_us,
            ttl,
        }) = granted
        else {
            return;
        };
        grant.room = room(plan, verdict);
        let Some(receipt) = &verdict.receipt else {
            return;
        };
        let left = units - plan.cost;
        grant.left = left;
        grant.taken = units;
        grant.granted_us = sent_us;
        grant.until_us = ends_at(plan, receipt, sent_us, ttl);
        grant.outcomes = verdict.rules.iter().copied().collect();
        grant.receipt = Some(receipt.clone());
        self.outstanding.fetch_add(left, Ordering::Relaxed);
    }

    /// Takes out the leases that ended with units unspent, and forgets identities whose lease
    /// ended long ago; returns what to give back.
    fn reap(&self, now_us: u64) -> Vec<Leftover> {
        let mut table = self.lock();
        let mut back = Vec::new();
        for grant in table.iter_mut() {
            if !grant.renewing && now_us >= grant.until_us && grant.left > 0 {
                if let Some(leftover) = grant.leftover() {
                    self.outstanding
                        .fetch_sub(leftover.units, Ordering::Relaxed);
                    back.push(leftover);
                }
            }
        }
        table.retain(|g| g.renewing || now_us < g.until_us.saturating_add(KEEP_FIGURES_US));
        back
    }

    /// Forgets the leases of `plan`'s limiters (a reset: their counts are gone).
    pub(crate) fn forget(&self, plan: &CheckRequest<'_>) {
        let mut table = self.lock();
        let mut dropped = 0;
        table.retain(|g| {
            let keep = !g
                .keys
                .iter()
                .any(|k| plan.limiters.iter().any(|l| **k == *l.key));
            if !keep {
                dropped += g.left;
            }
            keep
        });
        self.outstanding.fetch_sub(dropped, Ordering::Relaxed);
    }
}

/// A lease Redis granted.
struct Granted<'a> {
    verdict: &'a Verdict,
    units: u64,
    sent_us: u64,
    ttl: Duration,
}

/// A lease's size: enough for `ttl` at `rate`, at most its share of `room` and its
/// `max_units`, and at least `cost`.
fn size(cost: u64, lease: QuotaLease, rate: f64, room: u64) -> u64 {
    let want = (rate * lease.ttl().as_secs_f64()).ceil();
    let share = (room as f64 * lease.share_of_remaining()).floor();
    let units = want.min(share).min(lease.units_at_most() as f64);
    // `as` saturates: a huge figure is u64::MAX, NaN is 0.
    (units as u64).max(cost)
}

/// The smallest `remaining` over the enforced rules of a verdict.
fn room(plan: &CheckRequest<'_>, verdict: &Verdict) -> u64 {
    let mut outcomes = verdict.rules.iter();
    let mut room = u64::MAX;
    for l in plan.limiters {
        for o in outcomes.by_ref().take(l.rules.len()) {
            if !l.shadow {
                room = room.min(o.remaining);
            }
        }
    }
    room
}

/// A rule's `remaining` with `left` units still in hand (a rule that denied, shadow, stays).
fn in_hand(outcome: &RuleOutcome, left: u64) -> u64 {
    if outcome.allowed {
        outcome.remaining.saturating_add(left)
    } else {
        outcome.remaining
    }
}

/// When a lease sent at `sent_us` ends (local clock): after `ttl`, or at the end of the first
/// window that counted its units, less a margin, whichever is sooner. Windows are measured on
/// Redis's clock from the receipt's instants; the call was sent no later than those, so the
/// local end is never after Redis's.
fn ends_at(plan: &CheckRequest<'_>, receipt: &Receipt, sent_us: u64, ttl: Duration) -> u64 {
    let ttl_us = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX);
    let mut until = sent_us.saturating_add(ttl_us);
    for (i, l) in plan.limiters.iter().enumerate() {
        let Some(at) = receipt.at_us(i) else {
            continue;
        };
        for rule in l.rules {
            let (_, end) = rule.fixed_window_at(at);
            let left = end - at;
            until = until.min(sent_us + left.saturating_sub(margin_us(left)));
        }
    }
    until
}

impl RedisStore {
    /// A leased check: from the lease in hand, else by taking a new lease.
    pub(crate) async fn check_leased(
        &self,
        plan: &CheckRequest<'_>,
        lease: QuotaLease,
    ) -> Result<Verdict, StoreError> {
        let leases = &self.inner.leases;
        let mut verdict = Verdict::empty();
        // Waits for another check's lease at most once: the wait is one call's time.
        let mut waited = false;
        let (mut units, leftover) = loop {
            let now = self.inner.local_now_us();
            if leases.admit(plan, now, &mut verdict) {
                return Ok(verdict);
            }
            match leases.claim(plan, lease, now) {
                Claim::Renew { units, leftover } => break (units, leftover),
                Claim::Wait(renewed) if !waited => {
                    waited = true;
                    let mut notified = pin!(renewed.notified());
                    notified.as_mut().enable();
                    // The lease may have come between the claim and `enable`.
                    if leases.admit(plan, self.inner.local_now_us(), &mut verdict) {
                        return Ok(verdict);
                    }
                    let bound = self.inner.backend.timeout;
                    let _ = tokio::time::timeout(bound, notified).await;
                }
                Claim::Wait(_) | Claim::Alone => return self.check_store(plan).await,
            }
        };
        let mut renewing = Renewing {
            leases,
            plan,
            armed: true,
        };
        if let Some(leftover) = leftover {
            self.give_back(leftover);
        }
        self.start_reaper();
        loop {
            let mut ask = *plan;
            ask.cost = units;
            let sent_us = self.inner.local_now_us();
            leases.calls.fetch_add(1, Ordering::Relaxed);
            let mut verdict = self.check_store(&ask).await?;
            if verdict.allowed {
                renewing.armed = false;
                leases.settle(
                    plan,
                    Some(Granted {
                        verdict: &verdict,
                        units,
                        sent_us,
                        ttl: lease.ttl(),
                    }),
                );
                // The caller's view: its own cost spent, the rest in hand.
                let left = units - plan.cost;
                for o in verdict.rules.iter_mut() {
                    o.remaining = in_hand(o, left);
                }
                verdict.receipt = verdict.receipt.map(|r| r.with_units(plan.cost));
                return Ok(verdict);
            }
            if units == plan.cost || verdict.blocked_us.is_some() {
                return Ok(verdict);
            }
            // Refused for its size: a share of what the refusal says is left, at last the
            // check's own cost (whose answer is then a plain check's).
            let room = room(plan, &verdict);
            let next = size(plan.cost, lease, f64::INFINITY, room);
            units = if room < plan.cost || next >= units {
                plan.cost
            } else {
                next
            };
        }
    }

    /// Gives back, in the background, what a lease left unspent.
    fn give_back(&self, leftover: Leftover) {
        let store = self.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let _ = store.refund_leftover(&leftover).await;
        });
    }

    async fn refund_leftover(&self, leftover: &Leftover) -> Result<(), StoreError> {
        let limiters: Vec<LimiterRequest<'_>> = leftover
            .keys
            .iter()
            .zip(&leftover.rules)
            .zip(&leftover.shadow)
            .map(|((key, rules), &shadow)| LimiterRequest {
                key,
                compact: &[],
                rules,
                ban: None,
                shadow,
                overrides: None,
            })
            .collect();
        let request = CheckRequest::new(leftover.units, true, &limiters);
        RefundStore::refund(self, &request, Some(&leftover.receipt)).await?;
        self.inner
            .leases
            .returned
            .fetch_add(leftover.units, Ordering::Relaxed);
        Ok(())
    }

    /// Starts the task that gives back what ended leases left (once per store, and only
    /// while the store lives).
    fn start_reaper(&self) {
        if self.inner.leases.reaping.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.leases.reaping.store(false, Ordering::Relaxed);
            return;
        };
        runtime.spawn(reaper(Arc::downgrade(&self.inner)));
    }
}

/// Every 50 ms, gives back what ended leases left.
async fn reaper(inner: Weak<Inner>) {
    let mut every = tokio::time::interval(Duration::from_millis(50));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let back = inner.leases.reap(inner.local_now_us());
        let store = RedisStore { inner };
        for leftover in back {
            let _ = store.refund_leftover(&leftover).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> QuotaLease {
        QuotaLease::new(Duration::from_secs(1))
    }

    #[test]
    fn a_lease_follows_the_rate_within_its_share_and_bound() {
        // 100 units a second for a second's ttl: 100, unless a quarter of what is left is less.
        assert_eq!(size(1, lease(), 100.0, 10_000), 100);
        assert_eq!(size(1, lease(), 100.0, 200), 50);
        assert_eq!(size(1, lease().max_units(30), 100.0, 10_000), 30);
        // Never below the cost, whatever is left or the rate.
        assert_eq!(size(5, lease(), 0.0, 0), 5);
        assert_eq!(size(5, lease(), f64::NAN, 10), 5);
        assert_eq!(size(1, lease(), f64::INFINITY, u64::MAX), u64::MAX / 4 + 1);
    }

    #[test]
    fn a_lease_ends_before_the_window_that_counted_it() {
        let rule = Rule::new(100, Duration::from_secs(60))
            .unwrap()
            .with_algorithm(tollgate::Algorithm::FixedWindow);
        let rules = [rule];
        let limiters = [LimiterRequest {
            key: "k",
            compact: &[],
            rules: &rules,
            ban: None,
            shadow: false,
            overrides: None,
        }];
        let plan = CheckRequest::new(1, true, &limiters);
        // Redis admitted 10 s before its window's end; sent at local 1000 µs.
        let at = 60_000_000 * 100 + 50_000_000;
        let receipt = Receipt::new(at, 7, 1);
        let end = ends_at(&plan, &receipt, 1_000, Duration::from_secs(30));
        let left = 10_000_000;
        assert_eq!(end, 1_000 + left - margin_us(left));
        // A short ttl ends it first.
        assert_eq!(
            ends_at(&plan, &receipt, 1_000, Duration::from_millis(5)),
            6_000
        );
    }
}
