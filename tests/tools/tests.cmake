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
  set_tests_properties(tools/test_fault_matrix PROPERTIES LABELS "tools;slow")
endif()
# The seed configs on every zoo model (test_train_seed_models.c) also run
# under mpirun when it was found.
if(TARGET test_train_seed_models AND DT_HAVE_MPI AND DT_MPIEXEC)
  target_compile_definitions(test_train_seed_models PRIVATE DT_MPIEXEC="${DT_MPIEXEC}")
endif()
