/* The tape: grad-ready hooks (order and timing), marks, accumulation across
 * backward calls, no-grad mode, custom ops, replaceable gradient buffers,
 * arena reuse across steps, determinism. */
#include "dtrain/autograd.h"
#include "test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* A 3-layer MLP whose parameters live in one flat buffer (as nn does it). */
typedef struct {
    float *P, *G;
    dt_tensor *w[3], *b[3];
    int64_t n;
} mlp;

static void mlp_init(mlp *m)
{
    const int64_t dims[4] = {6, 8, 7, 3};
    int64_t off = 0, offs[6];
    for (int l = 0; l < 3; l++) {
        offs[2 * l] = off;
        off += dims[l + 1] * dims[l];
        offs[2 * l + 1] = off;
        off += dims[l + 1];
    }
    m->n = off;
    m->P = dt_calloc((size_t)off * 4);
    m->G = dt_calloc((size_t)off * 4);
    dt_rng_fill_normal(dt_rng_key_make(1, DT_RNG_INIT, 0, 0), 0, m->P, (size_t)off, 0, 0.5f);
    for (int l = 0; l < 3; l++) {
        int64_t ws[2] = {dims[l + 1], dims[l]};
        m->w[l] = dt_tensor_wrap(m->P + offs[2 * l], DT_F32, 2, ws);
        m->b[l] = dt_tensor_wrap(m->P + offs[2 * l + 1], DT_F32, 1, &ws[0]);
        dt_tensor_set_grad(m->w[l], dt_tensor_wrap(m->G + offs[2 * l], DT_F32, 2, ws));
        dt_tensor_set_grad(m->b[l], dt_tensor_wrap(m->G + offs[2 * l + 1], DT_F32, 1, &ws[0]));
    }
}

static void mlp_free(mlp *m)
{
    for (int l = 0; l < 3; l++) {
        dt_tensor_free(m->w[l]->grad);
        dt_tensor_free(m->b[l]->grad);
        dt_tensor_free(m->w[l]);
        dt_tensor_free(m->b[l]);
    }
    dt_free(m->P);
    dt_free(m->G);
}

static float xdata[4 * 6];
static int64_t ydata[4] = {0, 2, 1, 2};

static dt_tensor *mlp_loss(dt_ctx *ctx, mlp *m)
{
    dt_rng_fill_normal(dt_rng_key_make(2, DT_RNG_DATA, 0, 0), 0, xdata, 24, 0, 1);
    dt_tensor *h = dt_tensor_view_of(ctx, xdata, DT_F32, 2, SH(4, 6));
    for (int l = 0; l < 3; l++) {
        h = dt_linear(ctx, h, m->w[l], m->b[l]);
        if (l < 2)
            h = dt_gelu(ctx, h);
    }
    return dt_cross_entropy(ctx, h, dt_tensor_view_of(ctx, ydata, DT_I64, 1, SH(4)));
}

/* Hook log: which tensor fired, and how many tape nodes backward had still
 * to process at that moment (via a mark at the very start of the tape). */
typedef struct {
    dt_tensor *who[16];
    int n;
    int mark_seen_at; /* number of hooks fired when the first mark ran */
    int end_mark_at;
} hook_log;

static dt_status on_ready(dt_tensor *t, void *ud)
{
    hook_log *log = ud;
    /* the gradient must be complete: non-zero somewhere */
    float s = 0;
    for (int64_t i = 0; i < dt_tensor_numel(t->grad); i++)
        s += fabsf(((float *)t->grad->data)[i]);
    if (s == 0.0f)
        return dt_error(DT_ERR_STATE, "hook fired with an empty gradient");
    log->who[log->n++] = t;
    return DT_OK;
}

static dt_status on_mark_start(dt_ctx *ctx, void *ud)
{
    (void)ctx;
    hook_log *log = ud;
    log->mark_seen_at = log->n;
    return DT_OK;
}

static dt_status on_mark_end(dt_ctx *ctx, void *ud)
{
    (void)ctx;
    hook_log *log = ud;
    log->end_mark_at = log->n;
    return DT_OK;
}

