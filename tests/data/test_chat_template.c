/* Chat templates (data/chat_template.h): the bytes jinja2 renders, as
 * transformers sets it up. Golden files from
 * tests/data/gen_chat_template_golden.py: every template of
 * tests/data/chat_template/ over every conversation there (NAME.CONV.out,
 * or NAME.CONV.err for jinja2's error), and cases.json, small templates of
 * the tricky semantics (whitespace control, loops, scoping, Python's
 * printing of values, slicing, tojson, filters, tests, methods, errors).
 * Then what only dtrain has: error codes, line numbers, the limits. */
#include "data/chat_template.h"
#include "data/chat_template_impl.h"
#include "test.h"
#include "tmp_util.h"

#include <dirent.h>
#include <time.h>

static const char *gpath(const char *name)
{
    static char p[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/tests/data/chat_template/%s", DT_SOURCE_DIR, name);
    return p[k];
}

/* Render t with variables ctx_json (NULL: none); the status, the text in *out (caller frees). */
static dt_status render(const char *t, const char *ctx_json, char **out)
{
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    size_t n = 0;
    dt_status st = dt__chat_render(t, strlen(t), "test template", ctx, out, &n);
    cJSON_Delete(ctx);
    return st;
}

/* The text t renders to, or "ERROR: message" (static buffer). */
static const char *r(const char *t, const char *ctx_json)
{
    static char buf[8192];
    char *out = NULL;
    if (render(t, ctx_json, &out) < 0) {
        snprintf(buf, sizeof buf, "ERROR: %s", dt_last_error());
    } else {
        snprintf(buf, sizeof buf, "%s", out);
        free(out);
    }
    return buf;
}

static int expect_fail(const char *t, const char *ctx_json, dt_status want, const char *msg)
{
    char *out = (char *)1;
    dt_status st = render(t, ctx_json, &out);
    if (st != want || out != NULL || !strstr(dt_last_error(), msg) || !strstr(dt_last_error(), "test template")) {
        fprintf(stderr, "template %s: got %s (%s), want %s with '%s'\n", t, dt_status_name(st), dt_last_error(),
                dt_status_name(want), msg);
        return 1;
    }
    return 0;
}

/* Print where two texts first differ. */
static void show_diff(const char *what, const char *got, size_t gn, const char *want, size_t wn)
{
    size_t i = 0;
    while (i < gn && i < wn && got[i] == want[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "%s: differs at byte %zu (lengths %zu, %zu)\n  got:  ...%.*s\n  want: ...%.*s\n", what, i, gn,
            wn, (int)(gn - from < 120 ? gn - from : 120), got + from, (int)(wn - from < 120 ? wn - from : 120),
            want + from);
}

TEST(golden_templates)
{
    size_t cn;
    char *convs_text = t_slurp(gpath("conversations.json"), &cn);
    ASSERT(convs_text);
    cJSON *convs = cJSON_Parse(convs_text);
    ASSERT(cJSON_IsArray(convs));
    DIR *d = opendir(gpath(""));
    ASSERT(d);
    int checked = 0, bad = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 7 || strcmp(e->d_name + len - 6, ".jinja"))
            continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(len - 6), e->d_name);
        size_t tn;
        char *tmpl = t_slurp(gpath(e->d_name), &tn);
        ASSERT(tmpl);
        const cJSON *conv;
        cJSON_ArrayForEach(conv, convs)
        {
            const char *cname = cJSON_GetObjectItem(conv, "name")->valuestring;
            char f[512], what[600];
            snprintf(what, sizeof what, "%s over %s", name, cname);
            snprintf(f, sizeof f, "%s.%s.out", name, cname);
            size_t wn = 0, en = 0;
            char *want = t_slurp(gpath(f), &wn);
            snprintf(f, sizeof f, "%s.%s.err", name, cname);
            char *err = want ? NULL : t_slurp(gpath(f), &en);
            char *out = NULL;
            size_t on = 0;
            dt_status st = dt__chat_render(tmpl, tn, what, cJSON_GetObjectItem(conv, "vars"), &out, &on);
            checked++;
            if (want) {
                if (st < 0) {
                    fprintf(stderr, "%s: %s\n", what, dt_last_error());
                    bad++;
                } else if (on != wn || memcmp(out, want, wn)) {
                    show_diff(what, out, on, want, wn);
                    bad++;
                }
            } else if (!err) {
                fprintf(stderr, "%s: no golden file\n", what);
                bad++;
            } else if (st >= 0) {
                fprintf(stderr, "%s: rendered, jinja2 failed: %s\n", what, err);
                bad++;
            } else if (!strncmp(err, "raise_exception: ", 17)) {
                if (st != DT_ERR_INVALID_ARG || !strstr(dt_last_error(), err + 17) ||
                    !strstr(dt_last_error(), "raised")) {
                    fprintf(stderr, "%s: got %s, want the raise of '%s'\n", what, dt_last_error(), err + 17);
                    bad++;
                }
            } else if (st != DT_ERR_INVALID_ARG) {
                fprintf(stderr, "%s: got %s (%s), jinja2: %s\n", what, dt_status_name(st), dt_last_error(), err);
                bad++;
            }
            free(out);
            free(want);
            free(err);
        }
        free(tmpl);
    }
    closedir(d);
    cJSON_Delete(convs);
    free(convs_text);
    fprintf(stderr, "  %d renders checked\n", checked);
    ASSERT(checked >= 100);
    ASSERT_EQ_INT(bad, 0);
}

