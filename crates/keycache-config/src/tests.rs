//! The master config reader against Salt 3008.5's rules: fixtures under
//! `tests/fixtures` and configs written to scratch directories. A module
//! per area ([`pki_dir`], [`include`], [`errors`], [`sources`], [`salt`]);
//! the helpers they share are here.

use std::path::{Path, PathBuf};

use super::*;

mod errors;
mod include;
mod pki_dir;
mod salt;
mod sources;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A scratch config directory with `files` (relative path, content).
fn scratch(files: &[(&str, &str)]) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for (p, text) in files {
        let p = t.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    t
}

/// The config of a [`scratch`] directory of `files`, which must load.
fn loaded(files: &[(&str, &str)]) -> (tempfile::TempDir, MasterConfig) {
    let t = scratch(files);
    let c = load_dir(t.path()).unwrap();
    (t, c)
}

fn load_dir(dir: &Path) -> Result<MasterConfig, ConfigError> {
    MasterConfig::load(&Source::config_dir(dir))
}

fn from_file(s: &Option<Setting<impl Clone>>) -> (PathBuf, usize) {
    match &s.as_ref().unwrap().from {
        Origin::File { file, line, .. } => (file.clone(), *line),
        o => panic!("{o:?}"),
    }
}
