/* dtrain generate — continue a prompt with a GPT-2 or Llama model
 * (dt_model_generate: greedy, temperature, top-k, top-p, seeded sampling,
 * stop tokens, a minimum length, the n-gram ban, beam search; an hf:DIR
 * model's generation_config.json gives the defaults).
 *
 * The weights: --ckpt DIR (a `dtrain train --save` directory or one step-N
 * checkpoint: its saved options choose the model's configuration), or
 * --weights FILE (a safetensors file with the model's Hugging Face names),
 * else the model's initialisation from --seed. The
 * prompt and the output are token ids, or text with --vocab (a `dtrain
 * tokenize` BPE vocabulary) or --tokenizer (a Hugging Face tokenizer.json;
 * an hf:DIR model's own, a checkpoint's kept one). Parsing and printing
 * only. */
#include "cmd.h"
#include "train.h"

#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "dtrain/generate.h"
#include "dtrain/models.h"
#include "dtrain/tokenizer.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain generate --model NAME --prompt-ids ID[,ID...] [options]\n"
               "  --model NAME          gpt2 | gpt2-medium | gpt2-large | gpt2-xl | gpt-mini | gpt-micro | llama-tiny |\n"
               "                        llama-100m | hf:DIR (a Hugging Face model directory, with its weights)\n"
               "  --n-layer/--n-head/--n-embd/--block-size/--vocab-size N   override the configuration\n"
               "  --ckpt PATH           weights of a dtrain train --save checkpoint (its model options\n"
               "                        are the defaults)\n"
               "  --weights FILE        weights from a safetensors file with the model's names\n"
               "  --seed N              without those, and not an hf:DIR model: the initialisation from N\n"
               "                        (default 0; refused otherwise: --sample-seed seeds the sampling)\n"
               "  --lora-from DIR       LoRA adapters PEFT saved (adapter_config.json,\n"
               "                        adapter_model.safetensors; dtrain train --save-lora) on the\n"
               "                        model's weights, as PeftModel.from_pretrained(base, DIR)\n"
               "  --prompt-ids LIST     comma-separated token ids in [0, vocab size)\n"
               "  --vocab FILE --prompt TEXT   a BPE vocabulary (dtrain tokenize) and a text prompt;\n"
               "                        the output is then text (with --ckpt of a run trained with\n"
               "                        --vocab: the checkpoint keeps it, --prompt alone is enough)\n"
               "  --tokenizer FILE --prompt TEXT   the same through a Hugging Face tokenizer.json (or a\n"
               "                        directory holding one): the prompt is encoded as transformers'\n"
               "                        tokenizer(TEXT) does (its special tokens added), the output\n"
               "                        decoded as tokenizer.decode; --prompt alone uses an hf:DIR model's\n"
               "                        DIR/tokenizer.json, or the one a --ckpt run trained with --tokenizer\n"
               "                        keeps. An id past the vocabulary is an error (exit 2), never\n"
               "                        another token\n"
               "  --chat on|off         with a tokenizer.json: the prompt is a user's message in the\n"
               "                        tokenizer's chat template, its generation prompt after it (as\n"
               "                        apply_chat_template(add_generation_prompt=True); no other special\n"
               "                        tokens added); default off\n"
               "  --system TEXT         with --chat on: a system message before the user's\n"
               "  --messages FILE       with a tokenizer.json, in place of --prompt: a conversation, a JSON\n"
               "                        list of messages ([{\"role\": \"user\", \"content\": \"...\"}, ...], as\n"
               "                        a pipeline takes it) through the chat template, the generation\n"
               "                        prompt after it\n"
               "  --continue-final-message auto|on|off   with --messages: on continues the final message\n"
               "                        (the text stops where its content does: no end of turn, no\n"
               "                        generation prompt; apply_chat_template(continue_final_message=\n"
               "                        True)); auto (default), as a transformers pipeline: on when the\n"
               "                        final message is the assistant's\n"
               "  --chat-template-kwargs JSON   with --chat on or --messages: a JSON object of the\n"
               "                        template's further variables, as apply_chat_template's keyword\n"
               "                        arguments (e.g. '{\"enable_thinking\": false}' for Qwen3)\n"
               "  --tools FILE          with --chat on or --messages: a JSON list of tool (function)\n"
               "                        schemas, as apply_chat_template(tools=...)\n"
               "  --chat-template FILE  with --chat on or --messages: this Jinja chat template in place of\n"
               "                        the tokenizer's own (or for one without)\n");
    fprintf(f, "  --max-new-tokens N    tokens to generate at most (default 64)\n"
               "  --temperature X       0 = greedy (default 1); the sampling options below (--top-h to\n"
               "                        --eta-cutoff, --sample-seed) are refused then, as they would be\n"
               "                        ignored (transformers warns); so are --length-penalty and\n"
               "                        --early-stopping without beams\n"
               "  --top-h H             Top-H: of the 100 most likely, keep the most likely first while\n"
               "                        their -p log p sum stays within H times the entropy (top_h;\n"
               "                        default 0 = off)\n"
               "  --top-k K             then sample among the K most likely (default 0 = all)\n"
               "  --top-p P             then among the most likely tokens that hold P of the probability\n"
               "                        (nucleus sampling, transformers' top_p; default 1 = all)\n"
               "  --min-p P             then drop the tokens less likely than P times the most likely\n"
               "                        (transformers' min_p; default 0 = off)\n"
               "  --typical-p P         then keep the tokens whose -log p is nearest the entropy until\n"
               "                        they hold P of the probability (typical_p; default 1 = off)\n"
               "  --epsilon-cutoff E    then drop the tokens less likely than E, the most likely kept\n"
               "                        (transformers' epsilon_cutoff; default 0 = off)\n"
               "  --eta-cutoff E        then eta sampling: the same below min(E, sqrt(E) e^-entropy)\n"
               "                        (eta_cutoff; default 0 = off)\n"
               "  --repetition-penalty X   divide the logit of every token already in the sequence by X\n"
               "                        (multiply where negative), greedy too (transformers'; default 1)\n"
               "  --eos-id ID[,ID...]|none   stop after generating one of these tokens (it is printed;\n"
               "                        default: an hf:DIR model's generation settings; with a text\n"
               "                        prompt through a tokenizer.json, its eos_token; else none)\n"
               "  --min-new-tokens N    the stop tokens are never picked before N new tokens (default 0)\n"
               "  --no-repeat-ngram-size N   never repeat an N-gram of the sequence, prompt included\n"
               "                        (transformers' no_repeat_ngram_size; default 0 = off)\n"
               "  --num-beams N         beam search over N beams, as transformers' generate(num_beams=N):\n"
               "                        with --temperature 0 its do_sample=False, with a temperature its\n"
               "                        beam sampling (the filters on each beam, the pairs drawn);\n"
               "                        prints the best finished beam (default 1 = off)\n"
               "  --length-penalty X    beam search: a finished beam scores its log-probability over\n"
               "                        (new tokens)^X (default 1)\n"
               "  --early-stopping true|false|never   beam search: stop once N beams finished (true), when\n"
               "                        no running beam can beat them (false, the default), or as false\n"
               "                        bounding with max-new-tokens (never)\n"
               "  an hf:DIR model takes these defaults from DIR/generation_config.json (or config.json)\n"
               "  as transformers' generate() does: greedy unless do_sample is true (then its temperature,\n"
               "  top_h, top_k (50 when absent), top_p, min_p, typical_p, epsilon_cutoff and eta_cutoff), its\n"
               "  repetition_penalty, eos_token_id,\n"
               "  max_new_tokens, min_new_tokens (or min_length), no_repeat_ngram_size, num_beams,\n"
               "  length_penalty and early_stopping; the options given override them, and keys dtrain does\n"
               "  not apply (penalty_alpha: contrastive search) are named on stderr\n"
               "  --sample-seed N       seed of the sampling draws (default 0)\n"
               "  --kv-cache on|off     keep the keys and values: the prompt runs once, then each new\n"
               "                        token alone (default on; off: a forward over the window per token)\n"
               "  --stream on|off       print each new token as it is generated (the text as far as it is\n"
               "                        whole UTF-8; default off); the same output in the end. Beam search\n"
               "                        prints its best beam at the end\n"
               "prints the prompt and the new tokens as ids, \"p1 ... pn | t1 ... tk\".\n"
               "e.g. dtrain generate --ckpt runs/gpt --vocab kjv.bpe --prompt \"In the beginning\" --top-k 40\n");
}

