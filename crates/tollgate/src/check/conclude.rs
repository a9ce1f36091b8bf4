//! The decision from how a check was answered: the store's verdict, or `on_error`'s.

use crate::{
    algorithm::RuleOutcome,
    decision::{Decision, Reason, Said},
    engine::Answered,
    error::CheckError,
    policy::Limiter,
    store::Verdict,
};

/// The decision from how a check was answered (into `out`): the verdict's, or `on_error`'s.
#[inline]
pub(crate) fn conclude(
    limiters: &[Limiter],
    answered: Answered,
    (verdict, cost): (&mut Verdict, u64),
    out: &mut Decision,
) {
    match answered {
        Answered::Store => {
            out.take_receipt(&mut verdict.receipt);
            decide(limiters, Told::of(verdict), cost, out);
        }
        Answered::Local => {
            // Without the receipt: recorded in the local store, which a refund does not reach.
            decide(limiters, Told::of(verdict), cost, out);
            out.set_reason(Reason::StoreUnavailable);
        }
        Answered::Failed { allowed } => out.reset(allowed, Reason::StoreUnavailable),
    }
}

/// The most rules a limiter may have to be checked in place (see `Tollgate::check_limiter`):
/// their outcomes live in an array on the stack.
pub(crate) const ONE_LIMITER_RULES: usize = 4;

/// What a store told of a check, borrowed: a [`Verdict`]'s parts, or a [`LimiterCheck`]'s
/// answer and outcomes (see `Tollgate::check_limiter`).
///
/// [`LimiterCheck`]: crate::LimiterCheck
#[derive(Clone, Copy)]
pub(crate) struct Told<'a> {
    pub(crate) allowed: bool,
    pub(crate) rules: &'a [RuleOutcome],
    pub(crate) blocked_us: Option<u64>,
    pub(crate) banned_us: Option<u64>,
    pub(crate) limits: &'a [(usize, u64)],
}

