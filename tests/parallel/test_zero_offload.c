/* ZeRO stage 3 with parameter offload (parallel.h "Parameter offload",
 * dt_zero_params.offload_param): on two ranks, after several steps with
 * SGD (momentum) and AdamW, with gradient accumulation and clipping, the
 * parameters are bit-identical to stage 3 without offload, for one and two
 * buffers and with the optimizer state offloaded too; the shards are
 * regular files in a fresh run directory (a symlink planted in nvme_path is
 * left alone) and are removed at the end; the parameter bytes the trainer
 * reports drop; a bad path on one rank, a file-size limit (as a full disk)
 * on one rank and a shard file truncated under one rank mid-run fail on
 * every rank with an error naming the path or file (never a hang); mixed
 * precision, stage 2 and LAMB are refused by name. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "test.h"
#include "tmp_util.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];

/* Linear(8,16) ReLU, 6 x (Linear(16,16) ReLU), Linear(16,4): 8 units. */
static dt_model *deep_model(bool meta)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(8, 16, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    for (int i = 0; i < 6; i++) {
        dt_nn_add(net, NULL, dt_nn_linear(16, 16, true));
        dt_nn_add(net, NULL, dt_nn_relu());
    }
    dt_nn_add(net, NULL, dt_nn_linear(16, 4, true));
    dt_model_build_params bp = dt_model_build_params_default();
    bp.meta = meta;
    dt_model *m = NULL;
    return dt_model_build(net, 21, &bp, &m) < 0 ? NULL : m;
}

typedef struct run_cfg {
    dt_optim_kind kind;
    bool poff;        /* parameter offload */
    bool ooff;        /* optimizer-state offload too */
    int buffers;      /* offload_param.buffer_count */
    const char *path; /* nvme_path (NULL: g_root) */
    int steps;
    int truncate_after; /* > 0: after this many steps, truncate this rank's shard files */
} run_cfg;

typedef struct run_out {
    float *params; /* full parameters (malloc'ed) */
    size_t n;
    size_t param_bytes;
    int files;     /* regular files in the store directory during the run (-1: no store) */
    uint64_t bytes_read;
    dt_status st;  /* the first failure (init or step) */
    char msg[1024];
} run_out;

static dt_trainer_params tparams(const run_cfg *c)
{
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = c->kind;
    tp.sgd.lr = 0.05;
    tp.sgd.momentum = 0.9;
    tp.adamw.lr = 0.01;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    tp.grad_accum = 2;
    tp.clip_grad_norm = 0.5;
    tp.no_decay_1d = true;
    if (c->ooff) {
        tp.offload.device = DT_OFFLOAD_NVME;
        tp.offload.nvme_path = g_root;
        tp.offload.sub_group_size = 50;
        tp.offload.buffer_count = 2;
    }
    return tp;
}

/* Regular files (lstat: not symlinks) in dir, -1 when something else is there. */
static int regular_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char p[700];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (lstat(p, &sb) < 0 || !S_ISREG(sb.st_mode)) {
            n = -1;
            break;
        }
        n++;
    }
    closedir(d);
    return n;
}

static void truncate_all(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            (void)!truncate(p, 4);
    }
    if (d)
        closedir(d);
}

