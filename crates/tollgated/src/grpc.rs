//! The gRPC port's services, chosen by the service name at the start of the request path.
//!
//! Three services share the port: Envoy's `RateLimitService`, its rate-limit quota service
//! (`RateLimitQuotaService`, RLQS) and `grpc.health.v1.Health`. A general router (tonic's
//! `Routes`) matches the path through a route table and converts every body on the way; this
//! picks a service with a prefix comparison or two. Health `Watch`
//! streams, which never end on their own, are bounded (`server.max_health_watches`).

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures_util::future::Either;
use hyper::{Request, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{body::Body, server::NamedService};
use tower::Service;

use crate::{
    app::App,
    auth::{Refusal, Scope},
};

/// Admits a request to a gRPC check service (`ShouldRateLimit`, an RLQS stream) as the HTTP
/// API's check scope admits its requests: with `server.check_token_env` set, its
/// `authorization` metadata must carry `Bearer <token>` (Envoy sends it as the rate-limit
/// service's `initial_metadata`), and failures count against the caller's address.
pub(crate) async fn authorize_check<T>(
    app: &App,
    request: &tonic::Request<T>,
    method: &str,
) -> Result<(), tonic::Status> {
    // An open scope costs one branch.
    if !app.auth.guarded(Scope::Check) {
        return Ok(());
    }
    let offered = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::bearer);
    let client = request.remote_addr().map(|addr| addr.ip());
    match app
        .auth
        .authorize(Scope::Check, offered, client, method)
        .await
    {
        Ok(()) => Ok(()),
        Err(Refusal::Missing | Refusal::Disabled) => Err(tonic::Status::unauthenticated(format!(
            "{method}: send the metadata authorization: Bearer <token> (the check scope's, server.check_token_env)"
        ))),
        Err(Refusal::Wrong) => Err(tonic::Status::unauthenticated(format!(
            "{method}: wrong token"
        ))),
        Err(Refusal::TooManyFailures(retry_after)) => {
            Err(tonic::Status::resource_exhausted(format!(
                "{method}: too many failed authentications from this address; retry in {}",
                crate::auth::whole_seconds(retry_after)
            )))
        }
    }
}

/// The path of the health service's streaming method.
const WATCH: &str = "/grpc.health.v1.Health/Watch";

/// Sends a request whose path names `E`'s service to `envoy`, one naming `Q`'s to `quotas`,
/// every other request to `health` (which answers `UNIMPLEMENTED` for a path it does not
/// serve, as a router would).
#[derive(Clone)]
pub(crate) struct GrpcServices<E, Q, H> {
    envoy: E,
    quotas: Q,
    health: H,
    /// One permit per Watch stream that may be open.
    watches: Arc<Semaphore>,
}

impl<E: NamedService, Q: NamedService, H> GrpcServices<E, Q, H> {
    pub(crate) fn new(envoy: E, quotas: Q, health: H, max_watches: usize) -> GrpcServices<E, Q, H> {
        GrpcServices {
            envoy,
            quotas,
            health,
            watches: Arc::new(Semaphore::new(max_watches)),
        }
    }

    /// Whether `path` (`/package.Service/Method`) names the Envoy service.
    fn is_envoy(path: &str) -> bool {
        names::<E>(path)
    }
}

/// Whether `path` (`/package.Service/Method`) names `S`.
fn names<S: NamedService>(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(S::NAME))
        .is_some_and(|rest| rest.starts_with('/'))
}

/// A health answer: at once (a refused Watch), or the health service's, holding a Watch's
/// permit in its body.
type HealthFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<E, Q, H, B> Service<Request<B>> for GrpcServices<E, Q, H>
where
    E: Service<Request<B>, Response = Response<Body>, Error = Infallible> + NamedService,
    Q: Service<Request<B>, Response = Response<Body>, Error = Infallible> + NamedService,
    Q::Future: Send + 'static,
    H: Service<Request<B>, Response = Response<Body>, Error = Infallible>,
    H::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<E::Future, HealthFuture>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // tonic's generated services are always ready; ask each all the same.
        match (
            self.envoy.poll_ready(cx),
            self.quotas.poll_ready(cx),
            self.health.poll_ready(cx),
        ) {
            (Poll::Ready(Ok(())), Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => Poll::Ready(Ok(())),
            _ => Poll::Pending,
        }
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if Self::is_envoy(request.uri().path()) {
            return Either::Left(self.envoy.call(request));
        }
        if names::<Q>(request.uri().path()) {
            // A stream that lasts as long as its Envoy: boxed, as the health answers are.
            return Either::Right(Box::pin(self.quotas.call(request)));
        }
        if request.uri().path() != WATCH {
            return Either::Right(Box::pin(self.health.call(request)));
        }
        let Ok(permit) = self.watches.clone().try_acquire_owned() else {
            let refused = tonic::Status::resource_exhausted(
                "too many health Watch streams are open (server.max_health_watches); use Check",
            );
            return Either::Right(Box::pin(std::future::ready(Ok(refused.into_http()))));
        };
        let answer = self.health.call(request);
        Either::Right(Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| {
                Body::new(Held {
                    body,
                    _permit: permit,
                })
            }))
        }))
    }
}

/// A response body that holds a permit until it is dropped.
struct Held {
    body: Body,
    _permit: OwnedSemaphorePermit,
}

impl http_body::Body for Held {
    type Data = <Body as http_body::Body>::Data;
    type Error = <Body as http_body::Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::{
        rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer,
        ratelimit::v3::rate_limit_service_server::RateLimitServiceServer,
    };

    use super::*;
    use crate::{envoy::RateLimiter, rlqs::Quotas};

    type Envoy = RateLimitServiceServer<RateLimiter>;
    type Rlqs = RateLimitQuotaServiceServer<Quotas>;

    #[test]
    fn a_service_is_picked_by_its_whole_name() {
        assert!(names::<Envoy>(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ));
        assert!(!names::<Envoy>("/grpc.health.v1.Health/Check"));
        assert!(!names::<Envoy>(
            "/envoy.service.ratelimit.v3.RateLimitServiceX/ShouldRateLimit"
        ));
        assert!(!names::<Envoy>(
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ));
        assert!(!names::<Envoy>("/"));
        let stream =
            "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";
        assert!(names::<Rlqs>(stream));
        assert!(!names::<Envoy>(stream));
        assert!(!names::<Rlqs>(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ));
    }
}
