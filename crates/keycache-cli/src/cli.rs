//! The `keycache` command line: migrate a `localfs_key` tree, and list,
//! inspect, change, verify, compact, export, compare and benchmark a store.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use keycache::format::{self, Params};
use keycache::migrate::{self, MigrateOptions};
use keycache::store::{KeyState, Store};
use keycache::table::OpenOptions;
use keycache::{verify, Error, MinionId};

/// keycache: Salt 3008 mmap_key minion-key stores, fast.
///
/// Works on the `.mmap_keys.idx` / `.mmap_denied.idx` banks that a Salt 3008
/// master with `keys.cache_driver: mmap_key` reads, byte for byte. Writes
/// interlock with a running master through the banks' `.lock` files.
#[derive(Debug, Parser)]
#[command(name = "keycache", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The layout options of Salt's master config; they must match the store.
#[derive(Debug, Clone, Args)]
pub struct Layout {
    /// Slots per table, header included (`mmap_key_size`). Default: inferred
    /// from an existing index file (after finishing a compaction a crash
    /// interrupted), else Salt's 1000000.
    #[arg(long, value_name = "N")]
    size: Option<u64>,
    /// Bytes per slot (`mmap_key_slot_size`).
    #[arg(long, value_name = "N", default_value_t = format::DEFAULT_SLOT_SIZE)]
    slot_size: usize,
    /// Bytes of minion id per slot (`mmap_key_id_size`).
    #[arg(long, value_name = "N", default_value_t = format::DEFAULT_ID_SIZE)]
    id_size: usize,
    /// Cap of one heap segment (`mmap_key_max_segment_bytes`).
    #[arg(long, value_name = "N", default_value_t = format::DEFAULT_MAX_SEGMENT_BYTES)]
    max_segment_bytes: u64,
}

impl Layout {
    /// The parameters, with the size inferred from `dir`'s index files
    /// (after finishing a compaction that a crash interrupted, which may
    /// change it).
    fn params(&self, dir: &Path) -> Result<Params, Error> {
        self.params_of(dir, true)
    }

    /// [`Layout::params`], finishing an interrupted compaction first only
    /// when `finish` (a dry run writes nothing).
    fn params_of(&self, dir: &Path, finish: bool) -> Result<Params, Error> {
        let base = self.options(Params {
            size: self.size.unwrap_or(format::DEFAULT_SIZE),
            slot_size: self.slot_size,
            id_size: self.id_size,
            max_segment_bytes: self.max_segment_bytes,
        });
        match (self.size, finish) {
            (Some(_), _) => Ok(base.params),
            (None, true) => Params::detect(dir, &base),
            (None, false) => Ok(Params::from_files(dir, base.params)),
        }
    }

