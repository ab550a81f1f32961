"""The ``keycache`` CLI as the driver tests run it: bounded in time, no colour, and on
the table layout of the Salt opts under test.

Shared by the interop, concurrency, guard, runner and second-master tests and Salt's
own unit suite (``salt_suite``), which runs ``keycache migrate`` where Salt rebuilds
from the tree.
"""

import os
import subprocess

# Every CLI run of these tests is bounded by this many seconds.
CLI_TIMEOUT = 60


def layout_args(opts):
    """The CLI's layout flags for the mmap_key_* sizes of Salt ``opts``."""
    return [
        "--size",
        str(opts["mmap_key_size"]),
        "--slot-size",
        str(opts["mmap_key_slot_size"]),
        "--id-size",
        str(opts["mmap_key_id_size"]),
    ]


def run_keycache(keycache_bin, *args, timeout=CLI_TIMEOUT):
    """``keycache <args>`` with NO_COLOR, bounded by ``timeout`` seconds; the CompletedProcess (text)."""
    return subprocess.run(
        [keycache_bin, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, NO_COLOR="1"),
        check=False,
    )


def run_cli(keycache_bin, opts, *args):
    """``keycache <args> <layout of opts>`` with NO_COLOR; the CompletedProcess (text)."""
    return run_keycache(keycache_bin, *args, *layout_args(opts))
