# The convolution tests once more under each layout policy: plain NCHW
# everywhere, and oneDNN's blocked layouts everywhere (the default "auto"
# mixes them by shape; see src/kernels/conv.c).
if(TARGET test_conv)
  foreach(layout plain blocked)
    add_test(NAME kernels/test_conv_${layout} COMMAND test_conv)
    set_tests_properties(kernels/test_conv_${layout} PROPERTIES TIMEOUT 300 LABELS kernels
      ENVIRONMENT "DT_CONV_LAYOUT=${layout}")
  endforeach()
endif()
