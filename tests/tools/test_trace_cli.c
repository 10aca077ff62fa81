/* `dtrain train --trace DIR` under `dtrain run -n 2`: the merged
 * DIR/trace.json of a DDP run, a ZeRO-3 run and a 2-stage 1F1B pipeline
 * run (a small GPT) is a valid Chrome trace: every event has its required
 * fields, the timestamps of each thread never decrease, each rank is a
 * process named "rank N", the steps of --trace-steps (and no others) are
 * there, every collective appears on every rank of its group with the same
 * kind and sequence number (and, merged, how long each rank waited for the
 * last one), and each run shows what its strategy does: all-reduces (DDP),
 * all-gathers and reduce-scatters (ZeRO-3), F and B of every micro-batch
 * on each stage with the sends and receives between them (1F1B). Bad
 * --trace-steps values exit 2 with one line. */
// dt-test-timeout: 400
// dt-test-labels: threads
#include "base/trace_impl.h"
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <fcntl.h>
#include <sys/file.h>

static char tokens[320];

static char *cli(void) { return getenv("DT_CLI"); }

static void write_tokens(void)
{
    cli_stream_file("train.bin", 4000, false, tokens, sizeof tokens);
}

static void run_traced(cli_result *r, const char *dir, char *const *extra)
{
    char *base[] = {"train", "--model", "gpt-micro", "--vocab-size", "40", "--n-embd", "32", "--seq", "16",
                    "--data", tokens, "--batch", "8", "--max-steps", "6", "--threads", "1", "--progress",
                    "plain", "--no-eval", "--seed", "1", "--trace", (char *)dir, "--trace-steps", "3:5", NULL};
    cli_run_ranks(r, 200, NULL, 2, 2, (char *const *const[]){base, extra});
}

typedef struct {
    char key[96];
    char kind[32];
    int rank, size;
} coll;

static int coll_cmp(const void *a, const void *b) { return strcmp(((const coll *)a)->key, ((const coll *)b)->key); }

typedef struct {
    int steps[2];         /* step spans per rank */
    int colls;            /* collectives (all ranks) */
    int kinds_bad;        /* a key whose kind differs between ranks */
    int incomplete;       /* a key not on group_size ranks */
    int waits_bad;        /* wait_peers_us missing or outside [0, dur] */
    int named[2];         /* process_name "rank N" */
} summary;

