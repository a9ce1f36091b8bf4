use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::State,
    http::{Request, StatusCode},
    response::{AppendHeaders, IntoResponse, Response},
    routing::post,
};
use serde_json::json;
use tokio::sync::Notify;
use tollgate::DuplicateBy;
use tollgate_tower::{ContextLayer, DuplicateLayer, IdentityResolver};
use tower::Layer;
use tower::ServiceExt;

use crate::support::{Server, client, gate, header, problem};

/// The handler behind the guard: counts its calls, can fail once, can wait to be let go.
#[derive(Clone, Default)]
struct Handler {
    calls: Arc<AtomicUsize>,
    fail_next: Arc<AtomicBool>,
    limit_next: Arc<AtomicBool>,
    hold: Arc<AtomicBool>,
    entered: Arc<Notify>,
    proceed: Arc<Notify>,
    dropped: Arc<Notify>,
}

/// Signals when the handler's future is dropped unfinished.
struct DropSignal(Option<Arc<Notify>>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            n.notify_one();
        }
    }
}

async fn order(State(h): State<Handler>, body: Bytes) -> Response {
    let n = h.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let mut signal = DropSignal(Some(h.dropped.clone()));
    if h.hold.load(Ordering::SeqCst) {
        h.entered.notify_one();
        h.proceed.notified().await;
    }
    signal.0 = None;
    if h.fail_next.swap(false, Ordering::SeqCst) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "database down").into_response();
    }
    if h.limit_next.swap(false, Ordering::SeqCst) {
        return (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response();
    }
    let echo = String::from_utf8_lossy(&body).into_owned();
    (
        StatusCode::CREATED,
        AppendHeaders([
            ("x-order", n.to_string()),
            ("set-cookie", "a=1".into()),
            ("set-cookie", "b=2".into()),
        ]),
        Json(json!({ "order_id": n, "echo": echo })),
    )
        .into_response()
}

fn users() -> IdentityResolver {
    IdentityResolver::new().enrich(|who, headers, _| {
        match headers.get("x-user-id").and_then(|v| v.to_str().ok()) {
            Some(id) => who.with_user_id(id),
            None => who,
        }
    })
}

async fn serve(
    layer: impl Fn(Arc<tollgate::Tollgate<tollgate::MemoryStore>>) -> DuplicateLayer,
) -> (Server, Handler, tollgate::ManualClock) {
    let (gate, clock) = gate();
    let handler = Handler::default();
    let app = Router::new()
        .route("/orders", post(order).layer(layer(gate.clone())))
        .with_state(handler.clone())
        .layer(ContextLayer::new(gate, users()));
    (Server::start(app).await, handler, clock)
}

fn keyed(server: &Server, key: &str, body: &'static str) -> reqwest::RequestBuilder {
    keyed_as(server, "alice", key, body)
}

fn keyed_as(server: &Server, user: &str, key: &str, body: &'static str) -> reqwest::RequestBuilder {
    client()
        .post(server.at("/orders"))
        .header("idempotency-key", key)
        .header("x-user-id", user)
        .body(body)
}

fn orders(gate: Arc<tollgate::Tollgate<tollgate::MemoryStore>>) -> DuplicateLayer {
    DuplicateLayer::idempotency_key(gate, "orders").ttl(Duration::from_secs(30))
}

