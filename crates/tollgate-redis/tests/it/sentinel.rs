//! `redis+sentinel://`: the store finds the primary through the sentinels, with the data
//! nodes' password from the URL. (Following a failover: `failover.rs`.)

use std::time::Duration;

use tollgate::{Algorithm, Store, StoreErrorKind};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisSentinelSet;

use crate::support::{limiter, plan, rule};

#[tokio::test]
async fn the_primary_is_found_through_the_sentinels_with_its_password() {
    let mut set = RedisSentinelSet::start();
    set.require_password("s3cret");
    let url = set
        .url()
        .replace("redis+sentinel://", "redis+sentinel://:s3cret@");
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let p = plan(
        1,
        &[
            limiter("sn:{a}", &[rule("2/1h", Algorithm::SlidingLog)]),
            limiter("sn:{b}", &[rule("5/1h", Algorithm::Gcra)]),
        ],
    );
    for allowed in [true, true, false] {
        assert_eq!(store.check(&p).await.unwrap().allowed, allowed);
    }
    store.ping().await.unwrap();

    // Without the password, or with a name the sentinels do not know: a clear error at once.
    let err = RedisStore::connect(&set.url()).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let unknown = set.url().replace(set.master_name(), "nobody");
    let err = RedisStore::connect(&unknown).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    assert!(!format!("{err:?}").contains("s3cret"));
}
