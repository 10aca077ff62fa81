/* The DeepSpeed-style config (config.h): the seed configs (003) as users
 * paste them and fixed, every key group mapped into the params structs it
 * names, DeepSpeed's batch relation, the precedence file < command line <
 * environment (AIAK_*, seed 004), and bad configs: syntax errors with a
 * line and column, wrong types, out-of-range values, unknown keys,
 * duplicate keys, values dtrain cannot honour yet. */
#include "dtrain/config.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/train.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DATA DT_SOURCE_DIR "/tests/config/data/"

static dt_config *load_str(const char *text, dt_status *st)
{
    dt_config *c = NULL;
    *st = DT_ERR_INTERNAL;
    if (dt_config_init(&c) < 0)
        return NULL;
    *st = dt_config_load_string(c, "t.json", text, strlen(text));
    return c;
}

static bool has_warning(const dt_config *c, const char *needle)
{
    for (size_t i = 0; i < dt_config_num_warnings(c); i++)
        if (strstr(dt_config_warning(c, i), needle))
            return true;
    return false;
}

/* ---- the seed configs -------------------------------------------------------------- */

TEST(seed_pasted_unchanged_names_line_and_column)
{
    dt_config *c;
    ASSERT_OK(dt_config_init(&c));
    ASSERT_STATUS(dt_config_load_file(c, DATA "seed_zero3_offload.json"), DT_ERR_FORMAT);
    /* the comma is missing at the end of line 17; cJSON stops at the next key, line 18 column 3 */
    ASSERT_STR_CONTAINS(dt_last_error(), "seed_zero3_offload.json:18:3:");
    ASSERT_STR_CONTAINS(dt_last_error(), "missing ','");
    ASSERT_STR_CONTAINS(dt_last_error(), "\"wall_clock_breakdown\" (line 17)");
    ASSERT_EQ_INT(dt_config_origin_of(c, "zero_optimization.stage"), DT_CONFIG_UNSET); /* nothing taken */
    dt_config_free(c);
}

TEST(seed_zero3_offload_fixed)
{
    dt_config *c;
    ASSERT_OK(dt_config_init(&c));
    ASSERT_OK(dt_config_load_file(c, DATA "seed_zero3_offload_fixed.json")); /* # comments, trailing comma */
    ASSERT_EQ_INT(dt_config_num_warnings(c), 0);
    int stage = 0;
    dt_zero_params zp = dt_zero_params_default();
    ASSERT_OK(dt_config_zero_params(c, &stage, &zp));
    ASSERT_EQ_INT(stage, 3);
    ASSERT_EQ_INT(zp.stage, 3);
    ASSERT(zp.overlap_comm && zp.contiguous_gradients);
    ASSERT_EQ_U64(zp.sub_group_size, 1000000000u);
    ASSERT_EQ_U64(zp.max_live_parameters, 1000000000u);
    ASSERT_EQ_U64(zp.max_reuse_distance, 1000000000u);
    /* "auto": dtrain's defaults stay */
    dt_zero_params def = dt_zero_params_default();
    ASSERT_EQ_U64(zp.reduce_bucket_size, def.reduce_bucket_size);
    ASSERT_EQ_U64(zp.prefetch_bucket_size, def.prefetch_bucket_size);
    ASSERT_EQ_U64(zp.param_persistence_threshold, def.param_persistence_threshold);
    dt_offload_params op = dt_offload_params_default();
    ASSERT_OK(dt_config_offload_params(c, &op));
    ASSERT_EQ_INT(op.device, DT_OFFLOAD_CPU);
    ASSERT(op.pin_memory);
    ASSERT_EQ_U64(op.sub_group_size, 1000000000u);
    int64_t spp;
    bool wcb = true;
    ASSERT_OK(dt_config_get_int(c, "steps_per_print", &spp));
    ASSERT_EQ_INT(spp, 100000);
    ASSERT_OK(dt_config_get_bool(c, "wall_clock_breakdown", &wcb));
    ASSERT(!wcb);
    bool g16 = false;
    ASSERT_OK(dt_config_get_bool(c, "zero_optimization.gather_16bit_weights_on_model_save", &g16));
    ASSERT(g16);
    ASSERT_EQ_INT(dt_config_origin_of(c, "zero_optimization.offload_param.device"), DT_CONFIG_FROM_FILE);
    dt_config_free(c);
}

TEST(seed_zero3)
{
    dt_config *c;
    ASSERT_OK(dt_config_init(&c));
    ASSERT_OK(dt_config_load_file(c, DATA "seed_zero3.json"));
    ASSERT_EQ_INT(dt_config_num_warnings(c), 0);
    int stage = 0;
    dt_zero_params zp = dt_zero_params_default();
    ASSERT_OK(dt_config_zero_params(c, &stage, &zp));
    ASSERT_EQ_INT(stage, 3);
    bool g16 = false;
    ASSERT_OK(dt_config_get_bool(c, "zero_optimization.stage3_gather_16bit_weights_on_model_save", &g16));
    ASSERT(g16);
    /* fp16.enabled "auto": the caller's precision; the scaler knobs are taken */
    dt_dtype dt;
    ASSERT_STATUS(dt_config_precision(c, &dt), DT_ERR_NOT_FOUND);
    dt_trainer_params tp = dt_trainer_params_default();
    tp.precision.param_dtype = DT_F16;
    tp.use_scaler = true;
    ASSERT_OK(dt_trainer_params_apply_config(c, &tp));
    ASSERT(tp.use_scaler);
    ASSERT_NEAR(tp.scaler.loss_scale, 0, 0, 0);
    ASSERT_EQ_INT(tp.scaler.initial_scale_power, 16);
    ASSERT_EQ_INT(tp.scaler.loss_scale_window, 1000);
    ASSERT_EQ_INT(tp.scaler.hysteresis, 2);
    ASSERT_NEAR(tp.scaler.min_loss_scale, 1, 0, 0);
    /* the batch keys are all "auto": the command line's values */
    dt_config_batch b;
    ASSERT_OK(dt_config_batch_resolve(c, 2, 8, 3, &b));
    ASSERT_EQ_INT(b.micro_batch, 8);
    ASSERT_EQ_INT(b.grad_accum, 3);
    ASSERT_EQ_INT(b.train_batch_size, 48);
    dt_config_free(c);
}

TEST(seed_zero2_activation_checkpointing)
{
    dt_config *c;
    ASSERT_OK(dt_config_init(&c));
    ASSERT_OK(dt_config_load_file(c, DATA "seed_zero2_actckpt.json")); /* a # comment line */
    ASSERT_EQ_INT(dt_config_num_warnings(c), 0);
    int stage = 0;
    dt_zero_params zp = dt_zero_params_default();
    ASSERT_OK(dt_config_zero_params(c, &stage, &zp));
    ASSERT_EQ_INT(stage, 2);
    ASSERT(!zp.overlap_comm);
    ASSERT_EQ_U64(zp.reduce_bucket_size, 50000000u);
    ASSERT_EQ_U64(zp.allgather_bucket_size, 50000000u);
    ASSERT(zp.round_robin_gradients);
    bool on = false;
    dt_act_ckpt_params ap = dt_act_ckpt_params_default();
    ASSERT_OK(dt_config_act_ckpt(c, &on, &ap));
    ASSERT(on);
    ASSERT(!ap.partition_activations); /* over a model-parallel group of one: nothing to split */
    ASSERT(ap.cpu_checkpointing && ap.contiguous_memory_optimization && ap.synchronize_checkpoint_boundary);
    ASSERT(!ap.profile);
    ASSERT_EQ_INT(ap.number_checkpoints, 0); /* null: all */
    /* the four keys that do nothing on a CPU: one note each, with the reason */
    ASSERT_EQ_INT(dt_config_num_warnings(c), 4);
    ASSERT_STR_CONTAINS(dt_config_warning(c, 0), "activation_checkpointing.partition_activations: no effect here: "
                                                 "no model-parallel group");
    ASSERT_STR_CONTAINS(dt_config_warning(c, 1), "activation_checkpointing.cpu_checkpointing: no effect here: ");
    ASSERT_STR_CONTAINS(dt_config_warning(c, 2), "contiguous_memory_optimization: no effect here: ");
    ASSERT_STR_CONTAINS(dt_config_warning(c, 3), "synchronize_checkpoint_boundary: no effect here: ");
    ASSERT_OK(dt_config_act_ckpt(c, &on, &ap)); /* said once */
    ASSERT_EQ_INT(dt_config_num_warnings(c), 4);
    dt_config_free(c);
}

/* ---- syntax ----------------------------------------------------------------------------- */

