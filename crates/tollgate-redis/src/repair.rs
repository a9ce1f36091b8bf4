//! Repair after a failover (on with [`RedisStoreBuilder::repair`]): the store remembers what
//! its own recent admissions wrote (for as long as the horizon: the replication lag it can
//! lose) and, when it finds that Redis lost some of it, writes it again, idempotently
//! (`scripts/redo.lua`).
//!
//! What is remembered, per state key: a sliding log's members (named by each check's nonce,
//! so a member already there is that very admission and is not added twice); a counter's last
//! write (a fixed or sliding window's count in its window, a GCRA's tat), raised to again
//! with a max, which is idempotent. A counter so repaired counts at least what this instance
//! last saw; what other instances admitted on the new primary between the first and the last
//! instance's repair can be counted once too few for a counter (never for a log).
//!
//! When: after a failed call (the primary went away); when the store sees a new primary (a
//! watch looks every [`WATCH_EVERY`]: a new replication id on one server, a promoted replica
//! or a server restarted empty has one; a node newly serving slots as a primary on a
//! Cluster); and when a check finds a key behind this
//! instance's own writes (a log with fewer live entries than this instance recorded in it, a
//! window counting less than this instance added to it, a tat earlier than the one it
//! wrote; that check already ran against the key as it was). The repair runs in the
//! background; until a key is repaired, and while it settles, its checks fail at once.
//!
//! [`RedisStoreBuilder::repair`]: crate::RedisStoreBuilder::repair

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::{StreamExt as _, future::join_all, stream};
use tollgate::{Algorithm, CheckRequest, StoreError, StoreErrorKind, algorithm::RuleOutcome};

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};

use crate::{
    backend::Backend,
    batch::Lane,
    conn::Conn,
    script::{self, Record},
    shared::Inner,
};

/// The most state keys remembered; past it, new keys are not (a bound on memory).
const MAX_KEYS: usize = 100_000;
/// The most admissions remembered per sliding log; past it, the oldest are dropped.
const MAX_MEMBERS: usize = 10_000;
/// How many admissions between two sweeps of the keys no admission touches anymore.
const SWEEP_EVERY: u64 = 4_096;
/// How many redo.lua calls a repair has in flight at once.
const REPAIR_CALLS: usize = 64;
/// How often the watch reads the primaries' replication ids.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(250);

/// What a store remembers of its recent admissions, and its repairs.
pub(crate) struct Journal {
    horizon: Duration,
    keys: Mutex<HashMap<String, Remembered>>,
    learnt: AtomicU64,
    /// A repair is due: Redis may have lost writes (`pending` is not empty).
    suspect: AtomicBool,
    /// The keys still to write again; a check of one of them fails until it is.
    pending: Mutex<HashSet<String>>,
    /// The keys written again, until when their checks still fail: the other instances'
    /// time to write theirs (see [`Journal::new`]).
    settling: Mutex<HashMap<String, Instant>>,
    unsettled: AtomicBool,
    settle: Duration,
    /// A repair is running (in the background: one at a time, and no check waits for it).
    running: AtomicBool,
    runs: AtomicU64,
    rewritten: AtomicU64,
    /// The replication id of each watched lane's primary, as the watch last read it.
    primaries: Mutex<HashMap<Lane, String>>,
}

/// What one state key holds of this instance's admissions.
enum Remembered {
    /// A sliding log: the members this instance added.
    Log {
        members: VecDeque<Member>,
        /// Their units (costs), summed.
        units: u64,
        /// When the log's longest window has passed the newest member (server µs).
        deadline_us: i64,
    },
    /// A fixed window (op 2), a GCRA (op 3) or a sliding window (op 4): the last write.
    Counter {
        op: u8,
        a: i64,
        b: i64,
        deadline_us: i64,
        /// Units this instance added in window `a` (fixed and sliding windows).
        units: u64,
        at: Instant,
    },
}

/// One admission in a sliding log.
struct Member {
    at: Instant,
    nonce: [u8; 8],
    score: i64,
    cost: u64,
    retried: i64,
}

