//! `keycache accept`, `reject`, `delete` and `deny`: `salt-key -a/-r/-d` and
//! their `--all` forms, and Salt's `Key.change_state` into `minions_denied`
//! (which salt-key does not offer), keeping the `localfs_key` tree of the
//! store's directory in
//! step (`--tree`; see `keycache::tree`). When the master config has
//! `keycache_etcd`, the change goes through etcd instead
//! (`super::etcd::write`), decided the same way (`super::change::decide`). Either way
//! each change is recorded in the audit trail (`keycache::audit`), with
//! `--reason`.

use std::io::{BufRead, IsTerminal};

use keycache::store::KeyState;
use keycache::tree::TreeSync;
use keycache::MinionId;

use super::change::{
    decide, print, Action, Change, Guard, Only, Refusal, Skipped, StateReport, TreeReport,
};
use crate::args::{announce_lock_wait, minion_id, Json, Reason, StoreArgs, StoreIds};
use crate::output::{esc, esc_path, write_stderr, CmdError, CmdResult};

/// The arguments of `keycache accept`, `reject`, `delete` and `deny`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    target: StoreIds,
    /// Every key the command applies to (pending ones for accept, reject
    /// and deny).
    #[arg(long, short = 'A')]
    all: bool,
    /// Also act on rejected keys (accept), accepted keys (reject), or both
    /// (deny).
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
    /// migrated master). `accepted`: minions/ alone, always. Default: the
    /// master config's keycache_tree when the config is read (false:
    /// never, accepted: accepted), else auto.
    #[arg(long, value_enum, value_name = "WHEN")]
    tree: Option<TreeMode>,
    /// Change the key only if it is the one whose fingerprint is FP, as
    /// `salt-key -f ID` prints it (SHA-256, hex pairs with colons; without
    /// the colons too), checked under the bank's lock (through etcd: in the
    /// transaction): a key replaced since it was looked at (another
    /// sign-in) is refused, exit 2, nothing written. One id only. For
    /// delete: the key of the keys bank, else the denied key (or the one
    /// --state names).
    #[arg(long, value_name = "FP")]
    finger: Option<String>,
    /// delete only: remove only the id's key in this state (accepted,
    /// pending, rejected), keeping its denied key, or only its denied key
    /// (denied), keeping its keys entry.
    #[arg(long, value_enum, value_name = "STATE")]
    state: Option<Only>,
    #[command(flatten)]
    reason: Reason,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
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
    /// Only `minions/`, the directory Salt's validate_token reads, always
    /// (the other three are neither written nor compared).
    Accepted,
}

impl TreeMode {
    /// Opens the store `dir` names ([`StoreArgs::open`]) with the tree mode
    /// `given` (`--tree`); else, when the command reads the master config
    /// (see [`StoreArgs::config`]) and it sets `keycache_tree`, that: `false`
    /// never, `accepted` accepted, `true` the command's `default` (the
    /// driver keeps the tree in step then, and so does the command); else
    /// `default`. The config is read once, for the store and the mode.
    /// Also the master's id when the master config was read
    /// ([`crate::args::Resolved::master`]).
    pub(crate) fn open_master(
        given: Option<TreeMode>,
        layout: &StoreArgs,
        dir: &std::path::Path,
        default: TreeMode,
    ) -> Result<(keycache::Store, TreeMode, Option<String>), CmdError> {
        let r = layout.resolve(dir, true)?;
        let mode = given.unwrap_or(match r.tree {
            Some(TreeSync::Off) => TreeMode::Never,
            Some(TreeSync::Accepted) => TreeMode::Accepted,
            Some(TreeSync::On) | None => default,
        });
        let mut store = layout.open_with(&r.dir, layout.options(r.params))?;
        store.set_tree(mode.sync(store.dir()));
        Ok((store, mode, r.master))
    }

    /// [`TreeMode::open_master`] for a command that writes the store: a tree
    /// write that a killed writer left unfinished is finished first
    /// ([`keycache::Store::resume_tree`]), and said on stderr.
    pub(crate) fn open_writer(
        given: Option<TreeMode>,
        layout: &StoreArgs,
        dir: &std::path::Path,
        default: TreeMode,
    ) -> Result<(keycache::Store, TreeMode), CmdError> {
        let (store, mode, _) = TreeMode::open_writer_master(given, layout, dir, default)?;
        Ok((store, mode))
    }

    /// [`TreeMode::open_writer`] for a command that changes the key state:
    /// every change its writes make is recorded in the store's audit trail
    /// ([`keycache::Store::set_audit`]) as made by this process
    /// ([`crate::args::actor`]: the master config's id, `reason`, and
    /// `action` for a change made as a whole, `merge`). The store's
    /// [`keycache::Store::audit`] is the actor, for the path through etcd.
    pub(crate) fn open_recorded(
        given: Option<TreeMode>,
        layout: &StoreArgs,
        dir: &std::path::Path,
        default: TreeMode,
        reason: Option<String>,
        action: Option<&str>,
    ) -> Result<(keycache::Store, TreeMode), CmdError> {
        let (mut store, mode, master) = TreeMode::open_writer_master(given, layout, dir, default)?;
        store.set_audit(Some(crate::args::actor(master, reason, action)));
        Ok((store, mode))
    }

