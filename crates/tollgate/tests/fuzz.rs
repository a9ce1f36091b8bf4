//! Fuzzed inputs through the core's parsing and key entry points: none may panic, and two
//! different identities never share a store key.
//!
//! Cases per property: `PROPTEST_CASES` (64 when unset); `scripts/fuzz` runs many more.

use std::{collections::HashSet, net::IpAddr, time::Duration};

use proptest::prelude::*;
use tollgate::{
    Algorithm, BanTarget, DurationError, Fingerprint, MAX_WINDOW, Rule, RuleErrorKind, algorithm,
    format_duration,
    key::{MAX_PART, limiter_key, push_part},
    parse_duration,
};

/// `PROPTEST_CASES` when set, else a count small enough for every CI run.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 64;
    }
    config
}

/// Number texts that sit near the edges of what parses: zero, leading zeros, the limits of
/// u64 and beyond, signs, exponents, non-ASCII digits and spaces.
fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..100_000).prop_map(|n| n.to_string()),
        any::<u128>().prop_map(|n| n.to_string()),
        Just(u64::MAX.to_string()),
        Just("18446744073709551616".to_owned()),
        Just("99999999999999999999999999999999999999999".to_owned()),
        Just("0".to_owned()),
        Just("000000000000000000000000001".to_owned()),
        Just(String::new()),
        Just("+5".to_owned()),
        Just("-1".to_owned()),
        Just("1e3".to_owned()),
        Just("1.5".to_owned()),
        Just("0x10".to_owned()),
        Just("１０".to_owned()), // fullwidth digits
        Just("١٢".to_owned()),   // Arabic-Indic digits
        Just("५".to_owned()),    // Devanagari digit
        Just("𝟗".to_owned()),    // mathematical digit
        Just("\u{0}".to_owned()),
        Just(" 7 ".to_owned()),
        Just("7\u{200b}".to_owned()), // zero-width space
        "[0-9]{1,30}",
    ]
}

fn unit_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("ms"),
        Just("s"),
        Just("m"),
        Just("h"),
        Just("d"),
        Just(""),
        Just("x"),
        Just("µs"),
        Just("us"),
        Just("M"),
        Just("mS"),
        Just("ｍ"),
        Just(" s"),
        Just("s "),
        Just("m\u{0}"),
        Just("sec"),
        Just("ms/1m"),
        Just("/"),
        Just("é"),
    ]
    .prop_map(str::to_owned)
}

fn separator() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("/".to_owned()),
        1 => Just(" / ".to_owned()),
        1 => Just("//".to_owned()),
        1 => Just("".to_owned()),
        1 => Just("／".to_owned()),
        1 => Just("\t/\n".to_owned()),
    ]
}

/// Rule texts close to valid ones: `N/NUNIT` with every part taken from the edge cases.
fn near_rule_text() -> impl Strategy<Value = String> {
    (
        number_text(),
        separator(),
        number_text(),
        unit_text(),
        any::<bool>(),
    )
        .prop_map(|(limit, sep, n, unit, drop_n)| {
            // `10/m` is valid shorthand for `10/1m`: sometimes leave the number out.
            let n = if drop_n { String::new() } else { n };
            format!("{limit}{sep}{n}{unit}")
        })
}

/// Any text at all: arbitrary chars, printable text, and near-valid rules.
fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "\\PC{0,40}",
        near_rule_text(),
        prop::collection::vec(any::<u8>(), 0..40)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

