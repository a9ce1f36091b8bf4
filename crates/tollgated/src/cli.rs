//! The command line.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

/// tollgate: multi-rule rate limits and duplicate guards as a service, over HTTP/JSON and the
/// Envoy rate-limit gRPC API.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (HTTP/JSON API, Envoy gRPC, metrics) with a configuration file.
    Serve(ServeArgs),
    /// Validate a configuration file and print its policies; exit 1 with the error if invalid.
    CheckConfig(CheckConfigArgs),
    /// Run as a drop-in for Envoy's reference rate-limit service (envoyproxy/ratelimit):
    /// configured by its environment variables (REDIS_URL, REDIS_TYPE, REDIS_AUTH, REDIS_TLS,
    /// HOST, PORT, GRPC_HOST, GRPC_PORT, CACHE_KEY_PREFIX, RUNTIME_ROOT, ...) and its YAML
    /// runtime directory; see docs/migrating-from-envoy-ratelimit.md.
    EnvoyRatelimit(EnvoyRatelimitArgs),
    /// Replay recorded traffic against a configuration (and, optionally, the current one) and
    /// report who would be limited, how often and for how long, before the limits are
    /// enforced; exits 2 when a budget (--max-newly-denied, --max-denied-identities) is
    /// exceeded. See docs/plan.md.
    Plan(PlanArgs),
}

/// `tollgate plan`.
#[derive(Debug, Args, Clone)]
pub struct PlanArgs {
    /// The candidate configuration: tollgate's TOML, or an Envoy rate-limit YAML file.
    #[arg(long, short, value_name = "FILE")]
    pub config: PathBuf,
    /// The configuration in force, to compare against. Without it, a tollgate record is
    /// compared with the decisions it recorded, and other traffic with no limit at all.
    #[arg(long, value_name = "FILE")]
    pub against: Option<PathBuf>,
    /// The traffic: files of the --input format, replayed together in time order.
    #[arg(value_name = "TRAFFIC", required_unless_present = "synthetic")]
    pub traffic: Vec<PathBuf>,
    /// The traffic files' format: tollgate's record, JSON lines mapped by --map, nginx's
    /// `combined` access log, or Envoy's default access log.
    #[arg(long, value_enum, default_value_t = InputFormat::Record)]
    pub input: InputFormat,
    /// Where a dimension comes from, `DIMENSION=FIELD`: `ip`, `user_id`, `user_name`,
    /// `header.NAME`, `arg.NAME`, `time`, `policy`, `cost` from a field (a dotted path in JSON
    /// lines; an access log's `remote_addr`, `remote_user`, `method`, `path`, `status`,
    /// `user_agent`, `referer`, `authority`, `forwarded_for`, `request_id`).
    #[arg(long = "map", value_name = "DIMENSION=FIELD")]
    pub map: Vec<String>,
    /// Only the lines whose field matches, `FIELD=PATTERN` (`*` matches any run of
    /// characters); repeated, all must match.
    #[arg(long = "where", value_name = "FIELD=PATTERN")]
    pub filter: Vec<String>,
    /// The policy a line without one is checked against (access logs, JSON lines).
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// The Envoy domain lines are checked in, each line one descriptor of --descriptor
    /// entries (access logs and JSON lines against an Envoy configuration).
    #[arg(long, value_name = "DOMAIN")]
    pub domain: Option<String>,
    /// An entry of that descriptor, `KEY=FIELD` (`remote_address=ip`), in order.
    #[arg(long = "descriptor", value_name = "KEY=FIELD")]
    pub descriptor: Vec<String>,
    /// Generate traffic instead of reading it: `steady`, `bursty` or `scraper`.
    #[arg(long, value_enum, value_name = "PATTERN")]
    pub synthetic: Option<Synthetic>,
    /// Synthetic traffic: requests a second, all identities together.
    #[arg(long, default_value_t = 10.0, value_name = "N")]
    pub rate: f64,
    /// Synthetic traffic: how long it lasts.
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = parse_interval)]
    pub duration: Duration,
    /// Synthetic traffic: how many client addresses send it.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub identities: u32,
    /// Synthetic traffic: the random generator's seed (the same seed, the same traffic).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub seed: u64,
    /// The report printed: a table, or JSON.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    pub format: ReportFormat,
    /// Also write the report as a self-contained HTML page with charts.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Also write each event's decision under the candidate, as JSON lines.
    #[arg(long, value_name = "FILE")]
    pub decisions: Option<PathBuf>,
    /// How many identities the report names.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Fail (exit 2) when more than this share of requests would be newly denied: `0.5%`, or
    /// a fraction (`0.005`).
    #[arg(long, value_name = "SHARE", value_parser = parse_share)]
    pub max_newly_denied: Option<f64>,
    /// Fail (exit 2) when more than this many identities would be denied at least once.
    #[arg(long, value_name = "N")]
    pub max_denied_identities: Option<u64>,
}

