//! The duplicate guard: acquire, complete, release.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{Json, extract::State, http::StatusCode};
use serde_json::Value;
use tollgate::{Acquire, CheckError, Fingerprint, Lease};

use super::{
    check::policy,
    error::{ApiError, ApiJson, check_error},
    json::{AcquireJson, AcquireRequest, CompleteRequest, ReleaseRequest, canonical_json, ceil_ms},
    scope::RefundCaller,
};
use crate::{app::App, config::bounded_duration};

pub(crate) async fn acquire(
    State(app): State<Arc<App>>,
    _: RefundCaller,
    ApiJson(req): ApiJson<AcquireRequest>,
) -> Result<Json<AcquireJson>, ApiError> {
    let entry = policy(&app, &req.policy)?;
    let guard = entry.duplicate.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "policy {:?} has no duplicate guard; add `duplicate = {{ by = \"args\", ttl = \"5s\" }}` to it",
                req.policy
            ),
        )
        .with_code("no_duplicate_guard")
    })?;
    let mut identity = req.identity;
    // One reading of an idempotency key everywhere: `"abc"` and `abc` are one key. A key is
    // the user's own, as the tower layer's are: another user's `abc` is another submission
    // (and never gets this one's response).
    let user = identity.user_id.clone();
    for (name, value) in &mut identity.headers {
        if name.eq_ignore_ascii_case("idempotency-key") {
            let key = tollgate::idempotency_key(value)
                .map_err(|why| ApiError::new(StatusCode::BAD_REQUEST, why))?;
            *value = match &user {
                Some(user) => format!("u{}:{user}:{key}", user.len()),
                None => format!("-:{key}"),
            };
        }
    }
    let identity = identity.into_identity();
    let mut canonical = String::new();
    canonical_json(&req.args, &mut canonical);
    let fingerprint = Fingerprint::of(canonical.as_bytes());
    let started = Instant::now();
    let result = app.gate.acquire(&guard, &identity, &fingerprint).await;
    app.metrics.store_call(
        "acquire",
        started.elapsed(),
        matches!(result, Err(CheckError::Store(_))),
    );
    let body = match result.map_err(check_error)? {
        Acquire::Acquired(lease) => AcquireJson {
            acquired: true,
            lease: Some(lease.to_string()),
            state: None,
            retry_after_ms: 0,
            message: None,
            same_args: None,
            response: None,
        },
        Acquire::Duplicate(dup) => AcquireJson {
            acquired: false,
            lease: None,
            state: Some(dup.state),
            retry_after_ms: ceil_ms(dup.retry_after),
            message: Some(dup.message(guard.by())),
            same_args: Some(dup.fingerprint_matches),
            // Only the same submission gets the first one's response: a key reused with other
            // `args` is told so, not handed what another payload produced.
            response: dup
                .response
                .as_deref()
                .filter(|_| dup.fingerprint_matches)
                .map(|bytes| {
                    serde_json::from_slice(bytes).unwrap_or_else(|_| {
                        Value::String(String::from_utf8_lossy(bytes).into_owned())
                    })
                }),
        },
    };
    Ok(Json(body))
}

pub(crate) async fn complete(
    State(app): State<Arc<App>>,
    _: RefundCaller,
    ApiJson(req): ApiJson<CompleteRequest>,
) -> Result<Json<Value>, ApiError> {
    let lease: Lease = req.lease.parse().map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("malformed lease: {e}"))
            .with_code("malformed_lease")
    })?;
    // The engine's bound, set at start (the setting applies after a restart): what a reload
    // wrote is not in force, and a `keep_for` past the bound in force would be cut silently.
    let max = app.gate.max_keep_for();
    let keep_for = match &req.keep_for {
        Some(text) => bounded_duration(text)
            .ok()
            .filter(|d| !d.is_zero() && *d <= max)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "keep_for {text:?}: expected e.g. \"1m\" (units ms, s, m, h, d; at most {}, server.max_keep_for)",
                        tollgate::format_duration(max)
                    ),
                )
                .with_code("invalid_keep_for")
            })?,
        None => Duration::from_secs(60).min(max),
    };
    let mut body = String::new();
    canonical_json(&req.response, &mut body);
    let started = Instant::now();
    let result = app.gate.complete(&lease, body.as_bytes(), keep_for).await;
    app.metrics.store_call(
        "complete",
        started.elapsed(),
        matches!(result, Err(CheckError::Store(_))),
    );
    let completed = result.map_err(check_error)?;
    Ok(Json(serde_json::json!({ "completed": completed })))
}

pub(crate) async fn release(
    State(app): State<Arc<App>>,
    _: RefundCaller,
    ApiJson(req): ApiJson<ReleaseRequest>,
) -> Result<Json<Value>, ApiError> {
    let lease: Lease = req.lease.parse().map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("malformed lease: {e}"))
            .with_code("malformed_lease")
    })?;
    let started = Instant::now();
    let result = app.gate.release(&lease).await;
    app.metrics
        .store_call("release", started.elapsed(), result.is_err());
    let released = result.map_err(|e| ApiError::store("release", &e))?;
    Ok(Json(serde_json::json!({ "released": released })))
}
