"""Several processes on one store through the ``keycache`` driver (and Salt's own
``mmap_key`` as one of them), forked the way a Salt master forks its workers:
after a ``Cache`` was created and used in the parent, so each child inherits the
parent's loaded driver and its open stores.

Every value written names its id, state, writer and sequence number, plus a
checksum of those, so a torn or misplaced value is detected on every read.
Every process records each write (store or flush) and each read with its start
and end times (CLOCK_MONOTONIC, shared by all processes of the machine).  At the
end the tests assert:

- no read ever returned a torn value or a value written to another id;
- a process always reads back its own last write to an id only it writes;
- every value read was written, not before the read began, and was not
  certainly overwritten before the read began (the register is linearizable);
  an absent answer is allowed only when the id may have been absent;
- no lost write: each id's final value is a write no other write followed
  (for an id one process owns: exactly its last write), read alike through
  both drivers;
- ``keycache verify`` exits 0 and the key tree agrees with the banks.
"""

import hashlib
import json
import multiprocessing
import os
import random
import threading
import time
import traceback

import salt.cache

from cli_support import run_cli
from tree_files import TREE_DIR, id_problems

CTX = multiprocessing.get_context("fork")
STATES = ("accepted", "pending", "rejected")
PAD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/=é✓中🔑"
RUN_SECONDS = 8.0
MAX_OPS = 1200
JOIN_GRACE = 40.0


# ---------------------------------------------------------------------------
# values that reveal tearing
# ---------------------------------------------------------------------------


class Torn(Exception):
    pass


def make_pub(mid, state, writer, seq, rng):
    pad = "".join(rng.choice(PAD) for _ in range(rng.randrange(0, 400)))
    body = f"{mid}|{state}|{writer}|{seq}|{pad}"
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    return f"-----BEGIN PUBLIC KEY-----\n{body}\n{digest}\n-----END PUBLIC KEY-----\n"


def parse_pub(pub):
    """(id, state, writer, seq) of a value make_pub made; Torn otherwise."""
    if not isinstance(pub, str):
        raise Torn(f"not a str: {type(pub).__name__}")
    lines = pub.split("\n")
    if (
        len(lines) != 5
        or lines[0] != "-----BEGIN PUBLIC KEY-----"
        or lines[3] != "-----END PUBLIC KEY-----"
        or lines[4] != ""
    ):
        raise Torn(f"bad framing: {pub[:80]!r}...{pub[-40:]!r}")
    body, digest = lines[1], lines[2]
    if hashlib.sha256(body.encode()).hexdigest()[:16] != digest:
        raise Torn(f"checksum mismatch: {pub[:80]!r}...")
    mid, state, writer, seq, _ = body.split("|", 4)
    return mid, state, writer, int(seq)


def token_of(bank, mid, value):
    """The (writer, seq) a fetched value carries, None when absent; Torn when the
    value is torn or belongs to another id or state."""
    if bank == "keys":
        if value is None:
            return None
        if not isinstance(value, dict) or set(value) != {"state", "pub"}:
            raise Torn(f"keys/{mid}: bad shape {str(value)[:80]!r}")
        pid, state, writer, seq = parse_pub(value["pub"])
        if pid != mid or state != value["state"]:
            raise Torn(f"keys/{mid}: value of {pid!r}/{state!r} under state {value['state']!r}")
        return [writer, seq]
    if value == {}:
        return None
    if not isinstance(value, list) or len(value) != 1:
        raise Torn(f"denied_keys/{mid}: bad shape {str(value)[:80]!r}")
    pid, state, writer, seq = parse_pub(value[0])
    if pid != mid or state != "denied":
        raise Torn(f"denied_keys/{mid}: value of {pid!r}/{state!r}")
    return [writer, seq]


# ---------------------------------------------------------------------------
# the workers
# ---------------------------------------------------------------------------


def now():
    return time.monotonic()


