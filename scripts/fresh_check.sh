#!/usr/bin/env bash
# make fresh-check: the README's promise, checked. Builds a minimal Debian
# bookworm root with debootstrap from the Debian mirror this machine's own apt
# sources name (read now, from /etc/apt/sources.list or the deb822
# /etc/apt/sources.list.d/*.sources), copies a clean clone of the committed
# HEAD into it and runs, inside it through chroot, the README's two commands:
#     make demo DEMO_LIMIT=2000        (a short demo: 2,000 training images)
#     make test SANITIZE=0 FUZZ=0      (the plain suite and the install check)
# Both start with scripts/deps.sh, so a package it forgets fails here. The root
# has nothing but debootstrap's minbase and `make`, the one tool the README
# assumes. The root is bind-mounted on itself (so "/" is a mount point inside
# it), and /proc, /sys, /dev, /dev/pts and /dev/shm are bind-mounted in.
#
# Needs root (debootstrap, chroot, mount) and the network to the mirror; when
# the mirror cannot be reached it fails and says so, it never skips. Works
# under FRESH_CHECK_DIR (default /var/tmp), which it cleans up afterwards,
# also on failure or interrupt: it unmounts first, checks that nothing is
# still mounted there, and only then removes the tree (rm --one-file-system,
# so it could not follow into a mount anyway). The whole log goes to
# build/fresh-check.log; stage lines with times go to stdout too.
# Environment: FRESH_CHECK_DIR, FRESH_CHECK_TIMEOUT (seconds for the commands
# inside the root, default 1500), FRESH_CHECK_KEEP=1 (keep the root, for
# debugging; it is still unmounted).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
suite=bookworm
t0=$(date +%s)
mkdir -p build
log="$src/build/fresh-check.log"
: > "$log"

say() {
  local t=$(( $(date +%s) - t0 ))
  printf 'fresh-check: [%02d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*" | tee -a "$log"
}
die() { say "FAILED: $*"; exit 1; }

[ ! -e /etc/dtrain-fresh-check-root ] || die "this is already a fresh-check root; not nesting another"
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mount); run it as root or with sudo"
for tool in debootstrap git chroot mount umount; do
  command -v "$tool" > /dev/null || die "$tool not found (scripts/deps.sh fresh-check installs it)"
done

# ---- the mirror, from this machine's apt sources ------------------------------------
# Prints "URI SUITE COMPONENTS..." for every enabled deb source of the suite,
# its -updates and its -security, one-line and deb822 formats alike.
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v s="$suite" '
      $1 == "deb" {
        i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if ($(i + 1) == s || $(i + 1) == s "-updates" || $(i + 1) == s "-security") {
          line = $i " " $(i + 1)
          for (j = i + 2; j <= NF && $j !~ /^#/; j++) line = line " " $j
          print line
        }
      }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v s="$suite" '
      BEGIN { RS = ""; FS = "\n" }
      {
        types = ""; uris = ""; suites = ""; comps = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          line = $i
          if (line ~ /^#/) continue
          key = tolower(line); sub(/:.*/, "", key)
          val = line; sub(/^[^:]*:[ \t]*/, "", val)
          if (key == "types") types = val
          else if (key == "uris") uris = val
          else if (key == "suites") suites = val
          else if (key == "components") comps = val
          else if (key == "enabled") enabled = tolower(val)
        }
        if (enabled == "no" || (" " types " ") !~ / deb /) next
        nu = split(uris, u, /[ \t]+/); ns = split(suites, st, /[ \t]+/)
        for (a = 1; a <= nu; a++)
          for (b = 1; b <= ns; b++)
            if (st[b] == s || st[b] == s "-updates" || st[b] == s "-security")
              print u[a] " " st[b] " " comps
      }' "$f"
  done
}
sources=$(apt_sources)
mirror=$(printf '%s\n' "$sources" | awk -v s="$suite" '$2 == s { print $1; exit }')
[ -n "$mirror" ] || die "no Debian '$suite' source in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources: cannot tell which mirror to build the root from"

