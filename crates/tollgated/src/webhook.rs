//! The warning webhook (`[webhook]`): each warning the server logs (once per key and window) is
//! also POSTed as JSON to a URL, by a task of its own, so a check never waits for it. Deliveries
//! are queued (at most [`QUEUE`]; a full queue drops and counts) and each has its timeout; a
//! failed one is logged and counted (`tollgate_webhook_deliveries_total{result}`), not retried.

use std::sync::Arc;

use axum::body::Bytes;
use http_body_util::Full;
use hyper::{Request, header};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::{net::TcpStream, sync::mpsc};
use tokio_rustls::{
    TlsConnector,
    rustls::{ClientConfig, RootCertStore, crypto::ring},
};

use crate::{config::WebhookSettings, metrics::Metrics};

/// How many deliveries wait at most.
const QUEUE: usize = 1024;

/// Posts to the webhook: cheap to clone, and to call from a check.
#[derive(Clone)]
pub(crate) struct Webhook {
    queue: mpsc::Sender<Vec<u8>>,
    metrics: Metrics,
}

impl Webhook {
    /// Starts the task that delivers to `settings`' URL, or says why it cannot (an unreadable
    /// CA file, no system roots for https).
    pub(crate) fn start(settings: &WebhookSettings, metrics: Metrics) -> Result<Webhook, String> {
        let tls = settings.https.then(|| connector(settings)).transpose()?;
        let (queue, mut deliveries) = mpsc::channel::<Vec<u8>>(QUEUE);
        let target = Arc::new(settings.clone());
        let counted = metrics.clone();
        tokio::spawn(async move {
            while let Some(body) = deliveries.recv().await {
                let delivery = deliver(&target, tls.as_ref(), body);
                let failed = match tokio::time::timeout(target.timeout, delivery).await {
                    Ok(Ok(status)) if (200..300).contains(&status) => None,
                    Ok(Ok(status)) => Some(format!("answered {status}")),
                    Ok(Err(e)) => Some(e),
                    Err(_) => Some(format!("no answer within {:?}", target.timeout)),
                };
                counted.webhook(if failed.is_some() {
                    "failed"
                } else {
                    "delivered"
                });
                if let Some(why) = failed {
                    tracing::warn!(url = %target.url, error = %why, "the warning webhook failed");
                }
            }
        });
        Ok(Webhook { queue, metrics })
    }

    /// Queues `body` (JSON) for delivery; a full queue drops it.
    pub(crate) fn send(&self, body: Vec<u8>) {
        if self.queue.try_send(body).is_err() {
            self.metrics.webhook("dropped");
        }
    }
}

/// The TLS connector of an https webhook: the CA file's roots, or the system's.
fn connector(settings: &WebhookSettings) -> Result<TlsConnector, String> {
    let mut roots = RootCertStore::empty();
    match &settings.ca {
        Some(ca) => {
            for cert in crate::tls::certificates(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(format!(
                    "webhook {}: the system has no CA certificates to verify it by; set webhook.ca",
                    settings.url
                ));
            }
        }
    }
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// One POST of `body` to the webhook; its status.
async fn deliver(
    target: &WebhookSettings,
    tls: Option<&TlsConnector>,
    body: Vec<u8>,
) -> Result<u16, String> {
    let stream = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let request = Request::post(&target.path)
        .header(header::HOST, host_header(target))
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            header::USER_AGENT,
            concat!("tollgate/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("request: {e}"))?;
    match tls {
        Some(tls) => {
            let name = ServerName::try_from(target.host.clone())
                .map_err(|e| format!("{}: {e}", target.host))?;
            let stream = tls
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            post(TokioIo::new(stream), request).await
        }
        None => post(TokioIo::new(stream), request).await,
    }
}

async fn post<T>(io: T, request: Request<Full<Bytes>>) -> Result<u16, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    Ok(response.status().as_u16())
}

/// The `Host` header: the host, and the port unless it is the scheme's.
fn host_header(target: &WebhookSettings) -> String {
    let host = if target.host.contains(':') {
        format!("[{}]", target.host)
    } else {
        target.host.clone()
    };
    match (target.https, target.port) {
        (true, 443) | (false, 80) => host,
        (_, port) => format!("{host}:{port}"),
    }
}
