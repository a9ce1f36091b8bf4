//! `/v1/check` and `/v1/peek` (one handler body), and `/v1/checks` (a batch of checks).
//!
//! The hot path: the policy is read from the live configuration through a guard (no
//! reference count touched), the identity takes the request's strings as they are, the
//! decision counters are the policy's own handles, and the answer is written straight from
//! the decision into one buffer of the right size.

use std::{borrow::Cow, pin::Pin, sync::Arc, task::Poll, time::Instant};

use axum::{
    Json,
    extract::{FromRequestParts, State},
    http::{HeaderName, HeaderValue, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use serde_json::value::RawValue;
use tollgate::{CheckError, Decision, Identity, fields};

use super::{
    error::{ApiError, ApiJson, JsonBody, check_error, parse_json},
    json::{
        BatchChecks, BatchRequest, CheckRequest, ItemErrorJson, LeaseRequest, RefundRequest,
        decision_size_hint, sealed_receipt, write_decision,
    },
    scope::{Admin, CheckCaller, RefundCaller},
};
use crate::{
    app::App,
    auth::Scope,
    config::{Config, PolicyEntry},
};

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
fn json_bytes(body: Vec<u8>) -> Response {
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
async fn decide(app: &App, req: CheckRequest<'_>, consume: bool) -> Result<Response, ApiError> {
    let config = app.config();
    let entry = config
        .policies
        .get(&*req.policy)
        .ok_or_else(|| unknown_policy(&req.policy))?;
    let identity = req.identity.into_identity();
    let cost = req.cost.unwrap_or(1);
    let receipt = req.receipt;
    let started = Instant::now();
    let decision = if consume {
        app.gate.check(&entry.policy, &identity, cost).await
    } else {
        app.gate.peek(&entry.policy, &identity, cost).await
    };
    let decision = record(
        app,
        entry,
        &req.policy,
        &identity,
        consume,
        decision,
        started,
    )?;
    let mut body = Vec::with_capacity(decision_size_hint(&decision));
    let receipt = sealed_receipt(app, &entry.policy, &identity, &decision, receipt);
    write_decision(&mut body, &decision, &entry.rule_texts, receipt.as_deref());
    let mut response = json_bytes(body);
    let style = config.server.headers.for_answer(decision.allowed());
    let headers = response.headers_mut();
    let wait = decision.retry_after();
    entry
        .fields
        .write(style, decision.rules(), wait, |name, value| {
            let made = entry.policy_field.as_ref().filter(|made| {
                name == fields::RATELIMIT_POLICY && made.as_bytes() == value.as_bytes()
            });
            if let Some(value) = made.cloned().or_else(|| HeaderValue::from_str(value).ok()) {
                headers.insert(HeaderName::from_static(name), value);
            }
        });
    Ok(response)
}

/// Records a check's answer in the metrics: a check counts its decision and its store call, a
/// peek its store call only; an answer given without the store (bypassed, or over the largest
/// cost) counts no store call.
fn record(
    app: &App,
    entry: &PolicyEntry,
    policy: &str,
    identity: &Identity,
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
        app.dashboard
            .decided(policy, &entry.policy, identity, &decision);
        if decision.allowed() && decision.shadow_denied() {
            shadow_denied(app, policy, &decision);
        }
    } else {
        app.record_store_call("peek", decision.reason(), started);
    }
    Ok(decision)
}

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
fn open(
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

/// `/v1/refund`: gives back `cost` units (default 1, at most what the receipt charged) to
/// every rule of the policy for the identity, exactly those of the check whose `receipt` it
/// names (see `Tollgate::refund`). A receipt is spent once: a second refund of it is `409`. A
/// refund without a receipt undoes any caller's checks: it takes the refund scope's token, or
/// the admin token where that scope has none.
pub(crate) async fn refund(
    State(app): State<Arc<App>>,
    _: RefundCaller,
    mut parts: Parts,
    ApiJson(req): ApiJson<RefundRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    // Without a receipt, a refund undoes anyone's checks: it takes a token, the refund
    // scope's (checked above when the scope has one) or else the admin's.
    if req.receipt.is_none() && !app.auth.guarded(Scope::Refund) {
        Admin::from_request_parts(&mut parts, &app).await?;
    }
    let entry = policy(&app, &req.policy)?;
    let identity = req.identity.into_identity();
    let receipt = match &req.receipt {
        Some(sealed) => {
            let (receipt, _) = open(&app, &entry, &identity, "receipt", sealed)?;
            // Past the policy's longest window a receipt gives nothing back, and its spent
            // mark is gone: refused, not refunded twice.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            let newest = (0..entry.policy.limiters().len())
                .filter_map(|i| receipt.at_us(i))
                .max()
                .unwrap_or(0);
            let window = crate::receipt::longest_window(&entry.policy);
            if newest.saturating_add(u64::try_from(window.as_micros()).unwrap_or(u64::MAX)) <= now {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "this receipt's windows have ended: there is nothing left to give back",
                )
                .with_code("receipt_expired"));
            }
            let tag = app.receipts.spent_tag(&entry.policy, &identity, &receipt);
            let spend = crate::receipt::spend(&app.gate, &entry.policy, &tag);
            if !timed(&app, "refund", spend).await? {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "this receipt was refunded already: a receipt gives back its units once",
                )
                .with_code("already_refunded"));
            }
            Some(receipt)
        }
        None => None,
    };
    let cost = receipt.as_ref().map_or(req.cost.unwrap_or(1), |r| {
        req.cost.unwrap_or(1).min(r.units())
    });
    let refund = app
        .gate
        .refund(&entry.policy, &identity, cost, receipt.as_ref());
    timed(&app, "refund", refund).await?;
    Ok(Json(serde_json::json!({ "refunded": cost })))
}

