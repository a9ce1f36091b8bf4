//! The path of every check: the keys ([`keys`]), one way to the store with `on_error`
//! ([`Tollgate::run`]), and the decision from the store's verdict ([`conclude`]). Every front
//! end reaches the store through here: the library's checks, the tower layer, the macros and
//! the server's HTTP API (through [`Tollgate::check`] and [`Tollgate::check_sync`]), and its
//! Envoy API (through [`Tollgate::run`], with the requests its descriptors make). A policy of
//! one limiter that needs nothing else is first offered to the store in place
//! ([`Store::check_limiter`]), and its decision written by the same `decide`.

mod conclude;
mod keys;

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

pub(crate) use conclude::{
    ONE_LIMITER_RULES, Told, conclude, cost_exceeds_limit, decide, decide_one_rule,
};
pub(crate) use keys::{BanKeys, CheckKeys, INLINE_LIMITERS, LimiterRequests, push_limiter_key};

use crate::{
    algorithm::RuleOutcome,
    decision::{Decision, Reason},
    engine::{Answered, Tollgate},
    error::{CheckError, StoreError},
    identity::Identity,
    key::KeyBuf,
    policy::{Limiter, OnError, Policy},
    store::{CheckRequest, LimiterCheck, LimiterRequest, Store, Verdict},
};

