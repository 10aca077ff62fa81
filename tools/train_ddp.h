/* tools/train_ddp.h — the data-parallel side of `dtrain train` (owned by the
 * DDP work; the train command's files, train_run.h, call these). Not a public
 * interface.
 *
 * With world size 1 (no launcher) everything here is a no-op and the
 * command trains exactly as before. With world size > 1 (`dtrain run -n N`,
 * torchrun, mpirun...): a process group from the environment, the "ddp"
 * strategy for the library's trainer (optionally with SyncBatchNorm), a
 * DistributedSampler for the training set, the test set split into
 * contiguous per-rank ranges, and only rank 0 printing progress and writing
 * metrics. The step itself (DDP wait, loss agreement, stop agreement) is
 * the trainer's (train.h). */
#ifndef DT_TOOLS_TRAIN_DDP_H
#define DT_TOOLS_TRAIN_DDP_H

#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "dtrain/mesh.h"
#include "dtrain/nn.h"
#include "dtrain/parallel.h"
#include "dtrain/pipeline.h"
#include "dtrain/plan.h"
#include "dtrain/train.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct dt__ddp_run {
    dt_plan *plan;    /* the layout (plan.h): owns the groups and the mesh below */
    dt_pg *pg;        /* NULL at world size 1 */
    dt_strategy *strategy; /* "ddp" or "none"; owned here until handed to the trainer */
    const dt_strategy *used; /* the strategy the trainer owns (borrowed, for the summary) */
    int rank, world;
    bool sync_bn;
    double bucket_mb; /* 0 = default (25) */
    int nconverted;   /* BatchNorm2d modules switched to SyncBatchNorm */
    /* ZeRO / FSDP (--zero, --fsdp): stage 0 = DDP */
    int stage;
    bool hybrid;      /* --fsdp hybrid_shard */
    bool hier;        /* --hierarchical-allreduce / AIAK_HIERARCHICAL_ALLREDUCE */
    dt_zero_params zp;
    /* tensor parallelism (--tp): the world is split into tp groups of adjacent
       ranks and dp groups across them; pg, rank and world above are then the
       data-parallel group's (pg NULL when it has one rank) */
    int tp;           /* ranks per tensor-parallel group (1 = none) */
    int tp_rank;      /* this rank in its tensor-parallel group */
    dt_pg *tp_pg;     /* NULL without --tp */
    dt_pg *world_pg;  /* every rank (the plan's; NULL on one rank without ZeRO) */
    /* context parallelism (--cp): each replica's sequence over cp ranks; pg above is then the
       dp x cp gradient group, rank and world the replica's index and count */
    int cp;           /* ranks per sequence (1 = none) */
    int cp_rank;      /* this rank's place in its cp group */
    dt_cp_params cpp; /* the model's (dt_model_config.cp; group borrowed from the plan) */
    /* pipeline parallelism (--pp): world = dp x pp, pipelines of adjacent
       ranks; rank and world above are the data-parallel index and count,
       the strategy splits world_pg itself */
    int pp;           /* ranks per pipeline (1 = none) */
    int pp_rank;      /* this rank's place in its pipeline */
    const char *pp_sched; /* --pp-schedule (borrowed) */
    dt_pipe_balance_by pp_balance; /* --pp-balance */
    const dt_trainer_batch *pp_sample; /* --pp-balance time: the first micro-batch of the training data
                                          (borrowed until dt__ddp_wrap) */
    int pp_micro;     /* --micro-batches */
    /* communication hook (--comm-hook, AIAK_* over it): DDP only */
    dt_comm_hook_kind hook;
    dt_powersgd_params psgd;
} dt__ddp_run;

struct dt__train_opts;
/* Read the world from the environment and, if it has more than one rank
 * (or a ZeRO stage is asked for), create the process group (collective).
 * Returns 0 or an exit code after printing one line. */
int dt__ddp_setup(dt__ddp_run *r, const struct dt__train_opts *o);
/* train_loop.c: takes a pending stop signal, if any, and returns the one taken (0: none; arg unused): polled by the
 * process group's start-up (dt_plan_params.interrupted), so that Ctrl-C there does not wait the start-up
 * bound out. */
int dt__tr_stop_pending(void *arg);

/* Whether the model is to be built meta (stage 3: each rank initialises
 * only its shards; --pp without tp or time balancing: each rank only its
 * stages), and with which generator the strategy fills them. */
bool dt__ddp_lazy_model(const dt__ddp_run *r);

/* After the model exists: SyncBatchNorm conversion and the strategy for
 * the trainer ("ddp" over the group, else "none"). Returns 0 or an exit code. */
int dt__ddp_wrap(dt__ddp_run *r, dt_model *m);
/* Hand the strategy to dt_trainer_init (which owns it from then on). */
dt_strategy *dt__ddp_take_strategy(dt__ddp_run *r);

/* The ranks the gradients reduce over: the data-parallel ones, times cp
 * with --cp (1 without a group). */
int dt__ddp_reduce_size(const dt__ddp_run *r);

/* Whether this rank prints and writes files (rank 0). */
bool dt__ddp_is_main(const dt__ddp_run *r);

/* One line about DDP for the final report ("" at world size 1). */
void dt__ddp_summary(const dt__ddp_run *r, int64_t steps, char *buf, size_t n);

/* --hierarchical-allreduce: say once (rank 0) what the topology found.
 * Returns 0 or an exit code. */
int dt__ddp_say_hierarchy(const dt__ddp_run *r);

/* ZeRO / FSDP: print (rank 0) one line about the units and one per rank with
 * the model-state bytes it holds and its peak RSS (collective; nothing for
 * DDP). */
int dt__ddp_memory_report(const dt__ddp_run *r, const dt_trainer *tr);
/* Bytes for people: "12.5 KiB", "1.31 MiB", "2.00 GiB", "512 B". */
void dt__human_bytes(double b, char *buf, size_t n);

/* Release the DDP handle (before the model) and the group (last). */
void dt__ddp_free_ddp(dt__ddp_run *r);
void dt__ddp_free_group(dt__ddp_run *r);

#endif
