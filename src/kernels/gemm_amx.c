/* dtrain's AMX bf16 GEMM: the driver over a tile implementation.
 *
 * Blocking. The output is cut into blocks of 32 x 32, each computed by one
 * micro-kernel call as 2 x 2 tiles of 16 x 16 f32 (tmm0..3) over the whole
 * K, so each output's sum lives in one tile register from the first K step
 * to the last. A K step is 32 bf16 values: two A tiles (16 rows x 32) and
 * two B tiles (16 pair rows x 16 columns). Threads (OpenMP, the kernels'
 * static schedule) take contiguous runs of blocks in row-major block order,
 * so a thread reuses its A panel across consecutive column blocks.
 *
 * Packing. op(A) and op(B) are copied once per call into panels laid out as
 * the tiles load them: A panel mb holds rows 32 mb.. for every K step, tile
 * by tile, 64 bytes a row; B panel nb holds columns 32 nb.. in the VNNI
 * pair layout (row r of a B tile = B[2r][n], B[2r+1][n] for n in the tile).
 * Transposes cost nothing extra: op(X)'s element (i, k) is read through a
 * row and a column stride, so A^T B (weight gradients) and A B^T (inputs'
 * gradients, linear layers) pack from the same code. B may come pre-packed
 * (dt__amx_pack_b, or the packed-weight cache below) and be reused across
 * calls.
 *
 * Edges. K is padded with zeros to a whole K step in both panels: a padded
 * product is 0 x 0 and adding +0 changes no sum, so the result is exact.
 * M and N tails use smaller tiles: the configuration of an edge block gives
 * the C and A tiles only the rows that exist (mr <= 16) and the C and B tiles
 * only the columns that exist (colsb = 4 nc), and leaves out tile row or
 * column 1 when the block has 16 or fewer rows or columns. A thread reloads
 * its configuration only when the block shape changes (ldtilecfg also zeroes
 * the tiles, so it is never done inside a block).
 *
 * Tile state. A thread configures its tiles at its first block of a call and
 * releases them (tilerelease) before it leaves the call's parallel region:
 * OpenMP's threads go on to run other kernels, and a released thread carries
 * no tile state into them (nor into a context switch's save area). The
 * permission to use the tiles (arch_prctl) is asked once per process, in
 * amx_hw.c.
 *
 * Epilogue. Each 32 x 32 block is stored from the tiles into a stack buffer
 * and written to C as alpha acc (+ beta C) (+ bias) (then GELU), so beta = 1
 * accumulates gradients and the bias (and GELU) of a linear layer cost no
 * extra pass over C. */
#include "kernels/gemm_amx.h"
#include "kernels/kernels_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KSTEP DT__AMX_KSTEP
#define TILE DT__AMX_TILE_ELEMS
#define BLK 32

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- packing -------------------------------------------------------------------- */

/* op(A) (M x K, element (m, k) at A[m rs + k cs]) into panels of 32 rows. */
static void pack_a(const uint16_t *A, int64_t rs, int64_t cs, int64_t M, int64_t K, int64_t kb, uint16_t *out)
{
    int64_t nmb = cdiv(M, BLK);
    int nt = dt__threads_for(M * kb * KSTEP);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t mb = 0; mb < nmb; mb++)
        for (int64_t ks = 0; ks < kb; ks++)
            for (int i = 0; i < 2; i++) {
                uint16_t *t = out + (mb * kb + ks) * 2 * TILE + i * TILE;
                for (int r = 0; r < 16; r++) {
                    int64_t m = mb * BLK + i * 16 + r;
                    for (int kk = 0; kk < KSTEP; kk++) {
                        int64_t k = ks * KSTEP + kk;
                        t[r * KSTEP + kk] = m < M && k < K ? A[m * rs + k * cs] : 0;
                    }
                }
            }
}

