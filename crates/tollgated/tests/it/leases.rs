//! Concurrency limits over HTTP: `/v1/acquire`, `/v1/release`, `/v1/extend`.

use serde_json::json;

use crate::support::{Server, assert_problem};

const CONFIG: &str = r#"
[policies.export]
limiters = [
  { by = "user_id", concurrent = 1, lease_ttl = "5m" },
  { by = "user_id", name = "hourly", rules = ["10/1h"] },
]

[policies.plain]
limiters = [{ by = "ip", rules = ["10/1m"] }]
"#;

#[tokio::test]
async fn a_lease_is_acquired_released_and_extended() {
    let server = Server::start(CONFIG);
    let who = json!({ "user_id": "u1" });
    let acquire = || {
        server.post(
            "/v1/acquire",
            json!({ "policy": "export", "identity": who }),
        )
    };

    let (status, first) = acquire().await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["allowed"], true, "{first}");
    let lease = first["lease"]
        .as_str()
        .expect("an admission names its lease")
        .to_owned();
    assert_eq!(first["rules"][0]["rule"], "1/5m concurrent", "{first}");

    let (_, busy) = acquire().await;
    assert_eq!(busy["allowed"], false, "{busy}");
    assert_eq!(busy["reason"], "concurrency_limited", "{busy}");
    assert!(
        busy["retry_after_ms"].as_u64().unwrap() <= 300_000,
        "{busy}"
    );
    assert_eq!(busy.get("lease"), None, "{busy}");

    // Renewed; asked again with the first lease (as after an answer that never came), it is
    // renewed again: any lease of the acquisition names its slot.
    let extend = |lease: String| {
        let body = json!({ "policy": "export", "identity": who, "lease": lease });
        server.post("/v1/extend", body)
    };
    let (status, renewed) = extend(lease.clone()).await;
    assert_eq!(status, 200, "{renewed}");
    let renewed = renewed["lease"].as_str().unwrap().to_owned();
    let (status, again) = extend(lease.clone()).await;
    assert_eq!(status, 200, "{again}");

    let (status, released) = server
        .post(
            "/v1/release",
            json!({ "policy": "export", "identity": who, "lease": renewed }),
        )
        .await;
    assert_eq!((status, released), (200, json!({ "released": true })));
    // Released: no lease of the acquisition names anything now.
    let (status, lost) = extend(lease).await;
    assert_eq!(status, 409, "{lost}");
    assert_problem(&lost, 409);
    assert_eq!(lost["code"], "lease_lost", "{lost}");
    let (_, again) = acquire().await;
    assert_eq!(again["allowed"], true, "{again}");
    // The hourly rate was spent by the two admissions, not by the refusal.
    assert_eq!(again["rules"][1]["remaining"], 8, "{again}");

    // Mistakes are problems that say what is wrong.
    let (status, body) = server
        .post(
            "/v1/acquire",
            json!({ "policy": "plain", "identity": { "ip": "192.0.2.1" } }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "not_concurrent", "{body}");
    let (status, body) = server
        .post(
            "/v1/release",
            json!({ "policy": "export", "identity": who, "lease": "mine" }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "invalid_request", "{body}");
}

/// A refund of part of a lease's units frees those slots; the lease keeps the rest, which
/// `/v1/extend` renews and `/v1/release` frees.
#[tokio::test]
async fn a_partial_refund_leaves_the_lease_the_rest() {
    let server = Server::start(
        r#"
[policies.jobs]
limiters = [{ by = "user_id", concurrent = 2, lease_ttl = "5m" }]
"#,
    );
    let who = json!({ "user_id": "u1" });
    let acquire = |cost: u64| {
        server.post(
            "/v1/acquire",
            json!({ "policy": "jobs", "identity": who, "cost": cost }),
        )
    };
    let allowed = |body: &serde_json::Value| body["allowed"].as_bool().expect("allowed");
    let (status, two) = acquire(2).await;
    assert_eq!((status, allowed(&two)), (200, true), "{two}");
    let lease = two["lease"].as_str().expect("a lease").to_owned();
    let (status, refunded) = server
        .post(
            "/v1/refund",
            json!({ "policy": "jobs", "identity": who, "cost": 1, "receipt": lease }),
        )
        .await;
    assert_eq!(status, 200, "{refunded}");
    let (_, one) = acquire(1).await;
    assert!(allowed(&one), "the refunded slot is free: {one}");
    let (_, busy) = acquire(1).await;
    assert!(!allowed(&busy), "the lease holds its other slot: {busy}");

    let body = json!({ "policy": "jobs", "identity": who, "lease": lease });
    let (status, renewed) = server.post("/v1/extend", body.clone()).await;
    assert_eq!(status, 200, "{renewed}");
    let (status, released) = server.post("/v1/release", body).await;
    assert_eq!((status, released), (200, json!({ "released": true })));
    let (_, freed) = acquire(1).await;
    assert!(allowed(&freed), "the lease's last slot is free: {freed}");
    let (_, busy) = acquire(1).await;
    assert!(!allowed(&busy), "{busy}");
}