impl<S: Store> Tollgate<S> {
    /// A check answered without a future, into `out`, when the store can answer at once;
    /// otherwise its keys, prepared once, for [`check_async`](Self::check_async) to ask the
    /// store with. The decision is written in place: it is large (it holds its rules), and
    /// every move is a copy. A policy of one limiter is tried in place first, in the
    /// caller's frame.
    #[inline(always)]
    pub(crate) fn check_now<'i>(
        &self,
        policy: &Policy,
        identity: &'i Identity,
        cost: u64,
        how: (bool, u64),
        out: &mut Decision,
    ) -> Now<'i> {
        if policy.one_limiter && self.check_limiter(policy, identity, cost, how, out) {
            return Now::Done(Ok(()));
        }
        self.check_general(policy, identity, cost, how, out)
    }

    /// [`check_now`](Self::check_now) through the store's general check.
    fn check_general<'i>(
        &self,
        policy: &Policy,
        identity: &'i Identity,
        cost: u64,
        how: (bool, u64),
        out: &mut Decision,
    ) -> Now<'i> {
        let mut keys = CheckKeys::new();
        match self.prepare(policy, identity, cost, how.0, &mut keys, out) {
            Ok(true) => {}
            Ok(false) => return Now::Done(Ok(())),
            Err(e) => return Now::Done(Err(e)),
        }
        let mut verdict = Verdict::empty();
        let on_error = policy.on_error.unwrap_or(self.on_error);
        let mut answered = self.ask_now(policy, &keys, (cost, how), on_error, &mut verdict);
        if keys.bans_deferred && matches!(answered, Some(Answered::Store)) && !verdict.allowed {
            // A denial may write a ban: asked again, with the ban keys. The denial recorded
            // nothing, so the second asking counts as the only one.
            self.ban_keys(policy, identity, &mut keys);
            verdict = Verdict::empty();
            answered = self.ask_now(policy, &keys, (cost, how), on_error, &mut verdict);
        }
        match answered {
            Some(answered) => {
                conclude(&policy.limiters, answered, (&mut verdict, cost), out);
                Now::Done(Ok(()))
            }
            None => {
                // The store's future asks once: with every key.
                if keys.bans_deferred {
                    self.ban_keys(policy, identity, &mut keys);
                }
                Now::Later(keys)
            }
        }
    }

    /// The check of a policy of one limiter ([`Policy::one_limiter`]), answered in place by a
    /// store that keeps no text ([`Store::check_limiter`]), into `out`. False when the general
    /// path must answer: a bypass, a cost above a limit, a ban to read or to write, a missing
    /// dimension, or a store that asks for the whole request (a new key, say).
    #[inline(always)]
    fn check_limiter(
        &self,
        policy: &Policy,
        identity: &Identity,
        cost: u64,
        (consume, delay_us): (bool, u64),
        out: &mut Decision,
    ) -> bool {
        let ([limiter], [head]) = (&policy.limiters[..], &policy.key_heads[..]) else {
            return false;
        };
        if policy.bypass.is_some()
            || cost > policy.max_units
            || self.store.text_keys()
            || (self.blocklist && (policy.may_ban || self.store.bans_possible()))
        {
            return false;
        }
        let mut key = KeyBuf::default();
        if !push_limiter_key(&mut key, (&self.key_start, head), limiter, identity, true) {
            return false;
        }
        let mut outcomes = [RuleOutcome::default(); ONE_LIMITER_RULES];
        let Some(outcomes) = outcomes.get_mut(..limiter.rules.len()) else {
            return false;
        };
        let check = LimiterCheck {
            key: key.bytes(),
            rules: &limiter.rules,
            cost,
            consume,
            delay_us,
        };
        let Some(answer) = self.store.check_limiter(&check, outcomes) else {
            return false;
        };
        if let Some(at) = answer.recorded_at {
            out.set_receipt([at, 0, cost]);
        }
        if let [one] = outcomes {
            decide_one_rule(limiter, one, out);
            return true;
        }
        let told = Told {
            allowed: answer.allowed,
            rules: outcomes,
            blocked_us: None,
            banned_us: None,
            limits: &[],
        };
        decide(&policy.limiters, told, cost, out);
        true
    }

    /// Asks the store for the check of `keys` at once (see [`run_now`](Self::run_now)).
    #[inline(always)]
    fn ask_now(
        &self,
        policy: &Policy,
        keys: &CheckKeys<'_>,
        (cost, how): (u64, (bool, u64)),
        on_error: OnError,
        verdict: &mut Verdict,
    ) -> Option<Answered> {
        if let Some(limiters) = keys.only_limiter(policy) {
            let bans = (&[][..], keys.ban_index(&self.ban_index));
            let request = keys::request_of(policy, &limiters, bans, cost, how);
            self.run_now(&request, on_error, verdict)
        } else {
            let (mut limiters, mut bans) = (LimiterRequests::new(), BanKeys::new());
            let vectors = (&mut limiters, &mut bans);
            let request = keys.request(policy, &self.ban_index, vectors, cost, how);
            self.run_now(&request, on_error, verdict)
        }
    }

    /// The same check, asking the store through its future, with the keys
    /// [`check_now`](Self::check_now) prepared.
    async fn check_async(
        &self,
        policy: &Policy,
        keys: CheckKeys<'_>,
        cost: u64,
        how: (bool, u64),
    ) -> Result<Decision, CheckError> {
        let mut out = Decision::without_rules(true, Reason::Ok);
        let (mut limiters, mut bans) = (LimiterRequests::new(), BanKeys::new());
        let vectors = (&mut limiters, &mut bans);
        let request = keys.request(policy, &self.ban_index, vectors, cost, how);
        let mut verdict = Verdict::empty();
        let on_error = policy.on_error.unwrap_or(self.on_error);
        let answered = self.run(&request, on_error, &mut verdict).await;
        conclude(&policy.limiters, answered, (&mut verdict, cost), &mut out);
        Ok(out)
    }

    /// [`check_async`](Self::check_async), boxed: out of line, so that the frame of a check
    /// answered at once does not hold the store's future (kilobytes of keys) on its stack.
    #[inline(never)]
    fn boxed_check<'a>(
        &'a self,
        policy: &'a Policy,
        keys: CheckKeys<'a>,
        cost: u64,
        how: (bool, u64),
    ) -> Pin<Box<dyn Future<Output = Result<Decision, CheckError>> + Send + 'a>> {
        Box::pin(self.check_async(policy, keys, cost, how))
    }

    /// Runs a check the caller prepared through the engine's one way to the store, when the
    /// store answers at once (without a future: the memory store); `None` when it cannot (then
    /// [`run`](Self::run) asks it). A failed store meets `on_error`.
    #[inline]
    pub fn run_now(
        &self,
        request: &CheckRequest<'_>,
        on_error: OnError,
        verdict: &mut Verdict,
    ) -> Option<Answered> {
        let result = self.store.check_sync(request, verdict)?;
        Some(self.conclude_store(request, result, on_error, verdict))
    }

    /// Runs a check the caller prepared through the engine's one way to the store: at once
    /// when the store can ([`run_now`](Self::run_now)), else through the store's future. A
    /// failed store meets `on_error`: allowed, denied, or checked by the local fallback.
    pub async fn run(
        &self,
        request: &CheckRequest<'_>,
        on_error: OnError,
        verdict: &mut Verdict,
    ) -> Answered {
        if let Some(answered) = self.run_now(request, on_error, verdict) {
            return answered;
        }
        let result = self.store.check(request).await.map(|v| *verdict = v);
        self.conclude_store(request, result, on_error, verdict)
    }

    /// The store's answer, or `on_error`'s when it failed.
    #[inline(always)]
    fn conclude_store(
        &self,
        request: &CheckRequest<'_>,
        result: Result<(), StoreError>,
        on_error: OnError,
        verdict: &mut Verdict,
    ) -> Answered {
        match result {
            Ok(()) => Answered::Store,
            // The error moves on: an admission drops nothing.
            Err(error) => self.store_failed(error, request, on_error, verdict),
        }
    }

    /// `on_error`'s answer to a failed store.
    #[cold]
    #[inline(never)]
    fn store_failed(
        &self,
        _error: StoreError,
        request: &CheckRequest<'_>,
        on_error: OnError,
        verdict: &mut Verdict,
    ) -> Answered {
        match on_error {
            OnError::Allow => Answered::Failed { allowed: true },
            OnError::Deny => Answered::Failed { allowed: false },
            OnError::Local => {
                let local = self.local.get_or_init(self.make_local);
                match local.check_local(request, verdict) {
                    Ok(()) => Answered::Local,
                    Err(_) => Answered::Failed { allowed: false },
                }
            }
        }
    }

    /// `check_group` and `check_single`: `limiters` counted on the caller's `keys`.
    pub(crate) async fn check_named(
        &self,
        limiters: &[Limiter],
        keys: &[String],
        cost: u64,
        out: &mut Decision,
    ) {
        if cost > crate::policy::max_cost(limiters) {
            return cost_exceeds_limit(limiters, cost, out);
        }
        let requests: LimiterRequests<'_> = limiters
            .iter()
            .zip(keys)
            .map(|(l, key)| LimiterRequest {
                key,
                compact: &[],
                rules: &l.rules,
                ban: None,
                shadow: l.shadow,
                overrides: None,
            })
            .collect();
        let request = CheckRequest::new(cost, true, &requests);
        let mut verdict = Verdict::empty();
        let answered = self.run(&request, self.on_error, &mut verdict).await;
        conclude(limiters, answered, (&mut verdict, cost), out);
    }
}

