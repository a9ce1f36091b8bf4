//! The configuration cases of Envoy's reference rate-limit service (its `test/config` suite),
//! as tollgate's own tests: every file it accepts or refuses, every look-up and the key each
//! matched descriptor is counted under in the statistics.
//!
//! Its files are written here in YAML of the same shape and values; an error is compared by
//! the reference's message, which tollgate's contains (tollgate adds the line and, where it
//! helps, what was expected).

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::rate_limit_descriptor::Entry,
    service::ratelimit::v3::rate_limit_response::rate_limit::Unit,
};
use tollgate::{Algorithm, OnError};

use super::{
    Domains, DomainsBuilder, Semantics,
    descriptors::{NodeKind, current_limit},
};
use crate::config::envoy_yaml::{YamlFile, parse};

const BASIC: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
  - key: key2
    value: value3
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: key4
    rate_limit:
      name: key4_rate_limit
      unit: day
      requests_per_unit: 1
  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25
  - key: key6
    rate_limit:
      unlimited: true
  - key: key7
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 70
";

const MERGE_KEY1: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 10
";

const MERGE_KEY2: &str = "
domain: test-domain
descriptors:
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 20
";

/// A request descriptor's entries, `(key, value)`.
type Pairs<'a> = &'a [(&'a str, &'a str)];

