//! `[server]`, `[store]` and `[record]` from the environment: `TOLLGATE_SERVER_<FIELD>`,
//! `TOLLGATE_STORE_<FIELD>` and `TOLLGATE_RECORD_<FIELD>` (the field's name in capitals: `TOLLGATE_STORE_URL`,
//! `TOLLGATE_SERVER_MAX_BATCH`) replace the file's value, so that secrets (a Redis URL with its
//! password) and per-deployment settings need not be written into the file.
//!
//! A value from the environment is validated like one from the file; an error names the
//! variable instead of a line. `check-config` lists the variables in force.

use std::{net::SocketAddr, ops::Range, str::FromStr};

use serde::de::IntoDeserializer as _;
use toml::Spanned;

use super::{ConfigError, DurationText, Parsed, RawConfig, bounded_duration};

/// The span given to a value that came from the environment: errors about it name the
/// variable (see [`var_of`]) instead of a line of the file.
pub(super) const FROM_ENV: Range<usize> = usize::MAX..usize::MAX;

/// The variable that overrides `field` (`server.max_batch` -> `TOLLGATE_SERVER_MAX_BATCH`).
pub(super) fn var_of(field: &str) -> String {
    format!("TOLLGATE_{}", field.replace('.', "_").to_ascii_uppercase())
}

