//! Fuzzed inputs through the server's real entry points, in process: the TOML loader, the
//! HTTP router (`tower::ServiceExt::oneshot`) and the Envoy service's `ShouldRateLimit`.
//! Nothing may panic; every HTTP answer is below 500 with a JSON body; every gRPC answer is a
//! response or a proper status.
//!
//! Cases per property: `PROPTEST_CASES` (64 when unset); `scripts/fuzz` runs many more.

use std::sync::LazyLock;

use axum::{
    body::Body,
    http::{Method, Request, header},
};
use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{
            RateLimitDescriptor,
            rate_limit_descriptor::{Entry, RateLimitOverride},
        },
        service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code},
    },
    google::protobuf::UInt64Value,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use tollgated::{Config, InProcess};
use tower::ServiceExt as _;

/// `PROPTEST_CASES` when set, else a count small enough for every CI run.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 64;
    }
    config
}

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
});

const ADMIN: &str = "fuzz-admin-token";

const CONFIG: &str = r#"
[policies.sms]
limiters = [
  { by = "ip", rules = ["1/1m", "10/1h"], blocklist = { ban = "10m", escalate = 2, max = "1d" } },
  { by = "user_id", rules = ["20/1d"], message = "daily limit" },
]
bypass = { ips = ["10.0.0.0/8", "2001:db8::/32"], user_ids = ["admin"] }

[policies.keys]
limiters = [{ by = "header:x-api-key", rules = ["5/1s", "100/1h"], algorithm = "fixed_window" }]

[policies.phone]
limiters = [{ by = "arg:phone", rules = ["2/1s"], algorithm = "gcra", blocklist = "1m" }]

[policies.names]
limiters = [{ by = "user_name", rules = ["3/1m"] }, { by = "global", rules = ["18446744073709551615/366d"], algorithm = "fixed_window" }]

[policies.dup_args]
limiters = [{ by = "global", rules = ["1000000/1s"] }]
duplicate = { by = "args", ttl = "5s" }

[policies.dup_key]
limiters = [{ by = "global", rules = ["1000000/1s"] }]
duplicate = { by = "key", ttl = "1m" }

[policies.dup_user]
limiters = [{ by = "user_id", rules = ["1000000/1s"] }]
duplicate = { by = "user_id", ttl = "1s", global = true }

[[envoy.domains]]
name = "edge"
descriptors = [
  { key = "remote_address", rules = ["2/1m", "100/1h"] },
  { key = "path", rules = ["100/1m"], algorithm = "sliding_log" },
  { key = "path", value = "/login", rules = ["1/1m"], algorithm = "gcra" },
  { key = "shadowed", rules = ["1/1m"], shadow = true },
  { key = "tenant", descriptors = [
      { key = "plan", value = "free", rules = ["1/1m"] },
      { key = "plan", rules = ["3/30s", "18446744073709551615/366d"], algorithm = "fixed_window" },
  ] },
]
"#;

const POLICIES: [&str; 7] = [
    "sms", "keys", "phone", "names", "dup_args", "dup_key", "dup_user",
];

/// One server for every case of a property: state (counters, bans, leases) carries over
/// from case to case, so later cases meet limited, banned and locked identities.
static SERVER: LazyLock<InProcess> = LazyLock::new(|| {
    let config = Config::parse("fuzz.toml", CONFIG).unwrap();
    // First touched inside `block_on`, where blocking again is not allowed: build on a
    // thread of its own.
    std::thread::spawn(|| RUNTIME.block_on(InProcess::new(config, Some(ADMIN.to_owned()))))
        .join()
        .unwrap()
        .unwrap()
});

// ---------------------------------------------------------------------------------------
// JSON and text strategies

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9_]{0,8}",
        2 => "\\PC{0,16}",
        1 => any::<String>(),
        1 => "[a-z]{200,300}",
        1 => Just(String::new()),
    ]
}

fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1m".to_owned()),
        Just("0s".to_owned()),
        Just("18446744073709551615ms".to_owned()),
        Just("18446744073709551615d".to_owned()),
        Just("213503982334601d".to_owned()),
        Just("584942417355y".to_owned()),
        Just("99999999999999999999s".to_owned()),
        Just("366d".to_owned()),
        Just("100000d".to_owned()),
        (
            any::<u64>(),
            prop::sample::select(vec!["ms", "s", "m", "h", "d"])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        (
            0u64..1_000_000,
            prop::sample::select(vec!["ms", "s", "m", "h", "d", "", "x"])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        text(),
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(0)),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        (0u64..4).prop_map(Value::from),
    ]
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        number(),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn ip_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|b| Value::from(std::net::IpAddr::from(b).to_string())),
        any::<[u8; 16]>().prop_map(|b| Value::from(std::net::IpAddr::from(b).to_string())),
        Just(Value::from("10.1.2.3")),
        Just(Value::from("::ffff:10.1.2.3")),
        Just(Value::from("2001:db8::1")),
        Just(Value::from("198.51.100.7")),
        json_value(),
    ]
}

