"""Helpers of test_master_minion.py: a real salt-master and salt-minion on 127.0.0.1.

Everything here is bounded in time: daemons run in the foreground in their own
process group (so the test owns their pids and every worker they fork), and
:meth:`Daemon.stop` terminates the whole group, then kills it after a timeout.

Run as a script (``python master_minion_support.py <command> ...``) this module
is also the small Salt client the test runs in a subprocess, away from the
pytest process (Salt's loader, event sockets and logging stay out of it):

``fire``
    Subscribe to the master's event bus, put a ``fire_master`` event on the
    minion's local bus (the running salt-minion forwards it to the master as an
    AES ``_minion_event`` request signed with its token) and report whether the
    event arrived on the master's bus within a deadline.
``master-keys``
    What the master's key cache driver holds in the ``master_keys`` bank,
    through ``salt.cache.Cache(opts, driver=opts["keys.cache_driver"])`` exactly
    as Salt's MasterKeys reads it.
"""

import contextlib
import getpass
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

VENV_BIN = pathlib.Path(sys.executable).parent
HERE = pathlib.Path(__file__).resolve()

MINION_ID = "kc-mm-minion"
MASTER_ID = "kc-mm"
# The line salt/channel/server.py ReqServerChannel.validate_token logs when an
# AES request of a minion comes with a token but pki_dir/minions/<id> cannot be
# read: the request is answered "bad load" and never reaches the master's
# handlers. This is the refusal the test looks for after `keycache delete`.
REFUSED_LINE = (
    "Salt minion claiming to be {id} attempted to communicate with master, "
    "but key could not be read and verification was denied"
)


# salt/minion.py logs this when it has signed in and subscribed to the master's
# publisher: at start-up and after re-tuning to a restarted master.
MINION_READY_LINE = "Minion is ready to receive requests!"


def salt_script(name):
    path = VENV_BIN / name
    if not os.access(path, os.X_OK):
        raise AssertionError(f"no {name} script at {path}")
    return str(path)


