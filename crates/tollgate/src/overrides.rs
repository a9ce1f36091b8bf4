//! Per-identity overrides: limits of their own for one identity of one limiter, set at run time
//! and kept in the store (see [`Tollgate::set_override`](crate::Tollgate::set_override)).
//!
//! An override changes the limits of a limiter's rules, never their windows or algorithms: the
//! state the configured rules count on is the state the override counts on, so a limit raised
//! mid-window admits exactly up to the new limit. It names the rules it was made for by a
//! fingerprint of their windows and algorithms; when a deployment changes those, the store
//! ignores the override rather than apply its limits to other rules.

use std::{cmp::Ordering, collections::BinaryHeap, fmt, num::NonZeroU64};

use crate::{
    StoreError,
    algorithm::MAX_SLIDING_WINDOW_PRODUCT,
    page::PageCursor,
    policy::MAX_LOG_LIMIT,
    rule::{Algorithm, Rule},
};

/// The largest limit an override may set: every store counts it exactly (Redis scripts count
/// in doubles, exact below 2^53, and a reply packs a limit beside a flag).
pub const MAX_OVERRIDE_LIMIT: u64 = 1 << 50;

/// One identity's override, as a store keeps and lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// The policy's scope.
    pub policy: String,
    /// The limiter's name.
    pub limiter: String,
    /// The identity's value in the limiter's dimension.
    pub value: String,
    /// Per rule of the limiter, in rule order: the limit the override sets, or 0 where the
    /// configured limit stands.
    pub limits: Vec<u64>,
    /// The fingerprint of the rules the limits were made for (see [`fingerprint`]).
    pub fingerprint: u64,
    /// When the override ends (µs since the epoch on the store's clock); `None`: never.
    pub expires_at_us: Option<u64>,
}

impl Override {
    /// The override of a limiter whose rules are `configured` by `wanted`: each of `wanted`
    /// sets the limit of the configured rule over its window (see
    /// [`Tollgate::set_override`](crate::Tollgate::set_override)); it ends where the store
    /// that keeps it says.
    pub fn new(
        (policy, limiter, value): (&str, &str, &str),
        configured: &[Rule],
        wanted: &[Rule],
    ) -> Result<Override, OverrideError> {
        Ok(Override {
            policy: policy.to_owned(),
            limiter: limiter.to_owned(),
            value: value.to_owned(),
            limits: limits_for(limiter, configured, wanted)?,
            fingerprint: fingerprint(configured).get(),
            expires_at_us: None,
        })
    }

    /// The limiter's rules under this override: `configured` with the limits it sets; `None`
    /// when it was made for other rules.
    pub fn rules(&self, configured: &[Rule]) -> Option<Vec<Rule>> {
        if fingerprint(configured).get() != self.fingerprint
            || self.limits.len() != configured.len()
        {
            return None;
        }
        Some(apply(configured, &self.limits).collect())
    }

    /// Whether the override still holds at `now_us`.
    pub fn live_at(&self, now_us: u64) -> bool {
        self.expires_at_us.is_none_or(|at| at > now_us)
    }
}

/// `rules` with `limits` applied (0: the rule's own).
pub(crate) fn apply<'a>(rules: &'a [Rule], limits: &'a [u64]) -> impl Iterator<Item = Rule> + 'a {
    rules.iter().zip(limits).map(|(rule, &limit)| match limit {
        0 => *rule,
        limit => rule.with_limit(limit),
    })
}

/// The fingerprint of a limiter's rules: their windows and algorithms in order, not their
/// limits, hashed (FNV-1a) to 48 bits, never 0 (a Redis script compares it exactly).
pub fn fingerprint(rules: &[Rule]) -> NonZeroU64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for rule in rules {
        eat(rule.algorithm().as_str().as_bytes());
        eat(&rule.window_ms().to_le_bytes());
        if let Some(calendar) = rule.calendar_window() {
            eat(calendar.to_string().as_bytes());
        }
        eat(&[u8::from(rule.is_concurrent()), b';']);
    }
    NonZeroU64::new(hash & ((1 << 48) - 1)).unwrap_or(NonZeroU64::MIN)
}

