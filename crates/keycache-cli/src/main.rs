//! The `keycache` binary; see `keycache --help`.
//!
//! `args` holds the argument groups the commands share, `cmd` one module
//! per command (and the dispatch), `output` colour, JSON and the error a
//! command fails with.
mod args;
mod cmd;
#[allow(dead_code)] // wired into the commands by the lead
mod master_config;
mod output;

use clap::Parser;

fn main() -> std::process::ExitCode {
    match cmd::run(cmd::Cli::parse().command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("keycache: {e}");
            e.exit_code()
        }
    }
}
