//! What the commands share to print: colour, JSON, times, and the error a
//! command fails with ([`CmdError`]).

use std::fmt;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anstyle::Style;
use serde::Serialize;

/// A failed command: `keycache: {message}` on stderr, exit code `code`.
#[derive(Debug)]
pub(crate) struct CmdError {
    /// The process's exit code.
    pub(crate) code: u8,
    /// What went wrong.
    pub(crate) message: String,
}

impl CmdError {
    /// A failure with exit code 2: bad arguments or an unreadable store.
    pub(crate) fn usage(message: impl Into<String>) -> CmdError {
        CmdError {
            code: 2,
            message: message.into(),
        }
    }

    /// The exit code.
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code)
    }
}

impl fmt::Display for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<keycache::Error> for CmdError {
    fn from(e: keycache::Error) -> CmdError {
        CmdError::usage(e.to_string())
    }
}

impl From<keycache_bench::BenchError> for CmdError {
    fn from(e: keycache_bench::BenchError) -> CmdError {
        let code = match e {
            keycache_bench::BenchError::Panicked => 1,
            _ => 2,
        };
        CmdError {
            code,
            message: e.to_string(),
        }
    }
}

/// What a command returns: its exit code, or why it failed.
pub(crate) type CmdResult = Result<ExitCode, CmdError>;

/// Exit code 0 when `ok`, else 1.
pub(crate) fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Whether to colour stdout: a terminal, and `NO_COLOR` unset or empty.
pub(crate) fn color() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stdout().is_terminal()
}

/// `s` in `style` when stdout is coloured ([`color`]), else as is.
pub(crate) fn paint(s: &str, style: Style) -> String {
    if color() {
        format!("{}{s}{}", style.render(), style.render_reset())
    } else {
        s.to_owned()
    }
}

/// `v` as a `serde_json::Value`: objects with their keys sorted, as the
/// JSON output has always had them.
fn to_value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// Prints `v` as one pretty-printed JSON document (keys sorted) on stdout.
pub(crate) fn print_json<T: Serialize>(v: &T) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, &to_value(v));
    let _ = writeln!(out);
}

/// Prints `v` as JSON on one line (keys sorted) on stdout.
pub(crate) fn print_json_line<T: Serialize>(v: &T) {
    println!("{}", to_value(v));
}

/// `s` quoted and escaped as a JSON string.
pub(crate) fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// Formats unix nanoseconds as UTC `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn fmt_time(ns: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(ns / 1_000_000_000);
    // `YYYY-MM-DDTHH:MM:SSZ`
    let s = humantime::format_rfc3339_seconds(t).to_string();
    match (s.get(..10), s.get(11..19)) {
        (Some(date), Some(time)) => format!("{date} {time} UTC"),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_before() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(fmt_time(951_782_400_999_999_999), "2000-02-29 00:00:00 UTC");
        assert_eq!(
            fmt_time(1_779_579_589_123_456_789),
            "2026-05-23 23:39:49 UTC"
        );
        assert_eq!(fmt_time(u64::MAX), "2554-07-21 23:34:33 UTC");
    }

    #[test]
    fn colours_are_the_old_escapes() {
        use anstyle::AnsiColor::*;
        for (c, code) in [(Green, 32), (Magenta, 35), (Red, 31), (Blue, 34)] {
            let s = c.on_default();
            assert_eq!(
                format!("{}x{}", s.render(), s.render_reset()),
                format!("\x1b[{code}mx\x1b[0m")
            );
        }
    }
}
