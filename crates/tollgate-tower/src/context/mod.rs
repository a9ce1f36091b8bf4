//! The request context: the engine and the caller's identity, in a task-local, for code
//! guarded by `#[rate_limit]` and `#[prevent_duplicate]`.
//!
//! It is the Rust counterpart of Spring's `RequestContextHolder`: the [`ContextLayer`] resolves
//! the identity of each request and runs the rest of the stack inside the context; code that is
//! not behind an HTTP layer (a job, a consumer, a test) opens one with [`Context::scope`]. A
//! guarded function called outside any context fails with
//! [`Rejection::NoContext`](crate::Rejection::NoContext).
//!
//! A task-local does not follow `tokio::spawn`: open a scope in the spawned task if it calls
//! guarded functions.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate::{Identity, MemoryStore, Tollgate};
//! use tollgate_tower::{Context, Rejection, rate_limit};
//!
//! #[rate_limit(by = "user_id", rules = ["2/1m"])]
//! async fn export_report(name: &str) -> Result<String, Rejection> {
//!     Ok(format!("report {name}"))
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let gate = Arc::new(Tollgate::new(MemoryStore::new()));
//! let alice = Context::new(gate, Identity::new().with_user_id("alice"));
//! let results = alice
//!     .scope(async {
//!         [export_report("a").await, export_report("b").await, export_report("c").await]
//!     })
//!     .await;
//! assert!(results[0].is_ok() && results[1].is_ok());
//! assert!(matches!(results[2], Err(Rejection::RateLimited(_))));
//!
//! // Outside a context the call says so rather than running unguarded.
//! assert!(matches!(export_report("d").await, Err(Rejection::NoContext)));
//! # });
//! ```

mod future;
mod layer;
mod service;
mod task;

pub use future::ContextFuture;
pub use layer::ContextLayer;
pub use service::ContextService;
pub use task::Context;
