use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use http::{HeaderMap, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tollgate::{CheckError, Decision, Identity, Reason};
use tower_service::Service;

use super::{
    Count, FailedOpen,
    count::{Charge, Held, counted_status, receipt_of},
    layer::Config,
};
use crate::{
    body::LayerBody,
    gate::{BoxFuture, Slot, detached},
    headers::HeaderStyle,
    rejection::{Rejection, grpc_type},
};

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
        // What the request was charged.
        cost: u64,
    }
}

/// A check awaiting the store.
pub(crate) type Checking = BoxFuture<'static, Result<Decision, CheckError>>;

// The states that only some requests reach (awaiting a networked store, held for their units,
// charged or holding a concurrency slot) keep what they need on the heap: the future of every
// request is moved several times on its way, and its size is that of its largest state. The
// layer's configuration is held only by the states that read it: an admitted request whose
// response gets no fields takes no reference to it (two atomic operations fewer).
pin_project! {
    #[project = StateProj]
    enum State<S, B, F, R, E> {
        Checking {
            check: Checking,
            // The inner service and the request, and the identity, kept for a refund (see
            // `Count`).
            call: Option<Box<(S, Request<B>, Option<Identity>)>>,
            config: Arc<Config>,
        },
        // Admitted, its units due later (see `RateLimitLayer::max_delay`): held until then.
        Delaying {
            delayed: Pin<Box<Delayed<S, B>>>,
        },
        Calling {
            #[pin]
            future: F,
            // The decision the response's fields are written from, when it gets them.
            fields: Option<(Decision, Arc<Config>)>,
            charge: Option<Box<Charge>>,
            slot: Option<Box<Slot>>,
            failed_open: bool,
        },
        Refunding {
            refund: BoxFuture<'static, ()>,
            output: Option<Result<Response<R>, E>>,
            slot: Option<Box<Slot>>,
        },
        // Refused when the layer was called.
        Refused {
            response: Option<Response<R>>,
        },
    }
}

pin_project! {
    /// A request admitted with its units due later, held until then.
    #[project = DelayedProj]
    struct Delayed<S, B> {
        #[pin]
        sleep: tokio::time::Sleep,
        call: Option<(S, Request<B>)>,
        decision: Option<Decision>,
        identity: Option<Identity>,
        held: Option<Held>,
        // The concurrency slot, held (its lease renewed) while the request waits.
        slot: Option<Box<Slot>>,
        config: Arc<Config>,
    }
}

impl<S: Service<Request<B>>, B, R: LayerBody> RateLimitFuture<S, B, S::Future, R> {
    /// A request whose check awaits the store: `inner` is called once it admits.
    pub(crate) fn waiting(
        check: Checking,
        inner: S,
        request: Request<B>,
        config: Arc<Config>,
        identity: Option<Identity>,
        cost: u64,
    ) -> RateLimitFuture<S, B, S::Future, R> {
        RateLimitFuture {
            state: State::Checking {
                check,
                call: Some(Box::new((inner, request, identity))),
                config,
            },
            cost,
        }
    }

    /// A request whose check was decided when the layer was called: refused at once, or passed
    /// to `inner` (ready: `poll_ready` said so) at once, without a clone of it.
    #[inline(always)]
    pub(crate) fn decided(
        decided: Result<Decision, CheckError>,
        inner: &mut S,
        request: Request<B>,
        config: &Arc<Config>,
        identity: Option<Identity>,
        cost: u64,
    ) -> RateLimitFuture<S, B, S::Future, R> {
        // The decision is moved once, into the state: it is large.
        let state = match decided {
            Ok(decision) if decision.allowed() => {
                let slot = slot_of(&decision, config, identity.as_ref());
                call((decision, slot), inner, request, config, identity, cost)
            }
            refused => State::Refused {
                response: Some(refuse(refused, config, request.headers())),
            },
        };
        RateLimitFuture { state, cost }
    }
}

/// The response refusing a request that was not admitted (denied, or not checked), in gRPC's
/// terms when its `headers` are a gRPC request's.
#[inline(never)]
fn refuse<R: LayerBody>(
    refused: Result<Decision, CheckError>,
    config: &Config,
    headers: &HeaderMap,
) -> Response<R> {
    let rejection = match refused {
        Ok(decision) => Rejection::denied(decision, &config.policy),
        Err(error) => Rejection::from_check_error(error),
    };
    reject(config, rejection, grpc_type(headers))
}

/// The concurrency slot an admitted request holds, if its policy has concurrency limits: from
/// its admission, so that a request waiting its turn (`max_delay`) renews its lease while it
/// waits (a wait past two thirds of the lease TTL lost the lease before its first renewal).
fn slot_of(
    decision: &Decision,
    config: &Arc<Config>,
    identity: Option<&Identity>,
) -> Option<Box<Slot>> {
    match (config.concurrent, identity) {
        (true, Some(identity)) => decision.receipt().map(|receipt| {
            let home = (config.gate.clone(), config.clone());
            Box::new(Slot::new(home, identity.clone(), receipt, config.lease_ttl))
        }),
        _ => None,
    }
}

