# Sourced by tools/fetch-etcd-debian.sh and tools/fetch-prometheus-debian.sh:
# a private apt configuration over the machine's own Debian mirror, for
# `apt-get download` of one suite's packages without touching the machine's
# sources, lists, cache or installed packages.
#
# Before sourcing, the caller sets `dest` (its output directory), `suite`,
# `bin`, `stamp` and `tools`, and defines `log`, `die` and `tool_version`. `setup_private_apt` then sets `mirror` and
# `apt_dir`, exports APT_CONFIG and runs `apt-get update` of that suite only;
# `$dest/debs` is made empty for the downloads.
# shellcheck shell=bash

# Every tool of `tools` in `bin` is there, runs and reports (the caller's
# `tool_version`) the upstream version $1.
check_tools() {
  local t v
  for t in "${tools[@]}"; do
    [[ -x "$bin/$t" ]] || { log "$bin/$t: missing"; return 1; }
    v="$(tool_version "$t")" || { log "$bin/$t does not run here: $v"; return 1; }
    [[ "$v" == "$1" ]] || { log "$bin/$t reports version '$v', not $1"; return 1; }
  done
}

# A warm run: when `$stamp` records a version whose tools are there and run,
# says so (as package $2), prints $1 (the caller's last line) and exits;
# else checks that apt and dpkg are here for a cold one.
exit_if_warm() {
  local want t
  if [[ -f "$stamp" ]]; then
    want="$(sed -n 's/^upstream=//p' "$stamp")"
    if [[ -n "$want" ]] && check_tools "$want" 2>/dev/null; then
      log "$2 $want of Debian $suite already in $bin"
      echo "$1"
      exit 0
    fi
  fi
  for t in apt-get apt-config dpkg dpkg-deb timeout; do
    command -v "$t" >/dev/null 2>&1 || die "'$t' not found (this script needs a Debian-like machine)"
  done
}

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

setup_private_apt() {
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
}

# The candidate version of package $1 in the suite, or dies.
candidate() {
  local v
  v="$(apt-cache policy "$1" | sed -n 's/^[[:space:]]*Candidate:[[:space:]]*//p')"
  [[ -n "$v" && "$v" != "(none)" ]] || die "no $1 in $mirror $suite"
  printf '%s\n' "$v"
}

# Downloads the packages "NAME=VERSION"... into $dest/debs and unpacks them
# with `dpkg -x` into a new $dest/root.
download_and_unpack() {
  local deb
  log "apt-get download $*"
  (cd "$dest/debs" && timeout 600 apt-get -q download "$@" >&2) || die "apt-get download failed"
  rm -rf "$dest/root"
  mkdir -p "$dest/root"
  for deb in "$dest"/debs/*.deb; do
    log "dpkg -x $(basename "$deb")"
    dpkg -x "$deb" "$dest/root"
  done
}
