/* dtrain's AMX bf16 GEMM: the driver over a tile implementation.
 *
 * Register block. The output is computed in blocks of 32 x 32, each by one
 * micro-kernel call as 2 x 2 tiles of 16 x 16 f32 (tmm0..3) over a range of
 * K. A K step is 32 bf16 values: two A tiles (16 rows x 32) and two B tiles
 * (16 pair rows x 16 columns), four tdpbf16ps.
 *
 * Operands. op(A) is read in place when it is A (row-major): the A tiles
 * load 16 rows of 32 values with A's own row stride. Only a K that is not
 * a whole number of steps needs a copy: its last, partial step (32 values
 * of every row, zero-padded) is packed into a small buffer per call. op(A)
 * = A^T (weight gradients) is transposed once per call into a row-major
 * copy padded to whole K steps (rows 64 bytes longer than that, so rows
 * 4 KiB apart do not all map to the same cache sets). op(B) is packed into
 * panels of 32 columns in the VNNI pair layout (row r of a B tile = B[2r][n],
 * B[2r+1][n] for n in the tile), K zero-padded to whole steps; B may come
 * pre-packed (dt__amx_pack_b, or the packed-weight cache below). On CPUs
 * with AVX-512 the packing runs 16 lanes wide (pairs interleaved with
 * permutes, B^T and A^T through 16 x 16 transposes of 32-bit pairs); the
 * scalar loops give the same layout bit for bit. A row-major B (K x N) is
 * then packed by all the call's threads before any product, K steps split
 * between them, each pass reading whole rows: packed panel by panel, every
 * 32 columns read one line of each of K rows (a page apart for N >= 2048):
 * on a Xeon with AMX, 2 threads, packing all of llama-100m's weights so
 * took 37 ms against 27, and its step's input-gradient GEMMs 88-100 ms
 * against 69-73. Except where few row blocks would use each panel (at most
 * SWAP_ROWS rows) or K runs in chunks: there each macro block spans all
 * the rows and packs just its chunk of B's panels (the K steps of one
 * chunk, rows read panel group by panel group) into its thread's buffer
 * before the chunk's products, so packed B never goes to memory.
 *
 * Cache blocking and threads. The output is cut into macro blocks of up to
 * MC x NC (halved until every thread has 8 or more; a plain product with
 * K in chunks, 1024 rows or more and at most 1024 columns: all the
 * columns, two blocks a thread, see dt__amx_gemm), handed out to the
 * threads one at a time (OpenMP's dynamic schedule) in column-group order,
 * so a thread the OS holds back delays a call by one macro block at most.
 * A macro block is summed over K in chunks of KC steps (one chunk when K
 * has at most KC_ONE steps: GPT-2's K = 768 in one chunk of 24 steps, a 48
 * KiB A chunk, ran its 2048 x 2304 and x 3072 products 4-8% faster than in
 * chunks of 16 and 8, the partial sums written once); inside a chunk
 * every 32-row block of A runs across the macro block's panels, so a chunk
 * of A rows (32 x KC) is reused from L1 and the chunk of B panels (KC x NC)
 * from L2. A read in place comes from memory once per row block and
 * column group: each micro-kernel call takes a few of the next row block's
 * rows into L2, one line a row between its tile products (see run_macro).
 * On a Xeon with AMX, 2 threads, interleaved, two runs of 8 rounds: GPT-2's
 * forward products at 2048 rows (x 2304 x 768, x 3072 x 768, x 768 x 3072)
 * 0.94-0.97; its bf16 step at B=8 T=256 0.97 (the forward 0.96). The same
 * lines fetched between the calls instead, in bursts, made the products
 * slower (10% on one thread); into L1 they gained nothing.
 * Between chunks the partial sums go through memory: straight through C
 * when the result is plain (alpha 1, beta 0, no bias, no GELU, f32), else
 * through a per-thread f32 buffer of the macro block. An output sum still
 * runs in increasing k order, tile store and load are exact, and K padding
 * adds +0 (0 x 0), so neither the blocking nor the thread count changes a
 * bit of the result. B^T's panels and op(A)'s copy (or K tail) are packed
 * on first use by the thread that claims them (an atomic flag per panel and
 * per 32-row block): threads starting on the same column group pack its
 * panels between them, and no barrier separates packing from products.
 *
 * Few rows. A product whose B comes as B^T (a weight stored [N, K]) with
 * at most SWAP_ROWS rows and at least twice as many columns runs as its
 * transpose (see dt__amx_gemm): the weight is then the A operand, read in
 * place, and the few rows of A are packed as B.
 *
 * Edges. M and N tails use smaller tiles: the configuration of an edge block
 * gives the C and A tiles only the rows that exist (mr <= 16) and the C and
 * B tiles only the columns that exist (colsb = 4 nc), and leaves out tile
 * row or column 1 when the block has 16 or fewer rows or columns, so no
 * tile reads or writes past the matrices. A thread reloads its
 * configuration only when the block shape changes (ldtilecfg also zeroes
 * the tiles, so it is never done inside a block's K range).
 *
 * Tile state. A thread configures its tiles at its first block of a call and
 * releases them (tilerelease) before it leaves the call's parallel region:
 * OpenMP's threads go on to run other kernels, and a released thread carries
 * no tile state into them (nor into a context switch's save area). The
 * permission to use the tiles (arch_prctl) is asked once per process, in
 * amx_hw.c.
 *
 * Epilogue. A macro block that is not plain is written from its buffer to C
 * (with K in one chunk and the result not transposed, each 32-row block as
 * soon as its sums are complete, from a buffer of 32 rows: see gemm_run)
 * as alpha acc (+ beta C) (+ bias) (then GELU), or rounded to bf16 into Cb
 * (as dt_f32_to_bf16 rounds), 16 lanes at a time with AVX-512 (separate
 * multiplies and adds, so the scalar loop's bits), so beta = 1 accumulates
 * gradients and the bias (and GELU) of a linear layer cost no extra pass.
 * Asked (args.keep), rows of a bf16 result go to an f32 one instead: a
 * tied embedding's gradient, of which a later lookup's backward adds to
 * a few rows before they are rounded (the others are final as the GEMM
 * rounds them: no f32 [V, C] result goes through memory).
 * Asked (args.finite), it also notes whether a value it stores is inf or
 * NaN (exponent bits all ones, of the bf16 value for Cb): a weight's
 * gradient is so checked as it is written, instead of by a read pass over
 * it after the call (GPT-2's bf16 step at B=4 T=64 on the Xeon with AMX, 2
 * threads, interleaved, 8 rounds: 319 -> 312 ms, the backward 182 -> 175). */
#include "kernels/gemm_amx.h"
#include "kernels/kernels_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define KSTEP DT__AMX_KSTEP
#define TILE DT__AMX_TILE_ELEMS
#define BLK 32
#define MC 256 /* macro block rows (at most; fewer when the product is small) */
#define NC 256 /* macro block columns (likewise) */
#define KC 16     /* K steps summed per chunk: 512 values, a 32 x 512 A chunk is 32 KiB (L1) */
#define KC_ONE 24 /* up to this many K steps in all: one chunk (no partial sums through memory) */
#define KC_PLAIN 32 /* K steps a chunk of a plain product of many rows, B packed where used (see gemm_run) */
#define SWAP_ROWS 512 /* a product with B^T and at most this many rows may run transposed */
#define BJIT_BLOCKS 1536 /* 32 x 32 blocks of a macro block that packs its own chunks of B (see gemm_run) */
#define BJIT_CHUNK_PANELS 24 /* ... and at most this many panels with K in chunks: 768 KiB of B a chunk (see gemm_run) */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- packing -------------------------------------------------------------------- */