/// Calls the inner service for an admitted request: what the response then needs (its
/// headers, the request's refund; its concurrency slot, made at its admission).
#[inline(always)]
fn call<S: Service<Request<B>>, B, R>(
    (decision, slot): (Decision, Option<Box<Slot>>),
    inner: &mut S,
    mut request: Request<B>,
    config: &Arc<Config>,
    mut identity: Option<Identity>,
    cost: u64,
) -> State<S, B, S::Future, R, S::Error> {
    let failed_open = decision.reason() == Reason::StoreUnavailable;
    if failed_open {
        request.extensions_mut().insert(FailedOpen);
    }
    // The guards first (the slot is made before): a service that panics in `call` drops them,
    // and they give back.
    let charge = identity
        .take()
        .filter(|_| !matches!(config.count, Count::All) || config.settle.is_some())
        .map(|identity| {
            let receipt = receipt_of(&decision, cost);
            let charge = Charge::new(config.clone(), identity, receipt, cost);
            Box::new(if slot.is_some() {
                charge.leases_apart()
            } else {
                charge
            })
        });
    let fields = (config.style != HeaderStyle::None).then(|| (decision, config.clone()));
    let future = inner.call(request);
    State::Calling {
        future,
        fields,
        charge,
        slot,
        failed_open,
    }
}

impl<S, B, ResBody> Future for RateLimitFuture<S, B, S::Future, ResBody>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    ResBody: LayerBody,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    call,
                    config,
                } => {
                    let polled = ready!(check.as_mut().poll(cx));
                    let Some(taken) = call.take() else {
                        unreachable!("the inner call is taken once");
                    };
                    let decision = match polled {
                        Ok(decision) if decision.allowed() => decision,
                        refused => {
                            let headers = taken.1.headers();
                            return Poll::Ready(Ok(refuse(refused, config, headers)));
                        }
                    };
                    let (mut inner, request, mut identity) = *taken;
                    let slot = slot_of(&decision, config, identity.as_ref());
                    if let Some(due) = decision.due(&config.policy) {
                        let held = identity.as_ref().map(|who| {
                            Held::new(config.clone(), who.clone(), decision.receipt(), *this.cost)
                        });
                        let delayed = Box::pin(Delayed {
                            sleep: tokio::time::sleep(due),
                            call: Some((inner, request)),
                            decision: Some(decision),
                            identity: identity.take(),
                            held,
                            slot,
                            config: config.clone(),
                        });
                        this.state.set(State::Delaying { delayed });
                        continue;
                    }
                    let next = self::call(
                        (decision, slot),
                        &mut inner,
                        request,
                        config,
                        identity.take(),
                        *this.cost,
                    );
                    this.state.set(next);
                }
                StateProj::Delaying { delayed } => {
                    let DelayedProj {
                        sleep,
                        call,
                        decision,
                        identity,
                        held,
                        slot,
                        config,
                    } = delayed.as_mut().project();
                    ready!(sleep.poll(cx));
                    if let Some(held) = held.take() {
                        held.due();
                    }
                    let (Some((mut inner, request)), Some(decision)) =
                        (call.take(), decision.take())
                    else {
                        unreachable!("a held request goes on once");
                    };
                    let next = self::call(
                        (decision, slot.take()),
                        &mut inner,
                        request,
                        config,
                        identity.take(),
                        *this.cost,
                    );
                    this.state.set(next);
                }
                StateProj::Refused { response } => {
                    let Some(response) = response.take() else {
                        unreachable!("a refusal is returned once");
                    };
                    return Poll::Ready(Ok(response));
                }
                StateProj::Calling {
                    future,
                    fields,
                    charge,
                    slot,
                    failed_open,
                } => {
                    // Nothing to add to the response or to do after it (the common case): the
                    // inner service's answer as it is, moved once.
                    if !*failed_open && fields.is_none() && charge.is_none() && slot.is_none() {
                        return future.poll(cx);
                    }
                    let output = ready!(future.poll(cx)).map(|mut response| {
                        if *failed_open {
                            response.extensions_mut().insert(FailedOpen);
                        }
                        // Read where it is: a move would copy it.
                        if let Some((decision, config)) = fields.as_ref() {
                            let headers = response.headers_mut();
                            let (style, policy) = (config.style, &config.policy);
                            config.fields.insert(style, decision, policy, headers);
                        }
                        response
                    });
                    let slot = slot.take();
                    let Some(charge) = charge.take() else {
                        return Poll::Ready(hold(output, slot));
                    };
                    let status =
                        (output.as_ref().ok()).map(|r| counted_status(r.status(), r.headers()));
                    // Refunded or settled before the response goes out: the client's next
                    // request sees it. On a task of its own: a client that goes away meanwhile
                    // does not cancel it.
                    let charge = *charge;
                    let work: BoxFuture<'static, ()> = if !charge.keeps(status) {
                        detached(charge.refund())
                    } else if let Some(cost) = output
                        .as_ref()
                        .ok()
                        .and_then(|r| charge.settled_cost(r.status(), r.headers()))
                    {
                        detached(charge.settle_at(cost))
                    } else {
                        charge.keep();
                        return Poll::Ready(hold(output, slot));
                    };
                    this.state.set(State::Refunding {
                        refund: work,
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
fn hold<B: LayerBody, E>(
    output: Result<Response<B>, E>,
    slot: Option<Box<Slot>>,
) -> Result<Response<B>, E> {
    match (output, slot) {
        (Ok(response), Some(slot)) => Ok(response.map(|body| body.holding(slot))),
        (output, _) => output,
    }
}

fn reject<B: LayerBody>(
    config: &Config,
    rejection: Rejection,
    grpc: Option<&HeaderValue>,
) -> Response<B> {
    rejection.answer(config.on_rejection.as_ref(), config.style, grpc)
}
