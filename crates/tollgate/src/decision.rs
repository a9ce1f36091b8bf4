//! Decisions: allowed or denied, why, and what every rule says.

use std::{
    borrow::Borrow,
    cell::{Cell, RefCell},
    fmt,
    ops::Deref,
    sync::Arc,
    time::Duration,
};

use smallvec::SmallVec;
use smol_str::SmolStr;

use crate::{
    policy::{Limiter, Policy},
    rule::Rule,
    store::{INLINE_RULES, Receipt},
};

/// Why a request was allowed or denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Reason {
    /// Every rule admitted the request.
    Ok,
    /// At least one rule denied it.
    RateLimited,
    /// The identity is on the blocklist.
    Blocked,
    /// The policy's bypass let the request through without counting.
    Bypassed,
    /// The store failed; the decision follows the policy's `on_error`.
    StoreUnavailable,
    /// The cost is larger than some rule's limit: it can never be admitted.
    CostExceedsLimit,
    /// Every rule that denied is a concurrency limit: as many requests as it allows are in
    /// flight.
    ConcurrencyLimited,
}

impl Reason {
    /// The snake_case name used in APIs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Ok => "ok",
            Reason::RateLimited => "rate_limited",
            Reason::Blocked => "blocked",
            Reason::Bypassed => "bypassed",
            Reason::StoreUnavailable => "store_unavailable",
            Reason::CostExceedsLimit => "cost_exceeds_limit",
            Reason::ConcurrencyLimited => "concurrency_limited",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limiter's name as a decision carries it: names of up to 23 bytes are held inline, so
/// copying one into every decision touches no shared reference count (threads checking one
/// policy would otherwise contend on it); longer names are shared.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LimiterName(SmolStr);

impl LimiterName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for LimiterName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for LimiterName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for LimiterName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for LimiterName {
    fn from(name: &str) -> LimiterName {
        LimiterName(SmolStr::new(name))
    }
}

impl From<String> for LimiterName {
    fn from(name: String) -> LimiterName {
        LimiterName(SmolStr::from(name))
    }
}

impl From<Arc<str>> for LimiterName {
    fn from(name: Arc<str>) -> LimiterName {
        LimiterName(SmolStr::from(name))
    }
}

impl PartialEq<str> for LimiterName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for LimiterName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl fmt::Display for LimiterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LimiterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for LimiterName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// What one rule of one limiter said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleDecision {
    /// The limiter's name.
    pub limiter: LimiterName,
    /// The rule.
    pub rule: Rule,
    /// This rule admitted the request.
    pub allowed: bool,
    /// Units left in the window: after this request if it was admitted, otherwise now.
    pub remaining: u64,
    /// Time until the rule's full quota is available again.
    pub reset_after: Duration,
    /// The rule's limiter is in shadow mode: `allowed` says what it would have decided, and
    /// the decision does not depend on it.
    pub shadow: bool,
}

/// The answer to a check. Being denied is a value, not an error.
///
/// A decision is compact: what every rule said is kept as numbers beside the rule's place in
/// the policy, and named ([`RuleDecision`]) only when read, with the policy that was checked
/// ([`rules`](Self::rules)). A decision is 64 bytes: the first rule's numbers are inline; a
/// decision of several rules (up to [`INLINE_RULES`](crate::INLINE_RULES) without growing it)
/// or with a message keeps the rest in storage its thread reuses, so a check allocates nothing
/// once its thread has held as many decisions at once.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Reason, Tollgate};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let gate = Tollgate::new(MemoryStore::new());
/// let policy = Policy::builder("login")
///     .limiter(Limiter::new(Dimension::Ip, ["2/1m".parse()?, "5/1h".parse()?]))
///     .build()?;
/// let who = Identity::new().with_ip("192.0.2.1".parse()?);
///
/// let first = gate.check(&policy, &who, 1).await?;
/// assert!(first.allowed());
/// assert_eq!(first.remaining(), Some(1)); // the minute's rule is the tighter
/// gate.check(&policy, &who, 1).await?;
///
/// let third = gate.check(&policy, &who, 1).await?;
/// assert_eq!(third.reason(), Reason::RateLimited);
/// let denied: Vec<String> = third.denied_rules(&policy).map(|r| r.rule.to_string()).collect();
/// assert_eq!(denied, ["2/1m"]);
/// assert!(third.retry_after() <= Some(Duration::from_secs(60)));
/// // All or nothing: the denied request took nothing from the hour's rule.
/// assert_eq!(third.rules(&policy)[1].remaining, 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Decision {
    allowed: bool,
    reason: Reason,
    /// Some shadow rule would have denied.
    shadow_denied: bool,
    /// Which inline values hold something ([`Decision::FIRST`] and the others).
    has: u8,
    retry_after_us: u64,
    /// What the policy's first rule said (when [`Decision::FIRST`]).
    first: Said,
    /// The receipt's instant, id and units (when [`Decision::RECEIPT`]).
    recorded: [u64; 3],
    /// What does not fit: taken only by a decision of several rules, a message, an override's
    /// limits or a receipt of several instants.
    more: More,
}