/* Panel nb of op(B) (K x N, element (k, n) at B[k rs + n cs]), scalar. */
static void pack_b_panel_s(const uint16_t *B, int64_t rs, int64_t cs, int64_t K, int64_t N, int64_t kb, int64_t nb,
                           uint16_t *out)
{
    for (int64_t ks = 0; ks < kb; ks++)
        for (int j = 0; j < 2; j++) {
            uint16_t *t = out + ks * 2 * TILE + j * TILE;
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

/* Rows m0 .. m0 + 15 (those below M) of op(A) = A^T (element (m, k) at
 * A[k lda + m]) into the row-major copy (rows ld values apart, K padded
 * with zeros to kb steps), scalar. */
static void pack_at_rows_s(const uint16_t *A, int64_t lda, int64_t M, int64_t K, int64_t kb, int64_t m0, uint16_t *out,
                           int64_t ld)
{
    for (int64_t m = m0; m < m0 + 16 && m < M; m++)
        for (int64_t k = 0; k < kb * KSTEP; k++)
            out[m * ld + k] = k < K ? A[k * lda + m] : 0;
}

#if DT__X86_VEC
/* Software prefetch in the packing loops (a hint: no fault past an array,
 * no result changed). On the Xeon VM with AMX the hardware prefetcher
 * alone left them waiting on memory: a row-major B (pack_b_steps_n) takes
 * the next row pair's line as it reads each line (2048 x 3072: 0.94 -> 0.72
 * ms on 2 threads, cold), B^T's panels (pack_b_panel_t) the line PF_BT
 * values ahead in each of their rows (768 x 3072: 0.40 -> 0.26 ms; 64
 * measured better than 128, 256 and 512). A^T's rows (pack_at_rows_v)
 * gained nothing from it. */
#define PF_BT 64
#define PF_ROWS 8 /* rows of the next row block of A a micro-kernel call prefetches (see run_macro) */

/* The mask of the first n (clamped to 0..32) 16-bit lanes. */
static inline __mmask32 mask16(int64_t n) { return n <= 0 ? 0 : n >= 32 ? 0xffffffffu : (1u << n) - 1; }

/* Pair interleave indices: lo gives x0[c], x1[c] for c < 16, hi for c >= 16. */
DT__AVX512 static inline __m512i pair_idx(int hi)
{
    _Alignas(64) uint16_t v[32];
    for (int c = 0; c < 16; c++) {
        v[2 * c] = (uint16_t)(c + 16 * hi);
        v[2 * c + 1] = (uint16_t)(32 + c + 16 * hi);
    }
    return _mm512_load_si512(v);
}

/* pack_b_panel_s for B row-major (rows k, columns n contiguous), K steps
 * ks0 .. ks1 - 1 of the panels nb0 .. nb1 - 1, row pair by row pair across
 * the panels: whole rows (or their panels' part) read in order. Step ks of
 * panel j goes to out + ((j - nb0) stride + ks - ks0) 2 TILE: stride kb
 * for whole panels, the chunk's steps for a chunk (see plan.bjit). */
DT__AVX512 static void pack_b_steps_n(const uint16_t *B, int64_t ldb, int64_t K, int64_t N, int64_t stride,
                                      int64_t ks0, int64_t ks1, int64_t nb0, int64_t nb1, uint16_t *out)
{
    const __m512i plo = pair_idx(0), phi = pair_idx(1);
    for (int64_t ks = ks0; ks < ks1; ks++)
        for (int r = 0; r < 16; r++) {
            int64_t k = ks * KSTEP + 2 * r;
            const uint16_t *b0 = B + k * ldb, *b1 = b0 + ldb;
            uint16_t *t = out + (ks - ks0) * 2 * TILE + r * KSTEP;
            const bool pf = k + 3 < K;
            for (int64_t j = nb0; j < nb1; j++, t += stride * 2 * TILE) {
                int64_t n0 = j * BLK;
                if (pf) { /* the next row pair's line */
                    __builtin_prefetch(b0 + 2 * ldb + n0);
                    __builtin_prefetch(b1 + 2 * ldb + n0);
                }
                __mmask32 m = mask16(N - n0);
                __m512i x0 = k < K ? _mm512_maskz_loadu_epi16(m, b0 + n0) : _mm512_setzero_si512();
                __m512i x1 = k + 1 < K ? _mm512_maskz_loadu_epi16(m, b1 + n0) : _mm512_setzero_si512();
                _mm512_storeu_si512(t, _mm512_permutex2var_epi16(x0, plo, x1));
                _mm512_storeu_si512(t + TILE, _mm512_permutex2var_epi16(x0, phi, x1));
            }
        }
}

/* pack_b_panel_s for B^T stored (rows n, K contiguous): a tile is the
 * 16 x 16 transpose of the 32-bit pairs of 16 rows. */
DT__AVX512 static void pack_b_panel_t(const uint16_t *B, int64_t ldb, int64_t K, int64_t N, int64_t kb, int64_t nb,
                                      uint16_t *out)
{
    for (int64_t ks = 0; ks < kb; ks++) {
        int64_t k0 = ks * KSTEP;
        __mmask32 m = mask16(K - k0);
        for (int j = 0; j < 2; j++) {
            __m512i r[16];
            for (int c = 0; c < 16; c++) {
                int64_t n = nb * BLK + j * 16 + c;
                if (n < N && k0 + PF_BT < K)
                    __builtin_prefetch(B + n * ldb + k0 + PF_BT);
                r[c] = n < N ? _mm512_maskz_loadu_epi16(m, B + n * ldb + k0) : _mm512_setzero_si512();
            }
            dt__tr16(r);
            uint16_t *t = out + ks * 2 * TILE + j * TILE;
            for (int i = 0; i < 16; i++)
                _mm512_storeu_si512(t + i * KSTEP, r[i]);
        }
    }
}

/* pack_at_rows_s for the columns [m0, m1): pairs of A's rows k, k + 1
 * interleaved over 16 columns m, then transposed (row m of the result
 * holds 16 pairs along k). Each K step covers every 16 columns of the
 * range before the next: the rows' lines are read whole while they are in
 * L1, not half of each per pass over K. */
DT__AVX512 static void pack_at_rows_v(const uint16_t *A, int64_t lda, int64_t M, int64_t K, int64_t kb, int64_t m0,
                                      int64_t m1, uint16_t *out, int64_t ld)
{
    const __m512i lo = pair_idx(0);
    for (int64_t ks = 0; ks < kb; ks++)
        for (int64_t mh = m0; mh < m1; mh += 16) {
            const __mmask32 m = mask16(M - mh) & 0xffff;
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                int64_t k = ks * KSTEP + 2 * i;
                __m512i x0 = k < K ? _mm512_maskz_loadu_epi16(m, A + k * lda + mh) : _mm512_setzero_si512();
                __m512i x1 = k + 1 < K ? _mm512_maskz_loadu_epi16(m, A + (k + 1) * lda + mh) : _mm512_setzero_si512();
                r[i] = _mm512_permutex2var_epi16(x0, lo, x1);
            }
            dt__tr16(r);
            for (int c = 0; c < 16 && mh + c < M; c++)
                _mm512_storeu_si512(out + (mh + c) * ld + ks * KSTEP, r[c]);
        }
}
#endif

static bool vec512(void)
{
#if DT__X86_VEC
    return dt__vec_level() == DT__VEC_AVX512;
#else
    return false;
#endif
}

/* Panel nb of op(B) (B stored K x N, or N x K when tb) into out. */
static void pack_b_panel(const uint16_t *B, bool tb, int64_t ldb, int64_t K, int64_t N, int64_t kb, int64_t nb,
                         bool v, uint16_t *out)
{
#if DT__X86_VEC
    if (v && tb) { /* (a row-major B goes to pack_b_steps_n, every panel in one pass) */
        pack_b_panel_t(B, ldb, K, N, kb, nb, out);
        return;
    }
#else
    (void)v;
#endif
    pack_b_panel_s(B, tb ? 1 : ldb, tb ? ldb : 1, K, N, kb, nb, out);
}

/* The rows [m0, m1) of op(A) = A^T (16 at a time from m0) into out. */
static void pack_at_rows(const uint16_t *A, int64_t lda, int64_t M, int64_t K, int64_t kb, int64_t m0, int64_t m1,
                         bool v, uint16_t *out, int64_t ld)
{
#if DT__X86_VEC
    if (v) {
        pack_at_rows_v(A, lda, M, K, kb, m0, m1, out, ld);
        return;
    }
#else
    (void)v;
#endif
    for (int64_t m = m0; m < m1; m += 16)
        pack_at_rows_s(A, lda, M, K, kb, m, out, ld);
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
    if (need) {
        bool v = vec512();
        int nt = dt__threads_for(N * kb * KSTEP);
#if DT__X86_VEC
        if (v && !tb) {
#pragma omp parallel for schedule(static) num_threads(nt)
            for (int64_t ks = 0; ks < kb; ks++)
                pack_b_steps_n(B, ldb, K, N, kb, ks, ks + 1, 0, nb, pb->data + ks * 2 * TILE);
            return DT_OK;
        }
#endif
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t j = 0; j < nb; j++)
            pack_b_panel(B, tb, ldb, K, N, kb, j, v, pb->data + j * kb * 2 * TILE);
    }
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
    uint32_t shape;             /* the block shape configured (mr0, mr1, nc0, nc1, a byte each) */
} thread_tiles;

