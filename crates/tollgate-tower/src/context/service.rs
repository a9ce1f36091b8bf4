use std::{
    fmt,
    task::{Context as TaskContext, Poll},
};

use http::{Request, Response};
use tower_service::Service;

use super::{Context, ContextFuture, ContextLayer};
use crate::headers::HeaderStyle;

/// The service of a [`ContextLayer`].
#[derive(Clone)]
pub struct ContextService<S> {
    pub(crate) inner: S,
    pub(crate) layer: ContextLayer,
}

impl<S, B, ResBody> Service<Request<B>> for ContextService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ContextFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let identity = self.layer.resolver.resolve(&request);
        request.extensions_mut().insert(identity.clone());
        let style = self.layer.style;
        let context = Context::erased(self.layer.gate.clone(), identity).with_header_style(style);
        let admitted = (style != HeaderStyle::None).then(|| context.admitted.clone());
        // `call` itself may already run guarded code synchronously; the future runs later.
        let inner = &mut self.inner;
        let future = context.clone().sync_scope(|| inner.call(request));
        ContextFuture::new(context, future, admitted, style)
    }
}

impl<S: fmt::Debug> fmt::Debug for ContextService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S> ContextService<S> {
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
