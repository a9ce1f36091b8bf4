//! A local Redis Cluster: six `redis-server` processes (three primaries, three replicas) on free
//! loopback ports, joined with `redis-cli --cluster create`.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::RedisServer;
use crate::server::tls_args;

const REDIS_CLI: &str = "redis-cli";
const CLI_NOT_FOUND: &str = "redis-cli not found on PATH: install it \
    (Debian: apt-get install -y redis-tools, which comes with redis-server) or run scripts/test";
/// How long [`RedisCluster::start`] waits for the cluster to form (a hang detector).
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// A real Redis Cluster on `127.0.0.1`: three primaries with one replica each, every node its
/// own `redis-server` process in its own temporary directory, with a short
/// `cluster-node-timeout` (1 s) so that a killed primary is replaced within seconds.
///
/// Dropping the cluster kills every node.
///
/// ```no_run
/// use tollgate_testkit::RedisCluster;
///
/// let mut cluster = RedisCluster::start();
/// let url = cluster.url(); // "redis+cluster://127.0.0.1:<port>,127.0.0.1:<port>,..."
/// let killed = cluster.kill_primary_of("tg:{login:ip:1.2.3.4}:l");
/// cluster.wait_for_failover(std::time::Duration::from_secs(30));
/// # let _ = (url, killed);
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's TLS port, when started with [`RedisClusterBuilder::tls`].
    tls_ports: Vec<u16>,
    auth: Auth,
}

/// Configures a [`RedisCluster`] before starting it; from [`RedisCluster::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisClusterBuilder {
    node_timeout: Duration,
    extra_args: Vec<String>,
    tls: Option<[String; 3]>,
    tls_auth_clients: bool,
}

impl Default for RedisClusterBuilder {
    fn default() -> Self {
        RedisClusterBuilder {
            node_timeout: Duration::from_millis(1000),
            extra_args: Vec::new(),
            tls: None,
            tls_auth_clients: false,
        }
    }
}

impl RedisClusterBuilder {
    /// `cluster-node-timeout`: how long a node may be unreachable before it is considered
    /// failed (default 1 s).
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Appends one argument to every node's `redis-server` command line, e.g. `--requirepass`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Also serve TLS on a port of each node's own (next to the plain one, which the kit keeps
    /// for itself), with this certificate and key (PEM files), clients not authenticated unless
    /// [`tls_auth_clients`](Self::tls_auth_clients); the
    /// nodes speak TLS to each other (`tls-cluster`, `tls-replication`), and answer TLS clients
    /// with their TLS ports. The certificate must name `127.0.0.1` (the address the nodes
    /// announce). See [`RedisCluster::tls_url`].
    pub fn tls(
        mut self,
        cert_file: impl Into<String>,
        key_file: impl Into<String>,
        ca_file: impl Into<String>,
    ) -> Self {
        self.tls = Some([cert_file.into(), key_file.into(), ca_file.into()]);
        self
    }

    /// With [`tls`](Self::tls): require TLS clients to present a certificate signed by the CA
    /// (`tls-auth-clients yes`; default no). The nodes present their own certificate to each
    /// other, so it must not be restricted to server authentication.
    pub fn tls_auth_clients(mut self, required: bool) -> Self {
        self.tls_auth_clients = required;
        self
    }

    /// Starts six nodes, creates the cluster and waits until every node reports
    /// `cluster_state:ok`, knows all six nodes, and every replica is in sync.
    ///
    /// # Panics
    ///
    /// If `redis-server` or `redis-cli` is missing, or the cluster does not form within 30 s
    /// (the message includes what was last seen).
    pub fn start(self) -> RedisCluster {
        let node_timeout = self.node_timeout.as_millis().max(1).to_string();
        let mut tls_ports = Vec::new();
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                let mut tls: Vec<String> = Vec::new();
                if let Some([cert, key, ca]) = &self.tls {
                    let port = free_port()
                        .unwrap_or_else(|e| panic!("tollgate-testkit: no free port: {e}"));
                    tls_ports.push(port);
                    tls = tls_args(port, cert, key, ca, self.tls_auth_clients);
                    tls.extend(
                        ["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned),
                    );
                }
                // The bus port defaults to port + 10000, which may be taken or above 65535: one
                // is chosen free with each attempt's port.
                RedisServer::builder()
                    .cluster_bus()
                    .args(&tls)
                    .args(["--cluster-enabled", "yes"])
                    .args(["--cluster-config-file", "nodes.conf"])
                    .args(["--cluster-node-timeout", &node_timeout])
                    // A replica whose primary just died may always take over: tests kill
                    // primaries on purpose and need the replica to win.
                    .args(["--cluster-replica-validity-factor", "0"])
                    // Replicas sync at once instead of waiting 5 s for more replicas to come.
                    .args(["--repl-diskless-sync-delay", "0"])
                    .args(&self.extra_args)
                    .start()
            })
            .collect();
        let cluster = RedisCluster {
            nodes,
            tls_ports,
            auth: Auth::default(),
        };
        let mut cli = Command::new(REDIS_CLI);
        cli.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            cli.arg(format!("127.0.0.1:{}", node.port()));
        }
        cli.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = cli.output().unwrap_or_else(|e| match e.kind() {
            io::ErrorKind::NotFound => panic!("{CLI_NOT_FOUND}"),
            _ => panic!("tollgate-testkit: cannot run {REDIS_CLI}: {e}"),
        });
        assert!(
            out.status.success(),
            "tollgate-testkit: redis-cli --cluster create failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_until_healthy(6, FORM_TIMEOUT);
        cluster
    }
}

