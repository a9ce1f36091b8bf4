//! The reference service's per-descriptor statistics, for YAML domains: each matched
//! descriptor is counted under its statistics key (see `Domain::find`) as `total_hits`,
//! `within_limit`, `near_limit`, `over_limit` and `shadow_mode`, in hits (a request's
//! `hits_addend`), split as the reference splits them.
//!
//! A key names configured values only, unless the YAML asks for the request's own
//! (`detailed_metric`, `value_to_metric`) or a descriptor brings its own `limit`: then a flood
//! of values could grow the series without end, so the keys are bounded
//! (`envoy.max_stat_keys`); past that, a domain's new keys are counted under one key, `(other)`.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};

/// What the series of a key count.
const KINDS: [&str; 5] = [
    "total_hits",
    "within_limit",
    "near_limit",
    "over_limit",
    "shadow_mode",
];

/// The key new keys are counted under once `envoy.max_stat_keys` are known.
pub(crate) const OTHER: &str = "(other)";

/// The longest statistics key or unknown domain kept as it is, in bytes: a longer one (a
/// request's own value, up to a megabyte) is kept as its first bytes and a hash of it, so that
/// `envoy.max_stat_keys` bounds the memory the labels take, not only their number.
const MAX_LABEL: usize = 256;

/// `text`, or, past [`MAX_LABEL`] bytes, its first bytes, `~` and 16 hex digits of its hash.
fn bounded(text: &str) -> std::borrow::Cow<'_, str> {
    use std::hash::{Hash, Hasher};
    if text.len() <= MAX_LABEL {
        return text.into();
    }
    // The standard library's SipHash with its fixed keys: the same text, the same label.
    let mut hasher = std::hash::DefaultHasher::new();
    text.hash(&mut hasher);
    let mut end = MAX_LABEL - 17;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}~{:016x}", &text[..end], hasher.finish()).into()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatLabels {
    domain: String,
    key: String,
    kind: &'static str,
}

/// The statistics' settings: the reference's `NEAR_LIMIT_RATIO`, and how many keys are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StatSettings {
    pub(crate) near_limit_ratio: f32,
    pub(crate) max_keys: usize,
}

impl Default for StatSettings {
    fn default() -> StatSettings {
        StatSettings {
            near_limit_ratio: 0.8,
            max_keys: 10_000,
        }
    }
}

/// The counters of one key, in the order of [`KINDS`].
#[derive(Debug)]
struct KeyCounters([Counter; 5]);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DomainLabels {
    domain: String,
}

/// Every key's counters, shared by the configurations a reload replaces: a series carries on.
#[derive(Debug, Default)]
pub(crate) struct DescriptorStats {
    family: Family<StatLabels, Counter>,
    keys: RwLock<HashMap<Box<str>, Arc<KeyCounters>>>,
    /// Requests for a domain that is not configured, by domain (as many as keys at most; the
    /// rest under `(other)`).
    not_found: Family<DomainLabels, Counter>,
    unknown: RwLock<HashMap<Box<str>, Counter>>,
    /// Requests the reference's `SHADOW_MODE` answered OK that were over.
    global_shadow: Counter,
}

/// How one descriptor of a request fared, in the reference's terms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hits {
    /// The request's hits for this descriptor.
    pub(crate) hits: u64,
    /// The descriptor's limit per unit (0: it blocks every request).
    pub(crate) limit: u64,
    /// Its count before this request, and whether the store counted it over (`None`: the
    /// store did not answer).
    pub(crate) before: Option<u64>,
    /// It is in shadow mode.
    pub(crate) shadow: bool,
}

impl DescriptorStats {
    /// The family to register in the server's metrics.
    pub(crate) fn family(&self) -> Family<StatLabels, Counter> {
        self.family.clone()
    }

    /// Counts a request `SHADOW_MODE` admitted over its limits.
    pub(crate) fn global_shadow_admitted(&self) {
        self.global_shadow.inc();
    }

    /// Requests `SHADOW_MODE` admitted over their limits, to register.
    pub(crate) fn global_shadow(&self) -> Counter {
        self.global_shadow.clone()
    }

    /// The family of requests for unknown domains, to register.
    pub(crate) fn not_found_family(&self) -> Family<DomainLabels, Counter> {
        self.not_found.clone()
    }

