use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response};
use tower_service::Service;

use super::{
    Count, RateLimitFuture,
    count::{Charge, receipt_of},
    future::Checking,
    layer::Config,
};
use crate::{body::LayerBody, gate::owned_check, identity::identity_of};

/// The service of a [`RateLimitLayer`](crate::RateLimitLayer): checks the policy, then calls
/// the inner service or answers with the rejection.
///
/// It answers in the inner service's body type ([`LayerBody`]): an admitted request's
/// response passes through as it is.
#[derive(Clone)]
pub struct RateLimitService<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config>,
}

impl<S, B, ResBody> Service<Request<B>> for RateLimitService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    ResBody: LayerBody,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = RateLimitFuture<S, B, S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let identity = identity_of(&request, &self.config.resolver, &self.config.wanted);
        let config = &self.config;
        let cost = config
            .cost_from
            .as_ref()
            .map_or(config.cost, |c| c.of(request.headers(), request.uri()));
        let kept = (!matches!(config.count, Count::All)
            || config.concurrent
            || config.settle.is_some()
            || config.max_delay.is_some())
        .then(|| identity.clone());
        // A request that may wait takes the path that can hold it.
        if let Some(decided) = config
            .max_delay
            .is_none()
            .then(|| config.gate.check_sync(&config.policy, &identity, cost))
            .flatten()
        {
            // Decided at once: the inner service, which `poll_ready` made ready, is called now.
            return RateLimitFuture::decided(decided, &mut self.inner, request, config, kept, cost);
        }
        // The check awaits the store: the ready service goes with the request, a clone stays.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = config.clone();
        let checking = config.clone();
        let check = async move {
            let (gate, policy) = (&checking.gate, &checking.policy);
            match checking.max_delay {
                Some(delay) => gate.check_within(policy, &identity, cost, delay).await,
                None => gate.check(policy, &identity, cost).await,
            }
        };
        let check: Checking = match &kept {
            // What an admission takes that its request was to give back or settle (a
            // concurrency slot, a charge the outcome decides): given back if the request goes
            // away while its check is at the store. Else a lost answer costs only the units.
            Some(identity) if config.concurrent || !matches!(config.count, Count::All) => {
                let (config, identity) = (config.clone(), identity.clone());
                owned_check(
                    check,
                    Box::new(move |decision| {
                        let receipt = receipt_of(&decision, cost);
                        Box::pin(Charge::new(config, identity, receipt, cost).refund())
                    }),
                )
            }
            _ => Box::pin(check),
        };
        RateLimitFuture::waiting(check, inner, request, config, kept, cost)
    }
}

impl<S: fmt::Debug> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("policy", &self.config.policy.scope())
            .finish_non_exhaustive()
    }
}

impl<S> RateLimitService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, the layer gone.
    pub fn into_inner(self) -> S {
        self.inner
    }
}
