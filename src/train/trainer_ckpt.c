/* Trainer checkpoints: a run's state on disk, saved without stalling the
 * other ranks' collectives, loaded for an exact resume.
 *
 * Layout. A save directory holds one checkpoint (ckpt.h: index.json and the
 * safetensors files it lists) per save, named step-<8 digits> after the
 * optimizer steps taken:
 *
 *     DIR/step-00000040/index.json            tensors, files, CRC-32Cs, metadata
 *                       rank-00000.safetensors
 *
 * The tensors are the model's parameters and buffers under PyTorch's
 * state_dict names and the optimizer state as "optim.<param>.exp_avg" (...
 * exp_avg_sq, momentum_buffer), so `dtrain ckpt` and dt_ckpt_load read and
 * reshard them like any checkpoint. The metadata holds the run state
 * ("dtrain.run": dt_trainer_run_state's JSON) and the caller's options
 * ("dtrain.user"); a DDP run compressing with PowerSGD adds the hook's state
 * (trainer_ckpt_psgd.c: "powersgd.q", "powersgd.error", "dtrain.powersgd"). dt_ckpt_save writes the directory under a temporary name
 * and renames it when complete, so a step-N directory with index.json is a
 * complete checkpoint; loading verifies every file's checksum (CRC-32C;
 * CRC-32 in older checkpoints) in the same pass that reads it.
 *
 * Who writes. Under DDP (and with one process) every rank holds the whole
 * model and optimizer state, so rank 0 writes and the others only agree on
 * the outcome. A background thread of rank 0 writes (dt_ckpt_save of this
 * process alone). An asynchronous save first copies everything into a
 * staging buffer (one copy of the flats and the optimizer state: the
 * training goes on changing the originals; the buffer is the trainer's,
 * kept from one save to the next: ckpt_slot) and returns at once (the next
 * save, dt_trainer_save_wait or dt_trainer_free waits for it); a
 * synchronous one writes from the model's and optimizer's own memory (no
 * second copy: rank 0's extra memory is the writer's, not the state's) and
 * waits for the thread. Waiting is a
 * loop of small all-reduces of [done, failed] that every rank joins, each one
 * answered at once because rank 0's main thread is free while its writer
 * thread writes: no rank ever sits in a collective for as long as the disk
 * takes, so a slow save cannot run into the collective timeout
 * ($DT_COMM_TIMEOUT), on any rank.
 *
 * What a rank holds is a list of pieces (one per parameter it steps, or
 * per shard of one under ZeRO): the parameter's elements [lo, hi), their
 * f32 values (the parameter itself, or its fp32 master weights under mixed
 * precision), the bf16/f16 compute copy, and the optimizer state of those
 * elements. Each piece is saved as "<param>" in the parameter's dtype,
 * "master.<param>" (f32, bf16/f16 parameters only) and
 * "optim.<param>.<state>" (f32). Sharded state (ZeRO/FSDP: each rank holds
 * different ranges) is saved by every rank, collectively over all ranks
 * (dt_ckpt_save deals the replicas: buffers, stage 1/2 parameters across
 * hybrid groups; under the pipe strategy each pipeline rank holds the
 * tensors of its stages, its range's segments, and all save over the
 * world); such a save is synchronous (each rank writes its part on a
 * helper thread while the ranks poll each other: dt_ckpt_save's "slow
 * disks", so the slowest writer never runs into DT_COMM_TIMEOUT),
 * asynchronous only in that the call still returns when the files are
 * complete.
 *
 * Loading gives every piece its f32 value by one rule: the checkpoint's
 * fp32 master weights ("master.<param>") when it has them, else the saved
 * parameter widened to f32 (exact); a bf16/f16 parameter of this run then
 * takes that value rounded to nearest even as its compute copy, and its
 * masters the value itself. So a bf16 run's checkpoint loads into an f32
 * run with its fp32 masters (nothing is lost), an f32 checkpoint into a
 * bf16 run with f32 masters and rounded weights, and a checkpoint saved at
 * any world size and strategy into any other (the pieces are element
 * ranges: dt_ckpt_read intersects them with the saved chunks).
 *
 * Files: this one saves; trainer_ckpt_load.c loads and lists the pieces a
 * rank holds; trainer_ckpt_dir.c keeps the save directory;
 * trainer_ckpt_psgd.c the PowerSGD state; trainer_ckpt_impl.h joins them. */
#include "train/train_impl.h"
#include "train/trainer_ckpt_impl.h"
#include "train/trainer_ckpt_psgd.h"
#include "dtrain/trace.h"

#include "dtrain/ckpt.h"
#include "dtrain/kernels.h"
#include "dtrain/tp.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

dt_trainer_save_params dt_trainer_save_params_default(void)
{
    dt_trainer_save_params p = {.async = false, .keep = 0, .user_json = NULL};
    return p;
}

/* ---- the staged checkpoint and its writer thread ------------------------------------ */

