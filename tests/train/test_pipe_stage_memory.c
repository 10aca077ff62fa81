/* A pipeline rank holds only its own stages' parameters and gradients
 * (pipeline.h), checked on real processes by asking the kernel which pages
 * of the model's flats are resident (mincore): a GPT of 4 blocks (flats
 * large enough to be mapped, DT_FLAT_MAP_MIN) cut into 2 stages (and 4
 * stages on 2 ranks, interleaved, also with 2 replicas: DDP x pp), with
 * its wte shared by the first and the last stage. At each point below, on every rank, no whole page inside
 * an entry that none of its stages uses is resident, in the parameter or
 * the gradient flat, and every page of the entries it uses is:
 *
 *   - after dt_trainer_init (the model was built whole, then given back);
 *   - after two steps (losses equal the single-process run's);
 *   - after an evaluation (run through the stages: the loss equals the
 *     single process's, yet no rank took the other stages' parameters);
 *   - after loading a checkpoint saved at pp 2 (which a single-process
 *     trainer loads too, to the same values bit for bit: the tied wte
 *     included) and after loading one saved by a single process.
 *
 * The equalities are those of pipe_train.h (rounding only); a rank that
 * computed with the other stages' given-back pages would read zeros and be
 * far off. Last, an evaluation whose loss fails on the last stage fails on
 * every rank at once, with its message (not after the group's timeout of
 * 300 s: the harness would kill the ranks first). */
// dt-test-timeout: 300
// dt-test-labels: threads
#include "comm/harness.h"
#include "model_util.h"
#include "test.h"
#include "tmp_util.h"

#include "dtrain/data.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/train.h"
#include "parallel/pipeline/pipe_impl.h"
#include "train/pipe_entries.h"
#include "train/train_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define T_SEQ 8
#define B_ROWS 8
#define N_EVAL 8

static dt_model_config cfg(void)
{
    dt_model_config c = dt_model_config_default();
    c.n_layer = 4, c.n_head = 2, c.n_embd = 64, c.block_size = 16, c.vocab_size = 512, c.seq = T_SEQ;
    return c;
}

static void tokens(int64_t first, int64_t n, int64_t *x, int64_t *y)
{
    for (int64_t i = 0; i < n * T_SEQ; i++) {
        x[i] = ((first * T_SEQ + i) * 7 + 3) % 512;
        y[i] = ((first * T_SEQ + i) * 5 + 1) % 512;
    }
}

/* The evaluation set: N_EVAL windows of T_SEQ tokens. */
static int64_t ev_len(void *self) { return (void)self, N_EVAL; }
static dt_status ev_item(void *self, int64_t i, void *x, void *y)
{
    (void)self;
    tokens(100 + i, 1, x, y);
    return DT_OK;
}
static const dt_dataset_vtable k_ev = {.version = DT_DATASET_VTABLE_VERSION, .name = "tokens", .length = ev_len,
                                       .get_item = ev_item};

typedef struct {
    const char *dir;
    dt_pipe_kind kind;
    int dp; /* replicas (world = 2 dp) */
    bool meta;        /* the pipeline's model is built meta: each rank initialises its stages */
    dt_init_rng rng;  /* the reference's (and the meta model's) initial values */
    int zero;         /* the replicas: DDP (0) or ZeRO-1 */
} cfg_arg;

/* Whole pages inside elements [lo, hi) of flat f: how many, and resident. */
static void pages(const dt_flat *f, size_t lo, size_t hi, size_t *whole, size_t *res)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)f->base + lo * 4, b = (uintptr_t)f->base + hi * 4;
    a = (a + pg - 1) / pg * pg;
    b = b / pg * pg;
    *whole = *res = 0;
    if (b <= a)
        return;
    size_t n = (b - a) / pg;
    unsigned char *v = malloc(n);
    if (v && mincore((void *)a, b - a, v) == 0)
        for (size_t i = 0; i < n; i++)
            *res += v[i] & 1;
    *whole = n;
    free(v);
}

