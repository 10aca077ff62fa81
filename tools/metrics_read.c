/* Reading a metrics file (`dtrain train --metrics`) for `dtrain plot`.
 *
 * One function over a buffer, so that it can be fuzzed without files: each
 * line is parsed with cJSON (any valid JSON object is accepted; fields the
 * plot does not use, nested or not, are ignored), then checked for what the
 * plot needs. Points grow in doubling arrays. */
#include "train.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int push(double **arr, size_t *cap, size_t n, double x)
{
    if (n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        double *p = realloc(*arr, c * sizeof *p);
        if (!p)
            return -1;
        *arr = p;
        *cap = c;
    }
    (*arr)[n] = x;
    return 0;
}

void dt__metrics_points_free(dt__metrics_points *p)
{
    free(p->step_x);
    free(p->step_loss);
    free(p->eval_x);
    free(p->eval_loss);
    free(p->eval_acc);
    memset(p, 0, sizeof *p);
}

/* A finite number (1e999 parses as infinity: not a value to plot). */
static const cJSON *num_field(const cJSON *o, const char *k)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(f) && isfinite(f->valuedouble) ? f : NULL;
}

/* Present as a number that is not finite. */
static bool nonfinite_field(const cJSON *o, const char *k)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(f) && !isfinite(f->valuedouble);
}

int dt__metrics_parse(const char *buf, size_t n, dt__metrics_points *out, char *err, size_t errn)
{
    memset(out, 0, sizeof *out);
    size_t scap = 0, ecap = 0, cap_tmp;
    double last_step = 0;
    long lineno = 0;
    size_t pos = 0;
    while (pos < n) {
        const char *line = buf + pos;
        const char *nl = memchr(line, '\n', n - pos);
        size_t len = nl ? (size_t)(nl - line) : n - pos;
        pos += len + (nl != NULL);
        lineno++;
        size_t i = 0;
        while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r'))
            i++;
        if (i == len)
            continue;
        const char *end = NULL;
        cJSON *o = cJSON_ParseWithLengthOpts(line, len, &end, false);
        const char *why = NULL;
        if (!o) {
            why = "malformed record: not valid JSON";
        } else {
            /* only white space may follow the object on its line */
            for (const char *q = end; q && q < line + len; q++)
                if (*q != ' ' && *q != '\t' && *q != '\r') {
                    why = "malformed record: text after the JSON value";
                    break;
                }
        }
        const cJSON *ev = NULL;
        if (!why && !cJSON_IsObject(o))
            why = "malformed record: not a JSON object";
        if (!why) {
            ev = cJSON_GetObjectItemCaseSensitive(o, "event");
            if (!cJSON_IsString(ev))
                why = "malformed record: no \"event\" string";
        }
        if (!why && !strcmp(ev->valuestring, "step")) {
            const cJSON *st = num_field(o, "step"), *lo = num_field(o, "loss");
            const bool gap = cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "loss")); /* non-finite: not drawn */
            if (!st || (!lo && !gap)) {
                why = "malformed step record: needs numeric \"step\" and \"loss\" (a finite number or null)";
            } else if (lo) {
                cap_tmp = scap;
                if (push(&out->step_x, &cap_tmp, out->nstep, st->valuedouble) < 0 ||
                    push(&out->step_loss, &scap, out->nstep, lo->valuedouble) < 0)
                    why = "out of memory";
                else
                    out->nstep++, last_step = st->valuedouble;
            }
        } else if (!why && !strcmp(ev->valuestring, "eval")) {
            const cJSON *tl = num_field(o, "test_loss"), *st = num_field(o, "step");
            const cJSON *ac = cJSON_GetObjectItemCaseSensitive(o, "test_accuracy");
            const bool gap = cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "test_loss"));
            if ((!tl && !gap) || (ac && !num_field(o, "test_accuracy") && !cJSON_IsNull(ac)) ||
                nonfinite_field(o, "step")) {
                why = "malformed eval record: needs a \"test_loss\" (a finite number or null; and \"test_accuracy\" "
                      "and \"step\" finite numbers or null)";
            } else if (tl) {
                double acc = ac && cJSON_IsNumber(ac) ? ac->valuedouble : NAN;
                size_t c1 = ecap, c2 = ecap;
                if (push(&out->eval_x, &c1, out->neval, st ? st->valuedouble : last_step) < 0 ||
                    push(&out->eval_loss, &c2, out->neval, tl->valuedouble) < 0 ||
                    push(&out->eval_acc, &ecap, out->neval, acc) < 0)
                    why = "out of memory";
                else
                    out->neval++, out->nacc += !isnan(acc);
            }
        }
        cJSON_Delete(o);
        if (why) {
            snprintf(err, errn, "%ld: %s", lineno, why);
            dt__metrics_points_free(out);
            return -1;
        }
    }
    return 0;
}
