//! Owned checks for store-level tests: a [`CheckPlan`] holds its keys and rules, and
//! [`PlanExt`] runs it on any store through the borrowed [`CheckRequest`] every store takes.

use std::future::Future;

use tollgate::{
    BanKey, BanRule, BanTarget, CheckRequest, LimiterRequest, Rule, Store, StoreError, Verdict,
};

/// One limiter of a [`CheckPlan`].
#[derive(Clone, Debug)]
pub struct PlanLimiter {
    /// The base key, hash tag included.
    pub key: String,
    /// The rules, in order.
    pub rules: Vec<Rule>,
    /// Ban the identity when this limiter denies.
    pub ban: Option<BanRule>,
    /// A dry run (see [`LimiterRequest::shadow`]).
    pub shadow: bool,
}

impl PlanLimiter {
    /// A limiter without a ban rule.
    pub fn new(key: impl Into<String>, rules: &[Rule]) -> PlanLimiter {
        PlanLimiter {
            key: key.into(),
            rules: rules.to_vec(),
            ban: None,
            shadow: false,
        }
    }

    /// The same limiter in shadow mode.
    #[must_use]
    pub fn shadow(mut self) -> PlanLimiter {
        self.shadow = true;
        self
    }

    /// The limiter's state keys (see [`LimiterRequest::state_keys`]).
    pub fn state_keys(&self) -> Vec<String> {
        LimiterRequest {
            key: &self.key,
            compact: &[],
            rules: &self.rules,
            ban: self.ban,
            shadow: self.shadow,
            overrides: None,
        }
        .state_keys()
    }
}

/// One ban key of a [`CheckPlan`].
#[derive(Clone, Debug)]
pub struct PlanBan {
    /// Where the ban lives.
    pub key: String,
    /// Whom it bans.
    pub target: BanTarget,
}

impl PlanBan {
    /// The ban key of `target` under `prefix`.
    pub fn new(prefix: &str, target: BanTarget) -> PlanBan {
        PlanBan {
            key: target.key(prefix),
            target,
        }
    }
}

/// A check that owns what its [`CheckRequest`] borrows.
#[derive(Clone, Debug)]
pub struct CheckPlan {
    /// Units this check consumes.
    pub cost: u64,
    /// Record the admission, or only look.
    pub consume: bool,
    /// The limiters.
    pub limiters: Vec<PlanLimiter>,
    /// The identity's ban keys.
    pub bans: Vec<PlanBan>,
    /// The ban index key.
    pub ban_index: String,
}

impl CheckPlan {
    /// A plan over `limiters`, without bans.
    pub fn new(cost: u64, consume: bool, limiters: Vec<PlanLimiter>) -> CheckPlan {
        CheckPlan {
            cost,
            consume,
            limiters,
            bans: Vec::new(),
            ban_index: String::new(),
        }
    }

    /// Adds ban keys.
    #[must_use]
    pub fn with_bans(mut self, bans: Vec<PlanBan>, ban_index: String) -> CheckPlan {
        self.bans = bans;
        self.ban_index = ban_index;
        self
    }

    fn limiter_requests(&self) -> Vec<LimiterRequest<'_>> {
        self.limiters
            .iter()
            .map(|l| LimiterRequest {
                key: &l.key,
                compact: &[],
                rules: &l.rules,
                ban: l.ban,
                shadow: l.shadow,
                overrides: None,
            })
            .collect()
    }
}

/// Runs a [`CheckPlan`] on a store.
pub trait PlanExt: Store {
    /// [`Store::check`] of the plan.
    fn check_plan(
        &self,
        plan: &CheckPlan,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send;
    /// [`Store::reset`] of the plan's limiters.
    fn reset_plan(&self, plan: &CheckPlan) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl<S: Store> PlanExt for S {
    async fn check_plan(&self, plan: &CheckPlan) -> Result<Verdict, StoreError> {
        let limiters = plan.limiter_requests();
        let values: Vec<String> = plan.bans.iter().map(|b| b.target.value()).collect();
        let bans: Vec<BanKey<'_>> = plan
            .bans
            .iter()
            .zip(&values)
            .map(|(b, value)| BanKey {
                write: true,
                key: &b.key,
                kind: b.target.kind(),
                value,
            })
            .collect();
        let request =
            CheckRequest::new(plan.cost, plan.consume, &limiters).with_bans(&bans, &plan.ban_index);
        self.check(&request).await
    }

    async fn reset_plan(&self, plan: &CheckPlan) -> Result<(), StoreError> {
        let limiters = plan.limiter_requests();
        self.reset(&CheckRequest::new(0, false, &limiters)).await
    }
}
