//! One axum route, bare and behind each rate-limit layer with one GCRA rule per peer IP:
//! tollgate-tower's `RateLimitLayer` and tower_governor's `GovernorLayer`, with and without
//! their rate-limit response headers.
//!
//! Requests go through `tower::ServiceExt::oneshot` on a current-thread tokio runtime, each
//! carrying the `ConnectInfo<SocketAddr>` that `axum::serve` inserts, from 4096 client IPs in
//! turn. Every response must be 200. The time a layer adds is its figure less the bare
//! route's.

use std::{
    hint::black_box,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    extract::ConnectInfo,
    http::{Request, StatusCode},
    routing::get,
};
use criterion::Criterion;
use tollgate::{MemoryStore, Tollgate};
use tollgate_tower::RateLimitLayer;
use tower::ServiceExt;
use tower_governor::{GovernorLayer, governor::GovernorConfigBuilder};

use crate::support::{gcra, group, ips_from, policy};

const CLIENTS: usize = 4096;

fn route() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

pub(crate) fn middleware(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let peers: Vec<ConnectInfo<SocketAddr>> = ips_from(0, CLIENTS)
        .into_iter()
        .map(|ip| ConnectInfo(SocketAddr::new(ip, 40_000)))
        .collect();

    // 1000000/1s: one unit every microsecond, burst of a million, on either side.
    let tollgate = |headers: bool| {
        let gate = Arc::new(Tollgate::new(MemoryStore::new()));
        RateLimitLayer::new(gate, policy(&[gcra("1000000/1s")])).headers(headers)
    };
    let governor = GovernorConfigBuilder::default()
        .per_nanosecond(1_000)
        .burst_size(1_000_000)
        .finish()
        .expect("a valid governor config");
    let governor_headers = GovernorConfigBuilder::default()
        .per_nanosecond(1_000)
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .expect("a valid governor config");
    let apps = [
        ("bare", route()),
        ("tollgate", route().layer(tollgate(true))),
        ("tollgate_no_headers", route().layer(tollgate(false))),
        (
            "tower_governor",
            route().layer(GovernorLayer::new(governor)),
        ),
        (
            "tower_governor_headers",
            route().layer(GovernorLayer::new(governor_headers)),
        ),
    ];

    let mut g = group(c, "middleware/gcra_1rule");
    g.measurement_time(Duration::from_secs(3));
    for (name, app) in apps {
        let (mut i, mut wrong) = (0, 0u64);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        i = (i + 1) % CLIENTS;
                        let request = Request::builder()
                            .uri("/")
                            .extension(peers[i])
                            .body(Body::empty())
                            .expect("a valid request");
                        let response = app.clone().oneshot(black_box(request)).await;
                        let response = response.expect("a router does not fail");
                        wrong += u64::from(response.status() != StatusCode::OK);
                    }
                    start.elapsed()
                })
            })
        });
        assert_eq!(wrong, 0, "{name}: {wrong} requests were not answered 200");
    }
    g.finish();
}
