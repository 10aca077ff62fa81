/* The `self` backend: a group of one, the smallest complete backend.
 *
 * With one rank every collective is a copy from send to recv (or nothing
 * when in place): the reduction of one value is the value, and avg divides
 * by 1. send/recv need a peer, and the group layer already rejects a rank
 * sending to itself, so they cannot reach this file. */
#include "comm/backend.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int unused;
} self_ctx;

static dt_status self_init(const dt_backend_info *info, void **ctx)
{
    if (info->world_size != 1)
        return dt_error(DT_ERR_INVALID_ARG,
                        "backend 'self' is a group of one, but world size is %d; use shm or mpi",
                        info->world_size);
    self_ctx *s = calloc(1, sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "backend 'self': out of memory");
    *ctx = s;
    return DT_OK;
}

static void self_free(void *ctx) { free(ctx); }

static dt_status self_run(void *ctx, const dt_coll *c)
{
    (void)ctx;
    size_t es = dt_dtype_size(c->dtype);
    switch (c->kind) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE:
    case DT_COLL_ALLGATHER:
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER:
    case DT_COLL_ALLTOALL:
        if (!c->in_place && c->count)
            memmove(c->recv, c->send, c->count * es);
        return DT_OK;
    case DT_COLL_ALLGATHERV:
        if (!c->in_place && c->count)
            memmove((char *)c->recv + c->displs[0] * es, c->send, c->count * es);
        return DT_OK;
    case DT_COLL_BROADCAST:
    case DT_COLL_BARRIER:
        return DT_OK;
    default:
        return dt_error(DT_ERR_UNSUPPORTED, "backend 'self' does not implement %s",
                        dt_coll_kind_name(c->kind));
    }
}

/* A subgroup of a group of one is again a group of one. */
static dt_status self_subgroup(void *ctx, const int *ranks, int n, int new_rank, void **child)
{
    (void)ctx;
    (void)ranks;
    (void)n;
    *child = NULL;
    if (new_rank < 0)
        return DT_OK;
    self_ctx *s = calloc(1, sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "backend 'self': out of memory");
    *child = s;
    return DT_OK;
}

/* Nothing leaves a group of one. */
static dt_status self_traffic(void *ctx, uint64_t *sent, int n)
{
    (void)ctx;
    for (int r = 0; r < n; r++)
        sent[r] = 0;
    return DT_OK;
}

const dt_backend_ops dt__backend_self = {
    .version = DT_BACKEND_VERSION,
    .name = "self",
    .init = self_init,
    .free = self_free,
    .run = self_run,
    .kinds = 0,
    .mem_alloc = NULL,
    .mem_free = NULL,
    .subgroup = self_subgroup,
    .abort = NULL,
    .job_cleanup = NULL,    /* self leaves nothing behind */
    .orphan_cleanup = NULL,
    .traffic = self_traffic,
};
