/* Optimizer tests: hand-computed steps, bit-exact agreement with torch.optim,
 * shards (ZeRO ranges) equal to the whole, clipping, schedules.
 *
 * The torch reference literals below were produced by tests/optim/gen_ref.py
 * (PyTorch 1.13.1 from Debian, CPU with AVX2, /usr/bin/python3 gen_ref.py):
 *
 *   def P(i): return ((i * 37) % 101 - 50) / 64.0          # initial params
 *   def G(i, t): return ((i * 53 + t * 17) % 97 - 48) / 128.0   # grad at step t
 *   two tensors of 13 and 11 elements, 3 steps of
 *   SGD(lr=0.1) | SGD(lr=0.1, momentum=0.9, dampening=0.25, weight_decay=0.05)
 *   | SGD(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)
 *   | Adam(lr=0.01, weight_decay=0.1) | AdamW(lr=0.01, weight_decay=0.1);
 *   clip_grad_norm_(G(., 0), max_norm=0.5).
 * Inputs are dyadic rationals (exact in float32). Outputs printed with float.hex.
 */
// dt-test-labels: threads
#include "dtrain/optim.h"
#include "optim/optim_impl.h"
#include "test.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* The tests below were written against one [lo, hi) range stepped over
 * arrays named at each step. tlay is that range; t*_init binds it to a pair
 * of flats kept here (offset lo, numel hi - lo), and tstep points their
 * base at the arrays of the call: the library reads a range's flats at
 * every step, so this is exactly how a moved buffer is followed. */
typedef struct tlay {
    size_t lo, hi;
    const dt_optim_segment *segs;
    size_t nseg;
} tlay;

enum { MAXBIND = 64 };
static struct bind {
    dt_optim *o;
    dt_flat p, g;
} g_bind[MAXBIND];

static dt_optim_range bind_range(struct bind *b, const tlay *l)
{
    b->p = (dt_flat){.dtype = DT_F32, .offset = l->lo, .numel = l->hi - l->lo, .total = l->hi, .world = 1};
    b->g = b->p;
    return (dt_optim_range){.params = &b->p, .grads = &b->g, .lo = l->lo, .hi = l->hi, .segs = l->segs,
                            .nseg = l->nseg};
}

static struct bind *free_bind(void)
{
    for (int i = 0; i < MAXBIND; i++)
        if (!g_bind[i].o)
            return &g_bind[i];
    return NULL;
}

#define TINIT(kind, ptype)                                                                 \
    static dt_optim *t##kind##_init(const ptype *p, const tlay *l)                         \
    {                                                                                      \
        struct bind *b = free_bind();                                                      \
        if (!b)                                                                            \
            return NULL;                                                                   \
        dt_optim_range r = bind_range(b, l);                                               \
        dt_optim *o = NULL;                                                                \
        if (dt_optim_##kind##_init(p, &r, 1, &o) < 0)                                      \
            return NULL;                                                                   \
        b->o = o;                                                                          \
        return o;                                                                          \
    }
TINIT(sgd, dt_sgd_params)
TINIT(adam, dt_adam_params)
TINIT(adamw, dt_adam_params)
TINIT(lamb, dt_lamb_params)
TINIT(lion, dt_lion_params)

static void tfree(dt_optim *o)
{
    for (int i = 0; o && i < MAXBIND; i++)
        if (g_bind[i].o == o)
            g_bind[i].o = NULL;
    dt_optim_free(o);
}

/* Step o over params / grads arrays holding its range [lo, hi). */
static dt_status tstep(dt_optim *o, float *params, float *grads)
{
    for (int i = 0; i < MAXBIND; i++)
        if (g_bind[i].o == o) {
            g_bind[i].p.base = params;
            g_bind[i].g.base = grads;
            return dt_optim_step(o);
        }
    return dt_optim_step(o); /* NULL or unbound: the library's own error */
}

static const float ref_sgd_plain[24] = {
    -0x1.6acccc0000000p-1f, -0x1.04ccce0000000p-2f, 0x1.b4ccce0000000p-2f, -0x1.6533340000000p-1f,
    -0x1.0ccccc0000000p-6f, 0x1.06cccc0000000p-1f, -0x1.d666660000000p-2f, 0x1.2b33340000000p-3f,
    0x1.5a00000000000p-1f, -0x1.2ffffe0000000p-2f, 0x1.dcccca0000000p-3f, -0x1.5400000000000p-1f,
    -0x1.ae66660000000p-3f, 0x1.e266660000000p-2f, -0x1.2799980000000p-1f, 0x1.cccccc0000000p-6f,
    0x1.1d999a0000000p-1f, -0x1.a8ccce0000000p-2f, 0x1.8666680000000p-3f, 0x1.70cccc0000000p-1f,
    -0x1.0266680000000p-2f, 0x1.1c00000000000p-2f, -0x1.3d33340000000p-1f, -0x1.5333340000000p-3f};
static const float ref_sgd_mom_wd_damp[24] = {
    -0x1.3cab980000000p-1f, -0x1.0626a20000000p-2f, 0x1.e6cab80000000p-2f, -0x1.6757ba0000000p-1f,
    0x1.e41e4a0000000p-6f, 0x1.cba5a80000000p-2f, -0x1.aa46ee0000000p-2f, 0x1.c5e5c40000000p-4f,
    0x1.5aed7e0000000p-1f, -0x1.570f640000000p-2f, 0x1.daa44e0000000p-3f, -0x1.27339e0000000p-1f,
    -0x1.b66d580000000p-3f, 0x1.08dd560000000p-1f, -0x1.34c6240000000p-1f, 0x1.24c7660000000p-4f,
    0x1.f695a00000000p-2f, -0x1.7f56fa0000000p-2f, 0x1.38d2ce0000000p-3f, 0x1.7065780000000p-1f,
    -0x1.2c1f6c0000000p-2f, 0x1.18421c0000000p-2f, -0x1.11bba40000000p-1f, -0x1.608d6c0000000p-3f};
static const float ref_sgd_nesterov[24] = {
    -0x1.5e1b980000000p-1f, -0x1.06af860000000p-2f, 0x1.c5a9280000000p-2f, -0x1.6780620000000p-1f,
    -0x1.540cfa0000000p-9f, 0x1.f8b69c0000000p-2f, -0x1.caf95a0000000p-2f, 0x1.1e029a0000000p-3f,
    0x1.5b737e0000000p-1f, -0x1.394ff40000000p-2f, 0x1.dd2b780000000p-3f, -0x1.47a1980000000p-1f,
    -0x1.b377080000000p-3f, 0x1.f29d280000000p-2f, -0x1.2e1adc0000000p-1f, 0x1.525f380000000p-5f,
    0x1.12d54e0000000p-1f, -0x1.9e055a0000000p-2f, 0x1.77ea9a0000000p-3f, 0x1.71ed800000000p-1f,
    -0x1.0c5bf40000000p-2f, 0x1.1b89be0000000p-2f, -0x1.3127980000000p-1f, -0x1.598f060000000p-3f};
static const float ref_adam[24] = {
    -0x1.812d720000000p-1f, -0x1.d6f9460000000p-3f, 0x1.9b26da0000000p-2f, -0x1.4e494e0000000p-1f,
    -0x1.5eedd80000000p-6f, 0x1.042b5c0000000p-1f, -0x1.c7816c0000000p-2f, 0x1.b1fc1e0000000p-4f,
    0x1.5e3ff80000000p-1f, -0x1.45435c0000000p-2f, 0x1.eade200000000p-3f, -0x1.6935c80000000p-1f,
    -0x1.7815380000000p-3f, 0x1.cab7e40000000p-2f, -0x1.304f300000000p-1f, 0x1.9708bc0000000p-6f,
    0x1.1bf9880000000p-1f, -0x1.9869aa0000000p-2f, 0x1.3775b20000000p-3f, 0x1.7594fc0000000p-1f,
    -0x1.16150e0000000p-2f, 0x1.24acb00000000p-2f, -0x1.513efa0000000p-1f, -0x1.18f4e40000000p-3f};
static const float ref_adamw[24] = {
    -0x1.8040a40000000p-1f, -0x1.d753f00000000p-3f, 0x1.9af94c0000000p-2f, -0x1.4de18a0000000p-1f,
    -0x1.5f58280000000p-6f, 0x1.0448900000000p-1f, -0x1.ca31480000000p-2f, 0x1.b336e20000000p-4f,
    0x1.639b000000000p-1f, -0x1.4666f20000000p-2f, 0x1.0b823e0000000p-2f, -0x1.685ce00000000p-1f,
    -0x1.781b780000000p-3f, 0x1.caaaec0000000p-2f, -0x1.30bc880000000p-1f, 0x1.97fb740000000p-6f,
    0x1.1c106c0000000p-1f, -0x1.9b45fa0000000p-2f, 0x1.3865380000000p-3f, 0x1.7abbd40000000p-1f,
    -0x1.1715140000000p-2f, 0x1.3a82b80000000p-2f, -0x1.5079e20000000p-1f, -0x1.18d2b80000000p-3f};
static const float ref_clip_norm = 0x1.1857b80000000p+0f;
static const float ref_clip[24] = {
    -0x1.5ea8020000000p-3f, 0x1.2436ac0000000p-6f, -0x1.1ce8820000000p-3f, 0x1.9919580000000p-5f,
    -0x1.b652040000000p-4f, 0x1.500bae0000000p-4f, -0x1.32d3020000000p-4f, 0x1.d38aae0000000p-4f,
    -0x1.5ea8020000000p-5f, 0x1.2b84d80000000p-3f, -0x1.5ea8020000000p-7f, -0x1.5759d80000000p-3f,
    0x1.5ea8020000000p-6f, -0x1.159a580000000p-3f, 0x1.b652040000000p-5f, -0x1.a7b5ae0000000p-4f,
    0x1.5ea8020000000p-4f, -0x1.2436ac0000000p-4f, 0x1.e227040000000p-4f, -0x1.416f580000000p-5f,
    0x1.32d3020000000p-3f, -0x1.d38aae0000000p-8f, -0x1.500bae0000000p-3f, 0x1.9919580000000p-6f};

#define N 24
static const dt_optim_segment segs24[] = {{0, 13, false}, {13, 11, false}};

static float P(int i) { return (float)(((i * 37) % 101 - 50) / 64.0); }
static float G(int i, int t) { return (float)(((i * 53 + t * 17) % 97 - 48) / 128.0); }

/* Three steps over the 24-element, two-tensor buffer, as gen_ref.py does. */
static dt_status run3(dt_optim *o, float *p)
{
    float g[N];
    for (int i = 0; i < N; i++)
        p[i] = P(i);
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < N; i++)
            g[i] = G(i, t);
        dt_status st = tstep(o, p, g);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

static int count_bit_diffs(const float *a, const float *b, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) {
            if (bad < 3)
                fprintf(stderr, "  [%d] got %a want %a\n", i, (double)a[i], (double)b[i]);
            bad++;
        }
    return bad;
}

