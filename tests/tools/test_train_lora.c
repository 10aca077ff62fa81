/* dtrain train's LoRA around the training itself:
 *  - a LoRA checkpoint keeps its settings: `dtrain eval --ckpt` without
 *    --lora-* flags gives the run's own final evaluation, `dtrain generate
 *    --ckpt` the merged export's continuation, `--resume` without the flags
 *    continues the LoRA run and with other flags is refused naming both;
 *  - `--save-hf` of a LoRA run is the merged model (its loss is the run's);
 *  - `--lora-from DIR` (PEFT's files) and its bad inputs (exit 2, naming
 *    the file and the key);
 *  - `--save-lora` under ZeRO-3 (the adapters equal the checkpoint's), and
 *    refused through a symlink;
 *  - the memory report shows frozen parameters without gradients or
 *    optimizer states;
 *  - hf:DIR with --resume auto and nothing to resume starts from DIR's weights;
 *  - DoRA (--lora-dora) through the same paths, under ZeRO-3, and its refusals;
 *  - LoRA, DoRA and --freeze under --precision bf16;
 *  - --lora-modules-to-save (PEFT's modules_to_save), a tied head included, and its refusals;
 *  - --lora-layers-to-transform (PEFT's layers_to_transform), --lora-bias (PEFT's bias);
 *  - --lora-rank-pattern, --lora-alpha-pattern, --lora-exclude-modules (PEFT's rank_pattern, alpha_pattern,
 *    exclude_modules) through the same paths, and their refusals. */
// dt-test-timeout: 600
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "test.h"
#include "train_cli.h"
#include "tmp_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>

#define HF DT_SOURCE_DIR "/tests/data/hf/llama"
#define LORA DT_SOURCE_DIR "/tests/data/lora/"

static char tokens_[700], data_[800], val_[800];

static void make_tokens(void)
{
    snprintf(tokens_, sizeof tokens_, "%s/t.bin", cli_tmpdir());
    uint16_t *t = malloc(6000 * sizeof *t);
    unsigned s = 7;
    for (int i = 0; i < 6000; i++) {
        s = s * 1103515245u + 12345u;
        t[i] = (uint16_t)((s >> 16) % 701);
    }
    dt_tokens_write(tokens_, t, 6000);
    free(t);
    snprintf(data_, sizeof data_, "tokens:%s", tokens_);
    snprintf(val_, sizeof val_, "tokens:%s", tokens_);
}

/* The last "test_loss" of a metrics file; NAN without one. */
static double last_eval_loss(const char *path)
{
    static char buf[1 << 16];
    slurp_(path, buf, sizeof buf);
    double v = NAN;
    for (char *p = buf; (p = strstr(p, "\"test_loss\":")); p++)
        v = atof(p + 12);
    return v;
}

/* "loss" of a --json line. */
static double json_loss(const char *out) { return cli_out_value(out, "{\"loss\":"); }

/* `dtrain eval --ckpt ck` (no LoRA flags: the checkpoint's) gives the run's final evaluation `trained` (*l1 when not
 * NULL), and its merged export (--save-hf merged) the same loss */
static void evals_agree(const char *what, const char *ck, const char *merged, double trained, double *l1_out)
{
    cli_result r;
    char *ev[] = {"eval", "--ckpt", (char *)ck, "--threads", "1", "--json", NULL};
    cli_runv(&r, 120, NULL, ev);
    ASSERT_EQ_INT(r.code, 0);
    const double l1 = json_loss(r.out);
    if (l1_out)
        *l1_out = l1;
    char hf[400];
    snprintf(hf, sizeof hf, "hf:%s", merged);
    char *ev3[] = {"eval", "--model", hf, "--data", val_, "--batch", "4", "--seq", "32", "--json", "--threads", "1",
                   NULL};
    cli_runv(&r, 120, NULL, ev3);
    ASSERT_EQ_INT(r.code, 0);
    fprintf(stderr, "  %s: run's final eval %.6f, eval --ckpt %.8f, merged export %.8f\n", what, trained, l1,
            json_loss(r.out));
    ASSERT(fabs(l1 - trained) <= 1e-6);
    ASSERT(fabs(json_loss(r.out) - l1) <= 1e-5 * l1);
}

#define GPT "train", "--model", "gpt-micro", "--data", data_, "--vocab-size", "701", "--seq", "32", "--batch", "4", \
            "--threads", "1", "--optimizer", "adamw", "--lr", "0.05"
#define LORA_FLAGS "--lora-targets", "c_attn,c_proj", "--lora-r", "4", "--lora-alpha", "16"

TEST(ckpt_keeps_lora)
{
    const char *ck = cli_path("ck"), *merged = cli_path("merged"), *metrics = cli_path("m.jsonl");
    char *run[] = {GPT, LORA_FLAGS, "--val-data", val_, "--max-steps", "6", "--eval-every", "6", "--metrics",
                   (char *)metrics, "--save", (char *)ck, "--save-hf", (char *)merged, NULL};
    cli_result r;
    cli_runv(&r, 300, NULL, run);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "the LoRA adapters merged into their layers");
    const double trained = last_eval_loss(metrics);
    ASSERT(isfinite(trained));

    /* eval --ckpt, no flags: the LoRA model, as the run evaluated it; the merged export the same loss */
    double l1 = NAN;
    evals_agree("LoRA", ck, merged, trained, &l1);
    /* with the checkpoint's own flags: the same */
    char *ev2[] = {"eval", "--ckpt", (char *)ck, "--threads", "1", "--json", LORA_FLAGS, NULL};
    cli_runv(&r, 120, NULL, ev2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(r.out[0] == '{'); /* --json: the object alone on stdout */
    ASSERT(json_loss(r.out) == l1);
    char hf[400];
    snprintf(hf, sizeof hf, "hf:%s", merged);
    /* generate --ckpt: the LoRA model, the merged export's greedy tokens */
    char *g1[] = {"generate", "--ckpt", (char *)ck, "--prompt-ids", "1,2,3,4", "--max-new-tokens", "12",
                  "--temperature", "0", NULL};
    char *g2[] = {"generate", "--model", hf, "--prompt-ids", "1,2,3,4", "--max-new-tokens", "12", "--temperature",
                  "0", NULL};
    char out1[sizeof r.out];
    cli_runv(&r, 120, NULL, g1);
    ASSERT_EQ_INT(r.code, 0);
    snprintf(out1, sizeof out1, "%s", r.out);
    cli_runv(&r, 120, NULL, g2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_EQ(out1, r.out);

    /* --resume without the flags continues the LoRA run */
    char *res[] = {GPT, "--no-eval", "--max-steps", "8", "--save", (char *)ck, "--resume", "auto", NULL};
    cli_runv(&r, 300, NULL, res);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "LoRA: r 4, alpha 16, dropout 0, scaling 4");
    ASSERT_STR_CONTAINS(r.out, "resumed from");
    /* other flags: refused, naming both */
    char *bad[] = {GPT, "--no-eval", "--max-steps", "10", "--save", (char *)ck, "--resume", "auto",
                   "--lora-targets", "c_attn,c_proj", "--lora-r", "8", NULL};
    cli_runv(&r, 120, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "was trained with --lora-targets c_attn,c_proj --lora-r 4 --lora-alpha 16");
    ASSERT_STR_CONTAINS(r.err, "this command has --lora-targets c_attn,c_proj --lora-r 8");
    char *bad2[] = {GPT, "--no-eval", "--max-steps", "10", "--save", (char *)ck, "--resume", "auto", "--freeze",
                    "transformer.h.0.*", NULL};
    cli_runv(&r, 120, NULL, bad2);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "this command has no LoRA --freeze transformer.h.0.*");
}

