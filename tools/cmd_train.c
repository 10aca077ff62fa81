/* dtrain train — train a model from the zoo on a data set, evaluate it on
 * the test split, report honest numbers.
 *
 * Flow: parse the options (train_args.c; bad flags exit 2), create the
 * model (its input shape decides the random data set's shape), open the
 * data (errors name the file, exit 2), then per epoch: the loader's thread
 * prepares batches while the step runs forward, loss, backward, optional
 * clipping, schedule and the fused optimizer over the flat buffers. The
 * epoch's wall time covers everything from the first batch request to the
 * last optimizer step (data loading included, evaluation excluded).
 *
 * Output: progress on stdout (train_progress.c), the final figures on
 * stdout, errors on stderr as one line. --metrics FILE gets JSON lines
 * (train_metrics.c) in FILE.partial as they happen, renamed to FILE when the
 * run succeeds. SIGINT/SIGTERM stop the run between steps (exit 130; the
 * records and an end record saying "interrupted" stay in FILE.partial). */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"

#include "dtrain/autograd.h"
#include "dtrain/data.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/tensor.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define LOSS_WINDOW 100 /* "train loss over the last 100 steps" */

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

typedef struct {
    dt__train_opts o;
    dt_model *model;
    dt_model_desc desc;
    int in_ndim;                  /* input dims including the batch */
    int64_t in_shape[DT_MAX_DIMS];
    int tgt_ndim;
    bool classifier;              /* has labels / accuracy */
    dt_dataset *base_train, *base_test, *train, *test;
    dt_dataset *test_shard;       /* DDP: this rank's share of the test set (NULL: all) */
    dt__ddp_run ddp;              /* DDP (train_ddp.c): no-op at world size 1 */
    dt_sampler *train_sampler, *test_sampler;
    dt_loader *train_loader, *test_loader;
    dt_optim *opt;
    dt_optim_segment *segs;
    dt_sched_params sched;
    dt_ctx *ctx;
    dt__metrics metrics;
    bool metrics_open;
    dt__progress prog;
    int64_t global_step;          /* batches (micro-batches with --grad-accum) */
    int64_t opt_step;             /* optimizer steps: what the LR schedule counts */
    double loss_window[LOSS_WINDOW];
    int64_t nloss;
} trainer;

/* One-line errors: "dtrain train: <what>: <message>". */
static int fail(int code, const char *what)
{
    fprintf(stderr, "dtrain train: %s%s%s\n", what ? what : "", what && *dt_last_error() ? ": " : "",
            dt_last_error());
    return code;
}

static int setup_model(trainer *t)
{
    dt_model_config cfg = dt_model_config_default();
    if (dt_model_create(t->o.model, t->o.seed, &cfg, &t->model, &t->desc) < 0)
        return fail(2, "--model");
    if (!strcmp(t->o.rng, "torch") && dt_model_init_torch(t->model, t->o.seed) < 0)
        return fail(1, "--rng torch");
    int64_t tshape[DT_MAX_DIMS];
    dt_dtype tdt;
    if (dt_model_desc_shapes(&t->desc, 1, &t->in_ndim, t->in_shape, &t->tgt_ndim, tshape, &tdt) < 0)
        return fail(1, "model input shape");
    t->classifier = !strcmp(t->o.model, "convnet");
    return 0;
}

