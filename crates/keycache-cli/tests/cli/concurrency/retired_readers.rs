//! A reader that still maps the files a rebuild replaced never answers from
//! them: a rebuild marks the index it replaces as retired before its
//! renames, and a reader that meets the mark moves to the new files (or
//! refuses, when they do not fit its layout) at its very next lookup, not a
//! refresh interval later.
//!
//! The readers here are library handles with a refresh interval of an hour,
//! so only the mark can move them; the rebuild and the removal that follows
//! it are `keycache compact` and `keycache delete`, other processes.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::common::{ok, pem, salt, small, Params, ParamsExt};
use keycache::table::RETIRED_MAGIC;
use keycache::{KeyBatch, KeyState, MinionId, OpenOptions, Store};

const VICTIM: &str = "victim.example.com";

fn layout(size: u64) -> Params {
    small(size, 1 << 20)
}

/// A reader's options: refreshes only every hour.
fn reader_opts(size: u64) -> OpenOptions {
    OpenOptions {
        refresh: Duration::from_secs(3600),
        ..layout(size).options()
    }
}

/// A store of 40 accepted keys, `VICTIM` among them.
fn populate(dir: &Path, size: u64) {
    let store = Store::open_with(dir, &layout(size).options()).unwrap();
    store
        .batch(|b| {
            for n in 0..39 {
                let id = MinionId::new(format!("m{n:02}.example.com"))?;
                b.put(
                    &id,
                    KeyState::Accepted,
                    pem(&format!("m{n}"), 400).as_bytes(),
                )?;
            }
            b.put(
                &MinionId::new(VICTIM)?,
                KeyState::Accepted,
                pem("victim", 400).as_bytes(),
            )
        })
        .unwrap();
}

/// Runs the CLI on `dir` with `size`'s layout and no settle wait.
fn cli(dir: &Path, size: u64, args: &[&str]) -> Output {
    common::kc()
        .arg(args[0])
        .arg(dir)
        .args(&args[1..])
        .layout(&layout(size))
        .no_settle()
        .output()
}

/// Every lookup form of `store` (and of a `Reader` made before the
/// rebuild) for `VICTIM`: `Ok(true)` found, `Ok(false)` absent, `Err` refused.
fn lookups(
    store: &Store,
    reader: &mut keycache::Reader<'_>,
) -> Vec<(&'static str, Result<bool, String>)> {
    let id = MinionId::new(VICTIM).unwrap();
    let mut buf = Vec::new();
    let mut batch = KeyBatch::new();
    let e = |e: keycache::Error| e.to_string();
    vec![
        ("get", store.get(&id).map(|v| v.is_some()).map_err(e)),
        (
            "get_in",
            store.get_in(&id, &mut buf).map(|v| v.is_some()).map_err(e),
        ),
        ("contains", store.contains(&id).map_err(e)),
        (
            "get_many_in",
            store
                .get_many_in(std::slice::from_ref(&id), &mut batch)
                .map(|()| batch.get(0).is_some())
                .map_err(e),
        ),
        (
            "reader.get",
            reader.get(&id).map(|v| v.is_some()).map_err(e),
        ),
        (
            "reader.get_in",
            reader.get_in(&id, &mut buf).map(|v| v.is_some()).map_err(e),
        ),
        (
            "keys()",
            store
                .keys(None)
                .map_err(e)
                .map(|it| it.flatten().any(|(i, _)| i == VICTIM)),
        ),
    ]
}

/// Every lookup form for `VICTIM` gives `want` (`when`: the moment, for the message).
fn assert_lookups(
    store: &Store,
    reader: &mut keycache::Reader<'_>,
    want: Result<bool, String>,
    when: &str,
) {
    for (form, got) in lookups(store, reader) {
        assert_eq!(got, want, "{form}: {when}");
    }
}

/// A new directory [`populate`]d at size 1009, and the store opened as a reader.
fn populated() -> (tempfile::TempDir, Store) {
    let t = tempfile::tempdir().unwrap();
    populate(t.path(), 1009);
    let store = Store::open_with(t.path(), &reader_opts(1009)).unwrap();
    (t, store)
}

/// A reader of `store` whose lookups found [`VICTIM`], before the
/// compaction the test makes next.
fn found_before(store: &Store) -> keycache::Reader<'_> {
    let mut reader = store.reader();
    assert_lookups(store, &mut reader, Ok(true), "before the compaction");
    reader
}

