#!/usr/bin/env bash
# Measures `keycache snapshot` and `keycache merge` side by side with Salt
# 3008.5's own path for the same keys, and prints one Markdown report of
# medians (run by hand, not in CI).
#
#   tools/bench.sh merge                 # everything (~20 min on 2 cores, nearly all of it Salt)
#   tools/bench.sh merge --rounds 7      # keycache rounds per figure (default 5)
#   tools/bench.sh merge --salt-rounds 1 # Salt rounds per figure (default 3; each 2-3 min at 100k; 0: no Salt)
#   tools/bench.sh merge --no-1m         # leave out the 1M-key snapshot/list comparison
#   tools/bench.sh merge --keys 2000     # the merge figures with N minions (default 100000; a quick check)
#
# What it measures (release build; every round on a fresh copy of its store,
# copied outside the timed part; page cache warm):
#   1. `keycache merge` of a snapshot of N minions (100k) into an empty store:
#      a new master's first merge.
#   2. `keycache merge` of a peer's snapshot that differs from the store in 1%
#      of its keys (N/200 deleted, N/250 rejected, N/1000 accepted on the
#      peer), the two stores having agreed before (merged each other), as the
#      docs/install.md's timer finds them.
#   3. Salt's own path for the same keys: salt.cluster.state_sync's
#      install_keys_chunk (one mmap_key `store` per key, in chunks of 200, as
#      a joining master installs a peer's keys): all of the snapshot's entries
#      into an empty store, and into a copy of the 1%-different store (Salt
#      has no diff: state sync sends every key); and, as Salt's best case,
#      only the changed entries (Salt can store, not delete: the deleted ones
#      stay).
#   4. `keycache snapshot` of a 1M-key store against `keycache list
#      --include-pub` of the same store (both to /dev/null; the snapshot to a
#      file too), after a first snapshot that writes the store's history.
#   5. Versioned merges at 1M keys, wall time and peak
#      memory (/usr/bin/time): a peer B of the 1M store A (a copy without
#      its history: a store of its own), the two brought in step by merges
#      both ways; a no-op merge (A's snapshot into B, nothing differs); a 1%
#      merge (on a copy of A, 9,000 accepted keys deleted and 1,000 pending
#      keys accepted, its snapshot merged into a fresh copy of B each round);
#      `keycache snapshot A -o FILE`.
#
# Data (trees from tools/gen-pki-tree.py, stores from `keycache migrate`, the
# peer put in step by merges) is generated under target/bench-data on the
# first run and reused (the trees are shared with tools/bench.sh compare);
# the 1M store takes ~2.5 GB.
# Needs: cargo, python3; the Salt venv of tools/setup-venv.sh (or
# KEYCACHE_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/../.."

rounds=5
salt_rounds=3
with_1m=1
n=100000
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --salt-rounds) salt_rounds=$2; shift 2 ;;
    --no-1m) with_1m=0; shift ;;
    --keys) n=$2; shift 2 ;;
    *) echo "usage: tools/bench.sh merge [--rounds N] [--salt-rounds N] [--no-1m] [--keys N]" >&2; exit 2 ;;
  esac
done
if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1000)); then
  echo "--keys: give a number of minions, 1000 or more" >&2; exit 2
fi
size=$((n * 10))

echo "==> cargo build --release -p keycache-cli --bin keycache" >&2
cargo build --release -p keycache-cli --bin keycache >&2
kc=$PWD/target/release/keycache
if [[ -n "${KEYCACHE_PYTHON:-}" ]]; then
  py=$KEYCACHE_PYTHON
else
  echo "==> Salt 3008.5 venv (tools/setup-venv.sh)" >&2
  py=$(tools/setup-venv.sh | tail -n 1)
fi
export KEYCACHE_REBUILD_SETTLE_MS=0   # no Salt master shares these stores
data=target/bench-data
work=$data/merge
mkdir -p "$work"

log() { echo "==> $*" >&2; }

# A tree of N minions (shared with tools/bench/compare.sh), made once.
tree() {
  local n=$1 t=$data/tree-$1
  if [[ ! -e $t.json ]]; then
    log "generating a tree of $n minions (tools/gen-pki-tree.py)"
    rm -rf "$t"
    python3 tools/gen-pki-tree.py "$t" --minions "$n" > "$t.json.tmp"
    mv "$t.json.tmp" "$t.json"
  fi
  echo "$t"
}

