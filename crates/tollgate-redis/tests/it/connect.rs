//! Connecting: clear errors for bad URLs, unreachable servers and wrong passwords, which are
//! never printed.

use std::{net::TcpListener, time::Duration};

use tollgate::{Store, StoreErrorKind};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

use crate::support::raw;

/// The error with its sources, as a log line would show it.
fn full(err: &tollgate::StoreError) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(&format!(" / {s}"));
        source = s.source();
    }
    text
}

#[tokio::test]
async fn a_bad_url_is_a_clear_error() {
    for url in [
        "http://127.0.0.1:6380/",
        "redis://127.0.0.1:notaport/",
        "nonsense",
    ] {
        let err = RedisStore::connect(url).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{url}: {err}");
        assert!(
            err.to_string().contains("invalid Redis URL"),
            "{url}: {err}"
        );
    }
}

#[tokio::test]
async fn an_unreachable_server_fails_build() {
    // A port nobody listens on: bound, then released.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let err = RedisStore::builder(&format!("redis://:hunter2@127.0.0.1:{port}/0"))
        .build()
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let text = full(&err);
    assert!(
        text.contains("cannot connect to redis://:***@127.0.0.1"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "build took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn passwords_and_acl_users_come_from_the_url() {
    let server = RedisServer::start();
    let port = server.port();
    // Set at run time: the test kit's readiness PING cannot authenticate.
    let mut admin = raw(&server).await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">apppass", "~*", "+@all"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "s3cret"])
        .query_async(&mut admin)
        .await
        .unwrap();

    let store = RedisStore::connect(&format!("redis://:s3cret@127.0.0.1:{port}/0"))
        .await
        .unwrap();
    store.ping().await.unwrap();
    let store = RedisStore::connect(&format!("redis://app:apppass@127.0.0.1:{port}/3"))
        .await
        .unwrap();
    store.ping().await.unwrap();

    let err = RedisStore::connect(&format!("redis://app:wrong@127.0.0.1:{port}/0"))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(!full(&err).contains("wrong@"), "{}", full(&err));
    let err = RedisStore::connect(&server.url()).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
}