static _Thread_local thread_tiles g_tt;

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

/* The configuration of a block of that shape on the calling thread, loaded
 * only when the shape (or the implementation) changes: a compare of one
 * word per block. */
static void tiles_use(const dt__amx_tiles *tiles, int mr0, int mr1, int nc0, int nc1)
{
    uint32_t shape = (uint32_t)mr0 | (uint32_t)mr1 << 8 | (uint32_t)nc0 << 16 | (uint32_t)nc1 << 24;
    if (g_tt.tiles == tiles && g_tt.shape == shape)
        return;
    if (g_tt.tiles && g_tt.tiles != tiles)
        g_tt.tiles->release();
    dt__amx_cfg cfg;
    block_cfg(&cfg, mr0, mr1, nc0, nc1);
    tiles->load_config(&cfg);
    g_tt.tiles = tiles;
    g_tt.shape = shape;
}

/* ---- epilogue ---------------------------------------------------------------------- */

static float gelu_tanh(float x)
{
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* rows x cols sums at acc (rows ld floats apart) into the result at
 * (m0, n0): C, or Cb rounded to bf16. */
static bool epilogue_s(const dt__amx_gemm_args *g, const float *acc, int64_t ld, int64_t m0, int64_t n0,
                       int64_t rows, int64_t cols, bool ct)
{
    bool bad = false;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < cols; c++) {
            /* the result's row and column: (m0 + i, n0 + c), or transposed (ct) */
            const int64_t r = ct ? n0 + c : m0 + i, k = ct ? m0 + i : n0 + c, o = r * g->ldc + k;
            const bool kept = g->keep && g->keep[r] >= 0; /* never with ct (see dt__amx_gemm) */
            float v = g->alpha * acc[i * ld + c];
            if (g->beta != 0.0f)
                v += g->beta * g->C[o];
            if (g->bias)
                v += g->bias[k];
            if (g->act == DT__AMX_ACT_GELU_TANH)
                v = gelu_tanh(v);
            if (kept) {
                g->Ck[g->keep[r] * g->ldc + k] = v;
                bad |= !isfinite(v);
            } else if (g->Cb) {
                g->Cb[o] = dt_f32_to_bf16(v);
                bad |= (g->Cb[o] & 0x7f80) == 0x7f80; /* exponent all ones: inf or NaN */
            } else {
                g->C[o] = v;
                bad |= !isfinite(v);
            }
        }
    return bad;
}

#if DT__X86_VEC
/* 16 sums v into the result at its columns k .. k + 15 (lanes m) with
 * epilogue_s's operations in its order, so its bits: alpha v (+ beta c)
 * (+ bias), into c (f32) when cb is NULL, else rounded into cb (st: a
 * streaming store of whole lines). Returns the lanes stored non-finite
 * when g->finite asks (exponent bits all ones), else 0. */
DT__AVX512 static inline __mmask16 out16(const dt__amx_gemm_args *g, __m512 v, float *c, uint16_t *cb, int64_t k,
                                         __mmask16 m, bool st)
{
    v = _mm512_mul_ps(_mm512_set1_ps(g->alpha), v);
    if (g->beta != 0.0f)
        v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(g->beta), _mm512_maskz_loadu_ps(m, c)));
    if (g->bias)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, g->bias + k));
    if (!cb) {
        if (m == 0xffff)
            _mm512_storeu_ps(c, v);
        else
            _mm512_mask_storeu_ps(c, m, v);
        const __m512i e = _mm512_set1_epi32(0x7f800000);
        return g->finite ? _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(_mm512_castps_si512(v), e), e) : 0;
    }
    const __m256i h = dt__bf16_pack16(dt__bf16_round16(v));
    if (st)
        _mm256_stream_si256((__m256i *)(void *)cb, h);
    else if (m == 0xffff)
        _mm256_storeu_si256((__m256i *)(void *)cb, h);
    else
        _mm256_mask_storeu_epi16(cb, m, h);
    const __m256i e = _mm256_set1_epi16(0x7f80);
    return g->finite ? _mm256_mask_cmpeq_epi16_mask(m, _mm256_and_si256(h, e), e) : 0;
}

#define DT__AVX512BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

/* A row of a bf16 result that takes no alpha and no beta (a weight's
 * gradient; a layer's output with its bias, bias: the row's first column's,
 * or NULL), 32 columns a step: the sums (plus the bias) rounded by one
 * vcvtne2ps2bf16 and stored as one line (st: streamed), the bits of out16
 * (the instruction reads a subnormal input as zero: a step with one takes
 * out16's integer rounding instead; NaNs it quiets as the integer formula
 * does). Returns the largest of the stored values' exponent bits (0x7f80:
 * some is inf or NaN), for the finite check. cols is a multiple of 32. On
 * the Xeon with AMX, 2 threads, GPT-2 at B=4 T=64: its weight gradients,
 * outputs cold, 35.4-40.0 -> 28.0-30.4 ms a step; the bf16 step 237.4-243.2
 * -> 229.0-233.3 ms, 4 rounds interleaved. */
DT__AVX512BF16 static __m512i row_bf16_cvt(const float *acc, const float *bias, uint16_t *cb, int64_t cols, bool st,
                                           __m512i emax)
{
    const __m512i ex = _mm512_set1_epi32(0x7f800000), mant = _mm512_set1_epi32(0x007fffff);
    const __m512i e16 = _mm512_set1_epi16(0x7f80);
    for (int64_t c = 0; c < cols; c += 32) {
        __m512 a = _mm512_loadu_ps(acc + c), b = _mm512_loadu_ps(acc + c + 16);
        if (bias) {
            a = _mm512_add_ps(a, _mm512_loadu_ps(bias + c));
            b = _mm512_add_ps(b, _mm512_loadu_ps(bias + c + 16));
        }
        const __m512i ua = _mm512_castps_si512(a), ub = _mm512_castps_si512(b);
        const __mmask16 sa = _mm512_testn_epi32_mask(ua, ex) & _mm512_test_epi32_mask(ua, mant);
        const __mmask16 sb = _mm512_testn_epi32_mask(ub, ex) & _mm512_test_epi32_mask(ub, mant);
        __m512i h;
        if (!(sa | sb)) {
            const __m512bh r = _mm512_cvtne2ps_pbh(b, a); /* a's 16 values in the low half */
            memcpy(&h, &r, sizeof h);
        } else {
            h = _mm512_inserti64x4(_mm512_castsi256_si512(dt__bf16_pack16(dt__bf16_round16(a))),
                                   dt__bf16_pack16(dt__bf16_round16(b)), 1);
        }
        emax = _mm512_max_epu16(emax, _mm512_and_si512(h, e16));
        if (st)
            _mm512_stream_si512((__m512i *)(void *)(cb + c), h);
        else
            _mm512_storeu_si512(cb + c, h);
    }
    return emax;
}

/* epilogue_s without GELU, 16 columns at a time (out16). stream
 * (g->stream, a bf16 result): rows of whole 64-byte lines go out by
 * streaming stores; the driver fences before its threads leave. */
