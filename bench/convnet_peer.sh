#!/bin/sh
# bench/convnet_peer.sh — the ConvNet training step (batch 100, f32, SGD)
# against PyTorch 1.13 and PyTorch 2.x, interleaved and repeated.
#
#   [PEER_PYTHON=...] [TORCH113_PYTHON=...] bench/convnet_peer.sh [options]
#
# Each round runs, back to back, in an order rotated every round:
#   dtrain   DT_CLI bench step --model convnet --batch B --threads N
#            --steps S --peak-reps 0 --json
#   t113     OPENBLAS_NUM_THREADS=1 $TORCH113_PYTHON bench/torch_step.py
#            --model convnet --threads N --steps S --json   (PyTorch 1.13)
#   t2       the same with $PEER_PYTHON (PyTorch 2.x; left out when unset)
# It prints per case the median over the rounds of the step's wall time
# (median_ms) and of its process CPU time (cpu_ms), then the median of the
# rounds' ratios dtrain/t113 and dtrain/t2 with their spread (below 1:
# dtrain is faster). On a shared machine cpu_ms moves least with other
# processes' load; the script prints the load average before and after.
#
# OpenMP waiting: dtrain picks its waiting policy from the machine's load
# when it starts (cores free for its threads: GOMP_SPINCOUNT=10000, a short
# spin; busier: OMP_WAIT_POLICY=passive, which costs the ConvNet step 10-25%
# on an idle machine: every parallel region pays a wake-up). In a run of rounds the
# peers' own runs raise the load average, so without a pin the first round
# can run spinning and the later ones passive. --omp-wait chooses it once for
# every dtrain run of the script: auto (default: what dtrain chooses at the
# script's start, asked of `dtrain info`), spin (dtrain's idle default, asked
# of `DT_LOADAVG=0 dtrain info`) or passive. The peers run
# with their runtime's defaults (a full spin), as a user would run them;
# --wait-all gives them dtrain's pinned policy too (on a busy machine the
# full spin collapses: PyTorch's step runs tens of times slower, and the
# ratios then say nothing). An OMP_WAIT_POLICY or GOMP_SPINCOUNT already in
# the environment is kept for every run.
#
# Options: --rounds R (5)  --steps S timed steps per run (40)  --batch B (100)
#   --threads N (2)  --omp-wait auto|spin|passive  --wait-all  --logs DIR (keep every
#   run's JSON line there)
# Environment: DT_CLI (build/dtrain), TORCH113_PYTHON (python3),
#   PEER_PYTHON (unset: no t2 column).
set -eu
cd "$(dirname "$0")/.."
rounds=5 steps=40 batch=100 threads=2 wait=auto logs= waitall=0
while [ $# -gt 0 ]; do
    case $1 in
    --wait-all) waitall=1; shift ;;
    --rounds | --steps | --batch | --threads | --omp-wait | --logs)
        [ $# -ge 2 ] || { echo "convnet_peer.sh: $1 needs a value" >&2; exit 2; }
        case $1 in
        --rounds) rounds=$2 ;; --steps) steps=$2 ;; --batch) batch=$2 ;;
        --threads) threads=$2 ;; --omp-wait) wait=$2 ;; --logs) logs=$2 ;;
        esac
        shift 2 ;;
    -h | --help) sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "convnet_peer.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$rounds" "$steps" "$batch" "$threads"; do
    case $v in '' | *[!0-9]* | 0*) echo "convnet_peer.sh: counts are positive integers, got '$v'" >&2; exit 2 ;; esac
done
[ "$batch" = 100 ] || echo "note: bench/torch_step.py always runs batch 100; --batch $batch changes dtrain's only" >&2
cli=${DT_CLI:-build/dtrain}
t113=${TORCH113_PYTHON:-python3}
[ -x "$cli" ] || { echo "convnet_peer.sh: no dtrain CLI at $cli (make build, or set DT_CLI)" >&2; exit 2; }
"$t113" -c 'import torch' 2>/dev/null || { echo "convnet_peer.sh: $t113 has no torch (set TORCH113_PYTHON)" >&2; exit 2; }
cases="dtrain t113"
if [ -n "${PEER_PYTHON:-}" ]; then
    "$PEER_PYTHON" -c 'import torch' 2>/dev/null || { echo "convnet_peer.sh: PEER_PYTHON $PEER_PYTHON has no torch" >&2; exit 2; }
    cases="$cases t2"
