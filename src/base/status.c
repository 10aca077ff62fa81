/* Status names and the thread-local error message. */
#include "dtrain/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DT_ERRMSG_CAP 1024

static _Thread_local char tl_msg[DT_ERRMSG_CAP];
static _Thread_local dt_status tl_status;

const char *dt_status_name(dt_status st)
{
    switch (st) {
#define DT__STATUS_NAME(name, val, desc) case DT_##name: return "DT_" #name;
    DT_STATUS_MAP(DT__STATUS_NAME)
#undef DT__STATUS_NAME
    }
    return "DT_UNKNOWN_STATUS";
}

const char *dt_status_str(dt_status st)
{
    switch (st) {
#define DT__STATUS_DESC(name, val, desc) case DT_##name: return desc;
    DT_STATUS_MAP(DT__STATUS_DESC)
#undef DT__STATUS_DESC
    }
    return "unknown status";
}

const char *dt_last_error(void) { return tl_msg; }
dt_status dt_last_status(void) { return tl_status; }

void dt_error_clear(void)
{
    tl_msg[0] = '\0';
    tl_status = DT_OK;
}

/* Messages echo file names and values from outside: control characters in
 * them are escaped (dt_escape) so that printing a message cannot drive the
 * terminal or forge a line. */
dt_status dt_error(dt_status st, const char *fmt, ...)
{
    char raw[DT_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    dt_escape(raw, tl_msg, sizeof tl_msg);
    tl_status = st;
    return st;
}

dt_status dt_error_wrap(dt_status st, const char *fmt, ...)
{
    char old[DT_ERRMSG_CAP], pre[DT_ERRMSG_CAP];
    memcpy(old, tl_msg, sizeof old);
    char raw[DT_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    dt_escape(raw, pre, sizeof pre);
    size_t n = strlen(pre);
    memcpy(tl_msg, pre, n + 1);
    if (old[0] && n + 2 < sizeof tl_msg) {
        memcpy(tl_msg + n, ": ", 2);
        size_t m = strnlen(old, sizeof tl_msg - n - 3);
        memcpy(tl_msg + n + 2, old, m);
        tl_msg[n + 2 + m] = '\0';
    }
    tl_status = st;
    return st;
}
