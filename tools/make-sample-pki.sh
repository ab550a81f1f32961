#!/usr/bin/env bash
# Regenerate tools/sample-pki: a small legacy `localfs_key` tree (Salt's pki_dir layout)
# with real RSA-2048 public keys made by openssl, plus the oddities a migration must
# survive. See tools/sample-pki/README.md for what each entry is and what Salt does with it.
#
# Usage: tools/make-sample-pki.sh [OUT_DIR]   (default: tools/sample-pki next to this script)
#
# Every run makes new keys (openssl is not seeded), so only rerun it when the tree has to
# change, and commit the result. README.md in OUT_DIR is kept; the four state directories
# and tools/outside.pub (the symlink target) are rebuilt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/sample-pki}"
# minions/linked-minion -> ../../outside.pub: the target sits two levels above the
# minions/ directory, i.e. next to OUT_DIR (tools/outside.pub for the default OUT_DIR).
outside="$(cd "$(dirname "$out")" 2>/dev/null && pwd || true)"
[ -n "$outside" ] || { echo "parent of $out must exist" >&2; exit 1; }
outside="$outside/outside.pub"

command -v openssl >/dev/null || { echo "openssl not found" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }

umask 022

# One fresh RSA-2048 public key in SubjectPublicKeyInfo PEM ("BEGIN PUBLIC KEY"), the form
# of a Salt minion's minion.pub.
newkey() {
    openssl genrsa 2048 2>/dev/null | openssl rsa -pubout 2>/dev/null > "$1"
    grep -q '^-----BEGIN PUBLIC KEY-----$' "$1" || { echo "openssl failed for $1" >&2; exit 1; }
    chmod 0644 "$1"
}

accepted=(
    web-01.dc1.example.com
    web-02.dc1.example.com
    web-03.dc1.example.com
    web-04.dc1.example.com          # also in minions_pre/ -> pending
    web-01.dc2.example.com
    web-02.dc2.example.com
    db-01.dc1.example.com
    db-02.dc1.example.com           # also in minions_denied/ (another key)
    db-01.dc2.example.com
    cache-01.dc1.example.com
    cache-02.dc1.example.com
    app-01.dc1.example.com
    app-02.dc1.example.com
    app-03.dc2.example.com
    app-04.dc2.example.com          # also in minions_rejected/ -> rejected
    k8s-node-01.dc1.example.com
    k8s-node-02.dc1.example.com
    k8s-node-03.dc2.example.com
    lb-01.dc1.example.com
    mon-01.dc1.example.com
    backup-01.dc2.example.com
    vault-01.dc3.example.com
    salt-syndic-01.dc3.example.com
    mail.example.org
    ci-runner-7
)
pending=(
    web-04.dc1.example.com          # also in minions/
    new-01.dc3.example.com
    k8s-node-04.dc3.example.com
    db-03.dc4.example.com
    laptop-jdoe
    build-agent-3
)
rejected=(
    app-04.dc2.example.com          # also in minions/
    old-web-01.dc1.example.com
    rogue-host
    test-vm-12
)
denied=(
    db-02.dc1.example.com           # also in minions/, with the accepted key there
    kiosk-3.example.net
    ghost-01.dc4.example.com
)

for d in minions minions_pre minions_rejected minions_denied; do
    rm -rf "${out:?}/$d"
done
mkdir -p "$out"
# Salt's verify_env creates these with umask 022 (0755); the pki_dir itself is forced to
# 0700 (or 0750). git keeps neither, so this only matters for a tree made outside git.
mkdir -m 0755 "$out/minions" "$out/minions_pre" "$out/minions_rejected" "$out/minions_denied"

for id in "${accepted[@]}"; do newkey "$out/minions/$id"; done
for id in "${pending[@]}";  do newkey "$out/minions_pre/$id"; done
for id in "${rejected[@]}"; do newkey "$out/minions_rejected/$id"; done
for id in "${denied[@]}";   do newkey "$out/minions_denied/$id"; done

# Oddities.
# A valid key under a dot-file name: every scan of the key directories skips it.
newkey "$out/minions_pre/.hidden-minion"
# Not a PEM public key at all.
printf 'not a key\n' > "$out/minions_pre/broken-minion"
# An empty file.
: > "$out/minions_rejected/empty-minion"
# A relative symlink leading out of the tree, to an existing valid key: never followed.
newkey "$outside"
ln -s ../../outside.pub "$out/minions/linked-minion"
# .key_cache as the master's key_cache: sched writes it (salt/master.py handle_key_cache):
# msgpack of the list of non-dot names in minions/.
python3 - "$out/minions" <<'EOF'
import os, struct, sys
d = sys.argv[1]
names = sorted(n for n in os.listdir(d) if not n.startswith("."))
def s(x):
    b = x.encode()
    if len(b) < 32:
        return bytes([0xA0 | len(b)]) + b
    return bytes([0xD9, len(b)]) + b
head = bytes([0x90 | len(names)]) if len(names) < 16 else b"\xdc" + struct.pack(">H", len(names))
with open(os.path.join(d, ".key_cache"), "wb") as f:
    f.write(head + b"".join(s(n) for n in names))
EOF
chmod 0644 "$out/minions_pre/broken-minion" "$out/minions_rejected/empty-minion" "$out/minions/.key_cache"

echo "wrote $out and $outside"
