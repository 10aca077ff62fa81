/* Matmul through oneDNN: C = alpha op(A) op(B) + beta C + bias.
 *
 * Transposes are expressed as strides of the memory descriptors, so no data
 * moves for op(X) = X^T. alpha becomes oneDNN's output scale, beta a sum
 * post-op, bias the matmul's bias input; all three are baked into the
 * primitive, which is cached under (shape, strides, flags, dtype, alpha,
 * beta, bias?). A batched call is one 3-D matmul (batch stride 0 broadcasts
 * one matrix).
 *
 * bf16/f16: oneDNN 2.6 implements bf16 matmul only on AVX-512 (avx512_core and
 * up), f16 only on AVX512_FP16 machines. Where it reports "unimplemented" (an AVX2 CPU such as this VM), the
 * bf16/f16 inputs are widened to f32 (exact) into a scratch buffer kept with the
 * cached primitive and an f32 matmul runs: same numbers as a native bf16
 * matmul with f32 accumulation, at f32 speed. dt_k_bench_matmul reports
 * which path ran.
 *
 * Implementation: a 2-D product runs on oneDNN's gemm-based matmul
 * ("gemm:jit") wherever oneDNN lists it, not on its first choice (brgemm on
 * AVX-512). Measured on one core of an AVX512_BF16 EPYC over GPT-2 124M's
 * 15 GEMM shapes at 2048 rows (bench/onednn_matmul.sh, loaded machine):
 * gemm:jit 465-510 GFLOP per CPU-second in bf16 against brgemm's 370-495
 * (the LM head's backward 480 against 380), 225-250 in f32 against
 * 130-250; a step's GEMM sum 3.15 CPU s against 3.50 (bf16), 6.31 against
 * 7.66 (f32). Products of fewer than 2^24 multiply-adds (unmeasured) and
 * batched (3-D) products keep oneDNN's first choice, and so do
 * products with a bf16/f16 result (the gemm-based matmul sums into an f32
 * scratch of the whole result: +490 MiB peak RSS in GPT-2 124M's bf16 step
 * at B=8 T=256, for its logits) and every product where oneDNN runs AMX
 * code (its gemm-based bf16 matmul does not use the tiles; unmeasured there
 * for f32).
 *
 * Threads: on nt >= 2 threads a large 2-D product runs as nt slabs of its
 * output, each a single-threaded call, see "slabs" below; not a bf16/f16
 * product where oneDNN runs AMX (one call: its brgemm splits it over the
 * threads on the tiles; a slab's one-thread primitive over a transposed A
 * or a column block of C fell back to gemm:jit without the tiles, and a
 * GPT-2 step's GEMMs took twice as long, measured on a Xeon with AMX).
 *
 * bf16 on a CPU with AMX: oneDNN's brgemm runs on the tiles itself (isa
 * avx512_core_amx); dtrain's own AMX GEMM (gemm_amx.c) runs instead for
 * the products its auto rule picks (2^27 multiply-adds or more, every
 * dimension 256 or more: a training step's GEMMs, which it ran about 10%
 * faster than oneDNN 2.6 in all, idle), or for all where DT_AMX_GEMM=on
 * asks for it;
 * dt_k_matmul_amx() says which.
 *
 * Leading dimensions that are multiples of 4 KiB: oneDNN 2.6's f32 GEMM
 * (gemm:jit) runs at half speed on AVX2 when B's rows are a multiple of
 * 1024 floats apart and M is small, e.g. GPT-2's c_fc forward, [256, 768] x
 * [768, 3072]: 44 GFLOP/s a core against 89 with rows 3080 floats apart
 * (cache-set conflicts: every row of a column block maps to the same sets).
 * Such a 2-D f32 product copies B into rows PAD_EXTRA floats longer (kept with
 * the cached primitive, whose B descriptor has that stride) and multiplies
 * the copy: the same products in the same order, so the same result;
 * except where oneDNN runs avx512_core_amx, whose f32 kernels read such a
 * B faster in place (pad_b).
 *
 * Shapes that vary (dt_k_matmul_set_varying): a mixture-of-experts block
 * gives each expert the rows routed to it, a different count every step (M
 * of its forward and input gradient, K of its weight gradient). A primitive
 * per shape would be generated code per shape: on a Xeon with AMX, 2
 * threads, bf16 256 x 384 x 512 took 0.14-0.2 ms a call once created, 0.76
 * ms on a new M and 3.8 ms on a new K (the weight gradient), and each one
 * stays cached, so a Qwen3-MoE-like model's step spent about a third of its
 * time creating primitives and its memory grew every step. Products the
 * calling thread marks as varying run where nothing is generated per shape:
 * bf16 on dtrain's AMX GEMM where it runs (it takes any shape), else one
 * oneDNN primitive for all M and K of a (transposes, N, dtypes, alpha,
 * beta, bias) with M, K and the strides that follow given at run time
 * (oneDNN's gemm-based matmul, its kernels generated once per ISA; bf16
 * widened to f32 in the entry's scratch where oneDNN has no bf16 matmul);
 * where oneDNN has no such primitive at all they run as any other
 * product. */
#include "kernels/gemm_amx.h"
#include "kernels_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Most slabs one product is split into (one per thread). */
#define MM_MAX_SLABS 64

typedef struct mm_entry {
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
    bool emulate;               /* bf16 widened to f32 */
    bool bias_post;             /* bias added by a binary post-op (alpha != 1) */
    int64_t a_elems, b_elems;   /* elements to widen when emulating */
    float *scratch;             /* a_elems + b_elems floats, emulation only (varying: a_elems floats, its size) */
    int64_t pad_rows, pad_cols; /* B copied into rows of pad_cols + PAD_EXTRA floats (0: not padded) */
    float *pad;                 /* that copy */
    int64_t split;              /* columns per call of a split product (0: one call), see split_n */
    struct mm_entry *tail;      /* the split product's last, narrower columns (NULL: none) */
    bool gemm_impl;             /* oneDNN's gemm-based implementation (see the top) */
    int nslab;                  /* > 1: the product runs as nslab single-threaded slabs, see slab_plan */
    bool slab_n;                /* the slabs split N (else M) */
    int64_t slab_lo[MM_MAX_SLABS + 1]; /* slab i covers rows (or columns) slab_lo[i] .. slab_lo[i + 1] - 1 */
    struct mm_entry *slab[MM_MAX_SLABS]; /* their primitives, created for one thread */
    dnnl_stream_t stream;       /* a slab's own stream (slabs run concurrently) */
    pthread_mutex_t lock;       /* guards scratch and pad */
} mm_entry;

