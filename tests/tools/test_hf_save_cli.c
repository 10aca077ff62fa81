/* Hugging Face model directories out: `dtrain train --save-hf OUT` and
 * `dtrain ckpt convert --hf OUT SRC`. The directory holds config.json,
 * generation_config.json and the weights (sharded with
 * model.safetensors.index.json above --hf-shard-size), names as
 * transformers writes them (a tied GPT-2 head left out), and dtrain reads
 * it back to the same loss as the run's own checkpoint; an existing OUT is
 * refused (exit 2, left as it was) and no temporary is left behind. With a
 * tokenizer (--tokenizer, or hf:DIR holding a tokenizer.json) the directory
 * also holds tokenizer.json (the same bytes), tokenizer_config.json and
 * special_tokens_map.json (valid JSON naming the eos token); a bad
 * tokenizer is exit 2 naming the file and the key, nothing written. An
 * hf:DIR model's bos and eos ids (a list of eos ids too) are written back
 * as its config.json gives them.
 * (transformers itself loading these directories is checked outside the
 * test suite: scripts/check_hf_export.py.) */
// dt-test-timeout: 300
#include "dtrain/ckpt.h"
#include "dtrain/models.h"
#include "dtrain/tokenizer.h"
#include "test.h"
#include "tools/train_cli.h"

#include <cjson/cJSON.h>
#include <dirent.h>

#define HF DT_SOURCE_DIR "/tests/data/hf/"

static double json_loss(const char *out)
{
    const char *p = strstr(out, "{\"loss\":");
    return p ? atof(p + 8) : NAN;
}

static double eval_loss(char **args)
{
    cli_result r;
    cli_runv(&r, 120, NULL, args);
    if (r.code != 0)
        fprintf(stderr, "  eval: code %d: %s", r.code, r.err);
    return r.code == 0 ? json_loss(r.out) : NAN;
}

/* Entries of dir whose name starts with prefix. */
static int count_prefix(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return n;
}

static bool has_tensor(const char *path, const char *name)
{
    dt_st_file *f = NULL;
    if (dt_st_open(path, &f) < 0)
        return false;
    bool h = dt_st_find(f, name) != NULL;
    dt_st_close(f);
    return h;
}

TEST(train_save_hf_llama)
{
    char *run = cli_path("run_llama"), *out = cli_path("llama_hf");
    cli_result r;
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--vocab-size", "128", "--data", "tokens:" HF "tokens.bin",
                        "--no-eval", "--seq", "16", "--batch", "2", "--max-steps", "3", "--progress", "none",
                        "--dropout", "0.1", "--save", run, "--save-hf", out, "--hf-shard-size", "100000", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "saved ");
    char p[600], cfg[4096];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    ASSERT(file_exists(p));
    snprintf(p, sizeof p, "%s/model-00001-of-00005.safetensors", out);
    ASSERT(file_exists(p));
    ASSERT(has_tensor(p, "model.embed_tokens.weight"));
    snprintf(p, sizeof p, "%s/generation_config.json", out);
    ASSERT(file_exists(p));
    snprintf(p, sizeof p, "%s/config.json", out);
    slurp_(p, cfg, sizeof cfg);
    ASSERT_STR_CONTAINS(cfg, "\"LlamaForCausalLM\"");
    ASSERT_STR_CONTAINS(cfg, "\"num_key_value_heads\":\t2");
    ASSERT_STR_CONTAINS(cfg, "\"rms_norm_eps\":\t1e-05");
    ASSERT_STR_CONTAINS(cfg, "\"attention_dropout\":\t0.1,"); /* the run's --dropout: Llama's attention's */
    ASSERT_EQ_INT(count_prefix(cli_tmpdir(), "llama_hf."), 0); /* no temporaries left */
    /* the directory reads back to the run's own loss */
    char m[600];
    snprintf(m, sizeof m, "hf:%s", out);
    double a = eval_loss((char *[]){"eval", "--ckpt", run, "--data", "tokens:" HF "tokens.bin", "--val-data",
                                    "tokens:" HF "tokens.bin", "--json", NULL});
    double b = eval_loss((char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16",
                                    "--json", NULL});
    fprintf(stderr, "  run %.9g, exported %.9g\n", a, b);
    ASSERT(isfinite(a));
    ASSERT_NEAR(b, a, 0, 1e-6);
    /* convert --hf from the checkpoint: the same directory; OUT in the way: refused, untouched */
    char *out2 = cli_path("llama_hf2");
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--hf", out2, run, NULL});
    ASSERT_EQ_INT(r.code, 0);
    snprintf(p, sizeof p, "%s/model.safetensors", out2);
    ASSERT(file_exists(p)); /* under 5 GB: one file, no index */
    snprintf(p, sizeof p, "%s/config.json", out2);
    slurp_(p, cfg, sizeof cfg);
    ASSERT_STR_CONTAINS(cfg, "\"attention_dropout\":\t0.1,");
    snprintf(m, sizeof m, "hf:%s", out2);
    double c = eval_loss((char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16",
                                    "--json", NULL});
    ASSERT_NEAR(c, a, 0, 1e-6);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--hf", out, run, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "not empty");
    snprintf(p, sizeof p, "%s/model-00005-of-00005.safetensors", out);
    ASSERT(file_exists(p));
    /* train refuses it before training */
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--vocab-size", "128", "--data", "tokens:" HF "tokens.bin",
                        "--no-eval", "--seq", "16", "--max-steps", "1", "--progress", "none", "--save-hf", out,
                        NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--save-hf");
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "convnet", "--data", "random", "--max-steps", "1", "--progress", "none",
                        "--save-hf", cli_path("convnet_hf"), NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT(!file_exists(cli_path("convnet_hf")));
}

