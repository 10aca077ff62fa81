/* Process groups: creation from params/environment, backend choice,
 * subgroups, accessors, shared allocations. */
#include "comm/pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_pg_params dt_pg_params_default(void)
{
    dt_pg_params p;
    memset(&p, 0, sizeof p);
    p.rank = -1;
    p.world_size = -1;
    p.local_rank = -1;
    p.local_world_size = -1;
    p.check = -1;
    return p;
}

static dt_pg *pg_new(const dt_backend_ops *ops, int rank, int size, int lrank, int lsize,
                     double timeout_s, int check, uint32_t fr_cap, double fr_wait, const char *name)
{
    dt_pg *pg = calloc(1, sizeof *pg);
    if (!pg)
        return NULL;
    pg->rank = rank;
    pg->size = size;
    pg->p2p_seq = calloc(2 * (size_t)size, sizeof *pg->p2p_seq);
    if (!pg->p2p_seq || !dt__flight_init(pg, fr_cap, fr_wait, name)) {
        free(pg->p2p_seq);
        free(pg);
        return NULL;
    }
    pg->ops_copy = *ops;
    pg->ops = &pg->ops_copy;
    snprintf(pg->backend, sizeof pg->backend, "%s", ops->name);
    pg->rank = rank;
    pg->size = size;
    pg->local_rank = lrank;
    pg->local_size = lsize;
    pg->spin = -1;
    atomic_init(&pg->waiting, 0);
    pg->timeout_s = timeout_s;
    pg->check = check;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_mutex_init(&pg->mem_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pg->cv, &ca);
    pthread_cond_init(&pg->pcv, &ca);
    pthread_condattr_destroy(&ca);
    return pg;
}

static void pg_delete(dt_pg *pg)
{
    pthread_cond_destroy(&pg->cv);
    pthread_cond_destroy(&pg->pcv);
    pthread_mutex_destroy(&pg->mu);
    pthread_mutex_destroy(&pg->mem_mu);
    free(pg->p2p_seq);
    free(pg->bv);
    free(pg->node_of);
    dt__flight_free(pg);
    free(pg);
}

/* The backend name when nobody chose one. */
static const char *default_backend(const dt__rank_env *e)
{
    if (e->size == 1)
        return "self";
    int mpi_launch = e->src == DT__SRC_OMPI || e->src == DT__SRC_PMI || e->src == DT__SRC_MV2 ||
                     e->src == DT__SRC_SLURM;
    if (mpi_launch && dt_backend_find("mpi"))
        return "mpi";
    if (e->local_size == e->size)
        return "shm";
    return dt_backend_find("mpi") ? "mpi" : "shm";
}

