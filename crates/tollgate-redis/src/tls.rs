//! TLS files for `rediss` URLs: read and checked once, when the store is built.

use std::path::Path;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use crate::url::TlsFiles;

/// The certificates `files` name, or `None` when they name none (the system's roots, no
/// client certificate). The error names the file and what is wrong with it.
pub(crate) fn certificates(files: &TlsFiles) -> Result<Option<TlsCertificates>, String> {
    if files.is_empty() {
        return Ok(None);
    }
    let root_cert = files.ca.as_deref().map(read_certificates).transpose()?;
    let client_tls = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read_certificates(cert)?,
            client_key: read_key(key)?,
        }),
        (None, None) => None,
        _ => {
            return Err(
                "a client certificate needs its key: give both tls_cert_file and tls_key_file"
                    .to_owned(),
            );
        }
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// A PEM file holding at least one certificate, and nothing unreadable.
fn read_certificates(path: &Path) -> Result<Vec<u8>, String> {
    let pem = read(path, "certificate")?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| format!("TLS certificate file {}: {e}", path.display()))?;
        count += 1;
    }
    if count == 0 {
        return Err(format!(
            "TLS certificate file {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        ));
    }
    Ok(pem)
}

/// A PEM file holding a private key (PKCS#8, PKCS#1 or SEC1).
fn read_key(path: &Path) -> Result<Vec<u8>, String> {
    let pem = read(path, "key")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        format!(
            "TLS key file {}: no private key in it ({e})",
            path.display()
        )
    })?;
    Ok(pem)
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path)
        .map_err(|e| format!("cannot read the TLS {what} file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn temp(name: &str, text: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "tollgate-redis-tls-unit-{}-{name}",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn nothing_named_is_the_system_roots() {
        assert!(certificates(&TlsFiles::default()).unwrap().is_none());
    }

    #[test]
    fn bad_files_are_named_with_what_is_wrong() {
        let missing = TlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let err = certificates(&missing).unwrap_err();
        assert!(
            err.contains("cannot read the TLS certificate file /nonexistent/ca.pem"),
            "{err}"
        );

        let not_pem = temp("not-pem", "hello\n");
        let err = certificates(&TlsFiles {
            ca: Some(not_pem.clone()),
            ..TlsFiles::default()
        })
        .unwrap_err();
        assert!(err.contains("no PEM certificate"), "{err}");
        assert!(err.contains(&not_pem.display().to_string()), "{err}");

        let err = certificates(&TlsFiles {
            cert: Some(not_pem.clone()),
            ..TlsFiles::default()
        })
        .unwrap_err();
        assert!(err.contains("needs its key"), "{err}");

        let err = certificates(&TlsFiles {
            key: Some(not_pem.clone()),
            ..TlsFiles::default()
        })
        .unwrap_err();
        assert!(err.contains("needs its key"), "{err}");
        let _ = std::fs::remove_file(not_pem);
    }
}