/* One run on pg: a lazily built model under stage 3 (one unit per Linear). */
static void run(dt_pg *pg, const run_cfg *c, run_out *o)
{
    memset(o, 0, sizeof *o);
    o->files = -1;
    const int rank = dt_pg_rank(pg), W = dt_pg_size(pg);
    dt_model *m = deep_model(true);
    dt_zero_params zp = dt_zero_params_default();
    zp.stage = 3;
    zp.init_seed = 21;
    zp.wrap_module_type = "Linear";
    if (c->poff) {
        zp.offload_param.device = DT_OFFLOAD_NVME;
        zp.offload_param.nvme_path = c->path ? c->path : g_root;
        zp.offload_param.buffer_count = c->buffers;
    }
    dt_strategy *s = NULL;
    dt_trainer *tr = NULL;
    dt_trainer_params tp = tparams(c);
    dt_status st = m ? dt_strategy_zero_init(pg, &zp, &s) : DT_ERR_NO_MEMORY;
    if (st >= 0)
        st = dt_trainer_init(m, s, &tp, &tr); /* takes s, even on failure */
    dt_zero *z = tr ? dt_strategy_zero(dt_trainer_strategy(tr)) : NULL;
    if (st >= 0 && dt_zero_param_store(z))
        o->files = regular_files(dt_nvme_store_dir(dt_zero_param_store(z)));
    for (int i = 0; i < c->steps && st >= 0; i++) {
        if (c->truncate_after && i == c->truncate_after && rank == 0)
            truncate_all(dt_nvme_store_dir(dt_zero_param_store(z)));
        dt_trainer_metrics r;
        st = trainer_step_on(tr, &k_mlp_data, ((int64_t)i * W + rank) * 6, 3, 2, 3 * W, &r);
    }
    if (st >= 0) {
        dt_trainer_memory mem;
        st = dt_trainer_memory_get(tr, &mem);
        o->param_bytes = mem.param_bytes;
    }
    if (st >= 0) {
        o->n = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32)->total;
        o->params = calloc(o->n, sizeof(float));
        st = o->params ? dt_zero_full_params(z, o->params) : DT_ERR_NO_MEMORY;
    }
    if (st >= 0 && dt_zero_param_store(z)) {
        dt_nvme_stats ns;
        dt_nvme_store_stats(dt_zero_param_store(z), &ns);
        o->bytes_read = ns.bytes_read;
    }
    o->st = st;
    if (st < 0)
        snprintf(o->msg, sizeof o->msg, "%s", dt_last_error());
    dt_trainer_free(tr);
    dt_model_free(m);
}

static int body_equal(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    const dt_optim_kind kinds[] = {DT_OPTIM_SGD, DT_OPTIM_ADAMW};
    for (int k = 0; k < 2; k++) {
        run_cfg base = {.kind = kinds[k], .steps = 3};
        run_out a;
        run(pg, &base, &a);
        TH_OK(a.st);
        const run_cfg variants[] = {
            {.kind = kinds[k], .poff = true, .buffers = 1, .steps = 3},
            {.kind = kinds[k], .poff = true, .buffers = 2, .steps = 3},
            {.kind = kinds[k], .poff = true, .ooff = true, .buffers = 2, .steps = 3},
        };
        for (int v = 0; v < 3; v++) {
            run_out b;
            run(pg, &variants[v], &b);
            TH_CHECK(b.st >= 0, "%s variant %d: %s", dt_optim_kind_name(kinds[k]), v, b.msg);
            TH_CHECK(a.n == b.n && !memcmp(a.params, b.params, a.n * sizeof(float)),
                     "rank %d, %s, variant %d: parameters differ from stage 3 without offload", rank,
                     dt_optim_kind_name(kinds[k]), v);
            TH_CHECK(b.files == 8, "variant %d: %d regular files in the store (want one per unit: 8)", v, b.files);
            TH_CHECK(b.bytes_read > 0, "nothing was read");
            TH_CHECK(b.param_bytes * 2 < a.param_bytes, "variant %d: parameter bytes %zu with offload, %zu without", v,
                     b.param_bytes, a.param_bytes);
            free(b.params);
        }
        dt_model *init = deep_model(false);
        TH_CHECK(max_rel_diff(a.params, t_params(init), a.n) > 1e-3, "the parameters did not move");
        dt_model_free(init);
        free(a.params);
    }
    dt_pg_free(pg);
    return 0;
}

/* Both ranks fail, rank `culprit` with want_mine in its message, the other
 * naming another rank. */
static int expect_both_fail(int rank, int culprit, const run_out *o, const char *want_mine)
{
    TH_CHECK(o->st < 0, "rank %d: the run did not fail", rank);
    if (rank == culprit)
        TH_CHECK(strstr(o->msg, want_mine), "rank %d: '%s' lacks '%s'", rank, o->msg, want_mine);
    else
        TH_CHECK(strstr(o->msg, "another rank"), "rank %d: '%s' does not blame another rank", rank, o->msg);
    fprintf(stderr, "[rank %d] %s\n", rank, o->msg);
    return 0;
}

static int body_bad_path(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    char bad[400];
    snprintf(bad, sizeof bad, "%s/no-such-dir", g_root);
    run_cfg c = {.kind = DT_OPTIM_SGD, .poff = true, .buffers = 2, .steps = 1, .path = rank == 1 ? bad : NULL};
    run_out o;
    run(pg, &c, &o);
    int rc = expect_both_fail(rank, 1, &o, bad);
    dt_pg_free(pg);
    return rc;
}

