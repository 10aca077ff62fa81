/* ZeRO stage 3 computes what DDP computes, step by step: the case that
 * drifted (the ConvNet on fashion-mnist, AdamW lr 1e-3, batch 50 per rank,
 * 100 steps, `dtrain run -n 2`) logs the same loss at every step with
 * --zero 3 as with --zero 0 (the metrics' seven digits: a one-ulp change
 * grows past them within a few steps), on every instruction-set path this
 * CPU has (oneDNN's and dtrain's caps for the lower ones: the ConvNet's
 * activations are nChw16c on AVX-512, nChw8c on AVX2), with SGD, with
 * size-wrapped units (hooks on leaf modules), with the blocks checkpointed,
 * and on 3 ranks.
 *
 * Under the sanitizers (dt_test_reduced, tests/test.h) every case runs 10
 * steps instead of 100: the same code paths for ASan and TSan to watch, at
 * a tenth of the cost (the full drift check is the release pass's).
 *
 * Why it drifted: stage 3's gather hooks made the ConvNet run module by
 * module on plain NCHW activations, while DDP took its channel-blocked path,
 * and batch norm sums a blocked batch in another order (a few ulps). The
 * hooks are now blind (dt_module_hook_set_blind) and the blocked path runs
 * around them. Skipped (77) without the fashion-mnist data set. */
// dt-test-timeout: 900
// dt-test-labels: slow
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <stdlib.h>
#include <unistd.h>

static char g_metrics[2][300];
static int g_steps = 100; /* per run; 10 under the sanitizers */

/* the "loss" of every step record of a metrics file, one per line */
static int step_losses(const char *path, char *out, size_t n)
{
    static char buf[1 << 20];
    slurp_(path, buf, sizeof buf);
    size_t k = 0;
    int steps = 0;
    for (const char *p = buf; (p = strstr(p, "{\"event\":\"step\"")); p++) {
        const char *l = strstr(p, "\"loss\":"), *e = strchr(p, '\n');
        if (!l || (e && l > e))
            continue;
        l += 7;
        while (*l && *l != ',' && *l != '}' && k + 2 < n)
            out[k++] = *l++;
        out[k++] = '\n';
        steps++;
    }
    out[k] = 0;
    return steps;
}

/* dtrain run -n ranks -- dtrain train <the failing case> --zero z extra...;
 * the step losses into losses. */
static void run_case(int ranks, int zero, const char *const *extra, char *losses, size_t n)
{
    static cli_result r;
    char nr[8], zs[8], items[16];
    snprintf(nr, sizeof nr, "%d", ranks);
    snprintf(zs, sizeof zs, "%d", zero);
    snprintf(items, sizeof items, "%d", g_steps * 50 * ranks); /* g_steps steps */
    const char *mp = g_metrics[zero == 0 ? 0 : 1];
    char *args[64] = {"run", "-n", nr, "--", getenv("DT_CLI"), "train", "--model", "convnet", "--data",
                      "fashion-mnist", "--epochs", "1", "--batch", "50", "--seed", "0", "--limit-train", items,
                      "--log-every", "1", "--no-eval", "--zero", zs, "--threads", "1", "--progress", "none",
                      "--metrics", (char *)mp};
    int k = 0;
    while (args[k])
        k++;
    bool opt = false;
    for (int i = 0; extra && extra[i]; i++)
        opt |= !strcmp(extra[i], "--optimizer"), args[k++] = (char *)extra[i];
    if (!opt) /* the failing case's optimizer */
        args[k++] = "--optimizer", args[k++] = "adamw", args[k++] = "--lr", args[k++] = "0.001";
    args[k] = NULL;
    losses[0] = 0;
    cli_runv(&r, 300, NULL, args);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_EQ_INT(step_losses(mp, losses, n), g_steps);
}

