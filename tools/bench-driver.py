#!/usr/bin/env python3
"""Compare Salt key cache drivers as a Salt master calls them.

Run with the venv's python (the one with salt==3008.5 and saltext.keycache):

    .venv/bin/python tools/bench-driver.py [--sizes 10000,100000] [--rounds 3]
        [--seconds 0.5] [--only pair,direct,list,store] [--drivers ...]
        [--data DIR] [--json] [--cpu N] [--localfs-max N] [--store-count 10000]

Drivers, each on its own store holding the same minion keys:

  noop         a do-nothing driver (a module written into a temp module dir, found by
               Salt's loader through opts `module_dirs`): functions returning fixed
               values. Salt's dispatch alone, the floor no driver can beat.
  keycache     saltext.keycache (`keys.cache_driver: keycache`), on a store written by
               `keycache migrate`; keycache_tree left at its default.
  mmap_key     Salt 3008.5's own mmap_key, on a store written by `keycache migrate`
               (the same layout).
  localfs_key  Salt's default driver, on the legacy tree itself.

Data: N minion ids like `web-0012345.dc1.example.com` (the ids and state split of
tools/gen-pki-tree.py: 90% accepted, 5% pending, 3% rejected, 2% denied), each with a
real RSA-2048 public key PEM (451 bytes, as Salt writes minion.pub) drawn from a pool of
256 keys generated once (generating N keys would take too long). The tree is written
once per size; keycache's and mmap_key's stores are `keycache migrate` of that tree.
With --data DIR everything is kept there and reused by later runs; without it, a temp dir
is used and removed at the end.

Measurements (each round runs every measurement for every driver, the drivers' order
rotating from round to round; figures are medians over the rounds):

  pair     the sign-in pair, `fetch("keys", id)` + `fetch("denied_keys", id)`, through
           `salt.cache.Cache(opts, driver=D)` as AuthFuncs._auth does, over random ids of
           the keys bank.
  direct   the same pair called on the driver module directly (no loader): mmap_key's and
           localfs_key's module functions, keycache's shim module functions and its
           native module's calls, the do-nothing functions.
  list     `list_all("keys")` without and with data (salt-key -L, glob targeting) and
           `list("denied_keys")`, through Cache.
  store    through Cache: `store("keys", id, accepted)` over existing accepted ids (a
           replace), and --store-count new ids stored one by one (a cluster join). Writes
           go to copies of the stores made for the run (and new tree files are removed
           after each round), so the kept stores stay as generated.

Output: a table (markdown) with the median per driver, keycache's ratio against each
driver, and the target of each line; --json prints every sample and median as one JSON
document on stdout instead (the table then goes to stderr). The exit status is non-zero
only on errors (a driver failing or answering differently from the others); targets are
reported, not asserted.
"""

import argparse
import gc
import importlib.util
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PEM_POOL = 256
SEED = 1
ALL_DRIVERS = ("noop", "keycache", "mmap_key", "localfs_key")
ALL_TESTS = ("pair", "direct", "list", "store")
NOOP_MODULE = "noop_key"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_pki_tree", os.path.join(HERE, "gen-pki-tree.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pem_pool(data_dir):
    """PEM_POOL real RSA-2048 public keys (str), generated once and kept in data_dir."""
    path = os.path.join(data_dir, f"pems-{PEM_POOL}.json")
    if os.path.exists(path):
        with open(path, encoding="ascii") as fh:
            pems = json.load(fh)
        if len(pems) == PEM_POOL:
            return pems
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    t0 = time.monotonic()
    pems = []
    for _ in range(PEM_POOL):
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pems.append(
            key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode("ascii")
        )
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as fh:
        json.dump(pems, fh)
    os.replace(tmp, path)
    log(f"generated {PEM_POOL} RSA-2048 keys in {time.monotonic() - t0:.1f} s")
    return pems


