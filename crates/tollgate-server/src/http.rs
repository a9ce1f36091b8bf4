//! The HTTP/JSON API: check, peek, reset, duplicate guard, blocklist, metrics and health.
//!
//! Every 4xx (and 5xx) body is `{"error": "..."}` saying what is wrong.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{
        FromRequest, FromRequestParts, Path, Query, Request, State,
        rejection::{JsonRejection, QueryRejection},
    },
    http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;
use tollgate::{
    Acquire, BanCursor, BanTarget, CheckError, Decision, DuplicateState, Fingerprint, Identity,
    Lease, Reason, StoreError,
};

use crate::{
    admin::Refusal,
    app::App,
    config::{PolicyEntry, bounded_duration},
    listen::BodyTimedOut,
};

/// The API's routes over `app`.
pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/peek", post(peek))
        .route("/v1/reset", post(reset))
        .route("/v1/duplicate/acquire", post(acquire))
        .route("/v1/duplicate/release", post(release))
        .route("/v1/duplicate/complete", post(complete))
        .route("/v1/blocklist", get(blocklist).post(ban))
        .route("/v1/blocklist/{kind}/{value}", delete(unban))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
}

/// An error answered as `{"error": message}` with `status`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    /// Sent as `Retry-After` (whole seconds, rounded up).
    retry_after: Option<Duration>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    fn store(op: &str, e: &StoreError) -> ApiError {
        tracing::warn!(error = %e, op, "store failed");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(retry_after) = self.retry_after {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(ceil_secs(retry_after)),
            );
        }
        response
    }
}

fn check_error(e: CheckError) -> ApiError {
    match e {
        e @ CheckError::MissingDimension { .. } => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        CheckError::Store(e) => ApiError::store("check", &e),
        e @ CheckError::ResponseTooLarge { .. } => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string())
        }
        other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint; see docs/api.md")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint; see docs/api.md",
    )
}

/// `axum::Json` whose rejections are `{"error": ...}` bodies: 400 for malformed JSON, 415
/// without a JSON content type, 422 for JSON of the wrong shape (naming the field).
struct ApiJson<T>(T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(&rejection)),
        }
    }
}

fn json_rejection(rejection: &JsonRejection) -> ApiError {
    // A body that did not arrive in time is the client's slowness, not a malformed body.
    let mut source = std::error::Error::source(rejection);
    while let Some(e) = source {
        if let Some(timed_out) = e.downcast_ref::<BodyTimedOut>() {
            return ApiError::new(StatusCode::REQUEST_TIMEOUT, timed_out.to_string());
        }
        source = e.source();
    }
    let text = rejection.body_text();
    let message = match rejection {
        JsonRejection::JsonDataError(_) => text
            .strip_prefix("Failed to deserialize the JSON body into the target type: ")
            .map_or_else(|| text.clone(), |m| format!("invalid request: {m}")),
        JsonRejection::JsonSyntaxError(_) => text
            .strip_prefix("Failed to parse the request body as JSON: ")
            .map_or_else(|| text.clone(), |m| format!("malformed JSON: {m}")),
        JsonRejection::MissingJsonContentType(_) => {
            "expected a JSON body with Content-Type: application/json".to_owned()
        }
        _ => text,
    };
    ApiError::new(rejection.status(), message)
}

/// Admits only requests carrying `Authorization: Bearer <admin token>`; failed attempts are
/// rate limited per client address (see `admin`).
struct Admin;

