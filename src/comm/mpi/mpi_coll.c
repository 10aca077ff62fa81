/* The mpi backend's collectives (mpi_impl.h; backend_mpi.c says how it all
 * works): the mismatch check, the reductions (16-bit ones with f32
 * accumulation), the other collectives, and the blocking calls run on a
 * worker thread under the timeout. */
#include "mpi_impl.h"

dt_status dt__mpi_err(int code, const char *what, const dt_coll *c)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, s, &len);
    char d[160] = "";
    if (c)
        dt__coll_describe(c, d, sizeof d);
    return dt_error(DT_ERR_IO, "mpi backend: %s failed%s%s: %s", what, c ? " in " : "", d, s);
}

MPI_Datatype dt__mpi_type(dt_dtype dt)
{
    switch (dt) {
    case DT_F32: return MPI_FLOAT;
    case DT_F64: return MPI_DOUBLE;
    case DT_F16:
    case DT_BF16: return MPI_UINT16_T; /* moved as bits; reduced via f32 */
    case DT_I32: return MPI_INT32_T;
    case DT_I64: return MPI_INT64_T;
    case DT_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(dt_reduce_op op)
{
    switch (op) {
    case DT_REDUCE_SUM:
    case DT_REDUCE_AVG: return MPI_SUM;
    case DT_REDUCE_MAX: return MPI_MAX;
    case DT_REDUCE_MIN: return MPI_MIN;
    case DT_REDUCE_PROD: return MPI_PROD;
    default: return MPI_OP_NULL;
    }
}

/* ---- fingerprint check ---------------------------------------------- */

typedef struct {
    int64_t kind, count, dtype, op, root, counts_hash;
} coll_desc;

static void describe_desc(const coll_desc *d, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s(count=%lld, %s", dt_coll_kind_name((dt_coll_kind)d->kind),
                     (long long)d->count, dt_dtype_name((dt_dtype)d->dtype));
    if (k > 0 && (size_t)k < n && d->op >= 0)
        k += snprintf(buf + k, n - (size_t)k, ", %s", dt_reduce_op_name((dt_reduce_op)d->op));
    if (k > 0 && (size_t)k < n && d->root >= 0)
        k += snprintf(buf + k, n - (size_t)k, ", root=%lld", (long long)d->root);
    if (k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, ")");
}

static dt_status check_same(mpi_ctx *m, const dt_coll *c)
{
    coll_desc me = {c->kind, (int64_t)c->count, c->dtype, -1, -1, 0};
    switch (c->kind) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE_SCATTER: me.op = c->op; break;
    case DT_COLL_REDUCE: me.op = c->op; me.root = c->root; break;
    case DT_COLL_BROADCAST:
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER: me.root = c->root; break;
    case DT_COLL_ALLGATHERV:
        me.count = 0;
        me.counts_hash = (int64_t)dt_hash64(c->counts, sizeof(size_t) * (size_t)m->size, 0);
        break;
    case DT_COLL_BARRIER: me.count = 0; me.dtype = 0; break;
    default: break;
    }
    uint64_t fp = dt_hash64(&me, sizeof me, 0x6d7069);
    /* in the context, not on the stack: a request abandoned by a timeout
     * may still be completed by a late rank and write it (mpi_free keeps it
     * then) */
    uint64_t *v = m->chk;
    v[0] = fp;
    v[1] = ~fp;
    MPI_Request rq;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, m->comm, &rq);
    if (rc != MPI_SUCCESS)
        return dt__mpi_err(rc, "MPI_Iallreduce (collective check)", c);
    dt_status st = dt__mpi_wait_req(m, &rq, c, NULL);
    if (st < 0)
        return st;
    if (v[0] == fp && v[1] == ~fp)
        return DT_OK;
    /* Somebody differs: collect every rank's description and name one
     * rank that disagrees with this one (or with rank 0). */
    coll_desc *all = malloc(sizeof *all * (size_t)m->size);
    if (!all)
        return dt_error(DT_ERR_NO_MEMORY, "mpi backend: collective check");
    rc = MPI_Iallgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, m->comm, &rq);
    if (rc != MPI_SUCCESS) {
        free(all);
        return dt__mpi_err(rc, "MPI_Iallgather (collective check)", c);
    }
    st = dt__mpi_wait_req(m, &rq, c, NULL);
    if (st < 0) {
        free(all);
        return st;
    }
    int other = -1;
    for (int r = 0; r < m->size && other < 0; r++)
        if (memcmp(&all[r], &me, sizeof me))
            other = r;
    char a[160], b[160];
    describe_desc(&me, a, sizeof a);
    if (other < 0)
        other = 0;
    describe_desc(&all[other], b, sizeof b);
    free(all);
    return dt_error(DT_ERR_MISMATCH,
                    "mpi backend: collective #%llu differs between ranks: rank %d posted %s, "
                    "rank %d posted %s",
                    (unsigned long long)c->seq, m->rank, a, other, b);
}

