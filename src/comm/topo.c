/* Node detection: which ranks of a group share a machine.
 *
 * Every rank computes a 64-bit node key and the keys are all-gathered; ranks
 * with equal keys form a node, nodes are numbered in the order of their
 * lowest rank, and a rank's local rank is its place among its node's ranks
 * in group order. The key is the host name hashed together with the
 * identity of the rank's network namespace (/proc/self/ns/net): separate
 * machines differ by host name, and the namespaces of scripts/netbed.sh,
 * which share one host name, differ by namespace, just as Open MPI sees them
 * (its --host list names the namespaces' addresses).
 *
 * Why not the launcher's local rank/size (OMPI_COMM_WORLD_LOCAL_*, Slurm's
 * SLURM_LOCALID, torchrun's LOCAL_RANK)? They say how many ranks share this
 * rank's machine but not which ones: `mpirun --map-by node` puts ranks 0 and
 * 2 on one machine and 1 and 3 on the other. The group's own local rank and
 * size (from those variables) stay as they are; the all-gather is one small
 * collective, run once when a hierarchical group is made.
 *
 * $DT_SIM_LOCAL_SIZE=S replaces the key by rank / S, so tests (and users
 * trying the hierarchical path) get several "nodes" on one machine. A bad
 * value on any rank fails the call on every rank (the rank contributes an
 * invalid key instead of leaving the others waiting in the all-gather). */
#include "comm/pg.h"

#include <pthread.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_INVALID UINT64_MAX

static uint64_t machine_key(void)
{
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) < 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    uint64_t ns[2] = {0, 0};
    struct stat st;
    if (stat("/proc/self/ns/net", &st) == 0) {
        ns[0] = (uint64_t)st.st_ino;
        ns[1] = (uint64_t)st.st_dev;
    }
    uint64_t k = dt_hash64(host, strlen(host), dt_hash64(ns, sizeof ns, 0x746f706f));
    return k == KEY_INVALID ? k - 1 : k;
}

dt_status dt_pg_topology(dt_pg *pg, dt_pg_topo *out)
{
    if (!pg || !out)
        return dt_error(DT_ERR_NULL, "dt_pg_topology: NULL argument");
    memset(out, 0, sizeof *out);
    int64_t sim = 0;
    char bad[256] = "";
    uint64_t mine;
    if (dt_env_int("DT_SIM_LOCAL_SIZE", 0, 1, 1 << 20, &sim) < 0) {
        snprintf(bad, sizeof bad, "%s", dt_last_error());
        mine = KEY_INVALID;
    } else if (sim > 0) {
        mine = (uint64_t)(pg->rank / sim);
    } else {
        mine = machine_key();
    }
    int W = pg->size;
    uint64_t *all = malloc((size_t)W * sizeof *all);
    if (!all)
        return dt_error(DT_ERR_NO_MEMORY, "dt_pg_topology: out of memory");
    dt_status st = dt_pg_allgather(pg, &mine, all, 1, DT_I64);
    if (st < 0) {
        free(all);
        return dt_error_wrap(st, "dt_pg_topology: exchanging node keys");
    }
    for (int r = 0; r < W; r++)
        if (all[r] == KEY_INVALID) {
            free(all);
            if (bad[0])
                return dt_error(DT_ERR_INVALID_ARG, "dt_pg_topology: %s", bad);
            return dt_error(DT_ERR_INVALID_ARG,
                            "dt_pg_topology: rank %d has an invalid DT_SIM_LOCAL_SIZE (it says "
                            "which); set the same count >= 1 on every rank, or unset it",
                            r);
        }
    /* node of each rank = number of distinct keys first seen before it */
    int nnodes = 0, node = -1, lrank = 0, lsize = 0, homog = 1;
    int *first = malloc((size_t)W * sizeof *first); /* first rank of node i */
    int *cnt = calloc((size_t)W, sizeof *cnt);
    if (!first || !cnt) {
        free(first);
        free(cnt);
        free(all);
        return dt_error(DT_ERR_NO_MEMORY, "dt_pg_topology: out of memory");
    }
    for (int r = 0; r < W; r++) {
        int n = 0;
        while (n < nnodes && all[first[n]] != all[r])
            n++;
        if (n == nnodes)
            first[nnodes++] = r;
        if (r == pg->rank) {
            node = n;
            lrank = cnt[n];
        }
        cnt[n]++;
    }
    lsize = cnt[node];
    /* every rank's node, kept for dt_pg_traffic_read's cross-node split */
    int *node_of = malloc((size_t)W * sizeof *node_of);
    if (node_of) {
        for (int r = 0; r < W; r++) {
            int n = 0;
            while (all[first[n]] != all[r])
                n++;
            node_of[r] = n;
        }
        pthread_mutex_lock(&pg->mu);
        free(pg->node_of);
        pg->node_of = node_of;
        pthread_mutex_unlock(&pg->mu);
    }
    for (int n = 1; n < nnodes; n++)
        homog &= cnt[n] == cnt[0];
    *out = (dt_pg_topo){.node = node, .nnodes = nnodes, .local_rank = lrank, .local_size = lsize,
                        .homogeneous = homog, .simulated = sim > 0};
    free(first);
    free(cnt);
    free(all);
    return DT_OK;
}

/* A backend that counts only what leaves the machine (traffic_off_node). */
static dt_status off_node(dt_pg *pg, dt_pg_traffic *out)
{
    uint64_t left = 0;
    if (!pg->ops->traffic_off_node)
        return DT_OK;
    dt_status st = pg->ops->traffic_off_node(pg->ctx, &left);
    if (st == DT_ERR_UNSUPPORTED)
        return DT_OK;
    if (st < 0)
        return st;
    out->counted = 1;
    out->nodes_known = 1;
    out->sent = out->sent_cross_node = left;
    return DT_OK;
}

dt_status dt_pg_traffic_read(dt_pg *pg, dt_pg_traffic *out, uint64_t *per_peer, int n)
{
    if (!pg || !out)
        return dt_error(DT_ERR_NULL, "dt_pg_traffic_read: NULL argument");
    memset(out, 0, sizeof *out);
    int W = pg->size;
    if (per_peer && n < W)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_pg_traffic_read: per_peer has %d entries, the group has %d ranks; pass "
                        "an array of dt_pg_size(pg) entries",
                        n, W);
    if (per_peer)
        memset(per_peer, 0, (size_t)W * sizeof *per_peer);
    if (!pg->ops->traffic)
        return off_node(pg, out);
    uint64_t *sent = per_peer ? per_peer : calloc((size_t)W, sizeof *sent);
    if (!sent)
        return dt_error(DT_ERR_NO_MEMORY, "dt_pg_traffic_read: out of memory");
    dt_status st = pg->ops->traffic(pg->ctx, sent, W);
    if (st == DT_ERR_UNSUPPORTED) {
        memset(sent, 0, (size_t)W * sizeof *sent);
        st = off_node(pg, out);
    } else if (st >= 0) {
        out->counted = 1;
        out->per_peer = 1;
        sent[pg->rank] = 0;
        pthread_mutex_lock(&pg->mu);
        out->nodes_known = pg->node_of != NULL;
        for (int r = 0; r < W; r++) {
            out->sent += sent[r];
            if (pg->node_of && pg->node_of[r] != pg->node_of[pg->rank])
                out->sent_cross_node += sent[r];
        }
        pthread_mutex_unlock(&pg->mu);
    }
    if (!per_peer)
        free(sent);
    return st;
}
