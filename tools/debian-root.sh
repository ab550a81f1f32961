#!/usr/bin/env bash
# A Debian root (debootstrap --variant=minbase) of one suite, made from the
# Debian mirror this machine's apt already uses, and a way to run commands in
# it with /proc, /dev and /sys mounted.
#
#   tools/debian-root.sh SUITE DEST [PACKAGE...]
#       Makes DEST, a minbase root of SUITE (sid, trixie, ...) with PACKAGE...
#       installed too (debootstrap --include), or reuses it when DEST's stamp
#       (DEST/.keycache-debian-root) records the same suite, mirror and
#       package set and the root is complete. The root is built in DEST.new
#       and renamed to DEST only once debootstrap succeeded, so an interrupted
#       run leaves no half root at DEST. /etc/resolv.conf is copied in.
#       Progress goes to stderr; the LAST line on stdout is DEST (absolute).
#
#   tools/debian-root.sh --run DEST [--] CMD [ARG...]
#       Runs CMD chrooted in DEST, as root, with /proc (proc), /sys (sysfs)
#       and /dev (a bind of the machine's /dev, with /dev/pts and a private
#       tmpfs on /dev/shm) mounted. The mounts are made in a mount namespace
#       of their own (unshare --mount, private propagation): the machine's
#       mount table never sees them and they are gone when CMD ends, however
#       it ends (even killed). CMD runs in a PID namespace of its own too:
#       when it ends (or this script is killed), whatever it left running
#       in the root (a daemon) is killed with it. The environment is reset to PATH, HOME=/root,
#       LANG=C.UTF-8 and TERM; pass others with `env NAME=VALUE CMD...`.
#       DEST/etc/resolv.conf is refreshed from the machine's first. Exits
#       with CMD's status.
#
# Both need root. The mirror is the main archive's URI of the machine's apt
# sources, found as tools/debian-apt.sh finds it (mirror_from_sources, the
# file is sourced, unchanged); KEYCACHE_DEBIAN_MIRROR overrides it. The
# suite's Release file is checked against the keyring
# /usr/share/keyrings/debian-archive-keyring.gpg (KEYCACHE_DEBIAN_KEYRING
# overrides it). When that keyring is too old for the suite (a Release signed
# by keys newer than the machine's debian-archive-keyring), the
# debian-archive-keyring package of KEYCACHE_KEYRING_SUITE (default: trixie),
# whose Release the machine's keyring does verify, is fetched through a
# private apt configuration (tools/debian-apt.sh: apt checks its signature and
# hashes), its keyring must verify the suite's Release, and debootstrap uses
# it. Signatures are never skipped.
#
# Environment:
#   KEYCACHE_DEBIAN_MIRROR       the Debian archive URI (default: from apt's sources)
#   KEYCACHE_DEBIAN_KEYRING      the keyring to verify SUITE with (default: the machine's)
#   KEYCACHE_KEYRING_SUITE       where a newer keyring comes from (default: trixie)
#   KEYCACHE_DEBOOTSTRAP_TIMEOUT seconds debootstrap may take (default: 1200)
#
# Exit status: 0 done; 1 failure (the message names what failed); 2 bad usage;
# 3 this machine cannot make roots (not root, no debootstrap, chroot or
# unshare), so that callers can tell "cannot" from "failed".
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf 'debian-root: %s\n' "$*" >&2; }
die() { printf 'debian-root: error: %s\n' "$*" >&2; exit 1; }
cannot() { printf 'debian-root: cannot: %s\n' "$*" >&2; exit 3; }
usage() {
  cat >&2 <<'EOF'
usage: tools/debian-root.sh SUITE DEST [PACKAGE...]
       tools/debian-root.sh --run DEST [--] CMD [ARG...]
EOF
  exit 2
}