def run_worker(name, cache, cfg, out_path, may_flush=True):
    """Random ops on own and shared ids until MAX_OPS or the deadline; the log
    and the errors found on the way go to *out_path* (JSON)."""
    rng = random.Random(f"{cfg['seed']}-{name}")
    own = cfg["own"][name]
    shared = cfg["shared"]
    others = [i for n, ids in cfg["own"].items() if n != name for i in ids]
    last = {"keys": {}, "denied_keys": {}}
    for bank, mid, tok in cfg["seeded"]:
        if mid in own:
            last[bank][mid] = tok
    log = []  # [kind, bank, id, token, t0, t1]  kind: w (store), f (flush), r (read)
    errors = []
    seq = 0
    deadline = cfg["start"] + RUN_SECONDS
    ops = 0

    def read(bank, mid):
        t0 = now()
        value = cache.fetch(bank, mid)
        t1 = now()
        try:
            tok = token_of(bank, mid, value)
        except Torn as exc:
            errors.append(f"{name}: torn read {exc}")
            return
        if mid in own and tok != last[bank].get(mid):
            errors.append(f"{name}: read {bank}/{mid} = {tok}, own last write {last[bank].get(mid)}")
        log.append(["r", bank, mid, tok, t0, t1])

    def write(bank, mid):
        nonlocal seq
        seq += 1
        if bank == "keys":
            state = rng.choice(STATES)
            data = {"state": state, "pub": make_pub(mid, state, name, seq, rng)}
        else:
            data = [make_pub(mid, "denied", name, seq, rng)]
        t0 = now()
        cache.store(bank, mid, data)
        t1 = now()
        log.append(["w", bank, mid, [name, seq], t0, t1])
        if mid in own:
            last[bank][mid] = [name, seq]

    def flush(bank, mid):
        t0 = now()
        ret = cache.flush(bank, mid)
        t1 = now()
        log.append(["f", bank, mid, None, t0, t1])
        if mid in own:
            if ret is not (last[bank].get(mid) is not None):
                errors.append(f"{name}: flush {bank}/{mid} returned {ret!r}, own last write {last[bank].get(mid)}")
            last[bank][mid] = None

    def listing():
        t0 = now()
        everything = cache.list_all("keys", include_data=True)
        t1 = now()
        for mid in sorted(set(own) | set(shared)):
            value = everything.get(mid)
            try:
                tok = token_of("keys", mid, value)
            except Torn as exc:
                errors.append(f"{name}: torn list_all entry {exc}")
                continue
            if mid in own and tok != last["keys"].get(mid):
                errors.append(f"{name}: list_all {mid} = {tok}, own last write {last['keys'].get(mid)}")
            log.append(["r", "keys", mid, tok, t0, t1])
        for mid, value in everything.items():
            try:
                token_of("keys", mid, value)
            except Torn as exc:
                errors.append(f"{name}: torn list_all entry {exc}")

    try:
        while ops < MAX_OPS and now() < deadline:
            ops += 1
            r = rng.random()
            if r < 0.30:
                write("keys", rng.choice(own))
            elif r < 0.45:
                write("keys", rng.choice(shared))
            elif r < 0.52:
                write("denied_keys", rng.choice(own + shared))
            elif r < 0.64:
                read("keys", rng.choice(own))
            elif r < 0.78:
                read(rng.choice(["keys", "keys", "denied_keys"]), rng.choice(shared + others))
            elif r < 0.82:
                read("denied_keys", rng.choice(own))
            elif r < 0.86:
                listing()
            elif may_flush and r < 0.92:
                flush("keys", rng.choice(own))
            elif may_flush and r < 0.96:
                flush("keys", rng.choice(shared))
            elif may_flush:
                flush("denied_keys", rng.choice(own + shared))
            else:
                read("keys", rng.choice(own))
    except Exception:  # pylint: disable=broad-except
        errors.append(f"{name}: after {ops} ops: {traceback.format_exc()}")
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump({"name": name, "ops": ops, "log": log, "errors": errors}, fh)


def child_main(name, cache, cfg, out_path, may_flush):
    code = 0
    try:
        run_worker(name, cache, cfg, out_path, may_flush)
    except BaseException:  # pylint: disable=broad-except
        code = 3
        traceback.print_exc()
    os._exit(code)


def start_children(specs):
    """Fork one child per (name, cache, cfg, out_path, may_flush)."""
    procs = []
    for spec in specs:
        p = CTX.Process(target=child_main, args=spec, name=f"kc-{spec[0]}", daemon=True)
        p.start()
        procs.append(p)
    return procs


