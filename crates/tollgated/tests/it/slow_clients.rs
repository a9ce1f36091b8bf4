//! Slow and greedy clients: header and body read timeouts, the connection cap, gRPC message
//! size and handshake limits.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::support::{HANG, Server, descriptor, error_message};

const POLICY: &str = r#"
[policies.api]
limiters = [{ by = "ip", rules = ["1000000/1m"] }]

[[envoy.domains]]
name = "edge"
descriptors = [{ key = "remote_address", rules = ["1000/1m"] }]
"#;

fn config(server: &str) -> String {
    format!("[server]\n{server}\n{POLICY}")
}

/// `host:port` of an `http://host:port` base URL.
fn addr(base: &str) -> &str {
    base.trim_start_matches("http://")
}

/// Reads until the peer closes the connection or `HANG` passes; returns what was read.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "the server kept the connection open for {HANG:?}; read so far: {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

/// A well-behaved gRPC client is answered.
async fn envoy_answers(server: &Server) {
    let mut client = server.grpc_client().await;
    let response = crate::support::should_rate_limit(
        &mut client,
        "edge",
        vec![descriptor(&[("remote_address", "192.0.2.1")])],
        1,
    )
    .await;
    assert_eq!(response.overall_code, 1, "{response:?}");
}

/// Splits a raw HTTP/1.1 response into its status and JSON body.
fn parse_response(raw: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    (status, body)
}