/// A store operation `op` of the lease and refund endpoints, timed in the metrics; a failure
/// is the API's error.
async fn timed<T>(
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

/// Counts and logs each shadow limiter that would have denied an admitted check.
#[cold]
fn shadow_denied(app: &App, policy: &str, decision: &Decision) {
    let mut last: Option<&str> = None;
    for rule in decision.shadow_denied_rules() {
        if last != Some(rule.limiter.as_str()) {
            app.metrics.shadow_denied(policy, &rule.limiter);
            last = Some(rule.limiter.as_str());
        }
    }
}

/// `/v1/checks`: every check of the batch, each all-or-nothing on its own, answered in order, a
/// decision or `{"error": ...}` per check.
///
/// The body is parsed once, each check's text borrowed from it and parsed on its own (so a
/// malformed check fails alone); the configuration is read once for the batch. The checks are
/// started in order and polled together: on the memory store each is decided in its first
/// poll, one after the other; on Redis their scripts go out together (the store batches the
/// checks in flight). The answer is written into one buffer.
pub(crate) async fn checks(
    State(app): State<Arc<App>>,
    _: CheckCaller,
    JsonBody(body): JsonBody,
) -> Response {
    // Most batches hold only well-formed checks: parsed in one pass. Otherwise each check's
    // text is kept and parsed on its own, so that a malformed one fails alone.
    let parsed: Result<Vec<Result<CheckRequest<'_>, ApiError>>, ApiError> =
        match serde_json::from_slice::<BatchChecks<'_>>(&body) {
            Ok(batch) => Ok(batch.checks.into_iter().map(Ok).collect()),
            Err(_) => parse_json::<BatchRequest<'_>>(&body).map(|batch| {
                batch
                    .checks
                    .iter()
                    .enumerate()
                    .map(|(i, raw)| parse_item(i, raw))
                    .collect()
            }),
        };
    let requests = match parsed {
        Ok(requests) => requests,
        Err(e) => return e.into_response(),
    };
    let config = app.config_full();
    let max = config.server.max_batch;
    if requests.len() > max {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "a batch holds at most {max} checks (server.max_batch); this one has {}",
                requests.len()
            ),
        )
        .with_code("batch_too_large")
        .into_response();
    }
    // All the units a batch charges together are bounded too: each is charged to the store.
    let max_cost = config.server.max_batch_cost;
    let cost = requests
        .iter()
        .flatten()
        .fold(0u64, |sum, r| sum.saturating_add(r.cost.unwrap_or(1)));
    if cost > max_cost {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "a batch charges at most {max_cost} units (server.max_batch_cost); this one charges {cost}"
            ),
        )
        .with_code("batch_too_costly")
        .into_response();
    }
    // What each check needs, or the error that answers it.
    let items: Vec<Result<Item<'_, '_>, ApiError>> = requests
        .into_iter()
        .map(|request| request.and_then(|request| item(&config, request)))
        .collect();
    let mut slots: Vec<_> = items
        .iter()
        .map(|item| match item {
            Ok(item) => Slot::Checking {
                check: app
                    .gate
                    .check(&item.entry.policy, &item.identity, item.cost),
                started: None,
            },
            Err(_) => Slot::Refused,
        })
        .collect();
    let app = &*app;
    // The answers are written in order as they come: on the memory store each right after its
    // check; one that comes before those ahead of it waits in its slot.
    let mut body = Vec::with_capacity(16 + items.len() * 256);
    body.extend_from_slice(b"{\"results\":[");
    let mut written = 0;
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (i, (slot, item)) in slots.iter_mut().zip(&items).enumerate() {
            if let (Slot::Checking { check, started }, Ok(item)) = (&mut *slot, item) {
                let started = *started.get_or_insert_with(Instant::now);
                match Pin::new(check).poll(cx) {
                    Poll::Ready(decision) => {
                        let answer = record(
                            app,
                            item.entry,
                            &item.policy,
                            &item.identity,
                            true,
                            decision,
                            started,
                        );
                        if i == written {
                            write_answer(app, &mut body, i, answer.as_ref(), item);
                            *slot = Slot::Written;
                            written += 1;
                        } else {
                            *slot = Slot::Answered(answer);
                        }
                    }
                    Poll::Pending => waiting = true,
                }
            }
            if i == written {
                match (&*slot, item) {
                    (Slot::Answered(answer), Ok(item)) => {
                        write_answer(app, &mut body, i, answer.as_ref(), item);
                    }
                    (Slot::Refused, Err(e)) => {
                        if i > 0 {
                            body.push(b',');
                        }
                        let _ = serde_json::to_writer(&mut body, &ItemErrorJson(e));
                    }
                    _ => continue,
                }
                *slot = Slot::Written;
                written += 1;
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    body.extend_from_slice(b"]}");
    json_bytes(body)
}

/// Writes the `i`th answer of a batch, of `item`: its decision, or its error and status.
fn write_answer(
    app: &App,
    body: &mut Vec<u8>,
    i: usize,
    answer: Result<&Decision, &ApiError>,
    item: &Item,
) {
    if i > 0 {
        body.push(b',');
    }
    match answer {
        Ok(decision) => {
            let receipt = sealed_receipt(
                app,
                &item.entry.policy,
                &item.identity,
                decision,
                item.receipt,
            );
            write_decision(body, decision, &item.entry.rule_texts, receipt.as_deref());
        }
        // Writing an error's text into a Vec cannot fail.
        Err(e) => {
            let _ = serde_json::to_writer(&mut *body, &ItemErrorJson(e));
        }
    }
}

/// One check of a batch, before the store: its policy, identity and cost.
struct Item<'c, 'b> {
    entry: &'c PolicyEntry,
    policy: Cow<'b, str>,
    identity: Identity,
    cost: u64,
    /// The answer carries the receipt.
    receipt: bool,
}

/// A check of a batch: asking the store (timed from its first poll), answered (waiting for
/// the answers ahead of it to be written), refused before the store (its item holds the
/// error), or written.
// One per check of a batch, in one vector; boxing the answer would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Slot<F> {
    Checking { check: F, started: Option<Instant> },
    Answered(Result<Decision, ApiError>),
    Refused,
    Written,
}