TEST(grad_ready_hooks_fire_early_in_reverse_layer_order)
{
    mlp m;
    mlp_init(&m);
    hook_log log = {.n = 0, .mark_seen_at = -1, .end_mark_at = -1};
    for (int l = 0; l < 3; l++) {
        ASSERT_OK(dt_ag_add_grad_hook(m.w[l], on_ready, &log));
        ASSERT_OK(dt_ag_add_grad_hook(m.b[l], on_ready, &log));
    }
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    ASSERT_OK(dt_ag_mark(ctx, on_mark_start, &log)); /* before the forward */
    dt_tensor *loss = mlp_loss(ctx, &m);
    ASSERT(loss);
    ASSERT_OK(dt_ag_mark(ctx, on_mark_end, &log)); /* after: not reached from the loss */
    ASSERT_OK(dt_backward(ctx, loss));
    ASSERT_EQ_INT(log.n, 6);
    /* last layer first: w2,b2 (one node: linear), then layer 1, then layer 0 */
    ASSERT(log.who[0] == m.w[2] || log.who[0] == m.b[2]);
    ASSERT(log.who[1] == m.w[2] || log.who[1] == m.b[2]);
    ASSERT(log.who[2] == m.w[1] || log.who[2] == m.b[1]);
    ASSERT(log.who[4] == m.w[0] || log.who[4] == m.b[0]);
    /* the start-of-tape mark runs after every hook: all fired before the end */
    ASSERT_EQ_INT(log.mark_seen_at, 6);
    /* marks recorded after the loss are never reached */
    ASSERT_EQ_INT(log.end_mark_at, -1);
    dt_ctx_free(ctx);
    mlp_free(&m);
}

/* A hook must see its leaf complete even when it is used twice: fires after
 * the EARLIER (in forward order) use is processed, once. */
typedef struct { int fired; float seen; } twice_log;
static dt_status on_twice(dt_tensor *t, void *ud)
{
    twice_log *l = ud;
    l->fired++;
    l->seen = ((float *)t->grad->data)[0];
    return DT_OK;
}
typedef struct { twice_log *l; int fired_at_mark; } mark_probe;
static dt_status probe(dt_ctx *ctx, void *ud)
{
    (void)ctx;
    mark_probe *p = ud;
    p->fired_at_mark = p->l->fired;
    return DT_OK;
}

TEST(hook_waits_for_all_uses)
{
    dt_tensor *w = dt_tensor_new(DT_F32, 1, SH(1));
    ((float *)w->data)[0] = 3.0f;
    dt_tensor_set_requires_grad(w, true);
    twice_log l = {0, 0};
    ASSERT_OK(dt_ag_add_grad_hook(w, on_twice, &l));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_tensor *a = dt_scale(ctx, w, 2.0f); /* use 1 */
    mark_probe p = {&l, -1};
    ASSERT_OK(dt_ag_mark(ctx, probe, &p)); /* between the uses */
    dt_tensor *b = dt_mul(ctx, w, w);      /* use 2 and 3 */
    dt_tensor *loss = dt_sum(ctx, dt_add(ctx, a, b));
    ASSERT_OK(dt_backward(ctx, loss));
    ASSERT_EQ_INT(p.fired_at_mark, 0); /* not yet complete at the mark */
    ASSERT_EQ_INT(l.fired, 1);
    ASSERT_NEAR(l.seen, 2.0 + 2 * 3.0, 1e-6, 0); /* d/dw (2w + w^2) */
    dt_ctx_free(ctx);
    dt_tensor_free(w);
}

/* Marks between layers: when backward reaches the mark recorded after
 * layer l's forward, the hooks of layers > l have fired and those of
 * layers <= l have not (DDP can post the last buckets while the rest of
 * backward still runs). */
typedef struct { int n; hook_log *log; } layer_slot;
static dt_status layer_mark(dt_ctx *ctx, void *ud)
{
    (void)ctx;
    layer_slot *slot = ud;
    slot->n = slot->log->n;
    return DT_OK;
}

TEST(hooks_fire_before_backward_reaches_earlier_layers)
{
    mlp m;
    mlp_init(&m);
    hook_log log = {.n = 0};
    for (int l = 0; l < 3; l++) {
        ASSERT_OK(dt_ag_add_grad_hook(m.w[l], on_ready, &log));
        ASSERT_OK(dt_ag_add_grad_hook(m.b[l], on_ready, &log));
    }
    /* slot[l].n = hooks fired when the mark after layer l ran */
    layer_slot slot[3];
    for (int l = 0; l < 3; l++) {
        slot[l].n = -1;
        slot[l].log = &log;
    }
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_rng_fill_normal(dt_rng_key_make(2, DT_RNG_DATA, 0, 0), 0, xdata, 24, 0, 1);
    dt_tensor *h = dt_tensor_view_of(ctx, xdata, DT_F32, 2, SH(4, 6));
    for (int l = 0; l < 3; l++) {
        h = dt_linear(ctx, h, m.w[l], m.b[l]);
        if (l < 2)
            h = dt_relu(ctx, h);
        ASSERT_OK(dt_ag_mark(ctx, layer_mark, &slot[l]));
    }
    dt_tensor *loss = dt_cross_entropy(ctx, h, dt_tensor_view_of(ctx, ydata, DT_I64, 1, SH(4)));
    ASSERT_OK(dt_backward(ctx, loss));
    ASSERT_EQ_INT(slot[2].n, 0); /* after layer 2's forward: nothing done yet */
    ASSERT_EQ_INT(slot[1].n, 2); /* layer 2's params complete */
    ASSERT_EQ_INT(slot[0].n, 4); /* layers 2 and 1 complete, layer 0 not */
    ASSERT_EQ_INT(log.n, 6);
    dt_ctx_free(ctx);
    mlp_free(&m);
}