/// What a decision holds beyond its inline values. Its boxes are kept for reuse by each thread
/// ([`More::take`]), so a check of several rules allocates nothing once its thread has made as
/// many as it holds at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Extra {
    /// The smallest `remaining` over the enforced rules (when there is `more`, it is here).
    remaining: Option<u64>,
    /// What every rule said, then the limits overrides set, once there is more than the first
    /// (which is copied here from the decision's inline value).
    said: SmallVec<[Said; INLINE_RULES]>,
    message: Option<Arc<String>>,
    /// A receipt whose limiters recorded at different instants.
    receipt: Option<Receipt>,
}

/// An [`Extra`] on the heap, if the decision has one, given back to its thread's spares when
/// dropped.
#[derive(Default)]
struct More(Option<Box<Extra>>);

/// How many spare [`Extra`] boxes a thread keeps beside [`NEXT`].
const SPARES: usize = 32;

thread_local! {
    /// The spare the next decision takes: a thread that checks one request at a time only
    /// ever uses this one.
    static NEXT: Cell<Option<Box<Extra>>> = const { Cell::new(None) };
    /// The spares of a thread holding several decisions at once.
    #[allow(clippy::vec_box, reason = "a decision points at the box itself")]
    static SPARE: RefCell<Vec<Box<Extra>>> = const { RefCell::new(Vec::new()) };
}

impl More {
    /// An empty `Extra`: a spare of this thread's, else a new one.
    #[inline]
    fn take() -> Box<Extra> {
        let spare = NEXT.try_with(Cell::take).ok().flatten().or_else(|| {
            SPARE
                .try_with(|spares| spares.borrow_mut().pop())
                .ok()
                .flatten()
        });
        spare.unwrap_or_default()
    }

    fn get(&self) -> Option<&Extra> {
        self.0.as_deref()
    }

    fn get_mut(&mut self) -> Option<&mut Extra> {
        self.0.as_deref_mut()
    }

    /// The extra values, made when first needed.
    #[inline]
    fn get_or_take(&mut self) -> &mut Extra {
        self.0.get_or_insert_with(More::take)
    }

    /// Gives the extra values back to the thread's spares.
    #[inline(always)]
    fn clear(&mut self) {
        if let Some(extra) = self.0.take() {
            More::give_back(extra);
        }
    }

    /// Empties `extra` and keeps it for this thread's next decision (out of line: a decision
    /// of one rule has none, and its drop is one test).
    #[inline(never)]
    fn give_back(mut extra: Box<Extra>) {
        extra.remaining = None;
        extra.said.clear();
        extra.message = None;
        extra.receipt = None;
        let Ok(Some(extra)) = NEXT.try_with(|next| next.replace(Some(extra))) else {
            return;
        };
        let _ = SPARE.try_with(|spares| {
            let mut spares = spares.borrow_mut();
            if spares.len() < SPARES {
                spares.push(extra);
            }
        });
    }
}

