//! What the rate-limit layer allocates per request, beyond what axum and http allocate for the
//! same route without it: counted by `allocation-counter`'s global allocator, per thread.

#![allow(clippy::unwrap_used)]

use std::{net::SocketAddr, sync::Arc};

use axum::{Router, body::Body, extract::ConnectInfo, routing::get};
use http::Request;
use tollgate::{Algorithm, Dimension, Limiter, MemoryStore, Policy, Rule, Tollgate};
use tollgate_tower::RateLimitLayer;
use tower::ServiceExt as _;

/// Allocations of one request to `app` from `peer`, its response body read to the end.
fn allocations(rt: &tokio::runtime::Runtime, app: &Router, peer: SocketAddr) -> u64 {
    let info = allocation_counter::measure(|| {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = rt.block_on(app.clone().oneshot(request)).unwrap();
        assert_eq!(response.status(), 200);
        let body = rt.block_on(axum::body::to_bytes(response.into_body(), 64));
        assert_eq!(&body.unwrap()[..], b"ok");
    });
    info.count_total
}

/// What the rate-limit layer allocates per admitted request beyond what any layer on an axum
/// route costs: the `RateLimit` field's value (`RateLimit-Policy` is made once per layer), and
/// one not traced yet (not the layer's clone of its inner service, which a check decided at
/// once no longer takes: the count did not change when it went). The response passes through
/// in axum's own body, which axum does not box again (a layer answering its own body type
/// cost one more). The memory store's check itself allocates nothing, and is decided when the
/// layer is called: no boxed check future.
const LAYER_ALLOCATIONS: u64 = 2;

#[test]
fn the_layer_allocates_a_bounded_few_per_request() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let bare = Router::new().route("/", get(|| async { "ok" }));
    let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    let rule: Rule = "1000000/1h".parse().unwrap();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(
            Dimension::Ip,
            [rule.with_algorithm(Algorithm::Gcra)],
        ))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(gate, policy);
    let limited = Router::new().route("/", get(|| async { "ok" }).layer(layer.clone()));
    let quiet = Router::new().route("/", get(|| async { "ok" }).layer(layer.headers(false)));
    // A layer that does nothing: what any layer on a route costs in axum.
    let noop = Router::new().route(
        "/",
        get(|| async { "ok" }).layer(tower::util::MapResponseLayer::new(|r| r)),
    );
    let peer: SocketAddr = "192.0.2.7:4000".parse().unwrap();
    // The peer's key exists, and every lazy initialization is done.
    for _ in 0..3 {
        for app in [&bare, &noop, &limited, &quiet] {
            allocations(&rt, app, peer);
        }
    }
    let bare = allocations(&rt, &bare, peer);
    let limited = allocations(&rt, &limited, peer);
    let quiet = allocations(&rt, &quiet, peer);
    let noop = allocations(&rt, &noop, peer);
    let added = limited - noop;
    eprintln!(
        "allocations per request: bare route {bare}, a no-op layer {noop}, the rate-limit layer \
         {limited}, without its headers {quiet}"
    );
    assert!(
        added <= LAYER_ALLOCATIONS,
        "the layer added {added} allocations"
    );
    assert!(quiet < limited, "the headers cost their field");
    assert!(
        quiet - noop < LAYER_ALLOCATIONS,
        "without its headers the layer added {} allocations",
        quiet - noop
    );
}
