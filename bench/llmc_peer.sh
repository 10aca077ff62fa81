#!/bin/sh
# bench/llmc_peer.sh — the f32 GPT-2 124M training step (B=4, T=64, AdamW)
# against llm.c's train_gpt2.c, interleaved and repeated.
#
#   LLMC_SRC=DIR bench/llmc_peer.sh [options]
#
# LLMC_SRC is a checkout of llm.c (github.com/karpathy/llm.c: train_gpt2.c and
# llmc/). Nothing of it is kept in dtrain. The script copies those files into a
# temporary directory and builds train_gpt2 there with llm.c's own flags
# (-Ofast -march=native -fopenmp), with its step loop cut to --peer-steps.
# It writes gpt2_124M.bin in llm.c's format (header 20240326 version 3; GPT-2
# 124M, padded vocabulary 50304) with random weights (normal, std 0.02; layer
# norms 1 and 0) and token files of random tokens, so nothing is downloaded.
# train_gpt2.c's batch is fixed at B=4, T=64, so dtrain runs the same.
#
# Each round runs, back to back, the order swapped every round:
#   dtrain  DT_CLI bench step --model gpt2 --batch 4 --seq 64 --threads N
#           --steps S --peak-reps 3 (AdamW, f32; its median step, and the step's
#           share of the f32 GEMM peak measured in the same run)
#   llmc    OMP_NUM_THREADS=N train_gpt2 (the median of its "took X ms" lines
#           from step 2 on; steps 0 and 1 warm up)
# It prints per case the median over the rounds, then the median of the
# rounds' ratios dtrain/llmc with their spread (below 1: dtrain is faster).
#
# Options: --rounds R (3)  --steps S dtrain's timed steps (5)  --peer-steps P
#   llm.c's steps, at least 3 (8)  --threads N (2)
# Environment: LLMC_SRC (required), DT_CLI (build/dtrain), PYTHON (python3,
#   with numpy: writes the model and token files), CC (cc).
set -eu
cd "$(dirname "$0")/.."
rounds=3 steps=5 psteps=8 threads=2
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'; exit 0 ;;
        --rounds|--steps|--peer-steps|--threads)
            [ $# -ge 2 ] || { echo "llmc_peer.sh: $1 needs a value" >&2; exit 2; }
            case $1 in
                --rounds) rounds=$2 ;; --steps) steps=$2 ;; --peer-steps) psteps=$2 ;; --threads) threads=$2 ;;
            esac
            shift 2 ;;
        *) echo "llmc_peer.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$rounds" "$steps" "$psteps" "$threads"; do
    case $v in ''|*[!0-9]*|0) echo "llmc_peer.sh: '$v' is not a positive count" >&2; exit 2 ;; esac
done
[ "$psteps" -ge 3 ] || { echo "llmc_peer.sh: --peer-steps must be at least 3 (steps 0 and 1 warm up)" >&2; exit 2; }
cli=${DT_CLI:-build/dtrain}
[ -x "$cli" ] || { echo "llmc_peer.sh: no dtrain at '$cli' (make build, or set DT_CLI)" >&2; exit 2; }
src=${LLMC_SRC:-}
[ -n "$src" ] || { echo "llmc_peer.sh: set LLMC_SRC to a checkout of llm.c" >&2; exit 2; }
[ -f "$src/train_gpt2.c" ] && [ -d "$src/llmc" ] ||
    { echo "llmc_peer.sh: '$src' holds no train_gpt2.c and llmc/ (LLMC_SRC: a checkout of llm.c)" >&2; exit 2; }
