//! Fuzz body: `localfs_key` trees with odd names, sizes, symlinks,
//! directories and sockets migrated into a store, checked against a model
//! of the migrator's rules; nothing outside the tree is read, nothing
//! outside the target written.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use keycache::error::Error;
use keycache::format::{self, Params};
use keycache::migrate::{self, MigrateOptions, SkipReason};
use keycache::store::{KeyState, Store};
use keycache::verify;
use keycache::MinionId;

use super::{banks_of, opts, snapshot, state_of, Input};

const NAME_POOL: [&[u8]; 12] = [
    b"web-01",
    b"db.example.com",
    "Ünïcode".as_bytes(),
    b"k",
    b"a b",
    b"exactly-16-bytes",
    b"seventeen-bytes-x",
    b".hidden",
    b"back\\slash",
    b"\xff\xfe",
    b"-",
    b"...",
];
const TREE_ID_SIZE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pem,
    Junk,
    Empty,
    TooLarge,
    ExactlyMax,
    SymlinkOut,
    SymlinkIn,
    Dir,
    Socket,
}

/// The migrator's key-file rule, restated: no private key block anywhere;
/// else exactly one `PUBLIC KEY` / `RSA PUBLIC KEY` block of base64 lines,
/// and only blank lines around it.
fn key_file_skip(b: &[u8]) -> Option<SkipReason> {
    if b.windows(16).any(|w| w == b"PRIVATE KEY-----") {
        return Some(SkipReason::PrivateKey);
    }
    let Some(text) = std::str::from_utf8(b).ok().filter(|t| t.is_ascii()) else {
        return Some(SkipReason::NotAPublicKey);
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let ok = lines.len() >= 3 && {
        let (first, last) = (lines[0], lines[lines.len() - 1]);
        ["PUBLIC KEY", "RSA PUBLIC KEY"].iter().any(|l| {
            first == format!("-----BEGIN {l}-----") && last == format!("-----END {l}-----")
        }) && lines[1..lines.len() - 1].iter().all(|l| {
            l.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"+/=".contains(&c))
        })
    };
    (!ok).then_some(SkipReason::NotAPublicKey)
}

fn big_pem(len: usize) -> Vec<u8> {
    let head = b"-----BEGIN PUBLIC KEY-----\n";
    let tail = b"\n-----END PUBLIC KEY-----\n";
    let mut v = head.to_vec();
    v.resize(len - tail.len(), b'A');
    v.extend_from_slice(tail);
    v
}

