/* dtrain plan — which layout to run: dp x cp x tp x pp x ZeRO x micro-batches x
 * recomputation, ranked by predicted step time within the memory per rank
 * (plan.h, dt_plan_search), for the GPT-2 and Llama models (zoo or hf:DIR).
 *
 *     dtrain plan --model gpt2 [--seq 128] --world 4 [--mem-per-rank 4G]
 *                 [--global-batch 16] [--precision fp32|bf16] [--json]
 *                 [--calib FILE] [--recalibrate] [--all]
 *
 * The calibration (seconds) is cached in a file per model, sequence length
 * and precision: --calib FILE, else $DT_CACHE_DIR, $XDG_CACHE_HOME/dtrain
 * or $HOME/.cache/dtrain, plan-MODEL-sSEQ-DTYPE.calib; a calibration
 * also measures the collective curve of a 2-rank shared-memory group it
 * forks (dt__plan_comm_curve, about a second). The table lists the
 * feasible layouts fastest first, then (with --all; the first 10 without)
 * the infeasible ones with their reason; --json prints every layout, one
 * object a line. */
#include "cmd.h"
#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "dtrain/models.h"
#include "dtrain/offload.h"
#include "dtrain/plan.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* "4G", "512M", "3.5GiB", "1000000" -> bytes; 0 when malformed. */
double dt__plan_parse_bytes(const char *s)
{
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0))
        return 0;
    double mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1024.0, end++; break;
    case 'M': case 'm': mul = 1024.0 * 1024, end++; break;
    case 'G': case 'g': mul = 1024.0 * 1024 * 1024, end++; break;
    case 'T': case 't': mul = 1024.0 * 1024 * 1024 * 1024, end++; break;
    default: break;
    }
    if (mul > 1 && (!strcmp(end, "iB") || !strcmp(end, "B") || !strcmp(end, "ib") || !strcmp(end, "b")))
        end += strlen(end);
    if (mul == 1 && (!strcmp(end, "B") || !strcmp(end, "b")))
        end++;
    return *end ? 0 : v * mul;
}

