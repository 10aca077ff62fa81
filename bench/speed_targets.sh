#!/usr/bin/env bash
# bench/speed_targets.sh — where dtrain stands against its speed targets on
# this CPU, in one command: each workload against its peer, side by side
# (the scripts below interleave and repeat; this one runs them and reads
# their medians), the ratio beside the bound it should meet, and "met",
# "NOT met" or "skipped" (a peer that is not there), or "disturbed": other
# processes took more than a tenth of the CPUs' time while the row measured
# (the figure is printed, not judged: rerun when the machine is quiet).
#
#   [PEER_PYTHON=...] [TORCH113_PYTHON=...] [LLMC_SRC=DIR] bench/speed_targets.sh [options]
#
# The CPU decides which bf16 bounds apply (the rows' "cpu" column):
#   amx          (amx_bf16 and amx_tile in /proc/cpuinfo): the GPT-2 124M bf16
#                step at B=8 T=256 at most 0.4 of torch.compile's, at B=4 T=64
#                at most 0.5, and at least 45% of the bf16 GEMM limit (the
#                step's 6 N B T FLOPs a second against the best rate dtrain's or
#                PyTorch's matmul reaches on the step's own GEMM shapes); with
#                both rows, a "# floor:" line says what share of torch.compile's
#                B=8 T=256 step the step's GEMMs alone take at that best rate:
#                no step on this CPU goes below it at the rates measured here;
#                GPT-2 medium B=4 T=512 with --full (reported, no bound)
#   avx512_bf16  (no AMX): the B=8 T=256 bf16 step at most 0.7 of torch.compile's
#   other        no bf16 bound (dtrain's --precision auto trains in f32 there)
# and on every CPU:
#   - the f32 GPT-2 124M step at B=4 T=64 at most 0.25 of llm.c's train_gpt2.c
#     and at least 80% of the f32 GEMM peak (LLMC_SRC: an llm.c checkout);
#   - the first timed step within 1.2x the steady state, 0 page faults a step
#     after it (dtrain bench step's own figures, bf16 where it applies);
#   - the ConvNet step at batch 100 at most 0.35 of PyTorch 1.13's
#     (TORCH113_PYTHON, default the first of python3 and /usr/bin/python3 that
#     imports torch 1.x) and at most 0.5 of PyTorch 2.x's (PEER_PYTHON, in the
#     same rounds);
#   - the two-rank ConvNet epoch on Fashion-MNIST at most 0.45 of PyTorch 1.13's
#     DDP (bench/accuracy_seeds.sh; it takes Debian's /usr/bin/python3 with
#     python3-torch and the dataset-fashion-mnist package).
#
# The scripts it runs: bench/gpt2_bf16_peer.sh, bench/torch_gemm_peak.py,
# bench/llmc_peer.sh, bench/convnet_peer.sh, bench/accuracy_seeds.sh and
# `dtrain bench step`. Their own output goes to the --logs directory (a
# temporary one, removed unless a row failed, when none is given). A row
# whose peer or data is missing reads "skipped" and says what it needs; a row
# whose command failed, or printed no figure, reads "FAILED" with the last line
# of its log, and the script then exits 1. Nothing here is a test: the machine's
# load moves every figure, so read the ratios (each a median of interleaved
# rounds), and take the figures for docs/BENCHMARKS.md from the scripts
# themselves with more rounds.
#
# Options: --rounds R (3; 1 for a quick look)  --full (also GPT-2 medium on AMX)
#   --only LIST (comma-separated rows: gpt2-bf16,gpt2-bf16-small,bf16-limit,
#   gpt2-medium,llmc,first-step,convnet,ddp-epoch)  --logs DIR
# Environment: DT_CLI (build/dtrain), PEER_PYTHON, TORCH113_PYTHON, LLMC_SRC,
#   PYTHON (a python with numpy for llm.c's files; default PEER_PYTHON).
set -u
cd "$(dirname "$0")/.." || exit 2
rounds=3 full=0 only="" logs=""
while [ $# -gt 0 ]; do
    case $1 in
    --full) full=1; shift; continue ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; exit 0 ;;
    esac
    [ $# -ge 2 ] || { echo "speed_targets.sh: $1 needs a value (see --help)" >&2; exit 2; }
    case $1 in
    --rounds) rounds=$2 ;; --only) only=$2 ;; --logs) logs=$2 ;;
    *) echo "speed_targets.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift 2
done
case $rounds in '' | *[!0-9]* | 0*) echo "speed_targets.sh: --rounds wants a positive count, got '$rounds'" >&2; exit 2 ;; esac
all="gpt2-bf16 gpt2-bf16-small bf16-limit gpt2-medium llmc first-step convnet ddp-epoch"
for w in ${only//,/ }; do
    case " $all " in *" $w "*) ;; *) echo "speed_targets.sh: --only: no row '$w' (rows: $all)" >&2; exit 2 ;; esac
