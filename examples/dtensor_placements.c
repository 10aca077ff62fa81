/* dtensor_placements — the placement programs of the Paddle auto-parallel
 * notes (seed 001) in C, on 6 ranks:
 *     dtrain run -n 6 -- build/examples/example_dtensor_placements
 *
 *  1. mesh [[2,4,5],[0,1,3]] with dims (x, y); the 4x3 tensor [[1,2,3],
 *     [4,5,6],[7,8,9],[10,11,12]] with [Shard(0), Shard(1)]: each rank holds
 *     2 rows (by x) and 1 column (by y);
 *  2. mesh [0,1] (x): the 2x3 tensor [[1,2,3],[4,5,6]] with Shard(0)
 *     ([1,2,3] | [4,5,6]), Shard(1) ([[1,2],[4,5]] | [[3],[6]], torch.chunk
 *     semantics) and Shard(2): a clear error on both ranks (Paddle hangs
 *     here), with ranks 2-5 outside the mesh;
 *  3. Partial(sum) -> Replicate: shard_tensor(a, [Partial()]) keeps a on
 *     coordinate 0 and zeros on 1, the all-reduce gives a back;
 *  4. Shard(0) -> Replicate: the all-gather gives a back.
 * Every rank prints what it holds and checks it; the exit code is 0 only if
 * every value is what the notes say. */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <string.h>

static int bad;

static void show(int rank, const char *what, const dt_tensor *t, const float *want)
{
    char sh[64], line[256];
    size_t k = 0;
    int64_t n = dt_tensor_numel(t);
    for (int64_t i = 0; i < n && k < sizeof line - 16; i++) {
        double v = dt_tensor_get(t, i);
        k += (size_t)snprintf(line + k, sizeof line - k, "%s%g", i ? " " : "", v);
        if (want && v != want[i]) {
            fprintf(stderr, "rank %d: %s: element %lld is %g, want %g\n", rank, what, (long long)i,
                    v, want[i]);
            bad = 1;
        }
    }
    line[k] = 0;
    printf("rank %d: %-28s local %s = [%s]%s\n", rank, what, dt_tensor_shape_str(t, sh, sizeof sh),
           line, want ? "" : "");
}

int main(void)
{
    dt_pg *w;
    if (dt_pg_init(NULL, &w) < 0) {
        fprintf(stderr, "dt_pg_init: %s\n", dt_last_error());
        return 1;
    }
    int rank = dt_pg_rank(w);
    if (dt_pg_size(w) != 6) {
        fprintf(stderr, "run with 6 ranks: dtrain run -n 6 -- %s\n", "example_dtensor_placements");
        dt_pg_free(w);
        return 2;
    }
    dt_ctx *ctx;
    dt_mesh *mesh, *m2;
    static const int ids[] = {2, 4, 5, 0, 1, 3};
    if (dt_ctx_init(NULL, &ctx) < 0 ||
        dt_mesh_init(w, 2, (int[]){2, 3}, ids, (const char *[]){"x", "y"}, &mesh) < 0 ||
        dt_mesh_init(w, 1, (int[]){2}, (int[]){0, 1}, (const char *[]){"x"}, &m2) < 0) {
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }
    /* 1. the placement demo */
    float a12[12];
    for (int i = 0; i < 12; i++)
        a12[i] = (float)(i + 1);
    dt_tensor *dense = dt_tensor_wrap(a12, DT_F32, 2, (int64_t[]){4, 3});
    dense->name = "dense_tensor";
    dt_dtensor *d;
    if (dt_shard_tensor(NULL, mesh, dense, (dt_placement[]){dt_shard(0), dt_shard(1)}, &d) < 0) {
        fprintf(stderr, "shard_tensor: %s\n", dt_last_error());
        return 1;
    }
    int cx = dt_mesh_coord(mesh, 0), cy = dt_mesh_coord(mesh, 1);
    float want[6] = {a12[(2 * cx) * 3 + cy], a12[(2 * cx + 1) * 3 + cy]};
    char label[64];
    snprintf(label, sizeof label, "[S(0),S(1)] at (x=%d,y=%d)", cx, cy);
    show(rank, label, d->local, want);
    dt_dtensor_free(d);

    /* 2. shard dims 0, 1, 2 of a 2x3 tensor on mesh [0, 1] */
    float a6[6] = {1, 2, 3, 4, 5, 6};
    dt_tensor *a = dt_tensor_wrap(a6, DT_F32, 2, (int64_t[]){2, 3});
    a->name = "dense_tensor";
    for (int dim = 0; dim < 3; dim++) {
        dt_status st = dt_shard_tensor(NULL, m2, a, (dt_placement[]){dt_shard(dim)}, &d);
        if (dim == 2) {
            /* every rank (in the mesh or not) gets the same error; nothing hangs */
            if (st != DT_ERR_INVALID_ARG || !strstr(dt_last_error(), "Shard(2)"))
                bad = 1;
            if (rank < 2)
                printf("rank %d: Shard(2): %s: %s\n", rank, dt_status_name(st), dt_last_error());
            continue;
        }
        if (st < 0) {
            fprintf(stderr, "Shard(%d): %s\n", dim, dt_last_error());
            return 1;
        }
        if (rank < 2) {
            float w0[3] = {a6[rank * 3], a6[rank * 3 + 1], a6[rank * 3 + 2]};
            float w1[2][4] = {{1, 2, 4, 5}, {3, 6}};
            snprintf(label, sizeof label, "2x3 Shard(%d)", dim);
            show(rank, label, d->local, dim == 0 ? w0 : w1[rank]);
        } else if (dt_tensor_numel(d->local) != 0) {
            bad = 1;
        }
        dt_dtensor_free(d);
    }

    /* 3. Partial -> Replicate, 4. Shard(0) -> Replicate */
    dt_placement pr[2] = {dt_partial(DT_REDUCE_SUM), dt_shard(0)};
    const char *names[2] = {"Partial(sum)", "Shard(0)"};
    for (int i = 0; i < 2; i++) {
        if (dt_shard_tensor(ctx, m2, a, &pr[i], &d) < 0) {
            fprintf(stderr, "%s: %s\n", names[i], dt_last_error());
            return 1;
        }
        if (rank < 2) {
            float zeros[6] = {0};
            float *wp = i == 0 ? (rank == 0 ? a6 : zeros) : a6 + 3 * rank;
            snprintf(label, sizeof label, "%s", names[i]);
            show(rank, label, d->local, wp);
        }
        dt_dtensor *r = dt_reshard(ctx, d, NULL, (dt_placement[]){dt_replicate()});
        if (!r) {
            fprintf(stderr, "reshard: %s\n", dt_last_error());
            return 1;
        }
        if (rank < 2) {
            snprintf(label, sizeof label, "%s -> Replicate", names[i]);
            show(rank, label, r->local, a6);
        }
        dt_ctx_reset(ctx);
    }
    printf("rank %d: %s\n", rank, bad ? "WRONG" : "ok");
    dt_ctx_free(ctx);
    dt_mesh_free(m2);
    dt_mesh_free(mesh);
    dt_tensor_free(a);
    dt_tensor_free(dense);
    dt_pg_free(w);
    return bad;
}
