/* dtrain train --metrics FILE: records are kept whatever happens.
 *   - a finished run: FILE holds every record, each a JSON object with a
 *     "time", the start record names the data spec and the world size, the
 *     last record is {"event":"end","status":"ok"} with the measured
 *     peak_rss_bytes and step_ms; no FILE.partial left;
 *   - SIGTERM mid-run: exit 130, an older FILE untouched, FILE.partial holds
 *     the records written so far and an end record "interrupted";
 *   - a run that fails mid-way (a write refused by RLIMIT_FSIZE): an older
 *     FILE untouched, FILE.partial keeps the records written;
 *   - a symlink planted at FILE.partial or FILE: refused before training
 *     (exit 2, message), the link's target unchanged.
 * Runs the MLP on the random data set (no data files needed). */
// dt-test-timeout: 600
#include "test.h"
#include "train_cli.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

static char g_text[65536];

static bool read_text(const char *path)
{
    g_text[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(g_text, 1, sizeof g_text - 1, f);
    g_text[n] = 0;
    fclose(f);
    return true;
}

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
}

/* Parse every line of g_text; returns the number of records, -1 if a line is
 * not a JSON object with "event" and a numeric "time". *last gets the last
 * record (caller deletes). */
static int parse_records(cJSON **last)
{
    int n = 0;
    *last = NULL;
    for (char *s = g_text; *s;) {
        char *nl = strchr(s, '\n');
        if (!nl)
            return -1; /* every record ends with a newline */
        cJSON *o = cJSON_ParseWithLength(s, (size_t)(nl - s));
        if (!cJSON_IsObject(o) || !cJSON_IsString(cJSON_GetObjectItem(o, "event")) ||
            !cJSON_IsNumber(cJSON_GetObjectItem(o, "time")) ||
            cJSON_GetObjectItem(o, "time")->valuedouble < 1.5e9) {
            cJSON_Delete(o);
            return -1;
        }
        cJSON_Delete(*last);
        *last = o;
        n++;
        s = nl + 1;
    }
    return n;
}

static const char *str_of(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

TEST(finished_run)
{
    char m[600], part[620];
    snprintf(m, sizeof m, "%s/ok.jsonl", cli_tmpdir());
    snprintf(part, sizeof part, "%s.partial", m);
    write_text(m, "{\"event\":\"older run\"}\n");
    cli_result r;
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "mlp", "--batch", "2", "--random-items", "4", "--limit-test", "2",
                        "--log-every", "1", "--progress", "none", "--metrics", m, NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!file_exists(part));
    ASSERT(read_text(m));
    cJSON *last;
    int n = parse_records(&last);
    ASSERT_EQ_INT(n, 6); /* start, 2 steps, epoch, eval, end */
    ASSERT_STR_EQ(str_of(last, "event"), "end");
    ASSERT_STR_EQ(str_of(last, "status"), "ok");
    ASSERT_EQ_INT((int)cJSON_GetObjectItem(last, "step")->valuedouble, 2);
    /* what the run measured: the peak resident set (the MLP's 8M parameters,
     * gradients and optimizer alone are tens of MB) and the median step time */
    const cJSON *rss = cJSON_GetObjectItem(last, "peak_rss_bytes"), *sm = cJSON_GetObjectItem(last, "step_ms");
    ASSERT(cJSON_IsNumber(rss) && rss->valuedouble > 32e6 && rss->valuedouble < 64e9);
    ASSERT(cJSON_IsNumber(sm) && sm->valuedouble > 0 && sm->valuedouble < 300e3);
    cJSON_Delete(last);
    ASSERT_STR_CONTAINS(g_text, "\"data\":\"random\"");
    ASSERT_STR_CONTAINS(g_text, "\"world_size\":1,");
    char cpu[160], want[200]; /* the machine the figures are from */
    snprintf(want, sizeof want, "\"cpu\":\"%s\"", dt_cpu_model_str(cpu, sizeof cpu));
    ASSERT_STR_CONTAINS(g_text, want);
    ASSERT(!strstr(g_text, "older run"));
}

/* Start a run in the background with stdout/stderr to /dev/null; limit_bytes
 * > 0 sets RLIMIT_FSIZE (and ignores SIGXFSZ so the write fails instead). */
