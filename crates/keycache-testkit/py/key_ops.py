"""A Salt master's key operations through ``salt.cache.Cache`` and the
master's ``keys.cache_driver`` (``keycache`` here, in etcd mode), one per
line of stdin, for the etcd model test (crates/keycache-cli/tests/cli/
etcd_model). Each operation is what Salt's own code does with the cache:

- ``signin``: ``salt/master.py`` ``_auth`` for an id without a key: fetch
  ``keys``; when absent, store it pending;
- ``deny``: ``_auth`` for an accepted id presenting another key: fetch
  ``denied_keys``, append the key when it is not there, store the list;
- ``accept`` / ``reject``: ``salt/key.py`` ``Key.change_state`` (salt-key
  -a / -r): fetch ``keys``; when its state is the one the change starts
  from (pending; with ``include_all`` also rejected or accepted), store it
  with the new state;
- ``flush_keys`` / ``flush_denied``: ``Key.delete_key`` (salt-key -d)
  flushes ``keys``, then ``denied_keys``: one each here.

Usage: ``key_ops.py MASTER_CONFIG_FILE``. Prints ``{"ready": true}``, then
answers each request (``{"op", "id", "pub", "include_all"}``) with one line:
``{"done": bool, "revision": int}`` (``done``: the operation stored or
flushed something; ``revision``: the etcd revision it took effect at, 0
when nothing was sent) or ``{"error": text}`` (the driver's
``SaltCacheError``).
"""

import json
import sys

import salt.cache
import salt.config
from salt.exceptions import SaltCacheError

import saltext.keycache._native as native


def signin(cache, req):
    if cache.fetch("keys", req["id"]):
        return False
    cache.store("keys", req["id"], {"pub": req["pub"], "state": "pending"})
    return True


def deny(cache, req):
    denied = cache.fetch("denied_keys", req["id"]) or []
    if req["pub"] in denied:
        return False
    denied.append(req["pub"])
    cache.store("denied_keys", req["id"], denied)
    return True


def change_state(target, also):
    def run(cache, req):
        key = cache.fetch("keys", req["id"])
        if not key:
            return False
        starts = {"pending"} | ({also} if req.get("include_all") else set())
        if key["state"] not in starts:
            return False
        key["state"] = target
        cache.store("keys", req["id"], key)
        return True

    return run


def flush(bank):
    def run(cache, req):
        return bool(cache.flush(bank, req["id"]))

    return run


OPS = {
    "signin": signin,
    "deny": deny,
    "accept": change_state("accepted", "rejected"),
    "reject": change_state("rejected", "accepted"),
    "flush_keys": flush("keys"),
    "flush_denied": flush("denied_keys"),
}


def main(conf):
    opts = salt.config.master_config(conf)
    opts["user"] = None
    cache = salt.cache.Cache(opts, driver=opts["keys.cache_driver"])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            done = OPS[req["op"]](cache, req)
            answer = {"done": done, "revision": native.last_etcd_revision() if done else 0}
        except SaltCacheError as exc:
            answer = {"error": str(exc)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
