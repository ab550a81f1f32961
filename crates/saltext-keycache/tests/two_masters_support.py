"""Helpers of test_two_masters.py and test_etcd_masters.py: two real salt-masters,
one multi-master salt-minion.

Master A listens on 127.0.0.1, master B on 127.0.0.2 (the whole loopback range
is this machine's), on the same two port numbers, so that one minion with
``master: [127.0.0.1, 127.0.0.2]`` signs in to both. Each master has its own
``pki_dir`` and keycache store (``keys.cache_driver: keycache``); they share
one master key pair (classic multi-master: B's ``master_keys`` bank is seeded
with A's pair before B starts), which is also what makes keycache see them as
one cluster (it names a cluster by ``cluster.pub``, else ``master.pub``). The
masters have no channel between them: only ``keycache snapshot`` and
``keycache merge`` carry keys from one store to the other. Options per master
(``TwoMasters(options=...)``) make other setups of the same two masters: both
on one etcd, or a Salt cluster (test_etcd_masters.py).

Daemons, timeouts and process groups come from master_minion_support.py.

Run as a script, ``python two_masters_support.py copy-master-keys FROM TO``
copies the master's key pair from the ``master_keys`` bank of the master
config FROM to that of TO, through ``salt.cache.Cache`` with each config's
``keys.cache_driver``, under TO's master id (where Salt's MasterKeys looks).
``probe`` (and ``probe-go``, which fires once told to on stdin) is the
minion's request judged by both masters (:meth:`TwoMasters.probe`).
"""

import contextlib
import json
import pathlib
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import master_minion_support as mm  # noqa: E402  pylint: disable=wrong-import-position

HERE = pathlib.Path(__file__).resolve()
MINION_ID = "kc-2m-minion"

# Salt's MasterKeys logs this when it creates a key pair (salt/crypt.py)
GENERATING_LINE = "Generating key-pair"


def _bindable(host, port):
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_ports_on(hosts, count, tries=50):
    """``count`` TCP port numbers free on every one of ``hosts`` right now."""
    for _ in range(tries):
        ports = mm.free_ports(count)
        if all(_bindable(host, port) for host in hosts for port in ports):
            return ports
    raise AssertionError(f"found no {count} ports free on all of {hosts}")


