"""The drivers measured: Salt's opts and loader, the do-nothing driver
written into a module dir, each driver's module loaded as Salt loads it."""

import importlib.util
import os

from .common import BenchError, NOOP_MODULE


NOOP_SOURCE = '''"""Do-nothing keys cache driver: what Salt's dispatch costs on its own."""

__func_alias__ = {"list_": "list", "flush_": "flush"}

_PUB = %r


def init_kwargs(kwargs):
    return {"cachedir": __opts__["pki_dir"], "user": __opts__.get("user")}


def store(bank, key, data, cachedir, **kwargs):
    return None


def fetch(bank, key, cachedir, **kwargs):
    if bank == "keys":
        return {"state": "accepted", "pub": _PUB}
    return {}


def updated(bank, key, cachedir, **kwargs):
    return None


def flush_(bank, key=None, cachedir=None, **kwargs):
    return True


def list_(bank, cachedir, **kwargs):
    return []


def list_all(bank, cachedir, include_data=False, **kwargs):
    return {}


def contains(bank, key, cachedir, **kwargs):
    return False
'''


class Env:
    """Salt opts and modules shared by the drivers."""

    def __init__(self, tmp, pem, args):
        import salt.config  # noqa: F401  (sets up Salt)
        import logging

        logging.getLogger().setLevel(logging.ERROR)
        self.moddir = os.path.join(tmp, "modules")
        os.makedirs(os.path.join(self.moddir, "cache"), exist_ok=True)
        with open(os.path.join(self.moddir, "cache", NOOP_MODULE + ".py"), "w", encoding="utf-8") as fh:
            fh.write(NOOP_SOURCE % pem)
        self.base = salt.config.master_config(None)
        self.tmp = tmp
        self.args = args
        self.pinned = {}  # keycache: pki_dir -> its _native.Driver (see cache())

    def opts(self, pki_dir, size, **extra):
        o = dict(self.base)
        o.update(
            {
                "pki_dir": pki_dir,
                "cachedir": os.path.join(self.tmp, "cachedir"),
                "extension_modules": os.path.join(self.tmp, "extmods"),
                "module_dirs": [self.moddir],
                "mmap_key_size": size,
                "mmap_key_slot_size": 96,
                "mmap_key_id_size": 64,
                "user": None,
                "cluster_id": None,
            }
        )
        o.update(extra)
        return o

    def cache(self, driver, pki_dir, size, **extra):
        """A Cache of `driver` on `pki_dir`, bound to its own opts.

        Salt 3008.5's loader runs a driver's module body again for each new Cache, in ONE
        module object shared by them all (sys.modules), so the module's `__opts__` (a plain
        OptsDict) is the last Cache's: a Cache whose `init_kwargs` (a cached_property, computed
        at its first call) or keycache's `_open` ran after another Cache of the same driver was
        made would use that other Cache's pki_dir and options. On a master every Cache has the
        same opts; here they differ (keycache, keycache_tree: False, keycache-etcd). So each
        Cache's kwargs are computed now, and keycache's native driver for its directory is
        opened now, kept, and put back into the module's `_drivers` (which the next load
        empties) after every later load."""
        import salt.cache

        opts = self.opts(pki_dir, size, **extra)
        c = salt.cache.Cache(opts, driver=driver)
        if f"{driver}.fetch" not in c.modules:
            raise BenchError(f"Salt's loader did not find the cache driver {driver!r}")
        kw = c.kwargs
        if kw.get("cachedir", pki_dir) != pki_dir:
            raise BenchError(f"{driver}: init_kwargs gave {kw.get('cachedir')!r}, not {pki_dir!r}")
        if driver == "keycache":
            g = c.modules["keycache.fetch"].func.__globals__
            self.pinned[pki_dir] = g["_drivers"].get(pki_dir) or g["_open"](pki_dir)
            g["_drivers"].update(self.pinned)
        return c


SALT_NAME = {"noop": NOOP_MODULE, "keycache": "keycache", "mmap_key": "mmap_key", "localfs_key": "localfs_key",
             "keycache_notree": "keycache", "keycache-etcd": "keycache"}


def load_module(env, driver, pki_dir, size):
    """The driver's module imported directly (not through the loader), __opts__ set as
    salt/runners/pki.py does for mmap_key. Returns (module, kwargs for its calls)."""
    opts = env.opts(pki_dir, size)
    if driver == "noop":
        spec = importlib.util.spec_from_file_location(
            "bench_noop_key", os.path.join(env.moddir, "cache", NOOP_MODULE + ".py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    elif driver == "keycache":
        import saltext.keycache.cache.keycache as mod  # noqa: F811
    else:
        mod = importlib.import_module(f"salt.cache.{driver}")
    mod.__opts__ = opts
    kwargs = mod.init_kwargs({}) if hasattr(mod, "init_kwargs") else {"cachedir": pki_dir}
    return mod, kwargs