static void mm_entry_free(void *p)
{
    mm_entry *e = p;
    if (!e)
        return;
    if (e->prim)
        dnnl_primitive_destroy(e->prim);
    dt_free(e->scratch);
    dt_free(e->pad);
    mm_entry_free(e->tail);
    for (int i = 0; i < e->nslab; i++)
        mm_entry_free(e->slab[i]);
    if (e->stream)
        dnnl_stream_destroy(e->stream);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Memory descriptor of a (batch, rows, cols) matrix stored row-major, or
 * transposed (stored (cols, rows)) when trans; 2-D when batch_dims is 0. */
static void mat_md(dnnl_memory_desc_t *md, int batch_dims, int64_t batch, int64_t stride, int64_t rows,
                   int64_t cols, bool trans, dnnl_data_type_t t, int64_t ld)
{
    if (batch_dims) {
        dnnl_dims_t d = {stride ? batch : 1, rows, cols};
        dnnl_dims_t s = {stride ? stride : rows * cols, trans ? 1 : cols, trans ? rows : 1};
        dnnl_memory_desc_init_by_strides(md, 3, d, t, s);
    } else {
        dnnl_dims_t d = {rows, cols};
        int64_t l = ld ? ld : trans ? rows : cols; /* elements between stored rows */
        dnnl_dims_t s = {trans ? 1 : l, trans ? l : 1};
        dnnl_memory_desc_init_by_strides(md, 2, d, t, s);
    }
}

/* Floats added to each row of a padded B: rows 64 bytes (a cache line)
 * more than a multiple of 4 KiB apart. */
#define PAD_EXTRA 16

/* Whether oneDNN runs its AMX code (isa avx512_core_amx) here: its f32
 * kernels are then not gemm:jit's, which the padded copy and the column
 * blocks below were measured against. */
static bool onednn_amx(void) { return dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx; }

/* Whether an f32 2-D product copies B to padded rows (see the top): B not
 * transposed, its K rows of N floats a multiple of 1024 floats apart, and M
 * at most 384 (measured: M 128 and 256 at half speed, 512 not; a
 * transposed B with K = 3072 runs at the same speed padded or not). Not
 * where oneDNN runs avx512_core_amx: its f32 kernels there read such a B
 * faster in place (the Xeon with AMX, 2 threads, 12 cold operand sets:
 * 256 x 3072 x 768 with a bias 4.26-4.31 ms padded, 3.88-4.02 not; its
 * AVX2 kernels, capped, 6.8 against 7.3: the copy pays only there). */
static bool pad_b(bool tb, int64_t M, int64_t N)
{
    return !tb && M <= 384 && N >= 1024 && N % 1024 == 0 && !onednn_amx();
}

/* B (pad_rows x pad_cols) into e->pad with rows pad_cols + PAD_EXTRA apart. */
static void copy_padded(const mm_entry *e, const float *B)
{
    int64_t rows = e->pad_rows, cols = e->pad_cols, ld = cols + PAD_EXTRA;
    float *dst = e->pad;
    int nt = dt__threads_for(rows * cols);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * ld, B + r * cols, (size_t)cols * sizeof(float));
}

/* Columns per call when an f32 2-D product A B^T with few rows and very many
 * columns runs as several calls over column blocks (0: one call). oneDNN
 * 2.6's gemm:jit runs GPT-2's LM head, [256, 768] x [768, 50257] with B
 * transposed (the tied embedding [V, C]), at 76 GFLOP/s a core on this
 * AVX2 machine; in blocks of 512 columns (contiguous rows of the
 * embedding, each block's C columns at row stride N) at 84. Each output
 * element is still one dot product over the whole K. Only for C = A B^T
 * (alpha 1, beta 0, no bias): oneDNN's post-ops on the strided C blocks
 * ran far slower. Not where oneDNN runs avx512_core_amx: one call is
 * faster there (the Xeon with AMX, 2 threads: that head's logits 60-66 ms
 * against 67-71 in blocks). */
#define SPLIT_COLS 512

static int64_t split_n(bool ta, bool tb, int64_t M, int64_t N)
{
    return !ta && tb && M <= 384 && N >= 16 * SPLIT_COLS && !onednn_amx() ? SPLIT_COLS : 0;
}

static dnnl_data_type_t dnnl_type(dt_dtype t)
{
    return t == DT_BF16 ? dnnl_bf16 : t == DT_F16 ? dnnl_f16 : dnnl_f32;
}

/* The primitive descriptor of oneDNN's gemm-based matmul ("gemm:jit") for
 * md, else (none listed) its first choice. */
