"""The data: a pool of real RSA-2048 keys, the minion population, the legacy
tree written once per size and the stores `keycache migrate` makes of it."""

import importlib.util
import json
import os
import random
import shutil
import subprocess
import time

from .common import BenchError, HERE, PEM_POOL, SEED, log


def gen_module():
    spec = importlib.util.spec_from_file_location("gen_pki_tree", os.path.join(HERE, "gen-pki-tree.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pem_pool(data_dir):
    """PEM_POOL real RSA-2048 public keys (str), generated once and kept in data_dir."""
    path = os.path.join(data_dir, f"pems-{PEM_POOL}.json")
    if os.path.exists(path):
        with open(path, encoding="ascii") as fh:
            pems = json.load(fh)
        if len(pems) == PEM_POOL:
            return pems
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    t0 = time.monotonic()
    pems = []
    for _ in range(PEM_POOL):
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pems.append(
            key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode("ascii")
        )
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as fh:
        json.dump(pems, fh)
    os.replace(tmp, path)
    log(f"generated {PEM_POOL} RSA-2048 keys in {time.monotonic() - t0:.1f} s")
    return pems


class Population:
    """The ids and states of one size (a function of n and SEED), as gen-pki-tree draws them."""

    def __init__(self, gen, n):
        rng = random.Random(SEED)
        names = [r for r, _ in gen.ROLES]
        weights = [w for _, w in gen.ROLES]
        roles = rng.choices(names, weights, k=n)
        dcs = rng.choices((1, 2, 3, 4), k=n)
        self.ids = [f"{roles[i]}-{i + 1:07d}.dc{dcs[i]}.example.com" for i in range(n)]
        per_state = gen.split_counts(n, [0.9, 0.05, 0.03, 0.02])
        primary = []
        for d, c in zip(gen.STATE_DIRS, per_state):
            primary.extend([d] * c)
        rng.shuffle(primary)
        self.dirs = primary
        self.n = n

    def pem_index(self, i):
        return (i * 7919) % PEM_POOL


STATE_OF_DIR = {"minions": "accepted", "minions_pre": "pending", "minions_rejected": "rejected"}


def table_size(n):
    """mmap_key_size: Salt's default 1,000,000 up to 450k minions (the table stays under half
    full with the keys a run adds), else about 2.1 slots per key (what `keycache migrate`
    suggests; 2,100,000 for 1M minions)."""
    return 1_000_000 if n <= 450_000 else int(round(n * 2.1, -5))


def write_tree(gen, pop, pems, tree):
    if os.path.exists(tree):
        shutil.rmtree(tree)
    os.makedirs(tree, 0o755)
    t0 = time.monotonic()
    w = gen.Writer(tree)
    raw = [p.encode("ascii") for p in pems]
    try:
        for i, mid in enumerate(pop.ids):
            w.write(pop.dirs[i], mid, raw[pop.pem_index(i)])
    finally:
        w.close()
    log(f"  wrote the tree of {pop.n} keys in {time.monotonic() - t0:.1f} s")


def migrate(keycache_bin, tree, out, size):
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out, 0o700)
    cmd = [keycache_bin, "migrate", tree, "--out", out, "--size", str(size), "--no-master-keys", "--json"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    log(f"  keycache migrate -> {out} in {time.monotonic() - t0:.1f} s")


def prepare_size(args, gen, pems, n, need_mmap):
    """Make (or reuse) the tree and the migrated stores of size n; return their paths."""
    base = os.path.join(args.data, f"n{n}")
    os.makedirs(base, exist_ok=True)
    pop = Population(gen, n)
    size = table_size(n)
    params = {"n": n, "seed": SEED, "pems": PEM_POOL, "version": 1}
    paths = {"base": base, "tree": os.path.join(base, "tree"), "size": size}
    marker = os.path.join(base, "ready-tree.json")

    def ready(m, extra=None):
        want = dict(params, **(extra or {}))
        try:
            with open(m, encoding="utf-8") as fh:
                return json.load(fh) == want
        except (OSError, ValueError):
            return False

    def mark(m, extra=None):
        with open(m, "w", encoding="utf-8") as fh:
            json.dump(dict(params, **(extra or {})), fh)

    if not ready(marker):
        for f in os.listdir(base):
            if f.startswith("ready-"):
                os.unlink(os.path.join(base, f))
        log(f"n={n}: generating the tree")
        write_tree(gen, pop, pems, paths["tree"])
        mark(marker)
    for name in ("mmap_key", "keycache"):
        out = os.path.join(base, name)
        paths[name] = out
        if name not in need_mmap:
            continue
        m = os.path.join(base, f"ready-{name}.json")
        if not ready(m, {"size": size}):
            log(f"n={n}: migrating the tree for {name}")
            migrate(args.keycache_bin, paths["tree"], out, size)
            if name == "keycache":
                # keycache keeps the legacy tree in step in its pki dir: give it the (empty)
                # state directories a master's pki dir has.
                for d in gen.STATE_DIRS:
                    os.makedirs(os.path.join(out, d), 0o755, exist_ok=True)
            mark(m, {"size": size})
    return pop, paths


def work_copy(src, dst):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    subprocess.run(["cp", "-a", "--sparse=always", src, dst], check=True, timeout=1800)
