/* The planner's calibration (plan.h, dt_plan_calibrate): what this machine
 * costs for one model, measured in a few seconds.
 *
 * Why small copies of the model: the full model (a 774M-parameter GPT-2
 * needs 12 GB of model state) may not fit in one process, and its blocks
 * are all alike. A copy with one block and one with three blocks, each of
 * the full width, heads, vocabulary and sequence (built from the model's
 * Hugging Face description: GPT-2 or Llama), run a training forward + loss
 * + backward on one sample; half the difference is one block, the one-block
 * run less that block is the rest (embeddings, final norm, head and the
 * cross-entropy). The activation bytes are the autograd arena's peak (what
 * the trainer's context keeps resident); the compute is the process's CPU
 * time (core-seconds: a rank with fewer cores scales, and load from other
 * processes on shared cores stays out of the cached figures). The copies
 * run on one thread (what a rank gets when ranks fill the cores), their
 * runs interleaved, each the best of 3 after a warm-up; once more on the
 * process's threads for what extra threads cost. The predicted step is
 * therefore the step of a machine this run has to itself.
 *
 * The collective model without a group is a guess stated as one: the
 * shared-memory transport copies a byte into and out of the shared
 * segment, so half the memcpy bandwidth, and 20 us per call. A group
 * measures its own curve (dt_plan_calibrate_comm: `dtrain plan` forks a
 * 2-rank shared-memory group for it): per kind, a latency per call and a
 * bus bandwidth fitted over 64 KiB to 64 MiB, in wall time (a collective
 * on a busy machine is slower, and the cached curve keeps that). */
#include "dtrain/plan.h"