static dnnl_status_t pd_gemm(dnnl_primitive_desc_t *pd, const dnnl_matmul_desc_t *md, const_dnnl_primitive_attr_t attr,
                             dnnl_engine_t eng)
{
    dnnl_primitive_desc_iterator_t it = NULL;
    dnnl_status_t s = dnnl_primitive_desc_iterator_create(&it, md, attr, eng, NULL);
    if (s != dnnl_success)
        return s;
    *pd = NULL;
    do {
        dnnl_primitive_desc_t p = dnnl_primitive_desc_iterator_fetch(it);
        const char *name = NULL;
        if (p && dnnl_primitive_desc_query(p, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name &&
            !strncmp(name, "gemm:", 5)) {
            *pd = p;
            break;
        }
        if (p)
            dnnl_primitive_desc_destroy(p);
    } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    dnnl_primitive_desc_iterator_destroy(it);
    return *pd ? dnnl_success : dnnl_primitive_desc_create(pd, md, attr, eng, NULL);
}

static dt_status mm_build(mm_entry *e, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K,
                          int64_t sa, int64_t sb, int64_t sc, dnnl_data_type_t t, float alpha, float beta,
                          bool bias, int64_t lda, int64_t ldb, int64_t ldc, dnnl_data_type_t ct)
{
    const char *what = "dt_k_matmul";
    dnnl_engine_t eng = dt__dnnl_engine();
    if (!eng)
        return dt_last_status();
    int bd = batch > 1 || sa || sb ? 1 : 0;
    if (batch == 1)
        bd = 0;
    mat_md(&e->a_md, bd, batch, sa, M, K, ta, t, lda);
    mat_md(&e->b_md, bd, batch, sb, K, N, tb, t, ldb);
    mat_md(&e->c_md, bd, batch, sc, M, N, false, ct, ldc);
    if (bd) {
        dnnl_dims_t d = {1, 1, N};
        dnnl_memory_desc_init_by_tag(&e->bias_md, 3, d, dnnl_f32, dnnl_abc);
    } else {
        dnnl_dims_t d = {1, N};
        dnnl_memory_desc_init_by_tag(&e->bias_md, 2, d, dnnl_f32, dnnl_ab);
    }
    /* oneDNN scales its bias input by the output scale; our bias is added
     * after alpha, so with alpha != 1 it becomes a binary-add post-op. */
    e->bias_post = bias && alpha != 1.0f;
    dnnl_matmul_desc_t md;
    dnnl_status_t s = dnnl_matmul_desc_init(&md, &e->a_md, &e->b_md, bias && !e->bias_post ? &e->bias_md : NULL,
                                            &e->c_md);
    if (s != dnnl_success)
        return dt__dnnl_err(s, what);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dt_status st = DT_OK;
    if ((s = dnnl_primitive_attr_create(&attr)) != dnnl_success)
        goto dnnl_fail;
    if (alpha != 1.0f && (s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha)) != dnnl_success)
        goto dnnl_fail;
    if (beta != 0.0f || e->bias_post) {
        if ((s = dnnl_post_ops_create(&po)) != dnnl_success)
            goto dnnl_fail;
        if (beta != 0.0f && (s = dnnl_post_ops_append_sum(po, beta)) != dnnl_success)
            goto dnnl_fail;
        if (e->bias_post && (s = dnnl_post_ops_append_binary(po, dnnl_binary_add, &e->bias_md)) != dnnl_success)
            goto dnnl_fail;
        if ((s = dnnl_primitive_attr_set_post_ops(attr, po)) != dnnl_success)
            goto dnnl_fail;
    }
    s = e->gemm_impl ? pd_gemm(&pd, &md, attr, eng) : dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL);
    if (s != dnnl_success)
        goto dnnl_fail;
    st = dt__prim_create(&e->prim, pd, what);
    goto out;
dnnl_fail:
    st = dt__dnnl_err(s, what);
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return st;
}

/* e's primitive on stream, waited for, over the operands at a, b, C (and
 * bias). No dt_error here: slabs run it on other threads, whose messages
 * are their own; the caller reports. */
static dnnl_status_t mm_exec_mds(const mm_entry *e, const dnnl_memory_desc_t *amd, const dnnl_memory_desc_t *bmd,
                                 const dnnl_memory_desc_t *cmd, dnnl_engine_t eng, dnnl_stream_t stream,
                                 const void *a, const void *b, void *C, const float *bias, float beta)
{
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, mbias = NULL;
    dnnl_status_t ds;
    if ((ds = dnnl_memory_create(&ma, amd, eng, (void *)a)) != dnnl_success ||
        (ds = dnnl_memory_create(&mb, bmd, eng, (void *)b)) != dnnl_success ||
        (ds = dnnl_memory_create(&mc, cmd, eng, C)) != dnnl_success ||
        (bias && (ds = dnnl_memory_create(&mbias, &e->bias_md, eng, (void *)bias)) != dnnl_success))
        goto out;
    int bias_idx = beta != 0.0f ? 1 : 0; /* position of the binary post-op */
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma},
                               {DNNL_ARG_WEIGHTS, mb},
                               {DNNL_ARG_DST, mc},
                               {e->bias_post ? (DNNL_ARG_ATTR_MULTIPLE_POST_OP(bias_idx) | DNNL_ARG_SRC_1)
                                             : DNNL_ARG_BIAS,
                                mbias}};
    ds = dnnl_primitive_execute(e->prim, stream, bias ? 4 : 3, args);
    if (ds == dnnl_success)
        ds = dnnl_stream_wait(stream);
out:
    if (ma)
        dnnl_memory_destroy(ma);
    if (mb)
        dnnl_memory_destroy(mb);
    if (mc)
        dnnl_memory_destroy(mc);
    if (mbias)
        dnnl_memory_destroy(mbias);
    return ds;
}

static dnnl_status_t mm_exec_on(const mm_entry *e, dnnl_engine_t eng, dnnl_stream_t stream, const void *a,
                                const void *b, void *C, const float *bias, float beta)
{
    return mm_exec_mds(e, &e->a_md, &e->b_md, &e->c_md, eng, stream, a, b, C, bias, beta);
}

/* ---- slabs -------------------------------------------------------------------- */
/* A product on nt >= 2 threads runs as nt slabs of its output (row blocks
 * of C, or column blocks when N > M, see slab_plan), each a
 * single-threaded oneDNN call, all in one OpenMP region (oneDNN runs a
 * primitive on the calling thread alone inside a parallel region). oneDNN
 * 2.6 splitting one GEMM over two threads loses 10-30% of its one-thread
 * rate per core on GPT-2's shapes; slabs keep each thread at its
 * one-thread rate. A slab's primitive is created for one thread (the
 * same blocking as the whole product's at one thread) and slabs start at
 * multiples of 48 rows (the AVX-512 kernels' block), so on AVX-512 each
 * output is the same dot product, in the same K order, as a one-thread
 * run's: the same bits (tests/kernels/test_matmul). oneDNN's AVX2 kernels
 * block a product by other sizes: there a slab's last bits can differ from
 * a one-thread run's (as a whole product's on 3 threads differs from one
 * thread's), within the same bounds. On those AVX2 kernels a one-thread
 * call over a column block of a long B whose rows are a multiple of 4 KiB
 * apart runs at half its rate (the cache-set conflicts of "Leading
 * dimensions" at the top, met at any M), where oneDNN's own two-thread split
 * does not: Paddle's MLP, [512, 1024] x [1024, 4096] x [4096, 1024], its
 * second product took 52 ms as two slabs against 25-30 as one call (AVX2
 * EPYC, 2 threads, cold operands), the MLP step 0.88x with one call. Such a
 * product (B not transposed, N a multiple of 1024, K of 2048 or more) runs
 * as one call there (slab_conflicts). With K 256-768 (GPT-2's c_fc, its
 * weight gradient) the slabs stayed as fast or faster, so they keep them. */

/* Multiply-adds below which a product runs as one call (a slab's start-up
 * would cost more than the split gains). */
#define SLAB_MIN_WORK ((int64_t)1 << 24)
/* Slab boundaries fall on multiples of this many rows (columns). */
#define SLAB_ALIGN 48