/// Replaces the fields of `raw` whose variable `lookup` finds (every field of `[server]` and
/// `[store]` that is one value, and `[record]`'s `path`, `sample` and `identities`); returns
/// the variables used, in the order they are read.
pub(super) fn apply(
    raw: &mut RawConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ConfigError> {
    let mut used = Vec::new();
    let mut get = |field: &str| {
        let var = var_of(field);
        let value = lookup(&var)?;
        used.push(var.clone());
        Some((var, value))
    };
    let error = |var: &str, field: &str, message: String| ConfigError {
        more: Vec::new(),
        file: var.to_owned(),
        line: None,
        field: field.to_owned(),
        message,
    };
    let parsed = |field: &str, var: String, text: String| -> Result<_, ConfigError> {
        text.parse::<SocketAddr>()
            .map(Parsed)
            .map_err(|e| error(&var, field, format!("{text:?}: {e}")))
    };
    let number = |field: &str, var: String, text: String| -> Result<_, ConfigError> {
        text.trim()
            .parse::<u32>()
            .map(|n| Spanned::new(FROM_ENV, n))
            .map_err(|_| {
                error(
                    &var,
                    field,
                    format!("{text:?}: expected a whole number from 0 to {}", u32::MAX),
                )
            })
    };
    let duration = |field: &str, var: String, text: String| -> Result<_, ConfigError> {
        bounded_duration(text.trim())
            .map(|d| Spanned::new(FROM_ENV, DurationText(d)))
            .map_err(|e| error(&var, field, e))
    };
    let string = |text: String| Spanned::new(FROM_ENV, text);
    fn from_str<T: FromStr>(
        field: &str,
        var: &str,
        text: &str,
        expected: &str,
    ) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        text.trim().parse().map_err(|e| ConfigError {
            more: Vec::new(),
            file: var.to_owned(),
            line: None,
            field: field.to_owned(),
            message: format!("{text:?}: {e}{expected}"),
        })
    }

    let s = &mut raw.server;
    if let Some((var, v)) = get("server.http") {
        s.http = Some(parsed("server.http", var, v)?);
    }
    if let Some((var, v)) = get("server.grpc") {
        s.grpc = Some(parsed("server.grpc", var, v)?);
    }
    for (field, slot) in [
        ("server.admin_token_env", &mut s.admin_token_env),
        ("server.check_token_env", &mut s.check_token_env),
        ("server.refund_token_env", &mut s.refund_token_env),
        ("server.receipt_key_env", &mut s.receipt_key_env),
    ] {
        if let Some((_, v)) = get(field) {
            *slot = Some(string(v));
        }
    }
    for (field, slot) in [
        ("server.header_read_timeout", &mut s.header_read_timeout),
        ("server.body_read_timeout", &mut s.body_read_timeout),
        ("server.idle_timeout", &mut s.idle_timeout),
        ("server.write_timeout", &mut s.write_timeout),
        ("server.max_keep_for", &mut s.max_keep_for),
        ("server.max_delay", &mut s.max_delay),
    ] {
        if let Some((var, v)) = get(field) {
            *slot = Some(duration(field, var, v)?);
        }
    }
    for (field, slot) in [
        ("server.max_connections", &mut s.max_connections),
        (
            "server.max_connections_per_ip",
            &mut s.max_connections_per_ip,
        ),
        ("server.max_health_watches", &mut s.max_health_watches),
        ("server.max_rlqs_bucket_bytes", &mut s.max_rlqs_bucket_bytes),
        (
            "server.grpc_max_message_bytes",
            &mut s.grpc_max_message_bytes,
        ),
        (
            "server.grpc_max_concurrent_streams",
            &mut s.grpc_max_concurrent_streams,
        ),
        ("server.max_batch", &mut s.max_batch),
        ("server.max_batch_cost", &mut s.max_batch_cost),
        ("server.max_descriptors", &mut s.max_descriptors),
        (
            "server.max_descriptor_entries",
            &mut s.max_descriptor_entries,
        ),
        ("server.max_stored_response", &mut s.max_stored_response),
    ] {
        if let Some((var, v)) = get(field) {
            *slot = Some(number(field, var, v)?);
        }
    }
    if let Some((var, v)) = get("server.admin_failure_limit") {
        s.admin_failure_limit = Some(from_str("server.admin_failure_limit", &var, &v, "")?);
    }
    if let Some((var, v)) = get("server.dashboard") {
        s.dashboard = Some(from_str(
            "server.dashboard",
            &var,
            &v,
            " (use true or false)",
        )?);
    }
    if let Some((var, v)) = get("server.headers") {
        s.headers = Some(from_str("server.headers", &var, &v, "")?);
    }
    let st = &mut raw.store;
    // Checked where the file's value is, by the same code; errors name the variable.
    if let Some((_, v)) = get("store.url") {
        st.url = Some(string(v));
    }
    if let Some((var, v)) = get("store.on_error") {
        let text: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            v.trim().into_deserializer();
        let on_error = serde::Deserialize::deserialize(text)
            .map_err(|e| error(&var, "store.on_error", format!("{v:?}: {e}")))?;
        st.on_error = Some(on_error);
    }
    if let Some((var, v)) = get("store.timeout") {
        st.timeout = Some(duration("store.timeout", var, v)?);
    }
    if let Some((var, v)) = get("store.repair") {
        st.repair = Some(duration("store.repair", var, v)?);
    }
    if let Some((_, v)) = get("store.prefix") {
        st.prefix = Some(string(v));
    }
    if let Some((_, v)) = get("store.tls_ca_file") {
        st.tls_ca_file = Some(string(v));
    }
    if let Some((_, v)) = get("store.tls_cert_file") {
        st.tls_cert_file = Some(string(v));
    }
    if let Some((_, v)) = get("store.tls_key_file") {
        st.tls_key_file = Some(string(v));
    }
    for (field, slot) in [
        ("store.max_keys", &mut st.max_keys),
        ("store.max_bans", &mut st.max_bans),
        ("store.max_locks", &mut st.max_locks),
    ] {
        if let Some((var, v)) = get(field) {
            *slot = Some(number(field, var, v)?);
        }
    }
    if let Some((var, v)) = get("store.max_response_bytes") {
        let bytes = from_str(
            "store.max_response_bytes",
            &var,
            &v,
            " (a whole number of bytes)",
        )?;
        st.max_response_bytes = Some(Spanned::new(FROM_ENV, bytes));
    }
    let r = &mut raw.record;
    if let Some((_, v)) = get("record.path") {
        r.path = Some(string(v));
    }
    if let Some((var, v)) = get("record.sample") {
        let share = v.trim().parse::<f64>().map_err(|_| {
            error(
                &var,
                "record.sample",
                format!("{v:?}: expected a number above 0 and at most 1"),
            )
        })?;
        r.sample = Some(Spanned::new(FROM_ENV, share));
    }
    if let Some((_, v)) = get("record.identities") {
        r.identities = Some(string(v.trim().to_owned()));
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::Config;

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<Config, String> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::parse_with_env("t.toml", text, &|var| env.get(var).cloned())
            .map_err(|e| e.to_string())
    }

    const FILE: &str = r#"
[server]
http = "127.0.0.1:8080"
max_batch = 10

[store]
prefix = "file"
"#;

    #[test]
    fn variables_replace_the_files_values() {
        let config = parse(
            FILE,
            &[
                ("TOLLGATE_SERVER_HTTP", "0.0.0.0:9000"),
                ("TOLLGATE_SERVER_MAX_BATCH", "50"),
                ("TOLLGATE_SERVER_DASHBOARD", "true"),
                ("TOLLGATE_SERVER_HEADER_READ_TIMEOUT", "2s"),
                ("TOLLGATE_SERVER_ADMIN_FAILURE_LIMIT", "3/1m"),
                ("TOLLGATE_SERVER_HEADERS", "legacy"),
                ("TOLLGATE_STORE_PREFIX", "env"),
                ("TOLLGATE_STORE_ON_ERROR", "deny"),
                ("TOLLGATE_STORE_URL", "redis://:s3cret@10.0.0.5:6379/0"),
                ("TOLLGATE_STORE_REPAIR", "3s"),
                ("TOLLGATE_SERVERHTTP", "ignored"),
            ],
        )
        .unwrap();
        assert_eq!(config.server.http.to_string(), "0.0.0.0:9000");
        assert_eq!(config.server.max_batch, 50);
        assert!(config.server.dashboard_enabled());
        assert_eq!(
            config.server.header_read_timeout,
            std::time::Duration::from_secs(2)
        );
        assert_eq!(config.server.admin_failure_limit.to_string(), "3/1m");
        assert_eq!(config.server.headers, tollgate::fields::HeaderStyle::Legacy);
        assert_eq!(config.store.prefix, "env");
        assert_eq!(config.store.on_error, tollgate::OnError::Deny);
        assert_eq!(config.store.repair, Some(std::time::Duration::from_secs(3)));
        let summary = config.summary();
        assert!(
            summary.contains("from the environment: TOLLGATE_SERVER_HTTP, TOLLGATE_SERVER_HEADER_READ_TIMEOUT, TOLLGATE_SERVER_MAX_BATCH, TOLLGATE_SERVER_ADMIN_FAILURE_LIMIT, TOLLGATE_SERVER_DASHBOARD, TOLLGATE_SERVER_HEADERS, TOLLGATE_STORE_URL, TOLLGATE_STORE_ON_ERROR, TOLLGATE_STORE_REPAIR, TOLLGATE_STORE_PREFIX"),
            "{summary}"
        );
        assert!(!summary.contains("s3cret"), "{summary}");

        // Every field of one value has its variable: the limits and the environment
        // variables naming secrets too.
        let config = parse(
            FILE,
            &[
                ("TOLLGATE_SERVER_MAX_DELAY", "2s"),
                ("TOLLGATE_SERVER_MAX_KEEP_FOR", "5m"),
                ("TOLLGATE_SERVER_MAX_DESCRIPTORS", "7"),
                ("TOLLGATE_SERVER_MAX_CONNECTIONS_PER_IP", "9"),
                ("TOLLGATE_SERVER_IDLE_TIMEOUT", "30s"),
                ("TOLLGATE_SERVER_RECEIPT_KEY_ENV", "RECEIPT_KEY"),
                ("TOLLGATE_STORE_MAX_KEYS", "5000"),
                ("TOLLGATE_STORE_MAX_RESPONSE_BYTES", "65536"),
            ],
        )
        .unwrap();
        assert_eq!(config.server.max_delay, std::time::Duration::from_secs(2));
        assert_eq!(
            config.server.max_keep_for,
            std::time::Duration::from_secs(300)
        );
        assert_eq!(config.server.max_descriptors, 7);
        assert_eq!(config.server.max_connections_per_ip, 9);
        assert_eq!(
            config.server.idle_timeout,
            std::time::Duration::from_secs(30)
        );
        assert_eq!(
            config.server.receipt_key_env.as_deref(),
            Some("RECEIPT_KEY")
        );
        assert_eq!(config.store.memory.max_keys, Some(5000));
        assert_eq!(config.store.memory.max_response_bytes, Some(65536));
        let bad = parse(FILE, &[("TOLLGATE_SERVER_MAX_DELAY", "soon")]).unwrap_err();
        assert!(
            bad.starts_with("TOLLGATE_SERVER_MAX_DELAY: server.max_delay:"),
            "{bad}"
        );

        // Without variables, the file's values.
        let config = parse(FILE, &[]).unwrap();
        assert_eq!(config.server.max_batch, 10);
        assert_eq!(config.store.prefix, "file");
        assert!(!config.summary().contains("environment"));
    }

    #[test]
    fn a_bad_value_names_its_variable() {
        for (var, value, message) in [
            (
                "TOLLGATE_SERVER_MAX_BATCH",
                "lots",
                r#"TOLLGATE_SERVER_MAX_BATCH: server.max_batch: "lots": expected a whole number from 0 to 4294967295"#,
            ),
            (
                "TOLLGATE_SERVER_MAX_BATCH",
                "0",
                "TOLLGATE_SERVER_MAX_BATCH: server.max_batch: the batch size limit must be at least 1",
            ),
            (
                "TOLLGATE_STORE_TIMEOUT",
                "5x",
                r#"TOLLGATE_STORE_TIMEOUT: store.timeout: "5x": unknown unit "x" (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"#,
            ),
            (
                "TOLLGATE_STORE_URL",
                "mysql://h",
                r#"TOLLGATE_STORE_URL: store.url: unknown store scheme "mysql" (use memory://, redis://host:6379, rediss://, redis+cluster://, redis+sentinel://)"#,
            ),
            (
                "TOLLGATE_STORE_PREFIX",
                "",
                "TOLLGATE_STORE_PREFIX: store.prefix: the key prefix cannot be empty",
            ),
            (
                "TOLLGATE_SERVER_DASHBOARD",
                "yes",
                r#"TOLLGATE_SERVER_DASHBOARD: server.dashboard: "yes": provided string was not `true` or `false` (use true or false)"#,
            ),
        ] {
            assert_eq!(parse(FILE, &[(var, value)]).unwrap_err(), message);
        }
        let e = parse(FILE, &[("TOLLGATE_STORE_ON_ERROR", "maybe")]).unwrap_err();
        assert!(
            e.starts_with(r#"TOLLGATE_STORE_ON_ERROR: store.on_error: "maybe": unknown variant"#),
            "{e}"
        );
    }
}
