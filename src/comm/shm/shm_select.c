/* Algorithm selection for the shm backend: a table of byte ranges per
 * collective, defaults below, overridable with DT_SHM_ALGO (in the spirit of
 * UCC's score maps, e.g. UCC_TL_UCP_TUNE=allreduce:0-4k:@ring).
 *
 * Syntax:  DT_SHM_ALGO = entry [';' entry]...
 *          entry       = coll ':' range ':' algo [',' range ':' algo]...
 *                      | coll ':' algo                 (every size)
 *          range       = lo '-' hi     half-open [lo, hi) in bytes of the
 *                        message (allreduce/reduce/broadcast: the vector;
 *                        allgather/gather: one rank's block; reduce_scatter/
 *                        scatter/alltoall: one rank's block too), with
 *                        optional K/M/G suffixes (powers of 1024); hi may be
 *                        "inf".
 *          algo        = direct | ring | rechd | tree
 *   e.g.   DT_SHM_ALGO="allreduce:0-64K:direct,64K-inf:ring;broadcast:tree"
 * Later rules win over earlier ones and over the defaults. Which
 * collectives know which algorithms:
 *   allreduce: direct ring rechd tree;  reduce, broadcast: direct tree;
 *   everything else: direct.
 * Messages that fit the small-message slot (DT_SHM_SLOT_BYTES) always go
 * through the slot path, whatever the table says.
 *
 * Defaults: direct everywhere. On one machine every rank can read every
 * peer's buffer, so the direct schemes touch each byte the fewest times;
 * ring, rechd and tree are kept for experiments and for many ranks where
 * the direct scheme's W-way reads stop fitting in cache. */
#include "comm/shm/shm.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_alg_names[] = {"direct", "ring", "rechd", "tree"};
_Static_assert(sizeof k_alg_names / sizeof k_alg_names[0] == SHM_ALG_COUNT, "alg names");

const char *dt__shm_alg_name(shm_alg a)
{
    return (unsigned)a < SHM_ALG_COUNT ? k_alg_names[a] : "?";
}

static int supported(dt_coll_kind k, shm_alg a)
{
    if (a == SHM_ALG_DIRECT)
        return 1;
    if (k == DT_COLL_ALLREDUCE)
        return 1;
    if (k == DT_COLL_REDUCE || k == DT_COLL_BROADCAST)
        return a == SHM_ALG_TREE;
    return 0;
}

static int add_rule(shm_table *t, dt_coll_kind k, uint64_t lo, uint64_t hi, shm_alg a)
{
    if (t->n[k] == SHM_MAX_RULES)
        return -1;
    t->rules[k][t->n[k]++] = (shm_rule){lo, hi, a};
    return 0;
}

static int parse_size(const char *s, const char *e, uint64_t *out)
{
    if (e - s == 3 && !strncmp(s, "inf", 3)) {
        *out = UINT64_MAX;
        return 0;
    }
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    if (end < e) {
        char u = (char)toupper((unsigned char)*end);
        if (u == 'K')
            v <<= 10;
        else if (u == 'M')
            v <<= 20;
        else if (u == 'G')
            v <<= 30;
        else
            return -1;
        end++;
        if (end < e && (*end == 'B' || *end == 'b'))
            end++;
    }
    if (end != e)
        return -1;
    *out = v;
    return 0;
}

static int parse_alg(const char *s, const char *e, shm_alg *a)
{
    for (int i = 0; i < SHM_ALG_COUNT; i++)
        if ((size_t)(e - s) == strlen(k_alg_names[i]) && !strncmp(s, k_alg_names[i], (size_t)(e - s))) {
            *a = (shm_alg)i;
            return 0;
        }
    return -1;
}

dt_status dt__shm_table_init(shm_table *t, const char *env)
{
    memset(t, 0, sizeof *t);
    for (int k = 0; k < DT_COLL_KIND_COUNT; k++)
        add_rule(t, (dt_coll_kind)k, 0, UINT64_MAX, SHM_ALG_DIRECT);
    if (!env || !*env)
        return DT_OK;
    char buf[1024];
    if (strlen(env) >= sizeof buf)
        return dt_error(DT_ERR_INVALID_ARG, "DT_SHM_ALGO is longer than %zu characters",
                        sizeof buf - 1);
    strcpy(buf, env);
    char *save = NULL;
    for (char *ent = strtok_r(buf, ";", &save); ent; ent = strtok_r(NULL, ";", &save)) {
        char *colon = strchr(ent, ':');
        if (!colon)
            return dt_error(DT_ERR_INVALID_ARG,
                            "DT_SHM_ALGO entry \"%s\": expected coll:range:algo", ent);
        *colon = '\0';
        int kind = -1;
        for (int k = 0; k < DT_COLL_KIND_COUNT; k++)
            if (!strcmp(ent, dt_coll_kind_name((dt_coll_kind)k)))
                kind = k;
        if (kind < 0)
            return dt_error(DT_ERR_INVALID_ARG, "DT_SHM_ALGO: unknown collective \"%s\"", ent);
        char *rest = colon + 1, *save2 = NULL;
        for (char *r = strtok_r(rest, ",", &save2); r; r = strtok_r(NULL, ",", &save2)) {
            char *c2 = strchr(r, ':');
            uint64_t lo = 0, hi = UINT64_MAX;
            const char *an = r;
            if (c2) {
                char *dash = strchr(r, '-');
                if (!dash || dash > c2 || parse_size(r, dash, &lo) || parse_size(dash + 1, c2, &hi) ||
                    lo >= hi)
                    return dt_error(DT_ERR_INVALID_ARG,
                                    "DT_SHM_ALGO: bad range in \"%s\" (want lo-hi with lo < hi, "
                                    "sizes like 64K, 1M, inf)",
                                    r);
                an = c2 + 1;
            }
            shm_alg a;
            if (parse_alg(an, an + strlen(an), &a))
                return dt_error(DT_ERR_INVALID_ARG,
                                "DT_SHM_ALGO: unknown algorithm \"%s\" (direct, ring, rechd, tree)",
                                an);
            if (!supported((dt_coll_kind)kind, a))
                return dt_error(DT_ERR_UNSUPPORTED, "DT_SHM_ALGO: %s has no %s algorithm",
                                dt_coll_kind_name((dt_coll_kind)kind), dt__shm_alg_name(a));
            if (add_rule(t, (dt_coll_kind)kind, lo, hi, a))
                return dt_error(DT_ERR_INVALID_ARG, "DT_SHM_ALGO: more than %d rules for %s",
                                SHM_MAX_RULES, dt_coll_kind_name((dt_coll_kind)kind));
        }
    }
    return DT_OK;
}

shm_alg dt__shm_select(const shm_table *t, dt_coll_kind k, uint64_t bytes)
{
    shm_alg a = SHM_ALG_DIRECT;
    for (int i = 0; i < t->n[k]; i++)
        if (bytes >= t->rules[k][i].lo && bytes < t->rules[k][i].hi)
            a = t->rules[k][i].alg;
    return a;
}

uint64_t dt__shm_table_hash(const shm_table *t)
{
    uint64_t h = 0;
    for (int k = 0; k < DT_COLL_KIND_COUNT; k++)
        for (int i = 0; i < t->n[k]; i++) {
            uint64_t v[3] = {t->rules[k][i].lo, t->rules[k][i].hi, (uint64_t)t->rules[k][i].alg};
            h = dt_hash64(v, sizeof v, h ^ (uint64_t)k);
        }
    return h;
}
