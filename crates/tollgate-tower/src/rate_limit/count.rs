//! Which requests keep their charge: all of them, only failures or only successes.

use std::{fmt, sync::Arc};

use http::{HeaderMap, HeaderName, StatusCode, Uri};
use tollgate::{Decision, Identity, Receipt};

use super::layer::Config;
use crate::gate::in_background;

/// Which admitted requests keep the units they were charged; see
/// [`RateLimitLayer::count`](crate::RateLimitLayer::count).
///
/// Every request is charged when it is admitted, so concurrent requests can never exceed the
/// limit; the ones that should not count are refunded once their response is known (before
/// the response is returned, so the client's next request sees it).
#[derive(Clone)]
pub enum Count {
    /// Every admitted request counts (the default).
    All,
    /// Only failures count (failed logins, wrong SMS codes): a response the predicate calls a
    /// success is refunded. A handler that panics or whose future is dropped counts as a
    /// failure.
    Failures(FailureWhen),
    /// Only successes count (a quota of things done): a failed response is refunded, and so is
    /// a handler that panics, errors or whose future is dropped.
    Successes(FailureWhen),
}

impl Count {
    /// Only failures count, a failure being a 4xx or 5xx response.
    pub fn failures() -> Count {
        Count::Failures(FailureWhen::default())
    }

    /// Only successes count, a failure being a 4xx or 5xx response.
    pub fn successes() -> Count {
        Count::Successes(FailureWhen::default())
    }
}

impl fmt::Debug for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Count::All => "All",
            Count::Failures(_) => "Failures",
            Count::Successes(_) => "Successes",
        })
    }
}

/// Which response statuses are failures (default: 4xx and 5xx). A gRPC call that fails at once
/// (its `grpc-status` in the answer's headers) is judged by the HTTP status that status maps
/// to: `NOT_FOUND` as 404, `UNAUTHENTICATED` as 401, `UNAVAILABLE` as 503, and so on.
///
/// ```
/// use http::{HeaderMap, HeaderName, StatusCode, Uri};
/// use tollgate_tower::{Count, FailureWhen};
///
/// // A login answers 401 for a wrong password; only that counts.
/// let count = Count::Failures(FailureWhen::new(|status| status == StatusCode::UNAUTHORIZED));
/// # let _ = count;
/// ```
#[derive(Clone)]
pub struct FailureWhen(Arc<dyn Fn(StatusCode) -> bool + Send + Sync>);

impl FailureWhen {
    /// Failures are the statuses `f` says are.
    pub fn new(f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> FailureWhen {
        FailureWhen(Arc::new(f))
    }

    /// Whether `status` is a failure.
    pub fn is_failure(&self, status: StatusCode) -> bool {
        (self.0)(status)
    }
}

impl Default for FailureWhen {
    fn default() -> FailureWhen {
        FailureWhen::new(|status| status.is_client_error() || status.is_server_error())
    }
}

impl fmt::Debug for FailureWhen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FailureWhen(..)")
    }
}

/// A request's cost, from the request (see
/// [`RateLimitLayer::cost_from`](crate::RateLimitLayer::cost_from)): what an LLM call
/// estimates, the bytes an upload declares.
///
/// ```
/// use tollgate_tower::Cost;
///
/// // The tokens the client says it asks for, 1 when it does not say.
/// let cost = Cost::header("x-max-tokens");
/// # let _ = cost;
/// ```
#[derive(Clone)]
pub struct Cost(Arc<CostFn>);

type CostFn = dyn Fn(&HeaderMap, &Uri) -> u64 + Send + Sync;

impl Cost {
    /// The cost `f` reads from the request's headers and URI.
    pub fn new(f: impl Fn(&HeaderMap, &Uri) -> u64 + Send + Sync + 'static) -> Cost {
        Cost(Arc::new(f))
    }

    /// The cost is the request header `name`'s value, a whole number; 1 when it is missing,
    /// not a number or 0: a client does not make its own requests free (a check of cost 0
    /// counts nothing and takes no concurrency slot).
    pub fn header(name: &'static str) -> Cost {
        let name = HeaderName::from_static(name);
        Cost::new(move |headers, _| number(headers, &name).filter(|&n| n > 0).unwrap_or(1))
    }

