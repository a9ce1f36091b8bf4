//! Envoy's rate-limit quota service (RLQS) over a real gRPC stream: simulated Envoys
//! (`envoy_sim`) share a bucket's fleet-wide rule.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use tollgate_testkit::{RedisCluster, RedisSentinelSet, RedisServer};

use crate::{
    envoy_sim::{Envoy, State, bucket_id},
    support::{Server, TempDir},
};

/// How often a simulated Envoy reports.
const REPORT_EVERY: Duration = Duration::from_millis(100);

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
async fn two_envoys_share_a_bucket_and_never_go_over_it() {
    const LIMIT: u64 = 200;
    let window = Duration::from_secs(2);
    let server = Server::start(&config("memory://", "200/2s"));
    let id = || bucket_id(&[("route", "checkout"), ("tenant", "t1")]);
    let a = Envoy::start(&server.grpc, "edge", id(), 400.0, window, REPORT_EVERY).await;
    let b = Envoy::start(&server.grpc, "edge", id(), 400.0, window, REPORT_EVERY).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // B goes quiet (its stream stays open, its reports say it asks for nothing): A takes the
    // bucket, and the windows stay within it.
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

    assert!(
        a.actions
            .iter()
            .all(|&k| k == "token_bucket" || k == "deny_all")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_envoys_share_moves_within_a_few_reports() {
    let server = Server::start(&config("memory://", &steady_rule().await));
    let id = || bucket_id(&[("route", "checkout"), ("tenant", "t5")]);
    let window = Duration::from_secs(60);
    let a = Envoy::start(&server.grpc, "edge", id(), 400.0, window, REPORT_EVERY).await;
    let b = Envoy::start(&server.grpc, "edge", id(), 400.0, window, REPORT_EVERY).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // B goes quiet (its stream stays open, its reports say it asks for nothing): its first
    // report after this still shows some demand, its second none.
    let quiet = Instant::now();
    b.set_demand(0.0);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (a, _b) = (a.stop(), b.stop());

    // Both asking: about half the bucket's rate each (the median of A's last 0.8 s with
    // B). B's reports quiet: A's next assignment has it all, two report intervals after B's
    // quiet report (three of the moment B went quiet); the window allows a loaded machine
    // twice that.
    let mut shared: Vec<f64> = a
        .rates
        .iter()
        .filter(|(at, _)| *at < quiet && quiet.duration_since(*at) < Duration::from_millis(800))
        .map(|&(_, r)| r)
        .collect();
    assert!(
        !shared.is_empty(),
        "no assignment for A with B: {:?}",
        a.rates
    );
    shared.sort_by(f64::total_cmp);
    let shared = shared[shared.len() / 2];
    let soon = quiet + REPORT_EVERY * 6;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_bucket_is_denied_until_its_window_ends_and_an_unknown_one_is_abandoned() {
    let server = Server::start(&config("memory://", "30/1h"));
    let hot = Envoy::start(
        &server.grpc,
        "edge",
        bucket_id(&[("route", "checkout"), ("tenant", "t2")]),
        500.0,
        Duration::from_secs(3600),
        REPORT_EVERY,
    )
    .await;
    let unknown = Envoy::start(
        &server.grpc,
        "edge",
        bucket_id(&[("route", "cart"), ("tenant", "t2")]),
        50.0,
        Duration::from_secs(3600),
        REPORT_EVERY,
    )
    .await;
    let other_domain = Envoy::start(
        &server.grpc,
        "internal",
        bucket_id(&[("route", "checkout"), ("tenant", "t2")]),
        50.0,
        Duration::from_secs(3600),
        REPORT_EVERY,
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

/// Two servers on one store at `url`, an Envoy on each: the bucket's rule holds across them,
/// and both are served.
async fn envoys_on_two_instances_share_one_fleet_wide_bucket(url: &str) {
    const LIMIT: u64 = 150;
    let window = Duration::from_secs(2);
    let config = config(url, "150/2s");
    let (one, two) = (Server::start(&config), Server::start(&config));
    let id = || bucket_id(&[("route", "checkout"), ("tenant", "t3")]);
    let a = Envoy::start(&one.grpc, "edge", id(), 300.0, window, REPORT_EVERY).await;
    let b = Envoy::start(&two.grpc, "edge", id(), 300.0, window, REPORT_EVERY).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, metrics) = one.get_text("/metrics").await;
    assert!(metrics.contains("tollgate_rlqs_streams 1"), "{metrics}");
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_on_two_instances_share_a_bucket_on_redis() {
    let redis = RedisServer::start();
    envoys_on_two_instances_share_one_fleet_wide_bucket(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_on_two_instances_share_a_bucket_on_sentinel() {
    let set = RedisSentinelSet::start();
    envoys_on_two_instances_share_one_fleet_wide_bucket(&set.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_on_two_instances_share_a_bucket_on_a_cluster() {
    let cluster = RedisCluster::start();
    envoys_on_two_instances_share_one_fleet_wide_bucket(&cluster.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_an_envoys_stream_ends_the_other_has_the_bucket_within_a_few_reports() {
    // A's rate is ~250/s with B and ~500/s alone (see `steady_rule`).
    let window = Duration::from_secs(60);
    let server = Server::start(&config("memory://", &steady_rule().await));
    let id = || bucket_id(&[("route", "checkout"), ("tenant", "t4")]);
    let a = Envoy::start(&server.grpc, "edge", id(), 400.0, window, REPORT_EVERY).await;
    let b = Envoy::start(&server.grpc, "edge", id(), 400.0, window, REPORT_EVERY).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ended = Instant::now();
    drop(b.stop());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let a = a.stop();
    let mut shared: Vec<f64> = a
        .rates
        .iter()
        .filter(|(at, _)| *at < ended && ended.duration_since(*at) < Duration::from_millis(800))
        .map(|&(_, r)| r)
        .collect();
    assert!(
        !shared.is_empty(),
        "no assignment for A with B: {:?}",
        a.rates
    );
    shared.sort_by(f64::total_cmp);
    let shared = shared[shared.len() / 2];
    // At A's next report; the window allows a loaded machine a few more.
    let alone = a
        .rates
        .iter()
        .filter(|(at, _)| *at > ended && *at <= ended + REPORT_EVERY * 5)
        .map(|&(_, r)| r)
        .fold(0.0, f64::max);
    // A kept bucket may run a little above its share (it is replaced when its rate is off by
    // half): a rise of 30% or more is the share moving.
    assert!(
        alone >= shared * 1.3,
        "A's rate {shared:.1}/s with B, at most {alone:.1}/s after B's stream ended: {:?}",
        a.rates
    );
}

/// A bucket's rule for tests of how shares move. A rule counts in fixed windows aligned to the
/// Unix epoch, and an Envoy's rate is its share of what the bucket can sustain: the room left
/// over the time left, which jumps near a window's end. This rule allows ~500/s over what is
/// left of the current minute (at least 10 s of it: it waits for the next minute otherwise),
/// so that what it sustains hardly moves while a test runs: two Envoys asking 400/s each get
/// ~250/s each, one alone ~500/s, below the 2 x 400/s its demand caps it at.
async fn steady_rule() -> String {
    let mut left = left_of_minute();
    if left < Duration::from_secs(10) {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
        left = left_of_minute();
    }
    format!("{}/1m", 500 * left.as_secs())
}

/// What is left of the current minute since the Unix epoch.
fn left_of_minute() -> Duration {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Duration::from_millis(60_000 - ms % 60_000)
}

/// Envoy's YAML, served by the drop-in for Envoy's reference service: a bucket id is matched
/// against its domain's descriptors in whatever order its entries fit the tree.
const YAML: &str = "\
domain: edge
descriptors:
  - key: route
    value: checkout
    descriptors:
      - key: tenant
        rate_limit:
          unit: hour
          requests_per_unit: 20
  - key: route
    value: health
    rate_limit:
      unlimited: true
  - key: route
    value: closed
    rate_limit:
      unit: hour
      requests_per_unit: 0
";

/// Until `envoy` has been told `action`.
async fn until_told(envoy: &Envoy, action: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !envoy.state.lock().unwrap().actions.contains(&action) {
        assert!(Instant::now() < deadline, "never told {action}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_drop_in_serves_buckets_from_its_yaml_descriptors() {
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let yaml = dir.path().join("current/rl/config");
    std::fs::create_dir_all(&yaml).unwrap();
    std::fs::write(yaml.join("edge.yaml"), YAML).unwrap();
    let root = dir.path().join("current").display().to_string();
    let url = redis.addr().to_string();
    let server = Server::start_envoy(
        dir,
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", url.as_str()),
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", "rl"),
        ],
    );
    let hour = Duration::from_secs(3600);
    let start = |id: &[(&str, &str)], demand: f64| {
        Envoy::start(
            &server.grpc,
            "edge",
            bucket_id(id),
            demand,
            hour,
            REPORT_EVERY,
        )
    };
    // The id's entries in either order: the tree's is route, then tenant.
    let t1 = start(&[("tenant", "t1"), ("route", "checkout")], 500.0).await;
    let health = start(&[("route", "health")], 50.0).await;
    let closed = start(&[("route", "closed")], 50.0).await;
    let unknown = start(&[("route", "cart")], 50.0).await;
    let too_deep = start(&[("route", "health"), ("tenant", "t1")], 50.0).await;
    until_told(&t1, "deny_all").await;
    // Another tenant counts apart: t1 is spent, t2 is served.
    let t2 = start(&[("route", "checkout"), ("tenant", "t2")], 500.0).await;
    until_told(&t2, "token_bucket").await;
    tokio::time::sleep(REPORT_EVERY * 3).await;
    let [t1, t2, health, closed, unknown, too_deep] =
        [t1, t2, health, closed, unknown, too_deep].map(Envoy::stop);

    for (tenant, state) in [("t1", &t1), ("t2", &t2)] {
        let admitted: u64 = state.by_window.values().sum();
        assert!(
            (1..=20).contains(&admitted),
            "{tenant}: {admitted} admitted of 20; {:?}",
            state.actions
        );
    }
    let first_deny = t1.actions.iter().position(|&k| k == "deny_all").unwrap();
    assert!(
        t1.actions[first_deny..].iter().all(|&k| k == "deny_all"),
        "{:?}",
        t1.actions
    );
    for (name, state, only) in [
        ("unlimited", &health, "allow_all"),
        ("requests_per_unit 0", &closed, "deny_all"),
        ("no descriptor", &unknown, "abandon"),
        ("longer than the descriptor", &too_deep, "abandon"),
    ] {
        assert!(!state.actions.is_empty(), "{name}: no answer");
        assert!(
            state.actions.iter().all(|&k| k == only),
            "{name}: {:?}",
            state.actions
        );
    }
    assert!(health.by_window.values().sum::<u64>() > 0);
    assert!(closed.by_window.is_empty() && unknown.by_window.is_empty());
}

/// One stream's buckets are bounded: past 10,000 ids a new one is abandoned (its Envoy applies
/// its own no-assignment behaviour), and an id of more than 4 KiB is refused, so that a stream
/// of endless or huge ids holds bounded memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_buckets_are_bounded() {
    let server = Server::start(&config("memory://", "30/1h"));
    // Reported every 20 s: no bucket goes quiet while the test runs, however long the server
    // takes over the first report's 10,001 ids (quiet ones making room is tested with fewer,
    // in `all_streams_buckets_are_bounded_together`).
    let report = |tenants: &[&str]| denied_once("checkout", tenants, Some(20));
    let tenants: Vec<String> = (0..10_001).map(|i| format!("t{i}")).collect();
    let tenants: Vec<&str> = tenants.iter().map(String::as_str).collect();
    let (tx, mut responses) = quota_stream(&server, report(&tenants)).await;
    let first = abandoned(&responses.message().await.unwrap().unwrap());
    assert_eq!(first.len(), 10_001);
    assert_eq!(first.iter().filter(|&&a| a).count(), 1);
    assert!(first.last().unwrap());
    // An id the stream holds is still served; a huge one ends the stream, refused.
    tx.send(report(&["t0"])).await.unwrap();
    let again = responses.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&again), [false], "{again:?}");
    tx.send(report(&["fresh"])).await.unwrap();
    let full = responses.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&full), [true], "{full:?}");
    tx.send(report(&[&"x".repeat(5000)])).await.unwrap();
    let refused = responses.message().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}

/// All streams' buckets are bounded together (`server.max_rlqs_bucket_bytes`), so that clients
/// opening many streams of many ids cannot run the server out of memory: past the bound a new
/// id is abandoned on any stream, one a stream holds is still served, the buckets a stream has
/// stopped reporting are given back as it reports (so they keep no other stream's ids out),
/// and a stream that ends gives its buckets back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_streams_buckets_are_bounded_together() {
    // An id of `route = checkout, tenant = tN` is charged twice its 21 bytes and 512: three
    // fit, a fourth does not.
    let charge = 2 * 21 + 512;
    let config = format!(
        "[server]\nmax_rlqs_bucket_bytes = {}\n{}",
        3 * charge + 100,
        config("memory://", "30/1h")
    );
    let server = Server::start(&config);
    // Reported every second: quiet after three.
    let report = |tenants: &[&str]| denied_once("checkout", tenants, Some(1));
    let (first_tx, mut first) = quota_stream(&server, report(&["t1", "t2", "t3"])).await;
    let answer = first.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [false, false, false], "{answer:?}");
    let (_, metrics) = server.get_text("/metrics").await;
    let held = format!("tollgate_rlqs_bucket_bytes {}\n", 3 * charge);
    assert!(metrics.contains(&held), "{metrics}");
    // The bound is the server's: another stream's first id is past it.
    let (second_tx, mut second) = quota_stream(&server, report(&["t4"])).await;
    let answer = second.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [true], "{answer:?}");
    // What a stream holds is still served, a new id on it is not.
    first_tx.send(report(&["t1", "t5"])).await.unwrap();
    let answer = first.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [false, true], "{answer:?}");
    // The first stream goes on reporting t1 alone: t2 and t3, quiet, are given back as it
    // reports, and the second stream's new id has their room.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    first_tx.send(report(&["t1"])).await.unwrap();
    let answer = first.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [false], "{answer:?}");
    second_tx.send(report(&["t4"])).await.unwrap();
    let answer = second.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [false], "{answer:?}");
    first_tx.send(report(&["t5"])).await.unwrap();
    let answer = first.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [false], "{answer:?}");
    second_tx.send(report(&["t6"])).await.unwrap();
    let answer = second.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [true], "{answer:?}");
    // The first stream ends: its buckets are given back.
    drop((first_tx, first));
    let metrics = server.metrics_holding("tollgate_rlqs_streams 1\n").await;
    assert!(metrics.contains("tollgate_rlqs_streams 1\n"), "{metrics}");
    let held = format!("tollgate_rlqs_bucket_bytes {charge}\n");
    assert!(metrics.contains(&held), "{metrics}");
    second_tx.send(report(&["t4", "t6", "t7"])).await.unwrap();
    let answer = second.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [false, false, false], "{answer:?}");
    second_tx.send(report(&["t8"])).await.unwrap();
    let answer = second.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&answer), [true], "{answer:?}");
}

