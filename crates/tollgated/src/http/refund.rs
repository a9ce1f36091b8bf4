//! `/v1/refund` and `/v1/settle`: units given back, or a check settled at its real cost, once
//! per sealed receipt.

use std::sync::Arc;

use axum::{
    Json,
    extract::{FromRequestParts, State},
    http::{StatusCode, request::Parts},
};

use tollgate::{Receipt, Settlement};

use super::{
    error::{ApiError, ApiJson},
    json::{RefundRequest, SettleRequest},
    scope::{Admin, RefundCaller},
};
use crate::{app::App, auth::Scope, config::PolicyEntry};

use super::{
    check::{policy, timed},
    leases::open,
};

/// `/v1/refund`: gives back `cost` units (default 1, at most what the receipt charged) to
/// every rule of the policy for the identity, exactly those of the check whose `receipt` it
/// names (see `Tollgate::refund`). A receipt is spent once: a second refund of it is `409`. A
/// refund without a receipt undoes any caller's checks: it takes the refund scope's token, or
/// the admin token where that scope has none.
pub(crate) async fn refund(
    State(app): State<Arc<App>>,
    _: RefundCaller,
    mut parts: Parts,
    ApiJson(req): ApiJson<RefundRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    // Without a receipt, a refund undoes anyone's checks: it takes a token, the refund
    // scope's (checked above when the scope has one) or else the admin's.
    if req.receipt.is_none() && !app.auth.has_own_token(Scope::Refund) {
        Admin::from_request_parts(&mut parts, &app).await?;
    }
    let entry = policy(&app, &req.policy)?;
    let identity = req.identity.into_identity();
    let receipt = match &req.receipt {
        Some(sealed) => Some(spend_receipt(&app, &entry, &identity, sealed).await?),
        None => None,
    };
    let cost = receipt.as_ref().map_or(req.cost.unwrap_or(1), |r| {
        req.cost.unwrap_or(1).min(r.units())
    });
    let refund = app
        .gate
        .refund(&entry.policy, &identity, cost, receipt.as_ref());
    timed(&app, "refund", refund).await?;
    Ok(Json(serde_json::json!({ "refunded": cost })))
}

/// `/v1/settle`: settles the check whose sealed `receipt` it names at the `cost` its work
/// turned out to have (see `Tollgate::settle`): less than it charged gives the difference
/// back, more charges the rest past the limits (a debt that denies the identity's next
/// checks until time pays it). A receipt is spent once, by a settlement or a refund: a second
/// one is `409`.
pub(crate) async fn settle(
    State(app): State<Arc<App>>,
    _: RefundCaller,
    ApiJson(req): ApiJson<SettleRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let entry = policy(&app, &req.policy)?;
    let identity = req.identity.into_identity();
    let receipt = spend_receipt(&app, &entry, &identity, &req.receipt).await?;
    let settle = app
        .gate
        .settle(&entry.policy, &identity, &receipt, req.cost);
    let (settled, units) = match timed(&app, "settle", settle).await? {
        Settlement::Exact => ("exact", 0),
        Settlement::Refunded(units) => ("refunded", units),
        Settlement::Charged(units) => ("charged", units),
    };
    Ok(Json(
        serde_json::json!({ "settled": settled, "units": units }),
    ))
}

/// The receipt `sealed` names, opened for `entry`'s policy and `identity` and marked spent:
/// `409` when its windows have ended or it was spent already.
async fn spend_receipt(
    app: &App,
    entry: &PolicyEntry,
    identity: &tollgate::Identity,
    sealed: &str,
) -> Result<Receipt, ApiError> {
    let (receipt, _) = open(app, entry, identity, "receipt", sealed)?;
    // Past the policy's longest window a receipt gives nothing back, and its spent mark is
    // gone: refused, not spent twice.
    let now = u64::try_from(crate::metrics::epoch().as_micros()).unwrap_or(u64::MAX);
    let newest = (0..entry.policy.limiters().len())
        .filter_map(|i| receipt.at_us(i))
        .max()
        .unwrap_or(0);
    let window = crate::receipt::longest_window(&entry.policy);
    if newest.saturating_add(u64::try_from(window.as_micros()).unwrap_or(u64::MAX)) <= now {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "this receipt's windows have ended: there is nothing left to give back or settle",
        )
        .with_code("receipt_expired"));
    }
    let tag = app.receipts.spent_tag(&entry.policy, identity, &receipt);
    let spend = crate::receipt::spend(&app.gate, &entry.policy, &tag);
    if !timed(app, "refund", spend).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "this receipt was refunded or settled already: a receipt is spent once",
        )
        .with_code("already_refunded"));
    }
    Ok(receipt)
}
