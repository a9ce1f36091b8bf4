//! `tollgate envoy-ratelimit`, the drop-in for Envoy's reference rate-limit service
//! (envoyproxy/ratelimit): its YAML runtime directory and its environment variables, a real
//! Redis, a real gRPC client. The requests of that service's own integration test, with the
//! codes and remaining counts it expects when it runs with
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true` (how tollgate always counts: all or
//! nothing), and the configurations its README shows.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitResponse,
    rate_limit_response::{Code, DescriptorStatus, rate_limit::Unit},
};
use tollgate_testkit::RedisServer;

use crate::support::{Server, TempDir, descriptor, should_rate_limit};

const BASIC: &str = "\
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

const ANOTHER: &str = "\
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

const EXAMPLES: &str = "\
# The README's kinds of configuration, in one domain.
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 10
  # Blocked: every request is over.
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  # Allowed: a value with no limit.
  - key: remote_address
    value: 10.0.0.1
  - key: ldap
    rate_limit:
      unlimited: true
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit:
          name: specific_limit
          unit: minute
          requests_per_unit: 5
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit:
          replaces:
            - name: specific_limit
          unit: minute
          requests_per_unit: 10
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 2
  # Every file shares one counter; other values count apart.
  - key: file
    value: files/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: file
    value: docs/*
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit:
          unit: minute
          requests_per_unit: 1
";

/// A runtime directory as the reference service reads it:
/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml`.
fn runtime(files: &[(&str, &str)]) -> TempDir {
    let dir = TempDir::new();
    let config = dir.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    for (name, text) in files {
        std::fs::write(config.join(name), text).unwrap();
    }
    dir
}

fn start(redis: &RedisServer, dir: TempDir) -> Server {
    let root = dir.path().join("current").display().to_string();
    let url = redis.addr().to_string();
    Server::start_envoy(
        dir,
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "single"),
            ("REDIS_URL", &url),
            ("RUNTIME_ROOT", &root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("CACHE_KEY_PREFIX", "migrated"),
            // The answers below are the reference's with this setting: all or nothing.
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ],
    )
}

fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap()
}

/// (code, requests_per_unit, unit, remaining) of a status with a limit.
fn limited(status: &DescriptorStatus) -> (Code, u32, Unit, u32) {
    let limit = status.current_limit.as_ref().expect("current_limit");
    (
        code(status),
        limit.requests_per_unit,
        Unit::try_from(limit.unit).unwrap(),
        status.limit_remaining,
    )
}

fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

/// Waits, if need be, until a window of `unit` has at least `room` left, so that a sequence
/// of requests about one counter stays in one fixed window (the windows are aligned to the
/// Unix epoch, as the reference service's are).
async fn room_in(unit: Duration, room: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into = Duration::from_millis(u64::try_from(now.as_millis() % unit.as_millis()).unwrap());
    if unit - into < room {
        tokio::time::sleep(unit - into + Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_reference_services_integration_sequence_answers_the_same() {
    let redis = RedisServer::start();
    let server = start(
        &redis,
        runtime(&[("basic.yaml", BASIC), ("another.yaml", ANOTHER)]),
    );
    let mut rls = server.grpc_client().await;

    // An unknown domain: OK, no limit.
    let r = should_rate_limit(&mut rls, "foo", vec![descriptor(&[("hello", "world")])], 1).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].current_limit, None);
    assert_eq!(r.statuses[0].limit_remaining, 0);

    // A key without a value in the configuration counts each value apart.
    room_in(Duration::from_secs(1), Duration::from_millis(500)).await;
    let r = should_rate_limit(&mut rls, "basic", vec![descriptor(&[("key1", "foo")])], 1).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 50, Unit::Second, 49));

    // Over a minute's limit: 20 admitted, then OVER_LIMIT with 0 left.
    room_in(Duration::from_secs(60), Duration::from_secs(10)).await;
    let key2 = || descriptor(&[("key2", "2481")]);
    for i in 0..25 {
        let r = should_rate_limit(&mut rls, "another", vec![key2()], 1).await;
        let (status, remaining) = if i >= 20 {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 19 - i)
        };
        assert_eq!(overall(&r), status, "request {i}");
        assert_eq!(
            limited(&r.statuses[0]),
            (status, 20, Unit::Minute, remaining),
            "request {i}"
        );
        assert!(r.statuses[0].duration_until_reset.as_ref().unwrap().seconds <= 60);
    }

    // Two keys in one request: once the hour's key is over, the minute's key is not counted.
    room_in(Duration::from_secs(60), Duration::from_secs(10)).await;
    let both = || {
        vec![
            descriptor(&[("key2", "1357")]),
            descriptor(&[("key3", "1357")]),
        ]
    };
    for i in 0..15 {
        let r = should_rate_limit(&mut rls, "another", both(), 1).await;
        let over = i >= 10;
        let remaining_2 = if over { 10 } else { 19 - i };
        let (status_3, remaining_3) = if over {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 9 - i)
        };
        assert_eq!(
            overall(&r),
            if over { Code::OverLimit } else { Code::Ok },
            "request {i}"
        );
        assert_eq!(
            limited(&r.statuses[0]),
            (Code::Ok, 20, Unit::Minute, remaining_2),
            "request {i}"
        );
        assert_eq!(
            limited(&r.statuses[1]),
            (status_3, 10, Unit::Hour, remaining_3),
            "request {i}"
        );
    }

    // The time until reset is the rest of the unit's window.
    let r = should_rate_limit(
        &mut rls,
        "another",
        vec![descriptor(&[("key4", "durTest")])],
        1,
    )
    .await;
    let left = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds;
    assert!((0..=86_400).contains(&left), "{left}");

    // Its health check, and the counters under CACHE_KEY_PREFIX in the Redis of REDIS_URL.
    assert_eq!(
        server.get_text("/healthcheck").await,
        (200, "OK".to_owned())
    );
    let keys = redis_keys(&redis, "migrated:*");
    // (The key's parts are escaped: `:` is `%3A`.)
    assert!(
        keys.iter().any(|k| k.contains("envoy%3Aanother")),
        "{keys:?}"
    );
}