#include "dtrain/autograd.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/optim.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* VmRSS of this process in bytes (0 if unknown). */
static double rss_now(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    double v = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) {
            v = (double)kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

/* The threads a kernel of this process uses: OMP_NUM_THREADS, else the cores. */
static int process_threads(int cores)
{
    const char *e = getenv("OMP_NUM_THREADS");
    int t = e && *e ? atoi(e) : 0;
    return t >= 1 && t <= cores ? t : cores;
}

/* One run's measurements. */
typedef struct {
    double fb_s, act, fb_ckpt_s, act_ckpt, numel;
    double fb_short_s; /* forward + backward at a quarter of the tokens */
} run_meas;

/* CPU seconds this process has used, every thread: core-seconds, which
 * other processes' load on shared cores does not inflate (wall time would:
 * a calibration taken at a busy moment would be cached as this machine's
 * speed for good). */
static double cpu_s(void)
{
    struct timespec ts;
    return clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0 ? (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec : 0;
}

/* forward + loss + backward of one sample on a fresh context: core-seconds and the arena's peak. */
static dt_status fwd_bwd(dt_model *m, const dt_model_desc *d, const int64_t *tok, int64_t T, double *sec,
                         double *peak)
{
    dt_ctx_params cp = dt_ctx_params_default();
    dt_ctx *ctx = NULL;
    dt_status st = dt_ctx_init(&cp, &ctx);
    if (st < 0)
        return st;
    int64_t shape[2] = {1, T};
    double t0 = cpu_s();
    dt_tensor *x = dt_tensor_from(ctx, DT_I64, 2, shape, tok);
    dt_tensor *y = dt_tensor_from(ctx, DT_I64, 2, shape, tok + 1);
    dt_tensor *out = x && y ? dt_model_forward(ctx, m, x) : NULL;
    dt_tensor *loss = out ? dt_model_desc_loss(ctx, d, out, y) : NULL;
    st = loss ? dt_backward(ctx, loss) : dt_error(DT_ERR_NO_MEMORY, "dt_plan_calibrate: a forward of %s failed: %s",
                                                     d->name, dt_last_error());
    *sec = cpu_s() - t0;
    *peak = (double)dt_arena_peak(dt_ctx_arena(ctx));
    dt_ctx_free(ctx);
    return st;
}

/* A transformer's shape from its own description (dt_model_hf_config: the
 * GPT-2 and Llama zoo sizes, hf:DIR's config.json), and the way to build a
 * copy of it with fewer blocks. */
typedef struct {
    dt_hf_config h;
    int64_t n_layer, n_head, n_kv_head, n_embd, vocab, positions;
} model_shape;

static dt_status shape_of(const char *model, model_shape *s)
{
    memset(s, 0, sizeof *s);
    dt_status st = dt_model_hf_config(model, NULL, &s->h);
    if (st == DT_ERR_UNSUPPORTED)
        return dt_error(DT_ERR_UNSUPPORTED, "the planner: model '%s' is not a transformer it can calibrate (the GPT-2 "
                        "and Llama zoo models and hf:DIR models are)", model);
    if (st < 0)
        return st;
    if (s->h.is_gpt2) {
        const dt_gpt2_config *g = &s->h.gpt2;
        s->n_layer = g->n_layer, s->n_head = g->n_head, s->n_kv_head = g->n_head, s->n_embd = g->n_embd;
        s->vocab = g->vocab_size, s->positions = g->block_size;
    } else {
        const dt_llama_config *l = &s->h.llama;
        if (l->num_experts > 0) /* a block's time and memory follow its tokens' routing, which a copy cannot know */
            return dt_error(DT_ERR_UNSUPPORTED, "the planner: model '%s' has mixture-of-experts layers (%s, %lld "
                            "experts), which it does not calibrate", model, s->h.architecture,
                            (long long)l->num_experts);
        s->n_layer = l->num_hidden_layers, s->n_head = l->num_attention_heads, s->n_kv_head = l->num_key_value_heads;
        s->n_embd = l->hidden_size, s->vocab = l->vocab_size, s->positions = l->max_position_embeddings;
    }
    if (s->n_layer < 1 || s->n_head < 1 || s->n_kv_head < 1 || s->n_embd < 1 || s->vocab < 1 || s->positions < 2)
        return dt_error(DT_ERR_INVALID_ARG, "the planner: model '%s' has %lld blocks, %lld heads, width %lld, "
                        "vocabulary %lld, %lld positions", model, (long long)s->n_layer, (long long)s->n_head,
                        (long long)s->n_embd, (long long)s->vocab, (long long)s->positions);
    return DT_OK;
}

/* A copy of the model of shape s with `layers` blocks (random weights: only the shape matters), with LoRA's
   adapters lora (NULL: none). */
static dt_status make_copy(const model_shape *s, int64_t layers, int64_t T, dt_dtype dtype,
                           const dt_lora_params *lora, dt_model **m, dt_model_desc *d)
{
    dt_model_config mc = dt_model_config_default();
    mc.seq = T;
    mc.build.param_dtype = dtype;
    mc.build.lora = lora;
    if (s->h.is_gpt2) { /* the GPT-2 family by its sizes (a zoo name or a GPT2LMHeadModel directory) */
        const dt_gpt2_config *g = &s->h.gpt2;
        mc.n_layer = layers, mc.n_head = g->n_head, mc.n_embd = g->n_embd, mc.block_size = g->block_size;
        mc.vocab_size = g->vocab_size;
        return dt_model_create("gpt2", 1, &mc, m, d);
    }
    dt_llama_config lc = s->h.llama;
    lc.num_hidden_layers = layers;
    return dt_llama_create(&lc, 1, &mc, m, d);
}

/* The parameters that train in model m (the entries neither frozen nor buffers, a tied one once). */
static dt_status trained_params(const dt_model *m, double *out)
{
    dt_status st = DT_OK;
    *out = 0;
    for (size_t e = 0; st >= 0 && e < dt_model_num_entries(m); e++) {
        dt_param_info pi;
        if ((st = dt_model_entry(m, e, &pi)) >= 0 && !pi.is_buffer && !pi.frozen && pi.tied_to < 0)
            *out += (double)pi.numel;
    }
    return st;
}

dt_status dt_plan_lora_measure(const char *model, const char *targets, int64_t r, int64_t seq, dt_dtype dtype,
                               dt_plan_lora *out)
{
    if (!model || !targets || !out)
        return dt_error(DT_ERR_NULL, "dt_plan_lora_measure: NULL argument");
    memset(out, 0, sizeof *out);
    char buf[1024];
    const char *names[64];
    int n = 0;
    if (!*targets || strlen(targets) >= sizeof buf)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_lora_measure: targets '%.64s': a comma-separated list of layer "
                        "names under %zu bytes", targets, sizeof buf);
    snprintf(buf, sizeof buf, "%s", targets);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == 63)
            return dt_error(DT_ERR_INVALID_ARG, "dt_plan_lora_measure: more than 63 targets");
        names[n++] = t;
    }
    names[n] = NULL;
    if (!n)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_lora_measure: no target in '%s'", targets);
    if (dtype != DT_F32 && dtype != DT_BF16)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_lora_measure: dtype %s (f32 or bf16)", dt_dtype_name(dtype));
    dt_lora_params lp = dt_lora_params_default();
    if (r)
        lp.r = r;
    lp.targets = names;
    model_shape sh;
    dt_status st = shape_of(model, &sh);
    if (st < 0)
        return st;
    const int64_t T = seq > 0 ? (seq < sh.positions ? seq : sh.positions) : (sh.positions < 128 ? sh.positions : 128);
    int64_t *tok = malloc((size_t)(T + 1) * sizeof *tok);
    if (!tok)
        return dt_error(DT_ERR_NO_MEMORY, "dt_plan_lora_measure: tokens");
    for (int64_t i = 0; i <= T; i++)
        tok[i] = (i * 7919) % sh.vocab;
    /* copies of 1 and 2 blocks, without and with the adapters: each one's trained parameters, the best CPU time of
       3 forward + backward passes of one sample after a warm-up, and its arena's peak */
    double trained[2][2] = {{0}}, sec[2][2], peak[2][2];
    for (int lo = 0; lo < 2 && st >= 0; lo++)
        for (int k = 0; k < 2 && st >= 0; k++) {
            dt_model *m = NULL;
            dt_model_desc d;
            st = make_copy(&sh, k + 1, T, dtype, lo ? &lp : NULL, &m, &d);
            if (st >= 0)
                st = trained_params(m, &trained[lo][k]);
            if (st >= 0)
                dt_model_train(m, true);
            sec[lo][k] = INFINITY, peak[lo][k] = 0;
            for (int rep = 0; rep < 4 && st >= 0; rep++) {
                double t = 0, pk = 0;
                st = fwd_bwd(m, &d, tok, T, &t, &pk);
                if (rep > 0 && t < sec[lo][k])
                    sec[lo][k] = t;
                peak[lo][k] = pk;
            }
            dt_model_free(m);
        }
    free(tok);
    if (st < 0)
        return dt_error_wrap(st, "dt_plan_lora_measure (%s, targets %s)", model, targets);
    out->block = trained[1][1] - trained[1][0];
    out->fixed = trained[1][0] - out->block;
    out->act_block = (peak[1][1] - peak[1][0]) / (double)T;
    out->act_fixed = peak[1][0] / (double)T - out->act_block;
    if (out->act_block < 0)
        out->act_block = 0;
    if (out->act_fixed < 0)
        out->act_fixed = 0;
    out->fb_ratio = sec[0][1] > 0 ? sec[1][1] / sec[0][1] : 1;
    if (!(out->fb_ratio > 0))
        out->fb_ratio = 1;
    return DT_OK;
}