/* ---- the operations ------------------------------------------------------ */

int dt__mpi_fits_int(size_t n)
{
    return n <= (size_t)INT_MAX;
}

/* In-place all-reduces of at least this many bytes on 4 or more ranks run
 * out of place from a copy (libnbc's choice, see run_reduction). */
#define INPLACE_COPY_BYTES 65536

/* Reductions (allreduce, reduce, reduce_scatter) on dtypes MPI can reduce. */
static dt_status run_reduction(mpi_ctx *m, const dt_coll *c, const void *send, void *recv,
                               MPI_Datatype t)
{
    MPI_Op op = mpi_op(c->op);
    size_t es = dt_dtype_size(c->dtype);
    MPI_Request rq;
    int rc = MPI_SUCCESS;
    if (c->kind == DT_COLL_ALLREDUCE || c->kind == DT_COLL_REDUCE) {
        int is_root = c->kind == DT_COLL_ALLREDUCE || c->root == m->rank;
        /* Chunks of at most INT_MAX elements (MPI counts are int). */
        for (size_t off = 0; off < c->count || off == 0; off += (size_t)INT_MAX) {
            size_t n = c->count - off < (size_t)INT_MAX ? c->count - off : (size_t)INT_MAX;
            const char *s = (const char *)send + off * es;
            char *r = recv ? (char *)recv + off * es : NULL;
            const void *sb = (is_root && r == s) ? MPI_IN_PLACE : (const void *)s;
            void *copy = NULL;
            if (c->kind == DT_COLL_ALLREDUCE && !m->blocking && sb == MPI_IN_PLACE &&
                m->size >= 4 && n * es >= INPLACE_COPY_BYTES && (copy = malloc(n * es))) {
                /* Open MPI's libnbc runs an in-place MPI_Iallreduce as a
                 * binomial reduce + broadcast (its ring and reduce-scatter/
                 * all-gather need a separate input): across nodes that sends
                 * twice the data out of the root's node, one direction at a
                 * time. A copy of the input takes the out-of-place algorithm. */
                dt__copy(copy, r, n * es);
                sb = copy;
            }
            if (c->kind == DT_COLL_ALLREDUCE) {
                if (m->blocking)
                    rc = MPI_Allreduce(sb, r, (int)n, t, op, m->comm);
                else
                    rc = MPI_Iallreduce(sb, r, (int)n, t, op, m->comm, &rq);
            } else {
                if (m->blocking)
                    rc = MPI_Reduce(sb, r, (int)n, t, op, c->root, m->comm);
                else
                    rc = MPI_Ireduce(sb, r, (int)n, t, op, c->root, m->comm, &rq);
            }
            if (rc != MPI_SUCCESS) {
                free(copy);
                return dt__mpi_err(rc, c->kind == DT_COLL_ALLREDUCE ? "MPI_Iallreduce" : "MPI_Ireduce", c);
            }
            if (!m->blocking) {
                dt_status st = dt__mpi_wait_req(m, &rq, c, NULL);
                if (st == DT_OK) /* else MPI may still read it (abandoned): leave it */
                    free(copy);
                if (st < 0)
                    return st;
            }
            if (c->count == 0)
                break;
        }
        return DT_OK;
    }
    /* reduce_scatter: MPI's in-place form (input in recv, result at its
     * start) is not NCCL's (recv = send + rank*count), so an aliased output
     * goes through a temporary. */
    if (!dt__mpi_fits_int(c->count))
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: reduce_scatter of %zu elements per rank "
                                            "exceeds MPI's int count", c->count);
    void *out = recv;
    void *tmp = NULL;
    if (c->in_place || (const char *)send + (size_t)m->rank * c->count * es == (char *)recv) {
        tmp = dt_alloc(c->count * es + 1);
        if (!tmp)
            return dt_error(DT_ERR_NO_MEMORY, "mpi backend: reduce_scatter temporary");
        out = tmp;
    }
    if (m->blocking)
        rc = MPI_Reduce_scatter_block(send, out, (int)c->count, t, op, m->comm);
    else
        rc = MPI_Ireduce_scatter_block(send, out, (int)c->count, t, op, m->comm, &rq);
    dt_status st = rc == MPI_SUCCESS ? DT_OK : dt__mpi_err(rc, "MPI_Ireduce_scatter_block", c);
    if (st == DT_OK && !m->blocking)
        st = dt__mpi_wait_req(m, &rq, c, NULL);
    if (st == DT_OK && tmp)
        memcpy(recv, tmp, c->count * es);
    dt_free(tmp);
    return st;
}

