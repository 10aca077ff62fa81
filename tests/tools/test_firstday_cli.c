/* A PyTorch/DeepSpeed user's first day (issue 32): a GPT trained with a
 * dtrain tokenize vocabulary larger than the model's default (the size is
 * taken from the vocabulary), the checkpoint keeping that vocabulary
 * (dtrain generate --ckpt with a text prompt and no --vocab), `dtrain ckpt`
 * taking the --save directory as eval and --resume do, `ckpt convert
 * --full` writing the model's state_dict only (tied head under both names;
 * --with-optimizer keeps the rest), weights loaded back in the spellings
 * other tools write (safetensors' save_model: lm_head.weight without
 * transformer.wte.weight; a Hugging Face base model: no "transformer."
 * prefix), `dtrain eval --weights`, and generate --seed refused with
 * --ckpt instead of silently ignored. */
// dt-test-timeout: 300
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "dtrain/kernels.h"
#include "test.h"
#include "tools/train_cli.h"

#include <sched.h>

static char vocab[300], train_bin[300], val_bin[300], save_dir[300], data[320], val[320];
static int64_t V, max_id;

/* Words of random letters: enough distinct pairs for a vocabulary of more
 * than 512 ids (gpt-micro's default vocabulary). */
static void write_data(void)
{
    enum { N = 60000 };
    static char text[N + 1];
    uint32_t x = 12345;
    int n = 0;
    while (n < N - 12) {
        x = x * 1103515245u + 12345u;
        int len = 2 + (int)((x >> 16) % 6);
        for (int i = 0; i < len; i++) {
            x = x * 1103515245u + 12345u;
            text[n++] = (char)('a' + (x >> 16) % 20);
        }
        text[n++] = ' ';
    }
    text[n] = 0;
    dt_bpe_train_params tp = dt_bpe_train_params_default();
    tp.vocab_size = 700;
    dt_bpe *bpe = NULL;
    if (dt_bpe_train(text, (size_t)n, &tp, &bpe) < 0)
        return;
    snprintf(vocab, sizeof vocab, "%s/v.bpe", cli_tmpdir());
    dt_bpe_save(bpe, vocab);
    V = dt_bpe_vocab_size(bpe);
    uint16_t *ids = NULL;
    int64_t nt = 0;
    dt_bpe_encode(bpe, text, (size_t)n, &ids, &nt);
    for (int64_t i = 0; i < nt; i++)
        if (ids[i] > max_id)
            max_id = ids[i];
    snprintf(train_bin, sizeof train_bin, "%s/train.bin", cli_tmpdir());
    snprintf(val_bin, sizeof val_bin, "%s/val.bin", cli_tmpdir());
    snprintf(save_dir, sizeof save_dir, "%s/run", cli_tmpdir());
    snprintf(data, sizeof data, "tokens:%s", train_bin);
    snprintf(val, sizeof val, "tokens:%s", val_bin);
    dt_tokens_write(train_bin, ids, nt - 2000);
    dt_tokens_write(val_bin, ids + nt - 2000, 2000);
    free(ids);
    dt_bpe_free(bpe);
}

static cli_result r, r2;

static const char *cli_bin(void)
{
    const char *p = getenv("DT_CLI");
    return p && *p ? p : DT_BINARY_DIR "/dtrain";
}

#define GPT_ARGS "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"

