//! [`RedisStoreBuilder`]: a store's settings, and connecting to each kind of deployment.

use std::{
    fmt,
    future::Future,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use redis::{
    AsyncConnectionConfig, Client, IntoConnectionInfo, RedisError, RedisResult, TlsCertificates,
    TlsMode, Value,
    aio::{ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClientBuilder,
    sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType},
};
use tokio::sync::OnceCell;
use tollgate::{Clock, StoreError, StoreErrorKind};

use crate::{
    backend::Backend,
    batch::Lanes,
    cache::LocalCache,
    conn::{Conn, Dial, Lua},
    error,
    repair::{Journal, WATCH_EVERY},
    script::Scripts,
    sentinel::SentinelConnection,
    shared::Inner,
    store::RedisStore,
    tls,
    url::{self, SentinelTarget, Target, TlsFiles},
};

/// The default bound on every store call.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// How many times a Cluster client sends a call again (a redirection, a lost reply), and the
/// longest it waits before it does: what [`Backend::marker_ttl_ms`] covers.
pub(crate) const CLUSTER_RETRIES: u32 = 5;
pub(crate) const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 200;

/// The shortest time a connection attempt is given, whatever the call timeout: a TLS handshake
/// to a distant server may need more than a check does.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Configures a [`RedisStore`]; from [`RedisStore::builder`].
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate_redis::RedisStore;
///
/// # async fn run() -> Result<(), tollgate::StoreError> {
/// let store = RedisStore::builder("redis+cluster://10.0.0.5:7000,10.0.0.6:7000/?prefix=api")
///     .timeout(Duration::from_millis(50)) // each call; past it, the policy's on_error decides
///     .build()
///     .await?;
/// # let _ = store;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct RedisStoreBuilder {
    url: String,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    tls: TlsFiles,
    batching: Option<bool>,
    local_cache: Option<bool>,
    repair: Option<Duration>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("url", &error::redact(&self.url))
            .field("timeout", &self.timeout)
            .field("test_clock", &self.clock)
            .field("tls", &self.tls)
            .field("batching", &self.batching)
            .field("local_cache", &self.local_cache)
            .field("repair", &self.repair)
            .finish()
    }
}

