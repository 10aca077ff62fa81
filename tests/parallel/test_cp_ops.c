/* The pieces of context parallelism that a model uses (cp.h), below the
 * CLI runs of test_train_cp_cli.c:
 *   - dt_cp_loss on 2 ranks with uneven counts (3 rows and 1): the value is
 *     the whole sequence's mean sum(m_r n_r) / N on both ranks, and the
 *     gradient each rank gets is cp x n_r / N (the share a gradient average
 *     over the cp ranks turns into the whole mean's); nothing counted: 0;
 *   - dt_cp_local_rows: the balanced and plain layouts' rows of ids;
 *   - dt_rope_at: positions given per row equal dt_rope's rows at those
 *     positions (forward and backward); a negative position is refused;
 *   - dt_cp_check: the bad sequence lengths and head counts by name;
 *   - dt_cp_attention on a bf16 qkv (mixed precision), ring and Ulysses:
 *     y in bf16, each value the f32 attention's of the same (bf16) inputs
 *     rounded, and the gradient in bf16, the f32 one's rounded. */
// dt-test-labels: threads
#include "comm/harness.h"
#include "test.h"

#include "dtrain/autograd.h"
#include "dtrain/cp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int body_loss(int rank, int P, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, P, NULL, &pg));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = dt_tensor_new(DT_F32, 0, NULL);
    TH_CHECK(x != NULL, "out of memory");
    TH_OK(dt_tensor_set_requires_grad(x, true));
    const float m = rank == 0 ? 2.0f : 6.0f;
    const int64_t count = rank == 0 ? 3 : 1;
    TH_OK(dt_tensor_set(x, 0, m));
    dt_tensor *l = dt_cp_loss(ctx, pg, x, count);
    TH_CHECK(l != NULL, "dt_cp_loss: %s", dt_last_error());
    TH_CHECK(fabs(dt_tensor_item(l) - 3.0) < 1e-6, "rank %d: loss %g, want (2 x 3 + 6 x 1) / 4 = 3", rank,
             (double)dt_tensor_item(l));
    TH_OK(dt_backward(ctx, l));
    const double want = 2.0 * (double)count / 4.0; /* cp x n_r / N */
    TH_CHECK(x->grad && fabs(dt_tensor_get(x->grad, 0) - want) < 1e-6, "rank %d: gradient %g, want %g", rank,
             x->grad ? dt_tensor_get(x->grad, 0) : NAN, want);
    dt_ctx_reset(ctx);
    l = dt_cp_loss(ctx, pg, x, 0); /* nothing counted anywhere */
    TH_CHECK(l && dt_tensor_item(l) == 0.0f, "no rows: loss %g", l ? (double)dt_tensor_item(l) : NAN);
    dt_tensor_free(x);
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

TEST(loss_uneven_counts) { ASSERT_EQ_INT(th_run(2, 60.0, body_loss, NULL, NULL), 0); }

TEST(local_rows)
{
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    int64_t ids[2 * 8];
    for (int i = 0; i < 16; i++)
        ids[i] = 100 * (i / 8) + i % 8;
    dt_tensor *t = dt_tensor_view_of(ctx, ids, DT_I64, 2, (int64_t[]){2, 8});
    dt_cp_layout L;
    ASSERT_OK(dt_cp_layout_make(1, 2, 8, true, &L)); /* positions 2, 3, 4, 5 */
    dt_tensor *r = dt_cp_local_rows(ctx, &L, t);
    ASSERT(r && r->shape[0] == 2 && r->shape[1] == 4);
    const int64_t want[8] = {2, 3, 4, 5, 102, 103, 104, 105};
    for (int i = 0; i < 8; i++)
        ASSERT_EQ_INT((int64_t)dt_tensor_get(r, i), want[i]);
    ASSERT_OK(dt_cp_layout_make(0, 2, 8, true, &L)); /* positions 0, 1, 6, 7 */
    r = dt_cp_local_rows(ctx, &L, t);
    const int64_t want0[8] = {0, 1, 6, 7, 100, 101, 106, 107};
    for (int i = 0; r && i < 8; i++)
        ASSERT_EQ_INT((int64_t)dt_tensor_get(r, i), want0[i]);
    ASSERT_OK(dt_cp_layout_make(0, 2, 6, false, &L));
    ASSERT(dt_cp_local_rows(ctx, &L, t) == NULL); /* 8 positions, the layout 6 */
    ASSERT_STR_CONTAINS(dt_last_error(), "the layout 6");
    dt_ctx_free(ctx);
}