TEST(vocab_size_from_vocab_and_kept_in_ckpt)
{
    ASSERT(V > 512 && max_id >= 512); /* the case: ids the default vocabulary does not have */
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "gpt-micro", GPT_ARGS, "--seq", "16", "--batch", "4", "--max-steps",
                        "3", "--data", data, "--val-data", val, "--limit-test", "8", "--threads", "1", "--vocab",
                        vocab, "--save", save_dir, "--progress", "none", "--optimizer", "adamw", NULL});
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    char want[96];
    snprintf(want, sizeof want, "vocab size %lld (the size of --vocab", (long long)V);
    ASSERT_STR_CONTAINS(r.out, want);
    /* an explicit size too small: the error names --vocab-size */
    cli_runv(&r2, 60, NULL,
             (char *[]){"train", "--model", "gpt-micro", GPT_ARGS, "--vocab-size", "300", "--data", data,
                        "--no-eval", "--max-steps", "1", NULL});
    ASSERT_EQ_INT(r2.code, 2);
    ASSERT_EQ_INT(cli_lines(r2.err), 1);
    ASSERT_STR_CONTAINS(r2.err, ">= vocab size 300");
    ASSERT_STR_CONTAINS(r2.err, "--vocab-size N sets it");
    /* generate --ckpt with a text prompt: the checkpoint's vocabulary */
    cli_runv(&r, 60, NULL,
             (char *[]){"generate", "--ckpt", save_dir, "--prompt", "abc de", "--max-new-tokens", "5",
                        "--temperature", "0", NULL});
    if (r.code)
        fprintf(stderr, "%s\n", r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!strncmp(r.out, "abc de", 6));
    /* the same with --vocab given */
    cli_runv(&r2, 60, NULL,
             (char *[]){"generate", "--ckpt", save_dir, "--vocab", vocab, "--prompt", "abc de", "--max-new-tokens",
                        "5", "--temperature", "0", NULL});
    ASSERT_EQ_INT(r2.code, 0);
    ASSERT_STR_EQ(r.out, r2.out);
    /* --seed with --ckpt would be ignored: refused, naming --sample-seed */
    cli_runv(&r2, 60, NULL, (char *[]){"generate", "--ckpt", save_dir, "--prompt", "abc", "--seed", "1", NULL});
    ASSERT_EQ_INT(r2.code, 2);
    ASSERT_STR_CONTAINS(r2.err, "--sample-seed");
    /* so would the sampling filters under greedy or beam search, and the beam options with one sequence (transformers
       warns and ignores them): refused, naming the flag and the mode */
    struct {
        char *flags[8];
        const char *says;
    } ignored[] = {
        {{"--temperature", "0", "--top-k", "40", NULL}, "--top-k applies to sampling, and this run decodes greedily"},
        {{"--temperature", "0", "--sample-seed", "3", NULL}, "--sample-seed applies to sampling"},
        {{"--temperature", "0", "--num-beams", "2", "--top-p", "0.9", NULL}, "decodes by beam search"},
        {{"--length-penalty", "2", NULL}, "--length-penalty applies to beam search"},
        {{"--num-beams", "1", "--early-stopping", "true", NULL}, "--early-stopping applies to beam search"},
    };
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        char *args[16] = {"generate", "--ckpt", save_dir, "--prompt", "abc", "--max-new-tokens", "2"};
        int n = 7;
        for (int k = 0; ignored[i].flags[k]; k++)
            args[n++] = ignored[i].flags[k];
        args[n] = NULL;
        cli_runv(&r2, 60, NULL, args);
        ASSERT_EQ_INT(r2.code, 2);
        ASSERT_STR_CONTAINS(r2.err, ignored[i].says);
    }
    /* where they apply, they run */
    cli_runv(&r2, 60, NULL,
             (char *[]){"generate", "--ckpt", save_dir, "--prompt", "abc", "--max-new-tokens", "2", "--top-k", "40",
                        "--sample-seed", "3", NULL});
    ASSERT_EQ_INT(r2.code, 0);
    cli_runv(&r2, 60, NULL,
             (char *[]){"generate", "--ckpt", save_dir, "--prompt", "abc", "--max-new-tokens", "2", "--temperature",
                        "0", "--num-beams", "2", "--length-penalty", "2", "--early-stopping", "true", NULL});
    ASSERT_EQ_INT(r2.code, 0);
}

/* Item 5 with a token file only (no --vocab, no --vocab-size): the ids
 * beyond gpt-micro's 512 were refused naming --vocab-size; the vocabulary
 * is now the token files' largest id + 1 (their llm.c header holds no
 * size), said at start, kept in the checkpoint for eval and generate, the
 * same on every rank; files whose ids all fit keep the model's default. */
