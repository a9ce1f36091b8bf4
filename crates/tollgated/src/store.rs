//! The store: `[store]` settings, and opening the store named by `store.url`.

use std::{
    future::Future,
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::Duration,
};

use tollgate::{
    AnyStore, BanEntry, BanPage, BanStore, BanTarget, CheckRequest, LimiterRequest, LockReply,
    LockStore, MemoryStore, OnError, Override, OverridePage, OverrideStore, PageCursor, Receipt,
    RefundStore, Store, StoreError, StoreErrorKind, Verdict,
};
use tollgate_redis::{RedisStore, RedisStoreBuilder};

/// `[store]`, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreSettings {
    pub(crate) url: String,
    pub(crate) on_error: OnError,
    pub(crate) timeout: Duration,
    pub(crate) prefix: String,
    /// `tls_ca_file`, resolved against the configuration file's directory.
    pub(crate) tls_ca_file: Option<PathBuf>,
    /// `tls_cert_file` and `tls_key_file`, both or neither, resolved likewise.
    pub(crate) tls_client_cert: Option<(PathBuf, PathBuf)>,
    /// The memory store's budgets (`max_keys`, `max_bans`, ...): unset, the library's defaults.
    pub(crate) memory: MemoryBudgets,
    /// Redis: repair after a failover, remembering this long of admissions (`[store] repair`).
    pub(crate) repair: Option<Duration>,
}

/// `[store] max_keys`, `max_bans`, `max_locks`, `max_response_bytes`: the memory store's
/// budgets (see `tollgate::MemoryStore`). On Redis, `maxmemory` bounds the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MemoryBudgets {
    pub(crate) max_keys: Option<usize>,
    pub(crate) max_bans: Option<usize>,
    pub(crate) max_locks: Option<usize>,
    pub(crate) max_response_bytes: Option<usize>,
}

impl MemoryBudgets {
    fn build(&self) -> MemoryStore {
        self.builder(MemoryStore::builder()).build()
    }

    /// `builder` with these budgets.
    pub(crate) fn builder(
        &self,
        mut builder: tollgate::MemoryStoreBuilder,
    ) -> tollgate::MemoryStoreBuilder {
        if let Some(n) = self.max_keys {
            builder = builder.max_keys(n);
        }
        if let Some(n) = self.max_bans {
            builder = builder.max_bans(n);
        }
        if let Some(n) = self.max_locks {
            builder = builder.max_locks(n);
        }
        if let Some(n) = self.max_response_bytes {
            builder = builder.max_response_bytes(n);
        }
        builder
    }
}

/// Checks a store URL's scheme at configuration time, so `check-config` catches it.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    match scheme(url) {
        Some("memory") if url == "memory://" => Ok(()),
        Some("memory") => {
            Err("the memory store takes no options in its URL; use memory://".to_owned())
        }
        // tollgate-redis checks the rest when the server opens the store.
        Some(
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
            | "rediss+sentinel",
        ) => Ok(()),
        // The URL itself is not repeated: it may hold a password this function cannot find.
        Some(other) => Err(format!(
            "unknown store scheme {:?} (use memory://, redis://host:6379, rediss://, redis+cluster://, redis+sentinel://)",
            other.chars().take(32).collect::<String>()
        )),
        None => Err(
            "a store URL starts with a scheme: memory://, redis://host:6379 or rediss://host:6380"
                .to_owned(),
        ),
    }
}

fn scheme(url: &str) -> Option<&str> {
    url.split_once("://").map(|(s, _)| s)
}

/// The store as opened, kept beside the type-erased one for the figures only it reports.
pub(crate) enum Opened {
    Memory(MemoryStore),
    Redis(RedisStore),
    /// Redis did not answer at start; it is being reached (see [`Late`]).
    Late(Late),
    /// A store the caller gave (`InProcess::with_store`).
    Given,
}

impl Opened {
    /// The Redis store, once there is one (a late one once it answers).
    pub(crate) fn redis(&self) -> Option<RedisStore> {
        match self {
            Opened::Redis(redis) => Some(redis.clone()),
            Opened::Late(late) => late.0.get().cloned(),
            Opened::Memory(_) | Opened::Given => None,
        }
    }
}

/// Opens the store of `settings`: the embedded memory store, or Redis. The store is also
/// returned as itself, for its statistics.
///
/// A mistake in the settings is an error. A Redis that does not answer yet is one too with
/// `on_error = "deny"`; with `allow` or `local` the server starts degraded: every check is
/// answered by `on_error`, `/readyz` says the store is unavailable, and the store is tried
/// again in the background until it answers (logged once when it fails, once when it answers).
pub(crate) async fn open(settings: &StoreSettings) -> Result<(AnyStore, Opened), String> {
    check_url(&settings.url)?;
    if scheme(&settings.url) == Some("memory") {
        let memory = settings.memory.build();
        return Ok((AnyStore::new(memory.clone()), Opened::Memory(memory)));
    }
    let cannot = |e: StoreError| format!("cannot open the store: {e}");
    redis_builder(settings).check().map_err(cannot)?;
    match redis_builder(settings).build().await {
        Ok(store) => Ok((AnyStore::new(store.clone()), Opened::Redis(store))),
        Err(e) if settings.on_error != OnError::Deny => {
            tracing::error!(
                error = %e,
                "the store does not answer; starting degraded: every check is answered by on_error = {:?} until it does (tried again every second)",
                settings.on_error
            );
            let late = Late::default();
            tokio::spawn(late.clone().reach(settings.clone()));
            Ok((AnyStore::new(late.clone()), Opened::Late(late)))
        }
        Err(e) => Err(cannot(e)),
    }
}