static tlay lay24(void)
{
    tlay l = {.lo = 0, .hi = N, .segs = segs24, .nseg = 2};
    return l;
}

/* ---- hand-computed steps ------------------------------------------------ */

TEST(sgd_hand)
{
    /* plain: p = 1 - 0.1 * 0.5 = 0.95 */
    float p = 1, g = 0.5f;
    tlay l = {.lo = 0, .hi = 1};
    dt_sgd_params sp = dt_sgd_params_default();
    sp.lr = 0.1;
    dt_optim *o = tsgd_init(&sp, &l);
    ASSERT(o);
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.95, 1e-7, 0);
    ASSERT_EQ_INT(dt_optim_num_states(o), 0);
    tfree(o);

    /* momentum 0.9, wd 0.1, lr 0.1, g = 0.5 twice:
     * step 1: d = 0.5 + 0.1*1 = 0.6; buf = d = 0.6 (first step: no dampening);
     *         p = 1 - 0.1*0.6 = 0.94
     * step 2: d = 0.5 + 0.1*0.94 = 0.594; buf = 0.9*0.6 + 0.594 = 1.134;
     *         p = 0.94 - 0.1134 = 0.8266 */
    sp.momentum = 0.9;
    sp.weight_decay = 0.1;
    o = tsgd_init(&sp, &l);
    ASSERT(o);
    p = 1;
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.94, 1e-7, 0);
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.8266, 1e-6, 0);
    const char *name;
    float *buf;
    size_t n;
    ASSERT_OK(dt_optim_state(o, 0, 0, &name, &buf, &n));
    ASSERT_STR_EQ(name, "momentum_buffer");
    ASSERT_EQ_INT(n, 1);
    ASSERT_NEAR(buf[0], 1.134, 1e-6, 0);
    ASSERT_EQ_INT(dt_optim_get_step(o), 2);
    tfree(o);

    /* nesterov, momentum 0.9, no wd: step 1: buf = 0.5; d = 0.5 + 0.9*0.5 = 0.95;
     * p = 1 - 0.095 = 0.905.  step 2: buf = 0.45 + 0.5 = 0.95; d = 0.5 + 0.855
     * = 1.355; p = 0.905 - 0.1355 = 0.7695 */
    sp.weight_decay = 0;
    sp.nesterov = true;
    o = tsgd_init(&sp, &l);
    p = 1;
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.905, 1e-7, 0);
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.7695, 1e-6, 0);
    tfree(o);

    /* dampening 0.5 (no nesterov): step 1 buf = 0.5 (undampened), p = 0.95;
     * step 2 buf = 0.9*0.5 + 0.5*0.5 = 0.7, p = 0.95 - 0.07 = 0.88 */
    sp.nesterov = false;
    sp.dampening = 0.5;
    o = tsgd_init(&sp, &l);
    p = 1;
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.88, 1e-6, 0);
    tfree(o);
}

TEST(adam_hand)
{
    /* lr 0.1, p = 1, g = 0.5 then 0.25, betas (0.9, 0.999), eps 1e-8.
     * step 1: m = 0.05, v = 0.00025; m^ = 0.5, v^ = 0.25;
     *         p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002
     * step 2: m = 0.9*0.05 + 0.1*0.25 = 0.07; v = 0.999*0.00025 + 0.001*0.0625
     *         = 0.00031225; bc1 = 0.19, bc2 = 0.001999;
     *         m^ = 0.3684210526, sqrt(v^) = 0.3952253807;
     *         p = 0.9 - 0.1 * 0.3684210526 / 0.3952253807 = 0.8067820405 */
    float p = 1, g = 0.5f;
    tlay l = {.lo = 0, .hi = 1};
    dt_adam_params ap = dt_adam_params_default();
    ap.lr = 0.1;
    dt_optim *o = tadam_init(&ap, &l);
    ASSERT(o);
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.9, 1e-7, 0);
    g = 0.25f;
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.8067820405, 1e-6, 0);
    float *m, *v;
    ASSERT_OK(dt_optim_state(o, 0, 0, NULL, &m, NULL));
    ASSERT_OK(dt_optim_state(o, 0, 1, NULL, &v, NULL));
    ASSERT_NEAR(m[0], 0.07, 1e-8, 0);
    ASSERT_NEAR(v[0], 0.00031225, 1e-10, 0);
    tfree(o);

    /* betas changed between steps (DeepSpeed's OneCycle does): each step's bias correction uses its own betas,
     * as torch's Adam does. g = 0.5, lr 0.1; step 1 at (0.5, 0.6): m = 0.25, v = 0.1, m^ = 0.5, v^ = 0.25,
     * p = 0.9; step 2 at (0.7, 0.8): m = 0.325, v = 0.13, bc1 = 0.51, bc2 = 0.36,
     * p = 0.9 - 0.1 * (0.325 / 0.51) / sqrt(0.13 / 0.36) = 0.79395444 */
    p = 1, g = 0.5f;
    o = tadam_init(&ap, &l);
    ASSERT(o);
    ASSERT_OK(dt_optim_set_betas(o, 0.5, 0.6));
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.9, 1e-7, 0);
    ASSERT_OK(dt_optim_set_betas(o, 0.7, 0.8));
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.9 - 0.1 * (0.325 / 0.51) / sqrt(0.13 / 0.36), 1e-6, 0);
    ASSERT_STATUS(dt_optim_set_betas(o, 1.045, 0.99), DT_ERR_INVALID_ARG); /* kept */
    ASSERT_STATUS(dt_optim_set_betas(o, NAN, 0.99), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_optim_set_betas(NULL, 0.9, 0.99), DT_ERR_NULL);
    tfree(o);
    dt_sgd_params sp0 = {.lr = 0.1};
    o = tsgd_init(&sp0, &l);
    ASSERT(o);
    ASSERT_STATUS(dt_optim_set_betas(o, 0.9, 0.99), DT_ERR_UNSUPPORTED);
    tfree(o);

    /* AdamW wd 0.01: step 1 decays first, p = 1*(1 - 0.1*0.01) = 0.999, then
     * the Adam step subtracts 0.1 -> 0.899 */
    ap = dt_adamw_params_default();
    ASSERT_NEAR(ap.weight_decay, 0.01, 0, 0);
    ap.lr = 0.1;
    o = tadamw_init(&ap, &l);
    p = 1;
    g = 0.5f;
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.899, 1e-6, 0);
    tfree(o);

    /* Adam with L2 wd 0.5: g' = 0.5 + 0.5*1 = 1; step 1 is still -lr*sign -> 0.9 */
    ap = dt_adam_params_default();
    ap.lr = 0.1;
    ap.weight_decay = 0.5;
    o = tadam_init(&ap, &l);
    p = 1;
    g = 0.5f;
    ASSERT_OK(tstep(o, &p, &g));
    ASSERT_NEAR(p, 0.9, 1e-7, 0);
    ASSERT_OK(dt_optim_state(o, 0, 0, NULL, &m, NULL));
    ASSERT_NEAR(m[0], 0.1, 1e-8, 0); /* (1 - 0.9) * g' */
    tfree(o);
}

