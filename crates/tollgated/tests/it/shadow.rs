//! Shadow mode through the server: `shadow = true` on a limiter or a whole policy counts and
//! reports without refusing, in the JSON answer, the rate-limit fields, the metrics and the log.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::Server;

const CONFIG: &str = r#"
[policies.search]
limiters = [
  { by = "ip", rules = ["3/1m"] },
  { by = "ip", name = "trial", rules = ["1/1m"], shadow = true },
]

[policies.dry_run]
shadow = true
limiters = [{ by = "user_id", rules = ["1/1h"], blocklist = "10m" }]

[policies.account]
limiters = [{ by = "user_id", rules = ["9/1m"] }]
"#;

/// The value of one series of the metrics text, 0 when absent.
fn series(metrics: &str, name_and_labels: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .map_or(0, |n| n.trim().parse().unwrap())
}

fn rule_fields(decision: &Value, limiter: &str) -> (bool, bool) {
    let rule = decision["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["limiter"] == limiter)
        .unwrap_or_else(|| panic!("no rule of {limiter} in {decision}"));
    (
        rule["shadow"].as_bool().unwrap_or(false),
        rule["would_deny"].as_bool().unwrap_or(false),
    )
}

#[tokio::test]
async fn a_shadow_limiter_reports_without_refusing() {
    let mut server = Server::start(CONFIG);
    let who = json!({ "ip": "192.0.2.7" });

    let first = server.check("search", who.clone()).await;
    assert_eq!(first["allowed"], true, "{first}");
    assert_eq!(first.get("shadow_denied"), None, "{first}");
    assert_eq!(rule_fields(&first, "ip"), (false, false));
    assert_eq!(rule_fields(&first, "trial"), (true, false));

    // The trial limit would deny: admitted all the same, and the answer says so.
    let request = server
        .request(Method::POST, "/v1/check")
        .json(&json!({ "policy": "search", "identity": who }));
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    // The client is told of the enforced limit only.
    assert_eq!(
        header("ratelimit-policy").as_deref(),
        Some(r#""ip-1m";q=3;w=60"#)
    );
    assert_eq!(header("ratelimit").as_deref(), Some(r#""ip-1m";r=1;t=60"#));
    let second: Value = response.json().await.unwrap();
    assert_eq!(second["allowed"], true, "{second}");
    assert_eq!(second["reason"], "ok", "{second}");
    assert_eq!(second["shadow_denied"], json!(["trial"]), "{second}");
    assert_eq!(rule_fields(&second, "trial"), (true, true));

    // The enforced limit still refuses; the trial limit recorded nothing while it would deny.
    let third = server.check("search", who.clone()).await;
    assert_eq!(third["allowed"], true, "{third}");
    let fourth = server.check("search", who.clone()).await;
    assert_eq!(fourth["allowed"], false, "{fourth}");
    assert_eq!(fourth["reason"], "rate_limited", "{fourth}");

    // A whole policy in shadow mode: never refuses, never bans.
    let user = json!({ "user_id": "u1", "ip": "198.51.100.1" });
    for _ in 0..3 {
        let d = server.check("dry_run", user.clone()).await;
        assert_eq!(d["allowed"], true, "{d}");
    }
    let elsewhere = server.check("account", user).await;
    assert_eq!(
        elsewhere["reason"], "ok",
        "a shadow limiter banned: {elsewhere}"
    );

    let (_, metrics) = server.get_text("/metrics").await;
    assert_eq!(
        series(
            &metrics,
            r#"tollgate_shadow_denials_total{policy="search",limiter="trial"}"#
        ),
        2,
        "{metrics}"
    );
    assert_eq!(
        series(
            &metrics,
            r#"tollgate_shadow_denials_total{policy="dry_run",limiter="user_id"}"#
        ),
        2,
        "{metrics}"
    );
    assert_eq!(
        series(
            &metrics,
            r#"tollgate_decisions_total{policy="search",reason="ok",allowed="true"}"#
        ),
        3,
        "{metrics}"
    );
    // A log line for the first would-be denial (more are summed into the next second's line).
    let line = server.wait_for_line("shadow limit would have denied a request", 1);
    assert!(
        line.contains("search") || line.contains("dry_run"),
        "{line}"
    );
}
