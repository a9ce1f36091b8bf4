//! The live dashboard: a page served at `/` (embedded assets, no build step, no CDN), the
//! JSON it polls (`GET /v1/stats`, also for scripts) and the top limited identities
//! (`GET /v1/stats/top`, admin only), read from what the server observed
//! ([`crate::observed`]).
//!
//! Access: the page and `/v1/stats` show aggregates only (decisions per policy and reason,
//! store health, the policies' rules, reload status); they are on when `server.dashboard`
//! says so, by default when the HTTP listener is on a loopback address. Whatever names an
//! identity (the top list, the bans) or changes state (ban, unban) goes through the admin
//! endpoints and their bearer token.
//!
//! # Layout
//! - `handlers`: the page, its assets and the JSON endpoints.

mod handlers;

use std::sync::Arc;

use axum::{Router, routing::get};

use crate::app::App;

/// The dashboard's routes, none when it is off (then `/` and `/v1/stats` answer 404 like
/// any unknown path).
pub(crate) fn routes(app: &App) -> Router<Arc<App>> {
    if !app.observed.enabled {
        return Router::new();
    }
    Router::new()
        .route("/", get(handlers::page))
        .route("/dashboard.js", get(handlers::script))
        .route("/dashboard.css", get(handlers::style))
        .route("/v1/stats", get(handlers::stats))
        .route("/v1/stats/top", get(handlers::top))
}
