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
    json::{BatchRequest, CheckRequest, ItemErrorJson, sealed_receipt, write_decision},
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
    let config = app.config_full();
    let requests = match parse_batch(&body, config.server.max_batch) {
        Ok(requests) => requests,
        Err(e) => return e.into_response(),
    };
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
                (item.receipt, item.cost == 0),
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
/// The checks of a batch body, at most `max`: each parsed, or the error that answers it.
///
/// Most batches hold only well-formed checks: parsed in one pass. Otherwise each check's text
/// is kept and parsed on its own, so that a malformed one fails alone. Either way parsing stops
/// at the first check past `max`, unread: a body of a million tiny items costs what `max` do.
fn parse_batch(
    body: &[u8],
    max: usize,
) -> Result<Vec<Result<CheckRequest<'_>, ApiError>>, ApiError> {
    let too_many = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a batch holds at most {max} checks (server.max_batch); this one has more"),
        )
        .with_code("batch_too_large")
    };
    match AtMost::<CheckRequest<'_>>::parse(body, max) {
        Ok(Some(checks)) => return Ok(checks.into_iter().map(Ok).collect()),
        Ok(None) => return Err(too_many()),
        Err(_) => {}
    }
    match AtMost::<&RawValue>::parse(body, max) {
        Ok(Some(raw)) => Ok(raw
            .iter()
            .enumerate()
            .map(|(i, raw)| parse_item(i, raw))
            .collect()),
        Ok(None) => Err(too_many()),
        // The body's own error, named as for any other body.
        Err(e) => Err(parse_json::<BatchRequest<'_>>(body)
            .err()
            .unwrap_or_else(|| {
                ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}"))
                    .with_code("malformed_json")
            })),
    }
}

/// `{"checks": [...]}` with at most `max` checks (see [`parse_batch`]).
struct AtMost<T> {
    max: usize,
    /// Set when a check past `max` stopped the parse.
    over: std::cell::Cell<bool>,
    checks: std::marker::PhantomData<T>,
}

impl<'de, T: serde::Deserialize<'de>> AtMost<T> {
    /// The checks; `None` if there are more than `max`.
    fn parse(body: &'de [u8], max: usize) -> Result<Option<Vec<T>>, serde_json::Error> {
        let at_most = AtMost {
            max,
            over: std::cell::Cell::new(false),
            checks: std::marker::PhantomData,
        };
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let parsed = serde::Deserializer::deserialize_struct(
            &mut deserializer,
            "BatchRequest",
            &["checks"],
            &at_most,
        )
        .and_then(|checks| deserializer.end().map(|()| checks));
        match parsed {
            Err(_) if at_most.over.get() => Ok(None),
            parsed => parsed.map(Some),
        }
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for &AtMost<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object with the field `checks`")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Vec<T>, A::Error> {
        #[derive(serde::Deserialize)]
        #[serde(field_identifier, rename_all = "lowercase")]
        enum Field {
            Checks,
        }
        let mut checks = None;
        while let Some(Field::Checks) = map.next_key()? {
            if checks.is_some() {
                return Err(serde::de::Error::duplicate_field("checks"));
            }
            checks = Some(map.next_value_seed(Items(self))?);
        }
        checks.ok_or_else(|| serde::de::Error::missing_field("checks"))
    }
}

/// The array of checks of [`AtMost`].
struct Items<'a, T>(&'a AtMost<T>);

impl<'de, T: serde::Deserialize<'de>> serde::de::DeserializeSeed<'de> for Items<'_, T> {
    type Value = Vec<T>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<T>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Items<'_, T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of checks")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let max = self.0.max;
        let mut checks = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(max));
        while checks.len() < max {
            match seq.next_element()? {
                Some(check) => checks.push(check),
                None => return Ok(checks),
            }
        }
        // One more is refused before it is read.
        match seq.next_element_seed(Past(&self.0.over))? {
            Some(()) | None => Ok(checks),
        }
    }
}

/// A check past the batch's `max`: marks it and stops the parse without reading it.
struct Past<'a>(&'a std::cell::Cell<bool>);

impl<'de> serde::de::DeserializeSeed<'de> for Past<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        self.0.set(true);
        Err(serde::de::Error::custom(
            "more checks than the batch may hold",
        ))
    }
}

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
