//! Decisions: allowed or denied, why, and what every rule says.

use std::{borrow::Borrow, fmt, ops::Deref, sync::Arc, time::Duration};

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
/// ([`rules`](Self::rules)). It holds up to [`INLINE_RULES`](crate::INLINE_RULES) rules over
/// all limiters without a heap allocation.
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub(crate) allowed: bool,
    pub(crate) reason: Reason,
    /// Some shadow rule would have denied.
    pub(crate) shadow_denied: bool,
    pub(crate) retry_after: Option<Duration>,
    /// The smallest `remaining` over the enforced rules.
    pub(crate) remaining: Option<u64>,
    pub(crate) said: SmallVec<[Said; INLINE_RULES]>,
    pub(crate) message: Option<Arc<String>>,
    pub(crate) receipt: Option<Receipt>,
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
    #[inline(always)]
    pub(crate) fn without_rules(allowed: bool, reason: Reason) -> Decision {
        Decision {
            allowed,
            reason,
            shadow_denied: false,
            retry_after: None,
            remaining: None,
            said: SmallVec::new(),
            message: None,
            receipt: None,
        }
    }

    /// Makes this an empty decision, in place.
    #[inline(always)]
    pub(crate) fn reset(&mut self, allowed: bool, reason: Reason) {
        self.allowed = allowed;
        self.reason = reason;
        self.shadow_denied = false;
        self.retry_after = None;
        self.remaining = None;
        self.said.clear();
        self.message = None;
        self.receipt = None;
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
        self.retry_after
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
    pub fn receipt(&self) -> Option<&Receipt> {
        self.receipt.as_ref()
    }

    /// The message of the first denying limiter that has one.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref().map(String::as_str)
    }

    /// The smallest `remaining` over the enforced rules: how many more units the policy admits
    /// now.
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
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
        if self.said.len() != rules || !self.said.iter().all(|s| s.named()) {
            return None;
        }
        let enforced = limiters
            .iter()
            .flat_map(|l| l.rules.iter().map(move |r| (l.shadow, r)))
            .zip(self.said.iter().copied())
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
        let limits = self.said.get(rules..).unwrap_or_default();
        limiters
            .iter()
            .flat_map(|l| l.rules.iter().map(move |r| (l, r)))
            .zip(&self.said)
            .enumerate()
            .map(move |(place, ((limiter, rule), said))| {
                let rule = match limits.iter().find(|l| l.packed == place as u64) {
                    Some(l) => rule.with_limit(l.remaining),
                    None => *rule,
                };
                (limiter, rule, *said)
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
    /// rules inline), with the numbers of 8 rules inline.
    #[test]
    fn a_decision_stays_small() {
        const { assert!(INLINE_RULES >= 8) };
        assert!(
            std::mem::size_of::<Decision>() <= 240,
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
}
