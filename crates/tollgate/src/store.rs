//! The store contract: what a backend must do atomically.

use std::{future::Future, pin::Pin, sync::Arc};

use std::time::Duration;

use smallvec::SmallVec;

use crate::{
    algorithm::RuleOutcome,
    blocklist::{self, BanEntry, BanPage, BanRule, BanTarget},
    error::StoreError,
    key,
    overrides::{OverridePage, Pager},
    page::PageCursor,
    policy::{Durability, QuotaLease},
    rule::{Algorithm, Rule},
};

/// One atomic check as a store sees it, borrowed from the caller: every limiter's base key and
/// rules, the identity's ban keys, the cost, and whether to record an admission or only look.
///
/// A store must, atomically and against one instant:
/// 1. deny with `blocked_us` if any of `bans` holds a ban that has not ended, evaluating nothing;
/// 2. evaluate every rule of every limiter, and record the admission in all of them only if all
///    of them admit (invariant 2);
/// 3. when consuming and a limiter with a [`BanRule`] denies, ban every target of `bans` whose
///    [`write`](BanKey::write) is set (strike count + 1, the longest duration of the denying
///    limiters' rules) and report it in `banned_us`; keys with `write: false` are only read
///    (step 1): a store that writes them defeats a policy's own bans.
///
/// A [`shadow`](LimiterRequest::shadow) limiter (a dry run) is evaluated like the others but
/// takes no part in the decision: the request is admitted when every enforced limiter admits
/// (and always when every limiter is shadow). An admitted request is recorded in every enforced
/// limiter and in each shadow limiter that admits it on its own; a shadow limiter that would
/// deny records nothing and reports, for its rules that would admit, the state as it stays.
/// A shadow limiter never bans.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CheckRequest<'a> {
    /// Units this request consumes.
    pub cost: u64,
    /// Record the admission (`check`) or only compute the decision (`peek`).
    pub consume: bool,
    /// The limiters, in policy order.
    pub limiters: &'a [LimiterRequest<'a>],
    /// The identity's ban keys, checked first (see [`BanTarget::key`]); empty when no ban can
    /// be involved.
    pub bans: &'a [BanKey<'a>],
    /// The key of the ban index (see [`crate::key::ban_index_key`]), for stores that
    /// keep one: the engine's, or a policy's own when its bans are its own.
    pub ban_index: &'a str,
    /// How far the check's writes must reach before its verdict is final (the policy's):
    /// a store with replicas waits for them, or fails the check.
    pub durability: Durability,
    /// The policy's quota lease: a store that is not in this process may admit from units it
    /// took in advance (see [`QuotaLease`]); others ignore it.
    pub lease: Option<QuotaLease>,
    /// How long the request may wait for its units (µs, 0: not at all): a GCRA rule admits it
    /// if its units conform within this time, reserving them at their place in the schedule
    /// (see [`Tollgate::check_within`](crate::Tollgate::check_within)). The other algorithms
    /// admit only what fits now.
    pub delay_us: u64,
}

/// One ban key of a [`CheckRequest`]: where the ban lives and whom it bans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BanKey<'a> {
    /// Where the ban lives.
    pub key: &'a str,
    /// The target's kind, as [`BanTarget::kind`] gives it.
    pub kind: &'static str,
    /// The target's value, as [`BanTarget::value`] gives it.
    pub value: &'a str,
    /// A violation writes a ban here; `false`: the key is only read (the blocklist of every
    /// policy, seen by a policy whose own bans are its own: [`BanScope::Policy`]).
    ///
    /// [`BanScope::Policy`]: crate::BanScope::Policy
    pub write: bool,
}

impl BanKey<'_> {
    /// The target this key bans.
    pub fn target(&self) -> Result<BanTarget, String> {
        BanTarget::parse(self.kind, self.value)
    }
}

impl<'a> CheckRequest<'a> {
    /// A request over `limiters`, with no ban keys.
    pub fn new(cost: u64, consume: bool, limiters: &'a [LimiterRequest<'a>]) -> CheckRequest<'a> {
        CheckRequest {
            cost,
            consume,
            limiters,
            bans: &[],
            ban_index: "",
            durability: Durability::Async,
            lease: None,
            delay_us: 0,
        }
    }

    /// Lets GCRA rules admit the request if its units conform within `delay` (see
    /// [`delay_us`](Self::delay_us)).
    #[must_use]
    pub fn with_delay(mut self, delay: Duration) -> CheckRequest<'a> {
        self.delay_us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self
    }

    /// Lets the store lease this request's quota (see [`QuotaLease`]).
    #[must_use]
    pub fn with_lease(mut self, lease: Option<QuotaLease>) -> CheckRequest<'a> {
        self.lease = lease;
        self
    }

    /// Asks for this durability (see [`Durability`]).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> CheckRequest<'a> {
        self.durability = durability;
        self
    }

    /// Adds the identity's ban keys.
    #[must_use]
    pub fn with_bans(mut self, bans: &'a [BanKey<'a>], ban_index: &'a str) -> CheckRequest<'a> {
        self.bans = bans;
        self.ban_index = ban_index;
        self
    }

    /// Whether a denial by some limiter bans the identity.
    pub fn may_ban(&self) -> bool {
        self.consume && !self.bans.is_empty() && self.limiters.iter().any(LimiterRequest::bans)
    }

    /// How many rules the request holds, over all limiters.
    pub fn rule_count(&self) -> usize {
        self.limiters.iter().map(|l| l.rules.len()).sum()
    }
}

