use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::{RateLimitFuture, layer::Config};
use crate::identity::identity_of;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service of a [`RateLimitLayer`](crate::RateLimitLayer): checks the policy, then calls
/// the inner service or answers with the rejection.
///
/// Its responses have an [`axum::body::Body`], so it fits any axum router and any tower stack
/// that accepts a boxed body.
#[derive(Clone)]
pub struct RateLimitService<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config>,
}

impl<S, B, ResBody> Service<Request<B>> for RateLimitService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = RateLimitFuture<S, B, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was polled ready handles this request; the clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let identity = identity_of(&request, &self.config.resolver, &self.config.wanted);
        let config = self.config.clone();
        let check = Box::pin(async move {
            config
                .gate
                .check(&config.policy, &identity, config.cost)
                .await
        });
        RateLimitFuture::new(check, inner, request, self.config.clone())
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
