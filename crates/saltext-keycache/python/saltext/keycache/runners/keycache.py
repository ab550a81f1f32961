"""
keycache: the ``keycache`` command's main jobs from ``salt-run``.

For masters whose PATH lacks the ``keycache`` command (``salt-pip`` installs
an extension's scripts into ``extras-3.N/bin``, off PATH):

.. code-block:: bash

    salt-run keycache.migrate dry_run=True   # keycache migrate -c <config dir> --dry-run
    salt-run keycache.migrate                # keycache migrate -c <config dir>
    salt-run keycache.status                 # keycache stats (keycache etcd status with keycache_etcd)
    salt-run keycache.verify                 # keycache verify
    salt-run keycache.verify repair=True     # keycache verify --repair
    salt-run keycache.diff                   # keycache etcd diff (needs keycache_etcd)
    salt-run keycache.diff other=/srv/peer   # keycache diff <this store> /srv/peer
    salt-run keycache.history web-01         # keycache history web-01 (the audit trail)

``history`` reads the store's audit trail itself (through the driver's
native module); every other function runs the ``keycache`` binary on the master config Salt handed
the runner (``-c <directory of conf_file>``, ``--json``) and returns what it
reports. The binary is, in order: the master option ``keycache_bin``; the
``bin/keycache`` beside the directory holding the ``saltext`` package (where
``pip install --target``, salt-pip's way, puts a wheel's scripts); the
Python's scripts directory (a virtualenv's ``bin``); ``keycache`` on PATH.

The command gets ``keycache_runner_timeout`` seconds (master option, default
900); past that it is killed and the function fails saying so, so that a
command waiting on something that never answers does not hang ``salt-run``.

A failure (no binary, an error of the command, a command past its time,
findings of ``verify``, a stale replica, stores that differ) sets ``retcode`` 1 in the returned dict
and in ``__context__``: ``salt-run`` exits 1, and ``success`` is false for
the API and orchestration. Nothing here prints or returns a private key: the
command never prints one.
"""

import json
import logging
import os
import shutil
import subprocess
import sysconfig

import salt.utils.data
from salt.exceptions import SaltInvocationError

__virtualname__ = "keycache"

log = logging.getLogger(__name__)

# The directory holding the ``saltext`` package: <root>/saltext/keycache/runners/keycache.py.
_INSTALL_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# Seconds a command may run before it is killed (``keycache_runner_timeout``).
DEFAULT_TIMEOUT = 900


def __virtual__():
    return __virtualname__


def _candidates(opts):
    """``(where, path)`` of each place the binary is looked for, in order;
    with ``keycache_bin`` set, that one alone."""
    configured = opts.get("keycache_bin")
    if configured:
        return [("the master option keycache_bin", str(configured))]
    places = [("the bin directory beside the saltext package", os.path.join(_INSTALL_ROOT, "bin", "keycache"))]
    scripts = sysconfig.get_path("scripts")
    if scripts:
        places.append(("the Python's scripts directory", os.path.join(scripts, "keycache")))
    return places


def _find_binary(opts):
    """The path of the ``keycache`` binary, or ``None`` and the text saying
    where it was looked for."""
    places = _candidates(opts)
    for _, path in places:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, None
    looked = [f"{path} ({where})" for where, path in places]
    if not opts.get("keycache_bin"):
        found = shutil.which("keycache")
        if found:
            return os.path.abspath(found), None
        looked.append("keycache on PATH ({})".format(os.environ.get("PATH", "")))
    return None, "; ".join(looked)


def _fail(ret):
    """``ret`` marked as failed: ``retcode`` 1 there (``salt-run``'s exit
    code) and in ``__context__`` (the job's ``success``)."""
    __context__["retcode"] = 1
    ret["retcode"] = 1
    return ret


def _error(message, binary=None):
    ret = {"error": message}
    if binary:
        ret["keycache_bin"] = binary
    return _fail(ret)


