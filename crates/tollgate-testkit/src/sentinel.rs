//! A local Sentinel deployment: one primary, one replica and three sentinels (quorum 2) on
//! free loopback ports.

use std::fs::{self, File};
use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::RedisServer;
use crate::cluster::{Auth, Reply, command, free_port, info_field, is_up};

const MASTER_NAME: &str = "tollgate";
/// How long [`RedisSentinelSet::start`] waits for the sentinels to see everyone.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// A real Sentinel deployment on `127.0.0.1`: a primary, its replica, and three sentinels
/// that watch them under the name [`master_name`](Self::master_name) with quorum 2, a 1 s
/// `down-after-milliseconds` and a 3 s `failover-timeout`, so that a killed primary is
/// replaced within seconds.
///
/// Dropping the set kills every process and removes the sentinels' directories.
///
/// ```no_run
/// use tollgate_testkit::RedisSentinelSet;
///
/// let mut set = RedisSentinelSet::start();
/// let url = set.url(); // "redis+sentinel://127.0.0.1:<port>,.../tollgate"
/// set.kill_primary();
/// set.wait_for_failover(std::time::Duration::from_secs(30));
/// # let _ = url;
/// ```
#[derive(Debug)]
pub struct RedisSentinelSet {
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    auth: Auth,
}

impl RedisSentinelSet {
    /// Starts the primary, the replica and three sentinels, and waits until every sentinel
    /// knows the replica and the two other sentinels, and the replica is in sync.
    ///
    /// # Panics
    ///
    /// If `redis-server` is missing or the deployment does not settle within 30 s.
    pub fn start() -> RedisSentinelSet {
        // Replicas sync at once instead of waiting 5 s for more replicas to come.
        let sync_now = ["--repl-diskless-sync-delay", "0"];
        let primary = RedisServer::builder().args(sync_now).start();
        let replica = RedisServer::builder()
            .args(sync_now)
            .args(["--replicaof", "127.0.0.1", &primary.port().to_string()])
            .start();
        let primary_port = primary.port();
        let sentinels = (0..3)
            .map(|_| SentinelProcess::start(primary_port))
            .collect();
        let set = RedisSentinelSet {
            servers: vec![primary, replica],
            sentinels,
            auth: Auth::default(),
        };
        set.wait(FORM_TIMEOUT, "settle", |set| {
            set.check_settled(primary_port)
        });
        set
    }

