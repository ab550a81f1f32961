//! Salt's YAML loader, as far as a master config needs it.
//!
//! Salt reads its config files with `salt.utils.yamlloader.SaltYamlSafeLoader`
//! (PyYAML's `SafeLoader`, YAML 1.1). `saphyr-parser` gives the events and
//! their positions; this module composes and constructs them the way that
//! loader does:
//!
//! - the implicit types of plain scalars are PyYAML's YAML 1.1 resolver's:
//!   `yes`/`no`/`on`/`off`/`true`/`false` (three casings each) are booleans,
//!   `~`, `null` and the empty scalar are null, `1_000`, `0x1f`, `0b101`,
//!   `1:30` (base 60) are integers, and a float needs a dot;
//! - integers written with a leading zero are decimal (`010` is 10): Salt's
//!   `construct_scalar` strips the zeros before PyYAML would read octal; only
//!   a signed one (`-010`) is still octal, as PyYAML reads it;
//! - a duplicate key in one mapping is an error ("found conflicting ID"),
//!   where PyYAML keeps the last; keys compare as Python compares them (`1`,
//!   `0x1`, `true` and `on` are one key);
//! - merge keys (`<<`) merge as Salt's `flatten_mapping` does: the merged
//!   pairs go first, those whose key text the mapping has are dropped;
//! - `!!timestamp` values stay strings, `!!binary` is bytes, an unknown tag
//!   is an error, and a stream of several documents is an error.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

use scalars::{construct_int, parse_float, resolve_plain};

/// A constructed YAML value with the position of its node.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The value.
    pub kind: Kind,
    /// Where the node starts: line (1-based).
    pub line: usize,
    /// Where the node starts: column (1-based).
    pub col: usize,
}

/// The Python value a node constructs to.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// `None`.
    Null,
    /// `bool`.
    Bool(bool),
    /// `int` (one that does not fit an i128 is [`Kind::BigInt`]).
    Int(i128),
    /// An `int` past i128, as written.
    BigInt(String),
    /// `float`, as written.
    Float(String),
    /// `str`.
    Str(String),
    /// `bytes` (`!!binary`).
    Bytes,
    /// `list`.
    Seq(Vec<Node>),
    /// `dict`, in file order.
    Map(Vec<(Node, Node)>),
}

impl Kind {
    /// The Python type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool(_) => "a boolean",
            Kind::Int(_) | Kind::BigInt(_) => "an integer",
            Kind::Float(_) => "a float",
            Kind::Str(_) => "a string",
            Kind::Bytes => "binary data",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }

    /// Python's truth value of the constructed object.
    pub fn truthy(&self) -> bool {
        match self {
            Kind::Null => false,
            Kind::Bool(b) => *b,
            Kind::Int(i) => *i != 0,
            Kind::BigInt(_) => true,
            Kind::Float(s) => parse_float(s) != Some(0.0),
            Kind::Str(s) => !s.is_empty(),
            Kind::Bytes => true,
            Kind::Seq(v) => !v.is_empty(),
            Kind::Map(v) => !v.is_empty(),
        }
    }
}

/// A YAML error: a message and where (1-based line and column).
#[derive(Debug, Clone, PartialEq)]
pub struct YamlError {
    /// What is wrong.
    pub message: String,
    /// Line, 1-based.
    pub line: usize,
    /// Column, 1-based.
    pub col: usize,
}

fn err_at(span: &Span, message: impl Into<String>) -> YamlError {
    YamlError {
        message: message.into(),
        line: span.start.line(),
        col: span.start.col() + 1,
    }
}

mod scalars;

const CORE: &str = "tag:yaml.org,2002:";

/// A composed node: the tree before construction.
#[derive(Debug, Clone)]
enum Composed {
    Scalar {
        text: String,
        tag: String,
        span: Span,
    },
    Seq {
        items: Vec<Composed>,
        tag: String,
        span: Span,
    },
    Map {
        pairs: Vec<(Composed, Composed)>,
        tag: String,
        span: Span,
    },
}

impl Composed {
    fn span(&self) -> &Span {
        match self {
            Composed::Scalar { span, .. }
            | Composed::Seq { span, .. }
            | Composed::Map { span, .. } => span,
        }
    }

    fn tag(&self) -> &str {
        match self {
            Composed::Scalar { tag, .. }
            | Composed::Seq { tag, .. }
            | Composed::Map { tag, .. } => tag,
        }
    }

    fn id(&self) -> &'static str {
        match self {
            Composed::Scalar { .. } => "scalar",
            Composed::Seq { .. } => "sequence",
            Composed::Map { .. } => "mapping",
        }
    }
}

