/* dtrain/mesh.h — process meshes, distributed tensors, reshard.
 *
 * Overview
 * --------
 * A process mesh (dt_mesh) is an N-d array of world ranks with a name per
 * dimension, like PyTorch's DeviceMesh and Paddle's ProcessMesh. Any
 * permutation or subset of the world is a mesh: on 6 ranks
 *     ids [[2,4,5],[0,1,3]], dims ("x","y")
 * puts rank 2 at (0,0), rank 3 at (1,2). A rank outside the mesh gets a mesh
 * it is not in (dt_mesh_coord() == -1); a job may hold several meshes (the
 * stages of a pipeline). dt_mesh_init builds, once, one process group per
 * mesh dimension (the ranks that differ only in that coordinate) with
 * dt_pg_split; it is collective over the world group.
 *
 * A distributed tensor (dt_dtensor) is a local tensor plus a mesh and one
 * placement per mesh dimension:
 *   dt_shard(d)      tensor dim d is split over that mesh dim (torch.chunk
 *                    semantics: chunk c = ceil(n/k), coordinate i holds
 *                    [i c, min((i+1) c, n)), so the last coordinates may hold
 *                    less or nothing: n=5, k=4 gives 2,2,1,0);
 *   dt_replicate()   every coordinate holds the whole extent;
 *   dt_partial(op)   every coordinate holds a partial value; the real value
 *                    is op (sum, avg, max, min) over the coordinates.
 * A tensor dim may be sharded by at most one mesh dim (nested sharding is an
 * error), and all Partial placements of one tensor use the same op.
 * Placements are checked on every rank before any communication, so a bad
 * one (Shard(2) of a 2-d tensor, a wrong count) is the same error on every
 * rank, naming the tensor, the dimension and the mesh, never a hang.
 *
 * Reshard (dt_reshard) changes placements, one mesh dimension at a time:
 *   R -> S(d)     local slice, no communication
 *   S(d) -> R     all-gather(v) along d
 *   P -> R        all-reduce(op)
 *   P -> S(d)     reduce-scatter(v)(op) along d
 *   S(i) -> S(j)  all-to-all(v)
 *   R -> P(op)    sum: coordinate 0 keeps the value, others hold zeros
 *                 (Paddle's r_to_p; exact for integers); avg/max/min: all
 *                 keep it
 *   S -> P        S -> R, then R -> P
 *   P(a) -> P(b)  a == b: nothing; else P(a) -> R -> P(b)
 * Each transition is one function in src/parallel/reshard_<from>_<to>.c,
 * registered in a table (src/parallel/dtensor/reshard_table.c). On an N-d mesh the
 * mesh dims are done in an order that moves the fewest bytes: local slices
 * first, then reduce-scatters, all-to-alls, all-reduces, all-gathers last
 * (an S(i)->S(j) pair that would cross nests through Replicate). To another
 * mesh (same global shape and dtype), the source is first made
 * Partial-free on its own mesh, every rank of the target mesh receives the
 * intersection of its box with each source box by batched point to point
 * over the world group (one replica of a source box per destination, spread
 * over the replicas), and Partial target placements are applied locally.
 *
 * Gradients. Reshard and the dtensor ops are differentiable (they record on
 * the context's tape with dt_ag_custom). The gradient of a dtensor is the
 * gradient of the GLOBAL tensor it stands for, held in the same placements
 * except that Partial becomes Replicate (DTensor's and Megatron's
 * convention: the loss is counted once, a replicated gradient is whole on
 * every coordinate). So the backward of a reshard is the reshard of the
 * gradient back (S->R backward is a local slice, R->S backward an
 * all-gather, P->R backward the identity, P->S backward an all-gather),
 * and dt_backward(ctx, loss->local) on every rank of the loss's mesh starts
 * it (a Replicate or Partial(sum|avg) scalar loss both seed 1). Gradients
 * are f32 (autograd.h).
 *
 * Partial(max|min) is not linear, so its pieces' gradients are their own:
 * the local gradient of a P(max|min) piece is the gradient of that piece.
 * A reshard that reduces a P(max|min) mesh dim (to Replicate, Shard or
 * another op) sends the gradient of the reduced value to the pieces equal
 * to it, split evenly among ties (torch.amax's rule: k pieces holding the
 * maximum get g/k each), the others 0; backward recomputes the reduction
 * from a copy of the input and counts the ties (one all-reduce each). A
 * reshard TO P(max|min) sums its pieces' gradients over that dim (R ->
 * P(max) keeps a copy on every coordinate: the copies' gradients add up).
 * (PyTorch's DTensor gives every piece the whole gradient, as for sum; that
 * is not the derivative of max.) Start backward from a reduced loss, not
 * from a P(max|min) one.
 *
 * Lifetimes. A dtensor made with ctx == NULL is persistent (free it with
 * dt_dtensor_free; its local tensor is owned and may be a parameter: call
 * dt_tensor_set_requires_grad on it). One made with a ctx, and every op
 * result, is a temporary of that context, valid until dt_ctx_reset. The mesh
 * is borrowed by every dtensor on it: free dtensors before their mesh, the
 * mesh before its world group. On a rank outside the mesh a dtensor's local
 * tensor has every dim 0 (a 0-d one holds a single zero) and no
 * communication happens there.
 *
 * Usage (Paddle's placement demo, 6 ranks)
 * -----
 *     dt_pg *world;  dt_pg_init(NULL, &world);
 *     dt_mesh *mesh;
 *     int ids[] = {2, 4, 5, 0, 1, 3};
 *     if (dt_mesh_init(world, 2, (int[]){2, 3}, ids, (const char *[]){"x", "y"}, &mesh) < 0)
 *         fail(dt_last_error());
 *     float a[12] = {1,2,3, 4,5,6, 7,8,9, 10,11,12};
 *     dt_tensor *full = dt_tensor_wrap(a, DT_F32, 2, (int64_t[]){4, 3});
 *     dt_dtensor *d;
 *     dt_shard_tensor(NULL, mesh, full, (dt_placement[]){dt_shard(0), dt_shard(1)}, &d);
 *     // rank 4 (x=0, y=1) holds rows 0-1, column 1: {2, 5}
 *     dt_ctx *ctx;  dt_ctx_init(NULL, &ctx);
 *     dt_dtensor *r = dt_reshard(ctx, d, NULL, (dt_placement[]){dt_replicate(), dt_replicate()});
 *     // r->local is the whole 4x3 tensor on every rank
 *     dt_ctx_free(ctx); dt_dtensor_free(d); dt_tensor_free(full);
 *     dt_mesh_free(mesh); dt_pg_free(world);
 */
