//! Prometheus metrics: decisions by policy and reason, store latency and errors, blocklist
//! size, configuration reloads.

use std::{
    collections::HashSet,
    future::Future,
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tollgate::{MemoryStore, RuleDecision};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    policy: String,
    reason: &'static str,
    allowed: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowLabels {
    policy: String,
    limiter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// How long a blocklist count serves scrapes. Scrapes are unauthenticated and may come from
/// anyone, and a count may have to walk an in-process store: at most one per second does.
const BAN_COUNT_FRESH: Duration = Duration::from_secs(1);

/// A scrape costs time in proportion to the series (10,000 Envoy descriptor keys make
/// megabytes of text), and anyone who reaches the port may scrape. An exposition of at least
/// this many bytes is served again to scrapes until renders would have taken a tenth of the
/// time since the last began (see `RENDER_SHARE`); a smaller one, rendered in well under a
/// millisecond, is rendered per scrape (always current). A size, not a time: whether a scrape
/// sees the latest counts must not depend on how busy the machine was during the last one.
const CACHED_FROM_BYTES: usize = 64 << 10;
/// Scrapes' renders of a large exposition take at most one part in this of a core, at any
/// scrape rate (the dashboard's sampler renders its own, once a second).
const RENDER_SHARE: u32 = 10;

/// The last exposition served, and what it took to render.
struct Exposition {
    done: Instant,
    took: Duration,
    text: axum::body::Bytes,
}

impl Exposition {
    /// Whether a scrape at `now` gets this exposition again instead of a new one.
    fn serves(&self, now: Instant) -> bool {
        self.text.len() >= CACHED_FROM_BYTES
            && now.saturating_duration_since(self.done) < self.took * (RENDER_SHARE - 1)
    }
}

fn latency_histogram() -> Histogram {
    // 25µs .. ~1.6s: a memory store answers in microseconds, a remote Redis in milliseconds.
    Histogram::new(exponential_buckets(0.000_025, 2.0, 17))
}

/// The server's metrics; cheap to clone.
#[derive(Clone)]
pub(crate) struct Metrics(Arc<Inner>);

/// A log line that is written once a second at most.
#[derive(Default)]
pub(crate) struct OncePerSecond {
    /// The second of the last line written.
    logged: AtomicU64,
    /// Lines not written since.
    unlogged: AtomicU64,
}

impl OncePerSecond {
    /// `Some(lines skipped since the last)` when a line is due now; else counts one skipped.
    pub(crate) fn due(&self) -> Option<u64> {
        let second = epoch().as_secs();
        let last = self.logged.load(Ordering::Relaxed);
        if last < second
            && self
                .logged
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.unlogged.swap(0, Ordering::Relaxed));
        }
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        None
    }
}

pub(crate) fn epoch() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// The most keys remembered as warned in their window (16 bytes each, about 1 MiB).
const MAX_WARNED: usize = 65_536;

