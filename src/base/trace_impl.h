/* src/base/trace_impl.h — reading Chrome trace files back (trace_merge.c),
 * for the merge and the summary. */
#ifndef DT_BASE_TRACE_IMPL_H
#define DT_BASE_TRACE_IMPL_H

#include "dtrain/trace.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

/* The files of a trace directory: DIR/rank-R.json, rank R's timeline (rank >= 0), or DIR/trace.json, the
 * merged one (rank < 0), into buf (capacity n). */
void dt__trace_file(char *buf, size_t n, const char *dir, int rank);
/* Read and parse a trace file (strict JSON, an object with a "traceEvents"
 * array; not through a symlink) into *out (cJSON_Delete it). */
dt_status dt__trace_read(const char *path, cJSON **out);
/* o[key] as a number (dflt when absent or not a number) / a string (NULL). */
double dt__trace_num(const cJSON *o, const char *key, double dflt);
/* An int field: dflt when absent, not a number or outside an int's range (never an out-of-range cast). */
int dt__trace_int(const cJSON *o, const char *key, int dflt);
const char *dt__trace_str(const cJSON *o, const char *key);
/* When e is a collective's span (cat "comm", args group and seq, no peer):
 * its cross-rank identity "group@lead#seq" in key (capacity n). */
bool dt__trace_coll_key(const cJSON *e, char *key, size_t n);
/* When e is a send or receive of rank `rank` (args peer: the other world
 * rank, seq: the pair's message number): "group@lead:src>dst#seq", the
 * same for the send and the receive of one message. */
bool dt__trace_p2p_key(const cJSON *e, int rank, char *key, size_t n);

#endif
