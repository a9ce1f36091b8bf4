//! The store conformance suite against `RedisStore` through `redis+sentinel://`: the primary
//! the sentinels name, found through them, answers every scenario as a standalone server does.
//! Tests share one sentinel set while any of them runs (each under its own key prefix).

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
    RedisSentinelSet,
    conformance::{START, Subject},
};

static SET: Mutex<Weak<RedisSentinelSet>> = Mutex::new(Weak::new());
static NEXT_PREFIX: AtomicUsize = AtomicUsize::new(0);

fn shared_set() -> Arc<RedisSentinelSet> {
    let mut slot = SET.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(set) = slot.upgrade() {
        return set;
    }
    let set = Arc::new(RedisSentinelSet::start());
    *slot = Arc::downgrade(&set);
    set
}

async fn sentinel_subject() -> Subject<RedisStore> {
    let set = shared_set();
    let clock = ManualClock::new(START);
    let store = RedisStore::builder(&set.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("connect through the sentinels");
    let prefix = format!("sent{}", NEXT_PREFIX.fetch_add(1, Ordering::Relaxed));
    Subject::new(Tollgate::new(store).with_prefix(prefix), clock).keep_alive(set)
}

tollgate_testkit::conformance_suite!(sentinel_subject);
