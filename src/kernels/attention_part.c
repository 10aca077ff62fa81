/* Attention of a block of queries against a block of keys and values, with
 * the result merged into a running one: the kernel under attention split
 * along the sequence (context parallelism; ring attention, Liu et al. 2023,
 * and PyTorch's context_parallel). A rank holds some query rows and, step by
 * step, different blocks of keys and values; each call adds one block's
 * contribution.
 *
 * Positions: query row i of the block is at global position qpos0 + i, key
 * j at kpos0 + j. Causal: key j is visible to row i iff kpos0 + j <= qpos0
 * + i. A row with no visible key in the block is left as it was; a block
 * with none at all costs nothing (the rotation's "skipped" steps).
 *
 * Forward, per (b, h, query row): the block's scores s_j = scale q . k_j
 * over the visible keys give the block's m = max s_j, l = sum exp(s_j - m),
 * o = sum exp(s_j - m) v_j / l and lse_b = m + log l; the running (y, lse)
 * becomes
 *     lse' = max(lse, lse_b) + log(exp(lse - max) + exp(lse_b - max)),
 *     y'   = y exp(lse - lse') + o exp(lse_b - lse'),
 * which is the log-sum-exp rule of the ring (lse = -inf: nothing yet, y'
 * = o). After every block has been added, y and lse are exactly softmax
 * attention over all of them (up to rounding), whatever the order.
 *
 * Backward, with the FINAL y and lse (those over all blocks): P_ij =
 * exp(s_ij - lse_i) are the true probabilities, Di = dy_i . y_i, and
 *     dv_j += P_ij dy_i,  dS_ij = P_ij (dy_i . v_j - Di),
 *     dq_i += scale dS_ij k_j,  dk_j += scale dS_ij q_i,
 * added into dq, dk, dv: summed over the blocks, the gradient of the whole
 * attention. One task per (b, h) owns that head's columns of dq, dk, dv, so
 * the sums run in a fixed order (the same bits for any thread count).
 *
 * Rows are of H heads side by side (head h at columns [h D, (h+1) D)), with
 * a row stride per operand, so q, k and v can be views into a packed
 * (T, 3C) qkv. No dropout (the ring's steps would need the full layer's
 * mask indices; callers refuse p > 0 by name). */
#include "kernels_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PART_DMAX 256

static dt_status part_args(const char *fn, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D, int64_t ldq,
                           int64_t ldk, int64_t ldv, int64_t ldy)
{
    DT__CHECK_N(fn, B);
    DT__CHECK_N(fn, Tq);
    DT__CHECK_N(fn, Tk);
    if (H <= 0 || D <= 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: heads (%lld) and head size (%lld) must be > 0", fn, (long long)H,
                        (long long)D);
    if (D > PART_DMAX)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: head size %lld is above the kernel's limit %d", fn, (long long)D,
                        PART_DMAX);
    int64_t C = H * D;
    if (ldq < C || ldk < C || ldv < C || ldy < C)
        return dt_error(DT_ERR_INVALID_ARG, "%s: a row stride (q %lld, k %lld, v %lld, y %lld) is below H * D = %lld",
                        fn, (long long)ldq, (long long)ldk, (long long)ldv, (long long)ldy, (long long)C);
    return DT_OK;
}

/* The visible keys of row i: [0, n) with n = min(Tk, qpos + i - kpos0 + 1) when causal. */
static inline int64_t visible(bool causal, int64_t qpos, int64_t kpos0, int64_t Tk)
{
    if (!causal)
        return Tk;
    int64_t n = qpos - kpos0 + 1;
    return n < 0 ? 0 : n > Tk ? Tk : n;
}

static inline float dotf(const float *restrict a, const float *restrict b, int64_t n)
{
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++)
        s += a[d] * b[d];
    return s;
}

DT_CLONES static void part_fwd_row(const float *restrict q, const float *restrict k, const float *restrict v,
                                   int64_t ldk, int64_t ldv, int64_t n, int64_t D, float scale, float *restrict s,
                                   float *restrict y, float *restrict lse)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        s[j] = scale * dotf(q, k + j * ldk, D);
        m = s[j] > m ? s[j] : m;
    }
    float l = 0.0f, o[PART_DMAX];
    for (int64_t d = 0; d < D; d++)
        o[d] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float e = expf(s[j] - m);
        l += e;
        const float *vr = v + j * ldv;
        for (int64_t d = 0; d < D; d++)
            o[d] += e * vr[d];
    }
    float lb = m + logf(l), la = *lse;
    if (la == -INFINITY) { /* nothing yet */
        float inv = 1.0f / l;
        for (int64_t d = 0; d < D; d++)
            y[d] = o[d] * inv;
        *lse = lb;
        return;
    }
    float mx = la > lb ? la : lb;
    float ln = mx + logf(expf(la - mx) + expf(lb - mx));
    float wa = expf(la - ln), wb = expf(lb - ln) / l;
    for (int64_t d = 0; d < D; d++)
        y[d] = y[d] * wa + o[d] * wb;
    *lse = ln;
}

