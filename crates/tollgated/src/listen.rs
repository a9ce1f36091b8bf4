//! The listeners' defences against slow and greedy clients.
//!
//! - Both ports: at most `max_connections` are served at once (further connections wait in
//!   the kernel's accept queue until one closes), at most `max_connections_per_ip` from one
//!   client address (an IPv6 /64 counts as one address; more are closed as they are accepted),
//!   and a response write that makes no progress for `write_timeout` (a client that does not
//!   read) closes its connection.
//! - HTTP: a connection has `header_read_timeout` to send a request head (and, kept alive, to
//!   start its next request), and each request `body_read_timeout` from the end of its head to
//!   deliver its body (else 408). A request naming a `Host` outside `allowed_hosts` is refused
//!   with 421 (a web page that rebinds its DNS name to this address cannot reach the API).
//! - gRPC: a connection that has not sent the HTTP/2 preface within `header_read_timeout`, or
//!   that sends nothing for `idle_timeout`, is closed. `serve_grpc` serves the gRPC service on
//!   hyper's HTTP/2 server directly.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex},
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
    pub(crate) connections: ConnLimits,
}

/// The host names an HTTP request may name (`server.allowed_hosts`, compared without the port
/// and case); `None` allows any.
pub(crate) type AllowedHosts = Option<Arc<[String]>>;

/// Whether the request's `Host` is allowed: one of `allowed` (without its port), or none sent
/// (a browser always sends one).
fn host_allowed(allowed: &[String], headers: &axum::http::HeaderMap) -> bool {
    let Some(host) = headers.get(axum::http::header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    // `[::1]:8080`, `localhost:8080`, `example.com`: the name without the port.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(name, _)| name),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// What any one listener allows its connections (from `[server]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    pub(crate) max_connections: usize,
    pub(crate) max_per_ip: usize,
    pub(crate) write_timeout: Duration,
}

/// The connections each client address holds on one listener.
pub(crate) struct PerIp {
    max: usize,
    held: Mutex<HashMap<u128, usize>>,
}

impl PerIp {
    pub(crate) fn new(max: usize) -> Arc<PerIp> {
        Arc::new(PerIp {
            max,
            held: Mutex::default(),
        })
    }

    /// A ticket for one more connection of `ip`, or `None` if it holds its share.
    fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<IpTicket> {
        let key = ip_key(ip);
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = held.entry(key).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(IpTicket {
            per_ip: self.clone(),
            key,
        })
    }
}

/// An address's share of the connections: an IPv4 address, or an IPv6 address's /64 (one
/// client holds a whole /64). IPv4 keys have bit 32 set, IPv6 keys none of their low 64 bits:
/// no two collide.
fn ip_key(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => (1 << 32) | u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6) & !u128::from(u64::MAX),
    }
}

/// One connection counted against its address, until dropped.
pub(crate) struct IpTicket {
    per_ip: Arc<PerIp>,
    key: u128,
}

impl Drop for IpTicket {
    fn drop(&mut self) {
        let mut held = self
            .per_ip
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
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
    hosts: AllowedHosts,
    stop: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.connections.max_connections));
    let per_ip = PerIp::new(limits.connections.max_per_ip);
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
        let Some(ticket) = per_ip.enter(peer.ip()) else {
            tracing::debug!(%peer, "HTTP connection refused: its address holds server.max_connections_per_ip");
            continue;
        };
        // Small request/response pairs: Nagle's delay would dominate their latency.
        let _ = tcp.set_nodelay(true);
        let io = Guarded::new(tcp, permit, Some(ticket), limits.connections.write_timeout);
        let router = router.clone();
        let body_timeout = limits.body_read_timeout;
        let hosts = hosts.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let (mut parts, body) = request.into_parts();
            let refused = hosts
                .as_deref()
                .is_some_and(|allowed| !host_allowed(allowed, &parts.headers));
            parts.extensions.insert(ConnectInfo(peer));
            let body = Body::new(TimedBody::new(body, body_timeout));
            let answer = router.clone().oneshot(Request::from_parts(parts, body));
            async move {
                if refused {
                    return Ok(misdirected());
                }
                answer.await
            }
        });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            // Errors here are the client's doing (reset, header timeout, malformed request,
            // unread response); hyper has answered what deserved an answer.
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "HTTP connection ended");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The answer to a request for a host this server does not serve.
#[cold]
fn misdirected() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    crate::http::ApiError::new(
        axum::http::StatusCode::MISDIRECTED_REQUEST,
        "this server does not serve that Host (server.allowed_hosts)",
    )
    .with_code("host_not_allowed")
    .into_response()
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

