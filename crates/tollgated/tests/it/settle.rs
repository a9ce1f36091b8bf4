//! `/v1/settle`: a check of an estimate settled at its real cost, once per receipt.

use serde_json::json;

use crate::support::{Server, assert_problem};

const CONFIG: &str = r#"
[policies.llm]
limiters = [{ by = "user_id", rules = ["1000/1h"], algorithm = "gcra" }]
"#;

async fn estimate(server: &Server, user: &str, cost: u64) -> String {
    let (status, d) = server
        .post(
            "/v1/check",
            json!({ "policy": "llm", "identity": { "user_id": user }, "cost": cost, "receipt": true }),
        )
        .await;
    assert_eq!((status, d["allowed"].clone()), (200, json!(true)), "{d}");
    d["receipt"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_settlement_charges_a_debt_or_gives_back_once_per_receipt() {
    let server = Server::start(CONFIG);
    // 100 estimated, 1,500 spent: 1,400 more, past the hour's 1,000; the next check waits
    // for the debt (1,500 - 1,000 + 1 units at 3.6 s each: 30 min and more).
    let receipt = estimate(&server, "u1", 100).await;
    let settle = json!({ "policy": "llm", "identity": { "user_id": "u1" }, "receipt": receipt, "cost": 1500 });
    let (status, body) = server.post("/v1/settle", settle.clone()).await;
    assert_eq!(
        (status, body),
        (200, json!({ "settled": "charged", "units": 1400 }))
    );
    let next = server.check("llm", json!({ "user_id": "u1" })).await;
    assert_eq!(next["allowed"], false, "{next}");
    let wait = next["retry_after_ms"].as_u64().unwrap();
    assert!((1_800_000..=1_804_000).contains(&wait), "{next}");
    // Spent: a second settlement, or a refund of it, is refused.
    let (status, body) = server.post("/v1/settle", settle).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "already_refunded", "{body}");

    // 300 estimated, 120 spent: 180 back.
    let receipt = estimate(&server, "u2", 300).await;
    let (status, body) = server
        .post(
            "/v1/settle",
            json!({ "policy": "llm", "identity": { "user_id": "u2" }, "receipt": receipt, "cost": 120 }),
        )
        .await;
    assert_eq!(
        (status, body),
        (200, json!({ "settled": "refunded", "units": 180 }))
    );
    let (_, peek) = server
        .post(
            "/v1/peek",
            json!({ "policy": "llm", "identity": { "user_id": "u2" } }),
        )
        .await;
    // 120 kept, and the peek's own unit.
    assert_eq!(peek["rules"][0]["remaining"], 879, "{peek}");

    // Malformed: no cost, a receipt of another identity.
    let receipt = estimate(&server, "u3", 1).await;
    let (status, body) = server
        .post(
            "/v1/settle",
            json!({ "policy": "llm", "identity": { "user_id": "u3" }, "receipt": receipt }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_problem(&body, 422);
    let (status, body) = server
        .post(
            "/v1/settle",
            json!({ "policy": "llm", "identity": { "user_id": "u4" }, "receipt": receipt, "cost": 5 }),
        )
        .await;
    assert!((400..500).contains(&status), "{status} {body}");
}

#[tokio::test]
async fn the_longest_wait_is_the_servers_to_set() {
    let server = Server::start(&format!("[server]\nmax_delay = \"30s\"\n{WAIT}"));
    let who = json!({ "ip": "192.0.2.31" });
    let ask = |ms: u64| json!({ "policy": "checkout", "identity": who, "max_delay_ms": ms });
    let (status, body) = server.post("/v1/check", ask(30_001)).await;
    assert_eq!(
        (status, body["code"].clone()),
        (400, json!("invalid_max_delay")),
        "{body}"
    );
    assert!(body.to_string().contains("at most 30000"), "{body}");
    let (status, body) = server.post("/v1/check", ask(30_000)).await;
    assert_eq!(
        (status, body["allowed"].clone()),
        (200, json!(true)),
        "{body}"
    );
    // The refused asks took nothing: the burst is whole but for the one admitted.
    assert_eq!(body["rules"][0]["remaining"], 4, "{body}");
}

const WAIT: &str = r#"
[policies.checkout]
limiters = [{ by = "ip", rules = ["5/1m"], algorithm = "gcra" }]
"#;

#[tokio::test]
async fn a_check_that_may_wait_is_told_how_long_with_the_receipt_to_give_up() {
    let server = Server::start(WAIT);
    let who = json!({ "ip": "192.0.2.30" });
    for _ in 0..5 {
        let d = server.check("checkout", who.clone()).await;
        assert_eq!(
            (d["allowed"].clone(), d.get("wait_ms")),
            (json!(true), None),
            "{d}"
        );
    }
    // Past the burst: one every 12 s. Within 20 s the next is admitted, told to wait (at
    // most 12 s: some of it passed since the burst), with its receipt.
    let ask = json!({ "policy": "checkout", "identity": who, "max_delay_ms": 20_000 });
    let (status, d) = server.post("/v1/check", ask.clone()).await;
    assert_eq!((status, d["allowed"].clone()), (200, json!(true)), "{d}");
    let wait = d["wait_ms"].as_u64().unwrap();
    assert!((1..=12_000).contains(&wait), "{d}");
    let receipt = d["receipt"].as_str().unwrap().to_owned();
    // It gives up: its place goes back, and the next is told the same wait or less.
    let (status, _) = server
        .post(
            "/v1/refund",
            json!({ "policy": "checkout", "identity": who, "receipt": receipt }),
        )
        .await;
    assert_eq!(status, 200);
    let (_, again) = server.post("/v1/check", ask).await;
    assert!(again["wait_ms"].as_u64().unwrap() <= wait, "{again}");
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_waits_total{policy=\"checkout\"} 2"),
        "{metrics}"
    );
    // Waits are bounded by `server.max_delay` (1m by default): a longer one is refused, and
    // takes nothing.
    let too_long = json!({ "policy": "checkout", "identity": who, "max_delay_ms": 60_001 });
    let (status, body) = server.post("/v1/check", too_long).await;
    assert_eq!(status, 400, "{body}");
    assert_problem(&body, 400);
    assert_eq!(body["code"], "invalid_max_delay", "{body}");
    assert!(body.to_string().contains("server.max_delay"), "{body}");
    // A batch answers at once: it takes no max_delay_ms.
    let (status, body) = server
        .post(
            "/v1/checks",
            json!({ "checks": [{ "policy": "checkout", "identity": who, "max_delay_ms": 5 }] }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.to_string().contains("max_delay_ms is for /v1/check"),
        "{body}"
    );
}

/// An estimate of 0 (a client that names no cost up front) still gets a receipt, and settling
/// it charges the real cost: 0 is not free use. Two such receipts are two, each spent once.
#[tokio::test]
async fn an_estimate_of_zero_is_settled_at_the_real_cost() {
    let server = Server::start(CONFIG);
    let first = estimate(&server, "u1", 0).await;
    let second = estimate(&server, "u1", 0).await;
    assert_ne!(first, second);
    for (receipt, cost) in [(&first, 300), (&second, 200)] {
        let settle = json!({ "policy": "llm", "identity": { "user_id": "u1" }, "receipt": receipt, "cost": cost });
        let (status, body) = server.post("/v1/settle", settle.clone()).await;
        assert_eq!(
            (status, body),
            (200, json!({ "settled": "charged", "units": cost }))
        );
        let (status, body) = server.post("/v1/settle", settle).await;
        assert_eq!(status, 409, "{body}");
    }
    let (_, peek) = server
        .post(
            "/v1/peek",
            json!({ "policy": "llm", "identity": { "user_id": "u1" } }),
        )
        .await;
    // 500 charged, and the peek's own unit.
    assert_eq!(peek["rules"][0]["remaining"], 499, "{peek}");
    // The same through a batch.
    let (status, batch) = server
        .post(
            "/v1/checks",
            json!({ "checks": [{ "policy": "llm", "identity": { "user_id": "u2" }, "cost": 0, "receipt": true }] }),
        )
        .await;
    assert_eq!(status, 200, "{batch}");
    assert!(batch["results"][0]["receipt"].is_string(), "{batch}");
}
