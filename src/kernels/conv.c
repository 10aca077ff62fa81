/* 2-D convolution through oneDNN: forward, backward data, backward weights.
 *
 * The caller's layout is plain NCHW / OIHW, or for the activation and/or
 * the output nChw8c / nChw16c (the _l entry points, DT_K_SRC/DST_BLOCKED8
 * and _BLOCKED16; weights stay OIHW). Each (direction, shape, bias?,
 * layouts, dtypes) key gets one cached primitive plus,
 * when the primitive wants another layout, cached reorder primitives and
 * buffers: a call reorders its inputs in, runs, reorders its outputs out,
 * and allocates nothing.
 *
 * Layout choice (measured, ConvNet shapes, batch 100, 5x5 pad 2, oneDNN
 * 2.6.3 on this AVX2 EPYC VM, 1 thread, CPU time, best of 15, machine shared
 * so +-20%; tools: a loop over the three calls with
 * CLOCK_PROCESS_CPUTIME_ID, DT_CONV_LAYOUT forcing each policy):
 *
 *                            plain NCHW     blocked (nChw8c, with reorders)
 *   conv1 1->16  fwd           3.9 ms          1.4-1.6 ms
 *                bwd data      3.3-4.3 ms      7.7-8.4 ms
 *                bwd weights   6.8-6.9 ms      7.3-7.7 ms
 *   conv2 16->32 fwd          13.0-14.0 ms     6.0 ms
 *                bwd data     13.0-13.9 ms     5.9-6.3 ms
 *                bwd weights  13.2-16.9 ms     7.7-8.5 ms
 *
 * On plain layouts oneDNN falls back to its gemm-based convolution; on
 * blocked ones it runs the direct jit:avx2 kernels, which win by 2x even
 * after paying the reorders (0.2-0.6 ms each). The exception is a backward
 * pass with C not a multiple of 8 (C = 1 for the first layer): the blocked
 * kernels pad channels to 8 and lose. So the default policy ("auto") is
 * blocked except backward directions with C % 8 != 0; DT_CONV_LAYOUT=plain
 * or =blocked forces one policy (the tests run all three).
 *
 * Keeping activations blocked across a step: done. The tensor layer has
 * layout flags (DT_TENSOR_BLOCKED8 / 16); inside a dt_ctx_set_blocked region
 * (dt_model_forward turns it on for the ConvNet) conv2d writes blocked
 * outputs when K % block == 0, batch_norm (training), relu and max_pool2d
 * keep that layout (plain-C kernels in blocked.c), and any other op
 * (flatten) converts through one differentiable "to plain" op. The
 * activation reorders around oneDNN disappear; what remains per ConvNet step
 * is the weight reorders (OIHW <-> oneDNN's blocked weights) and the
 * flatten's conversion forward and back: 6 reorders instead of 11
 * (tests/autograd/test_blocked.c, AVX2).
 *
 * Which block: the one oneDNN's primitives pick on this machine
 * (dt_k_onednn_block: nChw8c on AVX2, nChw16c on AVX-512), asked by
 * creating a ConvNet-like forward convolution with format "any". Keeping
 * activations in the other block would add a reorder on both sides of every
 * convolution instead of removing them. DT_BLOCKED=8|16|0 forces one (the
 * tests run both blocks on every machine: results are identical, only the
 * reorder count changes; a 5-tap backward weights in nChw8c runs dtrain's
 * kernel, below, whose sums oneDNN's other kernels may round differently).
 *
 * Two backward-weights shapes run dtrain's own kernels in the default
 * policy (blocked.c), where oneDNN 2.6 is slower: C = 1 with dy blocked
 * (the first layer, below), and x and dy both in nChw8c with 5 taps a
 * kernel row (the second layer on AVX2, bwd_weights_blk8 below).
 *
 * Backward primitives need the forward primitive descriptor as a hint; it is
 * rebuilt (not executed, not counted) when a backward key is first seen.
 *
 * bf16 (the _t entry points): the same primitives with bf16 source,
 * weights and diff_dst, f32 accumulation inside oneDNN; the forward writes
 * bf16 (or f32), the backward directions f32 diff_src / diff_weights /
 * diff_bias, the bias is f32. oneDNN 2.6 builds them on AVX-512 only
 * (jit:avx512_core_bf16 with AVX512_BF16, emulated bf16 dot products on
 * plain avx512_core); on AVX2 primitive creation fails, so
 * dt_k_conv2d_native asks once with a small convolution of each direction
 * and callers widen to f32 where it says no. The blocked layouts are the
 * same (nChw16c on AVX-512), so a bf16 ConvNet keeps its activations
 * blocked as the f32 one does. The C = 1 backward-weights kernel of
 * blocked.c reads f32: bf16 operands are widened into a cached scratch for
 * it (c1_bwd_weights_lp), 5-10x faster than oneDNN's bf16 primitive there. */
