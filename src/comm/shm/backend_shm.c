/* The `shm` backend: ranks on one machine, one shared segment (shm.h).
 *
 * Files of this folder: backend_shm.c (the table, arrival, small messages),
 * shm_large.c (larger messages on exposures), shm_p2p.c (send/recv rings),
 * shm_segment.c (the segment and its heap), shm_sync.c (ticks, waits,
 * liveness), shm_select.c (the algorithm table), allreduce_<alg>.c (one
 * algorithm each; they use only shm_sync.c, chunk.h and the reductions).
 *
 * Every collective goes through the same three stages:
 *
 *  1. Arrival. The rank writes a descriptor (kind, dtype, op, root, count,
 *     a hash of its algorithm table and sizes, and where its buffers are if
 *     they came from dt_pg_alloc), copies a small message into its slot if
 *     the operation fits the slot, and signals step 1; then it waits for
 *     every rank's step 1. Comparing descriptors here is the mismatch check:
 *     all ranks see the same descriptors, so all of them fail together with
 *     DT_ERR_MISMATCH, describing both sides.
 *  2. Data. Small messages are computed straight from the peers' slots, no
 *     further synchronisation (slots and descriptors alternate by sequence
 *     parity; a rank cannot reach operation n+2 before every peer finished
 *     reading operation n, because it waited for their arrival at n+1).
 *     Larger ones use the algorithm the table chooses, on "exposures": a
 *     rank's buffer itself when it is in the segment (dt_pg_alloc, zero
 *     copy), otherwise its staging area, filled piece by piece.
 *  3. A final barrier, after which no rank touches another's memory.
 *
 * Progress: run() executes an operation to completion on the calling
 * thread (the group layer's executor), waiting with spin-then-futex.
 */
#include "comm/shm/shm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- init / free ---- */

static dt_status env_size(const char *name, long def, long min, long max, size_t mult, size_t *out)
{
    int64_t v;
    dt_status st = dt_env_int(name, def, min, max, &v);
    if (st < 0)
        return st;
    *out = (size_t)v * mult;
    return DT_OK;
}

static dt_status configure(shm_ctx *s, int world, int local_world)
{
    dt_status st;
    if ((st = env_size("DT_SHM_HEAP_MB", 1024, 1, 1 << 20, 1u << 20, &s->heap_bytes)) < 0 ||
        (st = env_size("DT_SHM_STAGING_KB", 8192, 8, 1 << 20, 1024, &s->stage_bytes)) < 0 ||
        (st = env_size("DT_SHM_SLOT_BYTES", 16384, 0, 1 << 24, 1, &s->slot_bytes)) < 0)
        return st;
    s->slot_bytes = (s->slot_bytes + 63) / 64 * 64;
    s->chan_bytes = 256u << 10;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t spin;
    if ((st = dt_env_int("DT_SHM_SPIN", local_world > ncpu ? 100 : 2000, 0, INT_MAX, &spin)) < 0)
        return st;
    s->spin = spin < 0 ? 0 : (int)spin;
    /* When every rank on this machine has its cores to itself, a rank that
     * waits keeps polling (20 ms by default) instead of sleeping: in a VM a
     * sleeping vCPU halts, and waking it can cost far more than the wait. */
    int64_t spin_us;
    long want = (long)local_world * dt_get_num_threads();
    if ((st = dt_env_int("DT_SHM_SPIN_US", want <= ncpu ? 20000 : 0, 0, 3600000000, &spin_us)) < 0)
        return st;
    s->spin_s = spin_us < 0 ? 0 : (double)spin_us * 1e-6;
    if ((st = dt__shm_table_init(&s->table, getenv("DT_SHM_ALGO"))) < 0)
        return st;
    uint64_t sizes[3] = {s->slot_bytes, s->stage_bytes, s->heap_bytes};
    s->config = dt_hash64(sizes, sizeof sizes, dt__shm_table_hash(&s->table));
    (void)world;
    return DT_OK;
}

static void init_heap(shm_ctx *s)
{
    shm_free_block *b = malloc(sizeof *b);
    if (b) {
        b->off = 0;
        b->size = s->heap_bytes;
        b->next = NULL;
    }
    s->free_list = b;
}

