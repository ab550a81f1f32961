//! Prometheus' text exposition format as `keycache stats --prometheus` writes
//! it: a strict parser, and the check of an exposition against `stats --json`
//! and `list --json`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::{kc, s};

/// The states of `keycache_keys{state}` and where `list --json` has them.
pub(super) const STATES: [(&str, &str); 4] = [
    ("accepted", "minions"),
    ("pending", "minions_pre"),
    ("rejected", "minions_rejected"),
    ("denied", "minions_denied"),
];

/// The banks of `keycache_bank_*{bank}`.
const BANKS: [&str; 2] = ["keys", "denied_keys"];

/// One sample of an exposition.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Whether `n` is a metric or label name (`[a-zA-Z_:][a-zA-Z0-9_:]*`; no
/// `:` in a label name).
fn is_name(n: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut chars = n.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// Parses Prometheus' text exposition format as `stats --prometheus`
/// writes it, strictly: every line is `# HELP NAME TEXT`, `# TYPE NAME
/// gauge` or `NAME{LABEL="VALUE",...} VALUE`; every sample's name has its
/// HELP and TYPE lines before it, once each; the text ends with a newline.
pub(super) fn parse_exposition(text: &str) -> Vec<Sample> {
    assert!(text.ends_with('\n'), "no final newline: {text:?}");
    let mut help = BTreeSet::new();
    let mut typed = BTreeSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, doc) = rest.split_once(' ').expect("# HELP NAME TEXT");
            assert!(is_name(name, true) && !doc.trim().is_empty(), "{line}");
            assert!(help.insert(name.to_owned()), "a second HELP: {line}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("# TYPE NAME TYPE");
            assert!(is_name(name, true) && ty == "gauge", "{line}");
            assert!(help.contains(name), "TYPE before HELP: {line}");
            assert!(typed.insert(name.to_owned()), "a second TYPE: {line}");
        } else {
            let (name, rest) = line.split_once('{').expect("NAME{LABELS} VALUE");
            assert!(is_name(name, true), "{line}");
            assert!(
                help.contains(name) && typed.contains(name),
                "a sample before its HELP and TYPE: {line}"
            );
            let (labels, value) = rest.rsplit_once("} ").expect("NAME{LABELS} VALUE");
            let mut map = BTreeMap::new();
            let mut rest = labels;
            while !rest.is_empty() {
                let (k, v) = rest.split_once("=\"").expect("LABEL=\"VALUE\"");
                assert!(is_name(k, false), "label name {k:?}: {line}");
                let mut value = String::new();
                let mut chars = v.char_indices();
                let end = loop {
                    match chars.next().expect("an unterminated label value") {
                        (_, '\\') => match chars.next().expect("an escape") {
                            (_, 'n') => value.push('\n'),
                            (_, c) => value.push(c),
                        },
                        (i, '"') => break i,
                        (_, c) => value.push(c),
                    }
                };
                assert!(map.insert(k.to_owned(), value).is_none(), "{line}");
                rest = &v[end + 1..];
                rest = rest.strip_prefix(',').unwrap_or(rest);
            }
            let value: f64 = value.parse().expect("a number");
            assert!(value.is_finite(), "{line}");
            out.push(Sample {
                name: name.to_owned(),
                labels: map,
                value,
            });
        }
    }
    out
}

/// The value of the sample `name{label="value"}`.
pub(super) fn sample(samples: &[Sample], name: &str, label: &str, value: &str) -> f64 {
    let found: Vec<_> = samples
        .iter()
        .filter(|x| x.name == name && x.labels.get(label).map(String::as_str) == Some(value))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{name}{{{label}=\"{value}\"}} in {samples:?}"
    );
    found[0].value
}

/// Checks `stats --prometheus` of the store of config `conf` against
/// `stats --json` and `list --json`: one sample per state and per bank of
/// each gauge, nothing else, the same figures; no label holds a minion id.
/// Returns the exposition.
pub(super) fn check_exposition(conf: &Path) -> String {
    let text = kc().args(["stats", "-c", s(conf), "--prometheus"]).ok();
    let samples = parse_exposition(&text);
    let stats = kc().args(["stats", "-c", s(conf), "--json"]).json();
    let list = kc().args(["list", "-c", s(conf), "--json"]).json();

    let mut want = BTreeSet::new();
    for (state, listed) in STATES {
        let n = list[listed].as_array().expect("a list").len() as f64;
        let v = sample(&samples, "keycache_keys", "state", state);
        assert_eq!(v, n, "keycache_keys{{state={state:?}}} against list --json");
        assert_eq!(
            Some(v),
            stats["counts"][state].as_f64(),
            "keycache_keys{{state={state:?}}} against stats --json"
        );
        want.insert(("keycache_keys".to_owned(), format!("state={state}")));
    }
    for bank in BANKS {
        let b = &stats[bank];
        for (name, json) in [
            ("keycache_bank_load_factor", &b["load_factor"]),
            ("keycache_bank_longest_probe", &b["probe_length"]["max"]),
            ("keycache_bank_heap_bytes", &b["heap_total_bytes"]),
            ("keycache_bank_slots", &b["capacity"]),
        ] {
            assert_eq!(
                Some(sample(&samples, name, "bank", bank)),
                json.as_f64(),
                "{name}{{bank={bank:?}}} against stats --json: {stats}"
            );
            want.insert((name.to_owned(), format!("bank={bank}")));
        }
    }
    let got: BTreeSet<_> = samples
        .iter()
        .map(|x| {
            let labels: Vec<String> = x.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            (x.name.clone(), labels.join(","))
        })
        .collect();
    assert_eq!(got, want, "exactly these samples:\n{text}");
    assert_eq!(got.len(), samples.len(), "no sample twice:\n{text}");

    let ids: BTreeSet<&str> = STATES
        .iter()
        .flat_map(|(_, listed)| list[*listed].as_array().expect("a list"))
        .map(|v| v.as_str().expect("an id"))
        .collect();
    for x in &samples {
        for v in x.labels.values() {
            assert!(!ids.contains(v.as_str()), "a minion id as a label: {x:?}");
        }
    }
    text
}
