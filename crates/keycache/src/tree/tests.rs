//! Unit tests of the key tree.

use super::*;
use crate::test_util::{pem, small_store};
use crate::Store;
use crate::{OpenOptions, Params};
use std::os::unix::fs::PermissionsExt;

mod filled;

fn store(dir: &Path) -> Store {
    small_store(dir).with_tree(TreeSync::On)
}

fn files(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for d in TreeDir::NAMES {
        if let Ok(rd) = std::fs::read_dir(dir.join(d)) {
            for e in rd {
                v.push(format!("{d}/{}", e.unwrap().file_name().to_string_lossy()));
            }
        }
    }
    v.sort();
    v
}

#[test]
fn the_library_writes_keep_the_tree_in_step() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    assert_eq!(TreeSync::auto(t.path()), TreeSync::Off);
    let (a, b) = (MinionId::new("a")?, MinionId::new("b")?);
    st.put(&a, KeyState::Pending, &pem("a"))?;
    assert_eq!(files(t.path()), ["minions_pre/a"]);
    assert_eq!(TreeSync::auto(t.path()), TreeSync::Off);
    st.set_state(&a, KeyState::Accepted)?;
    assert_eq!(files(t.path()), ["minions/a"]);
    assert_eq!(TreeSync::auto(t.path()), TreeSync::On);
    let m = std::fs::metadata(t.path().join("minions/a")).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    let m = std::fs::metadata(t.path().join("minions")).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o755);
    // Re-keyed while accepted: the file follows.
    st.put(&a, KeyState::Accepted, &pem("a2"))?;
    assert_eq!(
        std::fs::read(t.path().join("minions/a")).unwrap(),
        pem("a2")
    );
    st.deny(&b, &pem("b"))?;
    st.put(&b, KeyState::Rejected, &pem("b1"))?;
    assert_eq!(
        files(t.path()),
        ["minions/a", "minions_denied/b", "minions_rejected/b"]
    );
    assert!(st.remove_denied(&b)?);
    assert!(st.remove(&a)?);
    assert!(!st.remove(&a)?);
    assert_eq!(files(t.path()), ["minions_rejected/b"]);
    let (_, _, ch) = st.batch_with_tree(|x| x.set_state(&b, KeyState::Accepted))?;
    assert_eq!(ch.written, [t.path().join("minions/b")]);
    assert_eq!(ch.removed, [t.path().join("minions_rejected/b")]);
    assert_eq!(check(&st)?, vec![]);
    // Off: the banks only.
    let st = store(t.path()).with_tree(TreeSync::Off);
    st.remove(&b)?;
    assert_eq!(files(t.path()), ["minions/b"]);
    let found = check(&st)?;
    assert_eq!(found.len(), 1);
    assert!(found[0].grants_access());
    let r = mend(&st)?;
    assert_eq!(r.removed, [t.path().join("minions/b")]);
    assert_eq!(files(t.path()), Vec::<String>::new());
    Ok(())
}

#[test]
fn a_table_full_batch_leaves_banks_and_tree_alone() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let opts = OpenOptions {
        params: Params {
            size: 4,
            ..Params::default()
        },
        ..OpenOptions::default()
    };
    let st = Store::open_with(t.path(), &opts)?.with_tree(TreeSync::On);
    let a = MinionId::new("a")?;
    st.put(&a, KeyState::Accepted, &pem("a"))?;
    let r = st.batch(|x| {
        x.remove(&a)?;
        for i in 0..10 {
            x.put(
                &MinionId::new(format!("n{i}"))?,
                KeyState::Pending,
                &pem("n"),
            )?;
        }
        Ok(())
    });
    assert!(matches!(r, Err(Error::TableFull { .. })), "{r:?}");
    assert_eq!(files(t.path()), ["minions/a"]);
    assert_eq!(check(&st)?, vec![]);
    Ok(())
}

