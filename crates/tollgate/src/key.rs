//! Store keys: `prefix:{limiter identity}:suffix`.
//!
//! Invariant 7: every part a user can influence is escaped, so two different identities never
//! share a key and no text breaks out of its part. Escaping is percent-encoding of `%`, the
//! separators `:` and `|`, the hash-tag braces, `#` and every byte outside printable ASCII;
//! an escaped part longer than [`MAX_PART`] bytes is replaced by `#` and 32 hex digits of its
//! SHA-256 (a `#` never appears in an escaped part, so a hashed part never equals a literal one).
//! The braces make the limiter identity the Redis Cluster hash tag: all keys of one limiter
//! live in one slot.

use std::{
    collections::HashMap,
    sync::{Arc, LazyLock},
};

use arrayvec::ArrayVec;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::rule::{Algorithm, Rule};

/// The longest escaped key part kept as text; longer parts are hashed.
pub const MAX_PART: usize = 128;

/// A key being built on the stack, as bytes: keys are ASCII (every other byte is escaped), so
/// the text is read once at the end ([`KeyBuf::text`]). The bytes live in an array while they
/// fit (an append is one copy: a small vector's costs a `memmove` and a `memcpy` call; and the
/// array is not zeroed first, where a check's keys fill a few dozen of its bytes), then on the
/// heap.
#[derive(Default)]
pub(crate) struct KeyBuf {
    /// The bytes, while they fit and nothing spilled.
    inline: ArrayVec<u8, KEY_INLINE>,
    /// Every byte, once they outgrew `inline`; empty until then.
    spilled: Vec<u8>,
}

/// The bytes a [`KeyBuf`] holds on the stack.
const KEY_INLINE: usize = 256;

impl KeyBuf {
    /// The keys written so far, when they are all text.
    #[cfg(test)]
    pub(crate) fn text(&self) -> &str {
        ascii(self.bytes())
    }

    /// The text keys written in `range` (compact keys are not text: see [`push_compact_part`]).
    pub(crate) fn text_at(&self, range: std::ops::Range<usize>) -> &str {
        ascii(&self.bytes()[range])
    }

    /// Everything written so far, as bytes.
    #[inline]
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.spilled.is_empty() {
            &self.inline
        } else {
            &self.spilled
        }
    }

    /// Appends bytes of a compact key.
    #[inline]
    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) {
        if self.spilled.is_empty() {
            if self.inline.try_extend_from_slice(bytes).is_ok() {
                return;
            }
            self.spill();
        }
        self.spilled.extend_from_slice(bytes);
    }

    /// Appends one byte of a compact key.
    #[inline]
    pub(crate) fn push_byte(&mut self, byte: u8) {
        if !(self.spilled.is_empty() && self.inline.try_push(byte).is_ok()) {
            self.push_bytes(&[byte]);
        }
    }

    /// Moves the bytes to the heap (they outgrew the array).
    #[cold]
    fn spill(&mut self) {
        self.spilled.reserve(2 * KEY_INLINE);
        self.spilled.extend_from_slice(&self.inline);
    }
}

/// The first byte of a compact key: no text holds it (it is never UTF-8), so a compact key
/// never equals a text key.
pub(crate) const COMPACT_MARK: u8 = 0xff;

/// Appends an identity's value to a compact key: its bytes as they are (tagged 0), or, past
/// [`MAX_PART`], its hashed text form (tagged 1), so that memory per key stays bounded and no
/// short value can pose as a long one's digest.
pub(crate) fn push_compact_part(out: &mut KeyBuf, value: &str) {
    if value.len() <= MAX_PART {
        out.push_ascii(0);
        out.push_bytes(value.as_bytes());
    } else {
        out.push_ascii(1);
        push_escaped(out, value);
    }
}

/// Text that keys are written into: a `String`, or the stack buffer of a check.
pub(crate) trait KeyOut {
    /// Appends text.
    fn push_str(&mut self, s: &str);
    /// Appends an ASCII byte.
    fn push_ascii(&mut self, b: u8);
    /// The length in bytes.
    fn len(&self) -> usize;
    /// Shortens to `len` bytes.
    fn truncate(&mut self, len: usize);
    /// Appends bytes known to be ASCII.
    fn push_ascii_bytes(&mut self, bytes: &[u8]) {
        self.push_str(ascii(bytes));
    }
}

