/* The oneDNN engine, stream and primitive cache shared by matmul and conv.
 *
 * oneDNN primitives are expensive to create (JIT code generation, tens to
 * hundreds of microseconds) and cheap to run again, so every primitive is
 * created once per (op, shape, flags, dtype) key and kept for the life of
 * the process. The cache is a small hash table under one mutex; a training
 * loop touches a few dozen keys, so lookups are a few compares (products
 * whose row counts change every step, a mixture-of-experts block's, are
 * marked varying and share one key per kind: matmul.c). Counters
 * (dt_k_stats) let tests prove the steady state creates nothing. */
#include "kernels_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static dnnl_status_t g_init_status = dnnl_success;

static void dnnl_init_once(void)
{
    g_init_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0);
    if (g_init_status == dnnl_success)
        g_init_status = dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags);
}

dnnl_engine_t dt__dnnl_engine(void)
{
    pthread_once(&g_once, dnnl_init_once);
    if (g_init_status != dnnl_success) {
        dt__dnnl_err(g_init_status, "oneDNN CPU engine");
        return NULL;
    }
    return g_engine;
}

dnnl_stream_t dt__dnnl_stream(void)
{
    return dt__dnnl_engine() ? g_stream : NULL;
}

void dt__dnnl_set_threads(void)
{
#ifdef _OPENMP
    int nt = dt_get_num_threads();
    if (omp_get_max_threads() != nt)
        omp_set_num_threads(nt);
#endif
}

int dt__threads_for(int64_t work)
{
    if (work < 32768)
        return 1;
    return dt_get_num_threads();
}

dt_status dt__dnnl_err(dnnl_status_t s, const char *what)
{
    const char *why = "unknown oneDNN error";
    dt_status st = DT_ERR_INTERNAL;
    switch (s) {
    case dnnl_success: return DT_OK;
    case dnnl_out_of_memory: why = "out of memory"; st = DT_ERR_NO_MEMORY; break;
    case dnnl_invalid_arguments: why = "invalid arguments"; st = DT_ERR_INVALID_ARG; break;
    case dnnl_unimplemented: why = "not implemented by oneDNN for this CPU"; st = DT_ERR_UNSUPPORTED; break;
    case dnnl_iterator_ends: why = "iterator ends"; break;
    case dnnl_runtime_error: why = "runtime error"; break;
    case dnnl_not_required: why = "not required"; break;
    }
    return dt_error(st, "%s: oneDNN: %s (status %d)", what, why, (int)s);
}

/* ---- cache -------------------------------------------------------------------- */
typedef struct entry {
    dt__key key;
    void *payload;
    dt__payload_free destroy;
    struct entry *next;
} entry;

#define NBUCKET 256
static entry *g_buckets[NBUCKET];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_ullong g_created, g_hits, g_entries, g_reorders;

static unsigned key_hash(const dt__key *k)
{
    return (unsigned)(dt_hash64(k->v, sizeof k->v, 0) % NBUCKET);
}

/* oneDNN sizes a primitive's scratchpad and work split for the thread
 * count at creation, so the count is part of every key (the last slot). */
static dt__key with_threads(const dt__key *key)
{
    dt__key k = *key;
    k.v[DT__KEY_LEN - 1] = dt_get_num_threads();
    return k;
}

