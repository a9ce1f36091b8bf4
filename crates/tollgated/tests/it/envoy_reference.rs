//! `tollgate envoy-ratelimit` answers as Envoy's reference rate-limit service does, field for
//! field (compared whole, as the reference's own tests compare with `proto.Equal`): the cases of
//! its service, cache and integration tests for names, remaining counts, durations, unlimited
//! and unmatched descriptors, shadow modes, response headers and a failing Redis.

use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::{
    envoy::{
        config::core::v3::HeaderValue,
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit},
        },
    },
    google::protobuf::Duration as PbDuration,
};
use tollgate_testkit::RedisServer;

use crate::support::{Server, TempDir, descriptor};

const CONFIG: &str = "\
domain: reference
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: named
    rate_limit:
      name: key4_rate_limit
      unit: minute
      requests_per_unit: 2
  - key: hourly
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: unlimited
    rate_limit:
      unlimited: true
  - key: shadowed
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: blocked
    rate_limit:
      unit: hour
      requests_per_unit: 0
  - key: minutely
    rate_limit:
      unit: minute
      requests_per_unit: 50
  - key: quota_a
    quota_mode: true
    metadata:
      plan: { name: gold }
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: quota_b
    quota_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
";

fn start(redis: &RedisServer, env: &[(&str, &str)]) -> Server {
    let dir = TempDir::new();
    let config = dir.path().join("current/rl/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("reference.yaml"), CONFIG).unwrap();
    let root = dir.path().join("current").display().to_string();
    let url = redis.addr().to_string();
    let mut vars = vec![
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url.as_str()),
        ("RUNTIME_ROOT", root.as_str()),
        ("RUNTIME_SUBDIRECTORY", "rl"),
    ];
    vars.extend_from_slice(env);
    Server::start_envoy(dir, &vars)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `ShouldRateLimit` of one descriptor `key=value`, with the Unix second before and after.
async fn call(
    server: &Server,
    key: &str,
    value: &str,
) -> (u64, Result<RateLimitResponse, tonic::Status>, u64) {
    let mut rls = server.grpc_client().await;
    let before = now();
    let answer = rls
        .should_rate_limit(RateLimitRequest {
            domain: "reference".into(),
            descriptors: vec![descriptor(&[(key, value)])],
            hits_addend: 0,
        })
        .await
        .map(tonic::Response::into_inner);
    (before, answer, now())
}

/// The reference's status of a limit: the unit's seconds left by the service's clock,
/// `unit - now % unit`, whole.
fn status(
    code: Code,
    name: &str,
    per_unit: u32,
    unit: Unit,
    remaining: u32,
    now: u64,
) -> DescriptorStatus {
    let secs = match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        _ => unreachable!(),
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: name.into(),
            requests_per_unit: per_unit,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(PbDuration {
            seconds: i64::try_from(secs - now % secs).unwrap(),
            nanos: 0,
        }),
        quota: None,
    }
}

/// `actual` is `expected(now)` for the second before or after the call (a second may turn).
fn assert_status(
    actual: &DescriptorStatus,
    (before, after): (u64, u64),
    expected: impl Fn(u64) -> DescriptorStatus,
) {
    assert!(
        *actual == expected(before) || *actual == expected(after),
        "{actual:?}\nexpected {:?}",
        expected(before)
    );
}