TEST(vocab_size_from_token_files)
{
    char dir2[320], want[128], small_bin[320], small[340];
    snprintf(dir2, sizeof dir2, "%s/run_tokens", cli_tmpdir());
    snprintf(want, sizeof want, "vocab size %lld (the largest token id of the token files + 1",
             (long long)max_id + 1);
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "gpt-micro", GPT_ARGS, "--seq", "16", "--batch", "4", "--max-steps", "2",
                        "--data", data, "--val-data", val, "--limit-test", "8", "--threads", "1", "--save", dir2,
                        "--progress", "none", NULL});
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, want);
    ASSERT_STR_CONTAINS(r.out, "val loss: ");
    char shape[64];
    snprintf(shape, sizeof shape, "[%lld,16]", (long long)max_id + 1);
    cli_runv(&r2, 60, NULL, (char *[]){"ckpt", "info", dir2, NULL});
    ASSERT_EQ_INT(r2.code, 0);
    ASSERT_STR_CONTAINS(strstr(r2.out, "transformer.wte.weight"), shape);
    /* the checkpoint remembers the size: eval and generate rebuild the model without being told */
    cli_runv(&r2, 60, NULL, (char *[]){"eval", "--ckpt", dir2, NULL});
    if (r2.code)
        fprintf(stderr, "%s\n", r2.err);
    ASSERT_EQ_INT(r2.code, 0);
    char line_eval[64] = "", line_train[64] = "";
    if (strstr(r2.out, "val loss: "))
        sscanf(strstr(r2.out, "val loss: "), "%63[^\n]", line_eval);
    if (strstr(r.out, "val loss: "))
        sscanf(strstr(r.out, "val loss: "), "%63[^\n]", line_train);
    ASSERT(line_train[0]);
    ASSERT_STR_EQ(line_eval, line_train);
    char last_id[32];
    snprintf(last_id, sizeof last_id, "%lld", (long long)max_id);
    cli_runv(&r2, 60, NULL,
             (char *[]){"generate", "--ckpt", dir2, "--prompt-ids", last_id, "--max-new-tokens", "3", "--temperature",
                        "0", NULL});
    if (r2.code)
        fprintf(stderr, "%s\n", r2.err);
    ASSERT_EQ_INT(r2.code, 0);
    /* two ranks read the same files: the same size, no disagreement */
    cli_runv(&r2, 240, NULL,
             (char *[]){"run", "-n", "2", "--", (char *)cli_bin(), "train", "--model", "gpt-micro", GPT_ARGS, "--seq",
                        "16", "--batch", "4", "--max-steps", "1", "--data", data, "--no-eval", "--threads", "1",
                        "--progress", "none", NULL});
    if (r2.code)
        fprintf(stderr, "%s\n%s\n", r2.out, r2.err);
    ASSERT_EQ_INT(r2.code, 0);
    ASSERT_STR_CONTAINS(r2.out, "vocab size ");
    /* ids that all fit the model's default: the default is kept, nothing said */
    uint16_t ids[400];
    for (int i = 0; i < 400; i++)
        ids[i] = (uint16_t)(i * 7 % 300);
    snprintf(small_bin, sizeof small_bin, "%s/small.bin", cli_tmpdir());
    snprintf(small, sizeof small, "tokens:%s", small_bin);
    ASSERT_OK(dt_tokens_write(small_bin, ids, 400));
    cli_runv(&r2, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", GPT_ARGS, "--seq", "16", "--batch", "4", "--max-steps", "1",
                        "--data", small, "--no-eval", "--threads", "1", "--progress", "none", "--vocab-size", "300",
                        NULL});
    ASSERT_EQ_INT(r2.code, 0); /* 300 is enough for these ids */
    char dir3[320];
    snprintf(dir3, sizeof dir3, "%s/run_small", cli_tmpdir());
    cli_runv(&r2, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", GPT_ARGS, "--seq", "16", "--batch", "4", "--max-steps", "1",
                        "--data", small, "--no-eval", "--threads", "1", "--progress", "none", "--save", dir3, NULL});
    ASSERT_EQ_INT(r2.code, 0);
    ASSERT(!strstr(r2.out, "vocab size "));
    cli_runv(&r2, 60, NULL, (char *[]){"ckpt", "info", dir3, NULL});
    ASSERT_EQ_INT(r2.code, 0);
    ASSERT_STR_CONTAINS(strstr(r2.out, "transformer.wte.weight"), "[512,16]");
    /* a uint32 file with an id of 2^31: a vocabulary of 2^31 + 1 was built and the memory check said 1024 GiB,
     * exit 1, advising ZeRO; no tokenizer is that large: refused as not token ids, exit 2, before any model */
    uint32_t wide[64];
    for (int i = 0; i < 64; i++)
        wide[i] = i == 40 ? 1u << 31 : (uint32_t)i;
    snprintf(small_bin, sizeof small_bin, "%s/wide.bin", cli_tmpdir());
    snprintf(small, sizeof small, "tokens:%s", small_bin);
    ASSERT_OK(dt_tokens_write_u32(small_bin, wide, 64));
    cli_runv(&r2, 60, NULL,
             (char *[]){"train", "--model", "gpt-micro", GPT_ARGS, "--seq", "16", "--batch", "4", "--max-steps", "1",
                        "--data", small, "--no-eval", "--threads", "1", "--progress", "none", NULL});
    ASSERT_EQ_INT(r2.code, 2);
    ASSERT_STR_CONTAINS(r2.err, "largest token id 2147483648");
    ASSERT_STR_CONTAINS(r2.err, "--vocab-size");
    ASSERT(!strstr(r2.out, "vocab size "));
}

