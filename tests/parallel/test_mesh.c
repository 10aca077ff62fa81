/* Process meshes and dtensor construction (mesh.h), in real processes:
 * coordinates and per-dim groups of the permuted mesh [[2,4,5],[0,1,3]] on
 * 6 ranks, a mesh on a subset of the world, slices, disagreeing ranks, the
 * seed's placement demo, Shard(d >= ndim) as the same error on every rank
 * (no hang), the scatter from the root, uneven shards. */
// dt-test-timeout: 120
#include "parallel/mesh_util.h"
#include "test.h"

/* Mesh [[2,4,5],[0,1,3]] (x, y) on 6 ranks: coordinates, groups, slices,
 * and the seed's shard_tensor([[1..12]] 4x3, [Shard(0), Shard(1)]). */
static int body_permuted(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    static const int ids[] = {2, 4, 5, 0, 1, 3};
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 3}, ids, (const char *[]){"x", "y"}, &m));
    int pos = 0;
    while (ids[pos] != rank)
        pos++;
    TH_CHECK(dt_mesh_contains_self(m), "rank %d not in mesh", rank);
    TH_CHECK(dt_mesh_coord(m, 0) == pos / 3 && dt_mesh_coord(m, 1) == pos % 3,
             "coords (%d,%d), want (%d,%d)", dt_mesh_coord(m, 0), dt_mesh_coord(m, 1), pos / 3,
             pos % 3);
    TH_CHECK(dt_mesh_dim_index(m, "y") == 1 && dt_mesh_dim_index(m, "z") == -1, "dim index");
    TH_CHECK(dt_mesh_rank_at(m, (int[]){1, 2}) == 3 && dt_mesh_rank_at(m, (int[]){0, 1}) == 4,
             "rank_at");
    dt_pg *gx = dt_mesh_dim_group(m, 0), *gy = dt_mesh_dim_group(m, 1);
    TH_CHECK(dt_pg_size(gx) == 2 && dt_pg_size(gy) == 3, "group sizes %d %d", dt_pg_size(gx),
             dt_pg_size(gy));
    TH_CHECK(dt_pg_rank(gx) == pos / 3 && dt_pg_rank(gy) == pos % 3, "group ranks");
    /* the y group of this row holds exactly the row's world ranks, in order */
    int row[3];
    TH_OK(dt_pg_allgather(gy, &rank, row, 1, DT_I32));
    for (int j = 0; j < 3; j++)
        TH_CHECK(row[j] == ids[(pos / 3) * 3 + j], "row %d: %d", j, row[j]);
    int col[2];
    TH_OK(dt_pg_allgather(gx, &rank, col, 1, DT_I32));
    for (int i = 0; i < 2; i++)
        TH_CHECK(col[i] == ids[i * 3 + pos % 3], "col %d: %d", i, col[i]);
    /* slices: x fixed at 1 is [0,1,3] along y */
    dt_mesh *s;
    TH_OK(dt_mesh_slice(m, 0, 1, &s));
    TH_CHECK(dt_mesh_ndim(s) == 1 && dt_mesh_size(s, 0) == 3 && dt_mesh_ranks(s)[2] == 3,
             "slice shape");
    TH_CHECK(dt_mesh_contains_self(s) == (pos / 3 == 1), "slice membership");
    TH_CHECK(!strcmp(dt_mesh_dim_name(s, 0), "y"), "slice name");
    if (dt_mesh_contains_self(s)) {
        int v = rank, sum = 0;
        TH_OK(dt_pg_allreduce(dt_mesh_dim_group(s, 0), &v, &sum, 1, DT_I32, DT_REDUCE_SUM));
        TH_CHECK(sum == 0 + 1 + 3, "slice group sum %d", sum);
    }
    /* the seed's demo */
    float a[12];
    for (int i = 0; i < 12; i++)
        a[i] = (float)(i + 1);
    dt_tensor *full = dt_tensor_wrap(a, DT_F32, 2, (int64_t[]){4, 3});
    full->name = "dense_tensor";
    dt_dtensor *d;
    TH_OK(dt_shard_tensor(NULL, m, full, (dt_placement[]){dt_shard(0), dt_shard(1)}, &d));
    int cx = pos / 3, cy = pos % 3;
    TH_CHECK(d->local->shape[0] == 2 && d->local->shape[1] == 1, "local shape");
    for (int i = 0; i < 2; i++) {
        float want = a[(cx * 2 + i) * 3 + cy];
        TH_CHECK(dt_tensor_get(d->local, i) == want, "local[%d] = %g, want %g", i,
                 dt_tensor_get(d->local, i), want);
    }
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *back = dt_dtensor_full(ctx, d);
    TH_CHECK(back != NULL, "full: %s", dt_last_error());
    for (int i = 0; i < 12; i++)
        TH_CHECK(dt_tensor_get(back, i) == a[i], "full[%d]", i);
    char buf[512];
    dt_dtensor_str(d, buf, sizeof buf);
    TH_CHECK(strstr(buf, "[Shard(0), Shard(1)]") && strstr(buf, "mesh(x=2,y=3)[2,4,5,0,1,3]"),
             "str: %s", buf);
    dt_ctx_free(ctx);
    dt_dtensor_free(d);
    dt_tensor_free(full);
    dt_mesh_free(s);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(permuted_mesh_6)
{
    ASSERT_EQ_INT(th_run(6, 60.0, body_permuted, NULL, NULL), 0);
}