/* Check the file and fill s; false (with a message) when malformed. */
static bool check_trace(const char *path, summary *s, int (*count_name)(const char *, int, void *), void *ud)
{
    memset(s, 0, sizeof *s);
    cJSON *j;
    if (dt__trace_read(path, &j) < 0) {
        fprintf(stderr, "%s\n", dt_last_error());
        return false;
    }
    static double last[2][2048];
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 2048; t++)
            last[p][t] = -1;
    static coll cs[8192];
    int nc = 0;
    bool ok = true;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents"))
    {
        const char *ph = dt__trace_str(e, "ph"), *name = dt__trace_str(e, "name");
        int pid = (int)dt__trace_num(e, "pid", -1), tid = (int)dt__trace_num(e, "tid", -1);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
        if (!ph || !name || pid < 0 || pid > 1 || tid < 0 || tid >= 2048) {
            fprintf(stderr, "an event without ph/name/pid/tid in range\n");
            ok = false;
            break;
        }
        if (!strcmp(ph, "M")) {
            char want[16];
            snprintf(want, sizeof want, "rank %d", pid);
            if (!strcmp(name, "process_name") && dt__trace_str(a, "name") && !strcmp(dt__trace_str(a, "name"), want))
                s->named[pid]++;
            continue;
        }
        double ts = dt__trace_num(e, "ts", -1);
        if (ts < 0 || !cJSON_IsObject(a)) {
            fprintf(stderr, "event '%s': no ts or args\n", name);
            ok = false;
            break;
        }
        if (strcmp(ph, "X"))
            continue;
        double dur = dt__trace_num(e, "dur", -1);
        const char *cat = dt__trace_str(e, "cat");
        if (dur < 0 || !cat || ts < last[pid][tid]) {
            fprintf(stderr, "event '%s' of rank %d thread %d: dur %g, cat %s, ts %.3f after %.3f\n", name, pid, tid,
                    dur, cat ? cat : "(none)", ts, last[pid][tid]);
            ok = false;
            break;
        }
        last[pid][tid] = ts;
        int step = (int)dt__trace_num(a, "step", -1);
        if (step != 3 && step != 4) {
            fprintf(stderr, "event '%s' of step %d outside --trace-steps 3:5\n", name, step);
            ok = false;
            break;
        }
        if (!strcmp(cat, "step"))
            s->steps[pid]++;
        if (count_name)
            count_name(name, pid, ud);
        char key[96];
        if (dt__trace_coll_key(e, key, sizeof key) && nc < 8192) {
            coll *c = &cs[nc++];
            snprintf(c->key, sizeof c->key, "%s", key);
            snprintf(c->kind, sizeof c->kind, "%s", name);
            c->rank = pid;
            c->size = (int)dt__trace_num(a, "group_size", 0);
            double w = dt__trace_num(a, "wait_peers_us", -1);
            s->waits_bad += w < 0 || w > dur + 1e-3 || dt__trace_num(a, "last_rank", -1) < 0;
        }
    }
    cJSON_Delete(j);
    qsort(cs, (size_t)nc, sizeof *cs, coll_cmp);
    for (int i = 0; i < nc;) {
        int k = i;
        while (k < nc && !strcmp(cs[k].key, cs[i].key)) {
            s->kinds_bad += strcmp(cs[k].kind, cs[i].kind) != 0;
            k++;
        }
        if (k - i != cs[i].size) {
            fprintf(stderr, "collective %s (%s) on %d ranks of its group of %d\n", cs[i].key, cs[i].kind, k - i,
                    cs[i].size);
            s->incomplete++;
        }
        i = k;
    }
    s->colls = nc;
    return ok;
}

static void assert_common(const summary *s)
{
    ASSERT_EQ_INT(s->named[0], 1);
    ASSERT_EQ_INT(s->named[1], 1);
    ASSERT_EQ_INT(s->steps[0], 2);
    ASSERT_EQ_INT(s->steps[1], 2);
    ASSERT(s->colls > 0);
    ASSERT_EQ_INT(s->kinds_bad, 0);
    ASSERT_EQ_INT(s->incomplete, 0);
    ASSERT_EQ_INT(s->waits_bad, 0);
}

/* names[pid][k] counts of names seen that start with the given prefixes */
typedef struct {
    const char *const *pre;
    int n;
    int got[2][16];
} name_count;

static int count_prefix(const char *name, int pid, void *ud)
{
    name_count *c = ud;
    for (int k = 0; k < c->n; k++)
        if (!strncmp(name, c->pre[k], strlen(c->pre[k])) && (name[strlen(c->pre[k])] == 0 || name[strlen(c->pre[k])] == ' '))
            c->got[pid][k]++;
    return 0;
}

TEST(ddp)
{
    static cli_result r;
    char dir[300], path[340];
    snprintf(dir, sizeof dir, "%s/ddp", cli_tmpdir());
    run_traced(&r, dir, NULL);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "trace: ");
    snprintf(path, sizeof path, "%s/rank-1.json", dir);
    ASSERT(file_exists(path));
    snprintf(path, sizeof path, "%s/trace.json", dir);
    static const char *const pre[] = {"allreduce", "transformer.h.0", "transformer.h.1"};
    name_count nc = {pre, 3, {{0}}};
    summary s;
    ASSERT(check_trace(path, &s, count_prefix, &nc));
    assert_common(&s);
    for (int p = 0; p < 2; p++) {
        ASSERT(nc.got[p][0] >= 2);  /* the gradients' all-reduce (and the step's agreement) per step */
        ASSERT_EQ_INT(nc.got[p][1], 4); /* block 0's forward and backward, two steps */
        ASSERT_EQ_INT(nc.got[p][2], 4);
    }
}