TEST(ckpt_commands_take_the_save_directory)
{
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "info", save_dir, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "step-00000003");
    ASSERT_STR_CONTAINS(r.err, "newest checkpoint");
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "verify", save_dir, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "ok: ");
}

/* Every tensor of src into dst except `drop`, names without `strip` (when
 * they start with it). */
static void rewrite(const char *src, const char *dst, const char *drop, const char *strip)
{
    dt_ckpt *ck = NULL;
    ASSERT_OK(dt_ckpt_open(src, &ck));
    size_t nt = dt_ckpt_num_tensors(ck), no = 0, idx[256];
    static dt_st_desc d[256];
    ASSERT(nt < 256);
    for (size_t i = 0; i < nt; i++) {
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, i, &t);
        if (drop && !strcmp(t.name, drop))
            continue;
        const char *name = strip && !strncmp(t.name, strip, strlen(strip)) ? t.name + strlen(strip) : t.name;
        d[no] = (dt_st_desc){.name = name, .dtype = t.dtype, .ndim = t.ndim};
        memcpy(d[no].shape, t.shape, sizeof d[no].shape);
        idx[no++] = i;
    }
    dt_st_writer *w = NULL;
    ASSERT_OK(dt_st_writer_open(dst, d, no, NULL, 0, &w));
    for (size_t o = 0; o < no; o++) {
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, idx[o], &t);
        size_t nb = (size_t)t.numel * dt_st_dtype_size(t.dtype);
        void *buf = malloc(nb);
        ASSERT_OK(dt_ckpt_read(ck, idx[o], 0, t.numel, buf, true));
        ASSERT_OK(dt_st_writer_write(w, o, buf, nb));
        free(buf);
    }
    ASSERT_OK(dt_st_writer_commit(w, NULL));
    dt_st_writer_close(w);
    dt_ckpt_close(ck);
}

