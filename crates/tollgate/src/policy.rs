//! Limiters and policies: what guards one action.

use std::{collections::HashSet, fmt, sync::Arc, time::Duration};

use crate::{
    blocklist::{BanRule, BanScope},
    bypass::Bypass,
    decision::LimiterName,
    error::PolicyError,
    identity::{Dimension, IpPrefix},
    key,
    rule::{Algorithm, Rule},
    store::LimiterRequest,
};

/// The largest limit of a sliding-log rule: its log holds one entry per admitted unit, per
/// client (8 bytes each in memory, a sorted-set member in Redis). Larger limits take
/// `fixed_window` or `gcra`, whose state is one or two numbers.
pub const MAX_LOG_LIMIT: u64 = 1_000_000;

/// The largest cost one check may charge a sliding-log rule: each unit is an entry written by
/// the check, so this bounds a check's work and memory whatever the limit. A check of a larger
/// cost is refused with [`Reason::CostExceedsLimit`](crate::Reason::CostExceedsLimit); costly
/// units take `gcra`, `fixed_window` or `sliding_window`, whose cost is one number.
pub const MAX_LOG_COST: u64 = 1_000;

/// What to do when the store cannot answer; see [`PolicyBuilder::on_error`]. A decision made
/// this way has reason [`Reason::StoreUnavailable`](crate::Reason::StoreUnavailable).
///
/// ```
/// use tollgate::{Dimension, Limiter, OnError, Policy};
///
/// // Logins fail closed: without the store, nobody gets unlimited attempts.
/// let login = Policy::builder("login")
///     .limiter(Limiter::new(Dimension::Ip, ["5/1m".parse()?]))
///     .on_error(OnError::Deny)
///     .build()?;
/// assert_eq!(login.on_error(), Some(OnError::Deny));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum OnError {
    /// Fail open: admit the request.
    #[default]
    Allow,
    /// Fail closed: deny the request.
    Deny,
    /// Decide with an in-process memory store holding the same rules (per-instance limits).
    /// It knows only what this instance counted while the store was down: the store's bans
    /// and overrides do not reach it, so each identity gets the configured rules.
    Local,
}

/// How far a check's writes must reach before its decision is final; see
/// [`PolicyBuilder::durability`].
///
/// Redis replicates asynchronously: a primary that dies before its replica has its latest
/// writes takes them along, and the replica promoted in its place admits those units again.
/// `Replicated` closes that hole for the limits where it matters (monthly paid quotas): a
/// check that admits is final only once `replicas` replicas hold its writes; when they do not
/// within `timeout`, the check is a store failure and the policy's `on_error` decides.
///
/// A store without replicas (the memory store) has nothing to wait for: every durability is
/// met as soon as the check is.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Dimension, Durability, Limiter, OnError, Policy};
///
/// let quota = Policy::builder("monthly_exports")
///     .limiter(Limiter::new(Dimension::UserId, ["10000/30d".parse()?]))
///     .durability(Durability::replicated(1, Duration::from_millis(50)))
///     .on_error(OnError::Deny)
///     .build()?;
/// assert!(quota.durability().is_replicated());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Final when the primary has recorded it (the default): a failover can lose what the
    /// replicas had not yet received.
    #[default]
    Async,
    /// Final when at least `replicas` replicas have acknowledged the check's writes, within
    /// `timeout` (Redis `WAIT`, one per batch of checks).
    Replicated {
        /// How many replicas must hold the writes (at least 1).
        replicas: u32,
        /// How long to wait for them (at least 1 ms).
        timeout: Duration,
    },
}

impl Durability {
    /// [`Durability::Replicated`] with these numbers (checked by [`PolicyBuilder::build`]).
    pub const fn replicated(replicas: u32, timeout: Duration) -> Durability {
        Durability::Replicated { replicas, timeout }
    }

    /// Whether a check waits for replicas.
    pub const fn is_replicated(&self) -> bool {
        matches!(self, Durability::Replicated { .. })
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Durability::Async => f.write_str("async"),
            Durability::Replicated { replicas, timeout } => {
                let s = if *replicas == 1 { "" } else { "s" };
                write!(f, "replicated ({replicas} replica{s} within {timeout:?})")
            }
        }
    }
}

/// Quota an instance takes from a shared store in advance and spends locally; see
/// [`PolicyBuilder::lease`].
///
/// Each check that finds no quota left in hand takes `k` units of the identity's limits at
/// once, with one ordinary check of cost `k` (all-or-nothing over every limiter and rule, timed
/// by the store's clock, as any check), and admits the next checks of the same identity in this
/// process until those units are spent or the lease ends. What a lease did not spend goes back
/// with the exact refund of its receipt. `k` follows this instance's own rate (enough for
/// `ttl`), never more than `share` of what the store said was left nor `max_units`, so that
/// quiet instances are not starved by busy ones; near the limit it shrinks to the check's cost.
///
/// A lease ends after `ttl`, and always before the end of the window that counted its units:
/// leased policies count in [`FixedWindow`](Algorithm::FixedWindow)s or
/// [`SlidingWindow`](Algorithm::SlidingWindow)s, so every unit is spent inside the window
/// that counted it and a fleet never admits more than the limit in a window. A store that is
/// already in this process (the memory store) ignores leases.
///
/// Trade-offs: a lease's unspent units are unavailable to other instances until it ends or is
/// given back (at most `share` of what was left, per instance); a ban or a reset reaches a key
/// leased here when its lease ends.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Dimension, Limiter, Policy, QuotaLease, Rule};
///
/// let api = Policy::builder("tenant_api")
///     .limiter(Limiter::new(
///         Dimension::Header("x-tenant".into()),
///         [Rule::new(100_000, Duration::from_secs(60))?.with_algorithm(Algorithm::FixedWindow)],
///     ))
///     .lease(QuotaLease::new(Duration::from_secs(1)).share(0.25))
///     .build()?;
/// assert_eq!(api.lease().unwrap().ttl(), Duration::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuotaLease {
    ttl: Duration,
    share: f64,
    max_units: u64,
}