/* The model name and GPT configuration saved with checkpoint `path`; the
 * command line's overrides (already in *cfg) win. */
static dt_status user_config(const char *path, char **model, dt_model_config *cfg, char **vocab_text)
{
    char *js = NULL;
    dt_status st = dt_trainer_ckpt_user(path, &js);
    if (st < 0)
        return st;
    cJSON *u = cJSON_Parse(js);
    dt_trainer_run_state_free(js);
    if (!u)
        return dt_error(DT_ERR_FORMAT, "%s: its saved options are not JSON", path);
    const cJSON *mv = cJSON_GetObjectItemCaseSensitive(u, "model");
    if (cJSON_IsString(mv) && !(*model = strdup(mv->valuestring))) {
        cJSON_Delete(u);
        return dt_error(DT_ERR_NO_MEMORY, "out of memory");
    }
    const cJSON *vb = cJSON_GetObjectItemCaseSensitive(u, "vocab_bpe"); /* kept by dtrain train --vocab */
    if (cJSON_IsString(vb) && !(*vocab_text = strdup(vb->valuestring))) {
        cJSON_Delete(u);
        return dt_error(DT_ERR_NO_MEMORY, "out of memory");
    }
    const char *keys[] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"};
    int64_t *dst[] = {&cfg->n_layer, &cfg->n_head, &cfg->n_embd, &cfg->block_size, &cfg->vocab_size};
    for (int i = 0; i < 5; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(u, keys[i]);
        if (!*dst[i] && cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1e7)
            *dst[i] = (int64_t)v->valuedouble;
    }
    cJSON_Delete(u);
    return DT_OK;
}

/* Weights from a checkpoint or a safetensors file (path; NULL: the
 * initialisation's), then PEFT's adapters of directory lora (NULL: none),
 * through a trainer (no strategy: one process) as dtrain train
 * --init-from and --lora-from read them. *adapters: whether the adapters
 * failed. */
static dt_status load(dt_model *m, const char *path, const char *lora, bool *adapters)
{
    *adapters = false;
    dt_strategy *s = NULL;
    dt_trainer *tr = NULL;
    dt_trainer_params tp = dt_trainer_params_default();
    dt_status st = dt_strategy_none_init(&s);
    if (st == DT_OK)
        st = dt_trainer_init(m, s, &tp, &tr);
    if (st == DT_OK && path)
        st = dt_trainer_load_weights(tr, path);
    if (st == DT_OK && lora)
        *adapters = (st = dt_trainer_load_peft(tr, lora)) < 0;
    dt_trainer_free(tr);
    return st;
}

/* The text of ids out[0..n) through the tokenizer, or else the BPE vocabulary: an id past it is
 * DT_ERR_RANGE naming it, never another token. */