/* GPT-2 from a Hugging Face directory, trained in bf16, exported without a
 * temporary checkpoint left: the tied head is stored once, under
 * transformer.wte.weight, as transformers writes it. */
TEST(train_save_hf_gpt2)
{
    char *out = cli_path("gpt2_hf"), slash[600];
    /* named with a trailing slash: the temporary went inside OUT (out/.tmp-XXXXXX), and the export failed
       after the training */
    snprintf(slash, sizeof slash, "%s/", out);
    cli_result r;
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "hf:" HF "gpt2", "--data", "tokens:" HF "tokens.bin", "--no-eval", "--seq",
                        "16", "--batch", "2", "--max-steps", "2", "--precision", "bf16", "--progress", "none",
                        "--save-hf", slash, NULL});
    if (r.code != 0)
        fprintf(stderr, "%s", r.err);
    ASSERT_EQ_INT(r.code, 0);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    ASSERT(has_tensor(p, "transformer.wte.weight"));
    ASSERT(!has_tensor(p, "lm_head.weight"));
    ASSERT(has_tensor(p, "transformer.h.1.attn.c_attn.weight"));
    ASSERT_EQ_INT(count_prefix(cli_tmpdir(), "gpt2_hf."), 0);
    char m[600];
    snprintf(m, sizeof m, "hf:%s", out);
    double b = eval_loss((char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16",
                                    "--json", NULL});
    ASSERT(isfinite(b) && b < 6);
    /* a symlink to an empty directory, named link/: refused before the training like link (lstat of link/
       follows the link: it was taken, and the export failed after the training) */
    char *real = cli_path("gpt2_hf_real"), *link = cli_path("gpt2_hf_link"), ls[600];
    ASSERT_EQ_INT(mkdir(real, 0755), 0);
    ASSERT_EQ_INT(symlink(real, link), 0);
    snprintf(ls, sizeof ls, "%s/", link);
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "hf:" HF "gpt2", "--data", "tokens:" HF "tokens.bin", "--no-eval", "--seq",
                        "16", "--batch", "2", "--max-steps", "2", "--progress", "plain", "--save-hf", ls, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is a symlink");
    ASSERT(!strstr(r.out, "first step done"));
    ASSERT_EQ_INT(count_prefix(real, ""), 2); /* . and .. */
}

#define TOK DT_SOURCE_DIR "/tests/data/tokenizer/"

