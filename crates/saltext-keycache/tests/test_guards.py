"""What the ``keycache`` driver refuses, and the files it keeps beside the store.

- a ``localfs_key`` key tree beside no store is refused by every function,
  reads included, and left exactly as it is (``keycache migrate`` first);
- a layout that does not fit the files (a wrong ``mmap_key_id_size``) is
  refused, naming the file and the layout the files look like;
- a segment cap lowered below the active heap segment's size: writes roll to
  a new segment, as Salt's own writer does, and Salt reads them;
- a driver still on the files a ``keycache compact --to-size`` replaced never
  answers from them once a ``keycache delete`` followed;
- ``<pki_dir>/master.pub``, which Salt reads from disk, follows the master's
  public key in the ``master_keys`` bank.
"""

import base64
import copy
import os
import random
import stat
import subprocess
import sys
import textwrap

import pytest
import salt.cache
from salt.exceptions import SaltCacheError

from cli_support import CLI_TIMEOUT, layout_args

STATES = ("accepted", "pending", "rejected")


def pub(tag, n=270):
    rng = random.Random(tag)
    body = base64.b64encode(rng.randbytes(n)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN PUBLIC KEY-----\n{lines}\n-----END PUBLIC KEY-----\n"


def private(tag):
    rng = random.Random(tag)
    body = base64.b64encode(rng.randbytes(600)).decode()
    return f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\n"


def run_cli(keycache_bin, *args):
    env = dict(os.environ, NO_COLOR="1", KEYCACHE_REBUILD_SETTLE_MS="0")
    res = subprocess.run(
        [keycache_bin, *args], capture_output=True, text=True, timeout=CLI_TIMEOUT, env=env, check=False
    )
    assert res.returncode == 0, f"keycache {' '.join(args)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


def files_of(root):
    """{relative path: (kind, mode, bytes or link target)} of everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", stat.S_IMODE(st.st_mode), f.read())
    return out


def every_call(cache):
    """Each driver function, reads and writes, on each bank: (label, thunk)."""
    calls = []
    for bank, key, data in (
        ("keys", "acc1", {"state": "pending", "pub": pub("new")}),
        ("denied_keys", "den1", [pub("other")]),
        ("master_keys", "master.pub", pub("master")),
    ):
        calls += [
            (f"fetch {bank}", lambda b=bank, k=key: cache.fetch(b, k)),
            (f"contains {bank}", lambda b=bank, k=key: cache.contains(b, k)),
            (f"contains {bank} None", lambda b=bank: cache.contains(b, None)),
            (f"updated {bank}", lambda b=bank, k=key: cache.updated(b, k)),
            (f"list {bank}", lambda b=bank: cache.list(b)),
            (f"store {bank}", lambda b=bank, k=key, d=data: cache.store(b, k, d)),
            (f"flush {bank} key", lambda b=bank, k=key: cache.flush(b, k)),
            (f"flush {bank}", lambda b=bank: cache.flush(b)),
        ]
    calls += [
        ("list_all keys", lambda: cache.list_all("keys", include_data=True)),
        ("list_all denied_keys", lambda: cache.list_all("denied_keys")),
    ]
    return calls


# ---------------------------------------------------------------------------
# item 10: a localfs_key tree beside no store
# ---------------------------------------------------------------------------


def localfs_tree(opts):
    """A master's localfs_key tree, written by Salt's own localfs_key driver."""
    lf = salt.cache.Cache(dict(opts, **{"keys.cache_driver": "localfs_key"}), driver="localfs_key")
    lf.store("keys", "acc1", {"state": "accepted", "pub": pub("acc1")})
    lf.store("keys", "acc2", {"state": "accepted", "pub": pub("acc2")})
    lf.store("keys", "pend1", {"state": "pending", "pub": pub("pend1")})
    lf.store("keys", "rej1", {"state": "rejected", "pub": pub("rej1")})
    lf.store("denied_keys", "den1", [pub("den1")])
    return lf


def test_a_localfs_key_tree_beside_no_store_is_refused_and_left_alone(salt_opts, keycache_bin):
    pki = salt_opts["pki_dir"]
    localfs_tree(salt_opts)
    before = files_of(pki)
    assert "minions/acc1" in before and "minions_denied/den1" in before, sorted(before)
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    for label, call in every_call(cache):
        with pytest.raises(SaltCacheError) as info:
            call()
        msg = str(info.value)
        assert "keycache migrate" in msg and pki in msg, f"{label}: {msg}"
        # what a wheel's user has: the runner (the command may be off PATH)
        assert "salt-run keycache.migrate" in msg, f"{label}: {msg}"
    # A minion signing in (Salt's sign-in: fetch, then store as pending).
    with pytest.raises(SaltCacheError):
        cache.store("keys", "acc1", {"state": "pending", "pub": pub("acc1")})
    assert files_of(pki) == before, "the tree changed, or bank files appeared"

    # Migrated, the same master works, and the tree is kept as it was.
    run_cli(keycache_bin, "migrate", pki, "--no-master-keys", *layout_args(salt_opts))
    assert cache.fetch("keys", "acc1") == {"state": "accepted", "pub": pub("acc1")}
    assert cache.fetch("denied_keys", "den1") == [pub("den1")]
    assert sorted(cache.list("keys")) == ["acc1", "acc2", "pend1", "rej1"]
    cache.store("keys", "new1", {"state": "pending", "pub": pub("new1")})
    after = files_of(pki)
    for rel, entry in before.items():
        assert after.get(rel) == entry, rel
    assert after["minions_pre/new1"][2] == pub("new1").encode()


def test_a_master_key_file_beside_no_store_is_refused(salt_opts):
    # A localfs_key master with no minion yet: only its own key pair. Used
    # as an empty store, Salt would generate a new master key pair.
    pki = salt_opts["pki_dir"]
    salt_opts["id"] = "m1_master"
    with open(os.path.join(pki, "m1.pem"), "w") as f:
        f.write(private("m1"))
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    before = files_of(pki)
    with pytest.raises(SaltCacheError, match="keycache migrate"):
        cache.contains("master_keys", "m1.pem")
    with pytest.raises(SaltCacheError, match="m1.pem"):
        cache.store("master_keys", "m1.pem", private("new"))
    assert files_of(pki) == before


def test_an_empty_tree_or_a_store_is_not_refused(salt_opts):
    # Salt creates the state directories empty at start; dot-files are not keys.
    pki = salt_opts["pki_dir"]
    for sub in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        os.mkdir(os.path.join(pki, sub))
    with open(os.path.join(pki, "minions", ".keep"), "w") as f:
        f.write("")
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    assert cache.fetch("keys", "m1") is None
    cache.store("keys", "m1", {"state": "accepted", "pub": pub("m1")})
    # The driver's own tree beside its store.
    assert os.path.isfile(os.path.join(pki, "minions", "m1"))
    assert cache.fetch("keys", "m1")["state"] == "accepted"


# ---------------------------------------------------------------------------
# item 15b: a layout that does not fit the files
# ---------------------------------------------------------------------------


def test_a_wrong_id_size_is_refused_naming_the_file_and_the_layout(salt_opts):
    pki = salt_opts["pki_dir"]
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    for n in range(12):
        cache.store("keys", f"minion-{n:02}", {"state": "accepted", "pub": pub(f"m{n}")})
    cache.store("denied_keys", "minion-03", [pub("d3")])
    before = files_of(pki)
    wrong = copy.deepcopy(salt_opts)
    wrong["mmap_key_id_size"] = 48
    bad = salt.cache.Cache(wrong, driver="keycache")
    for label, call in (
        ("list_all", lambda: bad.list_all("keys")),
        ("list", lambda: bad.list("keys")),
        ("fetch", lambda: bad.fetch("keys", "minion-01")),
        ("contains", lambda: bad.contains("keys", "minion-01")),
        ("store", lambda: bad.store("keys", "minion-99", {"state": "pending", "pub": pub("x")})),
    ):
        with pytest.raises(SaltCacheError) as info:
            call()
        msg = str(info.value)
        assert os.path.join(pki, ".mmap_keys.idx") in msg, f"{label}: {msg}"
        assert "mmap_key_id_size 48" in msg and "look like" in msg, f"{label}: {msg}"
        assert "mmap_key_id_size 64" in msg.split("look like")[1], f"{label}: {msg}"
    assert files_of(pki) == before


# ---------------------------------------------------------------------------
# item 13: a segment cap lowered below the active segment's size
# ---------------------------------------------------------------------------


def test_a_lowered_segment_cap_rolls_to_a_new_segment(salt_opts):
    pki = salt_opts["pki_dir"]
    want = {}
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    for n in range(10):
        want[f"m{n}"] = {"state": STATES[n % 3], "pub": pub(f"m{n}")}
        cache.store("keys", f"m{n}", want[f"m{n}"])
    heap = os.path.join(pki, ".mmap_keys.idx.heap")
    assert os.path.getsize(heap) > 2048
    assert not os.path.exists(heap + ".1")

    low = copy.deepcopy(salt_opts)
    low["mmap_key_max_segment_bytes"] = 2048
    lowered = salt.cache.Cache(low, driver="keycache")
    for n in range(10, 16):
        want[f"m{n}"] = {"state": "pending", "pub": pub(f"m{n}")}
        lowered.store("keys", f"m{n}", want[f"m{n}"])
    want["m1"] = {"state": "accepted", "pub": pub("m1 again", 300)}
    lowered.store("keys", "m1", want["m1"])
    lowered.store("denied_keys", "m2", [pub("d2")])
    assert os.path.exists(heap + ".1"), sorted(os.listdir(pki))
    for seg in range(1, 20):
        p = f"{heap}.{seg}"
        if os.path.exists(p):
            assert os.path.getsize(p) <= 2048, (p, os.path.getsize(p))
    assert lowered.list_all("keys", include_data=True) == want

    # Salt's own mmap_key reads it, with either cap, in a fresh process.
    for cap in (2048, None):
        o = {k: low[k] for k in ("mmap_key_size", "mmap_key_slot_size", "mmap_key_id_size")}
        if cap:
            o["mmap_key_max_segment_bytes"] = cap
        script = textwrap.dedent(
            """
            import json, sys
            import salt.config, salt.cache
            opts = salt.config.master_config(None)
            opts.update(json.loads(sys.argv[1]))
            c = salt.cache.Cache(opts, driver="mmap_key")
            print(json.dumps({"keys": c.list_all("keys", include_data=True),
                              "denied": c.fetch("denied_keys", "m2")}))
            """
        )
        o.update({"pki_dir": pki, "keys.cache_driver": "mmap_key", "user": None})
        res = subprocess.run(
            [sys.executable, "-c", script, __import__("json").dumps(o)],
            capture_output=True, text=True, timeout=CLI_TIMEOUT, check=True,
        )
        got = __import__("json").loads(res.stdout)
        assert got["keys"] == want, f"cap {cap}"
        assert got["denied"] == [pub("d2")]


# ---------------------------------------------------------------------------
# item 12: a driver on files a compaction replaced
# ---------------------------------------------------------------------------


def test_a_driver_on_replaced_files_never_answers_from_them(salt_opts, keycache_bin):
    pki = salt_opts["pki_dir"]
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    for n in range(20):
        cache.store("keys", f"m{n:02}", {"state": "accepted", "pub": pub(f"m{n}")})
    assert cache.fetch("keys", "m07")["state"] == "accepted"
    new = dict(salt_opts, mmap_key_size=4001)
    run_cli(keycache_bin, "compact", pki, "--to-size", "4001", *layout_args(salt_opts))
    run_cli(keycache_bin, "delete", pki, "m07", "--tree", "never", *layout_args(new))
    # The driver still has mmap_key_size 2003: from the very first call, and
    # on every call after it, it refuses; it never answers the deleted key.
    for attempt in range(20):
        try:
            got = cache.fetch("keys", "m07")
        except SaltCacheError as exc:
            assert ".mmap_keys.idx" in str(exc), str(exc)
            continue
        pytest.fail(f"attempt {attempt}: answered {got!r} from replaced files")
    # Configured with the new size, a master reads the store as it is.
    fresh = salt.cache.Cache(new, driver="keycache")
    assert fresh.fetch("keys", "m07") is None
    assert fresh.fetch("keys", "m08")["state"] == "accepted"


# ---------------------------------------------------------------------------
# item 14: <pki_dir>/master.pub
# ---------------------------------------------------------------------------


def read(p):
    with open(p, "rb") as f:
        return f.read().decode()


def assert_pub_file(path, want):
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode), f"{path} is not a regular file"
    assert stat.S_IMODE(st.st_mode) == 0o644, oct(st.st_mode)
    assert read(path) == want


def test_master_pub_follows_the_bank(salt_opts, tmp_path):
    pki = salt_opts["pki_dir"]
    salt_opts["id"] = "m1_master"
    path = os.path.join(pki, "master.pub")
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    # Salt's first start: master.pem and master.pub, then <id>.pem/.pub.
    cache.store("master_keys", "master.pem", private("k1"))
    cache.store("master_keys", "master.pub", pub("k1"))
    assert_pub_file(path, pub("k1"))
    cache.store("master_keys", "m1.pem", private("k1"))
    cache.store("master_keys", "m1.pub", pub("k1"))
    cache.flush("master_keys", "master.pem")
    cache.flush("master_keys", "master.pub")
    assert_pub_file(path, pub("k1"))
    assert not os.path.exists(os.path.join(pki, "master.pem"))
    assert not os.path.exists(os.path.join(pki, "m1.pem"))
    # <id>.pub is the master's key; master.pub only stands in for it.
    cache.store("master_keys", "master.pub", pub("old"))
    assert_pub_file(path, pub("k1"))
    cache.store("master_keys", "m1.pub", pub("k2"))
    assert_pub_file(path, pub("k2"))
    # Never a private key, even stored under a public key's name.
    cache.store("master_keys", "master.pub", private("oops"))
    cache.flush("master_keys", "m1.pub")
    assert_pub_file(path, pub("k2"))
    # Other names leave the file alone.
    cache.store("master_keys", "peers/m2.pub", pub("m2"))
    cache.store("master_keys", "cluster.pub", pub("cluster"))
    assert_pub_file(path, pub("k2"))
    # A symlink in its place is replaced, not followed.
    outside = tmp_path / "outside.pub"
    outside.write_text("outside\n")
    os.remove(path)
    os.symlink(outside, path)
    cache.store("master_keys", "m1.pub", pub("k3"))
    assert_pub_file(path, pub("k3"))
    assert outside.read_text() == "outside\n"
    leftovers = [n for n in os.listdir(pki) if "keycache-new" in n]
    assert not leftovers, leftovers


def test_master_pub_is_written_when_the_key_lives_only_in_the_bank(salt_opts):
    # A master restarted with its key in the bank and no master.pub on disk
    # (Salt only reads the bank then): the file is written when the bank is
    # opened, in the new process.
    pki = salt_opts["pki_dir"]
    salt_opts["id"] = "m1_master"
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    cache.store("master_keys", "m1.pem", private("k1"))
    cache.store("master_keys", "m1.pub", pub("k1"))
    path = os.path.join(pki, "master.pub")
    os.remove(path)
    script = textwrap.dedent(
        """
        import json, sys
        import salt.config, salt.cache
        opts = salt.config.master_config(None)
        opts.update(json.loads(sys.argv[1]))
        c = salt.cache.Cache(opts, driver="keycache")
        print(c.contains("master_keys", "m1.pem"))
        """
    )
    o = {k: salt_opts[k] for k in ("pki_dir", "mmap_key_size", "mmap_key_slot_size", "mmap_key_id_size", "id")}
    o.update({"keys.cache_driver": "keycache", "user": None})
    res = subprocess.run(
        [sys.executable, "-c", script, __import__("json").dumps(o)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False,
    )
    assert res.returncode == 0 and res.stdout.strip() == "True", res.stderr
    assert_pub_file(path, pub("k1"))


def test_a_cluster_master_with_its_key_in_the_bank_has_master_pub(salt_opts, tmp_path):
    # Salt's own MasterKeys, on a cluster (the banks in cluster_pki_dir):
    # discover_peers reads MasterKeys.master_pub_path from disk.
    import salt.crypt

    cluster = tmp_path / "cluster"
    cluster.mkdir(mode=0o700)
    salt_opts.update({"id": "m1_master", "cluster_id": "c1", "cluster_pki_dir": str(cluster),
                      "cluster_peers": ["m2"], "keysize": 2048})
    keys = salt.crypt.MasterKeys(salt_opts)
    bank = salt.cache.Cache(salt_opts, driver="keycache")
    in_bank = bank.fetch("master_keys", "m1.pub")
    assert "BEGIN PUBLIC KEY" in in_bank
    with open(keys.master_pub_path) as fp:  # what discover_peers does
        assert fp.read() == in_bank
    assert keys.master_pub_path == os.path.join(salt_opts["pki_dir"], "master.pub")
    assert not os.path.exists(os.path.join(salt_opts["pki_dir"], "master.pem"))
