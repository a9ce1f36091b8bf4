//! Request spans: with `RUST_LOG=...,tower_http=debug` every HTTP request and gRPC call is a
//! span that the handlers' log lines carry; without it there is none.

use serde_json::json;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::support::Server;

const CONFIG: &str = r#"
[server]
admin_token_env = "TG_TEST_ADMIN"
"#;

#[tokio::test]
async fn requests_are_spans_when_the_log_filter_asks() {
    let mut server = Server::start_with_env(CONFIG, &[("RUST_LOG", "info,tower_http=debug")]);
    assert_eq!(server.get("/healthz").await.0, 200);
    let line = server.wait_for_line("finished processing request", 1);
    assert!(line.contains("uri=/healthz"), "{line}");
    assert!(line.contains("status=200"), "{line}");

    // A handler's own line carries the request's span.
    let (status, body) = server
        .post_admin(
            "/v1/blocklist",
            json!({ "kind": "ip", "value": "192.0.2.9", "duration": "1m" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let line = server.wait_for_line("banned by admin", 1);
    assert!(line.contains("uri=/v1/blocklist"), "{line}");
    assert!(line.contains("method=POST"), "{line}");

    // gRPC calls too.
    let channel = tonic::transport::Endpoint::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    let line = server.wait_for_line("/grpc.health.v1.Health/Check", 1);
    assert!(line.contains("request"), "{line}");
}

#[tokio::test]
async fn without_the_filter_there_are_no_request_spans() {
    let mut server = Server::start(CONFIG);
    assert_eq!(server.get("/healthz").await.0, 200);
    // The request was answered before the reload was asked for: had it logged a line, that
    // line would come before the reload's.
    server.signal("HUP");
    server.wait_for_line("configuration reloaded", 1);
    assert_eq!(
        server.count_lines("finished processing request"),
        0,
        "{}",
        server.logs()
    );
    assert_eq!(server.count_lines("uri=/healthz"), 0, "{}", server.logs());
}
