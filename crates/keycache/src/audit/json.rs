//! The JSON of the log: a flat object of strings, integers and nulls, all
//! the log ever holds, so the engine needs no JSON library.

use std::collections::HashMap;

/// A value of the log's objects.
pub(super) enum Value {
    Str(String),
    Int(i64),
    Null,
}

/// Appends `t` as a JSON string.
pub(super) fn string(out: &mut String, t: &str) {
    out.push('"');
    for c in t.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Reads a flat JSON object (string, integer or null values); None for
/// anything else.
pub(super) fn object(s: &str) -> Option<HashMap<String, Value>> {
    let mut p = Parser {
        s: s.as_bytes(),
        i: 0,
    };
    let mut m = HashMap::new();
    p.expect(b'{')?;
    if !p.eat(b'}') {
        loop {
            let k = p.string()?;
            p.expect(b':')?;
            let v = p.value()?;
            m.insert(k, v);
            if p.eat(b'}') {
                break;
            }
            p.expect(b',')?;
        }
    }
    p.ws();
    (p.i == p.s.len()).then_some(m)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|b| b" \t\r\n".contains(b)) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        let hit = self.s.get(self.i) == Some(&b);
        self.i += usize::from(hit);
        hit
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        self.eat(b).then_some(())
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        match self.s.get(self.i)? {
            b'"' => self.string().map(Value::Str),
            b'n' => {
                let hit = self.s.get(self.i..self.i + 4) == Some(b"null");
                self.i += 4;
                hit.then_some(Value::Null)
            }
            _ => {
                let start = self.i;
                self.i += usize::from(self.s.get(self.i) == Some(&b'-'));
                while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                    self.i += 1;
                }
                std::str::from_utf8(&self.s[start..self.i])
                    .ok()?
                    .parse()
                    .ok()
                    .map(Value::Int)
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = std::str::from_utf8(self.s.get(self.i..self.i + 4)?).ok()?;
        self.i += 4;
        u32::from_str_radix(h, 16).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.expect(b'"')?;
        let mut out = Vec::new();
        loop {
            let b = *self.s.get(self.i)?;
            self.i += 1;
            match b {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&hi) {
                                if self.s.get(self.i..self.i + 2) != Some(b"\\u") {
                                    return None;
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&lo) {
                                    return None;
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else {
                                hi
                            };
                            char::from_u32(code)?
                        }
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                b if b < 0x20 => return None,
                b => out.push(b),
            }
        }
    }
}
