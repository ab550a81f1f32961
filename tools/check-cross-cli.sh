#!/usr/bin/env bash
# Runs the `keycache` CLI of a wheel built for another machine (aarch64) under
# qemu user emulation, and checks that it makes the store the native CLI makes:
#
#   tools/check-cross-cli.sh WHEEL NATIVE_KEYCACHE [NATIVE_PYTHON]
#
# 1. The wheel's script (saltext_keycache-*.data/scripts/keycache) is taken
#    out; `qemu-<arch> -L /usr/<arch>-linux-gnu` runs it (Debian's qemu-user
#    and libc6-<debarch>-cross: the binary's loader and glibc, installed here
#    when missing and this is root on Debian).
# 2. `--version` names the wheel's version.
# 3. It migrates a copy of tools/sample-pki (--out);
#    the native CLI migrates another copy; `keycache diff` (native) finds the
#    two stores equal and `keycache verify` (native) finds the emulated one's
#    clean; the emulated CLI lists both stores as the same JSON.
# 4. With NATIVE_PYTHON (a Python with the native saltext.keycache installed):
#    the wheel's extension is imported by Debian's own Python for the machine
#    (python3.X-minimal, libpython3.X-minimal and -stdlib, zlib1g, libexpat1
#    of the version apt knows, fetched from the Debian archive and unpacked
#    beside the target's glibc, not installed) under qemu, and
#    tools/cross_ext_calls.py (the driver's reads, and writes with the key
#    tree in step) answers on one copy of the native store exactly as under
#    NATIVE_PYTHON on another; `keycache diff` finds the two stores equal
#    afterwards, `keycache verify` the emulated one's clean.
# Exit 0: all held; 1: a check failed (said on stderr); 2: bad usage; 3: qemu
# or the target's glibc is missing and cannot be installed (the caller
# decides whether that is a skip).
set -euo pipefail
if [ $# -ne 2 ] && [ $# -ne 3 ]; then
    echo "usage: tools/check-cross-cli.sh WHEEL NATIVE_KEYCACHE [NATIVE_PYTHON]" >&2
    exit 2
fi
wheel="$1"
native="$2"
native_py="${3:-}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="$(basename "$wheel")"
case "$name" in
  *_aarch64.whl) arch=aarch64 debarch=arm64 ;;
  *) echo "check-cross-cli: $name: not a wheel for a machine this script emulates (aarch64)" >&2; exit 2 ;;
esac
[ -f "$wheel" ] || { echo "check-cross-cli: $wheel: no such file" >&2; exit 2; }
[ -x "$native" ] || { echo "check-cross-cli: $native: not executable" >&2; exit 2; }

sysroot="/usr/$arch-linux-gnu"
if ! command -v "qemu-$arch" >/dev/null 2>&1 || [ ! -e "$sysroot/lib/ld-linux-$arch.so.1" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "check-cross-cli: installing qemu-user and libc6-$debarch-cross (Debian packages)" >&2
        pkgs=(qemu-user "libc6-$debarch-cross")
        { timeout 300 apt-get install -y -q --no-install-recommends "${pkgs[@]}" \
            || { timeout 300 apt-get update -q && timeout 300 apt-get install -y -q --no-install-recommends "${pkgs[@]}"; }; } >/dev/null 2>&1 || true
    fi
    if ! command -v "qemu-$arch" >/dev/null 2>&1 || [ ! -e "$sysroot/lib/ld-linux-$arch.so.1" ]; then
        echo "check-cross-cli: qemu-$arch or $sysroot/lib/ld-linux-$arch.so.1 is missing" >&2
        exit 3
    fi
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
    echo "check-cross-cli: $name: $*" >&2
    failures=$((failures + 1))
}

python3 - "$wheel" "$work/keycache" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    member = next(n for n in z.namelist() if n.endswith(".data/scripts/keycache"))
    with open(sys.argv[2], "wb") as f:
        f.write(z.read(member))
EOF
chmod 755 "$work/keycache"
emulated() { "qemu-$arch" -L "$sysroot" "$work/keycache" "$@"; }

version="$(sed -E 's/^saltext_keycache-([^-]+)-.*/\1/' <<<"$name")"
got="$(emulated --version 2>&1)" || fail "keycache --version under qemu-$arch fails: $got"
[ "$got" = "keycache $version" ] || fail "keycache --version under qemu-$arch says '$got', the wheel is $version"

cp -r "$repo/tools/sample-pki" "$work/pki"
emulated migrate "$work/pki" --out "$work/cross" --master-id sample-master >/dev/null \
    || fail "keycache migrate under qemu-$arch fails"
"$native" migrate "$work/pki" --out "$work/native" --master-id sample-master >/dev/null \
    || fail "the native keycache migrate fails"
