/* Failures are errors, never hangs (shm backend, real processes):
 * mismatched collectives, timeouts, ranks that die or leave, stale and
 * removed segments; plus subgroups, asynchronous requests, bounded waits,
 * and start-up from launcher environments (dtrain's and torchrun's with a
 * TCP rendezvous). */
// dt-test-timeout: 180
// dt-test-labels: threads
#include "comm/proc_alive.h"
#include "harness.h"
#include "test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

void dt__shm_segment_name(const char *job_id, char *buf, size_t n);

static int shm_exists(const char *job)
{
    char name[96], path[128];
    dt__shm_segment_name(job, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* ---- mismatch ---- */
static int body_mismatch(int rank, int size, void *arg)
{
    int variant = *(int *)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    float buf[64] = {0};
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, buf, 8, DT_F32, DT_REDUCE_SUM)); /* a good one first */
    double t0 = dt_time_s();
    th_shared[rank] = t0; /* when each rank posted */
    dt_status st;
    if (variant == 0) { /* count differs on rank 1, kind differs on rank 2 */
        if (rank == 2)
            st = dt_pg_broadcast(pg, buf, 10, DT_F32, 0);
        else
            st = dt_pg_allreduce(pg, DT_IN_PLACE, buf, rank == 1 ? 12 : 10, DT_F32, DT_REDUCE_SUM);
    } else if (variant == 1) { /* dtype */
        st = dt_pg_allreduce(pg, DT_IN_PLACE, buf, 10, rank == 1 ? DT_I32 : DT_F32, DT_REDUCE_SUM);
    } else if (variant == 2) { /* root */
        st = dt_pg_broadcast(pg, buf, 10, DT_F32, rank == 2 ? 1 : 0);
    } else { /* reduction op, on a large (staged) message */
        static float big[40000];
        st = dt_pg_allreduce(pg, DT_IN_PLACE, big, 40000, DT_F32,
                             rank == 0 ? DT_REDUCE_MAX : DT_REDUCE_SUM);
    }
    /* detection time counted from the last rank's post (scheduling on a
     * loaded machine may delay a rank's post, not the detection) */
    double last = 0;
    for (int r = 0; r < size; r++)
        last = th_shared[r] > last ? th_shared[r] : last;
    double dt_s = dt_time_s() - last;
    TH_CHECK(st == DT_ERR_MISMATCH, "got %s: %s", dt_status_name(st), dt_last_error());
    TH_CHECK(dt_s < 1.0, "mismatch took %.2f s after the last rank posted", dt_s);
    const char *m = dt_last_error();
    TH_CHECK(strstr(m, "mismatch at sequence number 1"), "message: %s", m);
    if (variant == 0)
        TH_CHECK(strstr(m, "rank 0 posted allreduce(count=10") && strstr(m, "rank 1 posted allreduce(count=12"),
                 "message: %s", m);
    if (variant == 1)
        TH_CHECK(strstr(m, "i32") && strstr(m, "f32"), "message: %s", m);
    if (variant == 2)
        TH_CHECK(strstr(m, "root=0") && strstr(m, "root=1"), "message: %s", m);
    if (variant == 3)
        TH_CHECK(strstr(m, "max") && strstr(m, "sum"), "message: %s", m);
    /* the group is failed: later collectives fail at once, same status */
    TH_CHECK(dt_pg_status(pg) == DT_ERR_MISMATCH, "status %s", dt_status_name(dt_pg_status(pg)));
    TH_CHECK(dt_pg_barrier(pg) == DT_ERR_MISMATCH, "barrier after failure");
    dt_req *rq = NULL;
    TH_CHECK(dt_pg_barrier_async(pg, &rq) == DT_ERR_MISMATCH && rq == NULL, "async after failure");
    dt_pg_free(pg);
    return 0;
}

TEST(mismatch)
{
    for (int v = 0; v < 4; v++) {
        int arg = v;
        ASSERT_EQ_INT(th_run(3, 20.0, body_mismatch, &arg, NULL), 0);
    }
}

static int body_p2p_mismatch(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    int x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    if (rank == 0) {
        dt_pg_send(pg, x, 5, DT_I32, 1); /* buffered: may succeed */
        dt_status st = dt_pg_barrier(pg);
        TH_CHECK(st == DT_ERR_MISMATCH, "sender's next op: %s %s", dt_status_name(st), dt_last_error());
    } else {
        dt_status st = dt_pg_recv(pg, x, 6, DT_I32, 0);
        TH_CHECK(st == DT_ERR_MISMATCH, "recv: %s %s", dt_status_name(st), dt_last_error());
        TH_CHECK(strstr(dt_last_error(), "count=5") && strstr(dt_last_error(), "count=6"), "%s",
                 dt_last_error());
    }
    dt_pg_free(pg);
    return 0;
}

