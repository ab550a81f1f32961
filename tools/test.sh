#!/usr/bin/env bash
# The test command: installs what the tests need (a Python venv with the real
# salt==3008.5 from PyPI, through tools/setup-venv.sh) and runs every test.
# Usage: tools/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> Python venv with salt==3008.5" >&2
py=$(tools/setup-venv.sh | tail -n 1)
export KEYCACHE_PYTHON="$py"

echo "==> cargo test (library, CLI, Salt interop, model, concurrency, reliability, fuzz corpus replay)" >&2
cargo test --locked "$@"

echo "==> benches and fuzz targets compile" >&2
cargo bench --locked --no-run
