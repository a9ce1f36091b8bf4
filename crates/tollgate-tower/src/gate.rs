//! The shared engine handle every layer holds (the engine behind a type-erased store, so that
//! layers and the task-local context need not be generic over the store), its guards, and
//! work a dropped guard still owes.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tollgate::FullStore;
use tollgate::{
    AnyStore, CheckError, Decision, Identity, Lease, Policy, Receipt, StoreError, StoreErrorKind,
    Tollgate,
};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The engine every layer holds: one type whatever the store (see [`Tollgate::erase`]).
pub(crate) type SharedGate = Arc<Tollgate<AnyStore>>;

pub(crate) fn erase<S: FullStore>(gate: Arc<Tollgate<S>>) -> SharedGate {
    Arc::new(gate.erase())
}

/// `work` on a task of its own, so that it finishes even if the future awaiting it is dropped
/// meanwhile (the client went away while a refund or a settlement was on its way to the
/// store); the future returned waits for it. Without a runtime, `work` itself.
pub(crate) fn detached(work: impl Future<Output = ()> + Send + 'static) -> BoxFuture<'static, ()> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let task = runtime.spawn(work);
            Box::pin(async move {
                let _ = task.await;
            })
        }
        Err(_) => Box::pin(work),
    }
}

/// Runs `work` on the current runtime without waiting for it: what a guard dropped before its
/// outcome was known (a panic, a cancelled future) still owes the store. Without a runtime
/// (dropped during shutdown) it does not run, and what it would have undone expires by itself.
pub(crate) fn in_background(work: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(work);
    }
}

/// What gives back an answer (an admission, a lock) whose request went away before it heard
/// of it.
pub(crate) type Undo<T = Decision> = Box<dyn FnOnce(T) -> BoxFuture<'static, ()> + Send>;

/// `check` on a task of its own. A request dropped while its check is at the store (the
/// client went away) never hears the answer, so an admission would keep what it took (a
/// concurrency slot until its lease runs out, a charge the request's outcome was to decide, a
/// duplicate guard's lock until its TTL): then `undo` gives back what the answer took.
/// Without a runtime, `check` itself.
pub(crate) fn owned_check<T: Send + 'static>(
    check: impl Future<Output = Result<T, CheckError>> + Send + 'static,
    undo: Undo<T>,
) -> BoxFuture<'static, Result<T, CheckError>> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Box::pin(check);
    };
    let undo = Arc::new(std::sync::Mutex::new(Some(undo)));
    let (answer, heard) = tokio::sync::oneshot::channel();
    let unheard = undo.clone();
    runtime.spawn(async move {
        if let Err(Ok(answer)) = answer.send(check.await) {
            give_back(&unheard, answer).await;
        }
    });
    Box::pin(Heard {
        heard,
        undo: Some(undo),
    })
}

type SharedUndo<T> = Arc<std::sync::Mutex<Option<Undo<T>>>>;

/// Gives back what an unheard answer took (the undo looks: a denial took nothing).
async fn give_back<T>(undo: &SharedUndo<T>, answer: T) {
    let undo = undo.lock().ok().and_then(|mut undo| undo.take());
    if let Some(undo) = undo {
        undo(answer).await;
    }
}

/// The answer of an [`owned_check`]; dropped with an answer sent but not read, it gives
/// what the answer took back.
struct Heard<T: Send + 'static> {
    heard: tokio::sync::oneshot::Receiver<Result<T, CheckError>>,
    undo: Option<SharedUndo<T>>,
}

impl<T: Send + 'static> Future for Heard<T> {
    type Output = Result<T, CheckError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = std::task::ready!(Pin::new(&mut self.heard).poll(cx));
        self.undo = None;
        Poll::Ready(answer.unwrap_or_else(|_| {
            Err(CheckError::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "the check's task ended without an answer",
            )))
        }))
    }
}

impl<T: Send + 'static> Drop for Heard<T> {
    fn drop(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        // Closed first: an answer sent after this look would otherwise be dropped with the
        // receiver, unheard and not given back.
        self.heard.close();
        if let Ok(Ok(answer)) = self.heard.try_recv() {
            in_background(async move { give_back(&undo, answer).await });
        }
    }
}

/// Holds a duplicate-guard lease until the outcome is known.
///
/// Dropped while armed (the handler's future was cancelled because the client went away, or it
/// panicked), it releases the lock in the background so the client can retry at once instead
/// of waiting for the TTL. Once the handler has produced its outcome, [`complete`] and
/// [`release`] record it on a task of their own: the operation happened, so it is recorded
/// even if the request's future is dropped meanwhile. Between the two, once the handler
/// answered but its response is still being read ([`done`]), a drop completes the lock
/// without a replay: the operation ran, and a repeat must not run it again.
///
/// [`complete`]: LeaseGuard::complete
/// [`release`]: LeaseGuard::release
/// [`done`]: LeaseGuard::done
pub(crate) struct LeaseGuard {
    gate: SharedGate,
    lease: Option<Lease>,
    /// Set by [`done`](Self::done): how long a drop keeps the completion.
    done: Option<Duration>,
}

impl LeaseGuard {
    pub(crate) fn new(gate: SharedGate, lease: Lease) -> LeaseGuard {
        LeaseGuard {
            gate,
            lease: Some(lease),
            done: None,
        }
    }

    /// The operation ran (its handler answered): from now on a drop completes the lock for
    /// `keep_for`, without a replay, instead of releasing it.
    pub(crate) fn done(&mut self, keep_for: Duration) {
        self.done = Some(keep_for);
    }

    /// Frees the lock (the submission failed: let the client retry).
    pub(crate) async fn release(mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let gate = self.gate.clone();
        // A failed release leaves the lock to expire with its TTL: nothing else to do.
        detached(async move { drop(gate.release(&lease).await) }).await;
    }