#[tokio::test]
async fn statuses_are_the_references_field_for_field() {
    let redis = RedisServer::start();
    let server = start(&redis, &[]);

    // A limit without a name: an empty name, remaining after the request, whole seconds.
    let (before, r, after) = call(&server, "key1", "a").await;
    let r = r.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_status(&r.statuses[0], (before, after), |now| {
        status(Code::Ok, "", 50, Unit::Second, 49, now)
    });
    assert!(
        r.response_headers_to_add.is_empty(),
        "headers are off by default"
    );

    // A named limit: its name; exactly at the limit is OK with 0 left; over it, 0 left.
    for (code, remaining) in [
        (Code::Ok, 1),
        (Code::Ok, 0),
        (Code::OverLimit, 0),
        (Code::OverLimit, 0),
    ] {
        let (before, r, after) = call(&server, "named", "n").await;
        let r = r.unwrap();
        assert_eq!(r.overall_code, code as i32, "{r:?}");
        assert_status(&r.statuses[0], (before, after), |now| {
            status(code, "key4_rate_limit", 2, Unit::Minute, remaining, now)
        });
        // No headers when LIMIT_RESPONSE_HEADERS_ENABLED is off, not even over the limit.
        assert!(r.response_headers_to_add.is_empty(), "{r:?}");
    }

    // Over an hourly limit: the seconds to the end of the hour.
    call(&server, "hourly", "h").await.1.unwrap();
    let (before, r, after) = call(&server, "hourly", "h").await;
    assert_status(&r.unwrap().statuses[0], (before, after), |now| {
        status(Code::OverLimit, "", 1, Unit::Hour, 0, now)
    });

    // No limit: OK, nothing else. Unlimited: OK, the largest remaining, nothing else.
    let (_, r, _) = call(&server, "nothing", "x").await;
    assert_eq!(
        r.unwrap().statuses[0],
        DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        }
    );
    let (_, r, _) = call(&server, "unlimited", "u").await;
    assert_eq!(
        r.unwrap().statuses[0],
        DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..DescriptorStatus::default()
        }
    );

    // A descriptor in shadow mode over its limit: OK, 0 left, its limit and duration kept.
    call(&server, "shadowed", "s").await.1.unwrap();
    let (before, r, after) = call(&server, "shadowed", "s").await;
    let r = r.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_status(&r.statuses[0], (before, after), |now| {
        status(Code::Ok, "", 1, Unit::Hour, 0, now)
    });
}

/// The reference's global SHADOW_MODE keeps each status and makes only the overall code OK;
/// its response headers, when enabled, come on every answer with a limit, under the names the
/// environment gives them.
#[tokio::test]
async fn global_shadow_mode_and_response_headers() {
    let redis = RedisServer::start();
    let server = start(
        &redis,
        &[
            ("SHADOW_MODE", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-RateLimit-Left"),
        ],
    );
    let header = |name: &str, value: String| HeaderValue {
        key: name.into(),
        value,
        ..HeaderValue::default()
    };
    let (before, r, after) = call(&server, "hourly", "g").await;
    let r = r.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    let reset = |now: u64| (3_600 - now % 3_600).to_string();
    let headers = |now: u64, remaining: &str| {
        vec![
            header("RateLimit-Limit", "1".into()),
            header("X-RateLimit-Left", remaining.into()),
            header("RateLimit-Reset", reset(now)),
        ]
    };
    assert!(
        r.response_headers_to_add == headers(before, "0")
            || r.response_headers_to_add == headers(after, "0"),
        "{:?}",
        r.response_headers_to_add
    );
    let (before, r, after) = call(&server, "hourly", "g").await;
    let r = r.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32, "SHADOW_MODE: overall OK");
    assert_status(&r.statuses[0], (before, after), |now| {
        status(Code::OverLimit, "", 1, Unit::Hour, 0, now)
    });
}

/// Redis down: the reference fails the call, and Envoy's `failure_mode_deny` decides; unless
/// `on_error` is set, when it answers.
#[tokio::test]
async fn a_failing_redis_fails_the_call_unless_on_error_is_set() {
    let mut redis = RedisServer::start();
    // Long enough for a loaded machine: the first call must be answered (a dead server
    // refuses at once).
    let server = start(&redis, &[("TOLLGATE_STORE_TIMEOUT", "2s")]);
    let decided = start(
        &redis,
        &[
            ("TOLLGATE_STORE_TIMEOUT", "2s"),
            ("TOLLGATE_STORE_ON_ERROR", "deny"),
        ],
    );
    assert!(call(&server, "key1", "r").await.1.is_ok());
    redis.kill();
    let (_, r, _) = call(&server, "key1", "r").await;
    let status = r.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(!status.message().contains("127.0.0.1"), "{status:?}");
    let (_, r, _) = call(&decided, "key1", "r").await;
    assert_eq!(r.unwrap().overall_code, Code::OverLimit as i32);
}

