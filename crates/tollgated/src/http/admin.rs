//! Admin endpoints: counter reset, per-identity overrides and the blocklist (callers hold the
//! admin token: see `super::scope`).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json,
    extract::{Path, Query, State, rejection::QueryRejection},
    http::StatusCode,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use serde_json::Value;
use tollgate::{
    BanTarget, CheckError, Identity, LimiterRequest, Override, OverrideError, PageCursor, Policy,
    Rule,
};

use super::{
    check::policy,
    error::{ApiError, ApiJson, check_error},
    json::{
        BanJson, BanRequest, BlocklistPage, BlocklistQuery, OverrideJson, OverrideRequest,
        OverridesPage, PageQuery, ResetRequest, UnbanQuery, ceil_ms,
    },
    scope::Admin,
};
use crate::{app::App, config::bounded_duration, envoy::Node};

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

/// What an override request names: an identity of a policy's limiter, or the counter of an
/// Envoy domain's descriptor.
enum Target {
    Policy {
        policy: Arc<Policy>,
        limiter: String,
        identity: Identity,
    },
    Envoy {
        key: String,
        node: Arc<Node>,
        name: String,
        scope: Arc<str>,
    },
}

impl Target {
    /// What `req` names (its target fields taken).
    fn of(app: &App, req: &mut OverrideRequest) -> Result<Target, ApiError> {
        let bad = |message: String| {
            ApiError::new(StatusCode::BAD_REQUEST, message).with_code("invalid_override")
        };
        let identity = std::mem::take(&mut req.identity);
        match (
            req.policy.take(),
            req.limiter.take(),
            req.domain.take(),
            req.descriptor.take(),
        ) {
            (Some(name), Some(limiter), None, None) => Ok(Target::Policy {
                policy: policy(app, &name)?.policy,
                limiter,
                identity: identity.into_identity(),
            }),
            (None, None, Some(domain), Some(entries)) if identity.is_empty() => {
                let found = app.config().envoy.get(&domain).cloned();
                let Some(found) = found else {
                    return Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!("unknown Envoy domain {domain:?}"),
                    )
                    .with_code("unknown_domain"));
                };
                let entries: Vec<Entry> = entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect();
                let (key, node, name) = found
                    .override_counter(app.gate.prefix(), &entries)
                    .map_err(bad)?;
                Ok(Target::Envoy {
                    key,
                    node,
                    name,
                    scope: found.scope.clone(),
                })
            }
            _ => Err(bad(
                "name a policy's `policy`, `limiter` and `identity`, or an Envoy `domain` and \
                 its `descriptor` ([{\"key\": ..., \"value\": ...}])"
                    .to_owned(),
            )),
        }
    }
}

/// The counter of an Envoy descriptor, as a check sends it.
fn descriptor_limiter<'a>(key: &'a str, node: &'a Node) -> LimiterRequest<'a> {
    LimiterRequest {
        key,
        compact: &[],
        rules: &node.rules,
        ban: None,
        shadow: node.shadow,
        overrides: node.overrides,
    }
}

/// `PUT /v1/overrides`: gives one identity of one limiter (or one Envoy descriptor's values)
/// limits of their own.
pub(crate) async fn set_override(
    State(app): State<Arc<App>>,
    _: Admin,
    ApiJson(mut req): ApiJson<OverrideRequest>,
) -> Result<Json<Value>, ApiError> {
    let target = Target::of(&app, &mut req)?;
    let rules = req
        .rules
        .as_deref()
        .filter(|rules| !rules.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "`rules`: the limits the override sets, e.g. [\"5000/1h\"]",
            )
            .with_code("invalid_override")
        })?
        .iter()
        .enumerate()
        .map(|(i, text)| {
            text.parse::<Rule>().map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, format!("rules[{i}]: {e}"))
                    .with_code("invalid_rule")
            })
        })
        .collect::<Result<Vec<Rule>, ApiError>>()?;
    let ttl = req
        .ttl
        .as_deref()
        .map(|text| {
            positive_duration(
                ("ttl", text),
                "\"30d\" (or no ttl for an override that lasts until removed)",
            )
        })
        .transpose()?;
    let started = Instant::now();
    let result = match &target {
        Target::Policy {
            policy,
            limiter,
            identity,
        } => {
            app.gate
                .set_override(policy, limiter, identity, &rules, ttl)
                .await
        }
        Target::Envoy {
            key,
            node,
            name,
            scope,
        } => {
            let entry = Override::new((scope, &node.path, name), &node.rules, &rules)
                .map_err(override_error)?;
            app.gate
                .set_override_at(&descriptor_limiter(key, node), &entry, ttl)
                .await
                .map_err(OverrideError::from)
        }
    };
    let kept = counted(&app, "set_override", started, result)?;
    tracing::info!(policy = %kept.policy, limiter = %kept.limiter, "override set by admin");
    Ok(Json(
        serde_json::json!({ "override": override_json(&app, kept) }),
    ))
}

