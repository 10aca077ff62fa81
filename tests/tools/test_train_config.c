/* `dtrain train --config FILE`: the seed DeepSpeed configs (003) train a
 * tiny GPT under `dtrain run -n 2` with ZeRO stage 2 (and activation
 * checkpointing) and stage 3 (with CPU offload), the effective
 * configuration is printed once and written to the metrics; the pasted
 * seed with its missing comma is refused with the line and column; flags
 * override the file and AIAK_* variables override both; a batch relation
 * that does not hold and a key dtrain cannot honour yet are errors; an
 * unknown key is a warning naming it. Pipeline keys (DeepSpeed's pipeline
 * block, gradient_accumulation_steps as the micro-batches, dtrain's
 * pipeline_parallel_size / pipeline_schedule / data_parallel_size) train
 * the GPT under dtrain run -n 2 exactly as the --pp flags do; flags
 * override them; bad values name the key. */
// dt-test-timeout: 300
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

#define DATA DT_SOURCE_DIR "/tests/config/data/"

static char train_tok[320], val_tok[320], metrics[300];

static void write_data(void)
{
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", cli_tmpdir());
    cli_stream_train_val(train_tok, val_tok, sizeof train_tok);
}

/* dtrain [run -n ranks --] train --config cfg <the tiny GPT> extra... */
static void run_cfg(cli_result *r, int ranks, const char *cfg, const char *env, const char *const *extra)
{
    char *base[] = {"train", "--config", (char *)cfg, "--model", "gpt-micro", "--vocab-size", "40", "--n-embd", "32",
                    "--seq", "16", "--data", train_tok, "--val-data", val_tok, "--threads", "1",
                    "--progress", "plain", "--metrics", metrics, "--max-steps", "8", NULL};
    cli_run_ranks(r, 200, env, ranks, 2, (char *const *const[]){base, (char *const *)extra});
}

TEST(seed_stage2_activation_checkpointing_trains)
{
    static cli_result r;
    run_cfg(&r, 2, DATA "seed_zero2_actckpt.json", NULL,
            (const char *[]){"--batch", "4", "--optimizer", "adamw", "--lr", "0.01", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] ZeRO stage 2: 2 ranks");
    ASSERT_STR_CONTAINS(r.out, "[0]   zero_optimization.stage = 2  (file)\n");
    ASSERT_STR_CONTAINS(r.out, "[0]   train_micro_batch_size_per_gpu = 4  (--batch)\n");
    ASSERT_STR_CONTAINS(r.out, "[0]   optimizer.params.lr = 0.01  (--lr)\n");
    ASSERT_STR_CONTAINS(r.out, "batch 4 per rank (8 per step)");
    /* the activation_checkpointing block: every block (number_checkpoints null) */
    ASSERT_STR_CONTAINS(r.out, "[0] activation checkpointing: 2 GPT2Block modules recompute");
    ASSERT(strstr(r.out, "[1]   zero_optimization.stage") == NULL); /* printed once, by rank 0 */
    double vl = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "stage 2: val loss %.4f after 8 steps (ln 40 = %.4f)\n", vl, log(40.0));
    ASSERT(vl < log(40.0) - 0.3); /* it learned something in 8 steps */
    char m[65536];
    slurp_(metrics, m, sizeof m);
    ASSERT_STR_CONTAINS(m, "\"event\":\"config\",\"file\":\"" DATA "seed_zero2_actckpt.json\"");
    ASSERT_STR_CONTAINS(m, "\"activation_checkpointing.cpu_checkpointing\":true");
    ASSERT_STR_CONTAINS(m, "\"zero_optimization.reduce_bucket_size\":50000000");
}

TEST(seed_stage3_offload_trains)
{
    static cli_result r;
    run_cfg(&r, 2, DATA "seed_zero3_offload_fixed.json", NULL,
            (const char *[]){"--batch", "4", "--optimizer", "adamw", "--lr", "0.01", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] ZeRO stage 3: 2 ranks");
    ASSERT_STR_CONTAINS(r.err, "offload device cpu: nothing changes");
    ASSERT_STR_CONTAINS(r.out, "adamw lr 0.01");
    double vl = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "stage 3: val loss %.4f after 8 steps\n", vl);
    ASSERT(vl < log(40.0) - 0.3);
}

