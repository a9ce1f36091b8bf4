//! The layers in a plain hyper service stack, without axum: any request body in; the inner
//! service's `Full<Bytes>`, which the layers cannot write in, goes through them wrapped in
//! `GateBody`; over real HTTP on loopback. This test
//! target is also built with `--no-default-features` (see scripts/test).

#![allow(clippy::unwrap_used)]

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::net::TcpListener;
use tollgate::{Dimension, Limiter, ManualClock, MemoryStore, Policy, Tollgate};
use tollgate_tower::{DuplicateLayer, GateBody, PeerAddr, RateLimitLayer};
use tower::{ServiceBuilder, service_fn};

type Handler = fn(Request<GateBody<Incoming>>) -> Response<Full<Bytes>>;

/// Serves `app` (a hyper-only stack: a closure inserting `PeerAddr`, the tollgate layers, a
/// `service_fn` answering `Full<Bytes>`) on a free loopback port.
async fn serve(gate: Arc<Tollgate<MemoryStore>>, handler: Handler) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, ["2/1m".parse().unwrap()]))
        .build()
        .unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = ServiceBuilder::new()
                .map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(PeerAddr(peer));
                    request
                })
                .layer(RateLimitLayer::new(gate.clone(), policy.clone()))
                .layer(DuplicateLayer::idempotency_key(gate.clone(), "orders"))
                .service(service_fn(
                    // A body the layers cannot write in goes through them wrapped.
                    move |request: Request<GateBody<Incoming>>| async move {
                        Ok::<_, Infallible>(handler(request).map(GateBody::new))
                    },
                ));
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    addr
}

fn created(_: Request<GateBody<Incoming>>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"{\"id\":1}")));
    *response.status_mut() = http::StatusCode::CREATED;
    response
}

async fn send(addr: SocketAddr, key: &str) -> (http::response::Parts, Bytes) {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{addr}/orders"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), client.request(request))
        .await
        .expect("a hang detector, not a timing assertion")
        .unwrap();
    let (parts, body) = response.into_parts();
    (parts, body.collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn a_hyper_stack_is_limited_replayed_and_refused_with_a_problem() {
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let gate = Arc::new(Tollgate::new(MemoryStore::builder().clock(clock).build()));
    let addr = serve(gate, created).await;

    let (first, body) = send(addr, "a").await;
    assert_eq!(first.status, 201);
    assert_eq!(&body[..], b"{\"id\":1}");
    assert_eq!(first.headers["ratelimit"], r#""ip-1m";r=1;t=60"#);

    let (replay, body) = send(addr, "a").await;
    assert_eq!(
        replay.status, 201,
        "the same key replays the first response"
    );
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(&body[..], b"{\"id\":1}");

    let (denied, body) = send(addr, "b").await;
    assert_eq!(denied.status, 429, "the peer address came from PeerAddr");
    assert_eq!(denied.headers["content-type"], "application/problem+json");
    assert!(denied.headers.contains_key("retry-after"));
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["violated-policies"], serde_json::json!(["ip-1m"]));
}