    fn open_writer_master(
        given: Option<TreeMode>,
        layout: &StoreArgs,
        dir: &std::path::Path,
        default: TreeMode,
    ) -> Result<(keycache::Store, TreeMode, Option<String>), CmdError> {
        let (store, mode, master) = TreeMode::open_master(given, layout, dir, default)?;
        // It takes the banks' locks.
        announce_lock_wait(store.dir());
        say_resumed(&store, store.resume_tree()?.as_slice());
        Ok((store, mode, master))
    }

    /// The store's setting in `dir` for this mode.
    pub(crate) fn sync(self, dir: &std::path::Path) -> TreeSync {
        match self {
            TreeMode::Always => TreeSync::On,
            TreeMode::Never => TreeSync::Off,
            TreeMode::Auto => TreeSync::auto(dir),
            TreeMode::Accepted => TreeSync::Accepted,
        }
    }
}

/// Says on stderr what was finished of interrupted tree writes of `store`
/// (by [`keycache::Store::resume_tree`], or by a write:
/// [`keycache::Store::take_resumed`]).
pub(crate) fn say_resumed(store: &keycache::Store, done: &[keycache::tree::Resumed]) {
    for r in done {
        crate::output::errln!(
            "keycache: {}: {r}",
            crate::output::esc(&store.dir().display().to_string())
        );
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

/// Runs `keycache accept`, `reject`, `delete` or `deny`.
pub(crate) fn run(c: Args, action: Action) -> CmdResult {
    let (dir, given) = c.target.split(&c.layout)?;
    match (c.all, given.is_empty()) {
        (false, true) => return Err(CmdError::usage("give minion ids or --all")),
        (true, false) => return Err(CmdError::usage("give minion ids or --all, not both")),
        _ => {}
    }
    let guard = Guard {
        finger: match &c.finger {
            None => None,
            Some(_) if c.all || given.len() != 1 => {
                return Err(CmdError::usage(
                    "--finger guards the change of one id: give one id",
                ))
            }
            Some(f) => Some(keycache::pem::parse_finger(f).ok_or_else(|| {
                CmdError::usage(format!(
                    "--finger {}: not a fingerprint (64 hex digits, in pairs separated by `:` \
                     as salt-key -f prints them)",
                    esc(f)
                ))
            })?),
        },
        only: c.state,
    };
    if c.state.is_some() && action != Action::Delete {
        return Err(CmdError::usage("--state limits delete only"));
    }
    // Every change is recorded in the audit trail (through etcd, in
    // etcd's, by the writer: the same actor).
    let (store, _) = TreeMode::open_recorded(
        c.tree,
        &c.layout,
        &dir,
        TreeMode::Auto,
        c.reason.reason.clone(),
        None,
    )?;
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
    // With keycache_etcd, etcd decides and holds the change; the
    // replicator brings it into this store (and its key tree). Without
    // it, a replica of etcd is not changed here alone.
    let etcd = super::etcd::configured(&c.layout, &dir)?;
    if etcd.is_none() {
        super::etcd::refuse_local_write(store.dir(), action.command())?;
    }
    if action == Action::Delete && c.all && !c.yes && !ids.is_empty() {
        confirm_delete_all(store.dir(), ids.len())?;
    }
    if let Some(settings) = etcd {
        let report =
            super::etcd::write::run(settings, &store, action, &ids, c.include_all, &guard)?;
        return Ok(print(report, c.all, c.json.json));
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
            let entry = b.get(id)?;
            let cur = entry.as_ref().map(|(s, _)| *s);
            let denied_key = if action == Action::Delete {
                store.denied(id)?
            } else {
                None
            };
            let denied = denied_key.is_some();
            let decided = match decide(action, cur, denied, c.include_all) {
                Err(why) => Err(why),
                Ok(ch) => match guard.apply(
                    id,
                    ch,
                    entry.as_ref().map(|(s, p)| (*s, p.as_slice())),
                    denied_key.as_deref(),
                ) {
                    Ok(ch) => Ok(ch),
                    Err(Refusal::Skip(why)) => Err(why),
                    // The whole batch: nothing is written.
                    Err(Refusal::Refuse(e)) => return Err(e),
                },
            };
            match decided {
                Err(reason) => skip(&mut problems, id, reason),
                Ok(Change::Remove { key, denied }) => {
                    if key {
                        b.remove(id)?;
                    }
                    if denied {
                        b.remove_denied(id)?;
                    }
                    done.push(id.to_string());
                }
                Ok(Change::SetState(target)) => {
                    b.set_state(id, target)?;
                    done.push(id.to_string());
                }
                Ok(Change::Deny) => {
                    // `decide` denies only an id it found in `keys`. The
                    // denied bank refuses an empty key or private key
                    // material before staging anything: left alone.
                    let pem = entry.map(|(_, p)| p).unwrap_or_default();
                    match b.deny(id, &pem) {
                        Err(keycache::Error::InvalidId { why, .. }) => {
                            skip(&mut problems, id, why.into())
                        }
                        r => {
                            r?;
                            b.remove(id)?;
                            done.push(id.to_string());
                        }
                    }
                }
            }
        }
        Ok(())
    })?;
    let tree = store
        .tree()
        .is_on()
        .then(|| TreeReport::new(store.dir(), &changes));
    let report = StateReport::new(action, done, problems, tree);
    Ok(print(report, c.all, c.json.json))
}
