"""
keycache: the ``keycache`` command's main jobs from ``salt-run``.

.. code-block:: bash

    salt-run keycache.migrate dry_run=True   # keycache migrate -c <config dir> --dry-run
    salt-run keycache.migrate                # keycache migrate -c <config dir>
    salt-run keycache.status                 # keycache stats (keycache etcd status with keycache_etcd)
    salt-run keycache.verify                 # keycache verify
    salt-run keycache.verify repair=True     # keycache verify --repair
    salt-run keycache.diff                   # keycache etcd diff (needs keycache_etcd)
    salt-run keycache.diff other=/srv/peer   # keycache diff <this store> /srv/peer
    salt-run keycache.history web-01         # keycache history web-01 (the audit trail)

Each function calls the keycache library through the driver's native
module (``saltext.keycache._native``), in the ``salt-run`` process, on the
master options Salt handed the runner (``__opts__``: the store directory,
the ``mmap_key_*`` layout, ``keycache_tree``, ``keycache_etcd``, ``id``),
not on the config files read again. The jobs are the ``keycache``
command's own, and each returns what the command's ``--json`` reports; no
``keycache`` binary is needed, so a wheel and a source install behave
alike. The etcd jobs are bounded by etcd's connect and request timeouts
(``keycache_etcd.write_timeout``).

A failure (an error of the library, findings of ``verify``, a stale
replica, stores that differ) sets ``retcode`` 1 in the returned dict and in
``__context__``: ``salt-run`` exits 1, and ``success`` is false for the API
and orchestration. Nothing here prints or returns a private key: the
reports name the master's key files, never their bytes.
"""

import logging

import salt.utils.data
from salt.exceptions import SaltInvocationError

__virtualname__ = "keycache"

log = logging.getLogger(__name__)


def __virtual__():
    return __virtualname__


def _fail(ret):
    """``ret`` marked as failed: ``retcode`` 1 there (``salt-run``'s exit
    code) and in ``__context__`` (the job's ``success``)."""
    __context__["retcode"] = 1
    ret["retcode"] = 1
    return ret


def _error(message):
    return _fail({"error": message})


def _run(fun, job, *args, **kwargs):
    """Runs the native module's ``job`` on ``__opts__``.

    Returns ``(document, passed, None)``, or ``(None, None, error dict)``
    when the library raised (its message, after ``keycache.<fun>: ``).
    """
    # pylint: disable=import-outside-toplevel
    from saltext.keycache import _native

    log.debug("keycache runner: %s", job)
    try:
        doc, passed = getattr(_native, job)(__opts__, *args, **kwargs)
    except Exception as exc:  # pylint: disable=broad-except
        return None, None, _error(f"keycache.{fun}: {exc}")
    return doc, passed, None


def _report(doc, passed):
    """``doc`` with ``result``: whether it passed; failed when not."""
    doc["result"] = bool(passed)
    return doc if passed else _fail(doc)