impl Drop for More {
    #[inline(always)]
    fn drop(&mut self) {
        self.clear();
    }
}

impl Clone for More {
    fn clone(&self) -> More {
        More(self.get().map(|extra| {
            let mut copy = More::take();
            (*copy).clone_from(extra);
            copy
        }))
    }
}

impl Default for Decision {
    fn default() -> Decision {
        Decision::without_rules(true, Reason::Ok)
    }
}

impl PartialEq for Decision {
    fn eq(&self, other: &Decision) -> bool {
        self.allowed == other.allowed
            && self.reason == other.reason
            && self.shadow_denied == other.shadow_denied
            && self.retry_after() == other.retry_after()
            && self.remaining() == other.remaining()
            && self.said() == other.said()
            && self.message() == other.message()
            && self.receipt() == other.receipt()
    }
}

impl Eq for Decision {}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("reason", &self.reason)
            .field("shadow_denied", &self.shadow_denied)
            .field("retry_after", &self.retry_after())
            .field("remaining", &self.remaining())
            .field("said", &self.said())
            .field("message", &self.message())
            .field("receipt", &self.receipt())
            .finish()
    }
}

/// What one rule said, as a decision keeps it, in two words: one per rule of the policy (limiters
/// in order, rules in limiter order), so a rule's place is its index. After them, one per limit
/// an identity's override set ([`Said::limit`]): a decision that meets none pays nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Said {
    remaining: u64,
    /// The reset in microseconds (saturating below bit 62), whether the rule admitted (bit 63),
    /// and whether the decision names the rule (bit 62: a decision refusing a cost some rules
    /// can never admit names only those).
    packed: u64,
}

impl Said {
    const ALLOWED: u64 = 1 << 63;
    const NAMED: u64 = 1 << 62;

    /// A rule the decision names.
    #[inline]
    pub(crate) fn new(allowed: bool, remaining: u64, reset_after_us: u64) -> Said {
        let reset = reset_after_us.min(Said::NAMED - 1);
        Said {
            remaining,
            packed: reset | Said::NAMED | if allowed { Said::ALLOWED } else { 0 },
        }
    }

    /// The limit an override set for the rule at `place`, kept after the rules' entries (its
    /// flags clear, so nothing reads it as a rule).
    pub(crate) fn limit(place: usize, limit: u64) -> Said {
        Said {
            remaining: limit,
            packed: place as u64 & (Said::NAMED - 1),
        }
    }

    /// A rule the decision leaves out.
    pub(crate) fn unnamed() -> Said {
        Said {
            remaining: 0,
            packed: 0,
        }
    }

    fn named(self) -> bool {
        self.packed & Said::NAMED != 0
    }

    pub(crate) fn allowed(self) -> bool {
        self.packed & Said::ALLOWED != 0
    }

    pub(crate) fn remaining(self) -> u64 {
        self.remaining
    }

    pub(crate) fn reset_after_us(self) -> u64 {
        self.packed & (Said::NAMED - 1)
    }
}

/// The rules of a decision, named ([`Decision::rules`]): inline for up to
/// [`INLINE_RULES`](crate::INLINE_RULES).
pub type RuleDecisions = SmallVec<[RuleDecision; INLINE_RULES]>;

impl Decision {
    const FIRST: u8 = 1;
    const REMAINING: u8 = 2;
    const RETRY: u8 = 4;
    const RECEIPT: u8 = 8;

    #[inline(always)]
    pub(crate) fn without_rules(allowed: bool, reason: Reason) -> Decision {
        Decision {
            allowed,
            reason,
            shadow_denied: false,
            has: 0,
            retry_after_us: 0,
            first: Said::unnamed(),
            recorded: [0; 3],
            more: More(None),
        }
    }

    /// Makes this an empty decision, in place.
    #[inline(always)]
    pub(crate) fn reset(&mut self, allowed: bool, reason: Reason) {
        self.allowed = allowed;
        self.reason = reason;
        self.shadow_denied = false;
        self.has = 0;
        self.more.clear();
    }