TEST(rope_at_positions)
{
    const int64_t B = 2, T = 8, H = 2, hd = 6, C = H * hd;
    const int64_t pos[4] = {0, 1, 6, 7};
    float inv[3] = {1.0f, 0.1f, 0.01f};
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = dt_tensor_new(DT_F32, 3, (int64_t[]){B, T, C});
    dt_tensor *xl = dt_tensor_new(DT_F32, 3, (int64_t[]){B, 4, C});
    ASSERT(x && xl);
    for (int64_t i = 0; i < B * T * C; i++)
        dt_tensor_set(x, i, sinf((float)i * 0.37f));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < 4; i++)
            for (int64_t c = 0; c < C; c++)
                dt_tensor_set(xl, (b * 4 + i) * C + c, dt_tensor_get(x, (b * T + pos[i]) * C + c));
    ASSERT_OK(dt_tensor_set_requires_grad(x, true));
    ASSERT_OK(dt_tensor_set_requires_grad(xl, true));
    dt_tensor *y = dt_rope(ctx, x, (int)H, inv, 0), *yl = dt_rope_at(ctx, xl, (int)H, inv, 0, pos);
    ASSERT(y && yl);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < 4; i++)
            for (int64_t c = 0; c < C; c++)
                ASSERT_NEAR(dt_tensor_get(yl, (b * 4 + i) * C + c), dt_tensor_get(y, (b * T + pos[i]) * C + c), 1e-6,
                            1e-6);
    /* backward: the gradient of sum(y * w) at the same rows */
    dt_tensor *w = dt_tensor_empty(ctx, DT_F32, 3, (int64_t[]){B, T, C});
    dt_tensor *wl = dt_tensor_empty(ctx, DT_F32, 3, (int64_t[]){B, 4, C});
    for (int64_t i = 0; i < B * T * C; i++)
        dt_tensor_set(w, i, cosf((float)i));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < 4; i++)
            for (int64_t c = 0; c < C; c++)
                dt_tensor_set(wl, (b * 4 + i) * C + c, dt_tensor_get(w, (b * T + pos[i]) * C + c));
    ASSERT_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, w))));
    ASSERT_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, yl, wl))));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < 4; i++)
            for (int64_t c = 0; c < C; c++)
                ASSERT_NEAR(dt_tensor_get(xl->grad, (b * 4 + i) * C + c),
                            dt_tensor_get(x->grad, (b * T + pos[i]) * C + c), 1e-6, 1e-6);
    const int64_t neg[4] = {0, -1, 2, 3};
    ASSERT(dt_rope_at(ctx, xl, (int)H, inv, 0, neg) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "position -1 of row 1 is negative");
    dt_tensor_free(x);
    dt_tensor_free(xl);
    dt_ctx_free(ctx);
}

static int body_check(int rank, int P, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, P, NULL, &pg));
    dt_cp_params p = dt_cp_params_default();
    p.group = pg;
    TH_CHECK(dt_cp_check(&p, 12, 3) == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "sequence length 12 is not a "
             "multiple of 8"), "balanced 12 over 4: %s", dt_last_error());
    p.balance = false;
    TH_OK(dt_cp_check(&p, 12, 3));
    p.impl = DT_CP_ULYSSES;
    TH_CHECK(dt_cp_check(&p, 12, 6) == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "heads (6 on this rank) "
             "divisible by cp 4"), "Ulysses 6 heads over 4: %s", dt_last_error());
    TH_OK(dt_cp_check(&p, 12, 8));
    dt_pg_free(pg);
    return 0;
}

