/* dtrain bench step — time whole training steps of a zoo model.
 *
 * One step = dt_trainer_step (train.h) with the "none" strategy: forward,
 * loss, backward, SGD (lr 0.01, no momentum: torch.optim.SGD's defaults
 * besides lr) over the flat buffers with the gradient zeroing fused into the
 * SGD pass, context reset: the step `dtrain train` runs. Language models
 * (GPT-2 and Llama) step AdamW instead (lr 1e-4, torch's other defaults),
 * the optimizer of the GPT-2 and Llama comparisons (bench/torch_gpt2_step.py,
 * bench/torch_llama_step.py), over --seq tokens per sample (default 64).
 * Inputs are synthetic (Philox uniform [-1, 1), labels i mod classes; token
 * ids i * 7919 mod vocabulary) and fixed across steps. After the warm-up
 * steps, --steps steps are timed one by one; we report the median (and min) per step, the median of each
 * phase, samples/s, GFLOP/s of the step's matmul/conv work
 * (dt_model_flops), and that rate as a percentage of the matmul peak in the
 * step's own precision, measured in the same run after the timed steps
 * (the model and trainer freed first):
 *   - Models whose step is mostly GEMMs (GPT, Llama, the MLP: the GEMMs
 *     the recorded step makes carry at least half of the step's FLOPs):
 *     the step's own GEMMs. The first timed step (the steady state, after
 *     the warm-up) runs under a GEMM recording (dt_k_gemm_record_start,
 *     kernels.h), which sees every dt_k_matmul* call the step makes and
 *     its time there: for GPT and Llama each block's forward,
 *     input-gradient and weight-gradient GEMMs and the LM head's, at
 *     M = batch x seq, in the dtype and through the entry the step used
 *     (bf16 x bf16 -> bf16 or -> f32 on oneDNN, dtrain's AMX GEMM, or the
 *     f32 widening where the CPU has no bf16 matmul). dt_k_gemm_bench times
 *     each distinct call (best of --peak-reps) and the peak is their
 *     FLOP-weighted rate, each call weighed by how often the step makes it:
 *     the rate the step's GEMMs would run at back to back. peak_kind says
 *     "bf16 step shapes" (or f32, f16); peak_gemm_gflop is those GEMMs'
 *     work per step (for GPT, gflop_per_step less the attention's T^2
 *     terms, which the attention kernel computes), peak_gemm_ms their time
 *     at the measured rates: the part of median_ms that no faster
 *     element-wise, attention or optimizer code can remove.
 *     step_gemm_ms is the same GEMMs' time inside the recorded step
 *     (each timed around its product): its excess over peak_gemm_ms is
 *     what the step's surroundings cost them (weights and activations
 *     from memory rather than the caches the back-to-back runs warm).
 *     peak_cpu_gflops_per_core_s is the same GEMMs' FLOPs per CPU-second
 *     of the process (all threads): a core's rate, which a busy machine
 *     lowers less than the wall-time peak (set it against bench/isa_peak's
 *     per-core instruction limit, which is measured the same way).
 *   - Others (the ConvNet: convolutions, whose FC layers are the only
 *     GEMMs): one 2048^3 product in the step's dtype (peak_kind
 *     "f32 2048^3", "bf16 2048^3"; peak_shapes 1, peak_gemm_gflop and
 *     peak_gemm_ms 0).
 * pct_of_peak is gflops against that peak. cpu_ms is the
 * process CPU time (user + system) per timed step: on a shared, overloaded
 * machine a 1-thread run's cpu_ms is a steadier measure of the work than
 * wall time (bench/torch_step.py reports the same).
 *
 * Before the first step the trainer is prepared (dt_trainer_prepare,
 * train.h: one forward and backward on the batch that is not a step and
 * leaves no trace, sizing and committing the step's memory and creating
 * its kernels, as a compiled framework's first call does); prepare_ms is
 * its time (0 with --prepare off, which leaves all of that to the first
 * step). The first step is reported apart (first_step_ms: the very first
 * dt_trainer_step of the run, whatever it had to allocate, fault in or
 * create) beside the steady state, and page_faults_per_step is the process's
 * minor page faults (getrusage) over the timed steps, per step: 0 when a step
 * reuses memory it has already touched (first_step_page_faults: the first
 * step's; first_step_cpu_ms its process CPU time, to set against cpu_ms on a busy
 * machine). --warmup W runs W untimed steps;
 * the default (auto) runs them until the steady state: at least 2, then
 * until a step takes no page fault and is within 10% of the one before it,
 * at most 10; the JSON's "warmup" is the number run.
 *
 * --precision bf16|fp16 trains as `dtrain train --precision` does: the
 * model holds its parameters in that dtype (dt_precision_policy_build_params),
 * the trainer keeps f32 master weights and the optimizer state in f32, the
 * forward runs under autocast (precision.h), and fp16 scales the loss
 * (dynamic). On a CPU without native bf16 matmul (dt_precision_native: AVX2)
 * the bf16 operands are widened to f32 for oneDNN; the JSON's
 * "native_lowp" says which path ran.
 *
 * GPT models compute their loss as `dtrain train` does: the tied head fused
 * with the cross-entropy in chunks of rows (dt_model_config.fused_lm_loss,
 * dt_linear_cross_entropy); --lm-loss unfused materialises the [B*T, V]
 * logits instead (dt_linear then dt_cross_entropy), for comparison.
 * peak_rss_mib is the process's peak resident set (getrusage) when the
 * model's run ends: run one model per process to compare it.
 *
 * --tp N (under `dtrain run -n N`): the model is tensor parallel over the N
 * ranks (tp.h; dt_model_config.tp), every rank steps the same batch, and
 * rank 0 reports (bench/tp_step.sh sets it against one process with N
 * threads). */
