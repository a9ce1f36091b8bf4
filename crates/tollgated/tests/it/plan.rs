//! `tollgate plan`: a record of live traffic replays exactly (every decision the plan makes
//! against the configuration that made the record is the server's), budgets fail the
//! command, malformed lines are named, and the HTML report works in a real browser.

use std::{path::Path, process::Command, time::Duration};

use clap::Parser as _;
use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
    service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code},
};
use serde_json::{Value, json};
use tollgate::{AnyStore, ManualClock, MemoryStore};
use tollgated::{Cli, Command as Sub, Config, InProcess, PlanArgs};

use crate::{
    dashboard::{Chromedriver, headless, wait_until},
    support::{HANG, Server, TempDir, binary, post_in_process},
};

/// Policies of several algorithms and two limiters, and an Envoy domain, recorded.
fn config_text(record: &Path) -> String {
    format!(
        r#"
[record]
path = "{}"

[policies.sms]
limiters = [
  {{ by = "ip", rules = ["2/1m", "5/1h"] }},
  {{ by = "user_id", rules = ["3/10m"], algorithm = "sliding_window" }},
]

[policies.api]
limiters = [{{ by = "ip", rules = ["5/1s"], algorithm = "gcra" }}]

[policies.export]
limiters = [{{ by = "user_id", rules = ["100/1m"], algorithm = "fixed_window" }}]

[[envoy.domains]]
name = "edge"
descriptors = [
  {{ key = "remote_address", rules = ["4/1m"] }},
  {{ key = "path", value = "/login", rules = ["3/30s"] }},
]
"#,
        record.display()
    )
}

fn plan_args(args: &[&str]) -> PlanArgs {
    let all = ["tollgate", "plan"].iter().chain(args);
    match Cli::try_parse_from(all).unwrap().command {
        Sub::Plan(args) => args,
        other => panic!("not a plan: {other:?}"),
    }
}

/// A small, fixed pseudo-random sequence (the same traffic every run).
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// What the server answered: admitted, and the wait it gave.
type Live = (bool, Option<u64>);

fn live_of(answer: &Value) -> Live {
    (
        answer["allowed"].as_bool().unwrap(),
        answer["retry_after_ms"].as_u64(),
    )
}

/// Sends 1,500 requests of every kind through the server on a manual clock (moved between
/// them by up to 4 s, to the microsecond) and returns what it answered, in order.
async fn live_traffic(server: &InProcess, clock: &ManualClock) -> Vec<Live> {
    let mut draw = Draw(7);
    let mut live = Vec::new();
    for _ in 0..1500 {
        clock.advance(Duration::from_micros(draw.below(4_000_000)));
        let ip = format!("203.0.113.{}", 1 + draw.below(6));
        let user = format!("u{}", draw.below(5));
        match draw.below(5) {
            0 | 1 => {
                let body = json!({ "policy": "sms", "identity": { "ip": ip, "user_id": user } });
                live.push(live_of(&post_in_process(server, "/v1/check", body).await));
            }
            2 => {
                let body = json!({ "checks": [
                    { "policy": "api", "identity": { "ip": ip } },
                    { "policy": "export", "identity": { "user_id": user }, "cost": 1 + draw.below(40) },
                ]});
                let answer = post_in_process(server, "/v1/checks", body).await;
                for result in answer["results"].as_array().unwrap() {
                    live.push(live_of(result));
                }
            }
            3 => {
                let body = json!({ "policy": "api", "identity": { "ip": ip } });
                live.push(live_of(&post_in_process(server, "/v1/check", body).await));
            }
            _ => {
                let path = ["/login", "/home"][draw.below(2) as usize];
                let request = RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![
                        RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "remote_address".into(),
                                value: ip,
                            }],
                            ..Default::default()
                        },
                        RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "path".into(),
                                value: path.into(),
                            }],
                            ..Default::default()
                        },
                    ],
                    hits_addend: 1 + u32::from(draw.below(4) == 0),
                };
                let response = server.should_rate_limit(request).await.unwrap();
                let over = response.overall_code == Code::OverLimit as i32;
                let wait = response
                    .statuses
                    .iter()
                    .filter(|s| s.code == Code::OverLimit as i32)
                    .filter_map(|s| s.duration_until_reset.as_ref())
                    .map(|d| (d.seconds as u64 * 1_000_000 + d.nanos as u64 / 1000).div_ceil(1000))
                    .max();
                live.push((!over, if over { wait } else { None }));
            }
        }
    }
    live
}

