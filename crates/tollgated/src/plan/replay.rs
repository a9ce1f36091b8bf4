//! One configuration replayed: the server's own engine and Envoy service over a memory store
//! on a clock the replay moves to each request's time, so a request is decided by the code
//! that decides it live.

use std::{sync::Arc, time::Duration};

use envoy_types::pb::envoy::service::ratelimit::v3::{
    rate_limit_response::Code, rate_limit_service_server::RateLimitService as _,
};
use futures_util::FutureExt as _;
use smallvec::SmallVec;
use tollgate::{AnyStore, ManualClock, Tollgate};

use super::input::{Names, What};
use crate::{
    app::App,
    config::{Config, Source},
    envoy::RateLimiter,
    metrics::Metrics,
};

/// A configuration and the state its limits have reached in the replay so far.
pub(crate) struct Replay {
    clock: ManualClock,
    config: Arc<Config>,
    app: Arc<App>,
    envoy: RateLimiter,
    now_us: u64,
}

/// What a configuration decided for one request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcome {
    pub(crate) allowed: bool,
    /// The request's policy or domain is in the configuration (else it was not limited).
    pub(crate) known: bool,
    /// The request could not be checked (an identity without a dimension its policy counts
    /// by, say): the server would have answered an error.
    pub(crate) unchecked: bool,
    pub(crate) retry_after_us: u64,
    /// The wait is not known (a record's Envoy line keeps none): left out of the histogram.
    pub(crate) wait_unknown: bool,
    /// The limiters that denied it (an Envoy descriptor's keys).
    pub(crate) denied_by: SmallVec<[Arc<str>; 2]>,
    /// Whom those limiters counted: `ip=203.0.113.0/24`, `user_id=42`, an Envoy descriptor's
    /// entries.
    pub(crate) counted: SmallVec<[String; 2]>,
}

impl Replay {
    /// Starts `config` with no traffic seen, at time `start_us`.
    pub(crate) fn new(config: Config, start_us: u64) -> Replay {
        let clock = ManualClock::new(Duration::from_micros(start_us));
        let store = config
            .store
            .memory
            .builder(tollgate::MemoryStore::builder())
            .clock(clock.clone())
            .purge_interval(None)
            .build();
        let gate = Tollgate::new(AnyStore::new(store))
            .with_prefix(&config.store.prefix)
            .with_on_error(config.store.on_error)
            .with_max_stored_response(config.server.max_stored_response)
            .with_max_keep_for(config.server.max_keep_for);
        let app = Arc::new(App::new(
            gate,
            config,
            Metrics::new(),
            &crate::auth::Tokens::default(),
            crate::receipt::ReceiptKey::random(),
            Source::default(),
        ));
        Replay {
            clock,
            config: app.config_full(),
            envoy: crate::envoy::limiter(app.clone()),
            app,
            now_us: start_us,
        }
    }

    /// Decides `what` at `t_us` (the clock never goes back: an earlier time is taken as now).
    pub(crate) fn decide(&mut self, t_us: u64, what: &What, names: &Names) -> Outcome {
        if t_us > self.now_us {
            self.now_us = t_us;
            self.clock.set(Duration::from_micros(t_us));
        }
        match what {
            What::Check {
                policy,
                identity,
                cost,
            } => {
                let Some(entry) = self.config.policies.get(&*names.names[*policy as usize]) else {
                    return Outcome {
                        allowed: true,
                        ..Outcome::default()
                    };
                };
                let decided = self
                    .app
                    .gate
                    .check(&entry.policy, identity, *cost)
                    .now_or_never()
                    .expect("the memory store answers at once");
                match decided {
                    Ok(decision) => {
                        let mut outcome = Outcome {
                            allowed: decision.allowed(),
                            known: true,
                            retry_after_us: decision
                                .retry_after()
                                .map_or(0, |d| d.as_micros() as u64),
                            ..Outcome::default()
                        };
                        if !decision.allowed() {
                            for rule in decision.denied_rules(&entry.policy) {
                                let name: &str = &rule.limiter;
                                if outcome.denied_by.iter().any(|n| **n == *name) {
                                    continue;
                                }
                                outcome.denied_by.push(name.into());
                                let limiter =
                                    entry.policy.limiters().iter().find(|l| l.name() == name);
                                if let Some(limiter) = limiter {
                                    let value = limiter.dimension().value(identity);
                                    let who = format!(
                                        "{}={}",
                                        limiter.dimension(),
                                        value.as_deref().unwrap_or("")
                                    );
                                    if !outcome.counted.contains(&who) {
                                        outcome.counted.push(who);
                                    }
                                }
                            }
                        }
                        outcome
                    }
                    Err(_) => Outcome {
                        allowed: true,
                        known: true,
                        unchecked: true,
                        ..Outcome::default()
                    },
                }
            }
            What::Envoy(request) => {
                if self.config.envoy.get(&request.domain).is_none() {
                    return Outcome {
                        allowed: true,
                        ..Outcome::default()
                    };
                }
                let answered = self
                    .envoy
                    .should_rate_limit(tonic::Request::new(request.clone()))
                    .now_or_never()
                    .expect("the memory store answers at once");
                let Ok(response) = answered.map(tonic::Response::into_inner) else {
                    return Outcome {
                        allowed: true,
                        known: true,
                        unchecked: true,
                        ..Outcome::default()
                    };
                };
                let mut outcome = Outcome {
                    allowed: response.overall_code != Code::OverLimit as i32,
                    known: true,
                    ..Outcome::default()
                };
                let over = response
                    .statuses
                    .iter()
                    .zip(&request.descriptors)
                    .filter(|(s, _)| s.code == Code::OverLimit as i32);
                for (status, descriptor) in over {
                    let wait = status.duration_until_reset.as_ref().map_or(0, |d| {
                        d.seconds.max(0) as u64 * 1_000_000 + d.nanos.max(0) as u64 / 1000
                    });
                    outcome.retry_after_us = outcome.retry_after_us.max(wait);
                    let keys: Vec<&str> =
                        descriptor.entries.iter().map(|e| e.key.as_str()).collect();
                    outcome.denied_by.push(keys.join(".").into());
                }
                outcome
            }
        }
    }
}
