/* The mpi backend's nonblocking send/recv (mpi_impl.h; the group layer
 * batches them). */
#include "mpi_impl.h"

/* ---- nonblocking send/recv (the group layer batches them) ---- */

typedef struct {
    dt_coll c;
    MPI_Request rq;
} mpi_p2p_op;

dt_status dt__mpi_p2p_start(void *ctx, const dt_coll *c, void **op)
{
    mpi_ctx *m = ctx;
    *op = NULL;
    if (dt__mpi_group_down(m, 0))
        return dt__mpi_down_error(m);
    if (m->failed)
        return dt_error(DT_ERR_STATE, "mpi backend: an earlier operation timed out; the "
                                      "communicator is unusable");
    if (!dt__mpi_fits_int(c->count))
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: %s of %zu elements exceeds MPI's int count",
                        dt_coll_kind_name(c->kind), c->count);
    mpi_p2p_op *o = calloc(1, sizeof *o);
    if (!o)
        return dt_error(DT_ERR_NO_MEMORY, "mpi backend: out of memory");
    o->c = *c;
    MPI_Datatype t = dt__mpi_type(c->dtype);
    dt__mpi_lock();
    int rc = c->kind == DT_COLL_SEND
                 ? MPI_Isend(c->send, (int)c->count, t, c->root, 0, m->comm, &o->rq)
                 : MPI_Irecv(c->recv, (int)c->count, t, c->root, 0, m->comm, &o->rq);
    dt__mpi_unlock();
    if (rc != MPI_SUCCESS) {
        free(o);
        return dt__mpi_err(rc, c->kind == DT_COLL_SEND ? "MPI_Isend" : "MPI_Irecv", c);
    }
    *op = o;
    return DT_OK;
}

/* Give up an incomplete send or receive and release op (MPI access held).
 * A receive is cancelled (local: MPI_Wait returns at once); a send MPI may
 * not cancel, so it is left to complete (or not) and the communicator is not
 * freed; its buffer is the caller's to keep (the pipeline keeps those of
 * sends it could not settle). */
static void p2p_drop(mpi_ctx *m, mpi_p2p_op *o)
{
    int flag = 0;
    if (MPI_Test(&o->rq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag && o->c.kind == DT_COLL_RECV &&
        MPI_Cancel(&o->rq) == MPI_SUCCESS) {
        /* A receive already matched with a large message cannot be
         * cancelled and completes only with its sender: wait for that up to
         * a second, not for ever. */
        double t0 = dt_time_s();
        while (MPI_Test(&o->rq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag && dt_time_s() - t0 < 1.0)
            dt__mpi_nap(100000);
    }
    if (!flag)
        m->abandoned = 1;
    free(o);
}

dt_status dt__mpi_p2p_test(void *ctx, void *op, int *progressed)
{
    mpi_ctx *m = ctx;
    mpi_p2p_op *o = op;
    if (!progressed) { /* abandoned (the group failed or it timed out) */
        dt__mpi_lock();
        p2p_drop(m, o);
        dt__mpi_unlock();
        return DT_OK;
    }
    *progressed = 0;
    int flag = 0;
    MPI_Status status;
    dt__mpi_lock();
    int rc = MPI_Test(&o->rq, &flag, &status);
    int down = rc == MPI_SUCCESS && !flag && (dt__mpi_group_down(m, 1) || dt__mpi_peer_died(m, &o->c));
    if (down)
        p2p_drop(m, o);
    dt__mpi_unlock();
    if (down)
        return dt__mpi_down_error(m);
    dt_status st = DT_INPROGRESS;
    if (rc != MPI_SUCCESS) {
        st = dt__mpi_err(rc, "MPI_Test", &o->c);
    } else if (flag) {
        *progressed = 1;
        st = DT_OK;
        if (o->c.kind == DT_COLL_RECV) {
            int got = 0;
            MPI_Get_count(&status, dt__mpi_type(o->c.dtype), &got);
            if ((size_t)got != o->c.count)
                st = dt_error(DT_ERR_MISMATCH,
                              "mpi backend: recv #%llu from rank %d expected %zu elements of "
                              "%s, the sender sent %d",
                              (unsigned long long)o->c.seq, o->c.root, o->c.count,
                              dt_dtype_name(o->c.dtype), got);
        }
    }
    if (st != DT_INPROGRESS)
        free(o);
    return st;
}

void dt__mpi_p2p_idle(void *ctx, int round, double max_s)
{
    mpi_ctx *m = ctx;
    if (round < 64)
        return; /* MPI progresses inside MPI_Test: poll again */
    if (round < 128 && dt__cpu_yield(&m->yield_off_until))
        return;
    long ns = round < 1024 ? 50000L : 1000000L;
    if (ns > (long)(max_s * 1e9))
        ns = (long)(max_s * 1e9);
    dt__mpi_nap(ns);
}
