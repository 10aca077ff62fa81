/* The planner's cost model and its search (plan.h, dt_plan_predict and
 * dt_plan_search).
 *
 * Memory of the busiest rank:
 *   baseline (measured) + model state (dt_mem_model_states over the rank's
 *   parameters) + ZeRO-2/3's gathered units + the strategies' buffers
 *   beyond the formula (measured on GPT-2; plan.h's buffer_bytes) +
 *   activations. A pipeline stage holds L/pp blocks and, at either end,
 *   the embeddings (the head is tied to them, so the last stage holds them
 *   too); the first stage keeps up to pp micro-batches in flight under
 *   1F1B, the last one only one, but holds the logits.
 *
 * Time of a step: the compute of each rank (core-seconds per token from
 * the calibration times its tokens, the blocks split over tp (but their
 * layer norms and residuals whole on each tp rank) and pp, the head on the
 * last stage; ZeRO-2/3's gradient pages faulted in again each pass,
 * ZeRO-2's at the huge-page rate, ZeRO-3's at the 4 KiB one as measured),
 * stretched by the pipeline's bubble (m + pp - 1) / m, over the cores it
 * gets: ranks share the machine's cores, so the step is at least the whole
 * machine's work over all cores and at least the slowest rank's critical
 * path over its own threads. Collectives add their ring volume over the
 * bus bandwidth plus a latency per call (DDP and ZeRO-1: one reduction per
 * step; ZeRO-2/3 a collective per unit per pass, ZeRO-3 its all-gathers
 * (forward, and backward but the root unit) and reduce-scatters at the
 * measured curve of each kind; tensor parallelism four all-reduces of the
 * activations per block and four more per micro-batch, or with sequence
 * parallelism four all-gathers and four reduce-scatters per block at their
 * curves (the norms and residual adds then split over tp too, and the
 * norms' inputs kept on a rank's positions); context parallelism's ring
 * steps or Ulysses' all-to-alls per block; the pipeline a send
 * and a receive per micro-batch per boundary), slowed like compute when
 * ranks outnumber cores (the shared-memory transport copies with the same
 * CPUs). The optimizer steps the rank's shard (AdamW timed on written
 * gradients), and the trainer scans the same gradients for non-finite
 * values once a step. LoRA: only the adapters train (state, gradients,
 * reductions, optimizer), the frozen model is kept whole in the parameter
 * dtype on each rank's slice, and LoRA's own measured activations and
 * compute ratio replace the calibration's. NVMe offload adds the
 * state's traffic at a fixed 1 GB/s (not measured). */
#include "dtrain/plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_plan_search_params dt_plan_search_params_default(void)
{
    dt_plan_search_params p;
    memset(&p, 0, sizeof p);
    p.world = 1;
    p.max_grad_accum = 8;
    p.optimizer = DT_OPTIM_ADAMW;
    return p;
}

const char *dt_plan_layout_str(const dt_plan_layout *l, char *buf, size_t n)
{
    if (!buf || !n)
        return "";
    if (!l) {
        snprintf(buf, n, "(none)");
        return buf;
    }
    char mb[48];
    if (l->pp > 1)
        snprintf(mb, sizeof mb, "mb%lldx%d", (long long)(l->batch / (l->micro_batches ? l->micro_batches : 1)),
                 l->micro_batches);
    else
        snprintf(mb, sizeof mb, "b%lld", (long long)l->batch);
    char cpx[24] = ""; /* context parallelism, only where there is some */
    if (l->cp > 1)
        snprintf(cpx, sizeof cpx, " cp%d%s", l->cp, l->cp_impl == DT_CP_ULYSSES ? " ulysses" : "");
    snprintf(buf, n, "dp%d%s tp%d%s pp%d zero%d%s %s ga%d%s%s", l->dp, cpx, l->tp, l->sp ? " sp" : "", l->pp,
             l->zero_stage, l->hybrid ? " hybrid" : "", mb, l->grad_accum, l->act_ckpt ? " ckpt" : "",
             l->offload ? " offload" : "");
    return buf;
}

static void infeasible(dt_plan_prediction *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void infeasible(dt_plan_prediction *o, const char *fmt, ...)
{
    if (!o->feasible)
        return; /* the first reason stands */
    o->feasible = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->reason, sizeof o->reason, fmt, ap);
    va_end(ap);
}

static double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

/* ZeRO-3's whole units alive at once on a rank (pb bytes a parameter; root: the root unit's parameters,
 * the embeddings and the rest, or the whole model as one unit; block: a block unit's, 0 without them).
 * The root unit stays gathered from its forward to the end of backward, and its whole gradients (the
 * tied head's, written first in backward) live until its reduce-scatter at the end. In backward, at a
 * block unit: the unit being computed (parameters and gradients), the one prefetched for the next
 * (parameters: backward_pre prefetches one, and limit_all_gathers allows two gathers in flight), the
 * unit before it whose gradients wait for their reduce-scatter, and the page pool's released
 * parameter pages not yet gathered again (up to two units' once the pool has warmed: the pool keeps
 * two of the largest units' pages, and a unit released goes there before the prefetch takes pages
 * back): 2 roots + 6 blocks, the upper end of what the ranks' timing gives (measured on this machine's
 * shared memory: GPT-2 124M 8 ranks 823 and 879 MiB in two runs). One unit: its parameters and
 * gradients. */
