#!/usr/bin/env python3
"""Reads a keycache snapshot file (format version 2: docs/format.md,
"Snapshot files"; the checksum checked with xxhash's xxh3_64 when the module
is there) and writes its live entries as the items file of salt_install.py:
{"keys": [[id, state, pem], ...], "denied_keys": [[id, pem], ...]}.
Tombstones (deletions) are left out: Salt's install_keys_chunk can store,
not delete.

    snap2items.py SNAPSHOT OUT.json [--only-changed-from BASE_SNAPSHOT]

--only-changed-from: only the entries whose (state, key) differ from BASE's
(what a master that knew the difference would have to store).
"""
import json
import struct
import sys

KINDS = {0: None, 1: "accepted", 2: "pending", 3: "rejected", 4: "denied"}
HEADER = 64


def read(path):
    b = open(path, "rb").read()
    if b[:8] != b"KCSNAP\r\n":
        sys.exit(f"{path}: not a keycache snapshot")
    version, _flags = struct.unpack_from("<II", b, 8)
    if version != 2:
        sys.exit(f"{path}: snapshot format version {version}; this reads version 2")
    (count,) = struct.unpack_from("<Q", b, 56)
    o = HEADER
    out = {}
    for _ in range(count):
        bank, kind, id_len, key_len, _stamp = struct.unpack_from("<BBHIQ", b, o)
        o += 16
        mid = b[o : o + id_len].decode()
        key = b[o + id_len : o + id_len + key_len].decode()
        o += id_len + key_len
        if kind not in KINDS:
            sys.exit(f"{path}: unknown kind {kind}")
        if KINDS[kind] is not None:
            out[(bank, mid)] = (KINDS[kind], key)
    try:
        import xxhash

        (want,) = struct.unpack_from("<Q", b, o)
        if xxhash.xxh3_64_intdigest(b[:o]) != want:
            sys.exit(f"{path}: checksum mismatch")
    except ImportError:
        pass
    if o + 8 != len(b):
        sys.exit(f"{path}: {len(b) - o - 8} bytes past the checksum")
    return out


def main():
    snap = read(sys.argv[1])
    if len(sys.argv) > 4 and sys.argv[3] == "--only-changed-from":
        base = read(sys.argv[4])
        snap = {k: v for k, v in snap.items() if base.get(k) != v}
    keys = [[mid, st, key] for (bank, mid), (st, key) in sorted(snap.items()) if bank == 1]
    denied = [[mid, key] for (bank, mid), (st, key) in sorted(snap.items()) if bank == 2]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"keys": keys, "denied_keys": denied}, f)
    print(json.dumps({"keys": len(keys), "denied_keys": len(denied)}))


if __name__ == "__main__":
    main()
