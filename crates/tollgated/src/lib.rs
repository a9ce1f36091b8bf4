//! The `tollgate` server: multi-rule rate limits and duplicate guards as a service.
//!
//! One binary, `tollgate`, reads a TOML file of policies and serves them over an HTTP/JSON
//! API (`/v1/check`, `/v1/peek`, `/v1/checks`, `/v1/reset`, duplicate guard and blocklist
//! endpoints, `/metrics`, `/healthz`, `/readyz`) and Envoy's rate-limit gRPC API
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) with gRPC health checking,
//! on the embedded memory store or on Redis; a live dashboard at `/`. See `docs/configuration.md` and `docs/api.md`.
//!
//! ```
//! let config = tollgated::Config::parse(
//!     "tollgate.toml",
//!     r#"
//! [policies.sms_code]
//! limiters = [{ by = "ip", rules = ["1/1m", "10/1x"] }]
//! "#,
//! );
//! assert_eq!(
//!     config.unwrap_err().to_string(),
//!     r#"tollgate.toml:3: policies.sms_code.limiters[0].rules[1]: "10/1x": unknown unit "x" (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"#
//! );
//! ```
//!
//! # Layout
//! - `cli`: the command line ([`Cli`]: `serve`, `check-config`, `envoy-ratelimit`, `plan`).
//! - `config`: the TOML file's shape, errors naming file, line and field ([`ConfigError`]),
//!   validation into policies and Envoy domains ([`Config`]).
//! - `store`: `[store]` settings and opening the store they name (memory, Redis).
//! - `admin`: admin authentication (constant-time token comparison, failed attempts rate
//!   limited per client address).
//! - `app`: the state handlers share (engine, current configuration, metrics) and reload.
//! - `http`: the HTTP/JSON API (axum): wire types, errors, and the handlers by concern
//!   (checks, duplicate guard, admin, operations); every 4xx body is an RFC 9457 problem document with a `code`.
//! - `listen`: the listeners' defences against slow and greedy clients (header and body
//!   timeouts, connection caps).
//! - `envoy`: the descriptor trees (built once per configuration load) and the
//!   `ShouldRateLimit` gRPC service (tonic).
//! - `grpc`: the gRPC port's two services, picked by the request path's service name.
//! - `health`: gRPC health checking (`grpc.health.v1`): the server, and the store apart.
//! - `metrics`: Prometheus metrics.
//! - `record`: the traffic record (`[record]`): what the server decided, as JSON lines.
//! - `observed`: what the server observed lately (top limited identities, its metrics' last 15
//!   minutes, reloads), which front ends report into and none owns.
//! - `dashboard`: the live dashboard at `/` and the `/v1/stats` JSON it polls, read from
//!   `observed`.
//! - `server`: `serve` (listeners, signals, reload loop, graceful drain) and `check-config`.
//! - `trace`: request spans (tower-http's `TraceLayer`) when the log filter asks for them.
//! - `plan`: `tollgate plan`, traffic replayed against a configuration before it is enforced.
//! - `in_process`: the router and the Envoy service without listeners, for tests.

mod app;
mod auth;
mod cli;
mod config;
mod dashboard;
mod envoy;
mod grpc;
mod health;
mod http;
mod in_process;
mod listen;
mod metrics;
mod observed;
mod plan;
mod receipt;
mod record;
mod rlqs;
mod server;
mod store;
mod tls;
mod trace;
mod webhook;

pub use cli::{
    CheckConfigArgs, Cli, Command, EnvoyRatelimitArgs, InputFormat, LogFormat, PlanArgs,
    ReportFormat, ServeArgs, Synthetic,
};
pub use config::{Config, ConfigError};
#[doc(hidden)]
pub use in_process::InProcess;
pub use plan::{Planned, plan};
pub use server::{check_config, serve, serve_envoy};
