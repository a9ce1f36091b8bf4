//! Operations: metrics and health.

use std::{sync::Arc, time::Instant};

use axum::{
    Json,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::Value;

use super::error::ApiError;
use crate::app::App;

pub(crate) async fn metrics(State(app): State<Arc<App>>) -> Response {
    use tollgate::BanStore as _;
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
        app.metrics.exposition().await,
    )
        .into_response()
}

/// `/healthcheck`, as Envoy's reference rate-limit service answers it: `200 OK` while serving;
/// `500` once shutdown has begun (so load balancers stop sending first), or while no Envoy
/// domain is loaded if `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` asked for one. A failing store
/// is not unhealthy: every check still has its `on_error` answer (`/readyz` and the gRPC
/// health service's `tollgate.store` report the store).
pub(crate) async fn healthcheck(State(app): State<Arc<App>>) -> (StatusCode, &'static str) {
    if app.draining() {
        return (StatusCode::INTERNAL_SERVER_ERROR, "shutting down");
    }
    let config = app.config();
    if config.require_domains && config.envoy.is_empty() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "no rate limit configuration loaded",
        );
    }
    (StatusCode::OK, "OK")
}

pub(crate) async fn healthz() -> Json<Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

pub(crate) async fn readyz(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    use tollgate::Store as _;
    let started = Instant::now();
    let result = app.gate.store().ping().await;
    app.metrics
        .store_call("ping", started.elapsed(), result.is_err());
    result.map_err(|e| ApiError::store("ping", &e))?;
    // The store answers now; decisions it could not make lately are reported beside.
    let (decisions, ago) = app.metrics.unavailable();
    let mut ready = serde_json::json!({
        "status": "ready",
        "store_unavailable": {
            "decisions": decisions,
            "last_ms_ago": ago.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        },
    });
    if let Some(persistence) = app.persistence_report() {
        ready["persistence"] = persistence;
    }
    Ok(Json(ready))
}
