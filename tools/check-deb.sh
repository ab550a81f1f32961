#!/usr/bin/env bash
# Check the Debian package tools/build-deb.sh made:
#
#   tools/check-deb.sh DEB
#
# - `dpkg-deb -c` lists the binary, the man page, the bash, zsh and fish
#   completions, the replicator's systemd unit and the docs, with the modes
#   they need;
# - `dpkg-deb -f`: Package keycache, a Version, the Architecture of this
#   machine's dpkg, a Depends naming libc6 (>= V) with V no older than the
#   newest glibc symbol version the binary needs, section admin;
# - the copyright file is machine-readable (DEP-5): License: Apache-2.0,
#   pointing at /usr/share/common-licenses/Apache-2.0, not a copy of the text;
# - usr/share/doc/keycache/changelog.gz is the upstream CHANGELOG.md, and
#   changelog.Debian.gz a Debian changelog whose latest entry is the
#   package's Version, by its Maintainer (dpkg-parsechangelog, when here);
# - no maintainer script (the unit is neither enabled nor started);
# - the unit starts /usr/bin/keycache;
# - extracted with `dpkg-deb -x`, usr/bin/keycache --version names the
#   package's version, and `usr/bin/keycache generate man | head` runs; the
#   gzipped man page is roff naming the subcommands;
# - lintian, when it is installed, with --fail-on error,warning (the tags it
#   gives are printed; info and pedantic ones do not fail). Without lintian
#   that check prints a SKIP line, is appended to $KEYCACHE_SKIP_LOG when set
#   and fails with KEYCACHE_NO_SKIPS=1.
# Every failure says what is wrong; the exit status is 1 when any check
# failed, 2 on bad usage.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: tools/check-deb.sh DEB" >&2
    exit 2
fi
deb="$1"
if [ ! -f "$deb" ]; then
    echo "check-deb: $deb: no such file" >&2
    exit 2
fi

failures=0
fail() {
    echo "check-deb: $deb: $*" >&2
    failures=$((failures + 1))
}

listing="$(dpkg-deb -c "$deb")" || { echo "check-deb: $deb: dpkg-deb -c cannot read it" >&2; exit 1; }
# cargo-deb 2.0.0 writes member names without dpkg-deb -b's leading "./":
# the paths below are compared in that form, either way
listing="$(sed -E 's#^(.* )(\./)?([^ ]+)$#\1./\3#' <<<"$listing")"

# path and mode (ls -l's first column) of what the package must hold
expect=(
    "./usr/bin/keycache -rwxr-xr-x"
    "./usr/share/man/man1/keycache.1.gz -rw-r--r--"
    "./usr/share/bash-completion/completions/keycache -rw-r--r--"
    "./usr/share/zsh/vendor-completions/_keycache -rw-r--r--"
    "./usr/share/fish/vendor_completions.d/keycache.fish -rw-r--r--"
    "./lib/systemd/system/keycache-replicate.service -rw-r--r--"
    "./lib/systemd/system/keycache-stats.service -rw-r--r--"
    "./lib/systemd/system/keycache-stats.timer -rw-r--r--"
    "./usr/share/doc/keycache/examples/keycache.rules.yml -rw-r--r--"
    "./usr/share/doc/keycache/copyright -rw-r--r--"
    "./usr/share/doc/keycache/README.md -rw-r--r--"
    "./usr/share/doc/keycache/changelog.gz -rw-r--r--"
    "./usr/share/doc/keycache/changelog.Debian.gz -rw-r--r--"
    "./usr/share/lintian/overrides/keycache -rw-r--r--"
    "./usr/share/doc/keycache/cli.md -rw-r--r--"
    "./usr/share/doc/keycache/design.md -rw-r--r--"
)
for e in "${expect[@]}"; do
    path="${e% *}"
    mode="${e##* }"
    line="$(awk -v p="$path" '$NF == p' <<<"$listing")"
    if [ -z "$line" ]; then
        fail "lacks $path"
    elif [ "${line%% *}" != "$mode" ]; then
        fail "$path has mode ${line%% *}, not $mode"
    fi
