/* `dtrain eval|train|generate --model hf:DIR` on the Hugging Face golden
 * directories (tests/data/hf, scripts/make_hf_goldens.py): eval --json
 * prints the mean next-token loss over the token file's 17-token windows,
 * equal to transformers' within 1e-5; a short training run from the
 * directory's weights lowers the loss; generation runs; and each bad
 * directory (a truncated shard, an index naming a missing shard, an
 * unknown rope_scaling type, an unknown architecture, a vocab_size or a
 * hidden_size, intermediate_size or head count that disagrees with the
 * weights, more layers than they hold, a tied config over a different
 * lm_head.weight) is an error naming
 * the file and the key, exit 2, with nothing written. */
// dt-test-timeout: 300
#include "dtrain/ckpt.h"
#include "test.h"
#include "peft_files.h"
#include "tools/train_cli.h"

#define HF DT_SOURCE_DIR "/tests/data/hf/"

/* key's value in eval_ref.safetensors ("qwen3", "mistral", "gemma", "gemma2", "gemma3", "phi3", "phi4", "granite",
 * "olmo2", "olmo3", "smollm3", "ministral", "mixtral", "qwen3_moe", "qwen2_moe", "olmoe": the key "eval" of their
 * own _ref file;
 * "gemma3_mm", Gemma 3's image-text model around gemma3's weights: gemma3's) */
static double ref_loss(const char *key)
{
    dt_st_file *f = NULL;
    float v = NAN;
    char own[200] = "";
    if (!strcmp(key, "gemma3_mm"))
        key = "gemma3";
    if (!strcmp(key, "qwen3") || !strcmp(key, "mistral") || !strcmp(key, "gemma") || !strcmp(key, "phi3") ||
        !strcmp(key, "phi4") || !strcmp(key, "granite") || !strcmp(key, "olmo2") || !strcmp(key, "gemma2") ||
        !strcmp(key, "gemma3") || !strcmp(key, "smollm3") || !strcmp(key, "olmo3") || !strcmp(key, "ministral") ||
        !strcmp(key, "mixtral") || !strcmp(key, "qwen3_moe") || !strcmp(key, "qwen2_moe") || !strcmp(key, "olmoe")) {
        snprintf(own, sizeof own, HF "%s_ref.safetensors", key);
        key = "eval";
    }
    if (dt_st_open(own[0] ? own : HF "eval_ref.safetensors", &f) < 0)
        return NAN;
    const dt_st_tensor *t = dt_st_find(f, key);
    if (!t || dt_st_read(f, t, 0, 4, &v) < 0)
        v = NAN;
    dt_st_close(f);
    return v;
}

static double json_loss(const char *out)
{
    const char *p = strstr(out, "{\"loss\":");
    return p ? atof(p + 8) : NAN;
}

static void eval_case(const char *model, const char *key, const char *batch)
{
    cli_result r;
    char m[400];
    snprintf(m, sizeof m, "hf:%s%s", HF, model);
    cli_runv(&r, 120, NULL,
             (char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--batch", (char *)batch, "--seq",
                        "16", "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    double got = json_loss(r.out), want = ref_loss(key);
    fprintf(stderr, "  %s: dtrain %.9g, transformers %.9g\n", model, got, want);
    ASSERT_NEAR(got, want, 0, 1e-5);
    ASSERT_STR_CONTAINS(r.out, "\"items\":10");
}

TEST(eval_json)
{
    eval_case("llama", "llama", "4"); /* 10 windows: batches of 4, 4, 2 */
    eval_case("gpt2", "gpt2", "10");
    eval_case("llama_bf16", "llama", "3"); /* bf16 weights: the f32 model's loss within bf16 rounding */
    eval_case("qwen3", "qwen3", "4");
    eval_case("mistral", "mistral", "4"); /* sliding_window 16 = --seq */
    eval_case("gemma", "gemma", "4");
    eval_case("phi3", "phi3", "4");
    eval_case("phi4", "phi4", "4"); /* partial RoPE, LongRoPE's long factors (16 > 8 positions) */
    eval_case("granite", "granite", "4");
    eval_case("olmo2", "olmo2", "4");
    eval_case("smollm3", "smollm3", "4"); /* a NoPE layer */
    eval_case("olmo3", "olmo3", "4");     /* sliding_window 8 < --seq; two RoPE bases */
    eval_case("ministral", "ministral", "4"); /* sliding_window 8 < --seq on two of three layers */
    eval_case("mixtral", "mixtral", "4");     /* 4 experts, 2 a token */
    eval_case("qwen3_moe", "qwen3_moe", "3"); /* 8 experts, 3 a token, a dense layer */
    eval_case("qwen2_moe", "qwen2_moe", "4"); /* a shared expert beside 6 */
    eval_case("olmoe", "olmoe", "4");         /* whole-projection q/k norms */
    eval_case("gemma2", "gemma2", "4"); /* soft caps; sliding_window 16 = --seq */
    eval_case("gemma3", "gemma3", "4"); /* sliding_window 8 < --seq; two RoPE bases */
    eval_case("gemma3_mm", "gemma3", "4"); /* its image-text model: the language model's loss */
}

TEST(train_and_generate)
{
    cli_result r;
    char *save = cli_path("run");
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "hf:" HF "llama", "--data", "tokens:" HF "tokens.bin", "--val-data",
                        "tokens:" HF "tokens.bin", "--seq", "16", "--batch", "2", "--optimizer", "adamw", "--lr",
                        "0.01", "--epochs", "3", "--progress", "none", "--save", save, NULL});
    ASSERT_EQ_INT(r.code, 0);
    double v = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "  val loss after 3 epochs: %.4f (from %.4f)\n", v, ref_loss("llama"));
    ASSERT(v < ref_loss("llama") - 0.3);
    cli_runv(&r, 60, NULL,
             (char *[]){"generate", "--model", "hf:" HF "llama", "--prompt-ids", "5,6,7", "--max-new-tokens", "5",
                        "--temperature", "0", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "5 6 7 | ");
}

/* dir = a copy of the golden llama directory, then `edit` applied. */
/* A copy `name` of the golden directory src with the shell command edit run in it. */
static char *edited_dir(const char *src, const char *name, const char *edit)
{
    char *d = cli_path(name), cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s%s' '%s' && cd '%s' && %s", d, HF, src, d, d, edit);
    if (system(cmd) != 0)
        fprintf(stderr, "  could not make %s\n", d);
    return d;
}

static char *bad_dir(const char *name, const char *edit) { return edited_dir("llama", name, edit); }

/* The golden directory src edited: train and eval refuse it, exit 2, naming want1 and want2. */
static void bad_case_of(const char *src, const char *name, const char *edit, const char *want1, const char *want2)
{
    char *d = edited_dir(src, name, edit), m[400], *out = cli_path("out_bad");
    snprintf(m, sizeof m, "hf:%s", d);
    cli_result r;
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", m, "--data", "tokens:" HF "tokens.bin", "--no-eval", "--seq", "16",
                        "--batch", "2", "--max-steps", "1", "--progress", "none", "--save", out, NULL});
    if (r.code != 2 || !strstr(r.err, want1) || !strstr(r.err, want2))
        fprintf(stderr, "  case %s: code %d, stderr: %s", name, r.code, r.err);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, want1);
    ASSERT_STR_CONTAINS(r.err, want2);
    ASSERT(!file_exists(out));
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, want2);
    ASSERT(!strstr(r.out, "loss"));
}

static void bad_case(const char *name, const char *edit, const char *want1, const char *want2)
{
    bad_case_of("llama", name, edit, want1, want2);
}

/* Phi-3's keys dtrain does not implement, bad partial rotary factors and LongRoPE factors, Phi3Config's
 * pad_token_id default (32000) past this vocabulary, and a Granite multiplier that is not positive */
TEST(bad_phi3_directories)
{
    bad_case_of("phi3", "phi3_partial", "sed -i 's/\"partial_rotary_factor\": 1.0/\"partial_rotary_factor\": 0.4/' "
                "config.json", "config.json", "\"partial_rotary_factor\": 0.4 of head_dim 8 gives 3 rotary values");
    bad_case_of("phi3", "phi3_longrope", "sed -i 's/\"rope_type\": \"default\"/\"rope_type\": \"longrope\"/' "
                "config.json", "config.json", "\"rope_parameters.short_factor\" must be a list of 4 numbers");
    bad_case_of("phi4", "phi4_dynamic", "sed -i 's/\"rope_type\": \"longrope\"/\"rope_type\": \"dynamic\"/' "
                "config.json", "config.json", "rope scaling 'dynamic' is not supported (known: default, longrope");
    bad_case_of("phi4", "phi4_factor", "sed -i 's/7.1164/-7.1164/' config.json", "config.json",
                "\"rope_parameters.long_factor\": entry 0 must be a positive number");
    bad_case_of("granite", "granite_scaling", "sed -i 's/\"logits_scaling\": 4.0/\"logits_scaling\": -4.0/' "
                "config.json", "config.json", "\"logits_scaling\" must be a number > 0");
    bad_case_of("phi4", "phi4_short", "sed -i '/1.2577,/d' config.json", "config.json",
                "\"rope_parameters.short_factor\" must be a list of 6 numbers");
    bad_case_of("llama", "llama_longrope", "sed -i 's/\"rope_type\": \"llama3\"/\"rope_type\": \"longrope\"/' "
                "config.json", "config.json", "rope scaling 'longrope' is not supported (known: default, linear, "
                "llama3, yarn, dynamic; longrope for Phi-3)");
    bad_case_of("phi3", "phi3_resid", "sed -i 's/\"resid_pdrop\": 0.0/\"resid_pdrop\": 0.1/' config.json",
                "config.json", "\"resid_pdrop\"");
    bad_case_of("phi3", "phi3_pad", "sed -i '/\"pad_token_id\"/d' config.json", "config.json",
                "Phi3Config's default 32000 is outside the vocabulary");
}

