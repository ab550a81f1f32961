"""
keycache: Salt's PKI key cache on the keycache engine.

.. code-block:: yaml

    keys.cache_driver: keycache

A drop-in for ``mmap_key`` (Salt 3008.5): the same files in the same
directory (``pki_dir``, or ``cluster_pki_dir`` when ``cluster_id`` is set),
the same values, the same ``SaltCacheError`` where ``mmap_key`` raises one,
so a master can switch between the two drivers either way. It reads the
same options:

- ``mmap_key_size`` (slots, default 1 000 000), ``mmap_key_slot_size``
  (96), ``mmap_key_id_size`` (64), ``mmap_key_max_segment_bytes`` (falling
  back to ``mmap_cache_max_segment_bytes``);
- ``keycache_tree`` (default ``True``): keep the legacy key tree
  (``minions/<id>``, ``minions_pre/``, ``minions_rejected/``,
  ``minions_denied/``) in step with the banks. Salt's ``validate_token``
  reads ``minions/<id>`` on every request, so without it a minion accepted
  through the driver could not talk to the master. ``accepted`` keeps
  ``minions/`` alone in step, the one directory Salt reads (a sign-in then
  writes no file; the other three are left as they are).

Differences from ``mmap_key``, all on the safe side:

- an id longer than ``mmap_key_id_size`` is refused on ``store`` and never
  found by a read (``mmap_key`` truncates it, so two minions could share an
  entry);
- writes are crash-safe and the ``master_keys`` bank's files are mode 0600;
- a directory that holds a ``localfs_key`` key tree (``minions/<id>`` and
  its siblings, ``master.pem``) and no store is refused by every function
  (``SaltCacheError``: run ``keycache migrate`` first), so the tree is never
  rewritten as if every minion were new;
- a layout that does not fit the files (a wrong ``mmap_key_id_size``, say)
  is refused, naming the file and the layout the files look like;
- ``<pki_dir>/master.pub``, which Salt reads from disk (the cluster join),
  is kept in step with the master's public key in the ``master_keys``
  bank (mode 0644, written atomically, never a private key).

etcd mode: with ``keycache_etcd`` beside ``keys.cache_driver: keycache``
(and the replicator running, as the engine ``engines: [keycache: {}]`` of
this package or ``keycache replicate``), the ``keys`` and ``denied_keys``
banks of the master's own store directory are a live replica of one key
state in etcd v3, shared by every master of the cluster:

.. code-block:: yaml

    keycache_etcd:
      endpoints: [https://10.0.0.1:2379, https://10.0.0.2:2379]
      prefix: /keycache/prod/   # default /keycache/<cluster_id or default>/
      ca: /etc/salt/etcd/ca.pem
      cert: /etc/salt/etcd/client.pem
      key: /etc/salt/etcd/client-key.pem
      user: salt
      password: secret
      write_timeout: 10         # seconds a write waits for etcd and this replica
      stale_after: 30           # seconds without a proof of currency: stale
      check_every: 300          # seconds between consistency checks
    engines:
      - keycache: {}

``store`` and ``flush`` on those banks are etcd transactions, committed only
if etcd still holds what the local replica holds for that id, and return
once the replica has applied the commit (key tree included); the driver
writes nothing locally. They raise ``SaltCacheError`` with the reason when
etcd is unreachable, when the entry was changed elsewhere after this replica
last saw it (nothing is written), or when the replica does not apply the
commit within ``write_timeout`` (a replica whose recorded revision belongs to
another etcd history, etcd having been restored from a backup, waits for its
replicator to list etcd again). One replicator per store: the engine or
``keycache replicate``, not both (a second one is refused). ``flush`` of a whole bank (``salt-key
--delete-den``) removes each entry through etcd. ``master_keys`` and every
read stay local and take no lock. A bad ``keycache_etcd`` value raises
``SaltCacheError`` naming the option.

Staleness: when the replicator has not proven the replica current (a
linearizable read of etcd, then its watch's progress up to that read) for
longer than ``stale_after``, timed on the host's boot clock (etcd lost, or
the replicator stopped), or when the replica's state file was not written
for this store's files (a copied or restored directory), the master keeps
serving reads from it (minions it accepted keep working: Salt's
``validate_token`` reads ``minions/<id>``), and every write (a new key
signing in, an accept, a delete) raises ``SaltCacheError``, as it needs
etcd. A revocation committed on another master meanwhile reaches this one
when its replicator reconnects (it resumes the watch, or lists again), which
removes ``minions/<id>``.

The audit trail: every change of a key (a minion's sign-in stored by the
master, ``salt-key -a/-r/-d``, a deny) is recorded as made by this process
(program the base name of ``sys.argv[0]``: ``salt-master``, ``salt-key``,
...; the OS user; ``SUDO_USER``; master the options' ``id``): appended to
``<store>/.keycache-audit.log`` under the bank's lock before the change is
written, or, with ``keycache_etcd``, put in etcd in the change's own
transaction and appended by every master's replicator. ``salt-run
keycache.history`` and ``keycache history`` read it.

This module is only the shim Salt's loader needs (it packs Python functions
alone, and runs this body again for every new ``Cache``); the stores are kept
open by ``saltext.keycache._native`` for the life of the process.
"""