static shm_ctx *ctx_new(int rank, int size, double timeout, int check)
{
    shm_ctx *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->pidfd = malloc((size_t)size * sizeof *s->pidfd);
    if (!s->pidfd) {
        free(s);
        return NULL;
    }
    for (int r = 0; r < size; r++)
        s->pidfd[r] = -1;
    s->rank = rank;
    s->size = size;
    s->timeout_s = timeout;
    s->check = check;
    return s;
}

static void ctx_delete(shm_ctx *s)
{
    if (!s)
        return;
    for (int r = 0; r < s->size; r++)
        if (s->pidfd[r] >= 0)
            close(s->pidfd[r]);
    while (s->free_list) {
        shm_free_block *n = s->free_list->next;
        free(s->free_list);
        s->free_list = n;
    }
    while (s->allocs) {
        shm_alloc_rec *n = s->allocs->next;
        free(s->allocs);
        s->allocs = n;
    }
    free(s->root_of);
    free(s->pidfd);
    free(s);
}

/* Attach (creating when `create`), then finish the context. */
static dt_status finish_attach(shm_ctx *s)
{
    dt_status st = dt__shm_attach_wait(s, s->timeout_s);
    if (st < 0)
        return st;
    dt__shm_liveness_init(s);
    init_heap(s);
    return DT_OK;
}

static dt_status open_segment(shm_ctx *s, const char *name, int create)
{
    dt_status st = dt__shm_attach(s, name, create, s->timeout_s);
    if (st < 0)
        return st;
    return finish_attach(s);
}

/* ---- traffic: the family of groups one dt_pg_init made (shm.h) ---- */

/* Join s to fam (NULL: s is a root, start a family) with ranks mapped to
 * the root's by root_of (NULL: identity). */
static dt_status fam_join(shm_ctx *s, shm_family *fam, const int *root_of)
{
    s->root_of = malloc((size_t)s->size * sizeof *s->root_of);
    if (!s->root_of)
        return dt_error(DT_ERR_NO_MEMORY, "shm: out of memory");
    for (int r = 0; r < s->size; r++)
        s->root_of[r] = root_of ? root_of[r] : r;
    if (!fam) {
        fam = calloc(1, sizeof *fam);
        uint64_t *ret = fam ? calloc((size_t)s->size, sizeof *ret) : NULL;
        if (!ret) {
            free(fam);
            free(s->root_of);
            s->root_of = NULL;
            return dt_error(DT_ERR_NO_MEMORY, "shm: out of memory");
        }
        pthread_mutex_init(&fam->mu, NULL);
        fam->size = s->size;
        fam->retired = ret;
    }
    pthread_mutex_lock(&fam->mu);
    s->fam = fam;
    s->fam_next = fam->members;
    fam->members = s;
    fam->refs++;
    pthread_mutex_unlock(&fam->mu);
    return DT_OK;
}

/* Leave the family (before the segment goes): the group's counts move to
 * the family's retired sums; the last member frees the family. */
static void fam_leave(shm_ctx *s)
{
    shm_family *fam = s->fam;
    if (!fam)
        return;
    pthread_mutex_lock(&fam->mu);
    for (int r = 0; r < s->size; r++)
        fam->retired[s->root_of[r]] += shm_moved_read(s, r);
    for (shm_ctx **p = &fam->members; *p; p = &(*p)->fam_next)
        if (*p == s) {
            *p = s->fam_next;
            break;
        }
    int last = --fam->refs == 0;
    pthread_mutex_unlock(&fam->mu);
    if (last) {
        pthread_mutex_destroy(&fam->mu);
        free(fam->retired);
        free(fam);
    }
    s->fam = NULL;
}

/* The traffic slot: per peer of s, the bytes this process handed to it
 * over every group of the family. */
static dt_status shm_traffic(void *ctx, uint64_t *sent, int n)
{
    shm_ctx *s = ctx;
    shm_family *fam = s->fam;
    if (!fam)
        return DT_ERR_UNSUPPORTED;
    uint64_t *tot = malloc((size_t)fam->size * sizeof *tot);
    if (!tot)
        return dt_error(DT_ERR_NO_MEMORY, "shm: out of memory");
    pthread_mutex_lock(&fam->mu);
    memcpy(tot, fam->retired, (size_t)fam->size * sizeof *tot);
    for (shm_ctx *m = fam->members; m; m = m->fam_next)
        for (int r = 0; r < m->size; r++)
            tot[m->root_of[r]] += shm_moved_read(m, r);
    pthread_mutex_unlock(&fam->mu);
    for (int r = 0; r < n && r < s->size; r++)
        sent[r] = tot[s->root_of[r]];
    free(tot);
    return DT_OK;
}

