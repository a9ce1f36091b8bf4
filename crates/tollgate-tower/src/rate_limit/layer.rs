use std::{fmt, sync::Arc};

use bytes::Bytes;
use http::{HeaderName, Response};
use tollgate::FullStore;
use tollgate::{Dimension, IpPrefix, Policy, Tollgate};
use tower_layer::Layer;

use super::{Cost, Count, RateLimitService, Settle};
use crate::{
    gate::{SharedGate, erase},
    headers::{HeaderStyle, PolicyFields},
    identity::IdentityResolver,
    rejection::{OnRejection, Rejection, on_rejection},
};

/// Applies a rate-limit [`Policy`] to a service; see the [module docs](crate::RateLimitLayer)
/// and [`RateLimitService`].
///
/// ```
/// use std::sync::Arc;
/// use axum::{Router, routing::post};
/// use http::StatusCode;
/// use tollgate::{Dimension, Limiter, MemoryStore, Policy, Tollgate};
/// use tollgate_tower::{IdentityResolver, RateLimitLayer};
///
/// let gate = Arc::new(Tollgate::new(MemoryStore::new()));
/// let policy = Policy::builder("login")
///     .limiter(Limiter::new(Dimension::Ip, ["5/1m".parse()?]).with_message("too many attempts"))
///     .build()?;
/// let layer = RateLimitLayer::new(gate, policy)
///     .resolver(IdentityResolver::new().trust_proxy("10.0.0.0/8".parse()?))
///     .headers(false)
///     .on_rejection(|rejection| {
///         // Same body and headers, another status.
///         let mut response = rejection.into_http_response();
///         *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
///         response
///     });
/// let app: Router = Router::new().route("/login", post(|| async { "ok" }).layer(layer));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    pub(crate) config: Arc<Config>,
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) gate: SharedGate,
    pub(crate) policy: Policy,
    pub(crate) resolver: IdentityResolver,
    /// The headers the policy's `header:<name>` dimensions read.
    pub(crate) wanted: Vec<HeaderName>,
    pub(crate) style: HeaderStyle,
    /// The policy's header fields that never change.
    pub(crate) fields: Arc<PolicyFields>,
    pub(crate) cost: u64,
    /// The cost read from each request, instead of `cost`.
    pub(crate) cost_from: Option<Cost>,
    /// How long a request may be held for its units instead of refused (GCRA rules).
    pub(crate) max_delay: Option<std::time::Duration>,
    /// The cost read from each response, its check settled at it.
    pub(crate) settle: Option<Settle>,
    pub(crate) count: Count,
    /// The policy has concurrency limiters: an admitted request holds its slots until its
    /// response body ends.
    pub(crate) concurrent: bool,
    /// The shortest lease TTL of its concurrency limiters: a slot held longer is renewed.
    pub(crate) lease_ttl: Option<std::time::Duration>,
    pub(crate) on_rejection: Option<OnRejection>,
}

