//! Store URLs: which deployment, which nodes, which credentials, which TLS files.

use std::path::PathBuf;

/// What a store URL names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `redis://` or `rediss://`: one server, the URL as redis-rs reads it.
    Standalone(String),
    /// `redis+cluster://` or `rediss+cluster://`: the seed nodes, each as a redis-rs URL.
    Cluster { nodes: Vec<String> },
    /// `redis+sentinel://` or `rediss+sentinel://`.
    Sentinel(SentinelTarget),
}

/// The parts of a Sentinel URL.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SentinelTarget {
    /// Each sentinel as a redis-rs URL, with the `sentinel_user` / `sentinel_password`
    /// credentials if given.
    pub(crate) sentinels: Vec<String>,
    /// The name the sentinels know the primary by.
    pub(crate) master_name: String,
    /// A redis-rs URL for the data nodes with a placeholder address: its credentials, database
    /// and TLS apply to whichever primary the sentinels name.
    pub(crate) node_template: String,
    /// The database number on the data nodes.
    pub(crate) db: i64,
    /// TLS to the data nodes and the sentinels.
    pub(crate) tls: bool,
}

/// Reads `url`; the error says what is wrong, never the password.
pub(crate) fn parse(url: &str) -> Result<Target, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(Target::Standalone(url.to_owned()));
    };
    let (base, kind) = match scheme {
        "redis+cluster" => ("redis", Kind::Cluster),
        "rediss+cluster" => ("rediss", Kind::Cluster),
        "redis+sentinel" => ("redis", Kind::Sentinel),
        "rediss+sentinel" => ("rediss", Kind::Sentinel),
        _ => return Ok(Target::Standalone(url.to_owned())),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    // The last `@` ends the user info, as in `error::redact`.
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (Some(userinfo), rest),
        None => (None, rest),
    };
    let (hosts, path) = match rest.split_once('/') {
        Some((hosts, path)) => (hosts, path),
        None => (rest, ""),
    };
    let default_port = match kind {
        Kind::Cluster => 6379,
        Kind::Sentinel => 26379,
    };
    let hosts = hosts
        .split(',')
        .map(|h| host_port(h, default_port))
        .collect::<Result<Vec<_>, String>>()?;
    let mut sentinel_user = None;
    let mut sentinel_password = None;
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("sentinel_user", v)) if kind == Kind::Sentinel => sentinel_user = Some(v),
            Some(("sentinel_password", v)) if kind == Kind::Sentinel => {
                sentinel_password = Some(v);
            }
            _ => {
                let name = pair.split_once('=').map_or(pair, |(name, _)| name);
                return Err(format!("unknown URL parameter {name:?}"));
            }
        }
    }
    let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    match kind {
        Kind::Cluster => {
            let db = path.trim_end_matches('/');
            if !db.is_empty() && db != "0" {
                return Err("a Redis Cluster has only database 0".to_owned());
            }
            let nodes = hosts
                .iter()
                .map(|(host, port)| format!("{base}://{auth}{host}:{port}/"))
                .collect();
            Ok(Target::Cluster { nodes })
        }
        Kind::Sentinel => {
            let path = path.trim_end_matches('/');
            let (master_name, db) = match path.split_once('/') {
                Some((name, db)) => (name, db),
                None => (path, "0"),
            };
            if master_name.is_empty() {
                return Err(
                    "a Sentinel URL names its master: redis+sentinel://host:port/<master name>"
                        .to_owned(),
                );
            }
            let db: i64 = db
                .parse()
                .map_err(|_| format!("{db:?} is not a database number"))?;
            let sentinel_auth = match (sentinel_user, sentinel_password) {
                (None, None) => String::new(),
                (user, password) => format!(
                    "{}{}@",
                    user.unwrap_or_default(),
                    password.map(|p| format!(":{p}")).unwrap_or_default()
                ),
            };
            let sentinels = hosts
                .iter()
                .map(|(host, port)| format!("{base}://{sentinel_auth}{host}:{port}/"))
                .collect();
            Ok(Target::Sentinel(SentinelTarget {
                sentinels,
                master_name: master_name.to_owned(),
                node_template: format!("{base}://{auth}localhost:6379/{db}"),
                db,
                tls: base == "rediss",
            }))
        }
    }
}

