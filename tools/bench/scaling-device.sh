#!/usr/bin/env bash
# Lookups across threads on a many-core machine, in one go: builds the
# comparison tool (release), makes its own data, and runs section `scaling`
# of `compare run` (keycache Reader::get_in and LMDB/heed with a writer
# process beside the readers, hashbrown in a parking_lot RwLock with a writer
# thread, plain hashbrown as the ceiling) on 1, 2, 4, ... every CPU, at 100k
# and 1M keys, 3 rounds.
#
#   tools/bench.sh scaling-device [extra compare options]
#
# Needs only a Rust toolchain and this repository: no network (the build is
# `--offline`: the crates must be in ~/.cargo already, or set COMPARE_BIN to a
# compare binary built elsewhere for this machine to skip the build), no
# Python, no Salt. The stores are put straight from the tool
# (`--generate rust`: about 3 s for 100k keys, 30-60 s for 1M, one thread
# whatever the cores); LMDB environments and in-memory maps are built from
# them. Data (~2 GB) goes to $SCALING_DATA (default target/bench-data-scaling).
# SCALING_SIZES (default 100000,1000000) and SCALING_THREADS (default max)
# replace those lists, for a trial run elsewhere.
# On 16 cores: build 1-3 min, data about 1 min, measurements about 2 min.
#
# Output: the Markdown report on stdout and in $OUT/scaling.md (target/
# bench-data-scaling/scaling.md when OUT is unset), raw samples in
# scaling.json, the machine's CPU layout in scaling-machine.txt and the
# tool's log in scaling.log beside it.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${OUT:-target/bench-data-scaling}
data=${SCALING_DATA:-target/bench-data-scaling}
mkdir -p "$out" "$data"

bin=${COMPARE_BIN:-}
if [[ -z "$bin" ]]; then
  echo "==> cargo build --release --offline --locked -p keycache-bench --example compare" >&2
  start=$SECONDS
  cargo build --release --offline --locked -p keycache-bench --example compare >&2
  echo "==> built in $((SECONDS - start)) s" >&2
  bin=target/release/examples/compare
fi

{
  echo "nproc: $(nproc)"
  echo "loadavg: $(cat /proc/loadavg)"
  lscpu 2>/dev/null | grep -E '^(Model name|Socket|Core|Thread|CPU\(s\)|NUMA|L3)' || true
} | tee "$out/scaling-machine.txt" >&2

# Bounded: the measurements take about 2 minutes on 16 cores.
timeout 420 "$bin" run --only scaling --generate rust --contenders lmdb,maps \
  --threads "${SCALING_THREADS:-max}" --sizes "${SCALING_SIZES:-100000,1000000}" --rounds 3 \
  --data "$data" --json "$out/scaling.json" "$@" \
  2> >(tee "$out/scaling.log" >&2) | tee "$out/scaling.md"
