//! `keycache get`: one id's state, key and mtime, and its denied key.

use serde::Serialize;

use keycache::pem::{finger, holds_private_key};

use crate::args::{minion_id, Json, StoreArgs, StoreIds};
use crate::output::{
    errln, esc, esc_path, exit, fmt_time, out, outln, print_json, CmdError, CmdResult,
};

/// The arguments of `keycache get`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("args", |a| a.help("`DIR ID`: the store directory (pki_dir or cluster_pki_dir), then the minion id. With -c or --master-config: the minion id only (the store directory is the one the master config names), unless a first argument holds a `/`: then it is the store directory")))]
pub(crate) struct Args {
    #[command(flatten)]
    target: StoreIds,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// `keycache get --json`: `null`s for what is not there (or withheld).
#[derive(Serialize)]
struct GetReport<'a> {
    id: &'a str,
    state: Option<&'static str>,
    #[serde(rename = "pub")]
    public_key: Option<String>,
    /// Salt's `pem_finger` of the key (what `salt-key -f` prints).
    finger: Option<String>,
    mtime_ns: Option<u64>,
    denied_pub: Option<String>,
    denied_finger: Option<String>,
}

/// A stored key as printed: `None` when it holds a private key block,
/// which is never printed.
fn shown(pem: &[u8]) -> Option<String> {
    (!holds_private_key(pem)).then(|| String::from_utf8_lossy(pem).into_owned())
}

/// What is printed in place of a withheld key.
pub(crate) const WITHHELD: &str = "(withheld: it holds private key material)\n";

/// Runs `keycache get`: exit code 1 when the id is in neither bank, 2 when
/// a key was withheld.
pub(crate) fn run(a: Args) -> CmdResult {
    let (dir, ids) = a.target.split(&a.layout)?;
    let [id] = &ids[..] else {
        return Err(CmdError::usage(format!(
            "give one minion id: DIR ID, or -c CONFIG_DIR ID (got {} id(s){})",
            ids.len(),
            if a.layout.config_given() {
                ""
            } else {
                " after DIR"
            }
        )));
    };
    let id = minion_id(id)?;
    let store = a.layout.open(&dir)?;
    let entry = store.get(&id)?;
    let denied = store.denied(&id)?;
    let found = entry.is_some() || denied.is_some();
    let key = entry.as_ref().map(|e| shown(&e.public_key));
    let dkey = denied.as_deref().map(shown);
    let mut withheld = Vec::new();
    if matches!(key, Some(None)) {
        withheld.push("keys");
    }
    if matches!(dkey, Some(None)) {
        withheld.push("denied_keys");
    }
    if a.json.json {
        print_json(&GetReport {
            id: id.as_str(),
            state: entry.as_ref().map(|e| e.state.name()),
            public_key: key.clone().flatten(),
            finger: entry.as_ref().map(|e| finger(&e.public_key)),
            mtime_ns: entry.as_ref().map(|e| e.mtime),
            denied_pub: dkey.clone().flatten(),
            denied_finger: denied.as_deref().map(finger),
        });
    } else if !found {
        errln!(
            "keycache: {}: no such key in {}",
            esc(id.as_str()),
            esc_path(store.dir())
        );
    } else {
        outln!("id: {}", esc(id.as_str()));
        match &entry {
            Some(e) => {
                outln!("state: {}", e.state);
                outln!("finger: {}", finger(&e.public_key));
                outln!(
                    "mtime: {} ({} ns since the epoch)",
                    fmt_time(e.mtime),
                    e.mtime
                );
                out!(
                    "public key:\n{}",
                    key.clone().flatten().as_deref().unwrap_or(WITHHELD)
                );
            }
            None => outln!("state: (not in the keys bank)"),
        }
        if let Some(d) = &denied {
            outln!("denied finger: {}", finger(d));
            out!(
                "denied key:\n{}",
                dkey.clone().flatten().as_deref().unwrap_or(WITHHELD)
            );
        }
    }
    if !withheld.is_empty() {
        return Err(CmdError::usage(format!(
            "{}: withheld the value in {}: it holds a PRIVATE KEY block (delete or replace the key)",
            esc(id.as_str()),
            withheld.join(" and ")
        )));
    }
    Ok(exit(found))
}