fn tag_string(tag: &Tag) -> String {
    format!("{}{}", tag.handle, tag.suffix)
}

/// Parses one YAML stream as `SaltYamlSafeLoader` would: `Ok(None)` for an
/// empty stream, else the one document's value.
pub fn load(text: &str) -> Result<Option<Node>, YamlError> {
    // PyYAML skips a byte order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut events = Vec::new();
    for ev in Parser::new_from_str(text) {
        match ev {
            Ok(e) => events.push(e),
            Err(e) => {
                return Err(YamlError {
                    message: e.info().to_string(),
                    line: e.marker().line(),
                    col: e.marker().col() + 1,
                })
            }
        }
    }
    let mut c = Composer {
        events: events.into_iter(),
        anchors: HashMap::new(),
    };
    let mut doc = None;
    while let Some((ev, span)) = c.events.next() {
        match ev {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                if doc.is_some() {
                    return Err(err_at(
                        &span,
                        "expected a single document in the stream, but found another document",
                    ));
                }
                let (ev, span) = c.next_event()?;
                doc = Some(c.compose(ev, span)?);
                c.anchors.clear();
            }
            _ => return Err(err_at(&span, "unexpected YAML event")),
        }
    }
    doc.map(|d| construct(&d)).transpose()
}

struct Composer<'a> {
    events: std::vec::IntoIter<(Event<'a>, Span)>,
    anchors: HashMap<usize, Composed>,
}

impl<'a> Composer<'a> {
    fn next_event(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        self.events.next().ok_or(YamlError {
            message: "unexpected end of the stream".into(),
            line: 0,
            col: 0,
        })
    }

    /// The next node of a collection, or `None` at the collection's end
    /// (the event `end` picks).
    fn compose_item(&mut self, end: fn(&Event<'a>) -> bool) -> Result<Option<Composed>, YamlError> {
        let (ev, sp) = self.next_event()?;
        if end(&ev) {
            return Ok(None);
        }
        self.compose(ev, sp).map(Some)
    }

    fn compose(&mut self, ev: Event<'a>, span: Span) -> Result<Composed, YamlError> {
        let (node, anchor) = match ev {
            Event::Alias(id) => {
                return self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| err_at(&span, "found undefined alias"));
            }
            Event::Scalar(value, style, anchor, tag) => {
                let tag = match tag {
                    Some(t) if t.handle == "!" && t.suffix.is_empty() => format!("{CORE}str"),
                    Some(t) => tag_string(&t),
                    None if style == ScalarStyle::Plain => resolve_plain(&value).to_string(),
                    None => format!("{CORE}str"),
                };
                let node = Composed::Scalar {
                    text: value.into_owned(),
                    tag,
                    span,
                };
                (node, anchor)
            }
            Event::SequenceStart(anchor, tag) => {
                let tag = tag.map_or_else(|| format!("{CORE}seq"), |t| tag_string(&t));
                let mut items = Vec::new();
                while let Some(item) = self.compose_item(|e| matches!(e, Event::SequenceEnd))? {
                    items.push(item);
                }
                (Composed::Seq { items, tag, span }, anchor)
            }
            Event::MappingStart(anchor, tag) => {
                let tag = tag.map_or_else(|| format!("{CORE}map"), |t| tag_string(&t));
                let mut pairs = Vec::new();
                while let Some(k) = self.compose_item(|e| matches!(e, Event::MappingEnd))? {
                    let (ev, sp) = self.next_event()?;
                    let v = self.compose(ev, sp)?;
                    pairs.push((k, v));
                }
                (Composed::Map { pairs, tag, span }, anchor)
            }
            _ => return Err(err_at(&span, "unexpected YAML event")),
        };
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(node)
    }
}

fn node(kind: Kind, span: &Span) -> Node {
    Node {
        kind,
        line: span.start.line(),
        col: span.start.col() + 1,
    }
}

/// What makes two constructed keys equal in a Python dict.
#[derive(PartialEq, Eq, Hash)]
enum KeyId {
    Null,
    Int(i128),
    Float(u64),
    Big(String),
    Str(String),
}