class Population:
    """The ids and states of one size (a function of n and SEED), as gen-pki-tree draws them."""

    def __init__(self, gen, n):
        rng = random.Random(SEED)
        names = [r for r, _ in gen.ROLES]
        weights = [w for _, w in gen.ROLES]
        roles = rng.choices(names, weights, k=n)
        dcs = rng.choices((1, 2, 3, 4), k=n)
        self.ids = [f"{roles[i]}-{i + 1:07d}.dc{dcs[i]}.example.com" for i in range(n)]
        per_state = gen.split_counts(n, [0.9, 0.05, 0.03, 0.02])
        primary = []
        for d, c in zip(gen.STATE_DIRS, per_state):
            primary.extend([d] * c)
        rng.shuffle(primary)
        self.dirs = primary
        self.n = n

    def pem_index(self, i):
        return (i * 7919) % PEM_POOL


STATE_OF_DIR = {"minions": "accepted", "minions_pre": "pending", "minions_rejected": "rejected"}


def table_size(n):
    """mmap_key_size: Salt's default 1,000,000 up to 450k minions (the table stays under half
    full with the keys a run adds), else about 2.1 slots per key (what `keycache migrate`
    suggests; 2,100,000 for 1M minions)."""
    return 1_000_000 if n <= 450_000 else int(round(n * 2.1, -5))


def write_tree(gen, pop, pems, tree):
    if os.path.exists(tree):
        shutil.rmtree(tree)
    os.makedirs(tree, 0o755)
    t0 = time.monotonic()
    w = gen.Writer(tree)
    raw = [p.encode("ascii") for p in pems]
    try:
        for i, mid in enumerate(pop.ids):
            w.write(pop.dirs[i], mid, raw[pop.pem_index(i)])
    finally:
        w.close()
    log(f"  wrote the tree of {pop.n} keys in {time.monotonic() - t0:.1f} s")