/* ---- f16 / bf16 reductions with 16-bit payloads -------------------------
 *
 * MPI cannot add 16-bit floats, and a user op would round at every step
 * of MPI's algorithm. So the reduction is done as a reduce-scatter made of
 * an all-to-all plus a local reduction, followed by an all-gather:
 *   1. the n elements are split into W chunks (the first n % W one longer);
 *      MPI_Ialltoallv deals rank r chunk r of every rank's input, as the
 *      16-bit values themselves;
 *   2. rank r combines its chunk's W contributions in rank order in f32
 *      (dt__reduce: the average divided by W, one rounding to 16 bits);
 *   3. all-reduce: MPI_Iallgatherv of the 16-bit chunks; reduce: MPI_Igatherv
 *      to the root; reduce-scatter: nothing (the chunk is the rank's block).
 * Bytes each rank sends for an all-reduce: 2 (W-1)/W n x 2 bytes, those of a
 * ring all-reduce on 16-bit data (the f32 widening this replaced sent twice
 * as many). Bits: sources in rank order, accumulated in f32 and rounded once,
 * as the shm backend's direct all-reduce (its ring rounds at every step). An
 * all-reduce or reduce of more than 2^30 elements runs in 2^30-element
 * pieces (MPI counts and displacements are int). */

/* Post (or run, blocking) one MPI collective and complete it. */
#define MPI_DO(m, c, what, blocking_call, nonblocking_call)                                        \
    do {                                                                                           \
        MPI_Request rq_;                                                                           \
        int rc_ = (m)->blocking ? (blocking_call) : (nonblocking_call);                            \
        if (rc_ != MPI_SUCCESS)                                                                    \
            return dt__mpi_err(rc_, what, c);                                                          \
        if (!(m)->blocking) {                                                                      \
            dt_status st_ = dt__mpi_wait_req((m), &rq_, (c), NULL);                                        \
            if (st_ < 0)                                                                           \
                return st_;                                                                        \
        }                                                                                          \
    } while (0)

/* One piece: n elements of every rank at send (rank r's chunk at disp[r],
 * cnt[r] long; for a reduce-scatter chunk r is block r), this rank's
 * reduced chunk into out (all-reduce: recv[disp], the whole n; reduce: the
 * root's recv; reduce-scatter: recv). tmp: W x cnt[me] 16-bit elements,
 * mine: cnt[me]. */
