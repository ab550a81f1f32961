"""Listings (``list``, ``list_all``) called again and again on one driver.

The driver keeps a listing's memory and the ``str`` objects it built for
the next listing (``src/listing.rs``, ``src/strs.rs``): every listing must
still answer what the bank holds at that moment, whatever changed between
two listings (a new key for an id, a new state, an entry removed from the
middle, new entries), and hand out new dicts and lists each time.
"""

import base64
import os
import pathlib
import random
import subprocess

import salt.cache

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
        for _ in range(rng.randrange(1, 6)):
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
        check(cache, keys, denied)


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
    from saltext.keycache import _native

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
