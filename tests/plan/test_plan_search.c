/* The planner's search and cost model (plan.h, dt_plan_search and
 * dt_plan_predict) on a fixed calibration (no measuring: the numbers are
 * the test's), so the counts, the order and the reasons are exact:
 *   - the enumeration of a GPT-2-shaped model on 4 ranks, global batch 8:
 *     1116 layouts (dp x cp x tp x pp combinations, ring and Ulysses, tp
 *     with and without sequence parallelism x ZeRO/hybrid/offload x
 *     checkpointing x batch splits), the feasible first, fastest first;
 *     every infeasible one with a reason and every feasible one without;
 *   - context parallelism: a rank's activations and compute are those of
 *     T / cp positions, the ring's volume per block and pass, its rules by
 *     name, and the search's choice where one sample's activations do
 *     not fit a rank; Ulysses' all-to-alls and rules; sequence parallelism
 *     against tp alone (activations, compute, its collectives at their
 *     curves, rules);
 *   - reasons by name: ZeRO-2 with tp, tp not dividing the heads, hybrid on
 *     one machine, offload without a directory, a batch that does not split;
 *   - the memory model: DDP's state is 16 bytes per parameter (AdamW, f32)
 *     plus 3/4 of the gradients (the peers' shared pages), ZeRO-3 over 4
 *     ranks a quarter of the state; a --mem-per-rank between the two
 *     refuses DDP by the limit's name and keeps ZeRO-3;
 *   - checkpointing trades activations for compute; a pipeline's bubble is
 *     (pp - 1) / m of its compute;
 *   - a calibration survives dt_plan_calib_save/load, and load refuses a
 *     file measured for another model (DT_ERR_NOT_FOUND) and a damaged one
 *     (DT_ERR_FORMAT), a value out of range named (not cast), and takes an
 *     older version's file as absent (measure again);
 *   - the ranking: among the layouts within 5% of the fastest the simplest
 *     comes first (DDP over tensor parallelism), the rest by time;
 *   - a pass's fixed cost is paid per accumulated forward, a rank with more
 *     threads pays the calibrated thread cost;
 *   - Llama: dt_plan_calibrate measures llama-tiny (its key/value heads
 *     bound tp), an hf:DIR Llama gets an id from its shape;
 *   - ZeRO-3's collectives at the measured curve (all-gathers and
 *     reduce-scatters each at its own kind's bandwidth and latency, the
 *     block units gathered again in backward), and its memory: the units
 *     alive at once (2 roots + 6 blocks) and the transport's staging
 *     pages (2 groups x 8 MiB x ranks, less for units smaller than that);
 *     a version-3 calibration file (no curve) is measured again;
 *   - ZeRO-2's gradient re-faults at the huge-page figure, ZeRO-3's at the
 *     4 KiB one, ZeRO-1 none; the non-finite scan charged per parameter a
 *     rank steps; a calibration holds both fault figures and the scan's;
 *   - LoRA: the frozen model in the parameter dtype and unsharded, the
 *     adapters' state, gradients and reductions, LoRA's measured
 *     activations and compute ratio (dt_plan_lora_measure's counts exact);
 *   - "dtrain": {"plan": "auto"} in a config (dt_plan_config_auto,
 *     dt_plan_from_config): accepted alone, refused by name beside a
 *     layout key, "auto" values allowed. */
#include "test.h"

#include "dtrain/plan.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dt_plan_calib calib(void)
{
    dt_plan_calib c;
    memset(&c, 0, sizeof c);
    snprintf(c.model, sizeof c.model, "gpt2");
    c.seq = 64, c.dtype = DT_F32, c.threads = 2, c.cores = 2;
    c.n_layer = 12, c.n_head = 12, c.n_kv_head = 12, c.n_embd = 768, c.vocab = 50257;
    c.numel_block = 7087872, c.numel_fixed = 39385344;
    c.fb_block_s = 1e-3, c.fb_fixed_s = 2.5e-3, c.fb_block_ckpt_s = 1.4e-3;
    c.act_block = 120000, c.act_fixed = 630000, c.act_block_ckpt = 6200;
    c.optim_s = 2e-9, c.matmul_flops = 1e11, c.copy_bw = 8e9, c.coll_bw = 4e9, c.coll_lat_s = 20e-6;
    c.base_rss = 100e6, c.fault_bw = 1e12, c.fault_huge_bw = 1e12, c.thp = 1;
    c.ag_bw = 3e9, c.ag_lat_s = 60e-6, c.rs_bw = 2.5e9, c.rs_lat_s = 70e-6;
    return c;
}

static const dt_plan_prediction *find(const dt_plan_prediction *r, int n, int dp, int tp, int pp, int zero, bool hy,
                                      bool ck, bool off, int64_t batch, int ga)
{
    for (int i = 0; i < n; i++) {
        const dt_plan_layout *l = &r[i].layout;
        if (l->cp <= 1 && !l->sp && l->dp == dp && l->tp == tp && l->pp == pp && l->zero_stage == zero && l->hybrid == hy &&
            l->act_ckpt == ck && l->offload == off && l->batch == batch && l->grad_accum == ga)
            return &r[i];
    }
    return NULL;
}

TEST(enumeration_counts_and_order)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 4, sp.global_batch = 8;
    dt_plan_prediction *r = NULL;
    int n = 0;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    /* (tp, pp) in (1,1) (1,2) (1,4) (2,1) (2,2) (4,1); 18 sharding x checkpointing choices each; batch
       splits: dp4 ga 1,2; dp2 pp2 m 2,4; pp4 m 4,8; dp2 tp2 ga 1,2,4; tp2 pp2 m 2,4,8; tp4 ga 1,2,4,8; and
       context parallel (64 positions: 2 x cp chunks for cp 2 and 4): dp2 cp2 ga 1,2,4; cp2 tp2 ga 1,2,4,8;
       cp4 ga 1,2,4,8; cp2 pp2 m 2,4,8, each with ring attention and with Ulysses (12 heads, 6 a tp rank: cp 2 and
       4 divide them); sequence parallelism beside each tp > 1: dp2 tp2, tp2 pp2, tp4, and cp2 tp2 (ring and
       Ulysses) */
    ASSERT_EQ_INT(n, 18 * (2 + 2 + 2 + 3 + 3 + 4) + 2 * 18 * (3 + 4 + 4 + 3) + 18 * (3 + 3 + 4) + 2 * 18 * 4);
    int feasible = 0;
    for (int i = 0; i < n; i++) {
        ASSERT(r[i].feasible ? r[i].reason[0] == 0 : r[i].reason[0] != 0);
        if (r[i].feasible) {
            ASSERT_EQ_INT(i, feasible); /* the feasible ones first */
            feasible++;
            ASSERT(r[i].step_s > 0 && r[i].mem_bytes > 0);
            if (i && r[i - 1].step_s > r[i].step_s) /* only the simpler-first band breaks the time order */
                ASSERT(r[i].step_s <= r[0].step_s * 1.05 + 1e-12 || r[i - 1].step_s <= r[0].step_s * 1.05);
            const dt_plan_layout *l = &r[i].layout;
            ASSERT_EQ_INT(l->dp * (l->cp > 1 ? l->cp : 1) * l->tp * l->pp, 4);
            ASSERT_EQ_INT((int)(l->dp * l->batch * l->grad_accum), 8);
        }
    }
    ASSERT(feasible > 20 && feasible < n);
    dt_free(r);
}

