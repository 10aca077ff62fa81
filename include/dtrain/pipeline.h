/* dtrain/pipeline.h — pipeline parallelism: schedules as action tables,
 * stages, and the "pipe" training strategy.
 *
 * Overview
 * --------
 * A model is cut by layer into S stages; stage s runs on pipeline rank
 * s % p (p ranks, v = S / p stages each: v > 1 is the interleaved
 * schedule's "virtual stages", Megatron's layout). A batch is split into m
 * micro-batches that flow through the stages: activations go forward to
 * the next stage, their gradients come back, all by batched point to
 * point (comm.h), the loss on the last stage.
 *
 * A schedule is ONE global table (dt_pipe_schedule): for every rank the
 * ordered list of its actions — F (forward of a stage on a micro-batch), B
 * (its whole backward), BI (backward for the input gradient only), BW (the
 * weight-gradient part, run later), SEND_F / RECV_F (an activation),
 * SEND_B / RECV_B (a gradient) — each with the time step at which it
 * starts in a simulation with unit costs (F = BI = BW = 1, B = 2). The
 * table is built once, from the schedule's rule, then checked
 * (dt_pipe_schedule_check) before anything runs:
 *   - every (stage, micro-batch) has exactly one F and one B (or one BI
 *     and one BW), on the rank that holds the stage, F before B, BI before
 *     BW, and stage s-1's F before stage s's F on the same micro-batch
 *     (stage s+1's backward before stage s's);
 *   - every SEND has its RECV: for each ordered pair of ranks the sends of
 *     one and the receives of the other list the same messages in the same
 *     order (point-to-point messages are matched in posting order), every
 *     RECV is posted before the action that consumes it and every SEND
 *     comes after the action that produces it;
 *   - a simulation of all ranks (sends never block, a compute action waits
 *     for its message) runs every action: no rank waits forever, so the
 *     table cannot deadlock.
 * The executor then runs each rank's list as it stands: there is no
 * per-rank logic that could drift from what its neighbours do (the cause
 * of PyTorch's interleaved-schedule hangs).
 *
 * Schedules (bubble as a fraction of the ideal time):
 *   gpipe        all m forwards, then all m backwards. Bubble (p-1)/m;
 *                holds m micro-batches' activations.
 *   1f1b         stage s: min(p-s-1, m) warm-up forwards, then one forward
 *                / one backward, then the remaining backwards. Bubble
 *                (p-1)/m; at most p-s micro-batches in flight on stage s.
 *   interleaved  v >= 2 chunks per rank (stages r, r+p, ...), Megatron's
 *                order: warm-up min(2(p-r-1) + (v-1)p, m v) virtual
 *                micro-batches. Bubble (p-1)/(v m). Needs m % p == 0.
 *   zbh1         ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline
 *                Parallelism"): 1F1B's order with each backward split into
 *                BI (on the critical path) and BW; stage s keeps up to p-s-1
 *                BW's back and runs them in the cool-down, where 1F1B idles.
 *                Bubble about a third of 1F1B's when F, BI and BW cost the
 *                same; memory as 1F1B's.
 * Limits are checked per schedule, with an error naming the limit.
 *
 * Stages. A model is a list of units (layers, dt_model_pipe_units): the
 * GPT is [embeddings, block 0's two halves, ..., block L-1's, ln_f, lm_head], the MLP
 * [w0, w1], a model whose root is a Sequential its children. Stages are
 * consecutive runs of units, cut where the caller says or balanced by the
 * units' compute (the default: estimated per unit; or by parameter count;
 * or by measured time): the busiest rank's compute as small as possible.
 * Measured time (DT_PIPE_BY_TIME, dt_pipe_unit_times): at attach, before
 * the cut (every rank still holds the whole model), every rank runs every
 * unit's forward and backward on a sample micro-batch the caller gives
 * (params.sample), one warm-up then 3 repetitions, keeping each unit's
 * least; the world then takes the mean of the ranks' times (rank 0's copy
 * of it), so every replica of a stage cuts alike. With tensor parallelism
 * the tp ranks time in step (their layers' collectives match: the
 * sample's shape is checked to be the same on every rank first). The loss
 * is not timed (the last unit is timed on its output).
 * Every rank builds the whole model's layout (so names, offsets and
 * checkpoints do not depend on the cut) but holds only its own stages'
 * parameters: at attach the pages of the parameter and gradient flats that
 * no stage of the rank uses go back to the system (flats of
 * DT_FLAT_MAP_MIN bytes or more are anonymous mappings, dt_flat.mapped:
 * what is never written is never resident), and from then on nothing reads
 * or writes them (their contents are undefined). So a rank's parameters, gradients,
 * optimizer state and fp32 masters are those of its stages: about 1/p of
 * the model's with balanced stages. The replicas' collectives (DDP's
 * all-reduce, ZeRO-1's reduce-scatter and all-gather) go over each run of
 * a rank's entries, not over the stages between its interleaved chunks.
 *
 * Lazy construction: a model built whole is initialised whole on every
 * rank (4 bytes per parameter, at build) before attach gives the rest
 * back. Build it meta instead (dt_model_build_params.meta) and attach maps
 * the flats (nothing resident), then initialises only the entries its
 * stages use (its own and the shared ones: the GPT's wte on the first and
 * last stage) with dt_model_init_range (params.init_rng, params.init_seed
 * = the build's seed): bit for bit a whole build's values (DT_INIT_PHILOX:
 * dt_model_build's; DT_INIT_TORCH: dt_model_init_torch's, which draws the
 * whole stream once per run of entries, time of the whole model), and the
 * other stages' pages are never written at any point; the replicas then
 * take dp rank 0's values of those entries only. After attach the model
 * is no longer meta. Not with tensor parallelism (a slice's values are not
 * a range of a whole build's) nor DT_PIPE_BY_TIME without cuts (which times
 * every unit on the whole model at attach): DT_ERR_UNSUPPORTED, build it
 * whole. `dtrain train --pp` builds meta except in those two cases.
 *
 * Each rank steps only the parameters of its own stages (the strategy's
 * optimizer ranges). A parameter stored once but used on two ranks' stages
 * (the GPT's wte and its tied lm_head, on the first and the last stage) has
 * its gradient summed between them, as Megatron does; the first of them
 * steps it and sends the new values to the others after the optimizer
 * step.
 *
 * Split backward (zbh1): BI is dt_backward_input and BW dt_backward_weight
 * (autograd.h): nodes with a parameter input are walked for their other
 * inputs first and queued; their weight-gradient kernels run at BW.
 *
 * Data parallelism over the world / pp replicas: DDP (params.zero = 0:
 * each replica steps its stages' parameters, gradients averaged once per
 * batch after the last micro-batch) or ZeRO-1 (params.zero = 1: the
 * replicas of a stage split its parameters evenly, gradients are
 * reduce-scattered once per batch, each replica keeps optimizer state and
 * fp32 masters of its share only and steps it, the shares are all-gathered
 * after the step; the gradient norm is summed over stages and shares).
 * With tensor parallelism (a dp x tp x pp mesh) each tp rank's replicas
 * split that rank's stage elements (its slices and the replicated
 * tensors): ZeRO-1 over dp, tp inside a stage, pp across; its checkpoints
 * gather the shares over dp first and are then DDP's (tp.h).
 *
 * Mixed precision: a model holding bf16/f16 parameters (the trainer's
 * precision policy) runs every stage under autocast in that dtype, sends
 * activations in their dtype and gradients in f32, keeps fp32 master
 * weights for the parameters each rank steps and reduces gradients in the
 * parameters' dtype; the loss scaler's overflow flag is agreed over every
 * rank of every stage, so all skip the same steps. DT_PIPE_BY_TIME times
 * the units under that autocast too.
 *
 * Usage: train with the "pipe" strategy (each trainer micro-batch is split
 * into params.micro_batches micro-batches and runs the schedule):
 *
 *     dt_pipe_params pp = dt_pipe_params_default();
 *     pp.pp = 2; pp.schedule = DT_PIPE_1F1B; pp.micro_batches = 8;
 *     dt_strategy *s;
 *     if (dt_strategy_pipe_init(world, &pp, &s) < 0) fail(dt_last_error());
 *     dt_trainer_init(model, s, &tp, &tr);          // collective: cuts, groups
 *     dt_trainer_step(tr, &batch, 1, &metrics);     // the whole schedule
 *
 * Or look at a table (`dtrain pipeline show --schedule 1f1b -p 4 -m 8`):
 *
 *     dt_pipe_schedule *s;
 *     if (dt_pipe_schedule_build(DT_PIPE_ZBH1, 4, 8, 1, &s) < 0) fail(dt_last_error());
 *     dt_pipe_schedule_print(s, stdout);
 *     dt_pipe_sim r;  dt_pipe_schedule_simulate(s, 1, 1, 1, &r);  // r.bubble
 *     dt_pipe_schedule_free(s);
 */
