//! Admin endpoints: the admin extractor (a bearer token, see `crate::admin`), counter reset
//! and the blocklist.

use std::{sync::Arc, time::Instant};

use axum::{
    Json,
    extract::{FromRequestParts, Path, Query, State, rejection::QueryRejection},
    http::{HeaderMap, StatusCode, header, request::Parts},
};
use serde_json::Value;
use tollgate::{BanCursor, BanTarget, CheckError};

use super::{
    check::policy,
    error::{ApiError, ApiJson, check_error},
    json::{BanJson, BanRequest, BlocklistPage, BlocklistQuery, ResetRequest, ceil_ms},
};
use crate::{
    admin::{Refusal, Scope},
    app::App,
    config::bounded_duration,
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
        if !app.admin.guarded(Scope::Check) {
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
        .admin
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
                    crate::admin::whole_seconds(retry_after)
                ),
            )
        }),
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

pub(crate) async fn reset(
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

/// The blocklist page size when the request names none, and the largest it may name.
const BLOCKLIST_PAGE: usize = 100;
const BLOCKLIST_PAGE_MAX: usize = 1000;

/// `GET /v1/blocklist?limit=&cursor=`: one page of the live bans, in the order they end.
pub(crate) async fn blocklist(
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

pub(crate) async fn ban(
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

pub(crate) async fn unban(
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
        )
        .with_code("not_banned"))
    }
}