#[test]
fn a_compaction_then_a_delete_is_seen_by_the_next_lookup() {
    let (t, store) = populated();
    let mut reader = found_before(&store);
    let dir = t.path();
    ok(&cli(dir, 1009, &["compact"]));
    ok(&cli(dir, 1009, &["delete", VICTIM]));
    assert_lookups(
        &store,
        &mut reader,
        Ok(false),
        "the deleted key, after compact + delete",
    );
    // The other entries are read from the new files.
    let other = MinionId::new("m07.example.com").unwrap();
    assert_eq!(
        store.get(&other).unwrap().unwrap().state,
        KeyState::Accepted
    );
    assert_eq!(
        reader.get(&other).unwrap().unwrap().state,
        KeyState::Accepted
    );
}

#[test]
fn a_compaction_into_another_size_then_a_delete_is_refused_not_answered() {
    let (t, store) = populated();
    let mut reader = found_before(&store);
    let dir = t.path();
    ok(&cli(dir, 1009, &["compact", "--to-size", "2003"]));
    ok(&cli(dir, 2003, &["delete", VICTIM]));
    // The handle's layout no longer fits the files: every lookup refuses,
    // again and again, and none answers from the replaced files.
    for round in 0..3 {
        for (form, got) in lookups(&store, &mut reader) {
            match got {
                Err(msg) => assert!(msg.contains(".mmap_keys.idx"), "{form}: {msg}"),
                Ok(found) => panic!("round {round}: {form} answered {found} from replaced files"),
            }
        }
    }
    // A handle with the new size reads the store as it is.
    let again = Store::open_with(dir, &reader_opts(2003)).unwrap();
    assert!(again
        .get(&MinionId::new(VICTIM).unwrap())
        .unwrap()
        .is_none());
}

#[test]
fn a_marked_index_that_is_still_the_banks_is_read() {
    // Between a rebuild's mark and its renames (or after a rebuild killed
    // there, until its journal is finished), the marked index is still the
    // bank's: lookups answer from it, and Salt reads it.
    let (t, store) = populated();
    let dir = t.path();
    let index = dir.join(keycache::format::KEYS_INDEX);
    let mut reader = store.reader();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&index)
        .unwrap();
    assert_eq!(std::fs::read(&index).unwrap()[0], 0xAB);
    std::os::unix::fs::FileExt::write_all_at(&f, &[RETIRED_MAGIC], 0).unwrap();
    for _ in 0..3 {
        assert_lookups(
            &store,
            &mut reader,
            Ok(true),
            "on a marked index still in place",
        );
    }
    let salt_view = salt(dir, &layout(1009), &["dump"], None);
    assert_eq!(salt_view["keys"][VICTIM]["state"], "accepted");
    assert_eq!(salt_view["keys"].as_object().unwrap().len(), 40);
}

#[test]
fn a_journal_is_finished_by_a_user_who_may_not_write_the_old_index() {
    // Marking the old index must not add a way for a roll-forward to fail:
    // the Salt master's user finishes a journal whose old index it may read
    // but not write (it renames the new one over it).
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !keycache_testkit::skip::needs_root(
        "a_journal_is_finished_by_a_user_who_may_not_write_the_old_index",
    ) {
        return;
    }
    let t = keycache_testkit::scratch::public_dir();
    let bin = t.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let kc = common::cli().copied_to(&bin);
    let dir = t.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    populate(&dir, 1009);
    let index = dir.join(keycache::format::KEYS_INDEX);
    // The new index a killed rebuild left under its temporary name, and
    // its journal.
    let tmp = dir.join(".keycache-tmp..mmap_keys.idx.1.1");
    std::fs::copy(&index, &tmp).unwrap();
    std::fs::write(
        dir.join(keycache::rebuild::JOURNAL),
        format!(
            "lock\t.mmap_keys.idx.lock\nrename\t{}\t.mmap_keys.idx\nend\n",
            tmp.file_name().unwrap().to_string_lossy()
        ),
    )
    .unwrap();
    let (uid, gid) = (65534u32, 65534u32);
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        std::os::unix::fs::lchown(e.path(), Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // Root's, 0644 (as a Salt master run as root creates it under umask 022):
    // readable by the master's user, not writable.
    std::os::unix::fs::lchown(&index, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&index, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut c = kc.cmd();
    c.args(["list", dir.to_str().unwrap(), "--json"])
        .args(layout(1009).args())
        .uid(uid)
        .gid(gid);
    let out = c.output().unwrap();
    ok(&out);
    assert!(
        !dir.join(keycache::rebuild::JOURNAL).exists(),
        "the journal was finished"
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["minions"].as_array().unwrap().len(), 40);
}
