//! What the server observed lately, for whoever shows it (the dashboard, `/v1/stats`): the
//! top limited identities, the last 15 minutes of its own metrics, the last configuration
//! reload, and the Redis store's own figures. Front ends report into it; none is named here.
//!
//! What the request path pays: nothing for the history (a sampler reads the Prometheus
//! exposition once a second, as a scraper would) and, for a rate-limited decision only, one
//! lock to count the identity in a bounded sketch. Nothing is kept when nothing shows it
//! (`server.dashboard` off).
//!
//! # Layout
//! - `sketch`: the Space-Saving sketch of the top limited identities, over two generations.
//! - `exposition`: reading the server's own metrics text; latency quantiles from histograms.
//! - `history`: the last 15 minutes, one bucket per second.

pub(crate) mod exposition;
pub(crate) mod history;
mod sketch;

use std::{
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use tollgate::{Decision, Identity, Policy, Reason};
use tollgate_redis::RedisStore;

use crate::{app::App, metrics::Metrics, store::Opened};

/// How many identities each generation of the sketch holds.
pub(crate) const TOP_CAPACITY: usize = 128;
/// How long a generation of the sketch lasts: the top list covers the last 5 to 10 minutes.
pub(crate) const TOP_GENERATION: Duration = Duration::from_secs(300);
/// The longest identity value kept (longer ones are cut, marked with `…`).
const MAX_VALUE_CHARS: usize = 200;

/// `value` as the top list keeps it: cut at [`MAX_VALUE_CHARS`], with `…` if it was longer.
pub(crate) fn shown(value: &str) -> String {
    if value.chars().count() <= MAX_VALUE_CHARS {
        return value.to_owned();
    }
    let mut cut: String = value.chars().take(MAX_VALUE_CHARS).collect();
    cut.push('…');
    cut
}

/// A key of the top list: which policy's limiter denied which identity value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Limited {
    pub(crate) policy: String,
    pub(crate) limiter: String,
    pub(crate) value: String,
}

/// What is shown beside it: the limiter's dimension and the rule that denied last.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) by: String,
    pub(crate) rule: String,
}

pub(crate) struct Top {
    pub(crate) sketch: sketch::Recent<Limited, Seen>,
    rotated: Instant,
}

/// The last configuration load or reload.
#[derive(Debug, Clone)]
pub(crate) struct ReloadStatus {
    /// When the configuration in force was loaded (Unix seconds).
    pub(crate) loaded_at: u64,
    /// The last reload attempt: when, and the error if it was rejected.
    pub(crate) last: Option<(u64, Option<String>)>,
    pub(crate) ok: u64,
    pub(crate) failed: u64,
}

/// What the server observed lately, held by the [`App`].
pub(crate) struct Observed {
    /// Something shows it: observations are kept.
    pub(crate) enabled: bool,
    pub(crate) top: Mutex<Top>,
    pub(crate) history: Mutex<history::History>,
    pub(crate) reload: Mutex<ReloadStatus>,
    /// The Redis store, for the checks its local over-limit cache answered.
    redis: OnceLock<RedisStore>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Observed {
    pub(crate) fn new(enabled: bool) -> Observed {
        Observed {
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
    pub(crate) fn local_answers(&self) -> Option<u64> {
        self.redis.get().map(RedisStore::local_denials)
    }

    /// The Redis store's quota leases and the identities leased now (at most `at_most`, most
    /// units first); `None` on the memory store.
    pub(crate) fn leases(
        &self,
        at_most: usize,
    ) -> Option<(tollgate_redis::LeaseStats, Vec<tollgate_redis::LeasedKey>)> {
        self.redis
            .get()
            .map(|store| (store.leases(), store.leased_keys(at_most)))
    }

    /// The Redis store's repairs after a failover; `None` on the memory store.
    pub(crate) fn repairs(&self) -> Option<tollgate_redis::Repairs> {
        self.redis.get().map(RedisStore::repairs)
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
        // An override's path holds the request's own entries: cut as they are.
        let key = Limited {
            policy: scope.to_owned(),
            limiter: shown(path),
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

/// Starts the once-a-second sampler of `app`'s metrics, when something shows them. It ends
/// when the app is dropped.
pub(crate) fn spawn_sampler(app: &Arc<App>) {
    if !app.observed.enabled {
        return;
    }
    let weak = Arc::downgrade(app);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(app) = weak.upgrade() else { return };
            app.observed.sample(&app.metrics);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a request names (an override's path holds its entries) is kept cut short: the
    /// top list holds its slots' text for minutes.
    #[test]
    fn a_denied_descriptor_is_kept_cut_short() {
        let observed = Observed::new(true);
        let long = "v".repeat(100_000);
        observed.envoy_limited("envoy:edge", &format!("key={long}"), &long, "1/1m");
        let top = lock(&observed.top).sketch.top(1);
        let key = &top[0].key;
        assert!(
            key.limiter.chars().count() <= MAX_VALUE_CHARS + 1,
            "{}",
            key.limiter.len()
        );
        assert!(key.value.chars().count() <= MAX_VALUE_CHARS + 1);
    }
}
