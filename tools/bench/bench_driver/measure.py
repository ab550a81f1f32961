"""The measurements: timing loops, the sign-in pair, listings and stores
through Salt's Cache and directly, one size of one round after another."""

import gc
import os
import random
import shutil
import statistics
import time

from .common import FLOOR, FLOOR_OWN, PEM_POOL, log
from .data import STATE_OF_DIR, prepare_size, work_copy
from .drivers import SALT_NAME, load_module
from .etcd import DRIVER as ETCD, Replica
from .report import fmt_time


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
    if ETCD in drivers and "keycache" not in need_mmap:
        need_mmap.append("keycache")  # the replica starts as a copy of keycache's store
    pop, paths = prepare_size(args, gen, pems, n, need_mmap)
    replica = None
    try:
        if ETCD in drivers:
            log(f"n={n}: starting etcd, seeding it and the replicator for {ETCD}")
            replica = Replica(args, env.tmp, paths["base"], paths["keycache"], paths["size"])
            replica.start()
        _bench_size(args, env, pems, n, results, pop, paths, replica)
    finally:
        if replica is not None:
            replica.stop()


def _bench_size(args, env, pems, n, results, pop, paths, replica):
    drivers = args.drivers
    size = paths["size"]
    tests = args.only
    localfs = "localfs_key" in drivers and n <= args.localfs_max
    if "localfs_key" in drivers and not localfs:
        results.notes.append(f"n={n}: localfs_key not measured (--localfs-max {args.localfs_max})")
    rd = [d for d in drivers if d != "localfs_key" or localfs]

    pki = {"noop": paths["tree"], "keycache": paths["keycache"], "mmap_key": paths["mmap_key"],
           "localfs_key": paths["tree"]}
    extra = {}
    if replica is not None:
        # The replica's directory is the master's own pki_dir, as etcd mode needs.
        pki[ETCD] = replica.replica
        extra[ETCD] = replica.opts()
    caches = {d: env.cache(SALT_NAME[d], pki[d], size, **extra.get(d, {})) for d in rd}

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
        if ETCD in rd:
            results.notes.append(f"n={n}: {ETCD} not measured in `direct` (its reads are keycache's)")
        for d in rd:
            if d == ETCD:
                continue
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
            if d in ("localfs_key", ETCD):
                # keycache-etcd writes into its replica (a copy already), through etcd.
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
            # Python's floor, every round beside the drivers: the dict list_all
            # returns, built in Python from ready lists (ids, states and keys as
            # str objects already); recorded as the driver "floor".
            ready = [(pop.ids[i], STATE_OF_DIR[pop.dirs[i]], pems[pop.pem_index(i)]) for i in in_keys]
            results.add(n, "list_all keys", FLOOR, per_call(lambda: {k: {'state': s} for k, s, _ in ready}, secs))
            results.add(n, "list_all keys+data", FLOOR,
                        per_call(lambda: {k: {'state': s, 'pub': p} for k, s, p in ready}, secs))
            # p[:1] + p[1:]: an equal str, a new object.
            own = [(k, s, p[:1] + p[1:]) for k, s, p in ready]
            results.add(n, "list_all keys+data", FLOOR_OWN,
                        per_call(lambda: {k: {'state': s, 'pub': p} for k, s, p in own}, secs))
            del ready, own
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

    if ETCD in wcaches and replica is not None and replica.seeded is not None:
        # Every new key stored through the driver is in etcd (the replaces add none).
        want = replica.seeded + args.rounds * args.store_count
        got = replica.count()
        if got != want:
            results.errors.append(f"n={n} {ETCD}: etcd holds {got} keys under the prefix, want {want} "
                                  f"(seeded {replica.seeded} + {args.rounds} x {args.store_count} new)")
        else:
            results.notes.append(f"n={n}: {ETCD}: etcd holds the {replica.seeded} seeded keys and the "
                                 f"{args.rounds * args.store_count} stored through the driver")
    for d in list(wcaches):
        if d not in ("localfs_key", "noop", ETCD):
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