/* op(B) (K x N, element (k, n) at B[k rs + n cs]) into pair-layout panels of 32 columns. */
static void pack_b(const uint16_t *B, int64_t rs, int64_t cs, int64_t K, int64_t N, int64_t kb, uint16_t *out)
{
    int64_t nnb = cdiv(N, BLK);
    int nt = dt__threads_for(N * kb * KSTEP);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t nb = 0; nb < nnb; nb++)
        for (int64_t ks = 0; ks < kb; ks++)
            for (int j = 0; j < 2; j++) {
                uint16_t *t = out + (nb * kb + ks) * 2 * TILE + j * TILE;
                for (int r = 0; r < 16; r++) {
                    int64_t k0 = ks * KSTEP + 2 * r;
                    for (int c = 0; c < 16; c++) {
                        int64_t n = nb * BLK + j * 16 + c;
                        bool in = n < N;
                        t[r * KSTEP + 2 * c] = in && k0 < K ? B[k0 * rs + n * cs] : 0;
                        t[r * KSTEP + 2 * c + 1] = in && k0 + 1 < K ? B[(k0 + 1) * rs + n * cs] : 0;
                    }
                }
            }
}

dt_status dt__amx_pack_b(dt__amx_packed_b *pb, bool tb, int64_t K, int64_t N, const uint16_t *B, int64_t ldb)
{
    const char *fn = "dt__amx_pack_b";
    if (!pb)
        return dt_error(DT_ERR_NULL, "%s: pb is NULL", fn);
    DT__CHECK_N(fn, K);
    DT__CHECK_N(fn, N);
    DT__CHECK_PTR(fn, B, K * N);
    int64_t kb = cdiv(K, KSTEP), nb = cdiv(N, BLK);
    size_t need = (size_t)(kb * nb) * 2 * TILE;
    if (need > pb->cap) {
        uint16_t *d = dt_alloc(need * sizeof(uint16_t));
        if (!d)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for a packed B of %lld x %lld", fn,
                            (long long)K, (long long)N);
        dt_free(pb->data);
        pb->data = d;
        pb->cap = need;
    }
    pb->K = K;
    pb->N = N;
    pb->kb = kb;
    pb->nb = nb;
    if (need)
        pack_b(B, tb ? 1 : ldb, tb ? ldb : 1, K, N, kb, pb->data);
    return DT_OK;
}

void dt__amx_packed_b_free(dt__amx_packed_b *pb)
{
    if (!pb)
        return;
    dt_free(pb->data);
    memset(pb, 0, sizeof *pb);
}

/* ---- per-thread scratch for the packed panels of a call -------------------------- */

typedef struct {
    uint16_t *p;
    size_t n;
} scratch;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static int g_scratch_ok;

static void scratch_free(void *v)
{
    scratch *s = v;
    dt_free(s->p);
    free(s);
}

static void scratch_init(void) { g_scratch_ok = pthread_key_create(&g_scratch_key, scratch_free) == 0; }

/* n values kept for the calling thread (grown, never shrunk), so a training
 * loop's steady state allocates and faults nothing. */
static uint16_t *scratch_get(size_t n)
{
    pthread_once(&g_scratch_once, scratch_init);
    if (!g_scratch_ok)
        return NULL;
    scratch *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(g_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->n) {
        uint16_t *p = dt_alloc(n * sizeof(uint16_t));
        if (!p)
            return NULL;
        dt_free(s->p);
        s->p = p;
        s->n = n;
    }
    return s->p;
}

/* ---- the tile state of each thread ------------------------------------------------ */

typedef struct {
    const dt__amx_tiles *tiles; /* NULL: released */
    dt__amx_cfg cfg;
} thread_tiles;

static _Thread_local thread_tiles g_tt;

static void tiles_use(const dt__amx_tiles *tiles, const dt__amx_cfg *cfg)
{
    if (g_tt.tiles == tiles && !memcmp(&g_tt.cfg, cfg, sizeof *cfg))
        return;
    if (g_tt.tiles && g_tt.tiles != tiles)
        g_tt.tiles->release();
    tiles->load_config(cfg);
    g_tt.tiles = tiles;
    g_tt.cfg = *cfg;
}

static void tiles_release(void)
{
    if (g_tt.tiles) {
        g_tt.tiles->release();
        g_tt.tiles = NULL;
    }
}

bool dt__amx_thread_configured(void) { return g_tt.tiles != NULL; }

/* The configuration of a block with mr0/mr1 rows in tile rows 0/1 and
 * nc0/nc1 columns in tile columns 0/1 (mr1 or nc1 may be 0). */
