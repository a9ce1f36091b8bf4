//! The gRPC port's services, chosen by the service name at the start of the request path.
//!
//! Two services share the port: Envoy's `RateLimitService` and `grpc.health.v1.Health`. A
//! general router (tonic's `Routes`) matches the path through a route table and converts every
//! body on the way; this picks one of two services with one prefix comparison.

use std::{
    convert::Infallible,
    task::{Context, Poll},
};

use futures_util::future::Either;
use hyper::{Request, Response};
use tonic::{body::Body, server::NamedService};
use tower::Service;

/// Sends a request whose path names `E`'s service to `envoy`, every other request to `health`
/// (which answers `UNIMPLEMENTED` for a path it does not serve, as a router would).
#[derive(Clone)]
pub(crate) struct GrpcServices<E, H> {
    envoy: E,
    health: H,
}

impl<E: NamedService, H> GrpcServices<E, H> {
    pub(crate) fn new(envoy: E, health: H) -> GrpcServices<E, H> {
        GrpcServices { envoy, health }
    }

    /// Whether `path` (`/package.Service/Method`) names the Envoy service.
    fn is_envoy(path: &str) -> bool {
        path.strip_prefix('/')
            .and_then(|p| p.strip_prefix(E::NAME))
            .is_some_and(|rest| rest.starts_with('/'))
    }
}

impl<E, H, B> Service<Request<B>> for GrpcServices<E, H>
where
    E: Service<Request<B>, Response = Response<Body>, Error = Infallible> + NamedService,
    H: Service<Request<B>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<E::Future, H::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // tonic's generated services are always ready; ask both all the same.
        match (self.envoy.poll_ready(cx), self.health.poll_ready(cx)) {
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => Poll::Ready(Ok(())),
            _ => Poll::Pending,
        }
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if Self::is_envoy(request.uri().path()) {
            Either::Left(self.envoy.call(request))
        } else {
            Either::Right(self.health.call(request))
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

    use super::*;
    use crate::envoy::RateLimiter;

    type Services = GrpcServices<RateLimitServiceServer<RateLimiter>, ()>;

    #[test]
    fn the_envoy_service_is_picked_by_its_whole_name() {
        assert!(Services::is_envoy(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ));
        assert!(!Services::is_envoy("/grpc.health.v1.Health/Check"));
        assert!(!Services::is_envoy(
            "/envoy.service.ratelimit.v3.RateLimitServiceX/ShouldRateLimit"
        ));
        assert!(!Services::is_envoy(
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ));
        assert!(!Services::is_envoy("/"));
    }
}
