//! The rule states under one limiter key: a shared sliding log and one counter per
//! fixed-window or GCRA rule, evaluated and recorded by the pure functions of `algorithm`.

use smallvec::SmallVec;

use super::log::Log;
use crate::{
    CalendarUnit,
    algorithm::{self, FixedWindowState, RuleOutcome, SlidingWindowState},
    rule::{Algorithm, Rule},
};

/// Every rule state under one limiter key: one entry, one look-up, whatever the rules.
///
/// Kept small, since a store holds up to a million of them: the log is allocated only for a
/// limiter with sliding-log rules, and one counter lives inline.
#[derive(Default)]
pub(super) struct RuleStates {
    /// The instants of admitted units, oldest first, shared by the sliding-log rules. Boxed:
    /// one pointer in the entries of limiters without a sliding log, not the log's four words.
    log: Option<Box<Log>>,
    /// One per fixed-window or GCRA rule; inline for a limiter with one such rule.
    counters: SmallVec<[Counter; 1]>,
}

/// The state of one fixed-window or GCRA rule, which its rule's algorithm reads: the window's
/// start and count, or the theoretical arrival time (and 0). A sliding-window rule has two:
/// its current window's (start, count), and, while it counts, the previous window's.
struct Counter {
    rule: RuleId,
    a: u64,
    b: u64,
}

/// A fixed-window or GCRA rule, exactly, in two words: its place among its limiter's rules, and
/// its window in milliseconds (below 2^40) with the algorithm in the top bits; a calendar window
/// adds its calendar (the unit in the algorithm, the zone's index in bits 40 to 55). Not its
/// limit: an identity's override changes the limit, and counts on the same state.
#[derive(Clone, Copy, PartialEq, Eq)]
struct RuleId {
    place: u64,
    window_and_algorithm: u64,
}

impl RuleId {
    /// The algorithm code of a GCRA rule (and of a sliding log's, which has no counter).
    const GCRA: u64 = 2;

    fn of(place: usize, rule: &Rule) -> RuleId {
        let (algorithm, zone) = match (rule.algorithm(), rule.calendar_window()) {
            (Algorithm::FixedWindow, Some(calendar)) => {
                let unit = match calendar.unit() {
                    CalendarUnit::Day => 5,
                    CalendarUnit::Week => 6,
                    CalendarUnit::Month => 7,
                };
                (unit, u64::from(calendar.zone_index()))
            }
            (Algorithm::FixedWindow, None) => (1, 0),
            (Algorithm::SlidingWindow, _) => (3, 0),
            _ => (RuleId::GCRA, 0),
        };
        RuleId {
            place: place as u64,
            window_and_algorithm: rule.window_ms() | zone << 40 | algorithm << 56,
        }
    }

    /// The counter of a limiter's only rule, a GCRA rule ([`lone_gcra`]): `of(0, rule)`.
    #[inline(always)]
    fn gcra(rule: &Rule) -> RuleId {
        RuleId {
            place: 0,
            window_and_algorithm: rule.window_ms() | RuleId::GCRA << 56,
        }
    }

    /// A lease of `units` of a concurrency limit (`a` its start, `b` the check's id): the log
    /// holds its units, this names whose they are and how many are left, so that a refund, a
    /// release or a renewal finds its own and no more (another check's units may share the
    /// lease's instant). It keeps the count where other counters keep their place.
    fn lease_of(rule: &Rule, units: u64) -> RuleId {
        RuleId {
            place: units,
            window_and_algorithm: rule.window_ms() | 8 << 56,
        }
    }

    /// The counter of a sliding-window rule's current window: `of(place, rule)`.
    #[inline(always)]
    fn sliding(place: usize, rule: &Rule) -> RuleId {
        debug_assert!(rule.algorithm() == Algorithm::SlidingWindow);
        RuleId {
            place: place as u64,
            window_and_algorithm: rule.window_ms() | 3 << 56,
        }
    }

    /// The counter of a sliding-window rule's previous window.
    fn previous_of(place: usize, rule: &Rule) -> RuleId {
        RuleId {
            place: place as u64,
            window_and_algorithm: rule.window_ms() | 4 << 56,
        }
    }