#include "kernels_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>


/* One primitive argument: the caller's plain layout, the layout the
 * primitive wants, and (when they differ) a reorder and a buffer in the
 * primitive's layout, both kept with the cached entry. */
typedef struct {
    int arg;                       /* DNNL_ARG_* */
    bool out;                      /* written by the primitive */
    dnnl_memory_desc_t user_md, prim_md;
    dnnl_primitive_t reorder;      /* NULL when the layouts agree */
    void *buf;                     /* prim_md-sized, when reordering */
} conv_io;

typedef struct {
    dnnl_primitive_t prim;
    int nio;
    conv_io io[4];
    pthread_mutex_t lock;          /* the reorder buffers are per entry */
} conv_entry;

static void conv_entry_free(void *p)
{
    conv_entry *e = p;
    if (!e)
        return;
    if (e->prim)
        dnnl_primitive_destroy(e->prim);
    for (int i = 0; i < e->nio; i++) {
        if (e->io[i].reorder)
            dnnl_primitive_destroy(e->io[i].reorder);
        dt_free(e->io[i].buf);
    }
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* Layout policy: 0 = plain NCHW, 1 = blocked (oneDNN picks: format "any"),
 * 2 = auto (the default): blocked, except the backward directions of a
 * convolution whose input channels are not a multiple of 8 (oneDNN pads
 * them to the 8-channel block: the ConvNet's first layer, C = 1, runs its
 * backward 1.1-2x slower blocked than plain). DT_CONV_LAYOUT=plain|blocked|auto. */
static pthread_once_t g_layout_once = PTHREAD_ONCE_INIT;
static int g_layout_mode = 2;

static void layout_read(void)
{
    const char *e = getenv("DT_CONV_LAYOUT");
    if (!e || !*e || !strcmp(e, "auto"))
        return;
    if (!strcmp(e, "plain"))
        g_layout_mode = 0;
    else if (!strcmp(e, "blocked"))
        g_layout_mode = 1;
    else
        dt_log(DT_LOG_WARN, "DT_CONV_LAYOUT=%s is not one of plain, blocked, auto; ignored (auto)", e);
}

static int layout_mode(void)
{
    pthread_once(&g_layout_once, layout_read);
    return g_layout_mode;
}

static bool use_blocked(int dir, const dt_k_conv2d_shape *s);

dt_k_conv2d_shape dt_k_conv2d_shape_make(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                                         int64_t S)
{
    dt_k_conv2d_shape s = {N, C, H, W, K, R, S, 1, 1, 0, 0, 1, 1};
    return s;
}

dt_status dt_k_conv2d_out_size(const dt_k_conv2d_shape *s, int64_t *P, int64_t *Q)
{
    const char *fn = "conv2d";
    if (!s)
        return dt_error(DT_ERR_NULL, "%s: shape is NULL", fn);
    if (s->N < 0 || s->C < 1 || s->H < 1 || s->W < 1 || s->K < 1 || s->R < 1 || s->S < 1)
        return dt_error(DT_ERR_INVALID_ARG,
                        "%s: bad sizes N=%lld C=%lld H=%lld W=%lld K=%lld R=%lld S=%lld (N >= 0, others >= 1)", fn,
                        (long long)s->N, (long long)s->C, (long long)s->H, (long long)s->W, (long long)s->K,
                        (long long)s->R, (long long)s->S);
    if (s->stride_h < 1 || s->stride_w < 1 || s->pad_h < 0 || s->pad_w < 0 || s->dil_h < 1 || s->dil_w < 1)
        return dt_error(DT_ERR_INVALID_ARG, "%s: stride and dilation must be >= 1, padding >= 0", fn);
    int64_t eh = s->dil_h * (s->R - 1) + 1, ew = s->dil_w * (s->S - 1) + 1;
    int64_t p = (s->H + 2 * s->pad_h - eh) / s->stride_h + 1;
    int64_t q = (s->W + 2 * s->pad_w - ew) / s->stride_w + 1;
    if (s->H + 2 * s->pad_h < eh || s->W + 2 * s->pad_w < ew || p < 1 || q < 1)
        return dt_error(DT_ERR_SHAPE, "%s: kernel %lldx%lld (dilated %lldx%lld) larger than padded input %lldx%lld", fn,
                        (long long)s->R, (long long)s->S, (long long)eh, (long long)ew,
                        (long long)(s->H + 2 * s->pad_h), (long long)(s->W + 2 * s->pad_w));
    if (P)
        *P = p;
    if (Q)
        *Q = q;
    return DT_OK;
}

enum { CONV_FWD = 1, CONV_BWD_DATA = 2, CONV_BWD_WEI = 3 };

static bool use_blocked(int dir, const dt_k_conv2d_shape *s)
{
    int m = layout_mode();
    if (m != 2)
        return m == 1;
    int b = dt_k_onednn_block();
    return dir == CONV_FWD || s->C % (b ? b : 8) == 0;
}

/* ---- the activation block ------------------------------------------------ */

/* The layout oneDNN picks for the output of the ConvNet's second convolution
 * (batch 100, 16 -> 32 channels, 14x14, 5x5 pad 2) given format "any". */
static int probe_onednn_block(void)
{
    dnnl_engine_t eng = dt__dnnl_engine();
    if (!eng)
        return 0;
    dnnl_dims_t sd = {100, 16, 14, 14}, wd = {32, 16, 5, 5}, dd = {100, 32, 14, 14};
    dnnl_dims_t strides = {1, 1}, pad = {2, 2};
    dnnl_memory_desc_t src, wei, dst, b8, b16;
    dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&wei, 4, wd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&b8, 4, dd, dnnl_f32, dnnl_nChw8c);
    dnnl_memory_desc_init_by_tag(&b16, 4, dd, dnnl_f32, dnnl_nChw16c);
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    int b = 0;
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &src, &wei, NULL,
                                           &dst, strides, pad, pad) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, eng, NULL) != dnnl_success) {
        dt_log(DT_LOG_WARN, "oneDNN could not create a probe convolution; activations stay plain NCHW");
        return 0;
    }
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    if (md && dnnl_memory_desc_equal(md, &b16))
        b = 16;
    else if (md && dnnl_memory_desc_equal(md, &b8))
        b = 8;
    dnnl_primitive_desc_destroy(pd);
    return b;
}

