//! The writer's locks (this process's mutex, then `flock` on the bank's
//! `.lock` file), the writer's mapping of the index, bank creation, and
//! roster recovery.

use super::*;

impl Table {
    /// Runs `f` holding the bank's write lock (this process's mutex, then
    /// `flock` on the `.lock` file). `f` gets the index mapped for writing,
    /// (re)opened on the current file, creating the bank when `create`.
    pub(super) fn with_lock<T>(
        &self,
        create: bool,
        f: impl FnOnce(Option<&Index>) -> Result<T>,
    ) -> Result<T> {
        self.locked(|ws| {
            let r = self
                .open_writer(&mut ws.index, &mut ws.seen, create)
                .and_then(|()| f(ws.index.as_ref()));
            if r.is_err() {
                // A write that failed half-way (an I/O error after the
                // header's in-flight count: `Table::apply`) is mended by the
                // roster check of the next open: this handle opens afresh.
                ws.index = None;
            }
            if ws.index.is_some() {
                ws.seen = index_stamp(&self.path);
            }
            r
        })
    }

    /// Runs `f` holding this process's writer mutex and `flock` on the
    /// bank's `.lock` file. A rebuild that a crash interrupted is finished
    /// first.
    fn locked<T>(&self, f: impl FnOnce(&mut WriterState) -> Result<T>) -> Result<T> {
        self.locked_within(None, f)
    }

    /// Runs `f` holding the bank's locks, as a writer does, without using
    /// the writer's mapping: for reads that must see no write half-made
    /// (a snapshot of both banks). The `flock` is waited for at most
    /// `wait`, then [`Error::Busy`].
    /// `f`'s error is the caller's own (a crate over the engine has its
    /// own error type), the lock's converted into it.
    pub fn read_locked<T, E: From<Error>>(
        &self,
        wait: Duration,
        f: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        self.locked_within(Some(wait), |_| {
            self.refresh(true)?;
            Ok(f())
        })?
    }

    /// [`Table::locked`], waiting for the `flock` at most `wait` when given.
    fn locked_within<T>(
        &self,
        wait: Option<Duration>,
        f: impl FnOnce(&mut WriterState) -> Result<T>,
    ) -> Result<T> {
        // A writer that panicked left nothing half-done in this state that
        // the next one does not re-establish (it reopens and re-checks the
        // files), so a poisoned mutex is taken over.
        let mut guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let ws = &mut *guard;
        let lock_path = || format::lock_path(&self.path);
        let mut replaced = 0;
        let lock = loop {
            let lock = match ws.lock.take() {
                Some(lock) => lock,
                None => self.open_lock_file()?,
            };
            let taken = match wait {
                None => lock.lock().map_err(|e| Error::io(lock_path(), "flock", e)),
                Some(wait) => lock_within(&lock, wait).map_err(|e| match e {
                    None => Error::Busy {
                        path: lock_path(),
                        waited: wait,
                    },
                    Some(e) => Error::io(lock_path(), "flock", e),
                }),
            };
            if let Err(e) = taken {
                ws.lock = Some(lock);
                return Err(e);
            }
            // A wipe of the bank (`flush(bank)`, Salt's or keycache's)
            // removes the lock file too: a lock taken on the removed file
            // (this handle's, opened before) excludes no one who opens the
            // path now. Taken on the file the path names, or taken again.
            let held = lock.metadata().ok().map(|m| (m.dev(), m.ino()));
            if held.is_some() && held == files::file_id(&lock_path()) {
                break lock;
            }
            let _ = lock.unlock();
            replaced += 1;
            if replaced > 100 {
                return Err(Error::io(
                    lock_path(),
                    "flock",
                    std::io::Error::other("the lock file kept being replaced while it was locked"),
                ));
            }
        };
        let result =
            crate::journal::roll_forward(&self.dir, Some(&lock_path()), self.rebuild_settle)
                .and_then(|()| f(ws));
        let unlock = lock
            .unlock()
            .map_err(|e| Error::io(lock_path(), "unlock", e));
        ws.lock = Some(lock);
        let out = result?;
        unlock?;
        Ok(out)
    }

