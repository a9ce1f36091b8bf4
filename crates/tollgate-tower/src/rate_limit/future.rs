use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tollgate::{CheckError, Decision};
use tower_service::Service;

use super::layer::Config;
use crate::{body::GateBody, engine::BoxFuture, headers::HeaderStyle, rejection::Rejection};

pin_project! {
    /// The response future of [`RateLimitService`](crate::RateLimitService): first the check,
    /// then (if allowed) the inner service's future.
    pub struct RateLimitFuture<S, B, F> {
        #[pin]
        state: State<S, B, F>,
        config: Arc<Config>,
        // The request is gRPC's: a rejection answers with a gRPC status.
        grpc: bool,
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
        grpc: bool,
    ) -> RateLimitFuture<S, B, F> {
        RateLimitFuture {
            state: State::Checking {
                check,
                call: Some((inner, request)),
            },
            config,
            grpc,
        }
    }
}

impl<S, B, ResBody> Future for RateLimitFuture<S, B, S::Future>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<GateBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, call } => {
                    let decision = match ready!(check.as_mut().poll(cx)) {
                        Ok(decision) => decision,
                        Err(error) => {
                            let rejection = Rejection::from_check_error(error);
                            return Poll::Ready(Ok(reject(this.config, rejection, *this.grpc)));
                        }
                    };
                    if !decision.allowed() {
                        let rejection = Rejection::denied(decision);
                        return Poll::Ready(Ok(reject(this.config, rejection, *this.grpc)));
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
                    let mut response = response.map(GateBody::new);
                    if let Some(decision) = decision.take() {
                        let headers = response.headers_mut();
                        this.config
                            .fields
                            .insert(this.config.style, &decision, headers);
                    }
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}

fn reject<B>(config: &Config, rejection: Rejection, grpc: bool) -> Response<GateBody<B>> {
    rejection.answer(config.on_rejection.as_ref(), config.style, grpc)
}