/// A request body that must arrive before a deadline (none: a stream's, which lasts).
pub(crate) struct TimedBody<B> {
    inner: B,
    deadline: Option<Instant>,
    timeout: Duration,
    /// Made on the first wait only: a body that is already there costs no timer.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> TimedBody<B> {
    fn new(inner: B, timeout: Duration) -> TimedBody<B> {
        TimedBody {
            inner,
            deadline: Some(Instant::now() + timeout),
            timeout,
            sleep: None,
        }
    }

    /// A body without a deadline.
    fn lasting(inner: B) -> TimedBody<B> {
        TimedBody {
            inner,
            deadline: None,
            timeout: Duration::ZERO,
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
                let Some(deadline) = this.deadline else {
                    return Poll::Pending;
                };
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
/// With `peers`, each request carries its connection's peer (for authentication). The message
/// of a call that is not a stream must arrive within `body_read_timeout`, as an HTTP request's
/// body: a call whose message never ends would hold what it declared until its connection
/// closes (and pings keep a connection open).
pub(crate) async fn serve_grpc<I, T, S, B>(
    incoming: I,
    service: S,
    (max_concurrent_streams, peers, body_read_timeout): (u32, bool, Duration),
    tls: Option<(tokio_rustls::TlsAcceptor, Duration)>,
    stop: impl Future<Output = ()>,
) where
    I: Stream<Item = io::Result<T>>,
    T: AsyncRead + AsyncWrite + Send + Unpin + tonic::transport::server::Connected + 'static,
    S: tower::Service<Request<TimedBody<Incoming>>, Response = hyper::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    use tower::ServiceExt as _;
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
        let watcher = graceful.watcher();
        // Each request carries its connection's peer, as tonic's own server gives it
        // (`tonic::Request::remote_addr`): the check scope counts failures by address.
        let connected = peers.then(|| io.connect_info());
        let service = service
            .clone()
            .map_request(move |request: Request<Incoming>| {
                let (mut parts, body) = request.into_parts();
                if let Some(connected) = &connected {
                    parts.extensions.insert(connected.clone());
                }
                let body = if is_stream(parts.uri.path()) {
                    TimedBody::lasting(body)
                } else {
                    TimedBody::new(body, body_read_timeout)
                };
                Request::from_parts(parts, body)
            });
        let (builder, tls) = (builder.clone(), tls.clone());
        tokio::spawn(async move {
            let ended = match tls {
                None => serve_h2(&builder, watcher, io, service).await,
                // The handshake within the same deadline as a plaintext connection's opening.
                Some((acceptor, deadline)) => {
                    match tokio::time::timeout(deadline, acceptor.accept(io)).await {
                        Ok(Ok(io)) => {
                            let io = Guarded::opening_only(io, deadline);
                            serve_h2(&builder, watcher, io, service).await
                        }
                        Ok(Err(e)) => Err(e.into()),
                        Err(_) => Err("no TLS handshake within server.header_read_timeout".into()),
                    }
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "gRPC connection ended");
            }
        });
    }
    graceful.shutdown().await;
}

/// Whether a gRPC method's request is a stream (RLQS reports, health watches), which lasts as
/// long as its call: every other call's one message has a deadline.
fn is_stream(path: &str) -> bool {
    matches!(
        path,
        "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
            | "/grpc.health.v1.Health/Watch"
    )
}

/// Serves one HTTP/2 connection on `io` until it ends (or shutdown, through `watcher`).
async fn serve_h2<IO, S, B>(
    builder: &hyper::server::conn::http2::Builder<TokioExecutor>,
    watcher: hyper_util::server::graceful::Watcher,
    io: IO,
    service: S,
) -> Result<(), BoxError>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: tower::Service<Request<Incoming>, Response = hyper::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let connection = watcher
        .watch(builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service)));
    woken_last(connection).await.map_err(Into::into)
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

