//! "No revoked key comes back", where it takes the `keycache` binary: a
//! merge killed after its history was written but before its banks (the
//! merge run again takes the peer's changes), and the note `keycache merge`
//! prints for an old keycache's base. The merge semantics (new peers,
//! restored peers, replays, lost bases, other clusters, wiped peers, bad
//! snapshot entries, bases, mass deletions, new masters, tombstones) are
//! keycache-merge's own tests (crates/keycache-merge/tests/safety), through
//! the library as the commands call it; here too masters are Salt pki dirs
//! judged by Salt 3008.5's own `ReqServerChannel.validate_token`, merged by
//! docs/install.md's timer recipe (`keycache snapshot B --seen ... |
//! keycache merge A - --base F --write-base F`).

use crate::common;
use crate::common::{ok, pki_master, s, size_1009, timer_pull, vt_keygen, vt_passing, SIZE_1009};

use std::path::{Path, PathBuf};
use std::process::Output;

/// `keycache ARGS --size 1009`.
fn kc(args: &[&str]) -> Output {
    common::kc().args(args).args(SIZE_1009).no_settle().output()
}

/// A run's exit status and output, for failure messages.
fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Two masters of one cluster (`m`), in `t`; the Salt keys of their
/// minions in `keys`, and the minions' ids.
struct Cluster {
    m: [PathBuf; 2],
    t: PathBuf,
    keys: PathBuf,
    ids: Vec<String>,
}

impl Cluster {
    /// Masters `a` and `b` of one cluster in `t`, every id of `ids` accepted
    /// on both: `a` holds them pending in its tree, the two merge each other
    /// until they joined one cluster, `a` accepts them all and `b` merges
    /// it (docs/install.md's timer recipe each time).
    fn pair(t: &Path, ids: &[&str]) -> Cluster {
        let keys = t.join("keys");
        let kcli = common::cli();
        let a = pki_master(&kcli, t, "a", &vt_keygen(&keys, ids), &size_1009());
        let b = pki_master(&kcli, t, "b", &[], &size_1009());
        let pull = |x: &Path, y: &Path| ok(&timer_pull(&kcli, t, x, y, &size_1009(), &[]));
        pull(&b, &a);
        pull(&a, &b);
        pull(&b, &a);
        ok(&kc(&["accept", s(&a), "--all"]));
        pull(&b, &a);
        let c = Cluster {
            t: t.to_path_buf(),
            keys,
            ids: ids.iter().map(|s| s.to_string()).collect(),
            m: [a, b],
        };
        let all = vec![c.ids.clone(), c.ids.clone()];
        assert_eq!(c.passing(), all, "every id accepted on both masters");
        c
    }

    /// Per master, the ids whose minion Salt's validate_token accepts.
    fn passing(&self) -> Vec<Vec<String>> {
        let pkis: Vec<&Path> = self.m.iter().map(PathBuf::as_path).collect();
        let ids: Vec<&str> = self.ids.iter().map(String::as_str).collect();
        vt_passing(&self.keys, &pkis, &ids)
    }

    /// Asserts that both masters are identical (`keycache diff`).
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn same(&self) {
        let d = kc(&["diff", s(&self.m[0]), s(&self.m[1])]);
        assert_eq!(d.status.code(), Some(0), "{}", text(&d));
    }

    /// A snapshot of master `k` in `t/NAME`.
    fn snapshot(&self, k: usize, name: &str) -> PathBuf {
        let f = self.t.join(name);
        ok(&kc(&["snapshot", s(&self.m[k]), "-o", s(&f)]));
        f
    }
}

/// An older keycache's base (a version 1 snapshot) given as `--base`:
/// read as no base, which `keycache merge` says on stderr; the merge runs
/// and `--write-base` replaces it.
#[test]
fn an_older_keycaches_base_is_ignored_with_a_note() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::pair(t.path(), &["m1", "m2"]);
    ok(&kc(&["delete", s(&c.m[1]), "m1"]));
    let snap = c.snapshot(1, "b.snap");
    let old = c.t.join("old-base");
    let mut v1 = b"KCSNAP\r\n".to_vec();
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&[0u8; 60]);
    std::fs::write(&old, &v1).unwrap();
    let o = kc(&[
        "merge",
        s(&c.m[0]),
        s(&snap),
        "--base",
        s(&old),
        "--write-base",
        s(&old),
    ]);
    ok(&o);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("older keycache"),
        "{}",
        text(&o)
    );
    assert_eq!(&std::fs::read(&old).unwrap()[..8], b"KCBASE\r\n");
    assert_eq!(c.passing()[0], ["m2"]);
}

/// Runs `keycache merge A SNAP` under the tracer and kills it right after
/// it renamed its identity file into place: the history written (every
/// change in flight), the banks and the tree not yet.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn merge_killed_after_its_history(a: &Path, snap: &Path) {
    use keycache_testkit::tracer;
    let mut cmd = common::cli().cmd();
    cmd.args(["merge", s(a), s(snap)])
        .args(SIZE_1009)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut renamed = 0;
    let end = tracer::run(cmd, std::time::Duration::from_secs(60), |st| {
        if st.entry || !tracer::is_rename(st.nr) || st.ret != 0 {
            return tracer::Action::Go;
        }
        // rename(2)'s new path is its second argument, renameat(2)'s and
        // renameat2(2)'s their fourth.
        let to = if st.nr == libc::SYS_rename {
            st.args[1]
        } else {
            st.args[3]
        };
        let name = tracer::read_mem(st.pid, to, 4096);
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if name.ends_with(keycache::format::IDENTITY_FILE.as_bytes()) {
            renamed += 1;
            return tracer::Action::Kill;
        }
        tracer::Action::Go
    });
    assert!(
        end.killed && renamed == 1,
        "the merge was not killed: {end:?}"
    );
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn a_merge_killed_between_its_history_and_its_banks_is_finished_by_the_next() {
    let t = tempfile::tempdir().unwrap();
    let c = Cluster::pair(t.path(), &["m1", "m2", "m3"]);
    ok(&kc(&["delete", s(&c.m[1]), "m1"]));
    ok(&kc(&["reject", s(&c.m[1]), "m2", "--include-all"]));
    let snap = c.snapshot(1, "b.snap");
    merge_killed_after_its_history(&c.m[0], &snap);
    assert_eq!(c.passing()[0], ["m1", "m2", "m3"], "A as the kill left it");
    let o = kc(&["merge", s(&c.m[0]), s(&snap)]);
    ok(&o);
    assert_eq!(
        c.passing()[0],
        ["m3"],
        "the merge run again did not take B's deletion and rejection: {}",
        text(&o)
    );
    c.same();
}
