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
        ".SH ENVIRONMENT",
        ".SH \"EXIT STATUS\"",
        ".SH VERSION",
    ] {
        assert!(man.lines().any(|l| l == section), "no {section}");
    }
    // Every variable the command's sources read is in ENVIRONMENT, and the
    // exit codes the command uses are in EXIT STATUS.
    let env_section = section_of(&man, ".SH ENVIRONMENT");
    let read = env_vars_read();
    assert!(read.len() >= 8, "{read:?}");
    for var in &read {
        assert!(
            env_section.contains(&format!("\\fB{var}\\fR")),
            "{var} is read but not in the man page's ENVIRONMENT"
        );
    }
    let exit = section_of(&man, ".SH \"EXIT STATUS\"");
    for code in ["0", "1", "2"] {
        assert!(
            exit.contains(&format!(".TP\n\\fB{code}\\fR\n")),
            "exit status {code} is not described"
        );
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

/// The lines of the man page's section `heading`, up to the next `.SH`.
fn section_of(man: &str, heading: &str) -> String {
    let start = man
        .find(&format!("{heading}\n"))
        .unwrap_or_else(|| panic!("no {heading}"));
    let body = &man[start + heading.len() + 1..];
    body[..body.find("\n.SH ").map_or(body.len(), |e| e + 1)].to_string()
}

/// The environment variables the CLI's and the config reader's sources read
/// (`var("NAME")`, `var_os("NAME")`, and the config reader's `env("NAME")`).
fn env_vars_read() -> std::collections::BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [root.join("src"), root.join("../keycache-config/src")] {
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                // unit-test modules (`tests/`, `tests.rs`) are not the command
                if p.file_stem().is_some_and(|n| n == "tests") {
                    continue;
                }
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    files.push(p);
                }
            }
        }
    }
    let mut vars = std::collections::BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // the unit tests' own variables are not the command's
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        for call in ["var(\"", "var_os(\"", "env(\""] {
            for (i, _) in text.match_indices(call) {
                let rest = &text[i + call.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect();
                if !name.is_empty() && rest[name.len()..].starts_with('"') {
                    vars.insert(name);
                }
            }
        }
    }
    // `ms("KEYCACHE_...")` reads through a closure over `var(name)`
    for f in ["KEYCACHE_READ_RETRY_MS", "KEYCACHE_REBUILD_SETTLE_MS"] {
        vars.insert(f.to_string());
    }
    vars
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
