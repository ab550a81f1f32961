//! What the fault tests make outside their scratch directories, each
//! undone by a Drop guard even when the test fails: loop-mounted ext4
//! filesystems ([`LoopMount`]), a frozen filesystem ([`Freeze`]), network
//! namespaces joined by a bridge ([`Net`]); and which etcd member a process
//! is connected to ([`connected_members`], from `/proc`).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keycache_testkit::etcd::Cluster;

/// Runs `program args`; its stdout, or why it failed (the command and its
/// stderr).
pub(super) fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {} exited {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The members of `c` that process `pid` holds an established TCP
/// connection to (their client address and port), from
/// `/proc/<pid>/fd` and `/proc/<pid>/net/tcp` (the table of the process's
/// network namespace).
pub(super) fn connected_members(pid: u32, c: &Cluster) -> Vec<usize> {
    let mut inodes = std::collections::BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            let Ok(target) = std::fs::read_link(e.path()) else {
                continue;
            };
            let t = target.to_string_lossy();
            if let Some(n) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(n.to_owned());
            }
        }
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let mut out = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
        if f.len() < 10 || f[3] != "01" || !inodes.contains(f[9]) {
            continue;
        }
        let Some((ip, port)) = f[2].split_once(':') else {
            continue;
        };
        let (Ok(ip), Ok(port)) = (u32::from_str_radix(ip, 16), u16::from_str_radix(port, 16))
        else {
            continue;
        };
        let ip = Ipv4Addr::from(ip.to_le_bytes());
        for (i, m) in c.members.iter().enumerate() {
            if m.client == port && m.host() == ip.to_string() && !out.contains(&i) {
                out.push(i);
            }
        }
    }
    out
}

/// An ext4 filesystem on a loop device over a sparse file, mounted on a
/// scratch directory; unmounted, detached and removed when dropped.
pub(super) struct LoopMount {
    scratch: tempfile::TempDir,
    dev: Option<String>,
    mounted: bool,
}

impl LoopMount {
    /// A new filesystem of `mib` MiB; why not, when this machine cannot
    /// make one (no loop device, no mkfs.ext4, mount refused).
    pub(super) fn new(mib: u64) -> Result<LoopMount, String> {
        let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
        let image = scratch.path().join("disk.img");
        let f = std::fs::File::create(&image).map_err(|e| e.to_string())?;
        f.set_len(mib << 20).map_err(|e| e.to_string())?;
        drop(f);
        let mut m = LoopMount {
            scratch,
            dev: None,
            mounted: false,
        };
        let dev = run("losetup", &["-f", "--show", path(&image)?])?;
        let dev = dev.trim().to_owned();
        m.dev = Some(dev.clone());
        run("mkfs.ext4", &["-q", "-F", &dev])?;
        let at = m.dir();
        std::fs::create_dir(&at).map_err(|e| e.to_string())?;
        run("mount", &[&dev, path(&at)?])?;
        m.mounted = true;
        Ok(m)
    }

