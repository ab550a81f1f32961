#!/usr/bin/env python3
"""Run the REAL Salt 3008.5 ``ReqServerChannel.validate_token``
(salt/channel/server.py) against a pki dir, for keycache's tests of the key
tree.

On every AES request of a signed-in minion (version 3), the master's request
server calls ``validate_token(payload)``: it pops ``tok`` from the load,
reads ``<pki_dir or cluster_pki_dir>/minions/<id>`` from disk with
``salt.crypt.PublicKey.from_file`` and checks that ``pub.decrypt(tok)`` is
``b"salt"``.  The minion makes ``tok`` with ``AsyncAuth.gen_token(b"salt")``
(salt/crypt.py): ``PrivateKey.from_str(minion.pem).encrypt(b"salt")``, an
X9.31 signature with its private key.  This script does exactly that: it
makes each minion's token with Salt's ``PrivateKey`` and hands
``{"enc": "aes", "load": {"id": ID, "tok": TOK}}`` to Salt's own
``validate_token`` on a ``ReqServerChannel`` whose ``opts`` point at the
pki dir.

``salt.channel.server`` imports ``salt.master``, which needs ``requests``
(and its urllib3, idna, certifi).  When that import fails for a missing
third-party module, the script runs the same function from Salt's own
source: the ``validate_token`` definition of ``ReqServerChannel`` is taken
from the installed salt/channel/server.py (by ``ast``, unchanged) and
executed with the module's names it uses (``salt``, ``log``).  The output
says which (``"mode"``).

Subcommands (one JSON document on stdout; errors on stderr, exit 2):

  keygen --out DIR --ids A,B [--keysize N]
      salt.crypt.gen_keys for each id: DIR/<id>.pem (0600) and DIR/<id>.pub
      -> {"pubs": {id: public PEM}}
  check --keys DIR (--pki-dir P --ids A,B [--cluster-pki-dir C] | --stdin)
      -> {"mode": ..., "results": [{"pki_dir", "id", "valid"}...]}
      With --stdin, a JSON list of {"pki_dir", "ids", ["cluster_pki_dir"]}
      jobs is read from stdin (one process for many pki dirs).
"""

import argparse
import ast
import json
import logging
import os
import sys

import salt_log


class DriverError(Exception):
    """A usage or Salt-side failure: reported on stderr, exit status 2."""


def _validate_token():
    """Salt's ReqServerChannel.validate_token, and how it was obtained."""
    try:
        import salt.channel.server  # pylint: disable=import-outside-toplevel

        cls = salt.channel.server.ReqServerChannel

        def make(opts):
            chan = cls.__new__(cls)
            chan.opts = opts
            return chan.validate_token

        return make, "salt.channel.server.ReqServerChannel.validate_token"
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "salt":
            raise
        missing = exc.name
    import importlib.util  # pylint: disable=import-outside-toplevel

    import salt.crypt  # pylint: disable=import-outside-toplevel
    import salt.exceptions  # pylint: disable=import-outside-toplevel
    import salt.utils.verify  # pylint: disable=import-outside-toplevel

    spec = importlib.util.find_spec("salt.channel")
    path = os.path.join(os.path.dirname(spec.origin), "server.py")
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    func = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ReqServerChannel":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "validate_token":
                    func = item
    if func is None:
        raise DriverError(f"no ReqServerChannel.validate_token in {path}")
    module = ast.Module(body=[func], type_ignores=[])
    namespace = {
        "salt": salt,
        "log": logging.getLogger("salt.channel.server"),
    }
    exec(compile(module, path, "exec"), namespace)  # pylint: disable=exec-used
    fn = namespace["validate_token"]

    class _Chan:
        def __init__(self, opts):
            self.opts = opts

    def make(opts):
        chan = _Chan(opts)
        return lambda payload: fn(chan, payload)

    return make, f"source of ReqServerChannel.validate_token ({missing} missing)"


def _token(keys, mid):
    import salt.crypt  # pylint: disable=import-outside-toplevel

    path = os.path.join(keys, f"{mid}.pem")
    if not os.path.isfile(path):
        raise DriverError(f"no private key for {mid!r} in {keys}")
    with open(path, encoding="utf-8") as fh:
        priv = fh.read()
    # AsyncAuth.get_keys + gen_token, as the minion makes it.
    return salt.crypt.PrivateKey.from_str(priv, None).encrypt(b"salt")


def cmd_keygen(args):
    import salt.crypt  # pylint: disable=import-outside-toplevel

    os.makedirs(args.out, exist_ok=True)
    pubs = {}
    for mid in [i for i in args.ids.split(",") if i]:
        priv, pub = salt.crypt.gen_keys(args.keysize)
        pem = os.path.join(args.out, f"{mid}.pem")
        fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(priv)
        with open(os.path.join(args.out, f"{mid}.pub"), "w", encoding="utf-8") as fh:
            fh.write(pub)
        pubs[mid] = pub
    return {"pubs": pubs}


def cmd_check(args):
    if args.stdin:
        jobs = json.load(sys.stdin)
    else:
        if not args.pki_dir or args.ids is None:
            raise DriverError("check needs --pki-dir and --ids, or --stdin")
        jobs = [
            {
                "pki_dir": args.pki_dir,
                "cluster_pki_dir": args.cluster_pki_dir,
                "ids": [i for i in args.ids.split(",") if i],
            }
        ]
    make, mode = _validate_token()
    results = []
    for job in jobs:
        opts = {"pki_dir": os.path.abspath(job["pki_dir"])}
        if job.get("cluster_pki_dir"):
            opts["cluster_id"] = "keycache_cluster"
            opts["cluster_pki_dir"] = os.path.abspath(job["cluster_pki_dir"])
        validate = make(opts)
        for mid in job["ids"]:
            payload = {"enc": "aes", "load": {"id": mid, "tok": _token(args.keys, mid)}}
            valid = validate(payload)
            if "tok" in payload["load"]:
                raise DriverError("validate_token did not pop the token")
            results.append({"pki_dir": job["pki_dir"], "id": mid, "valid": bool(valid)})
    return {"mode": mode, "results": results}


def build_parser():
    p = argparse.ArgumentParser(prog="validate_token.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keygen")
    k.add_argument("--out", required=True)
    k.add_argument("--ids", required=True)
    k.add_argument("--keysize", type=int, default=2048)
    c = sub.add_parser("check")
    c.add_argument("--keys", required=True)
    c.add_argument("--pki-dir")
    c.add_argument("--cluster-pki-dir")
    c.add_argument("--ids")
    c.add_argument("--stdin", action="store_true")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    salt_log.only_handler(salt_log.Stderr(), logging.WARNING)
    try:
        out = {"keygen": cmd_keygen, "check": cmd_check}[args.cmd](args)
    except DriverError as exc:
        sys.stderr.write(f"validate_token.py: {exc}\n")
        return 2
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
