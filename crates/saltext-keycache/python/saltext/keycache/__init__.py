"""saltext.keycache: Salt's ``keys.cache_driver: keycache``.

A Salt extension whose key cache driver (``cache/keycache.py``) stores a
master's minion keys on the keycache engine (``_native``, built from Rust
with pyo3): Salt 3008's ``mmap_key`` layout, byte for byte, read without
locks, written crash-safely under Salt's own lock files, with the legacy key
tree (``minions/<id>`` and its siblings) kept in step.

Enable it in the master config::

    keys.cache_driver: keycache

With ``keycache_etcd`` beside it, the minion keys are a live replica of one
key state in etcd, kept by the engine ``engines/keycache.py``
(``engines: [keycache: {}]``); see the driver's documentation.
"""

import os

from saltext.keycache import _native

__all__ = ["_native"]

# Salt forks its worker processes after loading modules: a child must not
# use the parent's open files (their flock is shared with the parent).
os.register_at_fork(after_in_child=_native.after_fork_in_child)
