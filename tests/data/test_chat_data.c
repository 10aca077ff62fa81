/* Chat templates at the tokenizer and the data: where the template is read
 * from (tokenizer_config.json's "chat_template", a list's "default", a
 * chat_template.jinja beside, which wins), what the template sees (the
 * special tokens' texts, add_generation_prompt, tools, keyword arguments),
 * TRL's conversational jsonl lines as data (the rendering encoded, nothing
 * added after it; prompt/completion conversations with the prompt's targets
 * masked), the export, and the mistakes named. The renderer's own
 * conformance to jinja2 is test_chat_template's. */
#include "dtrain/tokenizer.h"
#include "test.h"
#include "tmp_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Llama-3 Instruct's template, in shape: a set in the loop, loop.index0, bos_token, trim, the generation prompt. */
#define LLAMA3_TEMPLATE                                                                                              \
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "    \
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 " \
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"     \
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"

/* LLAMA3_TEMPLATE as JSON text (its quotes and backslashes escaped once more by the C string). */
#define LLAMA3_CONFIG                                                                                                \
    "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", \"pad_token\": \"<|end_of_text|>\", "     \
    "\"chat_template\": \"" LLAMA3_TEMPLATE "\"}"

#define CONV                                                                                                         \
    "[{\"role\": \"system\", \"content\": \"You are kind.\"}, {\"role\": \"user\", \"content\": \" Hi there \\n\"}, " \
    "{\"role\": \"assistant\", \"content\": \"Hello!\"}]"

#define RENDERED                                                                                                     \
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are kind.<|eot_id|><|start_header_id|>user"  \
    "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"

#define GEN_PROMPT "<|start_header_id|>assistant<|end_header_id|>\n\n"

static char g_dir[512];

static dt_tokenizer *load_plain(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tokenizer/llama3.json", DT_SOURCE_DIR);
    dt_tokenizer *t = NULL;
    if (dt_tokenizer_load(path, &t) < 0)
        fprintf(stderr, "%s\n", dt_last_error());
    return t;
}

static dt_tokenizer *load_chat(void)
{
    dt_tokenizer *t = load_plain();
    if (t && dt_tokenizer_apply_config(t, LLAMA3_CONFIG, strlen(LLAMA3_CONFIG), "llama3 config") < 0) {
        fprintf(stderr, "%s\n", dt_last_error());
        dt_tokenizer_free(t);
        return NULL;
    }
    return t;
}

static char *render(const dt_tokenizer *t, const char *conv, dt_chat_end end, const char *kw)
{
    char *s = NULL;
    size_t n = 0;
    if (dt_tokenizer_render_chat(t, conv, strlen(conv), end, kw, kw ? strlen(kw) : 0, &s, &n) < 0) {
        fprintf(stderr, "render: %s\n", dt_last_error());
        return NULL;
    }
    if (strlen(s) != n) {
        fprintf(stderr, "render: length %zu, strlen %zu\n", n, strlen(s));
        free(s);
        return NULL;
    }
    return s;
}

TEST(render_llama3_shape)
{
    dt_tokenizer *t = load_chat();
    ASSERT(t != NULL);
    ASSERT_STR_CONTAINS(dt_tokenizer_chat_template(t), "<|start_header_id|>");
    char *s = render(t, CONV, false, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, RENDERED);
    free(s);
    s = render(t, CONV, true, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, RENDERED GEN_PROMPT);
    free(s);
    /* the variables the template sees: special tokens, tools, keyword arguments (which cannot replace messages) */
    const char *peek = "{\"chat_template\": \"{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}|"
                       "{{ tools | length }}|{{ enable_thinking }}|{{ messages | length }}|"
                       "{{ add_generation_prompt }}\", \"eos_token\": \"<|eot_id|>\", "
                       "\"pad_token\": {\"content\": \"<|end_of_text|>\"}}";
    ASSERT_OK(dt_tokenizer_apply_config(t, peek, strlen(peek), "peek"));
    s = render(t, "[{\"role\": \"user\", \"content\": \"x\"}]", true,
               "{\"tools\": [{\"name\": \"f\"}, {\"name\": \"g\"}], \"enable_thinking\": false, \"messages\": []}");
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "<|eot_id|>|<|end_of_text|>|False|2|False|1|True");
    free(s);
    /* the messages as transformers 5 hands them over: null keys dropped, an assistant's reasoning under "thinking"
       (first) and "reasoning_content" too; tools and documents None when not given (transformers 5.25's output) */
    const char *norm = "{\"chat_template\": \"{{ tools is none }}|{{ documents is none }}|{{ messages[0].content is "
                       "defined }}|{{ messages[1] | tojson }}|{{ messages[2] | tojson }}\"}";
    ASSERT_OK(dt_tokenizer_apply_config(t, norm, strlen(norm), "norm"));
    s = render(t, "[{\"role\": \"user\", \"content\": null}, {\"role\": \"assistant\", \"content\": \"a\", "
               "\"reasoning\": \"r\"}, {\"role\": \"assistant\", \"reasoning_content\": \"x\", \"thinking\": \"y\", "
               "\"content\": \"c\"}]", false, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "True|True|False|{\"thinking\": \"r\", \"role\": \"assistant\", \"content\": \"a\", "
                     "\"reasoning\": \"r\", \"reasoning_content\": \"r\"}|{\"thinking\": \"y\", \"role\": "
                     "\"assistant\", \"reasoning_content\": \"x\", \"content\": \"c\"}");
    free(s);
    char *none = (char *)"x";
    size_t nn = 1;
    ASSERT_STATUS(dt_tokenizer_render_chat(t, "[]", 2, false, NULL, 0, &none, &nn), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "empty conversation");
    dt_tokenizer_free(t);
}

