/* PowerSGD as a communication hook (PyTorch's
 * powerSGD_hook; the algorithm is written down in parallel.h).
 *
 * Stages per bucket (the engine's rounds call them in bucket order on every
 * rank, so the collectives match):
 *   post   error feedback; the uncompressed tensors are gathered into the
 *          bucket's comm buffer [U | P]; Q set up (warm start, a preset, or a
 *          draw); P = M Q; all-reduce SUM of [U | P].
 *   then 1 U / W back into the tensors; P orthogonalised; Q = M^T P;
 *          all-reduce SUM of Q (skipped when nothing is compressed).
 *   then 2 Q / W; M = P Q^T; error = G0 - M.
 * Before start_iter, post is a plain all-reduce AVG and then does nothing.
 *
 * Memory per bucket: the error (numel floats; it holds G0 between post and
 * the end, so no separate copy), [U | P] and Q. The layout of a bucket
 * (which tensors are compressed, where each P and Q lives) is worked out
 * at its first compressed step and kept: the engine's buckets never change.
 *
 * The random Q follows PyTorch number for number: numpy's legacy
 * RandomState(random_seed).randint(1e9) (MT19937, 32-bit outputs masked to
 * 30 bits, rejected above 1e9 - 1) seeds torch.manual_seed, whose randn
 * fills each Q in order (dt_torch_rng: the same MT19937 and normal draws). */
#include "dtrain/kernels.h"
#include "dtrain/parallel.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

enum { ST_IDLE = 0, ST_VANILLA, ST_PQ, ST_Q };

typedef struct {
    int param;      /* index in the bucket's params */
    size_t n, m;    /* the view (shape[0], numel / shape[0]) */
    int r;          /* min(n, m, rank) */
    size_t p_off, q_off;
} ctensor;

typedef struct {
    bool laid_out;
    size_t numel;
    int nunc, ncomp;
    int *unc;           /* params sent uncompressed, bucket order */
    ctensor *comp;      /* compressed, grouped by view shape (first appearance first) */
    size_t n_unc, p_total, q_total;
    float *comm;        /* [U (n_unc) | P (p_total)] */
    float *q;           /* q_total */
    float *err;         /* numel; NULL until the first compressed step */
    bool have_q;        /* warm-start memory holds last step's Q */
    float *preset;      /* dt_powersgd_set_q */
    size_t preset_n;
    int stage;
} pbucket;

struct dt_powersgd {
    dt_powersgd_params p;
    pbucket *b;
    int nb;
    dt_torch_rng seeder;  /* numpy's RandomState(random_seed) */
    uint64_t draws;       /* seeds drawn from it (its position, for checkpoints) */
    int64_t iter;         /* steps this hook reduced (PyTorch's state.iter): start_iter counts them */
    uint64_t before, after;
};

dt_powersgd_params dt_powersgd_params_default(void)
{
    dt_powersgd_params p;
    memset(&p, 0, sizeof p);
    p.rank = 1;
    p.start_iter = 1000;
    p.min_compression_rate = 2.0;
    p.use_error_feedback = true;
    p.warm_start = true;
    p.orthogonalization_epsilon = 0.0f;
    p.random_seed = 0;
    return p;
}

