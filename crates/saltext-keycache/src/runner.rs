//! The jobs of the runner functions (`salt-run keycache.migrate`,
//! `status`, `verify`, `diff`): the library's, as the `keycache` command
//! runs them, on the master config Salt handed the runner (its opts, read
//! here with [`config`], not the files again). Each returns the document
//! the command's `--json` prints, as a dict, and whether it passed (the
//! command's exit code 0); an error is raised (the registered error class)
//! with the library's message. None returns a private key: the reports
//! name the master's key files, never their bytes.

use std::path::{Path, PathBuf};

use keycache::master_keys::OnDiffer;
use keycache::migrate::MigrateOptions;
use keycache::tree::TreeSync;
use keycache::{OpenOptions, Store};
use keycache_config::migrate::{self, Dirs, Job};
use keycache_config::{Explicit, MasterConfig, SaltOpts};
use keycache_etcd::{status, Settings};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use crate::{error, etcd::EtcdOptions};

/// `opts.get(key)`, `None` for a missing key or a value of `None`.
fn get<'py>(opts: &Bound<'py, PyAny>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    let v = opts.call_method1("get", (key,))?;
    Ok((!v.is_none()).then_some(v))
}

fn bad(key: &str, expected: &str, v: &Bound<'_, PyAny>) -> String {
    let what = v
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    format!("bad option {key}: expected {expected}, got a {what}")
}

/// A string option (an integer as its decimal string, when `ints`).
fn text(key: &str, v: &Bound<'_, PyAny>, ints: bool) -> Result<String, String> {
    if let Ok(s) = v.cast::<PyString>() {
        return s.to_str().map(str::to_owned).map_err(|e| e.to_string());
    }
    if ints && v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() {
        return Ok(v.to_string());
    }
    Err(bad(key, "a string", v))
}

/// A non-negative integer option (a boolean is refused).
fn int(key: &str, v: &Bound<'_, PyAny>) -> Result<u64, String> {
    if v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() {
        if let Ok(n) = v.extract::<u64>() {
            return Ok(n);
        }
    }
    Err(bad(key, "a non-negative integer", v))
}

