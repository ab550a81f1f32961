"""``salt-run keycache.*``: the runner functions, run by the real ``salt-run``.

Each test runs this venv's ``salt-run -c CONF`` (runners run in the
``salt-run`` process; no master is running) on a master config of its own
under ``tmp_path``. The runners call the library through the driver's
native module, on the opts Salt hands them: no ``keycache`` binary is run,
and the directory of ``KEYCACHE_BIN`` (the command the tests use to make
and inspect stores) is kept off salt-run's PATH.
With ``keycache_etcd``, status and diff are checked against a real etcd
member (``etcd_support.Etcd``), seeded by ``keycache etcd seed``.
"""

import base64
import getpass
import importlib.util
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from cli_support import run_keycache  # noqa: E402  pylint: disable=wrong-import-position
from master_minion_support import last_json  # noqa: E402  pylint: disable=wrong-import-position

VENV_BIN = pathlib.Path(sys.executable).parent
TIMEOUT = 120

# The tree of every test: ids per state directory (a1 is also denied).
TREE = {
    "minions": ["a1", "a2", "web-01.example.com", "ünï-03"],
    "minions_pre": ["p1", "p2"],
    "minions_rejected": ["r1"],
    "minions_denied": ["a1", "d9"],
}
# pki.migrate_to_mmap's counts of the tree with the junk of make_master: a2
# is pending too, and the later state directory wins, as in Salt's
# rebuild_from_localfs.
COUNTS = {"Accepted": 3, "Pending": 3, "Rejected": 1, "Denied": 2}


def pem(tag, kind="PUBLIC KEY", n=270):
    body = base64.b64encode(random.Random(tag).randbytes(n)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {kind}-----\n{lines}\n-----END {kind}-----\n"


def write_config(root, extra=None):
    """``root/conf/master``: everything of the master under ``root``."""
    config = {
        "id": "kc-run",
        "root_dir": str(root),
        "conf_file": str(root / "conf" / "master"),
        "pki_dir": str(root / "pki"),
        "cachedir": str(root / "cache"),
        "sock_dir": str(root / "s"),
        "pidfile": str(root / "master.pid"),
        "log_file": str(root / "master.log"),
        "key_logfile": str(root / "key.log"),
        "log_level_logfile": "debug",
        "user": getpass.getuser(),
        "keys.cache_driver": "keycache",
        "mmap_key_size": 1009,
    }
    config.update(extra or {})
    # JSON is YAML
    (root / "conf" / "master").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))


def make_master(root, junk=True, extra=None):
    """A master's config and ``localfs_key`` tree under ``root``: the keys of
    TREE, the master's key pair, and (``junk``) files migrate skips and a2's
    key in minions_pre too."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("conf", "cache/proc", "s"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    pki = root / "pki"
    for dirname, ids in TREE.items():
        (pki / dirname).mkdir(parents=True, exist_ok=True)
        for mid in ids:
            (pki / dirname / mid).write_text(pem(f"{dirname}/{mid}"))
    (pki / "master.pem").write_text(pem("master", "RSA PRIVATE KEY", 1190))
    (pki / "master.pub").write_text(pem("master.pub"))
    os.chmod(pki / "master.pem", 0o600)
    if junk:
        (pki / "minions" / ".hidden").write_text(pem("hidden"))
        (pki / "minions_pre" / "empty").write_text("")
        (pki / "minions_pre" / "a2").write_text(pem("minions_pre/a2"))
    write_config(root, extra)
    return root / "conf"


def run_env():
    """The environment of salt-run: PATH without the directory of KEYCACHE_BIN."""
    bindir = os.path.dirname(os.path.abspath(os.environ.get("KEYCACHE_BIN") or ""))
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and os.path.abspath(p) != bindir]
    return dict(os.environ, NO_COLOR="1", PATH=os.pathsep.join(rest))


def salt_run(conf, fun, *args, env=None):
    """``salt-run -c CONF FUN ARGS --out json``: (exit code, the returned value, the run)."""
    proc = subprocess.run(
        [str(VENV_BIN / "salt-run"), "-c", str(conf), fun, *args, "--out", "json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env or run_env(),
        check=False,
    )
    try:
        ret = last_json(proc.stdout)
    except ValueError:
        ret = None
    return proc.returncode, ret, proc


def cli(keycache_bin, *args, check=True):
    proc = run_keycache(keycache_bin, *args, timeout=TIMEOUT)
    if check and proc.returncode != 0:
        raise AssertionError(f"keycache {' '.join(args)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def migrate_text_counts(text):
    """{"Accepted": n, ...} of pki.migrate_to_mmap's lines in ``text``."""
    out = {}
    for line in text.splitlines()[1:5]:
        name, _, value = line.strip().partition(":")
        out[name] = int(value.strip().replace(",", ""))
    return out


