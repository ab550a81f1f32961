"""The driver's refusals of ``master_keys`` names say what is wrong with the
name: an empty name is refused as empty, a name with a
NUL byte as such, and only a long one as longer than ``mmap_key_id_size``;
and a ``keys`` value's state is one of Salt's three names, as ``mmap_key``
takes it."""

import os

import pytest
import salt.cache
from salt.exceptions import SaltCacheError


def refusal(cache, name):
    with pytest.raises(SaltCacheError) as exc:
        cache.store("master_keys", name, "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----\n")
    return str(exc.value)


def test_master_keys_names_are_refused_for_what_is_wrong(salt_opts):
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    empty = refusal(cache, "")
    assert "the name is empty" in empty, empty
    assert "more than" not in empty, empty
    nul = refusal(cache, "peers/a\0b.pub")
    assert "the name contains a NUL byte" in nul, nul
    assert "more than" not in nul, nul
    size = salt_opts["mmap_key_id_size"]
    long = refusal(cache, "p" * (size + 1))
    assert f"the name is {size + 1} bytes, more than mmap_key_id_size ({size})" in long, long
    assert cache.list("master_keys") == []


@pytest.mark.parametrize("state", ["minions", "minions_pre", "unaccepted", "minions_rejected", "Accepted", "denied"])
def test_a_key_state_mmap_key_refuses_is_refused_and_nothing_is_stored(salt_opts, tmp_path, state):
    """Only Salt's three state names are stored: the directory names and
    aliases that keycache's CLI parses are refused as ``mmap_key`` refuses
    them, so ``{"state": "minions"}`` never makes an accepted key (nor a
    ``minions/<id>`` file)."""
    pem = "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----\n"
    ref_opts = dict(salt_opts, pki_dir=str(tmp_path / "ref"), **{"keys.cache_driver": "mmap_key"})
    os.makedirs(ref_opts["pki_dir"], mode=0o700)
    with pytest.raises(SaltCacheError):
        salt.cache.Cache(ref_opts, driver="mmap_key").store("keys", "m1", {"state": state, "pub": pem})
    cache = salt.cache.Cache(salt_opts, driver="keycache")
    with pytest.raises(SaltCacheError) as exc:
        cache.store("keys", "m1", {"state": state, "pub": pem})
    assert "unknown key state" in str(exc.value), exc.value
    assert cache.fetch("keys", "m1") in (None, {})
    assert cache.list_all("keys") == {}
    assert not os.path.lexists(os.path.join(salt_opts["pki_dir"], "minions", "m1"))
    cache.store("keys", "m1", {"state": "accepted", "pub": pem})
    assert cache.fetch("keys", "m1") == {"state": "accepted", "pub": pem}