/// One limiter of a [`CheckRequest`].
#[derive(Clone, Copy, Debug)]
pub struct LimiterRequest<'a> {
    /// The base key as text, hash tag included (see [`key::limiter_key`]): what a store that
    /// keeps text keys finds the limiter's state by ([`Store::text_keys`]). Empty in a request
    /// to a store that keeps none.
    pub key: &'a str,
    /// The limiter's compact key, for a store that keeps no text keys (the memory store): the
    /// limiter's place and the identity's value as bytes, never text, compared whole. Empty
    /// when [`key`](Self::key) is set. [`key_bytes`](Self::key_bytes) gives whichever is set.
    pub compact: &'a [u8],
    /// The rules, in policy order.
    pub rules: &'a [Rule],
    /// Ban the identity when this limiter denies (never when it is shadow).
    pub ban: Option<BanRule>,
    /// A dry run: evaluated and reported, never denying, never banning (see [`CheckRequest`]).
    pub shadow: bool,
    /// The limiter takes per-identity overrides: the [`fingerprint`](crate::fingerprint) of
    /// its rules. The store reads the override of this limiter's key in the same atomic check
    /// and, if it is live and was made for these rules, counts by its limits on the same state
    /// (see [`OverrideStore`]); `None`: the store reads nothing more.
    pub overrides: Option<std::num::NonZeroU64>,
}

impl<'a> LimiterRequest<'a> {
    /// The key the limiter's state is found by: the compact key if set, else the text key's
    /// bytes. The two never collide: text keys are UTF-8, and a compact key is not.
    pub fn key_bytes(&self) -> &'a [u8] {
        if self.compact.is_empty() {
            self.key.as_bytes()
        } else {
            self.compact
        }
    }

    /// Whether this limiter is a concurrency limit (its rule is a
    /// [`Rule::concurrent`](crate::Rule::concurrent)).
    pub fn is_concurrent(&self) -> bool {
        self.rules.iter().any(Rule::is_concurrent)
    }

    /// Whether a denial by this limiter bans the identity: it has a ban rule and is enforced.
    pub fn bans(&self) -> bool {
        self.ban.is_some() && !self.shadow
    }

    /// The distinct state keys of this limiter: the shared sliding log first (if any rule uses
    /// it), then one key per fixed-window or GCRA rule in rule order.
    pub fn state_keys(&self) -> Vec<String> {
        let mut keys = Vec::with_capacity(self.rules.len());
        if let Some(log) = self
            .rules
            .iter()
            .find(|r| r.algorithm() == Algorithm::SlidingLog)
        {
            keys.push(key::rule_key(self.key, log));
        }
        keys.extend(
            self.rules
                .iter()
                .filter(|r| r.algorithm() != Algorithm::SlidingLog)
                .map(|r| key::rule_key(self.key, r)),
        );
        keys
    }

    /// How many keys [`state_keys`](Self::state_keys) returns, without building them.
    pub fn state_keys_len(&self) -> usize {
        let counters = self
            .rules
            .iter()
            .filter(|r| r.algorithm() != Algorithm::SlidingLog)
            .count();
        counters + usize::from(counters < self.rules.len())
    }

    /// The longest sliding-log window, if any rule is a sliding log.
    pub fn log_window_us(&self) -> Option<u64> {
        self.rules
            .iter()
            .filter(|r| r.algorithm() == Algorithm::SlidingLog)
            .map(Rule::window_us)
            .max()
    }
}

/// The rule outcomes of a [`Verdict`]: inline for up to [`INLINE_RULES`] rules.
pub type Outcomes = SmallVec<[RuleOutcome; INLINE_RULES]>;

/// How many rules a check holds without a heap allocation, over all limiters of a policy.
pub const INLINE_RULES: usize = 8;

/// A store's answer to a [`CheckRequest`].
///
/// When the request is admitted, each outcome describes the state after recording it (for a
/// peek: as it would be). When it is denied, nothing is recorded and each rule that would have
/// admitted describes the state as it stays (its outcome for a cost of zero); so do the
/// admitting rules of a shadow limiter that would have denied an admitted request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verdict {
    /// Every rule of every enforced limiter admitted; the admission was recorded if the request
    /// consumes.
    pub allowed: bool,
    /// One outcome per rule, limiters in request order, rules in limiter order; empty when
    /// blocked.
    pub rules: Outcomes,
    /// The identity is banned for this many more microseconds; nothing was evaluated.
    pub blocked_us: Option<u64>,
    /// This denial banned the identity for this many microseconds.
    pub banned_us: Option<u64>,
    /// Where the admission was recorded, when it was (an admitted check that consumes): what
    /// [`RefundStore::refund`] needs to give back exactly its units.
    pub receipt: Option<Receipt>,
    /// The limits an identity's override set: (rule place over the request, limiters in order,
    /// rules in order; the limit counted by). Empty when no override applied.
    pub limits: Vec<(usize, u64)>,
}

impl Verdict {
    /// A verdict to be written (a denial without outcomes until a store answers into it).
    #[inline]
    pub fn empty() -> Verdict {
        Verdict {
            allowed: false,
            rules: Outcomes::new(),
            blocked_us: None,
            banned_us: None,
            receipt: None,
            limits: Vec::new(),
        }
    }

    /// The limit the rule at `place` (over the request: limiters in order, rules in order) was
    /// counted by: the one an override set ([`limits`](Self::limits)), else `configured`.
    pub fn limit_at(limits: &[(usize, u64)], place: usize, configured: u64) -> u64 {
        limits
            .iter()
            .find(|(at, _)| *at == place)
            .map_or(configured, |&(_, limit)| limit)
    }

    /// A verdict from rule outcomes.
    pub fn new(allowed: bool, rules: impl IntoIterator<Item = RuleOutcome>) -> Verdict {
        Verdict {
            allowed,
            rules: rules.into_iter().collect(),
            blocked_us: None,
            banned_us: None,
            receipt: None,
            limits: Vec::new(),
        }
    }

    /// The identity is banned for `us` more microseconds.
    pub fn blocked(us: u64) -> Verdict {
        Verdict {
            allowed: false,
            rules: Outcomes::new(),
            blocked_us: Some(us),
            banned_us: None,
            receipt: None,
            limits: Vec::new(),
        }
    }
}