fn string_map() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => prop::collection::btree_map(
            prop_oneof![Just("x-api-key".to_owned()), Just("X-API-KEY".to_owned()), Just("phone".to_owned()), Just("idempotency-key".to_owned()), text()],
            text().prop_map(Value::from),
            0..4,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect())),
        1 => json_value(),
    ]
}

/// An identity object: usually well formed with odd values, sometimes of the wrong shape.
fn identity() -> BoxedStrategy<Value> {
    let field = |s: BoxedStrategy<Value>| prop::option::weighted(0.6, s);
    prop_oneof![
        6 => (
            field(ip_value().boxed()),
            field(prop_oneof![Just(Value::from("42")), Just(Value::from("admin")), text().prop_map(Value::from), json_value()].boxed()),
            field(prop_oneof![Just(Value::from("alice")), text().prop_map(Value::from)].boxed()),
            field(string_map().boxed()),
            field(string_map().boxed()),
            prop::option::weighted(0.1, (text(), json_value())),
        )
            .prop_map(|(ip, user_id, user_name, headers, args, extra)| {
                let mut o = serde_json::Map::new();
                for (k, v) in [("ip", ip), ("user_id", user_id), ("user_name", user_name), ("headers", headers), ("args", args)] {
                    if let Some(v) = v {
                        o.insert(k.to_owned(), v);
                    }
                }
                if let Some((k, v)) = extra {
                    o.insert(k, v);
                }
                Value::Object(o)
            }),
        1 => json_value(),
    ]
    .boxed()
}

fn policy_name() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => prop::sample::select(POLICIES.to_vec()).prop_map(Value::from),
        1 => text().prop_map(Value::from),
        1 => json_value(),
    ]
}

/// A lease: the last one acquired (`$lease`), a mangled one, or junk.
fn lease() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => Just(Value::from("$lease")),
        1 => Just(Value::from("0123456789abcdef0123456789abcdef.tg:{d:x:args:y}")),
        1 => "[0-9a-f]{32}\\.\\PC{0,20}".prop_map(Value::from),
        1 => text().prop_map(Value::from),
        1 => json_value(),
    ]
}

fn object(fields: Vec<(&'static str, Option<Value>)>, extra: Option<(String, Value)>) -> Value {
    let mut o = serde_json::Map::new();
    for (k, v) in fields {
        if let Some(v) = v {
            o.insert(k.to_owned(), v);
        }
    }
    if let Some((k, v)) = extra {
        o.insert(k, v);
    }
    Value::Object(o)
}

// ---------------------------------------------------------------------------------------
// HTTP operations

#[derive(Clone, Debug)]
enum Auth {
    None,
    Admin,
    Other(String),
}

#[derive(Clone, Debug)]
enum Op {
    /// A JSON body to an endpoint.
    Json {
        method: Method,
        path: String,
        body: Value,
        auth: Auth,
    },
    /// Raw bytes with an arbitrary content type.
    Raw {
        method: Method,
        path: String,
        content_type: Option<String>,
        body: Vec<u8>,
        auth: Auth,
    },
}

fn auth() -> impl Strategy<Value = Auth> {
    prop_oneof![
        3 => Just(Auth::Admin),
        2 => Just(Auth::None),
        1 => prop_oneof![
            Just("Bearer ".to_owned()),
            Just(format!("bearer {ADMIN}")),
            Just(format!("Bearer  {ADMIN} ")),
            Just(format!("Basic {ADMIN}")),
            Just(format!("Bearer {ADMIN}x")),
            "[ -~]{0,40}",
        ]
        .prop_map(Auth::Other),
    ]
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        8 => Just(Method::POST),
        2 => Just(Method::GET),
        1 => Just(Method::DELETE),
        1 => Just(Method::PUT),
        1 => Just(Method::HEAD),
        1 => Just(Method::OPTIONS),
        1 => Just(Method::PATCH),
    ]
}

/// Percent-encodes every byte outside the unreserved set, so any text fits in a path segment.
fn encode_segment(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn endpoint() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/v1/check".to_owned()),
        Just("/v1/peek".to_owned()),
        Just("/v1/reset".to_owned()),
        Just("/v1/duplicate/acquire".to_owned()),
        Just("/v1/duplicate/complete".to_owned()),
        Just("/v1/duplicate/release".to_owned()),
        Just("/v1/blocklist".to_owned()),
        Just("/healthz".to_owned()),
        Just("/readyz".to_owned()),
        Just("/metrics".to_owned()),
        (
            prop_oneof![Just("ip".to_owned()), Just("user_id".to_owned()), text()],
            prop_oneof![
                ip_value().prop_map(|v| v.as_str().unwrap_or("x").to_owned()),
                text()
            ],
        )
            .prop_map(|(k, v)| format!(
                "/v1/blocklist/{}/{}",
                encode_segment(&k),
                encode_segment(&v)
            )),
        "(/[a-zA-Z0-9%._~{}-]{0,12}){0,4}",
    ]
}

