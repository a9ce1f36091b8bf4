//! The client's IP: the peer address, or what trusted proxies say it is.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, header};
use tollgate::IpNet;

/// Which header trusted proxies use to pass on the client's address.
///
/// Only one is believed: a proxy that appends to `X-Forwarded-For` usually passes a
/// client-sent `Forwarded` header through untouched, so believing both would let the client
/// choose its address. The one-address headers are believed only from a trusted peer, and
/// only as a whole (a value that is not an address leaves the peer as the client).
///
/// ```
/// use tollgate_tower::{ForwardedHeader, IdentityResolver};
///
/// // Behind Cloudflare, whose edge connects from the networks it publishes.
/// let resolver = IdentityResolver::new()
///     .trust_proxies(["173.245.48.0/20".parse()?, "2400:cb00::/32".parse()?])
///     .forwarded_header(ForwardedHeader::CfConnectingIp);
/// // Behind one load balancer whose addresses are not known in advance.
/// let resolver = IdentityResolver::new().trust_hops(1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the de facto standard).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
    /// `X-Real-IP: client` (nginx's `real_ip` module, many ingress controllers).
    XRealIp,
    /// `CF-Connecting-IP: client` (Cloudflare).
    CfConnectingIp,
    /// `True-Client-IP: client` (Akamai, Cloudflare Enterprise).
    TrueClientIp,
}

/// Whom the resolver believes: proxies by network, and a number of hops nearest to us.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trust<'a> {
    pub(crate) nets: &'a [IpNet],
    /// The peer and the `hops - 1` nearest hops of the chain are proxies, whatever their
    /// addresses (0: none is, by count).
    pub(crate) hops: usize,
}

impl Trust<'_> {
    /// Whether `ip`, `position` hops away from us (the peer is 0), is a proxy.
    fn trusts(&self, ip: IpAddr, position: usize) -> bool {
        position < self.hops || self.nets.iter().any(|net| net.contains(ip))
    }
}

/// The client IP of a request that arrived from `peer`.
///
/// If `peer` is not a trusted proxy, it is the client, whatever the headers say. Otherwise the
/// forwarding chain is walked from the right (the hop nearest to us): trusted hops are
/// skipped and the first untrusted one is the client. A hop that is not an address
/// (`unknown`, an obfuscated `_name`) ends the walk at the last trusted hop, the nearest
/// address we can vouch for. If every hop is trusted, the leftmost one is the client.
///
/// A one-address header ([`ForwardedHeader::XRealIp`] and the like) from a trusted peer names
/// the client, if it holds exactly one address.
pub(crate) fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trust: Trust<'_>,
    source: ForwardedHeader,
) -> IpAddr {
    let peer = canonical(peer);
    if !trust.trusts(peer, 0) {
        return peer;
    }
    let single = |name: &'static str| {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().ok().and_then(parse_hop).unwrap_or(peer),
            _ => peer,
        }
    };
    let hops = match source {
        ForwardedHeader::XForwardedFor => hops(
            headers,
            header::HeaderName::from_static("x-forwarded-for"),
            |v| v.split(',').map(|h| h.trim().to_owned()).collect(),
        ),
        ForwardedHeader::Forwarded => hops(headers, header::FORWARDED, forwarded_for),
        ForwardedHeader::XRealIp => return single("x-real-ip"),
        ForwardedHeader::CfConnectingIp => return single("cf-connecting-ip"),
        ForwardedHeader::TrueClientIp => return single("true-client-ip"),
    };
    let mut client = peer;
    for (position, hop) in hops.iter().rev().enumerate() {
        match parse_hop(hop) {
            Some(ip) if trust.trusts(ip, position + 1) => client = ip,
            Some(ip) => return ip,
            None => return client,
        }
    }
    client
}

/// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`, from dual-stack sockets) become IPv4, so one
/// client has one key.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Every hop of every instance of the header, in order. Bytes that are not text are read as
/// replacement characters: they spoil the hop they are in, which then stops the walk, and no
/// other (a client's unreadable bytes must not hide the address a trusted proxy appended to
/// the same line).
fn hops(
    headers: &HeaderMap,
    name: header::HeaderName,
    split: impl Fn(&str) -> Vec<String>,
) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|value| split(&String::from_utf8_lossy(value.as_bytes())))
        .collect()
}