    fn algorithm(self) -> u64 {
        self.window_and_algorithm >> 56
    }

    fn window_us(self) -> u64 {
        (self.window_and_algorithm & ((1 << 40) - 1)) * 1000
    }
}

impl Counter {
    /// The instant (µs) after which the counter holds nothing that counts.
    fn expires_at(&self) -> u64 {
        match self.rule.algorithm() {
            1 => self.a + self.rule.window_us(),
            // A calendar window lasts at most its longest length past its start.
            5 => self.a + CalendarUnit::Day.longest_ms() * 1000,
            6 => self.a + CalendarUnit::Week.longest_ms() * 1000,
            7 => self.a + CalendarUnit::Month.longest_ms() * 1000,
            // A lease counts for its window (the lease's time to live) from its start.
            8 => self.a + self.rule.window_us(),
            // A sliding window's count fades over the window after it.
            3 | 4 => self.a + 2 * self.rule.window_us(),
            _ => self.a,
        }
    }
}

/// The counter of `rule`, at `place` among its limiter's rules, among the limiter's counters.
fn counter<'a>(counters: &'a [Counter], place: usize, rule: &Rule) -> Option<&'a Counter> {
    let id = RuleId::of(place, rule);
    counters.iter().find(|c| c.rule == id)
}

/// The fixed window of `rule` among a limiter's counters.
fn window(counters: &[Counter], place: usize, rule: &Rule) -> Option<FixedWindowState> {
    counter(counters, place, rule).map(|c| FixedWindowState {
        start: c.a,
        count: c.b,
    })
}

/// The sliding window of `rule` among a limiter's counters.
#[inline]
fn sliding(counters: &[Counter], place: usize, rule: &Rule) -> Option<SlidingWindowState> {
    sliding_at(counters, sliding_places(counters, place, rule), rule)
}

/// Where the counters of sliding-window `rule` are among a limiter's, in one pass: its current
/// window's and its previous window's (whatever that one's start).
#[inline(always)]
fn sliding_places(
    counters: &[Counter],
    place: usize,
    rule: &Rule,
) -> (Option<usize>, Option<usize>) {
    let (current, previous) = (
        RuleId::sliding(place, rule),
        RuleId::previous_of(place, rule),
    );
    let (mut at, mut before) = (None, None);
    for (i, c) in counters.iter().enumerate() {
        if c.rule == current {
            at = Some(i);
        } else if c.rule == previous {
            before = Some(i);
        }
    }
    (at, before)
}

/// The sliding window whose counters are at `places` ([`sliding_places`]): the previous
/// window's count only if it is the window right before the current one.
#[inline(always)]
fn sliding_at(
    counters: &[Counter],
    (at, before): (Option<usize>, Option<usize>),
    rule: &Rule,
) -> Option<SlidingWindowState> {
    let current = &counters[at?];
    let previous = before
        .map(|i| &counters[i])
        .filter(|c| c.a.checked_add(rule.window_us()) == Some(current.a))
        .map_or(0, |c| c.b);
    Some(SlidingWindowState {
        start: current.a,
        count: current.b,
        previous,
    })
}

/// The theoretical arrival time of GCRA `rule` among a limiter's counters.
fn tat(counters: &[Counter], place: usize, rule: &Rule) -> Option<u64> {
    counter(counters, place, rule).map(|c| c.a)
}

/// A check's lease among a limiter's counters (see `RuleStates::lease`).
enum Lease {
    /// The limiter is no concurrency limit: there is no lease to look for.
    NotConcurrent,
    /// The lease, at this place among the counters: their instant is where the lease's log
    /// entries are now (its start, or its last renewal).
    Held(usize),
    /// Released, run out or never taken.
    Gone,
}

/// How far ahead a charge may move a GCRA rule's arrival time: a year (µs).
pub(crate) const MAX_DEBT_US: u64 = 366 * 86_400 * 1_000_000;

