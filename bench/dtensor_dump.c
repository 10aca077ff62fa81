/* dtensor_dump — dtrain's side of bench/dtensor_torch.py: every reshard
 * transition and matmul propagation case, each rank's resulting local piece
 * written as JSON lines to DIR/rank<r>.jsonl.
 *
 *     dtrain run -n 4 -- build/bench/dtensor_dump DIR
 *
 * Global tensors hold small integers ((7 i) mod 23 - 11 for element i), so
 * every value is exact. A Partial source piece is X - (K - 1) at combined
 * partial coordinate 0 and 1 elsewhere (the sum is X). Meshes: 1-d of all W
 * ranks, and 2 x W/2 for even W (ranks row-major). Each line:
 *   {"kind":"reshard","mesh":[2,2],"shape":[5,3],"from":"S0,R","to":"R,P",
 *    "rank":1,"local":[...],"full":[...]}
 * ("full" only for Partial targets, whose pieces differ by design from
 * DTensor's: Paddle's R->P keeps the value on coordinate 0, DTensor divides
 * by k), and for matmul {"kind":"matmul",...,"a":"S1","b":"S0","out":"P",
 * "full":[...]} with a [5,7] @ b [7,3]. Placement codes: R, P (sum), S<d>. */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double val(int64_t i) { return (double)(((i * 7) % 23 + 23) % 23 - 11); }

static void code(const dt_placement *p, int n, char *buf)
{
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (i)
            buf[k++] = ',';
        if (p[i].kind == DT_PLACE_REPLICATE)
            buf[k++] = 'R';
        else if (p[i].kind == DT_PLACE_PARTIAL)
            buf[k++] = 'P';
        else
            k += (size_t)sprintf(buf + k, "S%d", p[i].dim);
    }
    buf[k] = 0;
}

static void put(FILE *f, const char *key, const dt_tensor *t)
{
    fprintf(f, ",\"%s\":[", key);
    for (int64_t i = 0; i < dt_tensor_numel(t); i++)
        fprintf(f, "%s%g", i ? "," : "", dt_tensor_get(t, i));
    fprintf(f, "]");
}

/* The source dtensor of global X with placements p. */
static dt_dtensor *source(dt_ctx *ctx, dt_mesh *m, const dt_placement *p, int nd,
                          const int64_t *shape)
{
    int mn = dt_mesh_ndim(m);
    int64_t st[DT_MAX_DIMS], len[DT_MAX_DIMS];
    if (dt_dtensor_local_box(m, p, nd, shape, NULL, "x", st, len) < 0)
        return NULL;
    dt_tensor *t = dt_tensor_zeros(ctx, DT_F32, nd, len);
    int r = 0, K = 1;
    for (int i = 0; i < mn; i++)
        if (p[i].kind == DT_PLACE_PARTIAL) {
            r = r * dt_mesh_size(m, i) + dt_mesh_coord(m, i);
            K *= dt_mesh_size(m, i);
        }
    for (int64_t e = 0; e < dt_tensor_numel(t); e++) {
        int64_t rem = e, g = 0, mul = 1, idx[DT_MAX_DIMS];
        for (int d = nd - 1; d >= 0; d--) {
            idx[d] = rem % len[d];
            rem /= len[d];
        }
        for (int d = nd - 1; d >= 0; d--) {
            g += (idx[d] + st[d]) * mul;
            mul *= shape[d];
        }
        dt_tensor_set(t, e, K == 1 ? val(g) : r == 0 ? val(g) - (K - 1) : 1);
    }
    dt_dtensor *x;
    return dt_dtensor_from_local(ctx, m, t, p, shape, &x) < 0 ? NULL : x;
}

static bool ok_pl(const dt_mesh *m, const dt_placement *p, int nd)
{
    int64_t s[DT_MAX_DIMS] = {1, 1, 1, 1, 1, 1, 1, 1}, a[DT_MAX_DIMS], b[DT_MAX_DIMS];
    bool ok = dt_dtensor_local_box(m, p, nd, s, (int[]){0, 0, 0, 0}, "", a, b) >= 0;
    dt_error_clear();
    return ok;
}

