//! A power-loss disk simulator (Linux): follows a traced process's
//! fsync, fdatasync, msync (by mapping and page range) and every create,
//! rename and unlink in one directory, and builds disk images as a power
//! loss could leave them: each file's content as of its last sync with its
//! unsynced pages kept or dropped page by page (torn tails, old or new
//! length), and a namespace that is a prefix of the directory operations
//! since the last directory fsync.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use std::os::unix::fs::MetadataExt;

use crate::rng::Rng;
use crate::tracer;

const PAGE: usize = 4096;

/// The regular files of a directory: name -> inode.
pub type Listing = BTreeMap<String, u64>;

/// What is durable, and what the page cache holds, of one directory.
pub struct Disk {
    /// The directory followed (canonical).
    pub dir: PathBuf,
    /// Names at the last directory fsync.
    pub durable_ns: Listing,
    /// Names after each namespace change since.
    pub ns_log: Vec<Listing>,
    /// Inode -> content as of its last sync.
    pub durable: HashMap<u64, Vec<u8>>,
    /// Inode -> latest content seen.
    pub latest: HashMap<u64, Vec<u8>>,
    /// The syncs of the directory or its files followed.
    pub syncs: u64,
    /// Every file seen, held open: its inode number is never reused while
    /// the maps above name it.
    held: HashMap<u64, std::fs::File>,
}

/// The regular files of `dir` now.
pub fn listing(dir: &Path) -> Listing {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if let Ok(m) = std::fs::symlink_metadata(e.path()) {
            if m.is_file() {
                out.insert(e.file_name().to_string_lossy().into_owned(), m.ino());
            }
        }
    }
    out
}

impl Disk {
    /// Everything in `dir` is durable now.
    pub fn new(dir: &Path) -> Disk {
        let mut d = Disk {
            dir: dir.canonicalize().unwrap(),
            durable_ns: listing(dir),
            ns_log: Vec::new(),
            durable: HashMap::new(),
            latest: HashMap::new(),
            syncs: 0,
            held: HashMap::new(),
        };
        d.refresh_latest();
        d.durable = d.latest.clone();
        d
    }

    /// Reads what the page cache holds of every file now.
    pub fn refresh_latest(&mut self) {
        for (name, ino) in listing(&self.dir) {
            let p = self.dir.join(&name);
            if let Ok(b) = std::fs::read(&p) {
                self.latest.insert(ino, b);
            }
            if let (std::collections::hash_map::Entry::Vacant(e), Ok(f)) =
                (self.held.entry(ino), std::fs::File::open(&p))
            {
                e.insert(f);
            }
        }
    }

    fn fd_target(pid: i32, fd: u64) -> Option<PathBuf> {
        std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()
    }

    /// Follows one system call exit of the tracee.
    pub fn on_exit(&mut self, s: &tracer::Stop) {
        if s.ret < 0 {
            return;
        }
        let nr = s.nr;
        if nr == libc::SYS_fsync || nr == libc::SYS_fdatasync {
            let Some(target) = Self::fd_target(s.pid, s.args[0]) else {
                return;
            };
            if target == self.dir {
                self.syncs += 1;
                self.durable_ns = listing(&self.dir);
                self.ns_log.clear();
            } else if target.parent() == Some(&self.dir) {
                self.syncs += 1;
                let p = format!("/proc/{}/fd/{}", s.pid, s.args[0]);
                if let (Ok(m), Ok(b)) = (std::fs::metadata(&p), std::fs::read(&p)) {
                    self.latest.insert(m.ino(), b.clone());
                    self.durable.insert(m.ino(), b);
                }
            }
        } else if nr == libc::SYS_msync {
            self.on_msync(s.pid, s.args[0], s.args[1]);
        } else if [
            libc::SYS_rename,
            libc::SYS_renameat,
            libc::SYS_renameat2,
            libc::SYS_unlink,
            libc::SYS_unlinkat,
            libc::SYS_link,
            libc::SYS_linkat,
            libc::SYS_creat,
        ]
        .contains(&nr)
            || ((nr == libc::SYS_openat && s.args[2] & libc::O_CREAT as u64 != 0)
                || (nr == libc::SYS_open && s.args[1] & libc::O_CREAT as u64 != 0))
        {
            let l = listing(&self.dir);
            if self.ns_log.last().unwrap_or(&self.durable_ns) != &l {
                self.refresh_latest();
                self.ns_log.push(l);
            }
        }
    }

