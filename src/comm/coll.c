/* The public collective calls: check arguments, normalise in-place forms,
 * post a request; the blocking forms post, wait and free. */
#include "comm/pg.h"

#include <stdint.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

static dt_status check_common(dt_pg *pg, const char *fn, dt_dtype dt, dt_req **req)
{
    if (req)
        *req = NULL;
    if (!pg)
        return dt_error(DT_ERR_NULL, "%s: NULL group", fn);
    if ((unsigned)dt >= DT_DTYPE_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "%s: invalid dtype %d", fn, (int)dt);
    return DT_OK;
}

static dt_status check_op(const char *fn, dt_reduce_op op)
{
    if ((unsigned)op >= DT_REDUCE_OP_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "%s: invalid reduction %d", fn, (int)op);
    return DT_OK;
}

static dt_status check_root(dt_pg *pg, const char *fn, int root, const char *what)
{
    if (root < 0 || root >= pg->size)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s %d out of range [0, %d)", fn, what, root,
                        pg->size);
    return DT_OK;
}

static dt_status need(const void *p, size_t count, const char *fn, const char *what)
{
    if (!p && count)
        return dt_error(DT_ERR_NULL, "%s: NULL %s with count %zu", fn, what, count);
    return DT_OK;
}

/* The largest buffer a collective touches is count x mult elements (mult =
 * the group size for the gathered or scattered side, else 1). Its byte
 * count must not overflow and must fit an object (PTRDIFF_MAX bytes), and
 * no buffer may run past the end of the address space: otherwise a wrapped
 * size (SIZE_MAX elements, 2^62 floats) would post a collective over a few
 * bytes, or over memory that is not the caller's. */
static dt_status check_size(const char *fn, size_t count, size_t mult, dt_dtype dt,
                            const void *a, const void *b)
{
    size_t es = dt_dtype_size(dt);
    if (count && (count > (size_t)PTRDIFF_MAX / es / mult))
        return dt_error(DT_ERR_INVALID_ARG,
                        "%s: count %zu of %s (%zu bytes each%s) is more than any buffer can hold "
                        "(the byte count overflows or exceeds %td)",
                        fn, count, dt_dtype_name(dt), es, mult > 1 ? ", times the group size" : "",
                        (ptrdiff_t)PTRDIFF_MAX);
    size_t bytes = count * mult * es;
    const void *bufs[2] = {a, b};
    for (int i = 0; i < 2; i++)
        if (bufs[i] && (uintptr_t)bufs[i] > UINTPTR_MAX - bytes)
            return dt_error(DT_ERR_INVALID_ARG,
                            "%s: a buffer at %p of %zu bytes runs past the end of the address space",
                            fn, bufs[i], bytes);
    return DT_OK;
}

static dt_coll coll_make(dt_coll_kind k, const void *send, void *recv, size_t count, dt_dtype dt)
{
    dt_coll c = {.kind = k, .send = send, .recv = recv, .count = count, .dtype = dt,
                 .op = DT_REDUCE_SUM, .root = -1};
    return c;
}

/* Post, then either hand the request back or wait for it here. */
static dt_status finish(dt_pg *pg, const dt_coll *c, size_t *own, dt_req **req)
{
    if (req)
        return dt__pg_post(pg, c, own, 1, req);
    if (own) { /* the request must own the displacements */
        dt_req *r;
        dt_status st = dt__pg_post(pg, c, own, 0, &r);
        if (st < 0)
            return st;
        st = dt_req_wait(r, -1);
        dt_req_free(r);
        return st;
    }
    return dt__pg_run_blocking(pg, c);
}

#define CHK(x)                                                                                     \
    do {                                                                                           \
        dt_status st_ = (x);                                                                       \
        if (st_ < 0)                                                                               \
            return st_;                                                                            \
    } while (0)

static char *byte_off(const void *p, size_t elems, dt_dtype dt)
{
    return (char *)p + elems * dt_dtype_size(dt);
}

/* ---- allreduce ---- */
static dt_status allreduce(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                           dt_reduce_op op, dt_req **req)
{
    const char *fn = "dt_pg_allreduce";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_op(fn, op));
    CHK(check_size(fn, count, 1, dt, send, recv));
    CHK(need(recv, count, fn, "recv"));
    dt_coll c = coll_make(DT_COLL_ALLREDUCE, send ? send : recv, recv, count, dt);
    c.op = op;
    c.in_place = c.send == recv;
    if (pg->hier)
        return dt__hier_allreduce(pg, &c, req);
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_allreduce_async(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                                dt_reduce_op op, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_allreduce_async: NULL req");
    return allreduce(pg, send, recv, count, dt, op, req);
}
dt_status dt_pg_allreduce(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                          dt_reduce_op op)
{
    return allreduce(pg, send, recv, count, dt, op, NULL);
}

