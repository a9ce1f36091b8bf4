//! Errors: a store that failed, a policy that cannot be built, a check that lacks a fact.

use std::{error::Error as StdError, fmt};

type Source = Box<dyn StdError + Send + Sync>;

/// A store could not answer. Ask with the predicates rather than matching kinds.
///
/// One pointer wide: every check returns a `Result` of it, which then fits in registers
/// (failures are rare; their details live on the heap).
pub struct StoreError(Box<Failure>);

#[derive(Debug)]
struct Failure {
    kind: StoreErrorKind,
    message: String,
    source: Option<Source>,
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreError")
            .field("kind", &self.0.kind)
            .field("message", &self.0.message)
            .field("source", &self.0.source)
            .finish()
    }
}

/// The broad kind of a [`StoreError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// No answer within the configured timeout.
    Timeout,
    /// The store cannot be reached (refused, dropped, not yet reconnected).
    Unavailable,
    /// The store is full (memory store key cap).
    Capacity,
    /// The store answered something unexpected.
    Protocol,
    /// The store applied the writes, but fewer replicas than the policy's
    /// [`Durability`](crate::Durability) asks acknowledged them in time: the decision is not
    /// final. Not a sign that the store lost anything.
    NotReplicated,
}

impl StoreError {
    /// A new error of `kind`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
        StoreError(Box::new(Failure {
            kind,
            message: message.into(),
            source: None,
        }))
    }

    /// Attaches the underlying cause.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<Source>) -> StoreError {
        self.0.source = Some(source.into());
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> StoreErrorKind {
        self.0.kind
    }

    /// No answer in time.
    pub fn is_timeout(&self) -> bool {
        self.0.kind == StoreErrorKind::Timeout
    }

    /// The store could not be reached.
    pub fn is_unavailable(&self) -> bool {
        self.0.kind == StoreErrorKind::Unavailable
    }

    /// The store refused to grow.
    pub fn is_capacity(&self) -> bool {
        self.0.kind == StoreErrorKind::Capacity
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0.kind {
            StoreErrorKind::Timeout => "store timed out",
            StoreErrorKind::Unavailable => "store unavailable",
            StoreErrorKind::Capacity => "store full",
            StoreErrorKind::Protocol => "unexpected store reply",
            StoreErrorKind::NotReplicated => "store writes not replicated in time",
        };
        write!(f, "{kind}: {}", self.0.message)?;
        if let Some(source) = &self.0.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// A check that could not be decided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// A limiter counts by a dimension the identity lacks (no user id for `user_id`).
    #[error("limiter {limiter:?} needs {dimension}, which the request does not carry")]
    MissingDimension {
        /// The limiter's name.
        limiter: String,
        /// The dimension it counts by.
        dimension: String,
    },
    /// A response to store for replay is larger than the engine's cap.
    #[error("the response to store is {size} bytes; the cap is {cap} bytes")]
    ResponseTooLarge {
        /// The response's size.
        size: usize,
        /// The cap ([`Tollgate::with_max_stored_response`](crate::Tollgate::with_max_stored_response)).
        cap: usize,
    },
    /// The store failed during an operation that has no `on_error` answer (reset, admin calls).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl CheckError {
    /// The request lacks what a limiter counts by (HTTP 401 for user dimensions).
    pub fn is_missing_dimension(&self) -> bool {
        matches!(self, CheckError::MissingDimension { .. })
    }
}

/// A policy that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The scope is empty.
    #[error("a policy needs a non-empty scope (the action name)")]
    EmptyScope,
    /// No limiters.
    #[error("policy {0:?} has no limiters")]
    NoLimiters(String),
    /// A replicated durability that waits for no replica, or for no time (Redis would wait
    /// forever).
    #[error("durability {0}: a replicated check waits for at least 1 replica and at least 1 ms")]
    Durability(String),
    /// A quota lease with numbers out of range, or over rules it cannot lease.
    #[error("lease: {0}")]
    Lease(String),
    /// A limiter's warning is not a fraction above 0 and at most 1.
    #[error(
        "limiter {limiter:?} warns at {fraction}: a warning is a fraction of each rule's limit, above 0 and at most 1 (e.g. 0.8)"
    )]
    Warning {
        /// The limiter's name.
        limiter: String,
        /// The fraction given, as written.
        fraction: String,
    },
    /// A limiter without rules.
    #[error("limiter {0:?} has no rules")]
    NoRules(String),
    /// Two limiters with one name would share their counters.
    #[error("two limiters are named {0:?}; give one a distinct name")]
    DuplicateLimiter(String),
    /// The same rule twice in one limiter.
    #[error("limiter {limiter:?} lists rule {rule} twice")]
    DuplicateRule {
        /// The limiter's name.
        limiter: String,
        /// The repeated rule.
        rule: String,
    },
    /// A sliding-log rule whose log could outgrow any store.
    #[error(
        "limiter {limiter:?}: rule {rule} keeps one log entry per admitted unit, and more than \
         {max} is too many to hold per client; use fixed_window or gcra for a limit this large"
    )]
    LogTooLarge {
        /// The limiter's name.
        limiter: String,
        /// The rule.
        rule: String,
        /// The largest sliding-log limit.
        max: u64,
    },
    /// A sliding-window rule whose limit times window (in ms) passes
    /// [`MAX_SLIDING_WINDOW_PRODUCT`](crate::algorithm::MAX_SLIDING_WINDOW_PRODUCT).
    #[error(
        "limiter {limiter:?}: rule {rule} is too large for sliding_window (limit × window in \
         milliseconds must stay within 2^51, e.g. 71 000 per 366 days or 26 million per day); \
         use fixed_window or gcra"
    )]
    SlidingWindowTooLarge {
        /// The limiter's name.
        limiter: String,
        /// The rule.
        rule: String,
    },
    /// A concurrency limit shares its limiter with other rules, or was given an algorithm.
    #[error(
        "limiter {limiter:?}: {rule} is a concurrency limit; it is its limiter's only rule, counted by its leases (give other rules a limiter of their own)"
    )]
    ConcurrentNotAlone {
        /// The limiter's name.
        limiter: String,
        /// The rule.
        rule: String,
    },
    /// A calendar window (`N/1d@Zone`) is counted as a fixed window, not another algorithm.
    #[error(
        "limiter {limiter:?}: rule {rule} is a calendar window, counted as a fixed window; it cannot be {algorithm}"
    )]
    CalendarNotFixed {
        /// The limiter's name.
        limiter: String,
        /// The rule.
        rule: String,
        /// The algorithm asked for.
        algorithm: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store's answer to a check is returned in registers: a `Result` of a store error is
    /// no larger than two words.
    #[test]
    fn a_store_error_is_one_pointer() {
        assert_eq!(std::mem::size_of::<StoreError>(), 8);
        assert!(std::mem::size_of::<Option<Result<(), StoreError>>>() <= 16);
        let e = StoreError::new(StoreErrorKind::Timeout, "no answer")
            .with_source(std::io::Error::other("reset"));
        assert!(e.is_timeout() && !e.is_unavailable());
        assert_eq!(e.to_string(), "store timed out: no answer: reset");
        assert!(StdError::source(&e).is_some());
        assert!(format!("{e:?}").starts_with("StoreError { kind: Timeout, message: \"no answer\""));
    }
}
