/* The launcher, `dtrain run`, driven as a user would drive it: the CLI at
 * $DT_CLI starts small /bin/sh ranks; each check reads the prefixed output,
 * the exit code and the time it took. Every CLI run is under a deadline (the
 * helper SIGKILLs it), so a launcher that hangs fails the test. */
// dt-test-timeout: 120
// dt-test-labels: idle
#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "test.h"
#include "tmp_util.h"
#include "comm/shm/shm.h" /* dt__shm_segment_name */

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    char *out, *err;       /* captured stdout and stderr, NUL-terminated */
    size_t nout, nerr;
    int status;            /* wait status of the CLI */
    double secs;           /* how long it ran */
    int timed_out;
} cli_result;

static const char *cli_path(void)
{
    const char *p = getenv("DT_CLI");
    return p && *p ? p : DT_BINARY_DIR "/dtrain";
}

static void append(char **buf, size_t *n, const char *p, size_t k)
{
    *buf = realloc(*buf, *n + k + 1);
    memcpy(*buf + *n, p, k);
    *n += k;
    (*buf)[*n] = '\0';
}

static size_t count_substr(const char *hay, const char *needle)
{
    size_t c = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)) != NULL; p += strlen(needle))
        c++;
    return c;
}

/* Run `dtrain run ARGS...` with a deadline. If sig_after_ready > 0, send that
 * signal to the CLI once stdout holds `ready_count` lines containing "ready". */
