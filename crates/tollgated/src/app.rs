//! The shared state of a running server, and configuration reload.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use arc_swap::{ArcSwap, Guard};
use tollgate::{AnyStore, Reason, Tollgate};

use crate::{
    auth::{Auth, Tokens},
    config::{Config, ConfigError, Source},
    metrics::{DecisionHandles, Metrics},
    observed::Observed,
    receipt::ReceiptKey,
};

/// What every handler shares: the engine (and so the store, kept across reloads), the
/// current configuration (swapped whole on reload), metrics and admin authentication.
pub(crate) struct App {
    pub(crate) gate: Tollgate<AnyStore>,
    config: ArcSwap<Config>,
    pub(crate) metrics: Metrics,
    pub(crate) auth: Auth,
    /// Seals the receipts and leases callers are given.
    pub(crate) receipts: ReceiptKey,
    pub(crate) observed: Observed,
    source: Source,
    /// Shutdown has begun: `/healthcheck` fails so load balancers stop sending.
    draining: AtomicBool,
    /// How the Redis store keeps its counters across a restart, as last read.
    persistence: Mutex<Option<tollgate_redis::Persistence>>,
    /// Writes what the server decided (`[record]`), when asked to.
    pub(crate) recorder: Option<crate::record::Recorder>,
    /// Posts warnings (`[webhook]`), when asked to.
    pub(crate) webhook: Option<crate::webhook::Webhook>,
}

impl App {
    pub(crate) fn new(
        gate: Tollgate<AnyStore>,
        config: Config,
        metrics: Metrics,
        tokens: &Tokens,
        receipts: ReceiptKey,
        source: Source,
    ) -> App {
        let auth = Auth::new(tokens, config.server.admin_failure_limit);
        let observed = Observed::new(config.server.dashboard_enabled());
        App {
            gate,
            config: ArcSwap::from_pointee(config),
            metrics,
            auth,
            receipts,
            observed,
            source,
            draining: AtomicBool::new(false),
            persistence: Mutex::new(None),
            recorder: None,
            webhook: None,
        }
    }

    /// The same state, posting warnings to `webhook`.
    pub(crate) fn with_webhook(mut self, webhook: Option<crate::webhook::Webhook>) -> App {
        self.webhook = webhook;
        self
    }

    /// The same state, recording what it decides with `recorder`.
    pub(crate) fn with_recorder(mut self, recorder: Option<crate::record::Recorder>) -> App {
        self.recorder = recorder;
        self
    }

