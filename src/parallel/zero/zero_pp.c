/* ZeRO++ inside the stage-3 engine (parallel.h "ZeRO++"; the collectives
 * are zeropp.h's).
 *
 * qwZ. A unit's gather sends, per rank, one message of
 *     [c int8 values, padded to 4 bytes][ceil(c / block) f32 scales]
 * (one all-gather of bytes on the gather channel, so the engine's request
 * bookkeeping stays one request per unit) and dequantizes every rank's
 * message into the unit's whole parameters when it completes. A bf16/f16
 * unit goes through f32 on both ends (the same rounding as an f32 unit,
 * then the unit's own). The shard itself is never written.
 *
 * hpZ. H consecutive ranks form a secondary group (split of the gather
 * channel: group rank = rank % H). When a unit is freed after its
 * forward, rank keeps slice rank % H of the H slices of the gathered
 * parameters; the unit's backward gather (and a backward prefetch of it)
 * is then an all-gather of those slices in the group, which rebuilds
 * exactly what the forward gathered. The slice is dropped when that
 * gather completes, and by the step (the parameters change). The forward
 * always gathers from the primary shards.
 *
 * qgZ. The reduce-scatter of a unit is dt_zpp_reduce_scatter_q over the
 * shard group, run at once when the unit's gradients are complete: the
 * flat's piece r is rank r's shard range, which is the layout that
 * function takes. A reduce dtype other than f32 goes through f32. */
#include "dtrain/kernels.h"
#include "dtrain/zeropp.h"
#include "parallel/zero/zero_impl.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_zero_pp_check(const dt_zero_params *p, int world)
{
    if (!p)
        return dt_error(DT_ERR_NULL, "dt_zero_pp_check: params is NULL");
    const bool on = p->quantized_weights || p->quantized_gradients || p->hpz_partition_size != 1;
    if (p->hpz_partition_size < 1)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ zero_hpz_partition_size %d: a number of ranks >= 1 (1: off)",
                        p->hpz_partition_size);
    if (p->quant_block < 1 || p->quant_block > (int64_t)1 << 30 || p->quant_grad_block < 1 ||
        p->quant_grad_block > (int64_t)1 << 30)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ quant_block %lld, quant_grad_block %lld: elements per scale, "
                        "1 to 2^30", (long long)p->quant_block, (long long)p->quant_grad_block);
    if (p->quant_grad_bits != 4 && p->quant_grad_bits != 8)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ quant_grad_bits %d: 4 or 8", p->quant_grad_bits);
    if (!on)
        return DT_OK;
    const char *what = p->hpz_partition_size != 1 ? "zero_hpz_partition_size"
                       : p->quantized_weights     ? "zero_quantized_weights"
                                                  : "zero_quantized_gradients";
    if (p->stage != 3)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ (%s) needs ZeRO stage 3 (FULL_SHARD); this is stage %d", what,
                        p->stage);
    if (p->hybrid_shard_size > 0 && p->hybrid_shard_size < world)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ (%s) with hybrid sharding (hybrid_shard_size %d): ZeRO++ shards "
                        "over all ranks (FULL_SHARD); drop one of the two", what, p->hybrid_shard_size);
    if (p->offload_param.device == DT_OFFLOAD_NVME)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ (%s) with parameter offload to NVMe: not combined; drop one",
                        what);
    const int H = p->hpz_partition_size;
    if (H > 1 && world % H)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ zero_hpz_partition_size %d does not divide the %d ranks", H, world);
    if (H > 1 && !p->reshard_after_forward)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ zero_hpz_partition_size %d with reshard_after_forward off: units "
                        "stay gathered until their backward, so there is no backward all-gather to keep in the "
                        "machine; drop one", H);
    return DT_OK;
}