    /// Runs `f` under the bank's write lock with the writer's cached mapping
    /// dropped (the files are about to be replaced); readers are moved to
    /// the new files afterwards.
    pub(crate) fn exclusive<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let r = self.locked(|ws| {
            ws.index = None;
            ws.seen = None;
            f()
        });
        // After a compaction into another size this handle no longer
        // matches the files; its readers keep the old view until reopened.
        let _ = self.refresh(true);
        r
    }

    /// Finishes a rebuild that a crash interrupted, if any.
    pub(crate) fn finish_interrupted(&self) -> Result<()> {
        self.locked(|_| Ok(()))
    }

    fn open_lock_file(&self) -> Result<File> {
        let path = format::lock_path(&self.path);
        match files::open_regular(&path, true) {
            Ok(f) => Ok(f),
            Err(e) if e.is_not_found() => match files::create_new(&path, &self.ownership) {
                Ok(f) => Ok(f),
                // Another process created it meanwhile.
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    files::open_regular(&path, true)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Under the lock: maps the current index for writing (creating the
    /// bank when `create`), stamps the magic, and, when another process
    /// wrote since this one last did, repairs a roster that a crash left
    /// behind (as Salt's writers do on open).
    fn open_writer(
        &self,
        cached: &mut Option<Index>,
        seen: &mut Option<(u64, u64, i64, i64)>,
        create: bool,
    ) -> Result<()> {
        let p = &self.params;
        let on_disk = files::file_id(&self.path);
        if on_disk.is_none() {
            *cached = None;
            if !create {
                return Ok(());
            }
            self.create_bank()?;
        }
        let stamp = index_stamp(&self.path);
        if let Some(ix) = cached.as_ref() {
            if Some(ix.dev_ino) == files::file_id(&self.path) && stamp == *seen {
                return Ok(());
            }
        }
        let file = files::open_regular(&self.path, true)?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(&self.path, "stat", e))?;
        check_index_len(&self.path, p, meta.len())?;
        let dev_ino = (meta.dev(), meta.ino());
        // A file this handle has not written yet: establish that the layout
        // is the files' own before the first write (and before roster
        // recovery, which would act on misread slots).
        if cached.as_ref().map(|ix| ix.dev_ino) != Some(dev_ino) {
            crate::fit::check(&self.path, p)?;
        }
        let map = Mapping::read_write(&file, meta.len() as usize)
            .map_err(|e| Error::io(&self.path, "mmap", e))?;
        let index = Index { map, dev_ino };
        if index.map.load_u8(0) != Some(HEADER_MAGIC) {
            index.map.store_u8(0, HEADER_MAGIC);
            index
                .map
                .flush_range(0, p.slot_size)
                .map_err(|e| Error::io(&self.path, "msync", e))?;
        }
        self.recover_roster(&index)?;
        *cached = Some(index);
        if self.gen.load().index.as_ref().map(|i| i.dev_ino) != Some(dev_ino) {
            self.refresh(true)?;
        }
        Ok(())
    }

    /// Creates a zero-filled index (magic stamped) and an empty heap, through
    /// a temporary name so that no one ever sees a short index.
    fn create_bank(&self) -> Result<()> {
        let p = &self.params;
        let heap0 = heap::segment_path(&self.path, 0);
        if files::file_id(&heap0).is_none() {
            let f = files::create_new(&heap0, &self.ownership)?;
            files::sync_data(&f, &heap0)?;
        }
        let tmp = format::new_index_path(&self.path, std::process::id());
        files::remove_if_exists(&tmp)?;
        let f = files::create_new(&tmp, &self.ownership)?;
        let len = p.index_len().unwrap_or(0);
        files::allocate(&f, &tmp, len)?;
        f.write_all_at(&[HEADER_MAGIC], 0)
            .map_err(|e| Error::io(&tmp, "write", e))?;
        files::sync_data(&f, &tmp)?;
        files::rename(&tmp, &self.path)?;
        files::sync_dir(&self.dir)
    }

    /// Salt's `_roster_recover`: when the roster's live count differs from
    /// the header's occupied count (a writer was killed mid-batch: see
    /// `Table::apply`), bring the roster and both counters in step with the
    /// slots.
    fn recover_roster(&self, ix: &Index) -> Result<()> {
        let p = &self.params;
        let rpath = format::roster_path(&self.path);
        let entries = roster::read(&rpath)?;
        let header = read_header(&ix.map);
        if roster::live_count(&entries) as u64 == header.occupied {
            return Ok(());
        }
        let end = header.high_water.saturating_add(2).min(p.size);
        let mut slots = Vec::new();
        let mut deleted = 0u64;
        for s in 1..end {
            match ix.map.load_u8(p.slot_offset(s)) {
                Some(OCCUPIED) => slots.push(s as u32),
                Some(DELETED) => deleted += 1,
                _ => {}
            }
        }
        // Patched in place, not rewritten: the entries it has right keep
        // their order and their byte offsets. A Salt writer remembers the
        // offset of every entry it appended and tombstones it there later,
        // through a descriptor it keeps open while the index looks unchanged
        // to it (its staleness check runs at most every 0.25 s): a roster
        // replaced under it would take that tombstone (or its next append)
        // into the old, unlinked file.
        let live: HashSet<u32> = slots.iter().copied().collect();
        let mut seen = HashSet::new();
        let mut dead = Vec::new();
        for (i, s) in entries.iter().enumerate() {
            if *s != format::ROSTER_TOMBSTONE && !(live.contains(s) && seen.insert(*s)) {
                dead.push(i);
            }
        }
        let missing: Vec<u32> = slots
            .iter()
            .copied()
            .filter(|s| !seen.contains(s))
            .collect();
        let rf = match files::open_regular(&rpath, true) {
            Ok(f) => f,
            Err(e) if e.is_not_found() => files::create_new(&rpath, &self.ownership)?,
            Err(e) => return Err(e),
        };
        roster::patch(&rpath, &rf, &dead, &missing)?;
        files::sync_data(&rf, &rpath)?;
        let header = Header {
            occupied: slots.len() as u64,
            deleted,
            ..header
        };
        ix.map
            .copy_in(format::HDR_OCCUPIED, &header.encode_counters());
        ix.map
            .flush_range(0, p.slot_size)
            .map_err(|e| Error::io(&self.path, "msync", e))
    }
}

/// Takes `flock(LOCK_EX)` on `f`, trying for at most `wait` (sleeps from
/// 1 ms doubling to 50 ms); `Err(None)` when it stayed taken.
fn lock_within(f: &File, wait: Duration) -> std::result::Result<(), Option<std::io::Error>> {
    let start = std::time::Instant::now();
    let mut nap = Duration::from_millis(1);
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::Error(e)) => return Err(Some(e)),
            Err(std::fs::TryLockError::WouldBlock) => {}
        }
        let spent = start.elapsed();
        if spent >= wait {
            return Err(None);
        }
        std::thread::sleep(nap.min(wait - spent));
        nap = (nap * 2).min(Duration::from_millis(50));
    }
}
