/* libFuzzer target for chat templates (data/chat_template.h): the input is
 * the template text, rendered over a fixed conversation (system, user,
 * assistant with a tool call, tool, and the usual variables). Checked: a
 * render either gives text with *out NUL-terminated at *out_len, or fails
 * with *out NULL and a message naming the template; nothing leaks, crashes
 * or runs away (the limits are lowered so that a slow input shows). */
// fuzz-sources: src/base/*.c src/data/*.c
// fuzz-libs: -lcjson -lz
#include "data/chat_template.h"
#include "data/chat_template_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CONV[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    "{\"role\": \"user\", \"content\": \" h\\u00e9llo \\ud83c\\udf89\\n\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\":"
    "{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [2.5, \"x\"]}}}]},"
    "{\"role\": \"tool\", \"content\": \"42\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cJSON *ctx;
    if (!ctx)
        ctx = cJSON_Parse(CONV);
    ct_limits lim;
    dt__chat_limits_default(&lim);
    lim.max_iters = 200000;
    lim.max_output = 1 << 20;
    lim.max_memory = 64 << 20;
    char *out = (char *)1;
    size_t n = 1;
    dt_error_clear();
    dt_status st = dt__chat_render_limited((const char *)data, size, "fuzz.jinja", ctx, &lim, &out, &n);
    if (st < 0) {
        if (out || n || !strstr(dt_last_error(), "fuzz.jinja"))
            abort();
        return 0;
    }
    if (!out || out[n] != 0)
        abort();
    free(out);
    return 0;
}
