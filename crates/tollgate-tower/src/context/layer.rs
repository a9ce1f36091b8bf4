use std::{fmt, sync::Arc};

use tollgate::FullStore;
use tollgate::Tollgate;
use tower_layer::Layer;

use super::ContextService;
use crate::{
    gate::{SharedGate, erase},
    headers::HeaderStyle,
    identity::IdentityResolver,
};

/// Resolves each request's [`Identity`](tollgate::Identity), puts it in the request's
/// extensions (where the rate-limit and duplicate layers below find it) and runs the inner
/// service inside a [`Context`](crate::Context) for macro-guarded handlers.
///
/// Responses of requests that macro-guarded code admitted get the `RateLimit-Policy` and
/// `RateLimit` fields of those checks (or the [style](Self::header_style) chosen; unless
/// turned off), beside those a rate-limit layer below or the handler wrote (as nested
/// [`RateLimitLayer`](crate::RateLimitLayer)s add theirs; items are named by limiter and
/// window, so give a macro's limiter a `name = "..."` where a layer's rule has the same
/// dimension and window). The rejections of guarded code answer in the same style, with the
/// refusing check's fields alone.
///
/// Put it outside every route (`Router::layer`), inside the application's auth layer so that
/// the user is known:
///
/// ```
/// use std::sync::Arc;
/// use axum::{Router, routing::post};
/// use tollgate::{MemoryStore, Tollgate};
/// use tollgate_tower::{ContextLayer, IdentityResolver, Rejection, rate_limit};
///
/// #[rate_limit(by = "ip", rules = ["1/1m", "10/1h"])]
/// async fn send_code() -> Result<&'static str, Rejection> {
///     Ok("sent")
/// }
///
/// let gate = Arc::new(Tollgate::new(MemoryStore::new()));
/// let app: Router = Router::new()
///     .route("/sms/code", post(send_code))
///     .layer(ContextLayer::new(gate, IdentityResolver::new()));
/// ```
#[derive(Clone)]
pub struct ContextLayer {
    pub(crate) gate: SharedGate,
    pub(crate) resolver: Arc<IdentityResolver>,
    pub(crate) style: HeaderStyle,
}

impl ContextLayer {
    /// Identities from `resolver`, checks on `gate`.
    pub fn new<S: FullStore>(gate: Arc<Tollgate<S>>, resolver: IdentityResolver) -> ContextLayer {
        ContextLayer {
            gate: erase(gate),
            resolver: Arc::new(resolver),
            style: HeaderStyle::Draft,
        }
    }

    /// Whether responses carry the RateLimit fields of macro checks (default: yes, in
    /// [`HeaderStyle::Draft`]); `false` is [`HeaderStyle::None`].
    #[must_use]
    pub fn headers(self, enabled: bool) -> ContextLayer {
        self.header_style(if enabled {
            HeaderStyle::Draft
        } else {
            HeaderStyle::None
        })
    }

    /// Which rate-limit fields responses carry (default [`HeaderStyle::Draft`]); see
    /// [`RateLimitLayer::header_style`](crate::RateLimitLayer::header_style).
    #[must_use]
    pub fn header_style(mut self, style: HeaderStyle) -> ContextLayer {
        self.style = style;
        self
    }
}

impl<S> Layer<S> for ContextLayer {
    type Service = ContextService<S>;

    fn layer(&self, inner: S) -> ContextService<S> {
        ContextService {
            inner,
            layer: self.clone(),
        }
    }
}

impl fmt::Debug for ContextLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextLayer")
            .field("resolver", &self.resolver)
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}
