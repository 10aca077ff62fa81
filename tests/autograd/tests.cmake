# test_nomalloc counts the allocations of dtrain's own code by wrapping the
# allocator at link time.
if(TARGET test_nomalloc)
  target_link_options(test_nomalloc PRIVATE
    -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc -Wl,--wrap=aligned_alloc)
endif()

# The low-precision ops once more on the scalar conversion kernels (the
# default registration runs this CPU's best vector path, AVX2 or AVX-512);
# with AVX-512 the AVX2 path runs too. The bounds do not change: every
# path rounds bit-identically.
if(TARGET test_lowp)
  add_test(NAME isa_scalar/test_lowp COMMAND test_lowp)
  set_tests_properties(isa_scalar/test_lowp PROPERTIES TIMEOUT 300 LABELS "autograd;isa"
    ENVIRONMENT "DT_MAX_CPU_ISA=scalar")
  dt_add_cpu_test(isa_avx2/test_lowp test_lowp avx512f "no AVX-512 on this CPU: the default registration already runs the AVX2 paths"
    TIMEOUT 300 LABELS autograd isa ENVIRONMENT ONEDNN_MAX_CPU_ISA=AVX2 DT_MAX_CPU_ISA=avx2)
endif()

# Attention over a bf16/f16 qkv: the test itself walks every ISA path the
# CPU allows (dt_k_set_isa); once more with the cap at scalar and at avx2.
if(TARGET test_attention_lp)
  add_test(NAME isa_scalar/test_attention_lp COMMAND test_attention_lp)
  set_tests_properties(isa_scalar/test_attention_lp PROPERTIES TIMEOUT 300 LABELS "autograd;isa"
    ENVIRONMENT "DT_MAX_CPU_ISA=scalar")
  add_test(NAME isa_avx2/test_attention_lp COMMAND test_attention_lp)
  set_tests_properties(isa_avx2/test_attention_lp PROPERTIES TIMEOUT 300 LABELS "autograd;isa"
    ENVIRONMENT "ONEDNN_MAX_CPU_ISA=AVX2;DT_MAX_CPU_ISA=avx2")
endif()

# The conversion-free cross-entropy and gradient shadows once more on the
# scalar conversion kernels and, with AVX-512, on the AVX2 ones (oneDNN
# capped too); the test also switches dt_k_set_isa over every path itself.
if(TARGET test_grad_lp)
  add_test(NAME isa_scalar/test_grad_lp COMMAND test_grad_lp)
  set_tests_properties(isa_scalar/test_grad_lp PROPERTIES TIMEOUT 300 LABELS "autograd;isa"
    ENVIRONMENT "DT_MAX_CPU_ISA=scalar")
  dt_add_cpu_test(isa_avx2/test_grad_lp test_grad_lp avx512f "no AVX-512 on this CPU: the default registration already runs the AVX2 paths"
    TIMEOUT 300 LABELS autograd isa ENVIRONMENT ONEDNN_MAX_CPU_ISA=AVX2 DT_MAX_CPU_ISA=avx2)
endif()