def free_ports(count):
    """``count`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def port_open(port, host="127.0.0.1"):
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def wait_for(what, predicate, timeout, interval=0.5, alive=()):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s.

    ``alive``: daemons that must keep running while we wait (fail fast if one died).
    """
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        for daemon in alive:
            daemon.assert_running()
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def run(cmd, timeout=60, check=False, env=None):
    """Run ``cmd`` with a timeout; return the CompletedProcess (text)."""
    proc = subprocess.run(
        [str(c) for c in cmd],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def last_json(text):
    """The JSON document a Salt CLI printed (`--out json` may print several, or noise first)."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    # salt --out json with --static off prints one document per minion
    start = text.rfind("\n{")
    if start >= 0:
        return json.loads(text[start + 1 :])
    raise ValueError(f"no JSON in output: {text!r}")


def salt_key_list(master_conf):
    """``salt-key -L --out json`` of the master whose config dir is ``master_conf``."""
    proc = run([salt_script("salt-key"), "-c", master_conf, "-L", "--out", "json"], timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"salt-key -L exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return last_json(proc.stdout)


def salt_ping(master_conf, minion_id, timeout):
    """``salt <id> test.ping`` from that master: the minion's answer (True) or None, and the run."""
    proc = run(
        [
            salt_script("salt"),
            "-c",
            master_conf,
            "-t",
            timeout,
            minion_id,
            "test.ping",
            "--out",
            "json",
            "--static",
        ],
        timeout=timeout + 60,
    )
    answer = None
    with contextlib.suppress(ValueError):
        data = last_json(proc.stdout)
        if isinstance(data, dict):
            answer = data.get(minion_id)
    return answer, proc


def wait_salt_ping_true(master_conf, minion_id, where, alive, timeout):
    """Wait for ``salt <id> test.ping`` from that master (``where``: " from master A") to
    answer True, naming every attempt when it does not."""
    seen = []

    def attempt():
        answer, proc = salt_ping(master_conf, minion_id, 4)
        seen.append((answer, proc.returncode, proc.stdout[-300:], proc.stderr[-300:]))
        return answer is True

    try:
        wait_for(
            f"`salt {minion_id} test.ping`{where} to answer True",
            attempt,
            timeout,
            interval=1,
            alive=alive,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nattempts (answer, rc, stdout, stderr): {seen}") from None


def tail(path, lines=80):
    try:
        data = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<{path}: {exc}>"
    return "\n".join(data[-lines:])


def log_text(path):
    """The text of a daemon's log so far ("" before the daemon has made it)."""
    try:
        return pathlib.Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def diagnostics(files, lines):
    """The last ``lines`` lines of each ``(title, path)`` of ``files``, for a failed test."""
    return "\n".join(f"----- {title} ({path}) -----\n{tail(path, lines)}" for title, path in files)


def stop_daemons(daemons):
    """SIGTERM every running one of ``daemons`` at once (each takes a few seconds to shut
    down), then stop() each: wait, and SIGKILL what is left. The errors, as text."""
    errors = []
    for daemon in daemons:
        if daemon.proc is not None:
            daemon._signal_group(signal.SIGTERM)  # pylint: disable=protected-access
    for daemon in daemons:
        try:
            daemon.stop()
        except Exception as exc:  # pylint: disable=broad-except
            errors.append(f"{daemon.name}: {exc!r}")
    return errors


class Daemon:
    """A Salt daemon run in the foreground, in a process group of its own."""

    def __init__(self, name, argv, out_path):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.out_path = pathlib.Path(out_path)
        self.proc = None

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} already running"
        out = open(self.out_path, "ab")  # pylint: disable=consider-using-with
        try:
            out.write(f"\n===== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            out.close()
        return self

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def assert_running(self):
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.proc.returncode}; its output:\n{tail(self.out_path)}"
            )

    def _signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _group_alive(self):
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self, timeout=20):
        """SIGTERM the whole process group, SIGKILL what is left after ``timeout`` s."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        # the leader may be gone while forked workers of its group linger
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self._group_alive() or self.proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            end = time.monotonic() + 10
            while self._group_alive() and time.monotonic() < end:
                time.sleep(0.2)
        if self._group_alive():
            raise AssertionError(f"{self.name}: process group {self.proc.pid} survived SIGKILL")
        self.proc = None


def _yaml(data):
    # JSON is YAML: no dependency on how PyYAML orders or quotes things
    return "\n".join(f"{key}: {json.dumps(value)}" for key, value in data.items()) + "\n"


def _daemon_config(root, kind, daemon_id, ports):
    """What a salt-``kind`` (master or minion) config shares: its id, everything of it
    below ``root`` (the root and ``conf`` are made), the running user, quiet logs."""
    root = pathlib.Path(root)
    pub_port, _ = ports
    (root / "conf").mkdir(parents=True)
    os.chmod(root, 0o700)
    return {
        "id": daemon_id,
        "root_dir": str(root),
        "conf_file": str(root / "conf" / kind),
        "pki_dir": str(root / "pki"),
        "cachedir": str(root / "cache"),
        "sock_dir": str(root / "s"),
        "pidfile": str(root / f"{kind}.pid"),
        "log_file": str(root / f"{kind}.log"),
        "log_level": "warning",
        "log_level_logfile": "info",
        "publish_port": pub_port,
        "user": getpass.getuser(),
        "enable_gpu_grains": False,
    }


def write_master_config(root, master_id, interface, ports, driver, extra=None):
    """A salt-master's config in ``root/conf/master``, everything of it below ``root``
    (``pki``, ``cache``, ``s``, ``master.log``, ``srv``), listening on ``interface`` at
    ``ports`` (publish, ret), keys in ``driver``; ``extra``: more options (JSON-able),
    over those."""
    root = pathlib.Path(root)
    config = _daemon_config(root, "master", master_id, ports)
    config.update(
        {
            "key_logfile": str(root / "key.log"),
            "interface": interface,
            "ret_port": ports[1],
            "worker_threads": 2,
            # the salt CLI's find_job wait after -t runs out (default 10 s)
            "gather_job_timeout": 2,
            "auto_accept": False,
            "open_mode": False,
            "keys.cache_driver": driver,
            "mmap_key_size": 1009,
            "file_roots": {"base": [str(root / "srv" / "salt")]},
            "pillar_roots": {"base": [str(root / "srv" / "pillar")]},
            "fileserver_backend": ["roots"],
        }
    )
    config.update(extra or {})
    (root / "conf" / "master").write_text(_yaml(config))
    (root / "srv" / "salt").mkdir(parents=True)
    (root / "srv" / "pillar").mkdir(parents=True)


def write_minion_config(root, minion_id, master, ports):
    """A salt-minion's config in ``root/conf/minion``, everything of it below ``root``
    (``pki``, ``cache``, ``s``, ``minion.log``), signing in to ``master`` (one address or a
    list: multi-master) at ``ports`` (publish, ret)."""
    root = pathlib.Path(root)
    config = _daemon_config(root, "minion", minion_id, ports)
    config.update(
        {
            "master": master,
            "master_port": ports[1],
            "acceptance_wait_time": 1,
            "acceptance_wait_time_max": 2,
            "random_reauth_delay": 0,
            "auth_timeout": 10,
            "multiprocessing": False,
            "grains_cache": True,
            "file_client": "remote",
        }
    )
    (root / "conf" / "minion").write_text(_yaml(config))


def require_keycache_driver():
    """Fail the test when the keycache driver is not importable in this interpreter."""
    import pytest  # pylint: disable=import-outside-toplevel

    proc = subprocess.run(
        [sys.executable, "-c", "import saltext.keycache._native, saltext.keycache.cache.keycache"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"the keycache driver is not importable in {sys.executable}:\n{proc.stderr}")


@contextlib.contextmanager
def stopped_after(setup):
    """Yield ``setup`` (a SaltPair or TwoMasters); then stop its daemons, remove what it
    made, and fail if a daemon would not stop."""
    try:
        yield setup
    finally:
        errors = setup.stop_all()
        setup.cleanup()
        assert not errors, f"stopping the daemons: {errors}"


def script_main(commands, argv):
    """Script mode: run ``commands[argv[0]](*argv[1:])``."""
    cmd, *args = argv
    if cmd not in commands:
        raise SystemExit(f"unknown command {cmd}")
    commands[cmd](*args)


class SaltPair:
    """Configs, daemons and client commands of one master and one minion."""

    def __init__(self, base, driver, keycache_bin, extra=None):
        """``extra``: more master options (see ``write_master_config``)."""
        base = pathlib.Path(base)
        self._short = None
        # Unix socket paths are capped at 107 bytes; the longest is
        # <base>/n/s/minion_event_<10 hex>_pull.ipc (base + 37). Salt prepends
        # root_dir to every absolute path outside it, so a long base moves
        # everything to a short private dir (removed by cleanup()).
        if len(str(base)) + 37 > 100:
            self._short = pathlib.Path(tempfile.mkdtemp(prefix="kcmm-"))
            base = self._short
        self.base = base
        self.driver = driver
        self.keycache_bin = keycache_bin
        self.pub_port, self.ret_port = free_ports(2)

        self.master_root = base / "m"
        self.master_conf = self.master_root / "conf"
        self.master_pki = self.master_root / "pki"
        self.master_log = self.master_root / "master.log"
        self.master_out = self.master_root / "master.out"
        self.minion_root = base / "n"
        self.minion_conf = self.minion_root / "conf"
        self.minion_pki = self.minion_root / "pki"
        self.minion_log = self.minion_root / "minion.log"
        self.minion_out = self.minion_root / "minion.out"
        write_master_config(
            self.master_root, MASTER_ID, "127.0.0.1", (self.pub_port, self.ret_port), driver, extra
        )
        write_minion_config(self.minion_root, MINION_ID, "127.0.0.1", (self.pub_port, self.ret_port))

        self.master = Daemon(
            "salt-master",
            [salt_script("salt-master"), "-c", self.master_conf, "-l", "warning"],
            self.master_out,
        )
        self.minion = Daemon(
            "salt-minion",
            [salt_script("salt-minion"), "-c", self.minion_conf, "-l", "warning"],
            self.minion_out,
        )

    # -- daemons -----------------------------------------------------------

    def start_master(self, timeout=60):
        self.master.start()
        wait_for(
            "the master's publish and ret ports",
            lambda: port_open(self.pub_port) and port_open(self.ret_port),
            timeout,
            alive=[self.master],
        )
        # the request server answers only once its workers are up: wait for
        # the client-side socket of the publisher as well
        wait_for(
            "the master's IPC sockets",
            lambda: any(self.master_sock_dir.glob("*.ipc")),
            timeout,
            alive=[self.master],
        )

    @property
    def master_sock_dir(self):
        return self.master_root / "s"

    def start_minion(self):
        self.minion.start()

    def stop_all(self):
        return stop_daemons([self.minion, self.master])

    def cleanup(self):
        if self._short is not None:
            shutil.rmtree(self._short, ignore_errors=True)

    def diagnostics(self):
        return diagnostics(
            [
                ("master log", self.master_log),
                ("master stdout/stderr", self.master_out),
                ("minion log", self.minion_log),
                ("minion stdout/stderr", self.minion_out),
            ],
            120,
        )

    def minion_log_text(self):
        return log_text(self.minion_log)

    def minion_ready_count(self):
        """How often the minion logged that it (re)connected and is ready (salt/minion.py)."""
        return self.minion_log_text().count(MINION_READY_LINE)

    def master_log_text(self):
        return log_text(self.master_log)

    # -- clients ---------------------------------------------------------------

    def keycache(self, *args, timeout=30):
        """``keycache <args>`` with the master's config dir (store options)."""
        return run([self.keycache_bin, *args], timeout=timeout)

    def keycache_list(self, bank="keys"):
        proc = self.keycache(
            "list", "--json", "--bank", bank, "-c", self.master_conf, self.master_pki
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"keycache list --bank {bank} exited {proc.returncode}: {proc.stdout}{proc.stderr}"
            )
        return json.loads(proc.stdout)

    def salt_key_list(self):
        return salt_key_list(self.master_conf)

    def ping(self, timeout=10):
        """``salt <id> test.ping``: the minion's answer (True) or None, and the raw output."""
        return salt_ping(self.master_conf, MINION_ID, timeout)

    def wait_minion_ready(self, count_before, timeout=30):
        """Wait (at most ``timeout`` s, not an error) for the minion to log it is ready again.

        A test.ping published before the minion subscribed is lost and costs a
        whole -t timeout; this only saves time, wait_ping_true is the check.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.minion_ready_count() > count_before:
                return True
            self.minion.assert_running()
            time.sleep(0.5)
        return False

    def wait_ping_true(self, timeout=60):
        wait_salt_ping_true(self.master_conf, MINION_ID, "", [self.master, self.minion], timeout)

    def helper(self, *args, timeout=90):
        """Run this module as a script (a Salt client in its own process)."""
        proc = run([sys.executable, HERE, *args], timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(
                f"helper {args[0]} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def fire_from_minion(self, tag, wait=15, until_logged=None, log_offset=0, grace=3):
        """Have the running minion send ``tag`` to the master; did it reach the master's bus?

        ``until_logged``: stop waiting ``grace`` s after this line shows up in the
        master log past ``log_offset`` (the refusal: the event cannot come any more).
        """
        args = ["fire", self.master_conf / "master", self.minion_conf / "minion", tag, str(wait)]
        if until_logged:
            args += [self.master_log, str(log_offset), until_logged, str(grace)]
        return self.helper(*args, timeout=wait + 60)

    def master_keys(self):
        """``{name: value}`` of the master_keys bank of the master's driver (public keys only)."""
        return self.helper("master-keys", self.master_conf / "master")