/// The rule of a limiter of one GCRA rule, the common case, which a check evaluates and
/// records without walking the rules and counters in general.
#[inline(always)]
fn lone_gcra(rules: &[Rule]) -> Option<&Rule> {
    match rules {
        [rule] if rule.algorithm() == Algorithm::Gcra => Some(rule),
        _ => None,
    }
}

/// The longest sliding-log window of `rules` (µs), if any rule is a sliding log.
fn log_window(rules: &[Rule]) -> Option<u64> {
    rules
        .iter()
        .filter(|r| r.algorithm() == Algorithm::SlidingLog)
        .map(Rule::window_us)
        .max()
}

/// What `rule` says about `cost` more units at `now`, over a limiter's log and counters.
fn outcome(
    log: &[u64],
    counters: &[Counter],
    (place, rule): (usize, &Rule),
    now: u64,
    cost: u64,
    delay_us: u64,
) -> RuleOutcome {
    match rule.algorithm() {
        Algorithm::SlidingLog => algorithm::sliding_log(log, now, rule, cost),
        Algorithm::FixedWindow => {
            algorithm::fixed_window(window(counters, place, rule), now, rule, cost).0
        }
        Algorithm::Gcra => {
            let tat = tat(counters, place, rule);
            algorithm::gcra_within(tat, now, rule, cost, delay_us).0
        }
        Algorithm::SlidingWindow => {
            algorithm::sliding_window(sliding(counters, place, rule), now, rule, cost).0
        }
    }
}

impl RuleStates {
    /// Forgets everything, keeping the allocations (an expired entry being reused).
    pub(super) fn clear(&mut self) {
        if let Some(log) = &mut self.log {
            log.clear();
        }
        self.counters.clear();
    }

    /// The arrival time of GCRA `rule`, a limiter's only rule, when these states hold it alone
    /// (as [`record`](Self::record) leaves them for such a limiter): for a check to read and
    /// move in place.
    #[inline(always)]
    pub(super) fn lone_gcra(&mut self, rule: &Rule) -> Option<&mut u64> {
        if self.log.as_ref().is_some_and(|log| !log.is_empty()) {
            return None;
        }
        match &mut self.counters[..] {
            [counter] if counter.rule == RuleId::gcra(rule) => Some(&mut counter.a),
            _ => None,
        }
    }

    /// The log as one slice (sorted, oldest first), and the counters.
    fn view(&self) -> (&[u64], &[Counter]) {
        let log = match &self.log {
            Some(log) => &***log,
            None => &[],
        };
        (log, &self.counters)
    }

    /// Every rule's outcome into `out`; true if all admit.
    #[inline(always)]
    pub(super) fn evaluate(
        &mut self,
        rules: &[Rule],
        now: u64,
        cost: u64,
        delay_us: u64,
        out: &mut [RuleOutcome],
    ) -> bool {
        if let (Some(rule), [o]) = (lone_gcra(rules), &mut *out) {
            let tat = self.counters.iter().find(|c| c.rule == RuleId::gcra(rule));
            *o = algorithm::gcra_within(tat.map(|c| c.a), now, rule, cost, delay_us).0;
            return o.allowed;
        }
        self.evaluate_all(rules, now, (cost, delay_us), out)
    }

    /// [`evaluate`](Self::evaluate) of any rules.
    #[inline(never)]
    fn evaluate_all(
        &mut self,
        rules: &[Rule],
        now: u64,
        (cost, delay_us): (u64, u64),
        out: &mut [RuleOutcome],
    ) -> bool {
        let (log, counters) = self.view();
        let mut allowed = true;
        // Sliding logs only (the seed's "1 a minute and 10 an hour"): no counter to find.
        if rules.iter().all(|r| r.algorithm() == Algorithm::SlidingLog) {
            for (o, rule) in out.iter_mut().zip(rules) {
                *o = algorithm::sliding_log(log, now, rule, cost);
                allowed &= o.allowed;
            }
            return allowed;
        }
        for (o, rule) in out.iter_mut().zip(rules.iter().enumerate()) {
            *o = outcome(log, counters, rule, now, cost, delay_us);
            allowed &= o.allowed;
        }
        allowed
    }

