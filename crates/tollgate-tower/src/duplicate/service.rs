use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tollgate::{Acquire, Duplicate, DuplicateState, Fingerprint};
use tower_service::Service;

use super::{
    DuplicateFuture,
    body::{Buffered, buffer},
    layer::{Config, IDEMPOTENCY_KEY, Mode},
    stored,
};
use crate::{
    body::{BoxError, GateBody, LayerBody},
    gate::{LeaseGuard, Undo, owned_check},
    headers::HeaderStyle,
    identity::identity_of,
    rejection::{Rejection, grpc_type},
};

/// The service of a [`DuplicateLayer`](crate::DuplicateLayer).
///
/// The inner service receives a [`GateBody`] around the request's body (which the guard may
/// have read to fingerprint it), and answers in its own body type ([`LayerBody`]).
#[derive(Clone)]
pub struct DuplicateService<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config>,
}

impl<S, B, ResBody> Service<Request<B>> for DuplicateService<S>
where
    S: Service<Request<GateBody<B>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + LayerBody + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = DuplicateFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        DuplicateFuture {
            inner: Box::pin(guarded(config, inner, request)),
        }
    }
}

async fn guarded<S, B, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<B>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<GateBody<B>>, Response = Response<ResBody>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + LayerBody + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let grpc = grpc_type(request.headers()).cloned();
    let reject = |rejection: Rejection| {
        rejection.answer(
            config.on_rejection.as_ref(),
            HeaderStyle::Draft,
            grpc.as_ref(),
        )
    };
    let mut identity = identity_of(&request, &config.resolver, config.wanted.as_slice());
    if config.mode == Mode::Key {
        match idempotency_key(&request) {
            Ok(Some(key)) => identity = identity.with_header(IDEMPOTENCY_KEY, key),
            Ok(None) if !config.require_key => {
                return inner.call(request.map(GateBody::new)).await;
            }
            Ok(None) => {
                return Ok(reject(Rejection::BadKey(
                    "this endpoint requires an Idempotency-Key header",
                )));
            }
            Err(why) => return Ok(reject(Rejection::BadKey(why))),
        }
    }
    let (request, fingerprint) = match config.mode {
        Mode::Key | Mode::Args => match fingerprint(request, config.max_body).await {
            Ok(read) => read,
            Err(rejection) => return Ok(reject(rejection)),
        },
        Mode::Identity => (request.map(GateBody::new), Fingerprint::empty()),
    };
    // On a task of its own: a client gone while the lock is taken at the store leaves it
    // free, not held until its TTL (a minute for a key) against the client's retry.
    let acquiring = {
        let (gate, guard) = (config.gate.clone(), config.guard.clone());
        let who = identity.clone();
        async move { gate.acquire(&guard, &who, &fingerprint).await }
    };
    let gate = config.gate.clone();
    let unheard: Undo<Acquire> = Box::new(move |acquired| {
        Box::pin(async move {
            if let Acquire::Acquired(lease) = acquired {
                let _ = gate.release(&lease).await;
            }
        })
    });
    let acquired = owned_check(acquiring, unheard).await;
    let lease = match acquired {
        Ok(Acquire::Acquired(lease)) => lease,
        Ok(Acquire::Duplicate(duplicate)) => {
            return Ok(match answer_duplicate(&config, duplicate) {
                Ok(replay) => replay.map(ResBody::full),
                Err(rejection) => reject(rejection),
            });
        }
        Err(error) => return Ok(reject(Rejection::from_check_error(error))),
    };
    let started = Instant::now();
    let mut lease = LeaseGuard::new(config.gate.clone(), lease);
    let response = match inner.call(request).await {
        Ok(response) => response,
        Err(error) => {
            lease.release().await;
            return Err(error);
        }
    };
    // A failed gRPC call (its status in the headers) as its HTTP status would be. A server
    // failure, or a refusal that ran nothing (429: an inner rate limit), may be tried again.
    let status = crate::rate_limit::counted_status(response.status(), response.headers());
    if status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS {
        lease.release().await;
        return Ok(response);
    }
    if config.mode != Mode::Key {
        // Repeats stay refused until the TTL counted from the first request ends.
        let left = config.ttl.saturating_sub(started.elapsed());
        lease.complete(Vec::new(), left).await;
        return Ok(response);
    }
    // The operation ran: a client gone while its response is read must not let a repeat run
    // it again.
    lease.done(config.replay_for);
    let (parts, body) = response.into_parts();
    match buffer(Box::pin(body), config.max_response).await {
        Buffered::Whole(bytes) => {
            // An empty record marks "completed, not replayable".
            // A key no user owns is anyone's: its replay sets no cookie.
            let cookies = identity.user_id().is_some();
            let record = stored::encode(&parts, &bytes, cookies).unwrap_or_default();
            lease.complete(record, config.replay_for).await;
            Ok(Response::from_parts(parts, ResBody::full(bytes)))
        }
        Buffered::Unstored(rest) => {
            lease.complete(Vec::new(), config.replay_for).await;
            let rest = rest.map_err(Into::into).boxed_unsync();
            Ok(Response::from_parts(parts, ResBody::boxed(rest)))
        }
        Buffered::Failed(error) => {
            // The handler's response broke off: treat it as a server failure, retryable.
            lease.release().await;
            let detail = format!("the response body failed: {error}");
            let mut response = Response::new(ResBody::full(Bytes::from(detail)));
            *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            Ok(response)
        }
    }
}