    /// The name the sentinels know the primary by.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// Every sentinel's URL, `redis://127.0.0.1:<port>/`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect()
    }

    /// The store URL: `redis+sentinel://127.0.0.1:<port>,127.0.0.1:<port>,.../<master name>`.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", sentinels.join(","))
    }

    /// The data servers: the first primary, then its replica (roles change on failover).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The port of the primary as the first sentinel that answers sees it.
    ///
    /// # Panics
    ///
    /// If no sentinel answers.
    pub fn primary_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|s| master_addr(s.port))
            .unwrap_or_else(|| panic!("tollgate-testkit: no sentinel knows {MASTER_NAME}"))
    }

    /// Kills (SIGKILL) the current primary and returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port();
        self.server_mut(port).kill();
        port
    }

    /// Starts the data server on `port` again (same port, empty data); the sentinels make it
    /// a replica of the current primary.
    ///
    /// # Panics
    ///
    /// If no data server has that port, or it does not come back.
    pub fn restart_server(&mut self, port: u16) {
        self.server_mut(port).restart();
    }

    fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("tollgate-testkit: no data server on port {port}"))
    }

    /// Waits until every sentinel names the same running primary and that server says it is
    /// a primary, e.g. after [`kill_primary`](Self::kill_primary). Returns how long it waited.
    ///
    /// # Panics
    ///
    /// If that does not happen within `timeout` (a hang detector).
    pub fn wait_for_failover(&self, timeout: Duration) -> Duration {
        let running: Vec<u16> = self
            .servers
            .iter()
            .map(RedisServer::port)
            .filter(|&port| is_up(port, &self.auth))
            .collect();
        self.wait(timeout, "fail over", |set| set.check_promoted(&running))
    }

    /// Requires `password` from now on: on both data servers (`requirepass`, and `masterauth`
    /// so that replication goes on) and tells the sentinels (`auth-pass`).
    ///
    /// # Panics
    ///
    /// If a server or sentinel refuses.
    pub fn require_password(&mut self, password: &str) {
        for server in &mut self.servers {
            let port = server.port();
            for (name, value) in [("masterauth", password), ("requirepass", password)] {
                let reply = command(port, &self.auth, &["CONFIG", "SET", name, value]);
                assert!(
                    matches!(reply, Ok(Reply::Simple(_))),
                    "CONFIG SET {name} on {port}: {reply:?}"
                );
            }
        }
        self.auth.password = Some(password.to_owned());
        for s in &self.sentinels {
            let reply = command(
                s.port,
                &Auth::default(),
                &["SENTINEL", "SET", MASTER_NAME, "auth-pass", password],
            );
            assert!(
                matches!(reply, Ok(Reply::Simple(_))),
                "SENTINEL SET auth-pass on {}: {reply:?}",
                s.port
            );
        }
    }

    fn wait(
        &self,
        timeout: Duration,
        what: &str,
        ok: impl Fn(&Self) -> Result<(), String>,
    ) -> Duration {
        let start = Instant::now();
        loop {
            match ok(self) {
                Ok(()) => return start.elapsed(),
                Err(why) if start.elapsed() > timeout => {
                    panic!(
                        "tollgate-testkit: the sentinel set did not {what} within {timeout:?}: {why}"
                    )
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn check_settled(&self, primary: u16) -> Result<(), String> {
        for s in &self.sentinels {
            let fields = master_info(s.port)?;
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            if field("port") != Some(&primary.to_string()) {
                return Err(format!(
                    "sentinel {} names port {:?}",
                    s.port,
                    field("port")
                ));
            }
            if field("num-slaves") != Some("1") || field("num-other-sentinels") != Some("2") {
                return Err(format!(
                    "sentinel {} knows {:?} replicas and {:?} other sentinels",
                    s.port,
                    field("num-slaves"),
                    field("num-other-sentinels")
                ));
            }
        }
        let replica = self.servers[1].port();
        let link = info_field(
            replica,
            &self.auth,
            &["INFO", "replication"],
            "master_link_status",
        )?;
        if link != "up" {
            return Err(format!("replica {replica}: master_link_status:{link}"));
        }
        Ok(())
    }

    fn check_promoted(&self, running: &[u16]) -> Result<(), String> {
        let named: Vec<Option<u16>> = self.sentinels.iter().map(|s| master_addr(s.port)).collect();
        let Some(Some(port)) = named.first().copied() else {
            return Err("no sentinel answers".to_owned());
        };
        if named.iter().any(|n| *n != Some(port)) {
            return Err(format!("the sentinels disagree: {named:?}"));
        }
        if !running.contains(&port) {
            return Err(format!("the sentinels still name the dead primary {port}"));
        }
        let role = info_field(port, &self.auth, &["INFO", "replication"], "role")?;
        if role != "master" {
            return Err(format!("{port} is still a {role}"));
        }
        Ok(())
    }
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME`: the port of the primary a sentinel names.
fn master_addr(sentinel: u16) -> Option<u16> {
    match command(
        sentinel,
        &Auth::default(),
        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
    ) {
        Ok(Reply::Array(parts)) => match parts.get(1) {
            Some(Reply::Bulk(Some(port))) => port.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

/// `SENTINEL MASTER <name>` as field/value pairs.
fn master_info(sentinel: u16) -> Result<Vec<(String, String)>, String> {
    match command(
        sentinel,
        &Auth::default(),
        &["SENTINEL", "MASTER", MASTER_NAME],
    ) {
        Ok(Reply::Array(items)) => Ok(items
            .chunks(2)
            .filter_map(|kv| match kv {
                [Reply::Bulk(Some(k)), Reply::Bulk(Some(v))] => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect()),
        other => Err(format!("sentinel {sentinel}: SENTINEL MASTER: {other:?}")),
    }
}

/// One `redis-server --sentinel` child process with its own config file, which it rewrites.
#[derive(Debug)]
struct SentinelProcess {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl SentinelProcess {
    fn start(primary: u16) -> SentinelProcess {
        let dir = temp_dir().unwrap_or_else(|e| panic!("tollgate-testkit: no temp dir: {e}"));
        let mut last = String::new();
        for _ in 0..10 {
            let port =
                free_port().unwrap_or_else(|e| panic!("tollgate-testkit: no free port: {e}"));
            let conf = dir.join("sentinel.conf");
            fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
                     dir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 3000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.display()
                ),
            )
            .unwrap_or_else(|e| panic!("tollgate-testkit: cannot write {}: {e}", conf.display()));
            let log_path = dir.join("sentinel.log");
            let log = File::create(&log_path)
                .unwrap_or_else(|e| panic!("tollgate-testkit: cannot create the log: {e}"));
            let log_err = log
                .try_clone()
                .unwrap_or_else(|e| panic!("tollgate-testkit: cannot clone the log: {e}"));
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                .spawn()
                .unwrap_or_else(|e| match e.kind() {
                    io::ErrorKind::NotFound => panic!(
                        "redis-server not found on PATH: install it \
                         (Debian: apt-get install -y redis-server) or run scripts/test"
                    ),
                    _ => panic!("tollgate-testkit: cannot spawn a sentinel: {e}"),
                });
            let mut child = child;
            match wait_ready(&mut child, port) {
                Ok(()) => return SentinelProcess { port, dir, child },
                Err(why) => {
                    let log = fs::read_to_string(&log_path).unwrap_or_default();
                    last = format!("{why}; log:\n{log}");
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        let _ = fs::remove_dir_all(&dir);
        panic!("tollgate-testkit: no sentinel would start: {last}")
    }
}

/// Waits until the sentinel on `port` answers `PING`.
fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the sentinel exited ({status})"));
        }
        match command(port, &Auth::default(), &["PING"]) {
            Ok(Reply::Simple(pong)) if pong == "PONG" => return Ok(()),
            _ if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            other => return Err(format!("no PONG on {port}: {other:?}")),
        }
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn temp_dir() -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-sentinel-{}-{n}-{nanos}",
            std::process::id()
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
}