static dt_optim *lamb2(dt_lamb_params *lp)
{
    tlay l = {.lo = 0, .hi = 2};
    return tlamb_init(lp, &l);
}

/* Lion by hand (the paper's update, DeepSpeed FusedLion's params): lr 0.1, betas (0.9, 0.99), wd 0.1.
 * step 1, g = 0.5: c = 0.05 > 0: p = 1 * (1 - 0.01) - 0.1 = 0.89; m = 0.01 * 0.5 = 0.005.
 * step 2, g = -1: c = 0.0045 - 0.1 < 0: p = 0.89 * 0.99 + 0.1 = 0.9811; m = 0.00495 - 0.01 = -0.00505.
 * A second element with g = 0 throughout (c = 0, sign 0) only decays; a NaN gradient reaches p. */
TEST(lion)
{
    float p[2] = {1, 2}, g[2] = {0.5f, 0};
    tlay l = {.lo = 0, .hi = 2};
    dt_lion_params lp = dt_lion_params_default();
    ASSERT_NEAR(lp.lr, 1e-3, 0, 0);
    ASSERT_NEAR(lp.beta2, 0.999, 0, 0);
    lp.lr = 0.1, lp.beta2 = 0.99, lp.weight_decay = 0.1;
    dt_optim *o = tlion_init(&lp, &l);
    ASSERT(o);
    ASSERT_STR_EQ(dt_optim_kind_name(dt_optim_get_kind(o)), "lion");
    ASSERT_EQ_INT(dt_optim_num_states(o), 1);
    ASSERT_OK(tstep(o, p, g));
    ASSERT_NEAR(p[0], 0.89, 1e-7, 0);
    ASSERT_NEAR(p[1], 2 * 0.99, 1e-7, 0);
    g[0] = -1;
    ASSERT_OK(tstep(o, p, g));
    ASSERT_NEAR(p[0], 0.9811, 1e-6, 0);
    float *m;
    const char *name;
    ASSERT_OK(dt_optim_state(o, 0, 0, &name, &m, NULL));
    ASSERT_STR_EQ(name, "exp_avg");
    ASSERT_NEAR(m[0], -0.00505, 1e-8, 0);
    ASSERT_NEAR(m[1], 0, 0, 0);
    double b1, b2;
    ASSERT_OK(dt_optim_get_betas(o, &b1, &b2));
    ASSERT_NEAR(b2, 0.99, 0, 0);
    g[0] = NAN;
    ASSERT_OK(tstep(o, p, g));
    ASSERT(isnan(p[0]));
    tfree(o);
    struct bind b = {0};
    dt_optim_range r = bind_range(&b, &l);
    ASSERT_OK(dt_optim_init(DT_OPTIM_LION, &lp, &r, 1, &o)); /* the kind's own init */
    ASSERT(dt_optim_get_kind(o) == DT_OPTIM_LION);
    dt_optim_free(o);
    lp.beta1 = 1.0;
    ASSERT_STATUS(dt_optim_lion_init(&lp, &r, 1, &o), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_optim_init(DT_OPTIM_KIND_COUNT, &lp, &r, 1, &o), DT_ERR_INVALID_ARG);
    ASSERT(o == NULL);
}

TEST(lamb_hand)
{
    /* One tensor w = [3, 4] (‖w‖ = 5), g = [0.3, 0.4] (‖g‖ = 0.5 < max 1: no
     * clipping), lr 0.01, defaults (eps 1e-6, wd 0.01, adam_w_mode).
     * step 1 with bias correction: m^ = g, v^ = g^2, so
     * u = g/(|g| + eps) + wd*w = [0.3/0.300001 + 0.03, 0.4/0.400001 + 0.04]
     *   = [1.0299966667, 1.0399975000];  ‖u‖ = 1.4637239949
     * ratio = ‖w‖/‖u‖ = 3.4159445478
     * p = w - lr*ratio*u = [2.9648158850, 3.9644742621] */
    dt_lamb_params lp = dt_lamb_params_default();
    ASSERT_NEAR(lp.eps, 1e-6, 0, 0);
    ASSERT_NEAR(lp.weight_decay, 0.01, 0, 0);
    lp.lr = 0.01;
    dt_optim *o = lamb2(&lp);
    ASSERT(o);
    float w[2] = {3, 4}, g[2] = {0.3f, 0.4f};
    ASSERT_OK(tstep(o, w, g));
    ASSERT_NEAR(w[0], 2.9648158850, 1e-6, 0);
    ASSERT_NEAR(w[1], 3.9644742621, 1e-6, 0);
    ASSERT_NEAR(g[0], 1.0299966667, 1e-6, 0); /* apex leaves u in the grads */
    ASSERT_NEAR(dt_optim_last_grad_norm(o), 0.5, 1e-7, 0);
    tfree(o);

    /* Clipping: g = [3, 4], ‖g‖ = 5 > 1 -> g/5 = [0.6, 0.8]; u differs from
     * above only through eps: [0.6/0.600001 + 0.03, 0.8/0.800001 + 0.04] */
    o = lamb2(&lp);
    float w2[2] = {3, 4}, g2[2] = {3, 4};
    ASSERT_OK(tstep(o, w2, g2));
    ASSERT_NEAR(dt_optim_last_grad_norm(o), 5.0, 1e-6, 0);
    ASSERT_NEAR(g2[0], 0.6 / 0.600001 + 0.03, 1e-6, 0);
    ASSERT_NEAR(w2[0], 2.9648158850, 1e-5, 0);
    tfree(o);

    /* Zero weights: ‖w‖ = 0 -> ratio 1, p = -lr*u = [-0.0099999667, -0.0099999750] */
    o = lamb2(&lp);
    float w3[2] = {0, 0}, g3[2] = {0.3f, 0.4f};
    ASSERT_OK(tstep(o, w3, g3));
    ASSERT_NEAR(w3[0], -0.0099999667, 1e-9, 0);
    ASSERT_NEAR(w3[1], -0.0099999750, 1e-9, 0);
    tfree(o);

    /* Zero update (zero grads, wd 0): ‖u‖ = 0 -> ratio 1, w unchanged */
    lp.weight_decay = 0;
    o = lamb2(&lp);
    float w4[2] = {3, 4}, g4[2] = {0, 0};
    ASSERT_OK(tstep(o, w4, g4));
    ASSERT_NEAR(w4[0], 3, 0, 0);
    ASSERT_NEAR(w4[1], 4, 0, 0);
    tfree(o);

    /* wd 0, no nvlamb: no trust ratio; p = w - lr*g/(|g|+eps) */
    o = lamb2(&lp);
    float w5[2] = {3, 4}, g5[2] = {0.3f, 0.4f};
    ASSERT_OK(tstep(o, w5, g5));
    ASSERT_NEAR(w5[0], 3 - 0.01 * 0.3 / 0.300001, 1e-6, 0);
    tfree(o);
    /* ... with nvlamb the ratio applies: ‖u‖ = sqrt(2)*~1 -> ratio 5/1.4142 */
    lp.use_nvlamb = true;
    o = lamb2(&lp);
    float w6[2] = {3, 4}, g6[2] = {0.3f, 0.4f};
    ASSERT_OK(tstep(o, w6, g6));
    ASSERT_NEAR(w6[0], 3 - 0.01 * (5 / sqrt(2.0)) * 0.99999667, 1e-5, 0);
    tfree(o);

    /* L2 mode (adam_w_mode false), wd 0.01: s = g + wd*w = [0.33, 0.44];
     * u = s/(|s| + eps); ratio = 5/‖u‖ = 3.5355432805;
     * p = [2.9646446743, 3.9646446475] */
    lp = dt_lamb_params_default();
    lp.lr = 0.01;
    lp.adam_w_mode = false;
    o = lamb2(&lp);
    float w7[2] = {3, 4}, g7[2] = {0.3f, 0.4f};
    ASSERT_OK(tstep(o, w7, g7));
    ASSERT_NEAR(w7[0], 2.9646446743, 1e-6, 0);
    ASSERT_NEAR(w7[1], 3.9646446475, 1e-6, 0);
    tfree(o);

    /* No bias correction, no grad averaging: m = g, v = (1-b2) g^2, where
     * 1 - b2 is computed in float as apex does: 1 - 0.999f = 0.00099998713;
     * u = g/(sqrt(1-b2)|g| + eps) + wd*w = [31.6496471441, 31.6604803344];
     * p = [2.9646507113, 3.9646386117] */
    lp = dt_lamb_params_default();
    lp.lr = 0.01;
    lp.bias_correction = false;
    lp.grad_averaging = false;
    o = lamb2(&lp);
    float w8[2] = {3, 4}, g8[2] = {0.3f, 0.4f};
    ASSERT_OK(tstep(o, w8, g8));
    ASSERT_NEAR(g8[0], 31.6496471441, 2e-5, 0);
    ASSERT_NEAR(w8[0], 2.9646507113, 1e-6, 0);
    ASSERT_NEAR(w8[1], 3.9646386117, 1e-6, 0);
    tfree(o);
}

