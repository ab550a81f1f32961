"""Shared fixtures of the saltext.keycache tests.

They run in the venv that tools/setup-venv.sh builds (the real salt==3008.5,
this package installed into it with pip) and drive the driver the way a Salt
master does: through ``salt.cache.Cache(opts, driver="keycache")``.
"""

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def keycache_bin():
    """Path of the ``keycache`` CLI: ``$KEYCACHE_BIN`` or the debug build."""
    path = os.environ.get("KEYCACHE_BIN") or str(REPO / "target" / "debug" / "keycache")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no keycache binary at {path}: run `cargo build -p keycache-cli` or set KEYCACHE_BIN")
    return path


@pytest.fixture
def etcd(tmp_path):
    """One real etcd member on 127.0.0.1 (tests/etcd_support.py), stopped at the end."""
    from etcd_support import Etcd  # pylint: disable=import-outside-toplevel

    e = Etcd(tmp_path / "etcd")
    e.start()
    yield e
    e.stop()


@pytest.fixture
def masters(keycache_bin):
    """Two real salt-masters sharing one key pair and a minion of both
    (tests/two_masters_support.py), stopped at the end."""
    # pylint: disable=import-outside-toplevel
    import master_minion_support as mm
    import two_masters_support as tm

    mm.require_keycache_driver()
    with mm.stopped_after(tm.TwoMasters(keycache_bin)) as pair:
        yield pair


@pytest.fixture
def salt_opts(tmp_path):
    """Master opts for a fresh pki dir under ``tmp_path``, with a small table."""
    import salt.config

    opts = salt.config.master_config(None)
    pki = tmp_path / "pki"
    pki.mkdir(mode=0o700)
    opts.update(
        {
            "pki_dir": str(pki),
            "cachedir": str(tmp_path / "cache"),
            "keys.cache_driver": "keycache",
            "mmap_key_size": 2003,
            "mmap_key_slot_size": 96,
            "mmap_key_id_size": 64,
            "user": None,
        }
    )
    return opts