#ifndef DTRAIN_PIPELINE_H
#define DTRAIN_PIPELINE_H

#include <stdio.h>

#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "dtrain/mesh.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- schedules ---------------------------------------------------------------- */

typedef enum dt_pipe_kind {
    DT_PIPE_GPIPE = 0,
    DT_PIPE_1F1B,
    DT_PIPE_INTERLEAVED,
    DT_PIPE_ZBH1,
    DT_PIPE_KIND_COUNT
} dt_pipe_kind;

/* "gpipe", "1f1b", "interleaved", "zbh1". */
DT_API const char *dt_pipe_kind_name(dt_pipe_kind k);
/* The kind of a name above; DT_ERR_INVALID_ARG naming the choices. */
DT_API dt_status dt_pipe_kind_parse(const char *s, dt_pipe_kind *out);

typedef enum dt_pipe_op {
    DT_PIPE_F = 0,   /* forward of `stage` on micro-batch `mb` */
    DT_PIPE_B,       /* whole backward */
    DT_PIPE_BI,      /* backward for the input gradient only */
    DT_PIPE_BW,      /* the weight gradients of an earlier BI */
    DT_PIPE_SEND_F,  /* send stage's output activation of mb to peer (stage + 1's rank) */
    DT_PIPE_RECV_F,  /* receive stage's output activation of mb from peer */
    DT_PIPE_SEND_B,  /* send the gradient of stage's input for mb to peer (stage - 1's rank) */
    DT_PIPE_RECV_B,  /* receive the gradient of stage's input for mb from peer */
    DT_PIPE_OP_COUNT
} dt_pipe_op;

