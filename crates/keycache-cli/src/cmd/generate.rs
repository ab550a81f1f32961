//! `keycache generate man|bash|zsh|fish|elvish`: the man page and the
//! shell completion scripts, made from the command's own clap definitions
//! and written to stdout (as `rg --generate`). Hidden from `--help`: it is
//! for packagers (tools/build-deb.sh), not for the store.
//!
//! The man page is one page, keycache(1): clap_mangen's sections of the
//! top command (name, synopsis, description, options, version) and a
//! COMMANDS section holding every visible subcommand (nested ones, `etcd
//! seed`, included) as a subsection with its synopsis, its long help and
//! its options. One page rather than a `keycache-<sub>.1` each: `man
//! keycache` then shows everything, and searching it finds any flag.

use std::io;
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::Man;

use crate::output::{out, CmdError, CmdResult};

/// The arguments of `keycache generate`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// What to write to stdout: the man page (roff, section 1) or a
    /// shell's completion script.
    #[arg(value_enum)]
    what: What,
}

/// What `keycache generate` writes.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum What {
    /// The man page, keycache(1), subcommands included.
    Man,
    /// bash's completion script (/usr/share/bash-completion/completions/keycache).
    Bash,
    /// zsh's completion function (_keycache, on $fpath).
    Zsh,
    /// fish's completions (vendor_completions.d/keycache.fish).
    Fish,
    /// elvish's completions.
    Elvish,
}

/// The command's name in every output.
const BIN: &str = "keycache";

/// Runs `keycache generate`.
pub(crate) fn run(a: Args) -> CmdResult {
    let mut buf = Vec::new();
    match a.what {
        What::Man => man_page(&mut buf)
            .map_err(|e| CmdError::usage(format!("rendering the man page: {e}")))?,
        What::Bash => complete(Shell::Bash, &mut buf),
        What::Zsh => complete(Shell::Zsh, &mut buf),
        What::Fish => complete(Shell::Fish, &mut buf),
        What::Elvish => complete(Shell::Elvish, &mut buf),
    }
    // Through the CLI's stdout, which ends quietly when its reader goes
    // away (`keycache generate man | head`).
    out!("{}", String::from_utf8_lossy(&buf));
    Ok(ExitCode::SUCCESS)
}

/// The command definitions, as `keycache` parses them.
fn command() -> clap::Command {
    let mut cmd = super::Cli::command();
    cmd.build();
    cmd
}

/// `shell`'s completion script for the whole command but its hidden
/// subcommands (clap_complete would complete them: clap has no way to take
/// a subcommand out, so the top command is made anew around its arguments
/// and the other subcommands; -h and -V are generated again).
fn complete(shell: Shell, buf: &mut Vec<u8>) {
    let full = command();
    let mut cmd = clap::Command::new(BIN).version(env!("CARGO_PKG_VERSION"));
    if let Some(about) = full.get_about() {
        cmd = cmd.about(about.clone());
    }
    cmd = cmd
        .args(
            full.get_arguments()
                .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
                .cloned(),
        )
        .subcommands(visible_subcommands(&full).cloned());
    clap_complete::generate(shell, &mut cmd, BIN, buf);
}

/// Writes the man page: clap_mangen's sections of the top command, with a
/// COMMANDS section of every visible subcommand, recursively.
fn man_page(w: &mut Vec<u8>) -> io::Result<()> {
    let cmd = command();
    let page = Man::new(cmd.clone())
        .title("KEYCACHE")
        .manual("User Commands");
    page.render_title(w)?;
    page.render_name_section(w)?;
    page.render_synopsis_section(w)?;
    page.render_description_section(w)?;
    page.render_options_section(w)?;
    w.extend_from_slice(b".SH COMMANDS\n");
    for sub in visible_subcommands(&cmd) {
        man_subcommand(w, sub, BIN)?;
    }
    w.extend_from_slice(ENVIRONMENT.as_bytes());
    w.extend_from_slice(EXIT_STATUS.as_bytes());
    page.render_version_section(w)?;
    w.extend_from_slice(
        b".SH \"SEE ALSO\"\n\
          salt-key(1), salt-master(1); /usr/share/doc/keycache/cli.md, the command's reference.\n",
    );
    *w = once_preamble(w);
    Ok(())
}

