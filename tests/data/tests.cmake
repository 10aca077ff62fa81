# Extra CTest properties for the data layer and `dtrain train`.
# test_train_run trains real models through the CLI (label slow; `ctest -LE
# slow` skips it for a quick pass). make test runs it in both passes: under
# ASan+UBSan it took 11 s here (quiet machine).
if(TEST tools/test_train_run)
  set_tests_properties(tools/test_train_run PROPERTIES LABELS "tools;slow")
endif()