/* Whether a slab of op(A) op(B) would be a one-thread call over a column
 * block of a long B with rows a multiple of 4 KiB apart on oneDNN's AVX2
 * kernels, which runs at half speed (see above). */
#ifdef _OPENMP
static bool slab_conflicts(bool tb, int64_t N, int64_t K)
{
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), avx512 = (unsigned)dnnl_cpu_isa_avx512_core;
    return (isa & avx512) != avx512 && !tb && N % 1024 == 0 && K >= 2048;
}
#endif

/* Whether and how e (a 2-D product, built) runs as slabs: sets e->nslab
 * (0: one call), e->slab_n and e->slab_lo. plain: alpha 1, beta 0 and an
 * f32 C (only then may the slabs split N). */
static void slab_plan(mm_entry *e, bool tb, int64_t M, int64_t N, int64_t K, bool plain)
{
    e->nslab = 0;
#ifdef _OPENMP
    int n = dt_get_num_threads();
    if (n > MM_MAX_SLABS)
        n = MM_MAX_SLABS;
    if (n < 2 || M * N * K < SLAB_MIN_WORK || e->pad || e->split || slab_conflicts(tb, N, K))
        return;
    /* The larger side, so the operand every thread packs whole is the smaller
     * one; M alone where alpha or beta apply (oneDNN's gemm matmul applies
     * them to a column block of C in another order: last bits differ) and
     * where C is bf16/f16 (its slabs stay dense for the brgemm kernels,
     * see the top). */
    e->slab_n = plain && N > M;
    int64_t len = e->slab_n ? N : M, units = (len + SLAB_ALIGN - 1) / SLAB_ALIGN;
    if (units < n)
        n = (int)units;
    if (n < 2)
        return;
    for (int i = 0; i < n; i++)
        e->slab_lo[i] = units * i / n * SLAB_ALIGN;
    e->slab_lo[n] = len;
    e->nslab = n;
#else
    (void)tb;
    (void)M;
    (void)N;
    (void)K;
    (void)plain;
#endif
}

/* The slab primitives of e (e->nslab planned), created for one thread, each
 * with its own stream. t: the dtype the primitives take (f32 when e
 * widens bf16/f16). */
static dt_status slab_build(mm_entry *e, bool ta, bool tb, int64_t M, int64_t N, int64_t K, dnnl_data_type_t t,
                            float alpha, float beta, bool bias, dnnl_data_type_t ct)
{
    dt_status st = DT_OK;
#ifdef _OPENMP
    dnnl_engine_t eng = dt__dnnl_engine();
    if (!eng)
        return dt_last_status();
    int saved = omp_get_max_threads();
    omp_set_num_threads(1); /* oneDNN sizes its work split for the threads it sees at creation */
    for (int i = 0; i < e->nslab && st >= 0; i++) {
        int64_t len = e->slab_lo[i + 1] - e->slab_lo[i];
        mm_entry *s = e->slab[i] = calloc(1, sizeof *s);
        if (!s) {
            st = dt_error(DT_ERR_NO_MEMORY, "dt_k_matmul: out of memory for a slab");
            break;
        }
        pthread_mutex_init(&s->lock, NULL);
        s->gemm_impl = e->gemm_impl;
        if (e->slab_n)
            st = mm_build(s, ta, tb, 1, M, len, K, 0, 0, 0, t, alpha, beta, bias, 0, tb ? 0 : N, N, ct);
        else
            st = mm_build(s, ta, tb, 1, len, N, K, 0, 0, 0, t, alpha, beta, bias, ta ? M : 0, 0, 0, ct);
        dnnl_status_t ds;
        if (st >= 0 && (ds = dnnl_stream_create(&s->stream, eng, dnnl_stream_default_flags)) != dnnl_success)
            st = dt__dnnl_err(ds, "dt_k_matmul: a slab's stream");
    }
    omp_set_num_threads(saved);
#else
    (void)e, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)t, (void)alpha, (void)beta, (void)bias, (void)ct;
#endif
    return st;
}


/* e's product as its slabs, one OpenMP thread each. es: bytes of an A or B
 * element as passed; cs: of a C element. */
static dt_status slab_run(const mm_entry *e, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *a,
                          const void *b, void *C, const float *bias, float beta, size_t es, size_t cs)
{
#ifdef _OPENMP
    (void)M;
    dnnl_engine_t eng = dt__dnnl_engine();
    if (!eng)
        return dt_last_status();
    dnnl_status_t ds[MM_MAX_SLABS];
    const int ns = e->nslab;
#pragma omp parallel num_threads(ns)
    {
        int nth = omp_get_num_threads();
        for (int i = omp_get_thread_num(); i < ns; i += nth) {
            int64_t o = e->slab_lo[i];
            const char *ai = a, *bi = b;
            char *ci = C;
            const float *bs = bias;
            if (e->slab_n) {
                bi += (size_t)(tb ? o * K : o) * es;
                ci += (size_t)o * cs;
                bs = bias ? bias + o : NULL;
            } else {
                ai += (size_t)(ta ? o : o * K) * es;
                ci += (size_t)(o * N) * cs;
            }
            ds[i] = mm_exec_on(e->slab[i], eng, e->slab[i]->stream, ai, bi, ci, bs, beta);
        }
    }
    for (int i = 0; i < ns; i++)
        if (ds[i] != dnnl_success)
            return dt__dnnl_err(ds[i], "dt_k_matmul: a slab of the product");
    return DT_OK;
#else
    (void)e, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)a, (void)b, (void)C, (void)bias, (void)beta, (void)es,
        (void)cs;
    return dt_error(DT_ERR_INTERNAL, "dt_k_matmul: slabs need OpenMP");
#endif
}

/* Whether batch * x * y elements of 4 bytes fit in a buffer (PTRDIFF_MAX bytes); all >= 0. */
static bool mm_fits(int64_t batch, int64_t x, int64_t y)
{
    int64_t n;
    return !__builtin_mul_overflow(x, y, &n) && !__builtin_mul_overflow(n, batch, &n) && n <= PTRDIFF_MAX / 4;
}