/* One entry of a rank's list. For SEND/RECV, stage is the SENDING stage
 * (so a send and its receive carry the same (op kind, stage, mb)). */
typedef struct dt_pipe_action {
    dt_pipe_op op;
    int stage;   /* global stage index in [0, p v) */
    int mb;      /* micro-batch in [0, m) */
    int peer;    /* SEND/RECV: the other rank; -1 for compute actions */
    int t;       /* start time step in the unit-cost simulation */
} dt_pipe_action;

typedef struct dt_pipe_schedule dt_pipe_schedule;

/* Build and check the table of schedule `kind` for p ranks, m
 * micro-batches and v stages per rank (v must be 1 except for
 * interleaved, which needs v >= 2 and m % p == 0). Limits: 1 <= p <= 256,
 * 1 <= m <= 4096, p v <= 1024. DT_ERR_INVALID_ARG naming the limit. */
DT_API dt_status dt_pipe_schedule_build(dt_pipe_kind kind, int p, int m, int v, dt_pipe_schedule **out);
/* A table from explicit per-rank lists (acts[r][0..n[r]) for r < p; times
 * are recomputed), checked like a built one: for tests and hand-made
 * schedules. DT_ERR_INVALID_ARG / DT_ERR_STATE naming the first
 * violation (the rank, the action and what is wrong). */
DT_API dt_status dt_pipe_schedule_from_actions(int p, int m, int v, const dt_pipe_action *const *acts, const int *n,
                                               dt_pipe_schedule **out);
DT_API void dt_pipe_schedule_free(dt_pipe_schedule *s);
/* Run the checks of the overview again (build does). */
DT_API dt_status dt_pipe_schedule_check(const dt_pipe_schedule *s);
/* Rank r's actions in order (borrowed; valid until free). */
DT_API dt_status dt_pipe_schedule_actions(const dt_pipe_schedule *s, int rank, const dt_pipe_action **a, int *n);
/* p, m, v and the kind (DT_PIPE_KIND_COUNT for a table from actions). */
DT_API void dt_pipe_schedule_shape(const dt_pipe_schedule *s, int *p, int *m, int *v, dt_pipe_kind *kind);
/* The rank that holds stage s: s % p. */
DT_API int dt_pipe_stage_rank(int p, int stage);