TEST(p2p_mismatch) { ASSERT_EQ_INT(th_run(2, 20.0, body_p2p_mismatch, NULL, NULL), 0); }

/* ---- timeout ---- */
static int body_timeout(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    float v = 1;
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, &v, 1, DT_F32, DT_REDUCE_SUM));
    if (rank == 2) { /* stuck elsewhere until the others timed out */
        TH_WAIT_UNTIL(th_shared[0] != 0 && th_shared[1] != 0, 10000);
        dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, &v, 1, DT_F32, DT_REDUCE_SUM);
        TH_CHECK(st == DT_ERR_TIMEOUT, "late rank: %s %s", dt_status_name(st), dt_last_error());
        dt_pg_free(pg);
        return 0;
    }
    double t0 = dt_time_s();
    dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, &v, 1, DT_F32, DT_REDUCE_SUM);
    double el = dt_time_s() - t0;
    th_shared[rank] = 1;
    TH_CHECK(st == DT_ERR_TIMEOUT, "got %s: %s", dt_status_name(st), dt_last_error());
    TH_CHECK(el > 0.3 && el < 3.0, "timed out after %.2f s, want about 0.4", el);
    const char *m = dt_last_error();
    TH_CHECK(strstr(m, "allreduce(count=1, f32, sum) #1") && strstr(m, "rank 2 did not arrive"),
             "message: %s", m);
    dt_pg_free(pg);
    return 0;
}

TEST(timeout)
{
    setenv("DT_COMM_TIMEOUT", "0.4", 1);
    ASSERT_EQ_INT(th_run(3, 20.0, body_timeout, NULL, NULL), 0);
    unsetenv("DT_COMM_TIMEOUT");
}

/* ---- a dead or departed peer ---- */
typedef struct {
    int how;  /* 0: _exit before the op, 1: SIGKILL mid-operation, 2: dt_pg_free and leave */
    int victim;
} death;

/* Mid-operation death, made certain: one survivor (the gate) joins the
 * operation only once the victim, whose part of it is posted, has died
 * (dt__proc_gone, as the backend asks it), so the operation cannot complete
 * before the kill however late the victim is scheduled (on a loaded machine
 * its 2 ms sleep ran long enough for the whole operation to finish first:
 * the survivors then got DT_OK). The victim leaves its identity at
 * VICTIM_AT in the shared page and sets th_shared[1]. */
#define VICTIM_AT 2048

static void gate_on_victim(void)
{
    TH_WAIT_UNTIL(th_shared[1] != 0, 5000);
    if (th_shared[1] == 0)
        return; /* the victim never posted: its own check fails the run */
    __sync_synchronize();
    dt__proc_id me, victim;
    memcpy(&victim, (const char *)th_shared + VICTIM_AT, sizeof victim);
    dt__proc_id_self(&me);
    int fd = -2;
    TH_WAIT_UNTIL(dt__proc_gone(&me, &victim, &fd), 5000);
    dt__proc_id_close(&fd);
}

static int body_death(int rank, int size, void *arg)
{
    const death *d = arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    size_t n = 300000; /* staged in pieces: long enough to be killed inside */
    float *buf = calloc(n, sizeof *buf);
    TH_CHECK(buf != NULL, "calloc");
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, buf, 16, DT_F32, DT_REDUCE_SUM));
    if (rank == d->victim) {
        th_shared[0] = dt_time_s();
        if (d->how == 0)
            _exit(3);
        if (d->how == 2) {
            dt_pg_free(pg);
            free(buf);
            return 0;
        }
        dt_req *rq;
        TH_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, buf, n, DT_F32, DT_REDUCE_SUM, &rq));
        dt__proc_id me; /* posted: the gate waits for this process to end */
        dt__proc_id_self(&me);
        memcpy((char *)th_shared + VICTIM_AT, &me, sizeof me);
        __sync_synchronize();
        th_shared[1] = 1;
        th_nap_ms(2);
        th_shared[0] = dt_time_s();
        dt_test_kill(getpid(), SIGKILL);
    }
    if (rank == d->victim) /* how 0 and 2 returned above */
        return 1;
    if (d->how == 1 && rank == (d->victim == 0 ? 1 : 0))
        gate_on_victim();
    double t0 = dt_time_s();
    dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, buf, n, DT_F32, DT_REDUCE_SUM);
    double now = dt_time_s(), el = now - (th_shared[0] > t0 ? th_shared[0] : t0);
    TH_CHECK(st == DT_ERR_PEER_FAILED, "got %s: %s", dt_status_name(st), dt_last_error());
    TH_CHECK(el < 5.0, "noticed %.2f s after the peer died", el);
    char want[32];
    snprintf(want, sizeof want, "rank %d (pid", d->victim);
    TH_CHECK(strstr(dt_last_error(), want), "message: %s", dt_last_error());
    if (d->how == 2)
        TH_CHECK(strstr(dt_last_error(), "left the group"), "message: %s", dt_last_error());
    /* later collectives fail at once */
    t0 = dt_time_s();
    TH_CHECK(dt_pg_barrier(pg) == DT_ERR_PEER_FAILED, "barrier after failure");
    TH_CHECK(dt_time_s() - t0 < 0.5, "failure not immediate");
    dt_pg_free(pg);
    free(buf);
    return 0;
}