/* `dtrain train --model hf:<the golden Llama> --lora-from dir --save-lora out` (2 AdamW steps): exit 0, stdout holding
 * want, and out's adapter file n tensors, key among them */
static void from_peft(const char *dir, const char *out, const char *want, int n, const char *key)
{
    char tok[500];
    snprintf(tok, sizeof tok, "tokens:%s", DT_SOURCE_DIR "/tests/data/hf/tokens.bin");
    char *run[] = {"train", "--model", "hf:" HF, "--lora-from", (char *)dir, "--data", tok, "--seq", "16", "--batch",
                   "2", "--max-steps", "2", "--no-eval", "--threads", "1", "--optimizer", "adamw", "--lr", "0.01",
                   "--save-lora", (char *)out, NULL};
    cli_result r;
    cli_runv(&r, 300, NULL, run);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, want);
    char f[600];
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", out);
    dt_ckpt *c = NULL;
    ASSERT_OK(dt_ckpt_open(f, &c));
    ASSERT_EQ_INT((int)dt_ckpt_num_tensors(c), n);
    ASSERT(dt_ckpt_find(c, key) >= 0);
    dt_ckpt_close(c);
}

/* --lora-from: PEFT's adapters on hf:DIR; bad directories exit 2 naming the file. */
TEST(lora_from)
{
    char tok[500];
    snprintf(tok, sizeof tok, "tokens:%s", DT_SOURCE_DIR "/tests/data/hf/tokens.bin");
    from_peft(LORA "init", cli_path("ad_llama"), "LoRA: r 4, alpha 8, dropout 0, scaling 2", 16,
              "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");

    cli_result r;
    char f[600];
    const char *bd = cli_path("bad_adapters");
    char *bad[] = {"train", "--model", "hf:" HF, "--lora-from", (char *)bd, "--data", tok, "--seq", "16", "--batch",
                   "2", "--max-steps", "1", "--no-eval", "--threads", "1", NULL};
    cli_runv(&r, 60, NULL, bad); /* no directory */
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "adapter_config.json");
    mkdir(bd, 0755);
    snprintf(f, sizeof f, "%s/adapter_config.json", bd);
    const char *cfg = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"k_proj\"]}";
    ASSERT_OK(dt_file_write_atomic(f, cfg, strlen(cfg), 0644));
    cli_runv(&r, 60, NULL, bad); /* no weights */
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "adapter_model.safetensors");
    /* init/'s weights for q/v/o/down on a config asking for k_proj: keys naming no adapter */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s/init/adapter_model.safetensors' '%s/'", LORA, bd);
    ASSERT_EQ_INT(system(cmd), 0);
    cli_runv(&r, 60, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "adapter_model.safetensors: key 'base_model.model.model.layers.0.");
    ASSERT_STR_CONTAINS(r.err, "the model has no adapter");
    cfg = "{\"peft_type\": \"PREFIX_TUNING\"}";
    ASSERT_OK(dt_file_write_atomic(f, cfg, strlen(cfg), 0644));
    cli_runv(&r, 60, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "\"peft_type\" is \"PREFIX_TUNING\"");
    cfg = "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"v_proj\", "
          "\"o_proj\", \"down_proj\"]}";
    ASSERT_OK(dt_file_write_atomic(f, cfg, strlen(cfg), 0644));
    cli_runv(&r, 60, NULL, bad); /* r 8 against r 4 weights: refused before a model is built at rank 8 */
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "adapter_model.safetensors: tensor 'base_model.model.model.layers.0.");
    ASSERT_STR_CONTAINS(r.err, "lora_A.weight' is not of rank 8 (\"r\" in adapter_config.json): shape [4, ");
    ASSERT(!strstr(r.out, "LoRA: r 8"));
    char *both[] = {"train", "--model", "hf:" HF, "--lora-from", LORA "init", "--lora-targets", "q_proj", "--data", tok,
                    "--no-eval", NULL};
    cli_runv(&r, 60, NULL, both);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-from DIR takes the LoRA settings");
}

/* ZeRO-3 on 2 ranks: --save-lora writes the adapters (as the checkpoint
 * holds them) with and without --save; no temporary checkpoint stays. */