struct Inner {
    registry: Registry,
    /// The latency series of checks and peeks, resolved once: the hot path skips the label
    /// look-up.
    check_latency: Histogram,
    peek_latency: Histogram,
    check_errors: Counter,
    decisions: Family<DecisionLabels, Counter>,
    shadow_denials: Family<ShadowLabels, Counter>,
    warnings: Family<ShadowLabels, Counter>,
    waits: Family<PolicyLabels, Counter>,
    wait_seconds: Histogram,
    /// The keys whose warning was logged in their current window.
    warned: Mutex<HashSet<u64>>,
    /// Would-be denials of shadow limiters, logged once a second at most.
    shadow_log: OncePerSecond,
    /// Decisions the store could not make (`store_unavailable`), logged once a second at most.
    unavailable_log: OncePerSecond,
    unavailable: AtomicU64,
    /// When the last of them was made (ms since the epoch; 0: never).
    unavailable_at_ms: AtomicU64,
    store_latency: Family<OpLabels, Histogram, fn() -> Histogram>,
    store_errors: Family<OpLabels, Counter>,
    blocklist_size: Gauge,
    /// When the blocklist gauge was last counted; held while counting, so that concurrent
    /// scrapes wait for one count instead of each making their own.
    blocklist_counted: tokio::sync::Mutex<Option<Instant>>,
    /// The last exposition, while it is large enough to serve again; held while rendering,
    /// so that concurrent scrapes wait for one render instead of each making their own.
    exposition: tokio::sync::Mutex<Option<Exposition>>,
    /// Held while `render` brings the store's counts up to date, so that two renders at once
    /// (a scrape and the dashboard's sampler) add what changed once.
    catching_up: Mutex<()>,
    reloads: Family<ResultLabels, Counter>,
    webhook: Family<ResultLabels, Counter>,
    /// Keys the memory store evicted, brought up to date at every render.
    evictions: Counter,
    memory: OnceLock<MemoryStore>,
    /// The Redis store's repairs after a failover, brought up to date at every render.
    repairs: Counter,
    repaired_keys: Counter,
    /// The Redis store's quota leases, brought up to date at every render.
    leases: LeaseMetrics,
    /// RLQS streams open now.
    rlqs_streams: Gauge,
    rlqs_bucket_bytes: Gauge,
    /// RLQS bucket actions sent, by kind.
    rlqs_actions: Family<ActionLabels, Counter>,
    redis: OnceLock<tollgate_redis::RedisStore>,
    /// The reference service's statistics of YAML domains' descriptors.
    descriptors: crate::envoy::stats::DescriptorStats,
    /// The traffic record's lines by result.
    record: crate::record::Counts,
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tollgate");
        let decisions = Family::<DecisionLabels, Counter>::default();
        let shadow_denials = Family::<ShadowLabels, Counter>::default();
        let warnings = Family::<ShadowLabels, Counter>::default();
        let waits = Family::<PolicyLabels, Counter>::default();
        let wait_seconds = latency_histogram();
        let store_latency = Family::<OpLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let store_errors = Family::<OpLabels, Counter>::default();
        let blocklist_size = Gauge::default();
        let reloads = Family::<ResultLabels, Counter>::default();
        let webhook = Family::<ResultLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Warnings posted to the webhook ([webhook]), by result: delivered, failed (an error, a status outside 2xx, a timeout) or dropped (the queue was full)",
            webhook.clone(),
        );
        registry.register(
            "decisions",
            "Rate-limit decisions by policy (envoy:<domain> for gRPC) and reason",
            decisions.clone(),
        );
        registry.register(
            "shadow_denials",
            "Requests a shadow limiter (or Envoy shadow descriptor) would have denied, by policy and limiter; they were admitted",
            shadow_denials.clone(),
        );
        registry.register(
            "warnings",
            "Admitted requests that brought a rule of a warning limiter (`warn_at`) to its warning, by policy and limiter",
            warnings.clone(),
        );
        registry.register(
            "waits",
            "Admissions of checks with max_delay_ms whose units are due later (the caller waits), by policy",
            waits.clone(),
        );
        registry.register(
            "wait_seconds",
            "How long admissions that wait for their units are told to wait",
            wait_seconds.clone(),
        );
        registry.register(
            "store_latency_seconds",
            "Time spent in store operations, by operation",
            store_latency.clone(),
        );
        registry.register(
            "store_errors",
            "Store operations that failed (timeouts, unreachable store), by operation",
            store_errors.clone(),
        );
        registry.register(
            "blocklist_entries",
            "Active bans (IPs and user ids), counted at most once a second",
            blocklist_size.clone(),
        );
        registry.register(
            "config_reloads",
            "Configuration reloads by result (ok or error)",
            reloads.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "build_info",
            "The running tollgate: always 1, with its version as a label",
            build_info,
        );
        let evictions = Counter::default();
        registry.register(
            "memory_store_evictions",
            "Keys the memory store evicted to make room for new ones (an evicted key forgets its count)",
            evictions.clone(),
        );
        let repairs = Counter::default();
        registry.register(
            "redis_repairs",
            "Repairs after a failover this instance ran ([store] repair): each writes back what its recent admissions wrote where Redis lost it",
            repairs.clone(),
        );
        let repaired_keys = Counter::default();
        registry.register(
            "redis_repaired_keys",
            "State keys a repair after a failover found behind and wrote again",
            repaired_keys.clone(),
        );
        let leases = LeaseMetrics::register(&mut registry);
        let rlqs_streams = Gauge::default();
        registry.register(
            "rlqs_streams",
            "Envoy rate-limit quota service (RLQS) streams open now",
            rlqs_streams.clone(),
        );
        let rlqs_bucket_bytes = Gauge::default();
        registry.register(
            "rlqs_bucket_bytes",
            "Bytes the RLQS streams' buckets are charged together, against server.max_rlqs_bucket_bytes",
            rlqs_bucket_bytes.clone(),
        );
        let rlqs_actions = Family::<ActionLabels, Counter>::default();
        registry.register(
            "rlqs_actions",
            "RLQS bucket actions sent, by action: token_bucket (an assignment charged to the store), deny_all (nothing left, or the store failing with on_error deny), allow_all (the store failing with on_error allow), abandon (a bucket nothing serves, or a new one past the stream's 10,000 or server.max_rlqs_bucket_bytes)",
            rlqs_actions.clone(),
        );
        let descriptors = crate::envoy::stats::DescriptorStats::default();
        registry.register(
            "envoy_descriptor_hits",
            "Hits of the descriptors of Envoy YAML domains, as Envoy's reference service counts them: by domain, statistics key (the YAML's values, or the request's with detailed_metric or value_to_metric; at most envoy.max_stat_keys keys, the rest under (other)) and kind (total_hits, within_limit, near_limit, over_limit, shadow_mode)",
            descriptors.family(),
        );
        registry.register(
            "envoy_domain_not_found",
            "Envoy requests for a domain that is not configured (answered OK), by domain (at most envoy.max_stat_keys domains, the rest under (other))",
            descriptors.not_found_family(),
        );
        registry.register(
            "envoy_global_shadow_mode",
            "Envoy requests over their limits that the reference's SHADOW_MODE (envoy.shadow) answered OK",
            descriptors.global_shadow(),
        );
        let record_lines = Family::<ResultLabels, Counter>::default();
        registry.register(
            "record_lines",
            "Lines of the traffic record ([record]) by result: written, dropped (the writer's queue was full; the check went on) or failed (the file could not be written)",
            record_lines.clone(),
        );
        // One at a time: a series' guard holds the family's lock.
        let written = record_lines
            .get_or_create(&ResultLabels { result: "written" })
            .clone();
        let dropped = record_lines
            .get_or_create(&ResultLabels { result: "dropped" })
            .clone();
        let failed = record_lines
            .get_or_create(&ResultLabels { result: "failed" })
            .clone();
        let record = crate::record::Counts {
            written,
            dropped,
            failed,
        };
        // Present from the start, so dashboards and alerts see 0 rather than no series.
        let check_errors = store_errors
            .get_or_create(&OpLabels { op: "check" })
            .clone();
        let check_latency = store_latency
            .get_or_create(&OpLabels { op: "check" })
            .clone();
        let peek_latency = store_latency
            .get_or_create(&OpLabels { op: "peek" })
            .clone();
        Metrics(Arc::new(Inner {
            registry,
            check_latency,
            peek_latency,
            check_errors,
            decisions,
            store_latency,
            store_errors,
            blocklist_size,
            blocklist_counted: tokio::sync::Mutex::new(None),
            exposition: tokio::sync::Mutex::new(None),
            catching_up: Mutex::new(()),
            reloads,
            webhook,
            evictions,
            memory: OnceLock::new(),
            repairs,
            repaired_keys,
            leases,
            rlqs_streams,
            rlqs_bucket_bytes,
            rlqs_actions,
            redis: OnceLock::new(),
            descriptors,
            record,
            shadow_denials,
            warnings,
            waits,
            wait_seconds,
            warned: Mutex::default(),
            shadow_log: OncePerSecond::default(),
            unavailable_log: OncePerSecond::default(),
            unavailable: AtomicU64::new(0),
            unavailable_at_ms: AtomicU64::new(0),
        }))
    }

    /// The traffic record's counters.
    pub(crate) fn record_counts(&self) -> crate::record::Counts {
        self.0.record.clone()
    }

    /// Counts a decision of `policy`, through `handles` (the policy's own, filled on first
    /// use of each reason, so later decisions skip the label look-up).
    pub(crate) fn decision(
        &self,
        handles: &DecisionHandles,
        policy: &str,
        reason: tollgate::Reason,
        allowed: bool,
    ) {
        match DecisionHandles::slot(reason, allowed) {
            Some(slot) => handles.0[slot]
                .get_or_init(|| self.decision_counter(policy, reason, allowed))
                .inc(),
            None => self.decision_counter(policy, reason, allowed).inc(),
        };
        if reason == tollgate::Reason::StoreUnavailable {
            self.store_unavailable(policy, allowed);
        }
    }

    /// A decision the store could not make: counted, and logged once a second at most (failing
    /// open is never silent).
    #[cold]
    fn store_unavailable(&self, policy: &str, allowed: bool) {
        let now_ms = epoch().as_millis();
        self.0.unavailable.fetch_add(1, Ordering::Relaxed);
        self.0
            .unavailable_at_ms
            .store(u64::try_from(now_ms).unwrap_or(u64::MAX), Ordering::Relaxed);
        if let Some(unlogged) = self.0.unavailable_log.due() {
            let answer = if allowed {
                "admitted (failed open)"
            } else {
                "denied (failed closed)"
            };
            tracing::warn!(
                policy,
                unlogged,
                "the store could not decide; on_error {answer}; `unlogged`: others since the last such line"
            );
        }
    }

    /// How many decisions the store could not make since start, and how long ago the last was.
    pub(crate) fn unavailable(&self) -> (u64, Option<Duration>) {
        let at = self.0.unavailable_at_ms.load(Ordering::Relaxed);
        let ago = (at > 0).then(|| {
            Duration::from_millis(
                u64::try_from(epoch().as_millis())
                    .unwrap_or(u64::MAX)
                    .saturating_sub(at),
            )
        });
        (self.0.unavailable.load(Ordering::Relaxed), ago)
    }

    fn decision_counter(&self, policy: &str, reason: tollgate::Reason, allowed: bool) -> Counter {
        self.0
            .decisions
            .get_or_create(&DecisionLabels {
                policy: policy.to_owned(),
                reason: reason.as_str(),
                allowed: if allowed { "true" } else { "false" },
            })
            .clone()
    }

    /// Counts a request that `limiter` of `policy`, in shadow mode, would have denied (it was
    /// admitted), and logs it: one line a second at most, saying how many went unlogged.
    pub(crate) fn shadow_denied(&self, policy: &str, limiter: &str) {
        self.0
            .shadow_denials
            .get_or_create(&ShadowLabels {
                policy: policy.to_owned(),
                limiter: limiter.to_owned(),
            })
            .inc();
        if let Some(unlogged) = self.0.shadow_log.due() {
            tracing::info!(
                policy,
                limiter,
                unlogged,
                "shadow limit would have denied a request (admitted); `unlogged`: others since the last such line"
            );
        }
    }

    /// Counts an admission of `policy` told to wait `due` for its units.
    pub(crate) fn waited(&self, policy: &str, due: Duration) {
        self.0
            .waits
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .inc();
        self.0.wait_seconds.observe(due.as_secs_f64());
    }

    /// Counts a delivery to the warning webhook by its result.
    pub(crate) fn webhook(&self, result: &'static str) {
        self.0.webhook.get_or_create(&ResultLabels { result }).inc();
    }

    /// Counts an admission that brought `rule` of `limiter` of `policy` to its warning, and
    /// logs it once per key (`key`: a hash of the policy, limiter, rule and identity value) and
    /// window (`window`: a number that changes when the rule's window does); true the first
    /// time in the window (when it was logged).
    pub(crate) fn warned(
        &self,
        policy: &str,
        limiter: &str,
        rule: &RuleDecision,
        rule_text: &str,
        key: u64,
        window: u64,
    ) -> bool {
        self.0
            .warnings
            .get_or_create(&ShadowLabels {
                policy: policy.to_owned(),
                limiter: limiter.to_owned(),
            })
            .inc();
        let once = key ^ window.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        {
            let mut warned = self.0.warned.lock().unwrap_or_else(PoisonError::into_inner);
            if warned.len() >= MAX_WARNED {
                // Bounded: a key may then be logged twice in a window, never more often
                // than its warnings come.
                warned.clear();
            }
            if !warned.insert(once) {
                return false;
            }
        }
        tracing::warn!(
            policy,
            limiter,
            rule = rule_text,
            remaining = rule.remaining,
            key = format_args!("{key:016x}"),
            "a rule reached its warning (logged once per key and window; `key` is a hash of the identity)"
        );
        true
    }

    /// Records one store operation; `failed` counts it as a store error.
    pub(crate) fn store_call(&self, op: &'static str, took: Duration, failed: bool) {
        match op {
            "check" => {
                self.0.check_latency.observe(took.as_secs_f64());
                if failed {
                    self.0.check_errors.inc();
                }
                return;
            }
            "peek" if !failed => {
                self.0.peek_latency.observe(took.as_secs_f64());
                return;
            }
            _ => {}
        }
        let labels = OpLabels { op };
        self.0
            .store_latency
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if failed {
            self.0.store_errors.get_or_create(&labels).inc();
        }
    }

    /// Sets the blocklist gauge from `count` (the store's ban count), unless it was counted
    /// less than a second ago. A failed count leaves the gauge as it was, to be tried again
    /// at the next scrape.
    pub(crate) async fn refresh_blocklist_size<F, Fut, E>(&self, count: F)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<u64, E>>,
    {
        let mut counted = self.0.blocklist_counted.lock().await;
        if counted.is_some_and(|at| at.elapsed() < BAN_COUNT_FRESH) {
            return;
        }
        if let Ok(size) = count().await {
            self.0
                .blocklist_size
                .set(i64::try_from(size).unwrap_or(i64::MAX));
            *counted = Some(Instant::now());
        }
    }

    pub(crate) fn reload(&self, ok: bool) {
        self.0
            .reloads
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    /// An RLQS stream opened (`1`) or ended (`-1`).
    pub(crate) fn rlqs_stream(&self, change: i64) {
        self.0.rlqs_streams.inc_by(change);
    }

    /// Bytes charged to (or, negative, given back by) the RLQS streams' buckets.
    pub(crate) fn rlqs_bucket_bytes(&self, change: i64) {
        self.0.rlqs_bucket_bytes.inc_by(change);
    }

    /// An RLQS bucket action sent.
    pub(crate) fn rlqs_action(&self, action: &'static str) {
        self.0
            .rlqs_actions
            .get_or_create(&ActionLabels { action })
            .inc();
    }

    /// The Prometheus text exposition.
    /// The statistics of YAML domains' descriptors.
    pub(crate) fn descriptors(&self) -> &crate::envoy::stats::DescriptorStats {
        &self.0.descriptors
    }

    /// Reports the evictions of `store` (the server's memory store) from now on.
    pub(crate) fn watch_memory_store(&self, store: MemoryStore) {
        let _ = self.0.memory.set(store);
    }

    /// Reports the repairs of `store` (the server's Redis store) from now on.
    pub(crate) fn watch_redis_store(&self, store: tollgate_redis::RedisStore) {
        let _ = self.0.redis.set(store);
    }

    /// The exposition a scrape is answered with: rendered now, or, when it is large, the last
    /// one while renders would otherwise take more than a tenth of a core (see
    /// [`CACHED_FROM_BYTES`]). One render at a time: scrapes that arrive during one wait for
    /// it.
    pub(crate) async fn exposition(&self) -> axum::body::Bytes {
        let mut last = self.0.exposition.lock().await;
        if let Some(last) = last.as_ref().filter(|e| e.serves(Instant::now())) {
            return last.text.clone();
        }
        let started = Instant::now();
        let text = axum::body::Bytes::from(self.render());
        let done = Instant::now();
        let rendered = Exposition {
            done,
            took: done - started,
            text: text.clone(),
        };
        *last = (text.len() >= CACHED_FROM_BYTES).then_some(rendered);
        text
    }

    pub(crate) fn render(&self) -> String {
        let catching_up = self
            .0
            .catching_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(memory) = self.0.memory.get() {
            let (now, seen) = (memory.evictions(), self.0.evictions.get());
            self.0.evictions.inc_by(now.saturating_sub(seen));
        }
        if let Some(redis) = self.0.redis.get() {
            let now = redis.repairs();
            let (runs, keys) = (&self.0.repairs, &self.0.repaired_keys);
            runs.inc_by(now.runs.saturating_sub(runs.get()));
            keys.inc_by(now.keys_rewritten.saturating_sub(keys.get()));
            self.0.leases.update(redis.leases());
        }
        drop(catching_up);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.0.registry);
        out
    }
}