static _Atomic int g_onednn_block = -1; /* every thread would compute the same */
static _Atomic int g_forced = -2; /* -2: DT_BLOCKED not read yet; -1: none; else 0, 8, 16 */

int dt_k_onednn_block(void)
{
    int b = atomic_load(&g_onednn_block);
    if (b < 0) {
        b = probe_onednn_block();
        atomic_store(&g_onednn_block, b);
    }
    return b;
}

static int forced_block(void)
{
    int f = atomic_load(&g_forced);
    if (f != -2)
        return f;
    const char *e = getenv("DT_BLOCKED");
    f = -1;
    if (e && *e) {
        if (!strcmp(e, "0") || !strcmp(e, "8") || !strcmp(e, "16"))
            f = atoi(e);
        else
            dt_log(DT_LOG_WARN, "DT_BLOCKED=%s is not 0, 8 or 16; ignored (the block oneDNN prefers is used)", e);
    }
    int expect = -2;
    atomic_compare_exchange_strong(&g_forced, &expect, f);
    return atomic_load(&g_forced);
}

int dt_k_act_block(void)
{
    if (layout_mode() == 0)
        return 0;
    int f = forced_block();
    return f >= 0 ? f : dt_k_onednn_block();
}

dt_status dt_k_act_block_set(int block)
{
    if (block != -1 && block != 0 && block != 8 && block != 16)
        return dt_error(DT_ERR_INVALID_ARG, "dt_k_act_block_set: block %d (8, 16, 0 = off, -1 = default)", block);
    atomic_store(&g_forced, block == -1 ? -2 : block); /* -1: DT_BLOCKED again, read on next use */
    return DT_OK;
}

const char *dt_k_block_name(int block)
{
    return block == 8 ? "nChw8c" : block == 16 ? "nChw16c" : "plain";
}

static void conv_key(dt__key *key, int dir, const dt_k_conv2d_shape *s, bool bias, unsigned lay, dt_dtype t,
                     dt_dtype yt)
{
    memset(key, 0, sizeof *key);
    int64_t *k = key->v;
    k[0] = 0x434f4e56; /* 'CONV' */
    k[1] = dir;
    k[2] = s->N, k[3] = s->C, k[4] = s->H, k[5] = s->W, k[6] = s->K, k[7] = s->R, k[8] = s->S;
    k[9] = s->stride_h, k[10] = s->stride_w, k[11] = s->pad_h, k[12] = s->pad_w;
    k[13] = s->dil_h, k[14] = s->dil_w, k[15] = bias, k[17] = (int64_t)lay;
    k[18] = t, k[19] = yt; /* the operands' dtype, the forward output's */
}

static dnnl_data_type_t conv_dnnl_type(dt_dtype t)
{
    return t == DT_BF16 ? dnnl_bf16 : t == DT_F16 ? dnnl_f16 : dnnl_f32;
}

/* Fill e->io[i] for arg: user layout md, the primitive's layout from pd,
 * and a reorder + buffer when they differ. */
