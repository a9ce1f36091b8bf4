//! TLS on the gRPC port (`server.grpc_tls`, or the reference service's `GRPC_SERVER_USE_TLS`,
//! `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY`, `GRPC_CLIENT_TLS_CACERT`): rustls, HTTP/2 by
//! ALPN, and with a client CA file, client certificates required and verified against it; with
//! `client_san` (`GRPC_CLIENT_TLS_SAN`), they must also be valid for that DNS name or IP address.
//!
//! The certificate and key are read at start (an unreadable or mismatched pair stops it: never
//! plaintext instead) and again when either file changes (looked at once a second at most, by
//! a handshake), so a rotated certificate is served within a second; a rotation that cannot be
//! read keeps the one in use.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject as _};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
        SignatureScheme,
        client::danger::HandshakeSignatureValid,
        crypto::{CryptoProvider, ring},
        server::{
            ClientHello, ResolvesServerCert, WebPkiClientVerifier,
            danger::{ClientCertVerified, ClientCertVerifier},
        },
        sign::CertifiedKey,
    },
};

/// The files of `server.grpc_tls`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    /// Client certificates are required and verified against these CAs.
    pub(crate) client_ca: Option<PathBuf>,
    /// With `client_ca`: the name client certificates must be valid for.
    pub(crate) client_san: Option<ServerName<'static>>,
}

/// The acceptor of `files`, or why it cannot serve them.
pub(crate) fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, String> {
    let provider = Arc::new(ring::default_provider());
    let resolver = Reloading::new(files.clone(), provider.clone())?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            match &files.client_san {
                Some(name) => builder.with_client_cert_verifier(Arc::new(NamedClients {
                    chain: verifier,
                    name: name.clone(),
                })),
                None => builder.with_client_cert_verifier(verifier),
            }
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// Serves the certificate of `files`, read again when the certificate file changes.
#[derive(Debug)]
struct Reloading {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: Mutex<Current>,
}

/// The pair in use, the files' change times it was read at, and when they were last looked at.
#[derive(Debug)]
struct Current {
    key: Arc<CertifiedKey>,
    modified: [Option<SystemTime>; 2],
    looked: Instant,
}

/// How often a handshake may look at the files.
const LOOK_EVERY: Duration = Duration::from_secs(1);

impl Reloading {
    fn new(files: TlsFiles, provider: Arc<CryptoProvider>) -> Result<Reloading, String> {
        let key = load(&files, &provider)?;
        let current = Current {
            key: Arc::new(key),
            modified: modified(&files),
            looked: Instant::now(),
        };
        Ok(Reloading {
            files,
            provider,
            current: Mutex::new(current),
        })
    }
}

fn modified(files: &TlsFiles) -> [Option<SystemTime>; 2] {
    [&files.cert, &files.key].map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok())
}

fn load(files: &TlsFiles, provider: &CryptoProvider) -> Result<CertifiedKey, String> {
    let certs = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("{}: no PEM private key in it: {e}", files.key.display()))?;
    CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| format!("{} and {}: {e}", files.cert.display(), files.key.display()))
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.looked.elapsed() >= LOOK_EVERY {
            current.looked = Instant::now();
            let now = modified(&self.files);
            if now != current.modified {
                match load(&self.files, &self.provider) {
                    Ok(key) => {
                        tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                        current.key = Arc::new(key);
                        current.modified = now;
                    }
                    // Half-written files, or a key not yet beside its certificate: the one in
                    // use stays, and a handshake a second later tries again.
                    Err(e) => tracing::warn!(error = %e, "TLS certificate not reloaded"),
                }
            }
        }
        Some(current.key.clone())
    }
}

/// Client certificates that chain to the client CA and are valid for one name: the CA's check
/// first, then the name among the certificate's subject alternative names.
#[derive(Debug)]
struct NamedClients {
    chain: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClients {
    fn offer_client_auth(&self) -> bool {
        self.chain.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.chain.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .chain
            .verify_client_cert(end_entity, intermediates, now)?;
        webpki::EndEntityCert::try_from(end_entity)
            .and_then(|cert| cert.verify_is_valid_for_subject_name(&self.name))
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}