/// Structured, mostly well-formed requests for each endpoint.
fn api_op() -> BoxedStrategy<Op> {
    let extra = || prop::option::weighted(0.05, (text(), json_value()));
    let check = (
        prop::sample::select(vec!["/v1/check", "/v1/peek", "/v1/check"]),
        prop::option::weighted(0.95, policy_name()),
        prop::option::weighted(0.9, identity()),
        prop::option::weighted(0.3, number()),
        extra(),
    )
        .prop_map(|(path, policy, identity, cost, extra)| {
            (
                path.to_owned(),
                object(
                    vec![("policy", policy), ("identity", identity), ("cost", cost)],
                    extra,
                ),
            )
        });
    let reset = (policy_name(), identity(), extra()).prop_map(|(p, i, extra)| {
        (
            "/v1/reset".to_owned(),
            object(vec![("policy", Some(p)), ("identity", Some(i))], extra),
        )
    });
    let acquire = (
        prop_oneof![3 => prop::sample::select(vec!["dup_args", "dup_key", "dup_user"]).prop_map(Value::from), 1 => policy_name()],
        identity(),
        prop::option::of(json_value()),
        extra(),
    )
        .prop_map(|(p, i, args, extra)| {
            ("/v1/duplicate/acquire".to_owned(), object(vec![("policy", Some(p)), ("identity", Some(i)), ("args", args)], extra))
        });
    let complete = (
        lease(),
        prop::option::of(json_value()),
        prop::option::of(prop_oneof![
            duration_text().prop_map(Value::from),
            json_value()
        ]),
        extra(),
    )
        .prop_map(|(lease, response, keep_for, extra)| {
            (
                "/v1/duplicate/complete".to_owned(),
                object(
                    vec![
                        ("lease", Some(lease)),
                        ("response", response),
                        ("keep_for", keep_for),
                    ],
                    extra,
                ),
            )
        });
    let release = (lease(), extra()).prop_map(|(lease, extra)| {
        (
            "/v1/duplicate/release".to_owned(),
            object(vec![("lease", Some(lease))], extra),
        )
    });
    let ban = (
        prop_oneof![
            Just(Value::from("ip")),
            Just(Value::from("user_id")),
            text().prop_map(Value::from),
            json_value()
        ],
        prop_oneof![ip_value(), text().prop_map(Value::from)],
        prop_oneof![duration_text().prop_map(Value::from), json_value()],
        extra(),
    )
        .prop_map(|(kind, value, duration, extra)| {
            (
                "/v1/blocklist".to_owned(),
                object(
                    vec![
                        ("kind", Some(kind)),
                        ("value", Some(value)),
                        ("duration", Some(duration)),
                    ],
                    extra,
                ),
            )
        });
    (
        prop_oneof![4 => check.boxed(), 1 => reset.boxed(), 3 => acquire.boxed(), 2 => complete.boxed(), 1 => release.boxed(), 2 => ban.boxed()],
        prop_oneof![9 => Just(Method::POST), 1 => method()],
        auth(),
    )
        .prop_map(|((path, body), method, auth)| Op::Json { method, path, body, auth })
        .boxed()
}

/// Bytes that are nearly JSON, or deeply nested, or not JSON at all.
fn raw_body() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        json_value().prop_map(|v| v.to_string().into_bytes()),
        (json_value(), any::<usize>(), any::<u8>()).prop_map(|(v, at, b)| {
            // One byte changed or cut off.
            let mut bytes = v.to_string().into_bytes();
            if !bytes.is_empty() {
                let at = at % bytes.len();
                if b % 2 == 0 {
                    bytes[at] = b
                } else {
                    bytes.truncate(at)
                }
            }
            bytes
        }),
        (1usize..20_000).prop_map(|depth| {
            let mut s = "[".repeat(depth);
            s.push_str(&"]".repeat(depth));
            s.into_bytes()
        }),
        (1usize..5_000).prop_map(|depth| {
            format!(
                "{{\"policy\":\"sms\",\"identity\":{{\"args\":{}}}}}",
                "{\"a\":".repeat(depth)
            )
            .into_bytes()
        }),
        Just(br#"{"policy":"sms","identity":{"ip":"1.2.3.4"},"cost":1e400}"#.to_vec()),
        Just(br#"{"policy":"sms","policy":"keys"}"#.to_vec()),
        Just(b"\xef\xbb\xbf{\"policy\":\"sms\"}".to_vec()),
    ]
    .boxed()
}

fn raw_op() -> BoxedStrategy<Op> {
    (
        method(),
        endpoint(),
        prop_oneof![
            4 => Just(Some("application/json".to_owned())),
            1 => Just(None),
            1 => Just(Some("application/json; charset=latin1".to_owned())),
            1 => Just(Some("application/vnd.api+json".to_owned())),
            1 => Just(Some("text/plain".to_owned())),
            1 => "[ -~]{0,30}".prop_map(Some),
        ],
        raw_body(),
        auth(),
    )
        .prop_map(|(method, path, content_type, body, auth)| Op::Raw {
            method,
            path,
            content_type,
            body,
            auth,
        })
        .boxed()
}

