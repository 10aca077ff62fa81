/* dtrain bench — dispatches to the benchmark suites. */
#include "cmd.h"

#include <stdio.h>
#include <string.h>

int dt_cmd_bench(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*fn)(int, char **);
        const char *help;
    } suites[] = {
        {"step", dt_bench_step, "training step time: --model {convnet,mlp} --batch N [--json]"},
        {"coll", dt_bench_coll, "collectives (under dtrain run): --op allreduce [--min 8] [--max 256M] [--json]"},
        {"ddp", dt_bench_ddp, "DDP step with/without gradient communication (under dtrain run): --model --batch [--json]"},
        {"zero", dt_bench_zero, "ZeRO stages against DDP (under dtrain run): --model --batch [--modes ...] [--json]"},
        {"matmul", dt_bench_matmul, "matmul GFLOP/s and the machine's peak: [--size 2048] [--json]"},
        {"data", dt_bench_data, "data loader throughput: [--data SPEC] [--batch 100] [--compute-ms X] [--json]"},
    };
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: dtrain bench <suite> [options]\n\nsuites:\n");
        for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++)
            fprintf(f, "  %-7s %s\n", suites[i].name, suites[i].help);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++)
        if (!strcmp(argv[1], suites[i].name))
            return suites[i].fn(argc - 1, argv + 1);
    dt__cli_err("dtrain bench: unknown suite '%s' (step, coll, ddp, zero, matmul, data)\n", argv[1]);
    return 2;
}