static double zero3_gathered(double pb, double root, double block)
{
    return pb * (2 * root + 6 * block);
}

/* ZeRO-3's collectives of one forward + backward pass, seconds, at the measured curve (plan.h: ag_* and
 * rs_*; a calibration without them: the all-reduce's): in forward each unit's parameters all-gathered
 * (numel: all of them), in backward each block unit's again (numel_blocks; the root unit stays gathered
 * from its forward to the end of backward, so one unit alone is gathered once), and each unit's whole
 * gradients reduce-scattered. A gather or a reduce-scatter moves (dp-1)/dp of the unit's bytes through a
 * rank (the bus bytes the curve is fitted on), plus the curve's latency per call. The run's copies into
 * and out of the transport's staging areas are part of the measured curve (the calibration's buffers
 * are plain memory, as the units' are); the gradient pages faulted in again each pass are compute
 * (fault_bw, above). */
static double zero3_pass_comm(const dt_plan_calib *c, int dp, double pb, double numel, double numel_blocks,
                              double units)
{
    const double share = (double)(dp - 1) / dp;
    const double bw0 = c->coll_bw > 0 ? c->coll_bw : 1e9, lat0 = c->coll_lat_s > 0 ? c->coll_lat_s : 20e-6;
    const double ag_bw = c->ag_bw > 0 ? c->ag_bw : bw0, ag_lat = c->ag_lat_s > 0 ? c->ag_lat_s : lat0;
    const double rs_bw = c->rs_bw > 0 ? c->rs_bw : bw0, rs_lat = c->rs_lat_s > 0 ? c->rs_lat_s : lat0;
    const double fwd = share * pb * numel / ag_bw + units * ag_lat;
    const double bwd = units > 1 ? share * pb * numel_blocks / ag_bw + (units - 1) * ag_lat : 0;
    const double rs = share * pb * numel / rs_bw + units * rs_lat;
    return fwd + bwd + rs;
}

/* The shared-memory transport's staging areas (DT_SHM_STAGING_KB, 8 MiB a rank by default) that a
 * ZeRO-3 rank touches: its collectives' buffers are plain memory (the units' mapped regions and the
 * shards), so every piece goes through the staging areas, and a rank reads each peer's (the pages count
 * in its resident set); two groups, the reduce-scatters' and the gathers' own. Measured: the 8-rank
 * ZeRO-3 of GPT-2 124M held 120 MiB more than the formula without it, 2 ranks 39 MiB. */
#define ZERO3_STAGING_BYTES (8.0 * 1024 * 1024)
static double zero3_staging(int dp, double unit_bytes)
{
    /* a model whose units are smaller than the staging touches only the pieces its messages fill */
    return 2.0 * dp * (unit_bytes < ZERO3_STAGING_BYTES ? unit_bytes : ZERO3_STAGING_BYTES);
}

