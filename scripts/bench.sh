#!/usr/bin/env bash
# Runs the benchmark suites and prints their results (JSON lines in
# build/bench.jsonl). Figures for docs/BENCHMARKS.md come from here.
# DT_CLI: the dtrain program (default build/dtrain); DT_BENCH_OUT: the JSON
# lines file (default build/bench.jsonl). A suite that fails is
# named on stderr, the others still run, and the script exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
d=${DT_CLI:-build/dtrain}
out=${DT_BENCH_OUT:-build/bench.jsonl}
: > "$out"
failed=0
run() { # each suite runs even when one before failed; a failure is named, and the script exits 1
    echo "+ $*"
    "$@" | tee -a "$out" || { echo "bench.sh: failed (exit ${PIPESTATUS[0]}): $*" >&2; failed=1; }
}
run $d bench matmul --json
run $d bench step --model convnet --batch 100 --json
run $d bench step --model mlp --batch 4 --json
run $d run -n 2 -- $d bench coll --op allreduce --min 8 --max 256M --json
echo "results in $out"
exit $failed
