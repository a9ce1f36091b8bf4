//! The Envoy rate-limit gRPC service, driven with the tonic client from envoy-types.

use envoy_types::pb::{
    envoy::service::ratelimit::v3::{
        RateLimitResponse,
        rate_limit_response::{Code, DescriptorStatus, rate_limit::Unit},
    },
    google::protobuf::UInt64Value,
};

use crate::support::{Server, descriptor, should_rate_limit};

const CONFIG: &str = r#"
[[envoy.domains]]
name = "edge"
descriptors = [
  { key = "remote_address", rules = ["2/1m", "100/1h"] },
  { key = "path", rules = ["100/1m"] },
  { key = "path", value = "/login", rules = ["1/1m"] },
  { key = "shadowed", rules = ["1/1m"], shadow = true },
  { key = "tenant", descriptors = [
      { key = "plan", value = "free", rules = ["1/1m"] },
      { key = "plan", rules = ["3/30s"] },
  ] },
]

[[envoy.domains]]
name = "other"
descriptors = [{ key = "remote_address", rules = ["1/1h"] }]
"#;

fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap()
}

fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

/// (requests_per_unit, unit, remaining) of a status.
fn limit(status: &DescriptorStatus) -> (u32, Unit, u32) {
    let l = status.current_limit.as_ref().expect("current_limit");
    (
        l.requests_per_unit,
        Unit::try_from(l.unit).unwrap(),
        status.limit_remaining,
    )
}

