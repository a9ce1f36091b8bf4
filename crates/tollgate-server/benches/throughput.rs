//! Throughput of the built `tollgate` binary on loopback: `/v1/check` and gRPC
//! `ShouldRateLimit`, each beside `/healthz` under the same load (same client, same
//! concurrency), so the ratio says what rate limiting costs over serving HTTP at all.
//!
//! `cargo bench -p tollgate-server --bench throughput`; with `redis-server` on PATH the
//! checks also run on Redis. Each iteration is a batch of `BATCH` requests from `CONCURRENCY`
//! client tasks on keep-alive connections (HTTP/1.1) or one HTTP/2 channel (gRPC).

#![allow(clippy::unwrap_used)]

#[allow(dead_code, unreachable_pub)]
#[path = "../tests/it/support.rs"]
mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use support::{Server, descriptor};

const BATCH: u64 = 512;
const CONCURRENCY: u64 = 32;
/// Distinct client addresses the load cycles through.
const ADDRESSES: u64 = 4096;

fn config(store: &str) -> String {
    format!(
        r#"
[store]
url = "{store}"
timeout = "500ms"

[policies.api]
limiters = [
  {{ by = "ip", rules = ["100000/1m", "1000000/1h", "10000000/1d"] }},
  {{ by = "user_id", rules = ["10000000/1d"] }},
]

[[envoy.domains]]
name = "edge"
descriptors = [{{ key = "remote_address", rules = ["100000/1m", "1000000/1h"] }}]
"#
    )
}

fn ip(n: u64) -> String {
    format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255)
}

/// Runs `total` requests from `CONCURRENCY` tasks; `call(n)` makes request number `n`.
async fn load<F, Fut>(total: u64, call: F) -> Duration
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let call = call.clone();
            let next = next.clone();
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= total {
                        break;
                    }
                    call(n).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

fn bench_server(c: &mut Criterion, rt: &tokio::runtime::Runtime, label: &str, server: &Server) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY as usize)
        .build()
        .unwrap();
    let grpc = rt.block_on(server.grpc_client());
    let base = server.http.clone();
    let mut group = c.benchmark_group(format!("server_{label}"));
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(5));

    {
        let (http, base) = (http.clone(), base.clone());
        group.bench_function("healthz", |b| {
            b.iter_custom(|iters| {
                let (http, base) = (http.clone(), base.clone());
                rt.block_on(load(iters * BATCH, move |_| {
                    let (http, base) = (http.clone(), base.clone());
                    async move {
                        let r = http.get(format!("{base}/healthz")).send().await.unwrap();
                        assert!(r.status().is_success());
                        r.bytes().await.unwrap();
                    }
                }))
            });
        });
    }
    {
        let (http, base) = (http.clone(), base.clone());
        group.bench_function("v1_check", |b| {
            b.iter_custom(|iters| {
                let (http, base) = (http.clone(), base.clone());
                rt.block_on(load(iters * BATCH, move |n| {
                    let (http, base) = (http.clone(), base.clone());
                    async move {
                        let body = serde_json::json!({
                            "policy": "api",
                            "identity": { "ip": ip(n % ADDRESSES), "user_id": (n % 97).to_string() },
                        });
                        let r = http
                            .post(format!("{base}/v1/check"))
                            .json(&body)
                            .send()
                            .await
                            .unwrap();
                        assert!(r.status().is_success());
                        r.bytes().await.unwrap();
                    }
                }))
            });
        });
    }
    group.bench_function("grpc_should_rate_limit", |b| {
        b.iter_custom(|iters| {
            let grpc = grpc.clone();
            rt.block_on(load(iters * BATCH, move |n| {
                let mut grpc = grpc.clone();
                async move {
                    let r = grpc
                        .should_rate_limit(RateLimitRequest {
                            domain: "edge".into(),
                            descriptors: vec![descriptor(&[(
                                "remote_address",
                                &ip(n % ADDRESSES),
                            )])],
                            hits_addend: 1,
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    assert_eq!(r.overall_code, Code::Ok as i32);
                }
            }))
        });
    });
    group.finish();
}

fn throughput(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let memory = Server::start(&config("memory://"));
    bench_server(c, &rt, "memory", &memory);
    drop(memory);

    let has_redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_redis {
        let redis = tollgate_testkit::RedisServer::start();
        let server = Server::start(&config(&redis.url()));
        bench_server(c, &rt, "redis", &server);
    } else {
        eprintln!("redis-server not on PATH: skipping the Redis-backed server benchmarks");
    }
}

criterion_group!(benches, throughput);
criterion_main!(benches);