static void block_cfg(dt__amx_cfg *c, int mr0, int mr1, int nc0, int nc1)
{
    memset(c, 0, sizeof *c);
    c->palette = 1;
    int mr[2] = {mr0, mr1}, nc[2] = {nc0, nc1};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (mr[i] && nc[j]) { /* C tile (i, j) */
                c->rows[i * 2 + j] = (uint8_t)mr[i];
                c->colsb[i * 2 + j] = (uint16_t)(4 * nc[j]);
            }
    for (int i = 0; i < 2; i++)
        if (mr[i]) { /* A tiles: 16 rows of 32 values at most */
            c->rows[4 + i] = (uint8_t)mr[i];
            c->colsb[4 + i] = 64;
        }
    for (int j = 0; j < 2; j++)
        if (nc[j]) { /* B tiles: 16 pair rows, nc pairs */
            c->rows[6 + j] = 16;
            c->colsb[6 + j] = (uint16_t)(4 * nc[j]);
        }
}

/* ---- epilogue ---------------------------------------------------------------------- */

static float gelu_tanh(float x)
{
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* Block acc (4 tiles of 16 x 16) into C at (m0, n0). */
static void epilogue(const dt__amx_gemm_args *g, const float *acc, int64_t m0, int64_t n0, const int mr[2],
                     const int nc[2])
{
    for (int i = 0; i < 2; i++)
        for (int r = 0; r < mr[i]; r++) {
            int64_t m = m0 + i * 16 + r;
            float *crow = g->C + m * g->ldc;
            for (int j = 0; j < 2; j++) {
                const float *t = acc + (i * 2 + j) * 256 + r * 16;
                for (int c = 0; c < nc[j]; c++) {
                    int64_t n = n0 + j * 16 + c;
                    float v = g->alpha * t[c];
                    if (g->beta != 0.0f)
                        v += g->beta * crow[n];
                    if (g->bias)
                        v += g->bias[n];
                    if (g->act == DT__AMX_ACT_GELU_TANH)
                        v = gelu_tanh(v);
                    crow[n] = v;
                }
            }
        }
}

/* ---- the driver ---------------------------------------------------------------------- */

static int clamp16(int64_t v) { return v <= 0 ? 0 : v >= 16 ? 16 : (int)v; }

static void run_blocks(const dt__amx_tiles *tiles, const dt__amx_gemm_args *g, const uint16_t *pa,
                       const uint16_t *pb, int64_t kb)
{
    int64_t nmb = cdiv(g->M, BLK), nnb = cdiv(g->N, BLK), nblk = nmb * nnb;
    int nt = dt__threads_for(g->M * g->N * (g->K / 16 + 1));
    if (nt > nblk)
        nt = (int)nblk;
#pragma omp parallel num_threads(nt)
    {
        _Alignas(64) float acc[4 * 256];
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nblk; b++) {
            int64_t mb = b / nnb, nb = b % nnb, m0 = mb * BLK, n0 = nb * BLK;
            int mr[2] = {clamp16(g->M - m0), clamp16(g->M - m0 - 16)};
            int nc[2] = {clamp16(g->N - n0), clamp16(g->N - n0 - 16)};
            dt__amx_cfg cfg;
            block_cfg(&cfg, mr[0], mr[1], nc[0], nc[1]);
            tiles_use(tiles, &cfg);
            tiles->block(pa + mb * kb * 2 * TILE, pb + nb * kb * 2 * TILE, kb, mr[1] > 0, nc[1] > 0, acc);
            epilogue(g, acc, m0, n0, mr, nc);
        }
        tiles_release();
    }
}

