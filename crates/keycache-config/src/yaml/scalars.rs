//! PyYAML's YAML 1.1 implicit types of plain scalars and Salt's reading
//! of integers.

use super::{Kind, CORE};

/// PyYAML's implicit resolver (YAML 1.1) for a plain scalar, with Salt's
/// change that `=` is a string.
pub(super) fn resolve_plain(s: &str) -> String {
    let t = if is_bool(s) {
        "bool"
    } else if is_float(s) {
        "float"
    } else if is_int(s) {
        "int"
    } else if s == "<<" {
        "merge"
    } else if matches!(s, "" | "~" | "null" | "Null" | "NULL") {
        "null"
    } else {
        // Timestamps construct as strings under Salt's loader.
        "str"
    };
    format!("{CORE}{t}")
}

fn is_bool(s: &str) -> bool {
    matches!(
        s,
        "yes"
            | "Yes"
            | "YES"
            | "no"
            | "No"
            | "NO"
            | "true"
            | "True"
            | "TRUE"
            | "false"
            | "False"
            | "FALSE"
            | "on"
            | "On"
            | "ON"
            | "off"
            | "Off"
            | "OFF"
    )
}

fn all(s: &str, f: impl Fn(char) -> bool) -> bool {
    s.chars().all(f)
}

fn strip_sign(s: &str) -> &str {
    s.strip_prefix(['-', '+']).unwrap_or(s)
}

/// `[0-9][0-9_]*`
fn digits_lead(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_digit()) && all(s, |c| c.is_ascii_digit() || c == '_')
}

/// `[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+` (without the sign)
fn sexagesimal(s: &str) -> bool {
    let mut parts = s.split(':');
    let first = parts.next().unwrap_or("");
    let rest: Vec<&str> = parts.collect();
    !rest.is_empty()
        && first.starts_with(|c: char| ('1'..='9').contains(&c))
        && all(first, |c| c.is_ascii_digit() || c == '_')
        && rest.iter().all(|p| base_60_digit(p))
}

/// A sexagesimal part after the first: `[0-9]` or `[0-5][0-9]`.
fn base_60_digit(p: &str) -> bool {
    let b = p.as_bytes();
    match b.len() {
        1 => b[0].is_ascii_digit(),
        2 => (b'0'..=b'5').contains(&b[0]) && b[1].is_ascii_digit(),
        _ => false,
    }
}

fn exponent(s: &str) -> bool {
    // (?:[eE][-+][0-9]+)?
    s.is_empty()
        || (s.len() >= 3
            && s.starts_with(['e', 'E'])
            && s[1..].starts_with(['-', '+'])
            && all(&s[2..], |c| c.is_ascii_digit()))
}

/// PyYAML's float regex.
fn is_float(s: &str) -> bool {
    let u = strip_sign(s);
    let signed = u.len() != s.len();
    if matches!(u, ".inf" | ".Inf" | ".INF") {
        return true;
    }
    if !signed && matches!(s, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    // [0-9][0-9_]*\.[0-9_]*(exp)?
    if let Some((int, frac)) = u.split_once('.') {
        if digits_lead(int) && !int.contains(':') {
            let end = frac
                .find(|c: char| !(c.is_ascii_digit() || c == '_'))
                .unwrap_or(frac.len());
            if exponent(&frac[end..]) {
                return true;
            }
        }
        // \.[0-9_]+(exp)? (unsigned)
        if !signed && int.is_empty() {
            let end = frac
                .find(|c: char| !(c.is_ascii_digit() || c == '_'))
                .unwrap_or(frac.len());
            if end > 0 && exponent(&frac[end..]) {
                return true;
            }
        }
        // [0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        if sexagesimal_float_head(int) && all(frac, |c| c.is_ascii_digit() || c == '_') {
            return true;
        }
    }
    false
}

fn sexagesimal_float_head(s: &str) -> bool {
    let mut parts = s.split(':');
    let first = parts.next().unwrap_or("");
    let rest: Vec<&str> = parts.collect();
    !rest.is_empty() && digits_lead(first) && rest.iter().all(|p| base_60_digit(p))
}

/// PyYAML's int regex.
fn is_int(s: &str) -> bool {
    let u = strip_sign(s);
    if let Some(b) = u.strip_prefix("0b") {
        return !b.is_empty() && all(b, |c| matches!(c, '0' | '1' | '_'));
    }
    if let Some(x) = u.strip_prefix("0x") {
        return !x.is_empty() && all(x, |c| c.is_ascii_hexdigit() || c == '_');
    }
    if let Some(o) = u.strip_prefix('0') {
        return o.is_empty() || all(o, |c| matches!(c, '0'..='7' | '_'));
    }
    if u.starts_with(|c: char| ('1'..='9').contains(&c)) {
        return all(u, |c| c.is_ascii_digit() || c == '_') || sexagesimal(u);
    }
    false
}

/// Salt's `construct_scalar` then PyYAML's `construct_yaml_int`.
pub(super) fn construct_int(text: &str) -> Option<Kind> {
    let mut value = text.to_string();
    if value != "0"
        && value.starts_with('0')
        && !value.starts_with("0b")
        && !value.starts_with("0x")
    {
        value = value.trim_start_matches('0').to_string();
        if value.is_empty() {
            value = "0".into();
        }
    }
    let value = value.replace('_', "");
    let (neg, v) = match value.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, value.strip_prefix('+').unwrap_or(&value)),
    };
    if v.is_empty() {
        return None;
    }
    let n: Option<i128> = if v == "0" {
        Some(0)
    } else if let Some(b) = v.strip_prefix("0b") {
        i128::from_str_radix(b, 2).ok()
    } else if let Some(x) = v.strip_prefix("0x") {
        i128::from_str_radix(x, 16).ok()
    } else if v.starts_with('0') {
        i128::from_str_radix(v, 8).ok()
    } else if v.contains(':') {
        let mut total: i128 = 0;
        for part in v.split(':') {
            let d: i128 = part.parse().ok()?;
            total = total.checked_mul(60)?.checked_add(d)?;
        }
        Some(total)
    } else {
        match v.parse::<i128>() {
            Ok(n) => Some(n),
            Err(_) if all(v, |c| c.is_ascii_digit()) => {
                return Some(Kind::BigInt(text.to_string()));
            }
            Err(_) => None,
        }
    };
    n.map(|n| Kind::Int(if neg { -n } else { n }))
}

pub(super) fn parse_float(s: &str) -> Option<f64> {
    s.replace('_', "").parse::<f64>().ok()
}
