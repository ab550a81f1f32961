//! The replica's state file (`.keycache-etcd` in the store directory): which
//! etcd cluster and prefix the store replicates, the revision it holds, the
//! last event it applied ([`Anchor`]), which store it describes
//! ([`Binding`]), and when the replicator last proved the replica current.
//!
//! Written only by the replicator, after the store changes it describes
//! are durable, by a rename over the old file (readers see one or the
//! other), so the revision it names is never ahead of the store. It is not
//! fsynced: after a crash it may name an older revision than the store
//! holds (the watch then applies some changes again, as one batch up to
//! the revision that was being applied, [`Applying`]: see
//! [`crate::catch_up`]) or be unreadable (the replicator lists again); it
//! never names a newer one. Two fsyncs per batch saved. Read by writers
//! waiting for their revision, and by `keycache etcd status`.
//!
//! A revision number alone proves little: etcd restored from a backup
//! keeps its cluster id and reaches the same revisions again with other
//! changes, and a store copied from a live replica may be older than the
//! state file copied after it. So the file also names the last event
//! applied (checked against etcd's history before a watch resumes and
//! before a writer takes the replica's word: [`crate::anchor`]) and the
//! files of the store it was written for (a copy or a restore of the
//! directory does not fit and lists again).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The replica's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaState {
    /// The etcd prefix replicated.
    pub prefix: String,
    /// The etcd cluster's id (from its response headers).
    pub cluster_id: u64,
    /// The etcd revision the store holds: every change under the prefix up
    /// to it, none after.
    pub revision: i64,
    /// The revision of the last full list (the start of this watch).
    pub listed_at: i64,
    /// The latest etcd revision the replicator saw.
    pub etcd_revision: i64,
    /// When the replicator last proved the replica current, in ms since
    /// the epoch by the replicator's wall clock: for people only, never
    /// compared with another process's clock.
    pub contact_ms: u64,
    /// When the replicator last proved the replica current, in ms of the
    /// host's boot clock ([`boot_ms`]); 0: never. Staleness is judged on
    /// it ([`ReplicaState::stale`]).
    #[serde(default)]
    pub contact_boot_ms: u64,
    /// The host's boot id (`/proc/sys/kernel/random/boot_id`) when the
    /// proof was taken: a proof of another boot is stale, whatever the
    /// boot clock says.
    #[serde(default)]
    pub boot_id: String,
    /// The etcd revision that contact proved the replica current through:
    /// a linearizable read answered it, and the watch reported progress
    /// up to it afterwards.
    #[serde(default)]
    pub current_through: i64,
    /// The last event the store applied (`None`: a state written before
    /// anchors, which lists again).
    #[serde(default)]
    pub anchor: Option<Anchor>,
    /// The store this state describes (`None`: as for `anchor`).
    #[serde(default)]
    pub store: Option<Binding>,
    /// The last consistency check of the replica against etcd.
    #[serde(default)]
    pub check: Option<CheckResult>,
    /// The pid of the replicator that wrote this.
    pub pid: u32,
}

/// The last change under the prefix that the store applied, as etcd's
/// history holds it: a replica that resumes (or a writer that waits for
/// it) first reads this key at the replica's revision, and a history that
/// went back or forked (etcd restored from a backup, with the same cluster
/// id) does not show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor {
    /// The etcd key, in hex (an etcd key is bytes).
    pub key: String,
    /// Its `mod_revision`: the revision of the change.
    pub mod_revision: i64,
    /// Its `create_revision` (0 for a deletion).
    pub create_revision: i64,
    /// Its `version` (0 for a deletion).
    pub version: i64,
    /// The xxh3 of the value; `None` for a deletion.
    pub value_hash: Option<u64>,
}

impl Anchor {
    /// The anchor of a key-value etcd sent (a deletion: `deleted`).
    pub fn of(kv: &etcd_client::KeyValue, deleted: bool) -> Anchor {
        Anchor {
            key: hex(kv.key()),
            mod_revision: kv.mod_revision(),
            create_revision: if deleted { 0 } else { kv.create_revision() },
            version: if deleted { 0 } else { kv.version() },
            value_hash: (!deleted).then(|| xxhash_rust::xxh3::xxh3_64(kv.value())),
        }
    }

