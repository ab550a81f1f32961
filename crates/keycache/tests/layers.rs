//! The library's modules in the order docs/design.md draws them ("The
//! workspace"): each uses only those before it (read off the `crate::`
//! paths of its sources, outside comments and tests), but for the modules
//! everything uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom up, as docs/design.md lists them.
const ORDER: &[&str] = &[
    "map",
    "clock",
    "pem",
    "format",
    "heap",
    "roster",
    "journal",
    "fit",
    "image",
    "table",
    "rebuild",
    "key",
    "tree",
    "removals",
    "audit",
    "master_keys",
    "store",
    "migrate",
    "verify",
    "export",
    "diff",
    "report",
];

/// Used by every module.
const EVERYWHERE: &[&str] = &["error", "files", "id"];

/// Module -> the modules its sources name.
fn uses(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut tops = BTreeSet::new();
    for e in std::fs::read_dir(src).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        tops.insert(name.trim_end_matches(".rs").to_owned());
    }
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(src).unwrap().to_string_lossy().into_owned();
            if p.file_stem().is_some_and(|s| s == "tests") || rel.starts_with("test_util") {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let top = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_owned();
            if top == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("crate::") {
                    let name: String = line[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if name != top && tops.contains(&name) {
                        out.entry(top.clone()).or_default().insert(name);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_module_uses_only_those_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let uses = uses(&src);
    let mut wrong = Vec::new();
    for (module, deps) in &uses {
        if EVERYWHERE.contains(&module.as_str()) {
            continue;
        }
        let Some(at) = ORDER.iter().position(|m| m == module) else {
            wrong.push(format!("{module} is not in the order (docs/design.md)"));
            continue;
        };
        for dep in deps {
            let below = ORDER.iter().position(|m| m == dep).is_some_and(|d| d < at);
            let allowed = EVERYWHERE.contains(&dep.as_str());
            if !below && !allowed {
                wrong.push(format!("{module} -> {dep}"));
            }
        }
    }
    // The reader itself works: the store's own arrows are found.
    assert!(uses["store"].contains("table") && uses["table"].contains("format"));
    assert!(wrong.is_empty(), "arrows against the order: {wrong:?}");
}
