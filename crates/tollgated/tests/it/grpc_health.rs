//! `grpc.health.v1.Health` on the gRPC port: the server serves while it can answer (whatever
//! the store does, `on_error` answers), and the store's own health is reported apart.

use std::time::{Duration, Instant};

use tollgate_testkit::RedisServer;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::support::{HANG, Server};

pub(crate) async fn client(server: &Server) -> HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(server.grpc.clone())
        .expect("the gRPC address")
        .connect()
        .await
        .expect("connect to the gRPC port");
    HealthClient::new(channel)
}

async fn status(
    client: &mut HealthClient<tonic::transport::Channel>,
    service: &str,
) -> Result<ServingStatus, tonic::Code> {
    client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map(|r| r.into_inner().status())
        .map_err(|s| s.code())
}

/// Polls `service` until it reports `want`; fails after the hang limit.
pub(crate) async fn wait_for(
    client: &mut HealthClient<tonic::transport::Channel>,
    service: &str,
    want: ServingStatus,
) {
    let deadline = Instant::now() + HANG;
    loop {
        let now = status(client, service).await;
        if now == Ok(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{service:?}: {now:?}, not {want:?}, after {HANG:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_server_and_the_store_report_their_health() {
    let server = Server::start("");
    let mut health = client(&server).await;
    assert_eq!(status(&mut health, "").await, Ok(ServingStatus::Serving));
    assert_eq!(
        status(&mut health, "envoy.service.ratelimit.v3.RateLimitService").await,
        Ok(ServingStatus::Serving)
    );
    wait_for(&mut health, "tollgate.store", ServingStatus::Serving).await;
    assert_eq!(
        status(&mut health, "no.such.Service").await,
        Err(tonic::Code::NotFound)
    );
}

/// A Redis outage takes the store out, never the server: `on_error` still answers.
#[tokio::test]
async fn a_store_outage_is_reported_apart_and_the_server_keeps_serving() {
    let mut redis = RedisServer::start();
    let server = Server::start(&format!(
        r#"
[store]
url = "{}"
on_error = "deny"
timeout = "200ms"
"#,
        redis.url()
    ));
    let mut health = client(&server).await;
    wait_for(&mut health, "tollgate.store", ServingStatus::Serving).await;
    // Envoy's reference service reports its health as `ratelimit`, and a Redis outage in it.
    wait_for(&mut health, "ratelimit", ServingStatus::Serving).await;

    redis.kill();
    wait_for(&mut health, "tollgate.store", ServingStatus::NotServing).await;
    wait_for(&mut health, "ratelimit", ServingStatus::NotServing).await;
    assert_eq!(status(&mut health, "").await, Ok(ServingStatus::Serving));
    assert_eq!(
        status(&mut health, "envoy.service.ratelimit.v3.RateLimitService").await,
        Ok(ServingStatus::Serving)
    );

    redis.restart();
    wait_for(&mut health, "tollgate.store", ServingStatus::Serving).await;
    wait_for(&mut health, "ratelimit", ServingStatus::Serving).await;
}

/// A method of a service the port does not serve answers `UNIMPLEMENTED`, on a connection that
/// goes on serving.
#[tokio::test]
async fn an_unknown_service_is_unimplemented() {
    let server = Server::start("");
    let channel = tonic::transport::Endpoint::from_shared(server.grpc.clone())
        .expect("the gRPC address")
        .connect()
        .await
        .expect("connect to the gRPC port");
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    for path in [
        "/no.such.Service/Check",
        "/envoy.service.ratelimit.v3.RateLimitServiceX/ShouldRateLimit",
        "/grpc.health.v1.Health/NoSuchMethod",
    ] {
        grpc.ready().await.expect("the channel is ready");
        let answer: Result<tonic::Response<HealthCheckRequest>, tonic::Status> = grpc
            .unary(
                tonic::Request::new(HealthCheckRequest::default()),
                hyper::http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await;
        assert_eq!(
            answer.map(|_| ()).map_err(|s| s.code()),
            Err(tonic::Code::Unimplemented),
            "{path}"
        );
    }
    let mut health = HealthClient::new(channel);
    assert_eq!(status(&mut health, "").await, Ok(ServingStatus::Serving));
}

/// A health request names one service: one of more than 4 KiB is refused undecoded.
#[tokio::test]
async fn an_oversized_health_request_is_refused() {
    let server = Server::start("");
    let mut health = client(&server).await;
    let huge = "x".repeat(8192);
    let refused = status(&mut health, &huge).await;
    assert!(
        matches!(
            refused,
            Err(tonic::Code::OutOfRange | tonic::Code::ResourceExhausted)
        ),
        "{refused:?}"
    );
    assert_eq!(status(&mut health, "").await, Ok(ServingStatus::Serving));
}