    /// After a denial: the rules that would have admitted report the state as it stays, which
    /// is what they say for a cost of zero (`out` holds what they said for `cost`).
    pub(super) fn settle(&mut self, rules: &[Rule], now: u64, cost: u64, out: &mut [RuleOutcome]) {
        // Outcomes for no units say it already (an evicted key's debt among them: see `owed`).
        if cost == 0 {
            return;
        }
        // A lone rule denied: nothing to say again.
        if let [only] = &*out
            && !only.allowed
        {
            return;
        }
        let (log, counters) = self.view();
        for (o, (place, rule)) in out.iter_mut().zip(rules.iter().enumerate()) {
            if o.allowed {
                *o = match rule.algorithm() {
                    // The seed's rules: from what they said for `cost`, without searching the
                    // log again.
                    Algorithm::SlidingLog => {
                        algorithm::sliding_log_settled(o, log, now, rule, cost)
                    }
                    _ => outcome(log, counters, (place, rule), now, 0, 0),
                };
            }
        }
    }

    /// Records `cost` units that every rule admitted at `now`, with `outcomes` the admitting
    /// outcomes [`evaluate`](Self::evaluate) gave; returns until when the states count.
    #[inline(always)]
    pub(super) fn record(
        &mut self,
        rules: &[Rule],
        outcomes: &[RuleOutcome],
        now: u64,
        cost: u64,
        id: u64,
    ) -> u64 {
        if let (Some(rule), [outcome]) = (lone_gcra(rules), outcomes)
            && let Some(until) = self.record_lone_gcra(rule, outcome, now)
        {
            return until;
        }
        self.record_all(rules, outcomes, now, cost, id)
    }

    /// [`record`](Self::record) of any rules.
    #[inline(never)]
    fn record_all(
        &mut self,
        rules: &[Rule],
        outcomes: &[RuleOutcome],
        now: u64,
        cost: u64,
        id: u64,
    ) -> u64 {
        // Counters written here, which all count past `now`: when they are all there are,
        // none has run out.
        let mut written = 0;
        let mut expires_at = now;
        if let Some(window) = log_window(rules) {
            let log = self.log.get_or_insert_default();
            if let Some(edge) = now.checked_sub(window) {
                log.leave_until(edge);
            }
            let units = usize::try_from(cost).unwrap_or(usize::MAX);
            if log.last().is_none_or(|&t| t <= now) {
                log.push_n(now, units);
            } else {
                // Keep the log sorted even if the clock stepped back.
                log.insert_n(now, units);
            }
            expires_at = now + window;
            // Plain sliding logs only: the log is all they count in.
            if self.counters.is_empty()
                && rules
                    .iter()
                    .all(|r| r.algorithm() == Algorithm::SlidingLog && !r.is_concurrent())
            {
                return expires_at;
            }
        }
        for (place, (rule, outcome)) in rules.iter().zip(outcomes).enumerate() {
            let (a, b) = match rule.algorithm() {
                Algorithm::SlidingLog if rule.is_concurrent() => {
                    self.counters.push(Counter {
                        rule: RuleId::lease_of(rule, cost),
                        a: now,
                        b: id,
                    });
                    written += 1;
                    continue;
                }
                Algorithm::SlidingLog => continue,
                Algorithm::FixedWindow => {
                    let state = window(&self.counters, place, rule);
                    let (_, next) = algorithm::fixed_window(state, now, rule, cost);
                    let Some(next) = next else { continue };
                    (next.start, next.count)
                }
                Algorithm::SlidingWindow => {
                    // Both counters found once, and written where they are.
                    let places = sliding_places(&self.counters, place, rule);
                    let state = sliding_at(&self.counters, places, rule);
                    // The admitting outcome names the window: no second evaluation.
                    let next = algorithm::sliding_window_recorded(state, now, rule, cost, outcome);
                    let current = Counter {
                        rule: RuleId::sliding(place, rule),
                        a: next.start,
                        b: next.count,
                    };
                    expires_at = expires_at.max(current.expires_at());
                    written += 1;
                    match places.0 {
                        Some(i) => self.counters[i] = current,
                        None => self.counters.push(current),
                    }
                    // The previous window's counter, kept only while it counts (a window with a
                    // count before it starts a window after the epoch's first).
                    let previous = (next.previous > 0).then(|| Counter {
                        rule: RuleId::previous_of(place, rule),
                        a: next.start - rule.window_us(),
                        b: next.previous,
                    });
                    match (places.1, previous) {
                        (Some(i), Some(previous)) => self.counters[i] = previous,
                        (None, Some(previous)) => self.counters.push(previous),
                        (Some(i), None) => {
                            self.counters.remove(i);
                        }
                        (None, None) => {}
                    }
                    written += usize::from(next.previous > 0);
                    continue;
                }
                // An admitting GCRA outcome waits until the new arrival time: no second
                // evaluation.
                Algorithm::Gcra => (now.saturating_add(outcome.reset_after_us), 0),
            };
            let until = self.put(RuleId::of(place, rule), a, b);
            written += 1;
            expires_at = expires_at.max(until);
        }
        // What ran out goes, after the writes: a rule's own counter is rewritten in place
        // (every algorithm reads a counter that ran out as none), not dropped and pushed again.
        if self.counters.len() > written {
            self.counters.retain(|c| c.expires_at() > now);
        }
        expires_at
    }