/// The facts a valid rule must show.
fn assert_valid(rule: &Rule, text: &str) {
    assert!(rule.limit() >= 1, "{text:?} -> {rule:?}");
    assert!(rule.window() >= Duration::from_millis(1), "{text:?}");
    assert!(rule.window() <= MAX_WINDOW, "{text:?}");
    assert_eq!(rule.window_ms() * 1000, rule.window_us());
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn rule_parsing_never_panics_and_what_parses_round_trips(text in any_text()) {
        match text.parse::<Rule>() {
            Ok(rule) => {
                assert_valid(&rule, &text);
                let shown = rule.to_string();
                let again: Rule = shown.parse().unwrap_or_else(|e| panic!("{text:?} -> {shown:?}: {e}"));
                prop_assert_eq!(again, rule);
                prop_assert_eq!(again.to_string(), shown);
            }
            Err(e) => {
                // The error names the text it came from.
                prop_assert_eq!(e.text(), text.as_str());
                let _ = e.to_string();
            }
        }
    }

    #[test]
    fn near_valid_rules_parse_exactly_when_their_parts_are_valid(
        limit in any::<u64>(),
        n in any::<u64>(),
        unit in prop::sample::select(vec![("ms", 1u128), ("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)]),
    ) {
        let text = format!("{limit}/{n}{}", unit.0);
        let window_ms = u128::from(n) * unit.1;
        match text.parse::<Rule>() {
            Ok(rule) => {
                prop_assert_eq!(rule.limit(), limit);
                prop_assert_eq!(u128::from(rule.window_ms()), window_ms);
            }
            Err(e) => {
                // The window is parsed before the rule is checked.
                let expected = if window_ms > u128::from(u64::MAX) {
                    RuleErrorKind::Duration(DurationError::Overflow(format!("{n}{}", unit.0)))
                } else if limit == 0 {
                    RuleErrorKind::ZeroLimit
                } else if window_ms == 0 {
                    RuleErrorKind::ZeroWindow
                } else {
                    prop_assert!(window_ms > MAX_WINDOW.as_millis(), "{text}: {e}");
                    RuleErrorKind::WindowTooLong
                };
                prop_assert_eq!(e.kind(), &expected, "{}", text);
            }
        }
    }

    #[test]
    fn every_valid_rule_round_trips_through_its_text(
        limit in prop_oneof![1u64..1000, any::<u64>().prop_map(|n| n.max(1))],
        window_ms in prop_oneof![1u64..120_000, 1u64..=MAX_WINDOW.as_millis() as u64],
    ) {
        let rule = Rule::new(limit, Duration::from_millis(window_ms)).expect("valid by construction");
        let text = rule.to_string();
        let parsed: Rule = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
        prop_assert_eq!(parsed, rule);
        // Serde uses the same text.
        #[cfg(feature = "serde")]
        {
            let json = format!("\"{text}\"");
            let parsed: Rule = serde_json::from_str(&json).expect("serde parses the text form");
            prop_assert_eq!(parsed, rule);
        }
    }

    #[test]
    fn rule_construction_never_panics(limit in any::<u64>(), secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
        let window = Duration::new(secs, nanos);
        if let Ok(rule) = Rule::new(limit, window) {
            assert_valid(&rule, "Rule::new");
            prop_assert_eq!(rule.window(), window);
        }
    }

    #[test]
    fn duration_parsing_never_panics_and_what_parses_formats_back(text in prop_oneof![
        any_text(),
        (number_text(), unit_text()).prop_map(|(n, u)| format!("{n}{u}")),
    ]) {
        if let Ok(d) = parse_duration(&text) {
            prop_assert_eq!(d.subsec_nanos() % 1_000_000, 0, "{}", text);
            let shown = format_duration(d);
            prop_assert_eq!(parse_duration(&shown), Ok(d), "{} -> {}", text, shown);
        }
    }

    #[test]
    fn durations_overflow_as_errors(n in any::<u64>(), unit in prop::sample::select(vec![("ms", 1u128), ("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)])) {
        let text = format!("{n}{}", unit.0);
        let ms = u128::from(n) * unit.1;
        match parse_duration(&text) {
            Ok(d) => prop_assert_eq!(d.as_millis(), ms),
            Err(e) => {
                prop_assert!(ms > u128::from(u64::MAX), "{}: {}", text, e);
                prop_assert_eq!(e, DurationError::Overflow(text.clone()));
            }
        }
    }

    #[test]
    fn format_duration_never_panics(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
        let d = Duration::new(secs, nanos);
        let shown = format_duration(d);
        // Whole milliseconds that fit in u64 parse back to themselves.
        if let Ok(ms) = u64::try_from(d.as_millis()) {
            prop_assert_eq!(parse_duration(&shown), Ok(Duration::from_millis(ms)));
        }
    }
}

/// Text likely to collide after escaping: separators, escapes, the hash marker, non-ASCII.
fn part() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a:|{}%#3A ]{0,8}",
        2 => "[ab%:]{120,140}",     // around MAX_PART: some escaped, some hashed
        1 => "[a-z]{126,130}",
        1 => "\\PC{0,12}",
        1 => any::<String>(),
        1 => prop::collection::vec(prop::sample::select(vec!["%3A", ":", "%25", "%", "#", "é", "\u{0}"]), 0..60)
            .prop_map(|v| v.concat()),
    ]
}

/// A second value made from the first: often one small edit away, so collisions are tried
/// where they are most likely.
fn edit(a: String, how: u8, at: usize, text: String) -> String {
    let cut = if a.is_empty() { 0 } else { at % (a.len() + 1) };
    let cut = (0..=cut)
        .rev()
        .find(|&i| a.is_char_boundary(i))
        .unwrap_or(0);
    match how % 6 {
        0 => a,
        1 => format!("{}{text}{}", &a[..cut], &a[cut..]),
        2 => {
            let mut s = a;
            s.truncate(cut);
            s
        }
        3 => a.replacen(':', "%3A", 1),
        4 => format!("{a}{text}"),
        _ => text,
    }
}

fn triple() -> impl Strategy<Value = (String, String, String)> {
    (part(), part(), part())
}

/// Two triples, the second usually derived from the first by moving text across a part
/// boundary or editing one part.
fn triple_pair() -> impl Strategy<Value = ((String, String, String), (String, String, String))> {
    (
        triple(),
        any::<u8>(),
        any::<u8>(),
        any::<usize>(),
        "[a:%#|{}]{0,3}",
    )
        .prop_map(|((s, l, v), which, how, at, text)| {
            let a = (s.clone(), l.clone(), v.clone());
            let b = match which % 5 {
                0 => (edit(s, how, at, text), l, v),
                1 => (s, edit(l, how, at, text), v),
                2 => (s, l, edit(v, how, at, text)),
                // Move the boundary between two parts.
                3 => {
                    let joined = format!("{s}:{l}");
                    let cut = at % (joined.len() + 1);
                    let cut = (0..=cut)
                        .rev()
                        .find(|&i| joined.is_char_boundary(i))
                        .unwrap_or(0);
                    (
                        joined[..cut].to_owned(),
                        joined[cut..].trim_start_matches(':').to_owned(),
                        v,
                    )
                }
                _ => {
                    let joined = format!("{l}:{v}");
                    let cut = at % (joined.len() + 1);
                    let cut = (0..=cut)
                        .rev()
                        .find(|&i| joined.is_char_boundary(i))
                        .unwrap_or(0);
                    (
                        s,
                        joined[..cut].to_owned(),
                        joined[cut..].trim_start_matches(':').to_owned(),
                    )
                }
            };
            (a, b)
        })
}

fn escaped(part: &str) -> String {
    let mut out = String::new();
    push_part(&mut out, part);
    out
}

fn ban_target() -> impl Strategy<Value = BanTarget> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|b| BanTarget::Ip(IpAddr::from(b))),
        any::<[u8; 16]>().prop_map(|b| BanTarget::Ip(IpAddr::from(b))),
        any::<[u8; 4]>()
            .prop_map(|b| BanTarget::Ip(IpAddr::V6(std::net::Ipv4Addr::from(b).to_ipv6_mapped()))),
        part()
            .prop_filter("user ids are not empty", |s| !s.is_empty())
            .prop_map(BanTarget::UserId),
        // User ids that look like addresses, or like escaped text.
        any::<[u8; 4]>().prop_map(|b| BanTarget::UserId(IpAddr::from(b).to_string())),
        Just(BanTarget::UserId("%3A".into())),
        Just(BanTarget::UserId(":".into())),
    ]
}

fn args() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    prop::collection::vec(
        (
            prop::collection::vec(prop::sample::select(vec![0u8, 1, b'a', b'b', 0xff]), 0..4),
            prop::collection::vec(prop::sample::select(vec![0u8, 1, b'a', b'b', 0xff]), 0..4),
        ),
        0..4,
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn escaping_is_injective_and_keeps_parts_apart(a in part(), b in part()) {
        let (ea, eb) = (escaped(&a), escaped(&b));
        prop_assert_eq!(ea == eb, a == b, "{:?} {:?} -> {}", a, b, ea);
        for (raw, e) in [(&a, &ea), (&b, &eb)] {
            // Nothing that separates parts or opens a hash tag survives escaping.
            prop_assert!(!e.contains([':', '|', '{', '}']), "{:?} -> {}", raw, e);
            prop_assert!(e.bytes().all(|c| (0x21..0x7f).contains(&c)), "{:?} -> {}", raw, e);
            if e.starts_with('#') {
                prop_assert_eq!(e.len(), 33, "hashed parts are '#' and 32 hex digits");
            } else {
                prop_assert!(e.len() <= MAX_PART, "{:?} -> {} bytes", raw, e.len());
                prop_assert!(!e.contains('#'));
            }
        }
    }

    #[test]
    fn different_identities_never_share_a_limiter_key((a, b) in triple_pair()) {
        let ka = limiter_key("tg", &a.0, &a.1, &a.2);
        let kb = limiter_key("tg", &b.0, &b.1, &b.2);
        prop_assert_eq!(ka == kb, a == b, "{:?} and {:?} -> {}", a, b, ka);
        // One hash tag, wrapping everything after the prefix.
        for k in [&ka, &kb] {
            prop_assert!(k.starts_with("tg:{") && k.ends_with('}'), "{}", k);
            prop_assert_eq!(k.matches('{').count(), 1, "{}", k);
            prop_assert_eq!(k.matches('}').count(), 1, "{}", k);
        }
    }

    #[test]
    fn unrelated_identities_never_share_a_limiter_key(a in triple(), b in triple()) {
        let ka = limiter_key("tg", &a.0, &a.1, &a.2);
        let kb = limiter_key("tg", &b.0, &b.1, &b.2);
        prop_assert_eq!(ka == kb, a == b, "{:?} and {:?} -> {}", a, b, ka);
    }

    #[test]
    fn long_parts_are_hashed_and_still_differ(base in "[a-z:%]{100,300}", tail in "[a-z:%]{1,3}") {
        let longer = format!("{base}{tail}");
        let (ea, eb) = (escaped(&base), escaped(&longer));
        prop_assert_ne!(&ea, &eb);
        prop_assert!(ea.len() <= MAX_PART && eb.len() <= MAX_PART);
        let ka = limiter_key("tg", "scope", "limiter", &base);
        let kb = limiter_key("tg", "scope", "limiter", &longer);
        prop_assert_ne!(ka, kb);
    }

    #[test]
    fn different_ban_targets_never_share_a_key(a in ban_target(), b in ban_target()) {
        let (ka, kb) = (a.key("tg"), b.key("tg"));
        prop_assert_eq!(ka == kb, a == b, "{:?} and {:?} -> {}", a, b, ka);
        prop_assert!(ka.starts_with("tg:ban:"), "{}", ka);
        // A parsed target keys like the one it came from.
        let again = BanTarget::parse(a.kind(), &a.value()).expect("a target's own text parses");
        prop_assert_eq!(again.key("tg"), ka);
    }

    #[test]
    fn ban_target_parsing_never_panics(kind in prop_oneof![Just("ip".to_owned()), Just("user_id".to_owned()), any::<String>()], value in any_text()) {
        if let Ok(t) = BanTarget::parse(&kind, &value) {
            prop_assert_eq!(t.kind(), kind.as_str());
            let _ = t.key("tg");
        }
    }

    #[test]
    fn different_argument_lists_never_share_a_fingerprint(a in args(), b in args()) {
        let fa = Fingerprint::of_args(a.iter().map(|(k, v)| (k, v)));
        let fb = Fingerprint::of_args(b.iter().map(|(k, v)| (k, v)));
        prop_assert_eq!(fa == fb, a == b, "{:?} {:?}", a, b);
        prop_assert_eq!(fa.to_string().len(), 64);
    }

    #[test]
    fn fingerprints_of_any_bytes(a in prop::collection::vec(any::<u8>(), 0..512), b in prop::collection::vec(any::<u8>(), 0..512)) {
        let (fa, fb) = (Fingerprint::of(&a), Fingerprint::of(&b));
        prop_assert_eq!(fa == fb, a == b);
        prop_assert!(fa.to_string().bytes().all(|c| c.is_ascii_hexdigit()));
    }
}

#[test]
fn hashed_and_literal_parts_never_meet() {
    // A literal part can spell out a hashed part's text only with '#', which is escaped.
    let long = "x".repeat(MAX_PART + 1);
    let hashed = escaped(&long);
    assert!(hashed.starts_with('#'));
    assert_ne!(escaped(&hashed), hashed);
    let mut seen = HashSet::new();
    for p in [long.as_str(), hashed.as_str(), "#", "%23"] {
        assert!(seen.insert(escaped(p)), "{p:?}");
    }
}

/// A rule from arbitrary parts, leaning to the edges: limits near u64::MAX, windows of 1 ms.
fn any_rule() -> impl Strategy<Value = Rule> {
    (
        prop_oneof![
            1u64..10,
            Just(u64::MAX),
            (u64::MAX - 10)..=u64::MAX,
            any::<u64>().prop_map(|n| n.max(1))
        ],
        prop_oneof![Just(1u64), 1u64..=MAX_WINDOW.as_millis() as u64],
        prop::sample::select(vec![
            Algorithm::SlidingLog,
            Algorithm::FixedWindow,
            Algorithm::Gcra,
        ]),
    )
        .prop_map(|(limit, ms, algorithm)| {
            Rule::new(limit, Duration::from_millis(ms))
                .expect("valid by construction")
                .with_algorithm(algorithm)
        })
}

fn any_cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..4,
        Just(u64::MAX),
        (u64::MAX - 4)..=u64::MAX,
        any::<u64>()
    ]
}

