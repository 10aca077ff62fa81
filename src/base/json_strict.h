/* src/base/json_strict.h — JSON the library reads back from its own files
 * (a checkpoint's index.json, the trainer's run state), parsed strictly: one
 * value and nothing but blanks after it, and no key twice in one object
 * (cJSON keeps both and a lookup returns the first, so an edited file could
 * say one thing to one reader and another to the next).
 *
 * Layer-internal: base's strict JSON reader for every layer that reads its
 * own files back (ckpt: index.json; train: the run state). Not installed, not
 * for users. */
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
