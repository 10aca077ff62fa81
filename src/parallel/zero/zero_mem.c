/* ZeRO's memory (zero_impl.h): the units' mapped regions, the page pool of
 * released stage-3 units, the shared buffers of whole units, and the
 * release of whole gradients. The engine (zero.c) gathers into and reduces
 * out of what is mapped here. */
#include "parallel/zero/zero_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- memory ------------------------------------------------------------------------- */

/* Regions of 2 MiB and more are mapped 2 MiB-aligned, their length rounded
 * up to 2 MiB, and marked MADV_HUGEPAGE: a stage-3 unit is released and
 * gathered again every step, and each release returns its pages, so the
 * next gather (or backward) faults them in again; with 4 KiB pages that is
 * one fault per 4 KiB (about half of stage 3's extra CPU time over DDP on
 * gpt-mini), with transparent huge pages one per 2 MiB. Where THP is off,
 * the advice does nothing. */
#define HUGE_SZ ((size_t)2 << 20)

static bool region_huge(size_t bytes)
{
    static _Atomic int thp = -1; /* read once: map, release and unmap must agree on the length */
    int t = thp;
    if (t < 0)
        thp = t = !getenv("DT_ZERO_NO_THP");
    return bytes >= HUGE_SZ && t;
}

static size_t region_len(size_t bytes)
{
    return region_huge(bytes) ? (bytes + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ : bytes;
}

static void *region_map(size_t bytes)
{
    if (!bytes)
        return NULL;
    const int prot = PROT_READ | PROT_WRITE, fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (!region_huge(bytes)) {
        void *p = mmap(NULL, bytes, prot, fl, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    const size_t len = region_len(bytes);
    char *p = mmap(NULL, len + HUGE_SZ, prot, fl, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
    if (a > p)
        munmap(p, (size_t)(a - p));
    if (a + len < p + len + HUGE_SZ)
        munmap(a + len, (size_t)(p + len + HUGE_SZ - (a + len)));
#ifdef MADV_HUGEPAGE
    madvise(a, len, MADV_HUGEPAGE);
#endif
    return a;
}

static void region_unmap(void *p, size_t bytes)
{
    if (p)
        munmap(p, region_len(bytes));
}

/* Give the pages back (they read as zero afterwards). */
void dt__zero_region_release(void *p, size_t bytes)
{
    if (p && bytes)
        madvise(p, region_len(bytes), MADV_DONTNEED);
}


static void live_peak(dt_zero *z)
{
    if (z->live + z->pool_bytes > z->peak_live)
        z->peak_live = z->live + z->pool_bytes;
}

void dt__zero_live_add(dt_zero *z, size_t bytes)
{
    z->live += bytes;
    live_peak(z);
}

/* ---- the page pool ----------------------------------------------------------------------
 *
 * Freeing a stage-3 unit with MADV_DONTNEED returns its pages, and the next
 * gather faults fresh zeroed pages back in (a fault per 4 KiB, or per 2 MiB
 * with THP, plus the zeroing): most of stage 3's extra CPU over DDP. The
 * pool keeps the pages instead and hands them to the next gather, as FSDP's
 * caching allocator and DeepSpeed's parameter buffers do; since the units'
 * addresses are fixed (the model is bound to them), pages move between
 * addresses: mremap(MREMAP_FIXED | MREMAP_DONTUNMAP) moves a range's page
 * tables to another address and leaves the source mapped and empty (it
 * reads as zero, as after MADV_DONTNEED). Moves happen only while no
 * all-gather writes the region. A gather takes pieces from the pool's slots
 * (each slot one mapping) until its region is covered; the rest faults as
 * before. A release moves each piece (a separate mapping: mremap moves
 * within one) into an empty slot while the pool holds under two of the
 * largest units, drops the rest, and remaps the region whole when it was
 * split. Any failure turns the pool off (the pages are dropped): it saves
 * time, never changes values. */

static size_t page_len(size_t bytes)
{
    static size_t pg;
    if (!pg) {
        long v = sysconf(_SC_PAGESIZE);
        pg = v > 0 ? (size_t)v : 4096;
    }
    return (region_len(bytes) + pg - 1) / pg * pg;
}

void dt__zero_pool_init(dt_zero *z)
{
    size_t big = 0, ubig = 0;
    for (int i = 0; i < z->nu; i++)
        if (!z->u[i].resident && z->p.stage == 3 && dt__zero_unit_bytes(&z->u[i]) > ubig) {
            ubig = dt__zero_unit_bytes(&z->u[i]);
            big = page_len(ubig);
        }
    if (!big || !z->p.page_pool || getenv("DT_ZERO_NO_POOL"))
        return;
    z->pool_slot = big;
    z->pool_cap = 2 * ubig; /* two of the largest units' buffers */
    for (int k = 0; k < ZP_SLOTS; k++)
        if (!(z->pool[k].base = region_map(big))) {
            for (int j = 0; j < k; j++) {
                region_unmap(z->pool[j].base, big);
                z->pool[j].base = NULL;
            }
            return; /* no pool: gathers fault as without it */
        }
    z->pool_on = true;
}

void dt__zero_pool_free(dt_zero *z)
{
    for (int k = 0; k < ZP_SLOTS; k++) {
        region_unmap(z->pool[k].base, z->pool_slot);
        z->pool[k].base = NULL;
        z->pool[k].len = z->pool[k].bytes = 0;
    }
    z->pool_bytes = 0;
    z->pool_on = false;
}

static bool move_pages(char *from, size_t len, char *to)
{
    return mremap(from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) != MAP_FAILED;
}

/* Something failed: drop the pool's pages and stop using it. */
static void pool_off(dt_zero *z)
{
    for (int k = 0; k < ZP_SLOTS; k++)
        if (z->pool[k].len) {
            madvise(z->pool[k].base + z->pool[k].off, z->pool[k].len, MADV_DONTNEED);
            z->pool[k].len = z->pool[k].bytes = 0;
        }
    z->pool_bytes = 0;
    z->pool_on = false;
}

/* Before u's gather: move pool pages under its region, from its start. */
void dt__zero_pool_take(dt_zero *z, zunit *u)
{
    u->npc = 0;
    if (!z->pool_on)
        return;
    const size_t L = page_len(dt__zero_unit_bytes(u));
    size_t at = 0;
    while (at < L && u->npc < ZP_SLOTS) {
        const size_t need = L - at;
        int best = -1; /* the smallest piece that covers the rest, else the largest */
        for (int k = 0; k < ZP_SLOTS; k++) {
            const size_t n = z->pool[k].len;
            if (!n)
                continue;
            if (best < 0)
                best = k;
            else {
                const size_t b = z->pool[best].len;
                if (b >= need ? n >= need && n < b : n > b)
                    best = k;
            }
        }
        if (best < 0)
            break;
        const size_t m = z->pool[best].len < need ? z->pool[best].len : need;
        if (!move_pages(z->pool[best].base + z->pool[best].off, m, u->full + at)) {
            pool_off(z);
            break;
        }
        const size_t b = z->pool[best].bytes < m ? z->pool[best].bytes : m; /* the rounding is at the end */
        z->pool[best].off += m;
        z->pool[best].len -= m;
        z->pool[best].bytes -= b;
        z->pool_bytes -= b;
        z->stats.bytes_pooled += m;
        u->pc[u->npc++] = m;
        at += m;
    }
    if (u->npc && at < L)
        u->pc[u->npc++] = L - at; /* the region's own rest */
}

/* Release u's gathered pages: into the pool, or back to the system. */
static void pool_put(dt_zero *z, zunit *u)
{
    const size_t L = page_len(dt__zero_unit_bytes(u)), ub = dt__zero_unit_bytes(u);
    const size_t one = L;
    const size_t *pc = u->npc ? u->pc : &one;
    const int n = u->npc ? u->npc : 1;
    size_t at = 0;
    for (int i = 0; i < n; at += pc[i], i++) {
        int k = 0;
        while (k < ZP_SLOTS && z->pool[k].len)
            k++;
        /* the buffer bytes of [at, at + pc[i]) */
        const size_t b = (at + pc[i] < ub ? at + pc[i] : ub) - (at < ub ? at : ub);
        if (!z->pool_on || k == ZP_SLOTS || z->pool_bytes + b > z->pool_cap)
            continue;
        if (!move_pages(u->full + at, pc[i], z->pool[k].base)) {
            pool_off(z);
            continue;
        }
        z->pool[k].off = 0;
        z->pool[k].len = pc[i];
        z->pool[k].bytes = b;
        z->pool_bytes += b;
        if (z->pool_bytes > z->stats.pool_peak)
            z->stats.pool_peak = z->pool_bytes;
    }
    /* what did not move goes back; a region split into pieces is mapped
     * whole again, so that the next release moves it in one piece */
    bool whole = false;
    if (u->npc > 1) {
        const int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;
        whole = mmap(u->full, region_len(dt__zero_unit_bytes(u)), PROT_READ | PROT_WRITE, fl, -1, 0) != MAP_FAILED;
#ifdef MADV_HUGEPAGE
        if (whole && region_huge(dt__zero_unit_bytes(u)))
            madvise(u->full, region_len(dt__zero_unit_bytes(u)), MADV_HUGEPAGE);
#endif
    }
    if (u->npc > 1 && !whole)
        pool_off(z); /* the region stays split: mremap would refuse its next release */
    if (!whole)
        dt__zero_region_release(u->full, dt__zero_unit_bytes(u)); /* moved ranges are empty: nothing to do there */
    u->npc = 0;
    live_peak(z);
}

void dt__zero_live_sub(dt_zero *z, size_t bytes) { z->live = bytes > z->live ? 0 : z->live - bytes; }


/* Free a stage-3 unit's gathered parameters. */
void dt__zero_unit_reshard(dt_zero *z, zunit *u)
{
    if (u->resident || !u->gathered || u->ag)
        return;
    dt__zero_live_sub(z, dt__zero_unit_bytes(u));
    pool_put(z, u);
    u->gathered = false;
    u->prefetched = false;
}

/* ---- shared buffers ----------------------------------------------------------------------
 *
 * The buffers the collectives of whole units read and write, stage 1's
 * whole gradients (the reduce-scatter's input and output) and a resident
 * unit's whole parameters (the after-step all-gather's), come from
 * dt_pg_alloc when it has room: the shm backend then reduces and gathers
 * straight out of the peers' buffers instead of copying each piece
 * through its staging area (about 3% of a gpt-mini stage-1 step on 2
 * ranks), as DDP's gradient buffer does. They are never released (stage 1
 * zeroes its gradients instead, resident units stay whole), so the page
 * games of the regions above do not apply to them. Not with hybrid
 * sharding or hierarchical reductions (other groups); a full arena falls
 * back to a region. */

void *dt__zero_buf_map(dt_zero *z, size_t bytes, bool want_shared, bool *shared)
{
    *shared = false;
    if (want_shared && bytes && z->W > 1 && !z->spg && !z->p.hierarchical) {
        void *p = dt_pg_alloc(z->pg, bytes);
        if (p) {
            memset(p, 0, bytes); /* its contents are undefined; a region reads as zero */
            *shared = true;
            return p;
        }
        dt_error_clear();
    }
    return region_map(bytes);
}

void dt__zero_buf_unmap(dt_zero *z, void *p, size_t bytes, bool shared)
{
    if (shared)
        dt_pg_dealloc(z->pg, p);
    else
        region_unmap(p, bytes);
}

static void buf_release(void *p, size_t bytes, bool shared)
{
    if (shared && p)
        memset(p, 0, bytes);
    else
        dt__zero_region_release(p, bytes);
}

/* Release a unit's whole gradients (they were reduced, or are not needed). */
void dt__zero_release_grads(dt_zero *z, zunit *u)
{
    if (!u->grads_live)
        return;
    buf_release(u->gfull, dt__zero_unit_bytes(u), u->gred_sh && !u->rfull);
    if (u->rfull && z->p.stage >= 2) /* stage 1 steps its slice of rfull */
        buf_release(u->rfull, dt__zero_unit_rbytes(u), u->gred_sh);
    u->grads_live = false;
    if (z->p.stage >= 2)
        dt__zero_live_sub(z, dt__zero_unit_bytes(u));
}

/* Stage 1, a new step: zero the last step's whole gradients but this
 * rank's range, which the optimizer zeroed as it stepped it (the caller's
 * contract, parallel.h; the trainer's fused pass does it). Releasing the
 * region instead (as stages 2/3 do) would make backward fault every page
 * back in and the kernel clear it: the whole buffer each step, about 4% of
 * a gpt-mini step on 2 ranks, against (W-1)/W of it written here. With a
 * reduce dtype the unit's own gradients are all zeroed (the optimizer
 * zeroed its slice of rfull, which each reduction rewrites whole). */
void dt__zero_clear_grads(zunit *u, int rank)
{
    if (!u->grads_live)
        return;
    const size_t lo = u->rfull ? 0 : (size_t)rank * u->c * u->es, hi = u->rfull ? 0 : lo + u->c * u->es;
    memset(u->gfull, 0, lo);
    memset(u->gfull + hi, 0, dt__zero_unit_bytes(u) - hi);
}

void dt__zero_grads_touch(dt_zero *z, zunit *u)
{
    if (u->grads_live)
        return;
    u->grads_live = true;
    if (z->p.stage >= 2)
        dt__zero_live_add(z, dt__zero_unit_bytes(u));
}