static dt_status decode_text(const dt_tokenizer *tok, const dt_bpe *bpe, const int64_t *out, int64_t n, char **text,
                             size_t *len)
{
    if (!tok)
        return dt_bpe_decode_ids(bpe, out, n, text, len);
    uint32_t *u = malloc((size_t)(n > 0 ? n : 1) * sizeof *u);
    dt_status st = u ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "out of memory");
    for (int64_t i = 0; st == DT_OK && i < n; i++) /* never narrowed: an id past the tokenizer is an error */
        if (out[i] < 0 || out[i] >= dt_tokenizer_vocab_size(tok))
            st = dt_error(DT_ERR_RANGE,
                          "id %lld at position %lld is outside the tokenizer's %lld ids (the model has more: "
                          "train with the tokenizer's size)",
                          (long long)out[i], (long long)i, (long long)dt_tokenizer_vocab_size(tok));
        else
            u[i] = (uint32_t)out[i];
    if (st == DT_OK)
        st = dt_tokenizer_decode(tok, u, n, false, text, len);
    free(u);
    return st;
}

/* --stream: what has been printed of the sequence. Ids: " | " before the first new one. Text: the decoded
 * sequence's bytes up to its last whole UTF-8 character, shown[0, nshown) kept to check, at the end, that the
 * final text begins with them (a tokenizer whose decoding changes earlier text then gets it printed whole). */
typedef struct {
    const dt_tokenizer *tok;
    const dt_bpe *bpe;
    int64_t np;
    char *shown;
    size_t nshown;
    dt_status st;
} streamer;

/* The length of text[0, len) without an unfinished UTF-8 character at its end. */
static size_t utf8_whole(const char *text, size_t len)
{
    size_t i = len, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)text[i - 1] & 0xC0) == 0x80)
        i--, back++;
    if (i == 0)
        return len;
    const unsigned char lead = (unsigned char)text[i - 1];
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return back + 1 >= need ? len : i - 1;
}

/* dt_generate_params.on_token for --stream (also run once on the prompt). */
static int stream_token(void *ud, const int64_t *seq, int64_t n)
{
    streamer *s = ud;
    if (!s->tok && !s->bpe) {
        if (n > s->np) /* a new token */
            printf("%s%lld", n - 1 == s->np ? " | " : " ", (long long)seq[n - 1]);
        else
            for (int64_t i = 0; i < n; i++)
                printf("%s%lld", i ? " " : "", (long long)seq[i]);
        fflush(stdout);
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    if ((s->st = decode_text(s->tok, s->bpe, seq, n, &text, &len)) < 0)
        return 1; /* stop: said after generation */
    const size_t end = utf8_whole(text, len);
    if (end > s->nshown && (!s->nshown || !memcmp(text, s->shown, s->nshown))) { /* (memcmp takes no NULL) */
        char *grown = realloc(s->shown, end);
        if (grown) {
            fwrite(text + s->nshown, 1, end - s->nshown, stdout);
            fflush(stdout);
            memcpy(grown + s->nshown, text + s->nshown, end - s->nshown);
            s->shown = grown, s->nshown = end;
        }
    }
    free(text);
    return 0;
}

static int bad(void)
{
    dt__cli_err("dtrain generate: %s\n", dt_last_error());
    return 2;
}

/* Option a's value v, "on" or "off", into *on; else said and -1. */
static int on_off(const char *a, const char *v, bool *on)
{
    if (strcmp(v, "on") && strcmp(v, "off")) {
        dt__cli_err("dtrain generate: %s: '%s' is neither on nor off\n", a, v);
        return -1;
    }
    *on = !strcmp(v, "on");
    return 0;
}

/* Option a's value v as a number in (0, hi] into *d; else said (want: what it takes) and -1. */
static int positive(const char *a, const char *v, double hi, const char *want, double *d)
{
    if (dt_parse_double(a, v, 0, hi, d) < 0)
        return bad(), -1;
    if (*d <= 0) {
        dt__cli_err("dtrain generate: %s %s: want %s\n", a, v, want);
        return -1;
    }
    return 0;
}

/* --eos-id ID[,ID...] | none into gp's stop tokens. */
static int parse_eos(const char *v, dt_generate_params *gp)
{
    gp->n_eos = 0;
    if (!strcmp(v, "none"))
        return 0;
    const char *p = v;
    for (;;) {
        const char *c = strchr(p, ',');
        char one[32];
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l == 0 || l >= sizeof one || gp->n_eos == DT_GENERATE_MAX_EOS) {
            dt__cli_err("dtrain generate: --eos-id %s: want 'none' or at most %d comma-separated token ids, none "
                        "empty\n", v, DT_GENERATE_MAX_EOS);
            return -1;
        }
        memcpy(one, p, l);
        one[l] = 0;
        if (dt_parse_int("--eos-id", one, 0, INT32_MAX, &gp->eos_ids[gp->n_eos]) < 0)
            return bad(), -1;
        gp->n_eos++;
        if (!c)
            return 0;
        p = c + 1;
    }
}

/* --chat-template FILE: its Jinja text as t's chat template. */
static dt_status set_template(dt_tokenizer *t, const char *path)
{
    char *tx = NULL;
    size_t n = 0;
    dt_status st = dt_file_read_all(path, (size_t)1 << 20, &tx, &n);
    if (st >= 0)
        st = dt_tokenizer_set_chat_template(t, tx, n, path);
    free(tx);
    return st < 0 ? dt_error(st, "--chat-template: %s", dt_last_error()) : st;
}

/* The template's keyword arguments: the JSON object kwargs (NULL: none) with "tools" the JSON list of file tools
 * (NULL: none), as text (*out malloc'd; NULL when neither is given). Bad input: an error naming the option. */
