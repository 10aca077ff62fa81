/* OpenMP's waiting policy on shared CPUs (dtrain/base.h): the decision
 * (dt_omp_wait_passive: passive when min(1-minute load, tasks runnable now)
 * exceeds cores - threads + 0.5) and the load it reads (dt_cpu_load_read,
 * /proc/loadavg or DT_LOADAVG="L" / "L,R"). The threshold used to be a fixed
 * load of 0.5 whatever the cores and threads: a 2-core machine idle now but
 * busy a minute ago (average 1) ran passive and lost 15-20% of the ConvNet
 * step. The runnable count was then the largest of three readings 1 ms
 * apart: one task runnable at one of those instants on an idle machine made
 * it passive (the ConvNet step 6.47 ms against 5.14 ms spinning).
 * dt_omp_wait_choose decides on the median of readings over ~40 ms, and
 * only when the load alone does not decide; its sampler is injected here
 * (a sequence of readings). Also the cores the decision counts
 * (dt_cpu_cores: the process's CPU affinity) and the threads a rank of a
 * job on those cores gets (dt_threads_per_rank). And the yield of comm's
 * waiting loops, which stops for 100 ms once one gave the core away for a
 * time slice (dt__cpu_yield; with two busy processes beside 4-8 ranks on 2
 * cores, yielding at every wait made the collective tests 20x slower). */
#include "dtrain/base.h"
#include "base/cpu_cached.h"
#include "test.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

TEST(decision_two_cores_two_threads)
{
    /* idle, now and on average: spin */
    ASSERT(!dt_omp_wait_passive(0.0, 0, 2, 2));
    ASSERT(!dt_omp_wait_passive(0.5, 0, 2, 2));
    /* busy a minute ago, idle now (the average lags): spin */
    ASSERT(!dt_omp_wait_passive(1.0, 0, 2, 2));
    ASSERT(!dt_omp_wait_passive(3.0, 0, 2, 2));
    /* one other task runnable now, and the average says so too: passive */
    ASSERT(dt_omp_wait_passive(1.0, 1, 2, 2));
    ASSERT(dt_omp_wait_passive(0.6, 1, 2, 2));
    ASSERT(dt_omp_wait_passive(20.0, 18, 2, 2));
    /* a task runnable now that has not yet moved the average: spin */
    ASSERT(!dt_omp_wait_passive(0.5, 1, 2, 2));
    ASSERT(!dt_omp_wait_passive(0.2, 3, 2, 2));
}

TEST(decision_relative_to_the_threads)
{
    /* one thread on 2 cores: a core stays free for the other process */
    ASSERT(!dt_omp_wait_passive(1.0, 1, 2, 1));
    ASSERT(!dt_omp_wait_passive(1.5, 1, 2, 1));
    ASSERT(dt_omp_wait_passive(1.6, 2, 2, 1));
    /* 16 threads on 64 cores: 48 cores' worth of load leaves room */
    ASSERT(!dt_omp_wait_passive(40.0, 40, 64, 16));
    ASSERT(!dt_omp_wait_passive(48.5, 49, 64, 16));
    ASSERT(dt_omp_wait_passive(50.0, 50, 64, 16));
    /* all 64 cores: the old threshold, 0.5 */
    ASSERT(!dt_omp_wait_passive(0.5, 3, 64, 64));
    ASSERT(dt_omp_wait_passive(1.0, 1, 64, 64));
    /* more threads than cores: they wait for each other whatever the load */
    ASSERT(dt_omp_wait_passive(0.0, 0, 2, 4));
    ASSERT(dt_omp_wait_passive(0.0, 0, 1, 2));
}

TEST(decision_unknowns_and_odd_inputs)
{
    /* an unknown load: passive, which never collapses */
    ASSERT(dt_omp_wait_passive(-1.0, 0, 2, 2));
    ASSERT(dt_omp_wait_passive(-1.0, -1, 64, 1));
    /* an unknown runnable count: the average alone decides */
    ASSERT(dt_omp_wait_passive(1.0, -1, 2, 2));
    ASSERT(!dt_omp_wait_passive(0.4, -1, 2, 2));
    ASSERT(!dt_omp_wait_passive(1.4, -1, 2, 1));
    /* cores or threads below 1 count as 1 */
    ASSERT(!dt_omp_wait_passive(0.0, 0, 0, 0));
    ASSERT(dt_omp_wait_passive(1.0, 1, -3, 1));
}

