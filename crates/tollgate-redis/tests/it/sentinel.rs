//! `redis+sentinel://`: the store finds the primary through the sentinels, with the data
//! nodes' password from the URL. (Following a failover: `failover.rs`.)

use std::time::{Duration, Instant};

use tollgate::{Algorithm, Store, StoreErrorKind};
use tollgate_redis::RedisStore;
use tollgate_testkit::{RedisSentinelSet, TestCerts};

use crate::support::{PlanExt, limiter, plan, rule};

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
        assert_eq!(store.check_plan(&p).await.unwrap().allowed, allowed);
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

/// `rediss+sentinel://` with everything a locked-down deployment asks for: TLS to the
/// sentinels and the data nodes with a CA file and a client certificate (both require one),
/// a password on the sentinels (`sentinel_password=`) and another on the data nodes; and the
/// certificates still apply to the replica the sentinels promote after a failover.
#[tokio::test]
async fn a_tls_deployment_with_passwords_and_client_certificates_follows_a_failover() {
    let certs = TestCerts::new();
    let mut set = RedisSentinelSet::builder()
        .tls(
            certs.path("server.crt"),
            certs.path("server.key"),
            certs.path("ca.crt"),
        )
        .tls_auth_clients(true)
        .sentinel_password("watch-pw")
        .start();
    set.require_password("data-pw");
    let base = set
        .tls_url("localhost")
        .unwrap()
        .replace("rediss+sentinel://", "rediss+sentinel://:data-pw@");
    let url = format!("{base}?sentinel_password=watch-pw&{}", certs.client_query());
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let p = plan(
        1,
        &[
            limiter("stls:{a}", &[rule("2/1h", Algorithm::SlidingLog)]),
            limiter("stls:{b}", &[rule("5/1h", Algorithm::FixedWindow)]),
        ],
    );
    for allowed in [true, true, false] {
        assert_eq!(store.check_plan(&p).await.unwrap().allowed, allowed);
    }

    // Each missing piece is refused at build time.
    let quick = |url: String| async move {
        RedisStore::builder(&url)
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect_err("must not connect")
    };
    let no_sentinel_password = format!("{base}?{}", certs.client_query());
    assert!(quick(no_sentinel_password).await.is_unavailable());
    let no_client_cert = format!("{base}?sentinel_password=watch-pw&{}", certs.ca_query());
    assert!(quick(no_client_cert).await.is_unavailable());
    let err = quick(format!("{base}?sentinel_password=watch-pw")).await;
    assert!(err.is_unavailable(), "{err}");
    assert!(!format!("{err:?}").contains("data-pw"), "{err:?}");

    // The sentinels promote the replica; the store finds it over TLS with the same files.
    set.kill_primary();
    set.wait_for_failover(Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(30);
    let fresh = plan(
        1,
        &[limiter("stls:{c}", &[rule("1/1h", Algorithm::SlidingLog)])],
    );
    loop {
        match store.check_plan(&fresh).await {
            Ok(verdict) => {
                assert!(verdict.allowed);
                break;
            }
            Err(err) => assert!(
                Instant::now() < deadline,
                "no answer from the promoted primary: {err}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!store.check_plan(&fresh).await.unwrap().allowed);
}