    /// Charges `cost` units to every rule at `now` whatever their limits say (see
    /// `RefundStore::charge`): a debt. The log and the window counts hold at most twice their
    /// limit; GCRA's arrival time moves by `cost` emission intervals, at most a year ahead.
    /// Returns until when the states count.
    pub(super) fn charge(&mut self, rules: &[Rule], now: u64, cost: u64) -> u64 {
        self.counters.retain(|c| c.expires_at() > now);
        let mut expires_at = now;
        if let Some(window) = log_window(rules) {
            let cap = rules
                .iter()
                .filter(|r| r.algorithm() == Algorithm::SlidingLog)
                .map(|r| r.limit().saturating_mul(2))
                .max()
                .unwrap_or(0);
            let log = self.log.get_or_insert_default();
            if let Some(edge) = now.checked_sub(window) {
                log.leave_until(edge);
            }
            let units = cost.min(cap.saturating_sub(log.len() as u64));
            // Kept sorted even if the clock stepped back.
            log.insert_n(now, usize::try_from(units).unwrap_or(usize::MAX));
            expires_at = now + window;
        }
        for (place, rule) in rules.iter().enumerate() {
            let twice = rule.limit().saturating_mul(2);
            let until = match rule.algorithm() {
                Algorithm::SlidingLog => continue,
                Algorithm::FixedWindow => {
                    let (start, _) = rule.fixed_window_at(now);
                    let count = window(&self.counters, place, rule)
                        .filter(|w| w.start == start)
                        .map_or(0, |w| w.count);
                    self.put(
                        RuleId::of(place, rule),
                        start,
                        count.saturating_add(cost).min(twice),
                    )
                }
                Algorithm::SlidingWindow => {
                    let w = rule.window_us();
                    let start = now - now % w;
                    let (previous, count) = match sliding(&self.counters, place, rule) {
                        Some(s) if s.start == start => (s.previous, s.count),
                        Some(s) if s.start.checked_add(w) == Some(start) => (s.count, 0),
                        _ => (0, 0),
                    };
                    let id = RuleId::previous_of(place, rule);
                    if previous > 0 {
                        self.put(id, start - w, previous);
                    } else {
                        self.counters.retain(|c| c.rule != id);
                    }
                    self.put(
                        RuleId::of(place, rule),
                        start,
                        count.saturating_add(cost).min(twice),
                    )
                }
                Algorithm::Gcra => {
                    let tat = tat(&self.counters, place, rule).unwrap_or(now).max(now);
                    let debt = algorithm::gcra_interval(rule).saturating_mul(cost);
                    let tat = tat.saturating_add(debt).min(now + MAX_DEBT_US);
                    self.put(RuleId::of(place, rule), tat, 0)
                }
            };
            expires_at = expires_at.max(until);
        }
        expires_at
    }