/* The cache file for (model, seq, dtype) into buf; "" when no directory is known. */
void dt__plan_calib_path(const char *model, int64_t seq, dt_dtype dt, char *buf, size_t n)
{
    char id[32];
    buf[0] = 0;
    if (dt_plan_model_id(model, id, sizeof id, NULL) < 0)
        return; /* no id: nothing to cache under (the calibration says why) */
    const char *d = getenv("DT_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    char dir[4200] = "";
    if (d && *d)
        snprintf(dir, sizeof dir, "%.4000s", d);
    else if (x && *x)
        snprintf(dir, sizeof dir, "%.4000s/dtrain", x);
    else if (h && *h)
        snprintf(dir, sizeof dir, "%.4000s/.cache/dtrain", h);
    if (*dir && dt_dir_make(dir) == DT_OK) /* with its parents; not a symlink */
        snprintf(buf, n, "%.4100s/plan-%.31s-s%lld-%s.calib", dir, id, (long long)seq, dt_dtype_name(dt));
}

/* The collective curve of a 2-rank shared-memory group (dt_plan_calibrate_comm): two forked processes
 * form the group under a job id of their own and run the curve; rank 0 hands the fitted figures back
 * through a pipe. Fork before this process's first OpenMP region (libgomp is not fork-safe): callers
 * measure it before dt_plan_calibrate. Bounded: a group that does not finish within COMM_LIMIT_S is
 * killed. 0 with *c's curve filled, else nonzero with why[] naming the failure. */
#define COMM_LIMIT_S 30
int dt__plan_comm_curve(dt_plan_calib *c, char *why, size_t nwhy)
{
    typedef struct { double v[6]; int ok; char msg[200]; } result;
    int fds[2];
    if (pipe(fds) < 0) {
        snprintf(why, nwhy, "pipe: %s", strerror(errno));
        return 1;
    }
    char job[64];
    snprintf(job, sizeof job, "plancomm-%ld-%lld", (long)getpid(), (long long)(dt_time_s() * 1e6));
    pid_t pid[2] = {-1, -1};
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            snprintf(why, nwhy, "fork: %s", strerror(errno));
            break;
        }
        if (pid[r] == 0) {
            close(fds[0]);
            dt_pg_params pp = dt_pg_params_default();
            pp.rank = r, pp.world_size = 2, pp.local_rank = r, pp.local_world_size = 2;
            pp.backend = "shm", pp.job_id = job, pp.timeout_s = COMM_LIMIT_S;
            dt_pg *g = NULL;
            dt_plan_calib t;
            memset(&t, 0, sizeof t);
            result res;
            memset(&res, 0, sizeof res);
            dt_status st = dt_pg_init(&pp, &g);
            if (st >= 0)
                st = dt_plan_calibrate_comm(g, &t);
            res.ok = st >= 0;
            if (st < 0)
                snprintf(res.msg, sizeof res.msg, "%s", dt_last_error());
            const double v[6] = {t.coll_bw, t.coll_lat_s, t.ag_bw, t.ag_lat_s, t.rs_bw, t.rs_lat_s};
            memcpy(res.v, v, sizeof v);
            dt_pg_free(g);
            if (r == 0 && write(fds[1], &res, sizeof res) != (ssize_t)sizeof res)
                _exit(1);
            _exit(res.ok ? 0 : 1);
        }
    }
    close(fds[1]);
    result res;
    memset(&res, 0, sizeof res);
    size_t got = 0;
    const double t_end = dt_time_s() + COMM_LIMIT_S;
    while (pid[0] > 0 && pid[1] > 0 && got < sizeof res) {
        struct pollfd pf = {.fd = fds[0], .events = POLLIN};
        const double left = t_end - dt_time_s();
        if (left <= 0) {
            snprintf(why, nwhy, "the 2-rank group did not finish within %d s", COMM_LIMIT_S);
            break;
        }
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        ssize_t k = read(fds[0], (char *)&res + got, sizeof res - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            snprintf(why, nwhy, "its rank 0 ended without an answer");
            break;
        }
        got += (size_t)k;
    }
    close(fds[0]);
    for (int r = 0; r < 2; r++)
        if (pid[r] > 0) {
            if (got < sizeof res)
                kill(pid[r], SIGKILL);
            while (waitpid(pid[r], NULL, 0) < 0 && errno == EINTR)
                ;
        }
    if (got < sizeof res)
        return 1;
    if (!res.ok) {
        snprintf(why, nwhy, "%s", res.msg);
        return 1;
    }
    c->coll_bw = res.v[0], c->coll_lat_s = res.v[1], c->ag_bw = res.v[2], c->ag_lat_s = res.v[3];
    c->rs_bw = res.v[4], c->rs_lat_s = res.v[5], c->coll_measured = 2;
    return 0;
}

int dt__plan_calib_get(const char *who, const char *model, int64_t seq, dt_dtype dt, const char *file, bool fresh,
                       bool quiet, dt_plan_calib *c)
{
    char path[4200];
    if (file)
        snprintf(path, sizeof path, "%s", file);
    else
        dt__plan_calib_path(model, seq, dt, path, sizeof path);
    struct stat sb;
    if (*path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* "damaged: delete it" would be wrong advice */
        dt__cli_err("%s: planner calibration '%s' is a directory (--calib takes a file)\n", who, path);
        return 2;
    }
    if (!fresh && *path) {
        dt_status st = dt_plan_calib_load(path, model, seq, dt, c);
        if (st >= 0)
            return 0;
        if (st != DT_ERR_NOT_FOUND) { /* a damaged file: say so, measure again */
            dt__cli_err("%s: %s\n", who, dt_last_error());
            return 2;
        }
    }
    if (!quiet)
        fprintf(stderr, "%s: calibrating %s at seq %lld (%s) on this machine...\n", who, model, (long long)seq,
                dt_dtype_name(dt));
    double t0 = dt_time_s();
    /* the collective curve first: its group is forked, before this process's first OpenMP region */
    dt_plan_calib curve;
    memset(&curve, 0, sizeof curve);
    char why[240] = "";
    const int curve_rc = dt__plan_comm_curve(&curve, why, sizeof why);
    dt_status st = dt_plan_calibrate(model, seq, dt, c);
    if (st < 0) {
        dt__cli_err("%s: %s\n", who, dt_last_error());
        return st == DT_ERR_UNSUPPORTED || st == DT_ERR_INVALID_ARG || st == DT_ERR_NOT_FOUND ? 2 : 1;
    }
    if (!curve_rc) {
        c->coll_bw = curve.coll_bw, c->coll_lat_s = curve.coll_lat_s, c->ag_bw = curve.ag_bw;
        c->ag_lat_s = curve.ag_lat_s, c->rs_bw = curve.rs_bw, c->rs_lat_s = curve.rs_lat_s;
        c->coll_measured = curve.coll_measured;
    } else if (!quiet)
        dt__cli_err("%s: note: the collective curve was not measured (%s); collectives predicted from the memcpy "
                    "estimate\n", who, why);
    const double secs = dt_time_s() - t0;
    const bool saved = *path && dt_plan_calib_save(c, path) >= 0; /* "cached in" only once it is */
    if (!quiet)
        fprintf(stderr, "%s: calibrated in %.1f s%s%s\n", who, secs, saved ? "; cached in " : "", saved ? path : "");
    if (*path && !saved && !quiet)
        dt__cli_err("%s: note: %s (not cached)\n", who, dt_last_error());
    return 0;
}

