//! [`History::observe`]: the store read, each entry's value compared with
//! the one its version records, and the changes found stamped (see the
//! module's documentation of [`crate::history`]).

use super::*;

/// How an observation stamps what it finds.
#[derive(Clone, Copy)]
pub(super) enum Stamping<'a> {
    /// As changes made since the last observation.
    Changes,
    /// As the values the store was made with ([`begin_if_missing`]), with
    /// the times the caller knows of its revocations.
    Creation(Option<Since<'a>>),
}

impl History {
    /// Observes `store`: every entry whose value is not the one its version
    /// records gets a new version (see the module's documentation), every
    /// recorded entry the store no longer holds a tombstone. `each` sees
    /// every live entry: bank, id, state (`keys`), public key and version.
    /// With `settle`, the entries of a merge in flight are settled (their
    /// previous versions forgotten) and listed in [`Observed::settled`], for
    /// the merge to bring their key tree in step; without it they stay in
    /// flight. Reads take no lock; call it under both banks' locks where the
    /// result must be one moment of the store.
    pub fn observe(
        &mut self,
        store: &Store,
        opts: &HistoryOptions,
        settle: bool,
        each: impl FnMut(Bank, &str, Option<KeyState>, &[u8], Version) -> Result<()>,
    ) -> Result<Observed> {
        self.observe_as(store, opts, settle, Stamping::Changes, each)
    }

