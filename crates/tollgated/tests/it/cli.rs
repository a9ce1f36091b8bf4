//! The command line: `check-config` exit codes and messages, `serve` refusing a bad file.

use std::process::Command;

use crate::support::{TempDir, binary};

fn check_config(text: &str) -> (i32, String, String) {
    let dir = TempDir::new();
    let path = dir.write("tollgate.toml", text);
    let out = Command::new(binary())
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).replace(&*dir.path().to_string_lossy(), "DIR"),
    )
}

#[test]
fn check_config_prints_the_policies_of_a_valid_file() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/tollgate.toml"
    ))
    .unwrap();
    let (code, stdout, stderr) = check_config(&text);
    assert_eq!(code, 0, "{stderr}");
    for needle in [
        "policy sms_code",
        "limiter ip by ip (IPv4 /32, IPv6 /64): 1/1m sliding_log, 10/1h sliding_log, 60/1d sliding_log; blocklist 10m",
        "limiter user_id by user_id: 20/1d sliding_log",
        "bypass ip 10.0.0.0/8, user_id \"admin\"",
        "duplicate by args for 5s",
        "envoy domain edge",
        "path=/login: 5/1m sliding_log (shadow)",
    ] {
        assert!(stdout.contains(needle), "{needle:?} not in\n{stdout}");
    }
    // `--config FILE`, as `serve` takes it, checks the same file.
    let dir = TempDir::new();
    let path = dir.write("tollgate.toml", &text);
    for flag in ["--config", "-c"] {
        let out = Command::new(binary())
            .args(["check-config", flag])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let checked = String::from_utf8_lossy(&out.stdout).into_owned();
        // The same summary, after the line naming the file.
        let summary = |text: &str| text.split_once('\n').map(|(_, rest)| rest.to_owned());
        assert_eq!(summary(&checked), summary(&stdout), "{flag}");
    }
}

