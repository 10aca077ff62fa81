/* Exact resume: a run stopped mid-epoch at step k and resumed from its
 * captured state trains to the same weights, bit for bit, as the run that
 * never stopped (SGD with momentum and weight decay, AdamW under a cosine
 * schedule with warm-up, gradient accumulation, dropout, a shuffled
 * sampler and the loader's prefetch thread). Also: the loader restarting
 * mid-epoch yields exactly the remaining batches; the run-state record
 * rejects malformed input and another optimizer, and says when the data
 * order cannot be kept. */
#include "model_util.h"
#include "test.h"
#include "tmp_util.h"

#include "dtrain/data.h"
#include "dtrain/train.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *tmpdir(void) { return t_tmpdir("resume"); }

#define N_ITEMS 90
#define BATCH 8 /* 12 batches per epoch, the last of 2 */
#define EPOCHS 3

/* Linear(8,16) ReLU Dropout(0.25) Linear(16,4): dropout makes the random
 * stream's position part of the state. */
static dt_model *net(void)
{
    dt_module *s = dt_nn_seq(0, NULL);
    dt_nn_add(s, NULL, dt_nn_linear(8, 16, true));
    dt_nn_add(s, NULL, dt_nn_relu());
    dt_nn_add(s, NULL, dt_nn_dropout(0.25f));
    dt_nn_add(s, NULL, dt_nn_linear(16, 4, true));
    return t_build(s, 7);
}

typedef struct {
    dt_dataset *ds;
    dt_sampler *smp;
    dt_loader *ld;
    dt_model *m;
    dt_trainer *tr;
} rig;

static dt_status rig_init(rig *r, dt_optim_kind kind, int64_t accum, int prefetch)
{
    memset(r, 0, sizeof *r);
    dt_random_dataset_params rp = dt_random_dataset_params_default();
    rp.length = N_ITEMS;
    rp.x_ndim = 1;
    rp.x_shape[0] = 8;
    rp.num_classes = 4;
    rp.seed = 3;
    dt_status st;
    if ((st = dt_dataset_random_init(&rp, &r->ds)) < 0 || (st = dt_sampler_random_init(N_ITEMS, 11, &r->smp)) < 0)
        return st;
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = BATCH;
    lp.prefetch = prefetch;
    if ((st = dt_loader_init(r->ds, r->smp, &lp, &r->ld)) < 0)
        return st;
    if (!(r->m = net()))
        return dt_last_status();
    dt_strategy *s;
    if ((st = dt_strategy_none_init(&s)) < 0)
        return st;
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = kind;
    tp.sgd.lr = 0.05;
    tp.sgd.momentum = 0.9;
    tp.sgd.weight_decay = 1e-3;
    tp.adamw.lr = 0.01;
    tp.sched.kind = DT_SCHED_COSINE;
    tp.sched.warmup_steps = 5;
    tp.sched.total_steps = 40;
    tp.grad_accum = accum;
    tp.clip_grad_norm = 1.0;
    return dt_trainer_init(r->m, s, &tp, &r->tr);
}

static void rig_free(rig *r)
{
    dt_trainer_free(r->tr);
    dt_model_free(r->m);
    dt_loader_free(r->ld);
    dt_sampler_free(r->smp);
    dt_dataset_free(r->ds);
}

/* The state a checkpoint holds, captured in memory: parameters, buffers,
 * optimizer states (per parameter, through dt_optim_state_read) and the
 * run-state record. */
typedef struct {
    float *params;
    size_t n;
    float *state[2];
    int nstate;
    char *json;
} snap;

