//! `keycache generate`: the man page and the shell completions that the
//! Debian package ships (tools/build-deb.sh), made from the clap
//! definitions; hidden from `--help`.

use std::path::Path;
use std::process::Command;

use crate::common::{keycache_fails, keycache_ok_texts, s};
use keycache_testkit::skip::skip;

/// The subcommands `keycache --help` lists (its "Commands:" block), `help`
/// left out.
fn help_subcommands(args: &[&str]) -> Vec<String> {
    let (out, _) = keycache_ok_texts(args);
    let mut names = Vec::new();
    let mut in_commands = false;
    for line in out.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if in_commands {
            if !line.starts_with("  ") {
                break;
            }
            // "  migrate   Migrate a ..." (a name starts after two spaces;
            // deeper indents continue a description)
            if let Some(name) = line
                .strip_prefix("  ")
                .and_then(|l| l.split_whitespace().next())
            {
                if !line[2..].starts_with(' ') && name != "help" {
                    names.push(name.to_owned());
                }
            }
        }
    }
    names
}

/// Every subcommand, nested ones as "etcd seed".
fn all_subcommands() -> Vec<String> {
    let mut all = Vec::new();
    for sub in help_subcommands(&["--help"]) {
        for nested in help_subcommands(&[&sub, "--help"]) {
            all.push(format!("{sub} {nested}"));
        }
        all.push(sub);
    }
    all
}

/// The output of `keycache generate WHAT`, which must succeed and write
/// nothing on stderr.
fn generate(what: &str) -> String {
    let (out, err) = keycache_ok_texts(&["generate", what]);
    assert_eq!(err, "", "keycache generate {what} wrote on stderr");
    out
}

#[test]
fn help_lists_the_commands_but_not_generate() {
    let subs = all_subcommands();
    for expected in [
        "migrate",
        "list",
        "get",
        "accept",
        "reject",
        "delete",
        "stats",
        "verify",
        "compact",
        "export",
        "diff",
        "snapshot",
        "merge",
        "replicate",
        "etcd",
        "etcd seed",
        "etcd status",
        "etcd diff",
        "bench",
    ] {
        assert!(
            subs.iter().any(|s| s == expected),
            "{expected} not in {subs:?}"
        );
    }
    assert!(!subs.iter().any(|s| s == "generate"), "{subs:?}");
    let (help, _) = keycache_ok_texts(&["--help"]);
    assert!(!help.contains("generate"), "{help}");
}

#[test]
fn man_page_is_roff_naming_every_subcommand() {
    let man = generate("man");
    let lines: Vec<&str> = man.lines().collect();
    // The title first, after the one string definition (`Aq`) clap_mangen
    // writes before it; that definition once, not before every section.
    let th = lines.iter().position(|l| l.starts_with(".TH "));
    assert_eq!(th, Some(2), "{:?}", &lines[..5.min(lines.len())]);
    assert!(lines[2].starts_with(".TH KEYCACHE 1 "), "{}", lines[2]);
    assert!(lines[..2]
        .iter()
        .all(|l| l.starts_with(".ie ") || l.starts_with(".el ")));
    assert_eq!(lines.iter().filter(|l| l.starts_with(".ie ")).count(), 1);
    for section in [
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH DESCRIPTION",
        ".SH COMMANDS",
        ".SH VERSION",
    ] {
        assert!(man.lines().any(|l| l == section), "no {section}");
    }
    for sub in all_subcommands() {
        let heading = format!(".SS \"keycache {sub}\"");
        assert!(man.lines().any(|l| l == heading), "no {heading}");
    }
    assert!(
        !man.contains("keycache generate"),
        "the hidden command is in the man page"
    );
    // Options of subcommands are in it, and no page it does not ship is
    // referred to.
    assert!(man.contains("config\\-dir"), "no --config-dir");
    assert!(
        man.contains("replace\\-master\\-keys"),
        "no migrate --replace-master-keys"
    );
    assert!(
        !man.contains("keycache-migrate(1)"),
        "refers to a page not shipped"
    );
}

#[test]
fn man_page_renders_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("keycache.1");
    std::fs::write(&page, generate("man")).unwrap();
    let Ok(out) = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(&page)
        .output()
    else {
        skip(
            "man_page_renders_without_warnings",
            "groff is not installed",
        );
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.is_empty(),
        "groff: {:?} {err}",
        out.status
    );
    let text = Command::new("groff")
        .args(["-man", "-Tascii", "-P-cbou"])
        .arg(&page)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("keycache migrate"), "{text}");
    assert!(text.contains("--config-dir"), "{text}");
}

/// Runs bash on `script` with the completion script `completion` sourced;
/// its stdout, which must be a success.
fn bash_with(completion: &Path, script: &str) -> String {
    let out = Command::new("bash")
        .arg("--norc")
        .arg("--noprofile")
        .arg("-c")
        .arg(format!("source {}\n{script}", s(completion)))
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "bash: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bash_completion_is_valid_and_completes_subcommands_and_flags() {
    let bash = generate("bash");
    for sub in help_subcommands(&["--help"]) {
        assert!(bash.contains(&sub), "no {sub}");
    }
    assert!(bash.contains("--config-dir"), "no --config-dir");
    assert!(
        !bash.contains("generate"),
        "the hidden command is completed"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keycache");
    std::fs::write(&file, &bash).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        syntax.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    // Registered for the command, and completing as bash would.
    let registered = bash_with(&file, "complete -p keycache");
    assert!(registered.contains("keycache"), "{registered}");
    let complete = |words: &str, cword: usize| {
        bash_with(
            &file,
            &format!(
                "COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{words}'; \
                 COMP_POINT=${{#COMP_LINE}}; _keycache keycache \"${{COMP_WORDS[$COMP_CWORD]}}\" \
                 \"${{COMP_WORDS[$COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\""
            ),
        )
    };
    let subs = complete("keycache mi", 1);
    assert_eq!(subs.lines().collect::<Vec<_>>(), ["migrate"], "{subs}");
    let flags = complete("keycache migrate --conf", 2);
    assert!(flags.lines().any(|l| l == "--config-dir"), "{flags}");
}

#[test]
fn zsh_fish_elvish_completions_name_the_subcommands() {
    let subs = help_subcommands(&["--help"]);
    for (shell, marker) in [
        ("zsh", "#compdef keycache"),
        ("fish", "complete -c keycache"),
        ("elvish", "edit:completion:arg-completer[keycache]"),
    ] {
        let script = generate(shell);
        assert!(script.contains(marker), "{shell}: no {marker}");
        for sub in &subs {
            assert!(script.contains(sub.as_str()), "{shell}: no {sub}");
        }
        assert!(script.contains("config-dir"), "{shell}: no --config-dir");
        assert!(
            !script.contains("generate"),
            "{shell}: the hidden command is completed"
        );
    }
}

#[test]
fn unknown_output_is_a_usage_error() {
    let err = keycache_fails(&["generate", "powershell"], 2);
    assert!(err.contains("powershell"), "{err}");
    assert!(
        err.contains("[possible values: man, bash, zsh, fish, elvish]"),
        "{err}"
    );
    let err = keycache_fails(&["generate"], 2);
    assert!(err.contains("<WHAT>"), "{err}");
}