dt_status dt_plan_predict(const dt_plan_search_params *p, const dt_plan_calib *c, const dt_plan_layout *l,
                          dt_plan_prediction *out)
{
    if (!p || !c || !l || !out)
        return dt_error(DT_ERR_NULL, "dt_plan_predict: NULL argument");
    if (p->world < 1 || c->n_layer < 1 || c->seq < 1)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_predict: world %d, calibration of %lld layers at seq %lld",
                        p->world, (long long)c->n_layer, (long long)c->seq);
    const dt_plan_lora *lr = &p->lora;
    if (!(lr->block >= 0) || !(lr->fixed >= 0) || !(lr->act_block >= 0) || !(lr->act_fixed >= 0) ||
        (lr->block > 0 && !(lr->fb_ratio > 0)))
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_predict: LoRA's adapters %g per block and %g outside them, "
                        "activations %g and %g bytes a token, compute ratio %g (>= 0; the ratio > 0)", lr->block,
                        lr->fixed, lr->act_block, lr->act_fixed, lr->fb_ratio);
    memset(out, 0, sizeof *out);
    out->layout = *l;
    out->feasible = true;
    const int dp = l->dp > 0 ? l->dp : 1, tp = l->tp > 0 ? l->tp : 1, pp = l->pp > 0 ? l->pp : 1;
    const int cp = l->cp > 1 ? l->cp : 1, red = dp * cp; /* the gradients reduce over dp x cp ranks */
    const bool uly = cp > 1 && l->cp_impl == DT_CP_ULYSSES, sp = l->sp && tp > 1;
    const int m = pp > 1 && l->micro_batches > 0 ? l->micro_batches : 1, ga = l->grad_accum > 0 ? l->grad_accum : 1;
    const int world = p->world, local = p->ranks_per_machine > 0 ? p->ranks_per_machine : world;
    const double cores = p->cores > 0 ? p->cores : (c->cores > 0 ? c->cores : 1);
    const double L = (double)c->n_layer, T = (double)c->seq, Tr = T / cp; /* a rank's positions of a sample */

    /* rules of the layout itself (plan.h's) */
    if (cp == 1 && dp * tp * pp != world)
        infeasible(out, "dp %d x tp %d x pp %d is %d, not the world %d", dp, tp, pp, dp * tp * pp, world);
    if (cp > 1 && dp * cp * tp * pp != world)
        infeasible(out, "dp %d x cp %d x tp %d x pp %d is %d, not the world %d", dp, cp, tp, pp, dp * cp * tp * pp,
                   world);
    if (cp > 1 && (unsigned)l->cp_impl >= DT_CP_IMPL_COUNT)
        infeasible(out, "context-parallel attention %d is not ring or Ulysses", (int)l->cp_impl);
    if (cp > 1 && !uly && c->seq % (2 * cp))
        infeasible(out, "the sequence of %lld does not split into the 2 x cp %d chunks of the causal load balance",
                   (long long)c->seq, cp);
    if (uly && c->seq % cp)
        infeasible(out, "the sequence of %lld does not split over cp %d (Ulysses)", (long long)c->seq, cp);
    if (uly && c->n_head % tp == 0 && (c->n_head / tp) % cp) /* (tp not dividing them: its own rule below) */
        infeasible(out, "Ulysses: the %lld heads of a tp rank do not divide over cp %d", (long long)c->n_head / tp,
                   cp);
    if (l->sp && tp == 1)
        infeasible(out, "sequence parallelism needs tp > 1");
    if (sp && (c->seq % cp || (c->seq / cp) % tp))
        infeasible(out, "the %lld positions of a rank do not split over tp %d (sequence parallelism)",
                   (long long)(c->seq / cp), tp);
    if (c->n_head % tp)
        infeasible(out, "tp %d does not divide the %lld heads", tp, (long long)c->n_head);
    if (c->n_kv_head > 0 && c->n_kv_head % tp)
        infeasible(out, "tp %d does not divide the %lld key/value heads", tp, (long long)c->n_kv_head);
    if (pp > c->n_layer)
        infeasible(out, "pp %d exceeds the %lld blocks", pp, (long long)c->n_layer);
    if ((tp > 1 || pp > 1) && l->zero_stage > 1)
        infeasible(out, "ZeRO-%d does not combine with tensor or pipeline parallelism (0 or 1)", l->zero_stage);
    if (l->zero_stage < 0 || l->zero_stage > 3)
        infeasible(out, "ZeRO stage %d (0..3)", l->zero_stage);
    if (l->hybrid && l->zero_stage != 3)
        infeasible(out, "hybrid sharding is a ZeRO-3 (FSDP HYBRID_SHARD) layout");
    if (l->hybrid && local >= world)
        infeasible(out, "hybrid sharding on one machine is full sharding (listed without hybrid)");
    if (l->offload && (l->zero_stage < 1 || tp > 1 || pp > 1))
        infeasible(out, "optimizer offload needs ZeRO 1-3 without tp or pp");
    if (l->offload && cp > 1)
        infeasible(out, "optimizer offload does not combine with context parallelism");
    if (l->offload && !p->offload_dir)
        infeasible(out, "optimizer offload needs an NVMe directory (--offload nvme:DIR)");
    if (pp > 1 && (m < 1 || l->batch % m))
        infeasible(out, "batch %lld does not split into %d micro-batches", (long long)l->batch, m);
    if (l->batch < 1)
        infeasible(out, "batch %lld per rank", (long long)l->batch);
    if (p->global_batch > 0 && (int64_t)dp * l->batch * ga != p->global_batch)
        infeasible(out, "dp %d x batch %lld x grad-accum %d is not the global batch %lld", dp, (long long)l->batch, ga,
                   (long long)p->global_batch);

    /* ---- memory of the busiest rank ---- */
    const int shard_dp = l->hybrid ? (local < red ? local : red) : red; /* ranks a ZeRO state is sharded over */
    /* stages balanced by compute: the head's cost sits on the last stage, so the others take more
       blocks; the first holds the most parameters (its blocks, the embeddings with their optimizer
       state), the last keeps the logits */
    double blocks_rank = L, blocks_last = L;
    if (pp > 1) {
        /* the pipe strategy balances by the models' unit costs (dt_model_pipe_units: a block about its
           weights, the head its V x C GEMM), not by measured times, so the split is predicted from the
           same figures (times measured on a busy machine moved it by a block: 15% of a stage's memory) */
        const double bc = c->numel_block > 0 ? c->numel_block : 1, head = (double)c->vocab * (double)c->n_embd;
        blocks_rank = ceil((L * bc + head) / pp / bc);
        if (blocks_rank > L - (pp - 1))
            blocks_rank = L - (pp - 1);
        if (blocks_rank < ceil(L / pp))
            blocks_rank = ceil(L / pp);
        blocks_last = L - (pp - 1) * blocks_rank;
        if (blocks_last < 1)
            blocks_last = 1;
    }
    /* the parameters that train (LoRA: the adapters, whole on each tp rank; the model's own frozen: kept in the
       parameter dtype on their tp slice and stage, never sharded, no gradients or optimizer state) */
    const bool lora = lr->block > 0;
    const double nb = lora ? lr->block : c->numel_block, nf = lora ? lr->fixed : c->numel_fixed;
    const double numel_rank = (blocks_rank * nb + nf) / (lora ? 1 : tp);
    const double frozen_rank = lora ? (blocks_rank * c->numel_block + c->numel_fixed) / tp : 0;
    dt_mem_policy mp = {.numel = (size_t)numel_rank,
                        .world = shard_dp,
                        .zero_stage = l->zero_stage,
                        .optimizer = p->optimizer,
                        .sgd_momentum = p->sgd_momentum,
                        .param_bytes = c->dtype == DT_BF16 ? 2 : 4,
                        .master_weights = c->dtype == DT_BF16,
                        .offload = l->offload ? DT_OFFLOAD_NVME : DT_OFFLOAD_NONE,
                        .offload_buffer_bytes = l->offload ? (size_t)64 << 20 : 0};
    dt_mem_estimate e;
    dt_status st = dt_mem_model_states(&mp, &e);
    if (st < 0)
        return st;
    const double pb = mp.param_bytes;
    out->state_bytes = e.total + (c->dtype == DT_BF16 ? 4.0 * e.master / 4.0 : 0) /* bf16: f32 gradient copies */
                       + pb * frozen_rank;
    double zero3_largest = 0; /* ZeRO-3's largest unit, parameters */
    if (l->zero_stage >= 2 && shard_dp > 1) {
        /* units: blocks grouped until they reach wrap_min_params; the embeddings (and the rest) one more */
        double per_unit = l->wrap_min_params > 0 ? ceil((double)l->wrap_min_params / nb) : L;
        if (per_unit > L)
            per_unit = L;
        double largest = per_unit * nb;
        if (l->wrap_min_params <= 0)
            largest = numel_rank; /* one unit: the whole model */
        else if (nf > largest)
            largest = nf;
        /* ZeRO-2: the whole gradients of two units (one being reduced, one being written; at most the
           model's), less the rank's shard, which lives in them and the state counts (measured, one unit:
           ZeRO-2 2035 MiB against ZeRO-1's 2030); ZeRO-3: zero3_gathered */
        zero3_largest = largest;
        if (l->zero_stage == 3)
            out->gathered_bytes = zero3_gathered(pb, l->wrap_min_params > 0 ? nf / tp : numel_rank,
                                                 l->wrap_min_params > 0 ? per_unit * nb / tp : 0);
        else
            out->gathered_bytes = pb * (2 * largest < numel_rank ? 2 * largest : numel_rank) * (1 - 1.0 / shard_dp);
    }
    const double mb = (double)l->batch / m; /* samples per micro-batch */
    /* tensor parallelism leaves a block's activations whole on every rank (the layer norms, residuals
       and all-reduced outputs are full width; measured: a 2-way split kept 95% of them); the
       vocabulary-parallel head splits the logits */
    /* sequence parallelism keeps the norms' inputs (the residual stream, f32) on the rank's T/(cp tp) positions:
       a block's two and the final norm's (measured, llama-100m at 1024 tokens on tp 2: 37 MiB less, as this
       predicts; GPT-2 124M 66 MiB less). A checkpointed block keeps only its input, which is one of them */
    const double sp_norm = sp ? 4.0 * (double)c->n_embd * (1.0 - 1.0 / tp) : 0;
    /* and its column-parallel products keep only the rank's rows of their input, gathering them again for the
       weights' gradients (tp.h: dt_tp_sp_gather_products): two gathered rows of the norms' f32 outputs a token
       fewer (measured at 1024 tokens on tp 2: llama-100m 70 MiB less, GPT-2 124M 68) */
    const double sp_gathered = sp && lr->block <= 0 ? 2.0 * 4.0 * (double)c->n_embd : 0; /* LoRA's A reads them */
    /* and the row-parallel layers' sums (attention's output projection, the MLP's down projection) are formed in
       their partial products' memory or give it back (tp.h: dt_tp_reduce_partial, _sp_reduce_scatter_partial):
       two rows of the activations' dtype a token fewer than that (measured at 1024 tokens on tp 2: llama-100m
       and GPT-2 124M 76 MiB less than with a copy beside each product, with and without sequence parallelism) */
    const double tp_rows = tp > 1 ? 2.0 * (c->dtype == DT_BF16 ? 2 : 4) * (double)c->n_embd : 0;
    const double act_block = lora ? lr->act_block : c->act_block, act_fixed = lora ? lr->act_fixed : c->act_fixed;
    const double blk_live = act_block - 2 * sp_norm - tp_rows - sp_gathered; /* a block that keeps its activations */
    const double blk = fmax(l->act_ckpt ? c->act_block_ckpt - sp_norm : blk_live, 0);
    const double one_blk = l->act_ckpt ? fmax(blk_live, 0) : 0; /* the block being recomputed */
    double act_first = mb * Tr * (pp > 1 ? (double)(pp < m ? pp : m) : 1.0) * blocks_rank * blk;
    /* the vocabulary-parallel loss reads the rank's logits where they are: one f32 row of V/tp a token less than
       the fixed part split over tp (which matched llama-100m's runs while the loss copied them; measured at 1024
       tokens on tp 2: llama-100m 66 MiB less without the copy, GPT-2 124M 102 MiB) */
    const double vce_copy = tp > 1 ? 4.0 * (double)((c->vocab + tp - 1) / tp) : 0;
    double act_last = mb * Tr * (blocks_last * blk + fmax(act_fixed / tp - sp_norm - vce_copy, 0));
    if (pp == 1)
        act_first = 0;
    double act = (act_first > act_last ? act_first : act_last) + mb * Tr * one_blk;
    out->act_bytes = act;
    out->base_bytes = c->base_rss;
    /* What dtrain's strategies hold beyond the state (measured on GPT-2 124M, 2 ranks; see plan.h):
       DDP reads the peers' shared gradient buffers (their pages count in this rank's resident set);
       ZeRO-1 and -2 read the peers' pages of the units' whole parameters and gradients (the model's
       own flats are handed back once the units hold everything: measured ZeRO-1 2033 MiB, ZeRO-2
       2038, against DDP's 2276; ZeRO-2's whole gradient buffers are all alive at backward's end) */
    const double whole_p = pb * numel_rank, whole_g = pb * numel_rank, peers = (double)(red - 1) / red;
    if (pp > 1) /* the pipe strategy reduces the stages' gradients through its own buffers (measured:
                   dp 2 x pp 2 within 1% without the term) */
        out->buffer_bytes = 0;
    else if (red > 1 && l->zero_stage == 0)
        out->buffer_bytes = peers * e.grads;
    else if (red > 1 && (l->zero_stage == 1 || l->zero_stage == 2))
        out->buffer_bytes = peers * (whole_p + whole_g);
    else if (shard_dp > 1 && l->zero_stage == 3)
        out->buffer_bytes = zero3_staging(shard_dp, pb * zero3_largest);
    out->mem_bytes = out->base_bytes + out->state_bytes + out->gathered_bytes + out->buffer_bytes + out->act_bytes;
    if (p->mem_per_rank > 0 && out->mem_bytes > (double)p->mem_per_rank)
        infeasible(out, "needs %.2f GiB per rank (state %.2f, activations %.2f), over --mem-per-rank %.2f GiB",
                   gib(out->mem_bytes), gib(out->state_bytes + out->gathered_bytes), gib(out->act_bytes),
                   gib((double)p->mem_per_rank));

    /* ---- time of one step ---- */
    const double per_rank_cores = local <= cores ? cores / local : 1.0; /* threads of one rank */
    const double samples_replica = (double)l->batch * ga;             /* per optimizer step */
    const double passes = (double)m * ga; /* forward + backward passes of a replica per step */
    /* a pass costs its tokens and a fixed part (kernels' fork/join, the autograd's bookkeeping:
       calibrated as pass_*); recomputation runs the block's forward twice (4/3 of the pass) */
    const double fb_blk = l->act_ckpt ? c->fb_block_ckpt_s : c->fb_block_s;
    const double pass_blk = c->pass_block_s * (l->act_ckpt ? 4.0 / 3 : 1.0), pass_fix = c->pass_fixed_s;
    const double tok_blk = fb_blk - pass_blk / T > 0 ? fb_blk - pass_blk / T : 0;
    const double tok_fix = c->fb_fixed_s - pass_fix / T > 0 ? c->fb_fixed_s - pass_fix / T : 0;
    /* tensor parallelism splits a block's GEMMs and attention over its ranks but runs the layer norms and
       residual additions whole on each (calibrated: repl_block_s). A pass's fixed cost (pass_*: what a
       pass costs beyond its tokens) is mostly the weights' and gradients' bytes the GEMMs stream once a
       pass (GPT-2 124M: 6.5 ms a block, ~7M parameters read forward and backward and their gradients
       written), which the split divides like the weights (measured on an idle machine: 2- and 4-way tp
       of GPT-2 124M take the same step, 410 and 414 ms; charged whole on each rank they were predicted
       +19% and +55%); the vocabulary-parallel embedding, head and loss split their tokens' cost */
    const double tok_rep = c->repl_block_s < tok_blk ? c->repl_block_s : tok_blk;
    /* a tp rank's share of a block (sequence parallelism splits the norms and residual adds too) */
    const double tok_blk_rank = (tok_blk - tok_rep) / tp + (sp ? tok_rep / tp : tok_rep);
    /* context parallelism: a rank's rows (Tr of each sample) at the cost per token measured over the whole
       sequence (each row still attends to every earlier position: the balance gives each rank its share) */
    const double lscale = lora ? lr->fb_ratio : 1.0; /* LoRA: the frozen layers' weight gradients not computed */
    const double replica_blocks = samples_replica * Tr * L * tok_blk_rank * lscale; /* one tp (and cp) rank's, / pp */
    const double replica_fixed = samples_replica * Tr * tok_fix / tp * lscale;
    const double replica_pass = passes * (L * pass_blk + pass_fix) / tp * lscale;
    /* a rank's threads (cores / ranks) cost more core-seconds than one does (calibrated at 1 and at
       c->threads threads, interpolated) */
    const double thr = per_rank_cores > 1 ? per_rank_cores : 1;
    const double tcost = c->thread_cost > 1 && c->threads > 1
                             ? 1 + (c->thread_cost - 1) * (thr - 1) / (double)(c->threads - 1 > 0 ? c->threads - 1 : 1)
                             : 1;
    /* ZeRO-2/3 hand each unit's whole (f32) gradients back to the system once its reduce-scatter is
       done (MADV_DONTNEED): every pass faults those pages in again (a read fault maps the huge zero page,
       the write a fresh 2 MiB page: measured, two faults and one 2 MiB allocation per 2 MiB of gradients,
       and nothing else faults, ZeRO-3's gathered parameters moving through its page pool). The regions
       are advised MADV_HUGEPAGE: ZeRO-2's re-faults cost what the calibration's huge-page region does
       (fault_huge_bw; the 4 KiB figure where the machine gave no huge pages). ZeRO-3's same bytes cost
       about the 4 KiB figure (fault_bw): measured by perf on this machine (a 2-core VM), the kernel's
       page clearing per step against AdamW's known cost, 2.8 GB/s for GPT-2 124M and 3.3 for gpt2-large
       on 2 ranks, against about 15 for ZeRO-2's; without the page pool, 1.5-2x the bytes at a lower cost
       each. The cause is not pinned down: free pages that sit unused for ~2 s go back to this VM's host
       (free page reporting; a probe re-faults them at 0.5-1 GB/s, against 25-35 at once), and the pool
       changes which pages are free for how long */
    double fresh = 0;
    if (red > 1 && l->zero_stage >= 2)
        fresh = 4.0 * numel_rank;
    const double bw4k = c->fault_bw > 0 ? c->fault_bw : 4e9;
    const double fault_rate = l->zero_stage == 2 && c->fault_huge_bw > 0 ? c->fault_huge_bw : bw4k;
    const double fault_work = passes * fresh / fault_rate;
    double stage_work = tcost * (replica_blocks + replica_fixed + replica_pass) / pp + fault_work;
    const double head_work = tcost * (replica_fixed + passes * pass_fix / tp * lscale);
    if (pp > 1 && head_work > stage_work) /* but the head is one unit: the last stage has it whole */
        stage_work = head_work;
    const double critical = stage_work * (pp > 1 ? (double)(m + pp - 1) / m : 1.0); /* bubble (pp-1)/(m+pp-1) */
    const double opt_params = numel_rank / (l->zero_stage >= 1 ? shard_dp : 1);
    /* p and g read, p written, each state read and written: Adam's 7 (the calibration's unit) */
    const double streams = 3 + 2 * dt_optim_kind_num_states(p->optimizer, p->sgd_momentum);
    /* the trainer's non-finite scan reads the gradients the rank steps once a step (no loss scaler in a
       planned run: it always runs) */
    const double opt_work = opt_params * (c->optim_s * streams / 7 + c->nonfinite_s);
    const double machine_work = tcost * (double)dp * cp * tp * (replica_blocks + replica_fixed + replica_pass) +
                                (double)local * (opt_work + fault_work);
    const double t_compute_rank = critical / per_rank_cores, t_machine = machine_work / cores;
    const double t_opt = opt_work / per_rank_cores;
    double t_cmp = t_compute_rank + t_opt;
    if (t_machine > t_cmp)
        t_cmp = t_machine;
    out->compute_s = stage_work / per_rank_cores;
    out->bubble_s = (critical - stage_work) / per_rank_cores;
    out->optim_s = t_opt;
    if (t_machine > t_compute_rank + t_opt) /* cores are the bottleneck: the bubble is filled by others */
        out->compute_s = t_machine - t_opt, out->bubble_s = 0;

    /* collectives: bytes through the ring per rank, and calls */
    const double bw = c->coll_bw > 0 ? c->coll_bw : 1e9, lat = c->coll_lat_s > 0 ? c->coll_lat_s : 20e-6;
    double vol = 0, calls = 0, t_zero3 = 0;
    const double grad_bytes = numel_rank * pb;
    if (red > 1) {
        double ring = 2.0 * (red - 1) / red * grad_bytes;
        /* ZeRO-2/3's units as the run wraps them (wrap_min_params: blocks grouped until they reach it;
           the embeddings and the rest the root unit) */
        double per_unit = l->wrap_min_params > 0 ? ceil((double)l->wrap_min_params / nb) : blocks_rank;
        if (per_unit < 1)
            per_unit = 1;
        const double units = ceil(blocks_rank / per_unit) + (l->wrap_min_params > 0 ? 1 : 0);
        if (l->zero_stage <= 1)
            vol += ring, calls += 1 + blocks_rank / 4; /* buckets */
        else if (l->zero_stage == 2) /* a reduce-scatter per unit per pass; the updated shards gathered once */
            vol += ring / 2 * (ga + 1), calls += ga * units + 1;
        else
            t_zero3 = ga * zero3_pass_comm(c, red, pb, numel_rank, units > 1 ? blocks_rank * nb / tp : 0,
                                           units);
    }
    const double act_mb = mb * Tr * (double)c->n_embd * 4.0;
    const double ag_bw = c->ag_bw > 0 ? c->ag_bw : bw, ag_lat = c->ag_lat_s > 0 ? c->ag_lat_s : lat;
    const double rs_bw = c->rs_bw > 0 ? c->rs_bw : bw, rs_lat = c->rs_lat_s > 0 ? c->rs_lat_s : lat;
    double t_curves = 0; /* collectives timed at their own kind's curve */
    if (tp > 1 && !sp) { /* per pass: two all-reduces per block forward (attention's and the MLP's outputs), two
                            backward (their inputs' gradients), the vocabulary-parallel embedding's one and the
                            loss's two (max, then sum) forward, the head input's one backward */
        vol += 4.0 * blocks_rank * 2.0 * (tp - 1) / tp * act_mb * m * ga;
        calls += (4.0 * blocks_rank + 4) * m * ga;
    } else if (sp) { /* per pass and block: entering attention and the MLP an all-gather of the rows, leaving
                        them a reduce-scatter, backward the other way round (the same bytes as the all-reduces)
                        and the rows gathered again for the column-parallel weights' gradients (two more);
                        the final norm's rows gathered for the head (a reduce-scatter backward), the embedding's
                        and the loss's three all-reduces as without */
        const double share = (double)(tp - 1) / tp * act_mb, n_rs = 4.0 * blocks_rank + 1;
        const double n_ag = n_rs + (p->lora.block > 0 ? 0 : 2.0 * blocks_rank); /* LoRA keeps the gathered rows */
        t_curves += (n_ag * (share / ag_bw + ag_lat) + n_rs * (share / rs_bw + rs_lat)) * m * ga;
        calls += 3.0 * m * ga;
    }
    if (pp > 1) {
        vol += 2.0 * act_mb * m * ga;
        calls += 2.0 * m * ga;
    }
    if (cp > 1 && !uly) { /* the ring, per block and pass (in f32, the rank's heads): cp - 1 steps pass a chunk's
                             keys and values forward (again when recomputed), cp - 1 its keys, values and their
                             gradients backward and one more the gradients home; and the loss's all-reduce */
        const double kv = 2.0 * act_mb / tp, fwd = (cp - 1) * kv * (l->act_ckpt ? 2 : 1);
        vol += blocks_rank * (fwd + 2.0 * (cp - 1) * kv + kv) * m * ga;
        calls += (blocks_rank * ((cp - 1) * (l->act_ckpt ? 3.0 : 2.0) + 1) + 1) * m * ga;
    } else if (uly) { /* Ulysses, per block and pass (f32, the rank's rows of its tp heads): all-to-alls of q, k, v
                         (3 rows' widths) and of the output (1) forward, again when recomputed; of q, k, v, the
                         output and its gradient and back of q, k, v's gradients (8) backward; the softmax
                         statistics' too (a call each, their bytes negligible). (cp - 1)/cp of each leaves a
                         rank, at the all-gather's curve; each buffer is packed and unpacked by copies (rows of
                         a head group), at the memcpy bandwidth; and the loss's all-reduce */
        const double fw = l->act_ckpt ? 2.0 : 1.0, width = act_mb / tp, units = 4.0 * fw + 8.0;
        const double a2a = blocks_rank * ((cp - 1.0) / cp * units * width / ag_bw + (3.0 * fw + 5.0) * ag_lat);
        const double packing = blocks_rank * 2.0 * units * width / (c->copy_bw > 0 ? c->copy_bw : 8e9);
        t_curves += (a2a + packing) * m * ga;
        calls += 1.0 * m * ga;
    }
    double t_comm = vol / bw + calls * lat + t_zero3 + t_curves;
    if (local > cores)
        t_comm *= local / cores;
    if (l->offload)
        t_comm += 2.0 * 12.0 * opt_params / 1e9;
    out->comm_s = t_comm;
    out->step_s = t_cmp + t_comm;
    return DT_OK;
}

