"""
keycache: the replicator of ``keycache_etcd`` as a Salt engine.

.. code-block:: yaml

    keys.cache_driver: keycache
    keycache_etcd:
      endpoints: [https://10.0.0.1:2379, https://10.0.0.2:2379]
    engines:
      - keycache: {}

Keeps this master's key store (``cluster_pki_dir`` when ``cluster_id`` is
set, else ``pki_dir``; the ``mmap_key_*`` layout; the key tree in step as
``keycache_tree`` says, the whole tree by default) a live replica of the key state in etcd: it lists the prefix, then
applies etcd's watch, recording the revision the store holds in
``.keycache-etcd``. The ``keycache`` cache driver's writes wait for it. It
takes no options of its own: they are ``keycache_etcd``'s.

It runs in the engine's process with the GIL released; a failure it cannot
mend ends the process, and Salt's process manager starts it again; it
resumes from the recorded revision (or lists again when etcd compacted
past it). Running ``keycache replicate`` for the same store instead is the
same replicator outside Salt.
"""

import logging

from salt.exceptions import SaltCacheError

from saltext.keycache import _native, _options

__virtualname__ = "keycache"

log = logging.getLogger(__name__)

_native.set_error_class(SaltCacheError)

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
}


def __virtual__():
    return __virtualname__


def _report(level, message):
    log.log(_LEVELS.get(level, logging.INFO), "keycache replicator: %s", message)


def start(**kwargs):
    """
    Runs the replicator until the engine's process is told to stop.
    """
    if kwargs:
        raise SaltCacheError(
            "keycache engine: it takes no options ({}): set keycache_etcd in the master "
            "config".format(", ".join(sorted(map(str, kwargs))))
        )
    opts = __opts__
    cachedir = _options.own_dir(opts)
    if not isinstance(cachedir, str) or not cachedir:
        raise SaltCacheError("keycache engine: no pki_dir (or cluster_pki_dir) in the master config")
    try:
        layout = _options.layout(opts)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SaltCacheError(f"keycache engine: bad mmap_key settings: {exc}")
    log.info("keycache replicator: starting for %s", cachedir)
    _native.replicate(
        cachedir,
        **layout,
        tree=_options.tree(opts),
        **_options.etcd(opts),
        **_options.master(opts, cachedir),
        report=_report,
    )
