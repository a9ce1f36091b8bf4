//! Plans, stores and raw connections for the tests.

use std::time::Duration;

use tollgate::{Algorithm, Rule};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;
pub(crate) use tollgate_testkit::plan::{CheckPlan, PlanBan, PlanExt, PlanLimiter};

/// A rule from its text form and an algorithm.
pub(crate) fn rule(text: &str, algorithm: Algorithm) -> Rule {
    text.parse::<Rule>().unwrap().with_algorithm(algorithm)
}

/// A limiter of a plan: its base key (hash tag included) and rules.
pub(crate) fn limiter(key: &str, rules: &[Rule]) -> PlanLimiter {
    PlanLimiter::new(key, rules)
}

/// A plan that consumes `cost`.
pub(crate) fn plan(cost: u64, limiters: &[PlanLimiter]) -> CheckPlan {
    CheckPlan::new(cost, true, limiters.to_vec())
}

/// A production store (Redis `TIME`) with a timeout generous enough for a busy test machine.
pub(crate) async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// A plain connection for inspecting the server. Its replies may take long (a test's own
/// bulk script on a loaded machine): no response timeout.
pub(crate) async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}