/* Context parallelism (ring attention, the causal balance): a rank keeps T / cp positions of each sample, so
 * its activations and its compute per token are those of T / cp tokens (each row still attends to the whole
 * sequence: the per-token cost measured at T); the gradients reduce over dp x cp ranks; the ring passes a
 * chunk's keys and values (cp - 1 steps forward; keys, values and their gradients backward, one step more
 * home) per block and pass; with pp each cp rank runs its own pipeline; the sequence must split into 2 cp
 * chunks. Where a sample's
 * activations do not fit one rank and the global batch gives one replica, the search picks cp. */
TEST(context_parallel)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.cores = 2;
    const dt_plan_layout one = {.dp = 1, .tp = 1, .pp = 1, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_layout cp2 = one;
    cp2.cp = 2;
    dt_plan_prediction a, b;
    dt_plan_search_params s1 = sp;
    s1.world = 1, s1.cores = 1; /* a core a rank, as the 2 ranks of cp 2 on 2 cores */
    ASSERT_OK(dt_plan_predict(&s1, &c, &one, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &cp2, &b));
    ASSERT(a.feasible && b.feasible);
    ASSERT_NEAR(b.act_bytes, 2 * 32 * (12 * c.act_block + c.act_fixed), 1, 0);
    ASSERT_NEAR(b.act_bytes, a.act_bytes / 2, 1, 0);
    ASSERT_NEAR(b.state_bytes, a.state_bytes, 1, 0); /* replicas of the parameters */
    /* the ring's volume over the measured curve: 12 blocks x (1 forward + 3 backward) chunk transfers of k and
       v (2 x 2 x 32 x 768 f32), the gradients' all-reduce over the 2 ranks, and their calls */
    const double kv = 2.0 * 2 * 32 * 768 * 4, psi = 12 * c.numel_block + c.numel_fixed;
    const double vol = 12 * 4 * kv + 2.0 * 1 / 2 * 4 * psi, calls = 12 * 3 + 1 + 1 + 3;
    ASSERT_NEAR(b.comm_s, vol / c.coll_bw + calls * c.coll_lat_s, 0, 1e-9);
    ASSERT_NEAR(b.compute_s, a.compute_s / 2, 0, 1e-9); /* half the tokens on each rank (no pass cost here) */
    /* with pp: each cp rank's pipeline of T / cp positions (the first stage keeps its micro-batches in flight) */
    dt_plan_layout bad = {.dp = 1, .cp = 2, .tp = 1, .pp = 2, .batch = 2, .micro_batches = 2, .grad_accum = 1};
    s1.world = 4;
    ASSERT_OK(dt_plan_predict(&s1, &c, &bad, &a));
    ASSERT(a.feasible);
    /* 2 micro-batches of 1 in flight on stage 0, which holds 9 of the 12 blocks (the head's cost is the last's) */
    ASSERT_NEAR(a.act_bytes, 1 * 32 * 2 * 9 * c.act_block, 1, 0);
    /* rules by name */
    c.seq = 36; /* 2 x cp 4 = 8 chunks do not divide it */
    bad = (dt_plan_layout){.dp = 1, .cp = 4, .tp = 1, .pp = 1, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    ASSERT_OK(dt_plan_predict(&s1, &c, &bad, &a));
    ASSERT_STR_CONTAINS(a.reason, "does not split into the 2 x cp 4 chunks");
    bad.cp = 2; /* dp 1 x cp 2 on 4 ranks */
    ASSERT_OK(dt_plan_predict(&s1, &c, &bad, &a));
    ASSERT_STR_CONTAINS(a.reason, "dp 1 x cp 2 x tp 1 x pp 1 is 2, not the world 4");
    char buf[160];
    ASSERT_STR_EQ(dt_plan_layout_str(&cp2, buf, sizeof buf), "dp1 cp2 tp1 pp1 zero0 b2 ga1");
    /* one sample's activations over the limit of one rank: one replica (global batch 1), so the search picks
       cp 2 (tensor parallelism keeps a block's activations whole; checkpointing recomputes) */
    c = calib();
    c.act_block = 4e6, c.act_block_ckpt = 2e6;
    sp.global_batch = 1;
    dt_plan_layout tp2 = {.dp = 1, .tp = 2, .pp = 1, .batch = 1, .micro_batches = 1, .grad_accum = 1};
    cp2.batch = 1;
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp2, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &cp2, &b));
    sp.mem_per_rank = (size_t)((a.mem_bytes + b.mem_bytes) / 2);
    dt_plan_prediction *r = NULL;
    int n = 0;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    ASSERT(n > 0 && r[0].feasible);
    ASSERT_EQ_INT(r[0].layout.cp, 2);
    ASSERT(r[0].mem_bytes <= (double)sp.mem_per_rank);
    dt_free(r);
}

/* Sequence parallelism against tp alone: the norms' inputs (two a block, the final one) kept on T / tp positions
 * and the column products' gathered rows not kept, the norms and residual adds split over tp, six all-gathers (two
 * of them the rows gathered again for the weights' gradients) and four reduce-scatters a block (and the final
 * gather) at their own curves in place of the four all-reduces; its rules by name. Ulysses against the ring: its
 * all-to-alls (q, k, v and the output forward, 8 row widths backward, (cp - 1)/cp of each at the all-gather
 * curve) and their packing copies; T divisible by cp (not 2 cp) and a tp rank's heads by cp. */