/// Loads `(file name, text)` in order; `merge` as `MERGE_DOMAIN_CONFIG`. An error reads
/// `name...: message`.
fn load(files: &[(&str, &str)], merge: bool) -> Result<Domains, String> {
    let mut builder = DomainsBuilder::new(OnError::Allow, Semantics::reference(false));
    for (name, text) in files {
        let path = std::path::PathBuf::from(name);
        let root = parse(&path, text).map_err(|e| e.to_string())?;
        builder
            .yaml_domain(&YamlFile { path, root }, merge, Algorithm::FixedWindow)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(builder.build())
}

/// What a look-up found, in the reference's terms.
#[derive(Debug, PartialEq)]
struct Got {
    requests_per_unit: u32,
    unit: Unit,
    name: String,
    unlimited: bool,
    shadow: bool,
    /// The statistics key.
    stat: String,
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs
        .iter()
        .map(|(k, v)| Entry {
            key: (*k).into(),
            value: (*v).into(),
        })
        .collect()
}

fn get(domains: &Domains, domain: &str, pairs: &[(&str, &str)]) -> Option<Got> {
    let mut stat = String::new();
    let found = domains
        .get(domain)?
        .find(&entries(pairs), Some(&mut stat))?;
    let node = &found.node;
    let (requests_per_unit, unit) = match node.kind {
        NodeKind::Unlimited => (0, Unit::Unknown),
        NodeKind::Blocked(unit) => (0, unit),
        NodeKind::Rules => {
            let limit = current_limit(&node.rules[0], "");
            (limit.requests_per_unit, Unit::try_from(limit.unit).unwrap())
        }
    };
    Some(Got {
        requests_per_unit,
        unit,
        name: node.name.as_deref().unwrap_or_default().to_owned(),
        unlimited: node.kind == NodeKind::Unlimited,
        shadow: node.shadow,
        stat,
    })
}

/// (requests per unit, unit, statistics key) of a look-up.
fn limit(domains: &Domains, domain: &str, pairs: &[(&str, &str)]) -> Option<(u32, Unit, String)> {
    get(domains, domain, pairs).map(|g| (g.requests_per_unit, g.unit, g.stat))
}

fn stat(domains: &Domains, domain: &str, pairs: &[(&str, &str)]) -> String {
    get(domains, domain, pairs)
        .unwrap_or_else(|| panic!("{pairs:?} matches nothing"))
        .stat
}

#[test]
fn basic_config() {
    let d = load(&[("basic_config.yaml", BASIC)], false).unwrap();
    assert!(!d.is_empty());
    assert!(d.get("foo_domain").is_none());
    assert_eq!(limit(&d, "test-domain", &[]), None);
    for missing in [
        &[("key1", "something")][..],
        &[("key1", "value1")],
        &[("key2", "value2"), ("subkey", "subvalue")],
        &[("key5", "value5"), ("subkey5", "subvalue")],
        // An explicit value without a limit is not limited, and the key alone is not tried.
        &[("key2", "value3")],
    ] {
        assert_eq!(limit(&d, "test-domain", missing), None, "{missing:?}");
    }
    let cases: [(Pairs, u32, Unit, &str); 8] = [
        (
            &[("key1", "value1"), ("subkey1", "something")],
            5,
            Unit::Second,
            "test-domain.key1_value1.subkey1",
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            10,
            Unit::Second,
            "test-domain.key1_value1.subkey1_subvalue1",
        ),
        (
            &[("key2", "something")],
            20,
            Unit::Minute,
            "test-domain.key2",
        ),
        (
            &[("key2", "value2")],
            30,
            Unit::Minute,
            "test-domain.key2_value2",
        ),
        (&[("key3", "foo")], 1, Unit::Hour, "test-domain.key3"),
        (&[("key4", "foo")], 1, Unit::Day, "test-domain.key4"),
        // detailed_metric: the request's own value.
        (
            &[("key7", "unspecified_value")],
            70,
            Unit::Minute,
            "test-domain.key7_unspecified_value",
        ),
        (
            &[("key7", "another_value")],
            70,
            Unit::Minute,
            "test-domain.key7_another_value",
        ),
    ];
    for (pairs, rpu, unit, key) in cases {
        assert_eq!(
            limit(&d, "test-domain", pairs),
            Some((rpu, unit, key.to_owned())),
            "{pairs:?}"
        );
    }
    assert_eq!(get(&d, "test-domain", &[("key3", "foo")]).unwrap().name, "");
    assert_eq!(
        get(&d, "test-domain", &[("key4", "foo")]).unwrap().name,
        "key4_rate_limit"
    );
    let key6 = get(&d, "test-domain", &[("key6", "foo")]).unwrap();
    assert!(key6.unlimited);
    assert_eq!(key6.stat, "test-domain.key6");
}

#[test]
fn domains_merge_when_asked() {
    let d = load(
        &[
            ("merge_domain_key1.yaml", MERGE_KEY1),
            ("merge_domain_key2.yaml", MERGE_KEY2),
        ],
        true,
    )
    .unwrap();
    assert!(d.get("foo_domain").is_none());
    assert_eq!(limit(&d, "test-domain", &[]), None);
    assert_eq!(
        get(&d, "test-domain", &[("key1", "value1")]).map(|g| g.requests_per_unit),
        Some(10)
    );
    assert_eq!(
        get(&d, "test-domain", &[("key2", "value2")]).map(|g| g.requests_per_unit),
        Some(20)
    );
}

#[test]
fn a_descriptors_own_limit_is_counted_under_its_own_values() {
    let d = load(&[("basic_config.yaml", BASIC)], false).unwrap();
    let domain = d.get("test-domain").unwrap();
    let key = |pairs: &[(&str, &str)]| {
        let mut out = String::new();
        domain.override_stat_key(&mut out, &entries(pairs));
        out
    };
    assert_eq!(
        key(&[("key1", "value1"), ("subkey1", "something")]),
        "test-domain.key1_value1.subkey1_something"
    );
    assert_eq!(
        key(&[("key1", "value1"), ("subkey1", "something_else")]),
        "test-domain.key1_value1.subkey1_something_else"
    );
    assert_eq!(key(&[("key1", ""), ("b", "c")]), "test-domain.key1.b_c");
}

/// Each file the reference refuses, with its message.
#[test]
fn refused_files_say_what_the_reference_says() {
    let cases: [(Pairs, bool, &str); 14] = [
        (
            &[("empty_domain.yaml", "descriptors:\n")],
            false,
            "config file cannot have empty domain",
        ),
        (
            &[
                ("basic_config.yaml", BASIC),
                (
                    "duplicate_domain.yaml",
                    "domain: test-domain\ndescriptors:\n",
                ),
            ],
            false,
            "duplicate domain 'test-domain' in config file",
        ),
        (
            &[(
                "empty_key.yaml",
                "domain: test-domain\ndescriptors:\n  - value: value1\n",
            )],
            false,
            "descriptor has empty key",
        ),
        (
            &[(
                "duplicate_key.yaml",
                "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n",
            )],
            false,
            "duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (
            &[
                ("merge_domain_key1.yaml", MERGE_KEY1),
                ("merge_domain_key1.yaml", MERGE_KEY1),
            ],
            true,
            "duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (
            &[(
                "bad_limit_unit.yaml",
                "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
            )],
            false,
            "invalid rate limit unit 'foo'",
        ),
        (
            &[(
                "replaces_self.yaml",
                "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
            )],
            false,
            "replaces should not contain name of same descriptor",
        ),
        (
            &[(
                "replaces_empty.yaml",
                "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
            )],
            false,
            "should not have an empty replaces entry",
        ),
        (
            &[("bad_yaml.yaml", "'''\n")],
            false,
            "error loading config file: ",
        ),
        (
            &[(
                "misspelled_key.yaml",
                "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
            )],
            false,
            "config error, unknown key 'ratelimit'",
        ),
        (
            &[(
                "misspelled_key2.yaml",
                "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
            )],
            false,
            "config error, unknown key 'requestsperunit'",
        ),
        (
            &[(
                "non_string_key.yaml",
                "0.25: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n",
            )],
            false,
            "config error, key is not of type string: 0.25",
        ),
        (
            &[(
                "non_map_list.yaml",
                "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
            )],
            false,
            "config error, yaml file contains list of type other than map: a",
        ),
        (
            &[(
                "unlimited_with_unit.yaml",
                "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
            )],
            false,
            "should not specify rate limit unit when unlimited",
        ),
    ];
    for (files, merge, expected) in cases {
        let error = load(files, merge).err().unwrap_or_else(|| {
            panic!(
                "{:?} loads; the reference refuses it",
                files.last().unwrap().0
            )
        });
        let name = files.last().unwrap().0;
        assert!(error.starts_with(name), "{error}");
        assert!(
            error.contains(expected),
            "{name}: {error}\nexpected: {expected}"
        );
    }
    // What the reference accepts and tollgate's own YAML checks did not: a key of the set
    // at another level, an unknown unit beside `unlimited`.
    let d = load(
        &[(
            "lenient.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    unit: ignored\n    rate_limit:\n      unlimited: true\n      unit: foo\n",
        )],
        false,
    )
    .unwrap();
    assert!(get(&d, "d", &[("a", "x")]).unwrap().unlimited);
}

#[test]
fn shadow_mode_is_per_descriptor() {
    let d = load(
        &[(
            "shadowmode_config.yaml",
            "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
        shadow_mode: true
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    shadow_mode: true
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
",
        )],
        false,
    )
    .unwrap();
    let shadow = |pairs: &[(&str, &str)]| {
        let g = get(&d, "test-domain", pairs).unwrap();
        (g.shadow, g.requests_per_unit, g.unit, g.stat)
    };
    assert_eq!(
        shadow(&[("key1", "value1"), ("subkey1", "something")]),
        (
            false,
            5,
            Unit::Second,
            "test-domain.key1_value1.subkey1".into()
        )
    );
    assert_eq!(
        shadow(&[("key1", "value1"), ("subkey1", "subvalue1")]),
        (
            true,
            10,
            Unit::Second,
            "test-domain.key1_value1.subkey1_subvalue1".into()
        )
    );
    assert_eq!(
        shadow(&[("key2", "something")]),
        (true, 20, Unit::Minute, "test-domain.key2".into())
    );
    assert_eq!(
        shadow(&[("key2", "value2")]),
        (false, 30, Unit::Minute, "test-domain.key2_value2".into())
    );
}

#[test]
fn wildcards_match_and_share_their_pattern_in_statistics() {
    let d = load(
        &[(
            "wildcard.yaml",
            "
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noWild
    value: foo
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noVal
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: midWild
    value: bar*b
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: multiWild
    value: foo*bar*baz
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit:
          unit: minute
          requests_per_unit: 20
",
        )],
        false,
    )
    .unwrap();
    let td = "test-domain";
    let same = |a: &[(&str, &str)], b: &[(&str, &str)], key: &str| {
        let (x, y) = (get(&d, td, a).unwrap(), get(&d, td, b).unwrap());
        assert_eq!(x, y, "{a:?} and {b:?}");
        assert_eq!(x.stat, key);
    };
    same(
        &[("noVal", "foo1")],
        &[("noVal", "foo2")],
        "test-domain.noVal",
    );
    same(
        &[("wild", "foo1")],
        &[("wild", "foo2")],
        "test-domain.wild_foo*",
    );
    assert_eq!(
        stat(&d, td, &[("nestedWild", "val1"), ("wild", "goo2")]),
        "test-domain.nestedWild_val1.wild_goo*"
    );
    same(
        &[("midWild", "barab")],
        &[("midWild", "bar123b")],
        "test-domain.midWild_bar*b",
    );
    same(
        &[("multiWild", "foo123bar456baz")],
        &[("multiWild", "foobarbaz")],
        "test-domain.multiWild_foo*bar*baz",
    );
    assert!(get(&d, td, &[("midWild", "barb")]).is_some());
    for none in [
        ("wild", "bar"),
        ("noWild", "foo1"),
        ("midWild", "bara"),
        ("midWild", "xbarb"),
        ("multiWild", "foo123baz"),
        ("multiWild", "bar456baz"),
    ] {
        assert_eq!(get(&d, td, &[none]), None, "{none:?}");
    }
}

#[test]
fn detailed_metric_counts_under_the_requests_values() {
    let nested = |top: bool, leaf: bool| {
        format!(
            "
domain: nested
descriptors:
  - key: key-1
    detailed_metric: {top}
    rate_limit: {{ unit: minute, requests_per_unit: 100 }}
    descriptors:
      - key: key-2
        detailed_metric: {leaf}
        rate_limit: {{ unit: minute, requests_per_unit: 5 }}
"
        )
    };
    let key = |yaml: &str, pairs: &[(&str, &str)]| {
        stat(&load(&[("", yaml)], true).unwrap(), "nested", pairs)
    };
    let top = [("key-1", "value-1")];
    let both = [("key-1", "value-1"), ("key-2", "value-2")];
    assert_eq!(key(&nested(true, false), &top), "nested.key-1_value-1");
    assert_eq!(key(&nested(false, false), &top), "nested.key-1");
    assert_eq!(
        key(&nested(true, true), &both),
        "nested.key-1_value-1.key-2_value-2"
    );
    assert_eq!(key(&nested(false, false), &both), "nested.key-1.key-2");
    let realistic = "
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 500 }
  - key: key_1
    value: some-value-for-key-1
    rate_limit: { unit: minute, requests_per_unit: 500 }
  - key: key_2
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 5000 }
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 50000 }
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 100 }
";
    let d = load(&[("", realistic)], true).unwrap();
    assert_eq!(
        limit(&d, "nested", &[("key_1", "value-for-key-1")]),
        Some((500, Unit::Minute, "nested.key_1_value-for-key-1".into()))
    );
    assert_eq!(
        limit(&d, "nested", &[("key_2", "key-2-value")]),
        Some((5000, Unit::Minute, "nested.key_2_key-2-value".into()))
    );
    assert_eq!(
        limit(
            &d,
            "nested",
            &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")]
        ),
        Some((
            5,
            Unit::Minute,
            "nested.key_2_key-2-value.key_3_requested-key3-value".into()
        ))
    );
}

