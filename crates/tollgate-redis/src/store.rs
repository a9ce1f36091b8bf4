//! [`RedisStore`]: the [`Store`] over one standalone Redis, and its builder.

use std::{fmt, future::Future, sync::Arc, time::Duration};

use redis::{
    AsyncConnectionConfig, Client, RedisResult, Value,
    aio::{ConnectionManager, ConnectionManagerConfig},
};
use tollgate::{
    BanEntry, BanTarget, CheckPlan, Clock, LockReply, Store, StoreError, StoreErrorKind, Verdict,
    ban_index_key,
};

use crate::{
    error,
    script::{self, Scripts, micros, now_arg},
};

/// The default bound on every store call.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// The shortest time a connection attempt is given, whatever the call timeout: a TLS handshake
/// to a distant server may need more than a check does.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A [`Store`] on one standalone Redis server: every check is one `EVALSHA` of
/// `scripts/check.lua`, atomic over all the keys of the plan, timed by the server's `TIME`.
///
/// Cloning is cheap and clones share one multiplexed connection, which pipelines concurrent
/// checks and reconnects on its own after the server goes away.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate_redis::RedisStore;
///
/// # async fn run() -> Result<(), tollgate::StoreError> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379/0")
///     .timeout(Duration::from_millis(50))
///     .build()
///     .await?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionManager,
    scripts: Scripts,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    /// The URL without its password, for messages.
    target: String,
}

impl RedisStore {
    /// Connects to `url` with the default settings; the same as `builder(url).build()`.
    ///
    /// `url` is `redis://[user:password@]host:port/db` or, for TLS, `rediss://...`.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).build().await
    }

    /// Configures a store on `url` (see [`connect`](Self::connect) for the URL forms).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            clock: None,
        }
    }

    /// The test clock's time, if any (production: `None`, the scripts read `TIME`).
    fn now_arg(&self) -> String {
        now_arg(self.inner.clock.as_ref().map(|c| c.now_us()))
    }

    /// Runs `fut` within the store's timeout, naming `what` in any error.
    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let inner = &self.inner;
        match tokio::time::timeout(inner.timeout, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(error::from_redis(what, &inner.target, err)),
            Err(_) => Err(error::timed_out(what, &inner.target, inner.timeout)),
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.inner.target)
            .field("timeout", &self.inner.timeout)
            .field("test_clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl Store for RedisStore {
    async fn check(&self, plan: &CheckPlan) -> Result<Verdict, StoreError> {
        let mut invocation = self.inner.scripts.check.prepare_invoke();
        let now = self.inner.clock.as_ref().map(|c| c.now_us());
        script::prepare(&mut invocation, plan, now, rand::random())?;
        let mut conn = self.inner.conn.clone();
        let reply: Vec<i64> = self
            .bounded("check", invocation.invoke_async(&mut conn))
            .await?;
        script::verdict(plan, &reply)
    }

    async fn reset(&self, plan: &CheckPlan) -> Result<(), StoreError> {
        let keys: Vec<String> = plan.limiters.iter().flat_map(|l| l.state_keys()).collect();
        if keys.is_empty() {
            return Ok(());
        }
        let mut conn = self.inner.conn.clone();
        let _deleted: u64 = self
            .bounded("reset", redis::cmd("DEL").arg(keys).query_async(&mut conn))
            .await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.inner.conn.clone();
        let pong: String = self
            .bounded("ping", redis::cmd("PING").query_async(&mut conn))
            .await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!("ping on {}: answered {pong:?}", self.inner.target),
            ))
        }
    }

    async fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<LockReply, StoreError> {
        let mut invocation = self.inner.scripts.lock_acquire.key(key);
        invocation
            .arg(self.now_arg())
            .arg(token)
            .arg(fingerprint)
            .arg(micros(ttl));
        let mut conn = self.inner.conn.clone();
        let reply: Vec<Value> = self
            .bounded("lock", invocation.invoke_async(&mut conn))
            .await?;
        script::lock_reply(&reply)
    }

    async fn lock_release(&self, key: &str, token: &str) -> Result<bool, StoreError> {
        let mut invocation = self.inner.scripts.lock_release.key(key);
        invocation.arg(self.now_arg()).arg(token);
        let mut conn = self.inner.conn.clone();
        self.bounded("unlock", invocation.invoke_async(&mut conn))
            .await
    }

    async fn lock_complete(
        &self,
        key: &str,
        token: &str,
        response: &[u8],
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        let mut invocation = self.inner.scripts.lock_complete.key(key);
        invocation
            .arg(self.now_arg())
            .arg(token)
            .arg(response)
            .arg(micros(keep_for));
        let mut conn = self.inner.conn.clone();
        self.bounded("complete", invocation.invoke_async(&mut conn))
            .await
    }

    async fn bans(&self, prefix: &str) -> Result<Vec<BanEntry>, StoreError> {
        let mut invocation = self.inner.scripts.bans.key(ban_index_key(prefix));
        invocation.arg(self.now_arg());
        let mut conn = self.inner.conn.clone();
        let reply: Vec<Value> = self
            .bounded("list bans", invocation.invoke_async(&mut conn))
            .await?;
        script::bans_reply(&reply)
    }

    async fn ban(
        &self,
        prefix: &str,
        target: &BanTarget,
        duration: Duration,
    ) -> Result<(), StoreError> {
        let mut invocation = self.inner.scripts.ban.key(target.key(prefix));
        invocation
            .key(ban_index_key(prefix))
            .arg(self.now_arg())
            .arg(micros(duration))
            .arg(target.kind())
            .arg(target.value());
        let mut conn = self.inner.conn.clone();
        let _: i64 = self
            .bounded("ban", invocation.invoke_async(&mut conn))
            .await?;
        Ok(())
    }

    async fn unban(&self, prefix: &str, target: &BanTarget) -> Result<bool, StoreError> {
        let mut invocation = self.inner.scripts.unban.key(target.key(prefix));
        invocation.key(ban_index_key(prefix)).arg(self.now_arg());
        let mut conn = self.inner.conn.clone();
        self.bounded("unban", invocation.invoke_async(&mut conn))
            .await
    }
}

