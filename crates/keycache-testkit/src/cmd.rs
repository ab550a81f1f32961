//! The CLI tests' command builder (after ripgrep's `TestCommand`): a
//! program (the `keycache` binary, which only the CLI's tests can name),
//! its arguments, layout flags from a [`Params`], `NO_COLOR` set; checks
//! that put the command line, its status, stdout and stderr in the panic
//! message; stdout parsed as JSON.
//!
//! ```ignore
//! let listing = kc().args(["list", s(&dir)]).layout(&layout).ok();
//! let err = kc().args(["accept", s(&dir), "no such id"]).fails(2);
//! let report = kc().args(["verify", s(&dir), "--json"]).json();
//! ```

use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

use crate::common::{Params, ParamsExt};

/// A command to run once, and check.
#[derive(Debug)]
pub struct TestCommand {
    cmd: Command,
    stdin: Option<Vec<u8>>,
}

impl TestCommand {
    /// `program` with `NO_COLOR=1` (plain text to compare).
    pub fn new(program: impl AsRef<OsStr>) -> TestCommand {
        let mut cmd = Command::new(program);
        cmd.env("NO_COLOR", "1");
        TestCommand { cmd, stdin: None }
    }

    /// Adds an argument.
    pub fn arg(&mut self, a: impl AsRef<OsStr>) -> &mut TestCommand {
        self.cmd.arg(a);
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut TestCommand
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    /// Adds the layout flags of `layout` ([`ParamsExt::args`]).
    pub fn layout(&mut self, layout: &Params) -> &mut TestCommand {
        self.cmd.args(layout.args());
        self
    }

    /// Sets an environment variable.
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut TestCommand {
        self.cmd.env(key, value);
        self
    }

    /// Rebuilds do not wait for Salt's writers
    /// (`KEYCACHE_REBUILD_SETTLE_MS=0`: no Salt process maps the files).
    pub fn no_settle(&mut self) -> &mut TestCommand {
        self.env("KEYCACHE_REBUILD_SETTLE_MS", "0")
    }

    /// Runs in `dir`.
    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut TestCommand {
        self.cmd.current_dir(dir);
        self
    }

    /// Feeds `bytes` on stdin (else stdin is empty).
    pub fn stdin(&mut self, bytes: impl Into<Vec<u8>>) -> &mut TestCommand {
        self.stdin = Some(bytes.into());
        self
    }

    /// The command itself, for what the builder does not say.
    pub fn cmd(&mut self) -> &mut Command {
        &mut self.cmd
    }

    /// Starts the command with stdin empty, stdout `stdout` and stderr a
    /// pipe, for a test that watches it run.
    pub fn spawn(&mut self, stdout: Stdio) -> Child {
        self.cmd
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.line()))
    }

    /// The command line, for messages.
    pub fn line(&self) -> String {
        line(&self.cmd)
    }

    /// Runs the command; its output, whatever its status.
    pub fn output(&mut self) -> Output {
        let line = self.line();
        let Some(input) = self.stdin.clone() else {
            return self
                .cmd
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("run {line}: {e}"));
        };
        self.cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self
            .cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {line}: {e}"));
        let mut sin = child.stdin.take().expect("stdin");
        // A writer thread: the command may not read all of stdin before it
        // fills its stdout.
        let writer = std::thread::spawn(move || {
            let _ = sin.write_all(&input);
        });
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("run {line}: {e}"));
        writer.join().expect("stdin writer");
        out
    }

    /// Runs the command; its output, whatever its status, and its stdout
    /// parsed as JSON (which it must be).
    pub fn output_json(&mut self) -> (Output, Value) {
        let out = self.output();
        let v = parse_json(&self.line(), &out);
        (out, v)
    }

    /// Runs the command, which must succeed; its output.
    pub fn ok_output(&mut self) -> Output {
        let out = self.output();
        check_ok(&self.line(), &out);
        out
    }

    /// Runs the command, which must succeed; its stdout.
    pub fn ok(&mut self) -> String {
        stdout(&self.ok_output())
    }

    /// Runs the command, which must exit with `code`; its output.
    pub fn fails_output(&mut self, code: i32) -> Output {
        let out = self.output();
        check_fails(&self.line(), &out, code);
        out
    }

    /// Runs the command, which must exit with `code`; its stderr.
    pub fn fails(&mut self, code: i32) -> String {
        stderr(&self.fails_output(code))
    }

    /// Runs the command, which must exit with `code`; its stdout parsed as
    /// JSON.
    pub fn json_exit(&mut self, code: i32) -> Value {
        let out = self.fails_output(code);
        parse_json(&self.line(), &out)
    }

    /// Runs the command, which must succeed; its stdout parsed as JSON.
    pub fn json(&mut self) -> Value {
        let out = self.ok_output();
        parse_json(&self.line(), &out)
    }
}

/// `cmd`'s program and arguments, each quoted where it is not plain.
pub fn line(cmd: &Command) -> String {
    let word = |w: &OsStr| {
        let s = w.to_string_lossy();
        if !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@+".contains(&b))
        {
            s.into_owned()
        } else {
            format!("{s:?}")
        }
    };
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(word)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a failed check says: the command, its status, stdout and stderr.
fn report(what: &str, line: &str, out: &Output) -> String {
    format!(
        "{what}: {line}\nstatus: {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Panics unless `out` (of the command `line`) is a success.
pub fn check_ok(line: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        report("expected success", line, out)
    );
}

/// Panics unless `out` (of the command `line`) is an exit with `code`.
pub fn check_fails(line: &str, out: &Output, code: i32) {
    assert!(
        out.status.code() == Some(code),
        "{}",
        report(&format!("expected exit {code}"), line, out)
    );
}

/// `out`'s stdout (of the command `line`) parsed as JSON.
pub fn parse_json(line: &str, out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{}",
            report(&format!("stdout is not JSON ({e})"), line, out)
        )
    })
}

/// `out`'s stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `out`'s stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
