#!/usr/bin/env bash
# Two builds of `keycache` write the same bank files, byte for byte:
#
#   tools/compare-banks.sh OLD_KEYCACHE NEW_KEYCACHE [MINIONS]
#
# For a refactoring that must not change what keycache writes (moves, not
# rewrites). On two trees, the sample tree of tools/sample-pki and a tree of
# MINIONS generated keys (tools/gen-pki-tree.py, seed 1; default 10000), each
# binary in turn, on its own copy: migrate; accept, reject and delete of a few
# ids; merge of one snapshot (taken once, by NEW, from a copy of the store
# where another id was rejected); compact. After each step every bank file
# (`.mmap_*`) of the two copies must be equal, byte for byte, but for each
# slot's mtime (the time of its write: 8 bytes at offset 1 + id_size + 12 of
# every slot of an index; the header's bytes there are reserved zeros), with
# the default layout (slot 96, id 64). Prints one line per step and tree;
# exits 1 at the first difference, naming the file and offset, 2 on bad usage.
set -euo pipefail

if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: tools/compare-banks.sh OLD_KEYCACHE NEW_KEYCACHE [MINIONS]" >&2
    exit 2
fi
old="$1"
new="$2"
minions="${3:-10000}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

run() {
    local bin="$1"
    shift
    NO_COLOR=1 "$bin" "$@" >/dev/null 2>"$work/stderr" \
        || { echo "compare-banks: $bin $*: failed:" >&2; cat "$work/stderr" >&2; exit 1; }
}

same() {
    local what="$1" a="$2" b="$3" f n=0
    for f in "$a"/.mmap_*; do
        [ -e "$f" ] || continue
        n=$((n + 1))
        python3 - "$f" "$b/${f##*/}" <<'EOF' || { echo "compare-banks: $what: ${f##*/} differs ($a, $b)" >&2; exit 1; }
import sys
a, b = (open(p, "rb").read() for p in sys.argv[1:3])
if sys.argv[1].endswith(".idx") and len(a) == len(b):
    slot, mtime = 96, 1 + 64 + 12  # the default layout's slot and mtime field
    a, b = bytearray(a), bytearray(b)
    for off in range(mtime, len(a), slot):
        a[off : off + 8] = b[off : off + 8] = bytes(8)
if a != b:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"first difference at byte {at} (lengths {len(a)}, {len(b)})", file=sys.stderr)
    sys.exit(1)
EOF
    done
    for f in "$b"/.mmap_*; do
        [ -e "$a/${f##*/}" ] || { echo "compare-banks: $what: ${f##*/} only in $b" >&2; exit 1; }
    done
    echo "compare-banks: $what: $n bank files equal"
}

# ids of the store $1 in salt-key's group $2 (minions, minions_pre), sorted, at most $3
ids() {
    NO_COLOR=1 "$new" list "$1" --json 2>/dev/null \
        | python3 -c 'import json, sys; print("\n".join(sorted(json.load(sys.stdin)[sys.argv[1]])[: int(sys.argv[2])]))' "$2" "$3"
}

compare() {
    local name="$1" tree="$2"
    local a="$work/$name-old" b="$work/$name-new" peer="$work/$name-peer"
    cp -a "$tree" "$a"
    cp -a "$tree" "$b"
    for d in "$a" "$b"; do rm -f "$d"/README.md; done
    run "$old" migrate "$a" --no-master-keys
    run "$new" migrate "$b" --no-master-keys
    same "$name: migrate" "$a" "$b"

    mapfile -t pending < <(ids "$b" minions_pre 3)
    mapfile -t accepted < <(ids "$b" minions 4)
    if [ "${#pending[@]}" -gt 0 ]; then
        run "$old" accept "$a" "${pending[@]}" --yes
        run "$new" accept "$b" "${pending[@]}" --yes
        same "$name: accept ${#pending[@]}" "$a" "$b"
    fi
    run "$old" reject "$a" "${accepted[0]}" --yes --include-all
    run "$new" reject "$b" "${accepted[0]}" --yes --include-all
    same "$name: reject 1" "$a" "$b"
    run "$old" delete "$a" "${accepted[1]}" --yes
    run "$new" delete "$b" "${accepted[1]}" --yes
    same "$name: delete 1" "$a" "$b"

    # A peer's snapshot, taken once: the peer rejected another key.
    cp -a "$b" "$peer"
    rm -f "$peer"/.keycache-identity
    run "$new" reject "$peer" "${accepted[2]}" --yes --include-all
    "$new" snapshot "$peer" -o "$work/$name.snap" 2>/dev/null
    run "$old" merge "$a" "$work/$name.snap" --allow-unknown-cluster
    run "$new" merge "$b" "$work/$name.snap" --allow-unknown-cluster
    same "$name: merge" "$a" "$b"

    run "$old" compact "$a"
    run "$new" compact "$b"
    same "$name: compact" "$a" "$b"
}

compare sample "$repo/tools/sample-pki"
python3 "$repo/tools/gen-pki-tree.py" "$work/gen" --minions "$minions" --seed 1 >/dev/null
compare "generated-$minions" "$work/gen"
echo "compare-banks: $old and $new write the same bank files"
