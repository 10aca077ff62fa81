/* examples/custom_backend.c — write your own collective backend.
 *
 *     dtrain run -n 2 -- build/examples/example_custom_backend [inner-backend]
 *
 * dtrain's collectives go through a table of functions (dt_backend_ops in
 * <dtrain/comm.h>) registered under a name, the way PyTorch lets you add a
 * ProcessGroup backend with torch.distributed.Backend.register_backend().
 * A program registers its table once, before creating a group, and then
 * picks it by name like a built-in one:
 *
 *     dt_backend_register(&my_backend_ops);          // once
 *     params.backend = "trace?inner=shm";            // or DT_BACKEND=trace
 *     dt_pg_init(&params, &pg);
 *
 * What the group layer does for you (so a backend stays small): argument
 * checks, in-place normalisation, sequence numbers, the request queue, the
 * asynchronous progress thread, waiting with timeouts, and failing every
 * later request once one failed. A backend's `run` receives one operation
 * (dt_coll) at a time, in posting order, and runs it to completion.
 *
 * The backend here, "trace", is a complete and useful one to copy: it
 * delegates the data movement to another registered backend (the "inner"
 * one, chosen by the option string "trace?inner=NAME"; default shm, or self
 * for one rank) and counts, per operation kind, the calls, bytes and time,
 * printed per rank when the group is freed. Replace the delegation in
 * trace_run() by your own transport to make a new backend. It handles every
 * kind except all_to_all, to show how `kinds` makes the group layer refuse
 * an operation with DT_ERR_UNSUPPORTED naming the backend and the kind.
 *
 * The program checks an all-reduce, an all-gather, a broadcast and the
 * refusal, and exits non-zero if any result is wrong. */
#include <dtrain/comm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the backend ------------------------------------------------------ */

typedef struct {
    const dt_backend_ops *inner; /* the backend that moves the data */
    void *inner_ctx;
    int rank;
    unsigned long calls[DT_COLL_KIND_COUNT];
    double bytes[DT_COLL_KIND_COUNT];
    double secs[DT_COLL_KIND_COUNT];
} trace_ctx;

/* "inner=shm" → "shm" into name; default when absent. */
static void option(const char *opts, const char *key, const char *def, char *out, size_t n)
{
    const char *p = opts ? strstr(opts, key) : NULL;
    size_t klen = strlen(key);
    if (p && p[klen] == '=') {
        p += klen + 1;
        size_t len = strcspn(p, "&,");
        if (len >= n)
            len = n - 1;
        memcpy(out, p, len);
        out[len] = '\0';
    } else {
        snprintf(out, n, "%s", def);
    }
}

/* Required. Collective: every rank of the group runs it. */
static dt_status trace_init(const dt_backend_info *info, void **ctx)
{
    char inner_name[32];
    option(info->options, "inner", info->world_size == 1 ? "self" : "shm", inner_name,
           sizeof inner_name);
    const dt_backend_ops *inner = dt_backend_find(inner_name);
    if (!inner)
        return dt_error(DT_ERR_NOT_FOUND, "trace backend: no inner backend '%s'", inner_name);
    if (!strcmp(inner_name, "trace"))
        return dt_error(DT_ERR_INVALID_ARG, "trace backend: cannot wrap itself");
    trace_ctx *t = calloc(1, sizeof *t);
    if (!t)
        return dt_error(DT_ERR_NO_MEMORY, "trace backend: context");
    dt_backend_info in = *info;
    in.options = ""; /* our options are not the inner backend's */
    dt_status st = inner->init(&in, &t->inner_ctx);
    if (st < 0) {
        free(t);
        return dt_error_wrap(st, "trace backend: inner backend '%s'", inner_name);
    }
    t->inner = inner;
    t->rank = info->rank;
    *ctx = t;
    return DT_OK;
}

/* Required. Called once, after the last operation. */
static void trace_free(void *ctx)
{
    trace_ctx *t = ctx;
    for (int k = 0; k < DT_COLL_KIND_COUNT; k++)
        if (t->calls[k])
            printf("trace: rank %d: %-14s %4lu calls %12.0f bytes %9.3f ms\n", t->rank,
                   dt_coll_kind_name((dt_coll_kind)k), t->calls[k], t->bytes[k],
                   t->secs[k] * 1e3);
    t->inner->free(t->inner_ctx);
    free(t);
}

