"""One key state with real salt-masters: both on one etcd (``keycache_etcd``),
each master's keycache store a live replica kept by the ``keycache`` engine
(``engines: [keycache: {}]``, run by the master's own process manager, as an
operator runs it).

1. Classic multi-master (two_masters_support.py): master A on 127.0.0.1 and B
   on 127.0.0.2, one master key pair, the minion's ``master: [A, B]``.
2. A Salt 3008 cluster with isolated filesystems: A and B with ids and
   ``cluster_peers`` by address (Salt's cluster reaches a peer at its id),
   one ``cluster_id``, each its own ``cluster_pki_dir`` (the key store and
   tree there), ``cluster_isolated_filesystem: true``; the etcd prefix is the
   driver's default, ``/keycache/<cluster_id>/``. A, the lowest address,
   founds the cluster; B joins it over the wire (cluster key and AES key in
   the join reply). The minion signs in to both, as in 1.

The same checks on both:

- the minion's key arrives pending on both masters, through etcd (etcd holds
  it pending, and each store holds what etcd holds);
- ``salt-key -a <id> -y`` on A only: ``salt <id> test.ping`` run on B answers
  True (B's replica got the accept from etcd); then A serves it too and both
  masters take its request, so that the minion has signed in to both before
  the delete;
- ``salt-key -d <id> -y`` on B: a request the minion sends the moment it
  returns is refused by A (validate_token's refusal in A's log within 1 s,
  never on A's event bus; B refuses it too), and ``minions/<id>`` is gone
  from A's key tree.

Salt 3008.5's cluster code reads the master's key files from disk, not
through ``keys.cache_driver``: see :func:`_lay_out_cluster_pki`.
"""

import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import etcd_support as es  # noqa: E402  pylint: disable=wrong-import-position
import master_minion_support as mm  # noqa: E402  pylint: disable=wrong-import-position
import two_masters_support as tm  # noqa: E402  pylint: disable=wrong-import-position

MID = tm.MINION_ID
PENDING, ACCEPTED = b"\x02", b"\x01"
CLUSTER_ID = "kc-etcd-cluster"
# A refusal of the minion's request must be in A's log this soon after
# `salt-key -d` returned on B.
REFUSED_WITHIN = 1.0


@pytest.fixture
def etcd(tmp_path):
    member = es.Etcd(tmp_path / "etcd")
    member.start()
    yield member
    member.stop()


