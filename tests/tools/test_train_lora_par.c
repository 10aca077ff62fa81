/* LoRA under tensor and pipeline parallelism, through `dtrain run`, against
 * the one-process LoRA run of the same model, seed and batches:
 *  - llama-tiny with adapters on all seven projections (q/k/v/gate/up
 *    column-parallel, o/down row-parallel) under --tp 2, --pp 2 and
 *    --dp 2 --tp 2 --pp 2 (8 ranks) follows the one-process step losses
 *    and validation loss; --save-lora writes adapters within 1e-6 of the
 *    one-process run's (the same names, shapes and adapter_config.json)
 *    and --save-hf the same merged model within 1e-6;
 *  - gpt-micro with adapters on c_attn (column-parallel in three chunks),
 *    c_proj and c_fc under --tp 2 and --pp 2 alike;
 *  - a --tp 2 LoRA checkpoint resumes in one process and a one-process one
 *    under --tp 2, each giving the uninterrupted run's later losses;
 *    --lora-from the one-process adapters under --tp 2 starts from them
 *    (the first loss of a run from them is the one-process run's);
 *  - --lora-dropout under --tp 2 draws the one-process masks;
 *  - --freeze under --tp 2 starts from the one-process weights (the frozen
 *    parameters used to keep the tensor-parallel model's own draw);
 *  - --tp 2 --sequence-parallel (the adapters added beside the layers'
 *    own products: dt_tp_sp_lora) follows it too, for both models, and
 *    with GPT-2's --lora-dropout the one-process masks; llama-tiny under
 *    --cp 2 --tp 2 --sequence-parallel (4 ranks) as well;
 *  - gpt-micro with DoRA adapters (--lora-dora) under --pp 2 and --cp 2 alike;
 *  - --lora-dropout with --cp is refused (exit 2, said): its masks follow
 *    a rank's rows, not the positions.
 * SGD with momentum (AdamW would turn rounding-level gradients into full
 * steps, see test_train_llama_par.c). The bound is that test's: each step
 * loss within 1e-5 relative plus 1.5e-6, the printed validation loss
 * within 2e-4. A replicated adapter whose gradient is not summed over the
 * group, or a row-parallel adapter summed twice, is off by far more. Small
 * runs (4 steps of 8 sequences of 16 tokens, one thread a rank) with
 * generous timeouts: 8 ranks on a loaded 2-core machine. */
// dt-test-timeout: 900
// dt-test-labels: threads
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "test.h"
#include "tmp_util.h"
#include "tools/train_cli.h"

#include <math.h>
#include <stdlib.h>

static char g_data[320];
static const char *g_llama_targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";

typedef struct {
    const char *tag;
    char *model[10];
    const char *targets;
} model_t;

static const model_t g_llama = {"llama", {"--model", "llama-tiny", NULL}, NULL};
static const model_t g_gpt = {"gpt", {"--model", "gpt-micro", "--vocab-size", "160", "--n-embd", "32", "--n-head", "4",
                                      NULL}, "c_attn,c_proj,c_fc"};
static const model_t g_gpt_dora = {"gpt_dora", {"--model", "gpt-micro", "--vocab-size", "160", "--n-embd", "32",
                                                "--n-head", "4", "--lora-dora", NULL}, "c_attn,c_proj,c_fc"};

/* dtrain [run -n ranks --] train <model> --lora-* ... extra, metrics into m. */
static void run(cli_result *r, const model_t *md, int ranks, const char *batch, const char *m, char *const *extra)
{
    char *base[] = {"train", "--seq", "16", "--data", g_data, "--val-data", g_data, "--limit-train", "32",
                    "--limit-test", "8", "--batch", (char *)batch, "--optimizer", "sgd", "--lr", "0.5", "--momentum",
                    "0.9", "--seed", "3", "--threads", "1", "--progress", "plain", "--log-every", "1", "--metrics",
                    (char *)m, NULL};
    char *lora[] = {"--lora-targets", (char *)(md->targets ? md->targets : g_llama_targets), "--lora-r", "4",
                    "--lora-alpha", "8", NULL};
    if (md->targets && !md->targets[0]) /* --lora-from in extra */
        lora[0] = NULL;
    cli_run_ranks(r, 400, "DT_INIT_TIMEOUT=120", ranks, 4, (char *const *const[]){base, md->model, lora, extra});
}

