//! The `keycache` binary; see `keycache --help`.
mod bench;
mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
