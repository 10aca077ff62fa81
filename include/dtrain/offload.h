/* dtrain/offload.h — ZeRO-Offload / ZeRO-Infinity: optimizer state in files
 * on a fast disk, streamed with asynchronous I/O; and the up-front check of
 * model-state memory.
 *
 * Overview
 * --------
 * DeepSpeed's `offload_optimizer` / `offload_param` move model state off the
 * accelerator: `device: cpu` to host memory, `device: nvme` to files under
 * `nvme_path`. dtrain computes on the CPU, so:
 *
 *   - `device: cpu` changes nothing: the state already lives in host
 *     memory. dt_offload_announce() says so in one log line.
 *   - `device: nvme` keeps the optimizer state (SGD's momentum, Adam's
 *     exp_avg and exp_avg_sq) of the ranges a rank steps in files. The
 *     optimizer step runs sub-group by sub-group (sub_group_size elements):
 *     sub-group i is stepped while i+1 (and up to buffer_count - 1 ahead) is
 *     read and i-1 is written, so disk time overlaps the arithmetic. Only
 *     buffer_count sub-groups of state are in memory at any time.
 *   - with ZeRO stage 3, `offload_param` `device: nvme` keeps each
 *     rank's parameter shards in files of a store too: see "Parameter
 *     offload" in parallel.h (dt_zero_params.offload_param, dt_zero_step).
 *
 * The store (dt_nvme_store) is the file layer: regions of bytes, each one
 * file in a per-run directory `nvme_path/dtrain-offload-PID-XXXXXX` made for
 * it (mkdir: a name that exists, a symlink included, is never reused), each
 * file created with O_CREAT|O_EXCL|O_NOFOLLOW, sized up front with
 * posix_fallocate (a full disk is an error naming the file and the bytes at
 * open time, not in the middle of a step), and removed with the directory
 * by dt_nvme_store_close. Reads and writes are asynchronous requests
 * (tickets) served by one of three engines, chosen at run time:
 *   io_uring  (liburing, when built with it and the kernel allows it),
 *   POSIX AIO (aio_read/aio_write),
 *   a thread  (pread/pwrite on a helper thread);
 * `io` (or the environment variable DT_OFFLOAD_IO=uring|aio|thread) picks
 * one; AUTO takes the first that works in that order and
 * dt_nvme_store_io() reports which. Every request is checked when waited
 * for: a short or failed transfer is an error naming the file, the offset
 * and the errno text, never silently wrong data. A process writing under
 * RLIMIT_FSIZE must ignore SIGXFSZ to get EFBIG as an error instead of
 * being killed (the library does not change signal dispositions).
 *
 * The driver (dt_offload_optim) steps an optimizer (optim.h) over ranges
 * whose state lives in a store. Build the optimizer over NO ranges (it then
 * holds only hyper-parameters, learning rate and step count, and allocates
 * no state); the driver calls dt_optim_step_part per sub-group with the
 * state it swapped in. Results are bit-identical to the in-memory optimizer
 * (SGD, Adam, AdamW, Lion; LAMB's whole-tensor norms do not split: unsupported).
 *
 * Lifecycle: dt_nvme_store_open / dt_nvme_store_close, dt_offload_optim_init
 * / dt_offload_optim_free (free the driver before its optimizer and the
 * flats its ranges point at). Tickets are valid until waited for once.
 * A store and a driver are used from one thread.
 *
 * Usage
 * -----
 *     dt_offload_params op = dt_offload_params_default();
 *     dt_offload_parse("nvme:/mnt/nvme", &op);               // or fill the fields
 *     op.sub_group_size = 1 << 24;
 *     dt_adam_params ap = dt_adamw_params_default();
 *     dt_optim *o;        dt_optim_adamw_init(&ap, NULL, 0, &o);   // no ranges: no state
 *     dt_optim_range r = {.params = P, .grads = G, .lo = 0, .hi = P->total};
 *     dt_offload_optim *d;
 *     if (dt_offload_optim_init(&op, o, &r, 1, &d) < 0) fail(dt_last_error());
 *     for (step...) { ...backward...; dt_optim_set_lr(o, lr); dt_offload_optim_step(d); }
 *     dt_offload_optim_free(d);  dt_optim_free(o);             // files removed
 *
 * Memory planning: dt_mem_model_states() estimates the bytes of parameters,
 * gradients and optimizer state a rank holds (the ZeRO paper's 2+2+K model,
 * in dtrain's f32 terms), and dt_mem_check() compares what
 * the ranks on this machine need with MemAvailable (/proc/meminfo) and
 * RLIMIT_AS, so a run that cannot fit fails at start with DT_ERR_NO_MEMORY
 * naming the bytes, before it allocates anything large.
 */
