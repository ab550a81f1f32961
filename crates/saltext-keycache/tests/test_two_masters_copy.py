"""A second master set up as a copy of the first's store, judged by two real salt-masters.

Setup (two_masters_support.py): masters A (127.0.0.1) and B (127.0.0.2), one
master key pair. Here B is made as operators make a second master: master A runs
alone, two minions sign in to it (pending), A is stopped and its whole
``pki_dir`` (key banks, keycache's history files, master key bank and
``master.pub``) is copied into B's (``cp -a``); A's pair is then put in B's
``master_keys`` bank under B's id. Both masters start; each minion signs in to
both.

Each master accepts one minion before the first merge round (``keycache
accept``: minion 1 on A, minion 2 on B); then docs/install.md's merge timer runs by
hand, B from A and A from B, twice. Every accept must survive: both minions
answer ``salt <id> test.ping`` from both masters.

Before the history of a store began when the store was made (the driver's
first write of the banks), both stores stamped every entry at their first
observation: the accept at the first stamp, the other master's pending key of
the same minion too, and the tie went to pending: both accepts undone on both
masters. The copy is also told apart from its original (a new store id), so
neither refuses the other's snapshot as its own.
"""

import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import master_minion_support as mm  # noqa: E402  pylint: disable=wrong-import-position
import two_masters_support as tm  # noqa: E402  pylint: disable=wrong-import-position

MID1 = tm.MINION_ID
MID2 = "kc-2m-minion-2"


def _second_minion(pair):
    """A second multi-master minion (``MID2``) beside the support's one."""
    root = pair.base / "n2"
    ports = (pair.a.pub_port, pair.a.ret_port)
    mm.write_minion_config(root, MID2, [pair.a.interface, pair.b.interface], ports)
    return mm.Daemon(
        "salt-minion 2",
        [mm.salt_script("salt-minion"), "-c", root / "conf", "-l", "warning"],
        root / "minion.out",
    )


def _copy_store(src, dst):
    """``cp -a`` of ``src``'s pki_dir into ``dst``'s (which holds nothing of a store yet)."""
    shutil.copytree(src.pki, dst.pki, symlinks=True, dirs_exist_ok=True)


def test_a_second_master_copied_from_the_first_keeps_both_masters_accepts(masters):
    a, b = masters.a, masters.b
    minion2 = _second_minion(masters)
    alive = lambda: [*masters.daemons, *([minion2] if minion2.proc is not None else [])]  # noqa: E731
    try:
        a.start()
        masters.minion.start()
        minion2.start()
        mm.wait_for(
            "both minions pending on master A",
            lambda: (a.state_of(MID1), a.state_of(MID2)) == ("minions_pre", "minions_pre"),
            60,
            alive=alive(),
        )
        # the driver's first write made A's store: its history began then
        assert (a.pki / ".keycache-identity").exists(), sorted(p.name for p in a.pki.iterdir())
        a.stop()
        _copy_store(a, b)
        proc = mm.run(
            [sys.executable, tm.HERE, "copy-master-keys", a.conf / "master", b.conf / "master"],
            timeout=90,
        )
        assert proc.returncode == 0, f"copy-master-keys exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        a.start()
        b.start()
        assert tm.GENERATING_LINE not in b.log_text(), "B made its own key pair"
        assert (a.pki / "master.pub").read_bytes() == (b.pki / "master.pub").read_bytes()
        for mid in (MID1, MID2):
            assert b.state_of(mid) == "minions_pre", mid

        # each master accepts one minion before the first merge round
        a.keycache_ok("accept", "-y", "-c", a.conf, MID1)
        b.keycache_ok("accept", "-y", "-c", b.conf, MID2)
        assert (a.state_of(MID1), a.state_of(MID2)) == ("minions", "minions_pre")
        assert (b.state_of(MID1), b.state_of(MID2)) == ("minions_pre", "minions")

        for _ in range(2):
            masters.pull_ok(b, a)
            masters.pull_ok(a, b)
        for master in (a, b):
            for mid in (MID1, MID2):
                assert master.state_of(mid) == "minions", (
                    f"master {master.name}: {mid} is {master.state_of(mid)}: an accept was undone"
                )
        for master in (a, b):
            for mid in (MID1, MID2):
                mm.wait_salt_ping_true(master.conf, mid, f" from master {master.name}", alive(), 90)
    except BaseException:
        print(masters.diagnostics())
        print(mm.tail(minion2.out_path))
        raise
    finally:
        minion2.stop()