impl QuotaLease {
    /// The default share of what is left one lease may take.
    pub const DEFAULT_SHARE: f64 = 0.25;

    /// Leases that last at most `ttl` (at least 1 ms, at most an hour), each at most
    /// [`DEFAULT_SHARE`](Self::DEFAULT_SHARE) of what is left, with no bound of their own.
    pub const fn new(ttl: Duration) -> QuotaLease {
        QuotaLease {
            ttl,
            share: QuotaLease::DEFAULT_SHARE,
            max_units: u64::MAX,
        }
    }

    /// At most this share (above 0, at most 1) of what the store last said was left.
    #[must_use]
    pub const fn share(mut self, share: f64) -> QuotaLease {
        self.share = share;
        self
    }

    /// At most `units` per lease (at least 1).
    #[must_use]
    pub const fn max_units(mut self, units: u64) -> QuotaLease {
        self.max_units = units;
        self
    }

    /// How long a lease lasts at most.
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The share of what is left a lease takes at most.
    pub const fn share_of_remaining(&self) -> f64 {
        self.share
    }

    /// The units a lease takes at most.
    pub const fn units_at_most(&self) -> u64 {
        self.max_units
    }

    /// Why these numbers are no lease, if they are not.
    fn invalid(&self) -> Option<&'static str> {
        if self.ttl < Duration::from_millis(1) || self.ttl > Duration::from_secs(3600) {
            Some("its ttl must be between 1ms and 1h")
        } else if !(self.share > 0.0 && self.share <= 1.0) {
            Some("its share must be above 0 and at most 1")
        } else if self.max_units == 0 {
            Some("its max_units must be at least 1")
        } else {
            None
        }
    }
}

impl fmt::Display for QuotaLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease of at most {:?}, {} of what is left",
            self.ttl, self.share
        )?;
        if self.max_units != u64::MAX {
            write!(f, ", at most {} units", self.max_units)?;
        }
        Ok(())
    }
}

/// One dimension and its rules, e.g. "per IP: 1/1m, 10/1h, 60/1d".
///
/// ```
/// use tollgate::{Dimension, Limiter};
///
/// let per_ip = Limiter::new(Dimension::Ip, ["1/1m".parse()?, "10/1h".parse()?])
///     .with_message("too many codes from this address");
/// assert_eq!(per_ip.name(), "ip");
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Limiter {
    pub(crate) name: LimiterName,
    pub(crate) dimension: Dimension,
    pub(crate) rules: Arc<[Rule]>,
    /// Behind a thin pointer: a decision that names it stays a word smaller.
    pub(crate) message: Option<Arc<String>>,
    pub(crate) ban: Option<BanRule>,
    pub(crate) shadow: bool,
    /// Warn when a rule's use reaches this fraction of its limit.
    pub(crate) warn_at: Option<f64>,
    /// Soft rules, made a shadow limiter of their own when the policy is built.
    pub(crate) soft: Vec<Rule>,
    /// Takes per-identity overrides: the fingerprint of its rules once the policy is built
    /// (see [`with_overrides`](Self::with_overrides)).
    pub(crate) overrides: Option<std::num::NonZeroU64>,
}

/// What a limiter's soft rules are named after: `<limiter>.soft` (see
/// [`Limiter::with_soft_rules`]).
pub const SOFT_SUFFIX: &str = ".soft";

impl Limiter {
    /// A limiter named after its dimension.
    pub fn new(dimension: Dimension, rules: impl IntoIterator<Item = Rule>) -> Limiter {
        Limiter {
            name: dimension.to_string().into(),
            dimension,
            rules: rules.into_iter().collect(),
            message: None,
            ban: None,
            shadow: false,
            warn_at: None,
            soft: Vec::new(),
            overrides: None,
        }
    }

