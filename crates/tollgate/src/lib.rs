//! tollgate: several rate rules at once on one action ("1 per minute AND 10 per hour AND 60 per
//! day, per IP and per user"), checked atomically, on an embedded store or on Redis.
//!
//! ```
//! use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let gate = Tollgate::new(MemoryStore::new());
//! let policy = Policy::builder("sms_code")
//!     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?, "10/1h".parse()?, "60/1d".parse()?]))
//!     .limiter(Limiter::new(Dimension::UserId, ["20/1d".parse()?]))
//!     .build()?;
//! let who = Identity::new().with_ip("198.51.100.4".parse()?).with_user_id("42");
//!
//! assert!(gate.check(&policy, &who, 1).await?.allowed());
//! let again = gate.check(&policy, &who, 1).await?;
//! assert!(!again.allowed());
//! // The denied request cost nothing: the user's daily quota still shows 19 left.
//! let user_rule = again.rules(&policy).into_iter().find(|r| &*r.limiter == "user_id").unwrap();
//! assert_eq!(user_rule.remaining, 19);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Layout
//! - `rule`: [`Rule`] (`limit` per `window`, its [`Algorithm`]) and the `N/DURATION` text form.
//! - [`algorithm`]: the algorithms as pure functions, shared by the memory store and mirrored
//!   by the Redis scripts.
//! - `identity`: [`Identity`] (who is asking), [`Dimension`] (what a limiter counts by) and
//!   [`IpPrefix`] (the network an `ip` dimension counts a client by).
//! - `policy`: [`Limiter`] (a dimension and its rules) and [`Policy`] (the limiters of one
//!   action), and [`OnError`].
//! - `decision`: [`Decision`], [`Reason`], [`RuleDecision`].
//! - [`key`]: store keys; escaping and hash tags (no collisions, one Cluster slot per limiter).
//! - `store`: the [`Store`] contract ([`CheckRequest`] in, [`Verdict`] out) and [`AnyStore`].
//! - `blocklist`: [`BanRule`] (ban offenders after a violation, with escalation), [`BanTarget`],
//!   [`BanEntry`].
//! - `bypass`: [`Bypass`] (allowlisted networks, users, predicates) and [`IpNet`]
//!   ([`IpNetError`]).
//! - `duplicate`: [`DuplicateGuard`] (refuse the second click), [`Fingerprint`], [`Lease`],
//!   [`Acquire`].
//! - `memory`: [`MemoryStore`], the embedded store.
//! - `clock`: [`Clock`], [`SystemClock`], [`ManualClock`].
//! - `engine`: [`Tollgate`], which checks policies against a store.
//! - `error`: [`StoreError`], [`CheckError`], [`PolicyError`].
//! - [`fields`]: the rate-limit header fields of a decision as text (`RateLimit-Policy` /
//!   `RateLimit`, legacy `X-RateLimit-*`, the sixth draft's), for every front end.
//!
//! # Features
//! - `serde` (off by default): `Serialize`/`Deserialize` for [`Rule`] (its text form,
//!   `"10/1m"`), [`Dimension`], [`Algorithm`], [`OnError`], [`fields::HeaderStyle`], and `Serialize` for [`Reason`],
//!   [`LimiterName`] and [`DuplicateState`] (snake case: `"rate_limited"`).
//!
//! The crate needs no async runtime: a check is a future any executor can poll, and on the
//! memory store its first poll decides.

pub mod algorithm;
mod blocklist;
mod bypass;
mod calendar;
mod check;
mod clock;
mod decision;
mod duplicate;
mod engine;
mod error;
pub mod fields;
mod identity;
pub mod key;
#[doc(hidden)]
pub mod macro_support;
mod memory;
mod overrides;
mod page;
mod policy;
mod rule;
mod store;
mod text;

/// Resolves a future of the memory store, which is ready at once (unit tests).
#[cfg(test)]
pub(crate) fn ready_now<T>(future: impl std::future::Future<Output = T>) -> T {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(future).poll(&mut cx) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => panic!("the memory store answers at once"),
    }
}

pub use blocklist::{BanEntry, BanPage, BanRule, BanScope, BanTarget};
pub use bypass::{Bypass, IpNet, IpNetError};
pub use calendar::{Calendar, CalendarUnit};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, LimiterName, NamedDecision, Reason, RuleDecision, RuleDecisions};
#[cfg(feature = "serde")]
pub use duplicate::canonical_json;
pub use duplicate::{
    Acquire, Duplicate, DuplicateBy, DuplicateGuard, DuplicateState, Fingerprint, Lease,
    MAX_IDEMPOTENCY_KEY_LEN, idempotency_key,
};
pub use engine::{Answered, LocalFallback, Settlement, Tollgate};
pub use error::{CheckError, PolicyError, StoreError, StoreErrorKind};
pub use identity::{Dimension, Extractor, Identity, IpPrefix};
pub use key::ban_index_key;
pub use memory::{MemoryStore, MemoryStoreBuilder, MemoryUsage};
pub use overrides::{MAX_OVERRIDE_LIMIT, Override, OverrideError, OverridePage, fingerprint};
pub use page::PageCursor;
pub use policy::{
    Durability, Limiter, MAX_LOG_COST, MAX_LOG_LIMIT, OnError, Policy, PolicyBuilder, QuotaLease,
    SOFT_SUFFIX,
};
pub use rule::{
    Algorithm, DurationError, MAX_WINDOW, Rule, RuleError, RuleErrorKind, format_duration,
    parse_duration, parse_rules,
};
pub use store::{
    AnyStore, BanKey, BanStore, CheckRequest, FullStore, HeldLock, INLINE_RULES, LimiterAnswer,
    LimiterCheck, LimiterRequest, LockReply, LockStore, Outcomes, OverrideStore, Receipt,
    RefundStore, Store, Verdict,
};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctest;