/* ---- reduce ---- */
static dt_status reduce(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                        dt_reduce_op op, int root, dt_req **req)
{
    const char *fn = "dt_pg_reduce";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_op(fn, op));
    CHK(check_size(fn, count, 1, dt, send, recv));
    CHK(check_root(pg, fn, root, "root"));
    int is_root = pg->rank == root;
    if (!send && !is_root)
        return dt_error(DT_ERR_INVALID_ARG, "%s: in-place (send NULL) only at the root", fn);
    if (is_root)
        CHK(need(recv, count, fn, "recv at root"));
    CHK(need(send ? send : recv, count, fn, "send"));
    dt_coll c = coll_make(DT_COLL_REDUCE, send ? send : recv, is_root ? recv : NULL, count, dt);
    c.op = op;
    c.root = root;
    c.in_place = is_root && c.send == recv;
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_reduce_async(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                             dt_reduce_op op, int root, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_reduce_async: NULL req");
    return reduce(pg, send, recv, count, dt, op, root, req);
}
dt_status dt_pg_reduce(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                       dt_reduce_op op, int root)
{
    return reduce(pg, send, recv, count, dt, op, root, NULL);
}

/* ---- broadcast ---- */
static dt_status broadcast(dt_pg *pg, void *buf, size_t count, dt_dtype dt, int root,
                           dt_req **req)
{
    const char *fn = "dt_pg_broadcast";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_size(fn, count, 1, dt, buf, NULL));
    CHK(check_root(pg, fn, root, "root"));
    CHK(need(buf, count, fn, "buf"));
    dt_coll c = coll_make(DT_COLL_BROADCAST, buf, buf, count, dt);
    c.root = root;
    c.in_place = 1;
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_broadcast_async(dt_pg *pg, void *buf, size_t count, dt_dtype dt, int root,
                                dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_broadcast_async: NULL req");
    return broadcast(pg, buf, count, dt, root, req);
}
dt_status dt_pg_broadcast(dt_pg *pg, void *buf, size_t count, dt_dtype dt, int root)
{
    return broadcast(pg, buf, count, dt, root, NULL);
}

/* ---- allgather ---- */
static dt_status allgather(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                           dt_req **req)
{
    const char *fn = "dt_pg_allgather";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_size(fn, count, (size_t)pg->size, dt, recv, NULL));
    CHK(check_size(fn, count, 1, dt, send, NULL));
    CHK(need(recv, count, fn, "recv"));
    const void *mine = recv ? byte_off(recv, (size_t)pg->rank * count, dt) : NULL;
    dt_coll c = coll_make(DT_COLL_ALLGATHER, send ? send : mine, recv, count, dt);
    CHK(need(c.send, count, fn, "send"));
    c.in_place = c.send == mine;
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_allgather_async(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                                dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_allgather_async: NULL req");
    return allgather(pg, send, recv, count, dt, req);
}
dt_status dt_pg_allgather(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt)
{
    return allgather(pg, send, recv, count, dt, NULL);
}

/* ---- allgatherv ---- */
static dt_status allgatherv(dt_pg *pg, const void *send, void *recv, const size_t *counts,
                            const size_t *displs, dt_dtype dt, dt_req **req)
{
    const char *fn = "dt_pg_allgatherv";
    CHK(check_common(pg, fn, dt, req));
    if (!counts)
        return dt_error(DT_ERR_NULL, "%s: NULL counts", fn);
    size_t total = 0, *own = NULL;
    for (int r = 0; r < pg->size; r++) {
        if (counts[r] > SIZE_MAX - total)
            return dt_error(DT_ERR_INVALID_ARG, "%s: the sum of counts overflows (rank %d's %zu)",
                            fn, r, counts[r]);
        total += counts[r];
        if (displs && (displs[r] > SIZE_MAX - counts[r] ||
                       check_size(fn, displs[r] + counts[r], 1, dt, recv, NULL) < 0))
            return dt_error(DT_ERR_INVALID_ARG,
                            "%s: rank %d's block (displacement %zu, count %zu) is beyond any buffer",
                            fn, r, displs[r], counts[r]);
    }
    CHK(check_size(fn, total, 1, dt, recv, NULL));
    CHK(check_size(fn, counts[pg->rank], 1, dt, send, NULL));
    if (!displs) {
        own = malloc((size_t)pg->size * sizeof *own);
        if (!own)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
        size_t off = 0;
        for (int r = 0; r < pg->size; r++) {
            own[r] = off;
            off += counts[r];
        }
        displs = own;
    }
    dt_status st = need(recv, total, fn, "recv");
    const void *mine = recv ? byte_off(recv, displs[pg->rank], dt) : NULL;
    dt_coll c = coll_make(DT_COLL_ALLGATHERV, send ? send : mine, recv, counts[pg->rank], dt);
    if (st == DT_OK)
        st = need(c.send, c.count, fn, "send");
    if (st < 0) {
        free(own);
        return st;
    }
    c.counts = counts;
    c.displs = displs;
    c.in_place = c.send == mine;
    return finish(pg, &c, own, req);
}
dt_status dt_pg_allgatherv_async(dt_pg *pg, const void *send, void *recv, const size_t *counts,
                                 const size_t *displs, dt_dtype dt, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_allgatherv_async: NULL req");
    return allgatherv(pg, send, recv, counts, displs, dt, req);
}
dt_status dt_pg_allgatherv(dt_pg *pg, const void *send, void *recv, const size_t *counts,
                           const size_t *displs, dt_dtype dt)
{
    return allgatherv(pg, send, recv, counts, displs, dt, NULL);
}