/* Required. One operation, blocking, in posting order. */
static dt_status trace_run(void *ctx, const dt_coll *c)
{
    trace_ctx *t = ctx;
    double t0 = dt_time_s();
    dt_status st = t->inner->run(t->inner_ctx, c);
    t->calls[c->kind]++;
    t->bytes[c->kind] += (double)c->count * (double)dt_dtype_size(c->dtype);
    t->secs[c->kind] += dt_time_s() - t0;
    return st; /* the inner backend set the message with dt_error() */
}

/* Optional: memory the zero-copy path can use. Delegate when the inner
 * backend has it, else plain memory (what the group layer does for NULL). */
static void *trace_mem_alloc(void *ctx, size_t bytes)
{
    trace_ctx *t = ctx;
    return t->inner->mem_alloc ? t->inner->mem_alloc(t->inner_ctx, bytes) : dt_alloc(bytes);
}

static void trace_mem_free(void *ctx, void *p)
{
    trace_ctx *t = ctx;
    if (t->inner->mem_free)
        t->inner->mem_free(t->inner_ctx, p);
    else
        dt_free(p);
}

/* Every kind but all_to_all. */
#define TRACE_KINDS (((1u << DT_COLL_KIND_COUNT) - 1) & ~(1u << DT_COLL_ALLTOALL))

static const dt_backend_ops trace_backend = {
    .version = DT_BACKEND_VERSION,
    .name = "trace",
    .init = trace_init,
    .free = trace_free,
    .run = trace_run,
    .kinds = TRACE_KINDS,
    .mem_alloc = trace_mem_alloc,
    .mem_free = trace_mem_free,
    .subgroup = NULL, /* subgroups: DT_ERR_UNSUPPORTED */
    .abort = NULL,
};

/* ---- a program that uses it ------------------------------------------------ */

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "rank %d: ", rank);                              \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            failures++;                                                      \
        }                                                                    \
    } while (0)

int main(int argc, char **argv)
{
    if (dt_backend_register(&trace_backend) < 0) {
        fprintf(stderr, "register: %s\n", dt_last_error());
        return 1;
    }
    char backend[64] = "trace";
    if (argc > 1)
        snprintf(backend, sizeof backend, "trace?inner=%s", argv[1]);
    dt_pg_params p = dt_pg_params_default();
    p.backend = backend;
    dt_pg *pg;
    if (dt_pg_init(&p, &pg) < 0) {
        fprintf(stderr, "dt_pg_init(%s): %s\n", backend, dt_last_error());
        return 1;
    }
    int rank = dt_pg_rank(pg), w = dt_pg_size(pg), failures = 0;

    /* All-reduce, asynchronous: post, (compute), wait. */
    enum { N = 1001 };
    float *x = dt_pg_alloc(pg, N * sizeof(float));
    for (int i = 0; i < N; i++)
        x[i] = (float)(rank + 1) * (float)(i % 10);
    dt_req *rq;
    dt_status st = dt_pg_allreduce_async(pg, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_SUM, &rq);
    if (st == DT_OK)
        st = dt_req_wait(rq, 60);
    CHECK(st == DT_OK, "allreduce: %s", dt_last_error());
    dt_req_free(rq);
    for (int i = 0; i < N && st == DT_OK; i++)
        CHECK(x[i] == (float)(w * (w + 1) / 2) * (float)(i % 10), "allreduce x[%d] = %g", i, x[i]);

    /* All-gather of one integer per rank. */
    int me = 100 + rank, *all = calloc((size_t)w, sizeof *all);
    st = dt_pg_allgather(pg, &me, all, 1, DT_I32);
    CHECK(st == DT_OK, "allgather: %s", dt_last_error());
    for (int r = 0; r < w; r++)
        CHECK(all[r] == 100 + r, "allgather all[%d] = %d", r, all[r]);

    /* Broadcast from the last rank. */
    double v = rank == w - 1 ? 3.25 : 0;
    st = dt_pg_broadcast(pg, &v, 1, DT_F64, w - 1);
    CHECK(st == DT_OK && v == 3.25, "broadcast: %g (%s)", v, dt_last_error());

    /* A kind the backend does not handle is refused, by name. */
    st = dt_pg_alltoall(pg, DT_IN_PLACE, all, 1, DT_I32);
    CHECK(st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "trace"),
          "alltoall should be unsupported: %s: %s", dt_status_name(st), dt_last_error());

    if (!failures)
        printf("rank %d of %d: custom backend '%s' ok (inner %s)\n", rank, w, dt_pg_backend(pg),
               argc > 1 ? argv[1] : "default");
    free(all);
    dt_pg_dealloc(pg, x);
    dt_pg_free(pg);
    return failures ? 1 : 0;
}