TEST(sequence_parallel_and_ulysses)
{
    dt_plan_calib c = calib();
    c.repl_block_s = 4e-4;
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.cores = 2;
    const dt_plan_layout tp2 = {.dp = 1, .tp = 2, .pp = 1, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_layout sp2 = tp2;
    sp2.sp = true;
    dt_plan_prediction a, b;
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp2, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &sp2, &b));
    ASSERT(a.feasible && b.feasible);
    /* tp alone: a block's activations less the row-parallel sums' two partial products (formed in place), the
       fixed part split less the copy of the rank's logits the vocabulary-parallel loss no longer makes; in bf16
       the products are half as wide */
    const double vce = 4.0 * 25129; /* f32 logits of the rank's 50257 / 2 (rounded up) words */
    ASSERT_NEAR(a.act_bytes, 2 * 64 * (12 * (c.act_block - 2 * 4.0 * 768) + c.act_fixed / 2 - vce), 1, 0);
    c.dtype = DT_BF16;
    dt_plan_prediction h;
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp2, &h));
    ASSERT_NEAR(h.act_bytes, 2 * 64 * (12 * (c.act_block - 2 * 2.0 * 768) + c.act_fixed / 2 - vce), 1, 0);
    c.dtype = DT_F32;
    const double s = 4.0 * 768 * (1 - 1.0 / 2); /* a norm's input: the half of its f32 row a rank does not keep */
    const double g = 2 * 4.0 * 768; /* a block's two gathered f32 rows, gathered again in backward */
    ASSERT_NEAR(a.act_bytes - b.act_bytes, 2 * 64 * (12 * (2 * s + g) + s), 1, 0);
    const double act_mb = 2.0 * 64 * 768 * 4, share = act_mb / 2;
    ASSERT_NEAR(a.comm_s, 4 * 12 * 2 * share / c.coll_bw + (4 * 12 + 4) * c.coll_lat_s, 0, 1e-9);
    ASSERT_NEAR(b.comm_s,
                73 * (share / c.ag_bw + c.ag_lat_s) + 49 * (share / c.rs_bw + c.rs_lat_s) + 3 * c.coll_lat_s, 0, 1e-9);
    ASSERT(b.compute_s < a.compute_s); /* the norms and residual adds split */
    char buf[160];
    ASSERT_STR_EQ(dt_plan_layout_str(&sp2, buf, sizeof buf), "dp1 tp2 sp pp1 zero0 b2 ga1");
    dt_plan_layout bad = sp2;
    bad.tp = 1, bad.dp = 2;
    ASSERT_OK(dt_plan_predict(&sp, &c, &bad, &a));
    ASSERT_STR_CONTAINS(a.reason, "sequence parallelism needs tp > 1");
    /* with cp 2: a rank's 32 positions, 16 a tp rank between the blocks */
    dt_plan_layout cpsp = sp2, cptp = tp2;
    cpsp.cp = cptp.cp = 2;
    sp.world = 4;
    ASSERT_OK(dt_plan_predict(&sp, &c, &cptp, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &cpsp, &b));
    ASSERT(a.feasible && b.feasible);
    ASSERT_NEAR(a.act_bytes - b.act_bytes, 2 * 32 * (12 * (2 * s + g) + s), 1, 0);
    sp.world = 2;
    c.seq = 63;
    ASSERT_OK(dt_plan_predict(&sp, &c, &sp2, &a));
    ASSERT_STR_CONTAINS(a.reason, "the 63 positions of a rank do not split over tp 2 (sequence parallelism)");

    /* Ulysses */
    c = calib();
    const dt_plan_layout ring = {.dp = 1, .cp = 2, .tp = 1, .pp = 1, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_layout uly = ring;
    uly.cp_impl = DT_CP_ULYSSES;
    ASSERT_OK(dt_plan_predict(&sp, &c, &ring, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &uly, &b));
    ASSERT(a.feasible && b.feasible);
    ASSERT_NEAR(b.act_bytes, a.act_bytes, 1, 0);
    ASSERT_NEAR(b.compute_s, a.compute_s, 0, 1e-12);
    const double width = 2.0 * 32 * 768 * 4, psi = 12 * c.numel_block + c.numel_fixed;
    const double a2a = 12 * (0.5 * 12 * width / c.ag_bw + 8 * c.ag_lat_s) + 12 * 2 * 12 * width / c.copy_bw;
    ASSERT_NEAR(b.comm_s, 2.0 * 1 / 2 * 4 * psi / c.coll_bw + (1 + 1 + 3) * c.coll_lat_s + a2a, 0, 1e-9);
    ASSERT_STR_EQ(dt_plan_layout_str(&uly, buf, sizeof buf), "dp1 cp2 ulysses tp1 pp1 zero0 b2 ga1");
    /* 36 positions: not 2 x 4 ring chunks, but 4 Ulysses chunks */
    c.seq = 36;
    sp.world = 4;
    bad = uly, bad.cp = 4;
    ASSERT_OK(dt_plan_predict(&sp, &c, &bad, &a));
    ASSERT(a.feasible);
    bad.cp_impl = DT_CP_RING;
    ASSERT_OK(dt_plan_predict(&sp, &c, &bad, &a));
    ASSERT_STR_CONTAINS(a.reason, "does not split into the 2 x cp 4 chunks");
    c.seq = 34; /* nor over cp 4 */
    bad.cp_impl = DT_CP_ULYSSES;
    ASSERT_OK(dt_plan_predict(&sp, &c, &bad, &a));
    ASSERT_STR_CONTAINS(a.reason, "the sequence of 34 does not split over cp 4 (Ulysses)");
    c = calib();
    c.n_head = c.n_kv_head = 6; /* 3 a tp rank of 2: not over cp 2 */
    bad = uly, bad.tp = 2;
    ASSERT_OK(dt_plan_predict(&sp, &c, &bad, &a));
    ASSERT_STR_CONTAINS(a.reason, "Ulysses: the 3 heads of a tp rank do not divide over cp 2");
    /* the search lists both, and what it chooses it can run: no Ulysses row where the heads do not divide */
    sp.global_batch = 4;
    dt_plan_prediction *r = NULL;
    int n = 0, nsp = 0, nuly = 0;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    for (int i = 0; i < n; i++) {
        const dt_plan_layout *l = &r[i].layout;
        nsp += l->sp, nuly += l->cp > 1 && l->cp_impl == DT_CP_ULYSSES;
        ASSERT(!l->sp || (l->tp > 1 && c.seq / (l->cp > 1 ? l->cp : 1) % l->tp == 0));
        ASSERT(!(l->cp > 1 && l->cp_impl == DT_CP_ULYSSES) || (6 / l->tp) % l->cp == 0);
    }
    ASSERT(nsp > 0 && nuly > 0);
    dt_free(r);
}

/* LoRA: the model's parameters frozen (in the parameter dtype, on the rank's tp slice, never sharded), the
 * adapters training (their state, gradients and the reductions are theirs only), the activations measured for
 * LoRA, the compute scaled by the measured ratio; with sequence parallelism the gathered rows kept (LoRA's A reads
 * them); bad figures refused.
 * dt_plan_lora_measure on llama-tiny: q_proj's and v_proj's adapters (r 8: 8 x (64 + 64) and 8 x (64 + 32)). */