/* Blocks of the larger copy: the difference of K - 1 blocks over a 1-block copy is the block's cost,
   K - 1 times the signal of a 2-block copy against the noise of a shared machine. */
#define CALIB_K 3

/* The 1-block and the K-block copies, measured interleaved (each kind of run alternating between the
   two, so a burst of load falls on both), the best of 3 after a warm-up: plain at T tokens, plain at
   T/4 (the per-pass overhead), checkpointed at T. */
static dt_status run_pair(const model_shape *sh, int64_t T, dt_dtype dtype, const int64_t *tok, run_meas *one,
                          run_meas *many)
{
    dt_model *m[2] = {NULL, NULL};
    dt_model_desc d[2];
    run_meas *out[2] = {one, many};
    dt_status st = make_copy(sh, 1, T, dtype, NULL, &m[0], &d[0]);
    if (st >= 0)
        st = make_copy(sh, CALIB_K, T, dtype, NULL, &m[1], &d[1]);
    const int64_t Ts = T / 4 > 1 ? T / 4 : 1;
    for (int k = 0; k < 2 && st >= 0; k++) {
        dt_model_train(m[k], true);
        out[k]->numel = (double)dt_model_param_count(m[k]);
        out[k]->fb_s = out[k]->fb_short_s = out[k]->fb_ckpt_s = INFINITY;
    }
    for (int kind = 0; kind < 3 && st >= 0; kind++) {
        if (kind == 2) /* checkpoint every block of both copies */
            for (int k = 0; k < 2 && st >= 0; k++) {
                dt_act_ckpt_params ap = dt_act_ckpt_params_default();
                st = dt_model_desc_checkpoint(m[k], &d[k], &ap, NULL);
            }
        for (int r = 0; r < 4 && st >= 0; r++)
            for (int k = 0; k < 2 && st >= 0; k++) {
                double sec = 0, pk = 0;
                st = fwd_bwd(m[k], &d[k], tok, kind == 1 ? Ts : T, &sec, &pk);
                double *best = kind == 0 ? &out[k]->fb_s : kind == 1 ? &out[k]->fb_short_s : &out[k]->fb_ckpt_s;
                if (r > 0 && sec < *best)
                    *best = sec;
                if (kind == 0)
                    out[k]->act = pk;
                else if (kind == 2)
                    out[k]->act_ckpt = pk;
            }
    }
    dt_model_free(m[0]);
    dt_model_free(m[1]);
    return st;
}

dt_status dt_plan_model_id(const char *model, char *buf, size_t n, int64_t *positions)
{
    if (!model || !buf || !n)
        return dt_error(DT_ERR_NULL, "dt_plan_model_id: NULL argument");
    model_shape s;
    dt_status st = shape_of(model, &s);
    if (st < 0)
        return st;
    if (positions)
        *positions = s.positions;
    if (strncmp(model, "hf:", 3) && strlen(model) < 32) {
        snprintf(buf, n, "%s", model);
        return DT_OK;
    }
    /* a directory: the figures depend on the shape only, so the id is a hash of it (FNV-1a) */
    const dt_llama_config *l = &s.h.llama;
    const int64_t f[] = {s.h.is_gpt2, s.n_layer, s.n_head, s.n_kv_head, s.n_embd, s.vocab, s.positions,
                         s.h.is_gpt2 ? 0 : l->intermediate_size, s.h.is_gpt2 ? 0 : l->head_dim,
                         s.h.is_gpt2 ? 0 : l->tie_word_embeddings, s.h.is_gpt2 ? 0 : 2 * l->qk_norm};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        for (int b = 0; b < 8; b++)
            h = (h ^ (uint8_t)((uint64_t)f[i] >> (8 * b))) * 1099511628211ull;
    snprintf(buf, n, "%s-%016llx", s.h.is_gpt2 ? "hfgpt2" : "hfllama", (unsigned long long)h);
    return DT_OK;
}

/* Write every gradient of G (a small value, as backward leaves them: written pages, not the shared zero
   page an untouched buffer reads from). */
static void write_grads(const dt_flat *G)
{
    float *g = (float *)G->base;
    for (size_t i = 0; i < G->total; i++)
        g[i] = 1e-3f * (float)(i & 15);
}

