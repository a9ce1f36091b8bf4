//! Redis store for tollgate: every rule of every limiter of a policy, checked and recorded in
//! one atomic script on a standalone Redis server, timed by the server's clock.
//!
//! ```no_run
//! use tollgate::{Dimension, Identity, Limiter, OnError, Policy, Tollgate};
//! use tollgate_redis::RedisStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379/0").await?;
//! let gate = Tollgate::new(store).with_on_error(OnError::Local);
//! let sms = Policy::builder("sms_code")
//!     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?, "10/1h".parse()?]))
//!     .limiter(Limiter::new(Dimension::UserId, ["20/1d".parse()?]))
//!     .build()?;
//! let who = Identity::new().with_ip("203.0.113.7".parse()?).with_user_id("42");
//!
//! // One EVALSHA covers both limiters and all three rules; a denial records nothing.
//! let decision = gate.check(&sms, &who, 1).await?;
//! if !decision.allowed() {
//!     println!("retry in {:?}", decision.retry_after());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! URLs: `redis://[user:password@]host:port/db`, and `rediss://...` for TLS (rustls, with the
//! system's root certificates). Every call is bounded by [`RedisStoreBuilder::timeout`]
//! (100 ms by default); a failure is a [`tollgate::StoreError`] that the engine answers with
//! the policy's `on_error`.
//!
//! # Layout
//! - `store`: [`RedisStore`] (the whole [`tollgate::Store`] contract: check, reset, ping,
//!   duplicate-guard locks, bans) and [`RedisStoreBuilder`] (URL, timeout, test clock,
//!   connecting).
//! - `script`: turns a [`tollgate::CheckPlan`] into the keys and arguments of
//!   `scripts/check.lua` and its reply into a [`tollgate::Verdict`]; loads the guard scripts
//!   and reads their replies.
//! - `error`: Redis failures as store errors of the right kind (timeout, unavailable,
//!   protocol, capacity); URLs with their passwords hidden.
//! - `scripts/check.lua`: the algorithms of [`tollgate::algorithm`] in Lua, number for number,
//!   and the plan's bans (blocked first, banned on a denial).
//! - `scripts/prelude.lua` + `lock_acquire.lua`, `lock_release.lua`, `lock_complete.lua`,
//!   `ban.lua`, `unban.lua`, `bans.lua`: one small script per guard operation.
//!
//! # Keys
//! The keys are the core's ([`tollgate::PlanLimiter::state_keys`], [`tollgate::BanTarget::key`],
//! the duplicate guard's): each limiter's sliding-log rules share one sorted set (members:
//! 8 random bytes and a unit index, 9 to 12 bytes), each fixed-window rule holds
//! `"start:count"`, each GCRA rule its theoretical arrival time; a lock or a ban is a small
//! hash holding its own deadline, and `prefix:{ban}:index` lists the bans. Every key carries
//! `PEXPIRE` for as long as its state can count, and a hash tag.

mod error;
mod script;
mod store;

pub use store::{RedisStore, RedisStoreBuilder};
