/* dtrain train's epoch loop (train_run.h): the stop signals taken between
 * steps, the --metrics file's opening, evaluation and its record, the
 * per-step callback (progress, step records, samples, fault injection,
 * --save-every), one epoch, and the ranks' agreement checks. */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"
#include "train_run.h"

#include "dtrain/autograd.h"
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/tokenizer.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/offload.h"
#include "dtrain/optim.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/tensor.h"
#include "dtrain/train.h"
#include "dtrain/trace.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fnmatch.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static int g_stop; /* the stopping signal taken, or 0 (main thread only) */
static sigset_t g_stop_set;

void dt__tr_block_stop_signals(void)
{
    sigemptyset(&g_stop_set);
    sigaddset(&g_stop_set, SIGINT);
    sigaddset(&g_stop_set, SIGTERM);
    sigaddset(&g_stop_set, SIGHUP); /* a closed terminal or dropped SSH session: save and stop, as SIGTERM */
    pthread_sigmask(SIG_BLOCK, &g_stop_set, NULL);
}

/* Take a pending SIGINT/SIGTERM/SIGHUP, if any (they are blocked: see cmd_train.c's top). */
static int poll_stop(void)
{
    if (!g_stop) {
        struct timespec zero = {0, 0};
        int sig = sigtimedwait(&g_stop_set, NULL, &zero);
        if (sig > 0)
            g_stop = sig;
    }
    return g_stop;
}

int dt__tr_stop_pending(void *arg)
{
    (void)arg;
    return poll_stop();
}

/* --metrics (rank 0 writes): a fresh history, or a resumed run's continued
 * (train_metrics.c), then the resume record. */
int dt__tr_open_metrics(dt__train_run *t)
{
    if (!t->o.metrics || !dt__ddp_is_main(&t->ddp))
        return 0;
    if (dt__metrics_open(&t->metrics, t->o.metrics, t->resumed_step) < 0)
        return dt__tr_fail(2, NULL);
    t->metrics_open = true;
    const dt__metrics *m = &t->metrics;
    if (t->resumed_step < 0)
        return 0;
    if (m->from && strcmp(t->o.progress, "none"))
        printf("--metrics: continuing %s%s: %lld records up to step %lld kept, %lld after it dropped%s\n",
               t->o.metrics, m->from, (long long)m->kept, (long long)t->resumed_step, (long long)m->dropped,
               m->bad ? " (and lines that were not records)" : "");
    const dt_trainer_resume_info *ri = &t->ri;
    char path_q[1200];
    dt__json_quote(ri->path, path_q, sizeof path_q);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"resume\",\"from\":%s,\"step\":%lld,\"optimizer_step\":%lld,"
                          "\"micro_step\":%lld,\"epoch\":%lld,\"epoch_batch\":%lld,\"saved_world_size\":%d,"
                          "\"data_order_kept\":%s,\"records_kept\":%lld,\"records_dropped\":%lld",
                          path_q, (long long)ri->step, (long long)ri->step, (long long)t->micro_step,
                          (long long)ri->epoch + 1, (long long)ri->batch, ri->saved_world,
                          ri->data_order_kept ? "true" : "false", (long long)m->kept, (long long)m->dropped) < 0)
        return dt__tr_fail(1, NULL);
    return 0;
}

/* Mean test loss and accuracy (fraction; NAN when not a classifier), summed
 * over the ranks' shares. */
int dt__tr_evaluate(dt__train_run *t, double *loss_out, double *acc_out)
{
    dt_dataset *test_set = t->test_shard ? t->test_shard : t->test;
    dt_trainer_eval_result r;
    if (!t->test_loader) {
        dt__cli_err("dtrain train: evaluation: there is no test loader (--no-eval)\n");
        return 2;
    }
    if (dt_trainer_evaluate(t->tr, t->test_loader, dt_dataset_get_info(test_set), &r) < 0)
        return dt__tr_fail(1, "evaluation");
    *loss_out = r.loss;
    *acc_out = t->classifier ? r.accuracy : NAN;
    return 0;
}

int dt__tr_eval_and_record(dt__train_run *t, int64_t epoch, double *tl, double *ta)
{
    if (t->eval_step >= 0 && t->eval_step == t->global_step) { /* --eval-every evaluated this step already */
        *tl = t->eval_loss, *ta = t->eval_acc;
        return 0;
    }
    int rc = dt__tr_evaluate(t, tl, ta);
    if (rc)
        return rc;
    t->eval_step = t->global_step, t->eval_loss = *tl, t->eval_acc = *ta;
    char acc[32];
    if (isnan(*ta))
        snprintf(acc, sizeof acc, "null");
    else
        snprintf(acc, sizeof acc, "%.6f", *ta);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"eval\",\"epoch\":%lld,\"step\":%lld,\"test_loss\":%.6f,"
                          "\"test_accuracy\":%s,\"test_items\":%lld",
                          (long long)epoch + 1, (long long)t->global_step, *tl, acc,
                          (long long)dt_dataset_length(t->test)) < 0)
        return dt__tr_fail(1, NULL);
    return 0;
}

