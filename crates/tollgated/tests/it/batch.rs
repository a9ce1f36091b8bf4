//! `/v1/checks`: many checks in one request, each all-or-nothing on its own, answered in order.

use serde_json::{Value, json};
use tollgate_testkit::RedisServer;

use crate::support::{Server, error_message, remaining};

fn config(store: &str) -> String {
    format!(
        r#"
[server]
max_batch = 8

[store]
url = "{store}"
timeout = "5s"

[policies.login]
limiters = [{{ by = "ip", rules = ["3/1h"] }}]

[policies.sms]
limiters = [
  {{ by = "ip", rules = ["5/1h"] }},
  {{ by = "user_id", rules = ["1/1h"] }},
]
"#
    )
}

fn item(policy: &str, ip: &str) -> Value {
    json!({ "policy": policy, "identity": { "ip": ip } })
}

/// Posts a batch; returns the results.
async fn batch(server: &Server, checks: Vec<Value>) -> Vec<Value> {
    let (status, body) = server.post("/v1/checks", json!({ "checks": checks })).await;
    assert_eq!(status, 200, "{body}");
    body["results"].as_array().unwrap().clone()
}

async fn same_identity_crosses_its_limit_in_order(server: &Server) {
    // Five checks of one identity against a limit of 3: exactly the first three admitted.
    let results = batch(server, vec![item("login", "192.0.2.1"); 5]).await;
    let allowed: Vec<bool> = results
        .iter()
        .map(|r| r["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, [true, true, true, false, false], "{results:?}");
    let left: Vec<u64> = results[..3]
        .iter()
        .map(|r| remaining(r, "ip", "3/1h"))
        .collect();
    assert_eq!(left, [2, 1, 0]);
    assert_eq!(results[3]["reason"], "rate_limited");
    // The same answer /v1/check gives.
    let single = server.check("login", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(single["allowed"], false);
    assert_eq!(single["reason"], results[4]["reason"]);
    assert_eq!(single["rules"][0]["rule"], results[4]["rules"][0]["rule"]);
    assert_eq!(remaining(&results[4], "ip", "3/1h"), 0);
}

#[tokio::test]
async fn a_batch_answers_each_check_in_order_on_memory() {
    let server = Server::start(&config("memory://"));
    same_identity_crosses_its_limit_in_order(&server).await;

    // Each check is all-or-nothing on its own: the second sms check of user u1 is denied by
    // its user limiter, and its address is not charged; other checks go on.
    let sms = |ip: &str, user: &str| json!({ "policy": "sms", "identity": { "ip": ip, "user_id": user }, "cost": 1 });
    let results = batch(
        &server,
        vec![
            sms("198.51.100.1", "u1"),
            sms("198.51.100.2", "u1"),
            sms("198.51.100.2", "u2"),
        ],
    )
    .await;
    assert_eq!(results[0]["allowed"], true);
    assert_eq!(results[1]["allowed"], false);
    assert_eq!(results[2]["allowed"], true);
    assert_eq!(
        remaining(&results[2], "ip", "5/1h"),
        4,
        "the denied check cost its address nothing"
    );
}

#[tokio::test]
async fn bad_items_fail_alone_and_oversized_batches_are_refused() {
    let server = Server::start(&config("memory://"));
    let results = batch(
        &server,
        vec![
            item("login", "192.0.2.7"),
            json!({ "policy": "login", "identity": { "ip": "not an address" } }),
            item("nope", "192.0.2.7"),
            json!({ "policy": "sms", "identity": { "ip": "192.0.2.7" } }),
            json!({ "policy": "login", "cost": "two" }),
            json!(17),
            item("login", "192.0.2.7"),
        ],
    )
    .await;
    assert_eq!(results.len(), 7);
    assert_eq!(results[0]["allowed"], true);
    let error = |r: &Value, status: u64| {
        crate::support::assert_problem(r, u16::try_from(status).unwrap());
        r["detail"].as_str().unwrap().to_owned()
    };
    let e = error(&results[1], 422);
    assert!(
        e.starts_with("invalid request: checks[1].identity.ip: "),
        "{e}"
    );
    assert_eq!(error(&results[2], 404), r#"unknown policy "nope""#);
    // The identity lacks the user id the sms policy counts by: what /v1/check says.
    let (status, single) = server
        .post(
            "/v1/check",
            json!({ "policy": "sms", "identity": { "ip": "192.0.2.7" } }),
        )
        .await;
    assert_eq!(error(&results[3], 422), error_message(status, &single, 422));
    assert!(
        error(&results[4], 422).starts_with("invalid request: checks[4].cost: "),
        "{results:?}"
    );
    assert!(
        error(&results[5], 422).starts_with("invalid request: checks[5]: "),
        "{results:?}"
    );
    assert_eq!(results[6]["allowed"], true);
    assert_eq!(remaining(&results[6], "ip", "3/1h"), 1);

    // Over the configured cap: refused whole, naming the cap; nothing is checked.
    let (status, body) = server
        .post(
            "/v1/checks",
            json!({ "checks": vec![item("login", "192.0.2.8"); 9] }),
        )
        .await;
    assert_eq!(
        error_message(status, &body, 413),
        "a batch holds at most 8 checks (server.max_batch); this one has more"
    );
    // Parsing stops at the first check past the cap, unread: what follows it (here not even
    // JSON) costs nothing, as a million tiny items would not. `n` good checks, a `1`, then
    // text that is not JSON.
    let spoiled = |n: usize| {
        let checks = vec![item("login", "192.0.2.8"); n];
        let text = serde_json::to_string(&json!({ "checks": checks })).unwrap();
        let body = format!("{}, 1, {{\"x\": ]}}", text.trim_end_matches("]}"));
        server.send(
            server
                .request(reqwest::Method::POST, "/v1/checks")
                .header("content-type", "application/json")
                .body(body),
        )
    };
    let (status, body) = spoiled(8).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["code"], "batch_too_large", "{body}");
    // The same body within the cap is malformed JSON, named as such.
    let (status, body) = spoiled(6).await;
    assert_eq!(
        (status, &body["code"]),
        (400, &json!("malformed_json")),
        "{body}"
    );
    let d = server.check("login", json!({ "ip": "192.0.2.8" })).await;
    assert_eq!(remaining(&d, "ip", "3/1h"), 2);
    // A body that is not a batch is the usual 422.
    let (status, body) = server.post("/v1/checks", json!({ "check": [] })).await;
    assert!(
        error_message(status, &body, 422).contains("unknown field `check`"),
        "{body}"
    );
    // An empty batch is an empty answer.
    assert!(batch(&server, vec![]).await.is_empty());
}

#[tokio::test]
async fn a_batch_on_redis_admits_exactly_the_limit() {
    let redis = RedisServer::start();
    let server = Server::start(&config(&redis.url()));
    let results = batch(&server, vec![item("login", "192.0.2.1"); 8]).await;
    // The checks go out in item order (the first alone, the others batched behind it by the
    // store), so exactly the first three are admitted.
    let allowed: Vec<bool> = results
        .iter()
        .map(|r| r["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(
        allowed,
        [true, true, true, false, false, false, false, false]
    );
    let d = server.check("login", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(d["allowed"], false);
    assert_eq!(remaining(&d, "ip", "3/1h"), 0);
}
