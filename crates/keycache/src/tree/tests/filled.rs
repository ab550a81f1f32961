//! A state directory filled whole and renamed into place: what a reader
//! sees, a directory made meanwhile, one left by a kill.

use super::*;

/// A pid no process has: one of a child that ran and was reaped.
fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// `n` ids, `m00`, `m01`, ...
fn many_ids(n: usize) -> Result<Vec<MinionId>> {
    (0..n).map(|i| MinionId::new(format!("m{i:02}"))).collect()
}

/// What the tree must hold for `ids`, each in `state` with its own key.
fn wants_in(ids: &[MinionId], state: KeyState) -> Vec<(MinionId, Want)> {
    ids.iter()
        .map(|id| {
            (
                id.clone(),
                sync::want_of(Some((state, pem(id.as_str()))), None),
            )
        })
        .collect()
}

/// The names of `dir`'s tree temporaries (files and directories).
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(TEMP_PREFIX))
        .collect()
}

/// A batch that writes many files into a state directory absent when it
/// began fills it under a temporary name and renames it into place; one
/// killed before the rename leaves that directory, which the next writer
/// removes as it finishes the killed writer's tree, and which `check`
/// reports and `mend` removes.
#[test]
fn a_state_directory_filled_whole_and_one_left_by_a_kill() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    let ids = many_ids(40)?;
    st.batch(|b| {
        for id in &ids {
            b.put(id, KeyState::Accepted, &pem(id.as_str()))?;
        }
        Ok(())
    })?;
    assert_eq!(files(t.path()).len(), 40);
    assert_eq!(
        std::fs::read(t.path().join("minions/m07")).unwrap(),
        pem("m07")
    );
    let left = temporaries(t.path());
    assert_eq!(left, Vec::<String>::new());
    assert_eq!(check(&st)?, vec![]);

    // The kill: a rejection of them all planned, the banks written, the
    // directory being filled left half full.
    let wants = wants_in(&ids, KeyState::Rejected);
    let mut s = sync::Sync::plan(&st, &wants)?;
    s.before()?;
    for id in &ids {
        st.keys_table().put(
            id.as_str().as_bytes(),
            &crate::key::encode_key_value(KeyState::Rejected, &pem(id.as_str())),
        )?;
    }
    drop(s);
    let filled = t
        .path()
        .join(dir::filled_name(dead_pid(), "minions_rejected"));
    std::fs::create_dir(&filled).unwrap();
    std::fs::write(filled.join("m00"), pem("m00")).unwrap();
    std::fs::write(filled.join("m01"), b"-----BEGIN PUB").unwrap();
    let found = check(&st)?;
    assert!(
        found
            .iter()
            .any(|x| x.problem == TreeProblem::TempFile && x.path == filled),
        "{found:?}"
    );
    // The next writer finishes the tree and removes the directory.
    let next = store(t.path());
    next.put(&MinionId::new("e")?, KeyState::Pending, &pem("e"))?;
    let done = next.take_resumed();
    assert_eq!(done.len(), 1);
    assert!(done[0].changes.removed.contains(&filled), "{:?}", done[0]);
    assert!(!filled.exists());
    let now = files(t.path());
    assert_eq!(now.len(), 41);
    assert_eq!(now[0], "minions_pre/e");
    assert!(now[1..].iter().all(|f| f.starts_with("minions_rejected/")));
    assert_eq!(check(&st)?, vec![]);

    // One left where no write is to be finished: mend removes it.
    let filled = t.path().join(dir::filled_name(dead_pid(), "minions_pre"));
    std::fs::create_dir(&filled).unwrap();
    std::fs::write(filled.join("m00"), pem("m00")).unwrap();
    let r = mend(&st)?;
    assert_eq!(r.removed, std::slice::from_ref(&filled));
    assert!(!filled.exists());
    assert_eq!(check(&st)?, vec![]);
    Ok(())
}

/// Salt, reading `minions/` while a large batch fills it, finds no
/// directory or every file: never some of them.
#[test]
fn a_directory_filled_whole_appears_with_every_file() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    let ids = many_ids(800)?;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (dir, done) = (t.path().join("minions"), done.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            // Bounded: until the batch is done, at most a minute.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while std::time::Instant::now() < deadline {
                let last = done.load(std::sync::atomic::Ordering::SeqCst);
                if let Ok(rd) = std::fs::read_dir(&dir) {
                    seen.push(rd.count());
                }
                if last {
                    break;
                }
            }
            seen
        })
    };
    st.batch(|b| {
        for id in &ids {
            b.put(id, KeyState::Accepted, &pem(id.as_str()))?;
        }
        Ok(())
    })?;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = watcher.join().unwrap();
    assert!(!seen.is_empty(), "the directory was never seen");
    assert!(
        seen.iter().all(|n| *n == 800),
        "listings of minions/ while it was written: {:?}",
        seen.iter()
            .filter(|n| **n != 800)
            .take(5)
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// A state directory made by someone else (Salt's `verify_env`) after
/// the batch was planned and before its files are written: the files are
/// moved into it, one the batch replaces is replaced, another is kept;
/// and one planted as a symlink is refused, followed nowhere, and the
/// directory filled is removed.
#[test]
fn a_directory_made_meanwhile_gets_the_files_and_a_symlink_is_refused() -> Result<()> {
    let t = tempfile::tempdir().unwrap();
    let st = store(t.path());
    let ids = many_ids(20)?;
    let wants = wants_in(&ids, KeyState::Accepted);
    let mut s = sync::Sync::plan(&st, &wants)?;
    s.before()?;
    let minions = t.path().join("minions");
    std::fs::create_dir(&minions).unwrap();
    std::fs::write(minions.join("m03"), b"another key").unwrap();
    std::fs::write(minions.join("zz"), pem("zz")).unwrap();
    let ch = s.after(&wants)?;
    assert_eq!(ch.written.len(), 20);
    assert!(ch.written.contains(&minions.join("m03")));
    let names = temporaries(t.path());
    assert_eq!(names, Vec::<String>::new());
    let mut got: Vec<String> = std::fs::read_dir(&minions)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    got.sort();
    assert_eq!(got.len(), 21);
    assert_eq!(std::fs::read(minions.join("m03")).unwrap(), pem("m03"));
    assert_eq!(std::fs::read(minions.join("zz")).unwrap(), pem("zz"));

    // A symlink planted as minions_rejected/ between the plan and the
    // writes.
    let elsewhere = tempfile::tempdir().unwrap();
    let wants = wants_in(&ids, KeyState::Rejected);
    let mut s = sync::Sync::plan(&st, &wants)?;
    s.before()?;
    std::os::unix::fs::symlink(elsewhere.path(), t.path().join("minions_rejected")).unwrap();
    let e = s.after(&wants).unwrap_err();
    assert!(matches!(e, Error::NotARegularFile { .. }), "{e}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    let names = temporaries(t.path());
    assert_eq!(names, Vec::<String>::new());
    Ok(())
}
