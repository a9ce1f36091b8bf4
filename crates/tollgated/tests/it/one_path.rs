//! One check path for every front end: the library, the tower layer, the macros, `/v1/check`,
//! `/v1/checks` and Envoy's `ShouldRateLimit` reach the store through the engine with the same
//! request. A store of the test's own records what it is asked (every limiter's key, rules and
//! shadow flag, the ban keys, the cost), and each front end's check of one policy for one user
//! must match the library's, request for request.

use std::sync::{Arc, Mutex, PoisonError};

use axum::{body::Body, http::Request};
use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
    service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code},
};
use serde_json::json;
use tollgate::{
    AnyStore, BanEntry, BanPage, BanStore, BanTarget, CheckRequest, Dimension, Identity, Limiter,
    LockReply, LockStore, MemoryStore, PageCursor, Policy, Receipt, RefundStore, Store, StoreError,
    Tollgate, Verdict,
};
use tollgate_tower::{Context, IdentityResolver, RateLimitLayer, Rejection, rate_limit};
use tollgated::{Config, InProcess};
use tower::{ServiceBuilder, ServiceExt as _};

use crate::support::post_in_process;

/// What a store was asked by one check.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    cost: u64,
    consume: bool,
    /// Per limiter: the key it is found by, its rules as text, shadow.
    limiters: Vec<(Vec<u8>, Vec<String>, bool)>,
    bans: Vec<String>,
}

/// A memory store that records every check it is asked.
#[derive(Clone, Default)]
struct Recorder {
    inner: MemoryStore,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    fn record(&self, request: &CheckRequest<'_>) {
        let seen = Seen {
            cost: request.cost,
            consume: request.consume,
            limiters: request
                .limiters
                .iter()
                .map(|l| {
                    let rules = l.rules.iter().map(ToString::to_string).collect();
                    (l.key_bytes().to_vec(), rules, l.shadow)
                })
                .collect(),
            bans: request.bans.iter().map(|b| b.key.to_owned()).collect(),
        };
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(seen);
    }

    /// What was asked since the last call.
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut self.seen.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Store for Recorder {
    async fn check(&self, request: &CheckRequest<'_>) -> Result<Verdict, StoreError> {
        self.record(request);
        self.inner.check(request).await
    }

    fn check_sync(
        &self,
        request: &CheckRequest<'_>,
        verdict: &mut Verdict,
    ) -> Option<Result<(), StoreError>> {
        self.record(request);
        self.inner.check_sync(request, verdict)
    }

    async fn reset(&self, request: &CheckRequest<'_>) -> Result<(), StoreError> {
        self.inner.reset(request).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }

    fn bans_possible(&self) -> bool {
        self.inner.bans_possible()
    }

    fn text_keys(&self) -> bool {
        self.inner.text_keys()
    }
}

impl RefundStore for Recorder {
    async fn refund(
        &self,
        request: &CheckRequest<'_>,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        self.inner.refund(request, receipt).await
    }

    async fn extend(
        &self,
        request: &CheckRequest<'_>,
        receipt: &Receipt,
    ) -> Result<Option<Receipt>, StoreError> {
        self.inner.extend(request, receipt).await
    }

    async fn charge(&self, request: &CheckRequest<'_>) -> Result<(), StoreError> {
        self.inner.charge(request).await
    }
}

impl LockStore for Recorder {
    async fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: std::time::Duration,
    ) -> Result<LockReply, StoreError> {
        self.inner.lock_acquire(key, token, fingerprint, ttl).await
    }

    async fn lock_release(&self, key: &str, token: &str) -> Result<bool, StoreError> {
        self.inner.lock_release(key, token).await
    }

    async fn lock_complete(
        &self,
        key: &str,
        token: &str,
        response: &[u8],
        keep_for: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.inner
            .lock_complete(key, token, response, keep_for)
            .await
    }
}

impl BanStore for Recorder {
    async fn bans(&self, prefix: &str) -> Result<Vec<BanEntry>, StoreError> {
        self.inner.bans(prefix).await
    }

    async fn ban(
        &self,
        prefix: &str,
        target: &BanTarget,
        duration: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.inner.ban(prefix, target, duration).await
    }

    async fn unban(&self, prefix: &str, target: &BanTarget) -> Result<bool, StoreError> {
        self.inner.unban(prefix, target).await
    }

    async fn ban_count(&self, prefix: &str) -> Result<u64, StoreError> {
        self.inner.ban_count(prefix).await
    }

    async fn bans_page(
        &self,
        prefix: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> Result<BanPage, StoreError> {
        self.inner.bans_page(prefix, after, limit).await
    }
}

impl tollgate::OverrideStore for Recorder {
    async fn set_override(
        &self,
        limiter: &tollgate::LimiterRequest<'_>,
        index: &str,
        entry: &tollgate::Override,
        ttl: Option<std::time::Duration>,
    ) -> Result<tollgate::Override, StoreError> {
        self.inner.set_override(limiter, index, entry, ttl).await
    }

