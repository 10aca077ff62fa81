/* Batch norm (train / eval / backward) and layer norm (forward / backward).
 *
 * Batch norm works per channel: one task per channel sums its N*HW elements
 * in double, in index order, so statistics and the gamma/beta gradients do
 * not depend on the thread count. The running variance uses the unbiased
 * batch variance, as PyTorch does.
 * Layer norm works per row for the forward and dx; dgamma/dbeta are column
 * sums over rows, computed with threads splitting COLUMNS (each column sums
 * rows in order) for the same reason. */
#include "kernels_impl.h"

#include <math.h>
#include <string.h>

static dt_status bn_check(const char *fn, const float *x, const float *y, int64_t N, int64_t C, int64_t HW)
{
    DT__CHECK_N(fn, N);
    DT__CHECK_N(fn, C);
    DT__CHECK_N(fn, HW);
    DT__CHECK_PTR(fn, x, N * C * HW);
    DT__CHECK_PTR(fn, y, N * C * HW);
    return DT_OK;
}

/* Row kernels of batch norm, cloned for AVX2 (8 lanes) and the baseline
 * (4 lanes) and picked at load time. The float row sums depend on the lane
 * count, so they are reproducible per machine, not across ISAs. */

DT_CLONES static void row_moments(const float *restrict xp, int64_t n, float k, float *s1, float *s2)
{
    float r1 = 0.0f, r2 = 0.0f;
#pragma omp simd reduction(+ : r1, r2)
    for (int64_t i = 0; i < n; i++) {
        float d = xp[i] - k;
        r1 += d;
        r2 += d * d;
    }
    *s1 = r1;
    *s2 = r2;
}

DT_CLONES static void row_affine(const float *restrict xp, float *restrict yp, int64_t n, float m, float a, float b)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        yp[i] = (xp[i] - m) * a + b; /* centre first: no cancellation */
}

DT_CLONES static void row_bwd_sums(const float *restrict xp, const float *restrict gp, int64_t n, float m,
                                   float *sa, float *sb)
{
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
    for (int64_t i = 0; i < n; i++) {
        a += gp[i];
        b += gp[i] * (xp[i] - m);
    }
    *sa = a;
    *sb = b;
}

DT_CLONES static void row_bwd_dx(const float *restrict xp, const float *restrict gp, float *restrict dp, int64_t n,
                                 float m, float is, float k, float mdy, float mdyx)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float xh = (xp[i] - m) * is;
        dp[i] = k * (gp[i] - mdy - xh * mdyx);
    }
}