static dt_status conv_io_init(conv_entry *e, const_dnnl_primitive_desc_t pd, int arg, bool out,
                              const dnnl_memory_desc_t *user_md, const char *what)
{
    dnnl_engine_t eng = dt__dnnl_engine();
    conv_io *io = &e->io[e->nio++];
    io->arg = arg;
    io->out = out;
    io->user_md = *user_md;
    const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
    if (!pmd)
        return dt_error(DT_ERR_INTERNAL, "%s: oneDNN has no memory descriptor for argument %d", what, arg);
    io->prim_md = *pmd;
    if (dnnl_memory_desc_equal(&io->user_md, &io->prim_md))
        return DT_OK;
    dnnl_primitive_desc_t rpd;
    dnnl_status_t ds = out ? dnnl_reorder_primitive_desc_create(&rpd, &io->prim_md, eng, &io->user_md, eng, NULL)
                           : dnnl_reorder_primitive_desc_create(&rpd, &io->user_md, eng, &io->prim_md, eng, NULL);
    if (ds != dnnl_success)
        return dt__dnnl_err(ds, what);
    dt_status st = dt__prim_create(&io->reorder, rpd, what);
    dnnl_primitive_desc_destroy(rpd);
    if (st < 0)
        return st;
    io->buf = dt_alloc(dnnl_memory_desc_get_size(&io->prim_md));
    return io->buf ? DT_OK : dt_last_status();
}

/* t: the dtype of the operands the direction reads (x, w, dy); yt: the
 * forward output's. The backward outputs (dx, dw, dbias) and the bias are f32. */
static dt_status conv_build(conv_entry *e, int dir, const dt_k_conv2d_shape *s, bool bias, unsigned lay,
                            dt_dtype t, dt_dtype yt)
{
    const char *what = dir == CONV_FWD ? "dt_k_conv2d_fwd" : dir == CONV_BWD_DATA ? "dt_k_conv2d_bwd_data"
                                                                                  : "dt_k_conv2d_bwd_weights";
    dnnl_engine_t eng = dt__dnnl_engine();
    if (!eng)
        return dt_last_status();
    int64_t P, Q;
    dt_status st = dt_k_conv2d_out_size(s, &P, &Q);
    if (st < 0)
        return st;
    dnnl_dims_t sd = {s->N, s->C, s->H, s->W}, wd = {s->K, s->C, s->R, s->S}, bd = {s->K},
                dd = {s->N, s->K, P, Q};
    dnnl_dims_t strides = {s->stride_h, s->stride_w}, dil = {s->dil_h - 1, s->dil_w - 1};
    /* Right padding that makes oneDNN's output size formula give P, Q
     * (PyTorch floors; oneDNN wants the padding that makes it exact). */
    int64_t eh = s->dil_h * (s->R - 1) + 1, ew = s->dil_w * (s->S - 1) + 1;
    dnnl_dims_t pl = {s->pad_h, s->pad_w};
    dnnl_dims_t pr = {(P - 1) * s->stride_h + eh - s->H - s->pad_h, (Q - 1) * s->stride_w + ew - s->W - s->pad_w};
    dnnl_memory_desc_t src_u, wei_u, bias_u, dst_u, src_a, wei_a, dst_a;
    dnnl_format_tag_t src_tag = (lay & DT_K_SRC_BLOCKED8) ? dnnl_nChw8c : (lay & DT_K_SRC_BLOCKED16) ? dnnl_nChw16c
                                                                                                    : dnnl_nchw;
    dnnl_format_tag_t dst_tag = (lay & DT_K_DST_BLOCKED8) ? dnnl_nChw8c : (lay & DT_K_DST_BLOCKED16) ? dnnl_nChw16c
                                                                                                    : dnnl_nchw;
    /* Data types per direction: what it reads is t, what it writes is yt
     * (forward) or f32 (backward: the gradient buffers); the forward
     * descriptor that hints a backward one reads and writes t. */
    dnnl_data_type_t dt = conv_dnnl_type(t);
    dnnl_data_type_t src_t = dir == CONV_BWD_DATA ? dnnl_f32 : dt;
    dnnl_data_type_t wei_t = dir == CONV_BWD_WEI ? dnnl_f32 : dt;
    dnnl_data_type_t dst_t = dir == CONV_FWD ? conv_dnnl_type(yt) : dt;
    dnnl_memory_desc_init_by_tag(&src_u, 4, sd, src_t, src_tag);
    dnnl_memory_desc_init_by_tag(&wei_u, 4, wd, wei_t, dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&bias_u, 1, bd, dnnl_f32, dnnl_a);
    dnnl_memory_desc_init_by_tag(&dst_u, 4, dd, dst_t, dst_tag);
    bool blk = use_blocked(dir, s);
    dnnl_format_tag_t any = dnnl_format_tag_any;
    dnnl_memory_desc_t src_h, wei_h, dst_h; /* the forward hint's */
    dnnl_memory_desc_init_by_tag(&src_a, 4, sd, src_t, blk ? any : dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&wei_a, 4, wd, wei_t, blk ? any : dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&dst_a, 4, dd, dst_t, blk ? any : dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&src_h, 4, sd, dt, blk ? any : dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&wei_h, 4, wd, dt, blk ? any : dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&dst_h, 4, dd, dir == CONV_FWD ? dst_t : dt, blk ? any : dnnl_nchw);

    dnnl_convolution_desc_t fd, cd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    dnnl_status_t ds = dnnl_dilated_convolution_forward_desc_init(
        &fd, dnnl_forward_training, dnnl_convolution_direct, &src_h, &wei_h,
        (dir == CONV_FWD && bias) ? &bias_u : NULL, &dst_h, strides, dil, pl, pr);
    if (ds != dnnl_success)
        goto fail;
    if ((ds = dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL)) != dnnl_success)
        goto fail;
    if (dir == CONV_FWD) {
        pd = fpd;
        fpd = NULL;
    } else {
        if (dir == CONV_BWD_DATA)
            ds = dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &src_a, &wei_a,
                                                                  &dst_a, strides, dil, pl, pr);
        else
            ds = dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &src_a, &wei_a,
                                                                     bias ? &bias_u : NULL, &dst_a, strides, dil,
                                                                     pl, pr);
        if (ds != dnnl_success)
            goto fail;
        if ((ds = dnnl_primitive_desc_create(&pd, &cd, NULL, eng, fpd)) != dnnl_success)
            goto fail;
    }
    if ((st = dt__prim_create(&e->prim, pd, what)) < 0)
        goto out;
    if (dir == CONV_FWD) {
        if ((st = conv_io_init(e, pd, DNNL_ARG_SRC, false, &src_u, what)) < 0 ||
            (st = conv_io_init(e, pd, DNNL_ARG_WEIGHTS, false, &wei_u, what)) < 0 ||
            (st = conv_io_init(e, pd, DNNL_ARG_DST, true, &dst_u, what)) < 0 ||
            (bias && (st = conv_io_init(e, pd, DNNL_ARG_BIAS, false, &bias_u, what)) < 0))
            goto out;
    } else if (dir == CONV_BWD_DATA) {
        if ((st = conv_io_init(e, pd, DNNL_ARG_DIFF_DST, false, &dst_u, what)) < 0 ||
            (st = conv_io_init(e, pd, DNNL_ARG_WEIGHTS, false, &wei_u, what)) < 0 ||
            (st = conv_io_init(e, pd, DNNL_ARG_DIFF_SRC, true, &src_u, what)) < 0)
            goto out;
    } else {
        if ((st = conv_io_init(e, pd, DNNL_ARG_SRC, false, &src_u, what)) < 0 ||
            (st = conv_io_init(e, pd, DNNL_ARG_DIFF_DST, false, &dst_u, what)) < 0 ||
            (st = conv_io_init(e, pd, DNNL_ARG_DIFF_WEIGHTS, true, &wei_u, what)) < 0 ||
            (bias && (st = conv_io_init(e, pd, DNNL_ARG_DIFF_BIAS, true, &bias_u, what)) < 0))
            goto out;
    }
    goto out;