impl crate::gate::PolicyHome for Arc<Config> {
    fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl RateLimitLayer {
    /// Checks `policy` on `gate` for every request, at a cost of one unit.
    pub fn new<S: FullStore>(gate: Arc<Tollgate<S>>, policy: Policy) -> RateLimitLayer {
        let wanted = policy
            .limiters()
            .iter()
            .filter_map(|l| match l.dimension() {
                Dimension::Header(name) => HeaderName::from_bytes(name.as_bytes()).ok(),
                _ => None,
            })
            .collect();
        let concurrent = policy
            .limiters()
            .iter()
            .any(tollgate::Limiter::is_concurrent);
        let lease_ttl = crate::gate::lease_ttl(&policy);
        RateLimitLayer {
            config: Arc::new(Config {
                gate: erase(gate),
                fields: Arc::new(PolicyFields::new(&policy)),
                policy,
                resolver: IdentityResolver::new(),
                wanted,
                style: HeaderStyle::Draft,
                cost: 1,
                cost_from: None,
                max_delay: None,
                settle: None,
                count: Count::All,
                concurrent,
                lease_ttl,
                on_rejection: None,
            }),
        }
    }

    /// How to build the identity when no [`ContextLayer`](crate::ContextLayer) above has
    /// (default: the peer address, no user).
    #[must_use]
    pub fn resolver(mut self, resolver: IdentityResolver) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).resolver = resolver;
        self
    }

    /// Counts the policy's `ip` limiters by these networks (default: whatever each limiter
    /// says, which for [`Dimension::Ip`] is IPv6 by /64 and IPv4 by address). The identity
    /// keeps the full address: bypass networks still match it exactly.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{Dimension, IpPrefix, Limiter, MemoryStore, Policy, Tollgate};
    /// use tollgate_tower::RateLimitLayer;
    ///
    /// let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    /// let policy = Policy::builder("signup")
    ///     .limiter(Limiter::new(Dimension::Ip, ["3/1h".parse()?]))
    ///     .build()?;
    /// // One quota per IPv6 /48 (a site) and per IPv4 /24.
    /// let layer = RateLimitLayer::new(gate, policy).ip_prefix(IpPrefix::new(24, 48)?);
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn ip_prefix(mut self, prefix: IpPrefix) -> RateLimitLayer {
        let config = Arc::make_mut(&mut self.config);
        config.policy = config.policy.clone().with_ip_prefix(prefix);
        self
    }

    /// Whether responses carry rate-limit fields (default: yes, in [`HeaderStyle::Draft`]);
    /// `false` is [`HeaderStyle::None`].
    #[must_use]
    pub fn headers(self, enabled: bool) -> RateLimitLayer {
        self.header_style(if enabled {
            HeaderStyle::Draft
        } else {
            HeaderStyle::None
        })
    }

    /// Which rate-limit fields allowed responses and 429s carry (default
    /// [`HeaderStyle::Draft`]): the draft's `RateLimit-Policy`/`RateLimit`, the legacy
    /// `X-RateLimit-*`, the sixth draft's `RateLimit-Limit/Remaining/Reset`, or none on
    /// allowed responses.
    ///
    /// Layers nest (one over the whole API, one over a route): an outer layer adds its
    /// fields to those already on the response (a layer's below, or the service's own), the
    /// draft's lists one policy after the other, the one-rule styles the rule closer to
    /// denying (fewer units left, then the longer to reset). Items are named by limiter and
    /// window (`ip-1m`): name the limiters ([`Limiter::with_name`](tollgate::Limiter::with_name))
    /// where two nested policies have a rule of the same dimension and window.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tollgate::{Dimension, Limiter, MemoryStore, Policy, Tollgate};
    /// use tollgate_tower::{HeaderStyle, RateLimitLayer};
    /// # let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    /// # let policy = Policy::builder("api").limiter(Limiter::new(Dimension::Ip, ["100/1m".parse()?])).build()?;
    ///
    /// let layer = RateLimitLayer::new(gate, policy).header_style(HeaderStyle::Legacy);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn header_style(mut self, style: HeaderStyle) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).style = style;
        self
    }

    /// The units each request costs (default 1).
    #[must_use]
    pub fn cost(mut self, cost: u64) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).cost = cost;
        self
    }

    /// Holds a request that its policy's GCRA rules would admit within `max_delay`, then passes
    /// it on, instead of answering 429 (nginx's `limit_req ... delay`): each held request has
    /// its own place in the schedule, reserved atomically when it arrives (no crowd when the
    /// window opens), so at most `max_delay` over a rule's emission interval requests wait per
    /// identity. A client that goes away while held gives its place back. Rules of other
    /// algorithms admit only what fits now. See
    /// [`Tollgate::check_within`](tollgate::Tollgate::check_within).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use tollgate::{Algorithm, Dimension, Limiter, MemoryStore, Policy, Rule, Tollgate};
    /// use tollgate_tower::RateLimitLayer;
    /// # let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    /// # let rule: Rule = "10/1s".parse()?;
    /// # let policy = Policy::builder("checkout").limiter(Limiter::new(Dimension::Ip, [rule.with_algorithm(Algorithm::Gcra)])).build()?;
    ///
    /// // A checkout waits up to 200 ms for its turn rather than fail.
    /// let layer = RateLimitLayer::new(gate, policy).max_delay(Duration::from_millis(200));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn max_delay(mut self, max_delay: std::time::Duration) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).max_delay = Some(max_delay).filter(|d| !d.is_zero());
        self
    }

    /// Each request's cost read from the request instead of a fixed [`cost`](Self::cost):
    /// an estimate the response can [`settle`](Self::settle).
    #[must_use]
    pub fn cost_from(mut self, cost: Cost) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).cost_from = Some(cost);
        self
    }

    /// Settles each admitted request's check at the cost its response says it had, before the
    /// response goes out (see [`Tollgate::settle`](tollgate::Tollgate::settle)): a smaller
    /// cost gives the difference back, a larger one charges the rest past the limits (the
    /// client's next requests wait until time has paid it). For costs known only afterwards:
    /// an LLM's tokens, the bytes of an export. A request whose charge [`count`](Self::count)
    /// refunds is not settled.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tollgate::{Dimension, Limiter, MemoryStore, Policy, Tollgate};
    /// use tollgate_tower::{Cost, RateLimitLayer, Settle};
    /// # let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    /// # let policy = Policy::builder("llm").limiter(Limiter::new(Dimension::Ip, ["10000/1h".parse()?])).build()?;
    ///
    /// // Charge what the client asks for at most, settle at what the model used.
    /// let layer = RateLimitLayer::new(gate, policy)
    ///     .cost_from(Cost::header("x-max-tokens"))
    ///     .settle(Settle::header("x-tokens-used"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn settle(mut self, settle: Settle) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).settle = Some(settle);
        self
    }

    /// Which admitted requests keep their charge (default [`Count::All`]). With
    /// [`Count::failures()`] a login limit counts failed attempts only: every attempt is
    /// charged when admitted (so concurrent attempts never exceed the limit), and one answered
    /// with a success is refunded before its response is returned.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tollgate::{Dimension, Limiter, MemoryStore, Policy, Tollgate};
    /// use tollgate_tower::{Count, RateLimitLayer};
    /// # let gate = Arc::new(Tollgate::new(MemoryStore::new()));
    /// # let policy = Policy::builder("login").limiter(Limiter::new(Dimension::Ip, ["5/15m".parse()?])).build()?;
    ///
    /// let layer = RateLimitLayer::new(gate, policy).count(Count::failures());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn count(mut self, count: Count) -> RateLimitLayer {
        Arc::make_mut(&mut self.config).count = count;
        self
    }

    /// Builds the response for rejected requests, with any body (default: the
    /// [`Rejection::into_http_response`] in the layer's [header style](Self::header_style), or
    /// [`Rejection::into_grpc_response`] for a gRPC request).
    #[must_use]
    pub fn on_rejection<F, B>(mut self, f: F) -> RateLimitLayer
    where
        F: Fn(Rejection) -> Response<B> + Send + Sync + 'static,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<crate::BoxError>,
    {
        Arc::make_mut(&mut self.config).on_rejection = Some(on_rejection(f));
        self
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> RateLimitService<S> {
        RateLimitService {
            inner,
            config: self.config.clone(),
        }
    }
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy", &self.config.policy.scope())
            .finish_non_exhaustive()
    }
}
