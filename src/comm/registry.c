/* The backend registry (name → table), backend-string parsing, and the
 * names of kinds and reductions.
 *
 * Built-ins: self, shm, and mpi when src/comm/mpi/backend_mpi.c is part of the
 * build (MPI found); the check below uses __has_include on that file, so
 * adding or removing it needs no other change. */
#include "comm/pg.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#if DT_HAVE_MPI && defined(__has_include)
#if __has_include("mpi/backend_mpi.c")
#define DT__HAVE_MPI_BACKEND 1
extern const dt_backend_ops dt__backend_mpi;
#endif
#endif

#define DT__MAX_BACKENDS 32

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static dt_backend_ops g_table[DT__MAX_BACKENDS];
static int g_n, g_init;

static const char *const k_kind_names[] = {
    "allreduce", "reduce",  "broadcast", "allgather", "allgatherv", "reduce_scatter",
    "gather",    "scatter", "alltoall",  "barrier",   "send",       "recv",
};
_Static_assert(sizeof k_kind_names / sizeof k_kind_names[0] == DT_COLL_KIND_COUNT,
               "one name per dt_coll_kind");

static const char *const k_op_names[] = {"sum", "avg", "max", "min", "prod"};
_Static_assert(sizeof k_op_names / sizeof k_op_names[0] == DT_REDUCE_OP_COUNT,
               "one name per dt_reduce_op");

const char *dt_coll_kind_name(dt_coll_kind k)
{
    return (unsigned)k < DT_COLL_KIND_COUNT ? k_kind_names[k] : "?";
}

const char *dt_reduce_op_name(dt_reduce_op op)
{
    return (unsigned)op < DT_REDUCE_OP_COUNT ? k_op_names[op] : "?";
}

char *dt__coll_describe(const dt_coll *c, char *buf, size_t n)
{
    switch (c->kind) {
    case DT_COLL_BARRIER:
        snprintf(buf, n, "barrier #%llu", (unsigned long long)c->seq);
        break;
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE_SCATTER:
        snprintf(buf, n, "%s(count=%zu, %s, %s) #%llu", dt_coll_kind_name(c->kind), c->count,
                 dt_dtype_name(c->dtype), dt_reduce_op_name(c->op), (unsigned long long)c->seq);
        break;
    case DT_COLL_REDUCE:
        snprintf(buf, n, "reduce(count=%zu, %s, %s, root=%d) #%llu", c->count,
                 dt_dtype_name(c->dtype), dt_reduce_op_name(c->op), c->root,
                 (unsigned long long)c->seq);
        break;
    case DT_COLL_SEND:
    case DT_COLL_RECV:
        snprintf(buf, n, "%s(count=%zu, %s, peer=%d) #%llu", dt_coll_kind_name(c->kind), c->count,
                 dt_dtype_name(c->dtype), c->root, (unsigned long long)c->seq);
        break;
    case DT_COLL_BROADCAST:
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER:
        snprintf(buf, n, "%s(count=%zu, %s, root=%d) #%llu", dt_coll_kind_name(c->kind), c->count,
                 dt_dtype_name(c->dtype), c->root, (unsigned long long)c->seq);
        break;
    default:
        snprintf(buf, n, "%s(count=%zu, %s) #%llu", dt_coll_kind_name(c->kind), c->count,
                 dt_dtype_name(c->dtype), (unsigned long long)c->seq);
        break;
    }
    return buf;
}

static int valid_name(const char *s)
{
    if (!s || !*s || strlen(s) >= 32)
        return 0;
    for (; *s; s++)
        if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '_'))
            return 0;
    return 1;
}

static dt_status register_locked(const dt_backend_ops *ops)
{
    if (!ops)
        return dt_error(DT_ERR_NULL, "dt_backend_register: NULL table");
    if (ops->version != DT_BACKEND_VERSION)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_backend_register: backend '%s' has version %d, this library "
                        "needs DT_BACKEND_VERSION %d",
                        ops->name ? ops->name : "?", ops->version, DT_BACKEND_VERSION);
    if (!valid_name(ops->name))
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_backend_register: name '%s' must be 1-31 characters of [a-z0-9_]",
                        ops->name ? ops->name : "(null)");
    if (!ops->init || !ops->free || !ops->run)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_backend_register: backend '%s' lacks a required slot (%s)", ops->name,
                        !ops->init ? "init" : !ops->free ? "free" : "run");
    if (!ops->mem_alloc != !ops->mem_free)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_backend_register: backend '%s' must set both mem_alloc and "
                        "mem_free or neither",
                        ops->name);
    if (!ops->p2p_start != !ops->p2p_test || !ops->p2p_start != !ops->p2p_idle)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_backend_register: backend '%s' must set p2p_start, p2p_test and "
                        "p2p_idle together or none of them",
                        ops->name);
    if (ops->p2p_wake && !ops->p2p_start)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_backend_register: backend '%s' sets p2p_wake without the p2p slots",
                        ops->name);
    for (int i = 0; i < g_n; i++)
        if (!strcmp(g_table[i].name, ops->name)) {
            g_table[i] = *ops;
            return DT_OK;
        }
    if (g_n == DT__MAX_BACKENDS)
        return dt_error(DT_ERR_NO_MEMORY, "dt_backend_register: more than %d backends",
                        DT__MAX_BACKENDS);
    g_table[g_n++] = *ops;
    return DT_OK;
}

static void init_locked(void)
{
    if (g_init)
        return;
    g_init = 1;
    register_locked(&dt__backend_self);
    register_locked(&dt__backend_shm);
#ifdef DT__HAVE_MPI_BACKEND
    register_locked(&dt__backend_mpi);
#endif
}

