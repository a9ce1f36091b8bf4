//! The HTTP/JSON API: check, peek, batched checks, reset, duplicate guard, blocklist, metrics
//! and health.
//!
//! Every 4xx (and 5xx) body is an RFC 9457 problem document (`application/problem+json`) with
//! a machine-readable `code` and a `detail` saying what is wrong.
//!
//! # Layout
//! - `error`: [`ApiError`] (the error body and its status), `ApiJson`, the JSON body
//!   extractor whose rejections are error bodies, and `JsonBody` with `parse_json` for bodies
//!   parsed into types that borrow from them.
//! - `json`: the wire types: requests, decisions, leases, bans.
//! - `check`: `/v1/check`, `/v1/peek` (one handler body), and what the check endpoints share.
//! - `batch`: `/v1/checks`.
//! - `leases`: `/v1/acquire`, `/v1/release`, `/v1/extend`.
//! - `refund`: `/v1/refund` and `/v1/settle`.
//! - `duplicate`: the duplicate guard's acquire, complete and release.
//! - `admin`: the admin extractor (bearer token, see `crate::auth`), reset and the blocklist.
//! - `ops`: `/metrics`, `/healthz`, `/readyz`.

mod admin;
mod batch;
mod check;
mod duplicate;
mod error;
pub(crate) mod json;
mod leases;
mod ops;
mod refund;
mod scope;

#[cfg(test)]
mod allocations;

use std::sync::Arc;

use axum::{
    Router,
    http::StatusCode,
    routing::{delete, get, post},
};

pub(crate) use error::ApiError;
pub(crate) use scope::Admin;

use crate::app::App;

/// The API's routes, for [`crate::server::routes`] to mount beside the dashboard's.
pub(crate) fn api() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/check", post(check::check))
        .route("/v1/peek", post(check::peek))
        .route("/v1/checks", post(batch::checks))
        .route("/v1/refund", post(refund::refund))
        .route("/v1/settle", post(refund::settle))
        .route("/v1/acquire", post(leases::acquire))
        .route("/v1/release", post(leases::release))
        .route("/v1/extend", post(leases::extend))
        .route("/v1/reset", post(admin::reset))
        .route(
            "/v1/overrides",
            get(admin::overrides)
                .put(admin::set_override)
                .delete(admin::remove_override),
        )
        .route("/v1/duplicate/acquire", post(duplicate::acquire))
        .route("/v1/duplicate/release", post(duplicate::release))
        .route("/v1/duplicate/complete", post(duplicate::complete))
        .route("/v1/blocklist", get(admin::blocklist).post(admin::ban))
        .route("/v1/blocklist/{kind}/{value}", delete(admin::unban))
        .route("/metrics", get(ops::metrics))
        .route("/healthz", get(ops::healthz))
        .route("/healthcheck", get(ops::healthcheck))
        .route("/readyz", get(ops::readyz))
}

/// What answers a path no route serves.
pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint; see docs/api.md")
        .with_code("no_such_endpoint")
}

/// What answers a method a route does not serve.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint; see docs/api.md",
    )
}
