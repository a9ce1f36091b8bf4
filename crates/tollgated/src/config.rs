//! The TOML configuration: the file's shape, loading with errors that name file, line and
//! field, and validation into ready-to-use policies and Envoy domains.

use std::{
    collections::{BTreeMap, HashSet},
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde::{Deserialize, Deserializer, de};
use tollgate::{
    Algorithm, BanRule, Bypass, Dimension, DuplicateBy, DuplicateGuard, Durability, IpNet, Limiter,
    OnError, Policy, Rule,
    fields::{HeaderStyle, PolicyFields},
    parse_duration,
};
use toml::Spanned;

mod env;
mod envoy_env;
pub(crate) mod envoy_yaml;
mod record;
mod rlqs;
mod webhook;

pub(crate) use record::RecordSettings;
pub(crate) use rlqs::{RlqsBuckets, Serves};
pub(crate) use webhook::WebhookSettings;

use crate::{
    envoy::{Domains, DomainsBuilder, RawDomain, Semantics, stats::StatSettings},
    metrics::DecisionHandles,
    store::{MemoryBudgets, StoreSettings},
};

/// Default HTTP listen address.
const DEFAULT_HTTP: &str = "127.0.0.1:8080";
/// Default gRPC listen address.
const DEFAULT_GRPC: &str = "127.0.0.1:8081";

/// Where the configuration comes from: a TOML file, the environment of Envoy's reference
/// service (`tollgate envoy-ratelimit`), or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Source {
    /// The TOML file, if any.
    pub(crate) path: Option<PathBuf>,
    /// Whether the reference service's variables are read.
    pub(crate) envoy_env: bool,
}

impl Source {
    /// A TOML file alone.
    pub(crate) fn file(path: &Path) -> Source {
        Source {
            path: Some(path.to_owned()),
            envoy_env: false,
        }
    }
}

/// A validated configuration: listen addresses, store settings, policies and Envoy domains.
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) server: ServerSettings,
    pub(crate) store: StoreSettings,
    pub(crate) policies: BTreeMap<String, PolicyEntry>,
    pub(crate) envoy: Domains,
    /// The YAML configuration of Envoy's reference service (`envoy.ratelimit_config`,
    /// resolved), and whether its dotfiles are skipped: watched for changes like the file.
    pub(crate) envoy_yaml: Option<(PathBuf, bool)>,
    /// `/healthcheck` fails while no Envoy domain is configured.
    pub(crate) require_domains: bool,
    /// The rate-limit fields of Envoy's `response_headers_to_add` (`[envoy] headers`).
    pub(crate) envoy_headers: HeaderStyle,
    /// The names of the limit, remaining and reset fields of YAML domains' answers.
    pub(crate) envoy_header_names: Arc<[String; 3]>,
    /// `[record]`: where the server writes what it decided, for `tollgate plan`.
    pub(crate) record: Option<RecordSettings>,
    /// `[[rlqs.buckets]]`: the buckets Envoy's rate-limit quota service serves.
    pub(crate) rlqs: RlqsBuckets,
    /// `[webhook]`: where warnings are posted (read at start).
    pub(crate) webhook: Option<WebhookSettings>,
    /// The `TOLLGATE_...` variables that replaced values of the file.
    env: Vec<String>,
}

/// `[server]`, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerSettings {
    pub(crate) http: SocketAddr,
    pub(crate) grpc: SocketAddr,
    pub(crate) admin_token_env: Option<String>,
    /// The variable holding the check scope's token (check, peek, batches, acquire).
    pub(crate) check_token_env: Option<String>,
    /// The variable holding the refund scope's token (refund, release, extend, duplicate).
    pub(crate) refund_token_env: Option<String>,
    /// The variable holding the key that seals receipts and leases (shared by a fleet).
    pub(crate) receipt_key_env: Option<String>,
    /// How long an HTTP client has to send a request's head (and an idle keep-alive
    /// connection to start its next request) before the connection is closed.
    pub(crate) header_read_timeout: Duration,
    /// How long an HTTP client has, from the end of the head, to send the whole body.
    pub(crate) body_read_timeout: Duration,
    /// The most connections served at once, per listener; more wait to be accepted.
    pub(crate) max_connections: usize,
    /// The most connections one client address (an IPv6 /64) holds at once, per listener;
    /// more are closed as they are accepted.
    pub(crate) max_connections_per_ip: usize,
    /// How long a gRPC connection may send nothing before it is closed.
    pub(crate) idle_timeout: Duration,
    /// How long a response write may make no progress (a client that does not read) before
    /// the connection is closed.
    pub(crate) write_timeout: Duration,
    /// The most `grpc.health.v1` Watch streams open at once.
    pub(crate) max_health_watches: usize,
    /// The most memory the RLQS streams' buckets take together, in bytes (see `crate::rlqs`).
    pub(crate) max_rlqs_bucket_bytes: usize,
    /// `server.allowed_hosts` as written: `None` when unset (see [`Self::allowed_hosts`]).
    allowed_hosts: Option<Vec<String>>,
    /// `server.grpc_tls`: the gRPC port serves TLS with these files.
    pub(crate) grpc_tls: Option<crate::tls::TlsFiles>,
    /// The largest gRPC message decoded or encoded, in bytes.
    pub(crate) grpc_max_message_bytes: usize,
    /// The most gRPC calls in flight on one HTTP/2 connection.
    pub(crate) grpc_max_concurrent_streams: u32,
    /// Failed admin authentications allowed per client address before it is refused.
    pub(crate) admin_failure_limit: Rule,
    /// The most checks one `/v1/checks` request holds.
    pub(crate) max_batch: usize,
    /// The most units one `/v1/checks` request charges, all items together.
    pub(crate) max_batch_cost: u64,
    /// The most descriptors one Envoy `ShouldRateLimit` request holds.
    pub(crate) max_descriptors: usize,
    /// The most entries one Envoy descriptor holds.
    pub(crate) max_descriptor_entries: usize,
    /// The longest a duplicate guard's completed response is kept (`keep_for`).
    pub(crate) max_keep_for: Duration,
    /// The longest `/v1/check` may let a request wait for its units (`max_delay_ms`).
    pub(crate) max_delay: Duration,
    /// The largest response a duplicate guard stores, in bytes.
    pub(crate) max_stored_response: usize,
    /// `server.dashboard`; unset: on when the HTTP listener is on a loopback address.
    pub(crate) dashboard: Option<bool>,
    /// The rate-limit fields of `/v1/check` and `/v1/peek` answers.
    pub(crate) headers: HeaderStyle,
}

/// `server.allowed_hosts`, each a name as a request's `Host` gives it without its port (an
/// IPv6 address without brackets), or `"*"`: an entry that could never match would refuse
/// every request with 421.
fn checked_allowed_hosts(
    hosts: Spanned<Vec<String>>,
    errors: &Errors<'_>,
) -> Result<Vec<String>, ConfigError> {
    let span = hosts.span();
    let bad = |why: String| errors.at(Some(span.clone()), "server.allowed_hosts", why);
    let hosts = hosts.into_inner();
    if hosts.is_empty() {
        return Err(bad(
            "expected at least one host name (e.g. [\"api.example.com\"]), or [\"*\"] for any"
                .into(),
        ));
    }
    for host in &hosts {
        let why = if host.is_empty() {
            "an empty name matches no request"
        } else if host.starts_with('[') {
            "an IPv6 address goes without brackets (\"::1\")"
        } else if host.contains(['/', ' ', '@']) {
            "expected a host name, not a URL"
        } else if host.contains(':') && host.parse::<std::net::Ipv6Addr>().is_err() {
            "a name goes without its port (requests on any port of it are allowed)"
        } else {
            continue;
        };
        return Err(bad(format!("{host:?}: {why}")));
    }
    Ok(hosts)
}

impl ServerSettings {
    /// The `Host` names the HTTP port answers: `server.allowed_hosts` (`["*"]`: any); unset,
    /// the loopback names when the port is on a loopback address (a page elsewhere that
    /// rebinds its name to 127.0.0.1 is refused), else any.
    pub(crate) fn allowed_hosts(&self) -> crate::listen::AllowedHosts {
        match &self.allowed_hosts {
            Some(hosts) if hosts.iter().any(|h| h == "*") => None,
            Some(hosts) => Some(hosts.clone().into()),
            None if self.http.ip().is_loopback() => {
                Some(["localhost", "127.0.0.1", "::1"].map(String::from).into())
            }
            None => None,
        }
    }

    /// The dashboard (`/`, `/v1/stats`) is served.
    pub(crate) fn dashboard_enabled(&self) -> bool {
        self.dashboard.unwrap_or(self.http.ip().is_loopback())
    }
}

/// Default `server.header_read_timeout`.
const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `server.body_read_timeout`.
const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `server.max_connections`.
const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default `server.max_connections_per_ip`.
const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 256;
/// Default `server.idle_timeout`.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default `server.write_timeout`.
const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `server.max_health_watches`.
const DEFAULT_MAX_HEALTH_WATCHES: usize = 1_000;
/// Default `server.max_rlqs_bucket_bytes`: 64 MiB, some 100,000 buckets of short ids.
const DEFAULT_MAX_RLQS_BUCKET_BYTES: usize = 64 << 20;
/// Default `server.grpc_max_message_bytes`: 1 MiB, far above any real rate-limit request.
const DEFAULT_GRPC_MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Default `server.grpc_max_concurrent_streams`.
const DEFAULT_GRPC_MAX_CONCURRENT_STREAMS: u32 = 1000;
/// Default `server.max_batch`.
const DEFAULT_MAX_BATCH: usize = 100;
/// Default `server.admin_failure_limit`.
const DEFAULT_ADMIN_FAILURE_LIMIT: &str = "5/1m";
/// Default `server.max_batch_cost`.
const DEFAULT_MAX_BATCH_COST: u64 = 10_000;
/// Default `server.max_descriptors`: Envoy sends one per rate-limit action of a route.
const DEFAULT_MAX_DESCRIPTORS: usize = 64;
/// Default `server.max_descriptor_entries`.
const DEFAULT_MAX_DESCRIPTOR_ENTRIES: usize = 16;
/// Default `server.max_keep_for`.
const DEFAULT_MAX_KEEP_FOR: Duration = Duration::from_secs(3600);
/// Default `server.max_delay`: a wait reserves the identity's units ahead, so the longest
/// is bounded for callers too.
const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(60);
/// Default `server.max_stored_response`: 64 KiB.
const DEFAULT_MAX_STORED_RESPONSE: usize = 64 << 10;

