/* Merging the ranks' trace files (dt_trace_merge, trace.h) and reading a
 * trace back (dt__trace_read, for the merge and `dtrain trace`).
 *
 * The merge concatenates the ranks' events, moves time 0 to the earliest
 * event of any rank, and matches each collective across the ranks of its
 * group by (group, group_lead, seq): the last rank to start it is the one
 * the others waited for, and each rank's wait for it (`wait_peers_us`) is
 * the last start less its own (a send and its receive are matched the same
 * way, by group, direction and the pair's sequence number). The start of
 * a collective on a rank is when
 * its executor began running it (queued time excluded), so that wait is
 * the part of the span spent for the peers, the rest moving data. */
#define _POSIX_C_SOURCE 200809L
#include "base/json_strict.h"
#include "base/trace_impl.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_TRACE_BYTES ((size_t)1 << 31)

dt_status dt__trace_read(const char *path, cJSON **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return dt_error(DT_ERR_IO, "trace file '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > MAX_TRACE_BYTES) {
        close(fd);
        return dt_error(DT_ERR_FORMAT, "trace file '%s': not a regular file of at most 2 GiB", path);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *txt = malloc(n + 1);
    if (!txt) {
        close(fd);
        return dt_error(DT_ERR_NO_MEMORY, "trace file '%s': %zu bytes", path, n);
    }
    while (got < n) {
        ssize_t k = read(fd, txt + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    if (got != n) {
        free(txt);
        return dt_error(DT_ERR_IO, "trace file '%s': short read", path);
    }
    txt[n] = 0;
    cJSON *j = NULL;
    dt_status st = dt__json_parse_strict(txt, n, path, &j);
    free(txt);
    if (st < 0)
        return st;
    cJSON *evs = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
    if (!cJSON_IsArray(evs)) {
        cJSON_Delete(j);
        return dt_error(DT_ERR_FORMAT, "trace file '%s': no \"traceEvents\" array (not a Chrome trace object)", path);
    }
    *out = j;
    return DT_OK;
}

double dt__trace_num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

int dt__trace_int(const cJSON *o, const char *key, int dflt)
{
    const double v = dt__trace_num(o, key, dflt);
    return v >= INT_MIN && v <= INT_MAX ? (int)v : dflt;
}

const char *dt__trace_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

bool dt__trace_coll_key(const cJSON *e, char *key, size_t n)
{
    const char *cat = dt__trace_str(e, "cat"), *ph = dt__trace_str(e, "ph");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (!cat || !ph || strcmp(cat, "comm") || strcmp(ph, "X") || !cJSON_IsObject(a))
        return false;
    const char *g = dt__trace_str(a, "group");
    if (!g || cJSON_GetObjectItemCaseSensitive(a, "peer") || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(a, "seq")))
        return false;
    snprintf(key, n, "%s@%d#%020.0f", g, dt__trace_int(a, "group_lead", 0), dt__trace_num(a, "seq", 0));
    return true;
}

bool dt__trace_p2p_key(const cJSON *e, int rank, char *key, size_t n)
{
    const char *cat = dt__trace_str(e, "cat"), *ph = dt__trace_str(e, "ph"), *name = dt__trace_str(e, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (!cat || !ph || !name || strcmp(cat, "comm") || strcmp(ph, "X") || !cJSON_IsObject(a))
        return false;
    const char *g = dt__trace_str(a, "group");
    const int peer = dt__trace_int(a, "peer", -1), send = !strcmp(name, "send");
    if (!g || peer < 0 || (!send && strcmp(name, "recv")))
        return false;
    snprintf(key, n, "%s@%d:%d>%d#%020.0f", g, dt__trace_int(a, "group_lead", 0), send ? rank : peer,
             send ? peer : rank, dt__trace_num(a, "seq", 0));
    return true;
}

typedef struct coll_ref {
    char key[96];
    cJSON *e;
    double ts;
    int rank;
} coll_ref;

static int ref_cmp(const void *a, const void *b)
{
    const coll_ref *x = a, *y = b;
    return strcmp(x->key, y->key);
}

static void set_num(cJSON *o, const char *k, double v)
{
    cJSON *old = cJSON_GetObjectItemCaseSensitive(o, k);
    if (old)
        cJSON_SetNumberValue(old, v);
    else
        cJSON_AddNumberToObject(o, k, v);
}

dt_status dt_trace_merge(const char *dir, int world, const char *out)
{
    if (!dir || world < 1)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trace_merge: %s", dir ? "world < 1" : "no directory");
    dt_status st = DT_OK;
    cJSON *all = cJSON_CreateObject(), *evs = cJSON_AddArrayToObject(all, "traceEvents");
    coll_ref *refs = NULL;
    size_t nref = 0, capref = 0;
    if (!all || !evs) {
        cJSON_Delete(all);
        return dt_error(DT_ERR_NO_MEMORY, "dt_trace_merge: out of memory");
    }
    cJSON_AddStringToObject(all, "displayTimeUnit", "ms");
    cJSON *od = cJSON_AddObjectToObject(all, "otherData");
    cJSON_AddNumberToObject(od, "world", world);
    double tmin = 1e300;
    for (int r = 0; r < world && st >= 0; r++) {
        char path[4200];
        dt__trace_file(path, sizeof path, dir, r);
        cJSON *j;
        if ((st = dt__trace_read(path, &j)) < 0)
            break;
        cJSON *src = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
        while (src->child) {
            cJSON *e = cJSON_DetachItemViaPointer(src, src->child);
            if (!cJSON_IsObject(e) || dt__trace_int(e, "pid", -1) != r) {
                cJSON_Delete(e);
                st = dt_error(DT_ERR_FORMAT, "trace file '%s': an event that is not an object of process %d", path, r);
                break;
            }
            cJSON_AddItemToArray(evs, e);
            const char *ph = dt__trace_str(e, "ph");
            if (ph && strcmp(ph, "M") && dt__trace_num(e, "ts", 1e300) < tmin)
                tmin = dt__trace_num(e, "ts", 1e300);
            char key[96];
            if (dt__trace_coll_key(e, key, sizeof key) || dt__trace_p2p_key(e, r, key, sizeof key)) {
                if (nref == capref) {
                    size_t nc = capref ? 2 * capref : 1024;
                    coll_ref *nr = realloc(refs, nc * sizeof *nr);
                    if (!nr) {
                        st = dt_error(DT_ERR_NO_MEMORY, "dt_trace_merge: out of memory");
                        break;
                    }
                    refs = nr;
                    capref = nc;
                }
                coll_ref *c = &refs[nref++];
                snprintf(c->key, sizeof c->key, "%s", key);
                c->e = e;
                c->ts = dt__trace_num(e, "ts", 0);
                c->rank = r;
            }
        }
        cJSON_Delete(j);
    }
    if (st >= 0) {
        if (tmin > 1e299)
            tmin = 0;
        for (cJSON *e = evs->child; e; e = e->next) {
            cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
            if (cJSON_IsNumber(ts))
                cJSON_SetNumberValue(ts, (double)(int64_t)((ts->valuedouble - tmin) * 1000.0 + 0.5) / 1000.0);
        }
        if (nref > 1) /* refs is NULL without collectives (an empty trace): qsort's pointer must not be */
            qsort(refs, nref, sizeof *refs, ref_cmp);
        for (size_t i = 0; i < nref;) {
            size_t j = i;
            double last = refs[i].ts;
            int lr = refs[i].rank;
            while (j < nref && !strcmp(refs[j].key, refs[i].key)) {
                if (refs[j].ts > last) {
                    last = refs[j].ts;
                    lr = refs[j].rank;
                }
                j++;
            }
            for (size_t k = i; k < j; k++) {
                cJSON *a = cJSON_GetObjectItemCaseSensitive(refs[k].e, "args");
                double w = last - refs[k].ts, dur = dt__trace_num(refs[k].e, "dur", 0);
                set_num(a, "wait_peers_us", (double)(int64_t)((w < dur ? w : dur) * 1000.0 + 0.5) / 1000.0);
                set_num(a, "last_rank", lr);
            }
            i = j;
        }
        char *txt = cJSON_PrintUnformatted(all);
        char path[4200];
        if (!out)
            dt__trace_file(path, sizeof path, dir, -1);
        else
            snprintf(path, sizeof path, "%s", out);
        if (!txt)
            st = dt_error(DT_ERR_NO_MEMORY, "dt_trace_merge: printing the merged trace");
        else if ((st = dt_file_write_atomic(path, txt, strlen(txt), 0644)) < 0)
            st = dt_error_wrap(st, "trace: writing %s", path);
        free(txt);
    }
    free(refs);
    cJSON_Delete(all);
    return st;
}
