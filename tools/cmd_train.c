/* dtrain train — train a model from the zoo on a data set, evaluate it on
 * the test split, report honest numbers.
 *
 * Flow: parse the options (train_args.c; bad flags exit 2), create the
 * model (its input shape decides the random data set's shape), open the
 * data (errors name the file, exit 2), build the library's trainer
 * (train.h: the strategy, "ddp" under a launcher, the optimizer, the
 * schedule), then per epoch dt_trainer_epoch runs the steps while the
 * loader's thread prepares batches; this file only prints and writes the
 * records the trainer's metrics give it. The epoch's wall time covers
 * everything from the first batch request to the last optimizer step (data
 * loading included, evaluation excluded).
 *
 * This file holds the command's flow (train_main), dtrain eval's one
 * evaluation, the end-of-run report and record and the clean-up; the run's
 * state (dt__train_run) and the other parts are in train_run.h:
 * train_setup.c (model, data, strategy, trainer), train_save.c
 * (checkpoints, exports, resuming), train_loop.c (stop signals, metrics
 * file, evaluation, the epoch loop).
 *
 * Output: progress on stdout (train_progress.c), the final figures on
 * stdout, errors on stderr as one line. --metrics FILE gets JSON lines
 * (train_metrics.c) in FILE.partial as they happen, renamed to FILE when the
 * run succeeds. SIGINT/SIGTERM/SIGHUP stop the run between steps (exit 130; the
 * records and an end record saying "interrupted" stay in FILE.partial):
 * the step under way finishes, and with --save its checkpoint is written
 * before the exit (the message names it).
 *
 * The three signals are blocked in every thread for the whole command (before
 * any thread starts, so the loader's and OpenMP's inherit the mask) and
 * taken synchronously between steps with sigtimedwait: no handler ever runs.
 * A handler interrupting oneDNN's JIT sgemm (2.6.3, Debian bookworm)
 * corrupts the heap (free(): invalid pointer a few calls later; reproduced
 * with a bare dnnl_sgemm loop and setitimer, with or without sigaltstack). */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"
#include "train_run.h"

#include "dtrain/autograd.h"
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/tokenizer.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/offload.h"
#include "dtrain/optim.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/precision.h"
#include "dtrain/tensor.h"
#include "dtrain/train.h"
#include "dtrain/trace.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fnmatch.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* One-line errors: "dtrain train: <what>: <message>". */
int dt__tr_fail(int code, const char *what)
{
    dt__cli_err("dtrain train: %s%s%s\n", what ? what : "", what && *dt_last_error() ? ": " : "",
            dt_last_error());
    return code;
}


static void cleanup(dt__train_run *t)
{
    if (t->tr && t->failed && t->saved_step < 0)
        dt_trainer_save_abandon(t->tr); /* a run that failed before it saved leaves no empty --save DIR behind */
    dt_hf_save_lock_close(t->hf_lock);  /* and no empty --save-hf OUT */
    dt_dir_hold_close(t->lora_hold, t->failed); /* nor a --save-lora DIR it made and left empty, nor parents */
    dt_loader_free(t->train_loader);
    dt_loader_free(t->test_loader);
    dt_sampler_free(t->train_sampler);
    dt_sampler_free(t->test_sampler);
    dt_dataset_free(t->train);
    dt_dataset_free(t->test_shard);
    dt_dataset_free(t->test);
    dt_dataset_free(t->base_train);
    dt_dataset_free(t->base_test);
    dt_tokens_close(t->sample_src);
    dt_bpe_free(t->bpe);
    dt_tokenizer_free(t->tok);
    dt_tokenizer_free(t->eval_tok); /* not taken: the setup stopped before */
    free(t->freeze);
    free(t->freeze_buf);
    free(t->lora_targets);
    free(t->lora_buf);
    dt_lora_peft_config_free(&t->peft);
    free(t->peft_targets);
    free(t->peft_save);
    free(t->save_buf);
    free(t->save_modules);
    free(t->peft_layers);
    free(t->peft_pattern);
    free(t->layers);
    free(t->pattern_buf);
    free(t->patterns);
    dt_lora_pattern_free(t->lora_pattern);
    free(t->exclude_json);
    dt__tuning_free(&t->ck_tuning);
    free(t->ck_path);
    dt_trainer_free(t->tr); /* and its strategy (DDP) before the model and the group */
    dt_monitor_close(t->monitor);
    dt_trace_close(); /* a run that failed still leaves this rank's timeline */
    dt__ddp_free_ddp(&t->ddp);
    dt_model_free(t->model);
    dt__ddp_free_group(&t->ddp);
}

