/* Samplers (sequential, random, distributed) and the batch sampler.
 *
 * The random and distributed samplers share one permutation: Philox keyed by
 * (seed + epoch, DT_RNG_SHUFFLE) through dt_rng_permutation (PyTorch's
 * seed + epoch contract), or with DT_SHUFFLE_TORCH torch.randperm's numbers
 * (dt_torch_randperm, generator seeded with seed + epoch), so the distributed sampler at W = 1 yields exactly
 * the random sampler's order and a one-rank run equals a plain run. */
#include "dtrain/data.h"

#include <stdlib.h>
#include <string.h>

struct dt_sampler {
    const dt_sampler_vtable *vt;
    void *self;
    int64_t epoch;
};

dt_status dt_sampler_init(const dt_sampler_vtable *vt, void *self, dt_sampler **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_sampler_init: out is NULL");
    *out = NULL;
    if (!vt || vt->version != DT_SAMPLER_VTABLE_VERSION || !vt->length || !vt->indices)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_sampler_init: vtable missing, of the wrong version, or lacking a "
                        "required slot (length, indices)");
    dt_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_sampler_init: out of memory");
    s->vt = vt;
    s->self = self;
    *out = s;
    return DT_OK;
}

void dt_sampler_free(dt_sampler *s)
{
    if (!s)
        return;
    if (s->vt->free)
        s->vt->free(s->self);
    free(s);
}

int64_t dt_sampler_length(const dt_sampler *s) { return s ? s->vt->length(s->self) : 0; }
void dt_sampler_set_epoch(dt_sampler *s, int64_t epoch)
{
    if (s)
        s->epoch = epoch;
}
int64_t dt_sampler_get_epoch(const dt_sampler *s) { return s ? s->epoch : 0; }

dt_status dt_sampler_indices(dt_sampler *s, int64_t epoch, int64_t *out)
{
    if (!s || (!out && s->vt->length(s->self) > 0))
        return dt_error(DT_ERR_INVALID_ARG, "dt_sampler_indices: NULL argument");
    if (epoch < 0)
        return dt_error(DT_ERR_RANGE, "sampler: epoch %lld is negative", (long long)epoch);
    return s->vt->indices(s->self, epoch, out);
}

dt_status dt_sampler_indices_current(dt_sampler *s, int64_t *out)
{
    return dt_sampler_indices(s, s ? s->epoch : 0, out);
}

/* ---- sequential and random ----------------------------------------------- */
typedef struct {
    int64_t n;
    uint64_t seed;
    bool shuffle;
    dt_shuffle_rng rng;
} simple;

static dt_status shuffled(dt_shuffle_rng rng, uint64_t seed, int64_t epoch, int64_t *out, int64_t n)
{
    if (rng == DT_SHUFFLE_TORCH)
        return dt_torch_randperm(seed + (uint64_t)epoch, out, n);
    return dt_rng_permutation(dt_rng_key_make(seed + (uint64_t)epoch, DT_RNG_SHUFFLE, 0, 0), out, n);
}

static int64_t simple_length(void *self) { return ((simple *)self)->n; }

static dt_status simple_indices(void *self, int64_t epoch, int64_t *out)
{
    simple *s = self;
    if (!s->shuffle) {
        for (int64_t i = 0; i < s->n; i++)
            out[i] = i;
        return DT_OK;
    }
    return shuffled(s->rng, s->seed, epoch, out, s->n);
}

static void simple_free(void *self) { free(self); }

static const dt_sampler_vtable sequential_vt = {
    .version = DT_SAMPLER_VTABLE_VERSION,
    .name = "sequential",
    .length = simple_length,
    .indices = simple_indices,
    .free = simple_free,
};
static const dt_sampler_vtable random_vt = {
    .version = DT_SAMPLER_VTABLE_VERSION,
    .name = "random",
    .length = simple_length,
    .indices = simple_indices,
    .free = simple_free,
};