/* out holds tokenizer.json equal to src byte for byte and the two JSON
 * files transformers reads beside it. */
static void check_tokenizer_files(const char *out, const char *src, const char *eos)
{
    char p[600], text[1 << 16];
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    ASSERT(same_file(p, src));
    dt_tokenizer *t = NULL;
    ASSERT_EQ_INT(dt_tokenizer_load(out, &t), DT_OK);
    dt_tokenizer_free(t);
    const char *names[] = {"tokenizer_config.json", "special_tokens_map.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", out, names[i]);
        ASSERT(file_exists(p));
        slurp_(p, text, sizeof text);
        cJSON *j = cJSON_Parse(text);
        ASSERT(cJSON_IsObject(j));
        ASSERT_STR_EQ(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "eos_token")), eos);
        if (i == 0) {
            ASSERT_STR_EQ(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "tokenizer_class")),
                          "PreTrainedTokenizerFast");
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "added_tokens_decoder");
            ASSERT(cJSON_IsObject(d) && cJSON_GetArraySize(d) >= 1);
        }
        cJSON_Delete(j);
    }
}

TEST(tokenizer_files)
{
    char *run = cli_path("run_tok"), *out = cli_path("tok_hf"), data[700];
    snprintf(data, sizeof data, "text:%s", TOK "bible.txt");
    cli_result r;
    /* --tokenizer with text data: --save-hf writes the tokenizer */
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--tokenizer", TOK "dtrain.json", "--data", data,
                        "--no-eval", "--seq", "16", "--batch", "2", "--max-steps", "1", "--progress", "none",
                        "--save", run, "--save-hf", out, NULL});
    if (r.code != 0)
        fprintf(stderr, "  %s", r.err);
    ASSERT_EQ_INT(r.code, 0);
    check_tokenizer_files(out, TOK "dtrain.json", "<|endoftext|>");
    /* hf:DIR holding a tokenizer.json: --save-hf writes it again */
    char m[600], *out2 = cli_path("tok_hf2");
    snprintf(m, sizeof m, "hf:%s", out);
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", m, "--data", "tokens:" HF "tokens.bin", "--no-eval", "--seq", "16",
                        "--batch", "2", "--max-steps", "1", "--progress", "none", "--save-hf", out2, NULL});
    ASSERT_EQ_INT(r.code, 0);
    check_tokenizer_files(out2, TOK "dtrain.json", "<|endoftext|>");
    /* text data with an hf:DIR model and no --tokenizer: DIR's own (as AutoTokenizer.from_pretrained(DIR)), said;
       the same losses as with --tokenizer DIR/tokenizer.json (it was exit 2, "need --tokenizer") */
    char *ma = cli_path("tok_auto.jsonl"), *mb = cli_path("tok_given.jsonl"), given[700];
    snprintf(given, sizeof given, "%s/tokenizer.json", out);
    char *const base[] = {"train", "--model", m, "--data", data, "--no-eval", "--seq", "16", "--batch", "2",
                          "--max-steps", "3", "--progress", "none", "--log-every", "1", NULL};
    char *const *la[] = {base, (char *[]){"--metrics", ma, NULL}};
    char *const *lb[] = {base, (char *[]){"--metrics", mb, "--tokenizer", given, NULL}};
    cli_run_ranks(&r, 120, NULL, 1, 2, la);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "tokenizer.json (the model's; --tokenizer FILE gives another)");
    cli_run_ranks(&r, 120, NULL, 1, 2, lb);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!strstr(r.out, "(the model's;"));
    ASSERT(cli_same_metrics(ma, mb, 3, 0));
    /* ckpt convert --hf --tokenizer */
    char *out3 = cli_path("tok_hf3");
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--hf", out3, run, "--tokenizer", TOK "gpt2.json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    check_tokenizer_files(out3, TOK "gpt2.json", "<|endoftext|>");
    /* a bad tokenizer: exit 2 naming the file and the key, nothing written */
    char *bad = cli_path("wordpiece.json"), *out4 = cli_path("tok_hf4");
    const char *wp = "{\"version\":\"1.0\",\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}";
    FILE *f = fopen(bad, "w");
    ASSERT(f && fputs(wp, f) >= 0 && fclose(f) == 0);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--hf", out4, run, "--tokenizer", bad, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "wordpiece.json");
    ASSERT_STR_CONTAINS(r.err, "model.type");
    ASSERT(!file_exists(out4));
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/tokenizer.json'", bad, out2);
    ASSERT_EQ_INT(system(cmd), 0);
    snprintf(m, sizeof m, "hf:%s", out2);
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", m, "--data", "tokens:" HF "tokens.bin", "--no-eval", "--seq", "16",
                        "--batch", "2", "--max-steps", "1", "--progress", "none", "--save-hf", out4, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "tok_hf2/tokenizer.json");
    ASSERT_STR_CONTAINS(r.err, "model.type");
    ASSERT(!file_exists(out4));
    ASSERT_EQ_INT(count_prefix(cli_tmpdir(), "tok_hf4"), 0);
}

