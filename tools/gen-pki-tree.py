#!/usr/bin/env python3
"""Generate a large, realistic legacy Salt `localfs_key` tree for benchmarks and tests.

    tools/gen-pki-tree.py OUT_DIR --minions N
        [--accepted 0.9 --pending 0.05 --rejected 0.03 --denied 0.02]
        [--dup-fraction 0.0] [--oddities] [--seed 1]
        [--id-template '{role}-{n:07d}.dc{dc}.example.com']

Layout (see docs/format.md, "The legacy `localfs_key` tree"): one PEM file per minion id in
OUT_DIR/minions (accepted), minions_pre (pending), minions_rejected (rejected) and
minions_denied (denied).

Each of the N ids gets one primary state, drawn so that the state counts follow the given
fractions (normalised to their sum). `--dup-fraction F` puts round(F*N) of those ids in a
second, randomly chosen state directory too, with another key. Every key is a PEM
"BEGIN PUBLIC KEY" of a real RSA-2048 SubjectPublicKeyInfo shape (451 bytes, like a minion's
minion.pub); the modulus is seeded random bytes (top bit and low bit set), not a real RSA
modulus. Everything (ids, states, keys) is a function of the arguments: same arguments,
same tree.

Id template fields: {role} (web, app, db, cache, k8s-node, ...), {n} (1..N, unique per id),
{dc} (1..4). The template must give N distinct, valid ids (keep {n} in it).

`--oddities` adds the entries a migration has to survive; they are listed in the summary
(path, what it is, and what Salt 3008.5's rebuild_from_localfs does with it) and are NOT
included in "counts" or "expected". One of them is a symlink pointing out of OUT_DIR, to a
file created next to OUT_DIR (OUT_DIR.outside.pub, named in the summary as "outside_file";
remove it with the tree).

Prints a JSON summary on stdout:
  {"out", "counts" (key files per directory), "expected" (ids per state after Salt's
   precedence rejected > pending > accepted; denied = files in minions_denied),
   "oddities", "outside_file", "files", "bytes", "seconds", ...}
Salt's `pki.migrate_to_mmap` prints per-file counts, i.e. "counts", not "expected".

Python 3.9+ stdlib only; files are written with os.open/os.write, mode 0644, directories 0755.
"""

import argparse
import base64
import json
import os
import struct
import sys
import time
import random

STATE_DIRS = ("minions", "minions_pre", "minions_rejected", "minions_denied")
STATE_OF_DIR = {
    "minions": "accepted",
    "minions_pre": "pending",
    "minions_rejected": "rejected",
    "minions_denied": "denied",
}
# localfs_key's fetch order and rebuild_from_localfs's scan order agree: the last scanned
# wins, so rejected beats pending beats accepted.
PRECEDENCE = {"minions": 1, "minions_pre": 2, "minions_rejected": 3}

ROLES = (
    ("web", 24), ("app", 18), ("k8s-node", 20), ("db", 7), ("cache", 6), ("lb", 2),
    ("mon", 2), ("ci-runner", 5), ("batch", 6), ("mq", 3), ("search", 3), ("storage", 4),
)

# DER SubjectPublicKeyInfo for RSA-2048: SEQUENCE { SEQUENCE { rsaEncryption OID, NULL },
# BIT STRING { SEQUENCE { INTEGER (257 bytes: 00 + 256-byte modulus), INTEGER 65537 } } }
DER_PREFIX = bytes.fromhex(
    "30820122300d06092a864886f70d0101010500"  # SPKI SEQUENCE, AlgorithmIdentifier
    "0382010f00"  # BIT STRING, 0 unused bits
    "3082010a"  # RSAPublicKey SEQUENCE
    "0282010100"  # INTEGER modulus, leading 00
)
DER_SUFFIX = bytes.fromhex("0203010001")  # INTEGER 65537
PEM_HEAD = b"-----BEGIN PUBLIC KEY-----\n"
PEM_TAIL = b"\n-----END PUBLIC KEY-----\n"
assert len(DER_PREFIX) + 256 + len(DER_SUFFIX) == 294

