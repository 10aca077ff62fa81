#!/bin/sh
# bench/onednn_matmul.sh — GPT-2's per-layer GEMMs through oneDNN 2.x (the
# system's libdnnl), oneDNN 3.x (a prefix given here) and dtrain's own GEMM
# path (dt_k_matmul), interleaved, with medians.
#
#   DT_ONEDNN3_PREFIX=DIR bench/onednn_matmul.sh [--rounds 3] [--reps 3] [--threads 2] [--wait POLICY]
#                                                [--types f32,bf16,bf16o] [--only NAME] [--build DIR]
#                                                [--rows 2048] [--embd 768] [--vocab 50304] [--layers 12]
#
# DIR holds include/oneapi/dnnl/dnnl.h and lib/libdnnl.so.3 of a oneDNN 3.x,
# e.g. Intel's PyPI wheels onednn-cpu-gomp and onednn-devel-cpu-gomp
# 2023.2.0 (oneDNN 3.2) unpacked into one folder:
#   pip download onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0 --no-deps -d W
#   for w in W/*.whl; do unzip -qo "$w" -d W/x; done
#   mkdir -p DIR && cp -r W/x/*.data/data/include W/x/*.data/data/lib DIR/
# Without DT_ONEDNN3_PREFIX the 3.x column is left out. The dtrain column
# needs `make build` first (build/bench/onednn_matmul_dtrain; --build moves
# build/). The oneDNN programs are compiled here from bench/onednn_matmul.c
# with cc into a temporary folder.
#
# One round runs each library's program once (all shapes and types, --reps
# timed runs each after one untimed); the order of the libraries rotates
# from round to round, so a drift of the machine's load falls on all alike.
# The table gives, per shape and type, each library's median over the
# rounds of wall GFLOP/s and of GFLOP per CPU-second (the process's CPU time
# per run, the mean over a round's --reps runs: the CPU clock of the other
# threads moves at scheduler ticks, so use --reps 10 or more for GEMMs of
# ~10 ms; on a machine shared with other work the wall rate moves with the
# load, the CPU rate much less; on an idle machine it is the wall rate / threads),
# and the ratio oneDNN 3.x / 2.x of the CPU rates (above 1: 3.x is faster).
# The last lines sum, per type, a GPT-2 step's GEMM CPU time at those rates
# (each per-layer shape --layers times, the LM head's once) and give the
# time ratio 3.x / 2.x of the sums (below 1: 3.x is faster).
# --wait passive (OMP_WAIT_POLICY for every library): threads that wait at
# the end of a parallel region sleep instead of spinning, so on a loaded
# machine a thread waiting for a descheduled one adds no CPU time.
set -eu
rounds=3
reps=3
threads=2
types=f32,bf16,bf16o
only=
dims=
layers=12
omp_wait=
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --rows | --embd | --vocab) dims="$dims $1 $2"; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --wait) omp_wait=$2; shift 2 ;;
    -h | --help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "onednn_matmul.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$rounds" "$reps" "$threads" "$layers"; do
    case $v in '' | *[!0-9]* | 0) echo "onednn_matmul.sh: --rounds, --reps, --threads, --layers take a positive integer" >&2; exit 2 ;; esac
done
case $omp_wait in '' | active | passive | ACTIVE | PASSIVE) ;; *) echo "onednn_matmul.sh: --wait takes active or passive" >&2; exit 2 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
cc=${CC:-cc}
progs=
$cc -O2 -o "$tmp/onednn2" "$here/bench/onednn_matmul.c" -ldnnl
progs="onednn2"
if [ -n "${DT_ONEDNN3_PREFIX:-}" ]; then
    p=$DT_ONEDNN3_PREFIX
    if [ ! -f "$p/include/oneapi/dnnl/dnnl.h" ] || [ ! -f "$p/lib/libdnnl.so.3" ]; then
        echo "onednn_matmul.sh: DT_ONEDNN3_PREFIX=$p lacks include/oneapi/dnnl/dnnl.h or lib/libdnnl.so.3" >&2
        exit 2
    fi
    $cc -O2 -I"$p/include" -o "$tmp/onednn3" "$here/bench/onednn_matmul.c" -L"$p/lib" -l:libdnnl.so.3 \
        -Wl,-rpath,"$p/lib"
    progs="$progs onednn3"
fi
if [ -x "$build/bench/onednn_matmul_dtrain" ]; then
    ln -s "$build/bench/onednn_matmul_dtrain" "$tmp/dtrain"
    progs="$progs dtrain"
else
    echo "onednn_matmul.sh: no $build/bench/onednn_matmul_dtrain (make build): the dtrain column is left out" >&2