void dt__plan_row_json(FILE *f, const dt_plan_prediction *r, int rank)
{
    const dt_plan_layout *l = &r->layout;
    fprintf(f, "{\"rank\":%d,\"dp\":%d,\"cp\":%d,\"cp_impl\":\"%s\",\"tp\":%d,\"sequence_parallel\":%s,\"pp\":%d,"
               "\"zero_stage\":%d,\"hybrid\":%s,\"batch\":%lld,\"micro_batches\":%d,\"grad_accum\":%d,"
               "\"act_ckpt\":%s,\"offload\":%s,\"mem_per_rank_bytes\":%.0f,"
               "\"state_bytes\":%.0f,\"gathered_bytes\":%.0f,\"buffer_bytes\":%.0f,\"act_bytes\":%.0f,\"base_bytes\":%.0f,"
               "\"step_ms\":%.3f,\"compute_ms\":%.3f,\"bubble_ms\":%.3f,\"comm_ms\":%.3f,\"optim_ms\":%.3f,"
               "\"feasible\":%s,\"reason\":\"",
            rank, l->dp, l->cp > 1 ? l->cp : 1, l->cp > 1 ? dt_cp_impl_name(l->cp_impl) : "none", l->tp,
            l->tp > 1 && l->sp ? "true" : "false", l->pp, l->zero_stage, l->hybrid ? "true" : "false",
            (long long)l->batch, l->micro_batches, l->grad_accum, l->act_ckpt ? "true" : "false", l->offload ? "true" : "false",
            r->mem_bytes, r->state_bytes, r->gathered_bytes, r->buffer_bytes, r->act_bytes, r->base_bytes, r->step_s * 1e3,
            r->compute_s * 1e3, r->bubble_s * 1e3, r->comm_s * 1e3, r->optim_s * 1e3, r->feasible ? "true" : "false");
    for (const char *s = r->reason; *s; s++) /* the library's text: printable ASCII; escape quotes anyway */
        fprintf(f, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
    fprintf(f, "\"}\n");
}

void dt__plan_row_text(FILE *f, const dt_plan_prediction *r, int rank)
{
    char buf[160];
    fprintf(f, "%4d  %-40s %9.2f %10.1f %9.1f %8.1f %8.1f", rank, dt_plan_layout_str(&r->layout, buf, sizeof buf),
            r->mem_bytes / (1024.0 * 1024 * 1024), r->step_s * 1e3, r->compute_s * 1e3, r->bubble_s * 1e3,
            r->comm_s * 1e3);
    fprintf(f, r->feasible ? "\n" : "  %s\n", r->reason);
}

void dt__plan_table_head(FILE *f)
{
    fprintf(f, "%4s  %-40s %9s %10s %9s %8s %8s\n", "rank", "layout", "mem GiB", "step ms", "compute", "bubble",
            "comm");
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain plan --world N [--model gpt2] [--seq 128] [--mem-per-rank BYTES] [--global-batch B]\n"
            "                   [--precision fp32|bf16] [--json] [--all] [--calib FILE] [--recalibrate]\n"
            "\n"
            "Lists the layouts of a GPT-2 or Llama model on N ranks of this machine (dp x cp x tp x pp:\n"
            "context parallelism as ring attention or Ulysses, tensor parallelism with or without sequence\n"
            "parallelism; ZeRO stage 0-3 and hybrid, gradient accumulation or pipeline micro-batches,\n"
            "activation checkpointing, optimizer offload), each with its predicted peak memory per rank and\n"
            "step time, feasible ones fastest first (of those within %.0f%% of the fastest, the simplest first:\n"
            "DDP before ZeRO before model parallelism), then infeasible ones with the reason.\n"
            "\n"
            "  --world N            ranks (required)\n"
            "  --model M            gpt2 | gpt2-medium | gpt2-large | gpt2-xl | gpt-mini | gpt-micro | llama-tiny |\n"
            "                       llama-100m | hf:DIR (a GPT-2 or Llama-family directory) (default gpt2)\n"
            "  --seq T              tokens per sample (default 128, at most the model's positions)\n"
            "  --mem-per-rank B     bytes one rank may use (K/M/G suffixes); default: MemAvailable / N\n"
            "  --global-batch B     samples per optimizer step over all replicas (default 2 N)\n"
            "  --precision P        fp32 (default) or bf16 parameters\n"
            "  --lora-targets NAMES LoRA fine-tuning (as dtrain train's): the model's parameters frozen, only\n"
            "                       the adapters on these layers train (comma-separated, or all-linear)\n"
            "  --lora-r R           LoRA's rank (default 8)\n"
            "  --json               one JSON object per layout (mem_per_rank_bytes, step_ms, the layout\n"
            "                       fields, feasible, reason), ranked\n"
            "  --all                the table lists every infeasible layout (default: the first 10)\n"
            "  --calib FILE         the calibration cache file (default: $DT_CACHE_DIR, $XDG_CACHE_HOME/dtrain\n"
            "                       or ~/.cache/dtrain, plan-MODEL-sSEQ-DTYPE.calib)\n"
            "  --recalibrate        measure again even when the cache has this machine's figures\n",
            100 * DT_PLAN_SIMPLER_WITHIN);
}

