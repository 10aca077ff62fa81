#!/bin/sh
# bench/compare.sh — the regression guard: build two commits and time the
# standard workloads interleaved, printing HEAD/BASE ratios with their spread.
#
#   bench/compare.sh [options] BASE [HEAD]
#
# BASE and HEAD are anything `git rev-parse` takes (a commit, a branch, a
# tag); HEAD defaults to HEAD. "." stands for the working tree as built in
# build/ (`make build` first): how an uncommitted change is measured against
# the commit it starts from (bench/compare.sh HEAD .).
#
# Each commit is exported (git archive) into build-compare/<commit>/src and
# built Release (the CLI only) in build-compare/<commit>/build; a commit's
# build is kept and reused by later runs (a commit never changes), and the
# compiles go through ccache when it is installed. DT_COMPARE_DIR moves
# build-compare/ elsewhere.
#
# Workloads (--workloads, comma-separated; default all but none skipped):
#   convnet    dtrain bench step --model convnet --batch 100
#   mlp        dtrain bench step --model mlp (batch 4)
#   gpt2-f32   dtrain bench step --model gpt2 --batch 4 --seq 64
#   gpt2-bf16  the same with --precision bf16
#   allreduce  dtrain run -n 2 -- dtrain bench coll --op allreduce, 4 MiB,
#              plain buffers, in place (time per operation)
#   llama-bf16 dtrain bench step --model llama-100m --batch 4 --seq 64
#              --precision bf16 (not in the default set: name it; about
#              2.3 GB of memory)
#   gpt2-bf16-b8  dtrain bench step --model gpt2 --batch 8 --seq 256
#              --precision bf16: the training size whose products have K
#              in chunks (2048 rows of tokens); not in the default set
#              (about 1.3 s a step and 3.2 GB on the Xeon with AMX)
# A step workload's figure is the bench's median_ms (--steps timed steps
# after --warmup untimed ones, the matmul peak skipped), the all-reduce's is
# time_us. A commit whose CLI lacks a workload (an old commit without gpt2 or
# --precision) shows "n/a" for it.
#
# One round runs every workload once on BASE and once on HEAD, back to back
# (A B, and B A in the next round, so a drift of the machine's load falls on
# both equally). After --rounds rounds each workload's line gives the median
# of BASE's and HEAD's figures, the median of the per-round ratios
# HEAD/BASE (below 1: HEAD is faster) and their spread (the smallest and the
# largest per-round ratio). The machine should be otherwise idle; on a shared
# one, take more rounds and read the spread.
#
# Options:
#   --rounds N      rounds (default 3)
#   --steps S       timed steps per step run (default 10; GPT: S/2, at least 2)
#   --warmup W      untimed steps first (default 3)
#   --threads T     compute threads of the step runs (default: the bench's)
#   --metric M      the step workloads' figure: median_ms (default), min_ms
#                   (the fastest timed step: steadier on a loaded machine) or
#                   cpu_ms (process CPU time per step)
#   --workloads L   which workloads, comma-separated (default: the first five)
#   --quick         a smoke run: 1 round, tiny sizes (convnet batch 8, the
#                   mlp, gpt-micro for the GPT workloads, llama-tiny for the
#                   Llama one, a 64 KiB all-reduce)
#   --jobs N        build jobs (default: the number of cores)
#   --build-type T  the CMake build type of the commits' builds (default
#                   Release; Debug builds in about a third of the time but
#                   its figures mean nothing: for checking this script, as
#                   its test does). Kept apart: build-compare/<commit>-<type>
#                   for a type other than Release.
#
# Output: a header naming both commits, then one line per workload:
#   workload  base  head  unit  ratio  spread
#   convnet   9.612 9.705 ms    1.010  0.981-1.034
# Exit status 0 when every requested workload ran on both, 1 when one could
# not run (n/a) or a build failed, 2 on bad options or an unknown commit.
set -eu

usage() {
    sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'
}

rounds=3 steps=10 warmup=3 threads=0 quick=0 metric=median_ms btype=Release
workloads=convnet,mlp,gpt2-f32,gpt2-bf16,allreduce
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --quick) quick=1; shift ;;
        --rounds|--steps|--warmup|--threads|--workloads|--jobs|--metric|--build-type)
            [ $# -ge 2 ] || { echo "compare.sh: $1 needs a value" >&2; exit 2; }
            case $1 in
                --rounds) rounds=$2 ;; --steps) steps=$2 ;; --warmup) warmup=$2 ;;
                --threads) threads=$2 ;; --workloads) workloads=$2 ;; --jobs) jobs=$2 ;;
                --metric) metric=$2 ;; --build-type) btype=$2 ;;
            esac
            shift 2 ;;
        --) shift; break ;;
        -*) echo "compare.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: bench/compare.sh [options] BASE [HEAD] (see --help)" >&2; exit 2; }
