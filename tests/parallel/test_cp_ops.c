/* The pieces of context parallelism that a model uses (cp.h), below the
 * CLI runs of test_train_cp_cli.c:
 *   - dt_cp_loss on 2 ranks with uneven counts (3 rows and 1): the value is
 *     the whole sequence's mean sum(m_r n_r) / N on both ranks, and the
 *     gradient each rank gets is cp x n_r / N (the share a gradient average
 *     over the cp ranks turns into the whole mean's); nothing counted: 0;
 *   - dt_cp_local_rows: the balanced and plain layouts' rows of ids;
 *   - dt_rope_at: positions given per row equal dt_rope's rows at those
 *     positions (forward and backward); a negative position is refused;
 *   - dt_cp_check: the bad sequence lengths and head counts by name. */
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
    RUN(impl_names);
    RUN(local_rows);
    RUN(rope_at_positions);
    return TEST_REPORT();
}