static dt_status shm_init(const dt_backend_info *info, void **ctx)
{
    if (info->world_size > SHM_MAX_RANKS)
        return dt_error(DT_ERR_UNSUPPORTED, "shm: at most %d ranks (got %d)", SHM_MAX_RANKS,
                        info->world_size);
    if (info->local_world_size != info->world_size)
        return dt_error(DT_ERR_UNSUPPORTED,
                        "shm: every rank must be on this machine (local world size %d, world "
                        "size %d); use the mpi backend across machines",
                        info->local_world_size, info->world_size);
    if (info->options && info->options[0])
        return dt_error(DT_ERR_INVALID_ARG,
                        "shm: unknown backend option \"%s\" (shm is configured with DT_SHM_* "
                        "environment variables)",
                        info->options);
    /* the start-up runs under the start-up bound, the operations after it
     * under the group's timeout */
    shm_ctx *s = ctx_new(info->rank, info->world_size, info->init_timeout_s, info->check);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "shm: out of memory");
    s->interrupted = info->interrupted;
    s->interrupted_arg = info->interrupted_arg;
    dt_status st = configure(s, info->world_size, info->local_world_size);
    char name[64];
    if (st == DT_OK) {
        if (info->job_id[0]) {
            dt__shm_segment_name(info->job_id, name, sizeof name);
        } else if (info->master_port > 0) {
            st = dt__shm_rendezvous_name(info, name, sizeof name);
        } else {
            st = dt_error(DT_ERR_INVALID_ARG,
                          "shm: cannot name the shared segment: set DT_JOB_ID (dtrain run does) "
                          "or MASTER_ADDR/MASTER_PORT, or pass dt_pg_params.job_id");
        }
    }
    if (st == DT_OK)
        st = open_segment(s, name, info->rank == 0);
    if (st == DT_OK && (st = fam_join(s, NULL, NULL)) < 0)
        dt__shm_detach(s);
    if (st < 0) {
        ctx_delete(s);
        return st;
    }
    s->timeout_s = info->timeout_s;
    s->interrupted = NULL; /* the start-up's only */
    *ctx = s;
    return DT_OK;
}

static void shm_free(void *ctx)
{
    shm_ctx *s = ctx;
    if (!s)
        return;
    if (s->base)
        atomic_store(&shm_rank_at(s, s->rank)->state, SHM_STATE_LEFT);
    fam_leave(s);
    dt__shm_detach(s);
    ctx_delete(s);
}

static void shm_abort_cb(void *ctx, dt_status st, const char *msg)
{
    shm_ctx *s = ctx;
    if (s && s->base && atomic_load(&s->hdr->abort_st) == 0)
        dt__shm_abort(s, st, msg);
}

/* The flight recorder's status blocks live in the rank blocks of the
 * segment: a stopped or hung rank's is read as it left it. */
static void *shm_flight_board(void *ctx, size_t bytes)
{
    shm_ctx *s = ctx;
    if (!s || !s->base || bytes > sizeof shm_rank_at(s, 0)->flight)
        return NULL;
    return shm_rank_at(s, s->rank)->flight;
}

static dt_status shm_flight_gather(void *ctx, void *all, unsigned char *got, size_t bytes, double wait_s)
{
    (void)wait_s;
    shm_ctx *s = ctx;
    for (int r = 0; r < s->size; r++) {
        dt_flight_board_read((char *)all + (size_t)r * bytes, shm_rank_at(s, r)->flight, bytes);
        got[r] = 1;
    }
    return DT_OK;
}

/* ---- descriptors and the mismatch check ---- */

static size_t esz(const dt_coll *c) { return dt_dtype_size(c->dtype); }

static int has_op(dt_coll_kind k)
{
    return k == DT_COLL_ALLREDUCE || k == DT_COLL_REDUCE || k == DT_COLL_REDUCE_SCATTER;
}
static int has_root(dt_coll_kind k)
{
    return k == DT_COLL_REDUCE || k == DT_COLL_BROADCAST || k == DT_COLL_GATHER ||
           k == DT_COLL_SCATTER;
}