/// One `[policies.<name>]`: the policy and its optional duplicate guard.
#[derive(Debug, Clone)]
pub(crate) struct PolicyEntry {
    pub(crate) policy: Arc<Policy>,
    pub(crate) duplicate: Option<Arc<DuplicateGuard>>,
    /// The bypass as configured, for `check-config`.
    bypass: Option<String>,
    /// This policy's decision counters.
    pub(crate) metrics: Arc<DecisionHandles>,
    /// Every rule of the policy as written (`10/1m`), in limiter order, with its limiter's
    /// name: written once here rather than formatted in every answer.
    pub(crate) rule_texts: Arc<[RuleText]>,
    /// The policy's rate-limit fields that never change, made once.
    pub(crate) fields: Arc<PolicyFields>,
    /// Its `RateLimit-Policy` value, made once.
    pub(crate) policy_field: Option<axum::http::HeaderValue>,
}

/// A rule of a policy and its text, for answers (see `PolicyEntry::rule_texts`).
#[derive(Debug)]
pub(crate) struct RuleText {
    pub(crate) limiter: Box<str>,
    pub(crate) rule: Rule,
    pub(crate) text: Box<str>,
}

fn rule_texts(policy: &Policy) -> Arc<[RuleText]> {
    policy
        .limiters()
        .iter()
        .flat_map(|limiter| {
            limiter.rules().iter().map(|rule| RuleText {
                limiter: limiter.name().into(),
                rule: *rule,
                text: rule.to_string().into(),
            })
        })
        .collect()
}

impl Config {
    /// Reads and validates `path`, with the `TOLLGATE_SERVER_<FIELD>` and
    /// `TOLLGATE_STORE_<FIELD>` variables of the environment replacing its `[server]` and
    /// `[store]` values.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_source(&Source::file(path))
    }

    /// Reads and validates the configuration of `source`, with the environment's variables.
    pub(crate) fn load_source(source: &Source) -> Result<Config, ConfigError> {
        let (file, text) = match &source.path {
            Some(path) => {
                let file = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
                    more: Vec::new(),
                    file: file.clone(),
                    line: None,
                    field: String::new(),
                    message: format!("cannot read the file: {e}"),
                })?;
                (file, text)
            }
            None => ("(environment)".to_owned(), String::new()),
        };
        let lookup = |var: &str| std::env::var(var).ok();
        Config::parse_source(&file, &text, &lookup, source.envoy_env)
    }

    /// Parses and validates `text`; `file` names it in errors. The environment is not read.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(file, text, &|_| None)
    }

    /// Parses and validates `text`, with the variables `lookup` finds replacing values.
    pub(crate) fn parse_with_env(
        file: &str,
        text: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::parse_source(file, text, lookup, false)
    }

    /// [`parse_with_env`](Self::parse_with_env), with the variables of Envoy's reference
    /// service first when `envoy_env` (`tollgate envoy-ratelimit`).
    pub(crate) fn parse_source(
        file: &str,
        text: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
        envoy_env: bool,
    ) -> Result<Config, ConfigError> {
        let mut raw = parse_raw(file, text)?;
        let mut used = if envoy_env {
            envoy_env::apply(&mut raw, lookup)?
        } else {
            Vec::new()
        };
        used.extend(env::apply(&mut raw, lookup)?);
        let errors = Errors { file, text };
        let mut config = raw.validate(&errors)?;
        config.env = used;
        Ok(config)
    }

    /// The policy names, sorted.
    pub fn policy_names(&self) -> impl Iterator<Item = &str> {
        self.policies.keys().map(String::as_str)
    }

    /// The policies and Envoy descriptors (`domain/path`) with a window of a day or longer
    /// (or a calendar window): what a store that keeps nothing across a restart gives again
    /// in full when it restarts.
    pub(crate) fn long_windows(&self) -> Vec<String> {
        let mut found: Vec<String> = self
            .policies
            .iter()
            .filter(|(_, entry)| {
                let mut rules = entry.policy.limiters().iter().flat_map(|l| l.rules());
                rules.any(long_window)
            })
            .map(|(name, _)| name.clone())
            .collect();
        found.extend(self.envoy.with_rules(long_window));
        found
    }

    /// A human-readable summary of the policies and Envoy domains (`check-config` prints it).
    pub fn summary(&self) -> String {
        use fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "store {} (on_error = {}, timeout = {}, prefix = {})",
            crate::store::redact(&self.store.url),
            on_error_name(self.store.on_error),
            tollgate::format_duration(self.store.timeout),
            self.store.prefix
        );
        let _ = writeln!(
            out,
            "http {}, grpc {}, dashboard {}",
            self.server.http,
            self.server.grpc,
            if self.server.dashboard_enabled() {
                "on"
            } else {
                "off"
            }
        );
        if !self.env.is_empty() {
            let _ = writeln!(out, "from the environment: {}", self.env.join(", "));
        }
        for (name, entry) in &self.policies {
            let _ = writeln!(out, "policy {name}");
            for limiter in entry.policy.limiters() {
                let rules: Vec<String> = limiter
                    .rules()
                    .iter()
                    .map(|r| format!("{r} {}", r.algorithm()))
                    .collect();
                let _ = write!(
                    out,
                    "  limiter {} by {}",
                    limiter.name(),
                    limiter.dimension(),
                );
                if let Some(prefix) = limiter.dimension().prefix() {
                    let _ = write!(out, " (IPv4 /{}, IPv6 /{})", prefix.v4(), prefix.v6());
                }
                let _ = write!(out, ": {}", rules.join(", "));
                if let Some(ban) = limiter.blocklist() {
                    let _ = write!(
                        out,
                        "; blocklist {}",
                        tollgate::format_duration(ban.duration())
                    );
                    if ban.factor() > 1 {
                        let _ = write!(
                            out,
                            " x{} up to {}",
                            ban.factor(),
                            tollgate::format_duration(ban.cap())
                        );
                    }
                }
                out.push('\n');
            }
            if let Some(bypass) = &entry.bypass {
                let _ = writeln!(out, "  bypass {bypass}");
            }
            if let Some(guard) = &entry.duplicate {
                let _ = writeln!(
                    out,
                    "  duplicate by {} for {}",
                    guard.by(),
                    tollgate::format_duration(guard.ttl())
                );
            }
        }
        out.push_str(self.envoy.summary());
        out
    }
}

fn on_error_name(on_error: OnError) -> &'static str {
    match on_error {
        OnError::Allow => "allow",
        OnError::Deny => "deny",
        OnError::Local => "local",
    }
}

/// A configuration error: the file, the line (when known), the field and what was expected.
///
/// Displays as `tollgate.toml:14: policies.sms.limiters[0].rules[1]: "10/1x": unknown unit
/// "x" (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    file: String,
    line: Option<usize>,
    field: String,
    message: String,
    /// The file's other errors, in file order (one per section: the server, the store, each
    /// policy, each Envoy domain): a mistake does not hide the next.
    more: Vec<ConfigError>,
}

impl ConfigError {
    pub(crate) fn new(
        file: impl Into<String>,
        line: Option<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: file.into(),
            line,
            field: field.into(),
            message: message.into(),
            more: Vec::new(),
        }
    }

    /// One error of `errors` (at least one), the others after it, in file order.
    fn all(mut errors: Vec<ConfigError>) -> ConfigError {
        errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
        let mut first = errors.remove(0);
        first.more = errors;
        first
    }

    /// This error and the file's others, in file order.
    pub fn errors(&self) -> impl Iterator<Item = &ConfigError> {
        std::iter::once(self).chain(&self.more)
    }

    /// The file as given.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The 1-based line, when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The dotted path of the field (`policies.sms.limiters[0].rules[1]`), empty when the
    /// error is about the whole file.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What was wrong and what was expected.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// `file:line: field: message`, then the file's other errors, a line each.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(&e.file)?;
            if let Some(line) = e.line {
                write!(f, ":{line}")?;
            }
            if !e.field.is_empty() {
                write!(f, ": {}", e.field)?;
            }
            write!(f, ": {}", e.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Builds errors that point into one file.
struct Errors<'a> {
    file: &'a str,
    text: &'a str,
}

impl Errors<'_> {
    fn at(
        &self,
        span: Option<std::ops::Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        let field = field.into();
        if span.as_ref() == Some(&env::FROM_ENV) {
            return ConfigError {
                file: env::var_of(&field),
                line: None,
                field,
                message: message.into(),
                more: Vec::new(),
            };
        }
        ConfigError {
            file: self.file.to_owned(),
            line: span.map(|s| line_of(self.text, s.start)),
            field,
            message: message.into(),
            more: Vec::new(),
        }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    1 + text.as_bytes()[..offset]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

fn parse_raw(file: &str, text: &str) -> Result<RawConfig, ConfigError> {
    let errors = Errors { file, text };
    let deserializer = toml::Deserializer::parse(text)
        .map_err(|e| errors.at(e.span(), "", e.message().trim_end()))?;
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let field = field_path(e.path());
        let inner = e.into_inner();
        errors.at(inner.span(), field, inner.message().trim_end())
    })
}

/// `policies.sms.limiters[0].rules[1]`, leaving out the fields `toml::Spanned` uses inside.
fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => {
                let _ = fmt::Write::write_fmt(&mut out, format_args!("[{index}]"));
            }
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if key.starts_with("$__serde_spanned") {
                    continue;
                }
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('?');
            }
        }
    }
    out
}

/// The longest duration the configuration and the API accept (bans, TTLs, timeouts, kept
/// responses): ten years. Far beyond any sensible ban, and far from overflowing the stores'
/// clocks (microseconds since the epoch in a u64).
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3650 * 86_400);

/// Parses a duration no longer than [`MAX_DURATION`]; the error quotes the text.
pub(crate) fn bounded_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        Ok(_) => Err(format!("{text:?}: a duration is at most 3650d")),
        Err(e) => Err(format!("{text:?}: {e}")),
    }
}

/// A duration in the configuration's text form (`50ms`, `10m`), at most [`MAX_DURATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DurationText(Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        bounded_duration(&text)
            .map(DurationText)
            .map_err(de::Error::custom)
    }
}

