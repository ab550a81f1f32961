//! `keycache etcd diff`: the master's store against the key state in etcd,
//! entry by entry (`keycache_etcd::status::diff`).

use std::path::Path;

use keycache_etcd::status;

use crate::output::{esc, esc_path, exit, outln, print_json, CmdResult};

/// Runs `keycache etcd diff`: exit code 1 when the store and etcd differ.
pub(crate) fn run(a: super::Plain) -> CmdResult {
    let settings = super::required(&a.layout, "etcd diff")?;
    let store = a.layout.open(Path::new(""))?;
    let out = status::diff_report(&settings, &store)?;
    if a.json.json {
        print_json(&out);
        return Ok(exit(out.same));
    }
    let (d, revision) = (&out.differences, out.revision);
    for e in d {
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
            esc(&out.prefix)
        );
    }
    Ok(exit(out.same))
}
