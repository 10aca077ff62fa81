/* bench/mpi_allreduce.c — the Open MPI baseline for `dtrain bench coll`.
 *
 *     mpirun -np 2 build/bench/mpi_allreduce [--op allreduce] [--min 8] [--max 256M]
 *                                            [--iters N] [--json]
 *
 * Same sizes, same iteration counts, same timing rule and the same output
 * (table or JSON lines) as `dtrain bench coll`, with MPI_Allreduce,
 * MPI_Reduce_scatter_block, MPI_Allgather or MPI_Bcast on float32 (sum).
 * bench/coll_vs_mpi.sh runs both and prints the ratio per size.
 *
 * Conventions (nccl-tests): size is the larger of the input and output of
 * one rank in bytes; time is the mean over iterations of the slowest rank;
 * algbw = size / time; busbw = algbw * 2(W-1)/W for allreduce, (W-1)/W for
 * reduce_scatter and allgather, 1 for broadcast. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST } op_kind;
static const char *const op_names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    size_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024;
    else if (*end == 'M' || *end == 'm')
        mul = 1024 * 1024;
    else if (*end == 'G' || *end == 'g')
        mul = 1024ull * 1024 * 1024;
    return v > 0 ? (size_t)(v * (double)mul) : 0;
}

static float value(int rank, size_t i)
{
    return (float)((i * 7 + (size_t)rank * 3) % 13);
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

/* One operation; in place when inplace is set. blk = per-rank elements. */
static void run_op(op_kind op, float *send, float *recv, size_t blk, int rank, int w, int inplace)
{
    switch (op) {
    case OP_ALLREDUCE:
        MPI_Allreduce(inplace ? MPI_IN_PLACE : send, inplace ? send : recv, (int)blk, MPI_FLOAT,
                      MPI_SUM, MPI_COMM_WORLD);
        break;
    case OP_REDUCE_SCATTER:
        /* MPI's in-place form: input in recvbuf, result at its start. */
        MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : send, inplace ? send : recv, (int)blk,
                                 MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case OP_ALLGATHER:
        if (inplace)
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, recv, (int)blk, MPI_FLOAT, MPI_COMM_WORLD);
        else
            MPI_Allgather(send, (int)blk, MPI_FLOAT, recv, (int)blk, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case OP_BROADCAST:
        MPI_Bcast(inplace ? send : recv, (int)blk, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
    (void)rank;
    (void)w;
}

/* Fill the inputs, run once, count wrong elements on this rank. */
static long check_op(op_kind op, float *send, float *recv, size_t blk, int rank, int w, int inplace)
{
    size_t in_n = op == OP_REDUCE_SCATTER ? blk * (size_t)w : blk;
    size_t out_n = op == OP_ALLGATHER ? blk * (size_t)w : blk;
    for (size_t i = 0; i < in_n; i++)
        send[i] = value(rank, i);
    for (size_t i = 0; i < out_n; i++)
        recv[i] = -1.0f;
    if (op == OP_ALLGATHER && inplace)
        for (size_t i = 0; i < blk; i++)
            recv[(size_t)rank * blk + i] = value(rank, i);
    if (op == OP_BROADCAST && rank != 0)
        for (size_t i = 0; i < blk; i++)
            (inplace ? send : recv)[i] = -1.0f;
    if (op == OP_BROADCAST && rank == 0 && !inplace)
        for (size_t i = 0; i < blk; i++)
            recv[i] = value(0, i);
    run_op(op, send, recv, blk, rank, w, inplace);
    long bad = 0;
    const float *out = (inplace && op != OP_ALLGATHER) ? send : recv;
    for (size_t i = 0; i < out_n; i++) {
        float want = 0;
        switch (op) {
        case OP_ALLREDUCE:
            for (int q = 0; q < w; q++)
                want += value(q, i);
            break;
        case OP_REDUCE_SCATTER:
            for (int q = 0; q < w; q++)
                want += value(q, (size_t)rank * blk + i);
            break;
        case OP_ALLGATHER: want = value((int)(i / blk), i % blk); break;
        case OP_BROADCAST: want = value(0, i); break;
        }
        bad += out[i] != want;
    }
    return bad;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, w;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w);
    op_kind op = OP_ALLREDUCE;
    size_t min = 8, max = 256u << 20;
    int iters_opt = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--op")) {
            int k = 0;
            while (k < 4 && strcmp(v, op_names[k]))
                k++;
            if (k == 4) {
                if (!rank)
                    fprintf(stderr, "mpi_allreduce: unknown --op '%s'\n", v);
                MPI_Finalize();
                return 2;
            }
            op = (op_kind)k;
            i++;
        } else if (!strcmp(argv[i], "--min")) {
            min = parse_size(v), i++;
        } else if (!strcmp(argv[i], "--max")) {
            max = parse_size(v), i++;
        } else if (!strcmp(argv[i], "--iters")) {
            iters_opt = atoi(v), i++;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--dtype")) {
            if (strcmp(v, "f32")) {
                if (!rank)
                    fprintf(stderr, "mpi_allreduce: only --dtype f32\n");
                MPI_Finalize();
                return 2;
            }
            i++;
        } else {
            if (!rank)
                fprintf(stderr, "usage: mpi_allreduce [--op allreduce|reduce_scatter|allgather|"
                                "broadcast] [--min 8] [--max 256M] [--iters N] [--json]\n");
            MPI_Finalize();
            return 2;
        }
    }
    if (min < 4)
        min = 4;
    size_t max_blk = op == OP_ALLREDUCE || op == OP_BROADCAST ? max / 4 : max / 4 / (size_t)w;
    if (max_blk < 1)
        max_blk = 1;
    size_t in_cap = op == OP_REDUCE_SCATTER ? max_blk * (size_t)w : max_blk;
    size_t out_cap = op == OP_ALLGATHER ? max_blk * (size_t)w : max_blk;
    float *send = malloc(in_cap * sizeof(float) + 64);
    float *recv = malloc((out_cap > in_cap ? out_cap : in_cap) * sizeof(float) + 64);
    if (!send || !recv) {
        fprintf(stderr, "mpi_allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (!rank && !json) {
        printf("# Open MPI %s, %d ranks, float32 sum; time = mean per op of the slowest rank\n",
               op_names[op], w);
        printf("# %12s %12s %5s | %10s %9s %9s %5s | %10s %9s %9s %5s\n", "size(B)", "count", "mem",
               "oop us", "algbw", "busbw", "ok", "inpl us", "algbw", "busbw", "ok");
    }
    for (size_t bytes = min; bytes <= max; bytes *= 2) {
        size_t blk = op == OP_ALLREDUCE || op == OP_BROADCAST ? bytes / 4 : bytes / 4 / (size_t)w;
        if (blk < 1)
            blk = 1;
        size_t size = op == OP_ALLREDUCE || op == OP_BROADCAST ? blk * 4 : blk * 4 * (size_t)w;
        int iters = iters_opt > 0 ? iters_opt : (int)((256u << 20) / size);
        if (iters_opt <= 0)
            iters = iters < 5 ? 5 : iters > 1000 ? 1000 : iters;
        double t_us[2], algbw[2], busbw[2];
        long bad[2];
        for (int inplace = 0; inplace < 2; inplace++) {
            long b = check_op(op, send, recv, blk, rank, w, inplace);
            MPI_Allreduce(&b, &bad[inplace], 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            int warm = iters / 10 < 2 ? 2 : iters / 10;
            for (int k = 0; k < warm; k++)
                run_op(op, send, recv, blk, rank, w, inplace);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int k = 0; k < iters; k++)
                run_op(op, send, recv, blk, rank, w, inplace);
            double dt = (MPI_Wtime() - t0) / iters, dmax;
            MPI_Allreduce(&dt, &dmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            t_us[inplace] = dmax * 1e6;
            algbw[inplace] = (double)size / dmax / 1e9;
            busbw[inplace] = algbw[inplace] * bus_factor(op, w);
            if (!rank && json)
                printf("{\"bench\":\"coll\",\"impl\":\"mpi\",\"backend\":\"openmpi\",\"op\":\"%s\","
                       "\"dtype\":\"f32\",\"ranks\":%d,\"mem\":\"plain\",\"inplace\":%s,"
                       "\"bytes\":%zu,\"count\":%zu,\"iters\":%d,\"time_us\":%.3f,"
                       "\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,\"correct\":%s}\n",
                       op_names[op], w, inplace ? "true" : "false", size, size / 4, iters,
                       t_us[inplace], algbw[inplace], busbw[inplace], bad[inplace] ? "false" : "true");
        }
        if (!rank && !json)
            printf("  %12zu %12zu %5s | %10.2f %9.3f %9.3f %5s | %10.2f %9.3f %9.3f %5s\n", size,
                   size / 4, "plain", t_us[0], algbw[0], busbw[0], bad[0] ? "WRONG" : "ok", t_us[1],
                   algbw[1], busbw[1], bad[1] ? "WRONG" : "ok");
        fflush(stdout);
        if (bytes > max / 2)
            break;
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