#[test]
fn dot_ids_are_keys_but_salts_cache_and_keycaches_files_are_not() {
    for key in [
        ".m",
        "..m",
        "...",
        ".hidden-minion",
        "m",
        ".keycache",
        "key_cache",
    ] {
        assert!(is_key_name(key), "{key:?}");
    }
    for not in [
        ".key_cache",
        ".keycache-tree.1.m",
        ".keycache-export.1.m",
        ".keycache-x",
        ".",
        "..",
        "",
        "a/b",
        "a\\b",
    ] {
        assert!(!is_key_name(not), "{not:?}");
    }
}

/// A `minions/` file holding an old key goes before anything is written:
/// a mend that fails on the way (here a directory where the pending file's
/// temporary goes) leaves no file through which the old key validates.
#[test]
fn mend_removes_an_old_accepted_key_before_it_writes() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    let (web, new) = (MinionId::new("web")?, MinionId::new("new")?);
    st.put(&web, KeyState::Accepted, &pem("k2"))?;
    st.put(&new, KeyState::Pending, &pem("p"))?;
    // Behind the tree's back: the old key in minions/, the pending file gone.
    std::fs::write(t.path().join("minions/web"), pem("k1")).unwrap();
    std::fs::remove_file(t.path().join("minions_pre/new")).unwrap();
    let blocker = t
        .path()
        .join("minions_pre")
        .join(format!("{TEMP_PREFIX}{}.new", std::process::id()));
    std::fs::create_dir(&blocker).unwrap();
    assert!(mend(&st).is_err(), "the pending file's write fails");
    assert!(
        !t.path().join("minions/web").exists(),
        "the old key is gone even though the mend failed"
    );
    std::fs::remove_dir(&blocker).unwrap();
    let r = mend(&st)?;
    assert!(r.removed.is_empty(), "{r:?}");
    assert_eq!(
        std::fs::read(t.path().join("minions/web")).unwrap(),
        pem("k2")
    );
    assert_eq!(
        std::fs::read(t.path().join("minions_pre/new")).unwrap(),
        pem("p")
    );
    assert_eq!(check(&st)?, vec![]);
    Ok(())
}

#[test]
fn check_and_mend_treat_a_dot_id_as_an_id() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    let m = MinionId::new(".m")?;
    st.put(&m, KeyState::Accepted, &pem("m"))?;
    assert_eq!(files(t.path()), ["minions/.m"]);
    std::fs::write(t.path().join("minions/.key_cache"), b"salt's cache").unwrap();
    std::fs::write(t.path().join("minions/.keycache-export.1.x"), b"x").unwrap();
    assert_eq!(check(&st)?, vec![], "an accepted dot-id is not missing");
    // Deleted behind the tree's back: its file is a stray that lets it in.
    store(t.path()).with_tree(TreeSync::Off).remove(&m)?;
    let found = check(&st)?;
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        (found[0].problem, found[0].id.as_deref()),
        (TreeProblem::Stray, Some(".m"))
    );
    assert!(found[0].grants_access());
    let r = mend(&st)?;
    assert_eq!(r.removed, [t.path().join("minions/.m")]);
    assert_eq!(check(&st)?, vec![]);
    assert_eq!(
        files(t.path()),
        ["minions/.key_cache", "minions/.keycache-export.1.x"]
    );
    Ok(())
}

