/* libFuzzer target for rank discovery from the environment (src/comm/env.c):
 * the rank, size, local rank and size, job id and rendezvous address that
 * dtrain, torchrun, Open MPI, PMI, MVAPICH2 and Slurm put in the
 * environment, including Slurm's SLURM_TASKS_PER_NODE ("4(x2),3").
 *
 * Input: lines "K VALUE", where K ('A' + i) picks variable i of k_vars; the
 * variables are set for one dt__rank_discover call and cleared after. Any
 * environment must give either a consistent result (0 <= rank < size,
 * 0 <= local rank < local size <= size, a TCP port) or an error with a
 * message; never a crash or undefined behaviour. Variable 'a' is
 * DT_LOADAVG, the stand-in for the machine's load ("L" or "L,R") that
 * dt_cpu_load_read parses: a load >= 0 and a runnable count >= 0, or an
 * error with a message and both unknown (-1). */
// fuzz-sources: src/base/*.c src/comm/env.c
// fuzz-libs: -lcjson
#include "comm/pg.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const k_vars[] = {
    "DT_RANK", "DT_WORLD_SIZE", "DT_LOCAL_RANK", "DT_LOCAL_WORLD_SIZE",             /* A-D */
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",                         /* E-H */
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",   /* I-K */
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",        /* L-O */
    "MPI_LOCALNRANKS", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",                /* P-R */
    "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID",       /* S-U */
    "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASKS_PER_NODE",        /* V-Y */
    "SLURM_STEP_ID", "SLURM_JOB_ID", "DT_JOB_ID", "OMPI_MCA_ess_base_jobid",        /* Z [ \ ] */
    "PMIX_NAMESPACE", "MASTER_ADDR", "MASTER_PORT",                                 /* ^ _ ` */
    "DT_LOADAVG",                                                                   /* a */
};
#define NVARS (sizeof k_vars / sizeof k_vars[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    for (size_t i = 0; i < NVARS; i++)
        unsetenv(k_vars[i]);
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        size_t k = (size_t)((unsigned char)line[0] - 'A');
        if (k >= NVARS || line[1] != ' ')
            continue;
        /* putenv with our own storage: setenv would leak every old value */
        static char store[NVARS][4200];
        snprintf(store[k], sizeof store[k], "%s=%s", k_vars[k], line + 2);
        putenv(store[k]);
    }

    dt__rank_env e;
    dt_error_clear();
    dt_status st = dt__rank_discover(NULL, &e);
    if (st < 0) {
        if (dt_last_error()[0] == 0)
            abort(); /* an error must come with a message */
    } else {
        if (e.size < 1 || e.rank < 0 || e.rank >= e.size)
            abort();
        if (e.local_size < 1 || e.local_size > e.size || e.local_rank < 0 ||
            e.local_rank >= e.local_size)
            abort();
        if (e.master_port < 0 || e.master_port > 65535)
            abort();
        if (!memchr(e.job_id, 0, sizeof e.job_id) || !memchr(e.master_addr, 0, sizeof e.master_addr))
            abort();
    }
    const char *la = getenv("DT_LOADAVG");
    if (la && *la) { /* (unset or empty reads /proc/loadavg: not the input's) */
        double load = 0;
        int running = 0;
        dt_error_clear();
        if (dt_cpu_load_read(&load, &running) < 0) {
            if (dt_last_error()[0] == 0 || load != -1 || running != -1)
                abort();
        } else if (!(load >= 0 && load <= 1e6) || running < 0) {
            abort();
        }
    }
    for (size_t i = 0; i < NVARS; i++)
        unsetenv(k_vars[i]);
    free(buf);
    return 0;
}