impl RedisStoreBuilder {
    pub(crate) fn new(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            clock: None,
            tls: TlsFiles::default(),
            batching: None,
            local_cache: None,
            repair: None,
        }
    }

    /// Repairs after a failover (off by default): the store remembers what its own
    /// admissions of the last `horizon` wrote and, when it finds Redis has lost some of it (a
    /// call failed; a watch, every 250 ms, sees a new primary; or a key is behind this
    /// store's own last write), writes them again, idempotently, in the background. Until a
    /// key is written back, and for the store's timeout plus half a second after (the other
    /// instances' time to write back theirs), its checks fail and `on_error` answers them.
    /// Give a horizon longer than the replication lag a failover can lose (a few seconds).
    ///
    /// Sliding logs are repaired exactly (their members are named by each check); a counter
    /// (fixed or sliding window, GCRA) is raised back to the highest value this store wrote.
    /// What instances that died with the primary admitted is not repaired. Costs a little
    /// memory per recent admission (bounded) and, per check, the record of what it wrote;
    /// nothing on Redis until a repair runs but the watch's `INFO replication`. See
    /// [`RedisStore::repairs`] and `docs/deployment.md`.
    pub fn repair(mut self, horizon: Duration) -> RedisStoreBuilder {
        self.repair = Some(horizon).filter(|h| !h.is_zero());
        self
    }

    /// The bound on every store call: check, reset, ping, locks and bans (default 100 ms).
    ///
    /// A call that gets no answer in time fails with a timeout error, which the engine answers
    /// with the policy's `on_error`. A check that timed out may still have been recorded by the
    /// server. On a Cluster, a check denied across several slots takes a second round trip to
    /// undo the other slots' reservations, bounded by the same timeout. Connecting is given at
    /// least 1 s.
    pub fn timeout(mut self, timeout: Duration) -> RedisStoreBuilder {
        self.timeout = timeout;
        self
    }

    /// Natural batching (default: on): while a check's script call is in flight, the checks
    /// that arrive for the same server (on a Cluster, the same hash slot) wait, and go
    /// together as one call when it returns, evaluated one after the other against one
    /// `TIME`, each all-or-nothing on its own: the same answers as one call each, for less
    /// Redis CPU per check. A check that finds nothing in flight goes at once, so a lone
    /// check waits for nothing. The same as `?batching=off` (or `on`) in the URL (give it in
    /// one place).
    ///
    /// On a Cluster only checks whose keys share one slot are batched; a check over several
    /// slots is its own call per slot.
    pub fn batching(mut self, on: bool) -> RedisStoreBuilder {
        self.batching = Some(on);
        self
    }

    /// The local over-limit cache (default: on): once Redis denies a limiter until some
    /// instant, this store denies the checks that need that limiter with at least that cost
    /// until then (less a margin), without asking Redis; the same for a live ban. It never
    /// admits, so it cannot over-admit. Other instances learn of a denial on their own first
    /// call; a reset or an unban through this store forgets what it concerns, one through
    /// another instance does not reach this cache (it keeps denying until the remembered
    /// end). See `docs/deployment.md`, "The local over-limit cache", for what a local denial
    /// approximates. The same as `?local_cache=off` (or `on`) in the URL (give it in one
    /// place). [`RedisStore::local_denials`] counts its answers.
    pub fn local_cache(mut self, on: bool) -> RedisStoreBuilder {
        self.local_cache = Some(on);
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

    /// Trusts the certificates of the PEM file at `path` instead of the system's roots, for
    /// a `rediss` URL; the same as `?tls_ca_file=<path>` in the URL (give it in one place).
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> RedisStoreBuilder {
        self.tls.ca = Some(path.into());
        self
    }

    /// Presents the client certificate (PEM chain) at `cert` with the private key (PEM) at
    /// `key` to servers that require one, for a `rediss` URL; the same as
    /// `?tls_cert_file=<cert>&tls_key_file=<key>` in the URL (give them in one place).
    pub fn tls_client_cert(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> RedisStoreBuilder {
        self.tls.cert = Some(cert.into());
        self.tls.key = Some(key.into());
        self
    }

    /// The TLS files of the URL and of the builder, read; and the URL without them.
    fn tls(&self, url: &str) -> Result<(String, Option<TlsCertificates>), String> {
        let (url, mut files) = url::take_tls_files(url)?;
        for (name, from_url, from_builder) in [
            ("tls_ca_file", &mut files.ca, &self.tls.ca),
            ("tls_cert_file", &mut files.cert, &self.tls.cert),
            ("tls_key_file", &mut files.key, &self.tls.key),
        ] {
            match (from_url.is_some(), from_builder) {
                (true, Some(_)) => {
                    return Err(format!(
                        "{name} is given both in the URL and to the builder"
                    ));
                }
                (false, Some(path)) => *from_url = Some(path.clone()),
                _ => {}
            }
        }
        if !files.is_empty() && !url.starts_with("rediss") {
            return Err("TLS files need TLS: use a rediss URL scheme".to_owned());
        }
        Ok((url, tls::certificates(&files)?))
    }

    /// Connects, loads the scripts, and returns the store.
    ///
    /// Fails with an [`Unavailable`](StoreErrorKind::Unavailable) error when the URL is invalid
    /// or a TLS file cannot be used, or the first connection fails (refused, unreachable, TLS
    /// or authentication failure; on
    /// Sentinel, no sentinel names a reachable primary; on a Cluster, no seed node answers).
    /// After that the store reconnects by itself; calls made while it cannot reach a server
    /// fail within the timeout.
    pub async fn build(self) -> Result<RedisStore, StoreError> {
        let Settings {
            target,
            batching,
            local_cache,
            certs,
            parsed,
        } = self.settings()?;
        let connect_timeout = self.timeout.max(MIN_CONNECT_TIMEOUT);
        let limit = connect_timeout * 2;
        let invalid =
            |err: RedisError| unavailable(format!("invalid Redis URL {target:?}")).with_source(err);

        let scripts = Scripts::new();
        let (conn, dial, cluster) = match parsed {
            Target::Standalone(url) => {
                let client = match certs {
                    Some(certs) => Client::build_with_tls(url.as_str(), certs),
                    None => Client::open(url.as_str()),
                }
                .map_err(invalid)?;
                // One attempt of our own first: the connection manager retries with backoff,
                // which would turn "connection refused" into a slow, vague timeout.
                let probe = async {
                    let mut conn = client
                        .get_multiplexed_async_connection_with_config(&probe_config(
                            connect_timeout,
                        ))
                        .await?;
                    redis::cmd("PING").query_async::<String>(&mut conn).await
                };
                connecting(&target, limit, probe).await?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_min_delay(Duration::from_millis(50))
                    // Keeps recovery prompt once the server is back.
                    .set_max_delay(Duration::from_secs(1));
                let dial = Dial::Standalone(client.clone(), config.clone());
                let conn = connecting(
                    &target,
                    limit,
                    ConnectionManager::new_with_config(client, config),
                )
                .await?;
                (Conn::Standalone(conn), dial, false)
            }
            Target::Cluster { nodes } => {
                let mut builder = ClusterClientBuilder::new(nodes);
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                let client = builder
                    .connection_timeout(connect_timeout)
                    .response_timeout(self.timeout)
                    // Our own timeout bounds every call; within it, follow redirections and
                    // retry promptly rather than back off for seconds.
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(5)
                    .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
                    .build()
                    .map_err(invalid)?;
                let conn = connecting(&target, limit, client.get_async_connection()).await?;
                (Conn::Cluster(conn), Dial::Cluster(client), true)
            }
            Target::Sentinel(t) => {
                let sentinel = sentinel_client(&t, certs.clone()).map_err(invalid)?;
                let durable = sentinel_client(&t, certs).map_err(invalid)?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(self.timeout));
                let dial = Dial::Sentinel(SentinelConnection::new(durable, config.clone(), t.db));
                let conn = SentinelConnection::new(sentinel, config, t.db);
                (Conn::Sentinel(conn), dial, false)
            }
        };

        // Loaded now so that the first check is one round trip too (on a Cluster, by every
        // node, replicas included, so that a promoted replica has them).
        let loading = async {
            let mut conn = conn.clone();
            let extra: &[&Lua] = if cluster { &scripts.cluster() } else { &[] };
            for lua in scripts.standalone().iter().chain(extra) {
                lua.load_cmd().query_async::<Value>(&mut conn).await?;
            }
            Ok(conn)
        };
        let conn = connecting(&target, limit, loading).await?;
        let store = RedisStore {
            inner: Arc::new(Inner {
                backend: Backend {
                    conn,
                    dial,
                    durable: OnceCell::new(),
                    scripts,
                    timeout: self.timeout,
                    clock: self.clock,
                    target,
                },
                batching,
                lanes: Lanes::default(),
                cache: local_cache.then(LocalCache::new),
                journal: self
                    .repair
                    .map(|horizon| Journal::new(horizon, self.timeout + 2 * WATCH_EVERY)),
                leases: crate::lease::Leases::new(),
                epoch: Instant::now(),
            }),
        };
        if store.inner.journal.is_some() {
            tokio::spawn(crate::repair::watch(Arc::downgrade(&store.inner)));
        }
        Ok(store)
    }
}

