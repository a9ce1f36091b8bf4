//! The store conformance suite against `RedisStore` on a real `redis-server`.
//!
//! The store is built with the scenario's manual clock, so the script computes with the same
//! instants as the memory store and the same numbers must come out. Tests share one server
//! while any of them runs (each under its own key prefix); the last one to finish stops it.

use std::{
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tollgate::{ManualClock, Tollgate};
use tollgate_redis::RedisStore;
use tollgate_testkit::{
    RedisServer,
    conformance::{START, Subject},
};

static SERVER: Mutex<Weak<RedisServer>> = Mutex::new(Weak::new());
static NEXT_PREFIX: AtomicUsize = AtomicUsize::new(0);

fn shared_server() -> Arc<RedisServer> {
    let mut slot = SERVER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(server) = slot.upgrade() {
        return server;
    }
    let server = Arc::new(RedisServer::start());
    *slot = Arc::downgrade(&server);
    server
}

async fn redis_subject() -> Subject<RedisStore> {
    let server = shared_server();
    let clock = ManualClock::new(START);
    // Generous: a slow shared machine must not turn into a store failure mid-scenario.
    let store = RedisStore::builder(&server.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("connect to the test redis-server");
    let prefix = format!("conf{}", NEXT_PREFIX.fetch_add(1, Ordering::Relaxed));
    Subject::new(Tollgate::new(store).with_prefix(prefix), clock).keep_alive(server)
}

tollgate_testkit::conformance_suite!(redis_subject);
