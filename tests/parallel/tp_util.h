/* tests/parallel/tp_util.h — helpers of the tensor-parallel tests: data,
 * an SGD trainer for a zoo model, and the comparison of a tensor-parallel
 * model's slices with the single-process model's tensors. */
#ifndef DT_TEST_TP_UTIL_H
#define DT_TEST_TP_UTIL_H

#include "comm/harness.h"
#include "dtrain/models.h"
#include "dtrain/tp.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void fill(float *x, int64_t n, uint64_t stream, uint64_t first)
{
    dt_rng_fill_uniform(dt_rng_key_make(77, DT_RNG_USER, stream, 0), first, x, (size_t)n, -1.0f, 1.0f);
}

/* ---- comparing a tensor-parallel model with the single-process one ------------------------- */

/* max |tp slice - full| over every parameter of tp (its slice of the entry
 * of the same name in full); *worst names the entry. Exact slicing as
 * dt_tp_init_from (2-d and 1-d, chunks, padding zero). */
static inline double slice_diff(const dt_model *tp, const dt_model *full, int r, const double *tol, char *worst,
                         double *excess)
{
    double mx = 0;
    *excess = 0;
    for (size_t i = 0; i < dt_model_num_entries(tp); i++) {
        dt_param_info p, f;
        dt_model_entry(tp, i, &p);
        if (p.is_buffer || p.tied_to >= 0)
            continue;
        int64_t j = dt_model_find_entry(full, p.name);
        if (j < 0)
            return INFINITY;
        dt_model_entry(full, (size_t)j, &f);
        const int d = p.tp_dim - 1, c = p.tp_chunks > 1 ? p.tp_chunks : 1;
        int64_t inner = 1;
        for (int k = d + 1; k < p.ndim; k++)
            inner *= p.shape[k];
        const int64_t ld = d >= 0 ? p.shape[d] : 1, fd = d >= 0 ? f.shape[d] : 1;
        for (int64_t e = 0; e < (int64_t)p.numel; e++) {
            double v = dt_tensor_get(p.tensor, e), want;
            if (d < 0) {
                want = dt_tensor_get(f.tensor, e);
            } else {
                int64_t o = e / (ld * inner), k = e / inner % ld, in = e % inner;
                int64_t B = fd / c, Lb = ld / c, w = r * Lb + k % Lb;
                want = w >= B ? 0.0 : dt_tensor_get(f.tensor, (o * fd + k / Lb * B + w) * inner + in);
            }
            double diff = fabs(v - want);
            if (diff > mx) {
                mx = diff;
                snprintf(worst, 128, "%s[%lld]: %.9g vs %.9g", p.name, (long long)e, v, want);
            }
            if (tol && diff > tol[0] * fabs(want) + tol[1] && diff > *excess)
                *excess = diff;
        }
    }
    return mx;
}

static inline dt_status make_sgd(dt_model *m, const dt_model_desc *d, double lr, dt_trainer **tr)
{
    dt_strategy *s;
    dt_status st = dt_strategy_none_init(&s);
    if (st < 0)
        return st;
    dt_trainer_params p = dt_trainer_params_default();
    p.sgd.lr = lr;
    p.loss_fn = dt_model_desc_loss_fn;
    p.loss_ud = (void *)d;
    return dt_trainer_init(m, s, &p, tr);
}

/* The tiny GPT of the tests: 2 layers, 4 heads, width 32, 16 positions,
 * vocabulary 50 (padded on 4 ranks). */
enum { G_B = 2, G_T = 8, G_V = 50 };
static inline void gpt_config(dt_model_config *c)
{
    *c = dt_model_config_default();
    c->n_layer = 2, c->n_head = 4, c->n_embd = 32, c->block_size = 16, c->vocab_size = G_V, c->seq = G_T;
}

#endif