static pid_t start_run(const char *metrics, const char *items, long limit_bytes)
{
    const char *cli = getenv("DT_CLI");
    pid_t pid = dt_test_fork();
    if (pid == 0) {
        char ep[600];
        snprintf(ep, sizeof ep, "%s.stderr", metrics);
        int fd = open("/dev/null", O_WRONLY), fe = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fe, 2);
        if (limit_bytes > 0) {
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {(rlim_t)limit_bytes, (rlim_t)limit_bytes};
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        execl(cli, cli, "train", "--model", "mlp", "--batch", "2", "--random-items", items,
              "--limit-test", "2", "--log-every", "1", "--threads", "2", "--metrics", metrics,
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* Wait (at most 240 s) until the run's first step record is in part. The
 * run has 200 steps of a few hundred ms: it is still training afterwards. */
static int wait_first_step(const char *part)
{
    for (int i = 0; i < 12000; i++) {
        if (read_text(part) && strstr(g_text, "\"event\":\"step\""))
            return 1;
        sleep_ms(20);
    }
    return 0;
}

TEST(interrupted_run_keeps_records)
{
    char m[600], part[620];
    snprintf(m, sizeof m, "%s/int.jsonl", cli_tmpdir());
    snprintf(part, sizeof part, "%s.partial", m);
    write_text(m, "{\"event\":\"older run\"}\n");
    pid_t pid = start_run(m, "400", 0);
    ASSERT(pid > 0);
    int seen = wait_first_step(part);
    dt_test_kill(pid, SIGTERM);
    int status;
    dt_test_waitpid(pid, &status, 0);
    ASSERT(seen);
    if (WIFSIGNALED(status)) {
        char ep[620];
        snprintf(ep, sizeof ep, "%s.stderr", m);
        read_text(ep);
        fprintf(stderr, "  the run was killed by signal %d; its stderr: %s\n", WTERMSIG(status), g_text);
    }
    ASSERT(WIFEXITED(status));
    ASSERT_EQ_INT(WEXITSTATUS(status), 130);
    ASSERT(read_text(m));
    ASSERT_STR_EQ(g_text, "{\"event\":\"older run\"}\n"); /* never removed by a run that did not finish */
    ASSERT(read_text(part));
    cJSON *last;
    int n = parse_records(&last);
    ASSERT(n >= 3); /* start, >= 1 step, end */
    ASSERT_STR_EQ(str_of(last, "event"), "end");
    ASSERT_STR_EQ(str_of(last, "status"), "interrupted");
    ASSERT_EQ_INT((int)cJSON_GetObjectItem(last, "exit_code")->valuedouble, 130);
    ASSERT((int)cJSON_GetObjectItem(last, "step")->valuedouble >= 1);
    ASSERT(!cJSON_GetObjectItem(last, "peak_rss_bytes")); /* measured figures: a finished run's only */
    cJSON_Delete(last);
    ASSERT_STR_CONTAINS(g_text, "\"event\":\"start\"");
    ASSERT_STR_CONTAINS(g_text, "\"event\":\"step\"");
}

/* Regression: a signal handler running while oneDNN's JIT sgemm computed
 * (2 threads) corrupted the heap, and about half of such runs aborted
 * (free(): invalid pointer) instead of exiting 130. Several signals land
 * inside a step of each of 8 runs (before the fix: all 8 survive with a
 * probability below 1e-3). */
TEST(signals_mid_step_never_crash)
{
    char m[600], part[620];
    snprintf(m, sizeof m, "%s/sig.jsonl", cli_tmpdir());
    snprintf(part, sizeof part, "%s.partial", m);
    for (int run = 0; run < 8; run++) {
        remove(part);
        pid_t pid = start_run(m, "400", 0);
        ASSERT(pid > 0);
        int seen = wait_first_step(part);
        for (int k = 0; k < 6; k++) { /* spread over the next step's matmuls */
            dt_test_kill(pid, k % 2 ? SIGINT : SIGTERM);
            sleep_ms(7 + 5 * run);
        }
        int status;
        dt_test_waitpid(pid, &status, 0);
        ASSERT(seen);
        if (!WIFEXITED(status))
            fprintf(stderr, "run %d: killed by signal %d\n", run, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        ASSERT(WIFEXITED(status));
        ASSERT_EQ_INT(WEXITSTATUS(status), 130);
        ASSERT(read_text(part));
        ASSERT_STR_CONTAINS(g_text, "\"status\":\"interrupted\"");
    }
}

TEST(failed_run_keeps_older_file)
{
    char m[600], part[620];
    snprintf(m, sizeof m, "%s/fail.jsonl", cli_tmpdir());
    snprintf(part, sizeof part, "%s.partial", m);
    write_text(m, "{\"event\":\"older run\"}\n");
    /* room for the start record only: the first step record's write fails */
    pid_t pid = start_run(m, "8", 450);
    ASSERT(pid > 0);
    int status;
    dt_test_waitpid(pid, &status, 0);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ_INT(WEXITSTATUS(status), 1);
    ASSERT(read_text(m));
    ASSERT_STR_EQ(g_text, "{\"event\":\"older run\"}\n");
    ASSERT(read_text(part));
    ASSERT_STR_CONTAINS(g_text, "{\"event\":\"start\",\"model\":\"mlp\"");
}

TEST(symlinks_not_followed)
{
    char victim[600], m[600], part[620];
    snprintf(victim, sizeof victim, "%s/victim", cli_tmpdir());
    snprintf(m, sizeof m, "%s/ln.jsonl", cli_tmpdir());
    snprintf(part, sizeof part, "%s.partial", m);
    write_text(victim, "precious\n");
    for (int which = 0; which < 2; which++) {
        const char *link = which == 0 ? part : m;
        unlink(part);
        unlink(m);
        ASSERT_EQ_INT(symlink(victim, link), 0);
        cli_result r;
        cli_runv(&r, 300, NULL,
                 (char *[]){"train", "--model", "mlp", "--batch", "2", "--random-items", "4", "--limit-test",
                            "2", "--progress", "none", "--metrics", m, NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "symbolic link");
        ASSERT_STR_CONTAINS(r.err, link);
        ASSERT_EQ_INT(cli_lines(r.err), 1);
        ASSERT(read_text(victim));
        ASSERT_STR_EQ(g_text, "precious\n");
        struct stat st;
        ASSERT_EQ_INT(lstat(link, &st), 0);
        ASSERT(S_ISLNK(st.st_mode));
    }
}

/* --metrics naming a FIFO, a directory or (as root) a device node is refused
 * at the start, before any step, and the thing is still there: the rename at
 * the end replaced it (as root, `--metrics /dev/null` replaced /dev/null
 * with a regular file), a directory failed the rename after the whole run.
 * The device is a node of the test's own, never /dev/null. */
TEST(non_regular_file_refused_at_start)
{
    char fifo[600], dev[600], dir[600];
    snprintf(fifo, sizeof fifo, "%s/m.fifo", cli_tmpdir());
    snprintf(dev, sizeof dev, "%s/m.null", cli_tmpdir());
    snprintf(dir, sizeof dir, "%s/m.dir", cli_tmpdir());
    unlink(fifo), unlink(dev), rmdir(dir);
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    ASSERT_EQ_INT(mkdir(dir, 0700), 0);
    const bool have_dev = mknod(dev, S_IFCHR | 0600, makedev(1, 3)) == 0; /* root only */
    const char *names[] = {fifo, dir, dev}, *kinds[] = {"a FIFO", "a directory", "a character device"};
    const mode_t modes[] = {S_IFIFO, S_IFDIR, S_IFCHR};
    for (int i = 0; i < (have_dev ? 3 : 2); i++) {
        cli_result r;
        cli_runv(&r, 300, NULL,
                 (char *[]){"train", "--model", "mlp", "--batch", "2", "--random-items", "4", "--limit-test", "2",
                            "--progress", "plain", "--log-every", "1", "--metrics", (char *)names[i], NULL});
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "--metrics");
        ASSERT_STR_CONTAINS(r.err, names[i]);
        ASSERT_STR_CONTAINS(r.err, kinds[i]);
        ASSERT(!strstr(r.out, "step 1/")); /* refused before training */
        struct stat st;
        ASSERT_EQ_INT(lstat(names[i], &st), 0);
        ASSERT_EQ_INT((int)(st.st_mode & S_IFMT), (int)modes[i]);
        char part[620];
        snprintf(part, sizeof part, "%s.partial", names[i]);
        ASSERT_EQ_INT(access(part, F_OK), -1);
    }
    unlink(fifo), unlink(dev), rmdir(dir);
}

/* Two runs given one --metrics file: the second is refused at the start (exit 2, naming the file) while the first
 * runs, and the first's records stay whole (the second replaced its FILE.partial, and the first's rename at the end
 * then moved the second's records over FILE) */
TEST(second_run_on_one_metrics_file_refused)
{
    char m[600], part[620];
    snprintf(m, sizeof m, "%s/two.jsonl", cli_tmpdir());
    snprintf(part, sizeof part, "%s.partial", m);
    remove(part);
    pid_t pid = start_run(m, "4000", 0); /* 2000 steps: still running when the second one starts, however slow */
    ASSERT(pid > 0);
    int seen = wait_first_step(part);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "mlp", "--batch", "2", "--random-items", "4", "--limit-test", "2",
                        "--progress", "none", "--metrics", m, NULL});
    dt_test_kill(pid, SIGTERM);
    int status;
    dt_test_waitpid(pid, &status, 0);
    ASSERT(seen);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "another run is writing it");
    ASSERT_STR_CONTAINS(r.err, m);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 130);
    ASSERT(read_text(part));
    ASSERT_STR_CONTAINS(g_text, "\"train_items\":4000"); /* the first run's records, whole */
    ASSERT_STR_CONTAINS(g_text, "\"status\":\"interrupted\"");
    /* and once it has ended, the file is free again */
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "mlp", "--batch", "2", "--random-items", "4", "--limit-test", "2",
                        "--progress", "none", "--metrics", m, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(read_text(m));
    ASSERT_STR_CONTAINS(g_text, "\"status\":\"ok\"");
}

