//! Hot reload: a valid new file applies at once and keeps counters; an invalid one is
//! rejected and the old configuration stays.

use serde_json::json;

use crate::support::{Server, error_message, remaining};

const BEFORE: &str = r#"
[policies.a]
limiters = [{ by = "ip", rules = ["2/1h"] }]
"#;

const AFTER: &str = r#"
[policies.a]
limiters = [{ by = "ip", rules = ["2/1h"] }]

[policies.b]
limiters = [{ by = "ip", rules = ["1/1h"] }]
"#;

const INVALID: &str = r#"
[policies.a]
limiters = [{ by = "ip", rules = ["2/1h", "3/1y"] }]
"#;

fn ip(addr: &str) -> serde_json::Value {
    json!({ "ip": addr })
}

#[tokio::test]
async fn file_changes_reload_and_keep_counters() {
    let mut server = Server::start(BEFORE);
    let first = server.check("a", ip("192.0.2.1")).await;
    assert_eq!(remaining(&first, "ip", "2/1h"), 1);
    let (status, body) = server
        .post(
            "/v1/check",
            json!({ "policy": "b", "identity": ip("192.0.2.1") }),
        )
        .await;
    error_message(status, &body, 404);

    server.write_config(AFTER);
    server.wait_for_line("configuration reloaded", 1);
    // The new policy is there, and policy a's counter carried over.
    let b = server.check("b", ip("192.0.2.1")).await;
    assert_eq!(b["allowed"], true, "{b}");
    let second = server.check("a", ip("192.0.2.1")).await;
    assert_eq!(remaining(&second, "ip", "2/1h"), 0, "{second}");

    server.write_config(INVALID);
    let line = server.wait_for_line("configuration rejected", 1);
    assert!(
        line.contains(r#"policies.a.limiters[0].rules[1]: \"3/1y\": unknown unit \"y\""#)
            || line.contains(r#"policies.a.limiters[0].rules[1]: "3/1y": unknown unit "y""#),
        "{line}"
    );
    assert!(line.contains("tollgate.toml:3:"), "{line}");
    // The previous configuration stays in force: b exists, a still denies.
    let b = server.check("b", ip("192.0.2.1")).await;
    assert_eq!(b["allowed"], false, "{b}");
    let a = server.check("a", ip("192.0.2.1")).await;
    assert_eq!(a["allowed"], false, "{a}");

    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains(r#"tollgate_config_reloads_total{result="ok"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"tollgate_config_reloads_total{result="error"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn sighup_reloads() {
    let mut server = Server::start_with(BEFORE, &["--watch-interval", "0"]);
    server.check("a", ip("192.0.2.1")).await;
    server.write_config(AFTER);
    server.signal("HUP");
    server.wait_for_line("configuration reloaded", 1);
    assert_eq!(server.check("b", ip("192.0.2.1")).await["allowed"], true);
    let a = server.check("a", ip("192.0.2.1")).await;
    assert_eq!(remaining(&a, "ip", "2/1h"), 0, "{a}");

    server.write_config(INVALID);
    server.signal("HUP");
    server.wait_for_line("configuration rejected", 1);
    assert_eq!(server.check("b", ip("192.0.2.2")).await["allowed"], true);
    assert_eq!(server.count_lines("configuration reloaded"), 1);
}

#[tokio::test]
async fn settings_read_at_start_are_kept_and_the_change_is_logged() {
    let webhook = |port: u16| format!("[webhook]\nurl = \"http://127.0.0.1:{port}/hook\"\n");
    let mut server = Server::start(&format!("{}{BEFORE}", webhook(9)));
    server.write_config(&format!("{}{AFTER}", webhook(10)));
    server.wait_for_line("configuration reloaded", 1);
    let line = server.wait_for_line("[webhook] changed", 1);
    assert!(line.contains("after a restart"), "{line}");
    // The rest of the file applies at once.
    assert_eq!(server.check("b", ip("192.0.2.1")).await["allowed"], true);
}

/// `server.max_keep_for` applies after a restart: a reload that raises it does not let a
/// longer `keep_for` through (the engine would cut it to the bound in force).
#[tokio::test]
async fn a_raised_max_keep_for_applies_after_a_restart() {
    const GUARDED: &str = r#"
[policies.submit]
limiters = [{ by = "ip", rules = ["1000/1m"] }]
duplicate = { by = "args", ttl = "1h" }
"#;
    let mut server = Server::start(GUARDED);
    server.write_config(&format!("[server]\nmax_keep_for = \"2h\"\n{GUARDED}"));
    server.wait_for_line("configuration reloaded", 1);
    server.wait_for_line("[server] changed", 1);
    let (status, acquired) = server
        .post(
            "/v1/duplicate/acquire",
            json!({ "policy": "submit", "identity": ip("192.0.2.1"), "args": { "n": 1 } }),
        )
        .await;
    assert_eq!(status, 200, "{acquired}");
    let lease = acquired["lease"].as_str().expect("a lease");
    let complete =
        |keep_for: &str| json!({ "lease": lease, "response": "ok", "keep_for": keep_for });
    let (status, body) = server.post("/v1/duplicate/complete", complete("90m")).await;
    let detail = error_message(status, &body, 400);
    assert!(detail.contains("at most 1h"), "{detail}");
    let (status, body) = server.post("/v1/duplicate/complete", complete("1h")).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn sigterm_drains_and_exits_cleanly() {
    let mut server = Server::start(BEFORE);
    server.check("a", ip("192.0.2.1")).await;
    server.signal("TERM");
    let status = server.wait_exit();
    assert!(status.success(), "{status}\n{}", server.logs());
    assert_eq!(server.count_lines("stopped"), 1, "{}", server.logs());
}
