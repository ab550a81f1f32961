//! `keycache etcd diff`: the master's store against the key state in etcd,
//! entry by entry (`keycache_etcd::status::diff`).

use std::path::Path;

use keycache_etcd::{block_on, status};

use crate::output::{esc, esc_path, exit, outln, print_json, CmdResult};

/// What `keycache etcd diff` found.
#[derive(Debug, serde::Serialize)]
struct Out<'a> {
    dir: &'a Path,
    prefix: &'a str,
    /// The etcd revision listed.
    revision: i64,
    same: bool,
    differences: &'a [status::Difference],
}

/// Runs `keycache etcd diff`: exit code 1 when the store and etcd differ.
pub(crate) fn run(a: super::Plain) -> CmdResult {
    let settings = super::required(&a.layout, "etcd diff")?;
    let store = a.layout.open(Path::new(""))?;
    let (revision, d) = block_on(async {
        let mut client = settings.connect().await?;
        status::diff(&mut client, &settings, &store).await
    })?;
    let out = Out {
        dir: store.dir(),
        prefix: settings.layout.prefix(),
        revision,
        same: d.is_empty(),
        differences: &d,
    };
    if a.json.json {
        print_json(&out);
        return Ok(exit(out.same));
    }
    for e in &d {
        let what = format!("{}/{}", e.bank, esc(&e.id));
        match (&e.store, &e.etcd) {
            (Some(s), None) => outln!("only in the store: {what} ({s})"),
            (None, Some(x)) => outln!("only in etcd:      {what} ({x})"),
            (Some(s), Some(x)) if s == x => {
                outln!("differs:           {what} ({s} on both, different keys)")
            }
            (Some(s), Some(x)) => outln!("differs:           {what} (store {s}, etcd {x})"),
            (None, None) => {}
        }
    }
    if out.same {
        outln!(
            "same: {} holds what etcd holds under {} at revision {revision}",
            esc_path(store.dir()),
            esc(out.prefix)
        );
    }
    Ok(exit(out.same))
}
