use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{Router, body::Body, http::StatusCode, response::IntoResponse, routing::get};
use serde_json::json;
use tollgate::{
    BanRule, BanStore, Bypass, CheckRequest, Dimension, Limiter, LockStore, OnError, Policy,
    Receipt, RefundStore, Store, StoreError, StoreErrorKind, Tollgate, Verdict,
};
use tollgate_tower::{
    Cost, Count, FailedOpen, FailureWhen, HeaderStyle, IdentityResolver, RateLimitLayer, Settle,
};

use crate::support::{Server, client, gate, header, problem, step};

fn rules(texts: &[&str]) -> Vec<tollgate::Rule> {
    texts.iter().map(|t| t.parse().unwrap()).collect()
}

fn counted(layer: RateLimitLayer) -> (Router, Arc<AtomicUsize>) {
    counted_at("/", layer)
}

fn counted_at(path: &str, layer: RateLimitLayer) -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let app = Router::new().route(
        path,
        get(move || {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                "ok"
            }
        })
        .layer(layer),
    );
    (app, calls)
}

#[tokio::test]
async fn denied_requests_get_429_retry_after_ratelimit_fields_and_a_problem() {
    let (gate, clock) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, rules(&["2/1m", "10/1h"])))
        .build()
        .unwrap();
    let (app, calls) = counted(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let http = client();

    let first = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit-policy").as_deref(),
        Some(r#""ip-1m";q=2;w=60, "ip-1h";q=10;w=3600"#)
    );
    assert_eq!(
        header(&first, "ratelimit").as_deref(),
        Some(r#""ip-1m";r=1;t=60, "ip-1h";r=9;t=3600"#)
    );
    assert_eq!(header(&first, "retry-after"), None);

    clock.advance(Duration::from_secs(20));
    let second = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(
        header(&second, "ratelimit").as_deref(),
        Some(r#""ip-1m";r=0;t=60, "ip-1h";r=8;t=3600"#)
    );

    // The oldest entry leaves the minute window 40 s from now.
    clock.advance(Duration::from_millis(19_500));
    let denied = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(denied.status(), 429);
    // 20.5 s left: 21.
    assert_eq!(header(&denied, "retry-after").as_deref(), Some("21"));
    assert_eq!(
        header(&denied, "ratelimit-policy").as_deref(),
        Some(r#""ip-1m";q=2;w=60, "ip-1h";q=10;w=3600"#)
    );
    let limit = header(&denied, "ratelimit").unwrap();
    assert!(limit.starts_with(r#""ip-1m";r=0;t="#), "{limit}");
    let body = problem(denied).await;
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["status"], 429);
    assert_eq!(body["code"], "rate_limited");
    assert_eq!(body["violated-policies"], json!(["ip-1m"]));
    assert_eq!(body["detail"], "rate limit exceeded: ip 2/1m");
    assert_eq!(body["retry_after"], 21);
    assert_eq!(
        body["violated"],
        json!([{"policy": "ip-1m", "limiter": "ip", "rule": "2/1m", "remaining": 0,
                "reset_after": body["violated"][0]["reset_after"]}])
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "a denied request never reaches the handler"
    );

    clock.advance(Duration::from_millis(20_000));
    assert_eq!(http.get(server.at("/")).send().await.unwrap().status(), 429);
    clock.advance(Duration::from_millis(500));
    assert_eq!(http.get(server.at("/")).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn retry_after_is_whole_seconds_rounded_up() {
    let (gate, clock) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, rules(&["1/1m"])))
        .build()
        .unwrap();
    let (app, _) = counted(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let http = client();
    assert_eq!(http.get(server.at("/")).send().await.unwrap().status(), 200);
    clock.advance(Duration::from_millis(18_001));
    let denied = http.get(server.at("/")).send().await.unwrap();
    // 41.999 s left: 42.
    assert_eq!(header(&denied, "retry-after").as_deref(), Some("42"));
    assert_eq!(
        header(&denied, "ratelimit").as_deref(),
        Some(r#""ip-1m";r=0;t=42"#)
    );
}

#[tokio::test]
async fn ratelimit_fields_on_allowed_responses_can_be_turned_off() {
    let (gate, _) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, rules(&["1/1m"])))
        .build()
        .unwrap();
    let (app, _) = counted(RateLimitLayer::new(gate, policy).headers(false));
    let server = Server::start(app).await;
    let http = client();
    let ok = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(header(&ok, "ratelimit"), None);
    assert_eq!(header(&ok, "ratelimit-policy"), None);
    let denied = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(denied.status(), 429);
    assert!(
        header(&denied, "ratelimit").is_some(),
        "refusals always say why"
    );
}

#[tokio::test]
async fn a_shadow_limiter_never_refuses_and_stays_out_of_the_fields() {
    let (gate, _) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, rules(&["3/1m"])))
        .limiter(
            Limiter::new(Dimension::Ip, rules(&["1/1m"]))
                .with_name("trial")
                .with_shadow(true),
        )
        .build()
        .unwrap();
    let (app, calls) = counted(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let http = client();
    for left in (0..3).rev() {
        let ok = http.get(server.at("/")).send().await.unwrap();
        assert_eq!(ok.status(), 200, "the trial limit is not enforced");
        assert_eq!(
            header(&ok, "ratelimit-policy").as_deref(),
            Some(r#""ip-1m";q=3;w=60"#)
        );
        assert_eq!(
            header(&ok, "ratelimit").as_deref(),
            Some(format!(r#""ip-1m";r={left};t=60"#).as_str())
        );
    }
    let denied = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(denied.status(), 429, "the enforced limit is");
    let body: serde_json::Value = denied.json().await.unwrap();
    assert_eq!(body["violated-policies"], json!(["ip-1m"]), "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A login route: 200 for the right password (`?pw=right`), 401 otherwise, 500 for `?pw=boom`.
fn login(layer: RateLimitLayer) -> Router {
    Router::new().route(
        "/login",
        get(|uri: axum::http::Uri| async move {
            match uri.query() {
                Some("pw=right") => StatusCode::OK,
                Some("pw=boom") => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::UNAUTHORIZED,
            }
        })
        .layer(layer),
    )
}

#[tokio::test]
async fn count_failures_refunds_successes_before_answering() {
    let (gate, _) = gate();
    let policy = Policy::builder("login")
        .limiter(Limiter::new(Dimension::Ip, rules(&["2/1m"])))
        .build()
        .unwrap();
    let app = login(RateLimitLayer::new(gate.clone(), policy).count(Count::failures()));
    let server = Server::start(app).await;
    let http = client();
    let attempt = |pw: &'static str| http.get(server.at(&format!("/login?pw={pw}"))).send();
    // Successes are charged, then refunded: any number of them.
    for _ in 0..5 {
        assert_eq!(attempt("right").await.unwrap().status(), 200);
    }
    // Failures keep their charge: two fit, the third is refused.
    assert_eq!(attempt("wrong").await.unwrap().status(), 401);
    assert_eq!(attempt("boom").await.unwrap().status(), 500);
    assert_eq!(attempt("right").await.unwrap().status(), 429);
}

#[tokio::test]
async fn count_failures_never_over_admits_while_requests_are_in_flight() {
    let (gate, _) = gate();
    let policy = Policy::builder("login")
        .limiter(Limiter::new(Dimension::Ip, rules(&["2/1m"])))
        .build()
        .unwrap();
    // Every request waits in the handler until the test lets them all go: they are in flight
    // together, and all will succeed (and be refunded) in the end.
    let gate_open = Arc::new(tokio::sync::Semaphore::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let (open, seen) = (gate_open.clone(), inside.clone());
    let app = Router::new().route(
        "/login",
        get(move || {
            let (open, seen) = (open.clone(), seen.clone());
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                open.acquire().await.unwrap().forget();
                StatusCode::OK
            }
        })
        .layer(RateLimitLayer::new(gate, policy).count(Count::failures())),
    );
    let server = Server::start(app).await;
    let http = client();
    let waiting: Vec<_> = (0..2)
        .map(|_| tokio::spawn(http.get(server.at("/login")).send()))
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while inside.load(Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "never in flight");
        tokio::task::yield_now().await;
    }
    // Charged on admission: while two are in flight, a third is refused.
    for _ in 0..3 {
        assert_eq!(
            http.get(server.at("/login")).send().await.unwrap().status(),
            429
        );
    }
    assert_eq!(inside.load(Ordering::SeqCst), 2);
    gate_open.add_permits(2);
    for request in waiting {
        assert_eq!(request.await.unwrap().unwrap().status(), 200);
    }
    // Both succeeded: refunded, the quota is whole again.
    let (opened, done) = (gate_open.clone(), inside.clone());
    let after = tokio::spawn(http.get(server.at("/login")).send());
    while done.load(Ordering::SeqCst) < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never admitted again"
        );
        tokio::task::yield_now().await;
    }
    opened.add_permits(1);
    assert_eq!(after.await.unwrap().unwrap().status(), 200);
}

#[tokio::test]
async fn count_successes_refunds_failures_errors_and_panics() {
    use tower::ServiceExt as _;

    let (gate, _) = gate();
    let policy = Policy::builder("export")
        .limiter(Limiter::new(Dimension::Global, rules(&["2/1m"])))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(gate.clone(), policy.clone()).count(Count::Successes(
        FailureWhen::new(|status| status == StatusCode::CONFLICT),
    ));
    let left = || async {
        gate.peek(&policy, &tollgate::Identity::new(), 0)
            .await
            .unwrap()
            .remaining()
    };
    let status = |code: u16| {
        let service = tower::ServiceBuilder::new()
            .layer(layer.clone())
            .service(tower::service_fn(
                move |_: http::Request<String>| async move {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .status(code)
                            .body(Body::empty())
                            .unwrap(),
                    )
                },
            ));
        async move {
            service
                .oneshot(http::Request::new(String::new()))
                .await
                .unwrap()
                .status()
        }
    };
    // 500 is not a failure by this predicate: it counts.
    assert_eq!(status(500).await, 500);
    assert_eq!(left().await, Some(1));
    // 409 is: refunded before the response was returned.
    assert_eq!(status(409).await, 409);
    assert_eq!(left().await, Some(1));
    // A panicking handler is a failure: its charge comes back (in the background).
    let panicking = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(tower::service_fn(|_: http::Request<String>| async move {
            if true {
                panic!("the handler fails");
            }
            Ok::<http::Response<Body>, std::convert::Infallible>(http::Response::new(Body::empty()))
        }));
    let panicked = tokio::spawn(panicking.oneshot(http::Request::new(String::new()))).await;
    assert!(panicked.unwrap_err().is_panic());
    // The refund runs on a task of its own: wait for it, bounded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while left().await != Some(1) {
        assert!(tokio::time::Instant::now() < deadline, "never refunded");
        tokio::task::yield_now().await;
    }
    assert_eq!(status(200).await, 200);
    assert_eq!(left().await, Some(0));
    assert_eq!(status(200).await, 429);
}

/// A `/download` route behind `layer` whose every response streams what the test sends
/// through the channel it hands out.
fn downloads(
    layer: RateLimitLayer,
) -> (
    Router,
    tokio::sync::mpsc::UnboundedReceiver<tokio::sync::mpsc::Sender<Result<String, std::io::Error>>>,
) {
    let (senders, handed) = tokio::sync::mpsc::unbounded_channel();
    let app = Router::new().route(
        "/download",
        get(move || {
            let senders = senders.clone();
            async move {
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                senders.send(tx).unwrap();
                Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            }
        })
        .layer(layer),
    );
    (app, handed)
}

#[tokio::test]
async fn a_concurrency_slot_is_held_while_the_response_streams() {
    let (gate, _) = gate();
    let policy = Policy::builder("download")
        .limiter(Limiter::concurrent(Dimension::Ip, 1, Duration::from_secs(300)).unwrap())
        .build()
        .unwrap();
    let (app, mut handed) = downloads(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let http = client();

    let streaming = http.get(server.at("/download")).send().await.unwrap();
    assert_eq!(streaming.status(), 200);
    assert_eq!(
        header(&streaming, "ratelimit-policy").as_deref(),
        Some(r#""ip-concurrent";q=1;qu="concurrent-requests""#)
    );
    let stream = handed.recv().await.unwrap();
    // While the first response streams, its slot is taken.
    let busy = http.get(server.at("/download")).send().await.unwrap();
    assert_eq!(busy.status(), 429);
    assert!(header(&busy, "retry-after").is_some());
    let body: serde_json::Value = busy.json().await.unwrap();
    assert_eq!(body["code"], "concurrency_limited", "{body}");

    // The stream ends: the slot comes back (released in the background).
    stream.send(Ok("part".to_owned())).await.unwrap();
    drop(stream);
    assert_eq!(streaming.text().await.unwrap(), "part");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let next = http.get(server.at("/download")).send().await.unwrap();
        if next.status() == 200 {
            break;
        }
        assert_eq!(next.status(), 429);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::task::yield_now().await;
    }
}

/// A response that streams longer than the lease TTL keeps its slot: the layer renews the
/// lease every third of its TTL while the body is open, and frees it when the body ends.
#[tokio::test(start_paused = true)]
async fn a_stream_longer_than_its_lease_keeps_its_slot() {
    use axum::extract::ConnectInfo;
    use tower::ServiceExt as _;

    let (gate, clock) = gate();
    let policy = Policy::builder("download")
        .limiter(Limiter::concurrent(Dimension::Ip, 1, Duration::from_secs(3)).unwrap())
        .build()
        .unwrap();
    let (app, mut handed) = downloads(RateLimitLayer::new(gate, policy));
    let peer: std::net::SocketAddr = "192.0.2.8:4000".parse().unwrap();
    let request = || {
        let mut request = http::Request::get("/download").body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    };
    let streaming = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(streaming.status(), 200);
    let stream = handed.recv().await.unwrap();
    // The slot's task starts its first wait now.
    tokio::task::yield_now().await;
    // Ten seconds of the store's time, its lease's TTL three times over, in steps of less
    // than a TTL, each after a renewal's turn (a second: a third of it).
    for n in 0..5 {
        step(&clock, Duration::from_millis(1010), Duration::from_secs(2)).await;
        let busy = app.clone().oneshot(request()).await.unwrap();
        assert_eq!(
            busy.status(),
            429,
            "step {n}: the slot is still the stream's"
        );
    }
    // The stream ends: the slot is free.
    drop(stream);
    drop(streaming);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let next = app.clone().oneshot(request()).await.unwrap();
        if next.status() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::advance(Duration::from_millis(10)).await;
    }
}

/// A request waiting its turn (`max_delay`) holds its concurrency slot from its admission, its
/// lease renewed while it waits: a wait longer than the lease's TTL keeps the slot for the
/// response.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_its_turn_keeps_its_slot() {
    use axum::extract::ConnectInfo;
    use tower::ServiceExt as _;

    let (gate, clock) = gate();
    // One in flight per address, leases of 3 s; one request per user every 4 s.
    let per_user = rules(&["1/4s"])[0].with_algorithm(tollgate::Algorithm::Gcra);
    let policy = Policy::builder("download")
        .limiter(Limiter::concurrent(Dimension::Ip, 1, Duration::from_secs(3)).unwrap())
        .limiter(Limiter::new(Dimension::Header("x-user".into()), [per_user]))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(gate, policy).max_delay(Duration::from_secs(5));
    let (app, mut handed) = downloads(layer);
    let request = |peer: &str, user: &str| {
        let mut request = http::Request::get("/download")
            .header("x-user", user)
            .body(Body::empty())
            .unwrap();
        let peer: std::net::SocketAddr = peer.parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    };
    // u1's first request (from another address) streams; its second waits 4 s for its turn.
    let first = app.clone().oneshot(request("192.0.2.1:4000", "u1")).await;
    assert_eq!(first.unwrap().status(), 200);
    let _first_stream = handed.recv().await.unwrap();
    let waiting = tokio::spawn(app.clone().oneshot(request("192.0.2.8:4000", "u1")));
    tokio::task::yield_now().await;
    // Second by second, the store's clock behind tokio's: the wait, its TTL and more.
    let second = Duration::from_secs(1);
    for _ in 0..4 {
        step(&clock, second, second).await;
    }
    let waited = waiting.await.unwrap().unwrap();
    assert_eq!(waited.status(), 200);
    let _stream = handed.recv().await.unwrap();
    step(&clock, second, second).await;
    // 5 s after its admission, the address's one slot is still the waiting request's.
    let busy = app.clone().oneshot(request("192.0.2.8:4001", "u2")).await;
    assert_eq!(busy.unwrap().status(), 429, "the slot is the stream's");
}

/// On a runtime without its time driver there is nothing to renew by: the slot is still freed
/// when the body ends.
#[test]
fn without_timers_a_slot_is_still_freed() {
    use axum::extract::ConnectInfo;
    use tower::ServiceExt as _;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (gate, _) = gate();
        let policy = Policy::builder("download")
            .limiter(Limiter::concurrent(Dimension::Ip, 1, Duration::from_secs(3)).unwrap())
            .build()
            .unwrap();
        let app = Router::new().route(
            "/download",
            get(|| async { "done" }).layer(RateLimitLayer::new(gate, policy)),
        );
        let peer: std::net::SocketAddr = "192.0.2.8:4000".parse().unwrap();
        let request = || {
            let mut request = http::Request::get("/download").body(Body::empty()).unwrap();
            request.extensions_mut().insert(ConnectInfo(peer));
            request
        };
        for round in 0..3 {
            let response = app.clone().oneshot(request()).await.unwrap();
            assert_eq!(response.status(), 200, "round {round}");
            drop(response);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
    });
}

/// Under `Count::failures()` a success gives its rate units back before the response goes
/// out, but its concurrency slot stays taken while the body streams.
#[tokio::test]
async fn a_refunded_success_keeps_its_slot_while_the_response_streams() {
    let (gate, _) = gate();
    let policy = Policy::builder("download")
        .limiter(Limiter::concurrent(Dimension::Ip, 1, Duration::from_secs(300)).unwrap())
        .limiter(Limiter::new(Dimension::Ip, rules(&["10/1h"])).with_name("hourly"))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(gate.clone(), policy.clone()).count(Count::failures());
    let (app, mut handed) = downloads(layer);
    let server = Server::start(app).await;
    let http = client();
    let streaming = http.get(server.at("/download")).send().await.unwrap();
    assert_eq!(streaming.status(), 200);
    let stream = handed.recv().await.unwrap();
    // The hourly units came back (a success), the slot did not.
    let who = tollgate::Identity::new().with_ip("127.0.0.1".parse().unwrap());
    let peek = gate.peek(&policy, &who, 1).await.unwrap();
    assert_eq!(
        peek.reason(),
        tollgate::Reason::ConcurrencyLimited,
        "{peek:?}"
    );
    assert_eq!(peek.rules(&policy)[1].remaining, 10, "{peek:?}");
    let busy = http.get(server.at("/download")).send().await.unwrap();
    assert_eq!(busy.status(), 429);
    let body: serde_json::Value = busy.json().await.unwrap();
    assert_eq!(body["code"], "concurrency_limited", "{body}");
    drop(stream);
    assert_eq!(streaming.text().await.unwrap(), "");
}

/// A global concurrency limit of 1, the layer over it, and a check that waits until its slot
/// is free again.
fn one_job() -> (RateLimitLayer, impl AsyncFn() -> ()) {
    let (gate, _) = gate();
    let policy = Policy::builder("job")
        .limiter(Limiter::concurrent(Dimension::Global, 1, Duration::from_secs(300)).unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(gate.clone(), policy.clone());
    let until_free = async move || {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let who = tollgate::Identity::new();
        while !gate.peek(&policy, &who, 1).await.unwrap().allowed() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the slot never came back"
            );
            tokio::task::yield_now().await;
        }
    };
    (layer, until_free)
}

