//! Sends N requests through one axum route, bare or behind a rate-limit layer, for instruction
//! counts of what a layer adds (they do not depend on load):
//!
//! ```sh
//! cargo build --release -p tollgate-bench --example probe_layer
//! valgrind --tool=callgrind --toggle-collect='probe_layer::requests' \
//!     target/release/examples/probe_layer tollgate 20000
//! ```
//!
//! Cases, as in the criterion group `middleware/gcra_1rule`: `bare`, `tollgate`,
//! `tollgate_no_headers`, `tower_governor`, `tower_governor_headers`. Only the measured loop
//! (`requests`, after a round that creates every key and starts the clocks) is counted; a case's figure less
//! `bare`'s is what its layer adds to a request.

use std::{hint::black_box, net::SocketAddr, sync::Arc};

use axum::{
    Router,
    body::Body,
    extract::ConnectInfo,
    http::{Request, StatusCode},
    routing::get,
};
use tollgate::{Algorithm, Dimension, Limiter, MemoryStore, Policy, Rule, Tollgate};
use tollgate_bench::client_ip;
use tollgate_tower::RateLimitLayer;
use tower::ServiceExt;
use tower_governor::{GovernorLayer, governor::GovernorConfigBuilder};

const CLIENTS: u32 = 4096;

fn app(case: &str) -> Router {
    let route = Router::new().route("/", get(|| async { "ok" }));
    // One unit every microsecond on either side. tollgate's rule has a window of an hour, not
    // the benchmark's second, so that no key expires while the probe runs slowly under
    // valgrind (which would count key creation); a check costs the same.
    let tollgate = |headers: bool| {
        let rule: Rule = "3600000000/1h".parse().expect("a valid rule");
        let policy = Policy::builder("bench")
            .limiter(Limiter::new(
                Dimension::Ip,
                [rule.with_algorithm(Algorithm::Gcra)],
            ))
            .build()
            .expect("a valid policy");
        RateLimitLayer::new(Arc::new(Tollgate::new(MemoryStore::new())), policy).headers(headers)
    };
    let mut governor = GovernorConfigBuilder::default();
    governor.per_nanosecond(1_000).burst_size(1_000_000);
    match case {
        "bare" => route,
        "tollgate" => route.layer(tollgate(true)),
        "tollgate_no_headers" => route.layer(tollgate(false)),
        "tower_governor" => {
            let config = governor.finish().expect("a valid governor config");
            route.layer(GovernorLayer::new(config))
        }
        "tower_governor_headers" => {
            let config = governor.use_headers().finish();
            route.layer(GovernorLayer::new(config.expect("a valid governor config")))
        }
        other => panic!("unknown case {other}"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_else(|| "tollgate".into());
    let n: u32 = args.next().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let peers: Vec<ConnectInfo<SocketAddr>> = (0..CLIENTS)
        .map(|i| ConnectInfo(SocketAddr::new(client_ip(i), 40_000)))
        .collect();
    let app = app(&case);
    rt.block_on(async {
        for &peer in &peers {
            assert!(send(&app, peer).await, "warm-up");
        }
    });
    let wrong = requests(&rt, &app, &peers, n);
    assert_eq!(wrong, 0, "{case}: {wrong} requests were not answered 200");
}

/// Sends `n` requests, from the peers in turn; the number not answered 200.
#[inline(never)]
fn requests(
    rt: &tokio::runtime::Runtime,
    app: &Router,
    peers: &[ConnectInfo<SocketAddr>],
    n: u32,
) -> u32 {
    rt.block_on(async {
        let mut wrong = 0;
        for i in 0..n as usize {
            wrong += u32::from(!send(app, peers[i % peers.len()]).await);
        }
        wrong
    })
}

/// One request from `peer`: whether it was answered 200.
async fn send(app: &Router, peer: ConnectInfo<SocketAddr>) -> bool {
    let request = Request::builder()
        .uri("/")
        .extension(peer)
        .body(Body::empty())
        .expect("a valid request");
    let response = app.clone().oneshot(black_box(request)).await;
    let response = response.expect("a router does not fail");
    response.status() == StatusCode::OK
}
