/* dtrain plan and dtrain train --plan auto (tools/cmd_plan.c, train_plan.c):
 *   - --json: one object per layout (900 for gpt-micro on 4 ranks with the
 *     default global batch 8: 252 tp with sequence parallelism, 72 of those
 *     with cp; 432 context parallel, 324 ring and 108 Ulysses), ranked 1..n, with mem_per_rank_bytes,
 *     step_ms, the layout fields (cp_impl, sequence_parallel), feasible and reason; the feasible first;
 *   - a --mem-per-rank between DDP's and ZeRO-1's need (computed with the
 *     library on the same calibration file) refuses the DDP layout naming
 *     --mem-per-rank and keeps ZeRO-1 (gpt-micro's 137K parameters are
 *     too few for ZeRO-3 to save memory: its gathered unit and the
 *     transport's staging pages outweigh its shard); the table has its header;
 *   - bad flags exit 2 with a message naming the flag;
 *   - train --plan auto on 2 ranks (no cached calibration: the first rank
 *     measures it, with the collective curve of its own 2-rank group, the
 *     other waits) prints the choice and the runner-up,
 *     trains, and caches the calibration; a layout flag with --plan auto,
 *     or a model the planner does not know, exit 2 naming both;
 *   - the --metrics end record of a GPT run carries predicted_peak_rss_bytes
 *     and predicted_step_ms beside peak_rss_bytes, step_ms and step_cpu_ms;
 *     a run that measures the calibration for it after training says so on
 *     stderr (how long it took, where it is cached), a run that finds it
 *     cached says nothing;
 *   - a config's "dtrain": {"plan": "auto"} runs the planner as --plan auto
 *     does; beside a layout key (from the file or a flag) or with a value
 *     other than "auto" it exits 2 naming the key;
 *   - Llama: dtrain plan --model llama-tiny lists its layouts, and
 *     train --model llama-tiny --plan auto runs the planner's choice;
 *   - dtrain plan --lora-targets: the frozen model's state, the adapters'
 *     (counted), sequence parallelism refused; bad LoRA flags exit 2;
 *   - --plan auto runs sequence parallelism and Ulysses when it chooses
 *     them (made-up calibrations where each wins); it takes the first
 *     layout the run's other options allow (--sample-every refuses cp,
 *     LoRA sequence parallelism) and says what it passed over and why, or
 *     exits 2 when every layout that fits is refused.
 * The calibration of the plan tests is a file the test writes (fixed
 * numbers), so the rows are exact; DT_CACHE_DIR keeps every cache in the
 * test's directory. */
// dt-test-timeout: 600
#include "test.h"
#include "cli_util.h"
#include "train_cli.h"

#include "dtrain/plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>

static char g_calib[400];

/* gpt-micro's shape with made-up costs, for this machine's cores. */
static dt_plan_calib micro_calib(void)
{
    dt_plan_calib c;
    memset(&c, 0, sizeof c);
    snprintf(c.model, sizeof c.model, "gpt-micro");
    cpu_set_t set;
    c.cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    c.seq = 64, c.dtype = DT_F32, c.threads = c.cores;
    c.n_layer = 2, c.n_head = 2, c.n_kv_head = 2, c.n_embd = 64, c.vocab = 512;
    c.numel_block = 49984, c.numel_fixed = 36992;
    c.fb_block_s = 2e-6, c.fb_fixed_s = 3e-6, c.fb_block_ckpt_s = 2.7e-6;
    c.act_block = 9000, c.act_fixed = 12000, c.act_block_ckpt = 300;
    c.optim_s = 2e-9, c.matmul_flops = 1e10, c.copy_bw = 8e9, c.coll_bw = 4e9, c.coll_lat_s = 20e-6;
    c.base_rss = 20e6;
    return c;
}