dt_status dt_pg_init(const dt_pg_params *params, dt_pg **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_pg_init: NULL out");
    *out = NULL;
    dt_pg_params p = params ? *params : dt_pg_params_default();
    dt__registry_init();

    dt__rank_env e;
    dt_status st = dt__rank_discover(&p, &e);
    if (st < 0)
        return st;

    double timeout = p.timeout_s;
    int timeout_src = timeout > 0 ? 2 : getenv("DT_COMM_TIMEOUT") ? 1 : 0;
    if (timeout <= 0) {
        /* Finite and positive: NaN would compare false against every
         * deadline and disable the timeout. */
        if (dt_env_double("DT_COMM_TIMEOUT", 300.0, 0.0, 1e9, &timeout) < 0)
            return DT_ERR_INVALID_ARG;
        if (!(timeout > 0))
            return dt_error(DT_ERR_INVALID_ARG, "DT_COMM_TIMEOUT=%g must be > 0 seconds",
                            timeout);
    }
    /* The start-up bound: $DT_INIT_TIMEOUT, else the operations' timeout. */
    double init_timeout = timeout;
    if (getenv("DT_INIT_TIMEOUT")) {
        if (dt_env_double("DT_INIT_TIMEOUT", timeout, 0.0, 1e9, &init_timeout) < 0)
            return DT_ERR_INVALID_ARG;
        if (!(init_timeout > 0))
            return dt_error(DT_ERR_INVALID_ARG, "DT_INIT_TIMEOUT=%g must be > 0 seconds", init_timeout);
    }
    uint32_t fr_cap;
    double fr_wait;
    if (dt__flight_env(&fr_cap, &fr_wait) < 0)
        return DT_ERR_INVALID_ARG;
    int64_t eager_kb;
    if (dt_env_int("DT_P2P_EAGER_KB", 1024, 0, (int64_t)1 << 30, &eager_kb) < 0)
        return DT_ERR_INVALID_ARG;
    int check = p.check;
    if (check < 0) {
        int64_t c;
        if (dt_env_int("DT_COMM_CHECK", 1, 0, 1, &c) < 0)
            return DT_ERR_INVALID_ARG;
        check = c != 0;
    }

    const char *bs = p.backend;
    if (!bs || !*bs)
        bs = getenv("DT_BACKEND");
    char name[64], opts[256];
    if (bs && *bs) {
        st = dt_backend_parse(bs, "cpu", name, sizeof name, opts, sizeof opts);
        if (st < 0)
            return st;
    } else {
        snprintf(name, sizeof name, "%s", default_backend(&e));
        opts[0] = '\0';
    }
    /* A copy taken under the registry's lock: another thread may
     * re-register this name (which rewrites the table in place) meanwhile. */
    dt_backend_ops ops_now;
    const dt_backend_ops *ops = dt__backend_copy(name, &ops_now) ? &ops_now : NULL;
    if (!ops) {
        char list[256];
        return dt_error(DT_ERR_NOT_FOUND, "backend '%s' is not registered (registered: %s)", name,
                        dt_backend_list(list, sizeof list));
    }

    static _Atomic unsigned worlds; /* groups made by dt_pg_init: their flight recorder names */
    char fname[16];
    snprintf(fname, sizeof fname, "%u", atomic_fetch_add(&worlds, 1));
    dt_pg *pg = pg_new(ops, e.rank, e.size, e.local_rank, e.local_size, timeout, check, fr_cap, fr_wait, fname);
    if (!pg)
        return dt_error(DT_ERR_NO_MEMORY, "dt_pg_init: out of memory");
    dt_backend_info info = {
        .rank = e.rank,
        .world_size = e.size,
        .local_rank = e.local_rank,
        .local_world_size = e.local_size,
        .job_id = e.job_id,
        .master_addr = e.master_addr,
        .master_port = e.master_port,
        .timeout_s = timeout,
        .check = check,
        .options = opts,
        .init_timeout_s = init_timeout,
        .interrupted = p.interrupted,
        .interrupted_arg = p.interrupted_arg,
    };
    dt_error_clear();
    st = pg->ops->init(&info, &pg->ctx);
    if (st < 0) {
        if (!dt_last_error()[0])
            dt_error(st, "backend '%s' failed to start: %s", name, dt_status_str(st));
        pg_delete(pg);
        return st;
    }
    dt__flight_attach(pg);
    pg->timeout_src = timeout_src;
    pg->eager_bytes = (size_t)eager_kb * 1024;
    *out = pg;
    return DT_OK;
}

void dt_pg_free(dt_pg *pg)
{
    if (!pg)
        return;
    dt__pg_engine_stop(pg);
    dt__hier_free(pg->hier); /* its subgroups are children of pg */
    pg->hier = NULL;
    if (pg->children)
        dt_log(DT_LOG_WARN, "dt_pg_free: %d subgroup(s) still alive; free them first",
               pg->children);
    pg->ops->free(pg->ctx);
    if (pg->parent) {
        pthread_mutex_lock(&pg->parent->mu);
        pg->parent->children--;
        pthread_mutex_unlock(&pg->parent->mu);
    }
    pg_delete(pg);
}

