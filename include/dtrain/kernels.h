/* dtrain/kernels.h — pure compute on raw pointers (no tensors).
 *
 * Overview
 * --------
 * Every kernel works on raw pointers to contiguous, row-major f32 arrays
 * unless its comment says otherwise, and returns a dt_status: DT_OK, or an
 * error with a message in dt_last_error() (negative sizes, NULL pointers with
 * a non-zero size, unsupported combinations, labels out of range). Sizes are
 * int64_t element counts. A size of 0 is always valid and does nothing.
 *
 * Rules that hold for every kernel (the lifecycle is written down once here):
 *  - Outputs are OVERWRITTEN, never accumulated, unless the comment says
 *    "accumulates" (dt_k_matmul has beta; dt_k_axpy adds). Gradient
 *    accumulation into a flat grad buffer is the caller's job (dt_k_axpy).
 *  - Outputs must not alias inputs unless the comment says "may alias"
 *    (elementwise kernels: out may be exactly equal to an input).
 *  - Kernels run on dt_get_num_threads() OpenMP threads with static schedules,
 *    so results are bit-identical run to run for a given thread count (oneDNN
 *    matmul and convolution included). The C reductions that feed parameter
 *    gradients (batch norm, layer norm, embedding, dt_k_reduce,
 *    dt_k_reduce_to_shape, dt_k_sum_all) use a fixed summation order that
 *    does not depend on the thread count at all; oneDNN's weight gradients
 *    may change in the last bits when the thread count changes.
 *  - Matmul and convolution go through oneDNN (bf16 matmul on dtrain's own
 *    AMX GEMM for the largest products on AMX CPUs, or for all where
 *    DT_AMX_GEMM=on asks for it, dt_k_matmul_amx). Their primitives are created
 *    on first use of a (shape, flags, dtype) combination and cached for the
 *    life of the process, so a training loop's steady state creates none
 *    (dt_k_stats_get() proves it); products whose shapes change from call
 *    to call (dt_k_matmul_set_varying) share one per kind or run on the AMX
 *    GEMM, which generates nothing per shape. The cache is thread-safe.
 *  - Raw pointers are borrowed for the duration of the call only.
 *
 * Usage
 * -----
 *     // Linear layer y = x W^T + b, x (B, in), W (out, in), b (out), y (B, out)
 *     dt_status st = dt_k_matmul(false, true, B, out, in, 1.0f, x, W, DT_F32,
 *                                0.0f, y, b);
 *     // ... and its backward:
 *     dt_k_matmul(false, false, B, in, out, 1.0f, dy, W, DT_F32, 0.0f, dx, NULL);  // dx = dy W
 *     dt_k_matmul(true, false, out, in, B, 1.0f, dy, x, DT_F32, 1.0f, dW, NULL);   // dW += dy^T x
 *     dt_k_reduce(DT_K_SUM, dy, 1, B, out, db, NULL);                             // db = sum_rows dy
 *     if (st < 0) fprintf(stderr, "%s\n", dt_last_error());
 */
#ifndef DTRAIN_KERNELS_H
#define DTRAIN_KERNELS_H

#include "dtrain/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- instruction-set dispatch ------------------------------------------- */
/* Code paths of the vectorised kernels: dtype conversion, and the row loops
 * of the fused bias + GELU, the softmax cross-entropy and attention, which
 * run on 8 lanes on the AVX2 path and on 16 lanes on both AVX-512 paths,
 * always with the same bits as the scalar rows. The CPU's features come
 * from dt_cpu_detect(), so DT_MAX_CPU_ISA=avx2 (or scalar) keeps AUTO off
 * the AVX-512 (or all vector) paths. */
typedef enum {
    DT_K_ISA_AUTO = 0,   /* best path the CPU supports (the default) */
    DT_K_ISA_SCALAR,     /* portable C, the bit-exact reference */
    DT_K_ISA_AVX2,       /* AVX2 + FMA + F16C */
    DT_K_ISA_AVX512,     /* AVX-512F/BW/VL (16-lane rows), integer rounding for f32->bf16 */
    DT_K_ISA_AVX512_BF16 /* as AVX512, f32->bf16 by AVX512_BF16 vcvtneps2bf16 */
} dt_k_isa;
/* Force a path (tests use this to compare paths). Returns
 * DT_ERR_UNSUPPORTED if the CPU (as dt_cpu_detect() reports it) lacks it
 * (the setting is then unchanged). Process-wide; not meant to be changed
 * while kernels run. */
DT_API dt_status dt_k_set_isa(dt_k_isa isa);
/* The path in use now (never DT_K_ISA_AUTO: AUTO is resolved). */
DT_API dt_k_isa dt_k_get_isa(void);
/* "scalar", "avx2", "avx512", "avx512_bf16" ("auto" for AUTO). */
DT_API const char *dt_k_isa_name(dt_k_isa isa);

/* ---- dtype conversion ---------------------------------------------------- */
/* Arrays of n elements; halfs are raw uint16_t bit patterns. Round to nearest
 * even; bit-identical to the scalar dt_f32_to_f16() etc. of base.h on every
 * input, NaN (quieted, sign kept), Inf and subnormals included. */
DT_API dt_status dt_k_f32_to_f16(const float *x, uint16_t *y, int64_t n);
DT_API dt_status dt_k_f16_to_f32(const uint16_t *x, float *y, int64_t n);
DT_API dt_status dt_k_f32_to_bf16(const float *x, uint16_t *y, int64_t n);
DT_API dt_status dt_k_bf16_to_f32(const uint16_t *x, float *y, int64_t n);
/* Any of f32, f16, bf16 to any of them (same dtype = copy). Other dtypes:
 * DT_ERR_UNSUPPORTED. */
DT_API dt_status dt_k_convert(const void *x, dt_dtype xt, void *y, dt_dtype yt, int64_t n);
/* Index of the first non-finite element (Inf or NaN: exponent bits all ones)
 * of x[0, n) of dtype dt (f32, bf16 or f16), or n when every element is
 * finite (also for n <= 0 (0), a NULL x or another dtype). One read pass,
 * vectorised (AVX2 / AVX-512 as dt_k_get_isa() says) and split over threads;
 * the same index on every path. */
DT_API int64_t dt_k_first_nonfinite(const void *x, dt_dtype dt, int64_t n);

/* ---- oneDNN statistics and cache ----------------------------------------- */
typedef struct {
    uint64_t primitives_created; /* oneDNN primitives created since start/reset */
    uint64_t cache_hits;         /* kernel calls served by a cached primitive */
    uint64_t cache_entries;      /* entries in the cache now */
    uint64_t reorders;           /* reorders executed (layout changes of data) */
} dt_k_stats;
/* Counters since process start or the last dt_k_stats_reset(). */
DT_API void dt_k_stats_get(dt_k_stats *out);
/* Zero the counters (the cache itself is kept). */
DT_API void dt_k_stats_reset(void);
/* Drop every cached primitive and cached reordered buffer. */
DT_API void dt_k_cache_clear(void);

/* ---- matmul (oneDNN) ----------------------------------------------------- */
/* C = alpha * op(A) * op(B) + beta * C + bias, where op(X) = X or X^T.
 * op(A) is (M, K), op(B) is (K, N), C is (M, N) f32, all contiguous
 * row-major: A is stored (M, K), or (K, M) when trans_a; B is stored (K, N),
 * or (N, K) when trans_b (so a linear layer y = x W^T + b is
 * trans_a=false, trans_b=true with W stored (out, in)).
 * ab_type: DT_F32, or DT_BF16 / DT_F16 (A and B are uint16_t arrays of that
 * dtype, C stays f32, products accumulate in f32; where oneDNN has no native
 * matmul of that dtype for the CPU, the inputs are widened to f32 exactly
 * first: same results, f32 speed; see dt_k_matmul_native). Other dtypes:
 * DT_ERR_UNSUPPORTED.
 * bias: NULL or N floats added to every row of C (after alpha scaling).
 * beta = 0 means C is not read (it may hold garbage or NaN). */
DT_API dt_status dt_k_matmul(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                             const void *A, const void *B, dt_dtype ab_type, float beta, float *C,
                             const float *bias);
/* Mark the calling thread's following products (every dt_k_matmul* call) as
 * ones whose M or K changes from call to call, such as the experts of a
 * mixture-of-experts block, each given the rows routed to it (on), or not
 * (off, the default); returns the previous setting, to restore. A product
 * normally gets a primitive of its own shape, generated once and cached (a
 * new shape costs several times the product, and the cache keeps it); a
 * varying one runs where no code is generated per shape: bf16 on dtrain's
 * AMX GEMM where the CPU has AMX (unless DT_AMX_GEMM=off), else on one
 * oneDNN primitive for all its shapes, M and K given at run time. Results
 * agree with the per-shape primitives' within the products' rounding (the
 * sums may be ordered differently). */
DT_API bool dt_k_matmul_set_varying(bool on);
/* Batched form: for b in [0, batch): C_b = alpha op(A_b) op(B_b) + beta C_b
 * (+ bias), with A_b = A + b*stride_a elements (likewise B, C). A stride of 0
 * for A or B broadcasts one matrix to the whole batch; stride_c must be
 * >= M*N. Contiguous batches have stride_a = M*K, stride_b = K*N. */
