/* Model-state memory: the ZeRO estimate per rank and the up-front check
 * against what this machine and this process can still get (offload.h).
 *
 * Why up front: a 2-rank DDP run of a 1e9-parameter AdamW model needs 16 GB
 * per rank (4 params + 4 grads + 8 state bytes per parameter). Allocating
 * it piecemeal on a 24 GiB machine ends with the kernel's OOM killer taking
 * a rank (or the whole desktop) minutes later; comparing the estimate with
 * MemAvailable before the first large allocation fails in a second, with the
 * numbers. Both ranks of a machine read MemAvailable before either
 * allocates, so each compares the machine's total need with it. RLIMIT_AS
 * bounds one process: its need is compared with the limit minus the
 * address space already mapped. */
#include "dtrain/offload.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

dt_status dt_mem_model_states(const dt_mem_policy *p, dt_mem_estimate *out)
{
    if (!p || !out)
        return dt_error(DT_ERR_NULL, "dt_mem_model_states: NULL argument");
    if (p->world < 1 || p->zero_stage < 0 || p->zero_stage > 3 || (p->param_bytes != 2 && p->param_bytes != 4) ||
        (unsigned)p->optimizer >= DT_OPTIM_KIND_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "dt_mem_model_states: world %d (>= 1), zero_stage %d (0..3), "
                        "param_bytes %d (2 or 4), optimizer %d", p->world, p->zero_stage, p->param_bytes,
                        (int)p->optimizer);
    const double psi = (double)p->numel;
    const double shard = (double)((p->numel + (size_t)p->world - 1) / (size_t)p->world);
    const double k = 4.0 * dt_optim_kind_num_states(p->optimizer, p->sgd_momentum); /* f32 states */
    const double b = p->param_bytes;
    dt_mem_estimate e;
    memset(&e, 0, sizeof e);
    e.params = b * (p->zero_stage >= 3 ? shard : psi);
    e.grads = b * (p->zero_stage >= 2 ? shard : psi);
    const double opt_elems = p->zero_stage >= 1 ? shard : psi;
    e.master = p->master_weights ? 4 * opt_elems : 0;
    e.optim = k * opt_elems;
    if (p->offload == DT_OFFLOAD_NVME) {
        e.optim = (double)p->offload_buffer_bytes;
        /* master weights stay in memory: the driver keeps the optimizer's own state in files */
    }
    if (p->param_offload && p->zero_stage >= 3) /* stage 3 parameter offload: the shards' buffers */
        e.params = (double)p->param_buffer_bytes;
    e.total = e.params + e.grads + e.optim + e.master;
    *out = e;
    return DT_OK;
}

/* "MemAvailable:   123456 kB" -> bytes; SIZE_MAX when absent. */
static size_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return SIZE_MAX;
    char line[256];
    size_t v = SIZE_MAX;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            v = (size_t)kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

/* Address space mapped now (/proc/self/statm's first field, in pages). */
static size_t vm_size(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    unsigned long long pages = 0;
    if (fscanf(f, "%llu", &pages) != 1)
        pages = 0;
    fclose(f);
    long ps = sysconf(_SC_PAGESIZE);
    return (size_t)pages * (size_t)(ps > 0 ? ps : 4096);
}

dt_status dt_mem_available(size_t *mem_available, size_t *as_left)
{
    size_t ma = meminfo_available(), al = SIZE_MAX;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        size_t used = vm_size();
        al = (size_t)rl.rlim_cur > used ? (size_t)rl.rlim_cur - used : 0;
    }
    if (mem_available)
        *mem_available = ma;
    if (as_left)
        *as_left = al;
    return DT_OK;
}

static const char *gib(double bytes, char *buf, size_t n)
{
    snprintf(buf, n, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

dt_status dt_mem_check(const char *what, double per_rank, int local_ranks)
{
    if (local_ranks < 1)
        local_ranks = 1;
    size_t ma, al;
    dt_mem_available(&ma, &al);
    const double node = per_rank * local_ranks;
    char a[32], b[32], c[32];
    const char *hint = "shard the state (--zero 1/2/3) or offload the optimizer state (--offload nvme:DIR)";
    if (al != SIZE_MAX && per_rank > (double)al)
        return dt_error(DT_ERR_NO_MEMORY, "%s: model state needs %.0f bytes (%s) per rank; this process may map "
                        "only %zu more bytes (%s, RLIMIT_AS); %s", what ? what : "training", per_rank,
                        gib(per_rank, a, sizeof a), al, gib((double)al, b, sizeof b), hint);
    if (ma != SIZE_MAX && node > (double)ma)
        return dt_error(DT_ERR_NO_MEMORY, "%s: model state needs %.0f bytes (%s) per rank, %.0f bytes (%s) for the "
                        "%d rank%s on this machine; %zu bytes (%s) available (MemAvailable); %s",
                        what ? what : "training", per_rank, gib(per_rank, a, sizeof a), node, gib(node, b, sizeof b),
                        local_ranks, local_ranks == 1 ? "" : "s", ma, gib((double)ma, c, sizeof c), hint);
    return DT_OK;
}