fail:
    st = dt__dnnl_err(ds, what);
out:
    if (fpd)
        dnnl_primitive_desc_destroy(fpd);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return st;
}

static dt_status conv_get(conv_entry **out, int dir, const dt_k_conv2d_shape *s, bool bias, unsigned lay,
                         dt_dtype t, dt_dtype yt)
{
    dt__key key;
    conv_key(&key, dir, s, bias, lay, t, yt);
    key.v[16] = use_blocked(dir, s);
    conv_entry *e = dt__cache_get(&key);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e)
            return dt_error(DT_ERR_NO_MEMORY, "conv2d: out of memory");
        pthread_mutex_init(&e->lock, NULL);
        dt_status st = conv_build(e, dir, s, bias, lay, t, yt);
        if (st < 0) {
            conv_entry_free(e);
            return st;
        }
        if (!(e = dt__cache_put(&key, e, conv_entry_free)))
            return dt_last_status();
    }
    *out = e;
    return DT_OK;
}

/* Run the entry's primitive on user pointers ptr[i] (in io order):
 * reorder inputs into the primitive's layout, execute, reorder outputs back. */
static dt_status conv_run(conv_entry *e, const char *fn, const void *const *ptr)
{
    dnnl_memory_t um[4] = {0}, pm[4] = {0};
    dnnl_exec_arg_t args[4];
    dt_status st = DT_OK;
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < e->nio; i++) {
        conv_io *io = &e->io[i];
        if ((st = dt__mem(&um[i], &io->user_md, (void *)ptr[i], fn)) < 0)
            goto out;
        if (io->reorder && (st = dt__mem(&pm[i], &io->prim_md, io->buf, fn)) < 0)
            goto out;
        args[i].arg = io->arg;
        args[i].memory = io->reorder ? pm[i] : um[i];
        if (io->reorder && !io->out) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, um[i]}, {DNNL_ARG_TO, pm[i]}};
            if ((st = dt__prim_exec(io->reorder, 2, ra, fn)) < 0)
                goto out;
            dt__stats_reorder();
        }
    }
    if ((st = dt__prim_exec(e->prim, e->nio, args, fn)) < 0)
        goto out;
    for (int i = 0; i < e->nio; i++) {
        conv_io *io = &e->io[i];
        if (io->reorder && io->out) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, pm[i]}, {DNNL_ARG_TO, um[i]}};
            if ((st = dt__prim_exec(io->reorder, 2, ra, fn)) < 0)
                goto out;
            dt__stats_reorder();
        }
    }