/* dir/name's key as JSON text ("[2,5]", "1", "null"; "" when the key is absent). */
static void key_text(const char *dir, const char *name, const char *key, char *buf, size_t n)
{
    char p[700], text[1 << 14];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    slurp_(p, text, sizeof text);
    cJSON *j = cJSON_Parse(text);
    char *v = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(j, key));
    snprintf(buf, n, "%s", v ? v : "");
    cJSON_free(v);
    cJSON_Delete(j);
}

/* An hf:DIR model's special tokens are exported as its config.json gives
 * them: Llama 3 instruct's list of eos ids (every one stops generation in
 * transformers; the export kept only the first), GPT-2's bos and eos (the
 * export wrote null unless the vocabulary was GPT-2's own). */
TEST(special_tokens_kept)
{
    char *src = cli_path("eos_list"), *out = cli_path("eos_list_hf"), *out2 = cli_path("gpt2_tok_hf"), cmd[2000];
    snprintf(cmd, sizeof cmd, "cp -r '%sllama' '%s' && sed -i 's/\"eos_token_id\": 2,/\"eos_token_id\": [2, 5, 7],/' "
             "'%s/config.json' && rm '%s/generation_config.json'", HF, src, src, src);
    ASSERT_EQ_INT(system(cmd), 0);
    char m[600], v[200];
    snprintf(m, sizeof m, "hf:%s", src);
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--hf", out, src, "--model", m, NULL});
    ASSERT_EQ_INT(r.code, 0);
    const char *files[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        key_text(out, files[i], "eos_token_id", v, sizeof v);
        ASSERT_STR_EQ(v, "[2,5,7]");
        key_text(out, files[i], "bos_token_id", v, sizeof v);
        ASSERT_STR_EQ(v, "1");
    }
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--hf", out2, HF "gpt2", "--model", "hf:" HF "gpt2", NULL});
    ASSERT_EQ_INT(r.code, 0);
    for (int i = 0; i < 2; i++) {
        key_text(out2, files[i], "bos_token_id", v, sizeof v);
        ASSERT_STR_EQ(v, "1");
        key_text(out2, files[i], "eos_token_id", v, sizeof v);
        ASSERT_STR_EQ(v, "2");
    }
}

/* An hf:DIR source's generation_config.json (its sampling settings, which generate reads) is exported byte for
 * byte by --save-hf and ckpt convert --hf; a malformed one is refused before training, nothing written. */
