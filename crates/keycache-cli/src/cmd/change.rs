//! What a state change of keys does, whichever way it is written (the
//! local store, or etcd through `super::etcd::write`): the four actions,
//! the decision per id ([`decide`]), the guards of `--finger` and `delete
//! --state`, and the report printed.

use serde::Serialize;

use keycache::store::KeyState;
use keycache::tree::TreeChanges;
use keycache::MinionId;

use crate::output::{errln, esc, exit, outln, print_json, print_tree_changes};

/// `delete --state`: the one entry of an id a delete removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Only {
    /// The keys bank's entry, when accepted.
    Accepted,
    /// The keys bank's entry, when pending.
    Pending,
    /// The keys bank's entry, when rejected.
    Rejected,
    /// The denied key.
    Denied,
}

impl Only {
    /// The `keys` state this names (None: the denied key).
    fn state(self) -> Option<KeyState> {
        match self {
            Only::Accepted => Some(KeyState::Accepted),
            Only::Pending => Some(KeyState::Pending),
            Only::Rejected => Some(KeyState::Rejected),
            Only::Denied => None,
        }
    }
}

/// Why a [`Guard`] does not let a change through.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The id is left alone (reported, as `decide`'s reasons).
    Skip(String),
    /// The whole command is refused, nothing written: the key is not the
    /// one whose fingerprint was given.
    Refuse(keycache::Error),
}

/// What `--finger` and `delete --state` ask of a change: the guard of the
/// local path and of the path through etcd.
#[derive(Debug, Clone, Default)]
pub(crate) struct Guard {
    /// The fingerprint the key acted on must have ([`keycache::pem::finger`]'s form).
    pub(crate) finger: Option<String>,
    /// `delete --state`.
    pub(crate) only: Option<Only>,
}

impl Guard {
    /// `change` (decided for an id whose `keys` entry is `key` and denied
    /// key `denied`) as the guard limits it.
    pub(crate) fn apply(
        &self,
        id: &MinionId,
        change: Change,
        key: Option<(KeyState, &[u8])>,
        denied: Option<&[u8]>,
    ) -> Result<Change, Refusal> {
        let mut change = change;
        if let (Some(only), Change::Remove { .. }) = (self.only, change) {
            change = match only.state() {
                None if denied.is_some() => Change::Remove {
                    key: false,
                    denied: true,
                },
                None => return Err(Refusal::Skip("no denied key".into())),
                Some(s) => match key {
                    Some((cur, _)) if cur == s => Change::Remove {
                        key: true,
                        denied: false,
                    },
                    Some((cur, _)) => return Err(Refusal::Skip(format!("is {cur}, not {s}"))),
                    None => return Err(Refusal::Skip("no such key".into())),
                },
            };
        }
        if let Some(fp) = &self.finger {
            let held = match change {
                Change::Remove {
                    key: false,
                    denied: true,
                } => denied,
                _ => key.map(|(_, p)| p),
            };
            keycache::pem::check_finger(id.as_str(), held, fp).map_err(Refusal::Refuse)?;
        }
        Ok(change)
    }
}

/// Which of the four commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// `keycache accept`.
    Accept,
    /// `keycache reject`.
    Reject,
    /// `keycache delete`.
    Delete,
    /// `keycache deny`.
    Deny,
}

impl Action {
    /// The command's name: `accept`, `reject`, `delete`, `deny`.
    pub(crate) fn command(self) -> &'static str {
        match self {
            Action::Accept => "accept",
            Action::Reject => "reject",
            Action::Delete => "delete",
            Action::Deny => "deny",
        }
    }
}

/// An id left alone, and why.
#[derive(Debug, Serialize)]
pub(crate) struct Skipped {
    pub(crate) id: String,
    pub(crate) reason: String,
}

/// What to do with one id, decided on its current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Remove its `keys` entry (`key`) and its `denied_keys` entry
    /// (`denied`).
    Remove { key: bool, denied: bool },
    /// Give its `keys` entry this state.
    SetState(KeyState),
    /// Remove its `keys` entry and store that entry's public key as its
    /// denied key (Salt's `Key.change_state(..., "minions_denied")`).
    Deny,
}

