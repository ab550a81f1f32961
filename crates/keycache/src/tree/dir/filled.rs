//! A state directory filled whole under a temporary name in the pki dir
//! and renamed into place (see the tree module's header): made, placed,
//! found and removed when a killed writer left it.

use super::*;

impl Dir {
    /// The state directory `name`, absent, made anew under a temporary name
    /// of this process ([`filled_name`]) to be filled whole and then
    /// renamed into place ([`Dir::place_filled`]): Salt sees no directory,
    /// then every file, never a partial one. Messages name the directory by
    /// the name it will have. One left by an earlier failure of this
    /// process is removed first.
    pub(crate) fn create_filled(&self, name: &str, own: &Ownership) -> Result<Dir> {
        let tmp = filled_name(std::process::id(), name);
        if let Node::Other(_) = self.entry(&tmp)? {
            self.remove_filled(&tmp)?;
        }
        let mut d = self.mkdir(&tmp, own)?;
        d.path = self.shown(name);
        d.fill = true;
        Ok(d)
    }

    /// Renames the filled directory `filled` ([`Dir::create_filled`] of
    /// `name`) into place, without replacing anything, and makes that
    /// durable. When `name` was taken meanwhile (by Salt making its state
    /// directories, say) or the filesystem cannot rename without
    /// replacing, each of `names` is moved into that directory instead
    /// (one not regular there is refused), and the filled one removed.
    /// Returns the directory now under `name`.
    pub(crate) fn place_filled(
        &self,
        filled: Dir,
        name: &str,
        names: &[&str],
        own: &Ownership,
        op: &'static str,
    ) -> Result<Dir> {
        let tmp = filled_name(std::process::id(), name);
        let shown = self.shown(name);
        match rustix::fs::renameat_with(
            &self.fd,
            tmp.as_str(),
            &self.fd,
            name,
            rustix::fs::RenameFlags::NOREPLACE,
        ) {
            Ok(()) => {
                self.sync()?;
                return Ok(Dir {
                    fill: false,
                    ..filled
                });
            }
            Err(rustix::io::Errno::EXIST | rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(Error::io(&shown, op, e.into())),
        }
        let to = self.sub_or_create(name, own)?;
        for n in names {
            match rustix::fs::renameat_with(
                &filled.fd,
                *n,
                &to.fd,
                *n,
                rustix::fs::RenameFlags::NOREPLACE,
            ) {
                Ok(()) => continue,
                Err(rustix::io::Errno::EXIST | rustix::io::Errno::INVAL) => {}
                Err(e) => return Err(Error::io(to.shown(n), op, e.into())),
            }
            match to.entry(n)? {
                Node::Other(m) => {
                    return Err(self.by.not_a_key_file(&to.shown(n), m.not_regular()))
                }
                _ => filled
                    .rename_to(n, &to, n)
                    .map_err(|e| Error::io(to.shown(n), op, e))?,
            }
        }
        self.remove_filled(&tmp)?;
        Ok(to)
    }

    /// The directories of this one (the pki dir) that a writer was filling
    /// for state directory `dir` ([`Dir::create_filled`]) and never placed;
    /// with `dead_only`, only those of writers that are gone
    /// ([`is_dead_temporary`]).
    pub(crate) fn filled_dirs(&self, dir: &str, dead_only: bool) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for name in self.names()? {
            let Some(n) = name.to_str() else { continue };
            let Some((pid, of)) = n.strip_prefix(TEMP_PREFIX).and_then(|r| r.split_once('.'))
            else {
                continue;
            };
            if of != dir || pid.parse::<u32>().is_err() || (dead_only && !is_dead_temporary(n)) {
                continue;
            }
            if let Node::Other(m) = self.entry(n)? {
                if m.mode & libc::S_IFMT == libc::S_IFDIR {
                    out.push(n.to_owned());
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes the directory `name` of this one, a filled directory never
    /// placed ([`Dir::create_filled`]): its entries (none followed), then
    /// itself. A directory inside it is refused.
    pub(crate) fn remove_filled(&self, name: &str) -> Result<()> {
        let shown = self.shown(name);
        let Some(d) = self.sub(name)? else {
            return Ok(());
        };
        for n in d.names()? {
            match rustix::fs::unlinkat(&d.fd, n.as_os_str(), rustix::fs::AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(Error::io(d.shown(&n), "remove", e.into())),
            }
        }
        match rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(Error::io(&shown, "remove directory", e.into())),
        }
    }
}

/// The temporary name of state directory `dir` being filled by process
/// `pid` ([`Dir::create_filled`]): `.keycache-tree.<pid>.<dir>`, a dot-name
/// Salt passes over, which [`is_dead_temporary`] tells once `pid` is gone.
pub(crate) fn filled_name(pid: u32, dir: &str) -> String {
    format!("{TEMP_PREFIX}{pid}.{dir}")
}
