/* libFuzzer target for the metrics-file reader of `dtrain plot`
 * (tools/metrics_read.c: dt__metrics_parse, JSON lines read with cJSON from
 * a buffer that is not NUL-terminated; ASan sees any read past it).
 *
 * Any file must give either points or an error "N: problem" naming a line
 * of the file, with nothing left allocated; never a crash. Accepted points
 * must be consistent (nacc evaluations with an accuracy, NaN for the
 * others) and survive a round trip: written back as a metrics file and
 * read again, they give the same numbers. */
// fuzz-sources: tools/metrics_read.c
// fuzz-libs: -lcjson
#include "train.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A double as a JSON number: +-inf (a literal too large for a double) as a
 * literal that reads back as the same inf. */
static int put_num(char *out, size_t cap, double x)
{
    if (isinf(x))
        return snprintf(out, cap, "%s1e999", x < 0 ? "-" : "");
    return snprintf(out, cap, "%.17g", x);
}

static int same(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    dt__metrics_points p, q;
    char err[256] = "";
    if (dt__metrics_parse((const char *)data, size, &p, err, sizeof err) < 0) {
        long line = strtol(err, NULL, 10);
        size_t lines = 1;
        for (size_t i = 0; i < size; i++)
            lines += data[i] == '\n';
        if (line < 1 || (size_t)line > lines || !strstr(err, ": "))
            abort(); /* the message names a line of the file */
        if (p.nstep || p.neval || p.step_x || p.eval_x)
            abort(); /* out is empty after an error */
        return 0;
    }
    size_t nacc = 0;
    for (size_t i = 0; i < p.neval; i++)
        nacc += !isnan(p.eval_acc[i]);
    if (nacc != p.nacc)
        abort();
    for (size_t i = 0; i < p.nstep; i++)
        if (isnan(p.step_x[i]) || isnan(p.step_loss[i]))
            abort(); /* JSON has no NaN */

    /* write the points back and read them again */
    size_t cap = 128 * (p.nstep + p.neval) + 1, k = 0;
    char *buf = malloc(cap);
    if (!buf)
        abort();
    for (size_t i = 0; i < p.nstep; i++) {
        k += (size_t)snprintf(buf + k, cap - k, "{\"event\":\"step\",\"step\":");
        k += (size_t)put_num(buf + k, cap - k, p.step_x[i]);
        k += (size_t)snprintf(buf + k, cap - k, ",\"loss\":");
        k += (size_t)put_num(buf + k, cap - k, p.step_loss[i]);
        k += (size_t)snprintf(buf + k, cap - k, "}\n");
    }
    for (size_t i = 0; i < p.neval; i++) {
        k += (size_t)snprintf(buf + k, cap - k, "{\"event\":\"eval\",\"step\":");
        k += (size_t)put_num(buf + k, cap - k, p.eval_x[i]);
        k += (size_t)snprintf(buf + k, cap - k, ",\"test_loss\":");
        k += (size_t)put_num(buf + k, cap - k, p.eval_loss[i]);
        k += (size_t)snprintf(buf + k, cap - k, ",\"test_accuracy\":");
        if (isnan(p.eval_acc[i]))
            k += (size_t)snprintf(buf + k, cap - k, "null");
        else
            k += (size_t)put_num(buf + k, cap - k, p.eval_acc[i]);
        k += (size_t)snprintf(buf + k, cap - k, "}\n");
    }
    if (k >= cap)
        abort();
    if (dt__metrics_parse(buf, k, &q, err, sizeof err) < 0 || q.nstep != p.nstep ||
        q.neval != p.neval || q.nacc != p.nacc)
        abort();
    for (size_t i = 0; i < p.nstep; i++)
        if (!same(p.step_x[i], q.step_x[i]) || !same(p.step_loss[i], q.step_loss[i]))
            abort();
    for (size_t i = 0; i < p.neval; i++)
        if (!same(p.eval_x[i], q.eval_x[i]) || !same(p.eval_loss[i], q.eval_loss[i]) ||
            !same(p.eval_acc[i], q.eval_acc[i]))
            abort();
    free(buf);
    dt__metrics_points_free(&p);
    dt__metrics_points_free(&q);
    return 0;
}
