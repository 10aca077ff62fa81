/* CSV files of numbers (data.h dt_dataset_csv_open).
 *
 * Two passes over the text: the first finds the header, the column count
 * and the number of data rows (and checks every row's cell count), the
 * second parses the cells into one f32 feature array (rows, F) and one
 * i64 label column, so nothing is reallocated while parsing. Cells are
 * numbers as dt_parse_double takes them (no nan/inf, no hex) after
 * trimming spaces and one pair of double quotes, and features must fit
 * float32. A cell that opens with a double quote runs to its closing
 * quote (RFC 4180: "" inside is one quote), so a quoted header name may
 * hold commas; a quoted cell must close on its own line. The first line
 * is a header when one of its cells is a name (not empty and not a number
 * to strtod, so "nan", "inf" and "1e999" are not names): a first data row
 * with a missing value is an error at line 1, not a header skipped. Every
 * error names file:line and the column. */
#include "arrays.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CSV ((size_t)1 << 30)
#define MAX_CELL 128

typedef struct line {
    const char *p, *end; /* without the '\n' and a trailing '\r' */
} line;

/* The next line at *pos (advances it); false at the end. */
static bool next_line(const char *s, size_t n, size_t *pos, line *l)
{
    if (*pos >= n)
        return false;
    const char *p = s + *pos, *nl = memchr(p, '\n', n - *pos);
    const char *e = nl ? nl : s + n;
    *pos = nl ? (size_t)(nl - s) + 1 : n;
    l->p = p;
    l->end = e > p && e[-1] == '\r' ? e - 1 : e;
    return true;
}

static bool blank(const line *l)
{
    for (const char *p = l->p; p < l->end; p++)
        if (*p != ' ' && *p != '\t')
            return false;
    return true;
}

/* Where the cell at s ends: at its comma or at end. A cell whose first
 * byte after blanks is a double quote runs to its closing quote ("" inside
 * is a quote), so commas in it are text; *bad when the quote does not close
 * on the line or text other than blanks follows it. */
static const char *cell_end(const char *s, const char *end, bool *bad)
{
    const char *q = s;
    while (q < end && (*q == ' ' || *q == '\t'))
        q++;
    if (q < end && *q == '"') {
        for (q++;; q++) {
            if (q >= end) {
                *bad = true;
                return end;
            }
            if (*q == '"') {
                if (q + 1 < end && q[1] == '"') {
                    q++;
                    continue;
                }
                break;
            }
        }
        q++;
        while (q < end && (*q == ' ' || *q == '\t'))
            q++;
        if (q == end || *q == ',')
            return q;
        *bad = true;
        s = q;
    }
    const char *c = memchr(s, ',', (size_t)(end - s));
    return c ? c : end;
}

/* The next cell of a line (from *p; advances past the comma): trimmed, unquoted,
 * copied into buf (cap MAX_CELL; longer cells are truncated and flagged). */
static bool next_cell(const char **p, const char *end, char *buf, bool *too_long)
{
    if (!*p)
        return false;
    bool bad = false;
    const char *s = *p, *e = cell_end(s, end, &bad);
    *p = e < end ? e + 1 : NULL; /* NULL: that was the last cell */
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    bool quoted = e - s >= 2 && *s == '"' && e[-1] == '"';
    if (quoted)
        s++, e--;
    size_t len = 0;
    *too_long = false;
    for (const char *q = s; q < e; q++) {
        if (quoted && *q == '"' && q + 1 < e && q[1] == '"')
            q++; /* "" in a quoted cell: one quote */
        if (len + 1 >= MAX_CELL) {
            *too_long = true;
            break;
        }
        buf[len++] = *q;
    }
    buf[len] = 0;
    return true;
}

/* The line's cells; *bad when a quoted cell is malformed (cell_end). */
static int count_cells(const line *l, bool *bad)
{
    int n = 1;
    for (const char *p = l->p;; n++) {
        const char *e = cell_end(p, l->end, bad);
        if (e >= l->end)
            return n;
        p = e + 1;
    }
}

/* A header cell: a name, not empty and not a number to strtod (so "nan",
 * "inf", "1e999" or "0x1p3" are cells of a data row, not names). */
static bool is_name(const char *cell)
{
    if (!*cell)
        return false;
    char *end;
    (void)strtod(cell, &end);
    return end == cell || *end;
}

static bool is_number(const char *cell, double *v)
{
    dt_status st = dt_parse_double("cell", cell, -INFINITY, INFINITY, v);
    if (st < 0)
        dt_error_clear();
    return st == DT_OK;
}

dt_csv_params dt_csv_params_default(void) { return (dt_csv_params){.label = NULL}; }