DT_API dt_status dt_k_matmul_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N,
                                     int64_t K, float alpha, const void *A, int64_t stride_a,
                                     const void *B, int64_t stride_b, dt_dtype ab_type, float beta,
                                     float *C, int64_t stride_c, const float *bias);

/* The batched product (beta 0) with C of the operands' dtype t (bf16 or
 * f16): the f32 sums (alpha, bias added in f32) rounded once to t, round to
 * nearest even, so C_b holds what dt_k_matmul_batched's f32 C_b rounded by
 * dt_k_convert would (the sums may differ in the last bits of f32: oneDNN
 * picks its kernel per destination dtype). Where dt_k_matmul_writes_lp(t)
 * oneDNN (or dtrain's AMX GEMM) writes C directly (no f32 result in
 * memory); elsewhere an f32
 * result is allocated, multiplied into and rounded. C is a uint16_t array
 * (stride_c elements between batches, as above). */
DT_API dt_status dt_k_matmul_batched_lp(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N,
                                        int64_t K, float alpha, const void *A, int64_t stride_a,
                                        const void *B, int64_t stride_b, dt_dtype t, void *C,
                                        int64_t stride_c, const float *bias);
/* One product (alpha 1, no bias) as dt_k_matmul_batched_lp, and whether
 * every value of C (after rounding) is finite: *finite false when some is
 * inf or NaN. For a result written once and read much later (a weight's
 * gradient): on dtrain's AMX GEMM the epilogue checks each value as it
 * stores it (no read pass over C) and writes C's whole 64-byte lines
 * around the caches (streaming stores: no read of the lines first);
 * elsewhere a read pass follows the product. *finite is false when the
 * call fails. */
DT_API dt_status dt_k_matmul_lp_checked(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                        const void *A, const void *B, dt_dtype t, void *C, bool *finite);
/* dt_k_matmul_lp_checked with the result's rows split: row r with keep[r]
 * >= 0 is stored in f32 as row keep[r] of Ck (N floats a row: what
 * dt_k_matmul's f32 C holds there), every other row rounded to t into C
 * (M x N) as dt_k_matmul_lp_checked rounds it; *finite covers every value
 * stored, in either. For a weight gradient of which a few rows receive
 * later contributions (a tied embedding's lookup) before they are rounded:
 * the other rows are final as stored, with no f32 M x N result. Where
 * dt_k_matmul_splits_rows says so the GEMM's epilogue splits them as it
 * stores; elsewhere an f32 result is allocated, multiplied into, then
 * copied or rounded row by row. */
DT_API dt_status dt_k_matmul_lp_rows(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                     const void *A, const void *B, dt_dtype t, void *C, const int32_t *keep,
                                     float *Ck, bool *finite);
/* Whether dt_k_matmul_lp_rows splits the rows in the GEMM itself here
 * (dtrain's AMX GEMM runs this product: see dt_k_matmul_amx). */
DT_API bool dt_k_matmul_splits_rows(dt_dtype t, int64_t M, int64_t N, int64_t K);
/* Whether dt_k_matmul_batched_lp writes its t result directly here: oneDNN
 * has a native t matmul on this CPU, or (bf16) dtrain's AMX GEMM runs
 * every bf16 product (DT_AMX_GEMM=on); it rounds its f32 sums to bf16 as
 * it stores them, as dt_f32_to_bf16 rounds. */
DT_API bool dt_k_matmul_writes_lp(dt_dtype t);

/* Whether oneDNN runs bf16 matmul natively on this CPU (AVX-512 and up);
 * false means bf16 matmuls are widened to f32 (same results, f32 speed). */
DT_API bool dt_k_matmul_bf16_native(void);
/* The same for any ab_type: true for DT_F32; for DT_BF16 / DT_F16 whether
 * oneDNN builds a matmul of that dtype here (asked once, cached); false
 * for other dtypes. */
DT_API bool dt_k_matmul_native(dt_dtype t);
/* Whether every bf16 matmul (dt_k_matmul, dt_k_matmul_batched with
 * DT_BF16) runs on dtrain's own AMX GEMM in this process instead of oneDNN:
 * true where the environment sets DT_AMX_GEMM=on, the CPU has AMX-TILE and
 * AMX-BF16, the OS saves the tile state, Linux grants the process the tile
 * data (asked on the first call) and DT_MAX_CPU_ISA is not avx512 or lower.
 * By default (DT_AMX_GEMM unset or auto) it returns false and, where the
 * tiles are usable, dtrain's GEMM runs the products of 2^27 multiply-adds
 * or more whose every dimension is 256 or more (a training step's GEMMs:
 * GPT-2 124M's at 2048 rows took 988-1056 ms a step on it against
 * 1108-1154 on oneDNN 2.6, idle Xeon with AMX, 2 threads) and oneDNN (on
 * the tiles itself, its brgemm kernels) the rest (decode rows, small
 * products); *why then starts with "auto". DT_AMX_GEMM=off leaves all on oneDNN.
 * *why (if not NULL) gets "active ...", the auto rule, or the reason it is
 * off (a static string). Products are the same bf16 x bf16 -> f32 ones as
 * oneDNN's, summed in another order (each output's sum in increasing k,
 * whatever the thread count). */
DT_API bool dt_k_matmul_amx(const char **why);

/* Measure matmul throughput: n x n x n, `reps` timed runs after one warm-up,
 * returns the best GFLOP/s (2 n^3 / time) in *gflops. dt is DT_F32 or
 * DT_BF16 (emulated through f32 where not native). Used by
 * `dtrain bench matmul` and by other benchmarks as the machine's peak. */
DT_API dt_status dt_k_bench_matmul(int64_t n, dt_dtype dt, int reps, double *gflops);

/* ---- the GEMMs a piece of work issues, recorded and timed ----------------- */
/* A peak that means something for one workload is the rate of the GEMMs it
 * runs, in their dtype, through the path they take here (oneDNN, the
 * widening emulation, or dtrain's AMX GEMM). Record them, then time them:
 *
 *     dt_k_gemm_record_start();
 *     dt_trainer_step(...);                    // the work: every dt_k_matmul* call is seen
 *     dt_k_gemm_shape g[64]; int n;
 *     dt_k_gemm_record_stop(g, 64, &n);        // the distinct calls, with their counts
 *     dt_k_gemm_rate r;
 *     dt_k_gemm_bench(g, n < 64 ? n : 64, 3, NULL, &r);  // r.gflops: the FLOP-weighted rate
 *     // r.recorded_seconds / r.seconds: how much slower the GEMMs ran inside the step
 *
 * The recording is process-wide (calls from every thread count) and costs
 * one relaxed atomic load per matmul call while it is off. */

/* One distinct matmul call (everything but its data) and how often it ran. */
typedef struct {
    bool trans_a, trans_b;
    int64_t batch, M, N, K;             /* as dt_k_matmul_batched's */
    int64_t stride_a, stride_b, stride_c; /* batch strides (0 when batch is 1) */
    float alpha, beta;                  /* beta is 0 for a low-precision C */
    dt_dtype ab_type;                   /* the operands' dtype */
    dt_dtype c_type;                    /* DT_F32 (dt_k_matmul, dt_k_matmul_batched), or ab_type
                                           (dt_k_matmul_batched_lp) */
    bool bias;                          /* a bias vector was added */
    int64_t count;                      /* calls while recording (dt_k_gemm_bench: weight) */
    double seconds;                     /* wall seconds those calls took in all, each timed around its
                                           product while recording: the GEMMs' time inside the work
                                           (dt_k_gemm_bench reads it only to sum it) */
} dt_k_gemm_shape;

/* Start recording (clearing an earlier recording). DT_ERR_INVALID_ARG if a
 * recording is already running. */
DT_API dt_status dt_k_gemm_record_start(void);
/* Stop recording: the distinct calls in the order first seen, at most cap
 * of them into out (out may be NULL with cap 0); *n gets how many there
 * were (possibly more than cap). DT_ERR_INVALID_ARG if none was running. */
DT_API dt_status dt_k_gemm_record_stop(dt_k_gemm_shape *out, int cap, int *n);

/* What dt_k_gemm_bench measured over a list of calls. */
typedef struct {
    double gflops;     /* the FLOP-weighted rate: sum(count x flop) / sum(count x best time) */
    double cpu_gflops; /* the same per CPU-second of the process (user + system, all threads) */
    double gflop;      /* sum(count x flop) * 1e-9: the list's work, 2 M N K batch per call */
    double seconds;    /* sum(count x best time): the list's time at the measured rates */
    double recorded_seconds; /* sum(seconds): the list's time where it was recorded (0 for a list
                                written by hand); against `seconds`, what the work's surroundings
                                cost its GEMMs (operands from memory, not the caches) */
} dt_k_gemm_rate;

/* Time each of the n calls of g: `reps` runs (>= 1) through the entry that
 * recorded it (so the same path: oneDNN, the emulation or the AMX GEMM),
 * on operands of uniform [-1, 1) values allocated here (the largest call's
 * size for A, B and C, freed on return), the best run taken. best_s (NULL,
 * or n entries) gets each call's best time in seconds. A call with count
 * 0 is timed but weighs nothing. Errors: DT_ERR_INVALID_ARG (n < 1,
 * reps < 1, a negative dimension, count or seconds), DT_ERR_NO_MEMORY, or the
 * matmul's own. */