typedef struct {
    double loss[64], val;
    int n;
} curve;

static curve g_one[3]; /* llama, gpt, gpt with DoRA */

static const char *outp(const model_t *md, const char *what)
{
    static char b[8][400];
    static int k;
    char n[200];
    snprintf(n, sizeof n, "%s_%s", md->tag, what);
    k = (k + 1) % 8;
    snprintf(b[k], sizeof b[k], "%s", cli_path(n));
    return b[k];
}

/* the F32 tensors of safetensors files a and b: the same names and shapes,
 * values within tol; returns how many, -1 on a difference */
static int same_st(const char *a, const char *b, double tol)
{
    dt_st_file *fa = NULL, *fb = NULL;
    int n = -1;
    if (dt_st_open(a, &fa) < 0 || dt_st_open(b, &fb) < 0 || dt_st_count(fa) != dt_st_count(fb)) {
        fprintf(stderr, "%s / %s: cannot open, or not the same tensors\n", a, b);
        goto out;
    }
    n = 0;
    for (size_t i = 0; i < dt_st_count(fa) && n >= 0; i++) {
        const dt_st_tensor *ta = dt_st_tensor_at(fa, i), *tb = dt_st_find(fb, ta->name);
        bool ok = tb && ta->dtype == DT_ST_F32 && tb->dtype == DT_ST_F32 && ta->ndim == tb->ndim;
        for (int d = 0; ok && d < ta->ndim; d++)
            ok = ta->shape[d] == tb->shape[d];
        float *x = ok ? malloc(ta->nbytes + 4) : NULL, *y = ok ? malloc(tb->nbytes + 4) : NULL;
        ok = ok && x && y && dt_st_read(fa, ta, 0, ta->nbytes, x) >= 0 && dt_st_read(fb, tb, 0, tb->nbytes, y) >= 0;
        double dmax = 0;
        for (uint64_t k = 0; ok && k < ta->numel; k++)
            dmax = fmax(dmax, fabs((double)x[k] - (double)y[k]));
        if (!ok || !(dmax <= tol)) {
            fprintf(stderr, "%s: '%s' differs (max |a - b| %g)\n", b, ta->name, dmax);
            n = -1;
        } else {
            n++;
        }
        free(x);
        free(y);
    }
out:
    dt_st_close(fa);
    dt_st_close(fb);
    return n;
}

static bool read_curve(const char *m, const cli_result *r, curve *c)
{
    c->n = cli_step_losses(m, c->loss, 64);
    c->val = cli_out_value(r->out, "val loss: ");
    return c->n == 4;
}

/* the one-process run of md: losses, adapters, merged model, checkpoints */
static void one_process(int k, const model_t *md)
{
    static cli_result r;
    const char *m = outp(md, "one.jsonl");
    run(&r, md, 1, "8", m, (char *[]){"--save-lora", (char *)outp(md, "one_lora"), "--save-hf",
                                       (char *)outp(md, "one_hf"), "--save", (char *)outp(md, "one_ck"),
                                       "--save-every", "2", NULL});
    if (r.code == 0)
        read_curve(m, &r, &g_one[k]);
}

/* md under strategy `name` (flags) follows the one-process run, and its
 * adapters and merged model are the one-process run's within 1e-6 */