    pub(crate) fn set_outcome(&mut self, allowed: bool, reason: Reason) {
        self.allowed = allowed;
        self.reason = reason;
    }

    pub(crate) fn set_reason(&mut self, reason: Reason) {
        self.reason = reason;
    }

    pub(crate) fn note_shadow_denied(&mut self, denied: bool) {
        self.shadow_denied |= denied;
    }

    pub(crate) fn set_retry_after_us(&mut self, us: Option<u64>) {
        match us {
            Some(us) => {
                self.retry_after_us = us;
                self.has |= Decision::RETRY;
            }
            None => self.has &= !Decision::RETRY,
        }
    }

    /// What a fresh decision's only rule said: its outcome, and so the smallest `remaining`.
    #[inline(always)]
    pub(crate) fn say_only(&mut self, said: Said) {
        debug_assert!(self.has & Decision::FIRST == 0, "a fresh decision");
        self.allowed = said.allowed();
        self.first = said;
        self.has |= Decision::FIRST | Decision::REMAINING;
    }

    /// The receipt of an admission its limiters recorded at one instant: the instant, the
    /// check's id and the units.
    #[inline(always)]
    pub(crate) fn set_receipt(&mut self, [at, id, units]: [u64; 3]) {
        self.recorded = [at, id, units];
        self.has |= Decision::RECEIPT;
    }

    /// The extra values, made when first needed.
    fn extra(&mut self) -> &mut Extra {
        self.more.get_or_take()
    }

    /// What the next rule said (rules in policy order, then the limits overrides set).
    #[inline]
    pub(crate) fn push_said(&mut self, said: Said) {
        if self.has & Decision::FIRST == 0 {
            self.first = said;
            self.has |= Decision::FIRST;
            return;
        }
        let first = self.first;
        let all = &mut self.extra().said;
        if all.is_empty() {
            all.push(first);
        }
        all.push(said);
    }

    /// What every rule of a fresh decision said at once (rules in policy order): as
    /// [`push_said`](Self::push_said) one by one, the storage found once.
    #[inline]
    pub(crate) fn say_all(&mut self, mut said: impl ExactSizeIterator<Item = Said>) {
        debug_assert!(self.has & Decision::FIRST == 0, "a fresh decision");
        let more = said.len() > 1;
        let Some(first) = said.next() else {
            return;
        };
        self.first = first;
        self.has |= Decision::FIRST;
        if more {
            let all = &mut self.extra().said;
            all.push(first);
            // Pushed: `extend` reserves through the general path first.
            for s in said {
                all.push(s);
            }
        }
    }

    /// The smallest `remaining` over the enforced rules: set after every rule said.
    #[inline]
    pub(crate) fn set_remaining(&mut self, remaining: Option<u64>) {
        if let Some(extra) = self.more.get_mut() {
            extra.remaining = remaining;
            return;
        }
        match remaining {
            None => self.has &= !Decision::REMAINING,
            Some(r) if self.has & Decision::FIRST != 0 && r == self.first.remaining => {
                self.has |= Decision::REMAINING;
            }
            Some(r) => {
                self.has &= !Decision::REMAINING;
                self.extra().remaining = Some(r);
            }
        }
    }

    /// `message` unless the decision has one already.
    pub(crate) fn note_message(&mut self, message: &Arc<String>) {
        let extra = self.extra();
        if extra.message.is_none() {
            extra.message = Some(Arc::clone(message));
        }
    }

    /// The receipt the check's admission was recorded with, taken from `receipt` when its
    /// limiters recorded at different instants (else read in place).
    #[inline(always)]
    pub(crate) fn take_receipt(&mut self, receipt: &mut Option<Receipt>) {
        let Some(recorded) = receipt else {
            return;
        };
        match recorded.single() {
            Some(at) => self.set_receipt([at, recorded.id(), recorded.units()]),
            None => {
                self.extra().receipt = receipt.take();
                self.has |= Decision::RECEIPT;
            }
        }
    }