DT_API dt_status dt_k_gemm_bench(const dt_k_gemm_shape *g, int n, int reps, double *best_s, dt_k_gemm_rate *out);

/* ---- 2-D convolution (oneDNN), NCHW -------------------------------------- */
/* Callers always pass plain NCHW activations and OIHW weights. Internally a
 * convolution may run on oneDNN's blocked layouts (with cached reorders and
 * buffers), chosen per direction and shape for speed; the environment
 * variable DT_CONV_LAYOUT=plain|blocked|auto (default auto) forces a policy.
 * Results agree across policies to float rounding. */
typedef struct {
    int64_t N, C, H, W;            /* input (N, C, H, W) */
    int64_t K, R, S;               /* K output channels, R x S kernel; weights (K, C, R, S) */
    int64_t stride_h, stride_w;    /* >= 1 */
    int64_t pad_h, pad_w;          /* zero padding on each side, >= 0 */
    int64_t dil_h, dil_w;          /* dilation, PyTorch convention: 1 = none */
} dt_k_conv2d_shape;
/* A shape with stride 1, padding 0, dilation 1 and the given sizes. */
DT_API dt_k_conv2d_shape dt_k_conv2d_shape_make(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K,
                                                int64_t R, int64_t S);
/* Output height P and width Q (validates the shape). */
DT_API dt_status dt_k_conv2d_out_size(const dt_k_conv2d_shape *s, int64_t *P, int64_t *Q);
/* y (N, K, P, Q) = conv(x (N, C, H, W), w (K, C, R, S)) + bias (K, or NULL). */
DT_API dt_status dt_k_conv2d_fwd(const dt_k_conv2d_shape *s, const float *x, const float *w,
                                 const float *bias, float *y);
/* dx (N, C, H, W) from dy (N, K, P, Q) and w. */
DT_API dt_status dt_k_conv2d_bwd_data(const dt_k_conv2d_shape *s, const float *dy, const float *w,
                                      float *dx);
/* dw (K, C, R, S) and dbias (K, or NULL to skip) from x and dy. */
DT_API dt_status dt_k_conv2d_bwd_weights(const dt_k_conv2d_shape *s, const float *x, const float *dy,
                                         float *dw, float *dbias);
/* Layout bits for the _l variants: the activation (x / dx) or the output
 * (y / dy) is stored channel-blocked, nChw8c ([N][C/8][H][W][8], channels
 * % 8 == 0) or nChw16c ([N][C/16][H][W][16], channels % 16 == 0), instead
 * of plain NCHW. oneDNN then reads / writes it without a reorder when its
 * primitive wants that layout (and with one when it does not: any layout
 * gives the same values). At most one block size per side. Weights stay OIHW. */
enum {
    DT_K_SRC_BLOCKED8 = 1u, DT_K_DST_BLOCKED8 = 2u,
    DT_K_SRC_BLOCKED16 = 4u, DT_K_DST_BLOCKED16 = 8u
};
/* As above with layout bits (0 = the plain functions). */
DT_API dt_status dt_k_conv2d_fwd_l(const dt_k_conv2d_shape *s, const float *x, const float *w,
                                   const float *bias, float *y, unsigned layout);
DT_API dt_status dt_k_conv2d_bwd_data_l(const dt_k_conv2d_shape *s, const float *dy, const float *w,
                                        float *dx, unsigned layout);
DT_API dt_status dt_k_conv2d_bwd_weights_l(const dt_k_conv2d_shape *s, const float *x, const float *dy,
                                           float *dw, float *dbias, unsigned layout);
/* Low-precision convolution: the operands a direction reads are uint16_t
 * arrays of dtype t (x and w forward, dy and w backward data, x and dy
 * backward weights), products accumulate in f32. The forward writes y in
 * dtype yt (t: the f32 sum rounded once; or DT_F32); the backward
 * directions write f32 dx, dw and dbias; the bias is f32. Layout bits as the
 * _l functions (a blocked side holds elements of that side's dtype in the
 * block's order). t = DT_F32 (and yt = DT_F32) is the _l functions. A low
 * t where dt_k_conv2d_native(t) is false: DT_ERR_UNSUPPORTED (callers widen
 * the operands to f32 instead: same values, f32 speed). */
DT_API dt_status dt_k_conv2d_fwd_t(const dt_k_conv2d_shape *s, const void *x, const void *w,
                                   const float *bias, void *y, dt_dtype t, dt_dtype yt, unsigned layout);
DT_API dt_status dt_k_conv2d_bwd_data_t(const dt_k_conv2d_shape *s, const void *dy, const void *w,
                                        float *dx, dt_dtype t, unsigned layout);
DT_API dt_status dt_k_conv2d_bwd_weights_t(const dt_k_conv2d_shape *s, const void *x, const void *dy,
                                           float *dw, float *dbias, dt_dtype t, unsigned layout);
/* Whether the convolutions of dtype t run natively here: true for DT_F32;
 * for DT_BF16 when oneDNN builds bf16 convolutions on this CPU (AVX-512
 * machines; oneDNN 2.6 has none for AVX2) and DT_MAX_CPU_ISA leaves
 * AVX-512 on (ONEDNN_MAX_CPU_ISA=AVX2 turns it off too); DT_F16: oneDNN 2.6
 * has no f16 convolution for x86, so false. Asked once, cached. */
DT_API bool dt_k_conv2d_native(dt_dtype t);
/* False when DT_CONV_LAYOUT=plain: callers should then keep everything plain. */
DT_API bool dt_k_conv2d_blocked_enabled(void);

/* ---- blocked activations: which block --------------------------------------
 * The channel block oneDNN's convolutions prefer on this machine, asked at
 * run time (a ConvNet-like forward convolution created with format "any",
 * its output layout read back; asked once and cached): 16 (nChw16c, AVX-512
 * machines), 8 (nChw8c, AVX2), or 0 (neither, or oneDNN failed). It follows
 * ONEDNN_MAX_CPU_ISA, since oneDNN does. */
DT_API int dt_k_onednn_block(void);
/* The block that blocked activations (DT_TENSOR_BLOCKED8/16 regions) use:
 * dt_k_act_block_set's value if called, else DT_BLOCKED=8|16|0 from the
 * environment (read once; 0 turns blocked activations off; another value
 * logs a warning and is ignored), else dt_k_onednn_block(). 0 also when
 * DT_CONV_LAYOUT=plain. Any block gives the same values; only the number of
 * reorders (and so the speed) depends on it matching dt_k_onednn_block(). */
DT_API int dt_k_act_block(void);
/* Force the block (8, 16, or 0 = off; -1 = back to the default above) for
 * tests and benchmarks. DT_ERR_INVALID_ARG for another value. Not for use
 * while another thread runs a forward. */
DT_API dt_status dt_k_act_block_set(int block);
/* oneDNN's effective instruction set ("avx2", "avx512_core", ...; follows
 * ONEDNN_MAX_CPU_ISA). */
DT_API const char *dt_k_onednn_isa(void);
/* "nChw8c", "nChw16c" or "plain" for a block of 8, 16 or anything else. */
DT_API const char *dt_k_block_name(int block);

/* ---- channel-blocked helpers (plain C) ---------------------------------------
 * x is (N, C, HW) with C % B == 0, B = 8 (nChw8c) or 16 (nChw16c).
 * Conversions count as reorders in dt_k_stats. Batch norm and max pooling on
 * blocked data give the same values as the plain kernels, whatever B (same
 * reduction order per channel: rows of HW summed in float, row sums in
 * double in n order; deterministic). */
DT_API dt_status dt_k_to_blocked(const float *x, int64_t N, int64_t C, int64_t HW, int B, float *y);
DT_API dt_status dt_k_from_blocked(const float *x, int64_t N, int64_t C, int64_t HW, int B, float *y);
DT_API dt_status dt_k_batchnorm_train_fwd_blocked(const float *x, int64_t N, int64_t C, int64_t HW, int B,
                                                  const float *gamma, const float *beta, float eps,
                                                  float momentum, float *running_mean, float *running_var,
                                                  float *y, float *save_mean, float *save_invstd);
DT_API dt_status dt_k_batchnorm_bwd_blocked(const float *x, const float *dy, int64_t N, int64_t C, int64_t HW,
                                            int B, const float *gamma, const float *save_mean,
                                            const float *save_invstd, float *dx, float *dgamma, float *dbeta);
/* Training batch norm, ReLU and 2 x 2 max pooling of stride 2 as one op on
 * blocked x (N, C, H, W), H and W >= 2: y and argmax (N, C, H / 2, W / 2)
 * blocked like x are max_pool2d(relu(batch_norm(x)), 2) and the window's
 * argmax (h*W + w); batch norm's own output is never stored. The backward
 * takes y, argmax and dy at y and gives dx, dgamma, dbeta. Both are the same
 * bits as dt_k_batchnorm_train_fwd_blocked / _bwd_blocked,
 * dt_k_relu_fwd / _bwd and dt_k_maxpool2d_fwd_blocked / _bwd_blocked run
 * one after the other (max pooling before ReLU: the same values). */
DT_API dt_status dt_k_bn_relu_maxpool2x2_fwd_blocked(const float *x, int64_t N, int64_t C, int64_t H, int64_t W,
                                                     int B, const float *gamma, const float *beta, float eps,
                                                     float momentum, float *running_mean, float *running_var,
                                                     float *y, int32_t *argmax, float *save_mean,
                                                     float *save_invstd);