TEST(save_lora_zero3)
{
    const char *ck = cli_path("z3ck"), *ad = cli_path("z3ad"), *ad2 = cli_path("z3ad2");
    char *base[] = {GPT, LORA_FLAGS, "--no-eval", "--max-steps", "3", "--zero", "3", NULL};
    char *with[] = {"--save", (char *)ck, "--save-lora", (char *)ad, NULL};
    char *alone[] = {"--save-lora", (char *)ad2, NULL};
    cli_result r;
    cli_run_ranks(&r, 300, NULL, 2, 2, (char *const *const[]){base, with});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "LoRA adapters written to");
    cli_run_ranks(&r, 300, NULL, 2, 2, (char *const *const[]){base, alone});
    ASSERT_EQ_INT(r.code, 0);
    char f[600], f2[600], step[600], tmp[600];
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", ad);
    snprintf(f2, sizeof f2, "%s/adapter_model.safetensors", ad2);
    snprintf(step, sizeof step, "%s/step-00000003", ck);
    snprintf(tmp, sizeof tmp, "%s.ckpt-tmp", ad2);
    struct stat sb;
    ASSERT(stat(tmp, &sb) != 0);
    ASSERT(same_file(f, f2)); /* the same run, the same adapters */
    dt_ckpt *a = NULL, *c = NULL;
    ASSERT_OK(dt_ckpt_open(f, &a));
    ASSERT_OK(dt_ckpt_open(step, &c));
    ASSERT_EQ_INT((int)dt_ckpt_num_tensors(a), 12); /* c_attn, attn.c_proj, mlp.c_proj x 2 layers x A, B */
    int checked = 0;
    for (size_t i = 0; a && c && i < dt_ckpt_num_tensors(a); i++) {
        dt_ckpt_tensor t;
        ASSERT_OK(dt_ckpt_tensor_at(a, i, &t));
        int64_t j = dt_ckpt_find(c, t.name + strlen("base_model.model."));
        ASSERT(j >= 0);
        if (j < 0)
            continue;
        float *x = malloc(t.numel * 4), *y = malloc(t.numel * 4);
        ASSERT_OK(dt_ckpt_read(a, i, 0, t.numel, x, true));
        ASSERT_OK(dt_ckpt_read(c, (size_t)j, 0, t.numel, y, true));
        ASSERT(!memcmp(x, y, t.numel * 4));
        bool nonzero = false;
        for (uint64_t k = 0; k < t.numel; k++)
            nonzero |= x[k] != 0;
        checked += nonzero;
        free(x);
        free(y);
    }
    ASSERT_EQ_INT(checked, 12); /* B trained away from its zeros too */
    dt_ckpt_close(a);
    dt_ckpt_close(c);
}

/* The memory report: frozen parameters are held, with no gradients or
 * optimizer states (AdamW: states = 2 x gradients = 2 x the trained
 * parameters), in one process and per rank under ZeRO-1. */
TEST(memory_report)
{
    char *base[] = {GPT, LORA_FLAGS, "--no-eval", "--max-steps", "1", NULL};
    char *z1[] = {"--zero", "1", NULL};
    cli_result r;
    cli_run_ranks(&r, 300, NULL, 1, 1, (char *const *const[]){base});
    ASSERT_EQ_INT(r.code, 0);
    /* 5632 trained elements (22.0 KiB), 149056 frozen (582.2 KiB) */
    ASSERT_STR_CONTAINS(r.out, "5632 elements train");
    ASSERT_STR_CONTAINS(r.out, "memory rank 0: parameters 22.0 KiB + frozen 582.2 KiB (no gradients, optimizer "
                               "states or masters), gradients 22.0 KiB, optimizer states 44.0 KiB");
    cli_run_ranks(&r, 300, NULL, 2, 2, (char *const *const[]){base, z1});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "memory rank 1: parameters 22.0 KiB + frozen 582.2 KiB (no gradients, optimizer "
                               "states or masters), gradients 22.0 KiB, optimizer states 22.0 KiB");
}

/* hf:DIR with --resume auto and no checkpoint yet starts from the
 * directory's weights (it started from a random init). */
TEST(hf_resume_auto_fresh)
{
    char tok[500];
    snprintf(tok, sizeof tok, "tokens:%s", DT_SOURCE_DIR "/tests/data/hf/tokens.bin");
    const char *m1 = cli_path("fresh1.jsonl"), *m2 = cli_path("fresh2.jsonl"), *sv = cli_path("fresh_ck");
    char *base[] = {"train", "--model", "hf:" HF, "--data", tok, "--seq", "16", "--batch", "2", "--max-steps", "2",
                    "--no-eval", "--threads", "1", "--optimizer", "adamw", "--log-every", "1", NULL};
    char *a[] = {"--metrics", (char *)m1, NULL};
    char *b[] = {"--metrics", (char *)m2, "--save", (char *)sv, "--resume", "auto", NULL};
    cli_result r;
    cli_run_ranks(&r, 120, NULL, 1, 2, (char *const *const[]){base, a});
    ASSERT_EQ_INT(r.code, 0);
    cli_run_ranks(&r, 120, NULL, 1, 2, (char *const *const[]){base, b});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "starting fresh");
    double l1[4], l2[4];
    int n1 = cli_step_losses(m1, l1, 4), n2 = cli_step_losses(m2, l2, 4);
    ASSERT(cli_same_losses(l1, n1, l2, n2, 0));
}

/* --save-lora DIR where DIR is a symlink (or a file) is refused before
 * training, exit 2: nothing is written through it. */
TEST(save_lora_symlink_refused)
{
    const char *target = cli_path("lora_target"), *link = cli_path("lora_link"), *file = cli_path("lora_file");
    ASSERT(mkdir(target, 0755) == 0);
    ASSERT(symlink(target, link) == 0);
    ASSERT_OK(dt_file_write_atomic(file, "x", 1, 0644));
    char slash[400]; /* named link/ (lstat of link/ follows the link: it was taken, refused after training) */
    snprintf(slash, sizeof slash, "%s/", link);
    const char *outs[] = {link, file, slash};
    for (int i = 0; i < 3; i++) {
        char *run[] = {GPT, LORA_FLAGS, "--no-eval", "--max-steps", "1", "--save-lora", (char *)outs[i], NULL};
        cli_result r;
        cli_runv(&r, 120, NULL, run);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "--save-lora");
        ASSERT_STR_CONTAINS(r.err, i == 1 ? "not a directory" : "symlink");
    }
    char f[600];
    snprintf(f, sizeof f, "%s/adapter_config.json", target);
    ASSERT(!file_exists(f));
}

/* A FIFO (or anything but a regular file) where one of the adapter files will go: refused before training, exit
 * 2, the FIFO left (it was refused only after training, and before d8fa154 the rename replaced it) */
TEST(save_lora_fifo_refused)
{
    const char *dir = cli_path("lora_fifo_dir");
    ASSERT(mkdir(dir, 0755) == 0);
    char f[600];
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", dir);
    ASSERT_EQ_INT(mkfifo(f, 0600), 0);
    char *run[] = {GPT, LORA_FLAGS, "--no-eval", "--max-steps", "1", "--progress", "plain", "--save-lora",
                   (char *)dir, NULL};
    cli_result r;
    cli_runv(&r, 120, NULL, run);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--save-lora");
    ASSERT_STR_CONTAINS(r.err, "a FIFO");
    ASSERT(!strstr(r.out, "step 1/"));
    struct stat st;
    ASSERT_EQ_INT(lstat(f, &st), 0);
    ASSERT(S_ISFIFO(st.st_mode));
}

