//! gRPC health checking (`grpc.health.v1.Health`) on the gRPC port.
//!
//! - `""` (the server) and `envoy.service.ratelimit.v3.RateLimitService`: `SERVING` from start
//!   until shutdown begins. A failing store does not change them: every `on_error` (`allow`,
//!   `deny`, `local`) is still an answer, so a Redis blip must not take every replica out of
//!   the load balancer at once.
//! - `tollgate.store`: the store's own health, `SERVING` while it answers a ping (tried once a
//!   second, bounded by `store.timeout`), `NOT_SERVING` while it does not, `UNKNOWN` until the
//!   first ping. For alerts and dashboards, not for readiness.
//! - `ratelimit`: the health Envoy's reference rate-limit service reports under that name, for
//!   probes carried over from it: `SERVING` while the store answers and, with
//!   `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` (`envoy.require_domains`), a domain is
//!   configured; `NOT_SERVING` before the first ping answers, otherwise, and from shutdown on.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tonic_health::{
    ServingStatus,
    pb::health_server::{Health, HealthServer},
    server::{HealthReporter, health_reporter},
};

use crate::app::App;

/// The health service name of the store's own health.
pub(crate) const STORE: &str = "tollgate.store";
/// The health service name of the Envoy rate-limit service.
const ENVOY: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The health service name of Envoy's reference rate-limit service.
const REFERENCE: &str = "ratelimit";
/// How often the store is pinged.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The health service for `app`; its statuses are kept up to date until `stop` turns true,
/// when the server and Envoy services turn `NOT_SERVING`.
pub(crate) async fn service(
    app: Arc<App>,
    stop: watch::Receiver<bool>,
) -> HealthServer<impl Health> {
    let (reporter, server) = health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(ENVOY, ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(STORE, ServingStatus::Unknown)
        .await;
    reporter
        .set_service_status(REFERENCE, ServingStatus::NotServing)
        .await;
    tokio::spawn(probe(app, reporter, stop));
    server
}

async fn probe(app: Arc<App>, reporter: HealthReporter, mut stop: watch::Receiver<bool>) {
    use tollgate::Store as _;
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    let mut last_reference = None;
    loop {
        let stopping = tokio::select! {
            // Stopped, or the sender is gone with the server: either way, the end.
            _ = stop.wait_for(|&s| s) => true,
            _ = tick.tick() => false,
        };
        if stopping {
            for name in ["", ENVOY, REFERENCE] {
                reporter
                    .set_service_status(name, ServingStatus::NotServing)
                    .await;
            }
            return;
        }
        let started = Instant::now();
        let result = app.gate.store().ping().await;
        app.metrics
            .store_call("ping", started.elapsed(), result.is_err());
        let ok = result.is_ok();
        if last != Some(ok) {
            match &result {
                Ok(()) if last.is_some() => tracing::info!("the store answers again"),
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the store does not answer a ping; decisions follow on_error")
                }
            }
            let status = if ok {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter.set_service_status(STORE, status).await;
            last = Some(ok);
        }
        let config = app.config();
        let serving = ok && !(config.require_domains && config.envoy.is_empty());
        if last_reference != Some(serving) {
            let status = if serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter.set_service_status(REFERENCE, status).await;
            last_reference = Some(serving);
        }
    }
}