/* Where the template comes from: the config's string, a list's "default" (none so named: none), and
 * chat_template.jinja beside the tokenizer.json, which wins; a failing config changes nothing. */
/* apply_chat_template(continue_final_message=True) (transformers 5.25's outputs): the text ends where the final
 * message's content does; whitespace a template trims off the content goes, whitespace it keeps stays; a list
 * content continues its last text part; what cannot be continued is named. */
TEST(continue_final_message)
{
    dt_tokenizer *t = load_chat();
    ASSERT(t != NULL);
    const char *open = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are kind.<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant"
                       "<|end_header_id|>\n\nHello!";
    char *s = render(t, CONV, DT_CHAT_CONTINUE, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, open);
    free(s);
    /* the template trims the content: its trailing space goes with the text after it */
    const char *sp = "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": "
                     "\"Sure, \"}]";
    s = render(t, sp, DT_CHAT_CONTINUE, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>"
                     "assistant<|end_header_id|>\n\nSure,");
    free(s);
    /* ChatML keeps it; a user's final message is continued as well */
    const char *chatml = "{\"chat_template\": \"{% for m in messages %}<|im_start|>{{ m.role }}\\n{% if m.content "
                         "is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}"
                         "{{ p.text }}{% else %}<image>{% endif %}{% endfor %}{% endif %}<|im_end|>\\n{% endfor %}\"}";
    ASSERT_OK(dt_tokenizer_apply_config(t, chatml, strlen(chatml), "chatml"));
    s = render(t, sp, DT_CHAT_CONTINUE, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nSure, ");
    free(s);
    s = render(t, "[{\"role\": \"user\", \"content\": \"Write a poem\"}]", DT_CHAT_CONTINUE, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "<|im_start|>user\nWrite a poem");
    free(s);
    const char *parts = "[{\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"A\"}, "
                        "{\"type\": \"image\"}, {\"type\": \"text\", \"text\": \"B\"}, {\"type\": \"image\"}]}]";
    s = render(t, parts, DT_CHAT_CONTINUE, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "<|im_start|>assistant\nA<image>B");
    free(s);
    s = render(t, parts, DT_CHAT_CLOSED, NULL); /* the caller's messages are left as they were */
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "<|im_start|>assistant\nA<image>B<image><|im_end|>\n");
    free(s);
    const struct {
        const char *conv, *cfg, *msg;
    } bad[] = {
        {"[{\"role\": \"assistant\", \"content\": null}]", NULL, "needs its \"content\""},
        {"[{\"role\": \"assistant\", \"content\": [{\"type\": \"image\"}]}]", NULL, "a part with a \"text\""},
        {"[{\"role\": \"assistant\", \"content\": 7}]", NULL, "to be a string"},
        {CONV, "{\"chat_template\": \"{% for m in messages %}{{ m.role }}{% endfor %}\"}", "never names it"},
        {CONV, "{\"chat_template\": \"{% for m in messages %}{{ m.role }}{% endfor %}{# content #}\"}",
         "does not write the final message's content"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i].cfg)
            ASSERT_OK(dt_tokenizer_apply_config(t, bad[i].cfg, strlen(bad[i].cfg), "bad"));
        char *none = (char *)"x";
        size_t nn = 1;
        ASSERT_STATUS(dt_tokenizer_render_chat(t, bad[i].conv, strlen(bad[i].conv), DT_CHAT_CONTINUE, NULL, 0, &none,
                                               &nn), DT_ERR_INVALID_ARG);
        ASSERT(none == NULL && nn == 0);
        ASSERT_STR_CONTAINS(dt_last_error(), bad[i].msg);
    }
    char *none = NULL;
    size_t nn = 0;
    ASSERT_STATUS(dt_tokenizer_render_chat(t, CONV, strlen(CONV), (dt_chat_end)3, NULL, 0, &none, &nn),
                  DT_ERR_INVALID_ARG);
    dt_tokenizer_free(t);
}