/// A bucket a reload no longer serves is abandoned when next reported, and gives its bytes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_a_reload_drops_gives_its_bytes_back() {
    let charge = 2 * 21 + 512;
    let mut server = Server::start(&config("memory://", "30/1h"));
    let report = |route: &str| denied_once(route, &["t1"], None);
    let (tx, mut responses) = quota_stream(&server, report("checkout")).await;
    let served = responses.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&served), [false], "{served:?}");
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains(&format!("tollgate_rlqs_bucket_bytes {charge}\n")),
        "{metrics}"
    );
    // The bucket now serves route "basket" only.
    server.write_config(&config("memory://", "30/1h").replace("\"checkout\"", "\"basket\""));
    server.wait_for_line("configuration reloaded", 1);
    tx.send(report("checkout")).await.unwrap();
    let dropped = responses.message().await.unwrap().unwrap();
    assert_eq!(abandoned(&dropped), [true], "{dropped:?}");
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_rlqs_bucket_bytes 0\n"),
        "{metrics}"
    );
}

/// With the check scope's token set, a quota stream takes it too (the metadata
/// `authorization: Bearer <token>`): without it the stream is refused before any report.
#[tokio::test]
async fn the_check_scopes_token_guards_the_quota_stream() {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        RateLimitQuotaUsageReports, rate_limit_quota_service_client::RateLimitQuotaServiceClient,
    };

    let token = "check-token-0123456789";
    let config = format!(
        "[server]\ncheck_token_env = \"TG_CHECK\"\n{}",
        config("memory://", "30/1h")
    );
    let server = Server::start_with_env(&config, &[("TG_CHECK", token)]);
    let mut client = RateLimitQuotaServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let reports = |token: Option<&str>| {
        let report = RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: Vec::new(),
        };
        let mut request = tonic::Request::new(futures_util::stream::iter([report]));
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        request
    };
    let refused = client.stream_rate_limit_quotas(reports(None)).await;
    let refused = refused.map(|_| ()).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let opened = client.stream_rate_limit_quotas(reports(Some(token))).await;
    assert!(opened.is_ok(), "{:?}", opened.map(|_| ()));
}