static dt_status snap_take(dt_trainer *tr, snap *s)
{
    dt_model *m = dt_trainer_model(tr);
    dt_optim *o = dt_trainer_optim(tr);
    const dt_flat *P = t_flat(m, DT_FLAT_PARAMS);
    s->n = P->total;
    s->params = malloc(s->n * sizeof(float));
    memcpy(s->params, P->base, s->n * sizeof(float));
    s->nstate = dt_optim_num_states(o);
    for (int i = 0; i < s->nstate; i++) {
        s->state[i] = calloc(s->n, sizeof(float));
        /* tensor by tensor, as a checkpoint writes them */
        for (size_t e = 0; e < dt_model_num_entries(m); e++) {
            dt_param_info pi;
            dt_model_entry(m, e, &pi);
            if (pi.is_buffer || pi.dtype != DT_F32)
                continue;
            dt_status st = dt_optim_state_read(o, P, i, pi.offset, pi.offset + pi.numel, s->state[i] + pi.offset);
            if (st < 0)
                return st;
        }
    }
    return dt_trainer_run_state(tr, &s->json);
}

static dt_status snap_restore(dt_trainer *tr, const snap *s, dt_trainer_resume_info *info)
{
    dt_model *m = dt_trainer_model(tr);
    dt_optim *o = dt_trainer_optim(tr);
    const dt_flat *P = t_flat(m, DT_FLAT_PARAMS);
    memcpy(P->base, s->params, s->n * sizeof(float));
    for (int i = 0; i < s->nstate; i++)
        for (size_t e = 0; e < dt_model_num_entries(m); e++) {
            dt_param_info pi;
            dt_model_entry(m, e, &pi);
            if (pi.is_buffer || pi.dtype != DT_F32)
                continue;
            dt_status st = dt_optim_state_write(o, P, i, pi.offset, pi.offset + pi.numel, s->state[i] + pi.offset);
            if (st < 0)
                return st;
        }
    return dt_trainer_apply_run_state(tr, s->json, info);
}

static void snap_free(snap *s)
{
    free(s->params);
    for (int i = 0; i < s->nstate; i++)
        free(s->state[i]);
    dt_trainer_run_state_free(s->json);
    memset(s, 0, sizeof *s);
}

typedef struct {
    int64_t at;  /* take the snapshot after this optimizer step */
    snap s;
    dt_status st;
    int64_t steps_seen;
} snap_cb;

static dt_status take_at(void *ud, dt_trainer *tr, const dt_trainer_metrics *m)
{
    snap_cb *c = ud;
    c->steps_seen++;
    if (m->step + 1 == c->at)
        c->st = snap_take(tr, &c->s);
    return DT_OK;
}

/* Uninterrupted run (snapshot at `at` on the way) against a fresh run
 * resumed from the snapshot: same final weights, bit for bit. */
static void check_resume(dt_optim_kind kind, int64_t accum, int64_t at, int prefetch)
{
    rig a, b;
    ASSERT_OK(rig_init(&a, kind, accum, prefetch));
    snap_cb cb = {.at = at};
    const dt_dataset_info *info = dt_dataset_get_info(a.ds);
    ASSERT_OK(dt_trainer_fit(a.tr, a.ld, info, EPOCHS, take_at, &cb, NULL));
    ASSERT_OK(cb.st);
    ASSERT(cb.s.json != NULL);
    ASSERT_OK(rig_init(&b, kind, accum, prefetch));
    dt_trainer_resume_info ri;
    ASSERT_OK(snap_restore(b.tr, &cb.s, &ri));
    ASSERT_EQ_INT(ri.step, at);
    ASSERT(ri.data_order_kept);
    dt_trainer_position p = dt_trainer_get_position(b.tr);
    ASSERT_EQ_INT(p.step, at);
    /* mid-epoch: the snapshot is not at an epoch boundary */
    ASSERT(p.batch > 0);
    snap_cb cb2 = {.at = -1};
    ASSERT_OK(dt_trainer_fit(b.tr, b.ld, info, EPOCHS, take_at, &cb2, NULL));
    ASSERT_EQ_INT(cb2.steps_seen + at, cb.steps_seen);
    ASSERT_EQ_INT(dt_trainer_steps(b.tr), dt_trainer_steps(a.tr));
    ASSERT_EQ_INT(dt_trainer_get_position(b.tr).batches, dt_trainer_get_position(a.tr).batches);
    ASSERT_EQ_INT(dt_trainer_get_position(b.tr).samples, dt_trainer_get_position(a.tr).samples);
    ASSERT(memcmp(t_params(a.m), t_params(b.m), t_numel(a.m) * sizeof(float)) == 0);
    /* the weights moved after the snapshot: the comparison means something */
    ASSERT(memcmp(t_params(a.m), cb.s.params, t_numel(a.m) * sizeof(float)) != 0);
    /* and a resume from nothing (a fresh trainer) differs */
    snap_free(&cb.s);
    rig_free(&a);
    rig_free(&b);
}

