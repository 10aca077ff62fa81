# The two-rank CLI runs take ~12 s in a release build and several times
# that under the sanitizers: keep them out of the ASan pass (label nosan).
if(TEST parallel/test_train_ddp_cli)
  set_tests_properties(parallel/test_train_ddp_cli PROPERTIES LABELS "parallel;nosan")
endif()
