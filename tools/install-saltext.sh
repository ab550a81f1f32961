#!/usr/bin/env bash
# Builds crates/saltext-keycache with maturin (its PEP 517 backend) and
# installs it with pip into the venv of tools/setup-venv.sh, as an operator
# installs it into Salt's Python: `pip install ./crates/saltext-keycache`.
# Skipped when the installed build is of the same sources (a stamp in the
# venv holds their hash). Prints the venv's python on the last line.
#
# Environment: KEYCACHE_VENV as for tools/setup-venv.sh.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py=$("$repo/tools/setup-venv.sh" | tail -n 1)
venv="$(dirname "$(dirname "$py")")"
stamp="$venv/.saltext-keycache-sources"

sources_hash() {
    (cd "$repo" && find Cargo.toml Cargo.lock crates/keycache/Cargo.toml crates/keycache/src \
        crates/keycache-config/Cargo.toml crates/keycache-config/src \
        crates/keycache-etcd/Cargo.toml crates/keycache-etcd/src \
        crates/saltext-keycache/Cargo.toml crates/saltext-keycache/pyproject.toml \
        crates/saltext-keycache/src crates/saltext-keycache/python -type f -print0 \
        | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}

want="$(sources_hash)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
    && "$py" -c 'import saltext.keycache._native' >/dev/null 2>&1; then
    echo "$py"
    exit 0
fi
echo "install-saltext: building and installing saltext.keycache (maturin, release)" >&2
rm -f "$stamp"
# maturin (pinned in setup-venv.sh) runs from the venv; no build isolation,
# so nothing is fetched at build time.
PATH="$venv/bin:$PATH" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
    "$py" -m pip install -q --no-deps --no-build-isolation --force-reinstall \
    "$repo/crates/saltext-keycache" >&2
"$py" -c 'import saltext.keycache._native, salt.loader' >&2
printf '%s\n' "$want" >"$stamp"
echo "$py"