static dt_status chat_kwargs(const char *kwargs, const char *tools, char **out)
{
    *out = NULL;
    if (!kwargs && !tools)
        return DT_OK;
    cJSON *o = kwargs ? cJSON_Parse(kwargs) : cJSON_CreateObject(), *tl = NULL;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dt_error(DT_ERR_INVALID_ARG, "--chat-template-kwargs: want a JSON object ('{\"enable_thinking\": "
                        "false}'), not %.80s", kwargs);
    }
    char *js = NULL;
    size_t n = 0;
    dt_status st = tools ? dt_file_read_all(tools, (size_t)16 << 20, &js, &n) : DT_OK;
    if (st >= 0 && tools && !cJSON_IsArray(tl = cJSON_ParseWithLength(js, n)))
        st = dt_error(DT_ERR_INVALID_ARG, "--tools %s: want a JSON list of tool schemas ([{\"type\": \"function\", "
                      "\"function\": {...}}, ...])", tools);
    else if (st < 0)
        st = dt_error(st, "--tools %s: %s", tools, dt_last_error());
    if (st >= 0 && tl) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, "tools");
        if (cJSON_AddItemToObject(o, "tools", tl))
            tl = NULL;
        else
            st = dt_error(DT_ERR_NO_MEMORY, "--tools: out of memory");
    }
    if (st >= 0 && !(*out = cJSON_PrintUnformatted(o)))
        st = dt_error(DT_ERR_NO_MEMORY, "--chat-template-kwargs: out of memory");
    cJSON_Delete(tl);
    cJSON_Delete(o);
    free(js);
    return st;
}

/* --chat: [system,] user's prompt through t's chat template, with the generation prompt; or the conversation of
 * JSON file messages (--messages), its final message continued where cont says (1 on, 0 off, -1 auto: an
 * assistant's); kw: the template's keyword arguments (chat_kwargs; NULL: none). */
static dt_status chat_prompt(const dt_tokenizer *t, const char *system, const char *prompt, const char *messages,
                             int cont, const char *kw, char **text, size_t *len)
{
    if (messages) {
        char *js = NULL;
        size_t n = 0;
        dt_status st = dt_file_read_all(messages, (size_t)64 << 20, &js, &n);
        if (st >= 0 && cont < 0) { /* auto: continue an assistant's final message (the render checks the JSON) */
            cJSON *c = cJSON_ParseWithLength(js, n);
            const cJSON *last = cJSON_IsArray(c) && c->child ? c->child->prev : NULL;
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
            cont = cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
            cJSON_Delete(c);
        }
        if (st >= 0)
            st = dt_tokenizer_render_chat(t, js, n, cont ? DT_CHAT_CONTINUE : DT_CHAT_GENERATION_PROMPT, kw,
                                          kw ? strlen(kw) : 0, text, len);
        free(js);
        return st < 0 ? dt_error(st, "--messages %s: %s", messages, dt_last_error()) : st;
    }
    cJSON *c = cJSON_CreateArray(), *m;
    for (int k = system ? 0 : 1; c && k < 2; k++)
        if (!(m = cJSON_CreateObject()) || !cJSON_AddItemToArray(c, m) ||
            !cJSON_AddStringToObject(m, "role", k ? "user" : "system") ||
            !cJSON_AddStringToObject(m, "content", k ? prompt : system)) {
            cJSON_Delete(c);
            c = NULL;
        }
    char *js = c ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    if (!js)
        return dt_error(DT_ERR_NO_MEMORY, "--chat: out of memory");
    dt_status st = dt_tokenizer_render_chat(t, js, strlen(js), DT_CHAT_GENERATION_PROMPT, kw, kw ? strlen(kw) : 0,
                                            text, len);
    cJSON_free(js);
    return st < 0 ? dt_error(st, "--chat: %s", dt_last_error()) : st;
}

/* A refusal after the options were read (said before): what they had read freed; code the exit status. */
static int gen_refused(int code, dt__tuning *tu, char *mname, char *vtext, dt_tokenizer *ttok)
{
    dt__tuning_free(tu);
    free(mname);
    free(vtext);
    dt_tokenizer_free(ttok);
    return code;
}

