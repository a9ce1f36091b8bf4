//! Keyed hashes for a record that can be shared without personal data.
//!
//! A string value becomes `h:` and 32 hex digits: SHA-256 of the key and the value, cut to 128
//! bits. Equal values stay equal (so a plan counts them as the live server did), distinct ones
//! stay distinct, and without the key nobody can test a guess.
//!
//! An address stays an address of its family, hashed so that it keeps its prefixes: two
//! addresses that share their first `n` bits share their first `n` bits hashed, and only
//! then. A limiter that counts by `/24` or `/64` counts the hashed record as it counted the
//! traffic. Each bit is flipped or not by a function of the key and the bits before it; one
//! SHA-256 per byte gives the 255 such choices the byte's eight bits need (bit `j` takes the
//! choice at `2^j - 1 + ` the byte's `j` bits above it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sha2::{Digest, Sha256};

/// A hashing key (at least [`MIN_KEY`] bytes).
#[derive(Clone)]
pub(crate) struct Hasher {
    key: Vec<u8>,
}

/// The shortest key taken.
pub(crate) const MIN_KEY: usize = 16;

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hasher(..)")
    }
}

impl Hasher {
    /// A hasher with `key`; `None` when it is shorter than [`MIN_KEY`].
    pub(crate) fn new(key: &[u8]) -> Option<Hasher> {
        (key.len() >= MIN_KEY).then(|| Hasher { key: key.to_vec() })
    }

    /// `h:` and 32 hex digits of the keyed hash of `value`.
    pub(crate) fn text(&self, value: &str) -> String {
        let digest = Sha256::new()
            .chain_update(&self.key)
            .chain_update([0u8])
            .chain_update(value.as_bytes())
            .finalize();
        let mut out = String::with_capacity(34);
        out.push_str("h:");
        for byte in &digest[..16] {
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 15)]));
        }
        out
    }

    /// The address hashed within its family, its prefixes kept (see the module docs).
    pub(crate) fn ip(&self, ip: IpAddr) -> IpAddr {
        // An IPv4 address written as IPv6 (`::ffff:a.b.c.d`) is the IPv4 address the engine
        // counts it as.
        match ip.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(self.octets(v4.octets()))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(self.octets(v6.octets()))),
        }
    }

    fn octets<const N: usize>(&self, input: [u8; N]) -> [u8; N] {
        let mut out = [0u8; N];
        for k in 0..N {
            // The choices for byte k depend on the family, the bytes before it, and the key.
            let choices = Sha256::new()
                .chain_update(&self.key)
                .chain_update([1u8, N as u8, k as u8])
                .chain_update(&input[..k])
                .finalize();
            let byte = input[k];
            let mut hashed = 0u8;
            for j in 0..8 {
                let above = if j == 0 {
                    0
                } else {
                    usize::from(byte >> (8 - j))
                };
                let at = (1usize << j) - 1 + above;
                let flip = (choices[at / 8] >> (at % 8)) & 1;
                let bit = (byte >> (7 - j)) & 1;
                hashed |= (bit ^ flip) << (7 - j);
            }
            out[k] = hashed;
        }
        out
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    fn hasher(key: &str) -> Hasher {
        Hasher::new(key.as_bytes()).unwrap()
    }

    fn v4(text: &str) -> u32 {
        match hasher("a key of sixteen bytes").ip(text.parse().unwrap()) {
            IpAddr::V4(ip) => u32::from(ip),
            IpAddr::V6(_) => panic!("an IPv4 address stays IPv4"),
        }
    }

    #[test]
    fn strings_hash_to_the_same_text_under_one_key_only() {
        let (a, b) = (hasher("0123456789abcdef"), hasher("0123456789abcdeF"));
        assert_eq!(a.text("42"), a.text("42"));
        assert_ne!(a.text("42"), a.text("43"));
        assert_ne!(a.text("42"), b.text("42"));
        assert!(a.text("42").starts_with("h:"));
        assert_eq!(a.text("42").len(), 34);
        assert!(Hasher::new(b"short").is_none());
    }

    /// Two addresses share exactly as many leading bits hashed as they did before.
    #[test]
    fn addresses_keep_their_prefixes_and_only_them() {
        let pairs = [
            ("203.0.113.7", "203.0.113.8"),
            ("203.0.113.7", "203.0.112.7"),
            ("10.0.0.1", "192.168.0.1"),
            ("10.0.0.1", "10.0.0.1"),
            ("1.2.3.4", "1.2.3.5"),
        ];
        for (a, b) in pairs {
            let (pa, pb): (Ipv4Addr, Ipv4Addr) = (a.parse().unwrap(), b.parse().unwrap());
            let common = (u32::from(pa) ^ u32::from(pb)).leading_zeros();
            let hashed = (v4(a) ^ v4(b)).leading_zeros();
            assert_eq!(common, hashed, "{a} and {b}");
        }
        assert_ne!(
            v4("203.0.113.7"),
            u32::from("203.0.113.7".parse::<Ipv4Addr>().unwrap())
        );
        // Every address of a /24 maps into one /24, and no two to the same one.
        let mut seen = std::collections::HashSet::new();
        for last in 0..=255u8 {
            let hashed = v4(&format!("198.51.100.{last}"));
            assert_eq!(hashed >> 8, v4("198.51.100.0") >> 8);
            assert!(seen.insert(hashed));
        }
        let six = hasher("a key of sixteen bytes");
        let (a, b) = (
            six.ip("2001:db8:1:2::1".parse().unwrap()),
            six.ip("2001:db8:1:2::ffff".parse().unwrap()),
        );
        let (IpAddr::V6(a), IpAddr::V6(b)) = (a, b) else {
            panic!("an IPv6 address stays IPv6")
        };
        assert_eq!(u128::from(a) >> 64, u128::from(b) >> 64, "one /64");
        assert_ne!(a, b);
    }
}
