//! Certificates for TLS tests, made with `openssl` in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::RedisServer;
use crate::cluster::free_port;
use crate::server::tls_args;

/// A directory of PEM files for TLS tests, removed on drop:
///
/// - `ca.crt` / `ca.key`: a CA;
/// - `server.crt` / `server.key`: signed by it, for `localhost` and `127.0.0.1` (the address
///   cluster nodes announce and sentinels name), with no extended key usage, so that servers
///   can also present it to each other as clients;
/// - `client.crt` / `client.key`: a client certificate signed by the CA, for
///   `client.tollgate.test`;
/// - `other-ca.crt`: a CA that signed nothing here, to show that a wrong CA is refused.
///
/// ```no_run
/// use tollgate_testkit::TestCerts;
///
/// let certs = TestCerts::new();
/// let url = format!("rediss://localhost:6380/0?{}", certs.client_query());
/// # let _ = url;
/// ```
#[derive(Debug)]
pub struct TestCerts(PathBuf);

impl TestCerts {
    /// Makes every file (a few RSA keys: well under a second).
    ///
    /// # Panics
    ///
    /// If `openssl` is missing or fails.
    pub fn new() -> TestCerts {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-certs-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("tollgate-testkit: cannot create {}: {e}", dir.display()));
        for (name, subject) in [("ca", "tollgate test CA"), ("other-ca", "another CA")] {
            openssl(
                &dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN={subject}"),
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.crt"),
                ],
            );
        }
        sign(
            &dir,
            "server",
            "localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        );
        sign(
            &dir,
            "client",
            "tollgate test client",
            "subjectAltName=DNS:client.tollgate.test\nextendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        );
        TestCerts(dir)
    }

    /// The path of one of the files, e.g. `path("ca.crt")`.
    pub fn path(&self, file: &str) -> String {
        self.0.join(file).to_string_lossy().into_owned()
    }

    /// `tls_ca_file=<ca.crt>`, percent-encoded for a store URL's query.
    pub fn ca_query(&self) -> String {
        format!("tls_ca_file={}", encode(&self.path("ca.crt")))
    }

    /// `tls_ca_file=...&tls_cert_file=...&tls_key_file=...` for this CA and the client
    /// certificate, percent-encoded for a store URL's query.
    pub fn client_query(&self) -> String {
        format!(
            "{}&tls_cert_file={}&tls_key_file={}",
            self.ca_query(),
            encode(&self.path("client.crt")),
            encode(&self.path("client.key"))
        )
    }
}

impl TestCerts {
    /// Starts a `redis-server` that also serves TLS with `server.crt` on a port of its own,
    /// returned beside it, and requires clients to present a certificate signed by the CA
    /// when `auth_clients` (`tls-auth-clients`). The plain port stays for inspection.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`], or if no free port is found.
    pub fn start_tls_server(&self, auth_clients: bool) -> (RedisServer, u16) {
        let tls_port =
            free_port().unwrap_or_else(|e| panic!("tollgate-testkit: no free port: {e}"));
        let server = RedisServer::builder()
            .args(tls_args(
                tls_port,
                &self.path("server.crt"),
                &self.path("server.key"),
                &self.path("ca.crt"),
                auth_clients,
            ))
            .start();
        (server, tls_port)
    }
}

impl Default for TestCerts {
    fn default() -> Self {
        TestCerts::new()
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `name.crt` for a new key `name.key`, signed by `ca.crt` with `extensions`.
fn sign(dir: &Path, name: &str, subject: &str, extensions: &str) {
    let (key, csr, crt, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={subject}"),
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
    );
    std::fs::write(dir.join(&ext), extensions)
        .unwrap_or_else(|e| panic!("tollgate-testkit: cannot write {ext}: {e}"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "tollgate-testkit: TLS tests need openssl (Debian: apt-get install -y openssl): {e}"
            )
        });
    assert!(
        output.status.success(),
        "tollgate-testkit: openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A path as a URL parameter value: bytes outside the unreserved set, `/` aside, escaped.
fn encode(path: &str) -> String {
    path.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
