//! Rate limits in front of any tower service: one [`Policy`](tollgate::Policy) checked per
//! request, all its rules at once.
//!
//! Allowed requests reach the inner service and their responses carry `RateLimit-Policy` and
//! `RateLimit` fields (unless turned off). Denied requests never reach it: they are answered
//! with the [`Rejection`](crate::Rejection)'s response, 429 with `Retry-After`, 403 when
//! blocked, 401 when a user dimension has no user, 503 when the store is down and the policy
//! fails closed; a gRPC request (`Content-Type: application/grpc...`) gets the gRPC status
//! instead (`RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`, see
//! [`Rejection::into_grpc_response`](crate::Rejection::into_grpc_response)).
//!
//! The layer takes requests of any body and answers in the inner service's body type
//! ([`LayerBody`](crate::LayerBody)): an admitted request's response passes through as it
//! is, so it fits axum routers, tonic servers and hyper services alike.
//!
//! A concurrency limit's slot ([`Limiter::concurrent`](tollgate::Limiter::concurrent)) is held
//! until the response body ends (or is dropped): the layer renews its lease every third of
//! its (shortest) TTL meanwhile, so a stream longer than the TTL keeps it, and a crashed
//! instance's slots come back within a TTL. That is one store call per open body and third of
//! a TTL, and a body nobody ends (a client that stops reading, a stream that never ends) holds
//! its slot as long; a store out of reach for most of a TTL loses the slot to the next request.
//! Renewing needs tokio's time driver (without it a slot lasts its body, at most its TTL). An
//! upgraded connection (a WebSocket after its `101`) holds no slot once its empty body ends.
//!
//! ```no_run
//! use std::{net::SocketAddr, sync::Arc};
//!
//! use axum::{Router, routing::post};
//! use tollgate::{Dimension, Limiter, MemoryStore, Policy, Tollgate};
//! use tollgate_tower::RateLimitLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let gate = Arc::new(Tollgate::new(MemoryStore::new()));
//! let sms = Policy::builder("sms_code")
//!     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?, "10/1h".parse()?, "60/1d".parse()?]))
//!     .build()?;
//! let app = Router::new().route(
//!     "/sms/code",
//!     post(|| async { "sent" }).layer(RateLimitLayer::new(gate, sms)),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8090").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```

mod count;
mod future;
mod layer;
mod service;

/// Marks a request the store could not decide, admitted by the policy's `on_error = allow` (or
/// `local`): found in the request's extensions (for the handler) and in the response's (for
/// the layers outside), so that failing open is never silent. Count it, log it, or alert on
/// it; the decision's reason is [`Reason::StoreUnavailable`](tollgate::Reason::StoreUnavailable).
///
/// ```
/// use axum::{Extension, Router, routing::get};
/// use tollgate_tower::FailedOpen;
///
/// async fn handler(failed_open: Option<Extension<FailedOpen>>) -> &'static str {
///     if failed_open.is_some() {
///         // The rate limit could not be checked: e.g. skip the expensive part.
///     }
///     "ok"
/// }
/// let app: Router = Router::new().route("/", get(handler));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedOpen;

pub use count::{Cost, Count, FailureWhen, Settle};
pub(crate) use count::{counted_status, receipt_of};
pub use future::RateLimitFuture;
pub use layer::RateLimitLayer;
pub use service::RateLimitService;
