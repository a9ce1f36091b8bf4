//! `TOLLGATE_SERVER_<FIELD>` and `TOLLGATE_STORE_<FIELD>` replace the file's values: shown by
//! `check-config`, used by `serve`, and named in errors.

use std::process::Command;

use crate::support::{Server, TempDir, binary};

const FILE: &str = r#"
[server]
max_batch = 10

[store]
prefix = "file"

[policies.a]
limiters = [{ by = "ip", rules = ["1/1m"] }]
"#;

fn check_config(env: &[(&str, &str)]) -> (i32, String, String) {
    let dir = TempDir::new();
    let path = dir.write("tollgate.toml", FILE);
    let out = Command::new(binary())
        .arg("check-config")
        .arg(&path)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_shows_the_variables_in_force() {
    let (code, stdout, stderr) = check_config(&[
        ("TOLLGATE_STORE_PREFIX", "fromenv"),
        ("TOLLGATE_STORE_ON_ERROR", "deny"),
        ("TOLLGATE_SERVER_DASHBOARD", "false"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    for needle in [
        "on_error = deny",
        "prefix = fromenv",
        "dashboard off",
        "from the environment: TOLLGATE_SERVER_DASHBOARD, TOLLGATE_STORE_ON_ERROR, TOLLGATE_STORE_PREFIX",
    ] {
        assert!(stdout.contains(needle), "{needle:?} not in\n{stdout}");
    }

    let (code, stdout, stderr) = check_config(&[("TOLLGATE_SERVER_MAX_BATCH", "0")]);
    assert_eq!(code, 1, "{stdout}");
    assert_eq!(
        stderr.trim(),
        "error: TOLLGATE_SERVER_MAX_BATCH: server.max_batch: the batch size limit must be at least 1"
    );
}

#[tokio::test]
async fn serve_uses_them() {
    // The test server passes its own --http; max_batch shows the variable is in force.
    let server = Server::start_with_env(FILE, &[("TOLLGATE_SERVER_MAX_BATCH", "1")]);
    let check = serde_json::json!({ "policy": "a", "identity": { "ip": "192.0.2.1" } });
    let (status, body) = server
        .post(
            "/v1/checks",
            serde_json::json!({ "checks": [check, check] }),
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("at most 1 checks"),
        "{body}"
    );
}
