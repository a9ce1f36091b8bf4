use std::{
    fmt,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::task::futures::TaskLocalFuture;
use tollgate::FullStore;
use tollgate::{Decision, Identity, Policy, RuleDecision, Tollgate};

use crate::{
    gate::{SharedGate, erase},
    headers::HeaderStyle,
};

tokio::task_local! {
    static CONTEXT: Context;
}

/// The engine and the caller's identity, for guarded code running inside
/// [`scope`](Self::scope); see the [module docs](crate::ContextLayer).
#[derive(Clone)]
pub struct Context {
    pub(crate) gate: SharedGate,
    pub(crate) identity: Identity,
    /// The rules of the rate-limit checks that admitted this request, and those of them in
    /// warning, for the RateLimit fields of its response.
    pub(crate) admitted: Arc<Mutex<Admitted>>,
    /// The rate-limit fields of responses, rejections included.
    pub(crate) style: HeaderStyle,
}

impl Context {
    /// A context checking on `gate` for `identity`.
    pub fn new<S: FullStore>(gate: Arc<Tollgate<S>>, identity: Identity) -> Context {
        Context::erased(erase(gate), identity)
    }

    pub(crate) fn erased(gate: SharedGate, identity: Identity) -> Context {
        Context {
            gate,
            identity,
            admitted: Arc::default(),
            style: HeaderStyle::Draft,
        }
    }

    /// Which rate-limit fields the rejections of guarded code carry (default
    /// [`HeaderStyle::Draft`]); a [`ContextLayer`](crate::ContextLayer) sets its own.
    #[must_use]
    pub fn with_header_style(mut self, style: HeaderStyle) -> Context {
        self.style = style;
        self
    }

    /// Whose requests these are.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Runs `future` inside this context.
    pub fn scope<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        CONTEXT.scope(self, future)
    }

    pub(crate) fn scope_future<F: Future>(self, future: F) -> TaskLocalFuture<Context, F> {
        CONTEXT.scope(self, future)
    }

    /// Runs `f` inside this context (for synchronous code that sets up futures).
    pub(crate) fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        CONTEXT.sync_scope(self, f)
    }

    /// The context the current task runs in, if any.
    pub fn current() -> Option<Context> {
        CONTEXT.try_with(Context::clone).ok()
    }

    /// Runs `f` on the context the current task runs in, if any.
    pub(crate) fn try_with<R>(f: impl FnOnce(&Context) -> R) -> Option<R> {
        CONTEXT.try_with(f).ok()
    }

    /// The rules of every rate-limit check that admitted a call in this context so far.
    pub fn admitted_rules(&self) -> Vec<RuleDecision> {
        self.admitted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rules
            .clone()
    }

    pub(crate) fn record(&self, decision: &Decision, policy: &Policy) {
        let mut admitted = self.admitted.lock().unwrap_or_else(PoisonError::into_inner);
        admitted.rules.extend(decision.rules(policy));
        if policy.warns() {
            admitted.warnings.extend(decision.warnings(policy));
        }
    }
}

/// What the checks in one context admitted.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    pub(crate) rules: Vec<RuleDecision>,
    /// Those of `rules` in their limiter's warning.
    pub(crate) warnings: Vec<RuleDecision>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}
