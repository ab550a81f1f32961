"""The driver's refusals of ``master_keys`` names say what is wrong with the
name (issue 19, item 15c): an empty name is refused as empty, a name with a
NUL byte as such, and only a long one as longer than ``mmap_key_id_size``."""

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