/* The residency rule of the overview; held[e]: this rank's stages use e. */
static int check_resident(const dt_model *m, const bool *held, int rank, const char *when)
{
    const dt_flat *F[2] = {dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), dt_model_flat(m, DT_FLAT_GRADS, DT_F32)};
    TH_CHECK(F[0] && F[1] && F[0]->mapped && F[1]->mapped, "rank %d: the flats are not mapped", rank);
    size_t other = 0, other_res = 0, own = 0, own_res = 0;
    for (size_t e = 0; e < dt_model_num_entries(m); e++) {
        dt_param_info pi;
        TH_OK(dt_model_entry(m, e, &pi));
        if (pi.is_buffer || pi.tied_to >= 0)
            continue;
        for (int r = 0; r < 2; r++) {
            size_t w, res;
            pages(F[r], pi.offset, pi.offset + pi.numel, &w, &res);
            if (held[e])
                own += r == 0 ? w : 0, own_res += r == 0 ? res : 0;
            else
                other += w, other_res += res;
            TH_CHECK(held[e] || res == 0, "rank %d, %s: %zu of the %zu pages of %s's %s are resident", rank, when,
                     res, w, pi.name, r ? "gradient" : "parameters");
        }
    }
    TH_CHECK(other > 0 && own > 0, "rank %d: %zu pages of other stages, %zu of its own: nothing to check", rank, other,
             own);
    TH_CHECK(own_res == own, "rank %d, %s: %zu of its %zu parameter pages resident", rank, when, own_res, own);
    fprintf(stderr, "rank %d, %s: other stages' pages resident %zu of %zu, its own parameters' %zu of %zu\n", rank,
            when, other_res, other, own_res, own);
    return 0;
}

/* The optimizer's state (AdamW: two per element) between the segments a
 * rank steps holds no memory: an interleaved rank's range spans the other
 * ranks' stages between its chunks, and no whole page of that stretch of
 * a state is resident (it was, with the state zero-filled over the whole
 * range); dt_trainer_memory_get counts the segments' elements (and the
 * padding between them), not the span. gaps: each rank's range must have
 * such a stretch (interleaved, no ZeRO-1 share cutting it away). */
static int check_optim_resident(dt_trainer *tr, int rank, const char *when, bool gaps)
{
    const dt_optim_range *rg;
    size_t nr;
    dt__trainer_ranges(tr, &rg, &nr);
    dt_optim *o = dt_trainer_optim(tr);
    TH_CHECK(o && dt_optim_num_states(o) == 2, "rank %d: not AdamW's two states", rank);
    size_t gap_pages = 0, gap_res = 0, seg_elems = 0, nseg = 0;
    for (size_t k = 0; k < nr; k++) {
        const dt_optim_range *r = &rg[k];
        const dt_optim_segment whole = {r->lo, r->hi - r->lo, false};
        const dt_optim_segment *sg = r->segs ? r->segs : &whole;
        const size_t ns = r->segs ? r->nseg : 1;
        for (size_t i = 0; i < ns; i++) {
            size_t a = sg[i].offset < r->lo ? r->lo : sg[i].offset, b = sg[i].offset + sg[i].numel;
            b = b > r->hi ? r->hi : b;
            seg_elems += b > a ? b - a : 0;
        }
        nseg += ns;
        for (int st = 0; st < 2; st++) {
            float *data;
            TH_OK(dt_optim_state(o, k, st, NULL, &data, NULL));
            const dt_flat view = {.dtype = DT_F32, .base = data};
            size_t prev = r->lo;
            for (size_t i = 0; i <= ns; i++) {
                size_t a = i < ns ? (sg[i].offset < r->lo ? r->lo : sg[i].offset) : r->hi;
                if (a > prev + DT_ALIGN) { /* not padding: elements this range never steps */
                    size_t w, res;
                    pages(&view, prev - r->lo, a - r->lo, &w, &res);
                    gap_pages += w, gap_res += res;
                }
                if (i < ns && sg[i].offset + sg[i].numel > prev)
                    prev = sg[i].offset + sg[i].numel;
            }
        }
    }
    TH_CHECK(gap_res == 0, "rank %d, %s: %zu of the %zu optimizer-state pages between its stages are resident", rank,
             when, gap_res, gap_pages);
    TH_CHECK(!gaps || gap_pages > 0, "rank %d: no optimizer-state pages between its stages: nothing to check", rank);
    dt_trainer_memory mem;
    TH_OK(dt_trainer_memory_get(tr, &mem));
    const size_t lo_b = 2 * 4 * seg_elems, hi_b = 2 * 4 * (seg_elems + (size_t)DT_ALIGN * nseg);
    TH_CHECK(mem.optim_bytes >= lo_b && mem.optim_bytes <= hi_b,
             "rank %d, %s: optimizer states %zu bytes reported, its segments hold %zu elements (2 x 4 bytes each)",
             rank, when, mem.optim_bytes, seg_elems);
    if (gaps)
        fprintf(stderr, "rank %d, %s: optimizer-state pages between its stages resident 0 of %zu; %zu bytes of "
                "states reported for %zu elements\n", rank, when, gap_pages, mem.optim_bytes, seg_elems);
    return 0;
}