    /// Puts this limiter in shadow mode (a dry run) when `shadow`: it counts and reports what
    /// it would decide, but never denies a request and never bans. Its counters record every
    /// admitted request that it would have admitted too, and nothing when it would have denied,
    /// so they show what enforcing it would allow; it never makes an enforced limiter of the
    /// policy deny or give back quota. A decision names its would-be denials
    /// ([`Decision::shadow_denied`](crate::Decision::shadow_denied)).
    ///
    /// ```
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let policy = Policy::builder("search")
    ///     .limiter(Limiter::new(Dimension::Ip, ["100/1m".parse()?]))
    ///     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?]).with_name("trial").with_shadow(true))
    ///     .build()?;
    /// let who = Identity::new().with_ip("192.0.2.1".parse()?);
    ///
    /// assert!(!gate.check(&policy, &who, 1).await?.shadow_denied());
    /// let second = gate.check(&policy, &who, 1).await?;
    /// assert!(second.allowed()); // the trial limit is not enforced...
    /// assert!(second.shadow_denied()); // ...but it would have denied
    /// let trial: Vec<String> = second.shadow_denied_rules(&policy).map(|r| r.limiter.to_string()).collect();
    /// assert_eq!(trial, ["trial"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn with_shadow(mut self, shadow: bool) -> Limiter {
        self.shadow = shadow;
        self
    }

    /// Warns when an admitted request brings one of this limiter's rules to `fraction` of its
    /// limit or more (`0 < fraction <= 1`): a soft signal before the hard one, for a client to
    /// slow down or a team to raise a plan. The decision says which rules are in warning
    /// ([`Decision::warnings`](crate::Decision::warnings)); nothing else changes, and a check of
    /// a policy without warnings pays nothing for them.
    ///
    /// ```
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let policy = Policy::builder("export")
    ///     .limiter(Limiter::new(Dimension::UserId, ["10/1h".parse()?]).with_warning(0.8))
    ///     .build()?;
    /// let who = Identity::new().with_user_id("u1");
    /// for _ in 0..7 {
    ///     assert!(gate.check(&policy, &who, 1).await?.warnings(&policy).next().is_none());
    /// }
    /// let eighth = gate.check(&policy, &who, 1).await?;
    /// let warned: Vec<_> = eighth.warnings(&policy).collect();
    /// assert_eq!((warned[0].rule.to_string(), warned[0].remaining), ("10/1h".into(), 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn with_warning(mut self, fraction: f64) -> Limiter {
        self.warn_at = Some(fraction);
        self
    }

    /// Adds soft rules: they never deny, and report when they would, as a shadow limiter does
    /// (which is what they become: the policy's build makes them a limiter of the same
    /// dimension in shadow mode, named `<name>.soft` ([`SOFT_SUFFIX`]), right after this one,
    /// with its warning). A limiter may have soft rules only.
    ///
    /// ```
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let policy = Policy::builder("api")
    ///     .limiter(
    ///         Limiter::new(Dimension::Ip, ["3/1m".parse()?])
    ///             .with_soft_rules(["1/1m".parse()?]),
    ///     )
    ///     .build()?;
    /// let names: Vec<&str> = policy.limiters().iter().map(|l| l.name()).collect();
    /// assert_eq!(names, ["ip", "ip.soft"]);
    /// let who = Identity::new().with_ip("192.0.2.1".parse()?);
    /// gate.check(&policy, &who, 1).await?;
    /// let second = gate.check(&policy, &who, 1).await?;
    /// assert!(second.allowed() && second.shadow_denied());
    /// let would: Vec<String> = second.shadow_denied_rules(&policy).map(|r| r.limiter.to_string()).collect();
    /// assert_eq!(would, ["ip.soft"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn with_soft_rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Limiter {
        self.soft.extend(rules);
        self
    }

    /// Lets an identity of this limiter have limits of its own, set at run time and kept in the
    /// store ([`Tollgate::set_override`](crate::Tollgate::set_override)): a tenant on a bigger
    /// plan, a partner raised mid-window. The store reads the override beside the counters, in
    /// the check's one atomic call; a limiter that does not take overrides pays nothing for
    /// them. An override changes limits, never windows or algorithms, so the counters carry
    /// over: raised mid-window, it admits exactly up to the new limit.
    ///
    /// ```
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let api = Policy::builder("api")
    ///     .limiter(Limiter::new(Dimension::UserId, ["2/1m".parse()?]).with_overrides(true))
    ///     .build()?;
    /// let acme = Identity::new().with_user_id("acme");
    /// assert!(gate.check(&api, &acme, 2).await?.allowed());
    /// assert!(!gate.check(&api, &acme, 1).await?.allowed());
    ///
    /// // acme moves to a bigger plan mid-window: 5 a minute, the 2 it used included.
    /// gate.set_override(&api, "user_id", &acme, &["5/1m".parse()?], None).await?;
    /// assert!(gate.check(&api, &acme, 3).await?.allowed());
    /// assert!(!gate.check(&api, &acme, 1).await?.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn with_overrides(mut self, overrides: bool) -> Limiter {
        self.overrides = overrides.then_some(std::num::NonZeroU64::MIN);
        self
    }

    /// This limiter as a store sees it, at the key `key` (text) or `compact`.
    #[inline]
    pub(crate) fn request<'a>(&'a self, key: &'a str, compact: &'a [u8]) -> LimiterRequest<'a> {
        LimiterRequest {
            key,
            compact,
            rules: &self.rules,
            ban: self.ban,
            shadow: self.shadow,
            overrides: self.overrides,
        }
    }

    /// Whether this limiter takes per-identity overrides (see
    /// [`with_overrides`](Self::with_overrides)).
    pub fn takes_overrides(&self) -> bool {
        self.overrides.is_some()
    }

    /// The fraction of each rule's limit at which this limiter warns, if it does (see
    /// [`with_warning`](Self::with_warning)).
    pub fn warning(&self) -> Option<f64> {
        self.warn_at
    }

    /// Whether `used` units of `rule` (one of this limiter's) reached its warning.
    pub(crate) fn warns(&self, rule: &Rule, remaining: u64) -> bool {
        self.warn_at.is_some_and(|fraction| {
            let used = rule.limit().saturating_sub(remaining);
            used as f64 >= (fraction * rule.limit() as f64).ceil()
        })
    }

    /// Whether this limiter is in shadow mode (see [`with_shadow`](Self::with_shadow)).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// A concurrency limiter: at most `max_in_flight` requests of each `dimension` value at
    /// once (see [`Rule::concurrent`]). An admission takes a slot until
    /// [`Tollgate::release_concurrent`](crate::Tollgate::release_concurrent), or for
    /// `lease_ttl` if its holder never says (a crashed process leaks nothing);
    /// [`Tollgate::extend_concurrent`](crate::Tollgate::extend_concurrent) renews it. In a policy
    /// beside rate limiters, all are checked at once: a request a rate rule denies takes no
    /// slot, and one refused for lack of a slot spends no rate quota.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Dimension, Limiter, Policy};
    ///
    /// let exports = Policy::builder("export")
    ///     .limiter(Limiter::concurrent(Dimension::UserId, 3, Duration::from_secs(300))?)
    ///     .limiter(Limiter::new(Dimension::UserId, ["20/1h".parse()?]).with_name("hourly"))
    ///     .build()?;
    /// assert!(exports.limiters()[0].is_concurrent());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn concurrent(
        dimension: Dimension,
        max_in_flight: u64,
        lease_ttl: std::time::Duration,
    ) -> Result<Limiter, crate::RuleError> {
        Ok(Limiter::new(
            dimension,
            [Rule::concurrent(max_in_flight, lease_ttl)?],
        ))
    }

    /// Whether this is a concurrency limiter (its one rule is a [`Rule::concurrent`]).
    pub fn is_concurrent(&self) -> bool {
        self.rules.iter().any(Rule::is_concurrent)
    }

    /// Bans the offender's IP and user id when this limiter denies (see [`BanRule`]).
    ///
    /// The ban's reach is wide: it refuses the identity in **every** policy of the engine (it is
    /// checked before any rule), and it covers every target of the request, not only this
    /// limiter's dimension (an IP limiter's violation also bans the user id the request
    /// carried). To keep the bans to this limiter's policy, give the policy
    /// [`BanScope::Policy`] ([`PolicyBuilder::ban_scope`]).
    #[must_use]
    pub fn with_blocklist(mut self, ban: BanRule) -> Limiter {
        self.ban = Some(ban);
        self
    }

    /// The ban this limiter imposes, if any.
    pub fn blocklist(&self) -> Option<&BanRule> {
        self.ban.as_ref()
    }

    /// Renames the limiter; names appear in keys, decisions and headers, and must be unique
    /// within a policy.
    #[must_use]
    pub fn with_name(mut self, name: impl AsRef<str>) -> Limiter {
        self.name = name.as_ref().into();
        self
    }

    /// The message shown when this limiter denies.
    #[must_use]
    pub fn with_message(mut self, message: impl AsRef<str>) -> Limiter {
        self.message = Some(Arc::new(message.as_ref().to_owned()));
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dimension.
    pub fn dimension(&self) -> &Dimension {
        &self.dimension
    }

    /// The rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The message, if any.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref().map(String::as_str)
    }
}

