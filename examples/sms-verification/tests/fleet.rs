//! Three instances of the example, three processes, one real Redis: the limits and the
//! idempotency keys hold across the fleet under concurrency.

#![allow(clippy::unwrap_used)]

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{sync::Barrier, task::JoinSet};
use tollgate_testkit::RedisServer;

/// One `sms-verification` process; killed on drop.
struct Instance {
    child: Child,
    url: String,
}

impl Instance {
    fn start(redis: &str, name: &str) -> Instance {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sms-verification"))
            .args(["--listen", "127.0.0.1:0", "--redis", redis])
            // Generous: 300 requests at once on a small shared machine must not time out
            // (the store failing closed would turn them into 503s, failing the counts).
            .args(["--redis-timeout", "10s"])
            // The test client plays a proxy on loopback, forwarding many clients.
            .args(["--trust-proxy", "127.0.0.1/32", "--instance", name])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("instance {name} did not start: {line:?}"))
            .to_owned();
        Instance { child, url }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fleet(redis: &RedisServer) -> Vec<Instance> {
    ["a", "b", "c"]
        .iter()
        .map(|name| Instance::start(&redis.url(), name))
        .collect()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        // A hang detector, not a timing assertion.
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Sends `n` requests at once (released together by a barrier), request `i` to instance
/// `i % 3`; returns how many got each status.
async fn burst(
    instances: &[Instance],
    n: usize,
    request: impl Fn(&reqwest::Client, &str, usize) -> reqwest::RequestBuilder,
) -> HashMap<u16, usize> {
    let http = client();
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let request = request(&http, &instances[i % instances.len()].url, i);
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            request.send().await.unwrap().status().as_u16()
        });
    }
    let mut statuses = HashMap::new();
    while let Some(status) = tasks.join_next().await {
        *statuses.entry(status.unwrap()).or_default() += 1;
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let instances = fleet(&redis);

    // 300 codes for one user from 300 addresses: the user's 20/1d admits exactly 20.
    let statuses = burst(&instances, 300, |http, url, i| {
        http.post(format!("{url}/sms/code"))
            .header(
                "x-forwarded-for",
                format!("198.51.{}.{}", i / 250, i % 250 + 1),
            )
            .header("x-user-id", "alice")
            .json(&json!({ "phone": "+1 555 0100" }))
    })
    .await;
    assert_eq!(statuses.get(&200), Some(&20), "{statuses:?}");
    assert_eq!(statuses.get(&429), Some(&280), "{statuses:?}");

    // 300 codes from one address for 300 users: its 1/1m admits exactly one; the violations
    // ban it (403 for whoever comes after the first ban).
    let statuses = burst(&instances, 300, |http, url, i| {
        http.post(format!("{url}/sms/code"))
            .header("x-forwarded-for", "203.0.113.7")
            .header("x-user-id", format!("user-{i}"))
            .json(&json!({ "phone": "+1 555 0100" }))
    })
    .await;
    assert_eq!(statuses.get(&200), Some(&1), "{statuses:?}");
    assert_eq!(
        statuses.get(&429).unwrap_or(&0) + statuses.get(&403).unwrap_or(&0),
        299,
        "{statuses:?}"
    );
    let stats: Value = client()
        .get(format!("{}/admin/stats", instances[1].url))
        .header("x-user-id", "admin")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let banned: Vec<&str> = stats["bans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["target"].as_str().unwrap())
        .collect();
    assert!(banned.contains(&"ip:203.0.113.7"), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_creates_one_order_across_the_fleet() {
    let redis = RedisServer::start();
    let instances = fleet(&redis);
    let order = |http: &reqwest::Client, url: &str, _: usize| {
        http.post(format!("{url}/orders"))
            .header("x-user-id", "alice")
            .header("idempotency-key", "fleet-order-1")
            .json(&json!({ "item": "book" }))
    };
    // 30 concurrent attempts: one creates the order; the others are told it is in flight
    // (409) or get the replay (201).
    let statuses = burst(&instances, 30, order).await;
    assert_eq!(
        statuses.get(&201).unwrap_or(&0) + statuses.get(&409).unwrap_or(&0),
        30,
        "{statuses:?}"
    );

    // Afterwards every instance replays the same bytes.
    let http = client();
    let mut bodies = Vec::new();
    for instance in &instances {
        let replay = order(&http, &instance.url, 0).send().await.unwrap();
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotency-replayed"], "true");
        bodies.push(replay.bytes().await.unwrap());
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    let created: usize = {
        let mut total = 0;
        for instance in &instances {
            let stats: Value = http
                .get(format!("{}/admin/stats", instance.url))
                .header("x-user-id", "admin")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            total += stats["orders_created"].as_u64().unwrap() as usize;
        }
        total
    };
    assert_eq!(created, 1, "exactly one instance ran the handler, once");
}