int dt_cmd_plan(int argc, char **argv)
{
    const char *model = "gpt2", *calib = NULL, *prec = "fp32", *lora = NULL;
    int64_t seq = 0, world = 0, gb = 0, lora_r = 0;
    double mem = 0;
    bool json = false, all = false, fresh = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = !strcmp(a, "--model") || !strcmp(a, "--seq") || !strcmp(a, "--world") ||
                     !strcmp(a, "--mem-per-rank") || !strcmp(a, "--global-batch") || !strcmp(a, "--precision") ||
                     !strcmp(a, "--calib") || !strcmp(a, "--lora-targets") || !strcmp(a, "--lora-r");
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(stdout), 0;
        if (takes && !v)
            return dt__cli_err("dtrain plan: %s needs a value\n", a), usage(stderr), 2;
        if (!strcmp(a, "--model"))
            model = dt__cli_hf_model(v), i++;
        else if (!strcmp(a, "--calib"))
            calib = v, i++;
        else if (!strcmp(a, "--precision"))
            prec = v, i++;
        else if (!strcmp(a, "--lora-targets"))
            lora = v, i++;
        else if (!strcmp(a, "--lora-r")) {
            if (dt_parse_int("--lora-r", v, 1, 65536, &lora_r) < 0)
                return dt__cli_err("dtrain plan: %s\n", dt_last_error()), 2;
            i++;
        }
        else if (!strcmp(a, "--seq")) {
            if (dt_parse_int("--seq", v, 2, 1 << 20, &seq) < 0)
                return dt__cli_err("dtrain plan: %s\n", dt_last_error()), 2;
            i++;
        } else if (!strcmp(a, "--world")) {
            if (dt_parse_int("--world", v, 1, 4096, &world) < 0)
                return dt__cli_err("dtrain plan: %s\n", dt_last_error()), 2;
            i++;
        } else if (!strcmp(a, "--global-batch")) {
            if (dt_parse_int("--global-batch", v, 1, 1 << 30, &gb) < 0)
                return dt__cli_err("dtrain plan: %s\n", dt_last_error()), 2;
            i++;
        } else if (!strcmp(a, "--mem-per-rank")) {
            if (!(mem = dt__plan_parse_bytes(v)))
                return dt__cli_err("dtrain plan: --mem-per-rank '%s': bytes, with an optional K, M, G or T suffix "
                                   "(e.g. 4G)\n", v), 2;
            i++;
        } else if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "--all"))
            all = true;
        else if (!strcmp(a, "--recalibrate"))
            fresh = true;
        else
            return dt__cli_err("dtrain plan: unknown option '%s'\n", a), usage(stderr), 2;
    }
    if (!world)
        return dt__cli_err("dtrain plan: --world N is required (the ranks to plan for)\n"), usage(stderr), 2;
    if (lora_r && !lora)
        return dt__cli_err("dtrain plan: --lora-r goes with --lora-targets NAMES\n"), 2;
    dt_dtype dt;
    if (!strcmp(prec, "fp32"))
        dt = DT_F32;
    else if (!strcmp(prec, "bf16"))
        dt = DT_BF16;
    else
        return dt__cli_err("dtrain plan: --precision '%s' (fp32 or bf16)\n", prec), 2;
    if (!mem) {
        size_t ma = SIZE_MAX;
        dt_mem_available(&ma, NULL);
        mem = ma == SIZE_MAX ? 0 : (double)ma / (double)world;
    }
    char id[32];
    int64_t positions = 0;
    if (dt_plan_model_id(model, id, sizeof id, &positions) < 0)
        return dt__cli_err("dtrain plan: --model '%s': %s\n", model, dt_last_error()), 2;
    if (!seq)
        seq = positions < 128 ? positions : 128;
    if (seq > positions)
        return dt__cli_err("dtrain plan: --seq %lld exceeds %s's %lld positions\n", (long long)seq, model,
                           (long long)positions), 2;
    dt_plan_calib c;
    int rc = dt__plan_calib_get("dtrain plan", model, seq, dt, calib, fresh, json, &c);
    if (rc)
        return rc;
    dt_plan_search_params sp = dt_plan_search_params_default();
    sp.world = (int)world, sp.global_batch = gb, sp.mem_per_rank = (size_t)mem;
    if (lora && dt_plan_lora_measure(model, lora, lora_r, seq, dt, &sp.lora) < 0)
        return dt__cli_err("dtrain plan: --lora-targets %s: %s\n", lora, dt_last_error()), 2;
    dt_plan_prediction *rows = NULL;
    int n = 0;
    if (dt_plan_search(&sp, &c, &rows, &n) < 0)
        return dt__cli_err("dtrain plan: %s\n", dt_last_error()), 2;
    int nfeas = 0;
    while (nfeas < n && rows[nfeas].feasible)
        nfeas++;
    char how[48] = "memcpy estimate";
    if (c.coll_measured)
        snprintf(how, sizeof how, "measured on %d ranks", c.coll_measured);
    if (json) {
        for (int i = 0; i < n; i++)
            dt__plan_row_json(stdout, &rows[i], i + 1);
    } else {
        printf("%s, seq %lld, %s, world %lld, global batch %lld, %.2f GiB per rank; calibration: %.0f GFLOP/s "
               "GEMM, collectives (bus GB/s + us a call; %s): all-reduce %.1f + %.0f, all-gather %.1f + %.0f, "
               "reduce-scatter %.1f + %.0f; fresh pages %.1f GB/s (4 KiB), %.1f (%s)\n",
               model, (long long)c.seq, prec, (long long)world, (long long)(gb ? gb : 2 * world),
               mem / (1024.0 * 1024 * 1024), c.matmul_flops / 1e9,
               how, c.coll_bw / 1e9, c.coll_lat_s * 1e6,
               c.ag_bw / 1e9, c.ag_lat_s * 1e6, c.rs_bw / 1e9, c.rs_lat_s * 1e6, c.fault_bw / 1e9,
               c.fault_huge_bw / 1e9, c.thp ? "2 MiB huge pages" : "no transparent huge pages here: 4 KiB");
        if (lora)
            printf("LoRA on %s (r %lld): %.0f adapter parameters a block train, the model's %.0f frozen; measured: "
                   "%.0f activation bytes a token a block (without LoRA %.0f), a pass %.2f of the full one's "
                   "compute\n", lora, (long long)(lora_r ? lora_r : dt_lora_params_default().r), sp.lora.block,
                   c.numel_block * (double)c.n_layer + c.numel_fixed, sp.lora.act_block, c.act_block,
                   sp.lora.fb_ratio);
        printf("%d layouts: %d feasible\n", n, nfeas);
        dt__plan_table_head(stdout);
        int shown = 0;
        for (int i = 0; i < n; i++) {
            if (!rows[i].feasible && !all && shown++ >= 10) {
                printf("  ... %d more infeasible (--all lists them)\n", n - i);
                break;
            }
            dt__plan_row_text(stdout, &rows[i], i + 1);
        }
    }
    dt_free(rows);
    return 0;
}