DT_API dt_status dt_k_bn_relu_maxpool2x2_bwd_blocked(const float *x, const float *y, const int32_t *argmax,
                                                     const float *dy, int64_t N, int64_t C, int64_t H, int64_t W,
                                                     int B, const float *gamma, const float *save_mean,
                                                     const float *save_invstd, float *dx, float *dgamma,
                                                     float *dbeta);

/* ---- elementwise --------------------------------------------------------- */
/* y[i] = v. */
DT_API dt_status dt_k_fill(float *y, float v, int64_t n);
/* y[i] = a * x[i] + b (scale, shift, negate). y may alias x. */
DT_API dt_status dt_k_scale(const float *x, float a, float b, float *y, int64_t n);
/* y[i] += a * x[i] (accumulates; use for gradient accumulation). */
DT_API dt_status dt_k_axpy(int64_t n, float a, const float *x, float *y);

typedef enum {
    DT_K_ADD = 0, DT_K_SUB, DT_K_MUL, DT_K_DIV, DT_K_MAXIMUM, DT_K_MINIMUM,
    DT_K_BINOP_COUNT
} dt_k_binop;
/* The numpy broadcast of shapes a (na dims) and b (nb dims) into out
 * (*nout = max(na, nb) dims, up to 8). DT_ERR_SHAPE if incompatible. */
DT_API dt_status dt_k_broadcast_shape(const int64_t *a, int na, const int64_t *b, int nb, int64_t *out,
                                      int *nout);
/* out = a (op) b with numpy broadcasting; out has the broadcast shape of
 * a and b (up to 8 dims each; 0 dims = scalar). out may alias a or b when
 * that operand already has the broadcast shape. */
DT_API dt_status dt_k_binary(dt_k_binop op, const float *a, const int64_t *shape_a, int na, const float *b,
                             const int64_t *shape_b, int nb, float *out);
/* y = a + b (b_first: b + a, the operands' order kept) over n elements,
 * a and y f32, b bf16/f16 (dtype t) widened block by block: the same bits
 * as widening b with dt_k_convert and adding in f32. y may alias a. */
DT_API dt_status dt_k_add_lp(dt_dtype t, const float *a, const void *b, bool b_first, float *y, int64_t n);
/* y = a + b over n elements, all three bf16/f16 (dtype t): each block of
 * both widened, added in f32 and rounded to t, the bits of widening both
 * with dt_k_convert, adding in f32 and rounding with it. y may alias a or
 * b. */
DT_API dt_status dt_k_add2_lp(dt_dtype t, const void *a, const void *b, void *y, int64_t n);
/* y = g rounded to t's precision (bf16/f16, held in f32), after adding g
 * to +0 (as a zeroed gradient buffer accumulating it: -0 gives +0): the
 * gradient of a t tensor that went through an f32 op. y may alias g.
 * ylp (may be NULL): the same n values stored as t (uint16_t), in the same
 * pass (a bf16 GEMM's backward takes them as they are); with ylp, y may be
 * NULL (the values stored as t alone). */
DT_API dt_status dt_k_grad_round_lp(dt_dtype t, const float *g, float *y, void *ylp, int64_t n);
/* Reduce a gradient g of shape gshape (ng dims) to shape oshape (no dims,
 * no <= ng, oshape broadcastable to gshape) by summing over the broadcast
 * dims: the backward of broadcasting. Fixed summation order. */
DT_API dt_status dt_k_reduce_to_shape(const float *g, const int64_t *gshape, int ng, float *out,
                                      const int64_t *oshape, int no);

typedef enum {
    DT_K_NEG = 0, DT_K_EXP, DT_K_LOG, DT_K_SQRT, DT_K_RSQRT, DT_K_ABS, DT_K_SQUARE, DT_K_RECIP,
    DT_K_TANH, DT_K_SIGMOID, DT_K_SIN, DT_K_COS,
    DT_K_UNOP_COUNT
} dt_k_unop;
/* y = f(x) elementwise. y may alias x. */
DT_API dt_status dt_k_unary(dt_k_unop op, const float *x, float *y, int64_t n);
/* dx = dy * f'(x). x is the forward input, y the forward output (each may be
 * NULL when the op's derivative does not need it: exp, sqrt, rsqrt, recip,
 * tanh and sigmoid use y; the others use x). dx may alias dy. */
DT_API dt_status dt_k_unary_bwd(dt_k_unop op, const float *x, const float *y, const float *dy, float *dx,
                                int64_t n);

/* dst (contiguous) = the strided array src with the given shape and element
 * strides (in elements, may be 0 or negative), elements of elem_size bytes
 * (1, 2, 4 or 8). ndim <= 8; ndim 0 copies one element. */
DT_API dt_status dt_k_copy_strided(const void *src, size_t elem_size, int ndim, const int64_t *shape,
                                   const int64_t *strides, void *dst);

/* ---- reductions ---------------------------------------------------------- */
typedef enum { DT_K_SUM = 0, DT_K_MEAN, DT_K_MAX, DT_K_MIN } dt_k_redop;
/* View x as (outer, len, inner) and reduce the middle axis:
 * y (outer, inner). For shape s and axis a: outer = prod(s[:a]),
 * len = s[a], inner = prod(s[a+1:]). arg: NULL, or (outer, inner) int64
 * indices of the max/min (first occurrence; NaN wins) for DT_K_MAX/MIN.
 * len must be >= 1 for MAX/MIN/MEAN. Summation order is fixed (does not
 * depend on the thread count). */
DT_API dt_status dt_k_reduce(dt_k_redop op, const float *x, int64_t outer, int64_t len, int64_t inner,
                             float *y, int64_t *arg);
/* y[j] += the column sums of x (rows, cols), added row by row in order
 * (y[j] first, then x[0][j], x[1][j], ...): a bias gradient accumulated
 * into its buffer. The same bits as that serial loop, for any thread count. */
DT_API dt_status dt_k_sum_rows_acc(const float *x, int64_t rows, int64_t cols, float *y);
/* dt_k_sum_rows_acc over rows of bf16/f16 (dtype t) widened as they are
 * read: the bits of dt_k_sum_rows_acc on the widened rows, half the bytes
 * (a bias gradient taken from a gradient's low-precision copy whose values
 * are the f32 gradient's). DT_ERR_DTYPE for another t. */
DT_API dt_status dt_k_sum_rows_acc_lp(dt_dtype t, const void *x, int64_t rows, int64_t cols, float *y);
/* *out = sum of x[0..n), accumulated in double in fixed blocks: independent
 * of the thread count. */
DT_API dt_status dt_k_sum_all(const float *x, int64_t n, float *out);
/* *out = sum of x[i]^2 in double (for gradient norms), thread-count
 * independent. */
DT_API dt_status dt_k_sumsq(const float *x, int64_t n, double *out);

/* ---- softmax and losses (last axis of (rows, cols)) ---------------------- */
/* y = softmax(x) along cols, or log_softmax when log. y may alias x. */
DT_API dt_status dt_k_softmax_fwd(const float *x, float *y, int64_t rows, int64_t cols, bool log);
/* dx from the forward OUTPUT y and dy (softmax: dx = y (dy - sum(dy y));
 * log_softmax: dx = dy - exp(y) sum(dy)). dx may alias dy. */
DT_API dt_status dt_k_softmax_bwd(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols,
                                  bool log);

/* Label value that is skipped (PyTorch's default ignore_index). */
#define DT_K_IGNORE_INDEX (-100)
/* Mean softmax cross-entropy: *loss = -(1/n) sum_r log softmax(logits_r)[label_r]
 * over the n rows whose label is not DT_K_IGNORE_INDEX (loss 0 if none).
 * labels: rows values of label_type DT_I64 or DT_I32. A label outside
 * [0, cols) other than DT_K_IGNORE_INDEX is an error (DT_ERR_RANGE, naming
 * the row). prob: NULL, or (rows, cols) where the softmax is saved for the
 * backward. Without prob each row's log-sum-exp is taken in one pass over
 * column chunks (online max), the form for vocabulary-sized rows. */
DT_API dt_status dt_k_softmax_xent_fwd(const float *logits, const void *labels, dt_dtype label_type,
                                       int64_t rows, int64_t cols, float *loss, float *prob);
/* dlogits = dloss * (softmax - onehot(label)) / n for counted rows, 0 for
 * ignored rows. prob: the saved softmax from the forward, or NULL to
 * recompute it from logits (then logits must not be NULL; two passes over
 * each row, no (rows, cols) buffer). dlogits may alias logits. */
DT_API dt_status dt_k_softmax_xent_bwd(const float *logits, const float *prob, const void *labels,
                                       dt_dtype label_type, int64_t rows, int64_t cols, float dloss,
                                       float *dlogits);
/* dt_k_softmax_xent_fwd without prob that also keeps each row's
 * log-sum-exp in save_lse (rows floats, every row, ignored ones too) for
 * dt_k_softmax_xent_bwd_lse: the backward then skips the pass that
 * recomputes it (one exp per logit). */
DT_API dt_status dt_k_softmax_xent_fwd_lse(const float *logits, const void *labels, dt_dtype label_type,
                                           int64_t rows, int64_t cols, float *loss, float *save_lse);
