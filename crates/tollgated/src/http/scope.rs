//! Who may call what: the extractors of the three scopes (see `crate::auth`), a bearer token
//! each.

use std::sync::Arc;

use axum::{
    extract::FromRequestParts,
    http::{HeaderMap, StatusCode, header, request::Parts},
};

use super::error::ApiError;
use crate::{
    app::App,
    auth::{Refusal, Scope},
};

/// Admits only requests carrying `Authorization: Bearer <admin token>`; failed attempts are
/// rate limited per client address (see `admin`).
pub(crate) struct Admin;

/// Admits requests of the check scope (`server.check_token_env`; open without it).
pub(crate) struct CheckCaller;

/// Admits requests of the refund scope (`server.refund_token_env`; open without it).
pub(crate) struct RefundCaller;

impl FromRequestParts<Arc<App>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Admin, ApiError> {
        authorize(parts, app, Scope::Admin).await.map(|()| Admin)
    }
}

impl FromRequestParts<Arc<App>> for CheckCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<App>,
    ) -> Result<CheckCaller, ApiError> {
        // An open scope costs one branch.
        if !app.auth.guarded(Scope::Check) {
            return Ok(CheckCaller);
        }
        authorize(parts, app, Scope::Check)
            .await
            .map(|()| CheckCaller)
    }
}

impl FromRequestParts<Arc<App>> for RefundCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<App>,
    ) -> Result<RefundCaller, ApiError> {
        authorize(parts, app, Scope::Refund)
            .await
            .map(|()| RefundCaller)
    }
}

async fn authorize(parts: &Parts, app: &App, scope: Scope) -> Result<(), ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, m);
    let what = match scope {
        Scope::Check => "check endpoint",
        Scope::Refund => "refund endpoint",
        Scope::Admin => "admin endpoint",
    };
    let client = crate::listen::peer(&parts.extensions).map(|addr| addr.ip());
    let offered = bearer(&parts.headers);
    match app
        .auth
        .authorize(scope, offered, client, parts.uri.path())
        .await
    {
        Ok(()) => Ok(()),
        Err(Refusal::Disabled) => Err(unauthorized(
            "admin endpoints are disabled: set server.admin_token_env to the name of an environment variable holding the token",
        )),
        Err(Refusal::Missing) => Err(unauthorized(&format!(
            "{what}: send Authorization: Bearer <token>"
        ))),
        Err(Refusal::Wrong) => Err(unauthorized(&format!("{what}: wrong token"))),
        Err(Refusal::TooManyFailures(retry_after)) => Err(ApiError {
            retry_after: Some(retry_after),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{what}: too many failed authentications from this address; retry in {}",
                    crate::auth::whole_seconds(retry_after)
                ),
            )
        }),
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    crate::auth::bearer(headers.get(header::AUTHORIZATION)?.to_str().ok()?)
}
