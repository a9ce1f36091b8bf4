//! Errors as JSON bodies, and the JSON body extractor whose rejections are such bodies.

use std::time::Duration;

use axum::{
    Json,
    extract::{FromRequest, Request, rejection::JsonRejection},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::de::DeserializeOwned;
use tollgate::{CheckError, StoreError};

use crate::listen::BodyTimedOut;

/// An error answered as `{"error": message}` with `status`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// Sent as `Retry-After` (whole seconds, rounded up).
    pub(crate) retry_after: Option<Duration>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn store(op: &str, e: &StoreError) -> ApiError {
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

pub(crate) fn check_error(e: CheckError) -> ApiError {
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

/// `axum::Json` whose rejections are `{"error": ...}` bodies: 400 for malformed JSON, 415
/// without a JSON content type, 422 for JSON of the wrong shape (naming the field).
pub(crate) struct ApiJson<T>(pub(crate) T);

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