TEST(bad_directories)
{
    bad_case("truncated", "truncate -s -8 model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "model-00002-of-00002.safetensors");
    bad_case("missing", "rm model-00002-of-00002.safetensors", "model.safetensors.index.json",
             "\"weight_map\"");
    bad_case("pickle", "rm model-0000*.safetensors model.safetensors.index.json && touch pytorch_model.bin",
             "no model.safetensors", "pytorch_model.bin is PyTorch's pickle");
    bad_case("rope", "sed -i 's/\"llama3\"/\"su\"/' config.json", "config.json", "rope_parameters.rope_type");
    bad_case("arch", "sed -i 's/LlamaForCausalLM/FooForCausalLM/' config.json", "config.json", "\"architectures\"");
    bad_case("vocab", "sed -i 's/\"vocab_size\": 128/\"vocab_size\": 100/' config.json", "config.json",
             "\"vocab_size\"");
    /* a config.json that lies about its weights' size is refused before the model is built */
    bad_case("layers_more", "sed -i 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 1000000/' config.json",
             "config.json", "\"num_hidden_layers\" is 1000000, but the weights have no layer 999999");
    bad_case("width", "sed -i 's/\"hidden_size\": 32/\"hidden_size\": 8192/' config.json", "config.json",
             "\"hidden_size\" is 8192");
    /* any other size the weights disagree with: named with the tensor, before the model is built at it */
    bad_case("intermediate", "sed -i 's/\"intermediate_size\": 64/\"intermediate_size\": 128/' config.json",
             "config.json", "describes 'model.layers.0.mlp.gate_proj.weight' as [128,32], but the weights' is [64,32]");
    bad_case("heads", "sed -i 's/\"num_attention_heads\": 4/\"num_attention_heads\": 8/' config.json", "config.json",
             "describes 'model.layers.0.self_attn.q_proj.weight' as [96,32], but the weights' is [48,32]");
    /* GPT-2's attention-scaling keys: the refusal names the key set (all three were named scale_attn_weights) */
    bad_case_of("gpt2", "gpt2_inv_idx", "sed -i 's/\"scale_attn_by_inverse_layer_idx\": false/"
                "\"scale_attn_by_inverse_layer_idx\": true/' config.json", "config.json",
                "key \"scale_attn_by_inverse_layer_idx\": only false");
    bad_case_of("gpt2", "gpt2_upcast", "sed -i 's/\"reorder_and_upcast_attn\": false/"
                "\"reorder_and_upcast_attn\": true/' config.json", "config.json",
                "key \"reorder_and_upcast_attn\": only false");
    bad_case_of("gpt2", "gpt2_unscaled", "sed -i 's/\"scale_attn_weights\": true/\"scale_attn_weights\": false/' "
                "config.json", "config.json", "key \"scale_attn_weights\": only true");
    /* "architectures" and "model_type" naming two models: transformers builds the model type's; dtrain built the
       architectures' (a Qwen3 directory named LlamaForCausalLM lost its q/k norms without a word): refused */
    bad_case_of("qwen3", "qwen3_as_llama", "sed -i 's/\"Qwen3ForCausalLM\"/\"LlamaForCausalLM\"/' config.json",
                "config.json", "key \"architectures\" names LlamaForCausalLM, but key \"model_type\" is \"qwen3\"");
    /* weights the configured model has no place for (here the layer past num_hidden_layers 1): used as before,
       the first layers, and said once (transformers warns of its unexpected keys too) */
    char m[400], *d = edited_dir("llama", "llama_1layer", "sed -i 's/\"num_hidden_layers\": 2/"
                                 "\"num_hidden_layers\": 1/' config.json");
    snprintf(m, sizeof m, "hf:%s", d);
    cli_result w;
    cli_runv(&w, 60, NULL,
             (char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(w.code, 0);
    ASSERT_STR_CONTAINS(w.err, "9 tensors of the weights are no parameter of the LlamaForCausalLM");
    ASSERT_STR_CONTAINS(w.err, "(the first: 'model.layers.1.");
    ASSERT_EQ_INT(cli_lines(w.err), 1);
    cli_runv(&w, 60, NULL, (char *[]){"eval", "--model", "hf:" HF "llama", "--data", "tokens:" HF "tokens.bin",
                                      "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(w.code, 0);
    ASSERT(!strstr(w.err, "tensors of the weights")); /* every tensor used: nothing said */
    /* a config.json whose rope_theta and rope_parameters.rope_theta disagree: rope_parameters' is used, as
       transformers 5 does, and the disagreement is said once (it was silent) */
    d = edited_dir("llama", "llama_rope_pair", "sed -i 's/^{/{\"rope_theta\": 500000.0,/' config.json");
    snprintf(m, sizeof m, "hf:%s", d);
    cli_runv(&w, 60, NULL,
             (char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(w.code, 0);
    ASSERT_STR_CONTAINS(w.err, "key \"rope_theta\" (500000) and key \"rope_parameters.rope_theta\" (10000) disagree");
    ASSERT_EQ_INT(cli_lines(w.err), 1);
    static cli_result g; /* the loss is the golden directory's: rope_parameters' theta is the one used */
    cli_runv(&g, 60, NULL, (char *[]){"eval", "--model", "hf:" HF "llama", "--data", "tokens:" HF "tokens.bin",
                                      "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(g.code, 0);
    ASSERT(cli_out_value(w.out, "\"loss\":") == cli_out_value(g.out, "\"loss\":"));
    /* --resume of a model directory (weights alone, no run in them): refused, saying how to start from it */
    cli_result r;
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "hf:" HF "llama", "--data", "tokens:" HF "tokens.bin", "--seq", "16",
                        "--no-eval", "--max-steps", "1", "--resume", HF "llama", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "hold no run to resume; start from them with dtrain train --init-from, or --model "
                               "hf:DIR");
}

/* The options that shape a model dtrain builds (--n-layer, --vocab-size,
 * --dropout, ...) with an hf:DIR model: refused, naming the option (they
 * were ignored, the model built from config.json); a tokenizer with more
 * ids than the model's vocabulary names the vocabulary's source (the
 * message said "vocab size 1000 (the size of --tokenizer)", then 128). */
TEST(shape_options_refused)
{
    static const char *opts[][2] = {{"--n-layer", "3"},     {"--n-head", "2"},      {"--n-embd", "64"},
                                    {"--block-size", "64"}, {"--vocab-size", "500"}, {"--dropout", "0.1"}};
    cli_result r;
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        cli_runv(&r, 60, NULL,
                 (char *[]){"train", "--model", "hf:" HF "gpt2", "--data", "tokens:" HF "tokens.bin", "--no-eval",
                            "--seq", "16", "--batch", "2", "--max-steps", "1", "--progress", "none",
                            (char *)opts[i][0], (char *)opts[i][1], NULL});
        if (r.code != 2 || !strstr(r.err, opts[i][0]) || !strstr(r.err, "config.json"))
            fprintf(stderr, "  %s: code %d, stderr: %s", opts[i][0], r.code, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, opts[i][0]);
        ASSERT_STR_CONTAINS(r.err, "does not apply");
    }
    char *txt = cli_path("hf_text.txt");
    FILE *f = fopen(txt, "w");
    ASSERT(f);
    fputs("In the beginning God created the heaven and the earth.\n", f);
    fclose(f);
    char data[700];
    snprintf(data, sizeof data, "text:%s", txt);
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "hf:" HF "gpt2", "--data", data, "--tokenizer",
                        DT_SOURCE_DIR "/tests/data/tokenizer/gpt2.json", "--no-eval", "--seq", "8", "--batch", "1",
                        "--max-steps", "1", "--progress", "none", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "the tokenizer has 1000 ids, more than the vocab size 128");
    ASSERT_STR_CONTAINS(r.err, "config.json's vocab_size");
    ASSERT(!strstr(r.out, "vocab size 1000"));
}

/* 5 AdamW steps of hf:HF<name> at --seq seq on 2 ranks with the options par (NULL-ended; tag names the run) log
 * one process's losses (its run made once per model and length) */
static void parallel_matches_one(const char *name, const char *seq, const char *tag, char *const *par)
{
    cli_result r;
    char model[300], one[300], two[300];
    snprintf(model, sizeof model, "hf:" HF "%s", name);
    snprintf(one, sizeof one, "%s/%s_one_%s.jsonl", cli_tmpdir(), name, seq);
    snprintf(two, sizeof two, "%s/%s_%s_%s.jsonl", cli_tmpdir(), name, tag, seq);
    char *const base[] = {"train", "--model", model, "--data", "tokens:" HF "tokens.bin", "--no-eval", "--seq",
                          (char *)seq, "--batch", "2", "--max-steps", "5", "--optimizer", "adamw", "--lr", "1e-2",
                          "--threads", "1", "--progress", "none", "--log-every", "1", NULL};
    char *const m1[] = {"--metrics", one, NULL}, *const m2[] = {"--metrics", two, NULL};
    char *const *l1[] = {base, m1}, *const *l2[] = {base, par, m2};
    if (access(one, F_OK) != 0) {
        cli_run_ranks(&r, 120, NULL, 1, 2, l1);
        ASSERT_EQ_INT(r.code, 0);
    }
    cli_run_ranks(&r, 180, NULL, 2, 3, l2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(cli_same_metrics(two, one, 5, 0));
}

/* ... under --cp 2 with --cp-impl impl */
static void cp_matches_one(const char *name, const char *seq, const char *impl)
{
    char tag[32];
    snprintf(tag, sizeof tag, "cp_%s", impl);
    parallel_matches_one(name, seq, tag, (char *const[]){"--cp", "2", "--cp-impl", (char *)impl, NULL});
}

/* The text of a small file (a config.json the CLI wrote) into text (n bytes, cut there); fails the test without it */
static void read_text(const char *path, char *text, size_t n)
{
    FILE *f = fopen(path, "r");
    text[0] = 0;
    ASSERT(f);
    if (f) {
        text[fread(text, 1, n - 1, f)] = 0;
        fclose(f);
    }
}

/* Mistral's sliding window (16 of 64 positions) and Gemma 2's (its even layers): a longer --seq runs through the
 * sliding-window attention: eval of tokens.bin's five 32-token windows gives transformers 5.25's mean loss of them
 * (computed once by hand, AutoModelForCausalLM, torch 2.15, CPU: 4.86210794 and 5.39986715); the default --seq is
 * the window; --save-hf keeps it; --cp 2 with a sequence longer than the window gives one process's losses under
 * ring attention (the key blocks before each row's window skipped, those across its edge masked) and under
 * Ulysses' (the whole sequence of each rank's heads through the window kernel). It was refused whole, then longer
 * sequences were, then --cp was. */
TEST(mistral_sliding_window)
{
    cli_result r;
    const char *model[2] = {"hf:" HF "mistral", "hf:" HF "gemma2"};
    const double want[2] = {4.86210794, 5.39986715};
    for (int k = 0; k < 2; k++) {
        cli_runv(&r, 60, NULL,
                 (char *[]){"eval", "--model", (char *)model[k], "--data", "tokens:" HF "tokens.bin", "--seq", "32",
                            "--json", NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, "\"items\":5");
        fprintf(stderr, "  %s at 32 tokens: dtrain %.8f, transformers %.8f\n", model[k], json_loss(r.out), want[k]);
        ASSERT_NEAR(json_loss(r.out), want[k], 0, 1e-6);
    }
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--model", "hf:" HF "mistral", "--data", "tokens:" HF "tokens.bin", "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "\"seq\":16");
    char *out = cli_path("mistral_out"), cfg[400];
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "hf:" HF "mistral", "--data", "tokens:" HF "tokens.bin", "--no-eval",
                        "--batch", "2", "--max-steps", "2", "--progress", "none", "--save-hf", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    char text[4096];
    read_text(cfg, text, sizeof text);
    ASSERT_STR_CONTAINS(text, "\"sliding_window\":\t16");
    cp_matches_one("mistral", "32", "ring");
    cp_matches_one("mistral", "32", "ulysses");
}

/* A golden model (HF name) trained 3 steps and written with --save-hf: its
 * config.json holds each of want[] (NULL-ended), the directory evaluates to
 * the run's own final loss and the run trained; then 5 steps under --tp 2
 * and --tp 2 --sequence-parallel (with tp) and --pp 2 (with pp) log the
 * same losses as one process. */
static void save_hf_and_parallel(const char *name, const char *const *want, bool tp_too, bool pp)
{
    cli_result r;
    char model[300], out[300], m[400], cfg[400], m1[300];
    snprintf(model, sizeof model, "hf:" HF "%s", name);
    snprintf(m1, sizeof m1, "%s_out", name);
    snprintf(out, sizeof out, "%s", cli_path(m1));
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", model, "--data", "tokens:" HF "tokens.bin", "--val-data",
                        "tokens:" HF "tokens.bin", "--seq", "16", "--batch", "2", "--max-steps", "3", "--optimizer",
                        "adamw", "--lr", "1e-3", "--progress", "none", "--save-hf", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    const double v = cli_out_value(r.out, "val loss: ");
    snprintf(m, sizeof m, "hf:%s", out);
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    char text[4096];
    read_text(cfg, text, sizeof text);
    for (int i = 0; want[i]; i++)
        ASSERT_STR_CONTAINS(text, want[i]);
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    fprintf(stderr, "  %s --save-hf: eval %.6f, the run's val loss %.4f (before training %.4f)\n", name,
            json_loss(r.out), v, ref_loss(name));
    ASSERT_NEAR(json_loss(r.out), v, 6e-5, 0); /* (the run prints 4 decimals) */
    ASSERT(fabs(v - ref_loss(name)) > 1e-3);   /* it trained */
    if (tp_too) {
        parallel_matches_one(name, "16", "tp", (char *const[]){"--tp", "2", NULL});
        /* the residual stream's rows split over the tp ranks: the norms (Gemma's 1 + w, Gemma 2's after the
           attention and the MLP, OLMo 2's on the outputs) on the rank's rows, their weights' gradients summed */
        parallel_matches_one(name, "16", "tp_sp", (char *const[]){"--tp", "2", "--sequence-parallel", NULL});
    }
    if (pp)
        parallel_matches_one(name, "16", "pp", (char *const[]){"--pp", "2", "--micro-batches", "2", NULL});
}

/* Qwen3 (model_type qwen3): with --tp 2 the same losses as one process
 * (the per-head norms' gradients summed over the ranks: without that sum
 * they differ by 4e-5 at the second step). */
TEST(qwen3_save_hf_and_tp) { save_hf_and_parallel("qwen3", (const char *const[]){"\"qwen3\"", NULL}, true, false); }

/* Gemma 1 (model_type gemma, GemmaForCausalLM): the export evaluates to
 * the run's own loss, so the norms' weights are written as GemmaRMSNorm
 * reads them, around 0; under tp the norms are replicated, before f (their
 * gradients whole on every rank); the pipeline's embedding unit scales by
 * sqrt(C) as the model's forward does. */
TEST(gemma_save_hf_and_tp)
{
    save_hf_and_parallel("gemma",
                         (const char *const[]){"\"gemma\"", "\"GemmaForCausalLM\"", "\"gelu_pytorch_tanh\"", NULL},
                         true, true);
}

/* Phi-3 (model_type phi3, Phi3ForCausalLM: one qkv_proj, one gate_up_proj): the export (transformers' names,
 * pad_token_id null written over Phi3Config's default 32000) evaluates to the run's own loss; --tp 2 (each rank
 * its rows of q, of k and of v: 64, 32 and 32 of them here, and of gate and of up) and --pp 2 give one process's
 * losses; LoRA on the fused layers under --tp 2: one process's losses and its adapters (PEFT's file, gathered
 * from the ranks' rows), within rounding. */
TEST(phi3_save_hf_tp_and_pp)
{
    save_hf_and_parallel("phi3",
                         (const char *const[]){"\"phi3\"", "\"Phi3ForCausalLM\"", "\"pad_token_id\":\tnull", NULL},
                         true, true);
    cli_result r;
    char m1[300], m2[300], *d1 = cli_path("phi3_lora1"), *d2 = cli_path("phi3_lora2");
    snprintf(m1, sizeof m1, "%s/phi3_lora1.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/phi3_lora2.jsonl", cli_tmpdir());
    char *const base[] = {"train", "--model", "hf:" HF "phi3", "--data", "tokens:" HF "tokens.bin", "--no-eval",
                          "--seq", "16", "--batch", "2", "--max-steps", "5", "--optimizer", "adamw", "--lr", "1e-2",
                          "--threads", "1", "--progress", "none", "--log-every", "1", "--lora-r", "4",
                          "--lora-targets", "qkv_proj,gate_up_proj,o_proj", NULL};
    char *const one[] = {"--metrics", m1, "--save-lora", d1, NULL};
    char *const two[] = {"--tp", "2", "--metrics", m2, "--save-lora", d2, NULL};
    char *const *l1[] = {base, one}, *const *l2[] = {base, two};
    cli_run_ranks(&r, 120, NULL, 1, 2, l1);
    ASSERT_EQ_INT(r.code, 0);
    cli_run_ranks(&r, 180, NULL, 2, 2, l2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(cli_same_metrics(m2, m1, 5, 0));
    char f1[400], f2[400];
    snprintf(f1, sizeof f1, "%s/adapter_model.safetensors", d1);
    snprintf(f2, sizeof f2, "%s/adapter_model.safetensors", d2);
    dt_st_file *a = NULL, *b = NULL;
    ASSERT_OK(dt_st_open(f1, &a));
    ASSERT_OK(dt_st_open(f2, &b));
    size_t n = dt_st_count(a), nbig = 0;
    ASSERT(n >= 12 && n == dt_st_count(b));
    double worst = 0, big = 0;
    for (size_t i = 0; i < n; i++) {
        const dt_st_tensor *ta = dt_st_tensor_at(a, i), *tb = dt_st_find(b, ta->name);
        ASSERT(tb && tb->numel == ta->numel && ta->numel <= 4096);
        float va[4096], vb[4096];
        ASSERT_OK(dt_st_read(a, ta, 0, ta->numel * 4, va));
        ASSERT_OK(dt_st_read(b, tb, 0, tb->numel * 4, vb));
        for (size_t j = 0; j < ta->numel; j++) {
            worst = fmax(worst, fabs((double)va[j] - vb[j]));
            big = fmax(big, fabs((double)va[j]));
            nbig += fabs((double)va[j]) > 1e-3;
        }
    }
    fprintf(stderr, "  phi3 LoRA --tp 2: adapters within %.3g of one process's (largest %.3g)\n", worst, big);
    ASSERT(worst <= 1e-5 && big > 0.05 && nbig > 100); /* trained, and the same */
    dt_st_close(a);
    dt_st_close(b);
}

/* Granite (model_type granite, GraniteForCausalLM): the export keeps the four multipliers and evaluates to the
 * run's own loss; --tp 2 and --pp 2 (the final norm's unit divides by logits_scaling as the model does) give one
 * process's losses. */
TEST(granite_save_hf_tp_and_pp)
{
    save_hf_and_parallel("granite",
                         (const char *const[]){"\"granite\"", "\"GraniteForCausalLM\"", "\"embedding_multiplier\":\t6",
                                               "\"residual_multiplier\":\t0.3", "\"attention_multiplier\":\t0.2",
                                               "\"logits_scaling\":\t4", NULL},
                         true, true);
}

/* OLMo 2 (model_type olmo2, Olmo2ForCausalLM): the export evaluates to the run's own loss (its
 * post_feedforward_layernorm and whole-projection q_norm/k_norm under their names); --tp 2 (q_norm and k_norm
 * split with the heads, each row's statistics summed over the ranks) and --pp 2 give one process's losses. */
TEST(olmo2_save_hf_tp_and_pp)
{
    save_hf_and_parallel("olmo2", (const char *const[]){"\"olmo2\"", "\"Olmo2ForCausalLM\"", "\"pad_token_id\":\t1",
                                                        NULL},
                         true, true);
}

/* SmolLM3 (model_type smollm3, SmolLM3ForCausalLM): the export keeps the NoPE layers (no_rope_layers) and
 * evaluates to the run's own loss; --tp 2, --pp 2 and --cp 2 (the NoPE layer's keys at their global positions
 * unrotated) give one process's losses. */
TEST(smollm3_save_hf_tp_and_pp)
{
    save_hf_and_parallel("smollm3",
                         (const char *const[]){"\"smollm3\"", "\"SmolLM3ForCausalLM\"",
                                               "\"no_rope_layers\":\t[1, 0, 1]", "\"rope_theta\":\t2000000",
                                               "\"pad_token_id\":\tnull", NULL},
                         true, true);
    cp_matches_one("smollm3", "16", "ring");
    bad_case_of("smollm3", "smollm3_short", "sed -i -z 's/\"no_rope_layers\": \\[\\n    1,/\"no_rope_layers\": [/' "
                "config.json", "config.json", "\"no_rope_layers\" must be a list of 0 and 1 with an entry for each of "
                "the 3 layers");
    bad_case_of("smollm3", "smollm3_entry", "sed -i -z 's/\"no_rope_layers\": \\[\\n    1,/\"no_rope_layers\": "
                "[\"yes\",/' config.json", "config.json", "\"no_rope_layers\": entry 0 is not a number");
}

/* OLMo 3 (model_type olmo3, Olmo3ForCausalLM): the export keeps the layers' kinds and their RoPE (rope_parameters,
 * one object a kind) and evaluates to the run's own loss; --tp 2, --pp 2 and --cp 2 (ring and Ulysses, at 32
 * tokens: past the window of 8) give one process's losses. */
TEST(olmo3_save_hf_tp_pp_and_cp)
{
    save_hf_and_parallel("olmo3",
                         (const char *const[]){"\"olmo3\"", "\"Olmo3ForCausalLM\"", "\"sliding_window\":\t8",
                                               "\"sliding_attention\":\t{", "\"full_attention\":\t{", NULL},
                         true, true);
    cp_matches_one("olmo3", "32", "ring");
    cp_matches_one("olmo3", "32", "ulysses");
}

/* Ministral (model_type ministral, MinistralForCausalLM): the export keeps the layers' kinds and the window and
 * evaluates to the run's own loss; --tp 2, --pp 2 and --cp 2 (ring, at 32 tokens: past the window) give one
 * process's losses. */
TEST(ministral_save_hf_tp_pp_and_cp)
{
    save_hf_and_parallel("ministral",
                         (const char *const[]){"\"ministral\"", "\"MinistralForCausalLM\"", "\"sliding_window\":\t8",
                                               "\"layer_types\":\t[\"sliding_attention\", \"full_attention\"", NULL},
                         true, true);
    cp_matches_one("ministral", "32", "ring");
}

/* Gemma 2 (model_type gemma2, Gemma2ForCausalLM): the export keeps query_pre_attn_scalar, the soft caps (as
 * floats, which Gemma2Config requires) and the layers' kinds and evaluates to the run's own loss; --tp 2 (the
 * rank's heads, the logits' cap on its vocabulary columns) and --pp 2 (the head's unit caps the logits as the model
 * does) give one process's losses; so does --cp 2 at 32 tokens (past the window of 16) under either attention (the
 * scores capped on the ring's blocks, and on each rank's heads of the whole sequence under Ulysses). */
TEST(gemma2_save_hf_tp_and_pp)
{
    save_hf_and_parallel("gemma2",
                         (const char *const[]){"\"gemma2\"", "\"Gemma2ForCausalLM\"", "\"query_pre_attn_scalar\":\t24",
                                               "\"attn_logit_softcapping\":\t5.0", "\"final_logit_softcapping\":\t2.0",
                                               "\"sliding_window\":\t16", "\"sliding_attention\", \"full_attention\"",
                                               "\"hidden_activation\":\t\"gelu_pytorch_tanh\"", NULL},
                         true, true);
    cp_matches_one("gemma2", "32", "ring");
    cp_matches_one("gemma2", "32", "ulysses");
}

/* Gemma 3 (model_type gemma3_text, Gemma3ForCausalLM): the export keeps both RoPE bases (the sliding layers'
 * as rope_local_base_freq), the full layers' linear scaling, the window and the layers' kinds, and evaluates to the
 * run's own loss; --tp 2 (the head norms replicated, their gradients summed) and --pp 2 give one process's losses,
 * and so does --cp 2 at 8 tokens (the window: each rank rotates its 4 rows at their global positions with its
 * layer's base), and at 16 (past the window) under both attentions. */
TEST(gemma3_save_hf_tp_pp_and_cp)
{
    save_hf_and_parallel("gemma3",
                         (const char *const[]){"\"gemma3_text\"", "\"Gemma3ForCausalLM\"", "\"rope_theta\":\t10000",
                                               "\"rope_local_base_freq\":\t100", "\"rope_type\":\t\"linear\"",
                                               "\"sliding_window\":\t8",
                                               "\"sliding_attention\", \"sliding_attention\", \"full_attention\", "
                                               "\"sliding_attention\"",
                                               "\"hidden_activation\":\t\"gelu_pytorch_tanh\"", NULL},
                         true, true);
    cp_matches_one("gemma3", "8", "ring");
    cp_matches_one("gemma3", "16", "ring");
    cp_matches_one("gemma3", "16", "ulysses");
}

/* Gemma 3's image-text model (Gemma3ForConditionalGeneration around gemma3's weights, with a vision tower): its
 * language model trains, and --save-hf writes that text model (Gemma3ForCausalLM, text_config's keys at the top
 * level), which evaluates to the run's own loss. */
TEST(gemma3_image_text_trains_and_saves_its_language_model)
{
    save_hf_and_parallel("gemma3_mm",
                         (const char *const[]){"\"gemma3_text\"", "\"Gemma3ForCausalLM\"", "\"rope_local_base_freq\":\t100",
                                               "\"hidden_size\":\t32", NULL},
                         false, false);
}

/* The 20-token prompt of the sliding-window goldens (longer than their window of 16): 3,10,17,... */
static const char *prompt20(void)
{
    static char p[200] = "";
    if (!p[0]) /* made once */
        for (int i = 0; i < 20; i++)
            snprintf(p + strlen(p), sizeof p - strlen(p), "%s%d", i ? "," : "", (i * 7 + 3) % 128);
    return p;
}

/* A golden generation: the prompt (NULL: prompt20), the options, transformers' new tokens */
typedef struct {
    const char *prompt, *opts[10], *want;
} gen_golden;

/* `generate --temperature 0` on hf:HF<model> for each case, with the key/value cache and then without: both
 * give transformers' tokens */
static void generate_goldens(const char *model, const gen_golden *cases, size_t ncases)
{
    static cli_result r;
    char m[300];
    snprintf(m, sizeof m, "hf:" HF "%s", model);
    for (size_t k = 0; k < 2 * ncases; k++) { /* with the cache, then without */
        const size_t i = k % ncases;
        char *args[24] = {"generate", "--model", m, "--prompt-ids",
                          (char *)(cases[i].prompt ? cases[i].prompt : prompt20()), "--temperature", "0",
                          "--kv-cache", k == i ? "on" : "off"};
        int n = 9;
        for (int j = 0; cases[i].opts[j]; j++)
            args[n++] = (char *)cases[i].opts[j];
        args[n] = NULL;
        cli_runv(&r, 60, NULL, args);
        if (r.code != 0 || !strstr(r.out, cases[i].want))
            fprintf(stderr, "  %s case %zu (cache %s): got %s%s, transformers %s", model, i, args[8], r.out, r.err,
                    cases[i].want);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, cases[i].want);
    }
}

/* The sliding-window goldens' four generations into c[0..3], with the model's new tokens want[0..3]: greedy with
 * no_repeat_ngram_size 2 from 5 6 7 (40 new tokens) and from prompt20 (20), beam search of 3 from 5 6 7 (30) and
 * of 4 from prompt20 (20), the same way */
static void window_cases(gen_golden *c, const char *const want[4])
{
    static const gen_golden k[4] = {
        {"5,6,7", {"--max-new-tokens", "40", "--no-repeat-ngram-size", "2"}, NULL},
        {NULL, {"--max-new-tokens", "20", "--no-repeat-ngram-size", "2"}, NULL},
        {"5,6,7", {"--max-new-tokens", "30", "--num-beams", "3", "--no-repeat-ngram-size", "2"}, NULL},
        {NULL, {"--max-new-tokens", "20", "--num-beams", "4", "--no-repeat-ngram-size", "2"}, NULL},
    };
    for (int i = 0; i < 4; i++) {
        c[i] = k[i];
        c[i].want = want[i];
    }
}

/* Gemma 2's sliding layers (0 and 2 of the golden's 3; window 16) and its full one, as transformers generates
 * past the window: transformers 5.25's model.generate(ids, do_sample=False, pad_token_id=0, ...) (torch 2.15, CPU)
 * gave these new tokens, once, for the prompts 5 6 7 and a 20-token one (longer than the window): greedy with
 * no_repeat_ngram_size 2, and beam search (its stop token 2 ends the third); with the cache and without. With the
 * window on every layer, as the cache kept it before Gemma 2, the first gives ... 63 63 48 2 and the last
 * 54 54 113 113 18 ... */
TEST(generate_gemma2)
{
    gen_golden c[4];
    window_cases(c, (const char *const[]){
        "| 7 49 49 7 16 82 82 44 44 8 8 111 111 123 123 48 48 63 63 48 123 53 53 24 24 65 65 24 54 54 24 51 51 7 56 "
        "56 7 93 93 41\n",
        "| 113 113 18 18 113 118 118 113 78 78 113 42 42 103 103 76 76 61 61 76\n",
        "| 16 16 95 95 67 27 27 48 48 63 48 2\n",
        "| 54 54 113 18 18 113 113 118 113 78 113 65 65 14 97 97 99 99 55 55\n"});
    generate_goldens("gemma2", c, 4);
}

/* Gemma 3's sliding layers (window 8, base 100) and its full one (base 10000, linear scaling), as transformers
 * generates past the window: transformers 5.25's model.generate(ids, do_sample=False, pad_token_id=0, ...) (torch
 * 2.15, CPU) gave these new tokens, once, with its cache and without, for the prompts of generate_gemma2 (the first
 * case ends at the stop token 2); dtrain with the cache and without. */
TEST(generate_gemma3)
{
    gen_golden c[4];
    window_cases(c, (const char *const[]){
        "| 92 63 92 92 116 92 64 92 91 93 64 64 98 98 64 32 7 7 82 82 7 20 64 108 108 64 121 121 64 2\n",
        "| 44 44 98 98 81 81 8 29 29 107 107 89 89 78 107 120 46 46 120 120\n",
        "| 92 63 92 109 64 64 98 98 121 64 35 35 82 82 12 12 84 84 24 82 103 103 31 31 11 11 57 57 81 81\n",
        "| 44 44 98 98 81 81 8 29 29 107 107 89 89 78 107 120 46 46 90 90\n"});
    generate_goldens("gemma3", c, 4);
}

/* The mixtures of experts, Mixtral and Qwen3-MoE: 5 AdamW steps of one process with --batch 4 and of DDP and ZeRO-3
 * over 2 ranks with --batch 2 each (the same 4 samples a step) give the same losses (every expert runs, so each of
 * its gradients lands, with no rows when no token is routed to it); with --activation-checkpointing (the decoder
 * layers recomputed, the routing with them) the same losses; under --precision bf16 within 2e-2 (5 steps at lr
 * 1e-2: 8e-3 apart by the fifth) */
static void moe_data_parallel(const char *name)
{
    cli_result r;
    char model[300], one[300], two[300], three[300], ck[300], bf[300];
    snprintf(model, sizeof model, "hf:" HF "%s", name);
    snprintf(one, sizeof one, "%s/%s_dp1.jsonl", cli_tmpdir(), name);
    snprintf(two, sizeof two, "%s/%s_dp2.jsonl", cli_tmpdir(), name);
    snprintf(three, sizeof three, "%s/%s_zero3.jsonl", cli_tmpdir(), name);
    snprintf(ck, sizeof ck, "%s/%s_ckpt.jsonl", cli_tmpdir(), name);
    snprintf(bf, sizeof bf, "%s/%s_bf16.jsonl", cli_tmpdir(), name);
    char *const base[] = {"train", "--model", model, "--data", "tokens:" HF "tokens.bin", "--no-eval", "--seq", "16",
                          "--max-steps", "5", "--optimizer", "adamw", "--lr", "1e-2", "--threads", "1", "--progress",
                          "none", "--log-every", "1", NULL};
    char *const m1[] = {"--batch", "4", "--metrics", one, NULL}, *const m2[] = {"--batch", "2", "--metrics", two, NULL};
    char *const m3[] = {"--batch", "2", "--zero", "3", "--metrics", three, NULL};
    char *const m4[] = {"--batch", "4", "--activation-checkpointing", "--metrics", ck, NULL};
    char *const m5[] = {"--batch", "4", "--precision", "bf16", "--metrics", bf, NULL};
    char *const *l1[] = {base, m1}, *const *l2[] = {base, m2}, *const *l3[] = {base, m3};
    char *const *l4[] = {base, m4}, *const *l5[] = {base, m5};
    cli_run_ranks(&r, 120, NULL, 1, 2, l1);
    ASSERT_EQ_INT(r.code, 0);
    cli_run_ranks(&r, 180, NULL, 2, 2, l2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(cli_same_metrics(two, one, 5, 1e-5));
    cli_run_ranks(&r, 180, NULL, 2, 2, l3);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(cli_same_metrics(three, one, 5, 1e-5));
    cli_run_ranks(&r, 120, NULL, 1, 2, l4);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(cli_same_metrics(ck, one, 5, 0));
    cli_run_ranks(&r, 120, NULL, 1, 2, l5);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(cli_same_metrics(bf, one, 5, 2e-2));
}

/* What the mixtures of experts do not implement: --tp 2, --pp 2, --cp 2 and the planner (dtrain plan, --plan auto)
 * are refused, exit 2, naming the mixture-of-experts layers; a LoRA target inside the experts (or the router) is
 * refused naming the layer */
static void moe_refusals(const char *name, const char *expert_layer)
{
    cli_result r;
    char model[300];
    snprintf(model, sizeof model, "hf:" HF "%s", name);
    char *const base[] = {"train", "--model", model, "--data", "tokens:" HF "tokens.bin", "--no-eval", "--seq", "16",
                          "--batch", "2", "--max-steps", "1", "--progress", "none", NULL};
    char *const tp[] = {"--tp", "2", NULL}, *const pp[] = {"--pp", "2", "--micro-batches", "2", NULL};
    char *const cp[] = {"--cp", "2", NULL}, *const plan[] = {"--plan", "auto", NULL};
    char *const lora[] = {"--lora-r", "4", "--lora-targets", (char *)expert_layer, NULL};
    char *const *const *par[] = {(char *const *const[]){base, tp}, (char *const *const[]){base, pp},
                                 (char *const *const[]){base, cp}};
    for (int i = 0; i < 3; i++) {
        cli_run_ranks(&r, 60, NULL, 2, 2, par[i]);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "with mixture-of-experts layers");
    }
    cli_run_ranks(&r, 60, NULL, 1, 2, (char *const *const[]){base, plan});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "has mixture-of-experts layers");
    cli_runv(&r, 60, NULL, (char *[]){"plan", "--world", "2", "--model", model, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "has mixture-of-experts layers");
    cli_run_ranks(&r, 60, NULL, 1, 2, (char *const *const[]){base, lora});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is a MoeExpertLinear, not a Linear");
}

/* Mixtral (model_type mixtral), Qwen3-MoE (qwen3_moe), Qwen2-MoE (qwen2_moe, its shared expert) and OLMoE (olmoe):
 * the export (the experts one by one under their checkpoint names, the experts' keys; Qwen2-MoE's
 * decoder_sparse_step 2 as the dense layers' list) evaluates to the run's own loss (transformers 5.25 loads the
 * four exports with no missing
 * or unexpected key and evaluates them to the same loss: checked by hand); data parallel as one process; the
 * refusals; LoRA on the attention's projections trains (the experts frozen with the rest); generation with the
 * cache and without gives transformers 5.25's greedy tokens (model.generate(5 6 7, do_sample=False,
 * no_repeat_ngram_size=2, pad_token_id=0), torch 2.15, CPU, with its cache and without: the same). */
TEST(moe_save_hf_parallel_lora_generate)
{
    save_hf_and_parallel("mixtral",
                         (const char *const[]){"\"mixtral\"", "\"MixtralForCausalLM\"", "\"num_local_experts\":\t4",
                                               "\"num_experts_per_tok\":\t2", "\"router_jitter_noise\":\t0.0", NULL},
                         false, false);
    save_hf_and_parallel("qwen3_moe",
                         (const char *const[]){"\"qwen3_moe\"", "\"num_experts\":\t8", "\"moe_intermediate_size\":\t16",
                                               "\"norm_topk_prob\":\tfalse", "\"mlp_only_layers\":\t[1]", NULL},
                         false, false);
    save_hf_and_parallel("qwen2_moe",
                         (const char *const[]){"\"qwen2_moe\"", "\"shared_expert_intermediate_size\":\t24",
                                               "\"qkv_bias\":\ttrue", "\"mlp_only_layers\":\t[0, 2]", NULL},
                         false, false);
    save_hf_and_parallel("olmoe",
                         (const char *const[]){"\"olmoe\"", "\"OlmoeForCausalLM\"", "\"num_experts\":\t5",
                                               "\"clip_qkv\":\tnull", "\"pad_token_id\":\tnull", NULL},
                         false, false);
    moe_data_parallel("mixtral");
    moe_data_parallel("qwen3_moe");
    moe_refusals("mixtral", "w1");
    moe_refusals("qwen3_moe", "q_proj,gate_proj");
    /* bad directories: train and eval refuse them, exit 2, naming the file and the key or the tensor */
    bad_case_of("mixtral", "moe_k", "sed -i 's/\"num_experts_per_tok\": 2/\"num_experts_per_tok\": 5/' config.json",
                "config.json", "key \"num_experts_per_tok\" (5) must be at most key \"num_local_experts\" (4)");
    bad_case_of("mixtral", "moe_aux", "sed -i 's/\"output_router_logits\": false/\"output_router_logits\": true/' "
                "config.json", "config.json", "key \"output_router_logits\"");
    bad_case_of("qwen3_moe", "moe_foreign", "sed -i 's/\"norm_topk_prob\": false,/\"norm_topk_prob\": false, "
                "\"n_shared_experts\": 1,/' config.json", "config.json", "key \"n_shared_experts\"");
    bad_case_of("mixtral", "moe_shape", "sed -i 's/\"intermediate_size\": 48/\"intermediate_size\": 40/' config.json",
                "config.json", "'model.layers.0.block_sparse_moe.experts.0.w1.weight' as [40,32]");
    bad_case_of("mixtral", "moe_missing", "sed -i 's/layers.1.block_sparse_moe.experts.3.w2/"
                "layers.1.block_sparse_moe.experts.3.w9/' model.safetensors", "moe_missing",
                "no tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight'");
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "hf:" HF "mixtral", "--data", "tokens:" HF "tokens.bin", "--val-data",
                        "tokens:" HF "tokens.bin", "--seq", "16", "--batch", "2", "--epochs", "2", "--optimizer",
                        "adamw", "--lr", "1e-2", "--progress", "none", "--lora-r", "4", "--lora-targets",
                        "q_proj,v_proj", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "adapters on q_proj,v_proj");
    const double v = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "  mixtral LoRA q_proj,v_proj: val loss %.4f (from %.4f)\n", v, ref_loss("mixtral"));
    ASSERT(v < ref_loss("mixtral") - 0.05);
    static const gen_golden mx[1] = {{"5,6,7", {"--max-new-tokens", "30", "--no-repeat-ngram-size", "2"},
                                      "| 113 66 103 103 125 29 113 113 29 18 10 66 66 18 35 66 113 103 4 90 113 18 117 "
                                      "113 35 115 66 90 35 13\n"}};
    static const gen_golden qm[1] = {{"5,6,7", {"--max-new-tokens", "30", "--no-repeat-ngram-size", "2"},
                                      "| 10 10 49 49 54 54 12 10 86 10 16 10 111 111 86 23 29 29 10 29 86 29 88 29 6 "
                                      "29 93 29 83 29\n"}};
    static const gen_golden q2[1] = {{"5,6,7", {"--max-new-tokens", "30", "--no-repeat-ngram-size", "2"},
                                      "| 58 46 98 98 113 98 46 113 113 46 10 113 10 46 2\n"}}; /* its stop token */
    generate_goldens("mixtral", mx, 1);
    generate_goldens("qwen3_moe", qm, 1);
    static const gen_golden oe[1] = {{"5,6,7", {"--max-new-tokens", "30", "--no-repeat-ngram-size", "2"},
                                      "| 47 127 127 61 127 22 61 61 40 78 40 12 40 122 69 104 117 57 87 15 24 122 83 "
                                      "57 124 104 47 2\n"}};
    generate_goldens("qwen2_moe", q2, 1);
    generate_goldens("olmoe", oe, 1);
}

/* llama's weights under YaRN rope scaling: trained 3 steps and written with --save-hf, the export keeps the
 * scaling's keys and evaluates to the run's own loss; a yarn beta_slow of -1 is refused naming the key. */
TEST(yarn_save_hf)
{
    cli_result r;
    char *d = edited_dir("llama", "llama_yarn", "cp '" HF "llama_yarn_config.json' config.json"), m[400], m2[400];
    char *out = cli_path("llama_yarn_out"), cfg[400], text[4096] = "";
    snprintf(m, sizeof m, "hf:%s", d);
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", m, "--data", "tokens:" HF "tokens.bin", "--val-data",
                        "tokens:" HF "tokens.bin", "--seq", "16", "--batch", "2", "--max-steps", "3", "--optimizer",
                        "adamw", "--lr", "1e-3", "--progress", "none", "--save-hf", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    const double v = cli_out_value(r.out, "val loss: ");
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    read_text(cfg, text, sizeof text);
    const char *want[] = {"\"rope_type\":\t\"yarn\"", "\"factor\":\t4", "\"beta_fast\":\t2", "\"beta_slow\":\t0.5",
                          "\"truncate\":\tfalse", "\"original_max_position_embeddings\":\t16"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ASSERT_STR_CONTAINS(text, want[i]);
    snprintf(m2, sizeof m2, "hf:%s", out);
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--model", m2, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    fprintf(stderr, "  yarn --save-hf: eval %.6f, the run's val loss %.4f\n", json_loss(r.out), v);
    ASSERT_NEAR(json_loss(r.out), v, 6e-5, 0);
    bad_case_of("llama", "llama_yarn_bad", "cp '" HF "llama_yarn_config.json' config.json && "
                "sed -i 's/\"beta_slow\": 0.5/\"beta_slow\": -1/' config.json", "config.json",
                "yarn's attention_factor (or mscale / mscale_all_dim), beta_fast and beta_slow must give positive");
}

/* Phi-4's shape: the export keeps partial_rotary_factor and the LongRoPE factors (the run's own loss again);
 * --tp 2 (q 64, k and v 32 rows: blocks of different sizes) and --pp 2 give one process's losses, and so does
 * --cp 2, whose ranks hold 8 of the 16 positions each (LongRoPE
 * takes the sequence's length, past the 8 original positions: the long factors, as one process). */
TEST(phi4_save_hf_and_pp)
{
    save_hf_and_parallel("phi4",
                         (const char *const[]){"\"partial_rotary_factor\":\t0.75", "\"rope_type\":\t\"longrope\"",
                                               "\"original_max_position_embeddings\":\t8", "7.1164", NULL},
                         true, true);
    cp_matches_one("phi4", "16", "ring");
}

/* tied config.json (tie_word_embeddings true) over weights that also hold
 * lm_head.weight: taken when it is the embedding byte for byte, refused
 * (exit 2 naming the key and the tensor) when it differs; dtrain dropped
 * the head silently (transformers 5 unties the two and uses it). */
TEST(tied_head)
{
    const char *tie = "sed -i 's/\"tie_word_embeddings\": false/\"tie_word_embeddings\": true/' config.json";
    bad_case("tied_other_head", tie, "config.json", "lm_head.weight differs from model.embed_tokens.weight");
    /* the same head written twice: lm_head.weight (shard 2) := model.embed_tokens.weight (shard 1) */
    char *d = bad_dir("tied_same_head", tie), p1[600], p2[600], m[600];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", d);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", d);
    dt_st_file *f1 = NULL, *f2 = NULL;
    ASSERT_OK(dt_st_open(p1, &f1));
    ASSERT_OK(dt_st_open(p2, &f2));
    const dt_st_tensor *e = dt_st_find(f1, "model.embed_tokens.weight"), *h = dt_st_find(f2, "lm_head.weight");
    ASSERT(e && h && e->nbytes == h->nbytes);
    char *buf = malloc(e->nbytes);
    ASSERT(buf != NULL);
    ASSERT_OK(dt_st_read(f1, e, 0, e->nbytes, buf));
    uint64_t at = h->offset, n = h->nbytes;
    dt_st_close(f1);
    dt_st_close(f2);
    FILE *f = fopen(p2, "r+b");
    ASSERT(f != NULL);
    ASSERT(fseek(f, (long)at, SEEK_SET) == 0 && fwrite(buf, 1, n, f) == n);
    ASSERT_EQ_INT(fclose(f), 0);
    free(buf);
    snprintf(m, sizeof m, "hf:%s", d);
    cli_result r;
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL});
    if (r.code != 0)
        fprintf(stderr, "  %s", r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(isfinite(json_loss(r.out)));
}

/* A directory holding both model.safetensors and a sharded index reads
 * model.safetensors, as transformers' from_pretrained does (dtrain read the
 * shards): the golden llama's f32 shards beside llama_bf16's single file
 * give llama_bf16's loss. */
TEST(single_file_first)
{
    char *d = bad_dir("single_and_shards", "cp '" HF "llama_bf16/model.safetensors' .");
    char m[600];
    snprintf(m, sizeof m, "hf:%s", d);
    cli_result r;
    char *args[] = {"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL};
    cli_runv(&r, 60, NULL, args);
    ASSERT_EQ_INT(r.code, 0);
    double both = json_loss(r.out);
    args[2] = "hf:" HF "llama_bf16";
    cli_runv(&r, 60, NULL, args);
    ASSERT_EQ_INT(r.code, 0);
    double single = json_loss(r.out);
    fprintf(stderr, "  both files %.9g, model.safetensors alone %.9g\n", both, single);
    ASSERT(isfinite(both) && both == single);
}

/* The new tokens of `dtrain generate --model m --prompt-ids 5,6,7` with extra options (NULL-terminated). */
static void gen_ids(cli_result *r, const char *m, char **extra)
{
    char *args[32] = {"generate", "--model", (char *)m, "--prompt-ids", "5,6,7", "--max-new-tokens", "8"};
    int n = 7;
    for (int i = 0; extra[i] && n < 31; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cli_runv(r, 60, NULL, args);
}

/* An hf:DIR model generates with its generation_config.json's settings as
 * transformers' generate() does (greedy without do_sample; eos_token_id
 * stops it), the options given override them, keys dtrain does not apply
 * are named, and a malformed value is exit 2 naming the file and the key. */
TEST(generation_config)
{
    static cli_result r;
    static char greedy[sizeof r.out];
    char m[420];
    gen_ids(&r, "hf:" HF "llama", (char *[]){"--temperature", "0", NULL});
    ASSERT_EQ_INT(r.code, 0);
    memcpy(greedy, r.out, sizeof greedy);
    const char *bar = strstr(greedy, "| ");
    ASSERT(bar != NULL);
    gen_ids(&r, "hf:" HF "llama", (char *[]){NULL}); /* no do_sample: greedy, as transformers */
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_EQ(r.out, greedy);
    /* the third new token as the directory's eos_token_id: generation stops right after it */
    long t1, t2, t3;
    ASSERT(sscanf(bar + 2, "%ld %ld %ld", &t1, &t2, &t3) == 3);
    char edit[300], want[64];
    snprintf(edit, sizeof edit, "sed -i 's/\"eos_token_id\": 2/\"eos_token_id\": [%ld]/' generation_config.json",
             t3);
    snprintf(m, sizeof m, "hf:%s", bad_dir("eos", edit));
    gen_ids(&r, m, (char *[]){NULL});
    ASSERT_EQ_INT(r.code, 0);
    snprintf(want, sizeof want, "| %ld %ld %ld\n", t1, t2, t3);
    if (t1 != t3 && t2 != t3)
        ASSERT_STR_CONTAINS(r.out, want);
    gen_ids(&r, m, (char *[]){"--eos-id", "none", NULL}); /* overridden: all 8 */
    ASSERT_STR_EQ(r.out, greedy);
    gen_ids(&r, m, (char *[]){"--eos-id", "999", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "stop token 999 is outside the vocabulary [0, 128)");
    /* do_sample with settings dtrain does not apply: named on stderr */
    snprintf(m, sizeof m, "hf:%s",
             bad_dir("sample", "printf '{\"do_sample\": true, \"top_k\": 5, \"typical_p\": 0.5, "
                               "\"epsilon_cutoff\": 0.001, \"top_h\": 0.3, \"penalty_alpha\": 0.6}' > "
                               "generation_config.json"));
    gen_ids(&r, m, (char *[]){NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "penalty_alpha 0.6 are not applied");
    ASSERT(!strstr(r.err, "typical_p") && !strstr(r.err, "epsilon_cutoff") && !strstr(r.err, "top_h")); /* applied */
    gen_ids(&r, m, (char *[]){"--eta-cutoff", "1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--eta-cutoff 1: want 0 <= E < 1");
    gen_ids(&r, m, (char *[]){"--temperature", "0", NULL});
    ASSERT_STR_EQ(r.out, greedy);
    snprintf(m, sizeof m, "hf:%s", bad_dir("badgen", "printf '{\"do_sample\": true, \"top_p\": 2}' > "
                                                     "generation_config.json"));
    gen_ids(&r, m, (char *[]){NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "generation_config.json: key \"top_p\"");
    /* greedy with a repetition penalty: transformers 5.24's generate(do_sample=False, repetition_penalty=1.3)
       on the golden Llama gave these tokens */
    gen_ids(&r, "hf:" HF "llama", (char *[]){"--repetition-penalty", "1.3", "--max-new-tokens", "20", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "| 89 18 8 48 35 42 107 103 117 4 74 24 58 44 123 80 117 71 61 43\n");
    const char *bad_opts[][3] = {{"--top-p", "0", "want 0 < P <= 1"}, {"--top-p", "1.5", "--top-p"},
                                 {"--eos-id", "1,,2", "none empty"}, {"--eos-id", "x", "--eos-id"},
                                 {"--repetition-penalty", "0", "want X > 0"},
                                 {"--seed", "5", "--model hf:DIR's own"}, /* the weights are the directory's */
                                 {"--min-p", "1.5", "--min-p"}, {"--typical-p", "0", "want 0 < P <= 1"}};
    for (size_t i = 0; i < sizeof bad_opts / sizeof bad_opts[0]; i++) {
        gen_ids(&r, "hf:" HF "llama", (char *[]){(char *)bad_opts[i][0], (char *)bad_opts[i][1], NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, bad_opts[i][2]);
    }
    /* --min-p 1 keeps the most likely token alone: sampling gives the greedy tokens */
    gen_ids(&r, "hf:" HF "llama", (char *[]){"--temperature", "0.9", "--min-p", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_EQ(r.out, greedy);
}

/* no_repeat_ngram_size, min_new_tokens / min_length and beam search against transformers 5.24: its
 * model.generate(torch.tensor([[5, 6, 7]]), do_sample=False, pad_token_id=0, max_new_tokens=M, ...) with the
 * keys of each case on the golden directories (AutoModelForCausalLM.from_pretrained(DIR)) gave these new
 * tokens, once, with torch 2.15 on a CPU. Each case's tokens differ from those of the feature off (the greedy
 * line, or the neighbouring beam case), so each fails when its feature breaks. */
TEST(generate_processors_and_beams)
{
    static cli_result r;
    static const struct {
        const char *model, *opts[14], *want;
    } cases[] = {
        /* greedy, no_repeat_ngram_size 2 (greedy alone: 7 7 7 ... on gpt2, 89 18 8 48 7 89 111 78 ... on llama) */
        {"gpt2", {"--no-repeat-ngram-size", "2", "--max-new-tokens", "16"},
         "| 7 98 98 37 37 73 73 114 114 97 97 58 58 66 66 65\n"},
        {"llama", {"--no-repeat-ngram-size", "2", "--max-new-tokens", "16"},
         "| 89 18 8 48 7 97 105 102 9 84 73 71 123 80 7 35\n"},
        {"qwen3", {"--no-repeat-ngram-size", "3", "--max-new-tokens", "16"},
         "| 7 7 44 44 44 102 102 102 44 44 82 82 82 122 122 122\n"},
        /* gemma (greedy alone: 7 7 7 ...) */
        {"gemma", {"--no-repeat-ngram-size", "2", "--max-new-tokens", "16"},
         "| 7 57 57 74 74 57 7 100 100 9 9 100 109 109 117 117\n"},
        /* phi3 (transformers 5.25; greedy alone: ... 84 99 55 96) */
        {"phi3", {"--no-repeat-ngram-size", "2", "--max-new-tokens", "16"},
         "| 57 95 55 96 27 29 41 125 121 96 69 47 84 99 55 67\n"},
        {"phi3", {"--num-beams", "3", "--no-repeat-ngram-size", "2", "--max-new-tokens", "12"},
         "| 57 95 34 96 27 69 47 117 105 108 106 118\n"},
        /* OLMo 2 (greedy alone: 28 80 28 80 ...) */
        {"olmo2", {"--no-repeat-ngram-size", "2", "--max-new-tokens", "14"},
         "| 28 80 28 28 37 28 126 80 80 126 28 12 80 12\n"},
        {"olmo2", {"--num-beams", "3", "--no-repeat-ngram-size", "2", "--max-new-tokens", "14"},
         "| 28 80 28 28 37 28 126 80 126 126 28 12 80 80\n"},
        /* Granite (its four multipliers) */
        {"granite", {"--no-repeat-ngram-size", "2", "--max-new-tokens", "14"},
         "| 7 123 123 36 36 123 70 70 123 57 57 123 7 36\n"},
        {"granite", {"--num-beams", "3", "--no-repeat-ngram-size", "2", "--max-new-tokens", "14"},
         "| 7 123 123 36 36 77 77 5 5 0 0 51 51 0\n"},
        /* Phi-4's shape (partial RoPE, LongRoPE past 8 positions: transformers recomputes its cache there) */
        {"phi4", {"--no-repeat-ngram-size", "2", "--max-new-tokens", "14"},
         "| 7 9 9 11 11 9 77 77 19 19 77 99 99 28\n"},
        {"phi4", {"--num-beams", "3", "--no-repeat-ngram-size", "2", "--max-new-tokens", "14"},
         "| 7 9 9 11 11 63 63 77 77 19 19 77 99 99\n"},
        /* eos_token_id = the first (gpt2) or second (llama) greedy token: it stops there unless min_new_tokens 5 */
        {"gpt2", {"--eos-id", "7", "--max-new-tokens", "12"}, "| 7\n"},
        {"gpt2", {"--eos-id", "7", "--min-new-tokens", "5", "--max-new-tokens", "12"},
         "| 72 72 72 72 72 72 72 114 114 114 114 114\n"},
        {"llama", {"--eos-id", "18", "--max-new-tokens", "12"}, "| 89 18\n"},
        {"llama", {"--eos-id", "18", "--min-new-tokens", "5", "--max-new-tokens", "12"},
         "| 89 111 78 72 71 74 42 8 48 8 48 8\n"},
        /* beam search: num_beams 3 and 4, length_penalty 1, 0.5 and 2, early_stopping false, true, never */
        {"llama", {"--num-beams", "3", "--max-new-tokens", "12"}, "| 89 111 78 72 116 73 42 8 48 7 89 111\n"},
        {"llama", {"--num-beams", "4", "--max-new-tokens", "12"}, "| 89 111 78 72 116 73 6 78 72 116 73 71\n"},
        {"llama", {"--num-beams", "3", "--eos-id", "18", "--max-new-tokens", "12"}, "| 89 18\n"},
        {"llama", {"--num-beams", "3", "--eos-id", "18", "--length-penalty", "2", "--max-new-tokens", "12"},
         "| 89 111 14 78 72 116 73 42 8 48 7 89\n"},
        {"llama", {"--num-beams", "4", "--eos-id", "18", "--length-penalty", "2", "--early-stopping", "true",
                   "--max-new-tokens", "12"}, "| 89 111 14 78 72 116 73 6 78 72 116 73\n"},
        {"llama", {"--num-beams", "3", "--eos-id", "8", "--length-penalty", "2", "--early-stopping", "false",
                   "--max-new-tokens", "12"}, "| 89 111 78 72 116 73 6 78 72 116 73 71\n"},
        {"llama", {"--num-beams", "3", "--eos-id", "8", "--length-penalty", "2", "--early-stopping", "true",
                   "--max-new-tokens", "12"}, "| 89 111 78 72 116 73 42 8\n"},
        {"llama", {"--num-beams", "3", "--eos-id", "8", "--length-penalty", "2", "--early-stopping", "never",
                   "--max-new-tokens", "12"}, "| 89 111 78 72 116 73 6 78 72 116 73 71\n"},
        {"gpt2", {"--num-beams", "3", "--eos-id", "7", "--max-new-tokens", "12"},
         "| 6 114 114 114 114 114 114 114 114 114 114 114\n"},
        {"gpt2", {"--num-beams", "3", "--eos-id", "7", "--length-penalty", "0.5", "--early-stopping", "true",
                  "--max-new-tokens", "12"}, "| 7\n"},
        {"gpt2", {"--num-beams", "4", "--eos-id", "7", "--length-penalty", "0.5", "--max-new-tokens", "12"},
         "| 7\n"},
        {"gpt2", {"--num-beams", "4", "--eos-id", "7", "--length-penalty", "2", "--early-stopping", "true",
                  "--max-new-tokens", "12"}, "| 6 114 114 114 114 114 114 114 114 114 114 114\n"},
        {"qwen3", {"--num-beams", "4", "--eos-id", "7", "--max-new-tokens", "12"},
         "| 12 12 12 12 12 12 12 12 12 12 12 12\n"},
        /* the processors inside the beams, in transformers' order on the log-probabilities */
        {"llama", {"--num-beams", "3", "--no-repeat-ngram-size", "2", "--repetition-penalty", "1.3",
                   "--min-new-tokens", "5", "--eos-id", "18", "--max-new-tokens", "12"},
         "| 89 111 14 78 72 116 73 42 8 48 57 127\n"},
        {"gpt2", {"--num-beams", "3", "--no-repeat-ngram-size", "2", "--repetition-penalty", "1.3",
                  "--min-new-tokens", "5", "--eos-id", "7", "--max-new-tokens", "12"},
         "| 72 114 64 65 66 13 82 26 48 97 69 37\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char m[300], *extra[16] = {"--temperature", "0"};
        int n = 2;
        snprintf(m, sizeof m, "hf:%s%s", HF, cases[i].model);
        for (int j = 0; cases[i].opts[j]; j++)
            extra[n++] = (char *)cases[i].opts[j];
        extra[n] = NULL;
        gen_ids(&r, m, extra);
        if (r.code != 0 || !strstr(r.out, cases[i].want))
            fprintf(stderr, "  case %zu (%s %s %s): got %s%s, transformers %s", i, cases[i].model, cases[i].opts[0],
                    cases[i].opts[1], r.out, r.err, cases[i].want);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, cases[i].want);
    }
    /* a bf16 directory through the key/value cache: transformers 5.25's generate on it loaded in bf16
       (from_pretrained(DIR, dtype=torch.bfloat16), no_repeat_ngram_size 2) gave these 30 new tokens */
    gen_ids(&r, "hf:" HF "llama_bf16", (char *[]){"--temperature", "0", "--no-repeat-ngram-size", "2",
                                                   "--max-new-tokens", "30", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "| 89 18 8 48 7 97 105 102 9 84 73 71 123 80 7 35 42 8 102 86 47 58 44 8 36 73 23 48 "
                               "8 68\n");
    /* the keys of generation_config.json: min_length 9 (the prompt's 3 and 6 new) stops eos 7 as above */
    char m[420];
    snprintf(m, sizeof m, "hf:%s", edited_dir("gpt2", "minlen", "printf '{\"eos_token_id\": 7, \"min_length\": 9, "
                                                   "\"max_new_tokens\": 12}' > generation_config.json"));
    gen_ids(&r, m, (char *[]){"--max-new-tokens", "12", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "| 72 72 72 72 72 72 72 114 114 114 114 114\n");
    snprintf(m, sizeof m, "hf:%s", edited_dir("llama", "beams", "printf '{\"eos_token_id\": 8, \"num_beams\": 3, "
                                                   "\"length_penalty\": 2.0, \"early_stopping\": true}' > "
                                                   "generation_config.json"));
    gen_ids(&r, m, (char *[]){"--max-new-tokens", "12", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "| 89 111 78 72 116 73 42 8\n");
    ASSERT_STR_EQ(r.err, "");
    gen_ids(&r, m, (char *[]){"--max-new-tokens", "12", "--early-stopping", "false", NULL}); /* the option wins */
    ASSERT_STR_CONTAINS(r.out, "| 89 111 78 72 116 73 6 78 72 116 73 71\n");
    /* do_sample with num_beams: beam sampling; the same tokens for the same --sample-seed, beam search's with
       --temperature 0 */
    snprintf(m, sizeof m, "hf:%s", edited_dir("llama", "beamsample", "printf '{\"do_sample\": true, \"num_beams\": 2}' "
                                                                     "> generation_config.json"));
    static cli_result r2;
    gen_ids(&r, m, (char *[]){"--sample-seed", "4", "--max-new-tokens", "12", NULL});
    ASSERT_EQ_INT(r.code, 0);
    gen_ids(&r2, m, (char *[]){"--sample-seed", "4", "--max-new-tokens", "12", NULL});
    ASSERT_STR_EQ(r.out, r2.out);
    gen_ids(&r2, m, (char *[]){"--temperature", "0", "--max-new-tokens", "12", NULL});
    ASSERT_EQ_INT(r2.code, 0);
    ASSERT(strcmp(r.out, r2.out) != 0); /* sampled, not searched */
    snprintf(m, sizeof m, "hf:%s", edited_dir("llama", "beams0", "printf '{\"num_beams\": 0}' > "
                                                                 "generation_config.json"));
    gen_ids(&r, m, (char *[]){NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "generation_config.json: key \"num_beams\"");
    const char *bad_opts[][3] = {{"--num-beams", "0", "--num-beams"},        {"--num-beams", "2.5", "--num-beams"},
                                 {"--length-penalty", "nan", "--length-penalty"},
                                 {"--min-new-tokens", "-1", "--min-new-tokens"},
                                 {"--no-repeat-ngram-size", "x", "--no-repeat-ngram-size"},
                                 {"--early-stopping", "maybe", "--early-stopping"}};
    for (int i = 0; i < 6; i++) {
        gen_ids(&r, "hf:" HF "llama", (char *[]){(char *)bad_opts[i][0], (char *)bad_opts[i][1], NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, bad_opts[i][2]);
    }
}

/* A sliding window (the golden Mistral's: 16 positions of 64) as transformers generates past it: every token at
 * its own position, seeing the last 16 (the key/value cache, beams too). transformers 5.25's
 * model.generate(ids, do_sample=False, pad_token_id=0, ...) on it (AutoModelForCausalLM.from_pretrained,
 * torch 2.15, CPU) gave these new tokens, once, for the prompts 5 6 7 and a 20-token one (longer than the
 * window): greedy with no_repeat_ngram_size 2 (the window cropped, as dtrain generated before, gave
 * 53 50 82 82 ... from the 15th token on), and beam search; uncached (--kv-cache off) the same. */
TEST(generate_sliding_window)
{
    static cli_result r;
    gen_golden c[5] = {[4] = {"5,6,7", {"--max-new-tokens", "30", "--num-beams", "3", "--eos-id", "83",
                                        "--length-penalty", "2"},
                              "| 96 124 109 115 48 23 3 22 124 109 115 48 23 3 22 104 6 109 115 48 23 19 11 115 48 23 "
                              "19 11 115 48\n"}};
    window_cases(c, (const char *const[]){
        "| 53 28 92 74 87 83 11 115 48 23 94 57 33 53 1 29 11 28 26 92 104 27 29 83 74 120 54 44 40 21 109 115 77 39 "
        "123 59 117 87 27 20\n",
        "| 50 82 82 59 7 96 29 11 28 31 100 96 12 77 39 123 59 117 87 83\n",
        "| 96 124 109 115 48 23 3 22 124 1 115 77 39 60 88 33 53 28 89 82 82 59 117 87 83 11 119 105 109 53\n",
        "| 50 82 82 59 7 96 20 116 51 59 117 87 83 11 115 48 23 94 45 53\n"});
    generate_goldens("mistral", c, 5);
    /* inside the window both run, to the same tokens */
    static char on[sizeof r.out];
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "hf:" HF "mistral", "--prompt-ids", "5,6,7",
                                      "--max-new-tokens", "13", "--temperature", "0", NULL});
    ASSERT_EQ_INT(r.code, 0);
    memcpy(on, r.out, sizeof on);
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "hf:" HF "mistral", "--prompt-ids", "5,6,7",
                                      "--max-new-tokens", "13", "--temperature", "0", "--kv-cache", "off", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_EQ(r.out, on);
    ASSERT_STR_CONTAINS(on, "| 53 28 92 74 87 83 11 115 48 23 94 57 33\n");
    /* a training run's samples through --pp stages (uncached), past the window and inside it, are printed (past
       it they were said to be not available: the uncached forward had no sliding window) */
    char *const base[] = {"train", "--model", "hf:" HF "mistral", "--data", "tokens:" HF "tokens.bin",
                          "--val-data", "tokens:" HF "tokens.bin", "--seq", "16", "--batch", "4", "--max-steps", "2",
                          "--pp", "2", "--micro-batches", "2", "--threads", "1", "--progress", "none",
                          "--sample-every", "1", NULL};
    char *const past[] = {"--sample-tokens", "20", NULL}, *const inside[] = {"--sample-tokens", "8", NULL};
    char *const *l1[] = {base, past}, *const *l2[] = {base, inside};
    cli_run_ranks(&r, 180, NULL, 2, 2, l1);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "sample at step 2: ");
    ASSERT(!strstr(r.out, "not available"));
    cli_run_ranks(&r, 180, NULL, 2, 2, l2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "sample at step 2: ");
    ASSERT(!strstr(r.out, "not available"));
}

/* --stream on prints the tokens as they come and ends with the same output as without it: ids (greedy on the
 * golden Llama), and text through a BPE vocabulary of multi-byte UTF-8 words from a random model that emits
 * broken byte sequences too (bytes are held back until their character is whole); beam search prints its beam
 * at the end. */
TEST(generate_stream)
{
    static cli_result r;
    static char off[sizeof r.out];
    const char *const *sets[] = {(const char *[]){"--max-new-tokens", "12", NULL},
                                 (const char *[]){"--max-new-tokens", "12", "--num-beams", "3", NULL},
                                 (const char *[]){"--max-new-tokens", "0", NULL}};
    for (int i = 0; i < 3; i++) {
        for (int on = 0; on < 2; on++) {
            char *args[20] = {"generate", "--model", "hf:" HF "llama", "--prompt-ids", "5,6,7", "--temperature", "0",
                              "--stream", on ? "on" : "off"};
            int n = 9;
            for (int j = 0; sets[i][j]; j++)
                args[n++] = (char *)sets[i][j];
            args[n] = NULL;
            cli_runv(&r, 60, NULL, args);
            ASSERT_EQ_INT(r.code, 0);
            if (!on)
                memcpy(off, r.out, sizeof off);
        }
        ASSERT_STR_EQ(r.out, off);
    }
    ASSERT_STR_CONTAINS(off, "5 6 7\n"); /* no new token */
    char *corpus = cli_path("stream_corpus.txt"), *vocab = cli_path("stream.bpe");
    FILE *f = fopen(corpus, "w");
    ASSERT(f);
    const char *words[] = {"h\xc3\xa9llo", "w\xc3\xb6rld", "\xe6\x97\xa5\xe6\x9c\xac", "caf\xc3\xa9",
                           "\xe2\x82\xacuro", "emoji\xf0\x9f\x98\x80"};
    for (int i = 0; f && i < 3000; i++)
        fprintf(f, "%s ", words[(i * 7 + i / 5) % 6]);
    if (f)
        fclose(f);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--train-vocab", "270", corpus, "-o", vocab, "--min-count", "1",
                                      NULL});
    ASSERT_EQ_INT(r.code, 0);
    for (int on = 0; on < 2; on++) {
        cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab", vocab, "--vocab-size", "270",
                                          "--prompt", "h\xc3\xa9llo w\xc3\xb6rld", "--max-new-tokens", "40",
                                          "--stream", on ? "on" : "off", NULL});
        ASSERT_EQ_INT(r.code, 0);
        if (!on)
            memcpy(off, r.out, sizeof off);
    }
    ASSERT_STR_EQ(r.out, off);
    ASSERT(strncmp(off, "h\xc3\xa9llo w\xc3\xb6rld", 13) == 0 && strlen(off) > 20);
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "hf:" HF "llama", "--prompt-ids", "5", "--stream", "yes",
                                      NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--stream: 'yes' is neither on nor off");
}

/* generate --lora-from DIR: PEFT's adapters (here a dtrain LoRA run's --save-lora) on an hf:DIR model continue
 * a prompt as the LoRA run's own checkpoint does (PeftModel.from_pretrained(base, DIR).generate gave the same
 * tokens when this was written), and differently from the base model alone. */
TEST(generate_lora_from)
{
    static cli_result r;
    static char base[sizeof r.out], tuned[sizeof r.out];
    char *run = cli_path("lora_run"), *ad = cli_path("lora_adapters");
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "hf:" HF "llama", "--data", "tokens:" HF "tokens.bin", "--seq", "16",
                        "--batch", "2", "--optimizer", "adamw", "--lr", "0.02", "--epochs", "2", "--lora-targets",
                        "q_proj,v_proj", "--lora-r", "4", "--lora-alpha", "8", "--progress", "none", "--no-eval",
                        "--save", run, "--save-lora", ad, NULL});
    ASSERT_EQ_INT(r.code, 0);
    gen_ids(&r, "hf:" HF "llama", (char *[]){NULL});
    ASSERT_EQ_INT(r.code, 0);
    memcpy(base, r.out, sizeof base);
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--ckpt", run, "--prompt-ids", "5,6,7", "--max-new-tokens", "8",
                                      NULL});
    ASSERT_EQ_INT(r.code, 0);
    memcpy(tuned, r.out, sizeof tuned);
    ASSERT(strcmp(base, tuned) != 0); /* the adapters changed the continuation */
    gen_ids(&r, "hf:" HF "llama", (char *[]){"--lora-from", ad, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_EQ(r.out, tuned);
    /* eval --lora-from: the adapters' loss (it was the base's: the adapters were built and left at zero), the
       LoRA run's checkpoint's (PEFT's own on this pair: 4.83716130 when this was written) */
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", run, "--val-data", "tokens:" HF "tokens.bin", "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    const double run_loss = json_loss(r.out);
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--model", "hf:" HF "llama", "--lora-from", ad, "--data", "tokens:" HF "tokens.bin",
                        "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    fprintf(stderr, "  eval: the base %.6f, --lora-from %.6f, the run's checkpoint %.6f\n", ref_loss("llama"),
            json_loss(r.out), run_loss);
    ASSERT_NEAR(json_loss(r.out), run_loss, 0, 1e-5);
    ASSERT(fabs(json_loss(r.out) - ref_loss("llama")) > 1e-3);
    /* dtrain train's options that name weights or outputs are refused by eval (they were ignored: the base's
       loss for --init-from RUN, no file for --save-hf) */
    char *out = cli_path("eval_out");
    const char *train_only[][2] = {{"--init-from", run}, {"--save", out}, {"--save-hf", out}, {"--plan", "auto"}};
    for (int i = 0; i < 4; i++) {
        cli_runv(&r, 60, NULL,
                 (char *[]){"eval", "--model", "hf:" HF "llama", (char *)train_only[i][0], (char *)train_only[i][1],
                            "--data", "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, train_only[i][0]);
        ASSERT_STR_CONTAINS(r.err, "is a dtrain train option");
        ASSERT(!file_exists(out));
    }
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--model", "hf:" HF "llama", "--no-eval", "--data", "tokens:" HF "tokens.bin", "--seq",
                        "16", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--no-eval is a dtrain train option"); /* was "there is no test loader" */
    /* bad input: exit 2 naming the option */
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--ckpt", run, "--lora-from", ad, "--prompt-ids", "5", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "holds a LoRA run's adapters");
    char *none = cli_path("no_such_adapters");
    gen_ids(&r, "hf:" HF "llama", (char *[]){"--lora-from", none, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-from");
    ASSERT_STR_CONTAINS(r.err, "adapter_config.json");
    gen_ids(&r, "hf:" HF "gpt2", (char *[]){"--lora-from", ad, NULL}); /* q_proj/v_proj: no such layers in GPT-2 */
    ASSERT_EQ_INT(r.code, 2);
    ASSERT(r.out[0] == 0);
}

/* --lora-from DIR of PEFT's adapters on Gemma 3's image-text model (tests/data/lora/gemma3_mm, "all-linear":
 * the language model's and the vision tower's, scripts/make_lora_goldens.py): eval of the hf: image-text
 * directory gives the PEFT model's loss within 1e-5, saying the vision tower's were left out; a LoRA run from
 * them saves its adapters under the text model's names; adapters only on the vision tower, or one under two
 * names, exit 2 naming the problem. With target_modules a regular expression (tests/data/lora/gemma3_mm_regex:
 * layers 1 and 3's q_proj and down_proj) a LoRA run adapts the file's layers and --save-lora lists their full
 * names; a pattern with a construct the regex dialect lacks exits 2 naming it and where it is. */
TEST(gemma3_image_text_lora_from)
{
    cli_result r;
    static const char lora[] = DT_SOURCE_DIR "/tests/data/lora/gemma3_mm";
    dt_st_file *f = NULL;
    float want = NAN;
    ASSERT_OK(dt_st_open(DT_SOURCE_DIR "/tests/data/lora/gemma3_mm_ref.safetensors", &f));
    const dt_st_tensor *t = f ? dt_st_find(f, "eval") : NULL;
    ASSERT(t && dt_st_read(f, t, 0, 4, &want) >= 0);
    dt_st_close(f);
    cli_runv(&r, 120, NULL,
             (char *[]){"eval", "--model", "hf:" HF "gemma3_mm", "--lora-from", (char *)lora, "--data",
                        "tokens:" HF "tokens.bin", "--batch", "4", "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    fprintf(stderr, "  gemma3_mm --lora-from: dtrain %.9g, PEFT %.9g (the base %.9g)\n", json_loss(r.out),
            (double)want, ref_loss("gemma3_mm"));
    ASSERT_NEAR(json_loss(r.out), want, 0, 1e-5);
    ASSERT(fabs(want - ref_loss("gemma3_mm")) > 0.05); /* the adapters matter */
    ASSERT_STR_CONTAINS(r.err, "18 adapter tensors of an image-text model's vision tower");
    /* a LoRA run from them: --save-lora writes the language model's, named as the text model's */
    char *ad = cli_path("mm_adapters"), file[600];
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "hf:" HF "gemma3_mm", "--lora-from", (char *)lora, "--data",
                        "tokens:" HF "tokens.bin", "--seq", "16", "--batch", "2", "--max-steps", "2", "--lr",
                        "0.01", "--progress", "none", "--no-eval", "--save-lora", ad, NULL});
    ASSERT_EQ_INT(r.code, 0);
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", ad);
    ASSERT_OK(dt_st_open(file, &f));
    ASSERT(f && dt_st_count(f) == 56); /* 4 layers x 7 layers x (A, B) */
    ASSERT(f && dt_st_find(f, "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight") != NULL);
    for (size_t i = 0; f && i < dt_st_count(f); i++)
        ASSERT(!strstr(dt_st_tensor_at(f, i)->name, "language_model") && !strstr(dt_st_tensor_at(f, i)->name,
                                                                                  "vision"));
    dt_st_close(f);
    /* adapters dtrain cannot use */
    char *bad = cli_path("mm_bad_adapters");
    static const char vis[] = "base_model.model.model.vision_tower.encoder.layers.0.mlp.fc1.lora_A.weight";
    const struct {
        const char *targets, *keys[2], *want;
        int64_t shapes[2][2];
    } c[] = {
        {"\"fc1\"", {vis, "base_model.model.model.vision_tower.encoder.layers.0.mlp.fc1.lora_B.weight"},
         "every adapter is on an image-text model's vision tower", {{4, 16}, {32, 4}}},
        {"\"q_proj\"", {"base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight",
                        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"},
         "is there twice", {{4, 32}, {4, 32}}},
    };
    for (int i = 0; i < 2; i++) {
        t_write_adapters(bad, c[i].targets, c[i].keys, c[i].shapes, 2);
        cli_runv(&r, 60, NULL,
                 (char *[]){"eval", "--model", "hf:" HF "gemma3_mm", "--lora-from", bad, "--data",
                            "tokens:" HF "tokens.bin", "--seq", "16", "--json", NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "--lora-from");
        ASSERT_STR_CONTAINS(r.err, c[i].want);
        ASSERT_STR_CONTAINS(r.err, c[i].keys[0]);
        ASSERT(r.out[0] == 0);
        gen_ids(&r, "hf:" HF "gemma3_mm", (char *[]){"--lora-from", bad, NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, c[i].want);
    }
    /* target_modules as PEFT's regular expression */
    char *rx = cli_path("mm_regex_adapters"), cfg[600];
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "hf:" HF "gemma3_mm", "--lora-from",
                        DT_SOURCE_DIR "/tests/data/lora/gemma3_mm_regex", "--data", "tokens:" HF "tokens.bin", "--seq",
                        "16", "--batch", "2", "--max-steps", "2", "--lr", "0.01", "--progress", "none", "--no-eval",
                        "--save-lora", rx, NULL});
    ASSERT_EQ_INT(r.code, 0);
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", rx);
    ASSERT_OK(dt_st_open(file, &f));
    ASSERT(f && dt_st_count(f) == 8); /* 2 layers x 2 kinds x (A, B) */
    ASSERT(f && dt_st_find(f, "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight") != NULL);
    dt_st_close(f);
    snprintf(file, sizeof file, "%s/adapter_config.json", rx);
    char js[4096];
    read_text(file, js, sizeof js);
    ASSERT_STR_CONTAINS(js, "\"model.layers.1.self_attn.q_proj\"");
    ASSERT_STR_CONTAINS(js, "\"model.layers.3.mlp.down_proj\"");
    ASSERT(!strstr(js, "model.layers.0.") && !strstr(js, "model.layers.2."));
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", bad);
    static const char lookbehind[] = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
                                     "\"(?<=x)q_proj\"}";
    ASSERT_OK(dt_file_write_atomic(cfg, lookbehind, strlen(lookbehind), 0644));
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--model", "hf:" HF "gemma3_mm", "--lora-from", bad, "--data", "tokens:" HF "tokens.bin",
                        "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "\"target_modules\" (a regular expression over layer names): regex error at offset 2");
}

/* A model directory as the Hugging Face hub cache holds it (snapshots/REV/NAME -> ../../blobs/HASH) loads
 * where it lies, as from_pretrained(cache_dir=...) does; a symlink elsewhere is still refused. */
TEST(hub_cache_layout)
{
    char *repo = cli_path("models--org--tiny-llama"), cmd[2400], m[600];
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && mkdir -p '%s/blobs' '%s/snapshots/0123abc' && cd '%s' && for f in *; do "
             "h=$(cksum \"$f\" | cut -d' ' -f1); cp \"$f\" '%s'/blobs/$h; "
             "ln -s ../../blobs/$h '%s'/snapshots/0123abc/$f; done",
             repo, repo, repo, HF "llama", repo, repo);
    ASSERT(system(cmd) == 0);
    snprintf(m, sizeof m, "hf:%s/snapshots/0123abc", repo);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"eval", "--model", m, "--data", "tokens:" HF "tokens.bin", "--batch", "4", "--seq", "16",
                        "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_NEAR(json_loss(r.out), ref_loss("llama"), 0, 1e-5);
    /* config.json linked to a file outside the cache's blobs: refused, exit 2 */
    snprintf(cmd, sizeof cmd,
             "cp '%s/config.json' '%s/outside.json' && ln -sf ../../outside.json '%s/snapshots/0123abc/config.json'",
             HF "llama", repo, repo);
    ASSERT(system(cmd) == 0);
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", m, "--prompt-ids", "5", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "config.json: is a symlink (not followed)");
}

/* --model hf:ORG/NAME, as from_pretrained takes a Hub id: the snapshot huggingface_hub's cache holds
 * (HF_HUB_CACHE, else HF_HOME/hub, ...; refs/main names it, its files links into blobs/) trains, evaluates and
 * generates as its directory does; an id the cache lacks is refused naming the cache and how to fill it (it was "no
 * config.json (not a Hugging Face model directory)"). */
TEST(hub_id_from_the_cache)
{
    char cache[600], cmd[3000];
    snprintf(cache, sizeof cache, "%s/hub_cache", cli_tmpdir());
    snprintf(cmd, sizeof cmd,
             "R='%s/models--acme--tiny-llama' && rm -rf '%s' && mkdir -p \"$R/refs\" \"$R/blobs\" "
             "\"$R/snapshots/0123abcd\" && printf 0123abcd > \"$R/refs/main\" && for f in '%sllama'/*; do "
             "b=$(cksum < \"$f\" | cut -d' ' -f1); cp \"$f\" \"$R/blobs/$b\"; "
             "ln -s \"../../blobs/$b\" \"$R/snapshots/0123abcd/$(basename \"$f\")\"; done",
             cache, cache, HF);
    ASSERT_EQ_INT(system(cmd), 0);
    char env[700];
    snprintf(env, sizeof env, "HF_HUB_CACHE=%s", cache);
    cli_result r;
    cli_runv(&r, 120, env, (char *[]){"eval", "--model", "hf:acme/tiny-llama", "--data", "tokens:" HF "tokens.bin",
                                      "--seq", "16", "--json", NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_NEAR(json_loss(r.out), ref_loss("llama"), 0, 1e-5);
    ASSERT_STR_CONTAINS(r.out, "models--acme--tiny-llama/snapshots/0123abcd");
    cli_runv(&r, 120, env, (char *[]){"generate", "--model", "hf:acme/tiny-llama", "--prompt-ids", "5,6",
                                      "--temperature", "0", "--max-new-tokens", "3", NULL});
    ASSERT_EQ_INT(r.code, 0);
    char *out = cli_path("hub_hf_out");
    cli_runv(&r, 120, env, (char *[]){"train", "--model", "hf:acme/tiny-llama", "--data", "tokens:" HF "tokens.bin",
                                      "--seq", "16", "--no-eval", "--max-steps", "1", "--progress", "none", "--save-hf",
                                      out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 120, env, (char *[]){"eval", "--model", "hf:acme/no-such-model", "--data", "tokens:" HF "tokens.bin",
                                      "--seq", "16", "--json", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "holds no snapshot of acme/no-such-model (download it first: hf download "
                               "acme/no-such-model)");
    ASSERT_STR_CONTAINS(r.err, cache);
}

int main(void)
{
    RUN(eval_json);
    RUN(train_and_generate);
    RUN(bad_directories);
    RUN(shape_options_refused);
    RUN(qwen3_save_hf_and_tp);
    RUN(gemma_save_hf_and_tp);
    RUN(phi3_save_hf_tp_and_pp);
    RUN(phi4_save_hf_and_pp);
    RUN(yarn_save_hf);
    RUN(granite_save_hf_tp_and_pp);
    RUN(olmo2_save_hf_tp_and_pp);
    RUN(smollm3_save_hf_tp_and_pp);
    RUN(olmo3_save_hf_tp_pp_and_cp);
    RUN(ministral_save_hf_tp_pp_and_cp);
    RUN(moe_save_hf_parallel_lora_generate);
    RUN(gemma2_save_hf_tp_and_pp);
    RUN(generate_gemma2);
    RUN(gemma3_save_hf_tp_pp_and_cp);
    RUN(gemma3_image_text_trains_and_saves_its_language_model);
    RUN(generate_gemma3);
    RUN(bad_phi3_directories);
    RUN(mistral_sliding_window);
    RUN(tied_head);
    RUN(single_file_first);
    RUN(hub_id_from_the_cache);
    RUN(generation_config);
    RUN(generate_processors_and_beams);
    RUN(generate_sliding_window);
    RUN(generate_stream);
    RUN(generate_lora_from);
    RUN(gemma3_image_text_lora_from);
    RUN(hub_cache_layout);
    cli_cleanup();
    return TEST_REPORT();
}
