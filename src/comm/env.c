/* Rank discovery: explicit params, then launcher variables, in the
 * precedence that comm.h documents. Every source is read as a whole (rank,
 * size, local rank, local size) and validated; a half-set source or values
 * that contradict each other are an error that names the variables. */
#include "comm/pg.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *dt__rank_source_name(dt__rank_source s)
{
    switch (s) {
    case DT__SRC_PARAMS: return "params";
    case DT__SRC_DTRAIN: return "dtrain (DT_RANK/DT_WORLD_SIZE)";
    case DT__SRC_TORCHRUN: return "torchrun (RANK/WORLD_SIZE)";
    case DT__SRC_OMPI: return "Open MPI (OMPI_COMM_WORLD_*)";
    case DT__SRC_PMI: return "PMI (PMI_RANK/PMI_SIZE)";
    case DT__SRC_MV2: return "MVAPICH2 (MV2_COMM_WORLD_*)";
    case DT__SRC_SLURM: return "Slurm (SLURM_PROCID/SLURM_NTASKS)";
    case DT__SRC_NONE: return "none (single process)";
    }
    return "?";
}

/* Names of one source's variables. */
typedef struct {
    dt__rank_source src;
    const char *rank, *size, *lrank, *lsize;
} src_vars;

static const src_vars k_sources[] = {
    {DT__SRC_DTRAIN, "DT_RANK", "DT_WORLD_SIZE", "DT_LOCAL_RANK", "DT_LOCAL_WORLD_SIZE"},
    {DT__SRC_TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {DT__SRC_OMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {DT__SRC_PMI, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {DT__SRC_MV2, "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"},
    {DT__SRC_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
};

static int is_set(const char *name) { return name && getenv(name) && *getenv(name); }

/* Slurm's SLURM_TASKS_PER_NODE ("4(x2),3": nodes 0-1 run 4 tasks, node 2
 * runs 3) entry for node `node`; -1 if the list is malformed (a count < 0, a
 * repeat < 1) or too short. idx <= node throughout, so neither idx + rep
 * nor node - idx can overflow whatever the repeats are. */
static long slurm_tasks_on_node(const char *s, long node)
{
    if (node < 0)
        return -1;
    long idx = 0;
    while (s && *s) {
        char *end;
        long n = strtol(s, &end, 10);
        if (end == s || n < 0)
            return -1;
        long rep = 1;
        if (*end == '(' && end[1] == 'x') {
            rep = strtol(end + 2, &end, 10);
            if (*end != ')' || rep < 1)
                return -1;
            end++;
        }
        if (rep > node - idx)
            return n;
        idx += rep;
        s = *end == ',' ? end + 1 : end;
    }
    return -1;
}

/* Every rank/size variable goes through the library's one strict parser
 * (dt_env_int): "abc", " 2", "2x" and 4294967298 are errors naming the
 * variable, never a silent 0 or a truncation to int. Each is range-checked
 * here; the relations between them (rank < size) below. */
#define RANK_MAX (INT_MAX - 1)

static dt_status read_source(const src_vars *v, dt__rank_env *o)
{
    int64_t r, n, lr, ln;
    if (!is_set(v->rank) || !is_set(v->size))
        return dt_error(DT_ERR_INVALID_ARG,
                        "%s: %s is set but %s is not; set both (or neither)",
                        dt__rank_source_name(v->src), is_set(v->rank) ? v->rank : v->size,
                        is_set(v->rank) ? v->size : v->rank);
    if (dt_env_int(v->size, -1, 1, INT_MAX, &n) < 0 ||
        dt_env_int(v->rank, -1, 0, RANK_MAX, &r) < 0)
        return DT_ERR_INVALID_ARG;
    if (dt_env_int(v->lrank, -1, 0, RANK_MAX, &lr) < 0)
        return DT_ERR_INVALID_ARG;
    ln = -1;
    if (v->lsize) {
        if (dt_env_int(v->lsize, -1, 1, INT_MAX, &ln) < 0)
            return DT_ERR_INVALID_ARG;
    } else {
        int64_t node;
        if (is_set("SLURM_NODEID") && is_set("SLURM_TASKS_PER_NODE")) {
            if (dt_env_int("SLURM_NODEID", 0, 0, INT_MAX, &node) < 0)
                return DT_ERR_INVALID_ARG;
            ln = slurm_tasks_on_node(getenv("SLURM_TASKS_PER_NODE"), (long)node);
            if (ln < 0)
                return dt_error(DT_ERR_INVALID_ARG,
                                "%s: SLURM_TASKS_PER_NODE=\"%s\" has no entry for SLURM_NODEID=%lld "
                                "(expected counts such as \"4(x2),3\")",
                                dt__rank_source_name(v->src), getenv("SLURM_TASKS_PER_NODE"),
                                (long long)node);
        }
    }
    int lr_set = is_set(v->lrank), ln_set = ln >= 0 || (v->lsize && is_set(v->lsize));
    if (!lr_set && !ln_set) {
        lr = r; /* no local information: assume every rank is here */
        ln = n;
    } else if (lr_set != ln_set) {
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s is set but %s is not",
                        dt__rank_source_name(v->src), lr_set ? v->lrank : (v->lsize ? v->lsize : "SLURM_TASKS_PER_NODE"),
                        lr_set ? (v->lsize ? v->lsize : "SLURM_TASKS_PER_NODE") : v->lrank);
    }
    if (n < 1 || r < 0 || r >= n)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s=%lld must be in [0, %s=%lld)",
                        dt__rank_source_name(v->src), v->rank, (long long)r, v->size, (long long)n);
    if (ln < 1 || ln > n || lr < 0 || lr >= ln)
        return dt_error(DT_ERR_INVALID_ARG,
                        "%s: local rank %s=%lld must be in [0, local size %lld), and the local "
                        "size in [1, %s=%lld]",
                        dt__rank_source_name(v->src), v->lrank, (long long)lr, (long long)ln,
                        v->size, (long long)n);
    o->rank = (int)r;
    o->size = (int)n;
    o->local_rank = (int)lr;
    o->local_size = (int)ln;
    o->src = v->src;
    return DT_OK;
}

static void copy_env(char *dst, size_t cap, const char *name)
{
    const char *s = getenv(name);
    if (s && *s && !dst[0])
        snprintf(dst, cap, "%s", s);
}

dt_status dt__rank_discover(const dt_pg_params *p, dt__rank_env *o)
{
    memset(o, 0, sizeof *o);
    o->src = DT__SRC_NONE;
    if (p && (p->rank >= 0 || p->world_size > 0)) {
        if (p->world_size < 1 || p->rank < 0 || p->rank >= p->world_size)
            return dt_error(DT_ERR_INVALID_ARG,
                            "dt_pg_params: rank=%d must be in [0, world_size=%d)", p->rank,
                            p->world_size);
        int ln = p->local_world_size > 0 ? p->local_world_size : p->world_size;
        int lr = p->local_rank >= 0 ? p->local_rank : (p->local_world_size > 0 ? -1 : p->rank);
        if (ln > p->world_size || lr < 0 || lr >= ln)
            return dt_error(DT_ERR_INVALID_ARG,
                            "dt_pg_params: local_rank=%d must be in [0, local_world_size=%d) "
                            "and local_world_size <= world_size=%d",
                            p->local_rank, p->local_world_size, p->world_size);
        o->rank = p->rank;
        o->size = p->world_size;
        o->local_rank = lr;
        o->local_size = ln;
        o->src = DT__SRC_PARAMS;
    } else {
        o->rank = 0;
        o->size = 1;
        o->local_rank = 0;
        o->local_size = 1;
        for (size_t i = 0; i < sizeof k_sources / sizeof k_sources[0]; i++) {
            const src_vars *v = &k_sources[i];
            if (!is_set(v->rank) && !is_set(v->size))
                continue;
            /* Slurm only inside an srun step (an sbatch script has the
             * variables of the allocation, not of a task). */
            if (v->src == DT__SRC_SLURM && !is_set("SLURM_STEP_ID"))
                continue;
            dt_status st = read_source(v, o);
            if (st < 0)
                return st;
            break;
        }
        /* dtrain's launcher also exports torchrun's names: they must agree. */
        if (o->src == DT__SRC_DTRAIN && is_set("RANK") && is_set("WORLD_SIZE")) {
            int64_t r, n;
            if (dt_env_int("RANK", -1, 0, RANK_MAX, &r) < 0 ||
                dt_env_int("WORLD_SIZE", -1, 1, INT_MAX, &n) < 0)
                return DT_ERR_INVALID_ARG;
            if (r != o->rank || n != o->size)
                return dt_error(DT_ERR_INVALID_ARG,
                                "inconsistent environment: DT_RANK=%d DT_WORLD_SIZE=%d but "
                                "RANK=%lld WORLD_SIZE=%lld",
                                o->rank, o->size, (long long)r, (long long)n);
        }
    }

    /* Job id (names the shm segment) and the rendezvous address. */
    if (p && p->job_id)
        snprintf(o->job_id, sizeof o->job_id, "%s", p->job_id);
    /* DT_JOB_ID as is: `dtrain run` removes the segment named from it
     * (dt__shm_segment_name) after a failed attempt, before restarting. */
    copy_env(o->job_id, sizeof o->job_id, "DT_JOB_ID");
    if (o->src >= DT__SRC_OMPI && o->src != DT__SRC_NONE) {
        copy_env(o->job_id, sizeof o->job_id, "OMPI_MCA_ess_base_jobid");
        copy_env(o->job_id, sizeof o->job_id, "PMIX_NAMESPACE");
        if (!o->job_id[0] && is_set("SLURM_JOB_ID"))
            snprintf(o->job_id, sizeof o->job_id, "slurm.%s.%s", getenv("SLURM_JOB_ID"),
                     is_set("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "0");
    }
    if (p && p->master_addr)
        snprintf(o->master_addr, sizeof o->master_addr, "%s", p->master_addr);
    copy_env(o->master_addr, sizeof o->master_addr, "MASTER_ADDR");
    o->master_port = p && p->master_port > 0 ? p->master_port : 0;
    if (!o->master_port) {
        int64_t port;
        if (dt_env_int("MASTER_PORT", 0, 0, 65535, &port) < 0)
            return DT_ERR_INVALID_ARG;
        o->master_port = (int)port;
    }
    return DT_OK;
}

dt_status dt_pg_env_world_size(int *out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_pg_env_world_size: NULL out");
    dt__rank_env e;
    dt_status st = dt__rank_discover(NULL, &e);
    if (st < 0)
        return st;
    *out = e.size;
    return DT_OK;
}
