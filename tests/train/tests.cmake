# A failing pipeline stage over MPI (tests/train/mpi_pipe_fail.c): the
# shm case is test_pipe_train_mlp's mlp_failing_stage; this one runs under
# mpirun -np 4 (dp 2 x pp 2), where the failure reaches the other ranks
# through the MPI backend's failure notices. The groups' timeout is 60 s, so
# a failure that is not passed on makes each schedule wait that long.
if(DT_HAVE_MPI AND DT_MPIEXEC)
  add_executable(mpi_pipe_fail ${CMAKE_CURRENT_LIST_DIR}/mpi_pipe_fail.c)
  set_target_properties(mpi_pipe_fail PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(mpi_pipe_fail PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes -Wno-unused-variable) # test.h's counters
  target_compile_definitions(mpi_pipe_fail PRIVATE _GNU_SOURCE DT_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    DT_BINARY_DIR="${PROJECT_BINARY_DIR}")
  target_include_directories(mpi_pipe_fail PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(mpi_pipe_fail PRIVATE dtrain_static)
  add_test(NAME train/mpi_pipe_fail_np4
           COMMAND ${DT_MPIEXEC} --allow-run-as-root --oversubscribe --bind-to none -np 4
                   $<TARGET_FILE:mpi_pipe_fail>)
  set_tests_properties(train/mpi_pipe_fail_np4 PROPERTIES TIMEOUT 120 LABELS "train;mpi"
    ENVIRONMENT "DT_BACKEND=mpi;DT_EXPECT_BACKEND=mpi;DT_COMM_TIMEOUT=60;OMP_NUM_THREADS=1;ASAN_OPTIONS=detect_leaks=0")
endif()
