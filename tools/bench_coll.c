/* dtrain bench coll — collective bandwidth and latency, nccl-tests style.
 *
 *     dtrain run -n 2 -- dtrain bench coll --op allreduce [--min 8] [--max 256M]
 *                        [--dtype f32] [--iters N] [--mem both|plain|group]
 *                        [--algo flat|hier] [--json]
 *
 * --algo hier runs the collective on dt_pg_hierarchical(group) (comm.h):
 * the two-level all-reduce and reduce-scatter across nodes (nodes from host
 * and network namespace, or $DT_SIM_LOCAL_SIZE); other operations are flat
 * there too.
 *
 * The table is nccl-tests' (all_reduce_perf and friends), column for column,
 * so scripts written for it read this one: size (B), count (elements), type
 * (float, half, bfloat16, ...), redop (sum, or none), root (-1, or 0 for
 * broadcast), then time (us), algbw and busbw (GB/s) and #wrong for out of
 * place and again for in place; and the footer "# Out of bounds values : N
 * OK|FAILED" and "# Avg bus bandwidth    : X" (the mean busbw of the
 * in-place and out-of-place rows). Each memory kind is one table, preceded
 * by a "# mem: plain|group" comment line.
 *
 * For each size (doubling from --min to --max) and each kind of memory
 * (plain dt_alloc buffers, and group-allocated dt_pg_alloc buffers that take
 * the zero-copy path), the collective is checked once against known values,
 * then timed out of place and in place. Conventions follow nccl-tests (and
 * bench/mpi_allreduce.c, the Open MPI baseline, uses the same ones): size is
 * the larger of one rank's input and output in bytes; time is the mean per
 * operation of the slowest rank; algbw = size / time; busbw = algbw times
 * 2(W-1)/W for allreduce, (W-1)/W for reduce_scatter and allgather, 1 for
 * broadcast, so busbw compares with the memory or link bandwidth whatever W.
 *
 * The group comes from the environment (dtrain run, torchrun, mpirun) and the
 * backend from DT_BACKEND or the default. Only rank 0 prints. */
#include "cmd.h"
#include "dtrain/base.h"
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_COUNT } op_kind;
static const char *const op_names[OP_COUNT] = {"allreduce", "reduce_scatter", "allgather",
                                               "broadcast"};

typedef struct {
    op_kind op;
    size_t min, max;
    dt_dtype dtype;
    int iters; /* 0 = by size */
    int json;
    int plain, group;
    int hier;  /* --algo hier */
} bench_opts;

/* "8", "64K", "1M", "256M", "1G" → bytes; 0 if malformed. */
static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    size_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024ull * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b')
        end++;
    return (v > 0 && !*end) ? (size_t)(v * (double)mul) : 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain run -n N -- dtrain bench coll [--op allreduce|reduce_scatter|allgather|"
               "broadcast]\n"
               "         [--min 8] [--max 256M] [--dtype f32] [--iters N] [--mem both|plain|group] "
               "[--algo flat|hier] [--json]\n");
}