done
# every doc of the source tree is shipped
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for doc in "$repo"/docs/*.md; do
    path="./usr/share/doc/keycache/$(basename "$doc")"
    awk -v p="$path" '$NF == p {found=1} END {exit !found}' <<<"$listing" || fail "lacks $path"
done
# nothing outside the places a package of a command may write
while read -r path; do
    case "$path" in
      ./usr/bin/* | ./usr/share/* | ./lib/systemd/system/*) ;;
      *) fail "holds $path, outside usr/bin, usr/share and lib/systemd/system" ;;
    esac
done < <(awk '$1 !~ /^d/ {print $NF}' <<<"$listing")

field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = keycache ] || fail "Package is '$(field Package)', not keycache"
version="$(field Version)"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.+~]+)?$ ]] || fail "Version '$version' is not X.Y.Z[-REV]"
arch="$(field Architecture)"
if command -v dpkg >/dev/null 2>&1; then
    [ "$arch" = "$(dpkg --print-architecture)" ] || fail "Architecture is '$arch', not this machine's $(dpkg --print-architecture)"
else
    if [ -z "$arch" ] || [ "$arch" = all ]; then fail "Architecture is '$arch'"; fi
fi
depends="$(field Depends)"
[[ "$depends" == *libc6* ]] || fail "Depends '$depends' does not name libc6 (not \$auto-computed?)"
[ "$(field Section)" = admin ] || fail "Section is '$(field Section)', not admin"
[ -n "$(field Maintainer)" ] || fail "no Maintainer"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# no maintainer scripts: the replicator is enabled by an operator, once
# keycache_etcd is configured
dpkg-deb -e "$deb" "$work/control"
for script in preinst postinst prerm postrm; do
    [ ! -e "$work/control/$script" ] || fail "has a $script maintainer script"
done

dpkg-deb -x "$deb" "$work/root"
bin="$work/root/usr/bin/keycache"
unit="$work/root/lib/systemd/system/keycache-replicate.service"
if [ -f "$unit" ]; then
    grep -q '^ExecStart=/usr/bin/keycache replicate' "$unit" || fail "the unit does not start /usr/bin/keycache replicate"
fi
if [ -x "$bin" ]; then
    if ver="$("$bin" --version 2>&1)"; then
        [ "$ver" = "keycache ${version%%-*}" ] || fail "usr/bin/keycache --version says '$ver', the package is $version"
    else
        fail "usr/bin/keycache --version fails: $ver"
    fi
    head_man="$("$bin" generate man | head -n 5)" || fail "usr/bin/keycache generate man | head fails"
    grep -q '^\.TH KEYCACHE 1 ' <<<"$head_man" || fail "usr/bin/keycache generate man has no .TH KEYCACHE 1 in its first lines: $head_man"
    # Depends asks for a libc6 no older than the newest glibc symbol
    # version the binary needs (else it installs where it cannot run).
    if command -v objdump >/dev/null 2>&1; then
        needs="$(objdump -T "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -V | tail -n 1)"
        floor="$(sed -nE 's/.*libc6 \(>= ([0-9.]+)\).*/\1/p' <<<"$depends")"
        if [ -z "$floor" ]; then
            fail "Depends '$depends' gives libc6 no (>= VERSION)"
        elif [ -n "$needs" ] && [ "$(printf '%s\n%s\n' "$needs" "$floor" | sort -V | tail -n 1)" != "$floor" ]; then
            fail "Depends asks for libc6 (>= $floor), but usr/bin/keycache needs GLIBC_$needs"
        fi
    fi
    if command -v readelf >/dev/null 2>&1 && readelf -S "$bin" | grep -q '\.debug_info'; then
        fail "usr/bin/keycache is not stripped (it has a .debug_info section)"
    fi