TEST(accumulation_across_two_backwards)
{
    mlp m;
    mlp_init(&m);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    ASSERT_OK(dt_backward(ctx, mlp_loss(ctx, &m)));
    float *g1 = malloc((size_t)m.n * 4);
    memcpy(g1, m.G, (size_t)m.n * 4);
    dt_ctx_reset(ctx);
    ASSERT_OK(dt_backward(ctx, mlp_loss(ctx, &m))); /* no zero_grad: adds */
    for (int64_t i = 0; i < m.n; i++)
        ASSERT_NEAR(m.G[i], 2 * g1[i], 1e-6, 1e-6);
    /* twice over the SAME tape also accumulates */
    dt_ctx_reset(ctx);
    memset(m.G, 0, (size_t)m.n * 4);
    dt_tensor *loss = mlp_loss(ctx, &m);
    ASSERT_OK(dt_backward(ctx, loss));
    ASSERT_OK(dt_backward(ctx, loss));
    for (int64_t i = 0; i < m.n; i++)
        ASSERT_NEAR(m.G[i], 2 * g1[i], 1e-6, 1e-6);
    /* zero_grad */
    for (int l = 0; l < 3; l++)
        ASSERT_OK(dt_ag_zero_grad(m.w[l]));
    ASSERT_NEAR(m.G[0], 0, 0, 0);
    free(g1);
    dt_ctx_free(ctx);
    mlp_free(&m);
}

TEST(replaced_grad_buffer_receives_gradients)
{
    mlp m;
    mlp_init(&m);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    ASSERT_OK(dt_backward(ctx, mlp_loss(ctx, &m)));
    float *ref = malloc((size_t)m.n * 4);
    memcpy(ref, m.G, (size_t)m.n * 4);
    /* hand in other memory for the whole flat grad buffer (DDP does this) */
    float *G2 = dt_calloc((size_t)m.n * 4);
    for (int l = 0; l < 3; l++) {
        ASSERT_OK(dt_tensor_rebind(m.w[l]->grad, G2 + ((float *)m.w[l]->grad->data - m.G)));
        ASSERT_OK(dt_tensor_rebind(m.b[l]->grad, G2 + ((float *)m.b[l]->grad->data - m.G)));
    }
    memset(m.G, 0, (size_t)m.n * 4);
    dt_ctx_reset(ctx);
    ASSERT_OK(dt_backward(ctx, mlp_loss(ctx, &m)));
    for (int64_t i = 0; i < m.n; i++) {
        ASSERT_NEAR(G2[i], ref[i], 0, 0);
        ASSERT_NEAR(m.G[i], 0, 0, 0);
    }
    free(ref);
    dt_free(G2);
    dt_ctx_free(ctx);
    mlp_free(&m);
}

TEST(no_grad_records_nothing)
{
    mlp m;
    mlp_init(&m);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    ASSERT(dt_ag_enabled(ctx));
    ASSERT(dt_ag_set_enabled(ctx, false) == true);
    dt_tensor *loss = mlp_loss(ctx, &m);
    ASSERT(loss);
    ASSERT_EQ_INT(dt_ag_tape_len(ctx), 0);
    ASSERT(!(loss->flags & DT_TENSOR_REQUIRES_GRAD));
    ASSERT_OK(dt_ag_mark(ctx, on_mark_end, NULL)); /* ignored in no-grad */
    ASSERT_EQ_INT(dt_ag_tape_len(ctx), 0);
    ASSERT_STATUS(dt_backward(ctx, loss), DT_ERR_STATE);
    ASSERT_STR_CONTAINS(dt_last_error(), "does not require grad");
    float l0 = dt_tensor_item(loss);
    dt_ag_set_enabled(ctx, true);
    dt_ctx_reset(ctx);
    dt_tensor *loss2 = mlp_loss(ctx, &m);
    ASSERT(dt_ag_tape_len(ctx) > 0);
    ASSERT_NEAR(dt_tensor_item(loss2), l0, 0, 0); /* same value either way */
    for (int64_t i = 0; i < m.n; i++)
        ASSERT_NEAR(m.G[i], 0, 0, 0);
    dt_ctx_free(ctx);
    mlp_free(&m);
}