/* Core-seconds per parameter of an AdamW step over model m's f32 parameters, as the trainer steps them
   (its gradients written by backward, zeroed in the same pass: dt_optim_set_zero_grad), and of the
   trainer's non-finite scan of the same gradients (dt_k_first_nonfinite: a read pass each step of a run
   without loss scaling) into *scan_per_param. On the process's threads, best of 3 after a warm-up. */
static dt_status time_optim(dt_model *m, double *per_param, double *scan_per_param)
{
    const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), *G = dt_model_flat(m, DT_FLAT_GRADS, DT_F32);
    if (!P || !G || !P->base || !G->base || !P->total || G->total != P->total || G->dtype != DT_F32)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_calibrate: the model has no f32 parameters to time AdamW on");
    dt_model_grads_materialize(m);
    dt_optim_range r = {.params = P, .grads = G, .lo = 0, .hi = P->total};
    dt_adam_params ap = dt_adamw_params_default();
    dt_optim *o = NULL;
    dt_status st = dt_optim_adamw_init(&ap, &r, 1, &o);
    if (st < 0)
        return st;
    dt_optim_set_zero_grad(o, true);
    double best = INFINITY, best_scan = INFINITY;
    for (int i = 0; i < 4 && st >= 0; i++) {
        write_grads(G);
        double t0 = cpu_s();
        const int64_t at = dt_k_first_nonfinite(G->base, DT_F32, (int64_t)G->total);
        double t1 = cpu_s();
        st = dt_optim_step(o);
        double t2 = cpu_s();
        if (at != (int64_t)G->total && st >= 0)
            st = dt_error(DT_ERR_STATE, "dt_plan_calibrate: a finite gradient read as non-finite at %lld",
                          (long long)at);
        if (i > 0 && t2 - t1 < best)
            best = t2 - t1;
        if (i > 0 && t1 - t0 < best_scan)
            best_scan = t1 - t0;
    }
    dt_optim_free(o);
    *per_param = best / (double)P->total;
    *scan_per_param = isfinite(best_scan) ? best_scan / (double)P->total : 0;
    return st;
}

/* flop/s of a [256 x C] x [C x C] product, the block's shape. */
static double time_matmul(int64_t C)
{
    dt_ctx_params cp = dt_ctx_params_default();
    dt_ctx *ctx = NULL;
    if (dt_ctx_init(&cp, &ctx) < 0)
        return 0;
    int64_t sa[2] = {256, C}, sb[2] = {C, C};
    dt_tensor *a = dt_tensor_zeros(ctx, DT_F32, 2, sa), *b = dt_tensor_zeros(ctx, DT_F32, 2, sb);
    double best = INFINITY;
    bool was = dt_ag_set_enabled(ctx, false);
    for (int i = 0; i < 4 && a && b; i++) {
        dt_arena_pos pos = dt_arena_mark(dt_ctx_arena(ctx));
        double t0 = dt_time_s();
        dt_tensor *c = dt_matmul(ctx, a, b);
        double s = dt_time_s() - t0;
        if (!c)
            break;
        if (i > 0 && s < best)
            best = s;
        dt_arena_rewind(dt_ctx_arena(ctx), pos);
    }
    dt_ag_set_enabled(ctx, was);
    dt_ctx_free(ctx);
    return isfinite(best) && best > 0 ? 2.0 * 256 * (double)C * (double)C / best : 0;
}

/* One thread's memcpy bandwidth over 64 MiB, bytes/s of CPU time (a busy machine's wall time would
   cache the load of the moment as this machine's bandwidth). */
static double time_copy(void)
{
    size_t n = 64u << 20;
    char *a = dt_alloc(n), *b = dt_alloc(n);
    double best = INFINITY;
    if (a && b) {
        memset(a, 1, n), memset(b, 2, n);
        for (int i = 0; i < 3; i++) {
            double t0 = cpu_s();
            memcpy(b, a, n);
            double s = cpu_s() - t0;
            if (s < best)
                best = s;
        }
    }
    dt_free(a), dt_free(b);
    return isfinite(best) && best > 0 ? (double)n / best : 1e9;
}

/* Core-seconds per token of what tensor parallelism leaves whole on every rank of a block: its two layer
   norms and two residual additions (forward + backward, [T x C] at width C), on one thread, best of 3. */
static double time_replicated(int64_t C, int64_t T)
{
    dt_ctx_params cp = dt_ctx_params_default();
    dt_ctx *ctx = NULL;
    if (dt_ctx_init(&cp, &ctx) < 0)
        return 0;
    int64_t sx[2] = {T, C}, sw[1] = {C};
    double best = INFINITY;
    for (int i = 0; i < 4; i++) {
        dt_arena_pos pos = dt_arena_mark(dt_ctx_arena(ctx));
        dt_tensor *x = dt_tensor_zeros(ctx, DT_F32, 2, sx), *g = dt_tensor_zeros(ctx, DT_F32, 1, sw),
                  *b = dt_tensor_zeros(ctx, DT_F32, 1, sw);
        if (!x || !g || !b || dt_tensor_fill(g, 1) < 0 || dt_tensor_fill(x, 0.5) < 0 ||
            dt_tensor_set_requires_grad(x, true) < 0 || dt_tensor_set_requires_grad(g, true) < 0 ||
            dt_tensor_set_requires_grad(b, true) < 0)
            break;
        double t0 = cpu_s();
        dt_tensor *h = dt_add(ctx, x, dt_layer_norm(ctx, x, g, b, 1e-5f));
        dt_tensor *y = h ? dt_add(ctx, h, dt_layer_norm(ctx, h, g, b, 1e-5f)) : NULL;
        dt_tensor *l = y ? dt_sum(ctx, y) : NULL;
        if (!l || dt_backward(ctx, l) < 0)
            break;
        double s = cpu_s() - t0;
        if (i > 0 && s < best)
            best = s;
        dt_arena_rewind(dt_ctx_arena(ctx), pos);
    }
    dt_ctx_free(ctx);
    return isfinite(best) && best > 0 ? best / (double)T : 0;
}