/* ---- reduce_scatterv ----
 * Uneven blocks run as one reduce_scatter of the largest block: on the
 * executor, pre packs the W blocks into a zero-padded (W, maxc) buffer,
 * the backend reduce-scatters it into a maxc block, post copies this rank's
 * counts[rank] elements out. Even counts skip the copies. */
typedef struct {
    const char *user_send; /* packed blocks, rank order */
    char *user_recv;
    size_t *counts;        /* W, copied at post */
    size_t maxc, es;
    char *tmp;             /* (W + 1) * maxc elements: padded input, then the output block */
} rsv_state;

static dt_status rsv_pre(dt_req *r)
{
    rsv_state *x = r->xf;
    int W = r->pg->size;
    size_t off = 0;
    for (int j = 0; j < W; j++) {
        memcpy(x->tmp + (size_t)j * x->maxc * x->es, x->user_send + off * x->es,
               x->counts[j] * x->es);
        off += x->counts[j];
    }
    return DT_OK;
}

static void rsv_post(dt_req *r)
{
    rsv_state *x = r->xf;
    memcpy(x->user_recv, x->tmp + (size_t)r->pg->size * x->maxc * x->es,
           x->counts[r->pg->rank] * x->es);
}

static dt_status reduce_scatterv(dt_pg *pg, const void *send, void *recv, const size_t *counts,
                                 dt_dtype dt, dt_reduce_op op, dt_req **req)
{
    const char *fn = "dt_pg_reduce_scatterv";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_op(fn, op));
    if (!counts)
        return dt_error(DT_ERR_NULL, "%s: NULL counts", fn);
    int W = pg->size;
    size_t total = 0, maxc = 0;
    for (int j = 0; j < W; j++) {
        total += counts[j];
        maxc = counts[j] > maxc ? counts[j] : maxc;
    }
    CHK(need(send, total, fn, "send"));
    CHK(need(recv, counts[pg->rank], fn, "recv"));
    int even = 1;
    for (int j = 0; j < W; j++)
        even &= counts[j] == maxc;
    if (even) {
        dt_coll c = coll_make(DT_COLL_REDUCE_SCATTER, send, recv, maxc, dt);
        c.op = op;
        c.in_place = send && recv == byte_off(send, (size_t)pg->rank * maxc, dt);
        return finish(pg, &c, NULL, req);
    }
    size_t es = dt_dtype_size(dt);
    /* One block: the state, the counts, then the 64-byte aligned buffer,
     * zeroed so the padding holds defined values for every reduction. */
    size_t head = (sizeof(rsv_state) + (size_t)W * sizeof(size_t) + 63) / 64 * 64;
    size_t bytes = (size_t)(W + 1) * maxc * es;
    char *blk = calloc(1, head + bytes + 64);
    if (!blk)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the padded buffer (%zu bytes)",
                        fn, bytes);
    rsv_state *x = (rsv_state *)(void *)blk;
    x->counts = (size_t *)(void *)(blk + sizeof(rsv_state));
    memcpy(x->counts, counts, (size_t)W * sizeof(size_t));
    x->user_send = send;
    x->user_recv = recv;
    x->maxc = maxc;
    x->es = es;
    x->tmp = (char *)(((uintptr_t)blk + head + 63) / 64 * 64);
    dt_coll c = coll_make(DT_COLL_REDUCE_SCATTER, x->tmp, x->tmp + (size_t)W * maxc * es, maxc, dt);
    c.op = op;
    dt_req *r;
    dt_status st = dt__pg_post_ex(pg, &c, NULL, rsv_pre, rsv_post, x, req != NULL, &r);
    if (st < 0)
        return st;
    if (req) {
        *req = r;
        return DT_OK;
    }
    st = dt_req_wait(r, -1);
    dt_req_free(r);
    return st;
}
dt_status dt_pg_reduce_scatterv_async(dt_pg *pg, const void *send, void *recv,
                                      const size_t *counts, dt_dtype dt, dt_reduce_op op,
                                      dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_reduce_scatterv_async: NULL req");
    return reduce_scatterv(pg, send, recv, counts, dt, op, req);
}
dt_status dt_pg_reduce_scatterv(dt_pg *pg, const void *send, void *recv, const size_t *counts,
                                dt_dtype dt, dt_reduce_op op)
{
    return reduce_scatterv(pg, send, recv, counts, dt, op, NULL);
}

/* ---- reduce_scatter ---- */
static dt_status reduce_scatter(dt_pg *pg, const void *send, void *recv, size_t count,
                                dt_dtype dt, dt_reduce_op op, dt_req **req)
{
    const char *fn = "dt_pg_reduce_scatter";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_op(fn, op));
    CHK(check_size(fn, count, (size_t)pg->size, dt, send, NULL));
    CHK(check_size(fn, count, 1, dt, recv, NULL));
    CHK(need(send, count, fn, "send"));
    CHK(need(recv, count, fn, "recv"));
    dt_coll c = coll_make(DT_COLL_REDUCE_SCATTER, send, recv, count, dt);
    c.op = op;
    c.in_place = send && recv == byte_off(send, (size_t)pg->rank * count, dt);
    if (pg->hier && pg->hier->slot)
        return dt__hier_reduce_scatter(pg, &c, req);
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_reduce_scatter_async(dt_pg *pg, const void *send, void *recv, size_t count,
                                     dt_dtype dt, dt_reduce_op op, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_reduce_scatter_async: NULL req");
    return reduce_scatter(pg, send, recv, count, dt, op, req);
}
dt_status dt_pg_reduce_scatter(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                               dt_reduce_op op)
{
    return reduce_scatter(pg, send, recv, count, dt, op, NULL);
}

