//! Monitoring: `keycache stats --prometheus` (the gauges node_exporter's
//! textfile collector serves), the alert rules of `dist/keycache.rules.yml`
//! (checked and unit-tested by the real `promtool`), and a real Prometheus
//! server scraping a real replicator and the textfile as
//! `dist/keycache-stats.service` writes it, with those rules loaded.
//!
//! Prometheus and promtool come from `KEYCACHE_PROMETHEUS_ROOT` (the
//! directory `tools/fetch-prometheus-debian.sh` prints: its `usr/bin` holds
//! them; or a directory holding them). Unset, the tests that need them say
//! SKIP, except in CI (`CI=true`, or `KEYCACHE_NO_SKIPS=1`), where that
//! fails.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use keycache_testkit::cmd::TestCommand;
use keycache_testkit::etcd::{free_port, Cluster};
use keycache_testkit::skip::skip;
use serde_json::Value;

use crate::common::{kc, repo, s, sample_pki, sample_store_dir, BIN};

/// The states of `keycache_keys{state}` and where `list --json` has them.
const STATES: [(&str, &str); 4] = [
    ("accepted", "minions"),
    ("pending", "minions_pre"),
    ("rejected", "minions_rejected"),
    ("denied", "minions_denied"),
];

/// The banks of `keycache_bank_*{bank}`.
const BANKS: [&str; 2] = ["keys", "denied_keys"];

/// One sample of an exposition.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Whether `n` is a metric or label name (`[a-zA-Z_:][a-zA-Z0-9_:]*`; no
/// `:` in a label name).
fn is_name(n: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut chars = n.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// Parses Prometheus' text exposition format as `stats --prometheus`
/// writes it, strictly: every line is `# HELP NAME TEXT`, `# TYPE NAME
/// gauge` or `NAME{LABEL="VALUE",...} VALUE`; every sample's name has its
/// HELP and TYPE lines before it, once each; the text ends with a newline.
fn parse_exposition(text: &str) -> Vec<Sample> {
    assert!(text.ends_with('\n'), "no final newline: {text:?}");
    let mut help = BTreeSet::new();
    let mut typed = BTreeSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, doc) = rest.split_once(' ').expect("# HELP NAME TEXT");
            assert!(is_name(name, true) && !doc.trim().is_empty(), "{line}");
            assert!(help.insert(name.to_owned()), "a second HELP: {line}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("# TYPE NAME TYPE");
            assert!(is_name(name, true) && ty == "gauge", "{line}");
            assert!(help.contains(name), "TYPE before HELP: {line}");
            assert!(typed.insert(name.to_owned()), "a second TYPE: {line}");
        } else {
            let (name, rest) = line.split_once('{').expect("NAME{LABELS} VALUE");
            assert!(is_name(name, true), "{line}");
            assert!(
                help.contains(name) && typed.contains(name),
                "a sample before its HELP and TYPE: {line}"
            );
            let (labels, value) = rest.rsplit_once("} ").expect("NAME{LABELS} VALUE");
            let mut map = BTreeMap::new();
            let mut rest = labels;
            while !rest.is_empty() {
                let (k, v) = rest.split_once("=\"").expect("LABEL=\"VALUE\"");
                assert!(is_name(k, false), "label name {k:?}: {line}");
                let mut value = String::new();
                let mut chars = v.char_indices();
                let end = loop {
                    match chars.next().expect("an unterminated label value") {
                        (_, '\\') => match chars.next().expect("an escape") {
                            (_, 'n') => value.push('\n'),
                            (_, c) => value.push(c),
                        },
                        (i, '"') => break i,
                        (_, c) => value.push(c),
                    }
                };
                assert!(map.insert(k.to_owned(), value).is_none(), "{line}");
                rest = &v[end + 1..];
                rest = rest.strip_prefix(',').unwrap_or(rest);
            }
            let value: f64 = value.parse().expect("a number");
            assert!(value.is_finite(), "{line}");
            out.push(Sample {
                name: name.to_owned(),
                labels: map,
                value,
            });
        }
    }
    out
}