DT__AVX512 static bool epilogue_v(const dt__amx_gemm_args *g, const float *acc, int64_t ld, int64_t m0, int64_t n0,
                                  int64_t rows, int64_t cols, bool stream)
{
    __mmask16 bad = 0;
    /* rows of row_bf16_cvt: a bf16 result without alpha or beta where the kernels run avx512_bf16 */
    const bool cvt = g->Cb && g->alpha == 1.0f && g->beta == 0.0f && cols % 32 == 0 &&
                     dt_k_get_isa() == DT_K_ISA_AVX512_BF16;
    __m512i emax = _mm512_setzero_si512();
    for (int64_t i = 0; i < rows; i++) {
        const int64_t o = (m0 + i) * g->ldc + n0;
        const bool kept = g->keep && g->keep[m0 + i] >= 0;
        float *c32 = kept ? g->Ck + g->keep[m0 + i] * g->ldc + n0 : g->C ? g->C + o : NULL;
        uint16_t *cb = kept || !g->Cb ? NULL : g->Cb + o;
        const bool st = stream && cb && cols % 32 == 0 && ((uintptr_t)cb & 63) == 0; /* whole lines */
        if (cvt && cb) {
            emax = row_bf16_cvt(acc + i * ld, g->bias ? g->bias + n0 : NULL, cb, cols, st, emax);
            continue;
        }
        for (int64_t c = 0; c < cols; c += 16) {
            __mmask16 m = cols - c >= 16 ? 0xffff : (__mmask16)((1u << (cols - c)) - 1);
            bad |= out16(g, _mm512_maskz_loadu_ps(m, acc + i * ld + c), c32 ? c32 + c : NULL, cb ? cb + c : NULL,
                         n0 + c, m, st);
        }
    }
    if (g->finite && _mm512_cmpeq_epi16_mask(emax, _mm512_set1_epi16(0x7f80)))
        bad = 1;
    return bad != 0;
}

/* epilogue_v for a product computed transposed (ct, see dt__amx_gemm):
 * the sums' rows are the result's columns. 16 x 16 blocks of the sums are
 * transposed in registers, so each of the result's rows takes 16 columns
 * at a time through out16 (the same bits). The result's rows go 16 at a
 * time, each written along its columns before the next 16 (the other way
 * round, every 16 columns touched a line in each of the block's rows: 100
 * KB apart in a language model head's logits), and whole blocks are
 * stored unmasked. With acc_ld's longer rows, on the Xeon with AMX, 2
 * threads, interleaved, 5-7 rounds: the logits 256 x 50257 x 768 15.3 ->
 * 12.8 ms, 256 x 768 x 3072 0.81 -> 0.77; GPT-2's bf16 step at B=4 T=64
 * 347 -> 333 ms. */
DT__AVX512 static bool epilogue_vt(const dt__amx_gemm_args *g, const float *acc, int64_t ld, int64_t m0,
                                   int64_t n0, int64_t rows, int64_t cols)
{
    __mmask16 bad = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += 16) /* 16 of the result's rows, n0 + c0 .. */
        for (int64_t i0 = 0; i0 < rows; i0 += 16) { /* 16 of its columns, m0 + i0 .. */
            const int64_t ni = rows - i0 < 16 ? rows - i0 : 16, nc = cols - c0 < 16 ? cols - c0 : 16;
            const __mmask16 mc = (__mmask16)((1u << nc) - 1), mi = (__mmask16)((1u << ni) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < ni ? _mm512_maskz_loadu_epi32(mc, acc + (i0 + i) * ld + c0) : _mm512_setzero_si512();
            dt__tr16(r);
            for (int c = 0; c < nc; c++) {
                const int64_t o = (n0 + c0 + c) * g->ldc + m0 + i0;
                bad |= out16(g, _mm512_castsi512_ps(r[c]), g->C ? g->C + o : NULL, g->Cb ? g->Cb + o : NULL,
                             m0 + i0, mi, false);
            }
        }
    return bad != 0;
}
#endif

/* The sums of a macro block into the result; ct: the product was computed
 * transposed (its rows are the result's columns). Returns whether a value
 * stored was not finite (checked only when g->finite asks). */
static bool epilogue(const dt__amx_gemm_args *g, const float *acc, int64_t ld, int64_t m0, int64_t n0, int64_t rows,
                     int64_t cols, bool v, bool ct)
{
#if DT__X86_VEC
    if (v && g->act == DT__AMX_ACT_NONE && ct)
        return epilogue_vt(g, acc, ld, m0, n0, rows, cols);
    if (v && g->act == DT__AMX_ACT_NONE)
        return epilogue_v(g, acc, ld, m0, n0, rows, cols, g->Cb && g->stream);
#else
    (void)v;
#endif
    return epilogue_s(g, acc, ld, m0, n0, rows, cols, ct);
}

/* ---- the driver ---------------------------------------------------------------------- */

static int clamp16(int64_t v) { return v <= 0 ? 0 : v >= 16 ? 16 : (int)v; }

typedef struct {
    const dt__amx_gemm_args *g;
    const uint16_t *a; /* op(A) row-major: A itself, or the transposed copy */
    int64_t lda;
    int64_t kfull;         /* whole K steps read from a */
    const uint16_t *atail; /* the last, partial K step of every row (32 values a row), or NULL */
    const uint16_t *pb;    /* packed op(B) */
    int64_t kb;            /* K steps in all */
    int64_t mcb, ncb;      /* a macro block's 32-row blocks and 32-column panels */
    bool plain;            /* the partial sums go through C itself (no epilogue) */
    bool v;                /* AVX-512 packing and epilogue */
    bool aprivate;         /* A^T's rows transposed per macro block into the thread's own buffer */
    bool ct;               /* the product is the result transposed (dt__amx_gemm's swap) */
    bool bjit;             /* B row-major, few rows or K in chunks: each macro block packs its chunk
                              of B panels (chunk steps of its ncb panels) into the thread's buffer
                              before the chunk's products (see gemm_run) */
    int64_t chunk;         /* K steps of a chunk (KC, or all when K has at most KC_ONE) */
    bool rowwise;          /* one chunk, an epilogue, not transposed: each 32-row block's sums go
                              through the epilogue as soon as they are complete (see gemm_run) */
    /* packing on first use: the thread that claims a panel (row block) packs it */
    _Atomic int *bflag;    /* per B panel: 0 to pack, 1 being packed, 2 ready; NULL: B came packed */
    _Atomic int *aflag;    /* per 32-row block of op(A)'s copy or K tail; NULL: nothing to copy */
    uint16_t *bdst, *adst; /* where they are packed */
} plan;

static void pack_b_job(const plan *p, int64_t j)
{
    const dt__amx_gemm_args *g = p->g;
    pack_b_panel(g->B, g->tb, g->ldb, g->K, g->N, p->kb, j, p->v, p->bdst + j * p->kb * 2 * TILE);
}

static void pack_a_job(const plan *p, int64_t mb)
{
    const dt__amx_gemm_args *g = p->g;
    int64_t m0 = mb * BLK, m1 = min64(m0 + BLK, g->M);
    if (g->ta) {
        pack_at_rows(g->A, g->lda, g->M, g->K, p->kb, m0, m1, p->v, p->adst, p->lda);
        return;
    }
    const int64_t k0 = p->kfull * KSTEP; /* the K tail: the last, partial step */
    for (int64_t m = m0; m < m1; m++)
        for (int64_t k = 0; k < KSTEP; k++)
            p->adst[m * KSTEP + k] = k0 + k < g->K ? g->A[m * g->lda + k0 + k] : 0;
}

/* Items [lo, hi) packed and visible to the calling thread: it packs those
 * nobody has claimed, then waits for those another thread is packing
 * (threads sharing a group of panels pack it between them). */