TEST(lora_frozen_and_measured)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 4, sp.cores = 4;
    const dt_plan_layout ddp = {.dp = 4, .tp = 1, .pp = 1, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_layout z3 = ddp;
    z3.zero_stage = 3;
    dt_plan_prediction full, a, b;
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &full));
    sp.lora = (dt_plan_lora){.block = 1000, .fixed = 0, .act_block = 2 * c.act_block, .act_fixed = c.act_fixed,
                             .fb_ratio = 0.7};
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &b));
    ASSERT(a.feasible && b.feasible);
    const double psi = 12 * c.numel_block + c.numel_fixed, ad = 12 * 1000;
    ASSERT_NEAR(a.state_bytes, 16 * ad + 4 * psi, 64, 0);             /* the adapters' AdamW state, the frozen */
    ASSERT_NEAR(b.state_bytes, 16 * ad / 4 + 4 * psi, 64, 0);         /* ZeRO-3 shards only the adapters' */
    ASSERT_NEAR(a.buffer_bytes, 0.75 * 4 * ad, 64, 0);                /* the peers' adapter gradient pages */
    ASSERT_NEAR(a.act_bytes, 2 * 64 * (12 * 2 * c.act_block + c.act_fixed), 1, 0);
    ASSERT_NEAR(a.compute_s, 0.7 * full.compute_s, 0, 1e-9);
    ASSERT(a.comm_s < full.comm_s && a.optim_s < full.optim_s / 100);
    /* with sequence parallelism: LoRA's A reads the gathered rows (kept: no rows gathered again), the rest as
       without LoRA */
    dt_plan_layout sp2 = {.dp = 2, .tp = 2, .sp = true, .pp = 1, .batch = 4, .micro_batches = 1, .grad_accum = 1};
    dt_plan_layout tp2 = sp2;
    tp2.sp = false;
    ASSERT_OK(dt_plan_predict(&sp, &c, &sp2, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp2, &b));
    ASSERT(a.feasible && b.feasible);
    const double half_row = 4.0 * 768 * (1 - 1.0 / 2); /* a norm's input: the half a rank does not keep */
    ASSERT_NEAR(b.act_bytes - a.act_bytes, 4 * 64 * (12 * 2 + 1) * half_row, 1, 0); /* 4 samples a rank */
    sp.lora.fb_ratio = 0;
    ASSERT_STATUS(dt_plan_predict(&sp, &c, &ddp, &a), DT_ERR_INVALID_ARG);
    sp.lora = (dt_plan_lora){.block = 1000, .act_block = -1, .fb_ratio = 1};
    ASSERT_STATUS(dt_plan_predict(&sp, &c, &ddp, &a), DT_ERR_INVALID_ARG);
    /* measured */
    dt_plan_lora lr;
    ASSERT_OK(dt_plan_lora_measure("llama-tiny", "q_proj,v_proj", 0, 32, DT_F32, &lr));
    ASSERT_NEAR(lr.block, 8 * (64 + 64) + 8 * (64 + 32), 0.5, 0);
    ASSERT_NEAR(lr.fixed, 0, 0.5, 0);
    ASSERT(lr.act_block > 0 && lr.act_fixed > 0);
    /* fb_ratio is a ratio of CPU times: with three copies of this test at once on 2 cores it ranged 0.02-5.3
       (and failed the ASan suite once beside the other tests), so only its being a usable factor is asserted,
       not its size */
    ASSERT(isfinite(lr.fb_ratio) && lr.fb_ratio > 0);
    ASSERT_OK(dt_plan_lora_measure("llama-tiny", "all-linear", 4, 32, DT_F32, &lr));
    ASSERT_NEAR(lr.block, 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 176) + (176 + 64)), 0.5, 0);
    /* a block with adapters on every layer keeps little more than one without: each layer's output, the
       adapters' and its scaled copy go back to the arena once summed (they were twice the block's before) */
    dt_plan_calib lc;
    ASSERT_OK(dt_plan_calibrate("llama-tiny", 32, DT_F32, &lc));
    fprintf(stderr, "llama-tiny act per token a block: %.0f bytes, with all-linear adapters %.0f\n", lc.act_block,
            lr.act_block);
    ASSERT(lr.act_block < 1.5 * lc.act_block); /* 1.2 here (AVX-512), 2.4 before */
    ASSERT_STATUS(dt_plan_lora_measure("llama-tiny", "no_such_layer", 0, 32, DT_F32, &lr), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "no_such_layer");
    ASSERT_STATUS(dt_plan_lora_measure("llama-tiny", "", 0, 32, DT_F32, &lr), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_plan_lora_measure("mlp", "c_attn", 0, 32, DT_F32, &lr), DT_ERR_UNSUPPORTED);
}

TEST(reasons_by_name)
{
    dt_plan_calib c = calib();
    c.n_head = 6; /* tp 4 does not divide */
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 4, sp.global_batch = 8;
    dt_plan_prediction *r = NULL;
    int n = 0;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    const dt_plan_prediction *p;
    ASSERT((p = find(r, n, 2, 2, 1, 2, false, false, false, 4, 1)) != NULL);
    ASSERT(!p->feasible);
    ASSERT_STR_CONTAINS(p->reason, "ZeRO-2 does not combine with tensor or pipeline");
    ASSERT((p = find(r, n, 1, 4, 1, 0, false, false, false, 8, 1)) != NULL);
    ASSERT_STR_CONTAINS(p->reason, "tp 4 does not divide the 6 heads");
    ASSERT((p = find(r, n, 4, 1, 1, 3, true, false, false, 2, 1)) != NULL);
    ASSERT_STR_CONTAINS(p->reason, "hybrid sharding on one machine");
    ASSERT((p = find(r, n, 4, 1, 1, 1, false, false, true, 2, 1)) != NULL);
    ASSERT_STR_CONTAINS(p->reason, "offload needs an NVMe directory");
    ASSERT((p = find(r, n, 4, 1, 1, 1, false, false, false, 2, 1)) != NULL);
    ASSERT(p->feasible);
    dt_free(r);
    /* with a directory, offload is a layout like the others */
    sp.offload_dir = true;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    ASSERT((p = find(r, n, 4, 1, 1, 1, false, false, true, 2, 1)) != NULL);
    ASSERT(p->feasible);
    dt_free(r);
    /* a global batch the replicas cannot split: rows that say so, none feasible with dp 4 */
    sp.global_batch = 6;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    ASSERT((p = find(r, n, 4, 1, 1, 0, false, false, false, 1, 1)) != NULL);
    ASSERT_STR_CONTAINS(p->reason, "not the global batch 6");
    dt_free(r);
    sp.world = 0;
    ASSERT_STATUS(dt_plan_search(&sp, &c, &r, &n), DT_ERR_INVALID_ARG);
}

TEST(memory_model_and_limit)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 4;
    dt_plan_layout ddp = {.dp = 4, .tp = 1, .pp = 1, .zero_stage = 0, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_layout z3 = ddp;
    z3.zero_stage = 3;
    dt_plan_prediction a, b;
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &b));
    const double psi = 12 * c.numel_block + c.numel_fixed;
    ASSERT_NEAR(a.state_bytes, 16 * psi, 64, 0);                    /* 4 params + 4 grads + 8 AdamW */
    ASSERT_NEAR(b.state_bytes, 16 * ((size_t)psi + 3) / 4 * 1.0, 64, 1e-9); /* sharded over 4 */
    ASSERT(b.gathered_bytes > 0 && a.gathered_bytes == 0);
    ASSERT_NEAR(a.buffer_bytes, 0.75 * 4 * psi, 64, 0); /* the 3 peers' gradient pages this rank reads */
    ASSERT_NEAR(a.mem_bytes, a.base_bytes + a.state_bytes + a.buffer_bytes + a.act_bytes, 1, 0);
    ASSERT_NEAR(a.act_bytes, 2 * 64 * (12 * c.act_block + c.act_fixed), 1, 0);
    /* a limit between the two: DDP refused by the limit's name, ZeRO-3 kept */
    sp.mem_per_rank = (size_t)((a.mem_bytes + b.mem_bytes) / 2);
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &b));
    ASSERT(!a.feasible && b.feasible);
    ASSERT_STR_CONTAINS(a.reason, "over --mem-per-rank");
    /* the search refuses the same layout for the same reason */
    sp.global_batch = 8;
    dt_plan_prediction *r = NULL;
    int n = 0;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    const dt_plan_prediction *p = find(r, n, 4, 1, 1, 0, false, false, false, 2, 1);
    ASSERT(p && !p->feasible);
    ASSERT_STR_CONTAINS(p->reason, "over --mem-per-rank");
    ASSERT(r[0].feasible && r[0].mem_bytes <= (double)sp.mem_per_rank);
    dt_free(r);
}

TEST(checkpointing_and_bubble)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.cores = 2;
    dt_plan_layout l = {.dp = 2, .tp = 1, .pp = 1, .batch = 4, .micro_batches = 1, .grad_accum = 1};
    dt_plan_prediction off, on;
    ASSERT_OK(dt_plan_predict(&sp, &c, &l, &off));
    l.act_ckpt = true;
    ASSERT_OK(dt_plan_predict(&sp, &c, &l, &on));
    ASSERT(on.act_bytes < off.act_bytes / 2);
    ASSERT(on.compute_s > off.compute_s);
    /* 2 stages, 4 micro-batches: the bubble is (p - 1) / m = 1/4 of the compute (one rank per core) */
    dt_plan_layout pl = {.dp = 1, .tp = 1, .pp = 2, .batch = 4, .micro_batches = 4, .grad_accum = 1};
    dt_plan_prediction pr;
    ASSERT_OK(dt_plan_predict(&sp, &c, &pl, &pr));
    ASSERT(pr.feasible);
    ASSERT_NEAR(pr.bubble_s, pr.compute_s / 4, 1e-12, 1e-9);
}