static int setup_data(trainer *t)
{
    dt_status st;
    char what[300];
    snprintf(what, sizeof what, "--data %s", t->o.data);
    if (!strcmp(t->o.data, "random")) {
        dt_random_dataset_params rp = dt_random_dataset_params_default();
        int64_t ntest = t->o.limit_test > 0 ? t->o.limit_test : 1000;
        rp.length = t->o.random_items + ntest;
        rp.x_ndim = t->in_ndim - 1;
        for (int d = 0; d < rp.x_ndim; d++)
            rp.x_shape[d] = t->in_shape[d + 1];
        rp.num_classes = 10;
        rp.seed = t->o.seed;
        if ((st = dt_dataset_random_init(&rp, &t->base_train)) < 0)
            return fail(2, what);
        if ((st = dt_dataset_subset_init(t->base_train, 0, t->o.random_items, &t->train)) < 0 ||
            (st = dt_dataset_subset_init(t->base_train, t->o.random_items, ntest, &t->test)) < 0)
            return fail(1, what);
    } else {
        if ((st = dt_dataset_open_spec(t->o.data, DT_SPLIT_TRAIN, &t->base_train)) < 0)
            return fail(2, what);
        if ((st = dt_dataset_open_spec(t->o.data, DT_SPLIT_TEST, &t->base_test)) < 0)
            return fail(2, what);
        const dt_dataset_info *info = dt_dataset_get_info(t->base_train);
        /* Every split against the model's input: each batch is viewed as
         * [B, model input], so a test set of other dimensions would be read
         * out of bounds. */
        if (dt_model_desc_check_dataset(&t->desc, t->base_train) < 0) {
            fprintf(stderr, "dtrain train: --data %s: %s\n", t->o.data, dt_last_error());
            return 2;
        }
        if (dt_model_desc_check_dataset(&t->desc, t->base_test) < 0) {
            char tr[160];
            dt_escape(dt_dataset_source(t->base_train), tr, sizeof tr);
            fprintf(stderr, "dtrain train: --data %s: %s (the training split, %s, matches the model)\n", t->o.data,
                    dt_last_error(), tr);
            return 2;
        }
        dt_model_config cfg = dt_model_config_default();
        int64_t ncls = info->num_classes;
        if (dt_dataset_get_info(t->base_test)->num_classes > ncls)
            ncls = dt_dataset_get_info(t->base_test)->num_classes;
        if (ncls > cfg.num_classes) {
            fprintf(stderr, "dtrain train: --data %s: labels go up to %lld, --model %s has %lld "
                            "classes\n", t->o.data, (long long)ncls - 1, t->o.model,
                    (long long)cfg.num_classes);
            return 2;
        }
        int64_t ntr = dt_dataset_length(t->base_train), nte = dt_dataset_length(t->base_test);
        if (t->o.limit_train > 0 && t->o.limit_train < ntr)
            ntr = t->o.limit_train;
        if (t->o.limit_test > 0 && t->o.limit_test < nte)
            nte = t->o.limit_test;
        if (dt_dataset_subset_init(t->base_train, 0, ntr, &t->train) < 0 ||
            dt_dataset_subset_init(t->base_test, 0, nte, &t->test) < 0)
            return fail(1, what);
    }
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = t->o.batch;
    lp.prefetch = (int)t->o.prefetch;
    /* DDP: every rank evaluates its own contiguous share of the test set */
    if (t->ddp.world > 1) {
        int64_t lo, hi;
        dt__ddp_eval_range(&t->ddp, dt_dataset_length(t->test), &lo, &hi);
        if (dt_dataset_subset_init(t->test, lo, hi - lo, &t->test_shard) < 0)
            return fail(1, what);
    }
    dt_dataset *test_set = t->test_shard ? t->test_shard : t->test;
    if (dt__ddp_train_sampler(&t->ddp, dt_dataset_length(t->train), t->o.seed,
                              !strcmp(t->o.rng, "torch") ? DT_SHUFFLE_TORCH : DT_SHUFFLE_PHILOX,
                              &t->train_sampler) < 0 ||
        dt_loader_init(t->train, t->train_sampler, &lp, &t->train_loader) < 0)
        return fail(1, "training data loader");
    lp.batch_size = t->o.batch > 500 ? t->o.batch : 500; /* evaluation: bigger batches, no grads */
    if (dt_sampler_sequential_init(dt_dataset_length(test_set), &t->test_sampler) < 0 ||
        dt_loader_init(test_set, t->test_sampler, &lp, &t->test_loader) < 0)
        return fail(1, "test data loader");
    if (dt_loader_num_batches(t->train_loader) == 0) {
        fprintf(stderr, "dtrain train: --data %s: the training set is empty\n", t->o.data);
        return 2;
    }
    return 0;
}

