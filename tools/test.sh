#!/usr/bin/env bash
# The test command: installs what the tests need (a Python venv with the real
# salt==3008.5 from PyPI, through tools/setup-venv.sh) and runs every test.
# Usage: tools/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> Python venv with salt==3008.5" >&2
py=$(tools/setup-venv.sh | tail -n 1)
export KEYCACHE_PYTHON="$py"

# strace lets tests/hostile.rs check that the migrator opens nothing outside the
# tree and the target; without it that check is skipped (and says so).
if ! command -v strace >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "==> installing strace (Debian package)" >&2
    { timeout 300 apt-get install -y -q strace || { timeout 300 apt-get update -q && timeout 300 apt-get install -y -q strace; }; } >/dev/null 2>&1 \
        || echo "warning: could not install strace; the migrator's syscall check is skipped" >&2
fi

echo "==> cargo test (library, CLI, Salt interop, model, concurrency, reliability, fuzz corpus replay)" >&2
cargo test --locked "$@"

echo "==> benches and the comparison tool compile" >&2
cargo bench --locked --workspace --no-run