/// The value of the sample `name{label="value"}`.
fn sample(samples: &[Sample], name: &str, label: &str, value: &str) -> f64 {
    let found: Vec<_> = samples
        .iter()
        .filter(|x| x.name == name && x.labels.get(label).map(String::as_str) == Some(value))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{name}{{{label}=\"{value}\"}} in {samples:?}"
    );
    found[0].value
}

/// A master config in `<t>/etc/master` naming the store `pki` (no etcd):
/// the config directory.
fn config_for(t: &Path, pki: &Path, extra: &str) -> PathBuf {
    let conf = t.join("etc");
    std::fs::create_dir_all(&conf).expect("etc");
    std::fs::write(
        conf.join("master"),
        format!(
            "pki_dir: {}\nmmap_key_size: 1009\nkeys.cache_driver: keycache\n{extra}",
            pki.display()
        ),
    )
    .expect("master config");
    conf
}

/// Checks `stats --prometheus` of the store of config `conf` against
/// `stats --json` and `list --json`: one sample per state and per bank of
/// each gauge, nothing else, the same figures; no label holds a minion id.
/// Returns the exposition.
fn check_exposition(conf: &Path) -> String {
    let text = kc().args(["stats", "-c", s(conf), "--prometheus"]).ok();
    let samples = parse_exposition(&text);
    let stats = kc().args(["stats", "-c", s(conf), "--json"]).json();
    let list = kc().args(["list", "-c", s(conf), "--json"]).json();

    let mut want = BTreeSet::new();
    for (state, listed) in STATES {
        let n = list[listed].as_array().expect("a list").len() as f64;
        let v = sample(&samples, "keycache_keys", "state", state);
        assert_eq!(v, n, "keycache_keys{{state={state:?}}} against list --json");
        assert_eq!(
            Some(v),
            stats["counts"][state].as_f64(),
            "keycache_keys{{state={state:?}}} against stats --json"
        );
        want.insert(("keycache_keys".to_owned(), format!("state={state}")));
    }
    for bank in BANKS {
        let b = &stats[bank];
        for (name, json) in [
            ("keycache_bank_load_factor", &b["load_factor"]),
            ("keycache_bank_longest_probe", &b["probe_length"]["max"]),
            ("keycache_bank_heap_bytes", &b["heap_total_bytes"]),
            ("keycache_bank_slots", &b["capacity"]),
        ] {
            assert_eq!(
                Some(sample(&samples, name, "bank", bank)),
                json.as_f64(),
                "{name}{{bank={bank:?}}} against stats --json: {stats}"
            );
            want.insert((name.to_owned(), format!("bank={bank}")));
        }
    }
    let got: BTreeSet<_> = samples
        .iter()
        .map(|x| {
            let labels: Vec<String> = x.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            (x.name.clone(), labels.join(","))
        })
        .collect();
    assert_eq!(got, want, "exactly these samples:\n{text}");
    assert_eq!(got.len(), samples.len(), "no sample twice:\n{text}");

    let ids: BTreeSet<&str> = STATES
        .iter()
        .flat_map(|(_, listed)| list[*listed].as_array().expect("a list"))
        .map(|v| v.as_str().expect("an id"))
        .collect();
    for x in &samples {
        for v in x.labels.values() {
            assert!(!ids.contains(v.as_str()), "a minion id as a label: {x:?}");
        }
    }
    text
}

#[test]
fn stats_prometheus_has_the_counts_and_bank_figures_of_stats_json() {
    let (t, st) = sample_store_dir();
    let conf = config_for(t.path(), &st, "");
    let list = kc().args(["list", "-c", s(&conf), "--json"]).json();
    // Keys in every state, and not the sample's own counts: one more
    // accepted, one more rejected, one more denied, fewer pending.
    let pending: Vec<String> = list["minions_pre"]
        .as_array()
        .expect("pending")
        .iter()
        .map(|v| v.as_str().expect("id").to_owned())
        .collect();
    assert!(pending.len() >= 3, "{list}");
    kc().args(["accept", "-c", s(&conf), &pending[0]]).ok();
    kc().args(["reject", "-c", s(&conf), &pending[1]]).ok();
    kc().args(["deny", "-c", s(&conf), &pending[2]]).ok();
    let text = check_exposition(&conf);
    for (state, listed) in STATES {
        assert!(
            list[listed].as_array().is_some_and(|a| !a.is_empty()),
            "the sample has {state} keys"
        );
    }
    // The store directory as the argument: the same.
    assert_eq!(
        kc().args(["stats", s(&st), "--prometheus", "--size", "1009"])
            .ok(),
        text
    );
    // The HELP and TYPE lines, one each per gauge.
    for name in [
        "keycache_keys",
        "keycache_bank_load_factor",
        "keycache_bank_longest_probe",
        "keycache_bank_heap_bytes",
        "keycache_bank_slots",
    ] {
        assert_eq!(
            text.matches(&format!("# TYPE {name} gauge\n")).count(),
            1,
            "{text}"
        );
    }
    // Not with --json: refused by the argument parser, exit 2, no output.
    let out = kc()
        .args(["stats", "-c", s(&conf), "--prometheus", "--json"])
        .fails_output(2);
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--prometheus") && err.contains("--json"),
        "{err}"
    );
}

