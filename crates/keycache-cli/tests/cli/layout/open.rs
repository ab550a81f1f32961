//! The layout at open and at the first write:
//!
//! - opening a store to read it with a layout the files do not fit (a wrong
//!   id size) is refused, naming the file and the layout the files look
//!   like, instead of reading every bank as empty;
//! - a segment cap lowered below the size of the active heap segment is not
//!   a misfit: writes roll to a new segment, as Salt's writer does, and Salt
//!   reads what they wrote (with either cap).

use crate::common;

use std::path::Path;

use crate::common::{keycache, ok, pem, salt, small, Params, ParamsExt};
use keycache::{Error, KeyState, MinionId, Store};

/// A new temporary directory with a store of layout `small(1009, 1 MiB)`
/// (returned too) that [`put_many`] wrote, closed again.
fn written(prefix: &str, n: usize, state: KeyState) -> (tempfile::TempDir, Params) {
    let t = tempfile::tempdir().unwrap();
    let p = small(1009, 1 << 20);
    let store = Store::open_with(t.path(), &p.options()).unwrap();
    put_many(&store, prefix, n, state);
    (t, p)
}

fn put_many(store: &Store, prefix: &str, n: usize, state: KeyState) {
    store
        .batch(|b| {
            for i in 0..n {
                let id = MinionId::new(format!("{prefix}{i:02}.example.com"))?;
                b.put(&id, state, pem(&format!("{prefix}{i}"), 400).as_bytes())?;
            }
            Ok(())
        })
        .unwrap();
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn opening_with_a_wrong_id_size_is_refused_naming_the_layout_of_the_files() {
    let (t, right) = written("m", 12, KeyState::Accepted);
    let dir = t.path();
    let before = files(dir);
    for id_size in [32usize, 48, 70] {
        let wrong = Params { id_size, ..right };
        match Store::open_with(dir, &wrong.options()) {
            Err(Error::LayoutMismatch {
                path, looks_like, ..
            }) => {
                assert_eq!(path, dir.join(".mmap_keys.idx"));
                assert!(
                    looks_like.contains("mmap_key_id_size 64"),
                    "id size {id_size}: {looks_like}"
                );
            }
            Err(e) => panic!("id size {id_size}: another error: {e}"),
            Ok(s) => panic!(
                "id size {id_size}: opened, and reads {} keys",
                s.keys(None).unwrap().count()
            ),
        }
    }
    assert_eq!(files(dir), before, "a refused open wrote something");
    // The right layout opens; damage is not a misfit (verify still opens).
    let s = Store::open_with(dir, &right.options()).unwrap();
    assert_eq!(s.keys(None).unwrap().count(), 12);
}

#[test]
fn a_lowered_segment_cap_rolls_to_a_new_segment_and_salt_reads_it() {
    let (t, big) = written("old", 10, KeyState::Accepted);
    let dir = t.path();
    let heap = dir.join(".mmap_keys.idx.heap");
    let heap_len = std::fs::metadata(&heap).unwrap().len();
    assert!(heap_len > 4096, "{heap_len}");

    let small = small(1009, 2048);
    let store = Store::open_with(dir, &small.options()).unwrap();
    put_many(&store, "new", 6, KeyState::Pending);
    store
        .set_state(
            &MinionId::new("old03.example.com").unwrap(),
            KeyState::Rejected,
        )
        .unwrap();
    store
        .deny(
            &MinionId::new("new01.example.com").unwrap(),
            pem("denied", 300).as_bytes(),
        )
        .unwrap();
    // The CLI writes with the lowered cap too.
    let mut args = vec!["accept", dir.to_str().unwrap(), "new02.example.com"];
    let flags = small.args();
    args.extend(flags.iter().map(String::as_str));
    ok(&keycache(&args));
    assert_eq!(
        std::fs::metadata(&heap).unwrap().len(),
        heap_len,
        "the old segment is not written past its cap"
    );
    let seg1 = dir.join(".mmap_keys.idx.heap.1");
    assert!(seg1.is_file(), "a new segment");
    for n in 1..100 {
        let p = dir.join(format!(".mmap_keys.idx.heap.{n}"));
        if let Ok(m) = std::fs::metadata(&p) {
            assert!(m.len() <= 2048, "{}: {} bytes", p.display(), m.len());
        }
    }
    let ours = common::kc_dump(dir, &small);
    assert_eq!(ours["keys"].as_object().unwrap().len(), 16);
    assert_eq!(ours["keys"]["old03.example.com"]["state"], "rejected");
    assert_eq!(ours["keys"]["new02.example.com"]["state"], "accepted");
    for layout in [small, big] {
        let theirs = salt(dir, &layout, &["dump"], None);
        assert_eq!(
            theirs["keys"], ours["keys"],
            "Salt with cap {}",
            layout.max_segment_bytes
        );
        assert_eq!(theirs["denied_keys"], ours["denied_keys"]);
    }
    // A store made without a key tree: the tree is left out of the check.
    ok(&keycache(&[
        "verify",
        dir.to_str().unwrap(),
        "--size",
        "1009",
        "--tree",
        "never",
    ]));
}