double dt__tr_window_mean(const dt__train_run *t)
{
    int64_t n = t->nloss < LOSS_WINDOW ? t->nloss : LOSS_WINDOW;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += t->loss_window[i];
    return n ? s / (double)n : NAN;
}

/* Language models: ",\"tokens_per_s\":N,\"mfu\":F" for a records' tail ("" otherwise):
 * tokens/s over all ranks, the MFU per rank. */
static const char *lm_rates(const dt__train_run *t, double sps, char *buf, size_t cap)
{
    buf[0] = 0;
    if (t->lm)
        snprintf(buf, cap, ",\"tokens_per_s\":%.1f,\"mfu\":%.4f", sps * (double)t->desc.input_shape[0],
                 t->peak_gflops > 0
                     ? sps / (t->ddp.world * t->ddp.cp) * t->desc.train_flops_per_sample * 1e-9 / t->peak_gflops
                     : 0.0);
    return buf;
}

/* A generated sample from the model's weights now: the prompt is the first
 * 8 tokens of the validation file; prints the token ids (rank 0). --pp:
 * every rank generates through its pipeline's stages (collective). */
int dt__tr_print_sample(dt__train_run *t)
{
    const bool piped = t->ddp.pp > 1;
    if (!t->sample_src || (!piped && !dt__ddp_is_main(&t->ddp)))
        return 0;
    if (dt_model_is_meta(t->model)) { /* ZeRO-3: no rank holds the whole model */
        printf("sample at step %lld: not available with --zero 3 (the parameters are sharded)\n",
               (long long)t->global_step);
        return 0;
    }
    int64_t np = dt_tokens_count(t->sample_src) < 8 ? dt_tokens_count(t->sample_src) : 8, n = 0;
    int64_t cap = np + dt__train_sample_tokens(&t->o), *buf = malloc((size_t)cap * sizeof *buf);
    if (!buf || np < 1) {
        free(buf);
        return 0;
    }
    for (int64_t i = 0; i < np; i++) {
        uint32_t id = dt_tokens_at(t->sample_src, i);
        buf[i] = id < t->desc.input_classes ? id : 0;
    }
    dt_generate_params gp = dt_generate_params_default();
    gp.max_new_tokens = dt__train_sample_tokens(&t->o);
    gp.top_k = 40;
    gp.seed = t->o.seed + (uint64_t)t->global_step;
    dt_status st = piped ? dt_strategy_pipe_generate(dt_trainer_strategy(t->tr), &gp, buf, np, buf, cap, &n)
                         : dt_model_generate(t->model, &gp, buf, np, buf, cap, &n);
    if (st == DT_ERR_UNSUPPORTED) { /* refused (every rank alike: the same model and arguments): the run goes on */
        if (dt__ddp_is_main(&t->ddp))
            printf("sample at step %lld: not available: %s\n", (long long)t->global_step, dt_last_error());
        free(buf);
        return 0;
    }
    if (st < 0) {
        free(buf);
        return dt__tr_fail(1, "sample");
    }
    if (!dt__ddp_is_main(&t->ddp)) {
        free(buf);
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    uint16_t *ids = t->bpe ? malloc((size_t)n * sizeof *ids) : NULL;
    for (int64_t i = 0; ids && i < n; i++)
        ids[i] = (uint16_t)buf[i];
    if (ids && dt_bpe_decode(t->bpe, ids, n, &text, &len) == DT_OK) {
        printf("sample at step %lld:\n%.*s\n", (long long)t->global_step, (int)len, text);
    } else {
        printf("sample at step %lld:", (long long)t->global_step);
        for (int64_t i = 0; i < n; i++)
            printf("%s%lld", i == np ? " | " : " ", (long long)buf[i]);
        printf("\n");
    }
    free(text);
    free(ids);
    fflush(stdout);
    free(buf);
    return 0;
}

/* The optimizer step within the epoch that the position after a step
 * shows: its batches grouped by grad_accum from the epoch's end backwards,
 * so that a run resumed at another world size (which continues at the same
 * fraction of the epoch, dt_trainer_epoch) shows where it is in the epoch
 * and ends it at spe. */
static int64_t epoch_step(const dt__train_run *t)
{
    const dt_trainer_position pos = dt_trainer_get_position(t->tr);
    const int64_t accum = t->o.grad_accum > 0 ? t->o.grad_accum : 1; /* the trainer's (a pipeline's is 1) */
    const int64_t done = pos.epoch > t->epoch ? t->nb : pos.batch; /* batches of the epoch behind us */
    const int64_t left = (t->nb - done + accum - 1) / accum;
    return t->spe - left;
}

/* After every optimizer step: its record (every --log-every steps and at
 * the epoch's end), progress, mid-epoch evaluation. "step" everywhere is the
 * optimizer step (DeepSpeed's global_steps, HF Trainer's global_step); the
 * micro-batches are "micro_step". */
static dt_status on_step(void *ud, dt_trainer *tr, const dt_trainer_metrics *m)
{
    dt__train_run *t = ud;
    if (poll_stop()) /* DDP: the trainer's next step makes every rank agree */
        dt_trainer_request_stop(tr);
    if (m->stop && !g_stop)
        g_stop = SIGTERM;
    if (!t->first_shown && t->prog.mode != DT__PROGRESS_NONE) { /* the time a user waits for training to start */
        const double now = dt_time_s();
        dt__progress_clear(&t->prog);
        printf("first step done %.2f s after start (the step, data loading included: %.2f s)\n", now - t->start_s,
               now - t->t0);
        fflush(stdout);
        dt__progress_exclude(&t->prog, dt_time_s() - now);
    }
    t->first_shown = true;
    if (t->nstep_s == t->cap_step_s) { /* the step times, for the end record's median */
        int64_t c = t->cap_step_s ? 2 * t->cap_step_s : 256;
        double *q = realloc(t->step_s, (size_t)c * sizeof *q);
        if (q)
            t->step_s = q, t->cap_step_s = c;
    }
    if (t->nstep_s < t->cap_step_s)
        t->step_s[t->nstep_s++] = m->step_s;
    struct timespec cts; /* CPU seconds per step after the first (warm-up), for the end record */
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cts) == 0) {
        const double now_cpu = (double)cts.tv_sec + 1e-9 * (double)cts.tv_nsec;
        if (t->ncpu_steps++ == 0)
            t->cpu_first_s = now_cpu;
        t->cpu_last_s = now_cpu;
    }
    double sum = 0;
    for (int i = 0; i < m->nmicro; i++)
        sum += m->micro_loss[i];
    const int64_t before = t->global_step;
    t->global_step = dt_trainer_steps(tr); /* a step skipped by the loss scaler does not count (as for the schedule) */
    t->micro_step += m->nmicro;
    t->step = epoch_step(t);
    t->samples += m->samples;
    if (isfinite(sum)) { /* a step the fp16 loss scaler skipped is left out of the means */
        t->loss_window[t->nloss++ % LOSS_WINDOW] = m->nmicro ? sum / m->nmicro : NAN;
        t->epoch_loss += sum;
        t->epoch_micro += m->nmicro;
    }
    t->log_loss += sum; /* the step's own record shows it (null) */
    t->log_n += m->nmicro;
    const bool advanced = t->global_step != before;
    if (t->wall_clock && dt__ddp_is_main(&t->ddp) && t->prog.mode != DT__PROGRESS_NONE) {
        /* DeepSpeed's wall_clock_breakdown line (its engine's global timers, ms) */
        dt__progress_clear(&t->prog);
        printf("time (ms) | fwd: %.2f | bwd: %.2f | bwd_inner: %.2f | bwd_allreduce: %.2f | step: %.2f\n",
               1e3 * m->forward_s, 1e3 * (m->backward_s + m->wait_s), 1e3 * m->backward_s, 1e3 * m->wait_s,
               1e3 * m->optim_s);
    }
    dt__progress_step(&t->prog, t->step, t->global_step, dt__tr_window_mean(t), m->lr, t->samples);
    /* a step the fp16 loss scaler skipped keeps its number (it is not a step of the schedule, --max-steps or the
       checkpoint names): its record repeats the number, with skipped_steps one higher */
    dt_pg_traffic now = {0};
    if (t->comm_on && (advanced || t->global_step % t->o.log_every == 0 || t->step == t->spe) &&
        dt_pg_traffic_read(dt__tr_world_of(t), &now, NULL, 0) < 0)
        now.counted = 0;
    if (advanced && t->comm_first_step < 0 && now.counted) {
        t->comm_first = now;
        t->comm_first_step = t->global_step;
    }
    if (t->global_step % t->o.log_every == 0 || t->step == t->spe) {
        double el = dt_time_s() - t->t0;
        char lmr[96], comm[96] = "";
        if (now.counted) { /* this rank's bytes since the previous record */
            snprintf(comm, sizeof comm, ",\"comm_bytes_sent\":%llu", (unsigned long long)(now.sent - t->comm_prev.sent));
            if (now.nodes_known)
                snprintf(comm + strlen(comm), sizeof comm - strlen(comm), ",\"comm_bytes_cross_node\":%llu",
                         (unsigned long long)(now.sent_cross_node - t->comm_prev.sent_cross_node));
            t->comm_prev = now;
        }
        if (dt__metrics_write(&t->metrics,
                              "\"event\":\"step\",\"epoch\":%lld,\"step\":%lld,\"epoch_step\":%lld,"
                              "\"micro_step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"samples_per_s\":%.1f%s,"
                              "\"loss_scale\":%g,\"skipped_steps\":%lld%s",
                              (long long)t->epoch + 1, (long long)t->global_step, (long long)t->step,
                              (long long)t->micro_step, t->log_n ? t->log_loss / (double)t->log_n : NAN, m->lr,
                              el > 0 ? (double)t->samples / el : 0,
                              lm_rates(t, el > 0 ? (double)t->samples / el : 0, lmr, sizeof lmr), m->loss_scale,
                              (long long)m->skipped_steps, comm) < 0) {
            dt__progress_clear(&t->prog);
            t->cb_rc = dt__tr_fail(1, NULL);
            return DT_ERR_CANCELED; /* reported */
        }
        t->log_loss = 0;
        t->log_n = 0;
    }
    if (advanced) {
        if (t->o.eval_every > 0 && t->global_step % t->o.eval_every == 0 && t->step != t->spe) {
            /* Evaluation time is not training time: keep it out of the clock. */
            double e0 = dt_time_s(), tl, ta;
            dt__progress_clear(&t->prog);
            if ((t->cb_rc = dt__tr_eval_and_record(t, t->epoch, &tl, &ta)))
                return DT_ERR_CANCELED; /* reported already */
            if (t->prog.mode != DT__PROGRESS_NONE) {
                if (isnan(ta))
                    printf("step %lld: %s loss %.4f\n", (long long)t->global_step, t->lm ? "val" : "test", tl);
                else
                    printf("step %lld: test loss %.4f, test accuracy %.2f%%\n", (long long)t->global_step, tl,
                           100 * ta);
            }
            t->t0 += dt_time_s() - e0;
            dt__progress_exclude(&t->prog, dt_time_s() - e0);
        }
        if (t->o.sample_every > 0 && t->global_step % t->o.sample_every == 0) {
            double e0 = dt_time_s();
            dt__progress_clear(&t->prog);
            if ((t->cb_rc = dt__tr_print_sample(t)))
                return DT_ERR_CANCELED; /* reported already */
            t->t0 += dt_time_s() - e0;
            dt__progress_exclude(&t->prog, dt_time_s() - e0);
        }
    }
    const int64_t steps = dt_trainer_steps(tr);
    if (t->kill_step > 0 && steps == t->kill_step && t->ddp.rank == t->kill_rank)
        raise(SIGKILL); /* fault injection for the restart tests (DT_FAULT_KILL_STEP) */
    if (t->o.save && t->o.save_every > 0 && steps % t->o.save_every == 0 && steps != t->saved_step) {
        double s0 = dt_time_s();
        dt__progress_clear(&t->prog);
        if ((t->cb_rc = dt__tr_save_ckpt(t)))
            return DT_ERR_CANCELED; /* reported already */
        t->t0 += dt_time_s() - s0; /* the save's stall is not training time */
    }
    if (t->o.max_steps > 0 && steps >= t->o.max_steps) {
        t->max_reached = true; /* every rank reaches it after the same step */
        return DT_ERR_CANCELED;
    }
    return DT_OK;
}

