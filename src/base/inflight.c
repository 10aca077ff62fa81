/* The in-flight table (inflight.h): a few entries (one per live reduction
 * engine), behind a mutex; the check is one lock and a scan per optimizer
 * step, nothing on the hot per-element paths. */
#include "base/inflight.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

enum { MAX_ENTRIES = 64, MSG_LEN = 320 };

typedef struct {
    const void *owner;
    uintptr_t lo, hi;
    char msg[MSG_LEN];
} entry;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static entry g_tab[MAX_ENTRIES];
static int g_n;

dt_status dt__inflight_mark(const void *owner, const void *p, size_t bytes, const char *msg)
{
    pthread_mutex_lock(&g_lock);
    int i = 0;
    while (i < g_n && g_tab[i].owner != owner)
        i++;
    if (i == g_n) {
        if (g_n == MAX_ENTRIES) {
            pthread_mutex_unlock(&g_lock);
            return dt_error(DT_ERR_NO_MEMORY, "more than %d reduction engines with reductions in flight",
                            MAX_ENTRIES);
        }
        g_n++;
    }
    g_tab[i].owner = owner;
    g_tab[i].lo = (uintptr_t)p;
    g_tab[i].hi = (uintptr_t)p + bytes;
    snprintf(g_tab[i].msg, sizeof g_tab[i].msg, "%s", msg ? msg : "memory in flight");
    pthread_mutex_unlock(&g_lock);
    return DT_OK;
}

void dt__inflight_clear(const void *owner)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n; i++)
        if (g_tab[i].owner == owner) {
            g_tab[i] = g_tab[--g_n];
            break;
        }
    pthread_mutex_unlock(&g_lock);
}

dt_status dt__inflight_check(const char *who, const void *p, size_t bytes)
{
    if (!g_n) /* racy read, benign: an entry is added before its reductions are posted by this thread */
        return DT_OK;
    const uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    dt_status st = DT_OK;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n; i++)
        if (lo < g_tab[i].hi && g_tab[i].lo < hi) {
            st = dt_error(DT_ERR_STATE, "%s: %s", who, g_tab[i].msg);
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return st;
}
