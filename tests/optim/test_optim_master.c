/* Mixed precision in the optimizer: fp32 master weights (range params),
 * bf16/f16 gradients read as f32, a bf16/f16 mirror rewritten after each
 * step. The master update must equal an f32 optimizer's on the same
 * gradients bit for bit (SGD with momentum and weight decay, Adam, AdamW,
 * LAMB), the states too, and the mirror must be the master rounded to
 * nearest even. The fused unscale pass (GradScaler's unscale_) divides by
 * the scale and flags inf/NaN. */
// dt-test-labels: threads
#include "dtrain/kernels.h"
#include "dtrain/optim.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { N = 64 * 3 + 17, SPLIT = 100 };

/* Values exact in bf16 and f16: small dyadic rationals. */
static float P0(size_t i) { return (float)((int)((i * 37) % 101) - 50) / 64.0f; }
static float G(size_t i, int t) { return (float)((int)((i * 53 + (size_t)t * 17) % 97) - 48) / 128.0f; }

/* Two tensors: [0, 90) and [96, N) (a gap of padding), LAMB needs segments. */
static const dt_optim_segment k_segs[2] = {{0, 90, false}, {96, N - 96, true}};

static dt_status make(dt_optim_kind kind, const dt_optim_range *r, size_t nr, dt_optim **o)
{
    switch (kind) {
    case DT_OPTIM_SGD: {
        dt_sgd_params p = dt_sgd_params_default();
        p.lr = 0.1, p.momentum = 0.9, p.weight_decay = 0.05;
        return dt_optim_sgd_init(&p, r, nr, o);
    }
    case DT_OPTIM_ADAM: {
        dt_adam_params p = dt_adam_params_default();
        p.lr = 0.01, p.weight_decay = 0.1;
        return dt_optim_adam_init(&p, r, nr, o);
    }
    case DT_OPTIM_ADAMW: {
        dt_adam_params p = dt_adamw_params_default();
        p.lr = 0.01, p.weight_decay = 0.1;
        return dt_optim_adamw_init(&p, r, nr, o);
    }
    case DT_OPTIM_LION: {
        dt_lion_params p = dt_lion_params_default();
        p.lr = 0.01, p.weight_decay = 0.1;
        return dt_optim_lion_init(&p, r, nr, o);
    }
    default: {
        dt_lamb_params p = dt_lamb_params_default();
        p.lr = 0.01;
        return dt_optim_lamb_init(&p, r, nr, o);
    }
    }
}

/* Ranges over [0, N): one, or two split at SPLIT (the ZeRO shape). */
static size_t ranges(dt_optim_range *r, const dt_flat *P, const dt_flat *Gf, const dt_flat *M, bool split)
{
    static dt_optim_segment segs[2][2];
    if (!split) {
        r[0] = (dt_optim_range){.params = P, .grads = Gf, .mirror = M, .lo = 0, .hi = N, .segs = k_segs, .nseg = 2};
        return 1;
    }
    /* segments clipped to each range, as the trainer does */
    segs[0][0] = (dt_optim_segment){0, 90, false};
    segs[0][1] = (dt_optim_segment){96, SPLIT - 96, true};
    segs[1][0] = (dt_optim_segment){SPLIT, N - SPLIT, true};
    r[0] = (dt_optim_range){.params = P, .grads = Gf, .mirror = M, .lo = 0, .hi = SPLIT, .segs = segs[0], .nseg = 2};
    r[1] = (dt_optim_range){.params = P, .grads = Gf, .mirror = M, .lo = SPLIT, .hi = N, .segs = segs[1], .nseg = 1};
    return 2;
}

/* kind, low dtype (grads and mirror), split, scale (1: no unscale call: SGD and Adam(W) widen, step and
 * round the mirror piece by piece in one pass, LAMB widens first). */