/* Two jobs given one --save-lora DIR wrote their adapter_config.json and weights in turn (one job's config could
 * end up beside the other's weights). The run holds DIR from its start: another job is refused (exit 2) before
 * training; a run that fails before it saves leaves no DIR (nor parent) it made. (A lock this test takes stands
 * for the other job's.) */
TEST(save_lora_dir_of_another_job_refused)
{
    const char *dir = cli_path("lora_held");
    ASSERT(mkdir(dir, 0755) == 0);
    int held = -1;
    ASSERT_OK(dt_dir_lock(dir, &held));
    char *run[] = {GPT, LORA_FLAGS, "--no-eval", "--max-steps", "1", "--progress", "plain", "--save-lora",
                   (char *)dir, NULL};
    cli_result r;
    cli_runv(&r, 120, NULL, run);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--save-lora");
    ASSERT_STR_CONTAINS(r.err, "another job");
    ASSERT(!strstr(r.out, "first step done"));
    close(held);
    cli_runv(&r, 120, NULL, run);
    ASSERT_EQ_INT(r.code, 0);
    char f[600];
    snprintf(f, sizeof f, "%s/adapter_config.json", dir);
    ASSERT(file_exists(f));
    const char *fresh = cli_path("lora_fresh/sub");
    char *bad[] = {GPT, LORA_FLAGS, "--no-eval", "--max-steps", "1", "--init-from", cli_path("no_such_ckpt"),
                   "--save-lora", (char *)fresh, NULL};
    cli_runv(&r, 120, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT(!file_exists(fresh));
    ASSERT(!file_exists(cli_path("lora_fresh"))); /* nor the parent it made */
}

/* DoRA (--lora-dora): the checkpoint keeps it (eval --ckpt gives the run's evaluation, the merged export the same
 * loss, --resume continues it and refuses the flags without it); ZeRO-3 over 2 ranks steps as DDP does (its
 * magnitudes, started from the base's row norms on each rank's shard, the same); PEFT's DoRA adapters load with
 * --lora-from and save back with their magnitudes; refused (exit 2): without --lora-targets, under --tp, and
 * --init-from a LoRA checkpoint trained without DoRA. */
TEST(dora_cli)
{
    const char *ck = cli_path("dck"), *merged = cli_path("dmerged"), *metrics = cli_path("dm.jsonl");
    char *run[] = {GPT, LORA_FLAGS, "--lora-dora", "--val-data", val_, "--max-steps", "6", "--eval-every", "6",
                   "--metrics", (char *)metrics, "--save", (char *)ck, "--save-hf", (char *)merged, NULL};
    cli_result r;
    cli_runv(&r, 300, NULL, run);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "LoRA: r 4, alpha 16, dropout 0, scaling 4, DoRA");
    evals_agree("DoRA", ck, merged, last_eval_loss(metrics), NULL);
    char *res[] = {GPT, "--no-eval", "--max-steps", "8", "--save", (char *)ck, "--resume", "auto", NULL};
    cli_runv(&r, 300, NULL, res);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "scaling 4, DoRA");
    ASSERT_STR_CONTAINS(r.out, "resumed from");
    char *bad[] = {GPT, "--no-eval", "--max-steps", "10", "--save", (char *)ck, "--resume", "auto", LORA_FLAGS, NULL};
    cli_runv(&r, 120, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "was trained with --lora-targets c_attn,c_proj --lora-r 4 --lora-alpha 16 "
                               "--lora-dropout 0 --lora-dora");

    /* ZeRO-3 against DDP, 2 ranks each */
    const char *mz = cli_path("dz.jsonl"), *md = cli_path("dd.jsonl");
    char *base[] = {GPT, LORA_FLAGS, "--lora-dora", "--no-eval", "--max-steps", "4", "--log-every", "1", NULL};
    char *z3[] = {"--zero", "3", "--metrics", (char *)mz, NULL};
    char *ddp[] = {"--metrics", (char *)md, NULL};
    cli_run_ranks(&r, 300, NULL, 2, 2, (char *const *const[]){base, z3});
    ASSERT_EQ_INT(r.code, 0);
    cli_run_ranks(&r, 300, NULL, 2, 2, (char *const *const[]){base, ddp});
    ASSERT_EQ_INT(r.code, 0);
    double lz[8], ld[8];
    int nz = cli_step_losses(mz, lz, 8), nd = cli_step_losses(md, ld, 8);
    ASSERT(cli_same_losses(lz, nz, ld, nd, 1e-5));
    /* the magnitudes start at the base's row norms: the first step's loss is the base model's, as plain LoRA's */
    const char *mp = cli_path("dp.jsonl");
    char *plain_lora[] = {GPT, LORA_FLAGS, "--no-eval", "--max-steps", "4", "--log-every", "1", "--metrics",
                          (char *)mp, NULL};
    cli_run_ranks(&r, 300, NULL, 2, 1, (char *const *const[]){plain_lora});
    ASSERT_EQ_INT(r.code, 0);
    double lp[8];
    ASSERT_EQ_INT(cli_step_losses(mp, lp, 8), nd);
    fprintf(stderr, "  first step: DoRA %.8f, LoRA %.8f; fourth: %.8f, %.8f\n", ld[0], lp[0], ld[3], lp[3]);
    ASSERT(fabs(ld[0] - lp[0]) <= 1e-6 * fabs(lp[0]) && ld[3] != lp[3]);

    /* PEFT's DoRA adapters on hf:DIR, saved back with their magnitudes */
    char tok[500];
    snprintf(tok, sizeof tok, "tokens:%s", DT_SOURCE_DIR "/tests/data/hf/tokens.bin");
    from_peft(LORA "dora_init", cli_path("dora_llama"), "scaling 2, DoRA", 24,
              "base_model.model.model.layers.1.mlp.down_proj.lora_magnitude_vector");

    /* generate --lora-from: the KV cache's tokens are the full recompute's, and not the base model's */
    char outs[3][256];
    for (int k = 0; k < 3; k++) {
        char *gen[] = {"generate", "--model", "hf:" HF, "--prompt-ids", "1,2,3,4", "--max-new-tokens", "12",
                       "--temperature", "0", "--kv-cache", k == 1 ? "off" : "on", k < 2 ? "--lora-from" : NULL,
                       LORA "dora_after", NULL};
        cli_runv(&r, 120, NULL, gen);
        ASSERT_EQ_INT(r.code, 0);
        snprintf(outs[k], sizeof outs[k], "%.255s", r.out);
    }
    ASSERT_STR_EQ(outs[0], outs[1]);
    ASSERT(strcmp(outs[0], outs[2]) != 0);

    /* refused */
    char *alone[] = {GPT, "--lora-dora", "--no-eval", "--max-steps", "1", NULL};
    cli_runv(&r, 60, NULL, alone);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-dora, --lora-modules-to-save, --lora-layers-to-transform, "
                               "--lora-layers-pattern, --lora-bias, --lora-rank-pattern, --lora-alpha-pattern and "
                               "--lora-exclude-modules go with --lora-targets");
    char *tp[] = {GPT, LORA_FLAGS, "--lora-dora", "--no-eval", "--max-steps", "1", "--tp", "2", NULL};
    cli_run_ranks(&r, 120, NULL, 2, 1, (char *const *const[]){tp});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "DoRA on a tensor-parallel layer is not supported");
    const char *plain = cli_path("plain_lora_ck");
    char *p1[] = {GPT, LORA_FLAGS, "--no-eval", "--max-steps", "1", "--save", (char *)plain, NULL};
    cli_runv(&r, 120, NULL, p1);
    ASSERT_EQ_INT(r.code, 0);
    char *p2[] = {GPT, LORA_FLAGS, "--lora-dora", "--no-eval", "--max-steps", "1", "--init-from", (char *)plain, NULL};
    cli_runv(&r, 120, NULL, p2);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "trained without DoRA (--lora-dora)");
}