    /// The limits overrides set for the check (rule place, limit), after the rules' entries;
    /// the receipt, if any, names them too, for a refund by the limits the check counted by.
    #[inline(always)]
    pub(crate) fn push_limits(&mut self, limits: &[(usize, u64)]) {
        if !limits.is_empty() {
            self.push_set_limits(limits);
        }
    }

    #[cold]
    fn push_set_limits(&mut self, limits: &[(usize, u64)]) {
        for &(place, limit) in limits {
            self.push_said(Said::limit(place, limit));
        }
        if let Some(receipt) = self.receipt() {
            self.extra().receipt = Some(receipt.with_limits(limits.iter().copied()));
        }
    }

    /// What each rule said, then the limits overrides set.
    fn said(&self) -> &[Said] {
        match self.more.get() {
            Some(extra) if !extra.said.is_empty() => &extra.said,
            _ if self.has & Decision::FIRST != 0 => std::slice::from_ref(&self.first),
            _ => &[],
        }
    }

    /// The request may proceed.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Why.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// When denied: how long until the same request would be admitted, if nothing else
    /// happens meanwhile. `None` when allowed, or when waiting cannot help.
    pub fn retry_after(&self) -> Option<Duration> {
        (self.has & Decision::RETRY != 0).then(|| Duration::from_micros(self.retry_after_us))
    }

    /// Every rule of every limiter of `policy` (the policy this decision answers), in policy
    /// order, named; empty when no rule was evaluated (a bypass, a ban, a failed store), and
    /// only the rules too small for the cost when the cost exceeds a limit.
    pub fn rules(&self, policy: &Policy) -> RuleDecisions {
        self.rules_of(&policy.limiters)
    }

