"""Interop of the ``keycache`` driver with Salt's own ``mmap_key`` driver.

Both drivers read and write the same files in the pki dir.  These tests write a
store through one driver (or through both, alternately) and read it back through
both, through ``salt.cache.Cache`` exactly as a master does, and compare every
answer: fetch of each entry (present and absent), list, list_all with and
without data, contains (per key and per bank) and updated.  The answers must be
equal between the drivers *and* equal to a model of what was written, so a
store both drivers misread the same way still fails.

Salt's mmap_key keeps its open ``MmapCache`` objects in the module-level
``_caches`` of the loaded module, which is shared by every ``Cache`` object of a
process (the loader does not re-execute the module for a new ``Cache``).  An
``MmapCache`` maps the index ``MAP_SHARED`` but keeps its heap mappings until
its own write or a stat-based staleness check (every 0.25 s) re-opens them, so
a value another handle appended may read as missing for a moment.  Reads
through mmap_key after the other driver wrote therefore go through
``reset_mmap_key`` (close and forget its handles), as a new process would.
The keycache driver gets no such help: it must see mmap_key's writes at once.
"""

import base64
import json
import os
import random
import string
import time

import pytest
import salt.cache
from salt.exceptions import SaltCacheError

from cli_support import run_cli
from tree_files import TREE_DIR, id_problems

DRIVERS = ("keycache", "mmap_key")
STATES = ("accepted", "pending", "rejected")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def new_cache(opts, driver):
    return salt.cache.Cache(opts, driver=driver)


def reset_mmap_key(cache):
    """Close and forget mmap_key's module-level handles (as a fresh process)."""
    glob = cache.modules["mmap_key.fetch"].func.__globals__
    for handle in list(glob["_caches"].values()):
        handle.close()
    glob["_caches"].clear()


def fresh(opts, driver):
    """A Cache for *driver* that reads the files as they are now."""
    cache = new_cache(opts, driver)
    if driver == "mmap_key":
        reset_mmap_key(cache)
    return cache


def outcome(fn, *args, **kwargs):
    """("ok", value) or ("raise", exception class name): comparable answers."""
    try:
        return ("ok", fn(*args, **kwargs))
    except SaltCacheError as exc:
        return ("raise", "SaltCacheError")
    except Exception as exc:  # pylint: disable=broad-except
        return ("raise", type(exc).__name__)


def gen_id(rng, taken, max_bytes):
    while True:
        kind = rng.random()
        if kind < 0.1:
            stem = rng.choice(["ünïcødé", "节点", "миньон", "ωμέγα", "caf\u00e9"])
            mid = f"{stem}-{rng.randrange(10**6)}"
        else:
            alphabet = string.ascii_letters + string.digits + "-_."
            first = rng.choice(string.ascii_lowercase + string.digits)
            mid = first + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        if len(mid.encode()) <= max_bytes and mid not in taken:
            taken.add(mid)
            return mid


def gen_pub(rng, tag):
    body = base64.b64encode(rng.randbytes(rng.choice([94, 162, 270, 294, 550]))).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    pub = f"-----BEGIN PUBLIC KEY-----\n{lines}\n-----END PUBLIC KEY-----\n"
    if rng.random() < 0.5:
        pub += f"# {tag} ключ ✓ é 中文 🔑\n"
    return pub


def gen_private(rng, tag):
    body = base64.b64encode(rng.randbytes(rng.choice([600, 1190]))).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN RSA PRIVATE KEY-----\n{lines}\n-----END RSA PRIVATE KEY-----\n"


