/* Aligned allocation, pre-faulting and per-step arenas.
 *
 * The arena keeps a list of blocks. reset() rewinds to the first block; if
 * the last step needed more than one block, the blocks are replaced by one
 * block as large as the peak, committed right away (dt_prefault), so from
 * the second step on every step is served from a single block with no
 * malloc and no page fault at all. Blocks of 2 MiB and more are anonymous
 * mappings aligned to 2 MiB and advised MADV_HUGEPAGE: where the kernel
 * offers transparent huge pages, the first step's growth faults once per
 * 2 MiB instead of once per 4 KiB.
 *
 * dt_alloc gives allocations of 4 MiB and more the same: 2 MiB aligned,
 * rounded up to whole 2 MiB and advised MADV_HUGEPAGE (a model's flats
 * get the advice in flat.c). The passes that stream them (the optimizer's
 * sweep over the master weights and moments, the GEMMs' weight packing)
 * then walk one page table entry per 2 MiB: on a Xeon VM with AMX (Linux
 * with transparent huge pages on "madvise") AdamW's bf16 sweep over 16 M
 * elements took 16.2-16.5 ms on huge pages against 22.9-24.9 on 4 KiB
 * pages, one thread, interleaved. Where the kernel gives no huge pages
 * the advice changes nothing. */
#include "dtrain/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Under AddressSanitizer memory given back to an arena is poisoned until it
 * is handed out again: a read or write of a gradient after backward gave
 * it back is reported where it happens. */
#if defined(__SANITIZE_ADDRESS__)
#define DT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DT_ASAN 1
#endif
#endif
#ifdef DT_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HUGE_SZ ((size_t)2 << 20)
#define HUGE_MIN ((size_t)4 << 20)

void dt_advise_huge(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) / pg * pg, b = ((uintptr_t)p + bytes) / pg * pg;
    if (p && b > a)
        madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

/* Ranges of at least PAR_MIN bytes are committed (dt_prefault) or zeroed
 * (dt_memzero) on the compute threads, in pieces that start on 2 MiB
 * boundaries (a huge page is one thread's): the kernel clears the fresh
 * pages on every core at once. On the AMD EPYC VM with AVX2 (2 cores) the
 * first write of 2 GiB took 1.9-2.0 s on one thread and 0.9-1.0 s on two
 * (4 KiB pages; huge pages 3.7-6.3 s and 0.2-3.5 s, on whether the host
 * still backed them). */
#define PAR_MIN ((size_t)8 << 20)

/* How many pieces [a, b) has: its 2 MiB aligned blocks, the first and
 * the last cut to the range (piece_at gives piece i). */
static int64_t pieces(uintptr_t a, uintptr_t b)
{
    return (int64_t)(((b + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1)) - (a & ~(uintptr_t)(HUGE_SZ - 1))) /
           (int64_t)HUGE_SZ;
}

static void piece_at(uintptr_t a, uintptr_t b, int64_t i, uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t base = a & ~(uintptr_t)(HUGE_SZ - 1);
    uintptr_t s = base + (uintptr_t)i * HUGE_SZ, e = s + HUGE_SZ;
    *lo = s < a ? a : s;
    *hi = e > b ? b : e;
}

size_t dt_prefault(void *p, size_t bytes)
{
    if (!p || !bytes)
        return 0;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) / pg * pg, b = ((uintptr_t)p + bytes) / pg * pg;
    if (b <= a)
        return 0;
#ifdef MADV_POPULATE_WRITE
    if (b - a < PAR_MIN) {
        if (madvise((void *)a, b - a, MADV_POPULATE_WRITE) == 0)
            return b - a;
    } else {
        const int64_t n = pieces(a, b);
        int failed = 0;
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) reduction(| : failed)
        for (int64_t i = 0; i < n; i++) {
            uintptr_t lo, hi;
            piece_at(a, b, i, &lo, &hi);
            failed |= madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) != 0;
        }
        if (!failed)
            return b - a;
    }
#endif
    /* older kernels: touch each page on the thread that will use it */
    const int64_t np = (int64_t)((b - a) / pg);
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) if (np > 256)
    for (int64_t i = 0; i < np; i++) {
        volatile unsigned char *q = (volatile unsigned char *)(a + (uintptr_t)i * pg);
        *q = *q;
    }
    return b - a;
}

void dt_memzero(void *p, size_t bytes)
{
    if (!p || !bytes)
        return;
    if (bytes < PAR_MIN) {
        memset(p, 0, bytes);
        return;
    }
    const uintptr_t a = (uintptr_t)p, b = a + bytes;
    const int64_t n = pieces(a, b);
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads())
    for (int64_t i = 0; i < n; i++) {
        uintptr_t lo, hi;
        piece_at(a, b, i, &lo, &hi);
        memset((void *)lo, 0, hi - lo);
    }
}