dt_status dt_pg_subgroup(dt_pg *parent, const int *ranks, int n, dt_pg **out)
{
    if (!parent || !ranks || !out)
        return dt_error(DT_ERR_NULL, "dt_pg_subgroup: NULL argument");
    *out = NULL;
    if (n < 1 || n > parent->size)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pg_subgroup: %d ranks for a group of %d", n,
                        parent->size);
    int me = -1, local_before = 0;
    char *seen = calloc((size_t)parent->size, 1);
    if (!seen)
        return dt_error(DT_ERR_NO_MEMORY, "dt_pg_subgroup: out of memory");
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size || seen[ranks[i]]) {
            int bad = ranks[i];
            free(seen);
            return dt_error(DT_ERR_INVALID_ARG,
                            "dt_pg_subgroup: rank %d at index %d is out of range [0, %d) or "
                            "listed twice",
                            bad, i, parent->size);
        }
        seen[ranks[i]] = 1;
        if (ranks[i] == parent->rank)
            me = i;
    }
    free(seen);
    (void)local_before;
    if (!parent->ops->subgroup)
        return dt_error(DT_ERR_UNSUPPORTED, "backend '%s' does not implement subgroups",
                        parent->ops->name);

    /* Run in the parent's order: drain, then hold the executor role. */
    pthread_mutex_lock(&parent->mu);
    dt__pg_drain_locked(parent);
    if (parent->fail_st != DT_OK) {
        dt_status fst = parent->fail_st;
        dt_error(fst, "%s", parent->fail_msg);
        pthread_mutex_unlock(&parent->mu);
        return fst;
    }
    parent->busy = 1;
    /* creation counts as one collective of the parent */
    dt_coll cc = {.kind = (dt_coll_kind)DT_FLIGHT_SUBGROUP, .root = -1, .count = (size_t)n, .seq = parent->seq++};
    uint64_t fr_id = dt__flight_post(parent, &cc);
    dt__flight_start(parent, fr_id);
    char fname[40];
    snprintf(fname, sizeof fname, "%.24s.%d", parent->fr.name, parent->fr.subgroups++);
    pthread_mutex_unlock(&parent->mu);

    void *child = NULL;
    dt_error_clear();
    dt_status st = parent->ops->subgroup(parent->ctx, ranks, n, me, &child);

    pthread_mutex_lock(&parent->mu);
    dt__flight_done(parent, fr_id, st < 0 ? st : DT_OK);
    parent->busy = 0;
    pthread_cond_broadcast(&parent->cv);
    dt__pg_kick_locked(parent);
    pthread_mutex_unlock(&parent->mu);
    if (st < 0)
        return st;
    if (me < 0)
        return DT_OK;

    /* Local ranks of a subgroup: everyone is local for local backends;
     * otherwise unknown, so keep the conservative "all local" only when
     * the parent is entirely local. */
    int lsize = parent->local_size == parent->size ? n : 1;
    int lrank = parent->local_size == parent->size ? me : 0;
    dt_pg *pg = pg_new(parent->ops, me, n, lrank, lsize, parent->timeout_s, parent->check, parent->fr.cap,
                       parent->fr.wait_s, fname);
    if (pg && !dt__flight_members(pg, parent, ranks, n)) {
        pg_delete(pg);
        pg = NULL;
    }
    if (!pg) {
        parent->ops->free(child);
        return dt_error(DT_ERR_NO_MEMORY, "dt_pg_subgroup: out of memory");
    }
    pg->ctx = child;
    pg->timeout_src = parent->timeout_src;
    pg->eager_bytes = parent->eager_bytes;
    dt__flight_attach(pg);
    pg->parent = parent;
    pthread_mutex_lock(&parent->mu);
    parent->children++;
    pthread_mutex_unlock(&parent->mu);
    *out = pg;
    return DT_OK;
}

/* Split: exchange (color, key) over the parent, then one dt_pg_subgroup per
 * color in ascending order, members sorted by (key, parent rank). Every rank
 * computes the same lists from the same exchange, so the subgroup calls
 * line up on every rank; a rank outside a color just takes part in that
 * call's name broadcast. */
typedef struct {
    int color, key, rank;
} split_ent;