    /// Gives back `cost` units to every rule at `now` (see `RefundStore::refund`): the log's entries
    /// recorded at `at` (or its newest), the count of `at`'s window (or the current one), the
    /// GCRA arrival time; never below empty.
    pub(super) fn refund(&mut self, rules: &[Rule], now: u64, at: Option<u64>, cost: u64, id: u64) {
        // A lease's units are given back once: the log's units at its instant are its own only
        // as many as it still names (another check's units may share that instant). Its instant
        // is the lease's own, not the receipt's: a receipt from before a renewal names it too.
        // Part of a lease given back leaves the lease with the rest.
        let (mut at, mut log_cost) = (at, cost);
        if at.is_some() {
            match self.lease(rules, id) {
                Lease::Held(i) => {
                    let lease = &mut self.counters[i];
                    at = Some(lease.a);
                    log_cost = cost.min(lease.rule.place);
                    lease.rule.place -= log_cost;
                    if lease.rule.place == 0 {
                        self.counters.remove(i);
                    }
                }
                Lease::Gone => return,
                Lease::NotConcurrent => {}
            }
        }
        if let Some(log) = &mut self.log {
            if rules.iter().any(|r| r.algorithm() == Algorithm::SlidingLog) {
                match at {
                    Some(at) => {
                        let first = log.partition_point(|&t| t < at);
                        let last = log.partition_point(|&t| t <= at);
                        let n = (last - first).min(usize::try_from(log_cost).unwrap_or(usize::MAX));
                        log.remove(first..first + n);
                    }
                    None => log.remove_newest(usize::try_from(log_cost).unwrap_or(usize::MAX)),
                }
            }
        }
        let when = at.unwrap_or(now);
        for (place, rule) in rules.iter().enumerate() {
            let w = rule.window_us();
            let start = match rule.algorithm() {
                Algorithm::FixedWindow => rule.fixed_window_at(when).0,
                _ => when - when % w,
            };
            let id = RuleId::of(place, rule);
            match rule.algorithm() {
                Algorithm::SlidingLog => {}
                Algorithm::FixedWindow => {
                    if let Some(c) = self
                        .counters
                        .iter_mut()
                        .find(|c| c.rule == id && c.a == start)
                    {
                        c.b = c.b.saturating_sub(cost);
                    }
                }
                Algorithm::SlidingWindow => {
                    // The window `at` counted in: the current one, or since ended, the previous.
                    let previous = RuleId::previous_of(place, rule);
                    if let Some(c) = self
                        .counters
                        .iter_mut()
                        .find(|c| (c.rule == id || c.rule == previous) && c.a == start)
                    {
                        c.b = c.b.saturating_sub(cost);
                    }
                }
                // A receipt from before the rule's period counts for nothing any more: its units
                // were given back by time already.
                Algorithm::Gcra
                    if at.is_some_and(|at| at.saturating_add(rule.window_us()) <= now) => {}
                Algorithm::Gcra => {
                    let back = algorithm::gcra_interval(rule).saturating_mul(cost);
                    if let Some(c) = self.counters.iter_mut().find(|c| c.rule == id) {
                        c.a = c.a.saturating_sub(back).max(now.min(c.a));
                    }
                }
            }
        }
    }

    /// The lease check `id` took, if `rules` are a concurrency limit's: found by the check's
    /// id alone, so that any receipt of the check names it, whichever renewal it came from (a
    /// renewal whose answer was lost can be asked again, and a release by an older receipt
    /// still releases).
    fn lease(&self, rules: &[Rule], id: u64) -> Lease {
        let Some(rule) = rules.iter().find(|r| r.is_concurrent()) else {
            return Lease::NotConcurrent;
        };
        let lease = RuleId::lease_of(rule, 0).window_and_algorithm;
        match self
            .counters
            .iter()
            .position(|c| c.rule.window_and_algorithm == lease && c.b == id)
        {
            Some(i) => Lease::Held(i),
            None => Lease::Gone,
        }
    }

