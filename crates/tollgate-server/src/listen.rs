//! The listeners' defences against slow and greedy clients.
//!
//! - HTTP: a connection has `header_read_timeout` to send a request head (and, kept alive, to
//!   start its next request), and each request `body_read_timeout` from the end of its head to
//!   deliver its body (else 408). At most `max_connections` are served at once; further
//!   connections wait in the kernel's accept queue until one closes.
//! - gRPC: the same cap on connections, and a connection that has not sent the HTTP/2 preface
//!   within `header_read_timeout` is closed. `serve_grpc` serves the gRPC service on hyper's
//!   HTTP/2 server directly.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::ConnectInfo,
};
use futures_util::{Stream, StreamExt as _};
use http_body::{Frame, SizeHint};
use hyper::{Request, body::Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};
use tower::ServiceExt as _;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The HTTP listener's limits (from `[server]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HttpLimits {
    pub(crate) header_read_timeout: Duration,
    pub(crate) body_read_timeout: Duration,
    pub(crate) max_connections: usize,
}

/// Serves `router` on `listener` over HTTP/1.1 until `stop` completes, then stops accepting
/// and waits for the open connections to finish their requests.
///
/// Each request carries [`ConnectInfo<SocketAddr>`] (the peer) and a body that fails with
/// [`BodyTimedOut`] once `body_read_timeout` has passed.
pub(crate) async fn serve_http(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    stop: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        // The permit comes first: over the cap, connections are left in the accept queue
        // rather than accepted and then starved.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small request/response pairs: Nagle's delay would dominate their latency.
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let body_timeout = limits.body_read_timeout;
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let (mut parts, body) = request.into_parts();
            parts.extensions.insert(ConnectInfo(peer));
            let body = Body::new(TimedBody::new(body, body_timeout));
            router.clone().oneshot(Request::from_parts(parts, body))
        });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(tcp), service));
        tokio::spawn(async move {
            // Errors here are the client's doing (reset, header timeout, malformed request);
            // hyper has answered what deserved an answer.
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "HTTP connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Accept errors that concern one connection are ignored; others (out of file descriptors)
/// would repeat at once, so the loop pauses before accepting again.
async fn accept_failed(e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept failed; pausing for 1s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// A request body that must arrive before a deadline.
struct TimedBody<B> {
    inner: B,
    deadline: Instant,
    timeout: Duration,
    /// Made on the first wait only: a body that is already there costs no timer.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> TimedBody<B> {
    fn new(inner: B, timeout: Duration) -> TimedBody<B> {
        TimedBody {
            inner,
            deadline: Instant::now() + timeout,
            timeout,
            sleep: None,
        }
    }
}

/// The error a request body gives when it did not arrive within `body_read_timeout`.
#[derive(Debug)]
pub(crate) struct BodyTimedOut(Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} (server.body_read_timeout)",
            tollgate::format_duration(self.0)
        )
    }
}

impl std::error::Error for BodyTimedOut {}

impl<B> http_body::Body for TimedBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        // Once the body has made us wait, the deadline is checked before every frame, so it
        // holds even while bytes keep coming.
        if let Some(sleep) = &mut this.sleep {
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.timeout)))));
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                ready!(sleep.as_mut().poll(cx));
                Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.timeout)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `service` (the gRPC service) over HTTP/2 on `incoming` until `stop` completes, then
