//! `/v1/check` and `/v1/peek` (one handler body), and what the other check endpoints share:
//! the policy look-up, the decision's record, the answer's bytes, timed store calls.
//!
//! The hot path: the policy is read from the live configuration through a guard (no
//! reference count touched), the identity takes the request's strings as they are, the
//! decision counters are the policy's own handles, and the answer is written straight from
//! the decision into one buffer of the right size.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    extract::State,
    http::{HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use tollgate::{CheckError, Decision, Identity, fields};

use super::{
    error::{ApiError, JsonBody, check_error, parse_json},
    json::{CheckRequest, decision_size_hint, sealed_receipt, write_decision},
    scope::CheckCaller,
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

pub(super) fn unknown_policy(name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("unknown policy {name:?}"))
        .with_code("unknown_policy")
}

pub(crate) async fn check(
    State(app): State<Arc<App>>,
    _: CheckCaller,
    JsonBody(body): JsonBody,
) -> Response {
    match parse_json(&body) {
        Ok(req) => decide(&app, req, true)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn peek(
    State(app): State<Arc<App>>,
    _: CheckCaller,
    JsonBody(body): JsonBody,
) -> Response {
    match parse_json(&body) {
        Ok(req) => decide(&app, req, false)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    }
}

/// A `200` answer of JSON `body`.
pub(super) fn json_bytes(body: Vec<u8>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// The answer of `/v1/check` (`consume`) and `/v1/peek`: one decision, recorded in the metrics
/// (see [`record`]), written as JSON into one buffer of the right size, with the rate-limit
/// fields of `server.headers` for a caller to copy onto its own response.
pub(super) async fn decide(
    app: &App,
    req: CheckRequest<'_>,
    consume: bool,
) -> Result<Response, ApiError> {
    let config = app.config();
    let entry = config
        .policies
        .get(&*req.policy)
        .ok_or_else(|| unknown_policy(&req.policy))?;
    let identity = req.identity.into_identity();
    let cost = req.cost.unwrap_or(1);
    let max_delay = req
        .max_delay_ms
        .filter(|&ms| ms > 0 && consume)
        .map(Duration::from_millis);
    let most = config.server.max_delay;
    if let Some(delay) = max_delay.filter(|&d| d > most) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "max_delay_ms {}: at most {} ({}, server.max_delay)",
                delay.as_millis(),
                most.as_millis(),
                tollgate::format_duration(most)
            ),
        )
        .with_code("invalid_max_delay"));
    }
    let started = Instant::now();
    let decision = match max_delay {
        Some(delay) => {
            app.gate
                .check_within(&entry.policy, &identity, cost, delay)
                .await
        }
        None if consume => app.gate.check(&entry.policy, &identity, cost).await,
        None => app.gate.peek(&entry.policy, &identity, cost).await,
    };
    let decision = record(
        app,
        entry,
        &req.policy,
        &identity,
        cost,
        consume,
        decision,
        started,
    )?;
    let mut body = Vec::with_capacity(decision_size_hint(&decision, &entry.policy));
    // A caller that waits gets the receipt that gives its units back if it stops.
    let due = decision.due(&entry.policy);
    if let Some(due) = due {
        app.metrics.waited(&req.policy, due);
    }
    let receipt = sealed_receipt(
        app,
        &entry.policy,
        &identity,
        &decision,
        (req.receipt || due.is_some(), cost == 0 && consume),
    );
    // Named once, for the body and the fields.
    let rules = decision.rules(&entry.policy);
    write_decision(
        &mut body,
        &decision,
        &entry.policy,
        &rules,
        &entry.rule_texts,
        receipt.as_deref(),
    );
    let mut response = json_bytes(body);
    let style = config.server.headers.for_answer(decision.allowed());
    let headers = response.headers_mut();
    entry
        .fields
        .write(style, &decision, &entry.policy, |name, value| {
            let made = entry.policy_field.as_ref().filter(|made| {
                name == fields::RATELIMIT_POLICY && made.as_bytes() == value.as_bytes()
            });
            if let Some(value) = made.cloned().or_else(|| HeaderValue::from_str(value).ok()) {
                headers.insert(HeaderName::from_static(name), value);
            }
        });
    if style != fields::HeaderStyle::None {
        entry
            .fields
            .write_warnings(&decision, &entry.policy, |name, value| {
                if let Ok(value) = HeaderValue::from_str(value) {
                    headers.insert(HeaderName::from_static(name), value);
                }
            });
    }
    Ok(response)
}

