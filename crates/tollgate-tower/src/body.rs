//! The body the layers answer with: the inner service's, or one they wrote.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, combinators::UnsyncBoxBody};
use pin_project_lite::pin_project;

/// The error type of a [`GateBody`]: the inner body's error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// A body of type `B` passed through, or one a layer wrote: a rejection's problem
    /// document, a replayed response, a custom rejection from `on_rejection`. It is a
    /// [`LayerBody`] whatever `B` is: wrap an inner service's body in it
    /// ([`GateBody::new`]) when the layers cannot write in that body's own type
    /// (`Full<Bytes>`, `String`). The layers also wrap a response in it while it holds a
    /// concurrency slot, and the [`DuplicateLayer`](crate::DuplicateLayer) hands it to its
    /// inner service as the request body, which it may have read to fingerprint it.
    ///
    /// It is an [`http_body::Body`] with `Bytes` data whatever `B` is.
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use tollgate_tower::GateBody;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let body: GateBody<String> = GateBody::full("rate limited");
    /// assert_eq!(body.collect().await?.to_bytes(), "rate limited");
    /// # Ok::<(), tollgate_tower::BoxError>(())
    /// # }).unwrap();
    /// ```
    pub struct GateBody<B> {
        #[pin]
        kind: Kind<B>,
        // What the response holds until its body ends or is dropped (a concurrency slot).
        held: Option<Box<dyn Send>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        Boxed { body: UnsyncBoxBody<Bytes, BoxError> },
    }
}

impl<B> GateBody<B> {
    /// The inner service's body, passed through.
    pub fn new(body: B) -> GateBody<B> {
        GateBody {
            kind: Kind::Inner { body },
            held: None,
        }
    }

    /// A body of these bytes.
    pub fn full(data: impl Into<Bytes>) -> GateBody<B> {
        let data: Bytes = data.into();
        GateBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            held: None,
        }
    }

    /// An empty body.
    pub fn empty() -> GateBody<B> {
        GateBody {
            kind: Kind::Full { data: None },
            held: None,
        }
    }

    /// Any other body, boxed.
    pub fn boxed<T>(body: T) -> GateBody<B>
    where
        T: Body<Data = Bytes> + Send + 'static,
        T::Error: Into<BoxError>,
    {
        GateBody {
            kind: Kind::Boxed {
                body: body.map_err(Into::into).boxed_unsync(),
            },
            held: None,
        }
    }
}

/// A response body the layers answer in: the inner service's own body type, so that a layer
/// adds no wrapper around an admitted response (and axum, which boxes every body type but its
/// own, no box). A layer writes its own answers (a rejection's problem document, a replayed
/// response) in it, and wraps a body only to hold what a streamed response keeps (a
/// concurrency slot) until it ends.
///
/// Implemented for axum's `Body` (feature `axum`), tonic's `Body` (feature `tonic`),
/// http-body-util's `UnsyncBoxBody`, and [`GateBody`]: any other body goes
/// through the layers wrapped in it ([`GateBody::new`], e.g. with `tower::ServiceBuilder`'s
/// `map_response`).
#[diagnostic::on_unimplemented(
    message = "the layers answer in the inner service's body type, and `{Self}` is not one they can write",
    note = "wrap the inner service's body in `tollgate_tower::GateBody::new`"
)]
pub trait LayerBody: Sized {
    /// A body of these bytes.
    fn full(data: Bytes) -> Self;

    /// Any other body (a custom rejection's, a replay's).
    fn boxed(body: UnsyncBoxBody<Bytes, BoxError>) -> Self;

    /// This body, holding `guard` until it ends (its last frame, or an error) or is dropped.
    fn holding(self, guard: Box<dyn Send>) -> Self;
}

impl<B> LayerBody for GateBody<B> {
    fn full(data: Bytes) -> GateBody<B> {
        GateBody::full(data)
    }

    // Boxed already: kept as it is, not boxed again as `GateBody::boxed` would.
    fn boxed(body: UnsyncBoxBody<Bytes, BoxError>) -> GateBody<B> {
        GateBody {
            kind: Kind::Boxed { body },
            held: None,
        }
    }

    // A guard held already (a layer further in, holding its own slot) is held on beside it.
    fn holding(mut self, guard: Box<dyn Send>) -> GateBody<B> {
        self.held = Some(match self.held.take() {
            Some(inner) => Box::new((inner, guard)),
            None => guard,
        });
        self
    }
}

impl LayerBody for UnsyncBoxBody<Bytes, BoxError> {
    fn full(data: Bytes) -> Self {
        GateBody::<Self>::full(data).boxed_unsync()
    }