/// The reference's Redis TLS files: a Redis that wants a client certificate is reached with
/// `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and `REDIS_TLS_CLIENT_KEY`.
#[tokio::test]
async fn redis_tls_files_come_from_the_references_variables() {
    let certs = tollgate_testkit::TestCerts::new();
    let (_redis, tls_port) = certs.start_tls_server(true);
    let dir = TempDir::new();
    let config = dir.path().join("current/rl/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("reference.yaml"), CONFIG).unwrap();
    let root = dir.path().join("current").display().to_string();
    let url = format!("localhost:{tls_port}");
    let (ca, cert, key) = (
        certs.path("ca.crt"),
        certs.path("client.crt"),
        certs.path("client.key"),
    );
    let server = Server::start_envoy(
        dir,
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &url),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", &ca),
            ("REDIS_TLS_CLIENT_CERT", &cert),
            ("REDIS_TLS_CLIENT_KEY", &key),
            ("TOLLGATE_STORE_ON_ERROR", "deny"),
            ("RUNTIME_ROOT", &root),
            ("RUNTIME_SUBDIRECTORY", "rl"),
        ],
    );
    let (before, r, after) = call(&server, "named", "tls").await;
    assert_status(&r.unwrap().statuses[0], (before, after), |now| {
        status(Code::Ok, "key4_rate_limit", 2, Unit::Minute, 1, now)
    });
}

/// TLS on the gRPC port as the reference reads it: served with its certificate (a plaintext
/// client gets nowhere), client certificates required with a client CA, and with
/// `GRPC_CLIENT_TLS_SAN` only those valid for that name; files that are not there stop the
/// start rather than serve plaintext.
#[tokio::test]
async fn the_grpc_port_serves_tls_and_mutual_tls() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let certs = tollgate_testkit::TestCerts::new();
    let redis = RedisServer::start();
    let pem = |name: &str| std::fs::read(certs.path(name)).unwrap();
    let ask = RateLimitRequest {
        domain: "reference".into(),
        descriptors: vec![descriptor(&[("key1", "tls")])],
        hits_addend: 0,
    };
    // (client CA, client SAN, whether the client's certificate is then served)
    let cases = [
        (false, None, true),
        (true, None, true),
        (true, Some("client.tollgate.test"), true),
        (true, Some("elsewhere.tollgate.test"), false),
    ];
    for (mutual, san, served) in cases {
        let (cert, key, ca) = (
            certs.path("server.crt"),
            certs.path("server.key"),
            certs.path("ca.crt"),
        );
        let mut env = vec![
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", cert.as_str()),
            ("GRPC_SERVER_TLS_KEY", key.as_str()),
        ];
        if mutual {
            env.push(("GRPC_CLIENT_TLS_CACERT", ca.as_str()));
        }
        if let Some(san) = san {
            env.push(("GRPC_CLIENT_TLS_SAN", san));
        }
        let server = start(&redis, &env);
        let addr = server.grpc.replace("http://127.0.0.1", "https://localhost");
        // A TLS 1.3 server refuses a client certificate after the client's side of the
        // handshake is done: the refusal shows on the first call.
        let call = |identity: bool| {
            let mut tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(pem("ca.crt")))
                .domain_name("localhost");
            if identity {
                tls = tls.identity(Identity::from_pem(pem("client.crt"), pem("client.key")));
            }
            let endpoint = Endpoint::from_shared(addr.clone())
                .unwrap()
                .tls_config(tls)
                .unwrap();
            let ask = ask.clone();
            async move {
                let channel = endpoint.connect().await?;
                let mut rls = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
                Ok::<_, Box<dyn std::error::Error>>(rls.should_rate_limit(ask).await?.into_inner())
            }
        };
        let case = format!("mutual: {mutual}, san: {san:?}");
        match call(true).await {
            Ok(r) => {
                assert!(served, "{case}: served");
                assert_eq!(r.overall_code, Code::Ok as i32);
            }
            Err(e) => assert!(!served, "{case}: {e}"),
        }
        // Plaintext gets no answer from a TLS port.
        let mut plain = server.grpc_client().await;
        assert!(plain.should_rate_limit(ask.clone()).await.is_err());
        // With a client CA, a client without a certificate is refused.
        assert_eq!(call(false).await.is_err(), mutual, "{case}");
    }

    // A SAN without a client CA has nothing verified to check: the start fails, naming it.
    let out = std::process::Command::new(crate::support::binary())
        .arg("envoy-ratelimit")
        .env("REDIS_URL", redis.addr().to_string())
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", certs.path("server.crt"))
        .env("GRPC_SERVER_TLS_KEY", certs.path("server.key"))
        .env("GRPC_CLIENT_TLS_SAN", "client.tollgate.test")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("client_san"), "{stderr}");

    // A client that finishes the handshake and sends no HTTP/2 preface is closed within the
    // header timeout, as a plaintext one is.
    {
        use tokio::io::AsyncReadExt as _;
        use tokio_rustls::rustls::{self, RootCertStore, pki_types::ServerName};
        let (cert, key) = (certs.path("server.crt"), certs.path("server.key"));
        let server = start(
            &redis,
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", cert.as_str()),
                ("GRPC_SERVER_TLS_KEY", key.as_str()),
                ("TOLLGATE_SERVER_HEADER_READ_TIMEOUT", "300ms"),
            ],
        );
        let mut roots = RootCertStore::empty();
        let ca: rustls::pki_types::CertificateDer<'static> =
            rustls::pki_types::pem::PemObject::from_pem_file(certs.path("ca.crt")).unwrap();
        roots.add(ca).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(server.grpc.trim_start_matches("http://"))
            .await
            .unwrap();
        let mut tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("the handshake");
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(crate::support::HANG, async {
            while let Ok(n) = tls.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "a TLS client without a preface kept its connection"
        );
    }

    // Asked for with files that are not there: the start fails, naming them.
    let out = std::process::Command::new(crate::support::binary())
        .arg("envoy-ratelimit")
        .env("REDIS_URL", redis.addr().to_string())
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", "/nonexistent/cert.pem")
        .env("GRPC_SERVER_TLS_KEY", "/nonexistent/key.pem")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/cert.pem"), "{stderr}");
}