#ifndef DTRAIN_MESH_H
#define DTRAIN_MESH_H

#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "dtrain/optim.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MESH_MAX_DIMS 4
#define DT_MESH_NAME_MAX 16

/* ---- process meshes ---------------------------------------------------- */

/* A process mesh (opaque). */
typedef struct dt_mesh dt_mesh;

/* Build a mesh of shape[0] x ... x shape[ndim-1] world ranks (ndim 1..4):
 * ranks[] lists them row-major (NULL = 0, 1, ..., numel-1), distinct, each in
 * [0, world size); names[] gives a name per dim (NULL = "d0", "d1", ...;
 * distinct, non-empty, < DT_MESH_NAME_MAX chars). Collective over world:
 * every world rank calls it with the same arguments (checked: different
 * arguments are DT_ERR_MISMATCH on every rank), members and non-members
 * alike; it makes one group per mesh dim with dt_pg_split. world is
 * borrowed and must outlive the mesh. Errors: DT_ERR_INVALID_ARG (bad
 * shape, rank, duplicate, name), DT_ERR_MISMATCH, the split's errors. */
DT_API dt_status dt_mesh_init(dt_pg *world, int ndim, const int *shape, const int *ranks,
                              const char *const *names, dt_mesh **out);
/* Free a mesh made by dt_mesh_init or dt_mesh_slice (its groups, for the
 * former). Free slices before their parent. NULL is a no-op. */
DT_API void dt_mesh_free(dt_mesh *m);

/* The sub-mesh of m with dim `dim` fixed at `index` (ndim - 1 dims; m must
 * have >= 2 dims): of [[0,1,2],[3,4,5]] (x, y), slice(x, 1) is [3,4,5] (y).
 * Not collective: it borrows m's groups (a line along another dim lies in
 * one slice). Ranks of m outside the slice get a mesh they are not in.
 * E.g. the 1-d mesh of this rank's row: dt_mesh_slice(m, 0, dt_mesh_coord(m, 0)). */
DT_API dt_status dt_mesh_slice(dt_mesh *m, int dim, int index, dt_mesh **out);