typedef struct ckpt_job {
    char *dir, *final;           /* DIR, DIR/step-N */
    int keep;
    int64_t step;                /* the optimizer steps it is saved at (the N of step-N) */
    void **bufs;                 /* staging copies, one per flat / optimizer state */
    size_t nbuf;
    dt_ckpt_list *list;          /* entries over the staging copies */
    char *run_state, *user;
    dt__psgd_saved psgd;         /* PowerSGD's state (its arrays are staging copies) */
    /* outcome */
    pthread_t th;
    bool started;
    int done;                    /* set by the thread at its end (under mu) */
    pthread_mutex_t mu;
    dt_status st;
    char msg[1024];
} ckpt_job;

/* What the trainer keeps between saves (its checkpoint slot, train_impl.h):
 * the save in flight and the staging buffer of asynchronous saves, kept for
 * the next one (reused when large enough: no fresh pages to fault in on
 * every save), freed by dt_trainer_free. Only one save is in flight at a
 * time (each save first waits for the previous one), so the job that
 * borrows the buffer is done with it before the next save stages. */
typedef struct ckpt_slot {
    ckpt_job *job;
    char *stage;
    size_t cap;
    dt_ckpt_dir_lock *lock;      /* the save directory's (the rank that owns it: own_dir) */
} ckpt_slot;

static ckpt_slot *slot_of(dt_trainer *tr)
{
    void **s = dt__trainer_ckpt_slot(tr);
    if (!*s)
        *s = calloc(1, sizeof(ckpt_slot));
    return *s;
}

/* The slot's staging buffer, at least n bytes (grown when smaller). */
static char *slot_stage(ckpt_slot *sl, size_t n)
{
    if (sl->cap < n) {
        dt_free(sl->stage);
        sl->stage = dt_alloc(n);
        sl->cap = sl->stage ? n : 0;
    }
    return sl->stage;
}

static void job_free(ckpt_job *j)
{
    if (!j)
        return;
    if (j->started)
        pthread_join(j->th, NULL);
    for (size_t i = 0; i < j->nbuf; i++)
        dt_free(j->bufs[i]);
    free(j->bufs);
    dt_ckpt_list_free(j->list);
    free(j->dir);
    free(j->final);
    cJSON_free(j->run_state);
    free(j->user);
    dt__psgd_saved_release(&j->psgd);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static char *dup_printf(const char *fmt, ...) DT_PRINTF(1, 2);
static char *dup_printf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}


/* The rank that creates, cleans and prunes the save directory (and holds
 * its lock) takes it: created when missing, locked (dt_ckpt_dir_lock: a
 * second job saving there is refused before it touches anything), kept
 * locked until dt_trainer_free or a save into another directory. Only then
 * may it remove stale temporaries and old checkpoints: nobody else saves
 * there. */
static dt_status own_dir(dt_trainer *tr, const char *dir)
{
    ckpt_slot *sl = slot_of(tr);
    if (!sl)
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save: out of memory");
    if (sl->lock && !strcmp(dt_ckpt_dir_lock_dir(sl->lock), dir))
        return DT_OK;
    /* a checkpoint itself (--save run/step-N): its step-N and lock would go inside it */
    char ip[4200];
    struct stat sb;
    snprintf(ip, sizeof ip, "%s/%s", dir, INDEX_FILE);
    if (lstat(ip, &sb) == 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s is a checkpoint (it holds %s), not a directory of checkpoints: "
                        "save into the directory that holds it", dir, INDEX_FILE);
    dt_ckpt_dir_lock *l;
    dt_status st = dt_ckpt_dir_lock_open(dir, &l);
    if (st < 0)
        return st;
    dt_ckpt_dir_lock_close(sl->lock);
    sl->lock = l;
    return DT_OK;
}


/* The writer: one checkpoint directory (complete or absent), then pruning. */
static dt_status job_write(ckpt_job *j)
{
    dt__ckpt_remove_stale(j->dir);
    dt_st_kv meta[3] = {{META_RUN, j->run_state},
                        {META_USER, j->user ? j->user : "null"},
                        {DT__PSGD_META, j->psgd.meta}};
    dt_ckpt_save_params sp = dt_ckpt_save_params_default();
    sp.meta = meta;
    sp.nmeta = j->psgd.meta ? 3 : 2;
    sp.overwrite = true; /* a re-save of the same step (after a resume) replaces it */
    const double tt = dt_trace_now();
    dt_status st = dt_ckpt_save(j->final, dt_ckpt_list_entries(j->list), dt_ckpt_list_count(j->list), &sp, NULL);
    if (st >= 0)
        dt__ckpt_prune(j->dir, j->keep, j->step);
    dt_trace_span(DT_TRACE_CKPT, "checkpoint write", tt);
    return st;
}