class Model:
    """What was written: the expected answers of every read."""

    def __init__(self):
        self.keys = {}  # id -> (state, pub)
        self.denied = {}  # id -> pub
        self.master = {}  # name -> str
        self.times = {}  # (bank, id) -> (t_before, t_after) of the last write
        self.universe = {"keys": set(), "denied_keys": set(), "master_keys": set()}
        self.files = set()  # banks whose index file exists (written, not flushed whole)

    def bank(self, bank):
        return {"keys": self.keys, "denied_keys": self.denied, "master_keys": self.master}[bank]

    def write(self, cache, bank, key, value):
        t0 = time.time()
        if bank == "keys":
            cache.store(bank, key, {"state": value[0], "pub": value[1]})
        elif bank == "denied_keys":
            cache.store(bank, key, [value])
        else:
            cache.store(bank, key, value)
        self.times[(bank, key)] = (t0, time.time())
        self.bank(bank)[key] = value
        self.universe[bank].add(key)
        self.files.add(bank)

    def flush(self, cache, bank, key):
        ret = cache.flush(bank, key)
        assert ret is True, f"flush({bank!r}, {key!r}) of a present key returned {ret!r}"
        del self.bank(bank)[key]
        self.times.pop((bank, key), None)

    def flush_bank(self, cache, bank):
        ret = cache.flush(bank)
        assert ret is True, f"flush({bank!r}) returned {ret!r}"
        self.bank(bank).clear()
        self.files.discard(bank)

    def expected_fetch(self, bank, key):
        if bank == "keys":
            if key not in self.keys:
                return None
            state, pub = self.keys[key]
            return {"state": state, "pub": pub}
        if bank == "denied_keys":
            return [self.denied[key]] if key in self.denied else {}
        return self.master.get(key, {})


def absent_names(extra_absent, bank):
    if isinstance(extra_absent, dict):
        return set(extra_absent.get(bank, ()))
    return set(extra_absent)


def snapshot(cache, model, extra_absent=()):
    """Every answer the driver gives about the ids of *model* (and some absent ones)."""
    snap = {}
    for bank in ("keys", "denied_keys", "master_keys"):
        names = sorted(model.universe[bank] | absent_names(extra_absent, bank))
        listed = outcome(cache.list, bank)
        if listed[0] == "ok":
            ids = list(listed[1])
            snap[("list-dups", bank)] = sorted(i for i in set(ids) if ids.count(i) > 1)
            listed = ("ok", sorted(ids))
        snap[("list", bank)] = listed
        snap[("list_all", bank, False)] = outcome(cache.list_all, bank)
        snap[("list_all", bank, True)] = outcome(cache.list_all, bank, include_data=True)
        snap[("contains-bank", bank)] = outcome(cache.contains, bank, None)
        for name in names:
            snap[("fetch", bank, name)] = outcome(cache.fetch, bank, name)
            snap[("contains", bank, name)] = outcome(cache.contains, bank, name)
            snap[("updated", bank, name)] = outcome(cache.updated, bank, name)
    return snap


def expected_snapshot(model, extra_absent=()):
    """The answers mmap_key's code gives for *model*, except `updated` (checked apart)."""
    exp = {}
    for bank in ("keys", "denied_keys", "master_keys"):
        content = model.bank(bank)
        names = sorted(model.universe[bank] | absent_names(extra_absent, bank))
        exp[("list", bank)] = ("ok", sorted(content))
        exp[("list-dups", bank)] = []
        if bank == "keys":
            exp[("list_all", bank, False)] = ("ok", {k: {"state": v[0]} for k, v in content.items()})
            exp[("list_all", bank, True)] = (
                "ok",
                {k: {"state": v[0], "pub": v[1]} for k, v in content.items()},
            )
        elif bank == "denied_keys":
            both = ("ok", {k: [v] for k, v in content.items()})
            exp[("list_all", bank, False)] = both
            exp[("list_all", bank, True)] = both
        else:
            exp[("list_all", bank, False)] = ("raise", "SaltCacheError")
            exp[("list_all", bank, True)] = ("raise", "SaltCacheError")
        exp[("contains-bank", bank)] = ("ok", bank in model.files)
        for name in names:
            exp[("fetch", bank, name)] = ("ok", model.expected_fetch(bank, name))
            exp[("contains", bank, name)] = ("ok", name in content)
    return exp


def diff(a, b, limit=12):
    out = []
    for k in sorted(set(a) | set(b), key=repr):
        if a.get(k, "<missing>") != b.get(k, "<missing>"):
            out.append(f"{k!r}: {str(a.get(k, '<missing>'))[:300]} != {str(b.get(k, '<missing>'))[:300]}")
            if len(out) >= limit:
                out.append("...")
                break
    return "\n".join(out)


