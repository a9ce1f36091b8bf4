use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::Response;
use tollgate::FullStore;
use tollgate::{Dimension, DuplicateBy, DuplicateGuard, Identity, Tollgate};
use tower_layer::Layer;

use super::DuplicateService;
use crate::{
    gate::{SharedGate, erase},
    identity::IdentityResolver,
    rejection::{OnRejection, Rejection, on_rejection},
};

/// The `Idempotency-Key` field name, lower case as in [`Identity`] headers.
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// What makes two requests the same submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The `Idempotency-Key` header; the first response is replayed.
    Key,
    /// Method, path, query and body.
    Args,
    /// A dimension of the identity (ip, user id, ...).
    Identity,
}

/// Guards a service against duplicate submissions; see the
/// [module docs](crate::DuplicateLayer) and [`DuplicateService`].
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use axum::{Router, routing::post};
/// use tollgate::{MemoryStore, Tollgate};
/// use tollgate_tower::DuplicateLayer;
///
/// let gate = Arc::new(Tollgate::new(MemoryStore::new()));
/// // The seed's @PreventDuplicateSubmit(type = USER_ID, expire = 2s).
/// let profile = DuplicateLayer::new(gate.clone(), "profile", "user_id".parse()?)
///     .ttl(Duration::from_secs(2));
/// // Same body twice within 5 s: the second is refused.
/// let comments = DuplicateLayer::new(gate, "comments", "args".parse()?)
///     .ttl(Duration::from_secs(5))
///     .max_body(64 * 1024);
/// let app: Router = Router::new()
///     .route("/profile", post(|| async { "saved" }).layer(profile))
///     .route("/comments", post(|| async { "posted" }).layer(comments));
/// # Ok::<(), String>(())
/// ```
#[derive(Clone)]
pub struct DuplicateLayer {
    pub(crate) config: Arc<Config>,
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) gate: SharedGate,
    pub(crate) scope: Arc<str>,
    pub(crate) by: DuplicateBy,
    /// The header a guard `by` `header:<name>` reads, for the identity to carry.
    pub(crate) wanted: Option<http::HeaderName>,
    pub(crate) mode: Mode,
    pub(crate) global: bool,
    pub(crate) ttl: Duration,
    pub(crate) replay_for: Duration,
    pub(crate) max_body: usize,
    pub(crate) max_response: usize,
    pub(crate) require_key: bool,
    pub(crate) resolver: IdentityResolver,
    pub(crate) on_rejection: Option<OnRejection>,
    /// Built from the fields above by [`Config::rebuild`].
    pub(crate) guard: DuplicateGuard,
}

impl Config {
    fn rebuild(&mut self) {
        let by = match self.mode {
            // Keys are scoped by user when the user is known: one client's key never
            // replays another user's response.
            Mode::Key => DuplicateBy::Dimension(Dimension::custom(IDEMPOTENCY_KEY, scoped_key)),
            Mode::Args | Mode::Identity => self.by.clone(),
        };
        self.guard = DuplicateGuard::new(&self.scope, by)
            .with_ttl(self.ttl)
            .global(self.global);
    }
}

/// The idempotency key, prefixed with the length-delimited user id when there is one.
fn scoped_key(identity: &Identity) -> Option<String> {
    let key = identity.header(IDEMPOTENCY_KEY)?;
    Some(match identity.user_id() {
        Some(user) => format!("u{}:{user}:{key}", user.len()),
        None => format!("-:{key}"),
    })
}

impl DuplicateLayer {
    /// Guards the action `scope` with the mode `by`: `key` (`"key".parse()`: the
    /// `Idempotency-Key` header), `args`, or a dimension (`ip`, `user_id`, `user_name`,
    /// `header:<name>`).
    ///
    /// Defaults: a lock TTL of 1 s (the seed's; a minute for `key`, whose lock holds while its
    /// request runs), replays kept for 24 h, bodies up to 1 MiB, responses stored up to 64 KiB.
    pub fn new<S: FullStore>(
        gate: Arc<Tollgate<S>>,
        scope: &str,
        by: DuplicateBy,
    ) -> DuplicateLayer {
        let mode = match &by {
            DuplicateBy::Args => Mode::Args,
            DuplicateBy::Dimension(Dimension::Header(h)) if h == IDEMPOTENCY_KEY => Mode::Key,
            _ => Mode::Identity,
        };
        let wanted = match (&by, mode) {
            (DuplicateBy::Dimension(Dimension::Header(name)), Mode::Identity) => {
                http::HeaderName::from_bytes(name.as_bytes()).ok()
            }
            _ => None,
        };
        let mut config = Config {
            gate: erase(gate),
            scope: scope.into(),
            guard: DuplicateGuard::new(scope, by.clone()),
            by,
            wanted,
            mode,
            global: false,
            // An idempotency key's lock holds while its request runs: one that outlives it
            // lets a repeat run the operation again.
            ttl: Duration::from_secs(if mode == Mode::Key { 60 } else { 1 }),
            replay_for: Duration::from_secs(24 * 3600),
            max_body: 1 << 20,
            max_response: 64 << 10,
            require_key: true,
            resolver: IdentityResolver::new(),
            on_rejection: None,
        };
        config.rebuild();
        DuplicateLayer {
            config: Arc::new(config),
        }
    }