static int body_fsize(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    if (rank == 0) { /* as a full disk: no file of this rank may grow past 64 bytes */
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {64, 64};
        TH_CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
    }
    run_cfg c = {.kind = DT_OPTIM_SGD, .poff = true, .buffers = 2, .steps = 1};
    run_out o;
    run(pg, &c, &o);
    int rc = expect_both_fail(rank, 0, &o, ".param");
    if (rank == 0)
        TH_CHECK(strstr(o.msg, "file-size limit") || strstr(o.msg, "too large"), "'%s' does not say why", o.msg);
    dt_pg_free(pg);
    return rc;
}

static int body_truncated(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    run_cfg c = {.kind = DT_OPTIM_ADAMW, .poff = true, .buffers = 1, .steps = 3, .truncate_after = 1};
    run_out o;
    run(pg, &c, &o);
    int rc = expect_both_fail(rank, 0, &o, "end of file");
    if (rank == 0)
        TH_CHECK(strstr(o.msg, ".param"), "'%s' does not name the file", o.msg);
    dt_pg_free(pg);
    return rc;
}

TEST(offloaded_equals_in_memory)
{
    /* a symlink planted where a careless store might write: left alone */
    char link[400], victim[400];
    snprintf(victim, sizeof victim, "%s.victim", g_root);
    snprintf(link, sizeof link, "%s/unit0.param", g_root);
    FILE *f = fopen(victim, "w");
    ASSERT(f);
    fputs("keep", f);
    fclose(f);
    ASSERT(symlink(victim, link) == 0);
    ASSERT_EQ_INT(th_run(2, 90.0, body_equal, NULL, NULL), 0);
    struct stat sb;
    ASSERT(stat(victim, &sb) == 0 && sb.st_size == 4);
    unlink(link);
    unlink(victim);
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0); /* every run directory removed */
}

TEST(io_failures_fail_every_rank)
{
    int codes[2];
    ASSERT_EQ_INT(th_run(2, 60.0, body_bad_path, NULL, codes), 0);
    ASSERT_EQ_INT(th_run(2, 60.0, body_fsize, NULL, codes), 0);
    ASSERT_EQ_INT(th_run(2, 60.0, body_truncated, NULL, codes), 0);
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
}

TEST(refused_by_name)
{
    dt_pg *pg;
    dt_pg_params pp = dt_pg_params_default();
    pp.backend = "self";
    ASSERT_OK(dt_pg_init(&pp, &pg));
    /* stage 2 */
    dt_model *m = deep_model(false);
    dt_zero_params zp = dt_zero_params_default();
    zp.stage = 2;
    zp.offload_param.device = DT_OFFLOAD_NVME;
    zp.offload_param.nvme_path = g_root;
    dt_zero *z;
    ASSERT_STATUS(dt_zero_init(pg, m, &zp, &z), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "stage 3");
    /* a shard larger than buffer_size */
    zp.stage = 3;
    zp.wrap_module_type = "Linear";
    zp.offload_param.buffer_size = 10;
    ASSERT_STATUS(dt_zero_init(pg, m, &zp, &z), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "buffer_size");
    dt_model_free(m);
    /* LAMB (its norms need whole tensors) */
    m = deep_model(false);
    zp.offload_param.buffer_size = 1000;
    dt_strategy *s;
    ASSERT_OK(dt_strategy_zero_init(pg, &zp, &s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_LAMB;
    dt_trainer *tr;
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "parameter offload");
    dt_model_free(m);
    /* mixed precision: bf16 units */
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(8, 16, true));
    dt_model_build_params bp = dt_model_build_params_default();
    bp.param_dtype = DT_BF16;
    ASSERT_OK(dt_model_build(net, 3, &bp, &m));
    ASSERT_STATUS(dt_zero_init(pg, m, &zp, &z), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "bf16");
    dt_model_free(m);
    dt_pg_free(pg);
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
}

int main(void)
{
    if (!t_mkdtemp("zoff", g_root, sizeof g_root)) {
        perror("mkdtemp");
        return 1;
    }
    dt_set_num_threads(1);
    RUN(offloaded_equals_in_memory); /* forked ranks first: no I/O threads in the parent yet */
    RUN(io_failures_fail_every_rank);
    RUN(refused_by_name);
    rmdir(g_root);
    return TEST_REPORT();
}