#[test]
fn value_to_metric_names_the_requests_value_where_none_is_configured() {
    let three = |domain: &str, leaf: &str| {
        format!(
            "
domain: {domain}
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            {leaf}
            rate_limit: {{ unit: minute, requests_per_unit: 60 }}
"
        )
    };
    let one = |yaml: &str, domain: &str, pairs: &[(&str, &str)]| {
        stat(&load(&[("inline", yaml)], false).unwrap(), domain, pairs)
    };
    let request = [
        ("route", "draw"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    assert_eq!(
        one(&three("domain", ""), "domain", &request),
        "domain.route_draw.http_method_GET.subject_id"
    );
    // detailed_metric on the leaf wins.
    assert_eq!(
        one(
            &three("domain", "detailed_metric: true"),
            "domain",
            &request
        ),
        "domain.route_draw.http_method_GET.subject_id_123"
    );
    // An empty value adds no `_`.
    let d = load(&[("inline", &three("domain", ""))], false).unwrap();
    for (route, method, key) in [
        ("", "GET", "domain.route.http_method_GET.subject_id"),
        ("draw", "", "domain.route_draw.http_method.subject_id"),
        ("", "", "domain.route.http_method.subject_id"),
    ] {
        assert_eq!(
            stat(
                &d,
                "domain",
                &[
                    ("route", route),
                    ("http_method", method),
                    ("subject_id", "123")
                ]
            ),
            key
        );
    }
    let k1 = "
domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: { unit: second, requests_per_unit: 1 }
";
    assert_eq!(one(k1, "d", &[("k1", "A"), ("k2", "foo")]), "d.k1_A.k2");
    let mid = "
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: { unit: second, requests_per_unit: 1 }
";
    assert_eq!(
        one(mid, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]),
        "d.k1.k2_Y.k3"
    );
    let none = "
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: { unit: second, requests_per_unit: 1 }
";
    assert_eq!(one(none, "d", &[("k1", "X"), ("k2", "Y")]), "d.k1.k2");
    let configured = "
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 30 }
";
    let d = load(&[("inline", configured)], false).unwrap();
    assert_eq!(
        limit(
            &d,
            "test-domain",
            &[
                ("route", "api"),
                ("http_method", "GET"),
                ("subject_id", "user123")
            ]
        ),
        Some((
            60,
            Unit::Minute,
            "test-domain.route_api.http_method_GET.subject_id".into()
        ))
    );
    assert_eq!(
        limit(
            &d,
            "test-domain",
            &[
                ("route", "api"),
                ("http_method", "POST"),
                ("subject_id", "user456")
            ]
        ),
        Some((
            30,
            Unit::Minute,
            "test-domain.route_api.http_method_POST.subject_id".into()
        ))
    );
    let wildcard = "
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: \"read*\"
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: { unit: minute, requests_per_unit: 100 }
";
    let d = load(&[("inline", wildcard)], false).unwrap();
    for (user, action, resource) in [
        ("alice", "readfile", "documents"),
        ("bob", "readdata", "database"),
    ] {
        assert_eq!(
            limit(
                &d,
                "domain",
                &[("user", user), ("action", action), ("resource", resource)]
            ),
            Some((
                100,
                Unit::Minute,
                format!("domain.user_{user}.action_{action}.resource")
            ))
        );
    }
    let plain = "
domain: test-domain-2
descriptors:
  - key: route
    descriptors:
      - key: http_method
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
";
    let request = [
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "user123"),
    ];
    assert_eq!(
        one(plain, "test-domain-2", &request),
        "test-domain-2.route.http_method.subject_id"
    );
    assert_eq!(
        one(&three("test-domain", ""), "test-domain", &request),
        "test-domain.route_api.http_method_GET.subject_id"
    );
}

