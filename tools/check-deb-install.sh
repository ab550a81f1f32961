#!/usr/bin/env bash
# Install the Debian package tools/build-deb.sh made, use it, remove it:
#
#   tools/check-deb-install.sh DEB [ROOT]
#
# Without ROOT, on this machine: refuses (exit 1) when a keycache package is
# installed that this script did not install; else `dpkg -i DEB` and checks
#   - dpkg says keycache DEB's Version is installed; /usr/bin/keycache
#     --version names it, and `keycache` on a plain PATH is /usr/bin/keycache;
#   - `man -w keycache` finds /usr/share/man/man1/keycache.1.gz and
#     `man keycache` (MANPAGER=cat, MANWIDTH=80) shows its text;
#   - the bash completion (the installed file sourced, or loaded by
#     bash-completion when that is installed): its function, called with
#     COMP_WORDS for `keycache mi`, offers `migrate`, and for
#     `keycache list --`, `--config-dir`;
#   - the zsh and fish completions are there; with zsh installed, `zsh -n`
#     and compinit (from zsh's own $fpath) finds _keycache for keycache; with
#     fish installed, `fish -n` and `complete -C` (from fish's vendor
#     directory) offers the same as bash;
#   - `systemd-analyze verify` of the installed units, when systemd-analyze
#     is there;
# then `dpkg -r keycache`, `dpkg -P keycache`, and that no file or directory
# of the package (`dpkg -L` taken while installed) remains (a directory
# another package owns may) and `dpkg -s keycache` says it is not installed.
# An EXIT trap purges the package whenever this script installed it. Nothing
# else is installed or restored. A stamp, /var/lib/keycache-check-deb-install
# (of the system checked), says "this script installed keycache": a run
# killed before its trap ran leaves it, and the next run purges that
# keycache instead of refusing.
#
# With ROOT, the same inside a Debian root made (or reused) by
#   tools/debian-root.sh SUITE ROOT bash-completion fish man-db systemd zsh
# where SUITE is ROOT's last path component (target/debian-roots/trixie:
# trixie; KEYCACHE_DEBIAN_SUITE overrides it): DEB and this script are copied
# into ROOT/tmp and run there with `tools/debian-root.sh --run` (the root's
# own dpkg, man-db, bash, zsh, fish and systemd-analyze). Another user of the
# same ROOT must ask for the same packages, or the root is made anew.
#
# Where this machine cannot (not root, no dpkg; for ROOT: debian-root.sh exit
# status 3, e.g. no debootstrap or the mirror unreachable) it prints
# `SKIP <reason>`, appends the reason to $KEYCACHE_SKIP_LOG when set, and
# exits 0, or 1 with KEYCACHE_NO_SKIPS=1.
#
# Every failure says what is wrong; the exit status is 1 when any check
# failed, 2 on bad usage. (`--inside DEB` is this script's own entry point in
# the system checked: do not use it directly.)
set -euo pipefail

me="check-deb-install"
stamp=/var/lib/keycache-check-deb-install
pkg=keycache

usage() {
    echo "usage: tools/check-deb-install.sh DEB [ROOT]" >&2
    exit 2
}

skip() {
    echo "SKIP $me: $*" >&2
    if [ -n "${KEYCACHE_SKIP_LOG:-}" ]; then
        echo "tools/check-deb-install.sh${where:+ ($where)}: $*" >>"$KEYCACHE_SKIP_LOG"
    fi
    if [ "${KEYCACHE_NO_SKIPS:-}" = 1 ]; then
        echo "$me: KEYCACHE_NO_SKIPS=1: a skip is a failure" >&2
        exit 1
    fi
    exit 0
}

