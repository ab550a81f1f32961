//! `keycache list`: the keys in `salt-key -L`'s groups.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anstyle::{AnsiColor, Style};
use serde::Serialize;

use keycache::pem::holds_private_key;
use keycache::store::Store;

use crate::args::{ConfiguredStore, Json, StoreArgs};
use crate::cmd::get::WITHHELD;
use crate::output::{errln, esc, out, outln, paint, print_json, CmdError, CmdResult};

/// The arguments of `keycache list`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("dir", |a| a.help("The store directory (pki_dir or cluster_pki_dir). Default: the one the Salt master config names (see -c)")))]
pub(crate) struct Args {
    #[command(flatten)]
    store: ConfiguredStore,
    /// Only this group: accepted, pending (unaccepted), rejected or denied.
    #[arg(long, value_name = "S")]
    state: Option<String>,
    /// Include each public key.
    #[arg(long)]
    include_pub: bool,
    /// List another bank: `master_keys` (the master's own key files),
    /// by name only: their values are private keys and never printed.
    #[arg(long, value_name = "BANK", value_parser = ["keys", "master_keys"], default_value = "keys")]
    bank: String,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
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
/// that cannot be read are reported on stderr and left out, and counted
/// (the second value).
fn groups(store: &Store) -> Result<([Entries; 4], usize), CmdError> {
    let mut out: [Entries; 4] = Default::default();
    let mut bad = Vec::new();
    // A bank that cannot be listed at all (its index is missing while its
    // roster lists entries) is reported, and the other bank still listed.
    match store.keys(None) {
        Ok(it) => {
            for r in it {
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
        }
        Err(e) if e.is_corrupt() => bad.push(e.to_string()),
        Err(e) => return Err(e.into()),
    }
    match store.denied_keys() {
        Ok(it) => {
            for r in it {
                match r {
                    Ok((id, pem)) => out[1].push((id, pem)),
                    Err(e) => bad.push(e.to_string()),
                }
            }
        }
        Err(e) if e.is_corrupt() => bad.push(e.to_string()),
        Err(e) => return Err(e.into()),
    }
    for b in &bad {
        errln!("keycache: {}", esc(b));
    }
    for g in &mut out {
        g.sort();
    }
    Ok((out, bad.len()))
}

/// One group in `--json`: its ids, or with `--include-pub` id -> key.
#[derive(Serialize)]
#[serde(untagged)]
enum JsonGroup {
    Ids(Vec<String>),
    /// A withheld key (it holds a private key block) is `null`.
    Keys(BTreeMap<String, Option<String>>),
}

/// A key as `--include-pub` shows it: `None` when it holds a private key
/// block, which is never printed.
fn shown(pem: &[u8]) -> Option<String> {
    (!holds_private_key(pem)).then(|| String::from_utf8_lossy(pem).into_owned())
}

/// Runs `keycache list`: exit code 2 when an entry could not be read or a
/// key was withheld (after listing the rest).
pub(crate) fn run(a: Args) -> CmdResult {
    if a.bank == "master_keys" {
        return list_master_keys(&a);
    }
    let only = a.state.as_deref().map(group_of).transpose()?;
    let store = a.layout.open(&a.store.dir())?;
    let (groups, bad) = groups(&store)?;
    let shown_groups: Vec<(&Group, &Entries)> = GROUPS
        .iter()
        .zip(&groups)
        .filter(|(g, _)| only.is_none_or(|o| o == g.name))
        .collect();
    let mut withheld: Vec<&str> = Vec::new();
    if a.include_pub {
        for (_, entries) in &shown_groups {
            for (id, pem) in entries.iter() {
                if holds_private_key(pem) {
                    withheld.push(id);
                }
            }
        }
    }
    if a.json.json {
        let doc: BTreeMap<&str, JsonGroup> = shown_groups
            .iter()
            .map(|(g, entries)| {
                let v = if a.include_pub {
                    JsonGroup::Keys(
                        entries
                            .iter()
                            .map(|(id, pem)| (id.clone(), shown(pem)))
                            .collect(),
                    )
                } else {
                    JsonGroup::Ids(entries.iter().map(|(id, _)| id.clone()).collect())
                };
                (g.name, v)
            })
            .collect();
        print_json(&doc);
    } else {
        for (g, entries) in &shown_groups {
            let style = Style::new().fg_color(Some(g.color.into()));
            outln!("{}", paint(g.heading, style));
            for (id, pem) in entries.iter() {
                outln!("{}", paint(&esc(id), style));
                if a.include_pub {
                    match shown(pem) {
                        Some(k) => out!("{k}"),
                        None => out!("{WITHHELD}"),
                    }
                }
            }
        }
    }
    for id in &withheld {
        errln!(
            "keycache: {}: withheld: the stored key holds a PRIVATE KEY block (delete or replace the key)",
            esc(id)
        );
    }
    if bad > 0 {
        return Err(CmdError::usage(format!(
            "{} could not be read in full ({bad} error{} above; what could be read is listed): run keycache verify {0}",
            crate::output::esc_path(store.dir()),
            if bad == 1 { "" } else { "s" }
        )));
    }
    if !withheld.is_empty() {
        return Err(CmdError::usage(format!(
            "{} key(s) withheld: they hold private key material",
            withheld.len()
        )));
    }
    Ok(ExitCode::SUCCESS)
}

/// `keycache list --bank master_keys`: the names in the master's bank, never
/// their values (private keys).
fn list_master_keys(a: &Args) -> CmdResult {
    if a.include_pub || a.state.is_some() {
        return Err(CmdError::usage(
            "--bank master_keys lists names only: no --include-pub or --state",
        ));
    }
    let r = a.layout.resolve(&a.store.dir(), true)?;
    let opts = a.layout.options(r.params);
    let names = keycache::master_keys::names(&r.dir, &opts)?;
    if a.json.json {
        let doc: BTreeMap<&str, &Vec<String>> = [("master_keys", &names)].into_iter().collect();
        print_json(&doc);
    } else {
        outln!("{}", paint("Master Keys:", Style::new()));
        for n in &names {
            outln!("{}", esc(n));
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
