/* src/base/json_strict.h — JSON files whose every key matters (a
 * checkpoint's index.json, the trainer's run state, jsonl: records, and a
 * Hugging Face model's config.json, model.safetensors.index.json and PEFT's
 * adapter_config.json), parsed strictly: one value and nothing but blanks
 * after it, and no key twice in one object (cJSON keeps both and a lookup
 * returns the first, Python's json the last, so an edited file could say one
 * thing to one reader and another to the next).
 *
 * Layer-internal: base's strict JSON reader for the layers that read such
 * files (ckpt, train, data, models). Not installed, not for users. */
#ifndef DT_BASE_JSON_STRICT_H
#define DT_BASE_JSON_STRICT_H

#include "dtrain/base.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* Parse txt[0, n) into *out (free with cJSON_Delete). DT_ERR_FORMAT naming
 * `name` and what is wrong: not valid JSON (near byte K), text after the
 * value, or a duplicate key (its path, e.g. "metadata"."dtrain.run"). */
dt_status dt__json_parse_strict(const char *txt, size_t n, const char *name, cJSON **out);

#endif
