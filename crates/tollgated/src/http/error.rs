//! Errors as RFC 9457 problem documents, and the JSON body extractor whose rejections are
//! such documents.

use std::time::Duration;

use axum::{
    Json,
    body::Bytes,
    extract::{FromRequest, Request, rejection::BytesRejection},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::error::Category;
use tollgate::{CheckError, StoreError, StoreErrorKind};

use crate::listen::BodyTimedOut;

/// An error answered with `status` and an `application/problem+json` body:
/// `{"type": "about:blank", "title", "status", "code", "detail": message}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    /// Machine-readable, stable: what went wrong (`unknown_policy`, `malformed_json`, ...).
    pub(crate) code: &'static str,
    pub(crate) message: String,
    /// Sent as `Retry-After` (whole seconds, rounded up).
    pub(crate) retry_after: Option<Duration>,
}

impl ApiError {
    /// An error whose code is the status's own (see [`default_code`]).
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: default_code(status),
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same error with a more precise code.
    pub(crate) fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = code;
        self
    }

    pub(crate) fn store(op: &str, e: &StoreError) -> ApiError {
        // The store's own words name its addresses: they go to the log, not to the caller.
        tracing::warn!(error = %e, op, "store failed");
        let (code, what) = match e.kind() {
            StoreErrorKind::Capacity => (
                "store_full",
                "the store's budget for this kind of entry is full; retry later",
            ),
            StoreErrorKind::Timeout => ("store_unavailable", "the store timed out"),
            StoreErrorKind::NotReplicated => (
                "store_unavailable",
                "the store's replicas did not acknowledge the writes in time",
            ),
            _ => ("store_unavailable", "the store is unavailable"),
        };
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{what} (the server's log has the details)"),
        )
        .with_code(code)
    }

    /// The problem document's members.
    pub(crate) fn problem(&self) -> Problem<'_> {
        Problem {
            kind: "about:blank",
            title: self.status.canonical_reason().unwrap_or("Error"),
            status: self.status.as_u16(),
            code: self.code,
            detail: &self.message,
        }
    }
}

/// An RFC 9457 problem document with a machine-readable `code`.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    code: &'static str,
    detail: &'a str,
}

/// The code of an error that names none: the status, in words.
fn default_code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "bad_request",
        401 => "unauthorized",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "request_timeout",
        413 => "payload_too_large",
        415 => "unsupported_media_type",
        422 => "invalid_request",
        429 => "too_many_requests",
        503 => "store_unavailable",
        _ => "internal_error",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.problem())).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
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

pub(crate) fn check_error(e: CheckError) -> ApiError {
    match e {
        e @ CheckError::MissingDimension { .. } => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
                .with_code("missing_dimension")
        }
        CheckError::Store(e) => ApiError::store("check", &e),
        e @ CheckError::ResponseTooLarge { .. } => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string())
        }
        other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
    }
}

/// A JSON body parsed into `T`, whose rejections are problem documents: 400 for malformed
/// JSON, 415 without a JSON content type, 422 for JSON of the wrong shape (naming the field).
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let JsonBody(bytes) = JsonBody::from_request(req, state).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// The bytes of a JSON body, read whole, for handlers that parse it with [`parse_json`] into
/// types that borrow from it. Rejected as [`ApiJson`] is: 415 without a JSON content type
/// (`application/json` or `application/*+json`), the body's own errors (too large, too slow).
pub(crate) struct JsonBody(pub(crate) Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "expected a JSON body with Content-Type: application/json",
            ));
        }
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(JsonBody(bytes)),
            Err(rejection) => Err(body_rejection(&rejection)),
        }
    }
}

/// Parses a whole JSON body: 400 `malformed JSON: ...` for bad syntax or trailing bytes, 422
/// `invalid request: <field>: ...` for JSON of the wrong shape.
pub(crate) fn parse_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    // Tracking the path costs an allocation per field: it is done only to name a bad field.
    serde_json::from_slice(bytes).map_err(|e| json_error::<T>(bytes, &e))
}

/// The error of a body that did not parse (`first`), naming where it went wrong.
#[cold]
fn json_error<'a, T: Deserialize<'a>>(bytes: &'a [u8], first: &serde_json::Error) -> ApiError {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut deserializer) {
        Err(e) if e.inner().classify() == Category::Data => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid request: {e}"),
        ),
        Err(e) => ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}"))
            .with_code("malformed_json"),
        // Only trailing bytes are left to fail.
        Ok(_) => {
            let e = deserializer.end().err();
            let e = e.as_ref().unwrap_or(first);
            ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}"))
                .with_code("malformed_json")
        }
    }
}

/// Whether the request says its body is JSON: `application/json`, or any `application/*+json`.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    // What nearly every client sends, without parsing it.
    if value.as_bytes() == b"application/json" {
        return true;
    }
    value
        .to_str()
        .ok()
        .and_then(|v| v.parse::<mime::Mime>().ok())
        .is_some_and(|mime| {
            mime.type_() == "application"
                && (mime.subtype() == "json" || mime.suffix().is_some_and(|s| s == "json"))
        })
}

fn body_rejection(rejection: &BytesRejection) -> ApiError {
    // A body that did not arrive in time is the client's slowness, not a malformed body.
    let mut source = std::error::Error::source(rejection);
    while let Some(e) = source {
        if let Some(timed_out) = e.downcast_ref::<BodyTimedOut>() {
            return ApiError::new(StatusCode::REQUEST_TIMEOUT, timed_out.to_string());
        }
        source = e.source();
    }
    ApiError::new(rejection.status(), rejection.body_text())
}

/// Whole seconds, rounded up (`Retry-After`).
fn ceil_secs(d: Duration) -> u64 {
    d.as_nanos()
        .div_ceil(1_000_000_000)
        .try_into()
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(60)), 60);
        assert_eq!(ceil_secs(Duration::from_millis(60_001)), 61);
    }
}
