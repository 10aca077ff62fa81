/* Global-norm gradient clipping over flat buffers (torch clip_grad_norm_,
 * norm type 2). The sum of squares is split into fixed chunks whose partial
 * sums (double) are added in chunk order, so the norm does not depend on the
 * thread count. */
#include "optim_impl.h"
#include "base/inflight.h"

#include <math.h>
#include <stdlib.h>

double dt_grad_sqnorm(const float *g, size_t n)
{
    if (!g || n == 0)
        return 0.0;
    const size_t nc = (n + DT__OPTIM_CHUNK - 1) / DT__OPTIM_CHUNK;
    if (nc == 1)
        return dt__sqsum(g, n);
    double stackbuf[64];
    double *part = nc <= 64 ? stackbuf : malloc(nc * sizeof(double));
    double s = 0;
    if (!part) { /* out of memory: same chunk order, one thread */
        for (size_t c = 0; c < nc; c++) {
            size_t a = c * DT__OPTIM_CHUNK, len = n - a < DT__OPTIM_CHUNK ? n - a : DT__OPTIM_CHUNK;
            s += dt__sqsum(g + a, len);
        }
        return s;
    }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nc; c++) {
        size_t a = c * DT__OPTIM_CHUNK, len = n - a < DT__OPTIM_CHUNK ? n - a : DT__OPTIM_CHUNK;
        part[c] = dt__sqsum(g + a, len);
    }
    for (size_t c = 0; c < nc; c++)
        s += part[c];
    if (part != stackbuf)
        free(part);
    return s;
}

void dt_grad_clip_apply(float *g, size_t n, float total_norm, float max_norm)
{
    if (!g || n == 0 || !(max_norm > 0) || !isfinite(total_norm))
        return;
    /* torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, in float */
    float coef = max_norm / (total_norm + 1e-6f);
    if (!(coef < 1.0f))
        return; /* multiplying by 1 is the identity */
    const size_t nc = (n + DT__OPTIM_CHUNK - 1) / DT__OPTIM_CHUNK;
#pragma omp parallel for schedule(static) if (nc > 1)
    for (size_t c = 0; c < nc; c++) {
        size_t a = c * DT__OPTIM_CHUNK, len = n - a < DT__OPTIM_CHUNK ? n - a : DT__OPTIM_CHUNK;
        dt__scale(g + a, len, coef);
    }
}

dt_status dt_clip_grad_norm(float *g, size_t n, float max_norm, float *total_norm)
{
    if (!g && n > 0)
        return dt_error(DT_ERR_NULL, "dt_clip_grad_norm: gradient buffer is NULL (n = %zu)", n);
    dt_status st = dt__inflight_check("dt_clip_grad_norm", g, n * sizeof(float));
    if (st < 0)
        return st;
    float norm = (float)sqrt(dt_grad_sqnorm(g, n));
    if (total_norm)
        *total_norm = norm;
    dt_grad_clip_apply(g, n, norm, max_norm);
    return DT_OK;
}