TEST(template_sources)
{
    char src[1024], cmd[2200];
    snprintf(src, sizeof src, "%s/tests/data/tokenizer/llama3.json", DT_SOURCE_DIR);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/tokenizer.json'", src, g_dir);
    ASSERT_EQ_INT(system(cmd), 0);
    ASSERT(t_write_in(g_dir, "tokenizer_config.json", LLAMA3_CONFIG));
    dt_tokenizer *t = NULL;
    ASSERT_OK(dt_tokenizer_load(g_dir, &t));
    ASSERT_STR_CONTAINS(dt_tokenizer_chat_template(t), "loop_messages");
    dt_tokenizer_free(t);
    ASSERT(t_write_in(g_dir, "chat_template.jinja", "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n"
                                                    "{% endfor %}"));
    ASSERT_OK(dt_tokenizer_load(g_dir, &t));
    char *s = render(t, CONV, false, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "[system]You are kind.\n[user] Hi there \n\n[assistant]Hello!\n");
    free(s);
    /* a config that fails (an eos_token the tokenizer lacks) keeps the template it had */
    const char *bad = "{\"eos_token\": \"<|no such|>\", \"chat_template\": \"x\"}";
    ASSERT_STATUS(dt_tokenizer_apply_config(t, bad, strlen(bad), "bad config"), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_tokenizer_chat_template(t), "[{{ m.role }}]");
    dt_tokenizer_free(t);
    char p[1100];
    snprintf(p, sizeof p, "%s/chat_template.jinja", g_dir);
    ASSERT_EQ_INT(unlink(p), 0);
    const char *list = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                       "{\"name\": \"default\", \"template\": \"D{{ messages | length }}\"}]}";
    ASSERT(t_write_in(g_dir, "tokenizer_config.json", list));
    ASSERT_OK(dt_tokenizer_load(g_dir, &t));
    s = render(t, CONV, false, NULL);
    ASSERT(s != NULL);
    ASSERT_STR_EQ(s, "D3");
    free(s);
    dt_tokenizer_free(t);
    const char *nodefault = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}";
    ASSERT(t_write_in(g_dir, "tokenizer_config.json", nodefault));
    ASSERT_OK(dt_tokenizer_load(g_dir, &t));
    ASSERT(dt_tokenizer_chat_template(t) == NULL);
    dt_tokenizer_free(t);
    const char *badlist = "{\"chat_template\": [{\"name\": \"default\"}]}";
    ASSERT(t_write_in(g_dir, "tokenizer_config.json", badlist));
    ASSERT_STATUS(dt_tokenizer_load(g_dir, &t), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "chat_template[0]");
    ASSERT(t_write_in(g_dir, "tokenizer_config.json", "{\"chat_template\": 3}"));
    ASSERT_STATUS(dt_tokenizer_load(g_dir, &t), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "\"chat_template\"");
    ASSERT(t_write_in(g_dir, "tokenizer_config.json", "{}"));
}

/* The mistakes: no template, a message without a role, the template's raise_exception, a template that does not
 * parse: each named, nothing rendered. */