/* --metrics naming a file the run reads (its data, its config): refused at the start, the file kept (the rename at
 * the end replaced the training data with the metrics) */
TEST(metrics_over_an_input_refused)
{
    char data[600], cfg[600];
    snprintf(data, sizeof data, "%s/in.npy", cli_tmpdir());
    snprintf(cfg, sizeof cfg, "%s/in.json", cli_tmpdir());
    write_text(data, "not really npy\n");
    write_text(cfg, "{\"train_micro_batch_size_per_gpu\": 2}\n");
    char spec[620];
    snprintf(spec, sizeof spec, "npy:%s,test=0.5", data);
    cli_result r;
    cli_runv(&r, 120, NULL, (char *[]){"train", "--model", "mlp", "--data", spec, "--metrics", data, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is also a --data file");
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "mlp", "--data", "random", "--random-items", "4", "--limit-test", "2",
                        "--config", cfg, "--metrics", cfg, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is also --config");
    ASSERT(read_text(data));
    ASSERT_STR_EQ(g_text, "not really npy\n");
    ASSERT(read_text(cfg));
    ASSERT_STR_EQ(g_text, "{\"train_micro_batch_size_per_gpu\": 2}\n");
}

/* The samples/s of the progress lines leaves evaluation out, as the step
 * records and the epoch line do: with an evaluation after every step that
 * costs more than the step, both figures still agree (they were 3x apart
 * when the progress clock ran through evaluations). */
TEST(throughput_excludes_evaluation)
{
    char m[600];
    snprintf(m, sizeof m, "%s/tp.jsonl", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "mlp", "--batch", "2", "--random-items", "8", "--limit-test", "8",
                        "--log-every", "1", "--eval-every", "1", "--progress", "plain", "--metrics", m, NULL});
    ASSERT_EQ_INT(r.code, 0);
    const char *line = strstr(r.out, "step 3/4 loss");
    ASSERT(line != NULL);
    const char *sps = strstr(line, "samples/s ");
    ASSERT(sps != NULL);
    double shown = strtod(sps + 10, NULL);
    ASSERT(read_text(m));
    const char *rec = strstr(g_text, "\"step\":3,\"epoch_step\":3");
    ASSERT(rec != NULL);
    const char *rs = strstr(rec, "\"samples_per_s\":");
    ASSERT(rs != NULL);
    double recorded = strtod(rs + 16, NULL);
    fprintf(stderr, "  shown %.2f samples/s, recorded %.2f\n", shown, recorded);
    ASSERT(recorded > 0);
    ASSERT(shown > 0.7 * recorded && shown < 1.4 * recorded);
}

int main(void)
{
    if (!getenv("DT_CLI")) {
        fprintf(stderr, "DT_CLI is not set\n");
        return 1;
    }
    RUN(finished_run);
    RUN(interrupted_run_keeps_records);
    RUN(signals_mid_step_never_crash);
    RUN(failed_run_keeps_older_file);
    RUN(symlinks_not_followed);
    RUN(non_regular_file_refused_at_start);
    RUN(metrics_over_an_input_refused);
    RUN(second_run_on_one_metrics_file_refused);
    RUN(throughput_excludes_evaluation);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