/// Several hundred connections trickle request heads and reconnect when dropped, for two
/// seconds; meanwhile a normal client's checks keep answering, and the server drops every
/// trickler once its header timeout has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_closed_and_checks_still_answer() {
    const TRICKLERS: usize = 300;
    const HEADER_TIMEOUT: Duration = Duration::from_millis(300);
    // All from one address: its share of connections is raised to hold them all.
    let server = Server::start(&config(
        "header_read_timeout = \"300ms\"\nmax_connections_per_ip = 1000",
    ));
    let target = addr(&server.http).to_owned();

    let attacking = Arc::new(AtomicBool::new(true));
    let closed = Arc::new(AtomicUsize::new(0));
    let mut tricklers = Vec::new();
    for i in 0..TRICKLERS {
        let (target, attacking, closed) = (target.clone(), attacking.clone(), closed.clone());
        tricklers.push(tokio::spawn(async move {
            // The longest a connection stayed open, and the shortest (to compare with the
            // header timeout).
            let (mut longest, mut shortest) = (Duration::ZERO, Duration::MAX);
            while attacking.load(Ordering::Relaxed) {
                // Timed from before the connection exists: the server's timer cannot have
                // started earlier.
                let opened = Instant::now();
                let mut stream = TcpStream::connect(&target).await.unwrap();
                let head = format!("POST /v1/check HTTP/1.1\r\nHost: localhost\r\nX-Slow-{i}: ");
                let mut pending = head.as_bytes().iter().copied().cycle();
                let mut buf = [0u8; 1024];
                let mut answered = Vec::new();
                loop {
                    tokio::select! {
                        read = stream.read(&mut buf) => match read {
                            Ok(0) | Err(_) => break,
                            Ok(n) => answered.extend_from_slice(&buf[..n]),
                        },
                        () = tokio::time::sleep(Duration::from_millis(50)) => {
                            let byte = [pending.next().unwrap_or(b'a')];
                            if stream.write_all(&byte).await.is_err() {
                                break;
                            }
                        }
                    }
                    assert!(
                        opened.elapsed() < HANG,
                        "a trickling connection stayed open for {HANG:?}"
                    );
                }
                let lived = opened.elapsed();
                // hyper may say 408 before closing; it never answers the request itself.
                let text = String::from_utf8_lossy(&answered);
                assert!(
                    text.is_empty() || text.starts_with("HTTP/1.1 408"),
                    "a trickling request was answered: {text:?}"
                );
                closed.fetch_add(1, Ordering::Relaxed);
                longest = longest.max(lived);
                shortest = shortest.min(lived);
            }
            (longest, shortest)
        }));
    }

    // The normal client: checks one after another for two seconds.
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut checks = 0;
    while started.elapsed() < Duration::from_secs(2) {
        let sent = Instant::now();
        let response = client
            .post(format!("{}/v1/check", server.http))
            .json(&json!({ "policy": "api", "identity": { "ip": "192.0.2.1" } }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["allowed"], true, "{body}");
        slowest = slowest.max(sent.elapsed());
        checks += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    attacking.store(false, Ordering::Relaxed);
    let mut longest = Duration::ZERO;
    let mut shortest = Duration::MAX;
    for t in tricklers {
        let (l, s) = t.await.unwrap();
        longest = longest.max(l);
        shortest = shortest.min(s);
    }
    let closed = closed.load(Ordering::Relaxed);
    println!(
        "{checks} checks under {TRICKLERS} trickling connections: slowest {slowest:?}; \
         {closed} trickling connections closed by the server after {shortest:?} to {longest:?}"
    );
    // Loose bounds, printed figures: they catch a server that stops answering, not a slow
    // shared machine (about 20 ms is typical on two cores).
    assert!(checks >= 3, "only {checks} checks in two seconds");
    assert!(
        slowest < Duration::from_secs(5),
        "a check took {slowest:?} under attack"
    );
    // Every trickler was closed at least once, and none before its header timeout.
    assert!(closed >= TRICKLERS, "{closed} closed");
    assert!(
        shortest >= HEADER_TIMEOUT - Duration::from_millis(20),
        "{shortest:?}"
    );
}

/// A connection that sends nothing at all is closed after the header timeout too.
#[tokio::test]
async fn silent_connections_are_closed() {
    let server = Server::start(&config("header_read_timeout = \"300ms\""));
    // Timed from before the connection: the server's timer starts after it accepts.
    let opened = Instant::now();
    let mut stream = TcpStream::connect(addr(&server.http)).await.unwrap();
    read_to_close(&mut stream).await;
    assert!(
        opened.elapsed() >= Duration::from_millis(280),
        "{:?}",
        opened.elapsed()
    );
    // The gRPC port: no HTTP/2 preface within the header timeout closes the connection.
    let mut stream = TcpStream::connect(addr(&server.grpc)).await.unwrap();
    read_to_close(&mut stream).await;
    // Nor does trickling the preface and a SETTINGS frame a byte at a time keep it open.
    let mut stream = TcpStream::connect(addr(&server.grpc)).await.unwrap();
    let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    opening.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let mut sent = 0;
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {} // the server's SETTINGS
            },
            () = tokio::time::sleep(Duration::from_millis(100)), if sent < opening.len() => {
                if stream.write_all(&opening[sent..=sent]).await.is_err() {
                    break;
                }
                sent += 1;
            }
            () = tokio::time::sleep(HANG), if sent == opening.len() => {
                panic!("a trickled HTTP/2 opening kept the connection open");
            }
        }
    }
    assert!(sent < opening.len(), "closed only after the whole opening");
    // Well-behaved clients are served on both.
    assert_eq!(server.get("/healthz").await.0, 200);
    envoy_answers(&server).await;
}

/// A body that does not arrive in time, or trickles in, gets 408 with the usual JSON error.
#[tokio::test]
async fn late_bodies_get_408_with_a_json_error() {
    let server = Server::start(&config("body_read_timeout = \"300ms\""));
    let head = "POST /v1/check HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                Content-Length: 100\r\n\r\n";

    // Part of the body, then nothing.
    let mut stream = TcpStream::connect(addr(&server.http)).await.unwrap();
    stream
        .write_all(format!("{head}{{\"policy\": ").as_bytes())
        .await
        .unwrap();
    let (status, body) = parse_response(&read_to_close(&mut stream).await);
    let message = error_message(status, &body, 408);
    assert_eq!(
        message,
        "the request body did not arrive within 300ms (server.body_read_timeout)"
    );

    // The body trickled a byte at a time: never idle, still late.
    let mut stream = TcpStream::connect(addr(&server.http)).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
    });
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(HANG, reader.read_to_end(&mut raw))
        .await
        .expect("the server answered a trickled body");
    trickle.abort();
    let (status, body) = parse_response(&raw);
    error_message(status, &body, 408);

    // A body that arrives in time is served as always.
    let (status, _) = server
        .post(
            "/v1/check",
            json!({ "policy": "api", "identity": { "ip": "192.0.2.1" } }),
        )
        .await;
    assert_eq!(status, 200);
}

