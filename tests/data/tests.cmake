# Extra CTest properties for the data layer and `dtrain train`.
# test_train_run trains real models through the CLI: too slow for the
# ASan+UBSan pass (`make test-asan` runs ctest -LE nosan).
if(TEST tools/test_train_run)
  set_tests_properties(tools/test_train_run PROPERTIES LABELS "tools;nosan")
endif()
