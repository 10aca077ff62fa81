#!/bin/sh
# The test bed of scripts/netbed.sh in ctest (tests/comm/tests.cmake).
#   netbed_test.sh hier SRC PROG NODES PER_NODE
#       mpirun PROG (tests/comm/mpi_hier.c) on NODES x PER_NODE ranks of a
#       bed with 10 Gbit/s links; it must detect the namespaces as nodes and
#       find the hierarchical all-reduce equal to the flat one; afterwards no
#       namespace or link of the bed may be left.
#   netbed_test.sh run SRC DTRAIN PROG
#       `dtrain run --nnodes 2 ... --hosts A,B -- PROG` (examples/example_allreduce)
#       on a bed of 2 nodes x 2 ranks: started through Open MPI, 4 correct ranks.
#   netbed_test.sh config SRC DTRAIN CFG STAGE
#       seed 003's DeepSpeed config CFG (tests/config/data) trains the tiny
#       GPT on a bed of 2 nodes x 1 rank (so ZeRO stage STAGE's reductions
#       cross the link) twice: under `dtrain run --nnodes 2`, and under
#       Open MPI's mpirun started directly (the bed's line: --host, the rsh
#       agent that enters a namespace, btl/oob tcp_if_include restricted to
#       the bed's subnet) running `dtrain train --config CFG`. Each: exit 0,
#       the config's stage on 2 ranks, a validation loss below ln 40 - 0.3
#       (it learned); and the two forms' step losses equal (relative 1e-6).
#   netbed_test.sh bytes SRC DTRAIN
#       what the hierarchical all-reduce sends across the links: on 2 nodes
#       x 2 ranks, `dtrain bench coll --algo hier` (4 MiB, 8 all-reduces in
#       512 KiB chunks) must put between 1.0 and 1.1 times 8 x 4 MiB on each
#       link direction (tc's counters: a node's share, S per all-reduce,
#       plus headers), not the 1.5 S of a flat ring, and get correct sums.
#   netbed_test.sh traffic SRC PROG
#       the mpi backend's count of the bytes that left the node (TCP's own
#       counters, dt_pg_traffic_read): tests/comm/mpi_traffic.c "bed" on
#       2 nodes x 1 rank, an all-reduce of 16 MiB within its bounds.
#   netbed_test.sh teardown SRC
#       the bed is removed after a failing command (whose status comes
#       back), after a command that leaves a process running in a node, and
#       after SIGTERM to the script; `check` says the bed can be built.
# Exit 77 (skipped) where the machine cannot create namespaces or has no
# mpirun: netbed.sh says which.
mode=$1
src=$2
bed="$src/scripts/netbed.sh"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
gone() { # gone TAGFILE: the bed named in TAGFILE left nothing behind
  tag=$(cat "$1" 2>/dev/null)
  [ -n "$tag" ] || fail "the bed wrote no tag"
  left=$(bash "$bed" leftovers "$tag") || fail "bed $tag left: $left"
  echo "bed $tag: torn down"
}

case "$mode" in
hier)
  prog=$3 nn=$4 pn=$5
  np=$((nn * pn))
  bash "$bed" --nodes "$nn" --slots "$pn" --rate 10gbit --tag-file "$tmp/tag" -- \
    sh -c "\$NETBED_MPIRUN -np $np -x DT_EXPECT_NODES=$nn -x DT_EXPECT_PER_NODE=$pn -x DT_HC_QUICK=1 \
      -x DT_COMM_TIMEOUT -x ASAN_OPTIONS $prog" > "$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  [ $rc -eq 77 ] && exit 77
  gone "$tmp/tag"
  [ $rc -eq 0 ] || fail "mpirun on the bed exited with $rc"
  grep -q "mpi_hier: $np ranks, backend mpi, detected nodes: ok" "$tmp/out" ||
    fail "no success line from rank 0"
  ;;
run)
  # dtrain run --nnodes 2 (torchrun's form) on the bed: node 0 starts the
  # job through Open MPI; every rank reports the right all-reduce
  cli=$3 prog=$4
  bash "$bed" --slots 2 --rate 10gbit --tag-file "$tmp/tag" -- sh -c "A=\$(echo \$NETBED_ADDRS | tr ' ' ,); \
    DT_MPIRUN_ARGS=\"\$NETBED_MPI_ARGS -x ASAN_OPTIONS\" $cli run --nnodes 2 --node-rank 0 \
    --master-addr \${A%%,*} --master-port 29500 -n 2 --hosts \$A -- $prog" > "$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  [ $rc -eq 77 ] && exit 77
  gone "$tmp/tag"
  [ $rc -eq 0 ] || fail "dtrain run --nnodes 2 on the bed exited with $rc"
  grep -q "dtrain run: 2 nodes x 2 ranks through Open MPI: mpirun" "$tmp/out" || fail "no mpirun line"
  n=$(grep -c "of 4 (backend mpi): average = .*, ok" "$tmp/out")
  [ "$n" -eq 4 ] || fail "$n of 4 ranks reported a correct average"
  ;;