static dt_status simple_init(int64_t n, uint64_t seed, bool shuffle, dt_shuffle_rng rng, dt_sampler **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "sampler: out is NULL");
    *out = NULL;
    if (n < 0)
        return dt_error(DT_ERR_INVALID_ARG, "sampler: length %lld is negative", (long long)n);
    if (rng != DT_SHUFFLE_PHILOX && rng != DT_SHUFFLE_TORCH)
        return dt_error(DT_ERR_INVALID_ARG, "sampler: unknown shuffle generator %d", (int)rng);
    simple *s = malloc(sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "sampler: out of memory");
    s->n = n;
    s->seed = seed;
    s->shuffle = shuffle;
    s->rng = rng;
    dt_status st = dt_sampler_init(shuffle ? &random_vt : &sequential_vt, s, out);
    if (st < 0)
        free(s);
    return st;
}

dt_status dt_sampler_sequential_init(int64_t n, dt_sampler **out)
{
    return simple_init(n, 0, false, DT_SHUFFLE_PHILOX, out);
}
dt_status dt_sampler_random_init(int64_t n, uint64_t seed, dt_sampler **out)
{
    return simple_init(n, seed, true, DT_SHUFFLE_PHILOX, out);
}
dt_status dt_sampler_random_init_rng(int64_t n, uint64_t seed, dt_shuffle_rng rng, dt_sampler **out)
{
    return simple_init(n, seed, true, rng, out);
}

/* ---- distributed ------------------------------------------------------------ */
typedef struct {
    dt_distributed_sampler_params p;
    int64_t num_samples, total_size;
    int64_t *perm; /* scratch: the full list for an epoch (N entries) */
} distsampler;

dt_distributed_sampler_params dt_distributed_sampler_params_default(void)
{
    dt_distributed_sampler_params p = {
        .length = 0, .world_size = 1, .rank = 0, .shuffle = true, .seed = 0, .drop_last = false,
        .rng = DT_SHUFFLE_PHILOX};
    return p;
}

static int64_t dist_length(void *self) { return ((distsampler *)self)->num_samples; }

static dt_status dist_indices(void *self, int64_t epoch, int64_t *out)
{
    distsampler *d = self;
    int64_t N = d->p.length, W = d->p.world_size, r = d->p.rank;
    if (d->num_samples == 0)
        return DT_OK;
    if (d->p.shuffle) {
        dt_status st = shuffled(d->p.rng, d->p.seed, epoch, d->perm, N);
        if (st < 0)
            return st;
    } else {
        for (int64_t i = 0; i < N; i++)
            d->perm[i] = i;
    }
    /* Position q of the padded (or truncated) list is perm[q mod N]: padding
     * repeats the list from its head as often as needed. Rank r takes
     * positions r, r + W, ..., all below total_size. */
    for (int64_t k = 0; k < d->num_samples; k++)
        out[k] = d->perm[(r + k * W) % N];
    return DT_OK;
}

static void dist_free(void *self)
{
    distsampler *d = self;
    free(d->perm);
    free(d);
}

static const dt_sampler_vtable distributed_vt = {
    .version = DT_SAMPLER_VTABLE_VERSION,
    .name = "distributed",
    .length = dist_length,
    .indices = dist_indices,
    .free = dist_free,
};