int dt__tr_train_epoch(dt__train_run *t, int64_t epoch, double *wall_s, double *sps_out)
{
    t->epoch = epoch;
    t->nb = dt_loader_num_batches(t->train_loader);
    t->step = t->samples = t->log_n = t->epoch_micro = 0; /* resumed mid-epoch: the first step says where (epoch_step) */
    t->log_loss = t->epoch_loss = 0;
    dt__progress_epoch_begin(&t->prog, epoch, t->spe);
    t->t0 = dt_time_s();
    dt_trainer_epoch_result res;
    dt_status st = dt_trainer_epoch(t->tr, t->train_loader, dt_dataset_get_info(t->train), epoch, on_step, t, &res);
    if (st == DT_ERR_CANCELED && t->max_reached && !t->cb_rc)
        st = DT_OK; /* --max-steps: a normal end */
    if (st < 0) {
        dt__progress_clear(&t->prog);
        if (st == DT_ERR_CANCELED && t->cb_rc)
            return t->cb_rc; /* the callback reported it */
        const bool data = st == DT_ERR_FORMAT || st == DT_ERR_IO;
        char where[64] = "training data"; /* the data is this rank's share: name the rank */
        if (data && t->ddp.world > 1)
            snprintf(where, sizeof where, "training data on rank %d", t->ddp.rank);
        return dt__tr_fail(data ? 2 : 1, data ? where : "training step");
    }
    if (g_stop || res.stopped) {
        /* the step under way finished (every rank stopped after the same
         * one); with --save, keep it before leaving */
        dt__progress_clear(&t->prog);
        const int sig = g_stop ? (int)g_stop : SIGTERM;
        char saved[600] = "";
        if (t->o.save) {
            int rc = dt_trainer_steps(t->tr) != t->saved_step ? dt__tr_save_ckpt(t) : 0;
            if (!rc && dt_trainer_save_wait(t->tr) < 0)
                rc = dt__tr_fail(1, "checkpoint");
            if (rc) {
                dt__cli_err("dtrain train: interrupted by signal %d at step %lld; the checkpoint was not saved\n",
                            sig, (long long)t->global_step);
                return rc;
            }
            snprintf(saved, sizeof saved, "; checkpoint %s/step-%08lld saved", t->o.save,
                     (long long)dt_trainer_steps(t->tr));
        }
        dt__cli_err("dtrain train: interrupted by signal %d at step %lld%s\n", sig, (long long)t->global_step, saved);
        return 130;
    }
    *wall_s = dt_time_s() - t->t0;
    *sps_out = *wall_s > 0 ? (double)t->samples / *wall_s : 0;
    dt__progress_epoch_end(&t->prog, t->step, dt__tr_window_mean(t), *wall_s, *sps_out);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"epoch\",\"epoch\":%lld,\"step\":%lld,\"wall_s\":%.4f,"
                          "\"samples_per_s\":%.1f,\"train_loss\":%.6f,\"train_loss_last100\":%.6f",
                          (long long)epoch + 1, (long long)t->global_step, *wall_s, *sps_out,
                          t->epoch_micro ? t->epoch_loss / (double)t->epoch_micro : NAN, dt__tr_window_mean(t)) < 0)
        return dt__tr_fail(1, NULL);
    return 0;
}

