//! Envoy's rate-limit quota service (RLQS, `envoy.service.rate_limit_quota.v3`): Envoys stream
//! usage reports per bucket; the server answers each report with the bucket's assignment.
//!
//! A bucket id that `[[rlqs.buckets]]` or a descriptor of the stream's domain serves
//! (`crate::config::RlqsBuckets`) gets a token bucket: its Envoy's share (by the
//! demand its reports show, against the other Envoys reporting the same bucket here) of the
//! rate the bucket can still sustain to the end of its window (what the store says is left,
//! over the time left), for about two report intervals and never past the window's end.
//! Before the assignment is sent, the store is charged what it can admit at most (a new bucket
//! starts full; one sent again is kept by the data plane, and only its fills in the added time
//! are charged), with one ordinary check of that cost through the engine: every unit any
//! Envoy, through any instance, can admit was admitted by the store first, in the window that
//! counts it, so a fleet never admits more than the rule. When the store has less left than
//! the charge, the assignment is what is left, once; when nothing is left, `DENY_ALL` until the
//! window ends. A failing store is met by `on_error` (`ALLOW_ALL` or `DENY_ALL` for one report
//! interval). A bucket id no bucket serves (never, or no longer after a reload) is abandoned.
//!
//! Memory: a stream keeps at most [`MAX_SUBSCRIPTIONS`] buckets, and all streams together at
//! most `server.max_rlqs_bucket_bytes` of them (each bucket charged [`Subscription::bytes`]):
//! past either, a new bucket id is abandoned, so that clients opening many streams of many ids
//! cannot make the server run out of memory. Each stream drops the buckets its Envoy stopped
//! reporting (quiet for [`QUIET_AFTER_INTERVALS`] of their intervals) as it reports, at most
//! once a second, and at once when it needs room; a stream that ends (or fails) gives its
//! buckets back.
//!
//! Under-admission: what an Envoy was charged and did not use is not given back (its reports
//! say what it used, but a data plane's reports are not the store's count); it is at most the
//! first tokens of each new bucket plus what an Envoy that went quiet still had assigned.
//! What an expired assignment admits is the data plane's own choice
//! (`expired_assignment_behavior`), outside the bound: configure it to deny, or to a fallback
//! the limit allows for.

mod assign;

use std::{
    collections::{BTreeMap, HashMap},
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use envoy_types::pb::{
    envoy::{
        service::rate_limit_quota::v3::{
            BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
            rate_limit_quota_response::{
                BucketAction,
                bucket_action::{AbandonAction, BucketAction as Action, QuotaAssignmentAction},
            },
            rate_limit_quota_service_server::{RateLimitQuotaService, RateLimitQuotaServiceServer},
            rate_limit_quota_usage_reports::BucketQuotaUsage,
        },
        r#type::v3::{
            RateLimitStrategy, TokenBucket as PbTokenBucket,
            rate_limit_strategy::{BlanketRule, Strategy},
        },
    },
    google::protobuf::UInt32Value,
};
use futures_util::Stream;
use tollgate::{Decision, Identity, Policy, Reason};

pub(crate) use self::assign::TokenBucket;
use crate::{app::App, config::Serves, envoy::descriptors::pb_duration};

/// A report interval until an Envoy's reports say what theirs is.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// An assignment lasts this many report intervals, so that one late report does not expire it.
const INTERVALS_COVERED: u32 = 2;
/// An assignment ends this long before its window, for the time it takes to reach the Envoy.
const WINDOW_MARGIN: Duration = Duration::from_millis(20);
/// How long a first assignment lasts, before the Envoy's reports show its demand.
const FIRST_COVERAGE: Duration = Duration::from_millis(100);
/// A token bucket fills about this many times per report interval.
const FILLS_PER_INTERVAL: u32 = 10;
/// An Envoy whose last report is older than this many of its intervals asks for nothing.
const QUIET_AFTER_INTERVALS: u32 = 3;
/// The longest bucket id a report may name, its keys' and values' bytes together.
const MAX_BUCKET_ID_BYTES: usize = 4096;
/// The most buckets one stream keeps: past them, those it has stopped reporting (quiet for
/// [`QUIET_AFTER_INTERVALS`] of their intervals) make room, and a new one is abandoned while
/// none has (the Envoy applies its own `no_assignment_behavior` to it), so that a stream of
/// endless ids holds bounded memory, and ids it once saw do not hold the place of new ones.
const MAX_SUBSCRIPTIONS: usize = 10_000;