static int split_cmp(const void *a, const void *b)
{
    const split_ent *x = a, *y = b;
    if (x->color != y->color)
        return x->color < y->color ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

dt_status dt_pg_split(dt_pg *pg, int color, int key, dt_pg **out)
{
    if (!pg || !out)
        return dt_error(DT_ERR_NULL, "dt_pg_split: NULL argument");
    *out = NULL;
    if (color < 0)
        color = DT_PG_NO_COLOR;
    int W = pg->size;
    int32_t mine[2] = {color, key};
    int32_t *all = malloc((size_t)W * 2 * sizeof *all);
    split_ent *e = malloc((size_t)W * sizeof *e);
    int *list = malloc((size_t)W * sizeof *list);
    dt_status st = DT_OK;
    if (!all || !e || !list) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_pg_split: out of memory");
        goto out_free;
    }
    st = dt_pg_allgather(pg, mine, all, 2, DT_I32);
    if (st < 0)
        goto out_free;
    for (int r = 0; r < W; r++)
        e[r] = (split_ent){.color = all[2 * r], .key = all[2 * r + 1], .rank = r};
    qsort(e, (size_t)W, sizeof *e, split_cmp);
    for (int i = 0; i < W;) {
        int j = i;
        while (j < W && e[j].color == e[i].color)
            j++;
        if (e[i].color >= 0) {
            for (int k = i; k < j; k++)
                list[k - i] = e[k].rank;
            dt_pg *sub = NULL;
            st = dt_pg_subgroup(pg, list, j - i, &sub);
            if (st < 0) {
                dt_pg_free(*out);
                *out = NULL;
                goto out_free;
            }
            if (sub)
                *out = sub;
        }
        i = j;
    }
out_free:
    free(list);
    free(e);
    free(all);
    return st;
}

dt_status dt_pg_dup(dt_pg *pg, dt_pg **out)
{
    if (!pg || !out)
        return dt_error(DT_ERR_NULL, "dt_pg_dup: NULL argument");
    return dt_pg_split(pg, 0, pg->rank, out);
}

int dt_pg_rank(const dt_pg *pg) { return pg ? pg->rank : -1; }
int dt_pg_size(const dt_pg *pg) { return pg ? pg->size : 0; }
int dt_pg_local_rank(const dt_pg *pg) { return pg ? pg->local_rank : -1; }
int dt_pg_local_size(const dt_pg *pg) { return pg ? pg->local_size : 0; }
const char *dt_pg_backend(const dt_pg *pg) { return pg ? pg->backend : ""; }

dt_status dt_pg_status(const dt_pg *pg)
{
    if (!pg)
        return dt_error(DT_ERR_NULL, "dt_pg_status: NULL group");
    dt_pg *m = (dt_pg *)pg;
    pthread_mutex_lock(&m->mu);
    dt_status st = m->fail_st;
    if (st != DT_OK)
        dt_error(st, "%s", m->fail_msg);
    pthread_mutex_unlock(&m->mu);
    return st;
}

uint64_t dt_pg_seq(const dt_pg *pg)
{
    if (!pg)
        return 0;
    dt_pg *m = (dt_pg *)pg;
    pthread_mutex_lock(&m->mu);
    uint64_t s = m->seq;
    pthread_mutex_unlock(&m->mu);
    return s;
}

void *dt_pg_alloc(dt_pg *pg, size_t bytes)
{
    if (!pg) {
        dt_error(DT_ERR_NULL, "dt_pg_alloc: NULL group");
        return NULL;
    }
    if (!pg->ops->mem_alloc)
        return dt_alloc(bytes);
    pthread_mutex_lock(&pg->mem_mu);
    void *p = pg->ops->mem_alloc(pg->ctx, bytes);
    pthread_mutex_unlock(&pg->mem_mu);
    return p;
}

void dt_pg_dealloc(dt_pg *pg, void *p)
{
    if (!pg || !p)
        return;
    if (!pg->ops->mem_free) {
        dt_free(p);
        return;
    }
    pthread_mutex_lock(&pg->mem_mu);
    pg->ops->mem_free(pg->ctx, p);
    pthread_mutex_unlock(&pg->mem_mu);
}
