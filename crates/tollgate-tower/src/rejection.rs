//! Why a request was turned away, and the HTTP response that says so.

use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use serde_json::{Value, json};
use tollgate::{CheckError, Decision, NamedDecision, Policy, Reason, RuleDecision, StoreError};

use crate::{
    body::{BoxError, LayerBody},
    headers::{
        HeaderStyle, RateLimitRefusal, ceil_secs, insert_fields, insert_retry_after, policy_names,
    },
};

/// Builds the response for a rejection, in place of the default (`on_rejection` of the
/// layers), its body boxed.
pub(crate) type OnRejection =
    Arc<dyn Fn(Rejection) -> Response<UnsyncBoxBody<Bytes, BoxError>> + Send + Sync>;

/// Boxes `f`'s bodies.
pub(crate) fn on_rejection<F, B>(f: F) -> OnRejection
where
    F: Fn(Rejection) -> Response<B> + Send + Sync + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Arc::new(move |rejection| f(rejection).map(|body| body.map_err(Into::into).boxed_unsync()))
}

/// The problem type of a request refused for exceeding a quota
/// (draft-ietf-httpapi-ratelimit-headers-11).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A request turned away by a rate limit or a duplicate guard, or one that could not be
/// checked. It converts into the HTTP response ([`into_http_response`](Self::into_http_response),
/// or axum's `IntoResponse`): a status, `Retry-After` where waiting helps, `RateLimit-Policy` /
/// `RateLimit` fields for rate limits, and an RFC 9457 `application/problem+json` body; or,
/// for a gRPC request, into a gRPC status ([`into_grpc_response`](Self::into_grpc_response),
/// or `tonic::Status` with the `tonic` feature).
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
///
/// ```
/// use tollgate_tower::Rejection;
///
/// enum AppError {
///     Limited(Rejection),
///     NotFound,
/// }
///
/// impl From<Rejection> for AppError {
///     fn from(rejection: Rejection) -> AppError {
///         AppError::Limited(rejection)
///     }
/// }
///
/// impl AppError {
///     fn into_response(self) -> http::Response<http_body_util::Full<bytes::Bytes>> {
///         match self {
///             AppError::Limited(rejection) => rejection.into_http_response(),
///             AppError::NotFound => http::Response::builder().status(404).body(Default::default()).unwrap(),
///         }
///     }
/// }
///
/// let response = AppError::from(Rejection::KeyReused).into_response();
/// assert_eq!(response.status(), 422);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// A rule denied the request (reason `rate_limited`, or `cost_exceeds_limit`).
    RateLimited(Box<NamedDecision>),
    /// The client is on the blocklist.
    Blocked(Box<NamedDecision>),
    /// The store failed and the policy fails closed (`on_error = deny`).
    StoreUnavailable(Box<NamedDecision>),
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

/// A request without the client's address is the server's set-up, not the client's doing,
/// and only the client sees its 500: the first one is logged, once per process.
#[cold]
fn missing_address() {
    static LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::error!(
            "a rate limit by IP found no client address, so every such request is answered 500: \
             serve axum with `into_make_service_with_connect_info::<SocketAddr>()`, insert \
             `tollgate_tower::PeerAddr` in a hyper stack, or enable the `tonic` feature \
             (logged once)"
        );
    }
}

impl Rejection {
    /// The rejection for a denied decision; `None` if it allows.
    pub fn from_decision(decision: Decision, policy: &Policy) -> Option<Rejection> {
        (!decision.allowed()).then(|| Rejection::denied(decision, policy))
    }

    /// The rejection for a decision known to deny.
    pub(crate) fn denied(decision: Decision, policy: &Policy) -> Rejection {
        // Boxed: a decision holds its rules inline, and handlers carry this error in every
        // `Result` they return. Named: the rejection's body and headers name its rules.
        let reason = decision.reason();
        let decision = Box::new(decision.named(policy));
        match reason {
            Reason::Blocked => Rejection::Blocked(decision),
            Reason::StoreUnavailable => Rejection::StoreUnavailable(decision),
            _ => Rejection::RateLimited(decision),
        }
    }