# -- script mode ---------------------------------------------------------------


def _cmd_fire(master_config, minion_config, tag, wait, log=None, offset=0, line=None, grace=3):
    import salt.config  # pylint: disable=import-outside-toplevel
    import salt.utils.event  # pylint: disable=import-outside-toplevel

    mopts = salt.config.master_config(master_config)
    nopts = salt.config.minion_config(minion_config)
    listener = salt.utils.event.get_master_event(mopts, mopts["sock_dir"], listen=True)
    sender = salt.utils.event.get_event("minion", opts=nopts, listen=False)
    # the running minion's handle_event: tag "fire_master" -> _fire_master_main
    # (data["data"], data["tag"], data["events"], data["pretag"]) -> an AES
    # request {"cmd": "_minion_event", "tok": ..., "id": ...} to the master
    fired = sender.fire_event(
        {"data": {"probe": tag}, "tag": tag, "events": None, "pretag": None}, "fire_master"
    )
    deadline = time.monotonic() + float(wait)
    seen = None
    logged = False
    while time.monotonic() < deadline:
        event = listener.get_event(wait=1, tag=tag, full=True)
        if event and event.get("tag") == tag:
            seen = event.get("data")
            break
        if line and not logged:
            with open(log, "rb") as fh:
                fh.seek(int(offset))
                if line.encode() in fh.read():
                    logged = True
                    deadline = min(deadline, time.monotonic() + float(grace))
    listener.destroy()
    sender.destroy()
    print(
        json.dumps(
            {"fired": bool(fired), "seen": seen is not None, "data": seen, "logged": logged},
            default=str,
        )
    )


def _cmd_master_keys(master_config):
    import salt.cache  # pylint: disable=import-outside-toplevel
    import salt.config  # pylint: disable=import-outside-toplevel

    opts = salt.config.master_config(master_config)
    cache = salt.cache.Cache(opts, driver=opts["keys.cache_driver"])
    names = sorted(cache.list("master_keys"))
    out = {"driver": opts["keys.cache_driver"], "names": names, "pub": {}}
    for name in names:
        if name.endswith(".pub"):
            out["pub"][name] = cache.fetch("master_keys", name)
    print(json.dumps(out))


if __name__ == "__main__":
    script_main({"fire": _cmd_fire, "master-keys": _cmd_master_keys}, sys.argv[1:])