TEST(check_names_the_numbers) { ASSERT_EQ_INT(th_run(4, 60.0, body_check, NULL, NULL), 0); }

static float bf16_round(double v) { return dt_bf16_to_f32(dt_f32_to_bf16((float)v)); }

/* The rank's rows of a (1, 8, 3 x 2 x 4) qkv as bf16 and as f32 (the same values); the attention of each, the
 * gradient of sum(y w) with w bf16-exact, so that both backward passes start from the same values */
static int body_bf16(int rank, int P, void *arg)
{
    const dt_cp_impl impl = *(const dt_cp_impl *)arg;
    const int64_t Tl = 8 / P, H = 2, C = 8;
    dt_pg *pg;
    TH_OK(th_pg(rank, P, NULL, &pg));
    dt_cp_params p = dt_cp_params_default();
    p.group = pg, p.impl = impl;
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *q16 = dt_tensor_new(DT_BF16, 3, (int64_t[]){1, Tl, 3 * C});
    dt_tensor *q32 = dt_tensor_new(DT_F32, 3, (int64_t[]){1, Tl, 3 * C});
    dt_tensor *w = dt_tensor_new(DT_F32, 3, (int64_t[]){1, Tl, C});
    TH_CHECK(q16 && q32 && w, "out of memory");
    for (int64_t i = 0; i < Tl * 3 * C; i++) {
        const float v = bf16_round(sin(0.7 * (double)(i + rank * 1000)));
        TH_OK(dt_tensor_set(q16, i, v));
        TH_OK(dt_tensor_set(q32, i, v));
    }
    for (int64_t i = 0; i < Tl * C; i++)
        TH_OK(dt_tensor_set(w, i, bf16_round(cos((double)(i + rank * 100)))));
    TH_OK(dt_tensor_set_requires_grad(q16, true));
    TH_OK(dt_tensor_set_requires_grad(q32, true));
    dt_tensor *y16 = dt_cp_attention(ctx, &p, q16, (int)H, true), *y32 = dt_cp_attention(ctx, &p, q32, (int)H, true);
    TH_CHECK(y16 && y32, "dt_cp_attention: %s", dt_last_error());
    TH_CHECK(y16->dtype == DT_BF16 && y32->dtype == DT_F32, "y's dtypes %s and %s", dt_dtype_name(y16->dtype),
             dt_dtype_name(y32->dtype));
    for (int64_t i = 0; i < Tl * C; i++)
        TH_CHECK(dt_tensor_get(y16, i) == bf16_round(dt_tensor_get(y32, i)), "y[%lld]: %g, f32 %g", (long long)i,
                 dt_tensor_get(y16, i), dt_tensor_get(y32, i));
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, dt_cast(ctx, y16, DT_F32), w))));
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y32, w))));
    TH_CHECK(q16->grad && q16->grad->dtype == DT_BF16 && q32->grad, "no bf16 gradient");
    double most = 0.0;
    for (int64_t i = 0; i < Tl * 3 * C; i++) {
        const double g = dt_tensor_get(q32->grad, i);
        TH_CHECK(dt_tensor_get(q16->grad, i) == bf16_round(g), "dqkv[%lld]: %g, f32 %g", (long long)i,
                 dt_tensor_get(q16->grad, i), g);
        most = fabs(g) > most ? fabs(g) : most;
    }
    TH_CHECK(most > 0.01, "the gradient is %g at most: the check saw nothing", most);
    dt_tensor_free(q16), dt_tensor_free(q32), dt_tensor_free(w);
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

TEST(attention_bf16_widened)
{
    dt_cp_impl impl = DT_CP_RING;
    ASSERT_EQ_INT(th_run(2, 60.0, body_bf16, &impl, NULL), 0);
    impl = DT_CP_ULYSSES;
    ASSERT_EQ_INT(th_run(2, 60.0, body_bf16, &impl, NULL), 0);
}