/* Two meshes in one job, one on a subset: ranks outside get a mesh they
 * are not in; disagreeing arguments fail on every rank. */
static int body_subset(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *a, *b;
    TH_OK(dt_mesh_init(w, 1, (int[]){2}, (int[]){3, 1}, NULL, &a));
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, NULL, (const char *[]){"dp", "tp"}, &b));
    TH_CHECK(dt_mesh_contains_self(a) == (rank == 3 || rank == 1), "membership of a");
    TH_CHECK(dt_mesh_coord(a, 0) == (rank == 3 ? 0 : rank == 1 ? 1 : -1), "coord in a");
    TH_CHECK((dt_mesh_dim_group(a, 0) != NULL) == dt_mesh_contains_self(a), "group of a");
    TH_CHECK(!strcmp(dt_mesh_dim_name(a, 0), "d0"), "default name");
    /* a dtensor on a, seen from every rank */
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    int64_t shape[2] = {3, 2};
    dt_dtensor *x = mu_make(ctx, a, (dt_placement[]){dt_shard(0)}, 1, DT_F32, 2, shape);
    TH_CHECK(x, "make: %s", dt_last_error());
    TH_CHECK(!mu_check_box(x->local, a, x->placements, 1, 2, shape, "subset"), "box");
    dt_dtensor *r = dt_reshard(ctx, x, NULL, (dt_placement[]){dt_replicate()});
    TH_CHECK(r, "reshard: %s", dt_last_error());
    TH_CHECK(!mu_check_box(r->local, a, r->placements, 1, 2, shape, "subset R"), "box R");
    dt_ctx_free(ctx);
    /* different arguments on different ranks: an error everywhere */
    dt_mesh *c = NULL;
    int ids[2] = {0, rank == 0 ? 2 : 1};
    dt_status st = dt_mesh_init(w, 1, (int[]){2}, ids, NULL, &c);
    TH_CHECK(st == DT_ERR_MISMATCH && c == NULL, "mismatch: %s", dt_status_name(st));
    /* bad arguments: local errors, no communication */
    TH_CHECK(dt_mesh_init(w, 1, (int[]){5}, NULL, NULL, &c) == DT_ERR_INVALID_ARG, "too big");
    TH_CHECK(dt_mesh_init(w, 1, (int[]){2}, (int[]){1, 1}, NULL, &c) == DT_ERR_INVALID_ARG &&
                 strstr(dt_last_error(), "twice"),
             "duplicate: %s", dt_last_error());
    TH_CHECK(dt_mesh_init(w, 2, (int[]){2, 2}, NULL, (const char *[]){"a", "a"}, &c) ==
                 DT_ERR_INVALID_ARG,
             "names");
    dt_mesh_free(b);
    dt_mesh_free(a);
    dt_pg_free(w);
    return 0;
}

