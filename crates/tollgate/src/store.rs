//! The store contract: what a backend must do atomically.

use std::{future::Future, pin::Pin, sync::Arc};

use crate::{
    algorithm::RuleOutcome,
    error::StoreError,
    key,
    rule::{Algorithm, Rule},
};

/// One atomic check as a store sees it: every limiter's base key and rules, the cost, and
/// whether to record an admission or only look.
///
/// A store must evaluate every rule of every limiter against one instant, and record the
/// admission in all of them only if all of them admit (invariant 2).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CheckPlan {
    /// Units this request consumes.
    pub cost: u64,
    /// Record the admission (`check`) or only compute the decision (`peek`).
    pub consume: bool,
    /// The limiters, in policy order.
    pub limiters: Vec<PlanLimiter>,
}

impl CheckPlan {
    /// A plan over `limiters`.
    pub fn new(cost: u64, consume: bool, limiters: Vec<PlanLimiter>) -> CheckPlan {
        CheckPlan {
            cost,
            consume,
            limiters,
        }
    }

    /// How many rules the plan holds, over all limiters.
    pub fn rule_count(&self) -> usize {
        self.limiters.iter().map(|l| l.rules.len()).sum()
    }
}

/// One limiter of a [`CheckPlan`].
#[derive(Clone, Debug)]
pub struct PlanLimiter {
    /// The base key, hash tag included (see [`key::limiter_key`]).
    pub key: String,
    /// The rules, in policy order.
    pub rules: Arc<[Rule]>,
}

impl PlanLimiter {
    /// The distinct state keys of this limiter: the shared sliding log first (if any rule uses
    /// it), then one key per fixed-window or GCRA rule in rule order.
    pub fn state_keys(&self) -> Vec<String> {
        let mut keys = Vec::with_capacity(self.rules.len());
        if let Some(log) = self
            .rules
            .iter()
            .find(|r| r.algorithm() == Algorithm::SlidingLog)
        {
            keys.push(key::rule_key(&self.key, log));
        }
        keys.extend(
            self.rules
                .iter()
                .filter(|r| r.algorithm() != Algorithm::SlidingLog)
                .map(|r| key::rule_key(&self.key, r)),
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

/// A store's answer to a [`CheckPlan`].
///
/// When the plan is admitted, each outcome describes the state after recording it (for a peek:
/// as it would be). When it is denied, nothing is recorded and each rule that would have
/// admitted describes the state as it stays (its outcome for a cost of zero).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Every rule admitted; the admission was recorded if the plan consumes.
    pub allowed: bool,
    /// One outcome per rule, limiters in plan order, rules in limiter order.
    pub rules: Vec<RuleOutcome>,
}

/// Where rate-limit state lives. Implemented by [`MemoryStore`](crate::MemoryStore) and by
/// `tollgate_redis::RedisStore`.
pub trait Store: Send + Sync + 'static {
    /// Runs one atomic check (see [`CheckPlan`]).
    fn check(&self, plan: &CheckPlan) -> impl Future<Output = Result<Verdict, StoreError>> + Send;

    /// Forgets every state key of the plan's limiters.
    fn reset(&self, plan: &CheckPlan) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Answers when the store is reachable.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl<S: Store> Store for Arc<S> {
    fn check(&self, plan: &CheckPlan) -> impl Future<Output = Result<Verdict, StoreError>> + Send {
        (**self).check(plan)
    }

    fn reset(&self, plan: &CheckPlan) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).reset(plan)
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).ping()
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

trait DynStore: Send + Sync + 'static {
    fn check<'a>(&'a self, plan: &'a CheckPlan) -> BoxFuture<'a, Result<Verdict, StoreError>>;
    fn reset<'a>(&'a self, plan: &'a CheckPlan) -> BoxFuture<'a, Result<(), StoreError>>;
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

impl<S: Store> DynStore for S {
    fn check<'a>(&'a self, plan: &'a CheckPlan) -> BoxFuture<'a, Result<Verdict, StoreError>> {
        Box::pin(Store::check(self, plan))
    }

    fn reset<'a>(&'a self, plan: &'a CheckPlan) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::reset(self, plan))
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(Store::ping(self))
    }
}

/// Any store, chosen at run time (e.g. from a configuration URL).
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
    pub fn new(store: impl Store) -> AnyStore {
        AnyStore(Arc::new(store))
    }
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnyStore")
    }
}

impl Store for AnyStore {
    async fn check(&self, plan: &CheckPlan) -> Result<Verdict, StoreError> {
        self.0.check(plan).await
    }

    async fn reset(&self, plan: &CheckPlan) -> Result<(), StoreError> {
        self.0.reset(plan).await
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.ping()
    }
}
