//! Python's `glob.glob` (not recursive, hidden files excluded), which Salt's
//! `include_config` expands `include` and `default_include` with, and
//! `fnmatch`'s pattern language (`*`, `?`, `[seq]`, `[!seq]`).
//!
//! As in Python: a wildcard never matches a leading `.` unless the pattern
//! component starts with one, a directory that cannot be listed matches
//! nothing, a pattern without wildcards matches itself when it exists
//! (`lexists`: a broken symlink too), and `**` is `*`.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn has_magic(s: &[u8]) -> bool {
    s.iter().any(|c| matches!(c, b'*' | b'?' | b'['))
}

/// `os.path.split`: head (trailing slashes removed unless all slashes), tail.
fn split(p: &[u8]) -> (&[u8], &[u8]) {
    let i = p.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
    let (head, tail) = p.split_at(i);
    let trimmed = {
        let mut h = head;
        while h.len() > 1 && h.ends_with(b"/") {
            h = &h[..h.len() - 1];
        }
        if h.iter().all(|&c| c == b'/') {
            head
        } else {
            h
        }
    };
    (trimmed, tail)
}

fn os(p: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(p))
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    let mut v = dir.to_vec();
    if !v.ends_with(b"/") {
        v.push(b'/');
    }
    v.extend_from_slice(name);
    v
}

fn lexists(p: &[u8]) -> bool {
    std::fs::symlink_metadata(os(p)).is_ok()
}

fn isdir(p: &[u8]) -> bool {
    std::fs::metadata(os(p)).is_ok_and(|m| m.is_dir())
}

fn listdir(dir: &[u8], dironly: bool) -> Vec<Vec<u8>> {
    let d = if dir.is_empty() { b".".as_slice() } else { dir };
    let Ok(rd) = std::fs::read_dir(os(d)) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter(|e| !dironly || std::fs::metadata(e.path()).is_ok_and(|m| m.is_dir()))
        .map(|e| e.file_name().as_bytes().to_vec())
        .collect()
}

fn glob1(dir: &[u8], pattern: &[u8], dironly: bool) -> Vec<Vec<u8>> {
    let hidden_ok = pattern.first() == Some(&b'.');
    listdir(dir, dironly)
        .into_iter()
        .filter(|n| hidden_ok || n.first() != Some(&b'.'))
        .filter(|n| fnmatch(n, pattern))
        .collect()
}

fn glob0(dir: &[u8], base: &[u8]) -> Vec<Vec<u8>> {
    if base.is_empty() {
        if isdir(dir) {
            return vec![base.to_vec()];
        }
    } else if lexists(&join(dir, base)) {
        return vec![base.to_vec()];
    }
    Vec::new()
}

fn iglob(path: &[u8], dironly: bool) -> Vec<Vec<u8>> {
    let (dir, base) = split(path);
    if !has_magic(path) {
        let hit = if base.is_empty() {
            isdir(dir)
        } else {
            lexists(path)
        };
        return if hit { vec![path.to_vec()] } else { Vec::new() };
    }
    if dir.is_empty() {
        return glob1(dir, base, dironly);
    }
    let dirs = if dir != path && has_magic(dir) {
        iglob(dir, true)
    } else {
        vec![dir.to_vec()]
    };
    let mut out = Vec::new();
    for d in dirs {
        let names = if has_magic(base) {
            glob1(&d, base, dironly)
        } else {
            glob0(&d, base)
        };
        for n in names {
            out.push(join(&d, &n));
        }
    }
    out
}

/// `sorted(glob.glob(pattern))`.
pub fn glob_sorted(pattern: &Path) -> Vec<PathBuf> {
    let mut v = iglob(pattern.as_os_str().as_bytes(), false);
    v.sort();
    v.into_iter()
        .map(|b| PathBuf::from(std::ffi::OsString::from(std::ffi::OsStr::from_bytes(&b))))
        .collect()
}

/// `fnmatch.fnmatchcase(name, pattern)`.
///
/// Iterative, backtracking only to the last `*` (the other tokens match
/// one byte each): time at most the product of the lengths, where a
/// recursive match is exponential in the number of `*` (a fuzzed
/// `include: m****...` took minutes).
pub fn fnmatch(name: &[u8], pat: &[u8]) -> bool {
    let (mut n, mut p) = (0usize, 0usize);
    // The pattern index after the last `*`, and the name index it matched up to.
    let mut star: Option<(usize, usize)> = None;
    loop {
        if p < pat.len() {
            let here = name.get(n).copied();
            let step = match pat[p] {
                b'*' => {
                    p += 1;
                    star = Some((p, n));
                    continue;
                }
                b'?' => here.map(|_| 1),
                b'[' => match class(&pat[p + 1..]) {
                    Some((matches, len)) => here.filter(|&c| matches(c)).map(|_| 1 + len),
                    // An unclosed `[` is a literal.
                    None => here.filter(|&c| c == b'[').map(|_| 1),
                },
                c => here.filter(|&h| h == c).map(|_| 1),
            };
            if let Some(len) = step {
                n += 1;
                p += len;
                continue;
            }
        } else if n == name.len() {
            return true;
        }
        match star {
            Some((sp, sn)) if sn < name.len() => {
                star = Some((sp, sn + 1));
                p = sp;
                n = sn + 1;
            }
            _ => return false,
        }
    }
}