/// Where a check's admission was recorded, for a refund of exactly its units
/// ([`Tollgate::refund`](crate::Tollgate::refund)): the instant each limiter recorded it at (the
/// store's clock), and the check's id (which tells its sliding-log entries from others' on
/// stores that name them). Its text form (`Display` / `FromStr`) is what the server hands out.
///
/// A shadow limiter that would have denied recorded nothing: its receipt says so, and a refund
/// leaves it alone.
///
/// When an identity's override set the limits the check counted by, the receipt names them
/// ([`limits`](Self::limits)), so that a refund gives back by them even after the override
/// changed or was removed (GCRA gives back time, `units` times the rule's interval: by a lower
/// limit, more time than the check took). A refund takes them only to raise a limit: a
/// receipt handed back by a client cannot make a refund give back more.
///
/// ```
/// use tollgate::Receipt;
///
/// let receipt = Receipt::new(1_700_000_000_000_000, 0x1f, 2);
/// let text = receipt.to_string();
/// assert_eq!(text, "000000000000001f.2.1700000000000000");
/// assert_eq!(text.parse::<Receipt>(), Ok(receipt));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Receipt {
    /// Per limiter in policy order; one value stands for every limiter.
    at_us: SmallVec<[u64; 1]>,
    id: u64,
    units: u64,
    /// The limits overrides set for the check: (the rule's place among the policy's rules,
    /// limiters in order, the limit), by place.
    limits: Vec<(usize, u64)>,
}

impl Receipt {
    /// Marks a limiter that recorded nothing (see [`per_limiter`](Self::per_limiter)).
    pub const NOT_RECORDED: u64 = u64::MAX;

    /// Every limiter recorded the admission of `units` (the check's cost) at `at_us`.
    pub fn new(at_us: u64, id: u64, units: u64) -> Receipt {
        Receipt {
            at_us: SmallVec::from_buf([at_us]),
            id,
            units,
            limits: Vec::new(),
        }
    }

    /// Each limiter, in policy order, recorded at its own instant
    /// ([`NOT_RECORDED`](Self::NOT_RECORDED) for none).
    pub fn per_limiter(at_us: impl IntoIterator<Item = u64>, id: u64, units: u64) -> Receipt {
        let mut at_us: SmallVec<[u64; 1]> = at_us.into_iter().collect();
        if at_us.len() > 1 && at_us.iter().all(|&t| t == at_us[0]) {
            at_us.truncate(1);
        }
        Receipt {
            at_us,
            id,
            units,
            limits: Vec::new(),
        }
    }

    /// The units the check recorded (its cost).
    pub fn units(&self) -> u64 {
        self.units
    }

    /// When limiter `i` recorded the admission; `None` if it recorded nothing.
    pub fn at_us(&self, i: usize) -> Option<u64> {
        let at = match self.at_us.as_slice() {
            [one] => *one,
            many => *many.get(i)?,
        };
        (at != Self::NOT_RECORDED).then_some(at)
    }

    /// The check's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The one instant every limiter recorded at, if they share one.
    #[inline]
    pub(crate) fn single(&self) -> Option<u64> {
        match self.at_us.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }

    /// The same record, naming `units` of it: a check's share of units taken together (a
    /// quota lease), which a refund of this receipt gives back at most.
    #[must_use]
    pub fn with_units(&self, units: u64) -> Receipt {
        Receipt {
            units,
            ..self.clone()
        }
    }

    /// The same record, naming the limits overrides set for the check: (the rule's place among
    /// the policy's rules, limiters in order, the limit). The engine writes them into the
    /// receipts of its decisions.
    #[must_use]
    pub fn with_limits(mut self, limits: impl IntoIterator<Item = (usize, u64)>) -> Receipt {
        self.limits = limits.into_iter().collect();
        self.limits.sort_unstable();
        self.limits.dedup_by_key(|&mut (place, _)| place);
        self
    }

    /// The limits overrides set for the check, by rule place (see
    /// [`with_limits`](Self::with_limits)); empty when the check counted by the configured
    /// limits.
    pub fn limits(&self) -> &[(usize, u64)] {
        &self.limits
    }

    /// The limit the check of this receipt counted by, for the rule at `place` among the
    /// policy's rules (limiters in order) whose configured limit is `configured`: the one an
    /// override set, as the receipt names it, else `configured`. A receipt is text a client
    /// may hand back, so a store gives back by no lower limit than the one in force when it
    /// refunds (a lower limit gives back more GCRA time): see [`RefundStore::refund`].
    pub fn counted_limit(&self, place: usize, configured: u64) -> u64 {
        let named = self.limits.iter().find(|&&(p, _)| p == place);
        named.map_or(configured, |&(_, limit)| limit)
    }
}

