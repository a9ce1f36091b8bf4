//! Invariant 9 from outside: what a caller with only the API ports tries, with small budgets so
//! each attack runs in seconds. Each test fails where the attack switches limiting off.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as Rls;
use serde_json::{Value, json};
use tonic::Code;

use crate::support::{Server, descriptor, error_message};

const CONFIG: &str = r#"
[store]
max_keys = 256
max_bans = 64
max_locks = 64

[policies.sms]
limiters = [{ by = "ip", rules = ["1/1m"] }]

[policies.login]
limiters = [{ by = "ip", rules = ["1/1m"], blocklist = "1h" }]

[policies.submit]
limiters = [{ by = "ip", rules = ["1000/1m"] }]
duplicate = { by = "args", ttl = "1h" }

[[envoy.domains]]
name = "edge"
descriptors = [
  { key = "remote_address", rules = ["1/1m"] },
  { key = "tenant", rules = ["1000000/1h"], algorithm = "sliding_log" },
]
"#;

fn ip(i: usize) -> Value {
    json!({ "ip": format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255) })
}

/// New clients on a 1/1m policy: each gets exactly one.
async fn new_clients_are_limited(server: &Server, from: usize) {
    for i in from..from + 20 {
        let first = server.check("sms", ip(i)).await;
        assert_eq!(first["allowed"], true, "{first}");
        let (_, second) = server
            .post("/v1/check", json!({ "policy": "sms", "identity": ip(i) }))
            .await;
        assert_eq!(
            second["allowed"], false,
            "client {i} was not limited: {second}"
        );
        assert_eq!(second["reason"], "rate_limited", "{second}");
    }
}

/// Locks kept for ten years, then more than the lock budget holds: the new lock is refused with
/// a clear 503, and new clients stay limited.
#[tokio::test]
async fn a_lock_flood_never_turns_limiting_off() {
    let server = Server::start(CONFIG);
    let acquire = |i: usize| json!({ "policy": "submit", "identity": ip(1), "args": { "n": i } });
    let (status, first) = server.post("/v1/duplicate/acquire", acquire(0)).await;
    assert_eq!(status, 200, "{first}");
    let lease = first["lease"].as_str().unwrap();
    let (status, body) = server
        .post(
            "/v1/duplicate/complete",
            json!({ "lease": lease, "response": "ok", "keep_for": "3650d" }),
        )
        .await;
    let detail = error_message(status, &body, 400);
    assert!(
        detail.contains("at most 1h") && detail.contains("server.max_keep_for"),
        "{detail}"
    );

    let mut refused = None;
    for i in 1..400 {
        let (status, body) = server.post("/v1/duplicate/acquire", acquire(i)).await;
        if status == 503 {
            refused = Some(body);
            break;
        }
        assert_eq!(status, 200, "{body}");
    }
    let refused = refused.expect("the lock budget (64) refused a lock within 400");
    assert_eq!(refused["code"], "store_full", "{refused}");
    new_clients_are_limited(&server, 1_000).await;
}

/// A response larger than `server.max_stored_response` is refused, not kept.
#[tokio::test]
async fn a_large_response_is_not_stored() {
    let server = Server::start(CONFIG);
    let (_, first) = server
        .post(
            "/v1/duplicate/acquire",
            json!({ "policy": "submit", "identity": ip(1), "args": {} }),
        )
        .await;
    let lease = first["lease"].as_str().unwrap();
    let big = "x".repeat(100 << 10);
    let (status, body) = server
        .post(
            "/v1/duplicate/complete",
            json!({ "lease": lease, "response": big, "keep_for": "1h" }),
        )
        .await;
    assert_eq!(status, 413, "{body}");
}