/// The limiters guarding one action, checked together: all of them admit, or nothing is
/// recorded.
///
/// ```
/// use tollgate::{Dimension, Limiter, Policy};
///
/// let sms = Policy::builder("sms_code")
///     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?, "10/1h".parse()?, "60/1d".parse()?]))
///     .limiter(Limiter::new(Dimension::UserId, ["20/1d".parse()?]))
///     .build()?;
/// assert_eq!(sms.limiters().len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Policy {
    pub(crate) scope: Arc<str>,
    pub(crate) limiters: Vec<Limiter>,
    pub(crate) on_error: Option<OnError>,
    pub(crate) durability: Durability,
    pub(crate) lease: Option<QuotaLease>,
    pub(crate) bypass: Option<Bypass>,
    pub(crate) max_units: u64,
    /// Per limiter, the part of its keys the policy fixes (see [`key::limiter_head`]).
    pub(crate) key_heads: Box<[key::KeyHead]>,
    /// Whether a denial can ban the identity: some enforced limiter has a ban rule.
    pub(crate) may_ban: bool,
    /// The policy is one enforced limiter of at most
    /// [`ONE_LIMITER_RULES`](crate::check::ONE_LIMITER_RULES) rules, none a concurrency limit,
    /// without overrides: what a store may answer in place
    /// ([`Store::check_limiter`](crate::Store::check_limiter)).
    pub(crate) one_limiter: bool,
    /// Some enforced limiter warns (see [`Limiter::with_warning`]).
    pub(crate) warns: bool,
    /// Every limiter is in shadow mode.
    pub(crate) shadow: bool,
    /// Whom the bans this policy writes refuse.
    pub(crate) ban_scope: BanScope,
}

/// Each limiter with soft rules, followed by its soft rules as a shadow limiter (alone when it
/// has no other rules).
fn split_soft_rules(limiters: Vec<Limiter>) -> Vec<Limiter> {
    let mut split = Vec::with_capacity(limiters.len());
    for mut limiter in limiters {
        let soft = std::mem::take(&mut limiter.soft);
        if soft.is_empty() {
            split.push(limiter);
            continue;
        }
        let sibling = Limiter {
            name: format!("{}{SOFT_SUFFIX}", limiter.name).into(),
            dimension: limiter.dimension.clone(),
            rules: soft.into(),
            message: None,
            ban: None,
            shadow: true,
            warn_at: limiter.warn_at,
            soft: Vec::new(),
            overrides: None,
        };
        if !limiter.rules.is_empty() {
            split.push(limiter);
        }
        split.push(sibling);
    }
    split
}