impl std::fmt::Display for Receipt {
    /// `id.units.at[,at...]`: the id in 16 hex digits, `-` for a limiter that recorded
    /// nothing. Written without the formatting machinery: the server writes one per admission.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut id = [0u8; 16];
        for (i, digit) in id.iter_mut().enumerate() {
            *digit = HEX[((self.id >> (60 - 4 * i)) & 0xf) as usize];
        }
        f.write_str(std::str::from_utf8(&id).map_err(|_| std::fmt::Error)?)?;
        let mut digits = itoa::Buffer::new();
        f.write_str(".")?;
        f.write_str(digits.format(self.units))?;
        for (i, &at) in self.at_us.iter().enumerate() {
            f.write_str(if i == 0 { "." } else { "," })?;
            match at {
                Self::NOT_RECORDED => f.write_str("-")?,
                at => f.write_str(digits.format(at))?,
            }
        }
        // `.place:limit,...` for the limits overrides set.
        for (i, &(place, limit)) in self.limits.iter().enumerate() {
            f.write_str(if i == 0 { "." } else { "," })?;
            f.write_str(digits.format(place))?;
            f.write_str(":")?;
            f.write_str(digits.format(limit))?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Receipt {
    type Err = String;

    fn from_str(text: &str) -> Result<Receipt, String> {
        let bad = || {
            format!(
                "{text:?} is not a receipt (a check's \"receipt\", e.g. \"000000000000001f.1.1700000000000000\")"
            )
        };
        let (id, rest) = text.split_once('.').ok_or_else(bad)?;
        let (units, rest) = rest.split_once('.').ok_or_else(bad)?;
        let (times, limits) = match rest.split_once('.') {
            Some((times, limits)) => (times, Some(limits)),
            None => (rest, None),
        };
        if id.len() != 16 {
            return Err(bad());
        }
        let id = u64::from_str_radix(id, 16).map_err(|_| bad())?;
        let units = units.parse::<u64>().map_err(|_| bad())?;
        let at_us = times
            .split(',')
            .map(|t| match t {
                "-" => Ok(Self::NOT_RECORDED),
                t => t
                    .parse::<u64>()
                    .ok()
                    .filter(|&t| t != Self::NOT_RECORDED)
                    .ok_or_else(bad),
            })
            .collect::<Result<SmallVec<[u64; 1]>, String>>()?;
        let limits = limits
            .into_iter()
            .flat_map(|l| l.split(','))
            .map(|pair| {
                let (place, limit) = pair.split_once(':').ok_or_else(bad)?;
                let place = place.parse::<usize>().map_err(|_| bad())?;
                let limit = limit.parse::<u64>().map_err(|_| bad())?;
                Ok((place, limit))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Receipt::per_limiter(at_us, id, units).with_limits(limits))
    }
}

/// What a store holds for a duplicate-guard key that someone else acquired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// The holder completed it.
    pub completed: bool,
    /// Microseconds until the key expires.
    pub ttl_left_us: u64,
    /// The fingerprint the holder acquired with.
    pub fingerprint: String,
    /// The stored response, if completed with one.
    pub response: Option<Vec<u8>>,
}

/// A store's answer to a lock request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockReply {
    /// The key was free and is now held with the given token.
    Acquired,
    /// Someone holds it.
    Held(HeldLock),
}

/// A check of one enforced limiter, with no ban key to read or write, no override to apply
/// and no concurrency limit among its rules: the most common check, which an in-process store
/// may answer in place, without a [`CheckRequest`] or a [`Verdict`] ([`Store::check_limiter`]).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct LimiterCheck<'a> {
    /// The limiter's compact key ([`LimiterRequest::compact`]): the engine asks only a store
    /// that keeps no text ([`Store::text_keys`]).
    pub key: &'a [u8],
    /// The limiter's rules.
    pub rules: &'a [Rule],
    /// The units asked for (within the rules' limits).
    pub cost: u64,
    /// Whether an admission is recorded, or only looked at.
    pub consume: bool,
    /// How long the units may wait (µs; see [`CheckRequest::with_delay`]).
    pub delay_us: u64,
}

/// What a store answered to a [`LimiterCheck`], beside the rules' outcomes it wrote: whether
/// every rule admitted, and the instant (µs) the admission was recorded at, when it was (its
/// receipt's instant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterAnswer {
    /// Every rule admitted.
    pub allowed: bool,
    /// When the admission was recorded (an admitted check that consumes units).
    pub recorded_at: Option<u64>,
}

impl LimiterAnswer {
    /// An answer, for stores outside this crate.
    pub fn new(allowed: bool, recorded_at: Option<u64>) -> LimiterAnswer {
        LimiterAnswer {
            allowed,
            recorded_at,
        }
    }
}