size_t dt_decommit(void *p, size_t bytes)
{
    if (!p || !bytes)
        return 0;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    uintptr_t a = (lo + pg - 1) / pg * pg, b = hi / pg * pg;
    if (b <= a) { /* no whole page inside */
        memset(p, 0, bytes);
        return 0;
    }
    memset(p, 0, a - lo);
    memset((void *)b, 0, hi - b);
    madvise((void *)a, b - a, MADV_NOHUGEPAGE);
    if (madvise((void *)a, b - a, MADV_DONTNEED) == 0)
        return b - a;
    memset((void *)a, 0, b - a); /* not given back: zeroed all the same */
    return 0;
}

void *dt_alloc(size_t size)
{
    size_t n = (size + DT_ALIGN - 1) & ~(size_t)(DT_ALIGN - 1);
    if (n == 0)
        n = DT_ALIGN;
    if (n < size) {
        dt_error(DT_ERR_NO_MEMORY, "allocation of %zu bytes overflows", size);
        return NULL;
    }
    void *p;
    if (n >= HUGE_MIN && n <= SIZE_MAX - HUGE_SZ) { /* see the top */
        n = (n + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ;
        if ((p = aligned_alloc(HUGE_SZ, n)))
            dt_advise_huge(p, n);
    } else {
        p = aligned_alloc(DT_ALIGN, n);
    }
    if (!p)
        dt_error(DT_ERR_NO_MEMORY, "out of memory allocating %zu bytes", size);
    return p;
}

void *dt_calloc(size_t size)
{
    void *p = dt_alloc(size);
    if (p)
        dt_memzero(p, size);
    return p;
}

void dt_free(void *p) { free(p); }

typedef struct dt_arena_block {
    struct dt_arena_block *next;
    size_t cap, used;
    unsigned char *data;
    size_t map_len; /* > 0: data is a mapping of that many bytes (block_data) */
} dt_arena_block;

/* A block's memory: a 2 MiB aligned anonymous mapping advised
 * MADV_HUGEPAGE for cap >= 2 MiB, else dt_alloc. */
static unsigned char *block_data(size_t cap, size_t *map_len)
{
    *map_len = 0;
    if (cap < HUGE_SZ)
        return dt_alloc(cap);
    if (cap > SIZE_MAX / 2) { /* no such mapping; (cap + HUGE_SZ - 1) below would wrap */
        dt_error(DT_ERR_NO_MEMORY, "an arena block of %zu bytes is too large", cap);
        return NULL;
    }
    size_t len = (cap + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ;
    unsigned char *m = mmap(NULL, len + HUGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        dt_error(DT_ERR_NO_MEMORY, "out of memory mapping an arena block of %zu bytes", cap);
        return NULL;
    }
    /* keep the 2 MiB aligned [a, a + len), give back the rest */
    unsigned char *a = (unsigned char *)(((uintptr_t)m + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ);
    if (a > m)
        munmap(m, (size_t)(a - m));
    if (m + len + HUGE_SZ > a + len)
        munmap(a + len, (size_t)(m + len + HUGE_SZ - (a + len)));
    dt_advise_huge(a, len);
    *map_len = len;
    return a;
}

/* A dead allocation given back (dt_arena_give_back), for reuse by size. */
typedef struct {
    unsigned char *p;
    size_t n;
} dt_arena_dead;

struct dt_arena {
    dt_arena_block *head, *cur;
    size_t block_size, used, peak;
    dt_arena_dead *dead;
    size_t ndead, dead_cap;
};

static dt_arena_block *block_new(size_t cap)
{
    dt_arena_block *b = malloc(sizeof *b);
    if (!b)
        return NULL;
    b->data = block_data(cap, &b->map_len);
    if (!b->data) {
        free(b);
        return NULL;
    }
    b->cap = cap;
    b->used = 0;
    b->next = NULL;
    return b;
}

static void blocks_free(dt_arena_block *b)
{
    while (b) {
        dt_arena_block *n = b->next;
        if (b->map_len)
            munmap(b->data, b->map_len);
        else
            dt_free(b->data);
        free(b);
        b = n;
    }
}

dt_arena *dt_arena_init(size_t block_size)
{
    dt_arena *a = calloc(1, sizeof *a);
    if (!a) {
        dt_error(DT_ERR_NO_MEMORY, "out of memory allocating an arena");
        return NULL;
    }
    a->block_size = block_size ? block_size : (size_t)4 << 20;
    return a;
}

static void dead_forget(dt_arena *a);

void dt_arena_free(dt_arena *a)
{
    if (!a)
        return;
    dead_forget(a);
    blocks_free(a->head);
    free(a->dead);
    free(a);
}

static size_t round_align(size_t size)
{
    size_t n = (size + DT_ALIGN - 1) & ~(size_t)(DT_ALIGN - 1);
    return n ? n : DT_ALIGN;
}

void dt_arena_give_back(dt_arena *a, void *p, size_t size)
{
    if (!a || !p || size > SIZE_MAX / 2) /* no allocation is that large (dt_arena_alloc) */
        return;
    if (a->ndead == a->dead_cap) {
        size_t cap = a->dead_cap ? 2 * a->dead_cap : 64;
        dt_arena_dead *d = realloc(a->dead, cap * sizeof *d);
        if (!d) /* not reused: it stays the step's until the reset */
            return;
        a->dead = d;
        a->dead_cap = cap;
    }
    const size_t n = round_align(size);
    a->dead[a->ndead++] = (dt_arena_dead){p, n};
    POISON(p, n);
}

/* Forget every given-back allocation (its memory is the bump's again). */
static void dead_forget(dt_arena *a)
{
    for (size_t i = 0; i < a->ndead; i++)
        UNPOISON(a->dead[i].p, a->dead[i].n);
    a->ndead = 0;
}

/* The most recently given back allocation of n bytes, taken off the list. */
static void *reuse(dt_arena *a, size_t n)
{
    for (size_t i = a->ndead; i-- > 0;)
        if (a->dead[i].n == n) {
            void *p = a->dead[i].p;
            a->dead[i] = a->dead[--a->ndead];
            UNPOISON(p, n);
            return p;
        }
    return NULL;
}

void *dt_arena_alloc(dt_arena *a, size_t size)
{
    if (!a) {
        dt_error(DT_ERR_NULL, "dt_arena_alloc: arena is NULL");
        return NULL;
    }
    if (size > SIZE_MAX / 2) { /* rounding up to DT_ALIGN would wrap: never a real request */
        dt_error(DT_ERR_NO_MEMORY, "arena: allocation of %zu bytes is too large", size);
        return NULL;
    }
    size_t n = round_align(size);
    void *old = a->ndead ? reuse(a, n) : NULL;
    if (old)
        return old;
    for (;;) {
        dt_arena_block *b = a->cur;
        if (b && b->cap - b->used >= n) {
            void *p = b->data + b->used;
            b->used += n;
            a->used += n;
            if (a->used > a->peak)
                a->peak = a->used;
            return p;
        }
        if (b && b->next) {
            a->cur = b->next;
            a->cur->used = 0;
            continue;
        }
        size_t cap = n > a->block_size ? n : a->block_size;
        dt_arena_block *nb = block_new(cap);
        if (!nb) {
            dt_error(DT_ERR_NO_MEMORY, "arena: out of memory allocating %zu bytes", size);
            return NULL;
        }
        if (b)
            b->next = nb;
        else
            a->head = nb;
        a->cur = nb;
    }
}

void dt_arena_reset(dt_arena *a)
{
    if (!a)
        return;
    dead_forget(a);
    if (a->head && a->head->next) {
        /* The step spilled into several blocks: replace them by one block
         * large enough for the whole peak. */
        size_t cap = a->peak > a->block_size ? a->peak : a->block_size;
        blocks_free(a->head); /* first: the new block may reuse the memory */
        a->head = block_new(cap);
        if (a->head) /* the next step writes all of it: commit it now, not in the step */
            dt_prefault(a->head->data, cap);
    }
    a->cur = a->head;
    if (a->cur)
        a->cur->used = 0;
    a->used = 0;
}

dt_arena_pos dt_arena_mark(const dt_arena *a)
{
    dt_arena_pos p = {NULL, 0, 0};
    if (a && a->cur)
        p = (dt_arena_pos){a->cur, a->cur->used, a->used};
    return p;
}

/* Was q allocated after mark p: in p's block past its use then, or in a
 * later block? */
static bool after_mark(const dt_arena_pos *p, const unsigned char *q)
{
    for (const dt_arena_block *b = p->block; b; b = b->next)
        if (q >= b->data && q < b->data + b->cap)
            return b != p->block || q >= b->data + p->block_used;
    return false;
}

/* The blocks after the marked one stay on the list: the next allocations
 * move into them again (dt_arena_alloc resets a block's use on entry). */

void dt_arena_rewind(dt_arena *a, dt_arena_pos p)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->ndead;) /* given back, but after the mark: the bump hands it out again */
        if (!p.block || after_mark(&p, a->dead[i].p)) {
            UNPOISON(a->dead[i].p, a->dead[i].n);
            a->dead[i] = a->dead[--a->ndead];
        } else
            i++;
    if (!p.block) { /* marked before the first allocation */
        a->cur = a->head;
        if (a->cur)
            a->cur->used = 0;
        a->used = 0;
        return;
    }
    a->cur = p.block;
    a->cur->used = p.block_used;
    a->used = p.used;
}

size_t dt_arena_used(const dt_arena *a) { return a ? a->used : 0; }
size_t dt_arena_peak(const dt_arena *a) { return a ? a->peak : 0; }

size_t dt_arena_capacity(const dt_arena *a)
{
    size_t n = 0;
    for (const dt_arena_block *b = a ? a->head : NULL; b; b = b->next)
        n += b->cap;
    return n;
}
