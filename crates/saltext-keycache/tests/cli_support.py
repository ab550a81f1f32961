"""The ``keycache`` CLI as the driver tests run it: bounded in time, no colour, and on
the table layout of the Salt opts under test.

Shared by the interop, concurrency and guard tests and Salt's own unit suite
(``salt_suite``), which runs ``keycache migrate`` where Salt rebuilds from the tree.
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


def run_cli(keycache_bin, opts, *args):
    """``keycache <args> <layout of opts>`` with NO_COLOR; the CompletedProcess (text)."""
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run(
        [keycache_bin, *args, *layout_args(opts)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=env,
        check=False,
    )
