//! Checking a store after a crash: every id old or new, `verify`'s findings
//! only what a crash between the index and the roster leaves, mended by the
//! next writer (a kill) or `verify --repair` (a power loss); copies of
//! checked stores for the real Salt to read.

use super::*;

/// What a crash between writing the index and the roster may leave: header
/// counters and roster entries out of step with the slots.
pub fn legit_after_crash(f: &Finding) -> bool {
    f.repairable
        && (f.file.to_string_lossy().ends_with(".roster")
            || (f.slot.is_none()
                && matches!(
                    f.offset,
                    Some(o) if o == keycache::format::HDR_OCCUPIED as u64
                        || o == keycache::format::HDR_DELETED as u64
                        || o == keycache::format::HDR_HWM as u64
                )))
}

/// `verify`'s findings on a store.
pub fn findings(store: &Store) -> Vec<Finding> {
    verify::verify_store(store).unwrap()
}

/// The model as a store lists it.
pub fn listing(store: &Store) -> Model {
    let mut m = Model::default();
    for r in store.keys(None).unwrap() {
        let (id, e) = r.unwrap();
        m.keys.insert(
            id,
            (
                e.state.name().to_owned(),
                String::from_utf8(e.public_key).unwrap(),
            ),
        );
    }
    for r in store.denied_keys().unwrap() {
        let (id, p) = r.unwrap();
        m.denied.insert(id, String::from_utf8(p).unwrap());
    }
    m
}

/// Tallies of what the checks met.
#[derive(Debug, Default)]
pub struct Tally {
    /// Stores checked.
    pub checked: u64,
    /// With an op in flight.
    pub in_flight: u64,
    /// With the op in flight (partly) applied.
    pub in_flight_applied: u64,
    /// With `verify` findings.
    pub with_findings: u64,
    /// Mended: by the next writer to open the banks after a kill, by
    /// `keycache verify --repair` after a power loss.
    pub repaired: u64,
}

/// A failed check: the id concerned, when one is, and what is wrong.
pub type Problem = (Option<String>, String);

/// Reads every id of the pool; a failed read is a problem for that id.
pub fn read_model(store: &Store) -> Result<Model, Problem> {
    let mut m = Model::default();
    for id in ids() {
        let i = MinionId::new(id.clone()).unwrap();
        match store.get(&i) {
            Ok(Some(e)) => {
                m.keys.insert(
                    id.clone(),
                    (
                        e.state.name().to_owned(),
                        String::from_utf8_lossy(&e.public_key).into_owned(),
                    ),
                );
            }
            Ok(None) => {}
            Err(e) => return Err((Some(id), format!("get: {e}"))),
        }
        match store.denied(&i) {
            Ok(Some(d)) => {
                m.denied
                    .insert(id.clone(), String::from_utf8_lossy(&d).into_owned());
            }
            Ok(None) => {}
            Err(e) => return Err((Some(id), format!("denied: {e}"))),
        }
    }
    Ok(m)
}

/// `got`, the value of `bank[id]` after a crash, is the acknowledged one
/// (`before`) or the one in flight (`after`); else what is wrong.
fn one_of<V: PartialEq + std::fmt::Debug>(
    bank: &str,
    id: &str,
    got: Option<&V>,
    before: Option<&V>,
    after: Option<&V>,
) -> Result<(), String> {
    if got == before || got == after {
        Ok(())
    } else {
        Err(format!(
            "{bank}[{id}] is {got:?}; acknowledged {before:?}, in flight {after:?}"
        ))
    }
}

/// How the writer of a checked store stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// Killed (SIGKILL): every store it made to the mapping and every
    /// write(2) it finished reached the files. The next writer to open a
    /// bank mends what the kill left between the slots, the roster and the
    /// header's counters, as Salt's writers do on open: no `verify
    /// --repair` needed.
    Killed,
    /// Power lost: only what was synced is certain. `keycache verify
    /// --repair` mends the roster and the counters.
    PowerLoss,
}

/// Opens every bank of the store in `dir` that exists as the next writer
/// would (an empty transaction), which mends the roster and the counters
/// when they are out of step with the slots.
fn open_writers(dir: &Path) -> Result<(), Problem> {
    let store = Store::open_with(dir, &opts()).map_err(|e| (None, format!("reopen: {e}")))?;
    for t in [store.keys_table(), store.denied_table()] {
        if t.path().exists() {
            t.transaction(|_| Ok(())).map_err(|e| {
                (
                    None,
                    format!("open {} for writing: {e}", t.path().display()),
                )
            })?;
        }
    }
    Ok(())
}