/* ---- gather ---- */
static dt_status gather(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                        int root, dt_req **req)
{
    const char *fn = "dt_pg_gather";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_size(fn, count, (size_t)pg->size, dt, pg->rank == root ? recv : NULL, NULL));
    CHK(check_size(fn, count, 1, dt, send, NULL));
    CHK(check_root(pg, fn, root, "root"));
    int is_root = pg->rank == root;
    if (is_root)
        CHK(need(recv, count, fn, "recv at root"));
    if (!send && !is_root)
        return dt_error(DT_ERR_INVALID_ARG, "%s: in-place (send NULL) only at the root", fn);
    const void *mine = is_root && recv ? byte_off(recv, (size_t)root * count, dt) : NULL;
    dt_coll c = coll_make(DT_COLL_GATHER, send ? send : mine, is_root ? recv : NULL, count, dt);
    CHK(need(c.send, count, fn, "send"));
    c.root = root;
    c.in_place = is_root && c.send == mine;
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_gather_async(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                             int root, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_gather_async: NULL req");
    return gather(pg, send, recv, count, dt, root, req);
}
dt_status dt_pg_gather(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                       int root)
{
    return gather(pg, send, recv, count, dt, root, NULL);
}

/* ---- scatter ---- */
static dt_status scatter(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                         int root, dt_req **req)
{
    const char *fn = "dt_pg_scatter";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_size(fn, count, (size_t)pg->size, dt, pg->rank == root ? send : NULL, NULL));
    CHK(check_size(fn, count, 1, dt, recv, NULL));
    CHK(check_root(pg, fn, root, "root"));
    int is_root = pg->rank == root;
    if (is_root)
        CHK(need(send, count, fn, "send at root"));
    CHK(need(recv, count, fn, "recv"));
    dt_coll c = coll_make(DT_COLL_SCATTER, is_root ? send : NULL, recv, count, dt);
    c.root = root;
    c.in_place = is_root && recv == byte_off(send, (size_t)root * count, dt);
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_scatter_async(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                              int root, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_scatter_async: NULL req");
    return scatter(pg, send, recv, count, dt, root, req);
}
dt_status dt_pg_scatter(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                        int root)
{
    return scatter(pg, send, recv, count, dt, root, NULL);
}

/* ---- alltoallv ----
 * Uneven blocks run as one alltoall of the largest block over all pairs:
 * pre (on the executor) agrees on that size with a small all-reduce (max),
 * packs the send blocks into a zero-padded (W, maxc) buffer and points the
 * request's alltoall at it; post copies the received blocks out. */
typedef struct {
    const char *user_send;
    char *user_recv;
    size_t *sc, *sd, *rc, *rd; /* W each, copied at post */
    size_t es;
    char *tmp;                 /* malloc'd in pre: 2 * W * maxc elements */
} a2av_state;

static void a2av_free(void *p)
{
    a2av_state *x = p;
    free(x->tmp);
    free(x);
}

static dt_status a2av_pre(dt_req *r)
{
    a2av_state *x = r->xf;
    r->xf_free = a2av_free; /* tmp goes with the request, also after a failure */
    dt_pg *pg = r->pg;
    int W = pg->size;
    int64_t m = 0;
    for (int j = 0; j < W; j++) {
        m = (int64_t)x->sc[j] > m ? (int64_t)x->sc[j] : m;
        m = (int64_t)x->rc[j] > m ? (int64_t)x->rc[j] : m;
    }
    dt_coll mc = coll_make(DT_COLL_ALLREDUCE, &m, &m, 1, DT_I64);
    mc.op = DT_REDUCE_MAX;
    mc.in_place = 1;
    mc.seq = r->c.seq;
    mc.timeout_s = r->c.timeout_s;
    dt_status st = pg->ops->run(pg->ctx, &mc);
    if (st < 0)
        return st;
    size_t maxc = (size_t)m;
    x->tmp = calloc(2 * (size_t)W * maxc + 1, x->es); /* zero: defined padding */
    if (!x->tmp)
        return dt_error(DT_ERR_NO_MEMORY, "dt_pg_alltoallv: out of memory for the padded "
                                          "buffers (%zu bytes)", 2 * (size_t)W * maxc * x->es);
    for (int j = 0; j < W; j++)
        memcpy(x->tmp + (size_t)j * maxc * x->es, x->user_send + x->sd[j] * x->es,
               x->sc[j] * x->es);
    r->c.send = x->tmp;
    r->c.recv = x->tmp + (size_t)W * maxc * x->es;
    r->c.count = maxc;
    return DT_OK;
}

static void a2av_post(dt_req *r)
{
    a2av_state *x = r->xf;
    for (int j = 0; j < r->pg->size; j++)
        memcpy(x->user_recv + x->rd[j] * x->es, (char *)r->c.recv + (size_t)j * r->c.count * x->es,
               x->rc[j] * x->es);
}