static dt_status mm_check(const char *fn, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K,
                          const void *A, int64_t sa, const void *B, int64_t sb, dt_dtype t, float *C,
                          int64_t sc)
{
    (void)ta;
    (void)tb;
    DT__CHECK_N(fn, batch);
    DT__CHECK_N(fn, M);
    DT__CHECK_N(fn, N);
    DT__CHECK_N(fn, K);
    /* the products below (and the kernels' own) overflowed int64 for sizes no buffer holds: a crash */
    if (!mm_fits(batch, M, K) || !mm_fits(batch, K, N) || !mm_fits(batch, M, N))
        return dt_error(DT_ERR_INVALID_ARG, "%s: batch %lld of M %lld, N %lld, K %lld: more elements than any buffer "
                        "holds", fn, (long long)batch, (long long)M, (long long)N, (long long)K);
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: input dtype %s not supported (f32, bf16 or f16)", fn,
                        dt_dtype_name(t));
    if (sa < 0 || sb < 0 || sc < 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: negative batch stride", fn);
    if (batch > 1 && sc < M * N)
        return dt_error(DT_ERR_INVALID_ARG, "%s: stride_c %lld < M*N = %lld would overlap outputs", fn,
                        (long long)sc, (long long)(M * N));
    DT__CHECK_PTR(fn, A, batch * M * K);
    DT__CHECK_PTR(fn, B, batch * K * N);
    DT__CHECK_PTR(fn, C, batch * M * N);
    return DT_OK;
}

/* One run of e's primitive on a, b, C (and bias). */
static dt_status mm_exec(const mm_entry *e, const void *a, const void *b, void *C, const float *bias, float beta)
{
    dnnl_engine_t eng = dt__dnnl_engine();
    dnnl_stream_t stream = eng ? dt__dnnl_stream() : NULL;
    if (!stream)
        return dt_last_status();
    dt__dnnl_set_threads();
    dnnl_status_t ds = mm_exec_on(e, eng, stream, a, b, C, bias, beta);
    return ds == dnnl_success ? DT_OK : dt__dnnl_err(ds, "dt_k_matmul");
}

/* A product's cache key: its kind (a tag), shape, strides, dtypes and flags. */
static dt__key mm_key(int64_t tag, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, int64_t sa,
                      int64_t sb, int64_t sc, dt_dtype t, float alpha, float beta, const float *bias, dt_dtype ct)
{
    dt__key key;
    memset(&key, 0, sizeof key);
    const int64_t v[] = {tag, ta, tb, batch, M, N, K, sa, sb, sc, t, fbits(alpha), fbits(beta), bias != NULL, ct};
    memcpy(key.v, v, sizeof v);
    return key;
}

/* The calling thread's products vary in shape (dt_k_matmul_set_varying; see the top). */
static _Thread_local bool g_vary;

bool dt_k_matmul_set_varying(bool on)
{
    const bool was = g_vary;
    g_vary = on;
    return was;
}

/* Whether the product runs on dtrain's AMX GEMM (gemm_amx.c). */
static bool mm_amx(dt_dtype t, int64_t M, int64_t N, int64_t K)
{
    return t == DT_BF16 && (dt__amx_use(M, N, K) || (g_vary && dt__amx_use_any()));
}

/* A 2-D product of a varying shape (M, K > 0) on the one primitive of its
 * kind with M and K given at run time (see the top). DT_ERR_UNSUPPORTED
 * where oneDNN has none (remembered: the next call answers at once); the
 * caller then runs it as any other product. */
static dt_status mm_run_varying(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                                const void *B, dt_dtype t, float beta, void *C, dt_dtype ct, const float *bias)
{
    /* one key for every M and K (their slots and the strides' 0) */
    const dt__key key = mm_key(0x4d52 /* 'MR' */, ta, tb, 1, 0, N, 0, 0, 0, 0, t, alpha, beta, bias, ct);
    mm_entry *e = dt__cache_get(&key);
    if (!e) {
        if (!(e = calloc(1, sizeof *e)))
            return dt_error(DT_ERR_NO_MEMORY, "dt_k_matmul: out of memory");
        pthread_mutex_init(&e->lock, NULL);
        const int64_t rt = DNNL_RUNTIME_DIM_VAL;
        dt_status st = mm_build(e, ta, tb, 1, rt, N, rt, 0, 0, 0, dnnl_type(t), alpha, beta, bias != NULL, 0, 0, 0,
                                dnnl_type(ct));
        if (st == DT_ERR_UNSUPPORTED && t != DT_F32 && ct == DT_F32) { /* widened to f32, as elsewhere */
            e->emulate = true;
            st = mm_build(e, ta, tb, 1, rt, N, rt, 0, 0, 0, dnnl_f32, alpha, beta, bias != NULL, 0, 0, 0, dnnl_f32);
        }
        if (st < 0 && st != DT_ERR_UNSUPPORTED) {
            mm_entry_free(e);
            return st;
        }
        if (st < 0 && e->prim) { /* (not expected: an unimplemented primitive is never created) */
            dnnl_primitive_destroy(e->prim);
            e->prim = NULL;
        }
        if (!(e = dt__cache_put(&key, e, mm_entry_free))) /* without a primitive: none for this kind */
            return dt_last_status();
    }
    if (!e->prim)
        return DT_ERR_UNSUPPORTED;
    const dnnl_data_type_t at = e->emulate ? dnnl_f32 : dnnl_type(t);
    dnnl_memory_desc_t amd, bmd, cmd; /* this call's shape */
    mat_md(&amd, 0, 1, 0, M, K, ta, at, 0);
    mat_md(&bmd, 0, 1, 0, K, N, tb, at, 0);
    mat_md(&cmd, 0, 1, 0, M, N, false, dnnl_type(ct), 0);
    dnnl_engine_t eng = dt__dnnl_engine();
    dnnl_stream_t stream = eng ? dt__dnnl_stream() : NULL;
    if (!stream)
        return dt_last_status();
    if (e->emulate) { /* the widened operands in the entry's scratch, grown as shapes need */
        pthread_mutex_lock(&e->lock);
        const int64_t need = M * K + K * N;
        if (need > e->a_elems) {
            dt_free(e->scratch);
            e->a_elems = 0;
            if (!(e->scratch = dt_alloc((size_t)need * sizeof(float)))) {
                pthread_mutex_unlock(&e->lock);
                return dt_error(DT_ERR_NO_MEMORY, "dt_k_matmul: out of memory widening a %lld x %lld x %lld product",
                                (long long)M, (long long)N, (long long)K);
            }
            e->a_elems = need;
        }
        dt_k_convert(A, t, e->scratch, DT_F32, M * K);
        dt_k_convert(B, t, e->scratch + M * K, DT_F32, K * N);
        A = e->scratch;
        B = e->scratch + M * K;
    }
    dt__dnnl_set_threads();
    dnnl_status_t ds = mm_exec_mds(e, &amd, &bmd, &cmd, eng, stream, A, B, C, bias, beta);
    if (e->emulate)
        pthread_mutex_unlock(&e->lock);
    return ds == dnnl_success ? DT_OK : dt__dnnl_err(ds, "dt_k_matmul");
}

