//! The master config as a running Salt process hands it over (a runner's
//! `__opts__`): Salt has read the files, applied `root_dir` and the
//! `cluster_pki_dir` fallback, so the values are taken as they are.

use std::path::PathBuf;

use keycache::tree::TreeSync;

use crate::etcd::EtcdSettings;
use crate::{MasterConfig, Origin, Setting};

/// The options of Salt's opts that keycache uses, each already of its type
/// (the caller converts and checks them). `None`: unset (or null).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaltOpts {
    /// `conf_file`.
    pub conf_file: PathBuf,
    /// `pki_dir` (absolute in Salt's opts: `root_dir` already applied).
    pub pki_dir: Option<String>,
    /// `cluster_id` (an integer as its decimal string).
    pub cluster_id: Option<String>,
    /// Whether `cluster_id` is true to Python.
    pub clustered: bool,
    /// `cluster_pki_dir`.
    pub cluster_pki_dir: Option<String>,
    /// `mmap_key_size`.
    pub mmap_key_size: Option<u64>,
    /// `mmap_key_slot_size`.
    pub mmap_key_slot_size: Option<usize>,
    /// `mmap_key_id_size`.
    pub mmap_key_id_size: Option<usize>,
    /// `mmap_key_max_segment_bytes`, else `mmap_cache_max_segment_bytes`.
    pub mmap_key_max_segment_bytes: Option<u64>,
    /// `user`.
    pub user: Option<String>,
    /// `id` (Salt's: the config's, else `<host>_master`).
    pub id: Option<String>,
    /// `keys.cache_driver` (`Some(None)`: set to null).
    pub cache_driver: Option<Option<String>>,
    /// `keycache_etcd`.
    pub etcd: Option<EtcdSettings>,
    /// `keycache_tree`.
    pub keycache_tree: Option<TreeSync>,
}

fn opt<T>(v: Option<T>, key: &str) -> Option<Setting<T>> {
    v.map(|value| Setting {
        value,
        from: Origin::Opts { key: key.into() },
    })
}

impl MasterConfig {
    /// The config of Salt's opts: what [`MasterConfig::load`] gives for
    /// the files those opts were read from, without reading them again.
    pub fn from_salt_opts(o: SaltOpts) -> MasterConfig {
        MasterConfig {
            found: true,
            files: vec![o.conf_file.clone()],
            conf_file: o.conf_file,
            how: "the master's opts",
            notes: Vec::new(),
            // Salt's pki_dir is root_dir-prefixed already.
            root_dir: None,
            pki_dir: opt(o.pki_dir, "pki_dir"),
            cluster_id: opt(o.cluster_id, "cluster_id"),
            clustered: o.clustered,
            cluster_pki_dir: opt(o.cluster_pki_dir, "cluster_pki_dir"),
            mmap_key_size: opt(o.mmap_key_size, "mmap_key_size"),
            mmap_key_slot_size: opt(o.mmap_key_slot_size, "mmap_key_slot_size"),
            mmap_key_id_size: opt(o.mmap_key_id_size, "mmap_key_id_size"),
            mmap_key_max_segment_bytes: opt(
                o.mmap_key_max_segment_bytes,
                "mmap_key_max_segment_bytes",
            ),
            user: opt(o.user, "user"),
            id: opt(o.id, "id"),
            cache_driver: opt(o.cache_driver, "keys.cache_driver"),
            etcd: opt(o.etcd, "keycache_etcd"),
            keycache_tree: opt(o.keycache_tree, "keycache_tree"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opts_give_the_store_of_a_cluster_peer() {
        let c = MasterConfig::from_salt_opts(SaltOpts {
            conf_file: "/etc/salt/master".into(),
            pki_dir: Some("/srv/pki".into()),
            cluster_id: Some("c1".into()),
            clustered: true,
            cluster_pki_dir: Some("/srv/cluster".into()),
            mmap_key_size: Some(1009),
            ..SaltOpts::default()
        });
        assert_eq!(c.pki_dir().value, PathBuf::from("/srv/pki"));
        assert_eq!(c.store_dir().value, PathBuf::from("/srv/cluster"));
        assert_eq!(c.layout().size.value, 1009);
        assert_eq!(
            c.layout().size.from.to_string(),
            "mmap_key_size of the master's opts"
        );
    }
}
