//! The migration's plan: the tree merged with what the target banks hold
//! (unless `replace`), checked against the load factor, and the two bank
//! images built from it.

use super::*;

impl Tree {
    /// Merges the tree with what the target banks hold (unless `replace`)
    /// and checks the load factor.
    pub(super) fn plan(
        &self,
        store: Option<&Store>,
        target: &Path,
        opts: &MigrateOptions,
    ) -> Result<MigrationPlan> {
        let kpath = target.join(KEYS_INDEX);
        let dpath = target.join(DENIED_INDEX);
        let mut plan = MigrationPlan::default();
        let mut placed = vec![false; self.keys.len()];
        let mut dplaced = vec![false; self.denied.len()];
        if let Some(store) = store {
            // Position in `keys` / `denied` of each tree key, by id.
            let kpos: Vec<usize> = (0..self.keys.len()).collect();
            let mut by_id: Option<Vec<usize>> = None;
            for r in store.keys_table().iter()? {
                let r = r?;
                let id = String::from_utf8_lossy(&r.id).into_owned();
                let sorted = by_id.get_or_insert_with(|| {
                    let mut v = kpos.clone();
                    v.sort_unstable_by(|&a, &b| self.id(self.keys[a]).cmp(self.id(self.keys[b])));
                    v
                });
                let hit = sorted
                    .binary_search_by(|&p| self.id(self.keys[p]).cmp(&id))
                    .ok()
                    .map(|x| sorted[x]);
                if let Some(p) = hit {
                    placed[p] = true;
                    let i = self.keys[p];
                    plan.keys.push(Src::Tree(i));
                    // A value that does not decode is replaced, as before.
                    if let Some((from, _)) = crate::store::decode_key_value(&r.value) {
                        if from != self.state(i) {
                            plan.changes.push(PlanChange {
                                id,
                                from,
                                tree: Some(i),
                                store_mtime: r.mtime,
                            });
                        }
                    }
                } else if opts.replace {
                    if let Some((from, _)) = crate::store::decode_key_value(&r.value) {
                        plan.changes.push(PlanChange {
                            id: id.clone(),
                            from,
                            tree: None,
                            store_mtime: r.mtime,
                        });
                    }
                    plan.dropped += 1;
                    plan.dropped_keys.push(id);
                } else {
                    let (state, _) =
                        crate::store::decode_key_value(&r.value).ok_or_else(|| Error::Corrupt {
                            path: kpath.clone(),
                            id: Some(id.clone()),
                            why: "existing value is not [state][public key]; repair the bank first"
                                .into(),
                        })?;
                    bump(&mut plan.kept, TreeDir::of(state));
                    plan.keys.push(Src::Kept(plan.kept_keys.len()));
                    plan.kept_keys.push((id, r.value, r.mtime));
                }
            }
            let mut by_id: Option<Vec<usize>> = None;
            for r in store.denied_table().iter()? {
                let r = r?;
                let id = String::from_utf8_lossy(&r.id).into_owned();
                let sorted = by_id.get_or_insert_with(|| {
                    let mut v: Vec<usize> = (0..self.denied.len()).collect();
                    v.sort_unstable_by(|&a, &b| {
                        self.id(self.denied[a]).cmp(self.id(self.denied[b]))
                    });
                    v
                });
                let hit = sorted
                    .binary_search_by(|&p| self.id(self.denied[p]).cmp(&id))
                    .ok()
                    .map(|x| sorted[x]);
                if let Some(p) = hit {
                    dplaced[p] = true;
                    plan.denied.push(Src::Tree(self.denied[p]));
                } else if opts.replace {
                    plan.dropped += 1;
                    plan.dropped_denied.push(id);
                } else {
                    plan.kept.denied += 1;
                    plan.denied.push(Src::Kept(plan.kept_denied.len()));
                    plan.kept_denied.push((id, r.value, r.mtime));
                }
            }
        }
        plan.keys.extend(
            self.keys
                .iter()
                .zip(&placed)
                .filter(|(_, p)| !**p)
                .map(|(&i, _)| Src::Tree(i)),
        );
        plan.denied.extend(
            self.denied
                .iter()
                .zip(&dplaced)
                .filter(|(_, p)| !**p)
                .map(|(&i, _)| Src::Tree(i)),
        );
        check_load(&kpath, plan.keys.len() as u64, &opts.params)?;
        check_load(&dpath, plan.denied.len() as u64, &opts.params)?;
        let mut total = Counts::default();
        for s in &plan.keys {
            let state = match *s {
                Src::Tree(i) => self.state(i),
                // Checked when kept.
                Src::Kept(i) => crate::store::decode_key_value(&plan.kept_keys[i].1)
                    .map(|(s, _)| s)
                    .unwrap_or(KeyState::Accepted),
            };
            bump(&mut total, TreeDir::of(state));
        }
        total.denied = plan.denied.len() as u64;
        plan.total = total;
        plan.load_factor = plan.keys.len() as f64 / opts.params.capacity() as f64;
        Ok(plan)
    }