/// The gRPC service over the running server's configuration.
pub(crate) fn service(app: Arc<App>) -> RateLimitQuotaServiceServer<Quotas> {
    RateLimitQuotaServiceServer::new(Quotas::new(app))
}

/// Implements `StreamRateLimitQuotas`.
pub(crate) struct Quotas {
    app: Arc<App>,
    shared: Arc<Shared>,
}

/// What the streams share: each bucket's Envoys and their demand, and the memory their
/// buckets take.
#[derive(Default)]
struct Shared {
    next_stream: AtomicU64,
    demands: Mutex<HashMap<BucketKey, HashMap<u64, Demand>>>,
    /// The bytes all streams' buckets are charged (see [`Subscription::bytes`]).
    held: AtomicUsize,
}

/// A served bucket: its configured name and the values of its `*` entries.
type BucketKey = (String, Identity);

/// What one Envoy's reports of a bucket show.
#[derive(Clone, Copy)]
struct Demand {
    /// Requests a second (allowed and denied).
    rate: f64,
    at: Instant,
    interval: Duration,
    /// Its live token bucket, until when: what is charged for it and not yet filled.
    ahead: Option<(TokenBucket, Instant)>,
}

/// One bucket of one stream.
struct Subscription {
    key: BucketKey,
    /// What it is charged against `server.max_rlqs_bucket_bytes` ([`Subscription::bytes`]).
    bytes: usize,
    /// When the Envoy last reported it.
    reported: Instant,
    /// What it was last assigned, until when.
    assigned: Option<(Assigned, Instant)>,
    /// The Envoy's report interval, as its reports show.
    interval: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Assigned {
    Bucket(TokenBucket),
    Blanket(BlanketRule),
}

impl Quotas {
    pub(crate) fn new(app: Arc<App>) -> Quotas {
        Quotas {
            app,
            shared: Arc::default(),
        }
    }
}

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for Quotas {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        crate::grpc::authorize_check(&self.app, &request, "StreamRateLimitQuotas").await?;
        let mut reports = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let stream = Stream_ {
            app: self.app.clone(),
            shared: self.shared.clone(),
            id: self.shared.next_stream.fetch_add(1, Ordering::Relaxed),
            domain: None,
            subscriptions: BTreeMap::new(),
            swept: None,
        };
        tokio::spawn(async move {
            let mut stream = stream;
            stream.app.metrics.rlqs_stream(1);
            loop {
                let report = match reports.message().await {
                    Ok(Some(report)) => report,
                    Ok(None) => break,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                };
                let response = stream.answer(report).await;
                if tx.send(response).await.is_err() {
                    break;
                }
            }
            // Its buckets given back first (see `Drop`), then counted out.
            let app = stream.app.clone();
            drop(stream);
            app.metrics.rlqs_stream(-1);
        });
        let responses = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(tonic::Response::new(Box::pin(responses)))
    }
}

/// One Envoy's stream.
struct Stream_ {
    app: Arc<App>,
    shared: Arc<Shared>,
    id: u64,
    /// The domain of its first report.
    domain: Option<String>,
    /// Its buckets, by id.
    subscriptions: BTreeMap<BTreeMap<String, String>, Subscription>,
    /// When its buckets were last looked over for quiet ones: not again for a default
    /// interval (each look goes over them all).
    swept: Option<Instant>,
}