#[test]
fn stats_prometheus_of_an_empty_store() {
    let t = tempfile::tempdir().expect("scratch");
    let pki = t.path().join("pki");
    std::fs::create_dir(&pki).expect("pki");
    // An empty tree migrated: both banks, no key.
    for d in [
        "minions",
        "minions_pre",
        "minions_rejected",
        "minions_denied",
    ] {
        std::fs::create_dir(pki.join(d)).expect("tree");
    }
    kc().args(["migrate", s(&pki), "--size", "1009"]).ok();
    let conf = config_for(t.path(), &pki, "");
    let text = check_exposition(&conf);
    let samples = parse_exposition(&text);
    for (state, _) in STATES {
        assert_eq!(sample(&samples, "keycache_keys", "state", state), 0.0);
    }
}

/// The directory holding `prometheus` and `promtool`: under
/// `KEYCACHE_PROMETHEUS_ROOT` (its `usr/bin`, or itself). Unset: `None`
/// after a SKIP line for `what`, except in CI (`CI=true`), where that is a
/// failure.
fn prometheus_bin(what: &str) -> Option<PathBuf> {
    let Some(root) = std::env::var_os("KEYCACHE_PROMETHEUS_ROOT") else {
        let why = "KEYCACHE_PROMETHEUS_ROOT is not set (tools/test.sh sets it to what \
                   tools/fetch-prometheus-debian.sh prints)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{what}: CI=true, and {why}"
        );
        skip(what, why);
        return None;
    };
    let root = PathBuf::from(root);
    let bin = if root.join("usr/bin/promtool").exists() {
        root.join("usr/bin")
    } else {
        root.clone()
    };
    for tool in ["prometheus", "promtool"] {
        assert!(
            bin.join(tool).is_file(),
            "KEYCACHE_PROMETHEUS_ROOT={}: no {tool} in it or its usr/bin",
            root.display()
        );
    }
    Some(bin)
}

