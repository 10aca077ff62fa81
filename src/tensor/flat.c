/* Typed flat buffers and their shard views.
 *
 * A flat is padded so that every rank's equal share starts 64-byte
 * aligned: the padded length is a multiple of world * (64 / element size)
 * (for dtypes of 64 bytes or more, of world). Views carry the global index
 * of their first element, so index arithmetic never changes between a full
 * buffer and a shard of it.
 *
 * Large flats of no group are anonymous mappings rather than dt_calloc's
 * memset heap block: their zeros are the kernel's, committed page by page
 * when written, so the parts of a model's flats a rank never writes (other
 * pipeline stages' parameters and gradients) take no memory. */
#include "dtrain/comm.h"
#include "dtrain/tensor.h"

#include <string.h>
#include <sys/mman.h>

size_t dt_flat_padded(dt_dtype dtype, size_t used, int world)
{
    size_t esz = dt_dtype_size(dtype);
    size_t per = esz && esz < DT_ALIGN ? DT_ALIGN / esz : 1;
    size_t q = per * (size_t)(world > 0 ? world : 1);
    if (used > SIZE_MAX - (q - 1))
        return SIZE_MAX; /* not representable: the round-up would wrap to a small size */
    return (used + q - 1) / q * q;
}

dt_status dt_flat_alloc(dt_flat *f, dt_dtype dtype, size_t used, int world, struct dt_pg *pg)
{
    if (!f)
        return dt_error(DT_ERR_NULL, "dt_flat_alloc: flat is NULL");
    memset(f, 0, sizeof *f);
    size_t esz = dt_dtype_size(dtype);
    if (esz == 0 || world < 1)
        return dt_error(DT_ERR_INVALID_ARG, "dt_flat_alloc: dtype %d, world %d (need a known dtype, world >= 1)",
                        (int)dtype, world);
    size_t total = dt_flat_padded(dtype, used, world);
    if (total == SIZE_MAX || total > SIZE_MAX / esz)
        return dt_error(DT_ERR_RANGE, "dt_flat_alloc: %zu elements of %zu bytes overflow", total, esz);
    void *base = NULL;
    bool mapped = false;
    if (total && !pg && total * esz >= DT_FLAT_MAP_MIN) {
        base = mmap(NULL, total * esz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED)
            return dt_error(DT_ERR_NO_MEMORY, "dt_flat_alloc: mapping %zu bytes failed", total * esz);
        mapped = true;
        dt_advise_huge(base, total * esz); /* the 2 MiB aligned ranges inside: huge pages (alloc.c) */
    } else if (total) {
        base = pg ? dt_pg_alloc(pg, total * esz) : dt_calloc(total * esz);
        if (!base)
            return dt_error_wrap(DT_ERR_NO_MEMORY, "dt_flat_alloc: %zu bytes%s", total * esz,
                                 pg ? " from the process group" : "");
        if (pg)
            memset(base, 0, total * esz);
    }
    *f = (dt_flat){.dtype = dtype, .base = base, .offset = 0, .numel = total, .total = total, .used = used,
                   .world = world, .pg = pg, .owned = true, .mapped = mapped};
    return DT_OK;
}

dt_status dt_flat_alloc_shard(dt_flat *f, const dt_flat *full, int rank, int world, struct dt_pg *pg)
{
    if (!f || !full)
        return dt_error(DT_ERR_NULL, "dt_flat_alloc_shard: %s is NULL", f ? "full" : "flat");
    dt_flat geo = *full, view;
    geo.base = NULL; /* the geometry only: works for meta flats too */
    geo.offset = 0;
    geo.numel = full->total;
    dt_status st = dt_flat_shard(&geo, rank, world, &view);
    if (st < 0)
        return st;
    size_t esz = dt_dtype_size(full->dtype);
    void *base = NULL;
    if (view.numel) {
        base = pg ? dt_pg_alloc(pg, view.numel * esz) : dt_calloc(view.numel * esz);
        if (!base)
            return dt_error_wrap(DT_ERR_NO_MEMORY, "dt_flat_alloc_shard: %zu bytes", view.numel * esz);
        if (pg)
            memset(base, 0, view.numel * esz);
    }
    *f = view;
    f->base = base;
    f->pg = pg;
    f->owned = true;
    f->mapped = false;
    return DT_OK;
}

dt_status dt_flat_wrap(dt_flat *f, dt_dtype dtype, void *base, size_t numel)
{
    if (!f)
        return dt_error(DT_ERR_NULL, "dt_flat_wrap: flat is NULL");
    if (!base && numel)
        return dt_error(DT_ERR_NULL, "dt_flat_wrap: base is NULL for %zu elements", numel);
    if (dt_dtype_size(dtype) == 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_flat_wrap: unknown dtype %d", (int)dtype);
    if (numel > (size_t)PTRDIFF_MAX / dt_dtype_size(dtype))
        return dt_error(DT_ERR_RANGE, "dt_flat_wrap: %zu elements of %zu bytes are more than any buffer holds",
                        numel, dt_dtype_size(dtype));
    *f = (dt_flat){.dtype = dtype, .base = base, .numel = numel, .total = numel, .used = numel, .world = 1};
    return DT_OK;
}

void dt_flat_free(dt_flat *f)
{
    if (!f)
        return;
    if (f->owned && f->base) {
        if (f->mapped)
            munmap(f->base, f->total * dt_dtype_size(f->dtype));
        else if (f->pg)
            dt_pg_dealloc(f->pg, f->base);
        else
            dt_free(f->base);
    }
    memset(f, 0, sizeof *f);
}

dt_status dt_flat_range(const dt_flat *f, size_t lo, size_t hi, dt_flat *view)
{
    if (!f || !view)
        return dt_error(DT_ERR_NULL, "dt_flat_range: %s is NULL", f ? "view" : "flat");
    if (hi < lo || lo < f->offset || hi > f->offset + f->numel)
        return dt_error(DT_ERR_RANGE, "dt_flat_range: [%zu, %zu) is not inside the flat's [%zu, %zu)", lo, hi,
                        f->offset, f->offset + f->numel);
    dt_flat v = *f;
    v.base = f->base ? (char *)f->base + (lo - f->offset) * dt_dtype_size(f->dtype) : NULL;
    v.offset = lo;
    v.numel = hi - lo;
    v.owned = false;
    *view = v;
    return DT_OK;
}

dt_status dt_flat_shard(const dt_flat *f, int rank, int world, dt_flat *view)
{
    if (!f || !view)
        return dt_error(DT_ERR_NULL, "dt_flat_shard: %s is NULL", f ? "view" : "flat");
    if (world < 1 || rank < 0 || rank >= world || f->total % (size_t)world)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_flat_shard: rank %d of world %d over %zu elements (need 0 <= rank < world and "
                        "the total a multiple of world: allocate with that world)",
                        rank, world, f->total);
    size_t n = f->total / (size_t)world;
    return dt_flat_range(f, (size_t)rank * n, (size_t)(rank + 1) * n, view);
}

void *dt_flat_ptr(const dt_flat *f, size_t i)
{
    if (!f || !f->base || i < f->offset || i >= f->offset + f->numel)
        return NULL;
    return (char *)f->base + (i - f->offset) * dt_dtype_size(f->dtype);
}

size_t dt_flat_nbytes(const dt_flat *f) { return f ? f->numel * dt_dtype_size(f->dtype) : 0; }
