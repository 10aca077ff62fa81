/* Leveled logging to stderr; the level comes from DT_LOG_LEVEL once. */
#include "dtrain/base.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Read and written from any thread (a progress or loader thread logs while
 * the main thread may set the level): an atomic, relaxed, since it carries
 * no other data with it. The first reader fills it from DT_LOG_LEVEL with a
 * compare-exchange from -1, so it never overwrites a level set meanwhile. */
static _Atomic int g_level = -1;

dt_log_level dt_log_get_level(void)
{
    int cur = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (cur < 0) {
        const char *e = getenv("DT_LOG_LEVEL");
        int lvl = DT_LOG_WARN;
        bool unknown = false;
        if (e) {
            if (!strcmp(e, "error")) lvl = DT_LOG_ERROR;
            else if (!strcmp(e, "info")) lvl = DT_LOG_INFO;
            else if (!strcmp(e, "debug")) lvl = DT_LOG_DEBUG;
            else unknown = strcmp(e, "warn") != 0;
        }
        if (atomic_compare_exchange_strong_explicit(&g_level, &cur, lvl, memory_order_relaxed,
                                                    memory_order_relaxed)) {
            cur = lvl;
            if (unknown) { /* said once, by the reader that set the level (DT_LOG_LEVEL=DEBUG was silent) */
                char esc[96];
                fprintf(stderr, "dtrain warn: DT_LOG_LEVEL=%s is not one of error, warn, info, debug; ignored (warn)\n",
                        dt_escape(e, esc, sizeof esc));
            }
        }
    }
    return (dt_log_level)cur;
}

void dt_log_set_level(dt_log_level lvl)
{
    atomic_store_explicit(&g_level, (int)lvl, memory_order_relaxed);
}

void dt_log(dt_log_level lvl, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if ((int)lvl > (int)dt_log_get_level())
        return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dtrain %s: %s\n", names[lvl], buf);
}
