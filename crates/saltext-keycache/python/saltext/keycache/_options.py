"""The master options the driver (``cache/keycache.py``) and the engine
(``engines/keycache.py``) read the same way: the store directory, the
mmap_key layout, ``keycache_tree``, ``keycache_etcd``, and the master's
``id`` the audit trail records."""

import os

import salt.utils.mmap_cache

_DEFAULT_SIZE = 1_000_000
_DEFAULT_SLOT_SIZE = 96
_DEFAULT_ID_SIZE = 64


def own_dir(opts):
    """The master's own store directory, as ``init_kwargs`` picks it when no
    ``pki_dir`` is passed: ``cluster_pki_dir`` when ``cluster_id`` is set,
    else ``pki_dir``."""
    return opts.get("cluster_pki_dir") if opts.get("cluster_id") else opts.get("pki_dir")


def layout(opts):
    """The mmap_key layout (``mmap_key_*``) as keyword arguments of the
    native functions; ``ValueError``/``TypeError`` for a value that is not a
    number."""
    max_segment_bytes = opts.get(
        "mmap_key_max_segment_bytes",
        opts.get(
            "mmap_cache_max_segment_bytes",
            salt.utils.mmap_cache.DEFAULT_MAX_SEGMENT_BYTES,
        ),
    )
    return {
        "size": int(opts.get("mmap_key_size", _DEFAULT_SIZE)),
        "slot_size": int(opts.get("mmap_key_slot_size", _DEFAULT_SLOT_SIZE)),
        "id_size": int(opts.get("mmap_key_id_size", _DEFAULT_ID_SIZE)),
        "max_segment_bytes": int(max_segment_bytes),
    }


def tree(opts):
    """``keycache_tree`` (default ``True``), which the native functions check
    (``"accepted"``, else by Python's truth; another string is refused)."""
    return opts.get("keycache_tree", True)


def etcd(opts):
    """``keycache_etcd`` and the cluster id its default prefix is named
    after (``/keycache/<cluster_id>/``), as keyword arguments of the native
    functions, which check them (a bad value: ``SaltCacheError`` naming the
    option)."""
    cluster_id = opts.get("cluster_id")
    return {
        "etcd": opts.get("keycache_etcd"),
        "cluster_id": str(cluster_id) if cluster_id else None,
    }


def master(opts, cachedir):
    """``master_pki_dir`` (the master's ``pki_dir`` when *cachedir* is its
    own store directory) and ``master_id``."""
    pki_dir = opts.get("pki_dir")
    own = own_dir(opts)
    return {
        "master_pki_dir": pki_dir if isinstance(pki_dir, str) and cachedir == own else None,
        "master_id": str(opts.get("id") or "").removesuffix("_master"),
    }


def pki_dir_is_abs(opts):
    """Whether ``pki_dir`` is absolute (Salt's ``valid_id`` needs it)."""
    pki_dir = opts.get("pki_dir")
    return isinstance(pki_dir, str) and os.path.isabs(pki_dir)


def audit(opts):
    """``audit_master``: the master options' ``id`` (Salt's
    ``apply_master_config`` sets it: the config's ``id``, else the host's
    name with ``_master``), which every change the driver makes records as
    its ``master``; ``None`` without one."""
    master = opts.get("id")
    return {"audit_master": str(master) if master else None}