#[test]
fn check_config_names_file_line_field_and_expectation() {
    let cases = [
        (
            "[policies.sms]\nlimiters = [\n  { by = \"ip\", rules = [\"1/1m\", \"10/1x\"] },\n]\n",
            r#"error: DIR/tollgate.toml:3: policies.sms.limiters[0].rules[1]: "10/1x": unknown unit "x" (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"#,
        ),
        (
            "[store]\nurl = \"memory://\"\non_eror = \"deny\"\n",
            "error: DIR/tollgate.toml:3: store.on_eror: unknown field `on_eror`, expected one of `url`, `on_error`, `timeout`, `prefix`",
        ),
        (
            "[store]\non_error = \"maybe\"\n",
            "error: DIR/tollgate.toml:2: store.on_error: unknown variant `maybe`, expected one of `allow`, `deny`, `local`",
        ),
        (
            "[policies.a]\nlimiters = [\n  { by = \"ip\", rules = [\"1/1m\"] },\n  { by = \"ip\", rules = [\"5/1h\"] },\n]\n",
            r#"error: DIR/tollgate.toml:4: policies.a.limiters[1]: two limiters are named "ip"; give one a distinct `name` (they would share counters)"#,
        ),
        (
            "[policies.a]\nlimiters = [{ by = \"cookie\", rules = [\"1/1m\"] }]\n",
            r#"error: DIR/tollgate.toml:2: policies.a.limiters[0].by: unknown dimension "cookie" (use global, ip, user_id, user_name, header:<name> or arg:<name>)"#,
        ),
        (
            "[policies.a]\nlimiters = [{ by = \"ip\", rules = [\"1/1m\"] }]\nbypass = { ips = [\"10.0.0.0/33\"] }\n",
            "error: DIR/tollgate.toml:3: policies.a.bypass.ips[0]: \"10.0.0.0/33\": ",
        ),
        (
            "[server]\nhttp = \"localhost\"\n",
            "error: DIR/tollgate.toml:2: server.http: \"localhost\": invalid socket address syntax",
        ),
        (
            "[store]\nurl = \"mysql://admin:hunter2@db\"\n",
            r#"error: DIR/tollgate.toml:2: store.url: unknown store scheme "mysql""#,
        ),
        (
            "[[envoy.domains]]\nname = \"edge\"\ndescriptors = [{ key = \"a\", rules = [\"1/1m\"], shadw = true }]\n",
            "error: DIR/tollgate.toml:3: envoy.domains[0].descriptors[0].shadw: unknown field `shadw`",
        ),
        (
            "[policies.a]\nlimiters = [{ by = \"ip\", rules = [\"60/1d@Europe/Berlinn\"] }]\n",
            r#"error: DIR/tollgate.toml:2: policies.a.limiters[0].rules[0]: "60/1d@Europe/Berlinn": unknown time zone "Europe/Berlinn" (an IANA name, e.g. Europe/Berlin or UTC)"#,
        ),
        (
            "[policies.a]\nlimiters = [{ by = \"ip\", rules = [\"60/1d@UTC\"], algorithm = \"gcra\" }]\n",
            r#"error: DIR/tollgate.toml:2: policies.a.limiters[0].algorithm: rule 60/1d@UTC is a calendar window, counted as a fixed window; it cannot be gcra"#,
        ),
        (
            "[policies.a]\nlimiters = [{ by = \"ip\", concurrent = 3, rules = [\"1/1m\"] }]\n",
            "error: DIR/tollgate.toml:2: policies.a.limiters[0].concurrent: a concurrency limiter has no `rules`: give rate rules a limiter of their own",
        ),
        (
            "[policies.a]\nlimiters = [{ by = \"ip\", concurrent = 0 }]\n",
            "error: DIR/tollgate.toml:2: policies.a.limiters[0].concurrent: ",
        ),
        (
            "[[envoy.domains]]\nname = \"edge\"\ndescriptors = [{ key = \"a\", rules = [\"3/1m concurrent\"] }]\n",
            "error: DIR/tollgate.toml:3: envoy.domains[0].descriptors[0].rules[0]: 3/1m concurrent is a concurrency limit; Envoy's rate-limit API has no release",
        ),
        ("[server\n", "error: DIR/tollgate.toml:1: "),
    ];
    for (text, expected) in cases {
        let (code, stdout, stderr) = check_config(text);
        assert_eq!(code, 1, "{text}\nstdout: {stdout}");
        assert!(
            stderr.starts_with(expected),
            "{text}\nexpected: {expected}\ngot:      {stderr}"
        );
        // A store URL's password is never printed, however mistyped the URL.
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

#[test]
fn a_missing_file_and_help() {
    let out = Command::new(binary())
        .args(["check-config", "/nonexistent/tollgate.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/tollgate.toml: cannot read the file"),
        "{stderr}"
    );

    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["check-config", "--help"],
    ] {
        let out = Command::new(binary()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("Usage: tollgate"), "{stdout}");
    }
}

#[test]
fn serve_refuses_an_invalid_file() {
    let dir = TempDir::new();
    let path = dir.write("tollgate.toml", "[policies.a]\nlimiters = []\n");
    let out = Command::new(binary())
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("policies.a.limiters: a policy needs at least one limiter"),
        "{stderr}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    use std::io::{BufRead, BufReader};
    let dir = TempDir::new();
    let path = dir.write(
        "tollgate.toml",
        "[policies.a]\nlimiters = [{ by = \"ip\", rules = [\"1/1m\"] }]\n",
    );
    let mut child = Command::new(binary())
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .args([
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut listening = None;
    for line in BufReader::new(stderr).lines().take(10) {
        let line = line.unwrap();
        let value: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if value["fields"]["message"] == "HTTP API listening" {
            listening = value["fields"]["addr"].as_str().map(str::to_owned);
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let addr = listening.expect("a JSON 'HTTP API listening' line");
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
}

/// Every section's mistake is reported, in file order, not only the first (a text that does
/// not read as TOML of the expected types stops at its first error).
#[test]
fn check_config_reports_every_mistake_in_file_order() {
    let (code, _, stderr) = check_config(
        "[server]\nmax_batch = 0\n\n\
         [policies.\"a b\"]\nlimiters = [{ by = \"ip\", rules = [\"1/1m\"] }]\n\n\
         [policies.c]\nlimiters = [{ by = \"ip\", rules = [\"1/1m\"], concurrent = 0 }]\n\n\
         [[envoy.domains]]\nname = \"\"\ndescriptors = []\n",
    );
    assert_eq!(code, 1);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    for (line, start) in lines.iter().zip([
        "error: DIR/tollgate.toml:2: server.max_batch",
        "error: DIR/tollgate.toml:4: policies.a b",
        "error: DIR/tollgate.toml:8: policies.c.limiters[0]",
        "error: DIR/tollgate.toml:10: envoy.domains[0]",
    ]) {
        assert!(line.starts_with(start), "{start}\n{stderr}");
    }
}