def check_updated(snap, model, label):
    bad = []
    for key, value in snap.items():
        if key[0] != "updated":
            continue
        _, bank, name = key
        if name in model.bank(bank):
            t0, t1 = model.times[(bank, name)]
            ok = value[0] == "ok" and isinstance(value[1], int) and int(t0) - 1 <= value[1] <= int(t1) + 1
        else:
            ok = value == ("ok", None)
        if not ok:
            bad.append(f"{key!r}: {value!r}")
    assert not bad, f"{label}: wrong `updated` answers:\n" + "\n".join(bad[:12])


def assert_reads_alike(opts, model, label, extra_absent=()):
    """Fresh keycache and fresh mmap_key give the same answers, and the model's."""
    snaps = {drv: snapshot(fresh(opts, drv), model, extra_absent) for drv in DRIVERS}
    d = diff(snaps["keycache"], snaps["mmap_key"])
    assert not d, f"{label}: keycache (left) and mmap_key (right) read differently:\n{d}"
    exp = expected_snapshot(model, extra_absent)
    got = {k: v for k, v in snaps["mmap_key"].items() if k[0] != "updated"}
    d = diff(got, exp)
    assert not d, f"{label}: the drivers agree but not with what was written (got left):\n{d}"
    for drv in DRIVERS:
        check_updated(snaps[drv], model, f"{label} ({drv})")


def assert_cli_agrees(keycache_bin, opts, model, tree=None):
    pki = opts["pki_dir"]
    args = ["verify", pki] + (["--tree", tree] if tree else [])
    res = run_cli(keycache_bin, opts, *args)
    assert res.returncode == 0, f"keycache {' '.join(args)} exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    res = run_cli(keycache_bin, opts, "list", pki, "--json")
    assert res.returncode == 0, f"keycache list --json exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    listed = {k: sorted(v) for k, v in json.loads(res.stdout).items()}
    expected = {
        "minions": sorted(k for k, v in model.keys.items() if v[0] == "accepted"),
        "minions_pre": sorted(k for k, v in model.keys.items() if v[0] == "pending"),
        "minions_rejected": sorted(k for k, v in model.keys.items() if v[0] == "rejected"),
        "minions_denied": sorted(model.denied),
    }
    assert listed == expected, f"keycache list --json: {listed!r} != {expected!r}"
    res = run_cli(keycache_bin, opts, "list", pki, "--bank", "master_keys", "--json")
    assert res.returncode == 0, f"keycache list --bank master_keys exit {res.returncode}:\n{res.stderr}"
    listed = json.loads(res.stdout)
    assert set(listed) == {"master_keys"}, res.stdout
    assert sorted(listed["master_keys"]) == sorted(model.master), res.stdout


def tree_problems(opts, model, ids=None):
    """Disagreements between minions*/<id> files and the model (keycache_tree on)."""
    pki = opts["pki_dir"]
    problems = []
    ids = set(model.universe["keys"] | model.universe["denied_keys"]) if ids is None else set(ids)
    for mid in sorted(ids):
        want = {}
        if mid in model.keys:
            want[TREE_DIR[model.keys[mid][0]]] = model.keys[mid][1]
        if mid in model.denied:
            want["minions_denied"] = model.denied[mid]
        problems.extend(id_problems(pki, mid, want))
    return problems