fn key_id(k: &Kind) -> Option<KeyId> {
    Some(match k {
        Kind::Null => KeyId::Null,
        Kind::Bool(b) => KeyId::Int(i128::from(*b)),
        Kind::Int(i) => KeyId::Int(*i),
        Kind::BigInt(s) => KeyId::Big(s.clone()),
        Kind::Float(s) => {
            let f = parse_float(s).unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() < 1e30 {
                // An integral float equals the int of the same value.
                #[allow(clippy::cast_possible_truncation)]
                KeyId::Int(f as i128)
            } else {
                KeyId::Float(f.to_bits())
            }
        }
        Kind::Str(s) => KeyId::Str(s.clone()),
        Kind::Bytes => KeyId::Str(String::from("\u{0}bytes")),
        Kind::Seq(_) | Kind::Map(_) => return None,
    })
}

fn construct(c: &Composed) -> Result<Node, YamlError> {
    let tag = c.tag();
    let short = tag.strip_prefix(CORE);
    match c {
        Composed::Scalar { text, span, .. } => {
            let kind = match short {
                Some("str") | Some("timestamp") | Some("value") => Kind::Str(text.clone()),
                Some("null") => Kind::Null,
                Some("bool") => match text.to_ascii_lowercase().as_str() {
                    "yes" | "true" | "on" => Kind::Bool(true),
                    "no" | "false" | "off" => Kind::Bool(false),
                    _ => return Err(err_at(span, format!("invalid boolean {text:?}"))),
                },
                Some("int") => construct_int(text)
                    .ok_or_else(|| err_at(span, format!("invalid integer {text:?}")))?,
                Some("float") => Kind::Float(text.clone()),
                Some("binary") => Kind::Bytes,
                Some("merge") => Kind::Str(text.clone()),
                _ if tag == "tag:yaml.org,2002:python/unicode" => Kind::Str(text.clone()),
                _ => return Err(unknown_tag(tag, span)),
            };
            Ok(node(kind, span))
        }
        Composed::Seq { items, span, .. } => {
            if !matches!(short, Some("seq")) {
                return Err(unknown_tag(tag, span));
            }
            let items = items.iter().map(construct).collect::<Result<_, _>>()?;
            Ok(node(Kind::Seq(items), span))
        }
        Composed::Map { pairs, span, .. } => {
            if !matches!(short, Some("map")) {
                return Err(unknown_tag(tag, span));
            }
            let pairs = flatten(pairs, span)?;
            let mut seen = HashMap::new();
            let mut out = Vec::with_capacity(pairs.len());
            for (k, v) in &pairs {
                let key = construct(k)?;
                let Some(id) = key_id(&key.kind) else {
                    return Err(err_at(
                        k.span(),
                        format!(
                            "while constructing a mapping, found unacceptable key ({})",
                            key.kind.type_name()
                        ),
                    ));
                };
                if seen.insert(id, ()).is_some() {
                    let shown = match &key.kind {
                        Kind::Str(s) => s.clone(),
                        other => format!("{other:?}"),
                    };
                    return Err(err_at(
                        k.span(),
                        format!("while constructing a mapping, found conflicting ID '{shown}'"),
                    ));
                }
                out.push((key, construct(v)?));
            }
            Ok(node(Kind::Map(out), span))
        }
    }
}

fn unknown_tag(tag: &str, span: &Span) -> YamlError {
    err_at(
        span,
        format!("could not determine a constructor for the tag '{tag}'"),
    )
}

/// Salt's `flatten_mapping`: merge keys resolved into the pair list.
fn flatten(
    pairs: &[(Composed, Composed)],
    span: &Span,
) -> Result<Vec<(Composed, Composed)>, YamlError> {
    let mut own = Vec::new();
    let mut merge: Vec<(Composed, Composed)> = Vec::new();
    for (k, v) in pairs {
        if k.tag() == format!("{CORE}merge") {
            match v {
                Composed::Map { pairs: sub, .. } => merge.extend(flatten(sub, v.span())?),
                Composed::Seq { items, .. } => {
                    let mut submerge = Vec::new();
                    for item in items {
                        let Composed::Map { pairs: sub, .. } = item else {
                            return Err(err_at(
                                item.span(),
                                format!(
                                    "while constructing a mapping, expected a mapping for merging, but found {}",
                                    item.id()
                                ),
                            ));
                        };
                        submerge.push(flatten(sub, item.span())?);
                    }
                    for m in submerge.into_iter().rev() {
                        merge.extend(m);
                    }
                }
                Composed::Scalar { .. } => {
                    return Err(err_at(
                        v.span(),
                        "while constructing a mapping, expected a mapping or list of mappings for merging, but found scalar",
                    ))
                }
            }
        } else {
            own.push((k.clone(), v.clone()));
        }
    }
    let _ = span;
    if merge.is_empty() {
        return Ok(own);
    }
    let existing: Vec<Option<&str>> = own.iter().map(|(k, _)| scalar_text(k)).collect();
    let mut out: Vec<(Composed, Composed)> = merge
        .into_iter()
        .filter(|(k, _)| {
            let t = scalar_text(k);
            t.is_none() || !existing.contains(&t)
        })
        .collect();
    out.extend(own);
    Ok(out)
}