impl Policy {
    /// Starts a policy for the action `scope`.
    pub fn builder(scope: impl AsRef<str>) -> PolicyBuilder {
        PolicyBuilder {
            scope: scope.as_ref().into(),
            limiters: Vec::new(),
            on_error: None,
            durability: Durability::Async,
            lease: None,
            bypass: None,
            shadow: false,
            ban_scope: BanScope::Everywhere,
        }
    }

    /// Whom the bans this policy's limiters write refuse (see [`BanScope`]).
    pub fn ban_scope(&self) -> BanScope {
        self.ban_scope
    }

    /// The action this policy guards; part of every key.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The limiters, in check order.
    pub fn limiters(&self) -> &[Limiter] {
        &self.limiters
    }

    /// The policy's own `on_error`, overriding the engine's.
    pub fn on_error(&self) -> Option<OnError> {
        self.on_error
    }

    /// How far a check's writes must reach before its decision is final.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Some enforced limiter warns before its limit (see [`Limiter::with_warning`]): a front
    /// end that reports warnings looks for them only then.
    pub fn warns(&self) -> bool {
        self.warns
    }

    /// The policy's quota lease, if its quota is leased (see [`PolicyBuilder::lease`]).
    pub fn lease(&self) -> Option<QuotaLease> {
        self.lease
    }

    /// Who passes without being counted.
    pub fn bypass(&self) -> Option<&Bypass> {
        self.bypass.as_ref()
    }

    /// The largest cost this policy can ever admit: the smallest limit of its enforced rules
    /// (`u64::MAX` when every limiter is shadow).
    pub fn max_cost(&self) -> u64 {
        self.max_units
    }

    /// Whether the whole policy is in shadow mode (see [`PolicyBuilder::shadow`]).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The same policy with every `ip` limiter counting by `prefix` (see [`IpPrefix`]);
    /// other limiters, names and keys' layout are unchanged.
    ///
    /// ```
    /// use tollgate::{Dimension, IpPrefix, Limiter, Policy};
    ///
    /// let login = Policy::builder("login")
    ///     .limiter(Limiter::new(Dimension::Ip, ["5/1m".parse()?]))
    ///     .build()?
    ///     .with_ip_prefix(IpPrefix::new(24, 48)?);
    /// assert_eq!(login.limiters()[0].dimension().prefix(), Some(IpPrefix::new(24, 48)?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_ip_prefix(mut self, prefix: IpPrefix) -> Policy {
        for limiter in &mut self.limiters {
            if limiter.dimension.prefix().is_some() {
                limiter.dimension = Dimension::IpPrefix(prefix);
            }
        }
        self
    }
}

/// Builds a [`Policy`]; see [`Policy::builder`].
#[derive(Debug)]
#[must_use]
pub struct PolicyBuilder {
    scope: Arc<str>,
    limiters: Vec<Limiter>,
    on_error: Option<OnError>,
    durability: Durability,
    lease: Option<QuotaLease>,
    bypass: Option<Bypass>,
    shadow: bool,
    ban_scope: BanScope,
}

impl PolicyBuilder {
    /// Whom the bans of this policy's limiters refuse: every policy (the default, as the
    /// blocklist always has), or this policy alone ([`BanScope::Policy`]). A policy with bans
    /// of its own still sees the blocklist every policy sees (bans by hand, other policies'
    /// bans).
    pub fn ban_scope(mut self, scope: BanScope) -> PolicyBuilder {
        self.ban_scope = scope;
        self
    }

    /// Puts every limiter of the policy in shadow mode when `shadow` (see
    /// [`Limiter::with_shadow`]): the policy admits every request it is asked about and reports
    /// what it would have decided. A live ban on the identity (the blocklist's, not this
    /// policy's) still blocks.
    pub fn shadow(mut self, shadow: bool) -> PolicyBuilder {
        self.shadow = shadow;
        self
    }

    /// Lets some identities through without counting them (checked before the blocklist).
    pub fn bypass(mut self, bypass: Bypass) -> PolicyBuilder {
        self.bypass = Some(bypass);
        self
    }

    /// Adds a limiter.
    pub fn limiter(mut self, limiter: Limiter) -> PolicyBuilder {
        self.limiters.push(limiter);
        self
    }

    /// Sets what this policy does when the store fails.
    pub fn on_error(mut self, on_error: OnError) -> PolicyBuilder {
        self.on_error = Some(on_error);
        self
    }

    /// How far a check's writes must reach before its decision is final (see
    /// [`Durability`]; the default is [`Durability::Async`]).
    pub fn durability(mut self, durability: Durability) -> PolicyBuilder {
        self.durability = durability;
        self
    }

    /// Leases this policy's quota (see [`QuotaLease`]): an instance takes units of an
    /// identity's limits from the store in advance and admits locally from them, for keys too
    /// busy to ask the store each time. Every rule must count in fixed or sliding windows, and
    /// no limiter may be a concurrency limit.
    pub fn lease(mut self, lease: QuotaLease) -> PolicyBuilder {
        self.lease = Some(lease);
        self
    }