TEST(render_errors)
{
    dt_tokenizer *t = load_plain();
    ASSERT(t != NULL);
    char *s = (char *)"x";
    size_t n = 7;
    ASSERT_STATUS(dt_tokenizer_render_chat(t, CONV, strlen(CONV), false, NULL, 0, &s, &n), DT_ERR_INVALID_ARG);
    ASSERT(s == NULL && n == 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "has none");
    const char *mistral = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must "
                          "alternate') }}{% endif %}ok";
    ASSERT_OK(dt_tokenizer_set_chat_template(t, mistral, strlen(mistral), "mistral.jinja"));
    ASSERT_STATUS(dt_tokenizer_render_chat(t, CONV, strlen(CONV), false, NULL, 0, &s, &n), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "Conversation roles must alternate");
    ASSERT_STR_CONTAINS(dt_last_error(), "mistral.jinja");
    const char *norole = "[{\"content\": \"hi\"}]";
    ASSERT_STATUS(dt_tokenizer_render_chat(t, norole, strlen(norole), false, NULL, 0, &s, &n), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "\"role\"");
    ASSERT_STATUS(dt_tokenizer_render_chat(t, "[", 1, false, NULL, 0, &s, &n), DT_ERR_FORMAT);
    ASSERT_OK(dt_tokenizer_set_chat_template(t, "line one\n{% if %}", 17, "broken.jinja"));
    ASSERT(dt_tokenizer_render_chat(t, CONV, strlen(CONV), false, NULL, 0, &s, &n) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "broken.jinja");
    ASSERT_STATUS(dt_tokenizer_set_chat_template(t, "a\0b", 3, "nul"), DT_ERR_FORMAT);
    ASSERT_OK(dt_tokenizer_set_chat_template(t, NULL, 0, NULL));
    ASSERT(dt_tokenizer_chat_template(t) == NULL);
    dt_tokenizer_free(t);
}

/* ids of text (no special tokens added) appended to out at *k; lab: its label (-1: the id itself). */
static int put_ids(const dt_tokenizer *t, const char *text, int64_t *out, int64_t *labels, int64_t lab, int64_t *k)
{
    uint32_t *ids;
    int64_t ni;
    if (dt_tokenizer_encode(t, text, strlen(text), false, &ids, &ni) < 0)
        return -1;
    for (int64_t i = 0; i < ni; i++, (*k)++)
        out[*k] = ids[i], labels[*k] = lab < -1 ? lab : (int64_t)ids[i];
    free(ids);
    return 0;
}

/* TRL's {"messages": [...]}: the rendered conversation's ids, nothing after them; a "text" line beside it keeps
 * its end-of-document token; field=KEY holding a list is a conversation too. */
TEST(messages_lines)
{
    dt_tokenizer *t = load_chat();
    ASSERT(t != NULL);
    uint32_t eos;
    ASSERT_OK(dt_tokenizer_eos(t, &eos));
    ASSERT(t_write_in(g_dir, "chat.jsonl",
                      "{\"messages\": " CONV "}\n{\"text\": \"In the beginning\"}\n{\"messages\": " CONV "}\n"));
    int64_t want[512], lab[512], n = 0;
    ASSERT_OK(put_ids(t, RENDERED, want, lab, -1, &n));
    ASSERT_OK(put_ids(t, "In the beginning", want, lab, -1, &n));
    want[n++] = eos;
    ASSERT_OK(put_ids(t, RENDERED, want, lab, -1, &n));
    ASSERT(want[0] != want[1]); /* bos, then the header token: specials found as added tokens */
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = 4;
    kp.stride = 1;
    char spec[1400];
    snprintf(spec, sizeof spec, "jsonl:%s/chat.jsonl", g_dir);
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), n - 4);
    for (int64_t i = 0; i < n - 4; i++) {
        int64_t x[4], y[4];
        ASSERT_OK(dt_dataset_get_item(ds, i, x, y));
        for (int k = 0; k < 4; k++) {
            ASSERT_EQ_INT(x[k], want[i + k]);
            ASSERT_EQ_INT(y[k], want[i + k + 1]);
        }
    }
    dt_dataset_free(ds);
    /* field=conv holding the list */
    ASSERT(t_write_in(g_dir, "field.jsonl", "{\"conv\": " CONV "}\n"));
    snprintf(spec, sizeof spec, "jsonl:%s/field.jsonl,field=conv", g_dir);
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    int64_t x[4], y[4];
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, y));
    ASSERT_EQ_INT(x[0], want[0]);
    dt_dataset_free(ds);
    /* field=NAME given: a "messages" list beside is not taken in its place */
    snprintf(spec, sizeof spec, "jsonl:%s/chat.jsonl,field=body", g_dir);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "\"body\"");
    dt_tokenizer_free(t);
    /* a tokenizer without a template: named, with the line */
    t = load_plain();
    snprintf(spec, sizeof spec, "jsonl:%s/chat.jsonl", g_dir);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "chat.jsonl:1");
    ASSERT_STR_CONTAINS(dt_last_error(), "chat template");
    dt_tokenizer_free(t);
}