#ifndef DTRAIN_OFFLOAD_H
#define DTRAIN_OFFLOAD_H

#include "dtrain/base.h"
#include "dtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parameters ----------------------------------------------------------------- */

typedef enum dt_offload_device {
    DT_OFFLOAD_NONE = 0, /* state in memory (no offload) */
    DT_OFFLOAD_CPU,      /* host memory: on a CPU system, the same as NONE */
    DT_OFFLOAD_NVME,     /* files under nvme_path */
} dt_offload_device;

typedef enum dt_offload_io {
    DT_OFFLOAD_IO_AUTO = 0, /* DT_OFFLOAD_IO from the environment, else uring, aio, thread: the first that works */
    DT_OFFLOAD_IO_URING,    /* io_uring through liburing */
    DT_OFFLOAD_IO_AIO,      /* POSIX AIO */
    DT_OFFLOAD_IO_THREAD,   /* pread/pwrite on a helper thread */
    DT_OFFLOAD_IO_COUNT
} dt_offload_io;

/* DeepSpeed's offload_optimizer / offload_param keys and the
 * engine. For offload_param, buffer_count is the number of parameter shards
 * (units) that may be in memory at once, reads ahead included (DeepSpeed's
 * default there is 5: dt_zero_params_default sets it). */
typedef struct dt_offload_params {
    dt_offload_device device; /* default DT_OFFLOAD_NONE */
    const char *nvme_path;    /* NVME: an existing directory (borrowed); default NULL (required) */
    size_t sub_group_size;    /* elements stepped per sub-group; default 1e9 (DeepSpeed's) */
    int buffer_count;         /* sub-groups of state in memory at once, >= 1 (1: no overlap);
                                 default 4 (DeepSpeed's) */
    bool pin_memory;          /* accepted; buffers are ordinary memory on a CPU system; default false */
    bool fast_init;           /* accepted; state files start as zeros without being written either
                                 way (posix_fallocate); default false */
    dt_offload_io io;         /* default DT_OFFLOAD_IO_AUTO */
    /* offload_param only (parameter offload, dt_zero_params.offload_param, parallel.h): */
    size_t buffer_size;       /* elements of one parameter buffer: a unit's shard must fit, else
                                 dt_zero_init refuses naming the unit; default 1e8 (DeepSpeed's) */
    size_t max_in_cpu;        /* accepted, no effect: shards not in flight always live in the
                                 files; default 1e9 (DeepSpeed's) */
} dt_offload_params;

/* Defaults as listed above. */
DT_API dt_offload_params dt_offload_params_default(void);
/* "cpu" or "nvme:DIR" (the CLI's --offload) into p's device and nvme_path
 * (pointing into spec, which must outlive p). DT_ERR_INVALID_ARG otherwise. */
DT_API dt_status dt_offload_parse(const char *spec, dt_offload_params *p);
/* "auto", "uring", "aio", "thread"; and the reverse (DT_ERR_INVALID_ARG). */
DT_API const char *dt_offload_io_name(dt_offload_io io);
DT_API dt_status dt_offload_io_parse(const char *s, dt_offload_io *out);
/* Log (DT_LOG_WARN, so it shows by default) what p means here: for CPU
 * that nothing changes on a CPU system; for NVME the path, sub-group size
 * and buffers. Nothing for NONE. */
DT_API void dt_offload_announce(const dt_offload_params *p);

/* ---- the NVMe store --------------------------------------------------------------- */