static int setup_optimizer(trainer *t)
{
    size_t ne = dt_model_num_entries(t->model), np = 0;
    t->segs = calloc(ne ? ne : 1, sizeof *t->segs);
    if (!t->segs)
        return fail(1, "out of memory");
    /* PyTorch's optimizers decay every parameter unless told otherwise; so
     * do we, to match its accuracy band. */
    if (dt_optim_segments_from_model(t->model, DT_F32, false, t->segs, ne, &np) < 0)
        return fail(1, "model entries");
    const dt_flat *P = dt_model_flat(t->model, DT_FLAT_PARAMS, DT_F32);
    dt_optim_range lay = {.params = P, .grads = dt_model_flat(t->model, DT_FLAT_GRADS, DT_F32), .lo = 0,
                          .hi = P->total, .segs = t->segs, .nseg = np};
    dt_status st = DT_OK;
    const char *k = t->o.optimizer;
    double wd = t->o.weight_decay;
    if (!strcmp(k, "sgd")) {
        dt_sgd_params p = dt_sgd_params_default();
        p.lr = t->o.lr;
        p.momentum = t->o.momentum;
        if (wd >= 0)
            p.weight_decay = wd;
        st = dt_optim_sgd_init(&p, &lay, 1, &t->opt);
    } else if (!strcmp(k, "adam") || !strcmp(k, "adamw")) {
        dt_adam_params p = !strcmp(k, "adam") ? dt_adam_params_default() : dt_adamw_params_default();
        p.lr = t->o.lr;
        if (wd >= 0)
            p.weight_decay = wd;
        st = !strcmp(k, "adam") ? dt_optim_adam_init(&p, &lay, 1, &t->opt) : dt_optim_adamw_init(&p, &lay, 1, &t->opt);
    } else {
        dt_lamb_params p = dt_lamb_params_default();
        p.lr = t->o.lr;
        if (wd >= 0)
            p.weight_decay = wd;
        st = dt_optim_lamb_init(&p, &lay, 1, &t->opt);
    }
    if (st < 0)
        return fail(2, "--optimizer");
    /* the schedule counts optimizer steps: with --grad-accum N one per N
     * batches, plus one for an epoch's last, partial accumulation */
    int64_t nb = dt_loader_num_batches(t->train_loader), accum = t->o.grad_accum > 0 ? t->o.grad_accum : 1;
    int64_t spe = (nb + accum - 1) / accum;
    t->sched = dt_sched_params_default();
    if (dt_sched_kind_parse(t->o.lr_schedule, &t->sched.kind) < 0)
        return fail(2, "--lr-schedule");
    t->sched.base_lr = t->o.lr;
    t->sched.step_size = t->o.step_size > 0 ? t->o.step_size : spe;
    t->sched.gamma = t->o.gamma;
    t->sched.warmup_steps = t->o.warmup;
    t->sched.total_steps = spe * t->o.epochs;
    t->sched.min_lr = 0;
    return 0;
}

/* The learning rate of optimizer step s (0-based). Cosine has its own
 * warm-up; for constant and step schedules --warmup ramps linearly the same
 * way (base * s / warmup). */
static double lr_at(const trainer *t, int64_t s)
{
    double lr = dt_sched_lr(&t->sched, s);
    if (t->sched.kind != DT_SCHED_COSINE && t->o.warmup > 0 && s < t->o.warmup)
        lr *= (double)s / (double)t->o.warmup;
    return lr;
}

static dt_tensor *batch_input(trainer *t, const dt_batch *b, dt_tensor **y)
{
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, t->in_shape, sizeof shape);
    shape[0] = b->size;
    dt_tensor *x = dt_tensor_view_of(t->ctx, b->x, DT_F32, t->in_ndim, shape);
    *y = dt_tensor_view_of(t->ctx, b->y, DT_I64, 1, (int64_t[]){b->size});
    return x;
}

/* Mean test loss and accuracy (fraction; NAN when not a classifier). */
static int evaluate(trainer *t, double *loss_out, double *acc_out)
{
    dt_model_train(t->model, false);
    bool was = dt_ag_set_enabled(t->ctx, false);
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    int rc = 0;
    if (dt__ddp_sync_buffers(&t->ddp) < 0) { /* DDP: evaluate rank 0's running statistics */
        rc = fail(1, "evaluation");
        goto out;
    }
    if (dt_loader_start_epoch(t->test_loader, 0) < 0) {
        rc = fail(1, "test data");
        goto out;
    }
    const dt_batch *b;
    dt_status st;
    while ((st = dt_loader_next(t->test_loader, &b)) == DT_OK && b) {
        dt_tensor *y, *x = batch_input(t, b, &y);
        dt_tensor *out = dt_model_forward(t->ctx, t->model, x);
        dt_tensor *loss = dt_model_desc_loss(t->ctx, &t->desc, out, y);
        if (!loss) {
            rc = fail(1, "evaluation");
            goto out;
        }
        loss_sum += (double)dt_tensor_item(loss) * (double)b->size;
        if (t->classifier) {
            dt_tensor *c = dt_contiguous(t->ctx, out);
            if (!c) {
                rc = fail(1, "evaluation");
                goto out;
            }
            const float *lg = c->data;
            int64_t C = c->shape[c->ndim - 1];
            const int64_t *lab = b->y;
            for (int64_t i = 0; i < b->size; i++) {
                int64_t best = 0;
                for (int64_t j = 1; j < C; j++)
                    if (lg[i * C + j] > lg[i * C + best])
                        best = j;
                correct += best == lab[i];
            }
        }
        seen += b->size;
        dt_ctx_reset(t->ctx);
    }
    if (st < 0) {
        rc = fail(1, "test data");
        goto out;
    }
    {   /* DDP: sum the ranks' shares */
        double sums[3] = {loss_sum, (double)correct, (double)seen};
        if (dt__ddp_sum(&t->ddp, sums, 3) < 0) {
            rc = fail(1, "evaluation");
            goto out;
        }
        loss_sum = sums[0], correct = (int64_t)sums[1], seen = (int64_t)sums[2];
    }
    *loss_out = seen ? loss_sum / (double)seen : NAN;
    *acc_out = t->classifier && seen ? (double)correct / (double)seen : NAN;
out:
    dt_ctx_reset(t->ctx);
    dt_ag_set_enabled(t->ctx, was);
    dt_model_train(t->model, true);
    return rc;
}