dt_status dt_powersgd_init(const dt_powersgd_params *pp, dt_powersgd **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_powersgd_init: out is NULL");
    *out = NULL;
    dt_powersgd_params p = pp ? *pp : dt_powersgd_params_default();
    if (p.rank < 1)
        return dt_error(DT_ERR_INVALID_ARG, "PowerSGD: matrix approximation rank %d (must be >= 1)", p.rank);
    if (p.start_iter < 0)
        return dt_error(DT_ERR_INVALID_ARG, "PowerSGD: start_iter %lld (must be >= 0)", (long long)p.start_iter);
    if (!(p.min_compression_rate >= 0) || !isfinite(p.min_compression_rate))
        return dt_error(DT_ERR_INVALID_ARG, "PowerSGD: min_compression_rate %g (must be a finite value >= 0)",
                        p.min_compression_rate);
    if (!(p.orthogonalization_epsilon >= 0) || !isfinite(p.orthogonalization_epsilon))
        return dt_error(DT_ERR_INVALID_ARG, "PowerSGD: orthogonalization_epsilon %g (must be >= 0)",
                        (double)p.orthogonalization_epsilon);
    dt_powersgd *s = dt_calloc(sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_powersgd_init");
    s->p = p;
    dt_torch_rng_seed(&s->seeder, p.random_seed);
    *out = s;
    return DT_OK;
}

static void bucket_release(pbucket *b)
{
    dt_free(b->unc);
    dt_free(b->comp);
    dt_free(b->comm);
    dt_free(b->q);
    dt_free(b->err);
    dt_free(b->preset);
}

void dt_powersgd_free(dt_powersgd *s)
{
    if (!s)
        return;
    for (int k = 0; k < s->nb; k++)
        bucket_release(&s->b[k]);
    dt_free(s->b);
    dt_free(s);
}

static dt_status ensure_buckets(dt_powersgd *s, int n)
{
    if (n <= s->nb)
        return DT_OK;
    pbucket *nb = dt_calloc((size_t)n * sizeof *nb);
    if (!nb)
        return dt_error(DT_ERR_NO_MEMORY, "PowerSGD: state of %d buckets", n);
    if (s->nb)
        memcpy(nb, s->b, (size_t)s->nb * sizeof *nb);
    dt_free(s->b);
    s->b = nb;
    s->nb = n;
    return DT_OK;
}

/* numpy RandomState.randint(1_000_000_000) on the legacy path. */
static uint32_t np_randint_1e9(dt_torch_rng *g, uint64_t *draws)
{
    ++*draws;
    for (;;) {
        uint32_t x = dt_torch_rng_next(g) & 0x3fffffffu;
        if (x <= 999999999u)
            return x;
    }
}

/* Gram-Schmidt over the r columns of a rows x r row-major matrix. */
static void orthogonalize(float *a, size_t rows, int r, float eps)
{
    for (int i = 0; i < r; i++) {
        double ss = 0;
        for (size_t j = 0; j < rows; j++)
            ss += (double)a[j * (size_t)r + (size_t)i] * a[j * (size_t)r + (size_t)i];
        const float norm = (float)sqrt(ss);
        if (eps == 0.0f && norm == 0.0f) {
            for (size_t j = 0; j < rows; j++)
                a[j * (size_t)r + (size_t)i] = 0.0f;
        } else {
            const float d = norm + eps;
            for (size_t j = 0; j < rows; j++)
                a[j * (size_t)r + (size_t)i] /= d;
        }
        for (int c = i + 1; c < r; c++) {
            double dot = 0;
            for (size_t j = 0; j < rows; j++)
                dot += (double)a[j * (size_t)r + (size_t)i] * a[j * (size_t)r + (size_t)c];
            const float f = (float)dot;
            for (size_t j = 0; j < rows; j++)
                a[j * (size_t)r + (size_t)c] -= f * a[j * (size_t)r + (size_t)i];
        }
    }
}

/* Which tensors are compressed, and where their Ps and Qs live. */
static dt_status lay_out(const dt_powersgd *s, pbucket *pb, const dt_grad_bucket *gb)
{
    pb->numel = gb->numel;
    pb->unc = dt_calloc((size_t)gb->nparams * sizeof *pb->unc);
    pb->comp = dt_calloc((size_t)gb->nparams * sizeof *pb->comp);
    bool *taken = dt_calloc((size_t)gb->nparams * sizeof *taken);
    ctensor *all = dt_calloc((size_t)gb->nparams * sizeof *all);
    if (!pb->unc || !pb->comp || !taken || !all) {
        dt_free(taken);
        dt_free(all);
        return dt_error(DT_ERR_NO_MEMORY, "PowerSGD: layout of bucket %d", gb->index);
    }
    for (int i = 0; i < gb->nparams; i++) {
        const dt_grad_param *gp = &gb->params[i];
        ctensor *c = &all[i];
        c->param = i;
        c->n = gp->ndim > 0 ? (size_t)gp->shape[0] : 1;
        c->m = c->n ? gp->numel / c->n : 0;
        size_t r = (size_t)s->p.rank;
        if (c->n < r)
            r = c->n;
        if (c->m < r)
            r = c->m;
        c->r = (int)r;
        const double unc = (double)c->n * (double)c->m, cmp = (double)(c->n + c->m) * (double)r;
        taken[i] = !(cmp * s->p.min_compression_rate < unc); /* uncompressed */
        if (taken[i])
            pb->unc[pb->nunc++] = i, pb->n_unc += gp->numel;
    }
    /* compressed tensors grouped by view shape, in order of first appearance */
    for (int i = 0; i < gb->nparams; i++) {
        if (taken[i])
            continue;
        for (int j = i; j < gb->nparams; j++)
            if (!taken[j] && all[j].n == all[i].n && all[j].m == all[i].m) {
                ctensor c = all[j];
                c.p_off = pb->p_total;
                c.q_off = pb->q_total;
                pb->p_total += c.n * (size_t)c.r;
                pb->q_total += c.m * (size_t)c.r;
                pb->comp[pb->ncomp++] = c;
                taken[j] = true;
            }
    }
    dt_free(taken);
    dt_free(all);
    pb->comm = dt_alloc((pb->n_unc + pb->p_total + 1) * sizeof(float));
    pb->q = dt_alloc((pb->q_total + 1) * sizeof(float));
    if (!pb->comm || !pb->q)
        return dt_error(DT_ERR_NO_MEMORY, "PowerSGD: P and Q of bucket %d", gb->index);
    pb->laid_out = true;
    return DT_OK;
}

static dt_status setup_q(dt_powersgd *s, pbucket *pb, int index)
{
    if (s->p.warm_start && pb->have_q) {
        /* last step's Q, re-orthogonalised below */
    } else if (pb->preset) {
        if (pb->preset_n != pb->q_total)
            return dt_error(DT_ERR_MISMATCH, "PowerSGD: the Q preset for bucket %d has %zu elements, its Qs need %zu",
                            index, pb->preset_n, pb->q_total);
        memcpy(pb->q, pb->preset, pb->q_total * sizeof(float));
        dt_free(pb->preset);
        pb->preset = NULL;
    } else {
        dt_torch_rng g;
        dt_torch_rng_seed(&g, np_randint_1e9(&s->seeder, &s->draws));
        for (int i = 0; i < pb->ncomp; i++)
            dt_torch_rng_normal(&g, pb->q + pb->comp[i].q_off, pb->comp[i].m * (size_t)pb->comp[i].r, 0.0, 1.0);
    }
    for (int i = 0; i < pb->ncomp; i++)
        orthogonalize(pb->q + pb->comp[i].q_off, pb->comp[i].m, pb->comp[i].r, s->p.orthogonalization_epsilon);
    return DT_OK;
}

static dt_status post_bucket(dt_powersgd *s, dt_pg *pg, const dt_grad_bucket *gb, dt_req **req)
{
    *req = NULL;
    if (gb->shard_numel > 0)
        return dt_error(DT_ERR_UNSUPPORTED,
                        "PowerSGD needs whole buckets (all-reduce); this engine reduce-scatters (ZeRO-2/3)");
    dt_status st = ensure_buckets(s, gb->nbuckets > gb->index ? gb->nbuckets : gb->index + 1);
    if (st < 0)
        return st;
    pbucket *pb = &s->b[gb->index];
    if (s->iter < s->p.start_iter) {
        pb->stage = ST_VANILLA;
        return dt_pg_allreduce_async(pg, DT_IN_PLACE, gb->data, gb->numel, DT_F32, DT_REDUCE_AVG, req);
    }
    if (!pb->laid_out && (st = lay_out(s, pb, gb)) < 0)
        return st;
    if (pb->numel != gb->numel)
        return dt_error(DT_ERR_STATE, "PowerSGD: bucket %d changed size (%zu, was %zu)", gb->index, gb->numel,
                        pb->numel);
    float *g = gb->data;
    if (s->p.use_error_feedback) {
        if (!pb->err && !(pb->err = dt_calloc(gb->numel * sizeof(float))))
            return dt_error(DT_ERR_NO_MEMORY, "PowerSGD: error memory of bucket %d", gb->index);
        for (size_t i = 0; i < gb->numel; i++) {
            g[i] += pb->err[i];
            pb->err[i] = g[i]; /* G0, until the end */
        }
    }
    size_t u = 0;
    for (int i = 0; i < pb->nunc; i++) {
        const dt_grad_param *gp = &gb->params[pb->unc[i]];
        memcpy(pb->comm + u, g + gp->offset, gp->numel * sizeof(float));
        u += gp->numel;
    }
    if ((st = setup_q(s, pb, gb->index)) < 0)
        return st;
    float *P = pb->comm + pb->n_unc;
    for (int i = 0; i < pb->ncomp; i++) {
        const ctensor *c = &pb->comp[i];
        st = dt_k_matmul(false, false, (int64_t)c->n, c->r, (int64_t)c->m, 1.0f, g + gb->params[c->param].offset,
                         pb->q + c->q_off, DT_F32, 0.0f, P + c->p_off, NULL);
        if (st < 0)
            return st;
    }
    for (int i = 0; i < gb->nparams; i++)
        s->before += gb->params[i].numel;
    s->after += pb->n_unc + pb->p_total + pb->q_total;
    pb->stage = ST_PQ;
    return dt_pg_allreduce_async(pg, DT_IN_PLACE, pb->comm, pb->n_unc + pb->p_total, DT_F32, DT_REDUCE_SUM, req);
}

/* Every bucket of a step decides with the same iter; the step is counted
 * after the last bucket's post (the engine posts 0 .. nbuckets-1 each step). */
static dt_status psgd_post(void *state, dt_pg *pg, const dt_grad_bucket *gb, dt_req **req)
{
    dt_powersgd *s = state;
    dt_status st = post_bucket(s, pg, gb, req);
    if (st >= 0 && gb->index == gb->nbuckets - 1)
        s->iter++;
    return st;
}

static void finish(dt_powersgd *s, pbucket *pb, const dt_grad_bucket *gb)
{
    if (s->p.use_error_feedback)
        for (size_t i = 0; i < gb->numel; i++)
            pb->err[i] -= gb->data[i];
    pb->have_q = s->p.warm_start;
    pb->stage = ST_IDLE;
}

static dt_status psgd_then(void *state, dt_pg *pg, const dt_grad_bucket *gb, dt_req **req)
{
    dt_powersgd *s = state;
    *req = NULL;
    pbucket *pb = &s->b[gb->index];
    float *g = gb->data;
    const float invw = 1.0f / (float)dt_pg_size(pg);
    dt_status st = DT_OK;
    if (pb->stage == ST_VANILLA) {
        pb->stage = ST_IDLE;
        return DT_OK;
    }
    if (pb->stage == ST_PQ) {
        size_t u = 0;
        for (int i = 0; i < pb->nunc; i++) {
            const dt_grad_param *gp = &gb->params[pb->unc[i]];
            float *t = g + gp->offset;
            for (size_t j = 0; j < gp->numel; j++)
                t[j] = pb->comm[u + j] * invw;
            u += gp->numel;
        }
        if (pb->ncomp == 0) {
            finish(s, pb, gb);
            return DT_OK;
        }
        float *P = pb->comm + pb->n_unc;
        for (int i = 0; i < pb->ncomp; i++) {
            const ctensor *c = &pb->comp[i];
            orthogonalize(P + c->p_off, c->n, c->r, s->p.orthogonalization_epsilon);
            st = dt_k_matmul(true, false, (int64_t)c->m, c->r, (int64_t)c->n, 1.0f, g + gb->params[c->param].offset,
                             P + c->p_off, DT_F32, 0.0f, pb->q + c->q_off, NULL);
            if (st < 0)
                return st;
        }
        pb->stage = ST_Q;
        return dt_pg_allreduce_async(pg, DT_IN_PLACE, pb->q, pb->q_total, DT_F32, DT_REDUCE_SUM, req);
    }
    if (pb->stage == ST_Q) {
        for (size_t i = 0; i < pb->q_total; i++)
            pb->q[i] *= invw;
        const float *P = pb->comm + pb->n_unc;
        for (int i = 0; i < pb->ncomp; i++) {
            const ctensor *c = &pb->comp[i];
            st = dt_k_matmul(false, true, (int64_t)c->n, (int64_t)c->m, c->r, 1.0f, P + c->p_off, pb->q + c->q_off,
                             DT_F32, 0.0f, g + gb->params[c->param].offset, NULL);
            if (st < 0)
                return st;
        }
        finish(s, pb, gb);
        return DT_OK;
    }
    return dt_error(DT_ERR_STATE, "PowerSGD: bucket %d has no reduction under way", gb->index);
}

static const dt_comm_hook k_powersgd = {.name = "powersgd", .post = psgd_post, .then = psgd_then};

const dt_comm_hook *dt_powersgd_hook(void) { return &k_powersgd; }

dt_status dt_powersgd_error(const dt_powersgd *s, int bucket, const float **err, size_t *numel)
{
    if (!s || !err || !numel)
        return dt_error(DT_ERR_NULL, "dt_powersgd_error: NULL argument");
    if (bucket < 0 || bucket >= s->nb || !s->b[bucket].err)
        return dt_error(DT_ERR_RANGE, "dt_powersgd_error: bucket %d has no error memory (yet)", bucket);
    *err = s->b[bucket].err;
    *numel = s->b[bucket].numel;
    return DT_OK;
}

dt_status dt_powersgd_set_q(dt_powersgd *s, int bucket, const float *q, size_t n)
{
    if (!s || (!q && n))
        return dt_error(DT_ERR_NULL, "dt_powersgd_set_q: NULL argument");
    if (bucket < 0 || bucket > 1 << 20)
        return dt_error(DT_ERR_RANGE, "dt_powersgd_set_q: bucket %d", bucket);
    dt_status st = ensure_buckets(s, bucket + 1);
    if (st < 0)
        return st;
    pbucket *pb = &s->b[bucket];
    float *c = dt_alloc((n + 1) * sizeof(float));
    if (!c)
        return dt_error(DT_ERR_NO_MEMORY, "dt_powersgd_set_q: %zu floats", n);
    if (n)
        memcpy(c, q, n * sizeof(float));
    dt_free(pb->preset);
    pb->preset = c;
    pb->preset_n = n;
    pb->have_q = false;
    return DT_OK;
}

void dt_powersgd_stats(const dt_powersgd *s, uint64_t *numel_before, uint64_t *numel_after)
{
    if (numel_before)
        *numel_before = s ? s->before : 0;
    if (numel_after)
        *numel_after = s ? s->after : 0;
}

/* ---- state for checkpoints ------------------------------------------------------------
 * The JSON holds the scalars (the parameters that shape the state, for the
 * mismatch checks; iter; the seed generator's MT19937 words) and
 * per bucket the sizes of its two arrays; the arrays travel separately
 * (dt_powersgd_state_array). A saved warm-start Q comes back as a preset
 * (dt_powersgd_set_q): setup_q copies and re-orthogonalises it exactly as it
 * re-orthogonalises the warm Q, so the next step is bit for bit the same. */

static const float *bucket_q(const pbucket *pb, bool warm, size_t *n)
{
    if (warm && pb->have_q) {
        *n = pb->q_total;
        return pb->q;
    }
    *n = pb->preset ? pb->preset_n : 0;
    return pb->preset;
}

dt_status dt_powersgd_state_save(const dt_powersgd *s, char **json)
{
    if (!s || !json)
        return dt_error(DT_ERR_NULL, "dt_powersgd_state_save: NULL argument");
    *json = NULL;
    cJSON *o = cJSON_CreateObject(), *bs = cJSON_CreateArray();
    if (!o || !bs) {
        cJSON_Delete(o);
        cJSON_Delete(bs);
        return dt_error(DT_ERR_NO_MEMORY, "dt_powersgd_state_save");
    }
    cJSON_AddItemToObject(o, "buckets", bs);
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddNumberToObject(o, "rank", s->p.rank);
    cJSON_AddNumberToObject(o, "start_iter", (double)s->p.start_iter);
    cJSON_AddNumberToObject(o, "min_compression_rate", s->p.min_compression_rate);
    cJSON_AddBoolToObject(o, "use_error_feedback", s->p.use_error_feedback);
    cJSON_AddBoolToObject(o, "warm_start", s->p.warm_start);
    cJSON_AddNumberToObject(o, "orthogonalization_epsilon", (double)s->p.orthogonalization_epsilon);
    cJSON_AddNumberToObject(o, "random_seed", (double)s->p.random_seed);
    cJSON_AddNumberToObject(o, "iter", (double)s->iter);
    cJSON_AddNumberToObject(o, "draws", (double)s->draws);
    cJSON *g = cJSON_CreateArray(); /* the seed generator: its index, then its 624 words */
    cJSON_AddItemToObject(o, "seeder", g);
    cJSON_AddItemToArray(g, cJSON_CreateNumber(s->seeder.i));
    for (int i = 0; i < 624; i++)
        cJSON_AddItemToArray(g, cJSON_CreateNumber(s->seeder.s[i]));
    cJSON_AddNumberToObject(o, "numel_before", (double)s->before);
    cJSON_AddNumberToObject(o, "numel_after", (double)s->after);
    dt_status st = DT_OK;
    for (int k = 0; k < s->nb && st >= 0; k++) {
        const pbucket *pb = &s->b[k];
        if (pb->stage != ST_IDLE)
            st = dt_error(DT_ERR_STATE, "dt_powersgd_state_save: bucket %d is being reduced (wait for the step first)",
                          k);
        size_t nq;
        bucket_q(pb, s->p.warm_start, &nq);
        cJSON *b = cJSON_CreateObject();
        if (!b || !cJSON_AddItemToArray(bs, b)) {
            cJSON_Delete(b);
            st = dt_error(DT_ERR_NO_MEMORY, "dt_powersgd_state_save");
            break;
        }
        cJSON_AddNumberToObject(b, "numel", (double)pb->numel);
        cJSON_AddNumberToObject(b, "q", (double)nq);
        cJSON_AddBoolToObject(b, "error", pb->err != NULL);
    }
    char *text = st >= 0 ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (st < 0)
        return st;
    if (!text || !(*json = dt_alloc(strlen(text) + 1))) {
        cJSON_free(text);
        return dt_error(DT_ERR_NO_MEMORY, "dt_powersgd_state_save");
    }
    memcpy(*json, text, strlen(text) + 1);
    cJSON_free(text);
    return DT_OK;
}

dt_status dt_powersgd_state_array(dt_powersgd *s, int bucket, dt_powersgd_array which, float **data, size_t *n)
{
    if (!s || !data || !n)
        return dt_error(DT_ERR_NULL, "dt_powersgd_state_array: NULL argument");
    *data = NULL;
    *n = 0;
    if (bucket < 0 || bucket >= s->nb)
        return dt_error(DT_ERR_RANGE, "dt_powersgd_state_array: bucket %d (the state has %d)", bucket, s->nb);
    pbucket *pb = &s->b[bucket];
    if (which == DT_POWERSGD_Q) {
        *data = (float *)bucket_q(pb, s->p.warm_start, n);
    } else if (which == DT_POWERSGD_ERROR) {
        *data = pb->err;
        *n = pb->err ? pb->numel : 0;
    } else {
        return dt_error(DT_ERR_INVALID_ARG, "dt_powersgd_state_array: unknown array %d", (int)which);
    }
    if (!*data)
        *n = 0;
    return DT_OK;
}

/* A non-negative integer member (exact in a double). */
static dt_status json_count(const cJSON *o, const char *key, const char *what, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return dt_error(DT_ERR_FORMAT, "PowerSGD state: %s\"%s\" is missing or not a count", what, key);
    *out = (uint64_t)v->valuedouble;
    return DT_OK;
}

static dt_status json_flag(const cJSON *o, const char *key, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsBool(v))
        return dt_error(DT_ERR_FORMAT, "PowerSGD state: \"%s\" is missing or not true/false", key);
    *out = cJSON_IsTrue(v);
    return DT_OK;
}

