//! Tests of `RedisServer`: start, kill, restart on the same port, drop.

use std::net::TcpStream;
use std::time::Duration;

use tollgate_testkit::RedisServer;

async fn connect(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

async fn ping(url: &str) -> redis::RedisResult<String> {
    let mut con = connect(url).await?;
    redis::cmd("PING").query_async(&mut con).await
}

fn accepts_connections(server_addr: std::net::SocketAddr) -> bool {
    TcpStream::connect_timeout(&server_addr, Duration::from_millis(500)).is_ok()
}

#[tokio::test]
async fn start_kill_restart_on_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    assert_ne!(port, 0);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    assert_eq!(server.addr().to_string(), format!("127.0.0.1:{port}"));
    assert!(server.is_running());
    assert_eq!(ping(&server.url()).await.expect("PING"), "PONG");

    let mut con = connect(&server.url()).await.expect("connect");
    let () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut con)
        .await
        .expect("SET");

    server.kill();
    assert!(!server.is_running());
    assert!(ping(&server.url()).await.is_err(), "PING after kill");
    assert!(
        redis::cmd("GET")
            .arg("k")
            .query_async::<Option<String>>(&mut con)
            .await
            .is_err(),
        "existing connection still works after kill"
    );
    // Killing twice is a no-op.
    server.kill();

    server.restart();
    assert_eq!(server.port(), port);
    assert!(server.is_running());
    assert_eq!(ping(&server.url()).await.expect("PING"), "PONG");
    let mut con = connect(&server.url()).await.expect("connect");
    let value: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .expect("GET");
    assert_eq!(value, None, "nothing is persisted across restart");

    // Restarting a running server works too.
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(ping(&server.url()).await.expect("PING"), "PONG");
}

#[tokio::test]
async fn two_servers_get_different_ports() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    assert_eq!(ping(&a.url()).await.expect("PING a"), "PONG");
    assert_eq!(ping(&b.url()).await.expect("PING b"), "PONG");
}

#[test]
fn drop_stops_the_process() {
    let server = RedisServer::start();
    let addr = server.addr();
    assert!(accepts_connections(addr));
    drop(server);
    assert!(!accepts_connections(addr), "port {addr} still accepts");
}

#[tokio::test]
async fn extra_args_reach_the_server() {
    let server = RedisServer::builder()
        .arg("--maxmemory")
        .arg("10mb")
        .args(["--maxmemory-policy", "allkeys-lru"])
        .start();
    let mut con = connect(&server.url()).await.expect("connect");
    let maxmemory: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query_async(&mut con)
        .await
        .expect("CONFIG GET");
    assert_eq!(maxmemory, ["maxmemory", "10485760"]);
    let policy: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut con)
        .await
        .expect("CONFIG GET");
    assert_eq!(policy, ["maxmemory-policy", "allkeys-lru"]);
}

#[test]
fn bad_config_panics_with_the_log() {
    let result = std::panic::catch_unwind(|| {
        RedisServer::builder()
            .arg("--no-such-option")
            .arg("1")
            .start()
    });
    let err = result.expect_err("start should panic");
    let msg = panic_message(&*err);
    assert!(msg.contains("exited during startup"), "{msg}");
    assert!(msg.contains("no-such-option"), "{msg}");
}

#[test]
fn restart_panics_if_the_port_was_taken() {
    let mut server = RedisServer::start();
    server.kill();
    let _squatter = std::net::TcpListener::bind(server.addr()).expect("bind the freed port");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.restart()));
    let err = result.expect_err("restart should panic");
    let msg = panic_message(&*err);
    assert!(msg.contains("Address already in use"), "{msg}");
}

/// Run by `missing_redis_server_panics_with_install_hint` in a child process with an empty
/// `PATH`; ignored when run directly.
#[test]
#[ignore = "helper: run by missing_redis_server_panics_with_install_hint"]
fn helper_start_without_redis_on_path() {
    let _ = RedisServer::start();
}

#[test]
fn missing_redis_server_panics_with_install_hint() {
    let exe = std::env::current_exe().expect("current_exe");
    let output = std::process::Command::new(exe)
        .args([
            "--exact",
            "helper_start_without_redis_on_path",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PATH", "")
        .output()
        .expect("run the test binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "helper should fail: {stderr}");
    assert!(
        stderr.contains(
            "redis-server not found on PATH: install it \
             (Debian: apt-get install -y redis-server) or run scripts/test"
        ),
        "{stderr}"
    );
}

fn panic_message(err: &(dyn std::any::Any + Send)) -> &str {
    err.downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or_default()
}