/* ---- the search ---- */

typedef struct {
    dt_plan_prediction *v;
    int n, cap;
} rows;

static dt_status push(rows *r, const dt_plan_search_params *p, const dt_plan_calib *c, const dt_plan_layout *l)
{
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 256;
        dt_plan_prediction *v = dt_alloc(sizeof *v * (size_t)cap);
        if (!v)
            return dt_error(DT_ERR_NO_MEMORY, "dt_plan_search: %d layouts", cap);
        if (r->n)
            memcpy(v, r->v, sizeof *v * (size_t)r->n);
        dt_free(r->v);
        r->v = v, r->cap = cap;
    }
    return dt_plan_predict(p, c, l, &r->v[r->n++]);
}

static int cmp_rows(const void *a, const void *b)
{
    const dt_plan_prediction *x = a, *y = b;
    if (x->feasible != y->feasible)
        return x->feasible ? -1 : 1;
    double kx = x->feasible ? x->step_s : x->mem_bytes, ky = y->feasible ? y->step_s : y->mem_bytes;
    if (kx != ky)
        return kx < ky ? -1 : 1;
    /* equal times: fewer forwards per step (each has costs the model leaves out), then less memory */
    const int fx = x->layout.grad_accum * x->layout.micro_batches, fy = y->layout.grad_accum * y->layout.micro_batches;
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->mem_bytes != y->mem_bytes)
        return x->mem_bytes < y->mem_bytes ? -1 : 1;
    char bx[128], by[128]; /* a total order: every rank sorts alike */
    return strcmp(dt_plan_layout_str(&x->layout, bx, sizeof bx), dt_plan_layout_str(&y->layout, by, sizeof by));
}