for v in "$rounds" "$steps" "$warmup" "$threads" "$jobs"; do
    case $v in ''|*[!0-9]*) echo "compare.sh: '$v' is not a count" >&2; exit 2 ;; esac
done
[ "$rounds" -ge 1 ] && [ "$steps" -ge 1 ] && [ "$jobs" -ge 1 ] ||
    { echo "compare.sh: --rounds, --steps and --jobs must be >= 1" >&2; exit 2; }
case $metric in median_ms|min_ms|cpu_ms) ;;
    *) echo "compare.sh: unknown --metric '$metric' (median_ms, min_ms, cpu_ms)" >&2; exit 2 ;;
esac
case $btype in Release|Debug|RelWithDebInfo|MinSizeRel) ;;
    *) echo "compare.sh: unknown --build-type '$btype' (Release, Debug, RelWithDebInfo, MinSizeRel)" >&2; exit 2 ;;
esac
for w in $(echo "$workloads" | tr ',' ' '); do
    case $w in convnet|mlp|gpt2-f32|gpt2-bf16|allreduce|llama-bf16|gpt2-bf16-b8) ;;
        *) echo "compare.sh: unknown workload '$w' (convnet, mlp, gpt2-f32, gpt2-bf16, allreduce, llama-bf16," \
                "gpt2-bf16-b8)" >&2
           exit 2 ;;
    esac
done
if [ "$quick" = 1 ]; then
    rounds=1 steps=2 warmup=1
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 ||
    { echo "compare.sh: $repo is not a git checkout (the commits to compare come from its history)" >&2; exit 2; }
cdir=${DT_COMPARE_DIR:-$repo/build-compare}
mkdir -p "$cdir/logs"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}"

# resolve REV: prints the full commit id, or "." for the working tree's build
resolve() {
    if [ "$1" = . ]; then echo .; return; fi
    git -C "$repo" rev-parse --verify --quiet "$1^{commit}" || {
        shallow=
        [ "$(git -C "$repo" rev-parse --is-shallow-repository 2>/dev/null)" = true ] &&
            shallow=" (this clone is shallow: git fetch --unshallow)"
        echo "compare.sh: unknown commit '$1'$shallow" >&2
        exit 2
    }
}

# build COMMIT: prints the path of that commit's dtrain, building it once
build() {
    if [ "$1" = . ]; then
        [ -x "$repo/build/dtrain" ] || { echo "compare.sh: '.' needs the working tree built (make build)" >&2; return 1; }
        echo "$repo/build/dtrain"
        return
    fi
    d=$cdir/$1
    [ "$btype" = Release ] || d=$d-$btype
    if [ ! -x "$d/build/dtrain" ]; then
        echo "# building $(echo "$1" | cut -c1-12) in $d (log: $d/build.log)" >&2
        rm -rf "$d/src"
        mkdir -p "$d/src"
        git -C "$repo" archive "$1" | tar -x -C "$d/src"
        launcher=
        command -v ccache >/dev/null 2>&1 && launcher=-DCMAKE_C_COMPILER_LAUNCHER=ccache
        if ! { cmake -S "$d/src" -B "$d/build" -DCMAKE_BUILD_TYPE="$btype" -DDT_WERROR=OFF -DDT_BUILD_TESTS=OFF \
                   $launcher && cmake --build "$d/build" -j "$jobs" --target dtrain_cli; } >"$d/build.log" 2>&1; then
            echo "compare.sh: building $1 failed; the end of $d/build.log:" >&2
            tail -n 20 "$d/build.log" >&2
            return 1
        fi
    fi
    echo "$d/build/dtrain"
}

