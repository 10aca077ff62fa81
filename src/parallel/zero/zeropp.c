/* ZeRO++'s collectives (zeropp.h): the quantized all-gather (qwZ) and the
 * quantized two-hop reduce-scatter (qgZ) over the machines of a group.
 *
 * qgZ with N machines of L ranks, rank (a, l) = a L + l, in = W pieces of n:
 *   hop 1, inside machine a: to local rank j go the pieces of ranks (n', j)
 *     for every machine n' (N pieces, each quantized on its own); from every
 *     local rank i arrive its pieces of ranks (n', l), dequantized and
 *     summed in i order: acc[n'] = machine a's partial sum of piece (n', l);
 *   hop 2, across machines (the ranks with local index l): acc[n'] goes
 *     quantized to machine n'; from every machine arrives its partial sum
 *     of my piece, summed in machine order.
 * Each hop is two all-to-alls, the quantized bytes and the scales. */
#include "dtrain/zeropp.h"

#include "dtrain/kernels.h"

#include <stdlib.h>
#include <string.h>

struct dt_zpp {
    dt_pg *world, *local, *cross;
    dt_pg_topo topo;
};

dt_status dt_zpp_init(dt_pg *pg, dt_zpp **out)
{
    if (!pg || !out)
        return dt_error(DT_ERR_NULL, "dt_zpp_init: NULL group or out");
    *out = NULL;
    dt_zpp *z = calloc(1, sizeof *z);
    if (!z)
        return dt_error(DT_ERR_NO_MEMORY, "dt_zpp_init: out of memory");
    z->world = pg;
    dt_status st = dt_pg_topology(pg, &z->topo);
    int r = dt_pg_rank(pg), L = z->topo.local_size;
    /* every rank decides the same: the layout is the same on all after the topology's all-gather */
    int ok = st >= 0 && z->topo.homogeneous && r == z->topo.node * L + z->topo.local_rank, all_ok = ok;
    if (st >= 0)
        st = dt_pg_allreduce(pg, &ok, &all_ok, 1, DT_I32, DT_REDUCE_MIN);
    if (st >= 0 && !all_ok)
        st = dt_error(DT_ERR_UNSUPPORTED,
                      "ZeRO++ collectives need the ranks numbered machine by machine with the same number on each "
                      "(rank = machine x ranks-per-machine + local rank); this group has %d machine(s) and rank %d is "
                      "local rank %d of %d on machine %d",
                      z->topo.nnodes, r, z->topo.local_rank, L, z->topo.node);
    if (st >= 0)
        st = dt_pg_split(pg, z->topo.node, r, &z->local);
    if (st >= 0)
        st = dt_pg_split(pg, z->topo.local_rank, r, &z->cross);
    if (st < 0) {
        dt_zpp_free(z);
        return st;
    }
    *out = z;
    return DT_OK;
}

void dt_zpp_free(dt_zpp *z)
{
    if (!z)
        return;
    dt_pg_free(z->cross);
    dt_pg_free(z->local);
    free(z);
}

int dt_zpp_nodes(const dt_zpp *z) { return z ? z->topo.nnodes : 0; }
int dt_zpp_local_size(const dt_zpp *z) { return z ? z->topo.local_size : 0; }

static int64_t nblocks(size_t n, int64_t block) { return ((int64_t)n + block - 1) / block; }