impl Stream_ {
    /// The actions answering one report.
    async fn answer(
        &mut self,
        report: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, tonic::Status> {
        if self.domain.is_none() {
            if report.domain.is_empty() {
                return Err(tonic::Status::invalid_argument(
                    "the first usage report of a stream names its domain",
                ));
            }
            self.domain = Some(report.domain);
        }
        let mut actions = Vec::with_capacity(report.bucket_quota_usages.len());
        // A bucket named again in one report is answered once: a report repeating one id
        // would otherwise cost the store a look per repeat.
        let mut named = std::collections::HashSet::new();
        for usage in &report.bucket_quota_usages {
            let Some(id) = usage.bucket_id.as_ref() else {
                return Err(tonic::Status::invalid_argument(
                    "a bucket usage report names its bucket_id",
                ));
            };
            let bytes: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
            if bytes > MAX_BUCKET_ID_BYTES {
                return Err(tonic::Status::invalid_argument(format!(
                    "a bucket_id holds at most {MAX_BUCKET_ID_BYTES} bytes of keys and values; this one {bytes}"
                )));
            }
            let sorted: BTreeMap<&String, &String> = id.bucket.iter().collect();
            if !named.insert(sorted) {
                continue;
            }
            let action = self.assign(usage).await;
            self.app.metrics.rlqs_action(action_name(&action));
            actions.push(BucketAction {
                bucket_id: Some(id.clone()),
                bucket_action: Some(action),
            });
        }
        // Quiet buckets go as the stream reports, not only when it needs room: otherwise an
        // Envoy that once reported many ids would keep them charged against every stream's.
        self.drop_quiet();
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// The action for one bucket's usage report.
    async fn assign(&mut self, usage: &BucketQuotaUsage) -> Action {
        let id: BTreeMap<String, String> = usage
            .bucket_id
            .iter()
            .flat_map(|b: &BucketId| b.bucket.iter())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let config = self.app.config_full();
        let domain = self.domain.as_deref().unwrap_or_default();
        let Some((bucket, who)) = config.rlqs.find(&config.envoy, domain, &id) else {
            if let Some(gone) = self.subscriptions.remove(&id) {
                self.shared.forget(&self.app, self.id, &gone);
            }
            return Action::AbandonAction(AbandonAction {});
        };
        let key = (bucket.name.clone(), who);
        if !self.subscriptions.contains_key(&id) {
            let bytes = Subscription::bytes(&id);
            if !self.make_room(bytes, config.server.max_rlqs_bucket_bytes) {
                return Action::AbandonAction(AbandonAction {});
            }
            self.subscriptions.insert(
                id.clone(),
                Subscription {
                    key: key.clone(),
                    bytes,
                    reported: Instant::now(),
                    assigned: None,
                    interval: DEFAULT_INTERVAL,
                },
            );
        }
        let sub = self
            .subscriptions
            .get_mut(&id)
            .expect("the bucket was subscribed above");
        sub.reported = Instant::now();
        if sub.key != key {
            // A reload gave the id to another bucket: it starts over there.
            let old = std::mem::replace(&mut sub.key, key.clone());
            sub.assigned = None;
            if let Some(envoys) = self.shared.lock().get_mut(&old) {
                envoys.remove(&self.id);
            }
        }
        let elapsed = usage
            .time_elapsed
            .and_then(|d| {
                let seconds = u64::try_from(d.seconds).ok()?;
                let nanos = u32::try_from(d.nanos).ok()?;
                Some(Duration::new(seconds, nanos.min(999_999_999)))
            })
            .filter(|d| !d.is_zero());
        if let Some(elapsed) = elapsed {
            // An Envoy reports at once after its first assignment, then every interval: a
            // short gap halves what is expected of the next one, no more.
            sub.interval = elapsed
                .max(sub.interval / 2)
                .clamp(Duration::from_millis(10), Duration::from_secs(60));
        }
        let policy = match &bucket.serves {
            Serves::Quota(policy) => policy,
            Serves::AllowAll => {
                return blanket(
                    sub,
                    BlanketRule::AllowAll,
                    Instant::now() + sub.interval * INTERVALS_COVERED,
                );
            }
            Serves::DenyAll => {
                return blanket(
                    sub,
                    BlanketRule::DenyAll,
                    Instant::now() + sub.interval * INTERVALS_COVERED,
                );
            }
        };
        let asked = (usage.num_requests_allowed).saturating_add(usage.num_requests_denied);
        // Over no less than the shortest interval: a report of a nanosecond claims no more.
        let demand = elapsed.map(|e| asked as f64 / e.max(Duration::from_millis(10)).as_secs_f64());
        let (share, ahead) = self.shared.share(&key, self.id, demand, sub.interval);
        let action = charge(&self.app, policy, &key.1, sub, share, ahead, demand).await;
        let live = match sub.assigned {
            Some((Assigned::Bucket(b), until)) => Some((b, until)),
            _ => None,
        };
        self.shared.assigned(&key, self.id, live);
        action
    }

    /// Whether a new bucket charged `bytes` may be held: within the stream's count and, with
    /// the other streams' buckets, within `max_bytes`; its quiet buckets make room first when
    /// either is reached. The bytes are charged when it may.
    fn make_room(&mut self, bytes: usize, max_bytes: usize) -> bool {
        let fits = |stream: &Stream_| {
            stream.subscriptions.len() < MAX_SUBSCRIPTIONS
                && stream.shared.charge(&stream.app, bytes, max_bytes)
        };
        fits(self) || (self.drop_quiet() && fits(self))
    }

    /// Drops the buckets the Envoy has stopped reporting; false if none has. Once a default
    /// interval at most: new ids arriving while old ones go quiet one by one do not each scan
    /// them all.
    fn drop_quiet(&mut self) -> bool {
        let now = Instant::now();
        if self
            .swept
            .is_some_and(|at| now.duration_since(at) < DEFAULT_INTERVAL)
        {
            return false;
        }
        self.swept = Some(now);
        let quiet = |sub: &Subscription| {
            now.duration_since(sub.reported) > sub.interval * QUIET_AFTER_INTERVALS
        };
        let (shared, app, stream) = (&self.shared, &self.app, self.id);
        let before = self.subscriptions.len();
        self.subscriptions.retain(|_, sub| {
            let keep = !quiet(sub);
            if !keep {
                shared.forget(app, stream, sub);
            }
            keep
        });
        self.subscriptions.len() < before
    }
}

/// The stream ended, or its task failed: its buckets' other Envoys share them now, and their
/// bytes are the other streams' to take.
impl Drop for Stream_ {
    fn drop(&mut self) {
        for sub in self.subscriptions.values() {
            self.shared.forget(&self.app, self.id, sub);
        }
    }
}

impl Subscription {
    /// What a bucket of bucket id `id` is charged: its keys' and values' bytes twice (the id,
    /// and the identity its checks count by) and what its records take besides.
    fn bytes(id: &BTreeMap<String, String>) -> usize {
        let text: usize = id.iter().map(|(k, v)| k.len() + v.len()).sum();
        2 * text + 512
    }
}

impl Shared {
    /// Charges `bytes` to the streams' buckets if they stay within `max` (undone by
    /// [`forget`](Self::forget)).
    fn charge(&self, app: &App, bytes: usize, max: usize) -> bool {
        let charged = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(bytes).filter(|&total| total <= max)
            })
            .is_ok();
        if charged {
            app.metrics.rlqs_bucket_bytes(bytes as i64);
        }
        charged
    }