static void ensure_packed(const plan *p, _Atomic int *flag, int64_t lo, int64_t hi,
                          void (*job)(const plan *, int64_t))
{
    if (!flag)
        return;
    for (int64_t j = lo; j < hi; j++) {
        int free_ = 0;
        if (atomic_load_explicit(&flag[j], memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&flag[j], &free_, 1)) {
            job(p, j);
            atomic_store_explicit(&flag[j], 2, memory_order_release);
        }
    }
    for (int64_t j = lo; j < hi; j++)
        while (atomic_load_explicit(&flag[j], memory_order_acquire) != 2)
            sched_yield();
}

/* Floats between rows of a macro block's sums. Transposed (ct), the
 * epilogue reads them down the columns, 16 values of each of mcb x 32 rows
 * in turn: at a whole number of KiB apart those rows would share 4 of L1's
 * 64 sets, so they are one line longer. */
static int64_t acc_ld(const plan *p) { return p->ncb * BLK + (p->ct ? 16 : 0); }

/* Macro block (mg, ng) of the output: 32-row blocks mg mcb .. and 32-column
 * panels ng ncb .., summed over K in chunks; buf: mcb x ncb blocks of
 * floats (rows acc_ld apart) unless plain; abuf: the thread's copy of the
 * macro block's rows of A^T when p->aprivate; bbuf: the thread's chunk of B
 * panels when p->bjit. Returns the epilogue's answer: whether a value
 * stored was not finite (when g->finite asks). */
static bool run_macro(const dt__amx_tiles *tiles, const plan *p, int64_t mg, int64_t ng, float *buf, uint16_t *abuf,
                      uint16_t *bbuf)
{
    const dt__amx_gemm_args *g = p->g;
    int64_t mb0 = mg * p->mcb, mb1 = min64(mb0 + p->mcb, cdiv(g->M, BLK));
    int64_t nb0 = ng * p->ncb, nb1 = min64(nb0 + p->ncb, cdiv(g->N, BLK));
    const uint16_t *a = p->a; /* row row0 of op(A) at a */
    int64_t row0 = 0;
    if (p->aprivate) { /* the macro block's rows of A^T, transposed for this thread alone */
        const dt__amx_gemm_args *ga = p->g;
        pack_at_rows(ga->A + mb0 * BLK, ga->lda, ga->M - mb0 * BLK, ga->K, p->kb, 0,
                     min64(mb1 * BLK, ga->M) - mb0 * BLK, p->v, abuf, p->lda);
        a = abuf;
        row0 = mb0 * BLK;
    }
    ensure_packed(p, p->aflag, mb0, mb1, pack_a_job);
    ensure_packed(p, p->bflag, nb0, nb1, pack_b_job);
    float *acc = p->plain ? g->C + mb0 * BLK * g->ldc + nb0 * BLK : buf;
    int64_t ldacc = p->plain ? g->ldc : acc_ld(p);
    /* A read in place (not A^T's copy, which this call has just written):
     * the next row block's rows, spread over this row block's panels
     * (PF_ROWS at most a call). They come from memory once per row block
     * and column group, and the hardware prefetcher alone left the tile
     * loads waiting on them. */
    const int64_t npan = nb1 - nb0, rpc = g->ta ? 0 : min64(cdiv(BLK, npan), PF_ROWS);
    bool bad = false;
    int64_t kc = 0;
    do { /* one chunk of K steps over the macro block */
        int64_t ke = min64(kc + p->chunk, p->kb), kd = min64(ke, p->kfull) - kc;
        bool tail = p->atail && ke > p->kfull;
        kd = kd < 0 ? 0 : kd;
#if DT__X86_VEC
        if (p->bjit)
            pack_b_steps_n(g->B, g->ldb, g->K, g->N, p->chunk, kc, ke, nb0, nb1, bbuf);
#endif
        for (int64_t mb = mb0; mb < mb1; mb++) {
            for (int64_t nb = nb0; nb < nb1; nb++) {
                int64_t m0 = mb * BLK, n0 = nb * BLK;
                int mr[2] = {clamp16(g->M - m0), clamp16(g->M - m0 - 16)};
                int nc[2] = {clamp16(g->N - n0), clamp16(g->N - n0 - 16)};
                tiles_use(tiles, mr[0], mr[1], nc[0], nc[1]);
                float *c = acc + (p->rowwise ? 0 : (mb - mb0) * BLK * ldacc) + (nb - nb0) * BLK;
                /* step kc of panel nb */
                const uint16_t *pbn = p->bjit ? bbuf + (nb - nb0) * p->chunk * 2 * TILE
                                              : p->pb + (nb * p->kb + kc) * 2 * TILE;
                bool in = kc > 0;
                if (kd > 0 || !tail) {
                    const int64_t r0 = m0 + BLK + (nb - nb0) * rpc, pfn = min64(rpc, g->M - r0);
                    tiles->block(a + (m0 - row0) * p->lda + kc * KSTEP, p->lda, pbn, kd, mr[1] > 0, nc[1] > 0, c,
                                 ldacc, in, pfn > 0 ? a + (r0 - row0) * p->lda + kc * KSTEP : NULL,
                                 pfn > 0 ? (int)pfn : 0);
                    in = true;
                }
                if (tail)
                    tiles->block(p->atail + m0 * KSTEP, KSTEP, pbn + (p->kfull - kc) * 2 * TILE, 1, mr[1] > 0,
                                 nc[1] > 0, c, ldacc, in, NULL, 0);
            }
            if (p->rowwise)
                bad |= epilogue(g, buf, ldacc, mb * BLK, nb0 * BLK, min64(BLK, g->M - mb * BLK),
                                min64(nb1 * BLK, g->N) - nb0 * BLK, p->v, false);
        }
        kc = ke;
    } while (kc < p->kb);
    if (p->rowwise)
        return bad;
    return !p->plain && epilogue(g, buf, ldacc, mb0 * BLK, nb0 * BLK, min64(mb1 * BLK, g->M) - mb0 * BLK,
                                 min64(nb1 * BLK, g->N) - nb0 * BLK, p->v, p->ct);
}