/* The product into C of dtype ct: f32, or t itself (beta 0) where
 * mm_direct_lp says oneDNN writes it. finite: NULL, or (on the AMX GEMM
 * alone, see mm_amx) set to whether every value stored is finite. */
static dt_status mm_run(bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                        const void *A, int64_t sa, const void *B, int64_t sb, dt_dtype t, float beta,
                        void *Cv, dt_dtype ct, int64_t sc, const float *bias, bool *finite)
{
    const char *fn = "dt_k_matmul";
    dt_status st = DT_OK;
    float *C = Cv; /* f32 unless ct is low precision (then only passed on to oneDNN or the AMX GEMM) */
    if (batch == 1)
        sa = sb = sc = 0;
    if (mm_amx(t, M, N, K))
        return dt__amx_matmul_batched(ta, tb, batch, M, N, K, alpha, A, sa, B, sb, beta, Cv, ct == DT_BF16, sc,
                                      bias, finite);
    if (K == 0) { /* C = beta C + bias */
        for (int64_t b = 0; b < batch; b++)
            for (int64_t i = 0; i < M; i++) {
                float *c = C + b * sc + i * N;
                for (int64_t j = 0; j < N; j++)
                    c[j] = (beta != 0.0f ? beta * c[j] : 0.0f) + (bias ? bias[j] : 0.0f);
            }
        return DT_OK;
    }
    if (g_vary && batch == 1 && M > 0 && N > 0) {
        if ((st = mm_run_varying(ta, tb, M, N, K, alpha, A, B, t, beta, Cv, ct, bias)) != DT_ERR_UNSUPPORTED)
            return st;
        st = DT_OK; /* none of its kind: as any other product */
    }
    const dt__key key = mm_key(0x4d4d /* 'MM' */, ta, tb, batch, M, N, K, sa, sb, sc, t, alpha, beta, bias, ct);
    mm_entry *e = dt__cache_get(&key);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
        pthread_mutex_init(&e->lock, NULL);
        e->gemm_impl = batch == 1 && ct == DT_F32 && M * N * K >= SLAB_MIN_WORK &&
                       !onednn_amx(); /* see the top */
        if (t == DT_F32 && batch == 1 && pad_b(tb, M, N)) {
            e->pad_rows = K;
            e->pad_cols = N;
            e->pad = dt_alloc((size_t)(e->pad_rows * (e->pad_cols + PAD_EXTRA)) * sizeof(float));
            if (!e->pad) {
                mm_entry_free(e);
                return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for a padded copy of B", fn);
            }
        }
        if (t == DT_F32 && batch == 1 && !e->pad && !bias && alpha == 1.0f && beta == 0.0f)
            e->split = split_n(ta, tb, M, N); /* plain products only (post-ops on a strided C are slow) */
        int64_t nc = e->split ? e->split : N, rest = e->split ? N % e->split : 0;
        st = mm_build(e, ta, tb, batch, M, nc, K, sa, sb, sc, dnnl_type(t), alpha, beta, bias != NULL, 0,
                      e->pad ? e->pad_cols + PAD_EXTRA : 0, e->split ? N : 0, dnnl_type(ct));
        if (st >= 0 && rest) {
            e->tail = calloc(1, sizeof *e->tail);
            if (e->tail)
                pthread_mutex_init(&e->tail->lock, NULL);
            st = e->tail ? mm_build(e->tail, ta, tb, 1, M, rest, K, 0, 0, 0, dnnl_f32, alpha, beta, bias != NULL, 0, 0, N,
                                    dnnl_f32)
                         : DT_ERR_NO_MEMORY;
        }
        if (st == DT_ERR_UNSUPPORTED && t != DT_F32 && ct == DT_F32) {
            /* No native bf16/f16 matmul here: widen to f32 (exact) and run f32. */
            e->emulate = true;
            int64_t na = sa ? batch * sa : M * K, nb = sb ? batch * sb : K * N;
            if (batch > 1 && sa)
                na = (batch - 1) * sa + M * K;
            if (batch > 1 && sb)
                nb = (batch - 1) * sb + K * N;
            e->a_elems = na;
            e->b_elems = nb;
            e->scratch = dt_alloc((size_t)(na + nb) * sizeof(float));
            st = e->scratch ? mm_build(e, ta, tb, batch, M, N, K, sa, sb, sc, dnnl_f32, alpha, beta,
                                       bias != NULL, 0, 0, 0, dnnl_f32)
                            : DT_ERR_NO_MEMORY;
        }
        /* low precision where oneDNN runs AMX: one call, whose brgemm splits
         * the work over the threads on the tiles itself; a slab's one-thread
         * primitive over a transposed A or a column block of C would fall
         * back to gemm:jit, which does not use them (2-3x slower) */
        const bool tiles = t != DT_F32 && !e->emulate && onednn_amx();
        if (st >= 0 && batch == 1 && !tiles) {
            slab_plan(e, tb, M, N, K, alpha == 1.0f && beta == 0.0f && ct == DT_F32);
            if (e->nslab)
                st = slab_build(e, ta, tb, M, N, K, e->emulate ? dnnl_f32 : dnnl_type(t), alpha, beta, bias != NULL,
                                dnnl_type(ct));
        }
        if (st < 0) {
            mm_entry_free(e);
            return dt_error_wrap(st, "matmul %s%s M=%lld N=%lld K=%lld batch=%lld %s", ta ? "A^T" : "A",
                                 tb ? "B^T" : "B", (long long)M, (long long)N, (long long)K,
                                 (long long)batch, dt_dtype_name(t));
        }
        e = dt__cache_put(&key, e, mm_entry_free);
        if (!e)
            return dt_last_status();
    }

    const void *a = A, *b = B;
    bool locked = e->emulate || e->pad;
    if (locked)
        pthread_mutex_lock(&e->lock);
    if (e->pad) {
        copy_padded(e, B);
        b = e->pad;
    }
    if (e->emulate) {
        dt_k_convert(A, t, e->scratch, DT_F32, e->a_elems);
        dt_k_convert(B, t, e->scratch + e->a_elems, DT_F32, e->b_elems);
        a = e->scratch;
        b = e->scratch + e->a_elems;
    }
    bool slabs = e->nslab > 0;
