/* Internals shared by src/tensor and src/autograd: the context struct and a
 * strided N-d loop. Not a public header.
 *
 * Layer-internal: tensor and autograd share it (the context owns the tape,
 * which autograd records and walks); other layers that write ops on tensors
 * use its helpers (parallel: dt__null_input in the distributed ops). Not
 * installed, not for users. */
#ifndef DT_TENSOR_IMPL_H
#define DT_TENSOR_IMPL_H

#include "dtrain/autograd.h"
#include "dtrain/tensor.h"

struct dt__node;

struct dt_ctx {
    dt_arena *arena;
    /* The tape: node pointers in recording order. The array is malloc'd and
     * kept across resets (it only grows past the largest step so far); the
     * nodes themselves live in the arena. */
    struct dt__node **tape;
    size_t tape_len, tape_cap;
    bool grad_enabled;
    bool blocked_ok; /* dt_ctx_set_blocked */
    bool shapes_vary; /* dt_ctx_set_varying */
    bool in_backward;
    /* Re-entrant backward (activation checkpointing): a backward started
     * from a callback while another runs walks only the nodes recorded
     * since the enclosing walk began (index >= child_floor) and shares its
     * epoch, so leaf use counts of both passes add up. */
    size_t child_floor;
    size_t walk_lo; /* the running walk's first node (0 but in a nested walk: its child_floor) */
    uint64_t epoch;
    dt_dtype autocast; /* DT_F32 = off, or DT_BF16 / DT_F16 (precision.h) */
    /* Split backward (dt_backward_input / dt_backward_weight): while
     * split_input is set, nodes with parameter inputs are walked for their
     * other inputs only and queued here with their output gradient; the
     * array is malloc'd and kept across resets like the tape. */
    bool split_input;
    struct dt__node **deferred;
    const float **deferred_gout;
    size_t ndeferred, deferred_cap;
    dt_ag_stats ag_stats; /* dt_ag_stats_get */
    /* Arena buffers of the running node's backward that are dead when it
     * ends (dt__grad_scratch): given back then, or when committed (those
     * of dt__grad_begin). A backward nested in a node's (activation
     * checkpointing) uses the entries from scratch_floor on. */
    void *scratch[8];
    size_t scratch_bytes[8];
    int nscratch, scratch_floor;
};

/* Row callback of dt__nd_loop: n elements, up to three operands with their
 * innermost strides (in elements). */
typedef void (*dt__row_fn)(int64_t n, char *p0, int64_t s0, char *p1, int64_t s1, char *p2,
                           int64_t s2, void *ud);

/* Visit every index of `shape` (row-major) calling fn once per innermost
 * row. ptr[k]/strides[k] describe operand k (nops <= 3; strides in
 * elements of size esize[k]; a 0 stride repeats). Sequential and in a fixed
 * order, so reductions through a 0 stride are deterministic. */
void dt__nd_loop(int ndim, const int64_t *shape, int nops, char *const *ptr,
                 const int64_t (*strides)[DT_MAX_DIMS], const size_t *esize, dt__row_fn fn,
                 void *ud);

/* Allocate a temporary tensor struct (no data) in the context's arena. */
dt_tensor *dt__tensor_struct(dt_ctx *ctx);

/* NULL-input propagation: keep an earlier error's message, else set
 * DT_ERR_NULL naming the op and the argument. Returns NULL. */
dt_tensor *dt__null_input(const char *op, const char *arg);

#endif