/// stops accepting, tells each connection to finish (GOAWAY) and waits for their calls.
///
/// hyper's HTTP/2 server with its defaults (tonic's transport server uses the same) and at most
/// `max_concurrent_streams` calls in flight per connection; the service is the generated gRPC
/// service itself, without a router in front (it answers UNIMPLEMENTED to any other method).
pub(crate) async fn serve_grpc<I, T, S, B>(
    incoming: I,
    service: S,
    max_concurrent_streams: u32,
    stop: impl Future<Output = ()>,
) where
    I: Stream<Item = io::Result<T>>,
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: tower::Service<Request<Incoming>, Response = hyper::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(max_concurrent_streams);
    let graceful = GracefulShutdown::new();
    let mut incoming = std::pin::pin!(incoming);
    let mut stop = std::pin::pin!(stop);
    loop {
        let io = tokio::select! {
            next = incoming.next() => match next {
                Some(Ok(io)) => io,
                Some(Err(e)) => {
                    accept_failed(&e).await;
                    continue;
                }
                None => break,
            },
            () = &mut stop => break,
        };
        let connection = graceful.watch(
            builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service.clone())),
        );
        tokio::spawn(async move {
            if let Err(e) = woken_last(connection).await {
                tracing::debug!(error = %e, "gRPC connection ended");
            }
        });
    }
    graceful.shutdown().await;
}

/// Runs an HTTP/2 connection so that, each time a call wakes it, it waits until the other
/// tasks ready to run on this worker have run (`yield_now`) before it writes.
///
/// Each call runs in a task of its own; a call answered at once (the memory store) wakes the
/// connection to send its answer. Run at once, the connection would write that one answer
/// in a system call of its own, then the next call's, one write per call; run last, it writes
/// the answers of every call that finished meanwhile in one (the calls of one read are
/// answered in one write).
async fn woken_last<F: Future>(connection: F) -> F::Output {
    let mut connection = std::pin::pin!(connection);
    loop {
        let mut polled = false;
        let done = std::future::poll_fn(|cx| {
            if polled {
                // Woken: give way first.
                return Poll::Ready(None);
            }
            polled = true;
            connection.as_mut().poll(cx).map(Some)
        })
        .await;
        if let Some(output) = done {
            return output;
        }
        tokio::task::yield_now().await;
    }
}

/// The bytes an HTTP/2 client sends first: the 24-byte preface and a SETTINGS frame header.
const H2_OPENING: usize = 24 + 9;

/// Limits the gRPC listener's `incoming` connections to `max_connections` at once (further
/// ones wait in the accept queue) and closes a connection that has not sent its HTTP/2
/// opening within `handshake_timeout`.
pub(crate) fn limit_grpc<S, T>(
    incoming: S,
    max_connections: usize,
    handshake_timeout: Duration,
) -> impl Stream<Item = io::Result<Limited<T>>>
where
    S: Stream<Item = io::Result<T>> + Unpin,
{
    let permits = Arc::new(Semaphore::new(max_connections));
    futures_util::stream::unfold(
        (incoming, permits),
        move |(mut incoming, permits)| async move {
            let permit = permits.clone().acquire_owned().await.ok()?;
            let next = incoming.next().await?;
            let item = next.map(|io| Limited {
                io,
                _permit: permit,
                opening: Some((0, Box::pin(tokio::time::sleep(handshake_timeout)))),
            });
            Some((item, (incoming, permits)))
        },
    )
}

/// A gRPC connection holding its share of the connection cap until it is dropped.
pub(crate) struct Limited<T> {
    io: T,
    _permit: OwnedSemaphorePermit,
    /// Bytes read so far and the deadline, until the HTTP/2 opening has been read.
    opening: Option<(usize, Pin<Box<Sleep>>)>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Limited<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some((read, deadline)) = &mut this.opening {
            // Checked before every read, so the deadline holds even while bytes keep coming.
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 preface within server.header_read_timeout",
                )));
            }
            let before = buf.filled().len();
            let polled = Pin::new(&mut this.io).poll_read(cx, buf);
            if let Poll::Ready(Ok(())) = polled {
                *read += buf.filled().len() - before;
                if *read >= H2_OPENING {
                    this.opening = None;
                }
            }
            return polled;
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Limited<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Limited<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> T::ConnectInfo {
        self.io.connect_info()
    }
}

/// The peer of a request served by [`serve_http`], if it came through it.
pub(crate) fn peer(extensions: &axum::http::Extensions) -> Option<SocketAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| *addr)
}