static dt_status load_with(const char *v, double *load, int *running)
{
    if (v)
        setenv("DT_LOADAVG", v, 1);
    else
        unsetenv("DT_LOADAVG");
    dt_status st = dt_cpu_load_read(load, running);
    unsetenv("DT_LOADAVG");
    return st;
}

TEST(load_from_the_environment)
{
    double l;
    int r;
    ASSERT_OK(load_with("2.5", &l, &r));
    ASSERT_NEAR(l, 2.5, 0, 0);
    ASSERT_EQ_INT(r, 2);
    ASSERT_OK(load_with("1,0", &l, &r));
    ASSERT_NEAR(l, 1.0, 0, 0);
    ASSERT_EQ_INT(r, 0);
    ASSERT_OK(load_with("0.3,7", &l, &r));
    ASSERT_NEAR(l, 0.3, 0, 0);
    ASSERT_EQ_INT(r, 7);
    ASSERT_OK(load_with("0", &l, &r));
    ASSERT_EQ_INT(r, 0);
    /* malformed: an error naming the variable, both outputs unknown */
    const char *bad[] = {"nan", "inf", "-1", "abc", "1,", ",1", "1,-2", "1,2.5", "1,2,3", "1e7", "1,99999999999",
                         " 1", "1 ", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        l = 5;
        r = 5;
        if (load_with(bad[i], &l, &r) != DT_ERR_INVALID_ARG) {
            fprintf(stderr, "DT_LOADAVG=\"%s\" was accepted\n", bad[i]);
            ASSERT(0);
        }
        ASSERT_STR_CONTAINS(dt_last_error(), "DT_LOADAVG");
        ASSERT_NEAR(l, -1.0, 0, 0);
        ASSERT_EQ_INT(r, -1);
    }
    char longv[200];
    memset(longv, '1', sizeof longv - 1);
    longv[sizeof longv - 1] = 0;
    ASSERT_STATUS(load_with(longv, &l, &r), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_cpu_load_read(NULL, &r), DT_ERR_NULL);
}

TEST(load_from_proc)
{
    if (access("/proc/loadavg", R_OK) != 0)
        DT_TEST_SKIP("/proc/loadavg cannot be read here");
    double l = -5;
    int r = -5;
    ASSERT_OK(load_with(NULL, &l, &r));
    ASSERT(l >= 0 && r >= 0);
    ASSERT_OK(load_with("", &l, &r)); /* empty: as unset */
    ASSERT(l >= 0 && r >= 0);
}

/* A sequence of readings: load1 < -1.5 marks an unreadable one; past the
 * end the last repeats. */
typedef struct {
    const double *load;
    const int *run;
    int n, calls;
} seq;

static dt_status seq_sample(void *ud, double *load1, int *running)
{
    seq *s = ud;
    int i = s->calls < s->n ? s->calls : s->n - 1;
    s->calls++;
    if (s->load[i] < -1.5) {
        *load1 = -1;
        *running = -1;
        return DT_ERR_IO;
    }
    *load1 = s->load[i];
    *running = s->run[i];
    return DT_OK;
}

static bool choose(double load, const int *run, int n, int cores, int threads, dt_omp_wait_reading *r, int *calls)
{
    double loads[16];
    for (int i = 0; i < n; i++)
        loads[i] = run[i] < 0 ? -2.0 : load;
    seq s = {loads, run, n, 0};
    bool p = dt_omp_wait_choose(cores, threads, seq_sample, &s, r);
    *calls = s.calls;
    return p;
}

