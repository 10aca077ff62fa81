/* `dtrain train --save DIR`: the directory is taken before any training.
 * A directory another job saves into is refused (exit 2, naming the
 * directory and the holder's pid and host) and nothing in it is touched:
 * not the other job's in-progress temporary, not its checkpoints (--keep
 * would prune them). A directory that cannot be used (an existing file, a
 * missing parent, a symlink) is refused before the first step (exit 2),
 * not after the training it was meant to keep. Two real jobs on one
 * directory: the second is refused while the first trains, and the first
 * still saves. --resume auto past a damaged newest checkpoint resumes from
 * the next older one with a warning naming what it skipped. A run that
 * fails before its first checkpoint (weights that cannot load) leaves
 * nothing behind: the DIR it created is gone, a DIR that existed holds what
 * it held; a lock file left by a killed job (no holder) is taken over and
 * the rerun saves. */
// dt-test-timeout: 240
#include "test.h"
#include "tools/train_cli.h"

#include <errno.h>
#include <sys/file.h>

static char *g_train[] = {"train", "--model", "mlp", "--mlp-hidden", "16", "--data", "random", "--random-items",
                          "64", "--batch", "8", "--limit-test", "8", "--progress", "plain", "--threads", "1",
                          "--epochs", "1", NULL};

/* g_train + extra (NULL-terminated) into r. */
static int run_train(cli_result *r, char **extra)
{
    char *args[64];
    int n = 0;
    for (int i = 0; g_train[i]; i++)
        args[n++] = g_train[i];
    for (int i = 0; extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return cli_runv(r, 120, NULL, args);
}

static void mkpath(const char *p) { ASSERT(mkdir(p, 0755) == 0 || errno == EEXIST); }

static void touch(const char *p)
{
    FILE *f = fopen(p, "w");
    ASSERT(f != NULL);
    fputs("x", f);
    fclose(f);
}

/* Another job holds the directory (its lock file, flock'd, as a job does):
 * refused, exit 2, the holder named, nothing removed or added. */
TEST(held_directory_is_refused_untouched)
{
    char dir[400], p[600];
    snprintf(dir, sizeof dir, "%s/held", cli_tmpdir());
    mkpath(dir);
    /* the other job's work: an in-progress temporary and two checkpoints */
    snprintf(p, sizeof p, "%s/step-00000003.tmp-AbCdEf", dir);
    mkpath(p);
    snprintf(p, sizeof p, "%s/step-00000003.tmp-AbCdEf/rank-00000.safetensors", dir);
    touch(p);
    for (int s = 1; s <= 2; s++) {
        snprintf(p, sizeof p, "%s/step-%08d", dir, s);
        mkpath(p);
        snprintf(p, sizeof p, "%s/step-%08d/index.json", dir, s);
        touch(p);
    }
    snprintf(p, sizeof p, "%s/.dtrain-lock", dir);
    int fd = open(p, O_RDWR | O_CREAT, 0644);
    ASSERT(fd >= 0);
    ASSERT(write(fd, "pid 4242 host otherhost\n", 24) == 24);
    ASSERT(flock(fd, LOCK_EX | LOCK_NB) == 0);
    cli_result *r = calloc(1, sizeof *r);
    char *extra[] = {"--save", dir, "--keep", "1", NULL};
    run_train(r, extra);
    close(fd);
    ASSERT_EQ_INT(r->code, 2);
    ASSERT_STR_CONTAINS(r->err, dir);
    ASSERT_STR_CONTAINS(r->err, "in use by another job");
    ASSERT_STR_CONTAINS(r->err, "pid 4242 host otherhost");
    ASSERT(strstr(r->out, "step 1/") == NULL); /* refused before training */
    snprintf(p, sizeof p, "%s/step-00000003.tmp-AbCdEf/rank-00000.safetensors", dir);
    ASSERT(file_exists(p));
    for (int s = 1; s <= 2; s++) {
        snprintf(p, sizeof p, "%s/step-%08d/index.json", dir, s);
        ASSERT(file_exists(p));
    }
    snprintf(p, sizeof p, "%s/step-00000008", dir); /* 64 / 8 steps: nothing saved */
    ASSERT(!file_exists(p));
    /* released: the same run now owns the directory, cleans and prunes it */
    run_train(r, extra);
    ASSERT_EQ_INT(r->code, 0);
    snprintf(p, sizeof p, "%s/step-00000008/index.json", dir);
    ASSERT(file_exists(p));
    snprintf(p, sizeof p, "%s/step-00000003.tmp-AbCdEf", dir);
    ASSERT(!file_exists(p));
    snprintf(p, sizeof p, "%s/step-00000001", dir);
    ASSERT(!file_exists(p));
    free(r);
}

/* An unusable directory: exit 2 before the first step, the directory named. */
static void refused_before_training(const char *dir, const char *why)
{
    cli_result *r = calloc(1, sizeof *r);
    char *extra[] = {"--save", (char *)dir, NULL};
    run_train(r, extra);
    if (r->code != 2)
        fprintf(stderr, "%s: %s%s", why, r->out, r->err);
    ASSERT_EQ_INT(r->code, 2);
    ASSERT_STR_CONTAINS(r->err, "--save");
    ASSERT_STR_CONTAINS(r->err, dir);
    ASSERT(strstr(r->out, "step 1/") == NULL);
    free(r);
}

TEST(unusable_directory_refused_before_training)
{
    char p[900], q[600];
    snprintf(p, sizeof p, "%s/a-file", cli_tmpdir());
    touch(p);
    refused_before_training(p, "an existing file");
    snprintf(p, sizeof p, "%s/no-parent/ckpt", cli_tmpdir());
    refused_before_training(p, "a missing parent");
    snprintf(q, sizeof q, "%s/real", cli_tmpdir());
    mkpath(q);
    snprintf(p, sizeof p, "%s/link", cli_tmpdir());
    ASSERT(symlink(q, p) == 0);
    refused_before_training(p, "a symlink");
    /* the same named with a trailing slash (lstat of "link/" follows the link: it was taken, and the lock and
       the checkpoints written through it into real/) */
    char ps[1000];
    snprintf(ps, sizeof ps, "%s/", p);
    refused_before_training(ps, "a symlink with a trailing slash");
    snprintf(ps, sizeof ps, "%s/.dtrain-lock", q);
    ASSERT(!file_exists(ps));
    /* a planted lock-file symlink is not followed (its target is not created) */
    char d[600], t[700];
    snprintf(d, sizeof d, "%s/planted", cli_tmpdir());
    mkpath(d);
    snprintf(t, sizeof t, "%s/victim", cli_tmpdir());
    snprintf(p, sizeof p, "%s/.dtrain-lock", d);
    ASSERT(symlink(t, p) == 0);
    refused_before_training(d, "a symlinked lock file");
    ASSERT(!file_exists(t));
    /* a checkpoint itself (--save run/step-N): its lock file and a step-N inside it were written there */
    snprintf(d, sizeof d, "%s/ckpt-as-dir", cli_tmpdir());
    mkpath(d);
    snprintf(p, sizeof p, "%s/index.json", d);
    touch(p);
    refused_before_training(d, "a checkpoint");
    snprintf(p, sizeof p, "%s/.dtrain-lock", d);
    ASSERT(!file_exists(p));
}

/* Two real jobs: the second is refused while the first trains; the first
 * (stopped by SIGTERM) still saves its checkpoint. */
TEST(second_job_refused_first_saves)
{
    char dir[400], out[600], err[600];
    snprintf(dir, sizeof dir, "%s/shared", cli_tmpdir());
    snprintf(out, sizeof out, "%s/a.out", cli_tmpdir());
    snprintf(err, sizeof err, "%s/a.err", cli_tmpdir());
    const char *cli = getenv("DT_CLI");
    pid_t pid = dt_test_fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        execl(cli, cli, "train", "--model", "mlp", "--mlp-hidden", "64", "--data", "random", "--random-items",
              "200000", "--batch", "2", "--limit-test", "2", "--progress", "plain", "--log-every", "1", "--threads",
              "1", "--save", dir, "--save-every", "5", "--keep", "1", (char *)NULL);
        _exit(127);
    }
    char buf[8192];
    int seen = 0;
    for (int i = 0; i < 6000 && !seen; i++) { /* at most 120 s */
        slurp_(out, buf, sizeof buf);
        seen = strstr(buf, "step 3/") != NULL;
        if (!seen) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    cli_result *r = calloc(1, sizeof *r);
    char *extra[] = {"--save", dir, "--keep", "1", NULL};
    if (seen)
        run_train(r, extra);
    dt_test_kill(pid, SIGTERM);
    int status;
    dt_test_waitpid(pid, &status, 0);
    ASSERT(seen);
    ASSERT_EQ_INT(r->code, 2);
    ASSERT_STR_CONTAINS(r->err, "in use by another job");
    char want[64];
    snprintf(want, sizeof want, "pid %ld host ", (long)pid);
    ASSERT_STR_CONTAINS(r->err, want);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 130);
    slurp_(err, buf, sizeof buf);
    ASSERT_STR_CONTAINS(buf, "checkpoint ");
    ASSERT_STR_CONTAINS(buf, " saved");
    free(r);
}

