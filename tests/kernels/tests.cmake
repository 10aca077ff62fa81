# The convolution tests once more with oneDNN's plain NCHW layouts (the
# default run uses the blocked layouts oneDNN prefers, with reorders).
if(TARGET test_conv)
  add_test(NAME kernels/test_conv_plain COMMAND test_conv)
  set_tests_properties(kernels/test_conv_plain PROPERTIES TIMEOUT 300 LABELS kernels
    ENVIRONMENT "DT_CONV_LAYOUT=plain")
endif()