impl FromRequestParts<Arc<App>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Admin, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, m);
        let client = crate::listen::peer(&parts.extensions).map(|addr| addr.ip());
        let offered = bearer(&parts.headers);
        match app
            .admin
            .authenticate(offered, client, parts.uri.path())
            .await
        {
            Ok(()) => Ok(Admin),
            Err(Refusal::Disabled) => Err(unauthorized(
                "admin endpoints are disabled: set server.admin_token_env to the name of an environment variable holding the token",
            )),
            Err(Refusal::Missing) => Err(unauthorized(
                "admin endpoint: send Authorization: Bearer <token>",
            )),
            Err(Refusal::Wrong) => Err(unauthorized("admin endpoint: wrong token")),
            Err(Refusal::TooManyFailures(retry_after)) => Err(ApiError {
                retry_after: Some(retry_after),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "admin endpoint: too many failed authentications from this address; retry in {}",
                        crate::admin::whole_seconds(retry_after)
                    ),
                )
            }),
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whole seconds, rounded up (`Retry-After`).
fn ceil_secs(d: Duration) -> u64 {
    d.as_nanos()
        .div_ceil(1_000_000_000)
        .try_into()
        .unwrap_or(u64::MAX)
}

/// The request's identity as JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityJson {
    ip: Option<IpAddr>,
    user_id: Option<String>,
    user_name: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    args: BTreeMap<String, String>,
}

impl IdentityJson {
    fn into_identity(self) -> Identity {
        let mut identity = Identity::new();
        if let Some(ip) = self.ip {
            identity = identity.with_ip(ip);
        }
        if let Some(id) = self.user_id {
            identity = identity.with_user_id(id);
        }
        if let Some(name) = self.user_name {
            identity = identity.with_user_name(name);
        }
        for (name, value) in self.headers {
            identity = identity.with_header(name, value);
        }
        for (name, value) in self.args {
            identity = identity.with_arg(name, value);
        }
        identity
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    policy: String,
    #[serde(default)]
    identity: IdentityJson,
    cost: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetRequest {
    policy: String,
    #[serde(default)]
    identity: IdentityJson,
}

#[derive(Debug, Serialize)]
struct DecisionJson {
    allowed: bool,
    reason: Reason,
    retry_after_ms: Option<u64>,
    message: Option<String>,
    rules: Vec<RuleJson>,
}

#[derive(Debug, Serialize)]
struct RuleJson {
    limiter: String,
    rule: String,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
}

/// Whole milliseconds, rounded up: waiting the answer is always long enough.
fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_micros().div_ceil(1000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl From<&Decision> for DecisionJson {
    fn from(d: &Decision) -> DecisionJson {
        DecisionJson {
            allowed: d.allowed(),
            reason: d.reason(),
            retry_after_ms: d.retry_after().map(ceil_ms),
            message: d.message().map(str::to_owned),
            rules: d
                .rules()
                .iter()
                .map(|r| RuleJson {
                    limiter: r.limiter.to_string(),
                    rule: r.rule.to_string(),
                    limit: r.rule.limit(),
                    remaining: r.remaining,
                    reset_after_ms: ceil_ms(r.reset_after),
                })
                .collect(),
        }
    }
}

fn policy(app: &App, name: &str) -> Result<PolicyEntry, ApiError> {
    app.config()
        .policies
        .get(name)
        .cloned()
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("unknown policy {name:?}")))
}

async fn check(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<CheckRequest>,
) -> Result<Json<DecisionJson>, ApiError> {
    let entry = policy(&app, &req.policy)?;
    let identity = req.identity.into_identity();
    let started = Instant::now();
    let decision = app
        .gate
        .check(&entry.policy, &identity, req.cost.unwrap_or(1))
        .await
        .map_err(check_error)?;
    app.record(
        "check",
        &req.policy,
        decision.reason(),
        decision.allowed(),
        started,
    );
    Ok(Json(DecisionJson::from(&decision)))
}

async fn peek(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<CheckRequest>,
) -> Result<Json<DecisionJson>, ApiError> {
    let entry = policy(&app, &req.policy)?;
    let identity = req.identity.into_identity();
    let started = Instant::now();
    let decision = app
        .gate
        .peek(&entry.policy, &identity, req.cost.unwrap_or(1))
        .await
        .map_err(check_error)?;
    app.metrics.store_call(
        "peek",
        started.elapsed(),
        decision.reason() == Reason::StoreUnavailable,
    );
    Ok(Json(DecisionJson::from(&decision)))
}

async fn reset(
    State(app): State<Arc<App>>,
    _: Admin,
    ApiJson(req): ApiJson<ResetRequest>,
) -> Result<Json<Value>, ApiError> {
    let entry = policy(&app, &req.policy)?;
    let identity = req.identity.into_identity();
    let started = Instant::now();
    let result = app.gate.reset(&entry.policy, &identity).await;
    app.metrics.store_call(
        "reset",
        started.elapsed(),
        matches!(result, Err(CheckError::Store(_))),
    );
    result.map_err(check_error)?;
    tracing::info!(policy = %req.policy, "counters reset by admin");
    Ok(Json(serde_json::json!({ "reset": true })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireRequest {
    policy: String,
    #[serde(default)]
    identity: IdentityJson,
    #[serde(default)]
    args: Value,
}

#[derive(Debug, Serialize)]
struct AcquireJson {
    acquired: bool,
    lease: Option<String>,
    state: Option<DuplicateState>,
    retry_after_ms: u64,
    message: Option<&'static str>,
    /// Whether the first submission had the same `args` (false: a reused key with others).
    same_args: Option<bool>,
    /// The first submission's response, stored by `/v1/duplicate/complete`.
    response: Option<Value>,
}

/// JSON with object keys sorted at every depth, so `{"a":1,"b":2}` and `{"b":2,"a":1}` are
/// one submission whatever map type serde_json was built with.
fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

async fn acquire(
    State(app): State<Arc<App>>,
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
    })?;
    let identity = req.identity.into_identity();
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
            response: dup.response.as_deref().map(|bytes| {
                serde_json::from_slice(bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
            }),
        },
    };
    Ok(Json(body))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteRequest {
    lease: String,
    #[serde(default)]
    response: Value,
    keep_for: Option<String>,
}

async fn complete(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<CompleteRequest>,
) -> Result<Json<Value>, ApiError> {
    let lease: Lease = req
        .lease
        .parse()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed lease: {e}")))?;
    let keep_for = match &req.keep_for {
        Some(text) => bounded_duration(text)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "keep_for {text:?}: expected e.g. \"1m\" (units ms, s, m, h, d; at most 3650d)"
                    ),
                )
            })?,
        None => Duration::from_secs(60),
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseRequest {
    lease: String,
}