/* Damage the newest checkpoint's last byte: --resume auto takes the older one. */
static void resume_past_damage(int ranks)
{
    char dir[400], p[700];
    snprintf(dir, sizeof dir, "%s/damaged%d", cli_tmpdir(), ranks);
    char *base[] = {"train", "--model", "mlp", "--mlp-hidden", "16", "--data", "random", "--random-items", "64",
                    "--batch", "8", "--limit-test", "8", "--progress", "none", "--threads", "1", "--save", dir,
                    "--save-every", "2", "--max-steps", "4", NULL};
    char *args[64];
    int n = 0;
    if (ranks > 1)
        args[n++] = "run", args[n++] = "-n", args[n++] = "2", args[n++] = "--", args[n++] = getenv("DT_CLI");
    for (int i = 0; base[i]; i++)
        args[n++] = base[i];
    args[n] = NULL;
    cli_result *r = calloc(1, sizeof *r);
    cli_runv(r, 120, NULL, args);
    ASSERT_EQ_INT(r->code, 0);
    snprintf(p, sizeof p, "%s/step-00000004/rank-00000.safetensors", dir);
    FILE *f = fopen(p, "r+b");
    ASSERT(f != NULL);
    fseek(f, -1, SEEK_END);
    int c = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
    args[n - 1] = "6"; /* --max-steps 6 */
    args[n++] = "--resume", args[n++] = "auto", args[n] = NULL;
    cli_runv(r, 120, NULL, args);
    if (r->code)
        fprintf(stderr, "%s%s", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->err, "step-00000004 is damaged");
    snprintf(p, sizeof p, "resumed from %s/step-00000002: step 2", dir);
    ASSERT_STR_CONTAINS(r->out, p);
    free(r);
}