static dt_status check_args(const char *fn, const dt__amx_gemm_args *g)
{
    DT__CHECK_N(fn, g->M);
    DT__CHECK_N(fn, g->N);
    DT__CHECK_N(fn, g->K);
    DT__CHECK_PTR(fn, g->A, g->M * g->K);
    if (g->keep && (!g->Cb || !g->Ck))
        return dt_error(DT_ERR_INVALID_ARG, "%s: kept rows (keep) need a bf16 result (Cb) and an f32 one (Ck)", fn);
    if (g->Cb) {
        if (g->C || g->beta != 0.0f)
            return dt_error(DT_ERR_INVALID_ARG, "%s: a bf16 result (Cb) takes C NULL and beta 0", fn);
    } else {
        DT__CHECK_PTR(fn, g->C, g->M * g->N);
    }
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

static size_t up64(size_t n) { return (n + 31) / 32 * 32; } /* uint16_t values to whole 64-byte lines */

/* The product of g on the tiles; ct: g is the result's transpose (the
 * epilogue writes row i, column j of the product at row j, column i of
 * g->C or g->Cb, with the bias of column i). */
static dt_status gemm_run(const dt__amx_tiles *tiles, const dt__amx_gemm_args *g, bool ct)
{
    const char *fn = "dt__amx_gemm";
    const int64_t M = g->M, N = g->N, K = g->K, kb = cdiv(K, KSTEP);
    const int64_t nmb = cdiv(M, BLK), nnb = cdiv(N, BLK);
    plan p = {.g = g, .kb = kb, .v = vec512(), .ct = ct,
              .plain = !ct && !g->Cb && g->alpha == 1.0f && g->beta == 0.0f && !g->bias &&
                       g->act == DT__AMX_ACT_NONE && !g->finite};
    /* macro blocks: MC x NC, smaller when that leaves fewer than 8 a thread
     * (768 x 768: 18 of 256 x 128 for 2 threads, 9 each) */
    int nt = dt__threads_for(M * N * (K / 16 + 1));
    /* A^T with many rows (a language model head's weight gradient, 50304 x
     * 768 x 2048) and few columns: macro blocks span all columns, so each
     * transposes its own rows of A^T into its thread's buffer (MC rows)
     * instead of the call holding a copy of all of A^T (206 MB there) */
    p.aprivate = g->ta && nmb > 32 && nnb <= 32 && kb;
    /* ... and start at 4 MC rows: B (every column, all of K) is read once a
     * macro block (that head's weight gradient on 2 threads: 112-120 ms at
     * MC rows, 100 at 4 MC, 109 at 8 MC) */
    /* A product run transposed from few rows (see dt__amx_gemm: the
     * stored weight is A, read in place, and the result has at most 16
     * panels of columns): macro blocks span every column, so each row
     * block of the weight comes from memory once (in column groups of NC it
     * came once a group), and about 3 a thread, larger, so the next row
     * block a call prefetches is more often its own thread's. GPT-2's input
     * gradients at 256 rows (768 x 256 x 2304, x 768, x 3072 and 3072 x 256
     * x 768), the Xeon with AMX, 2 threads, cold weights, 3 rounds
     * interleaved: 5-11% faster (0.645-0.651 -> 0.589-0.606 ms, 0.272-0.280
     * -> 0.254-0.265, 0.867-0.886 -> 0.795-0.825, 0.879-0.886 -> 0.850-0.877);
     * at 512 rows 2-8%; warm 4-20%. */
    const bool wide = ct && !g->ta && nnb <= 16;
    p.mcb = (p.aprivate ? 4 : 1) * MC / BLK;
    p.ncb = p.aprivate || wide ? nnb : NC / BLK;
    const int64_t per_thread = wide ? 3 : 8;
    while (cdiv(nmb, p.mcb) * cdiv(nnb, p.ncb) < per_thread * (int64_t)nt &&
           (p.mcb > 2 || (p.ncb > 2 && !p.aprivate && !wide))) {
        if (p.mcb >= p.ncb || p.aprivate || wide)
            p.mcb /= 2;
        else
            p.ncb /= 2;
    }
    /* A plain product summed over K in chunks with many rows (M at least
     * 1024) and few columns (N at most 1024): macro blocks of all the
     * columns and about M / (2 threads) rows, so each chunk of A comes from
     * memory once (not once a column group: the rows of a long-K A, such as
     * a language model head's dlogits, lie far apart) and the chunk's B
     * panels (at most 1 MiB) serve every row from L2. On a Xeon with AMX, 2
     * threads, interleaved: 2048 x 768 x 50304 113-116 -> 92-99 ms, 2048 x
     * 768 x 3072 2-6% faster, 1024 rows 2-4%; with 512 rows or fewer B's
     * re-reads outweigh A's (256 x 768 x 3072 10% slower), so not there.
     * A row-major B then takes the chunked packing below instead (macro
     * blocks of all the rows and a thread's share of the columns: 2048 x
     * 768 x 50257 0.98 of this rule's time). */
    if (p.plain && !p.aprivate && kb > KC_ONE && nmb >= 32 && nnb * BLK <= 1024) {
        p.ncb = nnb;
        p.mcb = cdiv(nmb, 2 * (int64_t)nt);
    }
    /* A row-major B whose packed panels would each serve only a few row
     * blocks (at most SWAP_ROWS rows: a layer's forward at a small batch,
     * a language model head's input gradient), or whose K runs in chunks
     * (K over KC_ONE steps: a down projection's forward): packing all of B
     * to memory first and reading it back once per row group cost more
     * than it saved. Instead a macro block spans all the rows and packs its
     * panels' chunk of K steps into its thread's buffer just before the
     * chunk's products, so B goes from its rows into L2 once and never to
     * memory. With K in chunks the rows of A are read again for every
     * column group, so there are then as many groups as threads (256 x 768
     * x 50304: A is 26 MB); with K in one chunk, groups of up to NC
     * columns, halved until every thread has 2 (each group then packs
     * wider pieces of B's rows: on the Xeon with AMX, 2 threads, cold
     * weights, 4-6 rounds interleaved against 8 a thread: 256 x 768 x 768
     * 0.78, 256 x 3072 x 768 0.89, 256 x 2304 x 768 0.95, 512 rows
     * 0.82-0.97, 128 rows 0.98-1.01; warm 0.84-0.97). The macro block's sums
     * (mcb x ncb blocks) stay within BJIT_BLOCKS (6 MiB a thread): 2048 x
     * 3072 x 3072 (12 MiB) ran 20% slower so. On the Xeon with AMX, 2
     * threads, cold operands, interleaved against packing B first: 256 x
     * 2304 x 768 0.89 -> 0.58 ms, 256 x 768 x 3072 1.30 -> 0.73, 256 x 768
     * x 50257 23.4 -> 15.6, 2048 x 768 x 3072 (bf16 result) 5.5 -> 4.5;
     * 1024 rows and more with K in one chunk 8-18% slower, so not there.
     * With K in chunks a macro block's panels are also halved until they
     * are at most BJIT_CHUNK_PANELS, so the chunk of B they pack (16 K
     * steps of 2 KiB a panel: 768 KiB) stays in L2 while every row block
     * passes over it: a 768-row weight gradient against 3072 columns (K =
     * 2048, a GPT-2 c_fc's at B=8 T=256) packed 48 panels, 1.5 MiB a
     * chunk, and read them back from L3 for each of its 24 row blocks. On
     * the Xeon with AMX, 2 threads, 3 rounds interleaved: 768 x 3072 x
     * 2048 (A^T B) 6.3-8.1 -> 4.5-4.8 ms, 768 x 2304 x 2048 3.7-4.2 ->
     * 3.4-3.6; 16 and 12 panels no better. The macro block's sums are
     * counted at those panels, so more products pack their chunks so:
     * GPT-2 medium's weight gradients 1024 x 4096 x 2048 (and 4096 x 1024,
     * transposed, see dt__amx_gemm) 9.1-9.2 -> 7.1-7.5 ms (B packed whole
     * before). A language model head's transposed weight gradient did not
     * gain from it (50257 x 768 x 2048: 84-92 ms either way).
     * (A^T in private rows keeps its own blocks: each thread would
     * transpose all of A^T.) */
    const int64_t jncb = kb > KC_ONE ? cdiv(nnb, nt) : NC / BLK;
    p.bjit = !g->pb && !g->tb && p.v && kb && !p.aprivate &&
             (M <= SWAP_ROWS || (kb > KC_ONE && nmb * min64(jncb, BJIT_CHUNK_PANELS) <= BJIT_BLOCKS));
    /* A plain product (its partial sums through C itself) whose B is packed
     * where used, with K in chunks and at least 512 rows (a language model
     * head's input gradient dlogits W, K the vocabulary): the macro block's
     * C (every row, a thread's columns: 3 MiB at 2048 x 768) is read and
     * written once a chunk, so its chunks take KC_PLAIN steps, not KC; its
     * chunk of B (12 panels for 768 columns on 2 threads: 768 KiB) still
     * fits L2. Chunks change no sum's order (C holds the f32 sums between
     * them): the same bits. On the Xeon with AMX, 2 threads, cold operands,
     * medians of 5-7 rounds interleaved: x 768 x 50257 at 512 rows 28.2 ->
     * 24.1 ms, 1024 rows 51.2 -> 44.0, 2048 rows 96.5 -> 82.8, 4096 rows
     * 187.5 -> 159.9 (48 steps: the same to 4% slower); 2048 x 768 x 2048
     * (a Llama MLP's input gradient, 12 layers) 42.3 -> 41.4; at 256 rows
     * (C 384 KiB a thread) 14.7 -> 15.0, so not there. Products with an
     * epilogue (their sums in the thread's buffer) and weight gradients ran
     * slower with longer chunks (2048 x 768 x 3072 with a bias 51.8 -> 53.0
     * for 12 layers, 768 x 2304 x 2048 47.7 -> 52.0). Its panels are halved
     * like the others' below, to keep the chunk of B at 768 KiB: 1024 x 1536
     * x 8192, 24 panels a thread, 17.5 ms at KC, 18.9 at KC_PLAIN, 16.8 at
     * KC_PLAIN with 12. */
    p.chunk = kb <= KC_ONE ? kb : p.plain && p.bjit && nmb >= 16 ? KC_PLAIN : KC;
    if (p.bjit) {
        p.mcb = nmb;
        p.ncb = jncb;
        while (kb <= KC_ONE && cdiv(nnb, p.ncb) < 2 * (int64_t)nt && p.ncb > 1)
            p.ncb /= 2;
        while (nmb * p.ncb > BJIT_BLOCKS && p.ncb > 1)
            p.ncb = cdiv(p.ncb, 2);
        while (kb > KC_ONE && p.ncb * p.chunk > BJIT_CHUNK_PANELS * KC) /* a chunk of B at most 768 KiB */
            p.ncb = cdiv(p.ncb, 2);
    }
    /* With K in one chunk a 32-row block's sums are complete once it has
     * crossed the macro block's panels: the epilogue then writes them out
     * at once, from a buffer of 32 rows that stays in L1 and L2, instead of
     * the whole macro block's (up to 3 MiB a thread: a language model
     * head's weight gradient in blocks of 4 MC rows) going through the
     * caches to the end. On the Xeon with AMX, 2 threads, cold operands,
     * 15 rounds interleaved: GPT-2's B=4 T=64 forward products (256 x 2304
     * x 768 and the other three, 12 layers) 31.0 -> 29.8 ms, its weight
     * gradients (768 x 2304 x 256, ...) 26.9 -> 26.2, the head's weight
     * gradient (50257 x 768 x 256) 13.9 -> 9.7; the forward at 2048 rows
     * 0.98. Not for a transposed result (ct): its epilogue then writes 32
     * values of each result row at a time, and GPT-2's input gradients and
     * logits at 256 rows ran 3-7% slower. */
    p.rowwise = !p.plain && !ct && p.chunk >= kb;
    const int64_t nmg = cdiv(nmb, p.mcb), nmacro = nmg * cdiv(nnb, p.ncb);
    if (nt > nmacro)
        nt = (int)nmacro;
    /* scratch: op(A)'s copy or K tail, packed B, the threads' sum buffers */
    int64_t ldt = kb * KSTEP + KSTEP; /* the transposed copy's rows */
    size_t na = p.aprivate ? up64((size_t)(nt * p.mcb * BLK * ldt))
                : g->ta    ? up64((size_t)(M * ldt))
                : K % KSTEP ? up64((size_t)(M * KSTEP))
                           : 0;
    size_t nb = g->pb || p.bjit ? 0 : up64((size_t)(nnb * kb) * 2 * TILE);
    const size_t bchunk = p.bjit ? (size_t)(p.ncb * p.chunk) * 2 * TILE : 0; /* a thread's B chunk */
    const size_t macro_floats = (size_t)((p.rowwise ? 1 : p.mcb) * BLK * acc_ld(&p));
    size_t nacc = p.plain ? 0 : (size_t)nt * macro_floats * 2;
    size_t nflag = up64(2 * (size_t)(nmb + nnb) * sizeof(_Atomic int) / sizeof(uint16_t));
    uint16_t *buf = scratch_get(na + nb + nacc + nflag + nt * bchunk);
    if (!buf)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the packed panels (%lld x %lld x %lld)", fn,
                        (long long)M, (long long)N, (long long)K);
    if (g->ta) {
        p.a = buf;
        p.lda = ldt;
        p.kfull = kb;
    } else {
        p.a = g->A;
        p.lda = g->lda;
        p.kfull = K / KSTEP;
        p.atail = K % KSTEP ? buf : NULL;
    }
    p.adst = buf;
    p.bdst = buf + na;
    p.pb = g->pb ? g->pb->data : p.bdst;
    float *accbuf = (float *)(buf + na + nb);
    _Atomic int *flags = (_Atomic int *)(buf + na + nb + nacc);
    uint16_t *bchunks = buf + na + nb + nacc + nflag;
    for (int64_t i = 0; i < nmb + nnb; i++)
        atomic_init(&flags[i], 0);
    /* B row-major: packed by all threads before the products (see the top) */
    bool bsteps = !g->pb && !g->tb && p.v && kb && !p.bjit;
    if (((g->ta && !p.aprivate) || p.atail) && kb)
        p.aflag = flags;
    if (!g->pb && kb && !bsteps && !p.bjit)
        p.bflag = flags + nmb;
    bool bad = false;
#pragma omp parallel num_threads(nt) reduction(| : bad)
    {
        /* macro blocks in column-group order (consecutive ones share a group of B panels), handed
         * out one at a time: a thread the OS holds back delays the call by one macro block at most */
        float *tb = accbuf;
        uint16_t *ta = p.aprivate ? buf : NULL, *tbj = bchunks;
#ifdef _OPENMP
        tb += (size_t)omp_get_thread_num() * macro_floats;
        if (ta)
            ta += (size_t)omp_get_thread_num() * (size_t)(p.mcb * BLK * ldt);
        tbj += (size_t)omp_get_thread_num() * bchunk;
#endif
#if DT__X86_VEC
        if (bsteps) {
#pragma omp for schedule(static)
            for (int64_t ks = 0; ks < kb; ks++)
                pack_b_steps_n(g->B, g->ldb, K, N, kb, ks, ks + 1, 0, nnb, p.bdst + ks * 2 * TILE);
        }
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < nmacro; i++)
            bad |= run_macro(tiles, &p, i % nmg, i / nmg, tb, ta, tbj);
#if DT__X86_VEC
        _mm_sfence(); /* the epilogue's streaming stores (a large bf16 result) before anyone reads them */
#endif
        tiles_release();
    }
    if (g->finite)
        *g->finite = !bad;
    return DT_OK;
}