proptest! {
    #![proptest_config(config())]

    /// The algorithms take any rule, cost and state without overflowing, and never admit past
    /// the limit.
    #[test]
    fn algorithms_never_overflow_and_never_admit_past_the_limit(
        rule in any_rule(),
        cost in any_cost(),
        // 2100-01-01 plus up to a year, in µs.
        now in 4_102_444_800_000_000u64..4_134_000_000_000_000,
        log_len in 0usize..4,
        count in any_cost(),
        tat_ahead in prop::option::of(any_cost()),
    ) {
        let window = rule.window_us();
        let limit = rule.limit();
        let log: Vec<u64> = (0..log_len as u64).map(|i| now - window.min(now) / 2 + i).collect();
        let o = algorithm::sliding_log(&log, now, &rule, cost);
        if o.allowed {
            prop_assert!(u128::from(log_len as u64) + u128::from(cost) <= u128::from(limit));
        }
        let start = now - now % window;
        let state = algorithm::FixedWindowState { start, count: count.min(limit) };
        let (o, next) = algorithm::fixed_window(Some(state), now, &rule, cost);
        prop_assert_eq!(o.allowed, next.is_some());
        if let Some(next) = next {
            prop_assert!(next.count <= limit);
            prop_assert_eq!(u128::from(next.count), u128::from(state.count) + u128::from(cost));
        }
        let tat = tat_ahead.map(|ahead| now.saturating_add(ahead.min(window)));
        let (o, next) = algorithm::gcra(tat, now, &rule, cost);
        prop_assert_eq!(o.allowed, next.is_some());
        if o.allowed {
            let interval = algorithm::gcra_interval(&rule);
            prop_assert!(u128::from(interval) * u128::from(cost) <= u128::from(interval) * u128::from(limit));
        }
    }
}

#[test]
fn a_cost_past_what_u64_adds_up_to_is_denied_not_a_panic() {
    let now = 4_102_444_800_000_000;
    let huge = |a: Algorithm| {
        Rule::new(u64::MAX, Duration::from_secs(60))
            .unwrap()
            .with_algorithm(a)
    };
    let o = algorithm::sliding_log(&[now - 1], now, &huge(Algorithm::SlidingLog), u64::MAX);
    assert!(!o.allowed);
    let state = algorithm::FixedWindowState {
        start: now - now % 60_000_000,
        count: 1,
    };
    let (o, next) =
        algorithm::fixed_window(Some(state), now, &huge(Algorithm::FixedWindow), u64::MAX);
    assert!(!o.allowed && next.is_none());
    let (o, _) = algorithm::gcra(Some(now + 1), now, &huge(Algorithm::Gcra), u64::MAX);
    assert!(!o.allowed);
    assert!(o.retry_after_us.is_some());
}