TEST(generation_config_kept)
{
    char *src = cli_path("gen_src"), *out = cli_path("gen_hf"), *out2 = cli_path("gen_hf2"), *run = cli_path("gen_run");
    char cmd[2000], m[600];
    const char *gen = "{\"do_sample\": true, \"temperature\": 0.6, \"top_p\": 0.9, \"eos_token_id\": [2, 5]}\n";
    snprintf(cmd, sizeof cmd, "cp -r '%sllama' '%s' && printf '%%s' '%s' > '%s/generation_config.json'", HF, src, gen,
             src);
    ASSERT_EQ_INT(system(cmd), 0);
    snprintf(m, sizeof m, "hf:%s", src);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--batch", "2",
                        "--max-steps", "1", "--no-eval", "--progress", "none", "--save", run, "--save-hf", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    char p[700], text[512];
    snprintf(p, sizeof p, "%s/generation_config.json", out);
    slurp_(p, text, sizeof text);
    ASSERT_STR_EQ(text, gen);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--hf", out2, run, NULL}); /* its model: hf:src */
    ASSERT_EQ_INT(r.code, 0);
    snprintf(p, sizeof p, "%s/generation_config.json", out2);
    slurp_(p, text, sizeof text);
    ASSERT_STR_EQ(text, gen);
    snprintf(cmd, sizeof cmd, "printf '{\"do_sample\": true, \"top_p\": 7}' > '%s/generation_config.json'", src);
    ASSERT_EQ_INT(system(cmd), 0);
    char *out3 = cli_path("gen_hf3"), *run3 = cli_path("gen_run3");
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--batch", "2",
                        "--max-steps", "1", "--no-eval", "--progress", "none", "--save", run3, "--save-hf", out3,
                        NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "generation_config.json: key \"top_p\"");
    ASSERT(!file_exists(out3) && !file_exists(run3));
}

/* OUT's missing parent directories are made (save_pretrained's os.makedirs; --save-lora did so): without
 * --save, `--save-hf runs/a/b` trained the whole run and then failed (exit 1) naming runs/a/b.ckpt-tmp;
 * `ckpt convert --hf` failed likewise. No temporary is left beside OUT. */
TEST(save_hf_makes_missing_parents)
{
    char *out = cli_path("nested/a/b"), *conv = cli_path("nested2/c/d"), *run = cli_path("run_nested");
    cli_result r;
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--vocab-size", "128", "--data", "tokens:" HF "tokens.bin",
                        "--no-eval", "--seq", "16", "--batch", "2", "--max-steps", "1", "--progress", "none",
                        "--save-hf", out, NULL});
    if (r.code)
        fprintf(stderr, "%s\n", r.err);
    ASSERT_EQ_INT(r.code, 0);
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", out);
    ASSERT(file_exists(p));
    ASSERT_EQ_INT(count_prefix(cli_path("nested/a"), "b."), 0); /* no b.ckpt-tmp left */
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--vocab-size", "128", "--data", "tokens:" HF "tokens.bin",
                        "--no-eval", "--seq", "16", "--batch", "2", "--max-steps", "1", "--progress", "none",
                        "--save", run, NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 120, NULL, (char *[]){"ckpt", "convert", "--hf", conv, run, NULL});
    if (r.code)
        fprintf(stderr, "%s\n", r.err);
    ASSERT_EQ_INT(r.code, 0);
    snprintf(p, sizeof p, "%s/config.json", conv);
    ASSERT(file_exists(p));
}

