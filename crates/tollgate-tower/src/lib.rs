//! tower/axum middleware for [tollgate]: rate limits that answer with `429`, `Retry-After` and
//! `RateLimit` fields, duplicate-submission guards with idempotent replay, client
//! identification behind trusted proxies, and the `#[rate_limit]` / `#[prevent_duplicate]`
//! attribute macros.
//!
//! ```no_run
//! use std::{net::SocketAddr, sync::Arc};
//!
//! use axum::{Json, Router, routing::post};
//! use tollgate::{MemoryStore, Tollgate};
//! use tollgate_tower::{ContextLayer, DuplicateLayer, IdentityResolver, Rejection, rate_limit};
//!
//! // The seed's @RateLimiters: every rule of every limiter in one atomic check.
//! #[rate_limit(by = "ip", rules = ["1/1m", "10/1h", "60/1d"], blocklist = "10m")]
//! #[rate_limit(by = "user_id", rules = ["20/1d"])]
//! async fn send_code(Json(body): Json<serde_json::Value>) -> Result<Json<serde_json::Value>, Rejection> {
//!     Ok(Json(serde_json::json!({ "sent": true, "to": body["phone"] })))
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let gate = Arc::new(Tollgate::new(MemoryStore::new()));
//! let identity = IdentityResolver::new()
//!     .trust_proxy("10.0.0.0/8".parse()?) // believe X-Forwarded-For only from our proxies
//!     .enrich(|who, headers, _| match headers.get("x-user-id").and_then(|v| v.to_str().ok()) {
//!         Some(id) => who.with_user_id(id), // stands in for the app's real authentication
//!         None => who,
//!     });
//! let app = Router::new()
//!     .route("/sms/code", post(send_code))
//!     .route(
//!         "/orders",
//!         post(|| async { "created" }).layer(DuplicateLayer::idempotency_key(gate.clone(), "orders")),
//!     )
//!     .layer(ContextLayer::new(gate, identity));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8090").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! A complete service is in `examples/sms-verification`.
//!
//! # Any tower stack
//! The layers take requests of any body and answer in the inner service's own body type
//! ([`LayerBody`]): an admitted request's response passes through untouched, and axum does not
//! box it again. They fit axum routers, tonic servers (`Server::builder().layer(...)`, feature
//! `tonic`) and hyper services (insert a [`PeerAddr`] per connection; a body other than
//! http-body-util's `UnsyncBoxBody` goes through wrapped in [`GateBody::new`]). A gRPC request
//! (`Content-Type: application/grpc...`) is refused with a gRPC status, `RESOURCE_EXHAUSTED`
//! and the delay in `grpc-retry-pushback-ms` ([`Rejection::into_grpc_response`]).
//!
//! # Features
//! - `axum` (default): [`Rejection`] implements axum's `IntoResponse` (handlers guarded by
//!   the macros return it), and the client address is read from axum's
//!   `ConnectInfo<SocketAddr>`.
//! - `macros` (default): [`rate_limit`] and [`prevent_duplicate`].
//! - `tonic`: `From<Rejection> for tonic::Status` (for macro-guarded gRPC methods), the
//!   client address from tonic's `TcpConnectInfo`, and tonic's body as a [`LayerBody`].
//!
//! Without `axum`, nothing of axum is compiled: `default-features = false` for a hyper-only
//! or tonic-only service.
//!
//! # Layout
//! - `rate_limit/`: [`RateLimitLayer`], [`RateLimitService`], [`RateLimitFuture`]: one
//!   policy per route or service.
//! - `duplicate/`: [`DuplicateLayer`], [`DuplicateService`], [`DuplicateFuture`]:
//!   idempotency keys with replay, argument fingerprints, per-client locks.
//! - `context/`: [`ContextLayer`], [`ContextService`], [`ContextFuture`] and [`Context`]: the
//!   task-local engine and identity that macro-guarded code reads.
//! - `identity/`: [`IdentityResolver`] (peer address, trusted proxies and
//!   [`ForwardedHeader`], [`AuthUser`], headers) and [`PeerAddr`].
//! - `rejection`: [`Rejection`], every refusal and its HTTP response (RFC 9457 problem body)
//!   or gRPC status.
//! - `body`: [`LayerBody`], the bodies the layers answer in, and [`GateBody`], any body wrapped
//!   into one.
//! - `headers`: `RateLimit-Policy` / `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11) and
//!   `Retry-After`; [`insert_rate_limit_headers`].
//! - `engine`: the type-erased engine the layers share, and the lease guard that frees a lock
//!   when a handler is cancelled.
//! - the macros, re-exported from `tollgate-macros` (feature `macros`, on by default):
//!   [`rate_limit`], [`prevent_duplicate`].
//!
//! [tollgate]: https://docs.rs/tollgate

mod body;
mod context;
mod duplicate;
mod gate;
mod headers;
mod identity;
mod rate_limit;
mod rejection;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use body::{BoxError, GateBody, LayerBody};
pub use context::{Context, ContextFuture, ContextLayer, ContextService};
pub use duplicate::{DuplicateFuture, DuplicateLayer, DuplicateService};
pub use headers::{HeaderStyle, insert_rate_limit_headers};
pub use identity::{AuthUser, ForwardedHeader, IdentityResolver, PeerAddr};
pub use rate_limit::{
    Cost, Count, FailedOpen, FailureWhen, RateLimitFuture, RateLimitLayer, RateLimitService, Settle,
};
pub use rejection::{QUOTA_EXCEEDED, Rejection};

#[cfg(feature = "macros")]
pub use tollgate_macros::{prevent_duplicate, rate_limit};

/// docs/middleware.md's examples, compiled (and the runnable ones run) as doctests.
#[cfg(all(doctest, feature = "axum", feature = "tonic"))]
#[doc = include_str!("../../../docs/middleware.md")]
pub struct MiddlewareGuide;

/// docs/business-limits.md's examples, compiled as doctests.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../docs/business-limits.md")]
pub struct BusinessLimitsGuide;
