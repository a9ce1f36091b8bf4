use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context as TaskContext, Poll, ready},
};

use super::{Context, task::Admitted};
use crate::headers::{HeaderStyle, add_fields};
use http::Response;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;

pin_project! {
    /// The response future of [`ContextService`](crate::ContextService): the inner future,
    /// polled inside the context.
    pub struct ContextFuture<F> {
        #[pin]
        future: TaskLocalFuture<Context, F>,
        admitted: Option<Arc<Mutex<Admitted>>>,
        style: HeaderStyle,
    }
}

impl<F: Future> ContextFuture<F> {
    pub(crate) fn new(
        context: Context,
        future: F,
        admitted: Option<Arc<Mutex<Admitted>>>,
        style: HeaderStyle,
    ) -> ContextFuture<F> {
        ContextFuture {
            future: context.scope_future(future),
            admitted,
            style,
        }
    }
}

impl<F, ResBody, E> Future for ContextFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.future.poll(cx))?;
        if let Some(admitted) = this.admitted.take() {
            let admitted =
                std::mem::take(&mut *admitted.lock().unwrap_or_else(PoisonError::into_inner));
            let (mut parts, body) = response.into_parts();
            add_fields(*this.style, &admitted.rules, &admitted.warnings, &mut parts);
            response = Response::from_parts(parts, body);
        }
        Poll::Ready(Ok(response))
    }
}