/// Migrates a tree made from the input and checks the result against a
/// model of the migrator's rules.
pub fn migrate_tree(data: &[u8]) {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let (replace, skip_long, existing, dry_run) = (
        flags & 1 != 0,
        flags & 2 != 0,
        flags & 4 != 0,
        flags & 0x40 != 0,
    );
    let sizes = [8u64, 16, 64];
    let params = Params {
        size: sizes[usize::from((flags >> 3) % 3)],
        id_size: TREE_ID_SIZE,
        slot_size: format::min_slot_size(TREE_ID_SIZE) + 3,
        max_segment_bytes: 1 << 20,
    };
    let layout_byte = inp.u8();
    let scratch = crate::scratch::fuzz_dir("tree");
    let root = scratch.path();
    let pki = root.join("pki");
    let out = root.join("out");
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).expect("mkdir");
    let secret = b"-----BEGIN PUBLIC KEY-----\nOUTSIDE-SECRET\n-----END PUBLIC KEY-----\n";
    std::fs::write(outside.join("secret"), secret).expect("write");
    std::fs::create_dir_all(&pki).expect("mkdir");
    // Which state directories exist; one may be a symlink to a directory
    // outside the tree (the tree is then refused).
    let mut symlinked_dir = None;
    for (i, d) in keycache::tree::TreeDir::NAMES.iter().enumerate() {
        if layout_byte & (1 << i) != 0 {
            continue;
        }
        if layout_byte & 0x30 == 0x30 && (layout_byte >> 6) as usize == i {
            std::os::unix::fs::symlink(&outside, pki.join(d)).expect("symlink");
            symlinked_dir = Some(i);
        } else {
            std::fs::create_dir(pki.join(d)).expect("mkdir");
        }
    }
    let present: Vec<bool> = (0..4)
        .map(|i| layout_byte & (1 << i) == 0 && symlinked_dir != Some(i))
        .collect();
    // Entries.
    let mut entries: Vec<(usize, Vec<u8>, Kind, Vec<u8>)> = Vec::new();
    let count = inp.u8() % 24;
    for n in 0..count {
        let d = usize::from(inp.u8() % 5);
        let kind = match inp.u8() % 12 {
            0..=3 => Kind::Pem,
            4 => Kind::Junk,
            5 => Kind::Empty,
            6 => Kind::TooLarge,
            7 => Kind::ExactlyMax,
            8 => Kind::SymlinkOut,
            9 => Kind::SymlinkIn,
            10 => Kind::Dir,
            _ => Kind::Socket,
        };
        let sel = inp.u8();
        let mut name: Vec<u8> = if sel.is_multiple_of(4) {
            let len = 1 + usize::from(inp.u8() % 24);
            inp.bytes(len)
                .iter()
                .map(|&b| if b == 0 || b == b'/' { b'_' } else { b })
                .collect()
        } else {
            NAME_POOL[usize::from(sel / 4) % NAME_POOL.len()].to_vec()
        };
        if name.is_empty() || name == b"." || name == b".." {
            name = b"x".to_vec();
        }
        let dir = if d == 4 {
            pki.clone()
        } else if present[d] {
            pki.join(keycache::tree::TreeDir::NAMES[d])
        } else {
            continue;
        };
        let path = dir.join(std::ffi::OsStr::from_bytes(&name));
        if std::fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        let content = match kind {
            Kind::Pem => format!(
                "-----BEGIN PUBLIC KEY-----\nkey{n}-{}\n-----END PUBLIC KEY-----\n",
                inp.u8()
            )
            .into_bytes(),
            Kind::Junk => {
                let l = usize::from(inp.u8());
                inp.bytes(l).to_vec()
            }
            Kind::ExactlyMax => big_pem(migrate::MAX_KEY_BYTES),
            Kind::TooLarge => big_pem(migrate::MAX_KEY_BYTES + 1),
            _ => Vec::new(),
        };
        match kind {
            Kind::SymlinkOut => {
                std::os::unix::fs::symlink(outside.join("secret"), &path).expect("symlink")
            }
            Kind::SymlinkIn => {
                let target = entries
                    .first()
                    .map(|e| e.1.clone())
                    .unwrap_or_else(|| b"dangling".to_vec());
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &path)
                    .expect("symlink")
            }
            Kind::Dir => std::fs::create_dir(&path).expect("mkdir"),
            Kind::Socket => drop(std::os::unix::net::UnixListener::bind(&path).expect("bind")),
            _ => std::fs::write(&path, &content).expect("write"),
        }
        entries.push((d, name, kind, content));
    }
    // An existing store at the target.
    let mut existing_keys: Vec<(String, KeyState, Vec<u8>)> = Vec::new();
    let mut existing_denied: Vec<(String, Vec<u8>)> = Vec::new();
    if existing {
        std::fs::create_dir_all(&out).expect("mkdir");
        let s = Store::open_with(&out, &opts(params)).expect("open");
        let n = usize::from(inp.u8() % 6);
        for (j, raw) in NAME_POOL.iter().enumerate().take(n) {
            let id = String::from_utf8_lossy(raw).into_owned();
            if MinionId::new(id.as_str()).is_err() || id.len() > TREE_ID_SIZE {
                continue;
            }
            let pem = format!("-----BEGIN PUBLIC KEY-----\nold{j}\n-----END PUBLIC KEY-----\n")
                .into_bytes();
            let mid = MinionId::new(id.as_str()).expect("valid");
            if j % 3 == 2 {
                s.deny(&mid, &pem).expect("deny");
                existing_denied.push((id, pem));
            } else {
                let st = state_of(j as u8);
                s.put(&mid, st, &pem).expect("put");
                existing_keys.push((id, st, pem));
            }
        }
    }

    // The model.
    let mut want_found = [0u64; 4];
    let mut want_skips: BTreeMap<PathBuf, SkipReason> = BTreeMap::new();
    let mut too_long = false;
    let mut tree_keys: Vec<(String, KeyState, Vec<u8>)> = Vec::new();
    let mut tree_denied: Vec<(String, Vec<u8>)> = Vec::new();
    let mut order: Vec<(usize, Vec<u8>, Kind, Vec<u8>)> =
        entries.iter().filter(|e| e.0 < 4).cloned().collect();
    order.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    for (d, name, kind, content) in &order {
        let path = pki
            .join(keycache::tree::TreeDir::NAMES[*d])
            .join(std::ffi::OsStr::from_bytes(name));
        let skip = match (kind, std::str::from_utf8(name)) {
            (Kind::SymlinkOut | Kind::SymlinkIn, _) => Some(SkipReason::Symlink),
            (Kind::Dir | Kind::Socket, _) => Some(SkipReason::NotARegularFile),
            (_, Err(_)) => Some(SkipReason::NonUtf8Name),
            (_, Ok(n)) if n.starts_with('.') => Some(SkipReason::DotFile),
            (_, Ok(n)) if keycache::id::validate(n).is_err() => Some(SkipReason::InvalidId),
            (_, Ok(n)) if n.len() > TREE_ID_SIZE => {
                too_long |= !skip_long;
                Some(SkipReason::IdTooLong)
            }
            _ if content.len() > migrate::MAX_KEY_BYTES => Some(SkipReason::TooLarge),
            _ if content.is_empty() => Some(SkipReason::Empty),
            _ => key_file_skip(content),
        };
        match skip {
            Some(r) => {
                want_skips.insert(path, r);
            }
            None => {
                want_found[*d] += 1;
                let id = String::from_utf8_lossy(name).into_owned();
                if *d == 3 {
                    tree_denied.push((id, content.clone()));
                } else {
                    let st = KeyState::ALL[*d];
                    match tree_keys.iter_mut().find(|k| k.0 == id) {
                        Some(k) => *k = (id, st, content.clone()),
                        None => tree_keys.push((id, st, content.clone())),
                    }
                }
            }
        }
    }
    let mut final_keys: Vec<(String, KeyState, Vec<u8>)> = Vec::new();
    for (id, st, pem) in &existing_keys {
        match tree_keys.iter().find(|k| &k.0 == id) {
            Some(k) => final_keys.push(k.clone()),
            None if replace => {}
            None => final_keys.push((id.clone(), *st, pem.clone())),
        }
    }
    for k in &tree_keys {
        if !final_keys.iter().any(|f| f.0 == k.0) {
            final_keys.push(k.clone());
        }
    }
    let mut final_denied: Vec<(String, Vec<u8>)> = Vec::new();
    for (id, pem) in &existing_denied {
        match tree_denied.iter().find(|k| &k.0 == id) {
            Some(k) => final_denied.push(k.clone()),
            None if replace => {}
            None => final_denied.push((id.clone(), pem.clone())),
        }
    }
    for k in &tree_denied {
        if !final_denied.iter().any(|f| f.0 == k.0) {
            final_denied.push(k.clone());
        }
    }
    let max = (params.capacity() as f64 * migrate::MAX_LOAD_FACTOR) as u64;
    let overfull = final_keys.len() as u64 > max || final_denied.len() as u64 > max;

    let tree_before = snapshot(&pki);
    let outside_before = snapshot(&outside);
    let out_before = snapshot(&out);
    let mo = MigrateOptions {
        params,
        out: Some(out.clone()),
        dry_run,
        replace,
        // The model lets the tree win over the target's entries, stale or not.
        replace_states: true,
        skip_long_ids: skip_long,
        ownership: None,
        rebuild_settle: Duration::ZERO,
        made: Some(keycache_merge::history::begin_on_migration()),
    };
    let r = migrate::migrate(&pki, &mo, &|_, _| {});
    assert_eq!(snapshot(&pki), tree_before, "the tree changed");
    assert_eq!(snapshot(&outside), outside_before, "a file outside changed");
    let names: BTreeMap<_, _> = std::fs::read_dir(root)
        .expect("list")
        .flatten()
        .map(|e| (e.file_name(), ()))
        .collect();
    assert!(names.len() <= 3, "files beside the tree: {names:?}");
    let refused = symlinked_dir.is_some() || present.iter().all(|p| !p);
    let report = match r {
        Err(e) => {
            assert_eq!(snapshot(&out), out_before, "a refused migration wrote");
            match e {
                Error::PkiDir { .. } => assert!(refused, "refused: {e}"),
                Error::IdTooLong { .. } => assert!(!refused && too_long, "refused: {e}"),
                Error::Overfull { .. } => {
                    assert!(!refused && !too_long && overfull, "refused: {e}")
                }
                e => panic!("migration failed: {e}"),
            }
            return;
        }
        Ok(r) => r,
    };
    assert!(!refused && !too_long && !overfull, "not refused");
    let found = [
        report.found.accepted,
        report.found.pending,
        report.found.rejected,
        report.found.denied,
    ];
    assert_eq!(found, want_found, "found counts");
    let skips: BTreeMap<PathBuf, SkipReason> = report
        .skipped
        .iter()
        .map(|s| (PathBuf::from(&s.path), s.reason.clone()))
        .collect();
    let want_skips: BTreeMap<PathBuf, SkipReason> = want_skips
        .into_iter()
        .map(|(p, r)| (PathBuf::from(p.to_string_lossy().into_owned()), r))
        .collect();
    assert_eq!(skips, want_skips, "skips");
    if dry_run {
        assert_eq!(snapshot(&out), out_before, "a dry run wrote");
        return;
    }
    let s = Store::open_with(&out, &opts(params)).expect("open the result");
    let (keys, denied) = banks_of(&s);
    assert_eq!(keys, final_keys, "keys bank");
    assert_eq!(denied, final_denied, "denied bank");
    let f = verify::verify_store(&s).expect("verify");
    assert!(f.is_empty(), "verify: {f:?}");
    // The target is not the tree migrated: the migrated store's key tree
    // is written beside the banks (Salt's validate_token reads it there),
    // equal to the store.
    assert_eq!(
        keycache::tree::check(&s).expect("check the key tree"),
        Vec::new(),
        "the key tree differs from the store"
    );
    for e in std::fs::read_dir(&out).expect("list").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if keycache::tree::TreeDir::NAMES.contains(&name.as_str()) {
            assert!(e.file_type().expect("stat").is_dir(), "{name}");
            continue;
        }
        // The banks, and keycache's own files: the history a migration
        // begins, the key tree's intent record.
        use keycache::format::{HISTORY_FILE, IDENTITY_FILE, REMOVALS_FILE, TREE_INTENT_FILE};
        assert!(
            name.starts_with(".mmap_keys.idx")
                || name.starts_with(".mmap_denied.idx")
                || [HISTORY_FILE, IDENTITY_FILE, REMOVALS_FILE, TREE_INTENT_FILE]
                    .contains(&name.as_str()),
            "unexpected file {name} in the target"
        );
        let m = std::fs::symlink_metadata(e.path()).expect("stat");
        assert!(m.is_file(), "{name} is not a regular file");
        assert_eq!(m.mode() & 0o777, 0o600, "{name} mode");
    }
    let secret_read = |v: &[u8]| v.windows(14).any(|w| w == b"OUTSIDE-SECRET");
    assert!(
        keys.iter().all(|k| !secret_read(&k.2)) && denied.iter().all(|k| !secret_read(&k.1)),
        "a key was read through a symlink"
    );
}
