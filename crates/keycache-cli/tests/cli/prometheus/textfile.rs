//! A stand-in for node_exporter's textfile collector ([`Textfile`]): an HTTP
//! server that runs the stats unit's command for every scrape and serves the
//! file it leaves.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common::{repo, s, BIN};

/// What node_exporter's textfile collector is to Prometheus, for the test:
/// an HTTP server on 127.0.0.1 that, for every request, runs the
/// `ExecStart=` command of `dist/keycache-stats.service` (with the test's
/// binary, config and textfile directory: the file written to a temporary
/// name, then renamed) and serves the `keycache.prom` it leaves.
pub(super) struct Textfile {
    pub(super) port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Textfile {
    pub(super) fn start(conf: &Path, dir: &Path) -> Textfile {
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
