/* dt_trainer_prepare (train.h): the warm-up before the first step.
 *
 * It leaves no trace: N steps after it give bit-identical parameters,
 * model buffers (batch-norm running statistics) and random-stream counters
 * (dropout) to N steps without it. And it does what it is for, counted, not
 * timed: the first step after it creates no oneDNN primitive
 * (dt_k_stats.primitives_created) and neither grows nor replaces the
 * context's arena (dt_arena_capacity), where without it the first step
 * does both. And the steps after it take no page fault: their memory is
 * sized once and reused (getrusage's minor faults over steady steps: 0).
 * Models: the ConvNet (batch norm) and gpt-micro with dropout, one
 * process. */
// dt-test-timeout: 300
#include "test.h"

#include "dtrain/dtrain.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct {
    dt_model *m;
    dt_model_desc desc;
    dt_trainer *tr;
    void *x;
    int64_t *y;
    dt_trainer_batch b;
} rig;

static void rig_make(rig *r, const char *name, long batch)
{
    memset(r, 0, sizeof *r);
    dt_model_config cfg = dt_model_config_default();
    cfg.seq = 16;
    cfg.dropout = 0.1f; /* GPT: dropout draws from the modules' counters */
    cfg.fused_lm_loss = true;
    ASSERT_OK(dt_model_create(name, 7, &cfg, &r->m, &r->desc));
    int nd, tnd;
    int64_t sh[DT_MAX_DIMS], tsh[DT_MAX_DIMS];
    dt_dtype tdt;
    ASSERT_OK(dt_model_desc_shapes(&r->desc, batch, &nd, sh, &tnd, tsh, &tdt));
    size_t nx = 1, ny = 1;
    for (int i = 0; i < nd; i++)
        nx *= (size_t)sh[i];
    for (int i = 0; i < tnd; i++)
        ny *= (size_t)tsh[i];
    bool tokens = r->desc.input_dtype == DT_I64;
    r->x = calloc(nx, 8);
    r->y = calloc(ny, sizeof *r->y);
    ASSERT(r->x && r->y);
    for (size_t i = 0; i < nx; i++) {
        if (tokens)
            ((int64_t *)r->x)[i] = (int64_t)((i * 7919u) % (size_t)r->desc.input_classes);
        else
            ((float *)r->x)[i] = (float)((int)(i * 37u % 101u) - 50) / 50.0f;
    }
    int64_t ncls = r->desc.num_classes > 0 ? r->desc.num_classes : 10;
    for (size_t i = 0; i < ny; i++)
        r->y[i] = (int64_t)((i * 31u + 1u) % (size_t)ncls);
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    if (tokens) {
        tp.optimizer = DT_OPTIM_ADAMW;
        tp.adamw.lr = 1e-3;
    } else {
        tp.sgd.lr = 0.05;
    }
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = &r->desc;
    ASSERT_OK(dt_trainer_init(r->m, s, &tp, &r->tr));
    r->b = dt_trainer_batch_make(r->x, r->desc.input_dtype, nd, sh, tnd ? r->y : NULL, tdt, tnd, tsh);
}

static void rig_free(rig *r)
{
    dt_trainer_free(r->tr);
    dt_model_free(r->m);
    free(r->x);
    free(r->y);
}

/* The bytes of a model's flats of one role (every dtype), concatenated. */
static unsigned char *flats_copy(const dt_model *m, dt_flat_role role, size_t *n)
{
    *n = 0;
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *f = dt_model_flat(m, role, (dt_dtype)d);
        if (f && f->base)
            *n += dt_flat_nbytes(f);
    }
    unsigned char *c = malloc(*n ? *n : 1), *p = c;
    if (!c)
        return NULL;
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *f = dt_model_flat(m, role, (dt_dtype)d);
        if (f && f->base) {
            memcpy(p, f->base, dt_flat_nbytes(f));
            p += dt_flat_nbytes(f);
        }
    }
    return c;
}

static void same_flats(const dt_model *a, const dt_model *b, dt_flat_role role, const char *what)
{
    size_t na, nb;
    unsigned char *ca = flats_copy(a, role, &na), *cb = flats_copy(b, role, &nb);
    bool same = ca && cb && na == nb && !memcmp(ca, cb, na);
    free(ca);
    free(cb);
    if (!same)
        TEST_FAIL_("%s differ after the same steps with and without dt_trainer_prepare", what);
}

static void no_trace(const char *name, long batch)
{
    dt_set_num_threads(2);
    rig a, b;
    rig_make(&a, name, batch);
    if (dt_test_failed_)
        return;
    rig_make(&b, name, batch);
    if (dt_test_failed_)
        return;
    bool ran = false;
    ASSERT_OK(dt_trainer_prepare(b.tr, &b.b, &ran));
    ASSERT(ran);
    ASSERT_EQ_INT(dt_trainer_steps(b.tr), 0);
    double la[3], lb[3];
    for (int s = 0; s < 3; s++) {
        dt_trainer_metrics ra, rb;
        ASSERT_OK(dt_trainer_step(a.tr, &a.b, 1, &ra));
        ASSERT_OK(dt_trainer_step(b.tr, &b.b, 1, &rb));
        la[s] = ra.loss;
        lb[s] = rb.loss;
        ASSERT_EQ_INT(rb.step, s);
    }
    ASSERT(!memcmp(la, lb, sizeof la));
    same_flats(a.m, b.m, DT_FLAT_PARAMS, "parameters");
    same_flats(a.m, b.m, DT_FLAT_BUFFERS, "buffers");
    size_t n = dt_model_rng_state_size(a.m);
    uint64_t *ra = calloc(n + 1, sizeof *ra), *rb = calloc(n + 1, sizeof *rb);
    ASSERT(ra && rb);
    ASSERT_OK(dt_model_get_rng_state(a.m, ra, n));
    ASSERT_OK(dt_model_get_rng_state(b.m, rb, n));
    ASSERT(!memcmp(ra, rb, n * sizeof *ra));
    free(ra);
    free(rb);
    rig_free(&a);
    rig_free(&b);
}

