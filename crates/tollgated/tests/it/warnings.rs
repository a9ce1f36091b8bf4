//! Warnings through the server: `warn_at` on a limiter names the rules an admission brought to
//! the fraction, in the JSON answer, the metrics, and a log line once per key and window.

use serde_json::{Value, json};

use crate::support::Server;

const CONFIG: &str = r#"
[policies.export]
limiters = [
  { by = "user_id", rules = ["10/1h"], warn_at = 0.8 },
  { by = "ip", rules = ["1000/1h"] },
]

[policies.upload]
limiters = [{ by = "user_id", rules = ["3/1h"], soft = ["1/1h"] }]

[policies.plain]
limiters = [{ by = "user_id", rules = ["2/1h"] }]
"#;

const LINE: &str = "a rule reached its warning";

fn warnings(decision: &Value) -> Value {
    decision.get("warnings").cloned().unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_warning_is_answered_counted_and_logged_once_per_key() {
    let mut server = Server::start(CONFIG);
    let u1 = json!({ "user_id": "u1", "ip": "192.0.2.1" });
    for n in 1..=7 {
        let d = server.check("export", u1.clone()).await;
        assert_eq!(
            (d["allowed"].clone(), warnings(&d)),
            (json!(true), Value::Null),
            "{n}: {d}"
        );
    }
    // The 8th of 10 reaches 0.8: only the warning limiter says so, in the body and in
    // `RateLimit-Warning`.
    for remaining in [2, 1, 0] {
        let response = server
            .request(reqwest::Method::POST, "/v1/check")
            .json(&json!({ "policy": "export", "identity": u1 }))
            .send()
            .await
            .unwrap();
        let field = response.headers()["ratelimit-warning"]
            .to_str()
            .unwrap()
            .to_owned();
        let t: u64 = field
            .strip_prefix(&format!("\"user_id-1h\";r={remaining};t="))
            .unwrap_or_else(|| panic!("{field}"))
            .parse()
            .unwrap();
        // The hour's oldest entry is this test's first request.
        assert!((3500..=3600).contains(&t), "{field}");
        let d: Value = response.json().await.unwrap();
        assert_eq!(d["allowed"], true, "{d}");
        assert_eq!(
            warnings(&d),
            json!([{ "limiter": "user_id", "rule": "10/1h", "remaining": remaining }]),
            "{d}"
        );
    }
    // Denied: no warning, the denial says more.
    let d = server.check("export", u1).await;
    assert_eq!(
        (d["allowed"].clone(), warnings(&d)),
        (json!(false), Value::Null),
        "{d}"
    );
    // Another key warns on its own; a policy without warnings never does.
    let u2 = json!({ "user_id": "u2", "ip": "192.0.2.1" });
    server
        .check("export", json!({ "user_id": "u2", "ip": "192.0.2.2" }))
        .await;
    for _ in 0..7 {
        server.check("export", u2.clone()).await;
    }
    let d = server.check("plain", u2.clone()).await;
    let d2 = server.check("plain", u2).await;
    assert_eq!((warnings(&d), warnings(&d2)), (Value::Null, Value::Null));

    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_warnings_total{policy=\"export\",limiter=\"user_id\"} 4"),
        "{metrics}"
    );
    // u1's three warnings logged once, then u2's: lines are written in request order, so
    // when u2's is there every line u1 could have caused is too.
    server.wait_for_line(LINE, 2);
    assert_eq!(server.count_lines(LINE), 2, "{}", server.logs());
    let (_, policies) = server.get("/v1/stats").await;
    let export = policies["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "export")
        .unwrap();
    assert_eq!(export["limiters"][0]["warn_at"], 0.8, "{export}");
}

#[tokio::test]
async fn a_soft_rule_reports_what_it_would_deny_and_never_denies() {
    let server = Server::start(CONFIG);
    let who = json!({ "user_id": "u9" });
    let first = server.check("upload", who.clone()).await;
    assert_eq!(first.get("shadow_denied"), None, "{first}");
    let second = server.check("upload", who.clone()).await;
    assert_eq!(second["allowed"], true, "{second}");
    assert_eq!(second["shadow_denied"], json!(["user_id.soft"]), "{second}");
    let soft = second["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["limiter"] == "user_id.soft")
        .unwrap();
    assert_eq!(
        (soft["rule"].clone(), soft["would_deny"].clone()),
        (json!("1/1h"), json!(true))
    );
    // The enforced rule still decides.
    server.check("upload", who.clone()).await;
    let fourth = server.check("upload", who).await;
    assert_eq!(fourth["allowed"], false, "{fourth}");
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains(
            "tollgate_shadow_denials_total{policy=\"upload\",limiter=\"user_id.soft\"} 2"
        ),
        "{metrics}"
    );
}