#[test]
fn share_threshold_counts_every_matching_value_under_its_pattern() {
    let d = load(
        &[(
            "share_threshold.yaml",
            "
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 200 }
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 300 }
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 80 }
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: { unit: minute, requests_per_unit: 120 }
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: { unit: minute, requests_per_unit: 150 }
  - key: file
    value: test1
    rate_limit: { unit: minute, requests_per_unit: 50 }
  - key: file
    value: test*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 50 }
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 80 }
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 60 }
",
        )],
        false,
    )
    .unwrap();
    let td = "test-domain";
    // (request, requests per unit, statistics key, the entries a shared pattern stands for)
    let cases: [(Pairs, u32, &str, &[usize]); 18] = [
        (
            &[("files", "files/a.pdf")],
            100,
            "test-domain.files_files/*",
            &[0],
        ),
        (
            &[("files", "files/b.csv")],
            100,
            "test-domain.files_files/*",
            &[0],
        ),
        (
            &[("files", "files/c.txt")],
            100,
            "test-domain.files_files/*",
            &[0],
        ),
        (
            &[("route", "api/v1"), ("method", "GET")],
            60,
            "test-domain.route_api/*.method",
            &[0],
        ),
        (
            &[("service", "svc/user"), ("endpoint", "get")],
            80,
            "test-domain.service_svc/*.endpoint_get",
            &[0],
        ),
        (
            &[("nested", "parent"), ("files", "nested/file1.txt")],
            200,
            "test-domain.nested_parent.files_nested/*",
            &[1],
        ),
        (
            &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
            300,
            "test-domain.files_top/*.files_nested/*",
            &[0, 1],
        ),
        (
            &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
            120,
            "test-domain.path_path/*.file_file/*.type",
            &[0],
        ),
        (
            &[
                ("user", "user/alice"),
                ("resource", "res/file1"),
                ("action", "read"),
            ],
            150,
            "test-domain.user_user/*.resource_res/*.action",
            &[0, 1],
        ),
        (&[("file", "test1")], 50, "test-domain.file_test1", &[]),
        (&[("file", "test2")], 100, "test-domain.file_test*", &[0]),
        (&[("file", "test23")], 100, "test-domain.file_test*", &[0]),
        (&[("file", "test123")], 100, "test-domain.file_test*", &[0]),
        (
            &[("midpath", "/api/v1")],
            100,
            "test-domain.midpath_/api*v1",
            &[0],
        ),
        (
            &[("midpath", "/api-beta-v1")],
            100,
            "test-domain.midpath_/api*v1",
            &[0],
        ),
        (
            &[("multiroute", "svceprpc")],
            50,
            "test-domain.multiroute_svc*ep*rpc",
            &[0],
        ),
        (
            &[("midroute", "/api-beta-v2")],
            80,
            "test-domain.midroute_/api*v2",
            &[0],
        ),
        (
            &[("tenant", "t99prod"), ("resource", "resBBBv2")],
            60,
            "test-domain.tenant_t*prod.resource_res*v2",
            &[0, 1],
        ),
    ];
    for (pairs, rpu, key, shared) in cases {
        let found = d.get(td).unwrap().find(&entries(pairs), None).unwrap();
        let at: Vec<usize> = found.shared.iter().map(|(i, _)| *i).collect();
        assert_eq!(at, shared, "{pairs:?}");
        assert_eq!(
            limit(&d, td, pairs),
            Some((rpu, Unit::Minute, key.to_owned())),
            "{pairs:?}"
        );
    }
    assert_eq!(
        stat(&d, td, &[("midpath", "/apiXYZv1")]),
        "test-domain.midpath_/api*v1"
    );
    for value in ["svcAepBrpc", "svcXXXepYYYrpc"] {
        assert_eq!(
            stat(&d, td, &[("multiroute", value)]),
            "test-domain.multiroute_svc*ep*rpc"
        );
    }
    assert_eq!(
        stat(&d, td, &[("midroute", "/api/v2")]),
        "test-domain.midroute_/api*v2"
    );
    assert_eq!(
        stat(&d, td, &[("tenant", "t1prod"), ("resource", "resAv2")]),
        "test-domain.tenant_t*prod.resource_res*v2"
    );
    assert_eq!(get(&d, td, &[("midpath", "/api/v2")]), None);
    assert_eq!(get(&d, td, &[("multiroute", "svcABCrpc")]), None);
}