    /// The etcd key's bytes (`None`: not hex, a damaged state file).
    pub fn key_bytes(&self) -> Option<Vec<u8>> {
        let b = self.key.as_bytes();
        if !b.len().is_multiple_of(2) {
            return None;
        }
        b.chunks(2)
            .map(|p| {
                let d = |c: u8| (c as char).to_digit(16);
                Some((d(p[0])? * 16 + d(p[1])?) as u8)
            })
            .collect()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Which files a state describes: the store directory's device and inode,
/// and each bank index's inode and birth time. A copy of the directory
/// (cp, tar, a backup agent) or a restore of its files has others, so the
/// state copied with it is not taken for the copy's: that replica lists
/// again. Read anew before each write of the state (a list rebuilds the
/// banks into new files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The directory's device.
    pub dev: u64,
    /// The directory's inode.
    pub ino: u64,
    /// The `keys` bank index: inode and birth time (ns), when it exists.
    pub keys: Option<(u64, Option<u128>)>,
    /// The `denied_keys` bank index, likewise.
    pub denied: Option<(u64, Option<u128>)>,
}

impl Binding {
    /// The binding of the store in `dir` as it is now.
    pub fn of(dir: &Path) -> Result<Binding> {
        use std::os::unix::fs::MetadataExt;
        let d = std::fs::metadata(dir).map_err(|e| Error::io(dir, "stat", e))?;
        let file = |name: &str| -> Result<Option<(u64, Option<u128>)>> {
            let p = dir.join(name);
            match std::fs::symlink_metadata(&p) {
                Ok(m) => {
                    let born = m
                        .created()
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_nanos());
                    Ok(Some((m.ino(), born)))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::io(&p, "stat", e)),
            }
        };
        Ok(Binding {
            dev: d.dev(),
            ino: d.ino(),
            keys: file(keycache::format::KEYS_INDEX)?,
            denied: file(keycache::format::DENIED_INDEX)?,
        })
    }
}

/// The outcome of a consistency check ([`crate::check`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// The revision compared at.
    pub revision: i64,
    /// `equal`, `differed` (the replicator lists again), `not_held` (it
    /// differed again right after a list: entries this store cannot hold,
    /// a full bank) or `skipped` (etcd compacted that revision).
    pub result: String,
    /// Entries etcd holds under the prefix that the replica should hold.
    pub entries: u64,
    /// When, on the host's boot clock ([`boot_ms`]).
    pub boot_ms: u64,
    /// Checks run by this replicator, and how many differed.
    pub runs: u64,
    /// Checks that differed.
    pub differed: u64,
    /// With the key tree kept: how many entries of the tree disagree with
    /// the store ([`keycache::tree::check`]: a `minions/<id>` removed or
    /// planted by hand, a key file changed), looked at with the check;
    /// never mended by the replicator (a file removed by hand may be a
    /// revocation): `keycache verify --repair` does, once an operator has
    /// looked.
    #[serde(default)]
    pub tree: Option<u64>,
    /// The first of those disagreements, said as `keycache verify` says it.
    #[serde(default)]
    pub tree_first: Option<String>,
}

/// The host's boot id (empty where the kernel does not say): it changes at
/// every boot.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Milliseconds of the host's boot clock (`CLOCK_BOOTTIME`): monotonic,
/// counting suspend, shared by every process of the host, moved by no
/// wall-clock step and read through the vDSO (so a time faker preloaded
/// into one process does not move it either). It restarts at a reboot.
pub fn boot_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    (t.tv_sec.max(0) as u64) * 1000 + (t.tv_nsec.max(0) as u64) / 1_000_000
}

/// The state file of the store in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(keycache::format::REPLICA_FILE)
}

/// The replica's state file in `dir`, when there is one: `dir` is then a
/// replica of etcd, whose key state only etcd changes. The CLI and the Salt
/// driver refuse to write its `keys` and `denied_keys` banks locally
/// ([`AROUND_ETCD`]).
pub fn replica_file(dir: &Path) -> Option<PathBuf> {
    let file = path(dir);
    std::fs::symlink_metadata(&file).ok().map(|_| file)
}