static dt_status half_piece(mpi_ctx *m, const dt_coll *c, const uint16_t *send, uint16_t *recv, int *cnt,
                            int *disp, int *rcnt, int *rdisp, uint16_t *tmp, uint16_t *mine)
{
    const int W = m->size, me = m->rank;
    const void *srcs_stack[64];
    const void **srcs = W <= 64 ? srcs_stack : malloc((size_t)W * sizeof *srcs);
    if (!srcs)
        return dt_error(DT_ERR_NO_MEMORY, "mpi backend: %d source pointers", W);
    for (int r = 0; r < W; r++) {
        rcnt[r] = cnt[me];
        rdisp[r] = r * cnt[me];
        srcs[r] = tmp + (size_t)r * (size_t)cnt[me];
    }
    dt_status st = DT_OK;
    do {
        MPI_DO(m, c, "MPI_Ialltoallv (16-bit reduction)",
               MPI_Alltoallv(send, cnt, disp, MPI_UINT16_T, tmp, rcnt, rdisp, MPI_UINT16_T, m->comm),
               MPI_Ialltoallv(send, cnt, disp, MPI_UINT16_T, tmp, rcnt, rdisp, MPI_UINT16_T, m->comm, &rq_));
        uint16_t *dst = c->kind == DT_COLL_REDUCE_SCATTER ? recv : mine;
        dt__reduce(c->dtype, c->op, dst, srcs, W, (size_t)cnt[me], W);
        if (c->kind == DT_COLL_ALLREDUCE)
            MPI_DO(m, c, "MPI_Iallgatherv (16-bit reduction)",
                   MPI_Allgatherv(mine, cnt[me], MPI_UINT16_T, recv, cnt, disp, MPI_UINT16_T, m->comm),
                   MPI_Iallgatherv(mine, cnt[me], MPI_UINT16_T, recv, cnt, disp, MPI_UINT16_T, m->comm, &rq_));
        else if (c->kind == DT_COLL_REDUCE)
            MPI_DO(m, c, "MPI_Igatherv (16-bit reduction)",
                   MPI_Gatherv(mine, cnt[me], MPI_UINT16_T, recv, cnt, disp, MPI_UINT16_T, c->root, m->comm),
                   MPI_Igatherv(mine, cnt[me], MPI_UINT16_T, recv, cnt, disp, MPI_UINT16_T, c->root, m->comm,
                                &rq_));
    } while (0);
    if (srcs != srcs_stack)
        free(srcs);
    return st;
}

static dt_status run_reduction_half(mpi_ctx *m, const dt_coll *c)
{
    const int W = m->size, me = m->rank;
    const size_t piece_max = (size_t)1 << 30;
    const bool rs = c->kind == DT_COLL_REDUCE_SCATTER;
    if (rs && (c->count > (size_t)INT_MAX / (size_t)W))
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: reduce_scatter of %zu %s elements per rank over %d "
                        "ranks exceeds MPI's int displacements", c->count, dt_dtype_name(c->dtype), W);
    if (c->count == 0)
        return DT_OK;
    const size_t piece = rs ? c->count : (c->count < piece_max ? c->count : piece_max);
    const size_t mine_n = rs ? c->count : (piece + (size_t)W - 1) / (size_t)W;
    int *ints = malloc(4 * (size_t)W * sizeof *ints);
    uint16_t *tmp = dt_alloc((size_t)W * mine_n * 2 + 2), *mine = dt_alloc(mine_n * 2 + 2);
    dt_status st = DT_OK;
    if (!ints || !tmp || !mine) {
        st = dt_error(DT_ERR_NO_MEMORY, "mpi backend: buffers of a %s reduction (%zu elements)",
                      dt_dtype_name(c->dtype), c->count);
        goto out;
    }
    int *cnt = ints, *disp = ints + W, *rcnt = ints + 2 * W, *rdisp = ints + 3 * W;
    const uint16_t *send = c->send;
    uint16_t *recv = c->recv;
    const bool gets = c->kind != DT_COLL_REDUCE || c->root == me;
    for (size_t off = 0; off < (rs ? 1 : c->count) && st >= 0; off += piece) {
        const size_t n = rs ? c->count * (size_t)W : (c->count - off < piece ? c->count - off : piece);
        for (int r = 0, at = 0; r < W; r++) {
            cnt[r] = rs ? (int)c->count : (int)(n / (size_t)W + ((size_t)r < n % (size_t)W));
            disp[r] = at;
            at += cnt[r];
        }
        st = half_piece(m, c, send + (rs ? 0 : off), rs ? recv : (gets ? recv + off : NULL), cnt, disp, rcnt, rdisp,
                        tmp, mine);
    }
