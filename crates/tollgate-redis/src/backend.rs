//! [`Backend`]: what every call to Redis needs, whoever makes it: the connection, the loaded
//! scripts, the bound on a call, and the test clock. The store, the Cluster check, batching and
//! the blocklist all send through it, and none of them needs the others to do so.

use std::{future::Future, sync::Arc, time::Duration};

use redis::{RedisError, RedisResult};
use tokio::sync::OnceCell;
use tollgate::{Clock, Durability, StoreError, StoreErrorKind};

use crate::{
    conn::{Call, Conn, Dial},
    error,
    script::{Scripts, now_arg},
};

/// The connection, the scripts, the timeout and the clock of one store (shared by its clones).
pub(crate) struct Backend {
    pub(crate) conn: Conn,
    /// How to open the connection of replicated checks, and that connection once opened (at
    /// the first replicated check: a store whose policies never ask pays nothing).
    pub(crate) dial: Dial,
    pub(crate) durable: OnceCell<Conn>,
    pub(crate) scripts: Scripts,
    pub(crate) timeout: Duration,
    /// The test clock, if any (production: `None`, the scripts read `TIME`).
    pub(crate) clock: Option<Arc<dyn Clock>>,
    /// The URL without its password, for messages.
    pub(crate) target: String,
}

impl Backend {
    /// How long a call's marker (see `once()` in `scripts/prelude.lua`) must last: while the
    /// client may still send the call again, every attempt given the whole timeout and the
    /// longest wait. `None` where the client never sends a call twice (one server, Sentinel):
    /// no marker is written there.
    pub(crate) fn marker_ttl_ms(&self) -> Option<u64> {
        use crate::builder::{CLUSTER_MAX_RETRY_WAIT_MS, CLUSTER_RETRIES};
        let Conn::Cluster(_) = self.conn else {
            return None;
        };
        let attempt = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX / 8);
        let attempts = u64::from(CLUSTER_RETRIES) + 1;
        // Within what Redis takes (a day, for a timeout nobody sets).
        Some((attempts * (attempt + CLUSTER_MAX_RETRY_WAIT_MS)).clamp(1000, 86_400_000))
    }

    /// A handle on the connection (cheap: the connection is shared).
    pub(crate) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Runs a call of the check script on the connection its durability takes: the shared one
    /// for [`Durability::Async`]; for [`Durability::Replicated`], the replicated checks' own,
    /// followed by one `WAIT` (a batch's checks share it), and a store error when fewer
    /// replicas than asked acknowledged the writes in time. Not bounded: the caller bounds it.
    pub(crate) async fn check_call(
        &self,
        call: &Call<'_>,
        durability: Durability,
    ) -> Result<Vec<Vec<i64>>, StoreError> {
        let Durability::Replicated { replicas, timeout } = durability else {
            let mut conn = self.conn();
            return call
                .invoke(&mut conn)
                .await
                .map_err(|e| self.redis_error("check", e));
        };
        let mut conn = self
            .durable
            .get_or_try_init(|| self.dial.connect())
            .await
            .map_err(|e| self.redis_error("connect for replicated checks", e))?
            .clone();
        let (replies, acknowledged) = call
            .invoke_waiting(&mut conn, replicas, timeout)
            .await
            .map_err(|e| self.redis_error("check", e))?;
        if acknowledged < u64::from(replicas) {
            return Err(StoreError::new(
                StoreErrorKind::NotReplicated,
                format!(
                    "check on {}: {acknowledged} of {replicas} replicas acknowledged its writes \
                     within {timeout:?} (durability replicated)",
                    self.target
                ),
            ));
        }
        Ok(replies)
    }

    /// Whether this is a Redis Cluster (a call's keys must share one hash slot).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// The test clock's time, if any.
    pub(crate) fn test_now(&self) -> Option<u64> {
        self.clock.as_ref().map(|c| c.now_us())
    }

    /// The test clock's time as the guard scripts take it (empty: the server's `TIME`).
    pub(crate) fn now_arg(&self) -> String {
        now_arg(self.test_now())
    }

    /// `err`, raised while doing `what`, as a store error naming the target.
    pub(crate) fn redis_error(&self, what: &str, err: RedisError) -> StoreError {
        error::from_redis(what, &self.target, err)
    }

    /// Runs `fut` within the store's timeout, naming `what` in any error.
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        self.bounded_store(what, async {
            fut.await.map_err(|e| self.redis_error(what, e))
        })
        .await
    }

    /// Runs `fut` within the store's timeout; a timeout names `what`.
    pub(crate) async fn bounded_store<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(error::timed_out(what, &self.target, self.timeout)),
        }
    }
}
