//! A local Sentinel deployment: one primary, one replica and three sentinels (quorum 2) on
//! free loopback ports, optionally with TLS everywhere and a password on the sentinels.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::RedisServer;
use crate::cluster::{Auth, Reply, command, free_port, info_field, is_up};
use crate::server::tls_args;

const MASTER_NAME: &str = "tollgate";
/// How long [`RedisSentinelSetBuilder::start`] waits for the sentinels to see everyone.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// A real Sentinel deployment on `127.0.0.1`: a primary, its replica, and three sentinels
/// that watch them under the name [`master_name`](Self::master_name) with quorum 2, a 1 s
/// `down-after-milliseconds` and a 3 s `failover-timeout`, so that a killed primary is
/// replaced within seconds.
///
/// [`builder`](Self::builder) adds TLS on every process ([`RedisSentinelSetBuilder::tls`])
/// and a password on the sentinels ([`RedisSentinelSetBuilder::sentinel_password`]).
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
    /// Each data server's TLS port, in the order of `servers`; empty without TLS.
    tls_ports: Vec<u16>,
    sentinels: Vec<SentinelProcess>,
    /// What the kit sends before its own commands to the data servers.
    auth: Auth,
    /// What the kit sends before its own commands to the sentinels.
    sentinel_auth: Auth,
}

/// Configures a [`RedisSentinelSet`] before starting it; from [`RedisSentinelSet::builder`].
///
/// ```no_run
/// use tollgate_testkit::RedisSentinelSet;
///
/// let set = RedisSentinelSet::builder()
///     .tls("certs/server.crt", "certs/server.key", "certs/ca.crt")
///     .sentinel_password("s3cret")
///     .start();
/// // "rediss+sentinel://localhost:<tls port>,.../tollgate"; the password goes in the query.
/// let url = format!("{}?sentinel_password=s3cret", set.tls_url("localhost").unwrap());
/// # let _ = url;
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisSentinelSetBuilder {
    tls: Option<[String; 3]>,
    tls_auth_clients: bool,
    sentinel_password: Option<String>,
}

impl RedisSentinelSetBuilder {
    /// Also serve TLS on a port of each data server's and each sentinel's own (next to the
    /// plain one, which the kit keeps for its own commands), with this certificate and key
    /// (PEM files) and this CA for peers. Everything between the processes then runs over
    /// TLS (`tls-replication`): the replica replicates from the primary's TLS port, the
    /// sentinels watch the data servers and talk to each other at their TLS ports, so every
    /// address a sentinel hands out (the primary, the replicas, the other sentinels) is a TLS
    /// port. The certificate must name `127.0.0.1`, the address the sentinels hand out. See
    /// [`RedisSentinelSet::tls_url`].
    pub fn tls(
        mut self,
        cert_file: impl Into<String>,
        key_file: impl Into<String>,
        ca_file: impl Into<String>,
    ) -> Self {
        self.tls = Some([cert_file.into(), key_file.into(), ca_file.into()]);
        self
    }

    /// Whether TLS clients must present a certificate signed by the CA (`tls-auth-clients`;
    /// default `false`). When `true`, the data servers and sentinels present their own
    /// certificate to each other as client certificate, so it must not have an
    /// `extendedKeyUsage` that leaves out `clientAuth`. Only matters with [`tls`](Self::tls).
    pub fn tls_auth_clients(mut self, required: bool) -> Self {
        self.tls_auth_clients = required;
        self
    }

