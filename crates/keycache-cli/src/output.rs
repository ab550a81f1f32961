//! What the commands share to print: stdout that ends quietly when its
//! reader goes away ([`out!`], [`outln!`]), stderr ([`errln!`]), escaped ids
//! and paths ([`esc`]), colour, JSON, times, and the error a command fails
//! with ([`CmdError`]).

use std::borrow::Cow;
use std::fmt;
use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use anstyle::Style;
use serde::Serialize;

/// Set once stdout failed: nothing more is written to it.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// The first error writing stdout other than a closed pipe.
static STDOUT_ERROR: Mutex<Option<io::Error>> = Mutex::new(None);

/// Writes to stdout. A reader that went away (`EPIPE`: `keycache ... | head
/// -1`) ends the output quietly: the command goes on and exits with its own
/// code (Rust ignores `SIGPIPE`, where `println!` would panic). Any other
/// error is kept for [`finish_stdout`].
pub(crate) fn write_stdout(args: fmt::Arguments<'_>) {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let r = io::stdout().lock().write_fmt(args);
    if let Err(e) = r {
        stdout_failed(e);
    }
}

fn stdout_failed(e: io::Error) {
    STDOUT_CLOSED.store(true, Ordering::Relaxed);
    if e.kind() != io::ErrorKind::BrokenPipe {
        if let Ok(mut slot) = STDOUT_ERROR.lock() {
            slot.get_or_insert(e);
        }
    }
}

/// Flushes stdout; the error writing it, if any, other than a closed pipe.
pub(crate) fn finish_stdout() -> Option<io::Error> {
    if !STDOUT_CLOSED.load(Ordering::Relaxed) {
        if let Err(e) = io::stdout().lock().flush() {
            stdout_failed(e);
        }
    }
    STDOUT_ERROR.lock().ok().and_then(|mut e| e.take())
}