TEST(calib_file_round_trip)
{
    char dir[] = "/tmp/dt_plan_XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char path[64], lnk[64];
    snprintf(path, sizeof path, "%s/c.calib", dir);
    snprintf(lnk, sizeof lnk, "%s/l.calib", dir);
    dt_plan_calib c = calib(), d;
    cpu_set_t set; /* load checks the cores of this machine */
    c.cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    ASSERT_OK(dt_plan_calib_save(&c, path));
    ASSERT_OK(dt_plan_calib_load(path, "gpt2", 64, DT_F32, &d));
    ASSERT_STR_EQ(d.model, "gpt2");
    ASSERT(d.fb_block_s == c.fb_block_s && d.act_fixed == c.act_fixed && d.numel_fixed == c.numel_fixed);
    ASSERT(d.ag_bw == c.ag_bw && d.ag_lat_s == c.ag_lat_s && d.rs_bw == c.rs_bw && d.rs_lat_s == c.rs_lat_s);
    ASSERT_EQ_INT((int)d.n_layer, 12);
    ASSERT_STATUS(dt_plan_calib_load(path, "gpt2-large", 64, DT_F32, &d), DT_ERR_NOT_FOUND);
    ASSERT_STATUS(dt_plan_calib_load(path, "gpt2", 128, DT_F32, &d), DT_ERR_NOT_FOUND);
    ASSERT_STATUS(dt_plan_calib_load(path, "gpt2", 64, DT_BF16, &d), DT_ERR_NOT_FOUND);
    /* a damaged file: cut short */
    FILE *f = fopen(path, "r+");
    ASSERT(f != NULL);
    ASSERT_EQ_INT(ftruncate(fileno(f), 120), 0);
    fclose(f);
    ASSERT_STATUS(dt_plan_calib_load(path, "gpt2", 64, DT_F32, &d), DT_ERR_FORMAT);
    /* a symlink is neither written through nor read */
    ASSERT_EQ_INT(symlink(path, lnk), 0);
    ASSERT_STATUS(dt_plan_calib_save(&c, lnk), DT_ERR_IO);
    ASSERT_STATUS(dt_plan_calib_load(lnk, "gpt2", 64, DT_F32, &d), DT_ERR_NOT_FOUND);
    unlink(lnk);
    unlink(path);
    rmdir(dir);
}

/* How much machinery a layout adds (search.c's order of simplicity). */
static int complexity(const dt_plan_layout *l)
{
    int ga = 0;
    for (int g = l->grad_accum; g > 1; g >>= 1)
        ga++;
    return 4 * (l->tp > 1) + 4 * (l->pp > 1) + l->zero_stage + 2 * l->act_ckpt + ga + 3 * l->offload + l->hybrid;
}

TEST(simpler_within_five_percent)
{
    dt_plan_calib c = calib();
    c.coll_bw = 4e10; /* DDP's gradient all-reduce cheap: DDP within a few % of 2-way tp (which halves the optimizer) */
    c.optim_s = 8e-10;
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.cores = 2, sp.global_batch = 4;
    dt_plan_layout ddp = {.dp = 2, .tp = 1, .pp = 1, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_layout tp = {.dp = 1, .tp = 2, .pp = 1, .batch = 4, .micro_batches = 1, .grad_accum = 1};
    dt_plan_prediction a, b;
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp, &b));
    fprintf(stderr, "  DDP %.2f ms, tp %.2f ms\n", a.step_s * 1e3, b.step_s * 1e3);
    ASSERT(b.step_s < a.step_s && a.step_s < b.step_s * 1.05); /* tp a little faster: within the band */
    dt_plan_prediction *r = NULL;
    int n = 0;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    double fastest = INFINITY;
    for (int i = 0; i < n && r[i].feasible; i++)
        fastest = r[i].step_s < fastest ? r[i].step_s : fastest;
    ASSERT(fastest < r[0].step_s); /* the first is not the fastest ... */
    ASSERT_EQ_INT(r[0].layout.tp, 1);
    ASSERT_EQ_INT(r[0].layout.pp, 1);
    ASSERT_EQ_INT(r[0].layout.dp, 2); /* ... but DDP-like, within 5% of it */
    ASSERT(r[0].step_s <= fastest * 1.05);
    for (int i = 0; i < n && r[i].feasible; i++) /* nothing within the band is simpler than the first */
        if (r[i].step_s <= fastest * 1.05)
            ASSERT(complexity(&r[0].layout) <= complexity(&r[i].layout));
    dt_free(r);
}

TEST(pass_cost_and_threads)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 1, sp.cores = 2;
    dt_plan_layout g1 = {.dp = 1, .tp = 1, .pp = 1, .batch = 4, .micro_batches = 1, .grad_accum = 1}, g4 = g1;
    g4.batch = 1, g4.grad_accum = 4;
    dt_plan_prediction a, b;
    ASSERT_OK(dt_plan_predict(&sp, &c, &g1, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &g4, &b));
    ASSERT_NEAR(b.compute_s, a.compute_s, 1e-12, 1e-9); /* no fixed part: the same tokens cost the same */
    c.pass_block_s = 1e-3, c.pass_fixed_s = 5e-3;
    ASSERT_OK(dt_plan_predict(&sp, &c, &g1, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &g4, &b));
    /* three more passes over the 2 threads of the one rank: 3 x (12 x 1 ms + 5 ms) / 2 */
    ASSERT_NEAR(b.compute_s - a.compute_s, 3 * (12 * 1e-3 + 5e-3) / 2, 1e-9, 1e-6);
    /* a rank on 2 threads pays the thread cost; two ranks of one thread do not */
    c.thread_cost = 1.25;
    dt_plan_prediction w;
    ASSERT_OK(dt_plan_predict(&sp, &c, &g1, &w));
    ASSERT_NEAR(w.compute_s, 1.25 * a.compute_s, 1e-12, 1e-9);
    sp.world = 2;
    dt_plan_layout d2 = {.dp = 2, .tp = 1, .pp = 1, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_prediction x, y;
    ASSERT_OK(dt_plan_predict(&sp, &c, &d2, &x));
    c.thread_cost = 1;
    ASSERT_OK(dt_plan_predict(&sp, &c, &d2, &y));
    ASSERT_NEAR(x.compute_s, y.compute_s, 1e-12, 1e-12);
}