#[tokio::test]
async fn descriptors_match_like_envoys_reference_service() {
    let server = Server::start(CONFIG);
    let mut rls = server.grpc_client().await;

    // Key-only entries count every value separately; several rules, the strictest reported.
    let ra = |ip: &str| descriptor(&[("remote_address", ip)]);
    let r = should_rate_limit(&mut rls, "edge", vec![ra("192.0.2.1")], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert_eq!(limit(&r.statuses[0]), (2, Unit::Minute, 1));
    let reset = r.statuses[0].duration_until_reset.unwrap();
    assert!(reset.seconds <= 60 && reset.seconds >= 59, "{reset:?}");
    let r = should_rate_limit(&mut rls, "edge", vec![ra("192.0.2.1")], 0).await;
    assert_eq!(limit(&r.statuses[0]), (2, Unit::Minute, 0));
    let r = should_rate_limit(&mut rls, "edge", vec![ra("192.0.2.1")], 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(limit(&r.statuses[0]).0, 2);
    let r = should_rate_limit(&mut rls, "edge", vec![ra("192.0.2.2")], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    // Domains are separate.
    let r = should_rate_limit(&mut rls, "other", vec![ra("192.0.2.1")], 0).await;
    assert_eq!(limit(&r.statuses[0]), (1, Unit::Hour, 0));

    // A value-specific entry wins over the key-only one.
    let path = |p: &str| descriptor(&[("path", p)]);
    let r = should_rate_limit(&mut rls, "edge", vec![path("/login")], 0).await;
    assert_eq!(limit(&r.statuses[0]), (1, Unit::Minute, 0));
    let r = should_rate_limit(&mut rls, "edge", vec![path("/login")], 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let r = should_rate_limit(&mut rls, "edge", vec![path("/home")], 0).await;
    assert_eq!(limit(&r.statuses[0]), (100, Unit::Minute, 99));

    // Nested descriptors, value-specific first, the rule given per its nearest unit.
    let plan = |p: &str| descriptor(&[("tenant", "acme"), ("plan", p)]);
    let r = should_rate_limit(&mut rls, "edge", vec![plan("free")], 0).await;
    assert_eq!(limit(&r.statuses[0]), (1, Unit::Minute, 0));
    let r = should_rate_limit(&mut rls, "edge", vec![plan("pro")], 0).await;
    assert_eq!(limit(&r.statuses[0]), (6, Unit::Minute, 2));
    // Stopping short of a rule, or going past the tree, limits nothing.
    for d in [
        descriptor(&[("tenant", "acme")]),
        descriptor(&[("remote_address", "192.0.2.1"), ("path", "/")]),
        descriptor(&[("unknown", "x")]),
    ] {
        let r = should_rate_limit(&mut rls, "edge", vec![d], 0).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None);
    }

    // An unknown domain is not limited: one OK status per descriptor.
    let r = should_rate_limit(
        &mut rls,
        "nowhere",
        vec![ra("192.0.2.1"), path("/login")],
        0,
    )
    .await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses.len(), 2);
    assert!(r.statuses.iter().all(|s| code(s) == Code::Ok));

    // An empty domain is an invalid request, as in Envoy's service.
    let err = rls
        .should_rate_limit(
            envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
                domain: String::new(),
                descriptors: vec![ra("192.0.2.1")],
                hits_addend: 0,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn hits_addend_shadow_and_all_or_nothing() {
    let server = Server::start(CONFIG);
    let mut rls = server.grpc_client().await;
    let ra = |ip: &str| descriptor(&[("remote_address", ip)]);

    // hits_addend: 0 means 1; 2 takes two.
    let r = should_rate_limit(&mut rls, "edge", vec![ra("198.51.100.1")], 2).await;
    assert_eq!(limit(&r.statuses[0]), (2, Unit::Minute, 0));
    let r = should_rate_limit(&mut rls, "edge", vec![ra("198.51.100.1")], 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    // A descriptor's own hits_addend overrides the request's.
    let mut own = ra("198.51.100.2");
    own.hits_addend = Some(UInt64Value { value: 2 });
    let r = should_rate_limit(&mut rls, "edge", vec![own], 1).await;
    assert_eq!(limit(&r.statuses[0]), (2, Unit::Minute, 0));

    // All or nothing across descriptors: /login is spent, so the request is over the limit
    // and the address it came from is not charged.
    let login = descriptor(&[("path", "/login")]);
    should_rate_limit(&mut rls, "edge", vec![login.clone()], 0).await;
    let r = should_rate_limit(&mut rls, "edge", vec![ra("198.51.100.3"), login.clone()], 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert_eq!(code(&r.statuses[1]), Code::OverLimit);
    assert_eq!(limit(&r.statuses[0]), (2, Unit::Minute, 2));
    let r = should_rate_limit(&mut rls, "edge", vec![ra("198.51.100.3")], 0).await;
    assert_eq!(
        limit(&r.statuses[0]),
        (2, Unit::Minute, 1),
        "the denied request cost nothing"
    );

    // Shadow: recorded and reported, never OVER_LIMIT, and it does not stop the others.
    let shadow = descriptor(&[("shadowed", "x")]);
    let r = should_rate_limit(&mut rls, "edge", vec![shadow.clone()], 0).await;
    assert_eq!(limit(&r.statuses[0]), (1, Unit::Minute, 0));
    let r = should_rate_limit(&mut rls, "edge", vec![shadow.clone()], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert_eq!(limit(&r.statuses[0]), (1, Unit::Minute, 0));
    let r = should_rate_limit(&mut rls, "edge", vec![shadow, ra("198.51.100.4")], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        limit(&r.statuses[1]),
        (2, Unit::Minute, 1),
        "recorded despite the shadow"
    );

    // Decisions are counted per domain.
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains(
            r#"tollgate_decisions_total{policy="envoy:edge",reason="rate_limited",allowed="false"}"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_descriptor_limit_override_replaces_the_configured_rules() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;

    let server = Server::start(CONFIG);
    let mut rls = server.grpc_client().await;
    // RateLimitUnit: 2 = MINUTE, 3 = HOUR, 0 = UNKNOWN.
    let overridden = |key: &str, value: &str, per_unit: u32, unit: i32| {
        let mut d = descriptor(&[(key, value)]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: per_unit,
            unit,
        });
        d
    };

    // 3 per MINUTE instead of the configured 2/1m + 100/1h.
    for left in [2, 1, 0] {
        let r = should_rate_limit(
            &mut rls,
            "edge",
            vec![overridden("remote_address", "192.0.2.7", 3, 2)],
            0,
        )
        .await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(limit(&r.statuses[0]), (3, Unit::Minute, left));
    }
    let r = should_rate_limit(
        &mut rls,
        "edge",
        vec![overridden("remote_address", "192.0.2.7", 3, 2)],
        0,
    )
    .await;
    assert_eq!(overall(&r), Code::OverLimit);
    // The configured counter of the same entries was not touched, nor a different override's.
    let r = should_rate_limit(
        &mut rls,
        "edge",
        vec![descriptor(&[("remote_address", "192.0.2.7")])],
        0,
    )
    .await;
    assert_eq!(limit(&r.statuses[0]), (2, Unit::Minute, 1));
    let r = should_rate_limit(
        &mut rls,
        "edge",
        vec![overridden("remote_address", "192.0.2.7", 10, 3)],
        0,
    )
    .await;
    assert_eq!(limit(&r.statuses[0]), (10, Unit::Hour, 9));

    // An override limits a descriptor that no configured one matches, in a known domain...
    let r = should_rate_limit(&mut rls, "edge", vec![overridden("unknown", "x", 1, 2)], 0).await;
    assert_eq!(limit(&r.statuses[0]), (1, Unit::Minute, 0));
    let r = should_rate_limit(&mut rls, "edge", vec![overridden("unknown", "x", 1, 2)], 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    // ... not in an unknown domain; and one with an unknown unit or no requests is ignored.
    let r = should_rate_limit(
        &mut rls,
        "nowhere",
        vec![overridden("unknown", "x", 1, 2)],
        0,
    )
    .await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].current_limit, None);
    for (per_unit, unit) in [(5, 0), (0, 2)] {
        let r = should_rate_limit(
            &mut rls,
            "edge",
            vec![overridden("path", "/login", per_unit, unit)],
            0,
        )
        .await;
        assert_eq!(limit(&r.statuses[0]).0, 1, "the configured 1/1m applies");
    }
}

/// A request whose shadow descriptor denies is one store call and one admitted decision,
/// never also a denied one; the would-be denials are counted per descriptor.
#[tokio::test]
async fn a_shadow_denial_is_one_admitted_decision() {
    let server = Server::start(CONFIG);
    let mut rls = server.grpc_client().await;
    let shadow = descriptor(&[("shadowed", "y")]);
    let ra = descriptor(&[("remote_address", "198.51.100.9")]);
    for descriptors in [vec![shadow.clone()], vec![shadow.clone()], vec![shadow, ra]] {
        let r = should_rate_limit(&mut rls, "edge", descriptors, 0).await;
        assert_eq!(overall(&r), Code::Ok);
    }
    let (_, metrics) = server.get_text("/metrics").await;
    let count = |labels: &str| -> u64 {
        let prefix = format!("tollgate_decisions_total{{policy=\"envoy:edge\",{labels}}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    assert_eq!(count(r#"reason="ok",allowed="true""#), 3, "{metrics}");
    let value = |prefix: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(prefix)?.strip_prefix(' '))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    assert_eq!(
        value(r#"tollgate_store_latency_seconds_count{op="check"}"#),
        3,
        "one store call per request: {metrics}"
    );
    assert_eq!(
        value(r#"tollgate_shadow_denials_total{policy="envoy:edge",limiter="shadowed"}"#),
        2,
        "{metrics}"
    );
    assert_eq!(
        count(r#"reason="rate_limited",allowed="false""#),
        0,
        "{metrics}"
    );
}

/// With the check scope's token set, `ShouldRateLimit` takes it too, as the metadata
/// `authorization: Bearer <token>` (Envoy's `initial_metadata`): without it, or with a wrong
/// one, the call is refused and counts nothing; failures count against the caller's address
/// (the HTTP API's too), which past `admin_failure_limit` is refused unless it sends the token.
#[tokio::test]
async fn the_check_scopes_token_guards_should_rate_limit() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let token = "check-token-0123456789";
    let config = format!(
        "[server]\ncheck_token_env = \"TG_CHECK\"\nadmin_failure_limit = \"3/1m\"\n{CONFIG}"
    );
    let server = Server::start_with_env(&config, &[("TG_CHECK", token)]);
    let mut rls = server.grpc_client().await;
    let request = |token: Option<&str>| {
        let mut request = tonic::Request::new(RateLimitRequest {
            domain: "other".into(),
            descriptors: vec![descriptor(&[("remote_address", "192.0.2.9")])],
            hits_addend: 0,
        });
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        request
    };
    let missing = rls.should_rate_limit(request(None)).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated, "{missing:?}");
    assert!(
        missing.message().contains("authorization: Bearer"),
        "{missing:?}"
    );
    let wrong = rls.should_rate_limit(request(Some("wrong-token-0123456789")));
    let wrong = wrong.await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
    // "other" admits 1 an hour: the refused calls counted nothing.
    let admitted = rls.should_rate_limit(request(Some(token))).await.unwrap();
    assert_eq!(overall(&admitted.into_inner()), Code::Ok);
    let denied = rls.should_rate_limit(request(Some(token))).await.unwrap();
    assert_eq!(overall(&denied.into_inner()), Code::OverLimit);
    // The third failure is the last this address may make; the token still passes.
    let _ = rls.should_rate_limit(request(None)).await.unwrap_err();
    let locked = rls.should_rate_limit(request(None)).await.unwrap_err();
    assert_eq!(locked.code(), tonic::Code::ResourceExhausted, "{locked:?}");
    let admitted = rls.should_rate_limit(request(Some(token))).await.unwrap();
    assert_eq!(overall(&admitted.into_inner()), Code::OverLimit);
    // The HTTP API counts the same failures for the same address.
    let check = serde_json::json!({ "policy": "none", "identity": {} });
    let (status, _) = server
        .send(
            server
                .request(reqwest::Method::POST, "/v1/check")
                .bearer_auth("wrong-token-0123456789")
                .json(&check),
        )
        .await;
    assert_eq!(status, 429);
}

/// Descriptors of different costs (a `hits_addend` of their own, which Envoy sets) are all or
/// nothing too: one over its limit leaves nothing counted for the others.
#[tokio::test]
async fn descriptors_of_different_costs_are_all_or_nothing() {
    let server = Server::start(
        r#"
[[envoy.domains]]
name = "edge"
descriptors = [
  { key = "user", rules = ["100/1m"] },
  { key = "path", value = "/upload", rules = ["1/1m"] },
]
"#,
    );
    let mut rls = server.grpc_client().await;
    let upload = descriptor(&[("path", "/upload")]);
    let mut user = descriptor(&[("user", "alice")]);
    user.hits_addend = Some(UInt64Value { value: 10 });
    let r = should_rate_limit(&mut rls, "edge", vec![upload.clone()], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    // Either order: the denying group checked last gives back, checked first stops the rest.
    // Either way alice's descriptor says what it would have left (nothing stays counted), and
    // the request is one denied decision.
    let untouched = (100, Unit::Minute, 100);
    for _ in 0..3 {
        let both = vec![user.clone(), upload.clone()];
        let r = should_rate_limit(&mut rls, "edge", both, 0).await;
        assert_eq!(overall(&r), Code::OverLimit);
        assert_eq!(code(&r.statuses[1]), Code::OverLimit);
        assert_eq!(limit(&r.statuses[0]), untouched, "{r:?}");
        let both = vec![upload.clone(), user.clone()];
        let r = should_rate_limit(&mut rls, "edge", both, 0).await;
        assert_eq!(overall(&r), Code::OverLimit);
        assert_eq!(code(&r.statuses[0]), Code::OverLimit);
        assert_eq!(limit(&r.statuses[1]), untouched, "{r:?}");
    }
    let (_, metrics) = server.get_text("/metrics").await;
    for (labels, n) in [
        (r#"reason="ok",allowed="true""#, 1),
        (r#"reason="rate_limited",allowed="false""#, 6),
    ] {
        let line = format!("tollgate_decisions_total{{policy=\"envoy:edge\",{labels}}} {n}");
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }
    // Nothing stays counted for alice (given back in the background): 100 left, looked at
    // with a cost of 0.
    let mut look = descriptor(&[("user", "alice")]);
    look.hits_addend = Some(UInt64Value { value: 0 });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = should_rate_limit(&mut rls, "edge", vec![look.clone()], 0).await;
        if limit(&r.statuses[0]) == (100, Unit::Minute, 100) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{r:?}");
        tokio::task::yield_now().await;
    }
}
