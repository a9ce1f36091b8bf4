//! The rate-limit quota service (RLQS) against issue 26's target: two simulated Envoys
//! (`tests/it/envoy_sim.rs`, a real gRPC client) share a bucket of 600 a minute, each asking
//! for 30 a second (three times the bucket), reporting every second as Envoy does by default.
//!
//! 1. A whole minute's window with both asking: admitted together (at most 600, at least 90 %
//!    of it is the target).
//! 2. Halfway through the next window one goes quiet: how many of the other's report
//!    intervals pass before its assignment rises by half (two at most is the target).
//!
//! `cargo bench -p tollgated --bench rlqs` (about two and a half minutes: it waits for a
//! minute to begin). The server is `tollgate serve` on the memory store, on free loopback
//! ports.

#![allow(clippy::unwrap_used, dead_code)]

#[path = "../tests/it/envoy_sim.rs"]
mod envoy_sim;

use std::{
    io::BufRead as _,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use envoy_sim::{Envoy, bucket_id};

const LIMIT: u64 = 600;
const WINDOW: Duration = Duration::from_secs(60);
const REPORT_EVERY: Duration = Duration::from_secs(1);
const DEMAND: f64 = 30.0;

const CONFIG: &str = r#"
[store]
url = "memory://"

[[rlqs.buckets]]
name = "checkout"
domain = "edge"
bucket = { route = "checkout" }
rule = "600/1m"
"#;

/// Since the epoch, on the wall clock (windows are aligned to it).
fn unix() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
}

fn main() {
    let dir = std::env::temp_dir().join(format!("tollgate-rlqs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("tollgate.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(server.stderr.take().unwrap()).lines();
    let grpc = loop {
        let line = lines.next().expect("the server's log").unwrap();
        if line.contains("Envoy gRPC listening") {
            let addr = line.split("addr=").nth(1).unwrap();
            break format!("http://{}", addr.split_whitespace().next().unwrap());
        }
    };
    // The rest of its log, read so that the server never waits on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let window_ms = WINDOW.as_millis() as u64;
    rt.block_on(async {
        // Start 5 s before a minute begins, so that the next window is whole.
        let into = unix().as_millis() as u64 % window_ms;
        let wait = (window_ms - into + window_ms - 5_000) % window_ms;
        println!("waiting {:.0} s for a minute to begin", wait as f64 / 1000.0);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let id = || bucket_id(&[("route", "checkout")]);
        let a = Envoy::start(&grpc, "edge", id(), DEMAND, WINDOW, REPORT_EVERY).await;
        let b = Envoy::start(&grpc, "edge", id(), DEMAND, WINDOW, REPORT_EVERY).await;
        let whole = (unix().as_millis() as u64 + 5_000) / window_ms;
        // The whole window, then half the next.
        tokio::time::sleep(Duration::from_secs(5 + 60 + 30)).await;
        let quiet = Instant::now();
        b.set_demand(0.0);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (a, b) = (a.stop(), b.stop());
        let admitted = |w: u64| {
            a.by_window.get(&w).copied().unwrap_or(0) + b.by_window.get(&w).copied().unwrap_or(0)
        };
        let in_whole = admitted(whole);
        // A's rate over its last reports with B, and the first of its reports after B's
        // quiet one that rose by half.
        let with_b: Vec<f64> = a
            .rates
            .iter()
            .filter(|(at, _)| *at < quiet && quiet.duration_since(*at) < Duration::from_secs(5))
            .map(|&(_, r)| r)
            .collect();
        let shared = with_b.iter().sum::<f64>() / with_b.len().max(1) as f64;
        // B's first report after going quiet still shows some demand; its second shows none.
        let b_quiet = quiet + REPORT_EVERY;
        let risen = a
            .rates
            .iter()
            .filter(|(at, _)| *at > b_quiet)
            .position(|&(_, r)| r >= shared * 1.5);
        println!();
        println!("| measurement | figure | target | |");
        println!("|---|---|---|---|");
        println!(
            "| admitted in a whole minute, two Envoys asking 30/s each, bucket 600/1m | {in_whole} ({:.1} %) | <= 600 and >= 90 % | {} |",
            in_whole as f64 * 100.0 / LIMIT as f64,
            if in_whole <= LIMIT && in_whole * 10 >= LIMIT * 9 { "pass" } else { "**miss**" }
        );
        println!(
            "| A's assignment with B asking | {shared:.2}/s | | |"
        );
        println!(
            "| A's reports after B's quiet report until its assignment rose by half | {} | <= 2 | {} |",
            risen.map_or("never".to_owned(), |n| (n + 1).to_string()),
            if risen.is_some_and(|n| n < 2) { "pass" } else { "**miss**" }
        );
        println!("A's rates after: {:?}", a.rates.iter().filter(|(at, _)| *at > quiet).map(|(_, r)| (r * 100.0).round() / 100.0).collect::<Vec<_>>());
    });
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