/* Number of dims; size of dim d (d == -1: number of ranks in the mesh). */
DT_API int dt_mesh_ndim(const dt_mesh *m);
DT_API int dt_mesh_size(const dt_mesh *m, int d);
/* Name of dim d (borrowed), or NULL for a bad d. */
DT_API const char *dt_mesh_dim_name(const dt_mesh *m, int d);
/* Index of the dim called name, or -1. */
DT_API int dt_mesh_dim_index(const dt_mesh *m, const char *name);
/* The world ranks, row-major (dt_mesh_size(m, -1) entries; borrowed). */
DT_API const int *dt_mesh_ranks(const dt_mesh *m);
/* World rank at coords (ndim entries), or -1 when out of range. */
DT_API int dt_mesh_rank_at(const dt_mesh *m, const int *coords);
/* Coordinates of a world rank into coords[ndim]; DT_ERR_NOT_FOUND (no
 * message set) when it is not in the mesh. */
DT_API dt_status dt_mesh_coords_of(const dt_mesh *m, int world_rank, int *coords);
/* Is this process in the mesh? This rank's coordinate along dim d (-1 when
 * it is not in the mesh or d is bad). */
DT_API bool dt_mesh_contains_self(const dt_mesh *m);
DT_API int dt_mesh_coord(const dt_mesh *m, int d);
/* The group of this rank's line along dim d (its rank there is
 * dt_mesh_coord(m, d)); NULL when not in the mesh. Borrowed. */
DT_API dt_pg *dt_mesh_dim_group(const dt_mesh *m, int d);
/* The world group the mesh was built over (borrowed). */
DT_API dt_pg *dt_mesh_world(const dt_mesh *m);
/* "mesh(x=2,y=3)[2,4,5,0,1,3]" into buf; returns buf. */
DT_API char *dt_mesh_str(const dt_mesh *m, char *buf, size_t n);

/* ---- placements ----------------------------------------------------------- */

typedef enum dt_placement_kind {
    DT_PLACE_REPLICATE = 0,
    DT_PLACE_SHARD,
    DT_PLACE_PARTIAL,
} dt_placement_kind;

/* One mesh dim's placement. Build with dt_replicate(), dt_shard(d),
 * dt_partial(op). */
typedef struct dt_placement {
    dt_placement_kind kind;
    int dim;          /* Shard: tensor dim (negative counts from the end) */
    dt_reduce_op op;  /* Partial: sum, avg, max or min */
} dt_placement;

static inline dt_placement dt_replicate(void)
{
    dt_placement p = {DT_PLACE_REPLICATE, 0, DT_REDUCE_SUM};
    return p;
}
static inline dt_placement dt_shard(int dim)
{
    dt_placement p = {DT_PLACE_SHARD, dim, DT_REDUCE_SUM};
    return p;
}
static inline dt_placement dt_partial(dt_reduce_op op)
{
    dt_placement p = {DT_PLACE_PARTIAL, 0, op};
    return p;
}
/* "[Shard(0), Replicate(), Partial(sum)]" into buf; returns buf. */
DT_API char *dt_placements_str(const dt_placement *p, int n, char *buf, size_t len);
/* torch.chunk: piece i of n elements over k: *start, *len (len may be 0). */
DT_API void dt_chunk_range(int64_t n, int k, int i, int64_t *start, int64_t *len);

/* ---- distributed tensors ---------------------------------------------------- */

enum {
    DT_DTENSOR_PERSISTENT = 1u << 0, /* malloc'd: dt_dtensor_free frees it and its local */
};

/* Plain data: read the fields, change them only through the functions. */
typedef struct dt_dtensor {
    dt_mesh *mesh;                              /* borrowed */
    dt_tensor *local;                           /* this rank's piece (numel 0 outside the mesh) */
    dt_placement placements[DT_MESH_MAX_DIMS];  /* one per mesh dim, dims normalised >= 0 */
    int ndim;                                   /* global ndim (= local->ndim) */
    int64_t shape[DT_MAX_DIMS];                 /* global shape */
    dt_dtype dtype;
    const char *name;                           /* borrowed; shown in errors; may be NULL */
    uint32_t flags;                             /* DT_DTENSOR_* */
} dt_dtensor;

/* The extent this rank (coords) holds of a global tensor: start[d], len[d]
 * per tensor dim. Checks the placements (count, Shard dims, nesting, one
 * Partial op) first: errors name `what`, the dim and the mesh. coords NULL
 * = this rank's (DT_ERR_NOT_FOUND without message when not in the mesh). */
DT_API dt_status dt_dtensor_local_box(const dt_mesh *m, const dt_placement *pl, int ndim,
                                      const int64_t *shape, const int *coords, const char *what,
                                      int64_t *start, int64_t *len);