def join_all(procs, timeout):
    """Join within *timeout*; kill and report the ones still running."""
    end = time.monotonic() + timeout
    hung = []
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            hung.append(p.name)
    stop_all(procs)
    return hung


def stop_all(procs):
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


# ---------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------


def fresh(opts, driver):
    cache = salt.cache.Cache(opts, driver=driver)
    if driver == "mmap_key":
        glob = cache.modules["mmap_key.fetch"].func.__globals__
        for handle in list(glob["_caches"].values()):
            handle.close()
        glob["_caches"].clear()
    return cache


def seed(cache, cfg, rng, ids_by_bank):
    """Parent writes before the fork; recorded like the workers' writes."""
    log = []
    seq = 0
    for bank, ids in ids_by_bank.items():
        for mid in ids:
            seq += 1
            if bank == "keys":
                state = rng.choice(STATES)
                data = {"state": state, "pub": make_pub(mid, state, "parent", seq, rng)}
            else:
                data = [make_pub(mid, "denied", "parent", seq, rng)]
            t0 = now()
            cache.store(bank, mid, data)
            log.append(["w", bank, mid, ["parent", seq], t0, now()])
            cfg["seeded"].append([bank, mid, ["parent", seq]])
    return log


def check_history(logs, finals, owners, tolerate_absent_reads=()):
    """Linearizability of each (bank, id) register, and no lost write.

    *logs*: {process: [entries]}; *finals*: {(bank, id): token};
    *owners*: {id: process} for ids one process alone writes."""
    writes = {}
    reads = []
    for proc, entries in logs.items():
        for kind, bank, mid, tok, t0, t1 in entries:
            rec = (kind, tuple(tok) if tok else None, t0, t1, proc)
            if kind in ("w", "f"):
                writes.setdefault((bank, mid), []).append(rec)
            else:
                reads.append((bank, mid) + rec)
    problems = []
    by_token = {}
    for key, ws in writes.items():
        for w in ws:
            if w[0] == "w":
                by_token[(key, w[1])] = w
    for bank, mid, _, tok, r0, r1, proc in reads:
        ws = writes.get((bank, mid), [])
        if tok is not None:
            w = by_token.get(((bank, mid), tuple(tok)))
            if w is None:
                problems.append(f"{proc} read {bank}/{mid} = {tok}: never written to that id")
                continue
            if w[2] > r1:
                problems.append(f"{proc} read {bank}/{mid} = {tok} before it was written")
                continue
            newer = [x for x in ws if x is not w and x[2] >= w[3] and x[3] <= r0]
            if newer:
                problems.append(
                    f"{proc} read {bank}/{mid} = {tok} (stale): {newer[0][0]} {newer[0][1]} by "
                    f"{newer[0][4]} ended {r0 - newer[0][3]:.4f}s before the read began"
                )
        elif proc not in tolerate_absent_reads:
            stores_before = [x for x in ws if x[0] == "w" and x[3] <= r0]
            if not stores_before:
                continue
            ok = False
            for f in ws:
                if f[0] == "f" and f[2] <= r1:
                    if not any(x[0] == "w" and x[2] >= f[3] and x[3] <= r0 for x in ws):
                        ok = True
                        break
            if not ok:
                last = max(stores_before, key=lambda x: x[3])
                problems.append(
                    f"{proc} read {bank}/{mid} as absent; {last[1]} by {last[4]} ended "
                    f"{r0 - last[3]:.4f}s before the read began and no flush could follow it"
                )
    for key, final in finals.items():
        ws = writes.get(key, [])
        if not ws:
            if final is not None:
                problems.append(f"final {key}: {final} but nothing was written")
            continue
        owner = owners.get(key[1])
        if owner is not None and all(w[4] in (owner, "parent") for w in ws):
            last = max(ws, key=lambda w: w[3])
            want = last[1] if last[0] == "w" else None
            if final != want:
                problems.append(f"lost write: final {key} = {final}, last write of its owner {want}")
            continue
        candidates = [w for w in ws if not any(x[2] > w[3] for x in ws)]
        if not any((w[1] if w[0] == "w" else None) == final for w in candidates):
            problems.append(
                f"lost write: final {key} = {final}; possible last writes "
                f"{[(w[0], w[1], w[4]) for w in candidates]}"
            )
    return problems