/// Sends `op` through the router; checks the answer; returns its status and body.
async fn send(op: &Op, lease: &Option<String>) -> (u16, Value) {
    let (method, path, content_type, body, auth) = match op {
        Op::Json {
            method,
            path,
            body,
            auth,
        } => {
            let mut body = body.clone();
            if let (Some(lease), Some(slot)) = (lease, body.get_mut("lease")) {
                if slot == "$lease" {
                    *slot = Value::from(lease.clone());
                }
            }
            (
                method,
                path,
                Some("application/json".to_owned()),
                body.to_string().into_bytes(),
                auth,
            )
        }
        Op::Raw {
            method,
            path,
            content_type,
            body,
            auth,
        } => (method, path, content_type.clone(), body.clone(), auth),
    };
    let mut request = Request::builder().method(method.clone()).uri(path.as_str());
    if let Some(ct) = content_type {
        request = request.header(header::CONTENT_TYPE, ct);
    }
    match auth {
        Auth::None => {}
        Auth::Admin => request = request.header(header::AUTHORIZATION, format!("Bearer {ADMIN}")),
        Auth::Other(value) => request = request.header(header::AUTHORIZATION, value),
    }
    let Ok(request) = request.body(Body::from(body)) else {
        // Not a request a client could send (a path that is no URI): nothing to test.
        return (0, Value::Null);
    };
    let response = SERVER.router().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let head = method == Method::HEAD;
    let is_metrics = path.split('?').next() == Some("/metrics") && *method == Method::GET;
    // The dashboard's page and assets are HTML, CSS and JavaScript; every error is JSON.
    let is_page = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/") || t.contains("javascript"));
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(
        status < 500,
        "{op:?} -> {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    if head || ((is_metrics || is_page) && status == 200) {
        return (status, Value::Null);
    }
    let body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{op:?} -> {status}: not JSON ({e}): {:?}",
            String::from_utf8_lossy(&bytes)
        )
    });
    if status >= 400 {
        crate::support::assert_problem(&body, status);
    }
    (status, body)
}

