use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tollgate::{CheckError, Decision, Identity, Reason};
use tower_service::Service;

use super::{
    Count, FailedOpen,
    count::{Charge, Slot},
    layer::Config,
};
use crate::{body::GateBody, gate::BoxFuture, headers::HeaderStyle, rejection::Rejection};

pin_project! {
    /// The response future of [`RateLimitService`](crate::RateLimitService): first the check,
    /// then (if allowed) the inner service's future, then, for a request that should not count
    /// (see [`Count`](crate::Count)), its refund.
    ///
    /// `R` is the inner service's response body.
    pub struct RateLimitFuture<S, B, F, R>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B, F, R, S::Error>,
        config: Arc<Config>,
        // The request is gRPC's: a rejection answers with a gRPC status.
        grpc: bool,
    }
}

/// A request's check: decided when the layer was called (a store that answers at once), or
/// awaiting the store.
// The decision is held as it is: boxing it would allocate on every check, which is what
// deciding at once saves.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Checking {
    Decided(Option<Result<Decision, CheckError>>),
    Waiting(BoxFuture<'static, Result<Decision, CheckError>>),
}

impl Checking {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Decision, CheckError>> {
        match self {
            Checking::Decided(decided) => {
                Poll::Ready(decided.take().expect("a check's decision is taken once"))
            }
            Checking::Waiting(check) => check.as_mut().poll(cx),
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, F, R, E> {
        Checking {
            check: Checking,
            call: Option<(S, Request<B>)>,
            // The identity, kept for a refund (see `Count`).
            identity: Option<Identity>,
        },
        Calling {
            #[pin]
            future: F,
            decision: Option<Decision>,
            charge: Option<Charge>,
            slot: Option<Slot>,
            failed_open: bool,
        },
        Refunding {
            refund: BoxFuture<'static, ()>,
            output: Option<Result<Response<GateBody<R>>, E>>,
            slot: Option<Slot>,
        },
    }
}

impl<S: Service<Request<B>>, B, F, R> RateLimitFuture<S, B, F, R> {
    pub(crate) fn new(
        check: Checking,
        inner: S,
        request: Request<B>,
        config: Arc<Config>,
        grpc: bool,
        identity: Option<Identity>,
    ) -> RateLimitFuture<S, B, F, R> {
        RateLimitFuture {
            state: State::Checking {
                check,
                call: Some((inner, request)),
                identity,
            },
            config,
            grpc,
        }
    }
}

impl<S, B, ResBody> Future for RateLimitFuture<S, B, S::Future, ResBody>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<GateBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    call,
                    identity,
                } => {
                    let decision = match ready!(check.poll(cx)) {
                        Ok(decision) => decision,
                        Err(error) => {
                            let rejection = Rejection::from_check_error(error);
                            return Poll::Ready(Ok(reject(this.config, rejection, *this.grpc)));
                        }
                    };
                    if !decision.allowed() {
                        let rejection = Rejection::denied(decision, &this.config.policy);
                        return Poll::Ready(Ok(reject(this.config, rejection, *this.grpc)));
                    }
                    let Some((mut inner, mut request)) = call.take() else {
                        unreachable!("the inner call is taken once");
                    };
                    let failed_open = decision.reason() == Reason::StoreUnavailable;
                    if failed_open {
                        request.extensions_mut().insert(FailedOpen);
                    }
                    let future = inner.call(request);
                    let slot = match (this.config.concurrent, decision.receipt(), &*identity) {
                        (true, Some(receipt), Some(identity)) => Some(Slot::new(
                            this.config.clone(),
                            identity.clone(),
                            receipt.clone(),
                        )),
                        _ => None,
                    };
                    let charge = identity
                        .take()
                        .filter(|_| !matches!(this.config.count, Count::All))
                        .map(|identity| {
                            Charge::new(this.config.clone(), identity, decision.receipt().cloned())
                        });
                    let decision = (this.config.style != HeaderStyle::None).then_some(decision);
                    this.state.set(State::Calling {
                        future,
                        decision,
                        charge,
                        slot,
                        failed_open,
                    });
                }
                StateProj::Calling {
                    future,
                    decision,
                    charge,
                    slot,
                    failed_open,
                } => {
                    let output = ready!(future.poll(cx)).map(|response| {
                        let mut response = response.map(GateBody::new);
                        if *failed_open {
                            response.extensions_mut().insert(FailedOpen);
                        }
                        if let Some(decision) = decision.take() {
                            let headers = response.headers_mut();
                            this.config.fields.insert(
                                this.config.style,
                                &decision,
                                &this.config.policy,
                                headers,
                            );
                        }
                        response
                    });
                    let slot = slot.take();
                    let Some(charge) = charge.take() else {
                        return Poll::Ready(hold(output, slot));
                    };
                    let status = output.as_ref().ok().map(Response::status);
                    if charge.keeps(status) {
                        charge.settle();
                        return Poll::Ready(hold(output, slot));
                    }
                    // Refunded before the response goes out: the client's next request sees it.
                    this.state.set(State::Refunding {
                        refund: Box::pin(charge.refund()),
                        output: Some(output),
                        slot,
                    });
                }
                StateProj::Refunding {
                    refund,
                    output,
                    slot,
                } => {
                    ready!(refund.as_mut().poll(cx));
                    let Some(output) = output.take() else {
                        unreachable!("a refunded response is returned once");
                    };
                    return Poll::Ready(hold(output, slot.take()));
                }
            }
        }
    }
}

/// The response, its body holding the request's concurrency slots until it ends (an error of
/// the inner service lets them go at once).
fn hold<B, E>(
    output: Result<Response<GateBody<B>>, E>,
    slot: Option<Slot>,
) -> Result<Response<GateBody<B>>, E> {
    match (output, slot) {
        (Ok(response), Some(slot)) => Ok(response.map(|body| body.holding(Box::new(slot)))),
        (output, _) => output,
    }
}

fn reject<B>(config: &Config, rejection: Rejection, grpc: bool) -> Response<GateBody<B>> {
    rejection.answer(config.on_rejection.as_ref(), config.style, grpc)
}
