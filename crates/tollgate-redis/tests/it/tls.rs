//! `rediss://` and `rediss+cluster://` URLs connect over TLS (rustls) and verify the servers
//! against the system roots.
//!
//! The test makes its own CA with `openssl` and starts `redis-server` with a TLS port. The
//! client trusts that CA through `SSL_CERT_FILE`, which only a fresh process can set safely, so
//! the trusting client runs in a child process (this binary again, [`tls_worker`]).

use std::{net::TcpListener, path::Path, process::Command, time::Duration};

use tollgate::{Algorithm, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::{RedisCluster, RedisServer};

use crate::support::{limiter, plan, rule};

/// Set in the child process: the `rediss://` URL it checks against.
const WORKER_ENV: &str = "TOLLGATE_REDIS_TEST_TLS_URL";

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the TLS test needs the openssl command (Debian: apt-get install -y openssl)");
    assert!(
        status.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// A CA and a server certificate for `localhost`, in a fresh directory.
fn certificates() -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let dir =
        std::env::temp_dir().join(format!("tollgate-redis-tls-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=tollgate test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
    );
    openssl(
        &dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        // 127.0.0.1: the address cluster nodes announce, which clients then verify.
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ],
    );
    dir
}

#[test]
fn rediss_urls_connect_over_tls() {
    let certs = certificates();
    let tls_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = |f: &str| certs.join(f).to_string_lossy().into_owned();
    let server = RedisServer::builder()
        .args(["--tls-port", &tls_port.to_string()])
        .args(["--tls-cert-file", &path("server.crt")])
        .args(["--tls-key-file", &path("server.key")])
        .args(["--tls-ca-cert-file", &path("ca.crt")])
        .args(["--tls-auth-clients", "no"])
        .start();
    let url = format!("rediss://localhost:{tls_port}/0");

    // Trusting our CA, a child process checks over TLS.
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "tls::tls_worker",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_ENV, &url)
        .env("SSL_CERT_FILE", path("ca.crt"))
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
    let _ = std::fs::remove_dir_all(&certs);
}

#[test]
fn rediss_cluster_urls_connect_over_tls() {
    let certs = certificates();
    let path = |f: &str| certs.join(f).to_string_lossy().into_owned();
    let cluster = RedisCluster::builder()
        .tls(path("server.crt"), path("server.key"), path("ca.crt"))
        .start();
    let url = cluster.tls_url("localhost").unwrap();

    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "tls::tls_worker",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_ENV, &url)
        .env("SSL_CERT_FILE", path("ca.crt"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("tls-worker: allowed over TLS"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Untrusted here: every seed fails the handshake, build fails, it does not hang.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt.block_on(RedisStore::builder(&url).build()).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&certs);
}

/// Not a test of its own: the trusting client of the tests above, run in a child process.
#[test]
fn tls_worker() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::builder(&url)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        store.ping().await.unwrap();
        // Two limiters, two hash tags: on a cluster, usually two nodes.
        let p = plan(
            1,
            &[
                limiter("tls:{k}", &[rule("1/1m", Algorithm::SlidingLog)]),
                limiter("tls:{other}", &[rule("5/1m", Algorithm::FixedWindow)]),
            ],
        );
        assert!(store.check(&p).await.unwrap().allowed);
        assert!(!store.check(&p).await.unwrap().allowed);
        println!("tls-worker: allowed over TLS");
    });
}
