# Sourced by tools/fetch-etcd-debian.sh and tools/fetch-prometheus-debian.sh
# (which set `script_dir` first): what the two share. `fetch_setup` names the
# script's DEST and what lies under it, `log` and `die` say what it does, the
# private apt of tools/debian-apt.sh (sourced here) fetches and unpacks the
# packages, and `finish_fetch` checks and records them.
# shellcheck shell=bash
# The caller's variables and tools/debian-apt.sh's (tools, mirror, ...):
# shellcheck disable=SC2154

# shellcheck source=tools/debian-apt.sh
source "$script_dir/debian-apt.sh"

# fetch_setup NAME [DEST]: the script is fetch-NAME; `dest` is DEST (made
# absolute) or <repo>/target/NAME, `bin` and `stamp` are under it; `suite`
# is KEYCACHE_DEBIAN_SUITE or trixie.
fetch_setup() {
  prog="fetch-$1"
  dest="${2:-$(cd "$script_dir/.." && pwd)/target/$1}"
  case "$dest" in
    /*) ;;
    *) dest="$PWD/$dest" ;;
  esac
  dest="${dest%/}"
  suite="${KEYCACHE_DEBIAN_SUITE:-trixie}"
  bin="$dest/root/usr/bin"
  stamp="$dest/version"
}

log() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }

# The upstream part of Debian version $1: no epoch, no Debian revision, no
# +dfsg/+ds/~ suffix (3.5.16-4 -> 3.5.16, 2.53.3+ds1-2 -> 2.53.3).
upstream_of() {
  local v="${1#*:}"
  v="${v%-*}"
  printf '%s\n' "${v%%[+~]*}"
}

# finish_fetch UPSTREAM PACKAGES NAME=VERSION...: every tool of `tools` in
# `bin` must run and report UPSTREAM (else what they link against is shown
# and the run dies naming PACKAGES); logs what they link against (Debian
# builds them dynamically), records the suite, the mirror, each NAME=VERSION
# and UPSTREAM in `$stamp` for the warm runs, and removes the private apt tree
# and the .debs.
finish_fetch() {
  local upstream="$1" packages="$2" t ldd_out
  shift 2
  if ! check_tools "$upstream"; then
    for t in "${tools[@]}"; do
      if [[ -e "$bin/$t" ]]; then ldd "$bin/$t" >&2 || true; fi
    done
    die "the binaries of $packages do not run here or report another version"
  fi
  for t in "${tools[@]}"; do
    if ldd_out="$(ldd "$bin/$t" 2>&1)"; then
      log "$t links: $(printf '%s' "$ldd_out" | awk '{print $1}' | tr '\n' ' ')"
    else
      log "$t: $ldd_out"
    fi
  done
  {
    printf 'suite=%s\nmirror=%s\n' "$suite" "$mirror"
    printf '%s\n' "$@"
    printf 'upstream=%s\n' "$upstream"
  } >"$stamp"
  rm -rf "$apt_dir" "$dest/debs"
}
