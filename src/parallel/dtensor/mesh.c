/* Process meshes: an N-d array of world ranks, one group per mesh dim.
 *
 * The group of dim d for a member at coordinates c is the line of ranks that
 * differ from c only in c[d]. dt_mesh_init makes all of them with one
 * dt_pg_split per dim: the colour is the row-major index of c with c[d]
 * cleared (the same for every rank of one line, different for other lines),
 * the key is c[d], so the rank in the line's group is the coordinate.
 * Non-members split with DT_PG_NO_COLOR. Before any split the arguments are
 * hashed and the hash compared across the world (one small all-reduce), so
 * ranks that disagree about a mesh fail together instead of forming
 * different groups. A slice (one dim fixed) borrows its parent's groups: a
 * line along another dim stays inside one slice. */
#include "dtrain/mesh.h"

#include <stdio.h>
#include <string.h>

struct dt_mesh {
    dt_pg *world;
    int ndim;
    int shape[DT_MESH_MAX_DIMS];
    int n;                                   /* ranks in the mesh */
    int *ranks;                              /* n world ranks, row-major */
    int wsize;
    int *pos;                                /* wsize entries: world rank -> index, or -1 */
    char names[DT_MESH_MAX_DIMS][DT_MESH_NAME_MAX];
    bool in;                                 /* this rank is in the mesh */
    int coords[DT_MESH_MAX_DIMS];            /* this rank's (when in) */
    dt_pg *groups[DT_MESH_MAX_DIMS];         /* this rank's line per dim (when in) */
    bool owns_groups;
    dt_mesh *parent;                         /* slices */
};

static void index_to_coords(const dt_mesh *m, int idx, int *c)
{
    for (int d = m->ndim - 1; d >= 0; d--) {
        c[d] = idx % m->shape[d];
        idx /= m->shape[d];
    }
}

static int coords_to_index(const dt_mesh *m, const int *c)
{
    int idx = 0;
    for (int d = 0; d < m->ndim; d++)
        idx = idx * m->shape[d] + c[d];
    return idx;
}

/* Fill pos, in and coords from ranks. */
static dt_status mesh_index(dt_mesh *m)
{
    m->pos = dt_alloc((size_t)m->wsize * sizeof(int));
    if (!m->pos)
        return dt_error(DT_ERR_NO_MEMORY, "dt_mesh: out of memory");
    for (int r = 0; r < m->wsize; r++)
        m->pos[r] = -1;
    for (int i = 0; i < m->n; i++)
        m->pos[m->ranks[i]] = i;
    int me = dt_pg_rank(m->world);
    m->in = m->pos[me] >= 0;
    for (int d = 0; d < DT_MESH_MAX_DIMS; d++)
        m->coords[d] = -1;
    if (m->in)
        index_to_coords(m, m->pos[me], m->coords);
    return DT_OK;
}

static dt_status check_args(dt_pg *world, int ndim, const int *shape, const int *ranks,
                            const char *const *names)
{
    const char *f = "dt_mesh_init";
    if (!world || !shape)
        return dt_error(DT_ERR_NULL, "%s: NULL world or shape", f);
    if (ndim < 1 || ndim > DT_MESH_MAX_DIMS)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %d dims; a mesh has 1 to %d", f, ndim,
                        DT_MESH_MAX_DIMS);
    int W = dt_pg_size(world);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1)
            return dt_error(DT_ERR_INVALID_ARG, "%s: dim %d has size %d; sizes must be >= 1", f, d,
                            shape[d]);
        n *= shape[d];
        if (n > W)
            return dt_error(DT_ERR_INVALID_ARG,
                            "%s: the mesh needs more ranks than the world's %d", f, W);
    }
    if (ranks) {
        for (int64_t i = 0; i < n; i++) {
            if (ranks[i] < 0 || ranks[i] >= W)
                return dt_error(DT_ERR_INVALID_ARG,
                                "%s: rank %d at position %lld is outside the world [0, %d)", f,
                                ranks[i], (long long)i, W);
            for (int64_t j = 0; j < i; j++)
                if (ranks[j] == ranks[i])
                    return dt_error(DT_ERR_INVALID_ARG,
                                    "%s: rank %d appears twice (positions %lld and %lld)", f,
                                    ranks[i], (long long)j, (long long)i);
        }
    }
    if (names) {
        for (int d = 0; d < ndim; d++) {
            if (!names[d] || !names[d][0] || strlen(names[d]) >= DT_MESH_NAME_MAX)
                return dt_error(DT_ERR_INVALID_ARG,
                                "%s: name of dim %d must be 1 to %d characters", f, d,
                                DT_MESH_NAME_MAX - 1);
            for (int e = 0; e < d; e++)
                if (!strcmp(names[d], names[e]))
                    return dt_error(DT_ERR_INVALID_ARG, "%s: dims %d and %d are both named '%s'",
                                    f, e, d, names[d]);
        }
    }
    return DT_OK;
}