def final_state(opts, driver, ids):
    cache = fresh(opts, driver)
    out = {}
    torn = []
    for bank in ("keys", "denied_keys"):
        for mid in ids:
            try:
                out[(bank, mid)] = token_of(bank, mid, cache.fetch(bank, mid))
                if out[(bank, mid)] is not None:
                    out[(bank, mid)] = tuple(out[(bank, mid)])
            except Torn as exc:
                torn.append(str(exc))
    listed = {
        bank: cache.list_all(bank, include_data=True) for bank in ("keys", "denied_keys")
    }
    names = {bank: sorted(cache.list(bank)) for bank in ("keys", "denied_keys")}
    return out, torn, listed, names


def tree_problems(opts, ids, cache):
    pki = opts["pki_dir"]
    problems = []
    for mid in sorted(ids):
        want = {}
        entry = cache.fetch("keys", mid)
        if entry:
            want[TREE_DIR[entry["state"]]] = entry["pub"]
        denied = cache.fetch("denied_keys", mid)
        if denied:
            want["minions_denied"] = denied[0]
        problems.extend(id_problems(pki, mid, want))
    return problems


def run_scenario(salt_opts, tmp_path, workers, seed_value):
    """*workers*: {name: driver}.  Returns (cfg, logs, results, all ids)."""
    rng = random.Random(seed_value)
    own = {name: [f"own-{name}-{i:03d}" for i in range(24)] for name in workers}
    shared = [f"shared-{i:03d}" for i in range(16)] + ["shåred-ünï-0", "共享-1"]
    cfg = {"seed": seed_value, "own": own, "shared": shared, "seeded": [], "start": 0.0}
    all_ids = shared + [i for ids in own.values() for i in ids]
    # the parent creates and uses the caches before forking
    caches = {"keycache": salt.cache.Cache(salt_opts, driver="keycache")}
    if "mmap_key" in workers.values():
        caches["mmap_key"] = fresh(salt_opts, "mmap_key")
    seed_ids = {
        "keys": shared[:8] + [ids[i] for ids in own.values() for i in range(0, 24, 3)],
        "denied_keys": shared[:3] + [ids[1] for ids in own.values()],
    }
    parent_log = seed(caches["keycache"], cfg, rng, seed_ids)
    for cache in caches.values():
        assert cache.list_all("keys", include_data=True)
        assert cache.fetch("keys", shared[0]) is not None
        assert cache.list("denied_keys")
    cfg["start"] = now() + 0.2
    procs = []
    try:
        procs = start_children(
            [
                (name, caches[drv], cfg, str(tmp_path / f"{name}.json"), drv == "keycache")
                for name, drv in workers.items()
            ]
        )
        hung = join_all(procs, RUN_SECONDS + JOIN_GRACE)
    finally:
        stop_all(procs)
    assert not hung, f"workers still running after {RUN_SECONDS + JOIN_GRACE}s (killed): {hung}"
    exits = {p.name: p.exitcode for p in procs}
    assert all(code == 0 for code in exits.values()), f"worker exit codes: {exits}"
    results = {}
    for name in workers:
        with open(tmp_path / f"{name}.json", encoding="utf-8") as fh:
            results[name] = json.load(fh)
    errors = [e for r in results.values() for e in r["errors"]]
    assert not errors, f"{len(errors)} errors in the workers:\n" + "\n".join(errors[:15])
    logs = {name: r["log"] for name, r in results.items()}
    logs["parent"] = parent_log
    return cfg, logs, results, all_ids