/// `rules`: a list of rules (`["10/1m", "100 per hour"]`), or one string of rules separated by
/// `;` (`"10/1m; 100 per hour"`).
#[derive(Debug, Default)]
pub(crate) struct RuleList(pub(crate) Vec<Rule>);

impl<'de> Deserialize<'de> for RuleList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Rules;
        impl<'de> de::Visitor<'de> for Rules {
            type Value = RuleList;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a list of rules such as [\"10/1m\", \"100/1h\"], or one string such as \"10/1m; 100/1h\"",
                )
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<RuleList, E> {
                tollgate::parse_rules(text).map(RuleList).map_err(E::custom)
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<RuleList, A::Error> {
                let mut rules = Vec::new();
                while let Some(rule) = seq.next_element::<Rule>()? {
                    rules.push(rule);
                }
                Ok(RuleList(rules))
            }
        }
        deserializer.deserialize_any(Rules)
    }
}

/// A value parsed with `FromStr`, the error message kept as the parser wrote it.
#[derive(Debug, Clone)]
struct Parsed<T>(T);

impl<'de, T> Deserialize<'de> for Parsed<T>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse()
            .map(Parsed)
            .map_err(|e| de::Error::custom(format!("{text:?}: {e}")))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    policies: BTreeMap<String, Spanned<RawPolicy>>,
    #[serde(default)]
    envoy: RawEnvoy,
    #[serde(default)]
    record: record::RawRecord,
    #[serde(default)]
    rlqs: rlqs::RawRlqs,
    #[serde(default)]
    webhook: webhook::RawWebhook,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    http: Option<Parsed<SocketAddr>>,
    grpc: Option<Parsed<SocketAddr>>,
    admin_token_env: Option<Spanned<String>>,
    check_token_env: Option<Spanned<String>>,
    refund_token_env: Option<Spanned<String>>,
    receipt_key_env: Option<Spanned<String>>,
    header_read_timeout: Option<Spanned<DurationText>>,
    body_read_timeout: Option<Spanned<DurationText>>,
    max_connections: Option<Spanned<u32>>,
    max_connections_per_ip: Option<Spanned<u32>>,
    idle_timeout: Option<Spanned<DurationText>>,
    write_timeout: Option<Spanned<DurationText>>,
    max_health_watches: Option<Spanned<u32>>,
    max_rlqs_bucket_bytes: Option<Spanned<u32>>,
    allowed_hosts: Option<Spanned<Vec<String>>>,
    pub(super) grpc_tls: Option<Spanned<RawTls>>,
    grpc_max_message_bytes: Option<Spanned<u32>>,
    grpc_max_concurrent_streams: Option<Spanned<u32>>,
    max_batch: Option<Spanned<u32>>,
    max_batch_cost: Option<Spanned<u32>>,
    max_descriptors: Option<Spanned<u32>>,
    max_descriptor_entries: Option<Spanned<u32>>,
    max_keep_for: Option<Spanned<DurationText>>,
    max_delay: Option<Spanned<DurationText>>,
    max_stored_response: Option<Spanned<u32>>,
    admin_failure_limit: Option<Rule>,
    dashboard: Option<bool>,
    headers: Option<HeaderStyle>,
}

/// `server.grpc_tls = { cert_file, key_file, client_ca_file, client_san }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert_file: String,
    pub(super) key_file: String,
    pub(super) client_ca_file: Option<String>,
    pub(super) client_san: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<Spanned<String>>,
    on_error: Option<OnError>,
    timeout: Option<Spanned<DurationText>>,
    prefix: Option<Spanned<String>>,
    tls_ca_file: Option<Spanned<String>>,
    tls_cert_file: Option<Spanned<String>>,
    tls_key_file: Option<Spanned<String>>,
    max_keys: Option<Spanned<u32>>,
    max_bans: Option<Spanned<u32>>,
    max_locks: Option<Spanned<u32>>,
    max_response_bytes: Option<Spanned<u64>>,
    /// Redis: repair after a failover, remembering this long of admissions (`"0s"`: off).
    pub(super) repair: Option<Spanned<DurationText>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    limiters: Vec<Spanned<RawLimiter>>,
    bypass: Option<RawBypass>,
    duplicate: Option<RawDuplicate>,
    on_error: Option<OnError>,
    #[serde(default)]
    shadow: bool,
    /// `"everywhere"` (default) or `"policy"`: whom this policy's bans refuse.
    #[serde(default)]
    ban_scope: RawBanScope,
    /// `"async"` (default) or `"replicated"`: whether a check waits for replicas.
    durability: Option<Spanned<RawDurability>>,
    /// With `durability = "replicated"`: how many replicas (default 1).
    replicas: Option<Spanned<u32>>,
    /// With `durability = "replicated"`: how long to wait for them (default 20ms).
    replication_timeout: Option<Spanned<DurationText>>,
    /// Lease the policy's quota: `{ ttl = "1s", share = 0.25, max_units = 1000 }`.
    lease: Option<Spanned<RawLease>>,
}

/// `lease` of a policy (see `tollgate::QuotaLease`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLease {
    ttl: DurationText,
    share: Option<f64>,
    max_units: Option<u64>,
}

impl RawLease {
    fn lease(&self) -> tollgate::QuotaLease {
        let mut lease = tollgate::QuotaLease::new(self.ttl.0);
        if let Some(share) = self.share {
            lease = lease.share(share);
        }
        if let Some(units) = self.max_units {
            lease = lease.max_units(units);
        }
        lease
    }
}

/// `durability` of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawDurability {
    Async,
    Replicated,
}

/// How long a replicated check waits for its replicas when the config does not say.
const DEFAULT_REPLICATION_TIMEOUT: Duration = Duration::from_millis(20);

/// `ban_scope` of a policy.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawBanScope {
    #[default]
    Everywhere,
    Policy,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimiter {
    by: Dimension,
    #[serde(default)]
    rules: RuleList,
    /// A concurrency limiter: at most this many in flight (instead of `rules`).
    concurrent: Option<Spanned<u64>>,
    lease_ttl: Option<Spanned<DurationText>>,
    algorithm: Option<Algorithm>,
    name: Option<Spanned<String>>,
    message: Option<String>,
    blocklist: Option<RawBlocklist>,
    ipv4_prefix: Option<Spanned<i64>>,
    ipv6_prefix: Option<Spanned<i64>>,
    #[serde(default)]
    shadow: bool,
    /// Warn when a rule's use reaches this fraction of its limit.
    warn_at: Option<Spanned<f64>>,
    /// Rules that never deny, and report when they would.
    #[serde(default)]
    soft: RuleList,
    /// Identities may get limits of their own at run time (`PUT /v1/overrides`).
    #[serde(default)]
    overrides: bool,
}

impl RawLimiter {
    /// The limiter, at `here` (spanning `span`): its rules (`concurrent = N` with `lease_ttl`,
    /// default 5m, is the rule `N/TTL concurrent`), each once, with its algorithm.
    fn validate(
        mut self,
        here: &str,
        span: std::ops::Range<usize>,
        errors: &Errors<'_>,
    ) -> Result<Limiter, ConfigError> {
        match (&self.concurrent, self.rules.0.is_empty()) {
            (Some(n), true) => {
                let ttl = self
                    .lease_ttl
                    .as_ref()
                    .map_or(Duration::from_secs(300), |t| t.get_ref().0);
                let rule = Rule::concurrent(*n.get_ref(), ttl).map_err(|e| {
                    errors.at(Some(n.span()), format!("{here}.concurrent"), e.to_string())
                })?;
                if let Some(a) = self.algorithm {
                    return Err(errors.at(
                        Some(span),
                        format!("{here}.algorithm"),
                        format!(
                            "a concurrency limiter counts leases: it takes no algorithm (not {a})"
                        ),
                    ));
                }
                self.rules.0.push(rule);
            }
            (Some(n), false) => {
                return Err(errors.at(
                    Some(n.span()),
                    format!("{here}.concurrent"),
                    "a concurrency limiter has no `rules`: give rate rules a limiter of their own",
                ));
            }
            (None, true) if self.soft.0.is_empty() => {
                return Err(errors.at(
                    Some(span),
                    format!("{here}.rules"),
                    "a limiter needs at least one rule, e.g. [\"10/1m\"] (or `concurrent = N`, or `soft` rules)",
                ));
            }
            (None, _) => {
                if let Some(ttl) = &self.lease_ttl {
                    return Err(errors.at(
                        Some(ttl.span()),
                        format!("{here}.lease_ttl"),
                        "lease_ttl goes with `concurrent = N`",
                    ));
                }
            }
        }
        let mut limiter_name = self.by.to_string();
        if let Some(n) = &self.name {
            if n.get_ref().is_empty() {
                return Err(errors.at(
                    Some(n.span()),
                    format!("{here}.name"),
                    "a limiter name cannot be empty",
                ));
            }
            limiter_name.clone_from(n.get_ref());
        }
        let rules = self.rules_of(&self.rules, "rules", here, &span, errors)?;
        let soft = self.rules_of(&self.soft, "soft", here, &span, errors)?;
        if let Some(rule) = soft.iter().find(|r| rules.contains(r)) {
            return Err(errors.at(
                Some(span.clone()),
                format!("{here}.soft"),
                format!("rule {rule} is both enforced and soft"),
            ));
        }
        if self.concurrent.is_some() && !soft.is_empty() {
            return Err(errors.at(
                Some(span.clone()),
                format!("{here}.soft"),
                "a concurrency limiter has no soft rules: give them a limiter of their own",
            ));
        }
        let dimension = self.dimension(here, errors)?;
        let mut limiter = Limiter::new(dimension, rules)
            .with_name(&limiter_name)
            .with_soft_rules(soft);
        if let Some(message) = &self.message {
            limiter = limiter.with_message(message);
        }
        if let Some(ban) = self.blocklist {
            limiter = limiter.with_blocklist(ban.0);
        }
        if let Some(warn_at) = self.warn_at {
            let fraction = *warn_at.get_ref();
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(errors.at(
                    Some(warn_at.span()),
                    format!("{here}.warn_at"),
                    format!(
                        "expected a fraction of each rule's limit above 0 and at most 1 (e.g. 0.8), not {fraction}"
                    ),
                ));
            }
            limiter = limiter.with_warning(fraction);
        }
        Ok(limiter
            .with_shadow(self.shadow)
            .with_overrides(self.overrides))
    }

    /// The rules of `list` (the field `field`), each once, with the limiter's algorithm.
    fn rules_of(
        &self,
        list: &RuleList,
        field: &str,
        here: &str,
        span: &std::ops::Range<usize>,
        errors: &Errors<'_>,
    ) -> Result<Vec<Rule>, ConfigError> {
        let mut rules: Vec<Rule> = Vec::with_capacity(list.0.len());
        for (j, rule) in list.0.iter().enumerate() {
            if let Some(algorithm) = self
                .algorithm
                .filter(|&a| rule.calendar_window().is_some() && a != Algorithm::FixedWindow)
            {
                return Err(errors.at(
                    Some(span.clone()),
                    format!("{here}.algorithm"),
                    format!(
                        "rule {rule} is a calendar window, counted as a fixed window; it cannot be {algorithm}"
                    ),
                ));
            }
            let rule = self.algorithm.map_or(*rule, |a| rule.with_algorithm(a));
            if rules.contains(&rule) {
                return Err(errors.at(
                    Some(span.clone()),
                    format!("{here}.{field}[{j}]"),
                    format!("rule {rule} is listed twice"),
                ));
            }
            rules.push(rule);
        }
        Ok(rules)
    }

    /// `by`, with `ipv4_prefix` and `ipv6_prefix` applied (they need `by = "ip"`).
    fn dimension(&self, here: &str, errors: &Errors<'_>) -> Result<Dimension, ConfigError> {
        let Some(default) = self.by.prefix() else {
            let set = [
                ("ipv4_prefix", &self.ipv4_prefix),
                ("ipv6_prefix", &self.ipv6_prefix),
            ];
            if let Some((field, Some(len))) = set.into_iter().find(|(_, len)| len.is_some()) {
                return Err(errors.at(
                    Some(len.span()),
                    format!("{here}.{field}"),
                    format!("{field} applies to by = \"ip\", not by = \"{}\"", self.by),
                ));
            }
            return Ok(self.by.clone());
        };
        let length = |field: &str, raw: &Option<Spanned<i64>>, default: u8, max: u8| {
            let Some(raw) = raw else { return Ok(default) };
            u8::try_from(*raw.get_ref())
                .ok()
                .filter(|len| *len <= max)
                .ok_or_else(|| {
                    errors.at(
                        Some(raw.span()),
                        format!("{here}.{field}"),
                        format!(
                            "{} is not a prefix length: use 0 to {max} ({})",
                            raw.get_ref(),
                            if max == 32 {
                                "32 counts each IPv4 address, 24 a /24"
                            } else {
                                "64 is one subscriber, 56 or 48 a site"
                            }
                        ),
                    )
                })
        };
        let v4 = length("ipv4_prefix", &self.ipv4_prefix, default.v4(), 32)?;
        let v6 = length("ipv6_prefix", &self.ipv6_prefix, default.v6(), 128)?;
        // Both are in range, so this cannot fail; the error stays an error all the same.
        Dimension::ip_prefix(v4, v6).map_err(|e| errors.at(None, here.to_owned(), e))
    }
}

