# Benchmark programs that are not part of the `dtrain` command (included from
# the root CMakeLists.txt). The Open MPI baseline for `dtrain bench coll` is
# built only when MPI is found; bench/coll_vs_mpi.sh runs it under mpirun.
if(DT_HAVE_MPI)
  add_executable(bench_mpi_allreduce ${CMAKE_CURRENT_LIST_DIR}/mpi_allreduce.c)
  set_target_properties(bench_mpi_allreduce PROPERTIES OUTPUT_NAME mpi_allreduce
    RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
  target_compile_options(bench_mpi_allreduce PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
  target_link_libraries(bench_mpi_allreduce PRIVATE MPI::MPI_C)
endif()
# Model-state memory against the ZeRO formula, with and without NVMe offload
# (bench/offload_memory.sh runs it).
add_executable(bench_offload_mem ${CMAKE_CURRENT_LIST_DIR}/offload_mem.c)
set_target_properties(bench_offload_mem PROPERTIES OUTPUT_NAME offload_mem
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_offload_mem PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_compile_definitions(bench_offload_mem PRIVATE _GNU_SOURCE)
target_link_libraries(bench_offload_mem PRIVATE dtrain_static)
# Each reshard transition against the collective it runs (issue 16).
add_executable(bench_reshard ${CMAKE_CURRENT_LIST_DIR}/reshard.c)
set_target_properties(bench_reshard PROPERTIES OUTPUT_NAME reshard
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_reshard PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_include_directories(bench_reshard PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(bench_reshard PRIVATE dtrain_static)
# The strided row copy against memcpy of the same bytes (issue 16).
add_executable(bench_copy_rows ${CMAKE_CURRENT_LIST_DIR}/copy_rows.c)
set_target_properties(bench_copy_rows PROPERTIES OUTPUT_NAME copy_rows
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_copy_rows PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_include_directories(bench_copy_rows PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(bench_copy_rows PRIVATE dtrain_static)
if(DT_BUILD_TESTS)
  # Tiny shapes: every transition runs, and each compared op's output must
  # equal the reshard's bit for bit (the bench exits 1 otherwise).
  enable_testing()
  add_test(NAME parallel/mesh_bench_reshard
           COMMAND dtrain_cli run -n 2 -- $<TARGET_FILE:bench_reshard> --rows 64 --cols 32 --reps 2 --warmup 1)
  set_tests_properties(parallel/mesh_bench_reshard PROPERTIES TIMEOUT 120 LABELS "parallel;bench"
    PASS_REGULAR_EXPRESSION "R -> S\\(1\\)[^\n]*\n[^\n]*its op")
endif()
# dtrain's side of bench/dtensor_torch.py (every transition and matmul case
# against PyTorch's DTensor).
add_executable(bench_dtensor_dump ${CMAKE_CURRENT_LIST_DIR}/dtensor_dump.c)
set_target_properties(bench_dtensor_dump PROPERTIES OUTPUT_NAME dtensor_dump
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_dtensor_dump PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_dtensor_dump PRIVATE dtrain_static)
# Pipeline bubble and activation memory per schedule (issue 17);
# bench/torch_pipeline.py is its torch.distributed.pipelining peer.
add_executable(bench_pipe_bubble ${CMAKE_CURRENT_LIST_DIR}/pipe_bubble.c)
set_target_properties(bench_pipe_bubble PROPERTIES OUTPUT_NAME pipe_bubble
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_pipe_bubble PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_pipe_bubble PRIVATE dtrain_static)
# Checkpoint save/load throughput, the asynchronous-save stall and the peak
# memory of a save (issue 14); bench/ckpt_bench.sh runs it beside dd.
add_executable(bench_ckpt ${CMAKE_CURRENT_LIST_DIR}/ckpt_bench.c)
set_target_properties(bench_ckpt PROPERTIES OUTPUT_NAME ckpt_bench
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_ckpt PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_ckpt PRIVATE dtrain_static)
# Point-to-point latency and CPU per transfer at the pipeline's message size
# (issue 17: what a stage handoff costs).
add_executable(bench_p2p_pingpong ${CMAKE_CURRENT_LIST_DIR}/p2p_pingpong.c)
set_target_properties(bench_p2p_pingpong PROPERTIES OUTPUT_NAME p2p_pingpong
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_p2p_pingpong PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_p2p_pingpong PRIVATE dtrain_static)
# Each direction of the ConvNet's convolutions in f32 against bf16 (issue 12;
# needs a CPU with bf16 convolutions: AVX-512).
add_executable(bench_conv_bf16 ${CMAKE_CURRENT_LIST_DIR}/conv_bf16.c)
set_target_properties(bench_conv_bf16 PROPERTIES OUTPUT_NAME conv_bf16
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_conv_bf16 PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_compile_definitions(bench_conv_bf16 PRIVATE _GNU_SOURCE)
target_link_libraries(bench_conv_bf16 PRIVATE dtrain_static)
# dtrain's backward-weights kernels against oneDNN's primitive, the ConvNet's
# two shapes (issue 31); the test runs it once at a tiny batch.
add_executable(bench_conv_bwd_weights ${CMAKE_CURRENT_LIST_DIR}/conv_bwd_weights.c)
set_target_properties(bench_conv_bwd_weights PROPERTIES OUTPUT_NAME conv_bwd_weights
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_conv_bwd_weights PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_compile_definitions(bench_conv_bwd_weights PRIVATE _GNU_SOURCE)
target_include_directories(bench_conv_bwd_weights PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(bench_conv_bwd_weights PRIVATE dtrain_static)
if(DT_BUILD_TESTS)
  add_test(NAME kernels/bench_conv_bwd_weights
           COMMAND bench_conv_bwd_weights --rounds 2 --calls 1 --sets 2 --batch 2)
  set_tests_properties(kernels/bench_conv_bwd_weights PROPERTIES TIMEOUT 120 LABELS "kernels;bench")
endif()
# The pipeline units' estimated compute against their measured time, and
# the cut each gives (DT_PIPE_BY_TIME, issue 17).
add_executable(bench_pipe_unit_times ${CMAKE_CURRENT_LIST_DIR}/pipe_unit_times.c)
set_target_properties(bench_pipe_unit_times PROPERTIES OUTPUT_NAME pipe_unit_times
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_pipe_unit_times PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_pipe_unit_times PRIVATE dtrain_static)
# dt_model_generate's tokens/s with and without the key/value cache (issue 31).
add_executable(bench_generate_tps ${CMAKE_CURRENT_LIST_DIR}/generate_tps.c)
set_target_properties(bench_generate_tps PROPERTIES OUTPUT_NAME generate_tps
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_generate_tps PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_generate_tps PRIVATE dtrain_static)
# dtrain's side of bench/onednn_matmul.sh: GPT-2's per-layer GEMMs through
# dt_k_matmul (the script compiles the oneDNN 2.x / 3.x sides itself).
add_executable(bench_onednn_matmul_dtrain ${CMAKE_CURRENT_LIST_DIR}/onednn_matmul.c)
set_target_properties(bench_onednn_matmul_dtrain PROPERTIES OUTPUT_NAME onednn_matmul_dtrain
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_onednn_matmul_dtrain PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_compile_definitions(bench_onednn_matmul_dtrain PRIVATE BENCH_DTRAIN)
target_link_libraries(bench_onednn_matmul_dtrain PRIVATE dtrain_static)
if(DT_BUILD_TESTS)
  # Tiny shapes: the program runs every shape through dt_k_matmul.
  add_test(NAME kernels/bench_onednn_matmul_dtrain
           COMMAND bench_onednn_matmul_dtrain --rows 16 --embd 8 --vocab 40 --reps 1 --types f32,bf16)
  set_tests_properties(kernels/bench_onednn_matmul_dtrain PROPERTIES TIMEOUT 120 LABELS "kernels;bench"
    PASS_REGULAR_EXPRESSION "bwd-dw lm_head AtB 40 8 16 bf16 impl=" FAIL_REGULAR_EXPRESSION "error=")
endif()
# The per-parameter passes of a bf16 step: the non-finite scan and the
# AdamW step over f32 masters with bf16 grads and weight copy.
add_executable(bench_optim_lowp ${CMAKE_CURRENT_LIST_DIR}/optim_lowp.c)
set_target_properties(bench_optim_lowp PROPERTIES OUTPUT_NAME optim_lowp
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_optim_lowp PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_optim_lowp PRIVATE dtrain_static)
# Attention over a bf16 qkv read as it is against the widening casts around
# the f32 op, interleaved in one process (issue 31/34's attention item).
add_executable(bench_attn_lp ${CMAKE_CURRENT_LIST_DIR}/attn_lp.c)
set_target_properties(bench_attn_lp PROPERTIES OUTPUT_NAME attn_lp
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_attn_lp PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_attn_lp PRIVATE dtrain_static)
# The vector units' instruction throughput limit (f32 FMA on ymm/zmm,
# AVX512_BF16 vdpbf16ps) per core and per thread count, each path only where
# the CPU has it: what the bf16/f32 GEMM rates are set against (issue 31).
add_executable(bench_isa_peak ${CMAKE_CURRENT_LIST_DIR}/isa_peak.c)
set_target_properties(bench_isa_peak PROPERTIES OUTPUT_NAME isa_peak
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_isa_peak PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_isa_peak PRIVATE Threads::Threads)
# dt_attention_window (a soft cap or a sliding window: the plain kernel)
# beside the blocked causal kernel; bench/attn_window_peer.sh sets them
# beside PyTorch's eager soft-capped attention (Gemma 2's).
add_executable(bench_attn_window ${CMAKE_CURRENT_LIST_DIR}/attn_window.c)
set_target_properties(bench_attn_window PROPERTIES OUTPUT_NAME attn_window
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
target_compile_options(bench_attn_window PRIVATE ${DT_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(bench_attn_window PRIVATE dtrain_static)