#include "cmd.h"
#include "train.h"

#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/precision.h"
#include "dtrain/tp.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct {
    double step, fwd, bwd, opt;
} step_times;

/* --warmup auto: at least WARMUP_MIN steps, then until the steady state, at
 * most WARMUP_MAX. */
#define WARMUP_AUTO (-1)
#define WARMUP_MIN 2
#define WARMUP_MAX 10

/* The process's minor page faults so far. */
static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* CPU seconds (user + system) of the whole process so far. */
static double cpu_seconds(void) { return dt__bench_cpu_s(); }

/* The process's peak resident set so far, MiB. */
static double peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain bench step --model {convnet,mlp,gpt2,gpt-mini,llama-100m,...}[,...] --batch N [options]\n"
               "  --model M       zoo model(s), comma-separated (default convnet)\n"
               "  --seq T         tokens per sample of GPT and Llama models (default 64)\n"
               "  --batch N       samples per step (default: 100 for convnet, 4 for mlp)\n"
               "  --threads T     compute threads (default: OMP_NUM_THREADS or all cores)\n"
               "  --steps S       timed steps (default 20)\n"
               "  --warmup W      untimed steps first (default auto: until a step takes no page fault and is\n"
               "                  within 10%% of the one before, 2 to 10 steps)\n"
               "  --peak-reps R   runs of each GEMM of the peak, best taken (default 3; 0 skips the peak): the\n"
               "                  step's own GEMMs in its precision (GPT, Llama, MLP), else 2048^3 (ConvNet)\n"
               "  --precision P   fp32 (default), bf16, fp16 or auto: as dtrain train --precision (f32 master weights)\n"
               "  --peak-detail   with the peak: each distinct GEMM's best time, rate and share of the GEMMs' time,\n"
               "                  and its time a call inside the step, one line each on stderr\n"
               "  --lm-loss L     GPT-2 models: fused (default: head + cross-entropy in row chunks) or unfused\n"
               "                  (Llama models: unfused)\n"
               "  --prepare P     on (default): dt_trainer_prepare before the first step (prepare_ms); off: the first\n"
               "                  step sizes its memory and creates its kernels itself\n"
               "  --tp N          tensor parallel over N ranks (start them with dtrain run -n N); rank 0 reports\n"
               "  --json          one JSON object per result on stdout\n");
}

/* FLOPs of the n recorded calls rec, each count times. */
static double gemm_work(const dt_k_gemm_shape *rec, int n)
{
    double f = 0;
    for (int i = 0; i < n; i++)
        f += 2.0 * (double)rec[i].count * (double)rec[i].batch * (double)rec[i].M * (double)rec[i].N * (double)rec[i].K;
    return f;
}

