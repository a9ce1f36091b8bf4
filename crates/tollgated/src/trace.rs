//! Request spans (tower-http's `TraceLayer`), when the log filter asks for them.
//!
//! With `RUST_LOG=info,tower_http=debug` every HTTP request and gRPC call gets a span (method,
//! URI, version) that the handlers' own log lines carry, and a line when it ends (status,
//! latency) or fails. The filter is read once, at start-up: without it the layer is not
//! installed at all, so the request path pays nothing.

use tower::{
    ServiceBuilder,
    layer::util::{Identity, Stack},
    util::{Either, MapResponseLayer, option_layer},
};
use tower_http::{
    classify::{GrpcEosErrorsAsFailures, GrpcErrorsAsFailures, SharedClassifier},
    trace::{ResponseBody, TraceLayer},
};

/// Whether the log filter shows request spans.
fn wanted() -> bool {
    tracing::enabled!(target: "tower_http::trace", tracing::Level::DEBUG)
}

/// The HTTP API's router, with request spans if they are wanted.
pub(crate) fn http(router: axum::Router) -> axum::Router {
    if wanted() {
        router.layer(TraceLayer::new_for_http())
    } else {
        router
    }
}

type GrpcTraced = axum::http::Response<ResponseBody<tonic::body::Body, GrpcEosErrorsAsFailures>>;

/// The gRPC server's answers keep their body type whether they are traced or not.
fn grpc_body(response: GrpcTraced) -> axum::http::Response<tonic::body::Body> {
    response.map(tonic::body::Body::new)
}

/// The layer of request spans for the gRPC server, if they are wanted.
pub(crate) type GrpcLayer = Either<
    Stack<
        TraceLayer<SharedClassifier<GrpcErrorsAsFailures>>,
        Stack<
            MapResponseLayer<fn(GrpcTraced) -> axum::http::Response<tonic::body::Body>>,
            Identity,
        >,
    >,
    Identity,
>;

pub(crate) fn grpc() -> GrpcLayer {
    option_layer(wanted().then(|| {
        ServiceBuilder::new()
            .map_response(grpc_body as fn(GrpcTraced) -> _)
            .layer(TraceLayer::new_for_grpc())
            .into_inner()
    }))
}
