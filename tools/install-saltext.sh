#!/usr/bin/env bash
# Builds the saltext.keycache wheel (tools/build-wheel.sh: abi3, manylinux,
# with the `keycache` CLI) and installs it into the venv of
# tools/setup-venv.sh the way `salt-pip install` installs an extension into
# a Salt onedir: `pip install --target <venv>/extras-3.N` (scripts land in
# `extras-3.N/bin`, off PATH), that directory reached through a `.pth` file
# in the venv's site-packages. The tests then run against the built wheel,
# not the source tree.
#
# Skipped when the installed wheel is of the same sources (a stamp in the
# venv holds their hash). Prints the venv's python on the last line; the
# wheel is left in target/wheels/.
#
# Environment: KEYCACHE_VENV as for tools/setup-venv.sh.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py=$("$repo/tools/setup-venv.sh" | tail -n 1)
venv="$(dirname "$(dirname "$py")")"
stamp="$venv/.saltext-keycache-sources"
extras="$venv/extras-$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
site="$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
pth="$site/saltext-keycache-extras.pth"

sources_hash() {
    (cd "$repo" && find Cargo.toml Cargo.lock .cargo crates/keycache/Cargo.toml crates/keycache/src \
        crates/keycache-config/Cargo.toml crates/keycache-config/src \
        crates/keycache-merge/Cargo.toml crates/keycache-merge/src \
        crates/keycache-bench/Cargo.toml crates/keycache-bench/src \
        crates/keycache-etcd/Cargo.toml crates/keycache-etcd/src crates/keycache-etcd/build.rs \
        crates/keycache-cli/Cargo.toml crates/keycache-cli/src \
        crates/saltext-keycache/Cargo.toml crates/saltext-keycache/pyproject.toml \
        crates/saltext-keycache/src crates/saltext-keycache/python \
        tools/build-wheel.sh tools/wheel_add_binary.py tools/install-saltext.sh -type f \
        -not -name '*.pyc' -print0 2>/dev/null \
        | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}

# What an installed wheel must pass: the extension imports from the extras
# directory (not from a copy elsewhere), Salt's loader imports, and the
# wheel's CLI runs.
check() {
    "$py" - "$extras" <<'EOF'
import os, subprocess, sys
import salt.loader
import saltext.keycache._native as native
extras = os.path.realpath(sys.argv[1])
where = os.path.realpath(native.__file__)
assert where.startswith(extras + os.sep), f"saltext.keycache imported from {where}, not {extras}"
out = subprocess.run([os.path.join(extras, "bin", "keycache"), "--version"],
                     check=True, capture_output=True, text=True).stdout
assert out.startswith("keycache "), out
EOF
}

want="$(sources_hash)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && check >/dev/null 2>&1; then
    echo "$py"
    exit 0
fi
echo "install-saltext: building the wheel and installing it salt-pip style into $extras" >&2
rm -f "$stamp"
wheel="$("$repo/tools/build-wheel.sh" "$repo/target/wheels" | tail -n 1)"
# A copy installed into site-packages (pip install ./crates/saltext-keycache)
# would come first on sys.path: remove it.
rm -rf "$extras" "$pth"
if "$py" -m pip show -q saltext.keycache >/dev/null 2>&1; then
    "$py" -m pip uninstall -y -q saltext.keycache >&2
fi
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
    "$py" -m pip install -q --no-deps --no-index --target "$extras" "$wheel" >&2
printf '%s\n' "$extras" >"$pth"
check >&2
printf '%s\n' "$want" >"$stamp"
echo "$py"
