#!/usr/bin/env bash
# OpenMP's waiting policy on shared CPUs: dtrain train's ConvNet throughput
# (samples/s, rank 0's figure) under each waiting policy, on a machine
# without and with one busy process (a shell spin loop), for 1 rank
# (threads = all cores) and 2 ranks (dtrain run: cores / 2 threads each).
# Policies (DT_BENCH_MODES, default "spin passive"):
#   spin     libgomp's own default (spin ~300000 iterations before sleeping:
#            GOMP_SPINCOUNT=300000), what dtrain did before it chose
#   active   OMP_WAIT_POLICY=active (spin without end)
#   passive  OMP_WAIT_POLICY=passive, dtrain's default (the dtrain command
#            sets it when the user set neither variable)
#   spinN    GOMP_SPINCOUNT=N (a bounded spin, e.g. spin10000)
# The cases run interleaved, ROUNDS rounds (default 3); the order of the
# policies is reversed every other round. Beside every run the script notes
# the 1-minute load average and how idle the CPUs were in the second before
# it (other processes' load: the figures of a shared machine are only as
# good as these). DT_BENCH_QUIET=P waits (up to 60 s) before each run until
# the CPUs were at least P% idle for a second (0: do not wait, the
# default). It prints each case's median, the median load, the ratio of
# the medians to the first policy and the median of the rounds' ratios
# (each round's runs are seconds apart: the paired ratio moves least with
# the load), then every run.
#   bench/shared_cpus.sh [ROUNDS]        (DT_CLI: the dtrain program;
#                                         DT_BENCH_ITEMS: training images, default 1000)
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${DT_CLI:-build/dtrain}
rounds=${1:-3}
items=${DT_BENCH_ITEMS:-1000}
quiet=${DT_BENCH_QUIET:-0}
read -r -a modes <<< "${DT_BENCH_MODES:-spin passive}"
tmp=$(mktemp -d)
busy=
cleanup() { [ -n "$busy" ] && kill "$busy" 2> /dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
train=(train --model convnet --limit-train "$items" --limit-test 100 --batch 50 --no-eval --progress none)

idle_pct() { # the CPUs' idle share over the next second, in percent
  local a b tot=0 k
  read -r -a a < /proc/stat; sleep 1; read -r -a b < /proc/stat
  for k in 1 2 3 4 5 6 7 8; do tot=$((tot + b[k] - a[k])); done
  echo $(( tot > 0 ? 100 * ((b[4] - a[4]) + (b[5] - a[5])) / tot : 0 ))
}
run_case() { # ranks mode -> "samples/s load1 idle%"
  local envs=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u DT_OMP_WAIT) idle waited=0
  case "$2" in
    spin) envs+=(GOMP_SPINCOUNT=300000) ;;
    active) envs+=(OMP_WAIT_POLICY=active) ;;
    passive) ;;
    spin*) envs+=(GOMP_SPINCOUNT="${2#spin}") ;;
    *) echo "shared_cpus.sh: unknown mode $2" >&2; exit 2 ;;
  esac
  idle=$(idle_pct)
  while [ "$quiet" -gt 0 ] && [ "$idle" -lt "$quiet" ] && [ "$waited" -lt 60 ]; do
    idle=$(idle_pct); waited=$((waited + 1))
  done
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  if [ "$1" = 1 ]; then
    "${envs[@]}" "$cli" "${train[@]}" > "$tmp/out" 2>&1
  else
    "${envs[@]}" "$cli" run -n "$1" -- "$cli" "${train[@]}" > "$tmp/out" 2>&1
  fi
  local s; s=$(sed -n 's/^\(\[0\] \)\{0,1\}samples\/s: \([0-9.]*\).*/\2/p' "$tmp/out" | head -1)
  echo "${s:-0} $load $idle"
}
for r in $(seq "$rounds"); do
  order=("${modes[@]}")
  if [ $((r % 2)) = 0 ]; then
    order=(); for ((i = ${#modes[@]} - 1; i >= 0; i--)); do order+=("${modes[i]}"); done
  fi
  for load in idle busy; do
    if [ "$load" = busy ]; then sh -c 'while :; do :; done' & busy=$!; fi
    for ranks in 1 2; do
      for mode in "${order[@]}"; do
        echo "$r $(run_case "$ranks" "$mode")" >> "$tmp/$load.$ranks.$mode"
      done
    done
    if [ -n "$busy" ]; then kill "$busy"; wait "$busy" 2> /dev/null || true; busy=; fi
  done
done
median() { sort -g | awk '{v[NR]=$1} END {print NR ? ((NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2) : 0}'; }
col() { awk -v c="$2" '{print $c}' "$1"; }
base=${modes[0]}
echo "samples/s, median of $rounds rounds; $(nproc) cores; ratios against $base (of the medians; median of the rounds' ratios)"
printf "%-5s %-5s %-9s %10s %10s %10s %9s %9s\n" load ranks policy samples/s load1 idle%before ratio paired
for load in idle busy; do
  for ranks in 1 2; do
    for mode in "${modes[@]}"; do
      f=$tmp/$load.$ranks.$mode b=$tmp/$load.$ranks.$base
      m=$(col "$f" 2 | median) mb=$(col "$b" 2 | median)
      paired=$(paste -d' ' "$f" "$b" | awk '$6 > 0 {printf "%.4f\n", $2 / $6}' | median)
      printf "%-5s %-5s %-9s %10s %10s %10s %8.2fx %8.2fx\n" "$load" "$ranks" "$mode" "$m" \
        "$(col "$f" 3 | median)" "$(col "$f" 4 | median)" \
        "$(awk -v a="$m" -v b="$mb" 'BEGIN{print (b > 0) ? a / b : 0}')" "$paired"
    done
  done
done
echo "runs (round samples/s load1 idle%before):"
for f in "$tmp"/*.*.*; do
  echo "  $(basename "$f"): $(tr '\n' ';' < "$f")"
done
