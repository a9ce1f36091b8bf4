//! Bans on Envoy traffic: a domain names which descriptor keys carry an identity
//! (`remote_address` is the ip), a descriptor with a `blocklist` bans it when it denies, and a
//! banned identity is refused whatever its descriptors, as is one banned by hand.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use reqwest::Method;
use serde_json::json;

use crate::support::{ADMIN_TOKEN, Server, descriptor, should_rate_limit};

const CONFIG: &str = r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[[envoy.domains]]
name = "edge"
identity = { remote_address = "ip" }
descriptors = [
  { key = "remote_address", rules = ["2/1m"], blocklist = "10m" },
  { key = "path", rules = ["100/1m"] },
]
"#;

fn code(c: i32) -> Code {
    Code::try_from(c).unwrap()
}

#[tokio::test]
async fn a_denial_bans_the_address_for_every_descriptor() {
    let server = Server::start(CONFIG);
    let mut rls = server.grpc_client().await;
    let from = |ip: &str, path: &str| {
        vec![
            descriptor(&[("path", path)]),
            descriptor(&[("remote_address", ip)]),
        ]
    };
    for _ in 0..2 {
        let r = should_rate_limit(&mut rls, "edge", from("192.0.2.1", "/a"), 1).await;
        assert_eq!(code(r.overall_code), Code::Ok);
    }
    // The address's third request is over its limit, and bans it.
    let r = should_rate_limit(&mut rls, "edge", from("192.0.2.1", "/a"), 1).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    // Banned: refused though the minute's limit is not the question any more, for 10 minutes.
    let r = should_rate_limit(&mut rls, "edge", from("192.0.2.1", "/b"), 1).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    for status in &r.statuses {
        assert_eq!(code(status.code), Code::OverLimit);
        let left = status.duration_until_reset.as_ref().unwrap().seconds;
        assert!((599..=600).contains(&left), "{left}");
    }
    // Others are not.
    let r = should_rate_limit(&mut rls, "edge", from("192.0.2.2", "/b"), 1).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    // The dashboard's top list shows who was limited, by which descriptor.
    let (status, top) = server.get_admin("/v1/stats/top").await;
    assert_eq!(status, 200, "{top}");
    let entry = top["top"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["value"] == "remote_address=192.0.2.1")
        .unwrap_or_else(|| panic!("not in the top list: {top}"));
    assert_eq!(entry["policy"], "envoy:edge");
    assert_eq!(entry["limiter"], "remote_address");
    // The ban is in the blocklist the admin API lists.
    let (status, page) = server.get_admin("/v1/blocklist").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["bans"][0]["value"], "192.0.2.1", "{page}");
}

#[tokio::test]
async fn a_ban_by_hand_refuses_envoy_traffic_until_lifted() {
    let server = Server::start(CONFIG);
    let mut rls = server.grpc_client().await;
    let ip = || vec![descriptor(&[("remote_address", "198.51.100.9")])];
    let (status, body) = server
        .post_admin(
            "/v1/blocklist",
            json!({ "kind": "ip", "value": "198.51.100.9", "duration": "1h" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let r = should_rate_limit(&mut rls, "edge", ip(), 1).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);

    let lifted = server
        .request(Method::DELETE, "/v1/blocklist/ip/198.51.100.9")
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(lifted.status(), 200);
    let r = should_rate_limit(&mut rls, "edge", ip(), 1).await;
    assert_eq!(code(r.overall_code), Code::Ok);
}

/// A request comes from one client: one that names five addresses, and earns a ban, has at
/// most two of them banned (a client's address may come twice: as its proxy saw it and as it
/// says), not a crowd of others.
#[tokio::test]
async fn one_request_bans_at_most_two_addresses() {
    let server = Server::start(CONFIG);
    let mut rls = server.grpc_client().await;
    let crowd: Vec<_> = (1..=5)
        .map(|i| descriptor(&[("remote_address", &format!("198.51.100.{i}"))]))
        .collect();
    for _ in 0..2 {
        let r = should_rate_limit(&mut rls, "edge", crowd.clone(), 1).await;
        assert_eq!(code(r.overall_code), Code::Ok);
    }
    let r = should_rate_limit(&mut rls, "edge", crowd.clone(), 1).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let (status, page) = server.get_admin("/v1/blocklist").await;
    assert_eq!(status, 200, "{page}");
    let banned: Vec<&str> = page["bans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["value"].as_str().unwrap())
        .collect();
    assert_eq!(banned.len(), 2, "{page}");
    assert!(
        banned
            .iter()
            .all(|b| ["198.51.100.1", "198.51.100.2"].contains(b)),
        "{page}"
    );
}