    /// [`History::observe`], stamping new entries as `stamping` says.
    pub(super) fn observe_as(
        &mut self,
        store: &Store,
        opts: &HistoryOptions,
        settle: bool,
        stamping: Stamping<'_>,
        mut each: impl FnMut(Bank, &str, Option<KeyState>, &[u8], Version) -> Result<()>,
    ) -> Result<Observed> {
        let now = self.identity.clock.tick(&opts.wall);
        let lower = self.identity.scanned;
        self.mark = self.mark.wrapping_add(1).max(1);
        let mark = self.mark;
        let mut seen = Observed::default();
        // The removals logged since the last save. A new history has
        // nothing for them to revoke: a re-created store is a new store
        // (see `History::load`).
        let (log, read) = keycache::removals::read(store.dir(), self.seq)?;
        self.removals_read = read;
        let mut removed: HashSet<(Bank, &str)> = HashSet::new();
        if self.existed {
            for r in &log {
                removed.insert((if r.denied { Bank::Denied } else { Bank::Keys }, &r.id));
            }
        }
        for (bank, table) in [
            (Bank::Keys, store.keys_table()),
            (Bank::Denied, store.denied_table()),
        ] {
            let (mut idb, mut value) = (Vec::new(), Vec::new());
            let mut it = table.iter()?;
            while let Some(r) = it.next_into(&mut idb, &mut value) {
                let (mtime, slot) = r?;
                let corrupt = |why: String| keycache::Error::Corrupt {
                    path: table.path().into(),
                    id: Some(String::from_utf8_lossy(&idb).into_owned()),
                    why,
                };
                let id =
                    std::str::from_utf8(&idb).map_err(|_| corrupt("the id is not UTF-8".into()))?;
                keycache::id::validate(id)
                    .map_err(|e| corrupt(format!("not a valid minion id: {e}")))?;
                let (state, pem): (Option<KeyState>, &[u8]) = match bank {
                    Bank::Keys => match decode_key_value(&value) {
                        Some((s, pem)) => (Some(s), pem),
                        None => {
                            return Err(corrupt(format!(
                                "slot {slot}: value of {} bytes is not [state 1..3][public key]",
                                value.len()
                            ))
                            .into())
                        }
                    },
                    Bank::Denied => {
                        let mut end = value.len();
                        while end > 0 && value[end - 1] == 0 {
                            end -= 1;
                        }
                        (None, &value[..end])
                    }
                };
                // An empty key is absent to every reader (Salt's driver
                // reads it so): not a value.
                if pem.is_empty() {
                    continue;
                }
                let kind = state.map_or(Kind::Denied, Kind::of_state);
                let hash = value_hash(kind, pem);
                let (rec, moved) = self.entries.entry_at(bank, id, slot);
                self.dirty |= moved;
                rec.mark = mark;
                // Removed since the last save (after its version was
                // made) and here again: a new value, whatever its bytes.
                let back = !removed.is_empty() && removed.contains(&(bank, id));
                if rec.cur.hash != hash || back {
                    // The banks hold the value from before a merge in
                    // flight: the merge did not write it, unless the value
                    // was written after the in-flight save, by a writer
                    // here (the merge writes its own value). That is a
                    // change, which must not take the old value's stamp
                    // when it revokes the merge's accept (the peer's
                    // accept would win at the next merge).
                    let undone = |p: Version| {
                        let revokes = rec.cur.kind == Kind::Accepted && p.kind != Kind::Accepted;
                        !(revokes
                            && self.saved_at > 0
                            && mtime > self.saved_at.saturating_add(WRITTEN_SINCE_MARGIN_NS))
                    };
                    match rec.prev {
                        Some(p) if p.hash == hash && !back && undone(p) => rec.cur = p,
                        _ => {
                            // A pending key where this store knew nothing
                            // of the id (a minion's first sign-in here)
                            // revokes nothing: it takes the first stamp
                            // there is, so that any accept or revocation a
                            // peer made of the id wins over it.
                            let fresh = kind == Kind::Pending
                                && rec.cur == Version::absent(0)
                                && rec.prev.is_none()
                                && !back;
                            let stamp = if let (Stamping::Creation(since), true) =
                                (stamping, rec.cur == Version::absent(0))
                            {
                                // A value the store was made with (see
                                // `begin_if_missing`).
                                match kind {
                                    Kind::Accepted | Kind::Pending => FRESH_PENDING,
                                    _ => since
                                        .and_then(|f| f(bank, id))
                                        .map_or(now, |t| t.clamp(FRESH_PENDING, now)),
                                }
                            } else if fresh {
                                FRESH_PENDING
                            } else if kind == Kind::Accepted {
                                lower.max(rec.cur.stamp.saturating_add(1))
                            } else {
                                now.max(rec.cur.stamp.saturating_add(1))
                            };
                            rec.cur = Version { stamp, kind, hash };
                            seen.changed += 1;
                            // Neither the merge's value nor the one before
                            // it: changed here since, so nothing is in
                            // flight any more, and a later return to the
                            // old value is a change too (not the merge
                            // undone, which would give it its old stamp).
                            if rec.prev.take().is_some() && settle {
                                seen.settled.push((bank, id.to_owned()));
                            }
                        }
                    }
                    self.dirty = true;
                }
                if settle && rec.prev.take().is_some() {
                    seen.settled.push((bank, id.to_owned()));
                    self.dirty = true;
                }
                seen.live += 1;
                each(bank, id, state, pem, rec.cur)?;
            }
        }
        // A logged removal of an entry not here: a tombstone now (the
        // latest it can have happened), over any older one, and over a
        // merge in flight too: a removal logged since the last save is a
        // writer's here (a merge logs none), made after the merge's bank
        // writes or instead of them, so it is not the merge undone.
        for &(bank, id) in &removed {
            let rec = self.entries.entry(bank, id);
            if rec.mark != mark && (rec.cur.kind == Kind::Absent || rec.prev.is_some()) {
                rec.cur = Version::absent(now.max(rec.cur.stamp.saturating_add(1)));
                rec.mark = mark;
                if rec.prev.take().is_some() && settle {
                    seen.settled.push((bank, id.to_owned()));
                }
                seen.changed += 1;
                self.dirty = true;
            }
        }
        for (bank, id, rec) in self.entries.iter_mut() {
            if rec.mark == mark {
                continue;
            }
            if rec.cur.kind != Kind::Absent {
                match rec.prev {
                    Some(p) if p.kind == Kind::Absent => rec.cur = p,
                    _ => {
                        rec.cur = Version::absent(now.max(rec.cur.stamp.saturating_add(1)));
                        seen.changed += 1;
                    }
                }
                self.dirty = true;
            }
            if settle && rec.prev.take().is_some() {
                seen.settled.push((bank, id.to_string()));
                self.dirty = true;
            }
        }
        self.identity.scanned = now;
        Ok(seen)
    }
}
