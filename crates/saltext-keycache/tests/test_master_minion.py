"""A real salt-master with ``keys.cache_driver: keycache`` and a real salt-minion.

Both run on 127.0.0.1 on ports the test picks, in the foreground, in process
groups of their own that the test stops at the end (also on failure). One run
per way of accepting the key:

``keycache_accept``
    ``keycache accept -y --tree always -c <master confdir> <pki_dir> <id>``,
    the CLI writing the store behind the running master's back.
``salt_key``
    ``salt-key -c <master confdir> -a <id> -y``: Salt's own Key class, through
    the ``keycache`` driver.
``salt_key`` with ``keycache_tree: accepted``
    the same, with ``minions/`` alone kept in step: the pending key gets no
    ``minions_pre/`` file, and the steps below pass all the same (Salt reads
    ``minions/`` alone); step 5's ``keycache delete`` takes the config's
    setting (no ``--tree``).

Each run checks, in order:

1. the minion's key arrives pending (``keycache list --json`` and
   ``salt-key -L --out json`` agree; the driver mirrors it to ``minions_pre/``);
2. after the accept the store says accepted, the tree has ``minions/<id>``
   holding the minion's public key (Salt's ``validate_token`` reads that file on
   every AES request) and ``salt <id> test.ping`` answers True;
3. the running minion's own AES request (a ``fire_master`` event it forwards as
   ``_minion_event``) reaches the master's event bus (the positive control of
   step 5);
4. the master, stopped and started again, serves the same public key: the
   ``master_keys`` bank of the driver holds the same names and the same
   ``<master id>.pub``, the minion's cached ``minion_master.pub`` is that key
   and unchanged, no key pair is generated, and test.ping answers True again;
5. after ``keycache delete -y --tree always`` the key is gone from the store and
   the tree, ``salt <id> test.ping`` gets no True answer, and the minion's own
   request is refused: it never reaches the master's event bus and the master
   logs ``validate_token``'s line "Salt minion claiming to be <id> attempted to
   communicate with master, but key could not be read and verification was
   denied".

``KEYCACHE_MM_DRIVER=mmap_key`` runs the same steps against Salt's own
``mmap_key`` driver (how this test was developed): that driver keeps no key
tree, so there the tree checks are skipped over and, after ``salt-key -a``,
the test writes ``minions/<id>`` itself, which is what keycache does for you.
"""

import os
import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import master_minion_support as mm  # noqa: E402  pylint: disable=wrong-import-position

DRIVER = os.environ.get("KEYCACHE_MM_DRIVER", "keycache")
# keycache keeps minions/, minions_pre/, ... in step (keycache_tree defaults to True)
# and writes the master_keys bank 0600; Salt's mmap_key does neither
DRIVER_KEEPS_TREE = DRIVER != "mmap_key"


@pytest.fixture
def pair(tmp_path, keycache_bin, tree):
    if DRIVER == "keycache":
        mm.require_keycache_driver()
    elif tree != "whole":
        pytest.skip("keycache_tree is the keycache driver's")
    extra = {"keycache_tree": "accepted"} if tree == "accepted" else None
    with mm.stopped_after(mm.SaltPair(tmp_path, DRIVER, keycache_bin, extra)) as salt_pair:
        yield salt_pair


def _key(text):
    return text.strip() if isinstance(text, str) else text


def _read(path):
    return pathlib.Path(path).read_text()


def _states(listing):
    return {state: sorted(ids) for state, ids in listing.items()}


