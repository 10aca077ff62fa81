/* FSDP MixedPrecision's buffer_dtype (issue 12): batch norm's running
 * statistics held in bf16/f16.
 *   - dt_batch_norm with bf16/f16 running statistics: the output equals the
 *     f32 op's (training: bit for bit; evaluation: against the f32 op given
 *     the same values widened), and the updated statistics are the f32
 *     op's rounded once (to nearest even), exactly;
 *   - dt_model_build_params.buffer_dtype: the statistics live in a bf16
 *     buffer flat, initialised exactly (0 and 1), except under
 *     keep_batchnorm_fp32; a bad buffer_dtype is refused;
 *   - the trainer: a ConvNet with bf16 parameters trains with bf16 running
 *     statistics; its losses equal those of the same run with f32
 *     statistics (training-mode batch norm never reads them), and after k
 *     steps the statistics differ from the f32 run's by at most k * 2^-8
 *     times the largest magnitude each took (one bf16 rounding, unit
 *     roundoff 2^-8, per update); a checkpoint holds
 *     them and loads them back exactly; a policy whose buffer_dtype the
 *     model was not built with is refused, naming it. */
#include "test.h"
#include "tmp_util.h"

#include "dtrain/autograd.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define C 3

static float lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

static void run_bn(dt_dtype sdt, bool training, const float *x, const float *rm0, const float *rv0, float *y,
                   float *rm, float *rv)
{
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    uint16_t lm[C], lv[C];
    void *pm = rm, *pv = rv;
    memcpy(rm, rm0, sizeof(float) * C);
    memcpy(rv, rv0, sizeof(float) * C);
    if (sdt != DT_F32) {
        ASSERT_OK(dt_k_convert(rm0, DT_F32, lm, sdt, C));
        ASSERT_OK(dt_k_convert(rv0, DT_F32, lv, sdt, C));
        pm = lm, pv = lv;
    }
    dt_tensor *tx = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){4, C, 2, 2}, x);
    dt_tensor *tm = dt_tensor_wrap(pm, sdt, 1, (int64_t[]){C}), *tv = dt_tensor_wrap(pv, sdt, 1, (int64_t[]){C});
    float g[C] = {1.0f, 0.5f, 2.0f}, b[C] = {0.0f, 0.25f, -1.0f};
    dt_tensor *tg = dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){C}, g);
    dt_tensor *tb = dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){C}, b);
    ASSERT(tx && tm && tv && tg && tb);
    dt_tensor *ty = dt_batch_norm(ctx, tx, tg, tb, tm, tv, training, 0.1f, 1e-5f);
    ASSERT(ty != NULL);
    ASSERT_EQ_INT(ty->dtype, DT_F32);
    memcpy(y, ty->data, sizeof(float) * 4 * C * 4);
    if (sdt != DT_F32) { /* the statistics as the low-precision buffers hold them */
        ASSERT_OK(dt_k_convert(lm, sdt, rm, DT_F32, C));
        ASSERT_OK(dt_k_convert(lv, sdt, rv, DT_F32, C));
    }
    dt_tensor_free(tm);
    dt_tensor_free(tv);
    dt_ctx_free(ctx);
}

TEST(batch_norm_low_precision_statistics)
{
    float x[4 * C * 4];
    uint32_t s = 7;
    for (int i = 0; i < 4 * C * 4; i++)
        x[i] = 3.0f * lcg(&s) + 0.5f;
    /* values exact in bf16 and f16 */
    const float rm0[C] = {0.0f, 0.5f, -1.25f}, rv0[C] = {1.0f, 0.75f, 2.5f};
    static const dt_dtype lows[2] = {DT_BF16, DT_F16};
    for (int t = 0; t < 2; t++) {
        float y32[4 * C * 4], yl[4 * C * 4], m32[C], v32[C], ml[C], vl[C];
        run_bn(DT_F32, true, x, rm0, rv0, y32, m32, v32);
        run_bn(lows[t], true, x, rm0, rv0, yl, ml, vl);
        ASSERT(memcmp(y32, yl, sizeof y32) == 0);
        /* the f32 update, rounded once */
        uint16_t r[C];
        float want[C];
        ASSERT_OK(dt_k_convert(m32, DT_F32, r, lows[t], C));
        ASSERT_OK(dt_k_convert(r, lows[t], want, DT_F32, C));
        ASSERT(memcmp(want, ml, sizeof want) == 0);
        ASSERT_OK(dt_k_convert(v32, DT_F32, r, lows[t], C));
        ASSERT_OK(dt_k_convert(r, lows[t], want, DT_F32, C));
        ASSERT(memcmp(want, vl, sizeof want) == 0);
        ASSERT(fabsf(ml[1] - 0.5f) > 1e-3f); /* it moved */
        /* evaluation reads them: the f32 op on the same (widened) values */
        float ye32[4 * C * 4], yel[4 * C * 4], a[C], b[C];
        run_bn(DT_F32, false, x, ml, vl, ye32, a, b);
        run_bn(lows[t], false, x, ml, vl, yel, a, b);
        ASSERT(memcmp(ye32, yel, sizeof ye32) == 0);
        ASSERT_EQ_INT(memcmp(a, ml, sizeof a), 0); /* evaluation leaves them */
    }
    /* integer statistics: an error naming the argument */
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    int64_t bad[C] = {0};
    float one[C] = {1, 1, 1};
    dt_tensor *tx = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){4, C}, x);
    dt_tensor *tm = dt_tensor_wrap(bad, DT_I64, 1, (int64_t[]){C});
    dt_tensor *tv = dt_tensor_wrap(one, DT_F32, 1, (int64_t[]){C});
    ASSERT(dt_batch_norm(ctx, tx, NULL, NULL, tm, tv, true, 0.1f, 1e-5f) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "running_mean");
    dt_tensor_free(tm);
    dt_tensor_free(tv);
    dt_ctx_free(ctx);
}