static int eval_and_record(trainer *t, int64_t epoch, double *tl, double *ta)
{
    int rc = evaluate(t, tl, ta);
    if (rc)
        return rc;
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
        return fail(1, NULL);
    return 0;
}

static double window_mean(const trainer *t)
{
    int64_t n = t->nloss < LOSS_WINDOW ? t->nloss : LOSS_WINDOW;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += t->loss_window[i];
    return n ? s / (double)n : NAN;
}

static int train_epoch(trainer *t, int64_t epoch, double *wall_s, double *sps_out)
{
    int64_t nb = dt_loader_num_batches(t->train_loader), samples = 0, step = 0;
    int64_t log_samples = 0;
    double log_loss = 0, epoch_loss = 0;
    int64_t log_n = 0;
    const dt_flat *G = dt_model_flat(t->model, DT_FLAT_GRADS, DT_F32);
    dt__progress_epoch_begin(&t->prog, epoch, nb);
    bool stop_agreed = false; /* DDP: some rank got a signal */
    double t0 = dt_time_s();
    if (dt_loader_start_epoch(t->train_loader, epoch) < 0)
        return fail(1, "training data");
    const dt_batch *b;
    dt_status st;
    while ((st = dt_loader_next(t->train_loader, &b)) == DT_OK && b) {
        if (g_stop && (t->ddp.world == 1 || stop_agreed)) /* DDP: ranks agree on stopping (below) */
            break;
        double lr = lr_at(t, t->opt_step);
        dt_optim_set_lr(t->opt, lr);
        /* DDP / --grad-accum: zero at the start of an accumulation, no_sync
         * until its last micro-batch, loss scaled by 1/accum */
        if (t->ddp.micro == 0)
            dt_model_zero_grad(t->model);
        bool do_step = dt__ddp_begin_micro(&t->ddp, step + 1 == nb);
        dt_tensor *y, *x = batch_input(t, b, &y);
        dt_tensor *loss = dt_model_desc_loss(t->ctx, &t->desc, dt__ddp_forward(&t->ddp, t->ctx, t->model, x), y);
        dt_tensor *bl = loss && t->ddp.accum > 1 ? dt_scale(t->ctx, loss, dt__ddp_loss_scale(&t->ddp)) : loss;
        if (!bl || dt_backward(t->ctx, bl) < 0 || (do_step && dt__ddp_sync(&t->ddp) < 0)) {
            dt__progress_clear(&t->prog);
            return fail(1, "training step");
        }
        double l = dt_tensor_item(loss);
        if (t->ddp.world > 1) {
            /* DDP: the loss shown is the mean over ranks; a signal on any
             * rank stops every rank after the same step (a dead peer makes
             * this or an earlier collective fail, naming it) */
            double v[2] = {l, g_stop ? 1.0 : 0.0};
            if (dt__ddp_sum(&t->ddp, v, 2) < 0) {
                dt__progress_clear(&t->prog);
                return fail(1, "training step");
            }
            l = v[0] / t->ddp.world;
            stop_agreed = v[1] > 0;
            if (stop_agreed && !g_stop)
                g_stop = SIGTERM;
        }
        if (!isfinite(l)) {
            dt__progress_clear(&t->prog);
            fprintf(stderr, "dtrain train: the loss is %g at step %lld: training diverged (try a "
                            "smaller --lr or --clip-grad-norm)\n", l, (long long)t->global_step + 1);
            return 1;
        }
        /* Only the gradient buffer of the model itself is clipped. */
        if (do_step && t->o.clip_grad_norm > 0)
            dt_clip_grad_norm(G->base, G->total, (float)t->o.clip_grad_norm, NULL);
        if (do_step && dt_optim_step(t->opt) < 0) {
            dt__progress_clear(&t->prog);
            return fail(1, "optimizer step");
        }
        if (do_step)
            t->opt_step++;
        dt_ctx_reset(t->ctx);
        step++;
        t->global_step++;
        samples += b->size * t->ddp.world; /* DDP: every rank ran a batch of this size */
        t->loss_window[t->nloss++ % LOSS_WINDOW] = l;
        log_loss += l;
        log_n++;
        log_samples += b->size;
        epoch_loss += l;
        dt__progress_step(&t->prog, step, window_mean(t), lr, samples);
        if (step % t->o.log_every == 0 || step == nb) {
            double el = dt_time_s() - t0;
            if (dt__metrics_write(&t->metrics,
                                  "\"event\":\"step\",\"epoch\":%lld,\"step\":%lld,\"epoch_step\":%lld,"
                                  "\"loss\":%.6f,\"lr\":%.6g,\"samples_per_s\":%.1f",
                                  (long long)epoch + 1, (long long)t->global_step, (long long)step,
                                  log_loss / (double)log_n, lr, el > 0 ? (double)samples / el : 0) < 0)
                return fail(1, NULL);
            log_loss = 0;
            log_n = 0;
            log_samples = 0;
        }
        if (t->o.eval_every > 0 && t->global_step % t->o.eval_every == 0 && step != nb) {
            /* Evaluation time is not training time: keep it out of the clock. */
            double e0 = dt_time_s(), tl, ta;
            dt__progress_clear(&t->prog);
            int rc = eval_and_record(t, epoch, &tl, &ta);
            if (rc)
                return rc;
            if (t->prog.mode != DT__PROGRESS_NONE) {
                if (isnan(ta))
                    printf("step %lld: test loss %.4f\n", (long long)t->global_step, tl);
                else
                    printf("step %lld: test loss %.4f, test accuracy %.2f%%\n",
                           (long long)t->global_step, tl, 100 * ta);
            }
            t0 += dt_time_s() - e0;
            dt__progress_exclude(&t->prog, dt_time_s() - e0);
        }
    }
    (void)log_samples;
    if (st < 0) {
        dt__progress_clear(&t->prog);
        return fail(st == DT_ERR_FORMAT || st == DT_ERR_IO ? 2 : 1, "training data");
    }
    if (g_stop) {
        dt__progress_clear(&t->prog);
        fprintf(stderr, "dtrain train: interrupted by signal %d at step %lld\n", (int)g_stop,
                (long long)t->global_step);
        return 130;
    }
    *wall_s = dt_time_s() - t0;
    *sps_out = *wall_s > 0 ? (double)samples / *wall_s : 0;
    dt__progress_epoch_end(&t->prog, step, window_mean(t), *wall_s, *sps_out);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"epoch\",\"epoch\":%lld,\"step\":%lld,\"wall_s\":%.4f,"
                          "\"samples_per_s\":%.1f,\"train_loss\":%.6f,\"train_loss_last100\":%.6f",
                          (long long)epoch + 1, (long long)t->global_step, *wall_s, *sps_out,
                          step ? epoch_loss / (double)step : NAN, window_mean(t)) < 0)
        return fail(1, NULL);
    return 0;
}

