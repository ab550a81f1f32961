"""Listings (``list``, ``list_all``) called again and again on one driver.

The driver keeps a listing's memory and the ``str`` objects it built for
the next listing (``src/listing.rs``, ``src/strs.rs``): every listing must
still answer what the bank holds at that moment, whatever changed between
two listings (a new key for an id, a new state, an entry removed from the
middle, new entries), and hand out new dicts and lists each time. A bank
of ``LIST_BESIDE_FROM`` roster entries or more is walked on a second thread
while the first builds the result: those listings must answer as Salt's own
``mmap_key`` does, in its order, and never a torn value while Salt writes.
"""

import base64
import multiprocessing
import os
import pathlib
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback

import pytest
import salt.cache
from saltext.keycache import _native

STATES = ("accepted", "pending", "rejected")


def pem(tag):
    body = base64.b64encode(random.Random(tag).randbytes(270)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN PUBLIC KEY-----\n{lines}\n-----END PUBLIC KEY-----\n"


def check(cache, keys, denied):
    """Every listing of both banks answers the model ``keys``/``denied``."""
    assert cache.list_all("keys") == {m: {"state": s} for m, (s, _) in keys.items()}
    assert cache.list_all("keys", include_data=True) == {m: {"state": s, "pub": p} for m, (s, p) in keys.items()}
    assert sorted(cache.list("keys")) == sorted(keys)
    assert cache.list_all("denied_keys") == {m: [p] for m, p in denied.items()}
    assert sorted(cache.list("denied_keys")) == sorted(denied)


def test_each_listing_sees_every_change_since_the_last(salt_opts):
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    rng = random.Random(22)
    keys, denied = {}, {}
    for n in range(60):
        mid = f"m{n:03d}.example.com"
        keys[mid] = (STATES[n % 3], pem(mid))
        cache.store("keys", mid, {"state": keys[mid][0], "pub": keys[mid][1]})
    for n in range(5):
        mid = f"m{n:03d}.example.com"
        denied[mid] = pem(f"denied {mid}")
        cache.store("denied_keys", mid, [denied[mid]])
    check(cache, keys, denied)

    # A new key for an id, same state: the listing shows the new one.
    mid = "m007.example.com"
    keys[mid] = (keys[mid][0], pem("another key"))
    cache.store("keys", mid, {"state": keys[mid][0], "pub": keys[mid][1]})
    check(cache, keys, denied)

    # Rounds of random changes, each followed by every listing.
    gen = 0
    for _ in range(40):
        gen = random_changes(cache, rng, keys, denied, rng.randrange(1, 6), gen)
        check(cache, keys, denied)


def random_changes(cache, rng, keys, denied, count, gen):
    """*count* random changes through *cache*, made in the model too:
    removals, new states, new keys for ids, denied keys, new ids. Returns
    the next *gen* (a counter that makes new keys and ids unique)."""
    for _ in range(count):
        op = rng.random()
        if op < 0.3 and keys:
            mid = rng.choice(sorted(keys))
            cache.flush("keys", mid)
            del keys[mid]
        elif op < 0.5 and keys:
            mid = rng.choice(sorted(keys))
            keys[mid] = (rng.choice(STATES), keys[mid][1])
            cache.store("keys", mid, {"state": keys[mid][0], "pub": keys[mid][1]})
        elif op < 0.7 and keys:
            mid = rng.choice(sorted(keys))
            gen += 1
            keys[mid] = (keys[mid][0], pem(f"{mid} {gen}"))
            cache.store("keys", mid, {"state": keys[mid][0], "pub": keys[mid][1]})
        elif op < 0.8:
            gen += 1
            mid = f"d{gen}.example.com"
            denied[mid] = pem(f"denied {mid}")
            cache.store("denied_keys", mid, [denied[mid]])
        else:
            gen += 1
            mid = f"new{gen}.example.com"
            keys[mid] = (rng.choice(STATES), pem(mid))
            cache.store("keys", mid, {"state": keys[mid][0], "pub": keys[mid][1]})
    return gen


def test_a_listing_is_new_objects_and_strs_are_reused(salt_opts):
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    ids = [f"m{n:03d}.example.com" for n in range(20)]
    for mid in ids:
        cache.store("keys", mid, {"state": "accepted", "pub": pem(mid)})
    first = cache.list_all("keys", include_data=True)
    # A caller changing its result changes no later result.
    first[ids[3]]["state"] = "rejected"
    first[ids[4]]["pub"] = "changed"
    del first[ids[5]]
    second = cache.list_all("keys", include_data=True)
    assert second == {m: {"state": "accepted", "pub": pem(m)} for m in ids}
    assert all(second[m] is not first.get(m) for m in ids)

    # An entry removed from the middle: the ids and keys after it are the
    # same str objects as before (the listing follows the shift).
    cache.flush("keys", ids[2])
    third = cache.list_all("keys", include_data=True)
    assert list(third) == ids[:2] + ids[3:]
    by_id = {k: k for k in second}
    for m in ids[3:]:
        key = next(k for k in third if k == m)
        assert key is by_id[m]
        assert third[m]["pub"] is second[m]["pub"]
    assert third[ids[1]]["pub"] is second[ids[1]]["pub"]


def test_value_strs_past_the_cap_are_built_afresh_each_listing(salt_opts, keycache_bin):
    """A bank keeps the value ``str``s of its first ``MAX_KEPT_VALUES``
    entries between listings, and no more (``src/strs.rs``: about 50 MB at
    most, however large the bank): past the cap each listing builds new
    ones, equal but not the same objects. Ids are kept whatever the size."""
    cap = _native.MAX_KEPT_VALUES
    assert cap == 100_000  # the figure src/strs.rs and the docs give
    n = cap + 3
    size = 3 * n
    salt_opts.update({"mmap_key_size": size, "keycache_tree": False})
    # The bank from a tree of hard links to two files of one key (a store of
    # each id through the driver would take a minute of fsyncs).
    value = {"state": "accepted", "pub": pem("one key for all")}
    pki = pathlib.Path(salt_opts["pki_dir"])
    sources = [pki / f"key{i}.pem" for i in range(2)]
    for src in sources:
        src.write_text(value["pub"])
    for name in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        (pki / name).mkdir()
    for i in range(n):
        os.link(sources[i % 2], pki / "minions" / f"m{i:06d}")
    for src in sources:
        src.unlink()
    subprocess.run(
        [keycache_bin, "migrate", str(pki), "--no-master-keys", "--size", str(size), "--slot-size", "96", "--id-size", "64"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    first = cache.list_all("keys", include_data=True)
    second = cache.list_all("keys", include_data=True)
    assert len(first) == len(second) == n
    ids = list(second)
    assert ids == list(first)
    firsts = list(first)
    kept = [second[m]["pub"] is first[m]["pub"] for m in ids]
    assert all(kept[:cap]), f"value strs not kept below the cap: {kept[:cap].count(False)}"
    assert not any(kept[cap:]), "value strs kept past the cap"
    assert all(second[m]["pub"] == value["pub"] for m in ids[cap:])
    # Ids are kept past the cap too.
    assert all(a is b for a, b in zip(ids, firsts))


def wait_child(pid, seconds):
    """The exit code of child *pid*, killed (and reported as such) if it runs
    longer than *seconds*."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return f"killed after {seconds} s"


def large_bank(salt_opts, keycache_bin, n):
    """A ``keys`` bank of *n* entries (each state, a key of its own each)
    and a small ``denied_keys`` bank, migrated from a tree (a store of each
    id through the driver would take a minute of fsyncs). Returns the model
    ``{id: (state, pub)}`` and ``{id: pub}``."""
    size = 3 * n
    salt_opts.update({"mmap_key_size": size, "keycache_tree": False})
    pki = pathlib.Path(salt_opts["pki_dir"])
    dirs = {"accepted": "minions", "pending": "minions_pre", "rejected": "minions_rejected"}
    for name in list(dirs.values()) + ["minions_denied"]:
        (pki / name).mkdir()
    keys, denied = {}, {}
    for i in range(n):
        mid = f"m{i:06d}.example.com"
        keys[mid] = (STATES[i % 7 % 3], pem(mid))
        (pki / dirs[keys[mid][0]] / mid).write_text(keys[mid][1])
    for i in range(0, n, 500):
        mid = f"m{i:06d}.example.com"
        denied[mid] = pem(f"denied {mid}")
        (pki / "minions_denied" / mid).write_text(denied[mid])
    subprocess.run(
        [keycache_bin, "migrate", str(pki), "--no-master-keys", "--size", str(size), "--slot-size", "96", "--id-size", "64"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return keys, denied


def salt_reader(salt_opts):
    """A Cache on Salt 3008.5's own ``mmap_key`` driver, with handles of its own."""
    cache = salt.cache.Cache(salt_opts, driver="mmap_key")
    glob = cache.modules["mmap_key.fetch"].func.__globals__
    for handle in list(glob["_caches"].values()):
        handle.close()
    glob["_caches"].clear()
    return cache


def same_as_salt(cache, salt_cache):
    """Every listing of both banks equals Salt's, entries in Salt's order."""
    for bank, data in (("keys", False), ("keys", True), ("denied_keys", False)):
        ours = cache.list_all(bank, include_data=data)
        salts = salt_cache.list_all(bank, include_data=data)
        assert list(ours.items()) == list(salts.items()), f"list_all({bank!r}, include_data={data}) differs from Salt's"
        assert cache.list(bank) == salt_cache.list(bank), f"list({bank!r}) differs from Salt's"


def test_a_large_bank_lists_as_salt_does_through_changes(salt_opts, keycache_bin):
    """Listings of a bank walked on a second thread answer what Salt's
    ``mmap_key`` answers of the same files, in the same order, after rounds
    of changes through the driver (``random_changes``)."""
    n = _native.LIST_BESIDE_FROM + 1500
    keys, denied = large_bank(salt_opts, keycache_bin, n)
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    walks = _native.walks_beside()
    check(cache, keys, denied)
    if _native.can_walk_beside():
        assert _native.walks_beside() > walks, "no listing walked on a second thread"
    same_as_salt(cache, salt_reader(salt_opts))
    rng = random.Random(5)
    gen = 0
    for _ in range(4):
        gen = random_changes(cache, rng, keys, denied, 12, gen)
        check(cache, keys, denied)
        same_as_salt(cache, salt_reader(salt_opts))


def test_a_slot_listed_twice_far_apart_is_listed_once_at_its_first_place(salt_opts, keycache_bin):
    """A large bank's walk is shared by two threads in chunks of the roster
    (``src/listing.rs``), each skipping only the slots it walked itself. A
    slot the roster lists again far from its first place (a chunk the other
    thread may walk) is still listed once, at its first place: ``list``
    answers Salt's ids without the repeats, ``list_all`` Salt's dict
    (whose repeated keys land at their first place too), every time."""
    n = _native.LIST_BESIDE_FROM + 1500
    large_bank(salt_opts, keycache_bin, n)
    roster = pathlib.Path(salt_opts["pki_dir"]) / ".mmap_keys.idx.roster"
    raw = roster.read_bytes()
    slots = struct.unpack(f"<{len(raw) // 4}I", raw)
    # The first entries' slots again: in the middle (a tombstone beside
    # them) and at the end, chunks away from where they were first listed.
    again = struct.pack("<4I", *slots[:3], 0xFFFFFFFF)
    cut = len(raw) // 2 // 4 * 4
    roster.write_bytes(raw[:cut] + again + raw[cut:] + struct.pack("<3I", slots[0], slots[1500], slots[-1]))
    salts = salt_reader(salt_opts)
    want_ids = list(dict.fromkeys(salts.list("keys")))
    assert len(want_ids) == n
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    walks = _native.walks_beside()
    for _ in range(20):
        assert cache.list("keys") == want_ids
        for data in (False, True):
            assert list(cache.list_all("keys", include_data=data).items()) == list(
                salts.list_all("keys", include_data=data).items()
            )
    if _native.can_walk_beside():
        assert _native.walks_beside() >= walks + 60, "listings walked on one thread"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another user")
def test_a_large_bank_lists_where_no_thread_can_start(salt_opts, keycache_bin):
    """Where the process may start no thread (its user is at its process
    limit), a large bank is walked on the listing's own thread and the
    listing answers the same."""
    import pwd  # pylint: disable=import-outside-toplevel
    import resource  # pylint: disable=import-outside-toplevel
    import threading  # pylint: disable=import-outside-toplevel

    keys, _ = large_bank(salt_opts, keycache_bin, _native.LIST_BESIDE_FROM + 100)
    want = {m: {"state": s} for m, (s, _) in keys.items()}
    nobody = pwd.getpwnam("nobody")
    # A copy the other user can reach (pytest's directories are root's, and
    # TMPDIR may be private).
    top = tempfile.mkdtemp(dir="/tmp")
    try:
        pki = os.path.join(top, "pki")
        shutil.copytree(salt_opts["pki_dir"], pki, symlinks=True)
        for d, _, files in os.walk(top):
            for name in [d] + [os.path.join(d, f) for f in files]:
                os.chown(name, nobody.pw_uid, nobody.pw_gid)
        opts = dict(salt_opts, pki_dir=pki)
        # Salt's loader reads the driver's module here: the other user may
        # not reach the files it comes from.
        cache = salt.cache.Cache(opts, driver="keycache")
        assert callable(cache.modules["keycache.list_all"])
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
                try:
                    threading.Thread(target=lambda: None).start()
                    code = 3  # the limit did not stop a thread: the test proves nothing
                except RuntimeError:
                    walks = _native.walks_beside()
                    got = cache.list_all("keys")
                    code = 0 if got == want else 2
                    if code == 0 and _native.walks_beside() != walks:
                        code = 4  # counted as a walk on a second thread
                    if code:
                        print(f"child: {len(got)} {len(want)} {list(got.items())[:2]}", file=sys.stderr, flush=True)
            except BaseException as exc:  # pylint: disable=broad-except
                print(f"child: {exc!r}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        code = wait_child(pid, 60)
        assert code == 0, f"child exit {code} (2: wrong listing, 3: threads still start, 4: counted as a walk beside)"
    finally:
        shutil.rmtree(top)


def test_children_forked_while_a_thread_lists_a_large_bank(salt_opts, keycache_bin):
    """A parent thread lists a large bank again and again (each listing
    with a walker thread of its own) while the main thread forks children
    that list it too and write: no child hangs or fails, whatever the
    parent's walker was doing when it forked, and the parent sees what the
    children wrote."""
    import threading  # pylint: disable=import-outside-toplevel

    keys, _ = large_bank(salt_opts, keycache_bin, _native.LIST_BESIDE_FROM + 500)
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    walks = _native.walks_beside()
    assert len(cache.list_all("keys")) == len(keys)
    stop = threading.Event()
    listed = [0]
    failed = []

    def lister():
        try:
            while not stop.is_set():
                got = cache.list_all("keys", include_data=listed[0] % 2 == 1)
                if not set(keys) <= set(got):
                    failed.append(f"a parent listing misses {len(set(keys) - set(got))} ids")
                listed[0] += 1
        except Exception as exc:  # pylint: disable=broad-except
            failed.append(repr(exc))

    def child(n):
        code = 1
        try:
            mid = f"child-{n}.example.com"
            cache.store("keys", mid, {"state": "pending", "pub": pem(mid)})
            got = cache.list_all("keys", include_data=True)
            ok = set(keys) <= set(got) and got.get(mid) == {"state": "pending", "pub": pem(mid)}
            code = 0 if ok else 2
        finally:
            os._exit(code)

    thread = threading.Thread(target=lister, daemon=True)
    thread.start()
    pids, codes = {}, {}
    try:
        # Fork only once the thread is listing.
        deadline = time.monotonic() + 30
        while listed[0] < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        for n in range(8):
            time.sleep(random.Random(n).uniform(0.0, 0.02))
            pid = os.fork()
            if pid == 0:
                child(n)
            pids[pid] = n
        deadline = time.monotonic() + 60
        while pids.keys() - codes.keys() and time.monotonic() < deadline:
            for pid in pids.keys() - codes.keys():
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        hung = [pids[p] for p in pids.keys() - codes.keys()]
        assert not hung, f"children {hung} still running after 60 s (a lock held across the fork?)"
        assert all(c == 0 for c in codes.values()), {pids[p]: c for p, c in codes.items()}
    finally:
        stop.set()
        thread.join(30)
        for pid in pids.keys() - codes.keys():  # never a reaped pid: it may be another's now
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    assert not thread.is_alive(), "the parent's listing thread did not stop within 30 s"
    assert not failed, failed[:3]
    if _native.can_walk_beside():
        assert _native.walks_beside() > walks, "no parent listing walked on a second thread"
    assert listed[0] >= 2, f"the parent listed only {listed[0]} times"
    got = cache.list_all("keys")
    assert all(got.get(f"child-{n}.example.com") == {"state": "pending"} for n in range(8))


# What the writer beside a listing may store for an id it moves.
MOVES = 6


def moved_value(mid, k):
    return {"state": STATES[k % 3], "pub": pem(f"{mid} moved {k}")}


def writer(salt_opts, moving, seconds, writes):
    """In a forked child, for *seconds*: Salt's own ``mmap_key`` stores keys
    of the same length into the ids in *moving* (Salt overwrites them in
    the heap in place), and keycache's driver removes and stores them again
    (roster tombstones and appends). Removals go through keycache because
    Salt 3008.5's own removal from another process can tombstone the wrong
    roster bytes (``test_salt_removal_from_another_process_...`` below)."""
    try:
        salt_cache = salt_reader(salt_opts)
        cache = salt.cache.Cache(salt_opts, driver="keycache")
        rng = random.Random(os.getpid())
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            mid = rng.choice(moving)
            op = rng.random()
            if op < 0.1:
                cache.flush("keys", mid)
            elif op < 0.2:
                cache.store("keys", mid, moved_value(mid, rng.randrange(MOVES)))
            else:
                salt_cache.store("keys", mid, moved_value(mid, rng.randrange(MOVES)))
            writes.value += 1
    except BaseException:  # pylint: disable=broad-except
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


@pytest.mark.skipif(not _native.can_walk_beside(), reason="a walk beside the building needs two CPUs")
def test_a_large_bank_listed_while_salt_writes_is_never_torn(salt_opts, keycache_bin):
    """While another process changes ids of a large bank (Salt's in-place
    heap overwrites, removals, appends), every listing through the driver
    holds each untouched id with its value, each moved id (when listed)
    with a value that was stored for it, and nothing else; once the writer
    stops, the listings equal Salt's."""
    n = _native.LIST_BESIDE_FROM + 1500
    keys, denied = large_bank(salt_opts, keycache_bin, n)
    ids = sorted(keys)
    moving = ids[::40]
    allowed = {mid: [moved_value(mid, k) for k in range(MOVES)] + [{"state": keys[mid][0], "pub": keys[mid][1]}] for mid in moving}
    still = {mid: v for mid, v in keys.items() if mid not in allowed}
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    check(cache, keys, denied)

    writes = multiprocessing.get_context("fork").Value("i", 0, lock=False)
    child = multiprocessing.get_context("fork").Process(target=writer, args=(salt_opts, moving, 4.0, writes))
    child.start()
    listings = 0
    walks = _native.walks_beside()
    try:
        while child.is_alive():
            data = listings % 2 == 1
            got = cache.list_all("keys", include_data=data)
            listings += 1
            for mid, (state, pub) in still.items():
                want = {"state": state, "pub": pub} if data else {"state": state}
                assert got.get(mid) == want, f"listing {listings}: {mid} = {got.get(mid)!r}"
            for mid, value in got.items():
                if mid in still:
                    continue
                assert mid in allowed, f"listing {listings}: unknown id {mid!r}"
                choices = allowed[mid] if data else [{"state": v["state"]} for v in allowed[mid]]
                assert value in choices, f"listing {listings}: {mid} = {value!r}, never stored"
    finally:
        child.join(30)
    assert child.exitcode == 0, f"the writer failed (exit {child.exitcode})"
    assert writes.value > 50, f"the writer wrote only {writes.value} times"
    assert listings >= 10, f"only {listings} listings while the writer wrote"
    assert _native.walks_beside() >= walks + listings, "listings walked on one thread"
    same_as_salt(cache, salt_reader(salt_opts))


def test_salt_removal_from_another_process_can_tombstone_the_wrong_roster_bytes(salt_opts, keycache_bin):
    """Salt 3008.5's ``_roster_remove``, in a process that did not append
    the entry (its "slow path"), looks for the slot's four bytes anywhere in
    the roster (``bytes.find``, not at entry boundaries). Where they first
    appear across two entries, it overwrites bytes of those two entries with
    the tombstone instead: an id that no one removed drops out of every
    listing, Salt's and keycache's alike (both follow the roster), though it
    stays in the index. The roster's live count then differs from the
    header's, so keycache's next write rebuilds the roster from the slots,
    and every listing is whole again."""
    keys, _ = large_bank(salt_opts, keycache_bin, 3000)
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    listed = list(cache.list_all("keys"))
    roster_path = pathlib.Path(salt_opts["pki_dir"]) / ".mmap_keys.idx.roster"
    raw = roster_path.read_bytes()
    slots = struct.unpack(f"<{len(raw) // 4}I", raw)
    assert len(slots) == len(listed) == len(keys)  # a fresh roster: no tombstones
    # The first entry whose bytes Salt finds first across two entries (a
    # match before the entry itself: the entry it starts in is hurt).
    found = [(i, raw.find(struct.pack("<I", s))) for i, s in enumerate(slots)]
    found = [(i, hit) for i, hit in found if hit % 4]
    if not found:
        pytest.fail("no roster entry of this bank is found across two entries: change the bank")
    at, hit = found[0]
    victim = listed[at]
    hurt = listed[hit // 4]

    salt_reader(salt_opts).flush("keys", victim)  # fresh handles: the slow path
    after = cache.list_all("keys")
    assert victim not in after
    assert hurt not in after, "Salt's removal left the roster whole: the case this test is for did not happen"
    assert cache.fetch("keys", hurt) == {"state": keys[hurt][0], "pub": keys[hurt][1]}
    same_as_salt(cache, salt_reader(salt_opts))
    found = subprocess.run([keycache_bin, "verify", salt_opts["pki_dir"], "--tree", "never"], capture_output=True, text=True, timeout=60)
    assert found.returncode == 1, found.stdout + found.stderr
    assert "roster" in found.stdout + found.stderr

    cache.store("keys", "after.example.com", {"state": "pending", "pub": pem("after")})
    del keys[victim]
    keys["after.example.com"] = ("pending", pem("after"))
    assert cache.list_all("keys") == {m: {"state": s} for m, (s, _) in keys.items()}
    same_as_salt(cache, salt_reader(salt_opts))
    clean = subprocess.run([keycache_bin, "verify", salt_opts["pki_dir"], "--tree", "never"], capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0, clean.stdout + clean.stderr