    async fn remove_override(
        &self,
        limiter: &tollgate::LimiterRequest<'_>,
        index: &str,
    ) -> Result<bool, StoreError> {
        self.inner.remove_override(limiter, index).await
    }

    async fn overrides(&self, index: &str) -> Result<Vec<tollgate::Override>, StoreError> {
        self.inner.overrides(index).await
    }
}

/// The policy every front end checks: two rules per user.
fn policy() -> Policy {
    Policy::builder("one_path")
        .limiter(Limiter::new(
            Dimension::UserId,
            ["2/1m".parse().unwrap(), "5/1h".parse().unwrap()],
        ))
        .build()
        .unwrap()
}

const CONFIG: &str = r#"
[policies.one_path]
limiters = [{ by = "user_id", rules = ["2/1m", "5/1h"] }]

[[envoy.domains]]
name = "edge"
descriptors = [{ key = "user", rules = ["2/1m", "5/1h"] }]
"#;

fn alice() -> Identity {
    Identity::new().with_user_id("alice")
}

/// The request the library's own check makes: what every front end must make too.
async fn library() -> Seen {
    let recorder = Recorder::default();
    let gate = Tollgate::new(recorder.clone());
    assert!(gate.check(&policy(), &alice(), 1).await.unwrap().allowed());
    let mut seen = recorder.take();
    assert_eq!(seen.len(), 1, "one check, one store request: {seen:?}");
    seen.remove(0)
}

#[rate_limit(by = "user_id", rules = ["2/1m", "5/1h"], scope = "one_path")]
async fn guarded() -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn the_library_asks_for_every_limiter_once() {
    let seen = library().await;
    assert_eq!(seen.cost, 1);
    assert!(seen.consume);
    assert_eq!(seen.limiters.len(), 1);
    assert_eq!(seen.limiters[0].1, ["2/1m", "5/1h"]);
    assert!(
        seen.limiters[0].0.ends_with(b"alice"),
        "the key holds the user"
    );
}

#[tokio::test]
async fn the_tower_layer_asks_what_the_library_asks() {
    let recorder = Recorder::default();
    let gate = Arc::new(Tollgate::new(recorder.clone()));
    let users = IdentityResolver::new().enrich(|who, headers, _| {
        match headers.get("x-user-id").and_then(|v| v.to_str().ok()) {
            Some(id) => who.with_user_id(id),
            None => who,
        }
    });
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(gate, policy()).resolver(users))
        .service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
    let request = Request::builder()
        .uri("/")
        .header("x-user-id", "alice")
        .body(Body::empty())
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(recorder.take(), [library().await]);
}

#[tokio::test]
async fn the_macros_ask_what_the_library_asks() {
    let recorder = Recorder::default();
    let gate = Arc::new(Tollgate::new(recorder.clone()));
    Context::new(gate, alice())
        .scope(guarded())
        .await
        .expect("admitted");
    assert_eq!(recorder.take(), [library().await]);
}

/// The server over the recorder, with `CONFIG`.
fn server(recorder: &Recorder) -> InProcess {
    let config = Config::parse("one_path.toml", CONFIG).unwrap();
    InProcess::with_store(config, AnyStore::new(recorder.clone()), None)
}

#[tokio::test]
async fn the_servers_check_asks_what_the_library_asks() {
    let recorder = Recorder::default();
    let server = server(&recorder);
    let check = json!({ "policy": "one_path", "identity": { "user_id": "alice" } });
    let answer = post_in_process(&server, "/v1/check", check).await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(recorder.take(), [library().await]);
}

#[tokio::test]
async fn the_servers_batch_asks_what_the_library_asks_once_per_check() {
    let recorder = Recorder::default();
    let server = server(&recorder);
    let check = json!({ "policy": "one_path", "identity": { "user_id": "alice" } });
    let answer = post_in_process(
        &server,
        "/v1/checks",
        json!({ "checks": [check.clone(), check] }),
    )
    .await;
    assert_eq!(answer["results"][1]["allowed"], true, "{answer}");
    let one = library().await;
    assert_eq!(recorder.take(), [one.clone(), one]);
}

#[tokio::test]
async fn envoy_asks_through_the_engine_once_per_call() {
    let recorder = Recorder::default();
    let server = server(&recorder);
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "alice".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 2,
    };
    let answer = server.should_rate_limit(request).await.unwrap();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    let seen = recorder.take();
    assert_eq!(seen.len(), 1, "one call, one store request: {seen:?}");
    assert_eq!(seen[0].cost, 2, "the call's hits");
    assert!(seen[0].consume);
    let rules: Vec<&[String]> = seen[0].limiters.iter().map(|l| &l.1[..]).collect();
    assert!(
        rules.iter().any(|r| r.contains(&"2/1m".to_owned())),
        "the descriptor's rules: {seen:?}"
    );
    assert!(
        seen[0]
            .limiters
            .iter()
            .any(|l| l.0.windows(5).any(|w| w == b"alice")),
        "the descriptor's value is in its key: {seen:?}"
    );
}