# A store migrated from the tree of N minions, table size SIZE, made once.
store() {
  local n=$1 size=$2 s=$work/store-$1
  if [[ ! -e $s/.bench-complete ]]; then
    local t
    t=$(tree "$n")
    log "keycache migrate $t --out $s --size $size"
    rm -rf "$s"; mkdir -p "$s"
    "$kc" migrate "$t" --out "$s" --size "$size" --no-master-keys > /dev/null
    touch "$s/.bench-complete"
  fi
  echo "$s"
}

now() { echo "$EPOCHREALTIME"; }
# Seconds between two `now`s.
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.6f}')" "$1" "$(now)"; }
median() { python3 -c "import statistics, sys; print(f'{statistics.median(float(x) for x in sys.argv[1:]):.6f}')" "$@"; }
fmt() { python3 -c "import math, sys; s = float(sys.argv[1]); print('not run' if math.isnan(s) else f'{s * 1000:.0f} ms' if s < 10 else f'{s:.1f} s')" "$1"; }
ratio() { python3 -c "import math, sys; r = float(sys.argv[1]) / float(sys.argv[2]); print('-' if math.isnan(r) else f'{r:.0f}x' if r >= 10 else f'{r:.2f}x')" "$1" "$2"; }

# timed NAME ROUNDS PREP CMD...: runs PREP (not timed) then CMD, ROUNDS
# times; prints the median seconds and keeps every sample in $work/NAME.times.
timed() {
  local name=$1 r=$2 prep=$3; shift 3
  local samples=()
  for ((i = 0; i < r; i++)); do
    eval "$prep"
    local s
    s=$(now)
    "$@" > /dev/null
    samples+=("$(since "$s")")
  done
  echo "${samples[*]}" > "$work/$name.times"
  log "$name: ${samples[*]} s"
  median "${samples[@]}"
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
log "load: $load0"

# --- the store, the peer in step with it, and the peer's 1% changes -----------
# The two stores agree first (the peer takes the store's snapshot, the store
# the peer's, the peer the store's again: both joined one cluster, every entry
# with the same version on both), then the peer changes 1% of the keys and
# takes the snapshot that the timed merges read.
sN=$(store "$n" "$size")
snapN=$work/snap-$n
peer=$work/peer-$n
snap_peer=$work/snap-peer-$n
if [[ ! -e $peer/.bench-complete ]]; then
  log "the peer: in step with the $n-minion store, then 1% of its keys changed"
  rm -rf "$peer"; mkdir -p "$peer"
  "$kc" snapshot "$sN" -o "$snapN"
  "$kc" merge "$peer" "$snapN" --tree never --size "$size" > /dev/null
  "$kc" snapshot "$peer" -o "$snap_peer"
  "$kc" merge "$sN" "$snap_peer" --tree never > /dev/null
  "$kc" snapshot "$sN" -o "$snapN"
  "$kc" merge "$peer" "$snapN" --tree never > /dev/null
  "$kc" list "$peer" --json > "$work/list-$n.json"
  python3 - "$work/list-$n.json" "$work" "$n" <<'EOF'
import json, sys
l = json.load(open(sys.argv[1]))
n = int(sys.argv[3])
acc, pre = l["minions"], l["minions_pre"]
d, r, a = n // 200, n // 250, n // 1000
if len(acc) < d + r or len(pre) < a:
    sys.exit(f"the tree has {len(acc)} accepted and {len(pre)} pending keys: too few")
open(sys.argv[2] + "/ids-delete", "w").write("\n".join(acc[0:d]) + "\n")
open(sys.argv[2] + "/ids-reject", "w").write("\n".join(acc[d:d + r]) + "\n")
open(sys.argv[2] + "/ids-accept", "w").write("\n".join(pre[0:a]) + "\n")
EOF
  xargs -a "$work/ids-delete" "$kc" delete "$peer" -y --tree never > /dev/null
  xargs -a "$work/ids-reject" "$kc" reject "$peer" --include-all --tree never > /dev/null
  xargs -a "$work/ids-accept" "$kc" accept "$peer" --tree never > /dev/null
  "$kc" snapshot "$peer" -o "$snap_peer"
  touch "$peer/.bench-complete"
fi
plan=$("$kc" merge "$sN" "$snap_peer" --dry-run --json \
  | python3 -c "import json,sys; print(json.load(sys.stdin)['counts'])")
log "the 1% merge's plan: $plan"

# --- keycache merge ------------------------------------------------------------
dst=$work/dst
empty_prep='rm -rf "$dst"; mkdir -p "$dst"'
m_empty=$(timed merge-empty "$rounds" "$empty_prep" \
  "$kc" merge "$dst" "$snapN" --tree never --size "$size")
n_empty=$("$kc" list "$dst" --json | python3 -c "import json,sys; l=json.load(sys.stdin); print(sum(len(v) for v in l.values()))")
one_prep='rm -rf "$dst"; cp -a "$sN" "$dst"'
m_one=$(timed merge-1pct "$rounds" "$one_prep" \
  "$kc" merge "$dst" "$snap_peer" --tree never)
if ! "$kc" diff "$dst" "$peer" > /dev/null; then
  echo "the merged store differs from the peer" >&2; exit 1
fi

# --- Salt's own path: install_keys_chunk, one store per key --------------------
python3 tools/bench/merge_snap2items.py "$snapN" "$work/items-$n.json" >&2
python3 tools/bench/merge_snap2items.py "$snap_peer" "$work/items-peer.json" >&2
python3 tools/bench/merge_snap2items.py "$snap_peer" "$work/items-changed.json" --only-changed-from "$snapN" >&2
salt_run() { # NAME ITEMS PREP
  local name=$1 items=$2 prep=$3 samples=()
  if [[ $salt_rounds == 0 ]]; then echo nan; return; fi
  for ((i = 0; i < salt_rounds; i++)); do
    eval "$prep"
    local out
    out=$("$py" tools/bench/merge_salt_install.py --pki-dir "$dst" --items "$items" --size "$size")
    samples+=("$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['seconds'])" "$out")")
  done
  echo "${samples[*]}" > "$work/$name.times"
  log "$name: ${samples[*]} s"
  median "${samples[@]}"
}
s_empty=$(salt_run salt-empty "$work/items-$n.json" "$empty_prep")
s_one=$(salt_run salt-1pct-all "$work/items-peer.json" "$one_prep")
s_changed=$(salt_run salt-1pct-changed "$work/items-changed.json" "$one_prep")
rm -rf "$dst"

# --- 1M: snapshot against list --include-pub ------------------------------------
if [[ $with_1m == 1 ]]; then
  s1m=$(store 1000000 2100000)
  "$kc" list "$s1m" --include-pub > /dev/null   # warm the page cache
  "$kc" snapshot "$s1m" > /dev/null             # the store's history, once
  snap_null=$(timed snapshot-1m "$rounds" ':' \
    bash -c '"$0" snapshot "$1" > /dev/null' "$kc" "$s1m")
  snap_file=$(timed snapshot-1m-file "$rounds" 'rm -f "$work/snap-1m"' \
    "$kc" snapshot "$s1m" -o "$work/snap-1m")
  list_pub=$(timed list-pub-1m "$rounds" ':' \
    bash -c '"$0" list "$1" --include-pub > /dev/null' "$kc" "$s1m")
  list_json=$(timed list-pub-json-1m "$rounds" ':' \
    bash -c '"$0" list "$1" --include-pub --json > /dev/null' "$kc" "$s1m")
  snap_bytes=$(stat -c %s "$work/snap-1m")
  rm -f "$work/snap-1m"

  # --- 5. versioned merges at 1M: peer B in step with A, then no-op and 1% ---
  b1m=$work/store-1m-peer
  if [[ ! -e $b1m/.bench-complete ]]; then
    log "peer B of the 1M store: a copy without the history, merged in step both ways"
    rm -rf "$b1m"; cp -a "$s1m" "$b1m"; rm -f "$b1m"/.keycache-*
    "$kc" snapshot "$s1m" -o "$work/a.snap" 2>/dev/null; "$kc" merge "$b1m" "$work/a.snap" > /dev/null
    "$kc" snapshot "$b1m" -o "$work/b.snap" 2>/dev/null; "$kc" merge "$s1m" "$work/b.snap" > /dev/null
    touch "$b1m/.bench-complete"
  fi
  "$kc" snapshot "$s1m" -o "$work/a.snap" 2>/dev/null
  a1=$work/store-1m-changed
  rm -rf "$a1"; cp -a "$s1m" "$a1"
  "$kc" list "$a1" --state accepted --json | python3 -c "import json, sys; print('\n'.join(json.load(sys.stdin)['minions'][:9000]))" > "$work/del.txt"
  "$kc" list "$a1" --state pending --json | python3 -c "import json, sys; print('\n'.join(json.load(sys.stdin)['minions_pre'][:1000]))" > "$work/acc.txt"
  xargs "$kc" delete -y "$a1" < "$work/del.txt" > /dev/null
  xargs "$kc" accept -y "$a1" < "$work/acc.txt" > /dev/null
  "$kc" snapshot "$a1" -o "$work/a1.snap" 2>/dev/null
  one_plan=$("$kc" merge "$b1m" "$work/a1.snap" --dry-run 2>&1 | tail -n 1 || true)
  # timed_mem NAME ROUNDS PREP CMD...: like `timed`, also the peak RSS
  # (KiB, /usr/bin/time); prints "median-seconds median-KiB".
  timed_mem() {
    local name=$1 r=$2 prep=$3; shift 3
    local secs=() mem=()
    for ((i = 0; i < r; i++)); do
      eval "$prep"
      /usr/bin/time -f "%e %M" -o "$work/$name.one" "$@" > /dev/null 2>&1 || true
      read -r e m < "$work/$name.one"
      secs+=("$e"); mem+=("$m")
    done
    echo "${secs[*]} / ${mem[*]}" > "$work/$name.times"
    log "$name: ${secs[*]} s, ${mem[*]} KiB"
    echo "$(median "${secs[@]}") $(median "${mem[@]}")"
  }
  read -r noop_s noop_m < <(timed_mem merge-noop-1m "$rounds" ':' "$kc" merge "$b1m" "$work/a.snap")
  read -r one_s one_m < <(timed_mem merge-1pct-1m "$rounds" 'rm -rf "$work/b1m-copy"; cp -a "$b1m" "$work/b1m-copy"' \
    "$kc" merge "$work/b1m-copy" "$work/a1.snap")
  read -r snap_s snap_m < <(timed_mem snapshot-file-1m "$rounds" 'rm -f "$work/snap-1m"' \
    "$kc" snapshot "$s1m" -o "$work/snap-1m")
  rm -rf "$work/b1m-copy" "$a1" "$work/snap-1m"
fi

# --- report --------------------------------------------------------------------
cat <<EOF
## Snapshot and merge: $(date -u +%Y-%m-%d) on $(git rev-parse --short HEAD)

$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average at the start: $load0, at the end: $(cut -d' ' -f1-3 /proc/loadavg).
Medians of $rounds keycache rounds and $salt_rounds Salt rounds; every round on a fresh copy of its store.
1% merge plan: $plan.

| what ($n minions: $(python3 -c "import json; d=json.load(open('$work/items-$n.json')); print(len(d['keys']), 'keys,', len(d['denied_keys']), 'denied')")) | keycache merge | Salt install_keys_chunk | Salt / keycache |
|---|---|---|---|
| into an empty store | $(fmt "$m_empty") | $(fmt "$s_empty") (every entry) | $(ratio "$s_empty" "$m_empty") |
| into a store in step but for 1% | $(fmt "$m_one") | $(fmt "$s_one") (every entry) / $(fmt "$s_changed") (only the $(python3 -c "import json; d=json.load(open('$work/items-changed.json')); print(len(d['keys']) + len(d['denied_keys']))") changed, deletions not possible) | $(ratio "$s_one" "$m_one") / $(ratio "$s_changed" "$m_one") |

Entries after the merge into the empty store: $n_empty.
EOF
if [[ $with_1m == 1 ]]; then
  cat <<EOF

| 1M keys | median | vs list --include-pub |
|---|---|---|
| keycache snapshot > /dev/null | $(fmt "$snap_null") | $(ratio "$snap_null" "$list_pub") |
| keycache snapshot -o FILE ($((snap_bytes / 1048576)) MiB, fsynced) | $(fmt "$snap_file") | $(ratio "$snap_file" "$list_pub") |
| keycache list --include-pub > /dev/null | $(fmt "$list_pub") | 1.0x |
| keycache list --include-pub --json > /dev/null | $(fmt "$list_json") | $(ratio "$list_json" "$list_pub") |
EOF
  cat <<EOF

| versioned merges, 1M keys | wall (median) | peak RSS (median) | goal |
|---|---|---|---|
| no-op merge (nothing differs) | $(fmt "$noop_s") | $((${noop_m%.*} / 1024)) MiB | 1 s, 1.5 GB |
| 1% merge ($one_plan) | $(fmt "$one_s") | $((${one_m%.*} / 1024)) MiB | 5 s, 1.5 GB |
| snapshot -o FILE | $(fmt "$snap_s") | $((${snap_m%.*} / 1024)) MiB | 1.5 GB |
EOF
fi
echo
echo "Samples (seconds): $work/*.times"