/// The master config of Salt's opts (`__opts__`): the store directory
/// (`pki_dir`, `cluster_id`, `cluster_pki_dir`), the `mmap_key_*` layout,
/// `id`, `keycache_tree` and `keycache_etcd`, as the driver reads them.
pub(crate) fn config(py: Python<'_>, opts: &Bound<'_, PyAny>) -> PyResult<MasterConfig> {
    let fail = |why: String| error(py, why);
    let string = |key: &str, ints: bool| -> PyResult<Option<String>> {
        get(opts, key)?
            .map(|v| text(key, &v, ints))
            .transpose()
            .map_err(fail)
    };
    let number = |key: &str| -> PyResult<Option<u64>> {
        get(opts, key)?
            .map(|v| int(key, &v))
            .transpose()
            .map_err(fail)
    };
    let size = |key: &str| -> PyResult<Option<usize>> {
        Ok(number(key)?.map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
    };
    let cluster = get(opts, "cluster_id")?;
    let clustered = match &cluster {
        Some(v) => v.is_truthy()?,
        None => false,
    };
    let cluster_id = string("cluster_id", true)?;
    let etcd = EtcdOptions::from_py(get(opts, "keycache_etcd")?.as_ref(), cluster_id.as_deref())
        .map_err(fail)?;
    let keycache_tree = match get(opts, "keycache_tree")? {
        Some(v) => Some(crate::tree_sync(py, &v)?),
        None => None,
    };
    let max_segment = match number("mmap_key_max_segment_bytes")? {
        Some(n) => Some(n),
        None => number("mmap_cache_max_segment_bytes")?,
    };
    Ok(MasterConfig::from_salt_opts(SaltOpts {
        conf_file: PathBuf::from(string("conf_file", false)?.unwrap_or_default()),
        pki_dir: string("pki_dir", false)?,
        cluster_pki_dir: if clustered {
            string("cluster_pki_dir", false)?
        } else {
            None
        },
        cluster_id: cluster_id.filter(|_| clustered),
        clustered,
        mmap_key_size: number("mmap_key_size")?,
        mmap_key_slot_size: size("mmap_key_slot_size")?,
        mmap_key_id_size: size("mmap_key_id_size")?,
        mmap_key_max_segment_bytes: max_segment,
        user: None,
        id: string("id", true)?,
        cache_driver: None,
        etcd: etcd.map(EtcdOptions::into_inner),
        keycache_tree,
    }))
}

/// Opens the store in `dir` (else the config's) with the config's layout,
/// the size read off the index files when the opts set none (finishing an
/// interrupted rebuild first, unless `finish` is false), checked against
/// the files, as the command opens it.
fn open(cfg: &MasterConfig, dir: Option<&Path>, finish: bool) -> keycache::Result<Store> {
    let choice = cfg.choose(&Explicit {
        dir: dir.map(Path::to_path_buf),
        ..Explicit::default()
    });
    let base = OpenOptions {
        params: choice.params(),
        ..OpenOptions::default()
    };
    let dir = choice.store_dir.value.clone();
    let params = keycache_config::store_params(&dir, &base, choice.size_is_default(), finish)?;
    let store = Store::open_with(&dir, &OpenOptions { params, ..base })?;
    store.check_layout()?;
    Ok(store)
}

/// The etcd settings of the config, which the etcd jobs need.
fn etcd_settings(cfg: &MasterConfig) -> Result<Settings, String> {
    match Settings::from_config(cfg) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err("the master's opts have no keycache_etcd".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// What a job hands back: its document as JSON, and whether it passed.
type Done = Result<(String, bool), String>;

fn json<T: serde::Serialize>(doc: &T, ok: bool) -> Done {
    serde_json::to_string(doc)
        .map(|s| (s, ok))
        .map_err(|e| format!("the report cannot be written as JSON: {e}"))
}

/// Runs `job` without the GIL; its document as a dict, and whether it
/// passed, or the error raised.
fn finish<'py>(
    py: Python<'py>,
    job: impl FnOnce() -> Done + Send,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    let (doc, ok) = py.detach(job).map_err(|why| error(py, why))?;
    let doc = py.import("json")?.call_method1("loads", (doc,))?;
    Ok((doc, ok))
}

/// `keycache migrate --json [--dry-run] [--replace-states]` on the master
/// config of `opts`: the master's tree and own keys into its store.
#[pyfunction]
#[pyo3(signature = (opts, *, dry_run=false, replace_states=false))]
pub(crate) fn run_migrate<'py>(
    py: Python<'py>,
    opts: &Bound<'py, PyAny>,
    dry_run: bool,
    replace_states: bool,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    let cfg = config(py, opts)?;
    finish(py, move || {
        let dirs = Dirs::of_config(&cfg);
        let target = dirs.target().to_path_buf();
        let fail = |e: keycache::Error| e.to_string();
        let base = OpenOptions {
            params: cfg.choose(&Explicit::default()).params(),
            ..OpenOptions::default()
        };
        let size_is_default = cfg.choose(&Explicit::default()).size_is_default();
        let params = keycache_config::store_params(&target, &base, size_is_default, !dry_run)
            .map_err(fail)?;
        let open = OpenOptions { params, ..base };
        let job = Job {
            opts: MigrateOptions {
                rebuild_settle: open.rebuild_settle,
                params,
                out: dirs.cluster_dir.clone(),
                dry_run,
                replace_states,
                ..MigrateOptions::default()
            },
            master_id: Some(migrate::master_id(None, Some(&cfg), &dirs.pki_dir)),
            on_differ: OnDiffer::Refuse,
            dirs,
            open,
        };
        let out = migrate::migrate(&job, &|_, _| {}).map_err(|e| e.to_string())?;
        json(&out, true)
    })
}

/// `keycache stats --json`: counts, layout and each bank's numbers.
#[pyfunction]
pub(crate) fn run_stats<'py>(
    py: Python<'py>,
    opts: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    let cfg = config(py, opts)?;
    finish(py, move || {
        let store = open(&cfg, None, true).map_err(|e| e.to_string())?;
        let r = keycache::report::stats(&store).map_err(|e| e.to_string())?;
        json(&r, true)
    })
}