/// The change `action` makes to an id whose `keys` entry has the state
/// `cur` (`None`: absent) and that is `denied` or not; `Err`: why it is
/// left alone. The one decision of the local path and of the path through
/// etcd.
pub(crate) fn decide(
    action: Action,
    cur: Option<KeyState>,
    denied: bool,
    include_all: bool,
) -> Result<Change, String> {
    let (target, other) = match action {
        Action::Delete => {
            if cur.is_none() && !denied {
                return Err("no such key".into());
            }
            return Ok(Change::Remove {
                key: cur.is_some(),
                denied,
            });
        }
        Action::Deny => {
            return match cur {
                None => Err("no such key".into()),
                Some(KeyState::Pending) => Ok(Change::Deny),
                Some(_) if include_all => Ok(Change::Deny),
                Some(s) => Err(format!("is {s}; add --include-all to deny it")),
            };
        }
        Action::Accept => (KeyState::Accepted, KeyState::Rejected),
        Action::Reject => (KeyState::Rejected, KeyState::Accepted),
    };
    match cur {
        None => Err("no such key".into()),
        Some(s) if s == target => Err(format!("already {s}")),
        Some(s) if s == other && !include_all => {
            Err(format!("is {s}; add --include-all to change it"))
        }
        Some(_) => Ok(Change::SetState(target)),
    }
}

/// What the command did to the key tree: paths relative to the store's
/// directory.
#[derive(Debug, Default, Serialize)]
pub(crate) struct TreeReport {
    written: Vec<String>,
    removed: Vec<String>,
}

impl TreeReport {
    pub(crate) fn new(dir: &std::path::Path, ch: &TreeChanges) -> TreeReport {
        let rel = |p: &std::path::PathBuf| {
            p.strip_prefix(dir)
                .unwrap_or(p)
                .to_string_lossy()
                .into_owned()
        };
        TreeReport {
            written: ch.written.iter().map(rel).collect(),
            removed: ch.removed.iter().map(rel).collect(),
        }
    }
}

/// What a state change did: `{"<verb>": [ids done], "skipped": [...],
/// "tree": {"written": [...], "removed": [...]}}` (`tree` only when the
/// tree is kept in step by the command; `etcd_revision`, the revision of
/// the last commit, only when it went through etcd).
#[derive(Debug, Default, Serialize)]
pub(crate) struct StateReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    accepted: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rejected: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    denied: Option<Vec<String>>,
    skipped: Vec<Skipped>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tree: Option<TreeReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) etcd_revision: Option<i64>,
}

impl StateReport {
    pub(crate) fn new(
        action: Action,
        done: Vec<String>,
        skipped: Vec<Skipped>,
        tree: Option<TreeReport>,
    ) -> StateReport {
        let mut r = StateReport {
            skipped,
            tree,
            ..StateReport::default()
        };
        *match action {
            Action::Accept => &mut r.accepted,
            Action::Reject => &mut r.rejected,
            Action::Delete => &mut r.deleted,
            Action::Deny => &mut r.denied,
        } = Some(done);
        r
    }
}

/// Prints what a state change did (`json`: as one JSON document); exit
/// code 1 when an id was left alone, unless `all` did something.
pub(crate) fn print(report: StateReport, all: bool, json: bool) -> std::process::ExitCode {
    let done = [
        &report.accepted,
        &report.rejected,
        &report.deleted,
        &report.denied,
    ]
    .into_iter()
    .flatten()
    .map(Vec::len)
    .sum::<usize>();
    let ok = report.skipped.is_empty() || (all && done > 0);
    if json {
        print_json(&report);
        return exit(ok);
    }
    for (verb, ids) in [
        ("accepted", &report.accepted),
        ("rejected", &report.rejected),
        ("deleted", &report.deleted),
        ("denied", &report.denied),
    ] {
        for id in ids.iter().flatten() {
            outln!("Key for minion {} {verb}.", esc(id));
        }
    }
    if let Some(t) = &report.tree {
        print_tree_changes("Key tree: ", ".", &t.written, &t.removed);
    }
    for p in &report.skipped {
        errln!("keycache: {}: {}", esc(&p.id), p.reason);
    }
    exit(ok)
}