TEST(resume_auto_skips_damaged_newest) { resume_past_damage(1); }

TEST(resume_auto_skips_damaged_newest_two_ranks) { resume_past_damage(2); }

/* --init-from a file that is not a checkpoint: exit 2 naming it, and no trace in --save DIR. */
static void failed_start(const char *dir, const char *bad)
{
    cli_result *r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
    char *extra[] = {"--save", (char *)dir, "--init-from", (char *)bad, NULL};
    run_train(r, extra);
    ASSERT_EQ_INT(r->code, 2);
    ASSERT_STR_CONTAINS(r->err, "--init-from");
    ASSERT_STR_CONTAINS(r->err, bad);
    free(r);
}

TEST(failed_start_leaves_no_trace)
{
    char bad[600], dir[600], p[700];
    snprintf(bad, sizeof bad, "%s/not-weights.safetensors", cli_tmpdir());
    touch(bad);
    /* a DIR the run created: gone again */
    snprintf(dir, sizeof dir, "%s/fresh-fail", cli_tmpdir());
    failed_start(dir, bad);
    struct stat sb;
    ASSERT(lstat(dir, &sb) != 0 && errno == ENOENT);
    /* a DIR that existed with a file in it: as it was (no lock file added) */
    snprintf(dir, sizeof dir, "%s/kept-fail", cli_tmpdir());
    mkpath(dir);
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    touch(p);
    failed_start(dir, bad);
    ASSERT(file_exists(p));
    snprintf(p, sizeof p, "%s/.dtrain-lock", dir);
    ASSERT(!file_exists(p));
    /* a lock file a killed job left (its flock died with it): taken over, and the rerun saves */
    FILE *f = fopen(p, "w");
    ASSERT(f != NULL);
    fputs("pid 999999999 host gone\n", f);
    fclose(f);
    cli_result *r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
    char *extra[] = {"--save", dir, NULL};
    run_train(r, extra);
    if (r->code)
        fprintf(stderr, "%s%s", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    snprintf(p, sizeof p, "%s/step-00000008/index.json", dir);
    ASSERT(file_exists(p));
    free(r);
}

int main(void)
{
    if (!getenv("DT_CLI"))
        return DT_TEST_SKIP_CODE;
    RUN(held_directory_is_refused_untouched);
    RUN(unusable_directory_refused_before_training);
    RUN(second_job_refused_first_saves);
    RUN(resume_auto_skips_damaged_newest);
    RUN(resume_auto_skips_damaged_newest_two_ranks);
    RUN(failed_start_leaves_no_trace);
    cli_cleanup();
    return TEST_REPORT();
}
