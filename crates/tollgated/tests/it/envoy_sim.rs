//! A simulated Envoy for the rate-limit quota service (RLQS): a gRPC client built from Envoy's
//! protos that makes requests at a demand the caller sets, applies its assignments as Envoy's
//! filter does (a token bucket that starts full and refills, kept when it is sent again,
//! replaced when it changes; blanket rules; nothing admitted without a live assignment) and
//! reports its usage every interval. Shared by the RLQS tests and the RLQS bench.

#![allow(dead_code)]

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
pub(crate) fn bucket_id(entries: &[(&str, &str)]) -> BucketId {
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
pub(crate) struct State {
    active: Option<(Active, Instant)>,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    /// Admissions by wall-clock window (`unix ms / window ms`).
    pub(crate) by_window: HashMap<u64, u64>,
    /// The token bucket rates it was assigned, when (units a second).
    pub(crate) rates: Vec<(Instant, f64)>,
    /// Every action's kind, in order.
    pub(crate) actions: Vec<&'static str>,
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

/// A simulated Envoy: `demand` requests a second (changed through the handle), reporting
/// every `report_every`.
pub(crate) struct Envoy {
    pub(crate) state: Arc<Mutex<State>>,
    demand: Arc<Mutex<f64>>,
    task: tokio::task::JoinHandle<()>,
}

impl Envoy {
    pub(crate) async fn start(
        grpc: &str,
        domain: &str,
        id: BucketId,
        demand: f64,
        window: Duration,
        report_every: Duration,
    ) -> Envoy {
        let state = Arc::new(Mutex::new(State::default()));
        let demand = Arc::new(Mutex::new(demand));
        let mut client = RateLimitQuotaServiceClient::connect(grpc.to_owned())
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
                            (last_report.elapsed() >= report_every).then(|| {
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

    pub(crate) fn set_demand(&self, demand: f64) {
        *self.demand.lock().unwrap() = demand;
    }

    /// Stops it; what it saw.
    pub(crate) fn stop(self) -> State {
        self.task.abort();
        std::mem::take(&mut *self.state.lock().unwrap())
    }
}