void *dt__cache_get(const dt__key *key0)
{
    dt__key kk = with_threads(key0);
    const dt__key *key = &kk;
    unsigned h = key_hash(key);
    void *p = NULL;
    pthread_mutex_lock(&g_lock);
    for (entry *e = g_buckets[h]; e; e = e->next)
        if (!memcmp(e->key.v, key->v, sizeof key->v)) {
            p = e->payload;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    if (p)
        atomic_fetch_add(&g_hits, 1);
    return p;
}

void *dt__cache_put(const dt__key *key0, void *payload, dt__payload_free destroy)
{
    dt__key kk = with_threads(key0);
    const dt__key *key = &kk;
    unsigned h = key_hash(key);
    entry *n = malloc(sizeof *n);
    if (!n) {
        destroy(payload);
        dt_error(DT_ERR_NO_MEMORY, "kernel cache: out of memory");
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    for (entry *e = g_buckets[h]; e; e = e->next)
        if (!memcmp(e->key.v, key->v, sizeof key->v)) {
            void *p = e->payload;
            pthread_mutex_unlock(&g_lock);
            free(n);
            destroy(payload);
            return p;
        }
    n->key = *key;
    n->payload = payload;
    n->destroy = destroy;
    n->next = g_buckets[h];
    g_buckets[h] = n;
    atomic_fetch_add(&g_entries, 1);
    pthread_mutex_unlock(&g_lock);
    return payload;
}

void dt_k_cache_clear(void)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < NBUCKET; i++) {
        entry *e = g_buckets[i];
        while (e) {
            entry *nx = e->next;
            e->destroy(e->payload);
            free(e);
            e = nx;
        }
        g_buckets[i] = NULL;
    }
    atomic_store(&g_entries, 0);
    pthread_mutex_unlock(&g_lock);
}

void dt__stats_primitive_created(void) { atomic_fetch_add(&g_created, 1); }
void dt__stats_reorder(void) { atomic_fetch_add(&g_reorders, 1); }

void dt_k_stats_get(dt_k_stats *out)
{
    if (!out)
        return;
    out->primitives_created = atomic_load(&g_created);
    out->cache_hits = atomic_load(&g_hits);
    out->cache_entries = atomic_load(&g_entries);
    out->reorders = atomic_load(&g_reorders);
}

void dt_k_stats_reset(void)
{
    atomic_store(&g_created, 0);
    atomic_store(&g_hits, 0);
    atomic_store(&g_reorders, 0);
}

/* ---- primitive helpers ----------------------------------------------------------- */
/* One primitive created at a time, process-wide. oneDNN's own primitive
 * cache (looked up and filled here) hands a primitive being created to the
 * other threads asking for the same key through a promise whose wait is a
 * futex in uninstrumented code, and re-points the cached key at the new
 * primitive's descriptor: ThreadSanitizer then sees one thread compare keys
 * in memory another thread just allocated, with no order between them
 * (test_matmul's concurrent case, about one run in ten). Creation is rare
 * (dtrain caches every primitive it makes, per shape) and costs
 * milliseconds, so a lock of ours around it costs nothing on a step and
 * leaves no cache access unordered. Execution takes no lock. */
static pthread_mutex_t g_create_lock = PTHREAD_MUTEX_INITIALIZER;

dt_status dt__prim_create(dnnl_primitive_t *prim, const_dnnl_primitive_desc_t pd, const char *what)
{
    pthread_mutex_lock(&g_create_lock);
    dnnl_status_t s = dnnl_primitive_create(prim, pd);
    pthread_mutex_unlock(&g_create_lock);
    if (s != dnnl_success)
        return dt__dnnl_err(s, what);
    dt__stats_primitive_created();
    return DT_OK;
}

dt_status dt__prim_exec(dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t *args, const char *what)
{
    dnnl_stream_t stream = dt__dnnl_stream();
    if (!stream)
        return dt_last_status();
    dt__dnnl_set_threads();
    dnnl_status_t s = dnnl_primitive_execute(prim, stream, nargs, args);
    if (s == dnnl_success)
        s = dnnl_stream_wait(stream);
    return s == dnnl_success ? DT_OK : dt__dnnl_err(s, what);
}

dt_status dt__mem(dnnl_memory_t *m, const dnnl_memory_desc_t *md, void *ptr, const char *what)
{
    dnnl_engine_t eng = dt__dnnl_engine();
    if (!eng)
        return dt_last_status();
    dnnl_status_t s = dnnl_memory_create(m, md, eng, ptr ? ptr : DNNL_MEMORY_NONE);
    return s == dnnl_success ? DT_OK : dt__dnnl_err(s, what);
}

const char *dt_k_onednn_isa(void)
{
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_all: return "all";
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    default: return "other";
    }
}
