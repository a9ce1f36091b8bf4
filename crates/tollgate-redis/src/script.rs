//! The scripts: how a [`CheckRequest`] becomes one EVALSHA and its reply a [`Verdict`]; the
//! guard scripts (locks, bans) and their replies.

use std::{fmt, time::Duration};

use redis::Value;
use tollgate::{
    Algorithm, CheckRequest, HeldLock, LimiterRequest, LockReply, Outcomes, PageCursor, Receipt,
    Rule, StoreError, StoreErrorKind, Verdict, algorithm::RuleOutcome, key,
};

use crate::conn::{Call, Lua};

/// check.lua; its header lists KEYS, ARGV and the reply.
const CHECK: &str = include_str!("../scripts/check.lua");
/// The head of every guard script (time, TTLs).
const PRELUDE: &str = include_str!("../scripts/prelude.lua");

/// The parts scripts splice in with a line `--@include <name>`: one source for what several
/// scripts share.
const PARTS: [(&str, &str); 4] = [
    ("common.lua", include_str!("../scripts/common.lua")),
    ("prelude.lua", PRELUDE),
    ("ban_writer.lua", include_str!("../scripts/ban_writer.lua")),
    ("index.lua", include_str!("../scripts/index.lua")),
];

/// `source` with each `--@include <name>` line replaced by that part (itself assembled).
///
/// # Panics
/// On an unknown part: the sources are the crate's own, and a test assembles them all.
fn assemble(source: &str) -> String {
    let mut out = String::with_capacity(source.len() * 2);
    for line in source.split_inclusive('\n') {
        match line.trim_end().strip_prefix("--@include ") {
            Some(name) => {
                let Some((_, part)) = PARTS.iter().find(|(n, _)| *n == name) else {
                    panic!("tollgate-redis: no Lua part {name:?}");
                };
                out.push_str(&assemble(part));
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
            None => out.push_str(line),
        }
    }
    out
}

/// A guard script: the shared prelude (time, TTLs) and the body, assembled.
fn guard(body: &str) -> Lua {
    Lua::new(assemble(&format!("{PRELUDE}\n{body}")))
}

/// The text of one of `scripts/`.
macro_rules! lua_file {
    ($file:literal) => {
        include_str!(concat!("../scripts/", $file))
    };
}

/// Integers above this are not exact in Lua's doubles.
const MAX_EXACT: u64 = 1 << 53;

/// A page cursor's end as index.lua reads it: `inf` for never (`u64::MAX`), else in µs, no
/// later than Lua counts exactly. A later end (past the year 2255, where no entry ends) lists
/// what it would: every entry that ends later, those that never end.
pub(crate) fn cursor_end(cursor: &PageCursor) -> String {
    match cursor.until_us() {
        u64::MAX => "inf".to_owned(),
        until => until.min(MAX_EXACT - 1).to_string(),
    }
}

/// Every script the store runs (EVALSHA, and EVAL on NOSCRIPT: see [`Call::invoke`]).
pub(crate) struct Scripts {
    pub(crate) check: Lua,
    pub(crate) lock_acquire: Lua,
    pub(crate) lock_release: Lua,
    pub(crate) lock_complete: Lua,
    pub(crate) ban: Lua,
    pub(crate) unban: Lua,
    /// One page of the blocklist.
    pub(crate) bans: Lua,
    /// How many bans are live, from the index.
    pub(crate) ban_count: Lua,
    /// Give units back (`scripts/refund.lua`).
    pub(crate) refund: Lua,
    /// Write a remembered admission again after a failover (`scripts/redo.lua`).
    pub(crate) redo: Lua,
    /// Cluster only: reverse a slot's reservation (`scripts/undo.lua`).
    pub(crate) undo: Lua,
    /// Cluster only: read the identity's bans beside the limiters' slots.
    pub(crate) banned: Lua,
    /// Cluster only: ban the offender after a denial.
    pub(crate) offend: Lua,
    /// Cluster only: add bans to and remove them from the index, in its own slot.
    pub(crate) ban_index: Lua,
    /// Set, remove and list per-identity overrides (`scripts/override.lua`).
    pub(crate) overrides: Lua,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            check: Lua::new(assemble(CHECK)),
            lock_acquire: guard(lua_file!("lock_acquire.lua")),
            lock_release: guard(lua_file!("lock_release.lua")),
            lock_complete: guard(lua_file!("lock_complete.lua")),
            ban: guard(lua_file!("ban.lua")),
            unban: guard(lua_file!("unban.lua")),
            bans: guard(lua_file!("bans.lua")),
            ban_count: guard(lua_file!("ban_count.lua")),
            refund: guard(lua_file!("refund.lua")),
            redo: guard(lua_file!("redo.lua")),
            undo: guard(lua_file!("undo.lua")),
            banned: guard(lua_file!("banned.lua")),
            offend: guard(lua_file!("offend.lua")),
            ban_index: guard(lua_file!("ban_index.lua")),
            overrides: guard(lua_file!("override.lua")),
        }
    }

    /// The scripts every deployment loads up front.
    pub(crate) fn standalone(&self) -> [&Lua; 10] {
        [
            &self.check,
            &self.refund,
            &self.redo,
            &self.lock_acquire,
            &self.lock_release,
            &self.lock_complete,
            &self.ban,
            &self.unban,
            &self.bans,
            &self.ban_count,
        ]
    }

    /// The scripts only a Cluster store runs.
    pub(crate) fn cluster(&self) -> [&Lua; 4] {
        [&self.undo, &self.banned, &self.offend, &self.ban_index]
    }
}