static dt_model *convnet(dt_dtype buf, bool keep_bn, dt_model_desc *d)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.build.param_dtype = DT_BF16;
    cfg.build.keep_batchnorm_fp32 = keep_bn;
    cfg.build.buffer_dtype = buf;
    dt_model *m = NULL;
    if (dt_model_create("convnet", 5, &cfg, &m, d) < 0)
        return NULL;
    return m;
}

TEST(model_buffers_in_buffer_dtype)
{
    dt_model_desc d;
    dt_model *m = convnet(DT_BF16, false, &d);
    ASSERT(m != NULL);
    const dt_flat *b16 = dt_model_flat(m, DT_FLAT_BUFFERS, DT_BF16), *b32 = dt_model_flat(m, DT_FLAT_BUFFERS, DT_F32);
    ASSERT(b16 && b16->used > 0);
    ASSERT(!b32 || b32->used == 0);
    size_t n = 0, ones = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info pi;
        ASSERT_OK(dt_model_entry(m, i, &pi));
        const dt_param_info *p = &pi;
        if (!p->is_buffer || !strstr(p->name, "running_"))
            continue;
        ASSERT_EQ_INT(p->dtype, DT_BF16);
        float v[64];
        ASSERT(p->numel <= 64);
        ASSERT_OK(dt_k_convert(p->tensor->data, DT_BF16, v, DT_F32, (int64_t)p->numel));
        for (size_t k = 0; k < p->numel; k++)
            ASSERT(v[k] == (strstr(p->name, "running_var") ? 1.0f : 0.0f));
        ones += strstr(p->name, "running_var") != NULL;
        n++;
    }
    ASSERT(n >= 2 && ones >= 1);
    dt_model_free(m);
    /* keep_batchnorm_fp32: batch norm keeps f32 statistics */
    m = convnet(DT_BF16, true, &d);
    ASSERT(m != NULL);
    b16 = dt_model_flat(m, DT_FLAT_BUFFERS, DT_BF16);
    ASSERT(!b16 || b16->used == 0);
    dt_model_free(m);
    /* not a float dtype */
    dt_model_config cfg = dt_model_config_default();
    cfg.build.buffer_dtype = DT_I32;
    ASSERT(dt_model_create("convnet", 5, &cfg, &m, &d) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "buffer_dtype");
}

typedef struct {
    dt_model *m;
    dt_model_desc d;
    dt_trainer *tr;
} rig;

static void rig_init(rig *r, dt_dtype buf, dt_dtype policy_buf)
{
    r->m = convnet(buf, false, &r->d);
    ASSERT(r->m != NULL);
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = &r->d;
    tp.sgd.lr = 0.05;
    tp.precision.param_dtype = DT_BF16;
    tp.precision.buffer_dtype = policy_buf;
    tp.precision.keep_batchnorm_fp32 = false;
    ASSERT_OK(dt_trainer_init(r->m, s, &tp, &r->tr));
}

static void rig_free(rig *r)
{
    dt_trainer_free(r->tr);
    dt_model_free(r->m);
}

/* The running statistics of m as f32, in entry order. */
static size_t stats(const dt_model *m, float *out)
{
    size_t n = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info pi;
        if (dt_model_entry(m, i, &pi) < 0)
            return 0;
        const dt_param_info *p = &pi;
        if (!p->is_buffer || !strstr(p->name, "running_"))
            continue;
        dt_k_convert(p->tensor->data, p->dtype, out + n, DT_F32, (int64_t)p->numel);
        n += p->numel;
    }
    return n;
}

