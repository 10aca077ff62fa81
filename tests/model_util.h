/* tests/model_util.h — short forms the tests use for a model's f32 flats
 * and for one-line construction (the library's calls return a status and
 * an out-parameter; a test that needs the status calls them directly). */
#ifndef DT_TEST_MODEL_UTIL_H
#define DT_TEST_MODEL_UTIL_H

#include "dtrain/ckpt.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

#include <stdlib.h>
#include <string.h>

/* Tensor `name` of the safetensors file path, as stored (f32, i64, ...),
 * in a fresh malloc'd buffer; *n its element count. NULL when the file
 * or the tensor is absent (golden files of the parity tests). */
static inline void *t_read_tensor(const char *path, const char *name, size_t *n)
{
    dt_st_file *f = NULL;
    if (dt_st_open(path, &f) < 0)
        return NULL;
    const dt_st_tensor *t = dt_st_find(f, name);
    void *buf = NULL;
    if (t) {
        size_t bytes = (size_t)t->numel * dt_st_dtype_size(t->dtype);
        buf = malloc(bytes ? bytes : 1);
        if (buf && dt_st_read(f, t, 0, bytes, buf) < 0) {
            free(buf);
            buf = NULL;
        }
        *n = (size_t)t->numel;
    }
    dt_st_close(f);
    return buf;
}

static inline const dt_flat *t_flat(const dt_model *m, dt_flat_role r)
{
    return dt_model_flat(m, r, DT_F32);
}
/* The f32 parameter / gradient flats' memory and length (0 when none). */
static inline float *t_params(const dt_model *m)
{
    const dt_flat *f = t_flat(m, DT_FLAT_PARAMS);
    return f ? (float *)f->base : NULL;
}
static inline float *t_grads(const dt_model *m)
{
    const dt_flat *f = t_flat(m, DT_FLAT_GRADS);
    return f ? (float *)f->base : NULL;
}
static inline size_t t_numel(const dt_model *m)
{
    const dt_flat *f = t_flat(m, DT_FLAT_PARAMS);
    return f ? f->total : 0;
}
/* NULL on error (dt_last_error says why). */
static inline dt_model *t_create(const char *name, uint64_t seed, const dt_model_config *cfg)
{
    dt_model *m = NULL;
    return dt_model_create(name, seed, cfg, &m, NULL) < 0 ? NULL : m;
}
/* gpt-micro (seed 99) with its weights scaled up, in eval mode: its logits far from uniform (a random
 * init's are nearly flat), for the generation tests' greedy and sampled tokens. */
static inline dt_model *t_gen_model(void)
{
    dt_model *m = NULL;
    dt_model_config c = dt_model_config_default();
    if (dt_model_create("gpt-micro", 99, &c, &m, NULL) < 0)
        return NULL;
    const dt_flat *p = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
    float *w = p->base;
    for (size_t i = 0; i < p->total; i++)
        w[i] *= 4.0f;
    dt_model_train(m, false);
    return m;
}

static inline dt_model *t_build(dt_module *root, uint64_t seed)
{
    dt_model *m = NULL;
    return dt_model_build(root, seed, NULL, &m) < 0 ? NULL : m;
}
/* Bytes of all buffer flats (every dtype), and a copy of them into dst in
 * dtype order. */
static inline size_t t_buffers_nbytes(const dt_model *m)
{
    size_t n = 0;
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        n += dt_flat_nbytes(dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d));
    return n;
}
static inline void t_buffers_copy(const dt_model *m, void *dst)
{
    char *o = (char *)dst;
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *f = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        if (f && f->base) {
            memcpy(o, f->base, dt_flat_nbytes(f));
            o += dt_flat_nbytes(f);
        }
    }
}
/* One range over the whole f32 flat of m. */
static inline dt_optim_range t_range(const dt_model *m, const dt_optim_segment *segs, size_t nseg)
{
    const dt_flat *p = t_flat(m, DT_FLAT_PARAMS);
    dt_optim_range r = {.params = p, .grads = t_flat(m, DT_FLAT_GRADS), .lo = 0, .hi = p ? p->total : 0,
                        .segs = segs, .nseg = nseg};
    return r;
}
static inline dt_optim *t_sgd(const dt_model *m, const dt_sgd_params *p)
{
    dt_optim_range r = t_range(m, NULL, 0);
    dt_optim *o = NULL;
    return dt_optim_sgd_init(p, &r, 1, &o) < 0 ? NULL : o;
}

#endif
