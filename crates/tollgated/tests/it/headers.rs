//! `server.headers`: the rate-limit fields of `/v1/check` answers (for a caller to copy onto its
//! own response) and of Envoy's `response_headers_to_add`.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use reqwest::Method;
use serde_json::json;

use crate::support::{Server, descriptor, now_us, should_rate_limit};

fn config(style: Option<&str>) -> String {
    let server = style.map_or(String::new(), |s| {
        format!("[server]\nheaders = \"{s}\"\n[envoy]\nheaders = \"{s}\"\n")
    });
    format!(
        r#"{server}
[policies.sms]
limiters = [{{ by = "ip", rules = ["1/1m", "10/1h"] }}]

[[envoy.domains]]
name = "edge"
descriptors = [{{ key = "remote_address", rules = ["2/1m"] }}]
"#
    )
}

/// The rate-limit fields of a `/v1/check` answer, sorted by name.
async fn check_fields(server: &Server) -> (u16, Vec<(String, String)>) {
    let request = server
        .request(Method::POST, "/v1/check")
        .json(&json!({ "policy": "sms", "identity": { "ip": "192.0.2.1" } }));
    let response = request.send().await.unwrap();
    let mut fields: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str().contains("ratelimit"))
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
        .collect();
    fields.sort();
    (response.status().as_u16(), fields)
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn checks_answer_with_the_draft_fields_by_default() {
    let server = Server::start(&config(None));
    let (status, fields) = check_fields(&server).await;
    assert_eq!(status, 200);
    assert_eq!(
        fields,
        pairs(&[
            ("ratelimit", r#""ip-1m";r=0;t=60, "ip-1h";r=9;t=3600"#),
            (
                "ratelimit-policy",
                r#""ip-1m";q=1;w=60, "ip-1h";q=10;w=3600"#
            ),
        ])
    );
}

#[tokio::test]
async fn the_legacy_style_describes_the_rule_closest_to_denying() {
    let server = Server::start(&config(Some("legacy")));
    let (_, fields) = check_fields(&server).await;
    assert_eq!(
        fields,
        pairs(&[
            ("x-ratelimit-limit", "1"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "60"),
        ])
    );
}

#[tokio::test]
async fn with_no_style_only_denials_carry_fields() {
    let server = Server::start(&config(Some("none")));
    let (_, admitted) = check_fields(&server).await;
    assert_eq!(admitted, pairs(&[]));
    let (status, denied) = check_fields(&server).await;
    assert_eq!(status, 200, "a denial is a decision, answered 200");
    assert_eq!(denied.len(), 2, "{denied:?}");
    assert_eq!(denied[0].0, "ratelimit");
    assert!(denied[0].1.starts_with(r#""ip-1m";r=0;t="#), "{denied:?}");
}

fn envoy_fields(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

#[tokio::test]
async fn envoy_answers_carry_the_fields_in_response_headers_to_add_when_asked() {
    let ra = || vec![descriptor(&[("remote_address", "192.0.2.1")])];
    // By default, as Envoy's reference service: none on OK answers, the draft's on a denial.
    let server = Server::start(&config(None));
    let mut rls = server.grpc_client().await;
    for _ in 0..2 {
        let ok = should_rate_limit(&mut rls, "edge", ra(), 0).await;
        assert_eq!(envoy_fields(&ok), pairs(&[]));
    }
    let over = should_rate_limit(&mut rls, "edge", ra(), 0).await;
    assert_eq!(envoy_fields(&over)[1].0, "ratelimit");

    let server = Server::start(&config(Some("draft")));
    let mut rls = server.grpc_client().await;
    let first = should_rate_limit(&mut rls, "edge", ra(), 0).await;
    assert_eq!(
        envoy_fields(&first),
        pairs(&[
            ("ratelimit-policy", r#""remote_address-1m";q=2;w=60"#),
            ("ratelimit", r#""remote_address-1m";r=1;t=60"#),
        ])
    );
    should_rate_limit(&mut rls, "edge", ra(), 0).await;
    let over = should_rate_limit(&mut rls, "edge", ra(), 0).await;
    let fields = envoy_fields(&over);
    assert!(
        fields[1].1.starts_with(r#""remote_address-1m";r=0;t="#),
        "{fields:?}"
    );

    let server = Server::start(&config(Some("draft6")));
    let mut rls = server.grpc_client().await;
    let first = should_rate_limit(&mut rls, "edge", ra(), 0).await;
    assert_eq!(
        envoy_fields(&first),
        pairs(&[
            ("ratelimit-limit", "2"),
            ("ratelimit-remaining", "1"),
            ("ratelimit-reset", "60"),
        ])
    );
}

#[tokio::test]
async fn sliding_window_rules_serve_over_http_and_envoy() {
    let server = Server::start(
        r#"
[policies.export]
limiters = [{ by = "user_id", rules = ["3/1h"], algorithm = "sliding_window" }]

[[envoy.domains]]
name = "edge"
descriptors = [{ key = "tenant", rules = ["2/1h"], algorithm = "sliding_window" }]
"#,
    );
    for left in [2, 1, 0] {
        let d = server.check("export", json!({ "user_id": "u1" })).await;
        assert_eq!(d["allowed"], true, "{d}");
        assert_eq!(d["rules"][0]["remaining"], left, "{d}");
    }
    let d = server.check("export", json!({ "user_id": "u1" })).await;
    assert_eq!(d["allowed"], false, "{d}");
    assert!(d["retry_after_ms"].as_u64().unwrap() > 0, "{d}");

    let mut rls = server.grpc_client().await;
    let tenant = || vec![descriptor(&[("tenant", "t1")])];
    for _ in 0..2 {
        let r = should_rate_limit(&mut rls, "edge", tenant(), 0).await;
        assert_eq!(r.overall_code, 1, "OK");
    }
    let r = should_rate_limit(&mut rls, "edge", tenant(), 0).await;
    assert_eq!(r.overall_code, 2, "OVER_LIMIT");
}

/// A calendar window on an Envoy descriptor: the zone's day, its status resetting at the
/// zone's midnight.
#[tokio::test]
async fn calendar_windows_serve_envoy_descriptors() {
    let server = Server::start(
        r#"
[[envoy.domains]]
name = "edge"
descriptors = [{ key = "tenant", rules = ["2/1d@Pacific/Auckland"] }]
"#,
    );
    let mut rls = server.grpc_client().await;
    let tenant = || vec![descriptor(&[("tenant", "t1")])];
    let auckland =
        tollgate::Calendar::new(tollgate::CalendarUnit::Day, "Pacific/Auckland").unwrap();
    let before = now_us();
    let r = should_rate_limit(&mut rls, "edge", tenant(), 0).await;
    let after = now_us();
    assert_eq!(r.overall_code, 1, "OK");
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap();
    let reset_us = u64::try_from(reset.seconds).unwrap() * 1_000_000
        + u64::try_from(reset.nanos).unwrap() / 1_000;
    let (_, end_before) = auckland.window_at(before);
    let (_, end_after) = auckland.window_at(after);
    // The day's end as seen on either side of the call (a midnight may pass in between),
    // within Envoy's whole seconds.
    assert!(
        (end_before.saturating_sub(after + 1_000_000)..=end_after - before).contains(&reset_us),
        "resets in {reset_us} µs, the day ends {} µs after the call",
        end_before - before
    );
    should_rate_limit(&mut rls, "edge", tenant(), 0).await;
    let r = should_rate_limit(&mut rls, "edge", tenant(), 0).await;
    assert_eq!(r.overall_code, 2, "OVER_LIMIT");
}