/* ---- torch cross-check, both kernel paths --------------------------------- */

static const char *const k_level_name[] = {"scalar", "avx2", "avx512"};

/* level: the kernels dt__optim_force_level runs (0 scalar, 1 AVX2, 2 AVX-512). */
static void torch_check_level(int level)
{
    const bool scalar = level == 0;
    ASSERT(dt__optim_force_level(level));
    tlay l = lay24();
    float p[N];
    struct {
        const char *name;
        dt_optim *o;
        const float *ref;
    } c[5];
    dt_sgd_params s1 = dt_sgd_params_default();
    s1.lr = 0.1;
    dt_sgd_params s2 = s1;
    s2.momentum = 0.9;
    s2.dampening = 0.25;
    s2.weight_decay = 0.05;
    dt_sgd_params s3 = dt_sgd_params_default();
    s3.lr = 0.05;
    s3.momentum = 0.8;
    s3.nesterov = true;
    s3.weight_decay = 0.01;
    dt_adam_params a1 = dt_adam_params_default();
    a1.lr = 0.01;
    a1.weight_decay = 0.1;
    c[0].name = "sgd_plain", c[0].o = tsgd_init(&s1, &l), c[0].ref = ref_sgd_plain;
    c[1].name = "sgd_mom_wd_damp", c[1].o = tsgd_init(&s2, &l), c[1].ref = ref_sgd_mom_wd_damp;
    c[2].name = "sgd_nesterov", c[2].o = tsgd_init(&s3, &l), c[2].ref = ref_sgd_nesterov;
    c[3].name = "adam", c[3].o = tadam_init(&a1, &l), c[3].ref = ref_adam;
    c[4].name = "adamw", c[4].o = tadamw_init(&a1, &l), c[4].ref = ref_adamw;
    int bad = 0;
    for (int k = 0; k < 5; k++) {
        if (!c[k].o || run3(c[k].o, p) < 0) {
            fprintf(stderr, "%s: %s\n", c[k].name, dt_last_error());
            bad++;
            continue;
        }
        int d = count_bit_diffs(p, c[k].ref, N);
        if (d)
            fprintf(stderr, "%s (%s path): %d of %d elements differ from torch\n", c[k].name,
                    k_level_name[level], d, N);
        bad += d;
        tfree(c[k].o);
    }
    (void)scalar;
    dt__optim_force_scalar(false);
    ASSERT_EQ_INT(bad, 0);
}

TEST(torch_bit_exact_simd)
{
    if (!dt__optim_simd_active())
        fprintf(stderr, "  (no AVX2+FMA on this CPU: only the scalar path runs)\n");
    else
        torch_check_level(1);
}

TEST(torch_bit_exact_avx512)
{
    if (!dt__optim_force_level(2)) {
        fprintf(stderr, "  (no AVX-512 on this CPU: its path is not run)\n");
        return;
    }
    torch_check_level(2);
}

TEST(torch_bit_exact_scalar) { torch_check_level(0); }

/* The element kernels on every level the CPU has against the scalar ones,
 * bit for bit, on lengths that leave a masked or 8-lane tail (1000 = 62 x 16
 * + 8, 1013, 13, 7): SGD (momentum, Nesterov, weight decay), Adam and AdamW,
 * LAMB stage 1 (with its sum of u^2) and stage 2, the plain sqsum/scale, Lion. */
static uint32_t g_lcg = 12345;
static float frand(void)
{
    g_lcg = g_lcg * 1664525u + 1013904223u;
    return (float)(g_lcg >> 8) / 16777216.0f * 2.0f - 1.0f;
}

TEST(kernels_levels_bit_identical)
{
    const size_t lens[] = {1000, 1013, 13, 7};
    enum { NMAX = 1013, NB = 7 };
    static float base[NB][NMAX], out[3][NB][NMAX];
    double sums[3][2];
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const size_t n = lens[li];
        for (int b = 0; b < NB; b++)
            for (size_t i = 0; i < n; i++)
                base[b][i] = b == 3 || b == 6 ? fabsf(frand()) * 1e-3f : frand();
        int ran = 0;
        for (int lv = 0; lv < 3; lv++) {
            if (!dt__optim_force_level(lv))
                continue;
            ran |= 1 << lv;
            float(*o)[NMAX] = out[lv];
            memcpy(o, base, sizeof base);
            /* arrays: 0 p, 1 g, 2 m/buf, 3 v (>= 0); 4 p2, 5 g2, 6 v2 (>= 0) */
            dt__sgd_k sk = {.wd = 0.01f, .momentum = 0.9f, .one_minus_damp = 0.75f, .neg_lr = -0.05f,
                            .has_wd = true, .has_momentum = true, .nesterov = true, .first = false};
            dt__optim_sgd(o[0], o[1], o[2], n, &sk);
            sk.nesterov = false, sk.zero_grad = true;
            dt__optim_sgd(o[0], o[1], o[2], n, &sk);
            dt__adam_k ak = {.wd = 0.1f, .decay = 1.0f, .b1 = 0.9f, .omb1 = 0.1f, .b2 = 0.999f, .omb2 = 0.001f,
                             .bc2_sqrt = 0.0447f, .eps = 1e-8f, .neg_step_size = -0.1f, .l2 = true};
            dt__optim_adam(o[4], o[5], o[2], o[3], n, &ak);
            ak.l2 = false, ak.decoupled = true, ak.decay = 0.999f, ak.zero_grad = true;
            dt__optim_adam(o[4], o[5], o[2], o[3], n, &ak);
            memcpy(o[5], base[1], n * sizeof(float));
            dt__lamb_k lk = {.clip = 1.5f, .decay = 0.01f, .b1 = 0.9f, .b3 = 0.1f, .b2 = 0.999f, .omb2 = 0.001f,
                             .bc1 = 0.1f, .bc2 = 0.001f, .eps = 1e-6f, .adam_w_mode = true};
            sums[lv][0] = dt__optim_lamb_stage1(o[4], o[5], o[2], o[6], n, &lk);
            dt__optim_lamb_stage2(o[4], o[5], n, 0.3f, true);
            memcpy(o[1], base[1], n * sizeof(float));
            lk.adam_w_mode = false;
            sums[lv][1] = dt__optim_lamb_stage1(o[0], o[1], o[2], o[6], n, &lk) + dt__sqsum(o[1], n);
            dt__optim_lamb_stage2(o[0], o[1], n, 0.7f, false);
            dt__scale(o[1], n, 0.37f);
            /* Lion, with a c of exactly 0 (g and m 0: sign 0) in the first and the tail's last element */
            o[1][0] = o[2][0] = o[1][n - 1] = o[2][n - 1] = 0.0f;
            dt__lion_k nk = {.b1 = 0.9f, .omb1 = 0.1f, .b2 = 0.99f, .omb2 = 0.01f, .neg_lr = -0.01f,
                             .decay = 0.999f};
            dt__optim_lion(o[0], o[1], o[2], n, &nk);
            nk.decay = 1.0f, nk.zero_grad = true;
            dt__optim_lion(o[4], o[1], o[2], n, &nk);
        }
        dt__optim_force_level(-1);
        ASSERT(ran & 1);
        for (int lv = 1; lv < 3; lv++) {
            if (!(ran & (1 << lv)))
                continue;
            for (int b = 0; b < NB; b++)
                for (size_t i = 0; i < n; i++)
                    if (memcmp(&out[lv][b][i], &out[0][b][i], sizeof(float))) {
                        TEST_FAIL_("%s, n = %zu: array %d element %zu: %.9g vs %.9g (scalar)", k_level_name[lv],
                                   n, b, i, (double)out[lv][b][i], (double)out[0][b][i]);
                        return;
                    }
            ASSERT(memcmp(sums[lv], sums[0], sizeof sums[0]) == 0);
        }
    }
}