def populate(rng, cache, model, opts, n_keys=360, n_denied=60):
    """Write several hundred entries, then overwrite and flush some of them."""
    id_size = opts["mmap_key_id_size"]
    taken = set()
    ids = [gen_id(rng, taken, id_size) for _ in range(n_keys)]
    # ids of exactly id_size bytes, ASCII and multi-byte
    ids.append("L" * id_size)
    ids.append(("é" * (id_size // 2))[: id_size // 2])  # 2 bytes each: id_size bytes
    ids.append("m" * (id_size - 3) + "中")
    for mid in ids:
        assert len(mid.encode()) <= id_size
        model.write(cache, "keys", mid, (rng.choice(STATES), gen_pub(rng, mid)))
    for mid in rng.sample(ids, n_denied):
        model.write(cache, "denied_keys", mid, gen_pub(rng, "denied " + mid))
    names = [
        "master.pem",
        "master.pub",
        "peers/m2.pub",
        "peers/m3.pub",
        "peers/" + "p" * (id_size - len("peers/.pub")) + ".pub",
        "cluster.pem",
        "cluster.pub",
        "m1_pubkey_signature",
        "minion.pem",
        "minion.pub",
        "master_sign.pem",
        "master_sign.pub",
    ]
    for name in names:
        value = gen_private(rng, name) if name.endswith(".pem") else gen_pub(rng, name)
        model.write(cache, "master_keys", name, value)
    # overwrite: state changes, shorter (in place) and longer (appended) values
    for mid in rng.sample(ids, 120):
        state, pub = model.keys[mid]
        new_pub = pub[: len(pub) // 2] + "\n" if rng.random() < 0.5 else pub + gen_pub(rng, "more")
        model.write(cache, "keys", mid, (rng.choice(STATES), new_pub))
    for mid in rng.sample(sorted(model.denied), 20):
        model.write(cache, "denied_keys", mid, gen_pub(rng, "again é"))
    model.write(cache, "master_keys", "peers/m2.pub", gen_pub(rng, "rotated m2"))
    return ids


def flush_some(rng, cache, model, n_keys=40, n_denied=10):
    for mid in rng.sample(sorted(model.keys), n_keys):
        model.flush(cache, "keys", mid)
    for mid in rng.sample(sorted(model.denied), n_denied):
        model.flush(cache, "denied_keys", mid)
    model.flush(cache, "master_keys", "peers/m3.pub")
    # flushing an absent key answers False in mmap_key
    gone = sorted(model.universe["keys"] - set(model.keys))[0]
    assert cache.flush("keys", gone) is False


ABSENT = ["never-written", "nöt-thère", "x" * 10]


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------


def test_keycache_writes_mmap_key_reads(salt_opts, keycache_bin):
    """A store written through keycache reads the same through both drivers."""
    rng = random.Random(0x13A)
    model = Model()
    kc = new_cache(salt_opts, "keycache")
    populate(rng, kc, model, salt_opts)
    flush_some(rng, kc, model)
    assert_reads_alike(salt_opts, model, "written by keycache", ABSENT)
    # keycache keeps the key tree in step by default
    problems = tree_problems(salt_opts, model)
    assert not problems, "key tree after keycache writes:\n" + "\n".join(problems[:12])
    assert_cli_agrees(keycache_bin, salt_opts, model)


def test_mmap_key_writes_keycache_reads(salt_opts, keycache_bin):
    """A store written through Salt's mmap_key reads the same through both drivers.

    The flushes go through a fresh mmap_key handle (as salt-key, another process,
    does): in the handle that appended an id, Salt 3008.5's flush appends the
    roster tombstone instead of overwriting the entry (the roster file is open
    in append mode), which leaves a stale roster entry that `keycache verify`
    reports; test_salt_stale_roster_entries covers that case.
    """
    rng = random.Random(0x13B)
    model = Model()
    mk = fresh(salt_opts, "mmap_key")
    populate(rng, mk, model, salt_opts)
    mk = fresh(salt_opts, "mmap_key")
    flush_some(rng, mk, model)
    # keycache reads first, in a process that never opened these files before
    kc = new_cache(salt_opts, "keycache")
    for mid in list(model.keys)[:50]:
        assert kc.fetch("keys", mid) == model.expected_fetch("keys", mid)
    assert_reads_alike(salt_opts, model, "written by mmap_key", ABSENT)
    # mmap_key keeps no key tree; if reading through keycache made one, it agrees
    made = [d for d in TREE_DIR.values() if os.path.lexists(os.path.join(salt_opts["pki_dir"], d))]
    if made:
        problems = tree_problems(salt_opts, model)
        assert not problems, f"reads through keycache made {made}, unlike the banks:\n" + "\n".join(problems[:12])
    # the banks: `verify` reports a store with accepted keys and no key tree
    assert_cli_agrees(keycache_bin, salt_opts, model, tree="never")


def test_interleaved_writes(salt_opts, keycache_bin):
    """Writes alternate between the drivers (long-lived handles), on the same ids.

    After each mmap_key write, the long-lived keycache handle must read it at
    once; after each keycache write, mmap_key (re-opened) must read it.
    At the end both read the whole store alike.
    """
    rng = random.Random(0x13C)
    model = Model()
    caches = {"keycache": new_cache(salt_opts, "keycache"), "mmap_key": fresh(salt_opts, "mmap_key")}
    last_writer = {}
    taken = set()
    ids = [gen_id(rng, taken, salt_opts["mmap_key_id_size"]) for _ in range(220)]
    stale = []
    for step in range(900):
        drv = DRIVERS[step % 2]
        other = DRIVERS[1 - step % 2]
        cache = caches[drv]
        mid = rng.choice(ids)
        r = rng.random()
        if r < 0.70:
            bank = "keys"
            value = (rng.choice(STATES), gen_pub(rng, f"{drv} {step}"))
            if mid in model.keys and rng.random() < 0.5:  # same length or shorter: in place
                value = (value[0], model.keys[mid][1][: rng.randrange(10, len(model.keys[mid][1]) + 1)])
            model.write(cache, bank, mid, value)
        elif r < 0.82:
            bank = "denied_keys"
            model.write(cache, bank, mid, gen_pub(rng, f"denied {drv} {step}"))
        elif r < 0.88:
            bank = "master_keys"
            mid = rng.choice(["peers/m2.pub", "peers/m3.pub", "master.pem", "cluster.pem"])
            value = gen_private(rng, mid) if mid.endswith(".pem") else gen_pub(rng, mid)
            model.write(cache, bank, mid, value)
        else:
            bank = rng.choice(["keys", "denied_keys"])
            if mid not in model.bank(bank):
                continue
            model.flush(cache, bank, mid)
        last_writer[(bank, mid)] = drv
        # the other driver reads the write
        if other == "keycache":
            got = caches["keycache"].fetch(bank, mid)
        else:
            reset_mmap_key(caches["mmap_key"])
            got = caches["mmap_key"].fetch(bank, mid)
        if got != model.expected_fetch(bank, mid):
            stale.append(f"step {step}: {other} read {bank}/{mid!r} after {drv} wrote it: {str(got)[:120]!r}")
    assert not stale, "\n".join(stale[:12])
    assert_reads_alike(salt_opts, model, "written alternately", ABSENT)
    # the banks are clean; mmap_key keeps no key tree, so only ids keycache
    # wrote last have to agree with it
    assert_cli_agrees(keycache_bin, salt_opts, model, tree="never")
    kc_ids = {mid for (bank, mid), drv in last_writer.items() if drv == "keycache" and bank != "master_keys"}
    kc_ids -= {mid for (bank, mid), drv in last_writer.items() if drv == "mmap_key"}
    problems = tree_problems(salt_opts, model, kc_ids)
    assert not problems, "key tree of ids keycache wrote last:\n" + "\n".join(problems[:12])


@pytest.mark.parametrize("writer", DRIVERS)
def test_flush_key_and_bank(salt_opts, writer):
    """Flush of one key and of a whole bank through one driver is seen by the other,
    and the other can write the bank again afterwards (new files)."""
    rng = random.Random(0x13D)
    reader = DRIVERS[1 - DRIVERS.index(writer)]
    model = Model()
    w = fresh(salt_opts, writer)
    r = new_cache(salt_opts, reader)
    taken = set()
    ids = [gen_id(rng, taken, salt_opts["mmap_key_id_size"]) for _ in range(40)]
    for mid in ids:
        model.write(w, "keys", mid, (rng.choice(STATES), gen_pub(rng, mid)))
        model.write(w, "denied_keys", mid, gen_pub(rng, "d " + mid))
    model.write(w, "master_keys", "peers/m2.pub", gen_pub(rng, "m2"))
    # the reader has the banks open before the flushes
    if reader == "mmap_key":
        reset_mmap_key(r)
    assert sorted(r.list("keys")) == sorted(ids)
    assert r.fetch("keys", ids[0]) == model.expected_fetch("keys", ids[0])
    # flush one key
    model.flush(w, "keys", ids[0])
    if reader == "mmap_key":
        reset_mmap_key(r)
    assert r.fetch("keys", ids[0]) is None
    assert r.contains("keys", ids[0]) is False
    assert r.updated("keys", ids[0]) is None
    assert ids[0] not in r.list("keys")
    assert r.flush("keys", ids[0]) is False
    # flush the whole bank
    model.flush_bank(w, "keys")
    model.flush_bank(w, "denied_keys")
    if reader == "mmap_key":
        reset_mmap_key(r)
    else:
        # Bank files removed (or replaced) behind an open handle are noticed
        # after the staleness interval, as by Salt's own MmapCache handles
        # (staleness_check_interval=0.25 s); a bank created while missing is
        # seen at once.
        time.sleep(0.35)
    for cache, who in ((r, reader), (fresh(salt_opts, writer), writer)):
        assert cache.contains("keys", None) is False, who
        assert cache.contains("denied_keys", None) is False, who
        assert list(cache.list("keys")) == [], who
        assert cache.list_all("keys") == {}, who
        assert cache.fetch("keys", ids[1]) is None, who
        assert cache.fetch("denied_keys", ids[1]) == {}, who
        assert cache.fetch("master_keys", "peers/m2.pub") == model.master["peers/m2.pub"], who
    pki = salt_opts["pki_dir"]
    left = sorted(f for f in os.listdir(pki) if f.startswith((".mmap_keys.idx", ".mmap_denied.idx")))
    assert left == [], f"flush of the banks by {writer} left {left}"
    if writer == "keycache":
        left = [d for d in ("minions", "minions_pre", "minions_rejected", "minions_denied")
                if os.path.isdir(os.path.join(pki, d)) and os.listdir(os.path.join(pki, d))]
        assert left == [], f"flush of the banks by keycache left key tree files in {left}"
    # the reader writes the bank again (new files); the writer sees it
    for mid in ids[:10]:
        model.write(r, "keys", mid, (rng.choice(STATES), gen_pub(rng, "again " + mid)))
    model.write(r, "denied_keys", ids[3], gen_pub(rng, "again d"))
    assert_reads_alike(salt_opts, model, f"flushed by {writer}, rewritten by {reader}", ABSENT)


def test_id_size_limit(salt_opts):
    """Ids of exactly mmap_key_id_size bytes work both ways; one byte more is refused
    by keycache with SaltCacheError and never aliases the id it would truncate to.

    Salt 3008.5's mmap_key does not refuse: MmapCache truncates the id to
    id_size bytes (store succeeds, under the truncated id).  That is checked
    here too, as the interop fact keycache must read.
    """
    size = salt_opts["mmap_key_id_size"]
    rng = random.Random(0x13E)
    exact = ["E" * size, "é" * (size // 2), "k" * (size - 4) + "🔑"]
    for mid in exact:
        assert len(mid.encode()) == size
    for writer in DRIVERS:
        for mid in exact:
            pub = gen_pub(rng, writer)
            fresh(salt_opts, writer).store("keys", mid, {"state": "accepted", "pub": pub})
            fresh(salt_opts, writer).store("denied_keys", mid, [pub])
            for reader in DRIVERS:
                c = fresh(salt_opts, reader)
                assert c.fetch("keys", mid) == {"state": "accepted", "pub": pub}, (writer, reader, mid)
                assert c.fetch("denied_keys", mid) == [pub], (writer, reader, mid)
                assert mid in c.list("keys"), (writer, reader, mid)
                assert c.contains("keys", mid) is True
    kc = fresh(salt_opts, "keycache")
    before = sorted(kc.list("keys"))
    before_vals = {m: kc.fetch("keys", m) for m in exact}
    over = [mid + "x" for mid in exact] + ["x" * (size - 1) + "é"]
    for mid in over:
        assert len(mid.encode()) > size
        for bank, data in (("keys", {"state": "accepted", "pub": "P"}), ("denied_keys", ["P"])):
            with pytest.raises(SaltCacheError):
                kc.store(bank, mid, data)
        # reads of an over-long id: refused or absent, never the truncated id's entry
        for op in ("fetch", "contains", "updated"):
            res = outcome(getattr(kc, op), "keys", mid)
            assert res[0] == "raise" and res[1] == "SaltCacheError" or res[1] in (None, False), (op, mid, res)
        res = outcome(kc.flush, "keys", mid)
        assert res[0] == "raise" and res[1] == "SaltCacheError" or res[1] is False, ("flush", mid, res)
    for reader in DRIVERS:
        c = fresh(salt_opts, reader)
        assert sorted(c.list("keys")) == before, reader
        assert {m: c.fetch("keys", m) for m in exact} == before_vals, reader
    # Salt truncates: keycache reads what mmap_key wrote under the truncated id
    mk = fresh(salt_opts, "mmap_key")
    mk.store("keys", exact[0] + "zz", {"state": "rejected", "pub": "truncated by salt"})
    kc = fresh(salt_opts, "keycache")
    assert kc.fetch("keys", exact[0]) == {"state": "rejected", "pub": "truncated by salt"}


INVALID_IDS = ["../x", "a/b", "", "..", ".", "a\\b", "a\0b", "/abs"]


def test_invalid_ids_alike(salt_opts):
    """Every op on an invalid minion id answers the same in both drivers (SaltCacheError
    in Salt for the keys and denied_keys banks); nothing is written."""
    kc = fresh(salt_opts, "keycache")
    mk = fresh(salt_opts, "mmap_key")
    kc.store("keys", "good", {"state": "accepted", "pub": "P"})
    got = {}
    for drv, cache in (("keycache", kc), ("mmap_key", mk)):
        for bank in ("keys", "denied_keys"):
            data = {"state": "accepted", "pub": "P"} if bank == "keys" else ["P"]
            for mid in INVALID_IDS:
                got[(drv, bank, mid, "store")] = outcome(cache.store, bank, mid, data)
                for op in ("fetch", "contains", "updated", "flush"):
                    got[(drv, bank, mid, op)] = outcome(getattr(cache, op), bank, mid)
    differ = [
        f"{k[1:]}: keycache {got[k]!r} mmap_key {got[('mmap_key',) + k[1:]]!r}"
        for k in got
        if k[0] == "keycache" and got[k] != got[("mmap_key",) + k[1:]]
    ]
    assert not differ, "\n".join(differ)
    assert all(v == ("raise", "SaltCacheError") for v in got.values()), got
    for drv in DRIVERS:
        c = fresh(salt_opts, drv)
        assert list(c.list("keys")) == ["good"], drv
        assert list(c.list("denied_keys")) == [], drv
    pki = salt_opts["pki_dir"]
    for path in (os.path.join(os.path.dirname(pki), "x"), os.path.join(pki, "x"), "/abs"):
        assert not os.path.lexists(path), path


def test_master_keys_names_alike(salt_opts):
    """master_keys takes names with '/' (peers/<id>.pub) and private PEM values,
    written through either driver, read through both; odd names answer alike."""
    rng = random.Random(0x13F)
    model = Model()
    names = ["peers/m2.pub", "peers/sub/m3.pub", "peers/ünï.pub", "master.pem", "master.pub", "m1_pubkey_signature"]
    for i, name in enumerate(names):
        writer = fresh(salt_opts, DRIVERS[i % 2])
        value = gen_private(rng, name) if name.endswith(".pem") else gen_pub(rng, name)
        model.write(writer, "master_keys", name, value)
    assert_reads_alike(salt_opts, model, "master_keys", {"master_keys": ["peers/none.pub"]})
    # names Salt does not check in this bank: both drivers answer alike
    odd = ["../outside.pem", "peers/../../x.pub"]
    got = {}
    for drv in DRIVERS:
        c = fresh(salt_opts, drv)
        for name in odd:
            got[(drv, name, "store")] = outcome(c.store, "master_keys", name, "V")
            got[(drv, name, "fetch")] = outcome(fresh(salt_opts, drv).fetch, "master_keys", name)
            got[(drv, name, "flush")] = outcome(fresh(salt_opts, drv).flush, "master_keys", name)
    differ = [
        f"{k[1:]}: keycache {got[k]!r} mmap_key {got[('mmap_key',) + k[1:]]!r}"
        for k in got
        if k[0] == "keycache" and got[k] != got[("mmap_key",) + k[1:]]
    ]
    assert not differ, "\n".join(differ)
    pki = salt_opts["pki_dir"]
    assert not os.path.lexists(os.path.join(os.path.dirname(pki), "outside.pem"))


def test_edge_values_alike(salt_opts):
    """Empty and odd values written through each driver read back alike in both."""
    cases = [
        ("keys", "empty-pub", {"state": "accepted", "pub": ""}),
        ("keys", "nul-pub", {"state": "pending", "pub": "a\0b"}),
        ("keys", "one-char", {"state": "rejected", "pub": "x"}),
        ("denied_keys", "empty-list", []),
        ("denied_keys", "empty-str", [""]),
        ("denied_keys", "two", ["first é", "second"]),
        ("master_keys", "empty.pem", ""),
        ("master_keys", "bytes.pub", "ü".encode()),
    ]
    answers = {}
    for writer in DRIVERS:
        for bank, mid, data in cases:
            key = f"{writer[:2]}-{mid}"
            answers[(writer, bank, mid, "store")] = outcome(fresh(salt_opts, writer).store, bank, key, data)
            for reader in DRIVERS:
                c = fresh(salt_opts, reader)
                answers[(writer, bank, mid, reader)] = (
                    outcome(c.fetch, bank, key),
                    outcome(c.contains, bank, key),
                    key in c.list(bank),
                )
    differ = []
    for bank, mid, _ in cases:
        ref = answers[("mmap_key", bank, mid, "mmap_key")]
        for writer in DRIVERS:
            if answers[(writer, bank, mid, "store")] != answers[("mmap_key", bank, mid, "store")]:
                differ.append(f"store {bank}/{mid} by {writer}: {answers[(writer, bank, mid, 'store')]!r}")
            for reader in DRIVERS:
                if answers[(writer, bank, mid, reader)] != ref:
                    differ.append(
                        f"{bank}/{mid} written by {writer}, read by {reader}: "
                        f"{answers[(writer, bank, mid, reader)]!r} != mmap_key's {ref!r}"
                    )
    assert not differ, "\n".join(differ)


def test_salt_stale_roster_entries(salt_opts, keycache_bin):
    """Salt's same-handle flush leaves the deleted slot listed in the roster (its
    tombstone is appended, not written over the entry).  keycache reads such a
    store like mmap_key does, and after keycache writes (into the same slots,
    by storing the flushed ids again) neither driver lists an id twice and the
    banks verify clean."""
    rng = random.Random(0x140)
    model = Model()
    mk = fresh(salt_opts, "mmap_key")
    taken = set()
    ids = [gen_id(rng, taken, salt_opts["mmap_key_id_size"]) for _ in range(30)]
    for mid in ids:
        model.write(mk, "keys", mid, ("accepted", gen_pub(rng, mid)))
    for mid in ids[:8]:
        model.flush(mk, "keys", mid)  # same handle: stale roster entries
    assert_reads_alike(salt_opts, model, "after Salt's same-handle flushes", ABSENT)
    kc = new_cache(salt_opts, "keycache")
    for mid in ids[:8]:
        model.write(kc, "keys", mid, ("pending", gen_pub(rng, "back " + mid)))
    assert_reads_alike(salt_opts, model, "after keycache stored the flushed ids again", ABSENT)
    res = run_cli(keycache_bin, salt_opts, "verify", salt_opts["pki_dir"], "--tree", "never")
    assert res.returncode == 0, f"keycache verify exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