TEST(no_trace_convnet) { no_trace("convnet", 8); }
TEST(no_trace_gpt_with_dropout) { no_trace("gpt-micro", 4); }

/* The first step's new primitives and arena change, with or without the
 * warm-up before it. */
static void first_step_counts(const char *name, long batch, bool prepare, uint64_t *prims, bool *arena_changed)
{
    dt_set_num_threads(2);
    rig r;
    rig_make(&r, name, batch);
    if (dt_test_failed_)
        return;
    dt_k_cache_clear(); /* the primitive cache is the process's: start from none */
    if (prepare)
        ASSERT_OK(dt_trainer_prepare(r.tr, &r.b, NULL));
    dt_arena *ar = dt_ctx_arena(dt_trainer_ctx(r.tr));
    size_t cap = dt_arena_capacity(ar);
    dt_k_stats_reset();
    ASSERT_OK(dt_trainer_step(r.tr, &r.b, 1, NULL));
    dt_k_stats st;
    dt_k_stats_get(&st);
    *prims = st.primitives_created;
    *arena_changed = dt_arena_capacity(ar) != cap;
    if (prepare) { /* and so on: the second step as the first */
        cap = dt_arena_capacity(ar);
        dt_k_stats_reset();
        ASSERT_OK(dt_trainer_step(r.tr, &r.b, 1, NULL));
        dt_k_stats_get(&st);
        ASSERT_EQ_INT(st.primitives_created, 0);
        ASSERT(dt_arena_capacity(ar) == cap);
    }
    rig_free(&r);
}

static void first_step_as_later(const char *name, long batch)
{
    uint64_t prims;
    bool changed;
    first_step_counts(name, batch, false, &prims, &changed);
    if (dt_test_failed_)
        return;
    ASSERT(prims > 0); /* the counters see what the first step does alone */
    ASSERT(changed);
    first_step_counts(name, batch, true, &prims, &changed);
    if (dt_test_failed_)
        return;
    ASSERT_EQ_INT(prims, 0);
    ASSERT(!changed);
}

TEST(first_step_creates_nothing_convnet) { first_step_as_later("convnet", 8); }
TEST(first_step_creates_nothing_gpt) { first_step_as_later("gpt-micro", 4); }

/* Under AddressSanitizer every access also touches lazily mapped shadow
 * memory, whose faults count too, and its quarantine hands out fresh
 * memory: the fault counts are checked (and these tests built) in plain
 * builds only. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COUNTS_FAULTS 0
#else
#define COUNTS_FAULTS 1
#endif

#if COUNTS_FAULTS
static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* After the warm-up and two steps, five more steps fault no page in: the
 * arena, the workspaces and the gradient and optimizer buffers are reused,
 * nothing is returned to the system and taken back each step. Counted, not
 * timed. The kernel may itself move a few of the process's pages while
 * other processes press on memory (compaction, huge-page collapse), which
 * faults them in again once: so up to three windows of five steps are
 * counted and one must see no fault (a step that faults each time faults
 * in every window). */
static void steady_steps_fault_nothing(const char *name, long batch)
{
    dt_set_num_threads(2);
    rig r;
    rig_make(&r, name, batch);
    if (dt_test_failed_)
        return;
    ASSERT_OK(dt_trainer_prepare(r.tr, &r.b, NULL));
    for (int i = 0; i < 2; i++)
        ASSERT_OK(dt_trainer_step(r.tr, &r.b, 1, NULL));
    long f = -1;
    for (int w = 0; w < 3 && f != 0; w++) {
        long f0 = minor_faults();
        for (int i = 0; i < 5; i++)
            ASSERT_OK(dt_trainer_step(r.tr, &r.b, 1, NULL));
        f = minor_faults() - f0;
        if (f != 0)
            fprintf(stderr, "%s: %ld minor page faults over 5 steady steps (window %d of 3)\n", name, f, w + 1);
    }
    if (f != 0)
        TEST_FAIL_("%s: minor page faults in each of 3 windows of 5 steady steps (0 expected)", name);
    rig_free(&r);
}

TEST(steady_steps_fault_nothing_convnet) { steady_steps_fault_nothing("convnet", 32); }
TEST(steady_steps_fault_nothing_gpt) { steady_steps_fault_nothing("gpt-micro", 4); }
#endif

TEST(bad_arguments)
{
    rig r;
    rig_make(&r, "convnet", 2);
    if (dt_test_failed_)
        return;
    ASSERT(dt_trainer_prepare(NULL, &r.b, NULL) == DT_ERR_NULL);
    ASSERT(dt_trainer_prepare(r.tr, NULL, NULL) == DT_ERR_NULL);
    rig_free(&r);
}

int main(void)
{
    RUN(no_trace_convnet);
    RUN(no_trace_gpt_with_dropout);
    RUN(first_step_creates_nothing_convnet);
    RUN(first_step_creates_nothing_gpt);
#if COUNTS_FAULTS
    RUN(steady_steps_fault_nothing_convnet);
    RUN(steady_steps_fault_nothing_gpt);
#endif
    RUN(bad_arguments);
    return TEST_REPORT();
}