/// Why a replica's key state is not changed locally ([`replica_file`]).
pub const AROUND_ETCD: &str = "a change written to it alone would reach neither etcd nor the \
     other masters; its replicator's watch would leave it, and its next list of etcd would undo \
     it (a key deleted here alone back)";

/// The message the CLI and the Salt driver give when they refuse a local
/// write of the replica `dir`, whose state file is `file` (both as the
/// caller prints paths): why ([`AROUND_ETCD`]), `remedy` (the caller's way
/// through etcd), and how to stop replicating instead.
pub fn refused_around_etcd(dir: &str, file: &str, remedy: &str) -> String {
    format!(
        "{dir} is a replica of etcd ({file} names it): {AROUND_ETCD}. {remedy}; to stop \
         replicating into this directory, stop its replicator and remove {file}. Nothing was \
         written"
    )
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl ReplicaState {
    /// Reads the state of the store in `dir`; `None` when there is none (a
    /// store that was never a replica).
    pub fn read(dir: &Path) -> Result<Option<ReplicaState>> {
        let p = path(dir);
        let mut buf = Vec::new();
        match keycache::files::read_small(&p, 64 * 1024, &mut buf) {
            Ok(_) => {}
            Err(keycache::files::Refused::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None)
            }
            Err(r) => return Err(r.into_error(&p).into()),
        }
        serde_json::from_slice(&buf)
            .map(Some)
            .map_err(|e| Error::State {
                path: p,
                why: format!("not a replica state file ({e}); remove it to list etcd again"),
            })
    }

    /// Why this replica is not proven current (`None`: it is): it was never
    /// proven current, its state does not belong to the store in `dir`
    /// ([`Binding`]), its last proof is older than `stale_after` on the
    /// host's boot clock, or lies in that clock's future (written before a
    /// reboot). No wall clock is compared.
    pub fn stale(&self, dir: &Path, stale_after: Duration) -> Option<String> {
        if !self.belongs_to(dir) {
            return Some(format!(
                "{} was not written for the store in {} (a copy or a restore of the directory?): \
                 its replicator lists etcd again",
                path(dir).display(),
                dir.display()
            ));
        }
        if self.contact_boot_ms == 0 {
            return Some("the replicator has not proven this replica current yet".into());
        }
        if crate::lock::ReplicatorLock::held(dir) == Some(false) {
            return Some(format!(
                "no replicator runs for this store (none holds {})",
                dir.join(keycache::format::REPLICATOR_LOCK_FILE).display()
            ));
        }
        let now = boot_ms();
        if self.contact_boot_ms > now || self.boot_id != boot_id() {
            return Some("the last proof of currency was taken before this host booted".to_owned());
        }
        let age = Duration::from_millis(now - self.contact_boot_ms);
        (age > stale_after).then(|| {
            format!(
                "the replicator last proved this replica current {:.1} s ago (stale_after is \
                 {} s): is it running, and does etcd answer it?",
                age.as_secs_f64(),
                stale_after.as_secs()
            )
        })
    }

    /// [`ReplicaState::stale`] of the state in `dir` (`None` when it has
    /// none: the caller says so in its own words), read again for up to
    /// `grace` while it is stale and a replicator holds the store's lock: a
    /// replicator that just restarted proves the replica current within a
    /// proof's period of catching up.
    pub fn stale_waiting(
        dir: &Path,
        stale_after: Duration,
        grace: Duration,
    ) -> Result<Option<(ReplicaState, Option<String>)>> {
        let start = std::time::Instant::now();
        loop {
            let Some(s) = ReplicaState::read(dir)? else {
                return Ok(None);
            };
            let why = s.stale(dir, stale_after);
            let running = crate::lock::ReplicatorLock::held(dir) == Some(true);
            if why.is_none() || !running || start.elapsed() >= grace {
                return Ok(Some((s, why)));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// How long ago the last proof of currency was, on the host's boot
    /// clock (`None`: never, or in that clock's future).
    pub fn contact_age(&self) -> Option<Duration> {
        let now = boot_ms();
        (self.contact_boot_ms > 0 && self.contact_boot_ms <= now)
            .then(|| Duration::from_millis(now - self.contact_boot_ms))
    }

    /// Whether this state was written for the store in `dir` as its files
    /// are now ([`Binding`]); a state without a binding belongs to none.
    pub fn belongs_to(&self, dir: &Path) -> bool {
        match (&self.store, Binding::of(dir)) {
            (Some(b), Ok(now)) => *b == now,
            _ => false,
        }
    }

    /// Writes it, replacing the old one (not fsynced: see the module doc).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec(self).map_err(|e| Error::State {
            path: path(dir),
            why: e.to_string(),
        })?;
        let own = keycache::files::Ownership::for_dir(dir)?;
        keycache::files::replace_unsynced(&path(dir), &bytes, &own)?;
        Ok(())
    }
}