/// The Redis store's quota leases (see `tollgate::QuotaLease`).
#[derive(Debug, Default)]
struct LeaseMetrics {
    calls: Counter,
    local: Counter,
    returned: Counter,
    outstanding: Gauge,
    keys: Gauge,
}

impl LeaseMetrics {
    fn register(registry: &mut Registry) -> LeaseMetrics {
        let m = LeaseMetrics::default();
        registry.register(
            "redis_lease_calls",
            "Checks of leased policies that asked Redis for a lease (one call each, one per slot on a Cluster)",
            m.calls.clone(),
        );
        registry.register(
            "redis_lease_local_admissions",
            "Checks of leased policies admitted from a lease in hand, without a call to Redis",
            m.local.clone(),
        );
        registry.register(
            "redis_lease_returned_units",
            "Units leases gave back unspent (by refund) when they ended",
            m.returned.clone(),
        );
        registry.register(
            "redis_lease_outstanding_units",
            "Units this instance holds in leases now, taken from Redis and not yet spent or given back",
            m.outstanding.clone(),
        );
        registry.register(
            "redis_leased_keys",
            "Identities this instance holds a lease for now",
            m.keys.clone(),
        );
        m
    }

    fn update(&self, now: tollgate_redis::LeaseStats) {
        self.calls
            .inc_by(now.calls.saturating_sub(self.calls.get()));
        let local = now.local_admissions.saturating_sub(self.local.get());
        self.local.inc_by(local);
        let returned = now.units_returned.saturating_sub(self.returned.get());
        self.returned.inc_by(returned);
        self.outstanding
            .set(i64::try_from(now.units_outstanding).unwrap_or(i64::MAX));
        self.keys
            .set(i64::try_from(now.leased_keys).unwrap_or(i64::MAX));
    }
}

