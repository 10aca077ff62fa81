#!/bin/sh
# The bench scripts with a dtrain (and a PyTorch) that fail: each names the
# failure and exits non-zero, instead of printing "na", "nan" or an empty
# table and exiting 0 (a failed run is not a figure). No timing is taken:
# the stand-ins fail at once.
# usage: bench_failures.sh SOURCE_DIR
set -u
src=$1
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/bench_failures.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
command -v bash >/dev/null 2>&1 || { echo "SKIP: no bash"; exit 77; }
# the stand-ins: they say why on stderr and exit 2, as dtrain does for bad input
for p in dtrain python; do
    printf '#!/bin/sh\necho "%s: the stand-in fails ($*)" >&2\nexit 2\n' "$p" >"$work/$p"
    chmod +x "$work/$p"
done
out=$work/out
check() { # NAME EXPECTED_MESSAGE (a grep -E pattern) COMMAND...: exit non-zero, the message on its output
    name=$1 msg=$2
    shift 2
    (cd "$src" && "$@") >"$out" 2>&1 </dev/null
    rc=$?
    echo "== $name: exit $rc"
    tail -n 3 "$out"
    [ $rc != 0 ] || fail "$name exited 0 with a failed run"
    grep -Eq "$msg" "$out" || fail "$name does not say '$msg'"
}
export DT_CLI=$work/dtrain
check accuracy_seeds "accuracy_seeds.sh: dtrain failed \(exit 2, seed 0\): dtrain: the stand-in fails" \
    bash bench/accuracy_seeds.sh --no-torch 0
check gpt2_bf16_peer "gpt2_bf16_peer.sh: 2 run\(s\) failed" \
    env PEER_PYTHON="$work/python" bash bench/gpt2_bf16_peer.sh --rounds 1 --steps 1 --batch 1 --seq 16 --no-eager
check scripts/bench.sh "bench.sh: failed \(exit 2\): $work/dtrain bench matmul" \
    env DT_BENCH_OUT="$work/bench.jsonl" bash scripts/bench.sh
if [ -x /usr/bin/time ]; then # GNU time: both scripts run dtrain under it
    check trace_overhead "trace_overhead.sh: the run with the trace off failed \(round 1\)" sh bench/trace_overhead.sh 1
    : >"$work/tokens.bin"
    check pipe_memory "pipe_memory.sh: $work/dtrain at pp 1 failed \(exit 2\)" \
        env DATA="$work/tokens.bin" PPS=1 ROUNDS=1 bash bench/pipe_memory.sh "$work/dtrain"
else
    echo "(no /usr/bin/time: trace_overhead.sh and pipe_memory.sh not checked)"
fi
# bad arguments: exit 2 naming them, before anything runs
check trace_overhead_rounds "ROUNDS wants a positive count, got 'x'" sh bench/trace_overhead.sh x
echo "1 passed, 0 failed"