    /// Counts a request for `domain`, which is not configured (the reference's
    /// `domain_not_found`).
    pub(crate) fn domain_not_found(&self, settings: StatSettings, domain: &str) {
        let domain = &*bounded(domain);
        if let Some(counter) = self
            .unknown
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(domain)
        {
            counter.inc();
            return;
        }
        let mut unknown = self.unknown.write().unwrap_or_else(|e| e.into_inner());
        let domain = if unknown.len() >= settings.max_keys && !unknown.contains_key(domain) {
            OTHER
        } else {
            domain
        };
        unknown
            .entry(domain.into())
            .or_insert_with(|| {
                self.not_found
                    .get_or_create(&DomainLabels {
                        domain: domain.to_owned(),
                    })
                    .clone()
            })
            .inc();
    }

    /// Counts `hits` under `key` (`domain.part...`) of `domain`.
    pub(crate) fn count(&self, settings: StatSettings, domain: &str, key: &str, hits: Hits) {
        let counters = self.counters(settings, domain, &bounded(key));
        let [total, within, near, over, shadow] = &counters.0;
        total.inc_by(hits.hits);
        let Some(before) = hits.before else {
            return;
        };
        let after = before.saturating_add(hits.hits);
        // The reference's threshold: the limit times the ratio, in single precision, floored.
        let near_at = (hits.limit as f32 * settings.near_limit_ratio).floor() as u64;
        if after > hits.limit {
            // Hits past the limit are over; those between the near threshold and the limit,
            // near.
            if before >= hits.limit {
                over.inc_by(hits.hits);
            } else {
                over.inc_by(after - hits.limit);
                near.inc_by(hits.limit - near_at.max(before));
            }
            if hits.shadow {
                shadow.inc_by(if before >= hits.limit {
                    hits.hits
                } else {
                    after - hits.limit
                });
            }
        } else {
            if after > near_at {
                near.inc_by(if before >= near_at {
                    hits.hits
                } else {
                    after - near_at
                });
            }
            within.inc_by(hits.hits);
        }
    }

    fn counters(&self, settings: StatSettings, domain: &str, key: &str) -> Arc<KeyCounters> {
        if let Some(found) = self.keys.read().unwrap_or_else(|e| e.into_inner()).get(key) {
            return found.clone();
        }
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = keys.get(key) {
            return found.clone();
        }
        let full = keys.len() >= settings.max_keys;
        let (stored, label) = if full {
            // One overflow key per domain, past the bound.
            let stored = format!("{domain}.{OTHER}");
            if let Some(found) = keys.get(stored.as_str()) {
                return found.clone();
            }
            (stored, OTHER.to_owned())
        } else {
            let label = key
                .strip_prefix(domain)
                .and_then(|k| k.strip_prefix('.'))
                .unwrap_or(key);
            (key.to_owned(), sanitize(label))
        };
        let counters = Arc::new(KeyCounters(KINDS.map(|kind| {
            self.family
                .get_or_create(&StatLabels {
                    domain: domain.to_owned(),
                    key: label.clone(),
                    kind,
                })
                .clone()
        })));
        keys.insert(stored.into(), counters.clone());
        counters
    }
}

/// A key as the reference writes it into a statistic's name: `:` and `|` become `_`, and so do
/// the dots of an IPv4 address (`10.0.0.1` -> `10_0_0_1`), which would otherwise read as more
/// parts.
pub(crate) fn sanitize(key: &str) -> String {
    let mut bytes = key.as_bytes().to_vec();
    for b in &mut bytes {
        if *b == b':' || *b == b'|' {
            *b = b'_';
        }
    }
    // An IPv4 address: four runs of 1-3 digits joined by dots (the reference's
    // `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`, matched leftmost first, without overlap).
    let mut at = 0;
    while at < bytes.len() {
        match ipv4_at(&bytes, at) {
            Some(end) => {
                for b in &mut bytes[at..end] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                at = end;
            }
            None => at += 1,
        }
    }
    // Only ASCII bytes were replaced, by ASCII bytes.
    String::from_utf8(bytes).unwrap_or_else(|_| key.to_owned())
}

