/* dtrain/pipeline.h — pipeline parallelism: schedules as action tables,
 * a model's units and their cut into stages, the executor's measurements.
 * The "pipe" training strategy that runs them is in pipe_strategy.h (the
 * train layer); this header does not depend on the trainer.
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
 * Stages. A model is a list of units (layers, dt_model_pipe_units), which
 * the model itself describes (nn.h, dt_model_set_pipe_units): the GPT is
 * [embeddings, block 0's two halves, ..., block L-1's, ln_f, lm_head], the
 * MLP [w0, w1], a model whose root is a Sequential its children. Stages are
 * consecutive runs of units, cut where the caller says or balanced by the
 * units' compute (the default: estimated per unit; or by parameter count;
 * or by measured time): the busiest rank's compute as small as possible.
 * Measured time (DT_PIPE_BY_TIME, dt_pipe_unit_times): at attach, before
 * the cut (every rank still holds the whole model), every rank runs every
 * unit's forward and backward on a sample micro-batch the caller gives
 * (dt_pipe_params.sample, pipe_strategy.h), one warm-up then 3
 * repetitions, keeping each unit's least; the world then takes the mean of
 * the ranks' times (rank 0's copy of it), so every replica of a stage cuts
 * alike. With tensor parallelism
 * the tp ranks time in step (their layers' collectives match: the
 * sample's shape is checked to be the same on every rank first). The loss
 * is not timed (the last unit is timed on its output).
 *
 * Split backward (zbh1): BI is dt_backward_input and BW dt_backward_weight
 * (autograd.h): nodes with a parameter input are walked for their other
 * inputs first and queued; their weight-gradient kernels run at BW.
 *
 * Usage: train with the "pipe" strategy (pipe_strategy.h). Cut a model by
 * hand:
 *
 *     dt_pipe_unit *u;  int n;
 *     if (dt_model_pipe_units(m, &u, &n) < 0) fail(dt_last_error());
 *     double c[n];  int starts[2];
 *     dt_pipe_unit_costs(m, u, n, DT_PIPE_BY_COMPUTE, c);
 *     dt_pipe_balance(c, n, 2, 1, starts);            // two stages: units [0, starts[1]), [starts[1], n)
 *     dt_free(u);
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

/* A model's units (dt_pipe_unit, dt_pipe_unit_fn) are declared in nn.h:
 * the file that builds a model registers how it is cut
 * (dt_model_set_pipe_units); what follows reads them. */

/* The units of model m, in forward order, into *units (allocated; free
 * with dt_free) and *n, each with its cost: what m's units function
 * (dt_model_set_pipe_units, nn.h) lists, or, for a model without one
 * whose root is a Sequential, its children, each costing its parameter
 * count (a Linear's multiply-adds per row). The zoo's models register
 * theirs (models.h: the GPT cut between the two halves of each block, the
 * Llama per decoder layer, the MLP per weight). DT_ERR_UNSUPPORTED for
 * other models (and an empty Sequential), an error of the units function,
 * and DT_ERR_INVALID_ARG when it lists no units, a unit without a module
 * or function, or a negative or non-finite cost. */
DT_API dt_status dt_model_pipe_units(dt_model *m, dt_pipe_unit **units, int *n);
/* Does unit u use the model entry named `entry` (equal to one of u's
 * params or under it: "transformer.wte" covers "transformer.wte.weight")? */
DT_API bool dt_pipe_unit_uses(const dt_pipe_unit *u, const char *entry);

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

/* ---- placement and the executor's measurements -------------------------------- */

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

/* What the executor measured in its last step on this rank (the "pipe"
 * strategy gives it: dt_strategy_pipe_stats): seconds computing and waiting, peak bytes of
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

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PIPELINE_H */
