//! The store: `[store]` settings, and opening the store named by `store.url`.

use std::{path::PathBuf, time::Duration};

use tollgate::{AnyStore, MemoryStore, OnError};
use tollgate_redis::RedisStore;

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
}

/// Checks a store URL's scheme at configuration time, so `check-config` catches it.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    match scheme(url) {
        Some("memory") if url == "memory://" => Ok(()),
        Some("memory") => Err(format!(
            "{url:?}: the memory store takes no options; use memory://"
        )),
        // tollgate-redis checks the rest when the server opens the store.
        Some(
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
            | "rediss+sentinel",
        ) => Ok(()),
        Some(other) => Err(format!(
            "{url:?}: unknown store scheme {other:?} (use memory://, redis://host:6379, rediss://, redis+cluster://, redis+sentinel://)"
        )),
        None => Err(format!(
            "{url:?}: a store URL starts with a scheme: memory://, redis://host:6379 or rediss://host:6380"
        )),
    }
}

fn scheme(url: &str) -> Option<&str> {
    url.split_once("://").map(|(s, _)| s)
}

/// The store as opened, kept beside the type-erased one for the figures only it reports.
pub(crate) enum Opened {
    Memory(MemoryStore),
    Redis(RedisStore),
}

/// Opens the store of `settings`: the embedded memory store, or Redis (which must answer now).
/// The store is also returned as itself, for its statistics.
pub(crate) async fn open(settings: &StoreSettings) -> Result<(AnyStore, Opened), String> {
    check_url(&settings.url)?;
    if scheme(&settings.url) == Some("memory") {
        let memory = MemoryStore::new();
        return Ok((AnyStore::new(memory.clone()), Opened::Memory(memory)));
    }
    let mut builder = RedisStore::builder(&settings.url).timeout(settings.timeout);
    if let Some(ca) = &settings.tls_ca_file {
        builder = builder.tls_ca_file(ca);
    }
    if let Some((cert, key)) = &settings.tls_client_cert {
        builder = builder.tls_client_cert(cert, key);
    }
    let store = builder
        .build()
        .await
        .map_err(|e| format!("cannot open the store: {e}"))?;
    Ok((AnyStore::new(store.clone()), Opened::Redis(store)))
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
