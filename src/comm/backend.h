/* src/comm/backend.h — what a built-in backend needs from the group layer.
 *
 * The backend table itself, dt_backend_ops, is public (include/dtrain/comm.h,
 * "writing a backend"): built-in backends and user backends implement the
 * same, versioned table. Contract, once more, for implementers:
 *
 *   slot        required?  default when NULL
 *   ----------  ---------  ---------------------------------------------
 *   version     yes        (must equal DT_BACKEND_VERSION)
 *   name        yes        —
 *   init        yes        —            collective; set *ctx
 *   free        yes        —
 *   run         yes        —            one operation, blocking, in order
 *   kinds       no         0 = every dt_coll_kind is handled by run
 *   mem_alloc   no         dt_alloc (plain memory)
 *   mem_free    no         dt_free
 *   subgroup    no         DT_ERR_UNSUPPORTED
 *   abort       no         nothing
 *   job_cleanup, orphan_cleanup
 *               no         nothing to remove (0 removed)
 *
 * Threading: run/subgroup/mem_* of one ctx are never called concurrently
 * (the group's executor lock is held), but successive calls may come from
 * different threads (the caller's or the progress thread): an MPI backend
 * needs MPI_THREAD_SERIALIZED at least.
 *
 * Errors: return a negative dt_status after dt_error(); the group layer
 * copies the message into the request, marks the group failed and fails
 * every later request with the same status. A backend should honour
 * c->timeout_s (DT_ERR_TIMEOUT naming kind, seq and the missing ranks) and
 * report dead peers as DT_ERR_PEER_FAILED (the mpi backend checks the
 * processes of its peers on the same machine: comm/proc_alive.h); backends
 * that cannot should say so in their file's header.
 *
 * The MPI backend: src/comm/mpi/backend_mpi.c (built only when MPI is found)
 * defines `const dt_backend_ops dt__backend_mpi` with name "mpi". The
 * registry references it whenever that file exists (registry.c checks with
 * __has_include), so no other change is needed to add it. The group layer
 * picks "mpi" by default when the ranks came from Open MPI / PMI / Slurm
 * variables (see comm.h); dt_backend_info then carries those ranks.
 */
#ifndef DT_COMM_BACKEND_H
#define DT_COMM_BACKEND_H

#include "dtrain/comm.h"

/* Built-in backends. */
extern const dt_backend_ops dt__backend_self;
extern const dt_backend_ops dt__backend_shm;

/* ---- helpers shared by backends ------------------------------------- */

/* dst[i] = op(srcs[0][i], ..., srcs[nsrc-1][i]) for i < count, sources
 * combined in array order (fixed order = reproducible bits). dst may alias
 * any source element-for-element. f16/bf16 accumulate in f32 and round
 * once. For DT_REDUCE_AVG the partial result is the sum; pass avg_div = W
 * on the final reduction to divide (integers truncate), 0 otherwise. */
void dt__reduce(dt_dtype dt, dt_reduce_op op, void *dst, const void *const *srcs, int nsrc,
                size_t count, int avg_div);

/* f32 sum (div = 0) or avg (div = W) of ns sources into nd destinations in
 * one pass; nt: streaming stores (large messages). Same bits as
 * dt__reduce. Destinations may alias sources element for element. */
void dt__reduce_f32_multi(float *const *dst, int nd, const float *const *src, int ns, size_t n,
                          int div, int nt);

/* Divide count elements of buf by w in place (the end of an avg). */
void dt__avg_finish(dt_dtype dt, void *buf, size_t count, int w);

/* Large copies (non-temporal stores past the cache size). */
void dt__copy(void *dst, const void *src, size_t bytes);

/* Copy m elements from element sa of layout sb of src to element da of
 * layout db of dst (blocks.c; a NULL layout is contiguous from element 0;
 * a layout's elements are taken run by run). es: element size. */
void dt__blk_copy(void *dst, const dt_pg_block *db, size_t da, const void *src,
                  const dt_pg_block *sb, size_t sa, size_t m, size_t es);

/* W blocks at once, in lockstep (run i of block 0, run i of block 1, ...,
 * then run i+1: interleaved blocks are walked in address order): scatter
 * copies m[j] elements of contiguous srcs[j] to elements [a, a + m[j]) of
 * layout db[j] of dst; gather copies elements [a, a + m[j]) of layout sb[j]
 * of src to contiguous dsts[j]. */
void dt__blk_scatter(void *dst, const dt_pg_block *db, const void *const *srcs, size_t a,
                     const size_t *m, int W, size_t es);
void dt__blk_gather(void *const *dsts, const void *src, const dt_pg_block *sb, size_t a,
                    const size_t *m, int W, size_t es);

/* A one-line description of an operation for messages:
 * "allreduce(count=10, f32, sum) #5". Returns buf. */
char *dt__coll_describe(const dt_coll *c, char *buf, size_t n);

/* May a thread that waits for a peer inside a backend's run busy-poll
 * (beyond a short pause-spin) instead of sleeping? Yes on an application
 * thread (it has nothing else to do); on a group's progress thread only
 * while an application thread is blocked waiting on that group: otherwise
 * the application computes meanwhile and the poll takes the core it
 * computes on (ZeRO-3 and DDP reduce in the background, and a rank's
 * progress threads and compute threads together outnumber its cores). The
 * send/recv batches nap on the progress thread for the same reason. In
 * both cases not while another group's progress thread of this process
 * runs an operation: it takes the core the waiting thread leaves. */
int dt__comm_may_poll(void);

/* Environment helpers: integer / double value of a variable, or def if
 * unset; a set but malformed value is an error. */

#endif /* DT_COMM_BACKEND_H */
