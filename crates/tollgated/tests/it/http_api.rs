//! The HTTP/JSON API, black-box.

use serde_json::{Value, json};

use crate::support::{Server, error_message, remaining};

const CONFIG: &str = r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[policies.login]
limiters = [
  { by = "ip", rules = ["2/3s", "3/1h"] },
  { by = "user_id", rules = ["5/1h"], message = "too many for this user" },
]

[policies.sms_code]
limiters = [{ by = "ip", rules = ["1/1h"], blocklist = "1h" }]
bypass = { user_ids = ["admin"], ips = ["10.0.0.0/8"] }
duplicate = { by = "args", ttl = "30s" }

[policies.order]
limiters = [{ by = "user_id", rules = ["100/1h"] }]
duplicate = { by = "key", ttl = "30s" }

[policies.by_header]
limiters = [{ by = "header:x-api-key", rules = ["1/1h"] }]
"#;

fn who(ip: &str, user: &str) -> Value {
    json!({ "ip": ip, "user_id": user })
}

#[tokio::test]
async fn check_enforces_every_rule_of_every_limiter_all_or_nothing() {
    let server = Server::start(CONFIG);

    // Two rules on one limiter: the short window denies first, the hour rule counts too.
    let first = server.check("login", who("192.0.2.1", "u1")).await;
    assert_eq!(first["allowed"], true);
    assert_eq!(first["reason"], "ok");
    assert_eq!(first["retry_after_ms"], Value::Null);
    assert_eq!(remaining(&first, "ip", "2/3s"), 1);
    assert_eq!(remaining(&first, "ip", "3/1h"), 2);
    assert_eq!(remaining(&first, "user_id", "5/1h"), 4);
    let rule = &first["rules"][0];
    assert_eq!(rule["limit"], 2);
    assert!(rule["reset_after_ms"].as_u64().unwrap() <= 3000);

    assert_eq!(
        server.check("login", who("192.0.2.1", "u1")).await["allowed"],
        true
    );
    let denied = server.check("login", who("192.0.2.1", "u1")).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    assert_eq!(denied["reason"], "rate_limited");
    let retry = denied["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 0 && retry <= 3000, "{denied}");
    // The denied request cost nothing anywhere: the user's quota is as it was.
    assert_eq!(remaining(&denied, "user_id", "5/1h"), 3);
    assert_eq!(remaining(&denied, "ip", "3/1h"), 1);

    // Once the short window has moved on, the hour rule has one left, then denies.
    tokio::time::sleep(std::time::Duration::from_millis(retry + 50)).await;
    let third = server.check("login", who("192.0.2.1", "u1")).await;
    assert_eq!(third["allowed"], true, "{third}");
    assert_eq!(remaining(&third, "ip", "3/1h"), 0);
    let over = server.check("login", who("192.0.2.1", "u1")).await;
    assert_eq!(over["allowed"], false);
    let denying: Vec<&str> = over["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["remaining"] == 0)
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert!(denying.contains(&"3/1h"), "{over}");

    // Across limiters: the user limiter denies, and the fresh IP it came from is not charged.
    for i in 0..2 {
        let d = server
            .check("login", who(&format!("198.51.100.{i}"), "u1"))
            .await;
        assert_eq!(d["allowed"], true, "{d}");
    }
    let user_denied = server.check("login", who("198.51.100.9", "u1")).await;
    assert_eq!(user_denied["allowed"], false, "{user_denied}");
    assert_eq!(user_denied["message"], "too many for this user");
    assert_eq!(remaining(&user_denied, "ip", "2/3s"), 2);
    let other_user = server.check("login", who("198.51.100.9", "u2")).await;
    assert_eq!(other_user["allowed"], true);
    assert_eq!(remaining(&other_user, "ip", "3/1h"), 2);

    // Cost: several units at once.
    let (status, body) = server
        .post(
            "/v1/check",
            json!({ "policy": "login", "identity": who("203.0.113.1", "u3"), "cost": 2 }),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(remaining(&body, "ip", "2/3s"), 0);
    assert_eq!(remaining(&body, "user_id", "5/1h"), 3);

    // Dimensions from headers (case-insensitive names).
    let key = json!({ "headers": { "X-Api-Key": "k1" } });
    assert_eq!(
        server.check("by_header", key.clone()).await["allowed"],
        true
    );
    assert_eq!(server.check("by_header", key).await["allowed"], false);
}

#[tokio::test]
async fn peek_consumes_nothing_and_reset_is_admin_only() {
    let server = Server::start(CONFIG);
    let req = json!({ "policy": "login", "identity": who("192.0.2.7", "p1") });
    for _ in 0..2 {
        let (status, peek) = server.post("/v1/peek", req.clone()).await;
        assert_eq!(status, 200);
        assert_eq!(peek["allowed"], true);
        assert_eq!(remaining(&peek, "user_id", "5/1h"), 4);
    }
    server.check("login", who("192.0.2.7", "p1")).await;
    let (_, peek) = server.post("/v1/peek", req.clone()).await;
    assert_eq!(remaining(&peek, "user_id", "5/1h"), 3);

    // Reset: 401 without or with a wrong token, and counters stay.
    let reset = json!({ "policy": "login", "identity": who("192.0.2.7", "p1") });
    let (status, body) = server.post("/v1/reset", reset.clone()).await;
    let msg = error_message(status, &body, 401);
    assert!(msg.contains("Bearer"), "{msg}");
    let (status, body) = server
        .send(
            server
                .request(reqwest::Method::POST, "/v1/reset")
                .bearer_auth("wrong")
                .json(&reset),
        )
        .await;
    error_message(status, &body, 401);
    let (_, peek) = server.post("/v1/peek", req.clone()).await;
    assert_eq!(remaining(&peek, "user_id", "5/1h"), 3);

    let (status, body) = server.post_admin("/v1/reset", reset).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "reset": true }));
    let (_, peek) = server.post("/v1/peek", req).await;
    assert_eq!(remaining(&peek, "user_id", "5/1h"), 4);
    assert_eq!(remaining(&peek, "ip", "3/1h"), 2);
}

