/* dtrain/trace.h — the timeline of a run: spans and counters per rank,
 * written as Chrome trace JSON (opens in Perfetto and chrome://tracing).
 *
 * What it records, per rank (one trace process per rank, "rank N"):
 *   - on the thread that runs the steps ("main"): the step, forward and
 *     backward per unit (a unit's forward with its FLOPs in `args.flop`,
 *     counted by the op table from the ops it recorded), recomputation, the optimizer, data loading,
 *     checkpoint staging and writing, pipeline actions (F/B/BI/BW/send/recv
 *     per micro-batch), and the time it spent blocked on communication
 *     (cat "wait": the exposed part of communication);
 *   - one row per process group ("comm <group>"): each collective from the
 *     moment it started running to its completion, with its kind, bytes,
 *     group, group size and sequence number in `args` (`seq`: the same
 *     operation has the same group and seq on every rank), and how long it
 *     was queued behind earlier ones (`queued_us`, from when it was posted);
 *   - counters: memory in use (RSS) and the loss scale, once per step.
 * Timestamps are microseconds from a base shared by all ranks (the caller
 * aligns the clocks: dt_trace_set_offset with an offset measured through
 * the process group, dt_pg_clock_offset in comm.h).
 *
 * Lifecycle (process-wide: one tracer per process, i.e. per rank):
 *
 *     dt_trace_params tp = dt_trace_params_default();
 *     tp.dir = "run/trace";                     // must exist
 *     dt_trace_open(&tp, rank, world);          // allocates the ring once
 *     dt_trace_set_offset(off_us, base_us);     // aligned clocks
 *     for each step s: dt_trace_step(s); ...    // spans inside [A, B) only
 *     dt_trace_close();                         // writes DIR/rank-N.json
 *     // after every rank closed (a barrier): one of them
 *     dt_trace_merge("run/trace", world, NULL); // DIR/trace.json
 *
 * Off (never opened, or closed) the record calls are a load and a branch:
 * no allocation, no clock read, nothing kept. On, events go into a ring of
 * `capacity` fixed-size records (the newest kept), written in place from
 * any thread without allocation. Files are written complete or not at all
 * (temporary + fsync + rename), never through a symlink.
 *
 * The trainer (train.h: dt_trainer_params.trace) opens and closes the
 * tracer itself and records its own spans; the comm layer records every
 * collective; the pipeline executor its actions. A program records its own
 * spans with dt_trace_now / dt_trace_span. */
#ifndef DTRAIN_TRACE_H
#define DTRAIN_TRACE_H

#include "dtrain/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Span categories (the `cat` field; the summary and the plot colour by it). */
typedef enum dt_trace_cat {
    DT_TRACE_STEP = 0,   /* one optimizer step, micro-batches included */
    DT_TRACE_FORWARD,    /* a unit's forward */
    DT_TRACE_BACKWARD,   /* a unit's backward */
    DT_TRACE_RECOMPUTE,  /* activation checkpointing's second forward */
    DT_TRACE_OPTIM,      /* unscale, clip, the optimizer's update, the strategy's after-step */
    DT_TRACE_DATA,       /* waiting for the next batch */
    DT_TRACE_CKPT,       /* checkpoint staging and writing */
    DT_TRACE_PIPE,       /* a pipeline action (F, B, BI, BW, send, recv) */
    DT_TRACE_COMM,       /* a collective or point-to-point operation (its group's row) */
    DT_TRACE_WAIT,       /* this thread blocked on communication */
    DT_TRACE_OTHER,      /* anything else a program records */
    DT_TRACE_CAT_COUNT
} dt_trace_cat;

/* The category's name in the JSON ("step", "forward", ...). */
DT_API const char *dt_trace_cat_name(dt_trace_cat c);

typedef struct dt_trace_params {
    const char *dir;     /* where DIR/rank-N.json is written (must exist); NULL: off; default NULL */
    int64_t step_begin;  /* the first step recorded (steps count from 1); default 3 (after warm-up) */
    int64_t step_end;    /* one past the last step recorded; <= 0: no end; default 5 */
    size_t capacity;     /* events kept (the newest; older ones are overwritten and counted);
                            default 65536 (about 8 MiB) */
} dt_trace_params;

/* Defaults as listed above. */
DT_API dt_trace_params dt_trace_params_default(void);

/* Parse "A:B" (steps A to B-1; "A:" no end) into p->step_begin/step_end.
 * DT_ERR_INVALID_ARG naming the text when it is not two integers with
 * 1 <= A < B. */
DT_API dt_status dt_trace_parse_steps(const char *s, dt_trace_params *p);

/* Start recording for this process (rank of world). Rank 0 locks the
 * directory (flock) until dt_trace_close: another job's rank 0 opening it
 * meanwhile gets DT_ERR_STATE, so two jobs never write one directory's
 * rank files. DT_ERR_STATE also when a tracer is already open in this
 * process, DT_ERR_INVALID_ARG for a bad field (the dir missing or not a
 * directory, capacity 0), DT_ERR_NO_MEMORY. */