/* The cleanup slots (job_cleanup when job_id, else orphan_cleanup) of the
 * registered backends, copied under the lock and called outside it. */
static dt_status cleanup_all(const char *job_id, int *removed)
{
    dt_status (*job[DT__MAX_BACKENDS])(const char *, int *);
    dt_status (*orphan[DT__MAX_BACKENDS])(int *);
    pthread_mutex_lock(&g_mu);
    init_locked();
    int n = g_n;
    for (int i = 0; i < n; i++)
        job[i] = g_table[i].job_cleanup, orphan[i] = g_table[i].orphan_cleanup;
    pthread_mutex_unlock(&g_mu);
    for (int i = 0; i < n; i++) {
        int r = 0;
        dt_status st = job_id ? (job[i] ? job[i](job_id, &r) : DT_OK) : (orphan[i] ? orphan[i](&r) : DT_OK);
        if (st < 0)
            return st;
        *removed += r > 0 ? r : 0;
    }
    return DT_OK;
}

dt_status dt_pg_job_cleanup(const char *job_id, int *removed)
{
    if (removed)
        *removed = 0;
    if (!job_id || !removed)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pg_job_cleanup: job_id and removed must not be NULL");
    return cleanup_all(job_id, removed);
}

dt_status dt_pg_orphan_cleanup(int *removed)
{
    if (!removed)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pg_orphan_cleanup: removed must not be NULL");
    *removed = 0;
    return cleanup_all(NULL, removed);
}

void dt__registry_init(void)
{
    pthread_mutex_lock(&g_mu);
    init_locked();
    pthread_mutex_unlock(&g_mu);
}

dt_status dt_backend_register(const dt_backend_ops *ops)
{
    pthread_mutex_lock(&g_mu);
    init_locked();
    dt_status st = register_locked(ops);
    pthread_mutex_unlock(&g_mu);
    return st;
}

const dt_backend_ops *dt_backend_find(const char *name)
{
    const dt_backend_ops *r = NULL;
    if (!name)
        return NULL;
    pthread_mutex_lock(&g_mu);
    init_locked();
    for (int i = 0; i < g_n; i++)
        if (!strcmp(g_table[i].name, name))
            r = &g_table[i];
    pthread_mutex_unlock(&g_mu);
    return r;
}

int dt__backend_copy(const char *name, dt_backend_ops *out)
{
    int found = 0;
    pthread_mutex_lock(&g_mu);
    init_locked();
    for (int i = 0; i < g_n && !found; i++)
        if (!strcmp(g_table[i].name, name)) {
            *out = g_table[i];
            found = 1;
        }
    pthread_mutex_unlock(&g_mu);
    return found;
}

char *dt_backend_list(char *buf, size_t n)
{
    if (!buf || !n)
        return buf;
    buf[0] = '\0';
    pthread_mutex_lock(&g_mu);
    init_locked();
    size_t off = 0;
    for (int i = 0; i < g_n && off < n; i++) {
        int w = snprintf(buf + off, n - off, "%s%s", i ? "," : "", g_table[i].name);
        if (w < 0)
            break;
        off += (size_t)w;
    }
    pthread_mutex_unlock(&g_mu);
    return buf;
}

/* "cpu:shm?opt,cuda:nccl" — entries separated by ',', each "[device:]name[?options]". */
dt_status dt_backend_parse(const char *s, const char *device, char *name, size_t name_cap,
                           char *options, size_t options_cap)
{
    if (!s || !device || !name || !name_cap)
        return dt_error(DT_ERR_NULL, "dt_backend_parse: NULL argument");
    name[0] = '\0';
    if (options && options_cap)
        options[0] = '\0';
    int found = 0;
    const char *p = s;
    if (!*p)
        return dt_error(DT_ERR_INVALID_ARG, "backend string is empty");
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char ent[128];
        if (len == 0 || len >= sizeof ent)
            return dt_error(DT_ERR_INVALID_ARG, "backend string \"%s\": empty or overlong entry", s);
        memcpy(ent, p, len);
        ent[len] = '\0';
        char *colon = strchr(ent, ':');
        const char *dev = "cpu", *nm = ent;
        if (colon) {
            *colon = '\0';
            dev = ent;
            nm = colon + 1;
            if (!*dev)
                return dt_error(DT_ERR_INVALID_ARG, "backend string \"%s\": empty device name", s);
        }
        char *q = strchr(nm, '?');
        const char *opt = "";
        if (q) {
            *q = '\0';
            opt = q + 1;
        }
        if (!valid_name(nm))
            return dt_error(DT_ERR_INVALID_ARG,
                            "backend string \"%s\": backend name \"%s\" must be [a-z0-9_]+", s, nm);
        if (!strcmp(dev, device)) {
            if (found)
                return dt_error(DT_ERR_INVALID_ARG,
                                "backend string \"%s\": device '%s' is listed twice", s, device);
            found = 1;
            if (strlen(nm) >= name_cap || (options && strlen(opt) >= options_cap))
                return dt_error(DT_ERR_INVALID_ARG, "backend string \"%s\": entry too long", s);
            strcpy(name, nm);
            if (options && options_cap)
                strcpy(options, opt);
        }
        p += len;
        if (*p == ',') {
            p++;
            if (!*p)
                return dt_error(DT_ERR_INVALID_ARG, "backend string \"%s\": trailing ','", s);
        }
    }
    if (!found)
        return dt_error(DT_ERR_NOT_FOUND, "backend string \"%s\" has no entry for device '%s'", s,
                        device);
    return DT_OK;
}