TEST(golden_cases)
{
    size_t n;
    char *text = t_slurp(gpath("cases.json"), &n);
    ASSERT(text);
    cJSON *root = cJSON_Parse(text), *cases = cJSON_GetObjectItem(root, "cases");
    const cJSON *vars = cJSON_GetObjectItem(root, "vars");
    ASSERT(cJSON_IsArray(cases) && cJSON_IsObject(vars));
    int bad = 0, i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        const char *t = cJSON_GetObjectItem(c, "template")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "out");
        const char *kind = want ? NULL : cJSON_GetObjectItem(c, "error")->valuestring;
        char *out = NULL;
        size_t on = 0;
        char what[64];
        snprintf(what, sizeof what, "case %d", i++);
        const cJSON *own = cJSON_GetObjectItem(c, "vars");
        dt_status st = dt__chat_render(t, strlen(t), what, own ? own : vars, &out, &on);
        if (want) {
            size_t wn = strlen(want->valuestring);
            if (st < 0) {
                fprintf(stderr, "%s %s: %s\n", what, t, dt_last_error());
                bad++;
            } else if (on != wn || memcmp(out, want->valuestring, wn)) {
                fprintf(stderr, "%s %s:\n", what, t);
                show_diff(what, out, on, want->valuestring, wn);
                bad++;
            }
        } else {
            const char *msg = cJSON_GetObjectItem(c, "message")->valuestring;
            bool syntax = !strcmp(kind, "TemplateSyntaxError") || !strcmp(kind, "TemplateAssertionError") ||
                          !strcmp(kind, "SyntaxError") || /* jinja2's 'break' outside a loop */
                          !strncmp(msg, "No filter named", 15) || !strncmp(msg, "No test named", 13);
            dt_status st_want = syntax ? DT_ERR_FORMAT : DT_ERR_INVALID_ARG;
            if (st != st_want) {
                fprintf(stderr, "%s %s: got %s (%s), want %s (jinja2: %s: %s)\n", what, t, dt_status_name(st),
                        st < 0 ? dt_last_error() : out, dt_status_name(st_want), kind, msg);
                bad++;
            }
        }
        free(out);
    }
    cJSON_Delete(root);
    free(text);
    ASSERT(i >= 100);
    ASSERT_EQ_INT(bad, 0);
}

