"""A whole-bank ``flush(bank)`` removes every file of the bank.

Salt's own ``flush`` lists the heap segments up to the first missing one;
keycache reads the segments past a gap (a lost segment costs only its own
records), so its ``flush`` removes them too: a wipe of a bank with a gap in
its segments leaves none of the bank's files behind. With the key tree on,
the tree files of every id the bank's index names go too, those of the
entries lost with the segment included, so the tree never vouches for a key
the store no longer holds.
"""

import base64
import os
import random

import pytest
import salt.cache

INDEX = {"keys": ".mmap_keys.idx", "denied_keys": ".mmap_denied.idx", "master_keys": ".mmap_master.idx"}


def pub(tag, n=270):
    body = base64.b64encode(random.Random(tag).randbytes(n)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN PUBLIC KEY-----\n{lines}\n-----END PUBLIC KEY-----\n"


def bank_files(pki, bank):
    return sorted(n for n in os.listdir(pki) if n.startswith(INDEX[bank]))


def files_of(root):
    """{relative path: bytes} of the files under root."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def damaged_bank(salt_opts, bank, tree):
    """A cache whose bank holds 12 entries over segments 0-3, segment 1 lost,
    and another bank holding one entry."""
    # Segments of at most 1500 bytes: three public keys each.
    opts = dict(salt_opts, mmap_key_max_segment_bytes=1500, keycache_tree=tree)
    pki = opts["pki_dir"]
    cache = salt.cache.Cache(opts, driver="keycache")
    for n in range(12):
        if bank == "keys":
            cache.store("keys", f"m{n:02}", {"state": "accepted", "pub": pub(f"m{n}")})
        elif bank == "denied_keys":
            cache.store("denied_keys", f"m{n:02}", [pub(f"m{n}")])
        else:
            cache.store("master_keys", f"peers/m{n:02}.pub", pub(f"m{n}"))
    base = os.path.join(pki, INDEX[bank])
    assert os.path.exists(base + ".heap.3"), bank_files(pki, bank)
    # Segment 1 is lost: its entries are gone, those past it still read.
    os.remove(base + ".heap.1")
    assert os.path.exists(base + ".heap.2")
    other = "keys" if bank != "keys" else "denied_keys"
    cache.store(other, "other", {"state": "pending", "pub": pub("o")} if other == "keys" else [pub("o")])
    return cache, pki, other


@pytest.mark.parametrize(
    "bank,tree",
    [(b, t) for b in ("denied_keys", "keys", "master_keys") for t in (False, True)],
)
def test_a_wipe_of_a_bank_with_a_gap_in_its_segments_removes_every_file(salt_opts, bank, tree):
    cache, pki, other = damaged_bank(salt_opts, bank, tree)
    others = bank_files(pki, other)
    state_dir = {"keys": "minions", "denied_keys": "minions_denied"}.get(bank)
    if tree and state_dir:
        # m03's entry was in the lost segment: its tree file is still there.
        assert os.path.exists(os.path.join(pki, state_dir, "m03"))

    assert cache.flush(bank) is True

    assert bank_files(pki, bank) == []
    assert bank_files(pki, other) == others
    assert cache.list(other) == ["other"]
    assert cache.list(bank) == []
    if state_dir:
        left = sorted(n for n in files_of(pki) if n.startswith(state_dir + "/"))
        assert left == [], left
