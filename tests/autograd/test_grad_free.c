/* Backward gives an intermediate tensor's gradient back to the context's
 * arena once it has been passed on (as PyTorch frees a non-leaf's .grad):
 * t->grad is NULL afterwards unless dt_ag_retain_grad(t) was called, the
 * leaves' gradients are the same bits either way, and the arena's peak
 * during backward is the live gradients, not all of them. The arena's own
 * dt_arena_give_back: reuse by size, forgotten at a rewind past the
 * allocation and at a reset. */
#include "dtrain/dtrain.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

enum { R = 64, D = 96, L = 8 };

TEST(arena_give_back)
{
    dt_arena *a = dt_arena_init(1 << 20);
    ASSERT(a != NULL);
    void *p = dt_arena_alloc(a, 1000), *q = dt_arena_alloc(a, 5000);
    ASSERT(p && q);
    size_t used = dt_arena_used(a);
    dt_arena_give_back(a, p, 1000);
    ASSERT(dt_arena_alloc(a, 5000) != p);  /* another size: new memory */
    ASSERT(dt_arena_alloc(a, 1000) == p);  /* the same size: p again */
    ASSERT(dt_arena_alloc(a, 1000) != p);  /* once */
    dt_arena_give_back(a, q, 5000);
    dt_arena_give_back(a, p, 1000);
    ASSERT(dt_arena_alloc(a, 990) == p); /* sizes compare after rounding to the alignment */
    ASSERT(dt_arena_used(a) == used + 5056 + 1024); /* memory handed out again counts once */

    /* a rewind forgets what was given back of memory allocated after the mark */
    dt_arena_pos m = dt_arena_mark(a);
    void *r = dt_arena_alloc(a, 3000);
    dt_arena_give_back(a, r, 3000);
    dt_arena_rewind(a, m);
    void *s = dt_arena_alloc(a, 100); /* the bump hands r's memory out again */
    ASSERT(s == r);
    ASSERT(dt_arena_alloc(a, 3000) != r);
    ASSERT(dt_arena_alloc(a, 5000) == q); /* given back before the mark: kept */

    /* a reset forgets everything */
    void *t = dt_arena_alloc(a, 700);
    dt_arena_give_back(a, t, 700);
    dt_arena_reset(a);
    void *u = dt_arena_alloc(a, 64);
    ASSERT(dt_arena_alloc(a, 700) != u);
    dt_arena_give_back(NULL, u, 64); /* no-ops */
    dt_arena_give_back(a, NULL, 64);
    dt_arena_free(a);
}

typedef struct {
    dt_tensor *w, *b;
} layer;

/* h + relu(h W^T + b), one residual block (ud: its layer, alive through backward) */
static dt_tensor *block(dt_ctx *ctx, int nin, dt_tensor **in, void *ud)
{
    (void)nin;
    const layer *ly = ud;
    return dt_add(ctx, in[0], dt_relu(ctx, dt_linear(ctx, in[0], ly->w, ly->b)));
}

typedef struct {
    float *gx, *gw[L], *gb[L];
    size_t fwd, peak;     /* arena bytes after the forward, peak after backward */
    int inter_null, inter; /* intermediates whose grad is NULL after backward, of how many */
    float *gmid;           /* the retained middle activation's gradient */
} result;

/* One forward + backward on a fresh context: autocast dt, every block under
 * dt_ag_checkpoint or not, every intermediate retained or only the middle one. */
static void run(const float *xv, const float *wv, const float *rv, dt_dtype dt, int ckpt, int retain_all, int nl,
                result *out)
{
    memset(out, 0, sizeof *out);
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    ASSERT_OK(dt_autocast_set(ctx, dt, NULL));
    layer n[L];
    dt_tensor *x = dt_tensor_new(DT_F32, 2, SH(R, D));
    ASSERT(x != NULL);
    memcpy(x->data, xv, sizeof(float) * R * D);
    ASSERT_OK(dt_tensor_set_requires_grad(x, true));
    for (int l = 0; l < L; l++) {
        n[l].w = dt_tensor_new(DT_F32, 2, SH(D, D));
        n[l].b = dt_tensor_new(DT_F32, 1, SH(D));
        ASSERT(n[l].w && n[l].b);
        memcpy(n[l].w->data, wv + (size_t)l * D * D, sizeof(float) * D * D);
        for (int i = 0; i < D; i++)
            ((float *)n[l].b->data)[i] = 0.01f * (float)(i % 7) - 0.02f;
        ASSERT_OK(dt_tensor_set_requires_grad(n[l].w, true));
        ASSERT_OK(dt_tensor_set_requires_grad(n[l].b, true));
    }
    dt_tensor *mid[L + 1];
    dt_tensor *h = x;
    for (int l = 0; l < nl; l++) {
        dt_tensor *in[1] = {h};
        h = ckpt ? dt_ag_checkpoint(ctx, block, 1, in, &n[l]) : block(ctx, 1, in, &n[l]);
        ASSERT(h != NULL);
        if (l == nl / 2)
            h = dt_reshape(ctx, dt_reshape(ctx, h, 1, SH(R * D)), 2, SH(R, D)); /* views hand gradients over */
        mid[l] = h;
    }
    dt_tensor *loss = dt_sum(ctx, dt_mul(ctx, dt_cast(ctx, h, DT_F32), dt_tensor_from(ctx, DT_F32, 2, SH(R, D), rv)));
    ASSERT(loss != NULL);
    for (int l = 0; l < nl; l++)
        if (retain_all || l == nl / 2)
            ASSERT_OK(dt_ag_retain_grad(mid[l]));
    out->fwd = dt_arena_used(dt_ctx_arena(ctx));
    ASSERT_OK(dt_backward(ctx, loss));
    out->peak = dt_arena_peak(dt_ctx_arena(ctx));
    for (int l = 0; l < nl; l++) {
        out->inter++;
        out->inter_null += mid[l]->grad == NULL;
    }
    ASSERT(mid[nl / 2]->grad != NULL && mid[nl / 2]->grad->dtype == DT_F32);
    out->gmid = malloc(sizeof(float) * R * D);
    out->gx = malloc(sizeof(float) * R * D);
    ASSERT(out->gmid && out->gx);
    memcpy(out->gmid, mid[nl / 2]->grad->data, sizeof(float) * R * D);
    memcpy(out->gx, x->grad->data, sizeof(float) * R * D);
    for (int l = 0; l < L; l++) {
        out->gw[l] = malloc(sizeof(float) * D * D);
        out->gb[l] = malloc(sizeof(float) * D);
        ASSERT(out->gw[l] && out->gb[l]);
        ASSERT((l < nl) == (n[l].w->grad != NULL)); /* the blocks past nl were not used */
        if (l < nl) {
            memcpy(out->gw[l], n[l].w->grad->data, sizeof(float) * D * D);
            memcpy(out->gb[l], n[l].b->grad->data, sizeof(float) * D);
        }
        dt_tensor_free(n[l].w);
        dt_tensor_free(n[l].b);
    }
    dt_tensor_free(x);
    dt_ctx_free(ctx);
}