DT_API dt_status dt_trace_open(const dt_trace_params *p, int rank, int world);
/* True while a tracer is open (whether or not the step is in its window). */
DT_API bool dt_trace_is_open(void);
/* Clock alignment: this rank's monotonic clock reads offset_us more than
 * rank 0's, and base_us (on rank 0's clock) is time 0 of the trace. */
DT_API void dt_trace_set_offset(double offset_us, double base_us);
/* The step now starting: spans are kept while it lies in [step_begin, step_end). */
DT_API void dt_trace_step(int64_t step);
/* The clock in µs (this rank's monotonic clock) while recording; 0 when
 * off or outside the window (then dt_trace_span with t0 0 does nothing). */
DT_API double dt_trace_now(void);
/* A span from t0 (dt_trace_now) to now on the calling thread. name is
 * copied (truncated to 39 bytes). A t0 of 0 is a no-op. */
DT_API void dt_trace_span(dt_trace_cat cat, const char *name, double t0);
/* The same with a micro-batch / unit index in args ("mb"; < 0: none) and
 * a start of the compute inside the span (run_us > t0: the part before it
 * was waiting; 0: none). */
DT_API void dt_trace_span_ex(dt_trace_cat cat, const char *name, double t0, double t1, int mb, double run_us);
/* dt_trace_span with the FLOPs of the span's work in args ("flop",
 * rounded to an integer; <= 0: none). The trainer gives each unit's forward
 * span the FLOPs its ops recorded on the tape (dt_ag_tape_flops, ops.h). */
DT_API void dt_trace_span_flop(dt_trace_cat cat, const char *name, double t0, double flop);
/* A communication operation on the row of its group: kind ("allreduce"),
 * group name, world rank of the group's first member, group size, seq,
 * bytes, peer (-1: none); ago_* are how many seconds before now it was
 * posted, started and completed (the flight recorder's view). */
DT_API void dt_trace_comm(const char *kind, const char *group, int group_lead, int group_size, uint64_t seq,
                          size_t bytes, int peer, double ago_posted, double ago_started, double ago_done);
/* A counter sample now ("memory" bytes, "loss_scale"). */
DT_API void dt_trace_counter(const char *name, double value);
/* Events kept, dropped (overwritten) and bytes the tracer holds (0, 0, 0 when off). */
DT_API void dt_trace_stats(size_t *kept, size_t *dropped, size_t *bytes);
/* Write DIR/rank-N.json and free everything (a no-op when off). */
DT_API dt_status dt_trace_close(void);

/* Merge dir/rank-0.json .. rank-(world-1).json into out (NULL:
 * dir/trace.json): one trace with every rank's process, each collective's
 * `wait_peers_us` (how long this rank waited for the last rank of the group
 * to start it) and `last_rank` (the rank that started it last) added to its
 * args; a send and its receive likewise (matched by group, direction and
 * the pair's sequence number). DT_ERR_IO / DT_ERR_FORMAT name the file that is missing or wrong. */
DT_API dt_status dt_trace_merge(const char *dir, int world, const char *out);

/* ---- reading a merged trace back (dtrain trace summary) ---------------- */

#define DT_TRACE_MAX_RANKS 4096

/* One step of one rank: its step span split into compute, the
 * communication it waited for (exposed) and idle (neither), all in ms;
 * data loading before it. Pipeline runs: the bubble over the step's
 * pipeline window, (window - this rank's compute) / its compute, beside
 * the formula (p - 1) / (v m) of GPipe / 1F1B / interleaved for p ranks
 * per pipeline, v stages per rank and m micro-batches; -1 when the rank
 * ran no pipeline action. */
typedef struct dt_trace_step_row {
    int64_t step;
    int rank;
    double step_ms, compute_ms, comm_ms, idle_ms, data_ms;
    double bubble, bubble_formula;
    int stages, chunks, micro; /* p, v, m of the formula */
} dt_trace_step_row;

/* One collective matched across the ranks of its group: the rank that
 * started it last (the one the others waited for) and the longest wait. */
typedef struct dt_trace_coll_row {
    char kind[32], group[40];
    uint64_t seq, bytes;
    int64_t step;
    int last_rank, ranks;
    double max_wait_ms, max_ms;
} dt_trace_coll_row;

/* Time spent per (category, name), summed over ranks and steps. */
typedef struct dt_trace_op_row {
    char cat[16], name[40];
    int count;
    double total_ms, max_ms;
} dt_trace_op_row;

typedef struct dt_trace_summary {
    int world;                      /* processes (ranks) in the file */
    dt_trace_step_row *steps;       /* [nsteps], by step then rank */
    size_t nsteps;
    dt_trace_coll_row *colls;       /* [ncolls], longest wait first */
    size_t ncolls;
    dt_trace_op_row *ops;           /* [nops], most time first */
    size_t nops;
    double made_wait_ms[DT_TRACE_MAX_RANKS]; /* per rank: the others' waits for it, summed */
} dt_trace_summary;

/* Read a merged trace (dt_trace_merge) into *out (free with
 * dt_trace_summary_free). DT_ERR_IO / DT_ERR_FORMAT name the file and
 * what is wrong. */
DT_API dt_status dt_trace_summarize(const char *path, dt_trace_summary **out);
DT_API void dt_trace_summary_free(dt_trace_summary *s);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TRACE_H */
