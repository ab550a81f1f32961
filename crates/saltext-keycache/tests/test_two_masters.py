"""Merges judged by two real salt-masters and a real salt-minion.

Setup (two_masters_support.py): master A on 127.0.0.1 and master B on
127.0.0.2, each with its own ``pki_dir`` and keycache store
(``keys.cache_driver: keycache``), sharing one master key pair as classic
multi-master setups do (so keycache sees one cluster, named by ``master.pub``),
and one salt-minion with ``master: [127.0.0.1, 127.0.0.2]`` signed in to both.
The masters have no channel between them: keys go from one store to the other
only through docs/install.md's merge timer, run here behind the running masters'
backs (``keycache snapshot -c <peer> --seen ...`` into
``keycache merge -c <this> FILE --base F --write-base F``).

The judges are the masters themselves: ``salt <id> test.ping`` from a master
answers True only when that master signed the minion in and its
``validate_token`` took the minion's return; the minion's own AES request (a
``fire_master`` event its every connection forwards) reaches a master's event
bus, or that master logs validate_token's "key could not be read and
verification was denied"; a master answers a sign-in "pending". Beside them,
``keycache list --json`` and the ``minions/<id>`` file validate_token reads.

1. Accept on A only: B does not serve the minion; after a merge A -> B it does
   (test.ping True from both, the minion's request reaches both buses).
2. Delete on A, merge A -> B: both refuse the minion's request and give no
   test.ping answer; the minion signs in again and both masters answer
   "pending"; three rounds of merges both ways keep it out on both; B's
   snapshot taken while B still accepted the key (in step 1), merged into A, is
   refused (exit 2: a replay, since A merged newer snapshots of B), writes
   nothing, and A still answers the minion "pending".
3. A re-accepts the key (served by both after a merge), then B is wiped (the
   minion stopped, B stopped, B's key banks, history and key tree removed, its
   master key bank kept, B started): B's snapshot merged into A deletes
   nothing (A's listing and ``minions/<id>`` unchanged); a merge A -> B gives
   B the key back, and the minion started again is served by both.

In step 1, B first observes the minion's pending key after A's last
observation before the accept (a merge A -> B right after the sign-in), and
B's snapshot is merged into A first after the accept: a first sign-in revokes
nothing (docs/design.md, "Versions"), so A's accept must survive that merge
(before that rule, B's pending entry, stamped at B's later observation, undid
it on A).
"""

import pathlib
import shutil
import sys
import time


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import master_minion_support as mm  # noqa: E402  pylint: disable=wrong-import-position
import two_masters_support as tm  # noqa: E402  pylint: disable=wrong-import-position

MID = tm.MINION_ID
EMPTY = {"minions": [], "minions_pre": [], "minions_rejected": [], "minions_denied": []}


def _history(master):
    return {
        name: (master.pki / name).read_bytes()
        for name in (".keycache-history", ".keycache-identity")
        if (master.pki / name).exists()
    }


def _wipe_key_store(master):
    """Remove everything of ``master``'s pki_dir but its master key bank and master.pub."""
    removed = []
    for path in sorted(master.pki.iterdir()):
        if path.name.startswith(".mmap_master.idx") or path.name == "master.pub":
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(path.name)
    return removed