/* The one-sweep Adam(W) over bf16 grads (dt__optim_adam_bf16) on every
 * level the CPU has, against its parts: the grads widened, dt__optim_adam
 * on the scalar level, the master rounded by dt_f32_to_bf16, the grads
 * zeroed; master, moments, copy and grads bit for bit. Lengths with a
 * masked or 8-lane tail and none; Adam's L2 and AdamW's decay, with and
 * without a copy or zeroing; a pass with zero grads and moments keeps the
 * masters as they are, so their rounding is tested on chosen bits: ties
 * to even both ways, NaN (signalling and quiet, payloads), infinities,
 * subnormals, -0, the largest finite value (rounds to inf). */
TEST(adam_bf16_one_sweep_equals_parts)
{
    enum { NMAX = 1013 };
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x7f800001u,
                                       0xffc12345u, 0x7f800000u, 0xff800000u, 0x00008000u, 0x00018000u,
                                       0x807fffffu, 0x80000000u, 0x00000000u, 0x7f7fffffu, 0xbf80ffffu,
                                       0x7fbfffffu, 0x00400000u};
    const size_t lens[] = {1013, 1000, 16, 17, 13, 7, 1, 0};
    static float p[2][NMAX], m[2][NMAX], v[2][NMAX], gw[NMAX];
    static uint16_t g[2][NMAX], c[2][NMAX], g0[NMAX];
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int mode = 0; mode < 5; mode++) {
            const size_t n = lens[li];
            const bool specials = mode == 4, copy = mode != 2, zero = mode != 3;
            dt__adam_k k = {.wd = 0.1f, .decay = 0.999f, .b1 = 0.9f, .omb1 = 0.1f, .b2 = 0.999f, .omb2 = 0.001f,
                            .bc2_sqrt = 0.0447f, .eps = 1e-8f, .neg_step_size = -0.1f, .l2 = mode == 0,
                            .decoupled = mode == 1 || mode == 2 || mode == 3, .zero_grad = zero};
            for (size_t i = 0; i < n; i++) {
                p[0][i] = frand();
                m[0][i] = specials ? 0.0f : 0.1f * frand();
                v[0][i] = specials ? 0.0f : 1e-3f * fabsf(frand());
                g0[i] = specials ? 0 : dt_f32_to_bf16(frand() * (i % 5 == 0 ? 1e-30f : 0.5f));
                if (specials) {
                    uint32_t u = special[i % (sizeof special / sizeof special[0])];
                    memcpy(&p[0][i], &u, sizeof u);
                }
            }
            memcpy(p[1], p[0], n * sizeof(float));
            memcpy(m[1], m[0], n * sizeof(float));
            memcpy(v[1], v[0], n * sizeof(float));
            /* the parts, scalar */
            ASSERT(dt__optim_force_level(0));
            for (size_t i = 0; i < n; i++)
                gw[i] = dt_bf16_to_f32(g0[i]);
            dt__optim_adam(p[1], gw, m[1], v[1], n, &k);
            for (size_t i = 0; i < n; i++) {
                c[1][i] = copy ? dt_f32_to_bf16(p[1][i]) : 0x5555;
                g[1][i] = zero ? 0 : g0[i];
            }
            for (int lv = 0; lv < 3; lv++) {
                if (!dt__optim_force_level(lv))
                    continue;
                float pp[NMAX], mm[NMAX], vv[NMAX];
                memcpy(pp, p[0], n * sizeof(float));
                memcpy(mm, m[0], n * sizeof(float));
                memcpy(vv, v[0], n * sizeof(float));
                memcpy(g[0], g0, n * sizeof(uint16_t));
                for (size_t i = 0; i < n; i++)
                    c[0][i] = 0x5555;
                dt__optim_adam_bf16(pp, g[0], mm, vv, copy ? c[0] : NULL, n, &k);
                const char *what = memcmp(pp, p[1], n * sizeof(float))   ? "the master"
                                   : memcmp(mm, m[1], n * sizeof(float)) ? "exp_avg"
                                   : memcmp(vv, v[1], n * sizeof(float)) ? "exp_avg_sq"
                                   : memcmp(c[0], c[1], n * 2)           ? "the bf16 copy"
                                   : memcmp(g[0], g[1], n * 2)           ? "grads"
                                                                         : NULL;
                if (what) {
                    size_t at = 0;
                    while (at < n && !memcmp(&c[0][at], &c[1][at], 2) && !memcmp(&pp[at], &p[1][at], 4))
                        at++;
                    dt__optim_force_level(-1);
                    TEST_FAIL_("%s level, n = %zu, mode %d: %s not bit-identical (first master/copy difference at %zu)",
                               k_level_name[lv], n, mode, what, at);
                    return;
                }
            }
        }
    dt__optim_force_level(-1);
}

/* ---- ranges (ZeRO shards) ---------------------------------------------------- */

/* Run one optimizer over [0,24) and two over [0,10) and [10,24) (the cut
 * falls inside tensor 0); params must be bit-identical for SGD and Adam. */
TEST(shards_equal_whole)
{
    for (int kind = 0; kind < 3; kind++) {
        float whole[N], part[N], g[N];
        for (int i = 0; i < N; i++)
            whole[i] = part[i] = P(i);
        tlay lw = lay24();
        tlay l0 = {.lo = 0, .hi = 10, .segs = segs24, .nseg = 2};
        tlay l1 = {.lo = 10, .hi = N, .segs = segs24, .nseg = 2};
        dt_optim *ow, *o0, *o1;
        dt_sgd_params sp = dt_sgd_params_default();
        sp.momentum = 0.9;
        sp.weight_decay = 0.01;
        dt_adam_params ap = dt_adamw_params_default();
        if (kind == 0) {
            ow = tsgd_init(&sp, &lw), o0 = tsgd_init(&sp, &l0), o1 = tsgd_init(&sp, &l1);
        } else if (kind == 1) {
            ow = tadam_init(&ap, &lw), o0 = tadam_init(&ap, &l0), o1 = tadam_init(&ap, &l1);
        } else {
            ow = tadamw_init(&ap, &lw), o0 = tadamw_init(&ap, &l0), o1 = tadamw_init(&ap, &l1);
        }
        ASSERT(ow && o0 && o1);
        size_t n1;
        ASSERT_OK(dt_optim_state(o1, 0, 0, NULL, NULL, &n1));
        ASSERT_EQ_INT(n1, 14);
        for (int t = 0; t < 4; t++) {
            float gw[N];
            for (int i = 0; i < N; i++)
                g[i] = gw[i] = G(i, t);
            ASSERT_OK(tstep(ow, whole, gw));
            ASSERT_OK(tstep(o0, part, g));
            ASSERT_OK(tstep(o1, part + 10, g + 10));
        }
        ASSERT_EQ_INT(count_bit_diffs(part, whole, N), 0);
        tfree(ow);
        tfree(o0);
        tfree(o1);
    }
}

/* Two "ranks" (threads) sharing LAMB's norms through a reducer. */
typedef struct {
    pthread_barrier_t bar;
    double slot[2][64];
} fake_world;
typedef struct {
    fake_world *w;
    int rank;
    dt_optim *o;
    float *p, *g;
    dt_status st;
} fake_rank;

static dt_status fake_allreduce(void *ctx, double *sums, size_t n)
{
    fake_rank *r = ctx;
    memcpy(r->w->slot[r->rank], sums, n * sizeof(double));
    pthread_barrier_wait(&r->w->bar);
    for (size_t i = 0; i < n; i++)
        sums[i] = r->w->slot[0][i] + r->w->slot[1][i];
    pthread_barrier_wait(&r->w->bar);
    return DT_OK;
}

static void *rank_main(void *arg)
{
    fake_rank *r = arg;
    r->st = tstep(r->o, r->p, r->g);
    return NULL;
}

