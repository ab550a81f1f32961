//! The `keycache` binary's tests: one test binary (one link), a module per
//! area. The helpers they share are in [`common`] and in the test kit
//! (`keycache_testkit`: the command builder, layouts, the real Salt
//! driver).
//!
//! - [`commands`]: every command, every skip reason and refusal of
//!   `migrate`, and `keycache migrate` against Salt's own migration;
//! - [`edges`]: refused layouts, withheld private keys, a closed stdout,
//!   user errors, migrate's target, confirmations, escaped ids;
//! - [`config`]: the Salt master config as the source of the arguments;
//! - [`tree`]: the `localfs_key` tree: migrate's `--out`, kept in step,
//!   export;
//! - [`layout`]: layout flags and opening with another layout;
//! - [`hostile`], [`key_material`]: hostile ids, paths and modes; what a
//!   key file may hold;
//! - [`salt_interop`]: keycache and the real Salt on one store;
//! - [`damage`]: bank files that are not regular files, and `verify
//!   --repair` (the library's handling of damaged files is the engine's
//!   own test);
//! - [`concurrency`]: several processes on one store, readers opened
//!   before a compaction, verify while Salt writes;
//! - [`master_keys`]: the master key banks;
//! - [`merge`]: snapshots and merges between masters through the
//!   commands (the merge's safety semantics are keycache-merge's own
//!   tests);
//! - [`etcd`], [`etcd_model`]: the etcd replica's commands, and its model
//!   test (three masters on a real etcd cluster, random operations, kills);
//! - [`crash`]: writers, compactions, migrations, merges and tree writers
//!   killed or losing power; their child writer is [`child_writer`] below;
//! - [`generate`]: the man page and shell completions the Debian package
//!   ships.

mod commands;
mod common;
mod concurrency;
mod config;
mod crash;
mod damage;
mod deny;
mod edges;
mod etcd;
mod etcd_audit;
mod etcd_faults;
mod etcd_model;
mod finger;
mod generate;
mod history;
mod hostile;
mod key_material;
mod layout;
mod master_keys;
mod merge;
mod metrics;
mod prometheus;
mod salt_interop;
mod tree;

/// The child writer of the crash tests: `keycache_testkit::crash::writer_command`
/// re-executes this binary with `--ignored --exact child_writer`, so it
/// stays at the root of the binary (its name is its path).
#[test]
#[ignore = "the crash tests' child process, run by them"]
fn child_writer() {
    keycache_testkit::crash::child_writer_main();
}