static dt_status alltoallv(dt_pg *pg, const void *send, const size_t *sendcounts,
                           const size_t *sdispls, void *recv, const size_t *recvcounts,
                           const size_t *rdispls, dt_dtype dt, dt_req **req)
{
    const char *fn = "dt_pg_alltoallv";
    CHK(check_common(pg, fn, dt, req));
    if (!sendcounts || !recvcounts)
        return dt_error(DT_ERR_NULL, "%s: NULL counts", fn);
    int W = pg->size;
    a2av_state *x = calloc(1, sizeof *x + 4 * (size_t)W * sizeof(size_t));
    if (!x)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
    x->sc = (size_t *)(void *)(x + 1);
    x->sd = x->sc + W;
    x->rc = x->sd + W;
    x->rd = x->rc + W;
    size_t so = 0, ro = 0, send_end = 0, recv_end = 0;
    for (int j = 0; j < W; j++) {
        x->sc[j] = sendcounts[j];
        x->rc[j] = recvcounts[j];
        x->sd[j] = sdispls ? sdispls[j] : so;
        x->rd[j] = rdispls ? rdispls[j] : ro;
        so += sendcounts[j];
        ro += recvcounts[j];
        if (x->sd[j] + x->sc[j] > send_end)
            send_end = x->sd[j] + x->sc[j];
        if (x->rd[j] + x->rc[j] > recv_end)
            recv_end = x->rd[j] + x->rc[j];
    }
    dt_status st = need(send, send_end, fn, "send");
    if (st == DT_OK)
        st = need(recv, recv_end, fn, "recv");
    if (st < 0) {
        free(x);
        return st;
    }
    x->user_send = send;
    x->user_recv = recv;
    x->es = dt_dtype_size(dt);
    /* The alltoall's buffers and count are set by a2av_pre. */
    dt_coll c = coll_make(DT_COLL_ALLTOALL, NULL, NULL, 0, dt);
    dt_req *r;
    st = dt__pg_post_ex(pg, &c, NULL, a2av_pre, a2av_post, x, req != NULL, &r);
    if (st < 0)
        return st;
    if (req) {
        *req = r;
        return DT_OK;
    }
    st = dt_req_wait(r, -1);
    dt_req_free(r);
    return st;
}
dt_status dt_pg_alltoallv_async(dt_pg *pg, const void *send, const size_t *sendcounts,
                                const size_t *sdispls, void *recv, const size_t *recvcounts,
                                const size_t *rdispls, dt_dtype dt, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_alltoallv_async: NULL req");
    return alltoallv(pg, send, sendcounts, sdispls, recv, recvcounts, rdispls, dt, req);
}
dt_status dt_pg_alltoallv(dt_pg *pg, const void *send, const size_t *sendcounts,
                          const size_t *sdispls, void *recv, const size_t *recvcounts,
                          const size_t *rdispls, dt_dtype dt)
{
    return alltoallv(pg, send, sendcounts, sdispls, recv, recvcounts, rdispls, dt, NULL);
}

/* ---- alltoall ---- */
static dt_status alltoall(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                          dt_req **req)
{
    const char *fn = "dt_pg_alltoall";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_size(fn, count, (size_t)pg->size, dt, send, recv));
    CHK(need(recv, count, fn, "recv"));
    dt_coll c = coll_make(DT_COLL_ALLTOALL, send ? send : recv, recv, count, dt);
    c.in_place = c.send == recv;
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_alltoall_async(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt,
                               dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_alltoall_async: NULL req");
    return alltoall(pg, send, recv, count, dt, req);
}
dt_status dt_pg_alltoall(dt_pg *pg, const void *send, void *recv, size_t count, dt_dtype dt)
{
    return alltoall(pg, send, recv, count, dt, NULL);
}

/* ---- strided layouts: allgather_blocks, alltoall_blocks ----
 * A backend with DT_BACKEND_LAYOUTS gets the layouts in dt_coll (sblocks,
 * rblocks) and copies in place; any other runs the contiguous form through
 * a packed buffer: pre (on the executor) packs the send blocks, post
 * unpacks into the receive blocks. The state holds copies of the arrays
 * (the caller's may go away after an asynchronous post). */
typedef struct {
    size_t *counts, *displs;   /* W each */
    dt_pg_block *sb, *rb;      /* W each */
    const char *user_send;
    char *user_recv;
    char *tmp;                 /* packed buffer (fallback), else NULL */
    size_t count, es;
    int W;
} blk_state;

/* Check W blocks of a buffer: each holds runs * run elements (no overflow),
 * stride >= run when runs > 1, and its extent fits the address space; if
 * count != SIZE_MAX every block must hold exactly count. counts (may be
 * NULL) gets the element counts. */