impl KeyOut for String {
    fn push_str(&mut self, s: &str) {
        String::push_str(self, s);
    }
    fn push_ascii(&mut self, b: u8) {
        self.push(char::from(b));
    }
    fn len(&self) -> usize {
        String::len(self)
    }
    fn truncate(&mut self, len: usize) {
        String::truncate(self, len);
    }
}

/// A network's text ([`NetworkText`](crate::identity::NetworkText)), sized for the longest.
impl KeyOut for crate::identity::NetworkText {
    #[inline]
    fn push_str(&mut self, s: &str) {
        // Sized for the longest text written into it: never full.
        let _ = self.try_push_str(s);
    }
    #[inline]
    fn push_ascii(&mut self, b: u8) {
        let _ = self.try_push(char::from(b));
    }
    fn len(&self) -> usize {
        arrayvec::ArrayString::len(self)
    }
    fn truncate(&mut self, len: usize) {
        arrayvec::ArrayString::truncate(self, len);
    }
}

impl KeyOut for KeyBuf {
    #[inline]
    fn push_str(&mut self, s: &str) {
        self.push_bytes(s.as_bytes());
    }
    #[inline]
    fn push_ascii(&mut self, b: u8) {
        self.push_byte(b);
    }
    #[inline]
    fn len(&self) -> usize {
        self.bytes().len()
    }
    #[inline]
    fn truncate(&mut self, len: usize) {
        if self.spilled.is_empty() {
            self.inline.truncate(len);
        } else if len == 0 {
            // Empty again: back to the array.
            self.spilled.clear();
            self.inline.clear();
        } else {
            self.spilled.truncate(len);
        }
    }
    #[inline]
    fn push_ascii_bytes(&mut self, bytes: &[u8]) {
        self.push_bytes(bytes);
    }
}

/// Appends `part` to `out`, escaped (and hashed if long).
pub fn push_part(out: &mut String, part: &str) {
    push_escaped(out, part);
}

