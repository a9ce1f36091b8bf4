//! The server on a real Redis: checks go to Redis, and a Redis that dies is a decision
//! (`on_error`) and an unready `/readyz`, not a crash.

use serde_json::json;
use tollgate_testkit::RedisServer;

use crate::support::{Server, remaining};

#[tokio::test]
async fn checks_on_redis_and_survive_its_loss() {
    let mut redis = RedisServer::start();
    let config = format!(
        r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[store]
url = "{}"
on_error = "deny"
# Long enough for a loaded machine: the checks before the kill must be answered (a dead
# server refuses at once).
timeout = "2s"

[policies.a]
limiters = [{{ by = "ip", rules = ["2/1h"] }}]
"#,
        redis.url()
    );
    let mut server = Server::start(&config);
    let (status, ready) = server.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["store_unavailable"]["decisions"], 0, "{ready}");
    let d = server.check("a", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(remaining(&d, "ip", "2/1h"), 1);

    // A second server on the same Redis shares the counters.
    let twin = Server::start(&config);
    let d = twin.check("a", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(remaining(&d, "ip", "2/1h"), 0);
    drop(twin);

    redis.kill();
    let d = server.check("a", json!({ "ip": "192.0.2.2" })).await;
    assert_eq!(d["allowed"], false, "{d}");
    assert_eq!(d["reason"], "store_unavailable");
    let (status, body) = server.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("store"), "{body}");
    // The store's address stays in the log, away from callers.
    let port = redis
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    assert!(
        !detail.contains(&port) && !detail.contains("127.0.0.1"),
        "{body}"
    );
    // Deciding without the store is logged, never silent.
    server.wait_for_line("the store could not decide", 1);
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains(r#"tollgate_store_errors_total{op="check"} 1"#),
        "{metrics}"
    );
    let (status, body) = server
        .post_admin(
            "/v1/reset",
            json!({ "policy": "a", "identity": { "ip": "192.0.2.1" } }),
        )
        .await;
    assert_eq!(status, 503, "{body}");
}

#[tokio::test]
async fn checks_on_a_redis_cluster_stay_all_or_nothing_across_slots() {
    let cluster = tollgate_testkit::RedisCluster::start();
    let config = format!(
        r#"
[store]
url = "{}"
timeout = "500ms"

[policies.a]
limiters = [
  {{ by = "ip", rules = ["2/1h"] }},
  {{ by = "user_id", rules = ["10/1h"] }},
]
"#,
        cluster.url()
    );
    let server = Server::start(&config);
    assert_eq!(server.get("/readyz").await.0, 200);
    let who = json!({ "ip": "192.0.2.1", "user_id": "u" });
    for left in [1, 0] {
        let d = server.check("a", who.clone()).await;
        assert_eq!(remaining(&d, "ip", "2/1h"), left, "{d}");
    }
    let denied = server.check("a", who).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    // The user's limiter has a hash tag of its own (a slot of its own, as a rule); the
    // denial took nothing from it.
    assert_eq!(remaining(&denied, "user_id", "10/1h"), 8, "{denied}");
    let other = server
        .check("a", json!({ "ip": "192.0.2.2", "user_id": "u" }))
        .await;
    assert_eq!(remaining(&other, "user_id", "10/1h"), 7, "{other}");
}

#[tokio::test]
async fn checks_on_redis_over_mutual_tls_with_the_files_of_the_config() {
    let certs = tollgate_testkit::TestCerts::new();
    let (redis, tls_port) = certs.start_tls_server(true);
    let config = format!(
        r#"
[store]
url = "rediss://localhost:{tls_port}/0"
on_error = "deny"
timeout = "1s"
tls_ca_file = "{}"
tls_cert_file = "{}"
tls_key_file = "{}"

[policies.a]
limiters = [{{ by = "ip", rules = ["1/1h"] }}]
"#,
        certs.path("ca.crt"),
        certs.path("client.crt"),
        certs.path("client.key")
    );
    let server = Server::start(&config);
    let (status, ready) = server.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["store_unavailable"]["decisions"], 0, "{ready}");
    let d = server.check("a", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(d["allowed"], true, "{d}");
    let d = server.check("a", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(d["reason"], "rate_limited", "{d}");
    // The counts are on that server (read over its plain port here).
    let keys = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &redis.port().to_string(),
            "--scan",
            "--pattern",
            "tg:*",
        ])
        .output()
        .expect("redis-cli (Debian: redis-tools, with redis-server)");
    let keys = String::from_utf8_lossy(&keys.stdout);
    assert!(keys.contains("192.0.2.1"), "{keys}");
}