/// Credentials the kit sends before its own commands.
#[derive(Debug, Clone, Default)]
pub(crate) struct Auth {
    pub(crate) password: Option<String>,
}

impl RedisCluster {
    /// Starts a cluster with the default settings; see [`RedisClusterBuilder::start`].
    ///
    /// # Panics
    ///
    /// See [`RedisClusterBuilder::start`].
    pub fn start() -> RedisCluster {
        RedisCluster::builder().start()
    }

    /// A builder for a cluster with other settings.
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder::default()
    }

    /// Every node's URL, `redis://127.0.0.1:<port>/`, killed nodes included.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The store URL naming every node: `redis+cluster://127.0.0.1:<port>,127.0.0.1:<port>,...`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The TLS store URL naming every node's TLS port by `host`:
    /// `rediss+cluster://<host>:<tls port>,...`; `None` unless started with
    /// [`RedisClusterBuilder::tls`].
    pub fn tls_url(&self, host: &str) -> Option<String> {
        if self.tls_ports.is_empty() {
            return None;
        }
        let nodes: Vec<String> = self
            .tls_ports
            .iter()
            .map(|p| format!("{host}:{p}"))
            .collect();
        Some(format!("rediss+cluster://{}", nodes.join(",")))
    }

    /// The nodes, in creation order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The ports of the nodes that answer `PING`.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .map(RedisServer::port)
            .filter(|&port| is_up(port, &self.auth))
            .collect()
    }

    /// The ports of the live primaries that serve slots, as the first live node sees them.
    pub fn primaries(&self) -> Vec<u16> {
        let live = self.live_ports();
        live.iter()
            .find_map(|&port| cluster_nodes(port, &self.auth).ok())
            .map(|nodes| {
                nodes
                    .iter()
                    .filter(|n| n.is_healthy_primary() && !n.slots.is_empty())
                    .map(|n| n.port)
                    .filter(|p| live.contains(p))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The hash slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    ///
    /// # Panics
    ///
    /// If no node answers.
    pub fn slot_of(&self, key: &str) -> u16 {
        let ports = self.live_ports();
        for port in ports {
            if let Ok(Reply::Int(slot)) = command(port, &self.auth, &["CLUSTER", "KEYSLOT", key]) {
                return u16::try_from(slot).unwrap_or_else(|_| panic!("bad slot {slot}"));
            }
        }
        panic!("tollgate-testkit: no cluster node answered CLUSTER KEYSLOT")
    }

    /// The port of the primary serving `slot`, as the running nodes see it; `None` while no
    /// healthy primary serves it (e.g. during a failover).
    pub fn primary_for_slot(&self, slot: u16) -> Option<u16> {
        let live = self.live_ports();
        live.iter().find_map(|&port| {
            cluster_nodes(port, &self.auth)
                .ok()?
                .iter()
                .find(|n| n.is_healthy_primary() && n.serves(slot))
                .map(|n| n.port)
                .filter(|p| live.contains(p))
        })
    }

    /// Kills (SIGKILL) the primary serving `key`'s slot and returns its port.
    ///
    /// # Panics
    ///
    /// If no running primary serves the slot.
    pub fn kill_primary_of(&mut self, key: &str) -> u16 {
        let slot = self.slot_of(key);
        let port = self
            .primary_for_slot(slot)
            .unwrap_or_else(|| panic!("tollgate-testkit: no live primary serves slot {slot}"));
        self.kill_node(port);
        port
    }

    /// The ports of the replicas in sync with the primary on `primary`, as it says
    /// (`INFO replication`, `state=online`).
    pub fn replicas_of(&self, primary: u16) -> Vec<u16> {
        let Ok(Reply::Bulk(Some(text))) = command(primary, &self.auth, &["INFO", "replication"])
        else {
            return Vec::new();
        };
        text.lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .filter_map(|l| {
                l.split(',')
                    .find_map(|f| f.strip_prefix("port="))?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect()
    }

    /// A replica in sync with the primary on `primary`, waiting for one (a replica syncs
    /// after the cluster forms).
    ///
    /// # Panics
    ///
    /// If none is in sync within `timeout`.
    pub fn wait_for_replica_of(&self, primary: u16, timeout: Duration) -> u16 {
        let start = Instant::now();
        loop {
            if let Some(&port) = self.replicas_of(primary).first() {
                return port;
            }
            assert!(
                start.elapsed() < timeout,
                "tollgate-testkit: no replica of {primary} in sync within {timeout:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the node on `port` without killing it (see [`RedisServer::pause`]).
    ///
    /// # Panics
    ///
    /// If no node of this cluster has that port.
    pub fn pause_node(&mut self, port: u16) {
        self.node_mut(port).pause();
    }

    /// Lets a node stopped by [`pause_node`](Self::pause_node) go on.
    ///
    /// # Panics
    ///
    /// If no node of this cluster has that port.
    pub fn resume_node(&mut self, port: u16) {
        self.node_mut(port).resume();
    }

    /// Kills the node listening on `port`.
    ///
    /// # Panics
    ///
    /// If no node of this cluster has that port.
    pub fn kill_node(&mut self, port: u16) {
        self.node_mut(port).kill();
    }

    /// Starts the node on `port` again (same port, same node id, empty data); the cluster
    /// makes it a replica if its slots moved meanwhile.
    ///
    /// # Panics
    ///
    /// If no node of this cluster has that port, or it does not come back.
    pub fn restart_node(&mut self, port: u16) {
        self.node_mut(port).restart();
    }

    fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("tollgate-testkit: no cluster node on port {port}"))
    }

    /// Waits until every running node reports `cluster_state:ok` and every slot is served by
    /// a running primary, e.g. after [`kill_primary_of`](Self::kill_primary_of) until a
    /// replica has been promoted. Returns how long it waited.
    ///
    /// # Panics
    ///
    /// If that does not happen within `timeout` (a hang detector).
    pub fn wait_for_failover(&self, timeout: Duration) -> Duration {
        let start = Instant::now();
        let running = self.live_ports();
        loop {
            match self.check_served(&running) {
                Ok(()) => return start.elapsed(),
                Err(why) if start.elapsed() > timeout => panic!(
                    "tollgate-testkit: the cluster did not recover within {timeout:?}: {why}"
                ),
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Every running node says ok and sees every slot served by a running, healthy primary.
    fn check_served(&self, running: &[u16]) -> Result<(), String> {
        for &port in running {
            let info = info_field(port, &self.auth, &["CLUSTER", "INFO"], "cluster_state")?;
            if info != "ok" {
                return Err(format!("node {port}: cluster_state:{info}"));
            }
            let nodes = cluster_nodes(port, &self.auth).map_err(|e| format!("node {port}: {e}"))?;
            let mut covered = 0usize;
            for n in nodes.iter().filter(|n| n.is_healthy_primary()) {
                if !running.contains(&n.port) {
                    return Err(format!(
                        "node {port} still routes to dead primary {}",
                        n.port
                    ));
                }
                covered += n
                    .slots
                    .iter()
                    .map(|(a, b)| usize::from(b - a) + 1)
                    .sum::<usize>();
            }
            if covered != 16384 {
                return Err(format!("node {port} sees {covered} of 16384 slots served"));
            }
        }
        Ok(())
    }

    /// Waits until every node says ok, knows `known` nodes, and every replica is in sync.
    fn wait_until_healthy(&self, known: usize, timeout: Duration) {
        let start = Instant::now();
        let ports: Vec<u16> = self.nodes.iter().map(RedisServer::port).collect();
        loop {
            let why = match self.check_healthy(&ports, known) {
                Ok(()) => return,
                Err(why) => why,
            };
            if start.elapsed() > timeout {
                panic!("tollgate-testkit: the cluster did not form within {timeout:?}: {why}");
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn check_healthy(&self, ports: &[u16], known: usize) -> Result<(), String> {
        self.check_served(ports)?;
        for &port in ports {
            let n = info_field(
                port,
                &self.auth,
                &["CLUSTER", "INFO"],
                "cluster_known_nodes",
            )?;
            if n != known.to_string() {
                return Err(format!("node {port} knows {n} nodes"));
            }
            let role = info_field(port, &self.auth, &["INFO", "replication"], "role")?;
            if role == "slave" {
                let link = info_field(
                    port,
                    &self.auth,
                    &["INFO", "replication"],
                    "master_link_status",
                )?;
                if link != "up" {
                    return Err(format!("replica {port}: master_link_status:{link}"));
                }
            }
        }
        Ok(())
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct Node {
    port: u16,
    flags: Vec<String>,
    slots: Vec<(u16, u16)>,
}

impl Node {
    fn is_healthy_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
            && !self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

fn cluster_nodes(port: u16, auth: &Auth) -> io::Result<Vec<Node>> {
    let text = match command(port, auth, &["CLUSTER", "NODES"])? {
        Reply::Bulk(Some(text)) => text,
        other => return Err(io::Error::other(format!("CLUSTER NODES: {other:?}"))),
    };
    Ok(text.lines().filter_map(parse_node).collect())
}

/// `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`
fn parse_node(line: &str) -> Option<Node> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let addr = fields.get(1)?;
    let port = addr.split('@').next()?.rsplit(':').next()?.parse().ok()?;
    let flags = fields.get(2)?.split(',').map(str::to_owned).collect();
    let slots = fields
        .iter()
        .skip(8)
        // `[slot->-node]` marks a migration, not ownership.
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|a| (a, a)),
        })
        .collect();
    Some(Node { port, flags, slots })
}

/// One field of an `INFO`-style reply (`name:value` lines).
pub(crate) fn info_field(
    port: u16,
    auth: &Auth,
    cmd: &[&str],
    field: &str,
) -> Result<String, String> {
    let text = match command(port, auth, cmd) {
        Ok(Reply::Bulk(Some(text))) => text,
        Ok(other) => return Err(format!("node {port}: {cmd:?}: {other:?}")),
        Err(e) => return Err(format!("node {port}: {cmd:?}: {e}")),
    };
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| format!("node {port}: {cmd:?} has no {field}"))
}

/// A RESP reply, as far as the kit needs to read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

/// Sends one command to `127.0.0.1:port` on a fresh connection and reads the reply.
pub(crate) fn command(port: u16, auth: &Auth, args: &[&str]) -> io::Result<Reply> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let timeout = Duration::from_millis(1000);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut out = Vec::new();
    let mut sent = 0;
    if let Some(password) = &auth.password {
        encode(&mut out, &["AUTH", password]);
        sent += 1;
    }
    encode(&mut out, args);
    stream.write_all(&out)?;
    let mut reader = BufReader::new(stream);
    for _ in 0..sent {
        if let Reply::Error(e) = read(&mut reader)? {
            return Err(io::Error::other(format!("AUTH: {e}")));
        }
    }
    read(&mut reader)
}

fn encode(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

fn read(reader: &mut impl BufRead) -> io::Result<Reply> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end();
    let bad = || io::Error::other(format!("bad reply line {line:?}"));
    let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
    match kind {
        "+" => Ok(Reply::Simple(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => rest.parse().map(Reply::Int).map_err(|_| bad()),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            let Ok(len) = usize::try_from(len) else {
                return Ok(Reply::Bulk(None));
            };
            let mut buf = vec![0; len + 2];
            reader.read_exact(&mut buf)?;
            buf.truncate(len);
            Ok(Reply::Bulk(Some(
                String::from_utf8_lossy(&buf).into_owned(),
            )))
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            let len = usize::try_from(len).unwrap_or(0);
            (0..len)
                .map(|_| read(reader))
                .collect::<io::Result<Vec<_>>>()
                .map(Reply::Array)
        }
        _ => Err(bad()),
    }
}

/// Whether the server on `port` answers `PING`.
pub(crate) fn is_up(port: u16, auth: &Auth) -> bool {
    matches!(command(port, auth, &["PING"]), Ok(Reply::Simple(pong)) if pong == "PONG")
}

pub(crate) use crate::server::free_port;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_parse() {
        let n = parse_node(
            "07c3 127.0.0.1:30004@31004 myself,master - 0 0 1 connected 0-5460 5500 [93->-e7d]",
        )
        .unwrap();
        assert_eq!(n.port, 30004);
        assert!(n.is_healthy_primary());
        assert_eq!(n.slots, [(0, 5460), (5500, 5500)]);
        assert!(n.serves(5460) && n.serves(5500) && !n.serves(5461));
        let r = parse_node("67ed 127.0.0.1:30002@31002 master,fail - 0 0 2 disconnected").unwrap();
        assert!(!r.is_healthy_primary());
    }
}