/// What a builder's URL, options and files say, before anything connects.
struct Settings {
    target: String,
    batching: bool,
    local_cache: bool,
    certs: Option<TlsCertificates>,
    parsed: Target,
}

impl RedisStoreBuilder {
    /// Checks the URL, its options and the TLS files, without connecting: the errors
    /// [`build`](Self::build) would give before it tries the network. A server can so tell
    /// a mistake in its configuration from a Redis that does not answer yet.
    pub fn check(&self) -> Result<(), StoreError> {
        self.settings().map(drop)
    }

    fn settings(&self) -> Result<Settings, StoreError> {
        let target = error::redact(&self.url);
        let bad_url = |why: String| {
            StoreError::new(
                StoreErrorKind::Protocol,
                format!("invalid Redis URL {target:?}: {why}"),
            )
        };
        let (url, options) = url::take_store_options(&self.url).map_err(bad_url)?;
        let batching = pick("batching", options.batching, self.batching).map_err(bad_url)?;
        let local_cache =
            pick("local_cache", options.local_cache, self.local_cache).map_err(bad_url)?;
        let (url, certs) = self.tls(&url).map_err(bad_url)?;
        let parsed = url::parse(&url).map_err(bad_url)?;
        if url.starts_with("rediss") {
            crypto_provider().map_err(bad_url)?;
        }
        Ok(Settings {
            target,
            batching,
            local_cache,
            certs,
            parsed,
        })
    }
}