/// The first argument of every guard script: the test clock's time, or empty for `TIME`.
pub(crate) fn now_arg(now_us: Option<u64>) -> String {
    now_us.map(|t| t.to_string()).unwrap_or_default()
}

pub(crate) fn protocol(what: &str, why: impl fmt::Display) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("{what} script reply: {why}"),
    )
}

/// Reads the lock-acquire reply: `{1}`, or `{0, completed, ttl_left_us, fingerprint, response}`.
pub(crate) fn lock_reply(reply: &[Value]) -> Result<LockReply, StoreError> {
    let bad = |why: &str| protocol("lock", format!("{why}: {reply:?}"));
    match reply {
        [Value::Int(1)] => Ok(LockReply::Acquired),
        [
            Value::Int(0),
            Value::Int(completed),
            Value::Int(ttl),
            fingerprint,
            response,
        ] => Ok(LockReply::Held(HeldLock {
            completed: *completed == 1,
            ttl_left_us: u64::try_from(*ttl).map_err(|_| bad("negative ttl"))?,
            fingerprint: match fingerprint {
                Value::BulkString(b) => {
                    String::from_utf8(b.clone()).map_err(|_| bad("the fingerprint is not text"))?
                }
                _ => return Err(bad("no fingerprint")),
            },
            response: match response {
                Value::BulkString(b) => Some(b.clone()),
                Value::Nil => None,
                _ => return Err(bad("a response that is not bytes")),
            },
        })),
        _ => Err(bad("unexpected shape")),
    }
}

/// Appends the plan's keys and arguments to `invocation` (see the header of check.lua): one
/// check of the call.
///
/// `now_us` overrides the server's `TIME` (tests only); `nonce` makes this check's sliding-log
/// members unique; `report` is `None` but for one slot of a Cluster check over several.
pub(crate) fn prepare(
    invocation: &mut Call<'_>,
    plan: &CheckRequest<'_>,
    now_us: Option<u64>,
    nonce: [u8; 8],
    report: Option<Report>,
) -> Result<(), StoreError> {
    let mut packed = Packed::new(nonce, plan);
    match now_us {
        Some(now) => packed.int("test clock time", now)?,
        None => packed.push(-1),
    }
    packed.int("cost", plan.cost)?;
    // The consume flag, and above it how long the request may wait.
    let delay = plan.delay_us.min(MAX_EXACT / 4);
    packed.int("consume and delay", u64::from(plan.consume) | delay << 1)?;
    packed.count(plan.limiters.len());
    for limiter in plan.limiters {
        if limiter.overrides.is_some() {
            invocation.key(key::override_key(limiter.key));
        }
        invocation.key(limiter.state_keys());
        packed.count(limiter.rules.len());
        packed.int("window", limiter.log_window_us().unwrap_or(0))?;
        // A shadow limiter bans nobody; 4 more: the limiter takes overrides.
        let flags = match (limiter.shadow, limiter.ban) {
            (true, _) => 2,
            (false, ban) => i64::from(ban.is_some()),
        };
        packed.push(flags + if limiter.overrides.is_some() { 4 } else { 0 });
        if let Some(ban) = limiter.ban.filter(|_| !limiter.shadow) {
            packed.int("ban duration", micros(ban.duration()))?;
            packed.int("ban factor", u64::from(ban.factor()))?;
            packed.int("ban cap", micros(ban.cap()))?;
        }
        if let Some(fingerprint) = limiter.overrides {
            packed.int("rules fingerprint", fingerprint.get())?;
        }
        for rule in limiter.rules.iter() {
            packed.push(rule_code(rule)?);
            packed.int("rule limit", rule.limit())?;
            packed.int("rule window", rule.window_us())?;
            if let Some(bounds) = calendar_bounds(rule, now_us) {
                for bound in bounds {
                    packed.int("calendar window", bound)?;
                }
            }
        }
    }
    packed.count(plan.bans.len());
    for ban in plan.bans {
        invocation.key(ban.key);
    }
    // The targets and the ban index only matter to a check that may write a ban: the others
    // only read the ban keys, and spare the server two arguments per target and a key.
    let writes_bans = plan.may_ban();
    packed.flag(writes_bans);
    packed.push(report.map_or(0, |r| r as i64));
    invocation.arg(packed.0);
    if writes_bans {
        // A ban key that is only read has no target: the ban writer passes it by.
        for ban in plan.bans {
            if ban.write {
                invocation.arg(ban.kind).arg(ban.value);
            } else {
                invocation.arg("").arg("");
            }
        }
        invocation.key(plan.ban_index);
    }
    Ok(())
}

