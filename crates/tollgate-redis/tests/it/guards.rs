//! The testkit's guard scenarios (duplicate guard, blocklist, bypass) and IP-prefix scenarios on
//! `RedisStore`, with the scenario's manual clock, so the numbers must match the memory store's.

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

/// One server while any scenario runs; the last to finish stops it.
fn shared_server() -> Arc<RedisServer> {
    let mut slot = SERVER.lock().unwrap_or_else(|p| p.into_inner());
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
    let store = RedisStore::builder(&server.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let prefix = format!("guard{}", NEXT_PREFIX.fetch_add(1, Ordering::Relaxed));
    Subject::new(Tollgate::new(store).with_prefix(prefix), clock).keep_alive(server)
}

tollgate_testkit::guard_suite!(redis_subject);
tollgate_testkit::prefix_suite!(redis_subject);
