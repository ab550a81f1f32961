"""The audit trail against the real Salt 3008.5: who changed which key, when,
from what to what, and why, as every keycache writer records it.

1. With etcd (``keycache_etcd``): two real salt-masters A and B
   (two_masters_support.py), each with its store, its replicator (the
   ``keycache`` engine under the master's process manager) and its own
   ``id``; a real salt-minion signs in to A alone (Salt's own sign-in: A's
   request server stores the pending key through the driver, through etcd);
   ``keycache accept -c A ID --reason CHG-1``; ``salt-key -d ID -y`` on B
   (Salt's Key class, through B's driver, through etcd). B's trail
   (``keycache history -c B ID --json``) holds the three records in order:
   sign-in, accept, delete, by programs salt-master, keycache, salt-key, for
   masters A, A, B, reasons null, CHG-1, null, each by the test's user and
   with the fingerprint Salt's own ``pem_finger`` gives of the key, at
   strictly increasing etcd revisions; A's trail is the same records (each
   master's replicator appends what it applies).
2. Without etcd: the same sequence on one master's store (local mode). The
   delete's record is made under the ``keys`` bank's lock: while the test
   holds that lock, ``salt-key -d`` waits, and neither its record nor its
   change is there; once released, both are. ``salt-run keycache.history``
   and the native call it makes return the same records as the CLI;
   ``since`` filters them, and a ``since`` that is no time is refused,
   naming it.
3. Fingerprints (``keycache accept --finger``), each result read back with
   Salt 3008.5's own ``mmap_key`` driver, the sign-ins made by Salt's own
   auth handler (``salt.master.AuthFuncs._auth``, set up as
   ``ReqServerChannel._auth`` sets it up) through the keycache driver: the
   right fingerprint accepts; a wrong one exits 2 and changes nothing; a
   key replaced after the operator looked at it (``keycache get --json``)
   is refused; ``keycache delete --state accepted`` keeps the id's denied
   key. Salt 3008.5 never overwrites a pending key on a sign-in with
   another key (its auth handler puts that key in ``denied_keys``, which is
   recorded as a ``deny``): a pending key is replaced when it was deleted
   and a sign-in with another key came after, which is the race tested.
"""

import asyncio
import base64
import fcntl
import hashlib
import json
import os
import pathlib
import pwd
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import etcd_support as es  # noqa: E402  pylint: disable=wrong-import-position
import master_minion_support as mm  # noqa: E402  pylint: disable=wrong-import-position
import two_masters_support as tm  # noqa: E402  pylint: disable=wrong-import-position
from cli_support import run_cli  # noqa: E402  pylint: disable=wrong-import-position

AUDIT_LOG = ".keycache-audit.log"
BANK_FILES = (".mmap_keys", ".mmap_denied")
FIELDS = [
    "time",
    "id",
    "action",
    "from",
    "to",
    "finger",
    "replaced_finger",
    "user",
    "sudo_user",
    "program",
    "master",
    "reason",
    "revision",
]


def _user():
    """The OS user the writers run as (the masters run as this test's user)."""
    return pwd.getpwuid(os.geteuid()).pw_name


def _sudo_user():
    return os.environ.get("SUDO_USER") or None


def _finger(pub):
    """Salt's own fingerprint of a key as the key cache holds it (what
    ``salt-key -f`` prints)."""
    import salt.utils.crypt  # pylint: disable=import-outside-toplevel

    if isinstance(pub, bytes):
        pub = pub.decode()
    return salt.utils.crypt.pem_finger(key=pub)


def _history(keycache_bin, *args):
    """``keycache history <args> --json``: its records (one JSON object a line)."""
    proc = mm.run([keycache_bin, "history", *args, "--json"], timeout=60)
    assert proc.returncode == 0, f"keycache history {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    for r in records:
        assert sorted(r) == sorted(FIELDS), r
    return records


def _native_history(store, mid=None, since=None):
    """What ``salt-run keycache.history`` returns, by the native call it makes."""
    from saltext.keycache import _native  # pylint: disable=import-outside-toplevel

    records, torn = _native.audit_history(str(store), id=mid, since=since)
    assert torn == 0
    return records


