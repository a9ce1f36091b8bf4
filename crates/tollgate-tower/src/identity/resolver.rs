//! Builds the [`Identity`] of an HTTP request.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use http::{Extensions, HeaderMap, HeaderName, Request};
use tollgate::{Identity, IpNet};

use super::client_ip::{ForwardedHeader, Trust, client_ip};

/// The address of the connection's peer, for servers that do not record it where the resolver
/// looks: with the `axum` feature, axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`); with the `tonic` feature, tonic's
/// `TcpConnectInfo`. A hyper service inserts it into each request's extensions itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The authenticated user, as the application's auth layer puts it in the request's
/// extensions; see [`IdentityResolver::user`].
///
/// ```
/// use tollgate_tower::AuthUser;
///
/// #[derive(Clone)]
/// struct CurrentUser { id: u64, login: String }
///
/// impl AuthUser for CurrentUser {
///     fn user_id(&self) -> Option<String> { Some(self.id.to_string()) }
///     fn user_name(&self) -> Option<String> { Some(self.login.clone()) }
/// }
/// ```
pub trait AuthUser: Send + Sync + 'static {
    /// The user's id, for `user_id` dimensions.
    fn user_id(&self) -> Option<String>;

    /// The user's name, for `user_name` dimensions.
    fn user_name(&self) -> Option<String> {
        None
    }
}

type Enrich = Arc<dyn Fn(Identity, &HeaderMap, &Extensions) -> Identity + Send + Sync>;

/// Turns an HTTP request into the [`Identity`] that limiters count by.
///
/// - The client IP is the connection's peer ([`PeerAddr`], or what axum and tonic record: see
///   there).
///   Only if the peer is one of the [trusted proxies](Self::trust_proxy) is the forwarding
///   header believed, walked from the right past trusted hops: a client that is not a trusted
///   proxy cannot choose its IP with a header.
/// - The user id and name come from the [`AuthUser`] that the application's auth layer put in
///   the request's extensions ([`user`](Self::user)), or from a closure
///   ([`enrich`](Self::enrich)).
/// - The headers named with [`header`](Self::header) are copied, for `header:<name>`
///   dimensions. (The rate-limit layer also copies the headers its own policy counts by.)
///
/// ```
/// use tollgate_tower::{ForwardedHeader, IdentityResolver};
///
/// let resolver = IdentityResolver::new()
///     .trust_proxy("10.0.0.0/8".parse()?)
///     .forwarded_header(ForwardedHeader::XForwardedFor)
///     .header("x-api-key");
/// # let _ = resolver;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct IdentityResolver {
    trusted: Vec<IpNet>,
    trusted_hops: usize,
    forwarded: ForwardedHeader,
    headers: Vec<HeaderName>,
    enrich: Vec<Enrich>,
}

impl IdentityResolver {
    /// A resolver that takes the peer address as the client IP and knows no user.
    pub fn new() -> IdentityResolver {
        IdentityResolver::default()
    }

    /// Believes the forwarding header when the peer (and each hop) is in `net`.
    #[must_use]
    pub fn trust_proxy(mut self, net: IpNet) -> IdentityResolver {
        self.trusted.push(net);
        self
    }

    /// Trusts every network of `nets`; see [`trust_proxy`](Self::trust_proxy).
    #[must_use]
    pub fn trust_proxies(mut self, nets: impl IntoIterator<Item = IpNet>) -> IdentityResolver {
        self.trusted.extend(nets);
        self
    }

    /// Believes the nearest `hops` hops, whatever their addresses: the peer and the `hops - 1`
    /// nearest entries of the forwarding header are proxies, and the next entry is the client
    /// (the leftmost, if the chain is shorter). For proxies whose addresses are not known in
    /// advance, such as a cloud load balancer (`trust_hops(1)`); counted hops and
    /// [trusted networks](Self::trust_proxy) add up. Only right if every request comes
    /// through exactly that many proxies: a client that reaches the server directly chooses
    /// its address.
    #[must_use]
    pub fn trust_hops(mut self, hops: usize) -> IdentityResolver {
        self.trusted_hops = hops;
        self
    }

    /// Which header the trusted proxies write (default `X-Forwarded-For`).
    #[must_use]
    pub fn forwarded_header(mut self, header: ForwardedHeader) -> IdentityResolver {
        self.forwarded = header;
        self
    }

    /// Copies the header `name` into the identity, for `header:<name>` dimensions.
    ///
    /// # Panics
    /// If `name` is not a valid header name.
    #[must_use]
    pub fn header(mut self, name: &str) -> IdentityResolver {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("{name:?} is not a valid header name"));
        self.headers.push(name);
        self
    }

    /// Reads the user from the `U` that the application's auth layer inserted into the
    /// request's extensions.
    #[must_use]
    pub fn user<U: AuthUser>(self) -> IdentityResolver {
        self.enrich(|mut identity, _, extensions| {
            if let Some(user) = extensions.get::<U>() {
                if let Some(id) = user.user_id() {
                    identity = identity.with_user_id(id);
                }
                if let Some(name) = user.user_name() {
                    identity = identity.with_user_name(name);
                }
            }
            identity
        })
    }

    /// Lets `f` add facts to the identity from the request's headers and extensions.
    #[must_use]
    pub fn enrich(
        mut self,
        f: impl Fn(Identity, &HeaderMap, &Extensions) -> Identity + Send + Sync + 'static,
    ) -> IdentityResolver {
        self.enrich.push(Arc::new(f));
        self
    }

    /// The identity of `request`.
    pub fn resolve<B>(&self, request: &Request<B>) -> Identity {
        let headers = request.headers();
        let extensions = request.extensions();
        let trust = Trust {
            nets: &self.trusted,
            hops: self.trusted_hops,
        };
        // Built whole where it stays: an identity moved through `with_ip` is copied.
        let mut identity = match peer_ip(extensions) {
            Some(peer) => Identity::new().with_ip(client_ip(peer, headers, trust, self.forwarded)),
            None => Identity::new(),
        };
        for name in &self.headers {
            if let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) {
                identity = identity.with_header(name.as_str(), value);
            }
        }
        for f in &self.enrich {
            identity = f(identity, headers, extensions);
        }
        identity
    }
}

fn peer_ip(extensions: &Extensions) -> Option<IpAddr> {
    if let Some(PeerAddr(addr)) = extensions.get::<PeerAddr>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(addr.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
    {
        return Some(addr.ip());
    }
    None
}

impl fmt::Debug for IdentityResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityResolver")
            .field("trusted", &self.trusted)
            .field("trusted_hops", &self.trusted_hops)
            .field("forwarded", &self.forwarded)
            .field("headers", &self.headers)
            .field("enrich", &self.enrich.len())
            .finish()
    }
}

/// The identity the request already carries (put there by the context layer), or the one
/// `resolver` builds, plus the headers `wanted` that it lacks.
pub(crate) fn identity_of<B>(
    request: &Request<B>,
    resolver: &IdentityResolver,
    wanted: &[HeaderName],
) -> Identity {
    let mut identity = match request.extensions().get::<Identity>() {
        Some(identity) => identity.clone(),
        None => resolver.resolve(request),
    };
    for name in wanted {
        if identity.header(name.as_str()).is_none() {
            if let Some(value) = request.headers().get(name).and_then(|v| v.to_str().ok()) {
                identity = identity.with_header(name.as_str(), value);
            }
        }
    }
    identity
}
