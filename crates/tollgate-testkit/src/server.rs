//! One standalone `redis-server` child process on a free loopback port.

use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const REDIS_SERVER: &str = "redis-server";
const NOT_FOUND: &str = "redis-server not found on PATH: install it \
    (Debian: apt-get install -y redis-server) or run scripts/test";
/// Fresh ports tried by [`RedisServerBuilder::start`] before giving up.
const PORT_ATTEMPTS: usize = 10;
const LOG_FILE: &str = "redis.log";

/// A real `redis-server` child process listening on `127.0.0.1` on a free port.
///
/// The server runs without persistence (`--save "" --appendonly no`) in its own temporary
/// directory. Dropping it kills the process and removes the directory.
///
/// ```no_run
/// use tollgate_testkit::RedisServer;
///
/// let mut server = RedisServer::start();
/// let url = server.url();
/// server.kill(); // connections to `url` now fail
/// server.restart(); // same port, empty data set
/// # let _ = url;
/// ```
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// A Cluster node's bus port, chosen with the port (and kept across restarts).
    bus_port: Option<u16>,
    dir: PathBuf,
    extra_args: Vec<OsString>,
    startup_timeout: Duration,
    child: Option<Child>,
}

/// Configures a [`RedisServer`] before starting it: extra `redis-server` arguments and the
/// startup timeout. Obtained from [`RedisServer::builder`].
///
/// ```no_run
/// use tollgate_testkit::RedisServer;
///
/// let server = RedisServer::builder()
///     .arg("--maxmemory")
///     .arg("10mb")
///     .start();
/// # let _ = server;
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisServerBuilder {
    extra_args: Vec<OsString>,
    startup_timeout: Duration,
    cluster_bus: bool,
}

impl Default for RedisServerBuilder {
    fn default() -> Self {
        Self {
            extra_args: Vec::new(),
            startup_timeout: Duration::from_secs(10),
            cluster_bus: false,
        }
    }
}

impl RedisServerBuilder {
    /// Appends one argument to the `redis-server` command line, after the kit's own
    /// (`--port`, `--bind`, `--save`, `--appendonly`, `--dir`, `--protected-mode`), so it can
    /// override them, e.g. `.arg("--appendonly").arg("yes")`.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.extra_args.push(arg.as_ref().to_owned());
        self
    }

    /// Appends several arguments, as [`arg`](Self::arg) does.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.extra_args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// A Cluster node: its bus port (`--cluster-port`) is chosen free with its port, again at
    /// each attempt, so that a bus port another process took meanwhile is not tried twice.
    pub(crate) fn cluster_bus(mut self) -> Self {
        self.cluster_bus = true;
        self
    }

    /// How long to wait for the server to answer `PING` after each (re)start. Default 10 s.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Starts the server on a free loopback port and waits until it answers `PING`.
    ///
    /// If another process takes the chosen port first, a new port is tried.
    ///
    /// # Panics
    ///
    /// If `redis-server` is not on `PATH`, if it exits or does not answer within the startup
    /// timeout (the message includes its log), or if no free port could be used.
    pub fn start(self) -> RedisServer {
        let dir = create_temp_dir()
            .unwrap_or_else(|e| panic!("tollgate-testkit: cannot create a temporary dir: {e}"));
        let mut server = RedisServer {
            port: 0,
            bus_port: None,
            dir,
            extra_args: self.extra_args,
            startup_timeout: self.startup_timeout,
            child: None,
        };
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port()
                .unwrap_or_else(|e| panic!("tollgate-testkit: cannot find a free port: {e}"));
            if self.cluster_bus {
                server.bus_port =
                    Some(free_port().unwrap_or_else(|e| {
                        panic!("tollgate-testkit: cannot find a free port: {e}")
                    }));
            }
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(StartError::PortTaken(msg)) => last_error = msg,
                Err(StartError::Fatal(msg)) => panic!("{msg}"),
            }
        }
        panic!(
            "tollgate-testkit: no usable port after {PORT_ATTEMPTS} attempts; last: {last_error}"
        )
    }
}

impl RedisServer {
    /// Starts a server with the default configuration; see [`RedisServerBuilder::start`].
    ///
    /// # Panics
    ///
    /// If `redis-server` is not on `PATH` or does not start; see [`RedisServerBuilder::start`].
    pub fn start() -> Self {
        Self::builder().start()
    }

