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

# Once more with every bf16 product on dtrain's AMX GEMM (DT_AMX_GEMM=on):
# the tied table's gradient then takes the head GEMM's kept rows
# (dt_k_matmul_lp_rows); the test checks that it did, and the same bits.
if(TARGET test_lazy_grad)
  add_test(NAME amx/test_lazy_grad
    COMMAND sh -c "grep -qw amx_bf16 /proc/cpuinfo || { echo 'no AMX on this CPU: the kept rows need dtrain AMX GEMM'; exit 77; }; exec \"$0\"" $<TARGET_FILE:test_lazy_grad>)
  set_tests_properties(amx/test_lazy_grad PROPERTIES TIMEOUT 300 LABELS "nn;isa" SKIP_RETURN_CODE 77
    ENVIRONMENT "DT_AMX_GEMM=on")
endif()