TEST(peer_death)
{
    setenv("DT_COMM_TIMEOUT", "30", 1);
    setenv("DT_SHM_STAGING_KB", "64", 1);
    death cases[] = {{0, 3}, {1, 1}, {2, 2}, {1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int codes[8];
        int rc = th_run(4, 20.0, body_death, &cases[i], codes);
        ASSERT(rc != TH_HANG);
        for (int r = 0; r < 4; r++) {
            int want = r != cases[i].victim ? 0
                       : cases[i].how == 0 ? 3
                       : cases[i].how == 1 ? 128 + SIGKILL
                                           : 0;
            ASSERT_EQ_INT(codes[r], want);
        }
        ASSERT(!shm_exists(th_job));
    }
    unsetenv("DT_SHM_STAGING_KB");
    unsetenv("DT_COMM_TIMEOUT");
}

/* ---- the segment: unlinked once everyone attached, stale names refused ---- */
static int body_segment(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    TH_OK(dt_pg_barrier(pg));
    TH_CHECK(!shm_exists(th_job), "segment still has a name after start-up");
    dt_pg_free(pg);
    return 0;
}

TEST(segment_lifecycle)
{
    ASSERT_EQ_INT(th_run(4, 20.0, body_segment, NULL, NULL), 0);
    ASSERT(!shm_exists(th_job));

    /* A name that already exists (a crashed run with the same job id) is
     * refused, never reused. */
    char name[96], job[64]; /* the job is this process's: two runs of this test at once must not share it */
    snprintf(job, sizeof job, "stale-job-test-%d", (int)getpid());
    dt__shm_segment_name(job, name, sizeof name);
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    ASSERT(fd >= 0);
    close(fd);
    dt_pg_params p = dt_pg_params_default();
    p.rank = 0;
    p.world_size = 2;
    p.job_id = job;
    p.backend = "shm";
    dt_pg *pg = NULL;
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "crashed run");
    shm_unlink(name);

    /* No job id and no rendezvous address: a clear error. */
    p.job_id = NULL;
    unsetenv("DT_JOB_ID");
    unsetenv("MASTER_PORT");
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "DT_JOB_ID");
}

/* ---- configuration errors ---- */
static int body_cfg(int rank, int size, void *arg)
{
    (void)arg;
    if (rank == 1)
        setenv("DT_SHM_ALGO", "allreduce:ring", 1);
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    float v[4] = {0};
    dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, v, 4, DT_F32, DT_REDUCE_SUM);
    TH_CHECK(st == DT_ERR_MISMATCH && strstr(dt_last_error(), "DT_SHM_ALGO"), "%s: %s",
             dt_status_name(st), dt_last_error());
    dt_pg_free(pg);
    return 0;
}

TEST(config_errors)
{
    dt_pg_params p = dt_pg_params_default();
    p.rank = 0;
    p.world_size = 2;
    p.job_id = "cfg-test-never-created";
    dt_pg *pg = NULL;
    p.backend = "shm?fast=1";
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "fast=1");
    p.backend = "shm";
    setenv("DT_SHM_ALGO", "allreduce:0-1K:warp", 1);
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "warp");
    setenv("DT_SHM_ALGO", "allreduce:1K-0:ring", 1);
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_INVALID_ARG);
    setenv("DT_SHM_ALGO", "gather:ring", 1);
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "gather has no ring");
    setenv("DT_SHM_ALGO", "allgatherx:direct", 1);
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_INVALID_ARG);
    unsetenv("DT_SHM_ALGO");
    setenv("DT_SHM_STAGING_KB", "1", 1);
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_INVALID_ARG);
    unsetenv("DT_SHM_STAGING_KB");
    /* ranks with different algorithm tables fail their first collective */
    ASSERT_EQ_INT(th_run(2, 20.0, body_cfg, NULL, NULL), 0);
}