TEST(calib_file_values_bounded)
{
    char dir[] = "/tmp/dt_plan_XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char path[64], text[4096];
    snprintf(path, sizeof path, "%s/c.calib", dir);
    dt_plan_calib c = calib(), d;
    cpu_set_t set;
    c.cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    ASSERT_OK(dt_plan_calib_save(&c, path));
    FILE *f = fopen(path, "r");
    ASSERT(f != NULL);
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    static const char *const bad[] = {"n_layer 1.6e63\n", "threads 1e12\n", "n_head -3\n", "coll_measured nan\n"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) { /* the key's line replaced by an out-of-range value */
        char key[32];
        sscanf(bad[k], "%31s", key);
        char *at = strstr(text, key), *nl = at ? strchr(at, '\n') : NULL;
        ASSERT(at && nl);
        f = fopen(path, "w");
        fprintf(f, "%.*s%s%s", (int)(at - text), text, bad[k], nl + 1);
        fclose(f);
        ASSERT_STATUS(dt_plan_calib_load(path, "gpt2", 64, DT_F32, &d), DT_ERR_FORMAT);
        ASSERT_STR_CONTAINS(dt_last_error(), key);
    }
    /* an older dtrain's file: absent (measure again), not damaged */
    f = fopen(path, "w");
    fprintf(f, "dtrain-plan-calib 1\nmodel gpt2\nseq 64\n");
    fclose(f);
    ASSERT_STATUS(dt_plan_calib_load(path, "gpt2", 64, DT_F32, &d), DT_ERR_NOT_FOUND);
    /* a version-3 file (every value of its day, no collective curve): measured again too, by name */
    f = fopen(path, "w");
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl)
            break;
        if (!strncmp(line, "dtrain-plan-calib ", 18))
            fprintf(f, "dtrain-plan-calib 3\n");
        else if (strncmp(line, "ag_", 3) && strncmp(line, "rs_", 3))
            fprintf(f, "%.*s\n", (int)(nl - line), line);
    }
    fclose(f);
    ASSERT_STATUS(dt_plan_calib_load(path, "gpt2", 64, DT_F32, &d), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "version 3");
    unlink(path);
    rmdir(dir);
}

TEST(llama_calibrated_and_planned)
{
    dt_plan_calib c;
    ASSERT_OK(dt_plan_calibrate("llama-tiny", 32, DT_F32, &c));
    ASSERT_STR_EQ(c.model, "llama-tiny");
    ASSERT_EQ_INT((int)c.n_layer, 2);
    ASSERT_EQ_INT((int)c.n_head, 4);
    ASSERT_EQ_INT((int)c.n_kv_head, 2);
    ASSERT_EQ_INT((int)c.n_embd, 64);
    ASSERT_EQ_INT((int)c.vocab, 512);
    /* the page-fault figures of both kinds (the huge-page one is the 4 KiB one where no huge page came)
       and the non-finite scan's */
    ASSERT(c.fault_bw > 0 && c.fault_huge_bw > 0 && c.nonfinite_s > 0 && c.optim_s > 0);
    ASSERT(c.thp == 0 || c.thp == 1);
    if (!c.thp)
        ASSERT_NEAR(c.fault_huge_bw, c.fault_bw, 0, 1e-12);
    /* one block: q, k, v (2 key/value heads of 16), o, gate, up, down and two norms */
    ASSERT_NEAR(c.numel_block, 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64, 0.5, 0);
    ASSERT(c.fb_block_s > 0 && c.act_block > 0 && c.thread_cost >= 1);
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 4, sp.global_batch = 8;
    dt_plan_prediction *r = NULL;
    int n = 0;
    ASSERT_OK(dt_plan_search(&sp, &c, &r, &n));
    ASSERT(n > 0 && r[0].feasible);
    const dt_plan_prediction *p = find(r, n, 1, 4, 1, 0, false, false, false, 8, 1);
    ASSERT(p && !p->feasible); /* 4 heads, but 2 key/value heads */
    ASSERT_STR_CONTAINS(p->reason, "tp 4 does not divide the 2 key/value heads");
    ASSERT((p = find(r, n, 2, 2, 1, 0, false, false, false, 4, 1)) && p->feasible);
    dt_free(r);
    char id[32];
    int64_t pos = 0;
    ASSERT_OK(dt_plan_model_id("llama-100m", id, sizeof id, &pos));
    ASSERT_STR_EQ(id, "llama-100m");
    ASSERT_EQ_INT((int)pos, 1024);
    ASSERT_STATUS(dt_plan_model_id("convnet", id, sizeof id, NULL), DT_ERR_UNSUPPORTED);
    ASSERT_STATUS(dt_plan_calibrate("mlp", 0, DT_F32, &c), DT_ERR_UNSUPPORTED);
    /* a Llama directory: its id is its shape's */
    char dir[] = "/tmp/dt_plan_hf_XXXXXX", cfg[80], name[96], id2[32];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    ASSERT(f != NULL);
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 512, \"hidden_size\": 64, "
               "\"intermediate_size\": 176, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
               "\"num_key_value_heads\": 2, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5, "
               "\"hidden_act\": \"silu\"}\n");
    fclose(f);
    snprintf(name, sizeof name, "hf:%s", dir);
    ASSERT_OK(dt_plan_model_id(name, id, sizeof id, &pos));
    ASSERT(!strncmp(id, "hfllama-", 8) && strlen(id) == 24);
    ASSERT_EQ_INT((int)pos, 256);
    ASSERT_OK(dt_plan_model_id(name, id2, sizeof id2, NULL));
    ASSERT_STR_EQ(id, id2); /* the same shape, the same id */
    ASSERT_OK(dt_plan_calibrate(name, 16, DT_F32, &c));
    ASSERT_STR_EQ(c.model, id);
    ASSERT_EQ_INT((int)c.n_kv_head, 2);
    unlink(cfg);
    rmdir(dir);
}