/// How many repairs a store ran, and how many state keys they changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repairs {
    /// Repairs run (each re-applies every remembered admission).
    pub runs: u64,
    /// State keys a repair found behind and wrote again.
    pub keys_rewritten: u64,
}

impl Journal {
    /// A journal of the last `horizon` of admissions. After a repair, a repaired key's checks
    /// fail for `settle` more: each instance writes back only its own admissions, and one
    /// that checked a key repaired by it alone could admit again what the others have not
    /// yet written back. `settle` gives them the time to notice (a failed call, the watch)
    /// and repair.
    pub(crate) fn new(horizon: Duration, settle: Duration) -> Journal {
        Journal {
            horizon,
            settling: Mutex::default(),
            unsettled: AtomicBool::new(false),
            settle,
            keys: Mutex::default(),
            learnt: AtomicU64::new(0),
            suspect: AtomicBool::new(false),
            pending: Mutex::default(),
            running: AtomicBool::new(false),
            runs: AtomicU64::new(0),
            rewritten: AtomicU64::new(0),
            primaries: Mutex::default(),
        }
    }

    /// Takes the replication id of `lane`'s primary as the watch read it: a repair is due
    /// when it changed (a promoted replica, a restarted server).
    fn saw_primary(&self, lane: Lane, id: String) {
        let mut known = self.primaries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(before) = known.insert(lane, id.clone())
            && before != id
        {
            drop(known);
            self.suspect(&[lane]);
        }
    }

