/* Point-to-point latency and CPU cost at a pipeline's message size: the
 * handoffs of bench/pipe_bubble (a micro-batch's activations, 16 x 1024
 * f32 = 64 KiB, by default), run under the launcher with one compute
 * thread per rank:
 *
 *     dtrain run -n 2 -- build/bench/p2p_pingpong [--bytes N] [--iters K] [--gap-us G] [--pin 0|1]
 *
 * Rank 0 sends N bytes to rank 1, which sends them back; each mode runs K
 * round trips and rank 0 prints the minimum and median of half a round
 * trip (one transfer), and the CPU seconds both ranks spent per transfer
 * (getrusage of the whole process: the progress thread included), next
 * to a memcpy of N bytes. Modes:
 *
 *   blocking  dt_pg_send / dt_pg_recv (the caller moves the bytes)
 *   async     dt_pg_send_async / dt_pg_recv_async posted when needed, then
 *             dt_req_wait (the pipeline executor's path before the receive
 *             was posted ahead: the group's progress thread moves them)
 *   prepost   the receive posted one round trip ahead, as the executor's
 *             RECV actions do, then dt_req_wait
 *
 * With --gap-us G the peer computes (spins) G microseconds before it
 * answers, so the waiter waits about that long (the pipeline case: the
 * next stage is still computing); the reported latency is the round trip
 * less G, halved. --pin 1 (the default) binds rank r to CPU r mod ncpu. */
#define _GNU_SOURCE
#include "dtrain/dtrain.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static long arg(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return strtol(argv[i + 1], NULL, 10);
    return def;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void compute(double us)
{
    double until = dt_time_s() + us * 1e-6;
    while (dt_time_s() < until)
        ;
}

enum { BLOCKING, ASYNC, PREPOST, NMODE };
static const char *k_names[NMODE] = {"blocking", "async", "prepost"};

/* One transfer of n floats from `from` to `to`; rq: the receive posted
 * ahead (prepost), replaced by the next one. */
static dt_status xfer(dt_pg *pg, int mode, float *buf, size_t n, int from, int to, dt_req **rq, float *next)
{
    int r = dt_pg_rank(pg);
    dt_status st = DT_OK;
    if (r == from) {
        if (mode == BLOCKING)
            return dt_pg_send(pg, buf, n, DT_F32, to);
        dt_req *s;
        if ((st = dt_pg_send_async(pg, buf, n, DT_F32, to, &s)) < 0)
            return st;
        st = dt_req_wait(s, -1);
        dt_req_free(s);
        return st;
    }
    if (mode == BLOCKING)
        return dt_pg_recv(pg, buf, n, DT_F32, from);
    if (mode == ASYNC) {
        dt_req *q;
        if ((st = dt_pg_recv_async(pg, buf, n, DT_F32, from, &q)) < 0)
            return st;
        st = dt_req_wait(q, -1);
        dt_req_free(q);
        return st;
    }
    st = dt_req_wait(*rq, -1);
    dt_req_free(*rq);
    *rq = NULL;
    if (st >= 0 && next)
        st = dt_pg_recv_async(pg, next, n, DT_F32, from, rq);
    return st;
}

int main(int argc, char **argv)
{
    long bytes = arg(argc, argv, "--bytes", 65536), K = arg(argc, argv, "--iters", 2000);
    double gap = (double)arg(argc, argv, "--gap-us", 0);
    if (bytes < 4 || K < 1 || gap < 0) {
        fprintf(stderr, "p2p_pingpong: need --bytes >= 4, --iters >= 1, --gap-us >= 0\n");
        return 2;
    }
    dt_set_num_threads(1);
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0) {
        fprintf(stderr, "p2p_pingpong: %s\n", dt_last_error());
        return 1;
    }
    int P = dt_pg_size(pg), r = dt_pg_rank(pg);
    if (P != 2) {
        fprintf(stderr, "p2p_pingpong: run with 2 ranks (dtrain run -n 2)\n");
        dt_pg_free(pg);
        return 2;
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (arg(argc, argv, "--pin", 1) && ncpu > 0) {
        cpu_set_t cs;
        CPU_ZERO(&cs);
        CPU_SET((int)(r % ncpu), &cs);
        if (sched_setaffinity(0, sizeof cs, &cs) < 0)
            perror("p2p_pingpong: sched_setaffinity");
    }
    size_t n = (size_t)bytes / sizeof(float);
    float *buf[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    double *lat = malloc((size_t)K * sizeof *lat);
    if (!buf[0] || !buf[1] || !lat)
        return 1;
    for (size_t i = 0; i < n; i++)
        buf[0][i] = buf[1][i] = (float)i;
    /* memcpy of the same size, for scale */
    double mc = 1e9;
    for (int i = 0; i < 200; i++) {
        double t0 = dt_time_s();
        memcpy(buf[i & 1], buf[(i + 1) & 1], n * sizeof(float));
        double t = dt_time_s() - t0;
        mc = t < mc ? t : mc;
    }
    if (r == 0)
        printf("p2p_pingpong: %ld bytes, %ld round trips per mode, peer computes %.0f us before answering; "
               "memcpy %.1f us\n", bytes, K, gap, mc * 1e6);
    for (int mode = 0; mode < NMODE; mode++) {
        dt_status st = dt_pg_barrier(pg);
        dt_req *rq = NULL;
        if (st >= 0 && mode == PREPOST)
            st = dt_pg_recv_async(pg, buf[0], n, DT_F32, 1 - r, &rq);
        double c0 = cpu_s();
        for (long k = 0; k < K && st >= 0; k++) {
            float *b = buf[k & 1], *nb = mode == PREPOST && k + 1 < K ? buf[(k + 1) & 1] : NULL;
            double t0 = dt_time_s();
            if (r == 0) {
                st = xfer(pg, mode, b, n, 0, 1, &rq, nb);
                if (st >= 0)
                    st = xfer(pg, mode, b, n, 1, 0, &rq, nb);
                lat[k] = (dt_time_s() - t0 - gap * 1e-6) / 2;
            } else {
                st = xfer(pg, mode, b, n, 0, 1, &rq, nb);
                compute(gap);
                if (st >= 0)
                    st = xfer(pg, mode, b, n, 1, 0, &rq, nb);
            }
        }
        if (st < 0) {
            fprintf(stderr, "p2p_pingpong: %s: %s\n", k_names[mode], dt_last_error());
            return 1;
        }
        double cpu = cpu_s() - c0, both = 0;
        /* CPU per transfer less the peer's compute gap */
        double mine = (cpu - (r == 1 ? K * gap * 1e-6 : 0)) / (2.0 * (double)K);
        if (dt_pg_allreduce(pg, &mine, &both, 1, DT_F64, DT_REDUCE_SUM) < 0)
            return 1;
        if (r == 0) {
            qsort(lat, (size_t)K, sizeof *lat, cmp_d);
            printf("%-9s one transfer: min %.1f us, median %.1f us, p90 %.1f us | CPU of both ranks %.1f us "
                   "per transfer\n", k_names[mode], lat[0] * 1e6, lat[K / 2] * 1e6, lat[K * 9 / 10] * 1e6,
                   both * 1e6);
        }
    }
    free(lat);
    free(buf[0]);
    free(buf[1]);
    dt_pg_free(pg);
    return 0;
}
