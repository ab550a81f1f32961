//! The tree kept in step with a batch of writes: what each id should have in
//! each state directory, and the order of the writes around the banks'.

use super::*;

/// The key file an id should have in each state directory (None: no file).
pub(crate) type Want = [Option<Vec<u8>>; 4];

/// What the tree should hold for an id that the `keys` bank holds as
/// `keys` and the `denied_keys` bank as `denied`. Values that hold a
/// private key block get no file.
pub(crate) fn want_of(keys: Option<(KeyState, Vec<u8>)>, denied: Option<Vec<u8>>) -> Want {
    let mut w: Want = Default::default();
    if let Some((s, pem)) = keys {
        if !crate::pem::holds_private_key(&pem) {
            w[TreeDir::of(s).index()] = Some(pem);
        }
    }
    if let Some(pem) = denied {
        if !crate::pem::holds_private_key(&pem) {
            w[TreeDir::MinionsDenied.index()] = Some(pem);
        }
    }
    w
}

/// What the store holds for an id, for a report.
pub(super) fn held(keys: Option<KeyState>, denied: bool, dir: TreeDir) -> Option<&'static str> {
    if dir == TreeDir::MinionsDenied {
        denied.then_some("denied")
    } else {
        keys.map(KeyState::name)
    }
}

/// Ownership of the tree's new files: the store's (its bank files' owner,
/// the pki dir's by default).
pub(super) fn ownership(store: &dyn KeySource) -> Ownership {
    store.ownership()
}

/// The tree writes of one batch, planned (and checked) before the banks
/// are written: [`Sync::plan`], [`Sync::before`], the bank write, then
/// [`Sync::after`].
pub(crate) struct Sync {
    root: Dir,
    dirs: [Option<Dir>; 4],
    /// The state directories kept in step ([`KeySource::tree_dirs`], bit
    /// [`TreeDir::index`]): the others are never opened, so never written.
    scope: u8,
    own: Ownership,
    /// `minions/<id>` files to remove before the banks are written.
    early: Vec<String>,
    /// Owner and group of the `early` files: the files written in their
    /// place keep them, as a replaced file does.
    kept: std::collections::HashMap<String, (u32, u32)>,
    /// Per id, the state directories (bit `TreeDir::index`) where the plan
    /// found an entry. Where it found none, the id's entry is not looked at
    /// again to be moved or removed (the tree is written under the `keys`
    /// bank's lock, so no keycache writer ran in between), which spares
    /// most of an accept's `lstat`s; except in `minions/`, where a file
    /// that must not be there is always looked for.
    found: std::collections::HashMap<String, u8>,
    changes: TreeChanges,
    /// Whether the batch removes or writes a `minions/` file: only then is
    /// its intent record made durable (a kill keeps it either way; after a
    /// power cut, the other directories' files are `verify`'s to mend).
    durable_intent: bool,
    /// The store's directory, where the intent record of the batch's ids
    /// is kept ([`super::intent`]) from [`Sync::before`] to the end of
    /// [`Sync::after`].
    store_dir: PathBuf,
}

/// From how many ids [`Sync::plan`] reads each state directory once
/// (`getdents64` returns many names a call) instead of looking up each id's
/// entry.
pub(super) const LIST_FROM: usize = 1024;

/// `minions/`'s index, and its bit in [`Sync`]'s `found` masks.
const MINIONS: usize = TreeDir::Minions.index();
const MINIONS_BIT: u8 = 1 << MINIONS;

