/* The timeline recorder (trace.h) in one process: off it records nothing
 * and allocates nothing (counted by a malloc interposer, also over whole
 * trainer steps); on, a trainer's steps give step / forward / backward /
 * optimizer spans per unit inside the --trace-steps window only; the ring
 * keeps the newest `capacity` events and counts the rest; the file is
 * valid Chrome trace JSON with per-thread start order; the merge matches
 * collectives across ranks (wait_peers_us, last_rank); bad parameters are
 * errors. */
#include "base/trace_impl.h"
#include "dtrain/pipeline.h"
#include "dtrain/train.h"
#include "model_util.h"
#include "test.h"
#include "tmp_util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- counting allocations on this thread (not under the sanitizers, which
 * own malloc) ---- */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COUNTING 0
static long allocs(void) { return 0; }
static void count(bool on) { (void)on; }
#else
#define COUNTING 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
static _Thread_local int g_count_on;
static _Thread_local long g_allocs;
void *malloc(size_t n)
{
    g_allocs += g_count_on;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    g_allocs += g_count_on;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    g_allocs += g_count_on;
    return __libc_realloc(p, n);
}
int posix_memalign(void **p, size_t al, size_t n)
{
    g_allocs += g_count_on;
    *p = __libc_memalign(al, n);
    return *p ? 0 : 12;
}
void *aligned_alloc(size_t al, size_t n)
{
    g_allocs += g_count_on;
    return __libc_memalign(al, n);
}
static long allocs(void) { return g_allocs; }
static void count(bool on) { g_count_on = on; }
#endif

/* ---- a small trainer ---- */

typedef struct {
    dt_model *m;
    dt_trainer *tr;
    float x[4 * 8];
    int64_t y[4];
} rig;

static bool rig_make(rig *r, const dt_trace_params *tp)
{
    memset(r, 0, sizeof *r);
    dt_module *c[3] = {dt_nn_linear(8, 16, true), dt_nn_relu(), dt_nn_linear(16, 4, true)};
    r->m = t_build(dt_nn_seq(3, c), 1);
    dt_strategy *s = NULL;
    if (!r->m || dt_strategy_none_init(&s) < 0)
        return false;
    dt_trainer_params p = dt_trainer_params_default();
    p.sgd.lr = 0.1;
    if (tp)
        p.trace = *tp;
    if (dt_trainer_init(r->m, s, &p, &r->tr) < 0)
        return false;
    for (int i = 0; i < 32; i++)
        r->x[i] = (float)((i * 7) % 11) / 11.0f;
    for (int i = 0; i < 4; i++)
        r->y[i] = i % 4;
    return true;
}

static dt_status rig_step(rig *r)
{
    int64_t xs[2] = {4, 8}, ys[1] = {4};
    dt_trainer_batch b = dt_trainer_batch_make(r->x, DT_F32, 2, xs, r->y, DT_I64, 1, ys);
    dt_trainer_metrics mt;
    return dt_trainer_step(r->tr, &b, 1, &mt);
}

static void rig_free(rig *r)
{
    dt_trainer_free(r->tr);
    dt_model_free(r->m);
}

/* Events of a parsed file with ph "X" and the given cat (NULL: any) and name (NULL: any). */
static int count_x(const cJSON *j, const char *cat, const char *name)
{
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents"))
    {
        const char *ph = dt__trace_str(e, "ph"), *c = dt__trace_str(e, "cat"), *nm = dt__trace_str(e, "name");
        if (ph && !strcmp(ph, "X") && (!cat || (c && !strcmp(c, cat))) && (!name || (nm && !strcmp(nm, name))))
            n++;
    }
    return n;
}

/* args.flop of the forward spans named name (-1: none, or they differ). */
static double flop_of(const cJSON *j, const char *name)
{
    double f = -2;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents"))
    {
        const char *c = dt__trace_str(e, "cat"), *nm = dt__trace_str(e, "name");
        if (c && !strcmp(c, "forward") && nm && !strcmp(nm, name)) {
            double v = dt__trace_num(cJSON_GetObjectItemCaseSensitive(e, "args"), "flop", -1);
            if (f != -2 && v != f)
                return -1;
            f = v;
        }
    }
    return f == -2 ? -1 : f;
}