/* The name of dir's first entry starting with prefix into out ("" when none). */
static void first_prefix(const char *dir, const char *prefix, char *out, size_t n)
{
    DIR *d = opendir(dir);
    out[0] = 0;
    for (struct dirent *e; d && !out[0] && (e = readdir(d));)
        if (!strncmp(e->d_name, prefix, strlen(prefix)))
            snprintf(out, n, "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
}

/* OUT belongs to one writer. Two runs given the same --save-hf OUT both passed the start's check (OUT did not
 * exist yet); the first to finish wrote OUT and the other, after its whole training, failed on "OUT exists and
 * is not empty" with its model lost. The run now holds OUT (made empty, locked) from its start: a second run or
 * `ckpt convert --hf` is refused at once (exit 2), a run that fails before it saves leaves no OUT, and a save
 * whose OUT was replaced meanwhile by a writer that took no lock keeps the complete model beside it, named. */
TEST(save_hf_one_writer)
{
    char *out = cli_path("held_hf");
    dt_hf_save_lock *l = NULL, *l2 = NULL;
    ASSERT_OK(dt_hf_save_lock_open(out, &l));
    ASSERT(file_exists(out));
    ASSERT_EQ_INT(dt_hf_save_lock_open(out, &l2), DT_ERR_STATE); /* flock is per open file: this process too */
    ASSERT_STR_CONTAINS(dt_last_error(), "another job");
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--vocab-size", "128", "--data", "tokens:" HF "tokens.bin",
                        "--no-eval", "--seq", "16", "--batch", "2", "--max-steps", "1", "--progress", "plain",
                        "--save-hf", out, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "another job");
    ASSERT(!strstr(r.out, "first step done"));
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--model", "hf:" HF "gpt2", "--hf", out, HF "gpt2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "another job");
    ASSERT_EQ_INT(count_prefix(out, ""), 2); /* . and .. */
    /* the holder saves */
    dt_hf_config h;
    ASSERT_OK(dt_hf_config_read(HF "gpt2", &h));
    dt_hf_save_params p = dt_hf_save_params_default();
    p.lock = l;
    ASSERT_OK(dt_hf_save(HF "gpt2", &h, out, &p));
    dt_hf_save_lock_close(l);
    char f[800];
    snprintf(f, sizeof f, "%s/model.safetensors", out);
    ASSERT(file_exists(f));
    ASSERT_EQ_INT(count_prefix(cli_tmpdir(), "held_hf."), 0);
    /* a lock on another directory is not this save's */
    char *other = cli_path("other_hf"), *gone = cli_path("gone_hf");
    ASSERT_OK(dt_hf_save_lock_open(other, &l));
    p.lock = l;
    ASSERT_EQ_INT(dt_hf_save(HF "gpt2", &h, gone, &p), DT_ERR_INVALID_ARG);
    ASSERT(!file_exists(gone));
    /* made by the lock, nothing saved: removed when let go */
    dt_hf_save_lock_close(l);
    ASSERT(!file_exists(other));
    /* a run that fails before it saves leaves no OUT */
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--vocab-size", "128", "--data", "tokens:" HF "tokens.bin",
                        "--no-eval", "--seq", "16", "--batch", "2", "--max-steps", "1", "--progress", "none",
                        "--init-from", cli_path("no_such_ckpt"), "--save-hf", gone, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT(!file_exists(gone));
    char *nested = cli_path("gone_parent_hf/a/out"), *nested_top = cli_path("gone_parent_hf");
    cli_runv(&r, 120, NULL, /* nor the parents the run made for it */
             (char *[]){"train", "--model", "llama-tiny", "--vocab-size", "128", "--data", "tokens:" HF "tokens.bin",
                        "--no-eval", "--seq", "16", "--batch", "2", "--max-steps", "1", "--progress", "none",
                        "--init-from", cli_path("no_such_ckpt"), "--save-hf", nested, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT(!file_exists(nested_top));
    /* OUT replaced while held (a writer that took no lock made it anew): the model is kept beside it, named,
       and the other's OUT is left alone */
    char *raced = cli_path("raced_hf"), tmp[700];
    ASSERT_OK(dt_hf_save_lock_open(raced, &l));
    ASSERT_EQ_INT(rmdir(raced), 0);
    ASSERT_EQ_INT(mkdir(raced, 0755), 0);
    p.lock = l;
    ASSERT_EQ_INT(dt_hf_save(HF "gpt2", &h, raced, &p), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "kept there");
    first_prefix(cli_tmpdir(), "raced_hf.tmp-", tmp, sizeof tmp);
    ASSERT(tmp[0]);
    ASSERT_STR_CONTAINS(dt_last_error(), tmp);
    snprintf(f, sizeof f, "%s/model.safetensors", tmp);
    ASSERT(file_exists(f));
    snprintf(f, sizeof f, "%s/config.json", tmp);
    ASSERT(file_exists(f));
    dt_hf_save_lock_close(l);
    ASSERT(file_exists(raced));
    ASSERT_EQ_INT(count_prefix(raced, ""), 2);
}

int main(void)
{
    RUN(train_save_hf_llama);
    RUN(train_save_hf_gpt2);
    RUN(tokenizer_files);
    RUN(special_tokens_kept);
    RUN(generation_config_kept);
    RUN(save_hf_makes_missing_parents);
    RUN(save_hf_one_writer);
    cli_cleanup();
    return TEST_REPORT();
}