def _salt_key(master, *args):
    proc = mm.run([mm.salt_script("salt-key"), "-c", master.conf, *args], timeout=60)
    assert proc.returncode == 0, (
        f"master {master.name}: salt-key {' '.join(args)} exited {proc.returncode}\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def _checks(pair, etcd, prefix, phase):
    """The issue's checks on the running masters ``pair.a`` and ``pair.b``."""
    a, b = pair.a, pair.b
    key = f"{prefix}keys/{MID}"

    def states():
        return a.state_of(), b.state_of()

    # ---- the minion's key arrives pending on both, through etcd
    minion_pub = pair.start_minion_pending()
    value = etcd.get(key)
    assert value is not None and value[:1] == PENDING, f"etcd's {key}: {value!r}"
    assert value[1:].strip() == minion_pub
    for master in (a, b):
        assert master.salt_key_list()["minions_pre"] == [MID], master.name
    phase("pending on both")

    # ---- accepted on A only: B answers test.ping
    _salt_key(a, "-a", MID, "-y")
    value = etcd.get(key)
    assert value is not None and value[:1] == ACCEPTED, f"etcd's {key}: {value!r}"
    assert a.accept_key_file() == minion_pub
    b.wait_ping_true(pair.daemons, timeout=60)
    assert states() == ("minions", "minions")
    assert b.accept_key_file() == minion_pub
    phase("accepted on A, test.ping on B True")
    # The minion signs in to each master on its own schedule: to A it may
    # still be waiting out a pending answer (acceptance_wait_time) when B
    # already serves it. A request can be refused by A only once the minion
    # has a session with A, so both must take its request before the delete.
    pair.assert_serves(a)
    pair.assert_probe("kcetcd/probe/accepted", {"A": True, "B": True})
    phase("served by A, its request taken by both")

    # ---- deleted on B: A refuses the minion's next request within a second
    result = pair.probe_after("kcetcd/probe/deleted-on-B", lambda: _salt_key(b, "-d", MID, "-y"))
    seen, refused, refused_after = result["A"]
    assert refused and not seen, f"master A did not refuse the minion's request: {result}"
    assert result["B"][1] and not result["B"][0], f"master B did not refuse the minion's request: {result}"
    assert refused_after <= REFUSED_WITHIN, (
        f"master A refused the minion's request {refused_after:.2f} s after the delete on B: {result}"
    )
    assert a.accept_key_file() is None, "minions/<id> still in A's key tree"
    assert etcd.get(key) is None or etcd.get(key)[:1] == PENDING
    phase(f"deleted on B, refused by A after {refused_after:.2f} s")


def _run(pair, etcd, prefix, start):
    started = time.monotonic()
    phases = []

    def phase(label):
        phases.append(f"{label} {time.monotonic() - started:.1f}s")

    try:
        start()
        es.wait_replicas(pair, prefix)
        phase("masters up, replicas listed")
        _checks(pair, etcd, prefix, phase)
    except BaseException:
        print(f"failed after {time.monotonic() - started:.1f} s; phases: {phases}")
        print(pair.diagnostics())
        raise
    print("; ".join(phases))


def test_classic_multi_master_on_one_etcd(etcd, keycache_bin):
    mm.require_keycache_driver()
    prefix = "/kc-classic/"

    def options(_name, _root, _interface):
        return es.master_options(etcd.endpoint, prefix)

    with mm.stopped_after(tm.TwoMasters(keycache_bin, options=options)) as pair:
        _run(pair, etcd, prefix, pair.start_masters)


def _lay_out_cluster_pki(pair, founder):
    """What each master's ``cluster_pki_dir`` and ``pki_dir`` hold before its
    first start, moved into its keycache store with ``keycache migrate``.

    Salt 3008.5's cluster code reads key files from disk, not through
    ``keys.cache_driver``: the master's ``pki_dir/master.pem`` and
    ``master.pub`` (discover, join), ``cluster_pki_dir/cluster.pem`` (the
    founder's discover reply), and each peer's public key both from
    ``peers/<id>.pub`` and, as ``MasterKeys.fetch("peers/<id>.pub")``, from
    the ``master_keys`` bank (the AES key events between peers); with
    ``localfs_key`` the bank is those files. So each master gets its key pair
    on disk, the founder the cluster key pair, each the other's public key
    in ``peers/`` (statically configured peers), and ``keycache migrate -c``
    copies them into the bank, as for a ``localfs_key`` cluster member
    switched to keycache. The joiner gets the cluster key pair over the wire.
    """
    import salt.crypt  # pylint: disable=import-outside-toplevel

    def write_pair(directory, name):
        priv, pub = salt.crypt.gen_keys(2048)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (directory / f"{name}.pem").write_text(priv)
        (directory / f"{name}.pem").chmod(0o400)
        (directory / f"{name}.pub").write_text(pub)
        return pub

    pubs = {m.id: write_pair(m.pki, "master") for m in (pair.a, pair.b)}
    write_pair(founder.store, "cluster")
    for master in (pair.a, pair.b):
        for peer, pub in pubs.items():
            if peer != master.id:
                (master.store / "peers" / f"{peer}.pub").write_text(pub)
        # an empty key tree: what a localfs_key cluster_pki_dir holds
        for state in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
            (master.store / state).mkdir()
        master.keycache_ok("migrate", "-c", master.conf)


def test_salt_cluster_with_isolated_filesystems_on_one_etcd(etcd, keycache_bin):
    mm.require_keycache_driver()
    hosts = ["127.0.0.1", "127.0.0.2"]
    (pool_port,) = tm.free_ports_on(hosts, 1)

    def options(_name, root, interface):
        cluster_pki = root / "cluster-pki"
        (cluster_pki / "peers").mkdir(parents=True)
        out = {
            "id": interface,
            "cluster_id": CLUSTER_ID,
            "cluster_peers": [h for h in hosts if h != interface],
            "cluster_pki_dir": str(cluster_pki),
            "cluster_pool_port": pool_port,
            "cluster_isolated_filesystem": True,
        }
        out.update(es.master_options(etcd.endpoint))
        return out

    with mm.stopped_after(tm.TwoMasters(keycache_bin, options=options)) as pair:

        def start():
            _lay_out_cluster_pki(pair, founder=pair.a)
            # A, the lowest address, founds the cluster; B joins it
            pair.a.start()
            pair.b.start()
            for master in (pair.a, pair.b):
                ready = master.root / "cache" / "health" / "ready"
                mm.wait_for(
                    f"master {master.name} to be a cluster voter ({ready})",
                    ready.exists,
                    90,
                    alive=pair.daemons,
                )
            # B joined A's cluster (its key pair came in the join reply), not one of its own
            cluster_pem = (pair.a.store / "cluster.pem").read_bytes()
            assert (pair.b.store / "cluster.pem").read_bytes() == cluster_pem

        _run(pair, etcd, f"/keycache/{CLUSTER_ID}/", start)
