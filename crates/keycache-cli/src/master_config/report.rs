//! What a master config gives, for humans ([`MasterConfig::describe`]) and
//! for `--json` (its `Serialize` form).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Layout, MasterConfig, Origin, Setting};

impl MasterConfig {
    /// directory, the layout, each with where it came from, and the notes.
    pub(crate) fn describe(&self) -> String {
        let mut s = String::new();
        if self.found {
            let files: Vec<String> = self.files.iter().map(|f| f.display().to_string()).collect();
            s += &format!("master config: {}\n", files.join(", "));
        } else {
            s += &format!(
                "master config: {} absent, Salt's defaults\n",
                self.conf_file.display()
            );
        }
        let store = self.store_dir();
        let why = match (&self.cluster_id, self.clustered) {
            (Some(id), true) => format!("cluster_id {:?}, {}", id.value, id.from),
            _ => "no cluster_id".to_string(),
        };
        s += &format!(
            "store: {} ({}; {why})\n",
            store.value.display(),
            match &store.from {
                Origin::Default => "pki_dir, Salt's default".to_string(),
                o => o.to_string(),
            },
        );
        let l = self.layout();
        let p = |name: &str, v: String, o: &Origin| match o {
            Origin::Default => format!("{name} {v} (default)"),
            Origin::File { file, line, key } if key == name => {
                format!("{name} {v} ({}:{line})", file.display())
            }
            o => format!("{name} {v} ({o})"),
        };
        s += &format!(
            "layout: {}, {}, {}, {}\n",
            p("mmap_key_size", l.size.value.to_string(), &l.size.from),
            p(
                "mmap_key_slot_size",
                l.slot_size.value.to_string(),
                &l.slot_size.from
            ),
            p(
                "mmap_key_id_size",
                l.id_size.value.to_string(),
                &l.id_size.from
            ),
            p(
                "mmap_key_max_segment_bytes",
                l.max_segment_bytes.value.to_string(),
                &l.max_segment_bytes.from
            ),
        );
        s += &format!(
            "keys.cache_driver: {}\n",
            self.cache_driver()
                .unwrap_or("null (the `cache` option's driver)")
        );
        for n in &self.notes {
            s += &format!("note: {n}\n");
        }
        s
    }

    fn report(&self) -> Report<'_> {
        Report {
            conf_file: &self.conf_file,
            how: self.how,
            found: self.found,
            files: &self.files,
            store_dir: self.store_dir(),
            pki_dir: self.pki_dir(),
            cluster_id: self.cluster_id.as_ref(),
            clustered: self.clustered,
            cluster_pki_dir: self.cluster_pki_dir(),
            root_dir: self.root_dir(),
            layout: self.layout(),
            user: self.user.as_ref(),
            cache_driver: self.cache_driver(),
            notes: &self.notes,
        }
    }
}

impl Serialize for MasterConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.report().serialize(s)
    }
}

/// The JSON form of a [`MasterConfig`]: what was read and what it gives.
#[derive(Serialize)]
struct Report<'a> {
    conf_file: &'a Path,
    how: &'static str,
    found: bool,
    files: &'a [PathBuf],
    store_dir: Setting<PathBuf>,
    pki_dir: Setting<PathBuf>,
    cluster_id: Option<&'a Setting<String>>,
    clustered: bool,
    cluster_pki_dir: Option<Setting<PathBuf>>,
    root_dir: String,
    layout: Layout,
    user: Option<&'a Setting<String>>,
    cache_driver: Option<&'a str>,
    notes: &'a [String],
}
