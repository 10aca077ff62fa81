/* Comparing two checkpoints tensor by tensor, for the tests that save the
 * same state two ways (resharded, resumed, another strategy) and check the
 * files agree. */
#ifndef DT_TEST_CKPT_CMP_H
#define DT_TEST_CKPT_CMP_H

#include "dtrain/ckpt.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every tensor of checkpoint a is in b with the same dtype and shape and
 * equal values: exact, byte for byte (any dtype); else F32 tensors within
 * |a - b| <= 1e-5 max|b| + 1e-7 per tensor. Both must hold the same number
 * of tensors; files are verified (checksums) as they are read. Returns the
 * number of tensors compared, -1 on the first difference (said on stderr,
 * naming the tensor). */
static inline int t_same_ckpt(const char *a, const char *b, bool exact)
{
    dt_ckpt *ca = NULL, *cb = NULL;
    int count = -1;
    if (dt_ckpt_open(a, &ca) < 0 || dt_ckpt_open(b, &cb) < 0) {
        fprintf(stderr, "cannot open %s or %s: %s\n", a, b, dt_last_error());
        goto out;
    }
    if (dt_ckpt_num_tensors(ca) != dt_ckpt_num_tensors(cb)) {
        fprintf(stderr, "%s: %zu tensors, %s: %zu\n", a, dt_ckpt_num_tensors(ca), b, dt_ckpt_num_tensors(cb));
        goto out;
    }
    for (size_t i = 0; i < dt_ckpt_num_tensors(ca); i++) {
        dt_ckpt_tensor ta, tb;
        if (dt_ckpt_tensor_at(ca, i, &ta) < 0)
            goto out;
        int64_t j = dt_ckpt_find(cb, ta.name);
        bool same = j >= 0 && dt_ckpt_tensor_at(cb, (size_t)j, &tb) >= 0 && ta.dtype == tb.dtype &&
                    ta.ndim == tb.ndim && ta.numel == tb.numel && (exact || ta.dtype == DT_ST_F32);
        for (int d = 0; same && d < ta.ndim; d++)
            same = ta.shape[d] == tb.shape[d];
        if (!same) {
            fprintf(stderr, "tensor '%s': missing from %s, or another shape or dtype%s\n", ta.name, b,
                    exact ? "" : " (or not F32)");
            goto out;
        }
        size_t nb = ta.numel * dt_st_dtype_size(ta.dtype);
        char *x = malloc(nb + 4), *y = malloc(nb + 4);
        bool ok = x && y && dt_ckpt_read(ca, i, 0, ta.numel, x, true) >= 0 &&
                  dt_ckpt_read(cb, (size_t)j, 0, tb.numel, y, true) >= 0;
        if (!ok)
            fprintf(stderr, "tensor '%s': cannot read: %s\n", ta.name, dt_last_error());
        double dmax = 0, ymax = 0;
        if (ok && exact) {
            ok = memcmp(x, y, nb) == 0;
        } else if (ok) {
            const float *fx = (const float *)(void *)x, *fy = (const float *)(void *)y;
            for (uint64_t k = 0; k < ta.numel; k++) {
                dmax = fmax(dmax, fabs((double)fx[k] - fy[k]));
                ymax = fmax(ymax, fabs((double)fy[k]));
            }
            ok = dmax <= 1e-5 * ymax + 1e-7;
        }
        free(x);
        free(y);
        if (!ok) {
            fprintf(stderr, "tensor '%s' differs between %s and %s%s (max |diff| %g, max |value| %g)\n", ta.name, a,
                    b, exact ? " (exact wanted)" : "", dmax, ymax);
            goto out;
        }
    }
    count = (int)dt_ckpt_num_tensors(ca);
out:
    dt_ckpt_close(ca);
    dt_ckpt_close(cb);
    return count;
}

#endif
