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

fn parse_interval(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    // Bounded: a timer past the clock's range would panic when it is armed.
    crate::config::bounded_duration(text)
}