/// Records a check's answer in the metrics (and the traffic record): a check counts its
/// decision and its store call, a peek its store call only; an answer given without the store (bypassed, or over the largest
/// cost) counts no store call.
#[allow(clippy::too_many_arguments)]
pub(super) fn record(
    app: &App,
    entry: &PolicyEntry,
    policy: &str,
    identity: &Identity,
    cost: u64,
    consume: bool,
    decision: Result<Decision, CheckError>,
    started: Instant,
) -> Result<Decision, ApiError> {
    let decision = decision.map_err(check_error)?;
    if consume {
        app.record(
            "check",
            (&entry.metrics, policy),
            decision.reason(),
            decision.allowed(),
            started,
        );
        app.observed
            .decided(policy, &entry.policy, identity, &decision);
        if let Some(recorder) = &app.recorder {
            recorder.check(policy, identity, cost, &decision);
        }
        if decision.allowed() && decision.shadow_denied() {
            shadow_denied(app, policy, &entry.policy, &decision);
        }
        if decision.allowed() && entry.policy.warns() {
            warned(app, policy, &entry.policy, identity, &decision);
        }
    } else {
        app.record_store_call("peek", decision.reason(), started);
    }
    Ok(decision)
}

/// A store operation `op` of the lease and refund endpoints, timed in the metrics; a failure
/// is the API's error.
pub(super) async fn timed<T>(
    app: &App,
    op: &'static str,
    call: impl std::future::Future<Output = Result<T, CheckError>>,
) -> Result<T, ApiError> {
    let started = Instant::now();
    let result = call.await;
    app.metrics.store_call(
        op,
        started.elapsed(),
        matches!(result, Err(CheckError::Store(_))),
    );
    result.map_err(check_error)
}

/// Counts each rule in warning, and logs it once per key and window.
fn warned(
    app: &App,
    name: &str,
    policy: &tollgate::Policy,
    identity: &Identity,
    decision: &Decision,
) {
    use std::hash::{Hash, Hasher};

    let now_ms = crate::metrics::epoch().as_millis() as u64;
    for rule in decision.warnings(policy) {
        let Some(limiter) = policy
            .limiters()
            .iter()
            .find(|l| l.name() == &*rule.limiter)
        else {
            continue;
        };
        let mut key = std::hash::DefaultHasher::new();
        (name, &*rule.limiter, rule.rule).hash(&mut key);
        limiter.dimension().value(identity).hash(&mut key);
        // The same number for the rest of the rule's window (a fixed window's end; about a
        // window's length apart for the others).
        let window_ms = rule.rule.window_ms().max(1);
        let ends_ms = now_ms + rule.reset_after.as_millis() as u64;
        let window = (ends_ms + window_ms / 2) / window_ms;
        let text = rule.rule.to_string();
        let first = app
            .metrics
            .warned(name, &rule.limiter, &rule, &text, key.finish(), window);
        if let (true, Some(webhook)) = (first, &app.webhook) {
            let body = serde_json::json!({
                "event": "warning",
                "policy": name,
                "limiter": &*rule.limiter,
                "by": limiter.dimension().to_string(),
                // Cut as the dashboard's top list cuts it: a value may be megabytes.
                "value": limiter.dimension().value(identity).map(|v| crate::observed::shown(&v)),
                "rule": text,
                "limit": rule.rule.limit(),
                "remaining": rule.remaining,
                "reset_after_ms": rule.reset_after.as_millis() as u64,
                "at_ms": now_ms,
            });
            webhook.send(body.to_string().into_bytes());
        }
    }
}

/// Counts and logs each shadow limiter that would have denied an admitted check.
#[cold]
fn shadow_denied(app: &App, name: &str, policy: &tollgate::Policy, decision: &Decision) {
    let mut last = None;
    for rule in decision.shadow_denied_rules(policy) {
        if last.as_ref() != Some(&rule.limiter) {
            app.metrics.shadow_denied(name, &rule.limiter);
            last = Some(rule.limiter);
        }
    }
}