TEST(convert_full_is_the_state_dict_and_loads_back_in_every_spelling)
{
    char full[320], all[320], sm[320], hf[320], vs[32];
    snprintf(full, sizeof full, "%s/model.safetensors", cli_tmpdir());
    snprintf(all, sizeof all, "%s/all.safetensors", cli_tmpdir());
    snprintf(sm, sizeof sm, "%s/save_model.safetensors", cli_tmpdir());
    snprintf(hf, sizeof hf, "%s/hf_base.safetensors", cli_tmpdir());
    snprintf(vs, sizeof vs, "%lld", (long long)V);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", save_dir, "-o", full, "--full", NULL});
    if (r.code)
        fprintf(stderr, "%s\n", r.err);
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", save_dir, "-o", all, "--full", "--with-optimizer", NULL});
    ASSERT_EQ_INT(r.code, 0);
    dt_ckpt *ck = NULL;
    ASSERT_OK(dt_ckpt_open(full, &ck));
    ASSERT(dt_ckpt_find(ck, "lm_head.weight") >= 0);
    ASSERT(dt_ckpt_find(ck, "transformer.wte.weight") >= 0);
    for (size_t i = 0; i < dt_ckpt_num_tensors(ck); i++) {
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, i, &t);
        ASSERT(strncmp(t.name, "optim.", 6) && strncmp(t.name, "master.", 7));
    }
    ASSERT_STR_EQ(dt_ckpt_meta(ck, "format"), "pt");
    dt_ckpt_close(ck);
    ASSERT_OK(dt_ckpt_open(all, &ck));
    ASSERT(dt_ckpt_find(ck, "optim.transformer.wte.weight.exp_avg") >= 0);
    dt_ckpt_close(ck);
    /* save_model's spelling and a Hugging Face base model's */
    rewrite(full, sm, "transformer.wte.weight", NULL);
    rewrite(full, hf, "lm_head.weight", "transformer.");
    /* every spelling generates what the checkpoint generates */
    static cli_result ref;
    cli_runv(&ref, 60, NULL,
             (char *[]){"generate", "--ckpt", save_dir, "--prompt-ids", "1,2,3", "--max-new-tokens", "6",
                        "--temperature", "0", NULL});
    ASSERT_EQ_INT(ref.code, 0);
    const char *files[] = {full, sm, hf};
    for (int k = 0; k < 3; k++) {
        cli_runv(&r, 60, NULL,
                 (char *[]){"generate", "--model", "gpt-micro", GPT_ARGS, "--vocab-size", vs, "--weights",
                            (char *)files[k], "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--temperature", "0",
                            NULL});
        if (r.code)
            fprintf(stderr, "%s: %s\n", files[k], r.err);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_EQ(r.out, ref.out);
    }
    /* dtrain eval --weights: the checkpoint's validation loss */
    cli_runv(&ref, 120, NULL, (char *[]){"eval", "--ckpt", save_dir, "--threads", "1", NULL});
    if (ref.code)
        fprintf(stderr, "%s\n", ref.err);
    ASSERT_EQ_INT(ref.code, 0);
    cli_runv(&r, 120, NULL,
             (char *[]){"eval", "--weights", sm, "--model", "gpt-micro", GPT_ARGS, "--vocab-size", vs, "--seq", "16",
                        "--data", data, "--val-data", val, "--limit-test", "8", "--threads", "1", NULL});
    if (r.code)
        fprintf(stderr, "%s\n", r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(ref.out, "val loss: ");
    ASSERT_STR_EQ(strstr(r.out, "val loss: "), strstr(ref.out, "val loss: "));
}

/* dtrain info says how bf16 products run: with dtrain and oneDNN capped at
 * AVX2 (as on a CPU without AVX512_BF16; dtrain's cap also turns its AMX
 * GEMM off) they widen to f32, the attention's too. */
/* `dtrain info` names the CPU (the figures a user reports need it): the model name, family, model and stepping
 * /proc/cpuinfo gives, and the CPUs this process may use. */
TEST(info_names_the_cpu)
{
    cli_runv(&r, 60, NULL, (char *[]){"info", NULL});
    ASSERT_EQ_INT(r.code, 0);
    const char *line = strstr(r.out, "\ncpu: ");
    ASSERT(line);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return; /* no /proc here: the line's presence is all there is to check */
    char l[512], want[600] = "", fam[32] = "", mod[32] = "", step[32] = "";
    while (fgets(l, sizeof l, f) && !(want[0] && fam[0] && mod[0] && step[0])) {
        char *v = strchr(l, ':');
        if (!v)
            continue;
        v += v[1] == ' ' ? 2 : 1;
        v[strcspn(v, "\n")] = 0;
        if (!strncmp(l, "model name", 10) && !want[0])
            snprintf(want, sizeof want, "\ncpu: %s (", v);
        else if (!strncmp(l, "cpu family", 10) && !fam[0])
            snprintf(fam, sizeof fam, "family %s,", v);
        else if (!strncmp(l, "model\t", 6) && !mod[0])
            snprintf(mod, sizeof mod, "model %s,", v);
        else if (!strncmp(l, "stepping", 8) && !step[0])
            snprintf(step, sizeof step, "stepping %s)", v);
    }
    fclose(f);
    if (want[0])
        ASSERT_STR_CONTAINS(r.out, want);
    if (fam[0] && mod[0] && step[0]) {
        ASSERT_STR_CONTAINS(line, fam);
        ASSERT_STR_CONTAINS(line, mod);
        ASSERT_STR_CONTAINS(line, step);
    }
}

