"""The driver that the copied Salt tests drive, and the module object they call.

``KEYCACHE_SALT_SUITE_DRIVER`` picks it: ``keycache`` (default) or ``mmap_key``
(Salt's own driver, to prove that the harness itself passes).

``driver`` stands where Salt's tests import ``salt.cache.mmap_key``:

* ``mmap_key``: that very module.
* ``keycache``: the extension's loader module ``saltext.keycache.cache.keycache``
  imported directly, the same way Salt's unit test imports ``salt.cache.mmap_key``
  (the tests set its ``__opts__`` themselves). It is wrapped in a thin proxy
  that forwards every attribute read, write and delete to the real module, and
  only answers the two mmap_key internals that the tests name:

  - ``_caches``: mmap_key's registry of open ``MmapCache`` objects, which the
    tests clear between cases. A master never clears a driver's handles, so
    for keycache it is an empty dict of its own (clearing it does nothing): the
    driver must cope by itself, as it has to in a master.
  - ``_BANK_INDEX_NAME``: the index file of each bank, a fact of Salt's on-disk
    layout (docs/format.md), taken from here rather than from the driver under
    test.
"""

import importlib
import os
import types

DRIVER = os.environ.get("KEYCACHE_SALT_SUITE_DRIVER", "keycache")

_MODULES = {
    "keycache": "saltext.keycache.cache.keycache",
    "mmap_key": "salt.cache.mmap_key",
}

# Index file of each bank in Salt 3008's mmap_key layout (same for both drivers).
BANK_INDEX_NAME = {
    "keys": ".mmap_keys.idx",
    "denied_keys": ".mmap_denied.idx",
    "master_keys": ".mmap_master.idx",
}

if DRIVER not in _MODULES:
    raise RuntimeError(
        f"KEYCACHE_SALT_SUITE_DRIVER={DRIVER!r}: expected one of {sorted(_MODULES)}"
    )


class _DriverProxy(types.ModuleType):
    """Forwards everything to the real module except the names set in __init__."""

    def __init__(self, real):
        super().__init__(real.__name__, real.__doc__)
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_caches", {})
        object.__setattr__(self, "_BANK_INDEX_NAME", dict(BANK_INDEX_NAME))

    def __getattr__(self, name):  # only for names not set on the proxy itself
        return getattr(object.__getattribute__(self, "_real"), name)

    def __setattr__(self, name, value):
        setattr(object.__getattribute__(self, "_real"), name, value)

    def __delattr__(self, name):
        delattr(object.__getattribute__(self, "_real"), name)

    def __repr__(self):
        return f"<salt_suite proxy of {object.__getattribute__(self, '_real')!r}>"


def _load():
    try:
        real = importlib.import_module(_MODULES[DRIVER])
    except ImportError as exc:
        raise ImportError(
            f"driver {DRIVER!r}: cannot import {_MODULES[DRIVER]} ({exc}); "
            "is saltext.keycache installed in this venv?"
        ) from exc
    if DRIVER == "mmap_key":
        return real
    return _DriverProxy(real)


driver = _load()
