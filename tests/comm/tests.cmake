# Collective tests under mpirun (owned by the launcher/MPI side; the comm
# layer's own tests are fork-based test_*.c files registered by the root
# CMakeLists). tests/comm/mpi_coll.c is built only when MPI is found and run
# as `mpirun -np N` for N = 1, 2, 3, 4, 8 on the `mpi` backend (forced with
# DT_BACKEND=mpi, since a group of one defaults to `self`), and again with
# every collective through the blocking MPI calls (DT_MPI_BLOCKING=1). The
# example programs run under mpirun unchanged on the default backend. Label `mpi`; under the
# sanitizers Open MPI's own allocations are not leak-checked.
if(DT_HAVE_MPI AND DT_MPIEXEC)
  add_executable(mpi_coll ${CMAKE_CURRENT_LIST_DIR}/mpi_coll.c)
  set_target_properties(mpi_coll PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_coll PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_compile_definitions(mpi_coll PRIVATE _GNU_SOURCE)
  target_include_directories(mpi_coll PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(mpi_coll PRIVATE dtrain_static)
  set(DT_MPIRUN_FLAGS --allow-run-as-root --oversubscribe --bind-to none)
  foreach(np 1 2 3 4 8)
    add_test(NAME comm/mpi_coll_np${np}
             COMMAND ${DT_MPIEXEC} ${DT_MPIRUN_FLAGS} -np ${np} $<TARGET_FILE:mpi_coll>)
    set_tests_properties(comm/mpi_coll_np${np} PROPERTIES TIMEOUT 240 LABELS "comm;mpi"
      ENVIRONMENT "DT_BACKEND=mpi;DT_EXPECT_BACKEND=mpi;DT_COMM_TIMEOUT=60;ASAN_OPTIONS=detect_leaks=0")
  endforeach()
  foreach(np 2 3)
    add_test(NAME comm/mpi_coll_blocking_np${np}
             COMMAND ${DT_MPIEXEC} ${DT_MPIRUN_FLAGS} -np ${np} $<TARGET_FILE:mpi_coll>)
    set_tests_properties(comm/mpi_coll_blocking_np${np} PROPERTIES TIMEOUT 240 LABELS "comm;mpi"
      ENVIRONMENT "DT_EXPECT_BACKEND=mpi;DT_MPI_BLOCKING=1;DT_COMM_TIMEOUT=60;ASAN_OPTIONS=detect_leaks=0")
  endforeach()
  # Failing a group on purpose (dt_pg_fail, what the pipeline does when a
  # rank breaks off its schedule) reaches the other ranks at once, with the
  # failing rank's status and message (tests/comm/mpi_fail.c): over MPI
  # (nonblocking, DT_MPI_BLOCKING=1, and MPI initialised by the program at
  # MPI_THREAD_SERIALIZED) and over shm under `dtrain run`, the same strings.
  # The group timeout is 30 s: a failure that is not passed on shows as a
  # wait of 30 s (the test allows 10).
  add_executable(mpi_fail ${CMAKE_CURRENT_LIST_DIR}/mpi_fail.c)
  set_target_properties(mpi_fail PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_fail PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_compile_definitions(mpi_fail PRIVATE _GNU_SOURCE)
  target_include_directories(mpi_fail PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(mpi_fail PRIVATE dtrain_static)
  foreach(v "np3;" "blocking_np3;DT_MPI_BLOCKING=1" "serialized_np3;DT_MPI_BLOCKING=0")
    list(GET v 0 name)
    list(GET v 1 extra)
    set(args "")
    if(name MATCHES "serialized")
      set(args serialized)
    endif()
    add_test(NAME comm/mpi_fail_${name}
             COMMAND ${DT_MPIEXEC} ${DT_MPIRUN_FLAGS} -np 3 $<TARGET_FILE:mpi_fail> ${args})
    set_tests_properties(comm/mpi_fail_${name} PROPERTIES TIMEOUT 60 LABELS "comm;mpi"
      ENVIRONMENT "DT_BACKEND=mpi;DT_EXPECT_BACKEND=mpi;DT_COMM_TIMEOUT=30;${extra};ASAN_OPTIONS=detect_leaks=0")
  endforeach()
  add_test(NAME comm/mpi_fail_shm_run
           COMMAND ${PROJECT_BINARY_DIR}/dtrain run -n 3 -- $<TARGET_FILE:mpi_fail>)
  set_tests_properties(comm/mpi_fail_shm_run PROPERTIES TIMEOUT 60 LABELS "comm;mpi"
    ENVIRONMENT "DT_BACKEND=shm;DT_EXPECT_BACKEND=shm;DT_COMM_TIMEOUT=30;ASAN_OPTIONS=detect_leaks=0")
  # The flight recorder names a stopped rank (tests/comm/mpi_flight.c):
  # under mpirun (the peers ask each other point to point) and under
  # `dtrain run` (shm: the stopped rank's state is read from the segment).
  # Under mpirun each MPI_Test of a wait's spinning phase naps 3 ms, as on a
  # loaded machine (DT_FAULT_MPI_TEST_NAP_US): the timeout must still come
  # 3 s after the post, not after 2000 such tests.
  add_executable(mpi_flight ${CMAKE_CURRENT_LIST_DIR}/mpi_flight.c)
  set_target_properties(mpi_flight PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_flight PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_compile_definitions(mpi_flight PRIVATE _GNU_SOURCE)
  target_include_directories(mpi_flight PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(mpi_flight PRIVATE dtrain_static)
  add_test(NAME comm/mpi_flight_np3
           COMMAND ${DT_MPIEXEC} ${DT_MPIRUN_FLAGS} -np 3 $<TARGET_FILE:mpi_flight>)
  set_tests_properties(comm/mpi_flight_np3 PROPERTIES TIMEOUT 60 LABELS "comm;mpi;idle"
    PASS_REGULAR_EXPRESSION "mpi_flight: 3 ranks, backend mpi: ok" FAIL_REGULAR_EXPRESSION "FAILED"
    ENVIRONMENT "DT_BACKEND=mpi;DT_EXPECT_BACKEND=mpi;DT_COMM_TIMEOUT=3;DT_INIT_TIMEOUT=60;DT_FAULT_MPI_TEST_NAP_US=3000;ASAN_OPTIONS=detect_leaks=0")
  add_test(NAME comm/mpi_flight_shm_run
           COMMAND ${PROJECT_BINARY_DIR}/dtrain run -n 3 -- $<TARGET_FILE:mpi_flight>)
  set_tests_properties(comm/mpi_flight_shm_run PROPERTIES TIMEOUT 60 LABELS "comm;mpi;idle"
    PASS_REGULAR_EXPRESSION "mpi_flight: 3 ranks, backend shm: ok" FAIL_REGULAR_EXPRESSION "FAILED"
    ENVIRONMENT "DT_BACKEND=shm;DT_EXPECT_BACKEND=shm;DT_COMM_TIMEOUT=3;DT_INIT_TIMEOUT=60;ASAN_OPTIONS=detect_leaks=0")
  # MPI_Init and group creation under the timeout (tests/comm/mpi_timeouts.c).
  add_executable(mpi_timeouts ${CMAKE_CURRENT_LIST_DIR}/mpi_timeouts.c)
  set_target_properties(mpi_timeouts PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_timeouts PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_compile_definitions(mpi_timeouts PRIVATE _GNU_SOURCE)
  target_link_libraries(mpi_timeouts PRIVATE dtrain_static)
  # (blocking: without the collective check, whose nonblocking all-reduce
  # would time out before the blocking call is reached)
  # The start-up has its own bound (DT_INIT_TIMEOUT): 60 s where the test is
  # about a later operation (MPI_Init of 3 processes can take seconds on a
  # loaded machine or in a container), 4 s where it is about the start-up.
  foreach(v "init;2;init: rank 0 ok;DT_MPI_BLOCKING=0;DT_COMM_CHECK=1;DT_INIT_TIMEOUT=4"
            "split;3;split: rank 0 ok;DT_MPI_BLOCKING=0;DT_COMM_CHECK=1;DT_INIT_TIMEOUT=60"
            "blocking;3;blocking: rank 0 ok;DT_MPI_BLOCKING=1;DT_COMM_CHECK=0;DT_INIT_TIMEOUT=60"
            "h2h;2;h2h: rank 0 ok;DT_MPI_BLOCKING=0;DT_COMM_CHECK=1;DT_INIT_TIMEOUT=60")
    list(GET v 0 mode)
    list(GET v 1 np)
    list(GET v 2 pass)
    list(GET v 3 e1)
    list(GET v 4 e2)
    list(GET v 5 e3)
    set(extra "${e1};${e2};${e3}")
    add_test(NAME comm/mpi_timeout_${mode}
             COMMAND ${DT_MPIEXEC} ${DT_MPIRUN_FLAGS} -np ${np} $<TARGET_FILE:mpi_timeouts> ${mode})
    set_tests_properties(comm/mpi_timeout_${mode} PROPERTIES TIMEOUT 60 LABELS "comm;mpi"
      PASS_REGULAR_EXPRESSION "${pass}" FAIL_REGULAR_EXPRESSION "FAILED"
      ENVIRONMENT "DT_BACKEND=mpi;DT_COMM_TIMEOUT=2;${extra};ASAN_OPTIONS=detect_leaks=0")
  endforeach()
  # (these three mostly wait for their timeouts to expire)
  set_tests_properties(comm/mpi_timeout_init comm/mpi_timeout_split comm/mpi_timeout_blocking
    PROPERTIES LABELS "comm;mpi;idle")
  add_test(NAME comm/mpi_timeout_h2h_shm_run
           COMMAND ${PROJECT_BINARY_DIR}/dtrain run -n 2 -- $<TARGET_FILE:mpi_timeouts> h2h)
  set_tests_properties(comm/mpi_timeout_h2h_shm_run PROPERTIES TIMEOUT 60 LABELS "comm;mpi"
    PASS_REGULAR_EXPRESSION "h2h: rank 0 ok" FAIL_REGULAR_EXPRESSION "FAILED"
    ENVIRONMENT "DT_BACKEND=shm;DT_COMM_TIMEOUT=2;DT_INIT_TIMEOUT=60;ASAN_OPTIONS=detect_leaks=0")
  # The example programs run unchanged under mpirun.
  add_test(NAME comm/mpi_example_allreduce
           COMMAND ${DT_MPIEXEC} ${DT_MPIRUN_FLAGS} -np 3 ${PROJECT_BINARY_DIR}/examples/example_allreduce)
  set_tests_properties(comm/mpi_example_allreduce PROPERTIES TIMEOUT 120 LABELS "comm;mpi"
    PASS_REGULAR_EXPRESSION "rank 2 of 3 \\(backend mpi\\): average = 2, ok"
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
  # Choosing `mpi` outside mpirun is an error that says what to do, not a hang.
  add_test(NAME comm/mpi_backend_outside_mpirun
           COMMAND ${PROJECT_BINARY_DIR}/dtrain run -n 2 -- ${PROJECT_BINARY_DIR}/examples/example_allreduce)
  set_tests_properties(comm/mpi_backend_outside_mpirun PROPERTIES TIMEOUT 120 LABELS "comm;mpi"
    PASS_REGULAR_EXPRESSION "MPI says rank [01] of 1 but the group was set up as rank [01] of 2"
    ENVIRONMENT "DT_BACKEND=mpi;ASAN_OPTIONS=detect_leaks=0")
endif()

# Hierarchical all-reduce under mpirun: simulated nodes (2 x 2 ranks) on a
# plain mpirun, and real "nodes" (network namespaces) on the test bed of
# scripts/netbed.sh: 2 nodes x 1 rank (stays flat) and 2 x 2 (two levels),
# each compared with the flat all-reduce. The bed tests also check that the
# bed's namespaces and links are gone afterwards; they skip (77) where the
# machine cannot create namespaces. comm/netbed_teardown checks teardown
# after a failing command and after SIGTERM.
if(DT_HAVE_MPI AND DT_MPIEXEC)
  add_executable(mpi_hier ${CMAKE_CURRENT_LIST_DIR}/mpi_hier.c)
  set_target_properties(mpi_hier PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_hier PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_compile_definitions(mpi_hier PRIVATE _GNU_SOURCE)
  target_include_directories(mpi_hier PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(mpi_hier PRIVATE dtrain_static)
  add_test(NAME comm/mpi_hier_sim_2x2
           COMMAND ${DT_MPIEXEC} --allow-run-as-root --oversubscribe --bind-to none -np 4
                   $<TARGET_FILE:mpi_hier>)
  set_tests_properties(comm/mpi_hier_sim_2x2 PROPERTIES TIMEOUT 120 LABELS "comm;mpi"
    PASS_REGULAR_EXPRESSION "mpi_hier: 4 ranks, backend mpi, simulated nodes: ok"
    ENVIRONMENT "DT_SIM_LOCAL_SIZE=2;DT_EXPECT_NODES=2;DT_EXPECT_PER_NODE=2;DT_COMM_TIMEOUT=60;ASAN_OPTIONS=detect_leaks=0")
  add_test(NAME comm/netbed_run_nnodes
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/netbed_test.sh run ${PROJECT_SOURCE_DIR}
                   ${PROJECT_BINARY_DIR}/dtrain ${PROJECT_BINARY_DIR}/examples/example_allreduce)
  set_tests_properties(comm/netbed_run_nnodes PROPERTIES TIMEOUT 120 LABELS "comm;mpi;netbed"
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
  # the hierarchical all-reduce's bytes on the links (tc counters)
  add_test(NAME comm/netbed_hier_bytes
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/netbed_test.sh bytes ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/dtrain)
  set_tests_properties(comm/netbed_hier_bytes PROPERTIES TIMEOUT 120 LABELS "comm;mpi;netbed"
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
  # seed 003's DeepSpeed configs across the bed's 2 nodes (issue 18): under dtrain run --nnodes 2 and under
  # the bed's mpirun started directly, the same step losses
  foreach(seed "zero2_actckpt;2" "zero3_offload_fixed;3")
    list(GET seed 0 cfg)
    list(GET seed 1 stage)
    add_test(NAME comm/netbed_config_${cfg}
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/netbed_test.sh config ${PROJECT_SOURCE_DIR}
                     ${PROJECT_BINARY_DIR}/dtrain ${PROJECT_SOURCE_DIR}/tests/config/data/seed_${cfg}.json ${stage})
    set_tests_properties(comm/netbed_config_${cfg} PROPERTIES TIMEOUT 120 LABELS "comm;mpi;netbed"
      ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
  endforeach()
  foreach(shape "2;1" "2;2")
    list(GET shape 0 nn)
    list(GET shape 1 pn)
    add_test(NAME comm/netbed_hier_${nn}x${pn}
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/netbed_test.sh hier ${PROJECT_SOURCE_DIR} $<TARGET_FILE:mpi_hier> ${nn} ${pn})
    set_tests_properties(comm/netbed_hier_${nn}x${pn} PROPERTIES TIMEOUT 120 LABELS "comm;mpi;netbed"
      ENVIRONMENT "DT_COMM_TIMEOUT=60;ASAN_OPTIONS=detect_leaks=0")
  endforeach()
endif()
add_test(NAME comm/netbed_teardown
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/netbed_test.sh teardown ${PROJECT_SOURCE_DIR})
set_tests_properties(comm/netbed_teardown PROPERTIES TIMEOUT 60 LABELS "comm;netbed")

# A rank SIGKILLed under mpirun (the documented line: mpirun --mca
# odls_base_sigkill_timeout 10) is named by the survivors as
# DT_ERR_PEER_FAILED (tests/comm/deadrank_test.sh): inside an all-reduce
# (tests/comm/mpi_deadrank.c; also with DT_MPI_BLOCKING=1, the blocking call
# on its worker thread) and between two steps of `dtrain train`. Label
# slow: each waits out mpirun's 10-second kill timeout.
if(DT_HAVE_MPI AND DT_MPIEXEC)
  add_executable(mpi_deadrank ${CMAKE_CURRENT_LIST_DIR}/mpi_deadrank.c)
  set_target_properties(mpi_deadrank PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_deadrank PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_compile_definitions(mpi_deadrank PRIVATE _GNU_SOURCE)
  target_include_directories(mpi_deadrank PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(mpi_deadrank PRIVATE dtrain_static)
  add_test(NAME comm/mpi_deadrank_coll
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/deadrank_test.sh coll ${DT_MPIEXEC} $<TARGET_FILE:mpi_deadrank>)
  add_test(NAME comm/mpi_deadrank_coll_blocking
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/deadrank_test.sh coll ${DT_MPIEXEC} $<TARGET_FILE:mpi_deadrank>)
  add_test(NAME comm/mpi_deadrank_train
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/deadrank_test.sh train ${DT_MPIEXEC} ${PROJECT_BINARY_DIR}/dtrain)
  set_tests_properties(comm/mpi_deadrank_coll comm/mpi_deadrank_coll_blocking comm/mpi_deadrank_train
    PROPERTIES TIMEOUT 120 LABELS "comm;mpi;slow;idle" SKIP_RETURN_CODE 77)
  set_tests_properties(comm/mpi_deadrank_coll_blocking PROPERTIES ENVIRONMENT "DT_MPI_BLOCKING=1")
endif()

# A failure notice that overtakes the last messages of a collective its
# sender completed does not fail that collective where it arrives
# (tests/comm/mpi_note_overtake.c; the backend's test hook makes rank 2 look
# late at its all-reduce #1, which train/mpi_pipe_fail_np4 hit by chance
# under load).
if(DT_HAVE_MPI AND DT_MPIEXEC)
  add_executable(mpi_note_overtake ${CMAKE_CURRENT_LIST_DIR}/mpi_note_overtake.c)
  set_target_properties(mpi_note_overtake PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_note_overtake PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_compile_definitions(mpi_note_overtake PRIVATE _GNU_SOURCE)
  target_include_directories(mpi_note_overtake PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(mpi_note_overtake PRIVATE dtrain_static)
  # (nonblocking collectives only, the hook sits in their waiting loop;
  # without the collective check, whose all-reduce the hook would hold)
  add_test(NAME comm/mpi_note_overtake_np3
           COMMAND ${DT_MPIEXEC} --allow-run-as-root --oversubscribe --bind-to none -np 3
                   $<TARGET_FILE:mpi_note_overtake>)
  set_tests_properties(comm/mpi_note_overtake_np3 PROPERTIES TIMEOUT 60 LABELS "comm;mpi"
    PASS_REGULAR_EXPRESSION "mpi_note_overtake: 3 ranks: ok" FAIL_REGULAR_EXPRESSION "FAILED"
    ENVIRONMENT "DT_BACKEND=mpi;DT_MPI_BLOCKING=0;DT_COMM_CHECK=0;DT_COMM_TIMEOUT=30;DT_FAULT_MPI_LATE_RANK=2;DT_FAULT_MPI_LATE_SEQ=1;ASAN_OPTIONS=detect_leaks=0")
endif()

# The mpi backend's byte counters (tests/comm/mpi_traffic.c): Open MPI's
# monitoring layer on (exact counts of a send, an all-reduce's bytes, a
# duplicate group's traffic in the world's counts; DT_SIM_LOCAL_SIZE=1
# makes the 2 ranks 2 nodes, so all of it is cross-node) and off (not
# counted).
if(DT_HAVE_MPI AND DT_MPIEXEC)
  add_executable(mpi_traffic ${CMAKE_CURRENT_LIST_DIR}/mpi_traffic.c)
  set_target_properties(mpi_traffic PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_traffic PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_compile_definitions(mpi_traffic PRIVATE _GNU_SOURCE)
  target_link_libraries(mpi_traffic PRIVATE dtrain_static)
  add_test(NAME comm/mpi_traffic_on
           COMMAND ${DT_MPIEXEC} --allow-run-as-root --oversubscribe --bind-to none
                   --mca pml_monitoring_enable 1 -np 2 $<TARGET_FILE:mpi_traffic> on)
  add_test(NAME comm/mpi_traffic_off
           COMMAND ${DT_MPIEXEC} --allow-run-as-root --oversubscribe --bind-to none
                   -np 2 $<TARGET_FILE:mpi_traffic> off)
  set_tests_properties(comm/mpi_traffic_on PROPERTIES SKIP_RETURN_CODE 77)
  add_test(NAME comm/netbed_traffic
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/netbed_test.sh traffic ${PROJECT_SOURCE_DIR} $<TARGET_FILE:mpi_traffic>)
  set_tests_properties(comm/netbed_traffic PROPERTIES TIMEOUT 120 LABELS "comm;mpi;netbed" SKIP_RETURN_CODE 77
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
  set_tests_properties(comm/mpi_traffic_on comm/mpi_traffic_off PROPERTIES TIMEOUT 120 LABELS "comm;mpi"
    ENVIRONMENT "DT_BACKEND=mpi;DT_SIM_LOCAL_SIZE=1;DT_COMM_TIMEOUT=60;ASAN_OPTIONS=detect_leaks=0")
endif()