/// `DELETE /v1/overrides`: the configured limits again for one identity of one limiter (or
/// one Envoy descriptor's values).
pub(crate) async fn remove_override(
    State(app): State<Arc<App>>,
    _: Admin,
    ApiJson(mut req): ApiJson<OverrideRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.rules.is_some() || req.ttl.is_some() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "DELETE /v1/overrides removes an override: it takes no `rules` or `ttl`",
        )
        .with_code("invalid_override"));
    }
    let target = Target::of(&app, &mut req)?;
    let started = Instant::now();
    let result = match &target {
        Target::Policy {
            policy,
            limiter,
            identity,
        } => app.gate.remove_override(policy, limiter, identity).await,
        Target::Envoy { key, node, .. } => app
            .gate
            .remove_override_at(&descriptor_limiter(key, node))
            .await
            .map_err(OverrideError::from),
    };
    if counted(&app, "remove_override", started, result)? {
        tracing::info!("override removed by admin");
        Ok(Json(serde_json::json!({ "removed": true })))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no override for that identity (or descriptor)",
        )
        .with_code("no_override"))
    }
}

/// `GET /v1/overrides?limit=&cursor=`: one page of the overrides that have not ended, in the
/// order they end (those that never end last).
pub(crate) async fn overrides(
    State(app): State<Arc<App>>,
    _: Admin,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<OverridesPage>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let (limit, after) = page_of(query.limit.as_deref(), query.cursor.as_deref())?;
    let started = Instant::now();
    let result = app.gate.overrides_page(after.as_ref(), limit).await;
    app.metrics
        .store_call("overrides", started.elapsed(), result.is_err());
    let page = result.map_err(|e| ApiError::store("overrides", &e))?;
    Ok(Json(OverridesPage {
        overrides: page
            .overrides
            .into_iter()
            .map(|o| override_json(&app, o))
            .collect(),
        next_cursor: page.next.map(|c| c.to_string()),
    }))
}

/// An override as the API shows it: its rules as the configuration makes them (its policy's
/// limiter, or its Envoy domain's descriptor, `envoy:<domain>`).
pub(crate) fn override_json(app: &App, o: Override) -> OverrideJson {
    let config = app.config();
    let rules = match config.policies.get(&o.policy) {
        Some(entry) => entry
            .policy
            .limiters()
            .iter()
            .find(|l| l.name() == o.limiter)
            .and_then(|limiter| o.rules(limiter.rules())),
        None => o
            .policy
            .strip_prefix("envoy:")
            .and_then(|domain| config.envoy.get(domain))
            .and_then(|domain| domain.node_at(&o.limiter))
            .and_then(|node| o.rules(&node.rules)),
    }
    .map(|rules| rules.iter().map(ToString::to_string).collect());
    OverrideJson {
        expires_at_ms: o.expires_at_us.map(|us| us.div_ceil(1000)),
        rules,
        policy: o.policy,
        limiter: o.limiter,
        value: o.value,
    }
}

/// The result of the override call `op` started at `started`, counted in the store-call
/// metrics (a failure when the store failed), its error as the API answers it.
fn counted<T>(
    app: &App,
    op: &'static str,
    started: Instant,
    result: Result<T, OverrideError>,
) -> Result<T, ApiError> {
    let failed = matches!(result, Err(OverrideError::Store(_)));
    app.metrics.store_call(op, started.elapsed(), failed);
    result.map_err(override_error)
}