py=${PYTHON:-python3}
"$py" -c 'import numpy' 2>/dev/null || { echo "llmc_peer.sh: '$py' has no numpy (set PYTHON)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-llmc.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}"

# llm.c, built as its Makefile builds train_gpt2 on a CPU with OpenMP.
mkdir "$tmp/peer" "$tmp/peer/dev" "$tmp/peer/dev/data" "$tmp/peer/dev/data/tinyshakespeare"
cp -R "$src/llmc" "$tmp/peer/llmc"
grep -q 'step <= 40;' "$src/train_gpt2.c" ||
    { echo "llmc_peer.sh: train_gpt2.c's step loop is not 'step <= 40;' (a version this script does not know)" >&2; exit 2; }
sed "s/step <= 40;/step < $psteps;/" "$src/train_gpt2.c" >"$tmp/peer/train_gpt2.c"
(cd "$tmp/peer" && ${CC:-cc} -Ofast -Wno-unused-result -march=native -fopenmp -DOMP -I. train_gpt2.c -lm \
    -o train_gpt2) >"$tmp/build.log" 2>&1 || { echo "llmc_peer.sh: building train_gpt2 failed:" >&2; tail -n 20 "$tmp/build.log" >&2; exit 1; }
"$py" - "$tmp/peer" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
maxT, V, L, NH, C, Vp = 1024, 50257, 12, 12, 768, 50304
head = np.zeros(256, np.int32); head[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
rng = np.random.default_rng(0)
def normal(n): return (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02))
# llm.c's parameter order (fill_in_parameter_sizes)
parts = [normal(Vp * C), normal(maxT * C), np.ones(L * C, np.float32), np.zeros(L * C, np.float32),
         normal(L * 3 * C * C), np.zeros(L * 3 * C, np.float32), normal(L * C * C), np.zeros(L * C, np.float32),
         np.ones(L * C, np.float32), np.zeros(L * C, np.float32), normal(L * 4 * C * C),
         np.zeros(L * 4 * C, np.float32), normal(L * C * 4 * C), np.zeros(L * C, np.float32),
         np.ones(C, np.float32), np.zeros(C, np.float32)]
with open(d + "/gpt2_124M.bin", "wb") as f:
    head.tofile(f)
    for p in parts: p.tofile(f)
for name, n in (("train", 200000), ("val", 20000)):
    th = np.zeros(256, np.int32); th[:3] = [20240520, 1, n]
    with open(d + "/dev/data/tinyshakespeare/tiny_shakespeare_%s.bin" % name, "wb") as f:
        th.tofile(f); rng.integers(0, V, n, dtype=np.uint16).tofile(f)
EOF

med() { sort -g | awk '{a[NR]=$1} END{if (NR==0) print "na"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# run CASE ROUND: one run, appends "round ms" to $tmp/CASE
run() {
    c=$1 r=$2 out=$tmp/$1.$2.out ms='' pct=''
    case $c in
        dtrain)
            "$cli" bench step --model gpt2 --batch 4 --seq 64 --threads "$threads" --steps "$steps" --peak-reps 3 \
                --json >"$out" 2>"$out.err" || true
            ms=$(sed -n 's/.*"median_ms": *\([0-9.]*\).*/\1/p' "$out" | head -n 1)
            pct=$(sed -n 's/.*"pct_of_peak": *\([0-9.]*\).*/\1/p' "$out" | head -n 1)
            [ -z "$pct" ] || echo "$r $pct" >>"$tmp/pct" ;;
        llmc)
            (cd "$tmp/peer" && OMP_NUM_THREADS=$threads ./train_gpt2) >"$out" 2>"$out.err" || true
            ms=$(sed -n 's/^step \([0-9]*\): .*(took \([0-9.]*\) ms).*/\1 \2/p' "$out" | awk '$1 >= 2 {print $2}' | med) ;;
    esac
    [ "$ms" = na ] && ms=''
    echo "$r ${ms:-na}" >>"$tmp/$c"
    echo "# round $r/$rounds $c: median_ms ${ms:-n/a}${pct:+ pct_of_peak $pct} (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    [ -n "$ms" ] || { echo "# $c failed; its output:" >&2; tail -n 5 "$out" "$out.err" >&2; failed=$((failed + 1)); }
}
failed=0

r=1
while [ "$r" -le "$rounds" ]; do
    if [ $((r % 2)) = 1 ]; then run dtrain "$r"; run llmc "$r"; else run llmc "$r"; run dtrain "$r"; fi
    r=$((r + 1))
done

echo "# bench/llmc_peer.sh: GPT-2 124M f32, B=4 T=64, AdamW, $threads threads, $rounds round(s), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %12s\n' case median_ms
for c in dtrain llmc; do printf '%-8s %12s\n' "$c" "$(awk '$2!="na"{print $2}' "$tmp/$c" | med)"; done
[ ! -f "$tmp/pct" ] || printf 'dtrain pct_of_peak (f32 GEMM peak, same run): %s\n' "$(awk '{print $2}' "$tmp/pct" | med)"
join "$tmp/dtrain" "$tmp/llmc" | awk '$2!="na" && $3!="na" && $3>0 {print $2/$3}' >"$tmp/ratio"
lo=$(sort -g "$tmp/ratio" | head -n 1) hi=$(sort -g "$tmp/ratio" | tail -n 1)
printf 'dtrain/llmc median_ms %s  %s-%s\n' "$(med <"$tmp/ratio")" "${lo:-na}" "${hi:-na}"
# a run that failed leaves its case's figures short: say so, and exit 1
[ "$failed" = 0 ] || { echo "llmc_peer.sh: $failed run(s) failed (their output above)" >&2; exit 1; }