    /// Makes every sentinel require `password` from its clients (`requirepass`), on the plain
    /// and the TLS port; the sentinels authenticate to each other with it
    /// (`sentinel sentinel-pass`), and the kit with its own commands. The data servers are
    /// not affected (see [`RedisSentinelSet::require_password`]).
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(password.into());
        self
    }

    /// Starts one data server, with `tls_port` if TLS is on, replicating from `replica_of`.
    fn start_server(&self, tls_port: Option<u16>, replica_of: Option<u16>) -> RedisServer {
        // Replicas sync at once instead of waiting 5 s for more replicas to come.
        let mut builder = RedisServer::builder().args(["--repl-diskless-sync-delay", "0"]);
        if let (Some([cert, key, ca]), Some(port)) = (&self.tls, tls_port) {
            builder = builder
                .args(tls_args(port, cert, key, ca, self.tls_auth_clients))
                .args(["--tls-replication", "yes"]);
        }
        if let Some(primary) = replica_of {
            builder = builder.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
        }
        builder.start()
    }

    /// Starts the primary, the replica and three sentinels, and waits until every sentinel
    /// names the primary, knows the replica and the two other sentinels, and the replica is
    /// in sync.
    ///
    /// # Panics
    ///
    /// If `redis-server` is missing, a process does not start (e.g. a certificate file cannot
    /// be read), or the deployment does not settle within 30 s.
    pub fn start(self) -> RedisSentinelSet {
        let auth_clients = if self.tls_auth_clients { "yes" } else { "no" };
        let tls_ports: Vec<u16> = match self.tls {
            Some(_) => (0..2)
                .map(|_| {
                    free_port().unwrap_or_else(|e| panic!("tollgate-testkit: no free port: {e}"))
                })
                .collect(),
            None => Vec::new(),
        };
        let primary = self.start_server(tls_ports.first().copied(), None);
        // With TLS, the primary as the others reach it: at its TLS port.
        let primary_port = tls_ports.first().copied().unwrap_or(primary.port());
        let replica = self.start_server(tls_ports.get(1).copied(), Some(primary_port));
        let mut conf = String::new();
        if let Some([cert, key, ca]) = &self.tls {
            for (name, value) in [
                ("tls-cert-file", cert.as_str()),
                ("tls-key-file", key),
                ("tls-ca-cert-file", ca),
                ("tls-auth-clients", auth_clients),
                ("tls-replication", "yes"),
            ] {
                let _ = writeln!(conf, "{name} {}", quote(value));
            }
        }
        if let Some(password) = &self.sentinel_password {
            let _ = writeln!(conf, "requirepass {}", quote(password));
            let _ = writeln!(conf, "sentinel sentinel-pass {}", quote(password));
        }
        let sentinel_auth = Auth {
            password: self.sentinel_password,
        };
        let sentinels = (0..3)
            .map(|_| {
                SentinelProcess::start(primary_port, self.tls.is_some(), &conf, &sentinel_auth)
            })
            .collect();
        let set = RedisSentinelSet {
            servers: vec![primary, replica],
            tls_ports,
            sentinels,
            auth: Auth::default(),
            sentinel_auth,
        };
        set.wait(FORM_TIMEOUT, "settle", |set| {
            set.check_settled(primary_port)
        });
        set
    }
}

impl RedisSentinelSet {
    /// Starts a set with the default settings (plain TCP, no passwords); the same as
    /// `RedisSentinelSet::builder().start()`, see [`RedisSentinelSetBuilder::start`].
    ///
    /// # Panics
    ///
    /// If `redis-server` is missing or the deployment does not settle within 30 s.
    pub fn start() -> RedisSentinelSet {
        RedisSentinelSet::builder().start()
    }

    /// A builder for a set with TLS or a sentinel password.
    pub fn builder() -> RedisSentinelSetBuilder {
        RedisSentinelSetBuilder::default()
    }

