/* src/kernels/amx_ukernel.h — the AMX micro-kernel, one source text for
 * both tile implementations (amx_tiles.h). Not a normal header: a file
 * defines the tile macros and the names below, then includes it once.
 *
 *   DT__T_ZERO(t)            tilezero tmm<t>
 *   DT__T_LOAD(t, p, ld)     tileloadd tmm<t> from p, ld bytes between rows
 *   DT__T_LOADB(t, p, ld)    the same for a B tile, read once: the hardware
 *                            may take it as a streaming load (tileloaddt1)
 *   DT__T_DP(c, a, b)        tdpbf16ps tmm<c> += tmm<a> . tmm<b>
 *   DT__T_STORE(t, p, ld)    tilestored tmm<t> to p
 *   DT__UK_ATTR              function attributes (target for the hardware)
 *   DT__UK_NAME              the function's name
 *
 * Tile numbers are constants (the instructions encode them). The block is
 * 2 x 2 C tiles at most; two_m / two_n leave out tile row / column 1 at the
 * matrix edges (the driver's configuration gives those tiles no rows). The
 * four shapes are separate loops so no branch runs per K step.
 *
 * A is read in place: K step k of A tile row i is the 32 values at
 * a + (16 i) lda + 32 k, rows lda values apart (op(A) row-major, or the
 * driver's transposed copy). B comes from a packed panel (2 tiles of 512
 * values a K step). The C tiles start at zero, or (acc_in) from c, so a K
 * range can be summed in several calls in increasing k order.
 *
 * pf (or NULL): pfn rows of A (lda apart) whose K steps this call's K
 * steps take into L2 as they go, one line of each row a step, between
 * the tile products (the driver points it at its next row block). */

#define DT__UK_STEP(M2, N2)                                                        \
    do {                                                                           \
        if (acc_in) {                                                              \
            DT__T_LOAD(0, c, ldcb);                                                \
            if (N2)                                                                \
                DT__T_LOAD(1, c + 16, ldcb);                                       \
            if (M2)                                                                \
                DT__T_LOAD(2, c + 16 * ldc, ldcb);                                 \
            if ((M2) && (N2))                                                      \
                DT__T_LOAD(3, c + 16 * ldc + 16, ldcb);                            \
        } else {                                                                   \
            DT__T_ZERO(0);                                                         \
            if (N2)                                                                \
                DT__T_ZERO(1);                                                     \
            if (M2)                                                                \
                DT__T_ZERO(2);                                                     \
            if ((M2) && (N2))                                                      \
                DT__T_ZERO(3);                                                     \
        }                                                                          \
        for (int64_t k = 0; k < kb; k++) {                                         \
            const uint16_t *ak = a + k * DT__AMX_KSTEP;                            \
            const uint16_t *b = pb + k * 2 * DT__AMX_TILE_ELEMS;                   \
            DT__T_LOAD(4, ak, ldab);                                               \
            DT__T_LOADB(6, b, 64);                                                 \
            if (N2)                                                                \
                DT__T_LOADB(7, b + DT__AMX_TILE_ELEMS, 64);                        \
            DT__T_DP(0, 4, 6);                                                     \
            for (int i = 0; i < pfn; i++)                                          \
                __builtin_prefetch(pf + i * lda + k * DT__AMX_KSTEP, 0, 2);        \
            if (N2)                                                                \
                DT__T_DP(1, 4, 7);                                                 \
            if (M2) {                                                              \
                DT__T_LOAD(5, ak + 16 * lda, ldab);                                \
                DT__T_DP(2, 5, 6);                                                 \
                if (N2)                                                            \
                    DT__T_DP(3, 5, 7);                                             \
            }                                                                      \
        }                                                                          \
        DT__T_STORE(0, c, ldcb);                                                   \
        if (N2)                                                                    \
            DT__T_STORE(1, c + 16, ldcb);                                          \
        if (M2)                                                                    \
            DT__T_STORE(2, c + 16 * ldc, ldcb);                                    \
        if ((M2) && (N2))                                                          \
            DT__T_STORE(3, c + 16 * ldc + 16, ldcb);                               \
    } while (0)

DT__UK_ATTR static void DT__UK_NAME(const uint16_t *a, int64_t lda, const uint16_t *pb, int64_t kb, bool two_m,
                                    bool two_n, float *c, int64_t ldc, bool acc_in, const uint16_t *pf, int pfn)
{
    const int64_t ldab = 2 * lda, ldcb = 4 * ldc; /* row strides in bytes */
    if (two_m && two_n)
        DT__UK_STEP(1, 1);
    else if (two_m)
        DT__UK_STEP(1, 0);
    else if (two_n)
        DT__UK_STEP(0, 1);
    else
        DT__UK_STEP(0, 0);
}

#undef DT__UK_STEP