    fn boxed(body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        body
    }

    fn holding(self, guard: Box<dyn Send>) -> Self {
        GateBody::new(self).holding(guard).boxed_unsync()
    }
}

#[cfg(feature = "axum")]
impl LayerBody for axum::body::Body {
    fn full(data: Bytes) -> Self {
        axum::body::Body::from(data)
    }

    fn boxed(body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        axum::body::Body::new(body)
    }

    fn holding(self, guard: Box<dyn Send>) -> Self {
        axum::body::Body::new(GateBody::new(self).holding(guard))
    }
}

#[cfg(feature = "tonic")]
impl LayerBody for tonic::body::Body {
    fn full(data: Bytes) -> Self {
        tonic::body::Body::new(GateBody::<Self>::full(data))
    }

    fn boxed(body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        tonic::body::Body::new(body)
    }

    fn holding(self, guard: Box<dyn Send>) -> Self {
        tonic::body::Body::new(GateBody::new(self).holding(guard))
    }
}

impl<B> Default for GateBody<B> {
    fn default() -> GateBody<B> {
        GateBody::empty()
    }
}

impl<B> Body for GateBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let polled = match this.kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Boxed { body } => Pin::new(body).poll_frame(cx),
        };
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            // The body is over: what it held is let go now, not when it is dropped.
            *this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Boxed { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Boxed { body } => body.size_hint(),
        }
    }
}

impl<B> fmt::Debug for GateBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Full { .. } => "Full",
            Kind::Boxed { .. } => "Boxed",
        };
        f.debug_tuple("GateBody").field(&kind).finish()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};

    use super::*;

    #[tokio::test]
    async fn every_kind_yields_its_bytes() {
        let inner: GateBody<Full<Bytes>> = GateBody::new(Full::new(Bytes::from("inner")));
        assert_eq!(inner.size_hint().exact(), Some(5));
        assert_eq!(inner.collect().await.unwrap().to_bytes(), "inner");
        let full: GateBody<Full<Bytes>> = GateBody::full("full");
        assert_eq!(full.size_hint().exact(), Some(4));
        assert_eq!(full.collect().await.unwrap().to_bytes(), "full");
        let boxed: GateBody<Full<Bytes>> = GateBody::boxed(Full::new(Bytes::from("boxed")));
        assert_eq!(boxed.collect().await.unwrap().to_bytes(), "boxed");
        let empty: GateBody<Full<Bytes>> = GateBody::empty();
        assert!(empty.is_end_stream());
        assert!(empty.collect().await.unwrap().to_bytes().is_empty());
    }

    /// Set when dropped.
    struct Guard(std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// What every body the layers answer in must do: carry a layer's bytes and any body, and
    /// hold a guard until its last frame, not only until it is dropped.
    async fn answers_as_a_layer_body<T>(inner: T)
    where
        T: LayerBody + Body<Data = Bytes> + Unpin,
        T::Error: fmt::Debug,
    {
        assert_eq!(
            T::full(Bytes::from("full"))
                .collect()
                .await
                .unwrap()
                .to_bytes(),
            "full"
        );
        let boxed = Full::new(Bytes::from("boxed"))
            .map_err(|e| match e {})
            .boxed_unsync();
        assert_eq!(T::boxed(boxed).collect().await.unwrap().to_bytes(), "boxed");
        // Held by two layers (each its own concurrency slot): both until the body ends.
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let outer = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut held = inner
            .holding(Box::new(Guard(dropped.clone())))
            .holding(Box::new(Guard(outer.clone())));
        let is_dropped = || {
            let inner = dropped.load(std::sync::atomic::Ordering::SeqCst);
            let outer = outer.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(inner, outer, "the two guards go together");
            inner
        };
        assert!(!is_dropped(), "held while the body is unread");
        let first = held.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "inner");
        assert!(held.frame().await.is_none());
        assert!(
            is_dropped(),
            "let go at the body's end, before it is dropped"
        );
        drop(held);
    }

    #[tokio::test]
    async fn every_layer_body_answers_and_holds() {
        let inner = || Full::new(Bytes::from("inner"));
        answers_as_a_layer_body(GateBody::new(inner())).await;
        answers_as_a_layer_body(inner().map_err(|e| match e {}).boxed_unsync()).await;
        #[cfg(feature = "axum")]
        answers_as_a_layer_body(axum::body::Body::new(inner())).await;
        #[cfg(feature = "tonic")]
        answers_as_a_layer_body(tonic::body::Body::new(inner())).await;
    }
}