def _log_records(store):
    path = pathlib.Path(store) / AUDIT_LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _summary(records):
    return [
        (r["action"], r["from"], r["to"], r["program"], r["master"], r["reason"], r["user"], r["sudo_user"])
        for r in records
    ]


def _check_trail(records, mid, pub, masters, etcd_mode):
    """The three records of a sign-in (Salt's, on masters[0]), an accept
    (``keycache --reason CHG-1``, on masters[1]) and a delete (``salt-key``,
    on masters[2])."""
    user, sudo = _user(), _sudo_user()
    assert _summary(records) == [
        ("sign-in", None, "pending", "salt-master", masters[0], None, user, sudo),
        ("accept", "pending", "accepted", "keycache", masters[1], "CHG-1", user, sudo),
        ("delete", "accepted", None, "salt-key", masters[2], None, user, sudo),
    ], json.dumps(records, indent=1)
    finger = _finger(pub)
    for r in records:
        assert r["id"] == mid
        assert r["finger"] == finger, (r, finger)
        assert r["replaced_finger"] is None
    times = [r["time"] for r in records]
    assert times == sorted(times), times
    revisions = [r["revision"] for r in records]
    if etcd_mode:
        assert all(isinstance(v, int) for v in revisions), revisions
        assert revisions[0] < revisions[1] < revisions[2], revisions
    else:
        assert revisions == [None, None, None]


def _salt_key(conf, *args):
    proc = mm.run([mm.salt_script("salt-key"), "-c", conf, *args], timeout=60)
    assert proc.returncode == 0, f"salt-key {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _keycache_ok(keycache_bin, *args):
    proc = mm.run([keycache_bin, *args], timeout=60)
    what = " ".join(map(str, args))
    assert proc.returncode == 0, f"keycache {what} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


# ---------------------------------------------------------------------------
# 1. with etcd: two real masters
# ---------------------------------------------------------------------------


def _minion_signs_in_to_a_alone(pair):
    """The minion's config names master A alone: the sign-in is A's."""
    conf = pair.minion_conf / "minion"
    lines = conf.read_text().splitlines()
    lines = [f"master: {json.dumps(pair.a.interface)}" if line.startswith("master:") else line for line in lines]
    conf.write_text("\n".join(lines) + "\n")


def test_with_etcd_each_master_holds_the_clusters_trail(etcd, keycache_bin):
    mm.require_keycache_driver()
    prefix = "/kc-audit/"
    mid = tm.MINION_ID

    # Each master's engine serves its metrics (the driver takes the option
    # in the same mapping, and passes it over), on an address no master
    # port is on.
    ports = dict(zip("AB", mm.free_ports(2)))

    def options(name, _root, _interface):
        out = {"id": f"kc-audit-{name.lower()}"}
        out.update(es.master_options(etcd.endpoint, prefix))
        out["keycache_etcd"]["metrics"] = f"127.0.0.3:{ports[name]}"
        return out

    with mm.stopped_after(tm.TwoMasters(keycache_bin, options=options)) as pair:
        a, b = pair.a, pair.b
        try:
            _minion_signs_in_to_a_alone(pair)
            pair.start_masters()
            es.wait_replicas(pair, prefix)

            # a sign-in through Salt's own code, on A: pending on both through etcd
            pub = pair.start_minion_pending()
            pair.minion.stop()
            # accepted on A by the CLI, with a reason
            _keycache_ok(keycache_bin, "accept", "-c", a.conf, mid, "--reason", "CHG-1")
            assert (a.state_of(), b.state_of()) == ("minions", "minions") or mm.wait_for(
                "the accept on both masters",
                lambda: (a.state_of(), b.state_of()) == ("minions", "minions"),
                30,
            )
            # deleted on B by salt-key, through B's driver
            _salt_key(b.conf, "-d", mid, "-y")

            def both_have_three():
                got = [_history(keycache_bin, "-c", m.conf, mid) for m in (a, b)]
                return got if all(len(g) >= 3 for g in got) else None

            in_a, in_b = mm.wait_for("both masters' trails to hold the delete", both_have_three, 30)
            _check_trail(in_b, mid, pub, [a.id, a.id, b.id], etcd_mode=True)
            assert in_a == in_b
            # what salt-run keycache.history returns on A: the same
            assert _native_history(a.store, mid) == in_a
            # every master's log is the whole cluster's trail: nothing else in it
            assert _log_records(a.store) == _log_records(b.store) == in_a
            # B's engine, whose driver wrote with the metrics option set: ready
            # and current, and no key accepted any more
            def scrape():
                url = f"http://127.0.0.3:{ports['B']}/metrics"
                return urllib.request.urlopen(url, timeout=10).read().decode()

            metrics = scrape()
            assert "\nkeycache_replica_ready 1\n" in metrics, metrics
            assert "\nkeycache_replica_stale 0\n" in metrics, metrics
            # the key counts follow the replica within a second or so
            mm.wait_for(
                "B's metrics to count no accepted key",
                lambda: '\nkeycache_keys{state="accepted"} 0\n' in scrape(),
                10,
            )
            assert urllib.request.urlopen(f"http://127.0.0.3:{ports['B']}/readyz", timeout=10).status == 200
        except BaseException:
            print(pair.diagnostics())
            raise