out:
    free(ints);
    dt_free(tmp);
    dt_free(mine);
    return st;
}

static dt_status run_avg_finish(mpi_ctx *m, const dt_coll *c, dt_status st)
{
    if (st != DT_OK || c->op != DT_REDUCE_AVG || !c->recv)
        return st;
    if (c->kind == DT_COLL_REDUCE && c->root != m->rank)
        return st;
    dt__avg_finish(c->dtype, c->recv, c->count, m->size);
    return st;
}

static dt_status run_other(mpi_ctx *m, const dt_coll *c, MPI_Datatype t)
{
    size_t es = dt_dtype_size(c->dtype);
    int n = (int)c->count;
    if (!dt__mpi_fits_int(c->count) || !dt__mpi_fits_int(c->count * (size_t)m->size))
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: %s of %zu elements exceeds MPI's int count",
                        dt_coll_kind_name(c->kind), c->count);
    MPI_Request rq;
    MPI_Status status;
    int rc;
    const char *what = dt_coll_kind_name(c->kind);
    int *counts = NULL, *displs = NULL;
    switch (c->kind) {
    case DT_COLL_BROADCAST: {
        void *buf = c->recv ? c->recv : (void *)c->send;
        rc = MPI_Ibcast(buf, n, t, c->root, m->comm, &rq);
        break;
    }
    case DT_COLL_ALLGATHER: {
        const void *sb = c->in_place ? MPI_IN_PLACE : c->send;
        rc = MPI_Iallgather(sb, n, t, c->recv, n, t, m->comm, &rq);
        break;
    }
    case DT_COLL_ALLGATHERV: {
        counts = malloc(sizeof(int) * (size_t)m->size);
        displs = malloc(sizeof(int) * (size_t)m->size);
        if (!counts || !displs) {
            free(counts);
            free(displs);
            return dt_error(DT_ERR_NO_MEMORY, "mpi backend: allgatherv counts");
        }
        for (int r = 0; r < m->size; r++) {
            if (!dt__mpi_fits_int(c->counts[r]) || !dt__mpi_fits_int(c->displs[r])) {
                free(counts);
                free(displs);
                return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: allgatherv block of rank %d "
                                                    "exceeds MPI's int count", r);
            }
            counts[r] = (int)c->counts[r];
            displs[r] = (int)c->displs[r];
        }
        const void *sb = c->in_place ? MPI_IN_PLACE : c->send;
        rc = MPI_Iallgatherv(sb, counts[m->rank], t, c->recv, counts, displs, t, m->comm, &rq);
        break;
    }
    case DT_COLL_GATHER: {
        int root = c->root == m->rank;
        const void *sb = root && c->in_place ? MPI_IN_PLACE : c->send;
        rc = MPI_Igather(sb, n, t, c->recv, n, t, c->root, m->comm, &rq);
        break;
    }
    case DT_COLL_SCATTER: {
        int root = c->root == m->rank;
        void *rb = root && c->in_place ? MPI_IN_PLACE : c->recv;
        rc = MPI_Iscatter(c->send, n, t, rb, n, t, c->root, m->comm, &rq);
        break;
    }
    case DT_COLL_ALLTOALL: {
        const void *sb = c->in_place ? MPI_IN_PLACE : c->send;
        rc = MPI_Ialltoall(sb, n, t, c->recv, n, t, m->comm, &rq);
        break;
    }
    case DT_COLL_BARRIER:
        rc = MPI_Ibarrier(m->comm, &rq);
        break;
    case DT_COLL_SEND:
        rc = MPI_Isend(c->send, n, t, c->root, 0, m->comm, &rq);
        break;
    case DT_COLL_RECV:
        rc = MPI_Irecv(c->recv, n, t, c->root, 0, m->comm, &rq);
        break;
    default:
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: operation %s", what);
    }
    (void)es;
    dt_status st = rc == MPI_SUCCESS ? DT_OK : dt__mpi_err(rc, what, c);
    if (st == DT_OK)
        st = dt__mpi_wait_req(m, &rq, c, &status);
    free(counts);
    free(displs);
    if (st == DT_OK && c->kind == DT_COLL_RECV) {
        int got = 0;
        MPI_Get_count(&status, t, &got);
        if (got != n)
            return dt_error(DT_ERR_MISMATCH, "mpi backend: recv #%llu from rank %d expected %d "
                                             "elements of %s, the sender sent %d",
                            (unsigned long long)c->seq, c->root, n, dt_dtype_name(c->dtype), got);
    }
    return st;
}