/// With `on_error = "local"`, a failed store is answered from the in-process fallback's
/// counters: a token bucket charged there, within the rule, never `ALLOW_ALL`; and usage
/// counts at the top of their range, or reported over a nanosecond, change nothing of that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_store_with_a_local_fallback_still_assigns_buckets() {
    use envoy_types::pb::envoy::{
        service::rate_limit_quota::v3::{
            RateLimitQuotaUsageReports, rate_limit_quota_response::bucket_action::BucketAction,
            rate_limit_quota_usage_reports::BucketQuotaUsage,
        },
        r#type::v3::rate_limit_strategy::Strategy,
    };
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let redis = RedisServer::start();
    let config = config(&redis.url(), "30/1h").replace(
        "timeout = \"5s\"",
        "timeout = \"200ms\"\non_error = \"local\"",
    );
    let server = Server::start(&config);
    drop(redis);
    let report = |allowed: u64, denied: u64, nanos: i32| RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(bucket_id(&[("route", "checkout"), ("tenant", "t1")])),
            time_elapsed: Some(PbDuration { seconds: 0, nanos }),
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }],
    };
    let (tx, mut responses) = quota_stream(&server, report(u64::MAX, 1, 1)).await;
    for round in 0..3 {
        let response = responses.message().await.unwrap().unwrap();
        let action = &response.bucket_action[0];
        let Some(BucketAction::QuotaAssignmentAction(assigned)) = &action.bucket_action else {
            panic!("round {round}: {action:?}");
        };
        let strategy = assigned
            .rate_limit_strategy
            .as_ref()
            .unwrap()
            .strategy
            .as_ref();
        match strategy {
            Some(Strategy::TokenBucket(bucket)) => {
                assert!(bucket.max_tokens <= 30, "round {round}: {bucket:?}");
            }
            // Spent (30 an hour): denied, never allowed.
            Some(Strategy::BlanketRule(rule)) => assert_eq!(*rule, 1, "round {round}: DENY_ALL"),
            other => panic!("round {round}: {other:?}"),
        }
        tx.send(report(20, 0, 500_000_000)).await.unwrap();
    }
}

