/* The mpi backend's byte counters (dt_pg_traffic_read) under mpirun -np 2:
 * with Open MPI's monitoring layer on (--mca pml_monitoring_enable 1, argv[1]
 * = "on") a send of K bytes adds exactly K to the count to the peer (the
 * layer counts payload bytes), an all-reduce of N f32 adds at least
 * (W-1)/W * 4N per rank, and a split group's traffic shows in the world
 * group's counts; with the layer off (argv[1] = "off") counted = 0. An
 * Open MPI whose layer does not load when asked (Debian's 4.1.4 unloads
 * it: its init finds monitoring disabled) skips the "on" half (77).
 * argv[1] = "bed" (tests/comm/netbed_test.sh traffic: 2 nodes x 1 rank of
 * the test bed, no layer): the bytes that left the node, as TCP counted
 * them (retransmissions included), for an all-reduce of 4 Mi f32 lie
 * between half and all of it, plus up to 1/16 for retransmissions. */
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "mpi_traffic: check failed: %s: ", #c);                                \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define OK(e) CHECK((e) >= 0, "%s", dt_last_error())

int main(int argc, char **argv)
{
    int on = argc > 1 && !strcmp(argv[1], "on");
    int bed = argc > 1 && !strcmp(argv[1], "bed");
    dt_pg_params p = dt_pg_params_default();
    dt_pg *pg;
    OK(dt_pg_init(&p, &pg));
    int me = dt_pg_rank(pg), W = dt_pg_size(pg), peer = 1 - me;
    CHECK(W == 2, "run with -np 2 (got %d)", W);
    dt_pg_topo topo;
    OK(dt_pg_topology(pg, &topo));
    uint64_t a[2], b[2], c[2];
    dt_pg_traffic ta, tb, tc;
    OK(dt_pg_barrier(pg));
    OK(dt_pg_traffic_read(pg, &ta, a, 2));
    if (bed) { /* 2 nodes of the test bed: what left the node, counted by TCP */
        CHECK(ta.counted && ta.nodes_known, "counted %d nodes_known %d on the bed", ta.counted, ta.nodes_known);
        enum { NB = 1 << 22 };
        float *y = calloc(NB, sizeof *y);
        CHECK(y != NULL, "oom");
        OK(dt_pg_allreduce(pg, DT_IN_PLACE, y, NB, DT_F32, DT_REDUCE_SUM));
        OK(dt_pg_barrier(pg));
        OK(dt_pg_traffic_read(pg, &tb, NULL, 0));
        uint64_t d = tb.sent_cross_node - ta.sent_cross_node;
        /* any all-reduce algorithm on 2 ranks sends at least half the vector; a ring or
           recursive halving sends half, recursive doubling the whole; TCP's count includes
           retransmissions, which a loaded machine causes (17,111,962 bytes seen for the
           16,777,216 of recursive doubling under a test suite's load): up to 1/16 more */
        CHECK(d >= (uint64_t)NB * 2 && d <= (uint64_t)NB * 4 + (uint64_t)NB / 4 + (256u << 10),
              "all-reduce of %d f32 across 2 nodes: %llu bytes left the node", NB, (unsigned long long)d);
        free(y);
        dt_pg_free(pg);
        printf("mpi_traffic: bed: rank %d: %llu bytes left the node (per_peer %d)\n", me, (unsigned long long)d,
               tb.per_peer);
        return 0;
    }
    if (!on) {
        CHECK(!ta.counted && !ta.sent && !a[0] && !a[1], "counted %d sent %llu with the layer off", ta.counted,
              (unsigned long long)ta.sent);
        dt_pg_free(pg);
        printf("mpi_traffic: off: not counted, as expected\n");
        return 0;
    }
    if (!ta.counted) { /* Debian's Open MPI 4.1.4 unloads the layer even when asked for it */
        fprintf(stderr, "skip: Open MPI's pml monitoring layer did not load (pml_monitoring_enable=1 was "
                        "given): this MPI cannot count bytes per peer\n");
        dt_pg_free(pg);
        return 77;
    }
    CHECK(ta.nodes_known, "nodes_known %d", ta.nodes_known);
    enum { K = 1 << 20, N = 1 << 20 };
    char *buf = calloc(K, 1);
    float *x = calloc(N, sizeof *x);
    CHECK(buf && x, "oom");
    if (me == 0)
        OK(dt_pg_send(pg, buf, K, DT_U8, 1));
    else
        OK(dt_pg_recv(pg, buf, K, DT_U8, 0));
    OK(dt_pg_traffic_read(pg, &tb, b, 2));
    uint64_t want = me == 0 ? K : 0;
    CHECK(b[peer] - a[peer] == want, "send of %d bytes: counted %llu, want %llu", K,
          (unsigned long long)(b[peer] - a[peer]), (unsigned long long)want);
    dt_pg *dup;
    OK(dt_pg_dup(pg, &dup));
    OK(dt_pg_traffic_read(pg, &tb, b, 2));
    OK(dt_pg_allreduce(dup, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_SUM));
    OK(dt_pg_traffic_read(pg, &tc, c, 2));
    CHECK(c[peer] - b[peer] >= (uint64_t)N * 4 / 2 && c[peer] - b[peer] <= (uint64_t)N * 4 + 4096,
          "all-reduce of %d f32 on a duplicate: %llu bytes counted to the peer", N,
          (unsigned long long)(c[peer] - b[peer]));
    CHECK(tc.sent - tb.sent == c[peer] - b[peer], "sent %llu != per peer %llu",
          (unsigned long long)(tc.sent - tb.sent), (unsigned long long)(c[peer] - b[peer]));
    CHECK(tc.sent_cross_node - tb.sent_cross_node == (topo.nnodes == 2 ? tc.sent - tb.sent : 0),
          "cross-node %llu on %d nodes", (unsigned long long)(tc.sent_cross_node - tb.sent_cross_node),
          topo.nnodes);
    dt_pg_free(dup);
    free(buf);
    free(x);
    dt_pg_free(pg);
    printf("mpi_traffic: rank %d: send exact, all-reduce %llu bytes to the peer\n", me,
           (unsigned long long)(c[peer] - b[peer]));
    return 0;
}
