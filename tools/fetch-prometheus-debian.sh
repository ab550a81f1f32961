#!/usr/bin/env bash
# Fetch Debian trixie's Prometheus (packages prometheus: the server; promtool:
# promtool) for the monitoring checks: promtool checks and unit-tests
# dist/keycache.rules.yml, and the CLI's Prometheus test runs a real server
# scraping a real replicator.
#
#   tools/fetch-prometheus-debian.sh [DEST]   DEST defaults to <repo>/target/prometheus-debian
#
# Trixie's, as tools/fetch-etcd-debian.sh fetches trixie's etcd: the same
# suite for both, and a Prometheus whose promtool has `test rules` (any 2.x
# has; trixie's is 2.53). The binaries are Go, linked against libc6 (>= 2.34)
# only: they run on bookworm too.
#
# The .deb comes from the Debian mirror this machine's apt already uses (the
# main archive's URI in /etc/apt/sources.list.d/*.sources or
# /etc/apt/sources.list; KEYCACHE_DEBIAN_MIRROR overrides it), through an apt
# configuration of its own under DEST/apt: its own sources list
# ("deb <mirror> trixie main"), package lists, cache and an empty dpkg status,
# none of the machine's apt.conf.d hooks, no lock (tools/debian-apt.sh, as for
# tools/fetch-etcd-debian.sh). The machine's sources, lists, cache and
# installed packages are not touched; nothing is installed: both .debs are
# unpacked with `dpkg -x` into DEST/root (their other dependencies, the web
# UI's JavaScript libraries, which the two binaries and the HTTP API do not
# need, are not fetched).
# Root is not needed.
#
# Idempotent: when DEST/root holds prometheus and promtool of the version
# recorded in DEST/version, nothing is fetched (no network).
# Progress goes to stderr; the LAST line on stdout is the root the packages
# were unpacked into, DEST/root, whose usr/bin holds prometheus and promtool
# (KEYCACHE_PROMETHEUS_ROOT=<that directory> for the tests).
#
# Environment:
#   KEYCACHE_DEBIAN_MIRROR  the Debian archive URI (default: from apt's sources)
#   KEYCACHE_DEBIAN_SUITE   the suite (default: trixie)
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# DEST and what lies under it, log and die, the private apt and the checks
# and record of a cold run (tools/lib-debian-fetch.sh, tools/debian-apt.sh).
# shellcheck source=tools/lib-debian-fetch.sh
source "$script_dir/lib-debian-fetch.sh"
fetch_setup prometheus-debian "$@"
tools=(prometheus promtool)

# "prometheus, version 2.53.3+ds1 (branch: ..., revision: ...)" /
# "promtool, version 2.53.3+ds1 (...)" -> 2.53.3 (the first line's third
# word, without a +ds/~ suffix).
tool_version() {
  local out
  out="$(timeout 30 "$bin/$1" --version 2>&1)" || return 1
  printf '%s\n' "$out" | awk 'NR == 1 { v = $3; sub(/[+~].*/, "", v); print v }'
}

exit_if_warm "$dest/root" prometheus
setup_private_apt
ver="$(candidate prometheus)"
tool_ver="$(candidate promtool)"
download_and_unpack "prometheus=$ver" "promtool=$tool_ver"

upstream="$(upstream_of "$ver")"
finish_fetch "$upstream" "prometheus $ver / promtool $tool_ver" \
  "prometheus=$ver" "promtool=$tool_ver"
log "prometheus $upstream of Debian $suite (prometheus $ver, promtool $tool_ver) in $bin"
echo "$dest/root"