/// The future of [`Tollgate::check`] and [`Tollgate::peek`]. Its first poll decides when the
/// store answers at once (everything lives on that poll's stack); otherwise it boxes the
/// check that awaits the store.
pub(crate) struct Check<'a, S> {
    gate: &'a Tollgate<S>,
    policy: &'a Policy,
    identity: &'a Identity,
    cost: u64,
    /// Whether the check records, and how long its units may wait (µs).
    how: (bool, u64),
    state: CheckState<'a>,
}

enum CheckState<'a> {
    Start,
    Waiting(Pin<Box<dyn Future<Output = Result<Decision, CheckError>> + Send + 'a>>),
    Done,
}

impl<'a, S: Store> Check<'a, S> {
    pub(crate) fn new(
        gate: &'a Tollgate<S>,
        policy: &'a Policy,
        identity: &'a Identity,
        cost: u64,
        how: (bool, u64),
    ) -> Check<'a, S> {
        Check {
            gate,
            policy,
            identity,
            cost,
            how,
            state: CheckState::Start,
        }
    }
}

impl<'a, S: Store> Future for Check<'a, S> {
    type Output = Result<Decision, CheckError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let CheckState::Start = this.state {
            let (gate, policy, identity) = (this.gate, this.policy, this.identity);
            let mut out = Decision::without_rules(true, Reason::Ok);
            match gate.check_now(policy, identity, this.cost, this.how, &mut out) {
                Now::Done(Ok(())) => {
                    this.state = CheckState::Done;
                    return Poll::Ready(Ok(out));
                }
                Now::Done(Err(e)) => {
                    this.state = CheckState::Done;
                    return Poll::Ready(Err(e));
                }
                Now::Later(keys) => {
                    this.state =
                        CheckState::Waiting(gate.boxed_check(policy, keys, this.cost, this.how));
                }
            }
        }
        let CheckState::Waiting(waiting) = &mut this.state else {
            panic!("a tollgate check polled after it completed");
        };
        let done = ready!(waiting.as_mut().poll(cx));
        this.state = CheckState::Done;
        Poll::Ready(done)
    }
}

/// What the first, synchronous look at a check came to.
// It lives on the first poll's stack, and its keys move into the store's future as they are:
// boxing them would allocate on every networked check.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Now<'i> {
    /// Decided (into the caller's decision), or failed.
    Done(Result<(), CheckError>),
    /// The store answers through its future: the check's keys, prepared.
    Later(CheckKeys<'i>),
}
