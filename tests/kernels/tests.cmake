# The convolution tests once more under each layout policy: plain NCHW
# everywhere, and oneDNN's blocked layouts everywhere (the default "auto"
# mixes them by shape; see src/kernels/conv.c).
if(TARGET test_conv)
  foreach(layout plain blocked)
    add_test(NAME kernels/test_conv_${layout} COMMAND test_conv)
    set_tests_properties(kernels/test_conv_${layout} PROPERTIES TIMEOUT 300 LABELS kernels SKIP_RETURN_CODE 77
      ENVIRONMENT "DT_CONV_LAYOUT=${layout}")
  endforeach()
endif()

# The conversion paths, one registration each: a path this CPU lacks (as
# dt_cpu_detect() reports it, DT_MAX_CPU_ISA included) reports skipped.
if(TARGET test_convert)
  foreach(path scalar avx2 avx512 avx512_bf16)
    add_test(NAME kernels/test_convert_${path} COMMAND test_convert ${path})
    set_tests_properties(kernels/test_convert_${path} PROPERTIES TIMEOUT 300 LABELS kernels SKIP_RETURN_CODE 77)
  endforeach()
endif()

# On an AVX-512 machine the default registrations run the AVX-512 code paths
# (oneDNN's nChw16c kernels, dtrain's AVX-512 conversions). These run the
# layout, conversion and ConvNet tests once more as on an AVX2 machine
# (ONEDNN_MAX_CPU_ISA=AVX2 for oneDNN, DT_MAX_CPU_ISA=avx2 for dtrain), so
# both paths run whichever machine CI gets. Without AVX-512 they would only
# repeat the default registrations, so they report skipped.
set(DT_ISA_AVX2_TESTS test_conv test_blocked test_convert test_nn test_bench_step test_matmul test_llama_ops
  test_attention_bf16)
foreach(t ${DT_ISA_AVX2_TESTS})
  if(TARGET ${t})
    set(args)
    if(t STREQUAL "test_convert")
      set(args avx2)
    endif()
    dt_add_cpu_test(isa_avx2/${t} ${t} avx512f "no AVX-512 on this CPU: the default registration already runs the AVX2 paths"
      TIMEOUT 600 LABELS isa ARGS ${args}
      ENVIRONMENT ONEDNN_MAX_CPU_ISA=AVX2 DT_MAX_CPU_ISA=avx2 OPENBLAS_CORETYPE=SkylakeX
        DT_BINARY_DIR=${PROJECT_BINARY_DIR} DT_CLI=${PROJECT_BINARY_DIR}/dtrain)
  endif()
endforeach()

# The bf16 convolution test's fallback part (dt_conv2d on bf16 tensors
# widened to f32) once more with the native path capped off, as on an AVX2
# machine; the default registration runs the native part where the CPU has
# bf16 convolutions and reports it skipped where it has none.
if(TARGET test_conv_bf16)
  dt_add_cpu_test(isa_avx2/test_conv_bf16 test_conv_bf16 avx512f
    "no AVX-512 on this CPU: the default registration already runs the fallback"
    TIMEOUT 300 LABELS kernels isa ARGS fallback ENVIRONMENT ONEDNN_MAX_CPU_ISA=AVX2 DT_MAX_CPU_ISA=avx2)
endif()

# dtrain's AMX GEMM on the real tile instructions: the default registration
# runs its driver over the portable model of the tiles; this one runs the
# same shapes on the hardware, and reports skipped where the CPU, the OS or
# DT_MAX_CPU_ISA leave AMX off.
if(TARGET test_amx_gemm)
  add_test(NAME kernels/test_amx_gemm_hw COMMAND test_amx_gemm hw)
  set_tests_properties(kernels/test_amx_gemm_hw PROPERTIES TIMEOUT 600 LABELS "kernels;threads" SKIP_RETURN_CODE 77)
  # the same driver over vdpbf16ps (amx_vdp.c; skipped without AVX512_BF16)
  add_test(NAME kernels/test_amx_gemm_vdp COMMAND test_amx_gemm vdp)
  set_tests_properties(kernels/test_amx_gemm_vdp PROPERTIES TIMEOUT 600 LABELS "kernels" SKIP_RETURN_CODE 77)
endif()

# The attention's products on the real tile instructions: the default
# registration of test_attention_bf16 runs them over the portable model of
# the tiles; this one over the hardware (skipped where the CPU, the OS or
# DT_MAX_CPU_ISA leave AMX off). Labelled as its program is (not
# "threads": the TSan stage builds only the programs of that label).
if(TARGET test_attention_bf16)
  add_test(NAME kernels/test_attention_bf16_hw COMMAND test_attention_bf16 hw)
  set_tests_properties(kernels/test_attention_bf16_hw PROPERTIES TIMEOUT 600 LABELS "kernels" SKIP_RETURN_CODE 77)
  # and over vdpbf16ps, the tiles of a CPU with AVX512_BF16 but no AMX
  add_test(NAME kernels/test_attention_bf16_vdp COMMAND test_attention_bf16 vdp)
  set_tests_properties(kernels/test_attention_bf16_vdp PROPERTIES TIMEOUT 600 LABELS "kernels" SKIP_RETURN_CODE 77)
endif()
