//! The environment of Envoy's reference rate-limit service (`envoyproxy/ratelimit`), read by
//! `tollgate envoy-ratelimit`: its variables become configuration values, so a deployment of
//! that service runs unchanged (see docs/migrating-from-envoy-ratelimit.md). They are applied
//! before the `TOLLGATE_...` variables, which win.
//!
//! | variable | becomes |
//! |---|---|
//! | `HOST`, `PORT` (`0.0.0.0`, `8080`) | `server.http` |
//! | `GRPC_HOST`, `GRPC_PORT` (`0.0.0.0`, `8081`) | `server.grpc` |
//! | `REDIS_URL`, `REDIS_TYPE`, `REDIS_AUTH`, `REDIS_TLS` | `store.url` |
//! | `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY` | `store.tls_ca_file`, `store.tls_cert_file`, `store.tls_key_file` |
//! | `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY`, `GRPC_CLIENT_TLS_CACERT`, `GRPC_CLIENT_TLS_SAN` | `server.grpc_tls` |
//! | `CACHE_KEY_PREFIX` | `store.prefix` |
//! | `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY` | `envoy.ratelimit_config` |
//! | `RUNTIME_IGNOREDOTFILES`, `MERGE_DOMAIN_CONFIG`, `SHADOW_MODE` | `envoy.ignore_dotfiles`, `envoy.merge_domains`, `envoy.shadow` |
//! | `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` | `envoy.all_or_nothing` |
//! | `QUOTA_MODE` | `envoy.quota_mode` |
//! | `RESPONSE_DYNAMIC_METADATA` | `envoy.dynamic_metadata` |
//! | `LIMIT_RESPONSE_HEADERS_ENABLED` | `envoy.headers = "draft6"` (else `none`) |
//! | `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER` | `envoy.header_names` |
//! | `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` | `/healthcheck` fails while no domain is loaded |
//! | `NEAR_LIMIT_RATIO` (and tollgate's `TOLLGATE_ENVOY_MAX_STAT_KEYS`) | `envoy.near_limit_ratio` (`envoy.max_stat_keys`) |
//! | tollgate's `TOLLGATE_ENVOY_ATOMIC`, `TOLLGATE_ENVOY_DENIAL_HEADERS` | `envoy.atomic`, `envoy.denial_headers` |
//!
//! `LOG_LEVEL` and `LOG_FORMAT` are read where logging starts. A setting with no counterpart
//! (memcached, xDS, another socket type) is refused with the reason.

use std::{net::SocketAddr, path::PathBuf};

use toml::Spanned;

use super::{ConfigError, Parsed, RawConfig};

