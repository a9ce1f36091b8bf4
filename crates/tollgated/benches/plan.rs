//! `tollgate plan`'s speed: requests replayed a second, the files read and parsed included,
//! on one thread. `cargo bench -p tollgated --bench plan`; the issue's target is a million a
//! second for one-rule policies (docs/benchmarks.md).

#![allow(clippy::unwrap_used)]

use std::{io::Write as _, path::PathBuf, time::Duration};

use clap::Parser as _;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgated::{Cli, Command, PlanArgs};

/// Requests per file.
const REQUESTS: u64 = 200_000;

/// A one-rule policy (GCRA, per address) and 1,000 addresses, some of them over it.
const CONFIG: &str = r#"
[policies.api]
limiters = [{ by = "ip", rules = ["20/1s"], algorithm = "gcra" }]
"#;

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-plan-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `REQUESTS` lines of `line(i, t_us, ip)`, 50 µs apart on average.
fn traffic(path: &PathBuf, line: impl Fn(u64, u64, &str) -> String) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut state = 1u64;
    let mut t_us = 1_796_464_800_000_000u64;
    for i in 0..REQUESTS {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        t_us += (state >> 58) + 18;
        let n = (state >> 33) % 1000;
        let ip = format!("10.0.{}.{}", n / 250, n % 250 + 1);
        writeln!(out, "{}", line(i, t_us, &ip)).unwrap();
    }
}

fn args(list: &[&str]) -> PlanArgs {
    let all = ["tollgate", "plan"].iter().chain(list);
    match Cli::try_parse_from(all).unwrap().command {
        Command::Plan(args) => args,
        _ => unreachable!("a plan"),
    }
}

fn plan_speed(c: &mut Criterion) {
    let dir = dir();
    let config = dir.join("api.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let record = dir.join("record.jsonl");
    traffic(&record, |_, t_us, ip| {
        format!(
            r#"{{"t_us":{t_us},"policy":"api","identity":{{"ip":"{ip}"}},"cost":1,"allowed":true,"reason":"ok","retry_after_ms":null}}"#
        )
    });
    let nginx = dir.join("access.log");
    traffic(&nginx, |_, t_us, ip| {
        let at = jiff::Timestamp::from_microsecond(t_us as i64).unwrap();
        format!(
            r#"{ip} - - [{}] "POST /api/v1/send HTTP/1.1" 200 12 "-" "client/1.0""#,
            at.strftime("%d/%b/%Y:%H:%M:%S +0000")
        )
    });
    let (config, record, nginx) = (
        config.display().to_string(),
        record.display().to_string(),
        nginx.display().to_string(),
    );
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(REQUESTS));
    let from_record = args(&["--config", &config, &record]);
    group.bench_function("record_1rule", |b| {
        b.iter(|| tollgated::plan(&from_record).unwrap())
    });
    let from_nginx = args(&[
        "--config", &config, "--input", "nginx", "--policy", "api", &nginx,
    ]);
    group.bench_function("nginx_1rule", |b| {
        b.iter(|| tollgated::plan(&from_nginx).unwrap())
    });
    group.finish();
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, plan_speed);
criterion_main!(benches);