/// The revision the replicator is applying
/// ([`keycache::format::APPLYING_FILE`] in the store directory): recorded
/// before a batch's (or a list's) store write, so that after a kill
/// between that write and the state's record the next watch knows how far
/// the store may be ahead of the record ([`crate::catch_up`]). Written in
/// place, 8 bytes by one `pwrite` (a new file per batch would cost an
/// inode each time), not fsynced (as the state); read only by the
/// replicator when it starts.
#[derive(Debug)]
pub struct Applying {
    file: std::fs::File,
    path: PathBuf,
}

impl Applying {
    /// Opens (creating) the record of the store in `dir`.
    pub fn open(dir: &Path) -> Result<Applying> {
        let path = dir.join(keycache::format::APPLYING_FILE);
        let own = keycache::files::Ownership::for_dir(dir)?;
        let file = keycache::files::open_or_create(&path, &own)?;
        Ok(Applying { file, path })
    }

    /// Records `revision` as the one being applied.
    pub fn record(&self, revision: i64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(&revision.to_le_bytes(), 0)
            .map_err(|source| {
                keycache::Error::Io {
                    path: self.path.clone(),
                    op: "write",
                    source,
                }
                .into()
            })
    }

    /// The revision recorded for the store in `dir`; 0 (nothing to catch
    /// up) when there is no record, or one that is not 8 bytes.
    pub fn read(dir: &Path) -> Result<i64> {
        let path = dir.join(keycache::format::APPLYING_FILE);
        let mut buf = Vec::new();
        match keycache::files::read_small(&path, 8, &mut buf) {
            Ok(_) => {}
            Err(keycache::files::Refused::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(0)
            }
            Err(r) => return Err(r.into_error(&path).into()),
        }
        Ok(<[u8; 8]>::try_from(buf.as_slice()).map_or(0, i64::from_le_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_garbage_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(ReplicaState::read(dir.path()).expect("read"), None);
        let s = ReplicaState {
            prefix: "/keycache/x/".into(),
            cluster_id: 7,
            revision: 42,
            listed_at: 40,
            etcd_revision: 43,
            contact_ms: 1,
            pid: 9,
            ..ReplicaState::default()
        };
        s.write(dir.path()).expect("write");
        assert_eq!(ReplicaState::read(dir.path()).expect("read"), Some(s));
        std::fs::write(path(dir.path()), b"{").expect("garbage");
        let e = ReplicaState::read(dir.path()).expect_err("garbage");
        assert!(e.to_string().contains(".keycache-etcd"), "{e}");
    }

    /// Staleness is judged on the boot clock and the binding alone: never
    /// proven, proven too long ago, proven "in the future" (before a
    /// reboot), or written for another store's files is stale; a fresh
    /// proof for this store is not, whatever the wall-clock contact says.
    #[test]
    fn staleness_is_judged_on_the_boot_clock_and_the_store_binding() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join(keycache::format::KEYS_INDEX), b"").expect("index");
        let after = Duration::from_secs(5);
        let mut s = ReplicaState {
            prefix: "/p/".into(),
            contact_ms: u64::MAX,
            store: Some(Binding::of(dir.path()).expect("binding")),
            ..ReplicaState::default()
        };
        let why = s.stale(dir.path(), after).expect("never proven");
        assert!(why.contains("not proven"), "{why}");
        s.contact_boot_ms = boot_ms();
        s.boot_id = boot_id();
        assert_eq!(s.stale(dir.path(), after), None);
        s.boot_id = "another boot".into();
        let why = s.stale(dir.path(), after).expect("another boot");
        assert!(why.contains("before this host booted"), "{why}");
        s.boot_id = boot_id();
        assert!(s.contact_age().expect("age") < after);
        s.contact_boot_ms = boot_ms().saturating_sub(6_000);
        let why = s.stale(dir.path(), after).expect("too old");
        assert!(why.contains("stale_after is 5 s"), "{why}");
        s.contact_boot_ms = boot_ms() + 3_600_000;
        let why = s.stale(dir.path(), after).expect("in the future");
        assert!(why.contains("before this host booted"), "{why}");
        assert_eq!(s.contact_age(), None);
        // The same state beside a copy of the files is not the copy's.
        s.contact_boot_ms = boot_ms();
        let copy = tempfile::tempdir().expect("copy");
        std::fs::copy(
            dir.path().join(keycache::format::KEYS_INDEX),
            copy.path().join(keycache::format::KEYS_INDEX),
        )
        .expect("cp");
        assert!(s.belongs_to(dir.path()));
        assert!(!s.belongs_to(copy.path()));
        let why = s.stale(copy.path(), after).expect("a copy");
        assert!(why.contains("not written for the store"), "{why}");
        // An index replaced by another file (a restore of the directory's
        // files in place) is not the same store either.
        std::fs::remove_file(dir.path().join(keycache::format::KEYS_INDEX)).expect("rm");
        std::fs::write(dir.path().join(keycache::format::KEYS_INDEX), b"").expect("index");
        assert!(!s.belongs_to(dir.path()));
        // A state without a binding (an older keycache's) belongs to none.
        s.store = None;
        assert!(!s.belongs_to(copy.path()));
    }

