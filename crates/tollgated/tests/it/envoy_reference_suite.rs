//! The integration suite of Envoy's reference rate-limit service, replayed against
//! `tollgate envoy-ratelimit` over gRPC: its Go integration tests (the basic sequence on
//! standalone Redis, with a key prefix, with `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, with a
//! password, over TLS, on a Cluster and behind Sentinel; a configuration reload; shared
//! thresholds) and its Envoy scripts (replaces, quota mode, the token-quota pattern of a check
//! at no cost debited after the response, shadow descriptors, detailed statistics), each
//! answer compared whole. Memcached and xDS are refused on purpose (see
//! docs/migrating-from-envoy-ratelimit.md); the local cache's statistics have no counterpart.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::RateLimitDescriptor,
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit},
        },
    },
    google::protobuf::Duration as PbDuration,
};
use tollgate_testkit::{RedisCluster, RedisSentinelSet, RedisServer};

use crate::support::{Server, TempDir, descriptor};

const BASIC: &str = "
domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

const ANOTHER: &str = "
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 20
";

const SHARE: &str = "
domain: share-threshold-test
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: files_no_share
    value: files_no_share/*
    rate_limit:
      unit: hour
      requests_per_unit: 10
";

const RELOAD: &str = "
domain: reload
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: block
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

/// The reference's example configuration, which its Envoy scripts run against.
const EXAMPLE: &str = "
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
        - name: fake_name
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: destination_cluster
        value: override
        rate_limit:
          replaces:
            - name: banned_limit
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: fake
        rate_limit:
          name: fake_name
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: baz
        value: not-so-shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
        shadow_mode: true
      - key: bay
        rate_limit:
          unlimited: true
  - key: unspec
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: qux
    rate_limit:
      unlimited: true
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: \"service_1\"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: \"service_2\"
";

/// The runtime directory of the reference's tests: `runtime/current/ratelimit/config`.
fn runtime() -> TempDir {
    let dir = TempDir::new();
    let config = dir.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    for (name, text) in [
        ("basic.yaml", BASIC),
        ("another.yaml", ANOTHER),
        ("share_threshold.yaml", SHARE),
        ("example.yaml", EXAMPLE),
    ] {
        std::fs::write(config.join(name), text).unwrap();
    }
    dir
}

/// `tollgate envoy-ratelimit` with the reference's variables for the store and `env`.
fn start(store: &[(&str, String)], env: &[(&str, &str)]) -> Server {
    let dir = runtime();
    let root = dir.path().join("current").display().to_string();
    let mut vars: Vec<(&str, &str)> = vec![
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("RUNTIME_ROOT", &root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
    ];
    vars.extend(store.iter().map(|(k, v)| (*k, v.as_str())));
    vars.extend_from_slice(env);
    Server::start_envoy(dir, &vars)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Waits, if needed, so that at least `room` is left of the current minute: a sequence that
/// counts in minute windows stays in one.
async fn room_in_minute(room: Duration) {
    let into = now_ms() % 60_000;
    let room = room.as_millis() as u64;
    if 60_000 - into < room {
        tokio::time::sleep(Duration::from_millis(60_000 - into + 50)).await;
    }
}

/// A value no earlier run used (the reference picks random ones).
fn fresh() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{nanos}")
}

struct Client {
    rls: envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>,
}

impl Client {
    async fn new(server: &Server) -> Client {
        Client {
            rls: server.grpc_client().await,
        }
    }

    async fn ask(
        &mut self,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
    ) -> RateLimitResponse {
        self.rls
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors,
                hits_addend: 0,
            })
            .await
            .unwrap_or_else(|e| panic!("{domain}: {e}"))
            .into_inner()
    }

    /// One descriptor per `(key, value)`.
    async fn each(&mut self, domain: &str, entries: &[(&str, &str)]) -> RateLimitResponse {
        let descriptors = entries.iter().map(|e| descriptor(&[*e])).collect();
        self.ask(domain, descriptors).await
    }
}

/// A descriptor with its own `hits_addend`.
fn with_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    let mut d = descriptor(entries);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    d
}

/// The seconds of `unit`.
fn unit_secs(unit: Unit) -> u64 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => 86_400,
        other => panic!("{other:?}"),
    }
}

/// The reference's status with a limit; `duration_until_reset` is checked apart (see
/// [`check`]).
fn limited(code: Code, per_unit: u32, unit: Unit, remaining: u32) -> DescriptorStatus {
    named(code, "", per_unit, unit, remaining)
}

fn named(code: Code, name: &str, per_unit: u32, unit: Unit, remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: name.into(),
            requests_per_unit: per_unit,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: None,
        quota: None,
    }
}

/// A status with no limit.
fn unlimited_ok() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

/// `actual` is `overall` with `statuses`, compared whole, each `duration_until_reset` the
/// unit's whole seconds left by the clock (`unit - now % unit`, no nanoseconds), present
/// exactly where a limit is (as the reference's tests copy it from the answer and compare).
fn check(actual: &RateLimitResponse, overall: Code, statuses: &[DescriptorStatus], what: &str) {
    let mut actual = actual.clone();
    for status in &mut actual.statuses {
        let duration = status.duration_until_reset.take();
        match &status.current_limit {
            Some(limit) => {
                let d = duration.unwrap_or_else(|| panic!("{what}: no duration in {status:?}"));
                let secs = unit_secs(Unit::try_from(limit.unit).unwrap()) as i64;
                assert_eq!(d.nanos, 0, "{what}");
                assert!(
                    (1..=secs).contains(&d.seconds),
                    "{what}: {} s left of {secs}",
                    d.seconds
                );
            }
            None => assert_eq!(duration, None, "{what}: {status:?}"),
        }
    }
    let expected = RateLimitResponse {
        overall_code: overall as i32,
        statuses: statuses.to_vec(),
        ..RateLimitResponse::default()
    };
    assert_eq!(actual, expected, "{what}");
}

fn duration(r: &RateLimitResponse) -> PbDuration {
    r.statuses[0].duration_until_reset.unwrap()
}

/// The reference's basic sequence (`testBasicBaseConfig`): an unknown domain, a per-second
/// limit, 25 requests on a minute's limit, 15 with two descriptors; with `stop` (its
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), a request over one descriptor does not count
/// the others. The statistics' total and over-limit hits follow each step.
async fn basic_sequence(server: &Server, stop: bool) {
    let mut c = Client::new(server).await;
    let r = c.each("foo", &[("hello", "world")]).await;
    check(&r, Code::Ok, &[unlimited_ok()], "unknown domain");

    let r = c.each("basic", &[("key1", &fresh())]).await;
    check(
        &r,
        Code::Ok,
        &[limited(Code::Ok, 50, Unit::Second, 49)],
        "key1",
    );
    assert_eq!(duration(&r).seconds, 1);

    room_in_minute(Duration::from_secs(10)).await;
    let r2 = fresh();
    for i in 0..25u32 {
        let r = c.each("another", &[("key2", &r2)]).await;
        let what = format!("key2, request {i}");
        if i < 20 {
            check(
                &r,
                Code::Ok,
                &[limited(Code::Ok, 20, Unit::Minute, 19 - i)],
                &what,
            );
        } else {
            let over = limited(Code::OverLimit, 20, Unit::Minute, 0);
            check(&r, Code::OverLimit, &[over], &what);
        }
    }
    let r3 = fresh();
    for i in 0..15u32 {
        let r = c.each("another", &[("key2", &r3), ("key3", &r3)]).await;
        let what = format!("key2 and key3, request {i}");
        if i < 10 {
            let statuses = [
                limited(Code::Ok, 20, Unit::Minute, 19 - i),
                limited(Code::Ok, 10, Unit::Hour, 9 - i),
            ];
            check(&r, Code::Ok, &statuses, &what);
        } else {
            // Counted on its own, key2 goes on; when key3 goes over and stops the others,
            // key2 stays at its 10.
            let left = if stop { 10 } else { 19 - i };
            let statuses = [
                limited(Code::Ok, 20, Unit::Minute, left),
                limited(Code::OverLimit, 10, Unit::Hour, 0),
            ];
            check(&r, Code::OverLimit, &statuses, &what);
        }
    }
    // Every value of key2 shares the statistics key `another.key2`: 25 + 15 hits, 5 over.
    let metrics = server.get_text("/metrics").await.1;
    let stat = |key: &str, kind: &str| {
        let series = format!(
            "tollgate_envoy_descriptor_hits_total{{domain=\"another\",key=\"{key}\",kind=\"{kind}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map(|v| v.parse::<u64>().unwrap())
    };
    assert_eq!(stat("key2", "total_hits"), Some(40), "{metrics}");
    assert_eq!(stat("key2", "over_limit"), Some(5));
    assert_eq!(stat("key3", "total_hits"), Some(15));
    assert_eq!(stat("key3", "over_limit"), Some(5));
}

/// The sequence on standalone Redis, as is, with a key prefix, and with
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (`TestBasicConfig`); then the reset's seconds go
/// down as time goes (its last step).
#[tokio::test]
async fn the_basic_sequence_on_standalone_redis() {
    let redis = RedisServer::start();
    let store = [("REDIS_URL", redis.addr().to_string())];
    // The reference's per-second Redis and local cache change where it counts, never what it
    // answers; tollgate reads neither (one store, its own cache).
    let per_second = RedisServer::start();
    let per_second = per_second.addr().to_string();
    for env in [
        &[][..],
        &[("CACHE_KEY_PREFIX", "prefix:")],
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", &per_second),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1000"),
        ],
        &[
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1000"),
        ],
    ] {
        let server = start(&store, env);
        basic_sequence(&server, env[..].iter().any(|(k, _)| k.starts_with("STOP"))).await;
    }
    let server = start(&store, &[]);
    let mut c = Client::new(&server).await;
    let first = duration(&c.each("another", &[("key4", "durTest")]).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = duration(&c.each("another", &[("key4", "durTest")]).await);
    assert!(second.seconds < first.seconds, "{first:?} then {second:?}");
}

/// `TestBasicAuthConfig`: a Redis that wants a password (`REDIS_AUTH`).
#[tokio::test]
async fn the_basic_sequence_with_a_password() {
    let redis = RedisServer::start();
    require_password([redis.port()], "password123");
    let store = [
        ("REDIS_URL", redis.addr().to_string()),
        ("REDIS_AUTH", "password123".to_owned()),
    ];
    basic_sequence(&start(&store, &[]), false).await;
}

/// `TestBasicTLSConfig`: Redis over TLS (`REDIS_TLS`, with the test CA).
#[tokio::test]
async fn the_basic_sequence_over_tls() {
    let certs = tollgate_testkit::TestCerts::new();
    let (_redis, port) = certs.start_tls_server(false);
    let store = [
        ("REDIS_URL", format!("localhost:{port}")),
        ("REDIS_TLS", "true".to_owned()),
        ("REDIS_TLS_CACERT", certs.path("ca.crt")),
    ];
    basic_sequence(&start(&store, &[]), false).await;
}

/// Requires `password` of the servers at `ports` from now on (`masterauth` too, so that
/// replicas go on syncing): the test kit's readiness checks do not authenticate.
fn require_password(ports: impl IntoIterator<Item = u16>, password: &str) {
    for port in ports {
        for setting in ["masterauth", "requirepass"] {
            let set = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "CONFIG", "SET", setting, password])
                .output()
                .expect("redis-cli, beside redis-server");
            assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "OK");
        }
    }
}

/// `TestBasicAuthConfigWithRedisCluster`: a Cluster that wants a password
/// (`REDIS_TYPE=cluster`, `REDIS_AUTH`), with and without
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
#[tokio::test]
async fn the_basic_sequence_on_a_cluster() {
    let cluster = RedisCluster::start();
    require_password(cluster.nodes().iter().map(RedisServer::port), "password123");
    let nodes: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.addr().to_string())
        .collect();
    let store = [
        ("REDIS_TYPE", "cluster".to_owned()),
        ("REDIS_URL", nodes.join(",")),
        ("REDIS_AUTH", "password123".to_owned()),
    ];
    basic_sequence(&start(&store, &[]), false).await;
    let stop = [("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")];
    basic_sequence(&start(&store, &stop), true).await;
}

/// `TestBasicAuthConfigWithRedisSentinel`: behind Sentinel (`REDIS_TYPE=sentinel`,
/// `master,host:port,...`), the data servers wanting a password (`REDIS_AUTH`), the
/// sentinels none.
#[tokio::test]
async fn the_basic_sequence_behind_sentinel() {
    let mut set = RedisSentinelSet::start();
    set.require_password("password123");
    let sentinels: Vec<String> = set
        .sentinel_urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let store = [
        ("REDIS_TYPE", "sentinel".to_owned()),
        (
            "REDIS_URL",
            format!("{},{}", set.master_name(), sentinels.join(",")),
        ),
        ("REDIS_AUTH", "password123".to_owned()),
    ];
    basic_sequence(&start(&store, &[]), false).await;
}

/// `TestBasicReloadConfig`: a file added to the directory is served (its domain unknown
/// before), and removed, unknown again.
#[tokio::test]
async fn a_file_added_and_removed_is_served_then_forgotten() {
    let redis = RedisServer::start();
    let server = start(&[("REDIS_URL", redis.addr().to_string())], &[]);
    let mut c = Client::new(&server).await;
    let r = c.each("reload", &[("block", "foo")]).await;
    check(&r, Code::Ok, &[unlimited_ok()], "before the file");
    let file = server
        .dir
        .path()
        .join("current/ratelimit/config/reload.yaml");
    std::fs::write(&file, RELOAD).unwrap();
    // Asked until the reload is seen (the directory is read every 100 ms here).
    let served = async {
        loop {
            let r = c.each("reload", &[("key1", "foo")]).await;
            if r.statuses[0].current_limit.is_some() {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let r = tokio::time::timeout(Duration::from_secs(20), served)
        .await
        .expect("the new file is served");
    check(
        &r,
        Code::Ok,
        &[limited(Code::Ok, 50, Unit::Second, 49)],
        "key1",
    );
    let r = c.each("reload", &[("block", "foo")]).await;
    check(
        &r,
        Code::OverLimit,
        &[limited(Code::OverLimit, 0, Unit::Second, 0)],
        "block",
    );
    std::fs::remove_file(&file).unwrap();
    let forgotten = async {
        loop {
            let r = c.each("reload", &[("key1", "foo")]).await;
            if r.statuses[0].current_limit.is_none() {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let r = tokio::time::timeout(Duration::from_secs(20), forgotten)
        .await
        .expect("the removed file is forgotten");
    check(&r, Code::Ok, &[unlimited_ok()], "after the file");
}

/// `TestShareThreshold`: every value a shared wildcard matches counts in one counter; values
/// of an unshared wildcard each in their own.
#[tokio::test]
async fn shared_thresholds_share_one_counter() {
    let redis = RedisServer::start();
    // A prefix of this run: the counters are hourly.
    let prefix = fresh();
    let server = start(
        &[("REDIS_URL", redis.addr().to_string())],
        &[("CACHE_KEY_PREFIX", &prefix)],
    );
    let mut c = Client::new(&server).await;
    for i in 0..10 {
        let r = c
            .each("share-threshold-test", &[("files", "files/a.pdf")])
            .await;
        check(
            &r,
            Code::Ok,
            &[limited(Code::Ok, 10, Unit::Hour, 9 - i)],
            "files/a.pdf",
        );
    }
    let r = c
        .each("share-threshold-test", &[("files", "files/b.csv")])
        .await;
    check(
        &r,
        Code::OverLimit,
        &[limited(Code::OverLimit, 10, Unit::Hour, 0)],
        "another value of the shared wildcard",
    );
    for i in 0..10 {
        let value = format!("files_no_share/{prefix}-{i}");
        let r = c
            .each("share-threshold-test", &[("files_no_share", &value)])
            .await;
        check(
            &r,
            Code::Ok,
            &[limited(Code::Ok, 10, Unit::Hour, 9)],
            &value,
        );
    }
}

/// The reference's `replaces.sh`: the descriptors Envoy sends for each request of the script,
/// and whether it passes. A limit named in a matched limit's `replaces` is not applied (nor
/// counted); the replacing limit governs.
#[tokio::test]
async fn replaces_as_the_references_script_runs_it() {
    let redis = RedisServer::start();
    let server = start(&[("REDIS_URL", redis.addr().to_string())], &[]);
    let mut c = Client::new(&server).await;
    room_in_minute(Duration::from_secs(10)).await;
    let d1 = |foo: &str, bar: &str| descriptor(&[("foo", foo), ("bar", bar)]);
    let d2 = |dc: &str| descriptor(&[("source_cluster", "proxy"), ("destination_cluster", dc)]);
    let d3 = || descriptor(&[("category", "account")]);
    // (descriptors, passes)
    let steps: Vec<(Vec<RateLimitDescriptor>, bool)> = vec![
        (vec![d1("bkthomps", "banned")], false),
        (vec![d1("bkthomps", "banned"), d2("mock")], false),
        (vec![d1("bkthomps", "banned"), d2("override")], true),
        (vec![d1("bkthomps", "banned"), d2("override")], true),
        (vec![d1("bkthomps", "banned"), d2("override")], false),
        (vec![d1("my_foo", "bkthomps"), d2("bkthomps")], true),
        (vec![d1("my_foo", "bkthomps"), d2("bkthomps")], true),
        (vec![d1("my_foo", "bkthomps"), d2("bkthomps")], false),
        (vec![d1("my_foo", "bkthomps"), d2("not_bkthomps")], true),
        (vec![d1("my_foo", "bkthomps"), d2("not_bkthomps")], false),
        (vec![d1("my_foo", "bkthomps"), d2("bkthomps")], false),
        (vec![d1("my_foo", "bkthomps"), d2("fake"), d3()], true),
        (vec![d1("my_foo", "bkthomps"), d2("fake"), d3()], true),
        (vec![d1("my_foo", "bkthomps"), d2("fake"), d3()], true),
        (vec![d1("my_foo", "bkthomps"), d2("fake"), d3()], true),
        (vec![d1("my_foo", "bkthomps"), d2("fake"), d3()], false),
        (vec![d1("foo_2", "bkthomps")], true),
        (vec![d1("foo_2", "bkthomps")], false),
        (vec![d1("foo_3", "bar_3"), d2("fake")], true),
        (vec![d1("foo_3", "bar_3"), d2("fake")], true),
        (vec![d1("foo_3", "bar_3"), d2("fake")], false),
        (vec![d1("my_foo", "bkthomps"), d2("fake"), d3()], false),
    ];
    for (i, (descriptors, passes)) in steps.into_iter().enumerate() {
        let r = c.ask("rl", descriptors).await;
        let expected = if passes { Code::Ok } else { Code::OverLimit };
        assert_eq!(r.overall_code, expected as i32, "request {}: {r:?}", i + 1);
        if i == 0 {
            // The blocked limit, by its name.
            let mut status = r.statuses[0].clone();
            status.duration_until_reset = None;
            assert_eq!(
                status,
                named(Code::OverLimit, "banned_limit", 0, Unit::Minute, 0)
            );
        }
        if i == 2 {
            // The replaced descriptor is answered as unmatched.
            assert_eq!(r.statuses[0], unlimited_ok(), "{r:?}");
        }
    }
}

/// The reference's `quota.sh` and `multiservice-tokenquota.sh`, `token-quota.sh`: quota
/// descriptors over their limit make the request over only when all are; a check at no cost
/// (`hits_addend: 0`) with the hits debited after the response lets the debit go past the
/// limit, and the next check sees it over.
#[tokio::test]
async fn quotas_and_debits_after_the_response() {
    let redis = RedisServer::start();
    let server = start(
        &[("REDIS_URL", redis.addr().to_string())],
        &[("RESPONSE_DYNAMIC_METADATA", "true")],
    );
    let mut c = Client::new(&server).await;
    room_in_minute(Duration::from_secs(10)).await;
    let services = [("service", "service_1"), ("service", "service_2")];
    // quota.sh: service_1 1/min, service_2 2/min, both quota descriptors.
    let codes = |r: &RateLimitResponse| -> Vec<i32> { r.statuses.iter().map(|s| s.code).collect() };
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let r = c.each("rl", &services).await;
    assert_eq!((r.overall_code, codes(&r)), (ok, vec![ok, ok]), "{r:?}");
    let r = c.each("rl", &services).await;
    assert_eq!((r.overall_code, codes(&r)), (ok, vec![over, ok]), "{r:?}");
    let r = c.each("rl", &services).await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (over, vec![over, over]),
        "{r:?}"
    );

    // token-quota.sh on a fresh server (its own keys): checked at 0, debited 1 after.
    let server = start(
        &[("REDIS_URL", redis.addr().to_string())],
        &[("CACHE_KEY_PREFIX", "token")],
    );
    let mut c = Client::new(&server).await;
    for left in [2u32, 1, 0] {
        let r = c
            .ask("rl", vec![with_hits(&[("service", "service_2")], 0)])
            .await;
        check(
            &r,
            Code::Ok,
            &[limited(Code::Ok, 2, Unit::Minute, left)],
            "a check at no cost",
        );
        // The response path's debit, whose answer Envoy ignores: the third goes past the
        // limit and is counted all the same.
        c.ask("rl", vec![with_hits(&[("service", "service_2")], 1)])
            .await;
    }
    let r = c
        .ask("rl", vec![with_hits(&[("service", "service_2")], 0)])
        .await;
    check(
        &r,
        Code::OverLimit,
        &[limited(Code::OverLimit, 2, Unit::Minute, 0)],
        "three debits of a quota of two",
    );

    // multiservice-tokenquota.sh: service_1 serves while it has quota, then service_2.
    let server = start(
        &[("REDIS_URL", redis.addr().to_string())],
        &[
            ("CACHE_KEY_PREFIX", "multi"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
        ],
    );
    let mut c = Client::new(&server).await;
    let serving = |r: &RateLimitResponse| -> Option<String> {
        use envoy_types::pb::google::protobuf::value::Kind;
        let fields = &r.dynamic_metadata.as_ref()?.fields;
        let Some(Kind::StructValue(m)) = &fields.get("metadata")?.kind else {
            return None;
        };
        let Some(Kind::StructValue(s)) = &m.fields.get("service_with_quota")?.kind else {
            return None;
        };
        match &s.fields.get("name")?.kind {
            Some(Kind::StringValue(name)) => Some(name.clone()),
            _ => None,
        }
    };
    let mut served = Vec::new();
    for _ in 0..6 {
        let r = c
            .ask(
                "rl",
                vec![
                    with_hits(&[("service", "service_1")], 0),
                    with_hits(&[("service", "service_2")], 0),
                ],
            )
            .await;
        if r.overall_code == over {
            assert_eq!(serving(&r), None, "{r:?}");
            served.push("429".to_owned());
            continue;
        }
        let name = serving(&r).expect("a service with quota");
        c.ask("rl", vec![with_hits(&[("service", &name)], 1)]).await;
        served.push(name);
    }
    assert_eq!(
        served,
        [
            "service_1",
            "service_1",
            "service_2",
            "service_2",
            "service_2",
            "429"
        ]
    );
}

/// The reference's `simple-get.sh`, `trigger-ratelimit.sh`, `trigger-shadow-mode-key.sh` and
/// `value-included-in-stats-key-when-unspecified.sh`: a limit of 3 a minute over on the
/// fourth request, the same in shadow mode never over, and a `detailed_metric` descriptor
/// counted under its request's value.
#[tokio::test]
async fn the_scripts_limits_shadow_descriptors_and_detailed_statistics() {
    let redis = RedisServer::start();
    let server = start(&[("REDIS_URL", redis.addr().to_string())], &[]);
    let mut c = Client::new(&server).await;
    room_in_minute(Duration::from_secs(10)).await;
    let two = |foo: &str, baz: &str| descriptor(&[("foo", foo), ("baz", baz)]);
    let r = c.ask("rl", vec![two("test", "shady")]).await;
    check(
        &r,
        Code::Ok,
        &[limited(Code::Ok, 3, Unit::Minute, 2)],
        "simple get",
    );
    for (i, left) in [2, 1, 0].into_iter().enumerate() {
        let r = c.ask("rl", vec![two("pelle", "not-so-shady")]).await;
        let status = limited(Code::Ok, 3, Unit::Minute, left);
        check(&r, Code::Ok, &[status], &format!("request {}", i + 1));
    }
    for i in 4..=5 {
        let r = c.ask("rl", vec![two("pelle", "not-so-shady")]).await;
        let status = limited(Code::OverLimit, 3, Unit::Minute, 0);
        check(&r, Code::OverLimit, &[status], &format!("request {i}"));
    }
    // Shadow: counted, never over.
    for left in [2, 1, 0, 0, 0, 0] {
        let r = c.ask("rl", vec![two("pelle", "shady")]).await;
        check(
            &r,
            Code::Ok,
            &[limited(Code::Ok, 3, Unit::Minute, left)],
            "shadow",
        );
    }
    for (left, code) in [(1, Code::Ok), (0, Code::Ok), (0, Code::OverLimit)] {
        let r = c.each("rl", &[("unspec", "unspecified_value")]).await;
        check(&r, code, &[limited(code, 2, Unit::Minute, left)], "unspec");
    }
    let metrics = server.get_text("/metrics").await.1;
    let stat = |key: &str, kind: &str| {
        let series = format!(
            "tollgate_envoy_descriptor_hits_total{{domain=\"rl\",key=\"{key}\",kind=\"{kind}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map(|v| v.parse::<u64>().unwrap())
    };
    assert_eq!(
        stat("unspec_unspecified_value", "over_limit"),
        Some(1),
        "{metrics}"
    );
    assert_eq!(stat("unspec_unspecified_value", "total_hits"), Some(3));
    assert_eq!(stat("unspec_unspecified_value", "within_limit"), Some(2));
    assert_eq!(stat("unspec_unspecified_value", "near_limit"), Some(1));
    // The shadow descriptor (one key for every value of foo): simple get's hit and six,
    // three of them over, in shadow mode; the third near the limit (from 2 of 3).
    assert_eq!(stat("foo.baz_shady", "total_hits"), Some(7));
    assert_eq!(stat("foo.baz_shady", "over_limit"), Some(3));
    assert_eq!(stat("foo.baz_shady", "shadow_mode"), Some(3));
    assert_eq!(stat("foo.baz_shady", "near_limit"), Some(1));
}

/// The reference's health (`TestServiceHealthStatusAtLeastOneConfigLoaded`): reported as
/// `ratelimit`; with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, not serving while no domain is
/// configured, serving once one is, and not again once none is.
#[tokio::test]
async fn health_waits_for_a_configured_domain_when_asked() {
    use crate::grpc_health::{client, wait_for};
    use tonic_health::pb::health_check_response::ServingStatus;
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let config = dir.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    let root = dir.path().join("current").display().to_string();
    let url = redis.addr().to_string();
    let server = Server::start_envoy(
        dir,
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &url),
            ("RUNTIME_ROOT", &root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ],
    );
    let mut health = client(&server).await;
    wait_for(&mut health, "ratelimit", ServingStatus::NotServing).await;
    std::fs::write(config.join("basic.yaml"), BASIC).unwrap();
    wait_for(&mut health, "ratelimit", ServingStatus::Serving).await;
    std::fs::remove_file(config.join("basic.yaml")).unwrap();
    wait_for(&mut health, "ratelimit", ServingStatus::NotServing).await;
}

const QUOTA: &str = "
domain: quota-domain
descriptors:
  - key: regular
    value: limit
    rate_limit: { unit: minute, requests_per_unit: 1 }
    metadata: { name: service_1 }
  - key: quota
    value: limit
    rate_limit: { unit: minute, requests_per_unit: 1 }
    metadata: { name: service_2 }
  - key: other
    value: limit
    rate_limit: { unit: minute, requests_per_unit: 5 }
    metadata: { some_other_name: service_2 }
";

/// The reference's service cases of `QUOTA_MODE`, `RESPONSE_DYNAMIC_METADATA` and
/// `SHADOW_MODE` (`TestServiceGlobalQuotaMode`, `TestMetadataReturnedFor...`,
/// `TestOverlappingMetadataReturnsTheFirstValue`, `TestServiceQuotaModeWithShadowMode`) and of
/// unlimited and unmatched descriptors beside a limited one (`TestUnlimited`).
#[tokio::test]
async fn the_service_cases_of_quota_metadata_and_shadow_modes() {
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    let redis = RedisServer::start();
    let url = [("REDIS_URL", redis.addr().to_string())];
    let metadata_of = |r: &RateLimitResponse| -> Option<Struct> {
        match &r.dynamic_metadata.as_ref()?.fields.get("metadata")?.kind {
            Some(Kind::StructValue(s)) => Some(s.clone()),
            _ => None,
        }
    };
    let strings = |pairs: &[(&str, &str)]| Struct {
        fields: pairs
            .iter()
            .map(|(k, v)| {
                let value = Value {
                    kind: Some(Kind::StringValue((*v).into())),
                };
                ((*k).to_owned(), value)
            })
            .collect(),
    };
    for shadow in ["false", "true"] {
        let prefix = format!("{}{shadow}", fresh());
        let server = start(
            &url,
            &[
                ("QUOTA_MODE", "true"),
                ("RESPONSE_DYNAMIC_METADATA", "true"),
                ("SHADOW_MODE", shadow),
                ("CACHE_KEY_PREFIX", &prefix),
            ],
        );
        std::fs::write(
            server
                .dir
                .path()
                .join("current/ratelimit/config/quota.yaml"),
            QUOTA,
        )
        .unwrap();
        let mut c = Client::new(&server).await;
        let served = async {
            while c.each("quota-domain", &[("other", "limit")]).await.statuses[0]
                .current_limit
                .is_none()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), served)
            .await
            .expect("the quota domain is served");
        room_in_minute(Duration::from_secs(5)).await;
        let regular_quota = [("regular", "limit"), ("quota", "limit")];
        // Both pass: their metadata merged, the first value of a name kept.
        let r = c.each("quota-domain", &regular_quota).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        assert_eq!(metadata_of(&r), Some(strings(&[("name", "service_1")])));
        // One of two quota descriptors over: OK, the metadata of the one that passed.
        let r = c
            .each("quota-domain", &[("regular", "limit"), ("other", "limit")])
            .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
        assert_eq!(
            metadata_of(&r),
            Some(strings(&[("some_other_name", "service_2")]))
        );
        // Every quota descriptor over: over, unless SHADOW_MODE, which keeps each status.
        let r = c.each("quota-domain", &regular_quota).await;
        let overall = if shadow == "true" {
            Code::Ok
        } else {
            Code::OverLimit
        };
        assert_eq!(r.overall_code, overall as i32, "{r:?}");
        assert!(r.statuses.iter().all(|s| s.code == Code::OverLimit as i32));
        assert_eq!(metadata_of(&r), None);
        let metrics = server.get_text("/metrics").await.1;
        let admitted = if shadow == "true" { 1 } else { 0 };
        assert!(
            metrics.contains(&format!(
                "tollgate_envoy_global_shadow_mode_total {admitted}\n"
            )),
            "{metrics}"
        );
    }
    let server = start(&url, &[]);
    let mut c = Client::new(&server).await;
    let value = fresh();
    let r = c
        .each("rl", &[("unspec", &value), ("nothing", "x"), ("qux", "y")])
        .await;
    let unlimited = DescriptorStatus {
        limit_remaining: u32::MAX,
        ..unlimited_ok()
    };
    let statuses = [
        limited(Code::Ok, 2, Unit::Minute, 1),
        unlimited_ok(),
        unlimited,
    ];
    check(&r, Code::Ok, &statuses, "limited, unmatched, unlimited");
}

/// tollgate's own answers for the YAML's domains, each asked for by a switch: one atomic check
/// of a request's descriptors (`TOLLGATE_ENVOY_ATOMIC`: if one is over, none is counted), and
/// the draft's rate-limit fields on answers over their limits (`TOLLGATE_ENVOY_DENIAL_HEADERS`).
#[tokio::test]
async fn tollgates_own_answers_are_switches() {
    let redis = RedisServer::start();
    let url = [("REDIS_URL", redis.addr().to_string())];
    room_in_minute(Duration::from_secs(10)).await;
    for (atomic, left) in [("false", 18), ("true", 19)] {
        let prefix = format!("{}{atomic}", fresh());
        let server = start(
            &url,
            &[
                ("TOLLGATE_ENVOY_ATOMIC", atomic),
                ("TOLLGATE_ENVOY_DENIAL_HEADERS", "true"),
                ("CACHE_KEY_PREFIX", &prefix),
            ],
        );
        let mut c = Client::new(&server).await;
        for _ in 0..10 {
            let r = c.each("another", &[("key3", "v")]).await;
            assert_eq!(r.overall_code, Code::Ok as i32);
            assert!(r.response_headers_to_add.is_empty(), "{r:?}");
        }
        let r = c.each("another", &[("key2", "v"), ("key3", "v")]).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
        let names: Vec<&str> = r
            .response_headers_to_add
            .iter()
            .map(|h| h.key.as_str())
            .collect();
        assert_eq!(names, ["ratelimit-policy", "ratelimit"], "{r:?}");
        let r = c.each("another", &[("key2", "v")]).await;
        assert_eq!(
            r.statuses[0].limit_remaining, left,
            "atomic {atomic}: {r:?}"
        );
    }
}
