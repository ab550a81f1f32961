//! `keycache accept`, `reject` and `delete`: `salt-key -a/-r/-d` and their
//! `--all` forms, keeping the `localfs_key` tree of the store's directory in
//! step (`--tree`; see `keycache::tree`).

use std::io::{BufRead, IsTerminal};

use serde::Serialize;

use keycache::store::KeyState;
use keycache::tree::{TreeChanges, TreeSync};
use keycache::MinionId;

use crate::args::{announce_lock_wait, minion_id, Json, Layout, StoreIds};
use crate::output::{
    errln, esc, esc_path, exit, outln, print_json, write_stderr, CmdError, CmdResult,
};

/// The arguments of `keycache accept`, `reject` and `delete`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    target: StoreIds,
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
    /// Keep the key tree of DIR (minions/, minions_pre/, minions_rejected/,
    /// minions_denied/) in step with the store: Salt 3008.5's validate_token
    /// reads DIR/minions/<id> on every request of a minion, whatever the key
    /// cache driver, so an accepted key needs its file there and a deleted
    /// or rejected one must lose it. `auto`: when DIR/minions exists (a
    /// migrated master).
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = TreeMode::Auto)]
    tree: TreeMode,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: Layout,
}

/// `--tree`: when the command writes the key tree along with the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TreeMode {
    /// Always (state directories are created as needed).
    Always,
    /// Never: the banks only.
    Never,
    /// When the store's directory holds a tree (a `minions` entry).
    Auto,
}

impl TreeMode {
    pub(crate) fn sync(self, dir: &std::path::Path) -> TreeSync {
        match self {
            TreeMode::Always => TreeSync::On,
            TreeMode::Never => TreeSync::Off,
            TreeMode::Auto => TreeSync::auto(dir),
        }
    }
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

/// What the command did to the key tree: paths relative to the store's
/// directory.
#[derive(Debug, Default, Serialize)]
struct TreeReport {
    written: Vec<String>,
    removed: Vec<String>,
}

impl TreeReport {
    fn new(dir: &std::path::Path, ch: &TreeChanges) -> TreeReport {
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
/// tree is kept in step).
#[derive(Debug, Default, Serialize)]
struct StateReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    accepted: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rejected: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted: Option<Vec<String>>,
    skipped: Vec<Skipped>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tree: Option<TreeReport>,
}

impl StateReport {
    fn new(
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
    let (dir, given) = c.target.split(&c.layout)?;
    match (c.all, given.is_empty()) {
        (false, true) => return Err(CmdError::usage("give minion ids or --all")),
        (true, false) => return Err(CmdError::usage("give minion ids or --all, not both")),
        _ => {}
    }
    let mut store = c.layout.open(&dir)?;
    store.set_tree(c.tree.sync(store.dir()));
    let mut ids: Vec<MinionId> = given
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
    let (_, _, changes) = store.batch_with_tree(|b| {
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
    let tree = store
        .tree()
        .is_on()
        .then(|| TreeReport::new(store.dir(), &changes));
    if c.json.json {
        print_json(&StateReport::new(action, done, problems, tree));
    } else {
        let verb = action.verb();
        for id in &done {
            outln!("Key for minion {} {verb}.", esc(id));
        }
        if let Some(t) = &tree {
            for p in &t.written {
                outln!("Key tree: wrote {}.", esc(p));
            }
            for p in &t.removed {
                outln!("Key tree: removed {}.", esc(p));
            }
        }
        for p in &problems {
            errln!("keycache: {}: {}", esc(&p.id), p.reason);
        }
    }
    Ok(exit(ok))
}