TEST(lamb_sharded_with_reducer)
{
    float whole[N], part[N], gw[N], g[N];
    for (int i = 0; i < N; i++) {
        whole[i] = part[i] = P(i);
        gw[i] = g[i] = 4 * G(i, 0); /* ‖g‖ > 1: clipping is exercised */
    }
    dt_lamb_params lp = dt_lamb_params_default();
    lp.lr = 0.05;
    tlay lw = lay24();
    dt_optim *ow = tlamb_init(&lp, &lw);
    ASSERT_OK(tstep(ow, whole, gw));
    fake_world w;
    pthread_barrier_init(&w.bar, NULL, 2);
    fake_rank r[2];
    size_t cut = 10;
    for (int k = 0; k < 2; k++) {
        tlay l = {.lo = k ? cut : 0, .hi = k ? N : cut, .segs = segs24, .nseg = 2};
        r[k] = (fake_rank){.w = &w, .rank = k, .o = tlamb_init(&lp, &l), .p = part + l.lo, .g = g + l.lo};
        ASSERT(r[k].o);
        dt_optim_set_reducer(r[k].o, fake_allreduce, &r[k]);
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, rank_main, &r[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    pthread_barrier_destroy(&w.bar);
    ASSERT_OK(r[0].st);
    ASSERT_OK(r[1].st);
    ASSERT_NEAR(dt_optim_last_grad_norm(r[1].o), dt_optim_last_grad_norm(ow), 0, 1e-7);
    ASSERT(dt_optim_last_grad_norm(ow) > 1.0);
    for (int i = 0; i < N; i++)
        ASSERT_NEAR(part[i], whole[i], 1e-7, 1e-6);
    /* without the reducer the shard's norms are local and the result differs */
    for (int i = 0; i < N; i++)
        part[i] = P(i), g[i] = 4 * G(i, 0);
    tlay l0 = {.lo = 0, .hi = cut, .segs = segs24, .nseg = 2};
    dt_optim *solo = tlamb_init(&lp, &l0);
    ASSERT_OK(tstep(solo, part, g));
    int differ = 0;
    for (size_t i = 0; i < cut; i++)
        differ += fabsf(part[i] - whole[i]) > 1e-6f;
    ASSERT(differ > 0);
    tfree(solo);
    tfree(ow);
    tfree(r[0].o);
    tfree(r[1].o);
}

/* Padding between segments is never touched; no_decay segments skip decay. */
TEST(segments_gaps_and_no_decay)
{
    dt_optim_segment s[] = {{0, 5, false}, {8, 4, true}};
    tlay l = {.lo = 0, .hi = 12, .segs = s, .nseg = 2};
    dt_sgd_params sp = dt_sgd_params_default();
    sp.lr = 0.5;
    sp.weight_decay = 0.5;
    dt_optim *o = tsgd_init(&sp, &l);
    ASSERT(o);
    float p[12], g[12];
    for (int i = 0; i < 12; i++)
        p[i] = 1, g[i] = 1;
    ASSERT_OK(tstep(o, p, g));
    ASSERT_NEAR(p[0], 1 - 0.5 * (1 + 0.5), 0, 0); /* decayed: 0.25 */
    ASSERT_NEAR(p[6], 1, 0, 0);                   /* padding untouched */
    ASSERT_NEAR(p[9], 0.5, 0, 0);                 /* no decay: 1 - 0.5*1 */
    tfree(o);
}

/* The norm sums are per fixed chunk, so the thread count does not matter. */
TEST(lamb_threads_bit_identical)
{
    const size_t n = 100003;
    dt_optim_segment s[] = {{0, 70001, false}, {70001, 30002, false}};
    tlay l = {.lo = 0, .hi = n, .segs = s, .nseg = 2};
    float *p[2], *g[2];
    for (int run = 0; run < 2; run++) {
        dt_set_num_threads(run + 1);
        p[run] = dt_alloc(n * sizeof(float));
        g[run] = dt_alloc(n * sizeof(float));
        dt_lamb_params lp = dt_lamb_params_default();
        dt_optim *o = tlamb_init(&lp, &l);
        ASSERT(o);
        for (int t = 0; t < 2; t++) {
            for (size_t i = 0; i < n; i++) {
                if (t == 0)
                    p[run][i] = P((int)(i % 5000));
                g[run][i] = G((int)(i % 7919), t);
            }
            ASSERT_OK(tstep(o, p[run], g[run]));
        }
        tfree(o);
    }
    dt_set_num_threads(0);
    ASSERT_EQ_INT(memcmp(p[0], p[1], n * sizeof(float)), 0);
    for (int run = 0; run < 2; run++)
        dt_free(p[run]), dt_free(g[run]);
}

/* zero_grad fused into the step: same params, grads zero in the segments,
 * padding and anything outside the range untouched. */
TEST(fused_zero_grad)
{
    dt_optim_segment s[] = {{0, 13, false}, {16, 11, false}};
    tlay l = {.lo = 0, .hi = 27, .segs = s, .nseg = 2};
    for (int kind = 0; kind < 4; kind++) {
        float p[2][28], g[2][28];
        for (int z = 0; z < 2; z++) {
            dt_optim *o = kind == 0   ? tsgd_init(&(dt_sgd_params){.lr = 0.1, .momentum = 0.9}, &l)
                          : kind == 1 ? tadam_init(&(dt_adam_params){.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99}, &l)
                          : kind == 2 ? tadamw_init(&(dt_adam_params){.lr = 0.1, .beta2 = 0.5, .weight_decay = 0.1}, &l)
                                      : tlamb_init(&(dt_lamb_params){.lr = 0.1, .weight_decay = 0.1}, &l);
            ASSERT(o);
            dt_optim_set_zero_grad(o, z == 1);
            for (int i = 0; i < 28; i++)
                p[z][i] = P(i), g[z][i] = G(i, 0);
            ASSERT_OK(tstep(o, p[z], g[z]));
            tfree(o);
        }
        ASSERT_EQ_INT(count_bit_diffs(p[0], p[1], 28), 0);
        for (int i = 0; i < 28; i++) {
            bool owned = i < 13 || (i >= 16 && i < 27);
            if (owned)
                ASSERT_NEAR(g[1][i], 0, 0, 0);
            else
                ASSERT_NEAR(g[1][i], G(i, 0), 0, 0);
        }
    }
}

TEST(bad_arguments)
{
    dt_sgd_params sp = dt_sgd_params_default();
    sp.nesterov = true;
    tlay l = {.lo = 0, .hi = 4};
    ASSERT(tsgd_init(&sp, &l) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "nesterov");
    dt_optim_segment bad[] = {{4, 4, false}, {2, 4, false}};
    tlay lb = {.lo = 0, .hi = 8, .segs = bad, .nseg = 2};
    ASSERT(tsgd_init(&(dt_sgd_params){.lr = 0.1}, &lb) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "segment 1");
    tlay lr = {.lo = 5, .hi = 4};
    ASSERT(tadam_init(&(dt_adam_params){.lr = 0.1}, &lr) == NULL);
    dt_adam_params ap = dt_adam_params_default();
    ap.beta1 = 1.0;
    ASSERT(tadam_init(&ap, &l) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "betas");
    ASSERT(tlamb_init(NULL, &l) == NULL);
    dt_optim *o = tsgd_init(&(dt_sgd_params){.lr = 0.1}, &l);
    ASSERT(o);
    float x[4] = {0};
    ASSERT_STATUS(tstep(o, x, NULL), DT_ERR_NULL);
    ASSERT_STATUS(tstep(NULL, x, x), DT_ERR_NULL);
    ASSERT_STATUS(dt_optim_state(o, 0, 0, NULL, NULL, NULL), DT_ERR_RANGE);
    ASSERT_STR_EQ(dt_optim_kind_name(dt_optim_get_kind(o)), "sgd");
    ASSERT_OK(dt_optim_set_lr(o, 0.25));
    ASSERT_NEAR(dt_optim_get_lr(o), 0.25, 0, 0);
    /* a NaN, infinite or negative rate is refused and the old one kept */
    ASSERT_STATUS(dt_optim_set_lr(o, NAN), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "learning rate");
    ASSERT_STATUS(dt_optim_set_lr(o, INFINITY), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_optim_set_lr(o, -1e-3), DT_ERR_INVALID_ARG);
    ASSERT_NEAR(dt_optim_get_lr(o), 0.25, 0, 0);
    ASSERT_STATUS(dt_optim_set_lr(NULL, 0.1), DT_ERR_NULL);
    ASSERT_OK(dt_optim_set_step(o, 7));
    ASSERT_STATUS(dt_optim_set_step(o, -1), DT_ERR_INVALID_ARG);
    ASSERT(dt_optim_get_step(o) == 7);
    ASSERT_OK(dt_optim_set_step(o, 0));
    tfree(o);
    tfree(NULL);
}

/* ---- clipping ----------------------------------------------------------------- */

TEST(clip_grad_norm)
{
    /* hand: g = [3, 4], max 1: norm 5, coef = 1/(5 + 1e-6) = 0.19999996 */
    float g[2] = {3, 4}, norm;
    ASSERT_OK(dt_clip_grad_norm(g, 2, 1.0f, &norm));
    ASSERT_NEAR(norm, 5, 0, 0);
    ASSERT_NEAR(g[0], 0.59999988, 1e-7, 0);
    ASSERT_NEAR(g[1], 0.79999984, 1e-7, 0);
    /* below the max: untouched */
    float h[2] = {0.3f, 0.4f};
    ASSERT_OK(dt_clip_grad_norm(h, 2, 1.0f, &norm));
    ASSERT_NEAR(h[0], 0.3f, 0, 0);
    /* torch */
    float t[N];
    for (int i = 0; i < N; i++)
        t[i] = G(i, 0);
    ASSERT_OK(dt_clip_grad_norm(t, N, 0.5f, &norm));
    ASSERT_NEAR(norm, ref_clip_norm, 0, 2e-7);
    for (int i = 0; i < N; i++)
        ASSERT_NEAR(t[i], ref_clip[i], 0, 3e-7);
    ASSERT_STATUS(dt_clip_grad_norm(NULL, 3, 1.0f, &norm), DT_ERR_NULL);
    ASSERT_OK(dt_clip_grad_norm(NULL, 0, 1.0f, &norm));
    ASSERT_NEAR(norm, 0, 0, 0);
    /* the pieces: two halves' squares sum to the whole */
    double a = dt_grad_sqnorm(g, 1) + dt_grad_sqnorm(g + 1, 1);
    ASSERT_NEAR(a, dt_grad_sqnorm(g, 2), 1e-12, 0);
}

/* ---- schedules ------------------------------------------------------------------- */

TEST(schedules)
{
    dt_sched_params s = dt_sched_params_default();
    s.base_lr = 0.1;
    ASSERT_NEAR(dt_sched_lr(&s, 12345), 0.1, 0, 0);
    /* total - warmup and total - step overflowed int64 (undefined behaviour; UBSan in the ASan build) */
    dt_sched_params o = s;
    o.kind = DT_SCHED_LINEAR;
    o.total_steps = INT64_MIN + 5;
    o.warmup_steps = 0;
    ASSERT_NEAR(dt_sched_lr(&o, INT64_MAX), o.min_lr, 0, 0); /* past the end: the floor */
    o.kind = DT_SCHED_COSINE;
    o.total_steps = -10;
    o.warmup_steps = INT64_MAX;
    ASSERT(isfinite(dt_sched_lr(&o, INT64_MAX)));
    /* StepLR(step_size 3, gamma 0.5): steps 0-2 -> 0.1, 3-5 -> 0.05, 6 -> 0.025 */
    s.kind = DT_SCHED_STEP;
    s.step_size = 3;
    s.gamma = 0.5;
    ASSERT_NEAR(dt_sched_lr(&s, 2), 0.1, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 3), 0.05, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 6), 0.025, 1e-15, 0);
    /* cosine, warmup 10, total 110, min 0.01:
     * step 0 -> 0; step 5 -> 0.05; step 10 -> 0.1 (peak);
     * step 60 (half way) -> 0.01 + 0.09*0.5 = 0.055; step 110+ -> 0.01 */
    s.kind = DT_SCHED_COSINE;
    s.warmup_steps = 10;
    s.total_steps = 110;
    s.min_lr = 0.01;
    ASSERT_NEAR(dt_sched_lr(&s, 0), 0.0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 5), 0.05, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 10), 0.1, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 60), 0.055, 1e-12, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 500), 0.01, 1e-15, 0);
    dt_sched_kind k;
    ASSERT_OK(dt_sched_kind_parse("cosine", &k));
    ASSERT_EQ_INT(k, DT_SCHED_COSINE);
    ASSERT_STATUS(dt_sched_kind_parse("polynomial", &k), DT_ERR_INVALID_ARG);
    /* linear (HF get_linear_schedule_with_warmup), warmup 10, total 110, min 0.01: step 5 -> 0.05, step 10 ->
     * 0.1, step 60 -> 0.01 + 0.09 * 50/100 = 0.055, step 110+ -> 0.01 */
    ASSERT_OK(dt_sched_kind_parse("linear", &k));
    ASSERT_EQ_INT(k, DT_SCHED_LINEAR);
    s.kind = DT_SCHED_LINEAR;
    ASSERT_NEAR(dt_sched_lr(&s, 0), 0.0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 5), 0.05, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 10), 0.1, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 60), 0.055, 1e-12, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 85), 0.01 + 0.09 * 0.25, 1e-12, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 500), 0.01, 1e-15, 0);
    /* DeepSpeed WarmupLR's "log" ramp: ln(step + 1) / ln(warmup), warmup raised to 2 */
    s.kind = DT_SCHED_CONSTANT;
    s.warmup = DT_WARMUP_LOG;
    ASSERT_NEAR(dt_sched_lr(&s, 0), 0.0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 4), 0.1 * log(5.0) / log(10.0), 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 10), 0.1, 0, 0);
    s.warmup_steps = 1;
    ASSERT_NEAR(dt_sched_lr(&s, 0), 0.0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&s, 1), 0.1, 0, 0);
    ASSERT_STR_EQ(dt_sched_kind_name(DT_SCHED_LINEAR), "linear");
    ASSERT_STR_EQ(dt_sched_kind_name(DT_SCHED_STEP), "step");
    /* warmup_cosine (DeepSpeed WarmupCosineLR's ratio at its last_batch_iteration = step): warm-up 10 from 0.1,
       decay from the step after the warm-up's last, floor 0.05 */
    ASSERT_OK(dt_sched_kind_parse("warmup_cosine", &k));
    ASSERT_EQ_INT(k, DT_SCHED_WARMUP_COSINE);
    dt_sched_params w = dt_sched_params_default();
    w.kind = DT_SCHED_WARMUP_COSINE;
    w.base_lr = 2.0;
    w.warmup_steps = 10;
    w.total_steps = 110;
    w.warmup_start = 0.1;
    w.min_ratio = 0.05;
    ASSERT_NEAR(dt_sched_lr(&w, 0), 0.2, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&w, 5), 2.0 * (0.1 + 0.9 * 0.5), 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&w, 10), 2.0 * (0.05 + 0.95 * 0.5 * (1 + cos(M_PI / 100))), 1e-14, 0);
    ASSERT_NEAR(dt_sched_lr(&w, 59), 2.0 * (0.05 + 0.95 * 0.5), 1e-14, 0);
    ASSERT_NEAR(dt_sched_lr(&w, 109), 0.1, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&w, 5000), 0.1, 1e-15, 0); /* held at the floor, not back up the cosine */
    /* lag 1 (DeepSpeed's engine): step s has step s - 1's rate; step 0 has 0 for warmup_cosine and base_lr *
       warmup_start for the others */
    w.lag = 1;
    ASSERT_NEAR(dt_sched_lr(&w, 0), 0.0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&w, 1), 0.2, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&w, 6), 2.0 * (0.1 + 0.9 * 0.5), 1e-15, 0);
    w.kind = DT_SCHED_CONSTANT;
    ASSERT_NEAR(dt_sched_lr(&w, 0), 0.2, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&w, 11), 2.0, 0, 0);
    /* range_test: base * (1 + rate * step / size), floored with staircase */
    ASSERT_OK(dt_sched_kind_parse("range_test", &k));
    ASSERT_EQ_INT(k, DT_SCHED_RANGE_TEST);
    dt_sched_params r = dt_sched_params_default();
    r.kind = DT_SCHED_RANGE_TEST;
    r.base_lr = 0.01;
    r.step_size = 4;
    r.step_rate = 2.0;
    ASSERT_NEAR(dt_sched_lr(&r, 0), 0.01, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&r, 6), 0.01 * 4.0, 1e-15, 0);
    r.staircase = true;
    ASSERT_NEAR(dt_sched_lr(&r, 7), 0.03, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&r, 8), 0.05, 1e-15, 0);
    r.warmup_steps = 4; /* a warm-up multiplies it, as it does constant and step */
    ASSERT_NEAR(dt_sched_lr(&r, 2), 0.01 * 0.5, 1e-15, 0);
}

