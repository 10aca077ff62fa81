/* libFuzzer target for the JSON config reader (src/config/): comment and
 * trailing-comma cleaning, cJSON, the error position and its description,
 * the key walk, type/range/support checks, the merge into a config that
 * already holds values, and the effective configuration.
 *
 * Input: byte 0 picks the mode: even, the rest is a config file loaded
 * into a config that already holds a command-line value; odd, the rest is
 * a JSON value set on key number (byte 1) of the table. Checked: every
 * rejection is an error with a message (a syntax error names "fuzz:LINE:COL:"
 * with a line inside the input); the command-line value survives any file;
 * the effective configuration is valid JSON; nothing leaks or crashes. */
// fuzz-sources: src/base/*.c src/config/*.c src/parallel/compress/comm_hooks.c src/parallel/pipeline/kind.c
// fuzz-libs: -lcjson
#include "dtrain/config.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(dt_status st)
{
    if (st >= 0 || dt_last_error()[0] == 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    dt_config *c;
    if (dt_config_init(&c) < 0)
        return 0;
    if (dt_config_set(c, "optimizer.params.lr", "0.25", DT_CONFIG_FROM_CLI, "--lr") < 0)
        abort();
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    dt_error_clear();
    if ((data[0] & 1) == 0) {
        dt_status st = dt_config_load_string(c, "fuzz", text, n);
        if (st < 0) {
            check_error(st);
            if (st == DT_ERR_FORMAT && !strncmp(dt_last_error(), "fuzz:", 5)) {
                int line = 0;
                if (sscanf(dt_last_error() + 5, "%d:", &line) == 1) {
                    size_t lines = 1;
                    for (size_t i = 0; i < n; i++)
                        lines += text[i] == '\n';
                    if (line < 1 || (size_t)line > lines)
                        abort(); /* the line must be one of the input's */
                }
            }
        }
    } else {
        const char *key = dt_config_key_name(data[1] % 160);
        char *v = malloc(n);
        if (v && key) {
            memcpy(v, text + 1, n - 1);
            v[n - 1] = 0;
            dt_status st = dt_config_set(c, key, v, DT_CONFIG_FROM_FILE, "fuzz");
            if (st < 0)
                check_error(st);
        }
        free(v);
    }
    double lr = 0;
    if (dt_config_get_double(c, "optimizer.params.lr", &lr) < 0 || lr != 0.25)
        abort(); /* the command line's value wins over a file */
    char *js = dt_config_effective_json(c);
    if (js) {
        cJSON *j = cJSON_Parse(js);
        if (!j)
            abort();
        cJSON_Delete(j);
        free(js);
    }
    char *tx = dt_config_effective_text(c);
    free(tx);
    dt_config_batch b;
    dt_config_batch_resolve(c, 3, 7, 1, &b);
    dt_config_free(c);
    return 0;
}