    /// The lanes of the keys remembered: the server, or on a Cluster their slots (at most
    /// [`MAX_WATCHED`]).
    fn lanes(&self, cluster: bool) -> Vec<Lane> {
        let keys = self.keys();
        if keys.is_empty() {
            return Vec::new();
        }
        if !cluster {
            return vec![None];
        }
        let slots: HashSet<Slot> = keys.keys().map(Slot::for_key).collect();
        slots.into_iter().take(MAX_WATCHED).map(Some).collect()
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, Remembered>> {
        // Every step leaves the map consistent: a panic cannot leave half an entry.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn repairs(&self) -> Repairs {
        Repairs {
            runs: self.runs.load(Ordering::Relaxed),
            keys_rewritten: self.rewritten.load(Ordering::Relaxed),
        }
    }

    /// Redis may have lost writes in `lanes` (a call there failed, a new primary there):
    /// every remembered key of those lanes (`None`: the one server, every key) is to be
    /// written again before it is checked. Keys of other slots go on being checked.
    pub(crate) fn suspect(&self, lanes: &[Lane]) {
        let keys = self.keys();
        let mut pending = self.pending();
        // Every remembered key pending already (a whole server away): nothing to add, and
        // no walk of the keys per failed check.
        if pending.len() < keys.len() {
            let every = lanes.contains(&None);
            let lost = keys
                .keys()
                .filter(|k| every || lanes.contains(&Some(Slot::for_key(k.as_str()))));
            pending.extend(lost.cloned());
        }
        self.suspect.store(!pending.is_empty(), Ordering::Relaxed);
    }

    /// The lanes `plan`'s keys live in: on a Cluster, each limiter's slot; else the server.
    pub(crate) fn lanes_of(plan: &CheckRequest<'_>, cluster: bool) -> Vec<Lane> {
        if cluster {
            plan.limiters
                .iter()
                .map(|l| Some(Slot::for_key(l.key)))
                .collect()
        } else {
            vec![None]
        }
    }

    fn pending(&self) -> MutexGuard<'_, HashSet<String>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An error if one of `plan`'s keys still waits for its repair: checked against a
    /// promoted replica that lacks this store's writes, it could admit them again.
    pub(crate) fn ready(&self, plan: &CheckRequest<'_>, target: &str) -> Result<(), StoreError> {
        if !self.is_suspect() && !self.unsettled.load(Ordering::Relaxed) {
            return Ok(());
        }
        let now = Instant::now();
        let pending = self.pending();
        let mut settling = self.settling.lock().unwrap_or_else(|p| p.into_inner());
        settling.retain(|_, until| *until > now);
        self.unsettled
            .store(!settling.is_empty(), Ordering::Relaxed);
        for limiter in plan.limiters {
            for key in limiter.state_keys() {
                let why = if pending.contains(&key) {
                    "may have lost writes in a failover and is not yet repaired"
                } else if settling.contains_key(&key) {
                    "was repaired after a failover; the other instances are given time to repair it too"
                } else {
                    continue;
                };
                return Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    format!("check on {target}: {key:?} {why}"),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Relaxed)
    }

    /// Forgets what the journal holds of `plan`'s keys (a reset, a refund: a lower count
    /// there is no loss, and must not be raised again).
    pub(crate) fn forget(&self, plan: &CheckRequest<'_>) {
        let mut keys = self.keys();
        let mut pending = self.pending();
        for limiter in plan.limiters {
            for key in limiter.state_keys() {
                keys.remove(&key);
                pending.remove(&key);
            }
        }
    }

    /// Remembers what an admission wrote: `record`, the call's, over `plan`'s rules (whose
    /// outcomes are `outcomes`), with the check's `nonce` and cost; the call went to `lane`.
    /// Whether a key was found behind this instance's own writes (then a repair of that
    /// lane is due).
    pub(crate) fn learn(
        &self,
        lane: Lane,
        plan: &CheckRequest<'_>,
        (outcomes, limits): (&[RuleOutcome], &[(usize, u64)]),
        record: &Record,
        nonce: [u8; 8],
    ) -> bool {
        let now = Instant::now();
        let cost = plan.cost;
        let mut behind = false;
        let mut keys = self.keys();
        let mut writes = record.writes.iter();
        let mut outcomes_left = outcomes;
        // Where the limiter's rules start over the plan (the places of `limits`).
        let mut first = 0;
        for limiter in plan.limiters {
            let (mine, rest) = outcomes_left.split_at(limiter.rules.len().min(outcomes_left.len()));
            outcomes_left = rest;
            let place = first;
            first += limiter.rules.len();
            // The limit a rule counted by: an override's, or its own.
            let limit = |j: usize, rule: &tollgate::Rule| {
                tollgate::Verdict::limit_at(limits, place + j, rule.limit())
            };
            let writes: Vec<(i64, i64)> =
                writes.by_ref().take(limiter.rules.len()).copied().collect();
            if script::shadow_denies(limiter, mine) {
                continue;
            }
            let mut log_done = false;
            for (rule, &(a, b)) in limiter.rules.iter().zip(&writes) {
                let window_us = i64::try_from(rule.window_us()).unwrap_or(i64::MAX);
                let key = tollgate::key::rule_key(limiter.key, rule);
                let full = keys.len() >= MAX_KEYS;
                if rule.algorithm() == Algorithm::SlidingLog {
                    if log_done {
                        continue;
                    }
                    log_done = true;
                    let longest = limiter.log_window_us().unwrap_or(0);
                    let longest_i = i64::try_from(longest).unwrap_or(i64::MAX);
                    // The count before this check, over the longest window.
                    let before = limiter
                        .rules
                        .iter()
                        .zip(mine)
                        .enumerate()
                        .filter(|(_, (r, _))| r.algorithm() == Algorithm::SlidingLog)
                        .max_by_key(|(_, (r, _))| r.window_us())
                        .map_or(0, |(j, (r, o))| {
                            limit(j, r).saturating_sub(o.remaining).saturating_sub(cost)
                        });
                    let member = Member {
                        at: now,
                        nonce,
                        score: record.now,
                        cost,
                        retried: a,
                    };
                    let deadline_us = record.now.saturating_add(longest_i);
                    match keys.get_mut(&key) {
                        Some(Remembered::Log {
                            members,
                            units,
                            deadline_us: d,
                        }) => {
                            let edge = record.now.saturating_sub(longest_i);
                            while let Some(first) = members.front()
                                && (first.score <= edge
                                    || now - first.at > self.horizon
                                    || members.len() >= MAX_MEMBERS)
                            {
                                *units -= first.cost;
                                members.pop_front();
                            }
                            // This instance's live members alone are at least that many.
                            behind |= before < *units;
                            *units += member.cost;
                            members.push_back(member);
                            *d = deadline_us;
                        }
                        _ if full => {}
                        _ => {
                            keys.insert(
                                key,
                                Remembered::Log {
                                    units: member.cost,
                                    members: VecDeque::from([member]),
                                    deadline_us,
                                },
                            );
                        }
                    }
                    continue;
                }
                let (op, deadline_us) = match rule.algorithm() {
                    // The window's real end: a calendar month or a day of a DST change is not
                    // its nominal length, and a shorter deadline forgets the count early.
                    Algorithm::FixedWindow => match u64::try_from(a) {
                        Ok(start) => {
                            let end = rule.fixed_window_at(start).1;
                            (2, i64::try_from(end).unwrap_or(i64::MAX))
                        }
                        Err(_) => (2, a.saturating_add(window_us)),
                    },
                    Algorithm::SlidingWindow => {
                        (4, (a - a.rem_euclid(1000)).saturating_add(2 * window_us))
                    }
                    _ => (3, b),
                };
                let window = |v: i64| if op == 4 { v - v.rem_euclid(1000) } else { v };
                match keys.get_mut(&key) {
                    Some(Remembered::Counter {
                        a: last_a,
                        b: last_b,
                        deadline_us: d,
                        units,
                        at,
                        ..
                    }) => {
                        let recent = now - *at <= self.horizon;
                        // What this check wrote, or, when Redis lost what this instance wrote
                        // before, that plus this check: what the key should hold.
                        let mut should = b;
                        if op == 3 {
                            // The tat before this check is at least the one this instance
                            // wrote last, unless Redis lost it.
                            if recent && *last_b > a {
                                behind = true;
                                should = last_b.saturating_add(b - a);
                            }
                        } else if window(*last_a) == window(a) {
                            *units += cost;
                            let units = i64::try_from(*units).unwrap_or(i64::MAX);
                            if recent && b < units {
                                behind = true;
                                should = units;
                            }
                        } else {
                            *units = cost;
                        }
                        (*last_a, *last_b, *d, *at) = (a, should, deadline_us, now);
                    }
                    _ if full => {}
                    _ => {
                        keys.insert(
                            key,
                            Remembered::Counter {
                                op,
                                a,
                                b,
                                deadline_us,
                                units: cost,
                                at: now,
                            },
                        );
                    }
                }
            }
        }
        if self.learnt.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.sweep(&mut keys, now);
        }
        drop(keys);
        if behind {
            self.suspect(&[lane]);
        }
        behind
    }

    /// Drops what has passed the horizon.
    fn sweep(&self, keys: &mut HashMap<String, Remembered>, now: Instant) {
        keys.retain(|_, remembered| match remembered {
            Remembered::Log { members, units, .. } => {
                while let Some(first) = members.front()
                    && now - first.at > self.horizon
                {
                    *units -= first.cost;
                    members.pop_front();
                }
                !members.is_empty()
            }
            Remembered::Counter { at, .. } => now - *at <= self.horizon,
        });
        // Pending keys are remembered keys (`suspect` counts on it).
        self.pending().retain(|key| keys.contains_key(key));
    }

    /// Starts the repair of `inner`'s store in the background if one is due and none runs.
    /// No check waits for it: until a key is repaired its checks fail at once (see
    /// [`ready`](Self::ready)), so a check stays within the store's timeout even while Redis
    /// is away and every attempt fails. A failed repair stays due; the next check starts it
    /// again.
    pub(crate) fn kick(inner: &Arc<Inner>) {
        let Some(journal) = &inner.journal else {
            return;
        };
        if !journal.is_suspect() || journal.running.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lets the next repair start however this one ends.
        struct Done(Arc<Inner>);
        impl Drop for Done {
            fn drop(&mut self) {
                if let Some(journal) = &self.0.journal {
                    journal.running.store(false, Ordering::Release);
                }
            }
        }
        let done = Done(inner.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Some(journal) = &done.0.journal {
                        let _ = journal.repair(&done.0.backend).await;
                    }
                });
            }
            Err(_) => drop(done),
        }
    }

    /// Writes every pending key's remembered admissions again (`scripts/redo.lua`, one call
    /// per key, [`REPAIR_CALLS`] at once, each within the store's timeout); a key whose call
    /// fails stays pending.
    async fn repair(&self, backend: &Backend) -> Result<(), StoreError> {
        let now = Instant::now();
        let calls: Vec<_> = {
            let mut keys = self.keys();
            self.sweep(&mut keys, now);
            let mut pending = self.pending();
            // A key forgotten since (passed the horizon, reset, refunded) needs nothing.
            pending.retain(|key| keys.contains_key(key));
            pending
                .iter()
                .filter_map(|key| Some((key.clone(), redo(backend, key, keys.get(key)?))))
                .collect()
        };
        self.runs.fetch_add(1, Ordering::Relaxed);
        // At most REPAIR_CALLS at once: a repair of many keys must not bury the new primary.
        let calls: Vec<_> = calls
            .into_iter()
            .map(|(key, call)| redo_call(backend, key, call))
            .collect();
        let replies: Vec<_> = stream::iter(calls)
            .buffer_unordered(REPAIR_CALLS)
            .collect()
            .await;
        let mut first_error = None;
        let mut pending = self.pending();
        let mut settling = self.settling.lock().unwrap_or_else(|p| p.into_inner());
        let until = Instant::now() + self.settle;
        for (key, changed) in replies {
            match changed {
                Ok(changed) => {
                    pending.remove(&key);
                    settling.insert(key, until);
                    self.unsettled.store(true, Ordering::Relaxed);
                    self.rewritten
                        .fetch_add(u64::try_from(changed).unwrap_or(0), Ordering::Relaxed);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.suspect.store(!pending.is_empty(), Ordering::Relaxed);
        first_error.map_or(Ok(()), Err)
    }
}

/// Runs one redo.lua call within the store's timeout: the key and whether it changed.
async fn redo_call(
    backend: &Backend,
    key: String,
    call: crate::conn::Call<'_>,
) -> (String, Result<i64, StoreError>) {
    let mut conn = backend.conn();
    let changed = backend
        .bounded("repair", call.invoke::<i64>(&mut conn))
        .await;
    (key, changed)
}

/// The redo.lua call that writes `remembered` into `key` again.
fn redo<'a>(backend: &'a Backend, key: &str, remembered: &Remembered) -> crate::conn::Call<'a> {
    let mut call = backend.scripts.redo.call();
    call.key(key).arg(backend.now_arg());
    match remembered {
        Remembered::Log {
            members,
            deadline_us,
            ..
        } => {
            call.arg(1).arg(deadline_us).arg(members.len());
            for m in members {
                call.arg(&m.nonce[..])
                    .arg(m.score)
                    .arg(m.cost)
                    .arg(m.retried);
            }
        }
        Remembered::Counter {
            op,
            a,
            b,
            deadline_us,
            ..
        } => {
            call.arg(op);
            if *op == 3 {
                call.arg(b).arg(0).arg(deadline_us);
            } else {
                call.arg(a).arg(b).arg(deadline_us);
            }
        }
    }
    call
}

