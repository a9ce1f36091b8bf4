//! Who is asking: the client IP behind trusted proxies, the authenticated user, headers.
//!
//! The rate-limit and duplicate layers use the [`Identity`](tollgate::Identity) that the
//! [`ContextLayer`](crate::ContextLayer) put in the request's extensions, or else build one
//! with their own [`IdentityResolver`] (by default: the peer address, no user).

mod client_ip;
mod resolver;

pub use client_ip::ForwardedHeader;
pub(crate) use resolver::identity_of;
pub use resolver::{AuthUser, IdentityResolver, PeerAddr};