/// Checks a store after a crash: every id holds its value before or after
/// the op in flight; findings are only what a crash between index and
/// roster leaves, and the next writer ([`Crash::Killed`]) or `keycache
/// verify --repair` ([`Crash::PowerLoss`]) mends them. Returns what the
/// store holds.
pub fn try_check_crashed(
    kc: &Cli,
    dir: &Path,
    before: &Model,
    after: &Model,
    tally: &mut Tally,
    crash: Crash,
) -> Result<Model, Problem> {
    let store = Store::open_with(dir, &opts()).map_err(|e| (None, format!("reopen: {e}")))?;
    let got = read_model(&store)?;
    for id in ids() {
        let [g, b, a] = [&got, before, after].map(|m| m.keys.get(&id));
        one_of("keys", &id, g, b, a).map_err(|e| (Some(id.clone()), e))?;
        let [g, b, a] = [&got, before, after].map(|m| m.denied.get(&id));
        one_of("denied", &id, g, b, a).map_err(|e| (Some(id.clone()), e))?;
    }
    tally.checked += 1;
    if before != after {
        tally.in_flight += 1;
        if got != *before {
            tally.in_flight_applied += 1;
        }
    }
    let f = findings(&store);
    let listed = listing(&store);
    // What the op in flight did not touch was acknowledged whole: it is
    // listed too (Salt lists by the roster), before any repair.
    for id in ids() {
        if before.keys.get(&id) == after.keys.get(&id) && listed.keys.get(&id) != got.keys.get(&id)
        {
            return Err((
                Some(id.clone()),
                format!("acknowledged keys[{id}] is not listed"),
            ));
        }
        if before.denied.get(&id) == after.denied.get(&id)
            && listed.denied.get(&id) != got.denied.get(&id)
        {
            return Err((
                Some(id.clone()),
                format!("acknowledged denied[{id}] is not listed"),
            ));
        }
    }
    // Whatever was in flight, an entry that lookups find is listed: the
    // roster lists a new slot before its status is set and a removed one
    // until its DELETED status is durable (Salt's `list_all` would
    // otherwise miss a key that its `fetch` finds).
    for id in ids() {
        if got.keys.contains_key(&id) && !listed.keys.contains_key(&id) {
            return Err((
                Some(id.clone()),
                format!("keys[{id}] is found but not listed"),
            ));
        }
        if got.denied.contains_key(&id) && !listed.denied.contains_key(&id) {
            return Err((
                Some(id.clone()),
                format!("denied[{id}] is found but not listed"),
            ));
        }
    }
    if f.is_empty() {
        if listed != got {
            return Err((None, "verify is clean but the listing differs".into()));
        }
    } else {
        tally.with_findings += 1;
        for x in &f {
            if !legit_after_crash(x) {
                return Err((
                    x.id.clone(),
                    format!("finding a crash cannot explain: {x:?}\nall: {f:?}"),
                ));
            }
        }
        drop(store);
        if crash == Crash::Killed {
            open_writers(dir)?;
            let store = Store::open_with(dir, &opts()).unwrap();
            let left = findings(&store);
            if !left.is_empty() {
                return Err((
                    None,
                    format!("the next writer to open the banks left findings: {left:?}"),
                ));
            }
            if Model::read(&store) != got || listing(&store) != got {
                return Err((None, "the next writer changed what the store holds".into()));
            }
            tally.repaired += 1;
            return Ok(got);
        }
        // The banks: a crashed store here has no key tree.
        let out = kc.run(dir, &["verify", "--repair", "--json", "--tree", "never"]);
        if out.status.code() != Some(0) {
            return Err((
                None,
                format!(
                    "keycache verify --repair: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            ));
        }
        tally.repaired += 1;
        let store = Store::open_with(dir, &opts()).unwrap();
        assert!(findings(&store).is_empty(), "not clean after repair");
        assert_eq!(Model::read(&store), got, "repair changed entries");
        assert_eq!(listing(&store), got, "listing after repair");
    }
    Ok(got)
}

/// [`try_check_crashed`] of a store whose writer was killed
/// ([`Crash::Killed`]), panicking with `ctx` and the problem.
pub fn check_crashed(
    kc: &Cli,
    dir: &Path,
    before: &Model,
    after: &Model,
    ctx: &str,
    tally: &mut Tally,
) -> Model {
    try_check_crashed(kc, dir, before, after, tally, Crash::Killed)
        .unwrap_or_else(|(_, msg)| panic!("{ctx}: {msg}"))
}

/// Copies the regular files of `from` into `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        if m.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Copies of checked stores, read by Salt at the end of a test.
#[derive(Default)]
pub struct SaltCheck {
    dirs: Vec<PathBuf>,
    want: Vec<Value>,
}

impl SaltCheck {
    /// Copies `dir` to `to` and notes what keycache reads there.
    pub fn add(&mut self, dir: &Path, to: PathBuf) {
        copy_dir(dir, &to);
        self.want.push(common::kc_dump(&to, &layout()));
        self.dirs.push(to);
    }

    /// Salt reads every copy: no error, no log line, the same entries as
    /// keycache. Returns how many copies.
    pub fn run(self, ctx: &str) -> usize {
        let n = self.dirs.len();
        for ((dump, log), (want, dir)) in common::salt_dump_many(&self.dirs, &layout())
            .into_iter()
            .zip(self.want.iter().zip(&self.dirs))
        {
            assert!(
                dump.get("error").is_none(),
                "{ctx}: Salt failed on {}: {dump}",
                dir.display()
            );
            assert!(
                log.iter().all(|l| !l.starts_with("salt: ")),
                "{ctx}: Salt logged on {}: {log:?}",
                dir.display()
            );
            assert_eq!(dump["keys"], want["keys"], "{ctx}: {}", dir.display());
            assert_eq!(
                dump["denied_keys"],
                want["denied_keys"],
                "{ctx}: {}",
                dir.display()
            );
        }
        n
    }
}

/// What rebuilds leave behind in `dir`: temporaries and journals.
pub fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.contains(".keycache-tmp.")
                || n.contains(".keycache-new.")
                || n.contains(".keycache-journal")
        })
        .collect()
}

/// Lines the tracee writes to its stdout, gathered at write(1) entries.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn stdout_of(s: &tracer::Stop, text: &mut String) -> bool {
    if s.entry && s.nr == libc::SYS_write && s.args[0] == 1 {
        let b = tracer::read_mem(s.pid, s.args[1], s.args[2] as usize);
        text.push_str(&String::from_utf8_lossy(&b));
        return true;
    }
    false
}