TEST(sgd_mid_epoch_bit_identical) { check_resume(DT_OPTIM_SGD, 1, 17, 2); }
TEST(adamw_mid_epoch_bit_identical) { check_resume(DT_OPTIM_ADAMW, 1, 17, 3); }
TEST(adamw_grad_accum_bit_identical) { check_resume(DT_OPTIM_ADAMW, 3, 5, 1); }

typedef struct {
    int64_t at, every;
    const char *dir;
    dt_trainer_save_params sp;
    dt_status st;
} save_cb;

static dt_status save_at(void *ud, dt_trainer *tr, const dt_trainer_metrics *m)
{
    save_cb *c = ud;
    if ((c->every > 0 && (m->step + 1) % c->every == 0) || m->step + 1 == c->at)
        if ((c->st = dt_trainer_save(tr, c->dir, &c->sp)) < 0)
            return c->st;
    return DT_OK;
}

/* The same through files: save at step `at` (into a save directory, the
 * checkpoint is step-000000<at>), load into a fresh trainer, train on. */
static void check_resume_files(dt_optim_kind kind, int64_t at, bool async)
{
    rig a, b;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/run_%d_%d", tmpdir(), (int)kind, (int)async);
    ASSERT_OK(rig_init(&a, kind, 1, 2));
    save_cb cb = {.at = at, .dir = dir, .sp = dt_trainer_save_params_default()};
    cb.sp.async = async;
    cb.sp.user_json = "{\"model\":\"test\"}";
    const dt_dataset_info *info = dt_dataset_get_info(a.ds);
    ASSERT_OK(dt_trainer_fit(a.tr, a.ld, info, EPOCHS, save_at, &cb, NULL));
    ASSERT_OK(dt_trainer_save_wait(a.tr));
    char latest[600], want[600];
    ASSERT_OK(dt_trainer_ckpt_latest(dir, latest, sizeof latest));
    snprintf(want, sizeof want, "%s/step-%08d", dir, (int)at);
    ASSERT_STR_EQ(latest, want);
    ASSERT_OK(rig_init(&b, kind, 1, 2));
    dt_trainer_resume_info ri;
    ASSERT_OK(dt_trainer_load(b.tr, dir, &ri));
    ASSERT_STR_EQ(ri.path, want);
    ASSERT_EQ_INT(ri.step, at);
    ASSERT(ri.data_order_kept);
    ASSERT_OK(dt_trainer_fit(b.tr, b.ld, info, EPOCHS, NULL, NULL, NULL));
    ASSERT(memcmp(t_params(a.m), t_params(b.m), t_numel(a.m) * sizeof(float)) == 0);
    char *user;
    ASSERT_OK(dt_trainer_ckpt_user(dir, &user));
    ASSERT_STR_EQ(user, "{\"model\":\"test\"}");
    dt_trainer_run_state_free(user);
    rig_free(&a);
    rig_free(&b);
    t_rm_rf(dir);
}

TEST(files_sgd_bit_identical) { check_resume_files(DT_OPTIM_SGD, 19, false); }
TEST(files_adamw_async_bit_identical) { check_resume_files(DT_OPTIM_ADAMW, 14, true); }