def assert_final(salt_opts, cfg, logs, all_ids, tolerate_absent_reads=()):
    finals = {}
    listings = {}
    for drv in ("keycache", "mmap_key"):
        finals[drv], torn, listed, names = final_state(salt_opts, drv, all_ids)
        assert not torn, f"{drv} read torn values at the end: {torn[:5]}"
        listings[drv] = (listed, names)
        for bank in ("keys", "denied_keys"):
            dups = sorted({i for i in names[bank] if names[bank].count(i) > 1})
            assert not dups, f"{drv} lists {bank} ids twice: {dups}"
            want = sorted(mid for mid in all_ids if finals[drv][(bank, mid)] is not None)
            assert names[bank] == want, f"{drv} list({bank}) {names[bank]} != fetched {want}"
    assert finals["keycache"] == finals["mmap_key"], "final values differ between the drivers: " + str(
        [k for k in finals["keycache"] if finals["keycache"][k] != finals["mmap_key"].get(k)][:10]
    )
    assert listings["keycache"] == listings["mmap_key"], "list_all/list differ between the drivers"
    owners = {mid: name for name, ids in cfg["own"].items() for mid in ids}
    problems = check_history(logs, finals["keycache"], owners, tolerate_absent_reads)
    assert not problems, f"{len(problems)} history problems:\n" + "\n".join(problems[:15])


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------


def test_forked_keycache_workers(salt_opts, tmp_path, keycache_bin):
    """Four forked processes on one store through the parent's keycache driver."""
    workers = {f"kc{i}": "keycache" for i in range(4)}
    cfg, logs, results, all_ids = run_scenario(salt_opts, tmp_path, workers, 0x5EED1)
    assert all(r["ops"] > 50 for r in results.values()), {n: r["ops"] for n, r in results.items()}
    assert_final(salt_opts, cfg, logs, all_ids)
    res = run_cli(keycache_bin, salt_opts, "verify", salt_opts["pki_dir"])
    assert res.returncode == 0, f"keycache verify exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    problems = tree_problems(salt_opts, all_ids, fresh(salt_opts, "keycache"))
    assert not problems, "key tree:\n" + "\n".join(problems[:15])


def test_forked_workers_with_salt_writer(salt_opts, tmp_path, keycache_bin):
    """Three keycache processes and one Salt mmap_key process (stores, reads,
    list_all; no flushes: in the handle that appended an id, Salt 3008.5's
    flush appends the roster tombstone instead of overwriting the entry, a
    roster damage of Salt's own that `keycache verify` would report) on own
    and shared ids.

    mmap_key keeps no key tree, so the tree is checked for the ids only
    keycache wrote, and `verify --tree always` may disagree only on ids the
    Salt process wrote.  mmap_key's reads may answer "absent" for a value
    another process is rewriting (its checksum check) or just appended (its
    heap mapping is re-opened at most every 0.25 s): those absent answers are
    not held against it; its value answers are checked like keycache's."""
    workers = {"kc0": "keycache", "kc1": "keycache", "kc2": "keycache", "salt": "mmap_key"}
    cfg, logs, results, all_ids = run_scenario(salt_opts, tmp_path, workers, 0x5EED2)
    assert all(r["ops"] > 50 for r in results.values()), {n: r["ops"] for n, r in results.items()}
    assert_final(salt_opts, cfg, logs, all_ids, tolerate_absent_reads=("salt",))
    res = run_cli(keycache_bin, salt_opts, "verify", salt_opts["pki_dir"], "--tree", "never")
    assert res.returncode == 0, f"keycache verify exit {res.returncode}:\n{res.stdout}\n{res.stderr}"
    salt_touched = {e[2] for e in logs["salt"] if e[0] in ("w", "f")}
    kc_only = set(all_ids) - salt_touched
    problems = tree_problems(salt_opts, kc_only, fresh(salt_opts, "keycache"))
    assert not problems, "key tree of ids only keycache wrote:\n" + "\n".join(problems[:15])
    res = run_cli(keycache_bin, salt_opts, "verify", salt_opts["pki_dir"], "--tree", "always", "--json")
    report = json.loads(res.stdout)
    assert not report["findings"], report["findings"][:5]
    tree_ids = {d["id"] for d in (report.get("tree") or {}).get("disagreements", [])}
    assert tree_ids <= salt_touched, f"tree disagreements on ids only keycache wrote: {sorted(tree_ids - salt_touched)}"


