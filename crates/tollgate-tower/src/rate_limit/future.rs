use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use axum::{body::Body, response::IntoResponse};
use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tollgate::{CheckError, Decision};
use tower_service::Service;

use super::layer::Config;
use crate::{
    engine::BoxFuture,
    headers::{HeaderStyle, RATELIMIT, RATELIMIT_POLICY, insert_single_rule},
    rejection::Rejection,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// The response future of [`RateLimitService`](crate::RateLimitService): first the check,
    /// then (if allowed) the inner service's future.
    pub struct RateLimitFuture<S, B, F> {
        #[pin]
        state: State<S, B, F>,
        config: Arc<Config>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, F> {
        Checking {
            check: BoxFuture<'static, Result<Decision, CheckError>>,
            call: Option<(S, Request<B>)>,
        },
        Calling {
            #[pin]
            future: F,
            decision: Option<Decision>,
        },
    }
}

impl<S, B, F> RateLimitFuture<S, B, F> {
    pub(crate) fn new(
        check: BoxFuture<'static, Result<Decision, CheckError>>,
        inner: S,
        request: Request<B>,
        config: Arc<Config>,
    ) -> RateLimitFuture<S, B, F> {
        RateLimitFuture {
            state: State::Checking {
                check,
                call: Some((inner, request)),
            },
            config,
        }
    }
}

impl<S, B, ResBody> Future for RateLimitFuture<S, B, S::Future>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response<Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, call } => {
                    let decision = match ready!(check.as_mut().poll(cx)) {
                        Ok(decision) => decision,
                        Err(error) => {
                            return Poll::Ready(Ok(reject(
                                this.config,
                                Rejection::from_check_error(error),
                            )));
                        }
                    };
                    if !decision.allowed() {
                        let rejection = Rejection::denied(decision);
                        return Poll::Ready(Ok(reject(this.config, rejection)));
                    }
                    let Some((mut inner, request)) = call.take() else {
                        unreachable!("the inner call is taken once");
                    };
                    let future = inner.call(request);
                    let decision = (this.config.style != HeaderStyle::None).then_some(decision);
                    this.state.set(State::Calling { future, decision });
                }
                StateProj::Calling { future, decision } => {
                    let response = ready!(future.poll(cx))?;
                    let mut response = response.map(Body::new);
                    if let Some(decision) = decision.take() {
                        let headers = response.headers_mut();
                        match this.config.style {
                            HeaderStyle::Draft => this.config.fields.insert(&decision, headers),
                            style => insert_single_rule(style, decision.rules(), headers),
                        }
                    }
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}

fn reject(config: &Config, rejection: Rejection) -> Response<Body> {
    if let Some(f) = &config.on_rejection {
        return f(rejection);
    }
    if matches!(config.style, HeaderStyle::Draft | HeaderStyle::None) {
        return rejection.into_response();
    }
    // Another style: the rejection's draft fields replaced by the layer's.
    let rules = match &rejection {
        Rejection::RateLimited(decision) => decision.rules().to_vec(),
        _ => Vec::new(),
    };
    let mut response = rejection.into_response();
    let headers = response.headers_mut();
    headers.remove(RATELIMIT);
    headers.remove(RATELIMIT_POLICY);
    insert_single_rule(config.style, &rules, headers);
    response
}