TEST(errors_name_line_and_construct)
{
    ASSERT(!expect_fail("a\nb\n{% if x %}\nc", NULL, DT_ERR_FORMAT, "'if' block opened on line 3 is not closed"));
    ASSERT(!expect_fail("one\n\n{{ x | nosuch }}", NULL, DT_ERR_FORMAT, "line 3: no filter named 'nosuch'"));
    ASSERT(!expect_fail("{{ x is nosuch }}", NULL, DT_ERR_FORMAT, "no test named 'nosuch'"));
    ASSERT(!expect_fail("x\n{% frobnicate %}", NULL, DT_ERR_FORMAT, "line 2: unknown tag 'frobnicate'"));
    ASSERT(!expect_fail("{% include 'x' %}", NULL, DT_ERR_UNSUPPORTED, "the 'include' tag"));
    ASSERT(!expect_fail("{% extends 'x' %}", NULL, DT_ERR_UNSUPPORTED, "the 'extends' tag"));
    ASSERT(!expect_fail("{{ x|groupby('a') }}", NULL, DT_ERR_UNSUPPORTED, "the 'groupby' filter"));
    ASSERT(!expect_fail("{% for x in y recursive %}{% endfor %}", NULL, DT_ERR_UNSUPPORTED, "recursive"));
    ASSERT(!expect_fail("{{ '%999999999d' % 1 }}", NULL, DT_ERR_RANGE, "width or precision past"));
    ASSERT(!expect_fail("{{ '%.99999999f' % 1 }}", NULL, DT_ERR_RANGE, "width or precision past"));
    ASSERT(!expect_fail("{{ f(*a) }}", NULL, DT_ERR_UNSUPPORTED, "*args"));
    ASSERT(!expect_fail("{{ 'a'.format(1) }}", NULL, DT_ERR_UNSUPPORTED, "the str method 'format'"));
    ASSERT(!expect_fail("\n\n\n{{ raise_exception('Roles must alternate') }}", NULL, DT_ERR_INVALID_ARG,
                        "line 4: the chat template raised an error: Roles must alternate"));
    ASSERT(!expect_fail("{{ messages.append(1) }}", "{\"messages\": []}", DT_ERR_INVALID_ARG,
                        "SecurityError: access to attribute 'append' of 'list' object is unsafe"));
    ASSERT(!expect_fail("x\n{{ nope.attr }}", NULL, DT_ERR_INVALID_ARG, "line 2: UndefinedError: 'nope' is undefined"));
    ASSERT(!expect_fail("{{ m.a.b }}", "{\"m\": {}}", DT_ERR_INVALID_ARG, "'dict object' has no attribute 'a'"));
    ASSERT(!expect_fail("{{ 9223372036854775807 + 1 }}", NULL, DT_ERR_UNSUPPORTED, "integer overflow"));
    ASSERT(!expect_fail("{{ 'x\n", NULL, DT_ERR_FORMAT, "unterminated string"));
    ASSERT(!expect_fail("{{ 1 ", NULL, DT_ERR_FORMAT, "line 1: the '{{' tag is not closed"));
    ASSERT(!expect_fail("{{ 1 @ 2 }}", NULL, DT_ERR_FORMAT, "unexpected character"));
    ASSERT(!expect_fail("{{ '\xff' }}", NULL, DT_ERR_FORMAT, "not valid UTF-8"));
    ASSERT(!expect_fail("{{ x }}", "{\"x\": \"\xff\"}", DT_ERR_FORMAT, "variable 'x': a string that is not valid"));
}

