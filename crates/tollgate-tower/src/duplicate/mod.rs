//! Duplicate submissions: the first request proceeds, repeats are refused or answered with
//! the first response.
//!
//! | mode ([`DuplicateBy`](tollgate::DuplicateBy)) | same submission | a repeat while the first runs | after it completed |
//! |---|---|---|---|
//! | `key` | same `Idempotency-Key` (per user when known) | 409 | the first response replayed, plus `Idempotent-Replayed: true` (and, for older clients, `Idempotency-Replayed: true`); 422 if the key comes with another request |
//! | `args` | same method, path, query and body | 409 | 429 + `Retry-After` until the TTL ends |
//! | `ip`, `user_id`, `user_name` | same client | 409 | 429 + `Retry-After` until the TTL ends |
//!
//! A 5xx response, a 429 (an inner rate limit refused it: nothing ran), an error from the inner
//! service, or a dropped (cancelled) handler releases the lock so the client can retry at once.
//! Bodies that the mode reads (`key`, `args`) are buffered up to a cap (413 beyond it). A
//! request without the required `Idempotency-Key` gets 400. A key's lock holds for a minute
//! while its request runs, unless [`ttl`](DuplicateLayer::ttl) says otherwise: a request that
//! runs longer may run twice. A replay carries the first response's `Set-Cookie` only where
//! the key is a user's own; a key no user owns is anyone's who sends it.
//!
//! ```no_run
//! use std::{net::SocketAddr, sync::Arc, time::Duration};
//!
//! use axum::{Router, http::StatusCode, routing::post};
//! use tollgate::{MemoryStore, Tollgate};
//! use tollgate_tower::DuplicateLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let gate = Arc::new(Tollgate::new(MemoryStore::new()));
//! let orders = DuplicateLayer::idempotency_key(gate, "orders")
//!     .ttl(Duration::from_secs(30)) // a crashed handler's lock frees itself after this
//!     .replay_for(Duration::from_secs(24 * 3600));
//! let app = Router::new().route(
//!     "/orders",
//!     post(|| async { (StatusCode::CREATED, r#"{"order_id":"o-1"}"#) }).layer(orders),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8090").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```

mod body;
mod future;
mod layer;
mod service;
mod stored;

pub use future::DuplicateFuture;
pub use layer::DuplicateLayer;
pub use service::DuplicateService;