/// `keycache verify --json [--repair]`: the banks and the key tree
/// (`keycache_tree` as the command reads it: false never, accepted
/// `minions/` alone, else when the store's directory holds a tree); the
/// entries a repair loses are recorded in the audit trail as removed by
/// this process.
#[pyfunction]
#[pyo3(signature = (opts, *, repair=false))]
pub(crate) fn run_verify<'py>(
    py: Python<'py>,
    opts: &Bound<'py, PyAny>,
    repair: bool,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    let cfg = config(py, opts)?;
    let program = crate::audit::program(py);
    finish(py, move || {
        let fail = |e: keycache::Error| e.to_string();
        let mut store = open(&cfg, None, true).map_err(fail)?;
        let (sync, auto) = match cfg.tree() {
            Some(TreeSync::Off) => (TreeSync::Off, false),
            Some(TreeSync::Accepted) => (TreeSync::Accepted, false),
            Some(TreeSync::On) | None => (TreeSync::auto(store.dir()), true),
        };
        store.set_tree(sync);
        let actor = keycache_config::actor::actor(
            &program,
            std::env::var("SUDO_USER").ok(),
            Some(keycache_config::actor::master_id(&cfg)),
            None,
        );
        let out = keycache::verify::check_and_mend(&store, repair, auto, &actor).map_err(fail)?;
        json(&out, out.passed())
    })
}

/// `keycache diff --json <the master's store> <other>`: how the two stores
/// differ (passed: they do not).
#[pyfunction]
pub(crate) fn run_diff<'py>(
    py: Python<'py>,
    opts: &Bound<'py, PyAny>,
    other: PathBuf,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    let cfg = config(py, opts)?;
    finish(py, move || {
        let fail = |e: keycache::Error| e.to_string();
        let own = open(&cfg, None, true).map_err(fail)?;
        let other = open(&cfg, Some(&other), true).map_err(fail)?;
        let d = keycache::diff::diff(&own, &other).map_err(fail)?;
        json(&d, d.same)
    })
}

/// Runs `job` without the GIL on the master's store and the etcd settings
/// of `opts` (as [`finish`]).
fn etcd_job<'py>(
    py: Python<'py>,
    opts: &Bound<'py, PyAny>,
    job: impl FnOnce(&Settings, &Store) -> Done + Send,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    let cfg = config(py, opts)?;
    finish(py, move || {
        let settings = etcd_settings(&cfg)?;
        let store = open(&cfg, None, true).map_err(|e| e.to_string())?;
        job(&settings, &store)
    })
}

/// `keycache etcd status --json`: this master's replica against etcd
/// (passed: current, and etcd answered), within etcd's connect and request
/// timeouts.
#[pyfunction]
pub(crate) fn run_etcd_status<'py>(
    py: Python<'py>,
    opts: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    etcd_job(py, opts, |settings, store| {
        let r = status::status_report(settings, store).map_err(|e| e.to_string())?;
        json(&r, r.ok())
    })
}

/// `keycache etcd diff --json`: the master's store against etcd (passed:
/// the same), within etcd's connect and request timeouts.
#[pyfunction]
pub(crate) fn run_etcd_diff<'py>(
    py: Python<'py>,
    opts: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    etcd_job(py, opts, |settings, store| {
        let r = status::diff_report(settings, store).map_err(|e| e.to_string())?;
        json(&r, r.same)
    })
}