static void follows(int k, const model_t *md, const char *name, int ranks, const char *batch, char *const *flags)
{
    static cli_result r;
    ASSERT_EQ_INT(g_one[k].n, 4);
    char tag[100], lo[100], hf[100];
    snprintf(tag, sizeof tag, "%s.jsonl", name);
    snprintf(lo, sizeof lo, "%s_lora", name);
    snprintf(hf, sizeof hf, "%s_hf", name);
    char *extra[16] = {"--save-lora", (char *)outp(md, lo), "--save-hf", (char *)outp(md, hf)};
    int n = 4;
    for (int i = 0; flags[i]; i++)
        extra[n++] = flags[i];
    extra[n] = NULL;
    const char *m = outp(md, tag);
    run(&r, md, ranks, batch, m, extra);
    ASSERT_EQ_INT(r.code, 0);
    curve c;
    ASSERT(read_curve(m, &r, &c));
    fprintf(stderr, "%s %s: val loss %.6f (one process %.6f)\n", md->tag, name, c.val, g_one[k].val);
    ASSERT(fabs(c.val - g_one[k].val) <= 2e-4);
    ASSERT(cli_same_losses(c.loss, c.n, g_one[k].loss, g_one[k].n, 1.5e-6));
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/adapter_model.safetensors", outp(md, "one_lora"));
    snprintf(b, sizeof b, "%s/adapter_model.safetensors", outp(md, lo));
    ASSERT(same_st(a, b, 1e-6) >= 4);
    snprintf(a, sizeof a, "%s/adapter_config.json", outp(md, "one_lora"));
    snprintf(b, sizeof b, "%s/adapter_config.json", outp(md, lo));
    char *ca = t_slurp(a, NULL), *cb = t_slurp(b, NULL);
    ASSERT(ca && cb && !strcmp(ca, cb));
    free(ca);
    free(cb);
    snprintf(a, sizeof a, "%s/model.safetensors", outp(md, "one_hf"));
    snprintf(b, sizeof b, "%s/model.safetensors", outp(md, hf));
    ASSERT(same_st(a, b, 1e-6) >= 4);
}

static char *g_tp2[] = {"--tp", "2", NULL};
static char *g_pp2[] = {"--pp", "2", "--micro-batches", "2", NULL};
static char *g_3d[] = {"--dp", "2", "--tp", "2", "--pp", "2", "--micro-batches", "2", NULL};

static char *g_cp2[] = {"--cp", "2", NULL};

TEST(llama_tp2) { follows(0, &g_llama, "tp2", 2, "8", g_tp2); }
TEST(llama_pp2) { follows(0, &g_llama, "pp2", 2, "8", g_pp2); }
TEST(llama_dp2_tp2_pp2) { follows(0, &g_llama, "3d", 8, "4", g_3d); }
TEST(gpt_tp2) { follows(1, &g_gpt, "tp2", 2, "8", g_tp2); }
TEST(gpt_pp2) { follows(1, &g_gpt, "pp2", 2, "8", g_pp2); }
TEST(gpt_dora_pp2) { follows(2, &g_gpt_dora, "pp2", 2, "8", g_pp2); }
TEST(gpt_dora_cp2) { follows(2, &g_gpt_dora, "cp2", 2, "8", g_cp2); }
static char *g_tp2sp[] = {"--tp", "2", "--sequence-parallel", NULL};
TEST(llama_tp2_sequence_parallel) { follows(0, &g_llama, "tp2sp", 2, "8", g_tp2sp); }
TEST(gpt_tp2_sequence_parallel) { follows(1, &g_gpt, "tp2sp", 2, "8", g_tp2sp); }
static char *g_cp2tp2sp[] = {"--cp", "2", "--tp", "2", "--sequence-parallel", NULL};
TEST(llama_cp2_tp2_sequence_parallel) { follows(0, &g_llama, "cp2tp2sp", 4, "8", g_cp2tp2sp); }

/* --lora-dropout with --cp: the masks would follow a rank's rows (the other ranks' rows' masks): refused by the
 * options, and by the models' build for --lora-from's dropout (adapters saved with dropout 0.1) */
