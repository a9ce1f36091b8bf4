//! `/v1/acquire`, `/v1/release`, `/v1/extend`: checks that hold concurrency slots, and the
//! leases that name them.

use std::sync::Arc;

use axum::{
    Json,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use tollgate::Identity;

use super::{
    error::{ApiError, ApiJson, JsonBody, parse_json},
    json::{CheckRequest, LeaseRequest},
    scope::{CheckCaller, RefundCaller},
};
use crate::{app::App, config::PolicyEntry};

use super::check::{decide, policy, timed};

/// `/v1/acquire`: `/v1/check` for a policy with a concurrency limiter; an admission's
/// `"lease"` names the slot it holds, for `/v1/release` and `/v1/extend`.
pub(crate) async fn acquire(
    State(app): State<Arc<App>>,
    _: CheckCaller,
    JsonBody(body): JsonBody,
) -> Response {
    let req: CheckRequest<'_> = match parse_json(&body) {
        Ok(req) => req,
        Err(e) => return e.into_response(),
    };
    let concurrent = app.config().policies.get(&*req.policy).map(|entry| {
        entry
            .policy
            .limiters()
            .iter()
            .any(tollgate::Limiter::is_concurrent)
    });
    if concurrent == Some(false) {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "policy {:?} has no concurrency limiter (a limiter with `concurrent = N`): use /v1/check",
                req.policy
            ),
        )
        .with_code("not_concurrent")
        .into_response();
    }
    decide(&app, req, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The policy, lease and identity a `/v1/release` or `/v1/extend` body names.
fn lease(
    app: &App,
    req: LeaseRequest,
) -> Result<(PolicyEntry, tollgate::Receipt, Identity), ApiError> {
    let entry = policy(app, &req.policy)?;
    let identity = req.identity.into_identity();
    let (lease, _) = open(app, &entry, &identity, "lease", &req.lease)?;
    Ok((entry, lease, identity))
}

/// The receipt (or lease) a caller sent back, if this server sealed it for this policy and
/// identity, with its tag; else a 400 saying what is wrong.
pub(super) fn open(
    app: &App,
    entry: &PolicyEntry,
    identity: &Identity,
    what: &str,
    sealed: &str,
) -> Result<(tollgate::Receipt, [u8; 16]), ApiError> {
    app.receipts
        .open(&entry.policy, identity, sealed)
        .map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, format!("{what}: {e}"))
                .with_code("invalid_request")
        })
}

/// `/v1/release`: ends a lease of `/v1/acquire` (its slots are free at once; its rate quota
/// stays spent). Releasing twice, or after the lease ran out, changes nothing.
pub(crate) async fn release(
    State(app): State<Arc<App>>,
    _: RefundCaller,
    ApiJson(req): ApiJson<LeaseRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (entry, lease, identity) = lease(&app, req)?;
    let release = app
        .gate
        .release_concurrent(&entry.policy, &identity, &lease);
    timed(&app, "release", release).await?;
    Ok(Json(serde_json::json!({ "released": true })))
}

/// `/v1/extend`: renews a lease of `/v1/acquire` (its TTL counts again from now); answers the
/// lease that names it now, or `409` (`lease_lost`) if it had run out or been released.
pub(crate) async fn extend(
    State(app): State<Arc<App>>,
    _: RefundCaller,
    ApiJson(req): ApiJson<LeaseRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (entry, lease, identity) = lease(&app, req)?;
    let extend = app.gate.extend_concurrent(&entry.policy, &identity, &lease);
    match timed(&app, "extend", extend).await? {
        Some(renewed) => {
            let sealed = app.receipts.seal(&entry.policy, &identity, &renewed);
            Ok(Json(serde_json::json!({ "lease": sealed })))
        }
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "the lease ran out or was released: its slot may be someone else's; acquire again",
        )
        .with_code("lease_lost")),
    }
}