/* dt_k_softmax_xent_bwd recomputing the softmax from logits with the row
 * log-sum-exps lse that dt_k_softmax_xent_fwd_lse saved for these logits:
 * the same bits as dt_k_softmax_xent_bwd(logits, NULL, ...), one pass over
 * each row instead of two. */
DT_API dt_status dt_k_softmax_xent_bwd_lse(const float *logits, const float *lse, const void *labels,
                                           dt_dtype label_type, int64_t rows, int64_t cols, float dloss,
                                           float *dlogits);
/* dt_k_softmax_xent_fwd_lse over bf16/f16 logits (dtype t, contiguous
 * rows): each row is widened in column chunks in cache, never as a whole
 * f32 row in memory, so the loss and the log-sum-exps are bit for bit those
 * of dt_k_softmax_xent_fwd_lse on the widened logits. save_lse: rows
 * floats, or NULL. DT_ERR_DTYPE for another t. */
DT_API dt_status dt_k_softmax_xent_fwd_lp(dt_dtype t, const void *logits, const void *labels, dt_dtype label_type,
                                          int64_t rows, int64_t cols, float *loss, float *save_lse);
/* The backward over bf16/f16 logits (dtype t): the gradient of
 * dt_k_softmax_xent_bwd_lse on the widened logits, rounded to t into
 * dlogits_lp (rows x cols of t; may alias logits: each chunk is read before
 * it is written) and, when dlogits is not NULL, the same rounded values in
 * f32 into dlogits; one pass over each row (chunks widened in cache). lse:
 * dt_k_softmax_xent_fwd_lp's save_lse for these logits, or NULL to
 * recompute it (one more pass, the same bits). */
DT_API dt_status dt_k_softmax_xent_bwd_lp(dt_dtype t, const void *logits, const float *lse, const void *labels,
                                          dt_dtype label_type, int64_t rows, int64_t cols, float dloss,
                                          float *dlogits, void *dlogits_lp);
/* *loss = mean((pred - target)^2) over n elements (n >= 1). */
DT_API dt_status dt_k_mse_fwd(const float *pred, const float *target, int64_t n, float *loss);
/* dpred = dloss * 2 (pred - target) / n. */
DT_API dt_status dt_k_mse_bwd(const float *pred, const float *target, int64_t n, float dloss, float *dpred);

/* ---- pooling, NCHW --------------------------------------------------------- */
typedef struct {
    int64_t N, C, H, W;       /* input (N, C, H, W) */
    int64_t kh, kw;           /* window */
    int64_t sh, sw;           /* stride (PyTorch default: the window) */
    int64_t ph, pw;           /* padding, <= half the window */
} dt_k_pool2d_shape;
/* Output height P and width Q, floor mode (validates the shape). */
DT_API dt_status dt_k_pool2d_out_size(const dt_k_pool2d_shape *s, int64_t *P, int64_t *Q);
/* y (N, C, P, Q) = max over each window (padding never wins). argmax: NULL
 * or (N, C, P, Q) indices h*W + w into the input plane, for the backward. */
DT_API dt_status dt_k_maxpool2d_fwd(const dt_k_pool2d_shape *s, const float *x, float *y, int32_t *argmax);
/* dx (N, C, H, W) = scatter of dy through argmax (overlapping windows add). */
DT_API dt_status dt_k_maxpool2d_bwd(const dt_k_pool2d_shape *s, const float *dy, const int32_t *argmax,
                                    float *dx);
/* Max pooling on channel-blocked x / y / dy / dx (block B = 8 or 16,
 * C % B == 0); argmax is laid out like y and holds h*W + w as in the plain
 * kernel. */
DT_API dt_status dt_k_maxpool2d_fwd_blocked(const dt_k_pool2d_shape *s, int B, const float *x, float *y,
                                            int32_t *argmax);
DT_API dt_status dt_k_maxpool2d_bwd_blocked(const dt_k_pool2d_shape *s, int B, const float *dy,
                                            const int32_t *argmax, float *dx);
/* Average pooling; count_include_pad as PyTorch (default true there). */
DT_API dt_status dt_k_avgpool2d_fwd(const dt_k_pool2d_shape *s, const float *x, float *y,
                                    bool count_include_pad);
DT_API dt_status dt_k_avgpool2d_bwd(const dt_k_pool2d_shape *s, const float *dy, float *dx,
                                    bool count_include_pad);

/* ---- normalisation ---------------------------------------------------------- */
/* Batch norm over (N, C, HW) (HW = H*W; 1 for BatchNorm1d on (N, C)).
 * gamma, beta: C floats or NULL (affine=false). Training forward uses the
 * batch statistics (biased variance), writes save_mean and save_invstd
 * (C floats each, = 1/sqrt(var + eps)) for the backward, and when
 * running_mean/running_var are not NULL updates them as PyTorch:
 * r = (1 - momentum) r + momentum * stat, with the UNBIASED batch variance
 * (N*HW/(N*HW-1)) for running_var. N*HW must be >= 2 in training. */
DT_API dt_status dt_k_batchnorm_train_fwd(const float *x, int64_t N, int64_t C, int64_t HW,
                                          const float *gamma, const float *beta, float eps,
                                          float momentum, float *running_mean, float *running_var,
                                          float *y, float *save_mean, float *save_invstd);
/* Eval forward with the running statistics. */
DT_API dt_status dt_k_batchnorm_eval_fwd(const float *x, int64_t N, int64_t C, int64_t HW,
                                         const float *gamma, const float *beta, const float *running_mean,
                                         const float *running_var, float eps, float *y);
/* Training-mode backward: dx (may be NULL), dgamma, dbeta (C each, NULL to
 * skip) from x, dy and the saved statistics. gamma NULL = 1. */
DT_API dt_status dt_k_batchnorm_bwd(const float *x, const float *dy, int64_t N, int64_t C, int64_t HW,
                                    const float *gamma, const float *save_mean, const float *save_invstd,
                                    float *dx, float *dgamma, float *dbeta);
/* Layer norm over the last `cols` elements of each of `rows` rows
 * (normalized_shape flattened). gamma, beta: cols floats or NULL.
 * save_mean, save_rstd: rows floats each or NULL (needed by the backward). */
DT_API dt_status dt_k_layernorm_fwd(const float *x, int64_t rows, int64_t cols, const float *gamma,
                                    const float *beta, float eps, float *y, float *save_mean,
                                    float *save_rstd);
/* dx (may be NULL), dgamma, dbeta (cols each, NULL to skip). */
DT_API dt_status dt_k_layernorm_bwd(const float *x, const float *dy, int64_t rows, int64_t cols,
                                    const float *gamma, const float *save_mean, const float *save_rstd,
                                    float *dx, float *dgamma, float *dbeta);
/* Layer norm of x in dtype xt with its result written in dtype yt (each
 * f32, bf16 or f16): the bits of widening x, dt_k_layernorm_fwd and
 * rounding the f32 result once to yt (round to nearest even), in one pass
 * (GPT-2's layer norms under bf16 autocast write the bf16 the next matmul
 * reads). gamma, beta (f32, cols each or NULL), save_mean, save_rstd as
 * dt_k_layernorm_fwd's. Dtypes other than f32/bf16/f16: DT_ERR_UNSUPPORTED. */
DT_API dt_status dt_k_layernorm_fwd_lp(const void *x, dt_dtype xt, int64_t rows, int64_t cols, const float *gamma,
                                       const float *beta, float eps, void *y, dt_dtype yt, float *save_mean,
                                       float *save_rstd);
/* Its backward as the chain cast -> layernorm -> cast computes it: dy (f32)
 * is rounded to yt (the gradient of a yt result), dt_k_layernorm_bwd's
 * arithmetic runs on the widened x, dx (f32, may be NULL) gets xt values;
 * dgamma, dbeta (f32 column sums, NULL to skip) from the rounded dy. No
 * pass of its own for the roundings. dy_lp (NULL, or with yt bf16/f16): dy
 * given as yt values instead, widened as read (dy is then not read and may
 * be NULL): the result of dy where dy_lp holds dy rounded to yt. xt = yt =
 * f32 is dt_k_layernorm_bwd. */
DT_API dt_status dt_k_layernorm_bwd_lp(const void *x, dt_dtype xt, const float *dy, const void *dy_lp, dt_dtype yt,
                                       int64_t rows, int64_t cols, const float *gamma, const float *save_mean,
                                       const float *save_rstd, float *dx, float *dgamma, float *dbeta);

/* ---- activations ----------------------------------------------------------- */
/* y = max(x, 0). y may alias x. */
DT_API dt_status dt_k_relu_fwd(const float *x, float *y, int64_t n);
/* dx = dy where x > 0, else 0 (x: the forward input; passing the output y
 * works too). dx may alias dy. */
DT_API dt_status dt_k_relu_bwd(const float *x, const float *dy, float *dx, int64_t n);
/* ReLU on bf16/f16 data (dtype t) in one pass: each element widened to f32
 * and rounded back with dt_k_convert, block by block, so the results are
 * bit-identical to dt_k_convert + dt_k_relu_fwd + dt_k_convert. y may alias x. */