    /// The rules that denied the request (shadow rules never deny it: see
    /// [`shadow_denied_rules`](Self::shadow_denied_rules)), named from `policy`.
    pub fn denied_rules<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> impl Iterator<Item = RuleDecision> + 'a {
        self.each_named(&policy.limiters)
            .filter(|r| !r.allowed && !r.shadow)
    }

    /// Some shadow limiter would have denied the request (see
    /// [`Limiter::with_shadow`](crate::Limiter::with_shadow)).
    pub fn shadow_denied(&self) -> bool {
        self.shadow_denied
    }

    /// The shadow rules that would have denied the request, named from `policy`.
    pub fn shadow_denied_rules<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> impl Iterator<Item = RuleDecision> + 'a {
        self.each_named(&policy.limiters)
            .filter(|r| !r.allowed && r.shadow)
    }

    /// The enforced rules this admission brought to their limiter's warning or beyond (see
    /// [`Limiter::with_warning`](crate::Limiter::with_warning)), named from `policy`; none when
    /// the request was denied (its denied rules say more) or nothing was counted.
    pub fn warnings<'a>(&'a self, policy: &'a Policy) -> impl Iterator<Item = RuleDecision> + 'a {
        self.warnings_of(&policy.limiters, policy.warns)
    }

    fn warnings_of<'a>(
        &'a self,
        limiters: &'a [Limiter],
        warns: bool,
    ) -> impl Iterator<Item = RuleDecision> + 'a {
        let counted = warns && self.allowed && self.reason == Reason::Ok;
        self.each_said(limiters)
            .take(if counted { usize::MAX } else { 0 })
            .filter(|(limiter, rule, said)| {
                said.named() && !limiter.shadow && limiter.warns(rule, said.remaining)
            })
            .map(|(limiter, rule, said)| named(limiter, &rule, said))
    }

    /// How long an admission of [`Tollgate::check_within`](crate::Tollgate::check_within)
    /// must wait before its units are due: the latest of its GCRA rules' (`None` when it may
    /// go at once, or was denied).
    pub fn due(&self, policy: &Policy) -> Option<Duration> {
        if !self.allowed || self.reason != Reason::Ok {
            return None;
        }
        let due = self
            .each_said(&policy.limiters)
            .filter(|(limiter, rule, said)| {
                !limiter.shadow && said.named() && rule.algorithm() == crate::Algorithm::Gcra
            })
            .map(|(_, rule, said)| crate::algorithm::gcra_due_us(&rule, said.reset_after_us()))
            .max()
            .unwrap_or(0);
        (due > 0).then(|| Duration::from_micros(due))
    }

    /// Where the store recorded this admission, for an exact
    /// [`refund`](crate::Tollgate::refund); `None` when nothing was recorded (a denial, a peek,
    /// a bypass, a cost of 0, a decision made without the store).
    pub fn receipt(&self) -> Option<Receipt> {
        if self.has & Decision::RECEIPT == 0 {
            return None;
        }
        if let Some(receipt) = self.more.get().and_then(|extra| extra.receipt.as_ref()) {
            return Some(receipt.clone());
        }
        let [at_us, id, units] = self.recorded;
        Some(Receipt::new(at_us, id, units))
    }

    /// The message of the first denying limiter that has one.
    pub fn message(&self) -> Option<&str> {
        let message = self.more.get()?.message.as_deref()?;
        Some(message.as_str())
    }

    /// The smallest `remaining` over the enforced rules: how many more units the policy admits
    /// now.
    pub fn remaining(&self) -> Option<u64> {
        match self.more.get() {
            Some(extra) => extra.remaining,
            None => (self.has & Decision::REMAINING != 0).then_some(self.first.remaining),
        }
    }

    /// [`rules`](Self::rules) over the limiters that were checked.
    pub(crate) fn rules_of(&self, limiters: &[Limiter]) -> RuleDecisions {
        self.each_named(limiters).collect()
    }

    /// Each enforced rule of `limiters` and what it said, when the decision names every rule
    /// at the limit its policy gives it (no override set one): what a policy's header fields
    /// write without naming the rules. `None` for any other decision.
    pub(crate) fn enforced<'a>(
        &'a self,
        limiters: &'a [Limiter],
    ) -> Option<impl Iterator<Item = (&'a Rule, Said)> + Clone + 'a> {
        let rules: usize = limiters.iter().map(|l| l.rules.len()).sum();
        if self.said().len() != rules || !self.said().iter().all(|s| s.named()) {
            return None;
        }
        let enforced = limiters
            .iter()
            .flat_map(|l| l.rules.iter().map(move |r| (l.shadow, r)))
            .zip(self.said().iter().copied())
            .filter(|((shadow, _), _)| !shadow)
            .map(|((_, rule), said)| (rule, said));
        Some(enforced)
    }

    /// Each rule's numbers, named from `limiters`.
    fn each_named<'a>(
        &'a self,
        limiters: &'a [Limiter],
    ) -> impl Iterator<Item = RuleDecision> + 'a {
        self.each_said(limiters)
            .filter(|(_, _, said)| said.named())
            .map(|(limiter, rule, said)| named(limiter, &rule, said))
    }

    /// Each rule of `limiters` (with the limit an override set, if one did) and what it said.
    fn each_said<'a>(
        &'a self,
        limiters: &'a [Limiter],
    ) -> impl Iterator<Item = (&'a Limiter, Rule, Said)> + 'a {
        let rules: usize = limiters.iter().map(|l| l.rules.len()).sum();
        let limits = self.said().get(rules..).unwrap_or_default();
        limiters
            .iter()
            .flat_map(|l| l.rules.iter().map(move |r| (l, r)))
            .zip(self.said().iter().copied())
            .enumerate()
            .map(move |(place, ((limiter, rule), said))| {
                let rule = match limits.iter().find(|l| l.packed == place as u64) {
                    Some(l) => rule.with_limit(l.remaining),
                    None => *rule,
                };
                (limiter, rule, said)
            })
    }
}

/// What `said` of `limiter`'s `rule`, named.
fn named(limiter: &Limiter, rule: &Rule, said: Said) -> RuleDecision {
    RuleDecision {
        limiter: limiter.name.clone(),
        rule: *rule,
        allowed: said.allowed(),
        remaining: said.remaining,
        reset_after: Duration::from_micros(said.reset_after_us()),
        shadow: limiter.shadow,
    }
}