/// Configures a [`RedisStore`]; from [`RedisStore::builder`].
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct RedisStoreBuilder {
    url: String,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("url", &error::redact(&self.url))
            .field("timeout", &self.timeout)
            .field("test_clock", &self.clock)
            .finish()
    }
}

impl RedisStoreBuilder {
    /// The bound on every store call: check, reset and ping (default 100 ms).
    ///
    /// A call that gets no answer in time fails with a timeout error, which the engine answers
    /// with the policy's `on_error`. A check that timed out may still have been recorded by the
    /// server. Connecting is given at least 1 s.
    pub fn timeout(mut self, timeout: Duration) -> RedisStoreBuilder {
        self.timeout = timeout;
        self
    }

    /// **For tests only.** Time checks by `clock` instead of the Redis server's `TIME`.
    ///
    /// Production stores must not call this: without it every check reads the server's clock
    /// inside the script, so application instances whose clocks disagree still agree on every
    /// window (invariant 4). With it, each instance's own clock decides, and instances with
    /// skewed clocks count the same keys differently. It exists so that the store conformance
    /// suite can drive Redis with a [`ManualClock`](tollgate::ManualClock), exactly as it drives
    /// the memory store.
    ///
    /// Key expiry (`PEXPIRE`) still runs on the server's clock, which keeps moving while a test
    /// clock stands still, so with a test clock every key lives one hour longer than it needs.
    /// Answers never depend on expiry: the state carries its window start and timestamps.
    pub fn clock(mut self, clock: impl Clock) -> RedisStoreBuilder {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Connects, loads the check script, and returns the store.
    ///
    /// Fails with an [`Unavailable`](StoreErrorKind::Unavailable) error when the URL is invalid
    /// or the first connection fails (refused, unreachable, TLS or authentication failure).
    /// After that the store reconnects by itself; calls made while it cannot reach the server
    /// fail within the timeout.
    pub async fn build(self) -> Result<RedisStore, StoreError> {
        let target = error::redact(&self.url);
        let unavailable = |message: String| StoreError::new(StoreErrorKind::Unavailable, message);
        if self.url.starts_with("rediss:") {
            install_crypto_provider();
        }
        let client = Client::open(self.url.as_str())
            .map_err(|err| unavailable(format!("invalid Redis URL {target:?}")).with_source(err))?;
        let connect_timeout = self.timeout.max(MIN_CONNECT_TIMEOUT);

        // One attempt of our own first: the connection manager retries with backoff, which
        // would turn "connection refused" into a slow, vague timeout.
        let probe_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(connect_timeout));
        let probe = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&probe_config)
                .await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(connect_timeout * 2, probe).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                return Err(unavailable(format!("cannot connect to {target}")).with_source(err));
            }
            Err(_) => {
                return Err(unavailable(format!(
                    "cannot connect to {target}: no answer within {:?}",
                    connect_timeout * 2
                )));
            }
        }

        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(self.timeout))
            .set_min_delay(Duration::from_millis(50))
            // Keeps recovery prompt once the server is back.
            .set_max_delay(Duration::from_secs(1));
        let connecting = async {
            let mut conn = ConnectionManager::new_with_config(client, config).await?;
            let scripts = Scripts::new();
            // Loaded now so that the first check is one round trip too.
            for script in scripts.all() {
                script.load_async(&mut conn).await?;
            }
            Ok::<_, redis::RedisError>((conn, scripts))
        };
        let (conn, scripts) = match tokio::time::timeout(connect_timeout * 2, connecting).await {
            Ok(Ok(ready)) => ready,
            Ok(Err(err)) => {
                return Err(unavailable(format!("cannot connect to {target}")).with_source(err));
            }
            Err(_) => {
                return Err(unavailable(format!(
                    "cannot connect to {target}: no answer within {:?}",
                    connect_timeout * 2
                )));
            }
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                scripts,
                timeout: self.timeout,
                clock: self.clock,
                target,
            }),
        })
    }
}

/// rustls needs a process-wide crypto provider; install ring unless the application chose one.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err means another thread installed one first, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