/* The rows of the last run's whole stdout (cli_result keeps only 64 KiB of it). */
static int parse_lines(const char *unused, cJSON **rows, int cap)
{
    (void)unused;
    static char out[1 << 20];
    char path[400];
    snprintf(path, sizeof path, "%s/cli.out", cli_tmpdir());
    slurp_(path, out, sizeof out);
    int n = 0;
    for (const char *s = out; *s && n < cap;) {
        const char *nl = strchr(s, '\n');
        if (!nl)
            return -1;
        rows[n] = cJSON_ParseWithLength(s, (size_t)(nl - s));
        if (!cJSON_IsObject(rows[n]))
            return -1;
        n++;
        s = nl + 1;
    }
    return n;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static cJSON *g_rows[1024];

TEST(json_shape)
{
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"plan", "--model", "gpt-micro", "--world", "4", "--mem-per-rank", "1G", "--json", "--calib",
                        g_calib, NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    int n = parse_lines(r.out, g_rows, 1024);
    /* tests/plan/test_plan_search's count; the second term context parallel (ring), the third tp with sequence
       parallelism (72 of them with cp 2), the fourth Ulysses (gpt-micro's 2 heads divide over cp 2 only without
       tp) */
    ASSERT_EQ_INT(n, 288 + 252 + 252 + 108);
    bool seen_infeasible = false, seen_cp = false, seen_sp = false, seen_uly = false;
    for (int i = 0; i < n; i++) {
        const cJSON *o = g_rows[i];
        ASSERT_EQ_INT((int)num(o, "rank"), i + 1);
        static const char *const keys[] = {"dp", "cp", "tp", "pp", "zero_stage", "batch", "micro_batches",
                                           "grad_accum", "mem_per_rank_bytes", "step_ms"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            ASSERT(cJSON_IsNumber(cJSON_GetObjectItem(o, keys[k])));
        ASSERT(cJSON_IsBool(cJSON_GetObjectItem(o, "act_ckpt")) && cJSON_IsBool(cJSON_GetObjectItem(o, "offload")) &&
               cJSON_IsBool(cJSON_GetObjectItem(o, "hybrid")));
        const cJSON *f = cJSON_GetObjectItem(o, "feasible"), *why = cJSON_GetObjectItem(o, "reason");
        ASSERT(cJSON_IsBool(f) && cJSON_IsString(why));
        ASSERT(cJSON_IsTrue(f) ? !why->valuestring[0] : why->valuestring[0] != 0);
        if (cJSON_IsFalse(f))
            seen_infeasible = true;
        else
            ASSERT(!seen_infeasible); /* feasible ones first */
        ASSERT_EQ_INT((int)(num(o, "dp") * num(o, "cp") * num(o, "tp") * num(o, "pp")), 4);
        seen_cp |= num(o, "cp") > 1;
        const cJSON *impl = cJSON_GetObjectItem(o, "cp_impl"), *seqp = cJSON_GetObjectItem(o, "sequence_parallel");
        ASSERT(cJSON_IsString(impl) && cJSON_IsBool(seqp));
        if (num(o, "cp") == 1)
            ASSERT_STR_EQ(impl->valuestring, "none");
        else if (num(o, "tp") > 1) /* one head a tp rank: no Ulysses */
            ASSERT_STR_EQ(impl->valuestring, "ring");
        else
            ASSERT(!strcmp(impl->valuestring, "ring") || !strcmp(impl->valuestring, "ulysses"));
        seen_uly |= !strcmp(impl->valuestring, "ulysses");
        seen_sp |= cJSON_IsTrue(seqp);
        ASSERT(!cJSON_IsTrue(seqp) || num(o, "tp") > 1);
        ASSERT(num(o, "mem_per_rank_bytes") > 20e6 && num(o, "step_ms") > 0);
    }
    ASSERT(seen_infeasible && seen_cp && seen_sp && seen_uly);
    ASSERT(cJSON_IsTrue(cJSON_GetObjectItem(g_rows[0], "feasible")));
    for (int i = 0; i < n; i++)
        cJSON_Delete(g_rows[i]);
}

static const cJSON *row(int n, int dp, int zero, int batch, bool ck)
{
    for (int i = 0; i < n; i++)
        if (num(g_rows[i], "dp") == dp && num(g_rows[i], "cp") == 1 && num(g_rows[i], "tp") == 1 &&
            cJSON_IsFalse(cJSON_GetObjectItem(g_rows[i], "sequence_parallel")) &&
            num(g_rows[i], "pp") == 1 &&
            num(g_rows[i], "zero_stage") == zero && num(g_rows[i], "batch") == batch &&
            num(g_rows[i], "grad_accum") == 1 && cJSON_IsTrue(cJSON_GetObjectItem(g_rows[i], "act_ckpt")) == ck &&
            cJSON_IsFalse(cJSON_GetObjectItem(g_rows[i], "offload")) &&
            cJSON_IsFalse(cJSON_GetObjectItem(g_rows[i], "hybrid")))
            return g_rows[i];
    return NULL;
}

TEST(mem_per_rank_refuses_by_name)
{
    dt_plan_calib c = micro_calib();
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 4;
    dt_plan_layout l = {.dp = 4, .tp = 1, .pp = 1, .zero_stage = 0, .batch = 2, .micro_batches = 1, .grad_accum = 1};
    dt_plan_prediction ddp, z3;
    ASSERT_OK(dt_plan_predict(&sp, &c, &l, &ddp));
    l.zero_stage = 1;
    ASSERT_OK(dt_plan_predict(&sp, &c, &l, &z3));
    ASSERT(z3.mem_bytes < ddp.mem_bytes);
    char lim[32];
    snprintf(lim, sizeof lim, "%.0f", (ddp.mem_bytes + z3.mem_bytes) / 2);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"plan", "--model", "gpt-micro", "--world", "4", "--mem-per-rank", lim, "--json", "--calib",
                        g_calib, NULL});
    ASSERT_EQ_INT(r.code, 0);
    int n = parse_lines(r.out, g_rows, 1024);
    ASSERT_EQ_INT(n, 288 + 252 + 252 + 108);
    const cJSON *a = row(n, 4, 0, 2, false), *b = row(n, 4, 1, 2, false);
    ASSERT(a && b);
    ASSERT(cJSON_IsFalse(cJSON_GetObjectItem(a, "feasible")));
    ASSERT_STR_CONTAINS(cJSON_GetObjectItem(a, "reason")->valuestring, "over --mem-per-rank");
    ASSERT(cJSON_IsTrue(cJSON_GetObjectItem(b, "feasible")));
    ASSERT_NEAR(num(a, "mem_per_rank_bytes"), ddp.mem_bytes, 1, 0);
    for (int i = 0; i < n; i++)
        cJSON_Delete(g_rows[i]);
    /* the table */
    cli_runv(&r, 120, NULL,
             (char *[]){"plan", "--model", "gpt-micro", "--world", "4", "--mem-per-rank", lim, "--calib", g_calib,
                        "--all", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "900 layouts:");
    ASSERT_STR_CONTAINS(r.out, "rank  layout");
    ASSERT_STR_CONTAINS(r.out, "over --mem-per-rank");
    ASSERT_STR_CONTAINS(r.out, "   1  dp");
}

TEST(bad_flags_exit_2)
{
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/calib.fifo", cli_tmpdir());
    unlink(fifo);
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    struct {
        char *args[12];
        const char *says;
    } cases[] = {
        {{"plan", "--model", "gpt-micro", NULL}, "--world N is required"},
        {{"plan", "--world", "0", NULL}, "--world"},
        {{"plan", "--world", "two", NULL}, "--world"},
        {{"plan", "--world", "2", "--mem-per-rank", "12Q", NULL}, "--mem-per-rank '12Q'"},
        {{"plan", "--world", "2", "--precision", "fp8", NULL}, "--precision 'fp8'"},
        {{"plan", "--world", "2", "--model", "convnet", NULL}, "--model 'convnet'"},
        {{"plan", "--world", "2", "--model", "gpt-micro", "--seq", "65", NULL}, "--seq 65"},
        {{"plan", "--world", "2", "--global-batch", "0", NULL}, "--global-batch"},
        {{"plan", "--world", "2", "--bogus", NULL}, "unknown option '--bogus'"},
        {{"plan", "--world", NULL}, "--world needs a value"},
        /* a directory: named as one (it was "not a complete file ... delete it to measure again") */
        {{"plan", "--world", "2", "--model", "gpt-micro", "--calib", (char *)cli_tmpdir(), NULL}, "is a directory"},
        /* a FIFO: refused, not opened (the open blocked for ever waiting for a writer) */
        {{"plan", "--world", "2", "--model", "gpt-micro", "--calib", fifo, NULL}, "not a regular file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        cli_runv(&r, 60, NULL, cases[i].args);
        fprintf(stderr, "  case %zu: %s", i, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, cases[i].says);
    }
}

/* A calibration that cannot be cached: measured, said once as not cached,
 * never "cached in" the place it could not be written. */
TEST(calib_not_cached_is_not_said_cached)
{
    char cache[400], where[500];
    snprintf(cache, sizeof cache, "%s/nocache-env", cli_tmpdir());
    snprintf(where, sizeof where, "%s/no-such-dir/x.calib", cli_tmpdir());
    char env[450];
    snprintf(env, sizeof env, "DT_CACHE_DIR=%s", cache);
    cli_result r;
    cli_runv(&r, 120, env, (char *[]){"plan", "--world", "2", "--model", "gpt-micro", "--calib", where, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "(not cached)");
    ASSERT(strstr(r.err, "cached in") == NULL);
    ASSERT(!file_exists(where));
}

static char g_data[400];

static void write_tokens(void)
{
    snprintf(g_data, sizeof g_data, "tokens:%s/tok.bin", cli_tmpdir());
    FILE *f = fopen(g_data + 7, "wb");
    int32_t h[256] = {20240520, 1, 4000};
    fwrite(h, sizeof h, 1, f);
    for (int i = 0; i < 4000; i++) {
        uint16_t t = (uint16_t)((i * 7 + i / 13) % 512);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

static cJSON *end_record(const char *path)
{
    static char text[1 << 16];
    slurp_(path, text, sizeof text);
    char *last = NULL;
    for (char *s = text; (s = strstr(s, "{\"event\":\"end\"")); s++)
        last = s;
    return last ? cJSON_Parse(last) : NULL;
}

TEST(train_plan_auto_two_ranks)
{
    char cache[400], m[400], calib[500];
    snprintf(cache, sizeof cache, "%s/auto-cache", cli_tmpdir());
    ASSERT_EQ_INT(mkdir(cache, 0755), 0);
    setenv("DT_CACHE_DIR", cache, 1); /* empty: the ranks calibrate (one of them) */
    snprintf(m, sizeof m, "%s/auto.jsonl", cli_tmpdir());
    cli_result r;
    cli_run_ranks(&r, 300, "DT_INIT_TIMEOUT=120", 2, 1,
                  (char *const *const[]){(char *[]){"train", "--model", "gpt-micro", "--data", g_data, "--plan",
                                                    "auto", "--batch", "2", "--max-steps", "3", "--no-eval",
                                                    "--metrics", m, "--progress", "none", NULL}});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "--plan auto chose dp");
    ASSERT_STR_CONTAINS(r.err, "--plan auto runner-up dp");
    ASSERT_EQ_INT(t_count(r.err, "--plan auto chose"), 1); /* rank 0 only */
    /* the runner-up's difference is signed ("(+-1.2%)" before), and a choice that is not the fastest
       (the simplest within 5%) is not called the fastest */
    ASSERT(!strstr(r.err, "(+-"));
    ASSERT(strstr(r.err, "); the fastest of ") || strstr(r.err, "); the simplest of those within 5% of the fastest ("));
    if (strstr(r.err, "); the fastest of ")) {
        const char *ru = strstr(r.err, "--plan auto runner-up");
        const char *pc = ru ? strstr(ru, "ms per step (") : NULL;
        ASSERT(pc && pc[13] == '+'); /* the fastest: the runner-up is not faster */
    }
    snprintf(calib, sizeof calib, "%s/plan-gpt-micro-s64-f32.calib", cache);
    ASSERT(file_exists(calib));
    /* the calibration measured the collective curve over its own 2-rank group, from inside a rank of the
       run (whose launcher's RANK and WORLD_SIZE it must not take) */
    char text[4096] = "";
    FILE *f = fopen(calib, "r");
    ASSERT(f != NULL);
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    ASSERT_STR_CONTAINS(text, "dtrain-plan-calib 6\n");
    ASSERT_STR_CONTAINS(text, "\nfault_huge_bw ");
    ASSERT_STR_CONTAINS(text, "\nnonfinite_s ");
    ASSERT_STR_CONTAINS(text, "\ncoll_measured 2\n");
    ASSERT_STR_CONTAINS(text, "\nag_bw ");
    cJSON *e = end_record(m);
    ASSERT(e != NULL);
    ASSERT(num(e, "predicted_peak_rss_bytes") > 0 && num(e, "predicted_step_ms") > 0);
    ASSERT(num(e, "peak_rss_bytes") > 0 && num(e, "step_ms") > 0);
    cJSON_Delete(e);
    setenv("DT_CACHE_DIR", cli_tmpdir(), 1);
}

TEST(train_plan_auto_bad_combinations)
{
    struct {
        char *args[16];
        const char *says[2];
    } cases[] = {
        {{"train", "--model", "gpt-micro", "--data", g_data, "--plan", "auto", "--tp", "2", NULL},
         {"--plan auto and --tp", "give one of the two"}},
        {{"train", "--model", "gpt-micro", "--data", g_data, "--zero", "3", "--plan", "auto", NULL},
         {"--plan auto and --zero", "give one of the two"}},
        {{"train", "--model", "gpt-micro", "--data", g_data, "--plan", "auto", "--sequence-parallel", NULL},
         {"--plan auto and --sequence-parallel", "give one of the two"}},
        {{"train", "--model", "gpt-micro", "--data", g_data, "--cp-impl", "ulysses", "--plan", "auto", NULL},
         {"--plan auto and --cp-impl", "give one of the two"}},
        {{"train", "--model", "gpt-micro", "--data", g_data, "--plan", "auto", "--activation-checkpointing", NULL},
         {"--plan auto and --activation-checkpointing", ""}},
        {{"train", "--model", "mlp", "--plan", "auto", NULL}, {"--plan auto plans the GPT-2 and Llama models", "mlp"}},
        {{"train", "--model", "gpt-micro", "--data", g_data, "--plan", "manual", NULL}, {"--plan", "auto"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        cli_runv(&r, 60, NULL, cases[i].args);
        fprintf(stderr, "  case %zu: %s", i, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, cases[i].says[0]);
        ASSERT_STR_CONTAINS(r.err, cases[i].says[1]);
    }
}

TEST(metrics_end_record_has_predictions)
{
    char m[400];
    snprintf(m, sizeof m, "%s/plain.jsonl", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", g_data, "--batch", "2", "--max-steps", "2",
                        "--no-eval", "--metrics", m, "--progress", "none", NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    cJSON *e = end_record(m);
    ASSERT(e != NULL);
    ASSERT(num(e, "peak_rss_bytes") > 0 && num(e, "step_ms") > 0);
    ASSERT(num(e, "predicted_peak_rss_bytes") > 1e6 && num(e, "predicted_step_ms") > 0);
    ASSERT(num(e, "step_cpu_ms") > 0);
    cJSON_Delete(e);
}

/* The end record's prediction of a run whose calibration was not cached: the calibration is measured by a
   fresh `dtrain plan` process, not inside the trained process, whose resident model and buffers would be
   taken for the baseline of every layout (and cached for later plans: a gpt2-large ZeRO-3 run wrote a
   6.9 GB baseline and predicted 14.2 GB against 7.6 GB measured). Its baseline equals a `dtrain plan`
   calibration's. */
TEST(end_record_calibration_is_a_fresh_process)
{
    char ca[400], cb[400], m[400], fa[500], fb[500];
    snprintf(ca, sizeof ca, "%s/fresh-a", cli_tmpdir());
    snprintf(cb, sizeof cb, "%s/fresh-b", cli_tmpdir());
    ASSERT_EQ_INT(mkdir(ca, 0755), 0);
    ASSERT_EQ_INT(mkdir(cb, 0755), 0);
    snprintf(m, sizeof m, "%s/fresh.jsonl", cli_tmpdir());
    cli_result r;
    setenv("DT_CACHE_DIR", ca, 1);
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--seq", "16", "--data", g_data, "--batch", "32",
                        "--max-steps", "2", "--no-eval", "--metrics", m, "--progress", "none", NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    /* it says what the wait after training is (minutes for a large model) and where the result went */
    ASSERT_STR_CONTAINS(r.err, "dtrain train: planner: measuring the calibration of llama-tiny at seq 16 for the "
                               "metrics' predicted_step_ms (once on this machine; DT_PLAN_PREDICT=0 skips it)...");
    ASSERT_STR_CONTAINS(r.err, "dtrain train: planner: the calibration measured in ");
    ASSERT_STR_CONTAINS(r.err, "; cached in ");
    ASSERT_STR_CONTAINS(r.err, ca);
    /* the next run finds it cached: no measurement, nothing said */
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--seq", "16", "--data", g_data, "--batch", "32",
                        "--max-steps", "1", "--no-eval", "--metrics", m, "--progress", "none", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(strstr(r.err, "calibration") == NULL);
    setenv("DT_CACHE_DIR", cb, 1);
    cli_runv(&r, 120, NULL, (char *[]){"plan", "--model", "llama-tiny", "--seq", "16", "--world", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    setenv("DT_CACHE_DIR", cli_tmpdir(), 1);
    snprintf(fa, sizeof fa, "%s/plan-llama-tiny-s16-f32.calib", ca);
    snprintf(fb, sizeof fb, "%s/plan-llama-tiny-s16-f32.calib", cb);
    dt_plan_calib a, b;
    ASSERT_OK(dt_plan_calib_load(fa, "llama-tiny", 16, DT_F32, &a));
    ASSERT_OK(dt_plan_calib_load(fb, "llama-tiny", 16, DT_F32, &b));
    fprintf(stderr, "  baseline: after training %.1f MiB, dtrain plan %.1f MiB\n", a.base_rss / 1048576.0,
            b.base_rss / 1048576.0);
    ASSERT(fabs(a.base_rss - b.base_rss) < 4.0 * 1048576);
    ASSERT_EQ_INT(a.threads, b.threads);
    cJSON *e = end_record(m);
    ASSERT(e && num(e, "predicted_peak_rss_bytes") > 1e6);
    cJSON_Delete(e);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

TEST(config_plan_auto)
{
    char cfg[400], m[400];
    snprintf(cfg, sizeof cfg, "%s/auto.json", cli_tmpdir());
    snprintf(m, sizeof m, "%s/cfg-auto.jsonl", cli_tmpdir());
    write_file(cfg, "{\"train_batch_size\": 2, \"dtrain\": {\"plan\": \"auto\"}}");
    cli_result r;
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", g_data, "--config", cfg, "--max-steps", "2",
                        "--no-eval", "--metrics", m, "--progress", "none", NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "--plan auto chose dp1 tp1 pp1");
    ASSERT_STR_CONTAINS(r.out, "dtrain.plan = \"auto\"  (file)"); /* the effective config shows it */
    cJSON *e = end_record(m);
    ASSERT(e && num(e, "predicted_step_ms") > 0);
    cJSON_Delete(e);
    /* --plan auto beside --config is the same key (no longer refused) */
    write_file(cfg, "{\"train_batch_size\": 2}");
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", g_data, "--config", cfg, "--plan", "auto",
                        "--max-steps", "1", "--no-eval", "--progress", "none", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "--plan auto chose");
    struct {
        const char *json;
        char *flag[3];
        const char *says[2];
    } cases[] = {
        {"{\"dtrain\": {\"plan\": \"auto\", \"tensor_parallel_size\": 1}}", {NULL},
         {"dtrain.tensor_parallel_size", "give one of the two"}},
        {"{\"dtrain\": {\"plan\": \"auto\"}, \"zero_optimization\": {\"stage\": 1}}", {NULL},
         {"zero_optimization.stage", "dtrain.plan"}},
        {"{\"dtrain\": {\"plan\": \"auto\"}}", {"--zero", "1", NULL}, {"zero_optimization.stage", "a flag"}},
        {"{\"zero_optimization\": {\"stage\": 1}}", {"--plan", "auto", NULL}, {"zero_optimization.stage", "dtrain.plan"}},
        {"{\"dtrain\": {\"plan\": \"manual\"}}", {NULL}, {"dtrain.plan", "manual"}},
        {"{\"dtrain\": {\"plan\": 1}}", {NULL}, {"dtrain.plan", ""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(cfg, cases[i].json);
        char *args[16] = {"train", "--model", "gpt-micro", "--data", g_data, "--config", cfg, "--max-steps", "1",
                          "--no-eval", NULL};
        int k = 10;
        for (int j = 0; cases[i].flag[j]; j++)
            args[k++] = cases[i].flag[j];
        args[k] = NULL;
        cli_runv(&r, 60, NULL, args);
        fprintf(stderr, "  case %zu: %s", i, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, cases[i].says[0]);
        ASSERT_STR_CONTAINS(r.err, cases[i].says[1]);
    }
}

/* Runs `dtrain train --plan auto` on 2 ranks with calibration c cached for gpt-micro at 64 tokens and a
 * DT_PLAN_MEM_PER_RANK of mem; first checks that the library's search under the same parameters chooses a
 * layout whose text holds `want`, then that the run chose it, said so, and trained. */
static void auto_runs(const dt_plan_calib *c, double mem, const char *want, const char *name, const char *says)
{
    char cache[400], path[500], env[64], m[400];
    snprintf(cache, sizeof cache, "%s/%s-cache", cli_tmpdir(), name);
    ASSERT_EQ_INT(mkdir(cache, 0755), 0);
    snprintf(path, sizeof path, "%s/plan-gpt-micro-s64-f32.calib", cache);
    ASSERT_OK(dt_plan_calib_save(c, path));
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = 2, sp.ranks_per_machine = 2, sp.global_batch = 2, sp.mem_per_rank = (size_t)mem;
    dt_plan_prediction *rows = NULL;
    int n = 0;
    ASSERT_OK(dt_plan_search(&sp, c, &rows, &n));
    char buf[160];
    ASSERT(n > 0 && rows[0].feasible);
    ASSERT_STR_CONTAINS(dt_plan_layout_str(&rows[0].layout, buf, sizeof buf), want);
    dt_free(rows);
    setenv("DT_CACHE_DIR", cache, 1);
    snprintf(env, sizeof env, "DT_PLAN_MEM_PER_RANK=%.0f", mem);
    snprintf(m, sizeof m, "%s/%s.jsonl", cli_tmpdir(), name);
    cli_result r;
    cli_run_ranks(&r, 300, env, 2, 1,
                  (char *const *const[]){(char *[]){"train", "--model", "gpt-micro", "--data", g_data, "--plan", "auto",
                                                    "--batch", "1", "--optimizer", "adamw", "--max-steps", "2",
                                                    "--no-eval", "--metrics", m, "--progress", "plain", NULL}});
    setenv("DT_CACHE_DIR", cli_tmpdir(), 1);
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    char chose[200];
    snprintf(chose, sizeof chose, "--plan auto chose %s", buf);
    ASSERT_STR_CONTAINS(r.err, chose);
    ASSERT_STR_CONTAINS(r.out, says); /* the run's own line: what it set up */
    cJSON *e = end_record(m);
    ASSERT(e && num(e, "predicted_step_ms") > 0 && num(e, "step_ms") > 0);
    cJSON_Delete(e);
}

/* --plan auto runs what it chose, sequence parallelism and Ulysses included: calibrations made up so that each
 * wins (the library's search says so first), and the run prints that choice and trains with it */
TEST(train_plan_auto_runs_sp_and_ulysses)
{
    char cache[400], env[64];
    cli_result r;
    /* Ulysses: activations so large that only half a sample's positions fit a rank (cp 2 with 2 accumulated
       forwards of one sample), all-reduce calls slow (the ring's steps) and all-gathers fast (the all-to-alls) */
    dt_plan_calib c = micro_calib();
    c.act_block = c.act_block_ckpt = 1e6, c.act_fixed = 1e6;
    c.coll_lat_s = 10e-3, c.ag_bw = c.rs_bw = 1e12, c.ag_lat_s = c.rs_lat_s = 1e-6, c.copy_bw = 1e12;
    const double base = c.base_rss + 16.0 * (2 * c.numel_block + c.numel_fixed) * 2;
    /* 36 positions' activations: cp 2's 32 fit, a pipeline stage's 2 micro-batches of 64 do not */
    auto_runs(&c, base + 36 * (2 * 1e6 + 1e6), "dp1 cp2 ulysses tp1", "auto_uly",
              "context parallel: 2 ranks per sequence (each holds 1/2 of the positions), ulysses attention");
    /* --sample-every generates on one rank: no context parallelism. Within 48 positions the pipeline fits and runs,
       said to be the first layout without context parallelism; within 36 nothing else fits */
    snprintf(cache, sizeof cache, "%s/auto_uly-cache", cli_tmpdir());
    setenv("DT_CACHE_DIR", cache, 1);
    for (int tight = 0; tight < 2; tight++) {
        snprintf(env, sizeof env, "DT_PLAN_MEM_PER_RANK=%.0f", base + (tight ? 36 : 48) * (2 * 1e6 + 1e6));
        cli_run_ranks(&r, 300, env, 2, 1,
                      (char *const *const[]){(char *[]){"train", "--model", "gpt-micro", "--data", g_data, "--plan",
                                                        "auto", "--batch", "1", "--optimizer", "adamw", "--max-steps",
                                                        "2", "--sample-every", "1", "--no-eval", "--progress", "none",
                                                        NULL}});
        if (r.code != (tight ? 2 : 0))
            fprintf(stderr, "%s%s", r.out, r.err);
        ASSERT_EQ_INT(r.code, tight ? 2 : 0);
        if (tight)
            ASSERT_STR_CONTAINS(r.err, "is one this run's other options refuse; the first, dp1 cp2 ulysses tp1");
        else
            ASSERT_STR_CONTAINS(r.err, "; the first this run's other options allow (refused: dp1 cp2 ulysses tp1");
        ASSERT_STR_CONTAINS(r.err, "--cp 2 does not combine with --sample-every");
    }
    setenv("DT_CACHE_DIR", cli_tmpdir(), 1);
    /* sequence parallelism: a model state that fits a rank only split in two (tp or pp), ZeRO's page faults
       slow, all-reduce calls slow (tp's four a block) and all-gathers and reduce-scatters fast */
    c = micro_calib();
    c.numel_block = 2e7, c.fault_bw = c.fault_huge_bw = 1e6;
    c.coll_lat_s = 10e-3, c.ag_bw = c.rs_bw = 1e12, c.ag_lat_s = c.rs_lat_s = 1e-6;
    auto_runs(&c, c.base_rss + 12.0 * (2 * c.numel_block + c.numel_fixed), "dp1 tp2 sp pp1", "auto_sp",
              "; sequence parallel (each holds 1/N of the tokens between the blocks)");
    /* with LoRA the model's parameters are frozen: its state fits a rank whole (no split needed), and sequence
       parallelism, which LoRA refuses, is not chosen */
    snprintf(cache, sizeof cache, "%s/auto_sp-cache", cli_tmpdir());
    setenv("DT_CACHE_DIR", cache, 1);
    snprintf(env, sizeof env, "DT_PLAN_MEM_PER_RANK=%.0f", c.base_rss + 12.0 * (2 * c.numel_block + c.numel_fixed));
    cli_run_ranks(&r, 300, env, 2, 1,
                  (char *const *const[]){(char *[]){"train", "--model", "gpt-micro", "--data", g_data, "--plan", "auto",
                                                    "--batch", "1", "--optimizer", "adamw", "--max-steps", "2",
                                                    "--lora-targets", "c_attn", "--no-eval", "--progress", "plain",
                                                    NULL}});
    setenv("DT_CACHE_DIR", cli_tmpdir(), 1);
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "--plan auto chose dp2 tp1 pp1");
    ASSERT(!strstr(r.out, "sequence parallel (each holds"));
}

/* dtrain plan --lora-targets: the adapters measured and said, the frozen model's state in every row (DDP's far
 * below the full model's), sequence parallelism refused by name; bad targets and a lone --lora-r exit 2 */
TEST(plan_lora)
{
    cli_result r;
    cli_runv(&r, 120, NULL, (char *[]){"plan", "--model", "gpt-micro", "--world", "2", "--json", "--calib", g_calib,
                                       NULL});
    ASSERT_EQ_INT(r.code, 0);
    int n = parse_lines(r.out, g_rows, 1024);
    ASSERT(n > 10);
    double full = -1;
    for (int i = 0; i < n; i++) {
        if (num(g_rows[i], "dp") == 2 && num(g_rows[i], "zero_stage") == 0 && num(g_rows[i], "grad_accum") == 1 &&
            cJSON_IsFalse(cJSON_GetObjectItem(g_rows[i], "act_ckpt")))
            full = num(g_rows[i], "state_bytes");
        cJSON_Delete(g_rows[i]);
    }
    cli_runv(&r, 120, NULL, (char *[]){"plan", "--model", "gpt-micro", "--world", "2", "--json", "--calib", g_calib,
                                       "--lora-targets", "c_attn", NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    n = parse_lines(r.out, g_rows, 1024);
    double lora = -1;
    bool sp_listed = false; /* sequence parallelism with LoRA: a feasible layout */
    for (int i = 0; i < n; i++) {
        if (num(g_rows[i], "dp") == 2 && num(g_rows[i], "zero_stage") == 0 && num(g_rows[i], "grad_accum") == 1 &&
            cJSON_IsFalse(cJSON_GetObjectItem(g_rows[i], "act_ckpt")))
            lora = num(g_rows[i], "state_bytes");
        sp_listed |= cJSON_IsTrue(cJSON_GetObjectItem(g_rows[i], "sequence_parallel")) &&
                     cJSON_IsTrue(cJSON_GetObjectItem(g_rows[i], "feasible"));
        cJSON_Delete(g_rows[i]);
    }
    /* gpt-micro: 136960 parameters; c_attn's adapters r 8 x (64 + 192) a block, 2 blocks */
    ASSERT_NEAR(full, 16.0 * 136960, 64, 0);
    ASSERT_NEAR(lora, 4.0 * 136960 + 16.0 * 2 * 8 * (64 + 192), 64, 0);
    ASSERT(sp_listed);
    cli_runv(&r, 120, NULL, (char *[]){"plan", "--model", "gpt-micro", "--world", "2", "--calib", g_calib,
                                       "--lora-targets", "c_attn", "--lora-r", "4", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out,
                        "LoRA on c_attn (r 4): 1024 adapter parameters a block train, the model's 136960 frozen");
    cli_runv(&r, 120, NULL, (char *[]){"plan", "--model", "gpt-micro", "--world", "2", "--calib", g_calib,
                                       "--lora-targets", "q_proj", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-targets q_proj");
    cli_runv(&r, 120, NULL, (char *[]){"plan", "--model", "gpt-micro", "--world", "2", "--lora-r", "4", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-r goes with --lora-targets");
}

TEST(llama_plan_and_auto)
{
    cli_result r;
    cli_runv(&r, 120, NULL, (char *[]){"plan", "--model", "llama-tiny", "--seq", "32", "--world", "2", "--json", NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    int n = parse_lines(r.out, g_rows, 1024);
    ASSERT(n > 10);
    ASSERT(cJSON_IsTrue(cJSON_GetObjectItem(g_rows[0], "feasible")) && num(g_rows[0], "step_ms") > 0);
    for (int i = 0; i < n; i++)
        cJSON_Delete(g_rows[i]);
    char m[400];
    snprintf(m, sizeof m, "%s/llama-auto.jsonl", cli_tmpdir());
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--seq", "32", "--data", g_data, "--plan", "auto", "--batch",
                        "2", "--max-steps", "2", "--no-eval", "--metrics", m, "--progress", "none", NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "--plan auto chose dp1");
    cJSON *e = end_record(m);
    ASSERT(e && num(e, "predicted_peak_rss_bytes") > 1e6 && num(e, "predicted_step_ms") > 0);
    cJSON_Delete(e);
}

int main(void)
{
    if (!getenv("DT_CLI")) {
        fprintf(stderr, "DT_CLI is not set\n");
        return 1;
    }
    setenv("DT_CACHE_DIR", cli_tmpdir(), 1);
    snprintf(g_calib, sizeof g_calib, "%s/micro.calib", cli_tmpdir());
    dt_plan_calib c = micro_calib();
    if (dt_plan_calib_save(&c, g_calib) < 0) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    write_tokens();
    RUN(json_shape);
    RUN(mem_per_rank_refuses_by_name);
    RUN(bad_flags_exit_2);
    RUN(calib_not_cached_is_not_said_cached);
    RUN(train_plan_auto_two_ranks);
    RUN(train_plan_auto_bad_combinations);
    RUN(end_record_calibration_is_a_fresh_process);
    RUN(metrics_end_record_has_predictions);
    RUN(config_plan_auto);
    RUN(llama_plan_and_auto);
    RUN(train_plan_auto_runs_sp_and_ulysses);
    RUN(plan_lora);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