out:
    pthread_mutex_unlock(&e->lock);
    for (int i = 0; i < 4; i++) {
        if (um[i])
            dnnl_memory_destroy(um[i]);
        if (pm[i])
            dnnl_memory_destroy(pm[i]);
    }
    return st;
}

static int lay_src_block(unsigned lay)
{
    return (lay & DT_K_SRC_BLOCKED8) ? 8 : (lay & DT_K_SRC_BLOCKED16) ? 16 : 0;
}

static int lay_dst_block(unsigned lay)
{
    return (lay & DT_K_DST_BLOCKED8) ? 8 : (lay & DT_K_DST_BLOCKED16) ? 16 : 0;
}

static dt_status conv_check(const char *fn, const dt_k_conv2d_shape *s, int64_t *P, int64_t *Q, unsigned lay)
{
    dt_status st = dt_k_conv2d_out_size(s, P, Q);
    if (st < 0)
        return dt_error_wrap(st, "%s", fn);
    const unsigned all = DT_K_SRC_BLOCKED8 | DT_K_DST_BLOCKED8 | DT_K_SRC_BLOCKED16 | DT_K_DST_BLOCKED16;
    if (lay & ~all)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown layout bits 0x%x", fn, lay);
    if (((lay & DT_K_SRC_BLOCKED8) && (lay & DT_K_SRC_BLOCKED16)) ||
        ((lay & DT_K_DST_BLOCKED8) && (lay & DT_K_DST_BLOCKED16)))
        return dt_error(DT_ERR_INVALID_ARG, "%s: layout bits 0x%x name two blocks for one side", fn, lay);
    int sb = lay_src_block(lay), db = lay_dst_block(lay);
    if ((sb && s->C % sb) || (db && s->K % db))
        return dt_error(DT_ERR_INVALID_ARG, "%s: nChw%dc needs channels %% %d == 0 (C=%lld, K=%lld)", fn,
                        sb && s->C % sb ? sb : db, sb && s->C % sb ? sb : db, (long long)s->C, (long long)s->K);
    return DT_OK;
}

bool dt_k_conv2d_blocked_enabled(void)
{
    return layout_mode() != 0;
}

dt_status dt_k_conv2d_fwd(const dt_k_conv2d_shape *s, const float *x, const float *w, const float *bias, float *y)
{
    return dt_k_conv2d_fwd_l(s, x, w, bias, y, 0);
}

dt_status dt_k_conv2d_fwd_l(const dt_k_conv2d_shape *s, const float *x, const float *w, const float *bias, float *y,
                           unsigned lay)
{
    return dt_k_conv2d_fwd_t(s, x, w, bias, y, DT_F32, DT_F32, lay);
}

/* The dtype checks of the _t entry points: t f32, or a low dtype this
 * machine convolves natively (dt_k_conv2d_native). */
static dt_status conv_dtype_check(const char *fn, dt_dtype t, dt_dtype yt)
{
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: operand dtype %s (f32, bf16 or f16)", fn, dt_dtype_name(t));
    if (yt != DT_F32 && yt != t)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: output dtype %s with operands of dtype %s (f32 or the operands')",
                        fn, dt_dtype_name(yt), dt_dtype_name(t));
    if (!dt_k_conv2d_native(t))
        return dt_error(DT_ERR_UNSUPPORTED,
                        "%s: no %s convolution on this CPU (oneDNN isa %s); widen the operands to f32 instead", fn,
                        dt_dtype_name(t), dt_k_onednn_isa());
    return DT_OK;
}

dt_status dt_k_conv2d_fwd_t(const dt_k_conv2d_shape *s, const void *x, const void *w, const float *bias, void *y,
                            dt_dtype t, dt_dtype yt, unsigned lay)
{
    const char *fn = "dt_k_conv2d_fwd";
    int64_t P, Q;
    dt_status st = conv_check(fn, s, &P, &Q, lay);
    if (st < 0 || (st = conv_dtype_check(fn, t, yt)) < 0)
        return st;
    if (s->N == 0)
        return DT_OK;
    DT__CHECK_PTR(fn, x, 1);
    DT__CHECK_PTR(fn, w, 1);
    DT__CHECK_PTR(fn, y, 1);
    conv_entry *e;
    if ((st = conv_get(&e, CONV_FWD, s, bias != NULL, lay, t, yt)) < 0)
        return st;
    const void *p[4] = {x, w, y, bias};
    return conv_run(e, fn, p);
}