/* The same elements stepped as one range or as several ranges over the same
 * flats (given out of order, a tensor split between ranges, a range
 * boundary inside a chunk of a tensor larger than one chunk): bit-identical
 * parameters and states after three steps, for every kind (LAMB's
 * per-tensor norms then add up exactly across the ranges). */
static dt_status make_opt(int kind, const dt_optim_range *r, size_t nr, dt_optim **o)
{
    dt_sgd_params sp = dt_sgd_params_default();
    sp.lr = 0.1, sp.momentum = 0.9, sp.weight_decay = 0.01;
    dt_adam_params ap = kind == 2 ? dt_adamw_params_default() : dt_adam_params_default();
    ap.lr = 0.01, ap.weight_decay = 0.05;
    dt_lamb_params lp = dt_lamb_params_default();
    lp.lr = 0.02, lp.weight_decay = 0.05;
    return kind == 0   ? dt_optim_sgd_init(&sp, r, nr, o)
           : kind == 1 ? dt_optim_adam_init(&ap, r, nr, o)
           : kind == 2 ? dt_optim_adamw_init(&ap, r, nr, o)
                       : dt_optim_lamb_init(&lp, r, nr, o);
}

/* A reducer that changes nothing and keeps what it saw: the exact double
 * sums LAMB computed. */