/* The unit-cost replay of a table (F costs tf, BI tb, BW tw, B tb + tw,
 * sends and receives 0). */
typedef struct dt_pipe_sim {
    double makespan;          /* time until the last action ends */
    double ideal;             /* one rank's compute: m v (tf + tb + tw) */
    double bubble;            /* (makespan - ideal) / ideal: the bubble as a fraction of the ideal */
    double busy[256];         /* per rank: compute time */
    int peak_inflight[256];   /* per rank: most micro-batches (of all its stages) forwarded and not
                                 yet fully backwarded at once: activations held */
} dt_pipe_sim;
DT_API dt_status dt_pipe_schedule_simulate(const dt_pipe_schedule *s, double tf, double tb, double tw, dt_pipe_sim *out);
/* The same replay with a cost per stage and action: cost[4 stage + k] for
 * k = DT_PIPE_F, DT_PIPE_B, DT_PIPE_BI, DT_PIPE_BW (p v stages; B is its own
 * entry here, not BI + BW), e.g. the costs a run measured
 * (dt_strategy_pipe_trace): what the table's bubble is when the stages
 * cost what they cost and the handoffs are free. out->ideal is then the
 * busiest rank's compute (with equal costs, m v (tf + tb + tw) as above)
 * and out->bubble (makespan - ideal) / ideal. DT_ERR_INVALID_ARG for a
 * negative or non-finite cost. */
DT_API dt_status dt_pipe_schedule_simulate_costs(const dt_pipe_schedule *s, const double *cost, dt_pipe_sim *out);
/* Print the table: a time grid (one row per rank, one column per unit
 * step: F3 / B3 / I3 (BI) / W3 (BW), ":c" the chunk when v > 1, "." idle)
 * then each rank's list with its sends and receives. */
DT_API dt_status dt_pipe_schedule_print(const dt_pipe_schedule *s, FILE *f);

/* The bubble of the formulas of the overview, as a fraction of the ideal:
 * (p-1)/m (gpipe, 1f1b), (p-1)/(v m) (interleaved), (p-1)/(3 m) (zbh1). */
DT_API double dt_pipe_bubble_formula(dt_pipe_kind kind, int p, int m, int v);

/* ---- stages ------------------------------------------------------------------- */

struct dt_pipe_unit;
/* A unit's forward on ctx (NULL input propagates). */
typedef dt_tensor *(*dt_pipe_unit_fn)(dt_ctx *ctx, dt_model *m, const struct dt_pipe_unit *u, dt_tensor *x);

/* One layer of a model for cutting into stages. */
typedef struct dt_pipe_unit {
    char name[64];            /* "transformer.h.3" */
    char params[4][64];       /* the parameters it uses: entry names equal to one of these or under it
                                 ("transformer.wte" covers "transformer.wte.weight"); "" unused */
    dt_module *module;        /* forward by dt_module_forward(module) when fn is NULL; borrowed */
    dt_pipe_unit_fn fn;       /* or this */
    double cost;              /* its compute per input row (token), in multiply-adds: what the stages are
                                 balanced by (dt_pipe_unit_costs); >= 0 */
} dt_pipe_unit;

/* The units of model m, in forward order, into *units (malloc'd; free with
 * dt_free) and *n, each with its cost:
 *   - the Llama zoo models: [model.embed_tokens, model.layers.0, ...,
 *     model.layers.{L-1} (each decoder layer whole), model.norm, lm_head];
 *   - the GPT zoo models: [transformer.wte+wpe (embeddings),
 *     transformer.h.0.ln_1+attn, transformer.h.0.ln_2+mlp, ..., h.{L-1}'s
 *     two halves, transformer.ln_f, lm_head]: a block is cut between its
 *     attention and its MLP (x + attn(ln_1(x)), then x + mlp(ln_2(x)))
 *     unless the block itself carries hooks, a forward override or
 *     activation checkpointing when the units are made (then it is one
 *     unit: its whole forward runs them; hooks added to a cut block later
 *     fail its forward with an error). Costs per token: the weights' elements
 *     (multiply-adds), attention's T C (causal QK^T and AV, T the block
 *     size, C this rank's width), the tied head's GEMM V C (its parameter
 *     is stored as the embeddings' wte, but the head does the work) plus the
 *     cross-entropy, and the element-wise work of norms, residuals, GELU and
 *     the embedding gather;
 *   - the "mlp" zoo model: [w0, w1]; a model whose root is a Sequential: its
 *     children. Cost: the parameter count (a Linear's multiply-adds per row).
 * DT_ERR_UNSUPPORTED for other models. */