/// Over `max_connections`, a new connection waits until an open one closes.
#[tokio::test]
async fn connections_over_the_cap_wait_for_a_free_slot() {
    let server = Server::start(&config(
        "max_connections = 1\nheader_read_timeout = \"30s\"",
    ));
    let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

    // The first connection is served and stays open (keep-alive), holding the only slot.
    let mut first = TcpStream::connect(addr(&server.http)).await.unwrap();
    first.write_all(request).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(HANG, first.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );

    // The second is left in the accept queue: its request is not answered...
    let mut second = TcpStream::connect(addr(&server.http)).await.unwrap();
    second.write_all(request).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(500), second.read(&mut buf)).await;
    assert!(
        waited.is_err(),
        "a connection over the cap was served: {waited:?}"
    );
    // ...until the first closes.
    drop(first);
    let n = tokio::time::timeout(HANG, second.read(&mut buf))
        .await
        .expect("the waiting connection was never served")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
}

/// A gRPC request over `grpc_max_message_bytes` gets OUT_OF_RANGE; the server carries on.
#[tokio::test]
async fn oversized_grpc_requests_are_refused_with_a_status() {
    let server = Server::start(&config("grpc_max_message_bytes = 1024"));
    let mut client = server.grpc_client().await;
    let huge = "x".repeat(4096);
    let status = client
        .should_rate_limit(
            envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![descriptor(&[("remote_address", &huge)])],
                hits_addend: 1,
            },
        )
        .await
        .expect_err("an oversized request was accepted");
    assert!(
        matches!(
            status.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{status:?}"
    );
    assert!(status.message().contains("1024"), "{status:?}");

    // The same connection still serves requests of a normal size.
    let response = crate::support::should_rate_limit(
        &mut client,
        "edge",
        vec![descriptor(&[("remote_address", "192.0.2.1")])],
        1,
    )
    .await;
    assert_eq!(response.overall_code, 1, "{response:?}");
}

