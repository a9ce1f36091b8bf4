//! Starts the built `tollgate` binary on free loopback ports with a temporary configuration,
//! and drives it with real HTTP and gRPC clients.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
    service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse, rate_limit_service_client::RateLimitServiceClient,
    },
};
use serde_json::Value;

/// The admin token every test server is started with.
pub(crate) const ADMIN_TOKEN: &str = "test-admin-token";
/// How long anything may take before a test calls it a hang.
pub(crate) const HANG: Duration = Duration::from_secs(20);

/// This machine's clock, µs since the Unix epoch (what the server's own clock reads).
pub(crate) fn now_us() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

/// POSTs `body` as JSON to `path` of an in-process server's router; the answer must be `200`.
pub(crate) async fn post_in_process(
    server: &tollgated::InProcess,
    path: &str,
    body: Value,
) -> Value {
    use tower::ServiceExt as _;
    let request = axum::http::Request::builder()
        .method(axum::http::Method::POST)
        .uri(path)
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let response = server.router().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

pub(crate) fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_tollgate")
}

/// A fresh directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "tollgated-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `name` atomically (temp file + rename), so a watcher never reads half of it.
    pub(crate) fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        let tmp = self.0.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Default)]
struct Logs {
    lines: Mutex<Vec<String>>,
    changed: Condvar,
}

/// A running `tollgate serve`; killed on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) dir: TempDir,
    pub(crate) http: String,
    pub(crate) grpc: String,
    logs: Arc<Logs>,
    client: reqwest::Client,
}

impl Server {
    /// Starts the server on `config` with file watching every 100 ms.
    pub(crate) fn start(config: &str) -> Server {
        Server::start_with(config, &["--watch-interval", "100ms"])
    }

    /// Starts the server on `config` with extra `serve` arguments.
    pub(crate) fn start_with(config: &str, args: &[&str]) -> Server {
        Server::start_full(config, args, &[])
    }

    /// Starts the server on `config` with extra environment variables.
    pub(crate) fn start_with_env(config: &str, env: &[(&str, &str)]) -> Server {
        Server::start_full(config, &["--watch-interval", "100ms"], env)
    }