    /// A builder for a server with extra arguments or another startup timeout.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port the server listens on (kept across [`kill`](Self::kill) and
    /// [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The connection URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Whether the process is running: started and neither killed nor exited on its own.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Starts a server that replicates `primary` (`--replicaof`) and waits until its link to
    /// the primary is up and the first synchronisation is done.
    ///
    /// # Panics
    ///
    /// If the server does not start, or does not synchronise within its startup timeout.
    pub fn replica_of(primary: &RedisServer) -> RedisServer {
        // Redis waits 5 s by default before a diskless full sync, for more replicas to join.
        let _ = crate::cluster::command(
            primary.port,
            &crate::cluster::Auth::default(),
            &["CONFIG", "SET", "repl-diskless-sync-delay", "0"],
        );
        let replica = RedisServer::builder()
            .args(["--replicaof", "127.0.0.1", &primary.port.to_string()])
            .start();
        let start = Instant::now();
        loop {
            let link = crate::cluster::info_field(
                replica.port,
                &crate::cluster::Auth::default(),
                &["INFO", "replication"],
                "master_link_status",
            );
            match link {
                Ok(status) if status == "up" => return replica,
                _ if start.elapsed() > replica.startup_timeout => panic!(
                    "tollgate-testkit: replica {} of {} not in sync after {:?}: {link:?}",
                    replica.port, primary.port, replica.startup_timeout
                ),
                _ => thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Stops the process (SIGSTOP) without killing it: it holds its port and its connections
    /// but reads and answers nothing, as a server stalled by a long fork, a full disk or a
    /// partition would; its peers' writes pile up in the kernel's buffers and then in theirs.
    /// [`resume`](Self::resume) lets it go on. A no-op if it is not running.
    ///
    /// # Panics
    ///
    /// If the signal cannot be sent.
    pub fn pause(&mut self) {
        self.signal("-STOP");
    }

    /// Lets a server stopped by [`pause`](Self::pause) go on (SIGCONT).
    ///
    /// # Panics
    ///
    /// If the signal cannot be sent.
    pub fn resume(&mut self) {
        self.signal("-CONT");
    }

    fn signal(&mut self, which: &str) {
        let Some(child) = &self.child else { return };
        let status = Command::new("kill")
            .arg(which)
            .arg(child.id().to_string())
            .status()
            .unwrap_or_else(|e| panic!("tollgate-testkit: cannot run kill {which}: {e}"));
        assert!(
            status.success(),
            "tollgate-testkit: kill {which} {} failed",
            child.id()
        );
    }

    /// Kills the process with SIGKILL and waits for it to exit; a no-op if it is not running.
    ///
    /// The server keeps its port number, so [`restart`](Self::restart) comes back on the same
    /// address. Nothing is persisted: a restarted server starts empty.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Fails only if the process has already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (killing it first if it is running) and waits
    /// until it answers `PING`.
    ///
    /// # Panics
    ///
    /// If the server does not come back within the startup timeout, for instance because
    /// another process took the port meanwhile.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(StartError::PortTaken(msg) | StartError::Fatal(msg)) = self.spawn_and_wait() {
            panic!("{msg}");
        }
    }

    /// Spawns `redis-server` on `self.port` and waits until it answers as itself.
    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        let log_path = self.dir.join(LOG_FILE);
        let log_start = fs::metadata(&log_path).map_or(0, |m| m.len());
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| fatal(format!("cannot open {}: {e}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(|e| fatal(format!("cannot clone log handle: {e}")))?;
        let mut child = Command::new(REDIS_SERVER)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--protected-mode", "no"])
            .args(
                self.bus_port
                    .map(|bus| ["--cluster-port".to_owned(), bus.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .spawn()
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => fatal(NOT_FOUND.to_owned()),
                _ => fatal(format!("cannot spawn {REDIS_SERVER}: {e}")),
            })?;
        let pid = child.id();
        let deadline = Instant::now() + self.startup_timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = read_log(&log_path, log_start);
                let msg = format!(
                    "tollgate-testkit: redis-server on port {} exited during startup ({status}); \
                     log:\n{log}",
                    self.port
                );
                return Err(if log.contains("Address already in use") {
                    StartError::PortTaken(msg)
                } else {
                    StartError::Fatal(msg)
                });
            }
            match server_pid(self.addr()) {
                Ok(p) if p == pid => {
                    self.child = Some(child);
                    return Ok(());
                }
                Ok(other) => {
                    // Another redis owns this port: ours will fail to bind, so give it up.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(StartError::PortTaken(format!(
                        "port {} is served by another redis-server (pid {other})",
                        self.port
                    )));
                }
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = read_log(&log_path, log_start);
                    return Err(fatal(format!(
                        "tollgate-testkit: redis-server on port {} did not answer PING within \
                         {:?} (last error: {e}); log:\n{log}",
                        self.port, self.startup_timeout
                    )));
                }
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Why one start attempt failed.
enum StartError {
    /// The port was taken by someone else: worth retrying on another port.
    PortTaken(String),
    /// Anything else: give up.
    Fatal(String),
}

/// The `redis-server` arguments that serve TLS on `port` with this certificate, key and CA
/// (PEM files), requiring client certificates signed by the CA when `auth_clients`.
pub(crate) fn tls_args(
    port: u16,
    cert: &str,
    key: &str,
    ca: &str,
    auth_clients: bool,
) -> Vec<String> {
    [
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        cert,
        "--tls-key-file",
        key,
        "--tls-ca-cert-file",
        ca,
        "--tls-auth-clients",
        if auth_clients { "yes" } else { "no" },
    ]
    .map(str::to_owned)
    .to_vec()
}

fn fatal(msg: String) -> StartError {
    StartError::Fatal(msg)
}

/// A port that was free a moment ago, for a server to bind next. Taken below the kernel's
/// ephemeral range (32768 and up on Linux), where the operating system never hands ports to
/// outgoing connections, so that a test's own client connections cannot take it first (which
/// binding port 0 allows): random ports in 15000..32768, each bound and released, until one is
/// free; the ephemeral range if none is.
pub(crate) fn free_port() -> io::Result<u16> {
    const LOW: u64 = 15_000;
    const HIGH: u64 = 32_768;
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut state =
        nanos ^ u64::from(std::process::id()) << 32 ^ DRAWN.fetch_add(1, Ordering::Relaxed);
    for _ in 0..64 {
        // splitmix64: spreads consecutive seeds over the range.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = state;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        let port = u16::try_from(LOW + x % (HIGH - LOW)).unwrap_or(0);
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Creates a fresh directory under [`std::env::temp_dir`].
fn create_temp_dir() -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("tollgate-redis-{}-{n}-{nanos}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
}

/// Pings the server at `addr` and returns its `process_id`, so we know the answer comes from our
/// child and not from another redis that won a port race.
fn server_pid(addr: SocketAddr) -> io::Result<u32> {
    let timeout = Duration::from_millis(500);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(b"PING\r\nINFO server\r\n")?;
    let mut reader = BufReader::new(stream);
    let pong = read_reply(&mut reader)?;
    if pong != "PONG" {
        return Err(io::Error::other(format!("unexpected PING reply: {pong}")));
    }
    let info = read_reply(&mut reader)?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .ok_or_else(|| io::Error::other("INFO server has no process_id"))
}

/// Reads one RESP simple string, error or bulk string.
fn read_reply(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end();
    match line.split_at_checked(1) {
        Some(("+", rest)) => Ok(rest.to_owned()),
        Some(("-", rest)) => Err(io::Error::other(rest.to_owned())),
        Some(("$", len)) => {
            let len: usize = len
                .parse()
                .map_err(|_| io::Error::other(format!("bad bulk length: {line}")))?;
            let mut buf = vec![0; len + 2];
            reader.read_exact(&mut buf)?;
            buf.truncate(len);
            String::from_utf8(buf).map_err(io::Error::other)
        }
        _ => Err(io::Error::other(format!("unexpected reply: {line}"))),
    }
}

/// The log written since byte `from` (this start attempt), for error messages.
fn read_log(path: &Path, from: u64) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let from = usize::try_from(from).unwrap_or(0).min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[from..]);
    if text.trim().is_empty() {
        "(empty)".to_owned()
    } else {
        text.into_owned()
    }
}