static dt_status mpi_run_locked(void *ctx, const dt_coll *c);

/* ---- blocking calls under the timeout ----
 * With DT_MPI_BLOCKING=1 and MPI_THREAD_MULTIPLE, a blocking call runs on
 * the group's worker thread while the caller waits for it with the
 * operation's timeout, polling failure notices and answering the flight
 * recorder's queries: a peer's failure or the timeout ends the wait (the
 * worker stays inside MPI; the group is unusable, its context and
 * communicator are never freed and the process aborts the job at exit, as
 * after any timeout). Under MPI_THREAD_SERIALIZED the call runs on the
 * caller's thread and cannot be interrupted. */


static void *worker_main(void *arg)
{
    mpi_ctx *m = arg;
    mpi_worker *w = m->worker;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop)
            break;
        const dt_coll *c = w->job;
        w->job = NULL;
        pthread_mutex_unlock(&w->mu);
        dt_error_clear();
        dt_status st = mpi_run_locked(m, c);
        pthread_mutex_lock(&w->mu);
        w->st = st;
        snprintf(w->msg, sizeof w->msg, "%s", st < 0 ? dt_last_error() : "");
        w->done = 1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static dt_status run_on_worker(mpi_ctx *m, const dt_coll *c)
{
    mpi_worker *w = m->worker;
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w)
            return dt_error(DT_ERR_NO_MEMORY, "mpi backend: worker");
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->cv, NULL);
        m->worker = w;
        if (pthread_create(&w->thread, NULL, worker_main, m) != 0) {
            m->worker = NULL;
            free(w);
            return mpi_run_locked(m, c); /* no thread: uninterruptible, as under SERIALIZED */
        }
    }
    if (dt__mpi_group_down(m, 1)) /* known down: the call would not start anyway */
        return dt__mpi_down_error(m);
    pthread_mutex_lock(&w->mu);
    w->job = c;
    w->busy = 1;
    w->done = 0;
    pthread_cond_broadcast(&w->cv);
    double t0 = dt_time_s();
    for (unsigned long spins = 0; !w->done; spins++) {
        pthread_mutex_unlock(&w->mu);
        double now = dt_time_s();
        dt_status st = DT_OK;
        if (dt__mpi_down_ends(m, c, spins % 64 == 0) || (spins >= 1000 && dt__mpi_peer_died(m, c)))
            st = dt__mpi_down_error(m);
        else if (c->timeout_s > 0 && now - t0 > c->timeout_s) {
            char d[160];
            m->failed = 1;
            st = dt_error(DT_ERR_TIMEOUT, "mpi backend: %s timed out after %.3g s on rank %d of %d (a blocking "
                                          "call, DT_MPI_BLOCKING=1; the group is now unusable)",
                          dt__coll_describe(c, d, sizeof d), c->timeout_s, m->rank, m->size);
        }
        if (st < 0) {
            /* a short grace: a call that was about to end need not be left */
            for (int i = 0; i < 100; i++) {
                pthread_mutex_lock(&w->mu);
                int d = w->done;
                pthread_mutex_unlock(&w->mu);
                if (d)
                    break;
                dt__mpi_nap(1000000);
            }
            pthread_mutex_lock(&w->mu);
            if (w->done)
                break; /* it came back meanwhile */
            pthread_mutex_unlock(&w->mu);
            m->abandoned = 1; /* the worker still uses m and its communicator */
            m->stuck = 1;
            dt__mpi_stuck = 1;
            return st;
        }
        if (spins >= 1000 || !dt__cpu_yield(&m->yield_off_until))
            dt__mpi_nap(now - t0 < 0.1 ? 20000 : 200000);
        pthread_mutex_lock(&w->mu);
    }
    w->busy = 0;
    dt_status st = w->st;
    if (st < 0)
        dt_error(st, "%s", w->msg);
    pthread_mutex_unlock(&w->mu);
    return st;
}

