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
        {"trace", "--help"}, {"trace", "summary", "--help"}, {"trace", "plot", "--help"},
        {"plan", "--help"}, {"ckpt", "verify", "--help"}, {"eval", "-h"}, {"generate", "-h"},
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
    char png[600]; /* a writable output: the input's error is the one said */
    snprintf(png, sizeof png, "%s/out.png", cli_tmpdir());
    char *const *cases[] = {
        (char *[]){"plot", "/nonexistent/a\x1b[31mred\nFORGED: ok", "-o", png, NULL},
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

/* Issue 32 item 8: the model list is whole in --help (it was cut at
 * "gpt-mi"), and docs/TRAINING.md's option tables agree with the one option
 * table --help prints: the generated "Every option" block is exactly
 * `dtrain train --help-markdown`, and every option a table row of the
 * document names exists, with the same choices. */
TEST(train_help_lists_every_model)
{
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"train", "--help", NULL});
    ASSERT_STR_CONTAINS(r.out, "--model {convnet|mlp|gpt2|gpt2-medium|gpt2-large|gpt2-xl|gpt-mini|gpt-micro|llama-tiny|llama-100m|hf:DIR}");
}

/* --resume auto's fallback is in its help and is what a run does: with no
 * checkpoint yet (the --save directory missing or empty) the run starts
 * fresh and says so; relaunched after it finished, it does nothing. */
TEST(resume_auto_fallback_in_help_and_run)
{
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"train", "--help", NULL});
    const char *row = strstr(r.out, "--resume DIR|auto");
    ASSERT(row != NULL);
    ASSERT_STR_CONTAINS(row, "when DIR does not exist yet or holds no checkpoint, the run starts fresh");
    ASSERT_STR_CONTAINS(row, "falls back to the next older one");
    char dir[300];
    snprintf(dir, sizeof dir, "%s/resume_auto", cli_tmpdir());
    char *args[] = {"train", "--model", "mlp", "--mlp-dim", "8", "--mlp-hidden", "8", "--random-items", "32",
                    "--limit-test", "8", "--batch", "8", "--max-steps", "2", "--no-eval", "--progress", "none",
                    "--threads", "1", "--save", dir, "--resume", "auto", NULL};
    cli_runv(&r, 60, NULL, args);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "--resume auto: no checkpoint in ");
    ASSERT_STR_CONTAINS(r.out, "yet, starting fresh");
    cli_runv(&r, 60, NULL, args);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "nothing to do: the checkpoint ");
}

static char doc_[1 << 19];

/* A doc whole into doc_: the checks below read all of it (GUIDE.md outgrew a smaller buffer, whose cut end
 * hid the environment table from the check) */
static void read_doc(const char *path)
{
    slurp_(path, doc_, sizeof doc_);
    ASSERT(strlen(doc_) > 1000 && strlen(doc_) < sizeof doc_ - 1);
}

TEST(training_md_option_tables_match_help)
{
    read_doc(DT_SOURCE_DIR "/docs/TRAINING.md");
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"train", "--help-markdown", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!strncmp(r.out, "| option | meaning |", 20));
    const char *open = "<!-- options: dtrain train --help-markdown -->\n", *close = "<!-- /options -->";
    const char *b = strstr(doc_, open), *e = b ? strstr(b, close) : NULL;
    ASSERT(b && e);
    b += strlen(open);
    if ((size_t)(e - b) != strlen(r.out) || strncmp(b, r.out, (size_t)(e - b)))
        fprintf(stderr, "  docs/TRAINING.md's option table differs from `dtrain train --help-markdown`: "
                        "regenerate it: scripts/update_options_doc.sh\n");
    ASSERT_EQ_INT((int)(e - b), (int)strlen(r.out));
    ASSERT(!strncmp(b, r.out, (size_t)(e - b)));
    /* every `--flag ...` in the first cell of a table row of the document */
    int rows = 0, bad = 0;
    for (const char *l = doc_; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, "| `--", 5))
            continue;
        const char *cell_end = strstr(l + 2, " | ");
        for (const char *t = l + 2; t && cell_end && t < cell_end; ) {
            const char *bt = strstr(t, "`--");
            if (!bt || bt >= cell_end)
                break;
            const char *et = strchr(bt + 1, '`');
            if (!et)
                break;
            char flag[256];
            snprintf(flag, sizeof flag, "%.*s", (int)(et - bt - 1), bt + 1);
            /* the name, and the choices when the doc gives them */
            char name[128], want[300];
            size_t nl = strcspn(flag, " =");
            snprintf(name, sizeof name, "`%.*s", (int)nl, flag);
            const char *brace = strchr(flag, '{');
            if (brace)
                snprintf(want, sizeof want, "`%s`", flag);
            const char *hit = strstr(r.out, name);
            while (hit && hit[strlen(name)] != ' ' && hit[strlen(name)] != '`')
                hit = strstr(hit + 1, name);
            if (!hit || (brace && !strstr(r.out, want))) {
                fprintf(stderr, "  docs/TRAINING.md names %s, which --help %s\n", flag,
                        hit ? "gives other choices" : "does not have");
                bad++;
            }
            rows++;
            t = et + 1;
        }
    }
    ASSERT(rows > 40);
    ASSERT_EQ_INT(bad, 0);
}

/* Unknown options: the nearest option or another tool's synonym; the
 * underscore spellings of torchrun/DeepSpeed scripts are the same options. */
