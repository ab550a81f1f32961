"""A second master given the first one's key pair, as docs/install.md tells an
operator to do it.

Salt's multi-master tutorial copies ``master.pem`` and ``master.pub`` to the
second master. Under keycache (as under ``mmap_key``) the pair lives in the
``master_keys`` bank and no ``master.pem`` is on disk: ``keycache
export-master-keys`` writes the pair out (``master.pem`` 0600, never over a
file), the operator copies it into the second master's pki_dir and runs
``keycache migrate``, which stores it in that master's bank, then removes the
files. Salt's own ``MasterKeys`` (what salt-master runs at its start), in a
fresh process on each master, shows the proof: both masters serve the same
pair, and neither has a ``master.pem`` file.
"""

import getpass
import json
import os
import shutil
import stat
import subprocess
import sys

from cli_support import run_keycache

TIMEOUT = 120

# Run in a fresh interpreter: Salt's MasterKeys on the master config given,
# as salt-master runs it at its start; prints its public key and private key
# (from the bank, as a JSON object: only this test reads it).
MASTER_KEYS = """
import json, sys
import salt.cache, salt.config, salt.crypt
opts = salt.config.master_config(sys.argv[1])
keys = salt.crypt.MasterKeys(opts)
bank = salt.cache.Cache(opts, driver=opts["keys.cache_driver"])
mid = opts["id"].removesuffix("_master")
print(json.dumps({"pub": keys.get_pub_str(), "pem": bank.fetch("master_keys", mid + ".pem"),
                  "names": sorted(bank.list("master_keys"))}))
"""


def make_master(root, master_id):
    """``root/conf/master`` of a keycache master named ``master_id`` whose
    pki_dir is empty, as on a fresh install."""
    for sub in ("conf", "cache", "pki", "s"):
        (root / sub).mkdir(parents=True, mode=0o700)
    # what salt-master's start makes in pki_dir (salt/cli/daemons.py verify_env)
    for sub in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        (root / "pki" / sub).mkdir(mode=0o700)
    config = {
        "id": master_id,
        "root_dir": str(root),
        "pki_dir": str(root / "pki"),
        "cachedir": str(root / "cache"),
        "sock_dir": str(root / "s"),
        "log_file": str(root / "master.log"),
        "user": getpass.getuser(),
        "keys.cache_driver": "keycache",
        "mmap_key_size": 1009,
        "keysize": 2048,
    }
    (root / "conf" / "master").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
    return root / "conf"


def salt_master_keys(conf):
    """Salt's MasterKeys on ``conf`` in a fresh process: its pub, its bank's pem, the bank's names."""
    proc = subprocess.run(
        [sys.executable, "-c", MASTER_KEYS, str(conf / "master")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cli(keycache_bin, *args):
    return run_keycache(keycache_bin, *args, timeout=TIMEOUT)


def test_a_second_master_takes_the_first_ones_pair_from_its_bank(tmp_path, keycache_bin):
    conf_a = make_master(tmp_path / "alpha", "alpha")
    conf_b = make_master(tmp_path / "beta", "beta")
    pki_a = tmp_path / "alpha" / "pki"
    pki_b = tmp_path / "beta" / "pki"

    # Both masters have started once: Salt made each its own pair, in the bank only.
    alpha = salt_master_keys(conf_a)
    beta_own = salt_master_keys(conf_b)
    assert "alpha.pem" in alpha["names"] and "BEGIN PUBLIC KEY" in alpha["pub"], alpha["names"]
    assert beta_own["pub"] != alpha["pub"]
    assert not (pki_a / "master.pem").exists() and not (pki_b / "master.pem").exists()

    # 1. On the first master: the pair out of the bank.
    pair = tmp_path / "pair"
    out = cli(keycache_bin, "export-master-keys", "-c", str(conf_a), "--to", str(pair))
    assert out.returncode == 0, out.stderr
    assert "PRIVATE" not in out.stdout + out.stderr, "the private key reached the terminal"
    assert "alpha.pem" in out.stdout, out.stdout
    assert stat.S_IMODE(os.stat(pair).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(pair / "master.pem").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pair / "master.pub").st_mode) & 0o022 == 0
    assert (pair / "master.pem").read_text() == alpha["pem"]
    assert (pair / "master.pub").read_text().strip() == alpha["pub"].strip()

    # Run again, it replaces nothing: exit 2, the files as they were.
    before = (pair / "master.pem").read_bytes()
    again = cli(keycache_bin, "export-master-keys", "-c", str(conf_a), "--to", str(pair))
    assert again.returncode == 2 and "already exists" in again.stderr, again.stderr
    assert (pair / "master.pem").read_bytes() == before
    # Nor through a symlink.
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    linked = cli(keycache_bin, "export-master-keys", "-c", str(conf_a), "--to", str(tmp_path / "link"))
    assert linked.returncode == 2 and "symlink" in linked.stderr, linked.stderr
    assert not (tmp_path / "elsewhere").exists()

    # 2. On the second master, salt-master stopped (a running one writes
    # master.pub from its bank), the files copied there, modes kept: migrate
    # refuses to replace the pair it made itself, writing nothing, then
    # does when told to.
    bank_b = {p.name: p.read_bytes() for p in pki_b.glob(".mmap_master.idx*")}
    shutil.copy2(pair / "master.pem", pki_b / "master.pem")
    shutil.copy2(pair / "master.pub", pki_b / "master.pub")
    refused = cli(keycache_bin, "migrate", "-c", str(conf_b))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "beta.pem" in refused.stderr and "--replace-master-keys" in refused.stderr, refused.stderr
    assert {p.name: p.read_bytes() for p in pki_b.glob(".mmap_master.idx*")} == bank_b, "a refused migrate wrote"
    done = cli(keycache_bin, "migrate", "-c", str(conf_b), "--replace-master-keys")
    assert done.returncode == 0, done.stdout + done.stderr
    # 3. The files go: the bank holds the pair.
    for p in (pki_b / "master.pem", pki_b / "master.pub", pair / "master.pem", pair / "master.pub"):
        p.unlink()

    # Salt on the second master serves the first one's pair, from its bank.
    beta = salt_master_keys(conf_b)
    assert beta["pub"] == alpha["pub"]
    assert beta["pem"] == alpha["pem"]
    assert not (pki_b / "master.pem").exists()
    # And the first master's is as it was.
    assert salt_master_keys(conf_a)["pub"] == alpha["pub"]