/// The reference counts every descriptor a request names, whether or not another is over its
/// limit; with `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`, all or nothing.
#[tokio::test]
async fn every_descriptor_counts_on_its_own_unless_told_otherwise() {
    let redis = RedisServer::start();
    for (stop, left_after_denial) in [(None, [48, 47]), (Some("true"), [49, 49])] {
        let env: Vec<(&str, &str)> = stop
            .map(|s| ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", s))
            .into_iter()
            .chain([(
                "CACHE_KEY_PREFIX",
                if stop.is_some() { "stop" } else { "count" },
            )])
            .collect();
        let server = start(&redis, &env);
        // The sequence stays in one minute's window (the windows are aligned to the epoch).
        let into = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 60_000;
        if into > 55_000 {
            tokio::time::sleep(std::time::Duration::from_millis(60_100 - into as u64)).await;
        }
        let mut rls = server.grpc_client().await;
        let ask = |descriptors| RateLimitRequest {
            domain: "reference".into(),
            descriptors,
            hits_addend: 0,
        };
        // Alone: counted.
        let r = rls
            .should_rate_limit(ask(vec![descriptor(&[("minutely", "c")])]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.statuses[0].limit_remaining, 49);
        // With a descriptor over its limit (hourly's second) or blocked, it still counts,
        // as the reference increments every descriptor; all or nothing, it does not.
        call(&server, "hourly", "c").await.1.unwrap();
        for (i, other) in [("hourly", "c"), ("blocked", "c")].into_iter().enumerate() {
            let r = rls
                .should_rate_limit(ask(vec![
                    descriptor(&[other]),
                    descriptor(&[("minutely", "c")]),
                ]))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
            assert_eq!(r.statuses[0].code, Code::OverLimit as i32, "{r:?}");
            assert_eq!(
                r.statuses[1].limit_remaining, left_after_denial[i],
                "{stop:?} {other:?}: {r:?}"
            );
        }
        // Each request is one decision, however many descriptors it counted.
        let (_, metrics) = server.get_text("/metrics").await;
        for (labels, n) in [
            (r#"reason="ok",allowed="true""#, 2),
            (r#"reason="rate_limited",allowed="false""#, 2),
        ] {
            let line =
                format!("tollgate_decisions_total{{policy=\"envoy:reference\",{labels}}} {n}");
            assert!(
                metrics.lines().any(|l| l == line),
                "{stop:?}: {line} in {metrics}"
            );
        }
    }
}

/// A descriptor's `hits_addend` past what a count holds (2^52 and more) is over its limit, as
/// every count past the limit is: it was answered OK, nothing recorded.
#[tokio::test]
async fn hits_past_what_a_count_holds_are_over_the_limit() {
    let redis = RedisServer::start();
    let server = start(&redis, &[("CACHE_KEY_PREFIX", "huge")]);
    let mut rls = server.grpc_client().await;
    for hits in [50, 51, 1 << 52, u64::MAX] {
        let mut ask = descriptor(&[("minutely", "huge")]);
        ask.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
        let r = rls
            .should_rate_limit(RateLimitRequest {
                domain: "reference".into(),
                descriptors: vec![ask],
                hits_addend: 0,
            })
            .await
            .unwrap()
            .into_inner();
        // 50 a minute: 50 hits fit, 51 do not, whatever came before.
        assert_eq!(
            (
                r.overall_code == Code::OverLimit as i32,
                r.statuses[0].limit_remaining
            ),
            (hits > 50, 0),
            "{hits} hits: {r:?}"
        );
    }
}

/// `quota_mode` as the reference: a quota descriptor over its limit is OVER_LIMIT in its status,
/// but the request is over only when every quota descriptor of it is (or another one is).
#[tokio::test]
async fn quota_mode_makes_a_request_over_only_when_every_quota_is() {
    let redis = RedisServer::start();
    let server = start(&redis, &[]);
    let rls = server.grpc_client().await;
    let ask = |entries: Vec<(&'static str, &'static str)>| {
        let request = RateLimitRequest {
            domain: "reference".into(),
            descriptors: entries.iter().map(|e| descriptor(&[*e])).collect(),
            hits_addend: 0,
        };
        let mut rls = rls.clone();
        async move { rls.should_rate_limit(request).await.unwrap().into_inner() }
    };
    let codes = |r: &RateLimitResponse| -> Vec<i32> { r.statuses.iter().map(|s| s.code).collect() };
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    // quota_a used up.
    assert_eq!(ask(vec![("quota_a", "x")]).await.overall_code, ok);
    let r = ask(vec![("quota_a", "x")]).await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (over, vec![over]),
        "every quota is over"
    );
    // One quota over, another not: OK, each status as it is.
    let r = ask(vec![("quota_a", "x"), ("quota_b", "x")]).await;
    assert_eq!((r.overall_code, codes(&r)), (ok, vec![over, ok]), "{r:?}");
    // Then both over: over.
    let r = ask(vec![("quota_a", "x"), ("quota_b", "x")]).await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (over, vec![over, over]),
        "{r:?}"
    );
    // A regular descriptor over its limit makes the request over whatever the quotas say.
    call(&server, "hourly", "q").await.1.unwrap();
    let r = ask(vec![("hourly", "q"), ("quota_b", "y")]).await;
    assert_eq!((r.overall_code, codes(&r)), (over, vec![over, ok]), "{r:?}");
}

/// `RESPONSE_DYNAMIC_METADATA=true`: answers carry the domain, each descriptor's entries (and
/// its own hits_addend), and the YAML `metadata` of the descriptors that passed.
#[tokio::test]
async fn dynamic_metadata_as_the_reference_answers_it() {
    use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
    let redis = RedisServer::start();
    let server = start(&redis, &[("RESPONSE_DYNAMIC_METADATA", "true")]);
    let mut rls = server.grpc_client().await;
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    let object = |fields: Vec<(&str, Value)>| Value {
        kind: Some(Kind::StructValue(Struct {
            fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        })),
    };
    let list = |values: Vec<Value>| Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    };
    let mut with_addend = descriptor(&[("key1", "m")]);
    with_addend.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 2 });
    let request = RateLimitRequest {
        domain: "reference".into(),
        descriptors: vec![descriptor(&[("quota_a", "m")]), with_addend],
        hits_addend: 0,
    };
    let expected = |with_metadata: bool| {
        let mut fields = vec![
            ("domain", string("reference")),
            (
                "descriptors",
                list(vec![
                    object(vec![("entries", list(vec![string("quota_a=m")]))]),
                    object(vec![
                        ("entries", list(vec![string("key1=m")])),
                        (
                            "hitsAddend",
                            Value {
                                kind: Some(Kind::NumberValue(2.0)),
                            },
                        ),
                    ]),
                ]),
            ),
        ];
        if with_metadata {
            fields.push((
                "metadata",
                object(vec![("plan", object(vec![("name", string("gold"))]))]),
            ));
        }
        Struct {
            fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        }
    };
    let first = rls
        .should_rate_limit(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.dynamic_metadata, Some(expected(true)));
    // Over its limit, quota_a's metadata is left out.
    let second = rls.should_rate_limit(request).await.unwrap().into_inner();
    assert_eq!(second.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(second.dynamic_metadata, Some(expected(false)));
}