/* The matmul peak that a model's step is set against (see the top):
 * rec[0..nrec) the GEMMs its first step made (nrec 0: none recorded), t the
 * step's GEMM dtype. Fills *rate, writes peak_kind into kind; 0 or -1 (an
 * error, reported: the run goes on without a peak). */
static int measure_peak(const dt_k_gemm_shape *rec, int nrec, dt_dtype t, int reps, bool detail, dt_k_gemm_rate *rate,
                        char *kind, size_t cap)
{
    dt_k_gemm_shape sq = {.batch = 1, .M = 2048, .N = 2048, .K = 2048, .alpha = 1.0f, .ab_type = t,
                          .c_type = DT_F32, .count = 1};
    if (nrec > 0) {
        dt_dtype d = rec[0].ab_type;
        for (int i = 1; i < nrec; i++)
            if (rec[i].ab_type != d)
                d = DT_DTYPE_COUNT;
        snprintf(kind, cap, "%s step shapes", d == DT_DTYPE_COUNT ? "mixed" : dt_dtype_name(d));
    } else
        snprintf(kind, cap, "%s 2048^3", dt_dtype_name(t));
    const dt_k_gemm_shape *g = nrec > 0 ? rec : &sq;
    const int n = nrec > 0 ? nrec : 1;
    double *best = detail ? calloc((size_t)n, sizeof *best) : NULL;
    if ((detail && !best) || dt_k_gemm_bench(g, n, reps, best, rate) < 0) {
        dt__cli_err("dtrain bench step: matmul peak (%s): %s (continuing without it)\n", kind,
                    best || !detail ? dt_last_error() : "out of memory");
        memset(rate, 0, sizeof *rate);
        free(best);
        return -1;
    }
    for (int i = 0; detail && i < n; i++) { /* one line per distinct call, on stderr beside the result */
        const double f = 2.0 * (double)g[i].batch * (double)g[i].M * (double)g[i].N * (double)g[i].K;
        const double w = (double)g[i].count * best[i];
        fprintf(stderr, "peak %2d: %s%s batch %lld M %lld N %lld K %lld %s->%s%s x%lld: %.3f ms, %.1f GFLOP/s, "
                "%.1f%% of the GEMMs' time", i, g[i].trans_a ? "At" : "A", g[i].trans_b ? "Bt" : "B",
                (long long)g[i].batch, (long long)g[i].M, (long long)g[i].N, (long long)g[i].K,
                dt_dtype_name(g[i].ab_type), dt_dtype_name(g[i].c_type), g[i].bias ? "+bias" : "",
                (long long)g[i].count, best[i] * 1e3, best[i] > 0 ? f / best[i] * 1e-9 : 0.0,
                rate->seconds > 0 ? 100.0 * w / rate->seconds : 0.0);
        if (g[i].count > 0 && g[i].seconds > 0) { /* recorded in the step */
            const double in = g[i].seconds / (double)g[i].count;
            fprintf(stderr, "; in the step %.3f ms a call (%.2fx)", in * 1e3, best[i] > 0 ? in / best[i] : 0.0);
        }
        fputc('\n', stderr);
    }
    if (detail && rate->recorded_seconds > 0)
        fprintf(stderr, "peak: the GEMMs took %.3f ms inside the recorded step, %.3f ms at their best (%.2fx)\n",
                rate->recorded_seconds * 1e3, rate->seconds * 1e3,
                rate->seconds > 0 ? rate->recorded_seconds / rate->seconds : 0.0);
    free(best);
    return 0;
}

/* Distinct GEMMs kept from a recorded step (far more than a GPT or Llama
 * step makes: a dozen per block shape and the LM head's). */
#define MAX_REC 512

/* Stops the GEMM recording into rec (MAX_REC entries); *n gets how many
 * were kept. */
static dt_status stop_recording(dt_k_gemm_shape *rec, int *n)
{
    int got = 0;
    dt_status st = dt_k_gemm_record_stop(rec, MAX_REC, &got);
    *n = got < MAX_REC ? got : MAX_REC;
    return st;
}

