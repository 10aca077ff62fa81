/* The loader-driven helpers in the style of ggml-opt's epoch/fit: an epoch
 * of steps with a callback after each, several epochs, and a sharded
 * evaluation whose sums are combined over the replicas.
 *
 * An epoch groups the loader's batches into steps of grad_accum
 * micro-batches; the epoch's last batch always ends a step (a shorter
 * accumulation), so no gradient carries over into the next epoch. Under a
 * parallel strategy every rank's loader must yield the same number of
 * batches (the distributed sampler pads the epoch so that it does). */
#include "train/train_impl.h"

#include <math.h>
#include <string.h>

static dt_trainer_batch from_loader(const dt_batch *b, const dt_dataset_info *info)
{
    dt_trainer_batch tb;
    memset(&tb, 0, sizeof tb);
    tb.x = b->x;
    tb.x_dtype = info->x_dtype;
    tb.x_ndim = info->x_ndim + 1;
    tb.x_shape[0] = b->size;
    for (int d = 0; d < info->x_ndim && d + 1 < DT_MAX_DIMS; d++)
        tb.x_shape[d + 1] = info->x_shape[d];
    tb.y = b->y;
    tb.y_dtype = info->y_dtype;
    tb.y_ndim = info->y_ndim + 1;
    tb.y_shape[0] = b->size;
    for (int d = 0; d < info->y_ndim && d + 1 < DT_MAX_DIMS; d++)
        tb.y_shape[d + 1] = info->y_shape[d];
    return tb;
}

dt_status dt_trainer_epoch(dt_trainer *tr, dt_loader *ld, const dt_dataset_info *info, int64_t epoch,
                           dt_trainer_callback cb, void *ud, dt_trainer_epoch_result *out)
{
    if (!tr || !ld || !info)
        return dt_error(DT_ERR_NULL, "dt_trainer_epoch: %s is NULL", !tr ? "trainer" : !ld ? "loader" : "info");
    if (info->x_ndim + 1 > DT_MAX_DIMS || info->y_ndim + 1 > DT_MAX_DIMS)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_epoch: items of %d/%d dims (at most %d)", info->x_ndim,
                        info->y_ndim, DT_MAX_DIMS - 1);
    dt_trainer_epoch_result res;
    memset(&res, 0, sizeof res);
    const int64_t nb = dt_loader_num_batches(ld), accum = dt__trainer_grad_accum(tr);
    double loss_sum = 0;
    /* a loaded checkpoint: its epoch continues where it was saved */
    dt__trainer_pos *pos = dt__trainer_position(tr);
    int64_t first = 0;
    if (pos->resume) {
        if (epoch < pos->epoch)
            return dt_error(DT_ERR_STATE,
                            "dt_trainer_epoch: epoch %lld asked, but the loaded checkpoint is at epoch %lld batch "
                            "%lld (start the epoch loop there: dt_trainer_get_position)",
                            (long long)epoch, (long long)pos->epoch, (long long)pos->batch);
        if (epoch == pos->epoch) {
            if (pos->order_kept && pos->saved_batches == nb) {
                first = pos->batch < nb ? pos->batch : nb;
            } else {
                /* another world size or batch size: the same fraction of the epoch */
                first = pos->saved_batches > 0 ? (int64_t)((double)pos->batch * (double)nb / (double)pos->saved_batches)
                                               : 0;
                first = first < nb ? first : nb;
                if (pos->order_kept)
                    dt_log(DT_LOG_WARN,
                           "resume: the checkpoint's epoch had %lld batches, this one has %lld: the data order is "
                           "not kept (epoch %lld continues at batch %lld)",
                           (long long)pos->saved_batches, (long long)nb, (long long)epoch + 1, (long long)first);
            }
        }
        pos->resume = false;
    }
    dt_status st = dt_loader_start_epoch_at(ld, epoch, first);
    if (st < 0)
        return st;
    pos->epoch = epoch;
    pos->batch = first;
    pos->epoch_batches = nb;
    int64_t micro = 0;
    const dt_batch *b;
    for (;;) {
        if (micro == 0)
            dt_trace_step(dt_trainer_steps(tr) + 1);
        const double td = dt_trace_now();
        if ((st = dt_loader_next(ld, &b)) != DT_OK || !b)
            break;
        dt_trace_span(DT_TRACE_DATA, "data", td);
        const bool sync = ++micro >= accum || first + res.batches + 1 == nb;
        dt_trainer_batch tb = from_loader(b, info);
        if ((st = dt__trainer_micro(tr, &tb, sync)) < 0)
            break;
        res.batches++;
        if (!sync)
            continue;
        micro = 0;
        dt_trainer_metrics m;
        if ((st = dt__trainer_finish(tr, &m)) < 0)
            break;
        res.steps++;
        res.samples += m.samples;
        /* the position after this step, before the callback (which may save it) */
        pos->batch = first + res.batches;
        pos->batches += m.nmicro; /* (its samples: dt__trainer_finish counts every step's) */
        if (pos->batch >= nb) {
            pos->epoch = epoch + 1;
            pos->batch = 0;
        }
        for (int i = 0; i < m.nmicro; i++)
            loss_sum += m.micro_loss[i];
        if (cb && (st = cb(ud, tr, &m)) < 0)
            break;
        if (m.stop || dt__trainer_stop_now(tr)) {
            res.stopped = true;
            break;
        }
    }
    res.loss = res.batches ? loss_sum / (double)res.batches : NAN;
    if (out)
        *out = res;
    return st < 0 ? st : DT_OK;
}

