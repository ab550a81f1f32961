#!/usr/bin/env bash
# Builds and runs the side-by-side comparison of keycache against an
# in-memory HashMap (std, hashbrown), LMDB through heed and Salt 3008.5's own
# Python mmap_key, prints one report of medians and ratios (Markdown) and
# draws the lookup chart.
#
#   tools/bench.sh compare            # everything (~30 min on 2 cores)
#   tools/bench.sh compare salt       # keycache against Salt 3008.5 only: lookups, listing, migration
#   tools/bench.sh compare lmdb       # keycache against LMDB/heed and the HashMaps: lookups, open, writes, callgrind
#   tools/bench.sh compare quick      # 10k and 100k stores, 2 short rounds
#   tools/bench.sh compare scaling    # lookups across threads only (section `scaling`):
#                                     # keycache, LMDB/heed, hashbrown in an RwLock, each with a
#                                     # writer beside its readers, on 1, 2, 4, ... every CPU;
#                                     # defaults --threads max --sizes 1000000 (an option given
#                                     # replaces its default; `--generate rust` makes the store
#                                     # in seconds instead of migrating a tree)
#   tools/bench.sh compare all --rounds 3 ...   # extra options go to `compare run`
#
# Salt's migration is run on the 10k tree only (about 1 min: one locked,
# fsynced insert per key); its time for the 100k tree is extrapolated per key
# and marked so. `--salt-migrate-max 100000` runs it on the 100k tree too
# (10-20 more minutes).
#
# Output: the report on stdout and in target/bench-data/report-MODE.md, raw
# samples in target/bench-data/results-MODE.json; `all` also writes the chart
# docs/perf-lookups.png (other modes: target/bench-data/perf-lookups-MODE.png).
# Data (trees, stores, LMDB environments: ~10 GB for the 1M tree) is generated
# under target/bench-data on the first run and reused.
# Needs: cargo, python3 with venv; PyPI for the Salt venv (tools/setup-venv.sh)
# and matplotlib (a venv under target/bench-venv); valgrind for the
# instruction counts (skipped when missing).
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=${1:-all}
[[ $# -gt 0 ]] && shift

echo "==> cargo build --release -p keycache-cli -p keycache-bench --bin keycache --example compare" >&2
cargo build --release -p keycache-cli -p keycache-bench --bin keycache --example compare >&2

args=()
case "$mode" in
  all)
    ;;
  salt)
    args+=(--contenders salt --only lookup,list,migrate)
    ;;
  lmdb)
    args+=(--contenders lmdb,maps --only lookup,open,write,callgrind)
    ;;
  quick)
    args+=(--sizes 10000,100000 --rounds 2 --seconds 0.25 --salt-seconds 0.5)
    ;;
  scaling)
    # Defaults for the options not given (clap refuses a single-valued
    # option twice, and would add a list's values to the default's).
    given() { local o; for o in "${@:2}"; do [[ "$o" == "$1" || "$o" == "$1="* ]] && return 0; done; return 1; }
    given --only "$@" || args+=(--only scaling)
    given --threads "$@" || args+=(--threads max)
    given --sizes "$@" || args+=(--sizes 1000000)
    given --contenders "$@" || args+=(--contenders lmdb,maps)
    ;;
  *)
    echo "usage: tools/bench.sh compare [all|salt|lmdb|quick|scaling] [compare options]" >&2
    exit 2
    ;;
esac
if [[ "$mode" != lmdb && "$mode" != scaling ]]; then
  echo "==> Salt 3008.5 venv (tools/setup-venv.sh)" >&2
  py=$(tools/setup-venv.sh | tail -n 1)
  args+=(--python "$py")
fi

data=target/bench-data
mkdir -p "$data"
echo "==> load: $(cat /proc/loadavg)" >&2
target/release/examples/compare run "${args[@]}" --json "$data/results-$mode.json" "$@" \
  | tee "$data/report-$mode.md"

# The chart, with matplotlib from a venv of its own (of the lookup section).
[[ "$mode" == scaling ]] && exit 0
venv=target/bench-venv
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  echo "==> matplotlib venv at $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check matplotlib >&2
fi
if [[ "$mode" == all ]]; then
  png=docs/perf-lookups.png
  mkdir -p docs
else
  png=$data/perf-lookups-$mode.png
fi
if python3 -c "import json,sys; sys.exit(0 if json.load(open('$data/results-$mode.json')).get('lookup') else 1)"; then
  "$venv/bin/python" tools/bench/chart.py "$data/results-$mode.json" "$png" >&2
  echo "chart: $png" >&2
fi
