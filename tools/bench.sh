#!/usr/bin/env bash
# The measuring tool: one entry for every measurement of keycache beside its
# contenders and floors (run by hand, not in CI; the code it runs is the
# keycache-bench crate and the scripts in tools/bench/).
#
#   tools/bench.sh compare [all|salt|lmdb|quick|scaling] [compare options]
#       the comparison tool (keycache-bench's `compare`): lookups, listing,
#       migration, writes, across threads; against Salt 3008.5, LMDB/heed and
#       in-memory maps (tools/bench/compare.sh)
#   tools/bench.sh scaling-device [compare options]
#       lookups on 1, 2, 4, ... every CPU on a many-core machine, offline
#       (tools/bench/scaling-device.sh)
#   tools/bench.sh driver [options]
#       saltext.keycache as a Salt master calls it, beside Salt's mmap_key
#       and localfs_key (tools/bench/driver.py; `driver --help`)
#   tools/bench.sh abi3 [options]
#       the abi3 wheel against a version-specific build (tools/bench/abi3.py)
#   tools/bench.sh etcd [--in-tmpdir] [etcd_bench options]
#       the etcd replica: lag, salt-key -A, new replicas and their targets,
#       on a fresh journaled ext4 on a loop device (tools/bench/etcd.sh)
#   tools/bench.sh merge [options]
#       `keycache snapshot` and `merge` beside Salt's state sync
#       (tools/bench/merge.sh)
#   tools/bench.sh chart RESULTS.json OUT.png
#       redraws the comparison tool's chart (tools/bench/chart.py)
#
# The Python parts run in the Salt venv (.venv, made by tools/setup-venv.sh;
# PYTHON overrides it). Each part's header says what it measures and needs.
set -euo pipefail
cd "$(dirname "$0")/.."
here=tools/bench
py=${PYTHON:-.venv/bin/python}
what=${1:-}
[ $# -gt 0 ] && shift
case "$what" in
  compare) exec bash "$here/compare.sh" "$@" ;;
  scaling-device) exec bash "$here/scaling-device.sh" "$@" ;;
  merge) exec bash "$here/merge.sh" "$@" ;;
  etcd) exec bash "$here/etcd.sh" "$@" ;;
  driver|abi3|chart)
    if [ ! -x "$py" ]; then
      echo "bench: no Python at $py: run tools/setup-venv.sh, or set PYTHON" >&2
      exit 2
    fi
    exec "$py" "$here/$what.py" "$@" ;;
  *)
    echo "usage: tools/bench.sh compare|scaling-device|driver|abi3|etcd|merge|chart [options]" >&2
    exit 2 ;;
esac
