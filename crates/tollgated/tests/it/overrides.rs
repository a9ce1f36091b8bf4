//! Per-identity overrides over the admin API: set, counted by at the next check, listed,
//! removed; malformed requests say what is wrong. On the memory store and on Redis.

use reqwest::Method;
use serde_json::{Value, json};
use tollgate_testkit::RedisServer;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::support::{
    ADMIN_TOKEN, Server, assert_problem, descriptor, error_message, should_rate_limit,
};

const POLICIES: &str = r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[policies.api]
limiters = [{ by = "user_id", rules = ["2/1m", "100/1d"], algorithm = "fixed_window", overrides = true }]

[policies.plain]
limiters = [{ by = "user_id", rules = ["2/1m"] }]

[[envoy.domains]]
name = "edge"
descriptors = [
  { key = "api_key", rules = ["2/1m"], algorithm = "fixed_window", overrides = true },
  { key = "path", rules = ["2/1m"] },
]
"#;

async fn admin(server: &Server, method: Method, body: Option<Value>) -> (u16, Value) {
    let mut request = server
        .request(method, "/v1/overrides")
        .bearer_auth(ADMIN_TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    server.send(request).await
}

async fn allowed(server: &Server, user: &str, cost: u64) -> Value {
    let (status, d) = server
        .post(
            "/v1/check",
            json!({ "policy": "api", "identity": { "user_id": user }, "cost": cost }),
        )
        .await;
    assert_eq!(status, 200, "{d}");
    d
}

async fn overrides_over_the_api(server: &Server) {
    // Two used of 2 a minute; raised to 5: three more, and the decision names the new limit.
    assert_eq!(allowed(server, "acme", 2).await["allowed"], true);
    assert_eq!(allowed(server, "acme", 1).await["allowed"], false);
    let set = json!({
        "policy": "api", "limiter": "user_id", "identity": { "user_id": "acme" },
        "rules": ["5/1m"], "ttl": "30d",
    });
    let (status, body) = admin(server, Method::PUT, Some(set)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["override"]["rules"],
        json!(["5/1m", "100/1d"]),
        "{body}"
    );
    let ends = body["override"]["expires_at_ms"].as_u64().unwrap();
    let month = 30 * 86_400_000;
    let now = crate::support::now_us() / 1000;
    assert!(
        (now + month - 60_000..=now + month + 60_000).contains(&ends),
        "{body}"
    );

    let d = allowed(server, "acme", 3).await;
    assert_eq!(d["allowed"], true, "{d}");
    assert_eq!(d["rules"][0]["limit"], 5, "{d}");
    assert_eq!(d["rules"][0]["remaining"], 0, "{d}");
    assert_eq!(allowed(server, "acme", 1).await["allowed"], false);
    // Others keep the configured limits.
    assert_eq!(allowed(server, "other", 2).await["allowed"], true);
    let d = allowed(server, "other", 1).await;
    assert_eq!(
        (d["allowed"].clone(), d["rules"][0]["limit"].clone()),
        (json!(false), json!(2))
    );

    let (status, list) = admin(server, Method::GET, None).await;
    assert_eq!(status, 200, "{list}");
    let listed = list["overrides"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(
        (
            &listed[0]["policy"],
            &listed[0]["limiter"],
            &listed[0]["value"]
        ),
        (&json!("api"), &json!("user_id"), &json!("acme"))
    );
    assert_eq!(listed[0]["expires_at_ms"], ends);

    // Removed: the configured 2 again (5 are used), and a second removal finds nothing.
    let target =
        json!({ "policy": "api", "limiter": "user_id", "identity": { "user_id": "acme" } });
    let (status, body) = admin(server, Method::DELETE, Some(target.clone())).await;
    assert_eq!((status, body), (200, json!({ "removed": true })));
    let d = allowed(server, "acme", 1).await;
    assert_eq!(
        (d["allowed"].clone(), d["rules"][0]["limit"].clone()),
        (json!(false), json!(2))
    );
    let (status, body) = admin(server, Method::DELETE, Some(target)).await;
    assert_eq!(
        (status, body["code"].clone()),
        (404, json!("no_override")),
        "{body}"
    );
    let (_, list) = admin(server, Method::GET, None).await;
    assert_eq!(list["overrides"], json!([]), "{list}");
}

async fn bad_overrides_say_what_is_wrong(server: &Server) {
    let cases = [
        (
            json!({ "policy": "nope", "limiter": "user_id", "identity": { "user_id": "a" }, "rules": ["5/1m"] }),
            404,
            "unknown_policy",
        ),
        (
            json!({ "policy": "api", "limiter": "ip", "identity": { "user_id": "a" }, "rules": ["5/1m"] }),
            404,
            "unknown_limiter",
        ),
        (
            json!({ "policy": "plain", "limiter": "user_id", "identity": { "user_id": "a" }, "rules": ["5/1m"] }),
            409,
            "not_overridable",
        ),
        (
            json!({ "policy": "api", "limiter": "user_id", "identity": { "ip": "192.0.2.1" }, "rules": ["5/1m"] }),
            400,
            "missing_dimension",
        ),
        (
            json!({ "policy": "api", "limiter": "user_id", "identity": { "user_id": "a" }, "rules": ["5/2m"] }),
            400,
            "invalid_override",
        ),
        (
            json!({ "policy": "api", "limiter": "user_id", "identity": { "user_id": "a" }, "rules": ["five/1m"] }),
            400,
            "invalid_rule",
        ),
        (
            json!({ "policy": "api", "limiter": "user_id", "identity": { "user_id": "a" }, "rules": ["5/1m"], "ttl": "soon" }),
            400,
            "bad_request",
        ),
    ];
    for (body, status, code) in cases {
        let (got, answer) = admin(server, Method::PUT, Some(body.clone())).await;
        assert_eq!(
            (got, answer["code"].clone()),
            (status, json!(code)),
            "{body}: {answer}"
        );
        assert_problem(&answer, status);
    }
    // Without the admin token: refused.
    let (status, _) = server
        .send(server.request(Method::GET, "/v1/overrides"))
        .await;
    assert_eq!(status, 401);
}

/// Envoy's `ShouldRateLimit` counts a descriptor value by its override.
async fn envoy_descriptors_take_overrides(server: &Server) {
    let client = server.grpc_client().await;
    let code = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        Code::try_from(r.overall_code).unwrap()
    };
    let hit = |key: &'static str, value: &'static str| {
        let mut client = client.clone();
        async move { should_rate_limit(&mut client, "edge", vec![descriptor(&[(key, value)])], 1).await }
    };
    for _ in 0..2 {
        assert_eq!(code(&hit("api_key", "partner").await), Code::Ok);
    }
    assert_eq!(code(&hit("api_key", "partner").await), Code::OverLimit);
    let set = json!({
        "domain": "edge", "descriptor": [{ "key": "api_key", "value": "partner" }],
        "rules": ["4/1m"],
    });
    let (status, body) = admin(server, Method::PUT, Some(set)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["override"]["rules"], json!(["4/1m"]), "{body}");
    assert_eq!(body["override"]["policy"], "envoy:edge", "{body}");
    // Two more for the partner, with the new limit in the answer; others keep 2.
    let r = hit("api_key", "partner").await;
    assert_eq!(code(&r), Code::Ok, "{r:?}");
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(4),
        "{r:?}"
    );
    assert_eq!(code(&hit("api_key", "partner").await), Code::Ok);
    assert_eq!(code(&hit("api_key", "partner").await), Code::OverLimit);
    for _ in 0..2 {
        assert_eq!(code(&hit("api_key", "other").await), Code::Ok);
    }
    assert_eq!(code(&hit("api_key", "other").await), Code::OverLimit);
    let (_, list) = admin(server, Method::GET, None).await;
    let envoy: Vec<&Value> = list["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["policy"] == "envoy:edge")
        .collect();
    assert_eq!(envoy.len(), 1, "{list}");
    assert_eq!(envoy[0]["rules"], json!(["4/1m"]), "{list}");

    // A descriptor that takes none, and one no node limits, say so.
    for entries in [
        json!([{ "key": "path", "value": "/a" }]),
        json!([{ "key": "nope", "value": "x" }]),
    ] {
        let (status, body) = admin(
            server,
            Method::PUT,
            Some(json!({ "domain": "edge", "descriptor": entries, "rules": ["4/1m"] })),
        )
        .await;
        assert_eq!(
            (status, body["code"].clone()),
            (400, json!("invalid_override")),
            "{body}"
        );
    }
    let (status, body) = admin(
        server,
        Method::DELETE,
        Some(json!({ "domain": "edge", "descriptor": [{ "key": "api_key", "value": "partner" }] })),
    )
    .await;
    assert_eq!((status, body), (200, json!({ "removed": true })));
}

/// `GET /v1/overrides` answers a page at a time, in the order overrides end (those that never
/// end last), and follows its `next_cursor` to the end; a bad `limit` or `cursor` is a 400.
async fn overrides_listed_page_by_page(server: &Server) {
    let (_, before) = admin(server, Method::GET, None).await;
    let mut expected: Vec<String> = before["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["value"].as_str().unwrap().to_owned())
        .collect();
    for (i, ttl) in ["1h", "2h", "1h", "3h"].iter().enumerate() {
        let user = format!("paged-{i}");
        let set = json!({
            "policy": "api", "limiter": "user_id", "identity": { "user_id": user },
            "rules": ["7/1m"], "ttl": ttl,
        });
        let (status, body) = admin(server, Method::PUT, Some(set)).await;
        assert_eq!(status, 200, "{body}");
        expected.push(user);
    }
    let (mut listed, mut ends, mut path) =
        (Vec::new(), Vec::new(), "/v1/overrides?limit=2".to_owned());
    loop {
        let (status, page) = server.get_admin(&path).await;
        assert_eq!(status, 200, "{page}");
        let overrides = page["overrides"].as_array().unwrap();
        assert!(overrides.len() <= 2, "{page}");
        for o in overrides {
            listed.push(o["value"].as_str().unwrap().to_owned());
            ends.push(o["expires_at_ms"].as_u64().unwrap_or(u64::MAX));
        }
        match &page["next_cursor"] {
            Value::String(cursor) => path = format!("/v1/overrides?limit=2&cursor={cursor}"),
            Value::Null => break,
            other => panic!("next_cursor {other}"),
        }
        assert!(listed.len() < 100, "the pages never end");
    }
    assert!(ends.windows(2).all(|w| w[0] <= w[1]), "{ends:?}");
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected, "every override once");
    for (query, says) in [
        ("limit=0", "limit \"0\": expected a number from 1 to 1000"),
        ("limit=1001", "limit"),
        ("limit=many", "limit"),
        ("cursor=nonsense", "cursor"),
        ("cursor=1.zz", "cursor"),
        ("page=2", "page"),
    ] {
        let (status, body) = server.get_admin(&format!("/v1/overrides?{query}")).await;
        let message = error_message(status, &body, 400);
        assert!(message.contains(says), "{query}: {message}");
    }
}

#[tokio::test]
async fn overrides_on_the_memory_store() {
    let server = Server::start(POLICIES);
    overrides_over_the_api(&server).await;
    bad_overrides_say_what_is_wrong(&server).await;
    envoy_descriptors_take_overrides(&server).await;
    overrides_listed_page_by_page(&server).await;
}

#[tokio::test]
async fn overrides_on_redis() {
    let redis = RedisServer::start();
    let config = format!(
        "[store]\nurl = \"{}\"\ntimeout = \"5s\"\n{POLICIES}",
        redis.url()
    );
    let server = Server::start(&config);
    overrides_over_the_api(&server).await;
    bad_overrides_say_what_is_wrong(&server).await;
    envoy_descriptors_take_overrides(&server).await;
    overrides_listed_page_by_page(&server).await;
}