/* Asynchronous saves every 4 steps, each snapshotting the parameters it
 * saves: the trainer's staging buffer is reused from one save to the next,
 * so every checkpoint must still hold its own step's values (not a later
 * save's) when loaded. */
typedef struct {
    save_cb c;
    float *snap[4];
    size_t n;
} stage_cb;

static dt_status save_snap(void *ud, dt_trainer *tr, const dt_trainer_metrics *m)
{
    stage_cb *s = ud;
    if ((m->step + 1) % s->c.every == 0 && s->n < 4) {
        dt_model *md = dt_trainer_model(tr);
        s->snap[s->n] = malloc(t_numel(md) * sizeof(float));
        memcpy(s->snap[s->n++], t_params(md), t_numel(md) * sizeof(float));
    }
    return save_at(&s->c, tr, m);
}

TEST(files_async_staging_reused)
{
    rig a, b;
    char dir[400], p[700];
    snprintf(dir, sizeof dir, "%s/stage", tmpdir());
    ASSERT_OK(rig_init(&a, DT_OPTIM_ADAMW, 1, 2));
    stage_cb cb = {.c = {.every = 4, .dir = dir, .sp = dt_trainer_save_params_default()}};
    cb.c.sp.async = true;
    ASSERT_OK(dt_trainer_fit(a.tr, a.ld, dt_dataset_get_info(a.ds), 1, save_snap, &cb, NULL));
    ASSERT_OK(dt_trainer_save_wait(a.tr));
    ASSERT(cb.n >= 3);
    for (size_t k = 0; k < cb.n; k++) {
        snprintf(p, sizeof p, "%s/step-%08d", dir, (int)(4 * (k + 1)));
        ASSERT_OK(rig_init(&b, DT_OPTIM_ADAMW, 1, 2));
        ASSERT_OK(dt_trainer_load(b.tr, p, NULL));
        ASSERT(memcmp(t_params(b.m), cb.snap[k], t_numel(b.m) * sizeof(float)) == 0);
        if (k > 0) /* the steps changed the weights: the comparison can fail */
            ASSERT(memcmp(cb.snap[k - 1], cb.snap[k], t_numel(b.m) * sizeof(float)) != 0);
        rig_free(&b);
    }
    for (size_t k = 0; k < cb.n; k++)
        free(cb.snap[k]);
    rig_free(&a);
    t_rm_rf(dir);
}