def _migrate_text(doc):
    """``pki.migrate_to_mmap``'s text for a migration's report (what
    ``keycache migrate --json`` prints): its lines first, then what keycache
    says more (the store, the master's own keys, what was skipped)."""
    migrated = doc.get("migrated") or {}
    counts = {state: int(migrated.get(state, 0)) for state in ("accepted", "pending", "rejected", "denied")}
    if doc.get("dry_run"):
        head = "PKI migration dry-run (no changes written):"
    else:
        head = "PKI keys migrated to mmap_key backend successfully."
    lines = [
        head,
        f"  Accepted: {counts['accepted']:,}",
        f"  Pending:  {counts['pending']:,}",
        f"  Rejected: {counts['rejected']:,}",
        f"  Denied:   {counts['denied']:,}",
        f"  Total:    {sum(counts.values()):,}",
    ]
    total = doc.get("total") or {}
    verb = "would hold" if doc.get("dry_run") else "holds"
    lines.append(f"  Store:    {doc.get('target', '')} {verb} {sum(int(v) for v in total.values()):,} entries")
    kept = sum(int(v) for v in (doc.get("kept") or {}).values())
    if kept:
        lines.append(f"  Kept:     {kept:,} entries of the store that the tree lacks")
    lines.extend(_master_keys_lines(doc))
    verb = "Would change" if doc.get("dry_run") else "Changed"
    for change in doc.get("changes") or []:
        by = f"by {change.get('file')}" if change.get("file") else "(not in the tree)"
        stale = ", a file older than the store's entry" if change.get("stale") else ""
        lines.append(
            f"  {verb}: {change.get('id')} {change.get('from')} -> {change.get('to') or 'absent'} {by}{stale}"
        )
    for path in doc.get("minions_removed") or []:
        lines.append(
            f"  {'Would remove' if doc.get('dry_run') else 'Removed'}: {path} (a key the store does not hold accepted)"
        )
    for dup in doc.get("duplicates") or []:
        found_in = ", ".join(map(str, dup.get("found_in") or []))
        lines.append(f"  Duplicate: {dup.get('id')} (found {found_in}): {dup.get('state')}")
    skipped = doc.get("skipped") or []
    lines.append(f"  Skipped:  {len(skipped):,}")
    for skip in skipped:
        detail = skip.get("detail")
        lines.append(f"    {skip.get('path')}: {skip.get('reason')}" + (f" ({detail})" if detail else ""))
    return "\n".join(lines)


def _master_keys_lines(doc):
    report = doc.get("master_keys")
    if report is None:
        return ["  Master keys: none found"]
    master = doc.get("master_id") or {}
    lines = [f"  Master keys (master id {master.get('id', '?')}):"]
    for field in ("written", "replaced", "unchanged", "kept"):
        names = report.get(field) or []
        if names:
            lines.append(f"    {field + ':':<10} {', '.join(names)}")
    for skip in report.get("skipped") or []:
        lines.append(f"    skipped:   {skip.get('path')}: {skip.get('reason')}")
    return lines


def migrate(dry_run=False, replace_states=False):
    """
    Migrate the master's ``localfs_key`` tree (accepted, pending, rejected
    and denied keys) into the ``keys`` and ``denied_keys`` banks, and the
    master's own key files into the ``master_keys`` bank, as ``keycache
    migrate -c <config dir>`` does: atomically, refusing (writing nothing) a
    layout that does not fit, an id too long or a ``master_keys`` entry that
    holds other bytes than its file. Use ``keys.cache_driver: keycache`` (or
    ``mmap_key``) afterwards.

    Returns the text ``pki.migrate_to_mmap`` returns (counts per state and
    their total), then the store, the master's keys and every file skipped,
    with the reason. With ``dry_run=True``, writes nothing (no bank, no lock
    file, no change to the tree) and says what would be migrated.

    Into an existing store, every key whose state the tree's files change is
    listed; a change out of accepted or rejected made by a file older than
    the store's entry (a file left from before an earlier migration) is
    refused, writing nothing, unless ``replace_states=True``.

    CLI Examples:

    .. code-block:: bash

        # Preview what would be migrated
        salt-run keycache.migrate dry_run=True

        # Perform the migration
        salt-run keycache.migrate
    """
    doc, passed, err = _run(
        "migrate",
        "run_migrate",
        dry_run=salt.utils.data.is_true(dry_run),
        replace_states=salt.utils.data.is_true(replace_states),
    )
    if err is not None:
        return err
    if not passed:
        return _report(doc, passed)
    return _migrate_text(doc)


def status():
    """
    This master's key store: with ``keycache_etcd`` configured, what
    ``keycache etcd status`` says (the replica's revision, etcd's, the lag,
    the last proof of currency, the replicator, the last consistency check;
    fails when the replica is stale or etcd cannot be reached); else what ``keycache stats`` says (counts per state, and each
    bank's slots, probe lengths and heap).

    CLI Example:

    .. code-block:: bash

        salt-run keycache.status
    """
    job = "run_etcd_status" if __opts__.get("keycache_etcd") else "run_stats"
    doc, passed, err = _run("status", job)
    return err if err is not None else _report(doc, passed)


