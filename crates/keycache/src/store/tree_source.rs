//! The store as the `localfs_key` tree sees it ([`crate::tree::KeySource`]):
//! the tree module lies below the store and reaches it only through this.

use std::path::Path;

use super::{KeyState, Store};
use crate::error::Result;
use crate::files::Ownership;

impl crate::tree::KeySource for Store {
    fn dir(&self) -> &Path {
        Store::dir(self)
    }

    fn keys_index(&self) -> &Path {
        self.keys_table().path()
    }

    fn ownership(&self) -> Ownership {
        self.keys_table().ownership()
    }

    fn each_key(&self, f: &mut dyn FnMut(String, KeyState, Vec<u8>)) -> Result<()> {
        for r in self.keys(None)? {
            let (id, e) = r?;
            f(id, e.state, e.public_key);
        }
        Ok(())
    }

    fn each_denied(&self, f: &mut dyn FnMut(String, Vec<u8>)) -> Result<()> {
        for r in self.denied_keys()? {
            let (id, pem) = r?;
            f(id, pem);
        }
        Ok(())
    }

    fn tree_dirs(&self) -> &'static [crate::tree::TreeDir] {
        self.tree().dirs()
    }
}