static int train_main(int argc, char **argv, const char *eval_ckpt, bool eval_json, dt_tokenizer *eval_tok);

/* An explicit bf16/fp16 where no native matmul of it runs (no AVX512_BF16, or
 * oneDNN capped below it): the products widen to f32 exactly, so the run is
 * no faster than fp32. Said at start: a user asking for bf16 expects speed. */
static void lowp_notice(const char *precision)
{
    dt_precision_policy p;
    if (dt_precision_policy_parse(precision, &p) < 0 || (p.param_dtype != DT_BF16 && p.param_dtype != DT_F16) ||
        dt_precision_native(p.param_dtype))
        return;
    printf("precision %s: no native %s matmul here, its products widen to f32 exactly (fp32 speed or below; "
           "--precision auto picks %s here)\n", precision, dt_dtype_name(p.param_dtype),
           dt_precision_auto(NULL) == DT_BF16 ? "bf16" : "fp32");
}

int dt_cmd_train(int argc, char **argv) { return train_main(argc, argv, NULL, false, NULL); }

static const char *eval_flag = "--ckpt";

void dt__train_eval_flag(const char *flag) { eval_flag = flag ? flag : "--ckpt"; }

int dt__train_eval_ckpt(int argc, char **argv, const char *ckpt, bool json, dt_tokenizer *kept)
{
    dt__cli_err_command("dtrain eval"); /* its errors are dtrain eval's */
    int rc = train_main(argc, argv, ckpt, json, kept);
    dt__cli_err_command(NULL);
    return rc;
}

/* The whole command; with eval_ckpt (dtrain eval --ckpt): build the same
 * model and data, load the checkpoint's weights, evaluate, print (eval_json:
 * as one JSON object; eval_tok: the tokenizer the checkpoint keeps, taken). */