dt_status dt_trainer_fit(dt_trainer *tr, dt_loader *ld, const dt_dataset_info *info, int64_t epochs,
                         dt_trainer_callback cb, void *ud, dt_trainer_epoch_result *out)
{
    dt_trainer_epoch_result r;
    memset(&r, 0, sizeof r);
    if (!tr)
        return dt_error(DT_ERR_NULL, "dt_trainer_fit: trainer is NULL");
    dt_status st = DT_OK;
    const dt__trainer_pos *pos = dt__trainer_position(tr);
    for (int64_t e = pos->resume ? pos->epoch : 0; e < epochs && st >= 0 && !r.stopped; e++)
        st = dt_trainer_epoch(tr, ld, info, e, cb, ud, &r);
    if (out)
        *out = r;
    return st;
}

dt_status dt_trainer_evaluate(dt_trainer *tr, dt_loader *ld, const dt_dataset_info *info,
                              dt_trainer_eval_result *out)
{
    if (!tr || !ld || !info || !out)
        return dt_error(DT_ERR_NULL, "dt_trainer_evaluate: NULL argument");
    dt_model *m = dt_trainer_model(tr);
    dt_ctx *ctx = dt_trainer_ctx(tr);
    dt_model_train(m, false);
    bool was = dt_ag_set_enabled(ctx, false);
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    bool scored = info->y_ndim == 0 && (info->y_dtype == DT_I64 || info->y_dtype == DT_I32);
    /* the strategy's forward (pipeline stages: the batch runs through them,
     * each rank with its own stages' parameters; the last stage's sums go
     * to its pipeline: eval_share) */
    dt_strategy *s = dt_trainer_strategy(tr);
    bool shared = false;
    dt_status st = dt__trainer_sync_buffers(tr); /* DDP: evaluate rank 0's running statistics */
    if (st < 0)
        goto out;
    if ((st = dt_loader_start_epoch(ld, 0)) < 0)
        goto out;
    const dt_batch *b;
    while ((st = dt_loader_next(ld, &b)) == DT_OK && b) {
        dt_trainer_batch tb = from_loader(b, info);
        dt_tensor *x = dt_tensor_view_of(ctx, tb.x, tb.x_dtype, tb.x_ndim, tb.x_shape);
        dt_tensor *y = dt_tensor_view_of(ctx, tb.y, tb.y_dtype, tb.y_ndim, tb.y_shape);
        /* the plain forward (evaluation is local, no strategy bookkeeping),
         * or through the pipeline's stages */
        dt_tensor *o = NULL;
        if ((st = dt__strategy_eval_forward(s, ctx, x, &o)) < 0) {
            shared = true; /* it told the other ranks already (a pipeline's) */
            goto out;
        } else if (!o) { /* not the last stage: it gets the sums at the end */
            dt_ctx_reset(ctx);
            continue;
        }
        dt_tensor *loss = o ? dt__trainer_loss(tr, o, y) : NULL;
        if (!loss) {
            st = dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL;
            goto out;
        }
        loss_sum += (double)dt_tensor_item(loss) * (double)b->size;
        if (scored && o->ndim == 2) {
            dt_tensor *c = dt_contiguous(ctx, o);
            if (!c) {
                st = dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL;
                goto out;
            }
            /* logits of any float dtype (a bf16/f16 model's output) */
            const int64_t C = c->shape[1];
            for (int64_t i = 0; i < b->size; i++) {
                int64_t best = 0;
                for (int64_t j = 1; j < C; j++)
                    if (dt_dtype_load(c->dtype, c->data, (size_t)(i * C + j)) >
                        dt_dtype_load(c->dtype, c->data, (size_t)(i * C + best)))
                        best = j;
                const int64_t lab =
                    info->y_dtype == DT_I64 ? ((const int64_t *)b->y)[i] : ((const int32_t *)b->y)[i];
                correct += best == lab;
            }
        } else {
            scored = false;
        }
        seen += b->size;
        dt_ctx_reset(ctx);
    }
    if (st < 0)
        goto out;
    double sums[4] = {loss_sum, (double)correct, (double)seen, scored ? 0.0 : 1.0};
    shared = true; /* from here on the pipeline's ranks fail or succeed together */
    if ((st = dt__strategy_eval_share(s, sums, 4, DT_OK)) < 0)
        goto out;
    if ((st = dt_trainer_allreduce_sum(tr, sums, 4)) < 0)
        goto out;
    out->loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    out->accuracy = sums[3] == 0 && sums[2] > 0 ? sums[1] / sums[2] : NAN;
    out->items = (int64_t)sums[2];
    if (dt__trainer_params(tr)->monitor &&
        (st = dt_monitor_write(dt__trainer_params(tr)->monitor, "Train/Samples/eval_loss", out->loss,
                               dt__trainer_position(tr)->samples)) < 0)
        goto out;
out:
    if (st < 0 && !shared)
        st = dt__strategy_eval_share(s, NULL, 0, st);
    dt_ctx_reset(ctx);
    dt_ag_set_enabled(ctx, was);
    dt_model_train(m, true);
    return st;
}
