use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::Response;

use crate::gate::BoxFuture;

/// The response future of [`DuplicateService`](crate::DuplicateService).
///
/// The guard's steps (read the body, take the lock, call the inner service, store or release)
/// await one another, so they run as one boxed future.
pub struct DuplicateFuture<B, E> {
    pub(crate) inner: BoxFuture<'static, Result<Response<B>, E>>,
}

impl<B, E> Future for DuplicateFuture<B, E> {
    type Output = Result<Response<B>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for DuplicateFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DuplicateFuture").finish_non_exhaustive()
    }
}
