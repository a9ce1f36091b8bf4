//! The business options compile: a cost from the arguments, settled at what the result says,
//! with overrides, warnings and soft rules, on a plain function and an axum handler.

use axum::{Json, Router, routing::post};
use serde::Deserialize;
use tollgate_tower::{Rejection, rate_limit};

#[derive(Deserialize)]
struct Prompt {
    max_tokens: u64,
}

fn tokens_used(result: &Result<Json<u64>, Rejection>) -> Option<u64> {
    result.as_ref().ok().map(|Json(used)| *used)
}

#[rate_limit(
    by = "user_id",
    rules = ["100000/1d"],
    algorithm = "gcra",
    overrides = true,
    warn_at = 0.8,
    soft = ["50000/1h"],
    cost = "prompt.max_tokens",
    settle = "tokens_used"
)]
async fn complete(Json(prompt): Json<Prompt>) -> Result<Json<u64>, Rejection> {
    Ok(Json(prompt.max_tokens / 2))
}

#[rate_limit(by = "ip", rules = ["10/1m"], cost = "rows.len() as u64")]
#[rate_limit(by = "user_id", rules = ["5/1s"], algorithm = "gcra", max_delay = "200ms")]
async fn export(rows: Vec<u32>) -> Result<usize, Rejection> {
    Ok(rows.len())
}

fn main() {
    let _app: Router = Router::new().route("/complete", post(complete));
    let _ = export(vec![1, 2, 3]);
}