typedef struct dt_nvme_store dt_nvme_store;

/* Create the per-run directory under p->nvme_path and start the I/O engine
 * (p->io). Errors: DT_ERR_INVALID_ARG (no path, device not NVME; naming
 * the path: missing or not a directory), DT_ERR_IO naming the path (the
 * run directory cannot be made in it: not writable, full),
 * DT_ERR_UNSUPPORTED (an engine asked for by name is not available). */
DT_API dt_status dt_nvme_store_open(const dt_offload_params *p, dt_nvme_store **out);
/* Wait for outstanding requests, remove every file and the directory, free.
 * NULL is a no-op. */
DT_API void dt_nvme_store_close(dt_nvme_store *s);
/* Add a region of nbytes (zeros), in a new file named name (letters,
 * digits, '.', '_', '-'; unique in the store); *id receives its index.
 * A full disk or a file-size limit is DT_ERR_IO naming the file and bytes. */
DT_API dt_status dt_nvme_store_add(dt_nvme_store *s, const char *name, size_t nbytes, int *id);
/* Post an asynchronous read of n bytes at byte offset off of region id into
 * buf (or a write from buf); *ticket identifies it. buf is borrowed until
 * the ticket is waited for. DT_ERR_RANGE when [off, off + n) is outside
 * the region. */
DT_API dt_status dt_nvme_store_read(dt_nvme_store *s, int id, size_t off, void *buf, size_t n, uint64_t *ticket);
DT_API dt_status dt_nvme_store_write(dt_nvme_store *s, int id, size_t off, const void *buf, size_t n,
                                     uint64_t *ticket);
/* Wait until request `ticket` is complete; its error (DT_ERR_IO naming the
 * file, offset and errno) if it failed. Ticket 0 is a no-op. */
DT_API dt_status dt_nvme_store_wait(dt_nvme_store *s, uint64_t ticket);
/* Wait for every outstanding request; the first error among them. */
DT_API dt_status dt_nvme_store_wait_all(dt_nvme_store *s);
/* The engine in use (never AUTO) and the run directory (borrowed). */
DT_API dt_offload_io dt_nvme_store_io(const dt_nvme_store *s);
DT_API const char *dt_nvme_store_dir(const dt_nvme_store *s);

/* Counters since open. */
typedef struct dt_nvme_stats {
    uint64_t bytes_read, bytes_written; /* completed transfers */
    uint64_t reads, writes;             /* requests */
    double wait_s;                      /* seconds spent blocked in wait calls */
} dt_nvme_stats;
DT_API void dt_nvme_store_stats(const dt_nvme_store *s, dt_nvme_stats *out);

/* ---- the offload optimizer driver -------------------------------------------------------- */

typedef struct dt_offload_optim dt_offload_optim;

/* A driver stepping o (borrowed; created over no ranges, see the overview)
 * over ranges[0..nrange) (copied, segments too) with o's state in a store
 * it opens under p (device NVME). The state starts at zero, as a fresh
 * optimizer's. Errors: the store's, DT_ERR_INVALID_ARG (o has ranges of its
 * own, buffer_count < 1, sub_group_size 0), DT_ERR_UNSUPPORTED (LAMB),
 * range errors as dt_optim_*_init. */
DT_API dt_status dt_offload_optim_init(const dt_offload_params *p, dt_optim *o, const dt_optim_range *ranges,
                                       size_t nrange, dt_offload_optim **out);
/* Free the driver and its store (files removed). NULL is a no-op. */
DT_API void dt_offload_optim_free(dt_offload_optim *d);
/* One optimizer step over every range, sub-group by sub-group, with o's
 * learning rate and step count; advances o's step count by one. On an I/O
 * error the step stops (the error names the file); a sub-group already
 * written keeps its update, so treat the state as lost. */
DT_API dt_status dt_offload_optim_step(dt_offload_optim *d);
/* One optimizer step of range r only (every sub-group of it), with o's
 * learning rate and step count, which does not advance (the caller sets it
 * after the last range: parameter offload steps unit by unit, dt_zero_step). */