TEST(files_keep_and_bad_checkpoints)
{
    rig a, b;
    char dir[400], p[700];
    snprintf(dir, sizeof dir, "%s/keep", tmpdir());
    ASSERT_OK(rig_init(&a, DT_OPTIM_ADAMW, 1, 2));
    save_cb cb = {.every = 4, .dir = dir, .sp = dt_trainer_save_params_default()};
    cb.sp.keep = 2;
    cb.sp.async = true;
    ASSERT_OK(dt_trainer_fit(a.tr, a.ld, dt_dataset_get_info(a.ds), 1, save_at, &cb, NULL));
    ASSERT_OK(dt_trainer_save_wait(a.tr));
    /* 12 steps, saves at 4, 8, 12: the newest two are kept */
    ASSERT_EQ_INT(t_count_entries(dir, true), 2);
    snprintf(p, sizeof p, "%s/step-00000008/index.json", dir);
    ASSERT(access(p, F_OK) == 0);
    snprintf(p, sizeof p, "%s/step-00000004", dir);
    ASSERT(access(p, F_OK) != 0);
    /* a killed save's temporary is removed by the next save */
    snprintf(p, sizeof p, "%s/step-00000005.tmp-abcdef", dir);
    ASSERT(mkdir(p, 0755) == 0);
    save_cb cb2 = {.at = 13, .dir = dir, .sp = dt_trainer_save_params_default()};
    cb2.sp.keep = 2;
    ASSERT_OK(dt_trainer_epoch(a.tr, a.ld, dt_dataset_get_info(a.ds), 1, save_at, &cb2, NULL));
    ASSERT(access(p, F_OK) != 0);
    ASSERT_EQ_INT(t_count_entries(dir, true), 2); /* 12 and 13 */
    /* a half-written checkpoint (no index.json) is not a checkpoint */
    snprintf(p, sizeof p, "%s/step-00000099", dir);
    ASSERT(mkdir(p, 0755) == 0);
    /* another spelling of a later step (a copy someone made): latest was "step-00000014", which does not
       exist */
    snprintf(p, sizeof p, "%s/step-0000000014", dir);
    ASSERT(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/step-0000000014/index.json", dir);
    FILE *ix = fopen(p, "w");
    ASSERT(ix != NULL);
    fclose(ix);
    /* a symlink named as a later step, to a complete checkpoint: not followed (--resume auto took it) */
    char q[600];
    snprintf(p, sizeof p, "%s/step-00000013", dir);
    snprintf(q, sizeof q, "%s/step-00000015", dir);
    ASSERT_EQ_INT(symlink(p, q), 0);
    char latest[600];
    ASSERT_OK(dt_trainer_ckpt_latest(dir, latest, sizeof latest));
    ASSERT_STR_CONTAINS(latest, "step-00000013");
    ASSERT_EQ_INT(unlink(q), 0);
    /* a flipped byte in the data: the checksum says so */
    snprintf(p, sizeof p, "%s/step-00000013/rank-00000.safetensors", dir);
    FILE *f = fopen(p, "r+b");
    ASSERT(f != NULL);
    fseek(f, -3, SEEK_END);
    int c = fgetc(f);
    fseek(f, -3, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
    ASSERT_OK(rig_init(&b, DT_OPTIM_ADAMW, 1, 2));
    ASSERT(dt_trainer_load(b.tr, latest, NULL) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "rank-00000.safetensors");
    /* another optimizer: refused, naming both */
    rig s;
    ASSERT_OK(rig_init(&s, DT_OPTIM_SGD, 1, 2));
    snprintf(p, sizeof p, "%s/step-00000012", dir);
    ASSERT_STATUS(dt_trainer_load(s.tr, p, NULL), DT_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(dt_last_error(), "adamw");
    /* nothing there */
    snprintf(p, sizeof p, "%s/none", tmpdir());
    ASSERT_STATUS(dt_trainer_load(s.tr, p, NULL), DT_ERR_NOT_FOUND); /* not an I/O failure: nothing there */
    ASSERT(mkdir(p, 0755) == 0);
    ASSERT_STATUS(dt_trainer_load(s.tr, p, NULL), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "no complete checkpoint");
    /* weights only, from a checkpoint */
    snprintf(p, sizeof p, "%s/step-00000012", dir);
    ASSERT_OK(dt_trainer_load_weights(s.tr, p));
    rig_free(&a);
    rig_free(&b);
    rig_free(&s);
    t_rm_rf(dir);
}

/* A checkpoint of a larger model (one more layer) into the rig's: every
 * tensor the rig has fits, so only the checkpoint's tensor that the model
 * lacks tells (PyTorch's load_state_dict(strict=True) refuses it too);
 * loading the part that fits would be a silent wrong result. */
TEST(larger_model_checkpoint_refused)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/larger", tmpdir());
    dt_module *s = dt_nn_seq(0, NULL);
    dt_nn_add(s, NULL, dt_nn_linear(8, 16, true));
    dt_nn_add(s, NULL, dt_nn_relu());
    dt_nn_add(s, NULL, dt_nn_dropout(0.25f));
    dt_nn_add(s, NULL, dt_nn_linear(16, 4, true));
    dt_nn_add(s, NULL, dt_nn_linear(4, 4, true));
    dt_model *big = t_build(s, 7);
    ASSERT(big != NULL);
    dt_strategy *st;
    ASSERT_OK(dt_strategy_none_init(&st));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    dt_trainer *tr;
    ASSERT_OK(dt_trainer_init(big, st, &tp, &tr));
    ASSERT_OK(dt_trainer_save(tr, dir, NULL));
    rig r;
    ASSERT_OK(rig_init(&r, DT_OPTIM_ADAMW, 1, 1));
    ASSERT_STATUS(dt_trainer_load(r.tr, dir, NULL), DT_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(dt_last_error(), "2 of its tensors are not in this model ('4.");
    ASSERT_STATUS(dt_trainer_load_weights(r.tr, dir), DT_ERR_MISMATCH);
    /* the other way (the checkpoint lacks a tensor of the model) names the tensor */
    char small[420];
    snprintf(small, sizeof small, "%s-small", dir);
    ASSERT_OK(dt_trainer_save(r.tr, small, NULL));
    ASSERT_STATUS(dt_trainer_load(tr, small, NULL), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "4.");
    dt_trainer_free(tr);
    dt_model_free(big);
    rig_free(&r);
    t_rm_rf(dir);
    t_rm_rf(small);
}

/* --keep after a resume from an older checkpoint: the run saves below the
 * abandoned run's newer checkpoints, and pruning by step number alone
 * removed each checkpoint the moment it was written (keep 1: only the old
 * run's step 12 was left, the resumed run's state lost). */
TEST(keep_after_resume_from_older)
{
    rig a, b;
    char dir[400], p[700];
    snprintf(dir, sizeof dir, "%s/keep_older", tmpdir());
    ASSERT_OK(rig_init(&a, DT_OPTIM_SGD, 1, 2));
    save_cb cb = {.every = 4, .dir = dir, .sp = dt_trainer_save_params_default()};
    ASSERT_OK(dt_trainer_fit(a.tr, a.ld, dt_dataset_get_info(a.ds), 1, save_at, &cb, NULL));
    ASSERT_EQ_INT(t_count_entries(dir, true), 3); /* 4, 8, 12 */
    rig_free(&a); /* and with it the directory's lock */
    ASSERT_OK(rig_init(&b, DT_OPTIM_SGD, 1, 2));
    snprintf(p, sizeof p, "%s/step-00000004", dir);
    ASSERT_OK(dt_trainer_load(b.tr, p, NULL));
    save_cb cb2 = {.at = 6, .dir = dir, .sp = dt_trainer_save_params_default()};
    cb2.sp.keep = 1;
    ASSERT_OK(dt_trainer_epoch(b.tr, b.ld, dt_dataset_get_info(b.ds), 0, save_at, &cb2, NULL));
    ASSERT_OK(cb2.st);
    snprintf(p, sizeof p, "%s/step-00000006/index.json", dir);
    ASSERT(access(p, F_OK) == 0); /* the one just saved stays */
    snprintf(p, sizeof p, "%s/step-00000008/index.json", dir);
    ASSERT(access(p, F_OK) == 0); /* later steps are the old run's: left */
    snprintf(p, sizeof p, "%s/step-00000012/index.json", dir);
    ASSERT(access(p, F_OK) == 0);
    snprintf(p, sizeof p, "%s/step-00000004", dir);
    ASSERT(access(p, F_OK) != 0); /* older ones beyond keep: removed */
    rig_free(&b);
    t_rm_rf(dir);
}

TEST(loader_starts_mid_epoch)
{
    rig r;
    ASSERT_OK(rig_init(&r, DT_OPTIM_SGD, 1, 2));
    int64_t all[N_ITEMS], k = 0;
    const dt_batch *b;
    ASSERT_OK(dt_loader_start_epoch(r.ld, 1));
    while (dt_loader_next(r.ld, &b) == DT_OK && b)
        for (int64_t i = 0; i < b->size; i++)
            all[k++] = b->indices[i];
    ASSERT_EQ_INT(k, N_ITEMS);
    for (int64_t first = 0; first <= dt_loader_num_batches(r.ld); first += 5) {
        ASSERT_OK(dt_loader_start_epoch_at(r.ld, 1, first));
        int64_t j = first * BATCH, idx = first;
        while (dt_loader_next(r.ld, &b) == DT_OK && b) {
            ASSERT_EQ_INT(b->index, idx++);
            for (int64_t i = 0; i < b->size; i++)
                ASSERT_EQ_INT(b->indices[i], all[j++]);
        }
        ASSERT_EQ_INT(j, N_ITEMS);
    }
    ASSERT_STATUS(dt_loader_start_epoch_at(r.ld, 1, dt_loader_num_batches(r.ld) + 1), DT_ERR_RANGE);
    ASSERT_STATUS(dt_loader_start_epoch_at(r.ld, 1, -1), DT_ERR_RANGE);
    rig_free(&r);
}

TEST(run_state_bad_input)
{
    rig r, s;
    ASSERT_OK(rig_init(&r, DT_OPTIM_ADAMW, 1, 2));
    ASSERT_OK(rig_init(&s, DT_OPTIM_SGD, 1, 2));
    char *js;
    ASSERT_OK(dt_trainer_run_state(r.tr, &js));
    ASSERT_STR_CONTAINS(js, "\"optimizer\":\"adamw\"");
    dt_trainer_resume_info ri;
    ASSERT_STATUS(dt_trainer_apply_run_state(s.tr, js, &ri), DT_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(dt_last_error(), "adamw");
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, "[1]", NULL), DT_ERR_FORMAT);
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, "{\"format\":\"dtrain.trainer\",\"version\":1}", NULL),
                  DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "\"step\"");
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, "{\"format\":\"dtrain.trainer\",\"version\":9}", NULL),
                  DT_ERR_UNSUPPORTED);
    /* a negative step, a wrong counter count: rejected, trainer unchanged */
    char *bad = malloc(strlen(js) + 16);
    char *p = strstr(js, "\"step\":");
    ASSERT(p != NULL);
    snprintf(bad, strlen(js) + 16, "%.*s\"step\":-1%s", (int)(p - js), js, strchr(p, ','));
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, bad, NULL), DT_ERR_FORMAT);
    p = strstr(js, "\"module_counters\":[");
    ASSERT(p != NULL);
    snprintf(bad, strlen(js) + 16, "%.*s\"module_counters\":[0]}}", (int)(p - js), js);
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, bad, NULL), DT_ERR_MISMATCH);
    ASSERT_EQ_INT(dt_trainer_steps(r.tr), 0);
    /* another world size: loads, and says the data order is not kept */
    p = strstr(js, "\"world_size\":1");
    ASSERT(p != NULL);
    snprintf(bad, strlen(js) + 16, "%.*s\"world_size\":2%s", (int)(p - js), js, p + strlen("\"world_size\":1"));
    ASSERT_OK(dt_trainer_apply_run_state(r.tr, bad, &ri));
    ASSERT(!ri.data_order_kept);
    ASSERT_EQ_INT(ri.saved_world, 2);
    ASSERT_STR_CONTAINS(ri.note, "data order is not kept");
    /* an edited state: world size 0, a batch past its epoch's end, trailing
     * text, a key twice: refused, naming the key */
    snprintf(bad, strlen(js) + 16, "%.*s\"world_size\":0%s", (int)(p - js), js, p + strlen("\"world_size\":1"));
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, bad, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "\"world_size\" is 0");
    size_t cap = strlen(js) + 64;
    char *ed = malloc(cap);
    const char *b0 = strstr(js, "\"batch\":0,"), *e0 = strstr(js, "\"epoch_batches\":0,");
    ASSERT(b0 != NULL && e0 != NULL && b0 < e0);
    snprintf(ed, cap, "%.*s\"batch\":999,%.*s\"epoch_batches\":20,%s", (int)(b0 - js), js,
             (int)(e0 - (b0 + strlen("\"batch\":0,"))), b0 + strlen("\"batch\":0,"),
             e0 + strlen("\"epoch_batches\":0,"));
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, ed, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "\"batch\" is 999 but \"epoch_batches\" is 20");
    snprintf(ed, cap, "%s x", js);
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, ed, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "text after the end");
    snprintf(ed, cap, "{\"step\":5,%s", js + 1);
    ASSERT_STATUS(dt_trainer_apply_run_state(r.tr, ed, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "the key \"step\" appears twice");
    ASSERT_EQ_INT(dt_trainer_steps(r.tr), 0);
    free(ed);
    free(bad);
    dt_trainer_run_state_free(js);
    rig_free(&r);
    rig_free(&s);
}