/// A client that asks `t`'s sentinels for the primary: the sentinels' credentials and the
/// data nodes' are both taken from the URL (redis-rs decodes them), TLS and `certs` apply to
/// both.
fn sentinel_client(
    t: &SentinelTarget,
    certs: Option<TlsCertificates>,
) -> RedisResult<SentinelClient> {
    let sentinels = t
        .sentinels
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect::<RedisResult<Vec<_>>>()?;
    let node = t.node_template.as_str().into_connection_info()?;
    let node = node.redis_settings();
    let mut builder = SentinelClientBuilder::new(
        sentinels.iter().map(|s| s.addr().clone()),
        &t.master_name,
        SentinelServerType::Master,
    )?
    .set_client_to_redis_db(t.db);
    // Every sentinel URL carries the same credentials.
    if let Some(first) = sentinels.first() {
        let auth = first.redis_settings();
        if let Some(user) = auth.username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = auth.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    if let Some(user) = node.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = node.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if t.tls {
        builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
        if let Some(certs) = certs {
            builder = builder
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
        }
    }
    builder.build()
}

/// Awaits one step of connecting within `limit`; a failure says "cannot connect".
async fn connecting<T>(
    target: &str,
    limit: Duration,
    step: impl Future<Output = RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, step).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(unavailable(format!("cannot connect to {target}")).with_source(err)),
        Err(_) => Err(unavailable(format!(
            "cannot connect to {target}: no answer within {limit:?}"
        ))),
    }
}

/// A switch given in the URL or to the builder (not both); on by default.
fn pick(name: &str, from_url: Option<bool>, from_builder: Option<bool>) -> Result<bool, String> {
    match (from_url, from_builder) {
        (Some(_), Some(_)) => Err(format!(
            "{name} is given both in the URL and to the builder"
        )),
        (Some(on), None) | (None, Some(on)) => Ok(on),
        (None, None) => Ok(true),
    }
}

fn unavailable(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, message)
}

fn probe_config(timeout: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
}

/// rustls needs a process-wide crypto provider: the application's if it installed one, else
/// ring's with the `ring` feature (installed here, so an application that wants another must
/// install it before building a TLS store).
fn crypto_provider() -> Result<(), String> {
    if rustls::crypto::CryptoProvider::get_default().is_some() {
        return Ok(());
    }
    #[cfg(feature = "ring")]
    {
        // Err means another thread installed one first, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(())
    }
    #[cfg(not(feature = "ring"))]
    Err("TLS needs a rustls crypto provider: install one (e.g. \
         `rustls::crypto::aws_lc_rs::default_provider().install_default()`) before building the \
         store, or enable tollgate-redis's `ring` feature"
        .to_owned())
}
