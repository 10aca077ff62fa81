# The fault-injection matrix (test_fault_matrix.c) runs fault_prog, a small
# two-rank program with a fault injected on one rank, under `dtrain run`
# (shm) and under mpirun (mpi, when found: DT_MPIEXEC is passed on).
add_executable(fault_prog ${CMAKE_CURRENT_LIST_DIR}/fault_prog.c)
set_target_properties(fault_prog PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
target_compile_options(fault_prog PRIVATE ${DT_WARNINGS})
target_compile_definitions(fault_prog PRIVATE _GNU_SOURCE)
target_link_libraries(fault_prog PRIVATE dtrain_static)
if(TARGET test_fault_matrix)
  add_dependencies(test_fault_matrix fault_prog)
  if(DT_HAVE_MPI AND DT_MPIEXEC)
    target_compile_definitions(test_fault_matrix PRIVATE DT_MPIEXEC="${DT_MPIEXEC}")
  endif()
  set_tests_properties(tools/test_fault_matrix PROPERTIES LABELS "tools;slow;idle")
endif()

# bench/compare.sh (the regression guard) in its quick mode, HEAD against
# HEAD: builds HEAD's CLI once into the build tree (ccache makes it quick)
# and checks the output's format; skipped without git history.
add_test(NAME tools/compare_quick
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/compare_quick.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/compare-quick)
set_tests_properties(tools/compare_quick PROPERTIES TIMEOUT 900 LABELS "tools;slow" SKIP_RETURN_CODE 77
  ENVIRONMENT "OPENBLAS_CORETYPE=SkylakeX")

# bench/first_step.sh (time to the first step, against another build and
# transformers) on gpt-micro against itself: the output's format, a failing
# dtrain named, bad options exit 2.
add_test(NAME tools/first_step_quick
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/first_step_quick.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/dtrain)
set_tests_properties(tools/first_step_quick PROPERTIES TIMEOUT 300 LABELS "tools" SKIP_RETURN_CODE 77)

# bench/speed_targets.sh's verdicts with a stand-in dtrain: met, NOT met, and
# disturbed when other processes took the CPUs during a row (counters from
# DT_STAT_DIR, advanced by the stand-in).
add_test(NAME tools/speed_targets_quick
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/speed_targets_quick.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(tools/speed_targets_quick PROPERTIES TIMEOUT 120 LABELS "tools")

# The bench scripts with a stand-in dtrain and PyTorch that fail at once:
# each names the failed run and exits non-zero (accuracy_seeds.sh,
# gpt2_bf16_peer.sh, scripts/bench.sh, trace_overhead.sh, pipe_memory.sh).
add_test(NAME tools/bench_failures
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/bench_failures.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(tools/bench_failures PROPERTIES TIMEOUT 120 LABELS "tools" SKIP_RETURN_CODE 77)

# signal_shim.so: preloaded by test_proc_safety into other test programs, it
# makes fork/forkpty fail and refuses (and logs) any signal sent outside the
# program's own process tree.
add_library(dt_signal_shim MODULE ${CMAKE_CURRENT_LIST_DIR}/signal_shim.c)
set_target_properties(dt_signal_shim PROPERTIES PREFIX "lib" LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
target_compile_options(dt_signal_shim PRIVATE ${DT_WARNINGS})
target_link_libraries(dt_signal_shim PRIVATE ${CMAKE_DL_LIBS})
if(TARGET test_proc_safety)
  add_dependencies(test_proc_safety dt_signal_shim test_progress_tty test_help test_comm_fail)
endif()

# The rule of tests/proc.h, checked on the tree: no test calls fork, forkpty,
# kill, killpg or waitpid directly (a line may opt out with "dt-proc-ok").
add_test(NAME tools/proc_rules COMMAND sh -c
  "hits=$(grep -rnE '(^|[^_a-zA-Z0-9.>])(fork|forkpty|kill|killpg|waitpid)[(]' --include=*.c --include=*.h tests | grep -v -e '^tests/proc.h:' -e '^tests/tools/signal_shim.c:' -e 'dt-proc-ok'); if [ -n \"$hits\" ]; then echo 'raw process calls in tests (use tests/proc.h):'; echo \"$hits\"; exit 1; fi; echo '1 passed, 0 failed'"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(tools/proc_rules PROPERTIES LABELS tools)

# The library used from the build tree (no install): examples/quickstart.c
# compiled against build/ through build/dtrain.pc and through
# build/dtrainConfig.cmake + the exported dtrainTargets.cmake.
add_test(NAME tools/build_tree_consumer
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/build_tree_consumer.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
set_tests_properties(tools/build_tree_consumer PROPERTIES TIMEOUT 240 LABELS "tools;install")

# The seed configs on every zoo model (test_train_seed_models.c) also run
# under mpirun when it was found.
if(TARGET test_train_seed_models AND DT_HAVE_MPI AND DT_MPIEXEC)
  target_compile_definitions(test_train_seed_models PRIVATE DT_MPIEXEC="${DT_MPIEXEC}")
endif()

# The two-rank CLI runs are among the slowest tests (label slow;
# `ctest -LE slow` skips them for a quick pass). make test runs them in both
# passes: under ASan+UBSan they took 3 s here (quiet machine).
if(TEST tools/test_train_ddp_cli)
  set_property(TEST tools/test_train_ddp_cli APPEND PROPERTY LABELS slow)
endif()
if(TEST tools/test_train_zero_cli)
  set_property(TEST tools/test_train_zero_cli APPEND PROPERTY LABELS slow)
endif()

# bench/isa_peak (the vector and matrix units' instruction limits) runs
# briefly: a line for every path, the AMX ones run where the CPU has AMX.
add_test(NAME tools/isa_peak_quick
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/isa_peak_quick.sh ${PROJECT_BINARY_DIR}/bench/isa_peak)
set_tests_properties(tools/isa_peak_quick PROPERTIES TIMEOUT 120 LABELS "tools" SKIP_RETURN_CODE 77)
