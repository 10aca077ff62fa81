/* Every command and subcommand answers --help: exit 0, a "usage:" text on
 * stdout, nothing on stderr. The top-level help lists every bench suite,
 * `train --help` mentions the launcher, and a bad --data names every spec. */
#include "test.h"
#include "train_cli.h"

TEST(every_help_exits_0_with_usage)
{
    static char *const cmds[][4] = {
        {"--help"},         {"help"},           {"train", "--help"},  {"run", "--help"},
        {"bench", "--help"}, {"bench", "step", "--help"}, {"bench", "coll", "--help"},
        {"bench", "ddp", "--help"}, {"bench", "zero", "--help"}, {"bench", "matmul", "--help"}, {"bench", "data", "--help"},
        {"plot", "--help"}, {"info", "--help"}, {"train", "-h"}, {"bench", "data", "-h"},
        {"tokenize", "--help"}, {"generate", "--help"}, {"eval", "--help"}, {"ckpt", "--help"}, {"ckpt", "info", "--help"},
        {"ckpt", "convert", "-h"}, {"pipeline", "--help"}, {"pipeline", "show", "--help"},
    };
    int failed = 0;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        cli_result r;
        cli_runv(&r, 60, NULL, cmds[i]);
        if (r.code != 0 || strncmp(r.out, "usage:", 6) != 0 || r.err[0]) {
            fprintf(stderr, "  dtrain %s %s %s: exit %d, stdout '%.60s', stderr '%.200s'\n", cmds[i][0],
                    cmds[i][1] ? cmds[i][1] : "", cmds[i][1] && cmds[i][2] ? cmds[i][2] : "", r.code,
                    r.out, r.err);
            failed = 1;
        }
    }
    ASSERT(!failed);
}

TEST(help_contents)
{
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"--help", NULL});
    const char *suites[] = {"step", "coll", "ddp", "zero", "matmul", "data"};
    for (int i = 0; i < 6; i++)
        ASSERT_STR_CONTAINS(r.out, suites[i]);
    cli_runv(&r, 60, NULL, (char *[]){"bench", "--help", NULL});
    for (int i = 0; i < 6; i++)
        ASSERT_STR_CONTAINS(r.out, suites[i]);
    cli_runv(&r, 60, NULL, (char *[]){"train", "--help", NULL});
    ASSERT_STR_CONTAINS(r.out, "dtrain run -n");
    /* checkpoints (issue 14) */
    const char *ck[] = {"--save DIR", "--save-every N", "--keep K", "--async-save", "--max-steps N",
                        "--resume DIR|auto", "--init-from FILE"};
    for (int i = 0; i < 7; i++)
        ASSERT_STR_CONTAINS(r.out, ck[i]);
    /* mixed precision (issue 12) */
    const char *mp[] = {"--precision {fp32|bf16|fp16|auto}", "--reduce-dtype {fp32|bf16|fp16}",
                        "--keep-bn-fp32 {true|false}", "--buffer-dtype {fp32|bf16|fp16}", "--loss-scale X", "--initial-scale-power N",
                        "--loss-scale-window N", "--hysteresis N", "--min-loss-scale X",
                        "--scaler {deepspeed|torch}"};
    for (int i = 0; i < 9; i++)
        ASSERT_STR_CONTAINS(r.out, mp[i]);
    cli_runv(&r, 60, NULL, (char *[]){"train", "--precision", "fp8", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--precision");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--precision", "bf16", "--loss-scale", "128", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "needs no loss scaling");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--hysteresis", "0", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--hysteresis");
    cli_runv(&r, 60, NULL, (char *[]){"info", "--help", NULL});
    ASSERT(!strstr(r.out, "cpu features:")); /* help, not the information itself */
    cli_runv(&r, 60, NULL, (char *[]){"info", "--bogus", NULL});
    ASSERT_EQ_INT(r.code, 2);
    cli_runv(&r, 60, NULL, (char *[]){"bench", "data", "--bogus", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "'--bogus'");
}

TEST(bad_data_names_every_spec)
{
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"train", "--data", "cifar", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    const char *specs[] = {"cifar", "fashion-mnist", "mnist:DIR", "idx:DIR", "random", "npy:X.npy", "csv:FILE"};
    for (int i = 0; i < 7; i++)
        ASSERT_STR_CONTAINS(r.err, specs[i]);
}

/* Issue 10 item 9: a control character in a user-supplied path must not
 * reach the terminal raw from the CLI's own messages (the library's are
 * escaped by dt_error): ESC and newline come out as \x1b and \n, on one
 * line. */
TEST(control_characters_in_paths_are_escaped)
{
    char *const *cases[] = {
        (char *[]){"plot", "/nonexistent/a\x1b[31mred\nFORGED: ok", "-o", "/nonexistent/out.png", NULL},
        (char *[]){"bench", "st\x1b[2Jep\nFORGED", NULL},
        (char *[]){"run", "-n", "1", "--tee", "/proc/nonexistent/t\x1b]0;x\a\nFORGED", "--",
                   "true", NULL},
        (char *[]){"train", "--epochs", "\x1b[1mmany\nFORGED", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        cli_runv(&r, 60, NULL, cases[i]);
        if (r.code == 0 || strchr(r.err, '\x1b') || strchr(r.err, '\a') || cli_lines(r.err) != 1 ||
            !strstr(r.err, "\\x1b") || !strstr(r.err, "\\nFORGED"))
            fprintf(stderr, "  case %zu (dtrain %s): code %d, stderr: %s", i, cases[i][0], r.code,
                    r.err);
        ASSERT(r.code != 0);
        ASSERT(!strchr(r.err, '\x1b'));
        ASSERT_EQ_INT(cli_lines(r.err), 1);
        ASSERT_STR_CONTAINS(r.err, "\\x1b");
        ASSERT_STR_CONTAINS(r.err, "\\nFORGED");
    }
}

int main(void)
{
    if (!getenv("DT_CLI")) {
        fprintf(stderr, "DT_CLI is not set\n");
        return 1;
    }
    RUN(every_help_exits_0_with_usage);
    RUN(help_contents);
    RUN(bad_data_names_every_spec);
    RUN(control_characters_in_paths_are_escaped);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