TEST(choice_outlasts_one_busy_instant)
{
    dt_omp_wait_reading r;
    int calls;
    /* an idle 2-core machine, busy a minute ago (load 1), one task runnable
     * at the first instant: the old rule (the largest of the first three
     * readings) chose passive; the median spins */
    const int idle[] = {1, 0, 0, 0, 0, 0, 0, 0, 0};
    ASSERT(!choose(1.0, idle, 9, 2, 2, &r, &calls));
    ASSERT_EQ_INT(r.running, 0);
    ASSERT_NEAR(r.load1, 1.0, 0, 0);
    ASSERT_EQ_INT(calls, 6); /* five agreeing readings end it */
    ASSERT_EQ_INT(r.readings, 6);
    const int blip[] = {0, 1, 0, 2, 0, 0, 0, 0, 0};
    ASSERT(!choose(1.0, blip, 9, 2, 2, &r, &calls));
    /* busy at most instants: passive */
    const int busy[] = {1, 1, 0, 1, 0, 1, 1, 0, 0};
    ASSERT(choose(1.5, busy, 9, 2, 2, &r, &calls));
    ASSERT_EQ_INT(r.running, 1);
    ASSERT_EQ_INT(calls, 7);
    /* an even split until the ninth reading: at most nine */
    const int split[] = {1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1};
    ASSERT(!choose(1.0, split, 11, 2, 2, &r, &calls));
    ASSERT_EQ_INT(calls, 9);
    ASSERT_EQ_INT(r.readings, 9);
    /* relative to the threads as dt_omp_wait_passive: 64 cores, 16 threads */
    const int many[] = {49, 50, 60, 51, 40, 55, 52, 0};
    ASSERT(choose(50.0, many, 8, 64, 16, &r, &calls));
    ASSERT_EQ_INT(r.running, 50); /* 40 49 [50] 51 55 60: five busy of six */
}

TEST(choice_reads_once_when_the_load_decides)
{
    dt_omp_wait_reading r;
    int calls;
    /* a load that leaves the cores free spins whatever runs now: one reading */
    const int now[] = {3, 3, 3};
    ASSERT(!choose(0.3, now, 3, 2, 2, &r, &calls));
    ASSERT_EQ_INT(calls, 1);
    ASSERT_EQ_INT(r.readings, 1);
    ASSERT_EQ_INT(r.running, 3);
    /* an unknown first reading: passive, load unknown */
    const int unknown[] = {-1, 0, 0};
    ASSERT(choose(0.0, unknown, 3, 2, 2, &r, &calls));
    ASSERT_EQ_INT(calls, 1);
    ASSERT_NEAR(r.load1, -1.0, 0, 0);
    ASSERT_EQ_INT(r.running, -1);
    /* unreadable later instants count for nothing, and the window stays bounded */
    const int gaps[] = {1, -1, -1, 0, 0, 0, 0, 0, 0};
    ASSERT(!choose(1.0, gaps, 9, 2, 2, &r, &calls));
    ASSERT_EQ_INT(calls, 8);
    const int lost[] = {1, -1};
    ASSERT(choose(1.0, lost, 2, 2, 2, &r, &calls));
    ASSERT_EQ_INT(calls, 9);
    ASSERT_EQ_INT(r.running, 1);
    ASSERT(dt_omp_wait_choose(2, 2, seq_sample, &(seq){(const double[]){1.0}, unknown + 1, 1, 0}, NULL) == false);
}

TEST(choice_from_the_environment_and_proc)
{
    dt_omp_wait_reading r;
    /* DT_LOADAVG is one fixed reading: it decides at once, as before */
    setenv("DT_LOADAVG", "1,1", 1);
    ASSERT(dt_omp_wait_choose(2, 2, NULL, NULL, &r));
    ASSERT_EQ_INT(r.readings, 1);
    setenv("DT_LOADAVG", "1,0", 1);
    ASSERT(!dt_omp_wait_choose(2, 2, NULL, NULL, &r));
    setenv("DT_LOADAVG", "nan", 1);
    ASSERT(dt_omp_wait_choose(2, 2, NULL, NULL, &r));
    ASSERT_NEAR(r.load1, -1.0, 0, 0);
    unsetenv("DT_LOADAVG");
    if (access("/proc/loadavg", R_OK) != 0)
        DT_TEST_SKIP("/proc/loadavg cannot be read here");
    (void)dt_omp_wait_choose(2, 2, NULL, NULL, &r);
    ASSERT(r.load1 >= 0 && r.running >= 0 && r.readings >= 1 && r.readings <= 9);
}

/* The affinity is what counts: pinned to one CPU, then to two (where the
 * machine has them), and restored. */