dt_status dt__bn_train_args(const char *fn, int64_t cnt, float eps)
{
    if (cnt < 2)
        return dt_error(DT_ERR_INVALID_ARG, "%s: training needs more than one value per channel (N*H*W = %lld)", fn,
                        (long long)cnt);
    if (!(eps > 0.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: eps must be > 0", fn);
    return DT_OK;
}

void dt__bn_finish_channel(int64_t c, double s1, double s2, float k, int64_t cnt, float eps, float momentum,
                           const float *gamma, const float *beta, float *running_mean, float *running_var,
                           float *save_mean, float *save_invstd, float *mean, float *scale, float *shift)
{
    double m1 = s1 / (double)cnt;
    double var = s2 / (double)cnt - m1 * m1;
    if (var < 0.0)
        var = 0.0;
    float invstd = (float)(1.0 / sqrt(var + (double)eps));
    float fm = (float)((double)k + m1);
    *mean = fm;
    *scale = (gamma ? gamma[c] : 1.0f) * invstd;
    *shift = beta ? beta[c] : 0.0f;
    if (save_mean)
        save_mean[c] = fm;
    if (save_invstd)
        save_invstd[c] = invstd;
    if (running_mean)
        running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * fm;
    if (running_var)
        running_var[c] = (1.0f - momentum) * running_var[c] +
                         momentum * (float)(var * (double)cnt / (double)(cnt - 1));
}

dt_status dt_k_batchnorm_train_fwd(const float *x, int64_t N, int64_t C, int64_t HW, const float *gamma,
                                   const float *beta, float eps, float momentum, float *running_mean,
                                   float *running_var, float *y, float *save_mean, float *save_invstd)
{
    const char *fn = "dt_k_batchnorm_train_fwd";
    dt_status st = bn_check(fn, x, y, N, C, HW);
    if (st < 0)
        return st;
    if (C == 0)
        return DT_OK;
    int64_t cnt = N * HW;
    if ((st = dt__bn_train_args(fn, cnt, eps)) < 0)
        return st;
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t c = 0; c < C; c++) {
        /* One pass for both moments, shifted by the channel's first value
         * (k) so that E[(x-k)^2] - E[x-k]^2 does not cancel. Each (n, c)
         * row of HW values is summed in float (vectorised, a fixed order),
         * the row sums in double in n order. */
        const float k = x[c * HW];
        double s1 = 0.0, s2 = 0.0;
        for (int64_t n = 0; n < N; n++) {
            float r1, r2;
            row_moments(x + (n * C + c) * HW, HW, k, &r1, &r2);
            s1 += (double)r1;
            s2 += (double)r2;
        }
        float fm, a, b;
        dt__bn_finish_channel(c, s1, s2, k, cnt, eps, momentum, gamma, beta, running_mean, running_var,
                              save_mean, save_invstd, &fm, &a, &b);
        for (int64_t n = 0; n < N; n++)
            row_affine(x + (n * C + c) * HW, y + (n * C + c) * HW, HW, fm, a, b);
    }
    return DT_OK;
}

dt_status dt_k_batchnorm_eval_fwd(const float *x, int64_t N, int64_t C, int64_t HW, const float *gamma,
                                  const float *beta, const float *running_mean, const float *running_var, float eps,
                                  float *y)
{
    const char *fn = "dt_k_batchnorm_eval_fwd";
    dt_status st = bn_check(fn, x, y, N, C, HW);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, running_mean, C);
    DT__CHECK_PTR(fn, running_var, C);
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt) collapse(2)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            float invstd = 1.0f / sqrtf(running_var[c] + eps);
            float a = (gamma ? gamma[c] : 1.0f) * invstd;
            float b = beta ? beta[c] : 0.0f, m = running_mean[c];
            row_affine(x + (n * C + c) * HW, y + (n * C + c) * HW, HW, m, a, b);
        }
    return DT_OK;
}

dt_status dt_k_batchnorm_bwd(const float *x, const float *dy, int64_t N, int64_t C, int64_t HW, const float *gamma,
                             const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbeta)
{
    const char *fn = "dt_k_batchnorm_bwd";
    dt_status st = bn_check(fn, x, dy, N, C, HW);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, save_mean, C);
    DT__CHECK_PTR(fn, save_invstd, C);
    int64_t cnt = N * HW;
    if (cnt == 0) {
        for (int64_t c = 0; c < C; c++) {
            if (dgamma)
                dgamma[c] = 0.0f;
            if (dbeta)
                dbeta[c] = 0.0f;
        }
        return DT_OK;
    }
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t c = 0; c < C; c++) {
        float m = save_mean[c], is = save_invstd[c];
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t n = 0; n < N; n++) {
            float a, b;
            row_bwd_sums(x + (n * C + c) * HW, dy + (n * C + c) * HW, HW, m, &a, &b);
            sdy += (double)a;
            sdyx += (double)b;
        }
        sdyx *= (double)is; /* sum dy * xhat */
        if (dgamma)
            dgamma[c] = (float)sdyx;
        if (dbeta)
            dbeta[c] = (float)sdy;
        if (dx) {
            float g = gamma ? gamma[c] : 1.0f;
            float k = g * is, mdy = (float)(sdy / (double)cnt), mdyx = (float)(sdyx / (double)cnt);
            for (int64_t n = 0; n < N; n++)
                row_bwd_dx(x + (n * C + c) * HW, dy + (n * C + c) * HW, dx + (n * C + c) * HW, HW, m, is, k, mdy,
                           mdyx);
        }
    }
    return DT_OK;
}

