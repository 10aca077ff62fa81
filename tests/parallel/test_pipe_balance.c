/* Cutting a model into pipeline stages by compute (pipeline.h,
 * dt_model_pipe_units, dt_pipe_unit_costs, dt_pipe_balance): the GPT's
 * units are its embeddings, each block's two halves, ln_f and the tied
 * head, whose cost counts the head's GEMM (V x C per token) though the
 * parameter is stored as the embeddings' wte; balanced by compute the cut
 * moves blocks to the first stage (by parameter count the embeddings'
 * V x C elements, which cost no GEMM, push them to the last); the
 * chosen cut is the best one by exhaustive search: the busiest rank
 * (interleaved: the sum of its v stages, not the largest stage) as small
 * as possible, then the largest stage; and bad input is refused. */
#include "test.h"

#include "dtrain/dtrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The objective of a cut: busiest rank, then largest stage. */
static void objective(const double *c, int n, int p, int v, const int *starts, double *R, double *M)
{
    double sums[64] = {0};
    *R = 0, *M = 0;
    for (int s = 0; s < p * v; s++) {
        int hi = s + 1 < p * v ? starts[s + 1] : n;
        double w = 0;
        for (int i = starts[s]; i < hi; i++)
            w += c[i];
        sums[s % p] += w;
        *M = w > *M ? w : *M;
    }
    for (int r = 0; r < p; r++)
        *R = sums[r] > *R ? sums[r] : *R;
}

/* Every cut of n units into S stages, the best objective. */
static void brute(const double *c, int n, int p, int v, int s, int *starts, double *bR, double *bM)
{
    int S = p * v;
    if (s == S) {
        double R, M;
        objective(c, n, p, v, starts, &R, &M);
        if (R < *bR || (R == *bR && M < *bM))
            *bR = R, *bM = M;
        return;
    }
    for (int j = starts[s - 1] + 1; j <= n - (S - s); j++) {
        starts[s] = j;
        brute(c, n, p, v, s + 1, starts, bR, bM);
    }
}

static double stage_cost(const double *c, int n, const int *starts, int S, int s)
{
    double w = 0;
    for (int i = starts[s]; i < (s + 1 < S ? starts[s + 1] : n); i++)
        w += c[i];
    return w;
}

TEST(gpt_units_and_costs)
{
    dt_model_config mc = dt_model_config_default();
    mc.n_layer = 6, mc.n_head = 4, mc.n_embd = 64, mc.block_size = 16, mc.vocab_size = 512, mc.seq = 16;
    dt_model *m;
    ASSERT(dt_model_create("gpt-micro", 1, &mc, &m, NULL) == DT_OK);
    dt_pipe_unit *u;
    int n;
    ASSERT(dt_model_pipe_units(m, &u, &n) == DT_OK);
    ASSERT_EQ_INT(n, 2 * 6 + 3);
    ASSERT(!strcmp(u[0].name, "transformer.wte+wpe"));
    ASSERT(!strcmp(u[1].name, "transformer.h.0.ln_1+attn"));
    ASSERT(!strcmp(u[2].name, "transformer.h.0.ln_2+mlp"));
    ASSERT(!strcmp(u[n - 1].name, "lm_head"));
    double C = 64, T = 16, V = 512, cc[32], cp[32];
    /* attention half: c_attn + c_proj weights (4 C^2) + T C + element-wise; MLP half 8 C^2 + ... */
    ASSERT_NEAR(u[1].cost, 4 * C * C + T * C + 8 * C, 0, 1e-12);
    ASSERT_NEAR(u[2].cost, 8 * C * C + 8 * C + 4 * C, 0, 1e-12);
    ASSERT_NEAR(u[n - 1].cost, V * C + 4 * V, 0, 1e-12);
    ASSERT(u[0].cost < 0.01 * u[1].cost);
    ASSERT(dt_pipe_unit_costs(m, u, n, DT_PIPE_BY_COMPUTE, cc) == DT_OK);
    ASSERT(dt_pipe_unit_costs(m, u, n, DT_PIPE_BY_PARAMS, cp) == DT_OK);
    ASSERT_NEAR(cp[0], V * C + T * C, 0, 0); /* wte + wpe */
    ASSERT_NEAR(cp[n - 1], V * C, 0, 0);     /* the tied entry counts in each unit naming it */
    ASSERT_NEAR(cc[n - 1], u[n - 1].cost, 0, 0);

    /* p = 2: by compute the first stage takes the blocks the head's GEMM
     * costs; by parameters the embeddings' elements push them the other way */
    int sc[2], sp[2], tmp[2] = {0};
    ASSERT(dt_pipe_balance(cc, n, 2, 1, sc) == DT_OK);
    ASSERT(dt_pipe_balance(cp, n, 2, 1, sp) == DT_OK);
    ASSERT_EQ_INT(sc[0], 0);
    ASSERT(sc[1] > sp[1]);
    double R, M, bR = INFINITY, bM = INFINITY;
    objective(cc, n, 2, 1, sc, &R, &M);
    brute(cc, n, 2, 1, 1, tmp, &bR, &bM);
    ASSERT_NEAR(R, bR, 0, 0);
    /* the stages by compute are closer than the parameter cut's */
    double a0 = stage_cost(cc, n, sc, 2, 0), a1 = stage_cost(cc, n, sc, 2, 1);
    double b0 = stage_cost(cc, n, sp, 2, 0), b1 = stage_cost(cc, n, sp, 2, 1);
    ASSERT(fmax(a0, a1) < fmax(b0, b1));
    ASSERT(fabs(a0 - a1) <= u[2].cost); /* within one half block */

    /* interleaved p = 2, v = 2: balanced per rank, the best of every cut */
    int si[4], t4[4] = {0};
    ASSERT(dt_pipe_balance(cc, n, 2, 2, si) == DT_OK);
    objective(cc, n, 2, 2, si, &R, &M);
    bR = bM = INFINITY;
    brute(cc, n, 2, 2, 1, t4, &bR, &bM);
    ASSERT_NEAR(R, bR, 0, 0);
    ASSERT_NEAR(M, bM, 0, 0);
    dt_free(u);
    dt_model_free(m);
}