/* Minor page faults of this process so far (getrusage). */
static long minor_faults(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : 0;
}

/* What a fresh page costs beyond writing it, as bytes/s of CPU time (user + system): the fault and the
   kernel's zeroing, for the page kind a region gets. ZeRO-2/3 hand each unit's whole gradients back to
   the system (MADV_DONTNEED) after its reduce-scatter and fault them in again in the next backward; those
   regions are 2 MiB-aligned and advised MADV_HUGEPAGE (parallel/zero's region_map), so with transparent
   huge pages a fault maps and clears 2 MiB (measured on the development machine: 25-39 GB/s against
   2.6-2.9 for 4 KiB pages, a fault per 4 KiB). huge: time such a region (2 MiB-aligned, MADV_HUGEPAGE);
   *got_huge (may be NULL): whether it really got huge pages (its faults, counted by getrusage, were
   fewer than one per 64 KiB); where it did not (THP off, or no huge page free), the figure is the 4 KiB
   one. 32 MiB, best of 3. */
static double time_fault(bool huge, bool *got_huge)
{
    const size_t n = 32u << 20, H = 2u << 20;
    double best = INFINITY;
    bool all_huge = huge;
    int timed = 0;
    for (int i = 0; i < 3; i++) {
        char *p = mmap(NULL, n + H, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            break;
        char *a = (char *)(((uintptr_t)p + H - 1) & ~(uintptr_t)(H - 1));
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
        madvise(a, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
        const long f0 = minor_faults();
        double t0 = cpu_s();
        memset(a, 1, n); /* fresh pages: fault, zero, write */
        double t1 = cpu_s();
        const long faults = minor_faults() - f0;
        memset(a, 2, n); /* the same pages again: the write alone */
        double t2 = cpu_s();
        munmap(p, n + H);
        if (faults > (long)(n / (64u << 10)))
            all_huge = false;
        timed++;
        double s = (t1 - t0) - (t2 - t1);
        if (s > 0 && s < best)
            best = s;
    }
    if (got_huge)
        *got_huge = all_huge && timed > 0;
    return isfinite(best) && best > 0 ? (double)n / best : 4e9;
}

dt_status dt_plan_calibrate(const char *model, int64_t seq, dt_dtype dtype, dt_plan_calib *out)
{
    if (!model || !out)
        return dt_error(DT_ERR_NULL, "dt_plan_calibrate: NULL argument");
    model_shape sh;
    dt_status st = shape_of(model, &sh);
    if (st < 0)
        return st;
    if (seq == 0)
        seq = sh.positions < 128 ? sh.positions : 128;
    if (seq < 2 || seq > sh.positions)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_calibrate: seq %lld for %s (2..%lld, its positions)",
                        (long long)seq, model, (long long)sh.positions);
    if (dtype != DT_F32 && dtype != DT_BF16)
        return dt_error(DT_ERR_INVALID_ARG, "dt_plan_calibrate: dtype %s (f32 or bf16)", dt_dtype_name(dtype));
    dt_plan_calib c;
    memset(&c, 0, sizeof c);
    if ((st = dt_plan_model_id(model, c.model, sizeof c.model, NULL)) < 0)
        return st;
    c.seq = seq, c.dtype = dtype;
    c.cores = dt_cpu_cores();
    c.threads = process_threads(c.cores);
    c.n_layer = sh.n_layer, c.n_head = sh.n_head, c.n_kv_head = sh.n_kv_head, c.n_embd = sh.n_embd;
    c.vocab = sh.vocab;
    c.base_rss = rss_now();

    int64_t *tok = malloc(sizeof *tok * (size_t)(seq + 1));
    if (!tok)
        return dt_error(DT_ERR_NO_MEMORY, "dt_plan_calibrate: %lld tokens", (long long)seq);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i <= seq; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int64_t)((s >> 33) % (uint64_t)sh.vocab);
    }
    /* the work itself on one thread (a rank of a machine it shares with others has one: cores / ranks);
       then the one-block copy on every thread, for what the extra threads cost in core-seconds */
    const int threads_before = dt_get_num_threads();
    dt_set_num_threads(1);
    run_meas one = {0}, many = {0}, wide = {0}, wide_many = {0};
    st = run_pair(&sh, seq, dtype, tok, &one, &many);
    dt_set_num_threads(threads_before);
    if (st >= 0 && c.threads > 1)
        st = run_pair(&sh, seq, dtype, tok, &wide, &wide_many);
    free(tok);
    if (st < 0)
        return st;
    const double th = 1, T = (double)seq; /* the times are core-seconds already */
    c.thread_cost = c.threads > 1 && many.fb_s > 0 && wide_many.fb_s > many.fb_s ? wide_many.fb_s / many.fb_s : 1;
    const double K1 = CALIB_K - 1;
    run_meas two = many; /* per block: (K-block - 1-block) / (K - 1); "two" = one + one block */
    two.numel = one.numel + (many.numel - one.numel) / K1;
    two.fb_s = one.fb_s + (many.fb_s - one.fb_s) / K1;
    two.fb_short_s = one.fb_short_s + (many.fb_short_s - one.fb_short_s) / K1;
    two.fb_ckpt_s = one.fb_ckpt_s + (many.fb_ckpt_s - one.fb_ckpt_s) / K1;
    two.act = one.act + (many.act - one.act) / K1;
    two.act_ckpt = one.act_ckpt + (many.act_ckpt - one.act_ckpt) / K1;
