#!/usr/bin/env bash
# The test command, which CI (.ci/run) runs too. Cheapest first:
#   1. cargo fmt --check;
#   2. cargo clippy on every target, warnings are errors;
#   3. a Python venv with the real salt==3008.5 (tools/setup-venv.sh), the
#      saltext.keycache wheel built (tools/build-wheel.sh), its tags and pip's
#      resolution for Python 3.14 and 3.11 checked (tools/check-wheel.py) and
#      installed as salt-pip installs it (tools/install-saltext.sh), then
#      cargo test (library, CLI, Salt interop, model, concurrency,
#      reliability, fuzz corpus replay);
#   4. pytest on the Salt driver (crates/saltext-keycache/tests) against
#      that install, with the wheel's `keycache` binary;
#   5. the Debian package of the CLI (tools/build-deb.sh, tools/check-deb.sh);
#   6. cargo doc, warnings are errors;
#   7. the benches and the comparison tool compile.
# Tests that cannot run here (not root, no strace) print a SKIP line and are
# listed at the end; with KEYCACHE_NO_SKIPS=1 (as .ci/run sets) they fail.
# Usage: tools/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> cargo fmt --check" >&2
cargo fmt --all -- --check

echo "==> cargo clippy (all targets, warnings are errors)" >&2
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> the saltext.keycache wheel (abi3, manylinux, with the CLI), installed salt-pip style into a venv with salt==3008.5" >&2
py=$(tools/install-saltext.sh | tail -n 1)
export KEYCACHE_PYTHON="$py"
wheel=$(ls -t target/wheels/saltext_keycache-*.whl | head -n 1)
"$py" tools/check-wheel.py "$wheel"
# The CLI the driver's tests run is the wheel's, as installed (extras-3.N/bin).
wheel_bin=$("$py" -c 'import pathlib, saltext.keycache as k; print(pathlib.Path(k.__file__).parents[2] / "bin" / "keycache")')

# strace lets tests/cli/hostile.rs check that the migrator opens nothing outside the
# tree and the target; without it that check is skipped (and says so).
if ! command -v strace >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "==> installing strace (Debian package)" >&2
    { timeout 300 apt-get install -y -q strace || { timeout 300 apt-get update -q && timeout 300 apt-get install -y -q strace; }; } >/dev/null 2>&1 \
        || echo "warning: could not install strace; the migrator's syscall check is skipped" >&2
fi

skips=$(mktemp)
trap 'rm -f "$skips"' EXIT
export KEYCACHE_SKIP_LOG="$skips"

echo "==> cargo test (library, CLI, Salt interop, model, concurrency, reliability, fuzz corpus replay)" >&2
cargo test --locked "$@"

echo "==> the Salt driver (saltext.keycache): Salt's own mmap_key tests, interop, concurrency, a real master and minion" >&2
KEYCACHE_BIN="$wheel_bin" KEYCACHE_EXPECT_RUNNER_BIN="$wheel_bin" "$py" -m pytest -p no:cacheprovider -q crates/saltext-keycache/tests

if [ -s "$skips" ]; then
    echo "==> $(sort -u "$skips" | wc -l) test(s) or part(s) of tests skipped:" >&2
    sort -u "$skips" >&2
fi

echo "==> the Debian package (cargo-deb) of the wheel's keycache: built, then its contents checked" >&2
deb=$(tools/build-deb.sh target/deb "$wheel_bin" | tail -n 1)
tools/check-deb.sh "$deb"

echo "==> cargo doc (warnings are errors)" >&2
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

echo "==> benches and the comparison tool compile" >&2
cargo bench --locked --workspace --no-run