impl Sync {
    /// Looks at every entry the batch's ids have in the tree's state
    /// directories that the store keeps in step. An entry under an id's
    /// name that is not a regular file, or a state directory that is not
    /// one, fails here, before anything is written.
    pub(crate) fn plan(store: &dyn KeySource, wants: &[(MinionId, Want)]) -> Result<Sync> {
        let root = Dir::open_root(store.dir(), Writer::Tree)?;
        let mut dirs: [Option<Dir>; 4] = Default::default();
        for td in store.tree_dirs() {
            dirs[td.index()] = root.sub(td.name())?;
        }
        // A large batch reads each state directory once: an id it does not
        // list has no entry there, and only the names listed are looked at
        // (a new replica's 100,000 ids: no `lstat` in its empty directories).
        // The listing's own file types spare the `lstat` of a regular file
        // outside `minions/`, where only its presence counts.
        let mut listed: [Option<std::collections::HashMap<std::ffi::OsString, bool>>; 4] =
            Default::default();
        if wants.len() >= LIST_FROM {
            for (d, dir) in dirs.iter().enumerate() {
                if let Some(dir) = dir {
                    listed[d] = Some(dir.entries()?.into_iter().collect());
                }
            }
        }
        let mut early = Vec::new();
        let mut kept = std::collections::HashMap::new();
        let mut found = std::collections::HashMap::with_capacity(wants.len());
        let mut minions_change = false;
        for (id, want) in wants {
            let id = id.as_str();
            let mut mask = 0;
            let mut minions_kept = false;
            for (d, dir) in dirs.iter().enumerate() {
                let Some(dir) = dir else { continue };
                let node = match listed[d].as_ref().map(|l| l.get(OsStr::new(id))) {
                    Some(None) => Node::Absent,
                    Some(Some(true)) if d != MINIONS => {
                        mask |= 1 << d;
                        continue;
                    }
                    _ => dir.entry(id)?,
                };
                match node {
                    Node::Absent => {}
                    Node::Other(m) => {
                        return Err(Writer::Tree.not_a_key_file(&dir.shown(id), m.not_regular()))
                    }
                    Node::File(m) => {
                        mask |= 1 << d;
                        if d == TreeDir::Minions.index() {
                            let keep = match &want[d] {
                                Some(pem) if m.len() == pem.len() as u64 => {
                                    dir.content_is(id, pem)?
                                }
                                _ => false,
                            };
                            if keep {
                                minions_kept = true;
                            } else {
                                early.push(id.to_owned());
                                kept.insert(id.to_owned(), (m.uid(), m.gid()));
                            }
                        }
                    }
                }
            }
            minions_change |= want[MINIONS].is_some() && !minions_kept;
            found.insert(id.to_owned(), mask);
        }
        Ok(Sync {
            durable_intent: minions_change || !early.is_empty(),
            root,
            dirs,
            scope: super::dir_mask(store.tree_dirs()),
            own: ownership(store),
            early,
            kept,
            found,
            changes: TreeChanges::default(),
            store_dir: store.dir().to_path_buf(),
        })
    }

    /// Step 1: records the batch's ids ([`super::intent`]), then removes
    /// the `minions/<id>` files that the store will not vouch for once the
    /// batch is written, both durably (the record only when the batch
    /// changes `minions/`).
    pub(crate) fn before(&mut self) -> Result<()> {
        if !self.found.is_empty() {
            super::intent::begin(
                &self.store_dir,
                &self.own,
                self.scope,
                self.found.keys().map(String::as_str),
                self.durable_intent,
            )?;
        }
        if self.early.is_empty() {
            return Ok(());
        }
        let Some(dir) = &self.dirs[TreeDir::Minions.index()] else {
            return Ok(());
        };
        for id in &self.early {
            if dir.remove(id, "remove (before the store leaves accepted)")? {
                self.changes.removed.push(dir.shown(id));
            }
        }
        dir.sync()
    }

    /// The state directory whose file of `id` can be renamed into
    /// directory `to` instead of writing `pem` there, with that file held
    /// open: a regular file that holds exactly `pem`, in a directory where
    /// `id` must lose its file (`want`), with the owner a new file would
    /// get and a mode no wider than a new file's, so that the moved file is
    /// what a write would have made. `minions/` is never a source, and a
    /// key moves into `minions/` only when no file of it was removed there
    /// before the banks were written (a re-keyed id keeps that file's
    /// owner). The file is opened and read once; after the rename, its
    /// inode tells whether the entry moved is that file ([`Dir::is`]).
    fn movable(
        &self,
        id: &str,
        to: usize,
        want: &Want,
        pem: &[u8],
    ) -> Result<Option<(usize, Opened)>> {
        let found = self.found_in(id);
        let Some(owner) = self.own.owner else {
            return Ok(None);
        };
        if to == TreeDir::Minions.index() && self.kept.contains_key(id) {
            return Ok(None);
        }
        for (d, dir) in self.dirs.iter().enumerate() {
            let Some(dir) = dir else { continue };
            if d == to
                || d == TreeDir::Minions.index()
                || want[d].is_some()
                || found & (1 << d) == 0
            {
                continue;
            }
            if let Some(mut f) = dir.open_file(id)? {
                let m = f.meta();
                if (m.uid(), m.gid()) == owner
                    && m.mode() & 0o7777 & !self.own.mode == 0
                    && f.holds(pem, &dir.shown(id))?
                {
                    return Ok(Some((d, f)));
                }
            }
        }
        Ok(None)
    }