/* How much machinery a layout adds to plain DDP: model parallelism most (sequence parallelism and Ulysses one more
   than tp and ring alone), then sharding, recomputation, accumulation, offload. Among layouts predicted within
   DT_PLAN_SIMPLER_WITHIN (plan.h) of the fastest the simplest ranks first (as DeepSpeed's autotuner prefers the
   lower ZeRO stage at equal throughput): a few % is within the model's error, and every added part brings costs the
   model leaves out. */
static int complexity(const dt_plan_layout *l)
{
    int ga = 0;
    for (int g = l->grad_accum; g > 1; g >>= 1)
        ga++;
    return 4 * (l->tp > 1) + (l->tp > 1 && l->sp) + 4 * (l->pp > 1) + 4 * (l->cp > 1) +
           (l->cp > 1 && l->cp_impl == DT_CP_ULYSSES) + l->zero_stage + 2 * l->act_ckpt + ga + 3 * l->offload +
           l->hybrid;
}

static int cmp_simple(const void *a, const void *b)
{
    const dt_plan_prediction *x = a, *y = b;
    const int cx = complexity(&x->layout), cy = complexity(&y->layout);
    if (cx != cy)
        return cx < cy ? -1 : 1;
    return cmp_rows(a, b);
}

dt_status dt_plan_search(const dt_plan_search_params *p, const dt_plan_calib *c, dt_plan_prediction **out, int *n)
{
    if (!p || !c || !out || !n)
        return dt_error(DT_ERR_NULL, "dt_plan_search: NULL argument");
    *out = NULL, *n = 0;
    if (p->world < 1 || p->world > 4096)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_search: world %d (1..4096)", p->world);
    if (p->global_batch < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_search: global batch %lld", (long long)p->global_batch);
    dt_plan_search_params q = *p;
    if (q.global_batch == 0)
        q.global_batch = 2 * (int64_t)q.world;
    const int maxga = q.max_grad_accum > 0 ? q.max_grad_accum : 1;
    rows r = {0};
    dt_status st = DT_OK;
    /* cp: the degrees that divide the world, ring attention where the sequence splits into 2 cp chunks, Ulysses
       where it splits into cp and cp divides a tp rank's heads; sequence parallelism with tp > 1 where tp divides a
       cp rank's positions (the others' rows would only repeat the rule) */
    for (int cpi = 0; cpi < 2 * q.world && st >= 0; cpi++) {
        const int cp = cpi / 2 + 1;
        const dt_cp_impl impl = cpi % 2 ? DT_CP_ULYSSES : DT_CP_RING;
        if (q.world % cp || (cp == 1 && impl != DT_CP_RING))
            continue;
        if (cp > 1 && (impl == DT_CP_RING ? c->seq % (2 * cp) : c->seq % cp))
            continue;
        for (int tpi = 0; tpi < 2 * q.world && st >= 0; tpi++) {
            const int tp = tpi / 2 + 1;
            const bool seqp = tpi % 2;
            if (tp * cp > q.world || (q.world / cp) % tp || (seqp && (tp == 1 || (c->seq / cp) % tp)))
                continue;
            if (impl == DT_CP_ULYSSES && (c->n_head % tp || (c->n_head / tp) % cp))
                continue;
            for (int pp = 1; pp * tp * cp <= q.world && st >= 0; pp++) {
                if ((q.world / cp / tp) % pp)
                    continue;
                const int dp = q.world / cp / tp / pp;
                const int64_t per_replica = q.global_batch / dp;
                for (int zero = 0; zero <= 3 && st >= 0; zero++) {
                    for (int hy = 0; hy <= (zero == 3) && st >= 0; hy++) {
                        for (int ck = 0; ck <= 1 && st >= 0; ck++) {
                            for (int off = 0; off <= (zero >= 1) && st >= 0; off++) {
                                dt_plan_layout l = {.dp = dp, .cp = cp, .cp_impl = impl, .tp = tp, .sp = seqp,
                                                    .pp = pp, .zero_stage = zero,
                                                    .hybrid = hy, .act_ckpt = ck, .offload = off,
                                                    .micro_batches = 1, .grad_accum = 1,
                                                    .wrap_min_params = zero >= 2 ? (int64_t)c->numel_block : 0};
                                if (q.global_batch % dp) { /* the batch does not split over the replicas */
                                    l.batch = per_replica > 0 ? per_replica : 1;
                                    st = push(&r, &q, c, &l);
                                    continue;
                                }
                                if (pp > 1) { /* micro-batches pp, 2 pp, 4 pp (or what divides the batch) */
                                    int tried = 0;
                                    for (int mm = pp; mm <= 4 * pp && st >= 0; mm *= 2) {
                                        if (per_replica % mm)
                                            continue;
                                        l.batch = per_replica, l.micro_batches = mm;
                                        st = push(&r, &q, c, &l);
                                        tried++;
                                    }
                                    if (!tried && st >= 0) { /* the reason names the split */
                                        l.batch = per_replica, l.micro_batches = pp;
                                        st = push(&r, &q, c, &l);
                                    }
                                    continue;
                                }
                                for (int ga = 1; ga <= maxga && st >= 0; ga *= 2) {
                                    if (per_replica % ga)
                                        continue;
                                    l.batch = per_replica / ga, l.grad_accum = ga;
                                    st = push(&r, &q, c, &l);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if (st < 0) {
        dt_free(r.v);
        return st;
    }
    qsort(r.v, (size_t)r.n, sizeof *r.v, cmp_rows);
    int near = 0; /* the feasible rows within DT_PLAN_SIMPLER_WITHIN of the fastest: simplest first */
    while (near < r.n && r.v[near].feasible && r.v[near].step_s <= r.v[0].step_s * (1 + DT_PLAN_SIMPLER_WITHIN))
        near++;
    if (near > 1)
        qsort(r.v, (size_t)near, sizeof *r.v, cmp_simple);
    *out = r.v, *n = r.n;
    return DT_OK;
}
