/* Hugging Face chat templates: a Jinja2 interpreter for the subset they use.
 *
 * transformers' tokenizer.apply_chat_template(messages, ...) renders the
 * tokenizer's chat_template with jinja2's ImmutableSandboxedEnvironment
 * (trim_blocks, lstrip_blocks, the loopcontrols extension), the globals
 * raise_exception(msg) and strftime_now(fmt), and its own tojson filter
 * (json.dumps with ensure_ascii=False: no HTML escaping, UTF-8 kept). This
 * renders the same templates to the same bytes.
 *
 * Supported: text, {{ }}, {% %}, {# #}, raw, whitespace control ('-' on
 * either side of a tag, '+' to keep lstrip_blocks or trim_blocks off);
 * if/elif/else, for (tuple targets, an 'if' filter, else, the loop variable,
 * break/continue), set (names, tuples, namespace attributes, blocks),
 * macro/call, filter blocks, with, generation (transformers' tag: the body
 * as is); Python's literals and operators with Python's semantics; jinja2's
 * Undefined; the tests, filters, globals and str/dict/list methods that chat
 * templates use (chat_template.c lists them).
 *
 * Refused: include, import, from, extends and block (DT_ERR_UNSUPPORTED, as
 * are the filters and methods jinja2 has and this does not, named), an
 * unknown tag, filter or test (DT_ERR_FORMAT, at parse time as jinja2
 * does), recursive loops, *args and **kwargs in calls. Python's
 * printf-style formatting (the % operator on a string, the format filter)
 * is Python's: the conversions s r a d i u o x X e E f F g G c, flags,
 * width, precision, '*' and %(key)s, with its TypeError/ValueError
 * messages; a width or precision past 2^24 is a limit (DT_ERR_RANGE).
 *
 * Differences from Python: integers are 64-bit (an overflow is an error,
 * not a big integer); a JSON number of ctx that is integral and within
 * int64 is an int, any other a float (json.loads makes 3.0 a float: cJSON
 * cannot tell); what a filter returns lazily in jinja2 (map, select,
 * reverse, unique, range) is a list here, so printing one without |list
 * shows the list, not '<generator object ...>'; case mapping is Unicode's
 * simple one-to-one mapping (no 'ß'.upper() == 'SS').
 *
 * Limits, each an error naming it: a template of at most 4 MiB, nesting of
 * at most 256 levels in the template and 1,000 in values, 100 nested macro
 * calls, 10 million loop iterations in all, 256 MiB of output, 1 GiB of
 * working memory, range() of at most 100,000 items (the sandbox's limit).
 *
 * Errors name `name`, the template's line and the construct:
 * DT_ERR_FORMAT for syntax errors, DT_ERR_UNSUPPORTED for jinja2 features
 * left out, DT_ERR_INVALID_ARG for runtime errors (jinja2's UndefinedError,
 * TypeError, SecurityError, and raise_exception, whose message is kept). */
#ifndef DT_DATA_CHAT_TEMPLATE_H
#define DT_DATA_CHAT_TEMPLATE_H

#include "dtrain/base.h"

#include <cjson/cJSON.h>

/* Render Jinja2 template tmpl[0, n) (a Hugging Face chat_template) with the
 * variables of JSON object ctx (NULL: none), as transformers'
 * apply_chat_template does: ctx holds messages, add_generation_prompt,
 * bos_token, ... and any extra variable. name names the template in errors
 * ("llama3/tokenizer_config.json's chat_template"). On success *out is the
 * text (malloc'd, NUL-terminated; free it) and *out_len its length without
 * the NUL; on error *out is NULL and *out_len 0. */
dt_status dt__chat_render(const char *tmpl, size_t n, const char *name, const cJSON *ctx, char **out,
                          size_t *out_len);
/* The same, and where the output of each {% generation %} block is
 * (transformers' return_assistant_tokens_mask): *spans (malloc'd; free it)
 * holds *nspans [start, end) byte ranges of *out, in the order rendered. A
 * generation block inside a macro, call, set or filter block is
 * DT_ERR_UNSUPPORTED here (transformers marks other text than its output
 * then). */
dt_status dt__chat_render_spans(const char *tmpl, size_t n, const char *name, const cJSON *ctx, char **out,
                                size_t *out_len, size_t **spans, size_t *nspans);

/* Python's str.strip() (which 'b'), lstrip() ('l') or rstrip() ('r') of
 * s[0, n): the whitespace (Unicode, as str.isspace) at those ends left
 * out; the rest is s[*start, *end). */
void dt__chat_py_strip(const char *s, size_t n, int which, size_t *start, size_t *end);

#endif
