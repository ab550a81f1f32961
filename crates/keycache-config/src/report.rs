//! What a master config gives, for humans ([`MasterConfig::describe`]) and
//! for `--json` (its `Serialize` form).

use std::path::{Path, PathBuf};

use serde::Serialize;

#[cfg(test)]
use super::Explicit;
use super::{Choice, LayoutOptions, MasterConfig, Origin, Setting};

impl MasterConfig {
    /// `file` relative to the main file's directory when it is under it.
    fn short(&self, file: &Path) -> String {
        let base = self.conf_file.parent().unwrap_or(Path::new("/"));
        match file.strip_prefix(base) {
            Ok(rel) => rel.display().to_string(),
            _ => file.display().to_string(),
        }
    }

    /// Where a value came from, for humans: `FILE:LINE` (FILE relative to
    /// the main file's directory), `default`, `--flag`; with the option's
    /// name when it is not `name`.
    pub fn origin_text(&self, name: &str, o: &Origin) -> String {
        match o {
            Origin::Default => "default".into(),
            Origin::Flag { flag } => flag.clone(),
            Origin::Opts { key } if key == name => "opts".into(),
            Origin::Opts { key } => format!("{key}, opts"),
            Origin::File { file, line, key } if key == name => {
                format!("{}:{line}", self.short(file))
            }
            Origin::File { file, line, key } => format!("{key}, {}:{line}", self.short(file)),
        }
    }

    /// What was read and what it gives, for humans: the files, the store
    /// directory, the layout, each with where it came from, and the notes.
    #[cfg(test)]
    pub fn describe(&self) -> String {
        self.describe_choice(&self.choose(&Explicit::default()))
    }

    /// What the config gives, in words, for the directory and layout a command
    /// chose ([`MasterConfig::choose`]): flags shown as such.
    pub fn describe_choice(&self, c: &Choice) -> String {
        let mut s = String::new();
        if self.found {
            s += &format!("master config: {}", self.conf_file.display());
            let more: Vec<String> = self.files[1..].iter().map(|f| self.short(f)).collect();
            if !more.is_empty() {
                s += &format!(" (+ {})", more.join(", "));
            }
            s += "\n";
        } else {
            s += &format!(
                "master config: {} absent: Salt's defaults",
                self.conf_file.display()
            );
            let more: Vec<String> = self.files.iter().map(|f| self.short(f)).collect();
            if !more.is_empty() {
                s += &format!(" (+ {})", more.join(", "));
            }
            s += "\n";
        }
        let by_flag = matches!(c.store_dir.from, Origin::Flag { .. });
        let cluster = match (&self.cluster_id, self.clustered) {
            (Some(id), true) if !by_flag => format!("; cluster_id {:?}", id.value),
            _ => String::new(),
        };
        let from = match &c.store_dir.from {
            Origin::File { file, line, key } => format!("{key} in {}:{line}", self.short(file)),
            Origin::Flag { flag } => format!("{flag} given"),
            Origin::Opts { key } => format!("{key} of the master's opts"),
            Origin::Default => "pki_dir, Salt's default".into(),
        };
        s += &format!("store: {} ({from}{cluster})\n", c.store_dir.value.display());
        let l = &c.layout;
        let p = |name: &str, v: String, o: &Origin| {
            format!("{name} {v} ({})", self.origin_text(name, o))
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
    layout: LayoutOptions,
    user: Option<&'a Setting<String>>,
    cache_driver: Option<&'a str>,
    notes: &'a [String],
}
