//! Store keys: `prefix:{limiter identity}:suffix`.
//!
//! Invariant 7: every part a user can influence is escaped, so two different identities never
//! share a key and no text breaks out of its part. Escaping is percent-encoding of `%`, the
//! separators `:` and `|`, the hash-tag braces, `#` and every byte outside printable ASCII;
//! an escaped part longer than [`MAX_PART`] bytes is replaced by `#` and 32 hex digits of its
//! SHA-256 (a `#` never appears in an escaped part, so a hashed part never equals a literal one).
//! The braces make the limiter identity the Redis Cluster hash tag: all keys of one limiter
//! live in one slot.

use sha2::{Digest, Sha256};

use crate::rule::{Algorithm, Rule};

/// The longest escaped key part kept as text; longer parts are hashed.
pub const MAX_PART: usize = 128;

/// A key being built on the stack: a check's keys fit inline unless its identity is unusual.
pub(crate) type KeyBuf = smallstr::SmallString<[u8; 256]>;

/// Text that keys are written into: a `String`, or the stack buffer of a check.
pub(crate) trait KeyOut {
    /// Appends a character.
    fn push(&mut self, c: char);
    /// Appends text.
    fn push_str(&mut self, s: &str);
    /// The length in bytes.
    fn len(&self) -> usize;
    /// Shortens to `len` bytes.
    fn truncate(&mut self, len: usize);
}

impl KeyOut for String {
    fn push(&mut self, c: char) {
        String::push(self, c);
    }
    fn push_str(&mut self, s: &str) {
        String::push_str(self, s);
    }
    fn len(&self) -> usize {
        String::len(self)
    }
    fn truncate(&mut self, len: usize) {
        String::truncate(self, len);
    }
}

impl<A: smallvec::Array<Item = u8>> KeyOut for smallstr::SmallString<A> {
    fn push(&mut self, c: char) {
        smallstr::SmallString::push(self, c);
    }
    fn push_str(&mut self, s: &str) {
        smallstr::SmallString::push_str(self, s);
    }
    fn len(&self) -> usize {
        smallstr::SmallString::len(self)
    }
    fn truncate(&mut self, len: usize) {
        smallstr::SmallString::truncate(self, len);
    }
}

/// Appends `part` to `out`, escaped (and hashed if long).
pub fn push_part(out: &mut String, part: &str) {
    push_escaped(out, part);
}

/// [`push_part`] into any key buffer.
pub(crate) fn push_escaped(out: &mut (impl KeyOut + ?Sized), part: &str) {
    let start = out.len();
    let bytes = part.as_bytes();
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        // Everything before `b` needs no escaping (printable ASCII): one copy.
        out.push_str(ascii(&bytes[plain..i]));
        let mut hex = *b"%00";
        hex[1] = HEX_UPPER[usize::from(b >> 4)];
        hex[2] = HEX_UPPER[usize::from(b & 0xf)];
        out.push_str(ascii(&hex));
        plain = i + 1;
        if out.len() - start > MAX_PART {
            break;
        }
    }
    if out.len() - start <= MAX_PART {
        out.push_str(ascii(&bytes[plain..]));
    }
    if out.len() - start > MAX_PART {
        out.truncate(start);
        push_hashed(out, bytes);
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Bytes known to be ASCII as text.
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

fn needs_escape(b: u8) -> bool {
    !(0x21..0x7f).contains(&b) || matches!(b, b'%' | b':' | b'|' | b'{' | b'}' | b'#')
}

fn push_hex(out: &mut (impl KeyOut + ?Sized), b: u8, digits: &[u8; 16]) {
    out.push(char::from(digits[usize::from(b >> 4)]));
    out.push(char::from(digits[usize::from(b & 0xf)]));
}

fn push_hashed(out: &mut (impl KeyOut + ?Sized), bytes: &[u8]) {
    let digest = Sha256::digest(bytes);
    out.push('#');
    for &b in &digest[..16] {
        push_hex(out, b, b"0123456789abcdef");
    }
}

/// Appends an IPv4 address in dotted form, without the formatting machinery (digits and dots
/// need no escaping).
pub(crate) fn push_ipv4(out: &mut (impl KeyOut + ?Sized), ip: std::net::Ipv4Addr) {
    let mut text = [0u8; 15];
    let mut len = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        len += write_u8(&mut text[len..], octet);
    }
    out.push_str(ascii(&text[..len]));
}

/// Appends a byte in decimal.
pub(crate) fn push_u8(out: &mut (impl KeyOut + ?Sized), n: u8) {
    let mut text = [0u8; 3];
    let len = write_u8(&mut text, n);
    out.push_str(ascii(&text[..len]));
}

/// Writes `n` in decimal at the start of `to` (which has room for three digits); its length.
fn write_u8(to: &mut [u8], n: u8) -> usize {
    let digits = [n / 100, n / 10 % 10, n % 10];
    let skip = if n >= 100 {
        0
    } else if n >= 10 {
        1
    } else {
        2
    };
    for (slot, d) in to.iter_mut().zip(&digits[skip..]) {
        *slot = b'0' + d;
    }
    3 - skip
}

/// The base key of one limiter of a policy for one dimension value:
/// `prefix:{scope:limiter:value}`.
pub fn limiter_key(prefix: &str, scope: &str, limiter: &str, value: &str) -> String {
    let head = limiter_head(scope, limiter);
    let mut key = String::with_capacity(prefix.len() + head.len() + value.len() + 4);
    open_limiter_key(&mut key, prefix, &head);
    push_part(&mut key, value);
    key.push('}');
    key
}

