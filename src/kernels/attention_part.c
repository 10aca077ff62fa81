/* Attention of a block of queries against a block of keys and values, with
 * the result merged into a running one: the kernel under attention split
 * along the sequence (context parallelism; ring attention, Liu et al. 2023,
 * and PyTorch's context_parallel). A rank holds some query rows and, step by
 * step, different blocks of keys and values; each call adds one block's
 * contribution.
 *
 * Positions: query row i of the block is at global position qpos0 + i, key
 * j at kpos0 + j. Causal: key j is visible to row i iff kpos0 + j <= qpos0
 * + i; under a sliding window (causal) also iff kpos0 + j > qpos0 + i -
 * window: a row's keys start at its window (the key blocks before every
 * row's window are skipped, a row's scores start at its first key inside a
 * block, and dk/dv end at each key's last row, as the whole-sequence
 * kernel's window does). A row with no visible key in the block is left as
 * it was; a block with none at all costs nothing (the rotation's "skipped"
 * steps). A soft cap (> 0; Gemma 2's attn_logit_softcapping) replaces each
 * score s by c = cap tanh(s / cap) before the softmax, as the whole-sequence
 * window kernel does (dt__att_cap_row: the same tanh).
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
 * exp(s_ij - lse_i) are the true probabilities (exp(c_ij - lse_i) under a
 * cap), Di = dy_i . y_i, and
 *     dv_j += P_ij dy_i,  dS_ij = P_ij (dy_i . v_j - Di) (times tanh's
 *     derivative 1 - (c_ij / cap)^2 under a cap),
 *     dq_i += scale dS_ij k_j,  dk_j += scale dS_ij q_i,
 * added into dq, dk, dv: summed over the blocks, the gradient of the whole
 * attention. One task per (b, h) owns that head's columns of dq, dk, dv, so
 * the sums run in a fixed order (the same bits for any thread count).
 *
 * Both run blocked as the whole-sequence kernel does (attention.c; the
 * shared pieces in attention_impl.h), on contiguous copies of the rows they
 * read: the caller's rows are views into a packed (T, 3C) qkv, 3C floats
 * apart, which puts a head's rows on a fraction of L1's sets. A forward
 * task is a few 16-row query blocks of one head: the keys its last row
 * sees are copied once, transposed (a query row's scores against a block
 * of BK keys are one vectorised sum along the keys), the values and each
 * block's query rows contiguous; the weighted sums of values are rows_acc
 * along D. A backward task is one head: its q, dy and k rows copied once,
 * each key block transposed, dk and dv four keys a pass (rows_acc4). The
 * copies and the grouping change no result: the sums run in the same
 * order as over the rows in place.
 *
 * Rows are of H heads side by side (head h at columns [h D, (h+1) D)), with
 * a row stride per operand, so q, k and v can be views into a packed
 * (T, 3C) qkv. Dropout (dt_k_att_drop; with a window and a cap too) keeps element
 * (b, h, i, j) as the whole-sequence kernel does at the global head bh0 + b
 * Ht + h and positions qpos0 + i, kpos0 + j of a T x T mask
 * (dt__att_keep): the forward scales a block's exponentials after their sum
 * (l and lse stay undropped), the backward takes dS_ij = P_ij (d_ij dP_ij -
 * Di) and dv_j += d_ij P_ij dy_i, d_ij the kept scale 1 / (1 - p) or 0. */
#include "attention_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PART_DMAX 256

/* The block's dropout: p > 0, else none (NULL). */
typedef struct {
    float p, pscale;
    dt_rng_key key;
    int64_t gbh, T; /* gbh: the task's head in the mask */
} part_drop;