/* Bytes this operation puts in a slot for the rank that publishes the most. */
static size_t slot_need(shm_ctx *s, const dt_coll *c)
{
    size_t es = esz(c), W = (size_t)s->size;
    switch (c->kind) {
    case DT_COLL_ALLGATHERV: {
        size_t m = 0;
        for (int r = 0; r < s->size; r++)
            m = c->counts[r] > m ? c->counts[r] : m;
        return m * es;
    }
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_ALLTOALL:
    case DT_COLL_SCATTER:
        return W * c->count * es;
    default:
        return c->count * es;
    }
}

/* Input bytes this rank publishes in the slot, and from where. */
static void slot_input(shm_ctx *s, const dt_coll *c, const void **src, size_t *bytes)
{
    size_t es = esz(c);
    *src = c->send;
    *bytes = 0;
    switch (c->kind) {
    case DT_COLL_BARRIER: break;
    case DT_COLL_BROADCAST:
        if (s->rank == c->root)
            *bytes = c->count * es;
        break;
    case DT_COLL_SCATTER:
        if (s->rank == c->root)
            *bytes = (size_t)s->size * c->count * es;
        break;
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_ALLTOALL:
        *bytes = (size_t)s->size * c->count * es;
        break;
    default: *bytes = c->count * es; break;
    }
}

static uint64_t counts_hash(shm_ctx *s, const dt_coll *c)
{
    if (c->kind != DT_COLL_ALLGATHERV)
        return 0;
    uint64_t h = dt_hash64(c->counts, (size_t)s->size * sizeof(size_t), 1);
    return dt_hash64(c->displs, (size_t)s->size * sizeof(size_t), h);
}

static void fill_desc(shm_ctx *s, const dt_coll *c, shm_desc *d)
{
    size_t es = esz(c);
    d->seq = s->cur_seq;
    d->kind = (uint32_t)c->kind;
    d->dtype = (uint32_t)c->dtype;
    d->op = has_op(c->kind) ? (uint32_t)c->op : 0;
    d->root = has_root(c->kind) ? c->root : -1;
    d->count = c->count;
    if (c->kind == DT_COLL_ALLGATHERV) {
        uint64_t t = 0;
        for (int r = 0; r < s->size; r++)
            t += c->counts[r];
        d->count = t;
    }
    if (c->kind == DT_COLL_BARRIER)
        d->dtype = 0;
    d->aux = counts_hash(s, c);
    d->config = s->config;
    /* where the buffers are, for the zero-copy path */
    size_t W = (size_t)s->size, in_b = 0, out_b = 0;
    switch (c->kind) {
    case DT_COLL_ALLREDUCE: in_b = out_b = c->count * es; break;
    case DT_COLL_REDUCE: in_b = out_b = c->count * es; break;
    case DT_COLL_BROADCAST: in_b = out_b = c->count * es; break;
    case DT_COLL_ALLGATHER: in_b = c->count * es; out_b = W * c->count * es; break;
    case DT_COLL_ALLGATHERV: in_b = c->count * es; break;
    case DT_COLL_REDUCE_SCATTER: in_b = W * c->count * es; out_b = c->count * es; break;
    case DT_COLL_GATHER: in_b = c->count * es; break;
    case DT_COLL_SCATTER: in_b = W * c->count * es; break;
    case DT_COLL_ALLTOALL: in_b = out_b = W * c->count * es; break;
    default: break;
    }
    d->send_off = in_b && c->send ? dt__shm_heap_offset(s, c->send, in_b) : SHM_NONE;
    d->recv_off = out_b && c->recv ? dt__shm_heap_offset(s, c->recv, out_b) : SHM_NONE;
    /* a strided input is staged (peers read blocks as contiguous runs) */
    if (c->sblocks)
        d->send_off = SHM_NONE;
    if (c->rblocks)
        d->recv_off = SHM_NONE;
    /* an in-place all-to-all overwrites what peers read: stage it */
    if (c->kind == DT_COLL_ALLTOALL && c->in_place)
        d->send_off = SHM_NONE;
}

static void desc_as_coll(const shm_desc *d, dt_coll *c)
{
    memset(c, 0, sizeof *c);
    c->kind = (dt_coll_kind)d->kind;
    c->dtype = (dt_dtype)d->dtype;
    c->op = (dt_reduce_op)d->op;
    c->root = d->root;
    c->count = (size_t)d->count;
    c->seq = d->seq - 1; /* the group layer's numbering */
}

static int desc_same(const shm_desc *a, const shm_desc *b)
{
    return a->seq == b->seq && a->kind == b->kind && a->dtype == b->dtype && a->op == b->op &&
           a->root == b->root && a->count == b->count && a->aux == b->aux &&
           a->config == b->config;
}