/// check.lua's first argument: the nonce, then little-endian signed 64-bit integers, which
/// one `struct.unpack` reads on the server (text numbers would each cost an argument and a
/// `tonumber`).
struct Packed(Vec<u8>);

impl Packed {
    fn new(nonce: [u8; 8], plan: &CheckRequest<'_>) -> Packed {
        let ints = 7 + 6 * plan.limiters.len() + 3 * plan.rule_count();
        let mut bytes = Vec::with_capacity(8 + 8 * ints);
        bytes.extend_from_slice(&nonce);
        Packed(bytes)
    }

    fn push(&mut self, value: i64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// A value Lua's doubles hold exactly (below 2^53), or a protocol error naming it.
    fn int(&mut self, what: &str, value: u64) -> Result<(), StoreError> {
        match i64::try_from(value) {
            Ok(v) if value < MAX_EXACT => {
                self.push(v);
                Ok(())
            }
            _ => Err(too_large(what, value)),
        }
    }

    fn count(&mut self, n: usize) {
        self.push(i64::try_from(n).unwrap_or(i64::MAX));
    }

    fn flag(&mut self, on: bool) {
        self.push(i64::from(on));
    }
}

/// A duration in µs as the scripts take it: whole, and below 2^53 (a longer ban is a
/// century-long ban anyway).
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).map_or(MAX_EXACT - 1, |us| us.min(MAX_EXACT - 1))
}

fn too_large(what: &str, value: u64) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("{what} {value} is too large for the Redis store (the most is 2^53 - 1)"),
    )
}

/// What refund.lua does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adjust {
    /// Gives units back (`RefundStore::refund`).
    Refund,
    /// Renews the receipt's leases (`RefundStore::extend`).
    Extend,
    /// Charges units past the limits (`RefundStore::charge`).
    Charge,
}

