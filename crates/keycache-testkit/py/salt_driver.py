#!/usr/bin/env python3
"""Drive the REAL Salt 3008.5 mmap_key code, for keycache's interoperability tests.

Run it with the venv python that ``tools/setup-venv.sh`` prints.  Every
subcommand prints exactly one JSON document on stdout; on error it prints a
message on stderr and exits 2.  Salt's own log records (WARNING and up) go to
stderr as ``salt: LEVEL logger: message``.

Common options (before or after the subcommand):
  --dir D                  store directory (the master's pki_dir)
  --size N                 mmap_key_size          (omitted: Salt's default)
  --slot-size N            mmap_key_slot_size     (omitted: Salt's default)
  --id-size N              mmap_key_id_size       (omitted: Salt's default)
  --max-segment-bytes N    mmap_key_max_segment_bytes (omitted: Salt's default)

Subcommands:
  apply            JSON array of ops on stdin -> {"applied": N, "results": [...]}
  dump             -> {"keys", "denied_keys", "keys_order", "denied_order",
                       "keys_list", "denied_list"}
  fetch            --bank B --id ID -> {"result": ...}
  migrate          --pki-dir P [--cluster-pki-dir C] [--dry-run]
  raw-put          --bank-index PATH --key K --value-hex HEX
  raw-get          --bank-index PATH --key K -> {"value_hex": ..., "kind": ...}
  fetch-bench      --ids-file F --seconds S
  list-bench       --repeat R
  migrate-bench    --pki-dir P [--cluster-pki-dir C]

See crates/keycache-testkit/py/README.md for the op format and output shapes.
"""

import argparse
import json
import logging
import os
import random
import re
import statistics
import sys
import time

import salt_layout

# Environment: KEYCACHE_DRIVER_FULL_IMPORT=1 makes the driver import
# salt.cache.mmap_key the ordinary way even for the light subcommands (see
# _load_mmap_key).


class DriverError(Exception):
    """A usage or Salt-side failure: reported on stderr, exit status 2."""


# ---------------------------------------------------------------------------
# Logging: Salt installs a DeferredStreamHandler on the root logger when
# ``salt`` is imported; replace it with a plain stderr handler plus a list that
# migrate reports in its JSON.
# ---------------------------------------------------------------------------

_LOG_RECORDS = []


class _ListHandler(logging.Handler):
    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # pylint: disable=broad-except
            msg = str(record.msg)
        _LOG_RECORDS.append(
            {"level": record.levelname, "logger": record.name, "message": msg}
        )


def _setup_logging():
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    err.setFormatter(logging.Formatter("salt: %(levelname)s %(name)s: %(message)s"))
    root.addHandler(err)
    lst = _ListHandler()
    lst.setLevel(logging.WARNING)
    root.addHandler(lst)
    root.setLevel(logging.WARNING)


# ---------------------------------------------------------------------------
# Loading Salt
# ---------------------------------------------------------------------------

_MMAP_KEY = None


def _import_salt():
    # Importing the ``salt`` package sets the ``__salt_system_encoding__``
    # builtin that salt.utils.files.fopen / salt.utils.stringutils rely on
    # (salt/__init__.py: __define_global_system_encoding_variable__).
    import salt  # pylint: disable=import-outside-toplevel,unused-import
    import builtins  # pylint: disable=import-outside-toplevel

    if not hasattr(builtins, "__salt_system_encoding__"):
        # Never reached with 3008.5; kept so a Salt change fails loudly below
        # rather than with a NameError deep in fopen.
        setattr(builtins, "__salt_system_encoding__", sys.getdefaultencoding())
    _setup_logging()