#[test]
fn mend_refuses_a_directory_without_a_store_and_touches_nothing() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    for d in TreeDir::NAMES {
        std::fs::create_dir(t.path().join(d)).unwrap();
        std::fs::write(t.path().join(d).join("k"), pem("k")).unwrap();
    }
    let before = std::fs::read_dir(t.path()).unwrap().count();
    let st = store(t.path());
    assert_eq!(check(&st)?.len(), 4);
    let e = mend(&st).unwrap_err();
    assert!(matches!(e, Error::PkiDir { .. }), "{e}");
    assert!(
        no_store(&e) && e.to_string().contains("migrate the tree"),
        "{e}"
    );
    assert!(!e.to_string().contains("keycache migrate"), "{e}");
    assert_eq!(files(t.path()).len(), 4);
    assert_eq!(
        std::fs::read_dir(t.path()).unwrap().count(),
        before,
        "no lock file either"
    );
    // Once the store exists, mend follows it.
    store(t.path()).with_tree(TreeSync::Off).put(
        &MinionId::new("k")?,
        KeyState::Accepted,
        &pem("k"),
    )?;
    let r = mend(&st)?;
    assert_eq!(r.removed.len(), 3);
    assert_eq!(files(t.path()), ["minions/k"]);
    Ok(())
}

#[test]
fn refusals_of_the_tree_are_told_apart_and_name_no_cli_flag() {
    let p = Path::new("/pki/minions/m1");
    for kind in [
        NotRegular::Symlink,
        NotRegular::Directory,
        NotRegular::Other,
    ] {
        let e = Writer::Tree.not_a_key_file(p, kind);
        assert!(in_the_way(&e), "{e}");
        assert!(!e.to_string().contains("--"), "{e}");
        assert!(!in_the_way(&Writer::Export.not_a_key_file(p, kind)));
    }
    let io = |op| Error::io(p, op, std::io::Error::from_raw_os_error(libc::EIO));
    assert!(out_of_step(&io(AFTER_WRITE)) && out_of_step(&io(AFTER_REMOVE)));
    assert!(!out_of_step(&io("write")));
    assert!(!AFTER_WRITE.contains("keycache") && !AFTER_REMOVE.contains("--"));
}

#[test]
fn a_large_batch_is_written_whole_through_one_write_back() {
    // More files than SYNC_WHOLE in one group: made durable by syncfs, then
    // renamed; every file holds its key, no temporary is left.
    let t = tempfile::tempdir().expect("tempdir");
    let st = store(t.path());
    let ids: Vec<crate::MinionId> = (0..40)
        .map(|n| crate::MinionId::new(format!("m{n:02}")).expect("id"))
        .collect();
    st.batch(|b| {
        for (n, id) in ids.iter().enumerate() {
            let state = if n % 2 == 0 {
                KeyState::Accepted
            } else {
                KeyState::Pending
            };
            b.put(id, state, &pem(id.as_str()))?;
        }
        Ok(())
    })
    .expect("batch");
    assert_eq!(files(t.path()).len(), 40, "{:?}", files(t.path()));
    for (n, id) in ids.iter().enumerate() {
        let d = if n % 2 == 0 { "minions" } else { "minions_pre" };
        let got = std::fs::read(t.path().join(d).join(id.as_str())).expect("key file");
        assert_eq!(got, pem(id.as_str()));
    }
}

