//! A rate-limited gRPC method: the layer in a tonic server's stack, a real tonic client over
//! loopback. The refusal is a gRPC status, `RESOURCE_EXHAUSTED`, with the delay in metadata;
//! the peer address comes from tonic's own connection info (feature `tonic`).

#![allow(clippy::unwrap_used)]

use std::{sync::Arc, time::Duration};

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tollgate::{Dimension, Identity, Limiter, ManualClock, MemoryStore, Policy, Tollgate};
use tollgate_tower::{RateLimitLayer, Rejection};
use tonic::{Code, transport::Server};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

fn policy() -> Policy {
    Policy::builder("health")
        .limiter(Limiter::new(Dimension::Ip, ["2/1m".parse().unwrap()]))
        .build()
        .unwrap()
}

/// A client of tonic's health service served behind `layer` over loopback.
async fn health_behind(layer: RateLimitLayer) -> HealthClient<tonic::transport::Channel> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(20))
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

#[tokio::test]
async fn a_grpc_method_over_its_limit_answers_resource_exhausted_with_the_delay() {
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let gate = Arc::new(Tollgate::new(
        MemoryStore::builder().clock(clock.clone()).build(),
    ));
    let mut client = health_behind(RateLimitLayer::new(gate, policy())).await;
    let check = || HealthCheckRequest {
        service: String::new(),
    };
    for _ in 0..2 {
        let allowed = client.check(check()).await.unwrap();
        assert!(allowed.metadata().contains_key("ratelimit"));
    }
    clock.advance(Duration::from_millis(500));
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limit exceeded: ip 2/1m");
    let metadata = status.metadata();
    assert_eq!(metadata.get("grpc-retry-pushback-ms").unwrap(), "59500");
    assert_eq!(metadata.get("retry-after").unwrap(), "60");
    assert!(
        metadata
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(r#""ip-1m";r=0;"#)
    );
}

#[tokio::test]
async fn a_rejection_converts_into_a_status_with_its_metadata() {
    let gate = Tollgate::new(MemoryStore::new());
    let who = Identity::new().with_ip("192.0.2.1".parse().unwrap());
    gate.check(&policy(), &who, 2).await.unwrap();
    let denied = gate.check(&policy(), &who, 1).await.unwrap();
    let status = tonic::Status::from(Rejection::from_decision(denied, &policy()).unwrap());
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.metadata().get("retry-after").unwrap(), "60");
    assert!(status.metadata().get("grpc-status").is_none());

    let blocked = tonic::Status::from(Rejection::KeyReused);
    assert_eq!(blocked.code(), Code::InvalidArgument);
}

/// `Count::failures()` on a gRPC method: a call that fails (its status in the answer's
/// headers, as tonic answers an error) counts, one that succeeds is given back; every answer
/// is HTTP 200, and failed calls were given back too.
#[tokio::test]
async fn count_failures_counts_failed_grpc_calls() {
    let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    let layer = RateLimitLayer::new(gate, policy()).count(tollgate_tower::Count::failures());
    let mut client = health_behind(layer).await;
    let check = |service: &str| HealthCheckRequest {
        service: service.to_owned(),
    };
    // Successes (the server's own health) are given back: any number of them.
    for _ in 0..5 {
        client.check(check("")).await.unwrap();
    }
    // Failures (a service it does not know: NOT_FOUND) count: two fit, then refused.
    for _ in 0..2 {
        let status = client.check(check("unknown")).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}