/// The rule blocks of `dist/keycache.rules.yml`: `(alert name, its text)`.
fn rule_blocks(rules: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in rules.lines() {
        if let Some(name) = line.trim_start().strip_prefix("- alert: ") {
            out.push((name.trim().to_owned(), String::new()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

/// The metric names the rules' expressions read.
fn rule_metrics(rules: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in rules.lines() {
        let Some(expr) = line.trim_start().strip_prefix("expr: ") else {
            continue;
        };
        // Identifiers outside label matchers and range brackets.
        let mut depth = 0;
        let mut word = String::new();
        for c in expr.chars().chain([' ']) {
            if depth == 0 && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                word.push(c);
                continue;
            }
            if !word.is_empty() && (word.starts_with("keycache_") || word == "up") {
                out.insert(std::mem::take(&mut word));
            }
            word.clear();
            match c {
                '{' | '[' => depth += 1,
                '}' | ']' => depth -= 1,
                _ => {}
            }
        }
    }
    out
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dist = repo().join("dist");
    let rules = std::fs::read_to_string(dist.join("keycache.rules.yml")).expect("rules");
    let tests = std::fs::read_to_string(dist.join("keycache.rules.test.yml")).expect("tests");
    // What every rule carries, and that each has a firing and a quiet case.
    let blocks = rule_blocks(&rules);
    assert!(blocks.len() >= 7, "{blocks:?}");
    for (name, text) in &blocks {
        for key in ["expr:", "severity:", "summary:", "description:"] {
            assert!(text.contains(key), "rule {name} has no {key}\n{text}");
        }
        let lines: Vec<&str> = tests.lines().map(str::trim).collect();
        let cases: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0] == format!("alertname: {name}"))
            .map(|w| w[1])
            .collect();
        assert!(
            cases.contains(&"exp_alerts: []") && cases.contains(&"exp_alerts:"),
            "{name}: keycache.rules.test.yml must test it firing and not firing: {cases:?}"
        );
    }
    for m in [
        "keycache_replica_stale",
        "keycache_replica_ready",
        "keycache_replica_lag_revisions",
        "keycache_relists_total",
        "keycache_consistency_checks_total",
        "keycache_bank_load_factor",
        "up",
    ] {
        assert!(rule_metrics(&rules).contains(m), "no rule reads {m}");
    }

    let Some(bin) =
        prometheus_bin("prometheus::the_alert_rules_pass_promtool_and_their_unit_tests")
    else {
        return;
    };
    let promtool = bin.join("promtool");
    let out = TestCommand::new(&promtool)
        .args(["check", "rules"])
        .arg(dist.join("keycache.rules.yml"))
        .ok();
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", blocks.len())),
        "{out}"
    );
    TestCommand::new(&promtool)
        .args(["test", "rules"])
        .arg(dist.join("keycache.rules.test.yml"))
        .ok();
    // The textfile passes promtool's own parser and linter.
    let (t, st) = sample_store_dir();
    let conf = config_for(t.path(), &st, "");
    let text = kc().args(["stats", "-c", s(&conf), "--prometheus"]).ok();
    TestCommand::new(&promtool)
        .args(["check", "metrics"])
        .stdin(text)
        .ok();
}

/// A process of this test, killed (by its pid) and reaped when dropped.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(cmd: &mut Command, log: PathBuf) -> Proc {
        let f = std::fs::File::create(&log).expect("log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log"))
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        Proc { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails with the log when the process has exited.
    fn alive(&mut self, what: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{what} exited ({status}):\n{}", self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The etcd member paused; resumed (SIGCONT) when dropped, whatever happens.
struct Paused<'a>(&'a Cluster);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.resume_member(0);
    }
}

