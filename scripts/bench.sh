#!/usr/bin/env bash
# Runs the benchmark suites and prints their results (JSON lines in
# build/bench.jsonl). Figures for docs/BENCHMARKS.md come from here.
set -uo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
d=build/dtrain
out=build/bench.jsonl
: > "$out"
run() { echo "+ $*"; "$@" | tee -a "$out"; }
run $d bench matmul --json
run $d bench step --model convnet --batch 100 --json
run $d bench step --model mlp --batch 4 --json
run $d run -n 2 -- $d bench coll --op allreduce --min 8 --max 256M --json
echo "results in $out"