def tree_snapshot(*roots):
    """Every entry under ``roots`` (the roots included): path -> (mode, size, mtime_ns)."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [""] + dirnames + filenames:
                path = os.path.join(dirpath, name) if name else dirpath
                st = os.lstat(path)
                out[path] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def test_migrate_makes_the_store_keycache_migrate_makes(tmp_path, keycache_bin):
    conf_a = make_master(tmp_path / "a")
    conf_b = make_master(tmp_path / "b")

    code, ret, proc = salt_run(conf_a, "keycache.migrate")
    cli(keycache_bin, "migrate", "-c", str(conf_b))

    assert code == 0, proc.stdout + proc.stderr
    lines = ret.splitlines()
    assert lines[0] == "PKI keys migrated to mmap_key backend successfully.", ret
    assert migrate_text_counts(ret) == COUNTS, ret
    assert lines[5] == f"  Total:    {sum(COUNTS.values())}", ret
    assert "    written:   kc-run.pem, kc-run.pub, master.pem, master.pub" in lines, ret
    assert "  Duplicate: a2 (found accepted, pending): pending" in lines, ret
    assert "  Skipped:  2" in lines, ret
    assert any(line.endswith("/minions/.hidden: dot_file") or "/minions/.hidden: dot_file (" in line for line in lines)
    assert any("/minions_pre/empty: empty" in line for line in lines), ret
    for args in (["--include-pub"], ["--bank", "master_keys"]):
        got = [json.loads(cli(keycache_bin, "list", "-c", str(c), "--json", *args).stdout) for c in (conf_a, conf_b)]
        assert got[0] == got[1]
    assert got[0]["master_keys"] == ["kc-run.pem", "kc-run.pub", "master.pem", "master.pub"]
    # The two stores hold the same entries, keys included (exit 0: same).
    cli(keycache_bin, "diff", "-c", str(conf_a), str(tmp_path / "a" / "pki"), str(tmp_path / "b" / "pki"))
    # The master's own key pair went in byte for byte.
    import salt.cache  # pylint: disable=import-outside-toplevel
    import salt.config  # pylint: disable=import-outside-toplevel

    opts = salt.config.master_config(str(conf_a / "master"))
    cache = salt.cache.Cache(opts, driver="mmap_key")
    assert cache.fetch("master_keys", "kc-run.pem") == (tmp_path / "a" / "pki" / "master.pem").read_text()
    assert cache.fetch("master_keys", "master.pub") == (tmp_path / "a" / "pki" / "master.pub").read_text()


def test_migrate_dry_run_writes_nothing(tmp_path, keycache_bin):
    conf = make_master(tmp_path / "m")
    pki = tmp_path / "m" / "pki"
    before = tree_snapshot(pki, conf)

    code, ret, proc = salt_run(conf, "keycache.migrate", "dry_run=True")

    assert code == 0, proc.stdout + proc.stderr
    assert tree_snapshot(pki, conf) == before
    lines = ret.splitlines()
    assert lines[0] == "PKI migration dry-run (no changes written):", ret
    assert migrate_text_counts(ret) == COUNTS, ret
    assert "    written:   kc-run.pem, kc-run.pub, master.pem, master.pub" in lines, ret
    # What it said is what the migration does.
    code, real, proc = salt_run(conf, "keycache.migrate")
    assert code == 0, proc.stdout + proc.stderr
    said = [line.replace("would hold", "holds").replace("  Would remove: ", "  Removed: ") for line in lines[1:]]
    assert real.splitlines()[1:] == said


def test_verify_clean_then_damaged(tmp_path, keycache_bin):
    conf = make_master(tmp_path / "m", junk=False)
    pki = tmp_path / "m" / "pki"
    cli(keycache_bin, "migrate", "-c", str(conf))

    code, ret, proc = salt_run(conf, "keycache.verify")
    assert code == 0, proc.stdout + proc.stderr
    assert ret["result"] is True and ret["findings"] == [] and "retcode" not in ret, ret

    # One byte of web-01's key in the heap: its record's checksum fails.
    heap = pki / ".mmap_keys.idx.heap"
    data = bytearray(heap.read_bytes())
    key = pem("minions/web-01.example.com").encode()
    at = data.find(key)
    assert at >= 0
    at += len("-----BEGIN PUBLIC KEY-----\n") + 5
    data[at] = ord("A") if data[at] != ord("A") else ord("B")
    heap.write_bytes(bytes(data))

    code, ret, proc = salt_run(conf, "keycache.verify")
    assert code == 1, proc.stdout + proc.stderr
    assert ret["result"] is False and ret["retcode"] == 1, ret
    assert [(f["bank"], f["finding"]["id"]) for f in ret["findings"]] == [("keys", "web-01.example.com")], ret
    assert "fails its xxh3 checksum" in ret["findings"][0]["finding"]["what"], ret


def test_the_install_check_of_the_docs_lists_the_runners(tmp_path):
    # docs/install.md: `sys.list_runner_functions keycache` (an execution
    # function: salt-call, not salt-run, which has no `sys` runner) says the
    # extension is installed and which functions it brings; `salt-run -d
    # keycache` shows their documentation.
    conf = make_master(tmp_path / "m", junk=False)
    proc = subprocess.run(
        [str(VENV_BIN / "salt-call"), "--local", "-c", str(conf), "sys.list_runner_functions", "keycache",
         "--out", "json"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT, env=run_env(), check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert last_json(proc.stdout)["local"] == [
        "keycache.diff", "keycache.history", "keycache.migrate", "keycache.status", "keycache.verify"
    ], proc.stdout
    proc = subprocess.run(
        [str(VENV_BIN / "salt-run"), "-c", str(conf), "-d", "keycache"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT, env=run_env(), check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "keycache.verify:" in proc.stdout and "repair=True" in proc.stdout, proc.stdout


def test_verify_repair_mends_the_key_tree(tmp_path, keycache_bin):
    # The driver's advice for a tree out of step names this runner: a wheel's
    # user may have no `keycache` on PATH.
    conf = make_master(tmp_path / "m", junk=False)
    pki = tmp_path / "m" / "pki"
    cli(keycache_bin, "migrate", "-c", str(conf))
    (pki / "minions" / "a1").unlink()  # an accepted key's file gone from the tree

    code, ret, proc = salt_run(conf, "keycache.verify")
    assert code == 1 and ret["result"] is False, proc.stdout + proc.stderr
    code, ret, proc = salt_run(conf, "keycache.verify", "repair=True")
    assert code == 0, proc.stdout + proc.stderr
    assert ret["result"] is True and "retcode" not in ret, ret
    assert (pki / "minions" / "a1").read_text() == pem("minions/a1")
    code, ret, proc = salt_run(conf, "keycache.verify")
    assert code == 0 and ret["result"] is True, proc.stdout + proc.stderr


def test_status_counts(tmp_path, keycache_bin):
    conf = make_master(tmp_path / "m")
    cli(keycache_bin, "migrate", "-c", str(conf))

    code, ret, proc = salt_run(conf, "keycache.status")

    assert code == 0, proc.stdout + proc.stderr
    assert ret["counts"] == {"accepted": 3, "pending": 3, "rejected": 1, "denied": 2}, ret
    assert ret["params"]["size"] == 1009, ret
    assert ret["result"] is True and "retcode" not in ret, ret


def test_diff_needs_etcd_or_another_store(tmp_path, keycache_bin):
    conf = make_master(tmp_path / "m")
    pki = tmp_path / "m" / "pki"
    cli(keycache_bin, "migrate", "-c", str(conf))

    code, ret, proc = salt_run(conf, "keycache.diff")
    assert code == 1, proc.stdout + proc.stderr
    assert "keycache_etcd" in ret["error"] and "other=" in ret["error"], ret

    peer = tmp_path / "peer"
    shutil.copytree(pki, peer, symlinks=True)
    code, ret, proc = salt_run(conf, "keycache.diff", f"other={peer}")
    assert code == 0, proc.stdout + proc.stderr
    assert ret["same"] is True and ret["result"] is True, ret

    cli(keycache_bin, "accept", str(peer), "p1", "--size", "1009")
    code, ret, proc = salt_run(conf, "keycache.diff", f"other={peer}")
    assert code == 1, proc.stdout + proc.stderr
    assert ret["same"] is False and ret["retcode"] == 1, ret
    assert [(d["id"], d["state_a"], d["state_b"]) for d in ret["differ"]] == [("p1", "pending", "accepted")], ret


def test_an_error_of_the_command_is_the_runners(tmp_path, keycache_bin):
    conf = make_master(tmp_path / "m")
    cli(keycache_bin, "migrate", "-c", str(conf))
    # A layout that does not fit the files: the command refuses (exit 2).
    write_config(tmp_path / "m", {"mmap_key_size": 2003})

    code, ret, proc = salt_run(conf, "keycache.status")

    assert code == 1, proc.stdout + proc.stderr
    assert ret["retcode"] == 1, ret
    assert ret["error"].startswith("keycache.status: "), ret
    assert "1009" in ret["error"], ret
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr


def test_the_runners_run_no_keycache_binary(tmp_path, monkeypatch):
    """A source install carries no binary: the runners call the library
    in-process. Here, in this process, with PATH emptied, no bin directory
    beside the package and every way to start a process refused, each
    runner function still does its job."""
    import salt.config  # pylint: disable=import-outside-toplevel
    import saltext.keycache  # pylint: disable=import-outside-toplevel

    conf = make_master(tmp_path / "m", junk=False)
    pki = tmp_path / "m" / "pki"
    # The runner module alone, as a source install puts it: no bin/ beside.
    runners = tmp_path / "src" / "saltext" / "keycache" / "runners"
    shutil.copytree(pathlib.Path(saltext.keycache.__file__).parent / "runners", runners)
    spec = importlib.util.spec_from_file_location("keycache_runner_copy", runners / "keycache.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    runner.__opts__ = salt.config.master_config(str(conf / "master"))
    runner.__context__ = {}

    def refused(*args, **kwargs):
        raise AssertionError(f"a process was started: {args} {kwargs}")

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    for name in ("Popen", "run", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, refused)
    monkeypatch.setattr(os, "posix_spawn", refused)
    monkeypatch.setattr(os, "execv", refused)

    ret = runner.migrate(dry_run=True)
    assert ret.splitlines()[0] == "PKI migration dry-run (no changes written):", ret
    ret = runner.migrate()
    assert migrate_text_counts(ret) == {"Accepted": 4, "Pending": 2, "Rejected": 1, "Denied": 2}, ret
    assert "    written:   kc-run.pem, kc-run.pub, master.pem, master.pub" in ret.splitlines(), ret
    ret = runner.status()
    assert ret["counts"] == {"accepted": 4, "pending": 2, "rejected": 1, "denied": 2}, ret
    assert ret["result"] is True and "retcode" not in ret and "keycache_bin" not in ret, ret
    ret = runner.verify()
    assert ret["result"] is True and ret["findings"] == [], ret
    (pki / "minions" / "a1").unlink()
    ret = runner.verify()
    assert ret["result"] is False and ret["retcode"] == 1 and runner.__context__["retcode"] == 1, ret
    runner.__context__.clear()
    ret = runner.verify(repair=True)
    assert ret["result"] is True and "retcode" not in ret, ret
    assert (pki / "minions" / "a1").read_text() == pem("minions/a1")
    peer = tmp_path / "peer"
    shutil.copytree(pki, peer, symlinks=True)
    ret = runner.diff(other=str(peer))
    assert ret["same"] is True and ret["result"] is True, ret
    ret = runner.history("a1")
    assert isinstance(ret, list) and all(r["id"] == "a1" for r in ret), ret
    assert "PRIVATE KEY" not in json.dumps(runner.status()) + json.dumps(runner.verify())


def test_etcd_status_and_diff(tmp_path, keycache_bin, etcd):
    """With keycache_etcd: status is `keycache etcd status` (stale without a
    replicator: a failure), diff is `keycache etcd diff`."""
    conf = make_master(tmp_path / "m", junk=False, extra={"keycache_etcd": {"endpoints": [etcd.endpoint]}})
    cli(keycache_bin, "migrate", "-c", str(conf))
    cli(keycache_bin, "etcd", "seed", "-c", str(conf))

    code, ret, proc = salt_run(conf, "keycache.diff")
    assert code == 0, proc.stdout + proc.stderr
    assert ret["same"] is True and ret["differences"] == [] and ret["result"] is True, ret
    assert ret["prefix"] == "/keycache/default/", ret

    code, ret, proc = salt_run(conf, "keycache.status")
    assert code == 1, proc.stdout + proc.stderr
    assert ret["stale"] is True and ret["replica_revision"] == 0 and ret["retcode"] == 1, ret
    assert ret["etcd_keys"] == 9, ret

    # etcd now holds the tree without p1.
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "m" / "pki", other, ignore=shutil.ignore_patterns(".mmap*", "master.p*"))
    (other / "minions_pre" / "p1").unlink()
    cli(keycache_bin, "etcd", "seed", "-c", str(conf), "--from", str(other), "--replace")
    code, ret, proc = salt_run(conf, "keycache.diff")
    assert code == 1, proc.stdout + proc.stderr
    assert ret["same"] is False and ret["retcode"] == 1, ret
    assert [(d["bank"], d["id"], d["store"], d["etcd"]) for d in ret["differences"]] == [
        ("keys", "p1", "pending", None)
    ], ret


def test_a_refused_migration_writes_nothing_and_says_why(tmp_path, keycache_bin):
    conf = make_master(tmp_path / "m")
    pki = tmp_path / "m" / "pki"
    long_id = "x" * 65  # mmap_key_id_size is 64
    (pki / "minions" / long_id).write_text(pem("long"))
    before = tree_snapshot(pki)

    code, ret, proc = salt_run(conf, "keycache.migrate")

    assert code == 1, proc.stdout + proc.stderr
    assert ret["retcode"] == 1, ret
    assert ret["error"].startswith("keycache.migrate: "), ret
    assert long_id in ret["error"], ret
    assert tree_snapshot(pki) == before