/// The limits `wanted` sets on `configured` (the limiter's rules): each wanted rule names the
/// configured rule of its window (and algorithm, where two share a window).
pub(crate) fn limits_for(
    limiter: &str,
    configured: &[Rule],
    wanted: &[Rule],
) -> Result<Vec<u64>, OverrideError> {
    if wanted.is_empty() {
        return Err(OverrideError::NoRules);
    }
    let mut limits = vec![0; configured.len()];
    for rule in wanted {
        let same_window = |c: &&Rule| {
            c.window_ms() == rule.window_ms()
                && c.calendar_window() == rule.calendar_window()
                && c.is_concurrent() == rule.is_concurrent()
        };
        let mut found: Vec<usize> = (0..configured.len())
            .filter(|&i| same_window(&&configured[i]))
            .collect();
        if found.len() > 1 {
            found.retain(|&i| configured[i].algorithm() == rule.algorithm());
        }
        let [place] = found[..] else {
            return Err(OverrideError::NoSuchRule {
                limiter: limiter.to_owned(),
                rule: rule.to_string(),
                rules: configured.iter().map(ToString::to_string).collect(),
            });
        };
        let counted = configured[place];
        let limit = rule.limit();
        let too_large = |max: u64| OverrideError::TooLarge {
            limiter: limiter.to_owned(),
            rule: rule.to_string(),
            max,
        };
        if limit > MAX_OVERRIDE_LIMIT {
            return Err(too_large(MAX_OVERRIDE_LIMIT));
        }
        match counted.algorithm() {
            Algorithm::SlidingLog if limit > MAX_LOG_LIMIT => return Err(too_large(MAX_LOG_LIMIT)),
            Algorithm::SlidingWindow
                if u128::from(limit) * u128::from(counted.window_ms())
                    > u128::from(MAX_SLIDING_WINDOW_PRODUCT) =>
            {
                let max = MAX_SLIDING_WINDOW_PRODUCT / counted.window_ms();
                return Err(too_large(max));
            }
            _ => {}
        }
        if limits[place] != 0 {
            return Err(OverrideError::Twice {
                limiter: limiter.to_owned(),
                rule: counted.to_string(),
            });
        }
        limits[place] = limit;
    }
    Ok(limits)
}