#define POS(v) ((v) > 0 ? (v) : 0)
    c.numel_block = two.numel - one.numel;
    c.numel_fixed = POS(one.numel - c.numel_block);
    c.fb_block_s = POS(two.fb_s - one.fb_s) * th / T;
    c.fb_fixed_s = POS(one.fb_s * th / T - c.fb_block_s);
    c.fb_block_ckpt_s = POS(two.fb_ckpt_s - one.fb_ckpt_s) * th / T;
    if (c.fb_block_ckpt_s < c.fb_block_s * 4 / 3) /* it runs the forward again: a third of forward + backward
                                                      by FLOPs (2 of 6 per parameter); less is noise */
        c.fb_block_ckpt_s = c.fb_block_s * 4 / 3;
    c.act_block = POS(two.act - one.act) / T;
    c.act_fixed = POS(one.act / T - c.act_block);
    c.act_block_ckpt = POS(two.act_ckpt - one.act_ckpt) / T;
    /* the per-pass overhead (kernel launches, OpenMP's fork/join, the autograd's bookkeeping: what a
       pass costs beyond its tokens), from the same runs at T and T/4 tokens: fb(T) = a + b T */
    const double Ts = (double)(seq / 4 > 1 ? seq / 4 : 1);
    if (T > Ts) {
        const double a1 = (one.fb_short_s * T - one.fb_s * Ts) / (T - Ts);
        const double a2 = (two.fb_short_s * T - two.fb_s * Ts) / (T - Ts);
        c.pass_block_s = POS(a2 - a1);
        c.pass_fixed_s = POS(a1 - c.pass_block_s);
    }
#undef POS

    /* the optimizer, on an f32 one-block copy */
    dt_model *m = NULL;
    if ((st = make_copy(&sh, 1, seq, DT_F32, NULL, &m, NULL)) < 0)
        return st;
    st = time_optim(m, &c.optim_s, &c.nonfinite_s);
    dt_model_free(m);
    if (st < 0)
        return st;
    c.matmul_flops = time_matmul(sh.n_embd);
    c.copy_bw = time_copy();
    c.repl_block_s = time_replicated(sh.n_embd, seq);
    c.fault_bw = time_fault(false, NULL);
    bool thp = false;
    const double huge_bw = time_fault(true, &thp);
    c.fault_huge_bw = thp ? huge_bw : c.fault_bw; /* no huge pages here: the regions fault 4 KiB pages */
    c.thp = thp;
    c.coll_bw = c.ag_bw = c.rs_bw = c.copy_bw / 2;
    c.coll_lat_s = c.ag_lat_s = c.rs_lat_s = 20e-6;
    *out = c;
    return DT_OK;
}

/* The sizes of the collective curve: whole buffers (the all-reduce's, the all-gather's output, the
   reduce-scatter's input) of 64 KiB to 64 MiB, and how often each is timed (the first run of a size
   only warms its pages). */
static const size_t comm_sizes[] = {64u << 10, 1u << 20, 8u << 20, 64u << 20};
static const int comm_reps[] = {12, 6, 4, 3};
#define COMM_NSIZES (sizeof comm_sizes / sizeof comm_sizes[0])

/* Fit t = lat + x / bw over points (x bus bytes, t seconds), least squares on the relative error (each
   point weighted 1 / t^2: the small sizes fix the latency, the large ones the bandwidth). */
static void fit_curve(const double *x, const double *t, int n, double *lat, double *bw)
{
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        const double w = 1 / (t[i] * t[i]);
        sw += w, sx += w * x[i], sy += w * t[i], sxx += w * x[i] * x[i], sxy += w * x[i] * t[i];
    }
    const double det = sw * sxx - sx * sx;
    double b = det > 0 ? (sw * sxy - sx * sy) / det : 0, a = det > 0 ? (sy - b * sx) / sw : t[0];
    if (!(b > 0)) /* no slope (noise): the largest size's rate */
        b = t[n - 1] / x[n - 1], a = 0;
    if (!(a > 1e-6)) /* a call costs at least a microsecond; never below zero */
        a = 1e-6;
    if (a > t[0])
        a = t[0];
    *lat = a, *bw = 1 / b;
}