static void check_master(dt_optim_kind kind, dt_dtype lowt, bool split, float scale)
{
    float ref_p[N], ref_g[N];
    uint16_t low_p[N], low_g[N];
    for (size_t i = 0; i < N; i++)
        ref_p[i] = (i >= 90 && i < 96) ? 0.0f : P0(i);
    ASSERT_OK(dt_k_convert(ref_p, DT_F32, low_p, lowt, N));
    dt_flat RP, RG, LP, LG, master;
    ASSERT_OK(dt_flat_wrap(&RP, DT_F32, ref_p, N));
    ASSERT_OK(dt_flat_wrap(&RG, DT_F32, ref_g, N));
    ASSERT_OK(dt_flat_wrap(&LP, lowt, low_p, N));
    ASSERT_OK(dt_flat_wrap(&LG, lowt, low_g, N));
    ASSERT_OK(dt_optim_master_alloc(&LP, 0, N, &master));
    ASSERT(!memcmp(master.base, ref_p, sizeof ref_p)); /* widening is exact */
    dt_optim_range rr[2], rl[2];
    size_t nr = ranges(rr, &RP, &RG, NULL, split);
    ranges(rl, &master, &LG, &LP, split);
    dt_optim *ref, *mix;
    ASSERT_OK(make(kind, rr, nr, &ref));
    ASSERT_OK(make(kind, rl, nr, &mix));
    dt_optim_set_zero_grad(mix, true);
    for (int t = 0; t < 3; t++) {
        for (size_t i = 0; i < N; i++)
            ref_g[i] = (i >= 90 && i < 96) ? 0.0f : G(i, t);
        float scaled[N];
        for (size_t i = 0; i < N; i++)
            scaled[i] = ref_g[i] * scale; /* a power of two: exact */
        ASSERT_OK(dt_k_convert(scaled, DT_F32, low_g, lowt, N));
        if (scale != 1.0f) {
            bool inf = true;
            ASSERT_OK(dt_optim_unscale_grads(mix, 1.0f / scale, &inf));
            ASSERT(!inf);
        }
        ASSERT_OK(dt_optim_step(ref));
        ASSERT_OK(dt_optim_step(mix));
        ASSERT(!memcmp(master.base, ref_p, sizeof ref_p));
        for (size_t i = 0; i < N; i++) { /* the mirror is the rounded master; grads zeroed */
            float m = lowt == DT_BF16 ? dt_bf16_to_f32(low_p[i]) : dt_f16_to_f32(low_p[i]);
            float want = lowt == DT_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16(ref_p[i]))
                                         : dt_f16_to_f32(dt_f32_to_f16(ref_p[i]));
            if (m != want) {
                ASSERT_NEAR(m, want, 0, 0);
                break;
            }
            if (low_g[i] != 0) {
                ASSERT_EQ_INT(low_g[i], 0);
                break;
            }
        }
    }
    /* optimizer states: f32, equal */
    for (size_t r = 0; r < nr; r++)
        for (int s = 0; s < dt_optim_num_states(ref); s++) {
            float *a, *b;
            size_t na, nb;
            ASSERT_OK(dt_optim_state(ref, r, s, NULL, &a, &na));
            ASSERT_OK(dt_optim_state(mix, r, s, NULL, &b, &nb));
            ASSERT_EQ_INT(na, nb);
            ASSERT(!memcmp(a, b, na * sizeof(float)));
        }
    ASSERT_EQ_INT(dt_optim_get_step(mix), 3);
    dt_optim_free(ref);
    dt_optim_free(mix);
    dt_flat_free(&master);
}

TEST(master_equals_f32_optimizer)
{
    const dt_optim_kind kinds[5] = {DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW, DT_OPTIM_LAMB, DT_OPTIM_LION};
    for (int k = 0; k < 5; k++)
        for (int lt = 0; lt < 2; lt++)
            for (int split = 0; split < 2; split++) {
                int before = dt_test_failed_;
                check_master(kinds[k], lt ? DT_F16 : DT_BF16, split, 1.0f);
                check_master(kinds[k], lt ? DT_F16 : DT_BF16, split, 1024.0f);
                if (dt_test_failed_ && !before) {
                    fprintf(stderr, "  (%s, %s, split %d)\n", dt_optim_kind_name(kinds[k]), lt ? "f16" : "bf16",
                            split);
                    return;
                }
            }
}

/* The fused pass: f32 grads unscaled in place; inf and NaN found (the
 * whole range is still multiplied); low-precision grads flag too. */