TEST(syntax_errors)
{
    struct {
        const char *text, *where, *what;
    } cases[] = {
        {"{\n  \"a\": 1\n", "t.json:3:1:", "end of the file"},
        {"{\"fp16\": {\"enabled\": true}\n \"bf16\": {}}", "t.json:2:2:", "missing ',' after the value"},
        {"{\"train_batch_size\": 8 \"x\": 1}", "t.json:1:24:", "\"train_batch_size\""},
        {"{\"a\": \"abc\n}", "t.json:1:7:", "string is not closed"},
        {"{\"a\": }", "t.json:1:7:", "expected a value after ':'"},
        {"{\"a\": 1}}", "t.json:1:9:", "after the end"},
        {"{# 注释\n  \"a\" 1}", "t.json:2:7:", "expected ':' after a key"},
        {"{\"a\": \"注释\" \"b\": 1}", "t.json:1:12:", "after the value of \"a\""}, /* columns count characters */
        {"[1, 2]", "t.json", "must be a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_status st = DT_ERR_INTERNAL;
        dt_config *c = load_str(cases[i].text, &st);
        ASSERT(c);
        ASSERT_EQ_INT(st, DT_ERR_FORMAT);
        ASSERT_STR_CONTAINS(dt_last_error(), cases[i].where);
        ASSERT_STR_CONTAINS(dt_last_error(), cases[i].what);
        dt_config_free(c);
    }
}

TEST(comments_and_trailing_commas)
{
    dt_status st = DT_ERR_INTERNAL;
    dt_config *c = load_str("// a comment\n{\n  \"zero_optimization\": { # the stage\n    \"stage\": 1, // one\n"
                            "    \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp/a#b//c\",},\n  },\n"
                            "}\n# end\n",
                            &st);
    ASSERT_OK(st);
    const char *p = NULL;
    ASSERT_OK(dt_config_get_str(c, "zero_optimization.offload_optimizer.nvme_path", &p));
    ASSERT_STR_EQ(p, "/tmp/a#b//c"); /* inside a string: not a comment */
    dt_offload_params op = dt_offload_params_default();
    ASSERT_OK(dt_config_offload_params(c, &op));
    ASSERT_EQ_INT(op.device, DT_OFFLOAD_NVME);
    ASSERT_STR_EQ(op.nvme_path, "/tmp/a#b//c");
    dt_config_free(c);
}

/* ---- keys: unknown, types, ranges, support --------------------------------------------- */

TEST(unknown_keys_warn_with_full_path)
{
    dt_status st = DT_ERR_INTERNAL;
    dt_config *c = load_str("{\"zero_optimization\": {\"stage\": 2, \"foo\": 1}, \"bar\": {\"x\": 1},"
                            " \"optimizer\": {\"params\": {\"lrr\": 0.1}}}", &st);
    ASSERT_OK(st);
    ASSERT_EQ_INT(dt_config_num_warnings(c), 3);
    ASSERT(has_warning(c, "unknown key zero_optimization.foo"));
    ASSERT(has_warning(c, "unknown key bar "));
    ASSERT(has_warning(c, "unknown key optimizer.params.lrr (ignored); did you mean optimizer.params.lr?"));
    ASSERT(!has_warning(c, "did you mean zero")); /* foo, bar: nothing near */
    int64_t s = 0;
    ASSERT_OK(dt_config_get_int(c, "zero_optimization.stage", &s));
    ASSERT_EQ_INT(s, 2);
    dt_config_free(c);
    /* a key dtrain would have used, misspelled (a block, a name cut short): the warning names the key */
    c = load_str("{\"zero_optimisation\": {\"stage\": 3}, \"train_micro_batch_size\": 4, "
                 "\"gradient_acumulation_steps\": 2}", &st);
    ASSERT_OK(st);
    ASSERT(has_warning(c, "unknown key zero_optimisation (ignored); did you mean zero_optimization?"));
    ASSERT(has_warning(c, "unknown key train_micro_batch_size (ignored); did you mean "
                          "train_micro_batch_size_per_gpu?"));
    ASSERT(has_warning(c, "unknown key gradient_acumulation_steps (ignored); did you mean "
                          "gradient_accumulation_steps?"));
    dt_config_free(c);
}

TEST(wrong_types_and_ranges_name_the_key)
{
    struct {
        const char *text, *key;
        dt_status want;
    } cases[] = {
        {"{\"zero_optimization\": {\"stage\": \"two\"}}", "key zero_optimization.stage: expected an integer",
         DT_ERR_INVALID_ARG},
        {"{\"zero_optimization\": {\"stage\": 4}}", "key zero_optimization.stage", DT_ERR_INVALID_ARG},
        {"{\"zero_optimization\": {\"stage\": 2.5}}", "key zero_optimization.stage", DT_ERR_INVALID_ARG},
        {"{\"fp16\": {\"enabled\": 1}}", "key fp16.enabled: expected true or false", DT_ERR_INVALID_ARG},
        {"{\"fp16\": {\"initial_scale_power\": 200}}", "key fp16.initial_scale_power", DT_ERR_INVALID_ARG},
        {"{\"fp16\": {\"min_loss_scale\": 0}}", "key fp16.min_loss_scale", DT_ERR_INVALID_ARG},
        {"{\"train_batch_size\": 0}", "key train_batch_size", DT_ERR_INVALID_ARG},
        {"{\"train_batch_size\": \"big\"}", "or \"auto\"", DT_ERR_INVALID_ARG},
        {"{\"gradient_clipping\": -1}", "key gradient_clipping", DT_ERR_INVALID_ARG},
        {"{\"optimizer\": {\"type\": \"Adagrad\"}}", "key optimizer.type: expected one of", DT_ERR_INVALID_ARG},
        {"{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}", "key optimizer.params.betas", DT_ERR_INVALID_ARG},
        {"{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.5]}}}", "key optimizer.params.betas", DT_ERR_INVALID_ARG},
        {"{\"zero_optimization\": 3}", "key zero_optimization: expected an object", DT_ERR_INVALID_ARG},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"gpu\"}}}",
         "key zero_optimization.offload_optimizer.device", DT_ERR_INVALID_ARG},
        {"{\"fp16\": {\"hysteresis\": 2, \"hysteresis\": 3}}", "key fp16.hysteresis appears twice", DT_ERR_FORMAT},
        {"{\"prescale_gradients\": true}", "key prescale_gradients: not supported yet", DT_ERR_UNSUPPORTED},
        {"{\"amp\": {\"enabled\": true}}", "key amp.enabled: not supported yet", DT_ERR_UNSUPPORTED},
        {"{\"zero_optimization\": {\"offload_param\": {\"device\": \"disk\"}}}",
         "key zero_optimization.offload_param.device", DT_ERR_INVALID_ARG},
        {"{\"dtrain\": {\"pipeline_parallel_size\": 0}}", "key dtrain.pipeline_parallel_size: expected an integer",
         DT_ERR_INVALID_ARG},
        {"{\"dtrain\": {\"pipeline_schedule\": \"pipedream\"}}", "key dtrain.pipeline_schedule: expected one of",
         DT_ERR_INVALID_ARG},
        {"{\"dtrain\": {\"micro_batches\": 4}}", "key dtrain.micro_batches: with pipeline parallelism "
         "gradient_accumulation_steps is the number of micro-batches", DT_ERR_INVALID_ARG},
        {"{\"pipeline\": {\"stages\": 0}}", "key pipeline.stages: expected an integer in [1, 256] or \"auto\"",
         DT_ERR_INVALID_ARG},
        {"{\"pipeline\": {\"partition\": \"uniform\"}}", "key pipeline.partition: not supported yet (dtrain "
         "balances the stages by parameter count", DT_ERR_UNSUPPORTED},
        {"{\"pipeline\": {\"partition\": \"type:Block\"}}", "key pipeline.partition: not supported yet",
         DT_ERR_UNSUPPORTED},
        {"{\"pipeline\": {\"partition\": \"fastest\"}}", "key pipeline.partition: expected \"parameters\"",
         DT_ERR_INVALID_ARG},
        {"{\"pipeline\": {\"seed_layers\": true}}", "key pipeline.seed_layers: not supported yet",
         DT_ERR_UNSUPPORTED},
        {"{\"pipeline\": {\"activation_checkpoint_interval\": -1}}", "key pipeline.activation_checkpoint_interval",
         DT_ERR_INVALID_ARG},
        {"{\"pipeline\": {\"pipe_partitioned\": \"yes\"}}", "key pipeline.pipe_partitioned: expected true or false",
         DT_ERR_INVALID_ARG},
        {"{\"dtrain\": {\"data_parallel_size\": 0}}", "key dtrain.data_parallel_size", DT_ERR_INVALID_ARG},
        {"{\"dtrain\": {\"comm_hook\": \"topk\"}}", "key dtrain.comm_hook: expected one of", DT_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_status st = DT_ERR_INTERNAL;
        dt_config *c = load_str(cases[i].text, &st);
        ASSERT(c);
        if (st != cases[i].want)
            fprintf(stderr, "case %zu: %s -> %d %s\n", i, cases[i].text, (int)st, dt_last_error());
        ASSERT_EQ_INT(st, cases[i].want);
        ASSERT_STR_CONTAINS(dt_last_error(), cases[i].key);
        dt_config_free(c);
    }
}

/* offload_param (stage 3 parameter offload) maps into dt_zero_params.offload_param;
 * nvme without nvme_path is an error naming the key. */
TEST(offload_param_nvme)
{
    dt_status st = DT_ERR_INTERNAL;
    dt_config *c = load_str("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
                            "\"nvme_path\": \"/mnt/nvme\", \"buffer_count\": 3, \"buffer_size\": 1000, "
                            "\"max_in_cpu\": 77}}}", &st);
    ASSERT(c);
    ASSERT_OK(st);
    int stage = -1;
    dt_zero_params zp = dt_zero_params_default();
    ASSERT_EQ_INT(zp.offload_param.device, DT_OFFLOAD_NONE);
    ASSERT_EQ_INT(zp.offload_param.buffer_count, 5);
    ASSERT_OK(dt_config_zero_params(c, &stage, &zp));
    ASSERT_EQ_INT(stage, 3);
    ASSERT_EQ_INT(zp.offload_param.device, DT_OFFLOAD_NVME);
    ASSERT_STR_CONTAINS(zp.offload_param.nvme_path, "/mnt/nvme");
    ASSERT_EQ_INT(zp.offload_param.buffer_count, 3);
    ASSERT_EQ_U64(zp.offload_param.buffer_size, 1000u);
    ASSERT_EQ_U64(zp.offload_param.max_in_cpu, 77u);
    dt_config_free(c);
    c = load_str("{\"zero_optimization\": {\"offload_param\": {\"device\": \"nvme\"}}}", &st);
    ASSERT(c);
    ASSERT_OK(st);
    zp = dt_zero_params_default();
    ASSERT_STATUS(dt_config_zero_params(c, &stage, &zp), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "offload_param.nvme_path");
    dt_config_free(c);
}

/* ---- batch relation (SEMANTICS 1.4) ------------------------------------------------------ */

/* zero_optimization.reduce_scatter: absent, DeepSpeed's default (true:
 * stage 1 reduce-scatters); false turns stage 1's all-reduce on (its effect
 * on the ranges: test_zero's stage1_reduce_scatter_ranges); not "auto". */
TEST(zero_reduce_scatter_key)
{
    const char *texts[3] = {"{\"zero_optimization\": {\"stage\": 1}}",
                            "{\"zero_optimization\": {\"stage\": 1, \"reduce_scatter\": false}}",
                            "{\"zero_optimization\": {\"stage\": 1, \"reduce_scatter\": true}}"};
    for (int k = 0; k < 3; k++) {
        dt_status st;
        dt_config *c = load_str(texts[k], &st);
        ASSERT_OK(st);
        ASSERT_EQ_INT(dt_config_num_warnings(c), 0);
        int stage = 0;
        dt_zero_params zp = dt_zero_params_default();
        zp.reduce_scatter = k != 0; /* absent: what the caller had stays */
        ASSERT_OK(dt_config_zero_params(c, &stage, &zp));
        ASSERT_EQ_INT(zp.stage, 1);
        ASSERT_EQ_INT(zp.reduce_scatter, k == 0 ? 0 : k == 2);
        dt_config_free(c);
    }
    ASSERT(dt_zero_params_default().reduce_scatter);
    dt_status st;
    dt_config *c = load_str("{\"zero_optimization\": {\"reduce_scatter\": \"auto\"}}", &st);
    ASSERT_STATUS(st, DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "zero_optimization.reduce_scatter");
    dt_config_free(c);
}

TEST(batch_relation)
{
    struct {
        const char *text;
        int world;
        int64_t t, m, g;
    } ok[] = {
        {"{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4}", 2, 32, 4, 4},
        {"{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 2}", 2, 32, 8, 2},
        {"{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 3}", 2, 24, 4, 3},
        {"{\"train_batch_size\": 32}", 4, 32, 8, 1},
        {"{\"train_micro_batch_size_per_gpu\": 5}", 3, 15, 5, 1},
        {"{\"train_batch_size\": 24, \"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 3}",
         2, 24, 4, 3},
        {"{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": 4, "
         "\"gradient_accumulation_steps\": \"auto\"}", 2, 8, 4, 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        dt_status st = DT_ERR_INTERNAL;
        dt_config *c = load_str(ok[i].text, &st);
        ASSERT_OK(st);
        dt_config_batch b;
        ASSERT_OK(dt_config_batch_resolve(c, ok[i].world, 100, 1, &b));
        ASSERT_EQ_INT(b.train_batch_size, ok[i].t);
        ASSERT_EQ_INT(b.micro_batch, ok[i].m);
        ASSERT_EQ_INT(b.grad_accum, ok[i].g);
        dt_config_free(c);
    }
    const char *bad[] = {
        "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 8, \"gradient_accumulation_steps\": 2}",
        "{\"train_batch_size\": 6, \"train_micro_batch_size_per_gpu\": 4}", /* gas 6 // 4 // 2 = 0 */
        "{\"train_batch_size\": 30, \"gradient_accumulation_steps\": 4}",   /* micro 3, 3*4*2 != 30 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_status st = DT_ERR_INTERNAL;
        dt_config *c = load_str(bad[i], &st);
        ASSERT_OK(st);
        dt_config_batch b;
        ASSERT_STATUS(dt_config_batch_resolve(c, 2, 100, 1, &b), DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), "batch sizes disagree: train_batch_size");
        ASSERT_STR_CONTAINS(dt_last_error(), "data-parallel world size 2");
        /* the derived one is named with its division */
        const char *why[] = {NULL, "gradient_accumulation_steps was derived as 6 / (4 * 2), which is not a whole",
                             "train_micro_batch_size_per_gpu was derived as 30 / (4 * 2), which is not a whole"};
        if (why[i])
            ASSERT_STR_CONTAINS(dt_last_error(), why[i]);
        else
            ASSERT(!strstr(dt_last_error(), "derived as"));
        dt_config_free(c);
    }
}

/* ---- precedence: file < command line < environment --------------------------------------- */

TEST(precedence)
{
    unsetenv("AIAK_MATRIX_APPROXIMATION_RANK");
    dt_status st = DT_ERR_INTERNAL;
    dt_config *c = load_str("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.1, \"eps\": 1e-6}},"
                            " \"dtrain\": {\"powersgd_rank\": 2}}", &st);
    ASSERT_OK(st);
    ASSERT_OK(dt_config_set(c, "optimizer.params.lr", "0.02", DT_CONFIG_FROM_CLI, "--lr"));
    setenv("AIAK_MATRIX_APPROXIMATION_RANK", "4", 1);
    ASSERT_OK(dt_config_apply_env(c));
    unsetenv("AIAK_MATRIX_APPROXIMATION_RANK");
    /* a file read afterwards changes only what no stronger origin set */
    const char *again = "{\"optimizer\": {\"params\": {\"lr\": 0.5, \"eps\": 1e-7}}, \"dtrain\": {\"powersgd_rank\": 8}}";
    ASSERT_OK(dt_config_load_string(c, "again.json", again, strlen(again)));
    double lr = 0, eps = 0;
    int64_t rank = 0;
    ASSERT_OK(dt_config_get_double(c, "optimizer.params.lr", &lr));
    ASSERT_NEAR(lr, 0.02, 0, 0);
    ASSERT_OK(dt_config_get_double(c, "optimizer.params.eps", &eps));
    ASSERT_NEAR(eps, 1e-7, 0, 0);
    ASSERT_OK(dt_config_get_int(c, "dtrain.powersgd_rank", &rank));
    ASSERT_EQ_INT(rank, 4);
    ASSERT_EQ_INT(dt_config_origin_of(c, "optimizer.params.lr"), DT_CONFIG_FROM_CLI);
    ASSERT_EQ_INT(dt_config_origin_of(c, "dtrain.powersgd_rank"), DT_CONFIG_FROM_ENV);
    /* a weaker origin cannot replace a stronger one */
    ASSERT_OK(dt_config_set(c, "dtrain.powersgd_rank", "16", DT_CONFIG_FROM_CLI, "--x"));
    ASSERT_OK(dt_config_get_int(c, "dtrain.powersgd_rank", &rank));
    ASSERT_EQ_INT(rank, 4);
    char *js = dt_config_effective_json(c);
    ASSERT(js);
    ASSERT_STR_CONTAINS(js, "\"optimizer.params.lr\":0.02");
    ASSERT_STR_CONTAINS(js, "\"optimizer.params.lr\":\"--lr\"");
    ASSERT_STR_CONTAINS(js, "\"dtrain.powersgd_rank\":\"AIAK_MATRIX_APPROXIMATION_RANK\"");
    free(js);
    char *tx = dt_config_effective_text(c);
    ASSERT_STR_CONTAINS(tx, "  optimizer.type = \"AdamW\"  (file)\n");
    free(tx);
    ASSERT_STATUS(dt_config_set(c, "no.such.key", "1", DT_CONFIG_FROM_CLI, "--x"), DT_ERR_NOT_FOUND);
    ASSERT_STATUS(dt_config_set(c, "zero_optimization.stage", "9", DT_CONFIG_FROM_CLI, "--zero"),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "from --zero");
    dt_config_free(c);
}

TEST(aiak_environment)
{
    const char *vars[] = {"AIAK_FP16_COMPRESSION", "AIAK_POWERSGD_COMPRESSION", "AIAK_MATRIX_APPROXIMATION_RANK",
                          "AIAK_START_COMPRESS_ITER", "AIAK_FUSED_OPTIMIZER", "AIAK_HIERARCHICAL_ALLREDUCE"};
    for (size_t i = 0; i < 6; i++)
        unsetenv(vars[i]);
    dt_config *c;
    ASSERT_OK(dt_config_init(&c));
    ASSERT_OK(dt_config_apply_env(c)); /* nothing set: nothing changes */
    ASSERT_EQ_INT(dt_config_origin_of(c, "dtrain.comm_hook"), DT_CONFIG_UNSET);
    ASSERT_EQ_INT(dt_config_origin_of(c, "dtrain.powersgd_rank"), DT_CONFIG_UNSET);
    ASSERT_OK(dt_config_set(c, "dtrain.comm_hook", "\"fp16\"", DT_CONFIG_FROM_FILE, "file"));
    setenv("AIAK_FUSED_OPTIMIZER", "1", 1);
    setenv("AIAK_START_COMPRESS_ITER", "50", 1);
    setenv("AIAK_POWERSGD_COMPRESSION", "1", 1);
    setenv("AIAK_FP16_COMPRESSION", "0", 1);
    setenv("AIAK_HIERARCHICAL_ALLREDUCE", "0", 1);
    ASSERT_OK(dt_config_apply_env(c));
    ASSERT(has_warning(c, "AIAK_FUSED_OPTIMIZER: dtrain's optimizers are always fused"));
    int64_t it = 0;
    ASSERT_OK(dt_config_get_int(c, "dtrain.start_compress_iter", &it));
    ASSERT_EQ_INT(it, 50);
    const char *hook = NULL;
    ASSERT_OK(dt_config_get_str(c, "dtrain.comm_hook", &hook));
    ASSERT_STR_EQ(hook, "powersgd"); /* the environment over the file */
    ASSERT_EQ_INT(dt_config_origin_of(c, "dtrain.comm_hook"), DT_CONFIG_FROM_ENV);
    bool hier = true;
    ASSERT_OK(dt_config_get_bool(c, "dtrain.hierarchical_allreduce", &hier));
    ASSERT(!hier);
    setenv("AIAK_FP16_COMPRESSION", "1", 1);
    ASSERT_STATUS(dt_config_apply_env(c), DT_ERR_INVALID_ARG); /* both compressions */
    ASSERT_STR_CONTAINS(dt_last_error(), "AIAK_POWERSGD_COMPRESSION=1");
    unsetenv("AIAK_POWERSGD_COMPRESSION");
    setenv("AIAK_FP16_COMPRESSION", "yes", 1);
    ASSERT(dt_config_apply_env(c) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "AIAK_FP16_COMPRESSION");
    unsetenv("AIAK_FP16_COMPRESSION");
    setenv("AIAK_MATRIX_APPROXIMATION_RANK", "0", 1);
    ASSERT(dt_config_apply_env(c) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "AIAK_MATRIX_APPROXIMATION_RANK");
    unsetenv("AIAK_MATRIX_APPROXIMATION_RANK");
    setenv("AIAK_HIERARCHICAL_ALLREDUCE", "1", 1);
    ASSERT_OK(dt_config_apply_env(c));
    ASSERT_OK(dt_config_get_bool(c, "dtrain.hierarchical_allreduce", &hier));
    ASSERT(hier);
    ASSERT_EQ_INT(dt_config_origin_of(c, "dtrain.hierarchical_allreduce"), DT_CONFIG_FROM_ENV);
    setenv("AIAK_HIERARCHICAL_ALLREDUCE", "2", 1);
    ASSERT_STATUS(dt_config_apply_env(c), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "AIAK_HIERARCHICAL_ALLREDUCE=2");
    for (size_t i = 0; i < 6; i++)
        unsetenv(vars[i]);
    dt_config_free(c);
}

/* ---- the trainer's params ----------------------------------------------------------------- */

static dt_status apply(const char *text, dt_trainer_params *tp)
{
    dt_status st = DT_ERR_INTERNAL;
    dt_config *c = load_str(text, &st);
    *tp = dt_trainer_params_default();
    if (st == DT_OK)
        st = dt_trainer_params_apply_config(c, tp);
    dt_config_free(c);
    return st;
}

TEST(optimizer_block)
{
    dt_trainer_params tp;
    /* DeepSpeed's "Lion" (FusedLion: lr 1e-3, betas (0.9, 0.999), weight_decay 0); it takes no eps */
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"Lion\", \"params\": {\"betas\": [0.95, 0.98], "
                    "\"weight_decay\": 0.1}}}", &tp));
    ASSERT_EQ_INT(tp.optimizer, DT_OPTIM_LION);
    ASSERT_NEAR(tp.lion.lr, 1e-3, 0, 0);
    ASSERT_NEAR(tp.lion.beta1, 0.95, 0, 0);
    ASSERT_NEAR(tp.lion.beta2, 0.98, 0, 0);
    ASSERT_NEAR(tp.lion.weight_decay, 0.1, 0, 0);
    ASSERT_NEAR(dt_trainer_params_lr(&tp), 1e-3, 0, 0);
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"lion\", \"params\": {\"eps\": 1e-8}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key optimizer.params.eps: applies to Adam, AdamW and Lamb only");
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"betas\": [0.9, 0.99]}}}", &tp),
                  DT_ERR_INVALID_ARG);
    /* DeepSpeed's "Adam" is AdamW (adam_w_mode defaults to true), with FusedAdam's defaults */
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 3e-4}}}", &tp));
    ASSERT_EQ_INT(tp.optimizer, DT_OPTIM_ADAMW);
    ASSERT_NEAR(tp.adamw.lr, 3e-4, 0, 0);
    ASSERT_NEAR(tp.adamw.weight_decay, 0, 0, 0);
    ASSERT_NEAR(tp.adamw.eps, 1e-8, 0, 0);
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"adam\", \"params\": {\"adam_w_mode\": false, \"weight_decay\": 0.1}}}",
                    &tp));
    ASSERT_EQ_INT(tp.optimizer, DT_OPTIM_ADAM);
    ASSERT_NEAR(tp.adam.weight_decay, 0.1, 0, 0);
    ASSERT_NEAR(tp.adam.lr, 1e-3, 0, 0);
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.8, 0.95], "
                    "\"eps\": 1e-6, \"weight_decay\": 0.01}}}", &tp));
    ASSERT_EQ_INT(tp.optimizer, DT_OPTIM_ADAMW);
    ASSERT_NEAR(tp.adamw.beta1, 0.8, 0, 0);
    ASSERT_NEAR(tp.adamw.beta2, 0.95, 0, 0);
    ASSERT_NEAR(tp.adamw.eps, 1e-6, 0, 0);
    ASSERT_NEAR(tp.adamw.weight_decay, 0.01, 0, 0);
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"momentum\": 0.9, "
                    "\"nesterov\": true}}}", &tp));
    ASSERT_EQ_INT(tp.optimizer, DT_OPTIM_SGD);
    ASSERT_NEAR(tp.sgd.lr, 0.1, 0, 0);
    ASSERT_NEAR(tp.sgd.momentum, 0.9, 0, 0);
    ASSERT(tp.sgd.nesterov);
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"Lamb\", \"params\": {\"lr\": 0.002, \"max_grad_norm\": 0, "
                    "\"grad_averaging\": false}}}", &tp));
    ASSERT_EQ_INT(tp.optimizer, DT_OPTIM_LAMB);
    ASSERT_NEAR(tp.lamb.lr, 0.002, 0, 0);
    ASSERT_NEAR(tp.lamb.max_grad_norm, 0, 0, 0);
    ASSERT(!tp.lamb.grad_averaging);
    ASSERT_NEAR(tp.lamb.weight_decay, 0, 0, 0);
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"momentum\": 0.9}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "SGD only");
}