/// [`push_part`] into any key buffer.
pub(crate) fn push_escaped(out: &mut (impl KeyOut + ?Sized), part: &str) {
    let bytes = part.as_bytes();
    // The common case, a short part with nothing to escape (an IPv4 network, most ids): one
    // copy.
    if bytes.len() <= MAX_PART && !bytes.iter().any(|&b| needs_escape(b)) {
        return out.push_str(part);
    }
    let start = out.len();
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        // Everything before `b` needs no escaping (printable ASCII): one copy.
        out.push_ascii_bytes(&bytes[plain..i]);
        out.push_ascii(b'%');
        out.push_ascii(HEX_UPPER[usize::from(b >> 4)]);
        out.push_ascii(HEX_UPPER[usize::from(b & 0xf)]);
        plain = i + 1;
        if out.len() - start > MAX_PART {
            break;
        }
    }
    if out.len() - start <= MAX_PART {
        out.push_ascii_bytes(&bytes[plain..]);
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

#[inline]
fn needs_escape(b: u8) -> bool {
    !(0x21..0x7f).contains(&b) || matches!(b, b'%' | b':' | b'|' | b'{' | b'}' | b'#')
}

fn push_hex(out: &mut (impl KeyOut + ?Sized), b: u8, digits: &[u8; 16]) {
    out.push_ascii(digits[usize::from(b >> 4)]);
    out.push_ascii(digits[usize::from(b & 0xf)]);
}

fn push_hashed(out: &mut (impl KeyOut + ?Sized), bytes: &[u8]) {
    let digest = Sha256::digest(bytes);
    out.push_ascii(b'#');
    for &b in &digest[..16] {
        push_hex(out, b, b"0123456789abcdef");
    }
}

/// Appends an IPv4 address in dotted form, without the formatting machinery (digits and dots
/// need no escaping): written on the stack from a table of the 256 octets, appended once.
pub(crate) fn push_ipv4(out: &mut (impl KeyOut + ?Sized), ip: std::net::Ipv4Addr) {
    let mut text = [0; 16];
    let mut len = 0;
    for octet in ip.octets() {
        let (digits, n) = DECIMAL[usize::from(octet)];
        text[len..len + 4].copy_from_slice(&digits);
        len += n;
    }
    // Each octet was written with a dot after it: the last one is dropped.
    out.push_ascii_bytes(&text[..len - 1]);
}

/// Every byte in decimal followed by a dot, and the length of that text.
const DECIMAL: [([u8; 4], usize); 256] = {
    let mut table = [([0; 4], 0); 256];
    let mut n = 0;
    while n < 256 {
        let b = n as u8;
        let mut digits = [0; 4];
        let mut len = 0;
        if b >= 100 {
            digits[len] = b'0' + b / 100;
            len += 1;
        }
        if b >= 10 {
            digits[len] = b'0' + b / 10 % 10;
            len += 1;
        }
        digits[len] = b'0' + b % 10;
        digits[len + 1] = b'.';
        table[n] = (digits, len + 2);
        n += 1;
    }
    table
};

/// Appends a byte in decimal.
pub(crate) fn push_u8(out: &mut (impl KeyOut + ?Sized), n: u8) {
    let (digits, len) = DECIMAL[usize::from(n)];
    out.push_ascii_bytes(&digits[..len - 1]);
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
    out.push_ascii(b':');
}

/// The text every limiter key of an engine starts with: `prefix:{`.
pub(crate) fn limiter_key_start(prefix: &str) -> KeyHead {
    KeyHead::new(format!("{prefix}:{{"))
}

/// A fixed part of limiter keys: an engine's `prefix:{`, or a limiter's `scope:name:` (see
/// [`limiter_head`]). Text keys hold its text; compact keys its number ([`name_id`]), four
/// bytes that hash and compare faster than the text.
#[derive(Clone, Debug)]
pub(crate) struct KeyHead {
    pub(crate) text: Arc<str>,
    pub(crate) id: u32,
}

impl KeyHead {
    pub(crate) fn new(text: impl Into<Arc<str>>) -> KeyHead {
        let text = text.into();
        let id = name_id(&text);
        KeyHead { text, id }
    }
}

/// A number for `text`, the same for the same text and different for different texts for the
/// life of the process: what compact keys name an engine's prefix and a limiter by. The texts
/// come from configuration (prefixes, policy and limiter names), never from a request, so the
/// table grows with the configuration only: building the same policy again adds nothing.
pub(crate) fn name_id(text: &str) -> u32 {
    static IDS: LazyLock<Mutex<HashMap<Box<str>, u32>>> = LazyLock::new(Mutex::default);
    let mut ids = IDS.lock();
    if let Some(&id) = ids.get(text) {
        return id;
    }
    let id = u32::try_from(ids.len()).expect("fewer than 2^32 key names in one process");
    ids.insert(text.into(), id);
    id
}

/// Appends the start of a compact limiter key: [`COMPACT_MARK`] (no text key has it, as no
/// UTF-8 text has it), then the numbers of the engine's key start and the limiter's head, of
/// fixed width, so that the value's bytes that follow are never read as part of them.
#[inline(always)]
pub(crate) fn push_compact_head(out: &mut KeyBuf, start: &KeyHead, head: &KeyHead) {
    let ([a, b, c, d], [e, f, g, h]) = (start.id.to_le_bytes(), head.id.to_le_bytes());
    out.push_bytes(&[COMPACT_MARK, a, b, c, d, e, f, g, h]);
}

/// Appends the name of an Envoy descriptor's counter: its entries `key:value|key:value`,
/// escaped, so that two different entry lists never share a name. An entry a shared wildcard
/// matched, given with its pattern, is written `key:#*pattern`: `#` is escaped in parts and
/// starts only hashed ones (hex digits follow), so no value is written that way.
pub fn push_descriptor_name<'a>(
    out: &mut String,
    entries: impl IntoIterator<Item = (&'a str, &'a str, Option<&'a str>)>,
) {
    for (i, (key, value, pattern)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        push_part(out, key);
        out.push(':');
        match pattern {
            Some(pattern) => {
                out.push_str("#*");
                push_part(out, pattern);
            }
            None => push_part(out, value),
        }
    }
}

/// Appends the key of an Envoy descriptor's counter named `name` (see
/// [`push_descriptor_name`]) in the domain whose scope, escaped, is `scope_part`: the limiter
/// key `prefix:{scope:name:}` (the counter's name as the limiter, no value).
pub fn push_descriptor_key(out: &mut String, prefix: &str, scope_part: &str, name: &str) {
    open_limiter_key(out, prefix, scope_part);
    push_part(out, name);
    out.push_str(":}");
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
/// counter (`base:f<limit>/<window ms>`), a GCRA rule its timestamp (`base:g<limit>/<window ms>`),
/// a sliding-window rule its two counters (`base:w<limit>/<window ms>`).
pub fn rule_key(base: &str, rule: &Rule) -> String {
    match rule.algorithm() {
        Algorithm::SlidingLog => format!("{base}:l"),
        Algorithm::FixedWindow => match rule.calendar_window() {
            Some(calendar) => format!("{base}:c{}/{calendar}", rule.limit()),
            None => format!("{base}:f{}/{}", rule.limit(), rule.window_ms()),
        },
        Algorithm::Gcra => format!("{base}:g{}/{}", rule.limit(), rule.window_ms()),
        Algorithm::SlidingWindow => format!("{base}:w{}/{}", rule.limit(), rule.window_ms()),
    }
}

/// The key of one rule of `check_single` (each rule counted on a key of its own):
/// `base:r<limit>/<window ms>:<algorithm>` under a [`group_key`].
pub(crate) fn single_key(base: &str, rule: &Rule) -> String {
    match rule.calendar_window() {
        Some(calendar) => format!("{base}:r{}/{calendar}:{}", rule.limit(), rule.algorithm()),
        None => format!(
            "{base}:r{}/{}:{}",
            rule.limit(),
            rule.window_ms(),
            rule.algorithm()
        ),
    }
}

/// Appends the key of a ban: `prefix:ban:kind:value`, the value escaped.
///
/// A ban key has no hash tag (no braces: the prefix, the kind and the escaped value hold
/// none), so on a Redis Cluster the whole key, one per target, picks its slot: the bans spread
/// over the cluster by target, and a check reads its targets' slots only. Every ban key under
/// `prefix` starts with `prefix:ban:`, what `push_ban_key(out, prefix, "", "")` writes less
/// its last byte.
pub(crate) fn push_ban_key(
    out: &mut (impl KeyOut + ?Sized),
    prefix: &str,
    kind: &str,
    value: &str,
) {
    out.push_str(prefix);
    out.push_str(":ban:");
    out.push_str(kind);
    out.push_ascii(b':');
    push_escaped(out, value);
}

/// The ban prefix of a policy whose bans are its own ([`BanScope::Policy`]):
/// `prefix:p:<scope>`, the scope escaped. Its ban keys (`prefix:p:<scope>:ban:kind:value`) and
/// its ban index never meet the blocklist every policy sees (`prefix:ban:...`).
///
/// [`BanScope::Policy`]: crate::BanScope::Policy
pub(crate) fn push_policy_ban_prefix(out: &mut (impl KeyOut + ?Sized), prefix: &str, scope: &str) {
    out.push_str(prefix);
    out.push_str(":p:");
    push_escaped(out, scope);
}

/// A ban key under a policy's own ban prefix (see [`push_policy_ban_prefix`]).
pub(crate) fn push_policy_ban_key(
    out: &mut (impl KeyOut + ?Sized),
    prefix: &str,
    scope: &str,
    kind: &str,
    value: &str,
) {
    push_policy_ban_prefix(out, prefix, scope);
    out.push_str(":ban:");
    out.push_str(kind);
    out.push_ascii(b':');
    push_escaped(out, value);
}

/// The ban index under a policy's own ban prefix: as [`ban_index_key`] of that prefix.
pub(crate) fn push_policy_ban_index(out: &mut (impl KeyOut + ?Sized), prefix: &str, scope: &str) {
    push_policy_ban_prefix(out, prefix, scope);
    out.push_str(":{ban}:index");
}

/// The key of the index listing every ban under `prefix` (for stores that cannot scan):
/// `prefix:{ban}:index`, one key in one slot. Checks never read it: only writing or lifting a
/// ban, counting and listing the bans do.
pub fn ban_index_key(prefix: &str) -> String {
    format!("{prefix}:{{ban}}:index")
}

/// The key of one limiter key's override (see [`crate::OverrideStore`]): `base:o`, in the
/// limiter key's hash slot, where a check reads it beside the counters.
pub fn override_key(base: &str) -> String {
    format!("{base}:o")
}

/// The key marking one call that changed a limiter key's state as run: `base:a<16 hex digits>`,
/// in the limiter key's hash slot. A store whose client may send a call twice (a Redis Cluster
/// client re-sends a call whose reply it lost) names each call by a fresh `call` id, and the
/// script keeps its reply there for a while: the second run changes nothing and answers the
/// same. No state key ends so (theirs end in a rule's `:l`, `:f`, `:c`, `:g`, `:w`, `:r` or
/// `:o` part).
pub fn applied_key(base: &str, call: u64) -> String {
    format!("{base}:a{call:016x}")
}

/// The key of the index listing every override under `prefix`: `prefix:{ovr}:index`, one key
/// in one slot, which checks never read.
pub fn override_index_key(prefix: &str) -> String {
    format!("{prefix}:{{ovr}}:index")
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

    /// One number per text: the same text gets it again, different texts never share one.
    #[test]
    fn name_ids_are_one_per_text() {
        let texts: Vec<String> = (0..200).map(|i| format!("name-ids-test:{i}:")).collect();
        let ids: Vec<u32> = texts.iter().map(|t| name_id(t)).collect();
        let distinct: std::collections::HashSet<u32> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), texts.len());
        for (text, id) in texts.iter().zip(&ids) {
            assert_eq!(name_id(text), *id, "{text}");
        }
        assert_eq!(KeyHead::new(texts[7].as_str()).id, ids[7]);
    }

    /// A key buffer holds what was written, in order, across its move to the heap, and
    /// truncates on either side of it.
    #[test]
    fn a_key_buffer_keeps_its_bytes_past_its_array() {
        let mut buf = KeyBuf::default();
        let mut expected = Vec::new();
        for i in 0..100u8 {
            let part = [i; 7];
            if i % 3 == 0 {
                buf.push_byte(i);
                expected.push(i);
            } else {
                buf.push_bytes(&part);
                expected.extend_from_slice(&part);
            }
            assert_eq!(buf.bytes(), &expected[..], "after part {i}");
            assert_eq!(KeyOut::len(&buf), expected.len());
        }
        assert!(expected.len() > KEY_INLINE);
        buf.truncate(300);
        expected.truncate(300);
        assert_eq!(buf.bytes(), &expected[..]);
        buf.truncate(0);
        assert!(buf.bytes().is_empty());
        buf.push_str("tg:{");
        assert_eq!(buf.text(), "tg:{");
        buf.truncate(2);
        assert_eq!(buf.text(), "tg");
        // One write larger than the array at once.
        buf.push_bytes(&[b'x'; 2 * KEY_INLINE]);
        assert_eq!(buf.bytes().len(), 2 + 2 * KEY_INLINE);
        assert_eq!(&buf.bytes()[..3], b"tgx");
    }

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
    fn ipv4_text_matches_display_for_every_octet() {
        for n in 0..=255u8 {
            let ip = std::net::Ipv4Addr::new(n, 255 - n, n / 2, n.wrapping_mul(7));
            let mut text = KeyBuf::default();
            push_ipv4(&mut text, ip);
            assert_eq!(text.text(), ip.to_string());
            let mut byte = String::new();
            push_u8(&mut byte, n);
            assert_eq!(byte, n.to_string());
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

    #[test]
    fn a_call_marker_shares_its_limiters_slot_and_names_no_state() {
        let base = limiter_key("tg", "s", "ip", "1.2.3.4");
        let marker = applied_key(&base, 0xab);
        assert_eq!(marker, "tg:{s:ip:1.2.3.4}:a00000000000000ab");
        let rule = "1/1m".parse::<Rule>().unwrap();
        let mut state = vec![override_key(&base)];
        for algorithm in [
            Algorithm::SlidingLog,
            Algorithm::FixedWindow,
            Algorithm::Gcra,
            Algorithm::SlidingWindow,
        ] {
            let rule = rule.with_algorithm(algorithm);
            state.push(rule_key(&base, &rule));
            state.push(single_key(&base, &rule));
        }
        for key in &state {
            assert!(!key.starts_with(&format!("{base}:a")), "{key}");
        }
    }
}
