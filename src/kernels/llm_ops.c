/* The element-wise pieces of a Llama-family block: RMSNorm, rotary
 * position embeddings (rotate-half layout) and SwiGLU, forward and
 * backward.
 *
 * RMSNorm keeps Hugging Face's numerics in f32: the mean of squares is
 * summed in double per row (PyTorch sums in f32 pairwise; both are within
 * an ulp or two of the exact mean), rstd is rounded to f32, and y = (x rstd)
 * w with the normalised value rounded before the weight multiplies. The
 * weight gradient is a column sum over rows; threads split columns and each
 * column adds its rows in order, so it does not depend on the thread count.
 *
 * RoPE takes precomputed cos/sin tables (T, hd/2): the caller computes the
 * angles (position x inverse frequency) in f32 as transformers does. The
 * backward of a rotation is the rotation by the opposite angle. */
#include "kernels_impl.h"

#include <math.h>

dt_status dt_k_rmsnorm_fwd(const float *x, int64_t rows, int64_t cols, const float *w, float eps, float *y,
                           float *save_rstd)
{
    const char *fn = "dt_k_rmsnorm_fwd";
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
        double s2 = 0.0;
#pragma omp simd reduction(+ : s2)
        for (int64_t j = 0; j < cols; j++)
            s2 += (double)xr[j] * (double)xr[j];
        float ms = (float)(s2 / (double)cols);
        float rstd = 1.0f / sqrtf(ms + eps);
        for (int64_t j = 0; j < cols; j++) {
            float v = xr[j] * rstd;
            yr[j] = w ? w[j] * v : v;
        }
        if (save_rstd)
            save_rstd[r] = rstd;
    }
    return DT_OK;
}

dt_status dt_k_rmsnorm_bwd(const float *x, const float *dy, int64_t rows, int64_t cols, const float *w,
                           const float *save_rstd, float *dx, float *dw)
{
    const char *fn = "dt_k_rmsnorm_bwd";
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, dy, rows * cols);
    DT__CHECK_PTR(fn, save_rstd, rows);
    int nt = dt__threads_for(rows * cols * 2);
    if (dx) {
        /* y_j = w_j x_j r, r = (mean(x^2) + eps)^-1/2:
         * dx_j = r (g_j - x_j r^2 mean(g x)),  g_j = dy_j w_j */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * cols, *gr = dy + r * cols;
            float *dr = dx + r * cols;
            float rs = save_rstd[r];
            double a = 0.0;
            for (int64_t j = 0; j < cols; j++)
                a += (double)(gr[j] * (w ? w[j] : 1.0f)) * (double)xr[j];
            float k = (float)(a / (double)cols) * rs * rs;
            for (int64_t j = 0; j < cols; j++)
                dr[j] = rs * (gr[j] * (w ? w[j] : 1.0f) - xr[j] * k);
        }
    }
    if (dw) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t j = 0; j < cols; j++) {
            double s = 0.0;
            for (int64_t r = 0; r < rows; r++)
                s += (double)dy[r * cols + j] * (double)(x[r * cols + j] * save_rstd[r]);
            dw[j] = (float)s;
        }
    }
    return DT_OK;
}

dt_status dt_k_rope(const float *x, int64_t B, int64_t T, int64_t H, int64_t hd, const float *cos_t,
                    const float *sin_t, bool inverse, float *y)
{
    const char *fn = "dt_k_rope";
    DT__CHECK_N(fn, B);
    DT__CHECK_N(fn, T);
    DT__CHECK_N(fn, H);
    DT__CHECK_N(fn, hd);
    if (hd % 2)
        return dt_error(DT_ERR_INVALID_ARG, "%s: head size %lld is odd (pairs (j, j + hd/2) need it even)", fn,
                        (long long)hd);
    int64_t n = B * T * H * hd, half = hd / 2;
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, y, n);
    DT__CHECK_PTR(fn, cos_t, T * half);
    DT__CHECK_PTR(fn, sin_t, T * half);
    const float sgn = inverse ? -1.0f : 1.0f;
    int nt = dt__threads_for(n * 2);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const float *c = cos_t + (bt % T) * half, *s = sin_t + (bt % T) * half;
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + (bt * H + h) * hd;
            float *yr = y + (bt * H + h) * hd;
            for (int64_t j = 0; j < half; j++) {
                float a = xr[j], b = xr[j + half], sn = sgn * s[j];
                yr[j] = a * c[j] - b * sn;
                yr[j + half] = b * c[j] + a * sn;
            }
        }
    }
    return DT_OK;
}

static inline float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

dt_status dt_k_swiglu_fwd(const float *g, const float *u, int64_t n, float *y)
{
    const char *fn = "dt_k_swiglu_fwd";
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, g, n);
    DT__CHECK_PTR(fn, u, n);
    DT__CHECK_PTR(fn, y, n);
    int nt = dt__threads_for(n * 8);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        y[i] = g[i] * sigmoidf(g[i]) * u[i];
    return DT_OK;
}

dt_status dt_k_swiglu_bwd(const float *g, const float *u, const float *dy, int64_t n, float *dg, float *du)
{
    const char *fn = "dt_k_swiglu_bwd";
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, g, n);
    DT__CHECK_PTR(fn, u, n);
    DT__CHECK_PTR(fn, dy, n);
    int nt = dt__threads_for(n * 8);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++) {
        float sg = sigmoidf(g[i]), silu = g[i] * sg;
        if (dg)
            dg[i] = dy[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
        if (du)
            du[i] = dy[i] * silu;
    }
    return DT_OK;
}