TEST(zero3)
{
    static cli_result r;
    char dir[300], path[340];
    snprintf(dir, sizeof dir, "%s/zero3", cli_tmpdir());
    run_traced(&r, dir, (char *[]){"--zero", "3", NULL});
    ASSERT_EQ_INT(r.code, 0);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    static const char *const pre[] = {"allgather", "reduce_scatter"};
    name_count nc = {pre, 2, {{0}}};
    summary s;
    ASSERT(check_trace(path, &s, count_prefix, &nc));
    assert_common(&s);
    for (int p = 0; p < 2; p++) {
        ASSERT(nc.got[p][0] >= 2);
        ASSERT(nc.got[p][1] >= 2);
    }
}

TEST(pipeline_1f1b)
{
    static cli_result r;
    char dir[300], path[340];
    snprintf(dir, sizeof dir, "%s/pp", cli_tmpdir());
    run_traced(&r, dir, (char *[]){"--pp", "2", "--pp-schedule", "1f1b", "--micro-batches", "4", NULL});
    ASSERT_EQ_INT(r.code, 0);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    static const char *const pre[] = {"F0", "F3", "B0", "B3", "send F0", "recv F0", "send B0", "recv B0"};
    name_count nc = {pre, 8, {{0}}};
    summary s;
    ASSERT(check_trace(path, &s, count_prefix, &nc));
    assert_common(&s);
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 4; k++)
            ASSERT_EQ_INT(nc.got[p][k], 2); /* each micro-batch's F and B, two steps, on both stages */
    ASSERT_EQ_INT(nc.got[0][4], 2);         /* stage 0 sends activations, receives gradients */
    ASSERT_EQ_INT(nc.got[0][7], 2);
    ASSERT_EQ_INT(nc.got[1][5], 2);         /* stage 1 receives activations, sends gradients */
    ASSERT_EQ_INT(nc.got[1][6], 2);
    ASSERT_EQ_INT(nc.got[0][5] + nc.got[1][4], 0);
}