dt_status dt_zpp_hpz_check(dt_pg *pg, int hpz)
{
    if (!pg)
        return dt_error(DT_ERR_NULL, "dt_zpp_hpz_check: group is NULL");
    if (hpz <= 1)
        return DT_OK;
    dt_pg_topo t;
    dt_status st = dt_pg_topology(pg, &t);
    if (st < 0)
        return dt_error_wrap(st, "ZeRO++: finding the machines");
    const int W = dt_pg_size(pg);
    if (W % hpz)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ zero_hpz_partition_size %d does not divide the %d ranks", hpz, W);
    if ((t.nnodes > 1 || t.simulated) && (hpz != t.local_size || !t.homogeneous))
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ zero_hpz_partition_size %d: the %d ranks run on %d machine(s) "
                        "with %d rank(s) on this one%s; set it to the ranks per machine (the backward all-gather "
                        "must stay inside a machine)",
                        hpz, W, t.nnodes, t.local_size, t.homogeneous ? "" : " (not the same on every machine)");
    return DT_OK;
}

dt_status dt__zpp_setup(dt_zero *z)
{
    const int H = z->p.hpz_partition_size;
    dt_status st;
    if (H > 1) {
        const int r = dt_pg_rank(z->gpg);
        if ((st = dt_zpp_hpz_check(z->pg, H)) < 0)
            return st;
        if ((st = dt_pg_split(z->gpg, r / H, r, &z->hzpg)) < 0)
            return dt_error_wrap(st, "ZeRO++: the hpZ group");
    }
    if (z->p.quantized_gradients && (st = dt_zpp_init(z->pg, &z->zpp)) < 0)
        return dt_error_wrap(st, "ZeRO++: the quantized reduce-scatter's groups");
    return DT_OK;
}

void dt__zpp_teardown(dt_zero *z)
{
    for (int i = 0; i < z->nu; i++)
        dt__zpp_drop_secondary(z, &z->u[i]);
    dt_zpp_free(z->zpp);
    z->zpp = NULL;
    dt_pg_free(z->hzpg);
    z->hzpg = NULL;
}

/* qwZ message layout of a unit: bytes per rank and where the scales start. */
static size_t q_scales_at(const zunit *u) { return (u->c + 3) & ~(size_t)3; }
static size_t q_nblocks(const dt_zero *z, const zunit *u)
{
    return (u->c + (size_t)z->p.quant_block - 1) / (size_t)z->p.quant_block;
}
static size_t q_msg(const dt_zero *z, const zunit *u) { return q_scales_at(u) + q_nblocks(z, u) * sizeof(float); }

static dt_status post_quantized(dt_zero *z, zunit *u)
{
    const size_t msg = q_msg(z, u), W = (size_t)z->W;
    const int64_t c = (int64_t)u->c;
    char *buf = malloc(msg * (W + 1));
    float *tmp = u->dtype != DT_F32 ? malloc(sizeof *tmp * (u->c + 1)) : NULL;
    dt_status st = buf && (u->dtype == DT_F32 || tmp) ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "qwZ: %zu bytes", msg * W);
    const float *x = (const float *)u->pshard;
    if (st >= 0 && tmp) {
        st = dt_k_convert(u->pshard, u->dtype, tmp, DT_F32, c);
        x = tmp;
    }
    if (st >= 0)
        st = dt_k_quantize_blocks(x, c, z->p.quant_block, 8, buf, (float *)(buf + q_scales_at(u)));
    free(tmp);
    if (st >= 0) /* the receive part follows the send part */
        st = dt_pg_allgather_async(z->gpg, buf, buf + msg, msg, DT_U8, &u->ag);
    if (st < 0) {
        free(buf);
        return st;
    }
    u->qbuf = buf;
    z->stats.gathers_quantized++;
    return DT_OK;
}

