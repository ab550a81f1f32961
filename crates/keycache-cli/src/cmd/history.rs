//! `keycache history`: the store's audit trail (`keycache::audit`): who
//! changed which key, when, from what to what, and why; oldest first.

use std::process::ExitCode;

use anstyle::{AnsiColor, Style};

use keycache::audit::{self, Record};

use crate::args::{minion_id, Json, StoreArgs, StoreIds};
use crate::output::{errln, esc, esc_path, out, outln, paint, CmdError, CmdResult};

/// The arguments of `keycache history`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("json", |a| a.help("One JSON object per line, a record each, its fields named as in the log")))]
#[command(mut_arg("args", |a| a.help("`DIR [ID]`: the store directory (pki_dir or cluster_pki_dir), then a minion id to show the records of (default: every id). With -c or --master-config: the minion id only (the store directory is the one the master config names), unless a first argument holds a `/`: then it is the store directory")))]
pub(crate) struct Args {
    #[command(flatten)]
    target: StoreIds,
    /// Only the records of TIME or later: RFC 3339
    /// (`2026-11-29T04:05:06Z`, `2026-11-29T05:05:06+01:00`) or a date
    /// (`2026-11-29`: its midnight UTC).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    #[command(flatten)]
    json: Json,
    #[command(flatten)]
    layout: StoreArgs,
}

/// How many characters of a fingerprint the text shows.
const FINGER_SHOWN: usize = 16;

/// The colour of an action in the text output: the colours of `list`'s
/// groups (accepted green, denied magenta, rejected blue), a deletion red.
fn action_style(action: &str) -> Style {
    let c = match action {
        "accept" => AnsiColor::Green,
        "deny" => AnsiColor::Magenta,
        "reject" => AnsiColor::Blue,
        "delete" => AnsiColor::Red,
        _ => return Style::new(),
    };
    c.on_default()
}

/// A state as the text shows it: `-` for no key.
fn state(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("-")
}

/// A record's text cells: time, id, action, `from -> to`, user (the user
/// behind sudo in parentheses), program, master, reason, revision (empty
/// when not set), the fingerprint shortened.
fn cells(r: &Record) -> [String; 10] {
    let opt = |v: &Option<String>| v.as_deref().map_or("-".to_owned(), |s| esc(s).into_owned());
    let user = match (&r.user, &r.sudo_user) {
        (u, Some(s)) => format!("{} ({})", opt(u), esc(s)),
        (u, None) => opt(u),
    };
    let finger = match &r.finger {
        None => "-".to_owned(),
        Some(f) if f.chars().count() > FINGER_SHOWN => {
            let short: String = f.chars().take(FINGER_SHOWN).collect();
            format!("{}\u{2026}", esc(&short))
        }
        Some(f) => esc(f).into_owned(),
    };
    [
        esc(&r.time).into_owned(),
        esc(&r.id).into_owned(),
        esc(&r.action).into_owned(),
        format!("{} -> {}", esc(state(&r.from)), esc(state(&r.to))),
        user,
        esc(&r.program).into_owned(),
        opt(&r.master),
        opt(&r.reason),
        r.revision.map_or(String::new(), |n| format!("rev {n}")),
        finger,
    ]
}

/// Prints `records` a line each, in aligned columns (the revision's only
/// when a record has one); the action coloured on a terminal.
fn print_text(records: &[&Record]) {
    let rows: Vec<[String; 10]> = records.iter().map(|r| cells(r)).collect();
    let has_revision = rows.iter().any(|c| !c[8].is_empty());
    let mut width = [0usize; 10];
    for row in &rows {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    for (row, r) in rows.iter().zip(records) {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            if i == 8 && !has_revision {
                continue;
            }
            if i > 0 {
                line.push_str("  ");
            }
            let pad = " ".repeat(width[i] - c.chars().count());
            if i == 2 {
                line.push_str(&paint(c, action_style(&r.action)));
            } else {
                line.push_str(c);
            }
            if i + 1 < row.len() {
                line.push_str(&pad);
            }
        }
        outln!("{line}");
    }
}

/// Runs `keycache history`: exit code 0, the records shown (none when the
/// store has no log yet); 2 on a bad argument or a log that cannot be read.
pub(crate) fn run(a: Args) -> CmdResult {
    let (dir, ids) = a.target.split(&a.layout)?;
    let id = match &ids[..] {
        [] => None,
        [id] => Some(minion_id(id)?),
        _ => {
            return Err(CmdError::usage(format!(
                "give at most one minion id (got {})",
                ids.len()
            )))
        }
    };
    let since = match a.since.as_deref() {
        None => None,
        Some(s) => Some(audit::parse_time(s).ok_or_else(|| {
            CmdError::usage(format!(
                "--since \"{}\": not a time: give RFC 3339 (2026-11-29T04:05:06Z, or with an \
                 offset: +01:00) or a date (2026-11-29)",
                esc(s)
            ))
        })?),
    };
    // Nothing is written: a rebuild a crash interrupted is not finished.
    let r = a.layout.resolve(&dir, false)?;
    match std::fs::metadata(&r.dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(CmdError::usage(format!(
                "{}: not a directory",
                esc_path(&r.dir)
            )))
        }
        Err(e) => return Err(CmdError::usage(format!("{}: {e}", esc_path(&r.dir)))),
    }
    let (records, torn) = audit::read(&r.dir)?;
    if torn > 0 {
        errln!(
            "keycache: {}: {torn} line(s) that are not records skipped (torn by a killed \
             writer)",
            esc_path(&audit::path(&r.dir))
        );
    }
    let shown: Vec<&Record> = records
        .iter()
        .filter(|rec| id.as_ref().is_none_or(|id| rec.id == id.as_str()))
        .filter(|rec| since.is_none_or(|t| rec.millis().is_some_and(|m| m >= t)))
        .collect();
    if a.json.json {
        for rec in shown {
            out!("{}", rec.to_line());
        }
    } else {
        print_text(&shown);
    }
    Ok(ExitCode::SUCCESS)
}
