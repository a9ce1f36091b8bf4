//! A Sentinel set with TLS on every process, client certificates required and a password on
//! the sentinels: the sentinels hand out TLS ports only, refuse clients without the password,
//! and name the promoted replica's TLS port after a failover.
//!
//! The certificates come from [`TestCerts`]; the test asks the sentinels over TLS with
//! `redis-cli`, as a client following them would.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_testkit::{RedisSentinelSet, TestCerts};

/// Has a space and a quote, so the sentinels' config must quote it.
const PASSWORD: &str = "sentinel \"pw\" 1";

/// `redis-cli` over TLS to `port`, presenting the client certificate when `cert`, sending
/// [`PASSWORD`] when `password`; returns stdout and stderr.
fn cli(certs: &TestCerts, port: u16, cert: bool, password: bool, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["--tls", "--cacert", &certs.path("ca.crt")]);
    if cert {
        cmd.args([
            "--cert",
            &certs.path("client.crt"),
            "--key",
            &certs.path("client.key"),
        ]);
    }
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if password {
        cmd.args(["--no-auth-warning", "-a", PASSWORD]);
    }
    let out = cmd.args(args).output().expect(
        "the test needs redis-cli (Debian: apt-get install -y redis-tools, which comes with \
         redis-server)",
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `port` values of a `redis-cli` listing of field/value lines.
fn ports(listing: &str) -> Vec<u16> {
    let lines: Vec<&str> = listing.lines().collect();
    lines
        .windows(2)
        .filter(|kv| kv[0] == "port")
        .map(|kv| kv[1].parse().expect("a port number"))
        .collect()
}

/// Whether a plain (non-TLS) client gets `+PONG` from `port`.
fn answers_plain_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("a read timeout");
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG"
}

#[test]
fn tls_sentinels_hand_out_tls_ports_and_require_their_password() {
    let certs = TestCerts::new();
    let path = |f: &str| certs.path(f);
    let started = Instant::now();
    let mut set = RedisSentinelSet::builder()
        .tls(path("server.crt"), path("server.key"), path("ca.crt"))
        .tls_auth_clients(true)
        .sentinel_password(PASSWORD)
        .start();
    println!("started in {:?}", started.elapsed());

    let tls = set.tls_ports().to_vec();
    let sentinels = set.sentinel_tls_ports();
    assert_eq!((tls.len(), sentinels.len()), (2, 3));
    let names: Vec<String> = sentinels.iter().map(|p| format!("localhost:{p}")).collect();
    assert_eq!(
        set.tls_url("localhost").unwrap(),
        format!("rediss+sentinel://{}/tollgate", names.join(","))
    );
    assert!(set.url().starts_with("redis+sentinel://127.0.0.1:"));
    assert_eq!(set.primary_port(), set.servers()[0].port());
    assert_eq!(set.primary_tls_port(), Some(tls[0]));

    // Everything a sentinel hands out is a TLS port.
    let ask = |args: &[&str]| cli(&certs, sentinels[0], true, true, args);
    assert_eq!(
        ask(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "tollgate"]),
        format!("127.0.0.1\n{}\n", tls[0])
    );
    assert_eq!(ports(&ask(&["SENTINEL", "REPLICAS", "tollgate"])), [tls[1]]);
    let mut others = ports(&ask(&["SENTINEL", "SENTINELS", "tollgate"]));
    others.sort_unstable();
    let mut expected = sentinels[1..].to_vec();
    expected.sort_unstable();
    assert_eq!(others, expected);
    // ... and a plain client gets nothing there.
    assert!(!answers_plain_ping(tls[0]));
    assert_eq!(
        cli(&certs, tls[0], true, false, &["PING"]),
        "PONG\n",
        "a TLS client with a certificate is served"
    );

    // Without the password, or without a client certificate, the sentinel refuses.
    let refused = cli(&certs, sentinels[0], true, false, &["PING"]);
    assert!(refused.contains("NOAUTH"), "{refused}");
    let refused = cli(&certs, sentinels[0], false, true, &["PING"]);
    assert!(
        refused.to_lowercase().contains("error") && !refused.contains("PONG"),
        "{refused}"
    );

    // After a failover the sentinels name the other server's TLS port.
    let killed = set.kill_primary();
    assert_eq!(killed, set.servers()[0].port());
    let took = set.wait_for_failover(Duration::from_secs(30));
    println!("failed over in {took:?}");
    for &sentinel in &sentinels {
        assert_eq!(
            cli(
                &certs,
                sentinel,
                true,
                true,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "tollgate"]
            ),
            format!("127.0.0.1\n{}\n", tls[1])
        );
    }
    assert_eq!(set.primary_port(), set.servers()[1].port());
    assert_eq!(cli(&certs, tls[1], true, false, &["SET", "k", "v"]), "OK\n");

    // Restarted by its TLS port, the old primary comes back with the same arguments, TLS
    // included. (The sentinels turn it into a replica some 8 s later: not waited for here.)
    set.restart_server(tls[0]);
    assert_eq!(cli(&certs, tls[0], true, false, &["PING"]), "PONG\n");
}