/// Why an override cannot be set, removed or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OverrideError {
    /// The policy has no limiter of that name.
    #[error("policy {policy:?} has no limiter {limiter:?} (its limiters: {limiters:?})")]
    UnknownLimiter {
        /// The policy's scope.
        policy: String,
        /// The name asked for.
        limiter: String,
        /// The policy's limiters.
        limiters: Vec<String>,
    },
    /// The limiter was not built to take overrides.
    #[error(
        "limiter {0:?} takes no overrides: build it with `with_overrides(true)` (in a config: \
         `overrides = true`)"
    )]
    NotOverridable(String),
    /// The identity has no value in the limiter's dimension.
    #[error("the identity has no {dimension} for limiter {limiter:?}")]
    MissingDimension {
        /// The limiter's name.
        limiter: String,
        /// Its dimension.
        dimension: String,
    },
    /// An override without rules.
    #[error("an override sets at least one rule's limit")]
    NoRules,
    /// A rule the limiter does not have.
    #[error(
        "limiter {limiter:?} has no rule over the window of {rule}: an override changes the \
         limits of the limiter's rules ({rules:?}), not their windows"
    )]
    NoSuchRule {
        /// The limiter's name.
        limiter: String,
        /// The override's rule.
        rule: String,
        /// The limiter's rules.
        rules: Vec<String>,
    },
    /// Two rules of the override for one rule of the limiter.
    #[error("the override sets the limit of limiter {limiter:?}'s rule {rule} twice")]
    Twice {
        /// The limiter's name.
        limiter: String,
        /// The limiter's rule.
        rule: String,
    },
    /// A limit past what the rule's algorithm can count.
    #[error("limiter {limiter:?}: {rule} is too large; the most this rule may admit is {max}")]
    TooLarge {
        /// The limiter's name.
        limiter: String,
        /// The override's rule.
        rule: String,
        /// The largest limit allowed.
        max: u64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One page of the overrides (see [`OverrideStore::overrides_page`](crate::OverrideStore::overrides_page)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverridePage {
    /// The overrides, in the order they end (those that never end last), then by key.
    pub overrides: Vec<Override>,
    /// Where the next page starts; `None` after the last page. A page may come back shorter
    /// than asked, or even empty, while more follow.
    pub next: Option<PageCursor>,
}

/// Pages overrides by their end, then by their listing's key (policy, limiter and value, one
/// per line: no two overrides of one index share it), for stores that keep no index of their
/// own: only the page's overrides are cloned, however many are fed.
pub(crate) struct Pager<'c> {
    after: Option<&'c PageCursor>,
    limit: usize,
    /// The smallest positions fed after the cursor, at most one more than the page (to know
    /// whether another follows), largest on top.
    kept: BinaryHeap<Listed>,
}

/// An override and its place in a listing.
struct Listed {
    at: (u64, String),
    entry: Override,
}

impl PartialEq for Listed {
    fn eq(&self, other: &Listed) -> bool {
        self.at == other.at
    }
}

impl Eq for Listed {}

impl PartialOrd for Listed {
    fn partial_cmp(&self, other: &Listed) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Listed {
    fn cmp(&self, other: &Listed) -> Ordering {
        self.at.cmp(&other.at)
    }
}

impl<'c> Pager<'c> {
    /// A page of at most `limit` (at least 1), after `after`.
    pub(crate) fn new(after: Option<&'c PageCursor>, limit: usize) -> Pager<'c> {
        Pager {
            after,
            limit: limit.max(1),
            kept: BinaryHeap::new(),
        }
    }

    /// Offers `entry` to the page.
    pub(crate) fn feed(&mut self, entry: &Override) {
        let end = entry.expires_at_us.unwrap_or(u64::MAX);
        // The listing key's bytes, compared without writing it.
        let key = || {
            let (p, l, v) = (&entry.policy, &entry.limiter, &entry.value);
            let line = [b'\n'];
            p.bytes()
                .chain(line)
                .chain(l.bytes())
                .chain(line)
                .chain(v.bytes())
        };
        let beyond = |(until, other): (u64, &str)| {
            end.cmp(&until).then_with(|| key().cmp(other.bytes())) == Ordering::Greater
        };
        if self.after.is_some_and(|a| !beyond((a.until_us(), a.key()))) {
            return;
        }
        let full = self.kept.len() > self.limit;
        if full
            && self
                .kept
                .peek()
                .is_none_or(|top| beyond((top.at.0, &top.at.1)))
        {
            return;
        }
        self.kept.push(Listed {
            at: (
                end,
                format!("{}\n{}\n{}", entry.policy, entry.limiter, entry.value),
            ),
            entry: entry.clone(),
        });
        if self.kept.len() > self.limit + 1 {
            self.kept.pop();
        }
    }

    /// The page of what was fed.
    pub(crate) fn page(self) -> OverridePage {
        let mut listed = self.kept.into_sorted_vec();
        let more = listed.len() > self.limit;
        listed.truncate(self.limit);
        let next = more
            .then(|| listed.last())
            .flatten()
            .map(|l| PageCursor::new(l.at.0, l.at.1.clone()));
        OverridePage {
            overrides: listed.into_iter().map(|l| l.entry).collect(),
            next,
        }
    }
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}: ", self.policy, self.limiter, self.value)?;
        for (i, limit) in self.limits.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{limit}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &[&str]) -> Vec<Rule> {
        text.iter().map(|t| t.parse().unwrap()).collect()
    }

    #[test]
    fn an_override_names_rules_by_window_and_keeps_the_others() {
        let configured = rules(&["10/1m", "100/1h", "1000/1d"]);
        let limits = limits_for("ip", &configured, &rules(&["500/1h"])).unwrap();
        assert_eq!(limits, [0, 500, 0]);
        let o = Override {
            policy: "api".into(),
            limiter: "ip".into(),
            value: "v".into(),
            limits,
            fingerprint: fingerprint(&configured).get(),
            expires_at_us: Some(10),
        };
        let applied: Vec<String> = o
            .rules(&configured)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(applied, ["10/1m", "500/1h", "1000/1d"]);
        assert!(o.live_at(9) && !o.live_at(10));
        // Made for other windows: not applied.
        assert_eq!(o.rules(&rules(&["10/1m", "100/2h", "1000/1d"])), None);
    }

    #[test]
    fn fingerprints_follow_windows_and_algorithms_not_limits() {
        let a = fingerprint(&rules(&["10/1m", "100/1h"]));
        assert_eq!(a, fingerprint(&rules(&["20/1m", "5/1h"])));
        assert_ne!(a, fingerprint(&rules(&["100/1h", "10/1m"])));
        assert_ne!(a, fingerprint(&rules(&["10/2m", "100/1h"])));
        let gcra: Vec<Rule> = rules(&["10/1m", "100/1h"])
            .into_iter()
            .map(|r| r.with_algorithm(Algorithm::Gcra))
            .collect();
        assert_ne!(a, fingerprint(&gcra));
        assert!(a.get() < 1 << 48);
    }

    #[test]
    fn overrides_that_cannot_apply_say_why() {
        let configured = rules(&["10/1m", "100/1h"]);
        let e = limits_for("ip", &configured, &rules(&["5/2m"])).unwrap_err();
        assert!(
            e.to_string().contains("no rule over the window of 5/2m"),
            "{e}"
        );
        assert!(matches!(
            limits_for("ip", &configured, &[]),
            Err(OverrideError::NoRules)
        ));
        let e = limits_for("ip", &configured, &rules(&["5/1m", "6/1m"])).unwrap_err();
        assert!(matches!(e, OverrideError::Twice { .. }), "{e}");
        let e = limits_for("ip", &configured, &rules(&["2000000/1m"])).unwrap_err();
        assert!(
            matches!(e, OverrideError::TooLarge { max, .. } if max == MAX_LOG_LIMIT),
            "{e}"
        );
        let gcra = [configured[0].with_algorithm(Algorithm::Gcra)];
        assert_eq!(
            limits_for("ip", &gcra, &rules(&["2000000/1m"])).unwrap(),
            [2_000_000]
        );
    }
}