TEST(optim_state_ranges)
{
    rig r;
    ASSERT_OK(rig_init(&r, DT_OPTIM_ADAMW, 1, 2));
    dt_optim *o = dt_trainer_optim(r.tr);
    const dt_flat *P = t_flat(r.m, DT_FLAT_PARAMS);
    ASSERT_EQ_INT(dt_optim_state_find(o, "exp_avg"), 0);
    ASSERT_EQ_INT(dt_optim_state_find(o, "exp_avg_sq"), 1);
    ASSERT_EQ_INT(dt_optim_state_find(o, "momentum_buffer"), -1);
    float v[4] = {1, 2, 3, 4}, w[4];
    ASSERT_OK(dt_optim_state_write(o, P, 1, 3, 7, v));
    ASSERT_OK(dt_optim_state_read(o, P, 1, 3, 7, w));
    ASSERT(memcmp(v, w, sizeof v) == 0);
    float *data;
    ASSERT_OK(dt_optim_state(o, 0, 1, NULL, &data, NULL));
    ASSERT(data[3] == 1.0f && data[6] == 4.0f);
    ASSERT_STATUS(dt_optim_state_read(o, P, 1, P->total - 1, P->total + 1, w), DT_ERR_RANGE);
    ASSERT_STATUS(dt_optim_state_read(o, P, 2, 0, 1, w), DT_ERR_RANGE);
    ASSERT_STATUS(dt_optim_state_read(o, t_flat(r.m, DT_FLAT_GRADS), 0, 0, 1, w), DT_ERR_RANGE);
    rig_free(&r);
}

