//! `/v1/check` and `/v1/peek` (one handler body), and `/v1/checks` (a batch of checks).
//!
//! The hot path: the policy is read from the live configuration through a guard (no
//! reference count touched), the identity takes the request's strings as they are, the
//! decision counters are the policy's own handles, and the answer is written straight from
//! the decision into one buffer of the right size.

use std::{sync::Arc, time::Instant};

use axum::{
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures_util::future::join_all;
use serde::Serialize;
use serde_json::Value;
use tollgate::Decision;

use super::{
    error::{ApiError, ApiJson, check_error},
    json::{BatchJson, BatchRequest, CheckRequest, DecisionJson, ItemJson},
};
use crate::{app::App, config::PolicyEntry};

/// The policy `name` of the configuration in force.
pub(crate) fn policy(app: &App, name: &str) -> Result<PolicyEntry, ApiError> {
    app.config()
        .policies
        .get(name)
        .cloned()
        .ok_or_else(|| unknown_policy(name))
}

fn unknown_policy(name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("unknown policy {name:?}"))
}

pub(crate) async fn check(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<CheckRequest>,
) -> Response {
    match decide(&app, req, true).await {
        Ok(decision) => decision_response(&decision),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn peek(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<CheckRequest>,
) -> Response {
    match decide(&app, req, false).await {
        Ok(decision) => decision_response(&decision),
        Err(e) => e.into_response(),
    }
}

fn decision_response(decision: &Decision) -> Response {
    let json = DecisionJson(decision);
    json_response(&json, json.size_hint())
}

/// `value` as a `200` JSON answer, written into one buffer of `capacity` bytes.
fn json_response(value: &impl Serialize, capacity: usize) -> Response {
    let mut body = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The body of `/v1/check` (`consume`) and `/v1/peek`: one decision, recorded in the metrics
/// (a peek counts its store call, not a decision; an answer given without the store, bypassed
/// or over the largest cost, counts no store call).
async fn decide(app: &App, req: CheckRequest, consume: bool) -> Result<Decision, ApiError> {
    let config = app.config();
    let entry = config
        .policies
        .get(&req.policy)
        .ok_or_else(|| unknown_policy(&req.policy))?;
    let identity = req.identity.into_identity();
    let cost = req.cost.unwrap_or(1);
    let started = Instant::now();
    let decision = if consume {
        app.gate.check(&entry.policy, &identity, cost).await
    } else {
        app.gate.peek(&entry.policy, &identity, cost).await
    }
    .map_err(check_error)?;
    if consume {
        app.record(
            "check",
            (&entry.metrics, &req.policy),
            decision.reason(),
            decision.allowed(),
            started,
        );
        app.dashboard
            .decided(&req.policy, &entry.policy, &identity, &decision);
    } else {
        app.record_store_call("peek", decision.reason(), started);
    }
    Ok(decision)
}

/// `/v1/checks`: every check of the batch, each all-or-nothing on its own, run at once (on
/// Redis their scripts go out together on the one connection); the answers in order, a
/// decision or `{"error": ...}` per check.
pub(crate) async fn checks(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<BatchRequest>,
) -> Response {
    let max = app.config().server.max_batch;
    if req.checks.len() > max {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "a batch holds at most {max} checks (server.max_batch); this one has {}",
                req.checks.len()
            ),
        )
        .into_response();
    }
    let app = &*app;
    let results = join_all(
        req.checks
            .into_iter()
            .enumerate()
            .map(|(i, item)| async move {
                let answer = match parse_item(i, item) {
                    Ok(check) => decide(app, check, true).await,
                    Err(e) => Err(e),
                };
                match answer {
                    Ok(decision) => ItemJson::Decision(decision),
                    Err(e) => ItemJson::Error(e),
                }
            }),
    )
    .await;
    let capacity = 16 + results.len() * 320;
    json_response(&BatchJson { results }, capacity)
}

/// One item of a batch as a check, or the error naming what is wrong with it.
fn parse_item(i: usize, item: Value) -> Result<CheckRequest, ApiError> {
    serde_path_to_error::deserialize(item).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            format!("checks[{i}]")
        } else {
            format!("checks[{i}].{path}")
        };
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid request: {at}: {}", e.inner()),
        )
    })
}