/* Compare a hash of the arguments across the world: every rank gets the
 * same verdict. */
static dt_status agree(dt_mesh *m)
{
    uint64_t h = dt_hash64(&m->ndim, sizeof m->ndim, 0x6d657368);
    h = dt_hash64(m->shape, sizeof m->shape, h);
    h = dt_hash64(m->ranks, (size_t)m->n * sizeof(int), h);
    h = dt_hash64(m->names, sizeof m->names, h);
    int64_t v = (int64_t)(h >> 2);
    int64_t buf[2] = {v, -v};
    dt_status st = dt_pg_allreduce(m->world, DT_IN_PLACE, buf, 2, DT_I64, DT_REDUCE_MAX);
    if (st < 0)
        return dt_error_wrap(st, "dt_mesh_init: comparing the mesh across ranks");
    if (buf[0] != v || -buf[1] != v) {
        char s[256];
        return dt_error(DT_ERR_MISMATCH,
                        "dt_mesh_init: ranks were given different meshes (this rank: %s); every "
                        "world rank must build the same mesh, in the same order",
                        dt_mesh_str(m, s, sizeof s));
    }
    return DT_OK;
}

dt_status dt_mesh_init(dt_pg *world, int ndim, const int *shape, const int *ranks,
                       const char *const *names, dt_mesh **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_mesh_init: NULL out");
    *out = NULL;
    dt_status st = check_args(world, ndim, shape, ranks, names);
    if (st < 0)
        return st;
    dt_mesh *m = dt_calloc(sizeof *m);
    if (!m)
        return dt_error(DT_ERR_NO_MEMORY, "dt_mesh_init: out of memory");
    m->world = world;
    m->ndim = ndim;
    m->n = 1;
    for (int d = 0; d < ndim; d++) {
        m->shape[d] = shape[d];
        m->n *= shape[d];
        if (names)
            snprintf(m->names[d], DT_MESH_NAME_MAX, "%s", names[d]);
        else
            snprintf(m->names[d], DT_MESH_NAME_MAX, "d%d", d);
    }
    m->wsize = dt_pg_size(world);
    m->owns_groups = true;
    m->ranks = dt_alloc((size_t)m->n * sizeof(int));
    if (!m->ranks) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_mesh_init: out of memory");
        goto fail;
    }
    for (int i = 0; i < m->n; i++)
        m->ranks[i] = ranks ? ranks[i] : i;
    if ((st = mesh_index(m)) < 0 || (st = agree(m)) < 0)
        goto fail;
    for (int d = 0; d < ndim; d++) {
        int color = DT_PG_NO_COLOR, key = 0;
        if (m->in) {
            int c[DT_MESH_MAX_DIMS];
            memcpy(c, m->coords, sizeof c);
            c[d] = 0;
            color = coords_to_index(m, c);
            key = m->coords[d];
        }
        st = dt_pg_split(world, color, key, &m->groups[d]);
        if (st < 0) {
            dt_error_wrap(st, "dt_mesh_init: group of mesh dim %d ('%s')", d, m->names[d]);
            goto fail;
        }
    }
    *out = m;
    return DT_OK;
fail:
    dt_mesh_free(m);
    return st;
}

void dt_mesh_free(dt_mesh *m)
{
    if (!m)
        return;
    if (m->owns_groups)
        for (int d = m->ndim - 1; d >= 0; d--)
            dt_pg_free(m->groups[d]);
    dt_free(m->pos);
    dt_free(m->ranks);
    dt_free(m);
}

