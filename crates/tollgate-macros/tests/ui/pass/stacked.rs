//! The documented uses compile: stacked limiters with every option, a guard, axum handlers
//! with extractors, methods, custom error types, `?` in the body.

use axum::{Json, Router, extract::State, routing::post};
use serde::{Deserialize, Serialize};
use tollgate_tower::{Rejection, prevent_duplicate, rate_limit};

#[derive(Clone)]
struct AppState;

#[derive(Deserialize, Serialize)]
struct Order {
    item: u32,
}

#[rate_limit(by = "ip", rules = ["1/1m", "10/1h", "60/1d"], blocklist = "10m", message = "slow down")]
#[rate_limit(by = "user_id", rules = ["20/1d"], name = "per_user", algorithm = "gcra")]
#[rate_limit(by = "header:x-api-key", rules = ["5/500ms", "10/m"], scope = "sms_code")]
async fn send_code(State(_state): State<AppState>) -> Result<&'static str, Rejection> {
    Ok("sent")
}

#[prevent_duplicate(by = "args", ttl = "5s", global = false, args = ["order"])]
#[rate_limit(by = "global", rules = "1000/1s; 10000 per minute")]
#[rate_limit(by = "ip", rules = ["100/1m"], ipv6_prefix = 48, ipv4_prefix = 24)]
async fn submit(State(_state): State<AppState>, Json(order): Json<Order>) -> Result<Json<Order>, Rejection> {
    Ok(Json(order))
}

#[derive(Debug)]
enum AppError {
    Refused(Rejection),
    Parse(std::num::ParseIntError),
}

impl From<Rejection> for AppError {
    fn from(r: Rejection) -> AppError {
        AppError::Refused(r)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> AppError {
        AppError::Parse(e)
    }
}

struct Service {
    base: u32,
}

impl Service {
    #[tollgate_tower::rate_limit(by = "arg:tenant", rules = ["3/1s"])]
    #[tollgate_tower::prevent_duplicate(by = "user_name", ttl = "250ms", global = true)]
    async fn add(&self, tenant: u64, text: &str) -> Result<u32, AppError> {
        let _ = tenant;
        Ok(self.base + text.parse::<u32>()?)
    }
}

fn main() {
    let _app: Router = Router::new()
        .route("/sms/code", post(send_code))
        .route("/orders", post(submit))
        .with_state(AppState);
    let service = Service { base: 1 };
    let _future = service.add(7, "2");
    let _ = AppError::Refused(Rejection::NoContext);
    let _ = AppError::Parse("x".parse::<u32>().unwrap_err());
}