dt_status dt_zpp_allgather_q8(dt_pg *pg, const float *shard, size_t n, int64_t block, float *out)
{
    const char *fn = "dt_zpp_allgather_q8";
    if (!pg || (n && (!shard || !out)))
        return dt_error(DT_ERR_NULL, "%s: NULL group or buffer", fn);
    if (block <= 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: block size %lld must be > 0", fn, (long long)block);
    const int W = dt_pg_size(pg);
    const int64_t nb = nblocks(n, block);
    int8_t *q = malloc(n + 1), *qa = malloc(n * (size_t)W + 1);
    float *s = malloc(sizeof *s * (size_t)(nb + 1)), *sa = malloc(sizeof *sa * (size_t)(nb * W + 1));
    dt_status st = q && qa && s && sa ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
    if (st >= 0)
        st = dt_k_quantize_blocks(shard, (int64_t)n, block, 8, q, s);
    if (st >= 0)
        st = dt_pg_allgather(pg, q, qa, n, DT_U8); /* int8 values, moved as bytes */
    if (st >= 0)
        st = dt_pg_allgather(pg, s, sa, (size_t)nb, DT_F32);
    for (int r = 0; r < W && st >= 0; r++)
        st = dt_k_dequantize_blocks(qa + (size_t)r * n, sa + r * nb, (int64_t)n, block, 8, out + (size_t)r * n,
                                    false);
    free(q);
    free(qa);
    free(s);
    free(sa);
    return st;
}

/* One hop: `pieces` (P destinations x k pieces of n floats, destination
 * major) go quantized through an all-to-all over g; acc (k pieces of n) =
 * the sum over the sources, in rank order, of what they sent here. */
static dt_status hop(dt_pg *g, const float *pieces, int k, size_t n, int64_t block, int bits, float *acc)
{
    const int P = dt_pg_size(g);
    const size_t qb = (size_t)dt_k_quant_bytes((int64_t)n, bits), nb = (size_t)nblocks(n, block);
    const size_t per = (size_t)P * (size_t)k;
    uint8_t *qs = malloc(qb * per + 1), *qr = malloc(qb * per + 1);
    float *ss = malloc(sizeof *ss * (nb * per + 1)), *sr = malloc(sizeof *sr * (nb * per + 1));
    dt_status st = qs && qr && ss && sr ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "ZeRO++ reduce-scatter: out of memory");
    for (size_t i = 0; i < per && st >= 0; i++)
        st = dt_k_quantize_blocks(pieces + i * n, (int64_t)n, block, bits, qs + i * qb, ss + i * nb);
    if (st >= 0)
        st = dt_pg_alltoall(g, qs, qr, qb * (size_t)k, DT_U8);
    if (st >= 0)
        st = dt_pg_alltoall(g, ss, sr, nb * (size_t)k, DT_F32);
    for (int src = 0; src < P && st >= 0; src++)
        for (int j = 0; j < k && st >= 0; j++) {
            size_t i = (size_t)src * (size_t)k + (size_t)j;
            st = dt_k_dequantize_blocks(qr + i * qb, sr + i * nb, (int64_t)n, block, bits, acc + (size_t)j * n,
                                        src > 0);
        }
    free(qs);
    free(qr);
    free(ss);
    free(sr);
    return st;
}

dt_status dt_zpp_reduce_scatter_q(dt_zpp *z, const float *in, float *out, size_t n, int64_t block, int bits,
                                  bool average)
{
    const char *fn = "dt_zpp_reduce_scatter_q";
    if (!z || (n && (!in || !out)))
        return dt_error(DT_ERR_NULL, "%s: NULL state or buffer", fn);
    if (block <= 0 || (bits != 4 && bits != 8))
        return dt_error(DT_ERR_INVALID_ARG, "%s: block %lld and %d bits (block > 0; 4 or 8 bits)", fn,
                        (long long)block, bits);
    const int N = z->topo.nnodes, L = z->topo.local_size, W = N * L;
    float *send = malloc(sizeof *send * ((size_t)W * n + 1)), *acc = malloc(sizeof *acc * ((size_t)N * n + 1));
    dt_status st = send && acc ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
    /* hop 1: to local rank j, the pieces of ranks (n', j), n' = 0..N-1 */
    if (st >= 0) {
        for (int j = 0; j < L; j++)
            for (int m = 0; m < N; m++)
                memcpy(send + ((size_t)j * (size_t)N + (size_t)m) * n, in + (size_t)(m * L + j) * n, sizeof *send * n);
        st = hop(z->local, send, N, n, block, bits, acc);
    }
    /* hop 2: to machine m, its partial sum acc[m]; back, every machine's partial of mine */
    if (st >= 0)
        st = N > 1 ? hop(z->cross, acc, 1, n, block, bits, out) : (memcpy(out, acc, sizeof *out * n), DT_OK);
    if (st >= 0 && average)
        for (size_t i = 0; i < n; i++)
            out[i] /= (float)W;
    free(send);
    free(acc);
    return st;
}
