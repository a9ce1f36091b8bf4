//! The live dashboard: a page served at `/` (embedded assets, no build step, no CDN), the
//! JSON it polls (`GET /v1/stats`, also for scripts) and the top limited identities
//! (`GET /v1/stats/top`, admin only).
//!
//! What the request path pays: nothing for the chart (a sampler reads the Prometheus
//! exposition once a second, as a scraper would) and, for a rate-limited decision only, one
//! lock to count the identity in a bounded sketch.
//!
//! Access: the page and `/v1/stats` show aggregates only (decisions per policy and reason,
//! store health, the policies' rules, reload status); they are on when `server.dashboard`
//! says so, by default when the HTTP listener is on a loopback address. Whatever names an
//! identity (the top list, the bans) or changes state (ban, unban) goes through the admin
//! endpoints and their bearer token.
//!
//! # Layout
//! - `sketch`: the Space-Saving sketch of the top limited identities, over two generations.
//! - `exposition`: reading the server's own metrics text; latency quantiles from histograms.
//! - `history`: the last 15 minutes, one bucket per second.
//! - `handlers`: the page, its assets and the JSON endpoints.

mod exposition;
mod handlers;
mod history;
mod sketch;

use std::{
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::{Router, routing::get};
use tollgate::{Decision, Identity, Policy, Reason};
use tollgate_redis::RedisStore;

use crate::{app::App, metrics::Metrics, store::Opened};

/// How many identities each generation of the sketch holds.
const TOP_CAPACITY: usize = 128;
/// How long a generation of the sketch lasts: the top list covers the last 5 to 10 minutes.
const TOP_GENERATION: Duration = Duration::from_secs(300);
/// The longest identity value kept (longer ones are cut, marked with `…`).
const MAX_VALUE_CHARS: usize = 200;

/// `value` as the top list keeps it: cut at [`MAX_VALUE_CHARS`], with `…` if it was longer.
fn shown(value: &str) -> String {
    if value.chars().count() <= MAX_VALUE_CHARS {
        return value.to_owned();
    }
    let mut cut: String = value.chars().take(MAX_VALUE_CHARS).collect();
    cut.push('…');
    cut
}

/// A key of the top list: which policy's limiter denied which identity value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Limited {
    policy: String,
    limiter: String,
    value: String,
}

/// What is shown beside it: the limiter's dimension and the rule that denied last.
#[derive(Debug, Clone)]
struct Seen {
    by: String,
    rule: String,
}

struct Top {
    sketch: sketch::Recent<Limited, Seen>,
    rotated: Instant,
}

/// The last configuration load or reload.
#[derive(Debug, Clone)]
struct ReloadStatus {
    /// When the configuration in force was loaded (Unix seconds).
    loaded_at: u64,
    /// The last reload attempt: when, and the error if it was rejected.
    last: Option<(u64, Option<String>)>,
    ok: u64,
    failed: u64,
}