fn redis_keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    let output = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &redis.port().to_string(),
            "--scan",
            "--pattern",
            pattern,
        ])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_readmes_kinds_of_configuration_answer_as_documented() {
    let redis = RedisServer::start();
    let server = start(&redis, runtime(&[("edge.yaml", EXAMPLES)]));
    let mut rls = server.grpc_client().await;
    let ip = |ip: &str| descriptor(&[("remote_address", ip)]);
    room_in(Duration::from_secs(60), Duration::from_secs(10)).await;

    // Blocked: over with 0 per second; a blocked descriptor makes the request over and the
    // others are not counted.
    let r = should_rate_limit(&mut rls, "edge", vec![ip("50.0.0.5"), ip("50.0.0.1")], 1).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(
        limited(&r.statuses[0]),
        (Code::OverLimit, 0, Unit::Second, 0)
    );
    assert_eq!(limited(&r.statuses[1]), (Code::Ok, 10, Unit::Minute, 10));
    let r = should_rate_limit(&mut rls, "edge", vec![ip("50.0.0.1")], 1).await;
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 10, Unit::Minute, 9));

    // Allowed: a value without a limit is not limited, and does not fall back to the key's.
    let r = should_rate_limit(&mut rls, "edge", vec![ip("10.0.0.1")], 1).await;
    assert_eq!(
        (overall(&r), r.statuses[0].current_limit.clone()),
        (Code::Ok, None)
    );

    // Unlimited: OK with every unit left.
    let r = should_rate_limit(&mut rls, "edge", vec![descriptor(&[("ldap", "x")])], 1).await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(r.statuses[0].current_limit, None);

    // Replaces: with both, the replacing limit alone applies and the replaced one is untouched.
    let k1 = || descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let k2 = || descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);
    let r = should_rate_limit(&mut rls, "edge", vec![k1(), k2()], 1).await;
    assert_eq!(r.statuses[0].current_limit, None);
    assert_eq!(limited(&r.statuses[1]), (Code::Ok, 10, Unit::Minute, 9));
    let r = should_rate_limit(&mut rls, "edge", vec![k1()], 1).await;
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 5, Unit::Minute, 4));

    // Wildcards: a `*` anywhere in the value.
    let path = |p: &str| vec![descriptor(&[("path", p)])];
    let r = should_rate_limit(&mut rls, "edge", path("/api/7/action"), 1).await;
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 2, Unit::Minute, 1));
    let r = should_rate_limit(&mut rls, "edge", path("/api/7/other"), 1).await;
    assert_eq!(r.statuses[0].current_limit, None);

    // share_threshold: the values a wildcard matches share its counter.
    let file = |f: &str| vec![descriptor(&[("file", f)])];
    let r = should_rate_limit(&mut rls, "edge", file("files/a.pdf"), 1).await;
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 2, Unit::Minute, 1));
    let r = should_rate_limit(&mut rls, "edge", file("files/b.csv"), 1).await;
    assert_eq!(limited(&r.statuses[0]), (Code::Ok, 2, Unit::Minute, 0));
    let r = should_rate_limit(&mut rls, "edge", file("files/c.txt"), 1).await;
    assert_eq!(overall(&r), Code::OverLimit);
    // Without it, each value has its own.
    for f in ["docs/a.md", "docs/b.md"] {
        let r = should_rate_limit(&mut rls, "edge", file(f), 1).await;
        assert_eq!(limited(&r.statuses[0]), (Code::Ok, 2, Unit::Minute, 1));
    }

    // Shadow mode: counted and reported, never over.
    let shadowed = || vec![descriptor(&[("service", "auth"), ("user", "user-a")])];
    for _ in 0..3 {
        let r = should_rate_limit(&mut rls, "edge", shadowed(), 1).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(code(&r.statuses[0]), Code::Ok);
    }

    // A file added to the directory is loaded.
    let config = server.dir.path().join("current/ratelimit/config");
    std::fs::write(
        config.join("late.yaml"),
        "domain: late\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = should_rate_limit(&mut rls, "late", vec![descriptor(&[("k", "v")])], 1).await;
        if let Some(limit) = &r.statuses[0].current_limit {
            assert_eq!(limit.requests_per_unit, 3);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "late.yaml was never loaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_unsupported_setting_is_refused_with_its_reason() {
    let dir = runtime(&[("basic.yaml", BASIC)]);
    let output = std::process::Command::new(crate::support::binary())
        .arg("envoy-ratelimit")
        .env("BACKEND_TYPE", "memcache")
        .env("RUNTIME_ROOT", dir.path().join("current"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("BACKEND_TYPE: \"memcache\": only redis is supported"),
        "{stderr}"
    );
}