/// Prepares refund.lua for the limiters `members` of `plan` (all in one slot), as the receipt
/// says and `mode` asks; false if none of them is concerned. With a `marker` (a fresh id for
/// the call, and how long its marker lasts in ms: see `once()` in `scripts/prelude.lua`),
/// Redis runs the call once however often it is sent.
pub(crate) fn prepare_refund(
    call: &mut Call<'_>,
    plan: &CheckRequest<'_>,
    (members, marker): (impl IntoIterator<Item = usize>, Option<(u64, u64)>),
    receipt: Option<&Receipt>,
    now_us: Option<u64>,
    mode: Adjust,
) -> Result<bool, StoreError> {
    call.arg(now_arg(now_us)).arg(plan.cost);
    match receipt {
        Some(receipt) => call.arg(&receipt.id().to_be_bytes()[..]),
        // A charge's log members: a fresh nonce's.
        None if mode == Adjust::Charge => call.arg(&rand::random::<[u8; 8]>()[..]),
        None => call.arg(""),
    };
    call.arg(match mode {
        Adjust::Refund => "0",
        Adjust::Extend => "1",
        Adjust::Charge => "2",
    })
    .arg(marker.map_or(0, |(_, ttl_ms)| ttl_ms));
    let mut base = None;
    for i in members {
        let limiter = &plan.limiters[i];
        let at = match receipt.map(|r| r.at_us(i)) {
            // A charge: the most entries the log may hold.
            None if mode == Adjust::Charge => limiter
                .rules
                .iter()
                .filter(|r| r.algorithm() == Algorithm::SlidingLog)
                .map(|r| r.limit().saturating_mul(2).min(MAX_EXACT) as i64)
                .max()
                .unwrap_or(0),
            None => -1,
            Some(None) => continue,
            Some(Some(at)) => i64::try_from(at)
                .ok()
                .filter(|&at| at.unsigned_abs() < MAX_EXACT)
                .ok_or_else(|| protocol("refund", "a receipt time out of range"))?,
        };
        base.get_or_insert(limiter.key);
        if limiter.overrides.is_some() {
            call.key(key::override_key(limiter.key));
        }
        call.key(limiter.state_keys());
        call.arg(limiter.rules.len())
            .arg(limiter.log_window_us().unwrap_or(0))
            .arg(at)
            .arg(limiter.overrides.map_or(0, std::num::NonZeroU64::get));
        // Where the limiter's rules start among the plan's (a receipt names limits by place).
        let first = plan.limiters[..i]
            .iter()
            .map(|l| l.rules.len())
            .sum::<usize>();
        for (place, rule) in (first..).zip(limiter.rules.iter()) {
            // A refund by a receipt: the limit its check counted by, which refund.lua gives
            // back by where it is above the one in force (see `RefundStore::refund`); 0: none.
            let counted = match (mode, receipt) {
                (Adjust::Refund, Some(receipt)) => receipt.counted_limit(place, rule.limit()),
                _ => 0,
            };
            call.arg(rule_code(rule)?)
                .arg(rule.limit())
                .arg(rule.window_us())
                .arg(counted);
            // Around the check's instant: the window its units were counted in.
            let around = match mode {
                Adjust::Charge => now_us,
                _ => u64::try_from(at).ok().or(now_us),
            };
            if let Some(bounds) = calendar_bounds(rule, around) {
                for bound in bounds {
                    call.arg(bound);
                }
            }
        }
    }
    if let (Some(base), Some((id, _))) = (base, marker) {
        call.key(key::applied_key(base, id));
    }
    Ok(base.is_some())
}

/// check.lua's code of a rule: its algorithm's, or 5 for a calendar window.
fn rule_code(rule: &Rule) -> Result<i64, StoreError> {
    match rule.calendar_window() {
        Some(_) => Ok(5),
        None => algorithm_code(rule.algorithm()),
    }
}

/// A calendar window's boundaries around `at_us` (the test clock's, else this machine's now):
/// the starts of the window before, of the window holding it, of the next, and the next one's
/// end. The script picks the window holding the server's own time among the three, so the
/// store keeps one clock while Lua, which knows no time zones, gets the calendar's answer.
fn calendar_bounds(rule: &Rule, at_us: Option<u64>) -> Option<[u64; 4]> {
    rule.calendar_window()?;
    let at = at_us.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    });
    let (start, end) = rule.fixed_window_at(at);
    let (before, _) = rule.fixed_window_at(start.saturating_sub(1));
    let (_, after) = rule.fixed_window_at(end);
    Some([before, start, end, after])
}

fn algorithm_code(algorithm: Algorithm) -> Result<i64, StoreError> {
    match algorithm {
        Algorithm::SlidingLog => Ok(1),
        Algorithm::FixedWindow => Ok(2),
        Algorithm::Gcra => Ok(3),
        Algorithm::SlidingWindow => Ok(4),
        other => Err(StoreError::new(
            StoreErrorKind::Protocol,
            format!("the Redis store does not implement the {other} algorithm"),
        )),
    }
}

/// The one reply of a check.lua call that held one check.
pub(crate) fn only_reply(mut replies: Vec<Vec<i64>>) -> Result<Vec<i64>, StoreError> {
    if replies.len() != 1 {
        return Err(protocol(
            "check",
            format!("{} replies to one check", replies.len()),
        ));
    }
    Ok(replies.swap_remove(0))
}