/* ---- layer norm ---------------------------------------------------------------- */
dt_status dt_k_layernorm_fwd(const float *x, int64_t rows, int64_t cols, const float *gamma, const float *beta,
                             float eps, float *y, float *save_mean, float *save_rstd)
{
    const char *fn = "dt_k_layernorm_fwd";
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    if (rows > 0 && cols == 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: normalising over 0 elements", fn);
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, y, rows * cols);
    if (!(eps > 0.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: eps must be > 0", fn);
    int nt = dt__threads_for(rows * cols * 2);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        double s = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < cols; j++)
            s += (double)xr[j];
        double mean = s / (double)cols;
#pragma omp simd reduction(+ : s2)
        for (int64_t j = 0; j < cols; j++) {
            double d = (double)xr[j] - mean;
            s2 += d * d;
        }
        float rstd = (float)(1.0 / sqrt(s2 / (double)cols + (double)eps)), fm = (float)mean;
        for (int64_t j = 0; j < cols; j++) {
            float v = (xr[j] - fm) * rstd;
            yr[j] = v * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
        }
        if (save_mean)
            save_mean[r] = fm;
        if (save_rstd)
            save_rstd[r] = rstd;
    }
    return DT_OK;
}

dt_status dt_k_layernorm_bwd(const float *x, const float *dy, int64_t rows, int64_t cols, const float *gamma,
                             const float *save_mean, const float *save_rstd, float *dx, float *dgamma, float *dbeta)
{
    const char *fn = "dt_k_layernorm_bwd";
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, dy, rows * cols);
    DT__CHECK_PTR(fn, save_mean, rows);
    DT__CHECK_PTR(fn, save_rstd, rows);
    int nt = dt__threads_for(rows * cols * 2);
    if (dx) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * cols, *gr = dy + r * cols;
            float *dr = dx + r * cols;
            float m = save_mean[r], rs = save_rstd[r];
            double a = 0.0, b = 0.0; /* mean(g*dy), mean(g*dy*xhat) */
            for (int64_t j = 0; j < cols; j++) {
                float gd = gr[j] * (gamma ? gamma[j] : 1.0f);
                a += (double)gd;
                b += (double)gd * (double)((xr[j] - m) * rs);
            }
            float ma = (float)(a / (double)cols), mb = (float)(b / (double)cols);
            for (int64_t j = 0; j < cols; j++) {
                float gd = gr[j] * (gamma ? gamma[j] : 1.0f);
                float xh = (xr[j] - m) * rs;
                dr[j] = rs * (gd - ma - xh * mb);
            }
        }
    }
    if (dgamma || dbeta) {
        const int64_t CB = 64;
        int64_t nblk = (cols + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bk = 0; bk < nblk; bk++) {
            int64_t j0 = bk * CB, j1 = j0 + CB < cols ? j0 + CB : cols;
            double sg[64], sb[64];
            for (int64_t j = j0; j < j1; j++)
                sg[j - j0] = sb[j - j0] = 0.0;
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = x + r * cols, *gr = dy + r * cols;
                float m = save_mean[r], rs = save_rstd[r];
                for (int64_t j = j0; j < j1; j++) {
                    sg[j - j0] += (double)gr[j] * (double)((xr[j] - m) * rs);
                    sb[j - j0] += (double)gr[j];
                }
            }
            for (int64_t j = j0; j < j1; j++) {
                if (dgamma)
                    dgamma[j] = (float)sg[j - j0];
                if (dbeta)
                    dbeta[j] = (float)sb[j - j0];
            }
        }
    }
    return DT_OK;
}
