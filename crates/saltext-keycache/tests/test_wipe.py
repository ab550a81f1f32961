"""A whole-bank ``flush(bank)`` removes every file of the bank.

Salt's own ``flush`` lists the heap segments up to the first missing one;
keycache reads the segments past a gap (a lost segment costs only its own
records), so its ``flush`` removes them too: a wipe of a bank with a gap in
its segments leaves none of the bank's files behind. With the key tree on,
a wipe of ``keys`` or ``denied_keys`` whose lost entries cannot be taken out
of the tree through the bank is refused and writes nothing (``keycache
verify --repair`` first), so the tree never vouches for a key the store no
longer holds.
"""

import base64
import os
import random

import pytest
import salt.cache
from salt.exceptions import SaltCacheError

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


# With the tree on, a wipe of keys or denied_keys with lost entries is
# refused (the next test).
@pytest.mark.parametrize(
    "bank,tree", [("denied_keys", False), ("keys", False), ("master_keys", False), ("master_keys", True)]
)
def test_a_wipe_of_a_bank_with_a_gap_in_its_segments_removes_every_file(salt_opts, bank, tree):
    cache, pki, other = damaged_bank(salt_opts, bank, tree)
    others = bank_files(pki, other)

    assert cache.flush(bank) is True

    assert bank_files(pki, bank) == []
    assert bank_files(pki, other) == others
    assert cache.list(other) == ["other"]
    assert cache.list(bank) == []


@pytest.mark.parametrize("bank", ["denied_keys", "keys"])
def test_with_the_tree_a_wipe_of_a_bank_with_lost_entries_is_refused_and_writes_nothing(salt_opts, bank):
    # The tree's files of the entries lost with the segment cannot be taken
    # out through the bank; a wipe that left them would leave the tree
    # vouching for keys the store no longer holds.
    cache, pki, _ = damaged_bank(salt_opts, bank, True)
    before = files_of(pki)
    state_dir = "minions" if bank == "keys" else "minions_denied"
    assert f"{state_dir}/m03" in before, sorted(before)

    with pytest.raises(SaltCacheError) as exc:
        cache.flush(bank)

    assert "m03" in str(exc.value) and "segment 1" in str(exc.value), str(exc.value)
    assert files_of(pki) == before