/* Conversational prompt/completion: the prompt rendered with the generation prompt, the completion what the whole
 * adds after it; under completion_only_loss the prompt's targets are -100. A template whose prompt is not the start
 * of the whole is refused for that line. */
TEST(prompt_completion_conversations)
{
    dt_tokenizer *t = load_chat();
    ASSERT(t != NULL);
    ASSERT(t_write_in(g_dir, "pc.jsonl",
                      "{\"prompt\": [{\"role\": \"user\", \"content\": \"Who made the earth?\"}], "
                      "\"completion\": [{\"role\": \"assistant\", \"content\": \"God.\"}]}\n"));
    const char *ptext = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWho made the earth?<|eot_id|>"
                        GEN_PROMPT;
    int64_t want[256], lab[256], n = 0;
    ASSERT_OK(put_ids(t, ptext, want, lab, -100, &n));
    const int64_t np = n;
    ASSERT_OK(put_ids(t, "God.<|eot_id|>", want, lab, -1, &n));
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = n - 1;
    kp.completion_only_loss = true;
    char spec[1400];
    snprintf(spec, sizeof spec, "jsonl:%s/pc.jsonl", g_dir);
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 1);
    int64_t x[256], y[256];
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, y));
    int64_t counted = 0;
    for (int64_t k = 0; k < n - 1; k++) {
        ASSERT_EQ_INT(x[k], want[k]);
        ASSERT_EQ_INT(y[k], lab[k + 1]);
        counted += y[k] != -100;
    }
    ASSERT_EQ_INT(counted, n - np);
    dt_dataset_free(ds);
    /* a template that renders the prompt otherwise than the start of the whole */
    const char *odd = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}>>{% endif %}";
    ASSERT_OK(dt_tokenizer_set_chat_template(t, odd, strlen(odd), "odd.jinja"));
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "pc.jsonl:1");
    ASSERT_STR_CONTAINS(dt_last_error(), "than the start of the whole conversation");
    /* a list prompt beside a string completion: not a conversation, named */
    ASSERT(t_write_in(g_dir, "mixed.jsonl", "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], "
                                            "\"completion\": \"b\"}\n"));
    snprintf(spec, sizeof spec, "jsonl:%s/mixed.jsonl", g_dir);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "only when the other key is one too");
    dt_tokenizer_free(t);
}

/* A template marking the assistant's turns with {% generation %} (as SmolLM3's and TRL's own templates do). */
#define GEN_TEMPLATE                                                                                                 \
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}<|start_header_id|>assistant"               \
    "<|end_header_id|>\n\n{% generation %}{{ m.content }}<|eot_id|>{% endgeneration %}{% else %}"                     \
    "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"

/* assistant_only_loss: the targets counted are the tokens the generation blocks wrote (transformers' assistant
 * mask: the blocks' edges fall on token edges here, so exactly those tokens); a template without blocks, text
 * lines, a block edge inside a token, a block inside a macro and a conversation with no assistant token are
 * refused, named. */
