//! Envoy's rate-limit quota service (RLQS) over a real gRPC stream: simulated Envoys (a client
//! built from Envoy's protos that applies its assignments as Envoy's filter does: a token bucket
//! that starts full and refills, kept when it is sent again, replaced when it changes; blanket
//! rules; nothing admitted without a live assignment) share a bucket's fleet-wide rule.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use envoy_types::pb::{
    envoy::{
        service::rate_limit_quota::v3::{
            BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
            rate_limit_quota_response::bucket_action::BucketAction as Action,
            rate_limit_quota_service_client::RateLimitQuotaServiceClient,
            rate_limit_quota_usage_reports::BucketQuotaUsage,
        },
        r#type::v3::{
            TokenBucket,
            rate_limit_strategy::{BlanketRule, Strategy},
        },
    },
    google::protobuf::Duration as PbDuration,
};
use tollgate_testkit::RedisServer;

use crate::support::Server;

/// How often a simulated Envoy reports.
const REPORT_EVERY: Duration = Duration::from_millis(100);

fn bucket_id(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn pb(d: Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn std_duration(d: &PbDuration) -> Duration {
    Duration::new(d.seconds as u64, d.nanos as u32)
}

/// What a simulated Envoy applies to its bucket.
#[derive(Clone, Debug)]
enum Active {
    Bucket {
        bucket: TokenBucket,
        tokens: u64,
        /// The last fill (or the start).
        filled: Instant,
    },
    Blanket(BlanketRule),
}

/// A simulated Envoy's view of its one bucket, and what it admitted.
#[derive(Default)]
struct State {
    active: Option<(Active, Instant)>,
    allowed: u64,
    denied: u64,
    /// Admissions by wall-clock window (`unix ms / window ms`).
    by_window: HashMap<u64, u64>,
    /// The token bucket rates it was assigned, when (units a second).
    rates: Vec<(Instant, f64)>,
    /// Every action's kind, in order.
    actions: Vec<&'static str>,
}

impl State {
    /// One request now: admitted or not, as the filter decides.
    fn request(&mut self, window_ms: u64) -> bool {
        let now = Instant::now();
        let admit = match &mut self.active {
            Some((_, until)) if now >= *until => false,
            None => false,
            Some((Active::Blanket(rule), _)) => *rule == BlanketRule::AllowAll,
            Some((
                Active::Bucket {
                    bucket,
                    tokens,
                    filled,
                },
                _,
            )) => {
                let every = std_duration(bucket.fill_interval.as_ref().unwrap());
                let per = u64::from(bucket.tokens_per_fill.unwrap().value);
                while now.duration_since(*filled) >= every {
                    *filled += every;
                    *tokens = (*tokens + per).min(u64::from(bucket.max_tokens));
                }
                if *tokens > 0 {
                    *tokens -= 1;
                    true
                } else {
                    false
                }
            }
        };
        if admit {
            self.allowed += 1;
            let ms = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            *self.by_window.entry(ms / window_ms).or_default() += 1;
        } else {
            self.denied += 1;
        }
        admit
    }

    fn apply(&mut self, response: RateLimitQuotaResponse) {
        let now = Instant::now();
        for action in response.bucket_action {
            match action.bucket_action.unwrap() {
                Action::AbandonAction(_) => {
                    self.actions.push("abandon");
                    self.active = None;
                }
                Action::QuotaAssignmentAction(a) => {
                    let until = now + std_duration(&a.assignment_time_to_live.unwrap());
                    match a.rate_limit_strategy.unwrap().strategy.unwrap() {
                        Strategy::TokenBucket(bucket) => {
                            self.actions.push("token_bucket");
                            let every = std_duration(bucket.fill_interval.as_ref().unwrap());
                            let rate = f64::from(bucket.tokens_per_fill.unwrap().value)
                                / every.as_secs_f64();
                            self.rates.push((now, rate));
                            // The same bucket, still live: kept with its tokens, for longer.
                            if let Some((Active::Bucket { bucket: same, .. }, live)) =
                                &mut self.active
                                && *same == bucket
                                && *live > now
                            {
                                *live = until;
                                continue;
                            }
                            let tokens = u64::from(bucket.max_tokens);
                            self.active = Some((
                                Active::Bucket {
                                    bucket,
                                    tokens,
                                    filled: now,
                                },
                                until,
                            ));
                        }
                        Strategy::BlanketRule(rule) => {
                            let rule = BlanketRule::try_from(rule).unwrap();
                            self.actions.push(match rule {
                                BlanketRule::AllowAll => "allow_all",
                                BlanketRule::DenyAll => "deny_all",
                            });
                            self.active = Some((Active::Blanket(rule), until));
                        }
                        Strategy::RequestsPerTimeUnit(_) => panic!("not assigned by tollgate"),
                    }
                }
            }
        }
    }
}

/// A simulated Envoy: `demand` requests a second (changed by the test through the handle),
/// reporting every [`REPORT_EVERY`].
struct Envoy {
    state: Arc<Mutex<State>>,
    demand: Arc<Mutex<f64>>,
    task: tokio::task::JoinHandle<()>,
}

impl Envoy {
    async fn start(
        server: &Server,
        domain: &str,
        id: BucketId,
        demand: f64,
        window: Duration,
    ) -> Envoy {
        let state = Arc::new(Mutex::new(State::default()));
        let demand = Arc::new(Mutex::new(demand));
        let mut client = RateLimitQuotaServiceClient::connect(server.grpc.clone())
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel::<RateLimitQuotaUsageReports>(4);
        let outbound =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let (task_state, task_demand, domain) = (state.clone(), demand.clone(), domain.to_owned());
        let window_ms = window.as_millis() as u64;
        let task = tokio::spawn(async move {
            // The first report subscribes (a first request matched the bucket).
            let first = RateLimitQuotaUsageReports {
                domain,
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: Some(id.clone()),
                    time_elapsed: None,
                    num_requests_allowed: 0,
                    num_requests_denied: 1,
                }],
            };
            tx.send(first).await.unwrap();
            let mut responses = client
                .stream_rate_limit_quotas(outbound)
                .await
                .unwrap()
                .into_inner();
            let mut last_report = Instant::now();
            let mut owed = 0.0;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            loop {
                tokio::select! {
                    response = responses.message() => match response.unwrap() {
                        Some(r) => task_state.lock().unwrap().apply(r),
                        None => return,
                    },
                    _ = tick.tick() => {
                        let report = {
                            let rate = *task_demand.lock().unwrap();
                            owed += rate / 1000.0;
                            let mut state = task_state.lock().unwrap();
                            while owed >= 1.0 {
                                owed -= 1.0;
                                state.request(window_ms);
                            }
                            (last_report.elapsed() >= REPORT_EVERY).then(|| {
                                let elapsed = last_report.elapsed();
                                last_report = Instant::now();
                                RateLimitQuotaUsageReports {
                                    domain: String::new(),
                                    bucket_quota_usages: vec![BucketQuotaUsage {
                                        bucket_id: Some(id.clone()),
                                        time_elapsed: Some(pb(elapsed)),
                                        num_requests_allowed: std::mem::take(&mut state.allowed),
                                        num_requests_denied: std::mem::take(&mut state.denied),
                                    }],
                                }
                            })
                        };
                        if let Some(report) = report
                            && tx.send(report).await.is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
        Envoy {
            state,
            demand,
            task,
        }
    }

    fn set_demand(&self, demand: f64) {
        *self.demand.lock().unwrap() = demand;
    }

    /// Stops it; what it saw.
    fn stop(self) -> State {
        self.task.abort();
        std::mem::take(&mut *self.state.lock().unwrap())
    }
}

fn config(store: &str, rule: &str) -> String {
    format!(
        r#"
[store]
url = "{store}"
timeout = "5s"

[[rlqs.buckets]]
name = "checkout"
domain = "edge"
bucket = {{ route = "checkout", tenant = "*" }}
rule = "{rule}"
"#
    )
}

/// Every window's admissions, summed over the Envoys.
fn windows(envoys: &[&State]) -> Vec<(u64, u64)> {
    let mut sum: HashMap<u64, u64> = HashMap::new();
    for state in envoys {
        for (&w, &n) in &state.by_window {
            *sum.entry(w).or_default() += n;
        }
    }
    let mut windows: Vec<(u64, u64)> = sum.into_iter().collect();
    windows.sort();
    windows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_share_a_bucket_never_over_it_and_a_quiet_ones_share_moves_within_two_reports() {
    const LIMIT: u64 = 200;
    let window = Duration::from_secs(2);
    let server = Server::start(&config("memory://", "200/2s"));
    let id = || bucket_id(&[("route", "checkout"), ("tenant", "t1")]);
    let a = Envoy::start(&server, "edge", id(), 400.0, window).await;
    let b = Envoy::start(&server, "edge", id(), 400.0, window).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // B goes quiet (its stream stays open, its reports say it asks for nothing): its first
    // report after this still shows some demand, its second none.
    let quiet = Instant::now();
    b.set_demand(0.0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (a, b) = (a.stop(), b.stop());

    let all = windows(&[&a, &b]);
    println!("admitted per window: {all:?}");
    for &(w, n) in &all {
        assert!(
            n <= LIMIT,
            "window {w}: {n} admitted, over {LIMIT}: {all:?}"
        );
    }
    // The windows wholly inside the run are used (a loose bound: the machine is shared).
    let full: Vec<u64> = all[1..all.len() - 1].iter().map(|&(_, n)| n).collect();
    assert!(full.iter().all(|&n| n >= LIMIT / 2), "{all:?}");

    // Both asking: about half the bucket's rate each (the median of A's last second with
    // B). B's reports quiet: A's next assignment has it all, within two report intervals
    // of B's quiet report (three of the moment B went quiet, and some slack).
    let mut shared: Vec<f64> = a
        .rates
        .iter()
        .filter(|(at, _)| *at < quiet && quiet.duration_since(*at) < Duration::from_secs(1))
        .map(|&(_, r)| r)
        .collect();
    shared.sort_by(f64::total_cmp);
    let shared = shared[shared.len() / 2];
    let soon = quiet + REPORT_EVERY * 3 + REPORT_EVERY / 2;
    let alone = a
        .rates
        .iter()
        .filter(|(at, _)| *at > quiet && *at <= soon)
        .map(|&(_, r)| r)
        .fold(0.0, f64::max);
    assert!(
        alone >= shared * 1.5,
        "A's rate {shared:.1}/s with B, at most {alone:.1}/s soon after: {:?}",
        a.rates
    );
    assert!(
        a.actions
            .iter()
            .all(|&k| k == "token_bucket" || k == "deny_all")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_bucket_is_denied_until_its_window_ends_and_an_unknown_one_is_abandoned() {
    let server = Server::start(&config("memory://", "30/1h"));
    let hot = Envoy::start(
        &server,
        "edge",
        bucket_id(&[("route", "checkout"), ("tenant", "t2")]),
        500.0,
        Duration::from_secs(3600),
    )
    .await;
    let unknown = Envoy::start(
        &server,
        "edge",
        bucket_id(&[("route", "cart"), ("tenant", "t2")]),
        50.0,
        Duration::from_secs(3600),
    )
    .await;
    let other_domain = Envoy::start(
        &server,
        "internal",
        bucket_id(&[("route", "checkout"), ("tenant", "t2")]),
        50.0,
        Duration::from_secs(3600),
    )
    .await;
    // Until the hot Envoy is told DENY_ALL.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !hot.state.lock().unwrap().actions.contains(&"deny_all") {
        assert!(Instant::now() < deadline, "never denied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (hot, unknown, other_domain) = (hot.stop(), unknown.stop(), other_domain.stop());
    let admitted: u64 = hot.by_window.values().sum();
    assert!(
        (1..=30).contains(&admitted),
        "{admitted} admitted of 30; {:?}",
        hot.actions
    );
    // Once spent, denied for the rest of the window: nothing but DENY_ALL after the first.
    let first_deny = hot.actions.iter().position(|&k| k == "deny_all").unwrap();
    assert!(
        hot.actions[first_deny..].iter().all(|&k| k == "deny_all"),
        "{:?}",
        hot.actions
    );
    for abandoned in [&unknown, &other_domain] {
        assert!(!abandoned.actions.is_empty());
        assert!(
            abandoned.actions.iter().all(|&k| k == "abandon"),
            "{:?}",
            abandoned.actions
        );
        assert!(abandoned.by_window.is_empty());
    }
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_rlqs_actions_total{action=\"deny_all\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_rlqs_actions_total{action=\"abandon\"}"),
        "{metrics}"
    );
}

/// Two servers on one Redis, an Envoy on each: the bucket's rule holds across them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_on_two_instances_share_one_fleet_wide_bucket() {
    const LIMIT: u64 = 150;
    let window = Duration::from_secs(2);
    let redis = RedisServer::start();
    let config = config(&redis.url(), "150/2s");
    let (one, two) = (Server::start(&config), Server::start(&config));
    let id = || bucket_id(&[("route", "checkout"), ("tenant", "t3")]);
    let a = Envoy::start(&one, "edge", id(), 300.0, window).await;
    let b = Envoy::start(&two, "edge", id(), 300.0, window).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (a, b) = (a.stop(), b.stop());
    let all = windows(&[&a, &b]);
    println!("admitted per window: {all:?}");
    for &(w, n) in &all {
        assert!(
            n <= LIMIT,
            "window {w}: {n} admitted, over {LIMIT}: {all:?}"
        );
    }
    assert!(a.by_window.values().sum::<u64>() > 0 && b.by_window.values().sum::<u64>() > 0);
    let (_, metrics) = one.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_rlqs_streams 0") || metrics.contains("tollgate_rlqs_streams 1"),
        "{metrics}"
    );
}