/// A decision with the limiters it answers, so that its rules can be read without the policy
/// at hand: what [`check_group`](crate::Tollgate::check_group) and
/// [`check_single`](crate::Tollgate::check_single) return, and what
/// [`Decision::named`] makes. It reads as a [`Decision`] otherwise.
#[derive(Clone, Debug)]
pub struct NamedDecision {
    decision: Decision,
    limiters: Vec<Limiter>,
}

impl Decision {
    /// This decision with the limiters of `policy` (the policy it answers), to read its rules
    /// later without the policy.
    pub fn named(self, policy: &Policy) -> NamedDecision {
        NamedDecision::new(self, policy.limiters.clone())
    }
}

impl NamedDecision {
    pub(crate) fn new(decision: Decision, limiters: Vec<Limiter>) -> NamedDecision {
        NamedDecision { decision, limiters }
    }

    /// Every rule, named (see [`Decision::rules`]).
    pub fn rules(&self) -> RuleDecisions {
        self.decision.rules_of(&self.limiters)
    }

    /// The rules that denied the request (see [`Decision::denied_rules`]).
    pub fn denied_rules(&self) -> impl Iterator<Item = RuleDecision> + '_ {
        self.decision
            .each_named(&self.limiters)
            .filter(|r| !r.allowed && !r.shadow)
    }

    /// The shadow rules that would have denied the request.
    pub fn shadow_denied_rules(&self) -> impl Iterator<Item = RuleDecision> + '_ {
        self.decision
            .each_named(&self.limiters)
            .filter(|r| !r.allowed && r.shadow)
    }

    /// The rules in warning (see [`Decision::warnings`]).
    pub fn warnings(&self) -> impl Iterator<Item = RuleDecision> + '_ {
        let warns = self
            .limiters
            .iter()
            .any(|l| l.warn_at.is_some() && !l.shadow);
        self.decision.warnings_of(&self.limiters, warns)
    }

    /// The decision alone.
    pub fn into_decision(self) -> Decision {
        self.decision
    }
}

impl Deref for NamedDecision {
    type Target = Decision;

    fn deref(&self) -> &Decision {
        &self.decision
    }
}