def _run(args, options=()):
    """Runs ``keycache <args> -c <config dir> --json <options>``.

    Returns ``(document, exit code, binary, None)`` when the command printed
    its JSON report and exited 0 or 1 (1: findings, differences, stale), or
    ``(None, None, binary, error dict)``.
    """
    binary, looked = _find_binary(__opts__)
    if binary is None:
        return None, None, None, _error(
            "keycache: no keycache binary found; looked for "
            f"{looked}. The saltext.keycache wheel carries it (salt-pip puts it in "
            "extras-3.N/bin beside the package) and so does the keycache Debian package "
            "(/usr/bin/keycache); a driver installed from source has none: install one of "
            "those, or name a binary with keycache_bin: PATH in the master config"
        )
    conf_file = __opts__.get("conf_file")
    if not conf_file:
        return None, None, binary, _error("keycache: the master opts have no conf_file", binary)
    argv = [binary, *args, "-c", os.path.dirname(conf_file), "--json", *options]
    what = "keycache " + " ".join(args)
    timeout = __opts__.get("keycache_runner_timeout", DEFAULT_TIMEOUT)
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        timeout = -1.0
    if not timeout > 0:
        return None, None, binary, _error(
            f"keycache: keycache_runner_timeout is {__opts__.get('keycache_runner_timeout')!r},"
            " not a number of seconds above 0",
            binary,
        )
    log.debug("keycache runner: running %s (timeout %s s)", argv, timeout)
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=dict(os.environ, NO_COLOR="1"),
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        # subprocess.run has killed and reaped the command.
        return None, None, binary, _error(
            f"{what} ({binary}) did not finish within {timeout:g} s (keycache_runner_timeout) and was killed",
            binary,
        )
    except OSError as exc:
        return None, None, binary, _error(f"{what}: cannot run {binary}: {exc}", binary)
    stdout = proc.stdout.decode("utf-8", "replace")
    stderr = proc.stderr.decode("utf-8", "replace").strip()
    if stderr:
        log.debug("keycache runner: %s said on stderr: %s", what, stderr)
    if proc.returncode in (0, 1):
        try:
            doc = json.loads(stdout)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            return doc, proc.returncode, binary, None
    if proc.returncode < 0:
        status = f"was killed by signal {-proc.returncode}"
    else:
        status = f"exited {proc.returncode}"
    detail = stderr or stdout.strip() or "no output"
    return None, None, binary, _error(f"{what} ({binary}) {status}: {detail}", binary)


def _report(doc, code, binary):
    """``doc`` with the binary that made it and ``result``: whether the
    command exited 0; failed when it exited 1."""
    doc["keycache_bin"] = binary
    doc["result"] = not code
    return _fail(doc) if code else doc


def _migrate_text(doc):
    """``pki.migrate_to_mmap``'s text for a ``keycache migrate --json``
    report: its lines first, then what keycache says more (the store, the
    master's own keys, what was skipped)."""
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
    dry = salt.utils.data.is_true(dry_run)
    options = ["--dry-run"] if dry else []
    if salt.utils.data.is_true(replace_states):
        options.append("--replace-states")
    doc, code, binary, err = _run(["migrate"], options)
    if err is not None:
        return err
    log.debug("keycache runner: migrated with %s", binary)
    if code:
        return _report(doc, code, binary)
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
    args = ["etcd", "status"] if __opts__.get("keycache_etcd") else ["stats"]
    doc, code, binary, err = _run(args)
    return err if err is not None else _report(doc, code, binary)


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
    doc, code, binary, err = _run(["verify", "--repair"] if salt.utils.data.is_true(repair) else ["verify"])
    return err if err is not None else _report(doc, code, binary)


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
        own = __opts__.get("cluster_pki_dir") if __opts__.get("cluster_id") else __opts__.get("pki_dir")
        if not own:
            return _error("keycache.diff: the master config names no pki_dir (or cluster_pki_dir)")
        doc, code, binary, err = _run(["diff"], [str(own), str(other)])
    elif __opts__.get("keycache_etcd"):
        doc, code, binary, err = _run(["etcd", "diff"])
    else:
        return _error(
            "keycache.diff: nothing to compare this master's store with: it compares it with "
            "etcd when keycache_etcd is configured, or with another store directory: "
            "salt-run keycache.diff other=/path/to/store"
        )
    return err if err is not None else _report(doc, code, binary)


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