static bool fail_loss; /* set: the loss fails (in each rank's own copy of this variable) */

static dt_tensor *loss_fn(void *ud, dt_ctx *ctx, dt_tensor *out, dt_tensor *y)
{
    if (fail_loss) {
        dt_error(DT_ERR_INVALID_ARG, "an injected loss failure");
        return NULL;
    }
    return dt_model_desc_loss_fn(ud, ctx, out, y);
}

static dt_status trainer_for(dt_model *m, dt_model_desc *d, dt_strategy *s, dt_trainer **tr)
{
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.adamw.lr = 1e-3;
    tp.loss_fn = loss_fn;
    tp.loss_ud = d;
    return dt_trainer_init(m, s, &tp, tr);
}

/* The entries this rank's held[] says it holds are equal in a and b, bit for bit. */
static int same_held(const dt_model *a, const dt_model *b, const bool *held, int rank, const char *when)
{
    const float *pa = t_params(a), *pb = t_params(b);
    for (size_t e = 0; e < dt_model_num_entries(a); e++) {
        dt_param_info pi;
        TH_OK(dt_model_entry(a, e, &pi));
        if (pi.is_buffer || pi.tied_to >= 0 || !held[e])
            continue;
        TH_CHECK(memcmp(pa + pi.offset, pb + pi.offset, pi.numel * sizeof *pa) == 0,
                 "rank %d, %s: %s differs from the single-process trainer's", rank, when, pi.name);
    }
    return 0;
}

static int eval_equal(dt_trainer *tr, dt_trainer *trr, int dp, int rank, const char *when)
{
    dt_dataset *ds;
    dt_dataset_info info = {.x_dtype = DT_I64, .x_ndim = 1, .x_shape = {T_SEQ}, .y_dtype = DT_I64, .y_ndim = 1,
                            .y_shape = {T_SEQ}};
    TH_OK(dt_dataset_init(&k_ev, NULL, &info, &ds));
    dt_sampler *sa, *sb;
    TH_OK(dt_sampler_sequential_init(N_EVAL, &sa));
    TH_OK(dt_sampler_sequential_init(N_EVAL, &sb));
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = 4;
    lp.background = false;
    dt_loader *la, *lb;
    TH_OK(dt_loader_init(ds, sa, &lp, &la));
    TH_OK(dt_loader_init(ds, sb, &lp, &lb));
    dt_trainer_eval_result ra, rb;
    TH_OK(dt_trainer_evaluate(tr, la, &info, &ra));
    TH_OK(dt_trainer_evaluate(trr, lb, &info, &rb));
    TH_CHECK(ra.items == dp * N_EVAL && rb.items == N_EVAL, "rank %d: %lld and %lld items", rank,
             (long long)ra.items, (long long)rb.items);
    TH_CHECK(fabs(ra.loss - rb.loss) <= 1e-5 * fabs(rb.loss), "rank %d, %s: evaluation loss %.9g, one process %.9g",
             rank, when, ra.loss, rb.loss);
    dt_loader_free(la);
    dt_loader_free(lb);
    dt_sampler_free(sa);
    dt_sampler_free(sb);
    dt_dataset_free(ds);
    return 0;
}