# =============================================================================
# In the system checked (this machine, or chrooted in ROOT)
# =============================================================================
inside() {
    local deb="$1" status version upstream before=0
    # globals: the EXIT trap reads them after this function returned
    failures=0
    installed_by_us=0
    fail() {
        echo "$me: ${sys_name}: $*" >&2
        failures=$((failures + 1))
    }
    note() { echo "$me: ${sys_name}: $*" >&2; }
    # shellcheck source=/dev/null
    sys_name="$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-this system}" || echo "this system")"
    status_of() { dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true; }

    # shellcheck disable=SC2317 # the EXIT trap's
    purge_ours() {
        if [ "$installed_by_us" = 1 ] || [ -f "$stamp" ]; then
            if [ -n "$(status_of | tr -d ' ')" ] && [ "$(status_of)" != "un " ]; then
                echo "$me: ${sys_name}: purging the $pkg package this script installed" >&2
                dpkg_retry -P "$pkg" >&2 || echo "$me: ${sys_name}: dpkg -P $pkg FAILED: remove it by hand" >&2
            fi
            rm -f "$stamp"
        fi
    }
    # dpkg waits for no lock: retry for up to 2 minutes while apt or dpkg runs
    dpkg_retry() {
        local i out rc
        for i in $(seq 1 60); do
            rc=0
            out="$(dpkg "$@" 2>&1)" || rc=$?
            if [ "$rc" != 0 ] && grep -qE 'locked by another process|is locked' <<<"$out" && [ "$i" -lt 60 ]; then
                [ "$i" != 1 ] || echo "$me: ${sys_name}: dpkg $*: the dpkg database is locked; waiting" >&2
                sleep 2
                continue
            fi
            printf '%s\n' "$out"
            return "$rc"
        done
    }
    trap 'purge_ours' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    for t in dpkg dpkg-deb dpkg-query; do
        command -v "$t" >/dev/null 2>&1 || { echo "$me: ${sys_name}: no $t here" >&2; return 1; }
    done
    version="$(dpkg-deb -f "$deb" Version)" || { echo "$me: $deb: dpkg-deb -f cannot read it" >&2; return 1; }
    upstream="${version%-*}"
    [ "$(dpkg-deb -f "$deb" Package)" = "$pkg" ] || { echo "$me: $deb is not a $pkg package" >&2; return 1; }

    # --- not installed already (unless an interrupted run of ours left it) --
    status="$(status_of)"
    if [ -n "$(tr -d ' ' <<<"$status")" ] && [ "$status" != "un " ]; then
        if [ -f "$stamp" ]; then
            echo "$me: ${sys_name}: $pkg ($(dpkg-query -W -f='${Version}' "$pkg")) was left by an interrupted run of this script ($stamp: $(head -n 1 "$stamp")); purging it first" >&2
            dpkg_retry -P "$pkg" >&2 || { echo "$me: ${sys_name}: dpkg -P $pkg failed" >&2; return 1; }
            rm -f "$stamp"
        else
            echo "$me: ${sys_name}: a $pkg package is installed (dpkg status '$status', version $(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)) that this script did not install: refusing to replace or remove it (dpkg -P $pkg first, or check in a root: tools/check-deb-install.sh DEB ROOT)" >&2
            return 1
        fi
    fi
    rm -f "$stamp"

    # --- install ---------------------------------------------------------------
    mkdir -p "$(dirname "$stamp")"
    echo "installed by tools/check-deb-install.sh (pid $$) at $(date -u +%FT%TZ) from $deb" >"$stamp"
    installed_by_us=1
    local out
    if ! out="$(dpkg_retry -i "$deb" 2>&1)"; then
        printf '%s\n' "$out" >&2
        fail "dpkg -i $deb failed (output above)"
        return 1
    fi
    [ "$(status_of)" = "ii " ] || fail "after dpkg -i, dpkg-query says '$(status_of)' for $pkg, not 'ii '"
    [ "$(dpkg-query -W -f='${Version}' "$pkg")" = "$version" ] \
        || fail "dpkg-query says $pkg $(dpkg-query -W -f='${Version}' "$pkg") is installed, not $version"
    note "dpkg -i: $pkg $version installed"

    # --- the command -------------------------------------------------------------
    local ver
    if ver="$(/usr/bin/keycache --version 2>&1)"; then
        [ "$ver" = "keycache $upstream" ] || fail "/usr/bin/keycache --version says '$ver', not 'keycache $upstream'"
    else
        fail "/usr/bin/keycache --version fails: $ver"
    fi
    local found
    found="$(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin command -v keycache || true)"
    case "$found" in
      /usr/bin/keycache | /bin/keycache) ;;  # /bin is /usr/bin on a merged-/usr system
      "") fail "keycache is not found on PATH" ;;
      *) note "keycache on PATH is $found, not /usr/bin/keycache (something else installed one in /usr/local)" ;;
    esac

    # --- man ---------------------------------------------------------------------
    if command -v man >/dev/null 2>&1; then
        local where_man page
        before=$failures
        where_man="$(env -u MANPATH man -w keycache 2>&1)" || fail "man -w keycache finds no page: $where_man"
        case "$where_man" in
          /usr/share/man/man1/keycache.1.gz) ;;
          *) fail "man -w keycache says '$where_man', not /usr/share/man/man1/keycache.1.gz" ;;
        esac
        if page="$(env -u MANPATH MANWIDTH=80 MANPAGER=cat PAGER=cat man keycache 2>&1)"; then
            grep -qE 'keycache +- +Salt 3008 mmap_key minion-key stores' <<<"$page" \
                || fail "man keycache shows no NAME line 'keycache - Salt 3008 mmap_key minion-key stores...': $(head -n 8 <<<"$page")"
            for text in 'keycache migrate' 'keycache replicate' '--config-dir'; do
                grep -qF -- "$text" <<<"$page" || fail "man keycache does not show '$text'"
            done
            [ "$failures" != "$before" ] || note "man: man -w keycache finds $where_man; man keycache shows its text"
        else
            fail "man keycache fails: $(head -n 5 <<<"$page")"
        fi
    elif [ "${KEYCACHE_CHECK_NEED_ALL:-}" = 1 ]; then
        fail "man is not installed here (man-db was asked for)"
    else
        note "man is not installed here: the man page's presence is checked, not man -w"
        [ -f /usr/share/man/man1/keycache.1.gz ] || fail "no /usr/share/man/man1/keycache.1.gz"
    fi

    # --- bash completion -------------------------------------------------------------
    local bc=/usr/share/bash-completion/completions/keycache replies
    before=$failures
    if [ ! -f "$bc" ]; then
        fail "no $bc"
    else
        # $1: the words; prints the function's COMPREPLY, one a line
        complete_bash() {
            # shellcheck disable=SC2016 # expanded by the inner bash
            bash --norc --noprofile -c '
                set -u
                bc=$1; shift
                if [ -f /usr/share/bash-completion/bash_completion ]; then
                    # as an interactive shell gets it: bash-completion loads
                    # the file on demand, from its completions directory
                    . /usr/share/bash-completion/bash_completion >/dev/null 2>&1 || true
                    for loader in _comp_load __load_completion _completion_loader; do
                        if declare -F "$loader" >/dev/null; then "$loader" keycache >/dev/null 2>&1 || true; break; fi
                    done
                    spec=$(complete -p keycache 2>/dev/null) || { echo "bash-completion did not load a completion for keycache" >&2; exit 1; }
                    [[ "$spec" == *" -F _keycache "* ]] || { echo "bash-completion loaded the wrong completion for keycache: $spec" >&2; exit 1; }
                else
                    . "$bc" || { echo "sourcing $bc failed" >&2; exit 1; }
                    spec=$(complete -p keycache 2>/dev/null) || { echo "$bc defines no completion for keycache (complete -p)" >&2; exit 1; }
                fi
                fn=$(sed -n "s/.* -F \([^ ]*\) .*/\1/p" <<<"$spec")
                [ -n "$fn" ] || { echo "no completion function in: $spec" >&2; exit 1; }
                COMP_WORDS=("$@")
                COMP_CWORD=$(( $# - 1 ))
                COMP_LINE="$*"
                COMP_POINT=${#COMP_LINE}
                COMP_TYPE=9
                COMP_KEY=9
                COMPREPLY=()
                prev=""
                [ $# -lt 2 ] || prev=${COMP_WORDS[COMP_CWORD-1]}
                "$fn" keycache "${COMP_WORDS[COMP_CWORD]}" "$prev" || { echo "$fn failed" >&2; exit 1; }
                printf "%s\n" "${COMPREPLY[@]}"
            ' check-bash-completion "$bc" "$@"
        }
        if replies="$(complete_bash keycache mi 2>&1)"; then
            grep -qx 'migrate' <<<"$replies" || fail "the bash completion of 'keycache mi' does not offer migrate: $(tr '\n' ' ' <<<"$replies")"
        else
            fail "the bash completion of 'keycache mi' fails: $replies"
        fi
        if replies="$(complete_bash keycache list -- 2>&1)"; then
            grep -qx -- '--config-dir' <<<"$replies" || fail "the bash completion of 'keycache list --' does not offer --config-dir: $(tr '\n' ' ' <<<"$replies" | cut -c1-300)"
        else
            fail "the bash completion of 'keycache list --' fails: $replies"
        fi
        if [ "$failures" != "$before" ]; then
            :
        elif [ -f /usr/share/bash-completion/bash_completion ]; then
            note "bash completion: loaded by bash-completion, offers migrate and --config-dir"
        else
            note "bash completion: $bc sourced (bash-completion is not installed), offers migrate and --config-dir"
        fi
    fi

    # --- zsh -----------------------------------------------------------------------
    local zc=/usr/share/zsh/vendor-completions/_keycache
    if [ ! -f "$zc" ]; then
        fail "no $zc"
    elif command -v zsh >/dev/null 2>&1; then
        local zout
        before=$failures
        zout="$(zsh -n "$zc" 2>&1)" || fail "zsh -n rejects $zc: $zout"
        # compinit from zsh's own $fpath: the file is where zsh looks
        zout="$(HOME=/nonexistent zsh -f -c 'autoload -Uz compinit && compinit -u -D && print -r -- ${_comps[keycache]-none}' 2>&1)" \
            || fail "zsh compinit fails: $zout"
        [ "$(tail -n 1 <<<"$zout")" = _keycache ] \
            || fail "zsh's compinit does not take $zc for keycache (_comps[keycache] is '$(tail -n 1 <<<"$zout")'; is it on zsh's \$fpath?)"
        [ "$failures" != "$before" ] || note "zsh completion: zsh -n passes, compinit maps keycache to _keycache"
    elif [ "${KEYCACHE_CHECK_NEED_ALL:-}" = 1 ]; then
        fail "zsh is not installed here (it was asked for)"
    else
        note "zsh is not installed here: only $zc's presence is checked"
    fi

    # --- fish ----------------------------------------------------------------------
    local fc=/usr/share/fish/vendor_completions.d/keycache.fish
    if [ ! -f "$fc" ]; then
        fail "no $fc"
    elif command -v fish >/dev/null 2>&1; then
        local fout fish_home
        before=$failures
        fout="$(fish -n "$fc" 2>&1)" || fail "fish -n rejects $fc: $fout"
        # fish's own configuration sets its completion path (vendor
        # directory included); a scratch HOME for what it writes
        fish_home="$(mktemp -d)"
        fout="$(HOME="$fish_home" XDG_CONFIG_HOME="$fish_home/.config" XDG_DATA_HOME="$fish_home/.local/share" \
            fish -c 'complete -C "keycache mi"' 2>&1)" || fail "fish complete -C 'keycache mi' fails: $fout"
        cut -f1 <<<"$fout" | grep -qx migrate || fail "fish's completion of 'keycache mi' does not offer migrate: $(head -n 5 <<<"$fout" | tr '\n' ' ')"
        fout="$(HOME="$fish_home" XDG_CONFIG_HOME="$fish_home/.config" XDG_DATA_HOME="$fish_home/.local/share" \
            fish -c 'complete -C "keycache list --"' 2>&1)" || fail "fish complete -C 'keycache list --' fails: $fout"
        cut -f1 <<<"$fout" | grep -qx -- --config-dir || fail "fish's completion of 'keycache list --' does not offer --config-dir: $(head -n 5 <<<"$fout" | tr '\n' ' ')"
        rm -rf "$fish_home"
        [ "$failures" != "$before" ] || note "fish completion: fish -n passes, complete -C offers migrate and --config-dir"
    elif [ "${KEYCACHE_CHECK_NEED_ALL:-}" = 1 ]; then
        fail "fish is not installed here (it was asked for)"
    else
        note "fish is not installed here: only $fc's presence is checked"
    fi

    # --- the files, for after the removal; the units -----------------------------
    local files units=()
    files="$(dpkg-query -L "$pkg")" || fail "dpkg-query -L $pkg fails"
    mapfile -t units < <(grep -E '^(/usr)?/lib/systemd/system/[^/]+\.(service|timer)$' <<<"$files" || true)
    [ "${#units[@]}" = 3 ] || fail "dpkg -L lists ${#units[@]} units (${units[*]}), not 3"
    if command -v systemd-analyze >/dev/null 2>&1; then
        local sout
        if sout="$(systemd-analyze verify "${units[@]}" 2>&1)"; then
            [ -z "$sout" ] || note "systemd-analyze verify says: $sout"
            note "systemd-analyze verify ($(systemd-analyze --version | head -n 1)): ${units[*]##*/} pass"
        else
            fail "systemd-analyze verify ${units[*]} fails: $sout"
        fi
    elif [ "${KEYCACHE_CHECK_NEED_ALL:-}" = 1 ]; then
        fail "systemd-analyze is not installed here (systemd was asked for)"
    else
        note "no systemd-analyze here: the installed units are not verified"
    fi

    # --- remove, purge ---------------------------------------------------------------
    if ! out="$(dpkg_retry -r "$pkg" 2>&1)"; then
        printf '%s\n' "$out" >&2
        fail "dpkg -r $pkg failed (output above)"
        return 1
    fi
    if ! out="$(dpkg_retry -P "$pkg" 2>&1)"; then
        printf '%s\n' "$out" >&2
        fail "dpkg -P $pkg failed (output above)"
        return 1
    fi
    installed_by_us=0
    rm -f "$stamp"
    local path left=0
    while IFS= read -r path; do
        if [ -z "$path" ] || [ "$path" = /. ]; then continue; fi
        if [ -L "$path" ] || [ -e "$path" ]; then
            if [ -d "$path" ]; then
                # a directory (or a merged-/usr link to one: /lib) stays
                # when another package has it, or when it holds what is not
                # the package's
                if [ -L "$path" ] || dpkg-query -S "$path" >/dev/null 2>&1 \
                    || dpkg-query -S "$(readlink -f "$path")" >/dev/null 2>&1; then
                    continue
                elif [ -n "$(find "$path" -mindepth 1 -maxdepth 1 | head -n 1)" ]; then
                    note "$path stays after the purge: it holds files that are not the package's ($(find "$path" -mindepth 1 -maxdepth 1 | head -n 3 | tr '\n' ' '))"
                    continue
                fi
                fail "the empty directory $path of the package remains after dpkg -P"
            else
                fail "$path of the package remains after dpkg -P"
            fi
            left=$((left + 1))
        fi
    done <<<"$files"
    status="$(status_of)"
    if [ -n "$(tr -d ' ' <<<"$status")" ] && [ "$status" != "un " ]; then
        fail "after dpkg -P, dpkg-query says '$status' for $pkg"
    fi
    if out="$(dpkg -s "$pkg" 2>&1)"; then
        fail "after dpkg -P, dpkg -s $pkg still succeeds: $(head -n 3 <<<"$out" | tr '\n' ' ')"
    else
        grep -q 'is not installed' <<<"$out" || fail "after dpkg -P, dpkg -s $pkg says: $out"
    fi
    [ "$left" != 0 ] || note "dpkg -r, dpkg -P: none of the $(grep -c . <<<"$files") paths of dpkg -L remains; dpkg -s: not installed"

    if [ "$failures" -gt 0 ]; then
        echo "$me: ${sys_name}: $failures check(s) failed" >&2
        return 1
    fi
    echo "$me: ${sys_name}: ok ($pkg $version installed, used, removed and purged)" >&2
}

if [ "${1:-}" = --inside ]; then
    [ $# = 2 ] || usage
    rc=0
    inside "$2" || rc=$?
    exit "$rc"
fi

# =============================================================================
# The caller's side
# =============================================================================
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    usage
fi
deb="$1"
root="${2:-}"
if [ ! -f "$deb" ]; then
    echo "$me: $deb: no such file" >&2
    exit 2
fi
case "$deb" in
  /*) ;;
  *) deb="$PWD/$deb" ;;
esac
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
self="$repo/tools/check-deb-install.sh"

if [ -z "$root" ]; then
    where="this machine"
    [ "$(id -u)" = 0 ] || skip "not root: dpkg -i needs root"
    command -v dpkg >/dev/null 2>&1 || skip "no dpkg: not a Debian-like machine"
    exec bash "$self" --inside "$deb"
fi

# --- in a Debian root ----------------------------------------------------------
suite="${KEYCACHE_DEBIAN_SUITE:-$(basename "$root")}"
where="Debian $suite root"
[ "$(id -u)" = 0 ] || skip "not root: debootstrap and chroot need root"
rc=0
made="$("$repo/tools/debian-root.sh" "$suite" "$root" bash-completion fish man-db systemd zsh | tail -n 1)" || rc=$?
if [ "$rc" = 3 ]; then
    skip "tools/debian-root.sh cannot make a Debian $suite root here (its message is above)"
elif [ "$rc" != 0 ] || [ -z "$made" ]; then
    echo "$me: tools/debian-root.sh $suite $root failed (status $rc)" >&2
    exit 1
fi
root="$made"
work="$(mktemp -d "$root/tmp/keycache-check-deb-install.XXXXXX")"
# shellcheck disable=SC2317 # the EXIT trap's
cleanup() {
    rm -rf "$work"
    # the inner run's trap purges what it installed; if it was killed
    # before that ran, its stamp is left: purge here
    if [ -f "$root$stamp" ]; then
        echo "$me: $where: the run inside left $pkg installed; purging it" >&2
        "$repo/tools/debian-root.sh" --run "$root" dpkg -P "$pkg" >&2 || true
        rm -f "$root$stamp"
    fi
}
trap cleanup EXIT
cp "$deb" "$work/$(basename "$deb")"
cp "$self" "$work/check-deb-install.sh"
inner="/tmp/${work##*/}"
rc=0
"$repo/tools/debian-root.sh" --run "$root" env KEYCACHE_CHECK_NEED_ALL=1 \
    bash "$inner/check-deb-install.sh" --inside "$inner/$(basename "$deb")" || rc=$?
exit "$rc"
