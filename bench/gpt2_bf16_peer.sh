#!/bin/sh
# bench/gpt2_bf16_peer.sh — the bf16 (or f32) GPT-2 124M training step
# against PyTorch's strongest CPU recipe, interleaved and repeated.
#
#   PEER_PYTHON=... bench/gpt2_bf16_peer.sh [options]
#
# Each round runs, back to back, in an order rotated every round:
#   dtrain   DT_CLI bench step --model M --batch B --seq T --precision P
#            --threads N (AdamW; prepared, auto warm-up unless --warmup)
#   base     the same with DT_BASE_CLI (only when DT_BASE_CLI is set: an older
#            build to compare against in the same rounds)
#   eager    $PEER_PYTHON bench/torch_gpt2_step.py --bf16 --fused-adamw
#            (autocast bf16, SDPA attention, fused AdamW, eager; without
#            --bf16 for --precision fp32: f32 throughout)
#   compile  the same with --compile (torch.compile; its warm-up covers the
#            compilation, --peer-warmup, default 3)
# with the same B, T and threads. It prints per case the median over the rounds
# of the step's wall time (median_ms), of its process CPU time (cpu_ms) and
# of the process's peak RSS (peak_rss_mib), then the median of the rounds' ratios dtrain/compile and dtrain/eager (and
# dtrain/base) with their spread (below 1: dtrain is faster). On a shared
# machine the cpu_ms ratio moves least with other processes' load.
#
# Options: --rounds R (3)  --steps S timed steps per run (3)  --warmup W dtrain's
#   (default auto)  --peer-warmup W (3)  --batch B (8)  --seq T (256)  --threads N (2)
#   --model gpt2|gpt2-medium (gpt2: 124M; gpt2-medium: 350M, for dtrain and the peer alike)
#   --precision bf16|fp32 (bf16; fp32: both sides in f32, the precision --precision auto picks on CPUs
#   without AVX512_BF16 or AMX)
#   --no-eager (skip the eager peer)  --logs DIR (keep every run's JSON line there)
# Environment: DT_CLI (build/dtrain), DT_BASE_CLI (unset), PEER_PYTHON (required).
set -eu
cd "$(dirname "$0")/.."
rounds=3 steps=3 warmup=auto pwarm=3 batch=8 seq=256 threads=2 eager=1 logs='' model=gpt2 prec=bf16
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'; exit 0 ;;
        --no-eager) eager=0; shift ;;
        --model)
            [ $# -ge 2 ] || { echo "gpt2_bf16_peer.sh: $1 needs a value" >&2; exit 2; }
            case $2 in gpt2|gpt2-medium) model=$2 ;; *) echo "gpt2_bf16_peer.sh: --model gpt2 or gpt2-medium, not '$2'" >&2; exit 2 ;; esac
            shift 2 ;;
        --precision)
            [ $# -ge 2 ] || { echo "gpt2_bf16_peer.sh: $1 needs a value" >&2; exit 2; }
            case $2 in bf16|fp32) prec=$2 ;; *) echo "gpt2_bf16_peer.sh: --precision bf16 or fp32, not '$2'" >&2; exit 2 ;; esac
            shift 2 ;;
        --rounds|--steps|--warmup|--peer-warmup|--batch|--seq|--threads|--logs)
            [ $# -ge 2 ] || { echo "gpt2_bf16_peer.sh: $1 needs a value" >&2; exit 2; }
            case $1 in
                --rounds) rounds=$2 ;; --steps) steps=$2 ;; --warmup) warmup=$2 ;;
                --peer-warmup) pwarm=$2 ;; --batch) batch=$2 ;; --seq) seq=$2 ;;
                --threads) threads=$2 ;; --logs) logs=$2 ;;
            esac
            shift 2 ;;
        *) echo "gpt2_bf16_peer.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$rounds" "$steps" "$pwarm" "$batch" "$seq" "$threads"; do
    case $v in ''|*[!0-9]*|0) echo "gpt2_bf16_peer.sh: '$v' is not a positive count" >&2; exit 2 ;; esac
done
cli=${DT_CLI:-build/dtrain}
[ -x "$cli" ] || { echo "gpt2_bf16_peer.sh: no dtrain at '$cli' (make build, or set DT_CLI)" >&2; exit 2; }
[ -n "${PEER_PYTHON:-}" ] || { echo "gpt2_bf16_peer.sh: set PEER_PYTHON to a python with torch >= 2.4" >&2; exit 2; }
base=${DT_BASE_CLI:-}
[ -z "$base" ] || [ -x "$base" ] || { echo "gpt2_bf16_peer.sh: DT_BASE_CLI '$base' is not a program" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-gpt2peer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
[ -z "$logs" ] || mkdir -p "$logs"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}"