/* dtrain trace summary / plot of the runs above (their directories). */
TEST(summary_and_plot)
{
    static cli_result r;
    char in[340], out[340];
    snprintf(in, sizeof in, "%s/pp/trace.json", cli_tmpdir());
    if (!file_exists(in))
        DT_TEST_SKIP("the pipeline run above did not leave its trace");
    cli_runv(&r, 60, NULL, (char *[]){"trace", "summary", in, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 ranks, 4 step spans");
    ASSERT_STR_CONTAINS(r.out, "per step and rank");
    ASSERT_STR_CONTAINS(r.out, "(0.250: p 2, v 1, m 4)"); /* 1F1B, 2 stages, 4 micro-batches: (p-1)/m */
    ASSERT_STR_CONTAINS(r.out, "slowest rank per collective");
    ASSERT_STR_CONTAINS(r.out, "top ops by time");
    snprintf(in, sizeof in, "%s/zero3/trace.json", cli_tmpdir());
    cli_runv(&r, 60, NULL, (char *[]){"trace", "summary", in, "--top", "3", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(strstr(r.out, "(formula") != NULL && strstr(r.out, ": p ") == NULL); /* no pipeline: no bubble */
    cli_runv(&r, 60, NULL, (char *[]){"trace", "summary", "/nonexistent/trace.json", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "/nonexistent/trace.json");
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    cli_runv(&r, 60, NULL, (char *[]){"trace", "nonsense", NULL});
    ASSERT_EQ_INT(r.code, 2);
    if (access("/usr/bin/gnuplot", X_OK) != 0 && !getenv("DT_GNUPLOT"))
        DT_TEST_SKIP_NEED("gnuplot", "gnuplot is not installed (Debian package gnuplot-nox)");
    snprintf(out, sizeof out, "%s/zero3.png", cli_tmpdir());
    cli_runv(&r, 60, NULL, (char *[]){"trace", "plot", in, "-o", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "wrote ");
    ASSERT_STR_CONTAINS(r.out, "(step 3, ");
    char head[9] = {0};
    FILE *f = fopen(out, "rb");
    ASSERT(f != NULL);
    ASSERT(fread(head, 1, 8, f) == 8);
    fclose(f);
    ASSERT(!memcmp(head, "\x89PNG\r\n\x1a\n", 8));
    cli_runv(&r, 60, NULL, (char *[]){"trace", "plot", in, "--step", "99", "-o", out, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "no step 99");
}

/* Two jobs given one --trace DIR: the second replaced the first's rank files under it (and a merge could mix
 * the two). The first's rank 0 holds the directory while it records: the second is refused at its start (exit 2),
 * before any step, naming the directory. (A lock this test takes stands for the first job's.) */
TEST(trace_dir_of_another_job_exit_2)
{
    static cli_result r;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/held", cli_tmpdir());
    ASSERT_EQ_INT(mkdir(dir, 0755), 0);
    int held = open(dir, O_RDONLY | O_DIRECTORY);
    ASSERT(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0);
    /* a small test set: evaluating the 1000 default items took the run past the 60 s limit on a loaded machine */
    char *a[] = {"train", "--model", "mlp", "--random-items", "16", "--limit-test", "16", "--max-steps", "2",
                 "--trace", dir, "--trace-steps", "1:2", "--progress", "plain", NULL};
    cli_runv(&r, 60, NULL, a);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "another job");
    ASSERT(!strstr(r.out, "first step done"));
    close(held);
    cli_runv(&r, 60, NULL, a);
    ASSERT_EQ_INT(r.code, 0);
}

TEST(bad_steps_exit_2)
{
    static cli_result r;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/bad", cli_tmpdir());
    char *a[] = {"train", "--model", "mlp", "--random-items", "16", "--trace", dir, "--trace-steps", "5:3", NULL};
    cli_runv(&r, 60, NULL, a);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--trace-steps");
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    char *b[] = {"train", "--model", "mlp", "--random-items", "16", "--trace-steps", "3:5", NULL};
    cli_runv(&r, 60, NULL, b);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "needs --trace DIR");
}

/* A trace window past the run's end (the default 3:5 on a --max-steps 2 run) is said at start, with the
 * window that would record; it wrote an empty trace without a word. A window inside the run says nothing. */
TEST(window_past_the_run_is_said)
{
    static cli_result r;
    char dir[300], dir2[300];
    snprintf(dir, sizeof dir, "%s/short", cli_tmpdir());
    snprintf(dir2, sizeof dir2, "%s/short2", cli_tmpdir());
    char *a[] = {"train", "--model", "mlp", "--mlp-dim", "8", "--mlp-hidden", "8", "--random-items", "16",
                 "--batch", "8", "--threads", "1", "--max-steps", "2", "--progress", "none", "--trace", dir, NULL};
    cli_runv(&r, 60, NULL, a);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "--trace-steps 3:5 starts after the run's last step (2): the trace will hold no "
                               "step; give --trace-steps 1:3");
    char *b[] = {"train", "--model", "mlp", "--mlp-dim", "8", "--mlp-hidden", "8", "--random-items", "16",
                 "--batch", "8", "--threads", "1", "--max-steps", "2", "--progress", "none", "--trace", dir2,
                 "--trace-steps", "1:3", NULL};
    cli_runv(&r, 60, NULL, b);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!strstr(r.err, "--trace-steps"));
}

/* Bad arguments of trace summary/plot: one line naming the problem, exit 2.
 * A flag without its value was "unexpected argument", --top/--step took
 * " 5" (strtol), a trace without steps said "no step -1", a directory
 * "Cannot allocate memory", a trace without events was summarized as
 * empty tables with exit 0. */
TEST(bad_arguments_exit_2)
{
    static cli_result r;
    char empty[340], dir[340], fifo[340];
    snprintf(empty, sizeof empty, "%s/empty-trace.json", cli_tmpdir());
    snprintf(dir, sizeof dir, "%s", cli_tmpdir());
    snprintf(fifo, sizeof fifo, "%s/trace.fifo", cli_tmpdir());
    unlink(fifo);
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    FILE *f = fopen(empty, "w");
    ASSERT(f != NULL);
    fputs("{\"traceEvents\":[]}\n", f);
    fclose(f);
    struct {
        char *args[8];
        const char *msg;
    } cases[] = {
        {{"trace", "summary", empty, "--top", NULL}, "--top needs a value"},
        {{"trace", "summary", empty, "--top", " 5", NULL}, "--top: ' 5' is not an integer"},
        {{"trace", "summary", empty, "--top", "0", NULL}, "--top: 0 is out of range"},
        {{"trace", "plot", empty, "--step", NULL}, "--step needs a value"},
        {{"trace", "plot", empty, "-o", NULL}, "-o needs a value"},
        {{"trace", "plot", empty, "--step", " 5", NULL}, "--step: ' 5' is not an integer"},
        {{"trace", "plot", empty, "--step", "-1", NULL}, "--step: -1 is out of range"},
        {{"trace", "plot", empty, NULL}, "no step in the trace"},
        {{"trace", "summary", empty, NULL}, "no events to summarize"}, /* it printed empty tables, exit 0 */
        {{"trace", "plot", dir, NULL}, "not a regular file"},
        /* a FIFO: refused, not opened (the open blocked for ever waiting for a writer) */
        {{"trace", "plot", fifo, NULL}, "not a regular file"},
        /* the image over the trace itself */
        {{"trace", "plot", empty, "-o", empty, NULL}, "is also the trace"},
        {{"trace", "summary", fifo, NULL}, "not a regular file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_runv(&r, 60, NULL, cases[i].args);
        if (r.code != 2 || !strstr(r.err, cases[i].msg) || cli_lines(r.err) != 1) {
            fprintf(stderr, "  case %zu: exit %d, stderr '%s'\n", i, r.code, r.err);
            ASSERT(0);
        }
    }
}

/* Numbers a trace file may hold that no int or step takes (a pid or tid
 * past an int, an infinite ts, a step past int64): the event is refused,
 * exit 2, naming the file; never converted out of range (undefined in C)
 * nor summed as infinity. */
TEST(out_of_range_numbers)
{
    static cli_result r;
#define EV(pid, tid, ts, step)                                                                                   \
    "{\"ph\":\"X\",\"pid\":" pid ",\"tid\":" tid ",\"ts\":" ts ",\"dur\":1,\"cat\":\"step\",\"name\":\"step\","   \
    "\"args\":{\"step\":" step "}}"
    static const char *const ev[] = {EV("1e12", "1", "0", "3"), EV("0", "1e12", "0", "3"), EV("0", "1", "1e999", "3"),
                                     EV("0", "1", "0", "1e300")};
#undef EV
    char path[340];
    snprintf(path, sizeof path, "%s/range.json", cli_tmpdir());
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++) {
        FILE *f = fopen(path, "w");
        ASSERT(f != NULL);
        fprintf(f, "{\"traceEvents\":[%s],\"otherData\":{\"world\":1}}\n", ev[i]);
        ASSERT(fclose(f) == 0);
        cli_runv(&r, 60, NULL, (char *[]){"trace", "summary", path, NULL});
        if (r.code != 2)
            fprintf(stderr, "  event %zu: code %d, stdout %s, stderr %s", i, r.code, r.out, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "range.json");
        ASSERT_EQ_INT(cli_lines(r.err), 1);
    }
}

int main(void)
{
    if (!cli())
        DT_TEST_SKIP_ALL("DT_CLI is not set (run under ctest)");
    write_tokens();
    RUN(ddp);
    RUN(zero3);
    RUN(pipeline_1f1b);
    RUN(summary_and_plot);
    RUN(trace_dir_of_another_job_exit_2);
    RUN(bad_steps_exit_2);
    RUN(window_past_the_run_is_said);
    RUN(bad_arguments_exit_2);
    RUN(out_of_range_numbers);
    cli_cleanup();
    return TEST_REPORT();
}