dt_status dt_k_attention_part_fwd(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                                  int64_t ldv, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D,
                                  int64_t qpos0, int64_t kpos0, bool causal, float *y, int64_t ldy, float *lse,
                                  int64_t ldlse)
{
    const char *fn = "dt_k_attention_part_fwd";
    dt_status st = part_args(fn, B, Tq, Tk, H, D, ldq, ldk, ldv, ldy);
    if (st < 0)
        return st;
    if (ldlse < Tq)
        return dt_error(DT_ERR_INVALID_ARG, "%s: lse's head stride %lld is below Tq = %lld", fn, (long long)ldlse,
                        (long long)Tq);
    DT__CHECK_PTR(fn, q, B * Tq);
    DT__CHECK_PTR(fn, k, B * Tk);
    DT__CHECK_PTR(fn, v, B * Tk);
    DT__CHECK_PTR(fn, y, B * Tq);
    DT__CHECK_PTR(fn, lse, B * Tq);
    if (B == 0 || Tq == 0 || Tk == 0 || (causal && kpos0 > qpos0 + Tq - 1))
        return DT_OK; /* nothing visible: every key after every query */
    const float scale = 1.0f / sqrtf((float)D);
    int nt = dt__threads_for(B * Tq * Tk * H * D);
    bool nomem = false;
#pragma omp parallel num_threads(nt)
    {
        float *s = malloc((size_t)Tk * sizeof *s);
        if (!s) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(static) collapse(2)
        for (int64_t bh = 0; bh < B * H; bh++)
            for (int64_t i = 0; i < Tq; i++) {
                int64_t b = bh / H, h = bh % H;
                int64_t n = visible(causal, qpos0 + i, kpos0, Tk);
                if (!s || n == 0)
                    continue;
                part_fwd_row(q + (b * Tq + i) * ldq + h * D, k + b * Tk * ldk + h * D, v + b * Tk * ldv + h * D,
                             ldk, ldv, n, D, scale, s, y + (b * Tq + i) * ldy + h * D, lse + bh * ldlse + i);
            }
        free(s);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: no memory for a row of %lld scores", fn, (long long)Tk);
    return DT_OK;
}

DT_CLONES static void part_bwd_head(const float *restrict q, int64_t ldq, const float *restrict k, int64_t ldk,
                                    const float *restrict v, int64_t ldv, const float *restrict y, int64_t ldy,
                                    const float *restrict lse, const float *restrict dy, int64_t lddy, int64_t Tq,
                                    int64_t Tk, int64_t D, int64_t qpos0, int64_t kpos0, bool causal, float scale,
                                    float *restrict dq, int64_t lddq, float *restrict dk, int64_t lddk,
                                    float *restrict dv, int64_t lddv)
{
    for (int64_t i = 0; i < Tq; i++) {
        int64_t n = visible(causal, qpos0 + i, kpos0, Tk);
        if (n == 0)
            continue;
        const float *qi = q + i * ldq, *dyi = dy + i * lddy;
        float Di = dotf(dyi, y + i * ldy, D), li = lse[i];
        float *dqi = dq + i * lddq;
        for (int64_t j = 0; j < n; j++) {
            float P = expf(scale * dotf(qi, k + j * ldk, D) - li);
            float dS = P * (dotf(dyi, v + j * ldv, D) - Di) * scale;
            float *dvj = dv + j * lddv, *dkj = dk + j * lddk;
            const float *kj = k + j * ldk;
            for (int64_t d = 0; d < D; d++) {
                dvj[d] += P * dyi[d];
                dqi[d] += dS * kj[d];
                dkj[d] += dS * qi[d];
            }
        }
    }
}

dt_status dt_k_attention_part_bwd(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                                  int64_t ldv, const float *y, int64_t ldy, const float *lse, int64_t ldlse,
                                  const float *dy, int64_t lddy, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D,
                                  int64_t qpos0, int64_t kpos0, bool causal, float *dq, int64_t lddq, float *dk,
                                  int64_t lddk, float *dv, int64_t lddv)
{
    const char *fn = "dt_k_attention_part_bwd";
    dt_status st = part_args(fn, B, Tq, Tk, H, D, ldq, ldk, ldv, ldy);
    if (st < 0)
        return st;
    int64_t C = H * D;
    if (lddy < C || lddq < C || lddk < C || lddv < C)
        return dt_error(DT_ERR_INVALID_ARG, "%s: a gradient's row stride is below H * D = %lld", fn, (long long)C);
    if (ldlse < Tq)
        return dt_error(DT_ERR_INVALID_ARG, "%s: lse's head stride %lld is below Tq = %lld", fn, (long long)ldlse,
                        (long long)Tq);
    DT__CHECK_PTR(fn, q, B * Tq);
    DT__CHECK_PTR(fn, k, B * Tk);
    DT__CHECK_PTR(fn, v, B * Tk);
    DT__CHECK_PTR(fn, y, B * Tq);
    DT__CHECK_PTR(fn, lse, B * Tq);
    DT__CHECK_PTR(fn, dy, B * Tq);
    DT__CHECK_PTR(fn, dq, B * Tq);
    DT__CHECK_PTR(fn, dk, B * Tk);
    DT__CHECK_PTR(fn, dv, B * Tk);
    if (B == 0 || Tq == 0 || Tk == 0 || (causal && kpos0 > qpos0 + Tq - 1))
        return DT_OK;
    const float scale = 1.0f / sqrtf((float)D);
    int nt = dt__threads_for(2 * B * Tq * Tk * H * D);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++) {
        int64_t b = bh / H, h = bh % H, o = h * D;
        part_bwd_head(q + b * Tq * ldq + o, ldq, k + b * Tk * ldk + o, ldk, v + b * Tk * ldv + o, ldv,
                      y + b * Tq * ldy + o, ldy, lse + bh * ldlse, dy + b * Tq * lddy + o, lddy, Tq, Tk, D, qpos0,
                      kpos0, causal, scale, dq + b * Tq * lddq + o, lddq, dk + b * Tk * lddk + o, lddk,
                      dv + b * Tk * lddv + o, lddv);
    }
    return DT_OK;
}