/// The TLS files a URL names with `tls_ca_file`, `tls_cert_file` and `tls_key_file`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// PEM certificates to trust instead of the system's roots.
    pub(crate) ca: Option<PathBuf>,
    /// The client certificate (PEM chain) for servers that require one.
    pub(crate) cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub(crate) key: Option<PathBuf>,
}

impl TlsFiles {
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

/// Takes the TLS file parameters out of `url`'s query: the URL without them, and the files
/// (percent-decoded paths). Every other parameter stays, in order, for the next reader.
/// Whether the scheme is a TLS one is for the caller to check, once the builder's files are
/// added.
pub(crate) fn take_tls_files(url: &str) -> Result<(String, TlsFiles), String> {
    let mut files = TlsFiles::default();
    let rest = take_params(url, |name, value| {
        let slot = match name {
            "tls_ca_file" => &mut files.ca,
            "tls_cert_file" => &mut files.cert,
            "tls_key_file" => &mut files.key,
            _ => return Ok(false),
        };
        if value.is_empty() {
            return Err(format!("URL parameter {name:?} needs a file path"));
        }
        if slot.is_some() {
            return Err(format!("URL parameter {name:?} is given twice"));
        }
        *slot = Some(PathBuf::from(percent_decode(value)?));
        Ok(true)
    })?;
    Ok((rest, files))
}

/// `url` without the query parameters `take` claims: `take(name, value)` is called for each
/// parameter in order and answers whether it took it (or why the parameter is wrong). Every
/// other parameter stays, in order, and so does a fragment (`#insecure`).
fn take_params(
    url: &str,
    mut take: impl FnMut(&str, &str) -> Result<bool, String>,
) -> Result<String, String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    // A fragment follows the query.
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !take(name, value)? {
            kept.push(pair);
        }
    }
    let mut rest = base.to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    if let Some(fragment) = fragment {
        rest.push('#');
        rest.push_str(fragment);
    }
    Ok(rest)
}

/// The store's own switches a URL may carry: `batching=` and `local_cache=`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreOptions {
    pub(crate) batching: Option<bool>,
    pub(crate) local_cache: Option<bool>,
}

/// Takes `batching` and `local_cache` (each `on` or `off`; also `true`/`false`, `1`/`0`)
/// out of `url`'s query: the URL without them, and their values. Every other parameter stays,
/// in order.
pub(crate) fn take_store_options(url: &str) -> Result<(String, StoreOptions), String> {
    let mut options = StoreOptions::default();
    let rest = take_params(url, |name, value| {
        let slot = match name {
            "batching" => &mut options.batching,
            "local_cache" => &mut options.local_cache,
            _ => return Ok(false),
        };
        if slot.is_some() {
            return Err(format!("URL parameter {name:?} is given twice"));
        }
        *slot = Some(match value {
            "on" | "true" | "1" => true,
            "off" | "false" | "0" => false,
            other => {
                return Err(format!(
                    "URL parameter {name:?}: {other:?} is neither on nor off"
                ));
            }
        });
        Ok(true)
    })?;
    Ok((rest, options))
}

/// `%XX` escapes decoded; the result must be UTF-8.
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("{text:?}: a bad %-escape at byte {i}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} is not UTF-8 once decoded"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cluster,
    Sentinel,
}