    /// Idempotency keys (draft-ietf-httpapi-idempotency-key-header) for the action `scope`:
    /// the first response to a key is stored and replayed to repeats.
    pub fn idempotency_key<S: FullStore>(gate: Arc<Tollgate<S>>, scope: &str) -> DuplicateLayer {
        let by = DuplicateBy::Dimension(Dimension::Header(IDEMPOTENCY_KEY.into()));
        DuplicateLayer::new(gate, scope, by)
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> DuplicateLayer {
        let config = Arc::make_mut(&mut self.config);
        f(config);
        config.rebuild();
        self
    }

    /// How long the lock holds: for `key`, while the first request runs (default 1 min: a
    /// request that runs longer may run twice, and a crashed instance's lock frees itself
    /// after this); for the other modes, the window in which repeats are refused, counted
    /// from the first request (default 1 s).
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> DuplicateLayer {
        self.edit(|c| c.ttl = ttl)
    }

    /// How long a completed `key` request's response is kept for replay (default 24 h).
    #[must_use]
    pub fn replay_for(self, keep: Duration) -> DuplicateLayer {
        self.edit(|c| c.replay_for = keep)
    }

    /// Shares the lock across every action (the seed's `global = true`).
    #[must_use]
    pub fn global(self, global: bool) -> DuplicateLayer {
        self.edit(|c| c.global = global)
    }

    /// The largest request body buffered for a fingerprint (`key`, `args`); larger ones get
    /// 413 (default 1 MiB).
    #[must_use]
    pub fn max_body(self, bytes: usize) -> DuplicateLayer {
        self.edit(|c| c.max_body = bytes)
    }

    /// The largest response stored for replay (default 64 KiB; the engine's
    /// `with_max_stored_response` must allow it too). A larger response is streamed to the
    /// client as usual, and repeats of its key get 429 instead of a replay.
    #[must_use]
    pub fn max_response(self, bytes: usize) -> DuplicateLayer {
        self.edit(|c| c.max_response = bytes)
    }

    /// Whether a request without an `Idempotency-Key` is refused with 400 (default) or
    /// passed through unguarded.
    #[must_use]
    pub fn require_key(self, required: bool) -> DuplicateLayer {
        self.edit(|c| c.require_key = required)
    }

    /// How to build the identity when no [`ContextLayer`](crate::ContextLayer) above has.
    #[must_use]
    pub fn resolver(self, resolver: IdentityResolver) -> DuplicateLayer {
        self.edit(|c| c.resolver = resolver)
    }

    /// Builds the response for refused requests, with any body (default: the
    /// [`Rejection::into_http_response`], or [`Rejection::into_grpc_response`] for a gRPC
    /// request).
    #[must_use]
    pub fn on_rejection<F, B>(self, f: F) -> DuplicateLayer
    where
        F: Fn(Rejection) -> Response<B> + Send + Sync + 'static,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<crate::BoxError>,
    {
        let f: OnRejection = on_rejection(f);
        self.edit(|c| c.on_rejection = Some(f))
    }
}

impl<S> Layer<S> for DuplicateLayer {
    type Service = DuplicateService<S>;

    fn layer(&self, inner: S) -> DuplicateService<S> {
        DuplicateService {
            inner,
            config: self.config.clone(),
        }
    }
}

impl fmt::Debug for DuplicateLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DuplicateLayer")
            .field("scope", &self.config.scope)
            .field("by", &self.config.by)
            .field("ttl", &self.config.ttl)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idempotency key's lock holds while its request runs: a minute unless told, so that
    /// a request of a few seconds cannot run twice; the other modes refuse repeats for 1 s.
    #[test]
    fn an_idempotency_keys_lock_outlives_its_request() {
        let gate = Arc::new(Tollgate::new(tollgate::MemoryStore::new()));
        let keyed = DuplicateLayer::idempotency_key(gate.clone(), "orders");
        assert_eq!(keyed.config.ttl, Duration::from_secs(60));
        let by_user =
            DuplicateLayer::new(gate, "profile", DuplicateBy::Dimension(Dimension::UserId));
        assert_eq!(by_user.config.ttl, Duration::from_secs(1));
        assert_eq!(
            keyed.ttl(Duration::from_secs(5)).config.ttl,
            Duration::from_secs(5)
        );
    }
}