FILE_MODE = 0o644
DIR_MODE = 0o755


def make_pems(rng, count):
    """Yield `count` PEM public keys (bytes, 451 each) from the PRNG."""
    head, tail, prefix, suffix = PEM_HEAD, PEM_TAIL, DER_PREFIX, DER_SUFFIX
    b64 = base64.b64encode
    batch = 4096
    left = count
    while left > 0:
        k = min(batch, left)
        left -= k
        raw = rng.randbytes(256 * k)
        for i in range(k):
            m = bytearray(raw[256 * i: 256 * i + 256])
            m[0] |= 0x80  # full 2048-bit modulus
            m[255] |= 0x01  # odd, as an RSA modulus is
            e = b64(prefix + m + suffix)  # 392 characters: 6 lines of 64, one of 8
            yield b"".join((
                head, e[0:64], b"\n", e[64:128], b"\n", e[128:192], b"\n", e[192:256],
                b"\n", e[256:320], b"\n", e[320:384], b"\n", e[384:], tail,
            ))


def valid_salt_id(name):
    """Salt's valid_id for a direct child of pki_dir, plus: not a dot-name (scans skip those)."""
    return (
        bool(name)
        and not any(c in name for c in ("/", "\\", "\0"))
        and name not in (".", "..")
        and not name.startswith(".")
    )


def split_counts(n, fractions):
    """Exact per-state counts for n ids (largest remainder), in the order given."""
    total = sum(fractions)
    if total <= 0:
        raise SystemExit("state fractions must add up to more than 0")
    raw = [n * f / total for f in fractions]
    counts = [int(x) for x in raw]
    rest = n - sum(counts)
    order = sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))
    for i in order[:rest]:
        counts[i] += 1
    return counts


def msgpack_str_list(names):
    """msgpack array of str, as salt.payload.dump writes the master's .key_cache."""
    n = len(names)
    if n < 16:
        out = [bytes([0x90 | n])]
    elif n < 65536:
        out = [b"\xdc" + struct.pack(">H", n)]
    else:
        out = [b"\xdd" + struct.pack(">I", n)]
    for s in names:
        b = s.encode("utf-8")
        if len(b) < 32:
            out.append(bytes([0xA0 | len(b)]) + b)
        elif len(b) < 256:
            out.append(b"\xd9" + bytes([len(b)]) + b)
        else:
            out.append(b"\xda" + struct.pack(">H", len(b)) + b)
    return b"".join(out)


class Writer:
    def __init__(self, out):
        self.out = out
        self.dirfd = {}
        self.files = 0
        self.bytes = 0
        for d in STATE_DIRS:
            os.mkdir(os.path.join(out, d), DIR_MODE)
            self.dirfd[d] = os.open(os.path.join(out, d), os.O_RDONLY | os.O_DIRECTORY)

    def write(self, d, name, data):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE,
                     dir_fd=self.dirfd[d])
        try:
            if data:
                os.write(fd, data)
        finally:
            os.close(fd)
        self.files += 1
        self.bytes += len(data)

    def close(self):
        for fd in self.dirfd.values():
            os.close(fd)


def exact_len_id(stem, tail, length):
    """`stem` + filler + `tail`, exactly `length` bytes (ASCII)."""
    fill = length - len(stem) - len(tail)
    assert fill >= 0
    s = stem + ("abcdefghijklmnopqrstuvwxyz0123456789" * 4)[:fill] + tail
    assert len(s.encode()) == length
    return s