fi
n=$(echo "$progs" | wc -w)
args="--reps $reps --types $types$dims"
[ -n "$only" ] && args="$args --only $only"
echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores, threads $threads${omp_wait:+, OMP_WAIT_POLICY $omp_wait}," \
    "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%dT%H:%MZ)"
r=0
while [ $r -lt "$rounds" ]; do
    i=0
    while [ $i -lt "$n" ]; do
        lib=$(echo "$progs" | cut -d' ' -f$(( (i + r) % n + 1 )))
        rc=0
        # shellcheck disable=SC2086 # $args is a list of options
        env OMP_NUM_THREADS=$threads OMP_PROC_BIND=false ${omp_wait:+OMP_WAIT_POLICY=$omp_wait} "$tmp/$lib" $args >>"$tmp/out" 2>>"$tmp/log" || rc=$?
        # 1: some shape failed (its line says why, e.g. no bf16 matmul on the CPU); else give up
        [ $rc -le 1 ] || { echo "onednn_matmul.sh: $lib failed (exit $rc):" >&2; cat "$tmp/log" >&2; exit 1; }
        i=$((i + 1))
    done
    r=$((r + 1))
    echo "# round $r of $rounds done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
grep -h '^onednn_matmul: oneDNN' "$tmp/log" | sort -u | sed 's/^/# /'
grep -h 'impl=' "$tmp/out" | awk '{ split($9, a, "="); print $1, $2, $3, $8, a[2] }' | sort -u |
    awk '{ k = $2 " " $3 " " $4; im[k] = im[k] " " $1 "=" $5 } END { for (k in im) print "# impl", k ":" im[k] }' |
    sort
awk -v progs="$progs" -v layers="$layers" '
function median(s,   a, m, i, j, t) {
    m = split(s, a, " ")
    for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
/error=/ { k = $2 " " $3 " " $4 " " $5 "x" $6 "x" $7 " " $8; if (!(k in seen)) { seen[k] = 1; order[++no] = k }; err[$1 SUBSEP k] = 1; next }
/impl=/ {
    k = $2 " " $3 " " $4 " " $5 "x" $6 "x" $7 " " $8
    if (!(k in seen)) { seen[k] = 1; order[++no] = k }
    flop = 2 * $5 * $6 * $7
    for (j = 9; j <= NF; j++) { split($j, kv, "="); v[kv[1]] = kv[2] }
    if (v["ms"] <= 0 || v["cpu_ms"] <= 0) next   # below the clocks resolution
    wall[$1 SUBSEP k] = wall[$1 SUBSEP k] " " flop / v["ms"] * 1e-6
    cpu[$1 SUBSEP k] = cpu[$1 SUBSEP k] " " flop / v["cpu_ms"] * 1e-6
}
END {
    nl = split(progs, lib, " ")
    printf "%-7s %-8s %-4s %-16s %-6s", "pass", "gemm", "op", "MxNxK", "type"
    for (l = 1; l <= nl; l++) printf " %14s", lib[l] " wall/cpu"
    print "  3.x/2.x rate"
    for (o = 1; o <= no; o++) {
        k = order[o]; split(k, fld, " ")
        printf "%-7s %-8s %-4s %-16s %-6s", fld[1], fld[2], fld[3], fld[4], fld[5]
        for (l = 1; l <= nl; l++) {
            x = lib[l] SUBSEP k
            if (x in wall) { mc[l] = median(cpu[x]); printf " %6.0f/%7.1f", median(wall[x]), mc[l] }
            else { mc[l] = 0; printf " %14s", "n/a" }
        }
        if (nl >= 2 && lib[2] == "onednn3" && mc[1] > 0 && mc[2] > 0) printf "  %.2f", mc[2] / mc[1]
        print ""
        split(fld[4], d, "x"); wt = 2 * d[1] * d[2] * d[3] * (fld[2] == "lm_head" ? 1 : layers)
        for (l = 1; l <= nl; l++)
            if (mc[l] > 0) { step[l SUBSEP fld[5]] += wt / mc[l] * 1e-9 } else { miss[l SUBSEP fld[5]] = 1 }
        types[fld[5]] = 1
    }
    for (t in types) {
        printf "GPT-2 step, GEMMs of %d layers + LM head, %s, CPU s:", layers, t
        for (l = 1; l <= nl; l++)
            if ((l SUBSEP t) in miss) printf " %s n/a", lib[l]; else printf " %s %.2f", lib[l], step[l SUBSEP t]
        if (nl >= 2 && lib[2] == "onednn3" && !((1 SUBSEP t) in miss) && !((2 SUBSEP t) in miss))
            printf "  time 3.x/2.x %.3f", step[2 SUBSEP t] / step[1 SUBSEP t]
        print ""
    }
}' "$tmp/out"