done
want() { [ -z "$only" ] || case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
cli=${DT_CLI:-build/dtrain}
[ -x "$cli" ] || { echo "speed_targets.sh: no dtrain at '$cli' (make build, or set DT_CLI)" >&2; exit 2; }
export DT_CLI=$cli
if [ -n "$logs" ]; then
    mkdir -p "$logs" || exit 2
else
    logs=$(mktemp -d "${TMPDIR:-/tmp}/dt-speed-targets.XXXXXX") || exit 2
    tmp_logs=1
    trap '[ "${status:-0}" != 0 ] || rm -rf "$logs"' EXIT INT TERM
fi

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { case " $flags " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if has amx_bf16 && has amx_tile; then cpu=amx; elif has avx512_bf16; then cpu=avx512_bf16; else cpu=other; fi
model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//')
t113=
for p in ${TORCH113_PYTHON:-python3 /usr/bin/python3}; do
    "$p" -c 'import torch, sys; sys.exit(not torch.__version__.startswith("1."))' 2>/dev/null && { t113=$p; break; }
done

echo "# bench/speed_targets.sh: $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), $rounds round(s)"
echo "# CPU: ${model:-unknown} ($cpu); dtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$cli" info 2>/dev/null | grep -E '^(cpu features|dtrain isa|oneDNN isa|bf16 matmul|dtrain AMX GEMM|bf16 attention):' |
    sed 's/^/#   /'
printf '%-46s %-10s %-10s %s\n' target measured bound verdict
# The CPUs' time taken outside this script's own processes while a row
# measured (the machine is shared, and a busy neighbour slows a peer and
# dtrain unequally): every CPU's busy time in /proc/stat (steal included)
# less what this shell's children used (cutime and cstime in /proc/$$/stat:
# the processes it waited for, with theirs). DT_STAT_DIR (the tests) reads
# its stat and self files instead.
hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
ncpu=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
ticks() { # every CPU's busy ticks, then this shell's children's
    local st=/proc/stat self=/proc/$$/stat
    [ -z "${DT_STAT_DIR:-}" ] || st=$DT_STAT_DIR/stat self=$DT_STAT_DIR/self
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' "$st"
    sed 's/.*) //' "$self" | awk '{ print $14 + $15 }'
}
mark() { m0=$(ticks | tr '\n' ' ') t0=$(date +%s.%N); }
outside() { # the share of the CPUs' time used outside this script since mark
    local m1 t1
    m1=$(ticks | tr '\n' ' ') t1=$(date +%s.%N)
    awk -v a="$m0" -v b="$m1" -v t0="$t0" -v t1="$t1" -v hz="$hz" -v n="$ncpu" 'BEGIN {
        split(a, x, " "); split(b, y, " "); cap = (t1 - t0) * hz * n; o = (y[1] - x[1]) - (y[2] - x[2])
        s = cap > 0 && o > 0 ? o / cap : 0; printf "%.3f", s < 1 ? s : 1 }'
}
# A row's figure is a number, "na:WHY" (what it needs is missing: skipped, saying why) or "failed:LOG" (its
# command failed or printed no figure: FAILED, with the last line of LOG, and the script exits 1).
status=0
failed_note() { # LOG: the last line it holds, for a FAILED row
    local l; l=$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-300)
    echo "${l:-no figure and no message}; the log: $1"
}
row() { # name measured op bound [note]: judged (op "-": reported) unless the machine was busy since the last mark
    local v m=$2 o note=${5:-}
    if [ "${2%%:*}" = na ]; then v="skipped" m=na; [ "$2" = na ] || note=${2#na:}
    elif [ "${2%%:*}" = failed ]; then v="FAILED" m=na note=$(failed_note "${2#failed:}") status=1; else
        m=$(awk -v m="$2" 'BEGIN { printf "%.3f", m }')
        o=$(outside)
        if awk -v o="$o" 'BEGIN { exit !(o > 0.1) }'; then
            v="disturbed"
            note="other processes took $(awk -v o="$o" 'BEGIN { printf "%.0f", o * 100 }')% of the CPUs' time${note:+; $note}"
        elif [ "$3" = - ]; then
            v="reported"
        else
            v=$(awk -v m="$2" -v b="$4" -v op="$3" 'BEGIN { ok = op == "<=" ? m <= b : m >= b; print ok ? "met" : "NOT met" }')
        fi
    fi
    printf '%-46s %-10s %-10s %s%s\n' "$1" "$m" "$3$4" "$v" "${note:+ ($note)}"
}
# the median_ms ratio of case $2 in a gpt2_bf16_peer.sh / convnet_peer.sh output $1 (nothing when that
# script printed none: its "na" is a run that failed)
peer_ratio() {
    awk -v r="$2" '$1 == r && ($2 == "median_ms" || $2 == "ratio") {
        v = ($2 == "ratio") ? $6 : $3; if (v != "na") print v; exit }' "$1"
}
jnum() { sed -n "s/.*\"$2\":\\([-0-9.eE+]*\\).*/\\1/p" "$1" | head -n 1; }

