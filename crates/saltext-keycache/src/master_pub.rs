//! `<pki_dir>/master.pub`, kept in step with the master's public key in
//! the `master_keys` bank.
//!
//! Salt 3008.5 reads the master's public key from disk, whatever the key
//! cache driver: `MasterKeys.master_pub_path` is `<pki_dir>/master.pub`
//! (salt/crypt.py), read by the cluster's `discover_peers` and
//! `public_key` (salt/channel/server.py); a cluster master whose key lives
//! only in the bank fails at start with `FileNotFoundError`. Through the
//! cache, `MasterKeys._setup_keys` stores the key pair as `master.pem` and
//! `master.pub` on a first start, then copies it to `<master_id>.pem` and
//! `<master_id>.pub` and flushes the first two; later starts only read
//! `<master_id>.pub`. So the file holds the bank's `<master_id>.pub`, else
//! its `master.pub`, and is brought in step when the bank is opened and
//! after every store or flush of those two names. A bank that holds
//! neither leaves the file as it is; a value holding a private key block
//! is never written. The file is written as Salt's key files are, mode
//! 0644 (a public key), atomically (a temporary created beside it, fsynced,
//! renamed over it), and a symlink in its place is replaced, never
//! followed. Only the driver of the master's own store directory keeps the
//! file (a `Cache` opened on another directory does not).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use keycache::table::Table;

/// The master's public key file and the bank names that feed it.
#[derive(Debug, Clone)]
pub(crate) struct MasterPub {
    path: PathBuf,
    /// `<master_id>.pub` (preferred, when the id is known), `master.pub`.
    names: Vec<Vec<u8>>,
}

fn io(path: &Path, op: &'static str, e: std::io::Error) -> keycache::Error {
    keycache::Error::Io {
        path: path.to_path_buf(),
        op,
        source: e,
    }
}

impl MasterPub {
    /// The file `<pki_dir>/master.pub` of the master `master_id`.
    pub(crate) fn new(pki_dir: &Path, master_id: &str) -> MasterPub {
        let mut names = Vec::new();
        if !master_id.is_empty() && master_id != "master" {
            names.push(format!("{master_id}.pub").into_bytes());
        }
        names.push(b"master.pub".to_vec());
        MasterPub {
            path: pki_dir.join("master.pub"),
            names,
        }
    }

    /// Whether a write of bank entry `name` can change the file.
    pub(crate) fn concerns(&self, name: &[u8]) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// Brings the file in step with `bank` (the `master_keys` table). A
    /// missing `pki_dir` is left alone: Salt creates it at start.
    pub(crate) fn sync(&self, bank: &Table) -> keycache::Result<()> {
        let Some(dir) = self.path.parent() else {
            return Ok(());
        };
        if !dir.is_dir() {
            return Ok(());
        }
        let mut value = None;
        for n in &self.names {
            if let Some(s) = bank.get(n)? {
                value = Some(s.value);
                break;
            }
        }
        let Some(mut v) = value else {
            return Ok(());
        };
        // As Salt's fetch hands it back.
        while v.last() == Some(&0) {
            v.pop();
        }
        if v.is_empty() || keycache::pem::holds_private_key(&v) {
            return Ok(());
        }
        if self.current().as_deref() == Some(&v[..]) {
            return Ok(());
        }
        self.write(dir, &v)
    }

    /// The file's bytes when it is a regular file of 0644 (never through a
    /// symlink).
    fn current(&self) -> Option<Vec<u8>> {
        use std::io::Read;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(keycache::files::NO_FOLLOW)
            .open(&self.path)
            .ok()?;
        let m = f.metadata().ok()?;
        if !m.is_file() || m.permissions().mode() & 0o7777 != 0o644 || m.len() > 1 << 20 {
            return None;
        }
        let mut b = Vec::new();
        f.read_to_end(&mut b).ok()?;
        Some(b)
    }

    /// Writes `v` to a new temporary beside the file, fsyncs it, renames it
    /// over the file and fsyncs the directory.
    fn write(&self, dir: &Path, v: &[u8]) -> keycache::Result<()> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let tmp = dir.join(format!(
            ".master.pub.keycache-new.{}.{nanos}",
            std::process::id()
        ));
        let written = (|| -> keycache::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
                .map_err(|e| io(&tmp, "create", e))?;
            // The umask may have narrowed it.
            f.set_permissions(std::fs::Permissions::from_mode(0o644))
                .map_err(|e| io(&tmp, "chmod", e))?;
            f.write_all(v).map_err(|e| io(&tmp, "write", e))?;
            f.sync_all().map_err(|e| io(&tmp, "fsync", e))?;
            std::fs::rename(&tmp, &self.path).map_err(|e| io(&self.path, "rename", e))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
            return written;
        }
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(dir, "fsync", e))
    }
}
