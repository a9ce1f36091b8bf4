//! Admin authentication: failed attempts are limited per client address and logged; a
//! correct token costs nothing.

use std::net::{IpAddr, Ipv4Addr};

use serde_json::Value;

use crate::support::{ADMIN_TOKEN, Server, error_message};

const CONFIG: &str = r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[policies.api]
limiters = [{ by = "ip", rules = ["100/1m"] }]
"#;

/// A token nobody would log by accident: the logs must never contain it.
const GUESS: &str = "guess-7f3a9c-not-the-token";

/// GET `path` from `client` with `token`: status, `Retry-After`, JSON body.
async fn get(
    client: &reqwest::Client,
    server: &Server,
    path: &str,
    token: Option<&str>,
) -> (u16, Option<u64>, Value) {
    let mut request = client.get(format!("{}{path}", server.http));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let body = response.json().await.unwrap();
    (status, retry_after, body)
}

/// A client whose connections come from `ip` (any 127/8 address reaches the loopback).
fn client_from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::from(ip)))
        .build()
        .unwrap()
}

#[tokio::test]
async fn failed_admin_authentication_is_rate_limited_and_logged() {
    let mut server = Server::start(CONFIG);
    let attacker = client_from([127, 0, 0, 1]);

    // A correct token is never charged.
    for _ in 0..10 {
        let (status, _, _) = get(&attacker, &server, "/v1/blocklist", Some(ADMIN_TOKEN)).await;
        assert_eq!(status, 200);
    }

    // Five failures (wrong or missing token) are answered 401 and logged...
    for i in 0..5 {
        let token = (i != 2).then_some(GUESS);
        let (status, retry_after, body) = get(&attacker, &server, "/v1/blocklist", token).await;
        error_message(status, &body, 401);
        assert_eq!(retry_after, None);
    }
    let line = server.wait_for_line("admin authentication failed", 5);
    assert!(line.contains("client_ip=127.0.0.1"), "{line}");
    assert!(line.contains("path=/v1/blocklist"), "{line}");
    assert!(line.contains("WARN"), "{line}");

    // ...then the address is refused with 429, whatever the token.
    for token in [Some(GUESS), Some(ADMIN_TOKEN), None] {
        let (status, retry_after, body) = get(&attacker, &server, "/v1/blocklist", token).await;
        let message = error_message(status, &body, 429);
        assert!(
            message.contains("too many failed authentications"),
            "{message}"
        );
        let retry_after = retry_after.expect("a 429 without Retry-After");
        assert!((1..=60).contains(&retry_after), "{retry_after}");
    }
    let reset = attacker
        .post(format!("{}/v1/reset", server.http))
        .bearer_auth(GUESS)
        .json(&serde_json::json!({ "policy": "api" }))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 429);
    // Five warnings, the last saying the address is now refused; the refusals add none.
    assert_eq!(server.count_lines("admin authentication failed"), 5);
    assert_eq!(server.count_lines("that was the last attempt allowed"), 1);

    // Ordinary endpoints still serve the address.
    let check = server
        .check("api", serde_json::json!({ "ip": "192.0.2.1" }))
        .await;
    assert_eq!(check["allowed"], true);

    // Another address is not affected.
    let other = client_from([127, 0, 0, 2]);
    let (status, _, _) = get(&other, &server, "/v1/blocklist", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200);
    let (status, _, body) = get(&other, &server, "/v1/blocklist", Some(GUESS)).await;
    error_message(status, &body, 401);

    // The offered token is never logged.
    let logs = server.logs();
    assert!(
        !logs.contains(GUESS),
        "the offered token was logged:\n{logs}"
    );
    assert!(
        !logs.contains(ADMIN_TOKEN),
        "the admin token was logged:\n{logs}"
    );
}

#[tokio::test]
async fn the_failure_limit_is_configurable() {
    let config = CONFIG.replace(
        "admin_token_env = \"TG_TEST_ADMIN\"",
        "admin_token_env = \"TG_TEST_ADMIN\"\nadmin_failure_limit = \"1/1h\"",
    );
    let server = Server::start(&config);
    let client = reqwest::Client::new();
    let (status, _, body) = get(&client, &server, "/v1/blocklist", Some(GUESS)).await;
    error_message(status, &body, 401);
    let (status, retry_after, body) =
        get(&client, &server, "/v1/blocklist", Some(ADMIN_TOKEN)).await;
    error_message(status, &body, 429);
    let retry_after = retry_after.unwrap();
    assert!((3500..=3600).contains(&retry_after), "{retry_after}");
}

/// Failures from many addresses use up the budget of all addresses together: every wrong
/// guess is refused from then on, but the token still opens the endpoints, from any address
/// that has not used up its own budget (a few addresses cannot lock the admin out).
#[tokio::test]
async fn many_addresses_failing_cannot_lock_the_token_out() {
    let config = CONFIG.replace(
        "admin_token_env = \"TG_TEST_ADMIN\"",
        "admin_token_env = \"TG_TEST_ADMIN\"\nadmin_failure_limit = \"1/1h\"",
    );
    let server = Server::start(&config);
    // 20 addresses' worth: one failure each fills the budget of all of them.
    for i in 1..=20 {
        let guesser = client_from([127, 0, 1, i]);
        let (status, _, body) = get(&guesser, &server, "/v1/blocklist", Some(GUESS)).await;
        error_message(status, &body, 401);
    }
    let admin = client_from([127, 0, 2, 1]);
    let (status, _, body) = get(&admin, &server, "/v1/blocklist", Some(GUESS)).await;
    error_message(status, &body, 429);
    let (status, _, body) = get(&admin, &server, "/v1/blocklist", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    // An address over its own budget stays refused, the token or not.
    let guesser = client_from([127, 0, 1, 1]);
    let (status, _, body) = get(&guesser, &server, "/v1/blocklist", Some(ADMIN_TOKEN)).await;
    error_message(status, &body, 429);

    // Guesses from ever new addresses, the budget of all of them spent: refused, and logged
    // once a second at most, not once each.
    for i in 1..=30 {
        let guesser = client_from([127, 0, 3, i]);
        let (status, _, body) = get(&guesser, &server, "/v1/blocklist", Some(GUESS)).await;
        error_message(status, &body, 429);
    }
    let mut server = server;
    server.signal("TERM");
    // Every line before it was written before it.
    server.wait_for_line("stopped", 1);
    let refused = server.count_lines("failed; this address is refused for");
    assert!(
        (1..10).contains(&refused),
        "{refused} lines:\n{}",
        server.logs()
    );
}