# GPT-2 bf16 against torch.compile
gpt2_peer() { # tag batch seq [model]
    local out="$logs/$1.txt"
    [ -n "${PEER_PYTHON:-}" ] || { echo "na:PEER_PYTHON not set"; return; }
    bench/gpt2_bf16_peer.sh --rounds "$rounds" --steps 3 --batch "$2" --seq "$3" --model "${4:-gpt2}" --no-eager \
        >"$out" 2>"$logs/$1.err" || { echo "failed:$logs/$1.err"; return; }
    local m; m=$(peer_ratio "$out" dtrain/compile)
    echo "${m:-failed:$logs/$1.err}"
}
amx_b8=0.4 # the B=8 T=256 bound on AMX (its row, and the floor line beside the limit row)
if [ "$cpu" != other ]; then
    if want gpt2-bf16; then
        b=0.7; [ "$cpu" = amx ] && b=$amx_b8
        mark
        row "GPT-2 124M bf16 B=8 T=256 / torch.compile" "$(gpt2_peer gpt2-bf16 8 256)" "<=" "$b"
    fi
    if [ "$cpu" = amx ] && want gpt2-bf16-small; then
        mark
        row "GPT-2 124M bf16 B=4 T=64 / torch.compile" "$(gpt2_peer gpt2-bf16-small 4 64)" "<=" 0.5
    fi
    if [ "$cpu" = amx ] && want bf16-limit; then
        # the step's 6 N B T rate against the best GEMM rate on its shapes: dtrain's own (peak_gflops) or PyTorch's
        s="$logs/bf16-limit.json"
        mark
        g= pd= pt=
        "$cli" bench step --model gpt2 --batch 8 --seq 256 --precision bf16 --threads 2 --steps 3 --peak-reps 3 --json \
            >"$s" 2>"$logs/bf16-limit.err" && g=$(jnum "$s" gflops) pd=$(jnum "$s" peak_gflops)
        if [ -n "${PEER_PYTHON:-}" ]; then
            "$PEER_PYTHON" bench/torch_gemm_peak.py --threads 2 --reps 3 --json >"$logs/torch-gemm.json" 2>/dev/null &&
                pt=$(tail -n 1 "$logs/torch-gemm.json" | sed -n 's/.*"peak_gflops": *\([0-9.eE+]*\).*/\1/p' |
                     awk '{ printf "%.1f", $1 }')
        fi
        f=$(awk -v g="${g:-}" -v a="${pd:-0}" -v b="${pt:-0}" \
            'BEGIN { l = a > b ? a : b; if (g == "" || l <= 0) print "fail"; else printf "%.3f", g / l }')
        [ "$f" != fail ] || f="failed:$logs/bf16-limit.err"
        row "GPT-2 bf16 B=8 T=256 step / bf16 GEMM limit" "$f" ">=" 0.45 \
            "step ${g:-?} GFLOP/s; GEMMs: dtrain ${pd:-?}, PyTorch ${pt:-skipped}"
        # The lowest ratio to torch.compile any step could reach here: its GEMMs alone at the best rate
        # measured on their shapes (dtrain's or PyTorch's), against the compiled step of the row above
        # (this run's, when it ran). Above the bound, no kernel that runs at the rates measured on this
        # CPU meets it; the rest of the step (optimizer, element-wise) only adds to the floor.
        gf=$(jnum "$s" peak_gemm_gflop)
        cm=
        if want gpt2-bf16 && [ -n "${PEER_PYTHON:-}" ] && [ -f "$logs/gpt2-bf16.txt" ]; then
            cm=$(awk '$1 == "compile" { print $2; exit }' "$logs/gpt2-bf16.txt")
        fi
        awk -v gf="${gf:-}" -v a="${pd:-0}" -v b="${pt:-0}" -v cm="${cm:-}" -v bound="$amx_b8" 'BEGIN {
            l = a > b ? a : b
            if (gf == "" || l <= 0 || cm == "" || cm <= 0) exit
            ms = gf / l * 1e3; r = ms / cm
            why = r > bound ? " (above the bound " bound ": not reachable at the GEMM rates measured on this CPU)" : ""
            printf "# floor: the step'\''s GEMMs alone (%.1f GFLOP) at %.1f GFLOP/s take %.0f ms, %.3f of ", gf, l, ms, r
            printf "torch.compile'\''s %.0f ms step%s\n", cm, why
        }'
    fi
    if [ "$cpu" = amx ] && [ "$full" = 1 ] && want gpt2-medium; then
        mark
        row "GPT-2 medium bf16 B=4 T=512 / torch.compile" "$(gpt2_peer gpt2-medium 4 512 gpt2-medium)" - ""
    fi