typedef struct seen_sums {
    double v[16];
    size_t n;
} seen_sums;
static dt_status record_sums(void *ctx, double *sums, size_t n)
{
    seen_sums *r = ctx;
    for (size_t i = 0; i < n && r->n < 16; i++)
        r->v[r->n++] = sums[i];
    return DT_OK;
}

TEST(multi_range_equals_single)
{
    const size_t n = 40040; /* tensor 0: 40000 elements (3 chunks), tensor 1: 24 after padding */
    dt_optim_segment segs[] = {{0, 40000, false}, {40016, 24, true}};
    /* range cuts: inside tensor 0's second chunk, at a chunk boundary minus 1, inside tensor 1 */
    const size_t cuts[][2] = {{20000, 32767}, {7, 40020}};
    for (int kind = 0; kind < 4; kind++)
        for (size_t c = 0; c < 2; c++) {
            dt_flat Pf[2], Gf[2];
            for (int v = 0; v < 2; v++) {
                ASSERT_OK(dt_flat_alloc(&Pf[v], DT_F32, n, 1, NULL));
                ASSERT_OK(dt_flat_alloc(&Gf[v], DT_F32, n, 1, NULL));
            }
            dt_optim_range one = {.params = &Pf[0], .grads = &Gf[0], .lo = 0, .hi = n, .segs = segs, .nseg = 2};
            size_t a = cuts[c][0], b = cuts[c][1];
            /* out of order on purpose */
            dt_optim_range three[3] = {
                {.params = &Pf[1], .grads = &Gf[1], .lo = b, .hi = n, .segs = segs, .nseg = 2},
                {.params = &Pf[1], .grads = &Gf[1], .lo = 0, .hi = a, .segs = segs, .nseg = 2},
                {.params = &Pf[1], .grads = &Gf[1], .lo = a, .hi = b, .segs = segs, .nseg = 2},
            };
            dt_optim *o1 = NULL, *o3 = NULL;
            ASSERT_OK(make_opt(kind, &one, 1, &o1));
            ASSERT_OK(make_opt(kind, three, 3, &o3));
            ASSERT_EQ_INT(dt_optim_num_ranges(o3), 3);
            seen_sums q1 = {{0}, 0}, q3 = {{0}, 0};
            dt_optim_set_reducer(o1, record_sums, &q1);
            dt_optim_set_reducer(o3, record_sums, &q3);
            float *p0 = Pf[0].base, *p1 = Pf[1].base, *g0 = Gf[0].base, *g1 = Gf[1].base;
            for (size_t i = 0; i < n; i++)
                p0[i] = p1[i] = P((int)(i % 4999));
            for (int t = 0; t < 3; t++) {
                for (size_t i = 0; i < n; i++)
                    g0[i] = g1[i] = 8 * G((int)(i % 7919), t); /* large: LAMB clips */
                ASSERT_OK(dt_optim_step(o1));
                ASSERT_OK(dt_optim_step(o3));
            }
            ASSERT_EQ_INT(count_bit_diffs(p0, p1, (int)n), 0);
            ASSERT_EQ_INT(count_bit_diffs(g0, g1, (int)n), 0); /* LAMB's u */
            ASSERT(dt_optim_last_grad_norm(o1) == dt_optim_last_grad_norm(o3));
            /* LAMB: the norms' double sums themselves, bit for bit (5 per step) */
            ASSERT_EQ_INT(q1.n, kind == 3 ? 15 : 0);
            ASSERT_EQ_INT(q3.n, q1.n);
            ASSERT_EQ_INT(memcmp(q1.v, q3.v, q1.n * sizeof(double)), 0);
            /* states: range r of o3 holds [lo, hi) of o1's single state */
            for (int si = 0; si < dt_optim_num_states(o1); si++) {
                float *s1;
                ASSERT_OK(dt_optim_state(o1, 0, si, NULL, &s1, NULL));
                for (size_t r = 0; r < 3; r++) {
                    float *s3;
                    size_t len;
                    ASSERT_OK(dt_optim_state(o3, r, si, NULL, &s3, &len));
                    ASSERT_EQ_INT(len, three[r].hi - three[r].lo);
                    ASSERT_EQ_INT(count_bit_diffs(s1 + three[r].lo, s3, (int)len), 0);
                }
            }
            /* the parameters moved (the test can fail) */
            ASSERT(p0[5] != P(5));
            dt_optim_free(o1);
            dt_optim_free(o3);
            for (int v = 0; v < 2; v++)
                dt_flat_free(&Pf[v]), dt_flat_free(&Gf[v]);
        }
}

/* Ranges that overlap in one flat, a mirror of no float dtype, non-f32
 * params, a flat that no
 * longer holds its range at step time: clear errors. */
TEST(range_errors)
{
    float mem[32] = {0}, gm[32] = {0};
    dt_flat p, g, h;
    ASSERT_OK(dt_flat_wrap(&p, DT_F32, mem, 32));
    ASSERT_OK(dt_flat_wrap(&g, DT_F32, gm, 32));
    ASSERT_OK(dt_flat_wrap(&h, DT_BF16, mem, 32));
    dt_sgd_params sp = dt_sgd_params_default();
    dt_optim *o = (dt_optim *)&o;
    dt_optim_range two[2] = {{.params = &p, .grads = &g, .lo = 0, .hi = 10},
                             {.params = &p, .grads = &g, .lo = 9, .hi = 20}};
    ASSERT_STATUS(dt_optim_sgd_init(&sp, two, 2, &o), DT_ERR_INVALID_ARG);
    ASSERT(o == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "overlap");
    dt_flat q;
    ASSERT_OK(dt_flat_wrap(&q, DT_I32, mem, 32));
    dt_optim_range r = {.params = &p, .grads = &g, .lo = 0, .hi = 10, .mirror = &q};
    ASSERT_STATUS(dt_optim_sgd_init(&sp, &r, 1, &o), DT_ERR_DTYPE);
    r.mirror = &p; /* the params themselves */
    ASSERT_STATUS(dt_optim_sgd_init(&sp, &r, 1, &o), DT_ERR_INVALID_ARG);
    r.mirror = NULL, r.params = &h;
    ASSERT_STATUS(dt_optim_adam_init(&(dt_adam_params){.lr = 0.1}, &r, 1, &o), DT_ERR_DTYPE);
    r.params = NULL;
    ASSERT_STATUS(dt_optim_lamb_init(&(dt_lamb_params){.lr = 0.1}, &r, 1, &o), DT_ERR_NULL);
    ASSERT_STATUS(dt_optim_sgd_init(&sp, &r, 1, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_optim_sgd_init(NULL, &r, 1, &o), DT_ERR_NULL);
    /* the flat shrinks under the optimizer: refused at the step, nothing moves */
    r.params = &p;
    r.hi = 32;
    mem[0] = 1, gm[0] = 1;
    ASSERT_OK(dt_optim_sgd_init(&sp, &r, 1, &o));
    p.numel = 16;
    ASSERT_STATUS(dt_optim_step(o), DT_ERR_RANGE);
    ASSERT_NEAR(mem[0], 1, 0, 0);
    p.numel = 32, g.base = NULL;
    ASSERT_STATUS(dt_optim_step(o), DT_ERR_NULL);
    g.base = gm;
    ASSERT_OK(dt_optim_step(o));
    ASSERT(mem[0] < 1);
    ASSERT_STATUS(dt_optim_step(NULL), DT_ERR_NULL);
    dt_optim_free(o);
}

int main(void)
{
    RUN(sgd_hand);
    RUN(adam_hand);
    RUN(lamb_hand);
    RUN(lion);
    RUN(torch_bit_exact_simd);
    RUN(torch_bit_exact_scalar);
    RUN(torch_bit_exact_avx512);
    RUN(kernels_levels_bit_identical);
    RUN(adam_bf16_one_sweep_equals_parts);
    RUN(shards_equal_whole);
    RUN(lamb_sharded_with_reducer);
    RUN(segments_gaps_and_no_decay);
    RUN(lamb_threads_bit_identical);
    RUN(fused_zero_grad);
    RUN(bad_arguments);
    RUN(multi_range_equals_single);
    RUN(range_errors);
    RUN(clip_grad_norm);
    RUN(schedules);
    return TEST_REPORT();
}