TEST(unscale_finds_inf_and_nan)
{
    float p[N] = {0}, g[N];
    uint16_t lp[N] = {0}, lg[N];
    for (size_t i = 0; i < N; i++)
        g[i] = 8.0f * (float)(i % 7);
    dt_flat P, Gf, LP, LG, M;
    ASSERT_OK(dt_flat_wrap(&P, DT_F32, p, N));
    ASSERT_OK(dt_flat_wrap(&Gf, DT_F32, g, N));
    dt_optim_range r = {.params = &P, .grads = &Gf, .lo = 0, .hi = N};
    dt_optim *o;
    ASSERT_OK(make(DT_OPTIM_SGD, &r, 1, &o));
    bool inf = true;
    ASSERT_OK(dt_optim_unscale_grads(o, 0.125f, &inf));
    ASSERT(!inf);
    ASSERT_NEAR(g[6], 6, 0, 0);
    g[N - 1] = INFINITY;
    ASSERT_OK(dt_optim_unscale_grads(o, 0.5f, &inf));
    ASSERT(inf);
    ASSERT_NEAR(g[6], 3, 0, 0); /* multiplied anyway */
    g[N - 1] = NAN;
    ASSERT_OK(dt_optim_unscale_grads(o, 1.0f, &inf));
    ASSERT(inf);
    g[N - 1] = 3e38f; /* finite, but the product overflows */
    ASSERT_OK(dt_optim_unscale_grads(o, 4.0f, &inf));
    ASSERT(inf);
    ASSERT_STATUS(dt_optim_unscale_grads(o, 0.0f, &inf), DT_ERR_INVALID_ARG);
    dt_optim_free(o);

    /* f16 grads: an f16 inf is found */
    ASSERT_OK(dt_flat_wrap(&LP, DT_F16, lp, N));
    ASSERT_OK(dt_flat_wrap(&LG, DT_F16, lg, N));
    ASSERT_OK(dt_optim_master_alloc(&LP, 0, N, &M));
    dt_optim_range rl = {.params = &M, .grads = &LG, .mirror = &LP, .lo = 0, .hi = N};
    ASSERT_OK(make(DT_OPTIM_ADAM, &rl, 1, &o));
    for (size_t i = 0; i < N; i++)
        lg[i] = dt_f32_to_f16(1.0f);
    lg[5] = dt_f32_to_f16(INFINITY);
    ASSERT_OK(dt_optim_unscale_grads(o, 1.0f / 65536, &inf));
    ASSERT(inf);
    float *g32;
    size_t n32;
    ASSERT_OK(dt_optim_grads_f32(o, 0, &g32, &n32));
    ASSERT_EQ_INT(n32, N);
    ASSERT_NEAR(g32[0], 1.0 / 65536, 0, 0); /* unscaled in f32: below f16's normal range, still exact */
    dt_optim_free(o);
    dt_flat_free(&M);
}

/* A shard's master: dt_optim_master_alloc over [lo, hi) of a view. */
TEST(master_alloc_ranges_and_errors)
{
    uint16_t lp[128];
    for (int i = 0; i < 128; i++)
        lp[i] = dt_f32_to_bf16((float)i);
    dt_flat LP, view, m;
    ASSERT_OK(dt_flat_wrap(&LP, DT_BF16, lp, 128));
    ASSERT_OK(dt_flat_range(&LP, 32, 96, &view));
    ASSERT_OK(dt_optim_master_alloc(&view, 40, 80, &m));
    ASSERT_EQ_INT(m.offset, 40);
    ASSERT_EQ_INT(m.numel, 40);
    ASSERT_EQ_INT(m.dtype, DT_F32);
    ASSERT_NEAR(*(float *)dt_flat_ptr(&m, 79), 79, 0, 0);
    ASSERT(dt_flat_ptr(&m, 80) == NULL);
    dt_flat_free(&m);
    ASSERT_STATUS(dt_optim_master_alloc(&view, 20, 80, &m), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "[20, 80)");
    dt_flat I;
    int32_t iv[4] = {0};
    ASSERT_OK(dt_flat_wrap(&I, DT_I32, iv, 4));
    ASSERT_STATUS(dt_optim_master_alloc(&I, 0, 4, &m), DT_ERR_DTYPE);
    ASSERT_STATUS(dt_optim_master_alloc(NULL, 0, 4, &m), DT_ERR_NULL);
    /* bf16 params (no master) are refused by the optimizer */
    uint16_t lg[128];
    dt_flat LG;
    ASSERT_OK(dt_flat_wrap(&LG, DT_BF16, lg, 128));
    dt_optim_range r = {.params = &LP, .grads = &LG, .lo = 0, .hi = 128};
    dt_optim *o;
    ASSERT_STATUS(make(DT_OPTIM_SGD, &r, 1, &o), DT_ERR_DTYPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "master");
    /* a mirror that no longer holds the range: refused at the step */
    ASSERT_OK(dt_optim_master_alloc(&LP, 0, 128, &m));
    dt_flat small;
    ASSERT_OK(dt_flat_range(&LP, 0, 64, &small));
    r = (dt_optim_range){.params = &m, .grads = &LG, .mirror = &small, .lo = 0, .hi = 128};
    ASSERT_OK(make(DT_OPTIM_SGD, &r, 1, &o));
    ASSERT_STATUS(dt_optim_step(o), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "mirror");
    dt_optim_free(o);
    dt_flat_free(&m);
}