dt_status dt__mpi_run(void *ctx, const dt_coll *c)
{
    mpi_ctx *m = ctx;
    if (m->blocking && dt__mpi_thread_multiple && c->kind != DT_COLL_SEND && c->kind != DT_COLL_RECV)
        return run_on_worker(m, c);
    dt__mpi_lock();
    dt_status st = mpi_run_locked(ctx, c);
    dt__mpi_unlock();
    return st;
}

static dt_status mpi_run_locked(void *ctx, const dt_coll *c)
{
    mpi_ctx *m = ctx;
    /* Blocking calls cannot be interrupted: a notice that has arrived keeps
     * the operation from starting. Nonblocking ones are posted even when
     * the group is known to be down, and fail in wait_req unless complete
     * at once: a rank late into a collective that timed out on the others
     * (their timeout's notice has reached it) thus still completes their
     * abandoned requests, so that their MPI_Finalize can (see
     * finalize_at_exit). The group layer posts nothing after that failure. */
    if (m->blocking && dt__mpi_group_down(m, 1))
        return dt__mpi_down_error(m);
    if (m->failed)
        return dt_error(DT_ERR_STATE, "mpi backend: an earlier operation timed out; the "
                                      "communicator is unusable");
    MPI_Datatype t = dt__mpi_type(c->dtype);
    if (c->kind != DT_COLL_BARRIER && t == MPI_DATATYPE_NULL)
        return dt_error(DT_ERR_INVALID_ARG, "mpi backend: dtype %d", (int)c->dtype);
    if (m->check && c->kind != DT_COLL_SEND && c->kind != DT_COLL_RECV) {
        dt_status st = check_same(m, c);
        if (st < 0)
            return st;
    }
    dt_status st;
    switch (c->kind) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE:
    case DT_COLL_REDUCE_SCATTER:
        if (mpi_op(c->op) == MPI_OP_NULL)
            return dt_error(DT_ERR_INVALID_ARG, "mpi backend: reduction %d", (int)c->op);
        if (c->dtype == DT_F16 || c->dtype == DT_BF16)
            st = run_reduction_half(m, c);
        else
            st = run_avg_finish(m, c, run_reduction(m, c, c->send, c->recv, t));
        break;
    default:
        st = run_other(m, c, t);
    }
    if (st >= 0 && c->kind != DT_COLL_SEND && c->kind != DT_COLL_RECV)
        atomic_fetch_add(&m->colls_done, 1); /* see down_done */
    return st;
}