DT_API dt_status dt_model_pipe_units(dt_model *m, dt_pipe_unit **units, int *n);

/* What stages are balanced by. */
typedef enum dt_pipe_balance_by {
    DT_PIPE_BY_COMPUTE = 0, /* the units' cost (dt_pipe_unit.cost): their compute */
    DT_PIPE_BY_PARAMS,      /* their parameter elements (a tied entry counts in each unit naming it) */
    DT_PIPE_BY_TIME         /* their forward + backward wall time measured on a sample input
                               (dt_pipe_unit_times; the strategy: dt_pipe_params.sample) */
} dt_pipe_balance_by;

/* cost[0..n) of the n units by `by`. DT_ERR_INVALID_ARG for a negative or
 * non-finite cost, and for DT_PIPE_BY_TIME (measured: dt_pipe_unit_times). */
DT_API dt_status dt_pipe_unit_costs(const dt_model *m, const dt_pipe_unit *units, int n, dt_pipe_balance_by by,
                                    double *cost);

/* cost[0..n): the seconds each of the n units of m takes, forward plus
 * backward, run as a pipeline stage runs it: on input x for the first unit
 * (the model's input: contiguous, batch first; one micro-batch, e.g. the
 * trainer batch / micro_batches rows) and unit i's output for unit i + 1,
 * each unit's input (but the first's) a leaf that requires grad, its
 * backward from its output with a gradient of ones (the last unit is timed
 * without the loss), under autocast in `autocast` (DT_F32: off; bf16, f16).
 * One warm-up pass, then `reps` (1..1000) passes over all the units in
 * turn; each unit's least time is kept. Wall time on this rank only (no
 * collective of its own): under tensor parallelism every rank of the tp
 * group must call it together with the same x shape (the units' layers
 * communicate). The model's gradients, buffers and dropout counters are
 * restored afterwards (lazy gradient marks become zeros); its hooks run.
 * Errors: DT_ERR_INVALID_ARG (reps, an empty or non-contiguous x), a unit's
 * failure on its input (e.g. x of the wrong shape) wrapped with the unit's
 * index, name and input shape. */
DT_API dt_status dt_pipe_unit_times(dt_model *m, const dt_pipe_unit *units, int n, const dt_tensor *x,
                                    dt_dtype autocast, int reps, double *cost);

/* Cut n units of costs cost[0..n) into S = p v stages, stage s on rank
 * s % p (v stages per rank: the interleaved schedule's chunks):
 * starts[0..S) (starts[0] = 0, increasing, each stage at least one unit).
 * The busiest RANK (the sum of its v stages) is as small as possible, then
 * the largest stage. v = 1: exact (dynamic programming). v > 1: the
 * per-stage optimum improved by a pruned search over the cuts (exact up to
 * 4 Mi search nodes, past which the best cut found stands; deterministic,
 * so every rank cuts alike). DT_ERR_INVALID_ARG when n < S, p or v are out
 * of range (1 <= p <= 256, p v <= 1024) or a cost is negative or not
 * finite. */
DT_API dt_status dt_pipe_balance(const double *cost, int n, int p, int v, int *starts);

/* ---- the strategy --------------------------------------------------------------- */

