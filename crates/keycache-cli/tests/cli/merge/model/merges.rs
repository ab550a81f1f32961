//! Merges between peers by the timer recipe, each checked against the model,
//! and the rounds that make every peer agree, with the end's checks.

use std::collections::BTreeSet;
use std::process::Command;

use keycache::Bank;
use keycache_merge::snapshot::Snapshot;
use serde_json::Value;

use crate::common::{check_ok, s, ParamsExt, Rng};

use super::peers::{Event, Peers};
use super::rule::model_merge;
use super::store::{count_changes, kc, layout, ok, read};

impl Peers {
    /// Peer `i` merges peer `j`'s snapshot by the timer recipe (the base of
    /// the last merge from `j`, `j`'s base for `i` as --seen), by a pipe
    /// or through a file; `i`'s own snapshot is taken first, for the model.
    pub(super) fn merge(&mut self, i: usize, j: usize, pipe: bool) {
        let base = self.root.join(format!("base-{i}-from-{j}"));
        let seen = self.root.join(format!("base-{j}-from-{i}"));
        let own = self.root.join(format!("own-{i}.snap"));
        let theirs = self.root.join(format!("snap-{j}"));
        self.observed(i);
        self.observed(j);
        ok(
            &kc(&["snapshot", s(&self.dirs[i]), "-o", s(&own)]),
            "keycache snapshot (ours)",
        );
        let mut margs: Vec<String> = vec!["merge".into(), s(&self.dirs[i]).into()];
        let out = if pipe {
            margs.push("-".into());
            margs.extend(["--base".into(), s(&base).into()]);
            margs.extend(["--write-base".into(), s(&base).into(), "--json".into()]);
            let lay = layout().args().join(" ");
            let bin = env!("CARGO_BIN_EXE_keycache");
            let script = format!(
                "set -o pipefail; '{bin}' snapshot '{}' --seen '{}' {lay} | tee '{}' | '{bin}' {} \
                 {lay}",
                s(&self.dirs[j]),
                s(&seen),
                s(&theirs),
                margs
                    .iter()
                    .map(|a| format!("'{a}'"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            Command::new("bash")
                .arg("-c")
                .arg(script)
                .env("KEYCACHE_REBUILD_SETTLE_MS", "0")
                .output()
                .expect("run the pipe")
        } else {
            ok(
                &kc(&[
                    "snapshot",
                    s(&self.dirs[j]),
                    "-o",
                    s(&theirs),
                    "--seen",
                    s(&seen),
                ]),
                "keycache snapshot (theirs)",
            );
            margs.push(s(&theirs).into());
            margs.extend(["--base".into(), s(&base).into()]);
            margs.extend(["--write-base".into(), s(&base).into(), "--json".into()]);
            let refs: Vec<&str> = margs.iter().map(String::as_str).collect();
            kc(&refs)
        };
        let code = out.status.code();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "merge {i}<-{j}: not JSON ({e}), exit {code:?}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(code, Some(0), "merge {i}<-{j}: {report}");
        assert!(base.exists(), "merge {i}<-{j} wrote no base");
        self.merges += 1;
        let ours = Snapshot::read_file(&own).expect("our snapshot");
        let theirs = Snapshot::read_file(&theirs).expect("their snapshot");
        let want = model_merge(&ours, &theirs);
        for e in ours.entries.iter().chain(&theirs.entries) {
            if e.bank == Bank::Keys {
                self.known[i].insert(e.id.clone());
            }
        }
        for e in &theirs.entries {
            if e.bank == Bank::Keys {
                self.known[j].insert(e.id.clone());
            }
        }
        let got = read(&self.dirs[i]);
        assert_eq!(
            got, want,
            "peer {i} after merging peer {j} (pipe: {pipe}); plan: {report:#}"
        );
        assert_eq!(
            report["written"].as_u64(),
            Some(count_changes(&self.models[i], &want)),
            "{report:#}"
        );
        for (k, (st, key)) in &self.models[i] {
            if *st == "accepted" && k.0 == Bank::Keys {
                match want.get(k) {
                    Some(("accepted", k2)) if k2 != key => self.rekeyed += 1,
                    Some(("accepted", _)) => {}
                    _ => self.revoked += 1,
                }
            }
        }
        self.check_not_undone(i, j, &want);
        let theirs_known = self.knows[j].clone();
        self.knows[i].extend(theirs_known);
        self.models[i] = want;
        // Every key accepted here was accepted by an operator somewhere.
        for ((bank, id), (state, key)) in &self.models[i] {
            if *bank == Bank::Keys && *state == "accepted" {
                assert!(
                    self.events
                        .iter()
                        .any(|(x, e)| x == id && *e == Event::Accept(key.clone())),
                    "peer {i}: {id} accepted with a key no operator accepted"
                );
            }
        }
    }

    pub(super) fn all_same(&self) -> bool {
        self.models.windows(2).all(|w| w[0] == w[1])
    }

    /// Peer 1 and peer 0 merge each other (until both joined one
    /// cluster), every other peer merges peer 0, then peer 0 it.
    pub(super) fn join(&mut self, rng: &mut Rng) {
        self.merge(1, 0, rng.one_in(2));
        self.merge(0, 1, rng.one_in(2));
        self.merge(1, 0, rng.one_in(2));
        for k in 2..self.dirs.len() {
            self.merge(k, 0, rng.one_in(2));
            self.merge(0, k, rng.one_in(2));
        }
    }

    /// Every ordered pair merges, in rounds, until the model says all peers
    /// agree (at most `rounds`).
    pub(super) fn converge(&mut self, rng: &mut Rng, rounds: usize) {
        let n = self.dirs.len();
        for _ in 0..rounds {
            for i in 0..n {
                for j in 0..n {
                    if i != j {
                        self.merge(i, j, rng.one_in(3));
                    }
                }
            }
            if self.all_same() {
                return;
            }
        }
        let short =
            |v: Option<&(&'static str, String)>| v.map(|(st, k)| format!("{st} {}", &k[27..40]));
        let mut report = String::new();
        let keys: BTreeSet<_> = self.models.iter().flat_map(|m| m.keys()).collect();
        for k in keys {
            let vals: Vec<_> = self.models.iter().map(|m| short(m.get(k))).collect();
            if vals.windows(2).any(|w| w[0] != w[1]) {
                report.push_str(&format!("{k:?}: peers {vals:?}\n"));
            }
        }
        panic!("the peers did not converge in {rounds} rounds:\n{report}");
    }

    /// The end: every pair identical by `keycache diff`, equal to the
    /// model, and every accepted key accepted by an operator after the
    /// last revocation of its id.
    pub(super) fn check_end(&self) {
        for (i, d) in self.dirs.iter().enumerate() {
            assert_eq!(read(d), self.models[i], "peer {i}");
            for j in i + 1..self.dirs.len() {
                let out = kc(&["diff", s(d), s(&self.dirs[j])]);
                check_ok(&format!("diff peer {i} peer {j}"), &out);
            }
            for ((bank, id), (state, key)) in &self.models[i] {
                if *bank != Bank::Keys || *state != "accepted" {
                    continue;
                }
                let last_revoke = self
                    .events
                    .iter()
                    .rposition(|(x, e)| x == id && *e == Event::Revoke);
                let accepted_after = self.events.iter().enumerate().any(|(n, (x, e))| {
                    x == id && *e == Event::Accept(key.clone()) && last_revoke.is_none_or(|r| n > r)
                });
                assert!(
                    accepted_after,
                    "peer {i}: {id} accepted with a key no operator accepted after the last \
                     revocation of {id} (a revoked key came back); {id}'s events: {:#?}",
                    self.events
                        .iter()
                        .filter(|(x, _)| x == id)
                        .map(|(_, e)| match e {
                            Event::Accept(k) => format!("accept {}", &k[27..45]),
                            Event::Revoke => "revoke".into(),
                            Event::Write => "sign-in".into(),
                        })
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}