/* LoRA, DoRA and --freeze under --precision bf16 (before, dt_trainer_init refused every one: the frozen weights, kept
 * like buffers, take the parameters' bf16, and the buffer policy counted them as buffers): each trains, its val loss
 * near the f32 run's. */
TEST(frozen_bf16)
{
    const char *modes[][5] = {{"--lora-targets", "c_attn,c_proj", NULL},
                              {"--lora-targets", "c_attn,c_proj", "--lora-dora", NULL},
                              {"--freeze", "transformer.h.0.*", "--lr", "0.005", NULL}}; /* the last --lr counts */
    for (int k = 0; k < 3; k++) {
        double v[2];
        for (int b = 0; b < 2; b++) {
            const char *m = cli_path(b ? "fb.jsonl" : "ff.jsonl");
            char *run[] = {GPT, "--val-data", val_, "--max-steps", "8", "--eval-every", "8", "--metrics", (char *)m,
                           "--precision", b ? "bf16" : "fp32", (char *)modes[k][0], (char *)modes[k][1],
                           (char *)modes[k][2], (char *)modes[k][3], NULL};
            cli_result r;
            cli_runv(&r, 300, NULL, run);
            if (r.code)
                fprintf(stderr, "%s\n%s\n", r.out, r.err);
            ASSERT_EQ_INT(r.code, 0);
            v[b] = last_eval_loss(m);
        }
        fprintf(stderr, "  %s%s: val loss f32 %.5f, bf16 %.5f\n", modes[k][0], k == 1 ? " --lora-dora" : "", v[0],
                v[1]);
        ASSERT(isfinite(v[1]) && fabs(v[1] - v[0]) <= 0.02);
    }
}

/* A file of PEFT's tensors at f: names[i] of shape [rows[i], cols[i]], all values v[i]. */
static void write_st(const char *f, int n, const char *const *names, const int64_t *rows, const int64_t *cols,
                     const float *v)
{
    dt_st_desc d[8];
    for (int i = 0; i < n; i++)
        d[i] = (dt_st_desc){.name = names[i], .dtype = DT_ST_F32, .ndim = 2, .shape = {rows[i], cols[i]}};
    dt_st_writer *w = NULL;
    ASSERT_OK(dt_st_writer_open(f, d, (size_t)n, NULL, 0, &w));
    for (int i = 0; w && i < n; i++) {
        float *x = malloc((size_t)(rows[i] * cols[i]) * sizeof *x);
        for (int64_t k = 0; x && k < rows[i] * cols[i]; k++)
            x[k] = v[i];
        ASSERT_OK(dt_st_writer_write(w, (size_t)i, x, (size_t)(rows[i] * cols[i]) * sizeof *x));
        free(x);
    }
    ASSERT_OK(dt_st_writer_commit(w, NULL));
    dt_st_writer_close(w);
}

/* --lora-modules-to-save (PEFT's modules_to_save): the modules train whole beside the adapters; GPT-2's head,
 * tied to its embedding, trains as one weight and --save-lora writes it under both names with ensure_weight_tying;
 * the checkpoint keeps the setting (eval --ckpt: the run's evaluation; the merged export: the same loss; --resume
 * with other flags refused naming it); --lora-from reads it (PEFT's Llama golden); refused (exit 2): a name that
 * ends no module's, a module both target and saved, --tp, and a PEFT file whose tied weights differ. */