static int run_one(const char *name, long batch, long seq, int steps, int warmup, int peak_reps, bool detail, bool json,
                   dt_pg *tpg, const char *precision, bool fused, bool prepare)
{
    int rc = 1;
    dt_model *m = NULL;
    dt_model_desc desc;
    dt_trainer *tr = NULL;
    void *x = NULL;
    int64_t *y = NULL;
    step_times *t = calloc((size_t)steps, sizeof *t);
    double *col = calloc((size_t)steps, sizeof *col);
    dt_k_gemm_shape *rec = NULL;
    int nrec = 0;
    dt_model_config cfg = dt_model_config_default();
    cfg.seq = seq;
    cfg.tp = tpg;
    cfg.fused_lm_loss = fused;
    dt_precision_policy pol;
    if (dt_precision_policy_parse(precision, &pol) < 0 || dt_precision_policy_build_params(&pol, &cfg.build) < 0) {
        dt__cli_err("dtrain bench step: --precision: %s\n", dt_last_error());
        free(t);
        free(col);
        return 2;
    }
    const bool quiet = tpg && dt_pg_rank(tpg) != 0;
    const dt_dtype gemm_t = pol.param_dtype == DT_DTYPE_UNSET ? DT_F32 : pol.param_dtype;
    if (dt_model_create(name, 1234, &cfg, &m, &desc) < 0 || !t || !col) {
        dt__cli_err("dtrain bench step: %s\n", dt_last_error());
        const dt_status st = dt_last_status(); /* an unknown model or a bad size is bad input */
        if (st == DT_ERR_INVALID_ARG || st == DT_ERR_NOT_FOUND || st == DT_ERR_UNSUPPORTED || st == DT_ERR_FORMAT)
            rc = 2;
        goto done;
    }
    bool tokens = desc.input_dtype == DT_I64;
    /* the first step's GEMMs are recorded for the peak */
    bool record = peak_reps > 0 && !quiet;
    if (record && !(rec = calloc(MAX_REC, sizeof *rec)))
        goto fail;
    if (batch <= 0)
        batch = !strcmp(name, "mlp") || tokens ? 4 : 100;
    int nd, tnd;
    int64_t shape[DT_MAX_DIMS], tshape[DT_MAX_DIMS];
    dt_dtype tdt;
    if (dt_model_desc_shapes(&desc, batch, &nd, shape, &tnd, tshape, &tdt) < 0)
        goto fail;
    size_t nx = 1, ny = 1;
    for (int i = 0; i < nd; i++)
        nx *= (size_t)shape[i];
    for (int i = 0; i < tnd; i++)
        ny *= (size_t)tshape[i];
    x = dt_alloc(nx * (tokens ? sizeof(int64_t) : sizeof(float)));
    y = dt_alloc(ny * sizeof(int64_t));
    if (!x || !y)
        goto fail;
    if (tokens)
        for (size_t i = 0; i < nx; i++)
            ((int64_t *)x)[i] = (int64_t)((i * 7919u) % (size_t)desc.input_classes);
    else
        dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_DATA, 0, 0), 0, x, nx, -1.0f, 1.0f);
    int64_t ncls = desc.num_classes > 0 ? desc.num_classes : 10;
    for (size_t i = 0; i < ny; i++)
        y[i] = (int64_t)((i * 31u + 1u) % (size_t)ncls);
    dt_strategy *strat;
    if (dt_strategy_none_init(&strat) < 0)
        goto fail;
    dt_trainer_params tp = dt_trainer_params_default();
    tp.sgd.lr = 0.01;
    if (tokens) {
        tp.optimizer = DT_OPTIM_ADAMW;
        tp.adamw.lr = 1e-4;
    }
    tp.loss_fn = dt_model_desc_loss_fn; /* the zoo model's own loss */
    tp.loss_ud = &desc;
    tp.precision = pol; /* bf16/f16: f32 master weights, forward under autocast */
    tp.use_scaler = pol.param_dtype == DT_F16;
    if (dt_trainer_init(m, strat, &tp, &tr) < 0)
        goto fail;
    dt_trainer_batch b = dt_trainer_batch_make(x, desc.input_dtype, nd, shape, tnd ? y : NULL, tdt, tnd, tshape);
    double prep_s = 0;
    if (prepare) {
        double t0 = dt_time_s();
        if (dt_trainer_prepare(tr, &b, NULL) < 0)
            goto fail;
        prep_s = dt_time_s() - t0;
    }
    float last_loss = 0;
    double first_s = 0, prev_s = 0;
    long first_faults = 0;
    double first_cpu = 0;
    /* warm-up: W steps, or (auto) until a step faults no page in and takes
     * within 10% of the step before it */
    int w = 0;
    for (;; w++) {
        if (warmup != WARMUP_AUTO ? w >= warmup : w >= WARMUP_MAX)
            break;
        long f0 = minor_faults();
        double c0 = cpu_seconds(), t0 = dt_time_s();
        dt_trainer_metrics r;
        dt_status sst = dt_trainer_step(tr, &b, 1, &r);
        double dt = dt_time_s() - t0;
        if (sst < 0)
            goto fail;
        if (w == 0)
            first_s = dt, first_faults = minor_faults() - f0, first_cpu = cpu_seconds() - c0;
        bool steady = w > 0 && minor_faults() == f0 && dt <= 1.1 * prev_s;
        prev_s = dt;
        if (warmup == WARMUP_AUTO && w + 1 >= WARMUP_MIN && steady) {
            w++;
            break;
        }
    }
    warmup = w;
    double cpu0 = cpu_seconds();
    long faults0 = minor_faults();
    for (int s = 0; s < steps; s++) {
        bool first = s == 0; /* the recorded step */
        if (first && record && dt_k_gemm_record_start() < 0)
            goto fail;
        double t0 = dt_time_s();
        dt_trainer_metrics r;
        dt_status sst = dt_trainer_step(tr, &b, 1, &r);
        double t3 = dt_time_s();
        if (first && record && stop_recording(rec, &nrec) < 0 && sst == DT_OK)
            goto fail;
        if (sst < 0)
            goto fail;
        last_loss = (float)r.loss;
        t[s] = (step_times){t3 - t0, r.forward_s, r.backward_s + r.wait_s, r.optim_s};
        if (warmup == 0 && s == 0)
            first_s = t3 - t0, first_faults = minor_faults() - faults0, first_cpu = cpu_seconds() - cpu0;
    }
    double faults = (double)(minor_faults() - faults0) / steps;
    double cpu_ms = (cpu_seconds() - cpu0) / steps * 1e3;
    double med[4], mn = 1e30;
    for (int k = 0; k < 4; k++) {
        for (int s = 0; s < steps; s++) {
            double v = k == 0 ? t[s].step : k == 1 ? t[s].fwd : k == 2 ? t[s].bwd : t[s].opt;
            col[s] = v;
            if (k == 0 && v < mn)
                mn = v;
        }
        med[k] = dt__bench_median(col, steps);
    }
    double train_flops = desc.train_flops_per_sample * (double)batch;
    /* the resident set and the model's figures before the peak's operands
     * come and the model's memory goes */
    const double rss = peak_rss_mib();
    const size_t params = dt_model_param_count(m);
    const int64_t seq_out = tokens ? desc.input_shape[0] : 0;
    const bool lm_head = desc.lm_head;
    dt_trainer_free(tr);
    tr = NULL;
    dt_model_free(m);
    m = NULL;
    dt_k_gemm_rate rate = {0};
    char kind[48] = "none";
    const int used = gemm_work(rec, nrec) >= 0.5 * train_flops ? nrec : 0; /* 0: the n^3 product */
    if (peak_reps > 0 && !quiet)
        measure_peak(rec, used, gemm_t, peak_reps, detail, &rate, kind, sizeof kind);
    const double peak = rate.gflops, cpu_peak = rate.cpu_gflops;
    double gflops = train_flops / med[0] * 1e-9, pct = peak > 0 ? 100.0 * gflops / peak : 0;
    double cpu_pct = cpu_peak > 0 ? 100.0 * (train_flops / (cpu_ms * 1e-3) * 1e-9) / cpu_peak : 0;
    int threads = dt_get_num_threads();
    char omp_wait[96], cpu[160], cpu_q[200]; /* the machine the figures are from */
    dt__json_quote(dt_cpu_model_str(cpu, sizeof cpu), cpu_q, sizeof cpu_q);
    if (quiet) {
    } else if (json) {
        printf("{\"bench\":\"step\",\"model\":\"%s\",\"batch\":%ld,\"seq\":%lld,\"optimizer\":\"%s\",\"precision\":\"%s\",\"native_lowp\":%s,\"lm_loss\":\"%s\",\"threads\":%d,\"tp\":%d,\"steps\":%d,\"warmup\":%d,\"prepare_ms\":%.3f,"
               "\"median_ms\":%.3f,\"min_ms\":%.3f,\"first_step_ms\":%.3f,\"first_over_median\":%.3f,\"page_faults_per_step\":%.1f,\"first_step_page_faults\":%ld,\"first_step_cpu_ms\":%.3f,\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"optimizer_ms\":%.3f,\"cpu_ms\":%.3f,"
               "\"samples_per_s\":%.1f,\"gflop_per_step\":%.4f,\"gflops\":%.1f,\"peak_gflops\":%.1f,\"peak_kind\":\"%s\","
               "\"peak_shapes\":%d,\"peak_gemm_gflop\":%.4f,\"peak_gemm_ms\":%.3f,\"step_gemm_ms\":%.3f,\"peak_cpu_gflops_per_core_s\":%.1f,"
               "\"pct_of_peak\":%.1f,\"pct_of_peak_best_step\":%.1f,\"cpu_gflops_per_core_s\":%.1f,"
               "\"cpu_pct_of_peak\":%.1f,\"params\":%zu,\"peak_rss_mib\":%.1f,\"loss\":%.6g,\"omp_wait\":\"%s\","
               "\"cpu\":%s}\n",
               name, batch, (long long)seq_out, dt_optim_kind_name(tp.optimizer), precision,
               dt_precision_native(pol.param_dtype) ? "true" : "false", !tokens ? "none" : lm_head ? "fused" : "unfused",
               threads,
               tpg ? dt_pg_size(tpg) : 1, steps, warmup, prep_s * 1e3, med[0] * 1e3, mn * 1e3, first_s * 1e3,
               med[0] > 0 ? first_s / med[0] : 0.0, faults, first_faults, first_cpu * 1e3, med[1] * 1e3, med[2] * 1e3,
               med[3] * 1e3, cpu_ms, (double)batch / med[0], train_flops * 1e-9, gflops, peak, kind,
               peak > 0 ? (used > 0 ? used : 1) : 0, used > 0 ? rate.gflop : 0.0, used > 0 ? rate.seconds * 1e3 : 0.0,
               used > 0 ? rate.recorded_seconds * 1e3 : 0.0, cpu_peak, pct,
               peak > 0 ? 100.0 * train_flops / mn * 1e-9 / peak : 0.0, train_flops / (cpu_ms * 1e-3) * 1e-9,
               cpu_pct, params, rss, (double)last_loss,
               dt__omp_wait_desc(omp_wait, sizeof omp_wait), cpu_q);
    } else {
        if (tpg)
            printf("tp %d x ", dt_pg_size(tpg));
        printf("%-8s %s batch %-4ld threads %d: %8.2f ms/step (min %.2f; fwd %.2f, bwd %.2f, opt %.2f; cpu %.2f)  "
               "%9.1f samples/s  %6.1f GFLOP/s",
               name, precision, batch, threads, med[0] * 1e3, mn * 1e3, med[1] * 1e3, med[2] * 1e3, med[3] * 1e3, cpu_ms,
               (double)batch / med[0], gflops);
        if (peak > 0)
            printf("  %5.1f%% of %.0f GFLOP/s matmul peak (%s; CPU-time basis: %.1f%%)", pct, peak, kind, cpu_pct);
        printf("  peak RSS %.0f MiB; first step %.2f ms (%.2fx), %.1f page faults/step", rss, first_s * 1e3,
               med[0] > 0 ? first_s / med[0] : 0.0, faults);
        printf("\n");
    }
    rc = 0;
    goto done;