/* On a mismatch every rank builds the same message: each distinct posted
 * operation with the ranks that posted it, in rank order. */
static dt_status check_descs(shm_ctx *s)
{
    const shm_desc *mine = shm_desc_at(s, s->rank, s->cur_seq);
    int r;
    for (r = 0; r < s->size; r++)
        if (!desc_same(shm_desc_at(s, r, s->cur_seq), mine))
            break;
    if (r == s->size)
        return DT_OK;
    char msg[768];
    size_t o = (size_t)snprintf(msg, sizeof msg, "collective mismatch at sequence number %llu: ",
                                (unsigned long long)s->cur_seq - 1);
    int done[SHM_MAX_RANKS] = {0}, groups = 0, cfg = 0, aux = 0;
    for (int a = 0; a < s->size && o < sizeof msg - 1; a++) {
        if (done[a])
            continue;
        const shm_desc *da = shm_desc_at(s, a, s->cur_seq);
        char who[160], what[160];
        size_t w = 0;
        int n = 0;
        for (int b = a; b < s->size; b++) {
            const shm_desc *db = shm_desc_at(s, b, s->cur_seq);
            if (!desc_same(da, db))
                continue;
            done[b] = 1;
            if (w < sizeof who - 8)
                w += (size_t)snprintf(who + w, sizeof who - w, "%s%d", n ? "," : "", b);
            n++;
        }
        for (int b = 0; b < s->size; b++) {
            const shm_desc *db = shm_desc_at(s, b, s->cur_seq);
            cfg |= db->config != da->config;
            aux |= db->aux != da->aux;
        }
        dt_coll ca;
        desc_as_coll(da, &ca);
        dt__coll_describe(&ca, what, sizeof what);
        o += (size_t)snprintf(msg + o, sizeof msg - o, "%s%s %s posted %s", groups ? "; " : "",
                              n > 1 ? "ranks" : "rank", who, what);
        groups++;
    }
    if (o < sizeof msg - 1 && (cfg || aux))
        snprintf(msg + o, sizeof msg - o, "%s",
                 cfg ? " (the ranks' DT_SHM_ALGO / DT_SHM_* settings differ)"
                     : " (allgatherv counts or displacements differ)");
    return dt__shm_abort(s, DT_ERR_MISMATCH, msg);
}

/* ---- the small-message path: everything from the slots ---- */

/* Traffic of the small-message path: the bytes this rank reads from each
 * peer's slot (run_small's reads, one case each). */
static void slot_reads(shm_ctx *s, const dt_coll *c)
{
    int W = s->size, me = s->rank;
    size_t blk = c->count * esz(c);
    for (int j = 0; j < W; j++) {
        size_t b = 0;
        switch (c->kind) {
        case DT_COLL_REDUCE:
        case DT_COLL_GATHER: b = me == c->root ? blk : 0; break;
        case DT_COLL_BROADCAST:
        case DT_COLL_SCATTER: b = j == c->root ? blk : 0; break;
        case DT_COLL_ALLGATHERV: b = c->counts[j] * esz(c); break;
        case DT_COLL_ALLREDUCE:
        case DT_COLL_REDUCE_SCATTER:
        case DT_COLL_ALLGATHER:
        case DT_COLL_ALLTOALL: b = blk; break;
        default: break;
        }
        shm_moved(s, j, me, b);
    }
}