/// A quota stream to `server` opened with the report `first`: what sends the next reports,
/// and the answers.
/// A bucket a report names more than once is answered once (each answer costs the store a
/// look: a report repeating one id would multiply them).
#[tokio::test]
async fn a_bucket_named_twice_in_a_report_is_answered_once() {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        RateLimitQuotaUsageReports, rate_limit_quota_usage_reports::BucketQuotaUsage,
    };

    let server = Server::start(&config("memory://", "30/1h"));
    let usage = |tenant: &str| BucketQuotaUsage {
        bucket_id: Some(bucket_id(&[("route", "checkout"), ("tenant", tenant)])),
        time_elapsed: None,
        num_requests_allowed: 1,
        num_requests_denied: 0,
    };
    let usages = ["t1", "t2", "t1", "t1"].map(usage).to_vec();
    let report = RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: usages,
    };
    let (_tx, mut responses) = quota_stream(&server, report).await;
    let answer = responses.message().await.unwrap().unwrap();
    let tenants: Vec<&str> = answer
        .bucket_action
        .iter()
        .map(|a| a.bucket_id.as_ref().unwrap().bucket["tenant"].as_str())
        .collect();
    assert_eq!(tenants, ["t1", "t2"], "{answer:?}");
}

/// A report of one denied request for each of `tenants` on `route` (domain `edge`), reported
/// every `every` seconds (`None`: no interval said).
fn denied_once(
    route: &str,
    tenants: &[&str],
    every: Option<i64>,
) -> envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        RateLimitQuotaUsageReports, rate_limit_quota_usage_reports::BucketQuotaUsage,
    };

    let usage = |tenant: &&str| BucketQuotaUsage {
        bucket_id: Some(bucket_id(&[("route", route), ("tenant", tenant)])),
        time_elapsed: every
            .map(|seconds| envoy_types::pb::google::protobuf::Duration { seconds, nanos: 0 }),
        num_requests_allowed: 0,
        num_requests_denied: 1,
    };
    RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: tenants.iter().map(usage).collect(),
    }
}

/// Whether each bucket of `answer` was abandoned, in order.
fn abandoned(
    answer: &envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse,
) -> Vec<bool> {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction;

    (answer.bucket_action.iter())
        .map(|a| matches!(a.bucket_action, Some(BucketAction::AbandonAction(_))))
        .collect()
}

async fn quota_stream(
    server: &Server,
    first: envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports,
) -> (
    tokio::sync::mpsc::Sender<
        envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports,
    >,
    tonic::Streaming<envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse>,
) {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;

    let mut client = RateLimitQuotaServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    tx.send(first).await.unwrap();
    let responses = client
        .stream_rate_limit_quotas(outbound)
        .await
        .unwrap()
        .into_inner();
    (tx, responses)
}