    /// Validates and builds.
    pub fn build(mut self) -> Result<Policy, PolicyError> {
        self.limiters = split_soft_rules(std::mem::take(&mut self.limiters));
        if self.shadow {
            for limiter in &mut self.limiters {
                limiter.shadow = true;
            }
        }
        if self.scope.is_empty() {
            return Err(PolicyError::EmptyScope);
        }
        for limiter in &mut self.limiters {
            if limiter.overrides.is_some() {
                limiter.overrides = Some(crate::overrides::fingerprint(&limiter.rules));
            }
        }
        if self.limiters.is_empty() {
            return Err(PolicyError::NoLimiters(self.scope.to_string()));
        }
        if let Durability::Replicated { replicas, timeout } = self.durability
            && (replicas == 0 || timeout < Duration::from_millis(1))
        {
            return Err(PolicyError::Durability(self.durability.to_string()));
        }
        if let Some(lease) = self.lease {
            self.check_lease(lease)?;
        }
        let mut names = HashSet::new();
        for limiter in &self.limiters {
            if !names.insert(limiter.name.clone()) {
                return Err(PolicyError::DuplicateLimiter(limiter.name.to_string()));
            }
            if limiter.rules.is_empty() {
                return Err(PolicyError::NoRules(limiter.name.to_string()));
            }
            if let Some(fraction) = limiter.warn_at
                && !(fraction > 0.0 && fraction <= 1.0)
            {
                return Err(PolicyError::Warning {
                    limiter: limiter.name.to_string(),
                    fraction: fraction.to_string(),
                });
            }
            let mut rules = HashSet::new();
            for rule in limiter.rules.iter() {
                if rule.algorithm() == Algorithm::SlidingLog && rule.limit() > MAX_LOG_LIMIT {
                    return Err(PolicyError::LogTooLarge {
                        limiter: limiter.name.to_string(),
                        rule: rule.to_string(),
                        max: MAX_LOG_LIMIT,
                    });
                }
                if rule.algorithm() == Algorithm::SlidingWindow
                    && u128::from(rule.limit()) * u128::from(rule.window_ms())
                        > u128::from(crate::algorithm::MAX_SLIDING_WINDOW_PRODUCT)
                {
                    return Err(PolicyError::SlidingWindowTooLarge {
                        limiter: limiter.name.to_string(),
                        rule: rule.to_string(),
                    });
                }
                if rule.is_concurrent()
                    && (limiter.rules.len() > 1 || rule.algorithm() != Algorithm::SlidingLog)
                {
                    return Err(PolicyError::ConcurrentNotAlone {
                        limiter: limiter.name.to_string(),
                        rule: rule.to_string(),
                    });
                }
                if rule.calendar_window().is_some() && rule.algorithm() != Algorithm::FixedWindow {
                    return Err(PolicyError::CalendarNotFixed {
                        limiter: limiter.name.to_string(),
                        rule: rule.to_string(),
                        algorithm: rule.algorithm().to_string(),
                    });
                }
                if !rules.insert(rule) {
                    return Err(PolicyError::DuplicateRule {
                        limiter: limiter.name.to_string(),
                        rule: rule.to_string(),
                    });
                }
            }
        }
        let max_units = max_cost(&self.limiters);
        let key_heads = self
            .limiters
            .iter()
            .map(|l| {
                let mut head = key::limiter_head(&self.scope, &l.name);
                head.push(':');
                key::KeyHead::new(head)
            })
            .collect();
        Ok(Policy {
            key_heads,
            may_ban: self.limiters.iter().any(|l| l.ban.is_some() && !l.shadow),
            one_limiter: match &self.limiters[..] {
                [l] => {
                    !l.shadow
                        && l.overrides.is_none()
                        && l.rules.len() <= crate::check::ONE_LIMITER_RULES
                        && !l.rules.iter().any(Rule::is_concurrent)
                }
                _ => false,
            },
            warns: self
                .limiters
                .iter()
                .any(|l| l.warn_at.is_some() && !l.shadow),
            shadow: self.limiters.iter().all(|l| l.shadow),
            scope: self.scope,
            limiters: self.limiters,
            on_error: self.on_error,
            durability: self.durability,
            lease: self.lease,
            bypass: self.bypass,
            max_units,
            ban_scope: self.ban_scope,
        })
    }

