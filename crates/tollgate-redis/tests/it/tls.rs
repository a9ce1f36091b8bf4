//! `rediss` URLs connect over TLS (rustls) and verify the servers: against the system's roots,
//! or against the CA file the URL (or the builder) names, presenting a client certificate to
//! servers that require one; on a standalone server and on a Cluster.
//!
//! The tests make their own CAs and certificates ([`TestCerts`]) and start `redis-server` with
//! TLS ports. Trusting a CA through the system roots needs `SSL_CERT_FILE`, which only a fresh
//! process can set safely, so that one client runs in a child process (this binary again,
//! [`tls_worker`]).

use std::{process::Command, time::Duration};

use tollgate::{Algorithm, Store};
use tollgate_redis::{RedisStore, RedisStoreBuilder};
use tollgate_testkit::{RedisCluster, TestCerts};

use crate::support::{CheckPlan, PlanExt, limiter, plan, rule};

/// Set in the child process: the `rediss://` URL it checks against.
const WORKER_ENV: &str = "TOLLGATE_REDIS_TEST_TLS_URL";

/// A plan of two limiters under two hash tags (on a Cluster, usually two nodes).
fn two_limiters(tag: &str) -> CheckPlan {
    plan(
        1,
        &[
            limiter(
                &format!("tls:{{{tag}}}"),
                &[rule("1/1m", Algorithm::SlidingLog)],
            ),
            limiter(
                &format!("tls:{{{tag}-other}}"),
                &[rule("5/1m", Algorithm::FixedWindow)],
            ),
        ],
    )
}

/// Builds the store, then proves a whole check over the connection: admitted once, then
/// denied by the 1/1m rule.
async fn checks_over_tls(builder: RedisStoreBuilder, tag: &str) {
    let store = builder
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    store.ping().await.unwrap();
    let p = two_limiters(tag);
    assert!(store.check_plan(&p).await.unwrap().allowed);
    assert!(!store.check_plan(&p).await.unwrap().allowed);
}

/// The error `builder` fails with.
async fn build_error(builder: RedisStoreBuilder) -> tollgate::StoreError {
    builder
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("the store must not connect")
}

#[test]
fn rediss_urls_trust_the_system_roots() {
    let certs = TestCerts::new();
    let (server, tls_port) = certs.start_tls_server(false);
    let url = format!("rediss://localhost:{tls_port}/0");

    // Trusting our CA as a system root, a child process checks over TLS.
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "tls::tls_worker",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_ENV, &url)
        .env("SSL_CERT_FILE", certs.path("ca.crt"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("tls-worker: allowed over TLS"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Without it, the server's certificate is not trusted: build fails, it does not hang.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt.block_on(RedisStore::builder(&url).build()).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    drop(server);
}

/// Not a test of its own: the trusting client of the test above, run in a child process.
#[test]
fn tls_worker() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(checks_over_tls(RedisStore::builder(&url), "system-roots"));
    println!("tls-worker: allowed over TLS");
}

#[tokio::test]
async fn a_ca_file_and_a_client_certificate_come_from_the_url_or_the_builder() {
    let certs = TestCerts::new();
    let (_server, port) = certs.start_tls_server(true);
    let base = format!("rediss://localhost:{port}/0");

    // Everything in the URL.
    let url = format!("{base}?{}", certs.client_query());
    checks_over_tls(RedisStore::builder(&url), "url").await;
    // Everything given to the builder.
    let builder = RedisStore::builder(&base)
        .tls_ca_file(certs.path("ca.crt"))
        .tls_client_cert(certs.path("client.crt"), certs.path("client.key"));
    checks_over_tls(builder, "builder").await;

    // The server requires a client certificate: trusting it is not enough.
    let ca_only = format!("{base}?{}", certs.ca_query());
    let err = build_error(RedisStore::builder(&ca_only)).await;
    assert!(err.is_unavailable(), "{err}");
    // A CA that did not sign the server's certificate replaces the system roots: untrusted.
    let wrong_ca = RedisStore::builder(&base)
        .tls_ca_file(certs.path("other-ca.crt"))
        .tls_client_cert(certs.path("client.crt"), certs.path("client.key"));
    let err = build_error(wrong_ca).await;
    assert!(err.is_unavailable(), "{err}");
    let chain = format!("{err:?}");
    assert!(
        chain.contains("UnknownIssuer") || chain.contains("certificate"),
        "{chain}"
    );
}

#[tokio::test]
async fn unusable_tls_settings_are_clear_errors_before_any_connection() {
    let certs = TestCerts::new();
    // No server at all: each of these fails on the settings, not on a connection.
    let base = "rediss://localhost:1/0";

    let both = RedisStore::builder(&format!("{base}?{}", certs.client_query()))
        .tls_ca_file(certs.path("ca.crt"));
    let err = build_error(both).await.to_string();
    assert!(
        err.contains("tls_ca_file is given both in the URL and to the builder"),
        "{err}"
    );

    let missing = RedisStore::builder(base).tls_ca_file("/nonexistent/ca.pem");
    let err = build_error(missing).await.to_string();
    assert!(
        err.contains("cannot read the TLS certificate file /nonexistent/ca.pem"),
        "{err}"
    );

    // A key where a certificate belongs.
    let swapped = RedisStore::builder(base)
        .tls_client_cert(certs.path("client.key"), certs.path("client.crt"));
    let err = build_error(swapped).await.to_string();
    assert!(err.contains("no PEM certificate"), "{err}");
    assert!(err.contains("client.key"), "{err}");

    let plain = format!("redis://localhost:1/0?tls_ca_file={}", certs.path("ca.crt"));
    let err = build_error(RedisStore::builder(&plain)).await.to_string();
    assert!(err.contains("use a rediss URL scheme"), "{err}");
    let plain =
        RedisStore::builder("redis+cluster://localhost:1").tls_ca_file(certs.path("ca.crt"));
    let err = build_error(plain).await.to_string();
    assert!(err.contains("use a rediss URL scheme"), "{err}");
}

#[tokio::test]
async fn a_tls_cluster_takes_the_ca_file_and_client_certificate_from_the_url() {
    let certs = TestCerts::new();
    let cluster = RedisCluster::builder()
        .tls(
            certs.path("server.crt"),
            certs.path("server.key"),
            certs.path("ca.crt"),
        )
        .tls_auth_clients(true)
        .start();
    let base = cluster.tls_url("localhost").unwrap();

    checks_over_tls(
        RedisStore::builder(&format!("{base}?{}", certs.client_query())),
        "cluster",
    )
    .await;
    // Without the client certificate every seed refuses the handshake: build fails, no hang.
    let ca_only = RedisStore::builder(&base).tls_ca_file(certs.path("ca.crt"));
    let err = build_error(ca_only).await;
    assert!(err.is_unavailable(), "{err}");
    // Without the CA, nothing is trusted.
    let err = build_error(RedisStore::builder(&base)).await;
    assert!(err.is_unavailable(), "{err}");
}