/* Every event has ph, pid, tid, name; X: ts, dur >= 0, cat; C: ts, args;
 * per (pid, tid) the X events' ts never decrease in file order. */
static bool well_formed(const cJSON *j)
{
    double last[4][2048];
    for (int p = 0; p < 4; p++)
        for (int t = 0; t < 2048; t++)
            last[p][t] = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents"))
    {
        const char *ph = dt__trace_str(e, "ph");
        int pid = (int)dt__trace_num(e, "pid", -1), tid = (int)dt__trace_num(e, "tid", -1);
        if (!ph || !dt__trace_str(e, "name") || pid < 0 || pid >= 4 || tid < 0 || tid >= 2048)
            return false;
        if (!strcmp(ph, "M"))
            continue;
        double ts = dt__trace_num(e, "ts", -1);
        if (ts < 0)
            return false;
        if (!strcmp(ph, "X")) {
            if (dt__trace_num(e, "dur", -1) < 0 || !dt__trace_str(e, "cat"))
                return false;
            if (ts < last[pid][tid])
                return false;
            last[pid][tid] = ts;
        } else if (strcmp(ph, "C") || !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(e, "args"))) {
            return false;
        }
    }
    return true;
}

TEST(off_records_and_allocates_nothing)
{
    if (!COUNTING) /* the rest still runs: nothing recorded, nothing held */
        fprintf(stderr, "note: the sanitizers own malloc: allocations are counted in the release build only\n");
    ASSERT(!dt_trace_is_open());
    ASSERT(dt_trace_now() == 0);
    count(true);
    long a0 = allocs();
    for (int i = 0; i < 1000; i++) {
        dt_trace_step(i);
        dt_trace_span(DT_TRACE_FORWARD, "x", dt_trace_now());
        dt_trace_span_ex(DT_TRACE_PIPE, "F1", 1.0, 2.0, 1, 1.5);
        dt_trace_comm("allreduce", "0", 0, 2, (uint64_t)i, 64, -1, 1e-3, 5e-4, 0);
        dt_trace_counter("memory", 1.0);
    }
    long a1 = allocs();
    count(false);
    ASSERT_EQ_INT((int)(a1 - a0), 0);
    size_t k, d, b;
    dt_trace_stats(&k, &d, &b);
    ASSERT(k == 0 && d == 0 && b == 0);

    /* whole trainer steps: the tracer adds no allocation (the steady-state
     * step allocates nothing at all) */
    rig r;
    ASSERT(rig_make(&r, NULL));
    for (int i = 0; i < 3; i++)
        ASSERT_OK(rig_step(&r));
    count(true);
    a0 = allocs();
    for (int i = 0; i < 5; i++)
        ASSERT_OK(rig_step(&r));
    a1 = allocs();
    count(false);
    fprintf(stderr, "allocations in 5 steps, trace off: %ld\n", a1 - a0);
    ASSERT_EQ_INT((int)(a1 - a0), 0);
    dt_trace_stats(&k, &d, &b);
    ASSERT(k == 0 && b == 0);
    rig_free(&r);
}