static dt_status check_blocks(const char *fn, const char *what, const dt_pg_block *b, int W,
                              dt_dtype dt, const void *buf, size_t count, size_t *counts)
{
    if (!b)
        return dt_error(DT_ERR_NULL, "%s: NULL %s", fn, what);
    for (int j = 0; j < W; j++) {
        size_t n = 0, ext = 0;
        if (b[j].runs && b[j].run) {
            if (b[j].run > SIZE_MAX / b[j].runs ||
                (b[j].runs > 1 && (b[j].stride < b[j].run ||
                                   b[j].stride > (SIZE_MAX - b[j].run) / (b[j].runs - 1))))
                return dt_error(DT_ERR_INVALID_ARG,
                                "%s: %s[%d] {off %zu, runs %zu, run %zu, stride %zu}: the runs "
                                "overlap or the extent overflows",
                                fn, what, j, b[j].off, b[j].runs, b[j].run, b[j].stride);
            n = b[j].runs * b[j].run;
            ext = (b[j].runs - 1) * b[j].stride + b[j].run;
            if (b[j].off > SIZE_MAX - ext ||
                check_size(fn, b[j].off + ext, 1, dt, buf, NULL) < 0)
                return dt_error(DT_ERR_INVALID_ARG, "%s: %s[%d] (offset %zu, extent %zu) is "
                                "beyond any buffer", fn, what, j, b[j].off, ext);
            CHK(need(buf, n, fn, what));
        }
        if (count != SIZE_MAX && n != count)
            return dt_error(DT_ERR_INVALID_ARG,
                            "%s: %s[%d] holds %zu elements (runs %zu x run %zu), not count %zu",
                            fn, what, j, n, b[j].runs, b[j].run, count);
        if (counts)
            counts[j] = n;
    }
    return DT_OK;
}

/* The state with room for the arrays and, when tmp_elems > 0, a packed
 * 64-byte aligned buffer. */
static blk_state *blk_new(int W, size_t es, size_t tmp_elems)
{
    size_t head = sizeof(blk_state) + 2 * (size_t)W * (sizeof(size_t) + sizeof(dt_pg_block));
    head = (head + 63) / 64 * 64;
    char *m = calloc(1, head + (tmp_elems ? tmp_elems * es + 64 : 0));
    if (!m)
        return NULL;
    blk_state *x = (blk_state *)(void *)m;
    x->sb = (dt_pg_block *)(void *)(x + 1);
    x->rb = x->sb + W;
    x->counts = (size_t *)(void *)(x->rb + W);
    x->displs = x->counts + W;
    x->tmp = tmp_elems ? (char *)(((uintptr_t)m + head + 63) / 64 * 64) : NULL;
    x->W = W;
    x->es = es;
    return x;
}

/* Post c with the hooks and state x (taken over); wait when req is NULL. */
static dt_status blk_post(dt_pg *pg, const dt_coll *c, dt_status (*pre)(dt_req *),
                          void (*post)(dt_req *), blk_state *x, dt_req **req)
{
    dt_req *r;
    if (!req && !pre && !post) { /* native and blocking: run it here like a plain one */
        dt_status st = dt__pg_run_blocking(pg, c);
        free(x);
        return st;
    }
    dt_status st = dt__pg_post_ex(pg, c, NULL, pre, post, x, req != NULL, &r);
    if (st < 0)
        return st;
    if (req) {
        *req = r;
        return DT_OK;
    }
    st = dt_req_wait(r, -1);
    dt_req_free(r);
    return st;
}

static void agb_unpack(dt_req *r)
{
    blk_state *x = r->xf;
    for (int j = 0; j < x->W; j++)
        dt__blk_copy(x->user_recv, &x->rb[j], 0, x->tmp + x->displs[j] * x->es, NULL, 0,
                     x->counts[j], x->es);
}

static dt_status allgather_blocks(dt_pg *pg, const void *send, void *recv,
                                  const dt_pg_block *rblocks, dt_dtype dt, dt_req **req)
{
    const char *fn = "dt_pg_allgather_blocks";
    CHK(check_common(pg, fn, dt, req));
    int W = pg->size;
    size_t *counts = malloc((size_t)W * sizeof *counts), total = 0;
    if (!counts)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
    dt_status st = check_blocks(fn, "rblocks", rblocks, W, dt, recv, SIZE_MAX, counts);
    for (int j = 0; st == DT_OK && j < W; j++) {
        if (counts[j] > SIZE_MAX - total)
            st = dt_error(DT_ERR_INVALID_ARG, "%s: the sum of counts overflows", fn);
        total += counts[j];
    }
    if (st == DT_OK)
        st = need(send, counts[pg->rank], fn, "send (not in place)");
    if (st == DT_OK)
        st = check_size(fn, counts[pg->rank], 1, dt, send, NULL);
    int native = pg->ops->kinds & DT_BACKEND_LAYOUTS;
    blk_state *x = st == DT_OK ? blk_new(W, dt_dtype_size(dt), native ? 0 : total) : NULL;
    if (st == DT_OK && !x)
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory (%zu elements)", fn, total);
    if (st < 0) {
        free(counts);
        return st;
    }
    memcpy(x->counts, counts, (size_t)W * sizeof *counts);
    free(counts);
    memcpy(x->rb, rblocks, (size_t)W * sizeof *rblocks);
    size_t off = 0;
    for (int j = 0; j < W; j++) {
        x->displs[j] = native ? x->rb[j].off : off;
        off += x->counts[j];
    }
    x->user_recv = recv;
    dt_coll c = coll_make(DT_COLL_ALLGATHERV, send, native ? recv : x->tmp, x->counts[pg->rank], dt);
    c.counts = x->counts;
    c.displs = x->displs;
    c.rblocks = native ? x->rb : NULL;
    return blk_post(pg, &c, NULL, native ? NULL : agb_unpack, x, req);
}
dt_status dt_pg_allgather_blocks_async(dt_pg *pg, const void *send, void *recv,
                                       const dt_pg_block *rblocks, dt_dtype dt, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_allgather_blocks_async: NULL req");
    return allgather_blocks(pg, send, recv, rblocks, dt, req);
}
dt_status dt_pg_allgather_blocks(dt_pg *pg, const void *send, void *recv,
                                 const dt_pg_block *rblocks, dt_dtype dt)
{
    return allgather_blocks(pg, send, recv, rblocks, dt, NULL);
}

