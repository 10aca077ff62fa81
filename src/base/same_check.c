/* The same settings on every rank (same_check.h): one sum of a table of
 * hashes, one slot per rank and setting. */
#include "base/same_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double hash32(const char *s, uint64_t salt)
{
    const char *t = s ? s : "\x01(unset)";
    return (double)(dt_hash64(t, strlen(t), salt) & 0xffffffffu);
}

dt_status dt__same_check(int world, int rank, const char *const *names, const char *const *values, int n,
                         dt__same_sum_fn sum, void *ud, const char *who)
{
    if (world <= 1 || rank < 0 || rank >= world)
        return DT_OK;
    const size_t w = (size_t)n + 1; /* [names, field 0 .. n-1] per rank */
    double *v = calloc(w * (size_t)world, sizeof *v);
    if (!v)
        return dt_error(DT_ERR_NO_MEMORY, "%s: %d settings x %d ranks", who, n, world);
    double *mine = v + w * (size_t)rank;
    uint64_t nh = 0x5bd1e995u;
    for (int i = 0; i < n; i++) {
        const char *nm = names[i] ? names[i] : "";
        nh = dt_hash64(nm, strlen(nm), nh);
        mine[1 + i] = hash32(values[i], 0x9e3779b97f4a7c15ull);
    }
    mine[0] = (double)(nh & 0xffffffffu);
    dt_status st = sum(ud, v, (int)(w * (size_t)world));
    if (st < 0) {
        free(v);
        return dt_error_wrap(st, "%s: comparing the settings", who);
    }
    char msg[1536];
    size_t k = 0;
    int nbad = 0;
    for (int r = 1; r < world; r++)
        if (v[w * (size_t)r] != v[0]) {
            k += (size_t)snprintf(msg + k, k < sizeof msg ? sizeof msg - k : 0, "%srank %d passes other settings "
                                  "than rank 0 (another dtrain version?)", nbad++ ? "; " : "", r);
            break;
        }
    const bool other_names = nbad > 0;
    for (int i = 0; i < n && !other_names; i++) {
        char ranks[128];
        size_t rk = 0;
        int c = 0;
        for (int r = 1; r < world; r++)
            if (v[w * (size_t)r + 1 + (size_t)i] != v[1 + (size_t)i]) {
                if (c < 8 && rk < sizeof ranks)
                    rk += (size_t)snprintf(ranks + rk, sizeof ranks - rk, "%s%d", c ? ", " : "", r);
                c++;
            }
        if (!c)
            continue;
        if (c > 8 && rk < sizeof ranks)
            snprintf(ranks + rk, sizeof ranks - rk, " and %d more", c - 8);
        if (k < sizeof msg)
            k += (size_t)snprintf(msg + k, sizeof msg - k, "%s%s differs on rank%s %s", nbad ? "; " : "",
                                  names[i] ? names[i] : "?", c > 1 ? "s" : "", ranks);
        nbad++;
    }
    free(v);
    if (!nbad)
        return DT_OK;
    return dt_error(DT_ERR_MISMATCH, "the ranks were given different settings: %s (from rank 0's; every rank must "
                    "run with the same ones)", msg);
}
