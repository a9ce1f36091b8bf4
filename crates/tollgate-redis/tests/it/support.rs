//! Plans, stores and raw connections for the tests.

use std::time::Duration;

use tollgate::{Algorithm, Rule};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;
pub(crate) use tollgate_testkit::plan::{CheckPlan, PlanBan, PlanExt, PlanLimiter};

/// A rule from its text form and an algorithm.
pub(crate) fn rule(text: &str, algorithm: Algorithm) -> Rule {
    text.parse::<Rule>().unwrap().with_algorithm(algorithm)
}

/// A limiter of a plan: its base key (hash tag included) and rules.
pub(crate) fn limiter(key: &str, rules: &[Rule]) -> PlanLimiter {
    PlanLimiter::new(key, rules)
}

/// A plan that consumes `cost`.
pub(crate) fn plan(cost: u64, limiters: &[PlanLimiter]) -> CheckPlan {
    CheckPlan::new(cost, true, limiters.to_vec())
}

/// A production store (Redis `TIME`) with a timeout generous enough for a busy test machine.
pub(crate) async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// A plain connection for inspecting the server. Its replies may take long (a test's own
/// bulk script on a loaded machine): no response timeout.
pub(crate) async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// Worker processes: this test binary run again, `count` times, on one test (`worker_test`)
/// with `env` set to `value` (the worker does nothing without it). Each prints lines the
/// parent waits for, and starts its work on "go".
pub(crate) struct Workers {
    children: Vec<std::process::Child>,
    lines: std::sync::mpsc::Receiver<(usize, String)>,
}

impl Workers {
    pub(crate) fn start(count: usize, worker_test: &str, env: &str, value: &str) -> Workers {
        use std::io::BufRead as _;

        let exe = std::env::current_exe().unwrap();
        let (tx, lines) = std::sync::mpsc::channel::<(usize, String)>();
        let mut children = Vec::new();
        for i in 0..count {
            let mut child = std::process::Command::new(&exe)
                .args([worker_test, "--exact", "--nocapture", "--test-threads=1"])
                .env(env, value)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let stdout = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    if tx.send((i, line)).is_err() {
                        return;
                    }
                }
            });
            children.push(child);
        }
        Workers { children, lines }
    }

    /// What follows `what` in every worker's first line holding it, in worker order, within a
    /// generous bound (a hang detector).
    pub(crate) fn wait_for(&self, what: &str) -> Vec<String> {
        let mut found = vec![None; self.children.len()];
        while found.iter().any(Option::is_none) {
            let (i, line) = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("a worker never said {what:?}"));
            if let Some(at) = line.find(what) {
                found[i] = Some(line[at + what.len()..].trim().to_owned());
            }
        }
        found.into_iter().flatten().collect()
    }

    /// Lets every worker start at once, so their work overlaps on the server.
    pub(crate) fn go(&mut self) {
        use std::io::Write as _;

        for child in &mut self.children {
            child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        }
    }

    /// Waits for every worker to exit; each must succeed.
    pub(crate) fn finish(self) {
        for mut child in self.children {
            assert!(child.wait().unwrap().success());
        }
    }
}

/// The body of one worker process of [`Workers`], in the test `Workers::start` names: with
/// `env` set (to the Redis URL), connects a store, says "`name` ready", waits for "go", runs
/// `work` and says "`name` " followed by what it answered. Without `env`, it does nothing: the
/// test run that is not a worker passes it by.
pub(crate) fn run_worker<F, Fut>(env: &str, name: &str, work: F)
where
    F: FnOnce(String, RedisStore) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    use std::io::Write as _;

    let Ok(url) = std::env::var(env) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::builder(&url)
            .timeout(Duration::from_secs(20))
            .build()
            .await
            .unwrap();
        println!("{name} ready");
        std::io::stdout().flush().unwrap();
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).unwrap();
        let said = work(url, store).await;
        println!("{name} {said}");
        std::io::stdout().flush().unwrap();
    });
}
