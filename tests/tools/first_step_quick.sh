#!/bin/sh
# bench/first_step.sh on gpt-micro, the build's dtrain against itself as the
# base, two rounds: every round line and the medians with the ratio are
# there with numbers; a dtrain that fails is named (exit 1); bad options
# and a base that is no program exit 2. Timings are not checked.
# usage: first_step_quick.sh SOURCE_DIR DTRAIN
set -u
src=$1 dt=$2
command -v python3 >/dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/first_step_quick.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
out=$work/out
DT_CLI=$dt DT_BASE_CLI=$dt PEER_PYTHON= "$src/bench/first_step.sh" --rounds 2 --model gpt-micro --batch 2 --seq 16 \
    --threads 1 >"$out" 2>"$work/err"
rc=$?
cat "$out" "$work/err"
[ $rc = 0 ] || fail "first_step.sh exited $rc"
grep -q '^# bench/first_step.sh: gpt-micro B=2 T=16 threads 1, 2 round(s), ' "$out" || fail "header"
for r in 1 2; do
    grep -Eq "^round $r: dtrain [0-9.]+ s \(step [0-9.]+ s\); base [0-9.]+ s \(step [0-9.]+ s\)$" "$out" ||
        fail "round $r's line"
done
grep -Eq '^median: dtrain [0-9.]+ s to the first step done$' "$out" || fail "dtrain's median"
grep -Eq '^median: base [0-9.]+ s; dtrain / base [0-9]+\.[0-9]{3}$' "$out" || fail "the base's median and ratio"
# a dtrain that prints no first step: named, exit 1
printf '#!/bin/sh\necho "dtrain train: something went wrong" >&2\nexit 2\n' >"$work/bad"
chmod +x "$work/bad"
DT_CLI=$work/bad "$src/bench/first_step.sh" --rounds 1 --model gpt-micro >"$out" 2>&1
rc=$?
[ $rc = 1 ] || fail "a failing dtrain: exit $rc, want 1"
grep -q "printed no 'first step done' line" "$out" && grep -q 'something went wrong' "$out" ||
    fail "a failing dtrain is not named with its output"
for bad in "--rounds 0" "--model gpt3" "--batch x" "--frobnicate"; do
    # shellcheck disable=SC2086
    DT_CLI=$dt "$src/bench/first_step.sh" $bad >/dev/null 2>&1
    rc=$?
    [ $rc = 2 ] || fail "'$bad': exit $rc, want 2"
done
DT_CLI=$dt DT_BASE_CLI=$work/nonexistent "$src/bench/first_step.sh" --rounds 1 >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || fail "a base that is no program: exit $rc, want 2"
echo "first_step_quick: ok"