#define B 4
#define K 3

TEST(trainer_bf16_statistics)
{
    rig a, b;
    rig_init(&a, DT_BF16, DT_BF16);
    rig_init(&b, DT_F32, DT_F32);
    int64_t xs[DT_MAX_DIMS];
    int nd;
    dt_model_desc_shapes(&a.d, B, &nd, xs, NULL, NULL, NULL);
    size_t nx = 1;
    for (int i = 0; i < nd; i++)
        nx *= (size_t)xs[i];
    float *x = malloc(nx * sizeof(float));
    int64_t y[B];
    ASSERT(x != NULL);
    uint32_t s = 11;
    float maxmag[256] = {0}, cur[256];
    for (int k = 0; k < K; k++) {
        for (size_t i = 0; i < nx; i++)
            x[i] = lcg(&s) + 0.3f;
        for (int i = 0; i < B; i++)
            y[i] = (int64_t)((k * B + i) % 10);
        dt_trainer_batch bt = dt_trainer_batch_make(x, DT_F32, nd, xs, y, DT_I64, 1, (int64_t[]){B});
        dt_trainer_metrics ma, mb;
        ASSERT_OK(dt_trainer_step(a.tr, &bt, 1, &ma));
        ASSERT_OK(dt_trainer_step(b.tr, &bt, 1, &mb));
        ASSERT(ma.loss == mb.loss); /* training-mode batch norm does not read the statistics */
        ASSERT(isfinite(ma.loss));
        size_t nc = stats(b.m, cur);
        ASSERT(nc <= 256);
        for (size_t i = 0; i < nc; i++)
            maxmag[i] = fmaxf(maxmag[i], fabsf(cur[i]));
    }
    float sa[256], sb[256];
    size_t na = stats(a.m, sa), nb = stats(b.m, sb);
    ASSERT(na == nb && na > 0 && na <= 256);
    double worst = 0;
    for (size_t i = 0; i < na; i++) {
        /* each update rounds once (unit roundoff 2^-8) and shrinks the
         * earlier error by 1 - momentum: at most K roundings of values no
         * larger than the largest the statistic took (1% slack for the
         * bf16 run's own, slightly different, history) */
        double tol = 1.01 * K * ldexp(1.0, -8) * maxmag[i];
        double e = fabs((double)sa[i] - sb[i]);
        if (e > tol)
            fprintf(stderr, "statistic %zu: bf16 %.8g, f32 %.8g, bound %.3g\n", i, sa[i], sb[i], tol);
        ASSERT(e <= tol);
        if (maxmag[i] > 0)
            worst = fmax(worst, e / maxmag[i]);
    }
    fprintf(stderr, "bf16 running statistics after %d steps: worst difference %.2e of the largest value (bound %.2e)\n", K,
            worst, K * ldexp(1.0, -8));
    /* a checkpoint holds the bf16 statistics and gives them back exactly */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/ck", t_tmpdir("buffer_dtype"));
    ASSERT_OK(dt_trainer_save(a.tr, dir, NULL));
    for (size_t i = 0; i < dt_model_num_entries(a.m); i++) {
        dt_param_info pi;
        ASSERT_OK(dt_model_entry(a.m, i, &pi));
        const dt_param_info *p = &pi;
        if (p->is_buffer && p->dtype == DT_BF16)
            memset(p->tensor->data, 0, p->numel * 2);
    }
    ASSERT_OK(dt_trainer_load(a.tr, dir, NULL));
    float sc[256];
    stats(a.m, sc);
    ASSERT(memcmp(sa, sc, na * sizeof(float)) == 0);
    free(x);
    rig_free(&a);
    rig_free(&b);
    t_rm_rf(t_tmpdir("buffer_dtype"));
}

TEST(policy_without_the_cast_is_refused)
{
    dt_model_desc d;
    dt_model *m = convnet(DT_F32, false, &d); /* statistics f32 */
    ASSERT(m != NULL);
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = &d;
    tp.precision.param_dtype = DT_BF16;
    tp.precision.buffer_dtype = DT_BF16;
    tp.precision.keep_batchnorm_fp32 = false;
    dt_trainer *tr = NULL;
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "buffer_dtype bf16");
    dt_model_free(m);
}

int main(void)
{
    RUN(batch_norm_low_precision_statistics);
    RUN(model_buffers_in_buffer_dtype);
    RUN(trainer_bf16_statistics);
    RUN(policy_without_the_cast_is_refused);
    return TEST_REPORT();
}