def test_merges_between_two_real_masters(masters):
    a, b = masters.a, masters.b
    started = time.monotonic()
    phases = []

    def phase(label):
        phases.append(f"{label} {time.monotonic() - started:.1f}s")

    def states():
        return a.state_of(), b.state_of()

    try:
        masters.start_masters()
        master_pub = (a.pki / "master.pub").read_bytes()
        assert (b.pki / "master.pub").read_bytes() == master_pub
        assert tm.GENERATING_LINE not in b.log_text(), "B made its own key pair"
        minion_pub = masters.start_minion_pending()
        # a timer has run since the sign-in: A observed, then B (its first
        # observation of the pending key comes after A's last one)
        masters.pull_ok(b, a)
        assert states() == ("minions_pre", "minions_pre")
        phase("pending on both")

        # ---- 1. accept on A only, merge A -> B: B serves the minion
        a.keycache_ok("accept", "-y", "-c", a.conf, MID)
        assert states() == ("minions", "minions_pre")
        assert a.accept_key_file() == minion_pub and b.accept_key_file() is None
        # B's pending key (a first sign-in there) does not undo A's accept
        masters.pull_ok(a, b)
        assert states() == ("minions", "minions_pre"), "B's pending key undid A's accept"
        assert a.accept_key_file() == minion_pub
        masters.assert_serves(a)
        masters.assert_no_answer(b)
        assert b.pending_answers() > 0
        masters.pull_ok(b, a)
        assert states() == ("minions", "minions")
        assert b.accept_key_file() == minion_pub
        masters.assert_serves(a, b)
        masters.assert_probe("kc2m/probe/accepted", {"A": True, "B": True})
        # B's snapshot while it accepts the key: replayed into A in step 2
        old_b = b.snapshot(a.merge_dir / "old-B.snap", seen_by=a)
        phase("1 accepted on A, served by B after the merge")

        # ---- 2. delete on A, merge A -> B: refused on both, and it stays so
        a.keycache_ok("delete", "-y", "-c", a.conf, MID)
        assert a.state_of() is None and a.accept_key_file() is None
        masters.pull_ok(b, a)
        assert states() == (None, None)
        assert b.accept_key_file() is None
        masters.assert_no_answer(a, b)
        masters.assert_probe("kc2m/probe/revoked", {"A": False, "B": False})
        # refused, the minion signs in again: a new key to both, held pending
        mm.wait_for(
            "the refused minion to sign in again, pending on both masters",
            lambda: states() == ("minions_pre", "minions_pre"),
            60,
            alive=masters.daemons,
        )
        for _ in range(3):
            masters.pull_ok(a, b)
            masters.pull_ok(b, a)
            assert states() == ("minions_pre", "minions_pre")
            assert a.accept_key_file() is None and b.accept_key_file() is None
        # B's old snapshot, taken while B accepted the key: refused, nothing written
        listing, history = a.listing(), _history(a)
        proc = a.merge(old_b, b)
        assert proc.returncode == 2, (
            f"merging B's old snapshot into A exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
        assert "refus" in proc.stderr.lower(), proc.stderr
        assert a.listing() == listing and _history(a) == history
        assert a.accept_key_file() is None
        pending_before = a.pending_answers()
        mm.wait_for(
            "master A to answer the minion's next sign-in pending",
            lambda: a.pending_answers() > pending_before,
            30,
            alive=masters.daemons,
        )
        masters.assert_no_answer(a, b)
        assert a.salt_key_list()["minions"] == [] and b.salt_key_list()["minions"] == []
        phase("2 revoked on both, old snapshot refused")

        # ---- 3. a wiped peer deletes nothing, and gets the keys back
        masters.pull_ok(a, b)
        a.keycache_ok("accept", "-y", "-c", a.conf, MID)
        masters.pull_ok(b, a)
        assert states() == ("minions", "minions")
        masters.assert_serves(a, b)
        masters.minion.stop()
        b.stop()
        removed = _wipe_key_store(b)
        assert ".mmap_keys.idx" in removed and ".keycache-history" in removed, removed
        b.start()
        assert b.listing() == EMPTY
        assert (b.pki / "master.pub").read_bytes() == master_pub
        listing, accepted = a.listing(), a.accept_key_file()
        assert listing["minions"] == [MID] and accepted == minion_pub
        proc = masters.pull(a, b)
        assert proc.returncode == 0, f"merge of wiped B into A exited {proc.returncode}\n{proc.stderr}"
        assert a.listing() == listing and a.accept_key_file() == accepted
        masters.pull_ok(b, a)
        assert states() == ("minions", "minions") and b.accept_key_file() == minion_pub
        masters.minion.start()
        masters.assert_serves(a, b)
        masters.assert_probe("kc2m/probe/after-wipe", {"A": True, "B": True})
        phase("3 wiped B deleted nothing, served again")
    except BaseException:
        print(f"failed after {time.monotonic() - started:.1f} s; phases: {phases}")
        print(masters.diagnostics())
        raise
    phase("done")
    print("; ".join(phases))