    /// Open options with `params` and the tunables of the environment
    /// (`KEYCACHE_READ_RETRY_MS`, `KEYCACHE_REBUILD_SETTLE_MS`).
    fn options(&self, params: Params) -> OpenOptions {
        let ms = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(std::time::Duration::from_millis)
        };
        let d = OpenOptions::default();
        OpenOptions {
            params,
            read_retry: ms("KEYCACHE_READ_RETRY_MS").unwrap_or(d.read_retry),
            rebuild_settle: ms("KEYCACHE_REBUILD_SETTLE_MS").unwrap_or(d.rebuild_settle),
            ..d
        }
    }

    fn open(&self, dir: &Path) -> Result<Store, Error> {
        Store::open_with(dir, &self.options(self.params(dir)?))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Migrate a localfs_key tree (minions, minions_pre, minions_rejected,
    /// minions_denied) into mmap_key banks, atomically: what `salt-run
    /// pki.migrate_to_mmap` does, in one pass.
    ///
    /// An id found in several states gets the state Salt gives it (rejected,
    /// then pending, then accepted). Entries already in the target banks that
    /// the tree lacks are kept unless --replace. Symlinks, dot-files, invalid
    /// ids, non-UTF-8 names, unreadable, empty and non-PEM files are skipped
    /// and reported. A tree that would fill the table past 80% or hold an id
    /// longer than --id-size is refused before anything is written.
    Migrate {
        /// The master's pki_dir.
        pki_dir: PathBuf,
        /// Write the banks here (the cluster_pki_dir) instead of PKI_DIR.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Count and report, write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Drop entries of the target banks that the tree does not have.
        #[arg(long)]
        replace: bool,
        /// Skip ids longer than --id-size instead of refusing the tree.
        #[arg(long)]
        skip_long_ids: bool,
        /// Owner of the files written (user name or UID[:GID]), e.g. the
        /// Salt master's `user`. Default: the owner of the target directory.
        #[arg(long, value_name = "USER")]
        user: Option<String>,
        /// Print the report as one JSON document on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
    /// List keys like `salt-key -L` (with --json, like `salt-key --out json`).
    List {
        /// The store directory (pki_dir or cluster_pki_dir).
        dir: PathBuf,
        /// Only this group: accepted, pending (unaccepted), rejected or denied.
        #[arg(long, value_name = "S")]
        state: Option<String>,
        /// Include each public key.
        #[arg(long)]
        include_pub: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
    /// Show one id: state, public key, mtime, and its denied key if any.
    /// Exits 1 when the id is in neither bank.
    Get {
        /// The store directory.
        dir: PathBuf,
        /// The minion id.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
    /// Accept pending keys (`salt-key -a`, `-A` with --all).
    Accept(StateChange),
    /// Reject pending keys (`salt-key -r`, `-R` with --all).
    Reject(StateChange),
    /// Delete keys from both banks (`salt-key -d`, `-D` with --all).
    Delete(StateChange),
    /// Counts per state, header counters, load factor, probe lengths and heap usage.
    Stats {
        /// The store directory.
        dir: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
    /// Check header counters, roster, probe chains, duplicates and every
    /// record's bounds and checksum; exits 1 on any finding.
    Verify {
        /// The store directory.
        dir: PathBuf,
        /// Rebuild each bank with findings from its intact entries, atomically,
        /// and list what was lost.
        #[arg(long)]
        repair: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
    /// Rebuild both banks without garbage and tombstones, atomically,
    /// optionally into a table of another size.
    Compact {
        /// The store directory.
        dir: PathBuf,
        /// New table size; the Salt master config then needs `mmap_key_size: N`.
        #[arg(long = "to-size", value_name = "N")]
        to_size: Option<u64>,
        /// Owner of the files written (user name or UID[:GID]). Default: the
        /// owner of the files replaced.
        #[arg(long, value_name = "USER")]
        user: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
    /// Write the store back out as a localfs_key tree.
    Export {
        /// The store directory.
        dir: PathBuf,
        /// The pki_dir to write minions, minions_pre, ... into.
        #[arg(long, value_name = "PKI_DIR")]
        to: PathBuf,
        /// Overwrite key files whose content differs.
        #[arg(long)]
        force: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
    /// Compare two stores (peers of an isolated-filesystem cluster); exits 1
    /// when they differ.
    Diff {
        /// First store directory.
        a: PathBuf,
        /// Second store directory.
        b: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
    /// Measure lookup throughput of an existing store on this machine.
    Bench {
        /// The store directory.
        dir: PathBuf,
        /// Reader threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        layout: Layout,
    },
}

#[derive(Debug, Args)]
struct StateChange {
    /// The store directory.
    dir: PathBuf,
    /// Minion ids.
    ids: Vec<String>,
    /// Every key the command applies to (pending ones for accept and reject).
    #[arg(long, short = 'A')]
    all: bool,
    /// Also act on rejected keys (accept) or accepted keys (reject).
    #[arg(long)]
    include_all: bool,
    /// JSON output.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    layout: Layout,
}

/// A failure of a command: the message is printed to stderr, the code returned.
pub(crate) struct Fail(pub(crate) u8, pub(crate) String);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail(2, e.to_string())
    }
}

type Out = Result<ExitCode, Fail>;

fn color() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stdout().is_terminal()
}

fn paint(s: &str, code: &str) -> String {
    if color() {
        format!("\x1b[{code}m{s}\x1b[0m")
    } else {
        s.to_owned()
    }
}

fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, v);
    let _ = writeln!(out);
}

fn minion_id(s: &str) -> Result<MinionId, Fail> {
    MinionId::new(s).map_err(|e| Fail(2, e.to_string()))
}

/// Runs the command line; the binary's `main`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(Fail(code, msg)) => {
            eprintln!("keycache: {msg}");
            ExitCode::from(code)
        }
    }
}

fn run(cmd: Command) -> Out {
    match cmd {
        Command::Migrate {
            pki_dir,
            out,
            dry_run,
            replace,
            skip_long_ids,
            user,
            json,
            layout,
        } => {
            let target = out.clone().unwrap_or_else(|| pki_dir.clone());
            let params = layout.params_of(&target, !dry_run)?;
            let opts = MigrateOptions {
                rebuild_settle: layout.options(params).rebuild_settle,
                params,
                out,
                dry_run,
                replace,
                skip_long_ids,
                ownership: user
                    .as_deref()
                    .map(keycache::files::Ownership::for_user)
                    .transpose()?,
            };
            cmd_migrate(&pki_dir, &opts, json)
        }
        Command::List {
            dir,
            state,
            include_pub,
            json,
            layout,
        } => cmd_list(&layout.open(&dir)?, state, include_pub, json),
        Command::Get {
            dir,
            id,
            json,
            layout,
        } => cmd_get(&layout.open(&dir)?, &id, json),
        Command::Accept(c) => cmd_state(c, Action::Accept),
        Command::Reject(c) => cmd_state(c, Action::Reject),
        Command::Delete(c) => cmd_state(c, Action::Delete),
        Command::Stats { dir, json, layout } => cmd_stats(&layout.open(&dir)?, json),
        Command::Verify {
            dir,
            repair,
            json,
            layout,
        } => cmd_verify(&layout.open(&dir)?, repair, json),
        Command::Compact {
            dir,
            to_size,
            user,
            json,
            layout,
        } => {
            let ownership = user
                .as_deref()
                .map(keycache::files::Ownership::for_user)
                .transpose()?;
            let store = Store::open_with(
                &dir,
                &OpenOptions {
                    ownership,
                    ..layout.options(layout.params(&dir)?)
                },
            )?;
            let before = store.stats()?;
            store.compact(to_size)?;
            let size = to_size.unwrap_or(store.keys_table().params().size);
            let after_layout = Layout {
                size: Some(size),
                ..layout
            };
            let after = after_layout.open(&dir)?.stats()?;
            let v = json!({
                "size": size,
                "before": {"heap_total_bytes": before.keys.heap_total_bytes + before.denied_keys.heap_total_bytes,
                           "deleted": before.keys.deleted + before.denied_keys.deleted},
                "after": {"heap_total_bytes": after.keys.heap_total_bytes + after.denied_keys.heap_total_bytes,
                          "deleted": after.keys.deleted + after.denied_keys.deleted},
                "config": format!("mmap_key_size: {size}"),
            });
            if json {
                print_json(&v);
            } else {
                println!(
                    "compacted {}: heap {} -> {} bytes, {} -> 0 deleted slots",
                    dir.display(),
                    v["before"]["heap_total_bytes"],
                    v["after"]["heap_total_bytes"],
                    v["before"]["deleted"]
                );
                if to_size.is_some() {
                    println!("table size is now {size}: set `mmap_key_size: {size}` in the Salt master config");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Export {
            dir,
            to,
            force,
            json,
            layout,
        } => cmd_export(&layout.open(&dir)?, &to, force, json),
        Command::Diff { a, b, json, layout } => {
            cmd_diff(&layout.open(&a)?, &layout.open(&b)?, json)
        }
        Command::Bench {
            dir,
            threads,
            seconds,
            json,
            layout,
        } => crate::bench::cmd_bench(&layout.open(&dir)?, threads, seconds, json),
    }
}

fn cmd_migrate(pki_dir: &Path, opts: &MigrateOptions, json: bool) -> Out {
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} reading keys {pos}/{len} [{bar:30}] {per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let report = migrate::migrate(pki_dir, opts, &progress);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = report?;
    if json {
        print_json(&serde_json::to_value(&report).unwrap_or(Value::Null));
        return Ok(ExitCode::SUCCESS);
    }
    let c = &report.migrated;
    println!(
        "{} {} -> {}",
        if report.dry_run {
            "would migrate"
        } else {
            "migrated"
        },
        report.pki_dir.display(),
        report.target.display()
    );
    println!(
        "  accepted: {}\n  pending:  {}\n  rejected: {}\n  denied:   {}",
        c.accepted, c.pending, c.rejected, c.denied
    );
    let k = &report.kept;
    if k.accepted + k.pending + k.rejected + k.denied > 0 {
        println!(
            "kept from the existing banks: {} accepted, {} pending, {} rejected, {} denied",
            k.accepted, k.pending, k.rejected, k.denied
        );
    }
    if report.dropped > 0 {
        println!(
            "dropped from the existing banks (--replace): {}",
            report.dropped
        );
    }
    for d in &report.duplicates {
        let states: Vec<&str> = d.found_in.iter().map(|s| s.name()).collect();
        println!(
            "duplicate: {} found {} -> {}",
            d.id,
            states.join(", "),
            d.state
        );
    }
    for s in &report.skipped {
        let reason = serde_json::to_value(&s.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        println!("skipped: {} ({reason}: {})", s.path, s.detail);
    }
    println!(
        "table size {} ({:.2}% full), {:.3} s",
        report.size,
        report.load_factor * 100.0,
        report.seconds
    );
    Ok(ExitCode::SUCCESS)
}

/// The salt-key groups, in `salt-key -L` order: (json key, heading, color).
const GROUPS: [(&str, &str, &str); 4] = [
    ("minions", "Accepted Keys:", "32"),
    ("minions_denied", "Denied Keys:", "35"),
    ("minions_pre", "Unaccepted Keys:", "31"),
    ("minions_rejected", "Rejected Keys:", "34"),
];

fn group_of(s: &str) -> Result<&'static str, Fail> {
    Ok(match s {
        "accepted" | "acc" | "minions" => "minions",
        "pending" | "unaccepted" | "un" | "pre" | "minions_pre" => "minions_pre",
        "rejected" | "rej" | "minions_rejected" => "minions_rejected",
        "denied" | "den" | "minions_denied" => "minions_denied",
        _ => {
            return Err(Fail(
                2,
                format!("unknown state {s:?}: use accepted, pending, rejected or denied"),
            ))
        }
    })
}

/// Reads both banks into salt-key's groups: group -> [(id, pem)].
/// salt-key groups: (group name, [(id, pem)]).
type Groups = Vec<(&'static str, Vec<(String, Vec<u8>)>)>;

fn groups(store: &Store) -> Result<Groups, Fail> {
    let mut out: Groups = GROUPS.iter().map(|g| (g.0, Vec::new())).collect();
    let mut bad = Vec::new();
    for r in store.keys(None)? {
        match r {
            Ok((id, e)) => {
                let g = e.state.dir_name();
                if let Some(slot) = out.iter_mut().find(|x| x.0 == g) {
                    slot.1.push((id, e.public_key));
                }
            }
            Err(e) => bad.push(e.to_string()),
        }
    }
    for r in store.denied_keys()? {
        match r {
            Ok((id, pem)) => out[1].1.push((id, pem)),
            Err(e) => bad.push(e.to_string()),
        }
    }
    for b in &bad {
        eprintln!("keycache: {b}");
    }
    for g in &mut out {
        g.1.sort();
    }
    Ok(out)
}

fn cmd_list(store: &Store, state: Option<String>, include_pub: bool, json: bool) -> Out {
    let only = state.as_deref().map(group_of).transpose()?;
    let groups = groups(store)?;
    let shown = groups.iter().filter(|g| only.is_none_or(|o| o == g.0));
    if json {
        let mut obj = serde_json::Map::new();
        for (name, entries) in shown {
            let v = if include_pub {
                Value::Object(
                    entries
                        .iter()
                        .map(|(id, pem)| {
                            (
                                id.clone(),
                                Value::String(String::from_utf8_lossy(pem).into_owned()),
                            )
                        })
                        .collect(),
                )
            } else {
                Value::Array(
                    entries
                        .iter()
                        .map(|(id, _)| Value::String(id.clone()))
                        .collect(),
                )
            };
            obj.insert((*name).to_owned(), v);
        }
        print_json(&Value::Object(obj));
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    for (name, entries) in shown {
        let (_, heading, code) = GROUPS
            .iter()
            .find(|g| g.0 == *name)
            .copied()
            .unwrap_or(GROUPS[0]);
        let _ = writeln!(out, "{}", paint(heading, code));
        for (id, pem) in entries {
            let _ = writeln!(out, "{}", paint(id, code));
            if include_pub {
                let _ = write!(out, "{}", String::from_utf8_lossy(pem));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_get(store: &Store, id: &str, json: bool) -> Out {
    let id = minion_id(id)?;
    let entry = store.get(&id)?;
    let denied = store.denied(&id)?;
    let found = entry.is_some() || denied.is_some();
    if json {
        print_json(&json!({
            "id": id.as_str(),
            "state": entry.as_ref().map(|e| e.state.name()),
            "pub": entry.as_ref().map(|e| String::from_utf8_lossy(&e.public_key).into_owned()),
            "mtime_ns": entry.as_ref().map(|e| e.mtime),
            "denied_pub": denied.as_ref().map(|d| String::from_utf8_lossy(d).into_owned()),
        }));
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
    Ok(if found {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Formats unix nanoseconds as UTC `YYYY-MM-DD HH:MM:SS`.
fn fmt_time(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil-from-days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Clone, Copy, PartialEq)]
enum Action {
    Accept,
    Reject,
    Delete,
}

fn cmd_state(c: StateChange, action: Action) -> Out {
    let store = c.layout.open(&c.dir)?;
    if c.all != c.ids.is_empty() {
        return Err(Fail(2, "give minion ids or --all, not both".into()));
    }
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
    let mut done: Vec<String> = Vec::new();
    let mut problems: Vec<(String, String)> = Vec::new();
    store.batch(|b| {
        for id in &ids {
            let cur = b.get(id)?;
            match action {
                Action::Delete => {
                    let denied = store.is_denied(id)?;
                    if cur.is_none() && !denied {
                        problems.push((id.to_string(), "no such key".into()));
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
                        None => problems.push((id.to_string(), "no such key".into())),
                        Some((s, _)) if s == target => {
                            problems.push((id.to_string(), format!("already {s}")))
                        }
                        Some((s, _)) if s == other && !c.include_all => problems.push((
                            id.to_string(),
                            format!("is {s}; add --include-all to change it"),
                        )),
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
    let verb = match action {
        Action::Accept => "accepted",
        Action::Reject => "rejected",
        Action::Delete => "deleted",
    };
    if c.json {
        let skipped: Vec<Value> = problems
            .iter()
            .map(|(i, w)| json!({"id": i, "reason": w}))
            .collect();
        print_json(&json!({ verb: done, "skipped": skipped }));
    } else {
        for id in &done {
            println!("Key for minion {id} {verb}.");
        }
        for (id, why) in &problems {
            eprintln!("keycache: {id}: {why}");
        }
    }
    Ok(if problems.is_empty() || (c.all && !done.is_empty()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn cmd_stats(store: &Store, json: bool) -> Out {
    let counts = store.counts()?;
    let stats = store.stats()?;
    let pk = verify::probe_stats(store.keys_table())?;
    let pd = verify::probe_stats(store.denied_table())?;
    let bank = |s: &keycache::table::TableStats, p: &verify::ProbeStats| {
        json!({
            "capacity": s.capacity, "occupied": s.occupied, "deleted": s.deleted,
            "load_factor": s.load_factor, "high_water": s.high_water,
            "probe_length": {"mean": p.mean, "p99": p.p99, "max": p.max},
            "heap_live_bytes": s.heap_live_bytes, "heap_total_bytes": s.heap_total_bytes,
            "garbage_ratio": if s.heap_total_bytes > 0 { 1.0 - s.heap_live_bytes as f64 / s.heap_total_bytes as f64 } else { 0.0 },
            "segments": s.segments,
        })
    };
    let v = json!({
        "counts": counts,
        "params": {"size": store.keys_table().params().size, "slot_size": store.keys_table().params().slot_size,
                   "id_size": store.keys_table().params().id_size, "max_segment_bytes": store.keys_table().params().max_segment_bytes},
        "keys": bank(&stats.keys, &pk),
        "denied_keys": bank(&stats.denied_keys, &pd),
    });
    if json {
        print_json(&v);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "keys: {} accepted, {} pending, {} rejected; {} denied",
        counts.accepted, counts.pending, counts.rejected, counts.denied
    );
    for name in ["keys", "denied_keys"] {
        let b = &v[name];
        println!("{name}:");
        println!(
            "  slots:      {} occupied, {} deleted of {} (load factor {:.4})",
            b["occupied"],
            b["deleted"],
            b["capacity"],
            b["load_factor"].as_f64().unwrap_or(0.0)
        );
        println!(
            "  probes:     mean {:.3}, p99 {}, max {}",
            b["probe_length"]["mean"].as_f64().unwrap_or(0.0),
            b["probe_length"]["p99"],
            b["probe_length"]["max"]
        );
        println!(
            "  heap:       {} live of {} bytes (garbage {:.1}%), {} segment(s)",
            b["heap_live_bytes"],
            b["heap_total_bytes"],
            b["garbage_ratio"].as_f64().unwrap_or(0.0) * 100.0,
            b["segments"]
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_verify(store: &Store, repair: bool, json: bool) -> Out {
    let banks: [(&str, &keycache::table::Table, Option<verify::ValueCheck>); 2] = [
        ("keys", store.keys_table(), Some(verify::check_key_value)),
        ("denied_keys", store.denied_table(), None),
    ];
    let mut all = Vec::new();
    let mut repaired = Vec::new();
    for (name, t, check) in banks {
        let findings = verify::verify(t, check)?;
        if repair && !findings.is_empty() {
            let r = verify::repair(t, check)?;
            let after = verify::verify(t, check)?;
            repaired.push(
                json!({"bank": name, "kept": r.kept, "lost": r.lost, "findings_after": after}),
            );
        }
        all.extend(findings.into_iter().map(|f| (name, f)));
    }
    if json {
        let f: Vec<Value> = all
            .iter()
            .map(|(b, f)| json!({"bank": b, "finding": f}))
            .collect();
        print_json(&json!({"clean": all.is_empty(), "findings": f, "repaired": repaired}));
    } else {
        for (b, f) in &all {
            let mut loc = format!("{}", f.file.display());
            if let Some(o) = f.offset {
                loc.push_str(&format!(" @{o}"));
            }
            if let Some(s) = f.slot {
                loc.push_str(&format!(" slot {s}"));
            }
            if let Some(i) = &f.id {
                loc.push_str(&format!(" id {i:?}"));
            }
            println!("{b}: {loc}: {}", f.what);
        }
        for r in &repaired {
            println!(
                "repaired {}: kept {} entries, lost {}",
                r["bank"],
                r["kept"],
                r["lost"].as_array().map_or(0, |a| a.len())
            );
            for l in r["lost"].as_array().into_iter().flatten() {
                println!("  lost {}: {}", l[0], l[1]);
            }
        }
        if all.is_empty() {
            println!("{}: clean", store.dir().display());
        }
    }
    let still_bad = repaired.iter().any(|r| {
        r["findings_after"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    });
    let lost = repaired
        .iter()
        .any(|r| r["lost"].as_array().is_some_and(|a| !a.is_empty()));
    // Clean, or repaired back to clean without losing an entry.
    let ok = all.is_empty() || (repair && !still_bad && !lost);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn cmd_diff(a: &Store, b: &Store, json: bool) -> Out {
    use std::collections::BTreeMap;
    type Entries = BTreeMap<(String, &'static str), (String, Vec<u8>)>;
    fn all(s: &Store) -> Result<Entries, Fail> {
        let mut m = BTreeMap::new();
        for r in s.keys(None)? {
            let (id, e) = r?;
            m.insert((id, "keys"), (e.state.name().to_owned(), e.public_key));
        }
        for r in s.denied_keys()? {
            let (id, pem) = r?;
            m.insert((id, "denied_keys"), ("denied".to_owned(), pem));
        }
        Ok(m)
    }
    let (ma, mb) = (all(a)?, all(b)?);
    let mut only_a = Vec::new();
    let mut only_b = Vec::new();
    let mut differ = Vec::new();
    for (k, va) in &ma {
        match mb.get(k) {
            None => only_a.push(json!({"id": k.0, "bank": k.1, "state": va.0})),
            Some(vb) if vb != va => differ.push(json!({
                "id": k.0, "bank": k.1, "state_a": va.0, "state_b": vb.0, "same_key": va.1 == vb.1,
            })),
            _ => {}
        }
    }
    for (k, vb) in &mb {
        if !ma.contains_key(k) {
            only_b.push(json!({"id": k.0, "bank": k.1, "state": vb.0}));
        }
    }
    let same = only_a.is_empty() && only_b.is_empty() && differ.is_empty();
    if json {
        print_json(&json!({"same": same, "only_a": only_a, "only_b": only_b, "differ": differ}));
    } else {
        for e in &only_a {
            println!(
                "only in A: {} ({})",
                e["id"].as_str().unwrap_or(""),
                e["state"].as_str().unwrap_or("")
            );
        }
        for e in &only_b {
            println!(
                "only in B: {} ({})",
                e["id"].as_str().unwrap_or(""),
                e["state"].as_str().unwrap_or("")
            );
        }
        for e in &differ {
            println!(
                "differs:   {} (A {}, B {}{})",
                e["id"].as_str().unwrap_or(""),
                e["state_a"].as_str().unwrap_or(""),
                e["state_b"].as_str().unwrap_or(""),
                if e["same_key"] == true {
                    ""
                } else {
                    ", different keys"
                }
            );
        }
        if same {
            println!("same: {} entries", ma.len());
        }
    }
    Ok(if same {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn cmd_export(
    store: &Store,
    to: &Path,
    force: bool,
    json: bool,
) -> std::result::Result<ExitCode, Fail> {
    let r = keycache::export::export(store, to, force)?;
    if json {
        println!("{}", json!(r));
    } else {
        println!(
            "exported to {}: {} written, {} unchanged",
            to.display(),
            r.written,
            r.unchanged
        );
        for c in &r.conflicts {
            eprintln!(
                "keycache: {c}: exists with different content; not overwritten (use --force)"
            );
        }
    }
    Ok(if r.conflicts.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