def _load_mmap_key(full_import=False):
    """Return the real ``salt.cache.mmap_key`` module.

    ``import salt.cache.mmap_key`` first runs ``salt/cache/__init__.py``, which
    imports salt.config, salt.loader and salt.crypt (about +0.1 s of startup)
    and none of which mmap_key uses.  For the light subcommands the driver
    therefore executes the unmodified ``salt/cache/mmap_key.py`` file itself
    (registered as ``salt.cache.mmap_key`` in sys.modules) without running the
    package ``__init__``; its own imports (salt.utils.mmap_cache,
    salt.utils.verify, salt.utils.files, ...) are the ordinary ones.  The
    migration subcommands, and KEYCACHE_DRIVER_FULL_IMPORT=1, use the
    ordinary import, exactly as the runner does.
    """
    global _MMAP_KEY  # pylint: disable=global-statement
    if _MMAP_KEY is not None:
        return _MMAP_KEY
    _import_salt()
    if full_import or os.environ.get("KEYCACHE_DRIVER_FULL_IMPORT") == "1":
        import salt.cache.mmap_key as mod  # pylint: disable=import-outside-toplevel
    elif "salt.cache.mmap_key" in sys.modules:
        mod = sys.modules["salt.cache.mmap_key"]
    else:
        import importlib.util  # pylint: disable=import-outside-toplevel
        import salt as salt_pkg  # pylint: disable=import-outside-toplevel

        path = os.path.join(os.path.dirname(salt_pkg.__file__), "cache", "mmap_key.py")
        spec = importlib.util.spec_from_file_location("salt.cache.mmap_key", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["salt.cache.mmap_key"] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules["salt.cache.mmap_key"]
            raise
    _MMAP_KEY = mod
    return mod


def _mmap_cache_module():
    _import_salt()
    import salt.utils.mmap_cache  # pylint: disable=import-outside-toplevel

    return salt.utils.mmap_cache


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------

def _opt(args, name, default=None):
    return getattr(args, name, default)


def _store_dir(args):
    d = _opt(args, "dir")
    if not d:
        raise DriverError("--dir is required for this subcommand")
    return os.path.abspath(d)


def _build_opts(args, pki_dir, cluster_pki_dir=None):
    """Master opts as mmap_key reads them: pki_dir, no cluster_id unless a
    cluster pki dir is given, and the mmap_key_* layout options only when
    given on the command line (omitted -> mmap_key's own defaults)."""
    opts = {
        "pki_dir": pki_dir,
        "cluster_id": None,
        "cluster_pki_dir": None,
        "user": None,
    }
    if cluster_pki_dir:
        opts["cluster_id"] = "keycache-driver"
        opts["cluster_pki_dir"] = cluster_pki_dir
    opts.update(salt_layout.opts(args))
    return opts


def _mmap_key_for(args, pki_dir, cluster_pki_dir=None, full_import=False):
    mk = _load_mmap_key(full_import=full_import)
    # mmap_key is a loader module: the Salt loader injects ``__opts__`` into
    # its globals.  Outside the loader we set it as a module attribute, which
    # is exactly what salt/runners/pki.py does (``mmap_key.__opts__ =
    # __opts__``).  mmap_key uses no other dunder (__context__, __salt__, ...).
    mk.__opts__ = _build_opts(args, pki_dir, cluster_pki_dir)
    _warn_layout_mismatch(mk, cluster_pki_dir or pki_dir)
    return mk


def _warn_layout_mismatch(mk, d):
    """Salt silently reads an index whose length is not size * slot_size as
    an empty bank (and refuses to write it): say so on stderr, since that is
    almost always a test passing the wrong layout options."""
    opts = mk.__opts__
    size = opts.get("mmap_key_size", mk._DEFAULT_SIZE)  # pylint: disable=protected-access
    slot = opts.get("mmap_key_slot_size", mk._DEFAULT_SLOT_SIZE)  # pylint: disable=protected-access
    for name in mk._BANK_INDEX_NAME.values():  # pylint: disable=protected-access
        path = os.path.join(d, name)
        try:
            length = os.path.getsize(path)
        except OSError:
            continue
        if length != size * slot:
            sys.stderr.write(
                f"salt_driver: warning: {path} is {length} bytes, not "
                f"size*slot_size = {size}*{slot}; Salt treats that bank as empty "
                "and fails to write it\n"
            )


# ---------------------------------------------------------------------------
# JSON helpers
# ---------------------------------------------------------------------------


def _jsonable(value):
    if isinstance(value, (bytes, bytearray)):
        return {"bytes_hex": bytes(value).hex()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _emit(doc):
    # UTF-8 whatever the locale; a lone surrogate (cannot come from Salt's
    # decoders, which use errors="replace") falls back to \u escapes.
    doc = _jsonable(doc)
    try:
        data = json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        data = json.dumps(doc, ensure_ascii=True).encode("ascii")
    sys.stdout.flush()
    sys.stdout.buffer.write(data + b"\n")
    sys.stdout.buffer.flush()


# ---------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------


def _op_pub(op, idx):
    if "pub_hex" in op:
        try:
            return bytes.fromhex(op["pub_hex"])
        except (TypeError, ValueError) as exc:
            raise DriverError(f"op {idx}: bad pub_hex: {exc}") from exc
    if "pub" not in op:
        raise DriverError(f"op {idx}: store needs 'pub' (or 'pub_hex')")
    return op["pub"]


def cmd_apply(args):
    d = _store_dir(args)
    try:
        ops = json.load(sys.stdin)
    except ValueError as exc:
        raise DriverError(f"stdin is not JSON: {exc}") from exc
    if not isinstance(ops, list):
        raise DriverError("stdin must be a JSON array of ops")
    mk = _mmap_key_for(args, d)
    results = []
    for idx, op in enumerate(ops):
        if not isinstance(op, dict):
            raise DriverError(f"op {idx}: not an object")
        kind = op.get("op")
        bank = op.get("bank")
        if bank not in ("keys", "denied_keys"):
            raise DriverError(f"op {idx}: bank must be 'keys' or 'denied_keys'")
        try:
            if kind == "store":
                mid = op.get("id")
                if not isinstance(mid, str):
                    raise DriverError(f"op {idx}: store needs a string 'id'")
                if "data" in op:
                    # Escape hatch: hand this JSON value to store() verbatim.
                    data = op["data"]
                elif bank == "keys":
                    state = op.get("state")
                    data = {"state": state, "pub": _op_pub(op, idx)}
                else:
                    # The master stores denied keys as a one-element list
                    # (salt/key.py: cache.store("denied_keys", id, [pub]));
                    # mmap_key.store keeps data[0] only.
                    data = [_op_pub(op, idx)]
                mk.store(bank, mid, data, d)
                results.append(True)
            elif kind == "flush":
                # id omitted/null -> wipe the whole bank (flush_(bank, None)).
                mid = op.get("id")
                results.append(bool(mk.flush_(bank, mid, cachedir=d)))
            else:
                raise DriverError(f"op {idx}: unknown op {kind!r}")
        except DriverError:
            raise
        except Exception as exc:  # pylint: disable=broad-except
            raise DriverError(
                f"op {idx} ({kind} {bank} {op.get('id')!r}) failed after "
                f"{idx} applied: {type(exc).__name__}: {exc}"
            ) from exc
    _emit({"applied": len(ops), "results": results})


def cmd_dump(args):
    d = _store_dir(args)
    mk = _mmap_key_for(args, d)
    keys = mk.list_all("keys", d, include_data=True)
    denied = mk.list_all("denied_keys", d)
    _emit(
        {
            "keys": keys,
            "denied_keys": denied,
            # dicts keep list_all's insertion order = roster order
            "keys_order": list(keys),
            "denied_order": list(denied),
            # list_ (MmapCache.list_keys): every occupied roster slot, also
            # those list_all skips (corrupt / empty values)
            "keys_list": mk.list_("keys", d),
            "denied_list": mk.list_("denied_keys", d),
        }
    )


def cmd_fetch(args):
    d = _store_dir(args)
    mk = _mmap_key_for(args, d)
    _emit({"result": mk.fetch(args.bank, args.id, d)})


_COUNT_RE = re.compile(r"^\s*(Accepted|Pending|Rejected|Denied|Total):\s*([\d,]+)\s*$")


def _run_migration(args, dry_run):
    """Run ``salt-run pki.migrate_to_mmap [dry_run=True]``: the runner
    function from salt/runners/pki.py itself, with ``__opts__`` injected as the
    loader would.  The runner in turn sets ``mmap_key.__opts__`` and calls
    ``mmap_key.rebuild_from_localfs(__opts__)``.  Returns (runner string,
    counts dict, seconds spent in the runner)."""
    pki_dir = args.pki_dir or _opt(args, "dir")  # --dir is the fallback
    if not pki_dir:
        raise DriverError("--pki-dir (or --dir) is required")
    pki_dir = os.path.abspath(pki_dir)
    if not os.path.isdir(pki_dir):
        raise DriverError(f"--pki-dir {pki_dir!r} is not a directory")
    cluster = os.path.abspath(args.cluster_pki_dir) if args.cluster_pki_dir else None
    # Full import: the runner does ``from salt.cache import mmap_key``.
    _mmap_key_for(args, pki_dir, cluster, full_import=True)
    import salt.runners.pki as pki_runner  # pylint: disable=import-outside-toplevel

    pki_runner.__opts__ = _build_opts(args, pki_dir, cluster)
    t0 = time.perf_counter()
    try:
        out = pki_runner.migrate_to_mmap(dry_run=dry_run)
    except Exception as exc:  # pylint: disable=broad-except
        # e.g. UnicodeDecodeError on a non-UTF-8 key file: Salt catches only
        # OSError/SaltCacheError per file, so the runner aborts and the keys
        # stored before that file stay in the banks.
        raise DriverError(
            f"pki.migrate_to_mmap raised {type(exc).__name__}: {exc} "
            "(the banks may be partially written)"
        ) from exc
    seconds = time.perf_counter() - t0
    counts = {}
    for line in str(out).splitlines():
        m = _COUNT_RE.match(line)
        if m:
            counts[m.group(1).lower()] = int(m.group(2).replace(",", ""))
    for k in ("accepted", "pending", "rejected", "denied", "total"):
        if k not in counts:
            raise DriverError(f"cannot parse runner output: {out!r}")
    # Where the banks are (or would be) written; the dry run counts the tree
    # under pki_dir even when cluster_id is set (runner code), the real run
    # scans the tree under the target dir (rebuild_from_localfs).
    target = cluster if cluster else pki_dir
    scanned = pki_dir if dry_run else target
    return out, counts, seconds, target, scanned


def cmd_migrate(args):
    out, counts, _, target, scanned = _run_migration(args, args.dry_run)
    _emit(
        {
            "result": out,
            "counts": counts,
            "dry_run": bool(args.dry_run),
            "target_dir": target,
            "scanned_dir": scanned,
            "log": _LOG_RECORDS,
        }
    )


def cmd_migrate_bench(args):
    _, counts, seconds, target, _ = _run_migration(args, False)
    _emit({"seconds": seconds, "counts": counts, "target_dir": target})


def _raw_cache(args):
    mc = _mmap_cache_module()
    # Same defaults as mmap_key when an option is omitted.
    return mc.MmapCache(path=args.bank_index, **salt_layout.cache_kwargs(args))


def cmd_raw_put(args):
    try:
        value = bytes.fromhex(args.value_hex)
    except ValueError as exc:
        raise DriverError(f"bad --value-hex: {exc}") from exc
    cache = _raw_cache(args)
    try:
        if not cache.put(args.key, value):
            raise DriverError(f"MmapCache.put({args.key!r}) returned False")
    finally:
        cache.close()
    _emit({"ok": True})


def cmd_raw_get(args):
    cache = _raw_cache(args)
    try:
        raw = cache.get(args.key, default=None)
    finally:
        cache.close()
    # MmapCache.get: None when absent/corrupt, True for a zero-length value,
    # str when the value decodes as UTF-8, bytes otherwise.
    if raw is None:
        doc = {"value_hex": None, "kind": "absent"}
    elif raw is True:
        doc = {"value_hex": "", "kind": "empty"}
    elif isinstance(raw, str):
        doc = {"value_hex": raw.encode("utf-8").hex(), "kind": "str"}
    else:
        doc = {"value_hex": bytes(raw).hex(), "kind": "bytes"}
    _emit(doc)


def cmd_fetch_bench(args):
    d = _store_dir(args)
    with open(args.ids_file, encoding="utf-8") as fh:
        ids = [line.rstrip("\r\n") for line in fh]
    ids = [i for i in ids if i]
    if not ids:
        raise DriverError(f"{args.ids_file}: no ids")
    random.Random(args.seed).shuffle(ids)
    mk = _mmap_key_for(args, d)
    # Open the bank once (the first fetch maps the files); not timed.
    mk.fetch("keys", ids[0], d)
    if args.mode == "fetch":
        fetch = mk.fetch
    else:
        # --mode get: MmapCache.get on the same bank object, i.e. fetch
        # without mmap_key's valid_id check (realpath syscalls) and decoding.
        # Returns str (or bytes): the "pub" touched is the whole record.
        cache = mk._get_cache("keys", d)  # pylint: disable=protected-access
        get = cache.get

        def fetch(_bank, key, _d):
            raw = get(key, default=None)
            return None if raw is None or raw is True else {"pub": raw}

    n_ids = len(ids)
    budget = float(args.seconds)
    lookups = 0
    misses = 0
    touched = 0
    i = 0
    t0 = time.perf_counter()
    deadline = t0 + budget
    now = t0
    while True:
        for _ in range(256):
            r = fetch("keys", ids[i], d)
            if r is None:
                misses += 1
            else:
                touched += len(r["pub"])
            i += 1
            if i == n_ids:
                i = 0
        lookups += 256
        now = time.perf_counter()
        if now >= deadline:
            break
    seconds = now - t0
    _emit(
        {
            "lookups": lookups,
            "seconds": seconds,
            "ns_per_lookup": seconds * 1e9 / lookups,
            "mode": args.mode,
            "ids": n_ids,
            "misses": misses,
            "bytes_touched": touched,
        }
    )


def cmd_list_bench(args):
    d = _store_dir(args)
    mk = _mmap_key_for(args, d)
    repeat = max(1, int(args.repeat))
    mk.list_all("keys", d)  # open the bank once; not timed
    no_data, with_data = [], []
    count = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = mk.list_all("keys", d, include_data=False)
        no_data.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r2 = mk.list_all("keys", d, include_data=True)
        with_data.append(time.perf_counter() - t0)
        count = len(r)
        assert len(r2) == count
    _emit(
        {
            "repeat": repeat,
            "count": count,
            "median_seconds": statistics.median(no_data),
            "median_seconds_with_data": statistics.median(with_data),
        }
    )


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def _positive_int(text):
    try:
        v = int(text, 0)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return v


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _common_parser():
    # default=SUPPRESS so the options can be given before or after the
    # subcommand without the subparser's defaults clobbering the main one's.
    p = _Parser(add_help=False)
    s = argparse.SUPPRESS
    p.add_argument("--dir", default=s, help="store directory (pki_dir)")
    p.add_argument("--size", type=_positive_int, default=s, help="mmap_key_size")
    p.add_argument("--slot-size", type=_positive_int, default=s, help="mmap_key_slot_size")
    p.add_argument("--id-size", type=_positive_int, default=s, help="mmap_key_id_size")
    p.add_argument(
        "--max-segment-bytes", type=_positive_int, default=s,
        help="mmap_key_max_segment_bytes",
    )
    return p


def build_parser():
    common = _common_parser()
    parser = _Parser(
        prog="salt_driver.py",
        description="Drive Salt 3008.5's mmap_key / mmap_cache code.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    p = sub.add_parser("apply", parents=[common], help="apply JSON ops from stdin")
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("dump", parents=[common], help="list both key banks")
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("fetch", parents=[common], help="mmap_key.fetch")
    p.add_argument("--bank", required=True)
    p.add_argument("--id", required=True)
    p.set_defaults(func=cmd_fetch)

    for name, func, help_ in (
        ("migrate", cmd_migrate, "salt-run pki.migrate_to_mmap"),
        ("migrate-bench", cmd_migrate_bench, "time pki.migrate_to_mmap"),
    ):
        p = sub.add_parser(name, parents=[common], help=help_)
        p.add_argument("--pki-dir", default=None, help="legacy tree (default: --dir)")
        p.add_argument("--cluster-pki-dir", default=None,
                       help="sets cluster_id and cluster_pki_dir")
        if name == "migrate":
            p.add_argument("--dry-run", action="store_true")
        p.set_defaults(func=func)

    p = sub.add_parser("raw-put", parents=[common], help="MmapCache.put")
    p.add_argument("--bank-index", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--value-hex", required=True)
    p.set_defaults(func=cmd_raw_put)

    p = sub.add_parser("raw-get", parents=[common], help="MmapCache.get")
    p.add_argument("--bank-index", required=True)
    p.add_argument("--key", required=True)
    p.set_defaults(func=cmd_raw_get)

    p = sub.add_parser("fetch-bench", parents=[common], help="time mmap_key.fetch")
    p.add_argument("--ids-file", required=True)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--mode", choices=("fetch", "get"), default="fetch",
                   help="fetch: mmap_key.fetch (default); get: MmapCache.get")
    p.set_defaults(func=cmd_fetch_bench)

    p = sub.add_parser("list-bench", parents=[common], help="time mmap_key.list_all")
    p.add_argument("--repeat", type=_positive_int, default=5)
    p.set_defaults(func=cmd_list_bench)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except DriverError as exc:
        sys.stderr.write(f"salt_driver: error: {exc}\n")
        return 2
    except Exception as exc:  # pylint: disable=broad-except
        if os.environ.get("KEYCACHE_DRIVER_DEBUG") == "1":
            import traceback  # pylint: disable=import-outside-toplevel

            traceback.print_exc()
        sys.stderr.write(f"salt_driver: error: {type(exc).__name__}: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
