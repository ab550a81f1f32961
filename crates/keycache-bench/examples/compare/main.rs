//! Side-by-side performance comparison of keycache against the alternatives:
//! an in-memory `HashMap` (std and hashbrown), LMDB through heed, and Salt
//! 3008.5's own Python `mmap_key` (through the test kit's
//! `crates/keycache-testkit/py/salt_driver.py`). One more in-memory
//! contender, hashbrown that also copies each value out and checks its
//! xxh3, measures what those two duties of a reader of shared memory cost
//! on their own.
//!
//! Run it through `tools/bench.sh compare` (which builds everything, sets up
//! the Salt venv and draws the chart); directly:
//!
//! ```text
//! cargo build --release --bin keycache --example compare
//! target/release/examples/compare run [--sizes 10000,100000,1000000] [--rounds 5]
//!     [--seconds 0.5] [--salt-seconds 1] [--python PY] [--only SECTIONS]
//!     [--contenders salt,lmdb,maps] [--migrate-sizes 10000,100000]
//!     [--salt-migrate-max N] [--data DIR] [--json FILE]
//!     [--threads 1,2,4|max] [--writer-rate 1000] [--generate tree|rust]
//! ```
//!
//! Sections (`--only`): lookup, list, migrate, open, write, callgrind,
//! scaling. `scaling` (lookups on `--threads 1,2,4,...` or `max`, each
//! contender with a writer beside its readers: another process for keycache
//! and LMDB) runs only when named.
//! Salt's migration (one locked, fsynced insert per key: 6-13 ms a key) is
//! run on trees of at most `--salt-migrate-max` minions (default 10000);
//! for larger trees its time is extrapolated from its time per key on the
//! largest tree it ran, and the report says so.
//! Everything it needs is generated under `--data` (default
//! `target/bench-data`) on the first run and reused afterwards: realistic
//! `localfs_key` trees from `tools/gen-pki-tree.py`, stores migrated from
//! them with `keycache migrate`, LMDB environments with the same entries.
//! Contenders are measured interleaved, round after round; the tables give
//! medians over the rounds.
//!
//! Internal subcommands (run as child processes): `noop`, `open-first`,
//! `rss`, `callgrind-loop`, `writer` (the writer process of `scaling`).
//!
//! Modules: [`args`] (the command line), [`run`] (`compare run`: the
//! sections, then the report), one module per section ([`lookup`],
//! [`list`], [`migrate`], [`open`], [`write`], [`callgrind`]: its
//! measurements and its report table; [`scaling`] with its writer process,
//! [`writer`]), and what they share: [`data`] (trees,
//! stores, id lists, LMDB environments), [`measure`] (the library's
//! measuring loop with pinned threads, the samples), [`contenders`] (one
//! lookup of each contender, Salt's driver), [`report`] and [`util`]. The
//! data generators are the `keycache-bench` library's.

mod args;
mod callgrind;
mod contenders;
mod data;
mod list;
mod lookup;
mod measure;
mod migrate;
mod open;
mod report;
mod run;
mod scaling;
mod util;
mod write;
mod writer;

use clap::Parser;

use args::{Cli, Cmd};

fn main() {
    let cli = Cli::parse();
    match cli.cmd.unwrap_or(Cmd::Run(cli.run)) {
        Cmd::Noop => {}
        Cmd::Run(a) => run::cmd_run(&a),
        Cmd::OpenFirst(a) => open::cmd_open_first(&a),
        Cmd::Rss(a) => open::cmd_rss(&a),
        Cmd::CallgrindLoop(a) => callgrind::cmd_callgrind_loop(&a),
        Cmd::Writer(a) => writer::cmd_writer(&a),
    }
}