dt_status dt__zpp_post_gather(dt_zero *z, zunit *u, bool bwd, bool *posted)
{
    *posted = false;
    if (bwd && u->sec && z->hzpg) {
        const size_t n = u->total / (size_t)z->p.hpz_partition_size;
        dt_status st = dt_pg_allgather_async(z->hzpg, u->sec, u->full, n, u->dtype, &u->ag);
        if (st < 0)
            return st;
        u->sec_inflight = true;
        z->stats.gathers_secondary++;
        *posted = true;
        return DT_OK;
    }
    dt__zpp_drop_secondary(z, u); /* a forward gather: the parameters may have changed */
    if (!z->p.quantized_weights)
        return DT_OK;
    dt_status st = post_quantized(z, u);
    *posted = st >= 0;
    return st;
}

dt_status dt__zpp_finish_gather(dt_zero *z, zunit *u, dt_status st)
{
    if (u->sec_inflight) {
        u->sec_inflight = false;
        dt__zpp_drop_secondary(z, u);
    }
    if (!u->qbuf)
        return st;
    const size_t msg = q_msg(z, u);
    const int64_t c = (int64_t)u->c;
    float *tmp = u->dtype != DT_F32 && st >= 0 ? malloc(sizeof *tmp * (u->c + 1)) : NULL;
    if (st >= 0 && u->dtype != DT_F32 && !tmp)
        st = dt_error(DT_ERR_NO_MEMORY, "qwZ: %zu bytes", u->c * sizeof *tmp);
    for (int r = 0; r < z->W && st >= 0; r++) {
        const char *m = u->qbuf + msg * (size_t)(r + 1);
        char *dst = u->full + (size_t)r * u->c * u->es;
        st = dt_k_dequantize_blocks(m, (const float *)(m + q_scales_at(u)), c, z->p.quant_block, 8,
                                    tmp ? tmp : (float *)dst, false);
        if (st >= 0 && tmp)
            st = dt_k_convert(tmp, DT_F32, dst, u->dtype, c);
    }
    free(tmp);
    free(u->qbuf);
    u->qbuf = NULL;
    return st;
}

void dt__zpp_keep_secondary(dt_zero *z, zunit *u)
{
    const int H = z->p.hpz_partition_size;
    if (!z->hzpg || u->resident || !u->gathered || u->ag)
        return;
    const size_t bytes = u->total / (size_t)H * u->es;
    if (!u->sec) {
        if (!(u->sec = malloc(bytes)))
            return; /* no secondary: the backward gathers over all ranks */
        z->stats.secondary_bytes += bytes;
        if (z->stats.secondary_bytes > z->stats.secondary_peak)
            z->stats.secondary_peak = z->stats.secondary_bytes;
        dt__zero_live_add(z, bytes);
    }
    memcpy(u->sec, u->full + (size_t)dt_pg_rank(z->hzpg) * bytes, bytes);
}

void dt__zpp_drop_secondary(dt_zero *z, zunit *u)
{
    if (!u->sec || u->sec_inflight)
        return;
    const size_t bytes = u->total / (size_t)z->p.hpz_partition_size * u->es;
    free(u->sec);
    u->sec = NULL;
    z->stats.secondary_bytes -= bytes;
    dt__zero_live_sub(z, bytes);
}

dt_status dt__zpp_reduce(dt_zero *z, zunit *u, const void *g)
{
    const bool f32 = u->rdt == DT_F32;
    float *in = f32 ? (float *)(uintptr_t)g : malloc(sizeof *in * (u->total + 1));
    float *out = f32 ? (float *)u->gshard : malloc(sizeof *out * (u->c + 1));
    dt_status st = in && out ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "qgZ: %zu bytes", u->total * sizeof *in);
    if (st >= 0 && !f32)
        st = dt_k_convert(g, u->rdt, in, DT_F32, (int64_t)u->total);
    if (st >= 0)
        st = dt_zpp_reduce_scatter_q(z->zpp, in, out, u->c, z->p.quant_grad_block, z->p.quant_grad_bits, true);
    if (st >= 0 && !f32)
        st = dt_k_convert(out, DT_F32, u->gshard, u->rdt, (int64_t)u->c);
    if (!f32) {
        free(in);
        free(out);
    }
    if (st >= 0)
        z->stats.reduces_quantized++;
    return st;
}