TEST(trainer_spans_in_the_window)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/one", t_tmpdir("trace"));
    ASSERT(mkdir(dir, 0755) == 0);
    dt_trace_params tp = dt_trace_params_default();
    tp.dir = dir;
    ASSERT_OK(dt_trace_parse_steps("3:5", &tp));
    rig r;
    ASSERT(rig_make(&r, &tp));
    ASSERT(dt_trace_is_open());
    for (int i = 0; i < 6; i++)
        ASSERT_OK(rig_step(&r));
    rig_free(&r); /* the trainer opened the tracer: it writes the file */
    ASSERT(!dt_trace_is_open());
    char path[500];
    snprintf(path, sizeof path, "%s/rank-0.json", dir);
    cJSON *j;
    ASSERT_OK(dt__trace_read(path, &j));
    ASSERT(well_formed(j));
    ASSERT_EQ_INT(count_x(j, "step", "step"), 2); /* steps 3 and 4 */
    ASSERT_EQ_INT(count_x(j, "optimizer", NULL), 2);
    ASSERT_EQ_INT(count_x(j, "forward", "forward"), 2);
    ASSERT_EQ_INT(count_x(j, "backward", "backward"), 2);
    /* the Sequential's three children, forward and backward each step */
    ASSERT_EQ_INT(count_x(j, "forward", "0"), 2);
    ASSERT_EQ_INT(count_x(j, "forward", "2"), 2);
    ASSERT_EQ_INT(count_x(j, "backward", "0"), 2);
    ASSERT_EQ_INT(count_x(j, "backward", "2"), 2);
    /* a unit's forward carries its FLOPs from the op table: linear 8 -> 16
     * on 4 rows (2*4*16*8), relu (one per element), linear 16 -> 4 */
    ASSERT(flop_of(j, "0") == 1024 && flop_of(j, "1") == 64 && flop_of(j, "2") == 512);
    /* only steps 3 and 4 */
    const cJSON *e;
    int counters = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents"))
    {
        const char *ph = dt__trace_str(e, "ph");
        if (ph && !strcmp(ph, "X")) {
            double s = dt__trace_num(cJSON_GetObjectItemCaseSensitive(e, "args"), "step", 0);
            ASSERT(s == 3 || s == 4);
        }
        counters += ph && !strcmp(ph, "C");
    }
    ASSERT_EQ_INT(counters, 4); /* memory and loss scale, per step */
    cJSON_Delete(j);
}

TEST(ring_keeps_the_newest)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/ring", t_tmpdir("trace"));
    ASSERT(mkdir(dir, 0755) == 0);
    dt_trace_params tp = dt_trace_params_default();
    tp.dir = dir;
    tp.capacity = 16;
    tp.step_begin = 1;
    tp.step_end = 0;
    ASSERT_OK(dt_trace_open(&tp, 1, 2));
    ASSERT_STATUS(dt_trace_open(&tp, 1, 2), DT_ERR_STATE);
    dt_trace_step(1);
    for (int i = 0; i < 40; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "s%d", i);
        double t = dt_trace_now();
        ASSERT(t > 0);
        dt_trace_span(DT_TRACE_OTHER, nm, t);
    }
    size_t k, d, b;
    dt_trace_stats(&k, &d, &b);
    ASSERT(k == 16 && d == 24 && b > 0);
    ASSERT_OK(dt_trace_close());
    char path[500];
    snprintf(path, sizeof path, "%s/rank-1.json", dir);
    cJSON *j;
    ASSERT_OK(dt__trace_read(path, &j));
    ASSERT(well_formed(j));
    ASSERT_EQ_INT(count_x(j, NULL, NULL), 16);
    ASSERT_EQ_INT(count_x(j, NULL, "s23"), 0);
    ASSERT_EQ_INT(count_x(j, NULL, "s24"), 1);
    ASSERT_EQ_INT(count_x(j, NULL, "s39"), 1);
    ASSERT_EQ_INT((int)dt__trace_num(cJSON_GetObjectItemCaseSensitive(j, "otherData"), "dropped", -1), 24);
    cJSON_Delete(j);
}

/* Two ranks' files written by hand: the collective #7 of group "0" starts
 * at 100 µs on rank 0 and 160 µs on rank 1 (clocks already aligned), so
 * rank 0 waited 60 µs for rank 1, the last one. */
