//! Property: for any layout flags given to any writing command on any store,
//! either the command refuses and the store's files are byte-identical to
//! before, or every entry that Salt 3008.5 read before is still there (with
//! its public key; deleted ids aside) and Salt reads the store after.
//!
//! Random cases from a seeded generator (`KEYCACHE_LAYOUT_CASES`, default
//! 100): two stores of different layouts, flags that are right, wrong or left
//! out for the table size, slot size, id size and segment cap, and the
//! writing commands (compact, compact --to-size, verify --repair, accept,
//! reject, delete, migrate into the store).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{check_ok, env_u64, keycache, repo, salt_dump_many, Params, ParamsExt};
use keycache_testkit::rng::Rng;
use serde_json::Value;

/// The stores' true layouts.
fn layouts() -> [Params; 2] {
    [
        Params {
            size: 509,
            slot_size: 96,
            id_size: 64,
            max_segment_bytes: 4096,
        },
        Params {
            size: 307,
            slot_size: 112,
            id_size: 80,
            max_segment_bytes: 65536,
        },
    ]
}

/// Every file of a directory, with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            // The key tree a migration with --out writes beside the banks.
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Params flags: each of the four right, wrong, or left out.
fn flags(rng: &mut Rng, truth: &Params) -> Vec<String> {
    let mut f = Vec::new();
    let mut push = |name: &str, v: String| {
        f.push(format!("--{name}"));
        f.push(v);
    };
    match rng.below(4) {
        0 => {}
        1 => push("size", truth.size.to_string()),
        2 => push("size", rng.pick(&[251u64, 307, 509, 1009]).to_string()),
        _ => push(
            "size",
            (truth.size * truth.slot_size as u64 / 128).to_string(),
        ),
    }
    match rng.below(3) {
        0 => push("slot-size", truth.slot_size.to_string()),
        1 => push("slot-size", rng.pick(&[96usize, 104, 112, 128]).to_string()),
        _ => {}
    }
    match rng.below(3) {
        0 => push("id-size", truth.id_size.to_string()),
        1 => push("id-size", rng.pick(&[32usize, 48, 64, 70, 80]).to_string()),
        _ => {}
    }
    match rng.below(3) {
        0 => push("max-segment-bytes", truth.max_segment_bytes.to_string()),
        1 => push(
            "max-segment-bytes",
            rng.pick(&[1024u64, 4096, 65536, 1 << 30]).to_string(),
        ),
        _ => {}
    }
    f
}

/// Ids and public keys Salt lists in both banks.
fn salt_view(dump: &Value) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for bank in ["keys", "denied_keys"] {
        let Some(m) = dump[bank].as_object() else {
            continue;
        };
        for (id, v) in m {
            let key = match bank {
                "keys" => v["pub"].as_str().unwrap_or_default().to_owned(),
                _ => v.to_string(),
            };
            out.insert((bank.to_owned(), id.clone()), key);
        }
    }
    out
}

#[test]
fn wrong_layout_flags_never_cost_an_entry() {
    let cases = env_u64("KEYCACHE_LAYOUT_CASES", 100) as usize;
    let t = tempfile::tempdir().unwrap();
    let sample = repo().join("tools/sample-pki");
    let mut bases = Vec::new();
    for (i, l) in layouts().iter().enumerate() {
        let base = t.path().join(format!("base{i}"));
        let mut args = vec!["migrate".to_string(), sample.display().to_string()];
        args.extend(["--out".into(), base.display().to_string()]);
        args.extend(l.args());
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = keycache(&a);
        check_ok("migrate", &o);
        let before = salt_view(&salt_dump_many(std::slice::from_ref(&base), l)[0].0);
        assert!(
            before.len() > 20,
            "the sample store holds {} entries",
            before.len()
        );
        bases.push((base, *l, before));
    }
    let some_id = |view: &BTreeMap<(String, String), String>, rng: &mut Rng| -> String {
        let ids: Vec<&String> = view
            .keys()
            .filter(|(b, _)| b == "keys")
            .map(|(_, id)| id)
            .collect();
        (*rng.pick(&ids)).clone()
    };

    let mut rng = Rng::new(0x1a70_0f1a);
    // (base, store, layout after, deleted id, what ran)
    let mut ran: Vec<(usize, PathBuf, Params, Option<String>, String)> = Vec::new();
    let (mut refused, mut done) = (0, 0);
    for case in 0..cases {
        let b = rng.below(2) as usize;
        let (base, truth, before) = &bases[b];
        let dir = t.path().join(format!("case{case}"));
        copy_dir(base, &dir);
        let d = dir.display().to_string();
        let id = some_id(before, &mut rng);
        let (mut args, deleted): (Vec<String>, Option<String>) = match rng.below(7) {
            0 => (vec!["compact".into(), d.clone()], None),
            1 => (
                vec![
                    "compact".into(),
                    d.clone(),
                    "--to-size".into(),
                    "1009".into(),
                ],
                None,
            ),
            2 => (vec!["verify".into(), d.clone(), "--repair".into()], None),
            3 => (vec!["accept".into(), d.clone(), "--all".into()], None),
            4 => (vec!["reject".into(), d.clone(), id.clone()], None),
            5 => (
                vec!["delete".into(), d.clone(), id.clone(), "-y".into()],
                Some(id.clone()),
            ),
            _ => (
                vec![
                    "migrate".into(),
                    sample.display().to_string(),
                    "--out".into(),
                    d.clone(),
                ],
                None,
            ),
        };
        args.extend(flags(&mut rng, truth));
        let files_before = files(&dir);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = keycache(&a);
        let what = format!(
            "case {case}: keycache {} -> {:?}: {}",
            args.join(" "),
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
        // verify --repair exits 1 when it found (and mended) something.
        let ok = o.status.success() || (args[0] == "verify" && o.status.code() == Some(1));
        if ok {
            done += 1;
            let after = match args.iter().position(|a| a == "--to-size") {
                Some(i) => Params {
                    size: args[i + 1].parse().unwrap(),
                    ..*truth
                },
                None => *truth,
            };
            ran.push((b, dir, after, deleted, what));
        } else {
            refused += 1;
            assert!(
                files(&dir) == files_before,
                "{what}: refused, yet the files changed"
            );
        }
    }
    // Salt's view of every store a command changed, one process per layout.
    for (b, (_, _, before)) in bases.iter().enumerate() {
        for size in [None, Some(1009)] {
            let group: Vec<_> = ran
                .iter()
                .filter(|r| r.0 == b && (size.is_none() != (r.2.size == 1009)))
                .collect();
            let Some(first) = group.first() else {
                continue;
            };
            let dirs: Vec<PathBuf> = group.iter().map(|r| r.1.clone()).collect();
            let dumps = salt_dump_many(&dirs, &first.2);
            for ((_, _, _, deleted, what), (dump, _)) in group.into_iter().zip(dumps) {
                assert!(
                    dump.get("error").is_none(),
                    "{what}: Salt cannot read the store: {dump}"
                );
                let after = salt_view(&dump);
                for ((bank, id), key) in before {
                    if Some(id) == deleted.as_ref() {
                        continue;
                    }
                    assert_eq!(
                        after.get(&(bank.clone(), id.clone())),
                        Some(key),
                        "{what}: {bank} {id} was lost or changed"
                    );
                }
            }
        }
    }
    eprintln!(
        "layout flags: {cases} cases, {refused} refused unchanged, {done} ran and kept every entry"
    );
    assert!(
        refused > 0 && done > 0,
        "the cases must include refusals and runs"
    );
}