    /// The changes of state of `plan`, with the files that make them
    /// (read from the tree at `pki_dir`).
    pub(super) fn changes(&self, plan: &MigrationPlan, pki_dir: &Path) -> Vec<StateChange> {
        plan.changes
            .iter()
            .map(|c| {
                let (to, file, file_mtime) = match c.tree {
                    Some(i) => {
                        let k = &self.found[i];
                        (
                            Some(self.state(i)),
                            Some(pki_dir.join(k.dir.name()).join(&c.id)),
                            Some(k.span.mtime),
                        )
                    }
                    None => (None, None, None),
                };
                let stale = matches!(c.from, KeyState::Accepted | KeyState::Rejected)
                    && file_mtime.is_some_and(|m| m < c.store_mtime);
                StateChange {
                    id: c.id.clone(),
                    from: c.from,
                    to,
                    file,
                    file_mtime,
                    store_mtime: c.store_mtime,
                    stale,
                }
            })
            .collect()
    }

    /// Refuses, unless `opts.replace_states`, the changes of `plan` out of
    /// accepted or rejected that files older than the store's entries make
    /// ([`Error::StaleTreeFiles`]).
    pub(super) fn check_stale(
        &self,
        plan: &MigrationPlan,
        pki_dir: &Path,
        opts: &MigrateOptions,
    ) -> Result<()> {
        if opts.replace_states {
            return Ok(());
        }
        let stale: Vec<StateChange> = self
            .changes(plan, pki_dir)
            .into_iter()
            .filter(|c| c.stale)
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        const SHOWN: usize = 20;
        let mut entries: Vec<String> = stale
            .iter()
            .take(SHOWN)
            .map(|c| {
                format!(
                    "{:?}: store {}, {} {}",
                    c.id,
                    c.from,
                    c.file
                        .as_deref()
                        .map(|f| f.display().to_string())
                        .unwrap_or_default(),
                    c.to.map_or("absent", KeyState::name)
                )
            })
            .collect();
        if stale.len() > SHOWN {
            entries.push(format!("and {} more", stale.len() - SHOWN));
        }
        Err(Error::StaleTreeFiles {
            dir: pki_dir.into(),
            count: stale.len(),
            entries: entries.join(", "),
        })
    }

    /// Both bank images of `plan`.
    pub(super) fn images(
        &self,
        plan: &MigrationPlan,
        target: &Path,
        params: Params,
    ) -> Result<(Image, Image)> {
        let kpath = target.join(KEYS_INDEX);
        let dpath = target.join(DENIED_INDEX);
        let mut kimg = Image::with_shared(params, self.parts.clone())?;
        let mut dimg = Image::with_shared(params, self.parts.clone())?;
        // Only kept entries are copied into the images; the tree's records
        // are written from the readers' buffers.
        let bytes = |kept: &[KeptEntry]| -> usize { kept.iter().map(|k| k.1.len()).sum() };
        kimg.reserve_slots(plan.keys.len());
        kimg.reserve(plan.kept_keys.len(), bytes(&plan.kept_keys));
        dimg.reserve_slots(plan.denied.len());
        dimg.reserve(plan.kept_denied.len(), bytes(&plan.kept_denied));
        for id in &plan.dropped_keys {
            kimg.allow_dropping(id.as_bytes());
        }
        for id in &plan.dropped_denied {
            dimg.allow_dropping(id.as_bytes());
        }
        let tree_insert = |img: &mut Image, i: usize, path: &Path| {
            let (buf, range) = self.record(i);
            let k = &self.found[i];
            img.insert_record(
                self.id(i).as_bytes(),
                buf,
                range,
                self.value_len(i),
                k.span.mtime,
                path,
            )
        };
        for s in &plan.keys {
            match *s {
                Src::Tree(i) => tree_insert(&mut kimg, i, &kpath)?,
                Src::Kept(i) => {
                    let (id, value, mtime) = &plan.kept_keys[i];
                    kimg.insert(id.as_bytes(), value, *mtime, &kpath)?
                }
            }
        }
        for s in &plan.denied {
            match *s {
                Src::Tree(i) => tree_insert(&mut dimg, i, &dpath)?,
                Src::Kept(i) => {
                    let (id, value, mtime) = &plan.kept_denied[i];
                    dimg.insert(id.as_bytes(), value, *mtime, &dpath)?
                }
            }
        }
        Ok((kimg, dimg))
    }
}
