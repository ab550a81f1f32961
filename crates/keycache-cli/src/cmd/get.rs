//! `keycache get`: one id's state, key and mtime, and its denied key.

use serde::Serialize;

use crate::args::{minion_id, Json, Layout, StoreDir};
use crate::output::{exit, fmt_time, print_json, CmdResult};

/// The arguments of `keycache get`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: StoreDir,
    /// The minion id.
    id: String,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// `keycache get --json`: `null`s for what is not there.
#[derive(Serialize)]
struct GetReport<'a> {
    id: &'a str,
    state: Option<&'static str>,
    #[serde(rename = "pub")]
    public_key: Option<String>,
    mtime_ns: Option<u64>,
    denied_pub: Option<String>,
}

/// Runs `keycache get`.
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir)?;
    let id = minion_id(&a.id)?;
    let entry = store.get(&id)?;
    let denied = store.denied(&id)?;
    let found = entry.is_some() || denied.is_some();
    if a.json.json {
        print_json(&GetReport {
            id: id.as_str(),
            state: entry.as_ref().map(|e| e.state.name()),
            public_key: entry
                .as_ref()
                .map(|e| String::from_utf8_lossy(&e.public_key).into_owned()),
            mtime_ns: entry.as_ref().map(|e| e.mtime),
            denied_pub: denied
                .as_ref()
                .map(|d| String::from_utf8_lossy(d).into_owned()),
        });
    } else if !found {
        eprintln!("keycache: {id}: no such key in {}", store.dir().display());
    } else {
        println!("id: {id}");
        match &entry {
            Some(e) => {
                println!("state: {}", e.state);
                println!(
                    "mtime: {} ({} ns since the epoch)",
                    fmt_time(e.mtime),
                    e.mtime
                );
                print!("public key:\n{}", String::from_utf8_lossy(&e.public_key));
            }
            None => println!("state: (not in the keys bank)"),
        }
        if let Some(d) = &denied {
            print!("denied key:\n{}", String::from_utf8_lossy(d));
        }
    }
    Ok(exit(found))
}
