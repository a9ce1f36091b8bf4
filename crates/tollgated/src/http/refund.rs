//! `/v1/refund`: units given back, once per sealed receipt.

use std::sync::Arc;

use axum::{
    Json,
    extract::{FromRequestParts, State},
    http::{StatusCode, request::Parts},
};

use super::{
    error::{ApiError, ApiJson},
    json::RefundRequest,
    scope::{Admin, RefundCaller},
};
use crate::{app::App, auth::Scope};

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
    if req.receipt.is_none() && !app.auth.guarded(Scope::Refund) {
        Admin::from_request_parts(&mut parts, &app).await?;
    }
    let entry = policy(&app, &req.policy)?;
    let identity = req.identity.into_identity();
    let receipt = match &req.receipt {
        Some(sealed) => {
            let (receipt, _) = open(&app, &entry, &identity, "receipt", sealed)?;
            // Past the policy's longest window a receipt gives nothing back, and its spent
            // mark is gone: refused, not refunded twice.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            let newest = (0..entry.policy.limiters().len())
                .filter_map(|i| receipt.at_us(i))
                .max()
                .unwrap_or(0);
            let window = crate::receipt::longest_window(&entry.policy);
            if newest.saturating_add(u64::try_from(window.as_micros()).unwrap_or(u64::MAX)) <= now {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "this receipt's windows have ended: there is nothing left to give back",
                )
                .with_code("receipt_expired"));
            }
            let tag = app.receipts.spent_tag(&entry.policy, &identity, &receipt);
            let spend = crate::receipt::spend(&app.gate, &entry.policy, &tag);
            if !timed(&app, "refund", spend).await? {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "this receipt was refunded already: a receipt gives back its units once",
                )
                .with_code("already_refunded"));
            }
            Some(receipt)
        }
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