TEST(unknown_options_suggest)
{
    static const struct {
        const char *flag, *want;
    } cases[] = {
        {"--deepspeed_config", "did you mean --config FILE"},
        {"--bf16", "did you mean --precision bf16"},
        {"--gradient-accumulation-steps", "did you mean --grad-accum"},
        {"--gradient_accumulation_steps", "did you mean --grad-accum"},
        {"--epoch", "did you mean --epochs"},
        {"--lr-shedule", "did you mean --lr-schedule"},
        /* DeepSpeed's launcher (and torch.distributed.launch) pass --local_rank=N to the program */
        {"--local_rank", "(none is needed: each rank reads LOCAL_RANK from its environment"},
        {"--model_name_or_path", "did you mean --model hf:DIR"},
        {"--max_seq_length", "did you mean --seq T"},
        /* TRL's SFTConfig */
        {"--completion_only_loss", "did you mean --loss-mask"},
        {"--dataset_text_field", "did you mean --data jsonl:FILE,field=KEY"},
        {"--packing", "'1' is not one of {on|off}"}, /* TRL's bool: here on (packed windows) or off */
        {"--adam_epsilon", "did you mean --eps X"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        cli_runv(&r, 60, NULL, (char *[]){"train", (char *)cases[i].flag, "1", NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_EQ_INT(cli_lines(r.err), 1);
        ASSERT_STR_CONTAINS(r.err, cases[i].flag);
        ASSERT_STR_CONTAINS(r.err, cases[i].want);
    }
    cli_result r;
    /* --grad_accum is --grad-accum: its value is checked as that option's */
    cli_runv(&r, 60, NULL, (char *[]){"train", "--grad_accum", "0", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--grad-accum");
    ASSERT(!strstr(r.err, "unknown option"));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--clip_grad_norm=-1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--clip-grad-norm");
    ASSERT(!strstr(r.err, "unknown option"));
    /* torchrun's spellings of the launcher's flags */
    cli_runv(&r, 60, NULL, (char *[]){"run", "--nproc_per_node", "1", "--", "true", NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"run", "--nproc_per_node=1", "--", "true", NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"run", "--nproc-per-nod", "1", "--", "true", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "did you mean --nproc-per-node");
}

/* Every DT_* variable `dtrain run` gives its ranks (tools/run_env.c's setenv calls) is named by
 * `dtrain run --help` and by docs/GUIDE.md's environment table ("set by `dtrain run`" row). */
TEST(run_env_vars_are_documented)
{
    static char src[1 << 15];
    slurp_(DT_SOURCE_DIR "/tools/run_env.c", src, sizeof src);
    read_doc(DT_SOURCE_DIR "/docs/GUIDE.md");
    const char *row = strstr(doc_, "| set by `dtrain run` |");
    ASSERT(row != NULL);
    const char *row_start = row;
    while (row_start > doc_ && row_start[-1] != '\n')
        row_start--;
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"run", "--help", NULL});
    ASSERT_EQ_INT(r.code, 0);
    int n = 0, bad = 0;
    for (const char *p = src; (p = strstr(p, "setenv")); p++) {
        const char *q = strstr(p, "(\"DT_");
        if (!q || q - p > 12) /* setenv("DT_ or setenv_int("DT_ */
            continue;
        char name[64];
        size_t k = 0;
        for (q += 2; *q && *q != '"' && k < sizeof name - 1; q++)
            name[k++] = *q;
        name[k] = 0;
        char tick[72];
        snprintf(tick, sizeof tick, "`%s`", name);
        n++;
        if (!strstr(r.out, name)) {
            fprintf(stderr, "  dtrain run sets %s but `dtrain run --help` does not name it\n", name);
            bad = 1;
        }
        const char *hit = strstr(row_start, tick);
        if (!hit || hit > row) {
            fprintf(stderr, "  dtrain run sets %s but docs/GUIDE.md's \"set by `dtrain run`\" row does not name it\n",
                    name);
            bad = 1;
        }
    }
    ASSERT(n >= 8);
    ASSERT(!bad);
}

/* Every command `dtrain --help` lists is named on a row of docs/GUIDE.md's command table (a line "| `..."
 * holding "`dtrain NAME"). */
TEST(guide_command_table_lists_every_command)
{
    read_doc(DT_SOURCE_DIR "/docs/GUIDE.md");
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"--help", NULL});
    ASSERT_EQ_INT(r.code, 0);
    const char *p = strstr(r.out, "commands:\n");
    ASSERT(p != NULL);
    int n = 0, bad = 0;
    for (p = strchr(p, '\n') + 1; *p == ' ' && p[1] == ' '; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : "") {
        char name[32], want[48];
        if (sscanf(p, " %31s", name) != 1)
            break;
        snprintf(want, sizeof want, "`dtrain %s", name);
        n++;
        bool found = false; /* on a line of the table: one that starts "| `" */
        for (const char *h = doc_; !found && (h = strstr(h, want)); h++) {
            const char *ls = h;
            while (ls > doc_ && ls[-1] != '\n')
                ls--;
            found = !strncmp(ls, "| `", 3) && (h[strlen(want)] == ' ' || h[strlen(want)] == '`');
        }
        if (!found) {
            fprintf(stderr, "  `dtrain --help` lists '%s' but docs/GUIDE.md's command table has no row for it\n", name);
            bad = 1;
        }
    }
    ASSERT(n >= 10);
    ASSERT(!bad);
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
    RUN(train_help_lists_every_model);
    RUN(resume_auto_fallback_in_help_and_run);
    RUN(training_md_option_tables_match_help);
    RUN(unknown_options_suggest);
    RUN(run_env_vars_are_documented);
    RUN(guide_command_table_lists_every_command);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
