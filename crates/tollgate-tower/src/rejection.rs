//! Why a request was turned away, and the HTTP response that says so.

use std::{fmt, time::Duration};

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tollgate::{CheckError, Decision, Reason, StoreError};

use crate::headers::{ceil_secs, insert_rate_limit_headers, insert_retry_after, policy_names};

/// A request turned away by a rate limit or a duplicate guard, or one that could not be
/// checked. It converts into the HTTP response ([`IntoResponse`]): a status, `Retry-After`
/// where waiting helps, `RateLimit-Policy` / `RateLimit` fields for rate limits, and an
/// RFC 9457 `application/problem+json` body.
///
/// | variant | status |
/// |---|---|
/// | [`RateLimited`](Self::RateLimited), [`Repeated`](Self::Repeated) | 429 |
/// | [`Blocked`](Self::Blocked) | 403 |
/// | [`MissingIdentity`](Self::MissingIdentity) | 401 (user dimensions), 400 (headers, arguments), 500 (no peer address) |
/// | [`StoreUnavailable`](Self::StoreUnavailable), [`Store`](Self::Store) | 503 |
/// | [`InProgress`](Self::InProgress) | 409 |
/// | [`KeyReused`](Self::KeyReused) | 422 |
/// | [`BadKey`](Self::BadKey), [`BadBody`](Self::BadBody) | 400 |
/// | [`PayloadTooLarge`](Self::PayloadTooLarge) | 413 |
/// | [`NoContext`](Self::NoContext), [`Fingerprint`](Self::Fingerprint) | 500 |
///
/// Functions guarded by `#[rate_limit]` or `#[prevent_duplicate]` return it through their
/// error type (`E: From<Rejection>`); an application with its own error type wraps it and
/// keeps the response, or builds its own.
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// A rule denied the request (reason `rate_limited`, or `cost_exceeds_limit`).
    RateLimited(Box<Decision>),
    /// The client is on the blocklist.
    Blocked(Box<Decision>),
    /// The store failed and the policy fails closed (`on_error = deny`).
    StoreUnavailable(Box<Decision>),
    /// The request lacks what a limiter or guard counts by (no user for `user_id`).
    MissingIdentity {
        /// The limiter or guard.
        limiter: String,
        /// The dimension it needs.
        dimension: String,
    },
    /// The same submission is still being processed.
    InProgress {
        /// When the lock expires at the latest.
        retry_after: Duration,
        /// The seed's wording: "operation in progress" or "repeated request".
        message: &'static str,
    },
    /// The same submission completed moments ago.
    Repeated {
        /// When the same submission is accepted again.
        retry_after: Duration,
        /// The seed's wording, "repeated request".
        message: &'static str,
    },
    /// An idempotency key reused with another request (method, path, query or body).
    KeyReused,
    /// The `Idempotency-Key` header is required but missing, or malformed.
    BadKey(&'static str),
    /// The request body could not be read.
    BadBody(String),
    /// The request body is larger than the guard buffers.
    PayloadTooLarge {
        /// The cap, in bytes.
        cap: usize,
    },
    /// The store failed where there is no `on_error` answer (duplicate guards).
    Store(StoreError),
    /// A macro-guarded function ran outside a tollgate context: no
    /// [`ContextLayer`](crate::ContextLayer) above the handler, or no
    /// [`Context::scope`](crate::Context::scope) around the call.
    NoContext,
    /// An argument of a `#[prevent_duplicate(by = "args")]` function could not be serialized.
    Fingerprint {
        /// The argument's name.
        argument: String,
        /// What serde said.
        error: String,
    },
}

impl Rejection {
    /// The rejection for a denied decision; `None` if it allows.
    pub fn from_decision(decision: Decision) -> Option<Rejection> {
        (!decision.allowed()).then(|| Rejection::denied(decision))
    }

    /// The rejection for a decision known to deny.
    pub(crate) fn denied(decision: Decision) -> Rejection {
        // Boxed: a decision holds its rules inline, and handlers carry this error in every
        // `Result` they return.
        let reason = decision.reason();
        let decision = Box::new(decision);
        match reason {
            Reason::Blocked => Rejection::Blocked(decision),
            Reason::StoreUnavailable => Rejection::StoreUnavailable(decision),
            _ => Rejection::RateLimited(decision),
        }
    }

    pub(crate) fn from_check_error(error: CheckError) -> Rejection {
        match error {
            CheckError::MissingDimension { limiter, dimension } => {
                Rejection::MissingIdentity { limiter, dimension }
            }
            CheckError::Store(error) => Rejection::Store(error),
            other => Rejection::Store(StoreError::new(
                tollgate::StoreErrorKind::Protocol,
                other.to_string(),
            )),
        }
    }