config)
  cli=$3 cfg=$4 stage=$5
  # llm.c token files (data.h): 256 int32 header words (magic 20240520,
  # version 1, count), then uint16 tokens; the tokens repeat the period
  # (i % 7) * 5 + (i / 7) % 2 of 14, as test_train_config.c's do.
  mktok() { # mktok FILE BLOCKS
    n=$(($2 * 14))
    {
      printf '\210\330\064\001\001\000\000\000'
      printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $((n % 256)) $((n / 256 % 256)) 0 0)"
      head -c 1012 /dev/zero
      i=0
      while [ $i -lt "$2" ]; do
        printf '\000\000\005\000\012\000\017\000\024\000\031\000\036\000'
        printf '\001\000\006\000\013\000\020\000\025\000\032\000\037\000'
        i=$((i + 1))
      done
    } > "$1"
  }
  mktok "$tmp/train.bin" 215
  mktok "$tmp/val.bin" 43
  train="$cli train --config $cfg --model gpt-micro --vocab-size 40 --n-embd 32 --seq 16 \
    --data tokens:$tmp/train.bin --val-data tokens:$tmp/val.bin --threads 1 --progress plain --max-steps 8 \
    --batch 4 --optimizer adamw --lr 0.01 --log-every 1"
  # both forms in one bed; the second one's line is printed as run
  bash "$bed" --slots 1 --rate 10gbit --tag-file "$tmp/tag" -- sh -c "A=\$(echo \$NETBED_ADDRS | tr ' ' ,); \
    DT_MPIRUN_ARGS=\"\$NETBED_MPI_ARGS -x ASAN_OPTIONS\" $cli run --nnodes 2 --node-rank 0 \
    --master-addr \${A%%,*} --master-port 29500 -n 1 --hosts \$A -- $train --metrics $tmp/run.jsonl \
    > $tmp/out.run 2>&1 || exit 11; \
    set -x; \$NETBED_MPIRUN -np 2 -x ASAN_OPTIONS $train --metrics $tmp/mpi.jsonl > $tmp/out.mpi 2>&1 || exit 12" \
    > "$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  for form in run mpi; do echo "--- $form:"; cat "$tmp/out.$form" 2>/dev/null; done
  [ $rc -eq 77 ] && exit 77
  gone "$tmp/tag"
  [ $rc -eq 11 ] && fail "dtrain run --nnodes 2 ... train --config $cfg on the bed failed"
  [ $rc -eq 12 ] && fail "mpirun ... dtrain train --config $cfg on the bed failed"
  [ $rc -eq 0 ] || fail "the bed exited with $rc"
  grep -Eq "dtrain run: 2 nodes x 1 ranks? through Open MPI: mpirun" "$tmp/out.run" || fail "no mpirun line"
  grep -q "mpirun .*--host [0-9.]*:1,[0-9.]*:1 .*plm_rsh_agent .*btl_tcp_if_include .*oob_tcp_if_include .* -np 2 " \
    "$tmp/out" || fail "the direct mpirun line is not the bed's"
  for form in run mpi; do
    grep -q "ZeRO stage $stage: 2 ranks" "$tmp/out.$form" || fail "$form: no 'ZeRO stage $stage: 2 ranks' line"
    vl=$(sed -n 's/.*val loss: \([0-9.]*\).*/\1/p' "$tmp/out.$form" | tail -1)
    [ -n "$vl" ] || fail "$form: no validation loss"
    awk -v v="$vl" 'BEGIN { exit !(v < log(40) - 0.3) }' || fail "$form: val loss $vl: not below ln 40 - 0.3"
    echo "stage $stage across 2 nodes ($form): val loss $vl"
    sed -n 's/.*"event":"step".*"loss":\([-0-9.e]*\).*/\1/p' "$tmp/$form.jsonl" > "$tmp/$form.loss"
  done
  n=$(wc -l < "$tmp/run.loss")
  [ "$n" -eq 8 ] || fail "dtrain run: $n step losses, expected 8"
  paste "$tmp/run.loss" "$tmp/mpi.loss" | awk '{ d = $1 - $2; if (d < 0) d = -d
      if (NF != 2 || d > 1e-6 * ($1 < 0 ? -$1 : $1)) { print "step " NR ": " $1 " vs " $2; bad = 1 } }
    END { exit bad }' || fail "the two forms' step losses differ"
  echo "stage $stage: mpirun and dtrain run --nnodes give the same $n step losses"
  ;;