static int run_mesh(FILE *f, dt_ctx *ctx, dt_mesh *m, int rank)
{
    int mn = dt_mesh_ndim(m), W = dt_mesh_size(m, -1);
    int64_t shapes[3][3] = {{(int64_t)W + 1, 3, 0}, {2, (int64_t)2 * W + 1, 3}, {1, 5, 0}};
    int nds[3] = {2, 3, 2};
    char ms[32];
    if (mn == 1)
        snprintf(ms, sizeof ms, "[%d]", W);
    else
        snprintf(ms, sizeof ms, "[%d,%d]", dt_mesh_size(m, 0), dt_mesh_size(m, 1));
    for (int si = 0; si < (mn == 1 ? 3 : 1); si++) {
        int nd = nds[si];
        dt_placement cand[6];
        int nc = 0;
        cand[nc++] = dt_replicate();
        for (int d = 0; d < nd; d++)
            cand[nc++] = dt_shard(d);
        cand[nc++] = dt_partial(DT_REDUCE_SUM);
        int per = mn == 1 ? nc : nc * nc;
        for (int fi = 0; fi < per; fi++)
            for (int ti = 0; ti < per; ti++) {
                dt_placement pf[2], pt[2];
                for (int i = 0, q = fi; i < mn; i++, q /= nc)
                    pf[i] = cand[q % nc];
                for (int i = 0, q = ti; i < mn; i++, q /= nc)
                    pt[i] = cand[q % nc];
                if (!ok_pl(m, pf, nd) || !ok_pl(m, pt, nd))
                    continue;
                dt_dtensor *x = source(ctx, m, pf, nd, shapes[si]);
                dt_dtensor *y = x ? dt_reshard(ctx, x, NULL, pt) : NULL;
                if (!y) {
                    fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
                    return 1;
                }
                char a[32], b[32];
                code(pf, mn, a);
                code(pt, mn, b);
                fprintf(f, "{\"kind\":\"reshard\",\"mesh\":%s,\"shape\":[%lld,%lld%s", ms,
                        (long long)shapes[si][0], (long long)shapes[si][1], nd == 3 ? "," : "");
                if (nd == 3)
                    fprintf(f, "%lld", (long long)shapes[si][2]);
                fprintf(f, "],\"from\":\"%s\",\"to\":\"%s\",\"rank\":%d", a, b, rank);
                put(f, "local", y->local);
                if (strchr(b, 'P'))
                    put(f, "full", dt_dtensor_full(ctx, y));
                fprintf(f, "}\n");
                dt_ctx_reset(ctx);
            }
    }
    if (mn != 1)
        return 0;
    /* matmul propagation: a [5,7] @ b [7,3] */
    dt_placement cand[4] = {dt_replicate(), dt_shard(0), dt_shard(1), dt_partial(DT_REDUCE_SUM)};
    int64_t sa[2] = {5, 7}, sb[2] = {7, 3};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            dt_dtensor *A = source(ctx, m, &cand[i], 2, sa), *B = source(ctx, m, &cand[j], 2, sb);
            dt_dtensor *y = A && B ? dt_dtensor_matmul(ctx, A, B) : NULL;
            if (!y) {
                fprintf(stderr, "rank %d: matmul: %s\n", rank, dt_last_error());
                return 1;
            }
            char a[8], b[8], o[8];
            code(&cand[i], 1, a);
            code(&cand[j], 1, b);
            code(y->placements, 1, o);
            fprintf(f, "{\"kind\":\"matmul\",\"mesh\":%s,\"a\":\"%s\",\"b\":\"%s\",\"out\":\"%s\","
                       "\"rank\":%d", ms, a, b, o, rank);
            put(f, "full", dt_dtensor_full(ctx, y));
            fprintf(f, "}\n");
            dt_ctx_reset(ctx);
        }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: dtensor_dump DIR\n");
        return 2;
    }
    dt_pg *w;
    dt_ctx *ctx;
    if (dt_pg_init(NULL, &w) < 0 || dt_ctx_init(NULL, &ctx) < 0) {
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }
    int rank = dt_pg_rank(w), W = dt_pg_size(w);
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.jsonl", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    dt_ag_set_enabled(ctx, false);
    dt_mesh *m1, *m2 = NULL;
    int rc = 0;
    if (dt_mesh_init(w, 1, (int[]){W}, NULL, NULL, &m1) < 0 ||
        (W % 2 == 0 && W > 2 && dt_mesh_init(w, 2, (int[]){2, W / 2}, NULL, NULL, &m2) < 0)) {
        fprintf(stderr, "mesh: %s\n", dt_last_error());
        return 1;
    }
    rc = run_mesh(f, ctx, m1, rank);
    if (!rc && m2)
        rc = run_mesh(f, ctx, m2, rank);
    fclose(f);
    dt_mesh_free(m2);
    dt_mesh_free(m1);
    dt_ctx_free(ctx);
    dt_pg_free(w);
    return rc;
}