/* Wrap this rank's local piece as a dtensor (no copy, no communication).
 * shape: the global shape (local->ndim entries); NULL = the local shape with
 * each sharded dim times the mesh dim size (even shards only). The local
 * shape must be the one the placements give this rank (else DT_ERR_SHAPE).
 * ctx NULL: a persistent struct (dt_dtensor_free; local stays borrowed),
 * else a temporary. */
DT_API dt_status dt_dtensor_from_local(dt_ctx *ctx, dt_mesh *m, dt_tensor *local,
                                       const dt_placement *pl, const int64_t *shape,
                                       dt_dtensor **out);

/* Distribute `full` (the whole tensor, the same on every rank of the mesh)
 * with placements pl: each rank keeps its slice (Partial: see R -> P).
 * No communication. ctx NULL: persistent (owned local, a copy); else a
 * temporary, differentiable when full requires grad. Ranks outside the
 * mesh may pass full (only its shape and dtype are used) and get an empty
 * local. Errors name full->name (or "tensor"), the dim and the mesh. */
DT_API dt_status dt_shard_tensor(dt_ctx *ctx, dt_mesh *m, dt_tensor *full,
                                 const dt_placement *pl, dt_dtensor **out);

/* Like dt_shard_tensor, but `full` is read only on the mesh rank at
 * coordinates 0 (dt_mesh_ranks(m)[0]); the others pass NULL and give dtype,
 * ndim and shape, which must match (checked). A scatter: each rank receives
 * only its slice. Collective over the mesh. ctx as in dt_shard_tensor (not
 * differentiable). */
DT_API dt_status dt_shard_tensor_from_root(dt_ctx *ctx, dt_mesh *m, const dt_tensor *full,
                                           dt_dtype dtype, int ndim, const int64_t *shape,
                                           const dt_placement *pl, dt_dtensor **out);

/* The whole tensor on every rank of the mesh (reshard to all Replicate,
 * then the local). Collective over the mesh; a temporary of ctx,
 * differentiable. Outside the mesh: an empty tensor. NULL on error. */
DT_API dt_tensor *dt_dtensor_full(dt_ctx *ctx, dt_dtensor *x);

/* Free a persistent dtensor (and the local it owns). NULL and temporaries
 * are ignored. */
DT_API void dt_dtensor_free(dt_dtensor *x);

/* "name: shape [4,3] f32 on mesh(x=2,y=3)[...] [Shard(0), Replicate()]". */
DT_API char *dt_dtensor_str(const dt_dtensor *x, char *buf, size_t n);

/* ---- reshard -------------------------------------------------------------------- */

/* x with placements pl on mesh `to` (NULL = x's mesh): a temporary of ctx,
 * differentiable. Collective over x's mesh (and, across meshes, over the
 * ranks of both: every rank of either mesh calls it; others may too and get
 * an empty result). Same global shape and dtype; NULL on error (the
 * placements are checked before anything moves). Supported dtypes: those
 * of the collectives (f32, f64, f16, bf16, i32, i64, u8; max/min/sum).
 * Before any data moves the ranks compare their source and target
 * placements, global shape, dtype and meshes (one small all-reduce per
 * mesh dim; across meshes that together hold every rank, one over the
 * world): ranks that disagree all fail with DT_ERR_MISMATCH naming the
 * tensor and both variants ("some pass [Shard(0)] -> [Replicate()],
 * others [Shard(0)] -> [Shard(1)]"). DT_RESHARD_CHECK=0 turns the check
 * off (a disagreement is then left to the comm layer's mismatch check).
 * Cost: the collective of each step (strided layouts in place, no pack or
 * unpack), its output in ctx, and the check: about a microsecond on an
 * idle machine, but a point where every rank must be running, the only
 * one of a local transition such as R -> S (docs/BENCHMARKS.md). Across
 * meshes, boxes that are one contiguous run are sent from the input and
 * received into the output directly. The result never aliases x. */
DT_API dt_dtensor *dt_reshard(dt_ctx *ctx, dt_dtensor *x, dt_mesh *to, const dt_placement *pl);