/// Reads the script's reply: `allowed`, `blocked_us`, `banned_us`, then four integers per rule.
/// `id` is the check's nonce, for the receipt of a recorded admission.
pub(crate) fn verdict(
    plan: &CheckRequest<'_>,
    reply: &[i64],
    id: u64,
) -> Result<Verdict, StoreError> {
    let rules = plan.rule_count();
    let bad = |why: &str| {
        StoreError::new(
            StoreErrorKind::Protocol,
            format!(
                "check script reply ({} integers for {rules} rules): {why}",
                reply.len()
            ),
        )
    };
    let [allowed, blocked, banned, outcomes @ ..] = reply else {
        return Err(bad("too short"));
    };
    let optional = |v: i64| match v {
        -1 => Ok(None),
        v => u64::try_from(v)
            .map(Some)
            .map_err(|_| bad("a negative duration")),
    };
    if let Some(blocked) = optional(*blocked)? {
        if *allowed != 0 || !outcomes.is_empty() {
            return Err(bad("blocked, yet rules were evaluated"));
        }
        return Ok(Verdict::blocked(blocked));
    }
    // A recorded admission ends with the script's now.
    let (outcomes, recorded_at) = match outcomes.len() {
        n if n == rules * 4 => (outcomes, None),
        n if n == rules * 4 + 1 => (&outcomes[..n - 1], Some(outcomes[n - 1])),
        _ => return Err(bad("wrong length")),
    };
    let mut limits = Vec::new();
    let outcomes = read_outcomes(outcomes, &mut limits, &bad)?;
    let allowed = flag(*allowed, &bad)?;
    let enforced_admit = plan
        .limiters
        .iter()
        .zip(per_limiter(plan.limiters, &outcomes))
        .all(|(l, outcomes)| l.shadow || outcomes.iter().all(|o| o.allowed));
    if allowed != enforced_admit {
        return Err(bad("the overall flag disagrees with the rules"));
    }
    let mut verdict = Verdict::new(allowed, outcomes);
    verdict.limits = limits;
    verdict.banned_us = optional(*banned)?;
    if let Some(at) = recorded_at {
        let at = u64::try_from(at).map_err(|_| bad("a negative record time"))?;
        if !allowed {
            return Err(bad("a record time without an admission"));
        }
        verdict.receipt = Some(receipt(plan, &verdict.rules, at, id));
    }
    Ok(verdict)
}

/// The receipt of an admission recorded at `at` (the script's now) with nonce `id`: every
/// limiter but the shadow ones that would deny (they recorded nothing).
pub(crate) fn receipt(
    plan: &CheckRequest<'_>,
    outcomes: &[RuleOutcome],
    at: u64,
    id: u64,
) -> Receipt {
    let at = per_limiter(plan.limiters, outcomes)
        .zip(plan.limiters)
        .map(|(mine, l)| {
            if shadow_denies(l, mine) {
                Receipt::NOT_RECORDED
            } else {
                at
            }
        });
    Receipt::per_limiter(at, id, plan.cost)
}

/// Each limiter's slice of `outcomes` (one per rule, `limiters` in order).
pub(crate) fn per_limiter<'o>(
    limiters: &'o [LimiterRequest<'_>],
    outcomes: &'o [RuleOutcome],
) -> impl Iterator<Item = &'o [RuleOutcome]> {
    let mut rest = outcomes;
    limiters.iter().map(move |l| {
        let (mine, others) = rest.split_at(l.rules.len().min(rest.len()));
        rest = others;
        mine
    })
}

/// Whether `limiter`, with these outcomes of its rules, is a shadow limiter that would deny:
/// an admitted check recorded nothing in it.
pub(crate) fn shadow_denies(limiter: &LimiterRequest<'_>, outcomes: &[RuleOutcome]) -> bool {
    limiter.shadow && outcomes.iter().any(|o| !o.allowed)
}

fn flag(v: i64, bad: &impl Fn(&str) -> StoreError) -> Result<bool, StoreError> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bad("a flag is neither 0 nor 1")),
    }
}

/// Four integers per rule: allowed (plus twice the limit an override set, which goes into
/// `limits` with the rule's place), remaining, reset_after_us, retry_after_us (-1 = none).
fn read_outcomes(
    values: &[i64],
    limits: &mut Vec<(usize, u64)>,
    bad: &impl Fn(&str) -> StoreError,
) -> Result<Outcomes, StoreError> {
    let count = |v: i64| u64::try_from(v).map_err(|_| bad("a negative count or duration"));
    values
        .chunks_exact(4)
        .enumerate()
        .map(|(place, o)| {
            let limit = count(o[0])? >> 1;
            if limit > 0 {
                limits.push((place, limit));
            }
            Ok(RuleOutcome {
                allowed: flag(o[0] & 1, bad)?,
                remaining: count(o[1])?,
                reset_after_us: count(o[2])?,
                retry_after_us: match o[3] {
                    -1 => None,
                    v => Some(count(v)?),
                },
            })
        })
        .collect()
}