static void cleanup(trainer *t)
{
    dt_loader_free(t->train_loader);
    dt_loader_free(t->test_loader);
    dt_sampler_free(t->train_sampler);
    dt_sampler_free(t->test_sampler);
    dt_dataset_free(t->train);
    dt_dataset_free(t->test_shard);
    dt_dataset_free(t->test);
    dt_dataset_free(t->base_train);
    dt_dataset_free(t->base_test);
    dt_optim_free(t->opt);
    free(t->segs);
    dt__ddp_free_ddp(&t->ddp);
    dt_model_free(t->model);
    dt_ctx_free(t->ctx);
    dt__ddp_free_group(&t->ddp);
}

int dt_cmd_train(int argc, char **argv)
{
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        fprintf(stderr, "dtrain train: out of memory\n");
        return 1;
    }
    int rc = dt__train_parse(argc, argv, &t->o);
    if (rc) {
        free(t);
        return rc == 1 ? 0 : rc;
    }
    if (t->o.threads > 0)
        dt_set_num_threads((int)t->o.threads);
    if ((rc = dt__ddp_setup(&t->ddp, t->o.sync_bn, t->o.bucket_mb, t->o.grad_accum)))
        goto out;
    if ((rc = setup_model(t)) || (rc = dt__ddp_wrap(&t->ddp, t->model)) || (rc = setup_data(t)) ||
        (rc = setup_optimizer(t)))
        goto out;
    if (dt_ctx_init(NULL, &t->ctx) < 0) {
        rc = fail(1, "context");
        goto out;
    }
    if (t->o.metrics && dt__ddp_is_main(&t->ddp)) { /* DDP: rank 0 writes */
        if (dt__metrics_open(&t->metrics, t->o.metrics) < 0) {
            rc = fail(2, NULL);
            goto out;
        }
        t->metrics_open = true;
    }
    int64_t ntrain = dt_dataset_length(t->train), ntest = dt_dataset_length(t->test);
    int64_t spe = dt_loader_num_batches(t->train_loader);
    char data_q[1200];
    dt__json_quote(t->o.data, data_q, sizeof data_q);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"start\",\"model\":\"%s\",\"data\":%s,\"epochs\":%lld,"
                          "\"batch\":%lld,\"world_size\":%d,\"optimizer\":\"%s\",\"lr\":%g,"
                          "\"seed\":%llu,\"rng\":\"%s\",\"threads\":%d,\"train_items\":%lld,"
                          "\"test_items\":%lld,\"steps_per_epoch\":%lld,\"params\":%zu",
                          t->o.model, data_q, (long long)t->o.epochs, (long long)t->o.batch,
                          t->ddp.world, t->o.optimizer, t->o.lr, (unsigned long long)t->o.seed, t->o.rng,
                          dt_get_num_threads(), (long long)ntrain, (long long)ntest, (long long)spe,
                          dt_model_param_count(t->model)) < 0) {
        rc = fail(1, NULL);
        goto out;
    }
    dt__progress_init(&t->prog, dt__ddp_is_main(&t->ddp) ? t->o.progress : "none", stdout, t->o.epochs,
                      t->o.log_every);
    if (t->prog.mode != DT__PROGRESS_NONE)
        printf("training %s (%zu parameters) on %s: %lld items, %lld steps/epoch of %lld, %s lr %g, "
               "%d threads\n", t->o.model, dt_model_param_count(t->model), t->o.data,
               (long long)ntrain, (long long)spe, (long long)t->o.batch, t->o.optimizer, t->o.lr,
               dt_get_num_threads());
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.world > 1)
        printf("data parallel: %d ranks, batch %lld per rank (%lld per step)%s\n", t->ddp.world,
               (long long)t->o.batch, (long long)t->o.batch * t->ddp.world,
               t->ddp.nconverted ? ", SyncBatchNorm" : "");
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    double wall = 0, sps = 0, tl = NAN, ta = NAN, wall_sum = 0;
    for (int64_t e = 0; e < t->o.epochs; e++) {
        if ((rc = train_epoch(t, e, &wall, &sps)))
            goto out;
        wall_sum += wall;
        if (!t->o.no_eval && (rc = eval_and_record(t, e, &tl, &ta)))
            goto out;
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    /* The final figures, one per line, stable for scripts (demo.sh greps them). DDP: rank 0. */
    if (dt__ddp_is_main(&t->ddp)) {
        if (!t->o.no_eval) {
            printf("test loss: %.4f\n", tl);
            if (!isnan(ta))
                printf("test accuracy: %.2f%% (%lld items)\n", 100 * ta, (long long)ntest);
        }
        printf("train loss (last %d steps): %.4f\n", LOSS_WINDOW, window_mean(t));
        printf("epoch wall time: %.2f s (last epoch; data loading included, evaluation excluded)\n", wall);
        printf("samples/s: %.0f\n", sps);
        if (t->o.epochs > 1)
            printf("total training time: %.2f s over %lld epochs\n", wall_sum, (long long)t->o.epochs);
        char ddp_line[400];
        dt__ddp_summary(&t->ddp, t->global_step, ddp_line, sizeof ddp_line);
        if (ddp_line[0])
            printf("%s\n", ddp_line);
    }
    fflush(stdout);
    rc = 0;
out:
    /* the end record says how the run ended; only "ok" publishes FILE */
    if (t->metrics_open &&
        dt__metrics_close(&t->metrics, rc == 0 ? "ok" : rc == 130 ? "interrupted" : "failed",
                          t->global_step, rc) < 0 && rc == 0)
        rc = fail(1, NULL);
    cleanup(t);
    free(t);
    return rc;
}