    /// A lease's numbers, and rules whose windows hold what a lease spends.
    fn check_lease(&self, lease: QuotaLease) -> Result<(), PolicyError> {
        if let Some(why) = lease.invalid() {
            return Err(PolicyError::Lease(format!("{lease}: {why}")));
        }
        for limiter in &self.limiters {
            if limiter.overrides.is_some() {
                return Err(PolicyError::Lease(format!(
                    "limiter {:?} takes overrides, which the store reads at every check; a \
                     lease admits without asking the store",
                    limiter.name
                )));
            }
            if limiter.ban.is_some() {
                return Err(PolicyError::Lease(format!(
                    "limiter {:?} bans on a violation, and a lease that asks for more than is \
                     left is no client's violation",
                    limiter.name
                )));
            }
            for rule in limiter.rules.iter() {
                if rule.is_concurrent() {
                    return Err(PolicyError::Lease(format!(
                        "limiter {:?} is a concurrency limit, whose slots cannot be leased",
                        limiter.name
                    )));
                }
                if !matches!(
                    rule.algorithm(),
                    Algorithm::FixedWindow | Algorithm::SlidingWindow
                ) {
                    return Err(PolicyError::Lease(format!(
                        "limiter {:?}: rule {rule} counts with {}; a leased policy counts in \
                         fixed_window or sliding_window, where a lease spends its units inside \
                         the window that counted them",
                        limiter.name,
                        rule.algorithm()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The largest cost `limiters` can ever admit: the smallest limit of their enforced rules
/// (`u64::MAX` when every one is shadow: a shadow rule never denies), and at most
/// [`MAX_LOG_COST`] where any rule keeps a log.
pub(crate) fn max_cost(limiters: &[Limiter]) -> u64 {
    let rules = || limiters.iter().flat_map(|l| l.rules.iter());
    // A limiter that takes overrides may count by a larger limit: its store decides.
    let smallest = limiters
        .iter()
        .filter(|l| !l.shadow)
        .flat_map(|l| {
            let raised = l.overrides.is_some();
            l.rules.iter().map(move |r| match raised {
                true => crate::MAX_OVERRIDE_LIMIT,
                false => r.limit(),
            })
        })
        .min()
        .unwrap_or(u64::MAX);
    if rules().any(|r| r.algorithm() == Algorithm::SlidingLog) {
        smallest.min(MAX_LOG_COST)
    } else {
        smallest
    }
}

/// Whether `rule` refuses a check of `cost` before any state is read: more than its limit, or
/// more entries than one check may write to a log.
pub(crate) fn cost_too_large(rule: &Rule, cost: u64) -> bool {
    rule.limit() < cost || (rule.algorithm() == Algorithm::SlidingLog && cost > MAX_LOG_COST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_takes_fixed_or_sliding_windows_and_sane_numbers() {
        let fixed = |text: &str| {
            text.parse::<Rule>()
                .unwrap()
                .with_algorithm(Algorithm::FixedWindow)
        };
        let build = |limiter: Limiter, lease: QuotaLease| {
            Policy::builder("leased")
                .limiter(limiter)
                .lease(lease)
                .build()
        };
        let second = QuotaLease::new(Duration::from_secs(1));
        let ok = build(Limiter::new(Dimension::Ip, [fixed("100/1m")]), second).unwrap();
        assert_eq!(ok.lease(), Some(second));
        let windows = Limiter::new(
            Dimension::Ip,
            [
                fixed("100/1m"),
                fixed("1000/1h").with_algorithm(Algorithm::SlidingWindow),
            ],
        );
        assert!(build(windows, second.share(1.0).max_units(10)).is_ok());

        let refused = |limiter: Limiter, lease: QuotaLease, says: &str| {
            let PolicyError::Lease(why) = build(limiter, lease).unwrap_err() else {
                panic!("not a lease error");
            };
            assert!(why.contains(says), "{why:?} does not say {says:?}");
        };
        let log = Limiter::new(Dimension::Ip, ["100/1m".parse().unwrap()]);
        refused(log, second, "counts with sliding_log");
        let gcra = Limiter::new(
            Dimension::Ip,
            [fixed("100/1m").with_algorithm(Algorithm::Gcra)],
        );
        refused(gcra, second, "counts with gcra");
        let slots = Limiter::concurrent(Dimension::Ip, 3, Duration::from_secs(60)).unwrap();
        refused(slots, second, "concurrency limit");
        let bans = Limiter::new(Dimension::Ip, [fixed("100/1m")])
            .with_blocklist(crate::BanRule::new(Duration::from_secs(60)));
        refused(bans, second, "bans on a violation");
        let plain = || Limiter::new(Dimension::Ip, [fixed("100/1m")]);
        refused(plain(), QuotaLease::new(Duration::ZERO), "ttl");
        refused(plain(), QuotaLease::new(Duration::from_secs(3601)), "ttl");
        refused(plain(), second.share(0.0), "share");
        refused(plain(), second.share(1.5), "share");
        refused(plain(), second.share(f64::NAN), "share");
        refused(plain(), second.max_units(0), "max_units");
        // Leases are off unless asked.
        assert_eq!(
            Policy::builder("plain")
                .limiter(plain())
                .build()
                .unwrap()
                .lease(),
            None
        );
    }

    #[test]
    fn a_replicated_durability_waits_for_a_replica_and_some_time() {
        let build = |durability| {
            Policy::builder("q")
                .limiter(Limiter::new(Dimension::UserId, ["10/1d".parse().unwrap()]))
                .durability(durability)
                .build()
        };
        let second = Duration::from_secs(1);
        assert_eq!(
            build(Durability::replicated(0, second)).unwrap_err(),
            PolicyError::Durability("replicated (0 replicas within 1s)".into())
        );
        assert!(matches!(
            build(Durability::replicated(1, Duration::from_micros(999))),
            Err(PolicyError::Durability(_))
        ));
        let built = build(Durability::replicated(2, second)).unwrap();
        assert_eq!(built.durability(), Durability::replicated(2, second));
        assert_eq!(
            build(Durability::Async).unwrap().durability(),
            Durability::Async
        );
        assert_eq!(
            Policy::builder("q")
                .limiter(Limiter::new(Dimension::UserId, ["10/1d".parse().unwrap()]))
                .build()
                .unwrap()
                .durability(),
            Durability::Async,
            "async unless asked"
        );
    }

    #[test]
    fn soft_rules_become_a_shadow_limiter_that_no_name_shares() {
        let rule = |t: &str| t.parse::<Rule>().unwrap();
        let policy = Policy::builder("p")
            .limiter(
                Limiter::new(Dimension::Ip, [rule("10/1m")])
                    .with_soft_rules([rule("5/1m"), rule("50/1h")])
                    .with_warning(0.5),
            )
            .limiter(Limiter::new(Dimension::UserId, []).with_soft_rules([rule("1/1s")]))
            .build()
            .unwrap();
        let shape: Vec<(&str, bool, usize, Option<f64>)> = policy
            .limiters()
            .iter()
            .map(|l| (l.name(), l.is_shadow(), l.rules().len(), l.warning()))
            .collect();
        assert_eq!(
            shape,
            [
                ("ip", false, 1, Some(0.5)),
                ("ip.soft", true, 2, Some(0.5)),
                ("user_id.soft", true, 1, None),
            ]
        );
        // A limiter of the soft rules' name is refused, not shared.
        let e = Policy::builder("p")
            .limiter(Limiter::new(Dimension::Ip, [rule("10/1m")]).with_soft_rules([rule("5/1m")]))
            .limiter(Limiter::new(Dimension::Ip, [rule("1/1s")]).with_name("ip.soft"))
            .build()
            .unwrap_err();
        assert_eq!(e, PolicyError::DuplicateLimiter("ip.soft".into()));
    }

    #[test]
    fn a_warning_is_a_fraction_above_zero_and_at_most_one() {
        let build = |fraction: f64| {
            Policy::builder("p")
                .limiter(
                    Limiter::new(Dimension::Ip, ["10/1m".parse().unwrap()]).with_warning(fraction),
                )
                .build()
        };
        for bad in [0.0, -0.5, 1.01, f64::NAN, f64::INFINITY] {
            let e = build(bad).unwrap_err();
            assert!(matches!(e, PolicyError::Warning { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("above 0 and at most 1"), "{e}");
        }
        for good in [0.01, 0.8, 1.0] {
            let policy = build(good).unwrap();
            assert!(policy.warns());
            assert_eq!(policy.limiters()[0].warning(), Some(good));
        }
        // A shadow limiter's warning is never given: the policy does not warn.
        let shadow = Policy::builder("p")
            .limiter(
                Limiter::new(Dimension::Ip, ["10/1m".parse().unwrap()])
                    .with_warning(0.5)
                    .with_shadow(true),
            )
            .build()
            .unwrap();
        assert!(!shadow.warns());
    }

    #[test]
    fn build_rejects_what_would_share_or_lose_state() {
        let r = |t: &str| t.parse::<Rule>().unwrap();
        let ip = || Limiter::new(Dimension::Ip, [r("1/1m")]);
        assert_eq!(
            Policy::builder("a")
                .limiter(ip())
                .limiter(ip())
                .build()
                .unwrap_err(),
            PolicyError::DuplicateLimiter("ip".into())
        );
        assert!(
            Policy::builder("a")
                .limiter(ip())
                .limiter(ip().with_name("ip2"))
                .build()
                .is_ok()
        );
        assert_eq!(
            Policy::builder("").limiter(ip()).build().unwrap_err(),
            PolicyError::EmptyScope
        );
        assert!(matches!(
            Policy::builder("a").build(),
            Err(PolicyError::NoLimiters(_))
        ));
        let empty = Limiter::new(Dimension::Ip, []);
        assert!(matches!(
            Policy::builder("a").limiter(empty).build(),
            Err(PolicyError::NoRules(_))
        ));
        let huge = Limiter::new(Dimension::Ip, [r("1000001/1d")]);
        assert!(matches!(
            Policy::builder("a").limiter(huge).build(),
            Err(PolicyError::LogTooLarge {
                max: MAX_LOG_LIMIT,
                ..
            })
        ));
        let counted = Limiter::new(
            Dimension::Ip,
            [r("18446744073709551615/366d").with_algorithm(Algorithm::Gcra)],
        );
        assert!(Policy::builder("a").limiter(counted).build().is_ok());
        // 2^51 is the largest limit × window in ms a sliding window holds.
        let sliding = |text: &str| r(text).with_algorithm(Algorithm::SlidingWindow);
        let fits = Limiter::new(Dimension::Ip, [sliding("26000000/1d")]);
        assert!(Policy::builder("a").limiter(fits).build().is_ok());
        let too_large = Limiter::new(Dimension::Ip, [sliding("27000000/1d")]);
        let e = Policy::builder("a").limiter(too_large).build().unwrap_err();
        assert!(
            matches!(e, PolicyError::SlidingWindowTooLarge { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("use fixed_window or gcra"), "{e}");
        // A calendar window is a fixed window.
        let calendar = r("60/1d@Europe/Berlin");
        let as_gcra = Limiter::new(Dimension::Ip, [calendar.with_algorithm(Algorithm::Gcra)]);
        let e = Policy::builder("a").limiter(as_gcra).build().unwrap_err();
        assert!(matches!(e, PolicyError::CalendarNotFixed { .. }), "{e}");
        assert!(e.to_string().contains("cannot be gcra"), "{e}");
        let daily = Limiter::new(Dimension::Ip, [calendar, r("60/1d")]);
        assert!(
            Policy::builder("a").limiter(daily).build().is_ok(),
            "a calendar day and a 24h window are two rules"
        );
        for (text, why) in [
            ("60/2d@UTC", "1d, 1w or 1mo"),
            ("60/1d@Mars/Olympus", "unknown time zone"),
            ("0/1mo@UTC", "at least 1"),
            ("x/1d@UTC", "not a whole number"),
        ] {
            let e = text.parse::<Rule>().unwrap_err();
            assert!(e.to_string().contains(why), "{text}: {e}");
        }
        let twice = Limiter::new(Dimension::Ip, [r("1/1m"), r("1/60s")]);
        assert!(matches!(
            Policy::builder("a").limiter(twice).build(),
            Err(PolicyError::DuplicateRule { .. })
        ));
    }
}