def add_oddities(w, out, rng, pems, accepted_names):
    """Write the oddities; return (list of descriptions, outside file path)."""
    odd = []

    def note(path, what, salt):
        if isinstance(path, bytes):
            shown = path.decode("utf-8", "backslashreplace")
            odd.append({"path": shown, "path_hex": path.hex(), "what": what, "salt": salt})
        else:
            odd.append({"path": path, "what": what, "salt": salt})

    # Valid keys under odd names in minions/.
    id_utf8 = "nœud-01"
    id64 = exact_len_id("ip-10-0-12-34.eu-west-1.compute.internal.", ".example.com", 64)
    id65 = exact_len_id("ip-10-0-12-35.eu-west-1.compute.internal.", ".example.com", 65)
    w.write("minions", id_utf8, next(pems))
    note("minions/" + id_utf8, "non-ASCII UTF-8 id (valid key)", "imported as accepted")
    w.write("minions", id64, next(pems))
    note("minions/" + id64, "id of exactly 64 bytes, mmap_key_id_size (valid key)",
         "imported as accepted")
    w.write("minions", id65, next(pems))
    note("minions/" + id65, "id of 65 bytes, longer than the default mmap_key_id_size 64 "
         "(valid key)", "mmap_cache silently truncates the stored id to its first 64 bytes")
    if sys.platform.startswith("linux"):
        bad = b"bad-\xff\xfe-minion"
        w.write("minions", bad, next(pems))
        note(b"minions/" + bad, "file name that is not valid UTF-8 (valid key)",
             "3008.5: mmap_cache.put raises UnicodeEncodeError, which rebuild_from_localfs "
             "does not catch: the migration aborts")

    # Not keys, or not to be read.
    kc = msgpack_str_list(accepted_names + [id_utf8, id64, id65, "linked-minion"])
    w.write("minions", ".key_cache", kc)
    note("minions/.key_cache", "master key_cache file: msgpack list of accepted ids",
         "skipped (dot-file)")
    w.write("minions_pre", ".hidden-minion", next(pems))
    note("minions_pre/.hidden-minion", "dot-file holding a valid key", "skipped (dot-file)")
    w.write("minions_denied", ".hidden-denied", next(pems))
    note("minions_denied/.hidden-denied", "dot-file holding a valid key, in minions_denied",
         "IMPORTED into denied_keys: the denied scan does not skip dot-files")
    w.write("minions_pre", "broken-minion", b"not a key\n")
    note("minions_pre/broken-minion", "not a PEM key: 'not a key\\n'",
         "imported as pending as-is (no PEM check)")
    w.write("minions_rejected", "empty-minion", b"")
    note("minions_rejected/empty-minion", "empty file",
         "stored as a 1-byte record (state byte only), which reads back as no entry")

    # Symlinks and a directory: never followed, never read.
    base = os.path.basename(os.path.normpath(out))
    outside = os.path.join(os.path.dirname(os.path.abspath(out)), base + ".outside.pub")
    fd = os.open(outside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, next(pems))
    finally:
        os.close(fd)
    target = "../../" + base + ".outside.pub"
    os.symlink(target, "linked-minion", dir_fd=w.dirfd["minions"])
    note("minions/linked-minion", "relative symlink -> " + target + " (a valid key outside "
         "OUT_DIR)", "skipped (symlink)")
    os.symlink(target, "linked-denied", dir_fd=w.dirfd["minions_denied"])
    note("minions_denied/linked-denied", "relative symlink -> " + target,
         "skipped (symlink)")
    os.symlink("../no-such-file", "dangling-minion", dir_fd=w.dirfd["minions_rejected"])
    note("minions_rejected/dangling-minion", "dangling symlink -> ../no-such-file",
         "skipped (not a file)")
    os.mkdir("subdir-minion", DIR_MODE, dir_fd=w.dirfd["minions"])
    sub = os.path.join(out, "minions", "subdir-minion", "inner")
    fd = os.open(sub, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, next(pems))
    finally:
        os.close(fd)
    note("minions/subdir-minion/", "a directory (holding a valid key file 'inner')",
         "skipped (not a file; scans do not recurse)")
    return odd, outside


