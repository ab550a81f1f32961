//! The `keycache` binary; see `keycache --help`.
fn main() -> std::process::ExitCode {
    keycache::cli::main()
}