absolute() {
  case "$1" in
    /*) printf '%s\n' "${1%/}" ;;
    *) printf '%s\n' "$PWD/${1%/}" ;;
  esac
}

need_root_tools() {
  [[ "$(id -u)" == 0 ]] || cannot "not root (debootstrap and chroot need root)"
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || cannot "'$t' not found"
  done
}

# Mount points under $1 (or $1 itself) in this mount namespace.
mounts_under() {
  awk -v d="$1" '{ p = $5; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print p }' /proc/self/mountinfo
}

# ---- --run DEST [--] CMD... ------------------------------------------------
if [[ "${1:-}" == "--run" ]]; then
  [[ $# -ge 3 ]] || usage
  root="$(absolute "$2")"
  shift 2
  [[ "${1:-}" == "--" ]] && shift
  [[ $# -ge 1 ]] || usage
  need_root_tools chroot unshare mount
  [[ -f "$root/.keycache-debian-root" && -x "$root/usr/bin/env" ]] \
    || die "$root is not a complete root made by tools/debian-root.sh"
  if [[ -f /etc/resolv.conf ]]; then
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || log "could not copy /etc/resolv.conf into $root"
  fi
  # In new mount and PID namespaces: mount, then chroot. Nothing to unmount
  # or kill by hand: the mounts die with the mount namespace, and when this
  # bash (the PID namespace's init) ends, or unshare is killed (--kill-child),
  # every process left in the PID namespace (daemons CMD started) is killed.
  # shellcheck disable=SC2016 # expanded by the inner shell
  exec unshare --mount --propagation private --pid --fork --kill-child -- /bin/bash -c '
    root=$1; shift
    mount -t proc proc "$root/proc" || { echo "debian-root: error: mount proc on $root/proc failed" >&2; exit 1; }
    mount -t sysfs sysfs "$root/sys" || { echo "debian-root: error: mount sysfs on $root/sys failed" >&2; exit 1; }
    mount --bind /dev "$root/dev" || { echo "debian-root: error: bind /dev on $root/dev failed" >&2; exit 1; }
    mkdir -p "$root/dev/pts" "$root/dev/shm" 2>/dev/null
    if mountpoint -q /dev/pts; then mount --bind /dev/pts "$root/dev/pts" || true; fi
    mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm" \
      || { echo "debian-root: error: mount tmpfs on $root/dev/shm failed" >&2; exit 1; }
    # Not exec: this bash stays PID 1 of the namespace and reaps orphans.
    rc=0
    chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" "$@" || rc=$?
    exit "$rc"
  ' debian-root-run "$root" "$@"
fi

# ---- SUITE DEST [PACKAGE...] -----------------------------------------------
[[ $# -ge 2 ]] || usage
case "$1" in
  -*|"") usage ;;
esac
suite="$1"
dest="$(absolute "$2")"
shift 2
[[ "$dest" != / && -n "$dest" ]] || usage
packages=()
for p in "$@"; do
  [[ "$p" =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || { echo "debian-root: '$p' is not a Debian package name" >&2; exit 2; }
  packages+=("$p")
done
if [[ ${#packages[@]} -gt 0 ]]; then
  mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
fi
stamp="$dest/.keycache-debian-root"

# The mirror (tools/debian-apt.sh's mirror_from_sources; sourcing it only
# defines functions).
# shellcheck source=tools/debian-apt.sh
source "$script_dir/debian-apt.sh"
mirror="${KEYCACHE_DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  mirror="$(mirror_from_sources)"
  [[ -n "$mirror" ]] || cannot "no Debian archive URI in /etc/apt/sources.list(.d); set KEYCACHE_DEBIAN_MIRROR"
fi
mirror="${mirror%/}"

stamp_content="$(
  printf 'keycache debian-root v1\n'
  printf 'suite=%s\n' "$suite"
  printf 'mirror=%s\n' "$mirror"
  printf 'package=%s\n' "${packages[@]}"
)"

# Warm: the same root is there and complete.
if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_content" && -x "$dest/usr/bin/env" ]]; then
  log "Debian $suite root already in $dest"
  echo "$dest"
  exit 0
fi

need_root_tools debootstrap chroot unshare gpgv timeout flock
mkdir -p "$(dirname "$dest")"
exec 8>"$dest.lock"
flock 8
# Re-check under the lock: another run may have made it meanwhile.
if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_content" && -x "$dest/usr/bin/env" ]]; then
  log "Debian $suite root already in $dest"
  echo "$dest"
  exit 0
fi

work="$dest.new"
for d in "$dest" "$work"; do
  [[ -z "$(mounts_under "$d")" ]] || die "something is mounted under $d ($(mounts_under "$d" | tr '\n' ' ')); unmount it first"
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The suite's Release, checked against the keyring here; a newer keyring
# from KEYCACHE_KEYRING_SUITE when that fails for want of a key.
fetch() {
  if command -v wget >/dev/null 2>&1; then
    timeout 120 wget -q -O "$2" "$1"
  else
    timeout 120 curl -fsS -o "$2" "$1"
  fi
}
# Downloads and unpacks into $1/root the debian-archive-keyring package of
# suite $2 through tools/debian-apt.sh's private apt (which verifies that
# suite's Release with the machine's keyring, then the package's hashes).
# Its locals are what setup_private_apt reads and sets.
keyring_of_suite() {
  # shellcheck disable=SC2034 # apt_dir and keyring: set by setup_private_apt
  local dest="$1" suite="$2" apt_dir keyring v
  export KEYCACHE_DEBIAN_MIRROR="$mirror"
  setup_private_apt
  v="$(candidate debian-archive-keyring)"
  (cd "$dest/debs" && timeout 300 apt-get -q download "debian-archive-keyring=$v" >&2) \
    || die "apt-get download debian-archive-keyring=$v of $suite failed"
  dpkg-deb -x "$dest"/debs/debian-archive-keyring_*.deb "$dest/root"
}
keyring="${KEYCACHE_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}"
[[ -f "$keyring" ]] || cannot "no keyring $keyring (apt-get install debian-archive-keyring)"
log "Debian mirror: $mirror (suite $suite)"
fetch "$mirror/dists/$suite/InRelease" "$tmp/InRelease" \
  || cannot "cannot fetch $mirror/dists/$suite/InRelease (mirror unreachable, or no suite $suite there)"
if ! gpgv --keyring "$keyring" --status-fd 1 "$tmp/InRelease" >"$tmp/gpgv.status" 2>"$tmp/gpgv.err"; then
  grep -q '^\[GNUPG:\] NO_PUBKEY' "$tmp/gpgv.status" \
    || die "the $suite Release of $mirror does not verify against $keyring: $(tr '\n' ' ' <"$tmp/gpgv.err")"
  ksuite="${KEYCACHE_KEYRING_SUITE:-trixie}"
  log "$keyring lacks the key signing $suite; fetching debian-archive-keyring of $ksuite"
  # In a subshell: setup_private_apt exports APT_CONFIG.
  (keyring_of_suite "$tmp/kr" "$ksuite") || die "could not get a newer debian-archive-keyring from $ksuite"
  keyring="$tmp/kr/root/usr/share/keyrings/debian-archive-keyring.gpg"
  [[ -f "$keyring" ]] || die "the debian-archive-keyring package of $ksuite has no $keyring"
  gpgv --keyring "$keyring" "$tmp/InRelease" 2>"$tmp/gpgv.err" \
    || die "the $suite Release does not verify against $ksuite's keyring either: $(tr '\n' ' ' <"$tmp/gpgv.err")"
  log "the $suite Release verifies against $ksuite's debian-archive-keyring"
fi

rm -rf "$work"
include=()
if [[ ${#packages[@]} -gt 0 ]]; then
  include=("--include=$(IFS=,; printf '%s' "${packages[*]}")")
fi
log "debootstrap --variant=minbase ${include[*]:+${include[*]} }$suite $work $mirror"
# In a mount namespace of its own: the /proc and /sys debootstrap mounts in
# the root go with it, even when it is killed (timeout).
timeout "${KEYCACHE_DEBOOTSTRAP_TIMEOUT:-1200}" unshare --mount --propagation private -- debootstrap --variant=minbase --keyring="$keyring" \
  "${include[@]}" "$suite" "$work" "$mirror" >"$tmp/debootstrap.log" 2>&1 || {
  rc=$?
  tail -n 30 "$tmp/debootstrap.log" >&2
  [[ -f "$work/debootstrap/debootstrap.log" ]] && tail -n 30 "$work/debootstrap/debootstrap.log" >&2
  [[ $rc == 124 ]] && die "debootstrap of $suite timed out (KEYCACHE_DEBOOTSTRAP_TIMEOUT=${KEYCACHE_DEBOOTSTRAP_TIMEOUT:-1200}s)"
  die "debootstrap of $suite into $work failed (status $rc); the log's end is above"
}
[[ -z "$(mounts_under "$work")" ]] || die "debootstrap left mounts under $work: $(mounts_under "$work" | tr '\n' ' ')"
# Its package cache is not needed again.
rm -rf "$work"/var/cache/apt/archives/*.deb
if [[ -f /etc/resolv.conf ]]; then
  rm -f "$work/etc/resolv.conf"
  cp -L /etc/resolv.conf "$work/etc/resolv.conf"
fi
printf '%s\n' "$stamp_content" >"$work/.keycache-debian-root"
rm -rf "$dest"
mv "$work" "$dest"
log "Debian $suite root ready in $dest"
echo "$dest"
