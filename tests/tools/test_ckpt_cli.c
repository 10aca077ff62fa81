/* dtrain ckpt info|verify|convert on a checkpoint made by the library:
 * what info prints, verify catching a damaged file, convert to a full file
 * and to 3 ranks with every value kept, and bad usage (exit 2). */
#include "dtrain/ckpt.h"
#include "test.h"
#include "train_cli.h"
#include "ckpt/ckpt_util.h"

#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

TEST(info_verify_convert)
{
    char src[256], full[256], three[256], back[256];
    snprintf(src, sizeof src, "%s/src", g_dir);
    snprintf(full, sizeof full, "%s/full.safetensors", g_dir);
    snprintf(three, sizeof three, "%s/three", g_dir);
    snprintf(back, sizeof back, "%s/back.safetensors", g_dir);
    dt_ckpt_entry e[2][NT];
    make_entries(e[0], 0, 2, RANGE, true);
    make_entries(e[1], 1, 2, RANGE, true);
    const dt_ckpt_entry *ranks[2] = {e[0], e[1]};
    dt_st_kv meta[1] = {{"step", "42"}};
    dt_ckpt_save_params p = dt_ckpt_save_params_default();
    p.meta = meta;
    p.nmeta = 1;
    ASSERT_OK(dt_ckpt_save_ranks(src, ranks, 2, NT, &p));
    free_entries(e[0]);
    free_entries(e[1]);

    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "info", src, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "7 tensors");
    ASSERT_STR_CONTAINS(r.out, "2 files");
    ASSERT_STR_CONTAINS(r.out, "meta step = 42");
    ASSERT_STR_CONTAINS(r.out, "layer1.0.weight");
    ASSERT_STR_CONTAINS(r.out, "[5,1,7]");
    ASSERT_STR_CONTAINS(r.out, "BF16");
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "verify", src, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "ok:");
    /* --with-optimizer: every tensor (plain --full is the model's state_dict only) */
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", src, "-o", full, "--full", "--with-optimizer", NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", full, "-o", three, "--ranks", "3", NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", three, "-o", back, "--full", "--with-optimizer", NULL});
    ASSERT_EQ_INT(r.code, 0);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(three, &ck));
    ASSERT_EQ_INT(dt_ckpt_world(ck), 3);
    ASSERT_STR_EQ(dt_ckpt_meta(ck, "step"), "42");
    dt_ckpt_close(ck);
    const char *outs[3] = {full, three, back};
    for (int k = 0; k < 3; k++) {
        dt_ckpt_entry x[NT];
        make_entries(x, 0, 1, WHOLE, false);
        ASSERT_OK(dt_ckpt_load(outs[k], x, NT, NULL, NULL));
        ASSERT_EQ_INT(check_entries(x), 0);
        free_entries(x);
    }
    /* the two full files are the same bytes */
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "info", back, NULL});
    ASSERT_STR_CONTAINS(r.out, "1 file");
    /* a damaged file: verify fails naming it */
    char f1[300];
    snprintf(f1, sizeof f1, "%s/rank-00001.safetensors", three);
    FILE *f = fopen(f1, "r+b");
    ASSERT(f != NULL);
    fseek(f, -1, SEEK_END);
    fputc(0x7f, f);
    fclose(f);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "verify", three, NULL});
    ASSERT_EQ_INT(r.code, 2); /* a damaged input */
    ASSERT_STR_CONTAINS(r.err, "rank-00001.safetensors");
    /* an existing destination is refused */
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", src, "-o", three, "--ranks", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "already exists");
    /* --full onto an existing file: refused (exit 2), the file unchanged */
    char keep[300];
    snprintf(keep, sizeof keep, "%s/keep.txt", g_dir);
    f = fopen(keep, "w");
    ASSERT(f != NULL);
    fputs("precious\n", f);
    fclose(f);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", src, "-o", keep, "--full", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "already exists");
    ASSERT_STR_CONTAINS(r.err, keep);
    char txt[64] = "";
    f = fopen(keep, "r");
    ASSERT(f != NULL);
    ASSERT(fgets(txt, sizeof txt, f) != NULL);
    fclose(f);
    ASSERT_STR_EQ(txt, "precious\n");
    /* a dangling symlink as DST: refused, its target not created */
    char link[300], target[300];
    snprintf(link, sizeof link, "%s/link.safetensors", g_dir);
    snprintf(target, sizeof target, "%s/target.safetensors", g_dir);
    ASSERT(symlink(target, link) == 0);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", src, "-o", link, "--full", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT(!file_exists(target));
    /* DST in a directory that does not exist, or under a file: bad input (exit 2, naming it), not a failed
       write (it was exit 1, "cannot create a temporary file beside ...") */
    char nodir[400], under[400];
    snprintf(nodir, sizeof nodir, "%s/no-such-dir/out", g_dir);
    snprintf(under, sizeof under, "%s/out", keep);
    char *const mode[][2] = {{"--full", NULL}, {"--ranks", "2"}};
    for (int m = 0; m < 2; m++) {
        cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", src, "-o", nodir, mode[m][0], mode[m][1], NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "no-such-dir: No such file or directory");
        cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", src, "-o", under, mode[m][0], mode[m][1], NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "keep.txt");
    }
    /* --full to a name with a trailing slash (a directory's): exit 2, not "cannot create a temporary file
       beside out/" (exit 1) */
    snprintf(nodir, sizeof nodir, "%s/full-out/", g_dir);
    cli_runv(&r, 60, NULL, (char *[]){"ckpt", "convert", src, "-o", nodir, "--full", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--full writes a file");
}

TEST(bad_usage)
{
    cli_result r;
    char *const cases[][8] = {
        {"ckpt", NULL},
        {"ckpt", "frobnicate", "x", NULL},
        {"ckpt", "info", NULL},
        {"ckpt", "convert", "x", "-o", "y", NULL},
        {"ckpt", "convert", "x", "--full", NULL},
        {"ckpt", "convert", "x", "-o", "y", "--ranks", NULL},
        {"ckpt", "convert", "x", "-o", "y", "--ranks", "0", NULL},
        {"ckpt", "info", "x", "--full", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_runv(&r, 60, NULL, cases[i]);
        if (r.code != 2 || !r.err[0]) {
            fprintf(stderr, "case %zu: exit %d, stderr '%s'\n", i, r.code, r.err);
            ASSERT(0);
        }
    }
    /* a missing or damaged SRC is bad input (exit 2) for every command */
    char *const bad_src[][8] = {
        {"ckpt", "info", "/nonexistent-dtrain-ckpt", NULL},
        {"ckpt", "verify", "/nonexistent-dtrain-ckpt", NULL},
        {"ckpt", "convert", "/nonexistent-dtrain-ckpt", "-o", "/nonexistent-dtrain-out", "--full", NULL},
        {"ckpt", "info", "/dev/null", NULL},
    };
    for (size_t i = 0; i < sizeof bad_src / sizeof bad_src[0]; i++) {
        cli_runv(&r, 60, NULL, bad_src[i]);
        if (r.code != 2) {
            fprintf(stderr, "bad source %zu: exit %d, stderr '%s'\n", i, r.code, r.err);
            ASSERT(0);
        }
        ASSERT_STR_CONTAINS(r.err, bad_src[i][2]);
    }
}

/* A FIFO where a file is read (a safetensors file, a checkpoint's
 * index.json or rank file, a --config, a token file, --init-from and
 * --weights) is refused at once, exit 2, naming it: never waited on for a
 * writer that does not come. */
TEST(fifos)
{
    char fifo[256], dir[256], path[300], cmd[800], cfg[300], data[300];
    snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
    ASSERT(mkfifo(fifo, 0644) == 0);
    snprintf(dir, sizeof dir, "%s/fifo-index", g_dir);
    ASSERT(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/index.json", dir);
    ASSERT(mkfifo(path, 0644) == 0);
    char rank_dir[256];
    snprintf(rank_dir, sizeof rank_dir, "%s/fifo-rank", g_dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s/src' '%s' && rm '%s/rank-00000.safetensors'", g_dir, rank_dir, rank_dir);
    ASSERT(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/rank-00000.safetensors", rank_dir);
    ASSERT(mkfifo(path, 0644) == 0);
    snprintf(cfg, sizeof cfg, "--config=%s", fifo);
    snprintf(data, sizeof data, "tokens:%s", fifo);
    char *const cases[][16] = {
        {"ckpt", "info", fifo, NULL},
        {"ckpt", "verify", dir, NULL},
        {"ckpt", "verify", rank_dir, NULL},
        {"train", cfg, "--model", "mlp", "--data", "random", "--max-steps", "1", NULL},
        {"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--max-steps", "1", NULL},
        {"train", "--model", "mlp", "--data", "random", "--init-from", fifo, "--max-steps", "1", NULL},
        {"eval", "--model", "mlp", "--data", "random", "--weights", fifo, NULL},
    };
    const char *want[] = {fifo, "index.json", "rank-00000.safetensors", fifo, fifo, fifo, fifo};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        cli_runv(&r, 20, NULL, cases[i]);
        if (r.code != 2 || !strstr(r.err, "not a regular file") || !strstr(r.err, want[i]))
            fprintf(stderr, "fifo case %zu: exit %d, stderr '%s'\n", i, r.code, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "not a regular file");
        ASSERT_STR_CONTAINS(r.err, want[i]);
    }
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt-test-ckptcli-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(info_verify_convert);
    RUN(bad_usage);
    RUN(fifos);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_REPORT();
}