fn override_error(e: OverrideError) -> ApiError {
    let (status, code) = match &e {
        OverrideError::Store(e) => return ApiError::store("override", e),
        OverrideError::UnknownLimiter { .. } => (StatusCode::NOT_FOUND, "unknown_limiter"),
        OverrideError::NotOverridable(_) => (StatusCode::CONFLICT, "not_overridable"),
        OverrideError::MissingDimension { .. } => (StatusCode::BAD_REQUEST, "missing_dimension"),
        _ => (StatusCode::BAD_REQUEST, "invalid_override"),
    };
    ApiError::new(status, e.to_string()).with_code(code)
}

/// A listing's page size (blocklist, overrides) when the request names none, and the largest
/// it may name.
const PAGE: usize = 100;
const PAGE_MAX: usize = 1000;

/// The page size and the cursor a listing's request names (`limit`, `cursor`).
fn page_of(
    limit: Option<&str>,
    cursor: Option<&str>,
) -> Result<(usize, Option<PageCursor>), ApiError> {
    let limit = match limit {
        None => PAGE,
        Some(text) => text
            .parse()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("limit {text:?}: expected a number from 1 to {PAGE_MAX}"),
                )
            })?,
    };
    let after = cursor
        .map(str::parse::<PageCursor>)
        .transpose()
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("cursor: {e} (pass next_cursor of the previous page)"),
            )
        })?;
    Ok((limit, after))
}

/// `GET /v1/blocklist?limit=&cursor=`: one page of the live bans, in the order they end.
pub(crate) async fn blocklist(
    State(app): State<Arc<App>>,
    _: Admin,
    query: Result<Query<BlocklistQuery>, QueryRejection>,
) -> Result<Json<BlocklistPage>, ApiError> {
    use tollgate::BanStore as _;
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let (limit, after) = page_of(query.limit.as_deref(), query.cursor.as_deref())?;
    let prefix = match query.policy.as_deref() {
        Some(name) => own_bans(&app, name)?,
        None => app.gate.prefix().to_owned(),
    };
    let started = Instant::now();
    let result = app
        .gate
        .store()
        .bans_page(&prefix, after.as_ref(), limit)
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
    let duration = positive_duration(("duration", &req.duration), "\"10m\"")?;
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
    query: Result<Query<UnbanQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((kind, value)) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let target =
        BanTarget::parse(&kind, &value).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    let entry = query
        .policy
        .as_deref()
        .map(|name| policy(&app, name))
        .transpose()?;
    if let Some(name) = query.policy.as_deref() {
        own_bans(&app, name)?;
    }
    let started = Instant::now();
    let result = match &entry {
        Some(entry) => app.gate.unban_in(&entry.policy, &target).await,
        None => app.gate.unban(&target).await,
    };
    app.metrics
        .store_call("unban", started.elapsed(), result.is_err());
    if result.map_err(|e| ApiError::store("unban", &e))? {
        tracing::info!(%target, policy = query.policy.as_deref().unwrap_or(""), "unbanned by admin");
        Ok(Json(serde_json::json!({ "removed": true })))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("{kind} {value:?} is not on the blocklist"),
        )
        .with_code("not_banned"))
    }
}

/// The duration `text` of `field`, above zero and at most 3650 days; a 400 with `example`
/// otherwise.
fn positive_duration((field, text): (&str, &str), example: &str) -> Result<Duration, ApiError> {
    bounded_duration(text)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "{field} {text:?}: expected e.g. {example} (units ms, s, m, h, d; at most \
                     3650d)"
                ),
            )
        })
}

/// The prefix of the policy `name`'s own bans; a 404 for an unknown policy, a 400 for one whose
/// bans every policy sees (its bans are in the blocklist without `?policy=`).
fn own_bans(app: &App, name: &str) -> Result<String, ApiError> {
    let entry = policy(app, name)?;
    app.gate.ban_prefix(&entry.policy).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "policy {name:?} has no bans of its own (ban_scope = \"everywhere\"): its bans are in the blocklist every policy sees; leave out ?policy="
            ),
        )
        .with_code("policy_bans_shared")
    })
}