/// A check of a batch, or the error that answers it (an unknown policy).
fn item<'c, 'b>(config: &'c Config, req: CheckRequest<'b>) -> Result<Item<'c, 'b>, ApiError> {
    let entry = config
        .policies
        .get(&*req.policy)
        .ok_or_else(|| unknown_policy(&req.policy))?;
    Ok(Item {
        entry,
        policy: req.policy,
        identity: req.identity.into_identity(),
        cost: req.cost.unwrap_or(1),
        receipt: req.receipt,
    })
}

/// The `i`th check of a batch, parsed from its text, or the error naming what is wrong with it.
fn parse_item(i: usize, raw: &RawValue) -> Result<CheckRequest<'_>, ApiError> {
    serde_json::from_str(raw.get()).map_err(|_| {
        let mut deserializer = serde_json::Deserializer::from_str(raw.get());
        let message =
            match serde_path_to_error::deserialize::<_, CheckRequest<'_>>(&mut deserializer) {
                Err(e) => {
                    let path = e.path().to_string();
                    let at = if path == "." {
                        format!("checks[{i}]")
                    } else {
                        format!("checks[{i}].{path}")
                    };
                    format!("invalid request: {at}: {}", without_position(e.inner()))
                }
                // The text is one JSON value: nothing else can fail.
                Ok(_) => format!("invalid request: checks[{i}]"),
            };
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    })
}

/// A parse error's text without its line and column: those of a check's own text would not be
/// the body's (the check's place is given as `checks[i]`).
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(message) => message.to_owned(),
        None => text,
    }
}