def migrate(keycache_bin, tree, out, size):
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out, 0o700)
    cmd = [keycache_bin, "migrate", tree, "--out", out, "--size", str(size), "--no-master-keys", "--json"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    log(f"  keycache migrate -> {out} in {time.monotonic() - t0:.1f} s")


def prepare_size(args, gen, pems, n, need_mmap):
    """Make (or reuse) the tree and the migrated stores of size n; return their paths."""
    base = os.path.join(args.data, f"n{n}")
    os.makedirs(base, exist_ok=True)
    pop = Population(gen, n)
    size = table_size(n)
    params = {"n": n, "seed": SEED, "pems": PEM_POOL, "version": 1}
    paths = {"base": base, "tree": os.path.join(base, "tree"), "size": size}
    marker = os.path.join(base, "ready-tree.json")

    def ready(m, extra=None):
        want = dict(params, **(extra or {}))
        try:
            with open(m, encoding="utf-8") as fh:
                return json.load(fh) == want
        except (OSError, ValueError):
            return False

    def mark(m, extra=None):
        with open(m, "w", encoding="utf-8") as fh:
            json.dump(dict(params, **(extra or {})), fh)

    if not ready(marker):
        for f in os.listdir(base):
            if f.startswith("ready-"):
                os.unlink(os.path.join(base, f))
        log(f"n={n}: generating the tree")
        write_tree(gen, pop, pems, paths["tree"])
        mark(marker)
    for name in ("mmap_key", "keycache"):
        out = os.path.join(base, name)
        paths[name] = out
        if name not in need_mmap:
            continue
        m = os.path.join(base, f"ready-{name}.json")
        if not ready(m, {"size": size}):
            log(f"n={n}: migrating the tree for {name}")
            migrate(args.keycache_bin, paths["tree"], out, size)
            if name == "keycache":
                # keycache keeps the legacy tree in step in its pki dir: give it the (empty)
                # state directories a master's pki dir has.
                for d in gen.STATE_DIRS:
                    os.makedirs(os.path.join(out, d), 0o755, exist_ok=True)
            mark(m, {"size": size})
    return pop, paths


def work_copy(src, dst):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    subprocess.run(["cp", "-a", "--sparse=always", src, dst], check=True, timeout=1800)


# ---------------------------------------------------------------------------
# Drivers
# ---------------------------------------------------------------------------

NOOP_SOURCE = '''"""Do-nothing keys cache driver: what Salt's dispatch costs on its own."""

__func_alias__ = {"list_": "list", "flush_": "flush"}

_PUB = %r


def init_kwargs(kwargs):
    return {"cachedir": __opts__["pki_dir"], "user": __opts__.get("user")}


def store(bank, key, data, cachedir, **kwargs):
    return None


def fetch(bank, key, cachedir, **kwargs):
    if bank == "keys":
        return {"state": "accepted", "pub": _PUB}
    return {}


def updated(bank, key, cachedir, **kwargs):
    return None


def flush_(bank, key=None, cachedir=None, **kwargs):
    return True


def list_(bank, cachedir, **kwargs):
    return []


def list_all(bank, cachedir, include_data=False, **kwargs):
    return {}


def contains(bank, key, cachedir, **kwargs):
    return False
'''


class Env:
    """Salt opts and modules shared by the drivers."""

    def __init__(self, tmp, pem, args):
        import salt.config  # noqa: F401  (sets up Salt)
        import logging

        logging.getLogger().setLevel(logging.ERROR)
        self.moddir = os.path.join(tmp, "modules")
        os.makedirs(os.path.join(self.moddir, "cache"), exist_ok=True)
        with open(os.path.join(self.moddir, "cache", NOOP_MODULE + ".py"), "w", encoding="utf-8") as fh:
            fh.write(NOOP_SOURCE % pem)
        self.base = salt.config.master_config(None)
        self.tmp = tmp
        self.args = args

    def opts(self, pki_dir, size, **extra):
        o = dict(self.base)
        o.update(
            {
                "pki_dir": pki_dir,
                "cachedir": os.path.join(self.tmp, "cachedir"),
                "extension_modules": os.path.join(self.tmp, "extmods"),
                "module_dirs": [self.moddir],
                "mmap_key_size": size,
                "mmap_key_slot_size": 96,
                "mmap_key_id_size": 64,
                "user": None,
                "cluster_id": None,
            }
        )
        o.update(extra)
        return o

    def cache(self, driver, pki_dir, size, **extra):
        import salt.cache

        opts = self.opts(pki_dir, size, **extra)
        c = salt.cache.Cache(opts, driver=driver)
        if f"{driver}.fetch" not in c.modules:
            raise BenchError(f"Salt's loader did not find the cache driver {driver!r}")
        return c


SALT_NAME = {"noop": NOOP_MODULE, "keycache": "keycache", "mmap_key": "mmap_key", "localfs_key": "localfs_key",
             "keycache_notree": "keycache"}


def load_module(env, driver, pki_dir, size):
    """The driver's module imported directly (not through the loader), __opts__ set as
    salt/runners/pki.py does for mmap_key. Returns (module, kwargs for its calls)."""
    opts = env.opts(pki_dir, size)
    if driver == "noop":
        spec = importlib.util.spec_from_file_location(
            "bench_noop_key", os.path.join(env.moddir, "cache", NOOP_MODULE + ".py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    elif driver == "keycache":
        import saltext.keycache.cache.keycache as mod  # noqa: F811
    else:
        mod = importlib.import_module(f"salt.cache.{driver}")
    mod.__opts__ = opts
    kwargs = mod.init_kwargs({}) if hasattr(mod, "init_kwargs") else {"cachedir": pki_dir}
    return mod, kwargs


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def per_op(batch, chunks, seconds, per_chunk):
    """Run batch(chunk) over the chunks (cycling) until `seconds` have passed; return
    seconds per item."""
    gc.collect()
    n = 0
    i = 0
    t0 = time.perf_counter()
    while True:
        batch(chunks[i % len(chunks)])
        i += 1
        n += per_chunk
        el = time.perf_counter() - t0
        if el >= seconds:
            return el / n


def per_call(fn, seconds, min_calls=1):
    gc.collect()
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - t0
        if n >= min_calls and el >= seconds:
            return el / n


def pair_batch_cache(cache):
    fetch = cache.fetch

    def batch(ids):
        for mid in ids:
            fetch("keys", mid)
            fetch("denied_keys", mid)
    return batch


def pair_batch_module(mod, kwargs):
    fetch = mod.fetch
    cachedir = kwargs["cachedir"]
    extra = {k: v for k, v in kwargs.items() if k != "cachedir"}

    def batch(ids):
        for mid in ids:
            fetch("keys", mid, cachedir, **extra)
            fetch("denied_keys", mid, cachedir, **extra)
    return batch


def native_pair_batches(mod, kwargs):
    """keycache's native calls, on the `_native.Driver` the shim opens for the directory:
    `Driver.fetch` twice, and `Driver.fetch_pair` when the native module has one;
    returns {label: batch}."""
    cachedir = kwargs["cachedir"]
    drv = mod._drivers.get(cachedir) or mod._open(cachedir)  # pylint: disable=protected-access
    fetch = drv.fetch

    def batch(ids):
        for mid in ids:
            fetch("keys", mid)
            fetch("denied_keys", mid)
    out = {"native Driver.fetch": batch}
    pair = getattr(drv, "fetch_pair", None)
    if pair is not None:
        def batch_pair(ids):
            for mid in ids:
                pair(mid)
        out["native Driver.fetch_pair"] = batch_pair
    return out


class Results:
    def __init__(self):
        self.samples = {}  # (n, test, driver) -> [seconds per op]
        self.errors = []
        self.notes = []

    def add(self, n, test, driver, value):
        self.samples.setdefault((n, test, driver), []).append(value)

    def median(self, n, test, driver):
        s = self.samples.get((n, test, driver))
        return statistics.median(s) if s else None


def rotate(seq, k):
    k %= max(1, len(seq))
    return list(seq[k:]) + list(seq[:k])


def check_equal(results, what, got):
    """got: {driver: value}; every driver but noop must answer the same."""
    ref_name, ref = None, None
    for d, v in got.items():
        if d == "noop":
            continue
        if ref_name is None:
            ref_name, ref = d, v
        elif v != ref:
            results.errors.append(f"{what}: {d} answered {str(v)[:300]!r}, {ref_name} answered {str(ref)[:300]!r}")


def bench_size(args, env, gen, pems, n, results):
    drivers = args.drivers
    need_mmap = [d for d in drivers if d in ("mmap_key", "keycache")]
    pop, paths = prepare_size(args, gen, pems, n, need_mmap)
    size = paths["size"]
    tests = args.only
    localfs = "localfs_key" in drivers and n <= args.localfs_max
    if "localfs_key" in drivers and not localfs:
        results.notes.append(f"n={n}: localfs_key not measured (--localfs-max {args.localfs_max})")
    rd = [d for d in drivers if d != "localfs_key" or localfs]

    pki = {"noop": paths["tree"], "keycache": paths["keycache"], "mmap_key": paths["mmap_key"],
           "localfs_key": paths["tree"]}
    caches = {d: env.cache(SALT_NAME[d], pki[d], size) for d in rd}

    rng = random.Random(n)
    in_keys = [i for i in range(n) if pop.dirs[i] != "minions_denied"]
    sample = rng.sample(in_keys, min(len(in_keys), 20000))
    chunk = 200
    id_chunks = [[pop.ids[i] for i in sample[j:j + chunk]] for j in range(0, len(sample), chunk)]
    accepted = [i for i in sample if pop.dirs[i] == "minions"]

    # Correctness first: every driver answers the same for a few ids and for the lists.
    for i in sample[:50]:
        mid = pop.ids[i]
        want = {"state": STATE_OF_DIR[pop.dirs[i]], "pub": pems[pop.pem_index(i)]}
        for d in rd:
            if d == "noop":
                continue
            try:
                got = caches[d].fetch("keys", mid)
                den = caches[d].fetch("denied_keys", mid)
            except Exception as exc:  # pylint: disable=broad-except
                results.errors.append(f"n={n} {d}: fetch {mid!r} raised {exc!r}")
                continue
            if got != want:
                results.errors.append(f"n={n} {d}: fetch('keys', {mid!r}) = {str(got)[:200]!r}, want {want['state']}")
            if den:
                results.errors.append(f"n={n} {d}: fetch('denied_keys', {mid!r}) = {den!r}, want nothing")

    direct = {}
    if "direct" in tests:
        for d in rd:
            try:
                mod, kw = load_module(env, d, pki[d], size)
            except Exception as exc:  # pylint: disable=broad-except
                results.errors.append(f"n={n} {d}: cannot import its module directly: {exc!r}")
                continue
            direct[d] = pair_batch_module(mod, kw)
            if d == "keycache":
                for label, b in native_pair_batches(mod, kw).items():
                    direct[f"keycache {label}"] = b

    # Stores for the writes: copies made for this run.
    wcaches = {}
    if "store" in tests:
        wd = [d for d in rd if d != "noop"] + (["keycache_notree"] if "keycache" in rd else [])
        for d in wd:
            if d == "localfs_key":
                wcaches[d] = caches[d]
                continue
            src = paths["keycache" if d.startswith("keycache") else d]
            dst = os.path.join(paths["base"], f"work-{d}")
            log(f"n={n}: copying the {d} store for the writes")
            work_copy(src, dst)
            extra = {"keycache_tree": False} if d == "keycache_notree" else {}
            if d == "keycache":
                # The replaces below rewrite minions/<id> of keys a master's tree holds.
                mdir = os.path.join(dst, "minions")
                for i in accepted:
                    with open(os.path.join(mdir, pop.ids[i]), "wb") as fh:
                        fh.write(pems[pop.pem_index(i)].encode("ascii"))
            wcaches[d] = env.cache(SALT_NAME[d], dst, size, **extra)
        wcaches["noop"] = caches["noop"] if "noop" in rd else None
        if wcaches["noop"] is None:
            del wcaches["noop"]

    secs = args.seconds
    for r in range(args.rounds):
        t_round = time.monotonic()
        if "pair" in tests:
            for d in rotate(rd, r):
                try:
                    results.add(n, "pair", d, per_op(pair_batch_cache(caches[d]), id_chunks, secs, chunk))
                except Exception as exc:  # pylint: disable=broad-except
                    results.errors.append(f"n={n} pair {d}: {exc!r}")
        if "direct" in tests:
            for d in rotate(list(direct), r):
                try:
                    results.add(n, "direct", d, per_op(direct[d], id_chunks, secs, chunk))
                except Exception as exc:  # pylint: disable=broad-except
                    results.errors.append(f"n={n} direct {d}: {exc!r}")
        if "list" in tests:
            for test, fn in (
                ("list_all keys", lambda c: c.list_all("keys", include_data=False)),
                ("list_all keys+data", lambda c: c.list_all("keys", include_data=True)),
                ("list denied_keys", lambda c: c.list("denied_keys")),
            ):
                answers = {}
                for d in rotate(rd, r):
                    box = []

                    def call(c=caches[d], box=box, fn=fn):
                        box[:] = [fn(c)]
                    try:
                        results.add(n, test, d, per_call(call, secs))
                    except Exception as exc:  # pylint: disable=broad-except
                        results.errors.append(f"n={n} {test} {d}: {exc!r}")
                        continue
                    v = box[0]
                    if r == 0:
                        answers[d] = summarize_list(test, v)
                    box.clear()
                    del v
                if r == 0:
                    check_equal(results, f"n={n} {test}", answers)
            if r == 0:
                # Python's floor: build the dict list_all returns from ready data.
                ready = [(pop.ids[i], STATE_OF_DIR[pop.dirs[i]], pems[pop.pem_index(i)]) for i in in_keys]
                results.notes.append(
                    f"n={n}: building list_all's dict in Python from ready lists: "
                    f"{fmt_time(per_call(lambda: {k: {'state': s} for k, s, _ in ready}, secs))} without data, "
                    f"{fmt_time(per_call(lambda: {k: {'state': s, 'pub': p} for k, s, p in ready}, secs))} with data")
                del ready
        if "store" in tests:
            for d in rotate(list(wcaches), r):
                c = wcaches[d]
                acc = accepted[(r * 997) % max(1, len(accepted)):] + accepted
                acc_chunks = [[(pop.ids[i], pems[pop.pem_index(i)]) for i in acc[j:j + 50]] for j in range(0, 1000, 50)]

                def store_batch(items, c=c):
                    st = c.store
                    for mid, pem in items:
                        st("keys", mid, {"state": "accepted", "pub": pem})
                try:
                    results.add(n, "store replace", d, per_op(store_batch, acc_chunks, secs, 50))
                except Exception as exc:  # pylint: disable=broad-except
                    results.errors.append(f"n={n} store replace {d}: {exc!r}")
                new = [(f"join-r{r}-{j:06d}.dc9.example.com", pems[j % PEM_POOL]) for j in range(args.store_count)]
                gc.collect()
                t0 = time.perf_counter()
                try:
                    store_batch(new)
                    results.add(n, f"store {args.store_count} new", d, (time.perf_counter() - t0) / len(new))
                except Exception as exc:  # pylint: disable=broad-except
                    results.errors.append(f"n={n} store new {d}: {exc!r}")
                if r == 0 and d != "noop":
                    mid, pem = new[-1]
                    got = c.fetch("keys", mid)
                    if got != {"state": "accepted", "pub": pem}:
                        results.errors.append(f"n={n} {d}: after store, fetch {mid!r} = {str(got)[:200]!r}")
                if d == "localfs_key":
                    for mid, _ in new:
                        try:
                            os.unlink(os.path.join(paths["tree"], "minions", mid))
                        except FileNotFoundError:
                            pass
        log(f"n={n}: round {r + 1}/{args.rounds} done in {time.monotonic() - t_round:.1f} s")

    for d in list(wcaches):
        if d not in ("localfs_key", "noop"):
            shutil.rmtree(os.path.join(paths["base"], f"work-{d}"), ignore_errors=True)
    for c in list(caches.values()) + list(wcaches.values()):
        c.destroy()


def summarize_list(test, v):
    if test == "list denied_keys":
        try:
            return sorted(v)
        except TypeError:
            return repr(type(v))
    if not isinstance(v, dict):
        return repr(type(v))
    with_data = test.endswith("+data")
    h = 0
    for k, x in v.items():
        if with_data:
            h ^= hash((k, x.get("state"), x.get("pub", "").strip()))
        else:
            h ^= hash((k, tuple(sorted(x.items()))))
    return (len(v), h)


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def fmt_time(s):
    if s is None:
        return "—"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.2f} µs"


def fmt_rate(s, unit):
    if s is None:
        return "—"
    r = 1 / s
    if r >= 1e6:
        txt = f"{r / 1e6:.2f} M "
    elif r >= 1e3:
        txt = f"{r / 1e3:.1f} k "
    else:
        txt = f"{r:.0f} "
    return f"{txt}{unit}/s ({fmt_time(s)})"


def fmt_x(a, b):
    """b ÷ a: how many times faster a is than b."""
    if a is None or b is None or a <= 0:
        return "—"
    x = b / a
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x" if x < 100 else f"{x:.0f}x"


TESTS = (
    # (test key, label, unit (rate) or None (time per call))
    ("pair", "sign-in pair via Cache", "pairs"),
    ("direct", "sign-in pair, direct call", "pairs"),
    ("list_all keys", "list_all('keys') via Cache", None),
    ("list_all keys+data", "list_all('keys', include_data=True) via Cache", None),
    ("list denied_keys", "list('denied_keys') via Cache", None),
    ("store replace", "store of an accepted key (replace) via Cache", "stores"),
    ("store new", "store of new keys one by one via Cache", "keys"),
)


def target_of(test, kc, res_get):
    """(target text, met: True/False/None)."""
    mk = res_get("mmap_key")
    lf = res_get("localfs_key")
    noop = res_get("noop")
    if test == "pair":
        ok = None if kc is None or noop is None else kc <= 1.3 * noop
        return "keycache's time <= 1.3x the do-nothing driver's", ok
    if test == "direct":
        ok = None if kc is None or mk is None else mk / kc >= 20
        return ">= 20x mmap_key's pair", ok
    if test in ("list_all keys", "list_all keys+data"):
        oks = []
        if kc is not None and mk is not None:
            oks.append(mk / kc >= 15)
        if kc is not None and lf is not None:
            oks.append(lf / kc >= 100)
        return ">= 15x mmap_key and >= 100x localfs_key", (all(oks) if oks else None)
    return "reported (against mmap_key)", None


def report(args, results):
    lines = []
    sizes = sorted({k[0] for k in results.samples})
    header = "| minions | measurement | do-nothing | keycache | mmap_key | localfs_key | keycache's time ÷ do-nothing's | mmap_key's time ÷ keycache's | localfs_key's time ÷ keycache's | target | met |"
    lines.append(header)
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    store_new = f"store {args.store_count} new"
    rows_json = []
    for n in sizes:
        for test, label, unit in TESTS:
            key = store_new if test == "store new" else test
            variants = [("keycache", " (keycache: its shim module's functions)" if test == "direct" else "")]
            if test == "direct":
                variants += [(d, f" ({d[len('keycache '):]})") for d in sorted({k[2] for k in results.samples if k[0] == n and k[1] == key and k[2].startswith("keycache ")})]
            if test.startswith("store"):
                variants.append(("keycache_notree", " (keycache_tree: False)"))
            for kcname, suffix in variants:
                def get(d, n=n, key=key):
                    return results.median(n, key, d)
                kc = get(kcname)
                if all(get(d) is None for d in ALL_DRIVERS) and kc is None:
                    continue
                if kcname != "keycache" and kc is None:
                    continue
                fmt = (lambda s: fmt_rate(s, unit)) if unit else fmt_time
                lab = label.replace("new keys", f"{args.store_count} new keys") + suffix
                noop_ratio = "—" if kc is None or get("noop") is None else f"{kc / get('noop'):.2f}x"
                tgt, ok = target_of(test, kc, get)
                if kcname != "keycache" and test != "direct":
                    tgt, ok = "reported", None
                met = "—" if ok is None else ("yes" if ok else "**no**")
                lines.append(
                    f"| {n:,} | {lab} | {fmt(get('noop'))} | {fmt(kc)} | {fmt(get('mmap_key'))} | "
                    f"{fmt(get('localfs_key'))} | {noop_ratio} | {fmt_x(kc, get('mmap_key'))} | "
                    f"{fmt_x(kc, get('localfs_key'))} | {tgt} | {met} |")
                rows_json.append({"minions": n, "test": key, "keycache_variant": kcname,
                                  "median_seconds": {d: get(d) for d in ALL_DRIVERS + (kcname,)},
                                  "target": tgt, "met": ok})
    # Lines measured for drivers without keycache (development runs): the table above shows them too.
    text = "\n".join(lines)
    extra = []
    direct_other = sorted({k[2] for k in results.samples if k[1] == "direct" and k[2] not in ALL_DRIVERS and not k[2].startswith("keycache ")})
    if direct_other:
        extra.append(f"other direct lines: {direct_other}")
    for note in results.notes:
        extra.append(f"- {note}")
    if results.errors:
        extra.append("ERRORS:")
        extra.extend(f"- {e}" for e in results.errors)
    return text + ("\n\n" + "\n".join(extra) if extra else ""), rows_json


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000", help="minion counts, comma-separated (default 10000,100000; add 1000000 for 1M)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=0.5, help="seconds per measurement per round (a list is called at least once)")
    p.add_argument("--only", default=",".join(ALL_TESTS), help=f"comma-separated subset of {','.join(ALL_TESTS)}")
    p.add_argument("--drivers", default=",".join(ALL_DRIVERS), help=f"comma-separated subset of {','.join(ALL_DRIVERS)}")
    p.add_argument("--data", help="keep the generated trees and stores here (reused by later runs)")
    p.add_argument("--json", action="store_true", help="print all results as JSON on stdout (the table goes to stderr)")
    p.add_argument("--cpu", type=int, help="pin the process to this CPU")
    p.add_argument("--localfs-max", type=int, default=100000, help="measure localfs_key only up to this many minions (default 100000)")
    p.add_argument("--store-count", type=int, default=10000, help="new keys stored one by one per round (default 10000)")
    default_bin = os.path.join(REPO, "target", "release", "keycache")
    if not os.access(default_bin, os.X_OK):
        default_bin = os.path.join(REPO, "target", "debug", "keycache")
    p.add_argument("--keycache-bin", default=os.environ.get("KEYCACHE_BIN", default_bin))
    a = p.parse_args(argv)
    try:
        a.sizes = [int(s) for s in a.sizes.split(",") if s]
    except ValueError:
        p.error("--sizes: comma-separated integers")
    a.only = [t for t in a.only.split(",") if t]
    a.drivers = [d for d in a.drivers.split(",") if d]
    for t in a.only:
        if t not in ALL_TESTS:
            p.error(f"--only: unknown measurement {t!r}")
    for d in a.drivers:
        if d not in ALL_DRIVERS:
            p.error(f"--drivers: unknown driver {d!r}")
    if a.rounds < 1 or a.seconds <= 0 or not a.sizes or min(a.sizes) < 100:
        p.error("need --rounds >= 1, --seconds > 0 and sizes >= 100")
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if "keycache" in args.drivers:
        try:
            import saltext.keycache._native  # noqa: F401
            import saltext.keycache.cache.keycache  # noqa: F401
        except ImportError as exc:
            log(f"error: the keycache driver is not installed in this Python ({exc}); "
                f"leave it out with --drivers {','.join(d for d in ALL_DRIVERS if d != 'keycache')}")
            return 2
    if any(d in args.drivers for d in ("keycache", "mmap_key")) and not os.access(args.keycache_bin, os.X_OK):
        log(f"error: no keycache binary at {args.keycache_bin} (--keycache-bin)")
        return 2
    # SIGTERM ends the run through the `finally` below, which removes the temp dir.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="bench-driver-")
    own_data = args.data is None
    if own_data:
        args.data = os.path.join(tmp, "data")
    os.makedirs(args.data, exist_ok=True)
    args.data = os.path.abspath(args.data)
    results = Results()
    t0 = time.monotonic()
    try:
        gen = _gen_module()
        pems = pem_pool(args.data)
        env = Env(tmp, pems[0], args)
        for n in args.sizes:
            try:
                bench_size(args, env, gen, pems, n, results)
            except BenchError as exc:
                results.errors.append(f"n={n}: {exc}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the --data dir is elsewhere unless it is ours
    text, rows = report(args, results)
    import salt.version

    meta = {
        "command": " ".join([os.path.basename(sys.executable), "tools/bench-driver.py"] + (argv if argv is not None else sys.argv[1:])),
        "salt": salt.version.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "wall_seconds": round(time.monotonic() - t0, 1),
    }
    head = (f"bench-driver: Salt {meta['salt']}, Python {meta['python']}, {meta['cpus']} CPUs "
            f"(affinity {meta['affinity']}), {args.rounds} rounds x {args.seconds} s, "
            f"medians over rounds; ran {meta['wall_seconds']} s\n")
    if args.json:
        log(head + text)
        json.dump({"meta": meta, "rows": rows,
                   "samples": [{"minions": k[0], "test": k[1], "driver": k[2], "seconds_per_op": v}
                               for k, v in sorted(results.samples.items())],
                   "notes": results.notes, "errors": results.errors}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(head + text)
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
