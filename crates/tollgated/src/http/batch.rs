//! `/v1/checks`: a batch of checks, each all-or-nothing on its own, answered in order.

use std::{borrow::Cow, pin::Pin, sync::Arc, task::Poll, time::Instant};

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::value::RawValue;
use tollgate::{Decision, Identity};

use super::{
    error::{ApiError, JsonBody, parse_json},
    json::{
        BatchChecks, BatchRequest, CheckRequest, ItemErrorJson, sealed_receipt, write_decision,
    },
    scope::CheckCaller,
};
use crate::{
    app::App,
    config::{Config, PolicyEntry},
};

use super::check::{json_bytes, record, unknown_policy};

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
                            item.cost,
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
            write_decision(
                body,
                decision,
                &item.entry.policy,
                &decision.rules(&item.entry.policy),
                &item.entry.rule_texts,
                receipt.as_deref(),
            );
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
    if req.max_delay_ms.is_some() {
        return Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "max_delay_ms is for /v1/check: a batch's checks are answered at once",
        ));
    }
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
