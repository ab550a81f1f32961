//! `keycache list`: the keys in `salt-key -L`'s groups.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use anstyle::{AnsiColor, Style};
use serde::Serialize;

use keycache::store::Store;

use crate::args::{Json, Layout, StoreDir};
use crate::output::{paint, print_json, CmdError, CmdResult};

/// The arguments of `keycache list`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("dir", |a| a.help("The store directory (pki_dir or cluster_pki_dir)")))]
pub(crate) struct Args {
    #[command(flatten)]
    store: StoreDir,
    /// Only this group: accepted, pending (unaccepted), rejected or denied.
    #[arg(long, value_name = "S")]
    state: Option<String>,
    /// Include each public key.
    #[arg(long)]
    include_pub: bool,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// A salt-key group: its JSON key (the `localfs_key` directory), heading and
/// colour.
struct Group {
    name: &'static str,
    heading: &'static str,
    color: AnsiColor,
}

/// The salt-key groups, in `salt-key -L` order.
const GROUPS: [Group; 4] = [
    Group {
        name: "minions",
        heading: "Accepted Keys:",
        color: AnsiColor::Green,
    },
    Group {
        name: "minions_denied",
        heading: "Denied Keys:",
        color: AnsiColor::Magenta,
    },
    Group {
        name: "minions_pre",
        heading: "Unaccepted Keys:",
        color: AnsiColor::Red,
    },
    Group {
        name: "minions_rejected",
        heading: "Rejected Keys:",
        color: AnsiColor::Blue,
    },
];

/// The group a `--state` names.
fn group_of(s: &str) -> Result<&'static str, CmdError> {
    Ok(match s {
        "accepted" | "acc" | "minions" => "minions",
        "pending" | "unaccepted" | "un" | "pre" | "minions_pre" => "minions_pre",
        "rejected" | "rej" | "minions_rejected" => "minions_rejected",
        "denied" | "den" | "minions_denied" => "minions_denied",
        _ => {
            return Err(CmdError::usage(format!(
                "unknown state {s:?}: use accepted, pending, rejected or denied"
            )))
        }
    })
}

/// The entries of one group, sorted: (id, pem).
type Entries = Vec<(String, Vec<u8>)>;

/// Reads both banks into salt-key's groups, in [`GROUPS`] order; entries
/// that cannot be read are reported on stderr and left out.
fn groups(store: &Store) -> Result<[Entries; 4], CmdError> {
    let mut out: [Entries; 4] = Default::default();
    let mut bad = Vec::new();
    for r in store.keys(None)? {
        match r {
            Ok((id, e)) => {
                let g = e.state.dir_name();
                if let Some(i) = GROUPS.iter().position(|x| x.name == g) {
                    out[i].push((id, e.public_key));
                }
            }
            Err(e) => bad.push(e.to_string()),
        }
    }
    for r in store.denied_keys()? {
        match r {
            Ok((id, pem)) => out[1].push((id, pem)),
            Err(e) => bad.push(e.to_string()),
        }
    }
    for b in &bad {
        eprintln!("keycache: {b}");
    }
    for g in &mut out {
        g.sort();
    }
    Ok(out)
}

/// One group in `--json`: its ids, or with `--include-pub` id -> key.
#[derive(Serialize)]
#[serde(untagged)]
enum JsonGroup {
    Ids(Vec<String>),
    Keys(BTreeMap<String, String>),
}

/// Runs `keycache list`.
pub(crate) fn run(a: Args) -> CmdResult {
    let store = a.layout.open(&a.store.dir)?;
    let only = a.state.as_deref().map(group_of).transpose()?;
    let groups = groups(&store)?;
    let shown = GROUPS
        .iter()
        .zip(&groups)
        .filter(|(g, _)| only.is_none_or(|o| o == g.name));
    if a.json.json {
        let doc: BTreeMap<&str, JsonGroup> = shown
            .map(|(g, entries)| {
                let v = if a.include_pub {
                    JsonGroup::Keys(
                        entries
                            .iter()
                            .map(|(id, pem)| {
                                (id.clone(), String::from_utf8_lossy(pem).into_owned())
                            })
                            .collect(),
                    )
                } else {
                    JsonGroup::Ids(entries.iter().map(|(id, _)| id.clone()).collect())
                };
                (g.name, v)
            })
            .collect();
        print_json(&doc);
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    for (g, entries) in shown {
        let style = Style::new().fg_color(Some(g.color.into()));
        let _ = writeln!(out, "{}", paint(g.heading, style));
        for (id, pem) in entries {
            let _ = writeln!(out, "{}", paint(id, style));
            if a.include_pub {
                let _ = write!(out, "{}", String::from_utf8_lossy(pem));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