DT_API dt_status dt_offload_optim_step_range(dt_offload_optim *d, size_t r);
/* Read n floats of state i (dt_optim_state order) of range r, starting at
 * element lo of the range (global index), into dst, synchronously (tests,
 * checkpoints). */
DT_API dt_status dt_offload_optim_read_state(dt_offload_optim *d, size_t r, int i, size_t lo, size_t n, float *dst);
/* The driver's store (borrowed) and its shape. */
DT_API dt_nvme_store *dt_offload_optim_store(const dt_offload_optim *d);
DT_API size_t dt_offload_optim_num_subgroups(const dt_offload_optim *d);
/* Bytes of state buffers the driver holds in memory. */
DT_API size_t dt_offload_optim_buffer_bytes(const dt_offload_optim *d);

/* ---- model-state memory --------------------------------------------------------------- */

/* What one rank holds, in bytes. */
typedef struct dt_mem_estimate {
    double params;     /* parameters (f32: 4 per element; stage 3: this rank's shard) */
    double grads;      /* gradients */
    double optim;      /* optimizer state in memory (offloaded to NVMe: the buffers only) */
    double master;     /* fp32 master weights under mixed precision (0 in f32 training) */
    double total;      /* the sum */
} dt_mem_estimate;

/* How a run keeps its model state. */
typedef struct dt_mem_policy {
    size_t numel;                /* parameters (elements) */
    int world;                   /* data-parallel ranks sharing the state (>= 1) */
    int zero_stage;              /* 0 (DDP) .. 3 */
    dt_optim_kind optimizer;     /* SGD states 0 or 4 bytes (momentum), Adam(W)/LAMB 8, Lion 4 */
    bool sgd_momentum;           /* SGD with momentum */
    int param_bytes;             /* bytes of a parameter/gradient element: 4 (f32) or 2 (bf16/f16) */
    bool master_weights;         /* mixed precision: fp32 master copy (4 bytes) kept by the optimizer */
    dt_offload_device offload;   /* NVME: optimizer state (and master weights) in files */
    size_t offload_buffer_bytes; /* NVME: the driver's buffers (dt_offload_optim_buffer_bytes) */
    bool param_offload;          /* stage 3 parameter offload (dt_zero_params.offload_param NVME):
                                    the parameter shards are in files */
    size_t param_buffer_bytes;   /* param_offload: the shards' buffers in memory (at most
                                    buffer_count shards) */
} dt_mem_policy;

/* The ZeRO memory model per rank: parameters P = b*psi (stage 3: /world;
 * with param_offload: param_buffer_bytes),
 * gradients G = b*psi (stage >= 2: /world), optimizer state K*psi (stage >=
 * 1: /world) with K = 8 (Adam: exp_avg + exp_avg_sq), 4 (SGD momentum) or
 * 0, master weights 4*psi under mixed precision (stage >= 1: /world); shards
 * are ceil(psi / world) elements. With b = 2, master weights and Adam this
 * is the paper's (2 + 2 + 12) psi. */
DT_API dt_status dt_mem_model_states(const dt_mem_policy *p, dt_mem_estimate *out);

/* Memory this process may still use: the smaller of MemAvailable
 * (/proc/meminfo) and RLIMIT_AS minus the address space in use
 * (/proc/self/statm); *mem_available and *as_left (may be NULL) get the two
 * (SIZE_MAX when unknown or unlimited). */
DT_API dt_status dt_mem_available(size_t *mem_available, size_t *as_left);

/* Fail early: DT_ERR_NO_MEMORY when `local_ranks` processes on this
 * machine, each needing `per_rank` bytes, do not fit in MemAvailable, or one
 * rank's need exceeds what RLIMIT_AS leaves. The message names `what`, the
 * bytes needed and the bytes available ("DDP on 2 ranks with adamw: model
 * state needs 16.0 GiB per rank (32.0 GiB on this machine); 21.3 GiB
 * available (MemAvailable)") and suggests sharding or offload. */
DT_API dt_status dt_mem_check(const char *what, double per_rank, int local_ranks);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OFFLOAD_H */