fi
copyright="$work/root/usr/share/doc/keycache/copyright"
if [ -f "$copyright" ]; then
    [ "$(head -n 1 "$copyright")" = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/" ] \
        || fail "usr/share/doc/keycache/copyright is not machine-readable (its first line is not DEP-5's Format:; source: dist/debian/copyright)"
    grep -qx 'License: Apache-2.0' "$copyright" || fail "usr/share/doc/keycache/copyright has no 'License: Apache-2.0' (source: dist/debian/copyright)"
    grep -q '^Copyright: [0-9]' "$copyright" || fail "usr/share/doc/keycache/copyright has no 'Copyright: YEAR HOLDER' notice (source: dist/debian/copyright)"
    grep -q '/usr/share/common-licenses/Apache-2\.0' "$copyright" \
        || fail "usr/share/doc/keycache/copyright does not point at /usr/share/common-licenses/Apache-2.0"
    ! grep -q 'TERMS AND CONDITIONS FOR USE' "$copyright" \
        || fail "usr/share/doc/keycache/copyright holds the license's full text (lintian: copyright-file-contains-full-apache-2-license)"
fi
changelog="$work/root/usr/share/doc/keycache/changelog.gz"
if [ -f "$changelog" ]; then
    if ! gzip -dc "$changelog" | cmp -s - "$repo/CHANGELOG.md"; then
        fail "usr/share/doc/keycache/changelog.gz is not the gzipped CHANGELOG.md of $repo"
    fi
fi
debian_changelog="$work/root/usr/share/doc/keycache/changelog.Debian.gz"
if [ -f "$debian_changelog" ]; then
    if ! entry="$(gzip -dc "$debian_changelog")"; then
        fail "usr/share/doc/keycache/changelog.Debian.gz is not gzip"
    elif [[ "$(head -n 1 <<<"$entry")" != "keycache ($version) "* ]]; then
        fail "usr/share/doc/keycache/changelog.Debian.gz starts '$(head -n 1 <<<"$entry")', not 'keycache ($version) ...'"
    elif command -v dpkg-parsechangelog >/dev/null 2>&1; then
        printf '%s\n' "$entry" >"$work/changelog.Debian"
        if ! parsed="$(dpkg-parsechangelog -l "$work/changelog.Debian" 2>&1)"; then
            fail "dpkg-parsechangelog rejects usr/share/doc/keycache/changelog.Debian.gz: $parsed"
        else
            [ "$(sed -n 's/^Version: //p' <<<"$parsed")" = "$version" ] \
                || fail "changelog.Debian.gz's latest entry is version '$(sed -n 's/^Version: //p' <<<"$parsed")', the package is $version"
            [ "$(sed -n 's/^Maintainer: //p' <<<"$parsed")" = "$(field Maintainer)" ] \
                || fail "changelog.Debian.gz's latest entry is by '$(sed -n 's/^Maintainer: //p' <<<"$parsed")', the Maintainer is '$(field Maintainer)'"
        fi
    fi
fi
man="$work/root/usr/share/man/man1/keycache.1.gz"
if [ -f "$man" ]; then
    if page="$(gzip -dc "$man")"; then
        for sub in migrate list get accept reject delete verify compact export snapshot merge replicate "etcd seed"; do
            grep -qxF ".SS \"keycache $sub\"" <<<"$page" || fail "the man page has no section for keycache $sub"
        done
    else
        fail "usr/share/man/man1/keycache.1.gz is not gzip"
    fi
fi
bash_completion="$work/root/usr/share/bash-completion/completions/keycache"
if [ -f "$bash_completion" ]; then
    bash -n "$bash_completion" || fail "bash -n rejects the bash completion"
    grep -q -- '--config-dir' "$bash_completion" || fail "the bash completion lacks --config-dir"
fi

# lintian: errors and warnings fail (overrides: dist/debian/lintian-overrides)
if command -v lintian >/dev/null 2>&1; then
    lintian_rc=0
    tags="$(lintian --fail-on error,warning --display-level '>=info' "$deb" 2>&1)" || lintian_rc=$?
    # as root lintian says "running with root privileges is not recommended!"
    tags="$(grep -v '^running with root privileges' <<<"$tags" || true)"
    if [ "$lintian_rc" = 0 ]; then
        if [ -n "$tags" ]; then
            echo "check-deb: lintian $(lintian --version | sed 's/^Lintian v//'): no error or warning; it says:" >&2
            printf '%s\n' "$tags" >&2
        fi
    else
        printf '%s\n' "$tags" >&2
        fail "lintian --fail-on error,warning rejects it (exit $lintian_rc; tags above; overrides, with the reason, go in dist/debian/lintian-overrides)"
    fi
else
    echo "SKIP check-deb: lintian is not installed (apt-get install lintian)" >&2
    [ -z "${KEYCACHE_SKIP_LOG:-}" ] || echo "tools/check-deb.sh: lintian (not installed)" >>"$KEYCACHE_SKIP_LOG"
    [ "${KEYCACHE_NO_SKIPS:-}" != 1 ] || fail "KEYCACHE_NO_SKIPS=1: lintian is not installed, a skip is a failure"
fi

if [ "$failures" -gt 0 ]; then
    echo "check-deb: $deb: $failures check(s) failed" >&2
    exit 1
fi
echo "check-deb: $deb: ok ($(field Package) $version $arch; Depends: $depends)" >&2