    fn on_msync(&mut self, pid: i32, addr: u64, len: u64) {
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            return;
        };
        for line in maps.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 {
                continue;
            }
            let (a, b) = f[0].split_once('-').unwrap();
            let (start, end) = (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            );
            if addr < start || addr >= end {
                continue;
            }
            let off = u64::from_str_radix(f[2], 16).unwrap();
            let ino: u64 = f[4].parse().unwrap_or(0);
            let path = PathBuf::from(f[5..].join(" "));
            if path.parent() != Some(&self.dir) {
                return;
            }
            self.syncs += 1;
            let Ok(cur) = std::fs::read(format!("/proc/{pid}/map_files/{}", f[0])) else {
                return;
            };
            let from = (off + (addr - start)) as usize / PAGE * PAGE;
            let to = ((off + (addr - start) + len) as usize).div_ceil(PAGE) * PAGE;
            let d = self.durable.entry(ino).or_default();
            if d.len() < cur.len() {
                d.resize(cur.len(), 0);
            }
            let to = to.min(cur.len());
            if from < to {
                d[from..to].copy_from_slice(&cur[from..to]);
            }
            self.latest.insert(ino, cur);
            return;
        }
    }

    /// A disk image as power loss now could leave it, written to `to`.
    pub fn image(&self, rng: &mut Rng, to: &Path) {
        self.image_with(rng, to, &HashMap::new(), &HashMap::new());
    }

    /// [`Disk::image`] with the files' contents (durable, latest) by inode
    /// taken from this directory's maps, else from `durable` and `latest`
    /// (the other directories'): a file synced in one directory and
    /// renamed into another keeps what was synced.
    fn image_with(
        &self,
        rng: &mut Rng,
        to: &Path,
        durable: &HashMap<u64, Vec<u8>>,
        latest: &HashMap<u64, Vec<u8>>,
    ) {
        std::fs::create_dir_all(to).unwrap();
        let j = rng.below(self.ns_log.len() as u64 + 1) as usize;
        let names = if j == 0 {
            &self.durable_ns
        } else {
            &self.ns_log[j - 1]
        };
        let torn = rng.below(4) != 0;
        for (name, ino) in names {
            let empty = Vec::new();
            let old = (self.durable.get(ino))
                .or_else(|| durable.get(ino))
                .unwrap_or(&empty);
            let new = (self.latest.get(ino))
                .or_else(|| latest.get(ino))
                .unwrap_or(old);
            let len = if !torn || rng.below(2) == 0 {
                old.len()
            } else {
                new.len()
            };
            let mut out = vec![0u8; len];
            for p in 0..len.div_ceil(PAGE) {
                let (a, b) = (p * PAGE, ((p + 1) * PAGE).min(len));
                let src = if torn && old.get(a..b) != new.get(a..b) && rng.below(2) == 0 {
                    new
                } else {
                    old
                };
                let have = src.len().min(b).saturating_sub(a);
                if have > 0 {
                    out[a..a + have].copy_from_slice(&src[a..a + have]);
                }
            }
            std::fs::write(to.join(name), out).unwrap();
        }
    }
}

/// A directory and some of its subdirectories followed at once (a store
/// and its key tree's state directories), each a [`Disk`] of its own: a
/// power loss image keeps, per directory, a prefix of its operations since
/// its last fsync, and each file as of its last sync.
pub struct Disks {
    /// The directories, by path relative to the first ("" for it).
    pub disks: Vec<(PathBuf, Disk)>,
}

impl Disks {
    /// Everything in `dir` and its subdirectories `subs` (which exist) is
    /// durable now.
    pub fn new(dir: &Path, subs: &[&str]) -> Disks {
        let mut disks = vec![(PathBuf::new(), Disk::new(dir))];
        for s in subs {
            disks.push((PathBuf::from(s), Disk::new(&dir.join(s))));
        }
        Disks { disks }
    }

    /// Follows one system call exit of the tracee, in every directory.
    pub fn on_exit(&mut self, s: &tracer::Stop) {
        for (_, d) in &mut self.disks {
            d.on_exit(s);
        }
    }

    /// Reads what the page cache holds of every file now.
    pub fn refresh_latest(&mut self) {
        for (_, d) in &mut self.disks {
            d.refresh_latest();
        }
    }

    /// The syncs followed, in every directory.
    pub fn syncs(&self) -> u64 {
        self.disks.iter().map(|(_, d)| d.syncs).sum()
    }

    /// A disk image as power loss now could leave it, written to `to`
    /// (each directory at its path under `to`). A file's content is
    /// followed by inode across the directories (a file written and synced
    /// in one, then renamed into another).
    pub fn image(&self, rng: &mut Rng, to: &Path) {
        // Every file seen is held open, so an inode number names one file
        // in every directory's maps.
        let (mut durable, mut latest) = (HashMap::new(), HashMap::new());
        for (_, d) in &self.disks {
            durable.extend(d.durable.iter().map(|(k, v)| (*k, v.clone())));
            latest.extend(d.latest.iter().map(|(k, v)| (*k, v.clone())));
        }
        for (rel, d) in &self.disks {
            d.image_with(rng, &to.join(rel), &durable, &latest);
        }
    }
}