static void *job_thread(void *arg)
{
    ckpt_job *j = arg;
    dt_status st = job_write(j);
    pthread_mutex_lock(&j->mu);
    j->st = st;
    if (st < 0)
        snprintf(j->msg, sizeof j->msg, "%s", dt_last_error());
    j->done = 1;
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static int job_state(ckpt_job *j, dt_status *st)
{
    pthread_mutex_lock(&j->mu);
    int done = j->done;
    *st = j->st;
    pthread_mutex_unlock(&j->mu);
    return done;
}


/* ---- staging ------------------------------------------------------------------------------- */

/* A staging copy of n bytes of src, kept by the job. */
static void *stage_copy(ckpt_job *j, const void *src, size_t n)
{
    void *b = dt_alloc(n ? n : 64);
    if (!b)
        return NULL;
    memcpy(b, src, n);
    j->bufs[j->nbuf++] = b;
    return b;
}

static dt_status add_piece_entry(ckpt_job *j, const tpiece *p, const char *name, dt_dtype dt, void *data)
{
    dt_ckpt_entry e = {.name = name, .dtype = dt, .ndim = p->e.ndim, .lo = p->lo, .hi = p->hi, .data = data};
    for (int d = 0; d < p->e.ndim; d++)
        e.shape[d] = p->e.shape[d];
    return dt_ckpt_list_add(j->list, &e);
}

/* A tensor-parallel slice's entry (tp non-NULL, p sliced): the full tensor
 * gathered over tp from every rank's slice at `local` (p's local elements,
 * es bytes each), of which this rank keeps the contiguous elements
 * [r ceil(N/t), (r + 1) ceil(N/t)) (clamped at N) in a staging copy, under
 * the full shape: the tp ranks together hold every element once, as ZeRO's
 * shards do, so the checkpoint is the single-process one. Collective over
 * tp: every rank stages the same entries in the same order. */
static dt_status add_tp_entry(ckpt_job *j, dt_pg *tp, const tpiece *p, const char *name, dt_dtype dt,
                              const void *local)
{
    const int t = dt_pg_size(tp), r = dt_pg_rank(tp);
    const size_t es = dt_dtype_size(dt);
    dt_ckpt_entry e = {.name = name, .dtype = dt, .ndim = p->e.ndim};
    dt_status st = dt_tp_full_shape(&p->e, t, e.shape);
    if (st < 0)
        return st;
    uint64_t N = 1;
    for (int d = 0; d < e.ndim; d++)
        N *= (uint64_t)e.shape[d];
    const uint64_t per = (N + (uint64_t)t - 1) / (uint64_t)t;
    e.lo = (uint64_t)r * per < N ? (uint64_t)r * per : N;
    e.hi = e.lo + per < N ? e.lo + per : N;
    char *full = dt_alloc(N * es + 64);
    if (!full)
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save: '%s': out of memory gathering its slices", name);
    if ((st = dt_tp_gather_full(tp, &p->e, local, full, es)) >= 0) {
        e.data = stage_copy(j, full + e.lo * es, (size_t)(e.hi - e.lo) * es);
        st = e.data ? dt_ckpt_list_add(j->list, &e) : DT_ERR_NO_MEMORY;
    }
    dt_free(full);
    return st;
}

/* A piece's entry: its own elements, or (tensor parallel) its share of the
 * full tensor. */
static dt_status add_entry(ckpt_job *j, dt_pg *tp, const tpiece *p, const char *name, dt_dtype dt, void *data)
{
    if (!tp || !p->e.tp_dim)
        return add_piece_entry(j, p, name, dt, data);
    if (p->hi > p->lo)
        return add_tp_entry(j, tp, p, name, dt, data);
    /* a slice this rank does not hold (another pipeline stage's: the same on
     * every rank of tp) is not gathered: no elements, under the full shape
     * as the ranks that hold it list it */
    dt_ckpt_entry e = {.name = name, .dtype = dt, .ndim = p->e.ndim, .lo = 0, .hi = 0, .data = data};
    dt_status st = dt_tp_full_shape(&p->e, dt_pg_size(tp), e.shape);
    return st < 0 ? st : dt_ckpt_list_add(j->list, &e);
}

/* List what this rank holds for the writer thread. copy (an asynchronous
 * save): into one staging buffer, so training may change the originals
 * while it is written; else (synchronous: nothing changes them until the
 * save returns) the entries point at the model's and optimizer's own
 * memory, so a synchronous save needs no second copy of the state.
 * PowerSGD's state (psgd, may be NULL) is a copy gathered for this save
 * either way; the job takes it. tp: the tensor-parallel group (NULL: none);
 * its slices are staged by add_tp_entry. */
static dt_status stage(dt_trainer *tr, const char *dir, const dt_trainer_save_params *p, const tpiece *pc, bool copy,
                       dt__psgd_saved *psgd, dt_pg *tp, ckpt_job **out)
{
    *out = NULL;
    dt_model *m = dt_trainer_model(tr);
    dt_optim *o = dt_trainer_optim(tr);
    const size_t ne = dt_model_num_entries(m);
    ckpt_job *j = calloc(1, sizeof *j);
    if (!j)
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save: out of memory");
    pthread_mutex_init(&j->mu, NULL);
    dt_status st = DT_ERR_NO_MEMORY;
    const int ns = dt_optim_num_states(o);
    j->keep = p->keep;
    j->step = dt_trainer_steps(tr);
    j->dir = strdup(dir);
    j->final = dup_printf("%s/step-%08" PRId64, dir, dt_trainer_steps(tr));
    j->user = p->user_json ? strdup(p->user_json) : NULL;
    size_t nsliced = 0; /* staging copies of add_tp_entry */
    for (size_t i = 0; tp && i < ne; i++)
        nsliced += dt__ckpt_trained(&pc[i]) && pc[i].e.tp_dim ? 2 + (size_t)ns : 0;
    for (size_t i = 0; tp && i < ne; i++) /* buffers one by one (frozen slices gathered) */
        nsliced += pc[i].e.is_buffer ? 1 : 0;
    j->bufs = calloc(1 + DT_DTYPE_COUNT + nsliced, sizeof *j->bufs);
    if (!j->dir || !j->final || (p->user_json && !j->user) || !j->bufs || dt_ckpt_list_init(&j->list) < 0)
        goto fail;
    /* the pieces: one buffer for all of them, [value][master][states...] each */
    size_t bytes = 0;
    for (size_t i = 0; copy && i < ne; i++)
        if (dt__ckpt_trained(&pc[i])) {
            const size_t n = pc[i].hi - pc[i].lo;
            bytes += n * (dt_dtype_size(pc[i].e.dtype) + (pc[i].lowp ? 4 : 0) + 4 * (size_t)ns);
            bytes = (bytes + 7) / 8 * 8;
        }
    char *buf = NULL;
    if (copy) { /* the trainer's staging buffer, kept across saves */
        ckpt_slot *sl = slot_of(tr);
        if (!sl || !(buf = slot_stage(sl, bytes ? bytes : 64)))
            goto fail;
    }
    char *at = buf, name[1024];
    for (size_t i = 0; i < ne; i++) {
        const tpiece *q = &pc[i];
        if (!dt__ckpt_trained(q))
            continue;
        const size_t n = q->hi - q->lo, es = dt_dtype_size(q->e.dtype);
        void *v = q->lowp ? q->lowp : (void *)q->val;
        if (copy) {
            if (n)
                memcpy(at, v, n * es);
            v = at;
            at += n * es;
        }
        if ((st = add_entry(j, tp, q, q->e.name, q->e.dtype, v)) < 0)
            goto fail;
        if (q->e.dtype != DT_F32) { /* the fp32 masters: what the optimizer steps */
            v = q->val;
            if (copy) {
                if (n)
                    memcpy(at, v, n * 4);
                v = at;
                at += n * 4;
            }
            snprintf(name, sizeof name, "master.%s", q->e.name);
            if ((st = add_entry(j, tp, q, name, DT_F32, v)) < 0)
                goto fail;
        }
        for (int s = 0; s < ns; s++) {
            const char *sname;
            float *data;
            if ((st = dt_optim_state(o, q->range, s, &sname, &data, NULL)) < 0)
                goto fail;
            v = s < 4 && q->sv[s] ? q->sv[s] : data + q->roff;
            if (copy) {
                if (n)
                    memcpy(at, v, n * 4);
                v = at;
                at += n * 4;
            }
            snprintf(name, sizeof name, "optim.%s.%s", q->e.name, sname);
            if ((st = add_entry(j, tp, q, name, DT_F32, v)) < 0)
                goto fail;
        }
        if (copy)
            at = buf + ((size_t)(at - buf) + 7) / 8 * 8;
        st = DT_ERR_NO_MEMORY;
    }
    /* buffers (running statistics, frozen parameters): whole on every rank;
     * under tensor parallelism a frozen parameter is the rank's slice, so
     * each buffer is listed alone and those slices gathered (add_tp_entry) */
    for (size_t i = 0; tp && i < ne; i++) {
        const dt_param_info *e = &pc[i].e;
        if (!e->is_buffer || e->tied_to >= 0 || !e->tensor)
            continue;
        if (e->frozen && e->tp_dim) {
            const tpiece q = {.e = *e, .lo = 0, .hi = e->numel};
            if ((st = add_tp_entry(j, tp, &q, e->name, e->dtype, e->tensor->data)) < 0)
                goto fail;
        } else {
            const size_t nb = e->numel * dt_dtype_size(e->dtype);
            void *c = copy ? stage_copy(j, e->tensor->data, nb) : e->tensor->data;
            const tpiece q = {.e = *e, .lo = 0, .hi = e->numel};
            if (!c || (st = add_piece_entry(j, &q, e->name, e->dtype, c)) < 0)
                goto fail;
        }
        st = DT_ERR_NO_MEMORY;
    }
    for (int d = 0; !tp && d < DT_DTYPE_COUNT; d++) {
        const dt_flat *f = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        if (!f || !f->numel)
            continue;
        void *c = copy ? stage_copy(j, f->base, f->numel * dt_dtype_size((dt_dtype)d)) : f->base;
        if (!c)
            goto fail;
        if ((st = dt_ckpt_list_add_flat(j->list, m, DT_FLAT_BUFFERS, (dt_dtype)d, f->offset, f->offset + f->numel, c,
                                        "", "")) < 0)
            goto fail;
        st = DT_ERR_NO_MEMORY;
    }
    /* PowerSGD's state: the arrays gathered for this save are its staging copies */
    if (psgd) {
        j->psgd = *psgd;
        memset(psgd, 0, sizeof *psgd);
        if ((st = dt__psgd_saved_entries(&j->psgd, j->list)) < 0)
            goto fail;
    }
    if ((st = dt_trainer_run_state(tr, &j->run_state)) < 0)
        goto fail;
    *out = j;
    return DT_OK;
fail:
    job_free(j);
    return st == DT_ERR_NO_MEMORY ? dt_error(st, "dt_trainer_save: out of memory staging the checkpoint") : st;
}

/* ---- agreement ------------------------------------------------------------------------------ */

/* Every rank: wait until rank 0's job (may be NULL: nothing in flight, or
 * another rank) is done, through small all-reduces; then all know whether
 * it failed. Returns DT_OK or the failure (rank 0: its message; others: a
 * message naming rank 0). */
static dt_status agree_done(dt_trainer *tr, ckpt_job **jp)
{
    ckpt_job *j = *jp;
    const bool multi = dt_trainer_world(tr) > 1;
    dt_status jst = DT_OK;
    for (;;) {
        int done = !j || job_state(j, &jst);
        double v[2] = {done ? 1.0 : 0.0, done && jst < 0 ? 1.0 : 0.0};
        if (dt_trainer_rank(tr) != 0)
            v[0] = v[1] = 0;
        if (multi) {
            dt_status st = dt_trainer_allreduce_sum(tr, v, 2);
            if (st < 0)
                return st;
        } else {
            v[0] = done;
            v[1] = done && jst < 0;
        }
        if (v[0] > 0) {
            if (j) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", j->msg);
                job_free(j);
                *jp = NULL;
                if (jst < 0)
                    return dt_error(jst, "%s", msg);
            }
            if (v[1] > 0)
                return dt_error(DT_ERR_IO, "rank 0 could not write the checkpoint (its error says why)");
            return DT_OK;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

dt_status dt_trainer_save_wait(dt_trainer *tr)
{
    if (!tr)
        return dt_error(DT_ERR_NULL, "dt_trainer_save_wait: trainer is NULL");
    ckpt_slot *sl = slot_of(tr);
    if (!sl)
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save_wait: out of memory");
    return agree_done(tr, &sl->job);
}

void dt__trainer_ckpt_free(dt_trainer *tr)
{
    void **s = dt__trainer_ckpt_slot(tr);
    ckpt_slot *sl = *s;
    if (!sl)
        return;
    job_free(sl->job); /* joins a write in flight */
    dt_ckpt_dir_lock_close(sl->lock);
    dt_free(sl->stage);
    free(sl);
    *s = NULL;
}

void dt_trainer_save_abandon(dt_trainer *tr)
{
    void **s = tr ? dt__trainer_ckpt_slot(tr) : NULL;
    ckpt_slot *sl = s ? *s : NULL;
    if (!sl)
        return;
    job_free(sl->job); /* joins a write in flight */
    sl->job = NULL;
    dt_ckpt_dir_lock_abandon(sl->lock);
    sl->lock = NULL;
}

static dt_status any_failed(dt_pg *g, dt_status st, bool *any);
static dt_status complete_shares(dt_trainer *tr, dt_pg *dp, tpiece *pc, void **hold);

/* Sharded state: every rank lists its pieces (no copy) and all save together
 * (synchronously: see the overview). tp (pipeline stages with tensor
 * parallelism inside, NULL otherwise): the tensor-parallel group, whose
 * ranks each write their share of their stages' full tensors (add_tp_entry). */
static dt_status save_sharded(dt_trainer *tr, const char *dir, const dt_trainer_save_params *pp, dt_pg *tp)
{
    dt_status sst = DT_OK;
    if (dt_trainer_rank(tr) == 0 && (sst = own_dir(tr, dir)) >= 0)
        dt__ckpt_remove_stale(dir);
    ckpt_job *j = NULL;
    tpiece *pc = NULL;
    bool sharded;
    void *hold = NULL;
    dt_strategy_ckpt lay;
    dt_status lst = dt__strategy_ckpt_layout(dt_trainer_strategy(tr), &lay);
    if (sst >= 0)
        sst = lst;
    dt_pg *dp = tp ? lay.share_group : NULL;
    if (sst >= 0)
        sst = dt__ckpt_collect_pieces(tr, &pc, &sharded);
    if (dp) { /* ZeRO-1 with tp: the replicas' shares first, each rank then lists what DDP's lists */
        bool any;
        sst = sst < 0 ? (any_failed(dp, sst, &any), sst) : complete_shares(tr, dp, pc, &hold);
    }
    if (sst >= 0) {
        const double tst = dt_trace_now();
        sst = stage(tr, dir, pp, pc, false, NULL, tp, &j);
        dt_trace_span(DT_TRACE_CKPT, "checkpoint staging", tst);
    }
    free(pc);
    /* a rank that could not stage: all hear of it before the collective save */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sst < 0 ? dt_last_error() : "");
    double v = sst < 0 ? 1.0 : 0.0;
    dt_status st = dt_trainer_allreduce_sum(tr, &v, 1);
    if (st < 0 || v > 0) {
        job_free(j);
        dt_free(hold);
        if (st < 0)
            return st;
        return sst < 0 ? dt_error(sst, "%s", msg)
                       : dt_error(DT_ERR_IO, "another rank could not stage the checkpoint (its error says why)");
    }
    dt_st_kv meta[3] = {{META_RUN, j->run_state},
                        {META_USER, j->user ? j->user : "null"},
                        {DT__PSGD_META, j->psgd.meta}};
    dt_ckpt_save_params sp = dt_ckpt_save_params_default();
    sp.meta = meta;
    sp.nmeta = j->psgd.meta ? 3 : 2;
    sp.overwrite = true;
    st = dt_ckpt_save(j->final, dt_ckpt_list_entries(j->list), dt_ckpt_list_count(j->list), &sp, lay.save_group);
    if (st >= 0 && dt_trainer_rank(tr) == 0)
        dt__ckpt_prune(j->dir, j->keep, j->step);
    job_free(j);
    dt_free(hold);
    return st;
}

/* Whether any rank of the group failed (st < 0 here): a SUM all-reduce of
 * one flag. Returns the collective's error, else *any. */
static dt_status any_failed(dt_pg *g, dt_status st, bool *any)
{
    double v = st < 0 ? 1.0 : 0.0;
    dt_status cst = dt_pg_allreduce(g, DT_IN_PLACE, &v, 1, DT_F64, DT_REDUCE_SUM);
    *any = v > 0;
    return cst;
}

/* ZeRO-1 over the data-parallel ranks of a tensor-parallel model: a rank's
 * pieces are its share (over dp) of its tensor-parallel slices and
 * replicated tensors, which the tp save paths cannot list (a share of a
 * slice is no contiguous range of the full tensor). Every rank of dp
 * gathers the shares (values, fp32 masters, optimizer states) into whole
 * local tensors (*hold: one buffer, dt_free it), after which each rank
 * lists what a DDP rank of the same layout lists. Collective over dp: its
 * ranks hold the same entries (the same model and stages). */
static dt_status complete_shares(dt_trainer *tr, dt_pg *dp, tpiece *pc, void **hold)
{
    *hold = NULL;
    dt_model *m = dt_trainer_model(tr);
    dt_optim *o = dt_trainer_optim(tr);
    const size_t ne = dt_model_num_entries(m);
    const int D = dt_pg_size(dp), ns = dt_optim_num_states(o);
    if (ns > 4)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_save: %d optimizer states per parameter (at most 4)", ns);
    double *lh = calloc(2 * ne * (size_t)(D + 1) + 1, sizeof *lh); /* mine, then every rank's [lo, hi) */
    size_t *counts = calloc((size_t)D, sizeof *counts), *displs = calloc((size_t)D, sizeof *displs);
    dt_status st = lh && counts && displs ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save: out of memory");
    size_t bytes = 0;
    for (size_t i = 0; i < ne && lh; i++) {
        lh[2 * i] = (double)pc[i].lo, lh[2 * i + 1] = (double)pc[i].hi;
        if (dt__ckpt_trained(&pc[i]))
            bytes += pc[i].e.numel * (dt_dtype_size(pc[i].e.dtype) + 4 + 4 * (size_t)ns) + (2 + (size_t)ns) * 64;
    }
    char *buf = st >= 0 ? dt_alloc(bytes + 64) : NULL;
    if (st >= 0 && !buf)
        st = dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save: out of memory gathering the ZeRO-1 shares (%zu bytes)",
                      bytes);
    bool any;
    dt_status cst = any_failed(dp, st, &any);
    if (cst >= 0 && !any)
        cst = dt_pg_allgather(dp, lh, lh + 2 * ne, 2 * ne, DT_F64);
    if (cst < 0 || any) {
        free(lh), free(counts), free(displs), dt_free(buf);
        return cst < 0 ? cst : st < 0 ? st : dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save: another data-parallel rank "
                                                                       "is out of memory");
    }
    char *at = buf;
    for (size_t i = 0; i < ne && st >= 0; i++) {
        tpiece *q = &pc[i];
        if (!dt__ckpt_trained(q))
            continue;
        size_t have = 0;
        for (int r = 0; r < D; r++) {
            const double *x = lh + 2 * ne * (size_t)(r + 1) + 2 * i;
            displs[r] = (size_t)x[0];
            counts[r] = (size_t)x[1] - (size_t)x[0];
            have += counts[r];
        }
        if (have == 0) /* another stage's tensor */
            continue;
        if (have != q->e.numel) {
            st = dt_error(DT_ERR_INTERNAL, "dt_trainer_save: the data-parallel shares of '%s' hold %zu of its %zu "
                          "elements", q->e.name, have, q->e.numel);
            break;
        }
        const size_t n = q->hi - q->lo, N = q->e.numel;
        /* (name, dtype, bytes per element, this rank's share) of each array */
        void *whole[2 + 4];
        const void *mine[2 + 4];
        dt_dtype dts[2 + 4];
        int na = 0;
        if (q->e.dtype != DT_F32)
            whole[na] = NULL, mine[na] = q->lowp, dts[na++] = q->e.dtype;
        whole[na] = NULL, mine[na] = q->val, dts[na++] = DT_F32;
        for (int k = 0; k < ns && st >= 0; k++) {
            float *data;
            st = dt_optim_state(o, q->range, k, NULL, &data, NULL);
            whole[na] = NULL, mine[na] = n && st >= 0 ? data + q->roff : NULL, dts[na++] = DT_F32;
        }
        for (int a = 0; a < na && st >= 0; a++) {
            const size_t e = dt_dtype_size(dts[a]);
            whole[a] = at;
            at += (N * e + 63) / 64 * 64;
            if (n)
                memcpy((char *)whole[a] + q->lo * e, mine[a], n * e);
            if ((st = dt_pg_allgatherv(dp, NULL, whole[a], counts, displs, dts[a])) < 0)
                st = dt_error_wrap(st, "dt_trainer_save: gathering the shares of '%s'", q->e.name);
        }
        if (st < 0)
            break;
        int a = 0;
        q->lowp = q->e.dtype != DT_F32 ? whole[a++] : NULL;
        q->val = whole[a++];
        for (int k = 0; k < ns; k++)
            q->sv[k] = whole[a++];
        q->lo = 0, q->hi = N;
    }
    free(lh), free(counts), free(displs);
    if (st < 0)
        dt_free(buf);
    else
        *hold = buf;
    return st;
}

