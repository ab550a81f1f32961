//! The commands, one module each, and the dispatch ([`run`]).

mod bench;
mod change;
mod compact;
mod diff;
mod etcd;
mod export;
mod generate;
mod get;
mod history;
mod list;
mod master_pair;
mod merge;
mod migrate;
mod notify;
mod replicate;
mod snapshot;
mod state;
mod stats;
mod verify;

use clap::{Parser, Subcommand};

use crate::output::CmdResult;

/// keycache: Salt 3008 mmap_key minion-key stores, fast.
///
/// Works on the `.mmap_keys.idx` / `.mmap_denied.idx` banks that a Salt 3008
/// master with `keys.cache_driver: mmap_key` reads, byte for byte. Writes
/// interlock with a running master through the banks' `.lock` files.
#[derive(Debug, Parser)]
#[command(name = "keycache", version, about, long_about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    ///
    /// The master's own key files go into the master_keys bank, under the
    /// names Salt's MasterKeys reads for the master id (the config's `id`).
    /// Refused, before anything is written: a pki_dir whose master key pair
    /// is not found under those names, and a master_keys entry holding other
    /// bytes than its file (--replace-master-keys replaces it). Banks written
    /// into another directory than the tree (--out) get the key tree there
    /// too, where Salt's validate_token reads it.
    Migrate(migrate::Args),
    /// List keys like `salt-key -L` (with --json, like `salt-key --out json`).
    /// Exits 2 when entries cannot be read (after listing the others) or a
    /// key is withheld because it holds private key material.
    List(list::Args),
    /// Show one id: state, public key, mtime, and its denied key if any.
    /// Exits 1 when the id is in neither bank, 2 when a key is withheld
    /// because it holds private key material.
    Get(get::Args),
    /// Accept pending keys (`salt-key -a`, `-A` with --all). With
    /// keycache_etcd in the master config, through etcd (as reject and
    /// delete): done once this master's replica holds the change.
    Accept(state::Args),
    /// Reject pending keys (`salt-key -r`, `-R` with --all).
    Reject(state::Args),
    /// Delete keys from both banks (`salt-key -d`, `-D` with --all, which
    /// asks for confirmation on the terminal unless -y).
    Delete(state::Args),
    /// Deny pending keys (--include-all: any key): the id's key leaves the
    /// keys bank for denied_keys, as Salt's Key.change_state(...,
    /// "minions_denied") moves it (salt-key has no option for it). The
    /// minion is refused; a later sign-in of it is pending again, as Salt
    /// treats any id without a keys entry.
    Deny(state::Args),
    /// The store's audit trail: every change of the key state, oldest
    /// first (time, id, action, from -> to, who, which program and master,
    /// why, the key's fingerprint), as every keycache writer records it
    /// (the CLI, the Salt driver, in etcd mode every master's).
    /// `--json`: one object per line. No log yet: no output, exit 0.
    History(history::Args),
    /// Counts per state, header counters, load factor, probe lengths and heap usage.
    Stats(stats::Args),
    /// Check header counters, roster, probe chains, duplicates and every
    /// record's bounds and checksum; exits 1 on any finding.
    Verify(verify::Args),
    /// Rebuild both banks without garbage and tombstones, atomically,
    /// optionally into a table of another size.
    Compact(compact::Args),
    /// Write the store back out as a localfs_key tree, made equal to the
    /// store: key files of ids no longer in that state are removed (see
    /// --dry-run). A symlink or directory under a key's name is refused
    /// before anything is written; keys holding private key material are
    /// never written.
    Export(export::Args),
    /// Write the master's key pair out of the master_keys bank as
    /// master.pem (mode 0600) and master.pub in a directory, for a second
    /// master (Salt's multi-master setup copies those two files; under
    /// keycache they live only in the bank). Never to a terminal or stdout,
    /// never over an existing file.
    ExportMasterKeys(master_pair::Args),
    /// Compare two stores (peers of an isolated-filesystem cluster); exits 1
    /// when they differ.
    Diff(diff::Args),
    /// Write the keys and denied_keys banks as of one moment (taken under
    /// the banks' locks), with each entry's version and the store's
    /// tombstones, as one checksummed snapshot file, to stdout (-o -, the
    /// default; never a terminal) or a file: what `keycache merge` on
    /// another peer reads (`ssh peer keycache snapshot | keycache merge -`).
    /// Never the master_keys bank.
    Snapshot(snapshot::Args),
    /// Merge a peer's snapshot into the store: per entry, the later version
    /// (deletions included, as tombstones), so that merges in any order
    /// converge and never undo a revocation. Refuses (exit 2, nothing
    /// written) the store's own snapshot, another cluster's, a replayed or
    /// stale one, and one that would revoke most keys at once. Exits 1 when
    /// entries were held pending for an operator.
    Merge(merge::Args),
    /// Keep the store a live replica of the key state in etcd (the master
    /// config's keycache_etcd), in the foreground, forever: list etcd's
    /// prefix, make the store (and its key tree) equal to it, then apply
    /// every change etcd commits. One line per change on stderr (JSON
    /// lines on stdout with --json). Run it under a service manager
    /// (keycache-replicate.service: the Debian package installs it in
    /// /lib/systemd/system).
    Replicate(replicate::Args),
    /// The key state in etcd: seed a prefix, a replica's status, the store
    /// against etcd.
    Etcd(etcd::Args),
    /// Measure lookup throughput of an existing store on this machine.
    Bench(bench::Args),
    /// Write the man page or a shell's completion script to stdout, made
    /// from these definitions (for packagers).
    #[command(hide = true)]
    Generate(generate::Args),
}

/// Runs a command; its exit code, or why it failed.
pub(crate) fn run(cmd: Command) -> CmdResult {
    match cmd {
        Command::Migrate(a) => migrate::run(a),
        Command::List(a) => list::run(a),
        Command::Get(a) => get::run(a),
        Command::Accept(a) => state::run(a, change::Action::Accept),
        Command::Reject(a) => state::run(a, change::Action::Reject),
        Command::Delete(a) => state::run(a, change::Action::Delete),
        Command::Deny(a) => state::run(a, change::Action::Deny),
        Command::History(a) => history::run(a),
        Command::Stats(a) => stats::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Compact(a) => compact::run(a),
        Command::Export(a) => export::run(a),
        Command::ExportMasterKeys(a) => master_pair::run(a),
        Command::Diff(a) => diff::run(a),
        Command::Snapshot(a) => snapshot::run(a),
        Command::Merge(a) => merge::run(a),
        Command::Replicate(a) => replicate::run(a),
        Command::Etcd(a) => etcd::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Generate(a) => generate::run(a),
    }
}