    /// Whether the log holds entries of check `id` that still count at `now`: at its lease's
    /// instant, the units the lease has left, whatever `units` the receipt names (the leases
    /// of a check: see `RefundStore::extend`); or `units` at `at` in a limiter that takes no
    /// leases. At least one.
    pub(super) fn holds(&self, rules: &[Rule], now: u64, at: u64, units: u64, id: u64) -> bool {
        let Some(window) = log_window(rules) else {
            return false;
        };
        let (at, units) = match self.lease(rules, id) {
            Lease::Held(i) => (self.counters[i].a, self.counters[i].rule.place),
            Lease::Gone => return false,
            Lease::NotConcurrent => (at, units),
        };
        let Some(log) = &self.log else { return false };
        let live = now.checked_sub(window).is_none_or(|edge| at > edge);
        let first = log.partition_point(|&t| t < at);
        let last = log.partition_point(|&t| t <= at);
        live && units > 0 && (last - first) as u64 >= units
    }

    /// Moves `units` log entries of check `id` to `now` (a check's leases, renewed: see
    /// [`holds`](Self::holds), which must be true); returns until when the log counts.
    pub(super) fn renew(&mut self, rules: &[Rule], now: u64, at: u64, units: u64, id: u64) -> u64 {
        let window = log_window(rules).unwrap_or(0);
        let (mut at, mut units) = (at, units);
        if let Lease::Held(i) = self.lease(rules, id) {
            at = std::mem::replace(&mut self.counters[i].a, now);
            // All the lease has left (a partial refund may have taken some: see `refund`),
            // whatever the receipt names.
            units = self.counters[i].rule.place;
        }
        let log = self.log.get_or_insert_default();
        let first = log.partition_point(|&t| t < at);
        let n = usize::try_from(units).unwrap_or(usize::MAX);
        log.remove(first..first + n);
        log.insert_n(now, n);
        now.saturating_add(window)
    }

    /// [`record`](Self::record) for a limiter of one GCRA rule: its arrival time is its one
    /// counter, moved to where the admitting outcome said. `None` when counters of rules the
    /// limiter had before are there too: then the general walk writes and sweeps.
    #[inline(always)]
    fn record_lone_gcra(&mut self, rule: &Rule, outcome: &RuleOutcome, now: u64) -> Option<u64> {
        let (id, tat) = (
            RuleId::gcra(rule),
            now.saturating_add(outcome.reset_after_us),
        );
        match &mut self.counters[..] {
            [counter] if counter.rule == id => counter.a = tat,
            // A new key, or one whose state ran out.
            [] => {
                let counter = Counter {
                    rule: id,
                    a: tat,
                    b: 0,
                };
                self.counters = SmallVec::from_buf([counter]);
            }
            _ => return None,
        }
        Some(tat)
    }