TEST(assistant_only_loss)
{
    dt_tokenizer *t = load_chat();
    ASSERT(t != NULL);
    ASSERT_OK(dt_tokenizer_set_chat_template(t, GEN_TEMPLATE, strlen(GEN_TEMPLATE), "gen.jinja"));
    ASSERT(t_write_in(g_dir, "asst.jsonl", "{\"messages\": " CONV "}\n"
                                           "{\"messages\": [{\"role\": \"user\", \"content\": \"And?\"}, "
                                           "{\"role\": \"assistant\", \"content\": \"Light.\"}]}\n"));
    int64_t want[512], lab[512], n = 0;
    ASSERT_OK(put_ids(t, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are kind.<|eot_id|>"
                         "<|start_header_id|>user<|end_header_id|>\n\n Hi there \n<|eot_id|><|start_header_id|>"
                         "assistant<|end_header_id|>\n\n", want, lab, -100, &n));
    ASSERT_OK(put_ids(t, "Hello!<|eot_id|>", want, lab, -1, &n));
    ASSERT_OK(put_ids(t, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nAnd?<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n", want, lab, -100, &n));
    ASSERT_OK(put_ids(t, "Light.<|eot_id|>", want, lab, -1, &n));
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = n - 1;
    kp.assistant_only_loss = true;
    char spec[1400];
    snprintf(spec, sizeof spec, "jsonl:%s/asst.jsonl", g_dir);
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 1);
    int64_t x[512], y[512], counted = 0, want_counted = 0;
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, y));
    for (int64_t k = 0; k < n - 1; k++) {
        ASSERT_EQ_INT(x[k], want[k]);
        ASSERT_EQ_INT(y[k], lab[k + 1]);
        counted += y[k] != -100;
        want_counted += lab[k + 1] != -100;
    }
    ASSERT(counted > 4 && counted == want_counted);
    dt_dataset_free(ds);
    /* refusals */
    struct {
        const char *tmpl, *line, *msg;
        dt_status st;
    } bad[] = {
        {LLAMA3_TEMPLATE, "{\"messages\": " CONV "}", "marks none", DT_ERR_INVALID_ARG},
        {GEN_TEMPLATE, "{\"text\": \"In the beginning\"}", "this line is text", DT_ERR_INVALID_ARG},
        {"{% for m in messages %}ear{% generation %}th{% endgeneration %}{% endfor %}", "{\"messages\": " CONV "}",
         "inside a token", DT_ERR_UNSUPPORTED},
        {"{% macro say(m) %}{% generation %}{{ m.content }}{% endgeneration %}{% endmacro %}"
         "{% for m in messages %}{{ say(m) }}{% endfor %}", "{\"messages\": " CONV "}", "inside a macro",
         DT_ERR_UNSUPPORTED},
        {GEN_TEMPLATE, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
                       "\"content\": \"\"}]}", "", DT_OK},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_OK(dt_tokenizer_set_chat_template(t, bad[i].tmpl, strlen(bad[i].tmpl), "bad.jinja"));
        ASSERT(t_write_in(g_dir, "bad.jsonl", bad[i].line));
        snprintf(spec, sizeof spec, "jsonl:%s/bad.jsonl", g_dir);
        kp.seq_len = 2;
        dt_status st = dt_dataset_text_open(spec, t, &kp, &ds);
        if (bad[i].st == DT_OK) { /* an empty reply still counts its <|eot_id|> */
            ASSERT_OK(st);
            dt_dataset_free(ds);
            continue;
        }
        if (st != bad[i].st || !strstr(dt_last_error(), bad[i].msg))
            fprintf(stderr, "case %zu: %d %s\n", i, (int)st, dt_last_error());
        ASSERT_STATUS(st, bad[i].st);
        ASSERT_STR_CONTAINS(dt_last_error(), bad[i].msg);
        ASSERT_STR_CONTAINS(dt_last_error(), "bad.jsonl:1");
    }
    /* an assistant turn that writes nothing: nothing trained, refused */
    const char *empty = "{% for m in messages %}{{ m.content }}{% if m.role == 'assistant' %}{% generation %}"
                        "{% endgeneration %}{% endif %}{% endfor %}";
    ASSERT_OK(dt_tokenizer_set_chat_template(t, empty, strlen(empty), "empty.jinja"));
    snprintf(spec, sizeof spec, "jsonl:%s/asst.jsonl", g_dir);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "hold no token");
    /* text: data */
    snprintf(spec, sizeof spec, "text:%s/asst.jsonl", g_dir);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "needs conversations");
    dt_tokenizer_free(t);
}

/* The export keeps the template (AutoTokenizer reads it back from tokenizer_config.json). */
TEST(export_keeps_template)
{
    dt_tokenizer *t = load_chat();
    ASSERT(t != NULL);
    char *cfg = NULL, *map = NULL;
    ASSERT_OK(dt_tokenizer_hf_files(t, 0, &cfg, &map));
    dt_tokenizer *u = load_plain();
    ASSERT(u != NULL);
    ASSERT_OK(dt_tokenizer_apply_config(u, cfg, strlen(cfg), "exported"));
    ASSERT_STR_EQ(dt_tokenizer_chat_template(u), dt_tokenizer_chat_template(t));
    free(cfg);
    free(map);
    dt_tokenizer_free(u);
    dt_tokenizer_free(t);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", t_tmpdir("chat_data"));
    if (!g_dir[0])
        return 1;
    RUN(render_llama3_shape);
    RUN(continue_final_message);
    RUN(template_sources);
    RUN(render_errors);
    RUN(messages_lines);
    RUN(prompt_completion_conversations);
    RUN(assistant_only_loss);
    RUN(export_keeps_template);
    t_rm_rf(g_dir);
    return TEST_REPORT();
}
