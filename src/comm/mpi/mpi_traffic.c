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

/* ---- without the layer: what left the machine, as TCP counted it ----
 * Every connected TCP socket of this process whose peer address is neither
 * loopback nor the socket's own address leads to another machine (MPI's
 * TCP transport between nodes; inside a node MPI uses shared memory). The
 * kernel counts the bytes sent on each (TCP_INFO bytes_sent: payload,
 * retransmissions included). A connection closed since the last read takes
 * its bytes with it: MPI keeps its transport's connections for the job. */
#include <arpa/inet.h>
#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

static int same_or_loopback(const struct sockaddr_storage *me, const struct sockaddr_storage *peer)
{
    if (peer->ss_family == AF_INET) {
        const struct sockaddr_in *p = (const void *)peer, *m = (const void *)me;
        return (ntohl(p->sin_addr.s_addr) >> 24) == 127 || p->sin_addr.s_addr == m->sin_addr.s_addr;
    }
    if (peer->ss_family == AF_INET6) {
        const struct sockaddr_in6 *p = (const void *)peer, *m = (const void *)me;
        return IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) || IN6_IS_ADDR_V4MAPPED(&p->sin6_addr) ?
                   (IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) || p->sin6_addr.s6_addr[12] == 127 ||
                    !memcmp(&p->sin6_addr, &m->sin6_addr, sizeof p->sin6_addr)) :
                   !memcmp(&p->sin6_addr, &m->sin6_addr, sizeof p->sin6_addr);
    }
    return 1;
}

dt_status dt__mpi_traffic_off_node(void *ctx, uint64_t *left)
{
    (void)ctx;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return DT_ERR_UNSUPPORTED;
    uint64_t sum = 0;
    int sockets = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || fd < 0 || fd == dirfd(d))
            continue;
        struct stat st;
        int type = 0;
        socklen_t tl = sizeof type;
        if (fstat((int)fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
            getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM)
            continue;
        struct sockaddr_storage me, peer;
        socklen_t ml = sizeof me, pl = sizeof peer;
        if (getsockname((int)fd, (struct sockaddr *)&me, &ml) != 0 ||
            getpeername((int)fd, (struct sockaddr *)&peer, &pl) != 0 ||
            (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) || same_or_loopback(&me, &peer))
            continue;
        struct tcp_info ti;
        socklen_t il = sizeof ti;
        memset(&ti, 0, sizeof ti);
        if (getsockopt((int)fd, IPPROTO_TCP, TCP_INFO, &ti, &il) != 0 ||
            il < offsetof(struct tcp_info, tcpi_bytes_sent) + sizeof ti.tcpi_bytes_sent)
            continue;
        sum += ti.tcpi_bytes_sent;
        sockets++;
    }
    closedir(d);
    if (!sockets)
        return DT_ERR_UNSUPPORTED;
    *left = sum;
    return DT_OK;
}
