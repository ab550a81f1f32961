//! Driving a real Prometheus server: finding its binaries
//! (`KEYCACHE_PROMETHEUS_ROOT`), the test's processes, the paused etcd member,
//! and the server's HTTP API (queries, polled until they answer).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keycache_testkit::etcd::Cluster;
use keycache_testkit::skip::skip;
use serde_json::Value;

/// The directory holding `prometheus` and `promtool`: under
/// `KEYCACHE_PROMETHEUS_ROOT` (its `usr/bin`, or itself). Unset: `None`
/// after a SKIP line for `what`, except in CI (`CI=true`), where that is a
/// failure.
pub(super) fn prometheus_bin(what: &str) -> Option<PathBuf> {
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

/// A process of this test, killed (by its pid) and reaped when dropped.
pub(super) struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    pub(super) fn spawn(cmd: &mut Command, log: PathBuf) -> Proc {
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
    pub(super) fn alive(&mut self, what: &str) {
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
pub(super) struct Paused<'a>(pub(super) &'a Cluster);

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
pub(super) fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
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
pub(super) fn query(port: u16, q: &str) -> Result<Vec<(Value, f64)>, String> {
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
pub(super) fn wait_until<T>(
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
pub(super) fn single(port: u16, q: &str) -> Result<Option<f64>, String> {
    let r = query(port, q)?;
    match r.as_slice() {
        [] => Ok(None),
        [(_, v)] => Ok(Some(*v)),
        _ => Err(format!("{q}: more than one series: {r:?}")),
    }
}