dt_status dt_sampler_distributed_init(const dt_distributed_sampler_params *p, dt_sampler **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "distributed sampler: out is NULL");
    *out = NULL;
    if (!p)
        return dt_error(DT_ERR_INVALID_ARG, "distributed sampler: params is NULL");
    if (p->length < 0)
        return dt_error(DT_ERR_INVALID_ARG, "distributed sampler: length %lld is negative",
                        (long long)p->length);
    if (p->world_size < 1)
        return dt_error(DT_ERR_INVALID_ARG, "distributed sampler: world size %d < 1", p->world_size);
    if (p->rank < 0 || p->rank >= p->world_size)
        return dt_error(DT_ERR_INVALID_ARG, "distributed sampler: rank %d outside [0, %d)", p->rank,
                        p->world_size);
    if (p->rng != DT_SHUFFLE_PHILOX && p->rng != DT_SHUFFLE_TORCH)
        return dt_error(DT_ERR_INVALID_ARG, "distributed sampler: unknown shuffle generator %d", (int)p->rng);
    distsampler *d = calloc(1, sizeof *d);
    if (!d)
        return dt_error(DT_ERR_NO_MEMORY, "distributed sampler: out of memory");
    d->p = *p;
    int64_t N = p->length, W = p->world_size;
    if (p->drop_last && N % W != 0)
        d->num_samples = N / W; /* = ceil((N - W) / W) */
    else
        d->num_samples = (N + W - 1) / W;
    if (N == 0)
        d->num_samples = 0; /* nothing to wrap around */
    d->total_size = d->num_samples * W;
    d->perm = malloc((size_t)(N > 0 ? N : 1) * sizeof *d->perm);
    if (!d->perm) {
        free(d);
        return dt_error(DT_ERR_NO_MEMORY, "distributed sampler: out of memory");
    }
    dt_status st = dt_sampler_init(&distributed_vt, d, out);
    if (st < 0)
        dist_free(d);
    return st;
}

/* ---- batch sampler ------------------------------------------------------------ */
struct dt_batch_sampler {
    dt_sampler *s;
    int64_t batch, n, nbatches;
    bool drop_last;
    int64_t *idx; /* the epoch's indices */
};

dt_status dt_batch_sampler_init(dt_sampler *s, int64_t batch_size, bool drop_last,
                                dt_batch_sampler **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "batch sampler: out is NULL");
    *out = NULL;
    if (!s)
        return dt_error(DT_ERR_INVALID_ARG, "batch sampler: sampler is NULL");
    if (batch_size < 1)
        return dt_error(DT_ERR_INVALID_ARG, "batch sampler: batch size %lld < 1", (long long)batch_size);
    dt_batch_sampler *bs = calloc(1, sizeof *bs);
    if (!bs)
        return dt_error(DT_ERR_NO_MEMORY, "batch sampler: out of memory");
    bs->s = s;
    bs->batch = batch_size;
    bs->drop_last = drop_last;
    bs->n = dt_sampler_length(s);
    bs->nbatches = drop_last ? bs->n / batch_size : (bs->n + batch_size - 1) / batch_size;
    bs->idx = malloc((size_t)(bs->n > 0 ? bs->n : 1) * sizeof *bs->idx);
    if (!bs->idx) {
        free(bs);
        return dt_error(DT_ERR_NO_MEMORY, "batch sampler: out of memory");
    }
    *out = bs;
    return DT_OK;
}

void dt_batch_sampler_free(dt_batch_sampler *bs)
{
    if (!bs)
        return;
    free(bs->idx);
    free(bs);
}

int64_t dt_batch_sampler_length(const dt_batch_sampler *bs) { return bs ? bs->nbatches : 0; }

dt_status dt_batch_sampler_set_epoch(dt_batch_sampler *bs, int64_t epoch)
{
    if (!bs)
        return dt_error(DT_ERR_INVALID_ARG, "batch sampler: NULL");
    dt_sampler_set_epoch(bs->s, epoch);
    return dt_sampler_indices(bs->s, epoch, bs->idx);
}

dt_status dt_batch_sampler_get(const dt_batch_sampler *bs, int64_t b, const int64_t **idx, int64_t *n)
{
    if (!bs || !idx || !n)
        return dt_error(DT_ERR_INVALID_ARG, "batch sampler: NULL argument");
    if (b < 0 || b >= bs->nbatches)
        return dt_error(DT_ERR_RANGE, "batch sampler: batch %lld outside [0, %lld)", (long long)b,
                        (long long)bs->nbatches);
    int64_t lo = b * bs->batch, hi = lo + bs->batch;
    if (hi > bs->n)
        hi = bs->n;
    *idx = bs->idx + lo;
    *n = hi - lo;
    return DT_OK;
}