async fn release(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<ReleaseRequest>,
) -> Result<Json<Value>, ApiError> {
    let lease: Lease = req
        .lease
        .parse()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed lease: {e}")))?;
    let started = Instant::now();
    let result = app.gate.release(&lease).await;
    app.metrics
        .store_call("release", started.elapsed(), result.is_err());
    let released = result.map_err(|e| ApiError::store("release", &e))?;
    Ok(Json(serde_json::json!({ "released": released })))
}

#[derive(Debug, Serialize)]
struct BanJson {
    kind: &'static str,
    value: String,
    expires_in_ms: u64,
    strikes: u32,
}

/// The blocklist page size when the request names none, and the largest it may name.
const BLOCKLIST_PAGE: usize = 100;
const BLOCKLIST_PAGE_MAX: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlocklistQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

#[derive(Debug, Serialize)]
struct BlocklistPage {
    bans: Vec<BanJson>,
    /// Pass as `cursor` for the next page; `null` after the last one.
    next_cursor: Option<String>,
}

/// `GET /v1/blocklist?limit=&cursor=`: one page of the live bans, in the order they end.
async fn blocklist(
    State(app): State<Arc<App>>,
    _: Admin,
    query: Result<Query<BlocklistQuery>, QueryRejection>,
) -> Result<Json<BlocklistPage>, ApiError> {
    use tollgate::Store as _;
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let limit = match query.limit.as_deref() {
        None => BLOCKLIST_PAGE,
        Some(text) => text
            .parse()
            .ok()
            .filter(|n| (1..=BLOCKLIST_PAGE_MAX).contains(n))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("limit {text:?}: expected a number from 1 to {BLOCKLIST_PAGE_MAX}"),
                )
            })?,
    };
    let after = query
        .cursor
        .as_deref()
        .map(str::parse::<BanCursor>)
        .transpose()
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("cursor: {e} (pass next_cursor of the previous page)"),
            )
        })?;
    let started = Instant::now();
    let result = app
        .gate
        .store()
        .bans_page(app.gate.prefix(), after.as_ref(), limit)
        .await;
    app.metrics
        .store_call("blocklist", started.elapsed(), result.is_err());
    let page = result.map_err(|e| ApiError::store("blocklist", &e))?;
    Ok(Json(BlocklistPage {
        bans: page
            .bans
            .into_iter()
            .map(|b| BanJson {
                kind: b.target.kind(),
                value: b.target.value(),
                expires_in_ms: ceil_ms(b.expires_in),
                strikes: b.strikes,
            })
            .collect(),
        next_cursor: page.next.map(|c| c.to_string()),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BanRequest {
    kind: String,
    value: String,
    duration: String,
}

async fn ban(
    State(app): State<Arc<App>>,
    _: Admin,
    ApiJson(req): ApiJson<BanRequest>,
) -> Result<Json<Value>, ApiError> {
    let target = BanTarget::parse(&req.kind, &req.value)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    let duration = bounded_duration(&req.duration)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "duration {:?}: expected e.g. \"10m\" (units ms, s, m, h, d; at most 3650d)",
                    req.duration
                ),
            )
        })?;
    let started = Instant::now();
    let result = app.gate.ban(&target, duration).await;
    app.metrics
        .store_call("ban", started.elapsed(), result.is_err());
    result.map_err(|e| ApiError::store("ban", &e))?;
    tracing::info!(%target, "banned by admin");
    Ok(Json(serde_json::json!({ "banned": true })))
}