#[test]
fn an_accept_moves_the_pending_file_keycache_wrote_and_rewrites_one_it_did_not() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("dir");
    let s = store(dir.path()).with_tree(TreeSync::On);
    let (a, b) = (MinionId::new("a")?, MinionId::new("b")?);
    s.put(&a, KeyState::Pending, &pem("a"))?;
    s.put(&b, KeyState::Pending, &pem("b"))?;
    let pre = dir.path().join("minions_pre");
    let ino = std::fs::metadata(pre.join("a")).expect("a").ino();
    // b's pending file as Salt writes one: mode 0644.
    std::fs::set_permissions(pre.join("b"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    s.set_state(&a, KeyState::Accepted)?;
    s.set_state(&b, KeyState::Accepted)?;
    let acc = dir.path().join("minions");
    // a: the same file, renamed (what Salt's own accept does).
    assert_eq!(std::fs::metadata(acc.join("a")).expect("a").ino(), ino);
    // b: written anew, 0600, never the wider mode of a file keycache did not write.
    assert_eq!(
        std::fs::metadata(acc.join("b")).expect("b").mode() & 0o777,
        0o600
    );
    assert_eq!(std::fs::read(acc.join("b")).expect("b"), pem("b"));
    assert_eq!(files(dir.path()), ["minions/a", "minions/b"]);
    Ok(())
}

#[test]
fn an_accept_never_moves_a_pending_file_that_holds_another_key() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("dir");
    let s = store(dir.path()).with_tree(TreeSync::On);
    let ids: Vec<MinionId> = (0..20)
        .map(|i| MinionId::new(format!("m{i:02}")))
        .collect::<Result<_>>()?;
    // One batch of 20 (a write-back of the filesystem, not an fsync each)
    // and a single accept (an fsync of the moved file).
    for id in &ids {
        s.put(id, KeyState::Pending, &pem(id.as_str()))?;
    }
    let pre = dir.path().join("minions_pre");
    // m00's pending file now holds m01's key, of the same length: the
    // store says otherwise, so it is not the file to accept.
    std::fs::write(pre.join("m00"), pem("m01")).expect("m00");
    let ino = |p: &Path| std::fs::metadata(p).expect("file").ino();
    let (i00, i05) = (ino(&pre.join("m00")), ino(&pre.join("m05")));
    s.set_state(&ids[5], KeyState::Accepted)?;
    s.batch(|b| {
        for id in ids.iter().filter(|id| id.as_str() != "m05") {
            b.set_state(id, KeyState::Accepted)?;
        }
        Ok(())
    })?;
    let acc = dir.path().join("minions");
    assert_ne!(ino(&acc.join("m00")), i00, "m00 written anew");
    assert_eq!(std::fs::read(acc.join("m00")).expect("m00"), pem("m00"));
    assert_eq!(ino(&acc.join("m05")), i05, "m05 moved");
    for id in &ids {
        assert_eq!(
            std::fs::read(acc.join(id.as_str())).expect("key"),
            pem(id.as_str())
        );
        assert!(!pre.join(id.as_str()).exists(), "{id}");
    }
    Ok(())
}

/// The plan's look at the tree is reused after the banks are written,
/// except in `minions/`: a file planted there between the plan and the
/// write-back (by anyone but a keycache writer, which holds the `keys`
/// lock) for an id that is not accepted is still removed.
#[test]
fn a_minions_file_planted_after_the_plan_is_still_removed() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    let a = MinionId::new("a")?;
    st.put(&a, KeyState::Pending, &pem("a"))?;
    assert_eq!(files(t.path()), ["minions_pre/a"]);
    std::fs::create_dir(t.path().join("minions")).unwrap();
    let wants = vec![(
        a.clone(),
        sync::want_of(Some((KeyState::Rejected, pem("a"))), None),
    )];
    let mut s = sync::Sync::plan(&st, &wants)?;
    s.before()?;
    std::fs::write(t.path().join("minions/a"), pem("a")).unwrap();
    // The banks written as a batch writes them between the two halves.
    st.keys_table().put(
        b"a",
        &crate::key::encode_key_value(KeyState::Rejected, &pem("a")),
    )?;
    let ch = s.after(&wants)?;
    assert!(ch.removed.contains(&t.path().join("minions/a")));
    assert_eq!(files(t.path()), ["minions_rejected/a"]);
    Ok(())
}