/* ---- subgroups ---- */
static int body_subgroup(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg, *odd = NULL, *even = NULL;
    TH_OK(th_pg(rank, size, NULL, &pg));
    int odds[2] = {3, 1}, evens[2] = {0, 2};
    TH_OK(dt_pg_subgroup(pg, odds, 2, &odd));
    TH_OK(dt_pg_subgroup(pg, evens, 2, &even));
    dt_pg *mine = rank % 2 ? odd : even, *other = rank % 2 ? even : odd;
    TH_CHECK(mine != NULL && other == NULL, "membership");
    int want_rank = rank == 3 ? 0 : rank == 1 ? 1 : rank / 2;
    TH_CHECK(dt_pg_rank(mine) == want_rank && dt_pg_size(mine) == 2, "rank %d size %d",
             dt_pg_rank(mine), dt_pg_size(mine));
    double v = rank + 1;
    TH_OK(dt_pg_allreduce(mine, DT_IN_PLACE, &v, 1, DT_F64, DT_REDUCE_SUM));
    TH_CHECK(v == (rank % 2 ? 2 + 4 : 1 + 3), "sub allreduce %g", v);
    int64_t b = rank == 3 || rank == 0 ? 100 + rank : -1;
    TH_OK(dt_pg_broadcast(mine, &b, 1, DT_I64, 0));
    TH_CHECK(b == (rank % 2 ? 103 : 100), "sub broadcast %lld", (long long)b);
    float big[5000];
    for (int i = 0; i < 5000; i++)
        big[i] = (float)(rank + i % 3);
    TH_OK(dt_pg_allreduce(mine, DT_IN_PLACE, big, 5000, DT_F32, DT_REDUCE_MAX));
    TH_CHECK(big[4] == (float)((rank % 2 ? 3 : 2) + 1), "sub big %g", big[4]);
    /* the parent still works, in order */
    v = 1;
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, &v, 1, DT_F64, DT_REDUCE_SUM));
    TH_CHECK(v == size, "parent after subgroups %g", v);
    /* a subgroup of one */
    dt_pg *solo = NULL;
    int one_rank = 2;
    TH_OK(dt_pg_subgroup(pg, &one_rank, 1, &solo));
    TH_CHECK((rank == 2) == (solo != NULL), "solo membership");
    if (solo) {
        float f = 5;
        TH_OK(dt_pg_allreduce(solo, DT_IN_PLACE, &f, 1, DT_F32, DT_REDUCE_AVG));
        TH_CHECK(f == 5, "solo %g", f);
        dt_pg_free(solo);
    }
    dt_pg_free(odd);
    dt_pg_free(even);
    TH_OK(dt_pg_barrier(pg));
    dt_pg_free(pg);
    return 0;
}

/* Two top-level groups from the same job id, created in the same order,
 * used interleaved, freed in another order; then a third. */
static int body_two_groups(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *a, *b, *c;
    TH_OK(th_pg(rank, size, NULL, &a));
    TH_OK(th_pg(rank, size, NULL, &b));
    for (int it = 0; it < 20; it++) {
        int32_t x = rank + it, y = 2 * rank;
        TH_OK(dt_pg_allreduce(it % 2 ? a : b, DT_IN_PLACE, &x, 1, DT_I32, DT_REDUCE_SUM));
        TH_OK(dt_pg_allreduce(it % 2 ? b : a, DT_IN_PLACE, &y, 1, DT_I32, DT_REDUCE_MAX));
        TH_CHECK(x == size * (size - 1) / 2 + size * it && y == 2 * (size - 1), "it %d: %d %d",
                 it, (int)x, (int)y);
    }
    dt_pg_free(a);
    TH_OK(dt_pg_barrier(b));
    TH_OK(th_pg(rank, size, NULL, &c));
    TH_OK(dt_pg_barrier(c));
    dt_pg_free(b);
    dt_pg_free(c);
    return 0;
}

TEST(two_groups_same_job) { ASSERT_EQ_INT(th_run(3, 20.0, body_two_groups, NULL, NULL), 0); }

TEST(subgroups) { ASSERT_EQ_INT(th_run(4, 20.0, body_subgroup, NULL, NULL), 0); }