#[tokio::test]
async fn a_concurrency_slot_comes_back_when_the_handler_panics() {
    use tower::ServiceExt as _;

    let (layer, until_free) = one_job();
    let panicking = tower::ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|_: http::Request<String>| async move {
            if true {
                panic!("the job fails");
            }
            Ok::<http::Response<Body>, std::convert::Infallible>(http::Response::new(Body::empty()))
        }));
    let panicked = tokio::spawn(panicking.oneshot(http::Request::new(String::new()))).await;
    assert!(panicked.unwrap_err().is_panic());
    until_free().await;
}

/// The same when the inner service panics in `call` itself, before it has a future.
#[tokio::test]
async fn a_concurrency_slot_comes_back_when_the_service_panics_in_call() {
    use tower::ServiceExt as _;

    let (layer, until_free) = one_job();
    type Answer = std::future::Ready<Result<http::Response<Body>, std::convert::Infallible>>;
    let panicking = tower::ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|_: http::Request<String>| -> Answer {
            panic!("the request cannot be parsed")
        }));
    let panicked = tokio::spawn(panicking.oneshot(http::Request::new(String::new()))).await;
    assert!(panicked.unwrap_err().is_panic());
    until_free().await;
}

#[tokio::test]
async fn the_limiter_message_and_a_custom_response() {
    let (gate, _) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, rules(&["1/1m"])).with_message("slow down, please"))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(gate, policy).on_rejection(|rejection| {
        let mut response = rejection.into_response();
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response
    });
    let (app, _) = counted(layer);
    let server = Server::start(app).await;
    let http = client();
    http.get(server.at("/")).send().await.unwrap();
    let denied = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(denied.status(), 503);
    assert_eq!(header(&denied, "retry-after").as_deref(), Some("60"));
    assert_eq!(problem(denied).await["detail"], "slow down, please");
}