/// What a traffic file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    /// tollgate's own record (`[record]`).
    Record,
    /// JSON objects, one a line, mapped with --map.
    Json,
    /// nginx's `combined` access log.
    Nginx,
    /// Envoy's default access log.
    Envoy,
}

/// A synthetic arrival pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Synthetic {
    /// Every identity at an even share of the rate, arrivals at random (Poisson).
    Steady,
    /// The same, but in bursts: ten times the rate for a tenth of each minute, quiet between.
    Bursty,
    /// The steady crowd, plus one address sending as much as all of them together.
    Scraper,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// A table for the terminal.
    Table,
    /// JSON for machines.
    Json,
}

/// `tollgate envoy-ratelimit`.
#[derive(Debug, Args)]
pub struct EnvoyRatelimitArgs {
    /// An optional TOML file for tollgate's own settings (policies, admin token, ...); the
    /// service's variables fill in the rest, and TOLLGATE_... variables override both.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log lines as text or as JSON objects (LOG_FORMAT=json also chooses JSON; the level
    /// comes from RUST_LOG, else LOG_LEVEL, else warn).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// How often to look for changes to the YAML files (and the TOML file); 0 turns watching
    /// off (SIGHUP still reloads).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    pub watch_interval: Duration,
    /// On SIGTERM or Ctrl-C, how long to wait for in-flight requests before exiting anyway.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_interval)]
    pub drain_timeout: Duration,
}

/// `tollgate serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The TOML configuration file; reloaded on SIGHUP and when it changes.
    #[arg(long, short, value_name = "FILE")]
    pub config: PathBuf,
    /// The HTTP listen address, overriding server.http (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// The gRPC listen address, overriding server.grpc (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    pub grpc: Option<SocketAddr>,
    /// The store URL, overriding store.url (memory://, redis://host:6379, rediss://...,
    /// redis+cluster://a:7000,b:7001, redis+sentinel://host:26379/master).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Log lines as text or as JSON objects (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// How often to look for changes to the configuration file; 0 turns watching off
    /// (SIGHUP still reloads).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    pub watch_interval: Duration,
    /// On SIGTERM or Ctrl-C, how long to wait for in-flight requests before exiting anyway.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_interval)]
    pub drain_timeout: Duration,
}

/// `tollgate check-config`.
#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// The TOML configuration file (as `serve --config FILE`; `check-config FILE` works too).
    #[arg(
        long = "config",
        short = 'c',
        value_name = "FILE",
        required_unless_present = "positional",
        conflicts_with = "positional"
    )]
    config: Option<PathBuf>,
    #[arg(value_name = "FILE", hide = true)]
    positional: Option<PathBuf>,
}

impl CheckConfigArgs {
    /// The file to check.
    pub fn file(&self) -> &std::path::Path {
        self.config
            .as_deref()
            .or(self.positional.as_deref())
            .unwrap_or(std::path::Path::new(""))
    }
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `0.5%` or `0.005`: a share from 0 to 1.
fn parse_share(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let share = match text.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => text.parse::<f64>(),
    }
    .map_err(|_| format!("{text:?}: expected a share such as 0.5% or 0.005"))?;
    if (0.0..=1.0).contains(&share) {
        Ok(share)
    } else {
        Err(format!("{text:?}: a share is from 0% to 100%"))
    }
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    // Bounded: a timer past the clock's range would panic when it is armed.
    crate::config::bounded_duration(text)
}