TEST(scheduler_block)
{
    dt_trainer_params tp;
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.5}}, \"scheduler\": {\"type\": "
                    "\"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, \"warmup_max_lr\": 0.003, \"warmup_num_steps\": "
                    "20, \"warmup_type\": \"linear\"}}}", &tp));
    ASSERT_EQ_INT(tp.sched.kind, DT_SCHED_CONSTANT);
    ASSERT_EQ_INT(tp.sched.warmup_steps, 20);
    ASSERT_NEAR(tp.adamw.lr, 0.003, 0, 0); /* the scheduler's rate replaces the optimizer's */
    /* DeepSpeed's WarmupLR, linear from 0 over 20, as its engine steps it (after each optimizer step): step
       10 trains at last_batch_iteration 9: 0.003 * 9 / 20 (it was one step ahead: 0.003 * 10 / 20) */
    tp.sched.base_lr = tp.adamw.lr;
    ASSERT_EQ_INT(tp.sched.lag, 1);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 0), 0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 1), 0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 10), 0.00135, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 20), 0.003 * 19 / 20, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 25), 0.003, 0, 0);
    /* WarmupLR without warmup_type: DeepSpeed's default "log" ramp, ln(step + 1) / ln(warmup) (issue 32: it
       was refused, naming a key the user never wrote) */
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 5}}}", &tp));
    ASSERT_EQ_INT(tp.sched.warmup, DT_WARMUP_LOG);
    ASSERT_EQ_INT(tp.sched.warmup_steps, 5);
    tp.sched.base_lr = 0.001;
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 0), 0.0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 3), 0.001 * log(3.0) / log(5.0), 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 6), 0.001, 0, 0);
    /* warmup_num_steps left out or "auto": the caller's warm-up (dtrain train's --warmup, default 0), not
       DeepSpeed's silent 1000; warmup_max_lr "auto": the optimizer's lr (as the HF Trainer fills it) */
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": \"auto\", "
                    "\"warmup_type\": \"linear\"}}}", &tp));
    ASSERT_EQ_INT(tp.sched.warmup_steps, 0);
    ASSERT_EQ_INT(tp.sched.warmup, DT_WARMUP_LINEAR);
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"WarmupLR\"}}", &tp));
    ASSERT_EQ_INT(tp.sched.warmup_steps, 0);
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.25}}, \"scheduler\": {\"type\": "
                    "\"WarmupLR\", \"params\": {\"warmup_max_lr\": \"auto\"}}}", &tp));
    ASSERT_NEAR(tp.adamw.lr, 0.25, 0, 0);
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.25}}, \"scheduler\": {\"type\": "
                    "\"WarmupLR\"}}", &tp));
    ASSERT_NEAR(tp.adamw.lr, 0.001, 0, 0); /* left out: DeepSpeed's default replaces the optimizer's */
    /* a key the schedule does not take (DeepSpeed: a TypeError in its constructor) is named, not dropped */
    ASSERT_STATUS(apply("{\"scheduler\": {\"params\": {\"warmup_min_lr\": 0.001}}}", &tp), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key scheduler.params.warmup_min_lr: not a parameter of scheduler.type "
                                         "constant");
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"gamma\": 0.5}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key scheduler.params.gamma: not a parameter of scheduler.type WarmupLR");
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"cosine\", \"params\": {\"warmup_num_steps\": 10, "
                    "\"total_num_steps\": 500, \"min_lr\": 1e-5}}}", &tp));
    ASSERT_EQ_INT(tp.sched.kind, DT_SCHED_COSINE);
    ASSERT_EQ_INT(tp.sched.total_steps, 500);
    ASSERT_NEAR(tp.sched.min_lr, 1e-5, 0, 0);
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"step\", \"params\": {\"step_size\": 7, \"gamma\": 0.5}}}", &tp));
    ASSERT_EQ_INT(tp.sched.kind, DT_SCHED_STEP);
    ASSERT_EQ_INT(tp.sched.step_size, 7);
    ASSERT_NEAR(tp.sched.gamma, 0.5, 0, 0);
    /* WarmupDecayLR: WarmupLR's ramp, then DeepSpeed's decay min + (max - min) * max(0, (total - t) / max(1,
       total - warmup)) at t = step - 1. The expected rates are DeepSpeed 0.19's WarmupDecayLR stepped as its
       engine does (after each optimizer step), read before each step. */
    struct { int64_t step; double lr; } want[] = {{0, 0.0}, {1, 0.0}, {5, 0.004}, {10, 0.009000000000000001},
                                                  {11, 0.01}, {55, 0.0051111111111111105},
                                                  {100, 0.00011111111111111112}, {101, 0.0}, {130, 0.0}};
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.5}}, \"scheduler\": {\"type\": "
                    "\"WarmupDecayLR\", \"params\": {\"total_num_steps\": 100, \"warmup_max_lr\": 0.01, "
                    "\"warmup_num_steps\": 10, \"warmup_type\": \"linear\"}}}", &tp));
    ASSERT_EQ_INT(tp.sched.kind, DT_SCHED_LINEAR);
    ASSERT_NEAR(tp.adamw.lr, 0.01, 0, 0);
    tp.sched.base_lr = tp.adamw.lr;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ASSERT_NEAR(dt_sched_lr(&tp.sched, want[i].step), want[i].lr, 1e-15, 1e-12);
    /* warmup_min_lr (it was refused): the ramp starts there and the decay ends there */
    struct { int64_t step; double lr; } wmin[] = {{0, 0.002}, {1, 0.002}, {5, 0.0052}, {11, 0.01}, {56, 0.006},
                                                  {101, 0.002}, {130, 0.002}};
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.5}}, \"scheduler\": {\"type\": "
                    "\"WarmupDecayLR\", \"params\": {\"total_num_steps\": 100, \"warmup_min_lr\": 0.002, "
                    "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10, \"warmup_type\": \"linear\"}}}", &tp));
    tp.sched.base_lr = tp.adamw.lr;
    for (size_t i = 0; i < sizeof wmin / sizeof wmin[0]; i++)
        ASSERT_NEAR(dt_sched_lr(&tp.sched, wmin[i].step), wmin[i].lr, 1e-15, 1e-12);
    /* its defaults: the log ramp, warmup_max_lr 1e-3; total_num_steps "auto": the caller's run length */
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": \"auto\", "
                    "\"warmup_num_steps\": 4}}}", &tp));
    ASSERT_EQ_INT(tp.sched.warmup, DT_WARMUP_LOG);
    ASSERT_EQ_INT(tp.sched.total_steps, dt_trainer_params_default().sched.total_steps);
    ASSERT_NEAR(tp.sgd.lr, 1e-3, 0, 0); /* the caller's optimizer (SGD here) at warmup_max_lr's default */
    tp.sched.base_lr = tp.sgd.lr;
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 1), 0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 3), 0.0007924812503605781, 1e-15, 1e-12);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 4), 1e-3, 1e-15, 0);
    /* total_num_steps left out: an error naming it (DeepSpeed's constructor needs it too) */
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"WarmupDecayLR\"}}", &tp), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key scheduler.params.total_num_steps: WarmupDecayLR needs it");
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": 9, "
                        "\"min_lr\": 0.1}}}", &tp), DT_ERR_INVALID_ARG);
    /* a warm-up of 1 step: DeepSpeed raises it to 2 (step 2 at half the rate) */
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": 0.01, "
                    "\"warmup_num_steps\": 1, \"warmup_type\": \"linear\"}}}", &tp));
    tp.sched.base_lr = tp.sgd.lr;
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 1), 0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 2), 0.005, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 3), 0.01, 0, 0);
    /* WarmupCosineLR (it was refused): the optimizer's lr times DeepSpeed's ratio; DeepSpeed 0.19's rates */
    struct { int64_t step; double lr; } wcos[] = {{0, 0.0}, {1, 0.002}, {6, 0.011000000000000001}, {10, 0.0182},
                                                  {11, 0.01999531232347445}, {12, 0.01998125392006858},
                                                  {61, 0.010201597788757781}, {110, 0.001}, {111, 0.001},
                                                  {139, 0.001}};
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.02}}, \"scheduler\": {\"type\": "
                    "\"WarmupCosineLR\", \"params\": {\"total_num_steps\": 110, \"warmup_num_steps\": 10, "
                    "\"warmup_min_ratio\": 0.1, \"cos_min_ratio\": 0.05, \"warmup_type\": \"linear\"}}}", &tp));
    ASSERT_EQ_INT(tp.sched.kind, DT_SCHED_WARMUP_COSINE);
    ASSERT_NEAR(tp.adamw.lr, 0.02, 0, 0);
    tp.sched.base_lr = tp.adamw.lr;
    for (size_t i = 0; i < sizeof wcos / sizeof wcos[0]; i++)
        ASSERT_NEAR(dt_sched_lr(&tp.sched, wcos[i].step), wcos[i].lr, 1e-15, 1e-12);
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.02}}, \"scheduler\": {\"type\": "
                    "\"WarmupCosineLR\", \"params\": {\"total_num_steps\": 100, \"warmup_num_steps\": 8}}}", &tp));
    tp.sched.base_lr = tp.adamw.lr; /* the log ramp, cos_min_ratio 1e-4 */
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 1), 0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 4), 0.013333333333333336, 1e-15, 1e-12);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 9), 0.019994170806639372, 1e-15, 1e-12);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 1000), 0.02 * 1e-4, 1e-18, 1e-12);
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"WarmupCosineLR\"}}", &tp), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key scheduler.params.total_num_steps: WarmupCosineLR needs it");
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 9, "
                        "\"warmup_max_lr\": 0.1}}}", &tp), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "warmup_max_lr: not a parameter of scheduler.type WarmupCosineLR");
    /* LRRangeTest (it was refused): lr_range_test_min_lr replaces the optimizer's lr; DeepSpeed 0.19's rates */
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.5}}, \"scheduler\": {\"type\": "
                    "\"LRRangeTest\", \"params\": {\"lr_range_test_min_lr\": 0.01, \"lr_range_test_step_size\": 4, "
                    "\"lr_range_test_step_rate\": 2.0}}}", &tp));
    ASSERT_EQ_INT(tp.sched.kind, DT_SCHED_RANGE_TEST);
    ASSERT_NEAR(tp.adamw.lr, 0.01, 0, 0);
    tp.sched.base_lr = tp.adamw.lr;
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 0), 0.01, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 1), 0.015, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 10), 0.06, 1e-15, 0);
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"LRRangeTest\", \"params\": {\"lr_range_test_min_lr\": 0.01, "
                    "\"lr_range_test_step_size\": 4, \"lr_range_test_step_rate\": 2.0, "
                    "\"lr_range_test_staircase\": true}}}", &tp));
    tp.sched.base_lr = tp.sgd.lr;
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 3), 0.01, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 4), 0.03, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&tp.sched, 8), 0.05, 1e-15, 0);
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"LRRangeTest\"}}", &tp)); /* DeepSpeed's defaults */
    ASSERT_NEAR(tp.sgd.lr, 1e-3, 0, 0);
    ASSERT_EQ_INT(tp.sched.step_size, 2000);
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"LRRangeTest\", \"params\": {\"warmup_num_steps\": 5}}}",
                        &tp), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "it has no warm-up");
    /* OneCycle (it was refused): DeepSpeed 0.19's rates and Adam first betas, stepped as its engine steps it */
    struct { int64_t step; double lr, b1; } cyc[] = {
        {0, 0.01, 0.85}, {1, 0.03250000000000002, 0.9249999999999999}, {2, 0.055, 0.9}, {4, 0.1, 0.85},
        {5, 0.085, 0.8666666666666667}, {7, 0.055000000000000014, 0.8999999999999999}, {10, 0.01, 0.95},
        {11, 0.008, 0.9974999999999999}, {12, 0.006666666666666667, 1.045}, {15, 0.0044444444444444444, 1.1875}};
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.5}}, \"scheduler\": {\"type\": "
                    "\"OneCycle\", \"params\": {\"cycle_min_lr\": 0.01, \"cycle_max_lr\": 0.1, "
                    "\"cycle_first_step_size\": 4, \"cycle_second_step_size\": 6, \"decay_step_size\": 2, "
                    "\"decay_lr_rate\": 0.5, \"decay_mom_rate\": 0.1, \"cycle_min_mom\": 0.85, "
                    "\"cycle_max_mom\": 0.95}}}", &tp));
    ASSERT_EQ_INT(tp.sched.kind, DT_SCHED_ONE_CYCLE);
    ASSERT_NEAR(tp.adamw.lr, 0.1, 0, 0);
    tp.sched.base_lr = tp.adamw.lr;
    for (size_t i = 0; i < sizeof cyc / sizeof cyc[0]; i++) {
        double b1 = -1;
        ASSERT_NEAR(dt_sched_lr(&tp.sched, cyc[i].step), cyc[i].lr, 1e-15, 1e-12);
        ASSERT(dt_sched_beta1(&tp.sched, cyc[i].step, &b1));
        ASSERT_NEAR(b1, cyc[i].b1, 1e-15, 1e-12);
    }
    /* stairs: 3 up over 6 steps, the way down as many (cycle_second_* left out: the first's) */
    struct { int64_t step; double lr, b1; } st[] = {
        {0, 0.01, 0.8}, {1, 0.01, 0.9}, {2, 0.04, 0.8666666666666667}, {3, 0.04, 0.8666666666666667},
        {5, 0.07, 0.8333333333333334}, {6, 0.1, 0.8}, {7, 0.07, 0.8333333333333334}, {9, 0.04, 0.8666666666666667},
        {11, 0.01, 0.9}, {12, 0.01, 0.9}, {20, 0.01, 0.9}};
    ASSERT_OK(apply("{\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0.01, \"cycle_max_lr\": "
                    "0.1, \"cycle_first_step_size\": 6, \"cycle_first_stair_count\": 3, "
                    "\"cycle_second_step_size\": null}}}", &tp));
    tp.sched.base_lr = tp.sgd.lr;
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        double b1 = -1;
        ASSERT_NEAR(dt_sched_lr(&tp.sched, st[i].step), st[i].lr, 1e-15, 1e-12);
        ASSERT(dt_sched_beta1(&tp.sched, st[i].step, &b1));
        ASSERT_NEAR(b1, st[i].b1, 1e-15, 1e-12);
    }
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_max_lr\": 0.1}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key scheduler.params.cycle_min_lr: OneCycle needs it");
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0.1}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key scheduler.params.cycle_max_lr: OneCycle needs it");
    ASSERT_STATUS(apply("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"cycle_min_lr\": 0.1}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "cycle_min_lr: not a parameter of scheduler.type WarmupLR");
}

TEST(precision_clipping_accumulation)
{
    dt_trainer_params tp;
    ASSERT_OK(apply("{\"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12, "
                    "\"loss_scale_window\": 500, \"hysteresis\": 3, \"consecutive_hysteresis\": true, "
                    "\"min_loss_scale\": 0.5, \"auto_cast\": false}, \"gradient_clipping\": 1.0, "
                    "\"gradient_accumulation_steps\": 4, \"communication_data_type\": \"fp32\"}", &tp));
    ASSERT_EQ_INT(tp.precision.param_dtype, DT_F16);
    ASSERT_EQ_INT(tp.precision.reduce_dtype, DT_F32);
    ASSERT(tp.use_scaler);
    ASSERT_NEAR(tp.scaler.loss_scale, 0, 0, 0);
    ASSERT_EQ_INT(tp.scaler.initial_scale_power, 12);
    ASSERT_NEAR(tp.scaler.init_scale, 4096, 0, 0);
    ASSERT_EQ_INT(tp.scaler.loss_scale_window, 500);
    ASSERT_EQ_INT(tp.scaler.hysteresis, 3);
    ASSERT(tp.scaler.consecutive_hysteresis);
    ASSERT_NEAR(tp.scaler.min_loss_scale, 0.5, 0, 0);
    ASSERT_NEAR(tp.clip_grad_norm, 1.0, 0, 0);
    ASSERT_EQ_INT(tp.grad_accum, 4);
    ASSERT_OK(apply("{\"fp16\": {\"enabled\": false}, \"bf16\": {\"enabled\": true}}", &tp));
    ASSERT_EQ_INT(tp.precision.param_dtype, DT_BF16);
    ASSERT(!tp.use_scaler);
    ASSERT_OK(apply("{\"fp16\": {\"enabled\": false}}", &tp));
    ASSERT_EQ_INT(tp.precision.param_dtype, DT_F32);
    ASSERT_STATUS(apply("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", &tp), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "exclude each other");
    /* offload through the trainer's params */
    ASSERT_OK(apply("{\"zero_optimization\": {\"cpu_offload\": true}}", &tp));
    ASSERT_EQ_INT(tp.offload.device, DT_OFFLOAD_CPU);
    ASSERT_STATUS(apply("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "nvme_path");
    /* a NULL config or key read as an unset key (DT_ERR_NOT_FOUND, no message) */
    dt_config *c = NULL;
    ASSERT_OK(dt_config_init(&c));
    int64_t v = 7;
    dt_dtype dt = DT_F32;
    ASSERT_STATUS(dt_config_get_int(NULL, "train_batch_size", &v), DT_ERR_NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "NULL config");
    ASSERT_STATUS(dt_config_get_int(c, NULL, &v), DT_ERR_NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "NULL key");
    ASSERT_STATUS(dt_config_precision(NULL, &dt), DT_ERR_NULL);
    ASSERT_STATUS(dt_config_get_int(c, "train_batch_size", &v), DT_ERR_NOT_FOUND); /* unset: as before */
    ASSERT_EQ_INT(v, 7);
    ASSERT_STATUS(dt_config_precision(c, &dt), DT_ERR_NOT_FOUND);
    dt_config_free(c);
}

/* DeepSpeed's other spellings of keys dtrain reads (deepspeed/runtime/config.py, runtime/zero/config.py) */
TEST(deepspeed_spellings)
{
    dt_status st;
    dt_trainer_params tp;
    /* "bfloat16": the bf16 block's old name, read when bf16 is not there (it was an unknown key: fp32) */
    ASSERT_OK(apply("{\"bfloat16\": {\"enabled\": true}}", &tp));
    ASSERT_EQ_INT(tp.precision.param_dtype, DT_BF16);
    dt_config *c = load_str("{\"bf16\": {\"enabled\": false}, \"bfloat16\": {\"enabled\": true}}", &st);
    ASSERT_OK(st);
    ASSERT(has_warning(c, "key bfloat16 ignored: bf16 is given"));
    dt_dtype dt = DT_DTYPE_UNSET;
    ASSERT_OK(dt_config_precision(c, &dt));
    ASSERT_EQ_INT(dt, DT_F32);
    dt_config_free(c);
    /* ZeRO's stage-3 fields without "stage3_" (pydantic aliases): the same keys, not unknown ones */
    c = load_str("{\"zero_optimization\": {\"stage\": 3, \"prefetch_bucket_size\": 1234, "
                 "\"max_live_parameters\": 5e8, \"param_persistence_threshold\": 7, "
                 "\"max_reuse_distance\": 99, \"model_persistence_threshold\": 1e6}}", &st);
    ASSERT_OK(st);
    ASSERT_EQ_INT(dt_config_num_warnings(c), 0);
    int stage = 0;
    dt_zero_params zp = dt_zero_params_default();
    ASSERT_OK(dt_config_zero_params(c, &stage, &zp));
    ASSERT_EQ_INT(zp.prefetch_bucket_size, 1234);
    ASSERT_EQ_INT(zp.max_live_parameters, 500000000);
    ASSERT_EQ_INT(zp.param_persistence_threshold, 7);
    ASSERT_EQ_INT(zp.max_reuse_distance, 99);
    dt_config_free(c);
    c = load_str("{\"zero_optimization\": {\"prefetch_bucket_size\": 1, \"stage3_prefetch_bucket_size\": 2}}",
                 &st);
    ASSERT_STATUS(st, DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "zero_optimization.prefetch_bucket_size and stage3_prefetch_bucket_size");
    dt_config_free(c);
    /* the offload blocks null: none, as DeepSpeed's Optional fields (it was "expected an object") */
    c = load_str("{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": null, \"offload_param\": null}}",
                 &st);
    ASSERT_OK(st);
    dt_offload_params op = dt_offload_params_default();
    ASSERT_OK(dt_config_offload_params(c, &op));
    ASSERT_EQ_INT(op.device, DT_OFFLOAD_NONE);
    dt_config_free(c);
}

TEST(integer_limits)
{
    dt_status st;
    dt_config *c;
    /* sys.maxsize (DeepSpeed's default of model_persistence_threshold) is INT64_MAX, not a cast past it */
    c = load_str("{\"zero_optimization\": {\"stage3_model_persistence_threshold\": 9223372036854775807}}", &st);
    ASSERT_OK(st);
    int64_t big = 0;
    ASSERT_OK(dt_config_get_int(c, "zero_optimization.stage3_model_persistence_threshold", &big));
    ASSERT(big == INT64_MAX);
    dt_config_free(c);
    c = load_str("{\"zero_optimization\": {\"stage3_model_persistence_threshold\": 1e19}}", &st);
    ASSERT_STATUS(st, DT_ERR_INVALID_ARG);
    dt_config_free(c);
    /* gradient_accumulation_steps past what the trainer accumulates (2^20): the key named at load, not the
       trainer's init after the setup */
    c = load_str("{\"gradient_accumulation_steps\": 1048576}", &st);
    ASSERT_OK(st);
    dt_config_free(c);
    c = load_str("{\"gradient_accumulation_steps\": 1048577}", &st);
    ASSERT_STATUS(st, DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key gradient_accumulation_steps: expected an integer in [1, 1048576]");
    dt_config_free(c);
}

/* the optimizers' params as DeepSpeed's engine passes them on (ops/lamb/fused_lamb.py, ops/adam/fused_adam.py,
 * torch.optim.SGD): their defaults, and a param the optimizer does not take */
TEST(optimizer_params_deepspeed_takes)
{
    dt_trainer_params tp;
    /* Lamb from the config: FusedLamb's max_grad_norm 0 (no clipping inside the optimizer), not apex's 1.0 */
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"Lamb\", \"params\": {\"lr\": 0.002}}}", &tp));
    ASSERT_EQ_INT(tp.optimizer, DT_OPTIM_LAMB);
    ASSERT_NEAR(tp.lamb.max_grad_norm, 0, 0, 0);
    ASSERT_NEAR(tp.lamb.eps, 1e-8, 0, 0);
    /* FusedAdam's bias_correction: true is what dtrain does, false is refused (it was dropped) */
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"bias_correction\": true}}}", &tp));
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"bias_correction\": false}}}", &tp),
                  DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "key optimizer.params.bias_correction: not supported yet");
    /* a param the optimizer does not take (a TypeError in DeepSpeed): an error naming the key, not dropped */
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"max_grad_norm\": 1.0}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key optimizer.params.max_grad_norm: applies to Lamb only");
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"dampening\": 0.1}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key optimizer.params.dampening: applies to SGD only");
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"bias_correction\": true}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"grad_averaging\": true}}}", &tp),
                  DT_ERR_INVALID_ARG);
    /* amsgrad: false is what dtrain does; true refused by name (it was an unknown key, ignored: plain Adam) */
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"amsgrad\": false}}}", &tp));
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"amsgrad\": true}}}", &tp),
                  DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "key optimizer.params.amsgrad: not supported yet");
    /* SGD's nesterov without a momentum: named by the key (the trainer said "sgd: sgd: nesterov ...") */
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"nesterov\": true}}}", &tp),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key optimizer.params.nesterov: true needs optimizer.params.momentum > 0");
    ASSERT_STATUS(apply("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"nesterov\": true, \"momentum\": 0.9, "
                        "\"dampening\": 0.1}}}", &tp), DT_ERR_INVALID_ARG);
    ASSERT_OK(apply("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"nesterov\": true, \"momentum\": 0.9}}}", &tp));
    ASSERT(tp.sgd.nesterov);
    ASSERT_NEAR(tp.sgd.momentum, 0.9, 1e-6, 0);
}