bytes)
  cli=$3
  bash "$bed" --slots 2 --rate 10gbit --tag-file "$tmp/tag" -- sh -c "\$NETBED_BYTES > $tmp/b0 &&
    \$NETBED_MPIRUN -np 4 -x DT_HIER_CHUNK_KB=512 -x ASAN_OPTIONS $cli bench coll --algo hier \
      --mem plain --op allreduce --min 4M --max 4M --iters 1 --json > $tmp/json &&
    \$NETBED_BYTES > $tmp/b1" > "$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out" "$tmp/json" 2>/dev/null
  [ $rc -eq 77 ] && exit 77
  gone "$tmp/tag"
  [ $rc -eq 0 ] || fail "the hierarchical bench on the bed exited with $rc"
  n=$(grep -c '"algo":"hier".*"correct":true' "$tmp/json")
  [ "$n" -eq 2 ] || fail "$n of 2 placements hierarchical and correct"
  # 8 all-reduces (per placement: the check, 2 warm-ups, 1 timed) of S = 4 MiB
  paste "$tmp/b0" "$tmp/b1" | awk -v s=$((8 * 4 * 1048576)) '
    { out = $5 - $2; in_ = $6 - $3
      printf "node %d: out %d in %d bytes = %.3f and %.3f x 8 S\n", $1, out, in_, out / s, in_ / s
      if (out < s || out > 1.1 * s || in_ < s || in_ > 1.1 * s) bad = 1 }
    END { exit bad }' || fail "the links did not carry 1.0-1.1 x 8 S each way"
  ;;
traffic)
  prog=$3
  bash "$bed" --nodes 2 --slots 1 --rate 10gbit --tag-file "$tmp/tag" -- sh -c "\$NETBED_MPIRUN -np 2 \
    -x DT_BACKEND=mpi -x DT_COMM_TIMEOUT=60 -x ASAN_OPTIONS $prog bed" > "$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  [ $rc -eq 77 ] && exit 77
  gone "$tmp/tag"
  [ $rc -eq 0 ] || fail "mpi_traffic bed exited with $rc"
  [ "$(grep -c 'mpi_traffic: bed: rank' "$tmp/out")" -eq 2 ] || fail "not both ranks reported"
  ;;
teardown)
  bash "$bed" check
  rc=$?
  [ $rc -eq 77 ] && exit 77
  [ $rc -eq 0 ] || fail "netbed.sh check exited with $rc"
  # 1. a failing command: its status comes back, the bed goes
  bash "$bed" --nodes 3 --tag-file "$tmp/t1" -- sh -c 'exit 3'
  rc=$?
  [ $rc -eq 3 ] || fail "status of a failing command: $rc, expected 3"
  gone "$tmp/t1"
  # 2. a process left running inside a node is ended with the bed
  bash "$bed" --tag-file "$tmp/t2" -- sh -c "sleep 300 & echo \$! > $tmp/pid" || fail "bed 2"
  gone "$tmp/t2"
  pid=$(cat "$tmp/pid")
  [ -n "$pid" ] || fail "no pid"
  i=0 # SIGKILLed; gone once its new parent has reaped it
  while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  kill -0 "$pid" 2>/dev/null && fail "process $pid left running: $(ps -o pid,stat,cmd -p "$pid")"
  # 3. SIGTERM while the command runs
  bash "$bed" --tag-file "$tmp/t3" -- sh -c "echo up > $tmp/ready; sleep 300" &
  bpid=$!
  i=0
  while [ ! -s "$tmp/ready" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
  [ -s "$tmp/ready" ] || fail "the bed did not start its command"
  kill -TERM $bpid
  wait $bpid
  rc=$?
  [ $rc -eq 143 ] || fail "status after SIGTERM: $rc, expected 143"
  gone "$tmp/t3"
  # 4. a bed whose script was SIGKILLed is removed by the next bed
  bash "$bed" --tag-file "$tmp/t4" -- sh -c "echo up > $tmp/ready4; sleep 300" &
  bpid=$!
  i=0
  while [ ! -s "$tmp/ready4" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
  kill -KILL $bpid
  wait $bpid 2>/dev/null
  # (a bed started meanwhile by a parallel test may have removed it already)
  bash "$bed" --tag-file "$tmp/t5" -- true || fail "bed 5"
  gone "$tmp/t4"
  gone "$tmp/t5"
  ;;
*)
  fail "unknown mode '$mode'"
  ;;
esac
echo "ok"
