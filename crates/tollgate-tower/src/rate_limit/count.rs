//! Which requests keep their charge: all of them, only failures or only successes.

use std::{fmt, sync::Arc};

use http::StatusCode;
use tollgate::{Identity, Receipt};

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

/// Which response statuses are failures (default: 4xx and 5xx).
///
/// ```
/// use http::StatusCode;
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

/// What an admitted request needs for a refund, held until its outcome is known. Dropped
/// while armed under [`Count::Successes`] (the handler panicked or its future was dropped),
/// it refunds in the background.
pub(crate) struct Charge {
    config: Arc<Config>,
    identity: Identity,
    receipt: Option<Receipt>,
    armed: bool,
}

impl Charge {
    pub(crate) fn new(config: Arc<Config>, identity: Identity, receipt: Option<Receipt>) -> Charge {
        Charge {
            config,
            identity,
            receipt,
            armed: true,
        }
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
    pub(crate) fn settle(mut self) {
        self.armed = false;
    }

    /// The refund of this charge, disarmed (so that dropping it owes nothing more). A failed
    /// refund keeps the charge: the safe side.
    fn refund_work(&mut self) -> impl Future<Output = ()> + Send + 'static {
        self.armed = false;
        let config = self.config.clone();
        let identity = std::mem::take(&mut self.identity);
        let receipt = self.receipt.take();
        async move {
            let _ = config
                .gate
                .refund(&config.policy, &identity, config.cost, receipt.as_ref())
                .await;
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

/// The concurrency slots an admitted request holds (its policy's concurrency limiters): freed
/// when dropped, which the layer arranges for when the response body ends or is dropped, or
/// when the handler panics or its future is dropped. The release runs in the background.
pub(crate) struct Slot {
    config: Arc<Config>,
    identity: Identity,
    receipt: Receipt,
}

impl Slot {
    pub(crate) fn new(config: Arc<Config>, identity: Identity, receipt: Receipt) -> Slot {
        Slot {
            config,
            identity,
            receipt,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let config = self.config.clone();
        let identity = std::mem::take(&mut self.identity);
        let receipt = self.receipt.clone();
        in_background(async move {
            let _ = config
                .gate
                .release_concurrent(&config.policy, &identity, &receipt)
                .await;
        });
    }
}