static cli_result run_cli_sig(const char *const *args, double deadline_s, int sig_after_ready,
                              int ready_count)
{
    cli_result r;
    memset(&r, 0, sizeof r);
    r.out = calloc(1, 1);
    r.err = calloc(1, 1);
    int po[2], pe[2];
    if (pipe(po) || pipe(pe))
        abort();
    double t0 = dt_time_s();
    pid_t pid = dt_test_fork();
    if (pid < 0) {
        close(po[0]), close(pe[0]), close(po[1]), close(pe[1]);
        r.status = -1; /* the test fails, and RUN() reports it skipped */
        return r;
    }
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]), close(pe[0]), close(po[1]), close(pe[1]);
        const char *argv[64];
        int k = 0;
        argv[k++] = cli_path();
        argv[k++] = "run";
        for (int i = 0; args[i] && k < 63; i++)
            argv[k++] = args[i];
        argv[k] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(126);
    }
    close(po[1]);
    close(pe[1]);
    int fds[2] = {po[0], pe[0]};
    int sent = 0;
    while (fds[0] >= 0 || fds[1] >= 0) {
        double left = deadline_s - (dt_time_s() - t0);
        if (left <= 0) {
            dt_test_kill(pid, SIGKILL);
            r.timed_out = 1;
            break;
        }
        struct pollfd pf[2] = {{.fd = fds[0], .events = POLLIN}, {.fd = fds[1], .events = POLLIN}};
        int pr = poll(pf, 2, (int)(left * 1000) + 1);
        if (pr < 0 && errno != EINTR)
            break;
        for (int j = 0; j < 2; j++) {
            if (fds[j] < 0 || !(pf[j].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[65536];
            ssize_t m = read(fds[j], buf, sizeof buf);
            if (m <= 0) {
                close(fds[j]);
                fds[j] = -1;
            } else if (j == 0) {
                append(&r.out, &r.nout, buf, (size_t)m);
            } else {
                append(&r.err, &r.nerr, buf, (size_t)m);
            }
        }
        if (sig_after_ready && !sent && (int)count_substr(r.out, "ready") >= ready_count) {
            dt_test_kill(pid, sig_after_ready);
            sent = 1;
        }
    }
    for (int j = 0; j < 2; j++)
        if (fds[j] >= 0)
            close(fds[j]);
    dt_test_waitpid(pid, &r.status, 0);
    r.secs = dt_time_s() - t0;
    return r;
}

static cli_result run_cli(const char *const *args, double deadline_s)
{
    return run_cli_sig(args, deadline_s, 0, 0);
}

static void cli_result_free(cli_result *r)
{
    free(r->out);
    free(r->err);
}

static int exit_code(const cli_result *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
}

static int cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/* Find the line "[rank] ENV ..." and parse it. */
typedef struct {
    int rank, world, lrank, lworld, drank, dworld, dlrank, dlworld, port, restart, omp;
    char addr[64], job[64];
} env_line;

static int find_env(const char *out, int rank, env_line *e)
{
    char key[32];
    snprintf(key, sizeof key, "[%d] ENV ", rank);
    const char *p = strstr(out, key);
    if (!p)
        return -1;
    int n = sscanf(p + strlen(key),
                   "R=%d W=%d LR=%d LW=%d DR=%d DW=%d DLR=%d DLW=%d A=%63s P=%d J=%63s C=%d T=%d",
                   &e->rank, &e->world, &e->lrank, &e->lworld, &e->drank, &e->dworld, &e->dlrank,
                   &e->dlworld, e->addr, &e->port, e->job, &e->restart, &e->omp);
    return n == 13 ? 0 : -1;
}

#define ENV_SCRIPT                                                                        \
    "echo ENV R=$RANK W=$WORLD_SIZE LR=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE DR=$DT_RANK "     \
    "DW=$DT_WORLD_SIZE DLR=$DT_LOCAL_RANK DLW=$DT_LOCAL_WORLD_SIZE A=$MASTER_ADDR "       \
    "P=$MASTER_PORT J=$DT_JOB_ID C=$DT_RESTART_COUNT T=$OMP_NUM_THREADS"

static int is_hex32(const char *s)
{
    if (strlen(s) != 32)
        return 0;
    for (; *s; s++)
        if (!strchr("0123456789abcdef", *s))
            return 0;
    return 1;
}

TEST(env_and_prefixes)
{
    unsetenv("OMP_NUM_THREADS");
    const char *args[] = {"-n", "3", "--", "sh", "-c", ENV_SCRIPT, NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 0);
    env_line e0;
    int want_omp = cores() / 3 < 1 ? 1 : cores() / 3;
    for (int k = 0; k < 3; k++) {
        env_line e;
        memset(&e, 0, sizeof e);
        ASSERT_EQ_INT(find_env(r.out, k, &e), 0);
        ASSERT_EQ_INT(e.rank, k);
        ASSERT_EQ_INT(e.world, 3);
        ASSERT_EQ_INT(e.lrank, k);
        ASSERT_EQ_INT(e.lworld, 3);
        ASSERT_EQ_INT(e.drank, k);
        ASSERT_EQ_INT(e.dworld, 3);
        ASSERT_EQ_INT(e.dlrank, k);
        ASSERT_EQ_INT(e.dlworld, 3);
        ASSERT_STR_EQ(e.addr, "127.0.0.1");
        ASSERT(e.port > 0 && e.port < 65536);
        ASSERT(is_hex32(e.job));
        ASSERT_EQ_INT(e.restart, 0);
        ASSERT_EQ_INT(e.omp, want_omp);
        if (k == 0) {
            e0 = e;
        } else {
            ASSERT_STR_EQ(e.job, e0.job);
            ASSERT_EQ_INT(e.port, e0.port);
        }
    }
    ASSERT_EQ_INT(count_substr(r.out, "\n"), 3);
    cli_result_free(&r);
}

TEST(job_id_differs_between_jobs_and_user_omp_is_kept)
{
    setenv("OMP_NUM_THREADS", "7", 1);
    const char *args[] = {"-n", "1", "--", "sh", "-c", ENV_SCRIPT, NULL};
    cli_result a = run_cli(args, 30), b = run_cli(args, 30);
    unsetenv("OMP_NUM_THREADS");
    env_line ea, eb;
    ASSERT_EQ_INT(find_env(a.out, 0, &ea), 0);
    ASSERT_EQ_INT(find_env(b.out, 0, &eb), 0);
    ASSERT_EQ_INT(ea.omp, 7);
    ASSERT(strcmp(ea.job, eb.job) != 0);
    cli_result_free(&a);
    cli_result_free(&b);
}

TEST(partial_last_line_and_stderr)
{
    const char *args[] = {"-n", "2", "--", "sh", "-c",
                          "printf 'tail%s' $RANK; printf 'e1 %s\\ne2' $RANK >&2", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[0] tail0\n");
    ASSERT_STR_CONTAINS(r.out, "[1] tail1\n");
    ASSERT_STR_CONTAINS(r.err, "[1] e1 1\n");
    ASSERT_STR_CONTAINS(r.err, "[1] e2\n");
    ASSERT_STR_CONTAINS(r.err, "[0] e2\n");
    ASSERT(!strstr(r.out, "e1"));
    cli_result_free(&r);
}

TEST(lines_never_interleave)
{
    /* awk writes in large blocks that split lines across write() calls. */
    const int n = 4, lines = 3000;
    const char *args[] = {"-n", "4", "--", "sh", "-c",
                          "awk -v r=$RANK 'BEGIN { for (i = 1; i <= 3000; i++) "
                          "printf \"rank%d-line%d-padding-padding-padding\\n\", r, i }'",
                          NULL};
    cli_result r = run_cli(args, 60);
    ASSERT_EQ_INT(exit_code(&r), 0);
    int next[4] = {1, 1, 1, 1};
    int total = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
        int pr, rr, i;
        char tail[64];
        ASSERT_EQ_INT(sscanf(line, "[%d] rank%d-line%d-%63s", &pr, &rr, &i, tail), 4);
        ASSERT_EQ_INT(pr, rr);
        ASSERT(pr >= 0 && pr < n);
        ASSERT_EQ_INT(i, next[pr]);
        ASSERT_STR_EQ(tail, "padding-padding-padding");
        next[pr]++;
        total++;
    }
    ASSERT_EQ_INT(total, n * lines);
    cli_result_free(&r);
}

TEST(failed_rank_stops_the_others)
{
    const char *args[] = {"-n", "3", "--", "sh", "-c",
                          "if [ $RANK = 1 ]; then exit 3; fi; sleep 60", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT(!r.timed_out);
    ASSERT_EQ_INT(exit_code(&r), 3);
    ASSERT(r.secs < 10.0); /* the sleepers were stopped, not waited for */
    ASSERT_STR_CONTAINS(r.err, "rank 1");
    ASSERT_STR_CONTAINS(r.err, "exited with code 3");
    cli_result_free(&r);
}

TEST(rank_ignoring_sigterm_is_killed_after_grace)
{
    /* Rank 1 dies by SIGKILL; rank 0 ignores SIGTERM and must be SIGKILLed
     * by the launcher after the grace period (default 3 s). */
    const char *args[] = {"-n", "2", "--", "sh", "-c",
                          "trap '' TERM; if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 60", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT(!r.timed_out);
    ASSERT_EQ_INT(exit_code(&r), 128 + 9);
    ASSERT(r.secs < 10.0);
    ASSERT_STR_CONTAINS(r.err, "rank 1");
    ASSERT_STR_CONTAINS(r.err, "signal 9 (SIGKILL)");
    cli_result_free(&r);
}

TEST(restarts_until_success)
{
    const char *args[] = {"-n", "2", "--max-restarts", "3", "--", "sh", "-c",
                          "echo try $DT_RESTART_COUNT; "
                          "if [ $DT_RESTART_COUNT -lt 2 ] && [ $RANK = 1 ]; then exit 1; fi",
                          NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[0] try 2\n");
    ASSERT_STR_CONTAINS(r.out, "[1] try 2\n");
    ASSERT(!strstr(r.out, "try 3"));
    ASSERT_STR_CONTAINS(r.err, "restart 2 of 3");
    ASSERT_EQ_INT(count_substr(r.err, "restarting all 2 ranks"), 2);
    cli_result_free(&r);
}

TEST(restarts_exhausted)
{
    const char *args[] = {"-n", "2", "--max-restarts", "1", "--", "sh", "-c",
                          "echo try $DT_RESTART_COUNT; if [ $RANK = 0 ]; then exit 4; fi; sleep 60",
                          NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 4);
    ASSERT_STR_CONTAINS(r.out, "[0] try 1\n");
    ASSERT(!strstr(r.out, "try 2"));
    ASSERT_STR_CONTAINS(r.err, "no restarts left");
    ASSERT(r.secs < 20.0);
    cli_result_free(&r);
}

/* A rank that exits 2 (bad input) is not restarted: the job ends at once
 * with code 2, whatever --max-restarts says. */
TEST(bad_input_is_not_restarted)
{
    const char *args[] = {"-n", "2", "--max-restarts", "3", "--", "sh", "-c",
                          "echo try $DT_RESTART_COUNT; if [ $RANK = 1 ]; then exit 2; fi; sleep 60", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 2);
    ASSERT_STR_CONTAINS(r.out, "[1] try 0\n");
    ASSERT(!strstr(r.out, "try 1"));
    ASSERT(!strstr(r.err, "restarting"));
    ASSERT_STR_CONTAINS(r.err, "bad input: not restarted");
    ASSERT(r.secs < 20.0);
    cli_result_free(&r);
}

TEST(tee_writes_one_file_per_rank)
{
    char dir[] = "/tmp/dtrain-tee-XXXXXX";
    ASSERT(mkdtemp(dir));
    char sub[64];
    snprintf(sub, sizeof sub, "%s/logs", dir);
    const char *args[] = {"-n", "2", "--tee", sub, "--", "sh", "-c",
                          "echo hello from $RANK; echo oops $RANK >&2", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "[1] hello from 1\n");
    for (int k = 0; k < 2; k++) {
        char path[128], want[64], want2[64];
        snprintf(path, sizeof path, "%s/rank%d.log", sub, k);
        snprintf(want, sizeof want, "hello from %d\n", k);
        snprintf(want2, sizeof want2, "oops %d\n", k);
        char *s = t_slurp(path, NULL);
        ASSERT(s);
        ASSERT_STR_CONTAINS(s, want);
        ASSERT_STR_CONTAINS(s, want2);
        ASSERT(!strstr(s, "[")); /* no prefixes in the per-rank file */
        free(s);
        unlink(path);
    }
    rmdir(sub);
    rmdir(dir);
    cli_result_free(&r);
}

static bool file_exists_(const char *p)
{
    struct stat sb;
    return lstat(p, &sb) == 0;
}

/* A refused --tee touches nothing: with the previous job's rank0.log in
 * place and a symlink planted at rank1.log (or a directory in the way), the
 * launcher exits 2 and rank0.log still holds the old log; a --tee that is a
 * symlink to a directory is refused too. */
TEST(tee_refusal_keeps_previous_logs)
{
    char dir[] = "/tmp/dtrain-tee-XXXXXX";
    ASSERT(mkdtemp(dir));
    char log0[128], log1[128], victim[128], ldir[128];
    snprintf(log0, sizeof log0, "%s/rank0.log", dir);
    snprintf(log1, sizeof log1, "%s/rank1.log", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(ldir, sizeof ldir, "%s/linkdir", dir);
    FILE *f = fopen(log0, "w");
    ASSERT(f != NULL);
    fputs("previous job\n", f);
    fclose(f);
    ASSERT_EQ_INT(symlink(victim, log1), 0);
    const char *args[] = {"-n", "2", "--tee", dir, "--", "sh", "-c", "echo hello from $RANK", NULL};
    for (int round = 0; round < 2; round++) {
        cli_result r = run_cli(args, 30);
        ASSERT_EQ_INT(exit_code(&r), 2);
        ASSERT_STR_CONTAINS(r.err, log1);
        ASSERT(!strstr(r.out, "hello"));
        char *s = t_slurp(log0, NULL);
        ASSERT(s);
        ASSERT_STR_EQ(s, "previous job\n");
        free(s);
        ASSERT(!file_exists_(victim));
        cli_result_free(&r);
        if (round == 0) { /* round 1: a directory in the way */
            ASSERT_EQ_INT(unlink(log1), 0);
            ASSERT_EQ_INT(mkdir(log1, 0755), 0);
        }
    }
    rmdir(log1);
    ASSERT_EQ_INT(symlink(dir, ldir), 0);
    const char *args2[] = {"-n", "2", "--tee", ldir, "--", "sh", "-c", "echo hello from $RANK", NULL};
    cli_result r = run_cli(args2, 30);
    ASSERT_EQ_INT(exit_code(&r), 2);
    ASSERT_STR_CONTAINS(r.err, "symbolic link");
    char *s = t_slurp(log0, NULL);
    ASSERT(s);
    ASSERT_STR_EQ(s, "previous job\n");
    free(s);
    cli_result_free(&r);
    unlink(ldir);
    unlink(log0);
    rmdir(dir);
}

/* Two jobs given one --tee DIR: the second replaced the logs of the first while it ran. The launcher holds DIR
 * (flock) for its life: a second job is refused (exit 2) and the first's log stays. (A lock this test takes stands
 * for the first launcher's.) */
TEST(tee_dir_of_another_job_refused)
{
    char dir[] = "/tmp/dtrain-tee-XXXXXX";
    ASSERT(mkdtemp(dir));
    char log0[128];
    snprintf(log0, sizeof log0, "%s/rank0.log", dir);
    FILE *f = fopen(log0, "w");
    ASSERT(f != NULL);
    fputs("running job\n", f);
    fclose(f);
    int held = open(dir, O_RDONLY | O_DIRECTORY);
    ASSERT(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0);
    const char *args[] = {"-n", "1", "--tee", dir, "--", "sh", "-c", "echo hello from $RANK", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 2);
    ASSERT_STR_CONTAINS(r.err, "another job");
    ASSERT(!strstr(r.out, "hello"));
    char *s = t_slurp(log0, NULL);
    ASSERT(s);
    ASSERT_STR_EQ(s, "running job\n");
    free(s);
    cli_result_free(&r);
    close(held);
    r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 0);
    s = t_slurp(log0, NULL);
    ASSERT(s);
    ASSERT_STR_CONTAINS(s, "hello from 0");
    free(s);
    cli_result_free(&r);
    unlink(log0);
    rmdir(dir);
}

/* A symlink planted at DIR/rank0.log is not followed: the launcher refuses
 * to start (exit 2, a message naming it) and the link's target is unchanged.
 * An older regular rank1.log is replaced, not appended to. */
TEST(tee_refuses_planted_symlink)
{
    char dir[] = "/tmp/dtrain-tee-XXXXXX";
    ASSERT(mkdtemp(dir));
    char victim[128], link[128];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(link, sizeof link, "%s/rank0.log", dir);
    FILE *f = fopen(victim, "w");
    fputs("precious\n", f);
    fclose(f);
    ASSERT_EQ_INT(symlink(victim, link), 0);
    const char *args[] = {"-n", "2", "--tee", dir, "--", "sh", "-c", "echo hello from $RANK", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 2);
    ASSERT_STR_CONTAINS(r.err, "symbolic link");
    ASSERT_STR_CONTAINS(r.err, link);
    ASSERT(!strstr(r.out, "hello"));
    char *s = t_slurp(victim, NULL);
    ASSERT(s);
    ASSERT_STR_EQ(s, "precious\n");
    free(s);
    unlink(link);
    /* without the link the same command runs; an older log is replaced */
    char log1[128];
    snprintf(log1, sizeof log1, "%s/rank1.log", dir);
    f = fopen(log1, "w");
    fputs("old log\n", f);
    fclose(f);
    cli_result r2 = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r2), 0);
    s = t_slurp(log1, NULL);
    ASSERT(s);
    ASSERT_STR_EQ(s, "hello from 1\n");
    free(s);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ_INT(system(cmd), 0);
    cli_result_free(&r);
    cli_result_free(&r2);
}

/* JSON lines on stdout pass without the rank prefix; other lines and stderr
 * keep it. A line that only looks like JSON ("{oops") is prefixed. */
TEST(json_lines_unprefixed)
{
    const char *args[] = {"-n", "2", "--", "sh", "-c",
                          "echo \"{\\\"rank\\\":$RANK,\\\"v\\\":[1,2]}\"; echo '[1, 2]'; "
                          "echo plain $RANK; echo '{oops'; echo '{\"e\":1}' >&2", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 0);
    ASSERT_STR_CONTAINS(r.out, "{\"rank\":1,\"v\":[1,2]}\n");
    ASSERT_STR_CONTAINS(r.out, "{\"rank\":0,\"v\":[1,2]}\n");
    ASSERT(!strstr(r.out, "] {\"rank\""));
    ASSERT(!strstr(r.out, "] [1, 2]"));
    ASSERT_STR_CONTAINS(r.out, "[0] plain 0\n");
    ASSERT_STR_CONTAINS(r.out, "[1] {oops\n");
    ASSERT_STR_CONTAINS(r.err, "[0] {\"e\":1}\n");
    cli_result_free(&r);
}

/* `dtrain run -n 2 -- dtrain bench coll --json`: every stdout line parses. */
TEST(bench_json_parses_through_launcher)
{
    const char *cli = getenv("DT_CLI");
    const char *args[] = {"-n", "2", "--", cli, "bench", "coll", "--json", "--max", "64", NULL};
    cli_result r = run_cli(args, 60);
    ASSERT_EQ_INT(exit_code(&r), 0);
    int lines = 0, bad = 0;
    for (char *s = r.out; *s;) {
        char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        cJSON *j = cJSON_ParseWithLength(s, n);
        if (!cJSON_IsObject(j)) {
            fprintf(stderr, "  not JSON: %.*s\n", (int)n, s);
            bad++;
        }
        cJSON_Delete(j);
        lines++;
        s += n + (nl != NULL);
    }
    ASSERT(lines >= 2);
    ASSERT_EQ_INT(bad, 0);
    cli_result_free(&r);
}

TEST(sigterm_is_forwarded_to_every_rank)
{
    const char *args[] = {"-n", "3", "--", "sh", "-c",
                          "trap 'echo got TERM; exit 5' TERM; echo ready; "
                          "while :; do sleep 0.05; done",
                          NULL};
    cli_result r = run_cli_sig(args, 30, SIGTERM, 3);
    ASSERT(!r.timed_out);
    ASSERT_EQ_INT(exit_code(&r), 128 + SIGTERM);
    for (int k = 0; k < 3; k++) {
        char want[32];
        snprintf(want, sizeof want, "[%d] got TERM\n", k);
        ASSERT_STR_CONTAINS(r.out, want);
    }
    ASSERT_STR_CONTAINS(r.err, "forwarding");
    cli_result_free(&r);
}

TEST(sigint_is_forwarded)
{
    const char *args[] = {"-n", "2", "--", "sh", "-c",
                          "trap 'echo got INT; exit 0' INT; echo ready; "
                          "while :; do sleep 0.05; done",
                          NULL};
    cli_result r = run_cli_sig(args, 30, SIGINT, 2);
    ASSERT(!r.timed_out);
    ASSERT_EQ_INT(exit_code(&r), 128 + SIGINT);
    ASSERT_STR_CONTAINS(r.out, "[0] got INT\n");
    ASSERT_STR_CONTAINS(r.out, "[1] got INT\n");
    cli_result_free(&r);
}

TEST(job_shared_memory_is_removed)
{
    /* Both a clean and a failed job leave no /dev/shm/dtrain-<job>* behind. */
    const char *scripts[] = {
        "echo JOB $DT_JOB_ID; : > /dev/shm/dtrain-${DT_JOB_ID}-seg$RANK",
        "echo JOB $DT_JOB_ID; : > /dev/shm/dtrain-${DT_JOB_ID}-seg$RANK; "
        "if [ $RANK = 1 ]; then while [ ! -e /dev/shm/dtrain-${DT_JOB_ID}-seg0 ]; do sleep 0.01; done; "
        "kill -9 $$; fi; sleep 60",
    };
    for (int s = 0; s < 2; s++) {
        const char *args[] = {"-n", "2", "--", "sh", "-c", scripts[s], NULL};
        cli_result r = run_cli(args, 30);
        ASSERT_EQ_INT(exit_code(&r), s == 0 ? 0 : 137);
        const char *p = strstr(r.out, "JOB ");
        ASSERT(p);
        char job[64];
        ASSERT_EQ_INT(sscanf(p, "JOB %63s", job), 1);
        ASSERT(is_hex32(job));
        for (int k = 0; k < 2; k++) {
            char path[128];
            snprintf(path, sizeof path, "/dev/shm/dtrain-%s-seg%d", job, k);
            ASSERT(access(path, F_OK) != 0);
        }
        ASSERT_STR_CONTAINS(r.err, "removed 2 shared-memory segment");
        cli_result_free(&r);
    }
}

/* Rank mode of this test program (argv[1] == "--crash-with-segment"):
 * create the segment the shm backend would create for $DT_JOB_ID, print its
 * name, and die by SIGKILL as a rank crashing during start-up would. */
static int crash_with_segment(void)
{
    const char *job = getenv("DT_JOB_ID");
    char seg[64];
    if (!job)
        return 3;
    dt__shm_segment_name(job, seg, sizeof seg);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", seg);
    int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return 4;
    close(fd);
    printf("SEG %s\n", path);
    fflush(stdout);
    raise(SIGKILL);
    return 5;
}

TEST(shm_backend_segment_left_by_a_crash_is_removed)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT(n > 0);
    self[n] = '\0';
    const char *args[] = {"-n", "1", "--", self, "--crash-with-segment", NULL};
    cli_result r = run_cli(args, 30);
    ASSERT_EQ_INT(exit_code(&r), 128 + SIGKILL);
    const char *p = strstr(r.out, "SEG ");
    ASSERT(p);
    char path[256];
    ASSERT_EQ_INT(sscanf(p, "SEG %255s", path), 1);
    ASSERT(strncmp(path, "/dev/shm/dtrain-", 16) == 0);
    ASSERT(access(path, F_OK) != 0); /* the launcher removed it */
    ASSERT_STR_CONTAINS(r.err, "removed 1 shared-memory segment");
    cli_result_free(&r);
}

/* Rank mode (argv[1] == "--coll-rank"): a group from the launcher's
 * environment, 50 all-reduces checked for values; rank 1 SIGKILLs itself
 * after 3 of them on the first attempt (DT_RESTART_COUNT 0). */
static int coll_rank(void)
{
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0) {
        fprintf(stderr, "dt_pg_init: %s\n", dt_last_error());
        return 3;
    }
    int rank = dt_pg_rank(pg), w = dt_pg_size(pg);
    const char *rc = getenv("DT_RESTART_COUNT");
    int restart = rc ? atoi(rc) : -1;
    float x[257];
    for (int it = 0; it < 50; it++) {
        if (it == 3 && rank == 1 && restart == 0)
            raise(SIGKILL);
        for (int i = 0; i < 257; i++)
            x[i] = (float)(rank + it);
        dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, x, 257, DT_F32, DT_REDUCE_SUM);
        if (st < 0) {
            fprintf(stderr, "allreduce %d: %s\n", it, dt_last_error());
            dt_pg_free(pg);
            return 4;
        }
        for (int i = 0; i < 257; i++)
            if (x[i] != (float)(w * (w - 1) / 2 + w * it)) {
                dt_pg_free(pg);
                return 5;
            }
    }
    printf("done restart=%d backend=%s\n", restart, dt_pg_backend(pg));
    dt_pg_free(pg);
    return 0;
}