/* --zero 0 and --zero 3 (with extra3 on the stage-3 run) step alike */
static void same(int ranks, const char *const *extra, const char *const *extra3)
{
    static char a[8192], b[8192];
    run_case(ranks, 0, extra, a, sizeof a);
    const char *both[32];
    int k = 0;
    for (int i = 0; extra && extra[i]; i++)
        both[k++] = extra[i];
    for (int i = 0; extra3 && extra3[i]; i++)
        both[k++] = extra3[i];
    both[k] = NULL;
    run_case(ranks, 3, both, b, sizeof b);
    if (strcmp(a, b)) {
        const char *pa = a, *pb = b;
        for (int s = 1; *pa && *pb; s++) {
            const char *ea = strchr(pa, '\n'), *eb = strchr(pb, '\n');
            if (ea - pa != eb - pb || strncmp(pa, pb, (size_t)(ea - pa))) {
                fprintf(stderr, "step %d: DDP %.*s, ZeRO-3 %.*s\n", s, (int)(ea - pa), pa, (int)(eb - pb), pb);
                break;
            }
            pa = ea + 1, pb = eb + 1;
        }
    }
    ASSERT_STR_EQ(a, b);
}

static bool have_data(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dt_data_fashion_mnist_dir());
    return access(p, R_OK) == 0;
}

/* One instruction-set path: the caps in the environment the ranks inherit.
 * distinct false: on this CPU the cap is no cap (it names the best path it
 * has, or one above it), so the path is the default's, already run. */
static void isa_path(const char *onednn, const char *dtrain, bool distinct)
{
    const char *o = onednn ? onednn : "(default)", *d = dtrain ? dtrain : "(default)";
    if (!distinct) {
        fprintf(stderr, "ISA path: ONEDNN_MAX_CPU_ISA=%s DT_MAX_CPU_ISA=%s: this CPU's default, not run again\n", o,
                d);
        return;
    }
    if (onednn)
        setenv("ONEDNN_MAX_CPU_ISA", onednn, 1);
    if (dtrain)
        setenv("DT_MAX_CPU_ISA", dtrain, 1);
    fprintf(stderr, "ISA path: ONEDNN_MAX_CPU_ISA=%s DT_MAX_CPU_ISA=%s\n", o, d);
    same(2, NULL, NULL);
    unsetenv("ONEDNN_MAX_CPU_ISA");
    unsetenv("DT_MAX_CPU_ISA");
}

TEST(adamw_every_isa_path)
{
    const dt_cpu_features hw = dt_cpu_detect_hw();
    const bool avx512 = hw.avx512f && hw.avx512bw && hw.avx512vl;
    isa_path(NULL, NULL, true);                                               /* the best (AMX where present) */
    isa_path("AVX512_CORE_BF16", NULL, avx512 && hw.avx512_bf16 && hw.amx_bf16); /* AVX-512 with bf16 */
    isa_path("AVX512_CORE", NULL, avx512 && (hw.avx512_bf16 || hw.amx_bf16)); /* AVX-512 */
    isa_path("AVX2", "avx2", avx512);                                         /* AVX2: nChw8c activations */
}

TEST(sgd_wrapped_checkpointed_three_ranks)
{
    const char *sgd[] = {"--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", NULL};
    same(2, sgd, NULL);
    /* units on leaf modules (layer2.0 and fc: their hooks sit inside the
     * layers), and the layers checkpointed besides */
    const char *wrap[] = {"--wrap-min-params", "1000", NULL};
    same(2, NULL, wrap);
    const char *ck[] = {"--activation-checkpointing", NULL};
    same(2, ck, wrap);
    same(3, NULL, NULL);
}

int main(void)
{
    if (!have_data()) {
        fprintf(stderr, "skip: fashion-mnist is not installed (Debian's dataset-fashion-mnist)\n");
        return 77;
    }
    if (dt_test_reduced()) {
        g_steps = 10;
        fprintf(stderr, "note: a sanitizer build: %d steps a run (DT_TEST_FULL=1: 100)\n", g_steps);
    }
    snprintf(g_metrics[0], sizeof g_metrics[0], "%s/ddp.jsonl", cli_tmpdir());
    snprintf(g_metrics[1], sizeof g_metrics[1], "%s/zero3.jsonl", cli_tmpdir());
    RUN(adamw_every_isa_path);
    RUN(sgd_wrapped_checkpointed_three_ranks);
    return TEST_REPORT();
}