TEST(cores_and_threads_per_rank)
{
    cpu_set_t all, one, two;
    ASSERT_EQ_INT(sched_getaffinity(0, sizeof all, &all), 0);
    ASSERT_EQ_INT(dt_cpu_cores(), CPU_COUNT(&all));
    CPU_ZERO(&one);
    CPU_ZERO(&two);
    int first = -1, second = -1;
    for (int c = 0; c < CPU_SETSIZE && second < 0; c++) {
        if (!CPU_ISSET(c, &all))
            continue;
        if (first < 0)
            first = c;
        else
            second = c;
    }
    ASSERT(first >= 0);
    CPU_SET(first, &one);
    ASSERT_EQ_INT(sched_setaffinity(0, sizeof one, &one), 0);
    const int c1 = dt_cpu_cores(), t1 = dt_threads_per_rank(1), t4 = dt_threads_per_rank(4);
    int c2 = 2, t21 = 2, t22 = 1, t23 = 1, t20 = 1, tneg = 1;
    if (second >= 0) {
        CPU_SET(first, &two);
        CPU_SET(second, &two);
        ASSERT_EQ_INT(sched_setaffinity(0, sizeof two, &two), 0);
        c2 = dt_cpu_cores(), t21 = dt_threads_per_rank(1), t22 = dt_threads_per_rank(2);
        t23 = dt_threads_per_rank(3), t20 = dt_threads_per_rank(0), tneg = dt_threads_per_rank(-2);
    }
    ASSERT_EQ_INT(sched_setaffinity(0, sizeof all, &all), 0);
    ASSERT_EQ_INT(c1, 1);
    ASSERT_EQ_INT(t1, 1);
    ASSERT_EQ_INT(t4, 1);
    ASSERT_EQ_INT(c2, 2);
    ASSERT_EQ_INT(t21, 2);
    ASSERT_EQ_INT(t22, 1);
    ASSERT_EQ_INT(t23, 1);
    ASSERT_EQ_INT(t20, 1);
    ASSERT_EQ_INT(tneg, 1);
    ASSERT_EQ_INT(dt_cpu_cores(), CPU_COUNT(&all));
}

static atomic_int g_hog_stop;

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *hog(void *arg)
{
    pin(*(int *)arg);
    while (!atomic_load_explicit(&g_hog_stop, memory_order_relaxed)) {
    }
    return NULL;
}

TEST(a_yield_that_gave_a_time_slice_away_stops_the_yielding)
{
    cpu_set_t saved;
    ASSERT_EQ_INT(pthread_getaffinity_np(pthread_self(), sizeof saved, &saved), 0);
    int cpu = sched_getcpu();
    ASSERT(cpu >= 0);
    pin(cpu);
    pthread_t h;
    ASSERT_EQ_INT(pthread_create(&h, NULL, hog, &cpu), 0);
    nanosleep(&(struct timespec){.tv_nsec = 20000000L}, NULL);
    double off_until = 0;
    int stopped = 0;
    const double t0 = dt_time_s();
    while (!stopped && dt_time_s() - t0 < 5.0) { /* a busy thread on our core takes a slice at some yield */
        stopped = !dt__cpu_yield(&off_until);
    }
    atomic_store(&g_hog_stop, 1);
    pthread_join(h, NULL);
    pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    ASSERT(stopped);
    ASSERT(off_until > t0 && off_until <= dt_time_s() + 0.1);
    ASSERT_EQ_INT(dt__cpu_yield(&off_until), 0); /* still off */
    nanosleep(&(struct timespec){.tv_nsec = 150000000L}, NULL);
    ASSERT_EQ_INT(dt__cpu_yield(&off_until), 1); /* on again after 100 ms */
}

int main(void)
{
    RUN(decision_two_cores_two_threads);
    RUN(decision_relative_to_the_threads);
    RUN(decision_unknowns_and_odd_inputs);
    RUN(load_from_the_environment);
    RUN(load_from_proc);
    RUN(choice_outlasts_one_busy_instant);
    RUN(choice_reads_once_when_the_load_decides);
    RUN(choice_from_the_environment_and_proc);
    RUN(cores_and_threads_per_rank);
    RUN(a_yield_that_gave_a_time_slice_away_stops_the_yielding);
    return TEST_REPORT();
}