static void self_exe(char *buf, size_t n)
{
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    buf[k > 0 ? k : 0] = '\0';
}

/* Rank mode (argv[1] == "--stall-rank"): rank 0 starts a group and waits in
 * the rendezvous; rank 1 never joins: it waits until rank 0's segment exists,
 * prints "SEG <path> ready" and sleeps. */
static int stall_rank(void)
{
    const char *job = getenv("DT_JOB_ID"), *rank = getenv("DT_RANK");
    if (!job || !rank)
        return 3;
    if (!strcmp(rank, "0")) {
        dt_pg *pg;
        dt_pg_init(NULL, &pg);
        return 4;
    }
    char seg[64], path[128];
    dt__shm_segment_name(job, seg, sizeof seg);
    snprintf(path, sizeof path, "/dev/shm%s", seg);
    /* Ready once rank 0 has recorded its owners in the header (the file
     * exists a moment before that: a launcher killed in between leaves a
     * segment with unknown owners, which is never removed by design). */
    for (int i = 0; i < 3000; i++) {
        int fd = open(path, O_RDONLY | O_NOFOLLOW);
        shm_hdr h;
        int ok = fd >= 0 && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h &&
                 h.owner_tag == SHM_OWNER_TAG && h.owner_pid[0] > 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            break;
        usleep(10000);
    }
    printf("SEG %s ready\n", path);
    fflush(stdout);
    for (;;)
        pause();
}