    /// How the Redis store keeps its counters across a restart, as last read (see
    /// `watch_persistence`); `None` for the memory store, or before it was read.
    pub(crate) fn persistence(&self) -> Option<tollgate_redis::Persistence> {
        *self
            .persistence
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How the Redis store keeps its counters across a restart, and the windows of a day or
    /// longer that would start again if it keeps nothing (`/readyz` and the dashboard show
    /// it); `None` until read, and for the memory store.
    pub(crate) fn persistence_report(&self) -> Option<serde_json::Value> {
        let persistence = self.persistence()?;
        let at_risk = match persistence.survives_restart() {
            Some(true) => Vec::new(),
            _ => self.config().long_windows(),
        };
        Some(serde_json::json!({
            "aof": persistence.aof,
            "rdb": persistence.rdb,
            "survives_restart": persistence.survives_restart(),
            "long_windows_at_risk": at_risk,
        }))
    }

    /// Reads how the Redis store keeps its counters once it answers (a store unreachable at
    /// start, once it is reached), and again every minute (a failover may bring a primary set
    /// up otherwise); logs when the windows of a day or longer the configuration holds would
    /// start again after a restart, each time that changes.
    pub(crate) async fn watch_persistence(&self, opened: &crate::store::Opened) {
        let mut said = None;
        loop {
            let read = match opened.redis() {
                Some(redis) => redis.persistence().await.ok(),
                None => None,
            };
            if let Some(persistence) = read {
                *self
                    .persistence
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(persistence);
                let survives = persistence.survives_restart();
                if said != Some(survives) {
                    said = Some(survives);
                    self.say_persistence(survives);
                }
            }
            let wait = if said.is_some() { 60 } else { 5 };
            tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
        }
    }

    /// Logs what a store that survives a restart (or not, or does not say) means for the
    /// configuration's long windows.
    fn say_persistence(&self, survives: Option<bool>) {
        let long = self.config().long_windows();
        if long.is_empty() {
            return;
        }
        match survives {
            Some(true) => tracing::info!(
                policies = %long.join(", "),
                "the Redis store keeps its data across a restart: these windows of a day or \
                 longer keep their counts"
            ),
            Some(false) => tracing::warn!(
                policies = %long.join(", "),
                "the Redis store keeps nothing across a restart (no append-only file, no RDB \
                 snapshots): these windows of a day or longer start again, their quotas given \
                 in full, whenever it restarts"
            ),
            None => tracing::info!(
                policies = %long.join(", "),
                "the Redis store does not say whether it keeps its data across a restart \
                 (CONFIG refused): these windows of a day or longer need it to"
            ),
        }
    }

    /// Where the configuration comes from.
    pub(crate) fn source(&self) -> &Source {
        &self.source
    }

    /// Marks the server as shutting down.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether shutdown has begun.
    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The configuration in force now, without touching its reference count (hold the
    /// guard briefly: clone what must outlive it).
    pub(crate) fn config(&self) -> Guard<Arc<Config>> {
        self.config.load()
    }

    /// The configuration in force now, held for as long as the caller needs it (one
    /// reference count for, say, a whole batch of checks).
    pub(crate) fn config_full(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Reads the file again and, if it is valid, puts it in force at once.
    ///
    /// The store and the engine are kept, so counters of every policy whose scope and
    /// limiter names did not change carry on. Listen addresses, the store URL, its timeout
    /// and key prefix, the traffic record and the webhook need a restart; a change to them is
    /// logged and ignored.
    pub(crate) fn reload(&self) -> Result<(), ConfigError> {
        match Config::load_source(&self.source) {
            Ok(new) => {
                let old = self.config.load();
                if new.server != old.server {
                    tracing::warn!(
                        "[server] changed; its per-request bounds and headers apply now, the rest (listen addresses, tokens, timeouts, connection limits, max_keep_for, max_stored_response) after a restart"
                    );
                }
                if new.store.url != old.store.url
                    || new.store.timeout != old.store.timeout
                    || new.store.prefix != old.store.prefix
                    || new.store.tls_ca_file != old.store.tls_ca_file
                    || new.store.tls_client_cert != old.store.tls_client_cert
                {
                    tracing::warn!(
                        "[store] url, timeout, prefix or TLS files changed; they apply after a restart"
                    );
                }
                if new.record != old.record {
                    tracing::warn!(
                        "[record] changed; the traffic record's settings apply after a restart"
                    );
                }
                if new.webhook != old.webhook {
                    tracing::warn!("[webhook] changed; warnings go where it says after a restart");
                }
                let policies = new.policy_names().collect::<Vec<_>>().join(", ");
                // Swap first, log after: whoever reads the log line may rely on the new
                // configuration being in force.
                self.config.store(Arc::new(new));
                self.metrics.reload(true);
                self.observed.reloaded(Ok(()));
                let path = self
                    .source
                    .path
                    .as_deref()
                    .unwrap_or(std::path::Path::new("(environment)"));
                tracing::info!(path = %path.display(), policies, "configuration reloaded");
                Ok(())
            }
            Err(e) => {
                self.metrics.reload(false);
                self.observed.reloaded(Err(e.to_string()));
                tracing::error!(error = %e, "configuration rejected; the previous one stays in force");
                Err(e)
            }
        }
    }

    /// Records a decision in the metrics; `started` times the store call when there was one.
    pub(crate) fn record(
        &self,
        op: &'static str,
        (handles, policy): (&DecisionHandles, &str),
        reason: Reason,
        allowed: bool,
        started: Instant,
    ) {
        self.record_store_call(op, reason, started);
        self.metrics.decision(handles, policy, reason, allowed);
    }

    /// Records the store call behind a decision with `reason`, if there was one (a bypassed
    /// identity or a cost above every limit is answered without the store).
    pub(crate) fn record_store_call(&self, op: &'static str, reason: Reason, started: Instant) {
        if !matches!(reason, Reason::Bypassed | Reason::CostExceedsLimit) {
            self.metrics
                .store_call(op, started.elapsed(), reason == Reason::StoreUnavailable);
        }
    }
}