/// How a Cluster store asks check.lua to report (the last integer of a check's plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Report {
    /// What was recorded, to undo it if the identity is banned.
    Record = 1,
    /// Also every rule's outcome at cost 0, for when another slot denies.
    RecordAndZero = 2,
}

/// What one slot's check.lua call answered, in [`Report`] mode.
#[derive(Debug)]
pub(crate) struct SlotReply {
    /// The slot's own verdict: its rules, as if the plan held only them.
    pub(crate) verdict: Verdict,
    /// What the call wrote, if it recorded the admission.
    pub(crate) record: Option<Record>,
    /// Every rule's outcome at cost 0, when asked for and the slot admitted.
    pub(crate) zero: Option<Outcomes>,
}

/// What one check.lua call wrote, enough to undo it (see `scripts/undo.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The script's now: the score of the sliding-log members it added.
    pub(crate) now: i64,
    /// Per rule: retried members and µs until the newest older entry leaves (sliding log);
    /// window start and count written (fixed window); tat before and tat written (gcra);
    /// window start, plus 1 if the previous window counts, and count written (sliding window).
    pub(crate) writes: Vec<(i64, i64)>,
}

/// Each rule's outcome at cost 0 (the state as it stays once the reservation is undone),
/// from its outcome at the plan's cost and what the call wrote, as `tollgate::algorithm`
/// would compute it: the remaining count grows back by the cost; the reset is the newest
/// older entry's (sliding log), 0 for an empty window (fixed window), or the tat before
/// (gcra).
fn zero_from_record(
    plan: &CheckRequest<'_>,
    outcomes: &[RuleOutcome],
    record: &Record,
    bad: &impl Fn(&str) -> StoreError,
) -> Result<Outcomes, StoreError> {
    let cost = plan.cost;
    // A shadow limiter that would deny recorded nothing: its outcomes are the state as it stays.
    let rules = plan
        .limiters
        .iter()
        .zip(per_limiter(plan.limiters, outcomes))
        .flat_map(|(l, mine)| {
            let skipped = shadow_denies(l, mine);
            l.rules.iter().map(move |rule| (rule, skipped))
        });
    rules
        .zip(outcomes)
        .zip(&record.writes)
        .map(|(((rule, skipped), outcome), &(a, b))| {
            if skipped {
                return Ok(*outcome);
            }
            let us = |v: i64| u64::try_from(v).map_err(|_| bad("a negative value in the record"));
            let reset_after_us = match rule.algorithm() {
                Algorithm::SlidingLog => us(b)?,
                Algorithm::FixedWindow if us(b)? == cost => 0,
                Algorithm::FixedWindow => outcome.reset_after_us,
                // This window counts nothing once undone: the previous window's fade (the
                // start's flag says whether it counts), or nothing.
                Algorithm::SlidingWindow if us(b)? == cost => {
                    let start = us(a)?;
                    if start % 1000 == 1 {
                        (start - 1 + rule.window_us()).saturating_sub(us(record.now)?)
                    } else {
                        0
                    }
                }
                Algorithm::SlidingWindow => outcome.reset_after_us,
                _ => us(a - record.now)?,
            };
            Ok(RuleOutcome {
                allowed: true,
                remaining: outcome.remaining + cost,
                reset_after_us,
                retry_after_us: None,
            })
        })
        .collect()
}

/// Reads a check.lua reply made with `report`, for the plan of one slot (no ban keys).
pub(crate) fn slot_reply(
    plan: &CheckRequest<'_>,
    reply: &[i64],
    report: Report,
) -> Result<SlotReply, StoreError> {
    let rules = plan.rule_count();
    let bad = |why: &str| {
        StoreError::new(
            StoreErrorKind::Protocol,
            format!(
                "check script reply with report ({} integers for {rules} rules): {why}",
                reply.len()
            ),
        )
    };
    let head = 3 + 4 * rules;
    let Some((&recorded, mut tail)) = reply.get(head..).and_then(<[i64]>::split_first) else {
        return Err(bad("too short"));
    };
    let verdict = verdict(plan, &reply[..head], 0)?;
    let record = if flag(recorded, &bad)? {
        if tail.len() < 1 + 2 * rules {
            return Err(bad("a short record"));
        }
        let (record, rest) = tail.split_at(1 + 2 * rules);
        tail = rest;
        Some(Record {
            now: record[0],
            writes: record[1..].chunks_exact(2).map(|w| (w[0], w[1])).collect(),
        })
    } else {
        None
    };
    if record.is_some() && !(verdict.allowed && plan.consume) {
        return Err(bad("a record without an admission"));
    }
    let zero = match (report, verdict.allowed, &record) {
        (Report::RecordAndZero, true, Some(record)) => {
            Some(zero_from_record(plan, &verdict.rules, record, &bad)?)
        }
        (Report::RecordAndZero, true, None) => {
            if tail.len() != 4 * rules {
                return Err(bad("the outcomes at cost 0 have the wrong length"));
            }
            let zero = read_outcomes(tail, &mut Vec::new(), &bad)?;
            tail = &[];
            Some(zero)
        }
        _ => None,
    };
    if !tail.is_empty() {
        return Err(bad("trailing integers"));
    }
    Ok(SlotReply {
        verdict,
        record,
        zero,
    })
}