    /// Sets the counter `id` (adding it if need be); returns until when it counts.
    fn put(&mut self, id: RuleId, a: u64, b: u64) -> u64 {
        let counter = match self.counters.iter_mut().position(|c| c.rule == id) {
            Some(i) => &mut self.counters[i],
            None => {
                self.counters.push(Counter { rule: id, a, b });
                let last = self.counters.len() - 1;
                &mut self.counters[last]
            }
        };
        (counter.a, counter.b) = (a, b);
        counter.expires_at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn rule(text: &str, algorithm: Algorithm) -> Rule {
        text.parse::<Rule>().unwrap().with_algorithm(algorithm)
    }

    /// Evaluates `rules` at `now` for one unit and records it when they admit: whether they did.
    fn take(states: &mut RuleStates, rules: &[Rule], now: u64) -> bool {
        let mut out = vec![RuleOutcome::default(); rules.len()];
        let admits = states.evaluate(rules, now, 1, 0, &mut out);
        if admits {
            states.record(rules, &out, now, 1, 0);
        }
        admits
    }

    /// Outcomes asked for no units are what the rules say for none: settling leaves them,
    /// whatever the states hold (an evicted key that still owes time has none).
    #[test]
    fn outcomes_for_no_units_are_settled_already() {
        let rules = [rule("10/1m", Algorithm::SlidingLog)];
        let owed = RuleOutcome {
            allowed: true,
            remaining: 0,
            reset_after_us: 5 * S,
            retry_after_us: None,
        };
        let mut out = [owed];
        RuleStates::default().settle(&rules, 100 * S, 0, &mut out);
        assert_eq!(out, [owed]);
    }

    /// A sliding-window rule's counter is named as every rule's is.
    #[test]
    fn a_sliding_windows_counter_is_named_as_every_rules() {
        for text in ["10/1s", "3/1h", "60/1d"] {
            let r = rule(text, Algorithm::SlidingWindow);
            for place in [0, 1, 5] {
                assert!(
                    RuleId::sliding(place, &r) == RuleId::of(place, &r),
                    "{text} at {place}"
                );
            }
        }
    }

    /// Sliding windows count from the epoch's first window on (a manual clock may start
    /// there): no previous window to write.
    #[test]
    fn sliding_windows_count_in_the_epochs_first_window() {
        let rules = [rule("2/1h", Algorithm::SlidingWindow)];
        let mut states = RuleStates::default();
        assert!(take(&mut states, &rules, 1_000 * S));
        assert!(take(&mut states, &rules, 1_001 * S));
        assert!(!take(&mut states, &rules, 1_002 * S));
    }

    /// A limiter of one GCRA rule counts in its one counter, written in place, as the general
    /// walk over rules would.
    #[test]
    fn a_lone_gcra_rule_counts_in_one_counter() {
        let rules = [rule("2/1s", Algorithm::Gcra)];
        let mut states = RuleStates::default();
        assert!(take(&mut states, &rules, 10 * S));
        assert!(take(&mut states, &rules, 10 * S + 1));
        assert!(!take(&mut states, &rules, 10 * S + 2));
        assert_eq!(states.counters.len(), 1);
        // Two units taken at 10 s: the arrival time is a second on.
        assert_eq!(states.counters[0].a, 11 * S);
        assert!(RuleId::gcra(&rules[0]) == RuleId::of(0, &rules[0]));
        // Half a second later, one unit is back.
        assert!(take(&mut states, &rules, 10 * S + S / 2));
        assert!(!take(&mut states, &rules, 10 * S + S / 2 + 1));
    }

    /// A limiter that had other rules before keeps their counters until they run out, beside
    /// its GCRA rule's.
    #[test]
    fn a_lone_gcra_rule_sweeps_the_counters_of_former_rules() {
        let mut states = RuleStates::default();
        assert!(take(
            &mut states,
            &[rule("5/1m", Algorithm::FixedWindow)],
            10 * S
        ));
        let rules = [rule("2/1s", Algorithm::Gcra)];
        assert!(take(&mut states, &rules, 10 * S));
        assert_eq!(
            states.counters.len(),
            2,
            "the window's counter still counts"
        );
        assert!(take(&mut states, &rules, 100 * S));
        assert_eq!(states.counters.len(), 1, "the window ran out");
        assert_eq!(states.counters[0].a, 100 * S + S / 2);
    }

    /// A limiter of sliding logs only reads them without looking for counters: the same
    /// outcomes as with a counter beside them.
    #[test]
    fn sliding_logs_only_count_as_beside_other_rules() {
        let logs = [
            rule("2/1s", Algorithm::SlidingLog),
            rule("3/1m", Algorithm::SlidingLog),
        ];
        let mixed = [logs[0], logs[1], rule("100/1m", Algorithm::Gcra)];
        let (mut a, mut b) = (RuleStates::default(), RuleStates::default());
        for (i, now) in [0, 1, 2, S + 1, S + 2, 70 * S].into_iter().enumerate() {
            let now = 10 * S + now;
            let (mut out_a, mut out_b) = ([RuleOutcome::default(); 2], [RuleOutcome::default(); 3]);
            let admits = a.evaluate(&logs, now, 1, 0, &mut out_a);
            assert_eq!(
                admits,
                b.evaluate(&mixed, now, 1, 0, &mut out_b),
                "check {i}"
            );
            assert_eq!(out_a[..], out_b[..2], "check {i}");
            if admits {
                a.record(&logs, &out_a, now, 1, 0);
                b.record(&mixed, &out_b, now, 1, 0);
            }
        }
    }
}