TEST(subset_meshes_4)
{
    ASSERT_EQ_INT(th_run(4, 60.0, body_subset, NULL, NULL), 0);
}

/* The seed's Shard(0), Shard(1), Shard(2) of a 2x3 tensor on 2 ranks:
 * Shard(2) (and Shard(3), Shard(-3)) is the same error on every rank,
 * naming the tensor, the dim and the mesh, before any communication; the
 * group still works afterwards (nothing half-posted). Also nesting and
 * mixed Partial ops. */
static int body_shard_dims(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, 1, (int[]){2}, NULL, (const char *[]){"x"}, &m));
    float a[6] = {1, 2, 3, 4, 5, 6};
    dt_tensor *full = dt_tensor_wrap(a, DT_F32, 2, (int64_t[]){2, 3});
    full->name = "dense_tensor";
    dt_dtensor *d;
    TH_OK(dt_shard_tensor(NULL, m, full, (dt_placement[]){dt_shard(0)}, &d));
    TH_CHECK(d->local->shape[0] == 1 && d->local->shape[1] == 3, "S0 shape");
    for (int j = 0; j < 3; j++)
        TH_CHECK(dt_tensor_get(d->local, j) == a[rank * 3 + j], "S0 value");
    dt_dtensor_free(d);
    /* Shard(1) of 3 columns over 2: chunk 2 -> [1,2] | [3] */
    TH_OK(dt_shard_tensor(NULL, m, full, (dt_placement[]){dt_shard(1)}, &d));
    TH_CHECK(d->local->shape[1] == (rank == 0 ? 2 : 1), "S1 shape");
    TH_CHECK(dt_tensor_get(d->local, 0) == (rank == 0 ? 1 : 3), "S1 value");
    dt_dtensor_free(d);
    /* Shard(-1) == Shard(1) */
    TH_OK(dt_shard_tensor(NULL, m, full, (dt_placement[]){dt_shard(-1)}, &d));
    TH_CHECK(d->placements[0].dim == 1 && d->local->shape[1] == (rank == 0 ? 2 : 1), "S-1");
    dt_dtensor_free(d);
    int bad_dims[] = {2, 3, -3, 100};
    for (int i = 0; i < 4; i++) {
        d = NULL;
        dt_status st = dt_shard_tensor(NULL, m, full, (dt_placement[]){dt_shard(bad_dims[i])}, &d);
        TH_CHECK(st == DT_ERR_INVALID_ARG && !d, "Shard(%d): %s", bad_dims[i], dt_status_name(st));
        char want[32];
        snprintf(want, sizeof want, "Shard(%d)", bad_dims[i]);
        const char *e = dt_last_error();
        TH_CHECK(strstr(e, "dense_tensor") && strstr(e, want) && strstr(e, "mesh(x=2)") &&
                     strstr(e, "2 dims"),
                 "message: %s", e);
    }
    /* the scatter form checks first too */
    TH_CHECK(dt_shard_tensor_from_root(NULL, m, rank == 0 ? full : NULL, DT_F32, 2, full->shape,
                                       (dt_placement[]){dt_shard(2)}, &d) == DT_ERR_INVALID_ARG,
             "root form");
    /* the group still works: nothing was half-posted */
    int v = 1, s = 0;
    TH_OK(dt_pg_allreduce(w, &v, &s, 1, DT_I32, DT_REDUCE_SUM));
    TH_CHECK(s == 2, "allreduce after errors: %d", s);
    dt_mesh *m2;
    TH_OK(dt_mesh_init(w, 2, (int[]){1, 2}, NULL, NULL, &m2));
    TH_CHECK(dt_shard_tensor(NULL, m2, full, (dt_placement[]){dt_shard(0), dt_shard(0)}, &d) ==
                     DT_ERR_UNSUPPORTED &&
                 strstr(dt_last_error(), "nested"),
             "nested: %s", dt_last_error());
    TH_CHECK(dt_shard_tensor(NULL, m2, full,
                             (dt_placement[]){dt_partial(DT_REDUCE_SUM), dt_partial(DT_REDUCE_MAX)},
                             &d) == DT_ERR_UNSUPPORTED,
             "mixed partial");
    dt_mesh_free(m2);
    dt_tensor_free(full);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(shard_dim_errors_2)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_shard_dims, NULL, NULL), 0);
}