DT_API dt_status dt_k_relu_fwd_lp(dt_dtype t, const void *x, void *y, int64_t n);
/* Its backward: dx = dy rounded to t (dt_k_convert, the gradient of a t
 * tensor holds values of t) where the forward output y (of dtype t) > 0,
 * else 0; dx is f32, as every gradient. dx may alias dy. */
DT_API dt_status dt_k_relu_bwd_lp(dt_dtype t, const void *y, const float *dy, float *dx, int64_t n);
typedef enum { DT_K_GELU_ERF = 0, DT_K_GELU_TANH } dt_k_gelu_approx;
/* GELU as PyTorch (approximate='none' or 'tanh'). y may alias x. */
DT_API dt_status dt_k_gelu_fwd(const float *x, float *y, int64_t n, dt_k_gelu_approx approx);
/* dx = dy * gelu'(x). dx may alias dy. */
DT_API dt_status dt_k_gelu_bwd(const float *x, const float *dy, float *dx, int64_t n,
                               dt_k_gelu_approx approx);
/* Soft capping (Gemma 2's logits): y = cap tanh(x / cap), cap positive and
 * finite. y may alias x. */
DT_API dt_status dt_k_softcap_fwd(const float *x, float *y, int64_t n, float cap);
/* dx = dy (1 - (y / cap)^2) from the forward's output y. dx may alias dy. */
DT_API dt_status dt_k_softcap_bwd(const float *y, const float *dy, float *dx, int64_t n, float cap);
/* Fused bias + GELU over (rows, cols): y = gelu(x + bias), bias [cols] or
 * NULL. y may alias x. */
DT_API dt_status dt_k_bias_gelu_fwd(const float *x, const float *bias, int64_t rows, int64_t cols, float *y,
                                    dt_k_gelu_approx approx);
/* From the forward's x and bias: dx = dy * gelu'(x + bias) (NULL to skip;
 * may alias dy) and dbias = column sums of that (NULL to skip; written, not
 * added; summed in row order whatever the thread count). */
DT_API dt_status dt_k_bias_gelu_bwd(const float *x, const float *bias, const float *dy, int64_t rows,
                                    int64_t cols, float *dx, float *dbias, dt_k_gelu_approx approx);
/* The tanh form of dt_k_bias_gelu_fwd with x in bf16/f16 (dtype t) and an
 * f32 bias; y of dtype yt: f32, or t (the f32 result rounded). Bit-identical
 * to widening x with dt_k_convert first (and rounding y with it), without
 * the widened copy. */
DT_API dt_status dt_k_bias_gelu_fwd_lp(dt_dtype t, const void *x, const float *bias, int64_t rows, int64_t cols,
                                       void *y, dt_dtype yt, dt_k_gelu_approx approx);
/* Its backward: dx and dbias as dt_k_bias_gelu_bwd on the widened x, then
 * dx rounded to t's precision (held in f32: the gradient of a t tensor);
 * dbias from the unrounded values. round_dy: dy is first rounded to t (the
 * gradient of a result of dtype t, as its cast's backward rounds it).
 * dy_lp (may be NULL): dy given as t values instead (widened as read; dy
 * is then not read and may be NULL): round_dy's result where dy_lp holds
 * dy rounded to t. dx may alias dy. dx_lp (may be NULL): the rounded dx
 * stored as t as well, in the same pass; with dx NULL, there alone (no f32
 * dx written). */
DT_API dt_status dt_k_bias_gelu_bwd_lp(dt_dtype t, const void *x, const float *bias, const float *dy,
                                       const void *dy_lp, bool round_dy, int64_t rows, int64_t cols, float *dx,
                                       void *dx_lp, float *dbias, dt_k_gelu_approx approx);
/* Inverted dropout: element i is kept when dt_rng_uniform(key, offset + i)
 * >= p and then scaled by 1/(1-p), else zeroed. The mask depends only on
 * (key, offset + i): not on threads or call order. p in [0, 1); p = 0
 * copies. y may alias x. */
DT_API dt_status dt_k_dropout_fwd(const float *x, float *y, int64_t n, float p, dt_rng_key key,
                                  uint64_t offset);
/* dx = dy * mask / (1 - p), regenerating the mask from (key, offset): pass
 * the forward's values. dx may alias dy. */
DT_API dt_status dt_k_dropout_bwd(const float *dy, float *dx, int64_t n, float p, dt_rng_key key,
                                  uint64_t offset);

/* ---- attention ------------------------------------------------------------------ */
/* Multi-head scaled dot-product attention, blocked with an online softmax
 * (never a (T, T) matrix). qkv (B, T, 3C), C = H * D: q | k | v side by
 * side, head h in columns [h D, (h+1) D) of each (GPT-2's c_attn output).
 * y (B, T, C) = softmax(q k^T / sqrt(D) [+ causal mask]) v per head, heads
 * side by side; lse (B, H, T) receives each row's log-sum-exp of the scaled
 * scores (the backward's input). Dropout on the probabilities with p in
 * [0, 1): element (b, h, i, j) kept when dt_rng_uniform(key, ((b H + h) T +
 * i) T + j) >= p, scaled by 1/(1-p) (p = 0: key unused). D <= 256. The
 * softmax's exponentials are a polynomial within 2 ulp of expf (0 below
 * e^-87), 8 lanes at a time where the CPU has AVX2, with the same bits on
 * every instruction-set path. */
DT_API dt_status dt_k_attention_fwd(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, bool causal,
                                    float p, dt_rng_key key, float *y, float *lse);
/* dqkv (B, T, 3C) = the gradient of the forward above (WRITTEN, not added)
 * from its qkv, y, lse, the same causal/p/key, and dy (B, T, C). Recomputes
 * the probabilities block by block; deterministic for any thread count. */
DT_API dt_status dt_k_attention_bwd(const float *qkv, const float *y, const float *lse, const float *dy,
                                    int64_t B, int64_t T, int64_t H, int64_t D, bool causal, float p,
                                    dt_rng_key key, float *dqkv);
/* Causal attention with a sliding window and soft-capped scores, in
 * dt_k_attention_fwd's layout: query i sees the keys (i - window, i]
 * (window 0: every earlier one; Mistral's sliding_window), its scores s =
 * q.k / sqrt(D) capped to cap tanh(s / cap) (cap 0: none; Gemma 2's
 * attn_logit_softcapping) before the softmax; lse (B, H, T) the (capped)
 * scores' log-sum-exp. window >= 0, cap finite and >= 0, D <= 256, no
 * dropout; O(T window) work, never T x T memory. It runs
 * dt_k_attention_fwd's blocked kernel (causal), the key blocks outside
 * every row's window skipped and the window's first key masked inside its
 * block as the causal mask masks the diagonal (what the window hides is
 * never read), each block's scores capped as they are computed (tanh
 * within 1.5 ulp, in f32) before the softmax: window 0 or >= T without a
 * cap gives dt_k_attention_fwd's bits, and every ISA path gives the same
 * bits, with or without a cap. */
DT_API dt_status dt_k_attention_window_fwd(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                           int64_t window, float cap, float *y, float *lse);
/* Its backward: dqkv (B, T, 3C) written from the forward's qkv, y, lse and
 * dy (the capped scores recomputed, dS times tanh's derivative 1 -
 * tanh^2); sums in a fixed order whatever the thread count. */
DT_API dt_status dt_k_attention_window_bwd(const float *qkv, const float *y, const float *lse, const float *dy,
                                           int64_t B, int64_t T, int64_t H, int64_t D, int64_t window, float cap,
                                           float *dqkv);
/* dt_k_attention_window_fwd/_bwd with qkv in bf16/f16 (dtype t) read as it
 * is: dt_k_attention_fwd_heads_lp and _bwd_heads_lp (below) with the window
 * and the cap, their paths (the tiles too: the scores come out of a tile
 * product in f32 and are capped there), outputs (ylp, dqkv_lp) and bounds
 * (taken over the capped scores' P and dS); window 0 or >= T without a cap
 * gives their bits (causal, no dropout, h0 = 0, Ht = H). */
DT_API dt_status dt_k_attention_window_fwd_lp(dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                              int64_t window, float cap, float *y, void *ylp, float *lse);
DT_API dt_status dt_k_attention_window_bwd_lp(dt_dtype t, const void *qkv, const float *y, const float *lse,
                                              const float *dy, int64_t B, int64_t T, int64_t H, int64_t D,
                                              int64_t window, float cap, float *dqkv, void *dqkv_lp);
/* Every argument of the forms above at once, the others' general form:
 * qkv of dtype t (DT_F32, or DT_BF16/DT_F16 read as the _lp forms read it;
 * ylp and dqkv_lp as theirs, NULL with f32), heads [h0, h0 + H) of a layer
 * of Ht (the dropout mask's head index, as dt_k_attention_fwd_heads), the
 * causal mask or none, a sliding window and a soft cap (> 0 only with the
 * causal mask, else DT_ERR_INVALID_ARG), and dropout p on the
 * probabilities of the capped scores (the mask of dt_k_attention_fwd_heads,
 * applied after the row's sum: lse stays undropped; the backward's dS =
 * P (d dP - Di) (1 - tanh^2) with d the kept scale or 0). A window and a
 * cap of 0 give dt_k_attention_fwd_heads' (_lp's) bits, p = 0 the window
 * forms'. Mistral's, Qwen2's and Gemma 2's attention with transformers'
 * attention_dropout. */