async fn run(ops: &[Op]) {
    let mut lease: Option<String> = None;
    for op in ops {
        let (status, body) = send(op, &lease).await;
        if status == 200 {
            if let Some(l) = body.get("lease").and_then(Value::as_str) {
                lease = Some(l.to_owned());
            }
            if let Op::Json { path, .. } = op {
                if path == "/v1/check" || path == "/v1/peek" {
                    assert!(body["allowed"].is_boolean(), "{op:?} -> {body}");
                    assert!(body["rules"].is_array(), "{op:?} -> {body}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn http_api_answers_structured_requests_below_500_with_json(ops in prop::collection::vec(api_op(), 1..8)) {
        RUNTIME.block_on(run(&ops));
    }

    #[test]
    fn http_api_answers_arbitrary_bytes_below_500_with_json(ops in prop::collection::vec(prop_oneof![raw_op(), api_op()], 1..6)) {
        RUNTIME.block_on(run(&ops));
    }
}

// ---------------------------------------------------------------------------------------
// Envoy ShouldRateLimit

fn entry() -> impl Strategy<Value = Entry> {
    (
        prop_oneof![
            4 => prop::sample::select(vec!["remote_address", "path", "shadowed", "tenant", "plan"]).prop_map(str::to_owned),
            1 => text(),
        ],
        prop_oneof![
            3 => prop::sample::select(vec!["/login", "free", "pro", "1.2.3.4", ""]).prop_map(str::to_owned),
            2 => text(),
        ],
    )
        .prop_map(|(key, value)| Entry { key, value })
}

fn descriptor() -> BoxedStrategy<RateLimitDescriptor> {
    (
        prop::collection::vec(entry(), 0..4),
        prop::option::weighted(
            0.2,
            (
                prop_oneof![any::<u32>(), 0u32..3, Just(u32::MAX)],
                prop_oneof![0i32..8, any::<i32>()],
            )
                .prop_map(|(requests_per_unit, unit)| RateLimitOverride {
                    requests_per_unit,
                    unit,
                }),
        ),
        prop::option::weighted(
            0.3,
            prop_oneof![
                Just(0u64),
                Just(1),
                Just(u64::MAX),
                Just(u64::from(u32::MAX)),
                any::<u64>(),
                0u64..5
            ]
            .prop_map(|value| UInt64Value { value }),
        ),
    )
        .prop_map(|(entries, limit, hits_addend)| RateLimitDescriptor {
            entries,
            limit,
            hits_addend,
        })
        .boxed()
}

fn rate_limit_request() -> impl Strategy<Value = RateLimitRequest> {
    (
        prop_oneof![6 => Just("edge".to_owned()), 1 => Just(String::new()), 1 => text()],
        prop::collection::vec(descriptor(), 0..5),
        prop_oneof![Just(0u32), Just(1), Just(u32::MAX), any::<u32>(), 0u32..4],
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn envoy_requests_get_a_response_or_a_proper_status(requests in prop::collection::vec(rate_limit_request(), 1..6)) {
        RUNTIME.block_on(async {
            for request in requests {
                let described = format!("{request:?}");
                let empty = request.domain.is_empty() || request.descriptors.is_empty();
                let count = request.descriptors.len();
                match SERVER.should_rate_limit(request).await {
                    Ok(response) => {
                        assert!(!empty, "{described}");
                        assert_eq!(response.statuses.len(), count, "{described}");
                        let overall = Code::try_from(response.overall_code).unwrap();
                        assert!(matches!(overall, Code::Ok | Code::OverLimit), "{described}");
                        let over = response.statuses.iter().any(|s| s.code == Code::OverLimit as i32);
                        assert_eq!(over, overall == Code::OverLimit, "{described}");
                    }
                    Err(status) => {
                        assert!(empty, "{described}: {status:?}");
                        assert_eq!(status.code(), tonic::Code::InvalidArgument);
                        assert!(!status.message().is_empty());
                    }
                }
            }
        });
    }
}

// ---------------------------------------------------------------------------------------
// The TOML loader

/// `text` as a TOML basic string.
fn q(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Values for any field: right and wrong types, huge and odd numbers, odd durations.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        duration_text().prop_map(|d| q(&d)),
        Just("18446744073709551615".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("-9223372036854775808".to_owned()),
        Just("99999999999999999999999".to_owned()),
        Just("1e400".to_owned()),
        Just("nan".to_owned()),
        Just("-inf".to_owned()),
        Just("4294967295".to_owned()),
        Just("4294967296".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("true".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just("1979-05-27T07:32:00Z".to_owned()),
        Just("\"\"".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        text().prop_map(|t| q(&t)),
    ]
}

fn rule_text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec!["1/1m", "10/1h", "60/1d", "5/500ms", "10/m", "1/1ms", "18446744073709551615/366d", "1/366d", "4294967296/1s"]).prop_map(str::to_owned),
        1 => (any::<u64>(), duration_text()).prop_map(|(n, d)| format!("{n}/{d}")),
        1 => text(),
    ]
}

/// Durations: usually valid (up to the longest allowed), sometimes not.
fn some_duration() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (1u64..10_000, prop::sample::select(vec!["ms", "s", "m", "h", "d"])).prop_map(|(n, u)| format!("{n}{u}")),
        2 => prop::sample::select(vec!["1ms", "366d", "3650d", "87600h", "315360000000ms"]).prop_map(str::to_owned),
        1 => duration_text(),
    ]
}

/// Mostly `valid`, sometimes any TOML value.
fn or_odd(valid: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    prop_oneof![9 => valid, 1 => toml_value()]
}

/// A field line `name = value` that is present 30% of the time.
fn field(
    name: &'static str,
    value: impl Strategy<Value = String>,
) -> impl Strategy<Value = String> {
    prop::option::weighted(0.3, value)
        .prop_map(move |v| v.map(|v| format!("{name} = {v}\n")).unwrap_or_default())
}

/// One limiter table, usually valid with edge values.
fn limiter_table() -> BoxedStrategy<String> {
    (
        prop_oneof![
            9 => prop::sample::select(vec!["ip", "user_id", "user_name", "global", "header:x-api-key", "arg:phone"]).prop_map(str::to_owned),
            1 => text(),
        ],
        prop::collection::vec(rule_text(), 1..4),
        prop::option::weighted(0.3, prop::sample::select(vec!["sliding_log", "fixed_window", "gcra", "gcra", "leaky"])),
        prop::option::weighted(
            0.5,
            prop_oneof![
                2 => some_duration().prop_map(|d| q(&d)),
                2 => (some_duration(), prop::option::of(prop_oneof![Just(0u64), Just(1), Just(2), Just(u64::from(u32::MAX)), Just(u64::from(u32::MAX) + 1), 1u64..10]), prop::option::weighted(0.5, some_duration()))
                    .prop_map(|(ban, esc, max)| {
                        let mut t = format!("{{ ban = {}", q(&ban));
                        if let Some(e) = esc { t.push_str(&format!(", escalate = {e}")); }
                        if let Some(m) = max { t.push_str(&format!(", max = {}", q(&m))); }
                        t.push_str(" }");
                        t
                    }),
                1 => toml_value(),
            ],
        ),
        prop::option::weighted(0.05, (prop::sample::select(vec!["name", "message", "colour", "by", "rules"]), toml_value())),
        prop::option::weighted(0.2, text().prop_map(|t| q(&t))),
    )
        .prop_map(|(by, rules, algorithm, blocklist, extra, message)| {
            let rules: Vec<String> = rules.iter().map(|r| q(r)).collect();
            let mut t = format!("{{ by = {}, rules = [{}]", q(&by), rules.join(", "));
            if let Some(a) = algorithm { t.push_str(&format!(", algorithm = {}", q(a))); }
            if let Some(b) = blocklist { t.push_str(&format!(", blocklist = {b}")); }
            if let Some(m) = message { t.push_str(&format!(", message = {m}")); }
            if let Some((k, v)) = extra { t.push_str(&format!(", {k} = {v}")); }
            t.push_str(" }");
            t
        })
        .boxed()
}

/// A whole configuration file: usually valid with edge values, sometimes odd in one place.
fn config_text() -> BoxedStrategy<String> {
    let server = (
        field("http", or_odd(Just("\"127.0.0.1:0\"".to_owned()))),
        field(
            "grpc",
            or_odd(prop_oneof![
                Just("\"[::1]:0\"".to_owned()),
                Just("\"1.2.3.4:99999\"".to_owned())
            ]),
        ),
        field(
            "admin_token_env",
            or_odd(Just("\"TG_FUZZ_TOKEN\"".to_owned())),
        ),
        prop::option::weighted(0.03, toml_value().prop_map(|v| format!("workers = {v}\n"))),
    )
        .prop_map(|(a, b, c, d)| format!("[server]\n{a}{b}{c}{}", d.unwrap_or_default()));
    let store = (
        field("url", or_odd(Just("\"memory://\"".to_owned()))),
        field(
            "on_error",
            or_odd(
                prop::sample::select(vec!["\"allow\"", "\"deny\"", "\"local\""])
                    .prop_map(str::to_owned),
            ),
        ),
        field("timeout", or_odd(some_duration().prop_map(|d| q(&d)))),
        field("prefix", or_odd(text().prop_map(|t| q(&t)))),
        prop::option::weighted(0.03, toml_value().prop_map(|v| format!("pool = {v}\n"))),
    )
        .prop_map(|(a, b, c, d, e)| format!("[store]\n{a}{b}{c}{d}{}", e.unwrap_or_default()));
    let policy = (
        prop_oneof![9 => "[a-z_.-]{1,8}", 1 => "[a-z_.-]{60,70}", 1 => text()],
        prop::collection::vec(limiter_table(), 1..3),
        prop::option::weighted(
            0.2,
            prop_oneof![
                Just("{ ips = [\"10.0.0.0/8\", \"::/0\"], user_ids = [\"admin\"] }".to_owned()),
                Just("{ ips = [\"10.0.0.0/33\"] }".to_owned()),
                Just("{ ips = [\"1.2.3.4/0\", \"::1/128\", \"::1/129\"] }".to_owned()),
                toml_value(),
            ],
        ),
        prop::option::weighted(
            0.3,
            (
                prop::sample::select(vec![
                    "args",
                    "key",
                    "ip",
                    "user_id",
                    "user_name",
                    "arg:x",
                    "global",
                    "header:",
                    "nope",
                ]),
                prop::option::of(some_duration()),
                any::<bool>(),
            )
                .prop_map(|(by, ttl, global)| {
                    let mut t = format!("{{ by = {}, global = {global}", q(by));
                    if let Some(ttl) = ttl {
                        t.push_str(&format!(", ttl = {}", q(&ttl)));
                    }
                    t.push_str(" }");
                    t
                }),
        ),
        prop::option::weighted(
            0.1,
            prop::sample::select(vec!["\"allow\"", "\"deny\"", "\"local\"", "\"maybe\"", "1"]),
        ),
    );
    let domain = (
        prop_oneof![9 => Just("edge".to_owned()), 1 => text()],
        prop::collection::vec(
            (
                prop_oneof![4 => Just("remote_address".to_owned()), 4 => Just("path".to_owned()), 1 => text()],
                prop::option::weighted(0.3, text()),
                prop::collection::vec(rule_text(), 0..3),
                any::<bool>(),
                prop::option::weighted(0.2, (Just("plan".to_owned()), rule_text())),
            ),
            1..4,
        ),
    );
    (
        prop::option::weighted(0.3, server),
        prop::option::weighted(0.5, store),
        prop::collection::vec(policy.boxed(), 0..3),
        prop::collection::vec(domain.boxed(), 0..2),
    )
        .prop_map(|(server, store, policies, domains)| {
            let mut t = server.unwrap_or_default();
            t.push_str(&store.unwrap_or_default());
            for (name, limiters, bypass, duplicate, on_error) in policies {
                t.push_str(&format!("[policies.{}]\nlimiters = [\n", q(&name)));
                for l in limiters {
                    t.push_str(&format!("  {l},\n"));
                }
                t.push_str("]\n");
                if let Some(b) = bypass {
                    t.push_str(&format!("bypass = {b}\n"));
                }
                if let Some(d) = duplicate {
                    t.push_str(&format!("duplicate = {d}\n"));
                }
                if let Some(o) = on_error {
                    t.push_str(&format!("on_error = {o}\n"));
                }
            }
            for (name, descriptors) in domains {
                t.push_str(&format!(
                    "[[envoy.domains]]\nname = {}\ndescriptors = [\n",
                    q(&name)
                ));
                for (key, value, rules, shadow, child) in descriptors {
                    let rules: Vec<String> = rules.iter().map(|r| q(r)).collect();
                    t.push_str(&format!(
                        "  {{ key = {}, rules = [{}], shadow = {shadow}",
                        q(&key),
                        rules.join(", ")
                    ));
                    if let Some(v) = value {
                        t.push_str(&format!(", value = {}", q(&v)));
                    }
                    if let Some((k, r)) = child {
                        t.push_str(&format!(
                            ", descriptors = [{{ key = {}, rules = [{}] }}]",
                            q(&k),
                            q(&r)
                        ));
                    }
                    t.push_str(" },\n");
                }
                t.push_str("]\n");
            }
            t
        })
        .boxed()
}

/// Parses `text`; an error must name the file and a line or a field.
fn parse(text: &str) -> Option<Config> {
    match Config::parse("fuzz.toml", text) {
        Ok(config) => Some(config),
        Err(e) => {
            assert_eq!(e.file(), "fuzz.toml");
            assert!(!e.message().is_empty(), "{text}\n{e}");
            assert!(
                e.line().is_some() || !e.field().is_empty(),
                "no line or field: {e}\n{text}"
            );
            if let Some(line) = e.line() {
                assert!(
                    line >= 1 && line <= text.lines().count().max(1) + 1,
                    "line {line} of {text:?}: {e}"
                );
            }
            assert!(e.to_string().starts_with("fuzz.toml"), "{e}");
            None
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_loader_never_panics_on_arbitrary_text(text in prop_oneof![
        any::<String>(),
        "\\PC{0,200}",
        prop::collection::vec(any::<u8>(), 0..300).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]) {
        let _ = parse(&text);
    }

    #[test]
    fn the_loader_never_panics_on_near_valid_configs(text in config_text()) {
        let _ = parse(&text);
    }

    /// What loads also serves: checks, Envoy requests and bans on it never panic.
    ///
    /// Costs stay small: a sliding log keeps one entry per admitted unit, so a cost near
    /// u64::MAX admitted by a limit near u64::MAX allocates without bound (huge costs are
    /// fuzzed against the algorithms directly, and through the HTTP API on small limits).
    #[test]
    fn loaded_configs_serve_without_panics(text in config_text(), ips in prop::collection::vec(any::<[u8; 4]>(), 1..4), cost in prop_oneof![Just(1u64), Just(0), 2u64..1000]) {
        let Some(config) = parse(&text) else { return Ok(()) };
        let policies: Vec<String> = config.policy_names().map(str::to_owned).collect();
        RUNTIME.block_on(async {
            // A store that cannot be opened (a Redis URL) is an error, not a panic.
            let Ok(server) = InProcess::new(config, Some(ADMIN.to_owned())).await else { return };
            for policy in &policies {
                // Twice each, so limits are reached and blocklists ban.
                for ip in ips.iter().chain(&ips) {
                    let body = json!({
                        "policy": policy,
                        "identity": { "ip": std::net::IpAddr::from(*ip).to_string(), "user_id": "u", "user_name": "n",
                                      "headers": { "x-api-key": "k" }, "args": { "phone": "1", "x": "2" } },
                        "cost": if ip == &ips[0] { cost } else { 1 },
                    });
                    for path in ["/v1/check", "/v1/peek", "/v1/check", "/v1/duplicate/acquire"] {
                        let request = Request::post(path)
                            .header(header::CONTENT_TYPE, "application/json")
                            .body(Body::from(body.to_string()))
                            .unwrap();
                        let response = server.router().oneshot(request).await.unwrap();
                        let status = response.status();
                        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
                        assert!(status.as_u16() < 500, "{text}\n{path} {body} -> {status}: {}", String::from_utf8_lossy(&bytes));
                    }
                }
            }
            for _ in 0..3 {
                let request = RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry { key: "remote_address".into(), value: "1.2.3.4".into() }],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: u32::try_from(cost).unwrap_or(u32::MAX),
                };
                server.should_rate_limit(request).await.unwrap();
            }
        });
    }

    /// An unknown field is named, with its line.
    #[test]
    fn unknown_fields_are_named_with_their_line(
        section in prop::sample::select(vec!["server", "store"]),
        name in "[a-z][a-z_]{0,12}",
        value in toml_value(),
        before in 0usize..3,
    ) {
        let known = ["http", "grpc", "admin_token_env", "url", "on_error", "timeout", "prefix", "tls_ca_file", "tls_cert_file", "tls_key_file"];
        prop_assume!(!known.contains(&name.as_str()));
        let mut text = format!("[{section}]\n");
        for i in 0..before {
            text.push_str(&format!("# comment {i}\n"));
        }
        text.push_str(&format!("{name} = {value}\n"));
        let e = Config::parse("fuzz.toml", &text).unwrap_err();
        prop_assert_eq!(e.line(), Some(2 + before), "{}", e);
        prop_assert_eq!(e.field(), format!("{section}.{name}"), "{}", e);
    }
}

// ---------------------------------------------------------------------------------------
// Regressions: inputs the properties above found

/// POSTs `body` to `path` with the admin token on a fresh server of `config`.
async fn post(server: &InProcess, path: &str, body: Value) -> (u16, Value) {
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = server.router().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

async fn fresh(config: &str) -> InProcess {
    let config = Config::parse("fuzz.toml", config).unwrap();
    InProcess::new(config, Some(ADMIN.to_owned()))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_ban_longer_than_the_store_clock_is_refused_not_a_panic() {
    let server = fresh("").await;
    for duration in ["18446744073709551615ms", "213503982334601d", "3651d"] {
        let (status, body) = post(
            &server,
            "/v1/blocklist",
            json!({ "kind": "ip", "value": "192.0.2.1", "duration": duration }),
        )
        .await;
        assert_eq!(status, 400, "{duration}: {body}");
        assert!(body["detail"].as_str().unwrap().contains("3650d"), "{body}");
    }
    let (status, body) = post(
        &server,
        "/v1/blocklist",
        json!({ "kind": "ip", "value": "192.0.2.1", "duration": "3650d" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn keeping_a_response_longer_than_the_store_clock_is_refused_not_a_panic() {
    let server = fresh(
        "[policies.p]\nlimiters = [{ by = \"global\", rules = [\"100/1s\"] }]\nduplicate = { by = \"args\" }\n",
    )
    .await;
    let (status, body) = post(
        &server,
        "/v1/duplicate/acquire",
        json!({ "policy": "p", "args": 1 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let lease = body["lease"].as_str().unwrap().to_owned();
    let (status, body) = post(
        &server,
        "/v1/duplicate/complete",
        json!({ "lease": lease, "keep_for": "18446744073709551615ms" }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // Past server.max_keep_for (1h by default): refused, naming the bound.
    let (status, body) = post(
        &server,
        "/v1/duplicate/complete",
        json!({ "lease": lease, "keep_for": "3650d" }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("server.max_keep_for"),
        "{body}"
    );
    let (status, body) = post(
        &server,
        "/v1/duplicate/complete",
        json!({ "lease": lease, "keep_for": "1h" }),
    )
    .await;
    assert_eq!((status, &body["completed"]), (200, &json!(true)), "{body}");
}

#[test]
fn configured_durations_longer_than_ten_years_are_errors_naming_the_field() {
    for (text, line, field) in [
        (
            "[store]\ntimeout = \"18446744073709551615ms\"\n",
            2,
            "store.timeout",
        ),
        (
            "[policies.p]\nlimiters = [{ by = \"global\", rules = [\"1/1s\"] }]\nduplicate = { by = \"args\", ttl = \"99999d\" }\n",
            3,
            "policies.p.duplicate.ttl",
        ),
        (
            "[policies.p]\nlimiters = [\n  { by = \"ip\", rules = [\"1/1s\"], blocklist = \"3651d\" },\n]\n",
            3,
            "policies.p.limiters[0].blocklist",
        ),
        (
            "[policies.p]\nlimiters = [\n  { by = \"ip\", rules = [\"1/1s\"], blocklist = { ban = \"1m\", escalate = 2, max = \"99999d\" } },\n]\n",
            3,
            "policies.p.limiters[0].blocklist.max",
        ),
    ] {
        let e = Config::parse("fuzz.toml", text).unwrap_err();
        assert_eq!((e.line(), e.field()), (Some(line), field), "{e}");
        assert!(e.message().contains("3650d"), "{e}");
    }
}

#[test]
fn a_huge_escalation_factor_bans_for_at_most_ten_years() {
    // The default cap, ban * escalate^4, would be ~2^128 days: past any store's clock.
    for ban in ["10m", "366d", "3650d"] {
        let text = format!(
            "[policies.p]\nlimiters = [{{ by = \"ip\", rules = [\"1/1m\"], blocklist = {{ ban = \"{ban}\", escalate = 4294967295 }} }}]\n"
        );
        let summary = Config::parse("fuzz.toml", &text).unwrap().summary();
        assert!(summary.contains("x4294967295 up to 3650d"), "{summary}");
    }
}

#[test]
fn serve_refuses_intervals_past_the_clock() {
    use clap::Parser as _;
    for flag in ["--watch-interval", "--drain-timeout"] {
        let parsed = tollgated::Cli::try_parse_from([
            "tollgate",
            "serve",
            "--config",
            "t.toml",
            flag,
            "18446744073709551615ms",
        ]);
        let e = parsed.unwrap_err().to_string();
        assert!(e.contains("at most 3650d"), "{flag}: {e}");
    }
}