/* g's product computed as its transpose, C^T = op(B)^T op(A)^T: the stored
 * B is the A operand and the stored A the B operand (a stored N x K B is an
 * A of N rows read as it is, a stored K x N B one read transposed; likewise
 * for A as B), and the epilogue writes the result back transposed. */
static dt_status gemm_transposed(const dt__amx_tiles *tiles, const dt__amx_gemm_args *g)
{
    dt__amx_gemm_args t = *g;
    t.ta = !g->tb, t.tb = !g->ta;
    t.M = g->N, t.N = g->M;
    t.A = g->B, t.lda = g->ldb;
    t.B = g->A, t.ldb = g->lda;
    return gemm_run(tiles, &t, true);
}

dt_status dt__amx_gemm(const dt__amx_tiles *tiles, const dt__amx_gemm_args *g)
{
    const char *fn = "dt__amx_gemm";
    if (!tiles || !g)
        return dt_error(DT_ERR_NULL, "%s: tiles or args is NULL", fn);
    dt_status st = check_args(fn, g);
    if (st >= 0 && g->finite && (g->M == 0 || g->N == 0))
        *g->finite = true; /* nothing stored */
    if (st < 0 || g->M == 0 || g->N == 0)
        return st;
    /* Few rows (M <= 512) against many more columns of a B given as B^T
     * (a weight stored [N, K]: a layer's input gradient, a head's logits,
     * at a small batch): the product runs transposed, C^T = (the stored
     * B) A^T, so the weight is read in place as the A operand and only A
     * (M x K) is packed, instead of the N x K weight every call; the
     * epilogue writes the transpose back (the same sums: each is the same
     * dot product in the same K order, so the same bits). On the Xeon with AMX, 2
     * threads, GPT-2's bf16 step at B=4 T=64 (256 rows; its input
     * gradients and the LM head's logits so): 385 -> 373 ms, the forward
     * 99 -> 92, interleaved, 4 rounds. */
    if (g->tb && !g->ta && !g->pb && g->act == DT__AMX_ACT_NONE && !g->keep && g->K > 0 && g->M <= SWAP_ROWS &&
        g->N >= 2 * g->M)
        return gemm_transposed(tiles, g);
    /* A^T B with K in chunks and more rows than columns (a weight
     * gradient X^T dY whose layer has more inputs than outputs: GPT-2's
     * c_proj of the MLP, 3072 x 768 x 2048 at B=8 T=256) runs transposed
     * too, C^T = B^T A: the narrower operand (dY) is the one transposed
     * into A's copy and the wider one (X) is packed as B, row pairs
     * interleaved, which costs less than its transpose did; the epilogue
     * writes C back transposed (again the same sums, so the same bits).
     * Up to 4096 rows: a language model head's weight gradient (50257
     * rows) keeps its private rows of A^T. On the Xeon with AMX, 2
     * threads, 3 rounds interleaved: 3072 x 768 x 2048 5.8-6.2 -> 4.3-5.0
     * ms. With K in one chunk (K = 256) the other way round was slower
     * (768 x 3072 x 256 transposed 0.79-0.93 -> 0.97-1.03), so not there. */
    if (g->ta && !g->tb && !g->pb && g->act == DT__AMX_ACT_NONE && !g->keep && cdiv(g->K, KSTEP) > KC_ONE &&
        g->M > g->N && g->M <= 4096)
        return gemm_transposed(tiles, g);
    return gemm_run(tiles, g, false);
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

/* DT_AMX_GEMM: "on" (or 1) runs every bf16 product of dt_k_matmul here;
 * "off" (or 0) none (oneDNN runs them, on AMX with its own brgemm kernels);
 * "auto" (the default) the products dt__amx_auto_picks: every dimension at
 * least 256 and at least 2^27 multiply-adds (each of a GPT-2 or ~100M
 * Llama step's GEMMs; not a decode step's rows). On an idle Xeon with AMX
 * (2 threads, 07:03 UTC, load 1.8-1.9) GPT-2's 15 step shapes at 2048 rows
 * through dt_k_matmul, each's best of 3 calls times its count in a step
 * (a check program beside the repository), summed 988-1056 ms with all on
 * this GEMM against 1108-1154 with only the LM head here and the rest on
 * oneDNN 2.6 (three rounds each, interleaved); per shape it was behind oneDNN only on the forward
 * qkv and 768 x 768 products and the c_proj weight gradient, ahead on the
 * input gradients by 1.2-1.3x (1750-1895 against 1450-1665 GFLOP/s) and
 * on the LM head. The whole bf16 step (B=8 T=256): 2015-2060 ms against
 * 2127-2192 (two rounds each). The earlier rule (2^35 multiply-adds and
 * every dimension 512: the LM head alone) came from runs on a machine
 * loaded 5-9, where the per-layer products lost wall time to the other
 * work, not to this GEMM.
 * Read once per process. */
static pthread_once_t g_sel_once = PTHREAD_ONCE_INIT;
static int g_sel; /* 0 auto, 1 on, -1 off */

static void select_read(void)
{
    const char *e = getenv("DT_AMX_GEMM");
    if (!e || !*e || !strcmp(e, "auto"))
        return;
    if (!strcmp(e, "on") || !strcmp(e, "1"))
        g_sel = 1;
    else if (!strcmp(e, "off") || !strcmp(e, "0"))
        g_sel = -1;
    else
        dt_log(DT_LOG_WARN, "DT_AMX_GEMM=%s is not one of auto, on, off; ignored (auto)", e);
}

bool dt__amx_auto_picks(int64_t M, int64_t N, int64_t K)
{
    const int64_t least = 256;
    return M >= least && N >= least && K >= least && (double)M * (double)N * (double)K >= 0x1p27;
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
        *why = g_sel > 0    ? "active (DT_AMX_GEMM=on)"
               : g_sel == 0 ? "auto: products of 2^27 multiply-adds or more with every dimension 256 or more (a "
                              "training step's) run here, the rest (decode rows, small products) on oneDNN's AMX "
                              "kernels; DT_AMX_GEMM=on selects dtrain's for all"
                            : "DT_AMX_GEMM=off: oneDNN runs the bf16 products (on AMX itself)";
    return g_sel > 0;
}

bool dt__amx_use_any(void)
{
    if (!dt__amx_tiles_hw(NULL))
        return false;
    pthread_once(&g_sel_once, select_read);
    return g_sel >= 0;
}

bool dt__amx_use(int64_t M, int64_t N, int64_t K)
{
    if (!dt__amx_tiles_hw(NULL))
        return false;
    pthread_once(&g_sel_once, select_read);
    return g_sel > 0 || (g_sel == 0 && dt__amx_auto_picks(M, N, K));
}

bool dt_k_matmul_amx(const char **why) { return dt__amx_active(why); }

dt_status dt__amx_matmul_rows(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, const void *B,
                              uint16_t *Cb, const int32_t *keep, float *Ck, bool *finite)
{
    const dt__amx_tiles *tiles = dt__amx_tiles_hw(NULL);
    if (!tiles)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_k_matmul_lp_rows: AMX is not usable here");
    dt__amx_gemm_args g = {
        .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .A = A, .lda = ta ? M : K, .B = B, .ldb = tb ? K : N,
        .alpha = 1.0f, .Cb = Cb, .ldc = N, .keep = keep, .Ck = Ck, .finite = finite,
        .stream = true, /* a weight's gradient, as dt__amx_matmul_batched's checked ones */
    };
    dt_status st = dt__amx_gemm(tiles, &g);
    if (st < 0)
        *finite = false;
    return st;
}

dt_status dt__amx_matmul_batched(bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                                 const void *A, int64_t sa, const void *B, int64_t sb, float beta, void *C,
                                 bool c_bf16, int64_t sc, const float *bias, bool *finite)
{
    const dt__amx_tiles *tiles = dt__amx_tiles_hw(NULL);
    if (!tiles)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_k_matmul: AMX is not usable here");
    dt__amx_gemm_args g = {
        .ta = ta, .tb = tb, .M = M, .N = N, .K = K,
        .lda = ta ? M : K, .ldb = tb ? K : N,
        .alpha = alpha, .beta = beta, .ldc = N, .bias = bias,
        /* a bf16 result of 1 MiB and more (a layer's output in a training step, a language model
         * head's logits) bypasses the caches, so its lines are not read from memory before they
         * are written (each layer's activations are buffers of their own, cold when the product
         * writes them; the op after reads the result back either way). On the Xeon with AMX, 2
         * threads, GPT-2's forward products over 12 layers' outputs, each read by a pass after it
         * (as attention or GELU reads it), every result streamed against none, medians of 15
         * rounds interleaved: at 256 rows x 2304 x 768 (1.1 MiB) 9.42 -> 7.90 ms, x 3072 x 768
         * 11.31 -> 9.85, the 384 KiB results of x 768 x 768 3.52 -> 3.09 and x 768 x 3072 9.59 ->
         * 9.61; at 2048 rows the four 185.9 -> 167.8. A result the caches still hold (one output
         * buffer over and over): x 2304 and x 3072 0.97, x 768 x 768 1.07, so not below 1 MiB.
         * GPT-2's bf16 step at B=4 T=64 0.978 (5 rounds, 0.970-0.986). The logits (GPT-2's 2048 x
         * 50304 x 768, with the log-sum-exp pass that reads them next) 129-139 -> 124-127 ms. So
         * does a checked one (dt_k_matmul_lp_checked: a weight's gradient, read next by the
         * optimizer): GPT-2's twelve layers' four weight gradients at B=4 T=64 (K = 256), outputs
         * cold, 40.6-41.2 -> 35.4-36.1 ms, the bf16 step 235.9-239.7 -> 231.5-235.3 ms, 4 rounds
         * interleaved */
        .stream = M * N >= ((int64_t)1 << 19) || finite,
    };
    bool fin = true, one = true;
    if (finite)
        g.finite = &one;
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
        if (c_bf16)
            g.Cb = (uint16_t *)C + b * sc;
        else
            g.C = (float *)C + b * sc;
        st = dt__amx_gemm(tiles, &g);
        fin = fin && one;
    }
    dt__amx_packed_b_free(&pb);
    if (finite)
        *finite = st >= 0 && fin;
    return st;
}