fi

if want llmc; then
    m="na:LLMC_SRC (an llm.c checkout) or PEER_PYTHON not set" p=$m
    mark
    if [ -n "${LLMC_SRC:-}" ] && [ -n "${PYTHON:-${PEER_PYTHON:-}}" ]; then
        m= p=
        PYTHON=${PYTHON:-$PEER_PYTHON} bench/llmc_peer.sh --rounds "$rounds" >"$logs/llmc.txt" 2>"$logs/llmc.err" &&
            { m=$(awk '$1 == "dtrain/llmc" { print $3; exit }' "$logs/llmc.txt")
              p=$(sed -n 's/^dtrain pct_of_peak.*: \([0-9.]*\)$/\1/p' "$logs/llmc.txt"); }
        m=${m:-failed:$logs/llmc.err}
        p=$(awk -v p="${p:-}" -v f="failed:$logs/llmc.err" 'BEGIN { if (p == "") print f; else printf "%.3f", p / 100 }')
    fi
    row "GPT-2 124M f32 B=4 T=64 / llm.c" "$m" "<=" 0.25
    row "the same, share of the f32 GEMM peak" "$p" ">=" 0.80
fi

if want first-step; then
    prec=bf16; [ "$cpu" = other ] && prec=fp32
    s="$logs/first-step.json"
    mark
    f= pf=
    "$cli" bench step --model gpt2 --batch 4 --seq 64 --precision "$prec" --threads 2 --steps 5 --peak-reps 0 --json \
        >"$s" 2>"$logs/first-step.err" && f=$(jnum "$s" first_over_median) pf=$(jnum "$s" page_faults_per_step)
    row "first timed step / steady state (GPT-2 $prec)" "${f:-failed:$logs/first-step.err}" "<=" 1.2
    row "page faults a step after the first" "${pf:-failed:$logs/first-step.err}" "<=" 0
fi

if want convnet; then
    m1="na:no python with PyTorch 1.x (TORCH113_PYTHON; Debian's python3-torch)" m2="na:PEER_PYTHON not set"
    [ -z "${PEER_PYTHON:-}" ] || m2=$m1 # convnet_peer.sh runs both peers, and only with PyTorch 1.x
    mark
    if [ -n "$t113" ]; then
        m1=
        [ -z "${PEER_PYTHON:-}" ] || m2=
        TORCH113_PYTHON=$t113 bench/convnet_peer.sh --rounds "$rounds" --steps 40 >"$logs/convnet.txt" \
            2>"$logs/convnet.err" && m1=$(peer_ratio "$logs/convnet.txt" dtrain/t113) &&
            { [ -z "${PEER_PYTHON:-}" ] || m2=$(peer_ratio "$logs/convnet.txt" dtrain/t2); }
        m1=${m1:-failed:$logs/convnet.err}
        [ -z "${PEER_PYTHON:-}" ] || m2=${m2:-failed:$logs/convnet.err}
    fi
    row "ConvNet step, batch 100 / PyTorch 1.13" "$m1" "<=" 0.35
    row "ConvNet step, batch 100 / PyTorch 2.x" "$m2" "<=" 0.5
fi

if want ddp-epoch; then
    m="na:/usr/bin/python3 has no torch (Debian's python3-torch)"
    mark
    if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
        m=
        seeds=$(seq -s ' ' 0 $((rounds - 1)) | sed 's/[0-9][0-9]*/0/g')
        bash bench/accuracy_seeds.sh $seeds >"$logs/ddp.txt" 2>"$logs/ddp.err" &&
            m=$(awk 'NR > 1 && $1 ~ /^[0-9]+$/ && $5 > 0 { print $4 / $5 }' "$logs/ddp.txt" | sort -g |
                awk '{a[NR] = $1} END { if (NR) printf "%.3f", (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
        m=${m:-failed:$logs/ddp.err}
    fi
    row "two-rank ConvNet epoch / PyTorch 1.13 DDP" "$m" "<=" 0.45
fi
[ -n "${tmp_logs:-}" ] && [ "$status" = 0 ] || echo "# the scripts' own output: $logs"
exit $status