/// Limits the gRPC listener's `incoming` connections to `limits` (further ones wait in the
/// accept queue; one past its address's share is closed), and closes a connection that has not
/// sent its HTTP/2 opening within `handshake_timeout` or sends nothing for `idle_timeout`.
pub(crate) fn limit_grpc<S, T>(
    incoming: S,
    limits: ConnLimits,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    peer: impl Fn(&T) -> Option<IpAddr> + Copy,
) -> impl Stream<Item = io::Result<Guarded<T>>>
where
    S: Stream<Item = io::Result<T>> + Unpin,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let per_ip = PerIp::new(limits.max_per_ip);
    futures_util::stream::unfold(
        (incoming, permits, per_ip),
        move |(mut incoming, permits, per_ip)| async move {
            loop {
                let permit = permits.clone().acquire_owned().await.ok()?;
                let io = match incoming.next().await? {
                    Ok(io) => io,
                    Err(e) => return Some((Err(e), (incoming, permits, per_ip))),
                };
                let ticket = match peer(&io) {
                    Some(ip) => match per_ip.enter(ip) {
                        Some(ticket) => Some(ticket),
                        None => {
                            tracing::debug!(%ip, "gRPC connection refused: its address holds server.max_connections_per_ip");
                            continue;
                        }
                    },
                    None => None,
                };
                let mut io = Guarded::new(io, permit, ticket, limits.write_timeout);
                io.opening = Some((0, Box::pin(tokio::time::sleep(handshake_timeout))));
                io.idle = Some((idle_timeout, Box::pin(tokio::time::sleep(idle_timeout))));
                return Some((Ok(io), (incoming, permits, per_ip)));
            }
        },
    )
}

/// A connection holding its share of the connection caps until it is dropped, closed (with
/// `TimedOut`) when its client stalls: no HTTP/2 opening in time, nothing sent for the idle
/// timeout (where set), or a write that makes no progress for the write timeout.
pub(crate) struct Guarded<T> {
    io: T,
    _permit: Option<OwnedSemaphorePermit>,
    _ticket: Option<IpTicket>,
    /// Bytes read so far and the deadline, until the HTTP/2 opening has been read.
    opening: Option<(usize, Pin<Box<Sleep>>)>,
    /// How long the client may send nothing, and when that ends now.
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    /// `None`: writes are watched by the stream beneath (see `opening_only`).
    write_timeout: Option<Duration>,
    /// Since a write first found the socket full: when the connection gives up.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> Guarded<T> {
    fn new(
        io: T,
        permit: OwnedSemaphorePermit,
        ticket: Option<IpTicket>,
        write_timeout: Duration,
    ) -> Guarded<T> {
        Guarded {
            io,
            _permit: Some(permit),
            _ticket: ticket,
            opening: None,
            idle: None,
            write_timeout: Some(write_timeout),
            stalled: None,
        }
    }

    /// Only the HTTP/2 opening's deadline, for a stream inside a guarded one: over TLS, the
    /// connection's own deadline counted the handshake's bytes, not the preface.
    fn opening_only(io: T, timeout: Duration) -> Guarded<T> {
        Guarded {
            io,
            _permit: None,
            _ticket: None,
            opening: Some((0, Box::pin(tokio::time::sleep(timeout)))),
            idle: None,
            write_timeout: None,
            stalled: None,
        }
    }

    /// A write's outcome, with the stall deadline kept: started when a write first waits,
    /// cleared when one goes through, an error once it has passed.
    fn written<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        let Some(timeout) = self.write_timeout.filter(|_| polled.is_pending()) else {
            self.stalled = None;
            return polled;
        };
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for server.write_timeout",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Checked before every read, so the deadlines hold even while bytes keep coming.
        if let Some((_, deadline)) = &mut this.opening {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 preface within server.header_read_timeout",
                )));
            }
        }
        if let Some((_, deadline)) = &mut this.idle {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent nothing for server.idle_timeout",
                )));
            }
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if let (Poll::Ready(Ok(())), true) = (&polled, read > 0) {
            if let Some((bytes, _)) = &mut this.opening {
                *bytes += read;
                if *bytes >= H2_OPENING {
                    this.opening = None;
                }
            }
            if let Some((timeout, deadline)) = &mut this.idle {
                deadline.as_mut().reset(Instant::now() + *timeout);
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.written(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.written(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.written(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<T> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_compared_without_their_port() {
        let allowed: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        let with = |host: &str| {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert(axum::http::header::HOST, host.parse().unwrap());
            host_allowed(&allowed, &headers)
        };
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(with(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "[::2]",
        ] {
            assert!(!with(refused), "{refused}");
        }
        assert!(
            host_allowed(&allowed, &axum::http::HeaderMap::new()),
            "no Host"
        );
    }
}