dt_status dt_k_conv2d_bwd_data(const dt_k_conv2d_shape *s, const float *dy, const float *w, float *dx)
{
    return dt_k_conv2d_bwd_data_l(s, dy, w, dx, 0);
}

dt_status dt_k_conv2d_bwd_data_l(const dt_k_conv2d_shape *s, const float *dy, const float *w, float *dx, unsigned lay)
{
    return dt_k_conv2d_bwd_data_t(s, dy, w, dx, DT_F32, lay);
}

dt_status dt_k_conv2d_bwd_data_t(const dt_k_conv2d_shape *s, const void *dy, const void *w, float *dx, dt_dtype t,
                                 unsigned lay)
{
    const char *fn = "dt_k_conv2d_bwd_data";
    int64_t P, Q;
    dt_status st = conv_check(fn, s, &P, &Q, lay);
    if (st < 0 || (st = conv_dtype_check(fn, t, t)) < 0)
        return st;
    if (s->N == 0)
        return DT_OK;
    DT__CHECK_PTR(fn, dy, 1);
    DT__CHECK_PTR(fn, w, 1);
    DT__CHECK_PTR(fn, dx, 1);
    conv_entry *e;
    if ((st = conv_get(&e, CONV_BWD_DATA, s, false, lay, t, t)) < 0)
        return st;
    const void *p[3] = {dy, w, dx};
    return conv_run(e, fn, p);
}

/* A cached f32 scratch of n floats for one backward-weights shape (tag
 * tells the users apart), returned locked: the caller unlocks e->lock. */
static float *bwd_weights_scratch(const dt_k_conv2d_shape *s, int db, bool bias, dt_dtype t, int64_t tag, size_t n,
                                  conv_entry **out)
{
    dt__key key;
    conv_key(&key, CONV_BWD_WEI, s, bias, (unsigned)db, t, DT_F32);
    key.v[16] = tag;
    conv_entry *e = dt__cache_get(&key);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e) {
            dt_error(DT_ERR_NO_MEMORY, "dt_k_conv2d_bwd_weights: out of memory");
            return NULL;
        }
        pthread_mutex_init(&e->lock, NULL);
        e->nio = 1;
        e->io[0].buf = dt_alloc(n * sizeof(float));
        if (!e->io[0].buf) {
            conv_entry_free(e);
            return NULL;
        }
        if (!(e = dt__cache_put(&key, e, conv_entry_free)))
            return NULL;
    }
    pthread_mutex_lock(&e->lock);
    *out = e;
    return e->io[0].buf;
}

/* bf16 backward weights with C = 1 (the ConvNet's conv1): x and dy widened
 * exactly into a cached f32 scratch (one per shape), then blocked.c's C = 1
 * kernel, as the f32 path. oneDNN's bf16 primitive for C = 1 pads the
 * channels to the block or runs its gemm-based convolution on plain layouts:
 * 22 ms against this path's 2-4 ms at batch 100 (bench/conv_bf16). Same
 * contract: bf16 operands, products and sums in f32. */
static dt_status c1_bwd_weights_lp(const dt_k_conv2d_shape *s, int db, int64_t P, int64_t Q, const void *x,
                                   const void *dy, float *dw, float *dbias, dt_dtype t)
{
    int64_t nx = s->N * s->C * s->H * s->W, ny = s->N * s->K * P * Q;
    conv_entry *e;
    float *xf = bwd_weights_scratch(s, db, dbias != NULL, t, 0x43315343 /* 'C1SC' */, (size_t)(nx + ny), &e);
    if (!xf)
        return dt_last_status();
    float *dyf = xf + nx;
    dt_status st = dt_k_convert(x, t, xf, DT_F32, nx);
    if (st >= 0)
        st = dt_k_convert(dy, t, dyf, DT_F32, ny);
    if (st >= 0)
        dt__conv_c1_bwd_weights_blk(s, db, P, Q, xf, dyf, dw, dbias);
    pthread_mutex_unlock(&e->lock);
    return st < 0 ? st : DT_OK;
}

/* f32 backward weights with x and dy in nChw8c and 5 taps a kernel row
 * (the ConvNet's second layer on AVX2): blocked.c's kernel, with its
 * accumulators in a cached scratch. On the AVX2 EPYC it was measured on
 * (16 -> 32 channels, 5x5 on 14x14, batch 100, 2 threads, 8 sets of
 * operands rotated: bench/conv_bwd_weights) it took 0.81-0.88 of oneDNN
 * 2.6's jit:avx2 time, with the same bits; in the ConvNet step oneDNN's
 * took ~5.8 ms of ~16 (ONEDNN_VERBOSE). */