dt_status dt_dataset_csv_from_mem(const void *buf, size_t n, const char *name, const dt_csv_params *p,
                                  dt_dataset **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_csv_from_mem: out is NULL");
    *out = NULL;
    if (!buf && n)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_csv_from_mem: NULL buffer");
    if (!name)
        name = "<memory>";
    dt_csv_params def = dt_csv_params_default();
    if (!p)
        p = &def;
    const char *s = buf;
    if (n >= 3 && !memcmp(s, "\xef\xbb\xbf", 3)) { /* a UTF-8 byte order mark: not part of the first cell */
        s += 3;
        n -= 3;
    }
    char cell[MAX_CELL];
    bool too_long;
    /* pass 1: the first non-blank line decides the columns and the header */
    size_t pos = 0;
    line l;
    long long lineno = 0, first_line = 0;
    int ncol = 0;
    bool header = false;
    int64_t rows = 0;
    while (next_line(s, n, &pos, &l)) {
        lineno++;
        if (blank(&l))
            continue;
        bool bad_quote = false;
        int k = count_cells(&l, &bad_quote);
        if (bad_quote)
            return dt_error(DT_ERR_FORMAT, "csv %s:%lld: a quoted cell does not close on its line, or text follows "
                            "its closing quote", name, lineno);
        if (!ncol) {
            ncol = k;
            first_line = lineno;
            const char *q = l.p;
            while (next_cell(&q, l.end, cell, &too_long))
                header |= is_name(cell);
            if (!header)
                rows++;
            continue;
        }
        if (k != ncol)
            return dt_error(DT_ERR_FORMAT, "csv %s:%lld: %d cells, line %lld has %d: every row needs the same "
                            "columns", name, lineno, k, first_line, ncol);
        rows++;
    }
    if (!ncol)
        return dt_error(DT_ERR_FORMAT, "csv %s: no rows", name);
    if (ncol < 2)
        return dt_error(DT_ERR_FORMAT, "csv %s: one column only (want features and a label column)", name);
    if (!rows)
        return dt_error(DT_ERR_FORMAT, "csv %s: a header and no data rows", name);
    /* the label column */
    int label = ncol - 1;
    if (p->label) {
        int64_t li;
        if (dt_parse_int("label", p->label, 0, ncol - 1, &li) == DT_OK) {
            label = (int)li;
        } else {
            dt_error_clear();
            label = -1;
            if (header) {
                size_t hp = 0;
                line h;
                do
                    next_line(s, n, &hp, &h);
                while (blank(&h));
                const char *q = h.p;
                for (int c = 0; next_cell(&q, h.end, cell, &too_long); c++)
                    if (!too_long && !strcmp(cell, p->label)) {
                        label = c;
                        break;
                    }
            }
            if (label < 0)
                return dt_error(DT_ERR_INVALID_ARG, "csv %s: no column '%s' (%s; or give a 0-based index below %d)",
                                name, p->label, header ? "not in the header" : "the file has no header", ncol);
        }
    }
    /* pass 2 */
    int F = ncol - 1;
    if ((size_t)rows > SIZE_MAX / sizeof(float) / (size_t)F)
        return dt_error(DT_ERR_NO_MEMORY, "csv %s: too many cells", name);
    float *x = malloc((size_t)rows * (size_t)F * sizeof *x);
    int64_t *y = malloc((size_t)rows * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return dt_error(DT_ERR_NO_MEMORY, "csv %s: out of memory (%lld rows)", name, (long long)rows);
    }
    pos = 0;
    lineno = 0;
    int64_t r = 0;
    bool skipped_header = !header;
    dt_status st = DT_OK;
    while (st == DT_OK && next_line(s, n, &pos, &l)) {
        lineno++;
        if (blank(&l))
            continue;
        if (!skipped_header) {
            skipped_header = true;
            continue;
        }
        const char *q = l.p;
        int f = 0;
        for (int c = 0; next_cell(&q, l.end, cell, &too_long); c++) {
            double v;
            if (too_long || !is_number(cell, &v)) {
                st = !cell[0] ? dt_error(DT_ERR_FORMAT, "csv %s:%lld: column %d: an empty cell (missing values are "
                                         "not supported)", name, lineno, c + 1)
                              : dt_error(DT_ERR_FORMAT, "csv %s:%lld: column %d: '%s%s' is not a number%s", name,
                                         lineno, c + 1, cell, too_long ? "..." : "",
                                         is_name(cell) ? "" : " (NaN, infinities and hex are not supported)");
                break;
            }
            if (c != label && isinf((float)v)) {
                st = dt_error(DT_ERR_FORMAT, "csv %s:%lld: column %d: %s is outside float32's range (+-3.4e38)",
                              name, lineno, c + 1, cell);
                break;
            }
            if (c == label) {
                if (v < 0 || v > INT32_MAX || v != floor(v)) {
                    st = dt_error(DT_ERR_FORMAT, "csv %s:%lld: column %d: label %s is not a class id (an integer "
                                  ">= 0)", name, lineno, c + 1, cell);
                    break;
                }
                y[r] = (int64_t)v;
            } else {
                x[(size_t)r * (size_t)F + (size_t)f++] = (float)v;
            }
        }
        r++;
    }
    if (st < 0) {
        free(x);
        free(y);
        return st;
    }
    dt__array xa = {.data = (const unsigned char *)x, .kind = 'f', .itemsize = 4, .ndim = 2,
                    .shape = {rows, F}, .owned = x};
    dt__array ya = {.data = (const unsigned char *)y, .kind = 'i', .itemsize = 8, .ndim = 1,
                    .shape = {rows}, .owned = y};
    snprintf(xa.name, sizeof xa.name, "%s", name);
    snprintf(ya.name, sizeof ya.name, "%s (labels)", name);
    return dt__dataset_rows(&xa, &ya, out);
}

dt_status dt_dataset_csv_open(const char *path, const dt_csv_params *p, dt_dataset **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_csv_open: out is NULL");
    *out = NULL;
    if (!path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_csv_open: path is NULL");
    dt__map m;
    dt_status st = dt__map_open(path, "csv", &m);
    if (st < 0)
        return st;
    if (m.size > MAX_CSV)
        st = dt_error(DT_ERR_IO, "csv %s: larger than %zu MiB", path, MAX_CSV >> 20);
    else
        st = dt_dataset_csv_from_mem(m.data, m.size, path, p, out);
    dt__map_close(&m);
    return st;
}