/// The end of an IPv4-shaped run starting at `at`, if one does (each run takes up to three
/// digits, greedily, as the regular expression would).
fn ipv4_at(bytes: &[u8], at: usize) -> Option<usize> {
    let mut i = at;
    for part in 0..4 {
        if part > 0 {
            if bytes.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let digits = bytes[i.min(bytes.len())..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        i += digits;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(stats: &DescriptorStats, domain: &str, key: &str, kind: &str) -> u64 {
        let kind = KINDS.iter().find(|k| **k == kind).unwrap();
        stats
            .family
            .get_or_create(&StatLabels {
                domain: domain.into(),
                key: key.into(),
                kind,
            })
            .get()
    }

    #[test]
    fn hits_split_as_the_reference_splits_them() {
        let stats = DescriptorStats::default();
        let settings = StatSettings::default();
        let count = |before, hits, shadow| {
            stats.count(
                settings,
                "d",
                "d.k_v",
                Hits {
                    hits,
                    limit: 10,
                    before: Some(before),
                    shadow,
                },
            )
        };
        // Near from 8 on (10 * 0.8).
        count(0, 7, false); // 7: within
        count(7, 2, false); // 9: within, 1 near
        count(9, 3, false); // 12: 2 over, 1 near (10 - max(8, 9))
        count(12, 4, false); // all over
        let v = |kind| value(&stats, "d", "k_v", kind);
        assert_eq!(
            [
                v("total_hits"),
                v("within_limit"),
                v("near_limit"),
                v("over_limit"),
                v("shadow_mode")
            ],
            [16, 9, 2, 6, 0]
        );
        count(5, 7, true); // 12: 2 over, in shadow; 2 near (10 - max(8, 5))
        assert_eq!(
            [v("near_limit"), v("over_limit"), v("shadow_mode")],
            [4, 8, 2]
        );
    }

    #[test]
    fn keys_are_bounded_and_sanitized() {
        let stats = DescriptorStats::default();
        let settings = StatSettings {
            max_keys: 2,
            ..StatSettings::default()
        };
        let hit = Hits {
            hits: 1,
            limit: 5,
            before: None,
            shadow: false,
        };
        for key in ["d.ip_10.0.0.1", "d.a:b|c", "d.x", "d.y"] {
            stats.count(settings, "d", key, hit);
        }
        assert_eq!(value(&stats, "d", "ip_10_0_0_1", "total_hits"), 1);
        assert_eq!(value(&stats, "d", "a_b_c", "total_hits"), 1);
        assert_eq!(value(&stats, "d", OTHER, "total_hits"), 2);
        assert_eq!(value(&stats, "d", "x", "total_hits"), 0);
        assert_eq!(stats.keys.read().unwrap().len(), 3);
    }

    /// A request's own long value (a megabyte) takes a label of at most `MAX_LABEL` bytes, its
    /// first bytes and a hash: two long values that share their first bytes stay apart.
    #[test]
    fn long_keys_and_domains_take_bounded_labels() {
        let stats = DescriptorStats::default();
        let settings = StatSettings::default();
        let hit = Hits {
            hits: 1,
            limit: 5,
            before: None,
            shadow: false,
        };
        let long = |last: char| format!("d.v_{}{last}", "x".repeat(1 << 20));
        for key in [long('a'), long('b'), long('a')] {
            stats.count(settings, "d", &key, hit);
        }
        let keys = stats.keys.read().unwrap();
        assert_eq!(keys.len(), 2, "one label per value");
        assert!(
            keys.keys().all(|k| k.len() <= MAX_LABEL),
            "{:?}",
            keys.keys().map(|k| k.len()).collect::<Vec<_>>()
        );
        drop(keys);
        let label = bounded(&long('a')).strip_prefix("d.").unwrap().to_owned();
        assert_eq!(value(&stats, "d", &label, "total_hits"), 2);
        let domain = "e".repeat(1 << 20);
        stats.domain_not_found(settings, &domain);
        let unknown = stats.unknown.read().unwrap();
        assert!(unknown.keys().all(|d| d.len() <= MAX_LABEL));
    }

    #[test]
    fn unknown_domains_are_counted_and_bounded() {
        let stats = DescriptorStats::default();
        let settings = StatSettings {
            max_keys: 1,
            ..StatSettings::default()
        };
        for domain in ["a", "a", "b", "c"] {
            stats.domain_not_found(settings, domain);
        }
        let count = |domain: &str| {
            stats
                .not_found
                .get_or_create(&DomainLabels {
                    domain: domain.into(),
                })
                .get()
        };
        assert_eq!([count("a"), count(OTHER)], [2, 2]);
    }

    #[test]
    fn only_ipv4_shaped_runs_lose_their_dots() {
        assert_eq!(sanitize("k_1.2.3.4.5"), "k_1_2_3_4.5");
        assert_eq!(sanitize("v_1.2.3"), "v_1.2.3");
        assert_eq!(sanitize("v_1234.1.1.1"), "v_1234_1_1_1");
    }
}