TEST(modules_to_save_cli)
{
    const char *ck = cli_path("mck"), *merged = cli_path("mmerged"), *metrics = cli_path("mm.jsonl");
    const char *ad = cli_path("mad");
    char *run[] = {GPT, "--lora-targets", "c_attn", "--lora-modules-to-save", "lm_head", "--val-data", val_,
                   "--max-steps", "6", "--eval-every", "6", "--metrics", (char *)metrics, "--save", (char *)ck,
                   "--save-hf", (char *)merged, "--save-lora", (char *)ad, NULL};
    cli_result r;
    cli_runv(&r, 300, NULL, run);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    const double trained = last_eval_loss(metrics);
    char f[600];
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", ad);
    dt_ckpt *c = NULL;
    ASSERT_OK(dt_ckpt_open(f, &c));
    const int64_t h = dt_ckpt_find(c, "base_model.model.lm_head.weight");
    const int64_t e = dt_ckpt_find(c, "base_model.model.transformer.wte.weight");
    ASSERT(h >= 0 && e >= 0);
    if (h >= 0 && e >= 0) {
        float *a = malloc(512 * 64 * 4), *b = malloc(512 * 64 * 4);
        ASSERT_OK(dt_ckpt_read(c, (size_t)h, 0, 512 * 64, a, true));
        ASSERT_OK(dt_ckpt_read(c, (size_t)e, 0, 512 * 64, b, true));
        ASSERT(!memcmp(a, b, 512 * 64 * 4)); /* one weight */
        free(a);
        free(b);
    }
    dt_ckpt_close(c);
    snprintf(f, sizeof f, "%s/adapter_config.json", ad);
    char *cfg = t_slurp(f, NULL);
    cJSON *cj = cfg ? cJSON_Parse(cfg) : NULL;
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(cj, "modules_to_save");
    ASSERT(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cj, "ensure_weight_tying")));
    ASSERT(cJSON_GetArraySize(ms) == 1 && !strcmp(cJSON_GetArrayItem(ms, 0)->valuestring, "lm_head"));
    cJSON_Delete(cj);
    free(cfg);
    evals_agree("modules to save", ck, merged, trained, NULL);
    char *bad[] = {GPT, "--no-eval", "--max-steps", "10", "--save", (char *)ck, "--resume", "auto", "--lora-targets",
                   "c_attn", NULL};
    cli_runv(&r, 120, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "was trained with --lora-targets c_attn --lora-r 8 --lora-alpha 8 --lora-dropout 0 "
                               "--lora-modules-to-save lm_head");

    char tok[500];
    snprintf(tok, sizeof tok, "tokens:%s", DT_SOURCE_DIR "/tests/data/hf/tokens.bin");
    from_peft(LORA "save_init", cli_path("save_llama"), "LoRA: r 4", 9, "base_model.model.lm_head.weight");

    struct {
        const char *flag, *want;
    } no[] = {{"no_such_module", "no module's name ends in 'no_such_module'"},
              {"c_attn", "no layer matches the targets"}}; /* a module to save gets no adapters (PEFT's) */
    for (int k = 0; k < 2; k++) {
        char *b2[] = {GPT, "--lora-targets", "c_attn", "--lora-modules-to-save", (char *)no[k].flag, "--no-eval",
                      "--max-steps", "1", NULL};
        cli_runv(&r, 60, NULL, b2);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, no[k].want);
    }
    char *tp[] = {GPT, "--lora-targets", "c_attn", "--lora-modules-to-save", "ln_f", "--no-eval", "--max-steps", "1",
                  "--tp", "2", NULL};
    cli_run_ranks(&r, 120, NULL, 2, 1, (char *const *const[]){tp});
    ASSERT_EQ_INT(r.code, 0); /* ln_f: replicated, whole on every rank */
    char *tp2[] = {GPT, "--lora-targets", "c_attn", "--lora-modules-to-save", "lm_head", "--no-eval", "--max-steps",
                   "1", "--tp", "2", NULL};
    cli_run_ranks(&r, 120, NULL, 2, 1, (char *const *const[]){tp2});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "tensor-parallel slice");

    /* Qwen3 (tied head): PEFT trained lm_head apart from the embedding */
    const char *bd = cli_path("apart");
    mkdir(bd, 0755);
    snprintf(f, sizeof f, "%s/adapter_config.json", bd);
    const char *js = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
                     "\"modules_to_save\": [\"lm_head\"]}";
    ASSERT_OK(dt_file_write_atomic(f, js, strlen(js), 0644));
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", bd);
    const char *names[] = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                           "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
                           "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight",
                           "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight",
                           "base_model.model.lm_head.weight", "base_model.model.model.embed_tokens.weight"};
    const int64_t rows[] = {4, 64, 4, 64, 128, 128}, cols[] = {32, 4, 32, 4, 32, 32};
    const float vals[] = {0.01f, 0, 0.01f, 0, 0.5f, 0.25f};
    write_st(f, 6, names, rows, cols, vals);
    char *apart[] = {"train", "--model", "hf:" DT_SOURCE_DIR "/tests/data/hf/qwen3", "--lora-from", (char *)bd,
                     "--data", tok, "--seq", "16", "--batch", "2", "--max-steps", "1", "--no-eval", "--threads", "1",
                     NULL};
    cli_runv(&r, 120, NULL, apart);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "differ, but this model ties them");
}

/* --lora-layers-to-transform (PEFT's layers_to_transform): only those layers' targets; --save-lora writes it,
 * --lora-from reads it back, the checkpoint keeps it (--resume with other flags refused naming it); a bad list and
 * --lora-layers-pattern alone exit 2 */