    /// The HTTP status this rejection answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::RateLimited(_) | Rejection::Repeated { .. } => StatusCode::TOO_MANY_REQUESTS,
            Rejection::Blocked(_) => StatusCode::FORBIDDEN,
            Rejection::StoreUnavailable(_) | Rejection::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::MissingIdentity { dimension, .. } => match dimension.as_str() {
                "user_id" | "user_name" => StatusCode::UNAUTHORIZED,
                // The server was not set up to know peers: not the client's fault.
                "ip" => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::BAD_REQUEST,
            },
            Rejection::InProgress { .. } => StatusCode::CONFLICT,
            Rejection::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::BadKey(_) | Rejection::BadBody(_) => StatusCode::BAD_REQUEST,
            Rejection::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::NoContext | Rejection::Fingerprint { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// How long to wait before trying again, when waiting helps.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::RateLimited(d) | Rejection::Blocked(d) => d.retry_after(),
            Rejection::InProgress { retry_after, .. } | Rejection::Repeated { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// The decision behind a rate-limit rejection.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Rejection::RateLimited(d) | Rejection::Blocked(d) | Rejection::StoreUnavailable(d) => {
                Some(d)
            }
            _ => None,
        }
    }

    /// The machine-readable reason, the `reason` member of the problem body.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::RateLimited(d) | Rejection::Blocked(d) | Rejection::StoreUnavailable(d) => {
                d.reason().as_str()
            }
            Rejection::MissingIdentity { .. } => "missing_identity",
            Rejection::InProgress { .. } => "in_progress",
            Rejection::Repeated { .. } => "repeated",
            Rejection::KeyReused => "idempotency_key_reused",
            Rejection::BadKey(_) => "bad_idempotency_key",
            Rejection::BadBody(_) => "bad_body",
            Rejection::PayloadTooLarge { .. } => "payload_too_large",
            Rejection::Store(_) => "store_unavailable",
            Rejection::NoContext => "no_context",
            Rejection::Fingerprint { .. } => "fingerprint",
        }
    }

    /// The RFC 9457 problem document.
    fn problem(&self) -> Value {
        let status = self.status();
        let mut problem = json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": self.to_string(),
            "reason": self.reason(),
        });
        if let Some(retry_after) = self.retry_after() {
            problem["retry_after"] = json!(ceil_secs(retry_after));
        }
        if let Some(decision) = self.decision().filter(|d| !d.rules().is_empty()) {
            let names = policy_names(decision.rules());
            problem["violated"] = decision
                .rules()
                .iter()
                .zip(names)
                .filter(|(r, _)| !r.allowed)
                .map(|(r, name)| {
                    json!({
                        "policy": name,
                        "limiter": &*r.limiter,
                        "rule": r.rule.to_string(),
                        "remaining": r.remaining,
                        "reset_after": ceil_secs(r.reset_after),
                    })
                })
                .collect();
        }
        problem
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(message) = self.decision().and_then(Decision::message) {
            return f.write_str(message);
        }
        match self {
            Rejection::RateLimited(d) => {
                f.write_str("rate limit exceeded")?;
                for (i, r) in d.denied_rules().enumerate() {
                    let sep = if i == 0 { ": " } else { ", " };
                    write!(f, "{sep}{} {}", r.limiter, r.rule)?;
                }
                Ok(())
            }
            Rejection::Blocked(_) => f.write_str("this client is blocked for a while"),
            Rejection::StoreUnavailable(_) => {
                f.write_str("the rate-limit store is unavailable; try again later")
            }
            Rejection::MissingIdentity { limiter, dimension } => match dimension.as_str() {
                "user_id" | "user_name" => {
                    write!(
                        f,
                        "authentication required ({limiter} counts by {dimension})"
                    )
                }
                "ip" => write!(
                    f,
                    "the client address is unknown ({limiter} counts by ip): serve with \
                     into_make_service_with_connect_info or insert a PeerAddr"
                ),
                _ => write!(
                    f,
                    "the request lacks {dimension}, which {limiter} counts by"
                ),
            },
            Rejection::InProgress { message, .. } | Rejection::Repeated { message, .. } => {
                f.write_str(message)
            }
            Rejection::KeyReused => {
                f.write_str("this Idempotency-Key was already used with a different request")
            }
            Rejection::BadKey(why) => f.write_str(why),
            Rejection::BadBody(why) => write!(f, "the request body could not be read: {why}"),
            Rejection::PayloadTooLarge { cap } => {
                write!(f, "the request body is larger than {cap} bytes")
            }
            Rejection::Store(e) => write!(f, "the duplicate-guard store failed: {e}"),
            Rejection::NoContext => f.write_str(
                "no tollgate context: add tollgate_tower::ContextLayer above this handler, \
                 or call it inside tollgate_tower::Context::scope",
            ),
            Rejection::Fingerprint { argument, error } => {
                write!(f, "cannot fingerprint argument `{argument}`: {error}")
            }
        }
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Rejection::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = self.problem().to_string();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(retry_after) = self.retry_after() {
            insert_retry_after(retry_after, headers);
        }
        if let Rejection::RateLimited(decision) = &self {
            insert_rate_limit_headers(decision, headers);
        }
        response
    }
}