static int train_main(int argc, char **argv, const char *eval_ckpt, bool eval_json, dt_tokenizer *eval_tok)
{
    dt__train_run *t = calloc(1, sizeof *t);
    if (!t) {
        dt_tokenizer_free(eval_tok);
        dt__cli_err("dtrain train: out of memory\n");
        return 1;
    }
    t->eval_json = eval_json;
    t->eval_only = eval_ckpt != NULL;
    t->eval_tok = eval_tok;
    t->start_s = dt_time_s();
    t->resumed_step = -1; /* a fresh run until dt__tr_setup_resume loads a checkpoint */
    t->saved_step = -1;
    t->eval_step = -1;
    int rc = dt__train_parse(argc, argv, &t->o);
    if (!rc)
        rc = dt__train_config(argc, argv, &t->o); /* --config FILE, AIAK_* (train_config.c) */
    if (rc) {
        dt_config_free(t->o.cfg);
        dt_tokenizer_free(t->eval_tok);
        free(t);
        return rc == 1 ? 0 : rc;
    }
    /* dtrain eval takes dtrain train's options; those that name weights to start from or files to write would
       be ignored without a word (the loss of other weights, a file that never appears) */
    const char *train_only = !eval_ckpt ? NULL : t->o.init_from ? "--init-from" : t->o.resume ? "--resume"
                           : t->o.save ? "--save" : t->o.save_hf ? "--save-hf" : t->o.save_lora ? "--save-lora"
                           : t->o.plan ? "--plan" : t->o.no_eval ? "--no-eval" : NULL;
    if (train_only) {
        dt__cli_err("dtrain eval: %s is a dtrain train option (eval evaluates the weights of --ckpt, --weights or "
                    "--model hf:DIR, with --lora-from's adapters, and writes nothing but --metrics)\n", train_only);
        dt_config_free(t->o.cfg);
        dt_tokenizer_free(t->eval_tok);
        free(t);
        return 2;
    }
    /* Before any thread starts (see the top). Never unblocked: the command
     * ends the process, and a signal that comes after the one taken (or
     * after the last step) stays pending and is dropped at exit instead of
     * killing a run that is already writing its end record. */
    dt__tr_block_stop_signals();
    if (t->o.threads > 0)
        dt_set_num_threads((int)t->o.threads);
    int64_t restart = 0;
    if (dt_env_int("DT_FAULT_KILL_STEP", 0, 0, INT64_MAX, &t->kill_step) < 0 ||
        dt_env_int("DT_FAULT_KILL_RANK", 0, 0, 1 << 20, &t->kill_rank) < 0 ||
        dt_env_int("DT_RESTART_COUNT", 0, 0, INT64_MAX, &restart) < 0) {
        rc = dt__tr_fail(2, "environment");
        goto out;
    }
    if (restart > 0)
        t->kill_step = 0;
    if (t->o.plan && !eval_ckpt && (rc = dt__train_plan_auto(&t->o)))
        goto out;
    if ((rc = dt__ddp_setup(&t->ddp, &t->o)) || (rc = dt__tr_check_same(t)))
        goto out;
    if (dt__ddp_is_main(&t->ddp) && !eval_ckpt) {
        dt__train_config_print(&t->o); /* warnings and the effective configuration, once */
    }
    if ((rc = dt__tr_freeze_patterns(t, eval_ckpt)) || (rc = dt__tr_vocab_size_from_vocab(t)) ||
        (rc = dt__tr_check_memory(t)) || (rc = dt__tr_setup_model(t)) || (rc = dt__tr_setup_data(t)) ||
        (rc = dt__tr_wrap(t)) ||
        (rc = dt__tr_setup_trainer(t)) || (rc = dt__tr_make_user_json(t)))
        goto out;
    if (eval_ckpt) {
        if ((rc = dt__tr_open_metrics(t)))
            goto out;
        double el, ea;
        if (dt_trainer_load_weights(t->tr, eval_ckpt) < 0) {
            rc = dt__tr_fail(dt__tr_bad_input_status(dt_last_status()) ? 2 : 1, eval_flag);
            goto out;
        }
        if ((rc = dt__tr_load_lora_from(t))) /* the adapters were built, zero: their weights now */
            goto out;
        if ((rc = dt__tr_eval_and_record(t, 0, &el, &ea)))
            goto out;
        if (dt__ddp_is_main(&t->ddp) && t->eval_json) {
            char ms[1200], acc[32] = "null";
            dt__json_quote(t->o.model, ms, sizeof ms);
            if (!isnan(ea))
                snprintf(acc, sizeof acc, "%.9g", ea);
            printf("{\"loss\":%.9g,\"accuracy\":%s,\"items\":%lld,\"seq\":%lld,\"model\":%s}\n", el, acc,
                   (long long)dt_dataset_length(t->test), t->lm ? (long long)t->desc.input_shape[0] : 0LL, ms);
        } else if (dt__ddp_is_main(&t->ddp)) {
            printf("%s loss: %.4f\n", t->lm ? "val" : "test", el);
            if (!isnan(ea))
                printf("test accuracy: %.2f%% (%lld items)\n", 100 * ea, (long long)dt_dataset_length(t->test));
        }
        rc = 0;
        goto out;
    }
    if ((rc = dt__tr_setup_save(t)) || (rc = dt__tr_setup_resume(t)))
        goto out;
    if (dt__tr_nothing_left(t)) /* says so; touches nothing */
        goto out;
    if ((rc = dt__tr_open_metrics(t)) || (rc = dt__tr_comm_start(t)))
        goto out;
    int64_t ntrain = dt_dataset_length(t->train), ntest = dt_dataset_length(t->test);
    int64_t spe = dt_loader_num_batches(t->train_loader);
    char data_q[1200], scaler_json[256] = "null", omp_wait[96], cpu[160], cpu_q[200];
    dt__json_quote(t->o.data, data_q, sizeof data_q);
    dt__json_quote(dt_cpu_model_str(cpu, sizeof cpu), cpu_q, sizeof cpu_q); /* the machine the figures are from */
    const dt_loss_scaler *ls = dt_trainer_loss_scaler(t->tr);
    if (ls) /* the rule, and the scale the run starts from */
        snprintf(scaler_json, sizeof scaler_json, "{\"rule\":\"%s\",\"dynamic\":%s,\"initial_scale\":%g}",
                 t->o.scaler, dt_loss_scaler_is_dynamic(ls) ? "true" : "false", dt_loss_scaler_scale(ls));
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"start\",\"model\":\"%s\",\"data\":%s,\"epochs\":%lld,\"max_steps\":%lld,"
                          "\"batch\":%lld,\"grad_accum\":%lld,\"world_size\":%d,\"optimizer\":\"%s\",\"lr\":%g,"
                          "\"lr_schedule\":\"%s\",\"warmup_steps\":%lld,\"total_steps\":%lld,"
                          "\"seed\":%llu,\"rng\":\"%s\",\"threads\":%d,\"train_items\":%lld,"
                          "\"test_items\":%lld,\"steps_per_epoch\":%lld,\"batches_per_epoch\":%lld,\"params\":%zu,"
                          "\"precision\":\"%s\",\"reduce_dtype\":\"%s\",\"keep_bn_fp32\":%s,\"loss_scaler\":%s,"
                          "\"omp_wait\":\"%s\",\"cpu\":%s",
                          t->o.model, data_q, (long long)t->epochs, (long long)t->o.max_steps, (long long)t->o.batch,
                          (long long)t->o.grad_accum, t->ddp.world, t->o.optimizer, t->o.lr,
                          dt_sched_kind_name(t->sched.kind), (long long)t->sched.warmup_steps,
                          (long long)t->sched.total_steps, (unsigned long long)t->o.seed, t->o.rng,
                          dt_get_num_threads(), (long long)ntrain, (long long)ntest, (long long)t->spe, (long long)spe,
                          dt_model_param_count(t->model), t->o.precision,
                          t->o.reduce_dtype ? t->o.reduce_dtype : t->o.precision, t->o.keep_bn_fp32,
                          scaler_json, dt__omp_wait_desc(omp_wait, sizeof omp_wait), cpu_q) < 0) {
        rc = dt__tr_fail(1, NULL);
        goto out;
    }
    if (dt__ddp_is_main(&t->ddp)) /* after the setup's and the files' errors, as training starts */
        dt__tr_warn_oversubscribed(t);
    if (t->o.cfg) { /* the effective config: with --config, or when AIAK_* set a key */
        char *eff = dt_config_effective_json(t->o.cfg), file_q[1200];
        dt__json_quote(t->o.config ? t->o.config : "", file_q, sizeof file_q);
        bool empty = eff && !strcmp(eff, "{\"values\":{},\"from\":{}}") && !t->o.config;
        if (!eff || (!empty && dt__metrics_write(&t->metrics, "\"event\":\"config\",\"file\":%s,\"effective\":%s", file_q,
                                      eff) < 0)) {
            free(eff);
            rc = dt__tr_fail(1, NULL);
            goto out;
        }
        free(eff);
    }
    const dt_trainer_position pos0 = dt_trainer_get_position(t->tr);
    if (t->o.max_steps > 0 && t->epochs < pos0.epoch + 1)
        t->epochs = pos0.epoch + 1; /* resumed at another world size: at least the epoch it is in */
    dt__progress_init(&t->prog, dt__ddp_is_main(&t->ddp) ? t->o.progress : "none", stdout, t->epochs,
                      t->o.log_every);
    if (t->lm) {
        /* the MFU of the step's model FLOPs (forward + backward, per rank) */
        /* the peak in the dtype the run's matmuls take: a bf16 run's GEMMs run on the bf16 units (several
         * times the f32 rate where the CPU has them), so its MFU is against the bf16 product's rate */
        t->peak_gflops = t->o.mfu_peak;
        t->peak_what = "--mfu-peak";
        if (t->peak_gflops <= 0) {
            bool bf = !strcmp(t->o.precision, "bf16");
            t->peak_what = bf ? "bf16 matmul peak" : "f32 matmul peak";
            if (dt_k_bench_matmul(1024, bf ? DT_BF16 : DT_F32, 3, &t->peak_gflops) < 0)
                t->peak_gflops = 0;
        }
        dt__progress_set_rates(&t->prog, t->desc.input_shape[0],
                               t->desc.train_flops_per_sample / (t->ddp.world * t->ddp.cp),
                               t->peak_gflops);
    }
    if (t->prog.mode != DT__PROGRESS_NONE)
        printf("training %s (%zu parameters%s) on %s: %lld items, %lld steps/epoch of %lld, %s lr %g, "
               "%d threads\n", t->o.model, dt_model_param_count(t->model),
               t->ddp.tp > 1 ? " in this rank's slice" : "", t->o.data,
               (long long)ntrain, (long long)t->spe, (long long)t->o.batch * t->o.grad_accum, t->o.optimizer,
               t->o.lr, dt_get_num_threads());
    if (t->prog.mode != DT__PROGRESS_NONE && t->o.precision_auto)
        printf("precision auto: %s (%s)\n", t->o.precision, t->o.precision_auto);
    else if (t->prog.mode != DT__PROGRESS_NONE)
        lowp_notice(t->o.precision);
    if (t->prog.mode != DT__PROGRESS_NONE) {
        char len[160], warm[64] = "";
        if (t->o.max_steps > 0)
            snprintf(len, sizeof len, "%lld optimizer steps (--max-steps; %lld epoch%s of %lld steps; it overrides "
                     "--epochs, as HF Trainer's max_steps)", (long long)t->o.max_steps, (long long)t->epochs,
                     t->epochs == 1 ? "" : "s", (long long)t->spe);
        else
            snprintf(len, sizeof len, "%lld epoch%s of %lld optimizer steps (%lld)", (long long)t->epochs,
                     t->epochs == 1 ? "" : "s", (long long)t->spe, (long long)(t->epochs * t->spe));
        if (t->sched.warmup_steps > 0)
            snprintf(warm, sizeof warm, ", %s warm-up over %lld steps",
                     t->sched.warmup == DT_WARMUP_LOG ? "log" : "linear", (long long)t->sched.warmup_steps);
        printf("run: %s; lr schedule %s%s", len, dt_sched_kind_name(t->sched.kind), warm);
        if (t->sched.kind == DT_SCHED_COSINE || t->sched.kind == DT_SCHED_LINEAR)
            printf(", total_steps %lld (to %g)", (long long)t->sched.total_steps, t->sched.min_lr);
        printf("\n");
    }
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.tp > 1)
        printf("tensor parallel: %d ranks per group (each holds 1/%d of the weights), %d data-parallel group%s%s\n",
               t->ddp.tp, t->ddp.tp, t->ddp.world, t->ddp.world == 1 ? "" : "s",
               t->o.sequence_parallel ? "; sequence parallel (each holds 1/N of the tokens between the blocks)" : "");
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.cp > 1)
        printf("context parallel: %d ranks per sequence (each holds 1/%d of the positions%s), %s attention; "
               "gradients reduced over %d data-parallel x %d context-parallel ranks\n",
               t->ddp.cp, t->ddp.cp, t->ddp.cpp.balance ? ": chunks r and 2N-1-r of 2N" : "",
               dt_cp_impl_name(t->ddp.cpp.impl), t->ddp.world, t->ddp.cp);
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.pp > 1)
    {
        char tpx[48] = "";
        if (t->ddp.tp > 1)
            snprintf(tpx, sizeof tpx, "%d tensor-parallel x ", t->ddp.tp);
        printf("pipeline parallel: %d stages x %s%d data-parallel%s, schedule %s, %d micro-batches per batch\n",
               t->ddp.pp, tpx, t->ddp.world, t->ddp.stage == 1 ? " (ZeRO-1)" : "", t->ddp.pp_sched,
               t->ddp.pp_micro);
        dt__tr_print_pipe_cut(t);
    }
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.world > 1)
        printf("data parallel: %d ranks, batch %lld per rank (%lld per step)%s\n", t->ddp.world,
               (long long)t->o.batch, (long long)t->o.batch * t->ddp.world,
               t->ddp.nconverted ? ", SyncBatchNorm" : "");
    if (t->prog.mode != DT__PROGRESS_NONE && t->ckpt_modules > 0)
        printf("activation checkpointing: %d %s modules recompute their forward in backward\n",
               t->ckpt_modules, t->desc.ckpt_unit);
    fflush(stdout);
    double wall = 0, sps = 0, tl = NAN, ta = NAN, wall_sum = 0;
    bool evaluated = false; /* (a NaN test loss is a result, not "not evaluated") */
    /* --max-steps sets the run's length: the loader wraps into as many epochs as it takes (each reshuffled:
       the sampler's order is a function of the seed and the epoch, as DistributedSampler.set_epoch) */
    int idle = 0; /* epochs in a row without an optimizer step */
    for (int64_t e = pos0.epoch; (t->o.max_steps > 0 || e < t->o.epochs) && !t->max_reached; e++) {
        const int64_t s0 = dt_trainer_steps(t->tr);
        if (t->o.max_steps > 0 && s0 >= t->o.max_steps)
            break;
        if (e >= t->epochs)
            t->prog.epochs = t->epochs = e + 1;
        if ((rc = dt__tr_train_epoch(t, e, &wall, &sps)))
            goto out;
        if (dt_trainer_steps(t->tr) != s0) {
            idle = 0;
        } else if (t->o.max_steps > 0 && ++idle >= 2) { /* no end in sight: say so rather than loop */
            dt__cli_err("dtrain train: epochs %lld and %lld took no optimizer step (every step skipped by the loss "
                        "scaler?): stopping short of --max-steps %lld\n", (long long)e, (long long)e + 1,
                        (long long)t->o.max_steps);
            rc = 1;
            goto out;
        }
        wall_sum += wall;
        if (!t->o.no_eval && (rc = dt__tr_eval_and_record(t, e, &tl, &ta)))
            goto out;
        evaluated = !t->o.no_eval;
    }
    if (!t->o.no_eval && !evaluated && (rc = dt__tr_eval_and_record(t, t->epoch, &tl, &ta)))
        goto out; /* had nothing left to train (a resumed run at its end) */
    if ((rc = dt__tr_check_all_skipped(t)))
        goto out;
    if (t->o.save && dt_trainer_steps(t->tr) != t->saved_step && (rc = dt__tr_save_ckpt(t)))
        goto out;
    if (t->o.save && dt_trainer_save_wait(t->tr) < 0) { /* an asynchronous save still being written */
        rc = dt__tr_fail(1, "checkpoint");
        goto out;
    }
    if ((rc = dt__tr_save_outputs(t)))
        goto out;
    if (t->o.sample_every > 0 && t->global_step % t->o.sample_every != 0 && (rc = dt__tr_print_sample(t)))
        goto out;
    if ((rc = dt__ddp_memory_report(&t->ddp, t->tr))) /* ZeRO: collective */
        goto out;
    /* The final figures, one per line, stable for scripts (demo.sh greps them). DDP: rank 0. */
    if (dt__ddp_is_main(&t->ddp)) {
        if (!t->o.no_eval) {
            printf("%s loss: %.4f\n", t->lm ? "val" : "test", tl);
            if (!isnan(ta))
                printf("test accuracy: %.2f%% (%lld items)\n", 100 * ta, (long long)ntest);
        }
        /* the steps the mean is over: LOSS_WINDOW, or fewer in a shorter run (--max-steps 2: "last 2 steps") */
        int64_t nw = t->nloss < LOSS_WINDOW ? t->nloss : LOSS_WINDOW;
        printf("train loss (last %lld step%s): %.4f\n", (long long)nw, nw == 1 ? "" : "s", dt__tr_window_mean(t));
        printf("epoch wall time: %.2f s (last epoch; data loading included, evaluation excluded)\n", wall);
        printf("samples/s: %.0f\n", sps);
        if (t->lm) {
            printf("tokens/s: %.0f\n", sps * (double)t->desc.input_shape[0]);
            if (t->peak_gflops > 0)
                printf("MFU: %.1f%% of %.1f GFLOP/s (%s, per rank)\n",
                       100.0 * sps / (t->ddp.world * t->ddp.cp) * t->desc.train_flops_per_sample * 1e-9 / t->peak_gflops,
                       t->peak_gflops, t->peak_what);
        }
        double cf, cr;
        uint64_t cn;
        if (t->ckpt_profile && dt_model_checkpoint_profile(t->model, &cf, &cr, &cn) == DT_OK)
            printf("activation checkpointing profile: %llu regions, %.3f s in first runs, %.3f s recomputing\n",
                   (unsigned long long)cn, cf, cr);
        if (t->epochs > 1)
            printf("total training time: %.2f s over %lld epochs\n", wall_sum, (long long)t->epochs);
        char ddp_line[400];
        dt__ddp_summary(&t->ddp, t->global_step, ddp_line, sizeof ddp_line);
        if (ddp_line[0])
            printf("%s\n", ddp_line);
        const dt_offload_optim *off = dt_trainer_offload(t->tr);
        if (off) {
            dt_nvme_stats ns;
            dt_nvme_store_stats(dt_offload_optim_store(off), &ns);
            printf("offload: optimizer state in %s (%s I/O), %zu sub-groups, %.1f MiB of buffers; %.1f MiB read, "
                   "%.1f MiB written, %.2f s waiting for I/O\n", dt_nvme_store_dir(dt_offload_optim_store(off)),
                   dt_offload_io_name(dt_nvme_store_io(dt_offload_optim_store(off))),
                   dt_offload_optim_num_subgroups(off), dt_offload_optim_buffer_bytes(off) / 1048576.0,
                   ns.bytes_read / 1048576.0, ns.bytes_written / 1048576.0, ns.wait_s);
        }
    }
    if ((rc = dt__tr_measure(t)))
        goto out;
    if (t->metrics_open) /* the planner's prediction for this layout, beside the measured figures */
        dt__train_predict(&t->o, t->ddp.world, t->ddp.tp > 1 ? t->ddp.tp : 1, t->ddp.pp > 1 ? t->ddp.pp : 1,
                          t->ddp.cp > 1 ? t->ddp.cp : 1, t->ddp.stage, &t->measured.predicted_peak_rss_bytes,
                          &t->measured.predicted_step_ms);
    dt_trainer_free(t->tr); /* writes this rank's timeline (--trace) */
    t->tr = NULL;
    if ((rc = dt__tr_trace_merge(t)))
        goto out;
    fflush(stdout);
    rc = 0;
out:
    /* the end record says how the run ended; only "ok" publishes FILE */
    if (t->metrics_open &&
        dt__metrics_close(&t->metrics, rc == 0 ? "ok" : rc == 130 ? "interrupted" : "failed",
                          t->global_step, rc, rc == 0 ? &t->measured : NULL) < 0 && rc == 0)
        rc = dt__tr_fail(1, NULL);
    t->failed = rc != 0;
    cleanup(t);
    dt_config_free(t->o.cfg);
    free(t->user_json);
    free(t->step_s);
    free(t);
    return rc;
}
