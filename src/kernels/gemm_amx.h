/* src/kernels/gemm_amx.h — dtrain's AMX bf16 GEMM (gemm_amx.c), for the
 * matmul dispatch and the tests.
 *
 *     C (M x N, f32) = alpha op(A) op(B) [+ beta C] [+ bias] [then GELU]
 *
 * with A, B bf16 (raw uint16_t bits), op(X) = X or X^T as in dt_k_matmul,
 * leading dimensions in elements. The driver runs over a tile
 * implementation (amx_tiles.h): the real instructions, or the portable
 * model the tests use on CPUs without AMX. */
#ifndef DT_KERNELS_GEMM_AMX_H
#define DT_KERNELS_GEMM_AMX_H

#include "dtrain/kernels.h"
#include "kernels/amx_tiles.h"

typedef enum {
    DT__AMX_ACT_NONE = 0,
    DT__AMX_ACT_GELU_TANH /* y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) after bias */
} dt__amx_act;

/* B packed once into the tiles' VNNI pair layout, zero-padded to whole
 * K steps (32) and 32-column blocks; reusable by any number of GEMMs with
 * that B. Owned by the caller (dt__amx_packed_b_free) or by the cache
 * below. */
typedef struct {
    int64_t K, N;   /* op(B) is K x N */
    int64_t kb, nb; /* K steps of 32, column blocks of 32 */
    uint16_t *data; /* nb panels of kb steps of 2 tiles of 512 values */
    size_t cap;     /* values allocated */
} dt__amx_packed_b;

typedef struct {
    bool ta, tb;                  /* op(A) = A^T (A stored K x M), op(B) = B^T (B stored N x K) */
    int64_t M, N, K;
    const uint16_t *A;            /* bf16 */
    int64_t lda;                  /* elements between stored rows of A */
    const uint16_t *B;            /* bf16; NULL when pb is given */
    int64_t ldb;
    const dt__amx_packed_b *pb;   /* pre-packed op(B) (K x N), or NULL: B is packed for this call */
    float alpha, beta;            /* beta 0: C is not read */
    float *C;                     /* f32, M x N; NULL when Cb is given */
    uint16_t *Cb;                 /* NULL, or the result rounded to bf16 here (as dt_f32_to_bf16) instead
                                   * of C: then C is NULL and beta 0 */
    int64_t ldc;                  /* elements between rows of C (or Cb) */
    const float *bias;            /* NULL or N floats, added after alpha (and beta C) */
    dt__amx_act act;              /* applied last */
    bool stream;                  /* Cb written with streaming stores where its rows allow (a result
                                   * too large to stay in the caches: no read of its lines first) */
    const int32_t *keep;          /* NULL, or (with Cb) M entries: row r with keep[r] >= 0 goes in f32
                                   * to Ck + keep[r] ldc (as C would hold it), not rounded into Cb */
    float *Ck;                    /* the kept rows' f32 result (with keep) */
    bool *finite;                 /* NULL, or set to whether every value stored is finite (no inf or
                                   * NaN in C, or in Cb after rounding), checked by the epilogue as it
                                   * stores them (a plain product then takes the epilogue too) */
} dt__amx_gemm_args;

/* Run the GEMM on `tiles`. Each thread configures its tiles on its first
 * block (and again only when an edge block needs other tile shapes) and
 * releases them before the call returns, so no thread holds tile state
 * outside a call. The K sum of each output is accumulated in tiles in
 * increasing k order, pairs as tdpbf16ps adds them (between K chunks the
 * partial sum is stored and loaded back exactly), whatever the thread
 * count; the epilogue then computes alpha * acc, + beta * C, + bias, GELU,
 * in that order, rounding each step to f32, and rounds to bf16 last for
 * Cb. */
dt_status dt__amx_gemm(const dt__amx_tiles *tiles, const dt__amx_gemm_args *g);

/* Pack op(B) (K x N; B stored K x N, or N x K when tb) into pb, reusing
 * its buffer when large enough. */
dt_status dt__amx_pack_b(dt__amx_packed_b *pb, bool tb, int64_t K, int64_t N, const uint16_t *B, int64_t ldb);
void dt__amx_packed_b_free(dt__amx_packed_b *pb);

/* The packed-weight cache: dt__amx_gemm with op(B) taken from a packed copy
 * kept under (B's address, tb, K, N, ldb). The copy is reused while
 * `version` is the one it was packed at; a different version repacks it.
 * The caller bumps the version whenever B's contents change (an optimizer
 * step): the cache never reads B to find out. g->pb must be NULL. */
dt_status dt__amx_gemm_cached_b(const dt__amx_tiles *tiles, const dt__amx_gemm_args *g, uint64_t version);
typedef struct {
    uint64_t packs, hits; /* packs made (first use or new version), calls served from a packed copy */
} dt__amx_cache_stats;
void dt__amx_cache_stats_get(dt__amx_cache_stats *out);
/* Drop every packed copy (after weights are freed, or in tests). */
void dt__amx_cache_clear(void);

/* Whether every bf16 product of dt_k_matmul runs on the AMX GEMM in this
 * process (DT_AMX_GEMM=on and the real instructions usable, see amx_hw.c);
 * *why says why not, or which products auto sends here. */
bool dt__amx_active(const char **why);

/* Whether the bf16 product M x N x K of dt_k_matmul runs on the AMX GEMM:
 * the real instructions usable, and DT_AMX_GEMM=on, or auto (the default)
 * and dt__amx_auto_picks. */
bool dt__amx_use(int64_t M, int64_t N, int64_t K);
/* Whether the AMX GEMM may run bf16 products of any shape: the real
 * instructions usable and DT_AMX_GEMM not off (products of varying shapes,
 * matmul.c). */
bool dt__amx_use_any(void);

/* auto's rule, alone (for tests): at least 2^27 multiply-adds and every
 * dimension at least 256 (see gemm_amx.c for the measurements). */
bool dt__amx_auto_picks(int64_t M, int64_t N, int64_t K);

/* dt_k_matmul_batched's bf16 path on the real instructions (arguments as
 * there, already checked); C is f32, or bf16 (c_bf16, beta 0: the sums
 * rounded once, as dt_f32_to_bf16). finite: NULL, or set to whether every
 * value stored is finite (dt__amx_gemm_args.finite; dt_k_matmul_lp_checked). */
dt_status dt__amx_matmul_batched(bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                                 const void *A, int64_t sa, const void *B, int64_t sb, float beta, void *C,
                                 bool c_bf16, int64_t sc, const float *bias, bool *finite);

/* dt_k_matmul_lp_rows on the real instructions (arguments as there, already
 * checked; Cb bf16): the kept rows' f32 sums into Ck, the others rounded
 * into Cb, both checked as stored (*finite). */
dt_status dt__amx_matmul_rows(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, const void *B,
                              uint16_t *Cb, const int32_t *keep, float *Ck, bool *finite);

/* For tests: whether the calling thread holds a tile configuration of the
 * driver's now (always false between calls). */
bool dt__amx_thread_configured(void);

#endif
