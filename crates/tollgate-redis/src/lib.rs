//! Redis store for tollgate: every rule of every limiter of a policy, checked and recorded in
//! one atomic script, timed by the server's clock, on a standalone server, a Sentinel-managed
//! primary or a Redis Cluster.
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
//! URLs (see [`RedisStore::connect`]): `redis://[user:password@]host:port/db` for one server,
//! `redis+sentinel://host:port[,host:port...]/master_name` for the primary a set of sentinels
//! names, `redis+cluster://host:port[,host:port...]` for a Cluster; `rediss`, `rediss+sentinel`
//! and `rediss+cluster` for TLS (rustls, with the system's root certificates or a CA file,
//! and an optional client certificate: `?tls_ca_file=`, `tls_cert_file=`, `tls_key_file=`). Every call is
//! bounded by [`RedisStoreBuilder::timeout`] (100 ms by default); a failure is a
//! [`tollgate::StoreError`] that the engine answers with the policy's `on_error`.
//!
//! # The local over-limit cache (on by default)
//! Each store remembers, in this process, the denials and bans Redis answered, and denies
//! again locally until they end, so an identity hammering a limit it is over costs Redis one
//! call. It never admits, so it never over-admits; but **an unban or a reset made through
//! another instance (another process, the server's admin API elsewhere, `redis-cli`) does not
//! reach it**: this instance keeps denying until the remembered end (at most the denial's
//! `retry_after` or the ban's remaining time). One made through this store clears it at once.
//! Where unbans must take effect everywhere at once, build the store with
//! [`RedisStoreBuilder::local_cache`]`(false)` or `?local_cache=off` in the URL.
//!
//! # Versions and features
//! Redis 5.0 or newer: the scripts use commands Redis 4.0 has and replicate their effects (the
//! default since 5.0; they ask for it on older servers). The test suite runs against Redis 7.0.
//! Valkey speaks the same commands and scripts and is expected to work; it is not part of the
//! test suite (this project's build machine has no Valkey package). Every key a script touches
//! is passed in `KEYS`, as Redis Cluster and Dragonfly require; Dragonfly is untested for the
//! same reason, and the scripts' `redis.replicate_commands()` call, a no-op on Redis 5.0 and
//! newer, is guarded so a server without it still runs them.
//!
//! Cargo features:
//! - `ring` (default): for `rediss` URLs, installs rustls's ring crypto provider as the process
//!   default when the application has installed none. Turn it off to use another provider
//!   (e.g. aws-lc-rs): install it with `CryptoProvider::install_default` before building a TLS
//!   store; building one with no provider installed fails with an error that says so.
//!
//! # Cluster
//! Every key of one limiter shares the limiter's hash tag, so a limiter is one slot. A plan
//! whose keys all share one slot is one `EVALSHA`, as on one server. Otherwise the limiters of
//! each slot run the check script at once, one call per slot, while the identity's bans are
//! read beside them (a ban key has no hash tag: each target's ban lives in its own key's slot,
//! so the bans spread over the cluster); each slot that admits records at once and says what it
//! wrote. If a slot denies or a ban holds, a second round trip undoes those reservations (the
//! sliding log's members by their unique ids, a fixed window's count by the cost, a GCRA
//! timestamp only if it is still the one written) and bans the offender if a denying limiter
//! says so (in each ban key's slot, then in the ban index, `{ban}` slot, which checks never
//! read). Until then other checks see the reservations: that can deny a check that would
//! have fitted, never admit one too many (`docs/deployment.md`, "The residual window").
//!
//! # Layout
//! - `store`: [`RedisStore`], the whole [`tollgate::Store`] contract (check, reset, ping,
//!   duplicate-guard locks, bans) over a backend; the local cache around every check.
//! - `builder`: [`RedisStoreBuilder`] (URL, timeout, switches, test clock) and connecting to
//!   each kind of deployment.
//! - `backend`: what every call needs, whoever makes it: the connection, the scripts, the
//!   timeout and the test clock. The store, the Cluster check, batching and the blocklist send
//!   through it and need nothing of each other to do so.
//! - `batch`: natural batching, the checks of one lane sent together while a call is in flight.
//! - `cache`: the local over-limit cache.
//! - `repair`: repair after a failover ([`RedisStoreBuilder::repair`]): the journal of what
//!   recent admissions wrote, when to write it again, the watch on the primaries.
//! - `backend` also runs replicated checks ([`tollgate::Durability::Replicated`]): on a
//!   connection of their own, each call followed by one `WAIT`.
//! - `cluster`: where a plan's keys live (one slot or several), and the multi-slot check:
//!   per-slot calls at once, undo, bans beside them.
//! - `blocklist`: counting the bans (one `ZCOUNT` of the ban index) and listing them a page
//!   at a time, never in one call that walks them all.
//! - `url`: which deployment a URL names, its nodes and credentials, its TLS files, the
//!   store's switches.
//! - `tls`: the TLS files read and checked.
//! - `conn`: one connection type over the three deployments, and script calls (`EVALSHA`,
//!   `EVAL` with the source when a node lacks the script).
//! - `sentinel`: the connection to the primary the sentinels name, found again after a
//!   failover.
//! - `script`: assembles the scripts; turns a [`tollgate::CheckRequest`] into the keys and
//!   arguments of `scripts/check.lua` and its reply into a [`tollgate::Verdict`]; reads the
//!   guard scripts' replies.
//! - `error`: Redis failures as store errors of the right kind (timeout, unavailable,
//!   protocol, capacity); URLs with their passwords hidden.
//! - `scripts/check.lua`: the algorithms of [`tollgate::algorithm`] in Lua, number for number,
//!   and the plan's bans (blocked first, banned on a denial).
//! - `scripts/common.lua` (the head of every script: TTLs, integer division) and
//!   `scripts/ban_writer.lua` (the ban hash, strikes, escalation): parts spliced into the
//!   scripts that need them when the store builds them (a line `--@include <part>`), so each
//!   is written once.
//! - `scripts/prelude.lua` + `lock_acquire.lua`, `lock_release.lua`, `lock_complete.lua`,
//!   `ban.lua`, `unban.lua`, `bans.lua` (one page), `ban_count.lua`: one small script per
//!   guard operation; `redo.lua` (write a remembered admission again after a failover); and,
//!   for a Cluster, `undo.lua` (reverse one slot's reservation),
//!   `banned.lua` (read the bans beside the limiters), `offend.lua` (ban after a denial).
//!
//! # Keys
//! The keys are the core's ([`tollgate::LimiterRequest::state_keys`], [`tollgate::BanTarget::key`],
//! the duplicate guard's): each limiter's sliding-log rules share one sorted set (members:
//! 8 random bytes and a unit index, 9 to 12 bytes), each fixed-window rule holds
//! `"start:count"`, each GCRA rule its theoretical arrival time; a lock or a ban is a small
//! hash holding its own deadline, and `prefix:{ban}:index` lists the bans. Every key carries
//! `PEXPIRE` for as long as its state can count, and a hash tag, but a ban
//! (`prefix:ban:kind:value`), which is one key alone. No script touches a key it is not given
//! (a Cluster and Dragonfly require that).
//!
//! A Cluster client re-sends a call whose reply it lost (a dropped connection, a response
//! timeout), and Redis may run both copies. A check run twice counts twice (never one more
//! admission), its second units under the same nonce, which a refund or release by its
//! receipt gives back with the first; a refund, a charge, a lease renewal or an undo, which
//! would give back or charge twice, names each call by a fresh id in a marker key beside the limiter's state
//! ([`tollgate::key::applied_key`]), which keeps the first run's reply while the client may
//! still send the call again: a second run changes nothing and answers the same. A lock
//! acquisition run twice is its caller's, a completion run twice stands; a ban written after a
//! denial (`offend.lua`) run twice counts two strikes (a longer ban, never a shorter one). One
//! server and Sentinel, whose clients never send a call twice, write no marker.

mod backend;
mod batch;
mod blocklist;
mod builder;
mod cache;
mod cluster;
mod conn;
mod error;
mod lease;
mod overrides;
mod persistence;
mod repair;
mod script;
mod sentinel;
mod shared;
mod store;
mod tls;
mod url;

pub use builder::RedisStoreBuilder;
pub use error::redact as redact_url;
pub use lease::{LeaseStats, LeasedKey};
pub use persistence::Persistence;
pub use repair::Repairs;
pub use store::RedisStore;