@pytest.mark.parametrize(
    "accept_via,tree",
    [("keycache_accept", "whole"), ("salt_key", "whole"), ("salt_key", "accepted")],
)
def test_master_minion(pair, accept_via, tree):  # pylint: disable=redefined-outer-name
    started = time.monotonic()
    phases = []

    def phase(label):
        phases.append(f"{label} {time.monotonic() - started:.1f}s")

    mid = mm.MINION_ID
    pki = pair.master_pki
    try:
        # ---- master up; its own key pair lives in the driver's master_keys bank
        pair.start_master()
        keys_at_start = pair.master_keys()
        assert keys_at_start["driver"] == DRIVER
        master_pub_name = f"{mm.MASTER_ID}.pub"
        assert f"{mm.MASTER_ID}.pem" in keys_at_start["names"], keys_at_start["names"]
        assert master_pub_name in keys_at_start["pub"], keys_at_start
        assert "BEGIN PUBLIC KEY" in keys_at_start["pub"][master_pub_name]
        cli_master_keys = pair.keycache_list("master_keys")
        assert sorted(cli_master_keys["master_keys"]) == keys_at_start["names"]
        if DRIVER_KEEPS_TREE:
            # the heap holds the master's private key: keycache writes it 0600
            # (Salt's mmap_key leaves it 0644, see docs/design.md, "The Salt driver")
            for name in (".mmap_master.idx", ".mmap_master.idx.heap"):
                mode = (pki / name).stat().st_mode & 0o777
                assert mode & 0o077 == 0, f"{name} is mode {mode:o}"

        phase("master up")
        # ---- 1. the minion's key arrives pending
        pair.start_minion()

        def pending_arrived():
            if mid not in pair.keycache_list().get("minions_pre", []):
                return False
            # The master's driver writes minions_pre/<id> after the bank
            # (the second half of the tree's writes): wait for it too.
            return not (DRIVER_KEEPS_TREE and tree == "whole") or (pki / "minions_pre" / mid).exists()

        mm.wait_for(
            "the minion's key to arrive pending (keycache list --json, and minions_pre/<id>)",
            pending_arrived,
            60,
            alive=[pair.master, pair.minion],
        )
        listing = _states(pair.keycache_list())
        assert listing == {
            "minions": [],
            "minions_pre": [mid],
            "minions_rejected": [],
            "minions_denied": [],
        }, listing
        assert _states(pair.salt_key_list()) == listing
        minion_pub = _read(pair.minion_pki / "minion.pub")
        if DRIVER_KEEPS_TREE and tree == "accepted":
            # minions/ alone is kept: a sign-in writes no file
            assert not (pki / "minions_pre" / mid).exists()
            assert not (pki / "minions" / mid).exists()
        elif DRIVER_KEEPS_TREE:
            assert _key(_read(pki / "minions_pre" / mid)) == _key(minion_pub)
            assert not (pki / "minions" / mid).exists()

        phase("pending")
        # ---- 2. accept, then test.ping answers True
        accepted_before = pair.master_log_text().count(f"Authentication accepted from {mid}")
        ready_before = pair.minion_ready_count()
        if accept_via == "keycache_accept":
            proc = pair.keycache(
                "accept", "-y", "--tree", "always", "-c", pair.master_conf, pki, mid
            )
        else:
            proc = mm.run(
                [mm.salt_script("salt-key"), "-c", pair.master_conf, "-a", mid, "-y"], timeout=60
            )
        assert proc.returncode == 0, f"accept exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        listing = _states(pair.keycache_list())
        assert listing["minions"] == [mid] and listing["minions_pre"] == [], listing
        assert _states(pair.salt_key_list()) == listing
        if DRIVER_KEEPS_TREE or accept_via == "keycache_accept":
            assert (pki / "minions" / mid).is_file(), sorted(os.listdir(pki / "minions"))
            assert _key(_read(pki / "minions" / mid)) == _key(minion_pub)
            assert not (pki / "minions_pre" / mid).exists()
        else:
            # Salt's mmap_key writes no tree: validate_token would refuse every
            # AES request of the minion (see docs/design.md, "The Salt driver")
            assert not (pki / "minions" / mid).exists()
            (pki / "minions" / mid).write_text(minion_pub)
        mm.wait_for(
            "the master to log the accepted minion's sign-in",
            lambda: pair.master_log_text().count(f"Authentication accepted from {mid}")
            > accepted_before,
            60,
            alive=[pair.master, pair.minion],
        )
        pair.wait_minion_ready(ready_before)
        pair.wait_ping_true(timeout=60)

        phase("accepted, ping True")
        # ---- 3. the minion's own AES request reaches the master (control of step 5)
        probe = pair.fire_from_minion("kcmm/probe/accepted", wait=20)
        assert probe["fired"] and probe["seen"], probe
        assert probe["data"]["id"] == mid and probe["data"]["cmd"] == "_minion_event", probe

        phase("probe seen")
        # ---- 4. the master restarted keeps its public key
        served = _read(pair.minion_pki / "minion_master.pub")
        assert _key(served) == _key(keys_at_start["pub"][master_pub_name])
        keys_before = pair.master_keys()
        assert keys_before == keys_at_start
        pub_file = pki / "master.pub"
        pub_file_before = _read(pub_file) if pub_file.exists() else None
        if pub_file_before is not None:
            assert _key(pub_file_before) == _key(served)
        ready_before = pair.minion_ready_count()
        pair.master.stop()
        mm.wait_for(
            "the master's ports to close",
            lambda: not mm.port_open(pair.ret_port) and not mm.port_open(pair.pub_port),
            30,
        )
        log_offset = len(pair.master_log_text())
        pair.start_master()
        keys_after = pair.master_keys()
        assert keys_after == keys_before, (keys_before, keys_after)
        restart_log = pair.master_log_text()[log_offset:]
        assert "Generating key-pair" not in restart_log, restart_log
        assert "Setting up the Salt Master" in restart_log  # it is the new master's log
        pair.wait_minion_ready(ready_before)
        pair.wait_ping_true(timeout=60)
        assert _read(pair.minion_pki / "minion_master.pub") == served
        assert (_read(pub_file) if pub_file.exists() else None) == pub_file_before
        listing = _states(pair.keycache_list())
        assert listing["minions"] == [mid], listing

        phase("restarted, ping True")
        # ---- 5. keycache delete: the minion's requests are refused
        # with keycache_tree: accepted, the CLI takes the config's setting
        tree_flag = [] if tree == "accepted" else ["--tree", "always"]
        proc = pair.keycache("delete", "-y", *tree_flag, "-c", pair.master_conf, pki, mid)
        assert proc.returncode == 0, f"delete exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        listing = _states(pair.keycache_list())
        assert mid not in listing["minions"], listing
        assert not (pki / "minions" / mid).exists()
        log_offset = len(pair.master_log_text())

        answer, proc = pair.ping(timeout=10)
        assert answer is not True, f"test.ping answered after delete:\n{proc.stdout}\n{proc.stderr}"
        phases.append(f"(ping after delete: rc {proc.returncode}, {proc.stdout.strip()[:80]!r})")

        refused_line = mm.REFUSED_LINE.format(id=mid)
        probe = pair.fire_from_minion(
            "kcmm/probe/deleted", wait=30, until_logged=refused_line, log_offset=log_offset
        )
        assert probe["fired"], probe
        assert not probe["seen"], f"the deleted minion's request reached the master: {probe}"
        mm.wait_for(
            f"the master to log {refused_line!r}",
            lambda: refused_line in pair.master_log_text()[log_offset:],
            30,
            alive=[pair.master],
        )
        phase("refused")
        # a minion that signs in again is not let back in by itself
        listing = _states(pair.keycache_list())
        assert mid not in listing["minions"], listing
        assert _states(pair.salt_key_list()) == listing
        answer, proc = pair.ping(timeout=5)
        assert answer is not True, f"test.ping answered after delete:\n{proc.stdout}\n{proc.stderr}"
    except BaseException:
        print(
            f"driver={DRIVER} accept_via={accept_via} tree={tree} failed after "
            f"{time.monotonic() - started:.1f} s; phases: {phases}"
        )
        print(pair.diagnostics())
        raise
    phase("done")
    print(f"driver={DRIVER} accept_via={accept_via} tree={tree}: {'; '.join(phases)}")
