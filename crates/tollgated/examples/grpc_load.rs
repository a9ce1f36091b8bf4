//! A small gRPC load generator for `scripts/bench-server`: unary calls with rotating keys over
//! a few HTTP/2 connections, many calls in flight on each, for a fixed time; prints
//! `<calls per second> <p99 latency µs> <errors> <calls>`.
//!
//! Targets (the request bodies are protobuf written by hand, so no generated client is
//! needed):
//! - `envoy`: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, domain `bench`,
//!   one descriptor `remote_address = 10.x.y.z` rotating over `--keys` values.
//! - `throttlecrab`: `throttlecrab.RateLimiter/Throttle`, key `k<n>` rotating likewise, GCRA
//!   1000 per 60 s, burst 1000.
//!
//! ```text
//! cargo run --release -p tollgated --example grpc_load -- \
//!     http://127.0.0.1:8081 envoy 10 8 16 4096
//! ```

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tonic::{
    Status,
    client::Grpc,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    codegen::{Bytes, http::uri::PathAndQuery},
    transport::Channel,
};

/// Sends bytes already encoded as protobuf; reads the reply's bytes and drops them.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        use bytes::BufMut as _;
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = ();
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, Status> {
        use bytes::Buf as _;
        let n = src.remaining();
        src.advance(n);
        Ok(Some(()))
    }
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A length-delimited field (strings, embedded messages).
fn field_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn field_varint(out: &mut Vec<u8>, field: u64, n: u64) {
    varint(out, field << 3);
    varint(out, n);
}

/// `RateLimitRequest { domain: "bench", descriptors: [{ entries: [{ "remote_address", ip }] }] }`.
fn envoy_request(i: u64) -> Bytes {
    let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    let mut entry = Vec::new();
    field_bytes(&mut entry, 1, b"remote_address");
    field_bytes(&mut entry, 2, ip.as_bytes());
    let mut descriptor = Vec::new();
    field_bytes(&mut descriptor, 1, &entry);
    let mut request = Vec::new();
    field_bytes(&mut request, 1, b"bench");
    field_bytes(&mut request, 2, &descriptor);
    Bytes::from(request)
}

/// `ThrottleRequest { key, max_burst: 1000, count_per_period: 1000, period: 60, quantity: 1 }`.
fn throttlecrab_request(i: u64) -> Bytes {
    let key = format!("k{i}");
    let mut request = Vec::new();
    field_bytes(&mut request, 1, key.as_bytes());
    field_varint(&mut request, 2, 1000);
    field_varint(&mut request, 3, 1000);
    field_varint(&mut request, 4, 60);
    field_varint(&mut request, 5, 1);
    Bytes::from(request)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, target, secs, connections, concurrency, keys] = args.as_slice() else {
        return Err(
            "usage: grpc_load <http://host:port> <envoy|throttlecrab> <seconds> <connections> <calls in flight per connection> <keys>"
                .into(),
        );
    };
    let (path, bodies): (&str, Vec<Bytes>) = match target.as_str() {
        "envoy" => (
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            (0..keys.parse()?).map(envoy_request).collect(),
        ),
        "throttlecrab" => (
            "/throttlecrab.RateLimiter/Throttle",
            (0..keys.parse()?).map(throttlecrab_request).collect(),
        ),
        other => return Err(format!("unknown target {other:?}").into()),
    };
    let duration = Duration::from_secs(secs.parse()?);
    let connections: usize = connections.parse()?;
    let concurrency: usize = concurrency.parse()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let bodies = Arc::new(bodies);
        let path = PathAndQuery::from_static(path);
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let channel = Channel::from_shared(addr.clone())?.connect().await?;
            for _ in 0..concurrency {
                let mut grpc = Grpc::new(channel.clone());
                let (bodies, path, stop, next, errors) = (
                    bodies.clone(),
                    path.clone(),
                    stop.clone(),
                    next.clone(),
                    errors.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(1 << 16);
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize % bodies.len();
                        let started = Instant::now();
                        let ok = match grpc.ready().await {
                            Ok(()) => grpc
                                .unary::<Bytes, (), _>(
                                    tonic::Request::new(bodies[i].clone()),
                                    path.clone(),
                                    RawCodec,
                                )
                                .await
                                .is_ok(),
                            Err(_) => false,
                        };
                        if ok {
                            latencies.push(started.elapsed().as_micros() as u64);
                        } else {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    latencies
                }));
            }
        }
        let started = Instant::now();
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await?);
        }
        let took = started.elapsed().as_secs_f64();
        latencies.sort_unstable();
        let p99 = latencies
            .get(latencies.len() * 99 / 100)
            .copied()
            .unwrap_or(0);
        println!(
            "{:.0} {p99} {} {}",
            latencies.len() as f64 / took,
            errors.load(Ordering::Relaxed),
            latencies.len()
        );
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