/// The request's idempotency key: `Ok(None)` if absent, `Err` if malformed. Both the
/// structured-field form (`"abc"`) and the bare token are accepted.
fn idempotency_key<B>(request: &Request<B>) -> Result<Option<String>, &'static str> {
    let mut values = request.headers().get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("send one Idempotency-Key header, not several");
    }
    let text = value
        .to_str()
        .map_err(|_| "the Idempotency-Key must be visible ASCII")?;
    Ok(Some(tollgate::idempotency_key(text)?.to_owned()))
}

/// Reads the body (up to `cap` bytes) and fingerprints method, path, query and body; gives
/// back the request with the buffered body.
async fn fingerprint<B>(
    request: Request<B>,
    cap: usize,
) -> Result<(Request<GateBody<B>>, Fingerprint), Rejection>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > cap as u64) {
        return Err(Rejection::PayloadTooLarge { cap });
    }
    let (parts, body) = request.into_parts();
    let bytes = match Limited::new(body, cap).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(Rejection::PayloadTooLarge { cap });
        }
        Err(error) => return Err(Rejection::BadBody(error.to_string())),
    };
    let fingerprint = Fingerprint::of_args([
        ("method", parts.method.as_str().as_bytes()),
        ("path", parts.uri.path().as_bytes()),
        ("query", parts.uri.query().unwrap_or("").as_bytes()),
        ("body", &bytes[..]),
    ]);
    Ok((
        Request::from_parts(parts, GateBody::full(bytes)),
        fingerprint,
    ))
}

/// The answer to a repeat: a replay, or the rejection that explains the refusal.
fn answer_duplicate(config: &Config, duplicate: Duplicate) -> Result<Response<Bytes>, Rejection> {
    let message = duplicate.message(config.guard.by());
    if config.mode == Mode::Key && !duplicate.fingerprint_matches {
        return Err(Rejection::KeyReused);
    }
    match duplicate.state {
        DuplicateState::InProgress => Err(Rejection::InProgress {
            retry_after: duplicate.retry_after,
            message,
        }),
        DuplicateState::Completed => {
            let replay = (config.mode == Mode::Key)
                .then_some(duplicate.response)
                .flatten()
                .and_then(stored::decode);
            match replay {
                Some(mut response) => {
                    // `Idempotent-Replayed` is the name public APIs use; the older
                    // `Idempotency-Replayed` is kept for clients that read it.
                    let headers = response.headers_mut();
                    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
                    headers.insert("idempotency-replayed", HeaderValue::from_static("true"));
                    Ok(response)
                }
                None => Err(Rejection::Repeated {
                    retry_after: duplicate.retry_after,
                    message,
                }),
            }
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for DuplicateService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DuplicateService")
            .field("inner", &self.inner)
            .field("scope", &self.config.scope)
            .finish_non_exhaustive()
    }
}

impl<S> DuplicateService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, the layer gone.
    pub fn into_inner(self) -> S {
        self.inner
    }
}
