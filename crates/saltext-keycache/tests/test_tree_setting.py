"""``keycache_tree`` as the driver reads it: ``True`` (the default) keeps the
whole key tree in step, ``"accepted"`` only ``minions/`` (what Salt's
``validate_token`` reads), ``False`` none of it; any other string is refused
with ``SaltCacheError`` naming the option, before anything is written."""

import os

import pytest
import salt.cache
from salt.exceptions import SaltCacheError

PEM = "-----BEGIN PUBLIC KEY-----\nAAAA{}\n-----END PUBLIC KEY-----\n"


def files(pki):
    out = []
    for d in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        path = os.path.join(pki, d)
        if os.path.isdir(path):
            out.extend(f"{d}/{n}" for n in os.listdir(path))
    return sorted(out)


def changes(cache):
    cache.store("keys", "a", {"state": "pending", "pub": PEM.format("a")})
    cache.store("keys", "b", {"state": "pending", "pub": PEM.format("b")})
    cache.store("keys", "a", {"state": "accepted", "pub": PEM.format("a")})
    cache.store("keys", "b", {"state": "rejected", "pub": PEM.format("b")})
    cache.store("denied_keys", "c", [PEM.format("c")])


@pytest.mark.parametrize(
    "value,want",
    [
        (True, ["minions/a", "minions_denied/c", "minions_rejected/b"]),
        ("accepted", ["minions/a"]),
        (False, []),
    ],
)
def test_keycache_tree_decides_which_directories_are_kept(salt_opts, value, want):
    salt_opts["keycache_tree"] = value
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    changes(cache)
    assert files(salt_opts["pki_dir"]) == want
    assert cache.fetch("keys", "a") == {"state": "accepted", "pub": PEM.format("a")}
    if value == "accepted":
        cache.flush("keys", "a")
        assert files(salt_opts["pki_dir"]) == []


@pytest.mark.parametrize("value", ["yes please", "false", "Accepted"])
def test_another_string_is_refused_before_a_write(salt_opts, value):
    salt_opts["keycache_tree"] = value
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    with pytest.raises(SaltCacheError, match="keycache_tree"):
        cache.store("keys", "a", {"state": "accepted", "pub": PEM.format("a")})
    assert files(salt_opts["pki_dir"]) == []
    assert not [n for n in os.listdir(salt_opts["pki_dir"]) if n.startswith(".mmap")]
