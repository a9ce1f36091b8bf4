//! Fuzzed requests through the duplicate layer: arbitrary `Idempotency-Key` bytes, user ids,
//! paths, queries and bodies. Nothing panics; every refusal is a 4xx; a replay is the first
//! response and a reused key with another body is a 422.
//!
//! Cases per property: `PROPTEST_CASES` (64 when unset); `scripts/fuzz` runs many more.

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    http::{HeaderValue, Request, StatusCode},
    response::IntoResponse,
    routing::post,
};
use proptest::prelude::*;
use tollgate::{MemoryStore, Tollgate};
use tollgate_tower::{DuplicateLayer, IdentityResolver};
use tower::ServiceExt as _;

/// `PROPTEST_CASES` when set, else a count small enough for every CI run.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 64;
    }
    config
}

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
});

async fn created(body: Bytes) -> impl IntoResponse {
    let echo = String::from_utf8_lossy(&body).into_owned();
    (
        StatusCode::CREATED,
        [("x-echo-len", echo.len().to_string())],
        serde_json::json!({ "echo": echo }).to_string(),
    )
}

fn users() -> IdentityResolver {
    IdentityResolver::new().enrich(|who, headers, _| {
        match headers.get("x-user-id").and_then(|v| v.to_str().ok()) {
            Some(id) => who.with_user_id(id),
            None => who,
        }
    })
}

/// Every mode of the layer, on one engine.
fn app(gate: Arc<Tollgate<MemoryStore>>) -> Router {
    Router::new()
        .route(
            "/orders",
            post(created).layer(
                DuplicateLayer::idempotency_key(gate.clone(), "orders")
                    .ttl(Duration::from_secs(30))
                    .resolver(users()),
            ),
        )
        .route(
            "/optional",
            post(created).layer(
                DuplicateLayer::idempotency_key(gate.clone(), "optional")
                    .require_key(false)
                    .max_response(16),
            ),
        )
        .route(
            "/comments",
            post(created).layer(
                DuplicateLayer::new(gate.clone(), "comments", "args".parse().unwrap())
                    .ttl(Duration::from_secs(5))
                    .max_body(1024),
            ),
        )
        .route(
            "/profile",
            post(created).layer(
                DuplicateLayer::new(gate.clone(), "profile", "user_id".parse().unwrap())
                    .global(true)
                    .resolver(users()),
            ),
        )
        .route(
            "/by-header",
            post(created).layer(DuplicateLayer::new(
                gate,
                "by-header",
                "header:x-client".parse().unwrap(),
            )),
        )
}

/// One router for every case: locks and stored responses carry over between cases.
static APP: LazyLock<Router> = LazyLock::new(|| app(Arc::new(Tollgate::new(MemoryStore::new()))));

#[derive(Clone, Debug)]
struct Submission {
    path: String,
    keys: Vec<Vec<u8>>,
    user: Option<Vec<u8>>,
    client: Option<Vec<u8>>,
    content_length: Option<String>,
    body: Vec<u8>,
}

/// Header bytes: visible ASCII keys (some quoted, some long), and arbitrary bytes.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => "[!-~]{1,40}".prop_map(String::into_bytes),
        1 => "\"[!-~]{0,40}\"".prop_map(String::into_bytes),
        1 => "[ -~\t]{0,8}".prop_map(String::into_bytes),
        1 => "[a-z]{250,260}".prop_map(String::into_bytes),
        1 => Just(b"\"".to_vec()),
        1 => Just(b"\"\"".to_vec()),
        2 => prop::collection::vec(any::<u8>(), 0..40),
        1 => prop::collection::vec(0x80u8.., 1..10),
    ]
}

fn submission() -> impl Strategy<Value = Submission> {
    (
        (
            prop::sample::select(vec![
                "/orders",
                "/optional",
                "/comments",
                "/profile",
                "/by-header",
            ]),
            prop::option::weighted(0.3, "[a-zA-Z0-9=&%._~-]{0,20}"),
        ),
        prop::collection::vec(header_bytes(), 0..3),
        prop::option::weighted(0.5, header_bytes()),
        prop::option::weighted(0.3, header_bytes()),
        prop::option::weighted(
            0.1,
            prop_oneof![
                Just("0".to_owned()),
                Just("1025".to_owned()),
                Just("18446744073709551615".to_owned()),
                Just("99999999999999999999".to_owned()),
                Just("-1".to_owned()),
                Just("abc".to_owned()),
            ],
        ),
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            prop::collection::vec(any::<u8>(), 1000..1100),
            Just(b"{}".to_vec()),
        ],
    )
        .prop_map(
            |((path, query), keys, user, client, content_length, body)| Submission {
                path: match query {
                    Some(q) => format!("{path}?{q}"),
                    None => path.to_owned(),
                },
                keys,
                user,
                client,
                content_length,
                body,
            },
        )
}

/// Sends `s`; `None` if it is not a request a client could send (bytes no header allows).
async fn send(app: &Router, s: &Submission) -> Option<(StatusCode, http::HeaderMap, Bytes)> {
    let mut request = Request::post(s.path.as_str());
    for key in &s.keys {
        request = request.header("idempotency-key", HeaderValue::from_bytes(key).ok()?);
    }
    if let Some(user) = &s.user {
        request = request.header("x-user-id", HeaderValue::from_bytes(user).ok()?);
    }
    if let Some(client) = &s.client {
        request = request.header("x-client", HeaderValue::from_bytes(client).ok()?);
    }
    if let Some(len) = &s.content_length {
        request = request.header("content-length", len.as_str());
    }
    let request = request.body(Body::from(s.body.clone())).ok()?;
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    Some((parts.status, parts.headers, bytes))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_keys_and_bodies_get_an_answer_never_a_panic(subs in prop::collection::vec(submission(), 1..6)) {
        RUNTIME.block_on(async {
            for s in &subs {
                let Some((status, _, body)) = send(&APP, s).await else { continue };
                let allowed = [201, 400, 401, 409, 413, 422, 429];
                assert!(
                    allowed.contains(&status.as_u16()),
                    "{s:?} -> {status}: {}",
                    String::from_utf8_lossy(&body)
                );
            }
        });
    }

    #[test]
    fn a_valid_key_replays_its_first_response_and_refuses_another_body(
        key in "[!-~]{1,64}",
        user in prop::option::of("[!-~]{1,20}"),
        body in prop::collection::vec(any::<u8>(), 0..200),
        other in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        RUNTIME.block_on(async {
            let app = app(Arc::new(Tollgate::new(MemoryStore::new())));
            let s = Submission {
                path: "/orders".into(),
                keys: vec![key.clone().into_bytes()],
                user: user.map(String::into_bytes),
                client: None,
                content_length: None,
                body: body.clone(),
            };
            let (status, _, first) = send(&app, &s).await.unwrap();
            // A quoted empty key ("\"\"") is no key.
            if key == "\"\"" {
                assert_eq!(status, 400);
                return;
            }
            assert_eq!(status, 201, "{s:?}");
            let (status, headers, replay) = send(&app, &s).await.unwrap();
            assert_eq!(status, 201, "{s:?}");
            assert_eq!(headers["idempotency-replayed"], "true");
            assert_eq!(replay, first);
            if other != body {
                let (status, _, _) = send(&app, &Submission { body: other.clone(), ..s.clone() }).await.unwrap();
                assert_eq!(status, 422, "{s:?} then {other:?}");
            }
        });
    }
}
