"""The driver's calls on one store, answered as JSON: run by tools/check-cross-cli.sh
under the native Python and, under qemu, by an aarch64 Python importing the aarch64
wheel's extension, on two copies of one store; the two answers must be equal.

    python cross_ext_calls.py STORE_DIR

Reads every bank (list_all with and without the keys, denied keys, fetch, contains),
then writes through the driver with the key tree kept in step (a state change, a
removal, a new key) and reads again, the tree's file names included."""

import json
import os
import sys

from saltext.keycache import _native


def main(root):
    d = _native.driver(
        root,
        size=1000000,
        slot_size=96,
        id_size=64,
        max_segment_bytes=1 << 30,
        tree=True,
        pki_dir_is_abs=True,
    )
    out = {
        "list_all": d.list_all("keys", False),
        "list_all_data": d.list_all("keys", True),
        "denied": d.list_all("denied_keys", True),
        "list": sorted(d.list("keys")),
    }
    ids = sorted(out["list_all"])
    if len(ids) < 2:
        raise SystemExit(f"cross_ext_calls: {root}: fewer than 2 keys")
    first = d.fetch("keys", ids[0])
    out["fetch"] = first
    d.store("keys", ids[0], {"state": "rejected", "pub": first["pub"]})
    d.flush("keys", ids[1])
    d.store("keys", "cross-check-new", {"state": "accepted", "pub": first["pub"]})
    out["after"] = d.list_all("keys", True)
    out["contains"] = [d.contains("keys", i) for i in ids[:3] + ["cross-check-new"]]
    out["tree"] = {
        sub: sorted(os.listdir(os.path.join(root, sub)))
        for sub in ("minions", "minions_pre", "minions_rejected", "minions_denied")
        if os.path.isdir(os.path.join(root, sub))
    }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