static void result_free(result *r)
{
    free(r->gx);
    free(r->gmid);
    for (int l = 0; l < L; l++) {
        free(r->gw[l]);
        free(r->gb[l]);
    }
}

static int same(const result *a, const result *b)
{
    int ok = !memcmp(a->gx, b->gx, sizeof(float) * R * D) && !memcmp(a->gmid, b->gmid, sizeof(float) * R * D);
    for (int l = 0; l < L; l++)
        ok &= !memcmp(a->gw[l], b->gw[l], sizeof(float) * D * D) && !memcmp(a->gb[l], b->gb[l], sizeof(float) * D);
    return ok;
}

TEST(intermediate_grads_given_back)
{
    float *xv = malloc(sizeof(float) * R * D), *rv = malloc(sizeof(float) * R * D);
    float *wv = malloc(sizeof(float) * L * D * D);
    ASSERT(xv && rv && wv);
    uint64_t s = 12345;
    for (size_t i = 0; i < (size_t)R * D; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        xv[i] = (float)((s >> 40) % 2001) / 1000.0f - 1.0f;
        rv[i] = (float)((s >> 20) % 2001) / 2000.0f - 0.5f;
    }
    for (size_t i = 0; i < (size_t)L * D * D; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        wv[i] = ((float)((s >> 40) % 2001) / 1000.0f - 1.0f) * 0.1f;
    }
    const dt_dtype dts[2] = {DT_F32, DT_BF16};
    for (int d = 0; d < 2; d++)
        for (int ckpt = 0; ckpt < 2; ckpt++) {
            result all, freed, half;
            run(xv, wv, rv, dts[d], ckpt, 1, L, &all);
            run(xv, wv, rv, dts[d], ckpt, 0, L, &freed);
            run(xv, wv, rv, dts[d], ckpt, 0, L / 2, &half);
            if (!same(&all, &freed))
                TEST_FAIL_("%s ckpt %d: the gradients differ with the intermediates' given back", dt_dtype_name(dts[d]),
                           ckpt);
            ASSERT_EQ_INT(all.inter_null, 0);
            ASSERT_EQ_INT(freed.inter_null, freed.inter - 1); /* all but the retained middle one */
            /* what backward adds to the forward's memory: with the blocks' outputs
             * retained it grows with the depth; given back, it is about the same at
             * half the depth (the live gradients of a block or two, and a few
             * hundred bytes a block of tensor structs) */
            size_t grow_all = all.peak - all.fwd, grow_freed = freed.peak - freed.fwd, grow_half = half.peak - half.fwd;
            if (grow_freed > grow_half + (L - L / 2) * 2048 || grow_all < grow_freed + (L / 2) * R * D * sizeof(float))
                TEST_FAIL_("%s ckpt %d: backward grew the arena by %zu bytes at depth %d, %zu at depth %d, %zu with "
                           "the blocks' gradients retained", dt_dtype_name(dts[d]), ckpt, grow_freed, L, grow_half,
                           L / 2, grow_all);
            result_free(&all);
            result_free(&freed);
            result_free(&half);
        }
    free(xv);
    free(rv);
    free(wv);
}

TEST(retain_grad_null)
{
    ASSERT_STATUS(dt_ag_retain_grad(NULL), DT_ERR_NULL);
}

int main(void)
{
    RUN(arena_give_back);
    RUN(intermediate_grads_given_back);
    RUN(retain_grad_null);
    return TEST_REPORT();
}