/* Item 8 of issue 10: a launcher killed by SIGKILL while its ranks are still
 * rendezvousing leaves rank 0's segment (its ranks die with it); the next
 * `dtrain run` removes it, but keeps the segment of a job that is alive. */
TEST(orphan_segment_of_a_killed_launcher_is_removed_by_the_next_run)
{
    char self[4096];
    self_exe(self, sizeof self);
    setenv("DT_COMM_TIMEOUT", "60", 1);
    const char *args[] = {"-n", "2", "--", self, "--stall-rank", NULL};
    cli_result r = run_cli_sig(args, 60, SIGKILL, 1);
    ASSERT(!r.timed_out);
    ASSERT(WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGKILL);
    const char *p = strstr(r.out, "SEG ");
    ASSERT(p);
    char orphan[256];
    ASSERT_EQ_INT(sscanf(p, "SEG %255s", orphan), 1);
    cli_result_free(&r);
    /* Its ranks die with the launcher (PR_SET_PDEATHSIG): wait until the
     * creator recorded in the segment is gone (or a zombie). */
    int sfd = open(orphan, O_RDONLY | O_NOFOLLOW);
    if (sfd >= 0) {
        shm_hdr h;
        ASSERT(pread(sfd, &h, sizeof h, 0) == (ssize_t)sizeof h);
        close(sfd);
        ASSERT(h.owner_pid[0] > 0);
        char stat_path[64];
        snprintf(stat_path, sizeof stat_path, "/proc/%d/stat", (int)h.owner_pid[0]);
        for (int i = 0; i < 1000; i++) {
            char *txt = t_slurp(stat_path, NULL);
            const char *q = txt ? strrchr(txt, ')') : NULL;
            int gone = !q || q[2] == 'Z' || q[2] == 'X';
            free(txt);
            if (gone)
                break;
            usleep(10000);
        }
    } /* else another test's launcher removed it already */

    /* A live job: rank 0 of a 2-rank group in rendezvous, its parent (this
     * test) alive. */
    char live_job[64], live_seg[64], live[128];
    snprintf(live_job, sizeof live_job, "orphan-test-live-%d", (int)getpid());
    dt__shm_segment_name(live_job, live_seg, sizeof live_seg);
    snprintf(live, sizeof live, "/dev/shm%s", live_seg);
    pid_t c = dt_test_fork();
    ASSERT(c >= 0);
    if (c == 0) {
        setenv("DT_JOB_ID", live_job, 1);
        setenv("DT_RANK", "0", 1);
        setenv("DT_WORLD_SIZE", "2", 1);
        execl(self, self, "--stall-rank", (char *)NULL);
        _exit(126);
    }
    for (int i = 0; i < 3000 && access(live, F_OK) != 0; i++)
        usleep(10000);
    ASSERT(access(live, F_OK) == 0);

    const char *next[] = {"-n", "1", "--", "true", NULL};
    r = run_cli(next, 30);
    ASSERT_EQ_INT(exit_code(&r), 0);
    ASSERT(access(orphan, F_OK) != 0); /* the orphan is gone */
    ASSERT(access(live, F_OK) == 0);   /* the live job's segment is kept */
    cli_result_free(&r);

    /* The creator dead but its parent (this test) alive: still kept. */
    dt_test_kill(c, SIGKILL);
    int st;
    dt_test_waitpid(c, &st, 0);
    r = run_cli(next, 30);
    ASSERT_EQ_INT(exit_code(&r), 0);
    ASSERT(access(live, F_OK) == 0);
    cli_result_free(&r);
    unlink(live);
    unsetenv("DT_COMM_TIMEOUT");
}

