/* dtrain train --freeze: the frozen parameters keep their initial values
 * and have no optimizer state in the checkpoint, the others train, under
 * one process, DDP, ZeRO-1 and ZeRO-3 on 2 ranks; the parameter count said
 * at start leaves them out; patterns that match nothing or everything are
 * refused (exit 2). LoRA (--lora-targets): only the adapters change and
 * have optimizer state, and --save-lora writes them under PEFT's keys. */
// dt-test-timeout: 600
#include "dtrain/ckpt.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "test.h"
#include "train_cli.h"

#include <fnmatch.h>

#define FREEZE "transformer.h.0.*"

static char tokens_[700];

/* A token file of n pseudo-random ids below 701. */
static const char *make_tokens(void)
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
    return tokens_;
}

/* Check checkpoint dir against a fresh gpt-micro (seed 7, vocab 701):
 * frozen entries equal, trained ones different, optimizer state only for
 * trained ones. */
static int check_ckpt_lora(const char *dir, const dt_lora_params *lora, const char *pattern, int want_frozen)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.vocab_size = 701;
    cfg.seq = 32;
    cfg.build.lora = lora;
    dt_model *m;
    if (dt_model_create("gpt-micro", 7, &cfg, &m, NULL) < 0 || dt_model_init_torch(m, 7) < 0)
        return fprintf(stderr, "model: %s\n", dt_last_error()), 1; /* --rng torch, the CLI's default */
    dt_ckpt *ck;
    if (dt_ckpt_open(dir, &ck) < 0)
        return fprintf(stderr, "ckpt %s: %s\n", dir, dt_last_error()), 1;
    int bad = 0, nfrozen = 0, ntrained = 0;
    for (size_t i = 0; i < dt_model_num_entries(m) && !bad; i++) {
        dt_param_info p;
        dt_model_entry(m, i, &p);
        if ((p.is_buffer && !p.frozen) || p.tied_to >= 0)
            continue;
        bool frozen = lora ? fnmatch(pattern, p.name, 0) != 0 : fnmatch(pattern, p.name, 0) == 0;
        int64_t j = dt_ckpt_find(ck, p.name);
        char oname[300];
        snprintf(oname, sizeof oname, "optim.%s.exp_avg", p.name);
        bool has_state = dt_ckpt_find(ck, oname) >= 0;
        float *v = malloc(p.numel * sizeof *v);
        if (j < 0 || dt_ckpt_read(ck, (size_t)j, 0, p.numel, v, true) < 0) {
            fprintf(stderr, "%s: not in %s\n", p.name, dir);
            bad = 1;
        } else {
            bool same = !memcmp(v, p.tensor->data, p.numel * sizeof *v);
            if (frozen != same || frozen == has_state) {
                fprintf(stderr, "%s (%s): %s the initial values, %s optimizer state\n", p.name,
                        frozen ? "frozen" : "trained", same ? "has" : "lost", has_state ? "has" : "no");
                bad = 1;
            }
            nfrozen += frozen;
            ntrained += !frozen;
        }
        free(v);
    }
    dt_ckpt_close(ck);
    dt_model_free(m);
    if (!bad && (nfrozen != want_frozen || ntrained < 4)) {
        fprintf(stderr, "%d frozen, %d trained\n", nfrozen, ntrained);
        bad = 1;
    }
    return bad;
}

static int check_ckpt(const char *dir) { return check_ckpt_lora(dir, NULL, FREEZE, 12); }

static int run_one(int ranks, const char *zero, const char *save)
{
    char data[800];
    snprintf(data, sizeof data, "tokens:%s", tokens_);
    char *base[] = {"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--vocab-size", "701", "--seq", "32",
                    "--batch", "4", "--max-steps", "3", "--threads", "1", "--seed", "7", "--optimizer", "adamw",
                    "--lr", "0.01", "--freeze", FREEZE, "--save", (char *)save, NULL};
    char *z[] = {"--zero", (char *)zero, NULL};
    cli_result r;
    cli_run_ranks(&r, 300, NULL, ranks, 2, (char *const *const[]){base, zero ? z : NULL});
    if (r.code != 0)
        return 1;
    if (!strstr(r.out, "frozen: 12 parameters") || !strstr(r.out, "gpt-micro (99072 parameters)")) {
        fprintf(stderr, "output:\n%s\n", r.out);
        return 1;
    }
    char step[900];
    snprintf(step, sizeof step, "%s/step-00000003", save);
    return check_ckpt(step);
}