TEST(dropout_cp_refused)
{
    static cli_result r;
    run(&r, &g_gpt, 2, "8", outp(&g_gpt, "dropcp.jsonl"), (char *[]){"--lora-dropout", "0.1", "--cp", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lora-dropout does not combine with --cp 2");
    run(&r, &g_llama, 1, "8", outp(&g_llama, "drop_save.jsonl"),
        (char *[]){"--lora-dropout", "0.1", "--no-eval", "--max-steps", "1", "--save-lora",
                   (char *)outp(&g_llama, "drop_lora"), NULL});
    ASSERT_EQ_INT(r.code, 0);
    static const model_t from = {"llama", {"--model", "llama-tiny", NULL}, ""};
    run(&r, &from, 2, "8", outp(&g_llama, "dropcp.jsonl"),
        (char *[]){"--lora-from", (char *)outp(&g_llama, "drop_lora"), "--cp", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "llama: LoRA dropout 0.1 with context parallelism is not supported");
}

/* a checkpoint saved at step 2 by `from` resumed by `to` gives the
 * one-process run's last two losses */
static void cross(const char *name, int from_ranks, char *const *from, int to_ranks, char *const *to)
{
    static cli_result r;
    ASSERT_EQ_INT(g_one[0].n, 4);
    char save[100], ck[600], tail[100];
    snprintf(save, sizeof save, "%s_part", name);
    snprintf(tail, sizeof tail, "%s.jsonl", name);
    char *sv[12] = {"--save", (char *)outp(&g_llama, save), "--max-steps", "2"}, *rs[12] = {"--resume", ck};
    int n = 4, k = 2;
    for (int i = 0; from[i]; i++)
        sv[n++] = from[i];
    for (int i = 0; to[i]; i++)
        rs[k++] = to[i];
    sv[n] = rs[k] = NULL;
    run(&r, &g_llama, from_ranks, "8", outp(&g_llama, "part.jsonl"), sv);
    ASSERT_EQ_INT(r.code, 0);
    snprintf(ck, sizeof ck, "%s/step-00000002", outp(&g_llama, save));
    const char *m = outp(&g_llama, tail);
    run(&r, &g_llama, to_ranks, "8", m, rs);
    ASSERT_EQ_INT(r.code, 0);
    double a[64];
    int na = cli_step_losses(m, a, 64);
    ASSERT(cli_same_losses(a, na, g_one[0].loss + 2, 2, 1.5e-6));
}

static char *g_none[] = {NULL};
TEST(tp2_checkpoint_resumes_in_one_process) { cross("tp2_to_one", 2, g_tp2, 1, g_none); }
TEST(one_process_checkpoint_resumes_under_tp2) { cross("one_to_tp2", 1, g_none, 2, g_tp2); }

/* --lora-from the one-process adapters: the first loss is the same in one
 * process and under --tp 2 (and not the fresh adapters' first loss) */
TEST(lora_from_under_tp2)
{
    static cli_result r;
    ASSERT_EQ_INT(g_one[0].n, 4);
    char *from[] = {"--lora-from", (char *)outp(&g_llama, "one_lora"), "--max-steps", "1", NULL};
    char *from_tp[] = {"--lora-from", (char *)outp(&g_llama, "one_lora"), "--max-steps", "1", "--tp", "2", NULL};
    const model_t md = {"llama", {"--model", "llama-tiny", NULL}, ""};
    double a[8], b[8];
    run(&r, &md, 1, "8", outp(&g_llama, "from1.jsonl"), from);
    ASSERT_EQ_INT(r.code, 0);
    run(&r, &md, 2, "8", outp(&g_llama, "from2.jsonl"), from_tp);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_EQ_INT(cli_step_losses(outp(&g_llama, "from1.jsonl"), a, 8), 1);
    ASSERT_EQ_INT(cli_step_losses(outp(&g_llama, "from2.jsonl"), b, 8), 1);
    fprintf(stderr, "--lora-from: first loss %.6f (one process), %.6f (--tp 2), fresh %.6f\n", a[0], b[0],
            g_one[0].loss[0]);
    ASSERT(fabs(a[0] - b[0]) <= 1e-5 * fabs(a[0]) + 1.5e-6);
    ASSERT(fabs(a[0] - g_one[0].loss[0]) > 1e-3);
}

/* --lora-dropout 0.1 under --tp 2: the one-process masks (a row-parallel
 * adapter's columns take their part of the full input's mask), so the
 * one-process losses */
TEST(dropout_tp2_follows_one_process)
{
    static cli_result r;
    const char *m1 = outp(&g_llama, "drop1.jsonl"), *m2 = outp(&g_llama, "drop2.jsonl");
    run(&r, &g_llama, 1, "8", m1, (char *[]){"--lora-dropout", "0.1", "--no-eval", NULL});
    ASSERT_EQ_INT(r.code, 0);
    run(&r, &g_llama, 2, "8", m2, (char *[]){"--lora-dropout", "0.1", "--no-eval", "--tp", "2", NULL});
    ASSERT_EQ_INT(r.code, 0);
    double a[64], b[64];
    int na = cli_step_losses(m2, a, 64), nb = cli_step_losses(m1, b, 64);
    ASSERT_EQ_INT(nb, 4);
    ASSERT(fabs(b[3] - g_one[0].loss[3]) > 1e-4); /* the dropout is on */
    ASSERT(cli_same_losses(a, na, b, nb, 1.5e-6));
}

/* --freeze under --tp 2 (no LoRA): the one-process losses */
TEST(freeze_tp2_follows_one_process)
{
    static cli_result r;
    char *args1[] = {"train", "--model", "llama-tiny", "--seq", "16", "--data", g_data, "--limit-train", "32",
                     "--batch", "8", "--optimizer", "sgd", "--lr", "0.5", "--seed", "3", "--threads", "1",
                     "--progress", "plain", "--log-every", "1", "--no-eval", "--freeze", "*.mlp.*", "--metrics", NULL, NULL};
    const int mi = (int)(sizeof args1 / sizeof *args1) - 2;
    char *tp[] = {"--tp", "2", NULL};
    const char *m1 = cli_path("freeze1.jsonl"), *m2 = cli_path("freeze2.jsonl");
    args1[mi] = (char *)m1;
    cli_run_ranks(&r, 300, "DT_INIT_TIMEOUT=120", 1, 1, (char *const *const[]){args1});
    ASSERT_EQ_INT(r.code, 0);
    args1[mi] = (char *)m2;
    cli_run_ranks(&r, 300, "DT_INIT_TIMEOUT=120", 2, 2, (char *const *const[]){args1, tp});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(cli_same_metrics(m2, m1, -1, 1.5e-6));
}

/* --lora-dropout under --tp 2 --sequence-parallel: the column adapters' dropout on the gathered rows, the row
 * adapters' on their columns of the whole rows: the one-process masks (GPT-2's c_attn, c_proj and c_fc) */
TEST(gpt_dropout_tp2_sp_follows_one_process)
{
    static cli_result r;
    const char *m1 = outp(&g_gpt, "drop1.jsonl"), *m2 = outp(&g_gpt, "drop2sp.jsonl");
    run(&r, &g_gpt, 1, "8", m1, (char *[]){"--lora-dropout", "0.1", "--no-eval", NULL});
    ASSERT_EQ_INT(r.code, 0);
    run(&r, &g_gpt, 2, "8", m2,
        (char *[]){"--lora-dropout", "0.1", "--no-eval", "--tp", "2", "--sequence-parallel", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "sequence parallel");
    double a[64], b[64];
    int na = cli_step_losses(m2, a, 64), nb = cli_step_losses(m1, b, 64);
    ASSERT_EQ_INT(nb, 4);
    ASSERT(fabs(b[3] - g_one[1].loss[3]) > 1e-4); /* the dropout is on */
    ASSERT(cli_same_losses(a, na, b, nb, 1.5e-6));
}

int main(void)
{
    if (!getenv("DT_CLI"))
        DT_TEST_SKIP_ALL("DT_CLI is not set (run under ctest)");
    if (cli_stream_file("tok.bin", 2000, true, g_data, sizeof g_data) < 0)
        DT_TEST_SKIP_ALL("could not write the token file");
    one_process(0, &g_llama);
    one_process(1, &g_gpt);
    one_process(2, &g_gpt_dora);
    RUN(llama_tp2);
    RUN(llama_pp2);
    RUN(llama_dp2_tp2_pp2);
    RUN(gpt_tp2);
    RUN(gpt_pp2);
    RUN(gpt_dora_pp2);
    RUN(gpt_dora_cp2);
    RUN(tp2_checkpoint_resumes_in_one_process);
    RUN(one_process_checkpoint_resumes_under_tp2);
    RUN(lora_from_under_tp2);
    RUN(dropout_tp2_follows_one_process);
    RUN(freeze_tp2_follows_one_process);
    RUN(llama_tp2_sequence_parallel);
    RUN(gpt_tp2_sequence_parallel);
    RUN(gpt_dropout_tp2_sp_follows_one_process);
    RUN(llama_cp2_tp2_sequence_parallel);
    RUN(dropout_cp_refused);
    cli_cleanup();
    return TEST_REPORT();
}