/// Redis down at start with `on_error = "allow"`: the server starts degraded (each check
/// answered by `on_error`, `/readyz` unavailable, logged once), then uses Redis once it
/// answers. With `deny` it refuses to start, as a fail-closed operator wants to know.
#[tokio::test]
async fn a_server_starts_degraded_while_redis_is_down() {
    let mut redis = RedisServer::start();
    redis.kill();
    let url = redis.url();
    let config = |on_error: &str| {
        format!(
            "[store]\nurl = \"{}\"\non_error = \"{on_error}\"\ntimeout = \"200ms\"\n\n\
             [policies.a]\nlimiters = [{{ by = \"ip\", rules = [\"1/1h\"] }}]\n",
            url
        )
    };
    let mut server = Server::start(&config("allow"));
    server.wait_for_line("starting degraded", 1);
    let (status, _) = server.get("/readyz").await;
    assert_eq!(status, 503);
    let d = server.check("a", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(
        (&d["allowed"], &d["reason"]),
        (&json!(true), &json!("store_unavailable")),
        "{d}"
    );

    redis.restart();
    server.wait_for_line("the store answers", 1);
    assert_eq!(server.get("/readyz").await.0, 200);
    let first = server.check("a", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(first["reason"], "ok", "{first}");
    let second = server.check("a", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(
        second["reason"], "rate_limited",
        "counted in Redis: {second}"
    );

    redis.kill();
    let dir = crate::support::TempDir::new();
    let path = dir.write("tollgate.toml", &config("deny"));
    let out = std::process::Command::new(crate::support::binary())
        .args(["serve", "--config"])
        .arg(&path)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot open the store"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A configuration on `url` with windows of a minute, a day, a calendar month and an Envoy
/// descriptor's day.
fn long_and_short(url: &str) -> String {
    format!(
        r#"
[store]
url = "{url}"
timeout = "5s"

[policies.short]
limiters = [{{ by = "ip", rules = ["10/1m"] }}]

[policies.daily]
limiters = [{{ by = "ip", rules = ["10/1m", "100/1d"] }}]

[policies.monthly]
limiters = [{{ by = "user_id", rules = ["1000/1mo@UTC"] }}]

[[envoy.domains]]
name = "edge"
descriptors = [{{ key = "tenant", rules = ["5/1d"] }}, {{ key = "path", rules = ["5/1s"] }}]
"#
    )
}

/// `/readyz` once the server has read the store's persistence (it reads it after starting).
async fn persistence_when_read(server: &Server) -> serde_json::Value {
    for _ in 0..200 {
        let (status, ready) = server.get("/readyz").await;
        assert_eq!(status, 200, "{ready}");
        if !ready["persistence"].is_null() {
            return ready["persistence"].clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("/readyz never reported the store's persistence");
}

#[tokio::test]
async fn long_windows_on_a_redis_that_keeps_nothing_are_named_in_the_log_and_readyz() {
    // The kit's servers keep nothing on disk (`--save "" --appendonly no`).
    let redis = RedisServer::start();
    let mut server = Server::start(&long_and_short(&redis.url()));
    let line = server.wait_for_line("keeps nothing across a restart", 1);
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains("policies=daily, monthly, edge/tenant"),
        "the policies, then the Envoy descriptors, with a day or more: {line}"
    );
    assert!(
        !line.contains("short") && !line.contains("edge/path"),
        "{line}"
    );
    let persistence = persistence_when_read(&server).await;
    assert_eq!(
        persistence,
        json!({
            "aof": false,
            "rdb": false,
            "survives_restart": false,
            "long_windows_at_risk": ["daily", "monthly", "edge/tenant"],
        })
    );
}

#[tokio::test]
async fn an_append_only_redis_puts_no_window_at_risk() {
    let redis = RedisServer::builder()
        .arg("--appendonly")
        .arg("yes")
        .start();
    let server = Server::start(&long_and_short(&redis.url()));
    let persistence = persistence_when_read(&server).await;
    assert_eq!(persistence["aof"], true, "{persistence}");
    assert_eq!(persistence["survives_restart"], true, "{persistence}");
    assert_eq!(
        persistence["long_windows_at_risk"],
        json!([]),
        "{persistence}"
    );
    assert_eq!(server.count_lines("keeps nothing across a restart"), 0);
}

#[tokio::test]
async fn a_redis_reached_after_start_is_read_once_it_answers() {
    let mut redis = RedisServer::start();
    redis.kill();
    let config = long_and_short(&redis.url()).replace(
        "timeout = \"5s\"\n",
        "on_error = \"allow\"\ntimeout = \"200ms\"\n",
    );
    let mut server = Server::start(&config);
    server.wait_for_line("starting degraded", 1);
    redis.restart();
    let line = server.wait_for_line("keeps nothing across a restart", 1);
    assert!(
        line.contains("policies=daily, monthly, edge/tenant"),
        "{line}"
    );
    let persistence = persistence_when_read(&server).await;
    assert_eq!(persistence["survives_restart"], false, "{persistence}");
}

#[tokio::test]
async fn a_replicated_policy_waits_for_the_replica_and_repair_is_on() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::replica_of(&primary);
    let config = format!(
        r#"
[store]
url = "{}"
on_error = "deny"
timeout = "4s"
repair = "5s"

# Long enough for a replica on a loaded machine: the checks below that must be final are.
[policies.quota]
limiters = [{{ by = "user_id", rules = ["100/30d"] }}]
durability = "replicated"
replication_timeout = "3s"

[policies.burst]
limiters = [{{ by = "user_id", rules = ["100/1s"] }}]
"#,
        primary.url()
    );
    let server = Server::start(&config);
    let who = json!({ "user_id": "u1" });
    let d = server.check("quota", who.clone()).await;
    assert_eq!(
        (d["allowed"].clone(), d["reason"].clone()),
        (json!(true), json!("ok")),
        "{d}"
    );

    replica.pause();
    let d = server.check("quota", who.clone()).await;
    assert_eq!(
        d["reason"], "store_unavailable",
        "not final without the replica: {d}"
    );
    assert_eq!(d["allowed"], false, "{d}");
    let d = server.check("burst", who.clone()).await;
    assert_eq!(d["reason"], "ok", "an async policy goes on: {d}");
    replica.resume();

    let d = server.check("quota", who.clone()).await;
    assert_eq!(d["reason"], "ok", "{d}");

    // The primary stalls: a check fails, so a repair is due; the next check runs it (nothing
    // was lost: no key is rewritten), and the metrics and the dashboard say so.
    let mut primary = primary;
    primary.pause();
    let d = server.check("burst", who.clone()).await;
    primary.resume();
    assert_eq!(d["reason"], "store_unavailable", "{d}");
    let mut answered = false;
    for _ in 0..100 {
        let d = server.check("burst", json!({ "user_id": "u2" })).await;
        if d["reason"] == "ok" {
            answered = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(answered, "answered by Redis again");
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_redis_repairs_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_redis_repaired_keys_total 0"),
        "{metrics}"
    );
    let (_, stats) = server.get("/v1/stats").await;
    assert_eq!(stats["store"]["repair"]["runs_total"], 1, "{stats}");
    assert_eq!(stats["store"]["repair"]["horizon_ms"], 5000, "{stats}");
    let durability: Vec<&str> = stats["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["durability"].as_str().unwrap())
        .collect();
    assert!(
        durability.contains(&"async") && durability.contains(&"replicated (1 replica within 3s)"),
        "{stats}"
    );
}

/// Three servers on one Redis, each leasing the quota of a hot identity: by the clients' own
/// count they admit exactly the limit together, mostly from leases in hand, and the metrics and
/// the dashboard's figures say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_servers_admit_exactly_the_limit_together() {
    const LIMIT: u64 = 600;
    let redis = RedisServer::start();
    let config = format!(
        r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[store]
url = "{}"
timeout = "5s"

[policies.tenant]
limiters = [{{ by = "user_id", rules = "{LIMIT}/30d", algorithm = "fixed_window" }}]
lease = {{ ttl = "10s", share = 0.25 }}
"#,
        redis.url()
    );
    let servers: Vec<Server> = (0..3).map(|_| Server::start(&config)).collect();
    // Two checks of another identity: the second takes a lease, which the admin sees.
    for _ in 0..2 {
        let d = servers[0].check("tenant", json!({ "user_id": "t0" })).await;
        assert_eq!(d["allowed"], true, "{d}");
    }
    let (status, top) = servers[0].get_admin("/v1/stats/top").await;
    assert_eq!(status, 200, "{top}");
    let leased = top["leased"].as_array().unwrap();
    assert_eq!(leased.len(), 1, "{top}");
    assert!(
        leased[0]["keys"][0].as_str().unwrap().contains("t0"),
        "{top}"
    );
    let t0_units = leased[0]["units"].as_u64().unwrap();
    assert!(t0_units > 0, "{top}");
    let (_, stats) = servers[0].get("/v1/stats").await;
    assert_eq!(stats["store"]["leases"]["leased_keys"], 1, "{stats}");
    assert!(
        !stats.to_string().contains("t0"),
        "no identity without the token: {stats}"
    );
    let mut clients = Vec::new();
    for server in &servers {
        for _ in 0..4 {
            let (client, url) = (reqwest::Client::new(), format!("{}/v1/check", server.http));
            clients.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                loop {
                    let body = json!({ "policy": "tenant", "identity": { "user_id": "t1" } });
                    let response = client.post(&url).json(&body).send().await.unwrap();
                    assert_eq!(response.status(), 200);
                    let d: serde_json::Value = response.json().await.unwrap();
                    if d["allowed"] != true {
                        assert_eq!(d["reason"], "rate_limited", "{d}");
                        return admitted;
                    }
                    admitted += 1;
                }
            }));
        }
    }
    let mut admitted = 0;
    for client in clients {
        admitted += client.await.unwrap();
    }
    assert_eq!(admitted, LIMIT);

    let mut local = 0;
    for (i, server) in servers.iter().enumerate() {
        let (_, metrics) = server.get_text("/metrics").await;
        let figure = |name: &str| -> u64 {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} in {metrics}"))
        };
        local += figure("tollgate_redis_lease_local_admissions_total ");
        assert!(
            figure("tollgate_redis_lease_calls_total ") >= 1,
            "{metrics}"
        );
        // Nothing in hand but t0's lease on the first server.
        let held = if i == 0 { t0_units } else { 0 };
        assert_eq!(
            figure("tollgate_redis_lease_outstanding_units "),
            held,
            "{metrics}"
        );
        let (_, stats) = server.get("/v1/stats").await;
        let leases = &stats["store"]["leases"];
        assert!(
            leases["local_admissions_total"].as_u64().unwrap() > 0,
            "{stats}"
        );
        assert_eq!(
            stats["policies"][0]["lease"], "lease of at most 10s, 0.25 of what is left",
            "{stats}"
        );
    }
    assert!(
        local >= LIMIT / 2,
        "{local} of {LIMIT} admitted from leases"
    );
}

/// A lease is text a client hands back: one naming a key that is no lock of this server's
/// guards (a counter, another prefix's key) holds nothing, and is not sent to the store (where
/// a key of another type failed the call as the store's fault).
#[tokio::test]
async fn a_lease_naming_another_key_holds_nothing() {
    let redis = RedisServer::start();
    let config = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"5s\"\n\n[policies.a]\nlimiters = [{{ by = \"ip\", rules = [\"2/1h\"] }}]\n",
        redis.url()
    );
    let server = Server::start(&config);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .arg("-p")
            .arg(redis.port().to_string())
            .args(args)
            .output()
            .expect("redis-cli runs (Debian's redis-tools, beside redis-server)");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(cli(&["SET", "elsewhere", "a string"]), "OK");
    let lease = format!("{}.elsewhere", "0".repeat(32));
    let (status, body) = server
        .post("/v1/duplicate/release", json!({ "lease": lease }))
        .await;
    assert_eq!((status, &body["released"]), (200, &json!(false)), "{body}");
    assert_eq!(cli(&["GET", "elsewhere"]), "a string");
}