DT_API dt_status dt_k_attention_ex_fwd(dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                       int64_t h0, int64_t Ht, bool causal, int64_t window, float cap, float p,
                                       dt_rng_key key, float *y, void *ylp, float *lse);
DT_API dt_status dt_k_attention_ex_bwd(dt_dtype t, const void *qkv, const float *y, const float *lse, const float *dy,
                                       int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal,
                                       int64_t window, float cap, float p, dt_rng_key key, float *dqkv,
                                       void *dqkv_lp);
/* The same for heads [h0, h0 + H) of a layer of Ht heads (tensor
 * parallelism: the rank's heads; tp.h): qkv, y, lse hold the H local heads
 * as above, and the dropout mask is the full layer's (element (b, h0 + h,
 * i, j) of the Ht-head index above), so the ranks together draw exactly the
 * single-process mask. h0 = 0, Ht = H: the functions above. */
DT_API dt_status dt_k_attention_fwd_heads(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0,
                                          int64_t Ht, bool causal, float p, dt_rng_key key, float *y, float *lse);
DT_API dt_status dt_k_attention_bwd_heads(const float *qkv, const float *y, const float *lse, const float *dy,
                                          int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht,
                                          bool causal, float p, dt_rng_key key, float *dqkv);
/* dt_k_attention_fwd_heads with qkv in bf16/f16 (dtype t), read as it is:
 * each task widens the rows it uses into its f32 tiles. On the scalar and
 * avx2 paths (dt_k_get_isa) y (f32) and lse are bit for bit those of
 * widening qkv first; on the avx512 and avx512_bf16 paths the sums use
 * fused multiply-adds and 16 partial sums, so they differ from those bits
 * by the f32 sums' rounding: each element within 2^-19 of the
 * tensor's largest |value| in the tests (tests/autograd/test_attention_lp;
 * about 2^-22 measured). On the avx512_bf16 path a bf16 qkv also has the
 * probabilities rounded to bf16 (to nearest even, after dropout's scaling;
 * the row sums use their f32 values) before they multiply v by vdpbf16ps,
 * as flash-attention kernels do for bf16 inputs (bf16 subnormals read as
 * 0): each element of y moves by at most 2^-8 (1 + 2^-6) of the sum of
 * |P_ij v_j| / l_i over its row's keys (bf16's rounding is relative 2^-8;
 * about 2^-8.4 measured against a double reference,
 * tests/kernels/test_attention_bf16), within 2^-7 of the tensor's largest
 * |value| in the tests (tests/autograd/test_attention_lp; lse keeps the
 * bound above). Where the CPU has AMX (AMX-TILE and AMX-BF16, the OS and
 * Linux allowing the tiles; not under DT_MAX_CPU_ISA=avx512 or lower, nor
 * with DT_ATTN_AMX=off; T >= 64 unless DT_ATTN_AMX=on: shorter sequences
 * measured faster on the rows) that path runs the products q k^T and P v on the
 * tiles (tdpbf16ps: the pairs of bf16 products exact, added in f32 one
 * after the other, bf16 subnormal inputs read as 0 and subnormal sums
 * flushed to 0), each row's softmax over all its keys at once: the same
 * bound (the same worst error measured). On a CPU with AVX512_BF16 but no
 * AMX (or AMX capped off by DT_MAX_CPU_ISA=avx512) the same tile-by-tile
 * products run on vdpbf16ps (T >= 96 unless DT_ATTN_AMX=on; off: never),
 * with the same bound. A task whose q, k or v holds an
 * infinity or a NaN runs the vdpbf16ps rows instead (the tiles' masked
 * and padded zeros would meet it: 0 x inf). ylp (B, T, C) of t, or NULL:
 * y rounded to t as well (the t result autocast keeps; on the fast paths
 * an element may round to the neighbour of the widened result's). */
DT_API dt_status dt_k_attention_fwd_heads_lp(dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                             int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key, float *y,
                                             void *ylp, float *lse);
/* Its backward, the casts' around the f32 one (bit for bit on the scalar
 * and avx2 paths, within the forward's bound on the avx512 ones): dy (f32,
 * the gradient of the t result) is rounded to t as it is read, the f32 y
 * and lse are the forward's, and dqkv (f32, WRITTEN) is rounded to t's
 * precision (the gradient of a t input). On the avx512_bf16 path a bf16
 * qkv has P and dS = P (dP - Di) / sqrt(D) rounded to bf16 before they
 * multiply dy, q and k (dv, dk, dq by vdpbf16ps): each element before its
 * final rounding to t moves by at most 2^-8 (1 + 2^-6) of the sum of its
 * terms' magnitudes (dv_j: P_ij |dy_i|, dq_i: |dS_ij k_j|, dk_j: |dS_ij
 * q_i|) plus, for dq and dk, 2^-14 of what dS's f32 inputs carry (P_ij
 * (sum_d |dy_i v_j| + |Di|) / sqrt(D) times |k_j| or |q_i|: dP - Di
 * cancels), within 2^-7 of the tensor's largest |value| beyond t's
 * rounding in the tests (tests/kernels/test_attention_bf16 checks each
 * element against a double reference). With AMX (as above; without it,
 * vdpbf16ps tile by tile) the six products S = q k^T, dP = dy v^T,
 * dq = dS k, dk^T = q^T dS, dv^T = dy^T P run on the tiles, dk and dv each one tile sum over the rows, dq added
 * key block by key block: the same bound; a head whose q, k, v or rounded
 * dy holds an infinity or a NaN runs the rows instead. dqkv_lp (B, T, 3C)
 * of t, or NULL: the same values stored as t as well, in the same pass.
 * dqkv may be NULL where dqkv_lp is given: the gradient is then written in
 * t alone, the same bits (where the tiles run, no f32 value is stored; the
 * rows sum in f32 rows of each thread's own). The _lp entry points above
 * and dt_k_attention_ex_bwd take the same two outputs. */
DT_API dt_status dt_k_attention_bwd_heads_lp(dt_dtype t, const void *qkv, const float *y, const float *lse,
                                             const float *dy, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0,
                                             int64_t Ht, bool causal, float p, dt_rng_key key, float *dqkv,
                                             void *dqkv_lp);
/* Where attention over a bf16 qkv runs its products in this process (the
 * CPU as DT_MAX_CPU_ISA caps it, DT_ATTN_AMX): "amx" (the AMX tiles) or
 * "avx512_bf16" (vdpbf16ps tile by tile, a CPU without AMX), with in
 * *min_t (if not NULL) the shortest sequence that takes them (shorter ones
 * run on the vdpbf16ps rows); NULL where every length runs on the rows or
 * the bf16 path is not the avx512_bf16 one. `dtrain info` prints it. */
DT_API const char *dt_k_attention_lp_tiles(int64_t *min_t);

/* Attention of a block of queries against one block of keys and values, the
 * result merged into a running one: the kernel of attention split along
 * the sequence (context parallelism, cp.h). q (B, Tq) rows, k and v (B, Tk)
 * rows, each row H heads of D side by side, with row strides ldq, ldk, ldv
 * (views into a packed (T, 3C) qkv work: stride 3C); lse's rows of head h
 * of batch b start at (b H + h) ldlse (ldlse >= Tq). Query row i is at
 * global position qpos0 + i, key j at kpos0 + j; causal: key j is visible
 * to row i iff kpos0 + j <= qpos0 + i, and with a sliding window (> 0;
 * causal only, else DT_ERR_INVALID_ARG; 0 none) also kpos0 + j > qpos0 + i
 * - window (the keys a window hides are never read). A soft cap (> 0; 0
 * none; finite, else DT_ERR_INVALID_ARG) scores with cap tanh(s / cap), as
 * dt_k_attention_window_fwd does (Gemma 2's attn_logit_softcapping). y (B,
 * Tq, stride ldy) and lse (B, H, Tq) are the running result: start with lse
 * = -INFINITY (y is then ignored) and add each block; the log-sum-exp rule
 *     lse' = log(e^lse + e^lse_b),  y' = y e^(lse - lse') + y_b e^(lse_b - lse')
 * makes the end result softmax(q k^T / sqrt(D)) v (of the capped scores)
 * over all the blocks, in any order. Rows that see no key of the block are
 * left unchanged. D <= 256. The scores' exponentials as
 * dt_k_attention_fwd's. drop (NULL: none) puts dropout on the block's
 * probabilities, the whole sequence's mask (dt_k_att_drop). */
typedef struct dt_k_att_drop {
    float p;        /* in [0, 1) */
    dt_rng_key key;
    int64_t bh0;    /* the mask's head index of the block's batch 0, head 0: b0 Ht + h0 */
    int64_t Ht;     /* heads of a batch in the mask (>= H): head h of batch b is bh0 + b Ht + h */
    int64_t T;      /* the whole sequence's length (every position of the block below it) */
} dt_k_att_drop;
/* Element (b, h, i, j) of a block is kept when dt_rng_uniform(key, ((bh0 +
 * b Ht + h) T + qpos0 + i) T + kpos0 + j) >= p, scaled by 1 / (1 - p):
 * the mask dt_k_attention_fwd_heads draws over the whole sequence (heads h0
 * ... of a layer of Ht), so the blocks of a ring together draw one process's.
 * lse stays that of the undropped scores. p outside [0, 1), or a mask whose
 * heads or length do not hold the block: DT_ERR_INVALID_ARG. With a
 * window or a cap the mask applies to the probabilities of the capped
 * scores within the window, as dt_k_attention_ex_fwd's. */