/* custom op: identity forward, backward multiplies by 3 (a stand-in for a
 * tensor-parallel all-reduce in backward) */
static dt_status times3(dt_ctx *ctx, const dt_tensor *g, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx;
    (void)nin;
    (*(int *)ud)++;
    for (int64_t i = 0; i < dt_tensor_numel(g); i++)
        ((float *)gin[0]->data)[i] = 3.0f * (float)dt_tensor_get(g, i);
    return DT_OK;
}

TEST(custom_op)
{
    dt_tensor *x = dt_tensor_new(DT_F32, 1, SH(4));
    dt_tensor_set_requires_grad(x, true);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_tensor *y = dt_tensor_clone(ctx, x);
    int calls = 0;
    ASSERT(dt_ag_custom(ctx, 1, &x, y, times3, &calls) == y);
    ASSERT(y->flags & DT_TENSOR_REQUIRES_GRAD);
    ASSERT_OK(dt_backward(ctx, dt_sum(ctx, y)));
    ASSERT_EQ_INT(calls, 1);
    for (int i = 0; i < 4; i++)
        ASSERT_NEAR(((float *)x->grad->data)[i], 3.0, 0, 0);
    dt_ctx_free(ctx);
    dt_tensor_free(x);
}

static uint64_t hash_run(int steps)
{
    mlp m;
    mlp_init(&m);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    for (int s = 0; s < steps; s++) {
        memset(m.G, 0, (size_t)m.n * 4);
        dt_backward(ctx, mlp_loss(ctx, &m));
        for (int64_t i = 0; i < m.n; i++)
            m.P[i] -= 0.1f * m.G[i];
        dt_ctx_reset(ctx);
    }
    uint64_t h = dt_hash64(m.P, (size_t)m.n * 4, 0);
    dt_ctx_free(ctx);
    mlp_free(&m);
    return h;
}

TEST(deterministic_runs)
{
    ASSERT_EQ_U64(hash_run(5), hash_run(5));
    ASSERT(hash_run(5) != hash_run(4));
}

TEST(steady_state_no_arena_growth)
{
    mlp m;
    mlp_init(&m);
    dt_ctx_params p = dt_ctx_params_default();
    p.arena_block = 1024;
    dt_ctx *ctx = NULL;
    dt_ctx_init(&p, &ctx);
    size_t peak = 0;
    void *loss_addr = NULL;
    for (int s = 0; s < 6; s++) {
        dt_tensor *loss = mlp_loss(ctx, &m);
        ASSERT_OK(dt_backward(ctx, loss));
        if (s == 2) {
            peak = dt_arena_peak(dt_ctx_arena(ctx));
            loss_addr = loss;
        } else if (s > 2) {
            ASSERT_EQ_U64(dt_arena_peak(dt_ctx_arena(ctx)), peak);
            ASSERT(loss == loss_addr); /* same memory reused */
        }
        dt_ctx_reset(ctx);
    }
    dt_ctx_free(ctx);
    mlp_free(&m);
}

static dt_status failing_hook(dt_tensor *t, void *ud)
{
    (void)t;
    (void)ud;
    return dt_error(DT_ERR_PEER_FAILED, "bucket all-reduce failed");
}

TEST(hook_error_aborts_backward)
{
    mlp m;
    mlp_init(&m);
    ASSERT_OK(dt_ag_add_grad_hook(m.w[2], failing_hook, NULL));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    ASSERT_STATUS(dt_backward(ctx, mlp_loss(ctx, &m)), DT_ERR_PEER_FAILED);
    ASSERT_STR_CONTAINS(dt_last_error(), "bucket all-reduce failed");
    dt_ag_clear_grad_hooks(m.w[2]);
    dt_ctx_reset(ctx);
    ASSERT_OK(dt_backward(ctx, mlp_loss(ctx, &m)));
    dt_ctx_free(ctx);
    mlp_free(&m);
}

int main(void)
{
    RUN(grad_ready_hooks_fire_early_in_reverse_layer_order);
    RUN(hook_waits_for_all_uses);
    RUN(hooks_fire_before_backward_reaches_earlier_layers);
    RUN(accumulation_across_two_backwards);
    RUN(replaced_grad_buffer_receives_gradients);
    RUN(no_grad_records_nothing);
    RUN(custom_op);
    RUN(deterministic_runs);
    RUN(steady_state_no_arena_growth);
    RUN(hook_error_aborts_backward);
    return TEST_REPORT();
}
