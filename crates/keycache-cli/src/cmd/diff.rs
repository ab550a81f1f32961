//! `keycache diff`: how two stores differ.

use std::path::PathBuf;

use crate::args::{Json, StoreArgs};
use crate::output::{esc, exit, outln, print_json, CmdResult};

/// The arguments of `keycache diff`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// First store directory.
    a: PathBuf,
    /// Second store directory.
    b: PathBuf,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// Runs `keycache diff`: exit code 1 when the stores differ.
pub(crate) fn run(a: Args) -> CmdResult {
    let d = keycache::diff::diff(&a.layout.open(&a.a)?, &a.layout.open(&a.b)?)?;
    if a.json.json {
        print_json(&d);
    } else {
        for e in &d.only_a {
            outln!("only in A: {} ({})", esc(&e.id), e.state);
        }
        for e in &d.only_b {
            outln!("only in B: {} ({})", esc(&e.id), e.state);
        }
        for e in &d.differ {
            outln!(
                "differs:   {} (A {}, B {}{})",
                esc(&e.id),
                e.state_a,
                e.state_b,
                if e.same_key { "" } else { ", different keys" }
            );
        }
        if d.same {
            outln!("same: {} entries", d.entries_a);
        }
    }
    Ok(exit(d.same))
}