TEST(merge_matches_collectives)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/merge", t_tmpdir("trace"));
    ASSERT(mkdir(dir, 0755) == 0);
    const double start[2] = {100, 160};
    for (int r = 0; r < 2; r++) {
        char path[500], txt[1024];
        snprintf(path, sizeof path, "%s/rank-%d.json", dir, r);
        snprintf(txt, sizeof txt,
                 "{\"traceEvents\":[{\"ph\":\"X\",\"pid\":%d,\"tid\":1000,\"ts\":%g,\"dur\":100,\"cat\":\"comm\","
                 "\"name\":\"allreduce\",\"args\":{\"seq\":7,\"group\":\"0\",\"group_lead\":0,\"group_size\":2}},"
                 "{\"ph\":\"X\",\"pid\":%d,\"tid\":1,\"ts\":%g,\"dur\":10,\"cat\":\"step\",\"name\":\"step\",\"args\":{}}]}",
                 r, start[r], r, 50.0 + r);
        ASSERT_OK(dt_file_write_atomic(path, txt, strlen(txt), 0644));
    }
    ASSERT_OK(dt_trace_merge(dir, 2, NULL));
    char path[500];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    cJSON *j;
    ASSERT_OK(dt__trace_read(path, &j));
    int seen = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents"))
    {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
        int pid = (int)dt__trace_num(e, "pid", -1);
        if (strcmp(dt__trace_str(e, "cat"), "comm"))
            continue;
        seen++;
        ASSERT_NEAR(dt__trace_num(e, "ts", -1), start[pid] - 50, 1e-9, 0); /* time 0: the earliest event */
        ASSERT_NEAR(dt__trace_num(a, "wait_peers_us", -1), pid == 0 ? 60 : 0, 1e-9, 0);
        ASSERT_EQ_INT((int)dt__trace_num(a, "last_rank", -1), 1);
    }
    ASSERT_EQ_INT(seen, 2);
    cJSON_Delete(j);
    /* a rank's file missing: an error naming it */
    snprintf(path, sizeof path, "%s/rank-1.json", dir);
    ASSERT(unlink(path) == 0);
    ASSERT_STATUS(dt_trace_merge(dir, 2, NULL), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "rank-1.json");
}