static dt_status bwd_weights_blk8(const dt_k_conv2d_shape *s, int64_t P, int64_t Q, const float *x, const float *dy,
                                  float *dw, float *dbias)
{
    const int nt = dt__conv_bwd_weights_blk8_threads(s, P, Q);
    conv_entry *e;
    float *scratch = bwd_weights_scratch(s, 8, dbias != NULL, DT_F32, 0x43424b38 /* 'CBK8' */,
                                         dt__conv_bwd_weights_blk8_scratch(s, nt), &e);
    if (!scratch)
        return dt_last_status();
    dt__conv_bwd_weights_blk8(s, nt, P, Q, x, dy, dw, dbias, scratch);
    pthread_mutex_unlock(&e->lock);
    return DT_OK;
}

dt_status dt_k_conv2d_bwd_weights(const dt_k_conv2d_shape *s, const float *x, const float *dy, float *dw,
                                  float *dbias)
{
    return dt_k_conv2d_bwd_weights_l(s, x, dy, dw, dbias, 0);
}

dt_status dt_k_conv2d_bwd_weights_l(const dt_k_conv2d_shape *s, const float *x, const float *dy, float *dw,
                                    float *dbias, unsigned lay)
{
    return dt_k_conv2d_bwd_weights_t(s, x, dy, dw, dbias, DT_F32, lay);
}

dt_status dt_k_conv2d_bwd_weights_t(const dt_k_conv2d_shape *s, const void *x, const void *dy, float *dw,
                                    float *dbias, dt_dtype t, unsigned lay)
{
    const char *fn = "dt_k_conv2d_bwd_weights";
    int64_t P, Q;
    dt_status st = conv_check(fn, s, &P, &Q, lay);
    if (st < 0 || (st = conv_dtype_check(fn, t, t)) < 0)
        return st;
    DT__CHECK_PTR(fn, dw, 1);
    if (s->N == 0) { /* no samples: zero gradients */
        memset(dw, 0, (size_t)(s->K * s->C * s->R * s->S) * sizeof(float));
        if (dbias)
            memset(dbias, 0, (size_t)s->K * sizeof(float));
        return DT_OK;
    }
    DT__CHECK_PTR(fn, x, 1);
    DT__CHECK_PTR(fn, dy, 1);
    int db = lay_dst_block(lay);
    if (layout_mode() == 2 && lay_src_block(lay) == 0 && dt__conv_c1_bwd_weights_blk_ok(s, db)) {
        if (t == DT_F32) {
            dt__conv_c1_bwd_weights_blk(s, db, P, Q, x, dy, dw, dbias); /* C = 1: see blocked.c */
            return DT_OK;
        }
        return c1_bwd_weights_lp(s, db, P, Q, x, dy, dw, dbias, t);
    }
    if (layout_mode() == 2 && t == DT_F32 && lay_src_block(lay) == 8 && db == 8 &&
        dt__conv_bwd_weights_blk8_ok(s, Q))
        return bwd_weights_blk8(s, P, Q, x, dy, dw, dbias);
    conv_entry *e;
    if ((st = conv_get(&e, CONV_BWD_WEI, s, dbias != NULL, lay, t, t)) < 0)
        return st;
    const void *p[4] = {x, dy, dw, dbias};
    return conv_run(e, fn, p);
}

/* Whether oneDNN builds all three directions of a small convolution of
 * dtype t (operands t, forward output t, backward outputs f32) on this CPU,
 * both layout policies' way, and DT_MAX_CPU_ISA leaves AVX-512 on (oneDNN's
 * bf16 convolutions need it; ONEDNN_MAX_CPU_ISA=AVX2 makes the creation
 * fail). Asked once per dtype, cached. */
static bool probe_native(dt_dtype t)
{
    if (!dt_cpu_detect().avx512f)
        return false;
    dt_k_conv2d_shape s = dt_k_conv2d_shape_make(2, 16, 8, 8, 16, 3, 3);
    s.pad_h = s.pad_w = 1;
    bool ok = true;
    for (int dir = CONV_FWD; dir <= CONV_BWD_WEI && ok; dir++) {
        conv_entry *e = calloc(1, sizeof *e);
        if (!e)
            return false;
        pthread_mutex_init(&e->lock, NULL);
        ok = conv_build(e, dir, &s, true, 0, t, t) == DT_OK;
        conv_entry_free(e);
    }
    dt_error_clear();
    return ok;
}

bool dt_k_conv2d_native(dt_dtype t)
{
    static _Atomic int cached[DT_DTYPE_COUNT]; /* 0 unknown, 1 no, 2 yes; every thread computes the same */
    if (t == DT_F32)
        return true;
    if (t != DT_BF16 && t != DT_F16)
        return false;
    if (!atomic_load(&cached[t]))
        atomic_store(&cached[t], probe_native(t) ? 2 : 1);
    return atomic_load(&cached[t]) == 2;
}
