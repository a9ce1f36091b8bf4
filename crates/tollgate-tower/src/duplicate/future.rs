use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use axum::body::Body;
use http::Response;

use crate::engine::BoxFuture;

/// The response future of [`DuplicateService`](crate::DuplicateService).
///
/// The guard's steps (read the body, take the lock, call the inner service, store or release)
/// await one another, so they run as one boxed future.
pub struct DuplicateFuture<E> {
    pub(crate) inner: BoxFuture<'static, Result<Response<Body>, E>>,
}

impl<E> Future for DuplicateFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> fmt::Debug for DuplicateFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DuplicateFuture").finish_non_exhaustive()
    }
}