    pub(crate) fn of(&self, headers: &HeaderMap, uri: &Uri) -> u64 {
        (self.0)(headers, uri)
    }
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cost(..)")
    }
}

/// What an admitted request turned out to cost, from its response (see
/// [`RateLimitLayer::settle`](crate::RateLimitLayer::settle)): its check is settled at it
/// before the response goes out ([`Tollgate::settle`](tollgate::Tollgate::settle)).
///
/// ```
/// use tollgate_tower::Settle;
///
/// // The handler says what the answer used.
/// let settle = Settle::header("x-tokens-used");
/// # let _ = settle;
/// ```
#[derive(Clone)]
pub struct Settle(Arc<SettleFn>);

type SettleFn = dyn Fn(StatusCode, &HeaderMap) -> Option<u64> + Send + Sync;

impl Settle {
    /// The cost `f` reads from the response's status and headers; `None` keeps the charge.
    pub fn new(
        f: impl Fn(StatusCode, &HeaderMap) -> Option<u64> + Send + Sync + 'static,
    ) -> Settle {
        Settle(Arc::new(f))
    }

    /// The cost is the response header `name`'s value, a whole number; without it (or with
    /// something else) the charge stays as checked.
    pub fn header(name: &'static str) -> Settle {
        let name = HeaderName::from_static(name);
        Settle::new(move |_, headers| number(headers, &name))
    }

    pub(crate) fn of(&self, status: StatusCode, headers: &HeaderMap) -> Option<u64> {
        (self.0)(status, headers)
    }
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Settle(..)")
    }
}

/// The status a response is counted by ([`FailureWhen`]): its HTTP status; for a gRPC call
/// answered with its `grpc-status` in the headers (a trailers-only answer, which is how a call
/// fails at once), that status read as the HTTP status it maps to (as Google's API design
/// guide maps them: `UNAUTHENTICATED` 401, `NOT_FOUND` 404, `UNAVAILABLE` 503, ...). Every gRPC
/// answer is HTTP 200 otherwise, so failed calls were counted as successes. A status sent in
/// trailers after a body comes after the count is settled, and reads as the HTTP status.
pub(crate) fn counted_status(status: StatusCode, headers: &HeaderMap) -> StatusCode {
    let Some(code) = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u16>().ok())
    else {
        return status;
    };
    let http = match code {
        0 => 200,
        1 => 499,
        3 | 9 | 11 => 400,
        4 => 504,
        5 => 404,
        6 | 10 => 409,
        7 => 403,
        8 => 429,
        12 => 501,
        14 => 503,
        16 => 401,
        // UNKNOWN, INTERNAL, DATA_LOSS and codes past the known ones.
        _ => 500,
    };
    StatusCode::from_u16(http).unwrap_or(status)
}

/// The receipt a request's refund or settlement goes by: its check's, or, for an admission of
/// no units (a cost of 0 records nothing, so its check has none), one of no units, so that a
/// settlement still charges what the response says it cost: a client that claims a cost of 0
/// is not let through for free.
pub(crate) fn receipt_of(decision: &Decision, cost: u64) -> Option<Receipt> {
    decision.receipt().or_else(|| {
        let admitted = cost == 0 && decision.reason() == tollgate::Reason::Ok;
        admitted.then(|| Receipt::per_limiter([], 0, 0))
    })
}