/// Batches that earn bans, ten times the ban budget: bans are bounded, and new clients stay
/// limited (a full ban budget never makes a check fail).
#[tokio::test]
async fn a_ban_flood_never_turns_limiting_off() {
    let server = Server::start(CONFIG);
    for round in 0..7 {
        let checks: Vec<Value> = (0..100)
            .flat_map(|i| {
                let who = ip(round * 100 + i);
                [
                    json!({ "policy": "login", "identity": who }),
                    json!({ "policy": "login", "identity": who }),
                ]
            })
            .take(100)
            .collect();
        let (status, body) = server.post("/v1/checks", json!({ "checks": checks })).await;
        assert_eq!(status, 200, "{body}");
        let results = body["results"].as_array().unwrap();
        assert!(
            results.iter().all(|r| r.get("error").is_none()),
            "no check fails: {body}"
        );
    }
    new_clients_are_limited(&server, 2_000).await;
}

/// A batch's total cost is bounded: one request cannot write 100 x 1,000 log entries.
#[tokio::test]
async fn a_costly_batch_is_refused_whole() {
    let server = Server::start(CONFIG);
    let checks: Vec<Value> = (0..100)
        .map(|i| json!({ "policy": "submit", "identity": ip(i), "cost": 1000 }))
        .collect();
    let (status, body) = server.post("/v1/checks", json!({ "checks": checks })).await;
    let detail = error_message(status, &body, 413);
    assert!(detail.contains("server.max_batch_cost"), "{detail}");
    assert_eq!(body["code"], "batch_too_costly");
    // Nothing was charged.
    let decision = server.check("submit", ip(0)).await;
    assert_eq!(decision["rules"][0]["remaining"], 999, "{decision}");
}

