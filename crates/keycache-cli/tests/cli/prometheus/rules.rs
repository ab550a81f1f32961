//! What the alert rules of `dist/keycache.rules.yml` hold, read from its
//! text: the rule blocks and the metric names their expressions read.

use std::collections::BTreeSet;

/// The rule blocks of `dist/keycache.rules.yml`: `(alert name, its text)`.
pub(super) fn rule_blocks(rules: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in rules.lines() {
        if let Some(name) = line.trim_start().strip_prefix("- alert: ") {
            out.push((name.trim().to_owned(), String::new()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

/// The metric names the rules' expressions read.
pub(super) fn rule_metrics(rules: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in rules.lines() {
        let Some(expr) = line.trim_start().strip_prefix("expr: ") else {
            continue;
        };
        // Identifiers outside label matchers and range brackets.
        let mut depth = 0;
        let mut word = String::new();
        for c in expr.chars().chain([' ']) {
            if depth == 0 && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                word.push(c);
                continue;
            }
            if !word.is_empty() && (word.starts_with("keycache_") || word == "up") {
                out.insert(std::mem::take(&mut word));
            }
            word.clear();
            match c {
                '{' | '[' => depth += 1,
                '}' | ']' => depth -= 1,
                _ => {}
            }
        }
    }
    out
}
