//! `keycache accept`, `reject` and `delete`: `salt-key -a/-r/-d` and their
//! `--all` forms.

use std::io::{BufRead, IsTerminal};

use serde::Serialize;

use keycache::store::KeyState;
use keycache::MinionId;

use crate::args::{announce_lock_wait, minion_id, Json, Layout, StoreDir};
use crate::output::{
    errln, esc, esc_path, exit, outln, print_json, write_stderr, CmdError, CmdResult,
};

/// The arguments of `keycache accept`, `reject` and `delete`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    store: StoreDir,
    /// Minion ids.
    ids: Vec<String>,
    /// Every key the command applies to (pending ones for accept and reject).
    #[arg(long, short = 'A')]
    all: bool,
    /// Also act on rejected keys (accept) or accepted keys (reject).
    #[arg(long)]
    include_all: bool,
    /// Do not ask: `delete --all` asks for confirmation on the terminal, as
    /// `salt-key -D` does, and refuses without a terminal unless given -y.
    #[arg(long, short = 'y')]
    yes: bool,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// Which of the three commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// `keycache accept`.
    Accept,
    /// `keycache reject`.
    Reject,
    /// `keycache delete`.
    Delete,
}

impl Action {
    /// The past participle the output uses (and the JSON key of the ids done).
    fn verb(self) -> &'static str {
        match self {
            Action::Accept => "accepted",
            Action::Reject => "rejected",
            Action::Delete => "deleted",
        }
    }
}

/// An id left alone, and why.
#[derive(Debug, Serialize)]
struct Skipped {
    id: String,
    reason: String,
}

/// What a state change did: `{"<verb>": [ids done], "skipped": [...]}`.
#[derive(Debug, Default, Serialize)]
struct StateReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    accepted: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rejected: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted: Option<Vec<String>>,
    skipped: Vec<Skipped>,
}

impl StateReport {
    fn new(action: Action, done: Vec<String>, skipped: Vec<Skipped>) -> StateReport {
        let mut r = StateReport {
            skipped,
            ..StateReport::default()
        };
        *match action {
            Action::Accept => &mut r.accepted,
            Action::Reject => &mut r.rejected,
            Action::Delete => &mut r.deleted,
        } = Some(done);
        r
    }
}

/// Asks on the terminal whether to delete every key of `dir` (`n` ids);
/// refuses without a terminal on stdin.
fn confirm_delete_all(dir: &std::path::Path, n: usize) -> Result<(), CmdError> {
    let dir = esc_path(dir);
    if !std::io::stdin().is_terminal() {
        return Err(CmdError::usage(format!(
            "delete --all would delete all {n} keys of {dir}: add -y (--yes) to confirm (there is no terminal to ask on)"
        )));
    }
    write_stderr(format_args!(
        "The following keys are going to be deleted: all {n} keys of {dir}.\nProceed? [N/y] "
    ));
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CmdError::usage(format!("reading the answer: {e}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "Yes" | "YES") {
        Ok(())
    } else {
        Err(CmdError::usage("not confirmed: nothing deleted"))
    }
}

/// Runs `keycache accept`, `reject` or `delete`.
pub(crate) fn run(c: Args, action: Action) -> CmdResult {
    match (c.all, c.ids.is_empty()) {
        (false, true) => return Err(CmdError::usage("give minion ids or --all")),
        (true, false) => return Err(CmdError::usage("give minion ids or --all, not both")),
        _ => {}
    }
    let store = c.layout.open(&c.store.dir)?;
    let mut ids: Vec<MinionId> = c
        .ids
        .iter()
        .map(|s| minion_id(s))
        .collect::<Result<_, _>>()?;
    if c.all {
        for r in store.keys(None)? {
            let (id, e) = r?;
            let wanted = match action {
                Action::Delete => true,
                _ => e.state == KeyState::Pending || c.include_all,
            };
            if wanted {
                ids.push(minion_id(&id)?);
            }
        }
        if action == Action::Delete {
            for r in store.denied_keys()? {
                let (id, _) = r?;
                let id = minion_id(&id)?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
    }
    if action == Action::Delete && c.all && !c.yes && !ids.is_empty() {
        confirm_delete_all(store.dir(), ids.len())?;
    }
    announce_lock_wait(store.dir());
    let mut done: Vec<String> = Vec::new();
    let mut problems: Vec<Skipped> = Vec::new();
    let skip = |problems: &mut Vec<Skipped>, id: &MinionId, reason: String| {
        problems.push(Skipped {
            id: id.to_string(),
            reason,
        })
    };
    store.batch(|b| {
        for id in &ids {
            let cur = b.get(id)?;
            match action {
                Action::Delete => {
                    let denied = store.is_denied(id)?;
                    if cur.is_none() && !denied {
                        skip(&mut problems, id, "no such key".into());
                        continue;
                    }
                    if cur.is_some() {
                        b.remove(id)?;
                    }
                    if denied {
                        b.remove_denied(id)?;
                    }
                    done.push(id.to_string());
                }
                Action::Accept | Action::Reject => {
                    let (target, other) = if action == Action::Accept {
                        (KeyState::Accepted, KeyState::Rejected)
                    } else {
                        (KeyState::Rejected, KeyState::Accepted)
                    };
                    match cur {
                        None => skip(&mut problems, id, "no such key".into()),
                        Some((s, _)) if s == target => {
                            skip(&mut problems, id, format!("already {s}"))
                        }
                        Some((s, _)) if s == other && !c.include_all => skip(
                            &mut problems,
                            id,
                            format!("is {s}; add --include-all to change it"),
                        ),
                        Some(_) => {
                            b.set_state(id, target)?;
                            done.push(id.to_string());
                        }
                    }
                }
            }
        }
        Ok(())
    })?;
    let ok = problems.is_empty() || (c.all && !done.is_empty());
    if c.json.json {
        print_json(&StateReport::new(action, done, problems));
    } else {
        let verb = action.verb();
        for id in &done {
            outln!("Key for minion {} {verb}.", esc(id));
        }
        for p in &problems {
            errln!("keycache: {}: {}", esc(&p.id), p.reason);
        }
    }
    Ok(exit(ok))
}
