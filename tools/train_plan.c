/* dtrain train and the planner (plan.h's prediction): --plan auto chooses
 * the layout before the process group exists, and every run of a GPT-2
 * or Llama model (zoo or hf:DIR) gets the prediction for its own layout in the --metrics end
 * record, beside what it measured.
 *
 * Every rank of --plan auto must choose the same layout without a group to
 * agree over (the layout decides the groups), so each one computes it from
 * the same inputs: one calibration file, measured by the first rank that
 * takes the file's lock (in a child process, so the rank's own peak memory
 * stays its training's; the others wait on the lock, then read the file),
 * and a memory limit every rank reads alike (MemTotal / ranks per machine,
 * or DT_PLAN_MEM_PER_RANK). The search's order is total, so equal inputs
 * give equal choices; the trainer's agreement check would still catch a
 * disagreement. */
#include "cmd.h"
#include "train.h"

#include "dtrain/comm.h"
#include "dtrain/models.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

/* The run's model and sequence for the planner; false when it is not a model the planner calibrates (a
   GPT-2 or Llama zoo model or hf:DIR, dt_plan_model_id) as named, without size flags. */
static bool plan_model(const dt__train_opts *o, int64_t *seq)
{
    char id[32];
    int64_t positions = 0;
    if (o->n_layer || o->n_head || o->n_embd || o->block_size || o->vocab_size || o->vocab ||
        dt_plan_model_id(o->model, id, sizeof id, &positions) < 0)
        return false;
    *seq = o->seq > 0 ? o->seq : positions;
    return true;
}

static dt_dtype plan_dtype(const dt__train_opts *o)
{
    return o->precision && !strcmp(o->precision, "bf16") ? DT_BF16 : DT_F32;
}

static double mem_total(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    double v = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) {
            v = (double)kb * 1024;
            break;
        }
    }
    if (f)
        fclose(f);
    return v;
}

/* Measures the calibration into the cache file in a fresh process, `dtrain
 * plan` run from this program's own file: for a process that has already
 * trained (libgomp is not fork-safe after a parallel region, and measured
 * here the calibration would take this process's resident model and
 * buffers for the baseline of every layout, and its thread count). Quiet:
 * the child's output goes to /dev/null. */
