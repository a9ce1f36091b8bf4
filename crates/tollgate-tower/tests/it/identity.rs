use axum::{Extension, Router, routing::get};
use tollgate::{Dimension, Identity, Limiter, Policy};
use tollgate_tower::{ContextLayer, ForwardedHeader, IdentityResolver, RateLimitLayer};

use crate::support::{Server, client, gate};

/// Echoes the client IP the layers settled on, behind a per-IP 1/1m limit.
async fn app(resolver: IdentityResolver) -> Server {
    let (gate, _) = gate();
    let policy = Policy::builder("echo")
        .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse().unwrap()]))
        .build()
        .unwrap();
    let echo = |Extension(who): Extension<Identity>| async move {
        who.ip().map(|ip| ip.to_string()).unwrap_or_default()
    };
    let app = Router::new()
        .route("/ip", get(echo))
        .route(
            "/limited",
            get(echo).layer(RateLimitLayer::new(gate.clone(), policy)),
        )
        .layer(ContextLayer::new(gate, resolver));
    Server::start(app).await
}

async fn ip_seen(server: &Server, header: Option<(&str, &str)>) -> String {
    let mut request = client().get(server.at("/ip"));
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    request.send().await.unwrap().text().await.unwrap()
}

async fn limited(server: &Server, xff: &str) -> u16 {
    client()
        .get(server.at("/limited"))
        .header("x-forwarded-for", xff)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn forwarding_headers_from_an_untrusted_peer_are_ignored() {
    // Proxies are trusted, but the loopback peer is not one of them.
    let server = app(IdentityResolver::new().trust_proxy("10.0.0.0/8".parse().unwrap())).await;
    assert_eq!(ip_seen(&server, None).await, "127.0.0.1");
    assert_eq!(
        ip_seen(&server, Some(("x-forwarded-for", "203.0.113.5"))).await,
        "127.0.0.1"
    );
    assert_eq!(
        ip_seen(&server, Some(("forwarded", "for=203.0.113.5"))).await,
        "127.0.0.1"
    );
    // So a client cannot dodge its limit by inventing addresses.
    assert_eq!(limited(&server, "203.0.113.5").await, 200);
    assert_eq!(limited(&server, "203.0.113.6").await, 429);
}

#[tokio::test]
async fn x_forwarded_for_from_a_trusted_peer_is_honoured_right_to_left() {
    let resolver = IdentityResolver::new()
        .trust_proxy("127.0.0.1/32".parse().unwrap())
        .trust_proxy("10.0.0.0/8".parse().unwrap());
    let server = app(resolver).await;
    let xff = |v| Some(("x-forwarded-for", v));
    assert_eq!(ip_seen(&server, xff("203.0.113.5")).await, "203.0.113.5");
    // A forged entry on the left is skipped: the first untrusted hop from the right counts.
    assert_eq!(
        ip_seen(&server, xff("6.6.6.6, 203.0.113.5, 10.1.1.1")).await,
        "203.0.113.5"
    );
    // Without a header the trusted peer is the client.
    assert_eq!(ip_seen(&server, None).await, "127.0.0.1");
    // Forwarded is not what these proxies write.
    assert_eq!(
        ip_seen(&server, Some(("forwarded", "for=203.0.113.9"))).await,
        "127.0.0.1"
    );
    // Each forwarded client has its own limit.
    assert_eq!(limited(&server, "203.0.113.5").await, 200);
    assert_eq!(limited(&server, "203.0.113.6").await, 200);
    assert_eq!(limited(&server, "203.0.113.5").await, 429);
}

#[tokio::test]
async fn rfc_7239_forwarded_from_a_trusted_peer_is_honoured() {
    let resolver = IdentityResolver::new()
        .trust_proxy("127.0.0.1/32".parse().unwrap())
        .forwarded_header(ForwardedHeader::Forwarded);
    let server = app(resolver).await;
    let seen = ip_seen(
        &server,
        Some(("forwarded", r#"for="[2001:db8::17]:4711";proto=https"#)),
    )
    .await;
    assert_eq!(seen, "2001:db8::17");
    assert_eq!(
        ip_seen(&server, Some(("x-forwarded-for", "203.0.113.5"))).await,
        "127.0.0.1"
    );
}

#[tokio::test]
async fn one_address_headers_and_counted_hops_over_http() {
    let server = app(IdentityResolver::new()
        .trust_proxy("127.0.0.1/32".parse().unwrap())
        .forwarded_header(ForwardedHeader::XRealIp))
    .await;
    assert_eq!(
        ip_seen(&server, Some(("x-real-ip", "203.0.113.5"))).await,
        "203.0.113.5"
    );
    assert_eq!(
        ip_seen(&server, Some(("x-forwarded-for", "203.0.113.5"))).await,
        "127.0.0.1",
        "only the chosen header is believed"
    );

    // One load balancer of unknown address: the entry it appended is the client.
    let server = app(IdentityResolver::new().trust_hops(1)).await;
    assert_eq!(
        ip_seen(&server, Some(("x-forwarded-for", "6.6.6.6, 198.51.100.7"))).await,
        "198.51.100.7"
    );
}