static int parse(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){.op = OP_ALLREDUCE, .min = 8, .max = 256u << 20, .dtype = DT_F32,
                      .plain = 1, .group = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!v) {
            dt__cli_err("dtrain bench coll: %s needs a value\n", a);
            return 2;
        } else if (!strcmp(a, "--op")) {
            int k = 0;
            while (k < OP_COUNT && strcmp(v, op_names[k]))
                k++;
            if (k == OP_COUNT) {
                dt__cli_err("dtrain bench coll: unknown --op '%s' (allreduce, reduce_scatter, "
                                "allgather, broadcast)\n", v);
                return 2;
            }
            o->op = (op_kind)k;
            i++;
        } else if (!strcmp(a, "--min") || !strcmp(a, "--max")) {
            size_t s = parse_size(v);
            if (!s) {
                dt__cli_err("dtrain bench coll: %s: bad size '%s' (e.g. 8, 64K, 256M)\n", a, v);
                return 2;
            }
            *(a[3] == 'i' ? &o->min : &o->max) = s;
            i++;
        } else if (!strcmp(a, "--dtype")) {
            if (dt_dtype_parse(v, &o->dtype) < 0) {
                dt__cli_err("dtrain bench coll: %s\n", dt_last_error());
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--iters")) {
            int64_t it;
            if (dt_parse_int("--iters", v, 1, 1000000000, &it) < 0) {
                dt__cli_err("dtrain bench coll: --iters needs a count >= 1\n");
                return 2;
            }
            o->iters = (int)it;
            i++;
        } else if (!strcmp(a, "--algo")) {
            if (strcmp(v, "flat") && strcmp(v, "hier")) {
                dt__cli_err("dtrain bench coll: --algo flat|hier\n");
                return 2;
            }
            o->hier = !strcmp(v, "hier");
            i++;
        } else if (!strcmp(a, "--mem")) {
            o->plain = !strcmp(v, "both") || !strcmp(v, "plain");
            o->group = !strcmp(v, "both") || !strcmp(v, "group");
            if (!o->plain && !o->group) {
                dt__cli_err("dtrain bench coll: --mem both|plain|group\n");
                return 2;
            }
            i++;
        } else {
            dt__cli_err("dtrain bench coll: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (o->min > o->max) {
        dt__cli_err("dtrain bench coll: --min is larger than --max\n");
        return 2;
    }
    return 0;
}

/* ---- values ------------------------------------------------------------- */

/* Small integers: exact in every dtype, sums stay exact for W <= 19 in u8. */
static double value(int rank, size_t i)
{
    return (double)((i * 7 + (size_t)rank * 3) % 13);
}

/* ---- one collective ---------------------------------------------------------- */

typedef struct {
    dt_pg *pg;
    op_kind op;
    dt_dtype dt;
    size_t es;
    int rank, w;
    char *send, *recv; /* capacity for the largest size */
} bench_ctx;

/* Run the operation once on blk elements per rank. In place uses dtrain's
 * forms: send NULL (allreduce, allgather), recv = send + rank*blk
 * (reduce_scatter), the one buffer of a broadcast. */
static dt_status run_op(const bench_ctx *b, size_t blk, int inplace)
{
    switch (b->op) {
    case OP_ALLREDUCE:
        return dt_pg_allreduce(b->pg, inplace ? DT_IN_PLACE : b->send, inplace ? b->send : b->recv,
                               blk, b->dt, DT_REDUCE_SUM);
    case OP_REDUCE_SCATTER:
        return dt_pg_reduce_scatter(b->pg, b->send,
                                    inplace ? b->send + (size_t)b->rank * blk * b->es : b->recv, blk,
                                    b->dt, DT_REDUCE_SUM);
    case OP_ALLGATHER:
        return dt_pg_allgather(b->pg, inplace ? DT_IN_PLACE : b->send, b->recv, blk, b->dt);
    case OP_BROADCAST:
        return dt_pg_broadcast(b->pg, inplace ? b->send : b->recv, blk, b->dt, 0);
    default:
        return DT_ERR_INVALID_ARG;
    }
}

/* Fill inputs, run once, return the number of wrong elements on this rank
 * (or a negative status). */
static long check_op(const bench_ctx *b, size_t blk, int inplace)
{
    size_t w = (size_t)b->w, r = (size_t)b->rank;
    size_t in_n = b->op == OP_REDUCE_SCATTER ? blk * w : blk;
    size_t out_n = b->op == OP_ALLGATHER ? blk * w : blk;
    for (size_t i = 0; i < in_n; i++)
        dt_dtype_store(b->dt, b->send, i, value(b->rank, i));
    for (size_t i = 0; i < out_n; i++)
        dt_dtype_store(b->dt, b->recv, i, 99);
    char *io = b->recv; /* where the result lands */
    switch (b->op) {
    case OP_ALLREDUCE: io = inplace ? b->send : b->recv; break;
    case OP_REDUCE_SCATTER: io = inplace ? b->send + r * blk * b->es : b->recv; break;
    case OP_ALLGATHER:
        if (inplace)
            for (size_t i = 0; i < blk; i++)
                dt_dtype_store(b->dt, b->recv, r * blk + i, value(b->rank, i));
        break;
    case OP_BROADCAST:
        io = inplace ? b->send : b->recv;
        for (size_t i = 0; i < blk; i++)
            dt_dtype_store(b->dt, io, i, b->rank == 0 ? value(0, i) : 99);
        break;
    default: break;
    }
    dt_status st = run_op(b, blk, inplace);
    if (st < 0)
        return st;
    long bad = 0;
    for (size_t i = 0; i < out_n; i++) {
        double want = 0;
        switch (b->op) {
        case OP_ALLREDUCE:
            for (int q = 0; q < b->w; q++)
                want += value(q, i);
            break;
        case OP_REDUCE_SCATTER:
            for (int q = 0; q < b->w; q++)
                want += value(q, r * blk + i);
            break;
        case OP_ALLGATHER: want = value((int)(i / blk), i % blk); break;
        case OP_BROADCAST: want = value(0, i); break;
        default: break;
        }
        bad += dt_dtype_load(b->dt, io, i) != want;
    }
    return bad;
}

static double bus_factor(op_kind op, int w)
{
    switch (op) {
    case OP_ALLREDUCE: return 2.0 * (w - 1) / w;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER: return (double)(w - 1) / w;
    default: return 1.0;
    }
}

typedef struct {
    double time_us, algbw, busbw;
    long bad;
    int iters;
} result;

/* Check, warm up and time one (size, memory, placement) point. */
static dt_status measure(const bench_ctx *b, size_t blk, size_t size, int iters, int inplace,
                         result *res)
{
    long bad = check_op(b, blk, inplace);
    if (bad < 0)
        return (dt_status)bad;
    int64_t bad64 = bad;
    dt_status st = dt_pg_allreduce(b->pg, DT_IN_PLACE, &bad64, 1, DT_I64, DT_REDUCE_SUM);
    int warm = iters / 10 < 2 ? 2 : iters / 10;
    for (int k = 0; st == DT_OK && k < warm; k++)
        st = run_op(b, blk, inplace);
    if (st == DT_OK)
        st = dt_pg_barrier(b->pg);
    double t0 = dt_time_s();
    for (int k = 0; st == DT_OK && k < iters; k++)
        st = run_op(b, blk, inplace);
    double dt = (dt_time_s() - t0) / iters;
    if (st == DT_OK)
        st = dt_pg_allreduce(b->pg, DT_IN_PLACE, &dt, 1, DT_F64, DT_REDUCE_MAX);
    if (st < 0)
        return st;
    res->time_us = dt * 1e6;
    res->algbw = (double)size / dt / 1e9;
    res->busbw = res->algbw * bus_factor(b->op, b->w);
    res->bad = (long)bad64;
    res->iters = iters;
    return DT_OK;
}

/* nccl-tests' names of types and operations. */
static const char *nccl_type(dt_dtype dt)
{
    switch (dt) {
    case DT_F32: return "float";
    case DT_F64: return "double";
    case DT_F16: return "half";
    case DT_BF16: return "bfloat16";
    case DT_I32: return "int32";
    case DT_I64: return "int64";
    case DT_U8: return "uint8";
    default: return "?";
    }
}

/* Time as nccl-tests prints it: fewer decimals as it grows. */
static void time_str(double us, char *buf, size_t n)
{
    snprintf(buf, n, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

static void print_row(const bench_ctx *b, size_t size, const result r[2])
{
    int reduces = b->op == OP_ALLREDUCE || b->op == OP_REDUCE_SCATTER;
    printf("%12zu  %12zu  %8s  %6s  %6i", size, size / b->es, nccl_type(b->dt), reduces ? "sum" : "none",
           b->op == OP_BROADCAST ? 0 : -1);
    for (int k = 0; k < 2; k++) {
        char t[32];
        time_str(r[k].time_us, t, sizeof t);
        printf("  %7s  %6.2f  %6.2f  %5g", t, r[k].algbw, r[k].busbw, (double)r[k].bad);
    }
    printf("\n");
}

static void print_header(void)
{
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
           "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
    printf("  %7s  %6s  %6s  %6s", "time", "algbw", "busbw", "#wrong");
    printf("  %7s  %6s  %6s  %6s\n", "time", "algbw", "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
    printf("  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "");
    printf("  %7s  %6s  %6s  %5s\n", "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_json(const bench_ctx *b, const char *mem, int inplace, size_t size,
                       const result *r)
{
    printf("{\"bench\":\"coll\",\"impl\":\"dtrain\",\"backend\":\"%s\",\"algo\":\"%s\",\"op\":\"%s\","
           "\"dtype\":\"%s\",\"ranks\":%d,\"mem\":\"%s\",\"inplace\":%s,\"bytes\":%zu,"
           "\"count\":%zu,\"iters\":%d,\"time_us\":%.3f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,"
           "\"correct\":%s}\n",
           dt_pg_backend(b->pg), dt_pg_is_hierarchical(b->pg) ? "hier" : "flat", op_names[b->op], dt_dtype_name(b->dt), b->w, mem,
           inplace ? "true" : "false", size, size / b->es, r->iters, r->time_us, r->algbw,
           r->busbw, r->bad ? "false" : "true");
}

/* Elements per rank for a nominal size in bytes (at least 1). */
static size_t block_of(const bench_ctx *b, size_t bytes)
{
    size_t blk = bytes / b->es;
    if (b->op == OP_REDUCE_SCATTER || b->op == OP_ALLGATHER)
        blk /= (size_t)b->w;
    return blk ? blk : 1;
}

static size_t size_of(const bench_ctx *b, size_t blk)
{
    size_t s = blk * b->es;
    return b->op == OP_REDUCE_SCATTER || b->op == OP_ALLGATHER ? s * (size_t)b->w : s;
}

/* The footer's totals over every row printed. */
static long g_wrong;
static double g_bw_sum;
static int g_bw_n;

static int sweep(bench_ctx *b, const bench_opts *o, const char *mem)
{
    for (size_t bytes = o->min;; bytes *= 2) {
        size_t blk = block_of(b, bytes), size = size_of(b, blk);
        int iters = o->iters;
        if (!iters) {
            size_t it = (256u << 20) / size;
            iters = it < 5 ? 5 : it > 1000 ? 1000 : (int)it;
        }
        result r[2];
        for (int inplace = 0; inplace < 2; inplace++) {
            dt_status st = measure(b, blk, size, iters, inplace, &r[inplace]);
            if (st < 0) {
                dt__cli_err("dtrain bench coll: rank %d: %s of %zu bytes (%s memory) failed: "
                                "%s: %s\n", b->rank, op_names[b->op], size, mem,
                        dt_status_name(st), dt_last_error());
                return 1;
            }
            if (b->rank == 0 && o->json)
                print_json(b, mem, inplace, size, &r[inplace]);
        }
        g_wrong += r[0].bad + r[1].bad;
        g_bw_sum += r[0].busbw + r[1].busbw;
        g_bw_n += 2;
        if (b->rank == 0 && !o->json)
            print_row(b, size, r);
        fflush(stdout);
        if (bytes > o->max / 2)
            break;
    }
    return 0;
}

int dt_bench_coll(int argc, char **argv)
{
    bench_opts o;
    int pr = parse(argc, argv, &o);
    if (pr)
        return pr == 1 ? 0 : 2;
    dt_pg *pg = NULL;
    if (dt_pg_init(NULL, &pg) < 0) {
        dt__cli_err("dtrain bench coll: cannot create the process group: %s\n", dt_last_error());
        return 1;
    }
    dt_pg *world = pg;
    if (o.hier && dt_pg_hierarchical(world, &pg) < 0) {
        dt__cli_err("dtrain bench coll: --algo hier: %s\n", dt_last_error());
        dt_pg_free(world);
        return 1;
    }
    bench_ctx b = {.pg = pg, .op = o.op, .dt = o.dtype, .es = dt_dtype_size(o.dtype),
                   .rank = dt_pg_rank(pg), .w = dt_pg_size(pg)};
    size_t max_blk = block_of(&b, o.max);
    size_t in_bytes = max_blk * b.es * (o.op == OP_REDUCE_SCATTER ? (size_t)b.w : 1);
    size_t out_bytes = max_blk * b.es * (o.op == OP_ALLGATHER ? (size_t)b.w : 1);
    int rc = 0;
    if (b.rank == 0 && !o.json) {
        dt_pg_topo t = dt_pg_hier_topology(pg);
        printf("# dtrain bench coll: %s, %d ranks, backend %s, algorithm %s", op_names[o.op], b.w,
               dt_pg_backend(pg), dt_pg_is_hierarchical(pg) ? "hierarchical" : "flat");
        if (o.hier)
            printf(" (%d node%s%s)", t.nnodes, t.nnodes == 1 ? "" : "s", t.simulated ? ", simulated" : "");
        printf("; time = mean per op of the slowest rank\n#\n");
    }
    for (int g = 0; g < 2 && rc == 0; g++) {
        if (g == 0 ? !o.plain : !o.group)
            continue;
        b.send = g ? dt_pg_alloc(pg, in_bytes) : dt_alloc(in_bytes);
        b.recv = g ? dt_pg_alloc(pg, out_bytes) : dt_alloc(out_bytes);
        /* Every rank must agree to go on: a failed allocation on one rank
         * must not leave the others waiting in a collective. */
        int64_t ok = b.send && b.recv;
        if (!ok)
            dt__cli_err("dtrain bench coll: rank %d: cannot allocate %zu + %zu bytes of %s "
                            "memory: %s\n", b.rank, in_bytes, out_bytes, g ? "group" : "plain",
                    dt_last_error());
        if (dt_pg_allreduce(pg, DT_IN_PLACE, &ok, 1, DT_I64, DT_REDUCE_MIN) < 0 || !ok)
            rc = 1;
        else {
            if (b.rank == 0 && !o.json) {
                printf("# mem: %s\n", g ? "group" : "plain");
                print_header();
            }
            rc = sweep(&b, &o, g ? "group" : "plain");
        }
        if (g) {
            dt_pg_dealloc(pg, b.send);
            dt_pg_dealloc(pg, b.recv);
        } else {
            dt_free(b.send);
            dt_free(b.recv);
        }
    }
    if (b.rank == 0 && !o.json && rc == 0) {
        printf("# Out of bounds values : %ld %s\n", g_wrong, g_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n", g_bw_n ? g_bw_sum / g_bw_n : 0.0);
        printf("#\n");
    }
    if (pg != world)
        dt_pg_free(pg);
    dt_pg_free(world);
    return rc || g_wrong ? 1 : 0;
}