    /// The name the sentinels know the primary by.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// Every sentinel's URL at its plain port, `redis://127.0.0.1:<port>/` (without the
    /// sentinel password, if any).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect()
    }

    /// Every sentinel's TLS port; empty unless started with [`RedisSentinelSetBuilder::tls`].
    pub fn sentinel_tls_ports(&self) -> Vec<u16> {
        self.sentinels.iter().filter_map(|s| s.tls_port).collect()
    }

    /// The store URL naming every sentinel's plain port:
    /// `redis+sentinel://127.0.0.1:<port>,127.0.0.1:<port>,.../<master name>`.
    ///
    /// With [`RedisSentinelSetBuilder::tls`], the sentinels still answer on these ports, but
    /// the addresses they hand out are TLS ports: use [`tls_url`](Self::tls_url) instead.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", sentinels.join(","))
    }

    /// The TLS store URL naming every sentinel's TLS port by `host`:
    /// `rediss+sentinel://<host>:<tls port>,.../<master name>`; `None` unless started with
    /// [`RedisSentinelSetBuilder::tls`].
    ///
    /// The URL carries no password: with [`RedisSentinelSetBuilder::sentinel_password`], the
    /// caller appends `?sentinel_password=<password>` (percent-encoded) itself.
    pub fn tls_url(&self, host: &str) -> Option<String> {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| Some(format!("{host}:{}", s.tls_port?)))
            .collect::<Option<_>>()?;
        Some(format!(
            "rediss+sentinel://{}/{MASTER_NAME}",
            sentinels.join(",")
        ))
    }

    /// The data servers: the first primary, then its replica (roles change on failover).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The data servers' TLS ports, in the order of [`servers`](Self::servers); empty unless
    /// started with [`RedisSentinelSetBuilder::tls`].
    pub fn tls_ports(&self) -> &[u16] {
        &self.tls_ports
    }

    /// The plain port of the primary as the first sentinel that answers names it (with TLS,
    /// the sentinels name its TLS port, which this maps back to the server's plain port; see
    /// [`primary_tls_port`](Self::primary_tls_port)).
    ///
    /// # Panics
    ///
    /// If no sentinel answers, or it names a port that is none of the data servers'.
    pub fn primary_port(&self) -> u16 {
        let named = self.named_primary();
        self.plain_port(named).unwrap_or_else(|| {
            panic!("tollgate-testkit: the sentinels name port {named}, no data server's")
        })
    }

    /// The TLS port of the primary as the first sentinel that answers names it; `None`
    /// unless started with [`RedisSentinelSetBuilder::tls`].
    ///
    /// # Panics
    ///
    /// If no sentinel answers.
    pub fn primary_tls_port(&self) -> Option<u16> {
        if self.tls_ports.is_empty() {
            return None;
        }
        Some(self.named_primary())
    }

    /// The port the first sentinel that answers names for the primary.
    fn named_primary(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|s| master_addr(s.port, &self.sentinel_auth))
            .unwrap_or_else(|| panic!("tollgate-testkit: no sentinel knows {MASTER_NAME}"))
    }

    /// The plain ports of the running data servers other than the primary the sentinels
    /// name.
    pub fn replica_ports(&mut self) -> Vec<u16> {
        let primary = self.primary_port();
        let mut ports = Vec::new();
        for server in &mut self.servers {
            if server.port() != primary && server.is_running() {
                ports.push(server.port());
            }
        }
        ports
    }

    /// Stops the data server on `port` without killing it (see [`RedisServer::pause`]).
    ///
    /// # Panics
    ///
    /// If no data server has that port.
    pub fn pause_server(&mut self, port: u16) {
        self.server_mut(port).pause();
    }

    /// Lets a data server stopped by [`pause_server`](Self::pause_server) go on.
    ///
    /// # Panics
    ///
    /// If no data server has that port.
    pub fn resume_server(&mut self, port: u16) {
        self.server_mut(port).resume();
    }

    /// Kills (SIGKILL) the current primary and returns its plain port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port();
        self.server_mut(port).kill();
        port
    }

    /// Starts the data server on `port` (its plain or its TLS port) again, with the same
    /// arguments (same ports, empty data); the sentinels make it a replica of the current
    /// primary.
    ///
    /// # Panics
    ///
    /// If no data server has that port, or it does not come back.
    pub fn restart_server(&mut self, port: u16) {
        self.server_mut(port).restart();
    }

    fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        let plain = self
            .plain_port(port)
            .unwrap_or_else(|| panic!("tollgate-testkit: no data server on port {port}"));
        self.servers
            .iter_mut()
            .find(|s| s.port() == plain)
            .unwrap_or_else(|| panic!("tollgate-testkit: no data server on port {port}"))
    }

    /// The plain port of the data server with the plain or TLS port `port`.
    fn plain_port(&self, port: u16) -> Option<u16> {
        self.servers
            .iter()
            .enumerate()
            .find(|(i, s)| s.port() == port || self.tls_ports.get(*i) == Some(&port))
            .map(|(_, s)| s.port())
    }

    /// The port the sentinels know the data server with plain port `plain` by: its TLS port
    /// with TLS, else `plain`.
    fn named_port(&self, plain: u16) -> u16 {
        self.servers
            .iter()
            .position(|s| s.port() == plain)
            .and_then(|i| self.tls_ports.get(i).copied())
            .unwrap_or(plain)
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
            .map(|port| self.named_port(port))
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
                &self.sentinel_auth,
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

    /// `primary` is the port the sentinels should name (the TLS port with TLS).
    fn check_settled(&self, primary: u16) -> Result<(), String> {
        for s in &self.sentinels {
            let fields = master_info(s.port, &self.sentinel_auth)?;
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

    /// `running` holds the ports the sentinels know the running data servers by.
    fn check_promoted(&self, running: &[u16]) -> Result<(), String> {
        let named: Vec<Option<u16>> = self
            .sentinels
            .iter()
            .map(|s| master_addr(s.port, &self.sentinel_auth))
            .collect();
        let Some(Some(port)) = named.first().copied() else {
            return Err("no sentinel answers".to_owned());
        };
        if named.iter().any(|n| *n != Some(port)) {
            return Err(format!("the sentinels disagree: {named:?}"));
        }
        if !running.contains(&port) {
            return Err(format!("the sentinels still name the dead primary {port}"));
        }
        let plain = self
            .plain_port(port)
            .ok_or_else(|| format!("the sentinels name {port}, no data server's port"))?;
        let role = info_field(plain, &self.auth, &["INFO", "replication"], "role")?;
        if role != "master" {
            return Err(format!("{port} is still a {role}"));
        }
        Ok(())
    }
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME`: the port of the primary a sentinel names.
fn master_addr(sentinel: u16, auth: &Auth) -> Option<u16> {
    match command(
        sentinel,
        auth,
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
fn master_info(sentinel: u16, auth: &Auth) -> Result<Vec<(String, String)>, String> {
    match command(sentinel, auth, &["SENTINEL", "MASTER", MASTER_NAME]) {
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

/// A config file value in double quotes, as `redis-server` reads them back.
fn quote(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One `redis-server --sentinel` child process with its own config file, which it rewrites.
#[derive(Debug)]
struct SentinelProcess {
    port: u16,
    tls_port: Option<u16>,
    dir: PathBuf,
    child: Child,
}

impl SentinelProcess {
    /// Starts a sentinel that watches the primary at `primary`, with `tls` a TLS port of its
    /// own, and `extra` (whole config lines) in its config file.
    fn start(primary: u16, tls: bool, extra: &str, auth: &Auth) -> SentinelProcess {
        let dir = temp_dir().unwrap_or_else(|e| panic!("tollgate-testkit: no temp dir: {e}"));
        let mut last = String::new();
        for _ in 0..10 {
            let port =
                || free_port().unwrap_or_else(|e| panic!("tollgate-testkit: no free port: {e}"));
            let (plain, tls_port) = (port(), tls.then(port));
            let conf = dir.join("sentinel.conf");
            let mut text = format!(
                "port {plain}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n",
                dir = quote(&dir.to_string_lossy())
            );
            if let Some(tls_port) = tls_port {
                let _ = writeln!(text, "tls-port {tls_port}");
            }
            text.push_str(extra);
            let _ = write!(
                text,
                "sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n"
            );
            fs::write(&conf, text).unwrap_or_else(|e| {
                panic!("tollgate-testkit: cannot write {}: {e}", conf.display())
            });
            let log_path = dir.join("sentinel.log");
            let mut child = spawn(&conf, &log_path);
            match wait_ready(&mut child, plain, auth) {
                Ok(()) => {
                    return SentinelProcess {
                        port: plain,
                        tls_port,
                        dir,
                        child,
                    };
                }
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

/// Spawns `redis-server <conf> --sentinel`, its output to `log_path`.
fn spawn(conf: &Path, log_path: &Path) -> Child {
    let log = File::create(log_path)
        .unwrap_or_else(|e| panic!("tollgate-testkit: cannot create the log: {e}"));
    let log_err = log
        .try_clone()
        .unwrap_or_else(|e| panic!("tollgate-testkit: cannot clone the log: {e}"));
    Command::new("redis-server")
        .arg(conf)
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
        })
}

/// Waits until the sentinel on `port` answers `PING`.
fn wait_ready(child: &mut Child, port: u16, auth: &Auth) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the sentinel exited ({status})"));
        }
        match command(port, auth, &["PING"]) {
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

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn config_values_are_quoted_as_redis_reads_them() {
        assert_eq!(quote("s3cret"), r#""s3cret""#);
        assert_eq!(quote(r#"a "b" \c d"#), r#""a \"b\" \\c d""#);
        assert_eq!(quote("x\ny"), r#""x\x0ay""#);
    }
}
