#!/bin/sh
# A rank SIGKILLed under mpirun is named by the survivors (issue 30, item 6):
#   deadrank_test.sh coll MPIEXEC MPI_DEADRANK   rank 1 dies inside an all-reduce
#   deadrank_test.sh train MPIEXEC DTRAIN        rank 1 of `dtrain train` dies
#                                                right after optimizer step 3
# Both under the documented mpirun line (docs/GUIDE.md: mpirun --mca
# odls_base_sigkill_timeout 10, so that mpirun's SIGKILL does not end the
# survivors before they can say which rank died). Each survivor (ranks 0
# and 2) must print DT_ERR_PEER_FAILED's message naming rank 1 within the
# group timeout (DT_COMM_TIMEOUT=30) plus a margin, well before it; the
# train survivors must exit 1 (a runtime failure, as under dtrain run).
# Exit 77 where mpirun is missing.
set -u
mode=$1 mpiexec=$2 prog=$3
command -v "$mpiexec" >/dev/null 2>&1 || [ -x "$mpiexec" ] || { echo "skip: no mpirun"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/deadrank.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
export DT_COMM_TIMEOUT=30 DT_BACKEND=mpi ASAN_OPTIONS=detect_leaks=0
mpirun_line="$mpiexec --allow-run-as-root --oversubscribe --bind-to none --mca odls_base_sigkill_timeout 10 -np 3"
t0=$(date +%s)
if [ "$mode" = coll ]; then
    export DT_MPI_BLOCKING="${DT_MPI_BLOCKING:-0}" DT_DEADRANK_DIR="$dir"
    $mpirun_line -x DT_COMM_TIMEOUT -x DT_BACKEND -x DT_MPI_BLOCKING -x DT_DEADRANK_DIR "$prog" >"$dir/out" 2>&1
else
    # The survivors run under a shell that reports their exit code (it
    # ignores mpirun's SIGTERM; dtrain handles its own); rank 1 is the
    # program itself (exec), so that mpirun sees its death.
    cat >"$dir/rank.sh" <<'EOS'
#!/bin/sh
if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$@"; fi
trap '' TERM
"$@"
echo "deadrank_test: rank $OMPI_COMM_WORLD_RANK exited with code $? at $(date +%s)" >"$DT_DEADRANK_DIR/exit.$OMPI_COMM_WORLD_RANK"
EOS
    export DT_DEADRANK_DIR="$dir"
    $mpirun_line -x DT_COMM_TIMEOUT -x DT_BACKEND -x DT_DEADRANK_DIR -x DT_FAULT_KILL_STEP=3 -x DT_FAULT_KILL_RANK=1 \
        sh "$dir/rank.sh" "$prog" train --model mlp --random-items 4096 --mlp-dim 16 --mlp-hidden 64 --batch 4 \
        --threads 1 --progress plain --log-every 1 --epochs 1 --no-eval >"$dir/out" 2>&1
fi
rc=$?
t1=$(date +%s)
cat "$dir"/exit.* >>"$dir/out" 2>/dev/null
cat "$dir/out"
echo "deadrank_test: mpirun exited with code $rc after $((t1 - t0)) s"
fail=0
if [ "$mode" = coll ]; then
    for r in 0 2; do
        grep -q "^mpi_deadrank: rank $r ok after" "$dir/out" || { echo "FAILED: rank $r did not report rank 1's death"; fail=1; }
    done
else
    n=$(grep -c "dtrain train: .*rank 1 (pid [0-9]*, on rank [02]'s machine) died (exited or was killed)" "$dir/out")
    [ "$n" -ge 2 ] || { echo "FAILED: $n survivors named rank 1 (want 2)"; fail=1; }
    for r in 0 2; do
        grep -q "^deadrank_test: rank $r exited with code 1 at" "$dir/out" ||
            { echo "FAILED: rank $r did not exit with code 1"; fail=1; }
    done
fi
grep -q "^mpi_deadrank: rank [0-9]* FAILED\|^\[rank [0-9]*\]" "$dir/out" && fail=1
[ $((t1 - t0)) -lt 60 ] || { echo "FAILED: the job took $((t1 - t0)) s"; fail=1; }
[ "$rc" -ne 0 ] || { echo "FAILED: mpirun exited 0 although a rank died"; fail=1; }
[ $fail = 0 ] && echo "deadrank_test $mode: ok"
exit $fail