DT_API dt_status dt_k_attention_part_fwd(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                                         int64_t ldv, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D,
                                         int64_t qpos0, int64_t kpos0, bool causal, int64_t window, float cap,
                                         const dt_k_att_drop *drop, float *y, int64_t ldy, float *lse,
                                         int64_t ldlse);
/* The backward of one block: with the FINAL y and lse (after every block)
 * and dy, ADDS this block's terms into dq (B, Tq), dk and dv (B, Tk) (row
 * strides as named); summed over all the blocks, the gradient of the whole
 * attention. Deterministic for any thread count. drop as the forward's
 * (the same mask regenerated). */
DT_API dt_status dt_k_attention_part_bwd(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                                         int64_t ldv, const float *y, int64_t ldy, const float *lse, int64_t ldlse,
                                         const float *dy, int64_t lddy, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D,
                                         int64_t qpos0, int64_t kpos0, bool causal, int64_t window, float cap,
                                         const dt_k_att_drop *drop, float *dq, int64_t lddq, float *dk, int64_t lddk,
                                         float *dv, int64_t lddv);

/* ---- block quantization ------------------------------------------------------------- */
/* Symmetric block quantization for communication that carries fewer bytes
 * (ZeRO++'s quantized weights and gradients). x (n) in blocks of `block`
 * elements (the last may be shorter), one scale per block: scales[b] =
 * max |x_i| / qmax (qmax 127 for bits = 8, 7 for bits = 4), q_i =
 * round-half-even(x_i / scales[b]) in [-qmax, qmax], so the dequantized
 * value is within scales[b] / 2 of x_i (a block of zeros is exact). q holds
 * dt_k_quant_bytes(n, bits) bytes: int8 one per element; int4 two per byte,
 * element 2k in the low nibble, two's complement. scales holds
 * ceil(n / block) floats. A block holding a NaN or an infinity gets a NaN
 * scale and dequantizes to NaN throughout: an overflow is never hidden by
 * the quantization. */
DT_API dt_status dt_k_quantize_blocks(const float *x, int64_t n, int64_t block, int bits, void *q, float *scales);
/* out (n) = (accumulate ? out + : ) q_i scales[i / block]. */
DT_API dt_status dt_k_dequantize_blocks(const void *q, const float *scales, int64_t n, int64_t block, int bits,
                                        float *out, bool accumulate);
/* Bytes of q for n elements at `bits` (8: n, 4: ceil(n / 2)); -1 for a bad argument. */
DT_API int64_t dt_k_quant_bytes(int64_t n, int bits);

/* ---- embedding --------------------------------------------------------------- */
/* out (n, dim) = rows idx[i] of table (num, dim); idx of DT_I64 or DT_I32.
 * An index outside [0, num) is DT_ERR_RANGE. */
DT_API dt_status dt_k_embedding_fwd(const float *table, int64_t num, int64_t dim, const void *idx,
                                    dt_dtype idx_type, int64_t n, float *out);
/* dtable (num, dim) = zero, then row idx[i] += dout row i for i in order:
 * a deterministic scatter-add independent of the thread count. */
DT_API dt_status dt_k_embedding_bwd(const float *dout, const void *idx, dt_dtype idx_type, int64_t n,
                                    int64_t num, int64_t dim, float *dtable);

/* ---- Llama-family blocks: RMSNorm, rotary embeddings, SwiGLU -------------------- */
/* RMSNorm over each row of x (rows, cols): y = x * rstd * w (w [cols] or
 * NULL for 1), rstd = 1/sqrt(mean(x^2) + eps), the mean summed in double;
 * save_rstd (rows, may be NULL) keeps rstd for the backward. eps > 0. */
DT_API dt_status dt_k_rmsnorm_fwd(const float *x, int64_t rows, int64_t cols, const float *w, float eps, float *y,
                                  float *save_rstd);
/* dx (may be NULL) and dw (cols, may be NULL; a column sum over rows in row
 * order, independent of the thread count) of dt_k_rmsnorm_fwd. */
DT_API dt_status dt_k_rmsnorm_bwd(const float *x, const float *dy, int64_t rows, int64_t cols, const float *w,
                                  const float *save_rstd, float *dx, float *dw);
/* dt_k_rmsnorm_fwd on low-precision x (t = bf16 or f16, uint16_t arrays;
 * w f32 or NULL): x widened row by row, y (t) rounded once; the same bits
 * as widening, dt_k_rmsnorm_fwd and rounding, in one pass. */
DT_API dt_status dt_k_rmsnorm_fwd_lp(const void *x, dt_dtype t, int64_t rows, int64_t cols, const float *w,
                                     float eps, void *y, float *save_rstd);
/* Its backward as the chain cast -> rmsnorm -> cast computes it: dy (f32)
 * is rounded to t, dt_k_rmsnorm_bwd runs on the widened x; dx (f32, may be
 * NULL) gets t values, dw (f32, may be NULL) the f32 column sums (the
 * caller rounds it to the weight's dtype). */
DT_API dt_status dt_k_rmsnorm_bwd_lp(const void *x, dt_dtype t, const float *dy, int64_t rows, int64_t cols,
                                     const float *w, const float *save_rstd, float *dx, float *dw);
/* Rotary position embedding in the rotate-half layout on x (B, T, H * hd):
 * within the first rot values of each head (the rotary width: hd, or less
 * for a partial rotary factor) the pairs (j, j + rot/2), j < rot/2, are
 * rotated by the angle of position t and frequency j: y_j = x_j cos -
 * x_{j+rot/2} sin, y_{j+rot/2} = x_{j+rot/2} cos + x_j sin, with cos, sin
 * (T, rot/2) the tables of the angles; values rot..hd-1 pass unchanged.
 * inverse: rotate by minus the angle (the backward). hd even, rot even in
 * [2, hd]. y may alias x. */
DT_API dt_status dt_k_rope(const float *x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t rot,
                           const float *cos_t, const float *sin_t, bool inverse, float *y);
/* dt_k_rope on low-precision data (t = bf16 or f16, uint16_t arrays): x
 * widened, rotated in f32, y rounded once to t; the same bits as widening,
 * dt_k_rope and rounding, in one pass. y may alias x. */
DT_API dt_status dt_k_rope_lp(const void *x, dt_dtype t, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t rot,
                              const float *cos_t, const float *sin_t, void *y);
/* Its backward as the chain cast -> rope -> cast computes it: dy (f32) is
 * rounded to t, rotated by minus the angle, and dx (f32) gets the result
 * rounded to t values. dx may alias dy. dx_lp (may be NULL): the same
 * values stored as t, in the same pass. */
DT_API dt_status dt_k_rope_bwd_lp(const float *dy, dt_dtype t, int64_t B, int64_t T, int64_t H, int64_t hd,
                                  int64_t rot, const float *cos_t, const float *sin_t, float *dx, void *dx_lp);
/* y = silu(g) * u = g sigmoid(g) u, n elements. y may alias g or u. */
DT_API dt_status dt_k_swiglu_fwd(const float *g, const float *u, int64_t n, float *y);
/* dg and du (either may be NULL) of dt_k_swiglu_fwd from dy. */
DT_API dt_status dt_k_swiglu_bwd(const float *g, const float *u, const float *dy, int64_t n, float *dg, float *du);
/* SwiGLU on low-precision data (t = bf16 or f16, uint16_t arrays): y (t) =
 * dt_k_swiglu_fwd of g and u widened, rounded once to t; block by block in
 * cache, the same bits as widening, dt_k_swiglu_fwd and rounding. */
DT_API dt_status dt_k_swiglu_fwd_lp(const void *g, const void *u, dt_dtype t, int64_t n, void *y);
/* Its backward as the chain cast -> swiglu -> cast computes it: dy (f32) is
 * rounded to t, dt_k_swiglu_bwd runs on the widened g, u, and dg, du (f32
 * arrays, either may be NULL) get its results rounded to t values; dg_lp,
 * du_lp (each may be NULL; only beside its f32 array): the same values
 * stored as t, in the same pass. */
DT_API dt_status dt_k_swiglu_bwd_lp(const void *g, const void *u, dt_dtype t, const float *dy, int64_t n, float *dg,
                                    float *du, void *dg_lp, void *du_lp);
/* The backward of packing grouped-query q, k, v rows (rows = B T; H heads
 * of q, KV of k and v, hd each; KV divides H) into qkv rows [q | k per q
 * head | v per q head] of low-precision data (t = bf16 or f16), as the
 * chain cast -> pack -> cast computes it: dqkv (rows, 3 H hd, f32) is
 * rounded to t; dq (rows, H hd) gets its q part, dk and dv (rows, KV hd)
 * the sums of their H / KV copies in head order (from zero), rounded to t
 * values; dk_lp, dv_lp (each may be NULL; only beside its f32 array): the
 * same values stored as t. Any of dq, dk, dv may be NULL. One pass. */
DT_API dt_status dt_k_gqa_pack_bwd_lp(const float *dqkv, dt_dtype t, int64_t rows, int64_t H, int64_t KV, int64_t hd,
                                      float *dq, float *dk, float *dv, void *dk_lp, void *dv_lp);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_KERNELS_H */
