//! `[webhook]`: where warnings are posted (see `crate::webhook`).
//!
//! ```toml
//! [webhook]
//! url = "https://hooks.example.com/tollgate"  # http:// or https://; unset: no webhook
//! ca = "hooks-ca.pem"                         # https: trust this CA file (else the system's)
//! timeout = "5s"                              # a delivery that takes longer fails
//! ```

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, Errors, bounded_duration};

/// `[webhook]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWebhook {
    url: Option<Spanned<String>>,
    ca: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
}

/// `[webhook]`, validated: `None` without a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WebhookSettings {
    /// The URL as written, for logs.
    pub(crate) url: String,
    pub(crate) https: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The path and query the POST goes to (`/` at least).
    pub(crate) path: String,
    /// https: the CA file to trust instead of the system's roots.
    pub(crate) ca: Option<PathBuf>,
    pub(crate) timeout: Duration,
}

impl RawWebhook {
    pub(super) fn validate(
        self,
        errors: &Errors<'_>,
    ) -> Result<Option<WebhookSettings>, ConfigError> {
        let Some(url) = self.url else {
            if let Some(ca) = &self.ca {
                return Err(errors.at(Some(ca.span()), "webhook.ca", "goes with webhook.url"));
            }
            return Ok(None);
        };
        // The URL is not repeated: a webhook's often holds its secret (in the path, the
        // query or the user info), and a failed reload's error is shown on the stats page.
        let bad = |why: &str| {
            errors.at(
                Some(url.span()),
                "webhook.url",
                format!(
                    "{why}: expected e.g. \"https://hooks.example.com/tollgate\" or \
                     \"http://127.0.0.1:9000/hooks\""
                ),
            )
        };
        let text = url.get_ref().trim();
        let (https, rest) = match text.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            _ => return Err(bad("the scheme is http or https")),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        if authority.contains('@') {
            return Err(bad("credentials go in the path or query, not the host"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            // An IPv6 address in brackets has colons of its own.
            Some((host, port)) if !port.contains(']') => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| bad("the port is a number"))?;
                (host, port)
            }
            _ => (authority, if https { 443 } else { 80 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || path.chars().any(char::is_whitespace) {
            return Err(bad("a host, and a path without spaces"));
        }
        let ca = match self.ca {
            Some(ca) if !https => {
                return Err(errors.at(
                    Some(ca.span()),
                    "webhook.ca",
                    "a CA is for an https:// URL",
                ));
            }
            Some(ca) => {
                let given = PathBuf::from(ca.get_ref());
                Some(match Path::new(errors.file).parent() {
                    Some(dir) if given.is_relative() => dir.join(given),
                    _ => given,
                })
            }
            None => None,
        };
        let timeout = match self.timeout {
            None => Duration::from_secs(5),
            Some(t) => bounded_duration(t.get_ref())
                .ok()
                .filter(|d| !d.is_zero() && *d <= Duration::from_secs(60))
                .ok_or_else(|| {
                    errors.at(
                        Some(t.span()),
                        "webhook.timeout",
                        "expected a duration from 1ms to 60s, e.g. \"5s\"",
                    )
                })?,
        };
        Ok(Some(WebhookSettings {
            url: text.to_owned(),
            https,
            host: host.to_owned(),
            port,
            path: path.to_owned(),
            ca,
            timeout,
        }))
    }
}