/// The page size a whole listing (of bans, of overrides) is read in: each call stays short,
/// however many there are.
pub(crate) const LIST_PAGE: usize = 1000;

/// Reads the reply of a listing's page (`bans.lua`, `override.lua`'s `page`) for `what`: the
/// next cursor (its end `inf` for an entry that never ends), now, then the page's keys.
pub(crate) fn page_reply(
    what: &str,
    reply: &[Value],
) -> Result<(Option<PageCursor>, u64, Vec<String>), StoreError> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let bad = || protocol(what, format!("unexpected reply {reply:?}"));
    let [
        Value::BulkString(next_us),
        Value::BulkString(next_key),
        Value::BulkString(now),
        keys @ ..,
    ] = reply
    else {
        return Err(bad());
    };
    let next = if next_us.is_empty() {
        None
    } else {
        let until_us = match &next_us[..] {
            b"inf" => u64::MAX,
            digits => text(digits).parse().map_err(|_| bad())?,
        };
        Some(PageCursor::new(until_us, text(next_key)))
    };
    let now = text(now).parse().map_err(|_| bad())?;
    let keys = keys
        .iter()
        .map(|key| match key {
            Value::BulkString(key) => Ok(text(key)),
            _ => Err(bad()),
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok((next, now, keys))
}

#[cfg(test)]
mod tests {
    use tollgate::{LimiterRequest, Rule};

    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_page_reply_is_read_with_its_cursor() {
        let reply = [
            bulk("1700000000000000"),
            bulk("tg:ban:ip:192.0.2.1"),
            bulk("1600000000000000"),
            bulk("tg:ban:ip:192.0.2.1"),
        ];
        let (next, now, keys) = page_reply("bans", &reply).unwrap();
        assert_eq!(
            next,
            Some(PageCursor::new(
                1_700_000_000_000_000,
                "tg:ban:ip:192.0.2.1"
            ))
        );
        assert_eq!(now, 1_600_000_000_000_000);
        assert_eq!(keys, ["tg:ban:ip:192.0.2.1"]);
        let (next, _, keys) = page_reply("bans", &[bulk(""), bulk(""), bulk("1")]).unwrap();
        assert_eq!((next, keys.len()), (None, 0));
        // An override that never ends.
        let reply = [bulk("inf"), bulk("k"), bulk("1"), bulk("k")];
        let (next, _, _) = page_reply("overrides", &reply).unwrap();
        assert_eq!(next, Some(PageCursor::new(u64::MAX, "k")));
    }

    #[test]
    fn a_malformed_page_reply_is_a_protocol_error() {
        for reply in [
            vec![],
            vec![bulk(""), bulk("")],
            vec![bulk("x"), bulk("k"), bulk("1")],
            vec![bulk(""), bulk(""), bulk("now")],
            vec![bulk(""), bulk(""), bulk("1"), Value::Int(1)],
        ] {
            assert!(page_reply("bans", &reply).is_err(), "{reply:?}");
        }
    }

    /// A request of one limiter, kept for the test's whole run.
    fn plan(rules: &[&str]) -> CheckRequest<'static> {
        let rules: &'static [Rule] = rules
            .iter()
            .map(|r| r.parse().unwrap())
            .collect::<Vec<_>>()
            .leak();
        let limiters = vec![LimiterRequest {
            key: "tg:{k}",
            compact: &[],
            rules,
            ban: None,
            shadow: false,
            overrides: None,
        }];
        CheckRequest::new(1, true, limiters.leak())
    }

    #[test]
    fn reply_becomes_a_verdict() {
        let v = verdict(
            &plan(&["2/1s", "5/1m"]),
            &[0, -1, 9, 1, 1, 5, -1, 0, 0, 7, 3],
            0,
        )
        .unwrap();
        assert_eq!(v.banned_us, Some(9));
        assert_eq!(v.blocked_us, None);
        assert!(!v.allowed);
        assert_eq!(v.rules[0].retry_after_us, None);
        assert_eq!(v.rules[1].retry_after_us, Some(3));
        assert_eq!(v.rules[1].reset_after_us, 7);
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let p = plan(&["2/1s"]);
        for reply in [
            &[][..],
            &[1, -1, -1],
            &[1, -1, -1, 1, 0, 0],
            &[1, -1, -1, 2, 0, 0, -1],
            &[1, -1, -1, 1, -3, 0, -1],
            &[0, -1, -1, 1, 0, 0, -1],
            &[0, 5, -1, 1, 0, 0, -1],
            &[0, -7, -1],
        ] {
            let err = verdict(&p, reply, 0).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Protocol, "{reply:?}: {err}");
        }
    }

    #[test]
    fn slot_replies_carry_the_record_and_the_outcomes_at_cost_zero() {
        let p = plan(&["2/1s", "5/1m"]);
        let head = [1, -1, -1, 1, 1, 1_000_000, -1, 1, 4, 60_000_000, -1];
        let mut reply = head.to_vec();
        reply.extend([1, 77, 0, 0, 0, 30_000_000]);
        let r = slot_reply(&p, &reply, Report::RecordAndZero).unwrap();
        assert!(r.verdict.allowed);
        assert_eq!(
            r.record,
            Some(Record {
                now: 77,
                writes: vec![(0, 0), (0, 30_000_000)]
            })
        );
        // At cost 0: one more left, and the reset is the older entries' own.
        let zero: Vec<(u64, u64)> = r
            .zero
            .unwrap()
            .iter()
            .map(|o| (o.remaining, o.reset_after_us))
            .collect();
        assert_eq!(zero, [(2, 0), (5, 30_000_000)]);
        // Not recorded (a peek): the flag alone, then the outcomes at cost 0.
        let mut peek = p;
        peek.consume = false;
        let mut reply = head.to_vec();
        reply.extend([0, 1, 2, 0, -1, 1, 5, 0, -1]);
        let r = slot_reply(&peek, &reply, Report::RecordAndZero).unwrap();
        assert!(r.record.is_none() && r.zero.is_some());
        // Malformed: a record for a denial, a short record, trailing integers.
        let mut denied = vec![0, -1, -1, 1, 1, 1_000_000, -1, 0, 0, 60_000_000, 5];
        denied.extend([1, 77, 0, 0, 0, 0]);
        assert!(slot_reply(&p, &denied, Report::Record).is_err());
        let mut short = head.to_vec();
        short.extend([1, 77, 0]);
        assert!(slot_reply(&p, &short, Report::Record).is_err());
        let mut trailing = head.to_vec();
        trailing.extend([0, 9]);
        assert!(slot_reply(&p, &trailing, Report::Record).is_err());
    }

    #[test]
    fn a_blocked_reply_has_no_rules() {
        let v = verdict(&plan(&["2/1s"]), &[0, 1_000, -1], 0).unwrap();
        assert_eq!(v, Verdict::blocked(1_000));
    }

    #[test]
    fn every_part_is_spliced_once_where_it_is_included() {
        let scripts = Scripts::new();
        let all = scripts.standalone().into_iter().chain(scripts.cluster());
        for lua in all {
            let unspliced = lua.code().lines().any(|l| l.starts_with("--@include"));
            assert!(!unspliced, "{}", lua.code());
            assert_eq!(lua.code().matches("local function ttl_ms").count(), 1);
        }
        let writer = "local function ban_offender(";
        assert_eq!(scripts.check.code().matches(writer).count(), 1);
        assert_eq!(scripts.offend.code().matches(writer).count(), 1);
        assert_eq!(
            scripts
                .ban
                .code()
                .matches("local function put_ban(")
                .count(),
            1
        );
        assert!(
            !scripts.check.code().contains("ARGV[1] == ''"),
            "check.lua has no prelude"
        );
    }

    #[test]
    fn huge_numbers_are_refused_before_lua_rounds_them() {
        let scripts = Scripts::new();
        let mut inv = scripts.check.call();
        let mut p = plan(&["2/1s"]);
        p.cost = 1 << 60;
        assert!(prepare(&mut inv, &p, None, [0; 8], None).is_err());
    }
}