TEST(model_rng_state)
{
    dt_model *m = net();
    ASSERT(m != NULL);
    size_t n = dt_model_rng_state_size(m);
    ASSERT(n >= 5);
    uint64_t c[16] = {0}, d[16];
    c[3] = 42;
    ASSERT_OK(dt_model_set_rng_state(m, c, n));
    ASSERT_OK(dt_model_get_rng_state(m, d, 16));
    ASSERT_EQ_U64(d[3], 42);
    ASSERT_STATUS(dt_model_set_rng_state(m, c, n + 1), DT_ERR_MISMATCH);
    ASSERT_STATUS(dt_model_get_rng_state(m, d, n - 1), DT_ERR_RANGE);
    dt_model_free(m);
}

int main(void)
{
    RUN(loader_starts_mid_epoch);
    RUN(model_rng_state);
    RUN(optim_state_ranges);
    RUN(run_state_bad_input);
    RUN(sgd_mid_epoch_bit_identical);
    RUN(adamw_mid_epoch_bit_identical);
    RUN(adamw_grad_accum_bit_identical);
    RUN(files_sgd_bit_identical);
    RUN(files_adamw_async_bit_identical);
    RUN(files_async_staging_reused);
    RUN(files_keep_and_bad_checkpoints);
    RUN(keep_after_resume_from_older);
    RUN(larger_model_checkpoint_refused);
    t_rm_rf(tmpdir());
    return TEST_REPORT();
}