    /// Forgets stream `stream`'s bucket `sub`: its demand, and its charge.
    fn forget(&self, app: &App, stream: u64, sub: &Subscription) {
        self.held.fetch_sub(sub.bytes, Ordering::Relaxed);
        app.metrics.rlqs_bucket_bytes(-(sub.bytes as i64));
        let mut demands = self.lock();
        if let Some(envoys) = demands.get_mut(&sub.key) {
            envoys.remove(&stream);
            if envoys.is_empty() {
                demands.remove(&sub.key);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<BucketKey, HashMap<u64, Demand>>> {
        self.demands.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records stream `id`'s demand for `key` (when its report says) and returns its share
    /// against the Envoys that reported it lately, and the units charged for their live
    /// buckets that are still to be filled.
    fn share(
        &self,
        key: &BucketKey,
        id: u64,
        demand: Option<f64>,
        interval: Duration,
    ) -> (f64, u64) {
        let now = Instant::now();
        let mut demands = self.lock();
        let envoys = demands.entry(key.clone()).or_default();
        let mine = envoys.entry(id).or_insert(Demand {
            rate: 0.0,
            at: now,
            interval,
            ahead: None,
        });
        if let Some(rate) = demand {
            mine.rate = rate;
        }
        mine.at = now;
        mine.interval = interval;
        let mine = mine.rate;
        envoys.retain(|&other, d| {
            other == id || now.duration_since(d.at) <= d.interval * QUIET_AFTER_INTERVALS
        });
        let others = envoys.iter().filter(|&(&other, _)| other != id);
        let ahead = others
            .clone()
            .filter_map(|(_, d)| d.ahead)
            .map(|(b, until)| b.fills_surely_within(until.saturating_duration_since(now)))
            .sum();
        (assign::share(mine, others.map(|(_, d)| d.rate)), ahead)
    }

    /// Records stream `id`'s live bucket for `key`.
    fn assigned(&self, key: &BucketKey, id: u64, live: Option<(TokenBucket, Instant)>) {
        if let Some(mine) = self.lock().get_mut(key).and_then(|e| e.get_mut(&id)) {
            mine.ahead = live;
        }
    }
}

/// Sizes, charges and returns the assignment of `sub`.
async fn charge(
    app: &App,
    policy: &Policy,
    who: &Identity,
    sub: &mut Subscription,
    share: f64,
    ahead: u64,
    demand: Option<f64>,
) -> Action {
    let interval = sub.interval;
    let sent = Instant::now();
    // What is left, and until when.
    let Ok(peek) = app.gate.peek(policy, who, 1).await else {
        return blanket(sub, BlanketRule::DenyAll, sent + interval);
    };
    if failed_without_counts(&peek) {
        let rule = if peek.allowed() {
            BlanketRule::AllowAll
        } else {
            BlanketRule::DenyAll
        };
        return blanket(sub, rule, sent + interval);
    }
    let Some(window_end) = window_end_of(&peek, policy, sent) else {
        return blanket(sub, BlanketRule::DenyAll, sent + interval);
    };
    let room = peek.remaining().unwrap_or(0) + u64::from(peek.allowed());
    // Until its reports show its demand (it reports again at once after its first
    // assignment), a short first assignment.
    let covered = match demand {
        Some(_) => interval * INTERVALS_COVERED,
        None => interval.min(FIRST_COVERAGE),
    };
    let end = (sent + covered).min(before(window_end));
    if room == 0 || end <= sent {
        return blanket(sub, BlanketRule::DenyAll, window_end);
    }
    if demand == Some(0.0) {
        // It asks for nothing: nothing is charged for it until it asks again (its next report
        // shows what it was denied meanwhile).
        return blanket(sub, BlanketRule::DenyAll, end);
    }
    // Its live bucket, and what was charged for it that it has surely not filled yet (the
    // data plane replaces it no sooner than this answer reaches it).
    let live = match sub.assigned {
        Some((Assigned::Bucket(b), until)) if until > sent => Some((b, until)),
        _ => None,
    };
    let unfilled = live.map_or(0, |(b, until)| {
        b.fills_surely_within(until.saturating_duration_since(sent + WINDOW_MARGIN))
    });
    // What is left counts what is charged ahead here as used: it is not.
    let room_here = room.saturating_add(ahead).saturating_add(unfilled);
    let rate = assign::rate(room_here, window_end - sent, share, demand);
    // The bucket it has, kept while its rate is close; a new one otherwise, charged less what
    // the old one will no longer fill.
    let current = live.filter(|(b, _)| b.keeps(rate));
    // Coverage in whole fill intervals, so that no fill is charged twice across extensions.
    let (bucket, end, cost) = match current {
        Some((b, until)) => {
            let end = until + b.whole_fills(end.saturating_duration_since(until));
            (b, end, b.fills_within(end - until))
        }
        None => {
            let b = TokenBucket::for_rate(rate.max(1e-3), interval / FILLS_PER_INTERVAL);
            // A bucket slower than its coverage lasts the coverage, on its first tokens.
            let whole = b.whole_fills(end - sent);
            let span = if whole.is_zero() { end - sent } else { whole };
            // The data plane's coverage starts when the answer reaches it: a margin more.
            let cost = u64::from(b.max_tokens) + b.fills_within(span + WINDOW_MARGIN);
            (b, sent + span, cost.saturating_sub(unfilled))
        }
    };
    if cost == 0 {
        sub.assigned = Some((Assigned::Bucket(bucket), end));
        return token_bucket(bucket, end, sent);
    }
    match app.gate.check(policy, who, cost).await {
        Ok(d) if d.allowed() && counted(&d) => {
            // The window that counted it ends no later than the one the peek saw.
            let end = window_end_of(&d, policy, sent).map_or(end, |w| end.min(before(w)));
            sub.assigned = Some((Assigned::Bucket(bucket), end));
            token_bucket(bucket, end, sent)
        }
        Ok(d) if failed_without_counts(&d) => {
            let rule = if d.allowed() {
                BlanketRule::AllowAll
            } else {
                BlanketRule::DenyAll
            };
            blanket(sub, rule, sent + interval)
        }
        Ok(_) if current.is_some() => {
            // No more to extend it with: it lasts as long as it was charged for.
            let (b, until) = current.unwrap_or((bucket, end));
            token_bucket(b, until, sent)
        }
        Ok(d) => {
            // Less is left than the charge: what is left, once, without refills.
            // Its share of it, at least a unit.
            let left = d.remaining().unwrap_or(0).min(u64::from(u32::MAX));
            let left = ((left as f64 * share).ceil() as u64).min(left);
            if left > 0
                && current.is_none()
                && let Ok(rest) = app.gate.check(policy, who, left).await
                && rest.allowed()
                && counted(&rest)
            {
                // Without refills it cannot admit more than it was charged, however long it
                // lasts: it lasts to the end of the window that counted it.
                let end = before(window_end_of(&rest, policy, sent).unwrap_or(window_end));
                let once = TokenBucket::once(left as u32, end - sent);
                sub.assigned = Some((Assigned::Bucket(once), end));
                return token_bucket(once, end, sent);
            }
            let until = window_end_of(&d, policy, sent).unwrap_or(window_end);
            blanket(sub, BlanketRule::DenyAll, until)
        }
        Err(_) => blanket(sub, BlanketRule::DenyAll, sent + interval),
    }
}

/// An admission whose units were counted: by the store, or while it fails by the in-process
/// fallback (`on_error = "local"`), whose counters then stand for it.
fn counted(decision: &Decision) -> bool {
    decision.reason() == Reason::Ok
        || (decision.reason() == Reason::StoreUnavailable && decision.remaining().is_some())
}

/// The store failed and `on_error` answered without counting (`allow` or `deny`): a blanket
/// rule for an interval is all there is to say.
fn failed_without_counts(decision: &Decision) -> bool {
    decision.reason() == Reason::StoreUnavailable && decision.remaining().is_none()
}

/// When the first of the decision's rules' windows ends, on this host's clock (measured from
/// `sent`, before the store's now: never later than the store's end).
fn window_end_of(decision: &Decision, policy: &Policy, sent: Instant) -> Option<Instant> {
    decision
        .rules(policy)
        .iter()
        .map(|r| sent + r.reset_after)
        .min()
}

/// The last instant an assignment may last in a window ending at `end`.
fn before(end: Instant) -> Instant {
    end.checked_sub(WINDOW_MARGIN).unwrap_or(end)
}

fn token_bucket(b: TokenBucket, end: Instant, now: Instant) -> Action {
    assignment(
        Strategy::TokenBucket(PbTokenBucket {
            max_tokens: b.max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: b.tokens_per_fill,
            }),
            fill_interval: Some(pb_duration(b.fill_interval)),
        }),
        end.saturating_duration_since(now),
    )
}

fn blanket(sub: &mut Subscription, rule: BlanketRule, until: Instant) -> Action {
    let now = Instant::now();
    sub.assigned = Some((Assigned::Blanket(rule), until));
    assignment(
        Strategy::BlanketRule(rule as i32),
        until.saturating_duration_since(now),
    )
}

fn assignment(strategy: Strategy, ttl: Duration) -> Action {
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: Some(pb_duration(ttl)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    })
}

/// The metrics' name of an action.
fn action_name(action: &Action) -> &'static str {
    match action {
        Action::AbandonAction(_) => "abandon",
        Action::QuotaAssignmentAction(QuotaAssignmentAction {
            rate_limit_strategy:
                Some(RateLimitStrategy {
                    strategy: Some(Strategy::BlanketRule(rule)),
                }),
            ..
        }) if *rule == BlanketRule::AllowAll as i32 => "allow_all",
        Action::QuotaAssignmentAction(QuotaAssignmentAction {
            rate_limit_strategy:
                Some(RateLimitStrategy {
                    strategy: Some(Strategy::BlanketRule(_)),
                }),
            ..
        }) => "deny_all",
        Action::QuotaAssignmentAction(_) => "token_bucket",
    }
}