/// The header `name` as a whole number.
fn number(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// What an admitted request needs for a refund or a settlement, held until its outcome is
/// known. Dropped while armed under [`Count::Successes`] (the handler panicked or its future
/// was dropped), it refunds in the background.
pub(crate) struct Charge {
    config: Arc<Config>,
    identity: Identity,
    receipt: Option<Receipt>,
    /// What the request was charged.
    cost: u64,
    armed: bool,
    /// A [`Slot`] holds the check's concurrency leases (until the response body ends): a
    /// refund gives back the rate units only.
    leases_apart: bool,
}

impl Charge {
    pub(crate) fn new(
        config: Arc<Config>,
        identity: Identity,
        receipt: Option<Receipt>,
        cost: u64,
    ) -> Charge {
        Charge {
            config,
            identity,
            receipt,
            cost,
            armed: true,
            leases_apart: false,
        }
    }

    /// The check's concurrency leases are held apart (by a [`Slot`]): a refund leaves them.
    pub(crate) fn leases_apart(mut self) -> Charge {
        self.leases_apart = true;
        self
    }

    /// The cost the response says the request had, if it differs from its charge and the
    /// charge can be settled (it has its receipt).
    pub(crate) fn settled_cost(&self, status: StatusCode, headers: &HeaderMap) -> Option<u64> {
        let settle = self.config.settle.as_ref()?;
        self.receipt.as_ref()?;
        settle.of(status, headers).filter(|&cost| cost != self.cost)
    }

    /// Settles the request's check at `cost` now. A failed settlement keeps the charge.
    pub(crate) async fn settle_at(mut self, cost: u64) {
        self.armed = false;
        let Some(receipt) = self.receipt.take() else {
            return;
        };
        let _ = self
            .config
            .gate
            .settle(&self.config.policy, &self.identity, &receipt, cost)
            .await;
    }

    /// Whether the outcome (a response status, or `None` for an error of the inner service)
    /// keeps the charge.
    pub(crate) fn keeps(&self, status: Option<StatusCode>) -> bool {
        match &self.config.count {
            Count::All => true,
            Count::Failures(when) => status.is_none_or(|s| when.is_failure(s)),
            Count::Successes(when) => status.is_some_and(|s| !when.is_failure(s)),
        }
    }

    /// Gives the request's units back now.
    pub(crate) async fn refund(mut self) {
        self.refund_work().await;
    }

    /// The outcome kept the charge: nothing to do on drop.
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }

    /// The refund of this charge, disarmed (so that dropping it owes nothing more). A failed
    /// refund keeps the charge: the safe side. An admission without a receipt recorded
    /// nothing (the store failed open, the local fallback or a bypass admitted it): there is
    /// nothing to give back, and a refund without one would take other requests' units.
    fn refund_work(&mut self) -> impl Future<Output = ()> + Send + 'static {
        self.armed = false;
        let config = self.config.clone();
        let identity = std::mem::take(&mut self.identity);
        let receipt = self.receipt.take();
        let (cost, leases_apart) = (self.cost, self.leases_apart);
        async move {
            let Some(receipt) = receipt else { return };
            let (gate, policy) = (&config.gate, &config.policy);
            if leases_apart {
                // Settled at nothing: every rate unit back, the leases left to their slot.
                let _ = gate.settle(policy, &identity, &receipt, 0).await;
            } else {
                let _ = gate.refund(policy, &identity, cost, Some(&receipt)).await;
            }
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.armed && matches!(self.config.count, Count::Successes(_)) {
            in_background(self.refund_work());
        }
    }
}

/// The units of a request held for its turn (see
/// [`RateLimitLayer::max_delay`](crate::RateLimitLayer::max_delay)): given back in the
/// background if it is dropped before they are due (the client went away).
pub(crate) struct Held {
    config: Arc<Config>,
    identity: Identity,
    receipt: Option<Receipt>,
    cost: u64,
    armed: bool,
}

impl Held {
    pub(crate) fn new(
        config: Arc<Config>,
        identity: Identity,
        receipt: Option<Receipt>,
        cost: u64,
    ) -> Held {
        Held {
            config,
            identity,
            receipt,
            cost,
            armed: true,
        }
    }

    /// The units are due: the request goes on with them.
    pub(crate) fn due(mut self) {
        self.armed = false;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let config = self.config.clone();
        let identity = std::mem::take(&mut self.identity);
        // Without a receipt nothing was recorded (see `Charge::refund_work`).
        let (cost, Some(receipt)) = (self.cost, self.receipt.take()) else {
            return;
        };
        in_background(async move {
            let _ = config
                .gate
                .refund(&config.policy, &identity, cost, Some(&receipt))
                .await;
        });
    }
}
