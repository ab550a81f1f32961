//! The tree compared with the store ([`check`]) and made equal to it
//! ([`mend`]).

use super::*;

/// Takes `flock` on the `keys` bank's lock file (the lock every keycache
/// writer, and Salt's, holds while it writes), shared or exclusive, for as
/// long as the returned file is open. None when there is no lock file and
/// `create` is false (no writer ever wrote the bank).
fn bank_lock(store: &dyn KeySource, exclusive: bool) -> Result<Option<File>> {
    let path = crate::format::lock_path(store.keys_index());
    let f = match crate::files::open_regular(&path, true) {
        Ok(f) => f,
        Err(e) if e.is_not_found() => {
            if !exclusive {
                return Ok(None);
            }
            match crate::files::create_new(&path, &ownership(store)) {
                Ok(f) => f,
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    crate::files::open_regular(&path, true)?
                }
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    if exclusive {
        f.lock().map_err(|e| Error::io(&path, "flock", e))?;
    } else {
        f.lock_shared().map_err(|e| Error::io(&path, "flock", e))?;
    }
    Ok(Some(f))
}

/// The store's view, per state directory: id -> key (withheld ids apart).
pub(super) struct Wanted {
    files: [BTreeMap<String, Vec<u8>>; 4],
    withheld: [BTreeSet<String>; 4],
    /// id -> its state in the `keys` bank.
    states: BTreeMap<String, KeyState>,
    /// ids with a denied key.
    denied: BTreeSet<String>,
}

impl Wanted {
    /// Whether the store holds `id` in either bank.
    fn holds(&self, id: &str) -> bool {
        self.states.contains_key(id) || self.denied.contains(id)
    }
}

fn wanted(store: &dyn KeySource) -> Result<Wanted> {
    let mut w = Wanted {
        files: Default::default(),
        withheld: Default::default(),
        states: BTreeMap::new(),
        denied: BTreeSet::new(),
    };
    store.each_key(&mut |id, state, pem| {
        let d = TreeDir::of(state).index();
        w.states.insert(id.clone(), state);
        if crate::pem::holds_private_key(&pem) {
            w.withheld[d].insert(id);
        } else {
            w.files[d].insert(id, pem);
        }
    })?;
    let denied = TreeDir::MinionsDenied.index();
    store.each_denied(&mut |id, pem| {
        w.denied.insert(id.clone());
        if crate::pem::holds_private_key(&pem) {
            w.withheld[denied].insert(id);
        } else {
            w.files[denied].insert(id, pem);
        }
    })?;
    Ok(w)
}

/// The comparison behind [`check`] and [`mend`], of the state
/// directories `dirs`.
fn compare(root: &Dir, w: &Wanted, dirs: &[TreeDir]) -> Result<Vec<TreeDisagreement>> {
    let mut out = Vec::new();
    for &td in dirs {
        let (d, name) = (td.index(), td.name());
        let dis = |problem, id: Option<&str>, path: PathBuf| TreeDisagreement {
            problem,
            dir: td,
            id: id.map(str::to_owned),
            store: id.and_then(|id| held(w.states.get(id).copied(), w.denied.contains(id), td)),
            path,
        };
        // A directory a killed writer was filling (none is being filled
        // while the lock is held).
        for n in root.filled_dirs(name, false)? {
            out.push(dis(TreeProblem::TempFile, None, root.shown(n)));
        }
        let dir = match root.sub(name) {
            Ok(dir) => dir,
            Err(Error::NotARegularFile { path, .. }) => {
                out.push(dis(TreeProblem::NotADirectory, None, path));
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut present = BTreeSet::new();
        if let Some(dir) = &dir {
            let mut names = dir.names()?;
            names.sort();
            for n in names {
                let Some(n) = n.to_str() else { continue };
                // An id the store holds is the tree's whatever its name.
                if !w.holds(n) {
                    if n.starts_with(TEMP_PREFIX) {
                        out.push(dis(TreeProblem::TempFile, None, dir.shown(n)));
                        continue;
                    }
                    if !is_key_name(n) {
                        continue;
                    }
                }
                present.insert(n.to_owned());
                let path = dir.shown(n);
                match dir.entry(n)? {
                    Node::Absent => {
                        present.remove(n);
                    }
                    Node::Other(_) => out.push(dis(TreeProblem::NotAFile, Some(n), path)),
                    Node::File(m) => match w.files[d].get(n) {
                        Some(pem) => {
                            if m.len() != pem.len() as u64 || !dir.content_is(n, pem)? {
                                out.push(dis(TreeProblem::KeyDiffers, Some(n), path));
                            }
                        }
                        None if w.withheld[d].contains(n) => {
                            out.push(dis(TreeProblem::Withheld, Some(n), path))
                        }
                        None => out.push(dis(TreeProblem::Stray, Some(n), path)),
                    },
                }
            }
        }
        for id in w.files[d].keys() {
            if !present.contains(id) {
                out.push(dis(
                    TreeProblem::Missing,
                    Some(id),
                    root.shown(name).join(id),
                ));
            }
        }
    }
    Ok(out)
}

/// Every disagreement between the `localfs_key` tree in the store's
/// directory and the store: a key file in a state directory for an id not
/// in that state ([`TreeProblem::Stray`]), a missing file for an id in a
/// state ([`TreeProblem::Missing`]), different key bytes
/// ([`TreeProblem::KeyDiffers`]), entries that are not regular files,
/// state directories that are not directories, leftover temporaries. In
/// directory order (`minions`, `minions_pre`, `minions_rejected`,
/// `minions_denied`), then by name; [`TreeDisagreement::grants_access`]
/// tells those that let a minion pass Salt's `validate_token`.
///
/// Only the state directories the store keeps in step are compared
/// ([`KeySource::tree_dirs`]: `minions/` alone for
/// [`TreeSync::Accepted`]).
///
/// Reads only. It holds a shared `flock` on the `keys` bank's lock file
/// while it reads, so that a keycache writer's bank and tree writes are
/// seen both or neither. Meant for a store that keeps a tree (see
/// [`TreeSync::auto`]): without one, every key is reported missing.
pub fn check(store: &dyn KeySource) -> Result<Vec<TreeDisagreement>> {
    let _lock = bank_lock(store, false)?;
    let root = Dir::open_root(store.dir(), Writer::Tree)?;
    let w = wanted(store)?;
    compare(&root, &w, store.tree_dirs())
}

/// How [`require_store`]'s refusal begins.
const NO_STORE: &str = "no key store here";

/// Whether `e` is [`require_store`]'s refusal (no store to make the tree
/// equal to): a front end can say how to build one from the tree.
pub fn no_store(e: &Error) -> bool {
    matches!(e, Error::PkiDir { why, .. } if why.starts_with(NO_STORE))
}

/// Refuses a store that does not exist, before anything is written: the
/// `keys` bank has no index file (neither keycache nor Salt ever wrote a
/// key there, or the index was lost). A tree mended toward it would lose
/// every key file ([`Error::PkiDir`], naming the directory and saying to
/// migrate the tree first, which builds the store from it; [`no_store`]
/// tells this refusal).
pub fn require_store(store: &dyn KeySource) -> Result<()> {
    let index = store.keys_index();
    match std::fs::symlink_metadata(index) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::PkiDir {
            path: store.dir().to_path_buf(),
            why: format!(
                "{NO_STORE} ({} does not exist): making the key tree equal to it would \
                 remove every key file; migrate the tree into a store first; nothing was \
                 changed",
                index.display()
            ),
        }),
        Err(e) => Err(Error::io(index, "stat", e)),
    }
}

/// Makes the tree in the store's directory equal to the store: stray key
/// files in `minions/`, and those holding another key than the store's,
/// are removed first (and that removal made durable),
/// then missing and different files are written (temporary file, fsync,
/// rename, as a tree write does; missing state directories are created),
/// then the other stray files and leftover temporaries are removed.
/// Entries that are not regular files and state directories that are not
/// directories are left alone and listed in [`TreeRepair::refused`].
/// Holds the `keys` bank's lock (`flock`, exclusive) throughout, as
/// writers do. A store that does not exist is refused before anything is
/// written ([`require_store`]). Only the state directories the store keeps
/// in step are looked at and changed ([`KeySource::tree_dirs`]).
pub fn mend(store: &dyn KeySource) -> Result<TreeRepair> {
    const W: &str = "write (mending the key tree)";
    const R: &str = "remove (mending the key tree)";
    require_store(store)?;
    let _lock = bank_lock(store, true)?;
    let root = Dir::open_root(store.dir(), Writer::Tree)?;
    let w = wanted(store)?;
    let found = compare(&root, &w, store.tree_dirs())?;
    let own = ownership(store);
    let mut out = TreeRepair::default();
    let mut dirs: [Option<Dir>; 4] = Default::default();
    for td in store.tree_dirs() {
        dirs[td.index()] = match root.sub(td.name()) {
            Ok(dir) => dir,
            Err(Error::NotARegularFile { .. }) => None,
            Err(e) => return Err(e),
        };
    }
    let removal = |x: &TreeDisagreement| {
        matches!(
            x.problem,
            TreeProblem::Stray | TreeProblem::Withheld | TreeProblem::TempFile
        )
    };
    let name_of = |x: &TreeDisagreement| -> String {
        x.path
            .file_name()
            .map(OsStr::as_bytes)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    // 1. What lets a minion in that the store does not vouch for: strays,
    // and a file holding another key than the store's (a re-key the tree
    // missed), which step 2 writes again. Gone first, so a mend that fails
    // further on leaves no old key that still validates.
    if let Some(dir) = &dirs[TreeDir::Minions.index()] {
        let mut any = false;
        for x in found.iter().filter(|x| {
            x.dir == TreeDir::Minions && (removal(x) || x.problem == TreeProblem::KeyDiffers)
        }) {
            if dir.remove(&name_of(x), R)? {
                if removal(x) {
                    out.removed.push(x.path.clone());
                }
                any = true;
            }
        }
        if any {
            dir.sync()?;
        }
    }
    // 2. Missing and different files.
    let mut wrote = [false; 4];
    let mut items: Vec<Item<'_>> = Vec::new();
    for x in &found {
        let d = x.dir.index();
        match x.problem {
            TreeProblem::Missing | TreeProblem::KeyDiffers => {}
            TreeProblem::NotAFile | TreeProblem::NotADirectory => {
                out.refused.push(x.clone());
                continue;
            }
            _ => continue,
        }
        let Some(id) = &x.id else { continue };
        let Some(pem) = w.files[d].get(id) else {
            continue;
        };
        if dirs[d].is_none() {
            if !matches!(root.entry(x.dir.name())?, Node::Absent) {
                // Not a directory: refused above (NotADirectory).
                continue;
            }
            dirs[d] = Some(root.sub_or_create(x.dir.name(), &own)?);
        }
        items.push(Item {
            dir: d,
            name: id.as_str(),
            pem: pem.as_slice(),
            own,
            absent: false,
        });
        out.written.push(x.path.clone());
        wrote[d] = true;
    }
    // An explicit repair leaves every directory durable.
    write_many(&dirs, &items, DURABLE_ALL, W)?;
    // 3. The other directories' strays, and leftover temporaries: the
    // directories a killed writer was filling among them.
    let mut removed = [false; 4];
    let mut removed_filled = false;
    for x in found
        .iter()
        .filter(|x| x.path.parent() == Some(store.dir()))
    {
        if x.problem == TreeProblem::TempFile {
            root.remove_filled(&name_of(x))?;
            out.removed.push(x.path.clone());
            removed_filled = true;
        }
    }
    if removed_filled {
        root.sync()?;
    }
    for x in found.iter().filter(|x| x.dir != TreeDir::Minions) {
        if !removal(x) {
            continue;
        }
        let d = x.dir.index();
        let Some(dir) = &dirs[d] else { continue };
        if dir.remove(&name_of(x), R)? {
            out.removed.push(x.path.clone());
            removed[d] = true;
        }
    }
    for (d, dir) in dirs.iter().enumerate() {
        if let (true, Some(dir)) = (wrote[d] || removed[d], dir) {
            dir.sync()?;
        }
    }
    Ok(out)
}