/* A block with activation checkpointing stays one unit (its whole forward
 * runs the checkpointing). */
TEST(hooked_block_is_one_unit)
{
    dt_model_config mc = dt_model_config_default();
    mc.n_layer = 2, mc.n_head = 2, mc.n_embd = 16, mc.block_size = 8, mc.vocab_size = 32, mc.seq = 8;
    dt_model *m;
    ASSERT(dt_model_create("gpt-micro", 1, &mc, &m, NULL) == DT_OK);
    dt_act_ckpt_params ap = dt_act_ckpt_params_default();
    int nck = 0;
    ASSERT(dt_model_checkpoint_type(m, "GPT2Block", &ap, &nck) == DT_OK);
    ASSERT_EQ_INT(nck, 2);
    dt_pipe_unit *u;
    int n;
    ASSERT(dt_model_pipe_units(m, &u, &n) == DT_OK);
    ASSERT_EQ_INT(n, 2 + 3);
    ASSERT(!strcmp(u[1].name, "transformer.h.0"));
    ASSERT_NEAR(u[1].cost, 12 * 16 * 16 + 8 * 16 + 8 * 16 + 8 * 16 + 4 * 16, 0, 1e-12);
    dt_free(u);
    dt_model_free(m);
}

/* Random costs, every p, v with a small n: the same objective as the
 * exhaustive search (per rank for v > 1, not per stage). */
TEST(balance_is_optimal)
{
    unsigned x = 12345;
    int cases = 0, per_rank_differs = 0;
    for (int t = 0; t < 300; t++) {
        int p = 1 + t % 3, v = 1 + (t / 3) % 3, S = p * v;
        int n = S + (int)(t % 7);
        double c[32];
        for (int i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            c[i] = (double)((x >> 16) % 100);
        }
        int st[16], tmp[16] = {0};
        ASSERT(dt_pipe_balance(c, n, p, v, st) == DT_OK);
        ASSERT_EQ_INT(st[0], 0);
        for (int s = 1; s < S; s++)
            ASSERT(st[s] > st[s - 1] && st[s] < n);
        double R, M, bR = INFINITY, bM = INFINITY;
        objective(c, n, p, v, st, &R, &M);
        if (S > 1)
            brute(c, n, p, v, 1, tmp, &bR, &bM);
        else
            bR = R, bM = M;
        if (R != bR || M != bM)
            TEST_FAIL_("p %d v %d n %d: rank %g stage %g, best %g %g", p, v, n, R, M, bR, bM);
        /* the per-stage optimum would give another busiest rank sometimes */
        if (v > 1) {
            int ss[16];
            ASSERT(dt_pipe_balance(c, n, S, 1, ss) == DT_OK); /* S ranks of one stage: per stage */
            double R2, M2;
            objective(c, n, p, v, ss, &R2, &M2);
            per_rank_differs += R2 > R;
        }
        cases++;
    }
    ASSERT_EQ_INT(cases, 300);
    ASSERT(per_rank_differs > 0);
}

TEST(bad_input_is_refused)
{
    double c[4] = {1, 2, 3, 4}, bad[4] = {1, -1, 3, 4}, nan4[4] = {1, NAN, 3, 4};
    int st[8];
    ASSERT(dt_pipe_balance(c, 4, 5, 1, st) == DT_ERR_INVALID_ARG);
    ASSERT(strstr(dt_last_error(), "4 units cannot make 5 stages"));
    ASSERT(dt_pipe_balance(c, 4, 2, 3, st) == DT_ERR_INVALID_ARG);
    ASSERT(dt_pipe_balance(bad, 4, 2, 1, st) == DT_ERR_INVALID_ARG);
    ASSERT(strstr(dt_last_error(), "unit 1"));
    ASSERT(dt_pipe_balance(nan4, 4, 2, 1, st) == DT_ERR_INVALID_ARG);
    ASSERT(dt_pipe_balance(c, 4, 0, 1, st) == DT_ERR_INVALID_ARG);
    ASSERT(dt_pipe_balance(NULL, 4, 2, 1, st) == DT_ERR_NULL);
    ASSERT(dt_pipe_balance(c, 4, 2, 1, st) == DT_OK);
    ASSERT_EQ_INT(st[1], 3); /* 1 + 2 + 3 | 4 */
}

int main(void)
{
    RUN(gpt_units_and_costs);
    RUN(hooked_block_is_one_unit);
    RUN(balance_is_optimal);
    RUN(bad_input_is_refused);
    return TEST_REPORT();
}