static int calib_exec(const dt__train_opts *o, int64_t seq)
{
    char seqs[32];
    snprintf(seqs, sizeof seqs, "%lld", (long long)seq);
    const char *prec = plan_dtype(o) == DT_BF16 ? "bf16" : "fp32";
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (nul >= 0) {
            dup2(nul, 1);
            dup2(nul, 2);
        }
        execl("/proc/self/exe", "dtrain", "plan", "--model", o->model, "--seq", seqs, "--precision", prec, "--world",
              "1", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* The calibration for the run: the cache file's, measured first when it is
 * absent, by one process at a time (the lock): in a child of this one
 * (child true: fork before this process's first parallel region), or, for
 * a process that ran one (child false), by `dtrain plan` in a fresh
 * process (calib_exec); without a cache directory that process gets no
 * calibration (nonzero: no prediction). quiet: no progress lines (the
 * measurement after training says what it is doing and how long it took:
 * it can take minutes). */
static int calib_for(const dt__train_opts *o, int64_t seq, bool quiet, bool child, dt_plan_calib *c)
{
    const char *who = "dtrain train: planner";
    char path[4300], lock[4310];
    dt__plan_calib_path(o->model, seq, plan_dtype(o), path, sizeof path);
    if (!*path) /* no cache directory: measure here, while nothing else is resident */
        return child ? dt__plan_calib_get(who, o->model, seq, plan_dtype(o), NULL, true, quiet, c) : 1;
    snprintf(lock, sizeof lock, "%s.lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0)
        while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
            ;
    int rc = 0;
    if (dt_plan_calib_load(path, o->model, seq, plan_dtype(o), c) < 0) {
        pid_t pid = child ? fork() : -1;
        if (pid == 0)
            _exit(dt__plan_calib_get(who, o->model, seq, plan_dtype(o), path, true, quiet, c));
        if (pid < 0 && child) {
            rc = dt__plan_calib_get(who, o->model, seq, plan_dtype(o), path, true, quiet, c);
        } else if (pid < 0) {
            /* after training: seconds for a small model, minutes for a large one at a long sequence */
            double t0 = dt_time_s();
            if (!quiet)
                fprintf(stderr, "%s: measuring the calibration of %s at seq %lld for the metrics' predicted_step_ms "
                                "(once on this machine; DT_PLAN_PREDICT=0 skips it)...\n",
                        who, o->model, (long long)seq);
            rc = calib_exec(o, seq);
            if (!rc && dt_plan_calib_load(path, o->model, seq, plan_dtype(o), c) < 0)
                rc = 1;
            if (!quiet)
                fprintf(stderr, "%s: the calibration %s in %.1f s%s%s\n", who,
                        rc ? "failed (no prediction in the metrics)" : "measured", dt_time_s() - t0,
                        rc ? "" : "; cached in ", rc ? "" : path);
        } else {
            int status = 0;
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
            if (!rc && dt_plan_calib_load(path, o->model, seq, plan_dtype(o), c) < 0)
                rc = (dt__cli_err("%s: %s\n", who, dt_last_error()), 1);
        }
    }
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
    return rc;
}

static void layout_params(const dt__train_opts *o, int world, int64_t seq, dt_plan_search_params *sp)
{
    (void)seq;
    *sp = dt_plan_search_params_default();
    int64_t local = world;
    dt_env_int("DT_LOCAL_WORLD_SIZE", world, 1, 1 << 20, &local);
    sp->world = world;
    sp->ranks_per_machine = (int)local;
    sp->optimizer = DT_OPTIM_ADAMW;
    dt_optim_kind_parse(o->optimizer, &sp->optimizer); /* checked by the flags */
    sp->sgd_momentum = o->momentum > 0;
}

/* LoRA measured into sp (the run's targets and rank, at seq tokens): 0, or 2 after saying why. timed false: the
   compute is the full model's (fb_ratio 1), for --plan auto, whose ranks each measure and must choose alike before
   they can talk: the counts and the arena's peaks are the same on every rank, a CPU time is not (the calibration's
   times reach them all through one cached file) */
static int layout_lora(const dt__train_opts *o, int64_t seq, bool timed, dt_plan_search_params *sp)
{
    if (!o->lora_targets)
        return 0;
    if (dt_plan_lora_measure(o->model, o->lora_targets, o->lora_r, seq, plan_dtype(o), &sp->lora) < 0)
        return dt__cli_err("dtrain train: the planner: --lora-targets %s: %s\n", o->lora_targets, dt_last_error()),
               2;
    if (!timed)
        sp->lora.fb_ratio = 1.0;
    return 0;
}

/* The run's options for layout l (ring with the causal balance or Ulysses without: their defaults). */
static void apply_layout(dt__train_opts *o, const dt_plan_layout *l)
{
    static const char *const stages[4] = {"0", "1", "2", "3"};
    o->dp = l->dp, o->tp = l->tp, o->pp = l->pp;
    o->cp = l->cp > 1 ? l->cp : 0;
    o->cp_impl = l->cp > 1 ? dt_cp_impl_name(l->cp_impl) : NULL;
    o->sequence_parallel = l->tp > 1 && l->sp;
    o->zero = l->hybrid ? NULL : stages[l->zero_stage & 3];
    o->fsdp = l->hybrid ? "hybrid_shard" : NULL;
    o->batch = l->batch;
    o->micro_batches = l->pp > 1 ? l->micro_batches : 0;
    o->grad_accum = l->grad_accum;
    o->act_ckpt = l->act_ckpt;
    o->wrap_min_params = l->wrap_min_params; /* ZeRO-2/3: a unit per block, as predicted */
    o->layout_flag = NULL;
}

int dt__train_plan_auto(dt__train_opts *o)
{
    int64_t seq = 0;
    if (!plan_model(o, &seq))
        return dt__cli_err("dtrain train: --plan auto plans the GPT-2 and Llama models (zoo or hf:DIR) as named, not "
                           "--model %s with --n-layer, --n-head, --n-embd, --block-size, --vocab-size or --vocab\n",
                           o->model), 2;
    int world = 1;
    if (dt_pg_env_world_size(&world) < 0)
        return dt__cli_err("dtrain train: %s\n", dt_last_error()), 2;
    int64_t rank = 0; /* the launchers' names for it (dt_pg_init reads the same) */
    static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++) {
        const char *v = getenv(rank_vars[i]);
        if (v && *v) {
            rank = atoll(v);
            break;
        }
    }
    const bool main_rank = rank == 0;
    dt_plan_calib c;
    int rc = calib_for(o, seq, !main_rank, true, &c);
    if (rc)
        return rc;
    dt_plan_search_params sp;
    layout_params(o, world, seq, &sp);
    if ((rc = layout_lora(o, seq, false, &sp)))
        return rc;
    sp.global_batch = o->batch * world;
    const char *env = getenv("DT_PLAN_MEM_PER_RANK");
    double mem = env && *env ? dt__plan_parse_bytes(env) : mem_total() / sp.ranks_per_machine;
    if (env && *env && !mem)
        return dt__cli_err("dtrain train: DT_PLAN_MEM_PER_RANK '%s': bytes, with an optional K, M, G or T suffix\n",
                           env), 2;
    sp.mem_per_rank = (size_t)mem;
    dt_plan_prediction *rows = NULL;
    int n = 0;
    if (dt_plan_search(&sp, &c, &rows, &n) < 0)
        return dt__cli_err("dtrain train: --plan auto: %s\n", dt_last_error()), 2;
    if (n == 0 || !rows[0].feasible) {
        dt__cli_err("dtrain train: --plan auto: no layout of %s on %d ranks with global batch %lld fits %.2f GiB per "
                    "rank; the smallest: %s\n", o->model, world, (long long)sp.global_batch,
                    mem / (1024.0 * 1024 * 1024), n ? rows[0].reason : "(none)");
        dt_free(rows);
        return 2;
    }
    /* the first feasible layout the run's other options allow (--sample-every refuses tp and cp, LoRA sequence
       parallelism): the run's own checks on a copy of the options with the layout, their message kept */
    int k = 0;
    char refused[600] = "", msg[512];
    for (; k < n && rows[k].feasible; k++) {
        dt__train_opts t = *o;
        apply_layout(&t, &rows[k].layout);
        dt__cli_err_capture(msg, sizeof msg);
        const int bad = dt__train_check(&t);
        dt__cli_err_capture(NULL, 0);
        if (!bad)
            break;
        if (!k) { /* the first one's reason, without the command's name */
            char lay[160];
            const char *m = strncmp(msg, "dtrain train: ", 14) ? msg : msg + 14;
            snprintf(refused, sizeof refused, "%s, %.1f ms: %s", dt_plan_layout_str(&rows[0].layout, lay, sizeof lay),
                     rows[0].step_s * 1e3, m);
        }
    }
    if (k == n || !rows[k].feasible) {
        dt__cli_err("dtrain train: --plan auto: every layout of %s on %d ranks that fits %.2f GiB per rank is one "
                    "this run's other options refuse; the first, %s\n", o->model, world,
                    mem / (1024.0 * 1024 * 1024), refused);
        dt_free(rows);
        return 2;
    }
    if (k) {
        const dt_plan_prediction keep = rows[k];
        memmove(rows + 1, rows, sizeof *rows * (size_t)k);
        rows[0] = keep;
    }
    const dt_plan_layout *l = &rows[0].layout;
    apply_layout(o, l);
    int feasible = 0;
    while (feasible < n && rows[feasible].feasible)
        feasible++;
    if (main_rank) {
        char a[160], b[160], why[800];
        /* dt_plan_search puts the simplest of the layouts predicted within DT_PLAN_SIMPLER_WITHIN of the fastest
           first: say so when the choice is not itself the fastest (it said "the fastest" over a runner-up 1%
           faster) */
        double fastest = rows[0].step_s;
        for (int i = 1; i < feasible; i++)
            if (rows[i].step_s < fastest)
                fastest = rows[i].step_s;
        if (k)
            snprintf(why, sizeof why, "the first this run's other options allow (refused: %s)", refused);
        else if (fastest < rows[0].step_s)
            snprintf(why, sizeof why, "the simplest of those within %g%% of the fastest (%.1f ms)",
                     DT_PLAN_SIMPLER_WITHIN * 100, fastest * 1e3);
        else
            snprintf(why, sizeof why, "the fastest");
        fprintf(stderr, "dtrain train: --plan auto chose %s: predicted %.2f GiB per rank, %.1f ms per step (compute "
                        "%.1f, bubble %.1f, collectives %.1f, optimizer %.1f); %s of %d feasible layouts of "
                        "%d within %.2f GiB per rank\n",
                dt_plan_layout_str(l, a, sizeof a), rows[0].mem_bytes / (1024.0 * 1024 * 1024), rows[0].step_s * 1e3,
                rows[0].compute_s * 1e3, rows[0].bubble_s * 1e3, rows[0].comm_s * 1e3, rows[0].optim_s * 1e3, why,
                feasible, n, mem / (1024.0 * 1024 * 1024));
        if (feasible > 1) /* signed: a simpler choice's runner-up may be predicted faster */
            fprintf(stderr, "dtrain train: --plan auto runner-up %s: %.2f GiB per rank, %.1f ms per step (%+.1f%%)\n",
                    dt_plan_layout_str(&rows[1].layout, b, sizeof b), rows[1].mem_bytes / (1024.0 * 1024 * 1024),
                    rows[1].step_s * 1e3, 100.0 * (rows[1].step_s / rows[0].step_s - 1));
    }
    dt_free(rows);
    return dt__train_check(o);
}

int dt__train_predict(const dt__train_opts *o, int world, int tp, int pp, int cp, int zero_stage, double *rss,
                      double *step_ms)
{
    *rss = *step_ms = 0;
    int64_t seq = 0;
    const char *e = getenv("DT_PLAN_PREDICT");
    if ((e && !strcmp(e, "0")) || !plan_model(o, &seq))
        return 0;
    dt_plan_calib c;
    if (calib_for(o, seq, false, false, &c))
        return 0; /* said why; the end record goes without a prediction */
    dt_plan_search_params sp;
    layout_params(o, world, seq, &sp);
    if (layout_lora(o, seq, true, &sp))
        return 0; /* said why; the end record goes without a prediction */
    const int mp = tp * pp * cp; /* the replicas: the world over the model's parallel degrees */
    dt_cp_impl impl = DT_CP_RING;
    if (o->cp_impl && dt_cp_impl_parse(o->cp_impl, &impl) < 0) /* checked by the parser */
        return 0;
    dt_plan_layout l = {.dp = mp > 0 && world % mp == 0 ? world / mp : 1, .cp = cp, .cp_impl = impl, .tp = tp,
                        .sp = tp > 1 && o->sequence_parallel, .pp = pp,
                        .zero_stage = zero_stage,
                        .hybrid = o->fsdp && !strcmp(o->fsdp, "hybrid_shard"), .batch = o->batch,
                        .micro_batches = pp > 1 ? (int)(o->micro_batches ? o->micro_batches : 4) : 1,
                        .grad_accum = (int)(o->grad_accum > 0 ? o->grad_accum : 1), .act_ckpt = o->act_ckpt,
                        .offload = o->offload && !strncmp(o->offload, "nvme:", 5),
                        .wrap_min_params = o->wrap_min_params};
    sp.offload_dir = l.offload;
    dt_plan_prediction pr;
    if (dt_plan_predict(&sp, &c, &l, &pr) < 0)
        return 0;
    *rss = pr.mem_bytes, *step_ms = pr.step_s * 1e3;
    return 0;
}