/// Percent-encodes a query parameter.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `GET path` on 127.0.0.1:`port` (HTTP/1.0: the answer ends with the
/// connection); its status and body, or the error.
fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(c, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or(format!("no header end: {raw:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(format!("no status: {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// An instant query to the Prometheus server on `port`: its result vector
/// as `(labels, value)`, or why not.
fn query(port: u16, q: &str) -> Result<Vec<(Value, f64)>, String> {
    let (status, body) = http_get(port, &format!("/api/v1/query?query={}", encode(q)))?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if status != 200 || v["status"] != "success" {
        return Err(format!("{status}: {body}"));
    }
    v["data"]["result"]
        .as_array()
        .ok_or(format!("no result: {body}"))?
        .iter()
        .map(|r| {
            let value = r["value"][1]
                .as_str()
                .and_then(|x| x.parse().ok())
                .ok_or(format!("no value: {r}"))?;
            Ok((r["metric"].clone(), value))
        })
        .collect()
}

/// Polls `check` every 200 ms until it returns `Some`, for at most
/// `limit`; else fails with `what` and the last thing `check` saw.
fn wait_until<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<Option<T>, String>,
) -> T {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        match check() {
            Ok(Some(t)) => return t,
            Ok(None) => {}
            Err(e) => last = e,
        }
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}; last: {last}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The one value a query answers, or `None` while it answers nothing.
fn single(port: u16, q: &str) -> Result<Option<f64>, String> {
    let r = query(port, q)?;
    match r.as_slice() {
        [] => Ok(None),
        [(_, v)] => Ok(Some(*v)),
        _ => Err(format!("{q}: more than one series: {r:?}")),
    }
}

/// What node_exporter's textfile collector is to Prometheus, for the test:
/// an HTTP server on 127.0.0.1 that, for every request, runs the
/// `ExecStart=` command of `dist/keycache-stats.service` (with the test's
/// binary, config and textfile directory: the file written to a temporary
/// name, then renamed) and serves the `keycache.prom` it leaves.
struct Textfile {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Textfile {
    fn start(conf: &Path, dir: &Path) -> Textfile {
        let unit =
            std::fs::read_to_string(repo().join("dist/keycache-stats.service")).expect("unit");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart=/bin/sh -c '"))
            .and_then(|l| l.strip_suffix('\''))
            .expect("ExecStart=/bin/sh -c '...' in keycache-stats.service");
        assert!(
            exec.contains("keycache.prom.tmp") && exec.contains("mv -f"),
            "{exec}"
        );
        let script = exec
            .replace("/usr/bin/keycache", BIN)
            .replace("/etc/salt", s(conf))
            .replace("/var/lib/prometheus/node-exporter", s(dir));
        let prom = dir.join("keycache.prom");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let mut c = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let ran = Command::new("/bin/sh")
                    .args(["-c", &script])
                    .stdin(Stdio::null())
                    .output();
                let (status, body) = match ran {
                    Ok(o) if o.status.success() => {
                        ("200 OK", std::fs::read_to_string(&prom).unwrap_or_default())
                    }
                    Ok(o) => (
                        "500 Internal Server Error",
                        String::from_utf8_lossy(&o.stderr).into_owned(),
                    ),
                    Err(e) => ("500 Internal Server Error", e.to_string()),
                };
                let _ = write!(
                    c,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Textfile {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Textfile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A real Prometheus server (KEYCACHE_PROMETHEUS_ROOT) with the rules of
/// dist/ scraping, every second, a real `keycache replicate` (its
/// `keycache_etcd.metrics` endpoint, job `keycache`) and the textfile as
/// the stats unit writes it (job `node`): the replica is current (stale 0,
/// ready), `keycache_keys{state="accepted"}` is the store's count, every
/// metric the rules read is there; then the etcd member is paused (SIGSTOP)
/// past `stale_after`: the query of `keycache_replica_stale` answers 1, the
/// replicator's /readyz 503, and the stale rule goes pending; resumed
/// (SIGCONT), the replica is current again.
#[test]
fn a_real_prometheus_scrapes_a_replicator_and_sees_it_go_stale() {
    let Some(bin) =
        prometheus_bin("prometheus::a_real_prometheus_scrapes_a_replicator_and_sees_it_go_stale")
    else {
        return;
    };
    let limit = Duration::from_secs(60);
    let c = Cluster::start(1);
    let t = tempfile::tempdir().expect("scratch");
    let pki = t.path().join("pki");
    std::fs::create_dir(&pki).expect("pki");
    let metrics = free_port();
    let conf = config_for(
        t.path(),
        &pki,
        &format!(
            "keycache_etcd:\n  endpoints: [{}]\n  prefix: /keycache/prometheus/\n  write_timeout: 3\n  \
             stale_after: 2\n  metrics: 127.0.0.1:{metrics}\n",
            c.endpoints().join(", ")
        ),
    );
    kc().args(["etcd", "seed", "-c", s(&conf), "--from"])
        .arg(sample_pki())
        .ok();
    let mut replicate = Proc::spawn(
        Command::new(BIN).args(["replicate", "-c", s(&conf)]),
        t.path().join("replicate.log"),
    );
    // Ready: the first list applied.
    wait_until("the replicator's /readyz answers 200", limit, || {
        replicate.alive("keycache replicate");
        Ok(http_get(metrics, "/readyz")?.0.eq(&200).then_some(()))
    });
    // A change through etcd, applied by the replicator.
    let list = kc().args(["list", "-c", s(&conf), "--json"]).json();
    let id = list["minions_pre"][0]
        .as_str()
        .expect("a pending id")
        .to_owned();
    kc().args(["accept", "-c", s(&conf), &id]).ok();
    let accepted = wait_until("the accept in the replica", limit, || {
        let l = kc().args(["list", "-c", s(&conf), "--json"]).json();
        let a = l["minions"].as_array().expect("accepted");
        Ok(a.iter().any(|x| x == id.as_str()).then_some(a.len() as f64))
    });

    let textfile_dir = t.path().join("node-exporter");
    std::fs::create_dir(&textfile_dir).expect("textfile directory");
    let textfile = Textfile::start(&conf, &textfile_dir);
    let prom_port = free_port();
    let prom_conf = t.path().join("prometheus.yml");
    std::fs::write(
        &prom_conf,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{}]\n\
             scrape_configs:\n\
             \x20 - job_name: keycache\n\
             \x20   static_configs: [{{targets: ['127.0.0.1:{metrics}']}}]\n\
             \x20 - job_name: node\n\
             \x20   static_configs: [{{targets: ['127.0.0.1:{}']}}]\n",
            repo().join("dist/keycache.rules.yml").display(),
            textfile.port
        ),
    )
    .expect("prometheus.yml");
    let mut prometheus = Proc::spawn(
        Command::new(bin.join("prometheus")).args([
            &format!("--config.file={}", prom_conf.display()),
            &format!("--storage.tsdb.path={}", t.path().join("tsdb").display()),
            &format!("--web.listen-address=127.0.0.1:{prom_port}"),
        ]),
        t.path().join("prometheus.log"),
    );
    let mut alive = |what: &str| {
        prometheus.alive(&format!("prometheus ({what})"));
        replicate.alive(&format!("keycache replicate ({what})"));
    };

    // The rules are loaded, and healthy.
    wait_until("the rules of dist/keycache.rules.yml loaded", limit, || {
        alive("rules");
        let (status, body) = http_get(prom_port, "/api/v1/rules")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status} {e}: {body}"))?;
        let rules: Vec<&Value> = v["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        if rules.is_empty() {
            return Ok(None);
        }
        for r in &rules {
            if r["health"] == "err" {
                return Err(format!("a rule fails: {r}"));
            }
        }
        Ok(Some(()))
    });
    wait_until("keycache_replica_stale 0, scraped", limit, || {
        alive("current");
        Ok(single(prom_port, "keycache_replica_stale{job=\"keycache\"}")?.filter(|v| *v == 0.0))
    });
    assert_eq!(
        wait_until("keycache_replica_ready, scraped", limit, || single(
            prom_port,
            "keycache_replica_ready{job=\"keycache\"}"
        )),
        1.0
    );
    wait_until(
        "keycache_keys{state=\"accepted\"} the store's count",
        limit,
        || {
            alive("keys");
            Ok(
                single(prom_port, "keycache_keys{job=\"node\",state=\"accepted\"}")?
                    .filter(|v| *v == accepted),
            )
        },
    );
    // Every metric the rules read is scraped.
    let rules = std::fs::read_to_string(repo().join("dist/keycache.rules.yml")).expect("rules");
    let want = rule_metrics(&rules);
    assert!(want.len() >= 7, "{want:?}");
    wait_until("every metric the rules read, scraped", limit, || {
        alive("names");
        let (_, body) = http_get(prom_port, "/api/v1/label/__name__/values")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        let names: BTreeSet<String> = v["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect();
        let missing: Vec<_> = want.difference(&names).collect();
        if missing.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("not scraped: {missing:?}"))
        }
    });
    assert_eq!(
        http_get(metrics, "/readyz").expect("/readyz").0,
        200,
        "ready while etcd answers"
    );

    // etcd paused (SIGSTOP, by its pid) past stale_after: stale, not ready.
    let pid = c.members[0].pid().expect("the member runs");
    assert!(pid > 0);
    c.pause_member(0);
    let paused = Paused(&c);
    wait_until("keycache_replica_stale 1 with etcd paused", limit, || {
        alive("stale");
        Ok(single(prom_port, "keycache_replica_stale{job=\"keycache\"}")?.filter(|v| *v == 1.0))
    });
    wait_until("/readyz 503 with etcd paused", limit, || {
        Ok(http_get(metrics, "/readyz")?.0.eq(&503).then_some(()))
    });
    wait_until("KeycacheReplicaStale pending", limit, || {
        alive("alert");
        single(
            prom_port,
            "ALERTS{alertname=\"KeycacheReplicaStale\",alertstate=\"pending\",job=\"keycache\"}",
        )
    });
    assert!(
        query(prom_port, "ALERTS{alertname=\"KeycacheScrapeDown\"}")
            .expect("ALERTS")
            .is_empty(),
        "the replicator is still scraped while etcd is paused"
    );

    // Resumed: current again.
    drop(paused);
    wait_until("keycache_replica_stale 0 with etcd resumed", limit, || {
        alive("resumed");
        Ok(single(prom_port, "keycache_replica_stale{job=\"keycache\"}")?.filter(|v| *v == 0.0))
    });
    wait_until("/readyz 200 with etcd resumed", limit, || {
        Ok(http_get(metrics, "/readyz")?.0.eq(&200).then_some(()))
    });
    drop(prometheus);
    drop(replicate);
    drop(textfile);
}