#ifdef _OPENMP
    slabs = slabs && !omp_in_parallel(); /* a caller's parallel region: one call on this thread */
#endif
    if (slabs)
        st = slab_run(e, ta, tb, M, N, K, a, b, C, bias, beta, e->emulate ? sizeof(float) : dt_dtype_size(t),
                      dt_dtype_size(ct));
    else if (!e->split)
        st = mm_exec(e, a, b, C, bias, beta);
    for (int64_t n0 = 0; e->split && n0 < N && st >= 0; n0 += e->split) /* B^T's rows n0.. are contiguous */
        st = mm_exec(n0 + e->split <= N ? e : e->tail, a, (const float *)b + n0 * K, C + n0, bias ? bias + n0 : NULL,
                     beta);
    if (locked)
        pthread_mutex_unlock(&e->lock);
    return st;
}

/* A checked call into a GEMM recording (gemm_record.c), made after its
 * product, which started at t0 (dt_time_s; 0: no recording ran then). */
static void mm_record(double t0, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                      int64_t sa, int64_t sb, dt_dtype t, float beta, dt_dtype ct, int64_t sc, const float *bias)
{
    if (t0 == 0 || !dt__gemm_recording())
        return;
    bool one = batch == 1;
    dt_k_gemm_shape c = {.trans_a = ta, .trans_b = tb, .batch = batch, .M = M, .N = N, .K = K,
                         .stride_a = one ? 0 : sa, .stride_b = one ? 0 : sb, .stride_c = one ? 0 : sc,
                         .alpha = alpha, .beta = beta, .ab_type = t, .c_type = ct, .bias = bias != NULL,
                         .seconds = dt_time_s() - t0};
    dt__gemm_record(&c);
}

/* The start of a product for mm_record: its time while a recording runs. */
static double mm_record_t0(void) { return dt__gemm_recording() ? dt_time_s() : 0.0; }

/* dt_k_matmul_batched after its checks (its recording times this). */
static dt_status mm_batched(bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                            const void *A, int64_t sa, const void *B, int64_t sb, dt_dtype t, float beta, float *C,
                            int64_t sc, const float *bias)
{
    if (batch == 0 || M == 0 || N == 0)
        return DT_OK;
    return mm_run(ta, tb, batch, M, N, K, alpha, A, sa, B, sb, t, beta, C, DT_F32, sc, bias, NULL);
}

dt_status dt_k_matmul_batched(bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                              const void *A, int64_t sa, const void *B, int64_t sb, dt_dtype t, float beta,
                              float *C, int64_t sc, const float *bias)
{
    dt_status st = mm_check("dt_k_matmul", ta, tb, batch, M, N, K, A, sa, B, sb, t, C, sc);
    if (st < 0)
        return st;
    const double t0 = mm_record_t0();
    st = mm_batched(ta, tb, batch, M, N, K, alpha, A, sa, B, sb, t, beta, C, sc, bias);
    mm_record(t0, ta, tb, batch, M, N, K, alpha, sa, sb, t, beta, DT_F32, sc, bias);
    return st;
}

bool dt_k_matmul_writes_lp(dt_dtype t)
{
    /* dtrain's AMX GEMM writes bf16 itself too */
    return (t == DT_BF16 || t == DT_F16) && (dt_k_matmul_native(t) || (t == DT_BF16 && dt__amx_active(NULL)));
}

/* No direct low-precision result here: the f32 product, rounded. */
static dt_status mm_lp_f32(const char *fn, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K,
                           float alpha, const void *A, int64_t sa, const void *B, int64_t sb, dt_dtype t, void *C,
                           int64_t sc, const float *bias)
{
    dt_status st = DT_OK;
    const int64_t scc = batch > 1 ? sc : M * N, m = (batch - 1) * scc + M * N;
    float *tmp = dt_alloc((size_t)m * sizeof(float));
    if (!tmp)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for an f32 result of %lld elements", fn, (long long)m);
    st = mm_batched(ta, tb, batch, M, N, K, alpha, A, sa, B, sb, t, 0.0f, tmp, scc, bias); /* recorded above */
    if (st >= 0)
        for (int64_t b = 0; b < batch && st >= 0; b++)
            st = dt_k_convert(tmp + b * scc, DT_F32, (uint16_t *)C + b * scc, t, M * N);
    dt_free(tmp);
    return st;
}

/* mm_lp after its checks: the product and, with finite, its check. */
static dt_status mm_lp_run(const char *fn, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K,
                           float alpha, const void *A, int64_t sa, const void *B, int64_t sb, dt_dtype t, void *C,
                           int64_t sc, const float *bias, bool *finite)
{
    dt_status st;
    if (batch == 0 || M == 0 || N == 0) {
        if (finite)
            *finite = true;
        return DT_OK;
    }
    const bool direct = K > 0 && dt_k_matmul_writes_lp(t), amx = direct && mm_amx(t, M, N, K);
    if (direct) /* the AMX GEMM checks as it stores */
        st = mm_run(ta, tb, batch, M, N, K, alpha, A, sa, B, sb, t, 0.0f, C, t, sc, bias, amx ? finite : NULL);
    else
        st = mm_lp_f32(fn, ta, tb, batch, M, N, K, alpha, A, sa, B, sb, t, C, sc, bias);
    for (int64_t b = 0; b < batch && finite && !amx && st >= 0; b++) { /* the check as a read pass */
        const void *cb = (const uint16_t *)C + b * (batch > 1 ? sc : 0);
        *finite = dt_k_first_nonfinite(cb, t, M * N) == M * N;
        if (!*finite)
            break;
    }
    return st;
}

/* dt_k_matmul_batched_lp, and with finite (not NULL) its check: set by the
 * AMX GEMM's epilogue as it stores, else by a read pass after. */
static dt_status mm_lp(const char *fn, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K,
                       float alpha, const void *A, int64_t sa, const void *B, int64_t sb, dt_dtype t, void *C,
                       int64_t sc, const float *bias, bool *finite)
{
    if (finite)
        *finite = false;
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtype %s (bf16 or f16)", fn, dt_dtype_name(t));
    dt_status st = mm_check(fn, ta, tb, batch, M, N, K, A, sa, B, sb, t, C, sc);
    if (st < 0)
        return st;
    const double t0 = mm_record_t0();
    st = mm_lp_run(fn, ta, tb, batch, M, N, K, alpha, A, sa, B, sb, t, C, sc, bias, finite);
    mm_record(t0, ta, tb, batch, M, N, K, alpha, sa, sb, t, 0.0f, t, sc, bias);
    return st;
}