static int body(int rank, int size, void *arg)
{
    const cfg_arg *a = arg;
    dt_model_config mc = cfg();
    dt_model *m, *ref;
    dt_model_desc dm, dref;
    TH_OK(dt_model_create("gpt-micro", 11, &mc, &ref, &dref));
    if (a->rng == DT_INIT_TORCH)
        TH_OK(dt_model_init_torch(ref, 11));
    mc.build.meta = a->meta;
    TH_OK(dt_model_create("gpt-micro", 11, &mc, &m, &dm));
    if (!a->meta && a->rng == DT_INIT_TORCH)
        TH_OK(dt_model_init_torch(m, 11));
    TH_CHECK(!a->meta || !dt_model_flat(m, DT_FLAT_PARAMS, DT_F32)->base, "rank %d: a meta build has parameters",
             rank);
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = size / a->dp;
    pp.schedule = a->kind;
    pp.micro_batches = 2;
    pp.init_rng = a->rng;
    pp.init_seed = 11;
    pp.zero = a->zero;
    dt_strategy *s, *none;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    TH_OK(dt_strategy_none_init(&none));
    dt_trainer *tr, *trr;
    TH_OK(trainer_for(m, &dm, s, &tr));
    TH_OK(trainer_for(ref, &dref, none, &trr));

    /* which entries this rank's stages use (a tied one: its storage) */
    bool *held = pipe_rank_entries(s, m, true);
    TH_CHECK(held, "rank %d: the stages' entries: %s", rank, dt_last_error());
    TH_CHECK(held[0], "rank %d: the shared wte (entry 0) is not held by the first and the last stage", rank);
    /* a meta model: nothing gave pages back (init_stages), so none outside was ever written */
    const bool gaps = a->kind == DT_PIPE_INTERLEAVED && !a->zero;
    if (check_resident(m, held, rank, "after init") || check_optim_resident(tr, rank, "after init", gaps) ||
        same_held(m, ref, held, rank, "the pipeline's initial values (a whole build's)"))
        return 1;

    int64_t x[B_ROWS * T_SEQ], y[B_ROWS * T_SEQ];
    tokens(0, B_ROWS, x, y);
    dt_trainer_batch b = dt_trainer_batch_make(x, DT_I64, 2, (int64_t[]){B_ROWS, T_SEQ}, y, DT_I64, 2,
                                               (int64_t[]){B_ROWS, T_SEQ});
    for (int step = 0; step < 2; step++) {
        dt_trainer_metrics mp, mr;
        TH_OK(dt_trainer_step(tr, &b, 1, &mp));
        TH_OK(dt_trainer_step(trr, &b, 1, &mr));
        TH_CHECK(fabs(mp.loss - mr.loss) <= 1e-5 * fabs(mr.loss), "rank %d, step %d: loss %.9g, one process %.9g",
                 rank, step, mp.loss, mr.loss);
    }
    if (check_resident(m, held, rank, "after two steps") || check_optim_resident(tr, rank, "after two steps", gaps) ||
        eval_equal(tr, trr, a->dp, rank, "after two steps") ||
        check_resident(m, held, rank, "after an evaluation"))
        return 1;

    /* pp 2 -> one process: the pipeline's checkpoint into the reference */
    char d1[400], d2[400];
    snprintf(d1, sizeof d1, "%s/dp%d_%s", a->dir, a->dp, dt_pipe_kind_name(a->kind));
    snprintf(d2, sizeof d2, "%s/one_dp%d_%s", a->dir, a->dp, dt_pipe_kind_name(a->kind));
    dt_trainer_save_params sp = dt_trainer_save_params_default();
    TH_OK(dt_trainer_save(tr, d1, &sp));
    TH_OK(dt_trainer_load(trr, d1, NULL));
    if (same_held(m, ref, held, rank, "the single process after loading the pipeline's checkpoint") ||
        eval_equal(tr, trr, a->dp, rank, "after the single process loaded the pipeline's checkpoint"))
        return 1;
    /* one process -> pp 2: the reference steps on, saves (rank 0), the pipeline loads it */
    dt_trainer_metrics mr;
    TH_OK(dt_trainer_step(trr, &b, 1, &mr));
    if (rank == 0)
        TH_OK(dt_trainer_save(trr, d2, &sp));
    TH_OK(dt_pg_barrier(pg));
    TH_OK(dt_trainer_load(tr, d2, NULL));
    if (same_held(m, ref, held, rank, "the pipeline after loading the single process's checkpoint") ||
        check_resident(m, held, rank, "after a load") || eval_equal(tr, trr, a->dp, rank, "after loading"))
        return 1;
    dt_trainer_metrics mp;
    TH_OK(dt_trainer_step(tr, &b, 1, &mp));
    TH_OK(dt_trainer_step(trr, &b, 1, &mr));
    TH_CHECK(fabs(mp.loss - mr.loss) <= 1e-5 * fabs(mr.loss), "rank %d, after the load: loss %.9g, one process %.9g",
             rank, mp.loss, mr.loss);
    if (check_resident(m, held, rank, "after a step from the load") ||
        check_optim_resident(tr, rank, "after a step from the load", gaps))
        return 1;
    free(held);
    dt_trainer_free(tr);
    dt_trainer_free(trr);
    dt_model_free(m);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

/* The last stage's loss fails during an evaluation: every rank's fails. */
static int body_fail(int rank, int size, void *arg)
{
    (void)arg;
    dt_model_config mc = cfg();
    dt_model *m;
    dt_model_desc dm;
    TH_OK(dt_model_create("gpt-micro", 11, &mc, &m, &dm));
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = size;
    pp.micro_batches = 2;
    dt_strategy *s;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    dt_trainer *tr;
    TH_OK(trainer_for(m, &dm, s, &tr));
    dt_dataset *ds;
    dt_dataset_info info = {.x_dtype = DT_I64, .x_ndim = 1, .x_shape = {T_SEQ}, .y_dtype = DT_I64, .y_ndim = 1,
                            .y_shape = {T_SEQ}};
    TH_OK(dt_dataset_init(&k_ev, NULL, &info, &ds));
    dt_sampler *sa;
    TH_OK(dt_sampler_sequential_init(N_EVAL, &sa));
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = 4;
    lp.background = false;
    dt_loader *la;
    TH_OK(dt_loader_init(ds, sa, &lp, &la));
    fail_loss = true;
    dt_trainer_eval_result r;
    dt_status st = dt_trainer_evaluate(tr, la, &info, &r);
    TH_CHECK(st < 0, "rank %d: the evaluation succeeded", rank);
    TH_CHECK(strstr(dt_last_error(), "an injected loss failure"), "rank %d: error '%s'", rank, dt_last_error());
    fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
    dt_loader_free(la);
    dt_sampler_free(sa);
    dt_dataset_free(ds);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

static void run_cfg(dt_pipe_kind kind, int dp, bool meta, dt_init_rng rng, int zero)
{
    cfg_arg a = {t_tmpdir("pipe_stage_memory"), kind, dp, meta, rng, zero};
    ASSERT_NE_INT(a.dir[0], 0);
    int codes[4];
    ASSERT_EQ_INT(th_run(2 * dp, 90.0, body, &a, codes), 0);
}

static void run_kind(dt_pipe_kind kind, int dp) { run_cfg(kind, dp, false, DT_INIT_PHILOX, 0); }

/* A meta model cannot be timed whole at attach (DT_PIPE_BY_TIME): a clear
 * error on every rank, before any collective. */
static int body_meta_time(int rank, int size, void *arg)
{
    (void)arg;
    dt_model_config mc = cfg();
    mc.build.meta = true;
    dt_model *m;
    dt_model_desc dm;
    TH_OK(dt_model_create("gpt-micro", 11, &mc, &m, &dm));
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    int64_t x[2 * T_SEQ] = {0};
    dt_trainer_batch b = dt_trainer_batch_make(x, DT_I64, 2, (int64_t[]){2, T_SEQ}, x, DT_I64, 2,
                                               (int64_t[]){2, T_SEQ});
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = size;
    pp.micro_batches = 2;
    pp.balance = DT_PIPE_BY_TIME;
    pp.sample = &b;
    dt_strategy *s;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    dt_trainer *tr;
    TH_CHECK(trainer_for(m, &dm, s, &tr) < 0, "rank %d: a meta model was timed", rank);
    TH_CHECK(strstr(dt_last_error(), "DT_PIPE_BY_TIME") && strstr(dt_last_error(), "whole"), "rank %d: error '%s'",
             rank, dt_last_error());
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(two_stages_hold_their_own_parameters) { run_kind(DT_PIPE_1F1B, 1); }

TEST(interleaved_four_stages_on_two_ranks) { run_kind(DT_PIPE_INTERLEAVED, 1); }

/* the replicas' gradient average does not touch the stage between a rank's chunks */
TEST(interleaved_two_replicas) { run_kind(DT_PIPE_INTERLEAVED, 2); }

/* built meta: each rank maps its flats and initialises its stages only */
TEST(meta_two_stages_philox) { run_cfg(DT_PIPE_1F1B, 1, true, DT_INIT_PHILOX, 0); }

TEST(meta_two_stages_torch_order) { run_cfg(DT_PIPE_1F1B, 1, true, DT_INIT_TORCH, 0); }

TEST(meta_interleaved_two_replicas) { run_cfg(DT_PIPE_INTERLEAVED, 2, true, DT_INIT_PHILOX, 0); }

/* ZeRO-1's reduce-scatter and all-gather go run by run too: not over the
 * stage between a rank's chunks */
TEST(interleaved_two_replicas_zero1) { run_cfg(DT_PIPE_INTERLEAVED, 2, false, DT_INIT_PHILOX, 1); }

TEST(meta_interleaved_two_replicas_zero1) { run_cfg(DT_PIPE_INTERLEAVED, 2, true, DT_INIT_TORCH, 1); }

TEST(meta_by_time_is_refused)
{
    int codes[2];
    ASSERT_EQ_INT(th_run(2, 60.0, body_meta_time, NULL, codes), 0);
}

TEST(a_failed_evaluation_fails_every_rank_at_once)
{
    unsetenv("DT_COMM_TIMEOUT"); /* 300 s: a rank left waiting outlives the harness's 60 */
    int codes[2];
    ASSERT_EQ_INT(th_run(2, 60.0, body_fail, NULL, codes), 0);
}

int main(void)
{
    RUN(two_stages_hold_their_own_parameters);
    RUN(interleaved_four_stages_on_two_ranks);
    RUN(interleaved_two_replicas);
    RUN(meta_two_stages_philox);
    RUN(meta_two_stages_torch_order);
    RUN(meta_interleaved_two_replicas);
    RUN(interleaved_two_replicas_zero1);
    RUN(meta_interleaved_two_replicas_zero1);
    RUN(meta_by_time_is_refused);
    RUN(a_failed_evaluation_fails_every_rank_at_once);
    t_rm_rf(t_tmpdir("pipe_stage_memory"));
    return TEST_REPORT();
}