typedef struct dt_pipe_params {
    int pp;                   /* pipeline ranks p (the world is dp x pp, pipeline ranks adjacent:
                                 rank = dp_index * pp + stage_rank; with a mesh, its "pp" size);
                                 default 2 */
    dt_pipe_kind schedule;    /* default DT_PIPE_1F1B */
    int micro_batches;        /* m: each trainer micro-batch (its batch dim) is split into m equal
                                 parts; the batch must divide; default 4 */
    int chunks;               /* v, stages per rank; interleaved only (0: 2 there, 1 elsewhere) */
    dt_pipe_balance_by balance; /* without cuts: what dt_pipe_balance balances (default
                                 DT_PIPE_BY_COMPUTE) */
    const dt_trainer_batch *sample; /* DT_PIPE_BY_TIME (and no cuts): a batch of the model's input
                                 to time the units on (only x is read: x, x_dtype, x_ndim,
                                 x_shape, contiguous, batch first), e.g. one micro-batch of the
                                 training data (the trainer batch / micro_batches rows): the
                                 times are for that many rows. The same shape on every rank
                                 (checked at attach); copied by dt_strategy_pipe_init. Required
                                 by DT_PIPE_BY_TIME (DT_ERR_INVALID_ARG naming it), unused
                                 otherwise; default NULL */
    const int *cuts;          /* NULL: stages balanced by `balance` (dt_pipe_balance); else
                                 the first unit of stages 1..S-1 (S-1 increasing entries); borrowed
                                 until attach */
    int ncuts;
    int zero;                 /* the data-parallel dimension: 0 DDP (each replica steps its stages'
                                 parameters whole, gradients all-reduced), 1 ZeRO-1 (the replicas of a
                                 stage split its parameters' optimizer state and fp32 masters evenly:
                                 gradients reduce-scattered once per batch after the last micro-batch,
                                 each steps its share, the shares all-gathered); default 0 */
    dt_mesh *mesh;            /* NULL: the world is placed as dp x pp (no tensor parallelism). Else
                                 the dp x tp x pp mesh of dt_pipe_mesh_init over the strategy's
                                 world, whose "tp" group the model's tensor-parallel layers use;
                                 borrowed, must outlive the strategy. Default NULL */
    dt_init_rng init_rng;     /* a meta model (dt_model_build_params.meta): the generator of its
                                 initial values (dt_model_init_range); default DT_INIT_PHILOX */
    uint64_t init_seed;       /* a meta model: the build's seed; default 0 */
} dt_pipe_params;
DT_API dt_pipe_params dt_pipe_params_default(void);

/* The process mesh of 3-D parallelism: world = dp x tp x pp ranks as a
 * mesh with dims ("dp", "tp", "pp"), row-major, so world rank
 * (d tp + t) pp + s is replica d, tensor-parallel rank t, pipeline rank s
 * (tp = 1: the strategy's own dp x pp layout; pp = 1: dt_tp_groups'
 * layout). Its dim groups are the data-parallel group (dim 0), the
 * tensor-parallel group to build the model with (dim 1:
 * dt_mesh_dim_group(mesh, 1) as dt_model_config.tp) and the pipeline
 * (dim 2). Collective over world; DT_ERR_INVALID_ARG when tp x pp does not
 * divide the world size. Free with dt_mesh_free after the strategy. */
DT_API dt_status dt_pipe_mesh_init(dt_pg *world, int tp, int pp, dt_mesh **out);