#[tokio::test]
async fn a_plan_of_the_record_decides_every_request_as_the_server_did() {
    let dir = TempDir::new();
    let record = dir.path().join("traffic.jsonl");
    let config_path = dir.write("tollgate.toml", &config_text(&record));
    let config = Config::load(&config_path).unwrap();
    let clock = ManualClock::new(Duration::from_secs(1_796_551_200));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let server = InProcess::with_store_and_clock(config, AnyStore::new(store), None, clock.clone());
    let live = live_traffic(&server, &clock).await;
    server.flush_record();
    let denied = live.iter().filter(|(allowed, _)| !allowed).count();
    assert!(
        denied > 150 && denied < live.len() - 150,
        "the traffic meets the limits often, and not always: {denied} of {} denied",
        live.len()
    );

    let decisions = dir.path().join("decisions.jsonl");
    let (config_arg, record_arg, decisions_arg) = (
        config_path.display().to_string(),
        record.display().to_string(),
        decisions.display().to_string(),
    );
    let planned = tollgated::plan(&plan_args(&[
        "--config",
        &config_arg,
        "--decisions",
        &decisions_arg,
        "--format",
        "json",
        &record_arg,
    ]))
    .unwrap();
    let report: Value = serde_json::from_str(&planned.output).unwrap();
    let replayed: Vec<Live> = std::fs::read_to_string(&decisions)
        .unwrap()
        .lines()
        .map(|line| live_of(&serde_json::from_str(line).unwrap()))
        .collect();
    assert_eq!(replayed.len(), live.len(), "one decision per request");
    for (i, (plan, server)) in replayed.iter().zip(&live).enumerate() {
        assert_eq!(plan, server, "request {i}: the plan and the server differ");
    }
    assert_eq!(report["requests"], live.len());
    assert_eq!(report["malformed"], 0);
    assert_eq!(report["newly_denied"], 0, "{report:#}");
    assert_eq!(report["newly_admitted"], 0, "{report:#}");
    let sms = report["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "sms")
        .unwrap();
    assert_eq!(sms["candidate"]["denied"], sms["baseline"]["denied"]);

    // A looser limit is seen: requests the server denied, the candidate admits.
    let looser = dir.write(
        "looser.toml",
        &config_text(&record).replace(r#"rules = ["2/1m", "5/1h"]"#, r#"rules = ["3/1m", "5/1h"]"#),
    );
    let planned = tollgated::plan(&plan_args(&[
        "--config",
        &looser.display().to_string(),
        "--format",
        "json",
        &record_arg,
    ]))
    .unwrap();
    let report: Value = serde_json::from_str(&planned.output).unwrap();
    assert!(report["newly_admitted"].as_u64().unwrap() > 0, "{report:#}");
    // And the same comparison, as two configurations side by side.
    let planned = tollgated::plan(&plan_args(&[
        "--config",
        &looser.display().to_string(),
        "--against",
        &config_arg,
        "--format",
        "json",
        &record_arg,
    ]))
    .unwrap();
    let against: Value = serde_json::from_str(&planned.output).unwrap();
    assert_eq!(against["newly_admitted"], report["newly_admitted"]);
    assert_eq!(against["newly_denied"], report["newly_denied"]);
}

const STRICT: &str = r#"
[policies.login]
limiters = [{ by = "ip", rules = ["3/1m"] }]
"#;

/// An nginx log of one address logging in every 5 seconds, another once a minute, and a line
/// that is not nginx's.
fn nginx_log() -> String {
    let mut log = String::new();
    for i in 0..60u32 {
        let (m, s) = (i * 5 / 60, i * 5 % 60);
        log.push_str(&format!(
            "198.51.100.7 - - [05/Dec/2026:10:{m:02}:{s:02} +0000] \"POST /login HTTP/1.1\" 200 12 \"-\" \"curl/8\"\n"
        ));
        if s == 0 {
            log.push_str(&format!(
                "192.0.2.1 - - [05/Dec/2026:10:{m:02}:00 +0000] \"POST /login HTTP/1.1\" 200 12 \"-\" \"app\"\n"
            ));
            log.push_str(&format!(
                "192.0.2.1 - - [05/Dec/2026:10:{m:02}:01 +0000] \"GET /home HTTP/1.1\" 200 12 \"-\" \"app\"\n"
            ));
        }
    }
    log.push_str("this line is not an access log line\n");
    log
}

#[test]
fn the_command_reports_and_fails_when_a_budget_is_exceeded() {
    let dir = TempDir::new();
    let config = dir.write("login.toml", STRICT);
    let log = dir.write("access.log", &nginx_log());
    let run = |budget: &str| {
        Command::new(binary())
            .args(["plan", "--config"])
            .arg(&config)
            .args([
                "--input",
                "nginx",
                "--policy",
                "login",
                "--where",
                "path=/login",
            ])
            .args(["--max-newly-denied", budget])
            .arg(&log)
            .output()
            .unwrap()
    };
    let out = run("10%");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    // 60 logins in 5 minutes from one address at 3 a minute: 45 denied of 65.
    assert!(text.contains("newly denied 45 "), "{text}");
    assert!(text.contains("ip=198.51.100.7"), "{text}");
    assert!(!text.contains("ip=192.0.2.1 "), "never denied: {text}");
    assert!(
        text.contains("access.log:71: expected nginx's combined format (9 fields), found 8 fields"),
        "{text}"
    );
    assert!(
        text.contains("budget max_newly_denied: 69.231% (limit 10.000%): EXCEEDED"),
        "{text}"
    );
    let out = run("70%");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A configuration that does not load is an error (exit 1), named.
    let bad = dir.write(
        "bad.toml",
        "[policies.login]\nlimiters = [{ by = \"ip\", rules = [\"3/1x\"] }]\n",
    );
    let out = Command::new(binary())
        .args(["plan", "--config"])
        .arg(&bad)
        .args(["--input", "nginx", "--policy", "login"])
        .arg(&log)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("bad.toml:2: policies.login.limiters[0].rules[0]"),
        "{error}"
    );
}

#[test]
fn synthetic_traffic_is_the_same_for_the_same_seed_and_shows_the_scraper() {
    let dir = TempDir::new();
    let config = dir.write("login.toml", STRICT).display().to_string();
    let args = |seed: &str| {
        plan_args(&[
            "--config",
            &config,
            "--synthetic",
            "scraper",
            "--rate",
            "2",
            "--duration",
            "10m",
            "--identities",
            "50",
            "--policy",
            "login",
            "--format",
            "json",
            "--seed",
            seed,
        ])
    };
    let one = tollgated::plan(&args("1")).unwrap().output;
    assert_eq!(one, tollgated::plan(&args("1")).unwrap().output);
    assert_ne!(one, tollgated::plan(&args("2")).unwrap().output);
    let report: Value = serde_json::from_str(&one).unwrap();
    // About 2,400 requests: half of them the scraper's, most of those denied.
    let requests = report["requests"].as_u64().unwrap();
    assert!((2_000..2_800).contains(&requests), "{requests}");
    assert_eq!(
        report["top_identities"][0]["identity"], "ip=203.0.113.66",
        "{report:#}"
    );
    assert!(report["newly_denied"].as_u64().unwrap() > requests / 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_html_report_works_in_a_real_browser() {
    let dir = TempDir::new();
    let config = dir.write(
        "login.toml",
        "[policies.login]\nlimiters = [{ by = \"user_id\", rules = [\"3/1m\"] }]\n",
    );
    // JSON lines, one identity named to attack the page.
    let mut lines = String::new();
    for i in 0..40u64 {
        for user in ["<script>window.pwned=1</script>", "bob"] {
            let ts = 1_796_551_200 + i * 3 + u64::from(user == "bob") * 10;
            lines.push_str(&json!({ "ts": ts, "user": user, "ip": "192.0.2.9" }).to_string());
            lines.push('\n');
        }
    }
    lines.push_str("{\"ts\": \"yesterday\"}\n");
    let traffic = dir.write("traffic.jsonl", &lines);
    let html = dir.path().join("report.html");
    let planned = tollgated::plan(&plan_args(&[
        "--config",
        &config.display().to_string(),
        "--input",
        "json",
        "--map",
        "time=ts",
        "--map",
        "user_id=user",
        "--map",
        "header.x-forwarded=ip",
        "--policy",
        "login",
        "--html",
        &html.display().to_string(),
        "--format",
        "json",
        &traffic.display().to_string(),
    ]))
    .unwrap();
    let report: Value = serde_json::from_str(&planned.output).unwrap();
    let denied = report["targets"][0]["candidate"]["denied"]
        .as_u64()
        .unwrap();
    assert!(denied > 0, "{report:#}");

    let driver = Chromedriver::start();
    let profile = TempDir::new();
    let browser = headless(&driver, &profile).await;
    browser
        .goto(&format!("file://{}", html.display()))
        .await
        .unwrap();
    wait_until(
        &browser,
        "the report is drawn",
        "document.querySelector('#timeline')",
    )
    .await;
    let value = |script: &'static str| {
        let browser = browser.clone();
        async move { browser.execute(script, vec![]).await.unwrap() }
    };
    // The timeline's bars add up to the candidate's denials.
    let drawn = value(
        "return [...document.querySelectorAll('#timeline rect.now')].reduce((n, r) => n + Number(r.dataset.value), 0);",
    )
    .await;
    assert_eq!(drawn, json!(denied));
    // The retry-after histogram holds every denial too.
    let waits = value(
        "return [...document.querySelectorAll('#retry-after rect.now')].reduce((n, r) => n + Number(r.dataset.value), 0);",
    )
    .await;
    assert_eq!(waits, json!(denied));
    // The identity that tried to script the page is shown as text, and ran nothing.
    assert_eq!(
        value("return window.pwned === undefined;").await,
        json!(true)
    );
    let names = value("return document.querySelector('#identities-table').innerText;").await;
    assert!(
        names
            .as_str()
            .unwrap()
            .contains("user_id=<script>window.pwned=1</script>"),
        "{names}"
    );
    // The malformed line is named; the page fetched nothing.
    let malformed = value("return document.querySelector('#malformed-lines').innerText;").await;
    assert!(malformed.as_str().unwrap().contains("81"), "{malformed}");
    assert_eq!(
        value("return performance.getEntriesByType('resource').length;").await,
        json!(0)
    );
    browser.close().await.unwrap();
}

/// A record of hashed identities keeps no address or user id, and still replays exactly: the
/// addresses keep their prefixes, so a /24 limiter counts them as it counted the traffic.
#[tokio::test]
async fn a_hashed_record_replays_exactly_and_names_nobody() {
    let dir = TempDir::new();
    let record = dir.path().join("hashed.jsonl");
    // A variable every process has holds the key: long enough, and no test needs to set one.
    let text = format!(
        r#"
[record]
path = "{}"
identities = "hashed"
hash_key_env = "PATH"

[policies.signup]
limiters = [
  {{ by = "ip", ipv4_prefix = 24, rules = ["4/1m"] }},
  {{ by = "user_id", rules = ["2/1m"] }},
]
"#,
        record.display()
    );
    let config_path = dir.write("hashed.toml", &text);
    let clock = ManualClock::new(Duration::from_secs(1_796_551_200));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let server = InProcess::with_store_and_clock(
        Config::load(&config_path).unwrap(),
        AnyStore::new(store),
        None,
        clock.clone(),
    );
    let mut draw = Draw(11);
    let mut live = Vec::new();
    for _ in 0..400 {
        clock.advance(Duration::from_millis(draw.below(6000)));
        let ip = format!("198.51.{}.{}", 100 + draw.below(2), 1 + draw.below(200));
        let body = json!({ "policy": "signup", "identity": { "ip": ip, "user_id": format!("mail{}@example.com", draw.below(8)) } });
        live.push(live_of(&post_in_process(&server, "/v1/check", body).await));
    }
    server.flush_record();
    let written = std::fs::read_to_string(&record).unwrap();
    assert!(
        !written.contains("198.51.10") && !written.contains("@example.com"),
        "{written}"
    );
    assert!(live.iter().any(|(allowed, _)| !allowed) && live.iter().any(|(allowed, _)| *allowed));

    let decisions = dir.path().join("decisions.jsonl");
    let planned = tollgated::plan(&plan_args(&[
        "--config",
        &config_path.display().to_string(),
        "--decisions",
        &decisions.display().to_string(),
        "--format",
        "json",
        &record.display().to_string(),
    ]))
    .unwrap();
    let report: Value = serde_json::from_str(&planned.output).unwrap();
    assert_eq!(report["newly_denied"], 0, "{report:#}");
    assert_eq!(report["newly_admitted"], 0, "{report:#}");
    let replayed: Vec<Live> = std::fs::read_to_string(&decisions)
        .unwrap()
        .lines()
        .map(|line| live_of(&serde_json::from_str(line).unwrap()))
        .collect();
    assert_eq!(replayed, live);
}

/// An Envoy YAML configuration is a candidate like a TOML one: an access log's lines become
/// descriptors of `--descriptor` entries.
#[test]
fn an_envoy_yaml_candidate_replays_access_logs_as_descriptors() {
    let dir = TempDir::new();
    let yaml = dir.write(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 3\n",
    );
    let log = dir.write("access.log", &nginx_log());
    let planned = tollgated::plan(&plan_args(&[
        "--config",
        &yaml.display().to_string(),
        "--input",
        "nginx",
        "--where",
        "path=/login",
        "--domain",
        "edge",
        "--descriptor",
        "remote_address=remote_addr",
        "--format",
        "json",
        &log.display().to_string(),
    ]))
    .unwrap();
    let report: Value = serde_json::from_str(&planned.output).unwrap();
    let edge = &report["targets"][0];
    assert_eq!(edge["name"], "edge");
    assert_eq!(edge["kind"], "envoy domain");
    // The reference's fixed minute windows: 3 of the 12 logins of each minute pass.
    assert_eq!(edge["candidate"]["denied"], 45, "{report:#}");
    assert_eq!(edge["limiters"][0]["name"], "remote_address");
    assert_eq!(
        report["top_identities"][0]["identity"],
        "remote_address=198.51.100.7"
    );
}

/// The server binary records when the environment asks it to, with hashed identities, and
/// does not start when the hashing key is missing.
#[tokio::test]
async fn the_server_records_when_the_environment_switches_it_on() {
    let dir = TempDir::new();
    let record = dir.path().join("live.jsonl").display().to_string();
    let server = Server::start_with_env(
        STRICT,
        &[
            ("TOLLGATE_RECORD_PATH", &record),
            ("TOLLGATE_RECORD_IDENTITIES", "hashed"),
            (
                "TOLLGATE_RECORD_HASH_KEY",
                "a key of thirty-two bytes, or so",
            ),
        ],
    );
    for _ in 0..5 {
        server.check("login", json!({ "ip": "203.0.113.5" })).await;
    }
    // The writer flushes once its queue is empty: wait for the five lines.
    let deadline = std::time::Instant::now() + HANG;
    let lines = loop {
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        if text.lines().count() >= 5 || std::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines.lines().count(), 5, "{lines}");
    assert!(!lines.contains("203.0.113.5"), "{lines}");
    let allowed: Vec<bool> = lines
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["allowed"]
                .as_bool()
                .unwrap()
        })
        .collect();
    assert_eq!(allowed, [true, true, true, false, false]);
    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains("tollgate_record_lines_total{result=\"written\"} 5"),
        "{metrics}"
    );

    let config = dir.write("login.toml", STRICT);
    let out = Command::new(binary())
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&config)
        .env("TOLLGATE_RECORD_PATH", &record)
        .env("TOLLGATE_RECORD_IDENTITIES", "hashed")
        .env_remove("TOLLGATE_RECORD_HASH_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("environment variable TOLLGATE_RECORD_HASH_KEY (record.hash_key_env) must hold a key of at least 16 bytes"),
        "{error}"
    );
}