/* ---- pipeline parallelism ------------------------------------------------------------------ */

static dt_status pipe_cfg(const char *text, dt_pipe_params *p, dt_config **keep)
{
    dt_status st;
    dt_config *c = load_str(text, &st);
    *p = dt_pipe_params_default();
    p->pp = 1;
    if (st == DT_OK)
        st = dt_config_pipe_params(c, p);
    if (keep)
        *keep = c;
    else
        dt_config_free(c);
    return st;
}

TEST(pipeline_keys)
{
    dt_pipe_params p;
    dt_config *c;
    /* DeepSpeed's block: stages; gradient_accumulation_steps is the micro-batches (not taken here) */
    ASSERT_OK(pipe_cfg("{\"gradient_accumulation_steps\": 8, \"pipeline\": {\"stages\": 4, \"partition\": "
                   "\"parameters\", \"activation_checkpoint_interval\": 1, \"seed_layers\": false}}", &p, &c));
    ASSERT_EQ_INT(p.pp, 4);
    ASSERT_EQ_INT(p.schedule, DT_PIPE_1F1B);
    ASSERT_EQ_INT(dt_config_num_warnings(c), 0);
    ASSERT_EQ_INT(dt_config_pipe_stages(c), 4);
    bool on = false;
    dt_act_ckpt_params ap = dt_act_ckpt_params_default();
    ASSERT_OK(dt_config_act_ckpt(c, &on, &ap)); /* the interval turns checkpointing on */
    ASSERT(on);
    dt_trainer_params tp = dt_trainer_params_default();
    ASSERT_OK(dt_trainer_params_apply_config(c, &tp));
    ASSERT_EQ_INT(tp.grad_accum, 1); /* the micro-batches are the pipeline's, no accumulation on top */
    dt_config_free(c);
    /* dtrain's keys */
    ASSERT_OK(pipe_cfg("{\"dtrain\": {\"pipeline_parallel_size\": 2, \"pipeline_schedule\": \"ZBH1\"}}", &p, NULL));
    ASSERT_EQ_INT(p.pp, 2);
    ASSERT_EQ_INT(p.schedule, DT_PIPE_ZBH1);
    ASSERT_OK(pipe_cfg("{\"pipeline\": {\"stages\": \"auto\"}, \"dtrain\": {\"pipeline_parallel_size\": 2, "
                   "\"pipeline_schedule\": \"gpipe\"}}", &p, NULL));
    ASSERT_EQ_INT(p.pp, 2);
    ASSERT_EQ_INT(p.schedule, DT_PIPE_GPIPE);
    /* the two names of the stages must agree at the same origin; a flag's wins over the file's */
    ASSERT_STATUS(pipe_cfg("{\"pipeline\": {\"stages\": 4}, \"dtrain\": {\"pipeline_parallel_size\": 2}}", &p, &c),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "keys pipeline.stages 4 (from file) and dtrain.pipeline_parallel_size 2 "
                                         "(from file) disagree");
    ASSERT(dt_config_pipe_stages(c) < 0);
    ASSERT_OK(dt_config_set(c, "dtrain.pipeline_parallel_size", "4", DT_CONFIG_FROM_CLI, "--pp"));
    p.pp = 1;
    ASSERT_OK(dt_config_pipe_params(c, &p));
    ASSERT_EQ_INT(p.pp, 4);
    dt_config_free(c);
    /* a schedule without stages names the key */
    ASSERT_STATUS(pipe_cfg("{\"dtrain\": {\"pipeline_schedule\": \"1f1b\"}}", &p, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key dtrain.pipeline_schedule \"1f1b\" (from file): a schedule needs "
                                         "pipeline parallelism");
    /* accepted without effect, with a note each */
    ASSERT_OK(pipe_cfg("{\"pipeline\": {\"stages\": 2, \"pipe_partitioned\": true, \"grad_partitioned\": false, "
                   "\"use_reentrant\": false, \"partition\": \"best\", \"activation_checkpoint_interval\": 3}}",
                   &p, &c));
    ASSERT_EQ_INT(p.pp, 2);
    ASSERT(has_warning(c, "pipeline.pipe_partitioned: no effect in dtrain"));
    ASSERT(has_warning(c, "pipeline.grad_partitioned: no effect in dtrain"));
    ASSERT(has_warning(c, "pipeline.use_reentrant: no effect in dtrain"));
    ASSERT(has_warning(c, "pipeline.partition \"best\": DeepSpeed's config default"));
    ASSERT(has_warning(c, "pipeline.activation_checkpoint_interval 3: dtrain checkpoints each transformer block"));
    size_t nw = dt_config_num_warnings(c);
    ASSERT_OK(dt_config_pipe_params(c, &p)); /* said once */
    ASSERT_EQ_INT(dt_config_num_warnings(c), nw);
    ASSERT_EQ_INT(p.balance, DT_PIPE_BY_COMPUTE); /* "best": dtrain's default, by compute */
    dt_config_free(c);
    /* "parameters": DeepSpeed's balance by parameter count */
    ASSERT_OK(pipe_cfg("{\"pipeline\": {\"stages\": 2, \"partition\": \"parameters\"}}", &p, &c));
    ASSERT_EQ_INT(p.balance, DT_PIPE_BY_PARAMS);
    dt_config_free(c);
    /* the block without stages: no effect (as in DeepSpeed without a PipelineModule), said so */
    ASSERT_OK(pipe_cfg("{\"pipeline\": {\"activation_checkpoint_interval\": 1}}", &p, &c));
    ASSERT_EQ_INT(p.pp, 1);
    ASSERT(has_warning(c, "the pipeline block: no effect without pipeline parallelism"));
    on = false;
    ASSERT_OK(dt_config_act_ckpt(c, &on, &ap));
    ASSERT(!on);
    tp = dt_trainer_params_default();
    ASSERT_OK(apply("{\"gradient_accumulation_steps\": 3, \"pipeline\": {\"stages\": 1}}", &tp));
    ASSERT_EQ_INT(tp.grad_accum, 3); /* one stage: accumulation as without the block */
    dt_config_free(c);
}

TEST(every_key_is_listed_once)
{
    size_t n = 0;
    for (; dt_config_key_name(n); n++)
        for (size_t j = 0; j < n; j++)
            ASSERT(strcmp(dt_config_key_name(j), dt_config_key_name(n)) != 0);
    ASSERT(n > 100);
}

/* issue 32: every refused key of a file in one error (not one per run); keys without effect marked in the
 * effective configuration; dt_config_resolve shows what an unset or "auto" key resolves to. */
TEST(refusals_at_once_and_marks)
{
    dt_status st;
    dt_config *c = load_str("{\"zero_optimization\": {\"stage\": 7, \"offload_optimizer\": {\"ratio\": 0.5}},\n"
                            " \"optimizer\": {\"type\": \"Lamb\", \"params\": {\"max_coeff\": 3}},\n"
                            " \"gradient_clipping\": \"x\"}", &st);
    ASSERT_STATUS(st, DT_ERR_INVALID_ARG); /* the first refusal's status */
    dt_config_free(c);
    ASSERT_STR_CONTAINS(dt_last_error(), "4 keys refused");
    ASSERT_STR_CONTAINS(dt_last_error(), "key zero_optimization.stage: expected an integer in [0, 3], got 7");
    ASSERT_STR_CONTAINS(dt_last_error(), "key zero_optimization.offload_optimizer.ratio: not supported yet");
    ASSERT_STR_CONTAINS(dt_last_error(), "key optimizer.params.max_coeff: not supported yet");
    ASSERT_STR_CONTAINS(dt_last_error(), "key gradient_clipping: expected a number");
    /* one refusal keeps the message it always had */
    c = load_str("{\"zero_optimization\": {\"stage\": 7}}", &st);
    ASSERT_STATUS(st, DT_ERR_INVALID_ARG);
    ASSERT(strstr(dt_last_error(), "keys refused") == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "key zero_optimization.stage: expected an integer in [0, 3], got 7");
    dt_config_free(c);
    /* a number past double's range is named so (cJSON prints it as null) */
    c = load_str("{\"gradient_clipping\": 1e400}", &st);
    ASSERT_STATUS(st, DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "key gradient_clipping: expected a number in");
    ASSERT_STR_CONTAINS(dt_last_error(), "got a number beyond double's range (inf)");
    dt_config_free(c);
    c = load_str("{\"memory_breakdown\": true, \"gradient_clipping\": 1.0, \"scheduler\": {\"type\": "
                 "\"WarmupLR\", \"params\": {\"warmup_num_steps\": \"auto\"}}}", &st);
    ASSERT_OK(st);
    ASSERT(dt_config_key_no_effect("memory_breakdown"));
    ASSERT(!dt_config_key_no_effect("wall_clock_breakdown")); /* it prints the step's times */
    ASSERT(!dt_config_key_no_effect("gradient_clipping"));
    ASSERT(dt_config_is_auto(c, "scheduler.params.warmup_num_steps"));
    ASSERT(!dt_config_is_auto(c, "scheduler.params.warmup_type"));
    ASSERT_OK(dt_config_resolve(c, "scheduler.params.warmup_num_steps", "0", "--warmup"));
    ASSERT_OK(dt_config_resolve(c, "scheduler.params.warmup_type", "\"log\"", "DeepSpeed WarmupLR's"));
    ASSERT_OK(dt_config_resolve(c, "gradient_clipping", "5", "nothing")); /* set: untouched */
    int64_t w = -1;
    ASSERT_OK(dt_config_get_int(c, "scheduler.params.warmup_num_steps", &w));
    ASSERT_EQ_INT(w, 0);
    char *tx = dt_config_effective_text(c), *js = dt_config_effective_json(c);
    ASSERT(tx && js);
    ASSERT_STR_CONTAINS(tx, "  memory_breakdown = true  (file; no effect in dtrain)\n");
    ASSERT_STR_CONTAINS(tx, "  gradient_clipping = 1  (file)\n");
    ASSERT_STR_CONTAINS(tx, "  scheduler.params.warmup_num_steps = 0  (auto: --warmup)\n");
    ASSERT_STR_CONTAINS(tx, "  scheduler.params.warmup_type = \"log\"  (default: DeepSpeed WarmupLR's)\n");
    ASSERT_STR_CONTAINS(js, "\"no_effect\":[\"memory_breakdown\"]");
    free(tx);
    free(js);
    dt_config_free(c);
}

int main(void)
{
    RUN(seed_pasted_unchanged_names_line_and_column);
    RUN(seed_zero3_offload_fixed);
    RUN(seed_zero3);
    RUN(seed_zero2_activation_checkpointing);
    RUN(syntax_errors);
    RUN(comments_and_trailing_commas);
    RUN(unknown_keys_warn_with_full_path);
    RUN(wrong_types_and_ranges_name_the_key);
    RUN(offload_param_nvme);
    RUN(zero_reduce_scatter_key);
    RUN(batch_relation);
    RUN(precedence);
    RUN(aiak_environment);
    RUN(optimizer_block);
    RUN(scheduler_block);
    RUN(refusals_at_once_and_marks);
    RUN(precision_clipping_accumulation);
    RUN(deepspeed_spellings);
    RUN(integer_limits);
    RUN(optimizer_params_deepspeed_takes);
    RUN(pipeline_keys);
    RUN(every_key_is_listed_once);
    return TEST_REPORT();
}