TEST(single_process) { ASSERT_EQ_INT(run_one(1, NULL, cli_path("s1")), 0); }
TEST(ddp_2) { ASSERT_EQ_INT(run_one(2, NULL, cli_path("d2")), 0); }
TEST(zero1_2) { ASSERT_EQ_INT(run_one(2, "1", cli_path("z1")), 0); }
TEST(zero3_2) { ASSERT_EQ_INT(run_one(2, "3", cli_path("z3")), 0); }

TEST(lora)
{
    char data[800];
    snprintf(data, sizeof data, "tokens:%s", tokens_);
    const char *save = cli_path("lora"), *ad = cli_path("adapters");
    char *args[] = {"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--vocab-size", "701", "--seq", "32",
                    "--batch", "4", "--max-steps", "3", "--threads", "1", "--seed", "7", "--optimizer", "adamw",
                    "--lr", "0.01", "--lora-targets", "c_attn,c_proj,c_fc", "--lora-r", "4", "--lora-alpha", "16",
                    "--save", (char *)save, "--save-lora", (char *)ad, NULL};
    cli_result r;
    cli_runv(&r, 300, NULL, args);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);

    ASSERT_STR_CONTAINS(r.out, "LoRA: r 4, alpha 16, dropout 0, scaling 4");
    const char *tg[] = {"c_attn", "c_proj", "c_fc", NULL};
    dt_lora_params lp = dt_lora_params_default();
    lp.r = 4;
    lp.alpha = 16;
    lp.targets = tg;
    char step[900];
    snprintf(step, sizeof step, "%s/step-00000003", save);
    ASSERT_EQ_INT(check_ckpt_lora(step, &lp, "*.lora_[AB].weight", 28), 0);
    /* the adapters as PEFT names them */
    char f[900];
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", ad);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(f, &ck));
    ASSERT_EQ_INT(dt_ckpt_num_tensors(ck), 16); /* c_proj: attn.c_proj and mlp.c_proj, as PEFT matches */
    ASSERT(dt_ckpt_find(ck, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight") >= 0);
    ASSERT(dt_ckpt_find(ck, "base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight") >= 0);
    ASSERT_STR_EQ(dt_ckpt_meta(ck, "format"), "pt");
    dt_ckpt_close(ck);
    snprintf(f, sizeof f, "%s/adapter_config.json", ad);
    FILE *fp = fopen(f, "r");
    ASSERT(fp != NULL);
    char cfgtxt[4096];
    size_t n = fread(cfgtxt, 1, sizeof cfgtxt - 1, fp);
    cfgtxt[n] = 0;
    fclose(fp);
    ASSERT_STR_CONTAINS(cfgtxt, "\"peft_type\":\t\"LORA\"");
    ASSERT_STR_CONTAINS(cfgtxt, "\"fan_in_fan_out\":\ttrue");
    /* a target that names no layer */
    char *bad[] = {"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--vocab-size", "701",
                   "--lora-targets", "q_proj", NULL};
    cli_runv(&r, 60, NULL, bad);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "no layer matches");
}

/* LoRA under ZeRO-3 on 2 ranks: the adapters are sharded and trained, the
 * frozen base whole and unchanged. */
TEST(lora_zero3)
{
    char data[800];
    snprintf(data, sizeof data, "tokens:%s", tokens_);
    const char *save = cli_path("lora_z3");
    char *base[] = {"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--vocab-size", "701", "--seq", "32",
                    "--batch", "4", "--max-steps", "3", "--threads", "1", "--seed", "7", "--optimizer", "adamw",
                    "--lr", "0.01", "--lora-targets", "c_attn,c_fc", "--lora-r", "2", "--zero", "3", "--save",
                    (char *)save, NULL};
    cli_result r;
    cli_run_ranks(&r, 300, NULL, 2, 1, (char *const *const[]){base});
    ASSERT_EQ_INT(r.code, 0);
    const char *tg[] = {"c_attn", "c_fc", NULL};
    dt_lora_params lp = dt_lora_params_default();
    lp.r = 2;
    lp.targets = tg;
    char step[900];
    snprintf(step, sizeof step, "%s/step-00000003", save);
    ASSERT_EQ_INT(check_ckpt_lora(step, &lp, "*.lora_[AB].weight", 28), 0);
}

TEST(bad_patterns)
{
    char data[800];
    snprintf(data, sizeof data, "tokens:%s", tokens_);
    cli_result r;
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--vocab-size", "701",
                        "--freeze", "transformer.h.9.*", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "matches no parameter");
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--vocab-size", "701",
                        "--freeze", "*", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "freezes every parameter");
}

int main(void)
{
    make_tokens();
    RUN(single_process);
    RUN(ddp_2);
    RUN(zero1_2);
    RUN(zero3_2);
    RUN(lora);
    RUN(lora_zero3);
    RUN(bad_patterns);
    cli_cleanup();
    return TEST_REPORT();
}