static dt_status a2ab_pack(dt_req *r)
{
    blk_state *x = r->xf;
    for (int j = 0; j < x->W; j++)
        dt__blk_copy(x->tmp, NULL, (size_t)j * x->count, x->user_send, &x->sb[j], 0, x->count,
                     x->es);
    return DT_OK;
}

static void a2ab_unpack(dt_req *r)
{
    blk_state *x = r->xf;
    char *in = x->tmp + (size_t)x->W * x->count * x->es;
    for (int j = 0; j < x->W; j++)
        dt__blk_copy(x->user_recv, &x->rb[j], 0, in, NULL, (size_t)j * x->count, x->count, x->es);
}

static dt_status alltoall_blocks(dt_pg *pg, const void *send, const dt_pg_block *sblocks,
                                 void *recv, const dt_pg_block *rblocks, size_t count,
                                 dt_dtype dt, dt_req **req)
{
    const char *fn = "dt_pg_alltoall_blocks";
    CHK(check_common(pg, fn, dt, req));
    int W = pg->size;
    CHK(check_size(fn, count, 2 * (size_t)W, dt, NULL, NULL));
    CHK(check_blocks(fn, "sblocks", sblocks, W, dt, send, count, NULL));
    CHK(check_blocks(fn, "rblocks", rblocks, W, dt, recv, count, NULL));
    if (count && send == recv)
        return dt_error(DT_ERR_INVALID_ARG, "%s: send and recv are the same buffer (not in "
                        "place)", fn);
    int native = pg->ops->kinds & DT_BACKEND_LAYOUTS;
    blk_state *x = blk_new(W, dt_dtype_size(dt), native ? 0 : 2 * (size_t)W * count);
    if (!x)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
    memcpy(x->sb, sblocks, (size_t)W * sizeof *sblocks);
    memcpy(x->rb, rblocks, (size_t)W * sizeof *rblocks);
    x->user_send = send;
    x->user_recv = recv;
    x->count = count;
    dt_coll c = coll_make(DT_COLL_ALLTOALL, native ? send : x->tmp,
                          native ? recv : x->tmp + (size_t)W * count * x->es, count, dt);
    if (native) {
        c.sblocks = x->sb;
        c.rblocks = x->rb;
    }
    return blk_post(pg, &c, native ? NULL : a2ab_pack, native ? NULL : a2ab_unpack, x, req);
}
dt_status dt_pg_alltoall_blocks_async(dt_pg *pg, const void *send, const dt_pg_block *sblocks,
                                      void *recv, const dt_pg_block *rblocks, size_t count,
                                      dt_dtype dt, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_alltoall_blocks_async: NULL req");
    return alltoall_blocks(pg, send, sblocks, recv, rblocks, count, dt, req);
}
dt_status dt_pg_alltoall_blocks(dt_pg *pg, const void *send, const dt_pg_block *sblocks,
                                void *recv, const dt_pg_block *rblocks, size_t count, dt_dtype dt)
{
    return alltoall_blocks(pg, send, sblocks, recv, rblocks, count, dt, NULL);
}

static dt_status rsb_pack(dt_req *r)
{
    blk_state *x = r->xf;
    for (int j = 0; j < x->W; j++)
        dt__blk_copy(x->tmp, NULL, (size_t)j * x->count, x->user_send, &x->sb[j], 0, x->count,
                     x->es);
    return DT_OK;
}