/// `host:port`, `host` or `[v6]:port`.
fn host_port(text: &str, default_port: u16) -> Result<(String, u16), String> {
    if text.is_empty() {
        return Err("an empty host in the node list".to_owned());
    }
    let (host, port) = match text.rsplit_once(':') {
        // `[::1]` alone ends with `]`; a colon inside brackets is not a port.
        Some((host, port)) if !port.ends_with(']') => (host, Some(port)),
        _ => (text, None),
    };
    let port = match port {
        Some(p) => p
            .parse()
            .map_err(|_| format!("{p:?} in {text:?} is not a port"))?,
        None => default_port,
    };
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_every_seed() {
        assert_eq!(
            parse("redis+cluster://a:7000,b,[::1]:7002").unwrap(),
            Target::Cluster {
                nodes: vec![
                    "redis://a:7000/".into(),
                    "redis://b:6379/".into(),
                    "redis://[::1]:7002/".into()
                ]
            }
        );
        assert_eq!(
            parse("rediss+cluster://app:p%40ss@a:7000,b:7001/").unwrap(),
            Target::Cluster {
                nodes: vec![
                    "rediss://app:p%40ss@a:7000/".into(),
                    "rediss://app:p%40ss@b:7001/".into()
                ]
            }
        );
        assert!(parse("redis+cluster://a:7000/3").is_err());
        assert!(parse("redis+cluster://a:x").is_err());
        assert!(parse("redis+cluster://a:1,,b:2").is_err());
        assert!(parse("redis+cluster://a:1?db=2").is_err());
    }

    #[test]
    fn sentinel_urls_name_the_master_and_keep_two_sets_of_credentials() {
        let Target::Sentinel(t) = parse(
            "rediss+sentinel://:pw@s1:26379,s2/main/2?sentinel_user=watch&sentinel_password=spw",
        )
        .unwrap() else {
            panic!("not a sentinel target")
        };
        assert_eq!(
            t.sentinels,
            [
                "rediss://watch:spw@s1:26379/",
                "rediss://watch:spw@s2:26379/"
            ]
        );
        assert_eq!(t.master_name, "main");
        assert_eq!(t.db, 2);
        assert!(t.tls);
        assert_eq!(t.node_template, "rediss://:pw@localhost:6379/2");
        assert!(parse("redis+sentinel://s1:26379").is_err());
        assert!(parse("redis+sentinel://s1:26379/").is_err());
        assert!(parse("redis+sentinel://s1:26379/m/x").is_err());
    }

    #[test]
    fn tls_files_leave_the_url_and_keep_other_parameters() {
        let (rest, files) = take_tls_files(
            "rediss://:pw@h:6380/0?tls_ca_file=/etc/ca.pem&protocol=resp3\
             &tls_cert_file=/a%20b/c.pem&tls_key_file=k.pem#insecure",
        )
        .unwrap();
        assert_eq!(rest, "rediss://:pw@h:6380/0?protocol=resp3#insecure");
        assert_eq!(
            files,
            TlsFiles {
                ca: Some("/etc/ca.pem".into()),
                cert: Some("/a b/c.pem".into()),
                key: Some("k.pem".into()),
            }
        );
        let (rest, files) =
            take_tls_files("rediss+sentinel://s/m?sentinel_password=x&tls_ca_file=ca").unwrap();
        assert_eq!(rest, "rediss+sentinel://s/m?sentinel_password=x");
        assert_eq!(files.ca, Some("ca".into()));
        let (rest, files) = take_tls_files("rediss+cluster://a,b?tls_ca_file=ca").unwrap();
        assert_eq!(rest, "rediss+cluster://a,b");
        assert!(files.cert.is_none());
        assert_eq!(
            take_tls_files("redis://h").unwrap(),
            ("redis://h".to_owned(), TlsFiles::default())
        );
    }

    #[test]
    fn tls_files_need_a_path_and_one_mention() {
        let err = take_tls_files("rediss://h?tls_ca_file=").unwrap_err();
        assert!(err.contains("needs a file path"), "{err}");
        let err = take_tls_files("rediss://h?tls_ca_file=a&tls_ca_file=b").unwrap_err();
        assert!(err.contains("twice"), "{err}");
        let err = take_tls_files("rediss://h?tls_ca_file=%zz").unwrap_err();
        assert!(err.contains("%-escape"), "{err}");
    }

    #[test]
    fn store_switches_leave_the_url() {
        let (rest, options) =
            take_store_options("redis+cluster://a,b?batching=off&protocol=resp3&local_cache=on")
                .unwrap();
        assert_eq!(rest, "redis+cluster://a,b?protocol=resp3");
        assert_eq!(
            options,
            StoreOptions {
                batching: Some(false),
                local_cache: Some(true)
            }
        );
        let (rest, options) = take_store_options("redis://h/0?local_cache=0").unwrap();
        assert_eq!(rest, "redis://h/0");
        assert_eq!(options.local_cache, Some(false));
        assert_eq!(options.batching, None);
        let err = take_store_options("redis://h?batching=maybe").unwrap_err();
        assert!(err.contains("neither on nor off"), "{err}");
        let err = take_store_options("redis://h?batching=on&batching=off").unwrap_err();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn other_urls_are_standalone() {
        for url in [
            "redis://h:1/0",
            "rediss://h/",
            "unix:///tmp/r.sock",
            "nonsense",
        ] {
            assert_eq!(parse(url).unwrap(), Target::Standalone(url.to_owned()));
        }
    }
}