#[test]
fn wildcard_statistics_follow_the_flags() {
    let one = |flags: &str, value: &str, pairs: &[(&str, &str)]| {
        let yaml = format!(
            "domain: test-domain\ndescriptors:\n  - {{ key: wild, value: \"{value}\", {flags} rate_limit: {{ requests_per_unit: 20, unit: minute }} }}\n"
        );
        stat(
            &load(&[("inline", &yaml)], false).unwrap(),
            "test-domain",
            pairs,
        )
    };
    let foo1 = [("wild", "foo1")];
    assert_eq!(one("", "foo*", &foo1), "test-domain.wild_foo*");
    assert_eq!(
        one("value_to_metric: true,", "foo*", &foo1),
        "test-domain.wild_foo1"
    );
    assert_eq!(
        one("share_threshold: true,", "foo*", &foo1),
        "test-domain.wild_foo*"
    );
    assert_eq!(
        one(
            "share_threshold: true, value_to_metric: true,",
            "foo*",
            &foo1
        ),
        "test-domain.wild_foo*"
    );
    assert_eq!(
        one("", "foo*bar*", &[("wild", "foo123bar456")]),
        "test-domain.wild_foo*bar*"
    );
    assert_eq!(
        one("", "foo*bar*", &[("wild", "fooXbarY")]),
        "test-domain.wild_foo*bar*"
    );
    assert_eq!(
        one(
            "value_to_metric: true,",
            "foo*bar*",
            &[("wild", "foo123bar456")]
        ),
        "test-domain.wild_foo123bar456"
    );
    let other = "
domain: test-domain
descriptors:
  - key: wild
    value: \"foo*\"
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: { requests_per_unit: 20, unit: minute }
";
    assert_eq!(
        stat(
            &load(&[("inline", other)], false).unwrap(),
            "test-domain",
            &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]
        ),
        "test-domain.wild_foo*.other_bar.limit"
    );
}

#[test]
fn metadata_is_kept_with_its_descriptor() {
    let d = load(
        &[(
            "metadata.yaml",
            "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    metadata:
      service_with_quota:
        name: service_2
",
        )],
        false,
    )
    .unwrap();
    assert_eq!(limit(&d, "test-domain", &[]), None);
    let metadata = |pairs: &[(&str, &str)]| {
        let found = d
            .get("test-domain")
            .unwrap()
            .find(&entries(pairs), None)
            .unwrap();
        serde_json::Value::Object((*found.node.metadata.clone().unwrap()).clone())
    };
    assert_eq!(
        limit(
            &d,
            "test-domain",
            &[("key1", "value1"), ("subkey1", "something")]
        ),
        Some((5, Unit::Second, "test-domain.key1_value1.subkey1".into()))
    );
    assert_eq!(
        metadata(&[("key1", "value1"), ("subkey1", "something")]),
        serde_json::json!({ "name": "service_1" })
    );
    assert_eq!(
        limit(&d, "test-domain", &[("key2", "something")]),
        Some((20, Unit::Minute, "test-domain.key2".into()))
    );
    assert_eq!(
        metadata(&[("key2", "something")]),
        serde_json::json!({ "service_with_quota": { "name": "service_2" } })
    );
}
