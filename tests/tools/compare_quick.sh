#!/bin/sh
# bench/compare.sh in its quick mode on HEAD against HEAD (one build, a
# Debug one: a third of a Release build's time; one round, tiny sizes): the
# header names both commits and the build type, every workload gets a
# line "name base head unit ratio lo-hi" with numbers, and bad arguments exit
# 2. Skipped (77) without git history to build from (not a checkout, a
# shallow clone, git or cmake missing). Timings are not checked.
# usage: compare_quick.sh SOURCE_DIR WORK_DIR
set -u
src=$1 work=$2
command -v git >/dev/null 2>&1 && command -v cmake >/dev/null 2>&1 || { echo "no git or cmake: skipped"; exit 77; }
git -C "$src" rev-parse --verify --quiet 'HEAD^{commit}' >/dev/null 2>&1 ||
    { echo "$src has no git history: skipped"; exit 77; }
[ "$(git -C "$src" rev-parse --is-shallow-repository 2>/dev/null)" = true ] &&
    { echo "$src is a shallow clone: skipped"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
out=$work/compare_quick.out
rm -rf "$work" && mkdir -p "$work"
DT_COMPARE_DIR=$work/builds "$src/bench/compare.sh" --quick --build-type Debug \
    --workloads convnet,mlp,gpt2-f32,allreduce,llama-bf16,gpt2-bf16-b8 HEAD HEAD >"$out" 2>"$work/compare_quick.err"
rc=$?
cat "$out"
[ $rc = 0 ] || { tail -n 30 "$work/compare_quick.err"; fail "compare.sh exited $rc"; }
h=$(git -C "$src" rev-parse HEAD | cut -c1-12)
grep -q "^# bench/compare.sh: base $h head $h, 1 round(s), quick sizes, Debug builds (figures meaningless)," "$out" ||
    fail "header"
[ -x "$work/builds/$(git -C "$src" rev-parse HEAD)-Debug/build/dtrain" ] || fail "no Debug build in <commit>-Debug"
grep -q '^workload  *base  *head  *unit  *ratio  *spread$' "$out" || fail "column header"
for w in convnet mlp gpt2-f32 allreduce llama-bf16 gpt2-bf16-b8; do
    grep -Eq "^$w +[0-9]+\.[0-9]{3} +[0-9]+\.[0-9]{3} +(ms|us) +[0-9]+\.[0-9]{3}  [0-9]+\.[0-9]{3}-[0-9]+\.[0-9]{3}$" "$out" ||
        fail "no well-formed line for $w"
done
[ "$(grep -c '^[a-z]' "$out")" = 7 ] || fail "expected 6 workload lines and the column header"
# one round: the spread is the ratio itself
awk '/^(convnet|mlp|gpt2-f32|allreduce|llama-bf16|gpt2-bf16-b8) / { split($6, s, "-"); if (s[1] != $5 || s[2] != $5) exit 1 }' "$out" ||
    fail "a one-round spread differs from its ratio"
# the build is kept: a second run reuses it (no "# building" line)
DT_COMPARE_DIR=$work/builds "$src/bench/compare.sh" --quick --build-type Debug --workloads mlp HEAD HEAD \
    >"$out" 2>"$work/compare_quick.err" || fail "second run"
grep -q '# building' "$work/compare_quick.err" && fail "the second run rebuilt the commit"
# bad input: exit 2 with a message naming it
for args in "--rounds x HEAD" "--workloads resnet HEAD" "--metric p99 HEAD" "--build-type fast HEAD" \
    "no-such-commit-xyz" "--bogus HEAD"; do
    # shellcheck disable=SC2086
    DT_COMPARE_DIR=$work/builds "$src/bench/compare.sh" $args >/dev/null 2>"$work/bad.err"
    r=$?
    [ $r = 2 ] || fail "'$args' exited $r, not 2"
    [ -s "$work/bad.err" ] || fail "'$args' printed no error"
done
echo "PASS"