    pub(crate) fn from_check_error(error: CheckError) -> Rejection {
        match error {
            CheckError::MissingDimension { limiter, dimension } => {
                if dimension == "ip" {
                    missing_address();
                }
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
    pub fn decision(&self) -> Option<&NamedDecision> {
        match self {
            Rejection::RateLimited(d) | Rejection::Blocked(d) | Rejection::StoreUnavailable(d) => {
                Some(d)
            }
            _ => None,
        }
    }

    /// The machine-readable code, the `code` member of the problem body (as in the server's
    /// problem documents): the decision's reason for a refusal (`rate_limited`, `blocked`,
    /// ...), else what went wrong (`idempotency_key_reused`, `missing_identity`, ...).
    pub fn code(&self) -> &'static str {
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

    /// What the client is told: the [`Display`](std::fmt::Display) text, but for a store
    /// failure, whose detail (addresses, the store's own words) stays with the application.
    fn client_detail(&self) -> String {
        match self {
            Rejection::Store(_) => "the duplicate-guard store is unavailable".to_owned(),
            other => other.to_string(),
        }
    }

    /// The RFC 9457 problem document: `type` (the draft's [`QUOTA_EXCEEDED`] for a rate
    /// limit, `about:blank` otherwise), `title`, `status`, `detail`, `code`; `retry_after`
    /// (seconds) where waiting helps; for a rate limit, `violated-policies` (the names of the
    /// `RateLimit-Policy` items that denied) and `violated` (each with its limiter, rule,
    /// remaining units and seconds to reset).
    ///
    /// ```
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
    /// use tollgate_tower::Rejection;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let policy = Policy::builder("sms")
    ///     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?]))
    ///     .build()?;
    /// let who = Identity::new().with_ip("192.0.2.1".parse()?);
    /// gate.check(&policy, &who, 1).await?;
    /// let rejection = Rejection::from_decision(gate.check(&policy, &who, 1).await?, &policy).unwrap();
    ///
    /// let problem = rejection.problem();
    /// assert_eq!(problem["type"], tollgate_tower::QUOTA_EXCEEDED);
    /// assert_eq!(problem["violated-policies"], serde_json::json!(["ip-1m"]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn problem(&self) -> Value {
        let status = self.status();
        let kind = match self {
            Rejection::RateLimited(_) => QUOTA_EXCEEDED,
            _ => "about:blank",
        };
        let mut problem = json!({
            "type": kind,
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": self.client_detail(),
            "code": self.code(),
        });
        if let Some(retry_after) = self.retry_after() {
            problem["retry_after"] = json!(ceil_secs(retry_after));
        }
        if let Some(decision) = self.decision().filter(|d| !d.rules().is_empty()) {
            // Shadow rules deny nothing, and the fields leave them out.
            let enforced: Vec<RuleDecision> = decision
                .rules()
                .iter()
                .filter(|r| !r.shadow)
                .cloned()
                .collect();
            let names = policy_names(&enforced);
            let violated: Vec<_> = enforced
                .iter()
                .zip(names)
                .filter(|(r, _)| !r.allowed)
                .collect();
            problem["violated-policies"] = violated.iter().map(|(_, name)| json!(name)).collect();
            problem["violated"] = violated
                .iter()
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

    /// The gRPC status code this rejection answers a gRPC request with: `RESOURCE_EXHAUSTED`
    /// (8) for a rate limit, a repeat or a body too large, `PERMISSION_DENIED` (7) when
    /// blocked, `UNAVAILABLE` (14) when the store failed, `UNAUTHENTICATED` (16) without a
    /// user, `ABORTED` (10) while the same submission is in progress, `INVALID_ARGUMENT` (3)
    /// for a bad request, `INTERNAL` (13) for a server that was set up wrong.
    pub fn grpc_code(&self) -> i32 {
        match self.status() {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::PAYLOAD_TOO_LARGE => 8,
            StatusCode::FORBIDDEN => 7,
            StatusCode::SERVICE_UNAVAILABLE => 14,
            StatusCode::UNAUTHORIZED => 16,
            StatusCode::CONFLICT => 10,
            StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => 3,
            _ => 13,
        }
    }

    /// The HTTP response: the [`status`](Self::status), `Retry-After` where waiting helps, the
    /// draft `RateLimit-Policy` / `RateLimit` fields of a rate limit, and the
    /// [`problem`](Self::problem) as an `application/problem+json` body. Inside a
    /// [`ContextLayer`](crate::ContextLayer) with another
    /// [header style](crate::ContextLayer::header_style), that style's fields instead. (With
    /// the `axum` feature, `IntoResponse` answers the same.)
    pub fn into_http_response(self) -> Response<Full<Bytes>> {
        let style = crate::Context::try_with(|c| c.style).unwrap_or_default();
        self.respond(style, None).map(Full::new)
    }

    /// The answer to a gRPC request, trailers-only: HTTP 200 with `grpc-status` (the
    /// [`grpc_code`](Self::grpc_code)) and `grpc-message`, and as metadata `retry-after`
    /// (seconds), `grpc-retry-pushback-ms` (the delay gRPC clients' retry policies obey) and the
    /// draft's rate-limit fields.
    ///
    /// ```
    /// use tollgate_tower::Rejection;
    ///
    /// let response = Rejection::KeyReused.into_grpc_response();
    /// assert_eq!(response.status(), 200);
    /// assert_eq!(response.headers()["grpc-status"], "3");
    /// ```
    pub fn into_grpc_response(self) -> Response<Full<Bytes>> {
        self.respond(HeaderStyle::Draft, Some(&GRPC)).map(Full::new)
    }

    /// The response in `style`; for a gRPC request when `grpc`, its content type (the request's
    /// own: `application/grpc`, or gRPC-Web's, whose clients refuse an answer of another type).
    pub(crate) fn respond(self, style: HeaderStyle, grpc: Option<&HeaderValue>) -> Response<Bytes> {
        let mut response = Response::new(Bytes::new());
        if matches!(self, Rejection::RateLimited(_)) {
            response.extensions_mut().insert(RateLimitRefusal);
        }
        let headers = response.headers_mut();
        if let Some(retry_after) = self.retry_after() {
            insert_retry_after(retry_after, headers);
            if grpc.is_some() {
                // Rounded up: never sooner than the wait.
                let ms = u64::try_from(retry_after.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
                headers.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
            }
        }
        if let Rejection::RateLimited(decision) = &self {
            insert_fields(
                style.for_answer(false),
                &decision.rules(),
                decision.retry_after(),
                headers,
            );
        }
        if let Some(content_type) = grpc {
            headers.insert(header::CONTENT_TYPE, content_type.clone());
            headers.insert("grpc-status", HeaderValue::from(self.grpc_code()));
            let message = grpc_message(&self.client_detail());
            if let Ok(value) = HeaderValue::from_str(&message) {
                headers.insert("grpc-message", value);
            }
            return response;
        }
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        *response.status_mut() = self.status();
        *response.body_mut() = Bytes::from(self.problem().to_string());
        response
    }

    /// The layers' answer: `custom`'s if set, else [`respond`](Self::respond)'s.
    pub(crate) fn answer<B: LayerBody>(
        self,
        custom: Option<&OnRejection>,
        style: HeaderStyle,
        grpc: Option<&HeaderValue>,
    ) -> Response<B> {
        match custom {
            Some(f) => f(self).map(B::boxed),
            None => self.respond(style, grpc).map(B::full),
        }
    }
}

/// gRPC's own content type.
const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// The content type of `headers` when they are a gRPC (or gRPC-Web) request's.
pub(crate) fn grpc_type(headers: &HeaderMap) -> Option<&HeaderValue> {
    headers
        .get(header::CONTENT_TYPE)
        .filter(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A `grpc-message` value: UTF-8, percent-encoded outside printable ASCII and for `%`.
fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b' '..=b'~' if byte != b'%' => out.push(char::from(byte)),
            _ => {
                use fmt::Write;
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(message) = self.decision().and_then(|d| d.message()) {
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

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Rejection {
    /// The response of [`into_http_response`](Rejection::into_http_response).
    fn into_response(self) -> axum::response::Response {
        self.into_http_response().map(axum::body::Body::new)
    }
}

#[cfg(feature = "tonic")]
impl From<Rejection> for tonic::Status {
    /// The status of [`into_grpc_response`](Rejection::into_grpc_response): its code, its
    /// message, and its metadata (`retry-after`, `grpc-retry-pushback-ms`, rate-limit fields).
    fn from(rejection: Rejection) -> tonic::Status {
        let code = tonic::Code::from(rejection.grpc_code());
        let message = rejection.to_string();
        let mut headers = rejection
            .respond(HeaderStyle::Draft, Some(&GRPC))
            .into_parts()
            .0
            .headers;
        for name in ["grpc-status", "grpc-message", "content-type"] {
            headers.remove(name);
        }
        let metadata = tonic::metadata::MetadataMap::from_headers(headers);
        tonic::Status::with_metadata(code, message, metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_message("a b"), "a b");
        assert_eq!(grpc_message("100% é"), "100%25 %C3%A9");
    }

    #[test]
    fn grpc_answers_are_trailers_only() {
        let response = Rejection::InProgress {
            retry_after: std::time::Duration::from_millis(1500),
            message: "operation in progress",
        }
        .respond(HeaderStyle::Draft, Some(&GRPC));
        assert_eq!(response.status(), 200);
        assert!(response.body().is_empty());
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], "10");
        assert_eq!(headers["grpc-message"], "operation in progress");
        assert_eq!(headers["grpc-retry-pushback-ms"], "1500");
        assert_eq!(headers["retry-after"], "2");
        // Rounded up, never sooner than the wait.
        let response = Rejection::InProgress {
            retry_after: std::time::Duration::from_micros(1_500_001),
            message: "operation in progress",
        }
        .respond(HeaderStyle::Draft, Some(&GRPC));
        assert_eq!(response.headers()["grpc-retry-pushback-ms"], "1501");
    }
}
