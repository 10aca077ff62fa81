/* `dtrain bench zero` end to end on a tiny MLP under `dtrain run -n 2`: one
 * JSON line per mode; every mode trains the same model on the same data, so
 * the last losses agree (stages 1-3 are bit-identical to DDP: test_zero);
 * the bytes held follow the ZeRO formula for the model's one unit (Psi
 * parameters, K = 2 Adam moments): DDP Psi / Psi / 2 Psi, stage 1
 * Psi / Psi / Psi, stage 2 Psi / Psi/2 / Psi, stage 3 Psi/2 / Psi/2 / Psi,
 * up to the units' padding (1-ar, stage 1 all-reducing, as stage 1); the
 * volume per step is 2 Psi for every mode (a single root unit is gathered
 * once per step) but 1-ar's 3 Psi (an all-reduce counts twice); stage 3's page pool keeps the
 * root unit's pages from its release after backward to the next step's
 * gather (none with 3-nopool). Bad options exit 2 naming the option. */
// dt-test-timeout: 120
#include "test.h"
#include "train_cli.h"

#include <stdlib.h>

static double field(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? strtod(p + strlen(k), NULL) : -1;
}

TEST(eight_modes_same_loss_formula_bytes)
{
    cli_result r;
    cli_runv(&r, 100, NULL,
             (char *[]){"run", "-n", "2", "--", getenv("DT_CLI"), "bench", "zero", "--model", "mlp", "--mlp-dim",
                        "64", "--mlp-hidden", "256", "--batch", "2", "--steps", "5", "--modes",
                        "ddp,1,2,3,3-post,3-none,3-nopool,1-ar", "--json", NULL});
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    const char *modes[] = {"ddp", "1", "2", "3", "3-post", "3-none", "3-nopool", "1-ar"};
    /* bytes per rank in units of Psi: params, grads, optimizer states */
    const double want[8][3] = {{1, 1, 2}, {1, 1, 1}, {1, 0.5, 1}, {0.5, 0.5, 1}, {0.5, 0.5, 1}, {0.5, 0.5, 1},
                               {0.5, 0.5, 1}, {1, 1, 1}};
    const double psi = 4.0 * 2 * 64 * 256;
    double loss0 = 0;
    for (int k = 0; k < 8; k++) {
        char key[64];
        snprintf(key, sizeof key, "\"mode\":\"%s\"", modes[k]);
        const char *line = strstr(r.out, key);
        ASSERT(line);
        const char *end = strchr(line, '\n');
        ASSERT(end);
        const double loss = field(line, "loss");
        if (k == 0)
            loss0 = loss;
        if (loss != loss0)
            fprintf(stderr, "mode %s: loss %.9g, ddp %.9g\n", modes[k], loss, loss0);
        ASSERT(loss == loss0);
        ASSERT(field(line, "step_ms") > 0 && field(line, "ratio") > 0);
        ASSERT(field(line, "cpu_ms") >= 0 && field(line, "cpu_ratio") >= 0); /* present: process CPU per step */
        const char *keys[3] = {"param_bytes", "grad_bytes", "optim_bytes"};
        for (int j = 0; j < 3; j++) {
            const double got = field(line, keys[j]) / psi;
            if (got < want[k][j] || got > want[k][j] * 1.01)
                fprintf(stderr, "mode %s %s: %.4f Psi, want %.2f\n", modes[k], keys[j], got, want[k][j]);
            ASSERT(got >= want[k][j] && got <= want[k][j] * 1.01);
        }
        const double vol = field(line, "volume_psi"), wv = k == 7 ? 3 : 2;
        if (vol < wv || vol > wv * 1.01)
            fprintf(stderr, "mode %s: volume %.4f Psi per step, want %g\n", modes[k], vol, wv);
        ASSERT(vol >= wv && vol <= wv * 1.01);
        /* the page pool: the root unit, freed after backward, is kept whole
         * (one unit's worth) and the next step's gather writes into it */
        const double pooled = field(line, "pooled_per_step") / psi, kept = field(line, "pool_peak") / psi;
        const bool pool = k >= 3 && k <= 5;
        if (pool ? kept < 1 || kept > 1.01 || pooled < 1 : kept != 0 || pooled != 0)
            fprintf(stderr, "mode %s: pool kept %.4f Psi, %.4f Psi per step gathered into it\n", modes[k], kept, pooled);
        ASSERT(pool ? kept >= 1 && kept <= 1.01 && pooled >= 1 : kept == 0 && pooled == 0);
    }
}

TEST(bad_options)
{
    cli_result r;
    cli_runv(&r, 30, NULL, (char *[]){"bench", "zero", "--modes", "ddp,4", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "unknown mode '4'");
    cli_runv(&r, 30, NULL, (char *[]){"bench", "zero", "--steps", "x", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--steps 'x' is not an integer");
    cli_runv(&r, 30, NULL, (char *[]){"bench", "zero", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "dtrain run -n 2");
}

int main(void)
{
    if (!getenv("DT_CLI")) {
        fprintf(stderr, "DT_CLI is not set\n");
        return 1;
    }
    RUN(eight_modes_same_loss_formula_bytes);
    RUN(bad_options);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