static dt_status json_real(const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return dt_error(DT_ERR_FORMAT, "PowerSGD state: \"%s\" is missing or not a number", key);
    *out = v->valuedouble;
    return DT_OK;
}

dt_status dt_powersgd_state_load(dt_powersgd *s, const char *json, const size_t *bucket_numel, int nbuckets)
{
    if (!s || !json || (nbuckets > 0 && !bucket_numel))
        return dt_error(DT_ERR_NULL, "dt_powersgd_state_load: NULL argument");
    if (nbuckets < 0 || nbuckets > 1 << 20)
        return dt_error(DT_ERR_RANGE, "dt_powersgd_state_load: %d buckets", nbuckets);
    for (int k = 0; k < s->nb; k++)
        if (s->b[k].stage != ST_IDLE)
            return dt_error(DT_ERR_STATE, "dt_powersgd_state_load: bucket %d is being reduced", k);
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dt_error(DT_ERR_FORMAT, "PowerSGD state: not a JSON object");
    }
    dt_status st;
    uint64_t version = 0, rank = 0, iter = 0, draws = 0, before = 0, after = 0, seed = 0;
    bool ef = false, warm = false;
    double rate = 0, eps = 0;
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(o, "buckets");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "seeder");
    dt_torch_rng seeder;
    memset(&seeder, 0, sizeof seeder);
    if ((st = json_count(o, "version", "", &version)) < 0 || (st = json_count(o, "rank", "", &rank)) < 0 ||
        (st = json_count(o, "iter", "", &iter)) < 0 || (st = json_count(o, "draws", "", &draws)) < 0 ||
        (st = json_count(o, "numel_before", "", &before)) < 0 || (st = json_count(o, "numel_after", "", &after)) < 0 ||
        (st = json_count(o, "random_seed", "", &seed)) < 0 || (st = json_flag(o, "use_error_feedback", &ef)) < 0 ||
        (st = json_flag(o, "warm_start", &warm)) < 0 || (st = json_real(o, "min_compression_rate", &rate)) < 0 ||
        (st = json_real(o, "orthogonalization_epsilon", &eps)) < 0)
        goto out;
    if (version != 1) {
        st = dt_error(DT_ERR_UNSUPPORTED, "PowerSGD state version %llu (this build reads 1)",
                      (unsigned long long)version);
        goto out;
    }
    if (!cJSON_IsArray(bs)) {
        st = dt_error(DT_ERR_FORMAT, "PowerSGD state: \"buckets\" is missing or not an array");
        goto out;
    }
    if (!cJSON_IsArray(g) || cJSON_GetArraySize(g) != 625) {
        st = dt_error(DT_ERR_FORMAT, "PowerSGD state: \"seeder\" is missing or not 625 numbers");
        goto out;
    }
    for (int i = 0; i < 625; i++) {
        const cJSON *v = cJSON_GetArrayItem(g, i);
        const double lim = i == 0 ? 624.0 : 4294967295.0;
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= lim) ||
            v->valuedouble != (double)(uint32_t)v->valuedouble) {
            st = dt_error(DT_ERR_FORMAT, "PowerSGD state: \"seeder\"[%d] is not %s", i,
                          i == 0 ? "an index 0..624" : "a 32-bit word");
            goto out;
        }
        if (i == 0)
            seeder.i = (int)v->valuedouble;
        else
            seeder.s[i - 1] = (uint32_t)v->valuedouble;
    }
    /* what shapes the state must be this run's */
    if (rank != (uint64_t)s->p.rank)
        st = dt_error(DT_ERR_MISMATCH, "PowerSGD state: matrix approximation rank %llu in the checkpoint, %d in this "
                      "run (its P and Q have other shapes; resume with the same rank)",
                      (unsigned long long)rank, s->p.rank);
    else if (ef != s->p.use_error_feedback || warm != s->p.warm_start)
        st = dt_error(DT_ERR_MISMATCH, "PowerSGD state: %s %s in the checkpoint, %s in this run",
                      ef != s->p.use_error_feedback ? "error feedback" : "warm start",
                      (ef != s->p.use_error_feedback ? ef : warm) ? "on" : "off",
                      (ef != s->p.use_error_feedback ? s->p.use_error_feedback : s->p.warm_start) ? "on" : "off");
    else if (rate != s->p.min_compression_rate)
        st = dt_error(DT_ERR_MISMATCH, "PowerSGD state: min_compression_rate %g in the checkpoint, %g in this run",
                      rate, s->p.min_compression_rate);
    else if ((float)eps != s->p.orthogonalization_epsilon)
        st = dt_error(DT_ERR_MISMATCH, "PowerSGD state: orthogonalization_epsilon %g in the checkpoint, %g in this run",
                      eps, (double)s->p.orthogonalization_epsilon);
    else if (seed != s->p.random_seed)
        st = dt_error(DT_ERR_MISMATCH, "PowerSGD state: random_seed %llu in the checkpoint, %llu in this run",
                      (unsigned long long)seed, (unsigned long long)s->p.random_seed);
    if (st < 0)
        goto out;
    const int nb = cJSON_GetArraySize(bs);
    if (nb > 0 && nb != nbuckets) {
        st = dt_error(DT_ERR_MISMATCH, "PowerSGD state of %d gradient buckets in the checkpoint, %d in this run "
                      "(another model, or another bucket size: --bucket-mb / bucket_cap_mb)", nb, nbuckets);
        goto out;
    }
    uint64_t *numel = dt_calloc((size_t)(nb + 1) * 3 * sizeof *numel);
    if (!numel) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_powersgd_state_load");
        goto out;
    }
    for (int k = 0; k < nb && st >= 0; k++) {
        const cJSON *b = cJSON_GetArrayItem(bs, k);
        bool err = false;
        if (!cJSON_IsObject(b)) {
            st = dt_error(DT_ERR_FORMAT, "PowerSGD state: bucket %d is not an object", k);
        } else if ((st = json_count(b, "numel", "bucket ", &numel[3 * k])) >= 0 &&
                   (st = json_count(b, "q", "bucket ", &numel[3 * k + 1])) >= 0 &&
                   (st = json_flag(b, "error", &err)) >= 0) {
            numel[3 * k + 2] = err;
            if (numel[3 * k] != 0 && numel[3 * k] != bucket_numel[k])
                st = dt_error(DT_ERR_MISMATCH, "PowerSGD state: gradient bucket %d has %llu elements in the "
                              "checkpoint, %zu in this run (another model, or another bucket size)", k,
                              (unsigned long long)numel[3 * k], bucket_numel[k]);
            else if (err && (!ef || numel[3 * k] == 0))
                st = dt_error(DT_ERR_FORMAT, "PowerSGD state: bucket %d has error memory but %s", k,
                              ef ? "no size" : "error feedback is off");
            else if (numel[3 * k + 1] > ((size_t)1 << 40))
                st = dt_error(DT_ERR_FORMAT, "PowerSGD state: bucket %d: a Q of %llu elements", k,
                              (unsigned long long)numel[3 * k + 1]);
        }
    }
    /* a fresh state, then the saved sizes (the caller fills the arrays) */
    if (st >= 0) {
        for (int k = 0; k < s->nb; k++)
            bucket_release(&s->b[k]);
        dt_free(s->b);
        s->b = NULL;
        s->nb = 0;
        st = ensure_buckets(s, nb);
    }
    for (int k = 0; k < nb && st >= 0; k++) {
        pbucket *pb = &s->b[k];
        if (numel[3 * k + 1] && !(pb->preset = dt_calloc((size_t)(numel[3 * k + 1] + 1) * sizeof(float))))
            st = dt_error(DT_ERR_NO_MEMORY, "PowerSGD state: Q of bucket %d", k);
        pb->preset_n = (size_t)numel[3 * k + 1];
        pb->numel = (size_t)numel[3 * k];
        if (st >= 0 && numel[3 * k + 2] && !(pb->err = dt_calloc((size_t)numel[3 * k] * sizeof(float))))
            st = dt_error(DT_ERR_NO_MEMORY, "PowerSGD state: error memory of bucket %d", k);
    }
    dt_free(numel);
    if (st >= 0) {
        s->iter = (int64_t)iter;
        s->before = before;
        s->after = after;
        s->seeder = seeder;
        s->draws = draws;
    }
out:
    cJSON_Delete(o);
    return st;
}

int64_t dt_powersgd_iter(const dt_powersgd *s) { return s ? s->iter : 0; }
