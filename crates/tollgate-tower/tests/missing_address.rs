//! An axum app served without `ConnectInfo`: a rate limit by IP has no client address, which
//! only the client would see (a 500): the server logs it, once. A test target of its own: the
//! "once" is per process.

#![allow(clippy::unwrap_used)]

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use axum::{Router, body::Body, routing::get};
use http::Request;
use tollgate::{Dimension, Limiter, MemoryStore, Policy, Tollgate};
use tollgate_tower::RateLimitLayer;
use tower::ServiceExt as _;

/// Log lines, shared with the subscriber.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_missing_client_address_is_logged_once() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    let policy = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, ["10/1m".parse().unwrap()]))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(gate, policy));
    for _ in 0..3 {
        let response = app
            .clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), 500);
    }
    let logged = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert_eq!(
        logged
            .matches("into_make_service_with_connect_info")
            .count(),
        1,
        "{logged}"
    );
}
