//! Unit tests of the key tree.

use super::*;
use crate::test_util::{pem, small_store};
use crate::{OpenOptions, Params};
use std::os::unix::fs::PermissionsExt;

fn store(dir: &Path) -> Store {
    small_store(dir).with_tree(TreeSync::On)
}

fn files(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for d in TREE_DIRS {
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