class Master:
    """One salt-master: its config, daemon, log and clients.

    ``master_id``: its id (default ``kc-2m-<name>``); ``extra``: more master
    options (see :func:`mm.write_master_config`).
    """

    def __init__(self, root, name, interface, ports, keycache_bin, master_id=None, extra=None):
        self.name = name
        self.id = master_id or f"kc-2m-{name.lower()}"
        self.interface = interface
        self.pub_port, self.ret_port = ports
        self.keycache_bin = keycache_bin
        self.root = pathlib.Path(root)
        self.conf = self.root / "conf"
        self.pki = self.root / "pki"
        extra = dict(extra or {})
        # the key store and tree: cluster_pki_dir in a Salt cluster (what
        # validate_token reads there), else pki_dir
        self.store = pathlib.Path(extra["cluster_pki_dir"]) if extra.get("cluster_id") else self.pki
        self.log = self.root / "master.log"
        self.out = self.root / "master.out"
        self.sock_dir = self.root / "s"
        # the merge timer's bases and the snapshots the test keeps
        self.merge_dir = self.root / "merge"
        self.merge_dir.mkdir(parents=True)
        mm.write_master_config(self.root, self.id, interface, ports, "keycache", extra)
        self.daemon = mm.Daemon(
            f"salt-master {name}",
            [mm.salt_script("salt-master"), "-c", self.conf, "-l", "warning"],
            self.out,
        )

    def start(self, timeout=60):
        self.daemon.start()
        mm.wait_for(
            f"master {self.name}'s ports on {self.interface}",
            lambda: mm.port_open(self.pub_port, self.interface)
            and mm.port_open(self.ret_port, self.interface),
            timeout,
            alive=[self.daemon],
        )
        mm.wait_for(
            f"master {self.name}'s IPC sockets",
            lambda: any(self.sock_dir.glob("*.ipc")),
            timeout,
            alive=[self.daemon],
        )

    def stop(self):
        self.daemon.stop()
        mm.wait_for(
            f"master {self.name}'s ports to close",
            lambda: not mm.port_open(self.ret_port, self.interface)
            and not mm.port_open(self.pub_port, self.interface),
            30,
        )

    def log_text(self):
        return mm.log_text(self.log)

    def refusals(self):
        """How often validate_token refused the minion (its log line) so far."""
        return self.log_text().count(mm.REFUSED_LINE.format(id=MINION_ID))

    def pending_answers(self):
        """How often this master answered the minion's sign-in "pending" so far."""
        return self.log_text().count(f"Authentication failed from host {MINION_ID}, the key is in pending")

    def keycache(self, *args, timeout=30):
        return mm.run([self.keycache_bin, *args], timeout=timeout)

    def keycache_ok(self, *args):
        proc = self.keycache(*args)
        if proc.returncode != 0:
            raise AssertionError(
                f"master {self.name}: keycache {' '.join(map(str, args))} exited "
                f"{proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def listing(self):
        """``keycache list --json`` of the store: ``{state: sorted ids}``."""
        proc = self.keycache_ok("list", "--json", "-c", self.conf)
        return {state: sorted(ids) for state, ids in json.loads(proc.stdout).items()}

    def state_of(self, mid=MINION_ID):
        """The state (``minions``, ``minions_pre``, ...) holding ``mid``, or None."""
        found = [state for state, ids in self.listing().items() if mid in ids]
        assert len(found) <= 1, f"master {self.name}: {mid} in {found}"
        return found[0] if found else None

    def salt_key_list(self):
        return {state: sorted(ids) for state, ids in mm.salt_key_list(self.conf).items()}

    def accept_key_file(self, mid=MINION_ID):
        """The key in ``minions/<id>``, the file validate_token reads (stripped; None: absent)."""
        path = self.store / "minions" / mid
        return path.read_bytes().strip() if path.exists() else None

    def ping(self, timeout=4):
        """``salt <id> test.ping`` from this master: the answer (True) or None, and the run."""
        return mm.salt_ping(self.conf, MINION_ID, timeout)

    def wait_ping_true(self, alive, timeout=60):
        mm.wait_salt_ping_true(self.conf, MINION_ID, f" from master {self.name}", alive, timeout)

    # -- docs/install.md's merge timer ----------------------------------------------

    def base_of(self, peer):
        return self.merge_dir / f"from-{peer.name}.snap"

    def snapshot(self, path, seen_by):
        """``keycache snapshot -c <conf> --seen <peer's base> -o path`` (the timer's first half)."""
        self.keycache_ok(
            "snapshot", "-c", self.conf, "--seen", seen_by.base_of(self), "-o", path
        )
        return path

    def merge(self, path, peer):
        """``keycache merge -c <conf> path --base B --write-base B`` (its second half); the run."""
        base = self.base_of(peer)
        return self.keycache("merge", "-c", self.conf, path, "--base", base, "--write-base", base)


class TwoMasters:
    """Masters A (127.0.0.1) and B (127.0.0.2), one minion signed in to both.

    ``options(name, root, interface)``: more master options for master
    ``name`` ("A", "B") whose files are below ``root``, as a dict that may
    name ``id`` (the master's id).
    """

    def __init__(self, keycache_bin, options=None):
        # Unix socket paths are capped at 107 bytes: a short private base
        self.base = pathlib.Path(tempfile.mkdtemp(prefix="kc2m-"))
        self.keycache_bin = keycache_bin
        ports = free_ports_on(["127.0.0.1", "127.0.0.2"], 2)
        masters = []
        for name, interface in (("A", "127.0.0.1"), ("B", "127.0.0.2")):
            root = self.base / name.lower()
            extra = dict(options(name, root, interface)) if options else {}
            master_id = extra.pop("id", None)
            masters.append(Master(root, name, interface, ports, keycache_bin, master_id, extra))
        self.a, self.b = masters
        self.snapshots = 0

        self.minion_root = self.base / "n"
        self.minion_conf = self.minion_root / "conf"
        self.minion_pki = self.minion_root / "pki"
        self.minion_log = self.minion_root / "minion.log"
        # multi-master: one connection (and one sign-in) per master
        mm.write_minion_config(
            self.minion_root, MINION_ID, [self.a.interface, self.b.interface], ports
        )
        self.minion = mm.Daemon(
            "salt-minion",
            [mm.salt_script("salt-minion"), "-c", self.minion_conf, "-l", "warning"],
            self.minion_root / "minion.out",
        )

    @property
    def daemons(self):
        return [d for d in (self.a.daemon, self.b.daemon, self.minion) if d.proc is not None]

    def start_masters(self):
        """A generates the key pair; B starts with A's pair in its bank."""
        self.a.start()
        proc = mm.run(
            [sys.executable, HERE, "copy-master-keys", self.a.conf / "master", self.b.conf / "master"],
            timeout=90,
        )
        if proc.returncode != 0:
            raise AssertionError(f"copy-master-keys exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        self.b.start()

    def start_minion_pending(self):
        """Start the minion; once its key is pending on both masters, its public key (stripped)."""
        self.minion.start()
        mm.wait_for(
            "the minion's key to arrive pending on both masters",
            lambda: (self.a.state_of(), self.b.state_of()) == ("minions_pre", "minions_pre"),
            60,
            alive=self.daemons,
        )
        return (self.minion_pki / "minion.pub").read_bytes().strip()

    def probe(self, tag, wait=30):
        """Have the minion send ``tag`` to its masters; ``{name: (seen, refused)}`` per master.

        The running minion forwards a ``fire_master`` event of its local bus to
        every master it is signed in to, as a ``_minion_event`` AES request.
        The helper listens on both masters' buses (they share none) and reads
        their logs for validate_token's refusal line past their current end;
        it stops waiting 3 s after each master has either shown the event or
        logged the refusal.
        """
        args = [sys.executable, HERE, "probe", self.minion_conf / "minion", tag, str(wait)]
        for master in (self.a, self.b):
            offset = master.log.stat().st_size if master.log.exists() else 0
            args += [master.name, master.conf / "master", master.log, str(offset)]
        proc = mm.run(args, timeout=wait + 60)
        if proc.returncode != 0:
            raise AssertionError(f"probe helper exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["fired"], out
        return {name: (out["seen"][name], out["refused"][name]) for name in out["seen"]}

    def probe_after(self, tag, action, wait=10):
        """Have the minion send ``tag`` the moment ``action()`` returns.

        The helper listens on both masters' buses and reads their logs (as
        :meth:`probe`), says it is ready, and fires when told to, right after
        ``action()`` returned. ``{name: (seen, refused, refused_after)}``:
        ``refused_after`` is the time from ``action()``'s return to the moment
        the helper found that master's refusal line (None: not refused).
        """
        args = [sys.executable, HERE, "probe-go", self.minion_conf / "minion", tag, str(wait)]
        for master in (self.a, self.b):
            offset = master.log.stat().st_size if master.log.exists() else 0
            args += [master.name, master.conf / "master", master.log, str(offset)]
        with subprocess.Popen(  # pylint: disable=consider-using-with
            [str(a) for a in args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        ) as proc:

            def ready_line():
                if not select.select([proc.stdout], [], [], 0.2)[0]:
                    return None
                line = proc.stdout.readline()
                if not line:
                    raise AssertionError(f"probe helper exited {proc.wait()} before listening")
                return line

            try:
                ready = mm.wait_for("the probe helper to listen", ready_line, 90, interval=0)
                assert json.loads(ready) == {"ready": True}, ready
                action()
                done = time.monotonic()
                proc.stdin.write("go\n")
                proc.stdin.flush()
                out, _ = proc.communicate(timeout=wait + 60)
            finally:
                if proc.poll() is None:
                    proc.kill()
        if proc.returncode != 0:
            raise AssertionError(f"probe helper exited {proc.returncode}:\n{out}")
        out = json.loads(out.strip().splitlines()[-1])
        assert out["fired"], out
        result = {}
        for name in out["seen"]:
            at = out["refused_at"][name]
            result[name] = (out["seen"][name], out["refused"][name], None if at is None else at - done)
        return result

    def assert_serves(self, *masters, timeout=60):
        """Each of ``masters`` answers for the minion: ``salt <id> test.ping`` True."""
        for master in masters:
            master.wait_ping_true(self.daemons, timeout=timeout)

    def assert_probe(self, tag, expect):
        """The minion's own request: ``expect[name]`` True reaches that master's bus,
        False is refused by it (validate_token's log line, and never on its bus)."""
        result = self.probe(tag)
        for name, accepted in expect.items():
            seen, refused = result[name]
            if accepted:
                assert seen and not refused, f"master {name} did not take the minion's request: {result}"
            else:
                assert refused and not seen, f"master {name} did not refuse the minion's request: {result}"

    def assert_no_answer(self, *masters):
        """``salt <id> test.ping`` from each of ``masters`` gets no True answer."""
        for master in masters:
            answer, proc = master.ping(timeout=4)
            assert answer is not True, (
                f"master {master.name}: test.ping answered by a revoked minion:\n{proc.stdout}\n{proc.stderr}"
            )

    def pull(self, dst, src, keep=None):
        """docs/install.md's timer on ``dst`` pulling from ``src``: snapshot, then merge; the run.

        ``keep``: also keep the snapshot under that name (for replaying it later).
        """
        self.snapshots += 1
        path = dst.merge_dir / f"{src.name}-{self.snapshots}.snap"
        src.snapshot(path, seen_by=dst)
        if keep:
            shutil.copyfile(path, dst.merge_dir / keep)
        return dst.merge(path, src)

    def pull_ok(self, dst, src, keep=None):
        proc = self.pull(dst, src, keep=keep)
        if proc.returncode != 0:
            raise AssertionError(
                f"merge {src.name} -> {dst.name} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def stop_all(self):
        return mm.stop_daemons([self.minion, self.a.daemon, self.b.daemon])

    def cleanup(self):
        shutil.rmtree(self.base, ignore_errors=True)

    def diagnostics(self):
        return mm.diagnostics(
            [
                ("master A log", self.a.log),
                ("master A stdout/stderr", self.a.out),
                ("master B log", self.b.log),
                ("master B stdout/stderr", self.b.out),
                ("minion log", self.minion_log),
                ("minion stdout/stderr", self.minion_root / "minion.out"),
            ],
            80,
        )


# -- script mode ---------------------------------------------------------------


def _cmd_copy_master_keys(src_config, dst_config):
    import salt.cache  # pylint: disable=import-outside-toplevel
    import salt.config  # pylint: disable=import-outside-toplevel

    src = salt.config.master_config(src_config)
    dst = salt.config.master_config(dst_config)
    pathlib.Path(dst["pki_dir"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    src_cache = salt.cache.Cache(src, driver=src["keys.cache_driver"])
    dst_cache = salt.cache.Cache(dst, driver=dst["keys.cache_driver"])
    for ext in ("pem", "pub"):
        value = src_cache.fetch("master_keys", f"{src['id']}.{ext}")
        if not value:
            raise SystemExit(f"no {src['id']}.{ext} in {src['pki_dir']}'s master_keys bank")
        dst_cache.store("master_keys", f"{dst['id']}.{ext}", value)
    print(json.dumps({"copied": sorted(dst_cache.list("master_keys"))}))


def _cmd_probe_go(minion_config, tag, wait, *masters):
    """:func:`_cmd_probe`, firing once a line comes on stdin (after printing ``{"ready": true}``)."""
    _cmd_probe(minion_config, tag, wait, *masters, go=True)


def _cmd_probe(minion_config, tag, wait, *masters, go=False):
    import salt.config  # pylint: disable=import-outside-toplevel
    import salt.utils.event  # pylint: disable=import-outside-toplevel

    line = mm.REFUSED_LINE.format(id=MINION_ID).encode()
    watched = {}
    for i in range(0, len(masters), 4):
        name, config, log, offset = masters[i : i + 4]
        mopts = salt.config.master_config(config)
        listener = salt.utils.event.get_master_event(mopts, mopts["sock_dir"], listen=True)
        watched[name] = {"listener": listener, "log": log, "offset": int(offset)}
    nopts = salt.config.minion_config(minion_config)
    sender = salt.utils.event.get_event("minion", opts=nopts, listen=False)
    if go:
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
    # the running minion's handle_event: tag "fire_master" -> _fire_master_main,
    # on each of its connections: {"cmd": "_minion_event", "tok": ..., "id": ...}
    fired = sender.fire_event(
        {"data": {"probe": tag}, "tag": tag, "events": None, "pretag": None}, "fire_master"
    )
    seen = {name: False for name in watched}
    refused = {name: False for name in watched}
    refused_at = {name: None for name in watched}
    deadline = time.monotonic() + float(wait)
    settled_at = None
    while time.monotonic() < deadline:
        for name, w in watched.items():
            if not seen[name]:
                event = w["listener"].get_event(wait=0.05, tag=tag, full=True)
                if event and event.get("tag") == tag and event["data"].get("id") == MINION_ID:
                    seen[name] = True
            if not refused[name]:
                with open(w["log"], "rb") as fh:
                    fh.seek(w["offset"])
                    refused[name] = line in fh.read()
                if refused[name]:
                    refused_at[name] = time.monotonic()
        if settled_at is None and all(seen[n] or refused[n] for n in watched):
            settled_at = time.monotonic()
            # a late event or refusal line would show a master doing both
            deadline = min(deadline, settled_at + 3)
    for w in watched.values():
        w["listener"].destroy()
    sender.destroy()
    print(json.dumps({"fired": bool(fired), "seen": seen, "refused": refused, "refused_at": refused_at}))


if __name__ == "__main__":
    mm.script_main(
        {"copy-master-keys": _cmd_copy_master_keys, "probe": _cmd_probe, "probe-go": _cmd_probe_go},
        sys.argv[1:],
    )
