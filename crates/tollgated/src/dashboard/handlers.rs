//! The page, its assets, and the JSON endpoints it polls.

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    Json,
    extract::{Query, State, rejection::QueryRejection},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::{Value, json};
use tollgate::OnError;

use crate::observed::{TOP_CAPACITY, TOP_GENERATION, exposition, history, lock};
use crate::{
    app::App,
    http::{Admin, ApiError},
};

const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLE: &str = include_str!("assets/dashboard.css");

/// The page loads nothing from elsewhere, and nothing may frame it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn page() -> Response {
    asset(PAGE, "text/html; charset=utf-8")
}

pub(super) async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

pub(super) async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatsQuery {
    since: Option<String>,
}

fn on_error_name(on_error: OnError) -> &'static str {
    match on_error {
        OnError::Allow => "allow",
        OnError::Deny => "deny",
        OnError::Local => "local",
    }
}

fn millis(seconds: Option<f64>) -> Value {
    seconds.map_or(Value::Null, |s| json!((s * 1e6).round() / 1e3))
}

/// `GET /v1/stats?since=<unix second>`: decisions per second per series over the last 15
/// minutes (only the seconds after `since`, when given), store health, the policies as
/// loaded and the reload status. Aggregates only: no identity.
pub(super) async fn stats(
    State(app): State<Arc<App>>,
    query: Result<Query<StatsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let since = query
        .since
        .as_deref()
        .map(|s| {
            s.parse::<u64>().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("since {s:?}: expected a Unix time in seconds (\"now\" of an earlier answer)"),
                )
            })
        })
        .transpose()?;
    let config = app.config();
    let (decisions, store) = {
        let history = lock(&app.observed.history);
        let (seconds, series) = history.series(since);
        let mut unavailable = BTreeMap::from([("allowed", 0u64), ("denied", 0u64)]);
        let series: Vec<Value> = series
            .iter()
            .map(|s| {
                if s.name.reason == "store_unavailable" {
                    *unavailable
                        .entry(if s.name.allowed { "allowed" } else { "denied" })
                        .or_default() += s.total;
                }
                json!({
                    "policy": s.name.policy,
                    "reason": s.name.reason,
                    "allowed": s.name.allowed,
                    "counts": s.counts,
                    "total": s.total,
                })
            })
            .collect();
        let decisions = json!({
            "window_seconds": history::SECONDS,
            "now": seconds.last().copied().or(since),
            "seconds": seconds,
            "series": series,
        });
        let window = history.store_window().map(|(now, then, span)| {
            json!({
                "seconds": span,
                "checks": now.count.saturating_sub(then.count),
                "errors": now.errors.saturating_sub(then.errors),
                "p50_ms": millis(exposition::quantile(now, then, 0.5)),
                "p99_ms": millis(exposition::quantile(now, then, 0.99)),
            })
        });
        let totals = history.store_now();
        let store = json!({
            "kind": if config.store.url.starts_with("memory") { "memory" } else { "redis" },
            "url": crate::store::redact(&config.store.url),
            "on_error": on_error_name(config.store.on_error),
            "timeout_ms": config.store.timeout.as_millis(),
            "recent": window,
            "checks_total": totals.map(|t| t.count),
            "errors_total": totals.map(|t| t.errors),
            "store_unavailable_decisions": unavailable,
            "memory_evictions_total": history.evictions,
            "local_cache_answers_total": app.observed.local_answers(),
            "repair": config.store.repair.map(|h| json!({
                "horizon_ms": h.as_millis(),
                "runs_total": app.observed.repairs().map(|r| r.runs),
                "keys_rewritten_total": app.observed.repairs().map(|r| r.keys_rewritten),
            })),
            "persistence": app.persistence_report(),
            // Aggregates only: the leased identities are the admin's (`/v1/stats/top`).
            "leases": app.observed.leases(0).map(|(stats, _)| json!({
                "calls_total": stats.calls,
                "local_admissions_total": stats.local_admissions,
                "outstanding_units": stats.units_outstanding,
                "returned_units_total": stats.units_returned,
                "leased_keys": stats.leased_keys,
            })),
        });
        (decisions, store)
    };
    let policies: Vec<Value> = config
        .policies
        .iter()
        .map(|(name, entry)| {
            let policy = &entry.policy;
            json!({
                "name": name,
                "on_error": on_error_name(policy.on_error().unwrap_or(config.store.on_error)),
                "durability": policy.durability().to_string(),
                "lease": policy.lease().map(|l| l.to_string()),
                "limiters": policy.limiters().iter().map(|l| json!({
                    "name": l.name(),
                    "by": l.dimension().to_string(),
                    "rules": l.rules().iter().map(|r| json!({
                        "rule": r.to_string(),
                        "algorithm": r.algorithm().to_string(),
                    })).collect::<Vec<_>>(),
                    "blocklist": l.blocklist().map(|b| tollgate::format_duration(b.duration())),
                    "warn_at": l.warning(),
                    "overrides": l.takes_overrides(),
                })).collect::<Vec<_>>(),
                "duplicate": entry.duplicate.as_ref().map(|g| format!(
                    "by {} for {}", g.by(), tollgate::format_duration(g.ttl())
                )),
                "bypass": policy.bypass().is_some(),
            })
        })
        .collect();
    let reload = {
        let status = lock(&app.observed.reload).clone();
        json!({
            "path": app.source().path.as_deref().map_or("(environment)".into(), |p| p.display().to_string()),
            "loaded_at": status.loaded_at,
            "last": status.last.map(|(at, error)| json!({
                "at": at,
                "ok": error.is_none(),
                "error": error,
            })),
            "ok": status.ok,
            "failed": status.failed,
        })
    };
    Ok(Json(json!({
        "decisions": decisions,
        "store": store,
        "policies": policies,
        "envoy": config.envoy.summary(),
        "reload": reload,
        "admin": {
            "enabled": app.auth.enabled(),
            "token_env": config.server.admin_token_env,
        },
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TopQuery {
    limit: Option<String>,
}

/// `GET /v1/stats/top?limit=` (admin): the identities denied most over the last 5 to 10
/// minutes, each with the policy, limiter and rule that denied it.
pub(super) async fn top(
    State(app): State<Arc<App>>,
    _: Admin,
    query: Result<Query<TopQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let limit = match query.limit.as_deref() {
        None => 10,
        Some(text) => text
            .parse()
            .ok()
            .filter(|n| (1..=TOP_CAPACITY).contains(n))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("limit {text:?}: expected a number from 1 to {TOP_CAPACITY}"),
                )
            })?,
    };
    let top = lock(&app.observed.top);
    let entries: Vec<Value> = top
        .sketch
        .top(limit)
        .into_iter()
        .map(|slot| {
            json!({
                "policy": slot.key.policy,
                "limiter": slot.key.limiter,
                "by": slot.value.by,
                "value": slot.key.value,
                "rule": slot.value.rule,
                "denials": slot.count,
                "at_least": slot.count - slot.error,
            })
        })
        .collect();
    // The identities with a quota lease in hand (Redis), most units first.
    let leased: Vec<Value> = app
        .observed
        .leases(limit)
        .map(|(_, keys)| keys)
        .unwrap_or_default()
        .iter()
        .map(|k| {
            json!({
                "keys": k.keys,
                "units": k.units,
                "ends_in_ms": k.ends_in.as_millis(),
            })
        })
        .collect();
    Ok(Json(json!({
        "window_seconds": [TOP_GENERATION.as_secs(), 2 * TOP_GENERATION.as_secs()],
        "denials": top.sketch.total(),
        "capacity": TOP_CAPACITY,
        "top": entries,
        "leased": leased,
    })))
}