static void run_small(shm_ctx *s, const dt_coll *c)
{
    int W = s->size, me = s->rank;
    size_t es = esz(c), n = c->count, blk = n * es;
    const void *srcs[SHM_MAX_RANKS];
    slot_reads(s, c);
    switch (c->kind) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE:
        if (c->kind == DT_COLL_REDUCE && me != c->root)
            break;
        for (int j = 0; j < W; j++)
            srcs[j] = shm_slot_at(s, j, s->cur_seq);
        dt__reduce(c->dtype, c->op, c->recv, srcs, W, n, W);
        break;
    case DT_COLL_REDUCE_SCATTER:
        for (int j = 0; j < W; j++)
            srcs[j] = shm_slot_at(s, j, s->cur_seq) + (size_t)me * blk;
        dt__reduce(c->dtype, c->op, c->recv, srcs, W, n, W);
        break;
    case DT_COLL_BROADCAST:
        if (me != c->root)
            memcpy(c->recv, shm_slot_at(s, c->root, s->cur_seq), blk);
        break;
    case DT_COLL_ALLGATHER:
        for (int j = 0; j < W; j++)
            memcpy((char *)c->recv + (size_t)j * blk, shm_slot_at(s, j, s->cur_seq), blk);
        break;
    case DT_COLL_ALLGATHERV:
        if (c->rblocks) { /* into a layout, in lockstep */
            for (int j = 0; j < W; j++)
                srcs[j] = shm_slot_at(s, j, s->cur_seq);
            dt__blk_scatter(c->recv, c->rblocks, srcs, 0, c->counts, W, es);
            break;
        }
        for (int j = 0; j < W; j++)
            memcpy((char *)c->recv + c->displs[j] * es, shm_slot_at(s, j, s->cur_seq),
                   c->counts[j] * es);
        break;
    case DT_COLL_GATHER:
        if (me == c->root)
            for (int j = 0; j < W; j++)
                memcpy((char *)c->recv + (size_t)j * blk, shm_slot_at(s, j, s->cur_seq), blk);
        break;
    case DT_COLL_SCATTER:
        memcpy(c->recv, shm_slot_at(s, c->root, s->cur_seq) + (size_t)me * blk, blk);
        break;
    case DT_COLL_ALLTOALL:
        if (c->rblocks) { /* into a layout, in lockstep */
            size_t ms[SHM_MAX_RANKS];
            for (int j = 0; j < W; j++) {
                srcs[j] = shm_slot_at(s, j, s->cur_seq) + (size_t)me * blk;
                ms[j] = n;
            }
            dt__blk_scatter(c->recv, c->rblocks, srcs, 0, ms, W, es);
            break;
        }
        for (int j = 0; j < W; j++)
            memcpy((char *)c->recv + (size_t)j * blk, shm_slot_at(s, j, s->cur_seq) + (size_t)me * blk,
                   blk);
        break;
    default: break;
    }
}

/* A group of one: copies (the group layer normalised in-place forms). */
static dt_status run_single(const dt_coll *c)
{
    size_t es = esz(c);
    if (c->in_place || !c->count || c->kind == DT_COLL_BARRIER || c->kind == DT_COLL_BROADCAST)
        return DT_OK;
    if (c->sblocks || c->rblocks) /* layouts: allgatherv (rblocks) or alltoall */
        dt__blk_copy(c->recv, c->rblocks, 0, c->send, c->sblocks, 0, c->count, es);
    else if (c->kind == DT_COLL_ALLGATHERV)
        memmove((char *)c->recv + c->displs[0] * es, c->send, c->count * es);
    else
        memmove(c->recv, c->send, c->count * es);
    return DT_OK;
}

static dt_status shm_run(void *ctx, const dt_coll *c)
{
    shm_ctx *s = ctx;
    dt_status st = dt__shm_check_abort(s);
    if (st < 0)
        return st;
    s->cur = c;
    double now = dt_time_s();
    s->deadline = now + c->timeout_s;
    s->next_live_check = now + 0.1;
    if (c->kind == DT_COLL_SEND || c->kind == DT_COLL_RECV) {
        st = dt__shm_p2p(s, c);
        s->cur = NULL;
        return st;
    }
    s->cur_seq = s->seq++;
    /* seq 0 is never used as a tick so that fresh ticks (0) mean "nothing" */
    s->cur_seq += 1;
    if (s->size == 1) {
        s->cur = NULL;
        return run_single(c);
    }

    int small = s->slot_bytes > 0 && slot_need(s, c) <= s->slot_bytes;
    if (small) {
        const void *src;
        size_t bytes;
        slot_input(s, c, &src, &bytes);
        if (bytes && c->sblocks) { /* from a layout: its blocks in order, in lockstep */
            void *dsts[SHM_MAX_RANKS];
            size_t ms[SHM_MAX_RANKS];
            for (int j = 0; j < s->size; j++) {
                dsts[j] = shm_slot_at(s, s->rank, s->cur_seq) + (size_t)j * c->count * esz(c);
                ms[j] = c->count;
            }
            dt__blk_gather(dsts, c->send, c->sblocks, 0, ms, s->size, esz(c));
        } else if (bytes)
            memcpy(shm_slot_at(s, s->rank, s->cur_seq), src, bytes);
    }
    fill_desc(s, c, shm_desc_at(s, s->rank, s->cur_seq));
    dt__shm_signal(s, 1);
    st = dt__shm_wait_all(s, 1);
    if (st == DT_OK && s->check)
        st = check_descs(s);
    if (st == DT_OK) {
        if (small)
            run_small(s, c);
        else if (c->kind != DT_COLL_BARRIER)
            st = dt__shm_run_large(s, c);
    }
    s->cur = NULL;
    return st;
}