/// A request of `descriptors` to the `edge` domain.
fn edge(
    descriptors: Vec<
        envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor,
    >,
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// An Envoy request of many descriptors, or of long ones, is refused before any work.
#[tokio::test]
async fn envoy_requests_are_bounded() {
    let server = Server::start(CONFIG);
    let mut rls = server.grpc_client().await;
    let many: Vec<_> = (0..16_000)
        .map(|i| descriptor(&[("remote_address", &format!("192.0.2.{}", i % 250))]))
        .collect();
    let request = edge(many);
    let status = rls.should_rate_limit(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("server.max_descriptors"),
        "{status:?}"
    );

    let long: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
    let long: Vec<(&str, &str)> = long.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let request = edge(vec![descriptor(&long)]);
    let status = rls.should_rate_limit(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("server.max_descriptor_entries"),
        "{status:?}"
    );

    // A sliding log takes at most MAX_LOG_COST units a request, whatever its limit: a larger
    // `hits_addend` is over the limit and writes nothing.
    let mut costly = edge(vec![descriptor(&[("tenant", "t1")])]);
    costly.hits_addend = 100_000;
    let response = rls
        .should_rate_limit(costly.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.overall_code, Rls::OverLimit as i32, "{response:?}");
    costly.hits_addend = 1;
    let response = rls.should_rate_limit(costly).await.unwrap().into_inner();
    assert_eq!(response.overall_code, Rls::Ok as i32, "{response:?}");
    assert_eq!(
        response.statuses[0].limit_remaining, 999_999,
        "{response:?}"
    );

    // 64 descriptors, most of them the same counter: answered, the second time over the limit.
    let over: Vec<_> = (0..64)
        .map(|i| descriptor(&[("remote_address", &format!("198.51.100.{}", i % 4))]))
        .collect();
    let request = edge(over);
    let first = rls
        .should_rate_limit(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, Rls::Ok as i32, "{first:?}");
    let second = rls.should_rate_limit(request).await.unwrap().into_inner();
    assert_eq!(second.statuses.len(), 64);
    assert_eq!(second.overall_code, Rls::OverLimit as i32, "{second:?}");
    assert!(
        second
            .statuses
            .iter()
            .all(|s| s.code == Rls::OverLimit as i32)
    );
}

const LEASES: &str = r#"
[policies.export]
limiters = [{ by = "user_id", concurrent = 1, lease_ttl = "5m" }]

[policies.login]
limiters = [{ by = "ip", rules = ["1/1m"] }]
"#;

/// Receipts and leases are sealed: a guessed, edited or borrowed one is refused, and a receipt
/// gives its units back once.
#[tokio::test]
async fn receipts_and_leases_cannot_be_forged_or_reused() {
    let server = Server::start(LEASES);
    let alice = json!({ "user_id": "alice" });
    let bob = json!({ "user_id": "bob" });
    let (_, held) = server
        .post(
            "/v1/acquire",
            json!({ "policy": "export", "identity": alice }),
        )
        .await;
    let lease = held["lease"].as_str().unwrap().to_owned();

    // Bob cannot free Alice's slot with her lease, nor with one made up from it.
    let (status, body) = server
        .post(
            "/v1/release",
            json!({ "policy": "export", "identity": bob, "lease": lease }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (unsealed, _) = lease.rsplit_once('.').unwrap();
    for forged in [
        unsealed.to_owned(),
        format!("{unsealed}.{}", "0".repeat(32)),
    ] {
        let (status, body) = server
            .post(
                "/v1/release",
                json!({ "policy": "export", "identity": alice, "lease": forged }),
            )
            .await;
        assert_eq!(status, 400, "{forged}: {body}");
    }
    let (_, busy) = server
        .post(
            "/v1/acquire",
            json!({ "policy": "export", "identity": alice }),
        )
        .await;
    assert_eq!(busy["allowed"], false, "the slot is still held: {busy}");

    // One receipt, one refund, never more than it charged.
    let who = json!({ "ip": "192.0.2.7" });
    let (_, first) = server
        .post(
            "/v1/check",
            json!({ "policy": "login", "identity": who, "receipt": true }),
        )
        .await;
    let receipt = first["receipt"].as_str().unwrap().to_owned();
    let edited = receipt.replacen(".1.", ".100.", 1);
    let (status, body) = server
        .post(
            "/v1/refund",
            json!({ "policy": "login", "identity": who, "receipt": edited }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let refund = json!({ "policy": "login", "identity": who, "receipt": receipt, "cost": 100 });
    let (status, body) = server.post("/v1/refund", refund.clone()).await;
    assert_eq!((status, &body), (200, &json!({ "refunded": 1 })));
    let mut admitted = 0;
    for _ in 0..5 {
        let (status, body) = server.post("/v1/refund", refund.clone()).await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["code"], "already_refunded");
        if server.check("login", who.clone()).await["allowed"] == true {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 1, "one refund gave back one unit");
}

/// With scope tokens, each group of endpoints takes its token (or a higher one).
#[tokio::test]
async fn scopes_guard_their_endpoints() {
    let config = format!(
        "[server]\nadmin_failure_limit = \"100/1m\"\ncheck_token_env = \"TG_CHECK\"\nrefund_token_env = \"TG_REFUND\"\nadmin_token_env = \"TG_TEST_ADMIN\"\n{LEASES}"
    );
    let server = Server::start_with_env(
        &config,
        &[
            ("TG_CHECK", "check-token-0123456789"),
            ("TG_REFUND", "refund-token-0123456789"),
        ],
    );
    let call = |path: &str, token: Option<&str>, body: Value| {
        let mut request = server.request(reqwest::Method::POST, path).json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        server.send(request)
    };
    let check = json!({ "policy": "login", "identity": { "ip": "192.0.2.8" }, "receipt": true });
    assert_eq!(call("/v1/check", None, check.clone()).await.0, 401);
    let (status, first) = call("/v1/check", Some("check-token-0123456789"), check.clone()).await;
    assert_eq!(status, 200, "{first}");
    let refund = json!({ "policy": "login", "identity": { "ip": "192.0.2.8" }, "receipt": first["receipt"] });
    assert_eq!(
        call("/v1/refund", Some("check-token-0123456789"), refund.clone())
            .await
            .0,
        401
    );
    let (status, body) = call("/v1/refund", Some("refund-token-0123456789"), refund).await;
    assert_eq!(status, 200, "{body}");
    // The admin token opens every scope; a lower one never opens admin.
    let (status, _) = call("/v1/check", Some(crate::support::ADMIN_TOKEN), check).await;
    assert_eq!(status, 200);
    let reset = json!({ "policy": "login", "identity": { "ip": "192.0.2.8" } });
    let refund = "refund-token-0123456789";
    assert_eq!(call("/v1/reset", Some(refund), reset.clone()).await.0, 401);
    // A refund without a receipt takes the refund scope's token where it has one.
    assert_eq!(call("/v1/refund", None, reset.clone()).await.0, 401);
    let check = "check-token-0123456789";
    assert_eq!(call("/v1/refund", Some(check), reset.clone()).await.0, 401);
    let (status, body) = call("/v1/refund", Some(refund), reset).await;
    assert_eq!(status, 200, "{body}");
}

/// A token too short to resist guessing stops the server at start.
#[test]
fn a_short_token_is_refused_at_start() {
    let dir = crate::support::TempDir::new();
    let path = dir.write(
        "tollgate.toml",
        "[server]\nadmin_token_env = \"TG_SHORT\"\n[policies.p]\nlimiters = [{ by = \"ip\", rules = [\"1/1m\"] }]\n",
    );
    let out = std::process::Command::new(crate::support::binary())
        .args(["serve", "--config"])
        .arg(&path)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .env("TG_SHORT", "s3cret")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at least 16"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// On loopback the HTTP port answers loopback names only: a page whose name was rebound to
/// 127.0.0.1 cannot reach the API from a browser.
#[tokio::test]
async fn a_rebound_host_name_is_refused() {
    let server = Server::start(CONFIG);
    let with_host = |host: &str| {
        server.send(
            server
                .request(reqwest::Method::GET, "/v1/stats")
                .header("host", host),
        )
    };
    let (status, body) = with_host("rebound.example:8080").await;
    let detail = error_message(status, &body, 421);
    assert!(detail.contains("server.allowed_hosts"), "{detail}");
    assert_eq!(with_host("localhost:8080").await.0, 200);
    assert_eq!(with_host("[::1]:8080").await.0, 200);

    let open = Server::start(&format!("[server]\nallowed_hosts = [\"*\"]\n{CONFIG}"));
    let (status, _) = open
        .send(
            open.request(reqwest::Method::GET, "/healthz")
                .header("host", "rebound.example"),
        )
        .await;
    assert_eq!(status, 200);
}

/// A lease renewed is sealed anew, but it names the same check: its rate units are given back
/// once, whichever of its leases is sent.
#[tokio::test]
async fn a_renewed_lease_refunds_its_units_once() {
    let server = Server::start(
        r#"
[policies.export]
limiters = [
  { by = "user_id", concurrent = 1, lease_ttl = "5m" },
  { by = "user_id", name = "hourly", rules = ["2/1h"], algorithm = "fixed_window" },
]
"#,
    );
    let who = json!({ "user_id": "u" });
    let (_, held) = server
        .post(
            "/v1/acquire",
            json!({ "policy": "export", "identity": who }),
        )
        .await;
    let first = held["lease"].as_str().unwrap().to_owned();
    let (status, renewed) = server
        .post(
            "/v1/extend",
            json!({ "policy": "export", "identity": who, "lease": first }),
        )
        .await;
    assert_eq!(status, 200, "{renewed}");
    let renewed = renewed["lease"].as_str().unwrap().to_owned();
    assert_ne!(renewed, first);
    let refund = |lease: &str| json!({ "policy": "export", "identity": who, "receipt": lease });
    assert_eq!(server.post("/v1/refund", refund(&first)).await.0, 200);
    let (status, body) = server.post("/v1/refund", refund(&renewed)).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "already_refunded");
}