/// Writes to stderr, ignoring errors (nothing is left to tell them to).
pub(crate) fn write_stderr(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// `print!` through [`write_stdout`].
macro_rules! out {
    ($($t:tt)*) => {
        $crate::output::write_stdout(format_args!($($t)*))
    };
}

/// `println!` through [`write_stdout`].
macro_rules! outln {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($t:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// `eprintln!` that ignores errors ([`write_stderr`]).
macro_rules! errln {
    ($($t:tt)*) => {
        $crate::output::write_stderr(format_args!("{}\n", format_args!($($t)*)))
    };
}

pub(crate) use {errln, out, outln};

/// Whether `c` is escaped in text output: control characters (a newline,
/// ESC) and the invisible marks that reorder text (bidi controls).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` for text output: control characters and bidi controls escaped as
/// Rust escapes them (`\n`, `\u{1b}`), everything else as is. Every text
/// printer passes ids (and paths) through it, so a hostile id can neither
/// forge lines nor drive the terminal.
pub(crate) fn esc(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if matches!(c, '\n' | '\r' | '\t' | '\0') {
            o.extend(c.escape_debug());
        } else if needs_escape(c) {
            o.extend(c.escape_unicode());
        } else {
            o.push(c);
        }
    }
    Cow::Owned(o)
}

/// A path for text output ([`esc`] of its lossy UTF-8 form).
pub(crate) fn esc_path(p: &Path) -> String {
    esc(&p.to_string_lossy()).into_owned()
}

/// Prints what a command did to the key tree, a line a file:
/// `{lead}wrote {path}{end}`, then `{lead}removed {path}{end}`.
pub(crate) fn print_tree_changes<P: AsRef<Path>>(
    lead: &str,
    end: &str,
    written: &[P],
    removed: &[P],
) {
    for (verb, paths) in [("wrote", written), ("removed", removed)] {
        for p in paths {
            outln!("{lead}{verb} {}{end}", esc_path(p.as_ref()));
        }
    }
}

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
    /// The library's message, then the CLI's advice when it has some
    /// ([`advice`]).
    fn from(e: keycache::Error) -> CmdError {
        CmdError::usage(match advice(&e) {
            Some(a) => format!("{e}; {a}"),
            None => e.to_string(),
        })
    }
}

/// The flags or command of this CLI that act on a library error: the
/// library's messages name Salt's options, never the CLI's (the Salt driver
/// shows them too).
fn advice(e: &keycache::Error) -> Option<String> {
    use keycache::Error as E;
    Some(match e {
        E::IdTooLong { len, slot, .. } => {
            format!("give keycache the same sizes (--id-size {len} --slot-size {slot} or more)")
        }
        E::TableFull { .. } => "keycache compact --to-size N does it".into(),
        E::StaleTreeFiles { .. } => "--replace-states takes them".into(),
        E::Overfull { suggested, .. } => format!("use --size {suggested}"),
        E::MasterKeysDiffer { .. } => {
            "keep the bank's keys with --no-master-keys, or replace them with \
             --replace-master-keys"
                .into()
        }
        E::Mismatch { what, .. } if *what == keycache::table::INDEX_LENGTH => {
            "or give keycache the size (--size)".into()
        }
        e if keycache::tree::in_the_way(e) => "--tree never leaves the key tree out".into(),
        e if keycache::tree::out_of_step(e) => "keycache verify --repair mends the tree".into(),
        e if keycache::tree::no_store(e) => {
            "keycache migrate builds the store from the tree".into()
        }
        e if keycache::migrate::would_drop_tree_keys(e) => {
            "keycache migrate that tree first, or --replace drops them".into()
        }
        _ => return None,
    })
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
    let doc = serde_json::to_string_pretty(&to_value(v)).unwrap_or_default();
    outln!("{doc}");
}

/// Prints `v` as JSON on one line (keys sorted) on stdout.
pub(crate) fn print_json_line<T: Serialize>(v: &T) {
    outln!("{}", to_value(v));
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

impl From<keycache_config::ConfigError> for CmdError {
    fn from(e: keycache_config::ConfigError) -> CmdError {
        CmdError::usage(e.to_string())
    }
}

impl From<keycache_merge::Error> for CmdError {
    /// The store's errors with the CLI's advice ([`advice`]); the merge's
    /// as they are, but a snapshot or store that names no cluster names
    /// the flag that allows it.
    fn from(e: keycache_merge::Error) -> CmdError {
        match e {
            keycache_merge::Error::Store(e) => CmdError::from(e),
            e @ keycache_merge::Error::UnknownCluster { .. } => {
                CmdError::usage(format!("{e}; --allow-unknown-cluster allows it"))
            }
            e => CmdError::usage(e.to_string()),
        }
    }
}

impl From<keycache_etcd::Error> for CmdError {
    /// The store's errors with the CLI's advice ([`advice`]); etcd's as
    /// they are, but a seed into a prefix that holds keys names the flag
    /// that asks for it.
    fn from(e: keycache_etcd::Error) -> CmdError {
        match e {
            keycache_etcd::Error::Store(e) => CmdError::from(e),
            e @ keycache_etcd::Error::PrefixNotEmpty { .. } => {
                CmdError::usage(format!("{e} (--replace)"))
            }
            e => CmdError::usage(e.to_string()),
        }
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
    fn escapes_control_characters_only() {
        assert!(matches!(esc("web-01.example.com"), Cow::Borrowed(_)));
        assert_eq!(esc("caf\u{e9} d'o \"q\" a\\b"), "caf\u{e9} d'o \"q\" a\\b");
        assert_eq!(esc("a\nb"), "a\\nb");
        assert_eq!(esc("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(esc("x\ty\r"), "x\\ty\\r");
        assert_eq!(esc("\u{202e}gpj.exe"), "\\u{202e}gpj.exe");
        assert_eq!(esc("\u{7f}"), "\\u{7f}");
    }

    #[test]
    fn library_errors_get_the_cli_advice() {
        let path = std::path::PathBuf::from("/pki/.mmap_keys.idx");
        let msg = |e: keycache::Error| CmdError::from(e).message;
        let m = msg(keycache::Error::IdTooLong {
            id: "x".repeat(70),
            len: 70,
            id_size: 64,
            slot: 91,
        });
        assert!(
            m.ends_with(
                "in the master config); give keycache the same sizes \
                 (--id-size 70 --slot-size 91 or more)"
            ),
            "{m}"
        );
        let m = msg(keycache::Error::TableFull {
            path: path.clone(),
            capacity: 10,
        });
        assert!(
            m.ends_with("raise mmap_key_size; keycache compact --to-size N does it"),
            "{m}"
        );
        let m = msg(keycache::Error::Overfull {
            path: path.clone(),
            entries: 9,
            size: 11,
            load: 0.9,
            max_load: 0.8,
            suggested: 13,
        });
        assert!(m.ends_with("; use --size 13"), "{m}");
        let m = msg(keycache::Error::MasterKeysDiffer {
            path: path.clone(),
            names: "master.pem".into(),
        });
        assert!(
            m.contains("--no-master-keys") && m.contains("--replace-master-keys"),
            "{m}"
        );
        let m = msg(keycache::Error::Mismatch {
            path: path.clone(),
            what: keycache::table::INDEX_LENGTH,
            expected: "96 bytes".into(),
            found: "192 bytes".into(),
        });
        assert!(m.ends_with("; or give keycache the size (--size)"), "{m}");
        let m = msg(keycache::Error::InvalidParams("x".into()));
        assert_eq!(m, "invalid layout parameters: x");
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