"$native" diff "$work/cross" "$work/native" >"$work/diff.txt" 2>&1 \
    || fail "the stores differ (native keycache diff): $(head -c 600 "$work/diff.txt")"
"$native" verify "$work/cross" >"$work/verify.txt" 2>&1 \
    || fail "native keycache verify of the emulated CLI's store: $(head -c 600 "$work/verify.txt")"
a="$(emulated list "$work/cross" --json)" || fail "keycache list under qemu-$arch fails"
b="$(emulated list "$work/native" --json)" || fail "keycache list of the native store under qemu-$arch fails"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "the emulated CLI lists the two stores differently"
grep -q '"minions"' <<<"$a" || fail "the listing has no minions group: $(head -c 300 <<<"$a")"

ext=""
if [ -n "$native_py" ]; then
    # Debian's Python for the target machine, unpacked beside its glibc.
    pyroot="$work/pyroot"
    mkdir -p "$pyroot/lib"
    cp -a "$sysroot/lib/." "$pyroot/lib/"
    hostarch="$(dpkg --print-architecture)"
    pyver_of() {
        apt-cache show --no-all-versions python3-minimal 2>/dev/null \
            | grep -oE 'python3\.[0-9]+-minimal' | head -n 1 | sed -E 's/^python(3\.[0-9]+)-minimal$/\1/'
    }
    pyver="$(pyver_of)" || true
    if [ -z "$pyver" ] && [ "$(id -u)" = 0 ]; then
        timeout 300 apt-get update -q >/dev/null 2>&1 || true
        pyver="$(pyver_of)" || true
    fi
    if [ -z "$pyver" ]; then
        fail "apt knows no python3-minimal: no Python for $debarch to fetch"
    else
        for pkg in "python$pyver-minimal" "libpython$pyver-minimal" "libpython$pyver-stdlib" zlib1g libexpat1; do
            fn="$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '/^Filename:/ { print $2; exit }')"
            case "$fn" in
              pool/updates/*) base=http://deb.debian.org/debian-security ;;
              pool/*) base=http://deb.debian.org/debian ;;
              *) fail "apt knows no $pkg"; continue ;;
            esac
            url="$base/${fn%_"$hostarch".deb}_$debarch.deb"
            python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
                "$url" "$work/$pkg.deb" 2>"$work/fetch.txt" \
                || { fail "cannot fetch $url: $(tail -n 1 "$work/fetch.txt")"; continue; }
            dpkg-deb -x "$work/$pkg.deb" "$pyroot"
        done
    fi
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$work/whl"
    cp -r "$work/native" "$work/ext-native"
    cp -r "$work/native" "$work/ext-cross"
    calls="$repo/tools/cross_ext_calls.py"
    "$native_py" "$calls" "$work/ext-native" >"$work/ext-native.json" 2>"$work/ext-native.err" \
        || fail "$calls under $native_py fails: $(tail -n 3 "$work/ext-native.err")"
    if [ -n "$pyver" ] && [ -x "$pyroot/usr/bin/python$pyver" ]; then
        env -i PATH=/usr/bin:/bin "qemu-$arch" -L "$pyroot" \
            -E "LD_LIBRARY_PATH=/lib:/lib/$arch-linux-gnu:/usr/lib/$arch-linux-gnu" \
            -E "PYTHONPATH=$work/whl" "$pyroot/usr/bin/python$pyver" "$calls" "$work/ext-cross" \
            >"$work/ext-cross.json" 2>"$work/ext-cross.err" \
            || fail "$calls under qemu-$arch python$pyver fails: $(tail -n 3 "$work/ext-cross.err")"
        if ! { [ -s "$work/ext-native.json" ] && cmp -s "$work/ext-native.json" "$work/ext-cross.json"; }; then
            fail "the $arch extension answers the driver's calls otherwise than the native one ($(cmp "$work/ext-native.json" "$work/ext-cross.json" 2>&1 | head -n 1))"
        fi
        "$native" diff "$work/ext-cross" "$work/ext-native" >"$work/diff.txt" 2>&1 \
            || fail "after the driver's writes the stores differ: $(head -c 600 "$work/diff.txt")"
        "$native" verify "$work/ext-cross" >"$work/verify.txt" 2>&1 \
            || fail "native keycache verify after the $arch extension's writes: $(head -c 600 "$work/verify.txt")"
        ext=", and its extension, imported by Debian's python$pyver for $arch, answers the driver's calls as the native one does"
    else
        fail "no python for $debarch was unpacked"
    fi
fi

if [ "$failures" -gt 0 ]; then
    echo "check-cross-cli: $name: $failures check(s) failed" >&2
    exit 1
fi
echo "check-cross-cli: $name: its keycache runs under qemu-$arch ($got) and makes the store the native one makes$ext" >&2