/* The "pipe" strategy over world (borrowed; must outlive the strategy):
 * world size = dp x p->pp, or dp x tp x pp with p->mesh. At attach
 * (collective) it takes the pipeline and data-parallel groups from the
 * mesh (its own dp x 1 x pp one without p->mesh), cuts the model, builds
 * and checks the table. Each trainer micro-batch runs the schedule (loss x
 * 1/m per micro-batch, so gradients equal the whole batch's); the
 * strategy's wait sums tied parameters' gradients between stages and
 * averages the gradients over the dp replicas (once per step); after the
 * step the tied parameters' owners send them to the other stages.
 *
 * Tensor parallelism inside a stage: build the model with the mesh's tp
 * group (dt_model_config.tp); the tp ranks of a stage run the same table
 * in step (their layers' collectives over tp), each sending its own copy
 * of the activations to the same tp rank of the next stage; a
 * tensor-parallel slice's gradient is averaged over dp like any other.
 *
 * Losses come from the last stage and are sent to every rank of its
 * pipeline (the trainer's reported loss is the same everywhere); the
 * strategy's allreduce_sum is the sum over the replicas (the world sum
 * over the tp x pp ranks of each replica, which hold the same values).
 * Evaluation (dt_trainer_evaluate) runs each batch through the stages,
 * forward only and whole (not split into micro-batches), in stage order:
 * each rank its own stages with its own parameters, activations sent on
 * by point to point; the last stage computes the loss and accuracy and
 * sends its sums to every rank of its pipeline. No rank needs another
 * stage's parameters (and the model is on no rank whole: a model's own
 * forward, dt_model_forward, on a pipeline rank reads undefined values for
 * the other stages). Generation likewise (dt_strategy_pipe_generate: each
 * token's window through the stages, the last stage picks it with
 * dt_model_generate's sampler and sends it along the pipeline). Checkpoints (dt_trainer_save / _load):
 * each pipeline rank writes the tensors and optimizer state of its own
 * stages under their global names, collectively over world (replicas
 * dealt by dt_ckpt_save), so a checkpoint saved with any pp (or in one
 * process) loads into any other; a load reads each rank's own stages
 * (ZeRO-1: its share), then the shares are gathered and the shared
 * parameters sent from their owners, as after a step. With tensor parallelism
 * each tp rank writes its share of its stages' full tensors (gathered over
 * tp), so such a checkpoint too is the single-process one and loads at any
 * dp, tp and pp.
 *
 * Failures: a rank that cannot finish its schedule (an error in its stage's
 * forward, loss or backward, a dead or failed peer) fails the pipeline
 * group, so the other ranks' steps fail at once with its message ("pipeline
 * rank r broke off its schedule: ...") instead of waiting for the group's
 * timeout (shm and mpi backends alike), and no later message can be
 * matched with one of the abandoned schedule: every later step fails too.
 * Each rank of that pipeline also fails its data-parallel and
 * tensor-parallel groups and the world, so the other replicas' steps (which
 * wait for this one's gradients, activations or agreement) fail at once
 * with the same cause too (over MPI with DT_MPI_BLOCKING=1, a blocking
 * collective already under way waits until mpirun ends the job).
 * The strategy cannot resume; start again from a checkpoint.
 * DT_ERR_INVALID_ARG when
 * world is not a multiple
 * of pp, the mesh is not one of dt_pipe_mesh_init over world, the
 * schedule's limits fail, or DT_PIPE_BY_TIME has no sample (at init) or
 * samples of different shapes on the ranks (at attach). */
DT_API dt_status dt_strategy_pipe_init(dt_pg *world, const dt_pipe_params *p, dt_strategy **out);

/* What the strategy measured in its last step on this rank (after attach;
 * NULL otherwise): seconds computing and waiting, peak bytes of
 * micro-batch activations (the contexts of in-flight micro-batches) and
 * the largest number in flight. */
typedef struct dt_pipe_stats {
    double busy_s;            /* forward/backward compute of the last step */
    double step_s;            /* wall time of the last step's schedule */
    double start_s, end_s;    /* when it started and ended (dt_time_s: CLOCK_MONOTONIC, comparable
                                 between the ranks of one machine: a step's makespan is the latest
                                 end less the earliest start) */
    size_t peak_act_bytes;    /* peak arena bytes of micro-batches in flight */
    int peak_inflight;        /* most micro-batches in flight at once */
    double wait_s;            /* of the last step: time blocked on received activations and
                                 gradients (the part of the idle time spent in waits) */
    int waits;                /* and the number of those waits */
    int stage_first, stage_count; /* this rank's stages: stage_first + k p, k < stage_count */
    int unit_lo[64], unit_hi[64]; /* units [lo, hi) of each of its stages */
} dt_pipe_stats;
DT_API dt_status dt_strategy_pipe_stats(const dt_strategy *s, dt_pipe_stats *out);
/* The cut of an attached "pipe" strategy s (the same on every rank):
 * *nstages = S = pp x v, starts[0..S] the stages' first units (starts[S]:
 * the number of units; stage i runs on pipeline rank i % pp), and, when
 * param_bytes is not NULL, param_bytes[0..S) the bytes of the parameters
 * each stage's units use (a shared one, such as a tied embedding, in every
 * stage that uses it). cap: room in starts (S + 1; param_bytes: S), else
 * DT_ERR_RANGE naming S (*nstages set); DT_ERR_INVALID_ARG when s is not an
 * attached pipe strategy. */