    fn start_full(config: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        let dir = TempDir::new();
        let path = dir.write("tollgate.toml", config);
        let mut command = Command::new(binary());
        command
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(args)
            .env("TG_TEST_ADMIN", ADMIN_TOKEN)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied());
        Server::spawn(command, dir)
    }

    /// Starts the server on `config` with its open-file soft limit lowered to `files` first
    /// (by the shell's `ulimit`, which then runs the server in its place).
    pub(crate) fn start_with_open_files(config: &str, files: u64) -> Server {
        let dir = TempDir::new();
        let path = dir.write("tollgate.toml", config);
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -Sn {files} && exec \"$0\" \"$@\""))
            .arg(binary())
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .env("TG_TEST_ADMIN", ADMIN_TOKEN)
            .env("RUST_LOG", "info");
        Server::spawn(command, dir)
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `tollgate envoy-ratelimit` (the drop-in for Envoy's reference service) with the
    /// service's variables `env`, its YAML files in `dir`, listening on free loopback ports.
    pub(crate) fn start_envoy(dir: TempDir, env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(binary());
        command
            .args(["envoy-ratelimit", "--watch-interval", "100ms"])
            .env("HOST", "127.0.0.1")
            .env("PORT", "0")
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", "0")
            .env("LOG_LEVEL", "info")
            .env_remove("RUST_LOG")
            // Not the 50 ms default: a loaded machine's Redis takes longer now and then, and
            // these tests are not about timeouts (one that is sets its own).
            .env("TOLLGATE_STORE_TIMEOUT", "5s")
            .envs(env.iter().copied());
        Server::spawn(command, dir)
    }

    fn spawn(mut command: Command, dir: TempDir) -> Server {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the tollgate binary");
        let logs = Arc::new(Logs::default());
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lines.lock().unwrap().push(line);
                sink.changed.notify_all();
            }
        });
        let mut server = Server {
            child,
            dir,
            http: String::new(),
            grpc: String::new(),
            logs,
            client: reqwest::Client::new(),
        };
        let http = server.wait_for_addr("HTTP API listening");
        let grpc = server.wait_for_addr("Envoy gRPC listening");
        server.http = format!("http://{http}");
        server.grpc = format!("http://{grpc}");
        server
    }

    fn wait_for_addr(&mut self, what: &str) -> String {
        let line = self.wait_for_line(what, 1);
        line.split("addr=")
            .nth(1)
            .map(|s| s.split_whitespace().next().unwrap_or("").to_owned())
            .unwrap_or_else(|| panic!("no addr in {line:?}"))
    }

    /// Waits until `needle` has appeared in `count` log lines; returns the last of them.
    pub(crate) fn wait_for_line(&mut self, needle: &str, count: usize) -> String {
        let deadline = Instant::now() + HANG;
        let mut lines = self.logs.lines.lock().unwrap();
        loop {
            let found: Vec<&String> = lines.iter().filter(|l| l.contains(needle)).collect();
            if found.len() >= count {
                return found[count - 1].clone();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "tollgate exited ({status}) before logging {needle:?}:\n{}",
                    lines.join("\n")
                );
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no {needle:?} (x{count}) in the logs after {HANG:?}:\n{}",
                lines.join("\n")
            );
            lines = self
                .logs
                .changed
                .wait_timeout(lines, left.min(Duration::from_millis(100)))
                .unwrap()
                .0;
        }
    }

    /// How many log lines contain `needle`.
    pub(crate) fn count_lines(&self, needle: &str) -> usize {
        self.logs
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    pub(crate) fn logs(&self) -> String {
        self.logs.lines.lock().unwrap().join("\n")
    }

    /// Replaces the configuration file.
    pub(crate) fn write_config(&self, text: &str) {
        self.dir.write("tollgate.toml", text);
    }

    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit; panics if it takes longer than the hang limit.
    pub(crate) fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "tollgate did not exit:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// POSTs JSON to `path`; returns the status and the JSON body.
    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(self.client.post(format!("{}{path}", self.http)).json(&body))
            .await
    }

    /// POSTs JSON with the admin token.
    pub(crate) async fn post_admin(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(
            self.client
                .post(format!("{}{path}", self.http))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body),
        )
        .await
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.client.get(format!("{}{path}", self.http)))
            .await
    }

    pub(crate) async fn get_admin(&self, path: &str) -> (u16, Value) {
        self.send(
            self.client
                .get(format!("{}{path}", self.http))
                .bearer_auth(ADMIN_TOKEN),
        )
        .await
    }

    pub(crate) async fn get_text(&self, path: &str) -> (u16, String) {
        let response = self
            .client
            .get(format!("{}{path}", self.http))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// The server's metrics once they hold `line`, or after [`HANG`] (a hang detector, not a
    /// timing assertion: the caller asserts on what it gets).
    pub(crate) async fn metrics_holding(&self, line: &str) -> String {
        let deadline = tokio::time::Instant::now() + HANG;
        loop {
            let (_, metrics) = self.get_text("/metrics").await;
            if metrics.contains(line) || tokio::time::Instant::now() >= deadline {
                return metrics;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, format!("{}{path}", self.http))
    }

    pub(crate) async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("status {status}: body is not JSON ({e}): {text:?}"));
        (status, body)
    }

    /// `/v1/check` for `policy` and `identity`; asserts 200 and returns the decision.
    pub(crate) async fn check(&self, policy: &str, identity: Value) -> Value {
        let (status, body) = self
            .post(
                "/v1/check",
                serde_json::json!({ "policy": policy, "identity": identity }),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    pub(crate) async fn grpc_client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(self.grpc.clone())
            .await
            .expect("connect to the gRPC port")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The remaining count of `rule` of `limiter` in a decision.
pub(crate) fn remaining(decision: &Value, limiter: &str, rule: &str) -> u64 {
    decision["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["limiter"] == limiter && r["rule"] == rule)
        .unwrap_or_else(|| panic!("no rule {limiter} {rule} in {decision}"))["remaining"]
        .as_u64()
        .unwrap()
}

/// Asserts a 4xx problem document (RFC 9457, with a `code`) and returns its `detail`.
pub(crate) fn error_message(status: u16, body: &Value, expected_status: u16) -> String {
    assert_eq!(status, expected_status, "{body}");
    assert_problem(body, expected_status);
    body["detail"].as_str().unwrap().to_owned()
}

/// Asserts that `body` is the server's problem document for `status`: exactly `type`, `title`,
/// `status`, `code` (snake case) and `detail` (not empty).
pub(crate) fn assert_problem(body: &Value, status: u16) {
    assert_eq!(body["type"], "about:blank", "{body}");
    assert_eq!(body["status"], status, "{body}");
    let title = body["title"]
        .as_str()
        .unwrap_or_else(|| panic!("no title in {body}"));
    assert!(!title.is_empty(), "{body}");
    let code = body["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no code in {body}"));
    assert!(
        !code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
        "{body}"
    );
    let detail = body["detail"]
        .as_str()
        .unwrap_or_else(|| panic!("no detail in {body}"));
    assert!(!detail.is_empty(), "{body}");
    assert_eq!(body.as_object().unwrap().len(), 5, "{body}");
}

/// A descriptor of `(key, value)` entries.
pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

pub(crate) async fn should_rate_limit(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits_addend: u32,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend,
        })
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}
