# The strided row copy again on the memcpy fallback (no AVX2).
if(TARGET test_copy_rows)
  add_test(NAME isa_scalar/test_copy_rows COMMAND test_copy_rows)
  set_tests_properties(isa_scalar/test_copy_rows PROPERTIES TIMEOUT 300 LABELS "base;isa"
    ENVIRONMENT "DT_MAX_CPU_ISA=scalar")
endif()
