use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response};
use tower_service::Service;

use super::{Count, RateLimitFuture, future::Checking, layer::Config};
use crate::{body::GateBody, identity::identity_of, rejection::is_grpc};

/// The service of a [`RateLimitLayer`](crate::RateLimitLayer): checks the policy, then calls
/// the inner service or answers with the rejection.
///
/// Its responses have a [`GateBody`] around the inner service's body.
#[derive(Clone)]
pub struct RateLimitService<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config>,
}

impl<S, B, ResBody> Service<Request<B>> for RateLimitService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<GateBody<ResBody>>;
    type Error = S::Error;
    type Future = RateLimitFuture<S, B, S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was polled ready handles this request; the clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let identity = identity_of(&request, &self.config.resolver, &self.config.wanted);
        let grpc = is_grpc(request.headers());
        let config = self.config.clone();
        // A refund needs the identity again, once the response is known.
        let kept =
            (!matches!(config.count, Count::All) || config.concurrent).then(|| identity.clone());
        // Decided here when the store answers at once; else the check awaits the store.
        let check = match config
            .gate
            .check_sync(&config.policy, &identity, config.cost)
        {
            Some(decided) => Checking::Decided(Some(decided)),
            None => Checking::Waiting(Box::pin(async move {
                config
                    .gate
                    .check(&config.policy, &identity, config.cost)
                    .await
            })),
        };
        RateLimitFuture::new(check, inner, request, self.config.clone(), grpc, kept)
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