TEST(rank_crash_in_a_collective_stops_the_job)
{
    char self[4096];
    self_exe(self, sizeof self);
    const char *args[] = {"-n", "3", "--", self, "--coll-rank", NULL};
    cli_result r = run_cli(args, 60);
    ASSERT(!r.timed_out);
    ASSERT_EQ_INT(exit_code(&r), 128 + SIGKILL);
    ASSERT_STR_CONTAINS(r.err, "rank 1");
    ASSERT_STR_CONTAINS(r.err, "SIGKILL");
    ASSERT(!strstr(r.out, "done"));
    ASSERT(r.secs < 20.0);
    cli_result_free(&r);
}

TEST(job_with_collectives_restarts_after_a_crash)
{
    char self[4096];
    self_exe(self, sizeof self);
    const char *args[] = {"-n", "3", "--max-restarts", "1", "--", self, "--coll-rank", NULL};
    cli_result r = run_cli(args, 60);
    ASSERT(!r.timed_out);
    if (exit_code(&r) != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(exit_code(&r), 0);
    for (int k = 0; k < 3; k++) {
        char want[64];
        snprintf(want, sizeof want, "[%d] done restart=1 backend=shm\n", k);
        ASSERT_STR_CONTAINS(r.out, want);
    }
    ASSERT_STR_CONTAINS(r.err, "restart 1 of 1");
    cli_result_free(&r);
}

TEST(bad_usage)
{
    const char *no_n[] = {"--", "true", NULL};
    const char *zero[] = {"-n", "0", "--", "true", NULL};
    const char *no_prog[] = {"-n", "2", "--", NULL};
    const char *bad_opt[] = {"-n", "2", "--frobnicate", "--", "true", NULL};
    const char *const *cases[] = {no_n, zero, no_prog, bad_opt};
    for (int i = 0; i < 4; i++) {
        cli_result r = run_cli(cases[i], 10);
        ASSERT_EQ_INT(exit_code(&r), 2);
        ASSERT(r.nerr > 0);
        cli_result_free(&r);
    }
    /* a program that cannot run is bad input: one line before any rank
     * starts, exit 2, never restarted (it was N lines, exit 127, and a
     * restart per --max-restarts) */
    const char *missing[] = {"-n", "2", "--max-restarts", "3", "--", "/nonexistent/program", NULL};
    const char *not_on_path[] = {"-n", "2", "--", "dtrain-no-such-program-on-path", NULL};
    const char *a_dir[] = {"-n", "1", "--", "/", NULL};
    const char *empty[] = {"-n", "1", "--", "", NULL};
    const char *const *bad[] = {missing, not_on_path, a_dir, empty};
    const char *why[] = {"cannot execute '/nonexistent/program': No such file or directory",
                         "'dtrain-no-such-program-on-path': not found on PATH", "'/': a directory",
                         "an empty program name"};
    for (int i = 0; i < 4; i++) {
        cli_result r = run_cli(bad[i], 10);
        ASSERT_EQ_INT(exit_code(&r), 2);
        ASSERT_STR_CONTAINS(r.err, why[i]);
        ASSERT(!strstr(r.err, "restart") && !strstr(r.err, "[0]"));
        cli_result_free(&r);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--crash-with-segment"))
        return crash_with_segment();
    if (argc > 1 && !strcmp(argv[1], "--coll-rank"))
        return coll_rank();
    if (argc > 1 && !strcmp(argv[1], "--stall-rank"))
        return stall_rank();
    RUN(env_and_prefixes);
    RUN(job_id_differs_between_jobs_and_user_omp_is_kept);
    RUN(partial_last_line_and_stderr);
    RUN(lines_never_interleave);
    RUN(failed_rank_stops_the_others);
    RUN(rank_ignoring_sigterm_is_killed_after_grace);
    RUN(restarts_until_success);
    RUN(restarts_exhausted);
    RUN(bad_input_is_not_restarted);
    RUN(tee_writes_one_file_per_rank);
    RUN(tee_refuses_planted_symlink);
    RUN(tee_refusal_keeps_previous_logs);
    RUN(tee_dir_of_another_job_refused);
    RUN(json_lines_unprefixed);
    RUN(bench_json_parses_through_launcher);
    RUN(sigterm_is_forwarded_to_every_rank);
    RUN(sigint_is_forwarded);
    RUN(job_shared_memory_is_removed);
    RUN(shm_backend_segment_left_by_a_crash_is_removed);
    RUN(orphan_segment_of_a_killed_launcher_is_removed_by_the_next_run);
    RUN(rank_crash_in_a_collective_stops_the_job);
    RUN(job_with_collectives_restarts_after_a_crash);
    RUN(bad_usage);
    return TEST_REPORT();
}
