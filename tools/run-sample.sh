#!/usr/bin/env bash
# The main job on a fresh clone: build keycache, migrate the sample
# localfs_key tree shipped in tools/sample-pki into target/sample-store
# (the tree itself is left untouched), then list the result as salt-key -L.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet -p keycache-cli
out=target/sample-store
rm -rf "$out"
target/release/keycache migrate tools/sample-pki --out "$out"
echo
target/release/keycache list "$out"
