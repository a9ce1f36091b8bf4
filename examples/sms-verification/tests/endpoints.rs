//! Every endpoint of the example over real HTTP, on the memory store.

#![allow(clippy::unwrap_used)]

use std::{net::SocketAddr, sync::Arc};

use serde_json::{Value, json};
use tollgate::{AnyStore, MemoryStore, Tollgate};

struct Server {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> Server {
    let gate = Arc::new(Tollgate::new(AnyStore::new(MemoryStore::new())));
    let config = sms_verification::Config {
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        instance: "t".into(),
    };
    let app = sms_verification::app(gate, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    Server { url, task }
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn sms_codes_are_limited_per_ip_and_a_violation_bans_the_ip() {
    let server = start().await;
    let http = reqwest::Client::new();
    let send = |ip: &str, user: Option<&str>| {
        let mut request = http
            .post(format!("{}/sms/code", server.url))
            .header("x-forwarded-for", ip)
            .json(&json!({ "phone": "+1 555 0100" }));
        if let Some(user) = user {
            request = request.header("x-user-id", user);
        }
        request.send()
    };

    let anonymous = send("198.51.100.1", None).await.unwrap();
    assert_eq!(anonymous.status(), 401);

    let sent = send("198.51.100.1", Some("alice")).await.unwrap();
    assert_eq!(sent.status(), 200);
    assert_eq!(
        header(&sent, "ratelimit-policy").as_deref(),
        Some(
            r#""ip-1m";q=1;w=60, "ip-1h";q=10;w=3600, "ip-1d";q=60;w=86400, "user_id-1d";q=20;w=86400"#
        )
    );
    assert_eq!(sent.json::<Value>().await.unwrap(), json!({ "sent": true }));

    // The second code within a minute is a violation: 429, and the IP is banned for 10 min.
    let violation = send("198.51.100.1", Some("alice")).await.unwrap();
    assert_eq!(violation.status(), 429);
    assert_eq!(header(&violation, "retry-after").as_deref(), Some("600"));
    let problem: Value = violation.json().await.unwrap();
    assert_eq!(problem["violated"][0]["rule"], "1/1m");

    let blocked = send("198.51.100.1", Some("carol")).await.unwrap();
    assert_eq!(blocked.status(), 403);
    assert!(header(&blocked, "retry-after").is_some());

    // Another address is not affected by the ban.
    assert_eq!(
        send("198.51.100.2", Some("dave")).await.unwrap().status(),
        200
    );

    let bad_phone = http
        .post(format!("{}/sms/code", server.url))
        .header("x-forwarded-for", "198.51.100.3")
        .header("x-user-id", "erin")
        .json(&json!({ "phone": "12" }))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_phone.status(), 400);
}

#[tokio::test]
async fn a_user_gets_twenty_codes_a_day_from_any_address() {
    let server = start().await;
    let http = reqwest::Client::new();
    let send = |n: u32| {
        http.post(format!("{}/sms/code", server.url))
            .header("x-forwarded-for", format!("203.0.113.{n}"))
            .header("x-user-id", "frank")
            .json(&json!({ "phone": "+1 555 0100" }))
            .send()
    };
    for n in 0..20 {
        assert_eq!(send(n).await.unwrap().status(), 200, "code {n}");
    }
    let refused = send(20).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(header(&refused, "retry-after").is_some());
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["detail"], "daily code quota used up");
    // The refusal cost the new address nothing: its minute is still free.
    let other_user = http
        .post(format!("{}/sms/code", server.url))
        .header("x-forwarded-for", "203.0.113.20")
        .header("x-user-id", "grace")
        .json(&json!({ "phone": "+1 555 0101" }))
        .send()
        .await
        .unwrap();
    assert_eq!(other_user.status(), 200);
}

#[tokio::test]
async fn orders_are_idempotent() {
    let server = start().await;
    let http = reqwest::Client::new();
    let order = |key: Option<&str>, item: &str| {
        let mut request = http
            .post(format!("{}/orders", server.url))
            .header("x-user-id", "alice")
            .json(&json!({ "item": item }));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send()
    };
    let first = order(Some("8e03978e-40d5-43e8-bc93-6894a57f9324"), "book")
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    let first_body = first.bytes().await.unwrap();
    let created: Value = serde_json::from_slice(&first_body).unwrap();
    assert!(created["order_id"].as_str().unwrap().starts_with("ord-t-"));

    let replay = order(Some("8e03978e-40d5-43e8-bc93-6894a57f9324"), "book")
        .await
        .unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(
        header(&replay, "idempotency-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(replay.bytes().await.unwrap(), first_body);

    let reused = order(Some("8e03978e-40d5-43e8-bc93-6894a57f9324"), "pen")
        .await
        .unwrap();
    assert_eq!(reused.status(), 422);
    assert_eq!(order(None, "book").await.unwrap().status(), 400);
}

#[tokio::test]
async fn profile_updates_are_guarded_per_user() {
    let server = start().await;
    let http = reqwest::Client::new();
    let update = |user: Option<&str>| {
        let mut request = http
            .post(format!("{}/profile", server.url))
            .json(&json!({ "name": "Alice" }));
        if let Some(user) = user {
            request = request.header("x-user-id", user);
        }
        request.send()
    };
    assert_eq!(update(Some("alice")).await.unwrap().status(), 200);
    let repeat = update(Some("alice")).await.unwrap();
    assert_eq!(repeat.status(), 429);
    assert!(header(&repeat, "retry-after").is_some());
    assert_eq!(update(Some("bob")).await.unwrap().status(), 200);
    assert_eq!(update(None).await.unwrap().status(), 401);
}

#[tokio::test]
async fn stats_are_limited_except_for_the_admin() {
    let server = start().await;
    let http = reqwest::Client::new();
    let stats = |user: &str| {
        http.get(format!("{}/admin/stats", server.url))
            .header("x-user-id", user)
            .send()
    };
    for _ in 0..8 {
        let admin = stats("admin").await.unwrap();
        assert_eq!(admin.status(), 200);
        assert_eq!(header(&admin, "ratelimit"), None);
    }
    for n in 0..5 {
        assert_eq!(stats("bob").await.unwrap().status(), 200, "request {n}");
    }
    assert_eq!(stats("bob").await.unwrap().status(), 429);
    let body: Value = stats("admin").await.unwrap().json().await.unwrap();
    assert_eq!(body["instance"], "t");
    assert_eq!(body["bans"], json!([]));
}