/* ---- ops on distributed tensors (sharding propagation) ------------------------------
 * Each op picks, per mesh dim, a strategy its local op can run (PyTorch
 * DTensor's sharding propagation), choosing the combination whose input
 * reshards move the fewest bytes,
 * reshards the inputs (differentiably), and runs the autograd op of
 * autograd.h on the local pieces. Inputs must be on the same mesh. Results
 * are temporaries of ctx; NULL on error (a NULL input gives NULL and keeps
 * the earlier message). Where no strategy applies the error names the op,
 * the inputs' placements and the mesh. Strategies per mesh dim:
 *   matmul   a[..., M, K] @ b[K, N] (or batched b[..., K, N]):
 *              [R, R] -> R;  [S(m or batch of a), R] -> same Shard;
 *              [R, S(N)] -> S(-1) (column parallel);
 *              [S(K), S(K)] -> Partial(sum) (row parallel);
 *              [S(b), S(b)] -> S(b) for a batch dim b of a batched b;
 *              [P(sum|avg), R] / [R, P(sum|avg)] -> that Partial
 *   add, sub, mul, div (NumPy broadcasting): R; Shard of an output dim (an
 *              operand broadcast along it stays Replicate); Partial(sum|avg)
 *              for add/sub (both operands; a Replicate one becomes Partial
 *              by R -> P), for mul (one operand) and div (the numerator)
 *   relu, gelu: R or any Shard (Partial is reduced first)
 *   softmax, log_softmax (last dim), layer_norm (last dim; gamma, beta [D]
 *              Replicate): R or Shard of any dim but the last
 *   sum, mean (all elements -> 0-d): R -> R; Shard -> Partial(sum);
 *              Partial(sum|avg) -> the same
 *   cross_entropy (logits [N, C], labels [N] i32/i64, mean over rows not
 *              labelled -100): R -> R; rows Shard(0) -> Partial(sum) (each
 *              rank's mean weighted by its share of the counted rows: one
 *              small all-reduce of the count)
 * Gradients: an input Replicate on a mesh dim where the output is not gets
 * its gradient all-reduced over that dim in backward (the data-parallel
 * weight, the column-parallel activation), so every gradient follows the
 * convention in the overview. */
DT_API dt_dtensor *dt_dtensor_matmul(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b);
DT_API dt_dtensor *dt_dtensor_add(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b);
DT_API dt_dtensor *dt_dtensor_sub(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b);
DT_API dt_dtensor *dt_dtensor_mul(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b);
DT_API dt_dtensor *dt_dtensor_div(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b);
DT_API dt_dtensor *dt_dtensor_relu(dt_ctx *ctx, dt_dtensor *x);
DT_API dt_dtensor *dt_dtensor_gelu(dt_ctx *ctx, dt_dtensor *x);
DT_API dt_dtensor *dt_dtensor_softmax(dt_ctx *ctx, dt_dtensor *x);
DT_API dt_dtensor *dt_dtensor_log_softmax(dt_ctx *ctx, dt_dtensor *x);
DT_API dt_dtensor *dt_dtensor_layer_norm(dt_ctx *ctx, dt_dtensor *x, dt_dtensor *gamma,
                                         dt_dtensor *beta, float eps);
DT_API dt_dtensor *dt_dtensor_sum(dt_ctx *ctx, dt_dtensor *x);
DT_API dt_dtensor *dt_dtensor_mean(dt_ctx *ctx, dt_dtensor *x);
DT_API dt_dtensor *dt_dtensor_cross_entropy(dt_ctx *ctx, dt_dtensor *logits, dt_dtensor *labels);

/* ---- training: shard_optimizer, shard_dataloader ---------------------------------------
 * A data-parallel step with dtensors (the seed's MLP; tensor parallel the
 * same with w0 Shard(1), w1 Shard(0)):
 *     dt_dtensor *w0, *w1;                       // persistent: dt_shard_tensor(NULL, ...)
 *     dt_shard_tensor(NULL, mesh, full_w0, (dt_placement[]){dt_replicate()}, &w0);
 *     dt_tensor_set_requires_grad(w0->local, true);  ... same for w1
 *     dt_adam_params ap = dt_adamw_params_default();
 *     dt_shard_optim *opt;
 *     dt_shard_optimizer(DT_OPTIM_ADAMW, &ap, (dt_dtensor *[]){w0, w1}, 2, -1, &opt);
 *     dt_shard_loader *dl;
 *     dt_shard_dataloader_init(ds, &mesh, 1, "x", 4, true, seed, &dl);
 *     dt_shard_dataloader_start_epoch(dl, 0);
 *     dt_dtensor *x, *y;
 *     while (dt_shard_dataloader_next(dl, ctx, &x, &y) == DT_OK && x) {
 *         dt_dtensor *z = dt_dtensor_matmul(ctx, dt_dtensor_matmul(ctx, x, w0), w1);
 *         dt_dtensor *loss = dt_dtensor_mean(ctx, z);          // Partial(sum)
 *         dt_backward(ctx, loss->local);                        // on every mesh rank
 *         dt_shard_optimizer_step(opt);
 *         dt_shard_optimizer_zero_grad(opt);
 *         dt_ctx_reset(ctx);
 *     } */