    /// The state directories where `id` may have an entry: those where
    /// the plan found one; every one for an id the plan did not look at.
    fn found_in(&self, id: &str) -> u8 {
        self.found.get(id).copied().unwrap_or(u8::MAX)
    }

    /// Step 3, once the banks hold `wants`: writes the files that are
    /// missing or different, then removes those that no longer belong,
    /// fsyncing the files and entries of `minions/` (the others are left
    /// to the page cache).
    pub(crate) fn after(mut self, wants: &[(MinionId, Want)]) -> Result<TreeChanges> {
        const R: &str = super::AFTER_REMOVE;
        // Whether `minions/` gained an entry (the only directory fsynced).
        let mut touched = false;
        let mut flushed = false;
        // A state directory absent when the batch was planned, into which
        // it writes many files (a new replica's tree, a migration's into
        // another directory), is filled under a temporary name and renamed
        // into place: one rename instead of one a file, and Salt sees no
        // directory, then every file. A kill before the rename leaves the
        // temporary directory, which the next writer's resume removes.
        let mut filled = [false; 4];
        for td in TreeDir::ALL {
            let d = td.index();
            if self.scope & (1 << d) == 0 || self.dirs[d].is_some() {
                continue;
            }
            let files = wants.iter().filter(|(_, w)| w[d].is_some()).count();
            if files >= super::dir::SYNC_WHOLE {
                self.dirs[d] = Some(self.root.create_filled(td.name(), &self.own)?);
                filled[d] = true;
            } else if files > 0 {
                self.dirs[d] = Some(self.root.sub_or_create(td.name(), &self.own)?);
            }
        }
        let written = self.write(wants, &filled, &mut touched, &mut flushed);
        if written.is_err() {
            for td in TreeDir::ALL.iter().filter(|td| filled[td.index()]) {
                let _ = self
                    .root
                    .remove_filled(&super::dir::filled_name(std::process::id(), td.name()));
            }
        }
        written?;
        if let (true, Some(dir)) = (touched, &self.dirs[MINIONS]) {
            dir.sync()?;
        }
        let mut removed = false;
        for (id, want) in wants {
            let id = id.as_str();
            let found = self.found_in(id) | MINIONS_BIT;
            for (d, dir) in self.dirs.iter().enumerate() {
                let Some(dir) = dir else { continue };
                if want[d].is_none() && found & (1 << d) != 0 && dir.remove(id, R)? {
                    self.changes.removed.push(dir.shown(id));
                    removed |= d == MINIONS;
                }
            }
        }
        if let (true, Some(dir)) = (removed, &self.dirs[MINIONS]) {
            dir.sync()?;
        }
        super::intent::clear(&self.store_dir)?;
        Ok(self.changes)
    }

