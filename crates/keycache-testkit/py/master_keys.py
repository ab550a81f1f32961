#!/usr/bin/env python3
"""Drive the REAL Salt 3008.5 ``MasterKeys`` (salt/crypt.py) and the
``master_keys`` bank of its key cache drivers, for keycache's tests of the
master's own keys.

Run it with a venv python that has salt==3008.5 plus what ``MasterKeys``
imports (``cryptography`` and its ``cffi``).  Every subcommand prints exactly
one JSON document on stdout; on error it prints a message on stderr and
exits 2.  Private key material is never printed: only public keys, names,
lengths and comparisons.

Common options (before the subcommand):
  --root R                 scratch root (Salt's root_dir, cachedir, extmods)
  --pki-dir P              the master's pki_dir
  --cluster-pki-dir C      with --cluster-id: cluster_pki_dir
  --cluster-id X           cluster_id (omitted: a standalone master)
  --id ID                  the master's id as opts hold it (e.g. m1_master)
  --driver D               keys.cache_driver: localfs_key or mmap_key
  --size N                 mmap_key_size (and --slot-size, --id-size,
                           --max-segment-bytes), omitted: Salt's defaults
  --sign                   master_sign_pubkey: True (a master_sign pair)

Subcommands:
  setup [--signature]      MasterKeys(opts): creates the keys Salt creates
                           (--signature: also gen_signature(), the
                           <id>_pubkey_signature) -> {"keys": ...}
  serve [--expect JSON]    MasterKeys(opts) -> {"keys": ..., "generated": [...],
                           "fetch": {name: {"equal", "fetched_len", "file_len"}},
                           "list": [...]}; --expect maps a master_keys name to
                           the file whose content Cache.fetch must return
  store --name N --value-hex H --as str|bytes
                           Cache(opts).store("master_keys", N, value as str or
                           bytes) -> {"ok": true}

"keys" is {"pub_str": MasterKeys.get_pub_str(), "master_pub": the master
key's public PEM, "cluster_pub": the cluster key's public PEM or null,
"sign_pub": the signing key's public PEM or null}.
"""

import argparse
import json
import logging
import os
import sys

import salt_layout
import salt_log


class DriverError(Exception):
    """A usage or Salt-side failure: reported on stderr, exit status 2."""


_GENERATED = []


class _Capture(salt_log.Stderr):
    """Records the key pairs Salt generates (crypt.py find_or_create_keys
    logs "Generating key-pair for %s" before gen_keys); shows warnings."""

    def emit(self, record):
        msg = salt_log.message(record)
        if msg is not None and msg.startswith("Generating key-pair for"):
            _GENERATED.append(msg[len("Generating key-pair for ") :])
        elif record.levelno >= logging.WARNING:
            super().emit(record)


def _opts(args):
    import salt.config  # pylint: disable=import-outside-toplevel

    opts = salt.config.DEFAULT_MASTER_OPTS.copy()
    root = os.path.abspath(args.root)
    opts.update(
        {
            "root_dir": root,
            "cachedir": os.path.join(root, "cache"),
            "extension_modules": os.path.join(root, "extmods"),
            "sock_dir": os.path.join(root, "sock"),
            "pki_dir": os.path.abspath(args.pki_dir),
            "id": args.id,
            "__role": "master",
            "keys.cache_driver": args.driver,
            "cluster_id": args.cluster_id,
            "cluster_pki_dir": (
                os.path.abspath(args.cluster_pki_dir) if args.cluster_id else None
            ),
            "keysize": 2048,
            "user": None,
            "master_sign_pubkey": bool(args.sign),
        }
    )
    if args.cluster_id and not args.cluster_pki_dir:
        raise DriverError("--cluster-id needs --cluster-pki-dir")
    opts.update(salt_layout.opts(args))
    return opts


def _pub_pem(key):
    from cryptography.hazmat.primitives import (  # pylint: disable=import-outside-toplevel
        serialization,
    )

    if key is None:
        return None
    return (
        key.public_key()
        .public_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        .decode()
    )


def _master_keys(opts):
    import salt.crypt  # pylint: disable=import-outside-toplevel

    mk = salt.crypt.MasterKeys(opts)
    keys = {
        "pub_str": mk.get_pub_str(),
        "master_pub": _pub_pem(mk.master_key.key),
        "cluster_pub": _pub_pem(mk.cluster_key.key) if mk.cluster_key else None,
        "sign_pub": (
            _pub_pem(mk.sign_key.key) if getattr(mk, "sign_key", None) else None
        ),
    }
    return mk, keys


def cmd_setup(args):
    opts = _opts(args)
    mk, keys = _master_keys(opts)
    if args.signature:
        if not args.sign:
            raise DriverError("--signature needs --sign")
        if not mk.gen_signature():
            raise DriverError("gen_signature() wrote nothing")
    return {"keys": keys, "generated": list(_GENERATED)}


def cmd_serve(args):
    import salt.cache  # pylint: disable=import-outside-toplevel

    opts = _opts(args)
    _, keys = _master_keys(opts)
    generated = list(_GENERATED)
    cache = salt.cache.Cache(opts, driver=opts["keys.cache_driver"])
    fetched = {}
    for name, path in json.loads(args.expect or "{}").items():
        value = cache.fetch("master_keys", name)
        with open(path, "rb") as fh:
            raw = fh.read()
        fetched[name] = {
            "equal": isinstance(value, str) and value == raw.decode("utf-8"),
            "type": type(value).__name__,
            "fetched_len": len(value) if isinstance(value, (str, bytes)) else None,
            "file_len": len(raw),
        }
    return {
        "keys": keys,
        "generated": generated,
        "fetch": fetched,
        "list": sorted(cache.list("master_keys")),
    }


def cmd_store(args):
    import salt.cache  # pylint: disable=import-outside-toplevel

    opts = _opts(args)
    raw = bytes.fromhex(args.value_hex)
    value = raw if args.as_ == "bytes" else raw.decode("utf-8")
    salt.cache.Cache(opts, driver=opts["keys.cache_driver"]).store(
        "master_keys", args.name, value
    )
    return {"ok": True}


def build_parser():
    p = argparse.ArgumentParser(prog="master_keys.py")
    p.add_argument("--root", required=True)
    p.add_argument("--pki-dir", required=True)
    p.add_argument("--cluster-pki-dir")
    p.add_argument("--cluster-id")
    p.add_argument("--id", required=True)
    p.add_argument("--driver", choices=["localfs_key", "mmap_key"], required=True)
    p.add_argument("--size", type=int)
    p.add_argument("--slot-size", type=int)
    p.add_argument("--id-size", type=int)
    p.add_argument("--max-segment-bytes", type=int)
    p.add_argument("--sign", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--signature", action="store_true")
    s = sub.add_parser("serve")
    s.add_argument("--expect")
    s = sub.add_parser("store")
    s.add_argument("--name", required=True)
    s.add_argument("--value-hex", required=True)
    s.add_argument("--as", dest="as_", choices=["str", "bytes"], required=True)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    import salt  # pylint: disable=import-outside-toplevel,unused-import

    salt_log.only_handler(_Capture(), logging.INFO)
    try:
        doc = {"setup": cmd_setup, "serve": cmd_serve, "store": cmd_store}[args.cmd](
            args
        )
    except DriverError as exc:
        sys.stderr.write(f"master_keys.py: {exc}\n")
        return 2
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