/// The man page's ENVIRONMENT section: every variable the command reads.
const ENVIRONMENT: &str = r#".SH ENVIRONMENT
.TP
\fBSALT_CONFIG_DIR\fR
The master configuration directory when no \fB\-c\fR/\fB\-\-config\-dir\fR or \fB\-\-master\-config\fR is given, as for salt\-key (default /etc/salt).
.TP
\fBSALT_MASTER_CONFIG\fR
A master configuration file read in place of /etc/salt/master when it names a file and neither a flag nor SALT_CONFIG_DIR is given, as Salt reads it.
.TP
\fBNO_COLOR\fR
When set and not empty, no colour in the output (colour is used only on a terminal).
.TP
\fBSUDO_USER\fR
The user behind sudo, recorded in the audit trail beside the user the command runs as.
.TP
\fBNOTIFY_SOCKET\fR, \fBWATCHDOG_USEC\fR, \fBWATCHDOG_PID\fR
Set by systemd for a Type=notify unit: \fBkeycache replicate\fR then reports READY=1 once its first list is applied, STATUS=, WATCHDOG=1 and STOPPING=1. Without NOTIFY_SOCKET nothing is sent.
.TP
\fBHOME\fR
Expands a leading ~ in the master configuration's paths (pki_dir and others), as Salt does.
.TP
\fBKEYCACHE_READ_RETRY_MS\fR
How long, in milliseconds, a reader waits for an entry that Salt is rewriting in place (default 1000).
.TP
\fBKEYCACHE_REBUILD_SETTLE_MS\fR
How long, in milliseconds, a rebuild keeps the banks locked after its renames while other processes (Salt's) map the files it replaced (default 300; 0 where no Salt process writes).
"#;

/// The man page's EXIT STATUS section, as every subcommand uses it.
const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
Success: the command did what it was asked, or found nothing wrong.
.TP
\fB1\fR
The command ran, and what it reports is not clean: \fBverify\fR found something, \fBdiff\fR and \fBetcd diff\fR found the stores differ, \fBetcd status\fR found the replica stale, \fBmerge\fR held an entry pending for an operator, \fBexport\fR left a differing file alone.
.TP
\fB2\fR
Bad usage or bad input (the message names the file or id and what is wrong), a refusal (a store locked by another writer, a change the guards refuse), or an error of the system. Nothing was written: no half-written store, no lost key.
"#;

/// The string definition clap_mangen (through the roff crate) writes
/// before every section it renders: kept once, at the top.
const PREAMBLE: [&[u8]; 2] = [b".ie \\n(.g .ds Aq \\(aq\n", b".el .ds Aq '\n"];

/// `page` with the [`PREAMBLE`] lines after their first appearance left out.
fn once_preamble(page: &[u8]) -> Vec<u8> {
    let mut seen = [false; 2];
    let mut kept = Vec::with_capacity(page.len());
    for line in page.split_inclusive(|&b| b == b'\n') {
        match PREAMBLE.iter().position(|p| *p == line) {
            Some(i) if seen[i] => {}
            Some(i) => {
                seen[i] = true;
                kept.extend_from_slice(line);
            }
            None => kept.extend_from_slice(line),
        }
    }
    kept
}

/// The subcommands of `cmd` that `--help` shows.
fn visible_subcommands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// One subcommand's subsection (`.SS "keycache etcd seed"`): its synopsis,
/// long help and options, then its own subcommands' subsections.
fn man_subcommand(w: &mut Vec<u8>, sub: &clap::Command, parent: &str) -> io::Result<()> {
    let name = format!("{parent} {}", sub.get_name());
    w.extend_from_slice(format!(".SS \"{name}\"\n").as_bytes());
    let page = Man::new(sub.clone().bin_name(&name));
    let mut section = Vec::new();
    page.render_synopsis_section(&mut section)?;
    push_body(w, &section);
    section.clear();
    page.render_description_section(&mut section)?;
    w.extend_from_slice(b".PP\n");
    push_body(w, &section);
    if sub.get_arguments().any(|a| !a.is_hide_set()) {
        section.clear();
        page.render_options_section(&mut section)?;
        push_body(w, &section);
    }
    for nested in visible_subcommands(sub) {
        man_subcommand(w, nested, &name)?;
    }
    Ok(())
}

/// A section clap_mangen rendered (`.SH NAME` line, then its body), moved
/// into the current subsection: the `.SH` lines become bold paragraphs
/// (`.SH OPTIONS` -> `Options:`), the body is kept.
fn push_body(w: &mut Vec<u8>, section: &[u8]) {
    for line in section.split_inclusive(|&b| b == b'\n') {
        match line.strip_prefix(b".SH ") {
            Some(heading) => {
                let heading = String::from_utf8_lossy(heading);
                let heading = heading.trim().trim_matches('"');
                if heading != "SYNOPSIS" && heading != "DESCRIPTION" {
                    let mut title = heading.to_lowercase();
                    if let Some(first) = title.get_mut(..1) {
                        first.make_ascii_uppercase();
                    }
                    w.extend_from_slice(format!(".PP\n\\fB{title}:\\fR\n").as_bytes());
                }
            }
            None => w.extend_from_slice(line),
        }
    }
}