static dt_status check_args(const char *fn, const dt__amx_gemm_args *g)
{
    DT__CHECK_N(fn, g->M);
    DT__CHECK_N(fn, g->N);
    DT__CHECK_N(fn, g->K);
    DT__CHECK_PTR(fn, g->A, g->M * g->K);
    DT__CHECK_PTR(fn, g->C, g->M * g->N);
    if (!g->pb)
        DT__CHECK_PTR(fn, g->B, g->K * g->N);
    else if (g->pb->K != g->K || g->pb->N != g->N)
        return dt_error(DT_ERR_INVALID_ARG, "%s: packed B is %lld x %lld, the product needs %lld x %lld", fn,
                        (long long)g->pb->K, (long long)g->pb->N, (long long)g->K, (long long)g->N);
    int64_t amin = g->ta ? g->M : g->K, bmin = g->tb ? g->K : g->N;
    if (g->lda < amin || (!g->pb && g->ldb < bmin) || g->ldc < g->N)
        return dt_error(DT_ERR_INVALID_ARG, "%s: leading dimensions lda %lld, ldb %lld, ldc %lld below the rows'"
                        " lengths %lld, %lld, %lld", fn, (long long)g->lda, (long long)g->ldb, (long long)g->ldc,
                        (long long)amin, (long long)bmin, (long long)g->N);
    return DT_OK;
}

dt_status dt__amx_gemm(const dt__amx_tiles *tiles, const dt__amx_gemm_args *g)
{
    const char *fn = "dt__amx_gemm";
    if (!tiles || !g)
        return dt_error(DT_ERR_NULL, "%s: tiles or args is NULL", fn);
    dt_status st = check_args(fn, g);
    if (st < 0 || g->M == 0 || g->N == 0)
        return st;
    int64_t kb = cdiv(g->K, KSTEP);
    size_t na = (size_t)(cdiv(g->M, BLK) * kb) * 2 * TILE;
    size_t nb = g->pb ? 0 : (size_t)(cdiv(g->N, BLK) * kb) * 2 * TILE;
    uint16_t *buf = scratch_get(na + nb + 1);
    if (!buf)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the packed panels (%lld x %lld x %lld)", fn,
                        (long long)g->M, (long long)g->N, (long long)g->K);
    if (kb)
        pack_a(g->A, g->ta ? 1 : g->lda, g->ta ? g->lda : 1, g->M, g->K, kb, buf);
    const uint16_t *pb = g->pb ? g->pb->data : buf + na;
    if (!g->pb && kb)
        pack_b(g->B, g->tb ? 1 : g->ldb, g->tb ? g->ldb : 1, g->K, g->N, kb, buf + na);
    run_blocks(tiles, g, buf, pb, kb);
    return DT_OK;
}

/* ---- the packed-weight cache --------------------------------------------------------- */

#define NSLOT 64

typedef struct {
    const void *b; /* NULL: free */
    bool tb;
    int64_t K, N, ldb;
    uint64_t version, last_use;
    dt__amx_packed_b pb;
    pthread_mutex_t lock; /* held while the copy is packed or read */
} slot;

static slot g_slots[NSLOT];
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_cache_once = PTHREAD_ONCE_INIT;
static uint64_t g_clock, g_packs, g_hits;

static void cache_init(void)
{
    for (int i = 0; i < NSLOT; i++)
        pthread_mutex_init(&g_slots[i].lock, NULL);
}