dt_status dt_k_matmul_batched_lp(bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                                 const void *A, int64_t sa, const void *B, int64_t sb, dt_dtype t, void *C,
                                 int64_t sc, const float *bias)
{
    return mm_lp("dt_k_matmul_batched_lp", ta, tb, batch, M, N, K, alpha, A, sa, B, sb, t, C, sc, bias, NULL);
}

dt_status dt_k_matmul_lp_checked(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, const void *B,
                                 dt_dtype t, void *C, bool *finite)
{
    if (!finite)
        return dt_error(DT_ERR_NULL, "dt_k_matmul_lp_checked: finite is NULL");
    return mm_lp("dt_k_matmul_lp_checked", ta, tb, 1, M, N, K, 1.0f, A, 0, B, 0, t, C, 0, NULL, finite);
}

bool dt_k_matmul_splits_rows(dt_dtype t, int64_t M, int64_t N, int64_t K)
{
    return t == DT_BF16 && M > 0 && N > 0 && K > 0 && mm_amx(t, M, N, K);
}

dt_status dt_k_matmul_lp_rows(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, const void *B,
                              dt_dtype t, void *C, const int32_t *keep, float *Ck, bool *finite)
{
    const char *fn = "dt_k_matmul_lp_rows";
    if (!finite)
        return dt_error(DT_ERR_NULL, "%s: finite is NULL", fn);
    *finite = false;
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtype %s (bf16 or f16)", fn, dt_dtype_name(t));
    dt_status st = mm_check(fn, ta, tb, 1, M, N, K, A, 0, B, 0, t, C, 0);
    if (st < 0)
        return st;
    if (M > 0 && (!keep || !Ck))
        return dt_error(DT_ERR_NULL, "%s: keep or Ck is NULL", fn);
    if (M == 0 || N == 0) {
        *finite = true;
        return DT_OK;
    }
    const double t0 = mm_record_t0();
    if (dt_k_matmul_splits_rows(t, M, N, K)) {
        st = dt__amx_matmul_rows(ta, tb, M, N, K, A, B, C, keep, Ck, finite);
    } else { /* the f32 product, its rows copied or rounded */
        float *tmp = dt_alloc((size_t)(M * N) * sizeof(float));
        if (!tmp)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for an f32 result of %lld elements", fn,
                            (long long)(M * N));
        st = mm_batched(ta, tb, 1, M, N, K, 1.0f, A, 0, B, 0, t, 0.0f, tmp, 0, NULL);
        bool fin = true;
        for (int64_t r = 0; r < M && st >= 0; r++) {
            const float *row = tmp + r * N;
            if (keep[r] >= 0) {
                memcpy(Ck + keep[r] * N, row, (size_t)N * sizeof(float));
                for (int64_t j = 0; j < N; j++)
                    fin = fin && isfinite(row[j]);
            } else {
                uint16_t *cr = (uint16_t *)C + r * N;
                st = dt_k_convert(row, DT_F32, cr, t, N);
                fin = fin && dt_k_first_nonfinite(cr, t, N) == N;
            }
        }
        dt_free(tmp);
        *finite = st >= 0 && fin;
    }
    mm_record(t0, ta, tb, 1, M, N, K, 1.0f, 0, 0, t, 0.0f, t, 0, NULL);
    return st;
}

dt_status dt_k_matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                      const void *B, dt_dtype t, float beta, float *C, const float *bias)
{
    return dt_k_matmul_batched(ta, tb, 1, M, N, K, alpha, A, 0, B, 0, t, beta, C, 0, bias);
}

bool dt_k_matmul_native(dt_dtype t)
{
    static _Atomic int cached[DT_DTYPE_COUNT]; /* 0 unknown, 1 no, 2 yes; every thread computes the same */
    if (t == DT_F32)
        return true;
    if (t != DT_BF16 && t != DT_F16)
        return false;
    if (!cached[t]) {
        mm_entry e;
        memset(&e, 0, sizeof e);
        dt_status st = mm_build(&e, false, false, 1, 64, 64, 64, 0, 0, 0, dnnl_type(t), 1.0f, 0.0f, false, 0, 0, 0,
                                dnnl_f32);
        if (e.prim)
            dnnl_primitive_destroy(e.prim);
        dt_error_clear();
        cached[t] = st == DT_OK ? 2 : 1;
    }
    return cached[t] == 2;
}

bool dt_k_matmul_bf16_native(void) { return dt_k_matmul_native(DT_BF16); }

dt_status dt_k_bench_matmul(int64_t n, dt_dtype dt, int reps, double *gflops)
{
    const char *fn = "dt_k_bench_matmul";
    if (n <= 0 || reps <= 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: n = %lld and reps = %d must be positive", fn, (long long)n,
                        reps);
    if (!gflops)
        return dt_error(DT_ERR_NULL, "%s: gflops is NULL", fn);
    if (dt != DT_F32 && dt != DT_BF16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtype %s (f32 or bf16)", fn, dt_dtype_name(dt));
    size_t es = dt_dtype_size(dt);
    void *a = dt_alloc((size_t)(n * n) * es), *b = dt_alloc((size_t)(n * n) * es);
    float *c = dt_alloc((size_t)(n * n) * sizeof(float));
    dt_status st = DT_OK;
    if (!a || !b || !c) {
        st = DT_ERR_NO_MEMORY;
        goto out;
    }
    float *tmp = c; /* fill inputs with small values through c */
    dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_DATA, 0, 0), 0, tmp, (size_t)(n * n), -1.0f, 1.0f);
    if (dt == DT_F32) {
        memcpy(a, tmp, (size_t)(n * n) * 4);
        memcpy(b, tmp, (size_t)(n * n) * 4);
    } else {
        dt_k_f32_to_bf16(tmp, a, n * n);
        dt_k_f32_to_bf16(tmp, b, n * n);
    }
    if ((st = dt_k_matmul(false, false, n, n, n, 1.0f, a, b, dt, 0.0f, c, NULL)) < 0)
        goto out;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = dt_time_s();
        if ((st = dt_k_matmul(false, false, n, n, n, 1.0f, a, b, dt, 0.0f, c, NULL)) < 0)
            goto out;
        double t = dt_time_s() - t0;
        if (t < best)
            best = t;
    }
    *gflops = 2.0 * (double)n * (double)n * (double)n / best * 1e-9;
out:
    dt_free(a);
    dt_free(b);
    dt_free(c);
    return st;
}
