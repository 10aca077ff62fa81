/* The mpi backend's byte counters (the traffic slot; "bytes on the wire" in
 * include/dtrain/comm.h).
 *
 * MPI itself moves the bytes of its collectives, by algorithms this backend
 * does not see, so the counts come from the MPI library: Open MPI's
 * monitoring layer (pml "monitoring", on when the job is started with
 * `--mca pml_monitoring_enable 1`) counts, per destination process, the
 * payload bytes of every message its point-to-point layer sends (the
 * messages collectives are made of included), and exposes them as the
 * MPI_T performance variable "pml_monitoring_messages_size": one counter
 * per rank of the communicator the handle is bound to. We bind one handle
 * to MPI_COMM_WORLD, process-wide, when the first group is made (so the
 * counters run from then on) and read it for each group through the
 * group's world ranks. Another MPI, or Open MPI with the layer off: no
 * variable (or the layer's switch reads 0), the slot says
 * DT_ERR_UNSUPPORTED and dt_pg_traffic_read reports counted = 0. */
#include "mpi_impl.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_state;                 /* 0 not tried, 1 counting, -1 not available */
static MPI_T_pvar_session g_sess;
static MPI_T_pvar_handle g_h;
static int g_count;                 /* entries of the variable (world size) */
static unsigned long long *g_buf;

/* The monitoring layer's switch (cvar pml_monitoring_enable), 0 if absent. */
static int monitoring_enabled(void)
{
    int idx, count, val = 0;
    MPI_T_cvar_handle h;
    if (MPI_T_cvar_get_index("pml_monitoring_enable", &idx) != MPI_SUCCESS)
        return 0;
    if (MPI_T_cvar_handle_alloc(idx, NULL, &h, &count) != MPI_SUCCESS)
        return 0;
    if (count != 1 || MPI_T_cvar_read(h, &val) != MPI_SUCCESS)
        val = 0;
    MPI_T_cvar_handle_free(&h);
    return val;
}

static void start_locked(void)
{
    int prov, idx, verb, var_class, bind, readonly, continuous, atomic, nlen = 0, dlen = 0;
    MPI_Datatype dtype;
    MPI_T_enum en;
    g_state = -1;
    if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &prov) != MPI_SUCCESS)
        return;
    if (!monitoring_enabled() ||
        MPI_T_pvar_get_index("pml_monitoring_messages_size", MPI_T_PVAR_CLASS_SIZE, &idx) != MPI_SUCCESS ||
        MPI_T_pvar_get_info(idx, NULL, &nlen, &verb, &var_class, &dtype, &en, NULL, &dlen, &bind, &readonly,
                            &continuous, &atomic) != MPI_SUCCESS ||
        dtype != MPI_UNSIGNED_LONG_LONG)
        goto off;
    if (MPI_T_pvar_session_create(&g_sess) != MPI_SUCCESS)
        goto off;
    MPI_Comm world = MPI_COMM_WORLD;
    if (MPI_T_pvar_handle_alloc(g_sess, idx, &world, &g_h, &g_count) != MPI_SUCCESS || g_count < 1)
        goto no_handle;
    g_buf = calloc((size_t)g_count, sizeof *g_buf);
    if (!g_buf || (!continuous && MPI_T_pvar_start(g_sess, g_h) != MPI_SUCCESS)) {
        free(g_buf);
        g_buf = NULL;
        MPI_T_pvar_handle_free(g_sess, &g_h);
        goto no_handle;
    }
    g_state = 1;
    return;
no_handle:
    MPI_T_pvar_session_free(&g_sess);
off:
    MPI_T_finalize();
}

void dt__mpi_traffic_start(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_state == 0)
        start_locked();
    pthread_mutex_unlock(&g_mu);
}

dt_status dt__mpi_traffic(void *ctx, uint64_t *sent, int n)
{
    mpi_ctx *m = ctx;
    dt_status st = DT_OK;
    pthread_mutex_lock(&g_mu);
    if (g_state == 0)
        start_locked();
    if (g_state < 0) {
        st = DT_ERR_UNSUPPORTED;
    } else if (MPI_T_pvar_read(g_sess, g_h, g_buf) != MPI_SUCCESS) {
        st = dt_error(DT_ERR_IO, "mpi backend: reading Open MPI's pml_monitoring_messages_size failed");
    } else {
        for (int r = 0; r < n && r < m->size; r++)
            sent[r] = m->world[r] >= 0 && m->world[r] < g_count ? (uint64_t)g_buf[m->world[r]] : 0;
    }
    pthread_mutex_unlock(&g_mu);
    return st;
}