/* ---- asynchronous requests and bounded waits ---- */
static int body_async(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    enum { N = 6, LEN = 20000 };
    float *bufs[N];
    dt_req *rq[N];
    for (int k = 0; k < N; k++) {
        bufs[k] = dt_pg_alloc(pg, LEN * sizeof(float));
        TH_CHECK(bufs[k] != NULL, "alloc %s", dt_last_error());
        for (int i = 0; i < LEN; i++)
            bufs[k][i] = (float)(rank * k + i % 5);
        TH_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, bufs[k], LEN, DT_F32, DT_REDUCE_SUM, &rq[k]));
    }
    TH_OK(dt_req_wait_all(rq, N, -1));
    for (int k = 0; k < N; k++) {
        float want = (float)(k * (size * (size - 1) / 2) + size * 3);
        TH_CHECK(bufs[k][3] == want, "async result %d: %g want %g", k, bufs[k][3], want);
        dt_req_free(rq[k]);
        dt_pg_dealloc(pg, bufs[k]);
    }
    /* a bounded wait returns DT_INPROGRESS while a peer is late */
    float v = 1;
    dt_req *r;
    if (rank == 1) /* post only after rank 0's bounded wait ran out */
        TH_WAIT_UNTIL(th_shared[10] != 0, 10000);
    TH_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, &v, 1, DT_F32, DT_REDUCE_SUM, &r));
    if (rank == 0) {
        dt_status st = dt_req_wait(r, 0.05);
        TH_CHECK(st == DT_INPROGRESS, "bounded wait: %s", dt_status_name(st));
        TH_CHECK(dt_req_test(r) == DT_INPROGRESS, "test while running");
        th_shared[10] = 1;
    }
    TH_OK(dt_req_wait(r, 10.0));
    TH_CHECK(v == size, "late allreduce %g", v);
    dt_req_free(r);
    /* arena exhaustion is an error, not a crash */
    void *huge = dt_pg_alloc(pg, (size_t)1 << 40);
    TH_CHECK(huge == NULL && dt_last_status() == DT_ERR_NO_MEMORY, "huge alloc");
    dt_pg_free(pg);
    return 0;
}

TEST(async_requests) { ASSERT_EQ_INT(th_run(3, 20.0, body_async, NULL, NULL), 0); }

/* ---- launcher environments ---- */
static int body_env(int rank, int size, void *arg)
{
    int torchrun = *(int *)arg;
    char b[32];
    snprintf(b, sizeof b, "%d", rank);
    setenv(torchrun ? "RANK" : "DT_RANK", b, 1);
    setenv(torchrun ? "LOCAL_RANK" : "DT_LOCAL_RANK", b, 1);
    snprintf(b, sizeof b, "%d", size);
    setenv(torchrun ? "WORLD_SIZE" : "DT_WORLD_SIZE", b, 1);
    setenv(torchrun ? "LOCAL_WORLD_SIZE" : "DT_LOCAL_WORLD_SIZE", b, 1);
    if (!torchrun)
        setenv("DT_JOB_ID", th_job, 1);
    dt_pg *pg;
    TH_OK(dt_pg_init(NULL, &pg));
    TH_CHECK(!strcmp(dt_pg_backend(pg), "shm"), "default backend %s", dt_pg_backend(pg));
    TH_CHECK(dt_pg_rank(pg) == rank && dt_pg_size(pg) == size, "rank/size");
    int64_t v = rank;
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, &v, 1, DT_I64, DT_REDUCE_SUM));
    TH_CHECK(v == size * (size - 1) / 2, "sum %lld", (long long)v);
    dt_pg_free(pg);
    return 0;
}

TEST(launcher_environments)
{
    int dtrain = 0, torchrun = 1;
    ASSERT_EQ_INT(th_run(3, 20.0, body_env, &dtrain, NULL), 0);
    /* a free port: let the kernel pick one, then release it */
    int sfd = socket(AF_INET, SOCK_STREAM, 0), pnum = 20000 + (int)(getpid() % 20000);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (sfd >= 0 && bind(sfd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(sfd, (struct sockaddr *)&sa, &sl) == 0)
        pnum = ntohs(sa.sin_port);
    if (sfd >= 0)
        close(sfd);
    char port[16];
    snprintf(port, sizeof port, "%d", pnum);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    unsetenv("DT_JOB_ID");
    ASSERT_EQ_INT(th_run(3, 30.0, body_env, &torchrun, NULL), 0);
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(mismatch);
    RUN(p2p_mismatch);
    RUN(timeout);
    RUN(peer_death);
    RUN(segment_lifecycle);
    RUN(config_errors);
    RUN(two_groups_same_job);
    RUN(subgroups);
    RUN(async_requests);
    RUN(launcher_environments);
    return TEST_REPORT();
}