/// The decision counters of one policy (or Envoy domain), one per (reason, allowed), each
/// resolved from the metric family on first use. A policy's entry holds them, so a reload,
/// which builds new entries, resolves them again: the series themselves carry on.
#[derive(Debug, Default)]
pub(crate) struct DecisionHandles([OnceLock<Counter>; 14]);

impl DecisionHandles {
    fn slot(reason: tollgate::Reason, allowed: bool) -> Option<usize> {
        use tollgate::Reason;
        let r = match reason {
            Reason::Ok => 0,
            Reason::RateLimited => 1,
            Reason::Blocked => 2,
            Reason::Bypassed => 3,
            Reason::StoreUnavailable => 4,
            Reason::CostExceedsLimit => 5,
            Reason::ConcurrencyLimited => 6,
            _ => return None,
        };
        Some(r * 2 + usize::from(allowed))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn every_reason_has_a_decision_handle_of_its_own() {
        use tollgate::Reason;
        let reasons = [
            Reason::Ok,
            Reason::RateLimited,
            Reason::Blocked,
            Reason::Bypassed,
            Reason::StoreUnavailable,
            Reason::CostExceedsLimit,
            Reason::ConcurrencyLimited,
        ];
        let mut slots: Vec<usize> = reasons
            .iter()
            .flat_map(|&r| [true, false].map(|allowed| DecisionHandles::slot(r, allowed)))
            .map(|slot| slot.expect("a cached handle"))
            .collect();
        assert!(
            slots
                .iter()
                .all(|&s| s < DecisionHandles::default().0.len())
        );
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), 2 * reasons.len(), "two reasons share a handle");
    }

    #[tokio::test]
    async fn memory_store_evictions_are_counted() {
        use tollgate::{Dimension, Identity, Limiter, Policy, Tollgate};
        let metrics = Metrics::new();
        assert!(
            metrics
                .render()
                .contains("tollgate_memory_store_evictions_total 0")
        );
        let store = MemoryStore::builder()
            .shards(1)
            .max_keys(2)
            .purge_interval(None)
            .build();
        metrics.watch_memory_store(store.clone());
        let gate = Tollgate::new(store);
        let policy = Policy::builder("p")
            .limiter(Limiter::new(Dimension::UserId, ["5/1m".parse().unwrap()]))
            .build()
            .unwrap();
        for user in ["a", "b", "c", "d", "e"] {
            let who = Identity::new().with_user_id(user);
            assert!(gate.check(&policy, &who, 1).await.unwrap().allowed());
        }
        // Five keys in room for two: three evicted, each counted once over two scrapes.
        assert!(
            metrics
                .render()
                .contains("tollgate_memory_store_evictions_total 3")
        );
        assert!(
            metrics
                .render()
                .contains("tollgate_memory_store_evictions_total 3")
        );
    }

    #[test]
    fn the_build_is_named() {
        let text = Metrics::new().render();
        let line = format!(
            "tollgate_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&line), "{text}");
    }

    #[tokio::test]
    async fn the_blocklist_count_serves_scrapes_for_a_second() {
        let metrics = Metrics::new();
        let counts = AtomicU64::new(0);
        let count = || async { Ok::<u64, ()>(counts.fetch_add(1, Ordering::SeqCst) + 7) };
        metrics.refresh_blocklist_size(count).await;
        metrics.refresh_blocklist_size(count).await;
        assert_eq!(counts.load(Ordering::SeqCst), 1, "counted once");
        assert!(metrics.render().contains("tollgate_blocklist_entries 7"));

        // A failed count leaves the gauge and is tried again at the next scrape.
        let fresh = Metrics::new();
        fresh.refresh_blocklist_size(|| async { Err(()) }).await;
        fresh.refresh_blocklist_size(count).await;
        assert_eq!(counts.load(Ordering::SeqCst), 2);
        assert!(fresh.render().contains("tollgate_blocklist_entries 8"));
    }

    /// A small exposition is never served again; a large one is, until renders would have
    /// taken a tenth of the time since it began.
    #[test]
    fn only_a_large_exposition_serves_again_and_only_for_nine_times_its_cost() {
        let done = Instant::now();
        let after = |ms| done + Duration::from_millis(ms);
        let exposition = |bytes| Exposition {
            done,
            took: Duration::from_millis(5),
            text: axum::body::Bytes::from(vec![b'#'; bytes]),
        };
        let small = exposition(CACHED_FROM_BYTES - 1);
        assert!(!small.serves(done));
        let large = exposition(CACHED_FROM_BYTES);
        assert!(large.serves(done));
        assert!(large.serves(after(44)));
        assert!(!large.serves(after(45)));
        assert!(!large.serves(after(1_000)));
    }

    #[tokio::test]
    async fn a_scrape_renders_unless_the_last_exposition_serves() {
        let metrics = Metrics::new();
        metrics.reload(true);
        let text = metrics.exposition().await;
        let line = "tollgate_config_reloads_total{result=\"ok\"}";
        assert!(
            std::str::from_utf8(&text)
                .unwrap()
                .contains(&format!("{line} 1"))
        );
        assert!(
            metrics.0.exposition.lock().await.is_none(),
            "a small exposition is not kept"
        );

        // The last exposition as a large one would be (its size and cost set here).
        let metrics = &metrics;
        let keep = |took| async move {
            let large = axum::body::Bytes::from(vec![b'#'; CACHED_FROM_BYTES]);
            *metrics.0.exposition.lock().await = Some(Exposition {
                done: Instant::now(),
                took,
                text: large.clone(),
            });
            large
        };
        metrics.reload(true);
        let large = keep(Duration::from_secs(3_600)).await;
        assert_eq!(
            metrics.exposition().await,
            large,
            "it serves the next scrape"
        );

        keep(Duration::ZERO).await;
        let now = metrics.exposition().await;
        assert!(
            std::str::from_utf8(&now)
                .unwrap()
                .contains(&format!("{line} 2"))
        );
    }
}