    /// An anchor's key survives the state file as hex, whatever its bytes.
    #[test]
    fn anchor_keys_round_trip_through_hex() {
        let a = Anchor {
            key: hex(b"/p/keys/\xff\x00x"),
            mod_revision: 1,
            create_revision: 1,
            version: 1,
            value_hash: None,
        };
        assert_eq!(a.key_bytes().expect("hex"), b"/p/keys/\xff\x00x");
        let bad = Anchor {
            key: "abc".into(),
            ..a.clone()
        };
        assert_eq!(bad.key_bytes(), None);
        let bad = Anchor {
            key: "zz".into(),
            ..a
        };
        assert_eq!(bad.key_bytes(), None);
    }

    /// The record of the revision being applied: 0 when absent or not
    /// 8 bytes, else the last one recorded, rewritten in place; never
    /// through a symlink.
    #[test]
    fn applying_is_recorded_in_place() {
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(Applying::read(dir.path()).expect("read"), 0);
        let a = Applying::open(dir.path()).expect("open");
        a.record(1_234_567).expect("record");
        assert_eq!(Applying::read(dir.path()).expect("read"), 1_234_567);
        let path = dir.path().join(keycache::format::APPLYING_FILE);
        let inode =
            |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).expect("stat"));
        let before = inode(&path);
        a.record(9).expect("record");
        assert_eq!(Applying::read(dir.path()).expect("read"), 9);
        assert_eq!(inode(&path), before, "written in place");
        drop(a);
        Applying::open(dir.path()).expect("opens an existing record");
        std::fs::write(&path, b"xyz").expect("short");
        assert_eq!(Applying::read(dir.path()).expect("read"), 0);
        std::fs::remove_file(&path).expect("rm");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"").expect("target");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        assert!(
            Applying::open(dir.path()).is_err(),
            "a symlink is not followed"
        );
        assert!(Applying::read(dir.path()).is_err());
        assert_eq!(std::fs::read(&target).expect("read"), b"");
    }
}
