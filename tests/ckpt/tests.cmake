# The checksum tests again with the SSE4.2 CRC-32C capped off: the table
# path then writes and verifies every checkpoint of the test.
if(TARGET test_checksum)
  add_test(NAME isa_scalar/test_checksum COMMAND test_checksum)
  set_tests_properties(isa_scalar/test_checksum PROPERTIES TIMEOUT 300 LABELS "ckpt;isa"
    ENVIRONMENT "DT_MAX_CPU_ISA=scalar")
endif()