/// [`TreeSync::Accepted`]: `minions/` is kept in step exactly as with the
/// whole tree (an accepted key gets its file, a rejected, re-keyed or
/// deleted one loses it), while the other state directories are neither
/// written nor removed from, nor compared or mended.
#[test]
fn the_accepted_tree_keeps_minions_alone_in_step() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = small_store(t.path()).with_tree(TreeSync::Accepted);
    assert!(st.tree().is_on());
    assert_eq!(st.tree().dirs(), &[TreeDir::Minions]);
    let (a, b, c) = (
        MinionId::new("a")?,
        MinionId::new("b")?,
        MinionId::new("c")?,
    );
    // A file the whole tree would remove, left from before (a localfs_key
    // tree migrated): never touched.
    std::fs::create_dir(t.path().join("minions_pre")).unwrap();
    std::fs::write(t.path().join("minions_pre/c"), pem("c-old")).unwrap();
    // A sign-in writes no file.
    st.put(&a, KeyState::Pending, &pem("a"))?;
    st.put(&b, KeyState::Pending, &pem("b"))?;
    st.put(&c, KeyState::Pending, &pem("c"))?;
    assert_eq!(files(t.path()), ["minions_pre/c"]);
    // An accept writes minions/<id> (the directory made as needed).
    let (_, _, ch) = st.batch_with_tree(|x| {
        x.set_state(&a, KeyState::Accepted)?;
        x.set_state(&b, KeyState::Accepted)?;
        x.set_state(&c, KeyState::Accepted)
    })?;
    assert_eq!(ch.removed, Vec::<PathBuf>::new());
    assert_eq!(
        files(t.path()),
        ["minions/a", "minions/b", "minions/c", "minions_pre/c"]
    );
    assert_eq!(std::fs::read(t.path().join("minions/c")).unwrap(), pem("c"));
    // Re-keyed, rejected, deleted, denied: each loses its minions/ file,
    // and no other file is written.
    st.put(&a, KeyState::Accepted, &pem("a2"))?;
    assert_eq!(
        std::fs::read(t.path().join("minions/a")).unwrap(),
        pem("a2")
    );
    st.set_state(&a, KeyState::Rejected)?;
    assert!(st.remove(&b)?);
    st.deny(&c, &pem("c"))?;
    st.remove(&c)?;
    assert_eq!(files(t.path()), ["minions_pre/c"]);
    assert_eq!(check(&st)?, vec![]);
    // A stray and a missing file in minions/ are found and mended; the
    // other directories are not looked at (the whole tree's check finds
    // a's missing rejected file and c's stray pending one).
    st.set_state(&a, KeyState::Accepted)?;
    std::fs::remove_file(t.path().join("minions/a")).unwrap();
    std::fs::write(t.path().join("minions/b"), pem("b")).unwrap();
    let found = check(&st)?;
    let probs: Vec<_> = found
        .iter()
        .map(|x| (x.dir, x.problem, x.id.clone()))
        .collect();
    assert_eq!(
        probs,
        [
            (TreeDir::Minions, TreeProblem::Stray, Some("b".to_owned())),
            (TreeDir::Minions, TreeProblem::Missing, Some("a".to_owned())),
        ]
    );
    assert!(found[0].grants_access());
    let whole = check(&small_store(t.path()).with_tree(TreeSync::On))?;
    assert!(
        whole.iter().any(|x| x.dir == TreeDir::MinionsPre),
        "{whole:?}"
    );
    let r = mend(&st)?;
    assert_eq!(r.removed, [t.path().join("minions/b")]);
    assert_eq!(r.written, [t.path().join("minions/a")]);
    assert_eq!(files(t.path()), ["minions/a", "minions_pre/c"]);
    assert_eq!(check(&st)?, vec![]);
    Ok(())
}