TEST(seed_pasted_unchanged_is_refused_with_line_and_column)
{
    static cli_result r;
    run_cfg(&r, 1, DATA "seed_zero3_offload.json", NULL, NULL);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "dtrain train: --config: " DATA "seed_zero3_offload.json:18:3: missing ',' after the "
                               "value of \"wall_clock_breakdown\" (line 17)");
}

static void write_cfg(const char *name, const char *text, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", cli_tmpdir(), name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

TEST(activation_checkpointing_keys)
{
    static cli_result r;
    char p[400];
    write_cfg("a.json", "{\"activation_checkpointing\": {\"number_checkpoints\": 1, \"profile\": true}}", p,
              sizeof p);
    run_cfg(&r, 1, p, NULL, (const char *[]){"--batch", "4", "--max-steps", "3", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "activation checkpointing: 1 GPT2Block modules recompute");
    /* one checkpointed block, 3 steps: 3 first runs, each recomputed once */
    ASSERT_STR_CONTAINS(r.out, "activation checkpointing profile: 3 regions");
    write_cfg("a0.json", "{\"activation_checkpointing\": {}, \"dtrain\": {\"activation_checkpointing\": false}}", p,
              sizeof p);
    run_cfg(&r, 1, p, NULL, (const char *[]){"--batch", "4", "--max-steps", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(strstr(r.out, "activation checkpointing:") == NULL);
}

/* "dataloader_drop_last": true (and --dataloader-drop-last): the epoch's
 * short last batch is dropped (10 windows, batch 4: 2 steps an epoch, the
 * third step starts epoch 2); without it 3 steps an epoch. It was an
 * unknown key, ignored. */
static int third_step_epoch(void)
{
    static char buf[1 << 15];
    FILE *f = fopen(metrics, "r");
    if (!f)
        return -1;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    const char *p = strstr(buf, "\"event\":\"step\",\"epoch\":");
    for (int i = 0; p && i < 2; i++)
        p = strstr(p + 1, "\"event\":\"step\",\"epoch\":");
    return p ? atoi(p + strlen("\"event\":\"step\",\"epoch\":")) : -1;
}

TEST(dataloader_drop_last)
{
    static cli_result r;
    char on[400], off[400];
    write_cfg("dl1.json", "{\"dataloader_drop_last\": true}", on, sizeof on);
    write_cfg("dl0.json", "{}", off, sizeof off);
    const char *extra[] = {"--batch", "4", "--limit-train", "10", "--max-steps", "3", "--log-every", "1", NULL};
    run_cfg(&r, 1, on, NULL, extra);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_EQ_INT(third_step_epoch(), 2);
    run_cfg(&r, 1, off, NULL, extra);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_EQ_INT(third_step_epoch(), 1);
    run_cfg(&r, 1, off, NULL,
            (const char *[]){"--batch", "4", "--limit-train", "10", "--max-steps", "3", "--log-every", "1",
                             "--dataloader-drop-last", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_EQ_INT(third_step_epoch(), 2);
}

TEST(tensor_parallel_from_the_config)
{
    static cli_result r;
    char p[400];
    /* train 4 over world 2 / tp 2 = one data-parallel rank: micro 4 */
    write_cfg("tp.json", "{\"train_batch_size\": 4, \"dtrain\": {\"tensor_parallel_size\": 2}}", p, sizeof p);
    run_cfg(&r, 2, p, NULL, (const char *[]){"--max-steps", "2", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0]   dtrain.tensor_parallel_size = 2  (file)\n");
    ASSERT_STR_CONTAINS(r.out, "steps/epoch of 4");
    /* the --tp refusals see the config's keys too */
    write_cfg("tpc.json", "{\"zero_optimization\": {\"stage\": 2}, \"dtrain\": {\"tensor_parallel_size\": 2}}", p,
              sizeof p);
    run_cfg(&r, 2, p, NULL, NULL);
    ASSERT(r.code != 0);
    ASSERT_STR_CONTAINS(r.err, "--tp 2 does not combine with --zero 2|3 or --fsdp");
}

/* The step losses of a metrics file (--log-every 1) into out; their number. */
static int losses(double *out)
{
    return cli_step_losses(metrics, out, 16);
}

/* The same tiny GPT from the flags alone (no --config) under dtrain run -n 2:
 * extra, then common. */
static void run_flags(cli_result *r, const char *const *extra, const char *const *common)
{
    const char *base[] = {"run", "-n", "2", "--", getenv("DT_CLI"), "train", "--model", "gpt-micro", "--vocab-size",
                          "40", "--n-embd", "32", "--seq", "16", "--data", train_tok, "--val-data", val_tok,
                          "--threads", "1", "--progress", "plain", "--metrics", metrics, NULL};
    const char *const *parts[] = {base, extra, common};
    char *args[64];
    int n = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; parts[k][i] && n < 63; i++)
            args[n++] = (char *)parts[k][i];
    args[n] = NULL;
    cli_runv(r, 200, NULL, args);
}

TEST(pipeline_config_equals_the_flags)
{
    static cli_result r;
    char p[400];
    /* DeepSpeed's pipeline semantics: 4 micro-batches of 2 (gradient_accumulation_steps) per step on each of
       world 2 / 2 stages = 1 data-parallel replica; the interval turns activation checkpointing on */
    write_cfg("pp.json", "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 4,\n"
                         " \"pipeline\": {\"stages\": 2, \"partition\": \"parameters\", \"seed_layers\": false,\n"
                         "              \"activation_checkpoint_interval\": 1},\n"
                         " \"dtrain\": {\"pipeline_schedule\": \"gpipe\"}}", p, sizeof p);
    /* (--weight-decay: AdamW named with --config starts from DeepSpeed's default decay 0, torch's is 0.01) */
    const char *common[] = {"--max-steps", "4", "--log-every", "1", "--optimizer", "adamw", "--lr", "0.01",
                            "--weight-decay", "0.01", NULL};
    run_cfg(&r, 2, p, NULL, common);
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0]   pipeline.stages = 2  (file)\n");
    ASSERT_STR_CONTAINS(r.out, "[0] pipeline parallel: 2 stages x 1 data-parallel, schedule gpipe, 4 micro-batches");
    ASSERT_STR_CONTAINS(r.out, "steps/epoch of 8");
    ASSERT_STR_CONTAINS(r.out, "[0] activation checkpointing: 2 GPT2Block modules recompute");
    double a[16], b[16];
    int na = losses(a);
    /* the same run from the flags alone: --batch is a step's batch per replica, cut into --micro-batches */
    run_flags(&r, (const char *[]){"--pp", "2", "--pp-schedule", "gpipe", "--micro-batches", "4", "--batch", "8",
                                   "--activation-checkpointing", NULL},
              common);
    ASSERT_EQ_INT(r.code, 0);
    int nb = losses(b);
    fprintf(stderr, "pipeline: config %d losses, flags %d; first %.6f / %.6f, last %.6f / %.6f\n", na, nb, a[0],
            b[0], a[na > 0 ? na - 1 : 0], b[nb > 0 ? nb - 1 : 0]);
    ASSERT_EQ_INT(na, 4);
    ASSERT(cli_same_losses(a, na, b, nb, 0)); /* the same run */
    ASSERT(a[3] < a[0]);
}

/* What the --pp flags combine with, a config expresses too: ZeRO-1 and
 * bf16 in pipeline stages train exactly as --zero 1 --precision bf16 do,
 * and fp16 trains (the refusals of "fp32 only" and "no ZeRO" are gone). */
TEST(pipeline_config_with_zero1_and_mixed_precision_equals_the_flags)
{
    static cli_result r;
    char p[400];
    write_cfg("ppz.json", "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,\n"
                          " \"pipeline\": {\"stages\": 2}, \"zero_optimization\": {\"stage\": 1},\n"
                          " \"bf16\": {\"enabled\": true}}", p, sizeof p);
    const char *common[] = {"--max-steps", "3", "--log-every", "1", "--optimizer", "adamw", "--lr", "0.01", "--weight-decay",
                            "0.01", NULL};
    run_cfg(&r, 2, p, NULL, common);
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0]   zero_optimization.stage = 1  (file)\n");
    double a[16], b[16];
    int na = losses(a);
    run_flags(&r, (const char *[]){"--pp", "2", "--micro-batches", "2", "--batch", "4", "--zero", "1", "--precision",
                                   "bf16", NULL},
              common);
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    int nb = losses(b);
    ASSERT_EQ_INT(na, 3);
    ASSERT(cli_same_losses(a, na, b, nb, 0));
    write_cfg("ppf.json", "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,\n"
                          " \"pipeline\": {\"stages\": 2}, \"fp16\": {\"enabled\": true}}", p, sizeof p);
    run_cfg(&r, 2, p, NULL, common);
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    na = losses(a); /* 3 steps, and a step skipped for overflow (fp16's first scale) is logged too */
    ASSERT(na >= 3);
    for (int i = 0; i < na; i++)
        ASSERT(isfinite(a[i]));
}

/* "partition": "profile" (DeepSpeed's name for balancing by measured
 * time, which it does not implement) is --pp-balance time. */
TEST(pipeline_partition_profile_is_time)
{
    static cli_result r;
    char p[400];
    write_cfg("prof.json", "{\"pipeline\": {\"stages\": 2, \"partition\": \"profile\"}}", p, sizeof p);
    run_cfg(&r, 2, p, NULL, (const char *[]){"--max-steps", "1", "--batch", "4", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] pipeline stages balanced by measured time: stage 0 has units [0, ");
}

TEST(pipeline_flags_over_the_file)
{
    static cli_result r;
    char p[400];
    /* train_batch_size 16 = micro 2 x 8 micro-batches x 1 replica; the flags replace the schedule and the
       micro-batches (--batch 8 in 2 micro-batches of 4 then) */
    write_cfg("ppf.json", "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": 2, "
                          "\"gradient_accumulation_steps\": 8, \"dtrain\": {\"pipeline_parallel_size\": 2, "
                          "\"pipeline_schedule\": \"interleaved\"}}", p, sizeof p);
    run_cfg(&r, 2, p, NULL, (const char *[]){"--max-steps", "1", "--pp-schedule", "gpipe", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0]   dtrain.pipeline_schedule = \"gpipe\"  (--pp-schedule)\n");
    ASSERT_STR_CONTAINS(r.out, "[0] pipeline parallel: 2 stages x 1 data-parallel, schedule gpipe, 8 micro-batches");
    run_cfg(&r, 2, p, NULL, (const char *[]){"--max-steps", "1", "--micro-batches", "2", "--batch", "8", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0]   gradient_accumulation_steps = 2  (--micro-batches)\n");
    ASSERT_STR_CONTAINS(r.out, "[0]   train_micro_batch_size_per_gpu = 4  (--batch)\n");
    ASSERT_STR_CONTAINS(r.out, "schedule interleaved, 2 micro-batches");
    /* --batch with the micro-batches derived from the file's train and micro sizes over 1 replica: 16 / 2 = 8 */
    write_cfg("ppt.json", "{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2, \"pipeline\": "
                          "{\"stages\": 2}}", p, sizeof p);
    run_cfg(&r, 2, p, NULL, (const char *[]){"--max-steps", "1", "--batch", "16", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "schedule 1f1b, 8 micro-batches");
    /* --pp over the file's stages */
    write_cfg("pps.json", "{\"pipeline\": {\"stages\": 4}}", p, sizeof p);
    run_cfg(&r, 2, p, NULL, (const char *[]){"--max-steps", "1", "--pp", "2", "--batch", "4", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0]   pipeline.stages = 2  (--pp)\n");
    ASSERT_STR_CONTAINS(r.out, "[0] pipeline parallel: 2 stages x 1 data-parallel, schedule 1f1b, 4 micro-batches");
}

TEST(pipeline_bad_values_name_the_key)
{
    static cli_result r;
    char p[400];
    struct {
        const char *cfg, *extra, *want;
    } cases[] = {
        {"{\"pipeline\": {\"stages\": 2}, \"zero_optimization\": {\"stage\": 2}}", NULL,
         "do not combine with --zero 2|3 or --fsdp"},
        {"{\"pipeline\": {\"stages\": 2}, \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": "
         "{\"device\": \"cpu\"}}}", NULL, "do not combine with --offload"},
        {"{\"pipeline\": {\"stages\": 2}, \"dtrain\": {\"hybrid_shard\": true}}", NULL,
         "do not combine with --zero 2|3 or --fsdp"},
        {"{\"pipeline\": {\"stages\": 2}, \"gradient_accumulation_steps\": 2}", "--grad-accum",
         "--grad-accum 2 with a pipeline from --config"},
        {"{\"pipeline\": {\"stages\": 3}}", NULL, "key pipeline.stages 3 x dtrain.tensor_parallel_size 1"},
        {"{\"pipeline\": {\"stages\": 2}, \"dtrain\": {\"pipeline_parallel_size\": 4}}", NULL,
         "keys pipeline.stages 2 (from file) and dtrain.pipeline_parallel_size 4 (from file) disagree"},
        {"{\"pipeline\": {\"stages\": 2}, \"dtrain\": {\"data_parallel_size\": 2}}", NULL,
         "key dtrain.data_parallel_size 2 x tensor_parallel_size 1 x pipeline stages 2 is 4 ranks; this job has 2"},
        /* the context-parallel ranks counted and named (was "2 x 1 x 1 is 4 ranks") */
        {"{\"dtrain\": {\"data_parallel_size\": 2, \"context_parallel_size\": 2}}", NULL,
         "key dtrain.data_parallel_size 2 x tensor_parallel_size 1 x pipeline stages 1 x context_parallel_size 2 is "
         "4 ranks; this job has 2"},
        {"{\"dtrain\": {\"pipeline_schedule\": \"gpipe\"}}", NULL,
         "key dtrain.pipeline_schedule \"gpipe\" (from file): a schedule needs pipeline parallelism"},
        {"{\"pipeline\": {\"partition\": \"uniform\"}}", NULL, "key pipeline.partition: not supported yet"},
        {"{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 3, \"pipeline\": {\"stages\": 2}, "
         "\"dtrain\": {\"pipeline_schedule\": \"interleaved\"}}", NULL, "interleaved"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_cfg("bad.json", cases[i].cfg, p, sizeof p);
        const char *extra[] = {"--max-steps", "1", cases[i].extra, cases[i].extra ? "2" : NULL, NULL};
        run_cfg(&r, 2, p, NULL, extra);
        if (r.code == 0 || !strstr(r.err, cases[i].want))
            fprintf(stderr, "case %zu: %s -> %d\n%s\n", i, cases[i].cfg, r.code, r.err);
        ASSERT(r.code != 0);
        ASSERT_STR_CONTAINS(r.err, cases[i].want);
    }
}

TEST(hierarchical_allreduce_from_the_config)
{
    static cli_result r;
    char p[400];
    write_cfg("hier.json", "{\"dtrain\": {\"hierarchical_allreduce\": true}}", p, sizeof p);
    run_cfg(&r, 2, p, NULL, (const char *[]){"--max-steps", "2", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] hierarchical all-reduce: "); /* the netbed code says what it found */
    run_cfg(&r, 2, p, "AIAK_HIERARCHICAL_ALLREDUCE=0", (const char *[]){"--max-steps", "2", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(strstr(r.out, "[0] hierarchical all-reduce: ") == NULL); /* the environment over the file */
}

TEST(batch_relation_and_inference)
{
    static cli_result r;
    char p[400];
    /* train 16 = micro * gas 2 * world 2: micro 4 is derived */
    write_cfg("b.json", "{\"train_batch_size\": 16, \"gradient_accumulation_steps\": 2}", p, sizeof p);
    run_cfg(&r, 2, p, NULL, NULL);
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "batch 4 per rank");
    /* a flag that breaks the relation */
    run_cfg(&r, 1, p, NULL, (const char *[]){"--batch", "5", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "batch sizes disagree: train_batch_size 16 must equal train_micro_batch_size_per_gpu 5 "
                               "* gradient_accumulation_steps 2 * data-parallel world size 1");
    /* an accumulation derived past the trainer's 2^20: named before the setup (it was the trainer's init,
       "grad_accum 2097152 (need >= 1)") */
    write_cfg("g.json", "{\"train_batch_size\": 2097152, \"train_micro_batch_size_per_gpu\": 1}", p, sizeof p);
    run_cfg(&r, 1, p, NULL, NULL);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--config: gradient_accumulation_steps 2097152 (train_batch_size 2097152 / "
                               "train_micro_batch_size_per_gpu 1 / 1 data-parallel ranks): at most 1048576");
    ASSERT(strstr(r.err, "dt_trainer_init") == NULL);
    /* DeepSpeed's old name of the bf16 block turns bf16 on (it was an unknown key: an fp32 run) */
    write_cfg("bf.json", "{\"bfloat16\": {\"enabled\": true}}", p, sizeof p);
    run_cfg(&r, 1, p, NULL, (const char *[]){"--max-steps", "1", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "  bf16.enabled = true  (file)\n");
    ASSERT(strstr(r.err, "unknown key bfloat16") == NULL);
}

/* The text after "train loss (last N steps): " in out, or NAN. */
static double train_loss(const char *out)
{
    const char *p = strstr(out, "train loss (last ");
    p = p ? strstr(p, "): ") : NULL;
    return p ? atof(p + 3) : NAN;
}

/* A Hugging Face Trainer config ("auto" for the batch sizes, the clipping, the optimizer's settings and the
 * precision): each auto key is listed with the value the run uses and where it comes from (they were left out of
 * the listing), and a config holding those values instead trains to the same loss: the listing is what runs. */
TEST(hf_trainer_autos_are_listed_as_run)
{
    static cli_result r;
    char p[400];
    write_cfg("auto.json", "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\", "
                           "\"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\", "
                           "\"fp16\": {\"enabled\": \"auto\"}, \"bf16\": {\"enabled\": \"auto\"}, "
                           "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", "
                           "\"betas\": \"auto\", \"eps\": \"auto\", \"weight_decay\": \"auto\"}}, "
                           "\"zero_optimization\": {\"stage\": 1, \"overlap_comm\": \"auto\", "
                           "\"allgather_bucket_size\": \"auto\"}, \"steps_per_print\": \"auto\"}", p, sizeof p);
    run_cfg(&r, 1, p, NULL, (const char *[]){"--batch", "4", "--grad-accum", "2", "--lr", "0.01", "--max-steps",
                                              "3", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    const char *want[] = {
        "  train_batch_size = 8  (auto: --batch x --grad-accum x ranks)\n",
        "  gradient_clipping = 0  (auto: --clip-grad-norm; 0: off)\n",
        "  fp16.enabled = false  (auto: --precision)\n",
        "  bf16.enabled = false  (auto: --precision)\n",
        "  optimizer.params.betas = [0.9,0.999]  (auto: --betas)\n",
        "  optimizer.params.eps = 1e-08  (auto: --eps)\n",
        "  optimizer.params.weight_decay = 0  (auto: --weight-decay)\n", /* DeepSpeed's FusedAdam default */
        "  zero_optimization.overlap_comm = true  (auto: dtrain's default)\n",
        "  zero_optimization.allgather_bucket_size = 500000000  (auto: dtrain's default)\n",
        "  steps_per_print = 100  (auto: --log-every)\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        ASSERT_STR_CONTAINS(r.out, want[i]);
    ASSERT(!strstr(r.out, "optimizer.params.lr = 0.01  (auto")); /* --lr given: the flag's, not auto */
    ASSERT_STR_CONTAINS(r.out, "optimizer.params.lr = 0.01  (--lr)");
    const double a = train_loss(r.out);
    write_cfg("explicit.json", "{\"train_batch_size\": 8, \"gradient_clipping\": 0, \"fp16\": {\"enabled\": "
                               "false}, \"bf16\": {\"enabled\": false}, \"optimizer\": {\"type\": \"AdamW\", "
                               "\"params\": {\"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0}}, "
                               "\"zero_optimization\": {\"stage\": 1, \"overlap_comm\": true, "
                               "\"allgather_bucket_size\": 500000000}, \"steps_per_print\": 100}", p, sizeof p);
    run_cfg(&r, 1, p, NULL, (const char *[]){"--batch", "4", "--grad-accum", "2", "--lr", "0.01", "--max-steps",
                                              "3", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(isfinite(a));
    ASSERT_NEAR(train_loss(r.out), a, 0, 0);
    /* with the precision left to the CPU (bf16 "auto" alone), the choice is listed */
    write_cfg("bfauto.json", "{\"bf16\": {\"enabled\": \"auto\"}}", p, sizeof p);
    run_cfg(&r, 1, p, NULL, (const char *[]){"--max-steps", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "  bf16.enabled = ");
    ASSERT_STR_CONTAINS(r.out, "  (auto: --precision auto: this CPU's)\n");
}

TEST(precedence_and_environment)
{
    static cli_result r;
    char p[400];
    write_cfg("p.json", "{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.5}},\n \"zero_optimization\": "
                        "{\"stage\": 1, \"foo\": 2}}", p, sizeof p);
    run_cfg(&r, 1, p, "AIAK_FUSED_OPTIMIZER=1", (const char *[]){"--lr", "0.02", "--max-steps", "2", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "sgd lr 0.02"); /* the flag over the file */
    ASSERT_STR_CONTAINS(r.err, "warning: " );
    ASSERT_STR_CONTAINS(r.err, "unknown key zero_optimization.foo");
    ASSERT_STR_CONTAINS(r.err, "AIAK_FUSED_OPTIMIZER: dtrain's optimizers are always fused");
    ASSERT_STR_CONTAINS(r.out, "  dtrain.fused_optimizer = true  (AIAK_FUSED_OPTIMIZER; no effect in dtrain)\n");
    /* a key whose behaviour is not in dtrain train: refused, never ignored */
    write_cfg("zq.json", "{\"zero_optimization\": {\"zero_quantized_weights\": true}}", p, sizeof p);
    run_cfg(&r, 1, p, NULL, NULL);
    ASSERT_EQ_INT(r.code, 2); /* ZeRO++ runs with stage 3 only: refused by name, never ignored */
    ASSERT_STR_CONTAINS(r.err, "ZeRO++ (zero_quantized_weights) needs ZeRO stage 3 (FULL_SHARD); this is stage 0");
    write_cfg("p.json", "{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.5}}}", p, sizeof p);
    run_cfg(&r, 1, p, "AIAK_START_COMPRESS_ITER=soon", NULL);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "AIAK_START_COMPRESS_ITER");
    /* the config's comm hook over ZeRO stage 1: the hook's own refusal (compress owns the behaviour) */
    write_cfg("h.json", "{\"zero_optimization\": {\"stage\": 1}, \"dtrain\": {\"comm_hook\": \"powersgd\", "
                        "\"powersgd_rank\": 2}}", p, sizeof p);
    run_cfg(&r, 1, p, NULL, NULL);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--comm-hook powersgd (or AIAK_*_COMPRESSION) compresses DDP's gradient all-reduce");
    /* a wrong type names the key */
    write_cfg("t.json", "{\"gradient_clipping\": \"1.0\"}", p, sizeof p);
    run_cfg(&r, 1, p, NULL, NULL);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "key gradient_clipping: expected a number");
}

int main(void)
{
    write_data();
    RUN(seed_pasted_unchanged_is_refused_with_line_and_column);
    RUN(batch_relation_and_inference);
    RUN(hf_trainer_autos_are_listed_as_run);
    RUN(activation_checkpointing_keys);
    RUN(dataloader_drop_last);
    RUN(tensor_parallel_from_the_config);
    RUN(hierarchical_allreduce_from_the_config);
    RUN(pipeline_config_equals_the_flags);
    RUN(pipeline_partition_profile_is_time);
    RUN(pipeline_flags_over_the_file);
    RUN(pipeline_bad_values_name_the_key);
    RUN(pipeline_config_with_zero1_and_mixed_precision_equals_the_flags);
    RUN(precedence_and_environment);
    RUN(seed_stage2_activation_checkpointing_trains);
    RUN(seed_stage3_offload_trains);
    cli_cleanup();
    return TEST_REPORT();
}