fi
load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
if [ -n "${OMP_WAIT_POLICY:-}${GOMP_SPINCOUNT:-}" ]; then
    wenv="" wdesc="from the environment: OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-}"
else
    if [ "$wait" = auto ]; then # dtrain's own choice now (dtrain info: its rule, the load and the runnable tasks)
        wait=$("$cli" info 2>/dev/null | sed -n 's/^OpenMP waiting: GOMP_SPINCOUNT=.*/spin/p; s/^OpenMP waiting: passive.*/passive/p')
        wait=${wait:-passive}
        wdesc="auto at load $(load | cut -d' ' -f1): "
    else
        wdesc=""
    fi
    case $wait in
    spin) wenv=$(DT_LOADAVG=0 "$cli" info 2>/dev/null | sed -n 's/^OpenMP waiting: \(GOMP_SPINCOUNT=[0-9]*\) .*/\1/p')
        [ -n "$wenv" ] || { echo "convnet_peer.sh: dtrain info did not say its idle spin" >&2; exit 2; } ;;
    passive) wenv="OMP_WAIT_POLICY=passive" ;;
    *) echo "convnet_peer.sh: --omp-wait auto, spin or passive, got '$wait'" >&2; exit 2 ;;
    esac
    wdesc="$wdesc$wenv"
fi
penv=
if [ $waitall = 1 ]; then penv=$wenv; wdesc="$wdesc (the peers too)"; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -z "$logs" ] || mkdir -p "$logs"

run_case() { # case round
    case $1 in
    dtrain) env $wenv "$cli" bench step --model convnet --batch "$batch" --threads "$threads" --steps "$steps" \
        --peak-reps 0 --json ;;
    t113) env $penv OPENBLAS_NUM_THREADS=1 "$t113" bench/torch_step.py --model convnet --threads "$threads" \
        --steps "$steps" --json ;;
    t2) env $penv OPENBLAS_NUM_THREADS=1 "$PEER_PYTHON" bench/torch_step.py --model convnet --threads "$threads" \
        --steps "$steps" --json ;;
    esac
}
field() { sed -n "s/.*\"$1\": *\([0-9.eE+-]*\).*/\1/p" | head -n 1; }

echo "convnet step: batch $batch, $threads threads, $steps steps, $rounds rounds; dtrain waiting: $wdesc"
echo "load before: $(load)"
r=1
while [ "$r" -le "$rounds" ]; do
    set -- $cases
    i=1
    while [ "$i" -lt "$r" ]; do set -- "$@" "$1"; shift; i=$((i + 1)); done # rotate the order
    for c in "$@"; do
        out=$(run_case "$c" 2>"$tmp/err") || { echo "convnet_peer.sh: $c failed in round $r:" >&2; cat "$tmp/err" >&2; exit 1; }
        line=$(printf '%s\n' "$out" | grep '"median_ms"' | tail -n 1)
        [ -n "$line" ] || { echo "convnet_peer.sh: $c printed no result in round $r" >&2; exit 1; }
        [ -z "$logs" ] || printf '%s\n' "$line" >>"$logs/$c.jsonl"
        printf '%s\n' "$line" | field median_ms >>"$tmp/$c.ms"
        printf '%s\n' "$line" | field cpu_ms >>"$tmp/$c.cpu"
        printf '%s %s\n' "$r" "$(printf '%s\n' "$line" | field median_ms)" >>"$tmp/$c.round"
    done
    r=$((r + 1))
done
echo "load after: $(load)"

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "?"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '%-8s %12s %12s   %s\n' case median_ms cpu_ms per-round_ms
for c in $cases; do
    printf '%-8s %12s %12s   %s\n' "$c" "$(median <"$tmp/$c.ms")" "$(median <"$tmp/$c.cpu")" \
        "$(awk '{printf "%s ", $2}' "$tmp/$c.round")"
done
for p in t113 t2; do
    [ -f "$tmp/$p.round" ] || continue
    join "$tmp/dtrain.round" "$tmp/$p.round" | awk '{printf "%.4f\n", $2 / $3}' >"$tmp/ratio.$p"
    printf 'dtrain/%-5s ratio (median of rounds) %s  spread %s-%s\n' "$p" "$(median <"$tmp/ratio.$p")" \
        "$(sort -g "$tmp/ratio.$p" | head -n 1)" "$(sort -g "$tmp/ratio.$p" | tail -n 1)"
done