/// A writer killed after the banks were written and before its tree
/// writes: the next writer of the store, whatever its own tree setting,
/// brings the interrupted batch's ids (and only those) in step first, and
/// says so ([`Store::take_resumed`]); a `minions/<id>` removed by hand is
/// not written back.
#[test]
fn the_next_writer_finishes_a_killed_writers_tree() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    let ids: Vec<MinionId> = ["a", "b", "c", "d"]
        .iter()
        .map(|i| MinionId::new(*i))
        .collect::<Result<_>>()?;
    for id in &ids {
        st.put(id, KeyState::Pending, &pem(id.as_str()))?;
    }
    // c accepted, then its file removed by hand.
    st.set_state(&ids[2], KeyState::Accepted)?;
    std::fs::remove_file(t.path().join("minions/c")).unwrap();
    // An accept of a and b (and a rejection of d) killed after the banks.
    let wants: Vec<(MinionId, Want)> = [
        (0, KeyState::Accepted),
        (1, KeyState::Accepted),
        (3, KeyState::Rejected),
    ]
    .iter()
    .map(|&(i, s)| {
        (
            ids[i].clone(),
            sync::want_of(Some((s, pem(ids[i].as_str()))), None),
        )
    })
    .collect();
    let mut s = sync::Sync::plan(&st, &wants)?;
    s.before()?;
    for (i, state) in [
        (0, KeyState::Accepted),
        (1, KeyState::Accepted),
        (3, KeyState::Rejected),
    ] {
        st.keys_table().put(
            ids[i].as_str().as_bytes(),
            &crate::key::encode_key_value(state, &pem(ids[i].as_str())),
        )?;
    }
    drop(s);
    assert_eq!(
        files(t.path()),
        ["minions_pre/a", "minions_pre/b", "minions_pre/d"],
        "the kill's tree"
    );
    assert!(!IntentRecord::absent(t.path()));
    // The next writer: another handle, the tree off, writing another id.
    let next = small_store(t.path());
    next.put(&MinionId::new("e")?, KeyState::Pending, &pem("e"))?;
    assert_eq!(
        files(t.path()),
        ["minions/a", "minions/b", "minions_rejected/d"],
        "a and b accepted, d rejected; c's file not written back; e not written (tree off)"
    );
    assert_eq!(std::fs::read(t.path().join("minions/a")).unwrap(), pem("a"));
    let done = next.take_resumed();
    assert_eq!(done.len(), 1);
    let mut got = done[0].ids.clone();
    got.sort();
    assert_eq!(got, ["a", "b", "d"]);
    assert_eq!(done[0].changes.written.len(), 3);
    assert!(IntentRecord::absent(t.path()), "the record is cleared");
    assert!(next.take_resumed().is_empty());
    // Nothing left to finish: the next write finishes nothing.
    next.put(&MinionId::new("f")?, KeyState::Pending, &pem("f"))?;
    assert!(next.take_resumed().is_empty());
    Ok(())
}

/// The scope of the interrupted write is the record's: a killed writer
/// that kept `minions/` alone ([`TreeSync::Accepted`]) is finished in
/// `minions/` alone, by a writer with the whole tree on; and a record
/// whose own write was cut short (its checksum does not match: the banks
/// were not written after it) finishes nothing.
#[test]
fn a_resumed_tree_write_keeps_its_scope_and_a_torn_record_is_none() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let acc = small_store(t.path()).with_tree(TreeSync::Accepted);
    let a = MinionId::new("a")?;
    acc.put(&a, KeyState::Pending, &pem("a"))?;
    let wants = vec![(
        a.clone(),
        sync::want_of(Some((KeyState::Accepted, pem("a"))), None),
    )];
    let mut s = sync::Sync::plan(&acc, &wants)?;
    s.before()?;
    acc.keys_table().put(
        b"a",
        &crate::key::encode_key_value(KeyState::Accepted, &pem("a")),
    )?;
    drop(s);
    assert_eq!(files(t.path()), Vec::<String>::new());
    let rec = IntentRecord::read(t.path())?.expect("a record");
    assert_eq!(rec.dirs(), TreeSync::Accepted.dirs());
    // Torn: one byte of the ids changed.
    let p = t.path().join(INTENT_FILE);
    let mut b = std::fs::read(&p).unwrap();
    let last = b.len() - 2;
    b[last] ^= 1;
    std::fs::write(&p, &b).unwrap();
    assert_eq!(IntentRecord::read(t.path())?, None);
    assert_eq!(small_store(t.path()).resume_tree()?, None);
    b[last] ^= 1;
    std::fs::write(&p, &b).unwrap();
    let on = store(t.path());
    let done = on.resume_tree()?.expect("finished");
    assert_eq!(done.ids, ["a"]);
    assert_eq!(
        files(t.path()),
        ["minions/a"],
        "minions/ alone: the record's scope"
    );
    assert!(on.take_resumed().is_empty(), "said by resume_tree itself");
    Ok(())
}