/// Where rate-limit state lives: the checks. A store implements what it can beside them, each
/// an ability of its own: [`RefundStore`] (refunds and concurrency leases), [`LockStore`]
/// (duplicate-guard locks), [`BanStore`] (the blocklist) and [`OverrideStore`] (per-identity
/// overrides); the engine's methods that need one ask for it. [`MemoryStore`](crate::MemoryStore)
/// and `tollgate_redis::RedisStore` implement all five ([`FullStore`]).
pub trait Store: Send + Sync + 'static {
    /// Runs one atomic check (see [`CheckRequest`]).
    fn check(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send;

    /// Runs the check at once, without a future, when this store can, writing the answer into
    /// `verdict` (an in-process store answers here; a networked store keeps the default,
    /// `None`, and is asked through [`check`](Self::check)). A store that answers must answer
    /// exactly as `check` would.
    fn check_sync(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Option<Result<(), StoreError>> {
        let _ = (request, verdict);
        None
    }

    /// Answers a check of one limiter ([`LimiterCheck`]) in place when the store can, writing
    /// one outcome per rule into `outcomes` (as long as the rules): an in-process store that
    /// holds the key already. `None` asks for the check as a [`CheckRequest`] instead (the
    /// default; a new key, say). A store that answers must answer, and record, exactly as
    /// [`check_sync`](Self::check_sync) would for the same check.
    fn check_limiter(
        &self,
        check: &LimiterCheck<'_>,
        outcomes: &mut [RuleOutcome],
    ) -> Option<LimiterAnswer> {
        let _ = (check, outcomes);
        None
    }

    /// Forgets every state key of the request's limiters.
    fn reset(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Answers when the store is reachable.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether a ban may be live now. `false` lets the engine leave ban keys out of a check
    /// that cannot write one; only a store that sees every ban (an in-process store) can say
    /// so. The default, `true`, is always correct.
    fn bans_possible(&self) -> bool {
        true
    }

    /// Whether the store finds limiter states by their text keys
    /// ([`LimiterRequest::key`]; the default, for stores that keep text, like Redis) or by
    /// their compact keys ([`LimiterRequest::compact`]: an in-process store, which then never
    /// pays for building text).
    fn text_keys(&self) -> bool {
        true
    }
}

/// Refunds and concurrency leases: a store that can give units back and renew a lease.
pub trait RefundStore: Store {
    /// Renews the leases the check of `receipt` took in the request's limiters (concurrency
    /// limits, see [`Rule::concurrent`](crate::Rule::concurrent)): its sliding-log entries
    /// move to now, so they count for another window; all that are left of them (a refund of
    /// part of a lease's units leaves it the rest), whatever `units` the receipt names.
    /// Atomic per limiter; `None` if one of them holds none of them any more (the lease ran
    /// out, or was released): the caller lost its slot. The new receipt names the entries where they are now; a lease is found by the
    /// check's id, so an earlier receipt of the same check names it too (a renewal whose answer
    /// was lost can be asked again).
    fn extend(
        &self,
        request: &CheckRequest<'_>,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<Option<Receipt>, StoreError>> + Send;

    /// Gives back `request.cost` units to every rule of the request's limiters (a refund),
    /// never below empty, against the store's now:
    ///
    /// - a sliding log removes the entries the check of `receipt` recorded (by its instant and
    ///   id), at most `cost`; without a receipt, its `cost` newest entries;
    /// - a fixed window takes `cost` from the count of the window the check was recorded in
    ///   (without a receipt: the current window), if that window is still the one stored (a
    ///   window that has ended counts nothing anymore);
    /// - a sliding window does the same with its current or, once it has ended, its previous
    ///   window's count;
    /// - GCRA moves its theoretical arrival time back by `cost` emission intervals, not before
    ///   now.
    ///
    /// A limiter the receipt says recorded nothing is left alone. With a receipt, a rule gives
    /// back by the larger of the limit in force now (its override's, if one applies) and
    /// [`Receipt::counted_limit`] (the limit its check counted by), so that a GCRA rule gives
    /// back no more time than the check took, whatever happened to the override since and
    /// whatever limit a receipt's text names: exactly what it took, or a little less where the
    /// limit in force now is higher than the one it counted by.
    fn refund(
        &self,
        request: &CheckRequest<'_>,
        receipt: Option<&Receipt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Charges `request.cost` units to every rule of the request's limiters whatever their
    /// limits say, against the store's now (what [`Tollgate::settle`](crate::Tollgate::settle)
    /// does when a request cost more than its check charged): a debt, which denies the next
    /// checks until time pays it.
    ///
    /// - GCRA moves its theoretical arrival time `cost` emission intervals ahead (at most a
    ///   year): the debt is paid exactly;
    /// - a fixed window adds `cost` to the current window's count, and a sliding window to its
    ///   current window's (its share fades over the next): at most twice the limit;
    /// - a sliding log adds `cost` entries at now, at most twice the largest sliding-log limit
    ///   in all: the debt is paid when they leave the window.
    ///
    /// Concurrency limiters are left alone.
    fn charge(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Per-identity overrides (see [`Tollgate::set_override`](crate::Tollgate::set_override)): a
/// limiter's limits for one of its identities, kept where the check reads them.
///
/// An override lives beside the limiter key's state (Redis: in its hash slot), so that the
/// check that reads a limiter taking overrides ([`LimiterRequest::overrides`]) reads it in
/// the same atomic call. An index under `index` lists them.
pub trait OverrideStore: Store {
    /// Sets the override of `limiter`'s key (replacing any), ending `ttl` from the store's now
    /// (`None`: never); returns it as kept, its end included.
    fn set_override(
        &self,
        limiter: &LimiterRequest<'_>,
        index: &str,
        entry: &crate::Override,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<crate::Override, StoreError>> + Send;

    /// Removes the override of `limiter`'s key; true if there was one.
    fn remove_override(
        &self,
        limiter: &LimiterRequest<'_>,
        index: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Every override under `index` that has not ended.
    fn overrides(
        &self,
        index: &str,
    ) -> impl Future<Output = Result<Vec<crate::Override>, StoreError>> + Send;

    /// At most `limit` (at least 1) of the overrides under `index` that have not ended, in the
    /// order they end (those that never end last), starting after `after` (`None`: from the
    /// start); the page's `next` continues.
    ///
    /// Stores with an override index read only the page (Redis: O(log n + limit)). The default
    /// lists every override and pages them, by end, then by policy, limiter and value.
    fn overrides_page(
        &self,
        index: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> impl Future<Output = Result<OverridePage, StoreError>> + Send {
        let all = self.overrides(index);
        let after = after.cloned();
        async move {
            let mut pager = Pager::new(after.as_ref(), limit);
            all.await?.iter().for_each(|o| pager.feed(o));
            Ok(pager.page())
        }
    }
}

/// Duplicate-guard locks (see [`Tollgate::acquire`](crate::Tollgate::acquire)).
pub trait LockStore: Store {
    /// Takes the lock `key` with `token` for `ttl` if it is free (set-if-absent), remembering
    /// the fingerprint; otherwise describes who holds it. Asked again with the token that holds
    /// it while in progress (a call sent twice), answers `Acquired`.
    fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<LockReply, StoreError>> + Send;

    /// Deletes the lock if `token` holds it (compare-and-delete); true if deleted.
    fn lock_release(
        &self,
        key: &str,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Marks the lock completed with `response`, kept for `keep_for`, if `token` holds it and
    /// it is still in progress; true if done, or if `token` completed it with this very
    /// response already (a call sent twice: the outcome stands, its time unchanged).
    fn lock_complete(
        &self,
        key: &str,
        token: &str,
        response: &[u8],
        keep_for: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// The blocklist: bans written by hand and by limiters (see [`BanRule`]).
pub trait BanStore: Store {
    /// Every ban under `prefix` that has not ended.
    fn bans(&self, prefix: &str) -> impl Future<Output = Result<Vec<BanEntry>, StoreError>> + Send;

    /// Bans `target` for `duration` from now (replacing a shorter or longer ban).
    fn ban(
        &self,
        prefix: &str,
        target: &BanTarget,
        duration: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Lifts the ban on `target` (and forgets its strikes); true if it was banned.
    fn unban(
        &self,
        prefix: &str,
        target: &BanTarget,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// How many bans under `prefix` have not ended.
    ///
    /// Metrics read it at every scrape, so a store should answer without reading every ban
    /// (Redis counts its ban index: O(log n)). The default counts [`bans`](Self::bans).
    fn ban_count(&self, prefix: &str) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let bans = self.bans(prefix);
        async move { Ok(u64::try_from(bans.await?.len()).unwrap_or(u64::MAX)) }
    }

    /// At most `limit` (at least 1) of the bans under `prefix` that have not ended, starting
    /// after `after` (`None`: from the start); the page's `next` continues.
    ///
    /// Stores with a ban index list bans in the order they end, reading only the page (Redis:
    /// O(log n + limit)). The default lists every ban and pages them by target.
    fn bans_page(
        &self,
        prefix: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> impl Future<Output = Result<BanPage, StoreError>> + Send {
        let bans = self.bans(prefix);
        let prefix = prefix.to_owned();
        let after = after.cloned();
        async move {
            Ok(blocklist::page_by_key(
                &prefix,
                bans.await?,
                after.as_ref(),
                limit,
            ))
        }
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe mirror of the five store traits, implemented for every [`FullStore`]: what
/// [`AnyStore`] holds.
trait DynStore: Send + Sync + 'static {
    fn check<'a>(
        &'a self,
        request: &'a CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Verdict, StoreError>>;
    fn check_sync(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Option<Result<(), StoreError>>;
    fn check_limiter(
        &self,
        check: &LimiterCheck<'_>,
        outcomes: &mut [RuleOutcome],
    ) -> Option<LimiterAnswer>;
    fn reset<'a>(&'a self, request: &'a CheckRequest<'a>) -> BoxFuture<'a, Result<(), StoreError>>;
    fn refund<'a>(
        &'a self,
        request: &'a CheckRequest<'a>,
        receipt: Option<&'a Receipt>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn extend<'a>(
        &'a self,
        request: &'a CheckRequest<'a>,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<Option<Receipt>, StoreError>>;
    fn charge<'a>(&'a self, request: &'a CheckRequest<'a>)
    -> BoxFuture<'a, Result<(), StoreError>>;
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>>;
    fn bans_possible(&self) -> bool;
    fn text_keys(&self) -> bool;
    fn lock_acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        fingerprint: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockReply, StoreError>>;
    fn lock_release<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn lock_complete<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        response: &'a [u8],
        keep_for: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn bans<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<BanEntry>, StoreError>>;
    fn ban<'a>(
        &'a self,
        prefix: &'a str,
        target: &'a BanTarget,
        duration: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn unban<'a>(
        &'a self,
        prefix: &'a str,
        target: &'a BanTarget,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn ban_count<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;
    fn bans_page<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a PageCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<BanPage, StoreError>>;
    fn set_override<'a>(
        &'a self,
        limiter: &'a LimiterRequest<'a>,
        index: &'a str,
        entry: &'a crate::Override,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<crate::Override, StoreError>>;
    fn remove_override<'a>(
        &'a self,
        limiter: &'a LimiterRequest<'a>,
        index: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn overrides<'a>(
        &'a self,
        index: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::Override>, StoreError>>;
    fn overrides_page<'a>(
        &'a self,
        index: &'a str,
        after: Option<&'a PageCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<OverridePage, StoreError>>;
}

impl<S: FullStore> DynStore for S {
    fn check<'a>(
        &'a self,
        request: &'a CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Verdict, StoreError>> {
        Box::pin(Store::check(self, request))
    }

    fn check_sync(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Option<Result<(), StoreError>> {
        Store::check_sync(self, request, verdict)
    }

    fn check_limiter(
        &self,
        check: &LimiterCheck<'_>,
        outcomes: &mut [RuleOutcome],
    ) -> Option<LimiterAnswer> {
        Store::check_limiter(self, check, outcomes)
    }

    fn reset<'a>(&'a self, request: &'a CheckRequest<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::reset(self, request))
    }

    fn refund<'a>(
        &'a self,
        request: &'a CheckRequest<'a>,
        receipt: Option<&'a Receipt>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(RefundStore::refund(self, request, receipt))
    }

    fn extend<'a>(
        &'a self,
        request: &'a CheckRequest<'a>,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<Option<Receipt>, StoreError>> {
        Box::pin(RefundStore::extend(self, request, receipt))
    }

    fn charge<'a>(
        &'a self,
        request: &'a CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(RefundStore::charge(self, request))
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(Store::ping(self))
    }

    fn bans_possible(&self) -> bool {
        Store::bans_possible(self)
    }

    fn text_keys(&self) -> bool {
        Store::text_keys(self)
    }

    fn lock_acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        fingerprint: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockReply, StoreError>> {
        Box::pin(LockStore::lock_acquire(self, key, token, fingerprint, ttl))
    }

    fn lock_release<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(LockStore::lock_release(self, key, token))
    }

    fn lock_complete<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        response: &'a [u8],
        keep_for: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(LockStore::lock_complete(
            self, key, token, response, keep_for,
        ))
    }

    fn bans<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<BanEntry>, StoreError>> {
        Box::pin(BanStore::bans(self, prefix))
    }

    fn ban<'a>(
        &'a self,
        prefix: &'a str,
        target: &'a BanTarget,
        duration: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(BanStore::ban(self, prefix, target, duration))
    }

    fn unban<'a>(
        &'a self,
        prefix: &'a str,
        target: &'a BanTarget,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(BanStore::unban(self, prefix, target))
    }

    fn ban_count<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(BanStore::ban_count(self, prefix))
    }

    fn bans_page<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a PageCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<BanPage, StoreError>> {
        Box::pin(BanStore::bans_page(self, prefix, after, limit))
    }

    fn set_override<'a>(
        &'a self,
        limiter: &'a LimiterRequest<'a>,
        index: &'a str,
        entry: &'a crate::Override,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<crate::Override, StoreError>> {
        Box::pin(OverrideStore::set_override(
            self, limiter, index, entry, ttl,
        ))
    }

    fn remove_override<'a>(
        &'a self,
        limiter: &'a LimiterRequest<'a>,
        index: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(OverrideStore::remove_override(self, limiter, index))
    }

    fn overrides<'a>(
        &'a self,
        index: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::Override>, StoreError>> {
        Box::pin(OverrideStore::overrides(self, index))
    }

    fn overrides_page<'a>(
        &'a self,
        index: &'a str,
        after: Option<&'a PageCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<OverridePage, StoreError>> {
        Box::pin(OverrideStore::overrides_page(self, index, after, limit))
    }
}

/// A store with every ability: [`Store`], [`RefundStore`], [`LockStore`], [`BanStore`] and
/// [`OverrideStore`] (what [`AnyStore`] wraps and the front ends take). Implemented for every
/// such store.
pub trait FullStore: BanStore + LockStore + RefundStore + OverrideStore {}

impl<S: BanStore + LockStore + RefundStore + OverrideStore> FullStore for S {}

/// Any store with all five abilities (a [`FullStore`]), chosen at run time (e.g. from a
/// configuration URL), shared by cloning.
///
/// Every call goes through to the store inside, [`Store::check_sync`] included, so an
/// in-process store behind `AnyStore` answers checks without a future.
///
/// ```
/// use tollgate::{AnyStore, MemoryStore, Tollgate};
///
/// let store = AnyStore::new(MemoryStore::new());
/// let gate = Tollgate::new(store);
/// # let _ = gate;
/// ```
#[derive(Clone)]
pub struct AnyStore(Arc<dyn DynStore>);

impl AnyStore {
    /// Wraps `store`.
    pub fn new(store: impl FullStore) -> AnyStore {
        AnyStore(Arc::new(store))
    }

    /// Wraps a store that is shared already (an engine's: see
    /// [`Tollgate::erase`](crate::Tollgate::erase)), without a second layer.
    pub fn shared<S: FullStore>(store: Arc<S>) -> AnyStore {
        AnyStore(store)
    }
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnyStore")
    }
}

/// Forwards every [`Store`] method to the store `$inner` reaches (an `Arc<S>`, an
/// [`AnyStore`]'s object).
macro_rules! forward_store {
    ($trait:ident, $inner:ident => $to:expr) => {
        async fn check(
            &self,
            request: &$crate::CheckRequest<'_>,
        ) -> Result<$crate::Verdict, $crate::StoreError> {
            let $inner = self;
            $trait::check($to, request).await
        }

        fn check_sync(
            &self,
            request: &$crate::CheckRequest<'_>,
            verdict: &mut $crate::Verdict,
        ) -> Option<Result<(), $crate::StoreError>> {
            let $inner = self;
            $trait::check_sync($to, request, verdict)
        }

        fn check_limiter(
            &self,
            check: &$crate::LimiterCheck<'_>,
            outcomes: &mut [$crate::algorithm::RuleOutcome],
        ) -> Option<$crate::LimiterAnswer> {
            let $inner = self;
            $trait::check_limiter($to, check, outcomes)
        }

        async fn reset(
            &self,
            request: &$crate::CheckRequest<'_>,
        ) -> Result<(), $crate::StoreError> {
            let $inner = self;
            $trait::reset($to, request).await
        }

        async fn ping(&self) -> Result<(), $crate::StoreError> {
            let $inner = self;
            $trait::ping($to).await
        }

        fn bans_possible(&self) -> bool {
            let $inner = self;
            $trait::bans_possible($to)
        }

        fn text_keys(&self) -> bool {
            let $inner = self;
            $trait::text_keys($to)
        }
    };
}

/// The methods of [`RefundStore`], forwarded like [`forward_store`]'s.
macro_rules! forward_refunds {
    ($trait:ident, $inner:ident => $to:expr) => {
        async fn refund(
            &self,
            request: &$crate::CheckRequest<'_>,
            receipt: Option<&$crate::Receipt>,
        ) -> Result<(), $crate::StoreError> {
            let $inner = self;
            $trait::refund($to, request, receipt).await
        }

        async fn extend(
            &self,
            request: &$crate::CheckRequest<'_>,
            receipt: &$crate::Receipt,
        ) -> Result<Option<$crate::Receipt>, $crate::StoreError> {
            let $inner = self;
            $trait::extend($to, request, receipt).await
        }

        async fn charge(
            &self,
            request: &$crate::CheckRequest<'_>,
        ) -> Result<(), $crate::StoreError> {
            let $inner = self;
            $trait::charge($to, request).await
        }
    };
}

/// The methods of [`LockStore`], forwarded like [`forward_store`]'s.
macro_rules! forward_locks {
    ($trait:ident, $inner:ident => $to:expr) => {
        async fn lock_acquire(
            &self,
            key: &str,
            token: &str,
            fingerprint: &str,
            ttl: ::std::time::Duration,
        ) -> Result<$crate::LockReply, $crate::StoreError> {
            let $inner = self;
            $trait::lock_acquire($to, key, token, fingerprint, ttl).await
        }

        async fn lock_release(&self, key: &str, token: &str) -> Result<bool, $crate::StoreError> {
            let $inner = self;
            $trait::lock_release($to, key, token).await
        }

        async fn lock_complete(
            &self,
            key: &str,
            token: &str,
            response: &[u8],
            keep_for: ::std::time::Duration,
        ) -> Result<bool, $crate::StoreError> {
            let $inner = self;
            $trait::lock_complete($to, key, token, response, keep_for).await
        }
    };
}

/// The methods of [`BanStore`], forwarded like [`forward_store`]'s.
macro_rules! forward_bans {
    ($trait:ident, $inner:ident => $to:expr) => {
        async fn bans(&self, prefix: &str) -> Result<Vec<$crate::BanEntry>, $crate::StoreError> {
            let $inner = self;
            $trait::bans($to, prefix).await
        }

        async fn ban(
            &self,
            prefix: &str,
            target: &$crate::BanTarget,
            duration: ::std::time::Duration,
        ) -> Result<(), $crate::StoreError> {
            let $inner = self;
            $trait::ban($to, prefix, target, duration).await
        }

        async fn unban(
            &self,
            prefix: &str,
            target: &$crate::BanTarget,
        ) -> Result<bool, $crate::StoreError> {
            let $inner = self;
            $trait::unban($to, prefix, target).await
        }

        async fn ban_count(&self, prefix: &str) -> Result<u64, $crate::StoreError> {
            let $inner = self;
            $trait::ban_count($to, prefix).await
        }

        async fn bans_page(
            &self,
            prefix: &str,
            after: Option<&$crate::PageCursor>,
            limit: usize,
        ) -> Result<$crate::BanPage, $crate::StoreError> {
            let $inner = self;
            $trait::bans_page($to, prefix, after, limit).await
        }
    };
}

/// The methods of [`OverrideStore`], forwarded like [`forward_store`]'s.
macro_rules! forward_overrides {
    ($trait:ident, $inner:ident => $to:expr) => {
        async fn set_override(
            &self,
            limiter: &$crate::LimiterRequest<'_>,
            index: &str,
            entry: &$crate::Override,
            ttl: Option<::std::time::Duration>,
        ) -> Result<$crate::Override, $crate::StoreError> {
            let $inner = self;
            $trait::set_override($to, limiter, index, entry, ttl).await
        }

        async fn remove_override(
            &self,
            limiter: &$crate::LimiterRequest<'_>,
            index: &str,
        ) -> Result<bool, $crate::StoreError> {
            let $inner = self;
            $trait::remove_override($to, limiter, index).await
        }

        async fn overrides(
            &self,
            index: &str,
        ) -> Result<Vec<$crate::Override>, $crate::StoreError> {
            let $inner = self;
            $trait::overrides($to, index).await
        }

        async fn overrides_page(
            &self,
            index: &str,
            after: Option<&$crate::PageCursor>,
            limit: usize,
        ) -> Result<$crate::OverridePage, $crate::StoreError> {
            let $inner = self;
            $trait::overrides_page($to, index, after, limit).await
        }
    };
}

impl<S: Store> Store for Arc<S> {
    forward_store!(Store, this => &**this);
}

impl<S: RefundStore> RefundStore for Arc<S> {
    forward_refunds!(RefundStore, this => &**this);
}

impl<S: LockStore> LockStore for Arc<S> {
    forward_locks!(LockStore, this => &**this);
}

impl<S: BanStore> BanStore for Arc<S> {
    forward_bans!(BanStore, this => &**this);
}

impl<S: OverrideStore> OverrideStore for Arc<S> {
    forward_overrides!(OverrideStore, this => &**this);
}

impl Store for AnyStore {
    forward_store!(DynStore, this => &*this.0);
}

impl RefundStore for AnyStore {
    forward_refunds!(DynStore, this => &*this.0);
}

impl LockStore for AnyStore {
    forward_locks!(DynStore, this => &*this.0);
}

impl BanStore for AnyStore {
    forward_bans!(DynStore, this => &*this.0);
}

impl OverrideStore for AnyStore {
    forward_overrides!(DynStore, this => &*this.0);
}

#[cfg(test)]
mod receipt_tests {
    use super::Receipt;

    #[test]
    fn receipts_round_trip_as_text_and_name_what_each_limiter_recorded() {
        let one = Receipt::new(1_700_000_000_000_000, u64::MAX, 3);
        assert_eq!(one.to_string(), "ffffffffffffffff.3.1700000000000000");
        assert_eq!(one.at_us(0), Some(1_700_000_000_000_000));
        assert_eq!(
            one.at_us(7),
            Some(1_700_000_000_000_000),
            "one instant stands for all"
        );
        let mixed = Receipt::per_limiter([5, Receipt::NOT_RECORDED, 7], 0xab, 1);
        assert_eq!(mixed.to_string(), "00000000000000ab.1.5,-,7");
        assert_eq!(mixed.to_string().parse::<Receipt>(), Ok(mixed.clone()));
        assert_eq!(
            (mixed.at_us(1), mixed.at_us(2), mixed.at_us(3)),
            (None, Some(7), None)
        );
        let same = Receipt::per_limiter([9, 9], 1, 1);
        assert_eq!(same.to_string(), "0000000000000001.1.9");
        // The limits an override set, by rule place, sorted, once each.
        let raised = mixed.clone().with_limits([(3, 50), (0, 12), (3, 60)]);
        assert_eq!(raised.limits(), [(0, 12), (3, 50)]);
        assert_eq!(raised.to_string(), "00000000000000ab.1.5,-,7.0:12,3:50");
        assert_eq!(raised.to_string().parse::<Receipt>(), Ok(raised.clone()));
        assert_eq!(raised.with_units(0).limits(), raised.limits());
        // The limit the check counted by, as named, whatever is configured.
        assert_eq!(
            (raised.counted_limit(0, 6), raised.counted_limit(0, 20)),
            (12, 12)
        );
        assert_eq!(raised.counted_limit(1, 6), 6, "no override for that rule");
        for bad in [
            "",
            "x",
            "00ab.1.5",
            "00000000000000ab.one.5",
            "00000000000000ab.1",
            "00000000000000ab.1.5,x",
            "00000000000000ab.1.5.",
            "00000000000000ab.1.5.0",
            "00000000000000ab.1.5.0:x",
            "00000000000000ab.1.5.0:1.2",
        ] {
            let e = bad.parse::<Receipt>().unwrap_err();
            assert!(e.contains("is not a receipt"), "{bad:?}: {e}");
        }
    }
}