fn scalar_text(c: &Composed) -> Option<&str> {
    match c {
        Composed::Scalar { text, .. } => Some(text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(src: &str) -> Kind {
        let n = load(&format!("k: {src}\n")).unwrap().unwrap();
        let Kind::Map(mut pairs) = n.kind else {
            panic!("not a map")
        };
        pairs.remove(0).1.kind
    }

    #[test]
    fn yaml_1_1_scalars_as_pyyaml_and_salt_read_them() {
        assert_eq!(one("on"), Kind::Bool(true));
        assert_eq!(one("Off"), Kind::Bool(false));
        assert_eq!(one("y"), Kind::Str("y".into()));
        assert_eq!(one("~"), Kind::Null);
        assert_eq!(one(""), Kind::Null);
        assert_eq!(one("1_000_000"), Kind::Int(1_000_000));
        assert_eq!(one("0x1f"), Kind::Int(31));
        assert_eq!(one("0b101"), Kind::Int(5));
        assert_eq!(one("010"), Kind::Int(10)); // Salt strips the zeros
        assert_eq!(one("-010"), Kind::Int(-8)); // PyYAML octal
        assert_eq!(one("00"), Kind::Int(0));
        assert_eq!(one("1:30"), Kind::Int(90));
        assert_eq!(one("+7"), Kind::Int(7));
        assert_eq!(one("0o17"), Kind::Str("0o17".into()));
        assert_eq!(one("1e6"), Kind::Str("1e6".into()));
        assert_eq!(one("1.0e+6"), Kind::Float("1.0e+6".into()));
        assert_eq!(one("1."), Kind::Float("1.".into()));
        assert_eq!(one(".5"), Kind::Float(".5".into()));
        assert_eq!(one("'10'"), Kind::Str("10".into()));
        assert_eq!(one("!!str 10"), Kind::Str("10".into()));
        assert_eq!(one("!!int '12'"), Kind::Int(12));
        assert_eq!(one("2001-12-14"), Kind::Str("2001-12-14".into()));
        assert_eq!(one("="), Kind::Str("=".into()));
        assert!(matches!(
            one("99999999999999999999999999999999999999999"),
            Kind::BigInt(_)
        ));
    }

    #[test]
    fn duplicate_keys_are_an_error_as_in_salt() {
        let e = load("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert!(e.message.contains("conflicting ID 'a'"), "{e:?}");
        assert_eq!((e.line, e.col), (3, 1));
        // Python equality: 1, 0x1 and true are one key.
        assert!(load("1: a\ntrue: b\n").is_err());
        assert!(load("on: a\nyes: b\n").is_err());
        assert!(load("'1': a\n1: b\n").is_ok());
    }

    #[test]
    fn merge_keys_as_salt_flattens_them() {
        let n = load("base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  y: 3\n")
            .unwrap()
            .unwrap();
        let Kind::Map(top) = n.kind else { panic!() };
        let Kind::Map(m) = &top[1].1.kind else {
            panic!()
        };
        let got: Vec<_> = m
            .iter()
            .map(|(k, v)| (k.kind.clone(), v.kind.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (Kind::Str("x".into()), Kind::Int(1)),
                (Kind::Str("y".into()), Kind::Int(3)),
            ]
        );
        // Two merged mappings with a common key: Salt's loader refuses it.
        assert!(load("a: &a {x: 1}\nb: &b {x: 2}\nc:\n  <<: [*a, *b]\n").is_err());
    }

    #[test]
    fn streams_and_errors() {
        assert_eq!(load("").unwrap(), None);
        assert_eq!(load("# only a comment\n").unwrap(), None);
        assert_eq!(load("---\n").unwrap().unwrap().kind, Kind::Null);
        let e = load("a: 1\n---\nb: 2\n").unwrap_err();
        assert!(e.message.contains("single document"), "{e:?}");
        let e = load("a: 1\nb: [1, 2\nc: 3\n").unwrap_err();
        assert!(e.line >= 2, "{e:?}");
        let e = load("a: !!python/object:os.system x\n").unwrap_err();
        assert!(
            e.message.contains("could not determine a constructor"),
            "{e:?}"
        );
        assert!(load("a: *nope\n").is_err());
        assert!(load("[1]: x\n").is_err());
    }
}
