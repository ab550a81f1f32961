#!/usr/bin/env python3
"""Salt 3008.5's own path for installing a set of keys: state-sync's
``salt.cluster.state_sync.install_keys_chunk`` (one ``cache.store`` per key,
through ``salt.cache.Cache`` with ``keys.cache_driver: mmap_key``), in chunks of
``DEFAULT_KEY_CHUNK_COUNT`` as a joining master receives them.

    salt_install.py --pki-dir D --items FILE [--limit N]
        [--size N --slot-size N --id-size N --max-segment-bytes N]

FILE: JSON {"keys": [[id, state, pem], ...], "denied_keys": [[id, pem], ...]}
(the first --limit entries of each, in order). Prints one JSON line:
{"keys": n, "denied": n, "seconds": s, "per_key_us": us}.
"""
import argparse
import json
import os
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pki-dir", required=True)
    ap.add_argument("--items", required=True)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--size", type=int, default=None)
    ap.add_argument("--slot-size", type=int, default=None)
    ap.add_argument("--id-size", type=int, default=None)
    ap.add_argument("--max-segment-bytes", type=int, default=None)
    a = ap.parse_args()

    import salt  # noqa: F401  (sets Salt's builtins)
    import salt.config
    import salt.cluster.state_sync as ss

    with open(a.items, encoding="utf-8") as f:
        items = json.load(f)
    keys = items["keys"][: a.limit] if a.limit else items["keys"]
    denied = items["denied_keys"][: a.limit] if a.limit else items["denied_keys"]

    scratch = tempfile.mkdtemp(prefix="bench-merge-salt-")
    opts = dict(salt.config.DEFAULT_MASTER_OPTS)
    opts.update(
        {
            "pki_dir": a.pki_dir,
            "cachedir": os.path.join(scratch, "cache"),
            "extension_modules": os.path.join(scratch, "extmods"),
            "keys.cache_driver": "mmap_key",
        }
    )
    for name, val in (
        ("mmap_key_size", a.size),
        ("mmap_key_slot_size", a.slot_size),
        ("mmap_key_id_size", a.id_size),
        ("mmap_key_max_segment_bytes", a.max_segment_bytes),
    ):
        if val is not None:
            opts[name] = val
    os.makedirs(a.pki_dir, exist_ok=True)

    key_items = [{"id": i, "value": {"state": s, "pub": p}} for i, s, p in keys]
    denied_items = [{"id": i, "value": [p]} for i, p in denied]
    n = ss.DEFAULT_KEY_CHUNK_COUNT
    # Load the cache driver before the clock starts (a master has it loaded).
    ss.install_keys_chunk(opts, ss.KEYS_CHANNEL, [])
    t0 = time.perf_counter()
    wk = wd = 0
    for i in range(0, len(key_items), n):
        wk += ss.install_keys_chunk(opts, ss.KEYS_CHANNEL, key_items[i : i + n])
    for i in range(0, len(denied_items), n):
        wd += ss.install_keys_chunk(opts, ss.DENIED_CHANNEL, denied_items[i : i + n])
    secs = time.perf_counter() - t0
    if wk != len(key_items) or wd != len(denied_items):
        sys.exit(f"install_keys_chunk wrote {wk}/{len(key_items)} keys, {wd}/{len(denied_items)} denied")
    total = wk + wd
    print(json.dumps({"keys": wk, "denied": wd, "seconds": secs,
                      "per_key_us": secs / max(total, 1) * 1e6}))


if __name__ == "__main__":
    main()
