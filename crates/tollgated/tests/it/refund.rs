//! `/v1/refund`: a check's units given back, exactly with the receipt its answer carried.

use serde_json::json;

use crate::support::{Server, assert_problem, now_us};

const CONFIG: &str = r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[policies.login]
limiters = [{ by = "ip", rules = ["2/1m"] }]
"#;

#[tokio::test]
async fn a_refund_gives_back_what_the_check_charged() {
    let server = Server::start(CONFIG);
    let who = json!({ "ip": "192.0.2.9" });
    let (_, first) = server
        .post(
            "/v1/check",
            json!({ "policy": "login", "identity": who, "receipt": true }),
        )
        .await;
    let receipt = first["receipt"]
        .as_str()
        .expect("an admission asked for carries a receipt")
        .to_owned();
    let second = server.check("login", who.clone()).await;
    assert_eq!(second["allowed"], true);
    assert_eq!(second.get("receipt"), None, "only when asked: {second}");
    let (_, third) = server
        .post(
            "/v1/check",
            json!({ "policy": "login", "identity": who, "receipt": true }),
        )
        .await;
    assert_eq!(third["allowed"], false);
    assert_eq!(
        third.get("receipt"),
        None,
        "a denial records nothing: {third}"
    );

    let (status, body) = server
        .post(
            "/v1/refund",
            json!({ "policy": "login", "identity": who, "receipt": receipt }),
        )
        .await;
    assert_eq!((status, &body), (200, &json!({ "refunded": 1 })));
    let fourth = server.check("login", who.clone()).await;
    assert_eq!(fourth["allowed"], true, "{fourth}");
    assert_eq!(server.check("login", who.clone()).await["allowed"], false);

    // A receipt of one unit refunds one, whatever cost is asked.
    let (_, fifth) = server
        .post(
            "/v1/check",
            json!({ "policy": "login", "identity": {"ip": "192.0.2.10"}, "receipt": true }),
        )
        .await;
    let one = fifth["receipt"].as_str().unwrap();
    server.check("login", json!({ "ip": "192.0.2.10" })).await;
    let (status, body) = server
        .post(
            "/v1/refund",
            json!({ "policy": "login", "identity": {"ip": "192.0.2.10"}, "receipt": one, "cost": 100 }),
        )
        .await;
    assert_eq!((status, &body), (200, &json!({ "refunded": 1 })));
    let after = server.check("login", json!({ "ip": "192.0.2.10" })).await;
    assert_eq!(after["allowed"], true, "{after}");
    assert_eq!(
        server.check("login", json!({ "ip": "192.0.2.10" })).await["allowed"],
        false
    );

    // Without a receipt a refund undoes anyone's checks: it takes the admin token.
    let (status, body) = server
        .post(
            "/v1/refund",
            json!({ "policy": "login", "identity": who, "cost": u64::MAX }),
        )
        .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(server.check("login", who.clone()).await["allowed"], false);
    let (status, _) = server
        .post_admin("/v1/refund", json!({ "policy": "login", "identity": who }))
        .await;
    assert_eq!(status, 200);
    assert_eq!(server.check("login", who.clone()).await["allowed"], true);

    // Mistakes are 4xx problems that say what is wrong.
    let (status, body) = server
        .post(
            "/v1/refund",
            json!({ "policy": "login", "identity": who, "receipt": "yesterday" }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_problem(&body, 400);
    assert_eq!(body["code"], "invalid_request", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("receipt"),
        "{body}"
    );
    let (status, body) = server
        .post_admin("/v1/refund", json!({ "policy": "nope", "identity": who }))
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "unknown_policy", "{body}");
    let (status, body) = server
        .post("/v1/refund", json!({ "policy": "login", "cost": -1 }))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("cost"), "{body}");
}

/// A calendar window over HTTP: the rule's reset is the zone's next midnight.
#[tokio::test]
async fn a_calendar_window_resets_at_the_zones_midnight() {
    let server = Server::start(
        r#"
[policies.daily]
limiters = [{ by = "ip", rules = ["1/1d@Asia/Tokyo"] }]
"#,
    );
    let before = now_us();
    let first = server.check("daily", json!({ "ip": "192.0.2.1" })).await;
    let after = now_us();
    assert_eq!(first["rules"][0]["rule"], "1/1d@Asia/Tokyo", "{first}");
    let reset_ms = first["rules"][0]["reset_after_ms"].as_u64().unwrap();
    let tokyo = tollgate::Calendar::new(tollgate::CalendarUnit::Day, "Asia/Tokyo").unwrap();
    // The day's end as seen at either side of the request (a midnight may pass in between).
    let (_, end_before) = tokyo.window_at(before);
    let (_, end_after) = tokyo.window_at(after);
    let ceil_ms = |us: u64| us.div_ceil(1000);
    assert!(
        (ceil_ms(end_before - after)..=ceil_ms(end_after - before)).contains(&reset_ms),
        "reset_after_ms {reset_ms}, the day ends {} ms after the request",
        (end_before - before) / 1000
    );
    let second = server.check("daily", json!({ "ip": "192.0.2.1" })).await;
    assert_eq!(second["allowed"], false, "{second}");
}