/// Lines out of time order are replayed at the latest time seen and counted; a time outside
/// 2000-2100 is a malformed line, not a clock moved to another century; traffic with no
/// request to replay is an error, not a plan that passes its budgets.
#[test]
fn times_out_of_order_or_out_of_range_are_counted_not_followed() {
    let dir = TempDir::new();
    let config = dir.write("login.toml", STRICT).display().to_string();
    let mut lines = String::new();
    for t in [10.5, 9.8, 11.0, 99_999_999_999.0, 11.2, 11.3, 11.4] {
        let t = 1_796_551_200.0 + t;
        lines.push_str(&json!({ "time": t, "ip": "192.0.2.7" }).to_string());
        lines.push('\n');
    }
    let traffic = dir.write("t.jsonl", &lines).display().to_string();
    let planned = tollgated::plan(&plan_args(&[
        "--config", &config, "--input", "json", "--policy", "login", "--format", "json", &traffic,
    ]))
    .unwrap();
    let report: Value = serde_json::from_str(&planned.output).unwrap();
    assert_eq!(report["requests"], 6);
    assert_eq!(report["out_of_order"], 1);
    assert_eq!(report["malformed"], 1);
    assert!(
        report["malformed_lines"][0]["error"]
            .as_str()
            .unwrap()
            .contains("not between the years 2000 and 2100"),
        "{report:#}"
    );
    // Three a minute: the fourth, fifth and sixth are denied, and all of them are drawn.
    assert_eq!(report["targets"][0]["candidate"]["denied"], 3);
    let drawn: u64 = report["timeline"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["candidate"].as_u64().unwrap())
        .sum();
    assert_eq!(drawn, 3);

    let garbage = dir
        .write("garbage.jsonl", "not json\n")
        .display()
        .to_string();
    let error = tollgated::plan(&plan_args(&[
        "--config", &config, "--input", "json", "--policy", "login", &garbage,
    ]))
    .unwrap_err();
    assert_eq!(
        error,
        format!(
            "no request to replay: 1 lines malformed, 0 skipped; the first: {garbage}:1: not JSON: expected ident at line 1 column 2"
        )
    );
    // A record names its own policies: flags for other inputs are refused, not ignored.
    let error = tollgated::plan(&plan_args(&[
        "--config",
        &config,
        "--where",
        "policy=sms",
        &garbage,
    ]))
    .unwrap_err();
    assert!(error.starts_with("--map, --where, --policy"), "{error}");
}