fn redis_builder(settings: &StoreSettings) -> RedisStoreBuilder {
    let mut builder = RedisStore::builder(&settings.url).timeout(settings.timeout);
    if let Some(ca) = &settings.tls_ca_file {
        builder = builder.tls_ca_file(ca);
    }
    if let Some((cert, key)) = &settings.tls_client_cert {
        builder = builder.tls_client_cert(cert, key);
    }
    if let Some(horizon) = settings.repair {
        builder = builder.repair(horizon);
    }
    builder
}

/// A Redis store that did not answer at start: unavailable (so `on_error` answers) until a
/// background task reaches it, then that store.
#[derive(Clone, Default)]
pub(crate) struct Late(Arc<OnceLock<RedisStore>>);

impl Late {
    /// Builds the store until it answers, a second apart.
    async fn reach(self, settings: StoreSettings) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Ok(store) = redis_builder(&settings).build().await {
                let _ = self.0.set(store);
                tracing::info!("the store answers: checks use it from now on");
                return;
            }
        }
    }

    fn store(&self) -> Result<RedisStore, StoreError> {
        self.0.get().cloned().ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                "the store has not answered since the server started",
            )
        })
    }
}

/// Each call goes to the store once it answers; until then, it fails as unavailable.
impl Store for Late {
    fn check(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send {
        let store = self.store();
        async move { store?.check(request).await }
    }

    fn reset(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let store = self.store();
        async move { store?.reset(request).await }
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        let store = self.store();
        async move { store?.ping().await }
    }
}

impl RefundStore for Late {
    fn extend(
        &self,
        request: &CheckRequest<'_>,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<Option<Receipt>, StoreError>> + Send {
        let store = self.store();
        async move { store?.extend(request, receipt).await }
    }

    fn refund(
        &self,
        request: &CheckRequest<'_>,
        receipt: Option<&Receipt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let store = self.store();
        async move { store?.refund(request, receipt).await }
    }

    fn charge(
        &self,
        request: &CheckRequest<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let store = self.store();
        async move { store?.charge(request).await }
    }
}

impl LockStore for Late {
    fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<LockReply, StoreError>> + Send {
        let store = self.store();
        async move { store?.lock_acquire(key, token, fingerprint, ttl).await }
    }

    fn lock_release(
        &self,
        key: &str,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let store = self.store();
        async move { store?.lock_release(key, token).await }
    }

    fn lock_complete(
        &self,
        key: &str,
        token: &str,
        response: &[u8],
        keep_for: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let store = self.store();
        async move { store?.lock_complete(key, token, response, keep_for).await }
    }
}

impl BanStore for Late {
    fn bans(&self, prefix: &str) -> impl Future<Output = Result<Vec<BanEntry>, StoreError>> + Send {
        let store = self.store();
        async move { store?.bans(prefix).await }
    }

    fn ban(
        &self,
        prefix: &str,
        target: &BanTarget,
        duration: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let store = self.store();
        async move { store?.ban(prefix, target, duration).await }
    }

    fn unban(
        &self,
        prefix: &str,
        target: &BanTarget,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let store = self.store();
        async move { store?.unban(prefix, target).await }
    }

    fn ban_count(&self, prefix: &str) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let store = self.store();
        async move { store?.ban_count(prefix).await }
    }

    fn bans_page(
        &self,
        prefix: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> impl Future<Output = Result<BanPage, StoreError>> + Send {
        let store = self.store();
        async move { store?.bans_page(prefix, after, limit).await }
    }
}

impl OverrideStore for Late {
    fn set_override(
        &self,
        limiter: &LimiterRequest<'_>,
        index: &str,
        entry: &Override,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<Override, StoreError>> + Send {
        let store = self.store();
        async move { store?.set_override(limiter, index, entry, ttl).await }
    }

    fn remove_override(
        &self,
        limiter: &LimiterRequest<'_>,
        index: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let store = self.store();
        async move { store?.remove_override(limiter, index).await }
    }

    fn overrides(
        &self,
        index: &str,
    ) -> impl Future<Output = Result<Vec<Override>, StoreError>> + Send {
        let store = self.store();
        async move { store?.overrides(index).await }
    }

    fn overrides_page(
        &self,
        index: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> impl Future<Output = Result<OverridePage, StoreError>> + Send {
        let store = self.store();
        async move { store?.overrides_page(index, after, limit).await }
    }
}

/// The URL without its passwords (user info and `sentinel_password=`), for logs and
/// `check-config`.
pub(crate) fn redact(url: &str) -> String {
    tollgate_redis::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_redacted() {
        assert!(check_url("memory://").is_ok());
        assert!(check_url("redis://127.0.0.1:6379/0").is_ok());
        assert!(check_url("rediss://h:6380").is_ok());
        assert!(check_url("redis+cluster://a:7000,b:7001").is_ok());
        assert!(check_url("rediss+sentinel://s:26379/mymaster").is_ok());
        assert!(
            check_url("mysql://h")
                .unwrap_err()
                .contains("unknown store scheme")
        );
        assert!(
            check_url("localhost:6379")
                .unwrap_err()
                .contains("starts with a scheme")
        );
        // A mistyped URL's error does not repeat it: it may hold a password.
        for url in [
            "mysql://u:hunter2@h",
            "redis:/u:hunter2@h",
            "u:hunter2@h:6379",
            "memory://u:hunter2@h",
        ] {
            let e = check_url(url).unwrap_err();
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact("redis://u:pw@h"), "redis://u:***@h");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(
            redact("rediss+cluster://app:p%40ss@a:7000,b:7001/"),
            "rediss+cluster://app:***@a:7000,b:7001/"
        );
        assert_eq!(
            redact("redis+sentinel://s1/m?sentinel_password=spw&tls_ca_file=ca.pem"),
            "redis+sentinel://s1/m?sentinel_password=***&tls_ca_file=ca.pem"
        );
    }
}