def test_fork_while_a_thread_writes(salt_opts, tmp_path):
    """A parent thread writes through the driver while the main thread forks
    children that use the same driver at once (reads and writes): no child
    hangs, every child succeeds, and the parent sees the children's writes."""
    rng = random.Random(0x5EED3)
    kc = salt.cache.Cache(salt_opts, driver="keycache")
    thread_ids = [f"thread-{i:02d}" for i in range(12)]
    for i, mid in enumerate(thread_ids):
        kc.store("keys", mid, {"state": "accepted", "pub": make_pub(mid, "accepted", "thread", i, rng)})
    assert len(kc.list_all("keys")) == len(thread_ids)
    stop = threading.Event()
    thread_errors = []
    thread_ops = [0]

    def writer():
        trng = random.Random(7)
        seq = 100
        try:
            while not stop.is_set():
                seq += 1
                mid = trng.choice(thread_ids)
                state = trng.choice(STATES)
                kc.store("keys", mid, {"state": state, "pub": make_pub(mid, state, "thread", seq, trng)})
                token_of("keys", mid, kc.fetch("keys", mid))
                if seq % 5 == 0:
                    kc.store("denied_keys", mid, [make_pub(mid, "denied", "thread", seq, trng)])
                if seq % 7 == 0:
                    kc.list_all("keys", include_data=True)
                thread_ops[0] += 1
        except Exception:  # pylint: disable=broad-except
            thread_errors.append(traceback.format_exc())

    def child(n, out_path):
        code = 0
        errors = []
        try:
            crng = random.Random(n)
            mine = [f"child-{n}-{i}" for i in range(4)]
            # at once, before anything else
            for mid in thread_ids[:4]:
                token_of("keys", mid, kc.fetch("keys", mid))
            for i, mid in enumerate(mine):
                state = crng.choice(STATES)
                value = {"state": state, "pub": make_pub(mid, state, f"child{n}", i, crng)}
                kc.store("keys", mid, value)
                got = kc.fetch("keys", mid)
                if got != value:
                    errors.append(f"child {n}: {mid} read back {str(got)[:80]!r}")
            listed = kc.list_all("keys", include_data=True)
            for mid, value in listed.items():
                token_of("keys", mid, value)
            missing = [m for m in mine if m not in listed]
            if missing:
                errors.append(f"child {n}: list_all misses {missing}")
            kc.store("denied_keys", mine[0], [make_pub(mine[0], "denied", f"child{n}", 9, crng)])
            if kc.flush("keys", mine[3]) is not True:
                errors.append(f"child {n}: flush of its own id did not return True")
        except Exception:  # pylint: disable=broad-except
            errors.append(traceback.format_exc())
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump(errors, fh)
        if errors:
            code = 1
        os._exit(code)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    procs = []
    try:
        n = 0
        for _ in range(6):
            batch = []
            for _ in range(2):
                time.sleep(rng.uniform(0.0, 0.05))
                p = CTX.Process(target=child, args=(n, str(tmp_path / f"child{n}.json")), name=f"child{n}", daemon=True)
                p.start()
                batch.append(p)
                procs.append(p)
                n += 1
            hung = join_all(batch, 30)
            assert not hung, f"children hung for 30 s after fork (deadlock?), killed: {hung}"
    finally:
        stop.set()
        thread.join(30)
        stop_all(procs)
    assert not thread.is_alive(), "the writer thread did not stop within 30 s"
    assert not thread_errors, thread_errors[0]
    assert thread_ops[0] > 0
    failures = {}
    for p in procs:
        path = tmp_path / f"{p.name}.json"
        errors = json.loads(path.read_text(encoding="utf-8")) if path.exists() else ["no result file"]
        if p.exitcode != 0 or errors:
            failures[p.name] = (p.exitcode, errors[:3])
    assert not failures, failures
    # the parent (its thread stopped) sees what the children wrote
    for cache in (kc, fresh(salt_opts, "keycache"), fresh(salt_opts, "mmap_key")):
        listed = cache.list_all("keys", include_data=True)
        for n in range(len(procs)):
            for i in range(3):
                mid = f"child-{n}-{i}"
                assert mid in listed, (mid, cache.driver)
                assert token_of("keys", mid, listed[mid]) == [f"child{n}", i]
            assert f"child-{n}-3" not in listed
            assert token_of("denied_keys", f"child-{n}-0", cache.fetch("denied_keys", f"child-{n}-0")) == [f"child{n}", 9]
        for mid in thread_ids:
            token_of("keys", mid, listed[mid])