impl<'a> Told<'a> {
    #[inline(always)]
    fn of(verdict: &'a Verdict) -> Told<'a> {
        Told {
            allowed: verdict.allowed,
            rules: &verdict.rules,
            blocked_us: verdict.blocked_us,
            banned_us: verdict.banned_us,
            limits: &verdict.limits,
        }
    }
}

/// The decision from what a store told, into `out`, a fresh decision
/// ([`Decision::without_rules`]: every caller makes one per check, so nothing is reset twice)
/// that holds the check's receipt already, if any.
pub(crate) fn decide(limiters: &[Limiter], told: Told<'_>, cost: u64, out: &mut Decision) {
    debug_assert!(out.remaining().is_none());
    if let Some(left) = told.blocked_us {
        out.set_outcome(false, Reason::Blocked);
        out.set_retry_after_us(Some(left));
        return;
    }
    out.set_outcome(told.allowed, Reason::Ok);
    if let [limiter] = limiters {
        if told.allowed && !limiter.shadow {
            return admitted_by_one(limiter, &told, out);
        }
    }
    let mut outcomes = told.rules.iter();
    let mut retry_after = None::<u64>;
    let mut remaining = None::<u64>;
    // Every denial is a concurrency limit's (until a rate rule denies).
    let mut concurrency = true;
    for limiter in limiters {
        for (rule, outcome) in limiter.rules.iter().zip(outcomes.by_ref()) {
            if limiter.shadow {
                out.note_shadow_denied(!outcome.allowed);
            } else {
                remaining = Some(remaining.map_or(outcome.remaining, |r| r.min(outcome.remaining)));
                if !outcome.allowed {
                    if let Some(message) = &limiter.message {
                        out.note_message(message);
                    }
                    retry_after = retry_after.max(outcome.retry_after_us);
                    concurrency &= rule.is_concurrent();
                }
            }
        }
    }
    // What every rule said, at once: the outcomes the walk paired with rules, in policy order
    // (`zip` takes a rule before its outcome, so a limiter's last rule consumed no extra one).
    let said = told.rules.len() - outcomes.len();
    out.say_all(
        told.rules[..said]
            .iter()
            .map(|o| Said::new(o.allowed, o.remaining, o.reset_after_us)),
    );
    out.push_limits(told.limits);
    out.set_remaining(remaining);
    if !told.allowed {
        out.set_reason(if concurrency {
            Reason::ConcurrencyLimited
        } else {
            Reason::RateLimited
        });
        // A ban written by this denial outlasts the rule's own wait.
        let retry_after = retry_after.max(told.banned_us);
        out.set_retry_after_us(retry_after);
        // No wait helps any denying rule: maybe a cost above the limits in force.
        if retry_after.is_none() && !concurrency && cost_above_limits(limiters, &told, cost) {
            out.set_reason(Reason::CostExceedsLimit);
        }
    }
}

/// [`decide`] for a policy of one limiter, enforced, of one rule without overrides, none a
/// concurrency limit (see `Tollgate::check_limiter`), from the rule's outcome: the most common
/// check, without walking rules.
#[inline(always)]
pub(crate) fn decide_one_rule(limiter: &Limiter, o: &RuleOutcome, out: &mut Decision) {
    out.say_only(Said::new(o.allowed, o.remaining, o.reset_after_us));
    if !o.allowed {
        // Without overrides a cost above the limit was refused before the store, so a wait is
        // known; and a concurrency limit is never checked this way.
        out.set_reason(Reason::RateLimited);
        out.set_retry_after_us(o.retry_after_us);
        if let Some(message) = &limiter.message {
            out.note_message(message);
            // Once a decision holds extra values, its smallest `remaining` is among them.
            out.set_remaining(Some(o.remaining));
        }
    }
}

/// [`decide`] for the most common verdict: an admission by a policy's only limiter, enforced
/// (no rule denied, so no message, wait or reason to find).
#[inline(always)]
fn admitted_by_one(limiter: &Limiter, told: &Told<'_>, out: &mut Decision) {
    let outcomes = &told.rules[..limiter.rules.len().min(told.rules.len())];
    let remaining = outcomes.iter().map(|o| o.remaining).min();
    out.say_all(
        outcomes
            .iter()
            .map(|o| Said::new(o.allowed, o.remaining, o.reset_after_us)),
    );
    out.push_limits(told.limits);
    out.set_remaining(remaining);
}

/// Whether every enforced rule that denied did so because `cost` is above its limit: what the
/// engine refuses before the store for limiters of known limits, and the store, for limiters
/// that take overrides (their limit is the store's to know).
#[cold]
fn cost_above_limits(limiters: &[Limiter], told: &Told<'_>, cost: u64) -> bool {
    if !limiters.iter().any(|l| l.overrides.is_some()) {
        return false;
    }
    let rules = limiters
        .iter()
        .flat_map(|l| l.rules.iter().map(move |r| (l, r)));
    let mut denied = rules
        .zip(told.rules)
        .enumerate()
        .filter(|(_, ((limiter, _), outcome))| !limiter.shadow && !outcome.allowed)
        .map(|(place, ((_, rule), _))| cost > Verdict::limit_at(told.limits, place, rule.limit()))
        .peekable();
    denied.peek().is_some() && denied.all(|too_large| too_large)
}

pub(crate) fn missing_dimension(limiter: &Limiter) -> CheckError {
    CheckError::MissingDimension {
        limiter: limiter.name.to_string(),
        dimension: limiter.dimension.to_string(),
    }
}

pub(crate) fn cost_exceeds_limit(limiters: &[Limiter], cost: u64, out: &mut Decision) {
    out.reset(false, Reason::CostExceedsLimit);
    let mut remaining = None;
    for limiter in limiters {
        for rule in limiter.rules.iter() {
            if !limiter.shadow && crate::policy::cost_too_large(rule, cost) {
                if let Some(message) = &limiter.message {
                    out.note_message(message);
                }
                out.push_said(Said::new(false, 0, 0));
                remaining = Some(0);
            } else {
                out.push_said(Said::unnamed());
            }
        }
    }
    out.set_remaining(remaining);
}