async fn unban(
    State(app): State<Arc<App>>,
    _: Admin,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((kind, value)) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let target =
        BanTarget::parse(&kind, &value).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    let started = Instant::now();
    let result = app.gate.unban(&target).await;
    app.metrics
        .store_call("unban", started.elapsed(), result.is_err());
    if result.map_err(|e| ApiError::store("unban", &e))? {
        tracing::info!(%target, "unbanned by admin");
        Ok(Json(serde_json::json!({ "removed": true })))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("{kind} {value:?} is not on the blocklist"),
        ))
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    use tollgate::Store as _;
    app.metrics
        .refresh_blocklist_size(|| async {
            let started = Instant::now();
            let result = app.gate.store().ban_count(app.gate.prefix()).await;
            app.metrics
                .store_call("ban_count", started.elapsed(), result.is_err());
            result
        })
        .await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.render(),
    )
        .into_response()
}

async fn healthz() -> Json<Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

async fn readyz(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    use tollgate::Store as _;
    let started = Instant::now();
    let result = app.gate.store().ping().await;
    app.metrics
        .store_call("ping", started.elapsed(), result.is_err());
    result.map_err(|e| ApiError::store("ping", &e))?;
    Ok(Json(serde_json::json!({ "status": "ready" })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a: Value = serde_json::from_str(r#"{"b":[{"y":1,"x":2}],"a":"s"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":"s","b":[{"x":2,"y":1}]}"#).unwrap();
        let (mut ca, mut cb) = (String::new(), String::new());
        canonical_json(&a, &mut ca);
        canonical_json(&b, &mut cb);
        assert_eq!(ca, cb);
        assert_eq!(ca, r#"{"a":"s","b":[{"x":2,"y":1}]}"#);
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(60)), 60);
        assert_eq!(ceil_secs(Duration::from_millis(60_001)), 61);
    }

    #[test]
    fn milliseconds_round_up() {
        assert_eq!(ceil_ms(Duration::from_micros(1)), 1);
        assert_eq!(ceil_ms(Duration::from_millis(60_000)), 60_000);
        assert_eq!(ceil_ms(Duration::ZERO), 0);
    }
}
