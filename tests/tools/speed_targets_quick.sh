#!/bin/sh
# bench/speed_targets.sh's verdicts, with a stand-in dtrain and its first-step
# rows (--only first-step): "met" and "NOT met" against the bounds, and
# "disturbed" (the figure printed, not judged) when other processes took the
# CPUs while a row measured. The CPU counters come from DT_STAT_DIR, which the
# stand-in advances as a busy neighbour would; no timing is checked.
# usage: speed_targets_quick.sh SOURCE_DIR
set -u
src=$1
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/speed_targets_quick.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
# the machine's counters (/proc/stat's cpu line: user nice system idle iowait
# irq softirq steal) and the script's own (/proc/PID/stat: cutime and cstime
# are fields 16 and 17, 17 and 18 to awk here: the command name has a space)
printf 'cpu  1000 0 500 90000 0 0 0 0 0 0\n' >"$work/stat"
printf '4242 (speed targets) S 1 2 3 4 5 6 7 8 9 10 11 12 300 40 20 0\n' >"$work/self"
# The stand-in: `info` prints nothing; `bench step` sleeps a moment, adds
# OWN ticks to the machine and to the script's children (its own work) and
# OTHER to the machine alone (a neighbour's), and prints FOM as the first
# step's ratio to the steady state; with FAIL set it fails as a bad run would,
# saying why on stderr.
cat >"$work/dtrain" <<EOF
#!/bin/sh
[ "\$1" = info ] && exit 0
[ -z "\$FAIL" ] || { echo "dtrain bench: \$FAIL" >&2; exit 2; }
sleep 0.3
awk -v d=\$((OWN + OTHER)) '{ \$2 += d; print }' "$work/stat" >"$work/stat.new" && mv "$work/stat.new" "$work/stat"
awk -v d=\$OWN '{ \$17 += d; print }' "$work/self" >"$work/self.new" && mv "$work/self.new" "$work/self"
echo '{"first_over_median":'\$FOM',"page_faults_per_step":0.0}'
EOF
chmod +x "$work/dtrain"
out=$work/out
run() { # OWN OTHER FOM [FAIL [EXPECTED_RC]]
    OWN=$1 OTHER=$2 FOM=$3 FAIL=${4:-} DT_CLI=$work/dtrain DT_STAT_DIR=$work PEER_PYTHON='' \
        "$src/bench/speed_targets.sh" --rounds 1 --only first-step --logs "$work/logs" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ $rc = "${5:-0}" ] || fail "speed_targets.sh exited $rc"
}
verdict() { # row's start, verdict
    grep -q "^$1 .* $2\$" "$out" || grep -q "^$1 .* $2 (" "$out" || fail "'$1' is not '$2'"
}
# quiet: its own work alone, judged
run 1000 0 1.1
verdict "first timed step / steady state" "met"
verdict "page faults a step after the first" "met"
run 1000 0 1.5
verdict "first timed step / steady state" "NOT met"
# a neighbour took the CPUs (many seconds of them in 0.3 s): printed, not judged, and said why
run 1000 100000 1.5
verdict "first timed step / steady state" "disturbed"
verdict "page faults a step after the first" "disturbed"
grep -q "^first timed step / steady state .* 1.500 .*disturbed (other processes took [0-9]*% of the CPUs' time)" "$out" ||
    fail "the disturbed row does not keep its figure and say why"
# the command failed: not "skipped" (which says a peer is missing), but FAILED
# with its own message and the log, and the script exits 1
run 1000 0 1.1 "the model does not fit" 1
verdict "first timed step / steady state" "FAILED"
verdict "page faults a step after the first" "FAILED"
grep -q "^first timed step / steady state .* FAILED (dtrain bench: the model does not fit; the log: $work/logs/" \
    "$out" || fail "the failed row does not give the command's message and its log"
echo "1 passed, 0 failed"