/* Tensor parallelism (DDP over the data-parallel group, which the trainer
 * sees): the tensor-parallel group of data-parallel rank 0 (world ranks
 * 0 .. t-1) saves collectively over that group, each rank its share of each
 * slice (add_tp_entry) and the replicated tensors dealt among them by
 * dt_ckpt_save; the other data-parallel ranks hold the same values and only
 * hear the outcome. Synchronous, as save_sharded. */
static dt_status save_tp(dt_trainer *tr, dt_pg *tp, const char *dir, const dt_trainer_save_params *pp)
{
    dt_status sst = DT_OK, st = DT_OK;
    char msg[1024] = "";
    /* ZeRO-1: every data-parallel rank helps rank 0 gather the whole state */
    dt_strategy_ckpt lay;
    dt_status lst = dt__strategy_ckpt_layout(dt_trainer_strategy(tr), &lay);
    if (lst < 0)
        return lst;
    dt_pg *share = lay.share_group;
    tpiece *zpc = NULL;
    void *hold = NULL;
    if (share) {
        bool sharded, any;
        sst = dt__ckpt_collect_pieces(tr, &zpc, &sharded);
        sst = sst < 0 ? (any_failed(share, sst, &any), sst) : complete_shares(tr, share, zpc, &hold);
        if (sst < 0 && dt_trainer_rank(tr) != 0) {
            st = sst;
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    if (dt_trainer_rank(tr) == 0) {
        if (sst >= 0 && dt_pg_rank(tp) == 0 && (sst = own_dir(tr, dir)) >= 0)
            dt__ckpt_remove_stale(dir);
        bool any;
        ckpt_job *j = NULL;
        tpiece *pc = zpc;
        bool sharded;
        if ((st = any_failed(tp, sst, &any)) >= 0 && !any) {
            if (zpc || (sst = dt__ckpt_collect_pieces(tr, &pc, &sharded)) >= 0) { /* the same on every rank: shapes agree */
                const double tst = dt_trace_now();
                sst = stage(tr, dir, pp, pc, false, NULL, tp, &j);
                dt_trace_span(DT_TRACE_CKPT, "checkpoint staging", tst);
            }
            if (pc != zpc)
                free(pc);
            snprintf(msg, sizeof msg, "%s", sst < 0 ? dt_last_error() : "");
            st = any_failed(tp, sst, &any);
        } else {
            snprintf(msg, sizeof msg, "%s", sst < 0 ? dt_last_error() : "");
        }
        if (st >= 0 && any) {
            st = sst < 0 ? dt_error(sst, "%s", msg)
                         : dt_error(DT_ERR_IO, "another tensor-parallel rank could not stage the checkpoint (its "
                                               "error says why)");
        } else if (st >= 0) {
            dt_st_kv meta[2] = {{META_RUN, j->run_state}, {META_USER, j->user ? j->user : "null"}};
            dt_ckpt_save_params sp = dt_ckpt_save_params_default();
            sp.meta = meta;
            sp.nmeta = 2;
            sp.overwrite = true;
            st = dt_ckpt_save(j->final, dt_ckpt_list_entries(j->list), dt_ckpt_list_count(j->list), &sp, tp);
            if (st >= 0 && dt_pg_rank(tp) == 0)
                dt__ckpt_prune(j->dir, j->keep, j->step);
        }
        job_free(j);
        snprintf(msg, sizeof msg, "%s", st < 0 ? dt_last_error() : "");
    }
    free(zpc);
    dt_free(hold);
    /* the data-parallel group hears the outcome (the same on every rank of tp) */
    double v = st < 0 ? 1.0 : 0.0;
    dt_status ast = dt_trainer_world(tr) > 1 ? dt_trainer_allreduce_sum(tr, &v, 1) : DT_OK;
    if (ast < 0)
        return ast;
    if (st < 0)
        return dt_error(st, "%s", msg);
    if (v > 0)
        return dt_error(DT_ERR_IO, "data-parallel rank 0 could not write the checkpoint (its error says why)");
    return DT_OK;
}

dt_status dt_trainer_save(dt_trainer *tr, const char *dir, const dt_trainer_save_params *p)
{
    if (!tr || !dir)
        return dt_error(DT_ERR_NULL, "dt_trainer_save: %s is NULL", tr ? "dir" : "trainer");
    if (!*dir)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_save: empty dir");
    if (dt_trainer_offload(tr)) /* every rank has it or none: the refusal is symmetric */
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_save: the optimizer state is offloaded to NVMe (offload.h), "
                        "which checkpoints do not hold yet");
    dt_status kst = dt__ckpt_tp_known(tr, "dt_trainer_save");
    if (kst < 0)
        return kst;
    dt_trainer_save_params pp = p ? *p : dt_trainer_save_params_default();
    if (pp.keep < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_save: keep %d < 0", pp.keep);
    ckpt_slot *sl = slot_of(tr);
    if (!sl)
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save: out of memory");
    ckpt_job **jp = &sl->job;
    /* the previous save (asynchronous) first: one at a time */
    dt_status st = agree_done(tr, jp);
    if (st < 0)
        return dt_error_wrap(st, "the previous checkpoint");
    ckpt_job *j = NULL;
    tpiece *pc = NULL;
    bool sharded = false;
    dt_pg *tp = dt__ckpt_tp_of(tr);
    dt_strategy_ckpt lay;
    if ((st = dt__strategy_ckpt_layout(dt_trainer_strategy(tr), &lay)) < 0)
        return st;
    if (tp && lay.tp_shares) /* every rank: its stages' share of each tensor */
        return save_sharded(tr, dir, &pp, tp);
    if (tp)
        return save_tp(tr, tp, dir, &pp);
    dt_status sst = dt__ckpt_collect_pieces(tr, &pc, &sharded);
    if (sst >= 0 && sharded) {
        free(pc);
        return save_sharded(tr, dir, &pp, NULL);
    }
    /* every rank: PowerSGD's per-rank state to rank 0 (a collective) */
    dt__psgd_saved psgd;
    dt_status pst = dt__psgd_ckpt_collect(tr, &psgd);
    if (sst >= 0)
        sst = pst;
    if (sst >= 0 && dt_trainer_rank(tr) == 0) {
        if ((sst = own_dir(tr, dir)) >= 0) {
            const double tst = dt_trace_now();
            sst = stage(tr, dir, &pp, pc, pp.async, &psgd, NULL, &j);
            dt_trace_span(DT_TRACE_CKPT, "checkpoint staging", tst);
        }
        if (sst >= 0) {
            int rc = pthread_create(&j->th, NULL, job_thread, j);
            if (rc != 0) {
                job_free(j);
                j = NULL;
                sst = dt_error(DT_ERR_INTERNAL, "dt_trainer_save: cannot start the writer thread (%s)",
                               strerror(rc));
            } else {
                j->started = true;
            }
        }
    }
    free(pc);
    dt__psgd_saved_release(&psgd);
    /* staging failed on rank 0: every rank hears of it now */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sst < 0 ? dt_last_error() : "");
    double v = sst < 0 ? 1.0 : 0.0;
    if ((st = dt_trainer_allreduce_sum(tr, &v, 1)) < 0) {
        job_free(j);
        return st;
    }
    if (v > 0)
        return sst < 0 ? dt_error(sst, "%s", msg)
                       : dt_error(DT_ERR_IO, "rank 0 could not stage the checkpoint (its error says why)");
    *jp = j;
    if (pp.async)
        return DT_OK;
    return agree_done(tr, jp);
}

dt_status dt_trainer_save_prepare(dt_trainer *tr, const char *dir)
{
    if (!tr || !dir || !*dir)
        return dt_error(DT_ERR_NULL, "dt_trainer_save_prepare: %s", tr ? "no directory" : "trainer is NULL");
    dt_pg *tp = dt__ckpt_tp_of(tr);
    /* the owner: the rank that creates and prunes the directory in every save path */
    const bool owner = dt_trainer_rank(tr) == 0 && (!tp || dt_pg_rank(tp) == 0);
    dt_status ost = owner ? own_dir(tr, dir) : DT_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ost < 0 ? dt_last_error() : "");
    /* one owner in the world: the sum is its status (negated), 0 when it succeeded */
    double v = ost < 0 ? -(double)ost : 0.0;
    dt_status st = tp ? dt_pg_allreduce(tp, DT_IN_PLACE, &v, 1, DT_F64, DT_REDUCE_SUM) : DT_OK;
    if (st >= 0 && dt_trainer_world(tr) > 1)
        st = dt_trainer_allreduce_sum(tr, &v, 1);
    if (st < 0)
        return st;
    if (ost < 0)
        return dt_error(ost, "%s", msg);
    if (v > 0)
        return dt_error((dt_status)(-(int)v), "rank 0 cannot use the checkpoint directory %s (its error says why)",
                        dir);
    return DT_OK;
}