dt_status dt__amx_gemm_cached_b(const dt__amx_tiles *tiles, const dt__amx_gemm_args *g, uint64_t version)
{
    const char *fn = "dt__amx_gemm_cached_b";
    if (!tiles || !g || g->pb)
        return dt_error(DT_ERR_INVALID_ARG, "%s: tiles and args needed, with args.pb NULL", fn);
    dt_status st = check_args(fn, g);
    if (st < 0 || g->M == 0 || g->N == 0)
        return st;
    pthread_once(&g_cache_once, cache_init);
    pthread_mutex_lock(&g_cache_lock);
    slot *s = NULL, *lru = &g_slots[0];
    for (int i = 0; i < NSLOT && !s; i++) {
        slot *c = &g_slots[i];
        if (c->b && c->b == g->B && c->tb == g->tb && c->K == g->K && c->N == g->N && c->ldb == g->ldb)
            s = c;
        else if (!c->b ? lru->b != NULL : lru->b && c->last_use < lru->last_use)
            lru = c; /* a free slot, else the least recently used */
    }
    bool fresh = !s;
    if (!s)
        s = lru;
    pthread_mutex_lock(&s->lock); /* under the cache lock: nobody re-keys it meanwhile */
    if (fresh) {
        s->b = g->B;
        s->tb = g->tb;
        s->K = g->K;
        s->N = g->N;
        s->ldb = g->ldb;
    }
    bool repack = fresh || s->version != version;
    s->version = version;
    s->last_use = ++g_clock;
    if (repack)
        g_packs++;
    else
        g_hits++;
    pthread_mutex_unlock(&g_cache_lock);
    if (repack && (st = dt__amx_pack_b(&s->pb, g->tb, g->K, g->N, g->B, g->ldb)) < 0)
        s->b = NULL; /* not a valid copy: forget it */
    if (st >= 0) {
        dt__amx_gemm_args a = *g;
        a.B = NULL;
        a.pb = &s->pb;
        st = dt__amx_gemm(tiles, &a);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

void dt__amx_cache_stats_get(dt__amx_cache_stats *out)
{
    pthread_mutex_lock(&g_cache_lock);
    out->packs = g_packs;
    out->hits = g_hits;
    pthread_mutex_unlock(&g_cache_lock);
}

void dt__amx_cache_clear(void)
{
    pthread_once(&g_cache_once, cache_init);
    pthread_mutex_lock(&g_cache_lock);
    for (int i = 0; i < NSLOT; i++) {
        pthread_mutex_lock(&g_slots[i].lock);
        dt__amx_packed_b_free(&g_slots[i].pb);
        g_slots[i].b = NULL;
        pthread_mutex_unlock(&g_slots[i].lock);
    }
    pthread_mutex_unlock(&g_cache_lock);
}

/* ---- dt_k_matmul's bf16 path ------------------------------------------------------- */

/* DT_AMX_GEMM: "on" (or 1) runs dt_k_matmul's bf16 products here; "auto"
 * (the default), "off" (or 0) leave them on oneDNN, whose own AMX kernels
 * (brgemm, isa avx512_core_amx) measured 1.2-2.5x faster than this GEMM on
 * GPT-2's shapes (docs/BENCHMARKS.md). Read once per process. */
static pthread_once_t g_sel_once = PTHREAD_ONCE_INIT;
static bool g_sel_on;

static void select_read(void)
{
    const char *e = getenv("DT_AMX_GEMM");
    if (!e || !*e || !strcmp(e, "auto") || !strcmp(e, "off") || !strcmp(e, "0"))
        return;
    if (!strcmp(e, "on") || !strcmp(e, "1"))
        g_sel_on = true;
    else
        dt_log(DT_LOG_WARN, "DT_AMX_GEMM=%s is not one of auto, on, off; ignored (auto: oneDNN)", e);
}

bool dt__amx_active(const char **why)
{
    const char *w = NULL;
    if (!dt__amx_tiles_hw(&w)) {
        if (why)
            *why = w;
        return false;
    }
    pthread_once(&g_sel_once, select_read);
    if (why)
        *why = g_sel_on ? "active (DT_AMX_GEMM=on)"
                        : "oneDNN runs the bf16 products on AMX itself, faster here; DT_AMX_GEMM=on selects dtrain's";
    return g_sel_on;
}

bool dt_k_matmul_amx(const char **why) { return dt__amx_active(why); }

dt_status dt__amx_matmul_batched(bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                                 const void *A, int64_t sa, const void *B, int64_t sb, float beta, float *C,
                                 int64_t sc, const float *bias)
{
    const dt__amx_tiles *tiles = dt__amx_tiles_hw(NULL);
    if (!tiles)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_k_matmul: AMX is not usable here");
    dt__amx_gemm_args g = {
        .ta = ta, .tb = tb, .M = M, .N = N, .K = K,
        .lda = ta ? M : K, .ldb = tb ? K : N,
        .alpha = alpha, .beta = beta, .ldc = N, .bias = bias,
    };
    dt__amx_packed_b pb = {0};
    dt_status st = DT_OK;
    if (batch > 1 && sb == 0) { /* one B for the whole batch: pack it once */
        if ((st = dt__amx_pack_b(&pb, tb, K, N, B, g.ldb)) < 0)
            return st;
        g.pb = &pb;
    }
    for (int64_t b = 0; b < batch && st >= 0; b++) {
        g.A = (const uint16_t *)A + b * sa;
        g.B = g.pb ? NULL : (const uint16_t *)B + b * sb;
        g.C = C + b * sc;
        st = dt__amx_gemm(tiles, &g);
    }
    dt__amx_packed_b_free(&pb);
    return st;
}