/* An optimizer (kind SGD, Adam, AdamW, LAMB or Lion; hparams points at the matching
 * dt_sgd_params / dt_adam_params / dt_lamb_params / dt_lion_params) over the local pieces of n persistent f32
 * dtensor parameters (borrowed; they must outlive it). Its state has each
 * piece's layout: it is placed like the parameter. zero_dim >= 0 (a mesh
 * dim): ZeRO-1 along it, each coordinate keeps state for and updates only
 * its torch.chunk range of the elements of a parameter Replicate on that
 * dim, and the step all-gathers the updated piece over the dim; -1: off.
 * A parameter without a gradient gets one attached (owned here, detached
 * by _free). Not collective. LAMB's trust ratio and clipping use the
 * norms of each WHOLE parameter and the whole global grad norm: each step
 * sums the pieces' squared norms over the mesh dims that split a parameter
 * (its Shard dims and the ZeRO dim), counting replicas once (two small f64
 * all-reduces per mesh dim, collective over the mesh), so the result equals
 * a single-process LAMB up to the order of those sums. LAMB needs every
 * parameter on one mesh and none Partial (DT_ERR_UNSUPPORTED naming it). */
typedef struct dt_shard_optim dt_shard_optim;
DT_API dt_status dt_shard_optimizer(dt_optim_kind kind, const void *hparams,
                                    dt_dtensor *const *params, int n, int zero_dim,
                                    dt_shard_optim **out);
/* One step on the gradients in the pieces' grads (they must be whole:
 * backward through the dtensor ops makes them so); with ZeRO-1 collective
 * over the zero dim's lines, with LAMB over the mesh (every mesh rank calls
 * it, also one holding no elements). */
DT_API dt_status dt_shard_optimizer_step(dt_shard_optim *o);
/* Zero the parameters' gradients. */
DT_API dt_status dt_shard_optimizer_zero_grad(dt_shard_optim *o);
/* The fused optimizer inside (set the learning rate, read state); NULL when
 * this rank holds no elements. Borrowed. */
DT_API dt_optim *dt_shard_optimizer_inner(dt_shard_optim *o);
/* NULL is a no-op. */
DT_API void dt_shard_optimizer_free(dt_shard_optim *o);

/* A loader that gives each data-parallel coordinate its share of every
 * global batch (Paddle's shard_dataloader(meshes, shard_dims)). shard_dim
 * names the mesh dim (NULL: dim 0), which must exist with the same size k
 * on every mesh; global_batch is a multiple of k. A rank reads as the
 * coordinate along that dim of the first mesh that holds it (a
 * DistributedSampler replica: drop_last, shuffled by seed + epoch when
 * shuffle), so ranks of one coordinate read the same items. Inputs arrive
 * on meshes[0], labels on meshes[nmesh - 1], each as a dtensor of the
 * global batch with Shard(0) on the shard dim and Replicate elsewhere;
 * ranks outside a mesh get its empty piece. ds and the meshes are borrowed.
 * Not collective (no communication). */
typedef struct dt_shard_loader dt_shard_loader;
DT_API dt_status dt_shard_dataloader_init(dt_dataset *ds, dt_mesh *const *meshes, int nmesh,
                                          const char *shard_dim, int64_t global_batch,
                                          bool shuffle, uint64_t seed, dt_shard_loader **out);
/* Batches per epoch (0 on a rank in no mesh). */
DT_API int64_t dt_shard_dataloader_num_batches(const dt_shard_loader *l);
DT_API dt_status dt_shard_dataloader_start_epoch(dt_shard_loader *l, int64_t epoch);
/* The next batch as temporaries of ctx (y may be NULL to skip labels); at
 * the end of the epoch DT_OK with *x = NULL. */
DT_API dt_status dt_shard_dataloader_next(dt_shard_loader *l, dt_ctx *ctx, dt_dtensor **x,
                                          dt_dtensor **y);
/* NULL is a no-op. */
DT_API void dt_shard_dataloader_free(dt_shard_loader *l);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_MESH_H */