TEST(info_bf16_matmul)
{
    const bool native = dt_k_matmul_native(DT_BF16);
    const char *was = getenv("DT_MAX_CPU_ISA");
    char *saved = was ? strdup(was) : NULL;
    setenv("DT_MAX_CPU_ISA", "avx2", 1); /* for the child; restored before anything here reads it */
    cli_runv(&r, 60, "ONEDNN_MAX_CPU_ISA=AVX2", (char *[]){"info", NULL});
    if (saved)
        setenv("DT_MAX_CPU_ISA", saved, 1);
    else
        unsetenv("DT_MAX_CPU_ISA");
    free(saved);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "bf16 matmul: widened to f32 exactly, then oneDNN's f32 matmul");
    ASSERT_STR_CONTAINS(r.out, "bf16 attention: on the vector rows (no AVX512_BF16 path here");
    if (native) {
        cli_runv(&r, 60, NULL, (char *[]){"info", NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT(!strstr(r.out, "bf16 matmul: widened"));
        ASSERT_STR_CONTAINS(r.out, "bf16 attention: ");
        if (dt_k_get_isa() == DT_K_ISA_AVX512_BF16) /* this process's path: the child's environment is ours */
            ASSERT(!strstr(r.out, "no AVX512_BF16 path here"));
    }
}

/* Shared CPUs: unless the user chose, OpenMP waits passively on a machine
 * busy at start (libgomp's spinning made a run many times slower beside one
 * busy process) and spins briefly on an idle one (passive waiting cost
 * 11-22% there), and the default thread count warns when the load leaves
 * fewer free cores than ranks x threads (DT_LOADAVG stands in for the
 * load). */
TEST(shared_cpus)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("DT_OMP_WAIT")) {
        fprintf(stderr, "  (OpenMP's waiting is set in this environment: the default is not checked)\n");
    } else {
        /* a busy machine at start: passive; an idle one: a short spin (DT_LOADAVG stands in for the load) */
        cli_runv(&r, 60, "DT_LOADAVG=5", (char *[]){"info", NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out,
                            "OpenMP waiting: passive (dtrain's default for a busy machine at start (load 5.00, 5 running, ");
        cli_runv(&r, 60, "DT_LOADAVG=0.2", (char *[]){"info", NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, "OpenMP waiting: GOMP_SPINCOUNT=10000 (dtrain's default for an idle machine at start "
                                   "(load 0.20, 0 running, ");
        /* the threshold follows the cores and threads: a machine busy a
         * minute ago (average 1) but idle now spins; one thread beside
         * cores - 1 busy ones spins (the old fixed threshold, load 0.5,
         * made both passive) */
        cli_runv(&r, 60, "DT_LOADAVG=1,0", (char *[]){"info", NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, "OpenMP waiting: GOMP_SPINCOUNT=10000 (dtrain's default for an idle machine at start "
                                   "(load 1.00, 0 running, ");
        cli_runv(&r, 60, "DT_LOADAVG=1,1", (char *[]){"info", NULL});
        ASSERT_STR_CONTAINS(r.out, "OpenMP waiting: passive (dtrain's default for a busy machine");
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
            cores = CPU_COUNT(&set);
        if (cores >= 2 && !getenv("OMP_NUM_THREADS")) {
            char env[64];
            snprintf(env, sizeof env, "DT_LOADAVG=%ld", cores - 1);
            setenv("OMP_NUM_THREADS", "1", 1);
            cli_runv(&r, 60, env, (char *[]){"info", NULL});
            unsetenv("OMP_NUM_THREADS");
            ASSERT_EQ_INT(r.code, 0);
            ASSERT_STR_CONTAINS(r.out, "OpenMP waiting: GOMP_SPINCOUNT=10000 (dtrain's default for an idle machine");
            ASSERT_STR_CONTAINS(r.out, " running, 1 thread on ");
        }
        /* a malformed stand-in: the load is unknown, passive (never collapses) */
        cli_runv(&r, 60, "DT_LOADAVG=nan", (char *[]){"info", NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, "OpenMP waiting: passive (dtrain's default for a busy machine at start (load unknown)");
        cli_runv(&r, 60, "OMP_WAIT_POLICY=active", (char *[]){"info", NULL});
        ASSERT_STR_CONTAINS(r.out, "OpenMP waiting: OMP_WAIT_POLICY=active (from the environment)");
        cli_runv(&r, 60, "GOMP_SPINCOUNT=1000", (char *[]){"info", NULL});
        ASSERT_STR_CONTAINS(r.out, "OpenMP waiting: GOMP_SPINCOUNT=1000 (from the environment)");
        /* the ranks of dtrain run inherit the launcher's choice */
        char *echo[] = {"run", "-n", "2", "--", "sh", "-c", "echo policy=$OMP_WAIT_POLICY spin=$GOMP_SPINCOUNT", NULL};
        cli_runv(&r, 60, "DT_LOADAVG=5", echo);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, "[1] policy=passive spin=\n");
        cli_runv(&r, 60, "DT_LOADAVG=0", echo);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, "[1] policy= spin=10000\n");
    }
    char *args[] = {"train", "--model", "mlp", "--mlp-dim", "8", "--mlp-hidden", "8", "--random-items", "50",
                    "--limit-test", "10", "--no-eval", "--progress", "none", NULL};
    cli_runv(&r, 60, "DT_LOADAVG=1000", args);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "warning: 1 rank x ");
    ASSERT_STR_CONTAINS(r.err, "--threads N");
    cli_runv(&r, 60, "DT_LOADAVG=0", args);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!strstr(r.err, "compute threads on"));
    /* under dtrain run: the ranks on this machine count (LOCAL_WORLD_SIZE), said once, by rank 0 */
    char *ranks[32] = {"run", "-n", "2", "--", (char *)cli_bin()};
    int n = 5;
    for (int i = 0; args[i] && n < 31; i++)
        ranks[n++] = args[i];
    ranks[n] = NULL;
    cli_runv(&r, 120, "DT_LOADAVG=1000", ranks);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "warning: 2 ranks x ");
    const char *w = strstr(r.err, "warning: 2 ranks x ");
    ASSERT(w && !strstr(w + 1, "warning: 2 ranks x "));
    if (sysconf(_SC_NPROCESSORS_ONLN) >= 2) { /* the launcher's split: 2 x (cores / 2) fit an idle machine */
        cli_runv(&r, 120, "DT_LOADAVG=0", ranks);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT(!strstr(r.err, "compute threads on"));
    }
}

