//! The seed's use case as a service: SMS verification codes limited per IP and per user, with
//! a blocklist, idempotent orders, a duplicate-submission guard and an admin bypass.
//!
//! The binary (`src/main.rs`) parses the command line, picks the store (memory, or Redis with
//! `--redis`) and serves [`app`]. See `README.md` for the endpoints and a walk-through with
//! curl.
//!
//! ```no_run
//! use std::{net::SocketAddr, sync::Arc};
//! use tollgate::{AnyStore, MemoryStore, Tollgate};
//!
//! # async fn run() -> std::io::Result<()> {
//! let gate = Arc::new(Tollgate::new(AnyStore::new(MemoryStore::new())));
//! let app = sms_verification::app(gate, sms_verification::Config::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8090").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```
//!
//! # Layout
//! - [`app`]: the router, its layers and the demo authentication.
//! - handlers: `send_code` (`#[rate_limit]` twice), `create_order` (behind a
//!   [`DuplicateLayer`]), `update_profile` (`#[prevent_duplicate]`), `stats` (behind a
//!   [`RateLimitLayer`] with an admin [`Bypass`]).
//! - `ApiError`: the handlers' error, wrapping tollgate's [`Rejection`].

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    extract::{Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::{Value, json};
use tollgate::{AnyStore, Bypass, Dimension, IpNet, Limiter, Policy, Tollgate};
use tollgate_tower::{
    AuthUser, ContextLayer, DuplicateLayer, IdentityResolver, RateLimitLayer, Rejection,
    prevent_duplicate, rate_limit,
};

/// How the service is deployed.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// The reverse proxies whose `X-Forwarded-For` is believed; nobody else's is.
    pub trusted_proxies: Vec<IpNet>,
    /// Names this instance in `/admin/stats`.
    pub instance: String,
}

/// The user the demo "authentication" found.
///
/// DEMO ONLY: it believes the `X-User-Id` header, so any client can claim any user. A real
/// service puts the user its authentication layer verified (a session, a token) here.
#[derive(Clone, Debug)]
pub struct DemoUser(pub String);

impl AuthUser for DemoUser {
    fn user_id(&self) -> Option<String> {
        Some(self.0.clone())
    }
}

async fn demo_auth(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get("x-user-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(|v| DemoUser(v.to_owned()));
    if let Some(user) = user {
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

#[derive(Default)]
struct Counters {
    codes_sent: AtomicU64,
    orders_created: AtomicU64,
    profiles_updated: AtomicU64,
}

#[derive(Clone)]
struct AppState {
    gate: Arc<Tollgate<AnyStore>>,
    counters: Arc<Counters>,
    instance: Arc<str>,
}

/// The service: every endpoint with its guards.
pub fn app(gate: Arc<Tollgate<AnyStore>>, config: Config) -> Router {
    let identity = IdentityResolver::new()
        .trust_proxies(config.trusted_proxies)
        .user::<DemoUser>();
    let orders = DuplicateLayer::idempotency_key(gate.clone(), "orders")
        // If an instance dies mid-order, the key frees itself after this.
        .ttl(Duration::from_secs(30))
        .replay_for(Duration::from_secs(24 * 3600));
    let stats = Policy::builder("admin_stats")
        .limiter(Limiter::new(
            Dimension::Ip,
            ["5/1m".parse().expect("a valid rule")],
        ))
        .bypass(Bypass::new().user_id("admin"))
        .build()
        .expect("a valid policy");
    let state = AppState {
        gate: gate.clone(),
        counters: Arc::default(),
        instance: config.instance.into(),
    };
    Router::new()
        .route("/sms/code", post(send_code))
        .route("/orders", post(create_order).layer(orders))
        .route("/profile", post(update_profile))
        .route(
            "/admin/stats",
            get(stats_handler).layer(RateLimitLayer::new(gate.clone(), stats)),
        )
        .with_state(state)
        .layer(ContextLayer::new(gate, identity))
        // Outermost: the user must be known before the identity is resolved.
        .layer(middleware::from_fn(demo_auth))
}

/// The handlers' error: a refusal by tollgate, or a bad request.
#[derive(Debug)]
pub enum ApiError {
    /// Rate-limited, blocked, duplicate, unauthenticated...: tollgate's own response.
    Refused(Rejection),
    /// The request is malformed.
    BadRequest(&'static str),
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> ApiError {
        ApiError::Refused(rejection)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Refused(rejection) => rejection.into_response(),
            ApiError::BadRequest(why) => {
                (StatusCode::BAD_REQUEST, Json(json!({ "error": why }))).into_response()
            }
        }
    }
}

#[derive(Deserialize)]
struct CodeRequest {
    phone: String,
}

/// The seed's SMS endpoint: per IP 1/1m, 10/1h, 60/1d (a violation bans the IP for 10 min);
/// per user 20/1d. All four rules are one atomic check: a refusal costs no quota.
#[rate_limit(by = "ip", rules = ["1/1m", "10/1h", "60/1d"], blocklist = "10m", scope = "sms_code")]
#[rate_limit(by = "user_id", rules = ["20/1d"], scope = "sms_code", message = "daily code quota used up")]
async fn send_code(
    State(state): State<AppState>,
    Json(request): Json<CodeRequest>,
) -> Result<Json<Value>, ApiError> {
    let digits = request.phone.chars().filter(char::is_ascii_digit).count();
    if !(6..=15).contains(&digits) {
        return Err(ApiError::BadRequest("phone must have 6 to 15 digits"));
    }
    // A real service would hand the code to an SMS gateway here.
    state.counters.codes_sent.fetch_add(1, Ordering::Relaxed);
    Ok(Json(json!({ "sent": true })))
}

/// Creates an order; the [`DuplicateLayer`] in front replays the first response to a repeated
/// `Idempotency-Key`.
async fn create_order(State(state): State<AppState>, Json(order): Json<Value>) -> Response {
    let n = state
        .counters
        .orders_created
        .fetch_add(1, Ordering::Relaxed)
        + 1;
    let order_id = format!("ord-{}-{n}", state.instance);
    (
        StatusCode::CREATED,
        Json(json!({ "order_id": order_id, "order": order })),
    )
        .into_response()
}

/// One profile update per user per 2 s (the seed's `@PreventDuplicateSubmit`).
#[prevent_duplicate(by = "user_id", ttl = "2s")]
async fn update_profile(
    State(state): State<AppState>,
    Json(profile): Json<Value>,
) -> Result<Json<Value>, ApiError> {
    if !profile.is_object() {
        return Err(ApiError::BadRequest("the profile is a JSON object"));
    }
    state
        .counters
        .profiles_updated
        .fetch_add(1, Ordering::Relaxed);
    Ok(Json(json!({ "updated": true })))
}

/// Counters of this instance and the active bans; 5/1m per IP, unlimited for `admin`.
async fn stats_handler(State(state): State<AppState>) -> Json<Value> {
    let bans = match state.gate.blocklist().await {
        Ok(bans) => bans
            .iter()
            .map(|b| {
                json!({
                    "target": b.target.to_string(),
                    "expires_in_s": b.expires_in.as_secs(),
                    "strikes": b.strikes,
                })
            })
            .collect(),
        Err(e) => vec![json!({ "error": e.to_string() })],
    };
    let c = &state.counters;
    Json(json!({
        "instance": &*state.instance,
        "codes_sent": c.codes_sent.load(Ordering::Relaxed),
        "orders_created": c.orders_created.load(Ordering::Relaxed),
        "profiles_updated": c.profiles_updated.load(Ordering::Relaxed),
        "bans": bans,
    }))
}
