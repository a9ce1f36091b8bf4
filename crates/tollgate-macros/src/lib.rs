//! `#[rate_limit]` and `#[prevent_duplicate]`: tollgate's guards as attributes on async
//! functions, the Rust counterpart of the seed's `@RateLimiters` and `@PreventDuplicateSubmit`.
//!
//! Use them through `tollgate_tower`, which re-exports them and provides what the generated
//! code calls. They work on axum handlers and on any async fn that runs inside a
//! `tollgate_tower::Context` (installed per request by `tollgate_tower::ContextLayer`, or by
//! `Context::scope` elsewhere).
//!
//! ```
//! use std::sync::Arc;
//! use tollgate::{Identity, MemoryStore, Tollgate};
//! use tollgate_tower::{Context, Rejection, prevent_duplicate, rate_limit};
//!
//! // Several limiters, one atomic check: a call refused by the per-user rule costs the
//! // per-IP rules nothing.
//! #[rate_limit(by = "ip", rules = ["1/1m", "10/1h", "60/1d"], blocklist = "10m")]
//! #[rate_limit(by = "user_id", rules = ["20/1d"], message = "daily SMS quota used up")]
//! async fn send_code(phone: String) -> Result<String, Rejection> {
//!     Ok(format!("code sent to {phone}"))
//! }
//!
//! // The same arguments twice within 5 s: the second call is refused.
//! #[prevent_duplicate(by = "args", ttl = "5s")]
//! async fn submit_order(item: u32, quantity: u32) -> Result<u64, Rejection> {
//!     Ok(u64::from(item * quantity))
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let gate = Arc::new(Tollgate::new(MemoryStore::new()));
//! let who = Identity::new().with_ip("198.51.100.4".parse().unwrap()).with_user_id("42");
//! Context::new(gate, who)
//!     .scope(async {
//!         assert!(send_code("+15550100".into()).await.is_ok());
//!         assert!(matches!(send_code("+15550100".into()).await, Err(Rejection::RateLimited(_))));
//!
//!         assert!(submit_order(7, 1).await.is_ok());
//!         assert!(matches!(submit_order(7, 1).await, Err(Rejection::Repeated { .. })));
//!         assert!(submit_order(7, 2).await.is_ok());
//!     })
//!     .await;
//! # });
//! ```
//!
//! # `#[rate_limit(...)]`
//! | option | meaning |
//! |---|---|
//! | `by` | the dimension: `global`, `ip`, `user_id`, `user_name`, `header:<name>`, `arg:<name>` (a parameter of the function, counted by its `Display`) |
//! | `rules` | `["N/DURATION", ...]`, e.g. `"1/1m"`, `"10/1h"`, `"5/500ms"`; units ms, s, m, h, d |
//! | `name` | the limiter's name (default: the dimension); names appear in keys and headers |
//! | `algorithm` | `sliding_log` (default), `sliding_window`, `fixed_window`, `gcra` |
//! | `blocklist` | ban the offender's IP and user for this long after a violation, e.g. `"10m"` |
//! | `scope` | the action name in keys (default: the function's path, with its type for a method; below) |
//! | `message` | the text of the refusal (the problem body's `detail`) |
//! | `ipv6_prefix` | with `by = "ip"`: count IPv6 clients by this network, e.g. `48` (default 64: one subscriber's /64, so rotating addresses within it buys nothing) |
//! | `ipv4_prefix` | with `by = "ip"`: count IPv4 clients by this network, e.g. `24` (default 32: each address; a shorter prefix also counts neighbours behind one NAT together) |
//! | `count` | `"all"` (default), `"failures"` (only calls that return `Err`, or panic, keep their charge: failed logins, wrong codes) or `"successes"` (only `Ok` calls keep it). Every call is charged when it starts, so concurrent calls never exceed the limit; one that does not count is refunded when it returns. One value for all the function's limiters |
//! | `concurrent` | instead of `rules`: at most this many calls in flight per `by` value (a concurrency limiter). A call holds its slot until it returns (or panics, or its future is dropped), its lease renewed every third of `lease_ttl` while it runs; a refusal has reason `concurrency_limited` |
//! | `lease_ttl` | with `concurrent`: how long a slot is held at most once its process stops renewing it (a crash), e.g. `"1m"` (default `"5m"`) |
//! | `shadow` | `true`: a dry run. The limiter counts and reports what it would decide but never refuses (a decision's `shadow_denied()`); the others stay enforced |
//! | `warn_at` | a fraction above 0 and at most 1, e.g. `0.8`: an admission that brings a rule to that fraction of its limit sets the `RateLimit-Warning` field |
//! | `soft` | `["N/DURATION", ...]`: rules that never refuse and report when they would (a shadow limiter `<name>.soft`) |
//! | `overrides` | `true`: an identity may get limits of its own at run time (`Tollgate::set_override` with a policy of the same scope, limiter and rules, or the server's `PUT /v1/overrides`) |
//! | `cost` | an expression of the arguments giving the units a call is checked for, e.g. `"prompt.max_tokens"` (default 1). One for all the function's limiters |
//! | `max_delay` | e.g. `"200ms"`: a call its GCRA rules would admit within this long waits for its turn (its place reserved in the same check) instead of being refused; dropped while waiting, it gives its place back. One for all the function's limiters |
//! | `settle` | a function of the call's result giving what it really cost, e.g. `"tokens_used"` with `fn tokens_used(r: &Result<T, E>) -> Option<u64>`: the difference is given back, or charged past the limits (the caller then owes it); `None` keeps the check's cost. One for all the function's limiters |
//!
//! Stack several for several limiters; they share one scope and are checked atomically.
//!
//! # `#[prevent_duplicate(...)]`
//! | option | meaning |
//! |---|---|
//! | `by` | `args` (the function's arguments), `ip`, `user_id`, `user_name` |
//! | `ttl` | how long repeats are refused, counted from the first call (default `"1s"`) |
//! | `global` | share the lock across every function (the seed's `global = true`) |
//! | `scope` | the action name in keys (default: the function's path, with its type for a method; below) |
//! | `args` | with `by = "args"`: the parameters to fingerprint, e.g. `["body"]` (default: all) |
//!
//! The default `scope` is the function's path as `std::any::type_name` writes it: the module
//! path and name (`app::orders::submit`), and for a method its type (`app::Sms::send`,
//! `<app::Sms as app::Notify>::send`), so that two types' `send` never share a counter or a
//! lock. A trait's provided method has one scope for every implementor. Rust does not promise
//! that text across compiler versions; give `scope` where keys must outlive a compiler upgrade
//! (a new text starts the counters afresh).
//!
//! With `by = "args"` every fingerprinted parameter must implement `serde::Serialize`; they
//! are hashed as canonical JSON (`tollgate::canonical_json`: a stable form across processes,
//! unlike `Debug`; map keys sorted, integers exact). A sequence keeps its order, so a set
//! argument should be a `BTreeSet` (a `HashSet` iterates in another order in each process,
//! and two equal sets would be two submissions). Leave out parameters
//! that are not data (an axum `State`) with `args = [...]`. An `Err` result frees the lock
//! so the caller can retry; so does a cancelled call. A repeat while the first call runs is
//! refused with `Rejection::InProgress` (409), one after it with `Rejection::Repeated` (429).
//!
//! # Rules for the function
//! - It is `async`.
//! - It returns `Result<T, E>` with `E: From<tollgate_tower::Rejection>` (`Rejection` itself
//!   is an axum `IntoResponse`, so `Result<Json<T>, Rejection>` is a handler).
//! - Rule, duration, dimension and algorithm strings are checked at compile time; a mistake is
//!   a compile error pointing at the string.
//!
//! # Layout
//! - `options`: parsing and validating the attributes' options.
//! - `expand`: the generated code (one rate-limit check, then the duplicate guard).

use proc_macro::TokenStream;

mod expand;
mod options;

use expand::{Kind, expand};

/// Rate-limits an async fn; see the [crate docs](crate).
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(Kind::RateLimit, args.into(), item.into()).into()
}

/// Refuses duplicate calls of an async fn; see the [crate docs](crate).
#[proc_macro_attribute]
pub fn prevent_duplicate(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(Kind::PreventDuplicate, args.into(), item.into()).into()
}