dt_status dt_mesh_slice(dt_mesh *m, int dim, int index, dt_mesh **out)
{
    if (!out || !m)
        return dt_error(DT_ERR_NULL, "dt_mesh_slice: NULL argument");
    *out = NULL;
    char s[256];
    if (m->ndim < 2)
        return dt_error(DT_ERR_INVALID_ARG, "dt_mesh_slice: %s has one dim; nothing to slice",
                        dt_mesh_str(m, s, sizeof s));
    if (dim < 0 || dim >= m->ndim || index < 0 || index >= m->shape[dim])
        return dt_error(DT_ERR_INVALID_ARG, "dt_mesh_slice: dim %d index %d is outside %s", dim,
                        index, dt_mesh_str(m, s, sizeof s));
    dt_mesh *c = dt_calloc(sizeof *c);
    if (!c)
        return dt_error(DT_ERR_NO_MEMORY, "dt_mesh_slice: out of memory");
    c->world = m->world;
    c->wsize = m->wsize;
    c->parent = m;
    c->ndim = m->ndim - 1;
    c->n = m->n / m->shape[dim];
    for (int d = 0, e = 0; d < m->ndim; d++) {
        if (d == dim)
            continue;
        c->shape[e] = m->shape[d];
        memcpy(c->names[e], m->names[d], DT_MESH_NAME_MAX);
        e++;
    }
    c->ranks = dt_alloc((size_t)c->n * sizeof(int));
    if (!c->ranks) {
        dt_mesh_free(c);
        return dt_error(DT_ERR_NO_MEMORY, "dt_mesh_slice: out of memory");
    }
    int k = 0;
    for (int i = 0; i < m->n; i++) {
        int cc[DT_MESH_MAX_DIMS];
        index_to_coords(m, i, cc);
        if (cc[dim] == index)
            c->ranks[k++] = m->ranks[i];
    }
    dt_status st = mesh_index(c);
    if (st < 0) {
        dt_mesh_free(c);
        return st;
    }
    if (c->in)
        for (int d = 0, e = 0; d < m->ndim; d++)
            if (d != dim)
                c->groups[e++] = m->groups[d];
    *out = c;
    return DT_OK;
}

int dt_mesh_ndim(const dt_mesh *m) { return m ? m->ndim : 0; }

int dt_mesh_size(const dt_mesh *m, int d)
{
    if (!m)
        return 0;
    if (d == -1)
        return m->n;
    return d >= 0 && d < m->ndim ? m->shape[d] : 0;
}

const char *dt_mesh_dim_name(const dt_mesh *m, int d)
{
    return m && d >= 0 && d < m->ndim ? m->names[d] : NULL;
}

int dt_mesh_dim_index(const dt_mesh *m, const char *name)
{
    if (!m || !name)
        return -1;
    for (int d = 0; d < m->ndim; d++)
        if (!strcmp(m->names[d], name))
            return d;
    return -1;
}

const int *dt_mesh_ranks(const dt_mesh *m) { return m ? m->ranks : NULL; }

int dt_mesh_rank_at(const dt_mesh *m, const int *coords)
{
    if (!m || !coords)
        return -1;
    for (int d = 0; d < m->ndim; d++)
        if (coords[d] < 0 || coords[d] >= m->shape[d])
            return -1;
    return m->ranks[coords_to_index(m, coords)];
}

dt_status dt_mesh_coords_of(const dt_mesh *m, int world_rank, int *coords)
{
    if (!m || !coords)
        return dt_error(DT_ERR_NULL, "dt_mesh_coords_of: NULL argument");
    if (world_rank < 0 || world_rank >= m->wsize || m->pos[world_rank] < 0)
        return DT_ERR_NOT_FOUND;
    index_to_coords(m, m->pos[world_rank], coords);
    return DT_OK;
}

bool dt_mesh_contains_self(const dt_mesh *m) { return m && m->in; }

int dt_mesh_coord(const dt_mesh *m, int d)
{
    return m && m->in && d >= 0 && d < m->ndim ? m->coords[d] : -1;
}

dt_pg *dt_mesh_dim_group(const dt_mesh *m, int d)
{
    return m && m->in && d >= 0 && d < m->ndim ? m->groups[d] : NULL;
}

dt_pg *dt_mesh_world(const dt_mesh *m) { return m ? m->world : NULL; }

char *dt_mesh_str(const dt_mesh *m, char *buf, size_t n)
{
    if (!buf || n == 0)
        return buf;
    if (!m) {
        snprintf(buf, n, "NULL mesh");
        return buf;
    }
    size_t k = 0;
    k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "mesh(");
    for (int d = 0; d < m->ndim; d++)
        k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%s=%d", d ? "," : "", m->names[d],
                              m->shape[d]);
    k += (size_t)snprintf(buf + k, k < n ? n - k : 0, ")[");
    for (int i = 0; i < m->n; i++) {
        if (i == 16 && m->n > 17) {
            k += (size_t)snprintf(buf + k, k < n ? n - k : 0, ",...");
            break;
        }
        k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%d", i ? "," : "", m->ranks[i]);
    }
    snprintf(buf + k, k < n ? n - k : 0, "]");
    return buf;
}