dt_status dt_plan_calibrate_comm(dt_pg *g, dt_plan_calib *c)
{
    if (!g || !c)
        return dt_error(DT_ERR_NULL, "dt_plan_calibrate_comm: NULL argument");
    const int n = dt_pg_size(g);
    if (n < 2)
        return DT_OK; /* nothing to measure: keep the estimate */
    const size_t big = comm_sizes[COMM_NSIZES - 1];
    char *in = dt_alloc(big), *out = dt_alloc(big);
    if (!in || !out) {
        dt_free(in), dt_free(out);
        return dt_error(DT_ERR_NO_MEMORY, "dt_plan_calibrate_comm: two buffers of %zu MiB", big >> 20);
    }
    memset(in, 0, big), memset(out, 0, big);
    /* t[kind][size]: the best of the timed runs on this rank; then the slowest rank's (MAX) */
    double t[3][COMM_NSIZES];
    dt_status st = DT_OK;
    for (size_t s = 0; s < COMM_NSIZES && st >= 0; s++) {
        const size_t whole = comm_sizes[s] / sizeof(float) / (size_t)n * (size_t)n; /* divisible by n */
        const size_t part = whole / (size_t)n;
        for (int k = 0; k < 3 && st >= 0; k++) {
            t[k][s] = INFINITY;
            for (int r = 0; r <= comm_reps[s] && st >= 0; r++) {
                const double t0 = dt_time_s();
                if (k == 0)
                    st = dt_pg_allreduce(g, in, out, whole, DT_F32, DT_REDUCE_SUM);
                else if (k == 1)
                    st = dt_pg_allgather(g, in, out, part, DT_F32);
                else
                    st = dt_pg_reduce_scatter(g, in, out, part, DT_F32, DT_REDUCE_SUM);
                const double sec = dt_time_s() - t0;
                if (r > 0 && sec < t[k][s])
                    t[k][s] = sec;
            }
        }
    }
    if (st >= 0)
        st = dt_pg_allreduce(g, DT_IN_PLACE, t, 3 * COMM_NSIZES, DT_F64, DT_REDUCE_MAX);
    dt_free(in), dt_free(out);
    if (st < 0)
        return dt_error(st, "dt_plan_calibrate_comm: the collective curve over %d ranks: %s", n, dt_last_error());
    /* bus bytes (nccl-tests' convention): a ring all-reduce moves 2 (n-1)/n of the buffer through each
       rank, an all-gather or a reduce-scatter (n-1)/n */
    double x[COMM_NSIZES];
    double *lat[3] = {&c->coll_lat_s, &c->ag_lat_s, &c->rs_lat_s}, *bw[3] = {&c->coll_bw, &c->ag_bw, &c->rs_bw};
    for (int k = 0; k < 3; k++) {
        for (size_t s = 0; s < COMM_NSIZES; s++) {
            const size_t whole = comm_sizes[s] / sizeof(float) / (size_t)n * (size_t)n * sizeof(float);
            x[s] = (double)whole * (k == 0 ? 2.0 : 1.0) * (n - 1) / n;
            if (!(t[k][s] > 0) || !isfinite(t[k][s]))
                return dt_error(DT_ERR_STATE, "dt_plan_calibrate_comm: a collective of %zu bytes took no time", whole);
        }
        fit_curve(x, t[k], (int)COMM_NSIZES, lat[k], bw[k]);
    }
    c->coll_measured = n;
    return DT_OK;
}

/* ---- the cache file: "key value" lines ---- */

#define CALIB_FIELDS(X)                                                                                              \
    X(n_layer, "%lld", (long long), int64_t) X(n_head, "%lld", (long long), int64_t)                                 \
    X(n_embd, "%lld", (long long), int64_t) X(vocab, "%lld", (long long), int64_t)                                   \
    X(threads, "%d", (int), int) X(numel_block, "%.17g", (double), double) X(numel_fixed, "%.17g", (double), double) \
    X(fb_block_s, "%.17g", (double), double) X(fb_fixed_s, "%.17g", (double), double)                                \
    X(fb_block_ckpt_s, "%.17g", (double), double) X(act_block, "%.17g", (double), double)                            \
    X(act_fixed, "%.17g", (double), double) X(act_block_ckpt, "%.17g", (double), double)                             \
    X(optim_s, "%.17g", (double), double) X(matmul_flops, "%.17g", (double), double)                                 \
    X(copy_bw, "%.17g", (double), double) X(coll_bw, "%.17g", (double), double)                                      \
    X(coll_lat_s, "%.17g", (double), double) X(coll_measured, "%d", (int), int)                                      \
    X(base_rss, "%.17g", (double), double) X(n_kv_head, "%lld", (long long), int64_t)                                \
    X(pass_block_s, "%.17g", (double), double) X(pass_fixed_s, "%.17g", (double), double)                          \
    X(thread_cost, "%.17g", (double), double) X(repl_block_s, "%.17g", (double), double)                       \
    X(fault_bw, "%.17g", (double), double) X(ag_bw, "%.17g", (double), double)                                     \
    X(ag_lat_s, "%.17g", (double), double) X(rs_bw, "%.17g", (double), double)                                       \
    X(rs_lat_s, "%.17g", (double), double) X(fault_huge_bw, "%.17g", (double), double)                             \
    X(thp, "%d", (int), int) X(nonfinite_s, "%.17g", (double), double)