type ClassFn = Box<dyn Fn(u8) -> bool>;

/// The class after a `[`: its matcher and how many bytes it takes up to and
/// including the `]`, or `None` when it is not closed.
fn class(p: &[u8]) -> Option<(ClassFn, usize)> {
    let mut i = 0;
    let neg = p.first() == Some(&b'!');
    if neg {
        i += 1;
    }
    // A `]` first is a member.
    if p.get(i) == Some(&b']') {
        i += 1;
    }
    let end = i + p[i..].iter().position(|&c| c == b']')?;
    let body = &p[usize::from(neg)..end];
    let mut ranges = Vec::new();
    let mut j = 0;
    while j < body.len() {
        if j + 2 < body.len() && body[j + 1] == b'-' {
            ranges.push((body[j], body[j + 2]));
            j += 3;
        } else {
            ranges.push((body[j], body[j]));
            j += 1;
        }
    }
    let f = move |c: u8| ranges.iter().any(|&(a, b)| a <= c && c <= b) != neg;
    Some((Box::new(f), end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recursive definition, as a reference on short inputs.
    fn reference(name: &[u8], pat: &[u8]) -> bool {
        match pat.first() {
            None => name.is_empty(),
            Some(b'*') => (0..=name.len()).any(|i| reference(&name[i..], &pat[1..])),
            Some(b'?') => !name.is_empty() && reference(&name[1..], &pat[1..]),
            Some(b'[') => match class(&pat[1..]) {
                Some((m, len)) => {
                    !name.is_empty() && m(name[0]) && reference(&name[1..], &pat[1 + len..])
                }
                None => name.first() == Some(&b'[') && reference(&name[1..], &pat[1..]),
            },
            Some(&c) => name.first() == Some(&c) && reference(&name[1..], &pat[1..]),
        }
    }

    #[test]
    fn agrees_with_the_recursive_definition() {
        let mut rng = keycache_testkit::rng::Rng::new(7);
        let alphabet = b"ab*?[]!-";
        for _ in 0..20_000 {
            let pl = rng.below(8) as usize;
            let nl = rng.below(8) as usize;
            let pat: Vec<u8> = (0..pl).map(|_| *rng.pick(alphabet)).collect();
            let name: Vec<u8> = (0..nl).map(|_| *rng.pick(b"ab[]-")).collect();
            assert_eq!(
                fnmatch(&name, &pat),
                reference(&name, &pat),
                "{:?} {:?}",
                String::from_utf8_lossy(&name),
                String::from_utf8_lossy(&pat)
            );
        }
    }

    #[test]
    fn many_stars_are_no_blowup() {
        // The fuzzer's input: dozens of `*` around literals that do not
        // match; the recursive match took minutes.
        let pat = [b"m".as_slice(), &[b'*'; 60], b"root", &[b'*'; 60], b"aste*"].concat();
        let name = [b"m".as_slice(), &[b'x'; 200], b"roo"].concat();
        assert!(!fnmatch(&name, &pat));
        let name = [
            b"m".as_slice(),
            &[b'x'; 100],
            b"root",
            &[b'y'; 100],
            b"aste",
        ]
        .concat();
        assert!(fnmatch(&name, &pat));
    }

    #[test]
    fn fnmatch_as_python() {
        assert!(fnmatch(b"a.conf", b"*.conf"));
        assert!(!fnmatch(b"a.conf.bak", b"*.conf"));
        assert!(fnmatch(b"a1", b"a?"));
        assert!(fnmatch(b"b", b"[a-c]"));
        assert!(!fnmatch(b"b", b"[!a-c]"));
        assert!(fnmatch(b"]", b"[]]"));
        assert!(fnmatch(b"[x", b"[x"));
        assert!(fnmatch(b"x.conf", b"**.conf"));
    }

    #[test]
    fn glob_as_python() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("m.d/sub")).unwrap();
        for f in [
            "m.d/b.conf",
            "m.d/a.conf",
            "m.d/.hidden.conf",
            "m.d/c.txt",
            "m.d/sub/z.conf",
        ] {
            std::fs::write(d.join(f), "").unwrap();
        }
        let names = |pat: &str| -> Vec<String> {
            glob_sorted(&d.join(pat))
                .iter()
                .map(|p| p.strip_prefix(d).unwrap().display().to_string())
                .collect()
        };
        assert_eq!(names("m.d/*.conf"), ["m.d/a.conf", "m.d/b.conf"]);
        assert_eq!(names("m.d/.*.conf"), ["m.d/.hidden.conf"]);
        assert_eq!(names("*/*.conf"), ["m.d/a.conf", "m.d/b.conf"]);
        assert_eq!(names("m.d/*/*.conf"), ["m.d/sub/z.conf"]);
        assert_eq!(names("m.d/c.txt"), ["m.d/c.txt"]);
        assert!(names("m.d/none.conf").is_empty());
        assert!(names("nodir/*.conf").is_empty());
    }
}