/* shard_tensor_from_root: the root's tensor scattered, uneven (5 rows over
 * 4 ranks: 2,2,1,0) and on a 2-d mesh with Partial(sum) (non-zero
 * coordinates zero-filled). */
static int body_scatter(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, 1, (int[]){size}, NULL, NULL, &m));
    int64_t shape[2] = {5, 3};
    dt_tensor *full = NULL;
    if (rank == 0) {
        full = dt_tensor_new(DT_I32, 2, shape);
        mu_fill_box(full, 4, 2, shape, (int64_t[]){0, 0}, shape);
    }
    dt_dtensor *d;
    TH_OK(dt_shard_tensor_from_root(NULL, m, full, DT_I32, 2, shape, (dt_placement[]){dt_shard(0)},
                                    &d));
    int64_t want_rows[] = {2, 2, 1, 0};
    TH_CHECK(d->local->shape[0] == (size == 4 ? want_rows[rank] : d->local->shape[0]), "rows %lld",
             (long long)d->local->shape[0]);
    TH_CHECK(!mu_check_box(d->local, m, d->placements, 4, 2, shape, "scatter S0"), "S0");
    dt_dtensor_free(d);
    TH_OK(dt_shard_tensor_from_root(NULL, m, full, DT_I32, 2, shape, (dt_placement[]){dt_shard(1)},
                                    &d));
    TH_CHECK(!mu_check_box(d->local, m, d->placements, 4, 2, shape, "scatter S1"), "S1");
    dt_dtensor_free(d);
    /* a different shape on a non-root rank: a mismatch error there, no hang */
    int64_t other[2] = {5, 4};
    dt_status st = dt_shard_tensor_from_root(NULL, m, full, DT_I32, 2, rank == 1 ? other : shape,
                                             (dt_placement[]){dt_replicate()}, &d);
    if (rank == 1)
        TH_CHECK(st == DT_ERR_MISMATCH, "mismatch: %s", dt_status_name(st));
    else
        TH_CHECK(st >= 0, "root/others: %s", dt_last_error());
    if (st >= 0)
        dt_dtensor_free(d);
    dt_tensor_free(full);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(scatter_from_root_4)
{
    ASSERT_EQ_INT(th_run(4, 60.0, body_scatter, NULL, NULL), 0);
}

TEST(chunk_semantics)
{
    int64_t st, len;
    int64_t want5[] = {2, 2, 1, 0};
    for (int i = 0; i < 4; i++) {
        dt_chunk_range(5, 4, i, &st, &len);
        ASSERT_EQ_INT(len, want5[i]);
    }
    dt_chunk_range(12, 5, 4, &st, &len); /* 3,3,3,3,0 */
    ASSERT_EQ_INT(st, 12);
    ASSERT_EQ_INT(len, 0);
    dt_chunk_range(1, 8, 0, &st, &len);
    ASSERT_EQ_INT(len, 1);
    dt_chunk_range(1, 8, 7, &st, &len);
    ASSERT_EQ_INT(len, 0);
    char buf[128];
    dt_placements_str((dt_placement[]){dt_shard(1), dt_replicate(), dt_partial(DT_REDUCE_AVG)}, 3,
                      buf, sizeof buf);
    ASSERT_STR_EQ(buf, "[Shard(1), Replicate(), Partial(avg)]");
}

int main(void)
{
    RUN(chunk_semantics);
    RUN(permuted_mesh_6);
    RUN(subset_meshes_4);
    RUN(shard_dim_errors_2);
    RUN(scatter_from_root_4);
    return TEST_REPORT();
}
