/* dtrain/pipe_strategy.h — the "pipe" training strategy: pipeline stages
 * (pipeline.h's schedules, units and cut) run by the trainer (train.h),
 * with data parallelism over the replicas and tensor parallelism inside a
 * stage.
 *
 * Overview
 * --------
 * The strategy cuts the model into stages at attach (dt_model_pipe_units,
 * dt_pipe_balance or the caller's cuts), builds and checks the schedule's
 * table (pipeline.h) and runs it for every trainer micro-batch.
 *
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
 */
#ifndef DTRAIN_PIPE_STRATEGY_H
#define DTRAIN_PIPE_STRATEGY_H

#include "dtrain/pipeline.h"
#include "dtrain/train.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* What the strategy's executor measured in its last step on this rank
 * (dt_pipe_stats, pipeline.h). DT_ERR_INVALID_ARG when s is not an attached
 * pipe strategy. */
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
#endif /* DTRAIN_PIPE_STRATEGY_H */