TEST(config_plan_auto)
{
    struct {
        const char *json;
        dt_status want;
        const char *says;
    } cases[] = {
        {"{\"dtrain\": {\"plan\": \"auto\"}, \"train_batch_size\": 8}", DT_OK, NULL},
        {"{\"dtrain\": {\"plan\": \"auto\"}, \"gradient_accumulation_steps\": \"auto\"}", DT_OK, NULL},
        {"{\"dtrain\": {\"plan\": \"auto\", \"tensor_parallel_size\": 2}}", DT_ERR_INVALID_ARG,
         "dtrain.tensor_parallel_size"},
        {"{\"dtrain\": {\"plan\": \"auto\"}, \"zero_optimization\": {\"stage\": 3}}", DT_ERR_INVALID_ARG,
         "zero_optimization.stage"},
        {"{\"dtrain\": {\"plan\": \"auto\"}, \"pipeline\": {\"stages\": 2}}", DT_ERR_INVALID_ARG, "pipeline.stages"},
        {"{\"dtrain\": {\"plan\": \"auto\"}, \"gradient_accumulation_steps\": 2}", DT_ERR_INVALID_ARG,
         "gradient_accumulation_steps"},
        {"{\"dtrain\": {\"plan\": \"auto\", \"activation_checkpointing\": true}}", DT_ERR_INVALID_ARG,
         "dtrain.activation_checkpointing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_config *cf = NULL;
        ASSERT_OK(dt_config_init(&cf));
        ASSERT_OK(dt_config_load_string(cf, "test.json", cases[i].json, strlen(cases[i].json)));
        bool on = false;
        dt_plan_params p = dt_plan_params_default();
        ASSERT_STATUS(dt_plan_config_auto(cf, &on), cases[i].want);
        if (cases[i].want == DT_OK) {
            ASSERT(on);
            ASSERT_OK(dt_plan_from_config(cf, &p));
            ASSERT_EQ_INT(p.tp, 1); /* the layout left to the planner */
        } else {
            ASSERT_STR_CONTAINS(dt_last_error(), cases[i].says);
            ASSERT_STR_CONTAINS(dt_last_error(), "dtrain.plan");
            ASSERT_STATUS(dt_plan_from_config(cf, &p), DT_ERR_INVALID_ARG); /* the same refusal */
            ASSERT_STR_CONTAINS(dt_last_error(), cases[i].says);
        }
        dt_config_free(cf);
    }
    /* without the key: off, the layout keys read as before */
    dt_config *cf = NULL;
    const char *j = "{\"dtrain\": {\"tensor_parallel_size\": 2}}";
    ASSERT_OK(dt_config_init(&cf));
    ASSERT_OK(dt_config_load_string(cf, "t.json", j, strlen(j)));
    bool on = true;
    ASSERT_OK(dt_plan_config_auto(cf, &on));
    ASSERT(!on);
    dt_config_free(cf);
    /* a value other than "auto": the config layer names the key */
    j = "{\"dtrain\": {\"plan\": \"manual\"}}";
    ASSERT_OK(dt_config_init(&cf));
    ASSERT(dt_config_load_string(cf, "t.json", j, strlen(j)) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "dtrain.plan");
    dt_config_free(cf);
}

/* Tensor parallelism: each tp rank runs a block's layer norms and residuals whole (repl_block_s) and
   its share of a pass's fixed cost (the weights' bytes the GEMMs stream, split like the weights); per
   pass it issues two all-reduces per block
   forward, two backward, and four for the vocabulary-parallel embedding, head and loss. DDP (tp 1)
   is untouched by the first two. */
TEST(tp_replicated_share_and_allreduces)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.cores = 2, sp.global_batch = 4;
    dt_plan_layout tp = {.dp = 1, .tp = 2, .pp = 1, .batch = 4, .micro_batches = 1, .grad_accum = 1};
    dt_plan_layout ddp = {.dp = 2, .tp = 1, .pp = 1, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_prediction a, b, d0, d1;
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp, &a));
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &d0));
    c.repl_block_s = 2e-4; /* of the block's 1 ms per token: 0.8 ms split, 0.2 ms whole on each rank */
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp, &b));
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &d1));
    /* 4 samples x 64 tokens x 12 blocks x 0.2 ms x (1 - 1/2), on the rank's one core */
    ASSERT_NEAR(b.compute_s - a.compute_s, 4 * 64 * 12 * 2e-4 * 0.5, 1e-9, 1e-6);
    ASSERT_NEAR(d1.compute_s, d0.compute_s, 1e-12, 1e-12);
    /* a pass's fixed cost (one pass: 12 x 1 ms + 5 ms): whole on each DDP rank, half on each of 2 tp ranks */
    c.repl_block_s = 0, c.pass_block_s = 1e-3, c.pass_fixed_s = 5e-3;
    c.fb_block_s += 1e-3 / 64, c.fb_fixed_s += 5e-3 / 64; /* the same per-token parts: fb = pass / T + per token */
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp, &b));
    ASSERT_NEAR(b.compute_s - a.compute_s, (12 * 1e-3 + 5e-3) / 2, 1e-9, 1e-6);
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &d1));
    ASSERT_NEAR(d1.compute_s - d0.compute_s, 12 * 1e-3 + 5e-3, 1e-9, 1e-6);
    /* the all-reduces: a millisecond more per call is (4 x 12 + 4) x 1 ms more per pass */
    c = calib();
    c.coll_lat_s = 1e-3;
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp, &a));
    c.coll_lat_s = 2e-3;
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp, &b));
    ASSERT_NEAR(b.comm_s - a.comm_s, (4 * 12 + 4) * 1e-3, 1e-9, 1e-6);
    tp.batch = 2, tp.grad_accum = 2; /* two passes: twice the calls */
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp, &b));
    c.coll_lat_s = 1e-3;
    ASSERT_OK(dt_plan_predict(&sp, &c, &tp, &a));
    ASSERT_NEAR(b.comm_s - a.comm_s, 2 * (4 * 12 + 4) * 1e-3, 1e-9, 1e-6);
}

/* ZeRO-2/3: a collective per unit as the run wraps them (wrap_min_params), and the pages of the units'
   gradients faulted in again every pass (ZeRO-3's parameters go through its page pool). */
TEST(zero_units_and_faults)
{
    dt_plan_calib c = calib();
    c.ag_bw = c.ag_lat_s = c.rs_bw = c.rs_lat_s = 0; /* a calibration without the curve: the all-reduce's */
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.cores = 2, sp.global_batch = 4;
    dt_plan_layout z3 = {.dp = 2, .tp = 1, .pp = 1, .zero_stage = 3, .batch = 2, .micro_batches = 1,
                         .grad_accum = 1, .wrap_min_params = (int64_t)c.numel_block};
    dt_plan_layout z2 = z3, z1 = z3;
    z2.zero_stage = 2, z1.zero_stage = 1, z1.wrap_min_params = 0;
    dt_plan_prediction a, b;
    /* calls: 12 block units + the root; ZeRO-3 gathers each in forward, the blocks again in backward,
       reduce-scatters each: 38 per pass; ZeRO-2 a reduce-scatter each and one gather after the step: 14 */
    const struct { dt_plan_layout *l; double calls_block, calls_two; } k[] = {{&z3, 38, 20}, {&z2, 14, 8}};
    for (int i = 0; i < 2; i++) {
        c.coll_lat_s = 1e-3;
        ASSERT_OK(dt_plan_predict(&sp, &c, k[i].l, &a));
        c.coll_lat_s = 2e-3;
        ASSERT_OK(dt_plan_predict(&sp, &c, k[i].l, &b));
        ASSERT_NEAR(b.comm_s - a.comm_s, k[i].calls_block * 1e-3, 1e-9, 1e-6);
        k[i].l->wrap_min_params = 2 * (int64_t)c.numel_block; /* two blocks a unit: 6 + the root */
        ASSERT_OK(dt_plan_predict(&sp, &c, k[i].l, &b));
        c.coll_lat_s = 1e-3;
        ASSERT_OK(dt_plan_predict(&sp, &c, k[i].l, &a));
        ASSERT_NEAR(b.comm_s - a.comm_s, k[i].calls_two * 1e-3, 1e-9, 1e-6);
        k[i].l->wrap_min_params = (int64_t)c.numel_block;
    }
    /* the faults: a fresh byte costs 1 ns more; ZeRO-1 keeps its buffers. ZeRO-2's gradient regions
       fault at the huge-page figure (the 4 KiB one does not move it), ZeRO-3's at the 4 KiB one (as
       measured; the huge-page figure does not move it) */
    const double P = 12 * c.numel_block + c.numel_fixed;
    const double per_b = 1e-9 - 1e-12;
    for (int kind = 0; kind < 2; kind++) {
        double *bw = kind ? &c.fault_huge_bw : &c.fault_bw;
        c.fault_bw = c.fault_huge_bw = 1e12;
        dt_plan_prediction f3, f2, f1, g3, g2, g1;
        ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &f3));
        ASSERT_OK(dt_plan_predict(&sp, &c, &z2, &f2));
        ASSERT_OK(dt_plan_predict(&sp, &c, &z1, &f1));
        *bw = 1e9;
        ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &g3));
        ASSERT_OK(dt_plan_predict(&sp, &c, &z2, &g2));
        ASSERT_OK(dt_plan_predict(&sp, &c, &z1, &g1));
        ASSERT_NEAR(g2.compute_s - f2.compute_s, kind ? 4 * P * per_b : 0, 1e-9, 1e-6);
        ASSERT_NEAR(g3.compute_s - f3.compute_s, kind ? 0 : 4 * P * per_b, 1e-9, 1e-6);
        ASSERT_NEAR(g1.compute_s, f1.compute_s, 1e-12, 1e-12);
    }
    /* a calibration without the huge-page figure (an older file's fields): ZeRO-2 at the 4 KiB one */
    c.fault_huge_bw = 0, c.fault_bw = 1e12;
    ASSERT_OK(dt_plan_predict(&sp, &c, &z2, &a));
    c.fault_bw = 1e9;
    ASSERT_OK(dt_plan_predict(&sp, &c, &z2, &b));
    ASSERT_NEAR(b.compute_s - a.compute_s, 4 * P * per_b, 1e-9, 1e-6);
}