static dt_status part_args(const char *fn, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D, int64_t ldq,
                           int64_t ldk, int64_t ldv, int64_t ldy, bool causal, int64_t window, float cap,
                           int64_t qpos0, int64_t kpos0, const dt_k_att_drop *drop)
{
    if (drop && !(drop->p >= 0.0f && drop->p < 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: dropout probability %g is outside [0, 1)", fn, (double)drop->p);
    if (drop && drop->p > 0.0f &&
        (drop->Ht < H || drop->bh0 < 0 || qpos0 < 0 || kpos0 < 0 || qpos0 + Tq > drop->T || kpos0 + Tk > drop->T))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the dropout mask's heads (%lld a batch from %lld, H %lld) or "
                        "length %lld do not hold the block (positions %lld + %lld, %lld + %lld)", fn,
                        (long long)drop->Ht, (long long)drop->bh0, (long long)H, (long long)drop->T,
                        (long long)qpos0, (long long)Tq, (long long)kpos0, (long long)Tk);
    if (window < 0 || (window > 0 && !causal))
        return dt_error(DT_ERR_INVALID_ARG, "%s: sliding window %lld must be >= 0, and > 0 only with the causal mask", fn,
                        (long long)window);
    if (!(cap >= 0.0f) || !isfinite(cap))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the soft cap %g must be finite and >= 0 (0: none)", fn, (double)cap);
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

/* The visible keys of the row at position qpos: [first_key, visible), visible = min(Tk, qpos - kpos0 + 1) when
 * causal, first_key = qpos - kpos0 - window + 1 under a sliding window (> 0; causal), clamped to [0, Tk]. */
static inline int64_t visible(bool causal, int64_t qpos, int64_t kpos0, int64_t Tk)
{
    if (!causal)
        return Tk;
    int64_t n = qpos - kpos0 + 1;
    return n < 0 ? 0 : n > Tk ? Tk : n;
}

static inline int64_t first_key(int64_t window, int64_t qpos, int64_t kpos0, int64_t Tk)
{
    const int64_t f = window > 0 ? qpos - kpos0 - window + 1 : 0;
    return f < 0 ? 0 : f > Tk ? Tk : f;
}

#define PBQ 16               /* query rows per forward block */
#define BK DT__ATT_BK        /* keys per block */

/* Query rows [0, nq) at qt (D apart, positions qpos0 + r) of one head
 * against the keys kT ([D][ldT], transposed, zero past the last visible
 * key) and values vw ([Tk][D]): an online softmax over blocks of BK keys
 * (of the capped scores under cap > 0), the values' weighted sum by
 * rows_acc (along D), then the log-sum-exp merge into the running (y, lse). */
DT_CLONES static void part_fwd_rows(int vec, const float *qt, const float *kT, int64_t ldT, const float *vw,
                                    int64_t nq, int64_t Tk, int64_t D, int64_t qpos0, int64_t kpos0, bool causal,
                                    int64_t window, float cap, float scale, const part_drop *dr, float *y,
                                    int64_t ldy, float *lse)
{
    float m[PBQ], l[PBQ], s[BK];
    float acc[PBQ][PART_DMAX];
    for (int64_t r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc[r], 0, (size_t)D * sizeof(float));
    }
    const int64_t kend = visible(causal, qpos0 + nq - 1, kpos0, Tk); /* the last row sees the most */
    for (int64_t j0 = first_key(window, qpos0, kpos0, Tk) / BK * BK; j0 < kend; j0 += BK) {
        int64_t j1 = j0 + BK < kend ? j0 + BK : kend;
        for (int64_t r = 0; r < nq; r++) {
            int64_t n = visible(causal, qpos0 + r, kpos0, Tk), je = n < j1 ? n : j1;
            int64_t js = first_key(window, qpos0 + r, kpos0, Tk);
            js = js > j0 ? js : j0; /* the row's keys of the block: [js, je) */
            if (je <= js)
                continue;
            /* the scores from ja, js rounded down to row_dots' 8-key steps (each column's sum is its own: the same
               bits from any start) */
            const int64_t ja = j0 + ((js - j0) & ~(int64_t)7), ns = je - js;
            row_dots(vec, qt + r * D, kT + ja, ldT, D, je - ja, s);
            float *sr = s + (js - ja), mx = m[r];
            if (cap > 0.0f) {
                dt__att_cap_row(vec, sr, NULL, ns, scale, cap);
                for (int64_t j = 0; j < ns; j++)
                    mx = sr[j] > mx ? sr[j] : mx;
            } else {
                for (int64_t j = 0; j < ns; j++) {
                    sr[j] *= scale;
                    mx = sr[j] > mx ? sr[j] : mx;
                }
            }
            float corr = expf(m[r] - mx); /* m[r] = -inf the first time: 0 */
            float *a = acc[r];
            for (int64_t d = 0; d < D; d++)
                a[d] *= corr;
            float sum = att_exp_sum(vec, sr, ns, mx);
            for (int64_t j = 0; dr && j < ns; j++) /* dropout after the sum */
                sr[j] = dt__att_keep(dr->key, dr->p, dr->gbh, dr->T, qpos0 + r, kpos0 + js + j) ? sr[j] * dr->pscale
                                                                                                 : 0.0f;
            rows_acc(vec, a, sr, 1, vw + js * D, D, ns, D);
            l[r] = l[r] * corr + sum;
            m[r] = mx;
        }
    }
    for (int64_t r = 0; r < nq; r++) {
        if (!(l[r] > 0.0f))
            continue; /* no visible key in the block: the row stays as it was */
        float *yr = y + r * ldy, lb = m[r] + logf(l[r]), la = lse[r];
        if (la == -INFINITY) { /* nothing yet */
            float inv = 1.0f / l[r];
            for (int64_t d = 0; d < D; d++)
                yr[d] = acc[r][d] * inv;
            lse[r] = lb;
            continue;
        }
        float mx = la > lb ? la : lb;
        float ln = mx + logf(expf(la - mx) + expf(lb - mx));
        float wa = expf(la - ln), wb = expf(lb - ln) / l[r];
        for (int64_t d = 0; d < D; d++)
            yr[d] = yr[d] * wa + acc[r][d] * wb;
        lse[r] = ln;
    }
}

/* One forward task: query rows [ia, iz) of one head, in blocks of PBQ. The
 * keys the last row sees are copied once into kT (transposed, [D][ldT]),
 * their values into vw and each block's q rows into qt (w: part_fwd_scratch
 * floats), then part_fwd_rows runs on those tiles. */
static void part_fwd_task(int vec, const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                          int64_t ldv, int64_t ia, int64_t iz, int64_t Tk, int64_t D, int64_t qpos0, int64_t kpos0,
                          bool causal, int64_t window, float cap, float scale, const part_drop *dr, float *w,
                          float *y, int64_t ldy, float *lse)
{
    const int64_t nkv = visible(causal, qpos0 + iz - 1, kpos0, Tk), ldT = dt__att_key_stride(nkv);
    if (nkv == 0 || first_key(window, qpos0 + ia, kpos0, Tk) >= nkv)
        return; /* no row of the task sees a key */
    float *qt = w, *kT = qt + PBQ * D, *vw = kT + D * ldT;
    for (int64_t j = 0; j < nkv; j++) {
        for (int64_t d = 0; d < D; d++)
            kT[d * ldT + j] = k[j * ldk + d];
        memcpy(vw + j * D, v + j * ldv, (size_t)D * sizeof(float));
    }
    for (int64_t d = 0; d < D; d++)
        for (int64_t j = nkv; j < ldT; j++)
            kT[d * ldT + j] = 0.0f;
    for (int64_t i0 = ia; i0 < iz; i0 += PBQ) {
        const int64_t nq = i0 + PBQ < iz ? PBQ : iz - i0;
        for (int64_t r = 0; r < nq; r++)
            memcpy(qt + r * D, q + (i0 + r) * ldq, (size_t)D * sizeof(float));
        part_fwd_rows(vec, qt, kT, ldT, vw, nq, Tk, D, qpos0 + i0, kpos0, causal, window, cap, scale, dr,
                      y + i0 * ldy, ldy, lse + i0);
    }
}

/* A forward task's scratch in floats: a block's q rows, the keys
 * (transposed, at dt__att_key_stride(Tk) <= Tk + 31) and the values. */
static size_t part_fwd_scratch(int64_t Tk, int64_t D)
{
    return (size_t)((PBQ + 2 * Tk + 31) * D);
}

/* The dropout of head h of batch b of a block (p 0: none). */
static part_drop part_drop_of(const dt_k_att_drop *drop, int64_t b, int64_t h)
{
    part_drop d = {0};
    if (drop && drop->p > 0.0f)
        d = (part_drop){.p = drop->p, .pscale = 1.0f / (1.0f - drop->p), .key = drop->key,
                        .gbh = drop->bh0 + b * drop->Ht + h, .T = drop->T};
    return d;
}

dt_status dt_k_attention_part_fwd(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                                  int64_t ldv, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D,
                                  int64_t qpos0, int64_t kpos0, bool causal, int64_t window, float cap,
                                  const dt_k_att_drop *drop, float *y, int64_t ldy, float *lse, int64_t ldlse)
{
    const char *fn = "dt_k_attention_part_fwd";
    dt_status st = part_args(fn, B, Tq, Tk, H, D, ldq, ldk, ldv, ldy, causal, window, cap, qpos0, kpos0, drop);
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
    if (B == 0 || Tq == 0 || Tk == 0 || (causal && kpos0 > qpos0 + Tq - 1) || first_key(window, qpos0, kpos0, Tk) >= Tk)
        return DT_OK; /* nothing visible: every key after every query, or before every row's window */
    const float scale = 1.0f / sqrtf((float)D);
    const int64_t nqb = (Tq + PBQ - 1) / PBQ;
    int nt = dt__threads_for(B * Tq * Tk * H * D);
    const int64_t g = dt__att_group(nt, B * H, nqb), ngr = (nqb + g - 1) / g, ntask = B * H * ngr;
    const size_t scratch = part_fwd_scratch(Tk, D) * sizeof(float);
    bool nomem = false;
    int vec = dt__vec_level();
#pragma omp parallel num_threads(nt)
    {
        float *w = dt_alloc(scratch);
        if (!w) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            int64_t bh = t / ngr, b = bh / H, h = bh % H, q0 = (t % ngr) * g, q1 = q0 + g < nqb ? q0 + g : nqb;
            int64_t ia = q0 * PBQ, iz = q1 * PBQ < Tq ? q1 * PBQ : Tq;
            const part_drop dr = part_drop_of(drop, b, h);
            if (w)
                part_fwd_task(vec, q + b * Tq * ldq + h * D, ldq, k + b * Tk * ldk + h * D, ldk,
                              v + b * Tk * ldv + h * D, ldv, ia, iz, Tk, D, qpos0, kpos0, causal, window, cap, scale,
                              dr.p > 0.0f ? &dr : NULL, w, y + b * Tq * ldy + h * D, ldy, lse + bh * ldlse);
        }
        dt_free(w);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: no memory for the keys (%zu bytes a thread)", fn, scratch);
    return DT_OK;
}

/* One backward task: head h of batch b, whose columns of dq, dk and dv it
 * owns (so the sums run in a fixed order). Its q, dy and k rows are copied
 * once into qw, gw, kw ([Tq][D], [Tq][D], [Tk][D]) and each row's Di into
 * dim. Per key block: its keys and values transposed (kt, vt), every row
 * that sees a key of it gets the block's P and dS (pdm, dsm: [Tq, BK]) and
 * its dq, then each key's dk and dv are summed over the rows that see it,
 * in row order: four keys a pass (rows_acc4, the bits of one key at a time)
 * over the rows all four see, the rows before those one key at a time
 * first. w: part_bwd_scratch floats. */
DT_CLONES static void part_bwd_head(int vec, const float *restrict q, int64_t ldq, const float *restrict k,
                                    int64_t ldk, const float *restrict v, int64_t ldv, const float *restrict y,
                                    int64_t ldy, const float *restrict lse, const float *restrict dy, int64_t lddy,
                                    int64_t Tq, int64_t Tk, int64_t D, int64_t qpos0, int64_t kpos0, bool causal,
                                    int64_t window, float cap, float scale, const part_drop *dr, float *w,
                                    float *restrict dq, int64_t lddq, float *restrict dk, int64_t lddk,
                                    float *restrict dv, int64_t lddv)
{
    float *kt = w, *vt = kt + PART_DMAX * BK, *pdm = vt + PART_DMAX * BK, *dsm = pdm + Tq * BK;
    float *qw = dsm + Tq * BK, *gw = qw + Tq * D, *kw = gw + Tq * D, *dim = kw + Tk * D;
    float sc[BK], dp[BK], th[BK];
    for (int64_t i = 0; i < Tq; i++) {
        memcpy(qw + i * D, q + i * ldq, (size_t)D * sizeof(float));
        memcpy(gw + i * D, dy + i * lddy, (size_t)D * sizeof(float));
        dim[i] = dot_seq(gw + i * D, y + i * ldy, D);
    }
    for (int64_t j = 0; j < Tk; j++)
        memcpy(kw + j * D, k + j * ldk, (size_t)D * sizeof(float));
    for (int64_t j0 = 0; j0 < Tk; j0 += BK) {
        int64_t j1 = j0 + BK < Tk ? j0 + BK : Tk;
        /* the rows [i0, iend) see a key of the block: from the first that sees key j0 (every row without the
           mask) to the last that sees key j1 - 1 under a window */
        int64_t i0 = causal ? kpos0 + j0 - qpos0 : 0, iend = kpos0 + j1 - 1 + window - qpos0;
        i0 = i0 < 0 ? 0 : i0;
        iend = window > 0 && iend < Tq ? iend : Tq;
        if (i0 >= Tq)
            break; /* later keys are later still */
        if (iend <= i0)
            continue; /* before every row's window */
        block_t(kw + j0 * D, D, j1 - j0, D, kt);
        block_t(v + j0 * ldv, ldv, j1 - j0, D, vt);
        for (int64_t i = i0; i < iend; i++) {
            int64_t n = visible(causal, qpos0 + i, kpos0, Tk), je = n < j1 ? n : j1;
            int64_t js = first_key(window, qpos0 + i, kpos0, Tk);
            js = js > j0 ? js : j0; /* the row's keys of the block: [js, je), at their columns js - j0 */
            if (je <= js)
                continue;
            /* from ja, js rounded down to row_dots' 8-key steps (the same bits from any start) */
            const int64_t ja = j0 + ((js - j0) & ~(int64_t)7), ne = je - js;
            float *pd = pdm + (i - i0) * BK + (js - j0), *ds = dsm + (i - i0) * BK + (js - j0);
            float L = lse[i], Di = dim[i];
            row_dots(vec, qw + i * D, kt + (ja - j0), BK, D, je - ja, sc);
            row_dots(vec, gw + i * D, vt + (ja - j0), BK, D, je - ja, dp);
            if (cap > 0.0f) /* P from the capped scores c (times 1: the same bits), dS through tanh' = 1 - tanh^2 */
                dt__att_cap_row(vec, sc + (js - ja), th, ne, scale, cap);
            if (dr) { /* dS = P (d dP - Di) (times tanh' with a cap), dv's weights d P: d the kept scale or 0 */
                att_probs(vec, sc + (js - ja), ne, cap > 0.0f ? 1.0f : scale, L, pd);
                for (int64_t jj = 0; jj < ne; jj++) {
                    const bool kp = dt__att_keep(dr->key, dr->p, dr->gbh, dr->T, qpos0 + i, kpos0 + js + jj);
                    const float P = pd[jj];
                    pd[jj] = kp ? P * dr->pscale : 0.0f;
                    ds[jj] = P * ((kp ? dp[js - ja + jj] * dr->pscale : 0.0f) - Di) * scale *
                             (cap > 0.0f ? 1.0f - th[jj] * th[jj] : 1.0f);
                }
            } else if (cap > 0.0f) {
                att_probs(vec, sc + (js - ja), ne, 1.0f, L, pd);
                for (int64_t jj = 0; jj < ne; jj++)
                    ds[jj] = pd[jj] * (dp[js - ja + jj] - Di) * (1.0f - th[jj] * th[jj]) * scale;
            } else {
                att_probs(vec, sc + (js - ja), ne, scale, L, pd);
                for (int64_t jj = 0; jj < ne; jj++)
                    ds[jj] = pd[jj] * (dp[js - ja + jj] - Di) * scale;
            }
            rows_acc(vec, dq + i * lddq, ds, 1, kw + js * D, D, ne, D);
        }
        dkdv_keys(vec, dk, lddk, dv, lddv, dsm, pdm, qw, D, gw, D, Tq, i0, j0, j1, causal, kpos0 - qpos0, window, D);
    }
}

/* A backward task's scratch in floats: two transposed blocks, the block's
 * P and dS, the copied q, dy and k rows, and Di. */
static size_t part_bwd_scratch(int64_t Tq, int64_t Tk, int64_t D)
{
    return (size_t)(2 * PART_DMAX * BK + 2 * Tq * BK + 2 * Tq * D + Tk * D + Tq);
}

dt_status dt_k_attention_part_bwd(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                                  int64_t ldv, const float *y, int64_t ldy, const float *lse, int64_t ldlse,
                                  const float *dy, int64_t lddy, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                                  int64_t D, int64_t qpos0, int64_t kpos0, bool causal, int64_t window, float cap,
                                  const dt_k_att_drop *drop, float *dq, int64_t lddq, float *dk, int64_t lddk,
                                  float *dv, int64_t lddv)
{
    const char *fn = "dt_k_attention_part_bwd";
    dt_status st = part_args(fn, B, Tq, Tk, H, D, ldq, ldk, ldv, ldy, causal, window, cap, qpos0, kpos0, drop);
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
    if (B == 0 || Tq == 0 || Tk == 0 || (causal && kpos0 > qpos0 + Tq - 1) || first_key(window, qpos0, kpos0, Tk) >= Tk)
        return DT_OK;
    const float scale = 1.0f / sqrtf((float)D);
    int nt = dt__threads_for(2 * B * Tq * Tk * H * D);
    bool nomem = false;
    int vec = dt__vec_level();
    const size_t scratch = part_bwd_scratch(Tq, Tk, D) * sizeof(float);
#pragma omp parallel num_threads(nt)
    {
        float *kt = dt_alloc(scratch);
        if (!kt) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; bh++) {
            int64_t b = bh / H, h = bh % H, o = h * D;
            const part_drop dr = part_drop_of(drop, b, h);
            if (kt)
                part_bwd_head(vec, q + b * Tq * ldq + o, ldq, k + b * Tk * ldk + o, ldk, v + b * Tk * ldv + o, ldv,
                              y + b * Tq * ldy + o, ldy, lse + bh * ldlse, dy + b * Tq * lddy + o, lddy, Tq, Tk, D,
                              qpos0, kpos0, causal, window, cap, scale, dr.p > 0.0f ? &dr : NULL, kt,
                              dq + b * Tq * lddq + o, lddq,
                              dk + b * Tk * lddk + o, lddk, dv + b * Tk * lddv + o, lddv);
        }
        dt_free(kt);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: no memory for the key blocks (%zu bytes a thread)", fn, scratch);
    return DT_OK;
}