/* ---- subgroups: a new segment, its name broadcast over the parent ---- */

static dt_status shm_subgroup(void *ctx, const int *ranks, int n, int new_rank, void **child)
{
    shm_ctx *s = ctx;
    char name[64];
    memset(name, 0, sizeof name);
    *child = NULL;
    shm_ctx *k = NULL;
    dt_status st = DT_OK;
    if (new_rank >= 0) {
        k = ctx_new(new_rank, n, s->timeout_s, s->check);
        if (!k)
            return dt_error(DT_ERR_NO_MEMORY, "shm: out of memory");
        k->heap_bytes = s->heap_bytes;
        k->stage_bytes = s->stage_bytes;
        k->slot_bytes = s->slot_bytes;
        k->chan_bytes = s->chan_bytes;
        k->spin = s->spin;
        k->spin_s = s->spin_s;
        k->table = s->table;
        k->config = s->config;
    }
    if (new_rank == 0) {
        uint64_t salt[2] = {(uint64_t)getpid(), (uint64_t)dt_time_ns()};
        char job[96];
        snprintf(job, sizeof job, "%s/sub/%llx%llx", s->name, (unsigned long long)salt[0],
                 (unsigned long long)salt[1]);
        dt__shm_segment_name(job, name, sizeof name);
        st = dt__shm_attach(k, name, 1, s->timeout_s);
    }
    /* Broadcast the name (and any creation error) from the first member. */
    dt_coll bc = {.kind = DT_COLL_BROADCAST, .send = name, .recv = name, .count = sizeof name,
                  .dtype = DT_U8, .root = ranks[0], .in_place = 1, .timeout_s = s->timeout_s};
    if (st < 0)
        snprintf(name, sizeof name, "!");
    dt_status bst = shm_run(s, &bc);
    if (bst < 0) {
        if (k && k->base) {
            if (new_rank == 0)
                shm_unlink(k->name);
            dt__shm_detach(k);
        }
        ctx_delete(k);
        return bst;
    }
    if (st < 0 || name[0] == '!') {
        if (k && k->base) {
            shm_unlink(k->name);
            dt__shm_detach(k);
        }
        ctx_delete(k);
        return st < 0 ? st : dt_error(DT_ERR_IO, "shm: the subgroup's first rank could not create its segment");
    }
    if (new_rank < 0)
        return DT_OK;
    st = new_rank == 0 ? finish_attach(k) : open_segment(k, name, 0);
    if (st == DT_OK) {
        int *root_of = malloc((size_t)n * sizeof *root_of);
        if (!root_of) {
            st = dt_error(DT_ERR_NO_MEMORY, "shm: out of memory");
        } else {
            for (int i = 0; i < n; i++)
                root_of[i] = s->root_of[ranks[i]];
            st = fam_join(k, s->fam, root_of);
            free(root_of);
        }
        if (st < 0)
            dt__shm_detach(k);
    }
    if (st < 0) {
        ctx_delete(k);
        return st;
    }
    *child = k;
    return DT_OK;
}

const dt_backend_ops dt__backend_shm = {
    .version = DT_BACKEND_VERSION,
    .name = "shm",
    .init = shm_init,
    .free = shm_free,
    .run = shm_run,
    .kinds = DT_BACKEND_ALL_KINDS | DT_BACKEND_LAYOUTS,
    .mem_alloc = dt__shm_mem_alloc,
    .mem_free = dt__shm_mem_free,
    .subgroup = shm_subgroup,
    .abort = shm_abort_cb,
    .p2p_start = dt__shm_p2p_start,
    .p2p_test = dt__shm_p2p_test,
    .p2p_idle = dt__shm_p2p_idle,
    .p2p_wake = dt__shm_p2p_wake,
    .flight_board = shm_flight_board,
    .flight_gather = shm_flight_gather,
    .job_cleanup = dt__shm_job_cleanup,
    .orphan_cleanup = dt__shm_orphan_cleanup,
    .traffic = shm_traffic,
};