/// Killed at the other boundary: after the early removals of a
/// revocation (`minions/<id>` gone, durably), before the banks: the store
/// still holds the key accepted (the revocation did not happen), and the
/// next writer writes the file back from the store, so the minion is not
/// locked out by a revocation that never was.
#[test]
fn a_writer_killed_before_its_banks_leaves_the_next_writer_the_old_files() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    let a = MinionId::new("a")?;
    st.put(&a, KeyState::Accepted, &pem("a"))?;
    assert_eq!(files(t.path()), ["minions/a"]);
    let wants = vec![(
        a.clone(),
        sync::want_of(Some((KeyState::Rejected, pem("a"))), None),
    )];
    let mut s = sync::Sync::plan(&st, &wants)?;
    s.before()?;
    drop(s);
    assert_eq!(
        files(t.path()),
        Vec::<String>::new(),
        "removed before the banks"
    );
    let next = small_store(t.path());
    let done = next.resume_tree()?.expect("finished");
    assert_eq!(done.ids, ["a"]);
    assert_eq!(files(t.path()), ["minions/a"]);
    assert_eq!(std::fs::read(t.path().join("minions/a")).unwrap(), pem("a"));
    Ok(())
}

#[test]
fn a_batch_large_enough_to_list_the_directories_still_sees_every_entry() -> Result<()> {
    // From LIST_FROM ids the plan reads each state directory instead of
    // looking up each id: what is there must still be found. A symlink
    // under one id's name refuses the batch before anything changes; a
    // `minions/` file of an id that leaves accepted is removed; a pending
    // file is moved on its accept.
    let t = tempfile::tempdir().unwrap();
    let mut opts = OpenOptions::default();
    opts.params.size = 4099;
    let st = Store::open_with(t.path(), &opts)?.with_tree(TreeSync::On);
    let ids: Vec<MinionId> = (0..super::sync::LIST_FROM + 10)
        .map(|n| MinionId::new(format!("m{n:05}")))
        .collect::<std::result::Result<_, _>>()?;
    let (old, pending) = (&ids[3], &ids[7]);
    st.put(old, KeyState::Accepted, &pem("old"))?;
    st.put(pending, KeyState::Pending, &pem(pending.as_str()))?;
    let all = |st: &Store| {
        st.batch(|b| {
            for id in &ids {
                b.put(id, KeyState::Accepted, &pem(id.as_str()))?;
            }
            b.set_state(old, KeyState::Rejected)?;
            Ok(())
        })
    };
    let link = t.path().join("minions_rejected").join(ids[500].as_str());
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let before = files(t.path());
    let e = all(&st).expect_err("a symlink under an id's name");
    assert!(matches!(e, Error::NotARegularFile { .. }), "{e}");
    assert_eq!(files(t.path()), before, "nothing changed");
    assert_eq!(st.get(&ids[0])?, None);
    std::fs::remove_file(&link).unwrap();
    all(&st)?;
    assert!(!t.path().join("minions").join(old.as_str()).exists());
    assert_eq!(
        std::fs::read(t.path().join("minions_rejected").join(old.as_str())).unwrap(),
        pem(old.as_str())
    );
    assert!(!t.path().join("minions_pre").join(pending.as_str()).exists());
    for id in ids.iter().filter(|i| *i != old) {
        let got = std::fs::read(t.path().join("minions").join(id.as_str())).unwrap();
        assert_eq!(got, pem(id.as_str()), "{id}");
    }
    assert!(check(&st)?.is_empty());
    Ok(())
}
