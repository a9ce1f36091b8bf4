//! The engine: turns a policy and an identity into keys, asks the store, and decides.

use std::{
    any::Any,
    cell::RefCell,
    sync::{Arc, OnceLock},
    time::Duration,
};

use crate::{
    algorithm::RuleOutcome,
    blocklist::{BanEntry, BanTarget, ban_index_key},
    decision::{Decision, Reason, RuleDecision},
    duplicate::{Acquire, Duplicate, DuplicateGuard, DuplicateState, Fingerprint, Lease},
    error::{CheckError, StoreError},
    identity::{Dimension, Identity},
    key,
    memory::{LimiterRef, MemoryStore},
    policy::{Limiter, OnError, Policy},
    rule::{Algorithm, Rule},
    store::{AnyStore, CheckPlan, LockReply, PlanBan, PlanLimiter, Store, Verdict},
};

/// The most limiters, and rules over all of them, that a check on a [`MemoryStore`] holds on
/// the stack; larger policies go through a [`CheckPlan`].
const INLINE_LIMITERS: usize = 4;
const INLINE_RULES: usize = 8;

thread_local! {
    /// The keys of a memory-store check, one buffer per thread reused from check to check.
    static KEYS: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Checks policies against a [`Store`].
///
/// ```
/// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Reason, Tollgate};
///
/// # tokio_test();
/// # fn tokio_test() { tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let gate = Tollgate::new(MemoryStore::new());
/// let sms = Policy::builder("sms_code")
///     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?, "10/1h".parse()?]))
///     .build()?;
/// let who = Identity::new().with_ip("203.0.113.7".parse()?);
///
/// let first = gate.check(&sms, &who, 1).await?;
/// assert!(first.allowed());
/// let second = gate.check(&sms, &who, 1).await?;
/// assert_eq!(second.reason(), Reason::RateLimited);
/// assert!(second.retry_after().unwrap() <= std::time::Duration::from_secs(60));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap() }
/// ```
#[derive(Debug)]
pub struct Tollgate<S> {
    store: S,
    prefix: Arc<str>,
    on_error: OnError,
    blocklist: bool,
    ban_index: Arc<str>,
    max_stored_response: usize,
    local: OnceLock<MemoryStore>,
}

impl<S: Store> Tollgate<S> {
    /// An engine over `store`, with key prefix `tg` and `on_error = allow`.
    pub fn new(store: S) -> Tollgate<S> {
        Tollgate {
            store,
            prefix: "tg".into(),
            on_error: OnError::Allow,
            blocklist: true,
            ban_index: ban_index_key("tg").into(),
            max_stored_response: 1 << 20,
            local: OnceLock::new(),
        }
    }

    /// Whether checks consult the blocklist (default: yes). Turning it off saves the ban
    /// look-up where no limiter bans and nobody bans by hand.
    #[must_use]
    pub fn with_blocklist(mut self, enabled: bool) -> Tollgate<S> {
        self.blocklist = enabled;
        self
    }

    /// The largest response [`complete`](Self::complete) stores for replay (default 1 MiB).
    #[must_use]
    pub fn with_max_stored_response(mut self, bytes: usize) -> Tollgate<S> {
        self.max_stored_response = bytes;
        self
    }

    /// The prefix of every key (default `tg`); lets several applications share one Redis.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl AsRef<str>) -> Tollgate<S> {
        let mut escaped = String::new();
        key::push_part(&mut escaped, prefix.as_ref());
        self.ban_index = ban_index_key(&escaped).into();
        self.prefix = escaped.into();
        self
    }

    /// What to do when the store fails, for policies that do not say (default: allow).
    #[must_use]
    pub fn with_on_error(mut self, on_error: OnError) -> Tollgate<S> {
        self.on_error = on_error;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The largest response [`complete`](Self::complete) stores.
    pub fn max_stored_response(&self) -> usize {
        self.max_stored_response
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Checks `policy` for `identity` and records `cost` units in every rule if all admit.
    ///
    /// Errors only when the identity lacks a dimension a limiter needs; a store failure is
    /// answered by `on_error` with reason [`Reason::StoreUnavailable`].
    pub async fn check(
        &self,
        policy: &Policy,
        identity: &Identity,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.evaluate(policy, identity, cost, true).await
    }

    /// The decision [`check`](Self::check) would return now, recording nothing.
    pub async fn peek(
        &self,
        policy: &Policy,
        identity: &Identity,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.evaluate(policy, identity, cost, false).await
    }

    /// Forgets every counter of `policy` for `identity`.
    pub async fn reset(&self, policy: &Policy, identity: &Identity) -> Result<(), CheckError> {
        let plan = self.plan(policy, identity, 0, false)?;
        self.store.reset(&plan).await?;
        Ok(())
    }

    /// The seed's group check: all `rules` counted on one key `name`.
    ///
    /// Sliding-log rules share one log, so `10/1m` and `100/1h` on one key cost one entry per
    /// request. Store failures follow the engine's `on_error`.
    pub async fn check_group(&self, name: &str, rules: &[Rule], cost: u64) -> Decision {
        let mut unique: Vec<Rule> = Vec::with_capacity(rules.len());
        for rule in rules {
            if !unique.contains(rule) {
                unique.push(*rule);
            }
        }
        let limiter = Limiter::new(Dimension::Global, unique).with_name(name);
        let key = key::group_key(&self.prefix, name);
        self.run_limiters(&[limiter], vec![key], cost, self.on_error)
            .await
    }

    /// The seed's single check: every rule counted on a key of its own (`name` + the rule).
    ///
    /// Each rule is its own limiter in the decision, named like the rule (`10/1m`, or
    /// `10/1m fixed_window` for a non-default algorithm).
    pub async fn check_single(&self, name: &str, rules: &[Rule], cost: u64) -> Decision {
        let mut limiters = Vec::with_capacity(rules.len());
        let mut keys = Vec::with_capacity(rules.len());
        let base = key::group_key(&self.prefix, name);
        for rule in rules {
            // Compare rules, not their text: `2/10s` counted by two algorithms is two rules.
            if limiters
                .iter()
                .any(|l: &Limiter| l.rules.first() == Some(rule))
            {
                continue;
            }
            // Named like the rule, with its algorithm unless it is the default.
            let text = match rule.algorithm() {
                Algorithm::SlidingLog => rule.to_string(),
                other => format!("{rule} {other}"),
            };
            keys.push(format!(
                "{base}:r{}/{}:{}",
                rule.limit(),
                rule.window_ms(),
                rule.algorithm()
            ));
            limiters.push(Limiter::new(Dimension::Global, [*rule]).with_name(text));
        }
        self.run_limiters(&limiters, keys, cost, self.on_error)
            .await
    }

    /// Every active ban, with the time left.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{BanTarget, Identity, MemoryStore, Reason, Tollgate};
    /// # use tollgate::{Dimension, Limiter, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// # let login = Policy::builder("login").limiter(Limiter::new(Dimension::UserId, ["5/1m".parse()?])).build()?;
    /// let mallory = BanTarget::UserId("mallory".into());
    /// gate.ban(&mallory, Duration::from_secs(3600)).await?;
    ///
    /// let who = Identity::new().with_user_id("mallory");
    /// assert_eq!(gate.check(&login, &who, 1).await?.reason(), Reason::Blocked);
    /// assert_eq!(gate.blocklist().await?[0].target, mallory);
    ///
    /// assert!(gate.unban(&mallory).await?);
    /// assert!(gate.check(&login, &who, 1).await?.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn blocklist(&self) -> Result<Vec<BanEntry>, StoreError> {
        self.store.bans(&self.prefix).await
    }

    /// Bans `target` for `duration` from now, on every policy of this engine's prefix.
    pub async fn ban(&self, target: &BanTarget, duration: Duration) -> Result<(), StoreError> {
        self.store.ban(&self.prefix, target, duration).await
    }

    /// Lifts the ban on `target` and forgets its strikes; true if it was banned.
    pub async fn unban(&self, target: &BanTarget) -> Result<bool, StoreError> {
        self.store.unban(&self.prefix, target).await
    }

    /// Tries to take the duplicate-guard lock for this submission.
    ///
    /// Errors when the identity lacks the guard's dimension, or when the store fails: a
    /// duplicate guard has no safe default answer, so the caller decides.
    pub async fn acquire(
        &self,
        guard: &DuplicateGuard,
        identity: &Identity,
        fingerprint: &Fingerprint,
    ) -> Result<Acquire, CheckError> {
        let key = guard
            .key(&self.prefix, identity, fingerprint)
            .ok_or_else(|| CheckError::MissingDimension {
                limiter: format!("duplicate guard of {}", guard.scope),
                dimension: guard.by.to_string(),
            })?;
        let token = new_token();
        let fingerprint = fingerprint.to_string();
        match self
            .store
            .lock_acquire(&key, &token, &fingerprint, guard.ttl)
            .await?
        {
            LockReply::Acquired => Ok(Acquire::Acquired(Lease { key, token })),
            LockReply::Held(held) => Ok(Acquire::Duplicate(Duplicate {
                state: if held.completed {
                    DuplicateState::Completed
                } else {
                    DuplicateState::InProgress
                },
                retry_after: Duration::from_micros(held.ttl_left_us),
                response: held.response,
                fingerprint_matches: held.fingerprint == fingerprint,
            })),
        }
    }

    /// Frees the lock early so the client can retry at once (e.g. the submission failed).
    /// Only the holder's lease frees it: false if it expired or was taken by someone else.
    pub async fn release(&self, lease: &Lease) -> Result<bool, StoreError> {
        self.store.lock_release(&lease.key, &lease.token).await
    }

    /// Records the submission's outcome: for `keep_for`, duplicates are answered with
    /// `response` (replay). False if the lease no longer holds the lock.
    pub async fn complete(
        &self,
        lease: &Lease,
        response: &[u8],
        keep_for: Duration,
    ) -> Result<bool, CheckError> {
        if response.len() > self.max_stored_response {
            return Err(CheckError::ResponseTooLarge {
                size: response.len(),
                cap: self.max_stored_response,
            });
        }
        Ok(self
            .store
            .lock_complete(&lease.key, &lease.token, response, keep_for)
            .await?)
    }

    async fn evaluate(
        &self,
        policy: &Policy,
        identity: &Identity,
        cost: u64,
        consume: bool,
    ) -> Result<Decision, CheckError> {
        if policy.bypass.as_ref().is_some_and(|b| b.matches(identity)) {
            return Ok(Decision::without_rules(true, Reason::Bypassed));
        }
        if let Some(memory) = self.inline_memory(policy, consume) {
            let decided = KEYS.with(|keys| match keys.try_borrow_mut() {
                Ok(mut keys) => {
                    self.check_memory(memory, policy, identity, cost, consume, &mut keys)
                }
                // Entered again from a custom dimension's extractor: a buffer of its own.
                Err(_) => {
                    let mut keys = String::new();
                    self.check_memory(memory, policy, identity, cost, consume, &mut keys)
                }
            })?;
            // `None`: the store failed (a full shard); the plan below meets `on_error`.
            if let Some(decision) = decided {
                return Ok(decision);
            }
        }
        let plan = self.plan(policy, identity, cost, consume)?;
        if cost > policy.max_units {
            return Ok(cost_exceeds_limit(&policy.limiters, cost));
        }
        let on_error = policy.on_error.unwrap_or(self.on_error);
        // Boxed, so that the future of every check (the memory store's included, which never
        // gets here) is not as large as a store's check future.
        Ok(Box::pin(self.run(&policy.limiters, plan, on_error)).await)
    }

    /// The memory store, when a check of `policy` can run on it without a plan: the check
    /// needs no ban keys, and its limiters and rules fit on the stack.
    fn inline_memory(&self, policy: &Policy, consume: bool) -> Option<&MemoryStore> {
        let store = &self.store as &dyn Any;
        let memory = store.downcast_ref::<MemoryStore>().or_else(|| {
            let any = store.downcast_ref::<AnyStore>()?;
            any.as_memory()
        })?;
        let rules: usize = policy.limiters.iter().map(|l| l.rules.len()).sum();
        let fits = policy.limiters.len() <= INLINE_LIMITERS && rules <= INLINE_RULES;
        (fits && !self.needs_ban_keys(policy, consume)).then_some(memory)
    }

    /// Whether a check of `policy` must carry the identity's ban keys: the blocklist is on,
    /// and the check may write a ban or the store says one may be live.
    fn needs_ban_keys(&self, policy: &Policy, consume: bool) -> bool {
        let may_ban = consume && policy.limiters.iter().any(|l| l.ban.is_some());
        self.blocklist && (may_ban || self.store.bans_possible())
    }

    /// Appends `limiter`'s key for `identity` to `out`: `prefix:{head:value}`, where `head` is
    /// the limiter's entry in `Policy::key_heads`.
    fn push_limiter_key(
        &self,
        out: &mut String,
        limiter: &Limiter,
        head: &str,
        identity: &Identity,
    ) -> Result<(), CheckError> {
        key::open_limiter_key(out, &self.prefix, head);
        if !limiter.dimension.push_value(identity, out) {
            return Err(missing_dimension(limiter));
        }
        out.push('}');
        Ok(())
    }

    /// [`Self::evaluate`] on the memory store, with the keys built in `keys` and everything
    /// else on the stack; `None` when the store failed.
    fn check_memory(
        &self,
        memory: &MemoryStore,
        policy: &Policy,
        identity: &Identity,
        cost: u64,
        consume: bool,
        keys: &mut String,
    ) -> Result<Option<Decision>, CheckError> {
        keys.clear();
        let mut ends = [0; INLINE_LIMITERS];
        for ((l, head), end) in policy.limiters.iter().zip(&policy.key_heads).zip(&mut ends) {
            self.push_limiter_key(keys, l, head, identity)?;
            *end = keys.len();
        }
        if cost > policy.max_units {
            return Ok(Some(cost_exceeds_limit(&policy.limiters, cost)));
        }
        let mut limiters = [LimiterRef {
            key: "",
            rules: &[],
        }; INLINE_LIMITERS];
        let mut start = 0;
        for ((l, end), r) in policy.limiters.iter().zip(ends).zip(&mut limiters) {
            *r = LimiterRef {
                key: &keys[start..end],
                rules: &l.rules,
            };
            start = end;
        }
        let limiters = &limiters[..policy.limiters.len()];
        let mut outcomes = [RuleOutcome::default(); INLINE_RULES];
        let outcomes = &mut outcomes[..limiters.iter().map(|l| l.rules.len()).sum()];
        Ok(memory
            .check_limiters(limiters, cost, consume, outcomes)
            .ok()
            .map(|allowed| {
                decide_rules(
                    &policy.limiters,
                    allowed,
                    outcomes,
                    None,
                    Reason::RateLimited,
                )
            }))
    }

    fn plan(
        &self,
        policy: &Policy,
        identity: &Identity,
        cost: u64,
        consume: bool,
    ) -> Result<CheckPlan, CheckError> {
        let limiters = policy
            .limiters
            .iter()
            .zip(&policy.key_heads)
            .map(|(l, head)| {
                let mut key = String::with_capacity(self.prefix.len() + head.len() + 24);
                self.push_limiter_key(&mut key, l, head, identity)?;
                Ok(PlanLimiter {
                    key,
                    rules: l.rules.clone(),
                    ban: l.ban,
                })
            })
            .collect::<Result<Vec<_>, CheckError>>()?;
        let plan = CheckPlan::new(cost, consume, limiters);
        // Ban keys cost a key per target to build: skip them when this check can neither meet
        // a ban (the store knows none can be live) nor write one.
        if !self.needs_ban_keys(policy, consume) {
            return Ok(plan);
        }
        let targets = identity.ip().map(BanTarget::Ip).into_iter().chain(
            identity
                .user_id()
                .map(|id| BanTarget::UserId(id.to_owned())),
        );
        let bans = targets
            .map(|target| PlanBan {
                key: target.key(&self.prefix),
                target,
            })
            .collect();
        Ok(plan.with_bans(bans, self.ban_index.to_string()))
    }

    async fn run_limiters(
        &self,
        limiters: &[Limiter],
        keys: Vec<String>,
        cost: u64,
        on_error: OnError,
    ) -> Decision {
        let min_limit = limiters
            .iter()
            .flat_map(|l| l.rules.iter())
            .map(Rule::limit)
            .min();
        if min_limit.is_some_and(|m| cost > m) {
            return cost_exceeds_limit(limiters, cost);
        }
        let plan_limiters = limiters
            .iter()
            .zip(keys)
            .map(|(l, key)| PlanLimiter {
                key,
                rules: l.rules.clone(),
                ban: None,
            })
            .collect();
        self.run(
            limiters,
            CheckPlan::new(cost, true, plan_limiters),
            on_error,
        )
        .await
    }

    async fn run(&self, limiters: &[Limiter], plan: CheckPlan, on_error: OnError) -> Decision {
        match self.store.check(&plan).await {
            Ok(verdict) => decide(limiters, verdict, Reason::RateLimited),
            Err(_) => match on_error {
                OnError::Allow => Decision::without_rules(true, Reason::StoreUnavailable),
                OnError::Deny => Decision::without_rules(false, Reason::StoreUnavailable),
                OnError::Local => {
                    let local = self.local.get_or_init(MemoryStore::new);
                    match local.check_now(&plan) {
                        Ok(verdict) => {
                            let mut d = decide(limiters, verdict, Reason::StoreUnavailable);
                            d.reason = Reason::StoreUnavailable;
                            d
                        }
                        Err(_) => Decision::without_rules(false, Reason::StoreUnavailable),
                    }
                }
            },
        }
    }
}

fn decide(limiters: &[Limiter], verdict: Verdict, denied: Reason) -> Decision {
    if let Some(left) = verdict.blocked_us {
        let mut d = Decision::without_rules(false, Reason::Blocked);
        d.retry_after = Some(Duration::from_micros(left));
        return d;
    }
    decide_rules(
        limiters,
        verdict.allowed,
        &verdict.rules,
        verdict.banned_us,
        denied,
    )
}

/// The decision from one outcome per rule, limiters in order.
fn decide_rules(
    limiters: &[Limiter],
    allowed: bool,
    outcomes: &[RuleOutcome],
    banned_us: Option<u64>,
    denied: Reason,
) -> Decision {
    let mut outcomes = outcomes.iter();
    let mut rules = Vec::with_capacity(outcomes.len());
    let mut retry_after = None::<u64>;
    let mut message = None;
    for limiter in limiters {
        for (rule, outcome) in limiter.rules.iter().zip(outcomes.by_ref()) {
            if !outcome.allowed {
                if message.is_none() {
                    message.clone_from(&limiter.message);
                }
                retry_after = retry_after.max(outcome.retry_after_us);
            }
            rules.push(RuleDecision {
                limiter: limiter.name.clone(),
                rule: *rule,
                allowed: outcome.allowed,
                remaining: outcome.remaining,
                reset_after: Duration::from_micros(outcome.reset_after_us),
            });
        }
    }
    Decision {
        allowed,
        reason: if allowed { Reason::Ok } else { denied },
        retry_after: if allowed {
            None
        } else {
            // A ban written by this denial outlasts the rule's own wait.
            retry_after.max(banned_us).map(Duration::from_micros)
        },
        rules,
        message: if allowed { None } else { message },
    }
}

fn missing_dimension(limiter: &Limiter) -> CheckError {
    CheckError::MissingDimension {
        limiter: limiter.name.to_string(),
        dimension: limiter.dimension.to_string(),
    }
}

/// 128 random bits, hex: a lease token nobody can guess.
fn new_token() -> String {
    let bits: u128 = rand::random();
    format!("{bits:032x}")
}

fn cost_exceeds_limit(limiters: &[Limiter], cost: u64) -> Decision {
    let mut decision = Decision::without_rules(false, Reason::CostExceedsLimit);
    for limiter in limiters {
        for rule in limiter.rules.iter().filter(|r| r.limit() < cost) {
            if decision.message.is_none() {
                decision.message.clone_from(&limiter.message);
            }
            decision.rules.push(RuleDecision {
                limiter: limiter.name.clone(),
                rule: *rule,
                allowed: false,
                remaining: 0,
                reset_after: Duration::ZERO,
            });
        }
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;

    async fn shared_state<S: Store>(gate: Tollgate<S>) {
        let policy = Policy::builder("login")
            .limiter(Limiter::new(Dimension::Ip, ["2/1m".parse().unwrap()]))
            .build()
            .unwrap();
        let who = Identity::new().with_ip("192.0.2.1".parse().unwrap());
        let check = || gate.check(&policy, &who, 1);
        assert!(check().await.unwrap().allowed());
        assert!(check().await.unwrap().allowed());
        assert!(!check().await.unwrap().allowed());
        // `reset` goes through a plan: it finds what the checks without one recorded.
        gate.reset(&policy, &who).await.unwrap();
        assert!(check().await.unwrap().allowed());
        // Once a ban may be live, checks carry ban keys and go through a plan: same counts.
        let other = BanTarget::Ip("198.51.100.9".parse().unwrap());
        gate.ban(&other, Duration::from_secs(3600)).await.unwrap();
        assert!(gate.store().bans_possible());
        assert!(check().await.unwrap().allowed());
        let denied = check().await.unwrap();
        assert!(!denied.allowed());
        assert_eq!(denied.rules()[0].remaining, 0);
    }

    /// The same checks, on one engine that runs them without a plan and on one that needs
    /// plans (a ban on somebody else may be live), decide the same, step by step.
    #[tokio::test]
    async fn checks_with_and_without_a_plan_decide_alike() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let gate = |clock: &ManualClock| {
            Tollgate::new(
                MemoryStore::builder()
                    .clock(clock.clone())
                    .purge_interval(None)
                    .build(),
            )
        };
        let (planless, planned) = (gate(&clock), gate(&clock));
        let somebody = BanTarget::UserId("somebody else".into());
        planned
            .ban(&somebody, Duration::from_secs(86_400))
            .await
            .unwrap();
        let rule = |text: &str, algorithm| text.parse::<Rule>().unwrap().with_algorithm(algorithm);
        let policy = Policy::builder("both")
            .limiter(Limiter::new(
                Dimension::Ip,
                [
                    rule("3/1s", Algorithm::SlidingLog),
                    rule("5/3s", Algorithm::SlidingLog),
                    rule("4/2s", Algorithm::Gcra),
                ],
            ))
            .limiter(Limiter::new(
                Dimension::UserId,
                [rule("6/2s", Algorithm::FixedWindow)],
            ))
            .build()
            .unwrap();
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let mut admitted = 0;
        for step in 0..600 {
            clock.advance(Duration::from_millis(next(150)));
            let who = Identity::new()
                .with_ip(format!("192.0.2.{}", next(3)).parse().unwrap())
                .with_user_id(format!("u{}", next(2)));
            let cost = next(3);
            let (a, b) = if next(4) == 0 {
                (
                    planless.peek(&policy, &who, cost).await,
                    planned.peek(&policy, &who, cost).await,
                )
            } else {
                (
                    planless.check(&policy, &who, cost).await,
                    planned.check(&policy, &who, cost).await,
                )
            };
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a, b, "step {step}");
            admitted += usize::from(a.allowed());
        }
        // Both paths were taken, and both answers were given often.
        assert!(planned.store().bans_possible() && !planless.store().bans_possible());
        assert!((150..450).contains(&admitted), "{admitted} of 600 admitted");
    }

    #[tokio::test]
    async fn checks_with_and_without_a_plan_share_state() {
        let memory = || {
            MemoryStore::builder()
                .clock(ManualClock::new(Duration::from_secs(1_000)))
                .purge_interval(None)
                .build()
        };
        shared_state(Tollgate::new(memory())).await;
        shared_state(Tollgate::new(AnyStore::new(memory()))).await;
    }
}
