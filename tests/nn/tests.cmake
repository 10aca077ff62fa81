# The lazy zero of bf16 gradients once more with oneDNN and dtrain capped at
# AVX2 (no AVX512_BF16: the bf16 GEMMs widen to f32 and write the gradient
# accumulators through the emulated path). On a CPU without AVX-512 the
# default registration already runs that path.
# And once more with every bf16 product on dtrain's AMX GEMM
# (DT_AMX_GEMM=on): the tied table's gradient then takes the head GEMM's
# kept rows (dt_k_matmul_lp_rows); the test checks that it did, and the
# same bits.
if(TARGET test_lazy_grad)
  dt_add_cpu_test(isa_avx2/test_lazy_grad test_lazy_grad avx512f
    "no AVX-512 on this CPU: the default registration already runs the AVX2 paths"
    TIMEOUT 300 LABELS nn isa ENVIRONMENT ONEDNN_MAX_CPU_ISA=AVX2 DT_MAX_CPU_ISA=avx2)
  dt_add_cpu_test(amx/test_lazy_grad test_lazy_grad amx_bf16 "no AMX on this CPU: the kept rows need dtrain AMX GEMM"
    TIMEOUT 300 LABELS nn isa ENVIRONMENT DT_AMX_GEMM=on)
endif()