/* dt_cp_attention_heads under either attention: dropout 0.5 while training changes y, in eval it is the
 * attention without dropout (the same bits as dt_cp_attention); heads outside the layer and p outside [0, 1) are
 * refused */
static int body_heads(int rank, int P, void *arg)
{
    (void)arg;
    const int64_t Tl = 8 / P, H = 2, C = 8;
    dt_pg *pg;
    TH_OK(th_pg(rank, P, NULL, &pg));
    dt_cp_params p = dt_cp_params_default();
    p.group = pg;
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *q = dt_tensor_new(DT_F32, 3, (int64_t[]){1, Tl, 3 * C});
    TH_CHECK(q != NULL, "out of memory");
    for (int64_t i = 0; i < Tl * 3 * C; i++)
        TH_OK(dt_tensor_set(q, i, (float)sin(0.3 * (double)(i + rank * 100))));
    const dt_rng_key key = dt_rng_key_make(5, DT_RNG_DROPOUT, 0, 0);
    for (int impl = 0; impl < DT_CP_IMPL_COUNT; impl++) {
        p.impl = (dt_cp_impl)impl;
        dt_tensor *y0 = dt_cp_attention(ctx, &p, q, (int)H, true);
        dt_tensor *ye = dt_cp_attention_heads(ctx, &p, q, (int)H, 2, 6, true, 0.5f, false, key);
        dt_tensor *y1 = dt_cp_attention_heads(ctx, &p, q, (int)H, 2, 6, true, 0.5f, true, key);
        TH_CHECK(y0 && ye && y1, "%s with dropout: %s", dt_cp_impl_name(p.impl), dt_last_error());
        int differ = 0;
        for (int64_t i = 0; i < Tl * C; i++) {
            TH_CHECK(dt_tensor_get(ye, i) == dt_tensor_get(y0, i), "%s in eval: y[%lld] %g, without dropout %g",
                     dt_cp_impl_name(p.impl), (long long)i, dt_tensor_get(ye, i), dt_tensor_get(y0, i));
            differ += dt_tensor_get(y1, i) != dt_tensor_get(y0, i);
        }
        TH_CHECK(differ > 0, "%s: dropout 0.5 changed nothing", dt_cp_impl_name(p.impl));
        TH_CHECK(!dt_cp_attention_heads(ctx, &p, q, (int)H, 1, (int)H, true, 0.0f, true, key) &&
                     dt_last_status() == DT_ERR_INVALID_ARG, "heads [1, 3) of 2: %s", dt_last_error());
        TH_CHECK(!dt_cp_attention_heads(ctx, &p, q, (int)H, 0, (int)H, true, 1.0f, true, key) &&
                     dt_last_status() == DT_ERR_INVALID_ARG, "dropout 1: %s", dt_last_error());
    }
    dt_tensor_free(q);
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

TEST(attention_heads_dropout) { ASSERT_EQ_INT(th_run(2, 60.0, body_heads, NULL, NULL), 0); }

TEST(impl_names)
{
    dt_cp_impl k;
    ASSERT_OK(dt_cp_impl_parse("ulysses", &k));
    ASSERT_EQ_INT(k, DT_CP_ULYSSES);
    ASSERT_STR_EQ(dt_cp_impl_name(DT_CP_RING), "ring");
    ASSERT_STATUS(dt_cp_impl_parse("tree", &k), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "'tree': ring or ulysses");
}

/* The forked ranks first (libgomp is not fork-safe). */
int main(void)
{
    RUN(loss_uneven_counts);
    RUN(check_names_the_numbers);
    RUN(attention_bf16_widened);
    RUN(attention_heads_dropout);
    RUN(impl_names);
    RUN(local_rows);
    RUN(rope_at_positions);
    return TEST_REPORT();
}