int dt_cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *ids = NULL, *vocab = NULL, *ptext = NULL, *ckpt = NULL, *weights = NULL,
               *tokenizer = NULL, *lora_from = NULL, *system = NULL, *messages = NULL, *tkwargs = NULL,
               *tools = NULL, *ctemplate = NULL;
    dt_model_config cfg = dt_model_config_default();
    dt_generate_params gp = dt_generate_params_default();
    uint64_t seed = 0;
    bool seed_given = false;
    int cont = -1; /* --continue-final-message: 1 on, 0 off, -1 auto */
    bool cont_given = false;
    /* the options given: they override an hf:DIR model's generation_config.json */
    bool temp_given = false, topk_given = false, topp_given = false, eos_given = false, max_given = false,
         pen_given = false, minnew_given = false, ngram_given = false, beams_given = false, lenpen_given = false,
         early_given = false, minp_given = false, typp_given = false, eps_given = false, eta_given = false,
         toph_given = false, sseed_given = false, stream = false, chat = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x;
        double d;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            dt__cli_err("dtrain generate: %s: unknown option or missing value (see dtrain generate --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model"))
            model = dt__cli_hf_model(v);
        else if (!strcmp(a, "--prompt-ids"))
            ids = v;
        else if (!strcmp(a, "--vocab"))
            vocab = v;
        else if (!strcmp(a, "--tokenizer"))
            tokenizer = v;
        else if (!strcmp(a, "--ckpt"))
            ckpt = v;
        else if (!strcmp(a, "--weights"))
            weights = v;
        else if (!strcmp(a, "--lora-from"))
            lora_from = v;
        else if (!strcmp(a, "--prompt"))
            ptext = v;
        else if (!strcmp(a, "--seed")) {
            if (dt_parse_uint(a, v, 0, UINT64_MAX, &seed) < 0)
                return bad();
            seed_given = true;
        } else if (!strcmp(a, "--sample-seed")) {
            if (dt_parse_uint(a, v, 0, UINT64_MAX, &gp.seed) < 0)
                return bad();
            sseed_given = true;
        } else if (!strcmp(a, "--max-new-tokens")) {
            if (dt_parse_int(a, v, 0, 1000000, &gp.max_new_tokens) < 0)
                return bad();
            max_given = true;
        } else if (!strcmp(a, "--stream")) {
            if (on_off(a, v, &stream) < 0)
                return 2;
        } else if (!strcmp(a, "--chat")) {
            if (on_off(a, v, &chat) < 0)
                return 2;
        } else if (!strcmp(a, "--system")) {
            system = v;
        } else if (!strcmp(a, "--messages")) {
            messages = v;
        } else if (!strcmp(a, "--chat-template-kwargs")) {
            tkwargs = v;
        } else if (!strcmp(a, "--tools")) {
            tools = v;
        } else if (!strcmp(a, "--chat-template")) {
            ctemplate = v;
        } else if (!strcmp(a, "--continue-final-message")) {
            cont = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : !strcmp(v, "auto") ? -1 : -2;
            if (cont == -2) {
                dt__cli_err("dtrain generate: --continue-final-message %s: want auto, on or off\n", v);
                return 2;
            }
            cont_given = true;
        } else if (!strcmp(a, "--kv-cache")) {
            if (on_off(a, v, &gp.kv_cache) < 0)
                return 2;
        } else if (!strcmp(a, "--top-h")) {
            if (dt_parse_double(a, v, 0, 1, &d) < 0)
                return bad();
            gp.top_h = (float)d;
            toph_given = true;
        } else if (!strcmp(a, "--top-k")) {
            if (dt_parse_int(a, v, 0, 100000000, &gp.top_k) < 0)
                return bad();
            topk_given = true;
        } else if (!strcmp(a, "--top-p")) {
            if (positive(a, v, 1, "0 < P <= 1 (1: every token)", &d) < 0)
                return 2;
            gp.top_p = (float)d;
            topp_given = true;
        } else if (!strcmp(a, "--min-p")) {
            if (dt_parse_double(a, v, 0, 1, &d) < 0)
                return bad();
            gp.min_p = (float)d;
            minp_given = true;
        } else if (!strcmp(a, "--typical-p")) {
            if (positive(a, v, 1, "0 < P <= 1 (1: off)", &d) < 0)
                return 2;
            gp.typical_p = (float)d;
            typp_given = true;
        } else if (!strcmp(a, "--epsilon-cutoff") || !strcmp(a, "--eta-cutoff")) {
            if (dt_parse_double(a, v, 0, 1, &d) < 0)
                return bad();
            if (d >= 1) {
                dt__cli_err("dtrain generate: %s %s: want 0 <= E < 1 (0: off)\n", a, v);
                return 2;
            }
            *(a[2] == 'e' && a[3] == 'p' ? &gp.epsilon_cutoff : &gp.eta_cutoff) = (float)d;
            *(a[2] == 'e' && a[3] == 'p' ? &eps_given : &eta_given) = true;
        } else if (!strcmp(a, "--repetition-penalty")) {
            if (positive(a, v, 1e6, "X > 0 (1: none)", &d) < 0)
                return 2;
            gp.repetition_penalty = (float)d;
            pen_given = true;
        } else if (!strcmp(a, "--min-new-tokens")) {
            if (dt_parse_int(a, v, 0, 1000000, &gp.min_new_tokens) < 0)
                return bad();
            minnew_given = true;
        } else if (!strcmp(a, "--no-repeat-ngram-size")) {
            if (dt_parse_int(a, v, 0, 1000000, &gp.no_repeat_ngram_size) < 0)
                return bad();
            ngram_given = true;
        } else if (!strcmp(a, "--num-beams")) {
            if (dt_parse_int(a, v, 1, 100000, &gp.num_beams) < 0)
                return bad();
            beams_given = true;
        } else if (!strcmp(a, "--length-penalty")) {
            if (dt_parse_double(a, v, -1e6, 1e6, &d) < 0)
                return bad();
            gp.length_penalty = (float)d;
            lenpen_given = true;
        } else if (!strcmp(a, "--early-stopping")) {
            if (strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "never")) {
                dt__cli_err("dtrain generate: --early-stopping: '%s' is none of true, false, never\n", v);
                return 2;
            }
            gp.early_stopping = !strcmp(v, "true")    ? DT_EARLY_STOPPING_TRUE
                                : !strcmp(v, "never") ? DT_EARLY_STOPPING_NEVER
                                                      : DT_EARLY_STOPPING_FALSE;
            early_given = true;
        } else if (!strcmp(a, "--eos-id")) {
            if (parse_eos(v, &gp) < 0)
                return 2;
            eos_given = true;
        } else if (!strcmp(a, "--temperature")) {
            if (dt_parse_double(a, v, 0, 1e6, &d) < 0)
                return bad();
            gp.temperature = (float)d;
            temp_given = true;
        } else if (!strcmp(a, "--n-layer") || !strcmp(a, "--n-head") || !strcmp(a, "--n-embd") ||
                   !strcmp(a, "--block-size") || !strcmp(a, "--vocab-size")) {
            if (dt_parse_int(a, v, 1, 10000000, &x) < 0)
                return bad();
            *(!strcmp(a, "--n-layer") ? &cfg.n_layer : !strcmp(a, "--n-head") ? &cfg.n_head
              : !strcmp(a, "--n-embd") ? &cfg.n_embd : !strcmp(a, "--block-size") ? &cfg.block_size
              : &cfg.vocab_size) = x;
        } else {
            dt__cli_err("dtrain generate: unknown option '%s' (see dtrain generate --help)\n", a);
            return 2;
        }
    }
    char *mname = NULL, *vtext = NULL;
    dt_tokenizer *ttok = NULL; /* the tokenizer.json a --ckpt run trained with --tokenizer keeps */
    if (ckpt && weights) {
        dt__cli_err("dtrain generate: give --ckpt or --weights, not both\n");
        return 2;
    }
    const bool hf_model = model && !strncmp(model, "hf:", 3);
    if (seed_given && (ckpt || weights || hf_model)) { /* it would be silently ignored */
        dt__cli_err("dtrain generate: --seed draws the initial weights, which %s replaces: --sample-seed N seeds "
                    "the sampling\n", ckpt ? "--ckpt" : weights ? "--weights" : "--model hf:DIR's own");
        return 2;
    }
    if (vocab && tokenizer) {
        dt__cli_err("dtrain generate: give --vocab (dtrain's BPE) or --tokenizer (a tokenizer.json), not both\n");
        return 2;
    }
    if (ckpt && (user_config(ckpt, &mname, &cfg, &vtext) < 0 || dt__ckpt_tokenizer(ckpt, &ttok) < 0)) {
        dt__cli_err("dtrain generate: --ckpt: %s\n", dt_last_error());
        free(mname);
        free(vtext);
        dt_tokenizer_free(ttok);
        return 2;
    }
    if (!model)
        model = mname;
    dt__tuning tu; /* a LoRA run's checkpoint: the model with its adapters */
    dt_lora_params lp;
    dt_lora_peft_config peft; /* --lora-from's settings */
    memset(&tu, 0, sizeof tu);
    memset(&peft, 0, sizeof peft);
    if (ckpt && dt__tuning_read(ckpt, &tu) >= 0 && tu.lora_targets) {
        if (lora_from) {
            dt__cli_err("dtrain generate: --ckpt %s holds a LoRA run's adapters: --lora-from would add others; give "
                        "one of them\n", ckpt);
        } else if (dt__tuning_lora(&tu, &lp) >= 0) {
            cfg.build.lora = &lp;
        }
        if (lora_from || !cfg.build.lora) {
            int code = lora_from ? 2 : bad();
            return gen_refused(code, &tu, mname, vtext, ttok);
        }
    }
    if (lora_from) {
        dt_status ls = dt_lora_peft_config_read(lora_from, &peft);
        if (ls < 0) {
            dt__cli_err("dtrain generate: --lora-from: %s\n", dt_last_error());
            return gen_refused(ls == DT_ERR_NO_MEMORY ? 1 : 2, &tu, mname, vtext, ttok);
        }
        cfg.build.lora = &peft.params;
        if (peft.left_out) /* an image-text model's: this model has no vision tower */
            dt__cli_err("dtrain generate: note: --lora-from %s: %zu adapter tensors of an image-text model's vision "
                        "tower or projector left out (the language model's load)\n", lora_from, peft.left_out);
    }
    dt_error_clear();
    if (cont_given && !messages) {
        dt__cli_err("dtrain generate: --continue-final-message continues the final message of --messages FILE: give "
                    "the conversation with it\n");
        return gen_refused(2, &tu, mname, vtext, ttok);
    }
    if (messages && (ptext || ids || system)) {
        dt__cli_err("dtrain generate: --messages FILE is the whole conversation: not with %s\n",
                    ptext ? "--prompt" : ids ? "--prompt-ids" : "--system");
        return gen_refused(2, &tu, mname, vtext, ttok);
    }
    if (messages) /* a prompt through the chat template: the paths of --prompt --chat on */
        ptext = messages, chat = true;
    char hftok[4200]; /* --prompt with an hf:DIR model: DIR/tokenizer.json unless told another */
    bool hf_tok = ptext && !vocab && !tokenizer && !vtext && !ttok && model &&
                  dt_hf_dir_tokenizer(model, hftok, sizeof hftok);
    if (!model || !(ids || ptext) || (ids && ptext) || (ptext && !vocab && !tokenizer && !vtext && !ttok && !hf_tok) ||
        ((vocab || tokenizer) && !ptext)) {
        dt__cli_err("dtrain generate: give --model and either --prompt-ids, or --prompt with --vocab or --tokenizer "
                    "(see dtrain generate --help)\n");
        return gen_refused(2, &tu, mname, vtext, ttok);
    }
    if ((chat || system) && !(ptext && (tokenizer || hf_tok || (ttok && !vocab)))) {
        dt__cli_err("dtrain generate: %s goes with %s through a tokenizer.json (--tokenizer, an hf:DIR model's, or "
                    "a --ckpt run's), whose chat template it applies\n",
                    messages ? "--messages" : system ? "--system" : "--chat", messages ? "a model" : "--prompt");
        return gen_refused(2, &tu, mname, vtext, ttok);
    }
    if ((tkwargs || tools || ctemplate) && !chat) {
        dt__cli_err("dtrain generate: %s goes to the chat template: give --chat on (or --messages FILE) with it\n",
                    tkwargs ? "--chat-template-kwargs" : tools ? "--tools" : "--chat-template");
        return gen_refused(2, &tu, mname, vtext, ttok);
    }
    if (system && !chat) {
        dt__cli_err("dtrain generate: --system is a message of a conversation: give --chat on with it\n");
        return gen_refused(2, &tu, mname, vtext, ttok);
    }
    int64_t np = 0;
    int rc = 2;
    dt_model *m = NULL;
    dt_bpe *bpe = NULL;
    dt_tokenizer *tok = NULL;
    int64_t *out = NULL, *prompt = NULL;
    char *copy = NULL;
    if (ptext && (tokenizer || hf_tok || (ttok && !vocab))) { /* through a tokenizer.json */
        uint32_t *enc = NULL;
        if (!tokenizer && !hf_tok)
            tok = ttok, ttok = NULL; /* the checkpoint's */
        char *ctext = NULL, *kw = NULL;
        size_t clen = 0;
        if ((!tok && dt_tokenizer_load(tokenizer ? tokenizer : hftok, &tok) < 0) ||
            (ctemplate && set_template(tok, ctemplate) < 0) || chat_kwargs(tkwargs, tools, &kw) < 0 ||
            (chat && chat_prompt(tok, system, messages ? NULL : ptext, messages, cont, kw, &ctext, &clen) < 0) ||
            dt_tokenizer_encode(tok, chat ? ctext : ptext, chat ? clen : strlen(ptext), !chat, &enc, &np) < 0) {
            free(ctext);
            cJSON_free(kw);
            rc = bad();
            goto done;
        }
        free(ctext);
        cJSON_free(kw);
        prompt = malloc((size_t)(np > 0 ? np : 1) * sizeof *prompt);
        for (int64_t i = 0; prompt && i < np; i++)
            prompt[i] = enc[i];
        free(enc);
    } else if (ptext) { /* the prompt: text through the vocabulary (--vocab, or the checkpoint's) */
        uint16_t *enc = NULL;
        if ((vocab ? dt_bpe_load(vocab, &bpe) : dt_bpe_load_mem(vtext, strlen(vtext), "--ckpt's vocabulary", &bpe)) <
                0 || dt_bpe_encode(bpe, ptext, strlen(ptext), &enc, &np) < 0) {
            rc = bad();
            goto done;
        }
        prompt = malloc((size_t)(np > 0 ? np : 1) * sizeof *prompt);
        for (int64_t i = 0; prompt && i < np; i++)
            prompt[i] = enc[i];
        free(enc);
    } else { /* comma-separated ids */
        size_t cap = 1;
        for (const char *p = ids; *p; p++)
            cap += *p == ',';
        if (ids[0] == ',' || (ids[0] && ids[strlen(ids) - 1] == ',') || strstr(ids, ",,")) {
            dt__cli_err("dtrain generate: --prompt-ids %s: an empty id (comma-separated ids, none empty)\n", ids);
            goto done;
        }
        prompt = malloc(cap * sizeof *prompt);
        copy = strdup(ids);
        for (char *save = NULL, *piece = prompt && copy ? strtok_r(copy, ",", &save) : NULL; piece;
             piece = strtok_r(NULL, ",", &save))
            if (dt_parse_int("--prompt-ids", piece, 0, 100000000, &prompt[np++]) < 0) {
                rc = bad();
                goto done;
            }
    }
    if (!prompt || (ids && !copy)) {
        dt__cli_err("dtrain generate: out of memory\n");
        rc = 1;
        goto done;
    }
    if (np == 0) {
        dt__cli_err("dtrain generate: the prompt has no tokens\n");
        goto done;
    }
    if (!strcmp(model, "mlp") || !strcmp(model, "convnet")) { /* no tokens: built whole, then refused */
        if (ckpt)
            dt__cli_err("dtrain generate: --ckpt %s: its model %s is not a language model (GPT-2, Llama and "
                        "hf:DIR models generate)\n", ckpt, model);
        else
            dt__cli_err("dtrain generate: --model %s is not a language model (GPT-2, Llama and hf:DIR models "
                        "generate)\n", model);
        goto done;
    }
    dt_model_desc desc;
    if (dt_model_create(model, seed, &cfg, &m, &desc) < 0) {
        dt__cli_err("dtrain generate: --model %s: %s\n", model, dt_last_error());
        goto done;
    }
    for (int64_t i = 0; ids && i < np; i++) /* the flag named, before any weight is read */
        if (prompt[i] >= desc.input_classes) {
            dt__cli_err("dtrain generate: --prompt-ids: %lld (at %lld) is outside the model's vocabulary [0, %lld)\n",
                        (long long)prompt[i], (long long)i, (long long)desc.input_classes);
            goto done;
        }
    if (!strncmp(model, "hf:", 3)) { /* the directory's generation settings where no option overrides them */
        dt_generate_params hg = gp;
        char ignored[512];
        if (dt_hf_generation_config(model + 3, &hg, ignored, sizeof ignored) < 0) {
            dt__cli_err("dtrain generate: --model %s: %s\n", model, dt_last_error());
            goto done;
        }
        if (!temp_given)
            gp.temperature = hg.temperature;
        if (!topk_given)
            gp.top_k = hg.top_k;
        if (!topp_given)
            gp.top_p = hg.top_p;
        if (!minp_given)
            gp.min_p = hg.min_p;
        if (!typp_given)
            gp.typical_p = hg.typical_p;
        if (!eps_given)
            gp.epsilon_cutoff = hg.epsilon_cutoff;
        if (!toph_given)
            gp.top_h = hg.top_h;
        if (!eta_given)
            gp.eta_cutoff = hg.eta_cutoff;
        if (!max_given)
            gp.max_new_tokens = hg.max_new_tokens;
        if (!pen_given)
            gp.repetition_penalty = hg.repetition_penalty;
        if (!minnew_given) /* the option replaces both keys, as min_new_tokens replaces min_length */
            gp.min_new_tokens = hg.min_new_tokens, gp.min_length = hg.min_length;
        if (!ngram_given)
            gp.no_repeat_ngram_size = hg.no_repeat_ngram_size;
        if (!beams_given)
            gp.num_beams = hg.num_beams;
        if (!lenpen_given)
            gp.length_penalty = hg.length_penalty;
        if (!early_given)
            gp.early_stopping = hg.early_stopping;
        if (!eos_given) {
            memcpy(gp.eos_ids, hg.eos_ids, sizeof gp.eos_ids);
            gp.n_eos = hg.n_eos;
        }
        if (ignored[0])
            dt__cli_err("dtrain generate: note: %s's generation settings %s are not applied (dtrain generate "
                        "applies the repetition penalty, the n-gram ban, the minimum length, temperature, top-h, "
                        "top-k, top-p, min-p, typical-p, the epsilon and eta cutoffs, stop tokens and beam "
                        "search)\n",
                        model + 3, ignored);
    }
    /* a text prompt through a tokenizer.json, no model directory's generation settings, no --eos-id: the
       tokenizer's eos_token ends the text, as transformers' generate stops at the model's eos_token_id (a run
       trained on documents learnt to end them with it; the --ckpt run's tokenizer is the one it trained with) */
    uint32_t teos;
    if (!eos_given && !hf_model && tok && dt_tokenizer_eos(tok, &teos) == DT_OK)
        gp.eos_ids[0] = teos, gp.n_eos = 1;
    dt_error_clear();
    /* Options of a decoding mode not chosen: refused, as they were ignored (transformers warns and ignores them) */
    const char *samp = toph_given ? "--top-h" : topk_given ? "--top-k" : topp_given ? "--top-p"
                       : minp_given ? "--min-p" : typp_given ? "--typical-p" : eps_given ? "--epsilon-cutoff"
                       : eta_given  ? "--eta-cutoff" : sseed_given ? "--sample-seed" : NULL;
    if (samp && gp.temperature == 0) {
        dt__cli_err("dtrain generate: %s applies to sampling, and this run decodes %s (%s): give --temperature X "
                    "> 0 to sample\n", samp, gp.num_beams > 1 ? "by beam search" : "greedily",
                    temp_given ? "--temperature 0" : "the model's generation_config.json: do_sample false or absent");
        goto done;
    }
    if ((lenpen_given || early_given) && gp.num_beams == 1) {
        dt__cli_err("dtrain generate: %s applies to beam search (--num-beams N > 1%s)\n",
                    lenpen_given ? "--length-penalty" : "--early-stopping",
                    beams_given ? "" : "; this run decodes one sequence");
        goto done;
    }
    const char *from = ckpt ? ckpt : weights ? weights : !strncmp(model, "hf:", 3) ? model + 3 : NULL;
    bool adapters = false;
    if ((from || lora_from) && load(m, from, lora_from, &adapters) < 0) { /* hf:DIR: its own unless told others */
        dt__cli_err("dtrain generate: %s: %s\n", adapters ? "--lora-from" : ckpt ? "--ckpt"
                    : weights ? "--weights" : "--model", dt_last_error());
        rc = dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2;
        goto done;
    }
    int64_t n = 0, total = np + gp.max_new_tokens, pos = dt_generate_positions(m);
    if (pos > 0 && np > pos) /* the window moves: said, not silent */
        dt__cli_err("dtrain generate: note: the prompt's %lld tokens are more than the model's %lld positions: "
                    "each new token sees the last %lld tokens alone\n", (long long)np, (long long)pos,
                    (long long)pos);
    else if (pos > 0 && total > pos)
        dt__cli_err("dtrain generate: note: the prompt's %lld tokens and up to %lld new ones pass the model's %lld "
                    "positions: from there on each new token sees the last %lld tokens alone\n", (long long)np,
                    (long long)gp.max_new_tokens, (long long)pos, (long long)pos);
    out = malloc((size_t)total * sizeof *out);
    if (!out) {
        dt__cli_err("dtrain generate: out of memory\n");
        rc = 1;
        goto done;
    }
    streamer sm = {.tok = tok, .bpe = bpe, .np = np, .st = DT_OK};
    stream = stream && gp.num_beams == 1; /* beam search: its best beam at the end */
    if (stream) {
        gp.on_token = stream_token, gp.on_token_ud = &sm;
        stream_token(&sm, prompt, np);
    }
    dt_status st = dt_model_generate(m, &gp, prompt, np, out, total, &n);
    if (st == DT_OK && sm.st < 0) /* the streamed text could not be decoded */
        st = sm.st;
    if (st < 0) {
        if (stream)
            printf("\n");
        dt__cli_err("dtrain generate: %s\n", dt_last_error());
        rc = st == DT_ERR_RANGE || st == DT_ERR_INVALID_ARG || st == DT_ERR_UNSUPPORTED ? 2 : 1;
        free(sm.shown);
        goto done;
    }
    if (tok || bpe) {
        char *text = NULL; /* an id past the vocabulary (a model wider than it): an error, never another token */
        size_t len = 0;
        if ((st = decode_text(tok, bpe, out, n, &text, &len)) < 0) {
            dt__cli_err("dtrain generate: %s\n", dt_last_error());
            rc = st == DT_ERR_RANGE ? 2 : 1;
            free(sm.shown);
            goto done;
        }
        size_t done_len = 0; /* the streamed part, when the final text begins with it */
        if (stream && sm.nshown <= len && (!sm.nshown || !memcmp(text, sm.shown, sm.nshown)))
            done_len = sm.nshown;
        else if (stream)
            printf("\n"); /* decoding changed text already shown: the final text whole */
        fwrite(text + done_len, 1, len - done_len, stdout);
        printf("\n");
        free(text);
    } else if (stream) {
        printf("\n");
    } else {
        for (int64_t i = 0; i < n; i++)
            printf("%s%lld", i == 0 ? "" : i == np ? " | " : " ", (long long)out[i]);
        printf("\n");
    }
    free(sm.shown);
    rc = 0;
done:
    dt__tuning_free(&tu);
    dt_lora_peft_config_free(&peft);
    free(mname);
    free(vtext);
    dt_tokenizer_free(ttok);
    dt_bpe_free(bpe);
    dt_tokenizer_free(tok);
    free(out);
    dt_model_free(m);
    free(copy);
    free(prompt);
    return rc;
}