    /// Marks the submission done, keeping `response` for `keep_for`.
    pub(crate) async fn complete(mut self, response: Vec<u8>, keep_for: Duration) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let gate = self.gate.clone();
        detached(async move {
            // The response could not be kept (larger than the engine keeps, a store's
            // response budget full, ...): the completion is recorded without a replay rather
            // than the lock left to expire, which would let a repeat run the operation again.
            // A failure of that too leaves the lock held until its TTL.
            if gate.complete(&lease, &response, keep_for).await.is_err() && !response.is_empty() {
                let _ = gate.complete(&lease, &[], keep_for).await;
            }
        })
        .await;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let (gate, done) = (self.gate.clone(), self.done);
        in_background(async move {
            match done {
                Some(keep_for) => drop(gate.complete(&lease, &[], keep_for).await),
                None => drop(gate.release(&lease).await),
            }
        });
    }
}

/// Where a held slot's policy lives: a layer's configuration, or a macro's static policy.
pub(crate) trait PolicyHome: Send + Sync + 'static {
    fn policy(&self) -> &Policy;
}

impl PolicyHome for &'static Policy {
    fn policy(&self) -> &Policy {
        self
    }
}

/// The shortest lease TTL of `policy`'s concurrency limiters: a slot held longer is renewed.
pub(crate) fn lease_ttl(policy: &Policy) -> Option<Duration> {
    policy
        .limiters()
        .iter()
        .flat_map(|l| l.rules())
        .filter(|r| r.is_concurrent())
        .map(tollgate::Rule::window)
        .min()
}

/// The concurrency slots an admitted request or call holds (its policy's concurrency
/// limiters): freed when dropped, which the layer arranges for when the response body ends or
/// is dropped, or when the handler panics or its future is dropped, and the macros when the
/// call returns or is dropped. Held on a task of its own, which renews the leases every third
/// of their TTL meanwhile (a long stream or job keeps its slot) and releases them once the
/// slot is dropped, after any renewal under way.
pub(crate) struct Slot {
    /// Tells the task the slot is dropped.
    ended: Option<tokio::sync::oneshot::Sender<()>>,
    /// Told by the task once the leases are released.
    released: tokio::sync::oneshot::Receiver<()>,
    /// Without a runtime to hold the slot on (a macro's call on another executor): the release,
    /// run by [`release`](Self::release).
    inline: Option<BoxFuture<'static, ()>>,
}

impl Slot {
    /// Holds the leases of `receipt`, renewed every third of `lease_ttl`.
    pub(crate) fn new<P: PolicyHome>(
        (gate, policy): (SharedGate, P),
        identity: Identity,
        receipt: Receipt,
        lease_ttl: Option<Duration>,
    ) -> Slot {
        let (ended, dropped) = tokio::sync::oneshot::channel();
        let (done, released) = tokio::sync::oneshot::channel();
        let inline: Option<BoxFuture<'static, ()>> = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    hold((gate, policy), identity, (receipt, lease_ttl), dropped).await;
                    let _ = done.send(());
                });
                None
            }
            Err(_) => Some(Box::pin(async move {
                let release = gate.release_concurrent(policy.policy(), &identity, &receipt);
                let _ = release.await;
            })),
        };
        Slot {
            ended: Some(ended),
            released,
            inline,
        }
    }

    /// Frees the slots now, and waits until the store has them back (or the release failed: the
    /// lease then runs out by itself).
    pub(crate) async fn release(mut self) {
        if let Some(release) = self.inline.take() {
            return release.await;
        }
        if let Some(ended) = self.ended.take() {
            let _ = ended.send(());
        }
        let _ = (&mut self.released).await;
    }
}

/// Holds the leases of `receipt` until `dropped` says so (or its sender is gone), renewing
/// them meanwhile, then releases them by the last receipt that names them.
async fn hold<P: PolicyHome>(
    (gate, home): (SharedGate, P),
    identity: Identity,
    (mut receipt, lease_ttl): (Receipt, Option<Duration>),
    mut dropped: tokio::sync::oneshot::Receiver<()>,
) {
    let policy = home.policy();
    let every = lease_ttl.map(|ttl| (ttl / 3).max(Duration::from_millis(10)));
    // A runtime built without its time driver has no timer to renew by (making one panics):
    // the slot is then held until dropped, at most its TTL, as it would be without renewal.
    let timer = every.and_then(|every| std::panic::catch_unwind(|| tokio::time::sleep(every)).ok());
    if let (Some(every), Some(timer)) = (every, timer) {
        let mut timer = std::pin::pin!(timer);
        loop {
            let ended = std::future::poll_fn(|cx| {
                if Pin::new(&mut dropped).poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                timer.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if ended {
                break;
            }
            // Boxed: the task stays small while it waits, whatever a store call holds.
            let renewed = Box::pin(gate.extend_concurrent(policy, &identity, &receipt)).await;
            let next = match renewed {
                Ok(Some(renewed)) => {
                    receipt = renewed;
                    every
                }
                // One of the leases ran out (or was released): the slot may be someone
                // else's now. The others go back (a release of a lease gone changes nothing).
                Ok(None) => break,
                // Tried again soon (any receipt of the check names its leases): the lease
                // holds until its TTL meanwhile.
                Err(_) => every / 4,
            };
            timer.as_mut().reset(tokio::time::Instant::now() + next);
        }
    } else {
        let _ = dropped.await;
    }
    let _ = Box::pin(gate.release_concurrent(policy, &identity, &receipt)).await;
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(ended) = self.ended.take() {
            let _ = ended.send(());
        }
    }
}