def verify(repair=False):
    """
    Check this master's key store as ``keycache verify`` does: counters, the
    roster, probe chains, duplicates, every record's bounds and checksum, and
    the key tree Salt's ``validate_token`` reads. Fails (``salt-run`` exits 1)
    on any finding, and lists them. ``repair=True`` mends what can be mended
    as ``keycache verify --repair`` does (the key tree made equal to the
    store, a bank rebuilt), recording it in the audit trail, then checks
    again.

    CLI Example:

    .. code-block:: bash

        salt-run keycache.verify
        salt-run keycache.verify repair=True
    """
    doc, passed, err = _run("verify", "run_verify", repair=salt.utils.data.is_true(repair))
    return err if err is not None else _report(doc, passed)


def diff(other=None):
    """
    Compare this master's key store: with ``other``, with the store in that
    directory (``keycache diff``, e.g. a peer's store copied here); else,
    with ``keycache_etcd`` configured, with etcd (``keycache etcd diff``).
    Fails (``salt-run`` exits 1) when they differ, and lists the
    differences. Without either there is nothing to compare with: an error.

    CLI Examples:

    .. code-block:: bash

        salt-run keycache.diff
        salt-run keycache.diff other=/var/lib/keycache/peer-b
    """
    if other is not None:
        # pylint: disable=import-outside-toplevel
        from saltext.keycache import _options

        if not _options.own_dir(__opts__):
            return _error("keycache.diff: the master config names no pki_dir (or cluster_pki_dir)")
        doc, passed, err = _run("diff", "run_diff", str(other))
    elif __opts__.get("keycache_etcd"):
        doc, passed, err = _run("diff", "run_etcd_diff")
    else:
        return _error(
            "keycache.diff: nothing to compare this master's store with: it compares it with "
            "etcd when keycache_etcd is configured, or with another store directory: "
            "salt-run keycache.diff other=/path/to/store"
        )
    return err if err is not None else _report(doc, passed)


def history(id=None, since=None):  # pylint: disable=redefined-builtin
    """
    The audit trail of this master's key store (``pki_dir``, or
    ``cluster_pki_dir`` when ``cluster_id`` is set), as ``keycache history``
    prints it: who changed which key, when, from what to what, and why. A
    list of records, oldest first, each a dict of the log's fields:
    ``time`` (UTC, RFC 3339), ``id``, ``action`` (``sign-in``, ``accept``,
    ``reject``, ``delete``, ``deny``, ``merge``, ...), ``from`` and ``to``
    (the states), ``finger`` (``salt-key -f``'s fingerprint of the key
    written, or removed), ``replaced_finger``, ``user``, ``sudo_user``,
    ``program`` (``salt-master`` for a minion's sign-in, ``salt-key``,
    ``keycache``, ...), ``master`` (the id of the master that made it),
    ``reason`` and ``revision`` (the etcd revision, with ``keycache_etcd``:
    each master's log holds the whole cluster's trail).

    id
        Only the records of this minion id.

    since
        Only the records made at this time or later: RFC 3339
        (``2026-11-29T04:05:06Z``) or a date (``2026-11-29``, its midnight
        UTC). Anything else raises ``SaltInvocationError`` naming it
        (``salt-run`` prints it as "Passed invalid arguments", with this
        usage).

    CLI Examples:

    .. code-block:: bash

        salt-run keycache.history
        salt-run keycache.history web-01
        salt-run keycache.history web-01 since=2026-11-29
    """
    # pylint: disable=import-outside-toplevel
    from saltext.keycache import _native, _options

    own = _options.own_dir(__opts__)
    if not own:
        return _error("keycache.history: the master config names no pki_dir (or cluster_pki_dir)")
    try:
        records, torn = _native.audit_history(
            str(own),
            id=None if id is None else str(id),
            since=None if since is None else str(since),
        )
    except ValueError as exc:
        # Salt answers "Passed invalid arguments" with the usage; the job's
        # success is false.
        __context__["retcode"] = 1
        raise SaltInvocationError(str(exc)) from exc
    except Exception as exc:  # pylint: disable=broad-except
        return _error(f"keycache.history: {exc}")
    if torn:
        log.warning(
            "keycache.history: %d line(s) of the audit trail of %s could not be read (cut short by a kill)",
            torn,
            own,
        )
    return records