# figure BIN WORKLOAD LOG: runs the workload once, prints its figure (or nothing)
figure() {
    bin=$1 w=$2 log=$3
    th=
    [ "$threads" -gt 0 ] && th="--threads $threads"
    gsteps=$((steps / 2))
    [ "$gsteps" -ge 2 ] || gsteps=2
    [ "$quick" = 1 ] && gsteps=1
    case $w in
        convnet) b=100; [ "$quick" = 1 ] && b=8
            set -- --model convnet --batch $b --steps "$steps" ;;
        mlp) set -- --model mlp --batch 4 --steps "$steps" ;;
        gpt2-f32|gpt2-bf16) m="--model gpt2 --batch 4 --seq 64"
            [ "$quick" = 1 ] && m="--model gpt-micro --batch 2 --seq 16"
            p=fp32; [ "$w" = gpt2-bf16 ] && p=bf16
            # shellcheck disable=SC2086
            set -- $m --precision $p --steps "$gsteps" ;;
        gpt2-bf16-b8) m="--model gpt2 --batch 8 --seq 256"
            [ "$quick" = 1 ] && m="--model gpt-micro --batch 2 --seq 32"
            # shellcheck disable=SC2086
            set -- $m --precision bf16 --steps "$gsteps" ;;
        llama-bf16) m="--model llama-100m --batch 4 --seq 64"
            [ "$quick" = 1 ] && m="--model llama-tiny --batch 2 --seq 16"
            # shellcheck disable=SC2086
            set -- $m --precision bf16 --steps "$gsteps" ;;
        allreduce) sz=4M; [ "$quick" = 1 ] && sz=64K
            "$bin" run -n 2 -- "$bin" bench coll --op allreduce --min $sz --max $sz --mem plain --json \
                >"$log" 2>&1 || return 0
            sed -n 's/.*"inplace":true,.*"time_us":\([0-9.]*\),.*/\1/p' "$log" | head -n 1
            return 0 ;;
    esac
    # shellcheck disable=SC2086
    "$bin" bench step "$@" --warmup "$warmup" --peak-reps 0 $th --json >"$log" 2>&1 || return 0
    sed -n "s/.*\"$metric\":\([0-9.]*\),.*/\1/p" "$log" | head -n 1
}

base=$(resolve "$1")
head=$(resolve "${2:-HEAD}")
short() { if [ "$1" = . ]; then echo "worktree"; else echo "$1" | cut -c1-12; fi; }
bbin=$(build "$base") || exit 1
hbin=$(build "$head") || exit 1

# per-workload figures, one file each: "round base head"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-compare.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
r=1
while [ "$r" -le "$rounds" ]; do
    for w in $(echo "$workloads" | tr ',' ' '); do
        if [ $((r % 2)) = 1 ]; then
            a=$(figure "$bbin" "$w" "$cdir/logs/$w.base.$r.log")
            b=$(figure "$hbin" "$w" "$cdir/logs/$w.head.$r.log")
        else
            b=$(figure "$hbin" "$w" "$cdir/logs/$w.head.$r.log")
            a=$(figure "$bbin" "$w" "$cdir/logs/$w.base.$r.log")
        fi
        echo "$r ${a:-na} ${b:-na}" >>"$tmp/$w"
        echo "# round $r/$rounds $w: base ${a:-n/a} head ${b:-n/a}" >&2
    done
    r=$((r + 1))
done

echo "# bench/compare.sh: base $(short "$base") head $(short "$head"), $rounds round(s)$([ "$quick" = 1 ] && echo ', quick sizes')$([ "$btype" = Release ] || echo ", $btype builds (figures meaningless)"), step figure $metric, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
echo "# ratio = head / base (median of the rounds' ratios; below 1: head is faster); spread = min-max of the rounds' ratios"
printf '%-10s %10s %10s %-4s %7s  %s\n' workload base head unit ratio spread
status=0
for w in $(echo "$workloads" | tr ',' ' '); do
    unit=ms
    [ "$w" = allreduce ] && unit=us
    line=$(awk -v w="$w" -v unit="$unit" '
        function med(v, n,   i, j, t) {
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
            return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        }
        $2 != "na" && $3 != "na" && $2 > 0 { n++; a[n] = $2; b[n] = $3; q[n] = $3 / $2 }
        END {
            if (!n) { printf "%-10s %10s %10s %-4s %7s  %s\n", w, "n/a", "n/a", unit, "n/a", "n/a"; exit 1 }
            lo = hi = q[1]; for (i = 2; i <= n; i++) { if (q[i] < lo) lo = q[i]; if (q[i] > hi) hi = q[i] }
            printf "%-10s %10.3f %10.3f %-4s %7.3f  %.3f-%.3f\n", w, med(a, n), med(b, n), unit, med(q, n), lo, hi
        }' "$tmp/$w") || status=1
    echo "$line"
done
exit $status