/// Watches a store's primaries for as long as the store lives: every [`WATCH_EVERY`], the
/// replication id of the primary holding each key the journal remembers (one server's, or on
/// a Cluster each remembered slot's primary, asked through the slot, so the store's own
/// routing finds a promoted replica); a new one makes a repair due. Started by the builder
/// with repair on.
pub(crate) async fn watch(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let Some(inner) = inner.upgrade() else { return };
        let Some(journal) = &inner.journal else {
            return;
        };
        let lanes = journal.lanes(inner.backend.is_cluster());
        let reads = join_all(lanes.into_iter().map(|lane| {
            let backend = &inner.backend;
            async move { (lane, replication_id(backend, lane).await) }
        }))
        .await;
        for (lane, read) in reads {
            // A read that fails (a primary down) changes nothing: the failed checks say it.
            if let Ok(Some(id)) = read {
                journal.saw_primary(lane, id);
            }
        }
    }
}

/// The most slots the watch asks about per round.
const MAX_WATCHED: usize = 64;

/// The replication id of the primary serving `lane` (a Cluster's slot; `None`: the server).
async fn replication_id(backend: &Backend, lane: Lane) -> Result<Option<String>, StoreError> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    let info: String = match (&backend.conn, lane) {
        (Conn::Cluster(conn), Some(slot)) => {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                Route::with_slot(slot, SlotAddr::Master),
            ));
            let mut conn = conn.clone();
            let value = backend
                .bounded("INFO replication", conn.route_command(cmd, route))
                .await?;
            redis::from_redis_value(value)
                .map_err(|e| backend.redis_error("INFO replication", e.into()))?
        }
        _ => {
            let mut conn = backend.conn();
            backend
                .bounded("INFO replication", cmd.query_async(&mut conn))
                .await?
        }
    };
    Ok(info
        .lines()
        .find_map(|l| l.trim().strip_prefix("master_replid:"))
        .map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use tollgate::{LimiterRequest, Rule};

    use super::*;

    fn outcome(remaining: u64) -> RuleOutcome {
        RuleOutcome {
            allowed: true,
            remaining,
            reset_after_us: 0,
            retry_after_us: None,
        }
    }

    /// One admission of cost 1 into `rule` of limiter `key`: the record `(a, b)` and the
    /// remaining count the script answered.
    fn learn(journal: &Journal, rule: Rule, now: i64, write: (i64, i64), remaining: u64) -> bool {
        learn_by(journal, (rule, None), now, write, remaining)
    }

    /// [`learn`], the script having counted by `limit` (an override's) when given.
    fn learn_by(
        journal: &Journal,
        (rule, limit): (Rule, Option<u64>),
        now: i64,
        write: (i64, i64),
        remaining: u64,
    ) -> bool {
        let rules = [rule];
        let limiters = [LimiterRequest {
            key: "tg:{k}",
            compact: &[],
            rules: &rules,
            ban: None,
            shadow: false,
            overrides: None,
        }];
        let plan = CheckRequest::new(1, true, &limiters);
        let record = Record {
            now,
            writes: vec![write],
        };
        let limits: Vec<(usize, u64)> = limit.map(|l| (0, l)).into_iter().collect();
        journal.learn(
            None,
            &plan,
            (&[outcome(remaining)], &limits),
            &record,
            rand::random(),
        )
    }

    /// A calendar month's counter is remembered, and rewritten, until the month ends: its
    /// nominal 30 days would forget it a day early in January.
    #[test]
    fn a_calendar_windows_counter_lasts_to_the_windows_real_end() {
        let journal = Journal::new(Duration::from_secs(60), Duration::ZERO);
        let month: Rule = "1000/1mo@UTC".parse().unwrap();
        // 2027-01-01T00:00Z; NOW is in the middle of January.
        let start = 1_798_761_600_000_000;
        assert!(!learn(&journal, month, NOW, (start, 1), 999));
        let key = tollgate::key::rule_key("tg:{k}", &month);
        let keys = journal.keys();
        let Some(Remembered::Counter { deadline_us, .. }) = keys.get(&key) else {
            panic!("the counter is remembered under {key}");
        };
        // 2027-02-01T00:00Z.
        assert_eq!(*deadline_us, 1_801_440_000_000_000);
    }

    #[test]
    fn a_log_counted_by_an_override_is_weighed_by_its_limit() {
        let journal = Journal::new(Duration::from_secs(60), Duration::ZERO);
        let rule: Rule = "10/1h".parse().unwrap();
        // Counted by 100 (an override), this store's admissions alone: never behind.
        for i in 0..20 {
            let remaining = 100 - u64::try_from(i).unwrap() - 1;
            assert!(!learn_by(
                &journal,
                (rule, Some(100)),
                NOW + i,
                (0, 0),
                remaining
            ));
        }
        assert!(!journal.is_suspect());
    }

    const NOW: i64 = 1_800_000_000_000_000;

    #[test]
    fn a_log_behind_this_stores_own_members_is_found() {
        let journal = Journal::new(Duration::from_secs(60), Duration::ZERO);
        let rule: Rule = "100/1h".parse().unwrap();
        for i in 0..5 {
            // Others' admissions too: the count before grows faster than this store's own.
            assert!(!learn(
                &journal,
                rule,
                NOW + i,
                (0, 0),
                100 - 2 * u64::try_from(i).unwrap() - 1
            ));
        }
        assert!(!journal.is_suspect());
        // The log now holds 2 before this check: fewer than this store's own 5.
        assert!(learn(&journal, rule, NOW + 10, (0, 0), 100 - 2 - 1));
        assert!(journal.is_suspect(), "every remembered key is pending");
    }

    #[test]
    fn a_counter_behind_this_stores_own_writes_is_found() {
        let journal = Journal::new(Duration::from_secs(60), Duration::ZERO);
        let fixed = "100/1h"
            .parse::<Rule>()
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow);
        let start = NOW - 10;
        // Counts written 1, 2, 3 in one window; then a write of 1 in the same window.
        for count in 1..=3 {
            assert!(!learn(&journal, fixed, NOW, (start, count), 0));
        }
        assert!(
            learn(&journal, fixed, NOW, (start, 1), 0),
            "the window lost 3"
        );
        // A new window starts over.
        let journal = Journal::new(Duration::from_secs(60), Duration::ZERO);
        assert!(!learn(&journal, fixed, NOW, (start, 3), 0));
        assert!(!learn(&journal, fixed, NOW, (start + 3_600_000_000, 1), 0));
        // GCRA: the tat before this check is earlier than the one this store wrote.
        let gcra = "100/1h"
            .parse::<Rule>()
            .unwrap()
            .with_algorithm(Algorithm::Gcra);
        let journal = Journal::new(Duration::from_secs(60), Duration::ZERO);
        assert!(!learn(&journal, gcra, NOW, (NOW, NOW + 36_000_000), 0));
        assert!(!learn(
            &journal,
            gcra,
            NOW,
            (NOW + 36_000_000, NOW + 72_000_000),
            0
        ));
        assert!(learn(&journal, gcra, NOW, (NOW, NOW + 36_000_000), 0));
    }

    #[test]
    fn a_failure_in_one_slot_holds_back_that_slots_keys_only() {
        let journal = Journal::new(Duration::from_secs(60), Duration::ZERO);
        let rules: [Rule; 1] = ["100/1h".parse().unwrap()];
        let limiter = |key| LimiterRequest {
            key,
            compact: &[],
            rules: &rules,
            ban: None,
            shadow: false,
            overrides: None,
        };
        let (a, b) = ([limiter("tg:{a}")], [limiter("tg:{b}")]);
        let (plan_a, plan_b) = (
            CheckRequest::new(1, true, &a),
            CheckRequest::new(1, true, &b),
        );
        let (slot_a, slot_b) = (Slot::for_key("tg:{a}"), Slot::for_key("tg:{b}"));
        assert_ne!(slot_a, slot_b);
        let record = Record {
            now: NOW,
            writes: vec![(0, 0)],
        };
        for (lane, plan) in [(slot_a, &plan_a), (slot_b, &plan_b)] {
            assert!(!journal.learn(
                Some(lane),
                plan,
                (&[outcome(99)], &[]),
                &record,
                rand::random()
            ));
        }
        journal.suspect(&Journal::lanes_of(&plan_a, true));
        assert!(
            journal.ready(&plan_a, "t").is_err(),
            "slot a waits for its repair"
        );
        assert!(journal.ready(&plan_b, "t").is_ok(), "slot b goes on");
        // On one server, a failure holds back every key.
        journal.suspect(&Journal::lanes_of(&plan_b, false));
        assert!(journal.ready(&plan_b, "t").is_err());
        // A forgotten key (reset, refund) waits for nothing.
        journal.forget(&plan_b);
        assert!(journal.ready(&plan_b, "t").is_ok());
    }

    #[test]
    fn a_log_remembers_at_most_max_members() {
        let journal = Journal::new(Duration::from_secs(60), Duration::ZERO);
        let rule: Rule = "100000/1h".parse().unwrap();
        for i in 0..MAX_MEMBERS + 5 {
            let before = u64::try_from(i).unwrap();
            learn(
                &journal,
                rule,
                NOW + i64::try_from(i).unwrap(),
                (0, 0),
                100_000 - before - 1,
            );
        }
        let keys = journal.keys();
        let Some(Remembered::Log { members, units, .. }) = keys.values().next() else {
            panic!("a log");
        };
        assert_eq!((members.len(), *units), (MAX_MEMBERS, MAX_MEMBERS as u64));
    }
}