dt_status dt_plan_calib_save(const dt_plan_calib *c, const char *path)
{
    if (!c || !path)
        return dt_error(DT_ERR_NULL, "dt_plan_calib_save: NULL argument");
    /* Written whole, then renamed into place (dt_file): never through a symlink, never over a device. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return dt_error(DT_ERR_NO_MEMORY, "planner calibration '%s': out of memory", path);
    fprintf(f, "dtrain-plan-calib 6\nmodel %s\nseq %lld\ndtype %s\ncores %d\n", c->model, (long long)c->seq,
            dt_dtype_name(c->dtype), c->cores);
#define W(name, fmt, cast, type) fprintf(f, #name " " fmt "\n", cast c->name);
    CALIB_FIELDS(W)
#undef W
    if (fclose(f) != 0) {
        free(text);
        return dt_error(DT_ERR_NO_MEMORY, "planner calibration '%s': out of memory", path);
    }
    dt_status st = dt_file_write_atomic(path, text, len, 0644);
    free(text);
    return st < 0 ? dt_error_wrap(st, "planner calibration") : DT_OK;
}

dt_status dt_plan_calib_load(const char *path, const char *model, int64_t seq, dt_dtype dtype, dt_plan_calib *out)
{
    if (!path || !model || !out)
        return dt_error(DT_ERR_NULL, "dt_plan_calib_load: NULL argument");
    /* O_NONBLOCK: a FIFO named here must not block the open; it is refused below with anything else that is not
       a regular file (a device would read as an empty, incomplete file). */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) /* a symlink is not read: as absent (measured again; the save refuses it too) */
        return dt_error(errno == ENOENT || errno == ELOOP ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                        "planner calibration '%s': %s", path,
                        errno == ELOOP ? "a symbolic link (not followed)" : strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dt_error(DT_ERR_FORMAT, "planner calibration '%s': not a regular file", path);
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return dt_error(DT_ERR_NO_MEMORY, "planner calibration '%s': %s", path, strerror(errno));
    }
    dt_plan_calib c;
    memset(&c, 0, sizeof c);
    char line[256], key[64], val[128], dname[16] = "";
    int version = 0, seen = 0, want = 0;
#define C1(name, fmt, cast, type) want++;
    CALIB_FIELDS(C1)
#undef C1
    long long sq = -1;
    const char *bad_ = NULL;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%63s %127s", key, val) != 2)
            continue;
        if (!strcmp(key, "dtrain-plan-calib"))
            version = atoi(val);
        else if (!strcmp(key, "model"))
            snprintf(c.model, sizeof c.model, "%.31s", val);
        else if (!strcmp(key, "seq"))
            sq = atoll(val);
        else if (!strcmp(key, "dtype"))
            snprintf(dname, sizeof dname, "%.15s", val);
        else if (!strcmp(key, "cores"))
            c.cores = atoi(val);
#define R(name, fmt, cast, type)                                                                                     \
    else if (!strcmp(key, #name)) {                                                                             \
        double d_ = strtod(val, NULL);                                                                           \
        if (d_ >= 0 && d_ <= (sizeof(type) < 8 ? 2e9 : 1e15)) /* bounded before any integer cast */            \
            c.name = (type)d_;                                                                                   \
        else if (!bad_)                                                                                          \
            bad_ = #name;                                                                                        \
        seen++;                                                                                                  \
    }
        CALIB_FIELDS(R)
#undef R
    }
    fclose(f);
    if (version >= 1 && version < 6) /* an older dtrain's figures (fewer of them; v3: no collective curve;
                                         v4: no huge-page faults, AdamW timed on unwritten gradients; v5:
                                         activations with every intermediate's gradient kept through backward):
                                         measure again */
        return dt_error(DT_ERR_NOT_FOUND, "planner calibration '%s' is version %d (this dtrain writes 6)", path,
                        version);
    if (version != 6 || seen != want || bad_)
        return dt_error(DT_ERR_FORMAT, "planner calibration '%s': not a complete version-6 file (%d of %d values%s%s); "
                        "delete it to measure again", path, seen, want, bad_ ? "; out of range: " : "",
                        bad_ ? bad_ : "");
    if (c.n_layer < 1 || c.n_head < 1 || c.n_kv_head < 1 || c.n_embd < 1 || c.vocab < 1)
        return dt_error(DT_ERR_FORMAT, "planner calibration '%s': a shape of zero; delete it to measure again", path);
    c.seq = sq;
    c.dtype = !strcmp(dname, dt_dtype_name(DT_BF16)) ? DT_BF16 : DT_F32;
    char id[32];
    if (dt_plan_model_id(model, id, sizeof id, NULL) < 0)
        return dt_error(DT_ERR_NOT_FOUND, "planner calibration '%s': %s", path, dt_last_error());
    if (strcmp(c.model, id) || (seq && c.seq != seq) || c.dtype != dtype || c.cores != dt_cpu_cores())
        return dt_error(DT_ERR_NOT_FOUND, "planner calibration '%s' was measured for %s, seq %lld, %s on %d cores",
                        path, c.model, (long long)c.seq, dname, c.cores);
    *out = c;
    return DT_OK;
}
