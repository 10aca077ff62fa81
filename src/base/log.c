/* Leveled logging to stderr; the level comes from DT_LOG_LEVEL once. */
#include "dtrain/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1;

dt_log_level dt_log_get_level(void)
{
    if (g_level < 0) {
        const char *e = getenv("DT_LOG_LEVEL");
        int lvl = DT_LOG_WARN;
        if (e) {
            if (!strcmp(e, "error")) lvl = DT_LOG_ERROR;
            else if (!strcmp(e, "info")) lvl = DT_LOG_INFO;
            else if (!strcmp(e, "debug")) lvl = DT_LOG_DEBUG;
        }
        g_level = lvl;
    }
    return (dt_log_level)g_level;
}

void dt_log_set_level(dt_log_level lvl) { g_level = (int)lvl; }

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