/* The trainer's non-finite scan of the gradients a rank steps (a read pass each step of a run without a
   loss scaler, which a planned run never has): nonfinite_s per parameter stepped, with the optimizer,
   for DDP (every parameter) and ZeRO-1..3 (the rank's shard). */
TEST(nonfinite_scan_charged)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.cores = 2, sp.global_batch = 4;
    const double P = 12 * c.numel_block + c.numel_fixed;
    for (int zero = 0; zero <= 3; zero++) {
        dt_plan_layout l = {.dp = 2, .tp = 1, .pp = 1, .zero_stage = zero, .batch = 2, .micro_batches = 1,
                            .grad_accum = 1, .wrap_min_params = zero >= 2 ? (int64_t)c.numel_block : 0};
        dt_plan_prediction a, b;
        c.nonfinite_s = 0;
        ASSERT_OK(dt_plan_predict(&sp, &c, &l, &a));
        c.nonfinite_s = 1e-9;
        ASSERT_OK(dt_plan_predict(&sp, &c, &l, &b));
        /* a rank's threads: 2 cores / 2 ranks = 1 */
        ASSERT_NEAR(b.optim_s - a.optim_s, (zero ? P / 2 : P) * 1e-9, 1e-9, 1e-6);
        ASSERT_NEAR(b.step_s - a.step_s, (zero ? P / 2 : P) * 1e-9, 1e-9, 1e-6);
    }
}

/* ZeRO-3's time at the measured curve: per pass, every unit's parameters all-gathered in forward, the
   block units' again in backward (the root stays gathered), every unit's gradients reduce-scattered, each
   moving (dp-1)/dp of its bytes through a rank at its own kind's bandwidth, plus its latency per call. */
TEST(zero3_collectives_at_the_curve)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.cores = 2, sp.global_batch = 4;
    dt_plan_layout z3 = {.dp = 2, .tp = 1, .pp = 1, .zero_stage = 3, .batch = 2, .micro_batches = 1,
                         .grad_accum = 1, .wrap_min_params = (int64_t)c.numel_block};
    const double blocks = 12 * c.numel_block, P = blocks + c.numel_fixed, share = 0.5;
    dt_plan_prediction a, b;
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &a));
    /* the whole term: 13 units gathered in forward, 12 again in backward, 13 reduce-scattered */
    const double want = share * 4 * (P + blocks) / c.ag_bw + 25 * c.ag_lat_s + share * 4 * P / c.rs_bw +
                        13 * c.rs_lat_s;
    ASSERT_NEAR(a.comm_s, want, 1e-12, 1e-9);
    /* the all-gathers at their own bandwidth: halving it doubles their bytes' time */
    c.ag_bw /= 2;
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &b));
    ASSERT_NEAR(b.comm_s - a.comm_s, share * 4 * (P + blocks) / (2 * c.ag_bw), 1e-12, 1e-9);
    c.ag_bw *= 2, c.rs_bw /= 2;
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &b));
    ASSERT_NEAR(b.comm_s - a.comm_s, share * 4 * P / (2 * c.rs_bw), 1e-12, 1e-9);
    c.rs_bw *= 2, c.ag_lat_s += 1e-3, c.rs_lat_s += 2e-3;
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &b));
    ASSERT_NEAR(b.comm_s - a.comm_s, 25 * 1e-3 + 13 * 2e-3, 1e-12, 1e-9);
    /* gradient accumulation: every pass pays them */
    c = calib();
    z3.batch = 1, z3.grad_accum = 2;
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &b));
    ASSERT_NEAR(b.comm_s, 2 * want, 1e-12, 1e-9);
    /* DDP's all-reduce stays on the all-reduce curve: the gather and reduce-scatter curves move nothing */
    dt_plan_layout ddp = {.dp = 2, .tp = 1, .pp = 1, .zero_stage = 0, .batch = 2, .micro_batches = 1,
                          .grad_accum = 1};
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &a));
    c.ag_bw /= 4, c.rs_bw /= 4;
    ASSERT_OK(dt_plan_predict(&sp, &c, &ddp, &b));
    ASSERT_NEAR(b.comm_s, a.comm_s, 1e-15, 1e-12);
}

/* ZeRO-3's memory: the root unit's parameters and gradients, a block unit computed (parameters and
   gradients), one prefetched, one waiting for its reduce-scatter and two in the page pool: 2 roots + 6
   blocks; and the shared-memory staging pages: 8 MiB a rank a group, two groups, every rank's read. */
TEST(zero3_units_alive_and_staging)
{
    dt_plan_calib c = calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.cores = 2;
    const double MiB = 1024.0 * 1024;
    for (int dp = 2; dp <= 8; dp *= 2) {
        sp.world = dp, sp.global_batch = dp;
        dt_plan_layout z3 = {.dp = dp, .tp = 1, .pp = 1, .zero_stage = 3, .batch = 1, .micro_batches = 1,
                             .grad_accum = 1, .wrap_min_params = (int64_t)c.numel_block};
        dt_plan_prediction a;
        ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &a));
        ASSERT_NEAR(a.gathered_bytes, 4 * (2 * c.numel_fixed + 6 * c.numel_block), 1, 1e-12);
        ASSERT_NEAR(a.buffer_bytes, 2.0 * dp * 8 * MiB, 1, 1e-12);
        ASSERT_NEAR(a.mem_bytes, a.base_bytes + a.state_bytes + a.gathered_bytes + a.buffer_bytes + a.act_bytes, 1,
                    1e-12);
        /* one unit (the whole model): its parameters and gradients */
        z3.wrap_min_params = 0;
        ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &a));
        ASSERT_NEAR(a.gathered_bytes, 4 * 2 * (12 * c.numel_block + c.numel_fixed), 1, 1e-12);
    }
    /* units smaller than the staging touch only what their messages fill */
    c.numel_block = 1000, c.numel_fixed = 3000;
    sp.world = 4, sp.global_batch = 4;
    dt_plan_layout z3 = {.dp = 4, .tp = 1, .pp = 1, .zero_stage = 3, .batch = 1, .micro_batches = 1,
                         .grad_accum = 1, .wrap_min_params = 1000};
    dt_plan_prediction a;
    ASSERT_OK(dt_plan_predict(&sp, &c, &z3, &a));
    ASSERT_NEAR(a.buffer_bytes, 2.0 * 4 * 4 * 3000, 1, 1e-12);
}

int main(void)
{
    RUN(enumeration_counts_and_order);
    RUN(sequence_parallel_and_ulysses);
    RUN(lora_frozen_and_measured);
    RUN(reasons_by_name);
    RUN(context_parallel);
    RUN(memory_model_and_limit);
    RUN(checkpointing_and_bubble);
    RUN(calib_file_round_trip);
    RUN(simpler_within_five_percent);
    RUN(pass_cost_and_threads);
    RUN(calib_file_values_bounded);
    RUN(llama_calibrated_and_planned);
    RUN(config_plan_auto);
    RUN(tp_replicated_share_and_allreduces);
    RUN(zero_units_and_faults);
    RUN(nonfinite_scan_charged);
    RUN(zero3_collectives_at_the_curve);
    RUN(zero3_units_alive_and_staging);
    return TEST_REPORT();
}