/// The dashboard's state, held by the [`App`].
pub(crate) struct Dashboard {
    enabled: bool,
    top: Mutex<Top>,
    history: Mutex<history::History>,
    reload: Mutex<ReloadStatus>,
    /// The Redis store, for the checks its local over-limit cache answered.
    redis: OnceLock<RedisStore>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Dashboard {
    pub(crate) fn new(enabled: bool) -> Dashboard {
        Dashboard {
            enabled,
            top: Mutex::new(Top {
                sketch: sketch::Recent::new(TOP_CAPACITY),
                rotated: Instant::now(),
            }),
            history: Mutex::new(history::History::default()),
            reload: Mutex::new(ReloadStatus {
                loaded_at: unix_now(),
                last: None,
                ok: 0,
                failed: 0,
            }),
            redis: OnceLock::new(),
        }
    }

    /// Reports the figures `store` keeps of itself from now on.
    pub(crate) fn watch_store(&self, store: &Opened) {
        if let Opened::Redis(redis) = store {
            let _ = self.redis.set(redis.clone());
        }
    }

    /// Checks answered by the Redis store's local over-limit cache; `None` for a store
    /// without one.
    fn local_answers(&self) -> Option<u64> {
        self.redis.get().map(RedisStore::local_denials)
    }

    /// Counts a decision of `policy` (named `name`) for `identity` in the top list if it
    /// was rate limited; costs a comparison otherwise.
    #[inline]
    pub(crate) fn decided(
        &self,
        name: &str,
        policy: &Policy,
        identity: &Identity,
        decision: &Decision,
    ) {
        if self.enabled
            && matches!(
                decision.reason(),
                Reason::RateLimited | Reason::ConcurrencyLimited | Reason::Blocked
            )
        {
            self.limited(name, policy, identity, decision);
        }
    }

    #[cold]
    fn limited(&self, name: &str, policy: &Policy, identity: &Identity, decision: &Decision) {
        let mut found = Vec::new();
        // A ban refuses before any rule: each limiter's identity is shown as banned.
        let banned = decision.reason() == Reason::Blocked;
        for limiter in policy.limiters() {
            let rule = match decision
                .denied_rules(policy)
                .find(|r| &*r.limiter == limiter.name())
            {
                Some(rule) => rule.rule.to_string(),
                None if banned => "banned".to_owned(),
                None => continue,
            };
            let Some(value) = limiter.dimension().value(identity) else {
                continue;
            };
            let value = shown(&value);
            found.push((
                Limited {
                    policy: name.to_owned(),
                    limiter: limiter.name().to_owned(),
                    value,
                },
                Seen {
                    by: limiter.dimension().to_string(),
                    rule,
                },
            ));
        }
        let mut top = lock(&self.top);
        for (key, seen) in found {
            top.sketch.insert(key, seen);
        }
    }

    /// Notes an Envoy request descriptor over its limit: `scope` is the domain's
    /// (`envoy:<domain>`), `path` the configured descriptor that limited it, `entries` the
    /// request's entries (`remote_address=192.0.2.1`), `rule` the rule that denied.
    #[cold]
    pub(crate) fn envoy_limited(&self, scope: &str, path: &str, entries: &str, rule: &str) {
        if !self.enabled {
            return;
        }
        let key = Limited {
            policy: scope.to_owned(),
            limiter: path.to_owned(),
            value: shown(entries),
        };
        let seen = Seen {
            by: "descriptor".to_owned(),
            rule: rule.to_owned(),
        };
        lock(&self.top).sketch.insert(key, seen);
    }

    /// Notes a reload attempt: `Err` carries the rejection.
    pub(crate) fn reloaded(&self, result: Result<(), String>) {
        let mut status = lock(&self.reload);
        let now = unix_now();
        match result {
            Ok(()) => {
                status.loaded_at = now;
                status.ok += 1;
                status.last = Some((now, None));
            }
            Err(e) => {
                status.failed += 1;
                status.last = Some((now, Some(e)));
            }
        }
    }

    /// Takes one reading of the metrics into the history, and starts a new generation of
    /// the top list when the current one is old enough.
    fn sample(&self, metrics: &Metrics) {
        let reading = exposition::read(&metrics.render());
        lock(&self.history).record(unix_now(), reading);
        let mut top = lock(&self.top);
        if top.rotated.elapsed() >= TOP_GENERATION {
            top.sketch.rotate();
            top.rotated = Instant::now();
        }
    }
}

/// Starts the once-a-second sampler of `app`'s metrics, when the dashboard is on. It ends
/// when the app is dropped.
pub(crate) fn spawn_sampler(app: &Arc<App>) {
    if !app.dashboard.enabled {
        return;
    }
    let weak = Arc::downgrade(app);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(app) = weak.upgrade() else { return };
            app.dashboard.sample(&app.metrics);
        }
    });
}

/// The dashboard's routes, none when it is off (then `/` and `/v1/stats` answer 404 like
/// any unknown path).
pub(crate) fn routes(app: &App) -> Router<Arc<App>> {
    if !app.dashboard.enabled {
        return Router::new();
    }
    Router::new()
        .route("/", get(handlers::page))
        .route("/dashboard.js", get(handlers::script))
        .route("/dashboard.css", get(handlers::style))
        .route("/v1/stats", get(handlers::stats))
        .route("/v1/stats/top", get(handlers::top))
}