/// The `for=` value of each element of a `Forwarded` header value (RFC 7239 section 4); an
/// element without one yields an empty (unparseable) hop.
fn forwarded_for(value: &str) -> Vec<String> {
    split_outside_quotes(value, ',')
        .into_iter()
        .map(|element| {
            split_outside_quotes(element, ';')
                .into_iter()
                .filter_map(|pair| pair.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                .map(|(_, v)| v.trim().trim_matches('"').to_owned())
                .unwrap_or_default()
        })
        .collect()
}

/// `text` split at each `separator` outside a quoted string; at every one, if a quote is left
/// open (a client's unbalanced quote must not swallow the elements a proxy appended).
fn split_outside_quotes(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut escaped = false;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if quoted {
        return text.split(separator).collect();
    }
    parts.push(&text[start..]);
    parts
}

/// `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`, `[2001:db8::1]` or `[2001:db8::1]:4711`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(canonical(addr.ip()));
    }
    let bracketed = hop.strip_prefix('[')?.strip_suffix(']')?;
    bracketed.parse::<IpAddr>().ok().map(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    /// `client_ip` trusting `trusted` networks only.
    fn by_nets(peer: IpAddr, h: &HeaderMap, trusted: &[IpNet], source: ForwardedHeader) -> IpAddr {
        client_ip(
            peer,
            h,
            Trust {
                nets: trusted,
                hops: 0,
            },
            source,
        )
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, value.parse().unwrap());
        }
        h
    }

    #[test]
    fn an_untrusted_peer_cannot_choose_its_address() {
        let h = headers(&[("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=1.2.3.4")]);
        let trusted = nets(&["10.0.0.0/8"]);
        for source in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
            assert_eq!(
                by_nets(ip("203.0.113.9"), &h, &trusted, source),
                ip("203.0.113.9")
            );
        }
    }

    #[test]
    fn the_chain_is_walked_from_the_right_skipping_trusted_hops() {
        let trusted = nets(&["10.0.0.0/8"]);
        // The client forged the first entry; the first untrusted hop from the right is real.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.2")]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor);
        assert_eq!(got, ip("198.51.100.7"));
        // Several header lines are one list, in order.
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "198.51.100.7, 10.0.0.2"),
        ]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor);
        assert_eq!(got, ip("198.51.100.7"));
        // All hops trusted: the leftmost is the client.
        let h = headers(&[("x-forwarded-for", "10.9.9.9, 10.0.0.2")]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor);
        assert_eq!(got, ip("10.9.9.9"));
        // No header: the peer itself.
        let got = by_nets(
            ip("10.0.0.1"),
            &HeaderMap::new(),
            &trusted,
            ForwardedHeader::XForwardedFor,
        );
        assert_eq!(got, ip("10.0.0.1"));
    }

    /// A client's unreadable bytes or unbalanced quote spoil its own hop only: the address the
    /// trusted proxy appended to the same line is still read, so the client does not pass for
    /// the proxy (whose address every client behind it shares).
    #[test]
    fn a_clients_garbage_does_not_hide_what_the_proxy_appended() {
        let trusted = nets(&["10.0.0.0/8"]);
        let mut h = HeaderMap::new();
        let value = http::HeaderValue::from_bytes(b"\xff\xfe, 198.51.100.7").unwrap();
        h.append("x-forwarded-for", value);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor);
        assert_eq!(got, ip("198.51.100.7"));
        let mut h = HeaderMap::new();
        let value = http::HeaderValue::from_bytes(b"for=\xff, for=198.51.100.7").unwrap();
        h.append("forwarded", value);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded);
        assert_eq!(got, ip("198.51.100.7"));
        let h = headers(&[("forwarded", "for=\"x, for=198.51.100.7")]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded);
        assert_eq!(got, ip("198.51.100.7"));
        // A quoted address with its port still reads whole.
        let h = headers(&[("forwarded", "for=\"[2001:db8::1]:4711\", for=10.0.0.2")]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded);
        assert_eq!(got, ip("2001:db8::1"));
    }

    #[test]
    fn garbage_stops_the_walk_at_the_last_trusted_hop() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "198.51.100.7, unknown, 10.0.0.2")]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor);
        assert_eq!(got, ip("10.0.0.2"));
    }

    #[test]
    fn forwarded_elements_with_ports_and_brackets() {
        let trusted = nets(&["10.0.0.0/8", "2001:db8:cafe::/48"]);
        let h = headers(&[(
            "forwarded",
            r#"for=6.6.6.6, for="[2001:db8::17]:4711";proto=https, For="198.51.100.7:47011";by=10.0.0.2, for=10.0.0.3"#,
        )]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded);
        assert_eq!(got, ip("198.51.100.7"));
        let h = headers(&[("forwarded", r#"for="[2001:db8::17]:4711", for=10.0.0.3"#)]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded);
        assert_eq!(got, ip("2001:db8::17"));
        // X-Forwarded-For is ignored when the proxies speak Forwarded.
        let h = headers(&[("x-forwarded-for", "198.51.100.7")]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded);
        assert_eq!(got, ip("10.0.0.1"));
        // An obfuscated identifier is not an address.
        let h = headers(&[("forwarded", "for=_hidden, for=10.0.0.3")]);
        let got = by_nets(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded);
        assert_eq!(got, ip("10.0.0.3"));
    }

    #[test]
    fn mapped_addresses_are_ipv4() {
        let got = by_nets(
            ip("::ffff:203.0.113.9"),
            &HeaderMap::new(),
            &[],
            ForwardedHeader::XForwardedFor,
        );
        assert_eq!(got, ip("203.0.113.9"));
        assert!(!got.is_ipv6());
    }

    #[test]
    fn one_address_headers_are_believed_from_trusted_peers_only() {
        let trusted = nets(&["10.0.0.0/8"]);
        for (name, source) in [
            ("x-real-ip", ForwardedHeader::XRealIp),
            ("cf-connecting-ip", ForwardedHeader::CfConnectingIp),
            ("true-client-ip", ForwardedHeader::TrueClientIp),
        ] {
            let h = headers(&[(name, "198.51.100.7"), ("x-forwarded-for", "6.6.6.6")]);
            assert_eq!(
                by_nets(ip("10.0.0.1"), &h, &trusted, source),
                ip("198.51.100.7")
            );
            assert_eq!(
                by_nets(ip("203.0.113.9"), &h, &trusted, source),
                ip("203.0.113.9")
            );
            // Not one address: the peer.
            for bad in [
                headers(&[(name, "198.51.100.7, 6.6.6.6")]),
                headers(&[(name, "a"), (name, "b")]),
            ] {
                assert_eq!(
                    by_nets(ip("10.0.0.1"), &bad, &trusted, source),
                    ip("10.0.0.1")
                );
            }
            let h = headers(&[(name, "[2001:db8::17]:4711")]);
            assert_eq!(
                by_nets(ip("10.0.0.1"), &h, &trusted, source),
                ip("2001:db8::17")
            );
        }
    }

    #[test]
    fn trusting_hops_by_count_takes_the_address_the_nearest_proxies_saw() {
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 203.0.113.50")]);
        let xff = ForwardedHeader::XForwardedFor;
        let count = |hops| Trust { nets: &[], hops };
        // One proxy (the peer, any address): the rightmost entry is what it saw.
        assert_eq!(
            client_ip(ip("192.0.2.1"), &h, count(1), xff),
            ip("203.0.113.50")
        );
        // Two proxies: the peer and the rightmost entry.
        assert_eq!(
            client_ip(ip("192.0.2.1"), &h, count(2), xff),
            ip("198.51.100.7")
        );
        // More hops than the chain has: the leftmost entry.
        assert_eq!(client_ip(ip("192.0.2.1"), &h, count(9), xff), ip("6.6.6.6"));
        // None by count: the peer.
        assert_eq!(
            client_ip(ip("192.0.2.1"), &h, count(0), xff),
            ip("192.0.2.1")
        );
        // Counted hops and trusted networks add up.
        let trusted = nets(&["203.0.113.0/24"]);
        let both = Trust {
            nets: &trusted,
            hops: 1,
        };
        assert_eq!(
            client_ip(ip("192.0.2.1"), &h, both, xff),
            ip("198.51.100.7")
        );
    }
}
