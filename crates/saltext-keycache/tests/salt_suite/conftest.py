"""Fixtures for Salt's own mmap_key tests, copied here from the salt 3008.5 sdist.

Salt's suite gets ``minion_opts`` from pytest-salt-factories
(tests/pytests/functional/conftest.py); this file provides the same fixture
without that plugin. The driver the copies drive is chosen by
``KEYCACHE_SALT_SUITE_DRIVER`` (``keycache``, the default, or ``mmap_key``):
see saltsuite_driver.py. See CHANGES.md for every change made to the copies.

Every case here is bounded in time: after ``SOFT_TIMEOUT`` seconds a case fails
with a ``TimeoutError`` (SIGALRM), and after ``HARD_TIMEOUT`` seconds
faulthandler dumps every thread's stack and ends the process (for a hang in
native code that never returns to Python).
"""

import faulthandler
import getpass
import os
import pathlib
import signal
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    # The copies import saltsuite_driver, whatever pytest's import mode.
    sys.path.insert(0, str(HERE))

SOFT_TIMEOUT = int(os.environ.get("KEYCACHE_SALT_SUITE_TIMEOUT", "60"))
HARD_TIMEOUT = SOFT_TIMEOUT + 30


def _in_suite(item):
    try:
        return pathlib.Path(str(item.path)).resolve().parent == HERE
    except AttributeError:  # pragma: no cover - old pytest
        return pathlib.Path(str(item.fspath)).resolve().parent == HERE


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _in_suite(item):
        yield
        return

    def _alarm(signum, frame):
        raise TimeoutError(f"{item.nodeid}: still running after {SOFT_TIMEOUT}s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SOFT_TIMEOUT)
    faulthandler.dump_traceback_later(HARD_TIMEOUT, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="package")
def minion_id():
    return "func-tests-minion-opts"


@pytest.fixture(scope="module")
def minion_opts(tmp_path_factory, minion_id):
    """A minion's opts, as salt-factories' ``salt_minion_daemon(...).config`` gives them.

    Built by ``salt.config.minion_config`` (salt-factories does the same) with
    its directories under a temporary root, ``file_client: local`` and
    ``lazy_loader_strict_matching: True`` as in Salt's functional conftest, and
    the running user as ``user``. The copied ``cache`` fixture overrides
    ``pki_dir`` and the mmap_key_* sizes, and takes a copy.
    """
    import salt.config

    root = tmp_path_factory.mktemp("minion-root")
    state_tree = root / "state-tree-base"
    state_tree_prod = root / "state-tree-prod"
    for path in (state_tree, state_tree_prod):
        path.mkdir()
    opts = salt.config.minion_config(None, minion_id=minion_id, cache_minion_id=False)
    opts.update(
        {
            "root_dir": str(root),
            "conf_file": str(root / "conf" / "minion"),
            "config_dir": str(root / "conf"),
            "pki_dir": str(root / "pki"),
            "cachedir": str(root / "cache"),
            "sock_dir": str(root / "run"),
            "extension_modules": str(root / "cache" / "extmods"),
            "log_file": str(root / "minion.log"),
            "user": getpass.getuser(),
            "file_client": "local",
            "file_roots": {"base": [str(state_tree)], "prod": [str(state_tree_prod)]},
            "lazy_loader_strict_matching": True,
        }
    )
    return opts.copy()