    /// The mount point.
    pub(super) fn dir(&self) -> PathBuf {
        self.scratch.path().join("mnt")
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let at = self.dir();
        if self.mounted {
            if let Some(at) = at.to_str() {
                // A frozen filesystem cannot be unmounted: thaw it first
                // (an error when it is not frozen is expected).
                let _ = run("fsfreeze", &["-u", at]);
                let mut done = false;
                for _ in 0..50 {
                    if run("umount", &[at]).is_ok() {
                        done = true;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                if !done {
                    let _ = run("umount", &["-l", at]);
                }
            }
        }
        if let Some(dev) = &self.dev {
            let _ = run("losetup", &["-d", dev]);
        }
    }
}

fn path(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

/// A filesystem frozen (`fsfreeze -f`): every write to it, fsync included,
/// blocks until it is thawed, explicitly or when this is dropped.
pub(super) struct Freeze {
    at: String,
    frozen: bool,
}

impl Freeze {
    /// Freezes the filesystem mounted at `at`.
    pub(super) fn new(at: &Path) -> Result<Freeze, String> {
        let at = path(at)?.to_owned();
        run("fsfreeze", &["-f", &at])?;
        Ok(Freeze { at, frozen: true })
    }

    /// Thaws it.
    pub(super) fn thaw(&mut self) -> Result<(), String> {
        if std::mem::replace(&mut self.frozen, false) {
            run("fsfreeze", &["-u", &self.at])?;
        }
        Ok(())
    }
}

impl Drop for Freeze {
    fn drop(&mut self) {
        let _ = self.thaw();
    }
}

/// Network namespaces made for one test: a hub (`<tag>-h`) with a bridge
/// at 10.77.0.1/24, and one namespace per member (`<tag>-<i>`, address
/// 10.77.0.1<i> on its `eth0`, a veth into the hub's bridge). Every
/// namespace is deleted when this is dropped (its veths with it).
pub(super) struct Net {
    tag: String,
    made: Vec<String>,
}

impl Net {
    /// The hub and `members` member namespaces; why not, when this machine
    /// cannot make them.
    pub(super) fn new(members: usize) -> Result<Net, String> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut net = Net {
            tag: format!("kcf{}x{n}", std::process::id()),
            made: Vec::new(),
        };
        let hub = net.hub();
        net.add(&hub)?;
        run("ip", &["-n", &hub, "link", "set", "lo", "up"])?;
        run("ip", &["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        run(
            "ip",
            &["-n", &hub, "addr", "add", "10.77.0.1/24", "dev", "br0"],
        )?;
        run("ip", &["-n", &hub, "link", "set", "br0", "up"])?;
        for i in 0..members {
            let ns = net.member(i);
            net.add(&ns)?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            let v = format!("v{i}");
            run(
                "ip",
                &[
                    "-n", &hub, "link", "add", &v, "type", "veth", "peer", "name", "eth0", "netns",
                    &ns,
                ],
            )?;
            run("ip", &["-n", &hub, "link", "set", &v, "master", "br0"])?;
            run("ip", &["-n", &hub, "link", "set", &v, "up"])?;
            let addr = format!("{}/24", Net::address(i));
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(net)
    }

    fn add(&mut self, ns: &str) -> Result<(), String> {
        run("ip", &["netns", "add", ns])?;
        self.made.push(ns.to_owned());
        Ok(())
    }

    /// The hub's name.
    pub(super) fn hub(&self) -> String {
        format!("{}-h", self.tag)
    }

    /// Member `i`'s namespace.
    pub(super) fn member(&self, i: usize) -> String {
        format!("{}-{i}", self.tag)
    }

    /// Member `i`'s address.
    pub(super) fn address(i: usize) -> String {
        format!("10.77.0.{}", 10 + i)
    }

    /// `ip netns exec NS`, a command prefix.
    pub(super) fn exec(ns: &str) -> Vec<String> {
        ["ip", "netns", "exec", ns]
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Cuts member `i` off from its peers: inside its namespace, iptables
    /// drops every TCP packet from or to a peer port (`peer`: each
    /// member's, the same in every namespace), in and out, so that no
    /// connection between it and a peer carries anything either way
    /// (dropping one direction only would leave a stream's data flowing
    /// until its window fills); its client port stays open.
    pub(super) fn cut(&self, i: usize, peer: u16) -> Result<(), String> {
        let ns = self.member(i);
        let port = peer.to_string();
        for chain in ["INPUT", "OUTPUT"] {
            for side in ["--dport", "--sport"] {
                run(
                    "ip",
                    &[
                        "netns", "exec", &ns, "iptables", "-A", chain, "-p", "tcp", side, &port,
                        "-j", "DROP",
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// Undoes [`Net::cut`].
    pub(super) fn heal(&self, i: usize) -> Result<(), String> {
        let ns = self.member(i);
        for chain in ["INPUT", "OUTPUT"] {
            run("ip", &["netns", "exec", &ns, "iptables", "-F", chain])?;
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            let _ = run("ip", &["netns", "del", ns]);
        }
    }
}