#[tokio::test]
async fn an_idempotent_repeat_replays_the_first_response_byte_for_byte() {
    let (server, handler, _) = serve(orders).await;
    let first = keyed(&server, "k1", r#"{"item":7}"#).send().await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(header(&first, "idempotency-replayed"), None);
    assert_eq!(header(&first, "idempotent-replayed"), None);
    let first_headers = first.headers().clone();
    let first_body = first.bytes().await.unwrap();

    let replay = keyed(&server, "k1", r#"{"item":7}"#).send().await.unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(
        header(&replay, "idempotency-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(
        header(&replay, "idempotent-replayed").as_deref(),
        Some("true")
    );
    for name in ["content-type", "x-order"] {
        assert_eq!(
            replay.headers().get(name),
            first_headers.get(name),
            "{name}"
        );
    }
    let cookies = |h: &reqwest::header::HeaderMap| {
        h.get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(cookies(replay.headers()), ["a=1", "b=2"]);
    assert_eq!(cookies(replay.headers()), cookies(&first_headers));
    let replay_body = replay.bytes().await.unwrap();
    assert_eq!(replay_body, first_body);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);

    // The structured-field form of the same key is the same key.
    let quoted = keyed(&server, "\"k1\"", r#"{"item":7}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(quoted.bytes().await.unwrap(), first_body);

    // Same key, another payload: 422, and the handler does not run.
    let reused = keyed(&server, "k1", r#"{"item":8}"#).send().await.unwrap();
    assert_eq!(reused.status(), 422);
    assert_eq!(problem(reused).await["code"], "idempotency_key_reused");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);

    // Another key, or the same key from another user, is another order.
    assert_eq!(
        keyed(&server, "k2", r#"{"item":7}"#)
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let bob = keyed_as(&server, "bob", "k1", r#"{"item":7}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bob.status(), 201);
    assert_ne!(bob.bytes().await.unwrap(), first_body);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_missing_or_malformed_key_is_400_unless_keys_are_optional() {
    let (server, handler, _) = serve(orders).await;
    let missing = client()
        .post(server.at("/orders"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    assert_eq!(problem(missing).await["code"], "bad_idempotency_key");
    for bad in ["\"\"".to_owned(), "k".repeat(256)] {
        let response = keyed(&server, &bad, "x").send().await.unwrap();
        assert_eq!(response.status(), 400, "{bad}");
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0);

    let (server, handler, _) = serve(|gate| orders(gate).require_key(false)).await;
    for _ in 0..2 {
        let unguarded = client()
            .post(server.at("/orders"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(unguarded.status(), 201);
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_repeat_while_the_first_is_in_flight_is_409() {
    let (server, handler, _) = serve(orders).await;
    handler.hold.store(true, Ordering::SeqCst);
    let first = tokio::spawn(keyed(&server, "k", "{}").send());
    handler.entered.notified().await;

    let second = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(second.status(), 409);
    assert_eq!(header(&second, "retry-after").as_deref(), Some("30"));
    assert_eq!(problem(second).await["code"], "in_progress");

    handler.hold.store(false, Ordering::SeqCst);
    handler.proceed.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 201);
    let first_body = first.bytes().await.unwrap();
    let third = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(
        header(&third, "idempotency-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(third.bytes().await.unwrap(), first_body);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_5xx_releases_the_key_so_the_client_can_retry() {
    let (server, handler, _) = serve(orders).await;
    handler.fail_next.store(true, Ordering::SeqCst);
    let failed = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(failed.status(), 500);
    let retried = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(retried.status(), 201);
    assert_eq!(header(&retried, "idempotency-replayed"), None);
    let replayed = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(
        header(&replayed, "idempotency-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
}

/// A 429 (an inner rate limit refused it: nothing ran) is not the key's outcome: a retry with
/// the key runs, rather than replaying the refusal for a day.
#[tokio::test]
async fn a_429_releases_the_key_so_the_client_can_retry() {
    let (server, handler, _) = serve(orders).await;
    handler.limit_next.store(true, Ordering::SeqCst);
    let limited = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(limited.status(), 429);
    let retried = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(retried.status(), 201);
    assert_eq!(header(&retried, "idempotency-replayed"), None);
}

/// A key no user owns is anyone's who sends it: its replay carries the first response but
/// not its cookies (another client must not get the first one's session).
#[tokio::test]
async fn an_anonymous_keys_replay_sets_no_cookie() {
    let (server, handler, _) = serve(|gate| orders(gate).require_key(true)).await;
    let anonymous = || {
        client()
            .post(server.at("/orders"))
            .header("idempotency-key", "shared")
            .body("{}")
    };
    let first = anonymous().send().await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().contains_key("set-cookie"));
    let replay = anonymous().send().await.unwrap();
    assert_eq!(
        header(&replay, "idempotency-replayed").as_deref(),
        Some("true")
    );
    assert!(
        !replay.headers().contains_key("set-cookie"),
        "{:?}",
        replay.headers()
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_cancelled_handler_releases_the_key() {
    let (server, handler, _) = serve(orders).await;
    handler.hold.store(true, Ordering::SeqCst);
    let gone = tokio::spawn(keyed(&server, "k", "{}").send());
    handler.entered.notified().await;
    // The client goes away: hyper drops the handler's future.
    gone.abort();
    tokio::time::timeout(Duration::from_secs(10), handler.dropped.notified())
        .await
        .expect("the server dropped the abandoned handler");
    handler.hold.store(false, Ordering::SeqCst);

    // The release runs on a task of its own; wait for it (bounded), not for the 30 s TTL.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let retry = keyed(&server, "k", "{}").send().await.unwrap();
        if retry.status() != 409 {
            assert_eq!(retry.status(), 201);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock was never released"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
}

/// The handler answered, and the client went away while the layer read the response's body
/// to keep it: the operation ran, so the key is completed (without a replay), not released,
/// and a repeat does not run it again.
#[tokio::test]
async fn a_client_gone_while_its_response_is_read_does_not_run_it_again() {
    let (gate, _) = gate();
    let calls = Arc::new(AtomicUsize::new(0));
    let reading = Arc::new(Notify::new());
    let handler = {
        let (calls, reading) = (calls.clone(), reading.clone());
        move || {
            let (calls, reading) = (calls.clone(), reading.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                // The body's first bytes, then nothing more until the client is gone.
                let first = std::iter::once(Ok::<_, std::convert::Infallible>(Bytes::from("{")));
                let stuck = futures_util::stream::once(async move {
                    reading.notify_one();
                    std::future::pending::<Result<Bytes, std::convert::Infallible>>().await
                });
                let body = futures_util::StreamExt::chain(futures_util::stream::iter(first), stuck);
                (StatusCode::CREATED, Body::from_stream(body))
            }
        }
    };
    let app = Router::new()
        .route("/orders", post(handler).layer(orders(gate.clone())))
        .layer(ContextLayer::new(gate, users()));
    let server = Server::start(app).await;
    let gone = tokio::spawn(keyed(&server, "k", "{}").send());
    reading.notified().await;
    gone.abort();
    // The completion runs on a task of its own once the request's future is dropped: wait for
    // it (bounded), not for the TTL.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let repeat = keyed(&server, "k", "{}").send().await.unwrap();
        if repeat.status() != 409 {
            assert_eq!(repeat.status(), 429, "completed, not replayable");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock was never completed"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn args_mode_refuses_the_same_request_until_the_ttl_ends() {
    let (server, handler, clock) = serve(|gate| {
        DuplicateLayer::new(gate, "comments", DuplicateBy::Args).ttl(Duration::from_secs(5))
    })
    .await;
    let post = |path: &str, body: &'static str| client().post(server.at(path)).body(body).send();
    assert_eq!(post("/orders", "hello").await.unwrap().status(), 201);
    let repeat = post("/orders", "hello").await.unwrap();
    assert_eq!(repeat.status(), 429);
    assert_eq!(header(&repeat, "retry-after").as_deref(), Some("5"));
    let body = problem(repeat).await;
    assert_eq!(body["code"], "repeated");
    assert_eq!(body["detail"], "repeated request");
    // Another body or another query is another submission.
    assert_eq!(post("/orders", "hello!").await.unwrap().status(), 201);
    assert_eq!(
        post("/orders?draft=1", "hello").await.unwrap().status(),
        201
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);

    clock.advance(Duration::from_secs(5));
    assert_eq!(post("/orders", "hello").await.unwrap().status(), 201);
}

#[tokio::test]
async fn user_mode_is_409_in_flight_429_after_and_401_anonymous() {
    let (server, handler, _) = serve(|gate| {
        DuplicateLayer::new(gate, "profile", "user_id".parse().unwrap()).ttl(Duration::from_secs(2))
    })
    .await;
    let post = |user: &str| {
        client()
            .post(server.at("/orders"))
            .header("x-user-id", user)
            .body("{}")
            .send()
    };
    handler.hold.store(true, Ordering::SeqCst);
    let first = tokio::spawn(post("alice"));
    handler.entered.notified().await;
    let in_flight = post("alice").await.unwrap();
    assert_eq!(in_flight.status(), 409);
    assert_eq!(problem(in_flight).await["detail"], "repeated request");
    handler.hold.store(false, Ordering::SeqCst);
    handler.proceed.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), 201);

    let after = post("alice").await.unwrap();
    assert_eq!(after.status(), 429);
    assert_eq!(header(&after, "retry-after").as_deref(), Some("2"));
    assert_eq!(post("bob").await.unwrap().status(), 201);

    let anonymous = client()
        .post(server.at("/orders"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
}

/// A guard by a header's value: the same value is one submission, another value another, and
/// a request without the header is malformed (400).
#[tokio::test]
async fn header_mode_tells_submissions_apart_by_the_headers_value() {
    let (server, handler, _) = serve(|gate| {
        DuplicateLayer::new(gate, "by-client", "header:x-client".parse().unwrap())
            .ttl(Duration::from_secs(2))
    })
    .await;
    let post = |client_id: Option<&str>| {
        let request = client().post(server.at("/orders")).body("{}");
        match client_id {
            Some(id) => request.header("x-client", id),
            None => request,
        }
        .send()
    };
    assert_eq!(post(Some("c1")).await.unwrap().status(), 201);
    assert_eq!(post(Some("c1")).await.unwrap().status(), 429);
    assert_eq!(post(Some("c2")).await.unwrap().status(), 201);
    assert_eq!(post(None).await.unwrap().status(), 400);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bodies_over_the_cap_are_413() {
    let (server, handler, _) = serve(|gate| orders(gate).max_body(16)).await;
    let big = keyed(&server, "k", "0123456789abcdefX")
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    assert_eq!(problem(big).await["code"], "payload_too_large");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0);
    let fits = keyed(&server, "k", "0123456789abcdef")
        .send()
        .await
        .unwrap();
    assert_eq!(fits.status(), 201);
}

#[tokio::test]
async fn bodies_without_a_length_are_capped_while_read() {
    let (gate, _) = gate();
    let service = DuplicateLayer::new(gate, "comments", DuplicateBy::Args)
        .max_body(4)
        .layer(tower::service_fn(
            |_: Request<tollgate_tower::GateBody<Body>>| async {
                Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
            },
        ));
    // No Content-Length: the cap is enforced on the bytes as they arrive.
    let request = Request::post("/c")
        .extension(tollgate::Identity::new())
        .body(Body::from("12345"))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn responses_too_large_to_keep_are_delivered_and_repeats_refused_not_rerun() {
    // Over the layer's cap: the response streams through, unstored.
    let (server, handler, _) = serve(|gate| orders(gate).max_response(8)).await;
    let first = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(first.status(), 201);
    let body: serde_json::Value = first.json().await.unwrap();
    assert_eq!(body["order_id"], 1);
    let repeat = keyed(&server, "k", "{}").send().await.unwrap();
    assert_eq!(repeat.status(), 429);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);

    // Over the engine's cap (smaller than the layer's): same outcome, not a lock left to expire.
    let (gate, _) = gate();
    let gate = Arc::new(Arc::into_inner(gate).unwrap().with_max_stored_response(8));
    let handler = Handler::default();
    let app = Router::new()
        .route("/orders", post(order).layer(orders(gate.clone())))
        .with_state(handler.clone())
        .layer(ContextLayer::new(gate, users()));
    let server = Server::start(app).await;
    assert_eq!(
        keyed(&server, "k", "{}").send().await.unwrap().status(),
        201
    );
    assert_eq!(
        keyed(&server, "k", "{}").send().await.unwrap().status(),
        429
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_grpc_web_repeat_is_refused_in_grpc_web_terms() {
    let (server, handler, _clock) = serve(|gate| {
        DuplicateLayer::new(gate, "comments", DuplicateBy::Args).ttl(Duration::from_secs(5))
    })
    .await;
    let post = |content_type: &'static str| {
        client()
            .post(server.at("/orders"))
            .header("content-type", content_type)
            .body("hello")
            .send()
    };
    assert_eq!(
        post("application/grpc-web+proto").await.unwrap().status(),
        201
    );
    // A browser's gRPC-Web client reads only answers of its own content type.
    for content_type in ["application/grpc-web+proto", "application/grpc-web-text"] {
        let repeat = post(content_type).await.unwrap();
        assert_eq!(repeat.status(), 200);
        assert_eq!(
            header(&repeat, "content-type").as_deref(),
            Some(content_type)
        );
        assert_eq!(header(&repeat, "grpc-status").as_deref(), Some("8"));
    }
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
}

/// A response with trailers (a gRPC status) reaches the client with them in key mode, and is
/// not stored (a stored response keeps no trailers): a repeat is refused, not replayed
/// without its status.
#[tokio::test]
async fn a_response_with_trailers_keeps_them_and_is_not_stored() {
    use http_body_util::{BodyExt, StreamBody};

    let (gate, _) = gate();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let service = DuplicateLayer::idempotency_key(gate, "calls").layer(tower::service_fn(
        move |_: Request<tollgate_tower::GateBody<Body>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", "0".parse().unwrap());
                let frames = futures_util::stream::iter([
                    Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from("reply"))),
                    Ok(http_body::Frame::trailers(trailers)),
                ]);
                Ok::<_, std::convert::Infallible>(Response::new(Body::new(StreamBody::new(frames))))
            }
        },
    ));
    let request = || {
        Request::post("/call")
            .header("idempotency-key", "t1")
            .extension(tollgate::Identity::new().with_user_id("u"))
            .body(Body::from("{}"))
            .unwrap()
    };
    let response = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("the trailers came through");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(collected.to_bytes(), "reply");

    let repeat = service.oneshot(request()).await.unwrap();
    assert_eq!(repeat.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "not run again");
}
