//! One check is one EVALSHA, whatever the number of limiters and rules (invariant 3).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use tollgate::Algorithm;
use tollgate_testkit::RedisServer;

use crate::support::{CheckPlan, PlanExt, limiter, plan, raw, rule, store};

fn two_by_three() -> CheckPlan {
    plan(
        1,
        &[
            limiter(
                "rt:{a}",
                &[
                    rule("50/1m", Algorithm::SlidingLog),
                    rule("80/1h", Algorithm::FixedWindow),
                    rule("90/1h", Algorithm::Gcra),
                ],
            ),
            limiter(
                "rt:{b}",
                &[
                    rule("60/1m", Algorithm::SlidingLog),
                    rule("70/1h", Algorithm::SlidingLog),
                    rule("85/1d", Algorithm::FixedWindow),
                ],
            ),
        ],
    )
}

/// `calls=` of one command in `INFO commandstats`, 0 if it never ran.
fn calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Watches the server with `redis-cli monitor`; lines arrive on the receiver.
fn monitor(server: &RedisServer) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut child = Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli must be on PATH (it comes with redis-server)");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(first, "OK");
    (child, rx)
}

#[tokio::test]
async fn a_check_of_two_limiters_and_six_rules_is_one_evalsha() {
    const N: u64 = 25;
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;
    let p = two_by_three();

    let (mut watcher, lines) = monitor(&server);
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..N {
        assert!(store.check_plan(&p).await.unwrap().allowed);
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: String = redis::cmd("ECHO")
        .arg("tollgate-end-of-checks")
        .query_async(&mut conn)
        .await
        .unwrap();

    assert_eq!(calls(&info, "evalsha"), N, "{info}");
    assert_eq!(calls(&info, "eval"), 0, "{info}");
    assert_eq!(calls(&info, "script|load"), 0, "{info}");

    // What clients sent (script internals are shown as `[0 lua]`): N EVALSHA and nothing else.
    let mut sent = Vec::new();
    loop {
        let line = lines.recv_timeout(Duration::from_secs(10)).unwrap();
        if line.contains("tollgate-end-of-checks") {
            break;
        }
        if line.contains("[0 lua]") {
            continue;
        }
        let command = line
            .split_once("] \"")
            .and_then(|(_, rest)| rest.split('"').next())
            .unwrap_or(&line)
            .to_lowercase();
        sent.push(command);
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
    // The test's own inspection commands.
    sent.retain(|c| c != "config" && c != "info");
    assert_eq!(sent.len() as u64, N, "{sent:?}");
    assert!(sent.iter().all(|c| c == "evalsha"), "{sent:?}");
}

#[tokio::test]
async fn a_flushed_script_cache_is_reloaded_on_the_next_check() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let mut conn = raw(&server).await;
    let p = two_by_three();
    assert!(store.check_plan(&p).await.unwrap().allowed);

    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let verdict = store.check_plan(&p).await.unwrap();
    assert!(verdict.allowed);
    // The state survived the flush: the second admission shows in every rule.
    assert_eq!(verdict.rules[0].remaining, 48);
    assert_eq!(verdict.rules[5].remaining, 83);
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The EVALSHA failed with NOSCRIPT; EVAL with the source ran it and cached it again, on
    // the node that serves the keys (on a Cluster, no other node need be reachable).
    assert_eq!(calls(&info, "script|load"), 0, "{info}");
    assert_eq!(calls(&info, "evalsha"), 1, "{info}");
    let evalsha = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"));
    assert!(
        evalsha.is_some_and(|l| l.contains("failed_calls=1")),
        "{info}"
    );
    assert_eq!(calls(&info, "eval"), 1, "{info}");
    assert!(store.check_plan(&p).await.unwrap().allowed);
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(calls(&info, "evalsha"), 2, "{info}");
    assert_eq!(calls(&info, "eval"), 1, "{info}");
}
