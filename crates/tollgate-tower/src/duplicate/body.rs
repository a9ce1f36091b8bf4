//! Buffering bodies with a cap.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body read up to a cap.
pub(crate) enum Buffered<B> {
    /// The whole body, within the cap.
    Whole(Bytes),
    /// Not to be stored: the cap was reached, or the body has trailers (a gRPC status, which a
    /// stored response would not keep): what was read, and the rest, still to be streamed.
    Unstored(Prefixed<B>),
    /// The body failed.
    Failed(BoxError),
}

/// Reads `body` whole if it fits in `cap` bytes and has no trailers.
pub(crate) async fn buffer<B>(body: B, cap: usize) -> Buffered<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut body = body;
    let mut read = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return Buffered::Failed(e.into()),
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                // Trailers end the body: they go on to the client, and the response is not
                // stored.
                return Buffered::Unstored(Prefixed {
                    prefix: Some(read.freeze()),
                    trailers: frame.into_trailers().ok(),
                    rest: body,
                });
            }
        };
        read.extend_from_slice(&data);
        if read.len() > cap {
            return Buffered::Unstored(Prefixed {
                prefix: Some(read.freeze()),
                trailers: None,
                rest: body,
            });
        }
    }
    Buffered::Whole(read.freeze())
}

pin_project! {
    /// Bytes already read (and the trailers, if they were read), then the rest of the body.
    pub(crate) struct Prefixed<B> {
        prefix: Option<Bytes>,
        trailers: Option<http::HeaderMap>,
        #[pin]
        rest: B,
    }
}

impl<B: HttpBody<Data = Bytes>> HttpBody for Prefixed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(prefix) = this.prefix.take().filter(|p| !p.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        this.rest.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.trailers.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let extra = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = SizeHint::new();
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(extra));
        }
        hint.set_lower(rest.lower().saturating_add(extra));
        hint
    }
}