cases="dtrain"
[ -n "$base" ] && cases="$cases base"
[ "$eager" = 1 ] && cases="$cases eager"
cases="$cases compile"

# run CASE ROUND: one run, appends "round median_ms cpu_ms" to $tmp/CASE
run() {
    c=$1 r=$2 out=$tmp/$1.$2.json
    case $c in
        dtrain|base)
            bin=$cli; [ "$c" = base ] && bin=$base
            "$bin" bench step --model "$model" --batch "$batch" --seq "$seq" --precision "$prec" --threads "$threads" \
                --steps "$steps" --warmup "$warmup" --peak-reps 0 --json >"$out" 2>"$out.err" || true ;;
        eager|compile)
            fl=; [ "$c" = compile ] && fl=--compile
            [ "$prec" = bf16 ] && fl="$fl --bf16"
            # shellcheck disable=SC2086
            "$PEER_PYTHON" bench/torch_gpt2_step.py --fused-adamw --model "$model" $fl --batch "$batch" --seq "$seq" \
                --threads "$threads" --steps "$steps" --warmup "$pwarm" --json >"$out" 2>"$out.err" || true ;;
    esac
    ms=$(sed -n 's/.*"median_ms": *\([0-9.]*\).*/\1/p' "$out" | head -n 1)
    cpu=$(sed -n 's/.*"cpu_ms": *\([0-9.]*\).*/\1/p' "$out" | head -n 1)
    rss=$(sed -n 's/.*"peak_rss_mib": *\([0-9.]*\).*/\1/p' "$out" | head -n 1)
    wait=$(sed -n 's/.*"omp_wait": *"\([^"]*\)".*/ omp_wait \1/p' "$out" | head -n 1) # dtrain's OpenMP waiting
    [ -z "$logs" ] || cp "$out" "$logs/$c.$r.json"
    echo "$r ${ms:-na} ${cpu:-na} ${rss:-na}" >>"$tmp/$c"
    echo "# round $r/$rounds $c: median_ms ${ms:-n/a} cpu_ms ${cpu:-n/a} peak_rss_mib ${rss:-n/a}$wait (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    [ -n "$ms" ] || { echo "# $c failed; its stderr:" >&2; tail -n 5 "$out.err" >&2; failed=$((failed + 1)); }
}
failed=0

r=1
while [ "$r" -le "$rounds" ]; do
    order=$cases
    # rotate the order by r - 1 places
    i=1
    while [ "$i" -lt "$r" ]; do order="$(echo "$order" | cut -d' ' -f2-) $(echo "$order" | cut -d' ' -f1)"; i=$((i + 1)); done
    for c in $order; do run "$c" "$r"; done
    r=$((r + 1))
done

med() { sort -g | awk '{a[NR]=$1} END{if (NR==0) print "na"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
echo "# bench/gpt2_bf16_peer.sh: $model $prec, B=$batch T=$seq, $threads threads, $rounds round(s) of $steps steps, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %12s %12s %13s\n' case median_ms cpu_ms peak_rss_mib
for c in $cases; do
    printf '%-8s %12s %12s %13s\n' "$c" "$(awk '$2!="na"{print $2}' "$tmp/$c" | med)" "$(awk '$3!="na"{print $3}' "$tmp/$c" | med)" \
        "$(awk '$4!="na"{print $4}' "$tmp/$c" | med)"
done
# ratio A B COL: median and spread of the per-round ratios A/B in column COL
ratio() {
    join "$tmp/$1" "$tmp/$2" | awk -v c="$3" '{a=$c; b=$(c+3); if (a!="na" && b!="na" && b>0) print a/b}' >"$tmp/ratio"
    m=$(med <"$tmp/ratio")
    lo=$(sort -g "$tmp/ratio" | head -n 1) hi=$(sort -g "$tmp/ratio" | tail -n 1)
    printf '%-18s %-9s %7s  %s-%s\n' "$1/$2" "$4" "$m" "${lo:-na}" "${hi:-na}"
}
printf '%-18s %-9s %7s  %s\n' ratio metric median spread
for p in compile eager base; do
    case " $cases " in *" $p "*) ratio dtrain "$p" 2 median_ms; ratio dtrain "$p" 3 cpu_ms ;; esac
done
# a run that failed leaves its case's figures short: say so, and exit 1
[ "$failed" = 0 ] || { echo "gpt2_bf16_peer.sh: $failed run(s) failed (their stderr above)" >&2; exit 1; }
