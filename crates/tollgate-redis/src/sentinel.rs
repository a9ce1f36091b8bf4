//! A connection to the primary that Redis Sentinel names, found again after a failover.

use std::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicU64, Ordering},
};

use redis::{
    AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, MultiplexedConnection},
    sentinel::SentinelClient,
};

/// A handle on the current primary of one Sentinel-managed master; clones share it.
///
/// The first call (and the first call after the connection failed in a way that says the
/// primary may have changed: refused, dropped, timed out, `READONLY`, ...) asks the sentinels
/// for the primary, checks with `ROLE` that it is one, and connects. Calls made while the
/// sentinels still name a dead primary fail, and the engine answers them with `on_error`.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    /// Asked one caller at a time: a failover is discovered once, not by every waiting call.
    sentinel: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    db: i64,
    current: Mutex<Option<Current>>,
    generations: AtomicU64,
}

#[derive(Clone)]
struct Current {
    generation: u64,
    conn: MultiplexedConnection,
}

impl SentinelConnection {
    /// A handle that will find the primary through `sentinel` (which knows the master name
    /// and how to reach the data nodes); nothing is connected yet.
    pub(crate) fn new(
        sentinel: SentinelClient,
        config: AsyncConnectionConfig,
        db: i64,
    ) -> SentinelConnection {
        SentinelConnection {
            shared: Arc::new(Shared {
                sentinel: tokio::sync::Mutex::new(sentinel),
                config,
                db,
                current: Mutex::new(None),
                generations: AtomicU64::new(0),
            }),
        }
    }

    fn current(&self) -> MutexGuard<'_, Option<Current>> {
        // A panic elsewhere cannot leave an `Option` half-written.
        self.shared
            .current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The connection to the primary, discovering it first if need be.
    async fn connection(&self) -> RedisResult<Current> {
        if let Some(current) = self.current().clone() {
            return Ok(current);
        }
        let mut sentinel = self.shared.sentinel.lock().await;
        // Someone may have connected while we waited for the sentinels.
        if let Some(current) = self.current().clone() {
            return Ok(current);
        }
        // Asks the sentinels, then checks with `ROLE` that the server named is a primary.
        let client = sentinel.async_get_client().await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.shared.config)
            .await?;
        let current = Current {
            generation: self.shared.generations.fetch_add(1, Ordering::Relaxed) + 1,
            conn,
        };
        *self.current() = Some(current.clone());
        Ok(current)
    }

    /// Forgets the connection of `generation` (not a newer one another call made meanwhile).
    fn forget(&self, generation: u64) {
        let mut current = self.current();
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            *current = None;
        }
    }

    /// Watches one request on the connection of `generation`.
    fn watch(&self, generation: u64) -> Watch<'_> {
        Watch {
            conn: self,
            generation,
            answered: false,
        }
    }
}

/// Forgets the connection if the request fails in a way that says the primary may have
/// moved, or is dropped unanswered (the store's timeout gave up on it: a primary that does
/// not answer may be gone).
struct Watch<'a> {
    conn: &'a SentinelConnection,
    generation: u64,
    answered: bool,
}

impl Watch<'_> {
    fn answered<T>(mut self, reply: RedisResult<T>) -> RedisResult<T> {
        self.answered = true;
        if let Err(err) = &reply
            && may_have_moved(err)
        {
            self.conn.forget(self.generation);
        }
        reply
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.conn.forget(self.generation);
        }
    }
}

/// Whether `err` says the primary may no longer be where we are connected.
fn may_have_moved(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
        || matches!(err.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut current = self.connection().await?;
            let watch = self.watch(current.generation);
            watch.answered(current.conn.req_packed_command(cmd).await)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut current = self.connection().await?;
            let watch = self.watch(current.generation);
            watch.answered(
                current
                    .conn
                    .req_packed_commands(pipeline, offset, count)
                    .await,
            )
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}
