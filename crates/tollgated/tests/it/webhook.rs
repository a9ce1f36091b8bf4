//! The warning webhook: each warning logged once per key and window is POSTed as JSON to
//! `[webhook] url`, over http or https (with the CA the configuration names); a receiver that
//! fails is counted, not retried.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Json, Router, extract::State, http::StatusCode, routing::post};
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::Notify};
use tollgate_testkit::TestCerts;

use crate::support::Server;

/// What a receiver got, and a signal for each POST.
#[derive(Clone, Default)]
struct Received {
    bodies: Arc<Mutex<Vec<Value>>>,
    arrived: Arc<Notify>,
}

impl Received {
    /// The bodies once there are `n` of them (a hang detector, not a timing assertion).
    async fn wait_for(&self, n: usize) -> Vec<Value> {
        let waited = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let arrived = self.arrived.notified();
                if self.bodies.lock().unwrap().len() >= n {
                    return;
                }
                arrived.await;
            }
        })
        .await;
        let bodies = self.bodies.lock().unwrap().clone();
        assert!(waited.is_ok(), "{n} deliveries expected, got {bodies:?}");
        bodies
    }
}

fn receiver(received: Received, status: StatusCode) -> Router {
    Router::new()
        .route(
            "/hooks",
            post(
                move |State(received): State<Received>, Json(body): Json<Value>| async move {
                    received.bodies.lock().unwrap().push(body);
                    received.arrived.notify_waiters();
                    status
                },
            ),
        )
        .with_state(received)
}

const POLICIES: &str = r#"
[policies.export]
limiters = [{ by = "user_id", rules = ["4/1h"], warn_at = 0.5 }]
"#;

/// Two users past their warning: one delivery each, whatever the number of warnings.
async fn warnings_are_posted_once_per_key(server: &Server, received: &Received) {
    for _ in 0..4 {
        let d = server.check("export", json!({ "user_id": "u1" })).await;
        assert_eq!(d["allowed"], true, "{d}");
    }
    for _ in 0..3 {
        server.check("export", json!({ "user_id": "u2" })).await;
    }
    // A value longer than 200 characters is cut (a delivery is not the place for megabytes).
    let long = "l".repeat(300);
    for _ in 0..3 {
        server.check("export", json!({ "user_id": long })).await;
    }
    // Deliveries go in order: had u1's come twice, it would be before u2's.
    let bodies = received.wait_for(3).await;
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    assert_eq!(
        bodies[2]["value"],
        format!("{}…", &long[..200]),
        "{bodies:?}"
    );
    let first = &bodies[0];
    assert_eq!(
        (
            &first["event"],
            &first["policy"],
            &first["limiter"],
            &first["value"],
            &first["rule"],
            &first["limit"],
            &first["remaining"],
        ),
        (
            &json!("warning"),
            &json!("export"),
            &json!("user_id"),
            &json!("u1"),
            &json!("4/1h"),
            &json!(4),
            &json!(2),
        ),
        "{first}"
    );
    assert_eq!(bodies[1]["value"], "u2", "{bodies:?}");
    assert!(
        first["reset_after_ms"].as_u64().unwrap() <= 3_600_000,
        "{first}"
    );
}

#[tokio::test]
async fn warnings_reach_an_http_webhook_once_per_key_and_window() {
    let received = Received::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = receiver(received.clone(), StatusCode::NO_CONTENT);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = format!("[webhook]\nurl = \"http://127.0.0.1:{port}/hooks\"\n{POLICIES}");
    let server = Server::start(&config);
    warnings_are_posted_once_per_key(&server, &received).await;
    let delivered = "tollgate_webhook_deliveries_total{result=\"delivered\"} 3";
    let metrics = server.metrics_holding(delivered).await;
    assert!(metrics.contains(delivered), "{metrics}");
}

// Two workers: the receiver answers while the test waits for the server's log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_reach_an_https_webhook_verified_by_the_configured_ca() {
    let certs = TestCerts::new();
    let received = Received::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tls_acceptor(&certs);
    let app = receiver(received.clone(), StatusCode::OK);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    let config = format!(
        "[webhook]\nurl = \"https://localhost:{port}/hooks\"\nca = \"{}\"\n{POLICIES}",
        certs.path("ca.crt")
    );
    let server = Server::start(&config);
    warnings_are_posted_once_per_key(&server, &received).await;

    // Verified by another CA, the receiver is not trusted: the delivery fails, and is counted.
    let other = format!(
        "[webhook]\nurl = \"https://localhost:{port}/hooks\"\nca = \"{}\"\n{POLICIES}",
        certs.path("other-ca.crt")
    );
    let mut untrusting = Server::start(&other);
    for _ in 0..2 {
        untrusting.check("export", json!({ "user_id": "u3" })).await;
    }
    let line = untrusting.wait_for_line("the warning webhook failed", 1);
    assert!(
        line.contains("TLS"),
        "a certificate the CA did not sign: {line}"
    );
    let (_, metrics) = untrusting.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_webhook_deliveries_total{result=\"failed\"} 1"),
        "{metrics}"
    );
    assert_eq!(
        received.bodies.lock().unwrap().len(),
        3,
        "nothing reached the receiver"
    );
}

fn tls_acceptor(certs: &TestCerts) -> tokio_rustls::TlsAcceptor {
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(certs.path("server.crt"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_file(certs.path("server.key")).unwrap();
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}
