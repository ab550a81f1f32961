//! A live store without the key tree Salt reads.

use super::*;

/// A [`FindingKind::NoKeyTree`] finding when `store` holds accepted keys
/// and its directory has no `minions` entry (not followed): Salt 3008.5's
/// `validate_token` (salt/channel/server.py) reads `<dir>/minions/<id>`
/// from disk on every request of a signed-in minion, whatever the key
/// cache driver, so every accepted minion is refused there; and the
/// store's writes keep no tree in step where it has none
/// ([`crate::tree::TreeSync::auto`]). `None` when the store holds no
/// accepted key, or has a `minions` entry (which [`crate::tree::check`]
/// then compares with the store). The tree is written by
/// [`crate::tree::mend`] (`keycache verify --repair`).
pub fn missing_key_tree(store: &crate::Store) -> Result<Option<Finding>> {
    let minions = store.dir().join(crate::tree::TreeDir::Minions.name());
    match std::fs::symlink_metadata(&minions) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Ok(_) => return Ok(None),
        Err(e) => return Err(crate::Error::io(&minions, "lstat", e)),
    }
    let accepted = store.counts()?.accepted;
    if accepted == 0 {
        return Ok(None);
    }
    Ok(Some(Finding {
        kind: FindingKind::NoKeyTree,
        file: minions.clone(),
        slot: None,
        offset: None,
        id: None,
        what: format!(
            "no key tree: the store holds {accepted} accepted keys, but {} does not exist; \
             Salt's validate_token reads {}/<id> on every request of a signed-in minion, so \
             every accepted minion is refused, and later accepts keep no tree (keycache \
             verify --repair writes it)",
            minions.display(),
            minions.display()
        ),
        repairable: FindingKind::NoKeyTree.repairable(),
    }))
}