from salt.exceptions import SaltCacheError

from saltext.keycache import _native, _options

__virtualname__ = "keycache"
__func_alias__ = {"list_": "list", "flush_": "flush"}

_native.set_error_class(SaltCacheError)

# cachedir -> _native.Driver, for this load of the module (the native module
# keeps the open stores themselves across loads).
_drivers = {}


def __virtual__():
    return __virtualname__


def _open(cachedir):
    opts = __opts__
    try:
        layout = _options.layout(opts)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SaltCacheError(f"keycache: bad settings for {cachedir!r}: {exc}")
    # etcd mode only for the master's own store directory: a store elsewhere
    # (another pki_dir passed to Cache) is no replica.
    etcd = _options.etcd(opts) if cachedir == _options.own_dir(opts) else {}
    try:
        d = _native.driver(
            cachedir,
            **layout,
            tree=_options.tree(opts),
            pki_dir_is_abs=_options.pki_dir_is_abs(opts),
            **_options.master(opts, cachedir),
            **etcd,
            **_options.audit(opts),
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise SaltCacheError(f"keycache: bad settings for {cachedir!r}: {exc}")
    _drivers[cachedir] = d
    return d


def init_kwargs(kwargs):
    """
    The directory (``pki_dir``, or ``cluster_pki_dir`` when ``cluster_id`` is
    set) and the user, as ``mmap_key`` and ``localfs_key`` give them.
    """
    if "pki_dir" in kwargs:
        cachedir = kwargs["pki_dir"]
    elif __opts__.get("cluster_id"):
        cachedir = __opts__["cluster_pki_dir"]
    else:
        cachedir = __opts__["pki_dir"]
    user = kwargs.get("user", __opts__.get("user"))
    return {"cachedir": cachedir, "user": user}


def get_storage_id(kwargs):
    """
    A unique identifier for this driver instance.
    """
    return ("keycache", kwargs.get("cachedir", __opts__.get("pki_dir", "")))


def store(bank, key, data, cachedir, **kwargs):
    """
    Store *data* for *bank*/*key*: ``keys`` takes ``{"state", "pub"}``,
    ``denied_keys`` a list (its first item is stored), ``master_keys`` a
    string or bytes.
    """
    d = _drivers.get(cachedir) or _open(cachedir)
    return d.store(bank, key, data)


def fetch(bank, key, cachedir, **kwargs):
    """
    ``keys``: ``{"state", "pub"}`` or ``None``; ``denied_keys``: ``[pub]`` or
    ``{}``; ``master_keys``: the PEM string or ``{}``.
    """
    d = _drivers.get(cachedir) or _open(cachedir)
    return d.fetch(bank, key)


def updated(bank, key, cachedir, **kwargs):
    """
    The Unix time (int) of the last write of *bank*/*key*, or ``None``.
    """
    d = _drivers.get(cachedir) or _open(cachedir)
    return d.updated(bank, key)


def flush_(bank, key=None, cachedir=None, **kwargs):
    """
    Remove *key* from *bank*, or the whole *bank* when *key* is ``None``.
    """
    if cachedir is None:
        cachedir = __opts__.get("pki_dir", "")
    d = _drivers.get(cachedir) or _open(cachedir)
    return d.flush(bank, key)


def list_(bank, cachedir, **kwargs):
    """
    The ids in *bank*.
    """
    d = _drivers.get(cachedir) or _open(cachedir)
    return d.list(bank)


def list_all(bank, cachedir, include_data=False, **kwargs):
    """
    ``{id: value}`` for every entry of ``keys`` (``{"state"}``, with
    ``"pub"`` when *include_data*) or ``denied_keys`` (``[pub]``), in one
    pass.
    """
    d = _drivers.get(cachedir) or _open(cachedir)
    return d.list_all(bank, include_data)


def contains(bank, key, cachedir, **kwargs):
    """
    Whether *bank* holds *key*; with ``key=None``, whether the bank exists.
    """
    d = _drivers.get(cachedir) or _open(cachedir)
    return d.contains(bank, key)