TEST(limits)
{
    ct_limits lim;
    dt__chat_limits_default(&lim);
    char *out = (char *)1;
    size_t n;
    const char *t;
    /* iterations */
    lim.max_iters = 1000;
    t = "{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    ASSERT(out == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "loop iterations");
    /* a sum of work that is not loops: a join over a long list many times */
    t = "{% set l = range(1000)|list %}{% for i in range(50) %}{{ l|join }}{% endfor %}";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    dt__chat_limits_default(&lim);
    /* output */
    lim.max_output = 1 << 16;
    t = "{% for i in range(1000) %}{{ 'x' * 100 }}{% endfor %}";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "output");
    t = "{{ 'x' * 100000000000 }}";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    t = "{{ '' * 100000000000 }}{{ [] * 100000000000 }}";
    ASSERT_OK(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n));
    ASSERT_STR_EQ(out, "[]");
    free(out);
    dt__chat_limits_default(&lim);
    /* memory: a namespace carrying an ever longer list */
    lim.max_memory = 4 << 20;
    t = "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "working memory");
    /* but a loop that keeps nothing runs in bounded memory: its garbage is given back */
    t = "{% for i in range(100000) %}{% set s = 'x' * 1000 %}{{ s[:1] }}{% endfor %}";
    ASSERT_OK(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n));
    ASSERT_EQ_U64(n, 100000);
    free(out);
    dt__chat_limits_default(&lim);
    /* recursion */
    t = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "macro calls nested deeper than 100");
    char deep[4000];
    memset(deep, '(', sizeof deep);
    memcpy(deep, "{{ ", 3);
    memcpy(deep + sizeof deep - 4, "1 }}", 4);
    ASSERT_STATUS(dt__chat_render_limited(deep, sizeof deep, "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    char *nest = malloc(300 * 12 + 1);
    size_t k = 0;
    for (int i = 0; i < 300; i++)
        k += (size_t)sprintf(nest + k, "{%% if 1 %%}");
    ASSERT_STATUS(dt__chat_render_limited(nest, k, "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    free(nest);
    /* a chain as deep as it is long: 1 + 1 + ... (200,000 terms) */
    char *chain = malloc(800100);
    k = (size_t)sprintf(chain, "{{ 1");
    for (int i = 0; i < 200000; i++)
        k += (size_t)sprintf(chain + k, "+1");
    k += (size_t)sprintf(chain + k, " }}");
    ASSERT_STATUS(dt__chat_render_limited(chain, k, "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "expression nested deeper");
    k = (size_t)sprintf(chain, "{{ 1");
    for (int i = 0; i < 200000; i++)
        k += (size_t)sprintf(chain + k, "|abs");
    k += (size_t)sprintf(chain + k, " }}");
    ASSERT_STATUS(dt__chat_render_limited(chain, k, "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    free(chain);
    t = "{% set ns = namespace(v=[]) %}{% for i in range(2000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "nested deeper than 1000");
    t = "{{ range(100001)|length }}";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
    /* template size */
    lim.max_template = 10;
    t = "01234567890";
    ASSERT_STATUS(dt__chat_render_limited(t, strlen(t), "lim", NULL, &lim, &out, &n), DT_ERR_RANGE);
}

TEST(whitespace_rules)
{
    /* trim_blocks removes one newline after a block tag or comment, lstrip_blocks the indentation before one */
    ASSERT_STR_EQ(r("<\n  {% if true %}\n  x\n  {% endif %}\n>", NULL), "<\n  x\n>");
    ASSERT_STR_EQ(r("  {%+ if true %}x{% endif %}", NULL), "  x");
    ASSERT_STR_EQ(r("a {%- if true -%} b {%- endif -%} c", NULL), "abc");
    ASSERT_STR_EQ(r("a  {{- 'b' -}}  c", NULL), "abc");
    ASSERT_STR_EQ(r("{% if true %}\n\nx{% endif %}", NULL), "\nx");
    ASSERT_STR_EQ(r("{% if true +%}\nx{% endif %}", NULL), "\nx");
    ASSERT_STR_EQ(r("x\n", NULL), "x");
    ASSERT_STR_EQ(r("x\n\n", NULL), "x\n");
    ASSERT_STR_EQ(r("a\r\nb\rc", NULL), "a\nb\nc");
    ASSERT_STR_EQ(r("{{ 'a' }}  {% if true %}b{% endif %}", NULL), "a  b");
    ASSERT_STR_EQ(r("{% raw %}{{ x }}{% endraw %}", NULL), "{{ x }}");
    ASSERT_STR_EQ(r("", NULL), "");
}

TEST(values_print_as_python)
{
    ASSERT_STR_EQ(r("{{ x }}|{{ [x] }}", "{\"x\": null}"), "None|[None]");
    ASSERT_STR_EQ(r("{{ 1.0 }} {{ 0.1 }} {{ 1e100 }} {{ 123456789.125 }} {{ 5e-324 }} {{ 1.5e300 * 1e300 }}", NULL),
                  "1.0 0.1 1e+100 123456789.125 5e-324 inf");
    ASSERT_STR_EQ(r("{{ x }} {{ y }} {{ z }}", "{\"x\": 3, \"y\": 2.5, \"z\": 1e20}"), "3 2.5 1e+20");
    ASSERT_STR_EQ(r("{{ {'a': [1, 'b', none, true]} }}", NULL), "{'a': [1, 'b', None, True]}");
    ASSERT_STR_EQ(r("{{ [\"it's\"] }} {{ ['\"'] }} {{ ['\\'\"'] }}", NULL), "[\"it's\"] ['\"'] ['\\'\"']");
    ASSERT_STR_EQ(r("{{ namespace(a=1) }}", NULL), "<Namespace {'a': 1}>");
}

TEST(strftime_now)
{
    char want[64];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(want, sizeof want, "%Y", &tm);
    ASSERT_STR_EQ(r("{{ strftime_now('%Y') }}", NULL), want);
    ASSERT_STR_EQ(r("{{ strftime_now is defined }}", NULL), "True");
}

TEST(bad_arguments)
{
    char *out = (char *)1;
    size_t n = 7;
    ASSERT_STATUS(dt__chat_render(NULL, 3, "x", NULL, &out, &n), DT_ERR_NULL);
    ASSERT(out == NULL && n == 0);
    cJSON *arr = cJSON_CreateArray();
    ASSERT_STATUS(dt__chat_render("x", 1, "x", arr, &out, &n), DT_ERR_INVALID_ARG);
    cJSON_Delete(arr);
    /* a template with a NUL byte and no name */
    ASSERT_OK(dt__chat_render("a\0b", 3, NULL, NULL, &out, &n));
    ASSERT_EQ_U64(n, 3);
    ASSERT(!memcmp(out, "a\0b", 4));
    free(out);
    ASSERT_OK(dt__chat_render(NULL, 0, NULL, NULL, &out, &n));
    ASSERT_STR_EQ(out, "");
    free(out);
}

int main(void)
{
    RUN(golden_templates);
    RUN(golden_cases);
    RUN(errors_name_line_and_construct);
    RUN(limits);
    RUN(whitespace_rules);
    RUN(values_print_as_python);
    RUN(strftime_now);
    RUN(bad_arguments);
    return TEST_REPORT();
}