#[tokio::test]
async fn blocked_clients_get_403_with_retry_after_until_the_ban_ends() {
    let (gate, clock) = gate();
    let policy = Policy::builder("sms")
        .limiter(
            Limiter::new(Dimension::Ip, rules(&["1/1m"]))
                .with_blocklist(BanRule::new(Duration::from_secs(600))),
        )
        .build()
        .unwrap();
    let (app, calls) = counted(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let http = client();

    assert_eq!(http.get(server.at("/")).send().await.unwrap().status(), 200);
    let violation = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(violation.status(), 429);
    assert_eq!(header(&violation, "retry-after").as_deref(), Some("600"));

    clock.advance(Duration::from_secs(100));
    let blocked = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(blocked.status(), 403);
    assert_eq!(header(&blocked, "retry-after").as_deref(), Some("500"));
    let body = problem(blocked).await;
    assert_eq!(body["code"], "blocked");
    assert_eq!(body["status"], 403);

    clock.advance(Duration::from_secs(500));
    assert_eq!(http.get(server.at("/")).send().await.unwrap().status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_user_dimension_without_a_user_is_401() {
    let (gate, _) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::UserId, rules(&["5/1m"])))
        .build()
        .unwrap();
    let resolver = IdentityResolver::new().enrich(|who, headers, _| {
        match headers.get("x-user-id").and_then(|v| v.to_str().ok()) {
            Some(id) => who.with_user_id(id),
            None => who,
        }
    });
    let (app, calls) = counted(RateLimitLayer::new(gate, policy).resolver(resolver));
    let server = Server::start(app).await;
    let http = client();

    let anonymous = http.get(server.at("/")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let body = problem(anonymous).await;
    assert_eq!(body["code"], "missing_identity");
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let known = http
        .get(server.at("/"))
        .header("x-user-id", "42")
        .send()
        .await
        .unwrap();
    assert_eq!(known.status(), 200);
    assert_eq!(
        header(&known, "ratelimit").as_deref(),
        Some(r#""user_id-1m";r=4;t=60"#)
    );
}

#[tokio::test]
async fn header_dimensions_read_the_request_and_400_without_it() {
    let (gate, _) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(
            Dimension::Header("x-api-key".into()),
            rules(&["1/1m"]),
        ))
        .build()
        .unwrap();
    let (app, _) = counted(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let http = client();
    let get = |key: Option<&str>| {
        let mut request = http.get(server.at("/"));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.send()
    };
    assert_eq!(get(None).await.unwrap().status(), 400);
    assert_eq!(get(Some("a")).await.unwrap().status(), 200);
    assert_eq!(get(Some("b")).await.unwrap().status(), 200);
    assert_eq!(get(Some("a")).await.unwrap().status(), 429);
}

#[tokio::test]
async fn bypassed_identities_are_neither_counted_nor_labelled() {
    let (gate, _) = gate();
    let policy = Policy::builder("stats")
        .limiter(Limiter::new(Dimension::Ip, rules(&["1/1m"])))
        .bypass(Bypass::new().user_id("admin"))
        .build()
        .unwrap();
    let resolver = IdentityResolver::new().enrich(|who, headers, _| {
        match headers.get("x-user-id").and_then(|v| v.to_str().ok()) {
            Some(id) => who.with_user_id(id),
            None => who,
        }
    });
    let (app, calls) = counted(RateLimitLayer::new(gate, policy).resolver(resolver));
    let server = Server::start(app).await;
    let http = client();
    for _ in 0..3 {
        let admin = http
            .get(server.at("/"))
            .header("x-user-id", "admin")
            .send()
            .await
            .unwrap();
        assert_eq!(admin.status(), 200);
        assert_eq!(header(&admin, "ratelimit"), None);
    }
    let someone = || http.get(server.at("/")).header("x-user-id", "bob").send();
    assert_eq!(someone().await.unwrap().status(), 200);
    assert_eq!(someone().await.unwrap().status(), 429);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

/// A store that is always down; it counts the refunds it is asked for.
#[derive(Default)]
struct DownStore {
    refunds: Arc<AtomicUsize>,
}

fn refused<T>() -> Result<T, StoreError> {
    Err(StoreError::new(
        StoreErrorKind::Unavailable,
        "connection refused",
    ))
}

impl Store for DownStore {
    async fn check(&self, _: &CheckRequest<'_>) -> Result<Verdict, StoreError> {
        refused()
    }

    async fn reset(&self, _: &CheckRequest<'_>) -> Result<(), StoreError> {
        refused()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        refused()
    }
}

impl RefundStore for DownStore {
    async fn refund(&self, _: &CheckRequest<'_>, _: Option<&Receipt>) -> Result<(), StoreError> {
        self.refunds.fetch_add(1, Ordering::SeqCst);
        refused()
    }

    async fn extend(
        &self,
        _: &CheckRequest<'_>,
        _: &Receipt,
    ) -> Result<Option<Receipt>, StoreError> {
        refused()
    }

    async fn charge(&self, _: &CheckRequest<'_>) -> Result<(), StoreError> {
        refused()
    }
}

impl LockStore for DownStore {
    async fn lock_acquire(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> Result<tollgate::LockReply, StoreError> {
        refused()
    }

    async fn lock_release(&self, _: &str, _: &str) -> Result<bool, StoreError> {
        refused()
    }

    async fn lock_complete(
        &self,
        _: &str,
        _: &str,
        _: &[u8],
        _: Duration,
    ) -> Result<bool, StoreError> {
        refused()
    }
}

impl BanStore for DownStore {
    async fn bans(&self, _: &str) -> Result<Vec<tollgate::BanEntry>, StoreError> {
        refused()
    }

    async fn ban(&self, _: &str, _: &tollgate::BanTarget, _: Duration) -> Result<(), StoreError> {
        refused()
    }

    async fn unban(&self, _: &str, _: &tollgate::BanTarget) -> Result<bool, StoreError> {
        refused()
    }
}

impl tollgate::OverrideStore for DownStore {
    async fn set_override(
        &self,
        _: &tollgate::LimiterRequest<'_>,
        _: &str,
        _: &tollgate::Override,
        _: Option<Duration>,
    ) -> Result<tollgate::Override, StoreError> {
        refused()
    }

    async fn remove_override(
        &self,
        _: &tollgate::LimiterRequest<'_>,
        _: &str,
    ) -> Result<bool, StoreError> {
        refused()
    }

    async fn overrides(&self, _: &str) -> Result<Vec<tollgate::Override>, StoreError> {
        refused()
    }
}

#[tokio::test]
async fn a_down_store_fails_closed_with_503_or_open_as_configured() {
    let gate = Arc::new(Tollgate::new(DownStore::default()));
    let policy = |on_error| {
        Policy::builder("api")
            .limiter(Limiter::new(Dimension::Ip, rules(&["1/1m"])))
            .on_error(on_error)
            .build()
            .unwrap()
    };
    let (closed, closed_calls) = counted_at(
        "/closed",
        RateLimitLayer::new(gate.clone(), policy(OnError::Deny)),
    );
    // Failing open is never silent: the handler and the layers outside see `FailedOpen`.
    let open = Router::new()
        .route(
            "/open",
            get(|failed: Option<axum::Extension<FailedOpen>>| async move {
                if failed.is_some() {
                    "failed open"
                } else {
                    "checked"
                }
            })
            .layer(RateLimitLayer::new(gate, policy(OnError::Allow))),
        )
        .layer(axum::middleware::map_response(
            |mut response: axum::response::Response| async move {
                if response.extensions().get::<FailedOpen>().is_some() {
                    response
                        .headers_mut()
                        .insert("x-failed-open", "1".parse().unwrap());
                }
                response
            },
        ));
    let app = closed.merge(open);
    let server = Server::start(app).await;
    let http = client();

    let denied = http.get(server.at("/closed")).send().await.unwrap();
    assert_eq!(denied.status(), 503);
    assert_eq!(problem(denied).await["code"], "store_unavailable");
    assert_eq!(closed_calls.load(Ordering::SeqCst), 0);

    for _ in 0..3 {
        let admitted = http.get(server.at("/open")).send().await.unwrap();
        assert_eq!(admitted.status(), 200);
        assert_eq!(header(&admitted, "x-failed-open"), Some("1".to_owned()));
        assert_eq!(admitted.text().await.unwrap(), "failed open");
    }
}

/// An admission the store never recorded (it failed open) has nothing to give back: a refund
/// without a receipt would take units other requests recorded, once the store answers again.
#[tokio::test]
async fn a_request_admitted_open_is_never_refunded() {
    let store = DownStore::default();
    let refunds = store.refunds.clone();
    let gate = Arc::new(Tollgate::new(store));
    let policy = Policy::builder("login")
        .limiter(
            Limiter::concurrent(Dimension::Ip, 5, Duration::from_secs(60))
                .unwrap()
                .with_name("in_flight"),
        )
        .limiter(Limiter::new(Dimension::Ip, rules(&["5/1m"])))
        .on_error(OnError::Allow)
        .build()
        .unwrap();
    let server = Server::start(login(
        RateLimitLayer::new(gate, policy).count(Count::failures()),
    ))
    .await;
    for _ in 0..3 {
        let response = client()
            .get(server.at("/login?pw=right"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(refunds.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_router_wide_layer_guards_every_route_with_one_policy() {
    let (gate, _) = gate();
    let policy = Policy::builder("everything")
        .limiter(Limiter::new(Dimension::Global, rules(&["3/1m"])))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .layer(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let http = client();
    let mut statuses = Vec::new();
    for path in ["/a", "/b", "/a", "/b", "/missing"] {
        statuses.push(
            http.get(server.at(path))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    // The unknown route is counted too: the layer sits in front of the whole router.
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

/// Statuses of one request from each address, through a proxy the resolver trusts.
async fn statuses_from(server: &Server, path: &str, addrs: &[String]) -> Vec<u16> {
    let http = client();
    let mut out = Vec::new();
    for addr in addrs {
        let response = http
            .get(server.at(path))
            .header("x-forwarded-for", addr)
            .send()
            .await
            .unwrap();
        out.push(response.status().as_u16());
    }
    out
}

#[tokio::test]
async fn ipv6_clients_count_by_their_64_and_the_layer_can_widen_it() {
    let (gate, _) = gate();
    let policy = || {
        Policy::builder("signup")
            .limiter(Limiter::new(Dimension::Ip, rules(&["2/1m"])))
            .build()
            .unwrap()
    };
    let resolver = || IdentityResolver::new().trust_proxy("127.0.0.1/32".parse().unwrap());
    let (default, _) = counted_at(
        "/default",
        RateLimitLayer::new(gate.clone(), policy()).resolver(resolver()),
    );
    let (wide, wide_calls) = counted_at(
        "/wide",
        RateLimitLayer::new(gate, policy())
            .resolver(resolver())
            .ip_prefix(tollgate::IpPrefix::new(24, 48).unwrap()),
    );
    let server = Server::start(default.merge(wide)).await;
    let addrs = |f: &dyn Fn(u32) -> String| (1..=6).map(f).collect::<Vec<_>>();

    // Six addresses of one /64 share the default limiter's two units.
    let one_64 = addrs(&|i| format!("2001:db8:1:2::{i:x}"));
    assert_eq!(
        statuses_from(&server, "/default", &one_64).await,
        [200, 200, 429, 429, 429, 429]
    );
    // By default every /64 is a client of its own, and IPv4 counts each address.
    let many_64 = addrs(&|i| format!("2001:db8:1:{:x}::1", 0x100 + i));
    assert_eq!(statuses_from(&server, "/default", &many_64).await, [200; 6]);
    let v4 = addrs(&|i| format!("198.51.100.{i}"));
    assert_eq!(statuses_from(&server, "/default", &v4).await, [200; 6]);

    // The layer's /48 and /24 group those into one client each.
    assert_eq!(
        statuses_from(&server, "/wide", &many_64).await,
        [200, 200, 429, 429, 429, 429]
    );
    assert_eq!(
        statuses_from(&server, "/wide", &v4).await,
        [200, 200, 429, 429, 429, 429]
    );
    assert_eq!(
        statuses_from(&server, "/wide", &["2001:db8:2::1".to_owned()]).await,
        [200]
    );
    assert_eq!(wide_calls.load(Ordering::SeqCst), 5);
}

/// The legacy `X-RateLimit-*` and the sixth draft's `RateLimit-Limit/Remaining/Reset` fields
/// describe the rule closest to denying, on allowed responses and on the 429, in place of the
/// draft's fields.
#[tokio::test]
async fn legacy_and_draft6_header_styles() {
    for (style, prefix) in [
        (HeaderStyle::Legacy, "x-ratelimit-"),
        (HeaderStyle::Draft6, "ratelimit-"),
    ] {
        let (gate, _) = gate();
        let policy = Policy::builder("api")
            .limiter(Limiter::new(Dimension::Ip, rules(&["2/1m", "10/1h"])))
            .build()
            .unwrap();
        let (app, _) = counted(RateLimitLayer::new(gate, policy).header_style(style));
        let server = Server::start(app).await;
        let http = client();
        let field =
            |response: &reqwest::Response, name: &str| header(response, &format!("{prefix}{name}"));

        let first = http.get(server.at("/")).send().await.unwrap();
        assert_eq!(first.status(), 200);
        // 2/1m has 1 left, 10/1h has 9: the minute rule is the closer one.
        assert_eq!(field(&first, "limit").as_deref(), Some("2"), "{style:?}");
        assert_eq!(
            field(&first, "remaining").as_deref(),
            Some("1"),
            "{style:?}"
        );
        assert_eq!(field(&first, "reset").as_deref(), Some("60"), "{style:?}");
        assert_eq!(header(&first, "ratelimit"), None, "{style:?}");
        assert_eq!(header(&first, "ratelimit-policy"), None, "{style:?}");

        http.get(server.at("/")).send().await.unwrap();
        let denied = http.get(server.at("/")).send().await.unwrap();
        assert_eq!(denied.status(), 429);
        assert_eq!(field(&denied, "limit").as_deref(), Some("2"), "{style:?}");
        assert_eq!(
            field(&denied, "remaining").as_deref(),
            Some("0"),
            "{style:?}"
        );
        let reset: u64 = field(&denied, "reset").unwrap().parse().unwrap();
        assert!((1..=60).contains(&reset), "{style:?}: {reset}");
        assert!(header(&denied, "retry-after").is_some(), "{style:?}");
        assert_eq!(header(&denied, "ratelimit"), None, "{style:?}");
    }
}

/// Nested layers (one for the whole API outside, one for a route inside): the response
/// carries both policies' fields, not only the outer one's. The draft's lists name the route's
/// rules then the API's; the one-rule styles give the rule closer to denying, whichever layer
/// it is in: fewer units left, then the longer to reset.
#[tokio::test]
async fn nested_layers_answer_with_both_policies_fields() {
    // The API's rule, its units spent before on a route only it limits, its item's name,
    // window and units left after the request, and the one-rule fields expected (limit,
    // remaining, reset). The route's rule, 2/1h, has 1 left.
    let cases = [
        // The route's 1 left of 2 is closer than the API's 99 of 100.
        ("100/1m", 0, "ip-1m", 60, 99, ["2", "1", "3600"]),
        // The API's none left is closer.
        ("1/1m", 0, "ip-1m", 60, 0, ["1", "0", "60"]),
        // 1 left each: the API's resets later.
        ("2/1d", 0, "ip-1d", 86_400, 1, ["2", "1", "86400"]),
        // The larger limit with fewer left.
        ("100/1m", 99, "ip-1m", 60, 0, ["100", "0", "60"]),
    ];
    for (api_rule, spent, item, window, api_left, expected) in cases {
        for style in [HeaderStyle::Draft, HeaderStyle::Legacy, HeaderStyle::Draft6] {
            let (gate, _) = gate();
            let policy = |name, rule| {
                Policy::builder(name)
                    .limiter(Limiter::new(Dimension::Ip, rules(&[rule])))
                    .build()
                    .unwrap()
            };
            let route = RateLimitLayer::new(gate.clone(), policy("sms", "2/1h"));
            let api = RateLimitLayer::new(gate, policy("api", api_rule));
            let app = Router::new()
                .route("/", get(|| async { "ok" }).layer(route.header_style(style)))
                .route("/other", get(|| async { "ok" }))
                .layer(api.header_style(style));
            let server = Server::start(app).await;
            let http = client();
            for _ in 0..spent {
                let other = http.get(server.at("/other")).send().await.unwrap();
                assert_eq!(other.status(), 200);
            }
            let first = http.get(server.at("/")).send().await.unwrap();
            assert_eq!(first.status(), 200);
            let case = format!("{style:?}, api {api_rule} with {spent} spent");
            let limit = api_rule.split('/').next().unwrap();
            match style {
                HeaderStyle::Draft => {
                    assert_eq!(
                        header(&first, "ratelimit-policy").unwrap(),
                        format!(r#""ip-1h";q=2;w=3600, "{item}";q={limit};w={window}"#),
                        "{case}"
                    );
                    assert_eq!(
                        header(&first, "ratelimit").unwrap(),
                        format!(r#""ip-1h";r=1;t=3600, "{item}";r={api_left};t={window}"#),
                        "{case}"
                    );
                }
                _ => {
                    let prefix = if style == HeaderStyle::Legacy {
                        "x-ratelimit-"
                    } else {
                        "ratelimit-"
                    };
                    let field = |name: &str| header(&first, &format!("{prefix}{name}")).unwrap();
                    let got = [field("limit"), field("remaining"), field("reset")];
                    assert_eq!(got, expected, "{case}");
                }
            }
        }
    }
}

/// Nested layers of different header styles both warn: `RateLimit-Warning` lists the inner
/// policy's warning then the outer one's, though their other fields differ in kind.
#[tokio::test]
async fn nested_layers_of_different_styles_both_warn() {
    let (gate, _) = gate();
    let policy = |name, rule, warning| {
        Policy::builder(name)
            .limiter(Limiter::new(Dimension::Ip, rules(&[rule])).with_warning(warning))
            .build()
            .unwrap()
    };
    let route = RateLimitLayer::new(gate.clone(), policy("sms", "2/1h", 0.5));
    let api = RateLimitLayer::new(gate, policy("api", "4/1m", 0.25));
    let app = Router::new()
        .route("/", get(|| async { "ok" }).layer(route))
        .layer(api.header_style(HeaderStyle::Legacy));
    let server = Server::start(app).await;
    let first = client().get(server.at("/")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit-warning").as_deref(),
        Some(r#""ip-1h";r=1;t=3600, "ip-1m";r=3;t=60"#)
    );
    assert_eq!(
        header(&first, "ratelimit").as_deref(),
        Some(r#""ip-1h";r=1;t=3600"#)
    );
    assert_eq!(
        header(&first, "x-ratelimit-remaining").as_deref(),
        Some("3")
    );
}

/// An inner service that counts its clones.
#[derive(Clone)]
struct CountsClones(Arc<AtomicUsize>);

struct Cloned(CountsClones);

impl Clone for Cloned {
    fn clone(&self) -> Cloned {
        self.0.0.fetch_add(1, Ordering::SeqCst);
        Cloned(self.0.clone())
    }
}

impl tower::Service<http::Request<String>> for Cloned {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<http::Response<Body>, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<String>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(Body::empty())))
    }
}

/// A check the store decides at once calls the inner service the layer made ready: it is not
/// cloned per request (only a check that awaits the store takes a clone along).
#[tokio::test]
async fn a_check_decided_at_once_does_not_clone_the_inner_service() {
    use tower::{Layer as _, Service as _, ServiceExt as _};

    let (gate, _) = gate();
    let clones = Arc::new(AtomicUsize::new(0));
    let policy = Policy::builder("clones")
        .limiter(Limiter::new(Dimension::UserId, rules(&["2/1m"])))
        .build()
        .unwrap();
    let users = IdentityResolver::new().enrich(|who, _, _| who.with_user_id("alice"));
    let mut service = RateLimitLayer::new(gate, policy)
        .resolver(users)
        .layer(Cloned(CountsClones(clones.clone())));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let ready = service.ready().await.unwrap();
        let response = ready.call(http::Request::new(String::new())).await.unwrap();
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(clones.load(Ordering::SeqCst), 0, "no clone per request");
}

#[tokio::test]
async fn an_admission_at_a_limiters_warning_says_so_in_ratelimit_warning() {
    let (gate, _clock) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, rules(&["4/1m", "100/1h"])).with_warning(0.75))
        .build()
        .unwrap();
    let (app, _) = counted(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let http = client();
    let mut warnings = Vec::new();
    for _ in 0..5 {
        let response = http.get(server.at("/")).send().await.unwrap();
        warnings.push((
            response.status().as_u16(),
            header(&response, "ratelimit-warning"),
        ));
    }
    // 3 of 4 reach 0.75; the denial warns of nothing (its fields say more).
    assert_eq!(
        warnings,
        [
            (200, None),
            (200, None),
            (200, Some(r#""ip-1m";r=1;t=60"#.to_owned())),
            (200, Some(r#""ip-1m";r=0;t=60"#.to_owned())),
            (429, None),
        ]
    );
}

#[tokio::test]
async fn a_cost_read_from_the_request_is_settled_at_what_the_response_says() {
    let (gate, _clock) = gate();
    let policy = Policy::builder("llm")
        .limiter(Limiter::new(
            Dimension::Ip,
            [rules(&["100/1h"])[0].with_algorithm(tollgate::Algorithm::FixedWindow)],
        ))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(gate.clone(), policy.clone())
        .cost_from(Cost::header("x-max-tokens"))
        .settle(Settle::header("x-tokens-used"));
    // The handler answers with the tokens it says it used.
    let app = Router::new().route(
        "/complete",
        get(|headers: axum::http::HeaderMap| async move {
            let used = headers["x-use"].to_str().unwrap().to_owned();
            ([("x-tokens-used", used)], "ok")
        })
        .layer(layer),
    );
    let server = Server::start(app).await;
    let http = client();
    let ask = |max: u64, used: u64| {
        http.get(server.at("/complete"))
            .header("x-max-tokens", max.to_string())
            .header("x-use", used.to_string())
            .send()
    };
    let remaining = || async {
        let who = tollgate::Identity::new().with_ip("127.0.0.1".parse().unwrap());
        gate.peek(&policy, &who, 0)
            .await
            .unwrap()
            .remaining()
            .unwrap()
    };
    // 0 asked (read as 1: a client does not make its request free), 20 used: 20 charged.
    assert_eq!(ask(0, 20).await.unwrap().status(), 200);
    assert_eq!(remaining().await, 80);
    // 10 asked, 30 used: 50 charged in all.
    assert_eq!(ask(10, 30).await.unwrap().status(), 200);
    assert_eq!(remaining().await, 50);
    // 30 asked, 5 used: 25 back.
    assert_eq!(ask(30, 5).await.unwrap().status(), 200);
    assert_eq!(remaining().await, 45);
    // 60 asked: more than is left, refused before any work.
    assert_eq!(ask(60, 1).await.unwrap().status(), 429);
    // 40 asked, 90 used: past the limit, a debt; then refused.
    assert_eq!(ask(40, 90).await.unwrap().status(), 200);
    assert_eq!(remaining().await, 0);
    assert_eq!(ask(1, 1).await.unwrap().status(), 429);
}

/// A client that says its request costs 0 is counted for 1: a check of cost 0 would record
/// nothing and take no concurrency slot, so every request would pass.
#[tokio::test]
async fn a_cost_of_zero_from_the_request_counts_one() {
    let (gate, _clock) = gate();
    let policy = Policy::builder("llm")
        .limiter(Limiter::new(Dimension::Ip, rules(&["2/1h"])))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(gate, policy).cost_from(Cost::header("x-max-tokens"));
    let app = Router::new().route("/complete", get(|| async { "ok" }).layer(layer));
    let server = Server::start(app).await;
    let http = client();
    let ask = |max: &str| {
        http.get(server.at("/complete"))
            .header("x-max-tokens", max)
            .send()
    };
    assert_eq!(ask("0").await.unwrap().status(), 200);
    assert_eq!(ask("0").await.unwrap().status(), 200);
    assert_eq!(ask("0").await.unwrap().status(), 429, "2 an hour");
}

#[tokio::test(start_paused = true)]
async fn a_held_request_waits_for_its_turn_and_one_that_goes_away_gives_it_back() {
    use axum::{body::Body, extract::ConnectInfo};
    use tower::ServiceExt as _;

    let (gate, _clock) = gate();
    let policy = Policy::builder("checkout")
        .limiter(Limiter::new(
            Dimension::Ip,
            [rules(&["10/1s"])[0].with_algorithm(tollgate::Algorithm::Gcra)],
        ))
        .build()
        .unwrap();
    // The store's clock stands still; tokio's is paused: every wait below is exact.
    let layer = RateLimitLayer::new(gate, policy).max_delay(Duration::from_millis(250));
    let app = Router::new().route("/", get(|| async { "ok" }).layer(layer));
    let peer: std::net::SocketAddr = "192.0.2.8:4000".parse().unwrap();
    let request = || {
        let mut request = axum::http::Request::get("/").body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    };
    let timed = |app: Router| async move {
        let started = tokio::time::Instant::now();
        let status = app.oneshot(request()).await.unwrap().status().as_u16();
        (status, started.elapsed())
    };
    for _ in 0..10 {
        assert_eq!(timed(app.clone()).await, (200, Duration::ZERO));
    }
    // One every 100 ms past the burst: the 11th is held 100 ms.
    assert_eq!(timed(app.clone()).await, (200, Duration::from_millis(100)));
    // The 12th goes away after 10 ms of its 200: its place comes back.
    let gone =
        tokio::time::timeout(Duration::from_millis(10), app.clone().oneshot(request())).await;
    assert!(gone.is_err(), "still held");
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(timed(app.clone()).await, (200, Duration::from_millis(200)));
    // The next would be due in 300 ms, past 250: refused at once.
    assert_eq!(timed(app.clone()).await, (429, Duration::ZERO));
}

#[tokio::test]
async fn an_identitys_override_counts_and_shows_in_the_fields() {
    let (gate, _clock) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, rules(&["2/1m", "10/1h"])).with_overrides(true))
        .build()
        .unwrap();
    let (app, calls) = counted(RateLimitLayer::new(gate.clone(), policy.clone()));
    let server = Server::start(app).await;
    let http = client();
    let me = tollgate::Identity::new().with_ip("127.0.0.1".parse().unwrap());
    gate.set_override(&policy, "ip", &me, &rules(&["4/1m"]), None)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let response = http.get(server.at("/")).send().await.unwrap();
        seen.push((
            response.status().as_u16(),
            header(&response, "ratelimit-policy"),
            header(&response, "ratelimit"),
        ));
    }
    let policy_field = Some(r#""ip-1m";q=4;w=60, "ip-1h";q=10;w=3600"#.to_owned());
    assert_eq!(seen[0].1, policy_field, "{seen:?}");
    assert_eq!(
        seen[3].2.as_deref(),
        Some(r#""ip-1m";r=0;t=60, "ip-1h";r=6;t=3600"#),
        "{seen:?}"
    );
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        [200, 200, 200, 200, 429]
    );
    assert_eq!(
        seen[4].1, policy_field,
        "the refusal names the override's limit"
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
}

/// A client gone while its idempotency key's lock is taken at the store leaves the key free:
/// its retry runs, rather than waiting out the lock's TTL as "in progress".
#[tokio::test]
async fn a_key_taken_for_a_client_gone_meanwhile_is_given_back() {
    use tower::ServiceExt as _;

    let (store, entered, proceed) = HeldRefunds::new(false);
    store
        .hold_locks
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let gate = Arc::new(Tollgate::new(store));
    let layer = tollgate_tower::DuplicateLayer::idempotency_key(gate, "orders");
    let app = Router::new().route(
        "/orders",
        axum::routing::post(|| async { StatusCode::CREATED }).layer(layer),
    );
    let request = || {
        http::Request::post("/orders")
            .header("idempotency-key", "k")
            .body(Body::empty())
            .unwrap()
    };
    let first = tokio::spawn(app.clone().oneshot(request()));
    entered.notified().await;
    // The client goes away while the store takes the lock; then the store answers.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    proceed.add_permits(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let retry = app.clone().oneshot(request()).await.unwrap();
        if retry.status() == StatusCode::CREATED {
            break;
        }
        assert_eq!(
            retry.status(),
            StatusCode::CONFLICT,
            "in progress, until given back"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the key was never given back"
        );
        tokio::task::yield_now().await;
    }
}

/// A memory store whose refunds (or, with `hold_checks`, checks' answers) wait until the test
/// lets them go: a call on its way to a networked store, in flight when the client goes away.
struct HeldRefunds {
    inner: tollgate::MemoryStore,
    entered: Arc<tokio::sync::Notify>,
    proceed: Arc<tokio::sync::Semaphore>,
    hold_checks: bool,
    /// How many lock acquisitions to come are held too (applied at once, answered later).
    hold_locks: std::sync::atomic::AtomicUsize,
}

impl HeldRefunds {
    /// A store over a new memory store, with what tells the test a call arrived and what lets
    /// it go on.
    fn new(
        hold_checks: bool,
    ) -> (
        HeldRefunds,
        Arc<tokio::sync::Notify>,
        Arc<tokio::sync::Semaphore>,
    ) {
        let (entered, proceed) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Semaphore::new(0)),
        );
        let store = HeldRefunds {
            inner: tollgate::MemoryStore::new(),
            entered: entered.clone(),
            proceed: proceed.clone(),
            hold_checks,
            hold_locks: std::sync::atomic::AtomicUsize::new(0),
        };
        (store, entered, proceed)
    }

    /// Waits for the test's permit, telling it that a call arrived.
    async fn hold(&self) {
        self.entered.notify_one();
        self.proceed.acquire().await.unwrap().forget();
    }
}

impl Store for HeldRefunds {
    async fn check(&self, request: &CheckRequest<'_>) -> Result<Verdict, StoreError> {
        // Applied at once, answered later: a networked store runs the check whether or not
        // its caller is still there to hear the answer.
        let verdict = self.inner.check(request).await;
        if self.hold_checks {
            self.hold().await;
        }
        verdict
    }

    async fn reset(&self, request: &CheckRequest<'_>) -> Result<(), StoreError> {
        self.inner.reset(request).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl RefundStore for HeldRefunds {
    async fn refund(
        &self,
        request: &CheckRequest<'_>,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        if !self.hold_checks {
            self.hold().await;
        }
        self.inner.refund(request, receipt).await
    }

    async fn extend(
        &self,
        request: &CheckRequest<'_>,
        receipt: &Receipt,
    ) -> Result<Option<Receipt>, StoreError> {
        self.inner.extend(request, receipt).await
    }

    async fn charge(&self, request: &CheckRequest<'_>) -> Result<(), StoreError> {
        self.inner.charge(request).await
    }
}

impl LockStore for HeldRefunds {
    async fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<tollgate::LockReply, StoreError> {
        let reply = self.inner.lock_acquire(key, token, fingerprint, ttl).await;
        let held = self.hold_locks.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| n.checked_sub(1),
        );
        if held.is_ok() {
            self.hold().await;
        }
        reply
    }

    async fn lock_release(&self, key: &str, token: &str) -> Result<bool, StoreError> {
        self.inner.lock_release(key, token).await
    }

    async fn lock_complete(
        &self,
        key: &str,
        token: &str,
        response: &[u8],
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        self.inner
            .lock_complete(key, token, response, keep_for)
            .await
    }
}

impl BanStore for HeldRefunds {
    async fn bans(&self, prefix: &str) -> Result<Vec<tollgate::BanEntry>, StoreError> {
        self.inner.bans(prefix).await
    }

    async fn ban(
        &self,
        prefix: &str,
        target: &tollgate::BanTarget,
        duration: Duration,
    ) -> Result<(), StoreError> {
        self.inner.ban(prefix, target, duration).await
    }

    async fn unban(&self, prefix: &str, target: &tollgate::BanTarget) -> Result<bool, StoreError> {
        self.inner.unban(prefix, target).await
    }
}

impl tollgate::OverrideStore for HeldRefunds {
    async fn set_override(
        &self,
        limiter: &tollgate::LimiterRequest<'_>,
        index: &str,
        entry: &tollgate::Override,
        ttl: Option<Duration>,
    ) -> Result<tollgate::Override, StoreError> {
        self.inner.set_override(limiter, index, entry, ttl).await
    }

    async fn remove_override(
        &self,
        limiter: &tollgate::LimiterRequest<'_>,
        index: &str,
    ) -> Result<bool, StoreError> {
        self.inner.remove_override(limiter, index).await
    }

    async fn overrides(&self, index: &str) -> Result<Vec<tollgate::Override>, StoreError> {
        self.inner.overrides(index).await
    }
}

/// A success under `Count::failures()` is refunded before its response goes out; a client
/// that goes away while the refund is on its way to the store does not cancel it.
#[tokio::test]
async fn a_refund_in_flight_when_the_client_goes_away_still_lands() {
    let (store, entered, proceed) = HeldRefunds::new(false);
    let gate = Arc::new(Tollgate::new(store));
    let policy = Policy::builder("login")
        .limiter(Limiter::new(Dimension::Ip, rules(&["2/1m"])))
        .build()
        .unwrap();
    let app = login(RateLimitLayer::new(gate.clone(), policy.clone()).count(Count::failures()));
    let server = Server::start(app).await;
    let gone = tokio::spawn(client().get(server.at("/login?pw=right")).send());
    entered.notified().await;
    gone.abort();
    let _ = gone.await;
    proceed.add_permits(1);
    // The refund lands on its own task: wait for it (bounded).
    let who = tollgate::Identity::new().with_ip("127.0.0.1".parse().unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = gate.peek(&policy, &who, 0).await.unwrap().remaining();
        if left == Some(2) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refund never landed: {left:?} left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A request that goes away while its check is at the store never hears the answer: what an
/// admission took is given back, not held until the lease runs out. Else a client that drops
/// its connections at the right moment could take every slot of a global concurrency limit.
#[tokio::test]
async fn a_request_gone_while_its_check_is_at_the_store_gives_its_slot_back() {
    let (store, entered, proceed) = HeldRefunds::new(true);
    let gate = Arc::new(Tollgate::new(store));
    let policy = Policy::builder("export")
        .limiter(Limiter::concurrent(Dimension::Global, 1, Duration::from_secs(300)).unwrap())
        .build()
        .unwrap();
    let (app, calls) = counted(RateLimitLayer::new(gate.clone(), policy.clone()));
    let server = Server::start(app).await;
    let gone = tokio::spawn(client().get(server.at("/")).send());
    entered.notified().await;
    gone.abort();
    let _ = gone.await;
    // The server sees the connection close, then the check is answered: admitted.
    tokio::time::sleep(Duration::from_millis(50)).await;
    proceed.add_permits(1);
    // The slot comes back on its own task: later requests get it (bounded wait).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        proceed.add_permits(1);
        let status = client().get(server.at("/")).send().await.unwrap().status();
        if status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot of a request that went away is still taken: {status}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the request that went away never ran"
    );
}

#[tokio::test]
async fn grpc_and_grpc_web_calls_over_the_limit_are_refused_in_their_own_content_type() {
    let (gate, _clock) = gate();
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, rules(&["1/1m"])))
        .build()
        .unwrap();
    let (app, calls) = counted(RateLimitLayer::new(gate, policy));
    let server = Server::start(app).await;
    let call = |content_type: &'static str| {
        client()
            .get(server.at("/"))
            .header("content-type", content_type)
            .send()
    };
    assert_eq!(call("application/grpc").await.unwrap().status(), 200);
    for content_type in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc-web",
        "application/grpc-web-text+proto",
    ] {
        let refused = call(content_type).await.unwrap();
        assert_eq!(refused.status(), 200, "gRPC answers every call with 200");
        assert_eq!(
            header(&refused, "content-type").as_deref(),
            Some(content_type)
        );
        assert_eq!(header(&refused, "grpc-status").as_deref(), Some("8"));
        assert_eq!(
            header(&refused, "grpc-retry-pushback-ms").as_deref(),
            Some("60000")
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