static dt_status reduce_scatter_blocks(dt_pg *pg, const void *send, const dt_pg_block *sblocks,
                                       void *recv, size_t count, dt_dtype dt, dt_reduce_op op,
                                       dt_req **req)
{
    const char *fn = "dt_pg_reduce_scatter_blocks";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_op(fn, op));
    int W = pg->size;
    CHK(check_size(fn, count, (size_t)W, dt, recv, NULL));
    CHK(check_blocks(fn, "sblocks", sblocks, W, dt, send, count, NULL));
    CHK(need(recv, count, fn, "recv"));
    if (count && send == recv)
        return dt_error(DT_ERR_INVALID_ARG, "%s: send and recv are the same buffer (not in "
                        "place)", fn);
    /* a hierarchical group runs the flat form on its packed copy */
    int native = (pg->ops->kinds & DT_BACKEND_LAYOUTS) && !pg->hier;
    blk_state *x = blk_new(W, dt_dtype_size(dt), native ? 0 : (size_t)W * count);
    if (!x)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
    memcpy(x->sb, sblocks, (size_t)W * sizeof *sblocks);
    x->user_send = send;
    x->count = count;
    dt_coll c = coll_make(DT_COLL_REDUCE_SCATTER, native ? send : x->tmp, recv, count, dt);
    c.op = op;
    if (native)
        c.sblocks = x->sb;
    return blk_post(pg, &c, native ? NULL : rsb_pack, NULL, x, req);
}
dt_status dt_pg_reduce_scatter_blocks_async(dt_pg *pg, const void *send,
                                            const dt_pg_block *sblocks, void *recv, size_t count,
                                            dt_dtype dt, dt_reduce_op op, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_reduce_scatter_blocks_async: NULL req");
    return reduce_scatter_blocks(pg, send, sblocks, recv, count, dt, op, req);
}
dt_status dt_pg_reduce_scatter_blocks(dt_pg *pg, const void *send, const dt_pg_block *sblocks,
                                      void *recv, size_t count, dt_dtype dt, dt_reduce_op op)
{
    return reduce_scatter_blocks(pg, send, sblocks, recv, count, dt, op, NULL);
}

/* ---- barrier ---- */
static dt_status barrier(dt_pg *pg, dt_req **req)
{
    CHK(check_common(pg, "dt_pg_barrier", DT_U8, req));
    dt_coll c = coll_make(DT_COLL_BARRIER, NULL, NULL, 0, DT_U8);
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_barrier_async(dt_pg *pg, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_barrier_async: NULL req");
    return barrier(pg, req);
}
dt_status dt_pg_barrier(dt_pg *pg) { return barrier(pg, NULL); }

/* ---- send / recv ---- */
static dt_status p2p(dt_pg *pg, dt_coll_kind k, void *buf, size_t count, dt_dtype dt, int peer,
                     dt_req **req)
{
    const char *fn = k == DT_COLL_SEND ? "dt_pg_send" : "dt_pg_recv";
    CHK(check_common(pg, fn, dt, req));
    CHK(check_root(pg, fn, peer, "peer"));
    CHK(check_size(fn, count, 1, dt, buf, NULL));
    if (peer == pg->rank)
        return dt_error(DT_ERR_INVALID_ARG, "%s: peer %d is this rank; use a copy", fn, peer);
    CHK(need(buf, count, fn, "buf"));
    dt_coll c = coll_make(k, k == DT_COLL_SEND ? buf : NULL, k == DT_COLL_RECV ? buf : NULL, count,
                          dt);
    c.root = peer;
    size_t bytes = count * dt_dtype_size(dt);
    if (k == DT_COLL_SEND && !req && pg->ops->p2p_start && bytes <= pg->eager_bytes) {
        /* A buffered blocking send: a copy travels as an asynchronous send
         * and the call returns, so two ranks that send to each other before
         * receiving do not wait for each other (a failure of the send fails
         * the group: a later operation reports it). */
        void *copy = malloc(bytes ? bytes : 1);
        if (copy) {
            memcpy(copy, buf, bytes);
            c.send = copy;
            dt_req *r;
            dt_status st = dt__pg_post_ex(pg, &c, NULL, NULL, NULL, copy, 1, &r);
            if (st < 0)
                return st;
            dt_req_free(r);
            return DT_OK;
        }
    }
    return finish(pg, &c, NULL, req);
}
dt_status dt_pg_send_async(dt_pg *pg, const void *buf, size_t count, dt_dtype dt, int peer,
                           dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_send_async: NULL req");
    return p2p(pg, DT_COLL_SEND, (void *)buf, count, dt, peer, req);
}
dt_status dt_pg_send(dt_pg *pg, const void *buf, size_t count, dt_dtype dt, int peer)
{
    return p2p(pg, DT_COLL_SEND, (void *)buf, count, dt, peer, NULL);
}
dt_status dt_pg_recv_async(dt_pg *pg, void *buf, size_t count, dt_dtype dt, int peer, dt_req **req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_pg_recv_async: NULL req");
    return p2p(pg, DT_COLL_RECV, buf, count, dt, peer, req);
}
dt_status dt_pg_recv(dt_pg *pg, void *buf, size_t count, dt_dtype dt, int peer)
{
    return p2p(pg, DT_COLL_RECV, buf, count, dt, peer, NULL);
}

dt_status dt_pg_sendrecv(dt_pg *pg, const void *sendbuf, size_t scount, int dst, void *recvbuf,
                         size_t rcount, int src, dt_dtype dt)
{
    /* Both halves posted before waiting: the group layer runs consecutive
     * send/recv requests as one batch, all in flight together. */
    dt_req *rq[2] = {NULL, NULL};
    dt_status st = DT_OK;
    if (dst >= 0)
        st = dt_pg_send_async(pg, sendbuf, scount, dt, dst, &rq[0]);
    if (st == DT_OK && src >= 0)
        st = dt_pg_recv_async(pg, recvbuf, rcount, dt, src, &rq[1]);
    dt_status wst = dt_req_wait_all(rq, 2, -1);
    dt_req_free(rq[0]);
    dt_req_free(rq[1]);
    return st < 0 ? st : wst;
}