TEST(layers_to_transform_cli)
{
    char tok[500];
    snprintf(tok, sizeof tok, "tokens:%s", DT_SOURCE_DIR "/tests/data/hf/tokens.bin");
    const char *ad = cli_path("lt_ad"), *ad2 = cli_path("lt_ad2"), *ck = cli_path("lt_ck");
    char *run[] = {"train", "--model", "hf:" HF, "--lora-targets", "q_proj,down_proj", "--lora-layers-to-transform",
                   "1", "--data", tok, "--seq", "16", "--batch", "2", "--max-steps", "2", "--no-eval", "--threads", "1",
                   "--save-lora", (char *)ad, "--save", (char *)ck, NULL};
    cli_result r;
    cli_runv(&r, 300, NULL, run);
    ASSERT_EQ_INT(r.code, 0);
    char *from[] = {"train", "--model", "hf:" HF, "--lora-from", (char *)ad, "--data", tok, "--seq", "16", "--batch",
                    "2", "--max-steps", "1", "--no-eval", "--threads", "1", "--save-lora", (char *)ad2, NULL};
    cli_runv(&r, 300, NULL, from);
    ASSERT_EQ_INT(r.code, 0);
    for (int k = 0; k < 2; k++) {
        char f[600];
        snprintf(f, sizeof f, "%s/adapter_model.safetensors", k ? ad2 : ad);
        dt_ckpt *c = NULL;
        ASSERT_OK(dt_ckpt_open(f, &c));
        ASSERT_EQ_INT((int)dt_ckpt_num_tensors(c), 4);
        ASSERT(dt_ckpt_find(c, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight") >= 0);
        ASSERT(dt_ckpt_find(c, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight") < 0);
        dt_ckpt_close(c);
    }
    char *bad[] = {"train", "--model", "hf:" HF, "--lora-targets", "q_proj,down_proj", "--data", tok, "--seq", "16",
                   "--batch", "2", "--max-steps", "3", "--no-eval", "--save", (char *)ck, "--resume", "auto", NULL};
    cli_runv(&r, 120, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-layers-to-transform 1");
    char *list[] = {GPT, "--lora-targets", "c_attn", "--lora-layers-to-transform", "0,-1", "--no-eval", NULL};
    cli_runv(&r, 60, NULL, list);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "not a comma-separated list of layer indices");
    char *pat[] = {GPT, "--lora-targets", "c_attn", "--lora-layers-pattern", "h", "--no-eval", NULL};
    cli_runv(&r, 60, NULL, pat);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-layers-pattern goes with --lora-layers-to-transform");
}

/* --lora-bias (PEFT's bias): lora_only trains the adapted layers' biases, saved as PEFT names them; the checkpoint
 * keeps the setting (--resume with other flags refused naming it) */
TEST(bias_cli)
{
    const char *ck = cli_path("b_ck"), *ad = cli_path("b_ad");
    char *run[] = {GPT, "--lora-targets", "c_attn", "--lora-bias", "lora_only", "--no-eval", "--max-steps", "2",
                   "--save", (char *)ck, "--save-lora", (char *)ad, NULL};
    cli_result r;
    cli_runv(&r, 120, NULL, run);
    ASSERT_EQ_INT(r.code, 0);
    char f[600];
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", ad);
    dt_ckpt *c = NULL;
    ASSERT_OK(dt_ckpt_open(f, &c));
    ASSERT_EQ_INT((int)dt_ckpt_num_tensors(c), 6); /* 2 layers x (A, B, the layer's bias) */
    ASSERT(dt_ckpt_find(c, "base_model.model.transformer.h.1.attn.c_attn.base_layer.bias") >= 0);
    dt_ckpt_close(c);
    char *bad[] = {GPT, "--lora-targets", "c_attn", "--no-eval", "--max-steps", "3", "--save", (char *)ck, "--resume",
                   "auto", NULL};
    cli_runv(&r, 120, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-dropout 0 --lora-bias lora_only");
}

/* `dtrain eval` of hf:<the golden Llama> with args (NULL-terminated) on tokens.bin: its loss, NAN on failure */
static double llama_eval(char **args)
{
    char tok[500];
    snprintf(tok, sizeof tok, "tokens:%s", DT_SOURCE_DIR "/tests/data/hf/tokens.bin");
    char *argv[32] = {"eval", "--data", tok, "--seq", "16", "--batch", "2", "--json", "--threads", "1"};
    int n = 10;
    for (int k = 0; args[k] && n < 31; k++)
        argv[n++] = args[k];
    argv[n] = NULL;
    cli_result r;
    cli_runv(&r, 120, NULL, argv);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    return r.code ? NAN : json_loss(r.out);
}

/* --lora-rank-pattern, --lora-alpha-pattern, --lora-exclude-modules (PEFT's rank_pattern, alpha_pattern,
 * exclude_modules) on the golden Llama: each layer its rank (the trained elements count them), the excluded layer
 * none; --save-lora writes them; eval --ckpt (the checkpoint keeps them), the --save-hf merge (each layer its own
 * scaling), ckpt convert --hf of the checkpoint and eval/generate --lora-from of the saved directory all give the
 * run's final evaluation; an unmatched key is warned of; --resume with other flags refused naming them; bad JSON, a
 * value out of range, a bad regular expression and a file whose tensor is not its pattern's rank exit 2 */
TEST(patterns_cli)
{
    char tok[500];
    snprintf(tok, sizeof tok, "tokens:%s", DT_SOURCE_DIR "/tests/data/hf/tokens.bin");
    const char *ck = cli_path("p_ck"), *ad = cli_path("p_ad"), *merged = cli_path("p_merged");
    const char *conv = cli_path("p_conv"), *metrics = cli_path("p_m.jsonl");
#define PAT_RUN "train", "--model", "hf:" HF, "--data", tok, "--seq", "16", "--batch", "2", "--threads", "1", \
                "--optimizer", "adamw", "--lr", "0.01", "--lora-targets", "q_proj,v_proj,o_proj", "--lora-r", "3", \
                "--lora-alpha", "6"
    char *run[] = {PAT_RUN, "--lora-rank-pattern", "{\"q_proj\": 4, \"model.layers.1.self_attn.v_proj\": 2, "
                   "\"nomatch\": 5}", "--lora-alpha-pattern", "{\"o_proj\": 32}", "--lora-exclude-modules",
                   "layers.0.self_attn.o_proj", "--val-data", tok, "--max-steps", "4", "--eval-every", "4",
                   "--metrics", (char *)metrics, "--save", (char *)ck, "--save-hf", (char *)merged, "--save-lora",
                   (char *)ad, NULL};
    cli_result r;
    cli_runv(&r, 300, NULL, run);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    /* q_proj 2 x 4 x (32 + 48), v_proj 3 x (32 + 24) and 2 x (32 + 24), layer 1's o_proj 3 x (48 + 32) */
    ASSERT_STR_CONTAINS(r.out, "1160 elements train");
    ASSERT_STR_CONTAINS(r.out, "per layer by rank_pattern, alpha_pattern");
    ASSERT_STR_CONTAINS(r.err, "rank_pattern key \"nomatch\" matches no adapted layer");
    const double trained = last_eval_loss(metrics);
    ASSERT(isfinite(trained));
    char f[600];
    snprintf(f, sizeof f, "%s/adapter_config.json", ad);
    char *cfg = t_slurp(f, NULL);
    cJSON *cj = cfg ? cJSON_Parse(cfg) : NULL;
    char *rp = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cj, "rank_pattern"));
    char *ap = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cj, "alpha_pattern"));
    char *ex = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cj, "exclude_modules"));
    ASSERT(rp && ap && ex);
    if (rp && ap && ex) {
        ASSERT_STR_EQ(rp, "{\"q_proj\":4,\"model.layers.1.self_attn.v_proj\":2,\"nomatch\":5}");
        ASSERT_STR_EQ(ap, "{\"o_proj\":32}");
        ASSERT_STR_EQ(ex, "[\"layers.0.self_attn.o_proj\"]");
    }
    cJSON_free(rp), cJSON_free(ap), cJSON_free(ex);
    cJSON_Delete(cj);
    free(cfg);
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", ad);
    dt_ckpt *c = NULL;
    ASSERT_OK(dt_ckpt_open(f, &c));
    ASSERT_EQ_INT((int)dt_ckpt_num_tensors(c), 10);
    ASSERT(dt_ckpt_find(c, "base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight") < 0);
    dt_ckpt_close(c);

    /* the checkpoint, the merge, its conversion and the saved adapters: the run's model */
    double l1 = NAN;
    char *ev[] = {"eval", "--ckpt", (char *)ck, "--threads", "1", "--json", NULL};
    cli_runv(&r, 120, NULL, ev);
    ASSERT_EQ_INT(r.code, 0);
    l1 = json_loss(r.out);
    char hf[400], hf2[400];
    snprintf(hf, sizeof hf, "hf:%s", merged);
    snprintf(hf2, sizeof hf2, "hf:%s", conv);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", "--hf", (char *)conv, (char *)ck, NULL});
    ASSERT_EQ_INT(r.code, 0);
    const double lm = llama_eval((char *[]){"--model", hf, NULL}), lc = llama_eval((char *[]){"--model", hf2, NULL});
    const double lf = llama_eval((char *[]){"--model", "hf:" HF, "--lora-from", (char *)ad, NULL});
    const double base = llama_eval((char *[]){"--model", "hf:" HF, NULL});
    fprintf(stderr, "  patterns: run's final eval %.8f, eval --ckpt %.8f, --save-hf %.8f, ckpt convert --hf %.8f, "
            "--lora-from %.8f (base %.8f)\n", trained, l1, lm, lc, lf, base);
    ASSERT(fabs(l1 - trained) <= 1e-6);
    ASSERT(fabs(lm - l1) <= 1e-5 * l1 && fabs(lc - l1) <= 1e-5 * l1 && fabs(lf - l1) <= 1e-6 * l1);
    ASSERT(fabs(base - l1) > 1e-3); /* the adapters count */
    char f2[600];
    snprintf(f, sizeof f, "%s/model.safetensors", merged);
    snprintf(f2, sizeof f2, "%s/model.safetensors", conv);
    ASSERT(same_file(f, f2));
    char *g1[] = {"generate", "--ckpt", (char *)ck, "--prompt-ids", "1,2,3,4", "--max-new-tokens", "12",
                  "--temperature", "0", NULL};
    char *g2[] = {"generate", "--model", "hf:" HF, "--lora-from", (char *)ad, "--prompt-ids", "1,2,3,4",
                  "--max-new-tokens", "12", "--temperature", "0", NULL};
    char out1[sizeof r.out];
    cli_runv(&r, 120, NULL, g1);
    ASSERT_EQ_INT(r.code, 0);
    snprintf(out1, sizeof out1, "%s", r.out);
    cli_runv(&r, 120, NULL, g2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_EQ(out1, r.out);

    /* --resume: without flags the checkpoint's patterns; with others refused naming them */
    char *res[] = {"train", "--model", "hf:" HF, "--data", tok, "--seq", "16", "--batch", "2", "--threads", "1",
                   "--optimizer", "adamw", "--lr", "0.01", "--max-steps", "5", "--no-eval", "--save", (char *)ck,
                   "--resume", "auto", NULL};
    cli_runv(&r, 120, NULL, res);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "1160 elements train");
    char *other[] = {PAT_RUN, "--max-steps", "6", "--no-eval", "--save", (char *)ck, "--resume", "auto", NULL};
    cli_runv(&r, 120, NULL, other);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "was trained with --lora-targets q_proj,v_proj,o_proj --lora-r 3 --lora-alpha 6 "
                               "--lora-dropout 0 --lora-rank-pattern '{\"q_proj\":4,");
    ASSERT_STR_CONTAINS(r.err, "exclude_modules '[\"layers.0.self_attn.o_proj\"]'");

    /* refusals: exit 2 naming the option and the problem */
    static const struct {
        const char *opt, *val, *want;
    } bad[] = {
        {"--lora-rank-pattern", "{\"q_proj\": }", "--lora-rank-pattern: rank_pattern: not valid JSON"},
        {"--lora-rank-pattern", "{\"q_proj\": 0}", "rank_pattern key \"q_proj\": its value must be a rank"},
        {"--lora-rank-pattern", "{\"q_proj\": 2.5}", "its value must be a rank"},
        {"--lora-rank-pattern", "[4]", "--lora-rank-pattern: rank_pattern: not a JSON object"},
        {"--lora-alpha-pattern", "{\"(q_proj\": 2}", "--lora-alpha-pattern: alpha_pattern key \"(q_proj\""},
        {"--lora-alpha-pattern", "{\"q_proj\": -1}", "its value must be an alpha, a number > 0"},
        {"--lora-exclude-modules", "q_proj,", "--lora-exclude-modules q_proj,: not a comma-separated list"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *b[] = {PAT_RUN, (char *)bad[k].opt, (char *)bad[k].val, "--no-eval", "--max-steps", "1", NULL};
        cli_runv(&r, 60, NULL, b);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, bad[k].want);
    }
    char *alone[] = {"train", "--model", "hf:" HF, "--data", tok, "--lora-rank-pattern", "{\"q_proj\": 2}",
                     "--no-eval", NULL};
    cli_runv(&r, 60, NULL, alone);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-rank-pattern, --lora-alpha-pattern and --lora-exclude-modules go with");
    /* every target excluded: refused */
    char *all[] = {PAT_RUN, "--lora-exclude-modules", "q_proj,v_proj,o_proj", "--no-eval", "--max-steps", "1", NULL};
    cli_runv(&r, 60, NULL, all);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "exclude_modules leaves out");
    /* the saved adapters with rank_pattern's q_proj 4 turned to 3: q_proj's tensors are not of rank 3 */
    const char *bd = cli_path("p_bad");
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && sed -i 's/\"q_proj\":\t4/\"q_proj\":\t3/' '%s/adapter_config.json'",
             ad, bd, bd);
    ASSERT_EQ_INT(system(cmd), 0);
    char *mism[] = {"train", "--model", "hf:" HF, "--lora-from", (char *)bd, "--data", tok, "--seq", "16", "--batch",
                    "2", "--max-steps", "1", "--no-eval", "--threads", "1", NULL};
    cli_runv(&r, 60, NULL, mism);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "q_proj.lora_A.weight' is not of rank 3 (\"rank_pattern\" in adapter_config.json)");
    ASSERT_STR_CONTAINS(r.err, "rank 4");
#undef PAT_RUN
}

int main(void)
{
    make_tokens();
    RUN(ckpt_keeps_lora);
    RUN(lora_from);
    RUN(dora_cli);
    RUN(frozen_bf16);
    RUN(modules_to_save_cli);
    RUN(layers_to_transform_cli);
    RUN(bias_cli);
    RUN(patterns_cli);
    RUN(save_lora_zero3);
    RUN(memory_report);
    RUN(hf_resume_auto_fresh);
    RUN(save_lora_dir_of_another_job_refused);
    RUN(save_lora_symlink_refused);
    RUN(save_lora_fifo_refused);
    cli_cleanup();
    return TEST_REPORT();
}