#[tokio::test]
async fn every_client_error_is_a_json_body_saying_what_is_wrong() {
    let server = Server::start(CONFIG);
    let post_raw = |body: &'static str, content_type: &'static str| {
        server
            .request(reqwest::Method::POST, "/v1/check")
            .header("content-type", content_type)
            .body(body)
    };

    let (s, b) = server
        .send(post_raw(r#"{"policy": "login""#, "application/json"))
        .await;
    assert!(
        error_message(s, &b, 400).starts_with("malformed JSON"),
        "{b}"
    );

    let (s, b) = server
        .send(post_raw(r#"{"policy": "login"}"#, "text/plain"))
        .await;
    assert!(
        error_message(s, &b, 415).contains("Content-Type: application/json"),
        "{b}"
    );

    let (s, b) = server.post("/v1/check", json!({ "identity": {} })).await;
    assert!(
        error_message(s, &b, 422).contains("missing field `policy`"),
        "{b}"
    );

    let (s, b) = server
        .post(
            "/v1/check",
            json!({ "policy": "login", "identity": { "ip": "300.1.1.1" } }),
        )
        .await;
    let msg = error_message(s, &b, 422);
    assert!(
        msg.contains("identity.ip") && msg.contains("invalid IP address"),
        "{msg}"
    );

    let (s, b) = server
        .post(
            "/v1/check",
            json!({ "policy": "login", "identity": { "ipp": "1.1.1.1" } }),
        )
        .await;
    assert!(
        error_message(s, &b, 422).contains("unknown field `ipp`"),
        "{b}"
    );

    let (s, b) = server
        .post("/v1/check", json!({ "policy": "login", "cost": -1 }))
        .await;
    assert!(error_message(s, &b, 422).contains("cost"), "{b}");

    let (s, b) = server.post("/v1/check", json!({ "policy": "nope" })).await;
    assert_eq!(error_message(s, &b, 404), r#"unknown policy "nope""#);
    let (s, b) = server.post("/v1/peek", json!({ "policy": "nope" })).await;
    error_message(s, &b, 404);

    let (s, b) = server
        .post(
            "/v1/check",
            json!({ "policy": "login", "identity": { "ip": "192.0.2.1" } }),
        )
        .await;
    let msg = error_message(s, &b, 422);
    assert!(
        msg.contains("user_id") && msg.contains("does not carry"),
        "{msg}"
    );

    let (s, b) = server.get("/v1/nothing-here").await;
    error_message(s, &b, 404);
    let (s, b) = server.get("/v1/check").await;
    error_message(s, &b, 405);

    let (s, b) = server
        .post("/v1/duplicate/release", json!({ "lease": "junk" }))
        .await;
    assert!(
        error_message(s, &b, 400).starts_with("malformed lease"),
        "{b}"
    );
    let (s, b) = server
        .post(
            "/v1/duplicate/acquire",
            json!({ "policy": "login", "identity": {} }),
        )
        .await;
    assert!(
        error_message(s, &b, 404).contains("no duplicate guard"),
        "{b}"
    );

    let (s, b) = server.get("/v1/blocklist").await;
    error_message(s, &b, 401);
    let (s, b) = server
        .send(server.request(reqwest::Method::DELETE, "/v1/blocklist/ip/192.0.2.1"))
        .await;
    error_message(s, &b, 401);
    let (s, b) = server
        .send(
            server
                .request(reqwest::Method::DELETE, "/v1/blocklist/cookie/x")
                .bearer_auth(crate::support::ADMIN_TOKEN),
        )
        .await;
    assert!(
        error_message(s, &b, 400).contains("unknown ban kind"),
        "{b}"
    );
    let (s, b) = server
        .send(
            server
                .request(reqwest::Method::DELETE, "/v1/blocklist/ip/not-an-ip")
                .bearer_auth(crate::support::ADMIN_TOKEN),
        )
        .await;
    assert!(
        error_message(s, &b, 400).contains("not an IP address"),
        "{b}"
    );
    let (s, b) = server
        .send(
            server
                .request(reqwest::Method::DELETE, "/v1/blocklist/ip/192.0.2.200")
                .bearer_auth(crate::support::ADMIN_TOKEN),
        )
        .await;
    assert!(
        error_message(s, &b, 404).contains("not on the blocklist"),
        "{b}"
    );
}

#[tokio::test]
async fn a_violation_bans_and_an_admin_unbans() {
    let server = Server::start(CONFIG);
    let offender = who("192.0.2.66", "mallory");
    assert_eq!(
        server.check("sms_code", offender.clone()).await["allowed"],
        true
    );
    let denied = server.check("sms_code", offender.clone()).await;
    assert_eq!(denied["allowed"], false);
    let blocked = server.check("sms_code", offender.clone()).await;
    assert_eq!(blocked["reason"], "blocked", "{blocked}");
    assert!(
        blocked["retry_after_ms"].as_u64().unwrap() > 3_500_000,
        "{blocked}"
    );
    // The ban holds for the user on another address too.
    let elsewhere = server.check("sms_code", who("192.0.2.67", "mallory")).await;
    assert_eq!(elsewhere["reason"], "blocked", "{elsewhere}");

    let (status, list) = server.get_admin("/v1/blocklist").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["next_cursor"], Value::Null, "{list}");
    let list = list["bans"].as_array().unwrap().clone();
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0]["kind"], "ip");
    assert_eq!(list[0]["value"], "192.0.2.66");
    assert_eq!(list[1]["kind"], "user_id");
    assert_eq!(list[1]["value"], "mallory");
    let left = list[0]["expires_in_ms"].as_u64().unwrap();
    assert!(left > 3_500_000 && left <= 3_600_000, "{left}");

    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_blocklist_entries 2"),
        "{metrics}"
    );

    for path in [
        "/v1/blocklist/ip/192.0.2.66",
        "/v1/blocklist/user_id/mallory",
    ] {
        let (status, body) = server
            .send(
                server
                    .request(reqwest::Method::DELETE, path)
                    .bearer_auth(crate::support::ADMIN_TOKEN),
            )
            .await;
        assert_eq!((status, body), (200, json!({ "removed": true })));
    }
    let (_, list) = server.get_admin("/v1/blocklist").await;
    assert_eq!(list, json!({ "bans": [], "next_cursor": null }));
    // No longer blocked: the hour rule still counts the first request.
    let after = server.check("sms_code", offender.clone()).await;
    assert_eq!(after["reason"], "rate_limited", "{after}");

    // An admin can ban by hand.
    let (status, body) = server
        .post_admin(
            "/v1/blocklist",
            json!({ "kind": "ip", "value": "192.0.2.99", "duration": "5m" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let banned = server.check("sms_code", who("192.0.2.99", "someone")).await;
    assert_eq!(banned["reason"], "blocked", "{banned}");
}

#[tokio::test]
async fn bypassed_identities_are_never_limited() {
    let server = Server::start(CONFIG);
    for _ in 0..3 {
        let inside = server.check("sms_code", who("10.1.2.3", "u")).await;
        assert_eq!(inside["allowed"], true, "{inside}");
        assert_eq!(inside["reason"], "bypassed");
        let admin = server.check("sms_code", who("192.0.2.10", "admin")).await;
        assert_eq!(admin["reason"], "bypassed");
    }
    let outside = server.check("sms_code", who("11.1.2.3", "u")).await;
    assert_eq!(outside["reason"], "ok");
}

#[tokio::test]
async fn duplicates_are_refused_until_released() {
    let server = Server::start(CONFIG);
    let acquire = |args: Value| json!({ "policy": "sms_code", "identity": who("192.0.2.5", "d"), "args": args });
    let (status, first) = server
        .post(
            "/v1/duplicate/acquire",
            acquire(json!({ "phone": "123", "kind": "login" })),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["acquired"], true);
    assert_eq!(first["state"], Value::Null);
    let lease = first["lease"].as_str().unwrap().to_owned();

    // The same arguments in another key order are the same submission.
    let (_, again) = server
        .post(
            "/v1/duplicate/acquire",
            acquire(json!({ "kind": "login", "phone": "123" })),
        )
        .await;
    assert_eq!(again["acquired"], false, "{again}");
    assert_eq!(again["lease"], Value::Null);
    assert_eq!(again["state"], "in_progress");
    let retry = again["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 0 && retry <= 30_000, "{again}");

    let (_, other) = server
        .post(
            "/v1/duplicate/acquire",
            acquire(json!({ "phone": "456", "kind": "login" })),
        )
        .await;
    assert_eq!(other["acquired"], true);

    let (status, released) = server
        .post("/v1/duplicate/release", json!({ "lease": lease }))
        .await;
    assert_eq!((status, released), (200, json!({ "released": true })));
    let (_, twice) = server
        .post("/v1/duplicate/release", json!({ "lease": lease }))
        .await;
    assert_eq!(twice, json!({ "released": false }));
    let (_, after) = server
        .post(
            "/v1/duplicate/acquire",
            acquire(json!({ "phone": "123", "kind": "login" })),
        )
        .await;
    assert_eq!(after["acquired"], true, "{after}");
}

#[tokio::test]
async fn metrics_and_health() {
    let server = Server::start(CONFIG);
    for _ in 0..3 {
        server.check("sms_code", who("192.0.2.30", "m")).await;
    }
    let (status, text) = server.get_text("/metrics").await;
    assert_eq!(status, 200);
    for needle in [
        r#"tollgate_decisions_total{policy="sms_code",reason="ok",allowed="true"} 1"#,
        r#"tollgate_decisions_total{policy="sms_code",reason="rate_limited",allowed="false"} 1"#,
        r#"tollgate_decisions_total{policy="sms_code",reason="blocked",allowed="false"} 1"#,
        r#"tollgate_store_latency_seconds_count{op="check"} 3"#,
        r#"tollgate_store_errors_total{op="check"} 0"#,
        "# TYPE tollgate_blocklist_entries gauge",
        "tollgate_blocklist_entries 2",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    assert_eq!(
        server.get("/healthz").await,
        (200, json!({ "status": "ok" }))
    );
    assert_eq!(
        server.get("/readyz").await,
        (
            200,
            json!({
                "status": "ready",
                "store_unavailable": { "decisions": 0, "last_ms_ago": null },
            })
        )
    );
}

#[tokio::test]
async fn completed_submissions_replay_their_response() {
    let server = Server::start(CONFIG);
    let acquire = |key: &str, args: Value| {
        json!({
            "policy": "order",
            "identity": { "user_id": "7", "headers": { "Idempotency-Key": key } },
            "args": args,
        })
    };
    let (_, first) = server
        .post("/v1/duplicate/acquire", acquire("k1", json!({ "item": 1 })))
        .await;
    assert_eq!(first["acquired"], true, "{first}");
    let lease = first["lease"].as_str().unwrap().to_owned();
    let (status, done) = server
        .post(
            "/v1/duplicate/complete",
            json!({ "lease": lease, "response": { "order": 42 }, "keep_for": "1m" }),
        )
        .await;
    assert_eq!((status, done), (200, json!({ "completed": true })));

    let (_, replay) = server
        .post("/v1/duplicate/acquire", acquire("k1", json!({ "item": 1 })))
        .await;
    assert_eq!(replay["acquired"], false, "{replay}");
    assert_eq!(replay["state"], "completed");
    assert_eq!(replay["message"], "repeated request");
    assert_eq!(replay["same_args"], true);
    assert_eq!(replay["response"], json!({ "order": 42 }));
    let retry = replay["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 30_000 && retry <= 60_000, "{replay}");

    // The same key with other arguments is reported as such, without what the first
    // submission's payload produced.
    let (_, reused) = server
        .post("/v1/duplicate/acquire", acquire("k1", json!({ "item": 2 })))
        .await;
    assert_eq!(reused["acquired"], false);
    assert_eq!(reused["same_args"], false, "{reused}");
    assert_eq!(reused["response"], Value::Null, "{reused}");

    // A key is its user's: another user's (or an anonymous caller's) `k1` is a submission of
    // its own, and never replays user 7's response.
    for identity in [
        json!({ "user_id": "8", "headers": { "Idempotency-Key": "k1" } }),
        json!({ "headers": { "Idempotency-Key": "k1" } }),
    ] {
        let request = json!({ "policy": "order", "identity": identity, "args": { "item": 1 } });
        let (_, other) = server.post("/v1/duplicate/acquire", request).await;
        assert_eq!(other["acquired"], true, "{other}");
        assert_eq!(other["response"], Value::Null, "{other}");
    }

    // A request without the key lacks the guard's dimension.
    let (s, b) = server
        .post(
            "/v1/duplicate/acquire",
            json!({ "policy": "order", "identity": { "user_id": "7" } }),
        )
        .await;
    assert!(error_message(s, &b, 422).contains("idempotency-key"), "{b}");
    let (s, b) = server
        .post("/v1/duplicate/complete", json!({ "lease": "junk" }))
        .await;
    error_message(s, &b, 400);
}

#[tokio::test]
async fn concurrent_checks_never_over_admit() {
    let server = std::sync::Arc::new(Server::start(
        r#"
[policies.burst]
limiters = [{ by = "global", rules = ["10/1h", "25/1d"] }]

[[envoy.domains]]
name = "edge"
descriptors = [{ key = "k", rules = ["10/1h"] }]
"#,
    ));
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move { server.check("burst", json!({})).await["allowed"] == true })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    assert_eq!(admitted, 10);

    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                let mut client = server.grpc_client().await;
                let r = crate::support::should_rate_limit(
                    &mut client,
                    "edge",
                    vec![crate::support::descriptor(&[("k", "v")])],
                    1,
                )
                .await;
                r.overall_code == 1
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    assert_eq!(admitted, 10);
}

#[tokio::test]
async fn ip_limiters_and_bans_count_ipv6_clients_by_network() {
    let server = Server::start(
        r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[policies.signup]
limiters = [{ by = "ip", rules = ["2/1h"], ipv6_prefix = 48, ipv4_prefix = 24 }]

[policies.sms]
limiters = [{ by = "ip", rules = ["1/1h"], blocklist = "1h" }]
"#,
    );
    let check = |policy: &'static str, ip: &'static str| {
        let server = &server;
        async move {
            let d = server.check(policy, json!({ "ip": ip })).await;
            d["reason"].as_str().unwrap().to_owned()
        }
    };
    // Three /64s of one /48 share the configured /48's two units; so do three IPv4
    // neighbours in one /24.
    for (ip, reason) in [
        ("2001:db8:1:1::1", "ok"),
        ("2001:db8:1:2::1", "ok"),
        ("2001:db8:1:3::1", "rate_limited"),
        ("2001:db8:2::1", "ok"),
        ("192.0.2.1", "ok"),
        ("192.0.2.2", "ok"),
        ("192.0.2.3", "rate_limited"),
        ("192.0.3.1", "ok"),
    ] {
        assert_eq!(check("signup", ip).await, reason, "{ip}");
    }

    // A violation from one IPv6 address bans its /64 (by default), not the next /64.
    assert_eq!(check("sms", "2001:db8:5:5::1").await, "ok");
    assert_eq!(check("sms", "2001:db8:5:5::2").await, "rate_limited");
    assert_eq!(check("sms", "2001:db8:5:5:ffff::9").await, "blocked");
    assert_eq!(check("sms", "2001:db8:5:6::1").await, "ok");

    // A manual ban of one address bans its /64; the listing shows networks.
    let (status, body) = server
        .post_admin(
            "/v1/blocklist",
            json!({ "kind": "ip", "value": "2001:db8:7::1", "duration": "5m" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(check("sms", "2001:db8:7::abcd").await, "blocked");
    let (_, list) = server.get_admin("/v1/blocklist").await;
    let mut values: Vec<&str> = list["bans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["value"].as_str().unwrap())
        .collect();
    values.sort_unstable();
    assert_eq!(values, ["2001:db8:5:5::/64", "2001:db8:7::/64"], "{list}");

    // A ban wider than one /64 is refused, saying why.
    let (status, body) = server
        .post_admin(
            "/v1/blocklist",
            json!({ "kind": "ip", "value": "2001:db8::/48", "duration": "5m" }),
        )
        .await;
    assert!(
        error_message(status, &body, 400).contains("wider than a ban covers"),
        "{body}"
    );

    // Any address of the network lifts its ban, and so does the network as listed.
    for path in [
        "/v1/blocklist/ip/2001:db8:7::ffff",
        "/v1/blocklist/ip/2001:db8:5:5::%2F64",
    ] {
        let (status, body) = server
            .send(
                server
                    .request(reqwest::Method::DELETE, path)
                    .bearer_auth(crate::support::ADMIN_TOKEN),
            )
            .await;
        assert_eq!((status, body), (200, json!({ "removed": true })), "{path}");
    }
    let (_, list) = server.get_admin("/v1/blocklist").await;
    assert_eq!(list, json!({ "bans": [], "next_cursor": null }));
    assert_eq!(check("sms", "2001:db8:7::1").await, "ok");
}

#[tokio::test]
async fn a_peek_answered_without_the_store_counts_no_store_call() {
    let server = Server::start(CONFIG);
    // Bypassed, and a cost above every limit: answered without the store.
    let (status, _) = server
        .post(
            "/v1/peek",
            json!({ "policy": "sms_code", "identity": { "ip": "10.1.2.3" } }),
        )
        .await;
    assert_eq!(status, 200);
    let (status, d) = server
        .post(
            "/v1/peek",
            json!({ "policy": "login", "identity": who("192.0.2.50", "u50"), "cost": 9 }),
        )
        .await;
    assert_eq!((status, &d["reason"]), (200, &json!("cost_exceeds_limit")));
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains(r#"tollgate_store_latency_seconds_count{op="peek"} 0"#),
        "{metrics}"
    );
    // A peek that asks the store counts one.
    server
        .post(
            "/v1/peek",
            json!({ "policy": "login", "identity": who("192.0.2.50", "u50") }),
        )
        .await;
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains(r#"tollgate_store_latency_seconds_count{op="peek"} 1"#),
        "{metrics}"
    );
}

/// An idempotency key in its structured-field form (`"k"`) and bare (`k`) is one key, as in
/// the tower layer; an empty one is a 400 that says so.
#[tokio::test]
async fn a_quoted_and_a_bare_idempotency_key_are_one_key() {
    let server = Server::start(
        r#"
[policies.orders]
limiters = [{ by = "global", rules = ["100/1s"] }]
duplicate = { by = "key", ttl = "1m" }
"#,
    );
    let acquire = |key: &str| json!({ "policy": "orders", "identity": { "headers": { "Idempotency-Key": key } }, "args": {} });
    let (status, first) = server
        .post("/v1/duplicate/acquire", acquire("\"k-1\""))
        .await;
    assert_eq!((status, &first["acquired"]), (200, &json!(true)), "{first}");
    let (_, bare) = server.post("/v1/duplicate/acquire", acquire("k-1")).await;
    assert_eq!(bare["acquired"], false, "{bare}");
    let (_, other) = server.post("/v1/duplicate/acquire", acquire("k-2")).await;
    assert_eq!(other["acquired"], true, "{other}");

    let (status, empty) = server.post("/v1/duplicate/acquire", acquire("\"\"")).await;
    assert_eq!(status, 400, "{empty}");
    assert!(
        empty.to_string().contains("Idempotency-Key is empty"),
        "{empty}"
    );
}
