//! The `keycache` binary; see `keycache --help`.
//!
//! `args` holds the argument groups the commands share, `cmd` one module
//! per command (and the dispatch), `output` stdout and stderr, escaping,
//! colour, JSON and the error a command fails with.
mod args;
mod cmd;
use keycache_config as master_config;
mod output;

use clap::Parser;

use crate::output::errln;

fn main() -> std::process::ExitCode {
    let code = match cmd::run(cmd::Cli::parse().command) {
        Ok(code) => code,
        Err(e) => {
            errln!("keycache: {e}");
            e.exit_code()
        }
    };
    // A reader that went away ended the output, not the command: its own
    // exit code stands. Any other failure to write the output is an error.
    match output::finish_stdout() {
        Some(e) => {
            errln!("keycache: writing the output: {e}");
            std::process::ExitCode::from(2)
        }
        None => code,
    }
}