# ---------------------------------------------------------------------------
# 2. without etcd: one master
# ---------------------------------------------------------------------------


def _salt_run(conf, *args):
    """``salt-run -c CONF ARGS --out json``: (exit code, the value, the run)."""
    proc = mm.run([mm.salt_script("salt-run"), "-c", conf, *args, "--out", "json"], timeout=120)
    try:
        value = mm.last_json(proc.stdout)
    except ValueError:
        value = None
    return proc.returncode, value, proc


@pytest.fixture
def pair(tmp_path, keycache_bin):
    mm.require_keycache_driver()
    with mm.stopped_after(mm.SaltPair(tmp_path, "keycache", keycache_bin)) as salt_pair:
        yield salt_pair


# pylint: disable-next=redefined-outer-name
def test_without_etcd_the_store_records_each_change_under_the_lock(pair, keycache_bin):
    mid, conf, pki = mm.MINION_ID, pair.master_conf, pair.master_pki
    try:
        pair.start_master()
        pair.start_minion()
        mm.wait_for(
            "the minion's key to arrive pending",
            lambda: pair.salt_key_list().get("minions_pre") == [mid],
            60,
            alive=[pair.master, pair.minion],
        )
        pair.minion.stop()
        pub = (pair.minion_pki / "minion.pub").read_text().strip()
        _keycache_ok(keycache_bin, "accept", "-c", conf, mid, "--reason", "CHG-1")
        assert len(_log_records(pki)) == 2

        # salt-key -d while the test holds the keys bank's lock: it waits,
        # with no record and no change made; released, both are there
        lock_path = pki / ".mmap_keys.idx.lock"
        with open(lock_path, "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with subprocess.Popen(  # pylint: disable=consider-using-with
                    [mm.salt_script("salt-key"), "-c", str(conf), "-d", mid, "-y"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ) as proc:
                    try:
                        time.sleep(3)
                        assert proc.poll() is None, f"salt-key did not wait for the lock: {proc.stdout.read()}"
                        assert len(_log_records(pki)) == 2, _log_records(pki)
                        assert pair.keycache_list()["minions"] == [mid]
                    finally:
                        fcntl.flock(lock, fcntl.LOCK_UN)
                    out, _ = proc.communicate(timeout=60)
                    assert proc.returncode == 0, out
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        assert pair.keycache_list()["minions"] == []

        records = _history(keycache_bin, "-c", conf, mid)
        _check_trail(records, mid, pub, [mm.MASTER_ID] * 3, etcd_mode=False)
        assert _log_records(pki) == records
        assert _native_history(pki, mid) == records
        assert _native_history(pki, "another-id") == []

        code, value, proc = _salt_run(conf, "keycache.history", mid)
        assert code == 0 and value == records, proc.stdout + proc.stderr
        code, value, proc = _salt_run(conf, "keycache.history", f"id={mid}", f"since={records[1]['time']}")
        assert code == 0 and value == records[1:], proc.stdout + proc.stderr
        code, value, proc = _salt_run(conf, "keycache.history", "since=2000-01-01")
        assert code == 0 and value == records, proc.stdout + proc.stderr
        # SaltInvocationError: Salt prints "Passed invalid arguments", the reason, the usage
        code, value, proc = _salt_run(conf, "keycache.history", "since=yesterday")
        assert isinstance(value, str) and "Passed invalid arguments" in value, proc.stdout + proc.stderr
        assert 'since "yesterday" is not a time' in value, value
    except BaseException:
        print(pair.diagnostics())
        raise


# ---------------------------------------------------------------------------
# 3. fingerprints, read back with Salt's own mmap_key
# ---------------------------------------------------------------------------


class _Events:
    """The master event bus of the auth handler: what it fires, kept."""

    def __init__(self):
        self.fired = []

    def fire_event(self, data, tag):
        self.fired.append((tag, data))
        return True

    async def fire_event_async(self, data, tag):
        return self.fire_event(data, tag)


def salt_sign_in(opts, mid, pub):
    """A minion's sign-in (``_auth``) as Salt 3008.5's request server handles
    it: ``salt.master.AuthFuncs._auth``, its state set as
    ``ReqServerChannel._auth`` sets it, the key cache
    ``salt.cache.Cache(opts, driver=opts["keys.cache_driver"])``. Returns the
    answer's ``ret`` (True: pending; False: refused) and the events fired."""
    import salt.cache  # pylint: disable=import-outside-toplevel
    import salt.daemons.masterapi  # pylint: disable=import-outside-toplevel
    import salt.master  # pylint: disable=import-outside-toplevel

    af = salt.master.AuthFuncs.__new__(salt.master.AuthFuncs)
    af.opts = opts
    af.cache = salt.cache.Cache(opts, driver=opts["keys.cache_driver"])
    af.event = _Events()
    af.master_key = None
    af.sessions = {}
    af._sessions_lock = threading.Lock()  # pylint: disable=protected-access
    af.auto_key = salt.daemons.masterapi.AutoKey(opts)
    af.cache_cli = False
    af.ckminions = None
    load = {"cmd": "_auth", "id": mid, "pub": pub, "nonce": "0" * 32}
    ret = asyncio.run(af._auth(load))  # pylint: disable=protected-access
    return ret["load"]["ret"], af.event.fired


def _mmap_key_read(opts, mid):
    """What Salt 3008.5's own mmap_key driver reads of ``mid`` now, in a
    process of its own: (keys entry, denied_keys entry)."""
    code = (
        "import json, sys, salt.cache\n"
        "opts = json.loads(sys.argv[1])\n"
        "import salt.config\n"
        "o = salt.config.master_config(None); o.update(opts)\n"
        "c = salt.cache.Cache(o, driver='mmap_key')\n"
        "print(json.dumps([c.fetch('keys', sys.argv[2]), c.fetch('denied_keys', sys.argv[2])]))\n"
    )
    keep = {k: opts[k] for k in ("pki_dir", "cachedir", "mmap_key_size", "mmap_key_slot_size", "mmap_key_id_size")}
    keep.update({"keys.cache_driver": "mmap_key", "cluster_id": None})
    proc = mm.run([sys.executable, "-c", code, json.dumps(keep), mid], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    key, denied = json.loads(proc.stdout.strip().splitlines()[-1])
    return key, denied


def _bank_bytes(pki):
    """The bytes of every bank file (index, heap, roster) of ``pki``."""
    out = {}
    for path in sorted(pathlib.Path(pki).iterdir()):
        if path.name.startswith(BANK_FILES) and not path.name.endswith(".lock"):
            out[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _new_key():
    import salt.crypt  # pylint: disable=import-outside-toplevel

    _priv, pub = salt.crypt.gen_keys(2048)
    return pub


def _other_finger(finger):
    """A well-formed fingerprint that is not ``finger``."""
    digits = finger.replace(":", "")
    flipped = ("0" if digits[0] != "0" else "1") + digits[1:]
    return ":".join(flipped[i : i + 2] for i in range(0, len(flipped), 2))


@pytest.fixture
def opts(salt_opts):
    salt_opts["id"] = "kc-audit-c"
    return salt_opts


def _look(keycache_bin, opts, mid):  # pylint: disable=redefined-outer-name
    """The operator's look: ``keycache get --json``'s fingerprint."""
    proc = run_cli(keycache_bin, opts, "get", opts["pki_dir"], mid, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)["finger"]


def test_fingerprints_guard_what_the_operator_looked_at(opts, keycache_bin):  # pylint: disable=redefined-outer-name
    pki = opts["pki_dir"]
    mid = "web-01"
    key1, key2 = _new_key(), _new_key()
    f1, f2 = _finger(key1.strip()), _finger(key2.strip())
    assert f1 != f2

    # a sign-in: pending, recorded as Salt's sign-in with Salt's fingerprint
    assert salt_sign_in(opts, mid, key1)[0] is True
    assert _mmap_key_read(opts, mid) == ({"state": "pending", "pub": key1.strip()}, {})
    assert _look(keycache_bin, opts, mid) == f1
    (signed_in,) = _native_history(pki, mid)
    assert (signed_in["action"], signed_in["finger"], signed_in["master"]) == ("sign-in", f1, "kc-audit-c")

    # a second sign-in with another key: Salt keeps the pending key and puts
    # the new one in denied_keys (a deny, recorded); the look stays good
    assert salt_sign_in(opts, mid, key2)[0] is False
    assert _mmap_key_read(opts, mid) == ({"state": "pending", "pub": key1.strip()}, [key2.strip()])
    denied = _native_history(pki, mid)[-1]
    assert (denied["action"], denied["from"], denied["to"], denied["finger"]) == ("deny", None, "denied", f2)

    # a wrong fingerprint: exit 2, nothing changed, nothing recorded
    before, trail = _bank_bytes(pki), _native_history(pki)
    proc = run_cli(keycache_bin, opts, "accept", pki, mid, "--finger", _other_finger(f1))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _bank_bytes(pki) == before
    assert _native_history(pki) == trail
    assert _mmap_key_read(opts, mid) == ({"state": "pending", "pub": key1.strip()}, [key2.strip()])

    # the right one (without its colons too): accepted, the key looked at
    proc = run_cli(keycache_bin, opts, "accept", pki, mid, "--finger", f1.replace(":", "").upper(), "--reason", "CHG-2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _mmap_key_read(opts, mid) == ({"state": "accepted", "pub": key1.strip()}, [key2.strip()])
    accepted = _native_history(pki, mid)[-1]
    assert (accepted["action"], accepted["finger"], accepted["reason"], accepted["program"]) == (
        "accept",
        f1,
        "CHG-2",
        "keycache",
    )

    # delete --state accepted: the accepted key goes, the denied key stays
    proc = run_cli(keycache_bin, opts, "delete", pki, mid, "--state", "accepted")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _mmap_key_read(opts, mid) == (None, [key2.strip()])
    deleted = _native_history(pki, mid)[-1]
    assert (deleted["action"], deleted["from"], deleted["to"], deleted["finger"]) == ("delete", "accepted", None, f1)


def test_a_key_replaced_after_the_operators_look_is_refused(opts, keycache_bin):  # pylint: disable=redefined-outer-name
    pki = opts["pki_dir"]
    mid = "web-02"
    key1, key2 = _new_key(), _new_key()
    f1, f2 = _finger(key1.strip()), _finger(key2.strip())

    assert salt_sign_in(opts, mid, key1)[0] is True
    looked = _look(keycache_bin, opts, mid)
    assert looked == f1
    # meanwhile: the pending key is deleted (what salt-key -d does of each
    # key: Key.delete_key's cache.flush("keys", id), through the driver) and a
    # sign-in with another key comes: pending again, another key
    import salt.cache  # pylint: disable=import-outside-toplevel

    salt.cache.Cache(opts, driver=opts["keys.cache_driver"]).flush("keys", mid)
    assert _mmap_key_read(opts, mid) == (None, {})
    assert salt_sign_in(opts, mid, key2)[0] is True
    assert _mmap_key_read(opts, mid) == ({"state": "pending", "pub": key2.strip()}, {})

    # the accept of the key looked at is refused: exit 2, nothing changed
    before, trail = _bank_bytes(pki), _native_history(pki)
    proc = run_cli(keycache_bin, opts, "accept", pki, mid, "--finger", looked)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _bank_bytes(pki) == before and _native_history(pki) == trail
    assert _mmap_key_read(opts, mid) == ({"state": "pending", "pub": key2.strip()}, {})
    # the trail shows why: the key looked at went, another one came
    assert [(r["action"], r["finger"]) for r in trail] == [("sign-in", f1), ("delete", f1), ("sign-in", f2)]

    # the new key, looked at again, accepts
    assert _look(keycache_bin, opts, mid) == f2
    proc = run_cli(keycache_bin, opts, "accept", pki, mid, "--finger", f2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _mmap_key_read(opts, mid) == ({"state": "accepted", "pub": key2.strip()}, {})


# pylint: disable-next=redefined-outer-name
def test_the_driver_records_as_the_program_of_sys_argv0_and_the_masters_id(opts):
    """The actor of a process: program the base name of ``sys.argv[0]``
    (a process started as ``salt-key`` records ``salt-key``), the master the
    options' ``id``; computed in each process, a forked child's its own."""
    from saltext.keycache import _native  # pylint: disable=import-outside-toplevel

    assert _native.audit_program() == (os.path.basename(sys.argv[0]) or "python")
    pki = opts["pki_dir"]
    script = (
        "import json, sys, os\n"
        "sys.argv[0] = '/usr/bin/salt-key'\n"
        "import salt.config, salt.key\n"
        "o = salt.config.master_config(None); o.update(json.loads(os.environ['KC_OPTS']))\n"
        "k = salt.key.Key(o)\n"
        "k.cache.store('keys', 'fork-1', {'state': 'pending', 'pub': os.environ['KC_PUB']})\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    k.accept(match='fork-1')\n"
        "    os._exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert status == 0, status\n"
        "k.cache.flush('keys', 'fork-1')\n"
    )
    keep = {
        k: opts[k]
        for k in ("pki_dir", "cachedir", "mmap_key_size", "mmap_key_slot_size", "mmap_key_id_size", "keys.cache_driver")
    }
    keep.update({"id": "kc-audit-argv", "cluster_id": None, "user": None})
    env = dict(os.environ, KC_OPTS=json.dumps(keep), KC_PUB=_new_key().strip())
    proc = mm.run([sys.executable, "-c", script], timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _native_history(pki, "fork-1")
    assert [(r["action"], r["program"], r["master"], r["user"]) for r in records] == [
        ("sign-in", "salt-key", "kc-audit-argv", _user()),
        ("accept", "salt-key", "kc-audit-argv", _user()),
        ("delete", "salt-key", "kc-audit-argv", _user()),
    ], records


def test_the_runner_refuses_a_bad_since_naming_it(tmp_path):
    """``keycache.history`` through Salt's loader: a ``since`` that is no
    time raises SaltInvocationError naming it; no log: no records."""
    import salt.config  # pylint: disable=import-outside-toplevel
    import salt.loader  # pylint: disable=import-outside-toplevel
    from salt.exceptions import SaltInvocationError  # pylint: disable=import-outside-toplevel

    o = salt.config.master_config(None)
    o.update({"pki_dir": str(tmp_path / "pki"), "cachedir": str(tmp_path / "cache"), "cluster_id": None})
    runners = salt.loader.runner(o)
    assert runners["keycache.history"]() == []
    with pytest.raises(SaltInvocationError, match="not-a-time"):
        runners["keycache.history"](since="not-a-time")
    (tmp_path / "pki").mkdir()
    line = base64.b64encode(b"x").decode()  # a line that is no record: skipped
    (tmp_path / "pki" / AUDIT_LOG).write_text(line + "\n")
    assert runners["keycache.history"]("web-01", since="2026-01-01") == []