def main(argv=None):
    p = argparse.ArgumentParser(
        description="Generate a realistic legacy Salt localfs_key pki tree.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    p.add_argument("out", metavar="OUT_DIR", help="created if missing; must be empty")
    p.add_argument("--minions", type=int, required=True, metavar="N",
                   help="number of distinct minion ids (oddities not included)")
    p.add_argument("--accepted", type=float, default=0.9)
    p.add_argument("--pending", type=float, default=0.05)
    p.add_argument("--rejected", type=float, default=0.03)
    p.add_argument("--denied", type=float, default=0.02)
    p.add_argument("--dup-fraction", type=float, default=0.0, metavar="F",
                   help="fraction of ids that also get a file (another key) in a second "
                        "state directory")
    p.add_argument("--oddities", action="store_true",
                   help="add dot-files, symlinks, non-PEM/empty files and odd ids")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--id-template", default="{role}-{n:07d}.dc{dc}.example.com",
                   help="fields {role}, {n} (unique, 1..N), {dc} (1..4)")
    a = p.parse_args(argv)

    if a.minions < 0:
        p.error("--minions must be >= 0")
    if min(a.accepted, a.pending, a.rejected, a.denied) < 0:
        p.error("state fractions must be >= 0")
    if not 0.0 <= a.dup_fraction <= 1.0:
        p.error("--dup-fraction must be in [0, 1]")

    t0 = time.monotonic()
    os.umask(0o022)
    out = a.out
    if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        p.error(f"{out} exists and is not an empty directory")

    n = a.minions
    rng = random.Random(a.seed)

    # Ids.
    names = [r for r, _ in ROLES]
    weights = [wt for _, wt in ROLES]
    roles = rng.choices(names, weights, k=n)
    dcs = rng.choices((1, 2, 3, 4), k=n)
    tmpl = a.id_template
    try:
        ids = [tmpl.format(role=roles[i], n=i + 1, dc=dcs[i]) for i in range(n)]
    except (KeyError, IndexError, ValueError) as exc:
        p.error(f"bad --id-template: {exc!r}")
    if len(set(ids)) != n:
        p.error("--id-template does not give distinct ids (put {n} in it)")
    bad = [i for i in ids if not valid_salt_id(i)]
    if bad:
        p.error(f"--id-template gives invalid or dot-file ids, e.g. {bad[0]!r}")
    too_long = sum(1 for i in ids if len(i.encode()) > 64)
    if too_long:
        print(f"warning: {too_long} ids are longer than 64 bytes (Salt's default "
              f"mmap_key_id_size)", file=sys.stderr)

    # Primary states: exact counts, randomly spread over the ids.
    per_state = split_counts(n, [a.accepted, a.pending, a.rejected, a.denied])
    primary = []
    for d, c in zip(STATE_DIRS, per_state):
        primary.extend([d] * c)
    rng.shuffle(primary)

    # Second state directory for a fraction of the ids.
    ndup = round(n * a.dup_fraction)
    second = {}
    for i in sorted(rng.sample(range(n), ndup)):
        second[i] = rng.choice([d for d in STATE_DIRS if d != primary[i]])

    os.makedirs(out, DIR_MODE, exist_ok=True)
    w = Writer(out)
    pems = make_pems(rng, 2 * n + 16)  # lazily drawn; the cap is never reached
    counts = dict.fromkeys(STATE_DIRS, 0)
    expected = {"accepted": 0, "pending": 0, "rejected": 0, "denied": 0}
    accepted_names = []
    odd = []
    outside = None
    try:
        for i in range(n):
            name = ids[i]
            dirs = (primary[i],) if i not in second else (primary[i], second[i])
            top = None
            for d in dirs:
                w.write(d, name, next(pems))
                counts[d] += 1
                if d == "minions_denied":
                    expected["denied"] += 1
                elif top is None or PRECEDENCE[d] > PRECEDENCE[top]:
                    top = d
                if d == "minions":
                    accepted_names.append(name)
            if top is not None:
                expected[STATE_OF_DIR[top]] += 1
        if a.oddities:
            odd, outside = add_oddities(w, out, rng, pems, accepted_names)
    finally:
        w.close()

    summary = {
        "out": os.path.abspath(out),
        "seed": a.seed,
        "id_template": tmpl,
        "minions": n,
        "dup_ids": ndup,
        "counts": counts,
        "expected": expected,
        "oddities": odd,
        "outside_file": outside,
        "files": w.files,
        "bytes": w.bytes,
        "ids_over_64_bytes": too_long,
        "seconds": round(time.monotonic() - t0, 3),
    }
    try:
        json.dump(summary, sys.stdout, indent=1)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
