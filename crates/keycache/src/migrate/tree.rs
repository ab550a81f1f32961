//! The `localfs_key` tree written into the store directory when the banks
//! go somewhere else than the tree migrated (`--out`, a cluster peer's
//! `cluster_pki_dir`).
//!
//! Salt 3008.5's `validate_token` (salt/channel/server.py) reads
//! `<pki_dir or cluster_pki_dir>/minions/<id>` from disk on every request
//! of a signed-in minion, whatever the key cache driver: banks migrated
//! into a directory without that tree refuse every accepted minion, and
//! later accepts keep none (a store's tree is kept in step only where a
//! `minions` entry exists, [`crate::tree::TreeSync::auto`]). So a
//! migration into another directory writes the tree there too, with the
//! tree writer of [`crate::tree`] and in its order, in the same commit as
//! the banks (under their locks): files the migrated store no longer
//! vouches for in `minions/` go before the banks are replaced, the new
//! files after. The four state directories are created (0755, the store's
//! owner), as Salt's `verify_env` makes them, so that later writes keep the
//! tree in step.
//!
//! Key files already in that tree for ids the migrated store will not hold
//! at all would be removed by that: unless `replace` (which drops what the
//! tree migrated does not have, banks and tree alike), the migration is
//! refused before anything is written, naming them.

use super::*;
use crate::id::MinionId;
use crate::tree::{want_of, Sync, Want};

/// What the tree should hold for each id, once the banks hold the plan.
pub(super) type Wants = Vec<(MinionId, Want)>;

/// What an id holds once the banks hold the plan: its `keys` entry (state,
/// public key) and its denied key.
type Final = (Option<(KeyState, Vec<u8>)>, Option<Vec<u8>>);

/// Whether `a` and `b` are one directory (resolved: a relative path, a
/// symlink or `..` do not make two). A directory that does not exist yet is
/// another one.
/// How the refusal of a target tree with key files the migration would
/// drop begins ([`would_drop_tree_keys`] tells it).
const UNMIGRATED: &str = "its key tree holds key files for";

/// Whether `e` refuses a migration into another directory whose key tree
/// holds key files the migrated store would not hold: a front end can say
/// how to migrate that tree first, or to replace them.
pub fn would_drop_tree_keys(e: &Error) -> bool {
    matches!(e, Error::PkiDir { why, .. } if why.starts_with(UNMIGRATED))
}

pub(super) fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

impl Tree {
    /// The public key of tree entry `i` (its record without the checksum
    /// and the state byte).
    fn pem(&self, i: usize) -> &[u8] {
        let (buf, range) = self.record(i);
        let skip = SUM + state_bytes(self.found[i].dir);
        self.parts
            .get(buf)
            .and_then(|b| b.get(range.start + skip..range.end))
            .unwrap_or_default()
    }

    /// What the tree in `dir` must hold once the banks hold `plan`: every
    /// id of the plan (ids that are not valid minion ids get no file), and
    /// every id with a key file there now (none of its files stays, but
    /// those of its state). Refuses, unless `replace`, when the tree holds
    /// key files for ids the plan does not hold at all.
    pub(super) fn wants(&self, plan: &MigrationPlan, dir: &Path, replace: bool) -> Result<Wants> {
        let mut finals: BTreeMap<String, Final> = BTreeMap::new();
        for s in &plan.keys {
            let (id, held) = match *s {
                Src::Tree(i) => (self.id(i), (self.state(i), self.pem(i).to_vec())),
                Src::Kept(i) => {
                    let (id, value, _) = &plan.kept_keys[i];
                    match crate::store::decode_key_value(value) {
                        Some((state, pem)) => (id.as_str(), (state, pem.to_vec())),
                        None => continue,
                    }
                }
            };
            finals.entry(id.to_owned()).or_default().0 = Some(held);
        }
        for s in &plan.denied {
            let (id, pem) = match *s {
                Src::Tree(i) => (self.id(i), self.pem(i).to_vec()),
                Src::Kept(i) => {
                    let (id, value, _) = &plan.kept_denied[i];
                    let mut v = value.clone();
                    while v.last() == Some(&0) {
                        v.pop();
                    }
                    (id.as_str(), v)
                }
            };
            finals.entry(id.to_owned()).or_default().1 = Some(pem);
        }
        let present = crate::tree::ids_with_key_files(dir)?;
        let lost: Vec<&String> = present
            .iter()
            .filter(|id| !finals.contains_key(*id))
            .collect();
        if !lost.is_empty() && !replace {
            let shown: Vec<&str> = lost.iter().take(10).map(|s| s.as_str()).collect();
            return Err(Error::PkiDir {
                path: dir.into(),
                why: format!(
                    "{UNMIGRATED} {} ids that neither the tree migrated nor \
                     the banks hold ({}{}): writing the migrated store's tree there would remove \
                     them. Migrate that tree ({}) first, or have this migration replace \
                     them; nothing was written",
                    lost.len(),
                    shown.join(", "),
                    if lost.len() > 10 { ", ..." } else { "" },
                    dir.display()
                ),
            });
        }
        let mut wants = Wants::with_capacity(finals.len() + lost.len());
        for id in present.into_iter().filter(|id| !finals.contains_key(id)) {
            wants.push((MinionId::new(id)?, Want::default()));
        }
        for (id, (k, d)) in finals {
            if let Ok(id) = MinionId::new(id) {
                wants.push((id, want_of(k, d)));
            }
        }
        Ok(wants)
    }
}

/// Plans the tree writes for `wants` in `store`'s directory and removes,
/// durably, the `minions/` files the store will no longer vouch for (step
/// 1 of [`crate::tree`]'s order); the caller then replaces the banks and
/// calls [`after`].
pub(super) fn before(store: &Store, wants: &Wants) -> Result<Sync> {
    let mut sync = Sync::plan(store, wants)?;
    sync.before()?;
    Ok(sync)
}

/// Once the banks hold the plan: writes the key files that are missing or
/// different and removes those that no longer belong ([`Sync::after`]),
/// then creates the state directories still missing.
pub(super) fn after(store: &Store, sync: Sync, wants: &Wants) -> Result<crate::tree::TreeChanges> {
    let changes = sync.after(wants)?;
    crate::tree::create_state_dirs(store)?;
    Ok(changes)
}

/// After a failed commit (the banks unchanged): the tree of `wants`' ids
/// brought back in step with what the store holds, as far as it can be
/// (the early removals of [`before`] undone).
pub(super) fn restore(store: &Store, sync: Sync, wants: &Wants) {
    let now: Result<Wants> = wants
        .iter()
        .map(|(id, _)| {
            let k = store.get(id)?.map(|e| (e.state, e.public_key));
            let d = store.denied(id)?;
            Ok((id.clone(), want_of(k, d)))
        })
        .collect();
    if let Ok(now) = now {
        let _ = sync.after(&now);
    }
}