/// Sets the fields of `raw` from the service's variables; returns the variables used.
pub(super) fn apply(
    raw: &mut RawConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ConfigError> {
    let mut used = Vec::new();
    let mut get = |var: &str| {
        let value = lookup(var).filter(|v| !v.trim().is_empty())?;
        used.push(var.to_owned());
        Some(value.trim().to_owned())
    };
    let error = |var: &str, message: String| ConfigError::new(var, None, "", message);
    let flag = |var: &str, text: &str| -> Result<bool, ConfigError> {
        // Go's strconv.ParseBool, which the service's settings use.
        match text {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
            _ => Err(error(var, format!("{text:?}: expected true or false"))),
        }
    };

    if let Some(backend) = get("BACKEND_TYPE") {
        if !backend.eq_ignore_ascii_case("redis") {
            return Err(error(
                "BACKEND_TYPE",
                format!(
                    "{backend:?}: only redis is supported (or TOLLGATE_STORE_URL=memory:// for one process)"
                ),
            ));
        }
    }
    if let Some(kind) = get("CONFIG_TYPE") {
        if !kind.eq_ignore_ascii_case("FILE") {
            return Err(error(
                "CONFIG_TYPE",
                format!("{kind:?}: only FILE is supported (the YAML runtime directory)"),
            ));
        }
    }

    // Listen addresses: the service's defaults, unless the TOML file sets them.
    let host = get("HOST");
    let port = get("PORT");
    if host.is_some() || port.is_some() || raw.server.http.is_none() {
        let addr = listen("PORT", host.as_deref(), port.as_deref(), 8080)?;
        raw.server.http = Some(Parsed(addr));
    }
    let grpc_host = get("GRPC_HOST");
    let grpc_port = get("GRPC_PORT");
    if grpc_host.is_some() || grpc_port.is_some() || raw.server.grpc.is_none() {
        let addr = listen(
            "GRPC_PORT",
            grpc_host.as_deref(),
            grpc_port.as_deref(),
            8081,
        )?;
        raw.server.grpc = Some(Parsed(addr));
    }

    if let Some(url) = get("REDIS_URL") {
        let kind = get("REDIS_TYPE").unwrap_or_else(|| "single".into());
        let auth = get("REDIS_AUTH");
        let tls = match get("REDIS_TLS") {
            Some(text) => flag("REDIS_TLS", &text)?,
            None => false,
        };
        if let Some(socket) = get("REDIS_SOCKET_TYPE") {
            if !socket.eq_ignore_ascii_case("tcp") {
                return Err(error(
                    "REDIS_SOCKET_TYPE",
                    format!("{socket:?}: only tcp is supported (a Unix socket is not)"),
                ));
            }
        }
        let store_url = redis_url(&url, &kind, auth.as_deref(), tls)?;
        raw.store.url = Some(Spanned::new(super::env::FROM_ENV, store_url));
    } else if raw.store.url.is_none() && lookup("TOLLGATE_STORE_URL").is_none() {
        return Err(error(
            "REDIS_URL",
            "not set: give REDIS_URL=host:port (the service's default, a Unix socket, is not supported), or TOLLGATE_STORE_URL=memory:// for one process".into(),
        ));
    }
    // The reference's Redis TLS files (its roots are the system's plus the CA file; here the
    // CA file replaces them when given).
    let file = |path: String| Some(Spanned::new(super::env::FROM_ENV, path));
    if let Some(ca) = get("REDIS_TLS_CACERT") {
        raw.store.tls_ca_file = file(ca);
    }
    match (get("REDIS_TLS_CLIENT_CERT"), get("REDIS_TLS_CLIENT_KEY")) {
        (Some(cert), Some(key)) => {
            raw.store.tls_cert_file = file(cert);
            raw.store.tls_key_file = file(key);
        }
        (None, None) => {}
        (Some(_), None) => {
            return Err(error(
                "REDIS_TLS_CLIENT_KEY",
                "not set: REDIS_TLS_CLIENT_CERT needs its key".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(error(
                "REDIS_TLS_CLIENT_CERT",
                "not set: REDIS_TLS_CLIENT_KEY needs its certificate".into(),
            ));
        }
    }
    if let Some(text) = get("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION") {
        if flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", &text)? {
            return Err(error(
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
                "true is not supported: Redis certificates are verified with their host names (give the name they were issued for in REDIS_URL)".into(),
            ));
        }
    }
    // TLS on the gRPC port, as the reference reads it; asked for, it is served or the start
    // fails, never plaintext.
    if let Some(text) = get("GRPC_SERVER_USE_TLS") {
        if flag("GRPC_SERVER_USE_TLS", &text)? {
            let (Some(cert), Some(key)) = (get("GRPC_SERVER_TLS_CERT"), get("GRPC_SERVER_TLS_KEY"))
            else {
                return Err(error(
                    "GRPC_SERVER_TLS_CERT",
                    "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
                        .into(),
                ));
            };
            raw.server.grpc_tls = Some(Spanned::new(
                super::env::FROM_ENV,
                super::RawTls {
                    cert_file: cert,
                    key_file: key,
                    client_ca_file: get("GRPC_CLIENT_TLS_CACERT"),
                    client_san: get("GRPC_CLIENT_TLS_SAN"),
                },
            ));
        }
    }
    if let Some(prefix) = get("CACHE_KEY_PREFIX") {
        raw.store.prefix = Some(Spanned::new(super::env::FROM_ENV, prefix));
    }

    if raw.envoy.ratelimit_config.is_none() || lookup("RUNTIME_ROOT").is_some() {
        let root = get("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into());
        let mut dir = PathBuf::from(root);
        if let Some(sub) = get("RUNTIME_SUBDIRECTORY") {
            dir.push(sub);
        }
        dir.push(get("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
        raw.envoy.ratelimit_config = Some(Spanned::new(
            super::env::FROM_ENV,
            dir.to_string_lossy().into_owned(),
        ));
    }
    if let Some(text) = get("RUNTIME_IGNOREDOTFILES") {
        raw.envoy.ignore_dotfiles = flag("RUNTIME_IGNOREDOTFILES", &text)?;
    }
    if let Some(text) = get("MERGE_DOMAIN_CONFIG") {
        raw.envoy.merge_domains = flag("MERGE_DOMAIN_CONFIG", &text)?;
    }
    if let Some(text) = get("SHADOW_MODE") {
        raw.envoy.shadow = flag("SHADOW_MODE", &text)?;
    }
    if let Some(text) = get("RESPONSE_DYNAMIC_METADATA") {
        raw.envoy.dynamic_metadata = flag("RESPONSE_DYNAMIC_METADATA", &text)?;
    }
    if let Some(text) = get("QUOTA_MODE") {
        raw.envoy.quota_mode = flag("QUOTA_MODE", &text)?;
    }
    if let Some(text) = get("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT") {
        raw.envoy.all_or_nothing = flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", &text)?;
    }
    if let Some(text) = get("NEAR_LIMIT_RATIO") {
        let ratio = text.parse::<f32>().map_err(|_| {
            error(
                "NEAR_LIMIT_RATIO",
                format!("{text:?}: expected a share of the limit, e.g. 0.8"),
            )
        })?;
        raw.envoy.near_limit_ratio = Some(ratio);
    }
    // tollgate's own answers, asked for: each a switch.
    if let Some(text) = get("TOLLGATE_ENVOY_ATOMIC") {
        raw.envoy.atomic = flag("TOLLGATE_ENVOY_ATOMIC", &text)?;
    }
    if let Some(text) = get("TOLLGATE_ENVOY_DENIAL_HEADERS") {
        raw.envoy.denial_headers = flag("TOLLGATE_ENVOY_DENIAL_HEADERS", &text)?;
    }
    if let Some(text) = get("TOLLGATE_ENVOY_MAX_STAT_KEYS") {
        let max = text.parse::<usize>().map_err(|_| {
            error(
                "TOLLGATE_ENVOY_MAX_STAT_KEYS",
                format!("{text:?}: expected a whole number of keys"),
            )
        })?;
        raw.envoy.max_stat_keys = Some(max);
    }
    if let Some(text) = get("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED") {
        raw.envoy.require_domains = flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", &text)?;
    }
    let vars = [
        ("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
        ("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
        ("LIMIT_RESET_HEADER", "RateLimit-Reset"),
    ];
    let names = vars.map(|(var, default)| get(var).unwrap_or_else(|| default.to_owned()));
    for ((var, _), name) in vars.iter().zip(&names) {
        if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(error(var, format!("{name:?}: not a header name")));
        }
    }
    if raw.envoy.header_names.is_none() {
        raw.envoy.header_names = Some(names);
    }
    let headers = match get("LIMIT_RESPONSE_HEADERS_ENABLED") {
        Some(text) => flag("LIMIT_RESPONSE_HEADERS_ENABLED", &text)?,
        None => false,
    };
    if raw.envoy.headers.is_none() {
        raw.envoy.headers = Some(if headers {
            tollgate::fields::HeaderStyle::Draft6
        } else {
            tollgate::fields::HeaderStyle::None
        });
    }
    Ok(used)
}

fn listen(
    var: &str,
    host: Option<&str>,
    port: Option<&str>,
    default_port: u16,
) -> Result<SocketAddr, ConfigError> {
    let host = host.unwrap_or("0.0.0.0");
    let port = match port {
        Some(text) => text.parse::<u16>().map_err(|_| {
            ConfigError::new(var, None, "", format!("{text:?}: expected a port number"))
        })?,
        None => default_port,
    };
    let text = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    text.parse().map_err(|e| {
        ConfigError::new(
            var,
            None,
            "",
            format!("{text:?}: {e} (HOST and GRPC_HOST take IP addresses)"),
        )
    })
}

/// The store URL of the service's Redis settings: `single` (`host:port`), `sentinel`
/// (`master,host:port,...`) or `cluster` (`host:port,...`); `REDIS_AUTH` is `password` or
/// `user:password`.
fn redis_url(url: &str, kind: &str, auth: Option<&str>, tls: bool) -> Result<String, ConfigError> {
    let error = |var: &str, message: String| ConfigError::new(var, None, "", message);
    if url.starts_with('/') {
        return Err(error(
            "REDIS_URL",
            format!("{url:?}: a Unix socket is not supported; give host:port"),
        ));
    }
    let userinfo = match auth {
        None => String::new(),
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
            None => format!(":{}@", encode(auth)),
        },
    };
    let s = if tls { "s" } else { "" };
    let hosts = |list: &str| list.split(',').map(str::trim).collect::<Vec<_>>().join(",");
    match kind.to_ascii_lowercase().as_str() {
        "single" => Ok(format!("redis{s}://{userinfo}{}", url.trim())),
        "cluster" => Ok(format!("redis{s}+cluster://{userinfo}{}", hosts(url))),
        "sentinel" => {
            let Some((master, sentinels)) = url.split_once(',') else {
                return Err(error(
                    "REDIS_URL",
                    format!(
                        "{url:?}: with REDIS_TYPE=sentinel, give master,host:port[,host:port...]"
                    ),
                ));
            };
            Ok(format!(
                "redis{s}+sentinel://{userinfo}{}/{}",
                hosts(sentinels),
                master.trim()
            ))
        }
        other => Err(error(
            "REDIS_TYPE",
            format!("{other:?}: expected single, sentinel or cluster"),
        )),
    }
}

/// Percent-encodes what a URL's user info cannot hold as is.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_settings_become_store_urls() {
        assert_eq!(
            redis_url("localhost:6379", "SINGLE", None, false).unwrap(),
            "redis://localhost:6379"
        );
        assert_eq!(
            redis_url("r:6380", "single", Some("p@ss"), true).unwrap(),
            "rediss://:p%40ss@r:6380"
        );
        assert_eq!(
            redis_url("a:7000, b:7001", "cluster", Some("app:secret"), false).unwrap(),
            "redis+cluster://app:secret@a:7000,b:7001"
        );
        assert_eq!(
            redis_url("mymaster,s1:26379,s2:26379", "sentinel", None, false).unwrap(),
            "redis+sentinel://s1:26379,s2:26379/mymaster"
        );
        let e = redis_url("/var/run/nutcracker/ratelimit.sock", "single", None, false).unwrap_err();
        assert!(
            e.to_string().contains("a Unix socket is not supported"),
            "{e}"
        );
        let e = redis_url("a", "replicated", None, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "REDIS_TYPE: \"replicated\": expected single, sentinel or cluster"
        );
    }

    #[test]
    fn listen_addresses_take_the_services_defaults() {
        assert_eq!(
            listen("PORT", None, None, 8080).unwrap().to_string(),
            "0.0.0.0:8080"
        );
        assert_eq!(
            listen("PORT", Some("::1"), Some("9000"), 8080)
                .unwrap()
                .to_string(),
            "[::1]:9000"
        );
        assert!(listen("PORT", None, Some("http"), 8080).is_err());
    }
}