DT_API dt_status dt_strategy_pipe_cut(const dt_strategy *s, int *starts, size_t *param_bytes, int cap, int *nstages);
/* dt_model_generate (models.h) under the "pipe" strategy, for a GPT-2 zoo
 * model: on every rank of the pipeline with the same arguments (collective
 * over the pipeline; each replica's pipeline generates on its own, to the
 * same tokens). Each new token is a forward of the last block_size tokens
 * through the stages, as an evaluation runs (each rank its own stages'
 * parameters, eval mode, no gradients; no key/value cache: the window is
 * run again for every token); the last stage picks it from its logits
 * exactly as dt_model_generate does (same temperature, top-k and Philox
 * draw for the seed), then sends it to every rank of its pipeline, so
 * every rank returns the same out, equal to dt_model_generate's on the
 * whole model with the same weights. A rank that fails (bad arguments
 * included) fails its pipeline, so the others fail at once with its
 * message. s: an attached strategy (dt_trainer_strategy; a "pipe" one
 * runs through its stages, any other generates on each rank as
 * dt_model_generate), DT_ERR_INVALID_ARG when it is not attached;
 * DT_ERR_UNSUPPORTED with tensor parallelism
 * (tp > 1: the vocabulary-parallel head leaves each tp rank a slice of the
 * logits). */
struct dt_generate_params;
DT_API dt_status dt_strategy_pipe_generate(dt_strategy *s, const struct dt_generate_params *gp,
                                           const int64_t *prompt, int64_t nprompt, int64_t *out, int64_t cap,
                                           int64_t *nout);
/* When each message between the stages moved in the last step, on this
 * rank (dt_time_s, comparable between the ranks of one machine): t holds
 * n = 3 x 2 S m doubles (S = pp x chunks stages, m micro-batches), three
 * blocks of 2 S m indexed (dir S + stage) m + mb, where dir 0 is the
 * activation `stage` sends to stage + 1 and dir 1 the input gradient it
 * sends to stage - 1: block 0 the time this rank posted the send, block 1
 * the time it began waiting for the receive, block 2 the time that wait
 * ended; 0 where this rank did not send / receive it. The wait end less
 * the later of the wait's start and the sender's post is what the handoff
 * cost beyond the schedule (bench/pipe_bubble prints it). DT_ERR_INVALID_ARG
 * when n is not that size or s is not an attached pipe strategy. */
DT_API dt_status dt_strategy_pipe_msg_times(const dt_strategy *s, double *t, size_t n);

/* The fields of one action's entry in a trace (dt_strategy_pipe_trace). */
enum {
    DT_PIPE_TRACE_BEGIN = 0, /* the executor reached the action (dt_time_s) */
    DT_PIPE_TRACE_RUN,       /* compute actions: their computing began, after the wait for their
                                message (F on stage > 0: the activation; B / BI below the last
                                stage: the gradient); sends and receives: = BEGIN */
    DT_PIPE_TRACE_DONE,      /* computing ended (busy_s sums DONE - RUN); sends and receives: = END */
    DT_PIPE_TRACE_END,       /* the action ended (after giving a finished micro-batch's context back) */
    DT_PIPE_TRACE_CPU,       /* compute actions: the thread's CPU seconds from RUN to DONE (the compute
                                without the time other processes held the core); sends and receives:
                                from BEGIN to END (posting; less than the wall time when another thread
                                or process held the core meanwhile) */
    DT_PIPE_TRACE_N
};
/* This rank's actions in the last step and when each ran: *acts its list
 * (the strategy's table, n actions, as dt_pipe_schedule_actions gives),
 * *t DT_PIPE_TRACE_N x n doubles, action i's at t[DT_PIPE_TRACE_N i + field]
 * (times dt_time_s, comparable with dt_pipe_stats.start_s and between the
 * ranks of one machine). Both borrowed: valid until the strategy is freed,
 * overwritten by the next step. Between two actions' END and BEGIN nothing
 * runs; BEGIN to RUN is the wait for the message; DONE to END the
 * bookkeeping after it. bench/pipe_bubble prints the timeline and replays
 * the table with the measured costs (dt_pipe_schedule_simulate_costs).
 * DT_ERR_INVALID_ARG when s is not an attached pipe strategy. */
DT_API dt_status dt_strategy_pipe_trace(const dt_strategy *s, const dt_pipe_action **acts, const double **t,
                                        int *n);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PIPELINE_H */
