# The lazy zero of bf16 gradients once more with oneDNN and dtrain capped at
# AVX2 (no AVX512_BF16: the bf16 GEMMs widen to f32 and write the gradient
# accumulators through the emulated path). On a CPU without AVX-512 the
# default registration already runs that path.
if(TARGET test_lazy_grad)
  add_test(NAME isa_avx2/test_lazy_grad
    COMMAND sh -c "grep -qw avx512f /proc/cpuinfo || { echo 'no AVX-512 on this CPU: the default registration already runs the AVX2 paths'; exit 77; }; exec \"$0\"" $<TARGET_FILE:test_lazy_grad>)
  set_tests_properties(isa_avx2/test_lazy_grad PROPERTIES TIMEOUT 300 LABELS "nn;isa" SKIP_RETURN_CODE 77
    ENVIRONMENT "ONEDNN_MAX_CPU_ISA=AVX2;DT_MAX_CPU_ISA=avx2")
endif()