/// The part of a limiter key that a policy fixes: `scope:limiter`, escaped.
pub(crate) fn limiter_head(scope: &str, limiter: &str) -> String {
    let mut head = String::with_capacity(scope.len() + limiter.len() + 1);
    push_part(&mut head, scope);
    head.push(':');
    push_part(&mut head, limiter);
    head
}

/// Appends a limiter key up to its value: `prefix:{head:`. The value, escaped, and `}` follow.
pub(crate) fn open_limiter_key(out: &mut (impl KeyOut + ?Sized), prefix: &str, head: &str) {
    out.push_str(prefix);
    out.push_str(":{");
    out.push_str(head);
    out.push_str(":");
}

/// The base key of a caller-named group (`check_group` / `check_single`): `prefix:{k:name}`.
pub fn group_key(prefix: &str, name: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + name.len() + 6);
    key.push_str(prefix);
    key.push_str(":{k:");
    push_part(&mut key, name);
    key.push('}');
    key
}

/// The key holding one rule's state under a limiter's base key.
///
/// All sliding-log rules of a limiter share one log (`base:l`); a fixed-window rule has its
/// counter (`base:f<limit>/<window ms>`), a GCRA rule its timestamp (`base:g<limit>/<window ms>`).
pub fn rule_key(base: &str, rule: &Rule) -> String {
    match rule.algorithm() {
        Algorithm::SlidingLog => format!("{base}:l"),
        Algorithm::FixedWindow => format!("{base}:f{}/{}", rule.limit(), rule.window_ms()),
        Algorithm::Gcra => format!("{base}:g{}/{}", rule.limit(), rule.window_ms()),
    }
}

/// The key of one rule of `check_single` (each rule counted on a key of its own):
/// `base:r<limit>/<window ms>:<algorithm>` under a [`group_key`].
pub(crate) fn single_key(base: &str, rule: &Rule) -> String {
    format!(
        "{base}:r{}/{}:{}",
        rule.limit(),
        rule.window_ms(),
        rule.algorithm()
    )
}

/// Appends the key of a ban: `prefix:{ban}:kind:value`, the value escaped.
///
/// All bans share the `{ban}` hash tag so a Redis Cluster can list them from one slot.
pub(crate) fn push_ban_key(
    out: &mut (impl KeyOut + ?Sized),
    prefix: &str,
    kind: &str,
    value: &str,
) {
    out.push_str(prefix);
    out.push_str(":{ban}:");
    out.push_str(kind);
    out.push(':');
    push_escaped(out, value);
}

/// The key of the index listing every ban under `prefix` (for stores that cannot scan).
pub fn ban_index_key(prefix: &str) -> String {
    format!("{prefix}:{{ban}}:index")
}

/// The key of a duplicate-guard lock: `prefix:{d:scope:by:value}` (scope empty when global).
pub(crate) fn guard_key(prefix: &str, scope: &str, by: &str, value: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + scope.len() + by.len() + value.len() + 8);
    key.push_str(prefix);
    key.push_str(":{d:");
    push_part(&mut key, scope);
    key.push(':');
    push_part(&mut key, by);
    key.push(':');
    push_part(&mut key, value);
    key.push('}');
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_and_braces_cannot_break_out() {
        let a = limiter_key("tg", "login", "user_name", "a:b");
        let b = limiter_key("tg", "login:user_name:a", "b", "");
        assert_ne!(a, b);
        assert_eq!(a, "tg:{login:user_name:a%3Ab}");
        let k = limiter_key("tg", "s", "l", "}x{");
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
        assert!(k.ends_with('}'));
    }

    #[test]
    fn escape_is_injective_on_tricky_inputs() {
        let inputs = [
            "", "%", "%25", "a b", "a\u{0}b", "é", "#abc", "|", ":", "{}",
        ];
        let mut seen = std::collections::HashSet::new();
        for i in inputs {
            let mut s = String::new();
            push_part(&mut s, i);
            assert!(seen.insert(s.clone()), "{i:?} -> {s}");
        }
    }

    #[test]
    fn long_parts_are_hashed() {
        let long = "x".repeat(1000);
        let mut s = String::new();
        push_part(&mut s, &long);
        assert_eq!(s.len(), 33);
        assert!(s.starts_with('#'));
        let mut t = String::new();
        push_part(&mut t, &format!("{long}y"));
        assert_ne!(s, t);
        // Escaping can make a short input long: still hashed, still bounded.
        let mut u = String::new();
        push_part(&mut u, &"\u{1}".repeat(50));
        assert_eq!(u.len(), 33);
    }

    #[test]
    fn rule_keys_share_the_log_and_separate_counters() {
        let base = limiter_key("tg", "s", "ip", "1.2.3.4");
        let r = |t: &str| t.parse::<Rule>().unwrap();
        assert_eq!(rule_key(&base, &r("1/1m")), rule_key(&base, &r("10/1h")));
        let f = r("1/1m").with_algorithm(Algorithm::FixedWindow);
        let g = r("1/1m").with_algorithm(Algorithm::Gcra);
        assert_eq!(rule_key(&base, &f), "tg:{s:ip:1.2.3.4}:f1/60000");
        assert_eq!(rule_key(&base, &g), "tg:{s:ip:1.2.3.4}:g1/60000");
    }
}
