//! Replacing a store's whole contents at once: both banks rebuilt from the
//! entries given, in one atomic rebuild through the journal (a reader, or a
//! crash, sees the old banks or the new ones, never a mix), with the key
//! tree brought in step in [`crate::tree`]'s order around it. For a replica
//! that is made equal to a full copy of the key state (an etcd list).

use std::collections::BTreeMap;

use super::*;
use crate::image::Image;
use crate::key::{encode_key_value, KeyState};

/// Both banks' contents: the `keys` entries (state, public key) and the
/// denied keys, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contents {
    /// The `keys` bank.
    pub keys: BTreeMap<MinionId, (KeyState, Vec<u8>)>,
    /// The `denied_keys` bank.
    pub denied: BTreeMap<MinionId, Vec<u8>>,
}

impl Store {
    /// Makes both banks hold exactly `contents`, in one atomic rebuild under
    /// both banks' locks (`keys` first), every entry written now. With the
    /// tree on ([`Store::set_tree`]), the tree of every id the store held or
    /// will hold is brought in step: `minions/` files the store will no
    /// longer vouch for are removed before the banks are replaced, the new
    /// files written after. Each value is checked as a write checks it (a
    /// public key, no private key block, an id the table can hold) before
    /// anything is written; contents that do not fit the table are refused.
    pub fn replace_all(&self, contents: &Contents) -> Result<TreeChanges> {
        for (id, (_, pem)) in &contents.keys {
            batch::check_pem(id, pem)?;
            self.keys.check_id(id.as_str().as_bytes())?;
        }
        for (id, pem) in &contents.denied {
            batch::check_pem(id, pem)?;
            self.denied.check_id(id.as_str().as_bytes())?;
        }
        let (kt, dt) = (&self.keys, &self.denied);
        let sync = std::cell::RefCell::new(None);
        let wants = std::cell::RefCell::new(Vec::new());
        let changes = std::cell::RefCell::new(TreeChanges::default());
        let done = crate::rebuild::replace_then(
            &[kt, dt],
            || {
                self.resume_before_write()?;
                let mut kimg = Image::new(*kt.params())?;
                let mut dimg = Image::new(*dt.params())?;
                let now = crate::files::now_ns();
                for (id, (state, pem)) in &contents.keys {
                    let v = encode_key_value(*state, pem);
                    kimg.insert(id.as_str().as_bytes(), &v, now, kt.path())?;
                }
                for (id, pem) in &contents.denied {
                    dimg.insert(id.as_str().as_bytes(), pem, now, dt.path())?;
                }
                for (t, img) in [(kt, &mut kimg), (dt, &mut dimg)] {
                    for id in t.live_ids()? {
                        img.allow_dropping(&id);
                    }
                }
                if self.tree.is_on() {
                    let w = self.wants_replacing(contents)?;
                    let mut s = crate::tree::Sync::plan(self, &w)?;
                    s.before()?;
                    *sync.borrow_mut() = Some(s);
                    *wants.borrow_mut() = w;
                }
                Ok(vec![kimg, dimg])
            },
            || {
                if let Some(s) = sync.borrow_mut().take() {
                    *changes.borrow_mut() = s.after(&wants.borrow())?;
                }
                Ok(())
            },
        );
        if let Err(e) = done {
            // The banks are as they were: the tree's early removals undone
            // as far as they can be.
            if let Some(s) = sync.borrow_mut().take() {
                let now: Result<Vec<(MinionId, Want)>> = wants
                    .borrow()
                    .iter()
                    .map(|(id, _)| {
                        let k = self.get(id)?.map(|e| (e.state, e.public_key));
                        Ok((id.clone(), want_of(k, self.denied(id)?)))
                    })
                    .collect();
                if let Ok(now) = now {
                    let _ = s.after(&now);
                }
            }
            return Err(e);
        }
        Ok(changes.into_inner())
    }

    /// What the tree must hold, once the banks hold `contents`, for every
    /// id the store holds now or will hold.
    fn wants_replacing(&self, contents: &Contents) -> Result<Vec<(MinionId, Want)>> {
        let mut ids: std::collections::BTreeSet<MinionId> = contents.keys.keys().cloned().collect();
        ids.extend(contents.denied.keys().cloned());
        for t in [&self.keys, &self.denied] {
            for id in t.live_ids()? {
                if let Ok(id) = MinionId::new(String::from_utf8_lossy(&id).into_owned()) {
                    ids.insert(id);
                }
            }
        }
        Ok(ids
            .into_iter()
            .map(|id| {
                let k = contents.keys.get(&id).cloned();
                let d = contents.denied.get(&id).cloned();
                let w = want_of(k, d);
                (id, w)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{pem, small_store};

    fn id(s: &str) -> MinionId {
        MinionId::new(s).expect("id")
    }

    #[test]
    fn the_banks_and_the_tree_become_the_contents_and_nothing_else() -> Result<()> {
        let t = tempfile::tempdir().expect("dir");
        let s = small_store(t.path()).with_tree(TreeSync::On);
        s.put(&id("gone"), KeyState::Accepted, &pem("gone"))?;
        s.put(&id("stays"), KeyState::Pending, &pem("stays"))?;
        let mut c = Contents::default();
        c.keys
            .insert(id("stays"), (KeyState::Accepted, pem("stays")));
        c.keys.insert(id("new"), (KeyState::Rejected, pem("new")));
        c.denied.insert(id("stays"), pem("other"));
        let changes = s.replace_all(&c)?;
        assert_eq!(s.get(&id("gone"))?, None);
        assert_eq!(
            s.get(&id("stays"))?.map(|e| e.state),
            Some(KeyState::Accepted)
        );
        assert_eq!(
            s.get(&id("new"))?.map(|e| e.state),
            Some(KeyState::Rejected)
        );
        assert_eq!(s.denied(&id("stays"))?, Some(pem("other")));
        let d = t.path();
        assert!(!d.join("minions/gone").exists());
        assert!(d.join("minions/stays").is_file() && !d.join("minions_pre/stays").exists());
        assert!(d.join("minions_rejected/new").is_file());
        assert!(d.join("minions_denied/stays").is_file());
        assert!(
            changes.removed.iter().any(|p| p.ends_with("minions/gone")),
            "{changes:?}"
        );
        assert!(crate::tree::check(&s)?.is_empty());
        Ok(())
    }

    #[test]
    fn a_private_key_or_an_id_too_long_is_refused_before_anything_is_written() -> Result<()> {
        let t = tempfile::tempdir().expect("dir");
        let s = small_store(t.path()).with_tree(TreeSync::On);
        s.put(&id("kept"), KeyState::Accepted, &pem("kept"))?;
        let mut c = Contents::default();
        c.keys.insert(
            id("bad"),
            (
                KeyState::Accepted,
                b"-----BEGIN RSA PRIVATE KEY-----\nA\n-----END RSA PRIVATE KEY-----\n".to_vec(),
            ),
        );
        assert!(s.replace_all(&c).is_err());
        let mut c = Contents::default();
        c.keys
            .insert(id(&"x".repeat(200)), (KeyState::Accepted, pem("x")));
        assert!(s.replace_all(&c).is_err());
        assert_eq!(
            s.get(&id("kept"))?.map(|e| e.state),
            Some(KeyState::Accepted)
        );
        assert!(t.path().join("minions/kept").is_file());
        Ok(())
    }
}
