#!/usr/bin/env bash
# OpenMP's waiting policy on shared CPUs: dtrain train's ConvNet throughput
# (samples/s, rank 0's figure) with libgomp's own default (spin ~300000
# iterations before sleeping: GOMP_SPINCOUNT=300000) against dtrain's
# default (OMP_WAIT_POLICY=passive, set by the dtrain command when the user
# set neither), on a machine without and with one busy process (a shell
# spin loop), for 1 rank (threads = all cores) and 2 ranks (dtrain run:
# cores / 2 threads each). The cases run interleaved, ROUNDS rounds (default
# 3); each case's median is printed, and the ratio passive / spin.
#   bench/shared_cpus.sh [ROUNDS]        (DT_CLI: the dtrain program)
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${DT_CLI:-build/dtrain}
rounds=${1:-3}
items=${DT_BENCH_ITEMS:-1000}
tmp=$(mktemp -d)
busy=
cleanup() { [ -n "$busy" ] && kill "$busy" 2> /dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
train=(train --model convnet --limit-train "$items" --limit-test 100 --batch 50 --no-eval --progress none)
run_case() { # ranks policy -> samples/s
  local envs=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u DT_OMP_WAIT)
  if [ "$2" = spin ]; then envs+=(GOMP_SPINCOUNT=300000); fi
  if [ "$1" = 1 ]; then
    "${envs[@]}" "$cli" "${train[@]}" > "$tmp/out" 2>&1
  else
    "${envs[@]}" "$cli" run -n "$1" -- "$cli" "${train[@]}" > "$tmp/out" 2>&1
  fi
  sed -n 's/^\(\[0\] \)\{0,1\}samples\/s: \([0-9.]*\).*/\2/p' "$tmp/out" | head -1
}
for r in $(seq "$rounds"); do
  for load in idle busy; do
    if [ "$load" = busy ]; then sh -c 'while :; do :; done' & busy=$!; fi
    for ranks in 1 2; do
      for policy in spin passive; do
        echo "$(run_case "$ranks" "$policy")" >> "$tmp/$load.$ranks.$policy"
      done
    done
    if [ -n "$busy" ]; then kill "$busy"; wait "$busy" 2> /dev/null || true; busy=; fi
  done
done
median() { sort -n "$1" | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
echo "load ranks  spin(libgomp default)  passive(dtrain default)  passive/spin   [samples/s, median of $rounds; $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)]"
for load in idle busy; do
  for ranks in 1 2; do
    s=$(median "$tmp/$load.$ranks.spin"); p=$(median "$tmp/$load.$ranks.passive")
    printf "%-5s %-5s %21s %24s %13s   (runs: spin %s; passive %s)\n" "$load" "$ranks" "$s" "$p" \
      "$(awk -v a="$p" -v b="$s" 'BEGIN{printf "%.2fx", (b > 0) ? a/b : 0}')" \
      "$(tr '\n' ' ' < "$tmp/$load.$ranks.spin")" "$(tr '\n' ' ' < "$tmp/$load.$ranks.passive")"
  done
done