fail:
    dt__cli_err("dtrain bench step (%s): %s\n", name, dt_last_error());
done:
    dt_free(x);
    dt_free(y);
    free(t);
    free(col);
    free(rec);
    dt_trainer_free(tr);
    dt_model_free(m);
    return rc;
}

int dt_bench_step(int argc, char **argv)
{
    const char *models = "convnet", *precision = "fp32", *lm_loss = "fused";
    long batch = 0, seq = 0;
    int steps = 20, warmup = WARMUP_AUTO, threads = 0, peak_reps = 3, tpn = 0;
    bool json = false, prepare = true, detail = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--peak-detail")) {
            detail = true;
        } else if (v && !strcmp(a, "--model")) {
            models = v, i++;
        } else if (v && (!strcmp(a, "--batch") || !strcmp(a, "--seq") || !strcmp(a, "--steps"))) {
            int64_t x;
            if (dt__bench_int("dtrain bench step", a, v, 1, 1 << 30, &x))
                return 2;
            if (!strcmp(a, "--steps"))
                steps = (int)x;
            else
                *(!strcmp(a, "--batch") ? &batch : &seq) = (long)x;
            i++;
        } else if (v && (!strcmp(a, "--threads") || !strcmp(a, "--tp"))) { /* 0: all cores; no tensor parallelism */
            int64_t x;
            if (dt__bench_int("dtrain bench step", a, v, 0, 4096, &x))
                return 2;
            *(!strcmp(a, "--threads") ? &threads : &tpn) = (int)x;
            i++;
        } else if (v && !strcmp(a, "--warmup")) {
            int64_t x = WARMUP_AUTO;
            if (strcmp(v, "auto") && dt__bench_int("dtrain bench step", a, v, 0, 1 << 30, &x))
                return 2;
            warmup = (int)x, i++;
        } else if (v && !strcmp(a, "--peak-reps")) {
            int64_t r;
            if (dt_parse_int("--peak-reps", v, 0, 1000, &r) < 0) {
                dt__cli_err("dtrain bench step: %s\n", dt_last_error());
                return 2;
            }
            peak_reps = (int)r, i++;
        } else if (v && !strcmp(a, "--precision")) {
            precision = v, i++;
        } else if (v && !strcmp(a, "--lm-loss")) {
            lm_loss = v, i++;
        } else if (v && !strcmp(a, "--prepare") && (!strcmp(v, "on") || !strcmp(v, "off"))) {
            prepare = !strcmp(v, "on"), i++;
        } else {
            dt__cli_err("dtrain bench step: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (steps <= 0 || warmup < WARMUP_AUTO || batch < 0 || seq < 0 || threads < 0 || peak_reps < 0 || tpn < 0) {
        dt__cli_err("dtrain bench step: --steps must be > 0; --warmup auto or >= 0; --batch, --seq, --threads, --peak-reps, --tp "
                    ">= 0\n");
        return 2;
    }
    if (strcmp(lm_loss, "fused") && strcmp(lm_loss, "unfused")) {
        dt__cli_err("dtrain bench step: --lm-loss '%s': fused or unfused\n", lm_loss);
        return 2;
    }
    dt_precision_policy pol;
    if (dt_precision_policy_parse(precision, &pol) < 0) {
        dt__cli_err("dtrain bench step: --precision: %s\n", dt_last_error());
        return 2;
    }
    if (!strcmp(precision, "auto")) { /* the results name the precision that ran */
        const char *why;
        precision = dt_precision_auto(&why) == DT_BF16 ? "bf16" : "fp32";
        if (!json)
            printf("precision auto: %s (%s)\n", precision, why);
    }
    dt_pg *world = NULL, *tpg = NULL, *dpg = NULL;
    if (tpn > 1) {
        int ws = 1;
        if (dt_pg_env_world_size(&ws) < 0 || ws != tpn) {
            dt__cli_err("dtrain bench step: --tp %d needs exactly %d ranks (dtrain run -n %d -- dtrain bench step "
                        "...); this job has %d\n", tpn, tpn, tpn, ws);
            return 2;
        }
        if (dt_pg_init(NULL, &world) < 0 || dt_tp_groups(world, tpn, &tpg, &dpg) < 0) {
            dt__cli_err("dtrain bench step: --tp: %s\n", dt_last_error());
            dt_pg_free(world);
            return 1;
        }
    }
    if (threads > 0)
        dt_set_num_threads(threads);
    else
        dt_set_num_threads(dt_get_num_threads());
    char buf[256];
    snprintf(buf, sizeof buf, "%s", models);
    int rc = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int r = run_one(tok, batch, seq ? seq : 64, steps, warmup, peak_reps, detail, json, tpg, precision,
                        !strcmp(lm_loss, "fused"), prepare);
        if (r)
            rc = r;
    }
    dt_pg_free(tpg);
    dt_pg_free(dpg);
    dt_pg_free(world);
    return rc;
}