/// `blocklist = "10m"` or `blocklist = { ban = "10m", escalate = 2, max = "1d" }`.
#[derive(Debug)]
pub(crate) struct RawBlocklist(pub(crate) BanRule);

impl<'de> Deserialize<'de> for RawBlocklist {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            ban: DurationText,
            escalate: Option<u32>,
            max: Option<DurationText>,
        }
        impl<'de> de::Visitor<'de> for Visit {
            type Value = RawBlocklist;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a ban duration ("10m") or a table { ban = "10m", escalate = 2, max = "1d" }"#)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawBlocklist, E> {
                let d = bounded_duration(v).map_err(E::custom)?;
                ban_rule(d, None, None).map_err(E::custom)
            }

            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RawBlocklist, A::Error> {
                let t = Table::deserialize(de::value::MapAccessDeserializer::new(map))?;
                ban_rule(t.ban.0, t.escalate, t.max.map(|m| m.0)).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

fn ban_rule(
    ban: Duration,
    escalate: Option<u32>,
    max: Option<Duration>,
) -> Result<RawBlocklist, String> {
    if ban < Duration::from_millis(1) {
        return Err("a ban must last at least 1ms".into());
    }
    let rule = BanRule::new(ban);
    match (escalate, max) {
        (None, None) => Ok(RawBlocklist(rule)),
        (Some(0), _) => Err("escalate must be at least 1".into()),
        (Some(factor), max) => {
            let cap = max.unwrap_or(
                ban.saturating_mul(factor.saturating_pow(4))
                    .min(MAX_DURATION),
            );
            if cap < ban {
                return Err("max must be at least the ban".into());
            }
            Ok(RawBlocklist(rule.escalate(factor, cap)))
        }
        (None, Some(_)) => Err("max needs escalate (the factor a repeat ban grows by)".into()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBypass {
    #[serde(default)]
    user_ids: Vec<String>,
    #[serde(default)]
    ips: Vec<Parsed<IpNet>>,
}

impl RawBypass {
    /// The bypass, and what it lets through, for the summary.
    fn build(self) -> (Bypass, String) {
        let mut b = Bypass::new();
        let mut shown = Vec::new();
        for net in self.ips {
            shown.push(format!("ip {}", net.0));
            b = b.ip_net(net.0);
        }
        for id in self.user_ids {
            shown.push(format!("user_id {id:?}"));
            b = b.user_id(id);
        }
        (b, shown.join(", "))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDuplicate {
    by: Parsed<DuplicateBy>,
    ttl: Option<DurationText>,
    #[serde(default)]
    global: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnvoy {
    #[serde(default)]
    domains: Vec<Spanned<RawDomain>>,
    /// A YAML file, or a directory of them, in the format of Envoy's reference service.
    ratelimit_config: Option<Spanned<String>>,
    /// Files that configure one domain are merged (else an error), as the reference
    /// service's `MERGE_DOMAIN_CONFIG`.
    #[serde(default)]
    merge_domains: bool,
    /// How the YAML's rules count (default: a fixed window of the unit, as the reference).
    algorithm: Option<Algorithm>,
    /// The reference's `SHADOW_MODE` for the YAML's domains: each status as it is, the
    /// overall code OK.
    #[serde(default)]
    shadow: bool,
    /// The YAML's domains check a request's descriptors all or nothing, as the reference's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`; by default each counts on its own, as the
    /// reference does.
    #[serde(default)]
    all_or_nothing: bool,
    /// Every descriptor of the YAML's domains in quota mode, as the reference's `QUOTA_MODE`.
    #[serde(default)]
    quota_mode: bool,
    /// Answers of the YAML's domains carry `dynamic_metadata`, as the reference's
    /// `RESPONSE_DYNAMIC_METADATA`.
    #[serde(default)]
    dynamic_metadata: bool,
    /// Skip dotfiles in the directory, as the reference's `RUNTIME_IGNOREDOTFILES`.
    #[serde(default)]
    ignore_dotfiles: bool,
    /// `/healthcheck` fails while no domain is configured, as the reference's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
    #[serde(default)]
    require_domains: bool,
    /// The rate-limit fields of `response_headers_to_add` (default: none on OK answers).
    headers: Option<HeaderStyle>,
    /// The names of the three fields a YAML domain answers with `headers = "draft6"` (the
    /// reference's `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
    header_names: Option<[String; 3]>,
    /// The share of a limit from which the statistics count hits as near it, as the
    /// reference's `NEAR_LIMIT_RATIO` (default 0.8).
    near_limit_ratio: Option<f32>,
    /// How many statistics keys YAML domains' descriptors are counted under at most (default
    /// 10,000); past that, a domain's new keys are counted under `(other)`.
    max_stat_keys: Option<usize>,
    /// tollgate's own: the YAML's domains check a request's descriptors in one atomic store
    /// call, all or nothing (if one is over, none is counted), instead of counting each as
    /// the reference does.
    #[serde(default)]
    atomic: bool,
    /// tollgate's own: answers of the YAML's domains that are over their limits also carry
    /// the draft's rate-limit fields (`RateLimit-Policy`, `RateLimit`).
    #[serde(default)]
    denial_headers: bool,
}

/// A policy name is part of every key and of URLs in logs: keep it plain.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl RawConfig {
    /// The configuration, or every section's first error (see [`ConfigError::errors`]).
    fn validate(self, errors: &Errors<'_>) -> Result<Config, ConfigError> {
        let mut found = Vec::new();
        let server = self.server.validate(errors).map_err(|e| found.push(e)).ok();
        let on_error_set = self.store.on_error.is_some();
        let store = self.store.validate(errors).map_err(|e| found.push(e)).ok();
        let record = self.record.validate(errors).map_err(|e| found.push(e)).ok();
        let rlqs = self.rlqs.validate(errors).map_err(|e| found.push(e)).ok();
        let webhook = self
            .webhook
            .validate(errors)
            .map_err(|e| found.push(e))
            .ok();
        let on_error = store.as_ref().map_or(OnError::default(), |s| s.on_error);
        let mut policies = BTreeMap::new();
        for (name, raw) in self.policies {
            let span = raw.span();
            let field = format!("policies.{name}");
            if !valid_name(&name) {
                found.push(errors.at(
                    Some(span),
                    field,
                    "a policy name uses only letters, digits, '_', '-' and '.' (at most 64)",
                ));
                continue;
            }
            match raw
                .into_inner()
                .validate(&name, &field, span, on_error, errors)
            {
                Ok(entry) => {
                    policies.insert(name, entry);
                }
                Err(e) => found.push(e),
            }
        }
        let envoy = Self::validate_envoy(self.envoy, on_error, on_error_set, errors);
        let (envoy, envoy_yaml, envoy_headers, envoy_header_names, require_domains) = match envoy {
            Ok(envoy) => envoy,
            Err(e) => {
                found.push(e);
                return Err(ConfigError::all(found));
            }
        };
        let (Some(server), Some(store), Some(record), Some(rlqs), Some(webhook), true) =
            (server, store, record, rlqs, webhook, found.is_empty())
        else {
            return Err(ConfigError::all(found));
        };
        Ok(Config {
            server,
            store,
            policies,
            envoy,
            envoy_yaml,
            require_domains,
            envoy_headers,
            envoy_header_names,
            record,
            rlqs,
            webhook,
            env: Vec::new(),
        })
    }

    /// `[[envoy.domains]]` and `[envoy]`: the domains, the YAML's path, the headers' style
    /// and names, and whether `/healthcheck` needs a domain; the section's first error.
    #[allow(clippy::type_complexity)]
    fn validate_envoy(
        envoy: RawEnvoy,
        on_error: OnError,
        on_error_set: bool,
        errors: &Errors<'_>,
    ) -> Result<
        (
            Domains,
            Option<(PathBuf, bool)>,
            HeaderStyle,
            Arc<[String; 3]>,
            bool,
        ),
        ConfigError,
    > {
        let mut reference = Semantics::reference(on_error_set);
        if let Semantics::Reference {
            shadow,
            independent,
            quota,
            metadata,
            counting,
            denial_headers,
            ..
        } = &mut reference
        {
            *shadow = envoy.shadow;
            // tollgate's atomic check (`atomic`) neither counts each descriptor on its own nor
            // as the reference does.
            *independent = !envoy.all_or_nothing && !envoy.atomic;
            *quota = envoy.quota_mode;
            *metadata = envoy.dynamic_metadata;
            *counting = !envoy.atomic;
            *denial_headers = envoy.denial_headers;
        }
        let mut domains = DomainsBuilder::new(on_error, reference);
        let mut stats = StatSettings::default();
        if let Some(ratio) = envoy.near_limit_ratio {
            if !(0.0..=1.0).contains(&ratio) {
                return Err(errors.at(
                    None,
                    "envoy.near_limit_ratio",
                    format!("{ratio}: expected a share of the limit, from 0 to 1"),
                ));
            }
            stats.near_limit_ratio = ratio;
        }
        if let Some(max) = envoy.max_stat_keys {
            stats.max_keys = max;
        }
        domains.stats(stats);
        let mut seen = HashSet::new();
        for (i, domain) in envoy.domains.into_iter().enumerate() {
            let span = domain.span();
            let field = format!("envoy.domains[{i}]");
            let domain = domain.into_inner();
            if domain.name.is_empty() {
                return Err(errors.at(
                    Some(span),
                    format!("{field}.name"),
                    "a domain needs a name",
                ));
            }
            if !seen.insert(domain.name.clone()) {
                return Err(errors.at(
                    Some(span),
                    format!("{field}.name"),
                    format!("domain {:?} is configured twice", domain.name),
                ));
            }
            domains
                .domain(domain, span.clone())
                .map_err(|(span, sub, msg)| errors.at(Some(span), format!("{field}{sub}"), msg))?;
        }
        let envoy_yaml = match envoy.ratelimit_config {
            None => None,
            Some(spanned) => {
                let span = spanned.span();
                let given = PathBuf::from(spanned.into_inner());
                let path = match Path::new(errors.file).parent() {
                    Some(dir) if given.is_relative() => dir.join(&given),
                    _ => given,
                };
                let ignore = envoy.ignore_dotfiles;
                let files = envoy_yaml::load(&path, ignore).map_err(|e| {
                    if e.field() == "envoy.ratelimit_config" {
                        errors.at(Some(span.clone()), e.field(), e.to_string())
                    } else {
                        e
                    }
                })?;
                let algorithm = envoy.algorithm.unwrap_or(Algorithm::FixedWindow);
                for file in &files {
                    domains
                        .yaml_domain(file, envoy.merge_domains, algorithm)
                        .map_err(|message| {
                            ConfigError::new(
                                file.path.display().to_string(),
                                None,
                                "domain",
                                message,
                            )
                        })?;
                }
                Some((path, ignore))
            }
        };
        Ok((
            domains.build(),
            envoy_yaml,
            envoy.headers.unwrap_or(HeaderStyle::None),
            Arc::new(envoy.header_names.unwrap_or_else(|| {
                ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"].map(String::from)
            })),
            envoy.require_domains,
        ))
    }
}

impl RawServer {
    fn validate(self, errors: &Errors<'_>) -> Result<ServerSettings, ConfigError> {
        // Files relative to the configuration file; each must be there now.
        let grpc_tls = match self.grpc_tls {
            None => None,
            Some(tls) => {
                let span = tls.span();
                let tls = tls.into_inner();
                let file = |field: &str, given: &str| {
                    let given = PathBuf::from(given);
                    let path = match Path::new(errors.file).parent() {
                        Some(dir) if given.is_relative() => dir.join(&given),
                        _ => given,
                    };
                    if path.is_file() {
                        Ok(path)
                    } else {
                        Err(errors.at(
                            Some(span.clone()),
                            format!("server.grpc_tls.{field}"),
                            format!(
                                "no file at {} (TLS is never dropped for plaintext)",
                                path.display()
                            ),
                        ))
                    }
                };
                Some(crate::tls::TlsFiles {
                    cert: file("cert_file", &tls.cert_file)?,
                    key: file("key_file", &tls.key_file)?,
                    client_ca: tls
                        .client_ca_file
                        .as_deref()
                        .map(|ca| file("client_ca_file", ca))
                        .transpose()?,
                    client_san: match tls.client_san {
                        None => None,
                        Some(_) if tls.client_ca_file.is_none() => {
                            return Err(errors.at(
                                Some(span.clone()),
                                "server.grpc_tls.client_san",
                                "needs client_ca_file: only a verified client certificate has a name to check",
                            ));
                        }
                        Some(name) => Some(
                            rustls_pki_types::ServerName::try_from(name.as_str())
                                .map(|n| n.to_owned())
                                .map_err(|e| {
                                    errors.at(
                                        Some(span.clone()),
                                        "server.grpc_tls.client_san",
                                        format!("a DNS name or IP address, not {name:?}: {e}"),
                                    )
                                })?,
                        ),
                    },
                })
            }
        };
        let default = |s: &str| s.parse().unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
        let var = |raw: Option<Spanned<String>>, field: &str| match raw {
            Some(name) if name.get_ref().is_empty() => Err(errors.at(
                Some(name.span()),
                format!("server.{field}"),
                "name an environment variable, or leave the field out",
            )),
            other => Ok(other.map(Spanned::into_inner)),
        };
        let admin_token_env = var(self.admin_token_env, "admin_token_env")?;
        let check_token_env = var(self.check_token_env, "check_token_env")?;
        let refund_token_env = var(self.refund_token_env, "refund_token_env")?;
        let receipt_key_env = var(self.receipt_key_env, "receipt_key_env")?;
        let timeout = |raw: Option<Spanned<DurationText>>, field: &str, default: Duration| match raw
        {
            Some(t) if t.get_ref().0.is_zero() => Err(errors.at(
                Some(t.span()),
                format!("server.{field}"),
                "the timeout must be at least 1ms",
            )),
            Some(t) => Ok(t.into_inner().0),
            None => Ok(default),
        };
        let at_least_one = |raw: Option<Spanned<u32>>, field: &str, what: &str| match raw {
            Some(n) if *n.get_ref() == 0 => Err(errors.at(
                Some(n.span()),
                format!("server.{field}"),
                format!("{what} must be at least 1"),
            )),
            other => Ok(other.map(Spanned::into_inner)),
        };
        // A count of at least one, or its default.
        let count = |raw: Option<Spanned<u32>>, field: &str, what: &str, default: usize| {
            at_least_one(raw, field, what).map(|n| n.map_or(default, |n| n as usize))
        };
        let header_read_timeout = timeout(
            self.header_read_timeout,
            "header_read_timeout",
            DEFAULT_HEADER_READ_TIMEOUT,
        )?;
        let body_read_timeout = timeout(
            self.body_read_timeout,
            "body_read_timeout",
            DEFAULT_BODY_READ_TIMEOUT,
        )?;
        let max_connections = count(
            self.max_connections,
            "max_connections",
            "the connection limit",
            DEFAULT_MAX_CONNECTIONS,
        )?;
        let max_connections_per_ip = count(
            self.max_connections_per_ip,
            "max_connections_per_ip",
            "the per-address connection limit",
            DEFAULT_MAX_CONNECTIONS_PER_IP,
        )?;
        let idle_timeout = timeout(self.idle_timeout, "idle_timeout", DEFAULT_IDLE_TIMEOUT)?;
        let write_timeout = timeout(self.write_timeout, "write_timeout", DEFAULT_WRITE_TIMEOUT)?;
        let max_health_watches = count(
            self.max_health_watches,
            "max_health_watches",
            "the health Watch limit",
            DEFAULT_MAX_HEALTH_WATCHES,
        )?;
        let max_rlqs_bucket_bytes = count(
            self.max_rlqs_bucket_bytes,
            "max_rlqs_bucket_bytes",
            "the RLQS bucket memory limit",
            DEFAULT_MAX_RLQS_BUCKET_BYTES,
        )?;
        let grpc_max_message_bytes = count(
            self.grpc_max_message_bytes,
            "grpc_max_message_bytes",
            "the message size limit",
            DEFAULT_GRPC_MAX_MESSAGE_BYTES,
        )?;
        let grpc_max_concurrent_streams = at_least_one(
            self.grpc_max_concurrent_streams,
            "grpc_max_concurrent_streams",
            "the stream limit",
        )?
        .unwrap_or(DEFAULT_GRPC_MAX_CONCURRENT_STREAMS);
        let max_batch = count(
            self.max_batch,
            "max_batch",
            "the batch size limit",
            DEFAULT_MAX_BATCH,
        )?;
        let max_batch_cost = at_least_one(
            self.max_batch_cost,
            "max_batch_cost",
            "the batch cost limit",
        )?
        .map_or(DEFAULT_MAX_BATCH_COST, u64::from);
        let max_descriptors = count(
            self.max_descriptors,
            "max_descriptors",
            "the descriptor limit",
            DEFAULT_MAX_DESCRIPTORS,
        )?;
        let max_descriptor_entries = count(
            self.max_descriptor_entries,
            "max_descriptor_entries",
            "the entry limit",
            DEFAULT_MAX_DESCRIPTOR_ENTRIES,
        )?;
        let max_keep_for = timeout(self.max_keep_for, "max_keep_for", DEFAULT_MAX_KEEP_FOR)?;
        let max_delay = timeout(self.max_delay, "max_delay", DEFAULT_MAX_DELAY)?;
        let max_stored_response = self
            .max_stored_response
            .map_or(DEFAULT_MAX_STORED_RESPONSE, |n| n.into_inner() as usize);
        let allowed_hosts = match self.allowed_hosts {
            Some(hosts) => Some(checked_allowed_hosts(hosts, errors)?),
            None => None,
        };
        let admin_failure_limit = match self.admin_failure_limit {
            Some(rule) => rule,
            None => DEFAULT_ADMIN_FAILURE_LIMIT
                .parse()
                .map_err(|e| errors.at(None, "server.admin_failure_limit", format!("{e}")))?,
        };
        Ok(ServerSettings {
            http: self.http.map_or_else(|| default(DEFAULT_HTTP), |p| p.0),
            grpc: self.grpc.map_or_else(|| default(DEFAULT_GRPC), |p| p.0),
            admin_token_env,
            check_token_env,
            refund_token_env,
            receipt_key_env,
            header_read_timeout,
            body_read_timeout,
            max_connections,
            max_connections_per_ip,
            idle_timeout,
            write_timeout,
            max_health_watches,
            max_rlqs_bucket_bytes,
            allowed_hosts,
            grpc_max_message_bytes,
            grpc_max_concurrent_streams,
            admin_failure_limit,
            max_batch,
            max_batch_cost,
            max_descriptors,
            max_descriptor_entries,
            max_keep_for,
            max_delay,
            max_stored_response,
            dashboard: self.dashboard,
            headers: self.headers.unwrap_or_default(),
            grpc_tls,
        })
    }
}

impl RawStore {
    fn validate(self, errors: &Errors<'_>) -> Result<StoreSettings, ConfigError> {
        let url = match self.url {
            Some(url) => {
                crate::store::check_url(url.get_ref())
                    .map_err(|msg| errors.at(Some(url.span()), "store.url", msg))?;
                url.into_inner()
            }
            None => "memory://".to_owned(),
        };
        let timeout = match self.timeout {
            Some(t) if t.get_ref().0.is_zero() => {
                return Err(errors.at(
                    Some(t.span()),
                    "store.timeout",
                    "the timeout must be at least 1ms",
                ));
            }
            Some(t) => t.into_inner().0,
            None => Duration::from_millis(50),
        };
        let prefix = match self.prefix {
            Some(p) if p.get_ref().is_empty() => {
                return Err(errors.at(
                    Some(p.span()),
                    "store.prefix",
                    "the key prefix cannot be empty",
                ));
            }
            Some(p) => p.into_inner(),
            None => "tg".to_owned(),
        };
        let file = |field: &str, raw: Option<Spanned<String>>| -> Result<_, ConfigError> {
            let Some(raw) = raw else { return Ok(None) };
            let at =
                |message: String| errors.at(Some(raw.span()), format!("store.{field}"), message);
            if !url.starts_with("rediss") {
                return Err(at(format!(
                    "TLS files need TLS: store.url must use a rediss scheme, not {:?}",
                    crate::store::redact(&url)
                )));
            }
            // Relative to the configuration file, wherever the server was started.
            let path = Path::new(errors.file)
                .parent()
                .unwrap_or(Path::new(""))
                .join(raw.get_ref());
            if !path.is_file() {
                return Err(at(format!("no file at {}", path.display())));
            }
            Ok(Some(path))
        };
        let tls_ca_file = file("tls_ca_file", self.tls_ca_file)?;
        let cert_span = self.tls_cert_file.as_ref().map(Spanned::span);
        let key_span = self.tls_key_file.as_ref().map(Spanned::span);
        let tls_client_cert = match (
            file("tls_cert_file", self.tls_cert_file)?,
            file("tls_key_file", self.tls_key_file)?,
        ) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(errors.at(
                    cert_span,
                    "store.tls_key_file",
                    "a client certificate (tls_cert_file) needs its key: set tls_key_file",
                ));
            }
            (None, Some(_)) => {
                return Err(errors.at(
                    key_span,
                    "store.tls_cert_file",
                    "a client key (tls_key_file) needs its certificate: set tls_cert_file",
                ));
            }
        };
        let memory = MemoryBudgets {
            max_keys: self.max_keys.map(|n| n.into_inner() as usize),
            max_bans: self.max_bans.map(|n| n.into_inner() as usize),
            max_locks: self.max_locks.map(|n| n.into_inner() as usize),
            max_response_bytes: self.max_response_bytes.map(|n| n.into_inner() as usize),
        };
        let repair = match self.repair {
            Some(r) if !r.get_ref().0.is_zero() && url.starts_with("memory") => {
                return Err(errors.at(
                    Some(r.span()),
                    "store.repair",
                    "repair after a failover is for a Redis store (store.url is memory://); \
                     remove it or give a redis URL",
                ));
            }
            Some(r) => Some(r.into_inner().0).filter(|d| !d.is_zero()),
            None => None,
        };
        Ok(StoreSettings {
            url,
            on_error: self.on_error.unwrap_or_default(),
            timeout,
            prefix,
            tls_ca_file,
            tls_client_cert,
            memory,
            repair,
        })
    }
}

impl RawPolicy {
    /// `durability`, `replicas` and `replication_timeout` together.
    fn durability(&self, field: &str, errors: &Errors<'_>) -> Result<Durability, ConfigError> {
        let replicated = self
            .durability
            .as_ref()
            .is_some_and(|d| *d.get_ref() == RawDurability::Replicated);
        if !replicated {
            let stray = (self.replicas.as_ref().map(|r| ("replicas", r.span()))).or_else(|| {
                let timeout = self.replication_timeout.as_ref();
                timeout.map(|t| ("replication_timeout", t.span()))
            });
            if let Some((name, span)) = stray {
                return Err(errors.at(
                    Some(span),
                    format!("{field}.{name}"),
                    format!("`{name}` goes with `durability = \"replicated\"`"),
                ));
            }
            return Ok(Durability::Async);
        }
        let replicas = match &self.replicas {
            None => 1,
            Some(r) if *r.get_ref() == 0 => {
                return Err(errors.at(
                    Some(r.span()),
                    format!("{field}.replicas"),
                    "expected at least 1 replica to wait for",
                ));
            }
            Some(r) => *r.get_ref(),
        };
        let timeout = match &self.replication_timeout {
            None => DEFAULT_REPLICATION_TIMEOUT,
            Some(t) if t.get_ref().0 < Duration::from_millis(1) => {
                return Err(errors.at(
                    Some(t.span()),
                    format!("{field}.replication_timeout"),
                    "expected at least 1ms (Redis would wait forever for 0)",
                ));
            }
            Some(t) => t.get_ref().0,
        };
        Ok(Durability::replicated(replicas, timeout))
    }

    fn validate(
        self,
        name: &str,
        field: &str,
        span: std::ops::Range<usize>,
        default_on_error: OnError,
        errors: &Errors<'_>,
    ) -> Result<PolicyEntry, ConfigError> {
        if self.limiters.is_empty() {
            return Err(errors.at(
                Some(span.clone()),
                format!("{field}.limiters"),
                "a policy needs at least one limiter",
            ));
        }
        let durability = self.durability(field, errors)?;
        let mut builder = Policy::builder(name)
            .durability(durability)
            .on_error(self.on_error.unwrap_or(default_on_error))
            .shadow(self.shadow)
            .ban_scope(match self.ban_scope {
                RawBanScope::Everywhere => tollgate::BanScope::Everywhere,
                RawBanScope::Policy => tollgate::BanScope::Policy,
            });
        let mut names: Vec<String> = Vec::new();
        for (i, raw) in self.limiters.into_iter().enumerate() {
            let span = raw.span();
            let here = format!("{field}.limiters[{i}]");
            let limiter = raw.into_inner().validate(&here, span.clone(), errors)?;
            let limiter_name = limiter.name().to_owned();
            if names.contains(&limiter_name) {
                return Err(errors.at(
                    Some(span),
                    here,
                    format!(
                        "two limiters are named {limiter_name:?}; give one a distinct `name` (they would share counters)"
                    ),
                ));
            }
            names.push(limiter_name);
            builder = builder.limiter(limiter);
        }
        let mut bypass_summary = None;
        if let Some(bypass) = self.bypass {
            let (b, shown) = bypass.build();
            bypass_summary = Some(shown);
            builder = builder.bypass(b);
        }
        let lease_span = self.lease.as_ref().map(Spanned::span);
        if let Some(lease) = &self.lease {
            builder = builder.lease(lease.get_ref().lease());
        }
        let policy = builder.build().map_err(|e| match (&e, lease_span) {
            (tollgate::PolicyError::Lease(_), Some(at)) => {
                errors.at(Some(at), format!("{field}.lease"), e.to_string())
            }
            _ => errors.at(Some(span), field.to_owned(), e.to_string()),
        })?;
        let duplicate = self.duplicate.map(|d| {
            let mut guard = DuplicateGuard::new(name, d.by.0).global(d.global);
            if let Some(ttl) = d.ttl {
                guard = guard.with_ttl(ttl.0);
            }
            Arc::new(guard)
        });
        let fields = PolicyFields::new(&policy);
        Ok(PolicyEntry {
            rule_texts: rule_texts(&policy),
            policy_field: axum::http::HeaderValue::from_str(fields.policy()).ok(),
            fields: Arc::new(fields),
            policy: Arc::new(policy),
            duplicate,
            bypass: bypass_summary,
            metrics: Arc::default(),
        })
    }
}

/// A rate rule whose window is a day or longer, or a calendar window (a lease's time to live is
/// not a window of counts).
pub(crate) fn long_window(rule: &tollgate::Rule) -> bool {
    !rule.is_concurrent()
        && (rule.calendar_window().is_some() || rule.window() >= Duration::from_secs(86_400))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse("t.toml", text).unwrap_err().to_string()
    }

    #[test]
    fn soft_rules_are_checked_like_rules() {
        let limiter = |fields: &str| {
            format!("[policies.q]\nlimiters = [\n  {{ by = \"user_id\", {fields} }},\n]\n")
        };
        let config = Config::parse("t.toml", &limiter("soft = [\"5/1h\"]")).unwrap();
        let names: Vec<&str> = config.policies["q"]
            .policy
            .limiters()
            .iter()
            .map(|l| l.name())
            .collect();
        assert_eq!(names, ["user_id.soft"]);
        for (fields, field, says) in [
            (
                "rules = [\"5/1h\"], soft = [\"5/1h\"]",
                "limiters[0].soft",
                "both enforced and soft",
            ),
            (
                "rules = [\"5/1h\"], soft = [\"1/1m\", \"1/1m\"]",
                "limiters[0].soft[1]",
                "listed twice",
            ),
            (
                "concurrent = 2, soft = [\"1/1m\"]",
                "limiters[0].soft",
                "concurrency limiter",
            ),
            ("soft = [\"5 per fortnight\"]", "soft", "unknown unit"),
        ] {
            let e = err(&limiter(fields));
            assert!(
                e.contains("t.toml:3") && e.contains(field) && e.contains(says),
                "{fields}: {e}"
            );
        }
    }

    /// An allowed host that no request could name would refuse every request with 421.
    #[test]
    fn allowed_hosts_are_names_a_request_can_give() {
        let hosts = |list: &str| format!("[server]\nallowed_hosts = {list}\n");
        let config = Config::parse(
            "t.toml",
            &hosts(r#"["api.example.com", "::1", "127.0.0.1"]"#),
        );
        assert!(config.is_ok(), "{:?}", config.err());
        assert!(Config::parse("t.toml", &hosts(r#"["*"]"#)).is_ok());
        for (list, says) in [
            ("[]", "at least one"),
            (r#"["api.example.com:8080"]"#, "without its port"),
            (r#"["[::1]"]"#, "without brackets"),
            (r#"[""]"#, "empty name"),
            (r#"["https://api.example.com/"]"#, "not a URL"),
        ] {
            let e = err(&hosts(list));
            assert!(
                e.contains("t.toml:2") && e.contains("server.allowed_hosts") && e.contains(says),
                "{list}: {e}"
            );
        }
    }

    #[test]
    fn a_webhook_url_is_http_or_https_with_a_host() {
        let config = |text: &str| Config::parse("t.toml", text);
        let hook = config("[webhook]\nurl = \"https://hooks.example.com/t?k=1\"\n")
            .unwrap()
            .webhook
            .unwrap();
        assert_eq!(
            (
                hook.https,
                hook.host.as_str(),
                hook.port,
                hook.path.as_str()
            ),
            (true, "hooks.example.com", 443, "/t?k=1")
        );
        let hook = config("[webhook]\nurl = \"http://[::1]:9000\"\ntimeout = \"2s\"\n")
            .unwrap()
            .webhook
            .unwrap();
        assert_eq!(
            (
                hook.host.as_str(),
                hook.port,
                hook.path.as_str(),
                hook.timeout
            ),
            ("::1", 9000, "/", Duration::from_secs(2))
        );
        assert_eq!(config("").unwrap().webhook, None);
        for (text, field, says) in [
            ("url = \"ftp://x/\"", "webhook.url", "http or https"),
            ("url = \"http://:80/\"", "webhook.url", "a host"),
            (
                "url = \"http://x:port/\"",
                "webhook.url",
                "the port is a number",
            ),
            (
                "url = \"https://u:s3cret@x/\"",
                "webhook.url",
                "credentials",
            ),
            (
                "url = \"ftp://x/hook/s3cret\"",
                "webhook.url",
                "http or https",
            ),
            (
                "url = \"http://x/\"\nca = \"ca.pem\"",
                "webhook.ca",
                "https",
            ),
            ("ca = \"ca.pem\"", "webhook.ca", "goes with webhook.url"),
            (
                "url = \"http://x/\"\ntimeout = \"2m\"",
                "webhook.timeout",
                "1ms to 60s",
            ),
        ] {
            let e = err(&format!("[webhook]\n{text}\n"));
            assert!(
                e.contains("t.toml:") && e.contains(field) && e.contains(says),
                "{text}: {e}"
            );
            // A failed reload's error is shown on the stats page: never the URL's secret.
            assert!(!e.contains("s3cret"), "{text}: {e}");
        }
    }

    #[test]
    fn warn_at_is_a_fraction_of_each_rule() {
        let policy = |warn: &str| {
            format!(
                "[policies.q]\nlimiters = [\n  {{ by = \"user_id\", rules = \"100/1h\", warn_at = {warn} }},\n]\n"
            )
        };
        let config = Config::parse("t.toml", &policy("0.8")).unwrap();
        assert_eq!(
            config.policies["q"].policy.limiters()[0].warning(),
            Some(0.8)
        );
        assert!(config.policies["q"].policy.warns());
        for bad in ["0.0", "1.5", "-1.0"] {
            let e = err(&policy(bad));
            assert!(
                e.contains("t.toml:3")
                    && e.contains("policies.q.limiters[0].warn_at")
                    && e.contains("above 0 and at most 1"),
                "{bad}: {e}"
            );
        }
        let e = err(&policy("\"80%\""));
        assert!(e.contains("warn_at") || e.contains("invalid type"), "{e}");
    }

    #[test]
    fn repair_is_for_redis_and_zero_turns_it_off() {
        let store = |extra: &str| format!("[store]\n{extra}\n");
        let config = Config::parse(
            "t.toml",
            &store("url = \"redis://127.0.0.1:6379\"\nrepair = \"5s\""),
        )
        .unwrap();
        assert_eq!(config.store.repair, Some(Duration::from_secs(5)));
        let config = Config::parse(
            "t.toml",
            &store("url = \"redis://127.0.0.1:6379\"\nrepair = \"0s\""),
        )
        .unwrap();
        assert_eq!(config.store.repair, None);
        let config = Config::parse("t.toml", &store("url = \"redis://127.0.0.1:6379\"")).unwrap();
        assert_eq!(config.store.repair, None, "off unless asked");
        let e = err(&store("repair = \"5s\""));
        assert!(
            e.contains("t.toml:2") && e.contains("store.repair") && e.contains("for a Redis store"),
            "{e}"
        );
    }

    #[test]
    fn durability_is_async_unless_replicated_and_its_numbers_are_checked() {
        let policy = |extra: &str| {
            format!(
                "[policies.q]\nlimiters = [{{ by = \"user_id\", rules = \"100/30d\" }}]\n{extra}"
            )
        };
        let config = Config::parse("t.toml", &policy("")).unwrap();
        assert_eq!(config.policies["q"].policy.durability(), Durability::Async);
        let config = Config::parse("t.toml", &policy("durability = \"replicated\"\n")).unwrap();
        assert_eq!(
            config.policies["q"].policy.durability(),
            Durability::replicated(1, Duration::from_millis(20))
        );
        let config = Config::parse(
            "t.toml",
            &policy("durability = \"replicated\"\nreplicas = 2\nreplication_timeout = \"1s\"\n"),
        )
        .unwrap();
        assert_eq!(
            config.policies["q"].policy.durability(),
            Durability::replicated(2, Duration::from_secs(1))
        );
        let e = err(&policy("replicas = 2\n"));
        assert!(
            e.contains("t.toml:3")
                && e.contains("policies.q.replicas")
                && e.contains("goes with `durability = \"replicated\"`"),
            "{e}"
        );
        let e = err(&policy("durability = \"replicated\"\nreplicas = 0\n"));
        assert!(
            e.contains("policies.q.replicas") && e.contains("at least 1"),
            "{e}"
        );
        let e = err(&policy(
            "durability = \"replicated\"\nreplication_timeout = \"0s\"\n",
        ));
        assert!(e.contains("policies.q.replication_timeout"), "{e}");
        let e = err(&policy("durability = \"sync\"\n"));
        assert!(
            e.contains("t.toml:3") && e.contains("unknown variant `sync`"),
            "{e}"
        );
    }

    #[test]
    fn a_lease_is_off_unless_asked_and_its_numbers_and_rules_are_checked() {
        let policy = |algorithm: &str, extra: &str| {
            format!(
                "[policies.q]\nlimiters = [{{ by = \"ip\", rules = \"1000/1m\", algorithm = \"{algorithm}\" }}]\n{extra}"
            )
        };
        let config = Config::parse("t.toml", &policy("fixed_window", "")).unwrap();
        assert_eq!(config.policies["q"].policy.lease(), None);
        let config = Config::parse(
            "t.toml",
            &policy(
                "fixed_window",
                "lease = { ttl = \"2s\", share = 0.5, max_units = 100 }\n",
            ),
        )
        .unwrap();
        assert_eq!(
            config.policies["q"].policy.lease(),
            Some(
                tollgate::QuotaLease::new(Duration::from_secs(2))
                    .share(0.5)
                    .max_units(100)
            )
        );
        let e = err(&policy("sliding_log", "lease = { ttl = \"1s\" }\n"));
        assert!(
            e.contains("t.toml:3") && e.contains("policies.q.lease") && e.contains("sliding_log"),
            "{e}"
        );
        let e = err(&policy(
            "fixed_window",
            "lease = { ttl = \"1s\", share = 2.0 }\n",
        ));
        assert!(e.contains("policies.q.lease") && e.contains("share"), "{e}");
        let e = err(&policy(
            "fixed_window",
            "lease = { ttl = \"1s\", units = 5 }\n",
        ));
        assert!(
            e.contains("t.toml:3") && e.contains("unknown field `units`"),
            "{e}"
        );
    }

    #[test]
    fn rules_may_be_one_string() {
        let config = Config::parse(
            "t.toml",
            "[policies.a]\nlimiters = [{ by = \"ip\", rules = \"1/s; 100 per hour\" }]\n",
        )
        .unwrap();
        let rules = config.policies["a"].policy.limiters()[0].rules().to_vec();
        assert_eq!(
            rules,
            vec!["1/1s".parse().unwrap(), "100/1h".parse().unwrap()]
        );
    }

    #[test]
    fn errors_name_file_line_field_and_expectation() {
        let text =
            "[policies.sms]\nlimiters = [\n  { by = \"ip\", rules = [\"1/1m\", \"10/1x\"] },\n]\n";
        assert_eq!(
            err(text),
            r#"t.toml:3: policies.sms.limiters[0].rules[1]: "10/1x": unknown unit "x" (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"#
        );
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = err("[store]\nurl = \"memory://\"\ntimout = \"1s\"\n");
        assert!(
            e.starts_with("t.toml:3: store.timout: unknown field `timout`, expected one of `url`"),
            "{e}"
        );
        let e = err("[policies.a]\nlimiters = [{ by = \"ip\", rules = [\"1/1m\"], colour = 1 }]\n");
        assert!(
            e.starts_with("t.toml:2: policies.a.limiters[0].colour: unknown field `colour`"),
            "{e}"
        );
    }

    #[test]
    fn semantic_errors_name_the_policy() {
        let e = err(
            "[policies.a]\nlimiters = [\n { by = \"ip\", rules = [\"1/1m\"] },\n { by = \"ip\", rules = [\"2/1m\"] },\n]\n",
        );
        assert!(
            e.starts_with("t.toml:4: policies.a.limiters[1]: two limiters are named \"ip\""),
            "{e}"
        );
        let e = err("[policies.a]\nlimiters = [\n { by = \"ip\", rules = \"1/1m; 5/x\" },\n]\n");
        assert!(
            e.starts_with(r#"t.toml:3: policies.a.limiters[0].rules: "5/x": unknown unit "x""#),
            "{e}"
        );
        let e = err("[policies.a]\nlimiters = [\n { by = \"ip\", rules = 5 },\n]\n");
        assert!(e.contains("expected a list of rules such as"), "{e}");
        let e = err("[policies.a]\nlimiters = [\n { by = \"ip\", rules = [] },\n]\n");
        assert!(
            e.starts_with("t.toml:3: policies.a.limiters[0].rules: a limiter needs"),
            "{e}"
        );
        let e = err("[policies.a]\nlimiters = []\n");
        assert!(
            e.starts_with("t.toml:1: policies.a.limiters: a policy needs at least one limiter"),
            "{e}"
        );
    }

    #[test]
    fn tls_files_are_found_beside_the_config_and_checked() {
        let dir = std::env::temp_dir().join(format!("tollgate-config-tls-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("certs")).unwrap();
        for f in ["ca.pem", "client.pem", "client.key"] {
            std::fs::write(dir.join("certs").join(f), "").unwrap();
        }
        let file = dir.join("tollgate.toml").display().to_string();
        let parse = |store: &str| Config::parse(&file, &format!("[store]\n{store}"));

        let ok = parse(
            "url = \"rediss://h:6380\"\ntls_ca_file = \"certs/ca.pem\"\n\
             tls_cert_file = \"certs/client.pem\"\ntls_key_file = \"certs/client.key\"\n",
        )
        .unwrap();
        assert_eq!(ok.store.tls_ca_file, Some(dir.join("certs/ca.pem")));
        assert_eq!(
            ok.store.tls_client_cert,
            Some((dir.join("certs/client.pem"), dir.join("certs/client.key")))
        );

        let e = parse("url = \"rediss://h\"\ntls_ca_file = \"certs/nope.pem\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("{file}:3: store.tls_ca_file: no file at ")),
            "{e}"
        );
        assert!(e.ends_with("certs/nope.pem"), "{e}");
        let e = parse("url = \"redis://h\"\ntls_ca_file = \"certs/ca.pem\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":3: store.tls_ca_file: TLS files need TLS"),
            "{e}"
        );
        let e = parse("url = \"rediss://h\"\ntls_cert_file = \"certs/client.pem\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":3: store.tls_key_file: a client certificate"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_client_san_needs_a_client_ca_and_a_name() {
        let dir = std::env::temp_dir().join(format!("tollgate-config-san-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["cert.pem", "key.pem", "ca.pem"] {
            std::fs::write(dir.join(f), "").unwrap();
        }
        let file = dir.join("tollgate.toml").display().to_string();
        let parse = |tls: &str| {
            Config::parse(
                &file,
                &format!(
                    "[server]\ngrpc_tls = {{ cert_file = \"cert.pem\", key_file = \"key.pem\"{tls} }}\n"
                ),
            )
        };
        let ok = parse(", client_ca_file = \"ca.pem\", client_san = \"rls.example\"").unwrap();
        let tls = ok.server.grpc_tls.unwrap();
        assert_eq!(tls.client_ca, Some(dir.join("ca.pem")));
        assert_eq!(
            tls.client_san,
            Some(rustls_pki_types::ServerName::try_from("rls.example").unwrap())
        );
        let e = parse(", client_san = \"rls.example\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":2: server.grpc_tls.client_san: needs client_ca_file"),
            "{e}"
        );
        let e = parse(", client_ca_file = \"ca.pem\", client_san = \"not a name\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":2: server.grpc_tls.client_san: a DNS name or IP address"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn server_limits_have_defaults_and_are_checked() {
        let c = Config::parse("t.toml", "").unwrap();
        assert_eq!(c.server.header_read_timeout, Duration::from_secs(5));
        assert_eq!(c.server.body_read_timeout, Duration::from_secs(10));
        assert_eq!(c.server.max_connections, 10_000);
        assert_eq!(c.server.grpc_max_message_bytes, 1 << 20);
        assert_eq!(c.server.grpc_max_concurrent_streams, 1000);
        assert_eq!(c.server.max_batch, 100);
        assert_eq!(c.server.admin_failure_limit.to_string(), "5/1m");
        assert_eq!(c.server.max_delay, Duration::from_secs(60));

        let c = Config::parse(
            "t.toml",
            "[server]\nheader_read_timeout = \"300ms\"\nbody_read_timeout = \"2s\"\n\
             max_connections = 3\ngrpc_max_message_bytes = 4096\n\
             grpc_max_concurrent_streams = 8\nadmin_failure_limit = \"3/10m\"\n\
             max_delay = \"500ms\"\n",
        )
        .unwrap();
        assert_eq!(c.server.header_read_timeout, Duration::from_millis(300));
        assert_eq!(c.server.body_read_timeout, Duration::from_secs(2));
        assert_eq!(c.server.max_connections, 3);
        assert_eq!(c.server.grpc_max_message_bytes, 4096);
        assert_eq!(c.server.grpc_max_concurrent_streams, 8);
        assert_eq!(c.server.admin_failure_limit.to_string(), "3/10m");
        assert_eq!(c.server.max_delay, Duration::from_millis(500));

        assert_eq!(
            err("[server]\nhttp = \"127.0.0.1:1\"\nheader_read_timeout = \"0s\"\n"),
            "t.toml:3: server.header_read_timeout: the timeout must be at least 1ms"
        );
        assert_eq!(
            err("[server]\nbody_read_timeout = \"10x\"\n"),
            r#"t.toml:2: server.body_read_timeout: "10x": unknown unit "x" (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"#
        );
        assert_eq!(
            err("[server]\nmax_delay = \"0s\"\n"),
            "t.toml:2: server.max_delay: the timeout must be at least 1ms"
        );
        assert_eq!(
            err("[server]\n\nmax_connections = 0\n"),
            "t.toml:3: server.max_connections: the connection limit must be at least 1"
        );
        let e = err("[server]\nmax_connections = -5\n");
        assert!(e.starts_with("t.toml:2: server.max_connections: "), "{e}");
        let e = err("[server]\ngrpc_max_message_bytes = 99999999999\n");
        assert!(
            e.starts_with("t.toml:2: server.grpc_max_message_bytes: "),
            "{e}"
        );
        assert_eq!(
            err("[server]\ngrpc_max_concurrent_streams = 0\n"),
            "t.toml:2: server.grpc_max_concurrent_streams: the stream limit must be at least 1"
        );
        assert_eq!(
            err("[server]\nmax_batch = 0\n"),
            "t.toml:2: server.max_batch: the batch size limit must be at least 1"
        );
        let e = err("[server]\nadmin_failure_limit = \"5/1x\"\n");
        assert!(
            e.starts_with("t.toml:2: server.admin_failure_limit: \"5/1x\": unknown unit"),
            "{e}"
        );
        let e = err("[server]\nheaders = \"fancy\"\n");
        assert!(e.starts_with("t.toml:2: server.headers: "), "{e}");
        assert!(e.contains("`draft`, `legacy`, `draft6`, `none`"), "{e}");
        let style = |text: &str| Config::parse("t.toml", text).unwrap().server.headers;
        assert_eq!(style(""), HeaderStyle::Draft);
        assert_eq!(
            style("[server]\nheaders = \"legacy\"\n"),
            HeaderStyle::Legacy
        );
    }

    #[test]
    fn ip_prefixes_are_read_and_checked() {
        let config = Config::parse(
            "t.toml",
            "[policies.signup]\nlimiters = [\n  { by = \"ip\", rules = [\"3/1h\"], ipv6_prefix = 48, ipv4_prefix = 24 },\n  { by = \"ip\", name = \"per_64\", rules = [\"9/1h\"] },\n]\n",
        )
        .unwrap();
        let limiters = config.policies["signup"].policy.limiters();
        assert_eq!(
            limiters[0].dimension().prefix(),
            Some(tollgate::IpPrefix::new(24, 48).unwrap())
        );
        assert_eq!(
            limiters[1].dimension().prefix(),
            Some(tollgate::IpPrefix::DEFAULT)
        );
        let summary = config.summary();
        assert!(
            summary.contains("limiter ip by ip (IPv4 /24, IPv6 /48): 3/1h"),
            "{summary}"
        );
        assert!(
            summary.contains("limiter per_64 by ip (IPv4 /32, IPv6 /64): 9/1h"),
            "{summary}"
        );

        let limiter = |fields: &str| {
            err(&format!(
                "[policies.a]\nlimiters = [\n  {{ by = \"ip\", rules = [\"1/1m\"] }},\n  {{ rules = [\"1/1m\"], {fields} }},\n]\n"
            ))
        };
        assert_eq!(
            limiter("by = \"ip\", name = \"b\", ipv6_prefix = 129"),
            "t.toml:4: policies.a.limiters[1].ipv6_prefix: 129 is not a prefix length: use 0 to 128 (64 is one subscriber, 56 or 48 a site)"
        );
        assert_eq!(
            limiter("by = \"ip\", name = \"b\", ipv4_prefix = -1"),
            "t.toml:4: policies.a.limiters[1].ipv4_prefix: -1 is not a prefix length: use 0 to 32 (32 counts each IPv4 address, 24 a /24)"
        );
        assert_eq!(
            limiter("by = \"user_id\", ipv4_prefix = 24"),
            "t.toml:4: policies.a.limiters[1].ipv4_prefix: ipv4_prefix applies to by = \"ip\", not by = \"user_id\""
        );
        let e = limiter("by = \"ip\", name = \"b\", ipv6_prefix = \"48\"");
        assert!(
            e.starts_with("t.toml:4: policies.a.limiters[1].ipv6_prefix: invalid type"),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let e = err("[server]\nhttp = \"127.0.0.1:1\"\ngrpc = \n");
        assert!(e.starts_with("t.toml:3: "), "{e}");
    }

    #[test]
    fn the_issue_example_parses() {
        let text = include_str!("../../../examples/tollgate.toml");
        let config = Config::parse("examples/tollgate.toml", text).unwrap();
        assert!(config.policies.contains_key("sms_code"));
        let summary = config.summary();
        assert!(summary.contains("policy sms_code"), "{summary}");
    }
}