rev=$(git rev-parse HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  say "note: uncommitted changes are not checked; this checks the committed HEAD $rev"
fi
say "suite $suite from $mirror (this machine's apt sources), HEAD $rev"

# ---- the work tree and its cleanup ----------------------------------------------------
base=${FRESH_CHECK_DIR:-/var/tmp}
work=$(mktemp -d "$base/dtrain-fresh.XXXXXX")
root="$work/root"
mounted=()

mounts_under() { awk -v w="$work" '$2 == w || index($2, w "/") == 1 { print $2 }' /proc/mounts; }

cleanup() {
  local rc=$? p i
  trap - EXIT INT TERM
  # processes still running in the root (a hung test after a timeout)
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
  done
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" 2>/dev/null || true
  done
  local left
  left=$(mounts_under)
  if [ -n "$left" ]; then
    say "cleanup: still mounted, $work left in place: $left"
    [ $rc -ne 0 ] || rc=1
  elif [ "${FRESH_CHECK_KEEP:-0}" = 1 ]; then
    say "kept $work (FRESH_CHECK_KEEP=1)"
  else
    rm -rf --one-file-system "$work"
  fi
  local t=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    say "PASSED in $((t / 60)) min $((t % 60)) s (log: build/fresh-check.log)"
  else
    say "FAILED (exit $rc) after $((t / 60)) min $((t % 60)) s; log: build/fresh-check.log"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the root ----------------------------------------------------------------------------
include=make
case "$mirror" in https:*) include="$include,ca-certificates" ;; esac
say "debootstrap --variant=minbase --include=$include $suite"
if ! debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" >> "$log" 2>&1; then
  tail -n 15 "$log" | sed 's/^/    /'
  if grep -qiE "failed getting release file|couldn't download|unable to connect|could not resolve|connection (refused|timed out)|failed to download|network is unreachable" "$log"; then
    die "the package registry $mirror cannot be reached: the root cannot be built (nothing was checked)"
  fi
  die "debootstrap could not build the $suite root from $mirror (see the lines above)"
fi

# Apt in the root reads the same Debian sources as this machine.
printf '%s\n' "$sources" | awk '{ printf "deb %s", $1; for (i = 2; i <= NF; i++) printf " %s", $i; print "" }' \
  > "$root/etc/apt/sources.list"
# no daemons start inside the root; the marker stops a nested fresh-check
touch "$root/etc/dtrain-fresh-check-root"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

bind() {  # bind SRC: mounts SRC at the same path in the root
  mkdir -p "$root$1"
  mount --bind "$1" "$root$1"
  mounted+=("$root$1")
}
# The root itself a mount point, as a real root is: in a chroot whose "/" is
# a plain directory, mount-namespace work fails with EINVAL (`ip netns exec`
# remounts "/" as a slave, test_shm_small makes "/" private), and the tests
# that need it would skip here.
mount --bind "$root" "$root"
mounted+=("$root")
bind /proc
bind /sys
bind /dev
[ -d /dev/pts ] && bind /dev/pts
bind /dev/shm

# ---- a clean clone of the committed HEAD --------------------------------------------------
mkdir -p "$root/root/dtrain"
git -C "$root/root/dtrain" init -q
git -C "$root/root/dtrain" fetch -q --depth 1 "$src" "$rev"
git -C "$root/root/dtrain" checkout -q --detach FETCH_HEAD
say "cloned $rev into the root"

# ---- the README's two commands ----------------------------------------------------------------
inside() {  # inside TITLE COMMAND: run COMMAND in the clone, in the root, with a bare environment
  local title=$1 cmd=$2 s=$(date +%s) rc=0
  say "$title: $cmd"
  timeout --kill-after=30 "${FRESH_CHECK_TIMEOUT:-1500}" \
    chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      /bin/bash -c "cd ~/dtrain && $cmd" >> "$log" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    tail -n 40 "$log" | sed 's/^/    /'
    [ $rc -eq 124 ] && die "$title: timed out after ${FRESH_CHECK_TIMEOUT:-1500} s"
    die "$title: '$cmd' failed (exit $rc) on a fresh $suite"
  fi
  say "$title: ok in $(( $(date +%s) - s )) s"
}
inside demo "make demo DEMO_LIMIT=2000"
grep -E "test accuracy" "$log" | tail -n 1 | sed 's/^/    /' || true
inside test "make test SANITIZE=0 FUZZ=0"
sed -n '/^== make test: summary/,$p' "$log" | grep -v '^fresh-check:' | sed 's/^/    /'