/// One address holds at most `max_connections_per_ip` connections on each port: one more is
/// closed at once, unanswered, and a freed share is taken again.
#[tokio::test]
async fn one_address_holds_its_share_of_connections() {
    let server = Server::start(&config(
        "max_connections_per_ip = 2\nheader_read_timeout = \"30s\"",
    ));
    let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let served = |mut stream: TcpStream| async move {
        stream.write_all(request).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(HANG, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        (
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            stream,
        )
    };
    let (ok, first) = served(TcpStream::connect(addr(&server.http)).await.unwrap()).await;
    assert!(ok);
    let (ok, _second) = served(TcpStream::connect(addr(&server.http)).await.unwrap()).await;
    assert!(ok);
    let mut third = TcpStream::connect(addr(&server.http)).await.unwrap();
    let _ = third.write_all(request).await;
    assert!(
        read_to_close(&mut third).await.is_empty(),
        "the third was answered"
    );
    drop(first);
    // The first's share comes back once the server has seen it close.
    let deadline = Instant::now() + HANG;
    loop {
        let (ok, _) = served(TcpStream::connect(addr(&server.http)).await.unwrap()).await;
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "the freed share never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The gRPC port counts its own.
    let opening = |mut stream: TcpStream| async move {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        stream.write_all(&bytes).await.unwrap();
        stream
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = opening(TcpStream::connect(addr(&server.grpc)).await.unwrap()).await;
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(HANG, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the server's SETTINGS");
        held.push(stream);
    }
    let mut third = opening(TcpStream::connect(addr(&server.grpc)).await.unwrap()).await;
    assert!(
        read_to_close(&mut third).await.is_empty(),
        "the third was served"
    );
}

/// A gRPC connection that sends nothing after its opening is closed after `idle_timeout`.
#[tokio::test]
async fn idle_grpc_connections_are_closed() {
    let server = Server::start(&config("idle_timeout = \"500ms\""));
    // Timed from before the connection's opening: the server's idle timer starts after it.
    let opened = Instant::now();
    let mut stream = TcpStream::connect(addr(&server.grpc)).await.unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    stream.write_all(&bytes).await.unwrap();
    read_to_close(&mut stream).await;
    assert!(
        opened.elapsed() >= Duration::from_millis(450),
        "{:?}",
        opened.elapsed()
    );
    // A client that calls is served as always.
    envoy_answers(&server).await;
}

/// A client that sends requests but never reads the answers is closed once the server's
/// writes have made no progress for `write_timeout`.
#[tokio::test]
async fn clients_that_do_not_read_are_closed() {
    let server = Server::start(&config("write_timeout = \"300ms\""));
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket
        .connect(addr(&server.http).parse().unwrap())
        .await
        .unwrap();
    let (_reader, mut writer) = stream.into_split();
    let request = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(64);
    let closed = tokio::time::timeout(HANG, async {
        loop {
            if writer.write_all(&request).await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a client that never reads kept its connection"
    );
    assert_eq!(server.get("/healthz").await.0, 200);
}

/// At most `max_health_watches` Watch streams are open at once; Check always answers.
#[tokio::test]
async fn health_watch_streams_are_bounded() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let server = Server::start(&config("max_health_watches = 2"));
    let mut health = HealthClient::new(
        tonic::transport::Endpoint::from_shared(server.grpc.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let watch = || HealthCheckRequest {
        service: String::new(),
    };
    let mut first = health.watch(watch()).await.unwrap().into_inner();
    first.message().await.unwrap().expect("a status");
    let mut second = health.watch(watch()).await.unwrap().into_inner();
    second.message().await.unwrap().expect("a status");
    let refused = match health.watch(watch()).await {
        Ok(response) => response.into_inner().message().await.unwrap_err(),
        Err(status) => status,
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(health.check(watch()).await.is_ok());
    drop(first);
    let deadline = Instant::now() + HANG;
    loop {
        if let Ok(response) = health.watch(watch()).await {
            if response.into_inner().message().await.is_ok() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "a closed Watch never gave its place back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gRPC call whose message never ends is answered within `body_read_timeout`, as an HTTP
/// request's body: one that declared a large message and sent a part of it held what it
/// declared until its connection closed (and pings keep a connection open).
#[tokio::test]
async fn a_grpc_message_that_never_ends_is_answered_within_the_body_timeout() {
    use bytes::Bytes;
    use http_body::Frame;

    let server = Server::start(&config(
        "body_read_timeout = \"300ms\"\nidle_timeout = \"60s\"",
    ));
    let tcp = TcpStream::connect(addr(&server.grpc)).await.unwrap();
    let (mut send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let (frames, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    let body = Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    }));
    let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let request = http::Request::post(format!("{}{path}", server.grpc))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::StreamBody::new(body))
        .unwrap();
    // A message of 100 bytes, declared; 10 of them sent, then nothing more.
    let mut partial = vec![0u8, 0, 0, 0, 100];
    partial.extend_from_slice(&[0; 10]);
    frames
        .send(Ok(Frame::data(Bytes::from(partial))))
        .await
        .unwrap();
    let answered = tokio::time::timeout(HANG, send.send_request(request))
        .await
        .expect("the call was held past the body timeout");
    // Answered with a gRPC error, or its stream reset: either way, let go.
    if let Ok(response) = answered {
        let status = response.headers().get("grpc-status");
        assert!(status.is_some_and(|s| s != "0"), "{response:?}");
    }
    drop(frames);
}

/// `Max open files` of a process: (soft, hard), `None` for unlimited.
fn open_files(pid: &str) -> (Option<u64>, Option<u64>) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_owned();
    let mut values = line["Max open files".len()..]
        .split_whitespace()
        .map(|v| v.parse().ok());
    (values.next().flatten(), values.next().flatten())
}

/// The server raises its open-file soft limit to the hard one at start: its two listeners'
/// connections (10,000 each by default) are far past a common soft limit of 1,024, and a
/// process out of descriptors stops accepting on both ports.
#[tokio::test]
async fn the_open_file_limit_is_raised_to_the_hard_one() {
    let (_, hard) = open_files("self");
    assert!(
        hard.is_none_or(|h| h > 256),
        "this machine's hard limit leaves nothing to raise: {hard:?}"
    );
    let server = Server::start_with_open_files(&config(""), 256);
    let (soft, raised_hard) = open_files(&server.pid().to_string());
    assert_eq!(raised_hard, hard, "the hard limit stays");
    assert!(soft.is_none_or(|s| s > 256), "{soft:?}");
    assert_eq!(soft, hard.or(soft), "raised to the hard limit");
}