/* "12.5 KiB" after `key ` in the line of out starting with `line`, in bytes; -1 when absent. */
static double mem_field(const char *out, const char *line, const char *key)
{
    const char *l = strstr(out, line), *k = l ? strstr(l, key) : NULL, *nl = l ? strchr(l, '\n') : NULL;
    if (!k || (nl && k > nl))
        return -1;
    char *end;
    double v = strtod(k + strlen(key), &end);
    while (*end == ' ')
        end++;
    return v * (!strncmp(end, "MiB", 3) ? 1048576.0 : !strncmp(end, "KiB", 3) ? 1024.0 : 1.0);
}

/* Issue 32 item 11: every multi-rank run ends with the memory lines (DDP
 * and --tp had none), and an interleaved pipeline rank's optimizer states
 * are those of the parameters it steps (Adam: two per element), not of the
 * span between its two chunks. */
TEST(memory_report_ddp_tp_interleaved)
{
    char *mlp[] = {"run", "-n", "2", "--", (char *)cli_bin(), "train", "--model", "mlp", "--mlp-dim", "16",
                   "--mlp-hidden", "64", "--random-items", "64", "--limit-test", "8", "--batch", "8", "--no-eval",
                   "--progress", "none", "--threads", "1", "--optimizer", "adam", NULL, NULL, NULL};
    cli_runv(&r, 120, NULL, mlp);
    ASSERT_EQ_INT(r.code, 0);
    double ddp0 = mem_field(r.out, "memory rank 0:", "parameters ");
    ASSERT(ddp0 > 0);
    ASSERT(mem_field(r.out, "memory rank 1:", "parameters ") == ddp0);
    ASSERT(mem_field(r.out, "memory rank 1:", "optimizer states ") == 2 * ddp0);
    mlp[25] = "--tp", mlp[26] = "2";
    cli_runv(&r, 120, NULL, mlp);
    ASSERT_EQ_INT(r.code, 0);
    double tp0 = mem_field(r.out, "memory rank 0:", "parameters ");
    ASSERT(tp0 > 0 && tp0 < 0.75 * ddp0); /* each rank holds about half of the weights */
    ASSERT(mem_field(r.out, "memory rank 1:", "parameters ") > 0);
    cli_runv(&r, 240, NULL,
             (char *[]){"run", "-n", "2", "--", (char *)cli_bin(), "train", "--model", "gpt-micro", GPT_ARGS,
                        "--n-layer", "4", "--vocab-size", "800", "--seq", "16", "--data", data, "--no-eval",
                        "--max-steps", "1", "--batch", "4", "--micro-batches", "4", "--pp", "2", "--pp-schedule",
                        "interleaved", "--optimizer", "adamw", "--threads", "1", "--progress", "plain", NULL, NULL,
                        NULL});
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    /* the cut: every stage's units and parameters; a rank's memory line is its stages' sum (no
       parameter is shared by the two stages of one rank here: the tied wte is on stages 0 and 3) */
    const char *cut = strstr(r.out, "pipeline stages balanced by compute: stage 0 has units [0, ");
    ASSERT(cut != NULL);
    ASSERT_STR_CONTAINS(cut, ", stage 3 [");
    const char *per = cut ? strstr(cut, "parameters per stage: ") : NULL;
    ASSERT(per != NULL);
    double sb[4] = {0};
    for (int i = 0; i < 4 && per; i++) {
        char field[32];
        snprintf(field, sizeof field, "%s", i ? ", " : "parameters per stage: ");
        per = strstr(per, field);
        ASSERT(per != NULL);
        if (!per)
            break;
        char *end;
        sb[i] = strtod(per + strlen(field), &end);
        sb[i] *= !strncmp(end, " MiB", 4) ? 1048576.0 : !strncmp(end, " KiB", 4) ? 1024.0 : 1.0;
        per = end;
    }
    for (int k = 0; k < 2; k++) {
        char line[32];
        snprintf(line, sizeof line, "memory rank %d:", k);
        double p = mem_field(r.out, line, "parameters "), o = mem_field(r.out, line, "optimizer states ");
        if (!(p > 0 && o > 0 && o <= 2 * p * 1.001))
            fprintf(stderr, "  rank %d: parameters %.0f B, optimizer states %.0f B\n", k, p, o);
        ASSERT(p > 0 && o > 0);
        ASSERT(o <= 2 * p * 1.001);
        ASSERT_NEAR(sb[k] + sb[k + 2], p, 0, 200); /* the printed figures' rounding (0.1 KiB each) */
    }
    /* bf16: the fp32 master weights of what a rank steps, not of the span between its chunks (rank 0's
       span holds stage 1: its masters were 997.5 KiB for 672.5 KiB of stepped elements) */
    char *bf[64];
    int nb = 0;
    for (char **a = (char *[]){"run", "-n", "2", "--", (char *)cli_bin(), "train", "--model", "gpt-micro",
                              "--block-size", "16", "--n-layer", "4", "--vocab-size", "800", "--seq", "16", "--data", data, "--no-eval",
                              "--max-steps", "1", "--batch", "4", "--micro-batches", "4", "--pp", "2",
                              "--pp-schedule", "interleaved", "--optimizer", "adamw", "--threads", "1", "--progress",
                              "none", "--precision", "bf16", NULL};
         *a; a++)
        bf[nb++] = *a;
    bf[nb] = NULL;
    cli_runv(&r, 240, NULL, bf);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    for (int k = 0; k < 2; k++) {
        char line[32];
        snprintf(line, sizeof line, "memory rank %d:", k);
        double p = mem_field(r.out, line, "parameters "), m = mem_field(r.out, line, "master weights ");
        /* bf16 parameters: 2 bytes, masters 4; 5%: the 64-byte alignment padding between the bf16
           tensors, which the masters span (a few hundred elements) */
        if (!(p > 0 && m > 0 && m <= 2 * p * 1.05))
            fprintf(stderr, "  rank %d: parameters %.0f B, master weights %.0f B\n", k, p, m);
        ASSERT(p > 0 && m > 0 && m <= 2 * p * 1.05);
    }
}

int main(void)
{
    write_data();
    RUN(vocab_size_from_vocab_and_kept_in_ckpt);
    RUN(vocab_size_from_token_files);
    RUN(ckpt_commands_take_the_save_directory);
    RUN(convert_full_is_the_state_dict_and_loads_back_in_every_spelling);
    RUN(info_names_the_cpu);
    RUN(info_bf16_matmul);
    RUN(shared_cpus);
    RUN(memory_report_ddp_tp_interleaved);
    cli_cleanup();
    return TEST_REPORT();
}