    /// [`Sync::after`]'s writes: the files moved or written, and the
    /// directories `filled` renamed into place.
    fn write(
        &mut self,
        wants: &[(MinionId, Want)],
        filled: &[bool; 4],
        touched: &mut bool,
        flushed: &mut bool,
    ) -> Result<()> {
        const W: &str = super::AFTER_WRITE;
        let mut items: Vec<Item<'_>> = Vec::new();
        for (id, want) in wants {
            let id = id.as_str();
            let found = self.found_in(id);
            for (d, pem) in want.iter().enumerate() {
                let (Some(pem), Some(dir)) = (pem, &self.dirs[d]) else {
                    continue;
                };
                if found & (1 << d) != 0 && dir.holds(id, pem)? {
                    continue;
                }
                // Nothing is moved into a directory being filled: its
                // files appear together.
                let from = match filled[d] {
                    true => None,
                    false => self.movable(id, d, want, pem)?,
                };
                if let Some((from, f, src)) =
                    from.and_then(|(from, f)| Some((from, f, self.dirs[from].as_ref()?)))
                {
                    // One rename instead of a new file: what Salt's own
                    // `localfs_key` accept does (pending to accepted), and
                    // the key is never in both directories. A file moving
                    // into `minions/` was written without an fsync
                    // (`DURABLE_MINIONS`): its data is made durable first.
                    if d == MINIONS {
                        if wants.len() < super::dir::SYNC_WHOLE {
                            f.sync_data(&src.shown(id), W)?;
                        } else if !*flushed {
                            // Every source was written before this batch:
                            // one write-back covers them all.
                            src.sync_filesystem(W)?;
                            *flushed = true;
                        }
                    }
                    src.rename_to(id, dir, id)
                        .map_err(|e| Error::io(dir.shown(id), W, e))?;
                    if !dir.is(id, &f)? {
                        // Replaced between the read and the rename: not
                        // this key; written the usual way below.
                        dir.remove(id, W)?;
                    } else {
                        self.changes.written.push(dir.shown(id));
                        self.changes.removed.push(src.shown(id));
                        *touched |= d == MINIONS;
                        // Gone from `from`: the removals below need not
                        // look there again.
                        if let Some(mask) = self.found.get_mut(id) {
                            *mask &= !(1 << from);
                        }
                        continue;
                    }
                }
                let own = match self.kept.get(id) {
                    Some(&(uid, gid)) if d == TreeDir::Minions.index() && !self.own.explicit => {
                        Ownership {
                            owner: Some((uid, gid)),
                            ..self.own
                        }
                    }
                    _ => self.own,
                };
                items.push(Item {
                    dir: d,
                    name: id,
                    pem,
                    own,
                    // The plan looked (or listed the directory) and found
                    // no entry, or the directory is new; not moved here
                    // from another directory.
                    absent: found & (1 << d) == 0 || filled[d],
                });
                self.changes.written.push(dir.shown(id));
                *touched |= d == MINIONS;
            }
        }
        // Only `minions/` is made durable, files and entries: a file of
        // another state directory lets no minion in, and one lost to a
        // power cut is a finding of `verify` that its repair mends (a kill
        // loses nothing the page cache holds). A filled `minions/` is made
        // durable whole, once, before it is renamed into place.
        let mask = filled
            .iter()
            .enumerate()
            .fold(0u8, |m, (d, f)| if *f { m | 1 << d } else { m });
        write_many(&self.dirs, &items, DURABLE_MINIONS & !mask, W)?;
        if filled[MINIONS] {
            if let Some(dir) = &self.dirs[MINIONS] {
                dir.sync_filesystem(W)?;
            }
        }
        for td in TreeDir::ALL {
            let d = td.index();
            let Some(dir) = self.dirs[d].take_if(|_| filled[d]) else {
                continue;
            };
            let names: Vec<&str> = items
                .iter()
                .filter(|it| it.dir == d)
                .map(|it| it.name)
                .collect();
            self.dirs[d] = Some(
                self.root
                    .place_filled(dir, td.name(), &names, &self.own, W)?,
            );
        }
        Ok(())
    }
}

/// Removes the temporaries that killed tree writers left in the state
/// directories of `store` that it keeps in step, and the state directories
/// they were filling; returns their paths.
pub(crate) fn remove_dead_temporaries(store: &dyn KeySource) -> Result<Vec<PathBuf>> {
    let root = Dir::open_root(store.dir(), Writer::Tree)?;
    let mut out = Vec::new();
    for td in store.tree_dirs() {
        // A state directory a killed writer was filling.
        let filled = root.filled_dirs(td.name(), true)?;
        for n in &filled {
            root.remove_filled(n)?;
            out.push(root.shown(n));
        }
        if !filled.is_empty() {
            root.sync()?;
        }
        if let Some(dir) = root.sub(td.name())? {
            let gone = dir.remove_dead_temporaries(super::AFTER_REMOVE)?;
            if !gone.is_empty() {
                dir.sync()?;
            }
            out.extend(gone);
        }
    }
    Ok(out)
}