impl PartialEq for NamedDecision {
    fn eq(&self, other: &NamedDecision) -> bool {
        self.decision == other.decision && self.rules() == other.rules()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every check moves its decision a few times: it stays small (it was 736 bytes with named
    /// rules inline, then 232 with the numbers of 8 rules inline).
    #[test]
    fn a_decision_stays_small() {
        assert!(
            std::mem::size_of::<Decision>() <= 64,
            "{} bytes",
            std::mem::size_of::<Decision>()
        );
        assert_eq!(std::mem::size_of::<Said>(), 16);
    }

    #[test]
    fn packed_numbers_read_back() {
        let said = Said::new(true, 7, 1_500_000);
        assert!(said.named() && said.allowed());
        assert_eq!((said.remaining, said.reset_after_us()), (7, 1_500_000));
        let huge = Said::new(false, 0, u64::MAX);
        assert!(huge.named() && !huge.allowed());
        assert_eq!(huge.reset_after_us(), (1 << 62) - 1, "saturates");
        assert!(!Said::unnamed().named());
    }

    /// A decision of one rule and a one-instant receipt keeps everything inline.
    #[test]
    fn one_rule_stays_inline() {
        let mut one = Decision::without_rules(true, Reason::Ok);
        one.take_receipt(&mut Some(Receipt::new(5, 6, 1)));
        one.push_said(Said::new(true, 7, 100));
        one.set_remaining(Some(7));
        assert!(one.more.get().is_none());
        assert_eq!(one.remaining(), Some(7));
        assert_eq!(one.receipt(), Some(Receipt::new(5, 6, 1)));
        assert_eq!(one.said(), [Said::new(true, 7, 100)]);
    }

    /// Saying every rule at once is saying them one by one, for no rule, one and several.
    #[test]
    fn saying_all_rules_at_once_is_saying_each() {
        for n in 0..4u64 {
            let said: Vec<Said> = (0..n).map(|i| Said::new(i != 1, i, 10 * i)).collect();
            let (mut each, mut all) = (
                Decision::without_rules(true, Reason::Ok),
                Decision::without_rules(true, Reason::Ok),
            );
            for s in &said {
                each.push_said(*s);
            }
            all.say_all(said.iter().copied());
            assert_eq!(all.said(), &said[..], "{n} rules");
            assert_eq!(all, each, "{n} rules");
            // The limits an override set go after them, as before.
            all.push_said(Said::limit(0, 9));
            each.push_said(Said::limit(0, 9));
            assert_eq!(all, each, "{n} rules and a limit");
        }
    }

    /// A decision of one rule with a message keeps the rule inline beside the message.
    #[test]
    fn one_rule_with_a_message() {
        let mut d = Decision::without_rules(false, Reason::RateLimited);
        d.note_message(&Arc::new("wait".to_owned()));
        d.push_said(Said::new(false, 0, 50));
        d.set_remaining(Some(0));
        assert_eq!(d.said(), [Said::new(false, 0, 50)]);
        assert_eq!((d.message(), d.remaining()), (Some("wait"), Some(0)));
    }

    /// A thread keeps at most `SPARES` boxes beside its next one, however many decisions it
    /// held at once (invariant 6: bounded memory).
    #[test]
    fn a_thread_keeps_a_bounded_number_of_spares() {
        std::thread::spawn(|| {
            let held: Vec<Decision> = (0..100)
                .map(|_| {
                    let mut d = Decision::without_rules(true, Reason::Ok);
                    d.push_said(Said::new(true, 1, 1));
                    d.push_said(Said::new(true, 2, 2));
                    d
                })
                .collect();
            drop(held);
            let next = NEXT.with(|next| {
                let spare = next.take();
                let kept = spare.is_some();
                next.set(spare);
                kept
            });
            assert!(next);
            assert_eq!(SPARE.with(|spares| spares.borrow().len()), SPARES);
        })
        .join()
        .expect("the thread ran");
    }

    /// What does not fit inline reads back as it was set, and a clone owns its own copy.
    #[test]
    fn several_rules_read_back_and_clone() {
        let mut d = Decision::without_rules(true, Reason::Ok);
        let receipt = Receipt::per_limiter([10, 20], 3, 2);
        d.take_receipt(&mut Some(receipt.clone()));
        d.set_outcome(false, Reason::RateLimited);
        d.push_said(Said::new(true, 5, 10));
        d.push_said(Said::new(false, 0, 20));
        d.push_said(Said::limit(1, 9));
        d.set_remaining(Some(0));
        d.note_message(&Arc::new("slow down".to_owned()));
        d.note_message(&Arc::new("not this one".to_owned()));
        d.set_retry_after_us(Some(20));
        let copy = d.clone();
        assert_eq!(copy, d);
        drop(d);
        assert_eq!(copy.remaining(), Some(0));
        assert_eq!(copy.message(), Some("slow down"));
        assert_eq!(copy.retry_after(), Some(Duration::from_micros(20)));
        assert_eq!(copy.receipt(), Some(receipt));
        assert_eq!(
            copy.said(),
            [
                Said::new(true, 5, 10),
                Said::new(false, 0, 20),
                Said::limit(1, 9)
            ]
        );
        let debug = format!("{copy:?}");
        assert!(
            debug.contains("slow down") && debug.contains("RateLimited"),
            "{debug}"
        );
        // A remaining other than the only rule's is kept beside it.
        let mut other = Decision::without_rules(true, Reason::Ok);
        other.push_said(Said::new(true, 7, 100));
        other.set_remaining(Some(3));
        assert_eq!(other.remaining(), Some(3));
        assert_ne!(other, Decision::without_rules(true, Reason::Ok));
        // Reset in place forgets all of it.
        let mut reset = copy.clone();
        reset.reset(true, Reason::Bypassed);
        assert_eq!(reset, Decision::without_rules(true, Reason::Bypassed));
        assert_eq!((reset.said().len(), reset.receipt()), (0, None));
    }
}