/* A range whose segments leave a long stretch between them (an
 * interleaved pipeline rank's): the masters widen the segments only, the
 * stretch reads as zero and none of its whole pages is resident, nor of
 * the optimizer's states there; dt_optim_range_held counts the segments
 * and the padding between them, not the stretch. */
TEST(master_and_state_hold_only_the_segments)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), NE = 64 * pg / 4; /* 64 pages of f32 */
    uint16_t *lp = malloc(NE * sizeof *lp), *lg = calloc(NE, sizeof *lg);
    ASSERT(lp && lg);
    for (size_t i = 0; i < NE; i++)
        lp[i] = dt_f32_to_bf16((float)(i % 200));
    dt_flat LP, LG, M;
    ASSERT_OK(dt_flat_wrap(&LP, DT_BF16, lp, NE));
    ASSERT_OK(dt_flat_wrap(&LG, DT_BF16, lg, NE));
    /* [16, 1000) and [1010, 2000) (10 elements of padding), then [NE - 3000, NE - 16) */
    const dt_optim_segment segs[3] = {{16, 984, false}, {1010, 990, false}, {NE - 3000, 2984, false}};
    ASSERT_OK(dt_optim_master_alloc_segments(&LP, 16, NE - 16, segs, 3, &M));
    const float *mv = M.base;
    ASSERT_NEAR(mv[0], 16, 0, 0);
    ASSERT_NEAR(mv[1999 - 16], 1999 % 200, 0, 0);
    ASSERT_NEAR(mv[NE - 17 - 16], (NE - 17) % 200, 0, 0);
    const size_t gap_lo = (2000 - 16) * 4, gap_hi = (NE - 3000 - 16) * 4; /* bytes into M.base */
    const uintptr_t a = ((uintptr_t)mv + gap_lo + pg - 1) / pg * pg, b = ((uintptr_t)mv + gap_hi) / pg * pg;
    ASSERT(b > a + 8 * pg);
    unsigned char v[128];
    ASSERT((b - a) / pg <= sizeof v && mincore((void *)a, b - a, v) == 0);
    for (size_t i = 0; i < (b - a) / pg; i++)
        ASSERT_EQ_INT(v[i] & 1, 0);
    for (size_t i = 2000; i < NE - 3000; i += 101) /* (after mincore: a read maps the zero page) */
        ASSERT_NEAR(mv[i - 16], 0, 0, 0);
    dt_optim_range r = {.params = &M, .grads = &LG, .mirror = &LP, .lo = 16, .hi = NE - 16, .segs = segs, .nseg = 3};
    dt_optim *o;
    ASSERT_OK(make(DT_OPTIM_ADAMW, &r, 1, &o));
    ASSERT_EQ_INT((long long)dt_optim_range_held(o, 0), 984 + 10 + 990 + 2984);
    ASSERT_EQ_INT((long long)dt_optim_range_held(o, 1), 0);
    ASSERT_EQ_INT((long long)dt_optim_range_held(NULL, 0), 0);
    for (int st = 0; st < 2; st++) {
        float *sv;
        size_t n;
        ASSERT_OK(dt_optim_state(o, 0, st, NULL, &sv, &n));
        ASSERT_EQ_INT((long long)n, (long long)(NE - 32));
        const uintptr_t sa = ((uintptr_t)sv + gap_lo + pg - 1) / pg * pg, sb = ((uintptr_t)sv + gap_hi) / pg * pg;
        ASSERT((sb - sa) / pg <= sizeof v && mincore((void *)sa, sb - sa, v) == 0);
        for (size_t i = 0; i < (sb - sa) / pg; i++)
            ASSERT_EQ_INT(v[i] & 1, 0);
        ASSERT_NEAR(sv[5000], 0, 0, 0);
    }
    ASSERT_OK(dt_optim_step(o));
    ASSERT_NEAR(mv[5000], 0, 0, 0); /* the stretch was not stepped */
    dt_optim_free(o);
    dt_flat_free(&M);
    /* unsorted or overlapping segments */
    const dt_optim_segment bad[2] = {{100, 50, false}, {120, 10, false}};
    ASSERT_STATUS(dt_optim_master_alloc_segments(&LP, 0, NE, bad, 2, &M), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "segment 1");
    free(lp);
    free(lg);
}

int main(void)
{
    RUN(master_equals_f32_optimizer);
    RUN(unscale_finds_inf_and_nan);
    RUN(master_alloc_ranges_and_errors);
    RUN(master_and_state_hold_only_the_segments);
    return TEST_REPORT();
}