/* A run whose every optimizer step overflowed and was skipped trained
 * nothing: an error (exit 1), never a success. */
int dt__tr_check_all_skipped(dt__train_run *t)
{
    dt_loss_scaler_state ls;
    const dt_loss_scaler *sc = dt_trainer_loss_scaler(t->tr);
    if (!sc)
        return 0;
    dt_loss_scaler_get_state(sc, &ls);
    if (ls.iter == 0 || ls.skipped < ls.iter)
        return 0;
    dt__cli_err("dtrain train: every one of the %lld optimizer steps overflowed at loss scale %g and was skipped: "
                "nothing was trained (lower --loss-scale or use dynamic loss scaling, check the data for "
                "inf/NaN)\n", (long long)ls.iter, ls.scale);
    return 1;
}

/* Every rank was given the same training options (a rank with another
 * optimizer, learning rate, seed or clipping would train apart and still
 * exit 0; one with another --max-steps, model or batch under --tp or --pp
 * would wait on one group while the others wait on another): compared once
 * over the whole world, before the model is built, exit 2 naming the
 * options and ranks. */
int dt__tr_check_same(dt__train_run *t)
{
    enum { CAP = 160 };
    dt_pg *world = t->ddp.world_pg;
    if (!world || dt_pg_size(world) <= 1)
        return 0;
    const char *names[CAP], *values[CAP];
    char(*vals)[512] = malloc(CAP * sizeof *vals);
    char(*flags)[40] = malloc(CAP * sizeof *flags);
    if (!vals || !flags) {
        free(vals);
        free(flags);
        return dt__tr_fail(1, "out of memory");
    }
    int n = dt__train_shared_opts(&t->o, names, vals, CAP);
    for (int i = 0; i < n; i++) {
        snprintf(flags[i], sizeof flags[i], "--%s", names[i]);
        names[i] = flags[i];
        values[i] = vals[i];
    }
    dt_status st = dt_pg_check_same(world, names, values, n);
    free(vals);
    free(flags);
    if (st == DT_ERR_MISMATCH) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 2;
    }
    return st < 0 ? dt__tr_fail(1, "comparing the ranks' options") : 0;
}
