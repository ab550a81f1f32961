#!/usr/bin/env bash
# Builds the saltext.keycache wheel an operator installs with salt-pip:
#
#   tools/build-wheel.sh OUT_DIR
#
# One wheel per platform for every Python Salt ships: the driver's native
# core is built for CPython's stable ABI 3.10+ (abi3), linked by zig against
# manylinux2014's glibc (2.17), and the wheel carries the `keycache` CLI too,
# built the same way, as a script (pip puts it in `<prefix>/bin`, salt-pip in
# `extras-3.N/bin`). maturin audits both for the manylinux tag
# (--auditwheel check: a newer glibc symbol or an outside library fails the
# build). The master that installs the wheel needs no cargo.
#
# Steps: the build tools (maturin, ziglang) from tools/setup-venv.sh's venv;
# `maturin build -b bin` of crates/keycache-cli; `maturin build` of
# crates/saltext-keycache; tools/wheel_add_binary.py puts the first's binary
# into the second. The last line on stdout is the wheel's path in OUT_DIR
# (`saltext_keycache-<version>-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl`
# on x86_64 Linux).
#
# Another platform: `tools/build-wheel.sh OUT_DIR TARGET`, TARGET a Rust
# target triple (aarch64-unknown-linux-gnu: the wheel for ARM64 masters,
# `..._manylinux_2_17_aarch64.whl`), cross-compiled by zig; rustup adds the
# target's standard library when it lacks it. tools/test.sh builds the
# aarch64 wheel, checks its tags and runs its CLI under qemu-aarch64.
#
# Environment: KEYCACHE_VENV as for tools/setup-venv.sh.
set -euo pipefail
[[ $# -eq 1 || $# -eq 2 ]] || { echo "usage: tools/build-wheel.sh OUT_DIR [TARGET]" >&2; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
target="${2:-}"
target_args=()
if [[ -n "$target" ]]; then
    if ! rustc --print target-list | grep -qxF -- "$target"; then
        echo "build-wheel: $target is not a Rust target triple (rustc --print target-list)" >&2
        exit 2
    fi
    if ! rustup target list --installed | grep -qxF -- "$target"; then
        echo "build-wheel: rustup target add $target" >&2
        rustup target add "$target" >&2
    fi
    target_args=(--target "$target")
fi
py=$("$repo/tools/setup-venv.sh" | tail -n 1)
venv="$(dirname "$(dirname "$py")")"
work="$repo/target/wheel-build${target:+-$target}"
rm -rf "$work"
mkdir -p "$work/bin" "$work/ext"

# --strip: no debug info in what ships (the release profile keeps some for
# profiling); --compatibility manylinux2014: glibc 2.17, the oldest Rust
# supports, which every Salt onedir host has.
maturin_build() {
    PATH="$venv/bin:$PATH" "$venv/bin/maturin" build --release --locked --zig --strip \
        --compatibility manylinux2014 --auditwheel check "${target_args[@]}" "$@" >&2
}

echo "build-wheel: the keycache CLI (maturin -b bin, zig)" >&2
maturin_build -b bin -m "$repo/crates/keycache-cli/Cargo.toml" -o "$work/bin"
echo "build-wheel: saltext.keycache, abi3 (maturin, zig)" >&2
maturin_build -m "$repo/crates/saltext-keycache/Cargo.toml" -o "$work/ext"

shopt -s nullglob
bins=("$work"/bin/*.whl)
exts=("$work"/ext/*.whl)
[[ ${#bins[@]} -eq 1 && ${#exts[@]} -eq 1 ]] \
    || { echo "build-wheel: expected one wheel from each build, got: ${bins[*]} ${exts[*]}" >&2; exit 1; }
rm -f "$out/$(basename "${exts[0]}")"
"$py" "$repo/tools/wheel_add_binary.py" "${exts[0]}" "${bins[0]}" "$out"