TEST(bad_parameters)
{
    dt_trace_params tp = dt_trace_params_default();
    ASSERT(tp.dir == NULL && tp.step_begin == 3 && tp.step_end == 5);
    const char *bad[] = {"", "3", "0:4", "5:3", "4:4", "a:b", "3:x", "-1:2", "3:5x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ASSERT_STATUS(dt_trace_parse_steps(bad[i], &tp), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_trace_parse_steps("7:", &tp));
    ASSERT(tp.step_begin == 7 && tp.step_end == 0);
    tp.dir = "/nonexistent/trace/dir";
    ASSERT_STATUS(dt_trace_open(&tp, 0, 1), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "/nonexistent/trace/dir");
    char dir[400], link[420];
    snprintf(dir, sizeof dir, "%s/real", t_tmpdir("trace"));
    snprintf(link, sizeof link, "%s/link", t_tmpdir("trace"));
    ASSERT(mkdir(dir, 0755) == 0 && symlink(dir, link) == 0);
    tp.dir = link; /* not through a symlink */
    ASSERT_STATUS(dt_trace_open(&tp, 0, 1), DT_ERR_INVALID_ARG);
    tp.dir = dir;
    ASSERT_STATUS(dt_trace_open(&tp, 2, 2), DT_ERR_INVALID_ARG);
    /* a FIFO where this rank's file or (rank 0) the merged trace will go: refused at the open, not after the run
       (the rename at the end would replace it) */
    char fifo[460];
    snprintf(fifo, sizeof fifo, "%s/trace.json", dir);
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    ASSERT_STATUS(dt_trace_open(&tp, 0, 2), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "a FIFO");
    ASSERT(!dt_trace_is_open());
    ASSERT_OK(dt_trace_open(&tp, 1, 2)); /* rank 1 writes rank-1.json only */
    ASSERT_OK(dt_trace_close());
    unlink(fifo);
    snprintf(fifo, sizeof fifo, "%s/rank-1.json", dir);
    unlink(fifo);
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    ASSERT_STATUS(dt_trace_open(&tp, 1, 2), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "rank-1.json");
    unlink(fifo);
    /* rank 0 holds the directory while it records: another job's rank 0 is refused (flock is per open file:
       a lock this test takes stands for that job), a rank other than 0 takes no lock */
    int held = open(dir, O_RDONLY | O_DIRECTORY);
    ASSERT(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0);
    ASSERT_STATUS(dt_trace_open(&tp, 0, 2), DT_ERR_STATE);
    ASSERT_STR_CONTAINS(dt_last_error(), "another job");
    ASSERT(!dt_trace_is_open());
    ASSERT_OK(dt_trace_open(&tp, 1, 2));
    ASSERT_OK(dt_trace_close());
    close(held);
    ASSERT_OK(dt_trace_open(&tp, 0, 2));
    held = open(dir, O_RDONLY | O_DIRECTORY);
    ASSERT(held >= 0 && flock(held, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK); /* held while open */
    ASSERT_OK(dt_trace_close());
    ASSERT(flock(held, LOCK_EX | LOCK_NB) == 0); /* and let go at the close */
    close(held);
    tp.capacity = 0;
    ASSERT_STATUS(dt_trace_open(&tp, 0, 1), DT_ERR_INVALID_ARG);
    ASSERT(!dt_trace_is_open());
    ASSERT_OK(dt_trace_close()); /* closing when off: a no-op */
}

/* A synthetic pipeline step: every rank's actions of a built schedule at
 * their unit-cost start times (F 1 ms, B 2 ms, BI and BW 1 ms; sends and
 * receives instant), one step span over the whole. Each rank's measured
 * bubble (window - compute) / compute equals the schedule's formula
 * (p - 1) / (v m) and the table's own simulation; compute is the rank's
 * busy time, nothing is communication, the rest idle. */
static void synthetic_bubble(dt_pipe_kind kind, int p, int m, int v)
{
    char dir[400], path[500];
    snprintf(dir, sizeof dir, "%s/bubble-%d-%d-%d-%d", t_tmpdir("trace"), (int)kind, p, m, v);
    ASSERT(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    dt_pipe_schedule *sc = NULL;
    ASSERT_OK(dt_pipe_schedule_build(kind, p, m, v, &sc));
    dt_pipe_sim sim;
    ASSERT_OK(dt_pipe_schedule_simulate(sc, 1, 1, 1, &sim));
    static const char *const op[] = {"F", "B", "BI", "BW", "send F", "recv F", "send B", "recv B"};
    static const double cost[] = {1, 2, 1, 1, 0, 0, 0, 0};
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fprintf(f, "{\"traceEvents\":[\n");
    for (int r = 0; r < p; r++) {
        const dt_pipe_action *a;
        int n;
        ASSERT_OK(dt_pipe_schedule_actions(sc, r, &a, &n));
        fprintf(f, "%s{\"ph\":\"X\",\"pid\":%d,\"tid\":1,\"ts\":0,\"dur\":%.3f,\"cat\":\"step\",\"name\":\"step\","
                   "\"args\":{\"step\":1}}",
                r ? ",\n" : "", r, sim.makespan * 1000);
        for (int i = 0; i < n; i++)
            fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"pipeline\","
                       "\"name\":\"%s%d s%d\",\"args\":{\"step\":1,\"mb\":%d}}",
                    r, a[i].t * 1000.0, cost[a[i].op] * 1000.0, op[a[i].op], a[i].mb, a[i].stage, a[i].mb);
    }
    fprintf(f, "\n]}\n");
    ASSERT(fclose(f) == 0);
    dt_trace_summary *s;
    ASSERT_OK(dt_trace_summarize(path, &s));
    ASSERT_EQ_INT((int)s->nsteps, p);
    const double formula = (double)(p - 1) / ((double)v * m);
    for (size_t i = 0; i < s->nsteps; i++) {
        const dt_trace_step_row *r = &s->steps[i];
        ASSERT_EQ_INT(r->stages, p);
        ASSERT_EQ_INT(r->chunks, v);
        ASSERT_EQ_INT(r->micro, m);
        ASSERT_NEAR(r->bubble_formula, formula, 1e-12, 0);
        ASSERT_NEAR(r->bubble, formula, 1e-9, 0);
        ASSERT_NEAR(r->bubble, sim.bubble, 1e-9, 0);
        ASSERT_NEAR(r->compute_ms, 3.0 * m * v, 1e-6, 0);
        ASSERT_NEAR(r->comm_ms, 0, 1e-9, 0);
        ASSERT_NEAR(r->idle_ms, sim.makespan - 3.0 * m * v, 1e-6, 0);
    }
    dt_trace_summary_free(s);
    dt_pipe_schedule_free(sc);
}

TEST(summary_bubble_equals_formula)
{
    synthetic_bubble(DT_PIPE_1F1B, 4, 8, 1);
    synthetic_bubble(DT_PIPE_GPIPE, 2, 4, 1);
    synthetic_bubble(DT_PIPE_1F1B, 3, 5, 1);
    synthetic_bubble(DT_PIPE_INTERLEAVED, 2, 4, 2);
}

/* Exposed communication and the slowest rank: rank 0 waits 30 µs inside
 * its optimizer for an all-reduce that rank 1 started 30 µs after it. */
TEST(summary_exposed_comm_and_slowest_rank)
{
    char dir[400], path[500];
    snprintf(dir, sizeof dir, "%s/expose", t_tmpdir("trace"));
    ASSERT(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    const char *txt =
        "{\"traceEvents\":["
        "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0,\"dur\":100,\"cat\":\"step\",\"name\":\"step\",\"args\":{\"step\":2}},"
        "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0,\"dur\":40,\"cat\":\"forward\",\"name\":\"forward\",\"args\":{\"step\":2}},"
        "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":50,\"dur\":50,\"cat\":\"optimizer\",\"name\":\"optimizer\",\"args\":{\"step\":2}},"
        "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":55,\"dur\":35,\"cat\":\"wait\",\"name\":\"allreduce\",\"args\":{\"step\":2}},"
        "{\"ph\":\"X\",\"pid\":0,\"tid\":1000,\"ts\":55,\"dur\":35,\"cat\":\"comm\",\"name\":\"allreduce\",\"args\":{\"step\":2,"
        "\"seq\":9,\"bytes\":64,\"group\":\"0\",\"group_lead\":0,\"group_size\":2,\"wait_peers_us\":30,\"last_rank\":1}},"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":0,\"dur\":100,\"cat\":\"step\",\"name\":\"step\",\"args\":{\"step\":2}},"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":1000,\"ts\":85,\"dur\":5,\"cat\":\"comm\",\"name\":\"allreduce\",\"args\":{\"step\":2,"
        "\"seq\":9,\"bytes\":64,\"group\":\"0\",\"group_lead\":0,\"group_size\":2,\"wait_peers_us\":0,\"last_rank\":1}}"
        "]}";
    ASSERT_OK(dt_file_write_atomic(path, txt, strlen(txt), 0644));
    dt_trace_summary *s;
    ASSERT_OK(dt_trace_summarize(path, &s));
    ASSERT_EQ_INT((int)s->nsteps, 2);
    const dt_trace_step_row *r = &s->steps[0];
    ASSERT(r->rank == 0 && r->step == 2);
    ASSERT_NEAR(r->compute_ms, 0.055, 1e-9, 0); /* forward 40 + optimizer 50 - its 35 of waiting */
    ASSERT_NEAR(r->comm_ms, 0.035, 1e-9, 0);
    ASSERT_NEAR(r->idle_ms, 0.010, 1e-9, 0);
    ASSERT(r->bubble < 0);
    ASSERT_EQ_INT((int)s->ncolls, 1);
    ASSERT_EQ_INT(s->colls[0].last_rank, 1);
    ASSERT_EQ_INT(s->colls[0].ranks, 2);
    ASSERT_NEAR(s->colls[0].max_wait_ms, 0.030, 1e-9, 0);
    ASSERT_NEAR(s->made_wait_ms[1], 0.030, 1e-9, 0);
    ASSERT_NEAR(s->made_wait_ms[0], 0, 1e-12, 0);
    ASSERT(s->nops >= 3);
    ASSERT_STR_EQ(s->ops[0].name, "optimizer"); /* 50 µs, then forward and comm's allreduce (35 + 5) at 40 */
    ASSERT_NEAR(s->ops[0].total_ms, 0.050, 1e-9, 0);
    for (size_t i = 0; i < s->nops; i++)
        if (!strcmp(s->ops[i].cat, "comm"))
            ASSERT(s->ops[i].count == 2 && fabs(s->ops[i].total_ms - 0.040) < 1e-9);
    dt_trace_summary_free(s);
    /* a file that is not a trace */
    ASSERT_OK(dt_file_write_atomic(path, "[1,2]", 5, 0644));
    ASSERT_STATUS(dt_trace_summarize(path, &s), DT_ERR_FORMAT);
}

int main(void)
{
    RUN(off_records_and_allocates_nothing);
    RUN(trainer_spans_in_the_window);
    RUN(ring_keeps_the_newest);
    RUN(merge_matches_collectives);
    RUN(bad_parameters);
    RUN(summary_bubble_equals_formula);
    RUN(summary_exposed_comm_and_slowest_rank);
    t_rm_rf(t_tmpdir("trace"));
    return TEST_REPORT();
}
