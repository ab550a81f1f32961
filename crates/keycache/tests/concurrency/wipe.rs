//! d) A bank's wipe (Salt's `flush(bank)`) beside writers: no write lands
//! between the wipe's removal of the entries and of the files (where it
//! would be lost, its `minions/<id>` file left vouching for a key no store
//! holds), a writer that locked the lock file the wipe removed does not
//! write beside one that locks the new file, and a wipe of `keys` creates
//! no `denied_keys` bank.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use keycache::format::KEYS_INDEX;
use keycache::table::Table;
use keycache::tree::TreeSync;
use keycache::Bank;
use keycache::{KeyState, MinionId, Store};

use super::*;

/// A lock taken through a lock file that a wipe removed is taken again on
/// the file the path now names: a handle that locked the old file (it keeps
/// the file open between writes) waits for a handle that holds the new one.
#[test]
fn a_lock_on_a_removed_lock_file_is_taken_again_on_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(KEYS_INDEX);
    let old = Table::open(&path, &opts(101, 1 << 20, 0)).unwrap();
    old.put(b"before", b"v").unwrap();
    Table::remove_files(&path).unwrap();
    let new = Table::open(&path, &opts(101, 1 << 20, 0)).unwrap();
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let old_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let new = &new;
        s.spawn(move || {
            new.transaction(|tx| {
                tx.put(b"new", b"v")?;
                held_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                Ok(())
            })
            .unwrap()
        });
        held_rx.recv().unwrap();
        s.spawn(|| {
            old.put(b"old", b"v").unwrap();
            old_done.store(true, Ordering::SeqCst);
        });
        // The old handle must wait however long the new one holds the lock:
        // without the check it locks its removed file and writes at once.
        std::thread::sleep(Duration::from_millis(300));
        let wrote_beside = old_done.load(Ordering::SeqCst);
        release_tx.send(()).unwrap();
        assert!(
            !wrote_beside,
            "the old handle wrote while the new one held the lock"
        );
    });
    let t = Table::open(&path, &opts(101, 1 << 20, 0)).unwrap();
    assert!(t.get(b"new").unwrap().is_some());
    assert!(t.get(b"old").unwrap().is_some());
    assert!(t.get(b"before").unwrap().is_none(), "wiped");
}

/// Wipes of the `keys` bank (with the key tree) while another handle
/// accepts keys as fast as it can: afterwards every `minions/<id>` file is
/// a key the store holds accepted, and every key the store holds is in the
/// tree.
#[test]
fn a_wipe_beside_a_writer_leaves_no_tree_file_without_its_entry() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        Store::open_with(dir.path(), &opts(4099, 1 << 20, 0))
            .unwrap()
            .with_tree(TreeSync::On)
    };
    let stop = AtomicBool::new(false);
    let written = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let w = open();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = MinionId::new(format!("w{n:05}")).unwrap();
                // A write into a bank a wipe removed meanwhile fails or
                // lands in the new bank; neither may leave a stray file.
                let _ = w.put(&id, KeyState::Accepted, &value(id.as_str(), "v", 0, 200));
                n += 1;
                written.store(n, Ordering::SeqCst);
            }
        });
        for _ in 0..40 {
            open().wipe(Bank::Keys).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::SeqCst);
    });
    assert!(written.load(Ordering::SeqCst) > 40, "the writer wrote");
    let store = open();
    let problems = keycache::tree::check(&store).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A wipe of `keys` locks and writes that bank alone: a store without a
/// `denied_keys` bank still has none after it.
#[test]
fn a_wipe_of_keys_creates_no_denied_bank() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(dir.path(), &opts(101, 1 << 20, 0))
        .unwrap()
        .with_tree(TreeSync::On);
    let id = MinionId::new("m1").unwrap();
    store
        .put(&id, KeyState::Accepted, &value("m1", "v", 0, 200))
        .unwrap();
    let denied = dir.path().join(keycache::format::DENIED_INDEX);
    assert!(!denied.exists(), "no denied bank before");
    store.wipe(Bank::Keys).unwrap();
    assert!(!denied.exists(), "the wipe created the denied bank");
    assert!(!dir.path().join(KEYS_INDEX).exists());
    assert!(!dir.path().join("minions/m1").exists());
}
